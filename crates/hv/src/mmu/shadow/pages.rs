//! Shadow pages: the hash by (gfn, role), parent links, the page tracker
//! and the zap of a page (KVM's `kvm_mmu_get_shadow_page`,
//! `kvm_mmu_prepare_zap_page`, `kvm_slot_page_track_*`).
//!
//! Every shadow table has a [`PageHeader`] in the MMU's headers (level,
//! gfn, role, generation) like a TDP table; what only shadow pages have is
//! kept here: the parent links (a shadow page is shared by every entry that
//! reaches the same guest table with the same role, so it may have many),
//! whether it is unsync, and the root object if it is a root.
//!
//! The page tracker: a gfn shadowed by a sync indirect page is
//! write-tracked, and every spte mapping it is read-only, so a guest write
//! to its own page table faults and the shadow hears of it.

use super::super::page::{PageHeader, PageHeaders, PageRole};
use super::super::rmap::Rmap;
use super::super::root::{RootId, Roots};
use super::super::tdp::{entry_at, exchange_spte, read_spte, write_spte};
use super::spte;
use crate::frames::{FrameAllocator, OutOfFrames};
use crate::memslot::{Memslots, PageState};
use machine::{Gfn, Hfn, Hpa, MemError, PhysMemory};
use std::collections::BTreeMap;

/// What only shadow pages carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShadowPage {
    /// The guest table's gfn (direct: the first gfn translated).
    pub gfn: Gfn,
    pub role: PageRole,
    /// Entries pointing at this page.
    pub parents: Vec<Hpa>,
    /// A leaf guest table left writable: its sptes may be stale until the
    /// next sync.
    pub unsync: bool,
    /// The root object, for a root.
    pub root: Option<RootId>,
    /// Made before a fast zap-all, waiting for its teardown.
    pub obsolete: bool,
}

/// Side effects of a change, for the caller to act on and charge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Effects {
    /// A present spte was cleared or restricted: every vCPU must flush.
    pub flush: bool,
    /// A root was zapped: every vCPU must load its root again.
    pub reload: bool,
    /// sptes read.
    pub reads: u64,
    /// sptes written.
    pub writes: u64,
    /// Tables allocated.
    pub allocated: u64,
    /// Other work under the lock, in cycles (a fault's
    /// `mmu::fault::locked_fault_work`).
    pub work: u64,
}

impl Effects {
    pub fn merge(&mut self, o: Effects) {
        self.flush |= o.flush;
        self.reload |= o.reload;
        self.reads += o.reads;
        self.writes += o.writes;
        self.allocated += o.allocated;
        self.work += o.work;
    }
}

/// Why a shadow operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShadowError {
    #[error("allocating a shadow page: {0}")]
    OutOfFrames(#[from] OutOfFrames),
    #[error("shadow table access outside host memory: {0:?}")]
    Memory(MemError),
}

impl From<MemError> for ShadowError {
    fn from(e: MemError) -> Self {
        ShadowError::Memory(e)
    }
}

/// Every shadow page.
#[derive(Debug, Default)]
pub(crate) struct ShadowPages {
    by_key: BTreeMap<(Gfn, PageRole), Hfn>,
    /// Indirect pages by the guest table they shadow.
    by_gfn: BTreeMap<Gfn, Vec<Hfn>>,
    pages: BTreeMap<Hfn, ShadowPage>,
    /// The gfn each shadow leaf maps.
    leaf_gfn: BTreeMap<Hpa, Gfn>,
    /// Writes emulated to each tracked gfn since a walk last went through
    /// one of its pages (KVM's `write_flooding_count`).
    pub flood: BTreeMap<Gfn, u32>,
    /// The seed's scheme for indirect leaves is on (`MmuOptions::
    /// seed_indirect`): the page tracker's write-protect path runs
    /// `protocol::seed_write_protect` with the gfn's flag.
    pub seed_indirect: bool,
    /// No page goes unsync (`VmConfig::shadow_unsync` off): a write to a
    /// shadowed guest table is always emulated.
    pub never_unsync: bool,
    /// The seed's per-gfn write-protect flag (its `PTE_LIST_WRITE_PROTECT`
    /// in the rmap head), set by the page tracker's write-protect path and
    /// read by the fast path without `mmu_lock`. Once set it stays set (a
    /// gfn that was a guest page table keeps taking the slow path for
    /// writes through indirect leaves: conservative, never wrong).
    seed_flags: BTreeMap<Gfn, std::sync::Arc<std::sync::atomic::AtomicU64>>,
}

/// The tables a shadow operation works on (`mmu_lock` held).
pub(crate) struct Tables<'a> {
    pub mem: &'a PhysMemory,
    pub frames: &'a mut FrameAllocator,
    pub slots: &'a Memslots,
    pub headers: &'a mut PageHeaders,
    pub roots: &'a mut Roots,
    pub rmap: &'a mut Rmap,
    pub pages: &'a mut ShadowPages,
    pub generation: u64,
}

impl ShadowPages {
    pub fn get(&self, frame: Hfn) -> Option<&ShadowPage> {
        self.pages.get(&frame)
    }

    pub fn find(&self, gfn: Gfn, role: PageRole) -> Option<Hfn> {
        self.by_key.get(&(gfn, role)).copied()
    }

    /// Indirect pages shadowing `gfn`.
    pub fn of_gfn(&self, gfn: Gfn) -> &[Hfn] {
        self.by_gfn.get(&gfn).map_or(&[], Vec::as_slice)
    }

    /// Every shadow page, in frame order.
    pub fn iter(&self) -> impl Iterator<Item = (Hfn, &ShadowPage)> {
        self.pages.iter().map(|(&f, p)| (f, p))
    }

    /// Whether writes to `gfn` must fault: a sync indirect page shadows it.
    pub fn write_tracked(&self, gfn: Gfn) -> bool {
        self.of_gfn(gfn).iter().any(|f| !self.pages[f].unsync)
    }

    /// The seed's write-protect flag of `gfn` (made clear on first use).
    pub fn seed_flag(&mut self, gfn: Gfn) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        self.seed_flags.entry(gfn).or_default().clone()
    }

    /// The gfn a shadow leaf maps.
    pub fn leaf_gfn(&self, at: Hpa) -> Option<Gfn> {
        self.leaf_gfn.get(&at).copied()
    }

    /// Records the gfn of a shadow leaf.
    pub fn set_leaf(&mut self, at: Hpa, gfn: Gfn) {
        self.leaf_gfn.insert(at, gfn);
    }

    /// A leaf was zapped by the notifier (no-op for a TDP leaf).
    pub fn forget_leaf(&mut self, at: Hpa) {
        self.leaf_gfn.remove(&at);
    }

    /// A page freed by a zap-all (`mmu/zap.rs`, which tears pages down by
    /// their headers): forgets it (no-op for a TDP table).
    pub fn forget_page(&mut self, frame: Hfn) {
        let Some(page) = self.pages.remove(&frame) else {
            return;
        };
        if self.by_key.get(&(page.gfn, page.role)) == Some(&frame) {
            self.by_key.remove(&(page.gfn, page.role));
        }
        if let Some(list) = self.by_gfn.get_mut(&page.gfn) {
            list.retain(|&f| f != frame);
            if list.is_empty() {
                self.by_gfn.remove(&page.gfn);
            }
        }
    }

    /// A fast zap-all made every page obsolete (`mmu/zap.rs`): none is
    /// found again (a fault makes new ones); each is forgotten when the
    /// teardown frees it.
    pub fn invalidate_all(&mut self) {
        self.by_key.clear();
        self.by_gfn.clear();
        self.flood.clear();
        for page in self.pages.values_mut() {
            page.obsolete = true;
            page.unsync = false;
        }
    }

    /// Every shadow leaf and its gfn.
    pub fn leaves(&self) -> impl Iterator<Item = (Hpa, Gfn)> + '_ {
        self.leaf_gfn.iter().map(|(&a, &g)| (a, g))
    }

    /// Unsync pages, in frame order.
    pub fn unsync(&self) -> Vec<Hfn> {
        self.pages
            .iter()
            .filter(|(_, p)| p.unsync)
            .map(|(&f, _)| f)
            .collect()
    }

    pub fn set_unsync(&mut self, frame: Hfn, unsync: bool) {
        if let Some(p) = self.pages.get_mut(&frame) {
            p.unsync = unsync;
        }
    }

    pub fn add_parent(&mut self, frame: Hfn, parent: Hpa) {
        if let Some(p) = self.pages.get_mut(&frame) {
            p.parents.push(parent);
        }
    }

    /// Shadow pages per level (index 0: level 1) and unsync pages.
    pub fn counts(&self) -> ([u64; 4], u64) {
        let mut levels = [0; 4];
        let mut unsync = 0;
        for p in self.pages.values().filter(|p| !p.obsolete) {
            levels[p.role.level as usize - 1] += 1;
            unsync += p.unsync as u64;
        }
        (levels, unsync)
    }
}

impl Tables<'_> {
    /// A new, empty shadow page of (`gfn`, `role`), write-tracking `gfn`
    /// if indirect. `root`: the root object it is the table of.
    pub fn create(
        &mut self,
        gfn: Gfn,
        role: PageRole,
        root: Option<(RootId, Hfn)>,
        fx: &mut Effects,
    ) -> Result<Hfn, ShadowError> {
        let frame = match root {
            Some((_, frame)) => frame,
            None => {
                let frame = self.frames.alloc()?;
                if let Err(e) = self.mem.zero(frame.addr(), machine::addr::PAGE_SIZE) {
                    self.frames.free(frame);
                    return Err(e.into());
                }
                fx.allocated += 1;
                frame
            }
        };
        self.headers.insert(
            frame,
            PageHeader {
                role,
                gfn,
                generation: self.generation,
                parent: None,
                root: root.map_or(RootId(u32::MAX), |(id, _)| id),
            },
        );
        if !role.direct {
            // An upper-level table of a gfn cannot coexist with unsync leaf
            // tables of it (KVM zaps them): the gfn must stay tracked.
            if role.level > 1 {
                let unsync: Vec<Hfn> = self
                    .pages
                    .of_gfn(gfn)
                    .iter()
                    .copied()
                    .filter(|f| self.pages.pages[f].unsync)
                    .collect();
                for f in unsync {
                    let z = self.zap(f)?;
                    fx.merge(z);
                }
            }
            self.pages.by_gfn.entry(gfn).or_default().push(frame);
        }
        self.pages.by_key.insert((gfn, role), frame);
        self.pages.pages.insert(
            frame,
            ShadowPage {
                gfn,
                role,
                parents: Vec::new(),
                unsync: false,
                root: root.map(|(id, _)| id),
                obsolete: false,
            },
        );
        if !role.direct {
            let wp = self.write_protect(gfn)?;
            fx.merge(wp);
        }
        Ok(frame)
    }

    /// Makes every spte mapping `gfn` read-only (the page tracker).
    pub fn write_protect(&mut self, gfn: Gfn) -> Result<Effects, ShadowError> {
        let mut fx = Effects::default();
        let Some(PageState::Resident(frame)) = self.slots.lookup(gfn).map(|s| s.state(gfn)) else {
            return Ok(fx);
        };
        use crate::mmu::fast_pf::protocol::{self, Layout, Protect};
        let flag = self.pages.seed_indirect.then(|| self.pages.seed_flag(gfn));
        for &at in self.rmap.get(frame) {
            let cell = self.mem.atomic_u64(at)?;
            let mut changed = false;
            if let Some(flag) = &flag {
                // The seed's write-protect path: the flag, smp_mb(), then W
                // and any vCPU's identification cleared (a fast fix that
                // tagged the spte then fails its final cmpxchg). Its store
                // and barrier are priced as one more spte write.
                changed = protocol::seed_write_protect(cell, &**flag, &Layout::SHADOW);
                fx.writes += 1;
            }
            // The lockless protocol's write-protect (W and MMU_WRITABLE):
            // the direct leaves' fast path trusts MMU_WRITABLE (rule 5).
            let old = protocol::write_protect(cell, &Layout::SHADOW, Protect::PageTable);
            fx.writes += 1;
            fx.flush |= changed || old & spte::WRITABLE != 0;
        }
        Ok(fx)
    }

    /// Clears the entry at `at` of shadow page `table` (of `level`): a leaf
    /// leaves the rmap; a link leaves its child's parents, and an orphaned
    /// child is zapped.
    pub fn clear_entry(&mut self, at: Hpa, level: u8) -> Result<Effects, ShadowError> {
        let mut fx = Effects::default();
        let old = exchange_spte(self.mem, at, 0)?;
        fx.writes += 1;
        if !spte::is_present(old) {
            return Ok(fx);
        }
        fx.flush = true;
        if level == 1 {
            self.rmap.remove_leaf(spte::frame(old), at, old);
            self.pages.leaf_gfn.remove(&at);
            return Ok(fx);
        }
        let child = spte::frame(old);
        let orphan = match self.pages.pages.get_mut(&child) {
            Some(p) => {
                p.parents.retain(|&a| a != at);
                p.parents.is_empty() && p.root.is_none()
            }
            None => false,
        };
        if orphan {
            let z = self.zap(child)?;
            fx.merge(z);
        }
        Ok(fx)
    }

    /// Zaps a shadow page: unlinks it from its parents, clears its
    /// entries (orphaned children go too), forgets it and frees its frame.
    /// A zapped root leaves the roots: its vCPUs must load one again.
    pub fn zap(&mut self, frame: Hfn) -> Result<Effects, ShadowError> {
        let mut fx = Effects::default();
        let Some(page) = self.pages.pages.remove(&frame) else {
            return Ok(fx);
        };
        self.pages.by_key.remove(&(page.gfn, page.role));
        if let Some(list) = self.pages.by_gfn.get_mut(&page.gfn) {
            list.retain(|&f| f != frame);
            if list.is_empty() {
                self.pages.by_gfn.remove(&page.gfn);
            }
        }
        for &parent in &page.parents {
            let old = exchange_spte(self.mem, parent, 0)?;
            fx.writes += 1;
            fx.flush |= spte::is_present(old);
        }
        for i in 0..super::super::page::ENTRIES {
            let at = entry_at(frame.addr(), i);
            fx.reads += 1;
            if spte::is_present(read_spte(self.mem, at)?) {
                let z = self.clear_entry(at, page.role.level)?;
                fx.merge(z);
            }
        }
        self.headers.remove(frame);
        if let Some(id) = page.root {
            self.roots.remove(id);
            fx.reload = true;
        }
        self.frames.free(frame);
        Ok(fx)
    }

    /// Links `child` below the entry at `at`.
    pub fn link(&mut self, at: Hpa, child: Hfn) -> Result<(), ShadowError> {
        write_spte(self.mem, at, spte::make_nonleaf(child.addr().0))?;
        self.pages.add_parent(child, at);
        Ok(())
    }
}
