//! The async-PF policy (`vcpu/async_pf/policy.rs`) on a VM with no kernel.

use crate::apf::ApfMode;
use crate::apf::ApfProtocol;
use crate::swap::SwapSlot;
use crate::time::Cycles;
use crate::vcpu::async_pf::policy::*;
use crate::vcpu::Next;
use crate::vm::{Vm, VmConfig};
use machine::cpu::state::rflags;
use machine::Gfn;
use machine::Gpa;

const AREA: u64 = 0x1000;
const READY: Cycles = Cycles(1_000_000);

/// A VM with no kernel (nothing runs): vCPU 0 with interrupts on, at
/// CPL 3, under `mode` and `protocol`.
fn vm(mode: ApfMode, protocol: ApfProtocol) -> Vm {
    let mut vm = Vm::new(&VmConfig {
        mem_size: 16 << 20,
        apf: mode,
        apf_protocol: protocol,
        ..VmConfig::default()
    })
    .unwrap();
    let s = vm.vcpus[0].cpu.state_mut();
    s.rflags |= rflags::IF;
    s.cs.selector = 0x1b;
    vm
}

fn enable_x86(vm: &mut Vm) {
    vm.vcpus[0].apf.state.msr_en =
        AREA | abi::KVM_ASYNC_PF_ENABLED | abi::KVM_ASYNC_PF_DELIVERY_AS_INT;
    vm.vcpus[0].apf.state.msr_int = 0xec;
}

fn fault(vm: &mut Vm, gfn: u64) -> (Next, Cycles) {
    let Vm { vcpus, shared, .. } = vm;
    let mut cycles = Cycles::ZERO;
    let next = wait_for_page(
        &mut vcpus[0],
        shared,
        Gfn(gfn),
        SwapSlot(gfn as u32),
        READY,
        false,
        &mut cycles,
    )
    .unwrap();
    (next, cycles)
}

#[test]
fn off_stalls_and_halt_halts() {
    let mut vm = self::vm(ApfMode::Off, ApfProtocol::X86);
    assert!(matches!(
        fault(&mut vm, 5).0,
        Next::Stall { until: READY, .. }
    ));
    assert_eq!(vm.vcpus[0].apf_outstanding(), 0, "nothing outstanding");
    let mut vm = self::vm(ApfMode::Halt, ApfProtocol::X86);
    assert!(matches!(fault(&mut vm, 5).0, Next::ApfHalt));
    assert_eq!(vm.vcpus[0].apf_outstanding(), 1);
    assert!(
        matches!(fault(&mut vm, 5).0, Next::ApfHalt),
        "same gfn: halt again"
    );
    assert_eq!(vm.vcpus[0].apf_outstanding(), 1, "not twice");
}

#[test]
fn interrupts_off_or_an_event_to_reinject_stall() {
    let mut vm = self::vm(ApfMode::Pv, ApfProtocol::X86);
    enable_x86(&mut vm);
    vm.vcpus[0].cpu.state_mut().rflags &= !rflags::IF;
    assert!(matches!(fault(&mut vm, 5).0, Next::Stall { .. }));
    vm.vcpus[0].cpu.state_mut().rflags |= rflags::IF;
    let Vm { vcpus, shared, .. } = &mut vm;
    let mut cycles = Cycles::ZERO;
    let next = wait_for_page(
        &mut vcpus[0],
        shared,
        Gfn(5),
        SwapSlot(5),
        READY,
        true,
        &mut cycles,
    )
    .unwrap();
    assert!(matches!(next, Next::Stall { .. }), "vectoring: stall");
}

#[test]
fn pv_x86_delivers_not_present_with_the_token_in_cr2_once_per_free_slot() {
    let mut vm = self::vm(ApfMode::Pv, ApfProtocol::X86);
    enable_x86(&mut vm);
    let (next, cycles) = fault(&mut vm, 5);
    assert!(matches!(next, Next::Continue));
    assert_eq!(cycles, Cycles(vm.shared.host.costs.event_injection));
    let token = vm.vcpus[0].cpu.state().cr2 as u32;
    assert_eq!(token, 1 << TOKEN_BITS_FOR_TEST, "(id 1 << 12) | vCPU 0");
    let mut flags = [0u8; 4];
    vm.read_guest(Gpa(AREA), &mut flags).unwrap();
    assert_eq!(
        u32::from_le_bytes(flags),
        abi::KVM_PV_REASON_PAGE_NOT_PRESENT
    );
    assert!(
        vm.vcpus[0].cpu.pending_injection().is_some(),
        "#PF injected"
    );
    // The #PF waits for injection: a second fault cannot be told.
    assert!(matches!(fault(&mut vm, 6).0, Next::Stall { .. }));
    assert_eq!(vm.vcpus[0].apf.stats.not_present, 1);
    // The slot still holds the reason (the guest has not read it): a
    // fault halts instead of notifying.
    let mut other = self::vm(ApfMode::Pv, ApfProtocol::X86);
    enable_x86(&mut other);
    other.write_guest(Gpa(AREA), &1u32.to_le_bytes()).unwrap();
    assert!(matches!(fault(&mut other, 6).0, Next::ApfHalt));
    assert_eq!(other.vcpus[0].apf.stats.not_present, 0);
}

#[test]
fn cpl0_is_told_only_with_send_always_and_64_outstanding_is_the_limit() {
    let mut vm = self::vm(ApfMode::Pv, ApfProtocol::X86);
    enable_x86(&mut vm);
    vm.vcpus[0].cpu.state_mut().cs.selector = 0x08;
    assert!(matches!(fault(&mut vm, 5).0, Next::ApfHalt), "CPL 0: halt");
    for gfn in 6..6 + abi::APF_MAX_OUTSTANDING - 1 {
        assert!(matches!(fault(&mut vm, gfn).0, Next::ApfHalt));
    }
    assert_eq!(
        vm.vcpus[0].apf_outstanding() as u64,
        abi::APF_MAX_OUTSTANDING
    );
    assert!(
        matches!(fault(&mut vm, 1000).0, Next::Stall { .. }),
        "the 65th stalls"
    );
}

#[test]
fn event_protocol_puts_the_token_in_the_area_and_raises_its_vector() {
    let mut vm = self::vm(ApfMode::Pv, ApfProtocol::Event);
    vm.vcpus[0].apf.state.event = Some(crate::apf::EventConfig {
        area: AREA,
        notpresent_vector: 0x23,
        ready_vector: 0x22,
        send_always: false,
    });
    assert!(matches!(fault(&mut vm, 5).0, Next::Continue));
    let mut token = [0u8; 4];
    vm.read_guest(Gpa(AREA), &mut token).unwrap();
    assert_eq!(u32::from_le_bytes(token), 1 << TOKEN_BITS_FOR_TEST);
    let event = vm.vcpus[0].cpu.pending_injection().unwrap();
    assert_eq!(event.vector, 0x23);
}

#[test]
fn page_ready_waits_for_the_guest_to_free_the_slot() {
    let mut vm = self::vm(ApfMode::Pv, ApfProtocol::X86);
    enable_x86(&mut vm);
    let tsc = vm.vcpus[0].cpu.tsc();
    vm.vcpus[0]
        .cpu
        .apic_mut()
        .write_msr(0x80f, 0x1ff, tsc)
        .unwrap();
    vm.vcpus[0].apf.ready_queue.extend([7, 8]);
    let Vm { vcpus, shared, .. } = &mut vm;
    deliver_ready(&mut vcpus[0], shared).unwrap();
    assert_eq!(vcpus[0].apf_ready_queued(), 1, "one at a time");
    let mut token = [0u8; 4];
    vm.read_guest(Gpa(AREA + 4), &mut token).unwrap();
    assert_eq!(u32::from_le_bytes(token), 7);
    vm.write_guest(Gpa(AREA + 4), &[0; 4]).unwrap(); // the guest acks
    let Vm { vcpus, shared, .. } = &mut vm;
    deliver_ready(&mut vcpus[0], shared).unwrap();
    assert_eq!(vcpus[0].apf_ready_queued(), 0);
    assert_eq!(vcpus[0].apf.stats.ready, 2);
}

#[test]
fn page_ready_waits_for_the_local_apic_to_be_enabled() {
    // Linux's boot CPU enables async PF before its local APIC: the
    // wake-all must not be written (nor its interrupt dropped) until
    // the APIC is on, or it blocks the slot for good.
    let mut vm = self::vm(ApfMode::Pv, ApfProtocol::X86);
    enable_x86(&mut vm);
    vm.vcpus[0].apf.ready_queue.push_back(abi::APF_WAKE_ALL);
    let Vm { vcpus, shared, .. } = &mut vm;
    deliver_ready(&mut vcpus[0], shared).unwrap();
    assert_eq!(vcpus[0].apf_ready_queued(), 1, "held back: APIC off");
    assert_eq!(vcpus[0].apf.stats.ready, 0);
    let mut token = [0u8; 4];
    vm.read_guest(Gpa(AREA + 4), &mut token).unwrap();
    assert_eq!(u32::from_le_bytes(token), 0, "the slot stays free");
    // x2APIC SVR: software enable.
    let tsc = vm.vcpus[0].cpu.tsc();
    vm.vcpus[0]
        .cpu
        .apic_mut()
        .write_msr(0x80f, 0x1ff, tsc)
        .unwrap();
    let Vm { vcpus, shared, .. } = &mut vm;
    deliver_ready(&mut vcpus[0], shared).unwrap();
    assert_eq!(vcpus[0].apf_ready_queued(), 0);
    assert_eq!(vcpus[0].cpu.apic().deliverable_vector(), Some(0xec));
    vm.read_guest(Gpa(AREA + 4), &mut token).unwrap();
    assert_eq!(u32::from_le_bytes(token), abi::APF_WAKE_ALL);
}

const TOKEN_BITS_FOR_TEST: u32 = 12;
