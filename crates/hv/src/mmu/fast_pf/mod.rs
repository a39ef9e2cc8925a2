//! The fast page fault (seed 001): a fault on a present spte whose fix
//! only restores an access bit (W on an MMU-writable spte, or R/X taken
//! by access tracking) is fixed by compare-and-exchange on the spte,
//! without `mmu_lock` and before any memslot lookup or host page-table
//! work (KVM's `fast_page_fault`).
//!
//! - [`protocol`]: the spte state machine over an atomic cell, shared by
//!   the hv, the loom model (`model`) and the host-thread stress test
//!   (`stress`);
//! - here: the lockless walk to the leaf and what the fast path costs.
//!
//! The walk reads the tables of the root the vCPU entered with without
//! the lock: tables are freed only under `mmu_lock` after every vCPU left
//! the root (KVM protects the walk with RCU; here vCPUs interleave on one
//! host thread, so no table is freed while a fault is being handled).

// `write_protect` is dirty logging's, `zap` the zap paths' to call.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod protocol;

#[cfg(test)]
mod model;
#[cfg(test)]
mod stress;

use super::{tdp, Mmu, MmuMode};
use crate::cost::HvCosts;
use crate::time::Cycles;
use machine::{Gfn, Gva, Hpa, PhysMemory};
use protocol::{Access, FastFix, Layout};

/// The MMU's switches for side-by-side runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmuOptions {
    /// Fix faults on present sptes locklessly (`--fast-pf`).
    pub fast_pf: bool,
    /// EPT accessed/dirty flags (`--ept-ad`); off, the pager's aging works
    /// by access tracking (`protocol::mark_access_tracked`) and a page's
    /// writable spte stands for its dirty bit.
    pub ept_ad: bool,
    /// Under shadow paging, fix write faults on leaves of *indirect*
    /// shadow pages too, with the seed's own scheme (the vCPU's id in the
    /// spte, the per-gfn write-protect flag and barrier on the page
    /// tracker's write-protect path: `protocol::seed_fast_fix` /
    /// `seed_write_protect`; `--fast-pf-indirect seed`). Off (`slow`),
    /// indirect leaves take the slow path, as in modern KVM.
    pub seed_indirect: bool,
}

impl Default for MmuOptions {
    fn default() -> Self {
        MmuOptions {
            fast_pf: true,
            ept_ad: true,
            seed_indirect: false,
        }
    }
}

/// What the fast path did with one EPT violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FastFault {
    pub gfn: Gfn,
    pub outcome: FastFix,
    /// The lockless walk and the exchange; no lock, no memslot lookup.
    pub cycles: Cycles,
}

impl Mmu {
    /// Tries the fast path on an EPT violation at `gfn` in the root whose
    /// PML4 is `pml4`. `entry_present`: the violation's qualification
    /// says the leaf allowed some access (with A/D off an access-tracked
    /// leaf allows none, so every violation is a candidate, as KVM's
    /// `page_fault_can_be_fast`). `None`: not tried.
    pub fn fast_page_fault_ept(
        &self,
        mem: &PhysMemory,
        costs: &HvCosts,
        pml4: Hpa,
        gfn: Gfn,
        access: Access,
        entry_present: bool,
    ) -> Option<FastFault> {
        if !self.options.fast_pf || self.mode != MmuMode::Ept {
            return None;
        }
        if !entry_present && self.options.ept_ad {
            return None;
        }
        // The walk to the leaf without `mmu_lock` (KVM's
        // `walk_shadow_page_lockless`).
        let mut reads = 0;
        let leaf = tdp::find_leaf_counting(mem, pml4.frame(), gfn, &mut reads);
        let mut cycles = Cycles(reads * costs.spte_read);
        let outcome = match leaf.ok().flatten().and_then(|at| mem.atomic_u64(at).ok()) {
            None => FastFix::Slow(protocol::SlowReason::NotPresent),
            Some(cell) => {
                cycles += Cycles(costs.spte_read);
                let outcome = protocol::fast_fix(cell, &Layout::EPT, access);
                if let FastFix::Fixed { .. } = outcome {
                    cycles += Cycles(costs.spte_cmpxchg);
                }
                outcome
            }
        };
        Some(FastFault {
            gfn,
            outcome,
            cycles,
        })
    }
}

impl Mmu {
    /// Tries the fast path on a shadow #PF at `gva` that the error code
    /// says was a write to a present page (P = 1, W = 1, not reserved, not
    /// a fetch), in the shadow root whose PML4 is `pml4`; `user`: the
    /// access was a user-mode one. `None`: not tried (fast PF off, or not
    /// shadow paging).
    ///
    /// As modern KVM, only leaves of **direct** shadow pages are fixed
    /// here (this MMU's direct pages map a guest 2 MiB / 1 GiB page in
    /// 4 KiB sptes): their gfn is fixed by the leaf's position (the page's
    /// first gfn plus the index), so the gfn the fix marks dirty is the
    /// one the spte maps, whatever the guest does to its tables meanwhile.
    /// A leaf of an indirect page takes the slow path
    /// ([`protocol::SlowReason::Indirect`]): its gfn comes from the guest
    /// entry, which may change under a lockless fix (KVM's `locking.rst`);
    /// unless [`MmuOptions::seed_indirect`]: then the seed's scheme fixes
    /// it ([`protocol::seed_fast_fix`], `who` the vCPU's identification;
    /// `None`: its id does not fit the spte's field, the slow path).
    ///
    /// The page's role and first gfn are read without `mmu_lock` in KVM
    /// (`sptep_to_sp`, under the lockless walk's RCU protection); here an
    /// untimed look stands for that read, as for `shadow_root_exists`: no
    /// lock cost, no wait, and no vCPU runs meanwhile.
    pub fn fast_page_fault_shadow(
        &self,
        mem: &PhysMemory,
        costs: &HvCosts,
        pml4: Hpa,
        gva: Gva,
        user: bool,
        who: Option<protocol::Identification>,
    ) -> Option<FastFault> {
        use super::shadow::{fetch::index, spte};
        if !self.options.fast_pf || self.mode != MmuMode::Shadow {
            return None;
        }
        let mut cycles = Cycles::ZERO;
        let slow = |reason, cycles| FastFault {
            gfn: Gfn(0),
            outcome: FastFix::Slow(reason),
            cycles,
        };
        // The lockless walk from the root (KVM's
        // `walk_shadow_page_lockless_begin`): shadow tables map 4 KiB
        // leaves only.
        let mut table = pml4.frame();
        for level in (2..=super::page::ROOT_LEVEL).rev() {
            cycles += Cycles(costs.spte_read);
            let entry = tdp::read_spte(mem, tdp::entry_at(table.addr(), index(gva, level)));
            match entry {
                Ok(entry) if spte::is_present(entry) => table = spte::frame(entry),
                _ => return Some(slow(protocol::SlowReason::NotPresent, cycles)),
            }
        }
        let at = tdp::entry_at(table.addr(), index(gva, 1));
        let Ok(cell) = mem.atomic_u64(at) else {
            return Some(slow(protocol::SlowReason::NotPresent, cycles));
        };
        // Direct: the gfn by position; indirect (seed scheme): the leaf's
        // recorded gfn and that gfn's write-protect flag.
        let page = {
            let mut inner = self.hold(super::lock::Timed::Untimed, costs);
            let pages = &mut inner.shadow.pages;
            match pages
                .get(table)
                .map(|p| (p.role.direct, p.role.level, p.gfn))
            {
                Some((true, 1, first)) => Some((Gfn(first.0 + index(gva, 1)), None)),
                Some((false, 1, _)) if self.options.seed_indirect => pages
                    .leaf_gfn(at)
                    .map(|gfn| (gfn, Some(pages.seed_flag(gfn)))),
                Some(_) => return Some(slow(protocol::SlowReason::Indirect, cycles)),
                None => None,
            }
        };
        let Some((gfn, seed_flag)) = page else {
            return Some(slow(protocol::SlowReason::NotPresent, cycles));
        };
        cycles += Cycles(costs.spte_read);
        // A user write to a supervisor-only leaf is the guest's own fault
        // (or CR0.WP's supervisor-only trick): the slow path's walk says
        // which.
        if user && protocol::SpteCell::load(cell) & spte::USER == 0 {
            return Some(slow(protocol::SlowReason::NotFixable, cycles));
        }
        let outcome = match seed_flag {
            None => {
                let write = Access {
                    write: true,
                    fetch: false,
                };
                let outcome = protocol::fast_fix(cell, &Layout::SHADOW, write);
                if let FastFix::Fixed { .. } = outcome {
                    cycles += Cycles(costs.spte_cmpxchg);
                }
                outcome
            }
            Some(flag) => {
                // The seed's path fixes only what the MMU allows writing
                // (MMU_WRITABLE: the guest allows the write, its dirty bit
                // is set, the slot is writable; the page tracker clears it
                // with W); the flag and the id keep the write-protect path
                // from being undone (its read-check-modify in the seed).
                let Some(who) = who else {
                    return Some(slow(protocol::SlowReason::Contended, cycles));
                };
                if protocol::SpteCell::load(cell) & spte::MMU_WRITABLE == 0 {
                    return Some(slow(protocol::SlowReason::WriteProtected, cycles));
                }
                let outcome = protocol::seed_fast_fix(cell, &*flag, &Layout::SHADOW, who);
                if let FastFix::Fixed { .. } = outcome {
                    // Tag, smp_mb() (a locked instruction's price) and the
                    // fix: three locked operations.
                    cycles += Cycles(3 * costs.spte_cmpxchg);
                }
                outcome
            }
        };
        Some(FastFault {
            gfn,
            outcome,
            cycles,
        })
    }
}
