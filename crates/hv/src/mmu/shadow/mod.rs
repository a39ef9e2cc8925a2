//! The shadow MMU (`--mmu shadow`), after KVM's `mmu.c`, `paging_tmpl.h`
//! and `page_track.c`.
//!
//! The CPU runs the guest with EPT off and CR3 at a shadow root: tables the
//! hv builds in host memory that translate guest-virtual addresses straight
//! to host frames. A guest #PF, CR3 load, INVLPG and the paging bits of
//! CR0/CR4/EFER exit; at a #PF the hv walks the guest's tables
//! ([`gwalk`]): a fault the guest must see is injected, otherwise the
//! shadow path is filled in ([`fetch`]).
//!
//! - [`role`]: what a shadow page's translation depends on;
//! - [`spte`]: the shadow entry layout;
//! - [`pages`]: the pages by (gfn, role), parent links, the page tracker
//!   (write-protecting shadowed guest tables) and zapping;
//! - [`fetch`]: installing a translation, unsync, write emulation choice;
//! - [`sync`]: re-reading unsync pages at CR3 load, INVLPG and flushes;
//! - [`cache`]: roots by guest CR3 and each vCPU's `prev_roots`;
//! - [`cr3_cache`]: the paravirtual CR3 cache (seed 004) and its invariant.

pub(crate) mod cache;
pub(crate) mod check;
pub mod cr3_cache;
pub(crate) mod fetch;
pub(crate) mod gwalk;
pub mod pages;
pub(crate) mod role;
pub mod spte;
pub(crate) mod sync;

use super::lock::MmuGuard;
use super::MmuInner;
use crate::cost::HvCosts;
use crate::time::Cycles;
use machine::{Gfn, MemError, PhysMemory};
pub use pages::ShadowError;
pub(crate) use pages::{Effects, ShadowPages};

/// Counters of the shadow MMU (cumulative unless noted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ShadowStats {
    /// Shadow pages now, by level (index 0: level 1).
    pub pages_by_level: [u64; 4],
    /// Unsync pages now.
    pub unsync_pages: u64,
    /// Pages that went unsync.
    pub unsynced: u64,
    /// Unsync pages synced.
    pub syncs: u64,
    /// Writes to write-tracked guest tables let through one instruction
    /// and then reflected in the shadow (emulated).
    pub wp_emulated: u64,
    /// Write-tracked gfns unprotected (their shadow pages zapped) after a
    /// flood of writes.
    pub wp_unprotected: u64,
    /// Roots made.
    pub roots_built: u64,
    /// Root loads that found the root in the hash.
    pub roots_reused: u64,
    /// CR3 loads served from the vCPU's `prev_roots` (no lock, no lookup).
    pub prev_root_hits: u64,
    /// #PFs injected into the guest (its own faults).
    pub guest_pf_injected: u64,
    /// Shadow pages zapped.
    pub pages_zapped: u64,
}

/// The shadow MMU's state under `mmu_lock`.
#[derive(Debug, Default)]
pub(crate) struct ShadowState {
    pub pages: ShadowPages,
    pub stats: ShadowStats,
}

/// The shadow tables of `inner`, for an operation under `mmu_lock`.
pub(crate) fn tables<'a>(
    inner: &'a mut MmuInner,
    mem: &'a PhysMemory,
    frames: &'a mut crate::frames::FrameAllocator,
    slots: &'a crate::memslot::Memslots,
    generation: u64,
) -> (pages::Tables<'a>, &'a mut ShadowStats) {
    let MmuInner {
        roots,
        headers,
        rmap,
        shadow,
        ..
    } = inner;
    (
        pages::Tables {
            mem,
            frames,
            slots,
            headers,
            roots,
            rmap,
            pages: &mut shadow.pages,
            generation,
        },
        &mut shadow.stats,
    )
}

/// Charges the work of `fx` to the hold.
pub(crate) fn charge(guard: &mut MmuGuard<'_>, costs: &HvCosts, fx: &Effects) {
    guard.charge(
        fx.reads * costs.spte_read
            + fx.writes * costs.spte_write
            + fx.allocated * (costs.frame_alloc + costs.zero_4k)
            + fx.work,
    );
}

/// What a shadow operation under `mmu_lock` cost and changed.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Held<T> {
    pub value: T,
    /// The hold's cost (acquisition, wait, work).
    pub cycles: Cycles,
    /// Of which the acquisition (the ticket's atomic).
    pub acquire: Cycles,
    /// Of which waiting.
    pub lock_wait: Cycles,
    /// Of which waiting behind a zap-all's teardown.
    pub zap_wait: Cycles,
    /// A present spte was cleared or restricted: flush every vCPU.
    pub flush: bool,
    /// A root was zapped: every vCPU reloads.
    pub reload: bool,
}

/// The host side a shadow operation needs.
pub(crate) struct HostView<'a> {
    pub mem: &'a PhysMemory,
    pub frames: &'a mut crate::frames::FrameAllocator,
    pub slots: &'a crate::memslot::Memslots,
    pub costs: &'a HvCosts,
}

impl super::Mmu {
    /// Runs `op` on the shadow tables under `mmu_lock` taken `when`.
    pub(crate) fn with_shadow<T>(
        &self,
        host: HostView<'_>,
        when: super::lock::Timed,
        op: impl FnOnce(
            &mut pages::Tables<'_>,
            &mut ShadowStats,
            &mut Effects,
        ) -> Result<T, ShadowError>,
    ) -> Result<Held<T>, ShadowError> {
        let generation = self.generation();
        let mut guard = self.hold(when, host.costs);
        let mut fx = Effects::default();
        let result = {
            let (mut t, stats) = tables(&mut guard, host.mem, host.frames, host.slots, generation);
            op(&mut t, stats, &mut fx)
        };
        charge(&mut guard, host.costs, &fx);
        let value = result?;
        Ok(Held {
            value,
            cycles: guard.cycles(),
            acquire: guard.acquire(),
            lock_wait: guard.waited(),
            zap_wait: guard.zap_waited(),
            flush: fx.flush,
            reload: fx.reload,
        })
    }

    /// Whether shadow root `id` still exists (a lockless peek in KVM:
    /// the root's `invalid` flag; here an untimed look).
    pub(crate) fn shadow_root_exists(&self, id: super::root::RootId, costs: &HvCosts) -> bool {
        self.hold(super::lock::Timed::Untimed, costs)
            .roots
            .get(id)
            .is_some()
    }

    /// The shadow counters, with the page counts of now.
    pub(crate) fn shadow_stats(&self, costs: &HvCosts) -> ShadowStats {
        let inner = self.hold(super::lock::Timed::Untimed, costs);
        let mut stats = inner.shadow.stats;
        let (levels, unsync) = inner.shadow.pages.counts();
        stats.pages_by_level = levels;
        stats.unsync_pages = unsync;
        stats
    }

    /// Pages that ever went unsync (a cheap look for the CR3 cache's
    /// sweep: growth means a cached root may need a sync).
    pub(crate) fn shadow_unsynced_total(&self, costs: &HvCosts) -> u64 {
        self.hold(super::lock::Timed::Untimed, costs)
            .shadow
            .stats
            .unsynced
    }

    /// Whether written guest leaf tables may go unsync
    /// (`VmConfig::shadow_unsync`); set once, before any vCPU runs.
    pub(crate) fn set_shadow_unsync(&self, unsync: bool) {
        let mut inner = self.hold(super::lock::Timed::Untimed, &HvCosts::DEFAULT);
        inner.shadow.pages.never_unsync = !unsync;
    }

    /// Adds vCPU-side counts (injected #PFs, prev-root hits).
    pub(crate) fn shadow_count(&self, costs: &HvCosts, f: impl FnOnce(&mut ShadowStats)) {
        f(&mut self.hold(super::lock::Timed::Untimed, costs).shadow.stats);
    }
}

/// Sets or clears the hardware write bit of a leaf for a write let through
/// under the monitor trap flag (with MMU-writable, so the spte stays
/// consistent).
pub(crate) fn set_step_writable(
    mem: &PhysMemory,
    leaf: machine::Hpa,
    writable: bool,
) -> Result<(), MemError> {
    let bits = spte::WRITABLE | spte::MMU_WRITABLE;
    let at = mem.atomic_u64(leaf)?;
    let current = at.load(std::sync::atomic::Ordering::Acquire);
    if !spte::is_present(current) || current & spte::HOST_WRITABLE == 0 {
        return Ok(());
    }
    if writable {
        at.fetch_or(bits, std::sync::atomic::Ordering::AcqRel);
    } else {
        at.fetch_and(!bits, std::sync::atomic::Ordering::AcqRel);
    }
    Ok(())
}

/// The level-1 shadow page translating `gva` under `root`, if linked.
pub(crate) fn leaf_table(
    t: &mut pages::Tables<'_>,
    root: super::root::RootId,
    gva: machine::Gva,
    fx: &mut Effects,
) -> Result<Option<machine::Hfn>, ShadowError> {
    let Some(root) = t.roots.get(root) else {
        return Ok(None);
    };
    let mut table = root.pml4;
    for level in (2..=super::page::ROOT_LEVEL).rev() {
        let entry = super::tdp::read_spte(
            t.mem,
            super::tdp::entry_at(table.addr(), fetch::index(gva, level)),
        )?;
        fx.reads += 1;
        if !spte::is_present(entry) {
            return Ok(None);
        }
        table = spte::frame(entry);
    }
    Ok(Some(table))
}

impl super::Mmu {
    /// Counts an emulated write to tracked `gfn`; true when that makes a
    /// flood (more than `limit` without a walk through its pages): the
    /// count starts again and the caller unprotects the gfn.
    pub(crate) fn shadow_note_write(&self, costs: &HvCosts, gfn: Gfn, limit: u32) -> bool {
        let mut inner = self.hold(super::lock::Timed::Untimed, costs);
        let writes = inner.shadow.pages.flood.entry(gfn).or_insert(0);
        *writes += 1;
        if *writes > limit {
            inner.shadow.pages.flood.remove(&gfn);
            return true;
        }
        false
    }
}
