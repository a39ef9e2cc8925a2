//! The async-PF ABI as the guest sees it, per `--apf` configuration: CPUID
//! bits, KVM's #GP rules for the MSRs, the event protocol's hypercall
//! checks, and the wake-all sent on enable.

use hv::apf::{ApfMode, ApfProtocol, ApfState, EventConfig};
use hv::{Vm, VmConfig};
use std::collections::BTreeMap;

mod probe;

const APFABI: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/apfabi.elf"));

fn run(apf: ApfMode, protocol: ApfProtocol) -> (Vm, BTreeMap<String, u64>) {
    let config = VmConfig {
        mem_size: 16 << 20,
        apf,
        apf_protocol: protocol,
        ..VmConfig::default()
    };
    probe::run_probes(&config, APFABI)
}

/// The CPUID bits offered under every configuration: kvmclock's, steal
/// time, PV TLB flush, PV sched yield, PV send-IPI and PV EOI.
const CLOCK: u32 = abi::KVM_FEATURE_CLOCKSOURCE2
    | abi::KVM_FEATURE_STEAL_TIME
    | abi::KVM_FEATURE_PV_TLB_FLUSH
    | abi::KVM_FEATURE_PV_SCHED_YIELD
    | abi::KVM_FEATURE_PV_SEND_IPI
    | abi::KVM_FEATURE_PV_EOI;

const ENOSYS: u64 = (-1000i64) as u64;
const EINVAL: u64 = (-22i64) as u64;
const EFAULT: u64 = (-14i64) as u64;

#[test]
fn x86_protocol_follows_kvm_msr_rules() {
    let (vm, v) = run(ApfMode::Pv, ApfProtocol::X86);
    let features = abi::KVM_FEATURE_ASYNC_PF
        | abi::KVM_FEATURE_ASYNC_PF_INT
        | abi::KVM_FEATURE_PV_UNHALT
        | CLOCK;
    assert_eq!(v["features"], u64::from(features));
    assert_eq!(v["gp_reserved"], 1, "bits 5:4 are reserved");
    assert_eq!(v["gp_pf_vmexit"], 1, "ASYNC_PF_VMEXIT is not offered");
    assert_eq!(v["gp_outside"], 1, "the area must be guest memory");
    assert_eq!(v["gp_int_high"], 1, "the vector MSR has 8 bits");
    assert_eq!(v["gp_int"], 0);
    assert_eq!(v["gp_enable"], 0);
    assert_eq!(
        v["token_apic_off"], 0,
        "no page-ready while the local APIC is disabled"
    );
    assert_eq!(
        v["token_after_enable"],
        u64::from(abi::APF_WAKE_ALL),
        "enable wakes all, once the APIC is on"
    );
    assert_eq!(v["ready_pending"], 1, "and its interrupt is pending");
    assert_eq!(v["gp_ack"], 0);
    assert_eq!(v["gp_disable"], 0);
    assert_eq!(v["hc_version"], ENOSYS, "the event protocol is not offered");
    let stats = vm.stats();
    assert_eq!(stats.apf().wake_all, 1);
    assert_eq!(vm.apf_state(0).unwrap().msr_en, 0, "disabled at the end");
}

#[test]
fn without_pv_the_msrs_do_not_exist() {
    for mode in [ApfMode::Off, ApfMode::Halt] {
        let (_, v) = run(mode, ApfProtocol::X86);
        assert_eq!(v["features"], u64::from(abi::KVM_FEATURE_PV_UNHALT | CLOCK));
        for probe in ["gp_int", "gp_enable", "gp_ack", "gp_disable"] {
            assert_eq!(v[probe], 1, "{probe} under {mode:?}");
        }
        assert_eq!(v["hc_version"], ENOSYS);
    }
}

#[test]
fn event_protocol_checks_its_hypercall_arguments() {
    let (mut vm, v) = run(ApfMode::Pv, ApfProtocol::Event);
    assert_eq!(
        v["features"],
        u64::from(abi::KVM_FEATURE_PV_UNHALT | CLOCK),
        "no x86 bits"
    );
    assert_eq!(v["gp_enable"], 1, "x86 MSRs absent");
    assert_eq!(v["hc_version"], abi::APF_EVENT_VERSION);
    assert_eq!(v["hc_slots"], abi::APF_MAX_OUTSTANDING);
    assert_eq!(v["hc_enable_misaligned"], EINVAL);
    assert_eq!(v["hc_enable_same_vector"], EINVAL);
    assert_eq!(v["hc_enable_low_vector"], EINVAL);
    assert_eq!(v["hc_enable_bad_flags"], EINVAL);
    assert_eq!(v["hc_enable_outside"], EFAULT);
    assert_eq!(v["hc_enable"], 0);
    assert_eq!(v["ready_after_enable"], u64::from(abi::APF_WAKE_ALL));
    assert_eq!(v["hc_ack"], 0);
    assert_eq!(v["hc_disable"], 0);
    assert_eq!(v["hc_ack_disabled"], EINVAL);

    // The VMM-level state API: restore checks the protocol and the area.
    let state = ApfState {
        event: Some(EventConfig {
            area: 0x20_0000,
            notpresent_vector: 0x23,
            ready_vector: 0x22,
            send_always: false,
        }),
        next_id: 77,
        ..ApfState::default()
    };
    vm.set_apf_state(0, &state).unwrap();
    assert_eq!(vm.apf_state(0), Some(state));
    assert_eq!(vm.vcpus()[0].apf_ready_queued(), 1, "a wake-all is queued");
    let x86 = ApfState {
        msr_en: 0x20_0000 | abi::KVM_ASYNC_PF_ENABLED,
        ..ApfState::default()
    };
    assert!(vm.set_apf_state(0, &x86).is_err(), "wrong protocol");
    let outside = ApfState {
        event: Some(EventConfig {
            area: 1 << 40,
            ..state.event.unwrap()
        }),
        ..state
    };
    assert!(vm.set_apf_state(0, &outside).is_err());
    assert!(vm.set_apf_state(5, &state).is_err(), "no such vCPU");
}
