//! Runs a test kernel that prints `name=0xvalue` lines (the probes of
//! `guests/msr_probe.h`) and ends with debug-exit 0x21.

use hv::{StopReason, Vm, VmConfig};
use std::collections::BTreeMap;

/// Boots `elf` under `config`, runs it to its end and returns the VM and
/// its probe values.
pub fn run_probes(config: &VmConfig, elf: &[u8]) -> (Vm, BTreeMap<String, u64>) {
    let mut vm = Vm::boot(config, elf).expect("boot");
    let reason = vm.run();
    let out = String::from_utf8_lossy(&vm.take_serial()).into_owned();
    assert_eq!(
        reason,
        StopReason::DebugExit {
            status: (0x21 << 1) | 1
        },
        "{out}"
    );
    let values = out
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            Some((
                k.to_string(),
                u64::from_str_radix(v.trim_start_matches("0x"), 16).ok()?,
            ))
        })
        .collect();
    (vm, values)
}
