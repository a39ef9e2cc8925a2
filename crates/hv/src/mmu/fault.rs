//! Installing a leaf for a resolved fault (step 3 of the EPT-violation
//! path, `crate::fault`): under `mmu_lock`, in the root the vCPU entered
//! with, recorded in the rmap; and the write rights a leaf gets.
//!
//! No INVEPT is needed for the new spte: the fault replaced a not-present
//! entry, and the CPU caches no translation for a not-present entry.

use super::fast_pf::protocol::{fast_fix, Access, FastFix, Layout};
use super::lock::Timed;
use super::root::RootId;
use super::{spte, tdp, Mmu, MmuInner};
use crate::cost::HvCosts;
use crate::frames::FrameAllocator;
use crate::time::Cycles;
use machine::{Gfn, Hfn, MemError, PhysMemory};
use thiserror::Error;

/// Why installing a leaf failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MapError {
    #[error("EPT tables: {0}")]
    Tdp(#[from] tdp::TdpError),
    #[error("host memory: {0:?}")]
    Memory(MemError),
}

impl From<MemError> for MapError {
    fn from(e: MemError) -> Self {
        MapError::Memory(e)
    }
}

/// What KVM's slow path does inside `mmu_lock` around the spte itself
/// (the walk and the spte write are charged where they happen), in the
/// seed's KVM (3.x: `tdp_page_fault` / `FNAME(page_fault)` →
/// `__direct_map` / `FNAME(fetch)` → `mmu_set_spte` → `set_spte`):
/// `mmu_notifier_retry`; `mark_page_dirty` when the new spte is writable
/// (its memslot lookup, and the bitmap bit when the slot logs);
/// `kvm_release_pfn_clean` (the page reference `hva_to_pfn` took). Charged
/// to the hold, so it lengthens the lock's hold on the timeline and other
/// vCPUs wait behind it.
pub(crate) fn locked_fault_work(costs: &HvCosts, writable: bool, dirty_marked: bool) -> u64 {
    let mut cycles = costs.mmu_notifier_check + costs.host_page_release;
    if writable {
        cycles += costs.memslot_lookup;
    }
    if dirty_marked {
        cycles += costs.dirty_bit_set;
    }
    cycles
}

/// The write rights of a new leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeafWrite {
    /// A read-only memslot: no write bit at all.
    ReadOnly,
    /// Hardware W, MMU-writable and host-writable.
    Writable,
    /// Dirty logging write-protects the slot and the access is not a
    /// write: MMU-writable and host-writable, W clear, so the first write
    /// faults and is logged.
    LogProtected,
}

impl LeafWrite {
    /// The rights for a leaf of `slot` installed by an access (`write`).
    pub fn for_slot(slot: &crate::memslot::Memslot, write: bool) -> Self {
        if slot.flags.readonly {
            LeafWrite::ReadOnly
        } else if !write && slot.write_protected_for_log() {
            LeafWrite::LogProtected
        } else {
            LeafWrite::Writable
        }
    }

    /// Whether the memslot allows writes at all.
    pub fn host_writable(self) -> bool {
        self != LeafWrite::ReadOnly
    }

    /// The EPT leaf for `frame_hpa` with these rights.
    fn ept_leaf(self, frame_hpa: u64) -> u64 {
        let leaf = spte::make_leaf(frame_hpa, self.host_writable(), true);
        if self == LeafWrite::LogProtected {
            leaf & !spte::WRITE
        } else {
            leaf
        }
    }
}

/// What installing a mapping did.
#[derive(Debug)]
pub(crate) struct Mapped {
    /// Virtual cycles the hold cost (acquisition, wait, work).
    pub cycles: Cycles,
    /// Of which waiting for `mmu_lock`.
    pub lock_wait: Cycles,
    /// Of which behind a zap-all's teardown.
    pub zap_wait: Cycles,
    /// Whether a new spte went in (false: another vCPU had installed it),
    /// or why not.
    pub result: Result<bool, MapError>,
}

impl Mmu {
    /// Maps `gfn` to `frame` (with `rights`) in `root`, under `mmu_lock`
    /// taken at virtual time `at`, with its contention modelled; `write`:
    /// the fault was a write (a present leaf gets W back if the MMU
    /// allows it); `dirty_marked`: the fault logged the page (the hold
    /// charges the bitmap's bit, [`locked_fault_work`]). The cost is
    /// charged even when it fails (the hold happened).
    #[allow(clippy::too_many_arguments)]
    pub fn map_gfn(
        &self,
        mem: &PhysMemory,
        frames: &mut FrameAllocator,
        costs: &HvCosts,
        root: RootId,
        gfn: Gfn,
        frame: Hfn,
        rights: LeafWrite,
        write: bool,
        dirty_marked: bool,
        at: Cycles,
    ) -> Mapped {
        if self.mode == super::MmuMode::Shadow {
            // A shadow leaf needs the guest-virtual address and the guest
            // walk (`vcpu/shadow.rs` maps it); nothing to do by gfn.
            return Mapped {
                cycles: Cycles::ZERO,
                lock_wait: Cycles::ZERO,
                zap_wait: Cycles::ZERO,
                result: Ok(false),
            };
        }
        let mut guard = self.hold(Timed::At(at), costs);
        let access = Access {
            write,
            fetch: false,
        };
        let result = install(
            mem, frames, &mut guard, costs, root, gfn, frame, rights, access,
        );
        let writable = write || rights == LeafWrite::Writable;
        guard.charge(locked_fault_work(costs, writable, dirty_marked));
        Mapped {
            cycles: guard.cycles(),
            lock_wait: guard.waited(),
            zap_wait: guard.zap_waited(),
            result,
        }
    }
}

/// The part of the fault under `mmu_lock`.
#[allow(clippy::too_many_arguments)]
fn install(
    mem: &PhysMemory,
    frames: &mut FrameAllocator,
    guard: &mut super::lock::MmuGuard<'_>,
    costs: &HvCosts,
    root: RootId,
    gfn: Gfn,
    frame: Hfn,
    rights: LeafWrite,
    access: Access,
) -> Result<bool, MapError> {
    let (walked, work) = {
        let MmuInner { roots, headers, .. } = &mut **guard;
        // A root zapped since the vCPU entered: nothing to install into;
        // the vCPU reloads its root before it enters again.
        let Some(root) = roots.get(root) else {
            return Ok(false);
        };
        let mut work = tdp::WalkWork::default();
        (
            tdp::leaf_for(mem, frames, headers, root, gfn, &mut work),
            work,
        )
    };
    let leaf = walked?;
    guard.charge(
        work.entries_read * costs.spte_read
            + work.tables_allocated * (costs.frame_alloc + costs.zero_4k + costs.spte_write),
    );
    let current = tdp::read_spte(mem, leaf)?;
    guard.charge(costs.spte_read);
    if spte::is_present(current) {
        // Raced with another fault on the same gfn, which installed it;
        // or a leaf that only needs an access bit back: access-tracked
        // (`--ept-ad off`), or W on an MMU-writable leaf write-protected
        // for dirty logging (the caller logged the page). The fast path's
        // fix, taken here under the lock when it is off or gave up.
        let fix = fast_fix(mem.atomic_u64(leaf)?, &Layout::EPT, access);
        if let FastFix::Fixed { .. } = fix {
            guard.charge(costs.spte_cmpxchg);
            return Ok(true);
        }
        return Ok(false);
    }
    tdp::write_spte(mem, leaf, rights.ept_leaf(frame.addr().0))?;
    guard.rmap.add(frame, leaf);
    guard.charge(costs.spte_write);
    Ok(true)
}
