//! Building page tables in machine memory: IA-32e paging and EPT.
//!
//! [`PageTableBuilder`] allocates table pages from a region of
//! [`PhysMemory`] and installs mappings of 4 KiB, 2 MiB or 1 GiB pages. The
//! two formats share the 4-level radix layout and the page-size bit (bit 7);
//! they differ in what makes an entry present and in the flags of non-leaf
//! entries (see [`TableFormat`]).
//!
//! Tables refer to each other by the host-physical address of the region
//! they were allocated from. That is what the walker sees for EPT tables and
//! for guest paging in bare mode or under an identity EPT (the cases here);
//! a hypervisor building guest page tables under a non-identity EPT needs
//! its own builder.

use crate::addr::{Hpa, PAGE_SIZE};
use crate::memory::{MemError, PhysMemory};
use crate::mmu::ept::epte;
use crate::mmu::paging::pte;
use crate::vmx::Eptp;
use std::ops::Range;
use thiserror::Error;

/// Size of the pages of a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PageSize {
    Size4K,
    Size2M,
    Size1G,
}

impl PageSize {
    /// Bytes covered by one page.
    pub const fn bytes(self) -> u64 {
        match self {
            PageSize::Size4K => 1 << 12,
            PageSize::Size2M => 1 << 21,
            PageSize::Size1G => 1 << 30,
        }
    }

    /// The table level whose entries map pages of this size (1 = PT).
    const fn level(self) -> u32 {
        match self {
            PageSize::Size4K => 1,
            PageSize::Size2M => 2,
            PageSize::Size1G => 3,
        }
    }

    /// Human-readable size: "4K", "2M", "1G".
    pub const fn name(self) -> &'static str {
        match self {
            PageSize::Size4K => "4K",
            PageSize::Size2M => "2M",
            PageSize::Size1G => "1G",
        }
    }
}

/// Which kind of table to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableFormat {
    /// IA-32e paging. Non-leaf entries are present, writable and
    /// user-accessible, so that permissions are decided by the leaf alone
    /// (as Linux builds its tables).
    Paging,
    /// Extended page tables. Non-leaf entries grant read, write and
    /// execute; the leaf decides.
    Ept,
}

impl TableFormat {
    fn non_leaf_flags(self) -> u64 {
        match self {
            TableFormat::Paging => pte::PRESENT | pte::WRITABLE | pte::USER,
            TableFormat::Ept => epte::READ | epte::WRITE | epte::EXEC,
        }
    }

    fn is_present(self, entry: u64) -> bool {
        match self {
            TableFormat::Paging => entry & pte::PRESENT != 0,
            // An EPT entry with no access bit is "not present".
            TableFormat::Ept => entry & (epte::READ | epte::WRITE | epte::EXEC) != 0,
        }
    }

    fn huge_bit(self) -> u64 {
        match self {
            TableFormat::Paging => pte::HUGE,
            TableFormat::Ept => epte::HUGE,
        }
    }

    fn addr_mask(self) -> u64 {
        match self {
            TableFormat::Paging => pte::ADDR_MASK,
            TableFormat::Ept => epte::ADDR_MASK,
        }
    }
}

/// Leaf flags of the identity map of RAM in bare mode: present, writable,
/// supervisor-only (programs grant user access to their own pages).
pub const IDENTITY_PAGING_LEAF: u64 = pte::PRESENT | pte::WRITABLE;
/// Leaf flags of an identity EPT: read, write, execute, write-back.
pub const IDENTITY_EPT_LEAF: u64 = epte::READ | epte::WRITE | epte::EXEC | epte::MEMTYPE_WB;

/// Why a mapping could not be built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PageTableError {
    /// The table region is exhausted.
    #[error("page-table region {start:#x}..{end:#x} is full")]
    OutOfTableMemory { start: u64, end: u64 },
    /// The table region is empty or not page-aligned.
    #[error("page-table region {start:#x}..{end:#x} is empty or not 4 KiB-aligned")]
    BadRegion { start: u64, end: u64 },
    /// An address or length is not a multiple of the page size.
    #[error("{what} {value:#x} is not aligned to the {size}-byte page size")]
    Misaligned {
        what: &'static str,
        value: u64,
        size: u64,
    },
    /// The virtual (or guest-physical) address is outside the 48-bit space.
    #[error("address {0:#x} is outside the 48-bit translated address space")]
    NotTranslatable(u64),
    /// The physical address has bits the entry format cannot hold.
    #[error("physical address {0:#x} does not fit in a page-table entry")]
    PhysicalTooLarge(u64),
    /// Part of the range is already mapped.
    #[error("address {0:#x} is already mapped")]
    AlreadyMapped(u64),
    /// Writing a table failed.
    #[error("writing page tables: {0}")]
    Memory(#[from] MemError),
}

/// Installs mappings in a 4-level table tree whose pages come from a
/// region of machine memory.
#[derive(Debug)]
pub struct PageTableBuilder<'m> {
    mem: &'m PhysMemory,
    format: TableFormat,
    root: Hpa,
    region: Range<u64>,
    next_free: u64,
}

impl<'m> PageTableBuilder<'m> {
    /// Starts a tree in `region`, allocating (and zeroing) its root table.
    pub fn new(
        mem: &'m PhysMemory,
        region: Range<Hpa>,
        format: TableFormat,
    ) -> Result<Self, PageTableError> {
        let (start, end) = (region.start.0, region.end.0);
        if start >= end || start % PAGE_SIZE != 0 || end % PAGE_SIZE != 0 {
            return Err(PageTableError::BadRegion { start, end });
        }
        mem.check(region.start, end - start)?;
        let mut builder = PageTableBuilder {
            mem,
            format,
            root: Hpa(0),
            region: start..end,
            next_free: start,
        };
        builder.root = builder.allocate_table()?;
        Ok(builder)
    }

    /// Host-physical address of the PML4 (the CR3 or EPTP target).
    pub fn root(&self) -> Hpa {
        self.root
    }

    /// The part of the region holding tables so far.
    pub fn used(&self) -> Range<Hpa> {
        Hpa(self.region.start)..Hpa(self.next_free)
    }

    fn allocate_table(&mut self) -> Result<Hpa, PageTableError> {
        if self.next_free >= self.region.end {
            return Err(PageTableError::OutOfTableMemory {
                start: self.region.start,
                end: self.region.end,
            });
        }
        let table = Hpa(self.next_free);
        self.mem.zero(table, PAGE_SIZE)?;
        self.next_free += PAGE_SIZE;
        Ok(table)
    }

    /// Maps one page of `size` at `va` to `pa` with leaf flags `leaf_flags`
    /// (the page-size bit is added for 2 MiB and 1 GiB pages).
    pub fn map(
        &mut self,
        va: u64,
        pa: u64,
        size: PageSize,
        leaf_flags: u64,
    ) -> Result<(), PageTableError> {
        let bytes = size.bytes();
        for (what, value) in [("virtual address", va), ("physical address", pa)] {
            if value % bytes != 0 {
                return Err(PageTableError::Misaligned {
                    what,
                    value,
                    size: bytes,
                });
            }
        }
        if va >> 48 != 0 {
            return Err(PageTableError::NotTranslatable(va));
        }
        if pa & !self.format.addr_mask() != 0 {
            return Err(PageTableError::PhysicalTooLarge(pa));
        }
        let mut table = self.root;
        for level in (size.level() + 1..=4).rev() {
            let slot = table.add(Self::index(va, level) * 8);
            let entry = self.mem.read_u64(slot)?;
            table = if !self.format.is_present(entry) {
                let new = self.allocate_table()?;
                self.mem
                    .write_u64(slot, new.0 | self.format.non_leaf_flags())?;
                new
            } else if entry & self.format.huge_bit() != 0 {
                return Err(PageTableError::AlreadyMapped(va));
            } else {
                Hpa(entry & self.format.addr_mask())
            };
        }
        let slot = table.add(Self::index(va, size.level()) * 8);
        if self.format.is_present(self.mem.read_u64(slot)?) {
            return Err(PageTableError::AlreadyMapped(va));
        }
        let huge = if size == PageSize::Size4K {
            0
        } else {
            self.format.huge_bit()
        };
        self.mem.write_u64(slot, pa | leaf_flags | huge)?;
        Ok(())
    }

    /// Maps `[va, va + len)` to `[pa, pa + len)`, using at each step the
    /// largest page no bigger than `max_size` that the alignment of both
    /// addresses and the remaining length allow.
    pub fn map_range(
        &mut self,
        va: u64,
        pa: u64,
        len: u64,
        max_size: PageSize,
        leaf_flags: u64,
    ) -> Result<(), PageTableError> {
        for (what, value) in [
            ("virtual address", va),
            ("physical address", pa),
            ("length", len),
        ] {
            if value % PAGE_SIZE != 0 {
                return Err(PageTableError::Misaligned {
                    what,
                    value,
                    size: PAGE_SIZE,
                });
            }
        }
        let mut off = 0;
        while off < len {
            let size = [PageSize::Size1G, PageSize::Size2M, PageSize::Size4K]
                .into_iter()
                .filter(|s| *s <= max_size)
                .find(|s| {
                    let b = s.bytes();
                    (va + off) % b == 0 && (pa + off) % b == 0 && len - off >= b
                })
                .unwrap_or(PageSize::Size4K);
            self.map(va + off, pa + off, size, leaf_flags)?;
            off += size.bytes();
        }
        Ok(())
    }

    fn index(va: u64, level: u32) -> u64 {
        (va >> (12 + 9 * (level - 1))) & 511
    }
}

/// Bytes of tables [`identity_map`] needs for `[0, len)` with pages of at
/// most `page_size` (an upper bound; exact for page-aligned `len`).
pub fn identity_table_bytes(len: u64, page_size: PageSize) -> u64 {
    const GIB: u64 = 1 << 30;
    const MIB2: u64 = 1 << 21;
    let pdpts = len.div_ceil(512 * GIB);
    // A tail shorter than the largest page is mapped with smaller pages,
    // which needs one more table of the level below.
    let (pds, pts) = match page_size {
        PageSize::Size4K => (len.div_ceil(GIB), len.div_ceil(MIB2)),
        PageSize::Size2M => (len.div_ceil(GIB), u64::from(len % MIB2 != 0)),
        PageSize::Size1G => (u64::from(len % GIB != 0), u64::from(len % MIB2 != 0)),
    };
    (1 + pdpts + pds + pts) * PAGE_SIZE
}

/// Identity-maps `[0, len)` (virtual = physical) with pages of at most
/// `page_size`, tables allocated from `region`. Returns the builder so the
/// caller can read the root and the used range, or add mappings.
pub fn identity_map<'m>(
    mem: &'m PhysMemory,
    region: Range<Hpa>,
    len: u64,
    page_size: PageSize,
    format: TableFormat,
) -> Result<PageTableBuilder<'m>, PageTableError> {
    let leaf = match format {
        TableFormat::Paging => IDENTITY_PAGING_LEAF,
        TableFormat::Ept => IDENTITY_EPT_LEAF,
    };
    let mut builder = PageTableBuilder::new(mem, region, format)?;
    builder.map_range(0, 0, len, page_size, leaf)?;
    Ok(builder)
}

/// Builds identity guest page tables for `[0, len)` at `region` and returns
/// the CR3 value.
pub fn build_identity_paging(
    mem: &PhysMemory,
    region: Range<Hpa>,
    len: u64,
    page_size: PageSize,
) -> Result<Hpa, PageTableError> {
    Ok(identity_map(mem, region, len, page_size, TableFormat::Paging)?.root())
}

/// Builds an identity EPT for guest-physical `[0, len)` at `region` and
/// returns its EPT pointer (accessed/dirty flags enabled).
pub fn build_identity_ept(
    mem: &PhysMemory,
    region: Range<Hpa>,
    len: u64,
    page_size: PageSize,
) -> Result<Eptp, PageTableError> {
    let root = identity_map(mem, region, len, page_size, TableFormat::Ept)?.root();
    Ok(Eptp::new(root, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks the tables by hand: (leaf entry, level) for `va`.
    fn walk(mem: &PhysMemory, root: Hpa, format: TableFormat, va: u64) -> Option<(u64, u32)> {
        let mut table = root;
        for level in (1..=4).rev() {
            let entry = mem
                .read_u64(table.add(PageTableBuilder::index(va, level) * 8))
                .unwrap();
            if !format.is_present(entry) {
                return None;
            }
            if level == 1 || entry & format.huge_bit() != 0 {
                return Some((entry, level));
            }
            table = Hpa(entry & format.addr_mask());
        }
        None
    }

    #[test]
    fn identity_map_with_2m_pages_and_4k_tail() {
        let mem = PhysMemory::new(16 << 20).unwrap();
        let len = (6 << 20) + 0x3000;
        let region = Hpa(8 << 20)..Hpa((8 << 20) + identity_table_bytes(len, PageSize::Size2M));
        let b = identity_map(
            &mem,
            region.clone(),
            len,
            PageSize::Size2M,
            TableFormat::Paging,
        )
        .unwrap();
        // PML4 + PDPT + PD + one PT for the tail: exactly what was budgeted.
        assert_eq!(b.used(), region);
        let root = b.root();
        let (e, level) = walk(&mem, root, TableFormat::Paging, 0x40_1234).unwrap();
        assert_eq!(level, 2);
        assert_eq!(e, 0x40_0000 | IDENTITY_PAGING_LEAF | pte::HUGE);
        let (e, level) = walk(&mem, root, TableFormat::Paging, (6 << 20) + 0x2fff).unwrap();
        assert_eq!(level, 1);
        assert_eq!(e, ((6 << 20) + 0x2000) | IDENTITY_PAGING_LEAF);
        assert_eq!(
            walk(&mem, root, TableFormat::Paging, (6 << 20) + 0x3000),
            None
        );
        // Non-leaf entries leave the permission decision to the leaf.
        let pml4e = mem.read_u64(root).unwrap();
        assert_eq!(pml4e & 0xfff, pte::PRESENT | pte::WRITABLE | pte::USER);
    }

    #[test]
    fn identity_map_with_4k_pages() {
        let mem = PhysMemory::new(16 << 20).unwrap();
        let len = 4 << 20;
        let bytes = identity_table_bytes(len, PageSize::Size4K);
        assert_eq!(bytes, (1 + 1 + 1 + 2) * PAGE_SIZE);
        let region = Hpa(8 << 20)..Hpa((8 << 20) + bytes);
        let root = build_identity_paging(&mem, region, len, PageSize::Size4K).unwrap();
        for va in [0u64, 0x1000, 0x20_0fff, len - 1] {
            let (e, level) = walk(&mem, root, TableFormat::Paging, va).unwrap();
            assert_eq!(level, 1);
            assert_eq!(e & pte::ADDR_MASK, va & !0xfff);
        }
        // The table budget was exact: one page less fails.
        let short = Hpa(8 << 20)..Hpa((8 << 20) + bytes - PAGE_SIZE);
        assert!(matches!(
            build_identity_paging(&mem, short, len, PageSize::Size4K),
            Err(PageTableError::OutOfTableMemory { .. })
        ));
    }

    #[test]
    fn identity_ept_uses_ept_bits() {
        let mem = PhysMemory::new(16 << 20).unwrap();
        let region = Hpa(12 << 20)..Hpa(13 << 20);
        let eptp = build_identity_ept(&mem, region, 8 << 20, PageSize::Size2M).unwrap();
        assert_eq!(eptp.pml4(), Hpa(12 << 20));
        assert!(eptp.ad_enabled());
        let (e, level) = walk(&mem, eptp.pml4(), TableFormat::Ept, 0x60_0000).unwrap();
        assert_eq!(level, 2);
        assert_eq!(e, 0x60_0000 | IDENTITY_EPT_LEAF | epte::HUGE);
        let pml4e = mem.read_u64(eptp.pml4()).unwrap();
        assert_eq!(pml4e & 0xfff, epte::READ | epte::WRITE | epte::EXEC);
    }

    #[test]
    fn rejects_conflicts_and_bad_input() {
        let mem = PhysMemory::new(4 << 20).unwrap();
        let mut b =
            PageTableBuilder::new(&mem, Hpa(0x10_0000)..Hpa(0x20_0000), TableFormat::Paging)
                .unwrap();
        b.map(0x20_0000, 0x20_0000, PageSize::Size2M, IDENTITY_PAGING_LEAF)
            .unwrap();
        assert_eq!(
            b.map(0x20_1000, 0, PageSize::Size4K, IDENTITY_PAGING_LEAF),
            Err(PageTableError::AlreadyMapped(0x20_1000))
        );
        assert_eq!(
            b.map(0x20_0000, 0, PageSize::Size2M, IDENTITY_PAGING_LEAF),
            Err(PageTableError::AlreadyMapped(0x20_0000))
        );
        assert!(matches!(
            b.map(0x1000, 0x800, PageSize::Size4K, 0),
            Err(PageTableError::Misaligned {
                what: "physical address",
                ..
            })
        ));
        assert_eq!(
            b.map(1 << 48, 0, PageSize::Size4K, 0),
            Err(PageTableError::NotTranslatable(1 << 48))
        );
        assert_eq!(
            b.map(0, 1 << 52, PageSize::Size4K, 0),
            Err(PageTableError::PhysicalTooLarge(1 << 52))
        );
        assert!(matches!(
            PageTableBuilder::new(&mem, Hpa(0x1800)..Hpa(0x3000), TableFormat::Ept),
            Err(PageTableError::BadRegion { .. })
        ));
        assert!(matches!(
            PageTableBuilder::new(&mem, Hpa(0x3f_f000)..Hpa(0x40_1000), TableFormat::Ept),
            Err(PageTableError::Memory(_))
        ));
    }

    #[test]
    fn map_range_picks_page_sizes_by_alignment() {
        let mem = PhysMemory::new(8 << 20).unwrap();
        let mut b =
            PageTableBuilder::new(&mem, Hpa(0x10_0000)..Hpa(0x20_0000), TableFormat::Paging)
                .unwrap();
        // 2 MiB-aligned virtual, but physical only 4 KiB-aligned: all 4K.
        b.map_range(
            0x4000_0000,
            0x1000,
            0x20_0000,
            PageSize::Size2M,
            IDENTITY_PAGING_LEAF,
        )
        .unwrap();
        let (e, level) = walk(&mem, b.root(), TableFormat::Paging, 0x4000_0000).unwrap();
        assert_eq!((e & pte::ADDR_MASK, level), (0x1000, 1));
        let (e, level) = walk(&mem, b.root(), TableFormat::Paging, 0x401f_f000).unwrap();
        assert_eq!((e & pte::ADDR_MASK, level), (0x20_0000, 1));
    }

    #[test]
    fn table_budget_covers_odd_sizes() {
        for len in [
            0x1000u64,
            0x20_0000,
            0x20_1000,
            64 << 20,
            (1 << 30) + 0x5000,
            3 << 30,
        ] {
            for size in [PageSize::Size4K, PageSize::Size2M, PageSize::Size1G] {
                let bytes = identity_table_bytes(len, size);
                let mem = PhysMemory::new(bytes).unwrap();
                let b = identity_map(&mem, Hpa(0)..Hpa(bytes), len, size, TableFormat::Ept)
                    .unwrap_or_else(|e| panic!("len {len:#x} {size:?}: {e}"));
                assert!(b.used().end.0 <= bytes);
            }
        }
    }
}
