//! Running the MMU correctness kernels (tests/guests/mmu/) on the bare
//! machine and under the hv, and reading the digest line they print.

#![allow(dead_code)] // each test file uses its own part

use hv::{MmuMode, StopReason, Vm, VmConfig};
use machine::bare::{BareConfig, BareMachine};

/// Guest RAM in both environments: the kernels use physical memory below
/// 64 MiB only.
pub const MEM: u64 = 64 << 20;

/// Where a kernel ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Env {
    /// The machine alone, no hypervisor.
    Bare,
    /// Under the hv with EPT.
    Ept,
    /// Under the hv with shadow paging.
    Shadow,
    /// Under the hv with shadow paging and the paravirtual CR3 cache
    /// offered, with this many CR3 targets.
    ShadowCr3Cache(usize),
}

/// The serial output of `elf` run in `env`; panics (with the output) unless
/// the kernel exited through the debug port with value 0.
pub fn run(elf: &[u8], env: Env) -> String {
    let (status, out) = match env {
        Env::Bare => {
            let config = BareConfig {
                mem_size: MEM,
                max_cycles: Some(50_000_000_000),
                ..BareConfig::default()
            };
            let out = BareMachine::run_elf(config, elf).expect("bare run");
            (out.exit.status(), out.serial)
        }
        Env::Ept | Env::Shadow | Env::ShadowCr3Cache(_) => {
            let mut config = VmConfig {
                vcpus: 1,
                mem_size: MEM,
                mmu: if env == Env::Ept {
                    MmuMode::Ept
                } else {
                    MmuMode::Shadow
                },
                ..VmConfig::default()
            };
            if let Env::ShadowCr3Cache(targets) = env {
                config.cr3_cache = true;
                config.cr3_targets = targets;
            }
            let mut vm = Vm::boot(&config, elf).expect("boot");
            let reason = vm.run();
            let serial = vm.take_serial();
            match reason {
                StopReason::DebugExit { status } => (u64::from(status), serial),
                other => panic!(
                    "{env:?}: stopped with {other:?}; serial:\n{}",
                    String::from_utf8_lossy(&serial)
                ),
            }
        }
    };
    let out = String::from_utf8_lossy(&out).into_owned();
    assert_eq!(status, 1, "{env:?}: exit status {status}; serial:\n{out}");
    out
}

/// The value of `key=` on the summary line starting with `prefix`.
pub fn field<'a>(out: &'a str, prefix: &str, key: &str) -> &'a str {
    let line = out
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{out}"));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|w| w.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// The first line where two per-case logs differ, for the failure message.
pub fn first_difference(a: &str, b: &str) -> String {
    match a.lines().zip(b.lines()).find(|(x, y)| x != y) {
        Some((x, y)) => format!("first difference:\n  {x}\n  {y}"),
        None => "the logs agree line by line".to_string(),
    }
}
