//! The async-PF policy: how a vCPU waits for a page the MMU's fault path
//! found on its way in from swap (KVM's `kvm_arch_setup_async_pf` and
//! `kvm_can_do_async_pf`), and what happens when a page arrives (KVM's
//! `kvm_check_async_pf_completion`: prefault, then page-ready).

use super::{ApfMode, ApfProtocol, ApfWork};
use crate::error::VmError;
use crate::memslot::PageState;
use crate::pager::PageRef;
use crate::swap::SwapSlot;
use crate::time::Cycles;
use crate::vcpu::{Next, Vcpu};
use crate::vm::shared::Shared;
use machine::cpu::state::rflags;
use machine::Gfn;

/// The vCPU touched `gfn`, whose read from swap completes at `ready_at`:
/// stall synchronously, halt in the hv, or tell the guest.
pub(crate) fn wait_for_page(
    vcpu: &mut Vcpu,
    shared: &mut Shared,
    gfn: Gfn,
    slot: SwapSlot,
    ready_at: Cycles,
    vectoring: bool,
    cycles: &mut Cycles,
) -> Result<Next, VmError> {
    let stall = Next::Stall {
        until: ready_at,
        slot,
    };
    if shared.apf.mode == ApfMode::Off {
        return Ok(stall);
    }
    // kvm_can_do_async_pf: with interrupts off, or an event to re-inject,
    // not even the halt can be used.
    let interrupts_allowed = vcpu.cpu.state().rflags & rflags::IF != 0
        && vcpu.cpu.pending_injection().is_none()
        && !vectoring;
    if !interrupts_allowed {
        return Ok(stall);
    }
    if vcpu.apf.gfns.contains(gfn) {
        // Already outstanding (the guest retried, or another task of it
        // touched the page): halt until it arrives.
        return Ok(Next::ApfHalt);
    }
    if vcpu.apf.works.len() as u64 >= abi::APF_MAX_OUTSTANDING {
        return Ok(stall);
    }
    let slots = &shared.host.slots;
    let Some(memslot) = slots.lookup(gfn) else {
        return Ok(stall);
    };
    let page = PageRef {
        slot: memslot.id,
        index: memslot.index_of(gfn),
    };
    let apic_id = vcpu.cpu.apic().id();
    let apf = &mut vcpu.apf;
    let token = apf.new_token(apic_id);
    apf.gfns.add(gfn);
    apf.works.push(ApfWork {
        token,
        gfn,
        page,
        generation: slots.generation(),
        swap_slot: slot,
        ready_at,
        notified: false,
        shadow: vcpu.shadow.faulting,
    });
    apf.stats.peak_outstanding = apf.stats.peak_outstanding.max(apf.works.len() as u64);
    if shared.apf.mode == ApfMode::Pv && notify_not_present(vcpu, shared, token)? {
        *cycles += Cycles(shared.host.costs.event_injection);
        let apf = &mut vcpu.apf;
        if let Some(work) = apf.works.last_mut() {
            work.notified = true;
        }
        apf.stats.not_present += 1;
        return Ok(Next::Continue);
    }
    Ok(Next::ApfHalt)
}

/// Delivers page-not-present for `token` if the guest can take it now
/// (delivery enabled; CPL 3 unless it asked for CPL 0 too; the
/// notification slot free). Returns whether it was delivered.
fn notify_not_present(vcpu: &mut Vcpu, shared: &mut Shared, token: u32) -> Result<bool, VmError> {
    let protocol = shared.apf.protocol;
    let apf = &vcpu.apf;
    if !apf.enabled(protocol) {
        return Ok(false);
    }
    if vcpu.cpu.state().cpl() != 3 && !apf.send_always(protocol) {
        return Ok(false);
    }
    let slot = apf.not_present_slot(protocol);
    if guest_u32(vcpu, shared, slot)? != 0 {
        return Ok(false);
    }
    match protocol {
        ApfProtocol::X86 => super::x86::notify_not_present(vcpu, shared, token)?,
        ApfProtocol::Event => super::event::notify_not_present(vcpu, shared, token)?,
    }
    Ok(true)
}

/// Reads a u32 of the vCPU's shared area.
pub(super) fn guest_u32(
    vcpu: &Vcpu,
    shared: &mut Shared,
    gpa: machine::Gpa,
) -> Result<u32, VmError> {
    shared.read_u32(gpa).map_err(|source| VmError::GuestMemory {
        vcpu: vcpu.id,
        rip: vcpu.rip(),
        source,
    })
}

/// Writes a u32 of the vCPU's shared area.
pub(super) fn set_guest_u32(
    vcpu: &Vcpu,
    shared: &mut Shared,
    gpa: machine::Gpa,
    value: u32,
) -> Result<(), VmError> {
    shared
        .write_u32(gpa, value)
        .map_err(|source| VmError::GuestMemory {
            vcpu: vcpu.id,
            rip: vcpu.rip(),
            source,
        })
}

/// Completes the vCPU's async faults whose pages arrived by its clock:
/// each page becomes resident and is mapped ahead of the retried access
/// (KVM's `kvm_arch_async_page_ready`), and a notified fault queues its
/// page-ready. Returns whether any arrived.
pub(crate) fn complete_arrived(vcpu: &mut Vcpu, shared: &mut Shared) -> Result<bool, VmError> {
    let now = vcpu.clock();
    let mut arrived = false;
    while let Some(i) = next_due_work(vcpu, now) {
        let work = vcpu.apf.works.remove(i);
        arrived = true;
        shared
            .pager
            .finish_page_in(&mut shared.host.slots, work.swap_slot);
        // The memslot may have moved since the fault: map the page where
        // it is now.
        match work.shadow {
            Some(fault) => vcpu.shadow_prefault(shared, fault)?,
            None => {
                if let Some(gfn) = work.current_gfn(&shared.host.slots) {
                    prefault(vcpu, shared, gfn, now)?;
                }
            }
        }
        let apf = &mut vcpu.apf;
        apf.gfns.remove(work.gfn);
        if work.notified {
            apf.ready_queue.push_back(work.token);
        }
    }
    Ok(arrived)
}

/// The index of the vCPU's earliest async fault due by `now`.
fn next_due_work(vcpu: &Vcpu, now: Cycles) -> Option<usize> {
    let works = &vcpu.apf.works;
    (0..works.len())
        .filter(|&i| works[i].ready_at <= now)
        .min_by_key(|&i| (works[i].ready_at, works[i].token))
}

/// Maps resident `gfn` ahead of the guest's access, charging the vCPU.
fn prefault(vcpu: &mut Vcpu, shared: &mut Shared, gfn: Gfn, now: Cycles) -> Result<(), VmError> {
    let host = &mut shared.host;
    let Some(slot) = host.slots.lookup(gfn) else {
        return Ok(());
    };
    let PageState::Resident(frame) = slot.state(gfn) else {
        return Ok(());
    };
    let Some(root) = vcpu.root else {
        return Ok(());
    };
    // A prefault is no write: under dirty logging the leaf stays
    // write-protected.
    let rights = crate::mmu::fault::LeafWrite::for_slot(slot, false);
    let mapped = host.mmu.map_gfn(
        &host.mem,
        &mut host.frames,
        &host.costs,
        root.id,
        gfn,
        frame,
        rights,
        false,
        false,
        now,
    );
    mapped.result.map_err(|source| VmError::EptFault {
        vcpu: vcpu.id,
        gpa: gfn.addr(),
        rip: vcpu.rip(),
        source: source.into(),
    })?;
    // KVM's page-ready prefault is a whole fault: `hva_to_pfn` (GUP-fast
    // on the page that just arrived) before the hold.
    vcpu.charge(mapped.cycles + Cycles(host.costs.host_pfn_lookup));
    vcpu.stats.mmu_lock_wait_cycles += mapped.lock_wait.0;
    Ok(())
}

/// Sends the vCPU's queued page-ready notifications, one at a time: each
/// waits until the guest has emptied the token slot, and all of them wait
/// while the vCPU's local APIC is software-disabled (KVM's
/// `kvm_arch_can_dequeue_async_page_present`: `kvm_lapic_enabled` and the
/// slot free). A disabled APIC drops the interrupt, so a token written
/// then would sit in the slot unannounced and hold back every later
/// page-ready of the vCPU for good: Linux enables async PF on its boot CPU
/// (`kvm_smp_prepare_boot_cpu`) before it enables that CPU's APIC, and
/// the wake-all queued at enable is delivered once it has. (KVM re-checks
/// when the APIC is enabled, `KVM_REQ_APF_READY` from `apic_set_spiv`;
/// here the queue is retried after every exit, `complete_io`.)
pub(crate) fn deliver_ready(vcpu: &mut Vcpu, shared: &mut Shared) -> Result<(), VmError> {
    let protocol = shared.apf.protocol;
    if !vcpu.apf.enabled(protocol) {
        vcpu.apf.ready_queue.clear();
        return Ok(());
    }
    if !vcpu.cpu.apic().software_enabled() {
        return Ok(());
    }
    let slot = vcpu.apf.ready_slot(protocol);
    while let Some(&token) = vcpu.apf.ready_queue.front() {
        if guest_u32(vcpu, shared, slot)? != 0 {
            break; // not acknowledged yet
        }
        set_guest_u32(vcpu, shared, slot, token)?;
        let vector = vcpu.apf.ready_vector(protocol);
        vcpu.cpu.apic_mut().accept_interrupt(vector);
        vcpu.apf.ready_queue.pop_front();
        vcpu.apf.stats.ready += 1;
        if token == abi::APF_WAKE_ALL {
            vcpu.apf.stats.wake_all += 1;
        }
        vcpu.charge(Cycles(shared.host.costs.event_injection));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apf::ApfProtocol;
    use crate::vm::{Vm, VmConfig};
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
}
