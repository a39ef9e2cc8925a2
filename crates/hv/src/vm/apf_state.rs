//! Saving and restoring a vCPU's guest-visible APF state (for migration).

use super::Vm;
use crate::apf::{en_area, int_msr_valid, EN_REFUSED};
use crate::apf::{ApfState, AREA_ALIGN};
use crate::error::ApfStateError;
use crate::vcpu::RunState;
use machine::Gpa;

impl Vm {
    /// The guest-visible APF state of vCPU `index` (to save for migration).
    pub fn apf_state(&self, index: usize) -> Option<ApfState> {
        self.vcpus.get(index).map(|v| v.apf.state)
    }

    /// Restores vCPU `index`'s APF state (after migration). Outstanding
    /// faults are host I/O and do not move: every guest waiter is woken
    /// instead, and retries its access.
    pub fn set_apf_state(&mut self, index: usize, state: &ApfState) -> Result<(), ApfStateError> {
        self.restore_apf_state(index, state, true)
    }

    /// [`Vm::set_apf_state`], with the wake-all only if `wake_all`: a
    /// snapshot restore wakes the guest's waiters only when some vCPU had
    /// faults outstanding (KVM wakes them at every enable, which a guest
    /// with no waiter sees as a spurious broadcast).
    pub(crate) fn restore_apf_state(
        &mut self,
        index: usize,
        state: &ApfState,
        wake_all: bool,
    ) -> Result<(), ApfStateError> {
        if index >= self.vcpus.len() {
            return Err(ApfStateError::NoSuchVcpu(index));
        }
        let config = self.shared.apf;
        let x86 = state.msr_en & abi::KVM_ASYNC_PF_ENABLED != 0;
        if x86 && !config.x86_offered() {
            return Err(ApfStateError::WrongProtocol {
                wanted: "x86",
                running: config.describe(),
            });
        }
        if state.event.is_some() && !config.event_offered() {
            return Err(ApfStateError::WrongProtocol {
                wanted: "event",
                running: config.describe(),
            });
        }
        if state.msr_en & EN_REFUSED != 0 || !int_msr_valid(state.msr_int) {
            return Err(ApfStateError::Invalid(format!(
                "MSR values {:#x}/{:#x} have reserved bits set",
                state.msr_en, state.msr_int
            )));
        }
        let area = match state.event {
            Some(e) => Some(e.area),
            None if x86 => Some(en_area(state.msr_en).0),
            None => None,
        };
        if let Some(area) = area {
            if area % AREA_ALIGN != 0 || self.shared.host.slots.lookup(Gpa(area).frame()).is_none()
            {
                return Err(ApfStateError::Invalid(format!(
                    "area {area:#x} is not 64-byte aligned guest memory"
                )));
            }
        }
        let apf = &mut self.vcpus[index].apf;
        apf.cancel_all();
        apf.state = *state;
        if wake_all && apf.enabled(config.protocol) {
            apf.queue_wake_all();
        }
        // A vCPU halted on a fault that no longer exists retries instead.
        if self.vcpus[index].run == RunState::ApfHalted {
            self.sched.set_runnable(&mut self.vcpus[index]);
        }
        Ok(())
    }
}
