//! PV EOI as a guest uses it (`guests/pveoi.c`, Linux's
//! `kvm_guest_apic_eoi_write`): KVM's MSR rules, the flag set for an entry
//! with one vector in service and nothing pending (the guest's EOI only
//! clears it, the vector stays in service until the hv's next exit, where
//! the hv ends it), no flag while another vector is pending, none once
//! disabled.

use hv::VmConfig;

mod probe;

const PVEOI: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pveoi.elf"));

#[test]
fn pv_eoi_follows_kvm_rules_and_the_hv_ends_the_skipped_eoi() {
    let config = VmConfig {
        mem_size: 16 << 20,
        ..VmConfig::default()
    };
    let (vm, v) = probe::run_probes(&config, PVEOI);
    assert_ne!(v["features"] & u64::from(abi::KVM_FEATURE_PV_EOI), 0);
    assert_eq!(v["gp_unaligned"], 1, "not 4-byte aligned");
    assert_eq!(v["gp_outside"], 1, "enabling outside RAM");
    assert_eq!(v["gp_disabled_outside"], 0, "disabled: any address");
    assert_eq!(v["gp_enable"], 0);
    assert_eq!(v["msr_readback"], 1);

    // Alone in service: the hv set the flag at the entry after the
    // handler's exit; the guest took it instead of writing the EOI.
    assert_eq!(v["alone_flag_seen"], 1);
    assert_eq!(v["alone_skipped"], 1);
    assert_eq!(v["alone_written"], 0);
    assert_eq!(v["alone_isr_in_service"], 1, "the EOI waits for an exit");
    assert_eq!(v["alone_isr_after_exit"], 0, "the hv did it");
    assert_eq!(v["alone_flag_after"], 0);

    // Another vector pending behind it: no flag, a written EOI, then the
    // pending vector runs.
    assert_eq!(v["pending_flag_seen"], 0);
    assert_eq!(v["pending_skipped"], 0);
    assert_eq!(v["pending_written"], 2, "both handlers wrote their EOI");
    assert_eq!(v["pending_isr_in_service"], 0);
    assert_eq!(v["pending_b_runs"], 1);

    // Disabled.
    assert_eq!(v["gp_disable"], 0);
    assert_eq!(v["disabled_flag_seen"], 0);
    assert_eq!(v["disabled_skipped"], 0);
    assert_eq!(v["disabled_written"], 1);
    assert_eq!(v["disabled_isr_in_service"], 0);

    let stats = vm.stats();
    assert_eq!(stats.vcpus[0].pv_eois, 1, "the one skipped EOI");
    assert!(stats.vcpus[0].pv_eoi_offered >= 1);
}
