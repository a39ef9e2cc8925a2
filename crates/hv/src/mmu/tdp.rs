//! The TDP (two-dimensional paging) tables: 4-level EPT hierarchies in host
//! memory.
//!
//! Tables are host frames from the frame allocator; entries are written
//! with atomic stores into machine memory, which is what the CPU's EPT
//! walker reads (and sets A/D in by compare-and-exchange). All structural
//! changes happen under `mmu_lock` (the caller holds it). Every table made
//! here gets its header ([`super::page`]).

use super::page::{entry_span, PageHeader, PageHeaders, ENTRIES, ROOT_LEVEL};
use super::root::Root;
use super::spte;
use crate::frames::{FrameAllocator, OutOfFrames};
use machine::{Gfn, Hfn, Hpa, MemError, PhysMemory};
use std::sync::atomic::Ordering;
use thiserror::Error;

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
pub(crate) struct WalkWork {
    /// Entries read.
    pub entries_read: u64,
    /// Tables allocated (each zeroed and linked with one entry write).
    pub tables_allocated: u64,
}

/// Index of `gfn`'s entry in a table at `level`.
pub(crate) fn index(gfn: Gfn, level: u8) -> u64 {
    (gfn.0 / entry_span(level)) & (ENTRIES - 1)
}

/// The address of entry `i` of `table`.
pub(crate) fn entry_at(table: Hpa, i: u64) -> Hpa {
    table.add(i * std::mem::size_of::<u64>() as u64)
}

fn entry_hpa(table: Hpa, gfn: Gfn, level: u8) -> Hpa {
    entry_at(table, index(gfn, level))
}

/// The address of the 4 KiB leaf spte for `gfn` under `root`, allocating
/// missing tables (with their headers) on the way down.
pub(crate) fn leaf_for(
    mem: &PhysMemory,
    frames: &mut FrameAllocator,
    headers: &mut PageHeaders,
    root: &Root,
    gfn: Gfn,
    work: &mut WalkWork,
) -> Result<Hpa, TdpError> {
    let mut table = root.pml4.addr();
    let mut role = root.role;
    for level in (2..=ROOT_LEVEL).rev() {
        let slot = entry_hpa(table, gfn, level);
        let entry = read_spte(mem, slot)?;
        work.entries_read += 1;
        role = role.child();
        table = if spte::is_present(entry) {
            Hpa(spte::hpa(entry))
        } else {
            let frame = frames.alloc()?;
            let next = frame.addr();
            if let Err(e) = mem.zero(next, machine::addr::PAGE_SIZE) {
                frames.free(frame);
                return Err(e.into());
            }
            let span = entry_span(level);
            headers.insert(
                frame,
                PageHeader {
                    role,
                    gfn: Gfn(gfn.0 / span * span),
                    generation: root.generation,
                    parent: Some(slot),
                    root: root.id,
                },
            );
            write_spte(mem, slot, spte::make_nonleaf(next.0))?;
            work.tables_allocated += 1;
            next
        };
    }
    Ok(entry_hpa(table, gfn, 1))
}

/// The address of the leaf spte for `gfn` under the root at `pml4`, if its
/// tables exist.
pub(crate) fn find_leaf(mem: &PhysMemory, pml4: Hfn, gfn: Gfn) -> Result<Option<Hpa>, TdpError> {
    find_leaf_counting(mem, pml4, gfn, &mut 0)
}

/// [`find_leaf`], adding the entries it read to `reads` (the fast page
/// fault's lockless walk charges them).
pub(crate) fn find_leaf_counting(
    mem: &PhysMemory,
    pml4: Hfn,
    gfn: Gfn,
    reads: &mut u64,
) -> Result<Option<Hpa>, TdpError> {
    let mut table = pml4.addr();
    for level in (2..=ROOT_LEVEL).rev() {
        let entry = read_spte(mem, entry_hpa(table, gfn, level))?;
        *reads += 1;
        if !spte::is_present(entry) {
            return Ok(None);
        }
        table = Hpa(spte::hpa(entry));
    }
    Ok(Some(entry_hpa(table, gfn, 1)))
}

/// Reads an spte.
pub(crate) fn read_spte(mem: &PhysMemory, at: Hpa) -> Result<u64, MemError> {
    Ok(mem.atomic_u64(at)?.load(Ordering::Acquire))
}

/// Writes an spte.
pub(crate) fn write_spte(mem: &PhysMemory, at: Hpa, value: u64) -> Result<(), MemError> {
    mem.atomic_u64(at)?.store(value, Ordering::Release);
    Ok(())
}

/// Atomically replaces an spte, returning the old value (the CPU may set
/// A/D bits concurrently: a plain store could lose a dirty bit).
pub(crate) fn exchange_spte(mem: &PhysMemory, at: Hpa, value: u64) -> Result<u64, MemError> {
    Ok(mem.atomic_u64(at)?.swap(value, Ordering::Relaxed))
}

/// Atomically clears `bits` of an spte, returning the old value.
pub(crate) fn clear_spte_bits(mem: &PhysMemory, at: Hpa, bits: u64) -> Result<u64, MemError> {
    Ok(mem.atomic_u64(at)?.fetch_and(!bits, Ordering::Relaxed))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::mmu::page::PageRole;
    use crate::mmu::root::Roots;

    /// Host memory of `frames` frames with one empty TDP root in it.
    pub(crate) fn one_root(frames: u64) -> (PhysMemory, FrameAllocator, PageHeaders, Root) {
        let mem = PhysMemory::new(frames * machine::addr::PAGE_SIZE).unwrap();
        let mut allocator = FrameAllocator::new(Hfn(1), Hfn(frames));
        let mut headers = PageHeaders::default();
        let mut roots = Roots::default();
        let id = roots
            .create(&mem, &mut allocator, &mut headers, PageRole::TDP_ROOT, 0)
            .unwrap();
        let root = roots.get(id).unwrap().clone();
        (mem, allocator, headers, root)
    }

    #[test]
    fn leaf_walk_allocates_three_tables_once_with_headers_and_finds_them_again() {
        let (mem, mut frames, mut headers, root) = one_root(64);
        let gfn = Gfn(0x12345);
        assert_eq!(find_leaf(&mem, root.pml4, gfn).unwrap(), None);
        let mut work = WalkWork::default();
        let leaf = leaf_for(&mem, &mut frames, &mut headers, &root, gfn, &mut work).unwrap();
        assert_eq!(work.tables_allocated, 3);
        assert_eq!(headers.len(), 4);
        let mut again = WalkWork::default();
        assert_eq!(
            leaf_for(&mem, &mut frames, &mut headers, &root, gfn, &mut again).unwrap(),
            leaf
        );
        assert_eq!(
            again,
            WalkWork {
                entries_read: 3,
                tables_allocated: 0
            }
        );
        assert_eq!(find_leaf(&mem, root.pml4, gfn).unwrap(), Some(leaf));
        assert_eq!(leaf.0 & 0xfff, (gfn.0 & 511) * 8);
        // The leaf table's header: level 1, the 512-gfn block of `gfn`,
        // linked to the entry above it.
        let leaf_table = Hpa(leaf.0 & !0xfff).frame();
        let header = headers.get(leaf_table).unwrap();
        assert_eq!(header.role.level, 1);
        assert_eq!(header.gfn, Gfn(0x12345 & !511));
        let parent = header.parent.unwrap();
        assert_eq!(
            spte::hpa(read_spte(&mem, parent).unwrap()),
            leaf_table.addr().0
        );
        let tables: Vec<Hfn> = headers.iter().map(|(f, _)| f).collect();
        for f in tables {
            frames.free(f);
        }
        assert_eq!(frames.in_use(), 0);
    }
}
