//! kvmclock as the guest sees it (`guests/kvmclock.c`): the CPUID bits, the
//! time info's contents and formula against the VM's virtual time, the
//! refresh after a TSC write, the wall clock, and KVM's MSR rules.

use hv::{Vm, VmConfig, CYCLES_PER_SECOND};
use std::collections::BTreeMap;

mod probe;

const KVMCLOCK: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kvmclock.elf"));

fn run(config: &VmConfig) -> (Vm, BTreeMap<String, u64>) {
    probe::run_probes(config, KVMCLOCK)
}

/// Exact nanoseconds of `cycles` at the TSC's rate.
fn ns(cycles: u64) -> u64 {
    (u128::from(cycles) * 1_000_000_000 / u128::from(CYCLES_PER_SECOND)) as u64
}

#[test]
fn the_clock_follows_virtual_time() {
    let config = VmConfig {
        mem_size: 16 << 20,
        ..VmConfig::default()
    };
    let (_, v) = run(&config);
    let clock = u64::from(abi::KVM_FEATURE_CLOCKSOURCE2);
    assert_eq!(v["features"] & clock, clock);
    // Not stable: vCPUs run up to the lookahead apart (vm/sched.rs).
    let stable = u64::from(abi::KVM_FEATURE_CLOCKSOURCE_STABLE_BIT);
    assert_eq!(v["features"] & stable, 0);
    assert_eq!(v["tsc_hz"], CYCLES_PER_SECOND);
    assert_eq!(v["gp_enable"], 0);
    assert_eq!(v["msr_readback"] & 1, 1);
    assert_eq!(v["version"] % 2, 0, "stable");
    assert_eq!(v["flags"], 0, "no PVCLOCK_TSC_STABLE_BIT");
    // Written at the enabling WRMSR: after the TSC read before it, and
    // with the VM's age at that TSC (the TSC starts at 0 with the VM).
    assert!(v["tsc_timestamp"] > v["tsc_before_enable"]);
    assert!(ns(v["tsc_timestamp"]).abs_diff(v["system_time"]) <= 1);
    for at in ["a", "b"] {
        let (tsc, clock) = (v[&format!("tsc_{at}")], v[&format!("ns_{at}")]);
        assert!(
            ns(tsc).abs_diff(clock) <= 2,
            "{at}: {clock} ns at tsc {tsc}"
        );
    }
    assert!(v["ns_b"] > v["ns_a"] + 10_000, "the spin took time");
    // After the TSC jumps to 2^40 the clock goes on from where it was
    // (ns_c is read after the four lines printed since ns_b: ~90 port
    // exits, about 0.1 ms of virtual time).
    assert_eq!(v["version_step"], 2);
    assert!(v["tsc_c"] > 1 << 40);
    assert!(
        v["ns_c"] > v["ns_b"] && v["ns_c"] - v["ns_b"] < 1_000_000,
        "{v:?}"
    );
    assert_eq!(v["gp_outside"], 0, "KVM refuses no address");
    assert_eq!(v["gp_disable"], 0);
    assert_eq!(v["gp_wall"], 0);
    assert_eq!(v["wall_version"] % 2, 0);
    let wall = v["wall_sec"] * 1_000_000_000 + v["wall_nsec"];
    assert_eq!(wall, config.wall_clock_at_boot_ns);
}

#[test]
fn readings_repeat_exactly_and_the_wall_clock_is_configurable() {
    let config = VmConfig {
        mem_size: 16 << 20,
        wall_clock_at_boot_ns: 1_234_567_890_123_456_789,
        ..VmConfig::default()
    };
    let (_, first) = run(&config);
    let (_, second) = run(&config);
    assert_eq!(first, second);
    assert_eq!(first["wall_sec"], 1_234_567_890);
    assert_eq!(first["wall_nsec"], 123_456_789);
}
