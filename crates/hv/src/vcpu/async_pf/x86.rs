//! KVM's x86 async-PF protocol: the MSRs (with KVM's #GP rules) and the
//! page-not-present #PF carrying the token in CR2. Page-ready is an
//! interrupt on the vector of `MSR_KVM_ASYNC_PF_INT`
//! ([`super::policy::deliver_ready`]).

use super::policy::{deliver_ready, set_guest_u32};
use crate::apf::{en_area, int_msr_valid, ApfProtocol, EN_REFUSED};
use crate::error::VmError;
use crate::shared::Shared;
use crate::vcpu::Vcpu;
use machine::cpu::vector;
use machine::{EventInjection, EventKind};

/// RDMSR of an APF MSR; `None` if `index` is not one of them (or the
/// protocol is not offered).
pub(crate) fn rdmsr(vcpu: &Vcpu, shared: &Shared, index: u32) -> Option<u64> {
    if !shared.apf.x86_offered() {
        return None;
    }
    match index {
        abi::MSR_KVM_ASYNC_PF_EN => Some(vcpu.apf.state.msr_en),
        abi::MSR_KVM_ASYNC_PF_INT => Some(vcpu.apf.state.msr_int),
        abi::MSR_KVM_ASYNC_PF_ACK => Some(0),
        _ => None,
    }
}

/// WRMSR of an APF MSR, with KVM's checks: `Some(false)` for a value
/// refused with #GP, `None` if `index` is not one of them.
pub(crate) fn wrmsr(
    vcpu: &mut Vcpu,
    shared: &mut Shared,
    index: u32,
    value: u64,
) -> Result<Option<bool>, VmError> {
    if !shared.apf.x86_offered() {
        return Ok(None);
    }
    let ok = match index {
        abi::MSR_KVM_ASYNC_PF_EN => write_en(vcpu, shared, value)?,
        abi::MSR_KVM_ASYNC_PF_INT => {
            let ok = int_msr_valid(value);
            if ok {
                vcpu.apf.state.msr_int = value;
            }
            ok
        }
        abi::MSR_KVM_ASYNC_PF_ACK => {
            if value & 1 != 0 {
                vcpu.apf.stats.acks += 1;
                deliver_ready(vcpu, shared)?;
            }
            true
        }
        _ => return Ok(None),
    };
    Ok(Some(ok))
}

/// MSR_KVM_ASYNC_PF_EN: false for a value KVM refuses with #GP.
fn write_en(vcpu: &mut Vcpu, shared: &mut Shared, value: u64) -> Result<bool, VmError> {
    if value & EN_REFUSED != 0 {
        return Ok(false);
    }
    let enabling = value & abi::KVM_ASYNC_PF_ENABLED != 0;
    if enabling && shared.host.slots.lookup(en_area(value).frame()).is_none() {
        return Ok(false);
    }
    let apf = &mut vcpu.apf;
    apf.state.msr_en = value;
    if apf.enabled(ApfProtocol::X86) {
        // Whatever a previous incarnation of the guest waited for is
        // gone: wake every waiter.
        apf.queue_wake_all();
        deliver_ready(vcpu, shared)?;
    } else {
        apf.cancel_all();
    }
    Ok(true)
}

/// Page not present: the reason in the area's flags, the token in CR2,
/// and a #PF with error code 0.
pub(super) fn notify_not_present(
    vcpu: &mut Vcpu,
    shared: &mut Shared,
    token: u32,
) -> Result<(), VmError> {
    let slot = vcpu.apf.not_present_slot(ApfProtocol::X86);
    set_guest_u32(vcpu, shared, slot, abi::KVM_PV_REASON_PAGE_NOT_PRESENT)?;
    vcpu.cpu.state_mut().cr2 = u64::from(token);
    vcpu.cpu.inject_event(EventInjection {
        kind: EventKind::HardwareException,
        vector: vector::PF,
        error_code: Some(0),
        instruction_len: 0,
    });
    Ok(())
}
