//! The vmm-level APF state API on the real guest: stop a swapping VM in
//! the middle, save every vCPU's APF state and restore it (what a
//! migration does: outstanding faults are dropped and every guest waiter is
//! woken), then let the guest finish and check its data.
#![cfg(bundled_kernel)]

use hv::apf::{ApfMode, ApfProtocol};
use hv::{Cycles, RunStatus, StopReason, Vm, VmConfig};

const KERNEL: &[u8] = include_bytes!(env!("FAULTLINE_GUEST_KERNEL"));

fn restore_mid_run(protocol: ApfProtocol) {
    let config = VmConfig {
        vcpus: 2,
        mem_size: 48 << 20,
        host_mem: Some(8 << 20),
        swap_device: hv::swap::DevicePreset::Nvme.model(),
        apf: ApfMode::Pv,
        apf_protocol: protocol,
        cmdline: "-- pagetag -m 16M -p 3 -t 2".into(),
        ..VmConfig::default()
    };
    let mut vm = Vm::boot(&config, KERNEL).expect("boot");
    // Run until async faults are in flight.
    let mut restored = 0;
    while restored == 0 {
        match vm.run_until(vm.time() + Cycles(1_000_000)) {
            RunStatus::Stopped(reason) => panic!("stopped before the restore: {reason:?}"),
            RunStatus::Running | RunStatus::DirtyRingFull => {}
        }
        let outstanding: usize = vm.vcpus().iter().map(|v| v.apf_outstanding()).sum();
        if outstanding == 0 || vm.stats().apf().not_present < 50 {
            continue;
        }
        for i in 0..vm.vcpus().len() {
            let state = vm.apf_state(i).expect("vcpu");
            let json = serde_json::to_string(&state).expect("serializable");
            let back: hv::apf::ApfState = serde_json::from_str(&json).expect("deserializable");
            vm.set_apf_state(i, &back).expect("restore");
            assert!(
                vm.vcpus()[i].apf_outstanding() == 0,
                "outstanding faults do not move"
            );
            restored += 1;
        }
    }
    let wake_all_before = vm.stats().apf().wake_all;
    let reason = vm.run();
    let out = String::from_utf8_lossy(&vm.take_serial()).into_owned();
    assert_eq!(reason, StopReason::Shutdown { status: 0 }, "{out}");
    assert!(out.contains(" 0 bad pages"), "{out}");
    assert!(
        vm.stats().apf().wake_all >= wake_all_before + 2,
        "each restored vCPU got a wake-all"
    );
}

#[test]
fn x86_state_restore_wakes_every_waiter_and_loses_nothing() {
    restore_mid_run(ApfProtocol::X86);
}

#[test]
fn event_state_restore_wakes_every_waiter_and_loses_nothing() {
    restore_mid_run(ApfProtocol::Event);
}
