//! Fuzz target: the hv's MSR and hypercall exit handlers, through the
//! public API. A tiny guest (guests/exits.c) executes WRMSR, RDMSR and
//! VMCALL with indices, numbers and arguments from the fuzz input, written
//! into guest memory before the run. Any host panic is a bug; the guest may
//! end any way the hv decides (its own exit, an error stop, the limit).

use hv::apf::ApfMode;
use hv::{Vm, VmConfig};
use machine::Gpa;

const KERNEL: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/exits.elf"));
/// Where guests/exits.c reads its operations (OPS_GPA) and how many it
/// takes at most (MAX_OPS, 40 bytes each).
const OPS_GPA: u64 = 0x40_0000;
const MAX_OPS_BYTES: usize = 2048 * 40;

fn main() {
    let config = VmConfig {
        vcpus: 2,
        mem_size: 8 << 20,
        apf: ApfMode::Pv,
        ..VmConfig::default()
    };
    afl::fuzz!(|data: &[u8]| {
        let mut vm = Vm::boot(&config, KERNEL).expect("the fuzz kernel boots");
        let ops = &data[..data.len().min(MAX_OPS_BYTES)];
        vm.write_guest(Gpa(OPS_GPA), ops).expect("ops fit in RAM");
        // The end marker after the last whole operation.
        let end = OPS_GPA + (ops.len() / 40 * 40) as u64;
        vm.write_guest(Gpa(end), &[0xff]).expect("in RAM");
        let _ = vm.run_until(5_000_000);
    });
}
