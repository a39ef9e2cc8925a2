//! The vCPU's side of page-modification logging (dirty-log mode `pml`):
//! its log page, turning the CPU's logging on and off, and draining the
//! log into the slots' dirty bitmaps (KVM's `vmx_flush_pml_buffer`).
//!
//! KVM drains at the start of every exit's handling (`__vmx_handle_exit`),
//! so the bitmap is fresh whenever the vCPU is outside the guest; the
//! PML-full exit (reason 62) then has nothing left to do but re-enter,
//! and the instruction that found the log full runs again. The hv does
//! the same at every exit it charges, and the VMM's collection drains
//! every vCPU (KVM kicks them out of the guest to drain; here they are
//! already out between `run_until` slices).

use super::Vcpu;
use crate::host::Host;
use crate::mmu::dirty_log::{drain_pml, DirtyLogError};
use crate::time::Cycles;
use machine::vmx::PML_HEAD_INDEX;
use machine::MemError;

impl Vcpu {
    /// Turns page-modification logging on (allocating the vCPU's 4 KiB
    /// log page the first time, as KVM does at vCPU creation) with an
    /// empty log, or off (the log's entries are dropped; the page is
    /// kept for the next time).
    pub(crate) fn set_pml(&mut self, host: &mut Host, on: bool) -> Result<(), DirtyLogError> {
        let page = match (on, self.pml_page) {
            (true, Some(page)) => Some(page),
            (true, None) => {
                let page = host.frames.alloc()?;
                self.pml_page = Some(page);
                Some(page)
            }
            (false, _) => None,
        };
        if let Some(controls) = self.cpu.vmx_mut() {
            controls.pml_address = page.map(|p| p.addr());
            controls.pml_index = PML_HEAD_INDEX;
        }
        Ok(())
    }

    /// Turns page-modification logging off; the log's entries are
    /// dropped, its page kept.
    pub(crate) fn pml_off(&mut self) {
        if let Some(controls) = self.cpu.vmx_mut() {
            controls.pml_address = None;
            controls.pml_index = PML_HEAD_INDEX;
        }
    }

    /// Moves the entries of the vCPU's page-modification log into the
    /// bitmaps of the slots logging in PML mode and resets the PML index;
    /// returns the work's cost: per entry one read of it (priced as an
    /// spte read, an 8-byte load) and one dirty mark (a memslot lookup,
    /// as the fast page fault's mark is priced). Nothing when PML is off
    /// or the log is empty.
    pub(crate) fn drain_pml(&mut self, host: &Host) -> Result<Cycles, MemError> {
        let Some(controls) = self.cpu.vmx_mut() else {
            return Ok(Cycles::ZERO);
        };
        let (Some(log), index) = (controls.pml_address, controls.pml_index) else {
            return Ok(Cycles::ZERO);
        };
        if index == PML_HEAD_INDEX {
            return Ok(Cycles::ZERO);
        }
        controls.pml_index = PML_HEAD_INDEX;
        let drain = drain_pml(&host.mem, &host.slots, log, index)?;
        self.stats.pml_entries_drained += drain.entries;
        Ok(Cycles(
            drain.entries * (host.costs.spte_read + host.costs.memslot_lookup),
        ))
    }
}
