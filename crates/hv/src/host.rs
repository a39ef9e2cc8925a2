//! The host side of a VM: its host-physical memory, the frame allocator,
//! the memslots, the MMU and the cost table. Everything here is shared by
//! the vCPUs; the pager works on it (`pager.rs`) and the fault path maps
//! through it (`mmu/fault.rs`).

use crate::cost::HvCosts;
use crate::frames::FrameAllocator;
use crate::memslot::Memslots;
use crate::mmu::dirty_log::{mark_page_dirty, DirtyRings};
use crate::mmu::lock::Timed;
use crate::mmu::shadow::pages::Tables;
use crate::mmu::shadow::{Effects, Held, HostView, ShadowError, ShadowStats};
use crate::mmu::Mmu;
use machine::PhysMemory;

/// The host state behind guest memory.
#[derive(Debug)]
pub(crate) struct Host {
    pub mem: PhysMemory,
    pub frames: FrameAllocator,
    pub slots: Memslots,
    pub mmu: Mmu,
    pub costs: HvCosts,
    /// The vCPUs' dirty rings (empty of entries unless a slot logs in ring
    /// mode).
    pub dirty_rings: DirtyRings,
    /// While the scheduler handles a fault that can be replayed: the
    /// latest virtual time at which it may ask for `mmu_lock` before
    /// another actor could ask earlier (`vm/sched.rs`, `order_bound`).
    /// A request past it ends the fault as [`crate::fault::FaultOutcome::NotYet`].
    /// `None`: no bound (the fault waits in place, as prefaults and the
    /// VMM's work do).
    pub order_bound: Option<crate::time::Cycles>,
}

impl Host {
    /// Whether a request for `mmu_lock` at `at` must wait for the other
    /// actors to pass it first (see [`Host::order_bound`]).
    pub fn not_yet(&self, at: crate::time::Cycles) -> bool {
        self.order_bound.is_some_and(|bound| at > bound)
    }

    /// Marks `gfn` dirty in its slot's log if the slot logs (see
    /// [`crate::mmu::dirty_log::mark_page_dirty`]); lock-free, callable
    /// from the fast page fault.
    pub fn mark_page_dirty(&self, gfn: machine::Gfn) -> bool {
        mark_page_dirty(&self.slots, &self.dirty_rings, gfn)
    }

    /// Runs `op` on the shadow MMU's tables under `mmu_lock` at `when`
    /// (`Mmu::with_shadow`, with this host's memory, frames and memslots).
    pub fn with_shadow<T>(
        &mut self,
        when: Timed,
        op: impl FnOnce(&mut Tables<'_>, &mut ShadowStats, &mut Effects) -> Result<T, ShadowError>,
    ) -> Result<Held<T>, ShadowError> {
        let view = HostView {
            mem: &self.mem,
            frames: &mut self.frames,
            slots: &self.slots,
            costs: &self.costs,
        };
        self.mmu.with_shadow(view, when, op)
    }
}
