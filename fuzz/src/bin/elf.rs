//! Fuzz target: the ELF loaders. `machine::elf::parse` and `load_identity`
//! (bare mode), the hv's kernel checks (`hv::boot::parse_kernel`) and a
//! whole `Vm::boot` of whatever passes them. Any panic is a bug; every
//! refusal must be an error value.

use hv::{Vm, VmConfig};
use machine::PhysMemory;

const MEM: u64 = 8 << 20;

fn main() {
    afl::fuzz!(|data: &[u8]| {
        if let Ok(image) = machine::elf::parse(data) {
            let mem = PhysMemory::new(MEM).expect("host memory");
            let _ = machine::elf::load_identity(&image, &mem);
        }
        if hv::boot::parse_kernel(data, MEM).is_ok() {
            let config = VmConfig {
                mem_size: MEM,
                ..VmConfig::default()
            };
            let _ = Vm::boot(&config, data);
        }
    });
}
