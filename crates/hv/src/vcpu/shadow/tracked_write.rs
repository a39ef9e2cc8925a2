//! A guest write to a write-tracked guest page table: emulated, or let
//! through for one instruction under the monitor trap flag and then
//! synced (KVM's `kvm_mmu_pte_write` and unsync handling).

use super::*;

impl Vcpu {
    /// A write to a write-tracked guest table: after a flood of them the
    /// table is unprotected; otherwise the one instruction runs with the
    /// spte writable under the monitor trap flag and the shadow hears of
    /// what it changed at the next exit.
    pub(super) fn emulate_tracked_write(
        &mut self,
        shared: &mut Shared,
        gfn: machine::Gfn,
        gva: Gva,
        leaf: machine::Hpa,
        frame: machine::Hfn,
        cycles: &mut Cycles,
    ) -> Result<(), VmError> {
        let costs = shared.host.costs;
        if shared.host.mmu.shadow_note_write(&costs, gfn, FLOOD_WRITES) {
            let host = &mut shared.host;
            let held = host
                .with_shadow(Timed::At(self.clock() + *cycles), |t, stats, _| {
                    sync::unprotect(t, stats, gfn)
                })
                .map_err(|e| self.shadow_error(e))?;
            *cycles += held.cycles
                + Cycles(held.value.reads * costs.spte_read + held.value.writes * costs.spte_write);
            shared.cross.push(CrossRequest::FlushAll);
            if held.value.reload {
                shared.cross.push(CrossRequest::ReloadRoots);
            }
            return Ok(());
        }
        // The write goes through at the next entry (`begin_tracked_write`).
        *cycles += Cycles(costs.copy_4k + costs.spte_write);
        let _ = frame;
        shared.host.mmu.shadow_count(&costs, |s| s.wp_emulated += 1);
        self.shadow.pending_write = Some(crate::mmu::shadow::cache::PendingWrite {
            gfn,
            gva,
            leaf,
            before: Box::new([0u8; 4096]),
        });
        Ok(())
    }

    /// Just before entry: lets a pending tracked write through for one
    /// instruction (the spte writable, the monitor trap flag set, the
    /// table's contents kept to compare). The window is exactly that
    /// instruction: no other vCPU runs in it, and this vCPU's TLB drops
    /// the address before and after. If the leaf changed since the fault
    /// (zapped, evicted), the write is dropped and the access faults again.
    pub(in crate::vcpu) fn begin_tracked_write(
        &mut self,
        shared: &mut Shared,
    ) -> Result<(), VmError> {
        let Some(pending) = self.shadow.pending_write.as_mut() else {
            return Ok(());
        };
        let mem = &shared.host.mem;
        let frame = shared
            .host
            .slots
            .lookup(pending.gfn)
            .and_then(|s| s.backing(pending.gfn));
        let leaf = mem.read_u64(pending.leaf).unwrap_or(0);
        let Some(frame) = frame.filter(|f| {
            crate::mmu::shadow::spte::is_present(leaf)
                && crate::mmu::shadow::spte::frame(leaf) == *f
        }) else {
            self.shadow.pending_write = None;
            return Ok(());
        };
        let (leaf, gva, gfn) = (pending.leaf, pending.gva, pending.gfn);
        // The guest's one write goes through a leaf made writable here, not
        // by a logged fault: log it (a collection may have run since the
        // fault logged it).
        shared.host.mark_page_dirty(gfn);
        mem.read_bytes(frame.addr(), &mut pending.before[..])
            .and_then(|()| crate::mmu::shadow::set_step_writable(mem, leaf, true))
            .map_err(|e| self.shadow_error(ShadowError::Memory(e)))?;
        self.cpu.invvpid(InvvpidKind::IndividualAddress {
            vpid: self.vpid(),
            gva,
        });
        if let Some(v) = self.cpu.vmx_mut() {
            v.monitor_trap_flag = true;
        }
        Ok(())
    }

    /// Ends a write let through under the monitor trap flag: the spte is
    /// read-only again and every entry the guest changed is zapped in each
    /// shadow page of the table.
    pub(in crate::vcpu) fn finish_tracked_write(
        &mut self,
        shared: &mut Shared,
        cycles: &mut Cycles,
    ) -> Result<(), VmError> {
        let Some(pending) = self.shadow.pending_write.take() else {
            return Ok(());
        };
        if let Some(v) = self.cpu.vmx_mut() {
            v.monitor_trap_flag = false;
        }
        let costs = shared.host.costs;
        let mem = &shared.host.mem;
        crate::mmu::shadow::set_step_writable(mem, pending.leaf, false)
            .map_err(|e| self.shadow_error(ShadowError::Memory(e)))?;
        self.cpu.invvpid(InvvpidKind::IndividualAddress {
            vpid: self.vpid(),
            gva: pending.gva,
        });
        let Some(frame) = shared
            .host
            .slots
            .lookup(pending.gfn)
            .and_then(|s| s.backing(pending.gfn))
        else {
            return Ok(());
        };
        let mut after = [0u8; 4096];
        mem.read_bytes(frame.addr(), &mut after)
            .map_err(|e| self.shadow_error(ShadowError::Memory(e)))?;
        let changed: Vec<u64> = (0..512u64)
            .filter(|&i| {
                let r = i as usize * 8..i as usize * 8 + 8;
                pending.before[r.clone()] != after[r]
            })
            .collect();
        *cycles += Cycles(costs.copy_4k);
        if changed.is_empty() {
            return Ok(());
        }
        let host = &mut shared.host;
        let held = host
            .with_shadow(Timed::At(self.clock() + *cycles), |t, _, fx| {
                let z = sync::track_write(t, pending.gfn, &changed)?;
                fx.merge(z);
                Ok(())
            })
            .map_err(|e| self.shadow_error(e))?;
        *cycles += held.cycles;
        shared.queue_mmu_effects(held.flush, held.reload);
        Ok(())
    }
}
