//! The paravirtual CR3 cache (seed 004, `--cr3-cache on`): per vCPU, a
//! guest-shared table of {guest CR3, shadow root} pairs (`abi::Cr3Cache`)
//! whose roots are also in the CPU's CR3-target list, so the guest's
//! context switch loads a cached root without a VM exit.
//!
//! The hv keeps its own copy of the entries ([`Cr3Cache::entries`]): the
//! guest's table is only what it reads, never what the hv trusts.
//!
//! **The invariant**: a root the guest may load without an exit is valid
//! and in sync. Every entry names an existing root of the current MMU
//! generation, for the vCPU's current paging context, and while any entry
//! exists no shadow page is unsync (a CR3 load is a TLB flush, which under
//! shadow paging means syncing, and a load that does not exit cannot
//! sync). So before the hv frees, zaps or obsoletes a root, or lets a page
//! go unsync, the entries go ([`Cr3Cache::clear`] on every vCPU, from the
//! scheduler's sweep after each exit), and entries are only added right
//! after the CR3 load that synced everything. `check` verifies it.

use super::cache::CachedRoot;
use super::role::PagingContext;
use crate::mmu::root::RootId;
use machine::{Gpa, Hfn};

/// Counters of one vCPU's CR3 cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cr3CacheStats {
    /// MOV-to-CR3 exits (guest CR3 loads the target list did not cover).
    pub cr3_load_exits: u64,
    /// Pairs added to the table (and the target list).
    pub entries_added: u64,
    /// Exits that found the vCPU on a root it switched to without an exit
    /// (each covers one or more such switches since the last exit).
    pub switches_seen: u64,
    /// Loads of an entry the hv had dropped while the guest looked it up
    /// (they exit; the hv loads the guest's `wanted_cr3`).
    pub stale_loads: u64,
    /// Entries dropped to keep the invariant (roots freed, obsoleted,
    /// pages unsync, paging context changed).
    pub entries_dropped: u64,
}

/// One pair the hv handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cr3Entry {
    pub root: CachedRoot,
    /// The root's top table.
    pub frame: Hfn,
    /// The MMU generation the root was made in.
    pub generation: u64,
    /// Logical time of its last use (insertion or a switch seen), for LRU.
    pub last_used: u64,
}

impl Cr3Entry {
    /// The value published as `host_cr3` and in the target list.
    pub fn host_cr3(&self) -> u64 {
        self.frame.addr().0 | abi::CR3_CACHE_HOST_MARK
    }
}

/// A vCPU's registered CR3 cache.
#[derive(Debug, Clone)]
pub(crate) struct Cr3Cache {
    /// Where the guest's `abi::Cr3Cache` is.
    pub table: Gpa,
    /// Slot i is `entry[i]` of the guest's table and target i.
    pub entries: Vec<Option<Cr3Entry>>,
    clock: u64,
}

/// Offset of `entry[i]` in `abi::Cr3Cache`.
pub(crate) fn entry_offset(i: usize) -> u64 {
    (i * std::mem::size_of::<abi::Cr3CacheEntry>()) as u64
}

/// Offset of `max_idx` in `abi::Cr3Cache`.
pub(crate) const MAX_IDX_OFFSET: u64 = std::mem::offset_of!(abi::Cr3Cache, max_idx) as u64;
/// Offset of `wanted_cr3` in `abi::Cr3Cache`.
pub(crate) const WANTED_OFFSET: u64 = std::mem::offset_of!(abi::Cr3Cache, wanted_cr3) as u64;

impl Cr3Cache {
    /// An empty cache of `targets` slots at `table`.
    pub fn new(table: Gpa, targets: usize) -> Self {
        Cr3Cache {
            table,
            entries: vec![None; targets.min(abi::CR3_CACHE_MAX)],
            clock: 0,
        }
    }

    /// The slot for a new pair: a free one, else the least recently used.
    /// Returns it and what it held.
    pub fn insert(&mut self, entry: Cr3Entry) -> (usize, Option<Cr3Entry>) {
        self.clock += 1;
        let entry = Cr3Entry {
            last_used: self.clock,
            ..entry
        };
        // The same guest CR3 and context again (its root rebuilt): replace.
        let same = self.entries.iter().position(|e| {
            e.is_some_and(|e| {
                super::cache::cr3_gfn(e.root.cr3) == super::cache::cr3_gfn(entry.root.cr3)
                    && e.root.context == entry.root.context
            })
        });
        let slot = same
            .or_else(|| self.entries.iter().position(Option::is_none))
            .unwrap_or_else(|| {
                self.entries
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, e)| e.map_or(0, |e| e.last_used))
                    .map_or(0, |(i, _)| i)
            });
        let old = self.entries[slot].replace(entry);
        (slot, old)
    }

    /// The entry whose root's top table is `frame` (a switch the guest
    /// made without an exit); marks it used.
    pub fn by_frame(&mut self, frame: Hfn) -> Option<Cr3Entry> {
        self.clock += 1;
        let clock = self.clock;
        let e = self
            .entries
            .iter_mut()
            .flatten()
            .find(|e| e.frame == frame)?;
        e.last_used = clock;
        Some(*e)
    }

    /// Whether any slot is in use.
    pub fn is_empty(&self) -> bool {
        self.entries.iter().all(Option::is_none)
    }

    /// Empties every slot; returns how many were in use.
    pub fn clear(&mut self) -> u64 {
        let n = self.entries.iter().flatten().count() as u64;
        self.entries.iter_mut().for_each(|e| *e = None);
        n
    }

    /// The CR3-target list these entries give (slot order, empty slots
    /// left out).
    pub fn targets(&self) -> Vec<u64> {
        self.entries
            .iter()
            .flatten()
            .map(Cr3Entry::host_cr3)
            .collect()
    }

    /// The entries that break the invariant against the MMU's state:
    /// `exists(id)` and `generation` say which roots are valid,
    /// `unsync_pages` how many pages are unsync now, `context` the vCPU's
    /// paging context.
    pub fn violations(
        &self,
        exists: impl Fn(RootId) -> bool,
        generation: u64,
        unsync_pages: u64,
        context: PagingContext,
    ) -> Vec<String> {
        let mut bad = Vec::new();
        for e in self.entries.iter().flatten() {
            if !exists(e.root.id) {
                bad.push(format!(
                    "entry for CR3 {:#x}: root {:?} freed",
                    e.root.cr3, e.root.id
                ));
            } else if e.generation != generation {
                bad.push(format!(
                    "entry for CR3 {:#x}: root {:?} obsolete (generation {} < {generation})",
                    e.root.cr3, e.root.id, e.generation
                ));
            }
            if e.root.context != context {
                bad.push(format!(
                    "entry for CR3 {:#x}: made for another paging context",
                    e.root.cr3
                ));
            }
        }
        if unsync_pages > 0 && !self.is_empty() {
            bad.push(format!(
                "{unsync_pages} unsync shadow pages while roots are cached"
            ));
        }
        bad
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> PagingContext {
        PagingContext::of(
            machine::cpu::state::cr0::PG | machine::cpu::state::cr0::WP,
            0,
            0,
        )
    }

    fn entry(cr3: u64, frame: u64) -> Cr3Entry {
        Cr3Entry {
            root: CachedRoot {
                cr3,
                context: ctx(),
                id: RootId(frame as u32),
            },
            frame: Hfn(frame),
            generation: 0,
            last_used: 0,
        }
    }

    #[test]
    fn fills_free_slots_then_evicts_the_least_recently_used() {
        let mut c = Cr3Cache::new(Gpa(0x1000), 2);
        assert_eq!(c.insert(entry(0x1000, 10)), (0, None));
        assert_eq!(c.insert(entry(0x2000, 11)).0, 1);
        // A switch to the first one makes the second the LRU.
        assert!(c.by_frame(Hfn(10)).is_some());
        let (slot, old) = c.insert(entry(0x3000, 12));
        assert_eq!(slot, 1);
        assert_eq!(old.map(|e| e.root.cr3), Some(0x2000));
        assert_eq!(
            c.targets(),
            vec![
                10 << 12 | abi::CR3_CACHE_HOST_MARK,
                12 << 12 | abi::CR3_CACHE_HOST_MARK
            ]
        );
    }

    #[test]
    fn the_same_cr3_replaces_its_entry() {
        let mut c = Cr3Cache::new(Gpa(0x1000), 4);
        c.insert(entry(0x1000, 10));
        assert_eq!(c.insert(entry(0x1000, 20)).0, 0);
        assert_eq!(c.targets().len(), 1);
    }

    #[test]
    fn violations_name_freed_obsolete_and_unsync() {
        let mut c = Cr3Cache::new(Gpa(0x1000), 4);
        assert!(c.violations(|_| false, 0, 1, ctx()).is_empty());
        c.insert(entry(0x1000, 10));
        assert!(c.violations(|_| true, 0, 0, ctx()).is_empty());
        assert_eq!(c.violations(|_| false, 0, 0, ctx()).len(), 1);
        assert_eq!(c.violations(|_| true, 1, 0, ctx()).len(), 1);
        assert_eq!(c.violations(|_| true, 0, 3, ctx()).len(), 1);
        assert_eq!(c.clear(), 1);
        assert!(c.violations(|_| false, 1, 3, ctx()).is_empty());
    }
}
