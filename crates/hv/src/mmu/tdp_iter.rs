//! The TDP iterator: every present entry of one hierarchy that translates
//! some gfn of a range, parents before their children (KVM's
//! `tdp_iter`/`for_each_tdp_pte`).
//!
//! Zapping a gfn range, the invariant checker and (later) dirty logging's
//! write-protection and zap-by-generation's teardown all walk with it. The
//! iterator reads entries as it goes, so a caller may clear the leaf it was
//! just given; clearing a non-leaf entry it was given also skips that
//! table's children (they are read through the cleared entry).

use super::page::{entry_span, ENTRIES, ROOT_LEVEL};
use super::spte;
use super::tdp::{entry_at, read_spte};
use machine::{Gfn, Hfn, Hpa, MemError, PhysMemory};
use std::ops::Range;

/// One present entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TdpEntry {
    /// Where the entry is.
    pub at: Hpa,
    /// The first gfn it translates.
    pub gfn: Gfn,
    /// The level of the table holding it (1: a 4 KiB leaf).
    pub level: u8,
    /// Its value when read.
    pub spte: u64,
}

impl TdpEntry {
    /// Whether it maps a page (rather than pointing at a table).
    pub fn is_leaf(&self) -> bool {
        self.level == 1 || self.spte & spte::HUGE != 0
    }
}

/// One table being walked.
#[derive(Debug, Clone, Copy)]
struct Frame {
    table: Hpa,
    level: u8,
    /// First gfn of the table.
    base: u64,
    /// Next entry index to look at.
    next: u64,
}

/// Iterator over the present entries of a hierarchy within a gfn range.
pub(crate) struct TdpIter<'a> {
    mem: &'a PhysMemory,
    range: Range<u64>,
    stack: Vec<Frame>,
    /// The non-leaf entry yielded last, whose table is entered next.
    descend: Option<TdpEntry>,
}

impl<'a> TdpIter<'a> {
    /// Walks the hierarchy at `pml4` over `range`.
    #[cfg(test)]
    pub fn new(mem: &'a PhysMemory, pml4: Hfn, range: Range<Gfn>) -> Self {
        Self::below(mem, pml4, ROOT_LEVEL, Gfn(0), range)
    }

    /// Walks the hierarchy below the table `table` at `level`, whose
    /// first gfn is `base`, over the part of `range` it translates: a
    /// detached subtree, as a zap-all's teardown leaves them.
    pub fn below(mem: &'a PhysMemory, table: Hfn, level: u8, base: Gfn, range: Range<Gfn>) -> Self {
        let mut stack = Vec::with_capacity(ROOT_LEVEL as usize);
        let start = range.start.0.max(base.0);
        if start < range.end.0 {
            stack.push(Frame {
                table: table.addr(),
                level,
                base: base.0,
                next: (start - base.0) / entry_span(level) % ENTRIES,
            });
        }
        let range = Gfn(start)..range.end;
        TdpIter {
            mem,
            range: range.start.0..range.end.0,
            stack,
            descend: None,
        }
    }

    fn step(&mut self) -> Result<Option<TdpEntry>, MemError> {
        if let Some(parent) = self.descend.take() {
            // Re-read: the caller may have cleared it.
            let now = read_spte(self.mem, parent.at)?;
            if spte::is_present(now) && now & spte::HUGE == 0 {
                let level = parent.level - 1;
                let first = self.range.start.max(parent.gfn.0);
                self.stack.push(Frame {
                    table: Hpa(spte::hpa(now)),
                    level,
                    base: parent.gfn.0,
                    next: (first - parent.gfn.0) / entry_span(level),
                });
            }
        }
        while let Some(frame) = self.stack.last_mut() {
            let span = entry_span(frame.level);
            let gfn = frame.base + frame.next * span;
            if frame.next >= ENTRIES || gfn >= self.range.end {
                self.stack.pop();
                continue;
            }
            let at = entry_at(frame.table, frame.next);
            frame.next += 1;
            let value = read_spte(self.mem, at)?;
            if !spte::is_present(value) {
                continue;
            }
            let entry = TdpEntry {
                at,
                gfn: Gfn(gfn),
                level: frame.level,
                spte: value,
            };
            if !entry.is_leaf() {
                self.descend = Some(entry);
            }
            return Ok(Some(entry));
        }
        Ok(None)
    }
}

impl Iterator for TdpIter<'_> {
    type Item = Result<TdpEntry, MemError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.step().transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mmu::tdp::tests::one_root;
    use crate::mmu::tdp::{leaf_for, write_spte, WalkWork};
    use machine::Gpa;

    #[test]
    fn visits_exactly_the_present_entries_of_the_range_parents_first() {
        let (mem, mut frames, mut headers, root) = one_root(256);
        // Leaves in two 2 MiB blocks and one far away (another PDPT entry).
        let gfns = [5u64, 6, 511, 512, 700, 1 << 20];
        for &g in &gfns {
            let mut w = WalkWork::default();
            let at = leaf_for(&mem, &mut frames, &mut headers, &root, Gfn(g), &mut w).unwrap();
            write_spte(&mem, at, spte::make_leaf(0x1000 * (g + 1), true, true)).unwrap();
        }
        let leaves = |range: Range<u64>| {
            TdpIter::new(&mem, root.pml4, Gfn(range.start)..Gfn(range.end))
                .map(Result::unwrap)
                .filter(|e| e.is_leaf())
                .map(|e| e.gfn.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(leaves(0..Gpa(u64::MAX).frame().0), gfns);
        assert_eq!(leaves(6..513), [6, 511, 512]);
        assert_eq!(leaves(513..700), Vec::<u64>::new());
        assert_eq!(leaves(701..(1 << 20) + 1), [1 << 20]);
        // Parents come first: the whole walk of [5, 7) is PML4E, PDPTE,
        // PDE, then the two leaves.
        let levels: Vec<u8> = TdpIter::new(&mem, root.pml4, Gfn(5)..Gfn(7))
            .map(|e| e.unwrap().level)
            .collect();
        assert_eq!(levels, [4, 3, 2, 1, 1]);
    }
}
