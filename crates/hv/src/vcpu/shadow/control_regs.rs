//! The control registers under shadow paging: the host-owned bits of
//! CR0/CR4, EFER, CR3 loads and stores, INVLPG.

use super::*;

impl Vcpu {
    pub(super) fn guest_cr0(&self) -> u64 {
        let v = self.cpu.vmx().expect("guest mode");
        (self.cpu.state().cr0 & !v.cr0_guest_host_mask)
            | (v.cr0_read_shadow & v.cr0_guest_host_mask)
    }

    pub(super) fn guest_cr4(&self) -> u64 {
        let v = self.cpu.vmx().expect("guest mode");
        (self.cpu.state().cr4 & !v.cr4_guest_host_mask)
            | (v.cr4_read_shadow & v.cr4_guest_host_mask)
    }

    /// EFER as the guest set it: the machine runs with NXE always on
    /// under shadow paging (as KVM forces EFER.NX without EPT), so a
    /// fetch fault's error code always says it was a fetch.
    pub(super) fn guest_efer(&self) -> u64 {
        let efer = self.cpu.state().efer & !efer::NXE;
        if self.shadow.guest_nxe_off {
            efer
        } else {
            efer | efer::NXE
        }
    }

    /// RDMSR of EFER: the guest's own NXE.
    pub(in crate::vcpu) fn shadow_read_efer(&mut self) {
        let value = self.guest_efer();
        self.cpu.complete_rdmsr(value);
    }

    /// WRMSR of EFER: checked and applied with NXE forced on; the guest's
    /// NXE is kept aside and is part of the shadow's paging context.
    pub(in crate::vcpu) fn shadow_write_efer(
        &mut self,
        shared: &mut Shared,
        value: u64,
        cycles: &mut Cycles,
    ) -> Result<(), VmError> {
        let before = self.paging_context();
        // LME may change only while the guest's paging is off (the
        // machine's own CR0.PG is always set under shadow paging).
        let guest_paging = self.guest_cr0() & cr0::PG != 0;
        if crate::vcpu::msr::write_efer(&mut self.cpu, value | efer::NXE, guest_paging) {
            self.shadow.guest_nxe_off = value & efer::NXE == 0;
            self.cpu.skip_instruction();
        } else {
            self.cpu.inject_event(crate::vcpu::msr::gp_fault());
        }
        self.paging_changed(shared, before, cycles)
    }

    /// The machine's SMEP and SMAP: the guest's while its paging is on;
    /// clear while it is off, where they mean nothing but the machine's
    /// CR0.PG is still set (KVM clears them in the hardware CR4 when the
    /// guest is not paging, `vmx_set_cr4`).
    pub(super) fn apply_paging_cr4_bits(&mut self) {
        let hw = cr4::SMEP | cr4::SMAP;
        let guest = if self.guest_cr0() & cr0::PG != 0 {
            self.guest_cr4() & hw
        } else {
            0
        };
        let s = self.cpu.state_mut();
        s.cr4 = (s.cr4 & !hw) | guest;
    }

    /// MOV to/from CR0, CR3, CR4 under shadow paging.
    pub(in crate::vcpu) fn shadow_cr_access(
        &mut self,
        shared: &mut Shared,
        access: CrAccess,
        cycles: &mut Cycles,
    ) -> Result<Next, VmError> {
        match access {
            CrAccess::MovFrom { cr: 3, gpr } => {
                let cr3 = self.shadow.guest_cr3;
                self.cpu.state_mut().gpr[gpr as usize] = cr3;
            }
            CrAccess::MovTo { cr: 3, value, .. } => {
                // The root load asks for `mmu_lock` now: past the order
                // bound, nothing is done yet and the load is replayed.
                let at = self.clock() + *cycles;
                if shared.host.not_yet(at) {
                    return Ok(Next::NotYet { at });
                }
                let value = self.cr3_cache_guest_value(shared, value);
                if value >> machine::mmu::paging::MAX_PHYS_ADDR_BITS != 0 {
                    self.cpu.inject_event(gp());
                    return Ok(Next::Continue);
                }
                self.shadow.guest_cr3 = value;
                *cycles += self.load_shadow_root(shared, true, Timed::At(at))?.0;
                // Every page is in sync now: the root may be cached (not
                // the paging-off root, which no CR3 value names).
                if self.paging_context().paging {
                    *cycles += self.cr3_cache_add(shared);
                }
            }
            CrAccess::MovTo { cr: 0, value, .. } => {
                let v = self.cpu.vmx().expect("guest mode");
                let mask = v.cr0_guest_host_mask;
                let was_paging = self.guest_cr0() & cr0::PG != 0;
                let paging = value & cr0::PG != 0;
                let state = self.cpu.state();
                if value >> 32 != 0
                    || (paging && value & cr0::PE == 0)
                    || (value & cr0::NW != 0 && value & cr0::CD == 0)
                    // Only IA-32e paging is modelled (as the machine
                    // does): turning paging on needs EFER.LME and
                    // CR4.PAE; leaving IA-32e mode only from
                    // compatibility mode.
                    || (paging
                        && !was_paging
                        && (state.efer & efer::LME == 0 || self.guest_cr4() & cr4::PAE == 0))
                    || (!paging && was_paging && state.in_64bit_mode())
                {
                    self.cpu.inject_event(gp());
                    return Ok(Next::Continue);
                }
                let before = self.paging_context();
                let s = self.cpu.state_mut();
                s.cr0 = ((value & cr0::DEFINED) & !mask) | (s.cr0 & mask) | cr0::ET;
                // The machine's CR0.PG stays set (the shadow root
                // translates, gva = gpa while the guest's paging is off),
                // so IA-32e mode follows the guest's PG here.
                if paging && !was_paging {
                    s.efer |= efer::LMA;
                } else if !paging && was_paging {
                    s.efer &= !efer::LMA;
                }
                if let Some(v) = self.cpu.vmx_mut() {
                    v.cr0_read_shadow = value & mask;
                }
                self.apply_paging_cr4_bits();
                self.paging_changed(shared, before, cycles)?;
            }
            CrAccess::MovTo { cr: 4, value, .. } => {
                let v = self.cpu.vmx().expect("guest mode");
                let mask = v.cr4_guest_host_mask;
                // PAE may be clear only while the guest's paging is off
                // (IA-32e paging is the only paging modelled).
                let paging = self.guest_cr0() & cr0::PG != 0;
                // No PCIDs under shadow paging (`shadow_controls`).
                let supported = cr4::SUPPORTED & !cr4::PCIDE;
                if value & !supported != 0 || (paging && value & cr4::PAE == 0) {
                    self.cpu.inject_event(gp());
                    return Ok(Next::Continue);
                }
                let before = self.paging_context();
                let s = self.cpu.state_mut();
                s.cr4 = (value & !mask) | (s.cr4 & mask);
                if let Some(v) = self.cpu.vmx_mut() {
                    v.cr4_read_shadow = value & mask;
                }
                self.apply_paging_cr4_bits();
                self.paging_changed(shared, before, cycles)?;
            }
            other => {
                return Err(VmError::UnsupportedExit {
                    vcpu: self.id,
                    rip: self.rip(),
                    exit: format!("{other:?}"),
                })
            }
        }
        self.cpu.skip_instruction();
        Ok(Next::Continue)
    }

    /// After a write to CR0, CR4 or EFER: the root for the (maybe new)
    /// paging context, unsync pages synced, this vCPU's TLB flushed.
    pub(in crate::vcpu) fn paging_changed(
        &mut self,
        shared: &mut Shared,
        before: PagingContext,
        cycles: &mut Cycles,
    ) -> Result<(), VmError> {
        // A new context needs its own root; the same one is still a TLB
        // flush for the guest (a CR4.PGE toggle flushes everything), which
        // under shadow paging means syncing unsync pages (KVM's
        // KVM_REQ_TLB_FLUSH_GUEST): loading the root does both.
        if self.paging_context() != before {
            // Cached roots were made for the old context.
            self.drop_cr3_cache(shared);
        }
        let at = Timed::At(self.clock() + *cycles);
        *cycles += self.load_shadow_root(shared, true, at)?.0;
        Ok(())
    }

    /// INVLPG: an unsync leaf table behind the address is synced; the
    /// address leaves this vCPU's TLB.
    pub(in crate::vcpu) fn shadow_invlpg(
        &mut self,
        shared: &mut Shared,
        gva: Gva,
        cycles: &mut Cycles,
    ) -> Result<Next, VmError> {
        if let Some(root) = self.root {
            let host = &mut shared.host;
            let held = host
                .with_shadow(Timed::At(self.clock() + *cycles), |t, stats, fx| {
                    if let Some(page) = crate::mmu::shadow::leaf_table(t, root.id, gva, fx)? {
                        if t.pages.get(page).is_some_and(|p| p.unsync) {
                            let s = sync::sync_page(t, stats, page)?;
                            fx.merge(s);
                        }
                    }
                    Ok(())
                })
                .map_err(|e| self.shadow_error(e))?;
            *cycles += held.cycles;
            shared.queue_mmu_effects(held.flush, held.reload);
        }
        self.cpu.invvpid(InvvpidKind::IndividualAddress {
            vpid: self.vpid(),
            gva,
        });
        self.cpu.skip_instruction();
        Ok(Next::Continue)
    }
}
