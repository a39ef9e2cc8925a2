//! Steal time as the guest registers it (`guests/steal.c`): the CPUID bits,
//! KVM's MSR rules, the area after enabling (its odd junk version made
//! even, the steal the guest left there kept, nothing added on a VM where
//! no vCPU waits), and KVM_HC_SCHED_YIELD / KVM_HC_KICK_CPU with nobody to
//! yield to or wake.

use hv::VmConfig;

mod probe;

const STEAL: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/steal.elf"));

#[test]
fn steal_time_follows_kvm_msr_rules() {
    let config = VmConfig {
        mem_size: 16 << 20,
        ..VmConfig::default()
    };
    let (vm, v) = probe::run_probes(&config, STEAL);
    let bits = abi::KVM_FEATURE_STEAL_TIME
        | abi::KVM_FEATURE_PV_TLB_FLUSH
        | abi::KVM_FEATURE_PV_SCHED_YIELD
        | abi::KVM_FEATURE_PV_UNHALT;
    assert_eq!(v["features"] & u64::from(bits), u64::from(bits));
    assert_eq!(v["gp_reserved"], 1, "bits 5:1 are reserved");
    assert_eq!(v["gp_enable"], 0);
    assert_eq!(v["msr_readback"] & 0x3f, abi::KVM_MSR_ENABLED);
    // record_steal_time: an odd version is made even, then +2 per update.
    assert_eq!(v["version"], 10);
    assert_eq!(v["steal"], 1000, "the guest's own value, nothing stolen");
    assert_eq!(v["preempted"], 0);
    assert_eq!(v["yield"], 0);
    assert_eq!(v["yield_unknown"], 0);
    assert_eq!(v["kick_unknown"], 0);
    assert_eq!(v["gp_outside"], 0, "KVM accepts any address");
    assert_eq!(v["gp_disable"], 0);
    assert_eq!(v["readback_disabled"], 0);
    let stats = vm.stats();
    assert_eq!(stats.vcpus[0].steal_cycles, 0);
    assert_eq!(stats.vcpus[0].sched_yields, 2);
    assert_eq!(stats.vcpus[0].sched_yields_directed, 0);
    assert_eq!(stats.vcpus[0].kicks_sent, 1);
}
