//! PV EOI (KVM's `MSR_KVM_PV_EOI_EN`, `arch/x86/kvm/lapic.c`
//! `apic_sync_pv_eoi_to_guest` / `apic_sync_pv_eoi_from_guest`; the ABI
//! is in `abi`).
//!
//! The guest registers a flag word (4-byte aligned). Before each entry, if
//! exactly one vector is in service and none is pending, the hv sets the
//! flag's bit 0: the guest's EOI then only clears the bit (Linux's
//! `kvm_guest_apic_eoi_write`: `__test_and_clear_bit`, no APIC write), and
//! at the next exit the hv, finding the bit clear, does the EOI itself.
//! At every exit the hv takes the bit back (clears it if the guest did not,
//! as KVM's `pv_eoi_test_and_clr_pending`), so it is set only for an entry
//! where an EOI the hv does later cannot be observed: with one vector in
//! service and nothing pending, nothing waits on the EOI until something
//! new becomes pending.
//!
//! Unlike KVM's APIC, the machine's delivers interrupts during a run
//! without an exit (as APICv does). Of what can become pending during a
//! run, the APIC timer is bounded: an entry with the bit set runs only up
//! to the timer's deadline, so the timer interrupt never waits on a
//! skipped EOI. A self-IPI of the in-service vector's class or lower sent
//! while the bit is consumed waits for the next exit (at most the
//! scheduling quantum); IPIs from other vCPUs arrive between runs only.
//! The flag is not offered while the vector in service is level-triggered
//! (its TMR bit set): its EOI must reach the IOAPIC (KVM's
//! `kvm_ioapic_handles_vector`).
//!
//! The flag is written as one byte, as KVM writes it. Nothing about PV EOI
//! is pending between two runs: a snapshot holds the MSR value.

use super::Vcpu;
use crate::error::VmError;
use crate::shared::Shared;
use crate::time::Cycles;
use machine::Gpa;

/// The x2APIC EOI register.
const MSR_X2APIC_EOI: u32 = 0x80b;

/// A vCPU's PV EOI state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct PvEoi {
    /// `MSR_KVM_PV_EOI_EN` as last written.
    msr: u64,
    /// The hv set the guest's flag for the current run (KVM's
    /// `KVM_APIC_PV_EOI_PENDING`).
    pending: bool,
}

impl PvEoi {
    pub fn enabled(self) -> bool {
        self.msr & abi::KVM_MSR_ENABLED != 0
    }

    fn flag(self) -> Gpa {
        Gpa(self.msr & !abi::KVM_MSR_ENABLED)
    }
}

/// RDMSR of `MSR_KVM_PV_EOI_EN` (`None`: another MSR).
pub(super) fn rdmsr(vcpu: &Vcpu, index: u32) -> Option<u64> {
    (index == abi::MSR_KVM_PV_EOI_EN).then_some(vcpu.pv_eoi.msr)
}

/// WRMSR of `MSR_KVM_PV_EOI_EN` (`None`: another MSR; `Some(false)`:
/// refused with #GP, as KVM's `kvm_lapic_set_pv_eoi` refuses an address
/// that is not 4-byte aligned or, when enabling, not in guest RAM).
pub(super) fn wrmsr(vcpu: &mut Vcpu, shared: &Shared, index: u32, value: u64) -> Option<bool> {
    if index != abi::MSR_KVM_PV_EOI_EN {
        return None;
    }
    let flag = Gpa(value & !abi::KVM_MSR_ENABLED);
    let enable = value & abi::KVM_MSR_ENABLED != 0;
    if shared.kvm_features & abi::KVM_FEATURE_PV_EOI == 0
        || flag.0 % 4 != 0
        || (enable && shared.host.slots.lookup(flag.frame()).is_none())
    {
        return Some(false);
    }
    vcpu.pv_eoi = PvEoi {
        msr: value,
        pending: false,
    };
    Some(true)
}

/// Before an entry (KVM's `apic_sync_pv_eoi_to_guest`): sets the guest's
/// flag if exactly one vector is in service and none is pending. Returns
/// the run's cycle limit: `limit`, or the APIC timer's deadline if that
/// is earlier and the flag was set.
pub(super) fn before_entry(
    vcpu: &mut Vcpu,
    shared: &mut Shared,
    limit: Cycles,
) -> Result<Cycles, VmError> {
    let state = vcpu.pv_eoi;
    if !state.enabled() || state.pending {
        return Ok(limit);
    }
    let in_service: u32 = vcpu.cpu.apic().isr().iter().map(|r| r.count_ones()).sum();
    if in_service != 1 {
        return Ok(limit);
    }
    let apic = vcpu.cpu.apic();
    let level = apic
        .isr()
        .iter()
        .zip(apic.tmr())
        .any(|(isr, tmr)| isr & tmr != 0);
    if level {
        return Ok(limit);
    }
    // A timer already due fires first (it is then pending): the deadline
    // below is in the future.
    vcpu.cpu.sync_apic_timer();
    if vcpu.cpu.apic().irr().iter().any(|&r| r != 0) {
        return Ok(limit);
    }
    shared
        .write_guest(state.flag(), &[1])
        .map_err(|source| VmError::GuestMemory {
            vcpu: vcpu.id,
            rip: vcpu.rip(),
            source,
        })?;
    vcpu.pv_eoi.pending = true;
    vcpu.stats.pv_eoi_offered += 1;
    let offset = vcpu.cpu.vmx().map_or(0, |c| c.tsc_offset);
    Ok(match vcpu.cpu.apic().next_timer_deadline() {
        Some(tsc) if tsc.wrapping_sub(offset as u64) > vcpu.cpu.cycles() => {
            limit.min(Cycles(tsc.wrapping_sub(offset as u64)))
        }
        Some(_) | None => limit,
    })
}

/// After an exit (KVM's `apic_sync_pv_eoi_from_guest`): if the guest
/// cleared the flag it skipped its EOI, which the hv does now; if not, the
/// hv clears it (it is set again before the next entry if it still may
/// be).
pub(super) fn after_exit(vcpu: &mut Vcpu, shared: &mut Shared) -> Result<(), VmError> {
    if !vcpu.pv_eoi.pending {
        return Ok(());
    }
    vcpu.pv_eoi.pending = false;
    let flag = vcpu.pv_eoi.flag();
    let error = |vcpu: &Vcpu, source| VmError::GuestMemory {
        vcpu: vcpu.id,
        rip: vcpu.rip(),
        source,
    };
    let mut byte = [0u8; 1];
    shared
        .read_guest(flag, &mut byte)
        .map_err(|e| error(vcpu, e))?;
    if byte[0] & 1 != 0 {
        shared
            .write_guest(flag, &[byte[0] & !1])
            .map_err(|e| error(vcpu, e))?;
        return Ok(());
    }
    let tsc = vcpu.cpu.tsc();
    // Writing 0 to the EOI register cannot fault.
    let _ = vcpu.cpu.apic_mut().write_msr(MSR_X2APIC_EOI, 0, tsc);
    vcpu.stats.pv_eois += 1;
    Ok(())
}
