//! The EPT-violation exit: the MMU's fault path (`mmu/fault.rs`), then,
//! if the page is still on its way in from swap, the async-PF policy
//! (`vcpu/async_pf/policy.rs`) decides how the vCPU waits.

use super::{Next, Vcpu};
use crate::devices::Platform;
use crate::error::VmError;
use crate::fault::{page_fault, ExitClock, Fault, FaultError, FaultOutcome};
use crate::mmu::fast_pf::protocol::{Access, FastFix};
use crate::shared::{CrossRequest, Shared};
use crate::time::Cycles;
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
        let root = self.root.expect("a vCPU that ran has a root");
        let write = qualification & ept_qual::WRITE != 0;
        if let Some(next) =
            self.fast_ept_violation(shared, root.eptp.pml4(), gpa, qualification, cycles)
        {
            return Ok(next);
        }
        if shared.host.slots.lookup(gpa.frame()).is_none() {
            if let Some(next) = self.emulate_mmio(shared, gpa, cycles)? {
                return Ok(next);
            }
        }
        let mut clock = ExitClock {
            now: self.clock() + *cycles,
            cycles: *cycles,
        };
        let root = root.id;
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
            } => crate::vcpu::async_pf::policy::wait_for_page(
                self, shared, gfn, swap_slot, ready_at, vectoring, cycles,
            ),
        }
    }
}

impl Vcpu {
    /// An access outside guest RAM to a device's MMIO (the IOAPIC) or the
    /// xAPIC page: the machine describes the access (`Cpu::mmio_access`)
    /// and the device answers. Anywhere else is unassigned: as on a PC, a
    /// read gives all ones and a write is dropped (counted in
    /// `unassigned_mmio`), unless the platform is strict
    /// (`--strict-mmio`), when `None` stops the VM.
    pub(super) fn emulate_mmio(
        &mut self,
        shared: &mut Shared,
        gpa: Gpa,
        cycles: &mut Cycles,
    ) -> Result<Option<Next>, VmError> {
        let xapic = self.xapic_offset(gpa.0);
        let device = Platform::is_mmio(gpa.0);
        if xapic.is_none() && !device && shared.platform.strict_mmio {
            return Ok(None);
        }
        let access = self
            .cpu
            .mmio_access()
            .ok_or_else(|| VmError::UnsupportedExit {
                vcpu: self.id,
                rip: self.rip(),
                exit: format!(
                    "MMIO access at {:#x} by an instruction other than a mov between a register or immediate and memory",
                    gpa.0
                ),
            })?;
        *cycles += Cycles(shared.host.costs.io_emulation);
        if xapic.is_some() || device {
            self.stats.mmio_accesses += 1;
        } else {
            self.stats.unassigned_mmio += 1;
        }
        let next = match access.write {
            Some(value) => {
                self.cpu.skip_instruction();
                if let Some(offset) = xapic {
                    self.xapic_write(shared, offset, value as u32)?
                } else {
                    if device {
                        shared.platform.mmio_write(gpa.0, access.size, value);
                    }
                    Next::Continue
                }
            }
            None => {
                let value = if let Some(offset) = xapic {
                    u64::from(self.xapic_read(offset))
                } else if device {
                    shared.platform.mmio_read(gpa.0, access.size)
                } else {
                    u64::MAX >> (64 - 8 * u32::from(access.size))
                };
                self.cpu.complete_mmio_read(value);
                Next::Continue
            }
        };
        self.deliver_device_interrupts(shared);
        Ok(Some(next))
    }

    /// The fast page fault (`mmu/fast_pf`): `Some` if it handled the
    /// violation (fixed the spte, or found it already fixed), with no
    /// `mmu_lock` and no memslot lookup; `None`: take the slow path.
    fn fast_ept_violation(
        &mut self,
        shared: &mut Shared,
        pml4: machine::Hpa,
        gpa: Gpa,
        qualification: u64,
        cycles: &mut Cycles,
    ) -> Option<Next> {
        let access = Access {
            write: qualification & ept_qual::WRITE != 0,
            fetch: qualification & ept_qual::FETCH != 0,
        };
        let present =
            qualification & (ept_qual::READABLE | ept_qual::WRITABLE | ept_qual::EXECUTABLE) != 0;
        let host = &shared.host;
        let fast = host.mmu.fast_page_fault_ept(
            &host.mem,
            &host.costs,
            pml4,
            gpa.frame(),
            access,
            present,
        )?;
        *cycles += fast.cycles;
        match fast.outcome {
            FastFix::Fixed { dirtied, .. } => {
                if dirtied {
                    // Logged before the vCPU re-enters (rule 3 in
                    // `mmu/fast_pf/protocol.rs`); KVM's fast path marks
                    // through the memslot its fault looked up, so the
                    // lookup is charged here, and the bitmap's bit when
                    // the slot logs.
                    *cycles += Cycles(host.costs.memslot_lookup);
                    if host.mark_page_dirty(fast.gfn) {
                        *cycles += Cycles(host.costs.dirty_bit_set);
                    }
                }
                self.stats.fast_pf_fixed += 1;
            }
            FastFix::Spurious => self.stats.fast_pf_spurious += 1,
            FastFix::Slow(_) => {
                self.stats.fast_pf_slow += 1;
                return None;
            }
        }
        Some(Next::Continue)
    }

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
