//! The event protocol (after seed 002): hypercalls to find, enable,
//! disable and acknowledge it; both notifications are interrupts on
//! vectors the guest chose, with the token in the shared area.

use super::policy::{deliver_ready, set_guest_u32};
use crate::apf::{ApfProtocol, EventConfig, AREA_ALIGN};
use crate::error::VmError;
use crate::shared::Shared;
use crate::vcpu::Vcpu;
use abi::errno;
use machine::{EventInjection, EventKind, Gpa};

/// Whether `HC_APF_ENABLE`'s arguments are well formed (the area must
/// also be guest memory: `-EFAULT` otherwise).
pub(crate) fn enable_args_valid(area: u64, np: u64, ready: u64, flags: u64) -> bool {
    let vector_ok = |v: u64| (32..=255).contains(&v);
    area % AREA_ALIGN == 0
        && vector_ok(np)
        && vector_ok(ready)
        && np != ready
        && flags & !abi::APF_EVENT_SEND_ALWAYS == 0
}

/// The event protocol's hypercalls; `None` if `nr` is not one.
pub(crate) fn hypercall(
    vcpu: &mut Vcpu,
    shared: &mut Shared,
    nr: u64,
    args: [u64; 4],
) -> Result<Option<i64>, VmError> {
    let offered = shared.apf.event_offered();
    let result = match nr {
        abi::HC_APF_VERSION
        | abi::HC_APF_SLOTS
        | abi::HC_APF_ENABLE
        | abi::HC_APF_DISABLE
        | abi::HC_APF_ACK
            if !offered =>
        {
            -errno::KVM_ENOSYS
        }
        abi::HC_APF_VERSION => abi::APF_EVENT_VERSION as i64,
        abi::HC_APF_SLOTS => abi::APF_MAX_OUTSTANDING as i64,
        abi::HC_APF_ENABLE => {
            let [area, np, ready, flags] = args;
            if !enable_args_valid(area, np, ready, flags) {
                -errno::EINVAL
            } else if shared.host.slots.lookup(Gpa(area).frame()).is_none() {
                -errno::EFAULT
            } else {
                let apf = &mut vcpu.apf;
                apf.cancel_all();
                apf.state.event = Some(EventConfig {
                    area,
                    notpresent_vector: np as u8,
                    ready_vector: ready as u8,
                    send_always: flags & abi::APF_EVENT_SEND_ALWAYS != 0,
                });
                apf.queue_wake_all();
                deliver_ready(vcpu, shared)?;
                0
            }
        }
        abi::HC_APF_DISABLE => {
            let apf = &mut vcpu.apf;
            apf.state.event = None;
            apf.cancel_all();
            0
        }
        abi::HC_APF_ACK => {
            if vcpu.apf.enabled(ApfProtocol::Event) {
                vcpu.apf.stats.acks += 1;
                deliver_ready(vcpu, shared)?;
                0
            } else {
                -errno::EINVAL
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(result))
}

/// Page not present: the token in the area, then an interrupt on the
/// not-present vector.
pub(super) fn notify_not_present(
    vcpu: &mut Vcpu,
    shared: &mut Shared,
    token: u32,
) -> Result<(), VmError> {
    let slot = vcpu.apf.not_present_slot(ApfProtocol::Event);
    let vector = vcpu.apf.state.event.map_or(0, |e| e.notpresent_vector);
    set_guest_u32(vcpu, shared, slot, token)?;
    vcpu.cpu.inject_event(EventInjection {
        kind: EventKind::ExternalInterrupt,
        vector,
        error_code: None,
        instruction_len: 0,
    });
    Ok(())
}
