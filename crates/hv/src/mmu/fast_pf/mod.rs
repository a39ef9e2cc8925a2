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
use machine::{Gfn, Hpa, PhysMemory};
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
}

impl Default for MmuOptions {
    fn default() -> Self {
        MmuOptions {
            fast_pf: true,
            ept_ad: true,
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
