//! The EPT-violation exit: the MMU's fault path (`mmu/fault.rs`), then,
//! if the page is still on its way in from swap, the async-PF policy
//! (`vcpu/async_pf/policy.rs`) decides how the vCPU waits.

use super::{Next, Vcpu};
use crate::error::VmError;
use crate::fault::{page_fault, ExitClock, Fault, FaultError, FaultOutcome};
use crate::mmu::fast_pf::protocol::{Access, FastFix};
use crate::shared::{CrossRequest, Shared};
use crate::time::Cycles;
use machine::cpu::MmioEmulation;
use machine::vmx::ept_qual;
use machine::{Gpa, VmExit};

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
            exit: self.clock(),
            now: self.clock() + *cycles,
            cycles: *cycles,
            floor: self.retry_at.unwrap_or(Cycles::ZERO),
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
        self.stats.mmu_lock_wait_cycles += fault.lock_wait.0;
        self.stats.note_zap_stall(fault.zap_wait);
        match fault.outcome {
            // Counted when the replay ends it.
            FaultOutcome::LockBusy { wait } => return Ok(Next::LockBusy { wait }),
            FaultOutcome::NotYet { at } => return Ok(Next::NotYet { at }),
            _ => {}
        }
        self.stats.ept_faults += 1;
        match fault.outcome {
            FaultOutcome::Mapped | FaultOutcome::LockBusy { .. } | FaultOutcome::NotYet { .. } => {
                Ok(Next::Continue)
            }
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
        let device = shared.platform.is_mmio(gpa.0);
        if xapic.is_none() && !device && shared.platform.strict_mmio {
            return Ok(None);
        }
        let Some(access) = self.cpu.mmio_access() else {
            return self.emulate_mmio_instruction(shared, gpa, cycles).map(Some);
        };
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

    /// MMIO by any instruction but the plain `mov`s: the machine runs the
    /// whole instruction (`Cpu::emulate_mmio`) and asks for each read of
    /// the MMIO page as it comes; its stores are applied afterwards, in
    /// order. A RAM page the instruction also touches and that is not
    /// mapped yet is faulted in first (the emulation starts over, with
    /// the reads already made). Under shadow paging such a page is a #PF
    /// exit: the guest's walk tells RAM (the shadow fault path maps it, or
    /// injects the guest's own #PF, and the instruction has not happened)
    /// from another linear page of MMIO (given to the next attempt,
    /// `Cpu::emulate_mmio_paged`: a cross-page access through two linear
    /// pages of the same MMIO page).
    fn emulate_mmio_instruction(
        &mut self,
        shared: &mut Shared,
        gpa: Gpa,
        cycles: &mut Cycles,
    ) -> Result<Next, VmError> {
        let mut reads = Vec::new();
        let mut linear: Vec<(u64, u64)> = Vec::new();
        // Each round makes one more device read or maps one more page; an
        // instruction needs a few (a REP MOVS, one per element).
        for _ in 0..4096 {
            *cycles += Cycles(shared.host.costs.io_emulation);
            match self
                .cpu
                .emulate_mmio_paged(&shared.host.mem, gpa, &reads, &linear)
            {
                MmioEmulation::NeedRead { gpa: at, size } => {
                    reads.push(self.mmio_device_read(shared, at.0, size));
                }
                MmioEmulation::Exit(VmExit::EptViolation {
                    gpa: other,
                    qualification,
                    ..
                }) if other.frame() != gpa.frame()
                    && shared.host.slots.lookup(other.frame()).is_some() =>
                {
                    match self.ept_violation(shared, other, qualification, false, cycles)? {
                        Next::Continue => {}
                        // Swapped out: wait for it, then the instruction
                        // exits again and starts over.
                        next => return Ok(next),
                    }
                }
                MmioEmulation::Exit(VmExit::Exception {
                    vector: 14,
                    error_code,
                    qualification,
                }) if self.mmu_mode == crate::MmuMode::Shadow => {
                    let gva = machine::Gva(qualification);
                    let error_code = error_code.unwrap_or(0);
                    let state = self.cpu.state();
                    let access = crate::mmu::walk::Access::from_error_code(
                        error_code,
                        state.cpl(),
                        state.rflags & machine::cpu::state::rflags::AC != 0,
                    );
                    let page = qualification & !0xfff;
                    match self.shadow_fault(shared, gva, access, true, cycles)? {
                        super::shadow::ShadowFault::Mmio { gpa: other }
                            if !linear.iter().any(|p| p.0 == page) =>
                        {
                            linear.push((page, other.0 & !0xfff));
                        }
                        super::shadow::ShadowFault::Mmio { .. } => {
                            return Err(VmError::UnsupportedExit {
                                vcpu: self.id,
                                rip: self.rip(),
                                exit: format!(
                                    "MMIO access at {:#x}: linear page {page:#x} faulted again",
                                    gpa.0
                                ),
                            })
                        }
                        _ => {
                            // RAM (mapped now, or on its way in) or the
                            // guest's own fault: as the #PF exit's path
                            // takes it.
                            let injected = self.cpu.pending_injection();
                            let next =
                                self.shadow_page_fault(shared, gva, error_code, false, cycles)?;
                            if !matches!(next, Next::Continue)
                                || self.cpu.pending_injection() != injected
                            {
                                return Ok(next);
                            }
                        }
                    }
                }
                MmioEmulation::Exit(exit) => {
                    return Err(VmError::UnsupportedExit {
                        vcpu: self.id,
                        rip: self.rip(),
                        exit: format!(
                            "MMIO access at {:#x} by an instruction that also needs {exit:?}",
                            gpa.0
                        ),
                    })
                }
                MmioEmulation::Done { writes, exit } => {
                    let mut next = Next::Continue;
                    for w in writes {
                        if let Some(n) = self.mmio_device_write(shared, w.gpa.0, w.size, w.value)? {
                            next = n;
                        }
                    }
                    self.deliver_device_interrupts(shared);
                    return match exit {
                        None | Some(VmExit::MonitorTrap) => Ok(next),
                        Some(exit) => Err(VmError::UnsupportedExit {
                            vcpu: self.id,
                            rip: self.rip(),
                            exit: format!("{exit:?} after an emulated MMIO instruction"),
                        }),
                    };
                }
            }
        }
        Err(VmError::UnsupportedExit {
            vcpu: self.id,
            rip: self.rip(),
            exit: format!("MMIO access at {:#x}: emulation did not finish", gpa.0),
        })
    }

    /// A device read for [`Vcpu::emulate_mmio_instruction`]: the xAPIC
    /// page, a device, or unassigned (all ones), counted.
    fn mmio_device_read(&mut self, shared: &mut Shared, gpa: u64, size: u8) -> u64 {
        if let Some(offset) = self.xapic_offset(gpa) {
            self.stats.mmio_accesses += 1;
            u64::from(self.xapic_read(offset))
        } else if shared.platform.is_mmio(gpa) {
            self.stats.mmio_accesses += 1;
            shared.platform.mmio_read(gpa, size)
        } else {
            self.stats.unassigned_mmio += 1;
            u64::MAX >> (64 - 8 * u32::from(size))
        }
    }

    /// A device write for [`Vcpu::emulate_mmio_instruction`] (dropped when
    /// unassigned); `Some` when the xAPIC asks for more than continuing.
    fn mmio_device_write(
        &mut self,
        shared: &mut Shared,
        gpa: u64,
        size: u8,
        value: u64,
    ) -> Result<Option<Next>, VmError> {
        if let Some(offset) = self.xapic_offset(gpa) {
            self.stats.mmio_accesses += 1;
            return match self.xapic_write(shared, offset, value as u32)? {
                Next::Continue => Ok(None),
                next => Ok(Some(next)),
            };
        }
        if shared.platform.is_mmio(gpa) {
            self.stats.mmio_accesses += 1;
            shared.platform.mmio_write(gpa, size, value);
        } else {
            self.stats.unassigned_mmio += 1;
        }
        Ok(None)
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
