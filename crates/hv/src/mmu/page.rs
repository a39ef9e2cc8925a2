//! Page headers: what the MMU knows about each of its page tables (KVM's
//! `struct kvm_mmu_page`).
//!
//! The hardware table is a 4 KiB frame of entries; its header lives beside
//! it, keyed by the frame: the level, the first gfn it translates, its role,
//! the MMU generation it was made in, the entry that points at it (its
//! parent link) and the root it belongs to. Zapping a root by generation,
//! shadow pages keyed by (gfn, role) and the invariant checker all start
//! from these headers rather than from the raw tables.

use super::root::RootId;
use machine::{Gfn, Hfn, Hpa};
use std::collections::BTreeMap;

/// Levels of the EPT hierarchy: 4 = PML4 ... 1 = the page table of 4 KiB
/// leaves.
pub(crate) const ROOT_LEVEL: u8 = 4;

/// Entries per table.
pub(crate) const ENTRIES: u64 = 512;

/// Gfns one entry of a table at `level` spans.
pub(crate) const fn entry_span(level: u8) -> u64 {
    1 << (9 * (level as u32 - 1))
}

/// How a table translates: KVM's `kvm_mmu_page_role`, reduced to what the
/// TDP MMU distinguishes today. The shadow MMU adds the guest's paging
/// context (CR0.WP, NX, SMEP, the guest access bits) here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PageRole {
    /// Level of the table (4 for a root).
    pub level: u8,
    /// Direct: translates gfns to frames without a guest table behind it
    /// (every TDP page; shadow pages of guest huge pages).
    pub direct: bool,
    /// A shadow page's guest paging context and access (`None` for TDP).
    pub shadow: Option<super::shadow::role::ShadowRole>,
}

impl PageRole {
    /// The role of a TDP root.
    pub const TDP_ROOT: PageRole = PageRole {
        level: ROOT_LEVEL,
        direct: true,
        shadow: None,
    };

    /// The role of a child table one level down.
    pub const fn child(self) -> PageRole {
        PageRole {
            level: self.level - 1,
            direct: self.direct,
            shadow: self.shadow,
        }
    }
}

/// The header of one MMU page table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PageHeader {
    pub role: PageRole,
    /// The first gfn the table translates.
    pub gfn: Gfn,
    /// The MMU generation when the table was made; older than the MMU's
    /// generation means obsolete (zap-all by generation).
    pub generation: u64,
    /// The entry pointing at this table; `None` for a root.
    pub parent: Option<Hpa>,
    /// The root whose hierarchy holds the table.
    pub root: RootId,
}

/// Headers of every table, by frame.
#[derive(Debug, Default)]
pub(crate) struct PageHeaders {
    by_frame: BTreeMap<Hfn, PageHeader>,
}

impl PageHeaders {
    pub fn insert(&mut self, frame: Hfn, header: PageHeader) {
        self.by_frame.insert(frame, header);
    }

    pub fn get(&self, frame: Hfn) -> Option<&PageHeader> {
        self.by_frame.get(&frame)
    }

    pub fn get_mut(&mut self, frame: Hfn) -> Option<&mut PageHeader> {
        self.by_frame.get_mut(&frame)
    }

    /// Forgets the header of a table being freed.
    pub fn remove(&mut self, frame: Hfn) -> Option<PageHeader> {
        self.by_frame.remove(&frame)
    }

    /// The tables made before `generation` (obsolete once the MMU is in
    /// it), parents before children: highest level first, then by frame.
    /// This is the order the teardown frees them in, so each page's
    /// children are unlinked before their turn comes.
    pub fn obsolete(&self, generation: u64) -> Vec<Hfn> {
        let mut pages: Vec<(std::cmp::Reverse<u8>, Hfn)> = self
            .by_frame
            .iter()
            .filter(|(_, h)| h.generation < generation)
            .map(|(&f, h)| (std::cmp::Reverse(h.role.level), f))
            .collect();
        pages.sort_unstable();
        pages.into_iter().map(|(_, f)| f).collect()
    }

    /// Every table, parents before children (the teardown order of a
    /// zap-all that does not go by generation).
    pub fn all_top_down(&self) -> Vec<Hfn> {
        self.obsolete(u64::MAX)
    }

    /// Every table, in frame order.
    pub fn iter(&self) -> impl Iterator<Item = (Hfn, &PageHeader)> {
        self.by_frame.iter().map(|(&f, h)| (f, h))
    }

    /// Tables in use.
    pub fn len(&self) -> usize {
        self.by_frame.len()
    }
}
