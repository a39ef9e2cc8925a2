//! Parsing and loading static ELF64 x86-64 executables.
//!
//! [`parse`] validates the file header and the program headers of a static
//! executable (`ET_EXEC`, `EM_X86_64`, little-endian ELF64) and returns its
//! entry point and `PT_LOAD` segments, borrowing the file bytes. Nothing in
//! the file is trusted: every offset and size is checked with overflow-safe
//! arithmetic, and malformed input yields an [`ElfError`], never a panic.
//!
//! [`load_into`] copies the segments into [`PhysMemory`] at their *physical*
//! load addresses (`p_paddr`), zero-filling the part of each segment beyond
//! its file bytes (`.bss`). Where a physical load address lands is the
//! caller's business, given as a page-granular translation callback: bare
//! mode uses the identity ([`load_identity`]); a hypervisor loading a guest
//! kernel passes its guest-physical-to-host-physical lookup.

use crate::addr::{Hpa, PAGE_SIZE};
use crate::memory::{MemError, PhysMemory};
use thiserror::Error;

/// `e_type` of an executable file.
const ET_EXEC: u16 = 2;
/// `e_machine` of x86-64.
const EM_X86_64: u16 = 62;
/// `p_type` of a loadable segment.
const PT_LOAD: u32 = 1;
/// `e_phnum` value meaning "the real count is in section header 0".
const PN_XNUM: u16 = 0xffff;
/// Size of the ELF64 file header.
const EHDR_SIZE: usize = 64;
/// Size of one ELF64 program header.
const PHDR_SIZE: usize = 56;

/// Why an ELF file was rejected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ElfError {
    /// The file does not start with `\x7fELF`.
    #[error("not an ELF file (bad magic number)")]
    NotElf,
    /// `EI_CLASS` is not ELFCLASS64.
    #[error("ELF class {0} is not supported: only 64-bit (ELFCLASS64) executables can be loaded")]
    WrongClass(u8),
    /// `EI_DATA` is not little-endian.
    #[error("ELF data encoding {0} is not supported: only little-endian files can be loaded")]
    WrongEndianness(u8),
    /// `EI_VERSION` or `e_version` is not 1.
    #[error("ELF version {0} is not supported (expected 1)")]
    WrongVersion(u32),
    /// `e_machine` is not x86-64.
    #[error("ELF machine {0} is not x86-64 (62)")]
    WrongMachine(u16),
    /// `e_type` is not `ET_EXEC` (relocatable objects, shared objects and
    /// position-independent executables are not supported).
    #[error("ELF type {0} is not a static executable (ET_EXEC = 2)")]
    WrongType(u16),
    /// The file ends before a structure it declares.
    #[error("truncated ELF file: {what} needs bytes {start:#x}..{end:#x}, file has {len:#x}")]
    Truncated {
        what: &'static str,
        start: u64,
        end: u64,
        len: u64,
    },
    /// `e_phentsize` is not the ELF64 program-header size.
    #[error("program header entry size {0} is not 56")]
    BadProgramHeaderSize(u16),
    /// `e_phnum` is `PN_XNUM` (more than 65534 program headers).
    #[error("extended program header numbering (PN_XNUM) is not supported")]
    TooManyProgramHeaders,
    /// An offset plus a size does not fit in 64 bits.
    #[error("segment {index}: {what} overflows the 64-bit address space")]
    SizeOverflow { index: usize, what: &'static str },
    /// A segment's file size exceeds its memory size.
    #[error("segment {index}: file size {filesz:#x} exceeds memory size {memsz:#x}")]
    FileSizeExceedsMemSize {
        index: usize,
        filesz: u64,
        memsz: u64,
    },
    /// Two loadable segments occupy the same physical or virtual bytes.
    #[error("segments {first} and {second} overlap ({space} addresses)")]
    Overlapping {
        first: usize,
        second: usize,
        space: &'static str,
    },
    /// The file has no `PT_LOAD` segment.
    #[error("no loadable (PT_LOAD) segment")]
    NoLoadableSegments,
    /// The entry point is not inside an executable loadable segment.
    #[error("entry point {0:#x} is not inside an executable loadable segment")]
    EntryOutsideSegments(u64),
    /// A segment's physical range is not backed by memory.
    #[error("segment {index} (physical {paddr:#x}..{end:#x}) lies outside memory: no memory at {missing:#x}")]
    SegmentOutsideMemory {
        index: usize,
        paddr: u64,
        end: u64,
        missing: u64,
    },
    /// Writing a segment to memory failed.
    #[error("segment {index}: {source}")]
    Memory { index: usize, source: MemError },
}

/// Segment permissions (`p_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SegmentFlags {
    pub read: bool,
    pub write: bool,
    pub execute: bool,
}

impl SegmentFlags {
    fn from_p_flags(flags: u32) -> Self {
        SegmentFlags {
            execute: flags & 1 != 0,
            write: flags & 2 != 0,
            read: flags & 4 != 0,
        }
    }
}

/// One `PT_LOAD` segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadSegment<'a> {
    /// Index of the program header in the file.
    pub index: usize,
    /// Virtual address of the first byte.
    pub vaddr: u64,
    /// Physical load address of the first byte.
    pub paddr: u64,
    /// The bytes from the file (`p_filesz` of them).
    pub data: &'a [u8],
    /// Size in memory; bytes past `data.len()` are zero.
    pub memsz: u64,
    pub flags: SegmentFlags,
}

impl LoadSegment<'_> {
    /// One past the last physical byte.
    pub fn paddr_end(&self) -> u64 {
        // Cannot overflow: checked by `parse`.
        self.paddr + self.memsz
    }
    /// One past the last virtual byte.
    pub fn vaddr_end(&self) -> u64 {
        // Cannot overflow: checked by `parse`.
        self.vaddr + self.memsz
    }
}

/// A parsed executable, borrowing the file's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfImage<'a> {
    /// Virtual address of the first instruction.
    pub entry: u64,
    /// The loadable segments, in file order.
    pub segments: Vec<LoadSegment<'a>>,
}

impl ElfImage<'_> {
    /// The lowest and one-past-highest physical addresses of all segments.
    pub fn paddr_span(&self) -> (u64, u64) {
        let start = self.segments.iter().map(|s| s.paddr).min().unwrap_or(0);
        let end = self
            .segments
            .iter()
            .map(|s| s.paddr_end())
            .max()
            .unwrap_or(0);
        (start, end)
    }
}

/// Little-endian field reads with bounds checks.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn slice(&self, what: &'static str, start: u64, len: u64) -> Result<&'a [u8], ElfError> {
        let file_len = self.bytes.len() as u64;
        let truncated = |end| ElfError::Truncated {
            what,
            start,
            end,
            len: file_len,
        };
        let end = start.checked_add(len).ok_or_else(|| truncated(u64::MAX))?;
        if end > file_len {
            return Err(truncated(end));
        }
        // Both bounds are <= the slice length, which fits in usize.
        Ok(&self.bytes[start as usize..end as usize])
    }
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(v)
}

/// Parses and validates a static ELF64 x86-64 executable.
pub fn parse(bytes: &[u8]) -> Result<ElfImage<'_>, ElfError> {
    let reader = Reader { bytes };
    if bytes.len() < 4 || bytes[..4] != *b"\x7fELF" {
        return Err(ElfError::NotElf);
    }
    let ehdr = reader.slice("file header", 0, EHDR_SIZE as u64)?;
    if ehdr[4] != 2 {
        return Err(ElfError::WrongClass(ehdr[4]));
    }
    if ehdr[5] != 1 {
        return Err(ElfError::WrongEndianness(ehdr[5]));
    }
    if ehdr[6] != 1 {
        return Err(ElfError::WrongVersion(ehdr[6] as u32));
    }
    let e_type = u16_at(ehdr, 16);
    let e_machine = u16_at(ehdr, 18);
    let e_version = u32_at(ehdr, 20);
    let entry = u64_at(ehdr, 24);
    let phoff = u64_at(ehdr, 32);
    let phentsize = u16_at(ehdr, 54);
    let phnum = u16_at(ehdr, 56);
    if e_machine != EM_X86_64 {
        return Err(ElfError::WrongMachine(e_machine));
    }
    if e_type != ET_EXEC {
        return Err(ElfError::WrongType(e_type));
    }
    if e_version != 1 {
        return Err(ElfError::WrongVersion(e_version));
    }
    if phnum == PN_XNUM {
        return Err(ElfError::TooManyProgramHeaders);
    }
    if phnum != 0 && phentsize as usize != PHDR_SIZE {
        return Err(ElfError::BadProgramHeaderSize(phentsize));
    }
    let phdrs = reader.slice("program headers", phoff, phnum as u64 * PHDR_SIZE as u64)?;

    let mut segments = Vec::new();
    for (index, ph) in phdrs.chunks_exact(PHDR_SIZE).enumerate() {
        if u32_at(ph, 0) != PT_LOAD {
            continue;
        }
        let flags = SegmentFlags::from_p_flags(u32_at(ph, 4));
        let offset = u64_at(ph, 8);
        let vaddr = u64_at(ph, 16);
        let paddr = u64_at(ph, 24);
        let filesz = u64_at(ph, 32);
        let memsz = u64_at(ph, 40);
        if filesz > memsz {
            return Err(ElfError::FileSizeExceedsMemSize {
                index,
                filesz,
                memsz,
            });
        }
        if vaddr.checked_add(memsz).is_none() {
            return Err(ElfError::SizeOverflow {
                index,
                what: "virtual address + memory size",
            });
        }
        if paddr.checked_add(memsz).is_none() {
            return Err(ElfError::SizeOverflow {
                index,
                what: "physical address + memory size",
            });
        }
        if offset.checked_add(filesz).is_none() {
            return Err(ElfError::SizeOverflow {
                index,
                what: "file offset + file size",
            });
        }
        let data = reader.slice("segment data", offset, filesz)?;
        segments.push(LoadSegment {
            index,
            vaddr,
            paddr,
            data,
            memsz,
            flags,
        });
    }
    if segments.is_empty() {
        return Err(ElfError::NoLoadableSegments);
    }
    check_overlaps(&segments, "physical", |s| (s.paddr, s.paddr_end()))?;
    check_overlaps(&segments, "virtual", |s| (s.vaddr, s.vaddr_end()))?;
    let entry_ok = segments
        .iter()
        .any(|s| s.flags.execute && s.vaddr <= entry && entry < s.vaddr_end());
    if !entry_ok {
        return Err(ElfError::EntryOutsideSegments(entry));
    }
    Ok(ElfImage { entry, segments })
}

/// Rejects two non-empty segments whose `range` intersect.
fn check_overlaps(
    segments: &[LoadSegment<'_>],
    space: &'static str,
    range: impl Fn(&LoadSegment<'_>) -> (u64, u64),
) -> Result<(), ElfError> {
    let mut ranges: Vec<(u64, u64, usize)> = segments
        .iter()
        .filter(|s| s.memsz != 0)
        .map(|s| {
            let (start, end) = range(s);
            (start, end, s.index)
        })
        .collect();
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        let (_, prev_end, first) = pair[0];
        let (next_start, _, second) = pair[1];
        if next_start < prev_end {
            return Err(ElfError::Overlapping {
                first,
                second,
                space,
            });
        }
    }
    Ok(())
}

/// Copies every segment of `image` into `mem` at its physical load address
/// and zero-fills its `.bss` tail.
///
/// `translate` maps a page-aligned physical load address to the
/// host-physical address of that 4 KiB page, or `None` if nothing backs it
/// (a hypervisor passes its guest-physical lookup here). All pages are
/// translated and checked before the first byte is written, so a failed
/// load leaves memory untouched.
pub fn load_into(
    image: &ElfImage<'_>,
    mem: &PhysMemory,
    translate: impl Fn(u64) -> Option<Hpa>,
) -> Result<(), ElfError> {
    // Pass 1: every page must translate to a page inside memory.
    for seg in &image.segments {
        for_each_page(seg, |page_start, _, _| {
            let outside = ElfError::SegmentOutsideMemory {
                index: seg.index,
                paddr: seg.paddr,
                end: seg.paddr_end(),
                missing: page_start.max(seg.paddr),
            };
            let hpa = translate(page_start).ok_or(outside.clone())?;
            if hpa.page_offset() != 0 || mem.check(hpa, PAGE_SIZE).is_err() {
                return Err(outside);
            }
            Ok(())
        })?;
    }
    // Pass 2: copy and zero-fill, one page piece at a time.
    for seg in &image.segments {
        for_each_page(seg, |page_start, from, to| {
            let hpa_page = translate(page_start).ok_or(ElfError::SegmentOutsideMemory {
                index: seg.index,
                paddr: seg.paddr,
                end: seg.paddr_end(),
                missing: page_start,
            })?;
            let mem_err = |source| ElfError::Memory {
                index: seg.index,
                source,
            };
            // [from, to) is a physical range inside this page; split it into
            // the part backed by file bytes and the zero-filled rest.
            let file_end = seg.paddr + seg.data.len() as u64;
            let copy_end = to.min(file_end);
            if from < copy_end {
                let src = &seg.data[(from - seg.paddr) as usize..(copy_end - seg.paddr) as usize];
                mem.write_bytes(hpa_page.add(from - page_start), src)
                    .map_err(mem_err)?;
            }
            let zero_start = from.max(file_end);
            if zero_start < to {
                mem.zero(hpa_page.add(zero_start - page_start), to - zero_start)
                    .map_err(mem_err)?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// Loads `image` at host-physical = physical load address (bare mode).
pub fn load_identity(image: &ElfImage<'_>, mem: &PhysMemory) -> Result<(), ElfError> {
    load_into(image, mem, |paddr| Some(Hpa(paddr)))
}

/// Calls `f(page_start, from, to)` for each 4 KiB page the segment's
/// physical range `[paddr, paddr + memsz)` touches, with `[from, to)` the
/// part of the range inside that page.
fn for_each_page(
    seg: &LoadSegment<'_>,
    mut f: impl FnMut(u64, u64, u64) -> Result<(), ElfError>,
) -> Result<(), ElfError> {
    let end = seg.paddr_end();
    let mut from = seg.paddr;
    while from < end {
        let page_start = from & !(PAGE_SIZE - 1);
        // The last page of the address space ends at 2^64: saturate.
        let to = page_start.saturating_add(PAGE_SIZE).min(end);
        f(page_start, from, to)?;
        from = to;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A segment description for [`build_elf`].
    struct Seg<'a> {
        vaddr: u64,
        paddr: u64,
        data: &'a [u8],
        memsz: u64,
        flags: u32,
    }

    /// Writes a minimal ELF64 executable: header, program headers, then
    /// each segment's bytes in order.
    fn build_elf(entry: u64, segs: &[Seg<'_>]) -> Vec<u8> {
        let mut out = vec![0u8; EHDR_SIZE + PHDR_SIZE * segs.len()];
        out[..4].copy_from_slice(b"\x7fELF");
        out[4] = 2;
        out[5] = 1;
        out[6] = 1;
        out[16..18].copy_from_slice(&ET_EXEC.to_le_bytes());
        out[18..20].copy_from_slice(&EM_X86_64.to_le_bytes());
        out[20..24].copy_from_slice(&1u32.to_le_bytes());
        out[24..32].copy_from_slice(&entry.to_le_bytes());
        out[32..40].copy_from_slice(&(EHDR_SIZE as u64).to_le_bytes());
        out[52..54].copy_from_slice(&(EHDR_SIZE as u16).to_le_bytes());
        out[54..56].copy_from_slice(&(PHDR_SIZE as u16).to_le_bytes());
        out[56..58].copy_from_slice(&(segs.len() as u16).to_le_bytes());
        for (i, s) in segs.iter().enumerate() {
            let offset = out.len() as u64;
            out.extend_from_slice(s.data);
            let ph = EHDR_SIZE + i * PHDR_SIZE;
            out[ph..ph + 4].copy_from_slice(&PT_LOAD.to_le_bytes());
            out[ph + 4..ph + 8].copy_from_slice(&s.flags.to_le_bytes());
            out[ph + 8..ph + 16].copy_from_slice(&offset.to_le_bytes());
            out[ph + 16..ph + 24].copy_from_slice(&s.vaddr.to_le_bytes());
            out[ph + 24..ph + 32].copy_from_slice(&s.paddr.to_le_bytes());
            out[ph + 32..ph + 40].copy_from_slice(&(s.data.len() as u64).to_le_bytes());
            out[ph + 40..ph + 48].copy_from_slice(&s.memsz.to_le_bytes());
        }
        out
    }

    const RX: u32 = 5;
    const RW: u32 = 6;

    fn two_segment_elf() -> Vec<u8> {
        build_elf(
            0x20_0010,
            &[
                Seg {
                    vaddr: 0x20_0000,
                    paddr: 0x20_0000,
                    data: &[0x90; 0x20],
                    memsz: 0x20,
                    flags: RX,
                },
                Seg {
                    vaddr: 0x20_1ff0,
                    paddr: 0x20_1ff0,
                    data: &[0xaa; 0x18],
                    memsz: 0x1100,
                    flags: RW,
                },
            ],
        )
    }

    #[test]
    fn parses_segments_and_entry() {
        let bytes = two_segment_elf();
        let image = parse(&bytes).unwrap();
        assert_eq!(image.entry, 0x20_0010);
        assert_eq!(image.segments.len(), 2);
        let data = &image.segments[1];
        assert_eq!(
            (data.vaddr, data.paddr, data.memsz),
            (0x20_1ff0, 0x20_1ff0, 0x1100)
        );
        assert_eq!(data.data, &[0xaa; 0x18]);
        assert_eq!(
            data.flags,
            SegmentFlags {
                read: true,
                write: true,
                execute: false
            }
        );
        assert!(image.segments[0].flags.execute);
        assert_eq!(image.paddr_span(), (0x20_0000, 0x20_30f0));
    }

    #[test]
    fn loads_data_and_zero_fills_bss_across_pages() {
        let bytes = two_segment_elf();
        let image = parse(&bytes).unwrap();
        let mem = PhysMemory::new(0x40_0000).unwrap();
        // Dirty the bss range first: the loader must zero it.
        mem.write_bytes(Hpa(0x20_2000), &[0x55; 0x1100]).unwrap();
        load_identity(&image, &mem).unwrap();
        let mut buf = vec![0u8; 0x1100];
        mem.read_bytes(Hpa(0x20_1ff0), &mut buf).unwrap();
        assert!(buf[..0x18].iter().all(|&b| b == 0xaa));
        assert!(buf[0x18..].iter().all(|&b| b == 0));
        // The byte after the segment is untouched.
        assert_eq!(mem.read(Hpa(0x20_30f0), 1).unwrap(), 0x55);
        assert_eq!(mem.read(Hpa(0x20_0000), 1).unwrap(), 0x90);
    }

    #[test]
    fn load_goes_through_the_translation_per_page() {
        let bytes = two_segment_elf();
        let image = parse(&bytes).unwrap();
        let mem = PhysMemory::new(0x10_0000).unwrap();
        // Physical pages 0x200..0x204 live at host pages 0x10..0x14, reversed.
        let translate = |paddr: u64| {
            let page = (paddr >> 12).checked_sub(0x200)?;
            (page < 4).then(|| Hpa((0x13 - page) << 12))
        };
        load_into(&image, &mem, translate).unwrap();
        assert_eq!(mem.read(Hpa(0x13_000), 1).unwrap(), 0x90);
        // 0x201ff0 is in physical page 0x201 -> host page 0x12.
        assert_eq!(mem.read(Hpa(0x12_ff0), 1).unwrap(), 0xaa);
        // 0x202000 (first bss byte past the file data) -> host page 0x11.
        assert_eq!(mem.read(Hpa(0x11_008), 1).unwrap(), 0);
    }

    #[test]
    fn failed_load_writes_nothing() {
        let bytes = two_segment_elf();
        let image = parse(&bytes).unwrap();
        // Memory ends inside the second segment.
        let mem = PhysMemory::new(0x20_2000).unwrap();
        let err = load_identity(&image, &mem).unwrap_err();
        assert_eq!(
            err,
            ElfError::SegmentOutsideMemory {
                index: 1,
                paddr: 0x20_1ff0,
                end: 0x20_30f0,
                missing: 0x20_2000
            }
        );
        assert_eq!(mem.read(Hpa(0x20_0000), 1).unwrap(), 0);
        let msg = err.to_string();
        assert!(msg.contains("outside memory"), "{msg}");
    }

    #[test]
    fn rejects_bad_headers() {
        let good = two_segment_elf();
        let with = |off: usize, bytes: &[u8]| {
            let mut b = good.clone();
            b[off..off + bytes.len()].copy_from_slice(bytes);
            parse(&b).map(|_| ()).unwrap_err()
        };
        assert_eq!(parse(b"MZ\x90\x00").unwrap_err(), ElfError::NotElf);
        assert_eq!(parse(b"").unwrap_err(), ElfError::NotElf);
        assert_eq!(with(4, &[1]), ElfError::WrongClass(1));
        assert_eq!(with(5, &[2]), ElfError::WrongEndianness(2));
        assert_eq!(with(18, &3u16.to_le_bytes()), ElfError::WrongMachine(3));
        assert_eq!(with(16, &3u16.to_le_bytes()), ElfError::WrongType(3));
        assert_eq!(
            with(54, &32u16.to_le_bytes()),
            ElfError::BadProgramHeaderSize(32)
        );
        assert_eq!(
            with(56, &0xffffu16.to_le_bytes()),
            ElfError::TooManyProgramHeaders
        );
        assert_eq!(with(56, &0u16.to_le_bytes()), ElfError::NoLoadableSegments);
        assert!(matches!(
            parse(&good[..40]).unwrap_err(),
            ElfError::Truncated {
                what: "file header",
                ..
            }
        ));
        assert!(matches!(
            parse(&good[..100]).unwrap_err(),
            ElfError::Truncated {
                what: "program headers",
                ..
            }
        ));
        assert!(matches!(
            parse(&good[..good.len() - 1]).unwrap_err(),
            ElfError::Truncated {
                what: "segment data",
                ..
            }
        ));
        assert_eq!(
            with(24, &0x30_0000u64.to_le_bytes()),
            ElfError::EntryOutsideSegments(0x30_0000)
        );
        // Entry inside the data (non-executable) segment.
        assert_eq!(
            with(24, &0x20_2000u64.to_le_bytes()),
            ElfError::EntryOutsideSegments(0x20_2000)
        );
    }

    #[test]
    fn rejects_bad_segments() {
        let good = two_segment_elf();
        let ph1 = EHDR_SIZE + PHDR_SIZE;
        let with = |off: usize, v: u64| {
            let mut b = good.clone();
            b[off..off + 8].copy_from_slice(&v.to_le_bytes());
            parse(&b).map(|_| ()).unwrap_err()
        };
        assert_eq!(
            with(ph1 + 40, 0x10),
            ElfError::FileSizeExceedsMemSize {
                index: 1,
                filesz: 0x18,
                memsz: 0x10
            }
        );
        assert!(matches!(
            with(ph1 + 16, u64::MAX - 0x10),
            ElfError::SizeOverflow { index: 1, .. }
        ));
        assert!(matches!(
            with(ph1 + 24, u64::MAX - 0x10),
            ElfError::SizeOverflow { index: 1, .. }
        ));
        assert!(matches!(
            with(ph1 + 8, u64::MAX - 0x10),
            ElfError::SizeOverflow { index: 1, .. }
        ));
        assert_eq!(
            with(ph1 + 24, 0x20_0010),
            ElfError::Overlapping {
                first: 0,
                second: 1,
                space: "physical"
            }
        );
        assert_eq!(
            with(ph1 + 16, 0x20_001f),
            ElfError::Overlapping {
                first: 0,
                second: 1,
                space: "virtual"
            }
        );
        // Touching (not overlapping) segments are fine.
        let mut b = good.clone();
        b[ph1 + 16..ph1 + 24].copy_from_slice(&0x20_0020u64.to_le_bytes());
        b[ph1 + 24..ph1 + 32].copy_from_slice(&0x20_0020u64.to_le_bytes());
        parse(&b).unwrap();
    }

    #[test]
    fn segment_at_top_of_address_space_does_not_panic() {
        let bytes = build_elf(
            0x1000,
            &[
                Seg {
                    vaddr: 0x1000,
                    paddr: 0x1000,
                    data: &[0xc3],
                    memsz: 1,
                    flags: RX,
                },
                Seg {
                    vaddr: u64::MAX - 0xfff,
                    paddr: u64::MAX - 0xfff,
                    data: &[1, 2, 3],
                    memsz: 0xfff,
                    flags: RW,
                },
            ],
        );
        let image = parse(&bytes).unwrap();
        let mem = PhysMemory::new(0x2000).unwrap();
        assert!(matches!(
            load_identity(&image, &mem).unwrap_err(),
            ElfError::SegmentOutsideMemory { index: 1, .. }
        ));
    }

    #[test]
    fn parses_the_real_test_programs() {
        for (name, bytes) in crate::programs::ALL {
            let image = parse(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(image.entry, 0x20_0000, "{name}");
            for seg in &image.segments {
                assert_eq!(seg.vaddr, seg.paddr, "{name}: identity-linked");
            }
        }
    }

    /// Parses and, if that succeeds, loads into a small memory; any outcome
    /// but a panic is fine.
    fn parse_and_load(bytes: &[u8]) {
        if let Ok(image) = parse(bytes) {
            let mem = PhysMemory::new(0x40_0000).unwrap();
            let _ = load_identity(&image, &mem);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            parse_and_load(&bytes);
        }

        #[test]
        fn random_bytes_with_elf_header_never_panic(
            tail in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let mut bytes = two_segment_elf();
            let keep = 24.min(bytes.len());
            bytes.truncate(keep);
            bytes.extend_from_slice(&tail);
            parse_and_load(&bytes);
        }

        #[test]
        fn mutated_elf_never_panics(
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16),
            cut in any::<prop::sample::Index>(),
            truncate in any::<bool>(),
        ) {
            let mut bytes = two_segment_elf();
            // Concentrate edits on the headers, where the parser looks.
            let header_len = EHDR_SIZE + 2 * PHDR_SIZE;
            for (at, value) in edits {
                let i = at.index(header_len);
                bytes[i] = value;
            }
            if truncate {
                let len = cut.index(bytes.len() + 1);
                bytes.truncate(len);
            }
            parse_and_load(&bytes);
        }

        #[test]
        fn mutated_real_program_never_panics(
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u64>()), 1..8),
        ) {
            let mut bytes = crate::programs::HELLO.to_vec();
            // Overwrite whole 8-byte fields of the file and program headers.
            let fields = (EHDR_SIZE + 3 * PHDR_SIZE) / 8;
            for (at, value) in edits {
                let off = at.index(fields) * 8;
                bytes[off..off + 8].copy_from_slice(&value.to_le_bytes());
            }
            parse_and_load(&bytes);
        }
    }
}
