//! What the host side (the pager) may do to the guest's
//! mappings: KVM's MMU-notifier hooks. Nothing outside `mmu/` touches an
//! spte; the pager asks through these, each one a hold of `mmu_lock`
//! through [`super::lock`], so its cost and its hold are accounted like a
//! fault's.
//!
//! None of them flushes TLBs: the caller requests a remote TLB flush of
//! every vCPU (processed before each one's next VM entry) when sptes were
//! cleared or aged, before the frames are reused.

use super::fast_pf::protocol::{mark_access_tracked, Layout};
use super::lock::Timed;
use super::tdp::clear_spte_bits;
use super::{Mmu, MmuMode};
use crate::cost::HvCosts;
use crate::time::Cycles;
use machine::{Hfn, MemError, PhysMemory};

/// What zapping the mappings of one frame found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Zapped {
    /// sptes cleared.
    pub sptes: u64,
    /// One of them had the dirty bit: the guest wrote the page.
    pub dirty: bool,
    /// The hold's cost (acquisition, wait and the work under the lock).
    pub cycles: Cycles,
}

impl Mmu {
    /// Whether any spte mapping `frame` has its accessed bit set; clears
    /// them (KVM's `test_and_clear_young`). Returns the answer and the
    /// hold's cost.
    pub fn test_and_clear_young(
        &self,
        mem: &PhysMemory,
        costs: &HvCosts,
        frame: Hfn,
        when: Timed,
    ) -> Result<(bool, Cycles), MemError> {
        let mut inner = self.hold(when, costs);
        inner.charge(costs.spte_read);
        let mut young = false;
        if self.mode == MmuMode::Ept && !self.options.ept_ad {
            // No accessed bit: access-track the sptes instead (KVM's
            // `mmu_spte_age`); the next access faults and the fast path
            // (or the slow path) restores them. A writable one may have
            // been written: aging takes W away, so keep that in the rmap.
            let sptes = inner.rmap.get(frame).to_vec();
            for at in sptes {
                let cell = mem.atomic_u64(at)?;
                if let Some(old) = mark_access_tracked(cell, &Layout::EPT) {
                    young = true;
                    inner.rmap.note_dropped_bits(frame, old);
                    inner.charge(costs.spte_cmpxchg);
                }
            }
            return Ok((young, inner.cycles()));
        }
        let accessed = self.accessed_mask();
        for &at in inner.rmap.get(frame) {
            young |= clear_spte_bits(mem, at, accessed)? & accessed != 0;
        }
        Ok((young, inner.cycles()))
    }

    /// Clears every spte mapping `frame` (KVM's `unmap_gfn_range` for one
    /// page, as reclaim does), reporting whether the guest dirtied it.
    pub fn zap_frame(
        &self,
        mem: &PhysMemory,
        costs: &HvCosts,
        frame: Hfn,
        when: Timed,
    ) -> Result<Zapped, MemError> {
        let mut inner = self.hold(when, costs);
        let mut zapped = Zapped::default();
        let dirty = self.dirty_mask();
        for at in inner.rmap.take(frame) {
            // The lockless protocol's zap: a racing fast fix fails its
            // cmpxchg (rule 2).
            let old = super::fast_pf::protocol::zap(mem.atomic_u64(at)?);
            zapped.dirty |= old & dirty != 0;
            zapped.sptes += 1;
            inner.shadow.pages.forget_leaf(at);
            inner.charge(costs.spte_write);
        }
        // Written through an spte dropped earlier (zap-all, shadow sync).
        zapped.dirty |= inner.rmap.take_dirty(frame);
        zapped.cycles = inner.cycles();
        Ok(zapped)
    }
}
