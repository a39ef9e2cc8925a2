//! The TDP (two-dimensional paging) MMU: 4-level EPT tables in host memory.
//!
//! Tables are host frames from the frame allocator; entries are written
//! with atomic stores into machine memory, which is what the CPU's EPT
//! walker reads (and sets A/D in by compare-and-exchange). All structural
//! changes happen under `mmu_lock` (the caller holds it).

use super::spte;
use crate::frames::{frame_hpa, FrameAllocator, OutOfFrames};
use machine::{Gfn, Hfn, Hpa, MemError, PhysMemory};
use std::sync::atomic::Ordering;
use thiserror::Error;

/// Entries per table.
const ENTRIES: u64 = 512;

/// Failures of table management.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TdpError {
    #[error("allocating an EPT table: {0}")]
    OutOfFrames(#[from] OutOfFrames),
    #[error("EPT table access outside host memory: {0:?}")]
    Memory(MemError),
}

impl From<MemError> for TdpError {
    fn from(e: MemError) -> Self {
        TdpError::Memory(e)
    }
}

/// What a walk did, for cost accounting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalkWork {
    /// Entries read.
    pub entries_read: u64,
    /// Tables allocated (each zeroed and linked with one entry write).
    pub tables_allocated: u64,
}

/// One EPT hierarchy.
#[derive(Debug)]
pub struct TdpRoot {
    pml4: Hfn,
    /// Every table frame, root included, so teardown needs no walk.
    tables: Vec<Hfn>,
}

fn index(gfn: Gfn, level: u32) -> u64 {
    (gfn.0 >> (9 * (level - 1))) & (ENTRIES - 1)
}

fn entry_hpa(table: Hpa, gfn: Gfn, level: u32) -> Hpa {
    table.add(index(gfn, level) * 8)
}

impl TdpRoot {
    /// A new empty hierarchy (one zeroed PML4).
    pub fn new(mem: &PhysMemory, frames: &mut FrameAllocator) -> Result<Self, TdpError> {
        let pml4 = frames.alloc()?;
        mem.zero(frame_hpa(pml4), machine::addr::PAGE_SIZE)?;
        Ok(TdpRoot {
            pml4,
            tables: vec![pml4],
        })
    }

    /// Host address of the PML4 (for the EPTP).
    pub fn pml4(&self) -> Hpa {
        frame_hpa(self.pml4)
    }

    /// Table frames in use, root included.
    pub fn table_count(&self) -> usize {
        self.tables.len()
    }

    /// The address of the 4 KiB leaf spte for `gfn`, allocating missing
    /// tables on the way down.
    pub fn leaf_for(
        &mut self,
        mem: &PhysMemory,
        frames: &mut FrameAllocator,
        gfn: Gfn,
        work: &mut WalkWork,
    ) -> Result<Hpa, TdpError> {
        let mut table = self.pml4();
        for level in (2..=4).rev() {
            let slot = entry_hpa(table, gfn, level);
            let entry = mem.atomic_u64(slot)?.load(Ordering::Acquire);
            work.entries_read += 1;
            table = if spte::is_present(entry) {
                Hpa(spte::hpa(entry))
            } else {
                let frame = frames.alloc()?;
                let next = frame_hpa(frame);
                mem.zero(next, machine::addr::PAGE_SIZE)?;
                self.tables.push(frame);
                mem.atomic_u64(slot)?
                    .store(spte::make_nonleaf(next.0), Ordering::Release);
                work.tables_allocated += 1;
                next
            };
        }
        Ok(entry_hpa(table, gfn, 1))
    }

    /// The address of the leaf spte for `gfn` if its tables exist.
    pub fn find_leaf(&self, mem: &PhysMemory, gfn: Gfn) -> Result<Option<Hpa>, TdpError> {
        let mut table = self.pml4();
        for level in (2..=4).rev() {
            let entry = mem
                .atomic_u64(entry_hpa(table, gfn, level))?
                .load(Ordering::Acquire);
            if !spte::is_present(entry) {
                return Ok(None);
            }
            table = Hpa(spte::hpa(entry));
        }
        Ok(Some(entry_hpa(table, gfn, 1)))
    }

    /// Frees every table (the caller has flushed translations).
    pub fn destroy(self, frames: &mut FrameAllocator) {
        for frame in self.tables {
            frames.free(frame);
        }
    }
}

/// Reads an spte.
pub fn read_spte(mem: &PhysMemory, at: Hpa) -> Result<u64, MemError> {
    Ok(mem.atomic_u64(at)?.load(Ordering::Acquire))
}

/// Writes an spte.
pub fn write_spte(mem: &PhysMemory, at: Hpa, value: u64) -> Result<(), MemError> {
    mem.atomic_u64(at)?.store(value, Ordering::Release);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_walk_allocates_three_tables_once_and_finds_them_again() {
        let mem = PhysMemory::new(64 * 4096).unwrap();
        let mut frames = FrameAllocator::new(Hfn(1), Hfn(64));
        let mut root = TdpRoot::new(&mem, &mut frames).unwrap();
        let gfn = Gfn(0x12345);
        assert_eq!(root.find_leaf(&mem, gfn).unwrap(), None);
        let mut work = WalkWork::default();
        let leaf = root.leaf_for(&mem, &mut frames, gfn, &mut work).unwrap();
        assert_eq!(work.tables_allocated, 3);
        assert_eq!(root.table_count(), 4);
        let mut again = WalkWork::default();
        assert_eq!(
            root.leaf_for(&mem, &mut frames, gfn, &mut again).unwrap(),
            leaf
        );
        assert_eq!(
            again,
            WalkWork {
                entries_read: 3,
                tables_allocated: 0
            }
        );
        assert_eq!(root.find_leaf(&mem, gfn).unwrap(), Some(leaf));
        assert_eq!(leaf.0 & 0xfff, (gfn.0 & 511) * 8);
        root.destroy(&mut frames);
        assert_eq!(frames.in_use(), 0);
    }
}
