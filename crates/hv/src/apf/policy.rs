//! The async-PF policy: how a vCPU waits for a page the MMU's fault path
//! found on its way in from swap (KVM's `kvm_arch_setup_async_pf` and
//! `kvm_can_do_async_pf`), and what happens when a page arrives (KVM's
//! `kvm_check_async_pf_completion`: prefault, then page-ready).

use super::{ApfMode, ApfProtocol, ApfWork};
use crate::error::VmError;
use crate::memslot::PageState;
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
    let apic_id = vcpu.cpu.apic().id();
    let apf = &mut vcpu.apf;
    let token = apf.new_token(apic_id);
    apf.gfns.add(gfn);
    apf.works.push(ApfWork {
        token,
        gfn,
        swap_slot: slot,
        ready_at,
        notified: false,
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
        vcpu: vcpu.id.0,
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
            vcpu: vcpu.id.0,
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
        prefault(vcpu, shared, work.gfn, now)?;
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
    let writable = !slot.flags.readonly;
    let mapped = host.mmu.map_gfn(
        &host.mem,
        &mut host.frames,
        &host.costs,
        root.id,
        gfn,
        frame,
        writable,
        now,
    );
    mapped.result.map_err(|source| VmError::EptFault {
        vcpu: vcpu.id.0,
        gpa: gfn.addr(),
        rip: vcpu.rip(),
        source,
    })?;
    vcpu.charge(mapped.cycles);
    vcpu.stats.mmu_lock_wait_cycles += mapped.lock_wait.0;
    Ok(())
}

/// Sends the vCPU's queued page-ready notifications, one at a time: each
/// waits until the guest has emptied the token slot.
pub(crate) fn deliver_ready(vcpu: &mut Vcpu, shared: &mut Shared) -> Result<(), VmError> {
    let protocol = shared.apf.protocol;
    if !vcpu.apf.enabled(protocol) {
        vcpu.apf.ready_queue.clear();
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
