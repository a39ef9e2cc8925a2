//! Steal time and the preempted byte (KVM's `MSR_KVM_STEAL_TIME`,
//! `arch/x86/kvm/x86.c` `record_steal_time` and
//! `kvm_steal_time_set_preempted`; the ABI is in `abi`).
//!
//! A vCPU that is runnable but has no host CPU (`--host-cpus` below
//! `--vcpus`, `vm/sched.rs`) accumulates steal time. When the scheduler
//! gives it a host CPU again it calls [`record`], which does what KVM does
//! at the next entry after `vcpu_load`: take the `preempted` byte (atomic
//! exchange with 0: the guest may be setting `KVM_VCPU_FLUSH_TLB` in it)
//! and flush the vCPU's guest TLB if the flag was set, then add the steal
//! accrued since the last report to `steal` between two `version`
//! increments. When the scheduler takes the host CPU from a vCPU that still
//! wants to run, [`set_preempted`] writes `KVM_VCPU_PREEMPTED`.
//!
//! The scheduler runs every vCPU on one host thread, so while the hv
//! updates the area no guest code runs: the exchange is atomic with
//! respect to the guest's compare-and-exchange as KVM's `xchg` is.
//!
//! As with kvmclock, an area outside guest RAM is accepted and not
//! written. The hv's accesses to the area are not charged to the vCPU
//! (KVM's are a few cached stores per schedule-in).

use super::{Requests, Vcpu};
use crate::error::VmError;
use crate::shared::Shared;
use crate::time::Cycles;
use machine::Gpa;

/// Offsets in `struct kvm_steal_time`.
const STEAL: u64 = 0;
const VERSION: u64 = 8;
const PREEMPTED: u64 = 16;

/// A vCPU's steal-time state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct StealTime {
    /// `MSR_KVM_STEAL_TIME` as last written.
    msr: u64,
    /// Steal (ns) already added to the guest's `steal`.
    reported_ns: u64,
    /// The hv wrote `KVM_VCPU_PREEMPTED` and has not taken it back
    /// (KVM's `vcpu->arch.st.preempted`).
    preempted: bool,
}

impl StealTime {
    pub fn enabled(self) -> bool {
        self.msr & abi::KVM_MSR_ENABLED != 0
    }

    fn area(self) -> Gpa {
        Gpa(self.msr & abi::KVM_STEAL_VALID_BITS)
    }
}

/// RDMSR of `MSR_KVM_STEAL_TIME` (`None`: another MSR).
pub(super) fn rdmsr(vcpu: &Vcpu, index: u32) -> Option<u64> {
    (index == abi::MSR_KVM_STEAL_TIME).then_some(vcpu.steal.msr)
}

/// WRMSR of `MSR_KVM_STEAL_TIME` (`None`: another MSR; `Some(false)`:
/// refused, as KVM refuses the reserved bits 5:1).
pub(super) fn wrmsr(
    vcpu: &mut Vcpu,
    shared: &mut Shared,
    index: u32,
    value: u64,
) -> Result<Option<bool>, VmError> {
    if index != abi::MSR_KVM_STEAL_TIME {
        return Ok(None);
    }
    if shared.kvm_features & abi::KVM_FEATURE_STEAL_TIME == 0
        || value & abi::KVM_STEAL_RESERVED_MASK != 0
    {
        return Ok(Some(false));
    }
    let was_enabled = vcpu.steal.enabled();
    vcpu.steal.msr = value;
    if vcpu.steal.enabled() {
        if !was_enabled {
            // Steal counts from registration (the guest's baseline is the
            // area's `steal` then).
            vcpu.steal.reported_ns = Cycles(vcpu.stats.steal_cycles).as_ns();
        }
        vcpu.steal.preempted = false;
        record(vcpu, shared)?;
    }
    Ok(Some(true))
}

/// KVM's `record_steal_time`: the vCPU is scheduled in.
pub(crate) fn record(vcpu: &mut Vcpu, shared: &mut Shared) -> Result<(), VmError> {
    if !vcpu.steal.enabled() {
        return Ok(());
    }
    let area = vcpu.steal.area();
    if !in_ram(shared, area) {
        vcpu.steal.preempted = false;
        return Ok(());
    }
    let error = |vcpu: &Vcpu, source| VmError::GuestMemory {
        vcpu: vcpu.id,
        rip: vcpu.rip(),
        source,
    };
    // xchg(&st->preempted, 0): a flush the guest asked for while the vCPU
    // was preempted is done before it runs again.
    let mut byte = [0u8; 1];
    shared
        .read_guest(area.add(PREEMPTED), &mut byte)
        .map_err(|e| error(vcpu, e))?;
    if byte[0] != 0 {
        shared
            .write_guest(area.add(PREEMPTED), &[0])
            .map_err(|e| error(vcpu, e))?;
    }
    if shared.kvm_features & abi::KVM_FEATURE_PV_TLB_FLUSH != 0
        && byte[0] & abi::KVM_VCPU_FLUSH_TLB != 0
    {
        vcpu.requests.set(Requests::GUEST_TLB_FLUSH);
        vcpu.stats.pv_tlb_flushes += 1;
    }
    vcpu.steal.preempted = false;
    // The version goes odd, steal moves, the version goes even again; a
    // version the guest left odd (uninitialised memory) is made even first.
    let mut word = [0u8; 4];
    shared
        .read_guest(area.add(VERSION), &mut word)
        .map_err(|e| error(vcpu, e))?;
    let mut version = u32::from_le_bytes(word);
    if version & 1 != 0 {
        version = version.wrapping_add(1);
    }
    version = version.wrapping_add(1);
    shared
        .write_guest(area.add(VERSION), &version.to_le_bytes())
        .map_err(|e| error(vcpu, e))?;
    let mut steal = [0u8; 8];
    shared
        .read_guest(area.add(STEAL), &mut steal)
        .map_err(|e| error(vcpu, e))?;
    let now_ns = Cycles(vcpu.stats.steal_cycles).as_ns();
    let delta = now_ns - vcpu.steal.reported_ns;
    let steal = u64::from_le_bytes(steal).wrapping_add(delta);
    vcpu.steal.reported_ns = now_ns;
    vcpu.stats.steal_reported_ns += delta;
    shared
        .write_guest(area.add(STEAL), &steal.to_le_bytes())
        .map_err(|e| error(vcpu, e))?;
    version = version.wrapping_add(1);
    shared
        .write_guest(area.add(VERSION), &version.to_le_bytes())
        .map_err(|e| error(vcpu, e))
}

/// KVM's `kvm_steal_time_set_preempted`: the vCPU lost its host CPU while
/// it wanted to run.
pub(crate) fn set_preempted(vcpu: &mut Vcpu, shared: &mut Shared) -> Result<(), VmError> {
    if !vcpu.steal.enabled() || vcpu.steal.preempted {
        return Ok(());
    }
    let area = vcpu.steal.area();
    if !in_ram(shared, area) {
        return Ok(());
    }
    shared
        .write_guest(area.add(PREEMPTED), &[abi::KVM_VCPU_PREEMPTED])
        .map_err(|source| VmError::GuestMemory {
            vcpu: vcpu.id,
            rip: vcpu.rip(),
            source,
        })?;
    vcpu.steal.preempted = true;
    Ok(())
}

/// Whether the 64-byte area at `gpa` is guest RAM (it is 64-byte
/// aligned, so it lies in one page).
fn in_ram(shared: &Shared, gpa: Gpa) -> bool {
    shared.host.slots.lookup(gpa.frame()).is_some()
}

#[cfg(test)]
mod tests {
    #[test]
    fn reserved_bits_are_outside_the_valid_ones() {
        assert_eq!(abi::KVM_STEAL_VALID_BITS & abi::KVM_STEAL_RESERVED_MASK, 0);
    }
}
