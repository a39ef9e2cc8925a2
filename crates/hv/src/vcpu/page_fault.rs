//! The EPT-violation exit: the MMU's fault path (`mmu/fault.rs`), then,
//! if the page is still on its way in from swap, the async-PF policy
//! (`apf/policy.rs`) decides how the vCPU waits.

use super::{Next, Vcpu};
use crate::error::VmError;
use crate::mmu::fault::{page_fault, ExitClock, Fault, FaultError, FaultOutcome};
use crate::time::Cycles;
use crate::vm::shared::{CrossRequest, Shared};
use machine::vmx::ept_qual;
use machine::Gpa;

impl Vcpu {
    pub(super) fn ept_violation(
        &mut self,
        shared: &mut Shared,
        gpa: Gpa,
        qualification: u64,
        vectoring: bool,
        cycles: &mut Cycles,
    ) -> Result<Next, VmError> {
        let mut clock = ExitClock {
            now: self.clock() + *cycles,
            cycles: *cycles,
        };
        let root = self.root.map(|r| r.id).expect("a vCPU that ran has a root");
        let write = qualification & ept_qual::WRITE != 0;
        let result = page_fault(
            &mut shared.host,
            &mut shared.pager,
            root,
            gpa,
            write,
            &mut clock,
        );
        *cycles = clock.cycles;
        let fault = result.map_err(|source| self.fault_error(gpa, source))?;
        self.note_fault(shared, &fault);
        self.stats.ept_faults += 1;
        self.stats.mmu_lock_wait_cycles += fault.lock_wait.0;
        self.stats.note_zap_stall(fault.zap_wait);
        match fault.outcome {
            FaultOutcome::Mapped => Ok(Next::Continue),
            FaultOutcome::WaitForPage {
                gfn,
                swap_slot,
                ready_at,
            } => crate::apf::policy::wait_for_page(
                self, shared, gfn, swap_slot, ready_at, vectoring, cycles,
            ),
        }
    }
}

impl Vcpu {
    /// The VM error for a fault at `gpa` the hv could not resolve (both
    /// MMUs).
    pub(super) fn fault_error(&self, gpa: Gpa, source: FaultError) -> VmError {
        let (vcpu, rip) = (self.id, self.rip());
        match source {
            FaultError::OutsideMemory { gpa } => VmError::OutsideMemory { vcpu, gpa, rip },
            FaultError::Pager { gpa, source } => VmError::Pager {
                vcpu,
                gpa,
                rip,
                source,
            },
            FaultError::PageInVanished { gpa } => VmError::UnsupportedExit {
                vcpu,
                rip,
                exit: format!("page-in of gpa {gpa:#x} vanished (an hv bug)"),
            },
            source => VmError::EptFault {
                vcpu,
                gpa,
                rip,
                source,
            },
        }
    }

    /// What every resolved fault leaves behind (both MMUs): the remote
    /// flush it needs and its counters.
    pub(super) fn note_fault(&mut self, shared: &mut Shared, fault: &Fault) {
        if fault.flush {
            shared.cross.push(CrossRequest::FlushAll);
        }
        if fault.frame_allocated {
            self.stats.frames_allocated += 1;
        }
        if fault.repeat {
            self.apf.stats.repeat_faults += 1;
        }
    }
}
