//! Zap-all: dropping every mapping of the VM at once (memslot deletion and
//! moves, a VMM request), the two ways seed 003 compares.
//!
//! - [`ZapMode::Slow`], KVM's `kvm_mmu_zap_all` before seed 003: one hold
//!   of `mmu_lock` tears down every page, one by one (every entry read, a
//!   leaf leaves the rmap, a non-leaf unlinks its child, the page unlinks
//!   from its parent and goes back to the frame allocator). A vCPU that
//!   faults or reloads its root meanwhile waits for the whole hold.
//! - [`ZapMode::Fast`], seed 003 as merged (`kvm_mmu_invalidate_zap_all_pages`
//!   and `kvm_zap_obsolete_pages`): under the lock the MMU generation is
//!   bumped, which makes every root and page made before obsolete at once
//!   (no vCPU enters with an obsolete root again: each gets `RELOAD_ROOT`
//!   and builds a fresh root at its next entry); the obsolete pages are
//!   then torn down with the same per-page work, [`BATCH_ZAP_PAGES`] pages
//!   per hold, the lock released between holds so faulting vCPUs get in
//!   (lock breaks).
//! - [`ZapMode::Seed`], seed 003's own v2 (the posting quoted in the seed:
//!   "we can directly zap the mmu-cache and rmap so that vcpu will fault
//!   on the new mmu-cache, after that, we can directly free the memory
//!   used by old mmu-cache"): one hold of `mmu_lock` zaps the roots
//!   (their entries cleared, the vCPUs reload), "memset zero"s the shadow
//!   page hash table and the rmaps, and the old pages' memory is freed
//!   after the lock is released, with no per-entry work. See
//!   [`SeedWork`] for what each step is charged.
//!
//! The teardown is generic over roots and page headers: it frees whatever
//! tables the headers list, whatever MMU made them, and forgets a root when
//! its top table goes.
//!
//! Virtual time: the work is the thread's that asked (the VMM's memslot
//! ioctl), charged from the cost table, and laid out on the lock timeline
//! from the time it asked: each batch is a hold, the next batch asks for
//! the lock again after it (paying the acquisition, which is the gap a
//! waiting vCPU gets in through). The teardown itself runs to the end at
//! once in host time, so no obsolete table outlives the call; a vCPU that
//! runs afterwards meets the holds in virtual time. A vCPU hold that lands
//! between two batches overlaps the next one on the timeline: the batch's
//! delay by those few hundred cycles is not charged to the operation.

use super::lock::MmuGuard;
use super::page::ENTRIES;
use super::tdp::{entry_at, exchange_spte, read_spte};
use super::{spte, Mmu, MmuInner};
use crate::cost::HvCosts;
use crate::frames::FrameAllocator;
use crate::time::Cycles;
use machine::{Hfn, MemError, PhysMemory};
use thiserror::Error;

/// Pages torn down per hold of `mmu_lock` in a fast zap (KVM's
/// `BATCH_ZAP_PAGES`).
pub const BATCH_ZAP_PAGES: usize = 10;

/// How a zap-all drops the mappings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ZapMode {
    /// Every page one by one under one hold of `mmu_lock` (KVM before seed
    /// 003); the roots are reloaded after.
    Slow,
    /// Bump the MMU generation, reload every vCPU's root, free the
    /// obsolete pages in batches with lock breaks (seed 003).
    #[default]
    Fast,
    /// Seed 003's v2: zap the roots, reset the hash table and the rmaps
    /// wholesale under one hold, free the old pages after it.
    Seed,
}

impl ZapMode {
    /// `slow`, `fast` or `seed`.
    pub fn name(self) -> &'static str {
        match self {
            ZapMode::Slow => "slow",
            ZapMode::Fast => "fast",
            ZapMode::Seed => "seed",
        }
    }
}

/// Buckets of KVM's shadow page hash table (`KVM_NUM_MMU_PAGES`,
/// `1 << KVM_MMU_HASH_SHIFT` with `KVM_MMU_HASH_SHIFT` 10 in
/// `arch/x86/include/asm/kvm_host.h` of the seed's time), each an
/// `hlist_head` of one pointer: the seed's v2 "memset zero"s them.
pub const SEED_HASH_BYTES: u64 = 1024 * 8;

/// Bytes of KVM's rmap arrays over `slots` that the seed's v2 resets:
/// `kvm_arch_create_memslot` gives every slot, for each of the
/// `KVM_NR_PAGE_SIZES` (3) page sizes, `gfn_to_index(base + npages - 1,
/// base, level) + 1` entries of one `unsigned long` (8 bytes).
pub(crate) fn seed_rmap_bytes(slots: &crate::memslot::Memslots) -> u64 {
    slots
        .iter()
        .map(|slot| {
            let (base, last) = (slot.base_gfn.0, slot.base_gfn.0 + slot.npages.max(1) - 1);
            (0..3u32)
                .map(|i| ((last >> (9 * i)) - (base >> (9 * i)) + 1) * 8)
                .sum::<u64>()
        })
        .sum()
}

/// What seed 003's v2 is charged (`ZapMode::Seed`), all from the cost
/// table: under the lock, the roots' entries read (`spte_read` each) and
/// the present ones cleared (`spte_write`), and the hash table and the
/// rmaps zeroed, at `zero_4k` per 4 KiB (the table's figure for zeroing a
/// page, about 10 cycles a cache line); after the lock, every old page
/// returned to the allocator (`frame_free`). The frames' contents and the
/// rmap's per-spte records are dropped in host time by the same code the
/// other modes use, so the state after is theirs (and the dirty bits of
/// dropped leaves stay with their frames, standing for the host page's
/// own dirty state, which KVM does not need to walk for); none of that
/// per-entry work is charged, since the seed does none of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeedWork {
    /// Entries of root tables read.
    pub root_entries_read: u64,
    /// Present root entries cleared.
    pub root_entries_cleared: u64,
    /// Bytes zeroed under the lock (hash table and rmaps).
    pub bytes_zeroed: u64,
    /// Pages freed after the lock (the roots among them).
    pub pages_freed: u64,
}

impl SeedWork {
    /// The part under `mmu_lock`.
    pub fn held_cycles(&self, costs: &HvCosts) -> u64 {
        self.root_entries_read * costs.spte_read
            + self.root_entries_cleared * costs.spte_write
            + self.bytes_zeroed.div_ceil(4096) * costs.zero_4k
    }

    /// The part after the lock is released.
    pub fn free_cycles(&self, costs: &HvCosts) -> u64 {
        self.pages_freed * costs.frame_free
    }
}

/// A zap-all could not read or clear a table.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ZapError {
    #[error("zapping MMU tables: host memory access failed: {0:?}")]
    Memory(MemError),
}

impl From<MemError> for ZapError {
    fn from(e: MemError) -> Self {
        ZapError::Memory(e)
    }
}

impl From<ZapError> for crate::memslot::MemslotError {
    fn from(e: ZapError) -> Self {
        match e {
            ZapError::Memory(e) => crate::memslot::MemslotError::Zap(e),
        }
    }
}

/// What a zap-all did, in the virtual time of the thread that asked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZapReport {
    pub mode: ZapMode,
    /// When it asked for the lock first.
    pub started: Cycles,
    /// When it released the lock last.
    pub ended: Cycles,
    /// MMU pages (tables) torn down and freed.
    pub pages_zapped: u64,
    /// Leaf sptes cleared (each one left the rmap).
    pub sptes_zapped: u64,
    /// Holds of `mmu_lock` taken.
    pub lock_holds: u64,
    /// Times the lock was released with work left (`lock_holds - 1`).
    pub lock_breaks: u64,
    /// A seed zap's charged work.
    pub seed: Option<SeedWork>,
}

impl ZapReport {
    /// The operation's virtual time, start to end.
    pub fn cycles(&self) -> Cycles {
        self.ended - self.started
    }
}

/// Work done tearing pages down.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct ZapWork {
    entries_read: u64,
    leaves: u64,
    /// Non-leaf entries cleared: a page's links to its children and its
    /// parent's link to it.
    links: u64,
    pages: u64,
}

impl ZapWork {
    fn cycles(&self, costs: &HvCosts) -> u64 {
        self.entries_read * costs.spte_read
            + (self.leaves + self.links) * costs.spte_write
            + self.pages * costs.frame_free
    }
}

/// The obsolete pages a fast zap still has to free, parents first.
#[derive(Debug, Default)]
pub(crate) struct Obsolete {
    pages: Vec<Hfn>,
    next: usize,
}

impl Obsolete {
    /// Whether every page has been freed.
    pub fn is_done(&self) -> bool {
        self.next >= self.pages.len()
    }
}

impl Mmu {
    /// Drops every mapping, `mode`'s way, asking for `mmu_lock` at `at`,
    /// each batch of a fast zap asking again when the one before ends
    /// (nothing else takes the lock meanwhile: a VM interleaves vCPUs'
    /// holds with the batches, see [`Mmu::zap_begin`]). The caller has
    /// every vCPU reload its root before it next enters.
    #[cfg(test)]
    pub(crate) fn zap_all(
        &self,
        mem: &PhysMemory,
        frames: &mut FrameAllocator,
        costs: &HvCosts,
        mode: ZapMode,
        rmap_bytes: u64,
        at: Cycles,
    ) -> Result<ZapReport, ZapError> {
        let (mut report, obsolete) = self.zap_begin(mem, frames, costs, mode, rmap_bytes, at)?;
        if let Some(mut obsolete) = obsolete {
            self.zap_rest(mem, frames, costs, &mut report, &mut obsolete)?;
        }
        Ok(report)
    }

    /// The batches a fast zap has left, each asking for `mmu_lock` when
    /// the one before ends (nothing else takes it meanwhile).
    pub(crate) fn zap_rest(
        &self,
        mem: &PhysMemory,
        frames: &mut FrameAllocator,
        costs: &HvCosts,
        report: &mut ZapReport,
        obsolete: &mut Obsolete,
    ) -> Result<(), ZapError> {
        while !obsolete.is_done() {
            let next = report.ended;
            self.zap_batch(mem, frames, costs, report, obsolete, next)?;
        }
        Ok(())
    }

    /// A zap-all's first hold, asking for `mmu_lock` at `at`: the whole
    /// teardown (slow), or the generation bump and the first batch
    /// (fast). Returns the report so far and, for a fast zap with pages
    /// left, what [`Mmu::zap_batch`] still has to free: the VMM thread
    /// asks for the lock again for each batch at the end of the one
    /// before, and vCPUs that asked meanwhile get it first. A seed zap
    /// zeroes `rmap_bytes` of rmaps ([`seed_rmap_bytes`]) and ends after
    /// freeing the old pages, outside the lock.
    pub(crate) fn zap_begin(
        &self,
        mem: &PhysMemory,
        frames: &mut FrameAllocator,
        costs: &HvCosts,
        mode: ZapMode,
        rmap_bytes: u64,
        at: Cycles,
    ) -> Result<(ZapReport, Option<Obsolete>), ZapError> {
        let mut report = ZapReport {
            mode,
            started: at,
            ended: at,
            ..ZapReport::default()
        };
        let left = match mode {
            ZapMode::Slow => {
                let mut guard = self.lock.hold_for_zap(at, costs);
                let pages = guard.headers.all_top_down();
                let work = zap_pages(mem, frames, &mut guard, &pages)?;
                report.add_hold(&mut guard, work, costs);
                None
            }
            ZapMode::Fast => {
                // The bump and the first batch share a hold, as in KVM.
                let (mut guard, mut obsolete) = self.invalidate_all(at, costs);
                let work = self.zap_obsolete_batch(mem, frames, &mut guard, &mut obsolete)?;
                report.add_hold(&mut guard, work, costs);
                (!obsolete.is_done()).then_some(obsolete)
            }
            ZapMode::Seed => {
                let mut guard = self.lock.hold_for_zap(at, costs);
                let seed = seed_reset(mem, frames, &mut guard, rmap_bytes)?;
                guard.charge(seed.held_cycles(costs));
                report.pages_zapped += seed.pages_freed;
                report.sptes_zapped += seed.leaves;
                report.lock_holds += 1;
                report.seed = Some(seed.work);
                // The old pages go back to the allocator after the lock
                // is released, still in the ioctl's thread.
                report.ended = guard.granted() + guard.held() + Cycles(seed.free_cycles(costs));
                None
            }
        };
        report.lock_breaks = report.lock_holds.saturating_sub(1);
        Ok((report, left))
    }

    /// The next batch of a fast zap's teardown, asking for `mmu_lock` at
    /// `at` (after a lock break).
    pub(crate) fn zap_batch(
        &self,
        mem: &PhysMemory,
        frames: &mut FrameAllocator,
        costs: &HvCosts,
        report: &mut ZapReport,
        obsolete: &mut Obsolete,
        at: Cycles,
    ) -> Result<(), ZapError> {
        let mut guard = self.lock.hold_for_zap(at, costs);
        let work = self.zap_obsolete_batch(mem, frames, &mut guard, obsolete)?;
        report.add_hold(&mut guard, work, costs);
        report.lock_breaks = report.lock_holds.saturating_sub(1);
        Ok(())
    }

    /// The first step of a fast zap: takes `mmu_lock` at `at` and bumps the
    /// MMU generation, making every root and page made before obsolete.
    /// Returns the hold (the first batch goes in it) and the obsolete
    /// pages.
    pub(crate) fn invalidate_all(&self, at: Cycles, costs: &HvCosts) -> (MmuGuard<'_>, Obsolete) {
        let guard = self.lock.hold_for_zap(at, costs);
        // Changed under the lock; vCPUs read it without (see `Mmu`).
        let generation = self
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel)
            + 1;
        let pages = guard.headers.obsolete(generation);
        let mut guard = guard;
        guard.shadow.pages.invalidate_all();
        (guard, Obsolete { pages, next: 0 })
    }

    /// Frees the next [`BATCH_ZAP_PAGES`] obsolete pages under `guard`.
    fn zap_obsolete_batch(
        &self,
        mem: &PhysMemory,
        frames: &mut FrameAllocator,
        guard: &mut MmuGuard<'_>,
        obsolete: &mut Obsolete,
    ) -> Result<ZapWork, MemError> {
        let end = (obsolete.next + BATCH_ZAP_PAGES).min(obsolete.pages.len());
        let batch = &obsolete.pages[obsolete.next..end];
        obsolete.next = end;
        zap_pages(mem, frames, guard, batch)
    }
}

impl ZapReport {
    /// Charges `work` to the hold and counts it; returns when the hold
    /// ends.
    fn add_hold(&mut self, guard: &mut MmuGuard<'_>, work: ZapWork, costs: &HvCosts) -> Cycles {
        guard.charge(work.cycles(costs));
        self.pages_zapped += work.pages;
        self.sptes_zapped += work.leaves;
        self.lock_holds += 1;
        self.ended = guard.granted() + guard.held();
        self.ended
    }
}

/// A seed zap's work and, for the report, the leaves it dropped.
struct SeedReset {
    work: SeedWork,
    leaves: u64,
}

impl std::ops::Deref for SeedReset {
    type Target = SeedWork;
    fn deref(&self) -> &SeedWork {
        &self.work
    }
}

/// Seed 003's v2 under `inner`'s hold: counts the work the seed charges
/// ([`SeedWork`]) and drops every page (host-time bookkeeping, uncharged).
fn seed_reset(
    mem: &PhysMemory,
    frames: &mut FrameAllocator,
    inner: &mut MmuInner,
    rmap_bytes: u64,
) -> Result<SeedReset, MemError> {
    let mut work = SeedWork {
        bytes_zeroed: SEED_HASH_BYTES + rmap_bytes,
        ..SeedWork::default()
    };
    let roots: Vec<Hfn> = inner.roots.iter().map(|r| r.pml4).collect();
    for root in roots {
        for i in 0..ENTRIES {
            work.root_entries_read += 1;
            if spte::is_present(read_spte(mem, entry_at(root.addr(), i))?) {
                work.root_entries_cleared += 1;
            }
        }
    }
    let pages = inner.headers.all_top_down();
    let dropped = zap_pages(mem, frames, inner, &pages)?;
    work.pages_freed = dropped.pages;
    Ok(SeedReset {
        work,
        leaves: dropped.leaves,
    })
}

fn zap_pages(
    mem: &PhysMemory,
    frames: &mut FrameAllocator,
    inner: &mut MmuInner,
    pages: &[Hfn],
) -> Result<ZapWork, MemError> {
    let mut work = ZapWork::default();
    for &page in pages {
        zap_page(mem, frames, inner, page, &mut work)?;
    }
    Ok(work)
}

/// Tears one page down (KVM's `kvm_mmu_prepare_zap_page` and the commit
/// that frees it): every present entry cleared (a leaf leaves the rmap, a
/// child table loses its parent link), the parent's entry to it cleared,
/// the frame freed, the header (and, for a top table, the root) forgotten.
fn zap_page(
    mem: &PhysMemory,
    frames: &mut FrameAllocator,
    inner: &mut MmuInner,
    page: Hfn,
    work: &mut ZapWork,
) -> Result<(), MemError> {
    let Some(header) = inner.headers.get(page).copied() else {
        return Ok(());
    };
    for i in 0..ENTRIES {
        let at = entry_at(page.addr(), i);
        work.entries_read += 1;
        if !spte::is_present(read_spte(mem, at)?) {
            continue;
        }
        // Atomic: the CPU may set A/D bits concurrently.
        let old = exchange_spte(mem, at, 0)?;
        if header.role.level == 1 || old & spte::HUGE != 0 {
            inner.rmap.remove_leaf(spte::frame(old), at, old);
            inner.shadow.pages.forget_leaf(at);
            work.leaves += 1;
        } else {
            if let Some(child) = inner.headers.get_mut(spte::frame(old)) {
                if child.parent == Some(at) {
                    child.parent = None;
                }
            }
            work.links += 1;
        }
    }
    match header.parent {
        Some(parent) => {
            let link = read_spte(mem, parent)?;
            if spte::is_present(link) && spte::frame(link) == page {
                exchange_spte(mem, parent, 0)?;
                work.links += 1;
            }
        }
        None => {
            if let Some(root) = inner.roots.by_table(page) {
                inner.roots.remove(root);
            }
        }
    }
    inner.headers.remove(page);
    inner.shadow.pages.forget_page(page);
    frames.free(page);
    work.pages += 1;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memslot::{Memslots, SlotFlags, SlotId};
    use crate::mmu::page::PageRole;
    use machine::Gfn;

    /// An MMU with `gfns` mapped in its root (gfn g to frame 10_000 + g),
    /// host memory, frames and a memslot covering them.
    fn mapped(gfns: &[u64]) -> (Mmu, PhysMemory, FrameAllocator, Memslots) {
        let mem = PhysMemory::new(16 << 20).unwrap();
        let mut frames = FrameAllocator::new(Hfn(1), Hfn(2048));
        let mmu = Mmu::new(&mem, &mut frames, super::super::MmuMode::Ept).unwrap();
        let mut slots = Memslots::default();
        slots
            .add(SlotId(0), Gfn(0), 1 << 21, SlotFlags::default())
            .unwrap();
        let costs = HvCosts::DEFAULT;
        let root = mmu
            .load_root(
                &mem,
                &mut frames,
                &costs,
                None,
                super::super::lock::Timed::Untimed,
            )
            .unwrap()
            .0
            .id;
        for (i, &g) in gfns.iter().enumerate() {
            let frame = Hfn(3000 + i as u64);
            slots.lookup_mut(Gfn(g)).unwrap().set_backing(Gfn(g), frame);
            let mapped = mmu.map_gfn(
                &mem,
                &mut frames,
                &costs,
                root,
                Gfn(g),
                frame,
                crate::mmu::fault::LeafWrite::Writable,
                false,
                false,
                Cycles::ZERO,
            );
            assert_eq!(mapped.result, Ok(true));
        }
        (mmu, mem, frames, slots)
    }

    /// Gfns spread over several leaf tables and upper-level entries.
    const GFNS: [u64; 9] = [0, 1, 511, 512, 1024, 5000, 70_000, 300_000, 1 << 20];

    #[test]
    fn fast_zap_frees_every_obsolete_page_in_batches_and_the_checker_holds_after_each() {
        let (mmu, mem, mut frames, slots) = mapped(&GFNS);
        let costs = HvCosts::DEFAULT;
        let tables = mmu.table_count(&costs);
        let in_use = frames.in_use();
        assert!(
            tables > BATCH_ZAP_PAGES as u64,
            "{tables} tables: several batches"
        );
        let (mut guard, mut obsolete) = mmu.invalidate_all(Cycles(1000), &costs);
        assert_eq!(mmu.generation(), 1);
        assert_eq!(obsolete.pages.len() as u64, tables);
        let mut batches = 0;
        while !obsolete.is_done() {
            let work = mmu
                .zap_obsolete_batch(&mem, &mut frames, &mut guard, &mut obsolete)
                .unwrap();
            assert!(work.pages <= BATCH_ZAP_PAGES as u64);
            batches += 1;
            drop(guard);
            mmu.check(&mem, &slots, &costs).unwrap();
            guard = mmu.hold(super::super::lock::Timed::Untimed, &costs);
        }
        drop(guard);
        assert_eq!(batches, tables.div_ceil(BATCH_ZAP_PAGES as u64));
        assert_eq!(mmu.table_count(&costs), 0);
        assert_eq!(frames.in_use(), in_use - tables, "every table frame freed");
        let inner = mmu.hold(super::super::lock::Timed::Untimed, &costs);
        assert_eq!(inner.rmap.iter().count(), 0);
        assert_eq!(inner.roots.iter().count(), 0);
        assert!(inner.roots.find_valid(PageRole::TDP_ROOT, 1).is_none());
    }

    #[test]
    fn slow_and_fast_do_the_same_work_but_fast_breaks_the_lock() {
        let costs = HvCosts::DEFAULT;
        let mut reports = Vec::new();
        for mode in [ZapMode::Slow, ZapMode::Fast] {
            let (mmu, mem, mut frames, slots) = mapped(&GFNS);
            let tables = mmu.table_count(&costs);
            let report = mmu
                .zap_all(&mem, &mut frames, &costs, mode, 0, Cycles(10_000))
                .unwrap();
            mmu.check(&mem, &slots, &costs).unwrap();
            assert_eq!(report.pages_zapped, tables);
            assert_eq!(report.sptes_zapped, GFNS.len() as u64);
            assert_eq!(mmu.table_count(&costs), 0);
            reports.push(report);
        }
        let (slow, fast) = (reports[0], reports[1]);
        assert_eq!((slow.lock_holds, slow.lock_breaks), (1, 0));
        assert_eq!(
            fast.lock_holds,
            slow.pages_zapped.div_ceil(BATCH_ZAP_PAGES as u64)
        );
        assert_eq!(fast.lock_breaks, fast.lock_holds - 1);
        // The same work, plus one acquisition per lock break.
        assert_eq!(
            fast.cycles(),
            slow.cycles() + Cycles(fast.lock_breaks * costs.lock_acquire)
        );
    }

    #[test]
    fn a_vcpu_waits_for_the_whole_slow_zap_but_one_fast_batch() {
        let costs = HvCosts::DEFAULT;
        for mode in [ZapMode::Slow, ZapMode::Fast] {
            let (mmu, mem, mut frames, _) = mapped(&GFNS);
            let report = mmu
                .zap_all(&mem, &mut frames, &costs, mode, 0, Cycles(10_000))
                .unwrap();
            // A vCPU asking for the lock just after the zap started.
            let guard = mmu.hold(
                super::super::lock::Timed::At(Cycles(10_000 + costs.lock_acquire)),
                &costs,
            );
            let waited = guard.zap_waited();
            drop(guard);
            match mode {
                ZapMode::Slow => assert_eq!(
                    waited + Cycles(10_000 + 2 * costs.lock_acquire),
                    report.ended
                ),
                ZapMode::Fast => {
                    let per_batch = report.cycles().0 / report.lock_holds;
                    assert!(waited.0 > 0 && waited.0 <= 2 * per_batch, "{waited:?}");
                }
                ZapMode::Seed => unreachable!("not in this test's modes"),
            }
        }
    }

    #[test]
    fn every_mode_leaves_the_mmu_empty_and_consistent() {
        let costs = HvCosts::DEFAULT;
        for mode in [ZapMode::Slow, ZapMode::Fast, ZapMode::Seed] {
            let (mmu, mem, mut frames, slots) = mapped(&GFNS);
            let tables = mmu.table_count(&costs);
            let in_use = frames.in_use();
            let report = mmu
                .zap_all(&mem, &mut frames, &costs, mode, 0, Cycles(10_000))
                .unwrap();
            mmu.check(&mem, &slots, &costs).unwrap();
            assert_eq!(report.pages_zapped, tables, "{mode:?}");
            assert_eq!(report.sptes_zapped, GFNS.len() as u64, "{mode:?}");
            assert_eq!(mmu.table_count(&costs), 0, "{mode:?}");
            assert_eq!(frames.in_use(), in_use - tables, "{mode:?}: frames freed");
            let inner = mmu.hold(super::super::lock::Timed::Untimed, &costs);
            assert_eq!(inner.rmap.iter().count(), 0, "{mode:?}");
            assert_eq!(inner.roots.iter().count(), 0, "{mode:?}");
            assert_eq!(inner.headers.len(), 0, "{mode:?}");
        }
    }

    #[test]
    fn a_seed_zap_takes_what_its_charges_add_up_to() {
        let costs = HvCosts::DEFAULT;
        let (mmu, mem, mut frames, slots) = mapped(&GFNS);
        let tables = mmu.table_count(&costs);
        // The fixture's one slot of 2^21 pages: rmap entries of 8 bytes
        // for 4 KiB, 2 MiB and 1 GiB pages.
        let rmap_bytes = seed_rmap_bytes(&slots);
        assert_eq!(rmap_bytes, ((1 << 21) + (1 << 12) + (1 << 3)) * 8);
        let report = mmu
            .zap_all(
                &mem,
                &mut frames,
                &costs,
                ZapMode::Seed,
                rmap_bytes,
                Cycles(10_000),
            )
            .unwrap();
        let work = report.seed.expect("a seed zap reports its work");
        // One root, every gfn of the fixture under its first entry.
        assert_eq!(work.root_entries_read, ENTRIES);
        assert_eq!(work.root_entries_cleared, 1);
        assert_eq!(work.bytes_zeroed, SEED_HASH_BYTES + rmap_bytes);
        assert_eq!(work.pages_freed, tables);
        assert_eq!((report.lock_holds, report.lock_breaks), (1, 0));
        let zeroing = (SEED_HASH_BYTES + rmap_bytes).div_ceil(4096) * costs.zero_4k;
        assert_eq!(
            report.cycles().0,
            costs.lock_acquire
                + ENTRIES * costs.spte_read
                + costs.spte_write
                + zeroing
                + tables * costs.frame_free
        );
        // A vCPU asking for the lock just after waits for the hold only,
        // not the freeing after it.
        let guard = mmu.hold(
            super::super::lock::Timed::At(Cycles(10_000 + costs.lock_acquire)),
            &costs,
        );
        assert_eq!(
            guard.zap_waited() + Cycles(10_000 + 2 * costs.lock_acquire),
            report.ended - Cycles(tables * costs.frame_free)
        );
    }

    #[test]
    fn the_seed_zap_skips_the_per_entry_teardown_slow_pays_for() {
        let costs = HvCosts::DEFAULT;
        let mut cycles = Vec::new();
        for mode in [ZapMode::Slow, ZapMode::Seed] {
            let (mmu, mem, mut frames, _) = mapped(&GFNS);
            let report = mmu
                .zap_all(&mem, &mut frames, &costs, mode, 0, Cycles(0))
                .unwrap();
            cycles.push(report.cycles().0);
        }
        // Slow reads every entry of every table; the seed reads the
        // root's and zeroes 8 KiB of hash table.
        assert!(cycles[1] < cycles[0], "{cycles:?}");
    }
}
