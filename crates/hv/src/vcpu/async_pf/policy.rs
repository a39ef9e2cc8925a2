//! The async-PF policy: how a vCPU waits for a page the MMU's fault path
//! found on its way in from swap (KVM's `kvm_arch_setup_async_pf` and
//! `kvm_can_do_async_pf`), and what happens when a page arrives (KVM's
//! `kvm_check_async_pf_completion`: prefault, then page-ready).

use crate::apf::{ApfMode, ApfProtocol, ApfWork};
use crate::error::VmError;
use crate::memslot::PageState;
use crate::pager::PageRef;
use crate::shared::Shared;
use crate::swap::SwapSlot;
use crate::time::Cycles;
use crate::vcpu::{Next, Vcpu};
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
    // The hv's accesses to guest memory here (the APF area, the token)
    // come after the fault's own requests: stamped with the handler's
    // time, not the exit's (a page they page in queues in that order).
    let exit_time = shared.time;
    shared.time = shared.time.max(vcpu.clock() + *cycles);
    let next = (|| -> Result<Next, VmError> {
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
    })();
    shared.time = exit_time;
    next
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
