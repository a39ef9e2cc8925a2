//! The MMU, split by concern as KVM's `arch/x86/kvm/mmu`:
//! - [`spte`]: the entry layout, every bit documented and overlap-checked;
//! - [`page`]: page headers (level, gfn, role, generation, parent link);
//! - [`root`]: roots as objects, chosen by each vCPU at VM entry;
//! - [`tdp`]: the EPT (TDP) tables; [`tdp_iter`]: walking a gfn range;
//! - [`rmap`]: host frame -> sptes;
//! - [`lock`]: `mmu_lock` and its virtual-time timeline;
//! - [`fault`]: the EPT-violation path (find the frame, install the spte);
//! - [`notifier`]: what the pager may do to mappings (test-and-clear-young,
//!   zap a frame, zap a gfn range), KVM's MMU-notifier hooks;
//! - [`walk`]: the guest page-table walker (the shadow MMU's view of the
//!   guest's tables: permissions, A/D updates, the #PF the guest must see);
//! - [`dirty_log`]: dirty logging (bitmap, manual protect, ring, PML);
//! - [`zap`]: zap-all, slow (one hold) or fast (by generation, batches
//!   with lock breaks; seed 003);
//! - [`check`]: the invariant checker the tests run;
//! - [`shadow`]: the shadow MMU (`--mmu shadow`): shadow pages keyed by
//!   (gfn, role), the page tracker, unsync pages, the root cache.
//!
//! No code outside this module reads or writes an spte.

pub(crate) mod check;
pub mod dirty_log;
pub(crate) mod fast_pf;
pub(crate) mod fault;
pub(crate) mod lock;
pub(crate) mod notifier;
pub(crate) mod page;
pub(crate) mod rmap;
pub(crate) mod root;
pub(crate) mod shadow;
pub mod spte;
pub(crate) mod tdp;
pub(crate) mod tdp_iter;
// The shadow MMU is its user; until it lands only the tests call it.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod walk;
pub mod zap;

use crate::cost::HvCosts;
use crate::frames::FrameAllocator;
use crate::time::Cycles;
use lock::{LockTimeline, MmuGuard, MmuLock, Timed};
use machine::vmx::Eptp;
use machine::{Gfn, PhysMemory};
use page::{PageHeaders, PageRole};
use root::{RootError, RootId, Roots};
use std::sync::atomic::{AtomicU64, Ordering};

/// How guest memory is virtualised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MmuMode {
    /// Two-dimensional paging: the guest's page tables as they are, EPT
    /// below them.
    #[default]
    Ept,
    /// Shadow paging: the hv builds the tables the CPU walks from the
    /// guest's own (see [`shadow`]).
    Shadow,
    /// No memory virtualisation (the benchmarks' "native" row): EPT off
    /// and nothing shadowed, guest-physical = host-physical (guest RAM is
    /// the machine's physical memory from 0, an identity memslot), so the
    /// CPU walks the guest's own tables one-dimensionally and a MOV to CR3
    /// never exits. No host paging, dirty logging or memslot changes: the
    /// hv has no mapping to take away.
    Native,
}

impl MmuMode {
    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            MmuMode::Ept => "ept",
            MmuMode::Shadow => "shadow",
            MmuMode::Native => "none",
        }
    }
}

/// State protected by `mmu_lock`.
#[derive(Debug)]
pub(crate) struct MmuInner {
    pub roots: Roots,
    pub headers: PageHeaders,
    pub rmap: rmap::Rmap,
    /// When, in virtual time, the lock was held.
    pub timeline: LockTimeline,
    /// The shadow MMU's pages, page tracker and counters (empty under EPT).
    pub shadow: shadow::ShadowState,
}

/// The VM's MMU.
#[derive(Debug)]
pub(crate) struct Mmu {
    lock: MmuLock,
    /// EPT or shadow, fixed at creation.
    pub mode: MmuMode,
    /// Fast page fault and EPT A/D flags, fixed at creation.
    pub options: fast_pf::MmuOptions,
    /// The MMU generation: roots and tables made in an older one are
    /// obsolete. Read without the lock at every VM entry (KVM reads
    /// `mmu_valid_gen` the same way); changed only under the lock.
    generation: AtomicU64,
}

/// What loading a root cost the vCPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RootLoad {
    /// Acquisition, wait and work (zero for an untimed load).
    pub cycles: Cycles,
    /// Of which waiting behind a zap-all's teardown.
    pub zap_wait: Cycles,
}

/// The root a vCPU enters with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LoadedRoot {
    pub id: RootId,
    pub eptp: Eptp,
    pub generation: u64,
}

impl Mmu {
    /// An MMU of `mode`; under EPT with one empty TDP root (made now, so
    /// its frame comes first). Shadow roots are made per guest CR3.
    #[cfg(test)]
    pub fn new(
        mem: &PhysMemory,
        frames: &mut FrameAllocator,
        mode: MmuMode,
    ) -> Result<Self, RootError> {
        Self::with_options(mem, frames, mode, fast_pf::MmuOptions::default())
    }

    /// [`Mmu::new`] with the fast page fault and EPT A/D flags as
    /// `options` say.
    pub fn with_options(
        mem: &PhysMemory,
        frames: &mut FrameAllocator,
        mode: MmuMode,
        options: fast_pf::MmuOptions,
    ) -> Result<Self, RootError> {
        let mut roots = Roots::default();
        let mut headers = PageHeaders::default();
        if mode == MmuMode::Ept {
            roots.create(mem, frames, &mut headers, PageRole::TDP_ROOT, 0)?;
        }
        let dirty_mask = Self::dirty_mask_of(mode, options);
        let mut shadow = shadow::ShadowState::default();
        shadow.pages.seed_indirect = options.seed_indirect;
        Ok(Mmu {
            lock: MmuLock::new(MmuInner {
                roots,
                headers,
                rmap: rmap::Rmap::new(dirty_mask),
                timeline: LockTimeline::default(),
                shadow,
            }),
            mode,
            options,
            generation: AtomicU64::new(0),
        })
    }

    /// The accessed bit of a leaf spte (the CPU sets it on use): EPT's bit
    /// 8, or the x86 PTE's bit 5 in a shadow spte.
    pub fn accessed_mask(&self) -> u64 {
        match self.mode {
            MmuMode::Ept => spte::ACCESSED,
            MmuMode::Shadow => shadow::spte::ACCESSED,
            // No sptes: the pager never ages an identity page.
            MmuMode::Native => 0,
        }
    }

    /// The dirty bit of a leaf spte (EPT bit 9, x86 PTE bit 6). With EPT
    /// A/D off the CPU keeps none: a writable spte counts as dirty (KVM's
    /// `is_dirty_spte`), and aging saves W's dirtiness before clearing it.
    pub fn dirty_mask(&self) -> u64 {
        Self::dirty_mask_of(self.mode, self.options)
    }

    fn dirty_mask_of(mode: MmuMode, options: fast_pf::MmuOptions) -> u64 {
        match mode {
            MmuMode::Ept if options.ept_ad => spte::DIRTY,
            MmuMode::Ept => spte::WRITE,
            MmuMode::Shadow => shadow::spte::DIRTY,
            MmuMode::Native => 0,
        }
    }

    /// Takes `mmu_lock` (see [`lock`]).
    pub fn hold(&self, when: Timed, costs: &HvCosts) -> MmuGuard<'_> {
        self.lock.hold(when, costs)
    }

    /// Defers a fault's request for `mmu_lock` at `now` if it would wait
    /// (see [`lock::MmuLock::defer`]).
    pub(crate) fn defer_lock(
        &self,
        exit: Cycles,
        now: Cycles,
        costs: &HvCosts,
    ) -> Option<lock::Deferral> {
        self.lock.defer(exit, now, costs)
    }

    /// vCPU `vcpu`'s replayed fault ended without taking `mmu_lock`.
    pub(crate) fn end_lock_deferral(&self, vcpu: usize) {
        self.lock.end_deferral(vcpu);
    }

    /// Timed holds of `mmu_lock` from now on are vCPU `vcpu`'s (`None`:
    /// the VMM thread's); the scheduler sets it around each vCPU's turn,
    /// so the lock's model knows when its cache line changes cores.
    pub fn set_running(&self, vcpu: Option<usize>) {
        self.lock
            .set_running(vcpu.map_or(lock::Core::Vmm, lock::Core::Vcpu));
    }

    /// The core running hv code now (see [`Mmu::set_running`]).
    pub(crate) fn running(&self) -> lock::Core {
        self.lock.running()
    }

    /// The MMU generation.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether a vCPU may enter with `root` again (it was made in the
    /// current generation).
    pub fn is_current(&self, root: &LoadedRoot) -> bool {
        root.generation == self.generation()
    }

    /// A valid root of `role` for a vCPU entering the guest (KVM's
    /// `kvm_mmu_load`): the current generation's, made if none exists.
    /// `previous` is the root the vCPU entered with last (its use count
    /// moves to the new one). `when`: a vCPU's first load is set-up
    /// (untimed); a reload after a zap-all is a timed hold whose cost the
    /// vCPU pays.
    pub fn load_root(
        &self,
        mem: &PhysMemory,
        frames: &mut FrameAllocator,
        costs: &HvCosts,
        previous: Option<RootId>,
        when: Timed,
    ) -> Result<(LoadedRoot, RootLoad), RootError> {
        let mut inner = self.hold(when, costs);
        let generation = self.generation();
        let role = PageRole::TDP_ROOT;
        let id = match inner.roots.find_valid(role, generation) {
            Some(id) => id,
            None => {
                let MmuInner { roots, headers, .. } = &mut *inner;
                let id = roots.create(mem, frames, headers, role, generation)?;
                inner.charge(costs.frame_alloc + costs.zero_4k);
                id
            }
        };
        if let Some(old) = previous.and_then(|p| inner.roots.get_mut(p)) {
            old.users = old.users.saturating_sub(1);
        }
        let root = inner.roots.get_mut(id).expect("found or made above");
        root.users += 1;
        let loaded = LoadedRoot {
            id,
            eptp: root.eptp(self.options.ept_ad),
            generation,
        };
        let load = RootLoad {
            cycles: inner.cycles(),
            zap_wait: inner.zap_waited(),
        };
        Ok((loaded, load))
    }

    /// `mmu_lock`'s counters so far.
    pub fn lock_stats(&self, costs: &HvCosts) -> lock::MmuLockStats {
        let inner = self.hold(Timed::Untimed, costs);
        let t = &inner.timeline;
        lock::MmuLockStats {
            acquisitions: t.acquisitions,
            contended: t.contended,
            line_transfers: t.line_transfers,
            waited_cycles: t.waited.0,
            handoff_cycles: t.handoff.0,
            overlaps: t.overlaps,
            inversions: t.inversions,
        }
    }

    /// Per vCPU: its timed holds of `mmu_lock` and the contended ones.
    pub fn lock_stats_per_vcpu(&self, costs: &HvCosts) -> Vec<(u64, u64)> {
        self.hold(Timed::Untimed, costs).timeline.per_vcpu.clone()
    }

    /// EPT table frames in use, roots included.
    pub fn table_count(&self, costs: &HvCosts) -> u64 {
        self.hold(Timed::Untimed, costs).headers.len() as u64
    }

    /// The leaf spte mapping `gfn` in the current generation's root, if
    /// any (for inspection).
    pub fn leaf_spte(&self, mem: &PhysMemory, costs: &HvCosts, gfn: Gfn) -> Option<u64> {
        let inner = self.hold(Timed::Untimed, costs);
        let root = inner
            .roots
            .find_valid(PageRole::TDP_ROOT, self.generation())?;
        let pml4 = inner.roots.get(root)?.pml4;
        let at = tdp::find_leaf(mem, pml4, gfn).ok()??;
        tdp::read_spte(mem, at).ok()
    }
}

/// Why a restore could not map a saved EPT leaf.
#[derive(Debug, thiserror::Error)]
pub enum RestoreLeafError {
    #[error("{0}")]
    Root(#[from] RootError),
    #[error("{0}")]
    Tables(#[from] tdp::TdpError),
    #[error("EPT leaf outside host memory: {0:?}")]
    Memory(machine::MemError),
}

impl From<machine::MemError> for RestoreLeafError {
    fn from(e: machine::MemError) -> Self {
        RestoreLeafError::Memory(e)
    }
}

impl Mmu {
    /// The leaf sptes of the current generation's root among `gfns`, each
    /// as `(gfn, spte without its host address)`: what a snapshot keeps
    /// of the EPT so a restore maps the same pages with the same bits
    /// (`docs/migration.md`, "What a restore rebuilds").
    pub fn leaf_bits(
        &self,
        mem: &PhysMemory,
        costs: &HvCosts,
        gfns: impl Iterator<Item = Gfn>,
    ) -> Vec<(Gfn, u64)> {
        let inner = self.hold(Timed::Untimed, costs);
        let Some(pml4) = inner
            .roots
            .find_valid(PageRole::TDP_ROOT, self.generation())
            .and_then(|id| inner.roots.get(id))
            .map(|root| root.pml4)
        else {
            return Vec::new();
        };
        gfns.filter_map(|gfn| {
            let at = tdp::find_leaf(mem, pml4, gfn).ok()??;
            let leaf = tdp::read_spte(mem, at).ok()?;
            spte::is_present(leaf).then_some((gfn, leaf & !spte::ADDR_MASK))
        })
        .collect()
    }

    /// The EPTP of the current generation's root, if there is one.
    pub fn current_eptp(&self, costs: &HvCosts) -> Option<u64> {
        let inner = self.hold(Timed::Untimed, costs);
        let id = inner
            .roots
            .find_valid(PageRole::TDP_ROOT, self.generation())?;
        Some(inner.roots.get(id)?.eptp(self.options.ept_ad).0)
    }

    /// Maps `gfn` to `frame` with the saved leaf `bits` (from
    /// [`Mmu::leaf_bits`], checked by the caller) in the current
    /// generation's root, made if missing: a restore rebuilding the EPT
    /// the saved VM had. Untimed and uncharged (no vCPU faulted), so the
    /// restored guest does not pay refaults the saved one never made.
    pub fn restore_leaf(
        &self,
        mem: &PhysMemory,
        frames: &mut FrameAllocator,
        gfn: Gfn,
        frame: machine::Hfn,
        bits: u64,
        costs: &HvCosts,
    ) -> Result<(), RestoreLeafError> {
        let mut inner = self.hold(Timed::Untimed, costs);
        let generation = self.generation();
        let MmuInner {
            roots,
            headers,
            rmap,
            ..
        } = &mut *inner;
        let id = match roots.find_valid(PageRole::TDP_ROOT, generation) {
            Some(id) => id,
            None => roots.create(mem, frames, headers, PageRole::TDP_ROOT, generation)?,
        };
        let root = roots.get(id).expect("found or made above");
        let mut work = tdp::WalkWork::default();
        let leaf = tdp::leaf_for(mem, frames, headers, root, gfn, &mut work)?;
        tdp::write_spte(mem, leaf, (bits & !spte::ADDR_MASK) | frame.addr().0)?;
        rmap.add(frame, leaf);
        Ok(())
    }
}

#[cfg(test)]
impl Mmu {
    /// Sets `bits` in the leaf spte of `gfn`, as the CPU's A/D updates do.
    pub fn set_leaf_bits_for_test(&self, mem: &PhysMemory, gfn: Gfn, bits: u64) {
        let inner = self.hold(Timed::Untimed, &HvCosts::DEFAULT);
        let root = inner.roots.iter().next().expect("a root").pml4;
        let at = tdp::find_leaf(mem, root, gfn).unwrap().expect("mapped");
        mem.atomic_u64(at)
            .unwrap()
            .fetch_or(bits, std::sync::atomic::Ordering::Relaxed);
    }
}
