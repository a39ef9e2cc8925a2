//! Loading the kernel ELF and building the boot state of `abi`.
//!
//! Guest-physical layout of the boot structures (all in the reserved low
//! megabyte, which the memory map marks [`abi::MEM_RESERVED`]):
//!
//! | gpa | contents |
//! |-----|----------|
//! | 0x1000 | GDT: null, 64-bit kernel code at 0x08, data at 0x10 |
//! | 0x2000 | [`abi::BootInfo`] |
//! | 0x3000 | PML4 |
//! | 0x4000 | PDPT |
//! | 0x5000.. | one page directory per GiB of RAM (2 MiB pages) |
//! | 0x70000..0x80000 | boot stack of the bootstrap vCPU |

use thiserror::Error;

/// GDT of the boot state.
pub const GDT_GPA: u64 = 0x1000;
/// BootInfo.
pub const BOOT_INFO_GPA: u64 = 0x2000;
/// PML4 of the boot page tables.
pub const PML4_GPA: u64 = 0x3000;
/// The PDPT.
pub const PDPT_GPA: u64 = 0x4000;
/// First page directory.
pub const PD_GPA: u64 = 0x5000;
/// Top of the bootstrap vCPU's stack.
pub const BOOT_STACK_TOP: u64 = 0x80000;
/// End of the reserved low region; the kernel must load at or above it.
pub const LOW_RESERVED_END: u64 = 0x10_0000;
/// Most guest RAM the boot page tables cover: the page directories must
/// fit below the boot stack.
pub const MAX_GUEST_MEM: u64 = ((BOOT_STACK_TOP - 0x10000 - PD_GPA) / 4096) << 30;

/// Selector of the boot code segment.
pub const KERNEL_CS: u16 = 0x08;
/// Selector of the boot data segment.
pub const KERNEL_DS: u16 = 0x10;
/// GDT entries: null, code (L=1, P, DPL 0, execute/read), data.
pub const GDT: [u64; 3] = [0, 0x00af_9b00_0000_ffff, 0x00cf_9300_0000_ffff];

/// A malformed or unsuitable kernel image.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ElfError {
    #[error("not an ELF file (bad magic)")]
    BadMagic,
    #[error("file too short ({0} bytes) for an ELF64 header")]
    Truncated(usize),
    #[error("not a 64-bit little-endian ELF")]
    NotElf64,
    #[error("not an x86-64 executable (e_machine {0})")]
    WrongMachine(u16),
    #[error("not a static executable (e_type {0}; need ET_EXEC)")]
    NotExecutable(u16),
    #[error("program header table out of the file")]
    BadProgramHeaders,
    #[error("segment {index}: file range out of the file")]
    SegmentOutOfFile { index: usize },
    #[error("segment {index}: memory size smaller than file size")]
    BadSegmentSize { index: usize },
    #[error("no loadable segment")]
    NoSegments,
    #[error("segment at {start:#x}..{end:#x} is outside guest RAM {low:#x}..{mem:#x}")]
    OutOfRam {
        start: u64,
        end: u64,
        low: u64,
        mem: u64,
    },
    #[error("entry point {0:#x} is outside every segment")]
    BadEntry(u64),
}

/// One PT_LOAD segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Guest-physical load address.
    pub paddr: u64,
    /// Offset of the file bytes.
    pub offset: usize,
    pub filesz: u64,
    pub memsz: u64,
}

/// A parsed kernel image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfImage {
    pub entry: u64,
    pub segments: Vec<Segment>,
    /// Lowest and one-past-highest loaded address, page-aligned.
    pub start: u64,
    pub end: u64,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}

const PT_LOAD: u32 = 1;
const PAGE: u64 = 4096;

/// Parses a static ELF64 x86-64 executable and checks that it loads into
/// guest RAM `[LOW_RESERVED_END, mem_size)` (physical addresses).
pub fn parse_elf(bytes: &[u8], mem_size: u64) -> Result<ElfImage, ElfError> {
    if bytes.len() < 4 || &bytes[..4] != b"\x7fELF" {
        return Err(ElfError::BadMagic);
    }
    if bytes.len() < 64 {
        return Err(ElfError::Truncated(bytes.len()));
    }
    if bytes[4] != 2 || bytes[5] != 1 {
        return Err(ElfError::NotElf64);
    }
    let e_type = u16_at(bytes, 16);
    let machine = u16_at(bytes, 18);
    if machine != 62 {
        return Err(ElfError::WrongMachine(machine));
    }
    if e_type != 2 {
        return Err(ElfError::NotExecutable(e_type));
    }
    let entry = u64_at(bytes, 24);
    let phoff = u64_at(bytes, 32);
    let phentsize = u16_at(bytes, 54) as u64;
    let phnum = u16_at(bytes, 56) as u64;
    let table_end = phentsize
        .checked_mul(phnum)
        .and_then(|n| n.checked_add(phoff));
    if phentsize < 56 || table_end.is_none_or(|end| end > bytes.len() as u64) {
        return Err(ElfError::BadProgramHeaders);
    }
    let mut segments = Vec::new();
    for index in 0..phnum as usize {
        let ph = (phoff + index as u64 * phentsize) as usize;
        if u32_at(bytes, ph) != PT_LOAD {
            continue;
        }
        let offset = u64_at(bytes, ph + 8);
        let paddr = u64_at(bytes, ph + 24);
        let filesz = u64_at(bytes, ph + 32);
        let memsz = u64_at(bytes, ph + 40);
        if offset
            .checked_add(filesz)
            .is_none_or(|end| end > bytes.len() as u64)
        {
            return Err(ElfError::SegmentOutOfFile { index });
        }
        if memsz < filesz {
            return Err(ElfError::BadSegmentSize { index });
        }
        let end = paddr.checked_add(memsz);
        if paddr < LOW_RESERVED_END || end.is_none_or(|end| end > mem_size) {
            return Err(ElfError::OutOfRam {
                start: paddr,
                end: end.unwrap_or(u64::MAX),
                low: LOW_RESERVED_END,
                mem: mem_size,
            });
        }
        if memsz == 0 {
            continue;
        }
        segments.push(Segment {
            paddr,
            offset: offset as usize,
            filesz,
            memsz,
        });
    }
    let start = segments
        .iter()
        .map(|s| s.paddr)
        .min()
        .ok_or(ElfError::NoSegments)?
        & !(PAGE - 1);
    let end = segments
        .iter()
        .map(|s| s.paddr + s.memsz)
        .max()
        .ok_or(ElfError::NoSegments)?
        .div_ceil(PAGE)
        * PAGE;
    if !segments
        .iter()
        .any(|s| entry >= s.paddr && entry < s.paddr + s.memsz)
    {
        return Err(ElfError::BadEntry(entry));
    }
    Ok(ElfImage {
        entry,
        segments,
        start,
        end,
    })
}

/// The memory map: the low region and the kernel reserved, the rest usable.
pub fn memory_map(mem_size: u64, kernel_start: u64, kernel_end: u64) -> Vec<abi::MemRegion> {
    let region = |base: u64, end: u64, kind: u32| abi::MemRegion {
        base,
        len: end - base,
        kind,
        reserved: 0,
    };
    let mut map = vec![region(0, LOW_RESERVED_END, abi::MEM_RESERVED)];
    if kernel_start > LOW_RESERVED_END {
        map.push(region(LOW_RESERVED_END, kernel_start, abi::MEM_USABLE));
    }
    map.push(region(kernel_start, kernel_end, abi::MEM_RESERVED));
    if mem_size > kernel_end {
        map.push(region(kernel_end, mem_size, abi::MEM_USABLE));
    }
    map
}

/// Page-table entries of the boot identity map: (gpa, value) pairs.
pub fn identity_map_entries(mem_size: u64) -> Vec<(u64, u64)> {
    const P_RW: u64 = 0b11;
    const PS: u64 = 1 << 7;
    let gibs = mem_size.div_ceil(1 << 30);
    let mut entries = vec![(PML4_GPA, PDPT_GPA | P_RW)];
    for gib in 0..gibs {
        let pd = PD_GPA + gib * PAGE;
        entries.push((PDPT_GPA + gib * 8, pd | P_RW));
        for i in 0..512 {
            let base = (gib << 30) + (i << 21);
            if base >= mem_size {
                break;
            }
            entries.push((pd + i * 8, base | P_RW | PS));
        }
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_elf(paddr: u64, entry: u64, code: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 0x78];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 2;
        f[5] = 1;
        f[6] = 1;
        f[16..18].copy_from_slice(&2u16.to_le_bytes());
        f[18..20].copy_from_slice(&62u16.to_le_bytes());
        f[24..32].copy_from_slice(&entry.to_le_bytes());
        f[32..40].copy_from_slice(&64u64.to_le_bytes());
        f[54..56].copy_from_slice(&56u16.to_le_bytes());
        f[56..58].copy_from_slice(&1u16.to_le_bytes());
        let ph = 64;
        f[ph..ph + 4].copy_from_slice(&PT_LOAD.to_le_bytes());
        f[ph + 8..ph + 16].copy_from_slice(&0x78u64.to_le_bytes());
        f[ph + 24..ph + 32].copy_from_slice(&paddr.to_le_bytes());
        f[ph + 32..ph + 40].copy_from_slice(&(code.len() as u64).to_le_bytes());
        f[ph + 40..ph + 48].copy_from_slice(&(code.len() as u64 + 100).to_le_bytes());
        f.extend_from_slice(code);
        f
    }

    #[test]
    fn parses_a_minimal_executable() {
        let image = parse_elf(&tiny_elf(0x20_0000, 0x20_0000, &[0xf4]), 1 << 30).unwrap();
        assert_eq!(image.entry, 0x20_0000);
        assert_eq!((image.start, image.end), (0x20_0000, 0x20_1000));
        assert_eq!(image.segments[0].offset, 0x78);
    }

    #[test]
    fn rejects_bad_images_with_a_reason() {
        assert_eq!(parse_elf(b"hello", 1 << 30), Err(ElfError::BadMagic));
        assert_eq!(parse_elf(b"\x7fELF", 1 << 30), Err(ElfError::Truncated(4)));
        let low = tiny_elf(0x1000, 0x1000, &[0xf4]);
        assert!(matches!(
            parse_elf(&low, 1 << 30),
            Err(ElfError::OutOfRam { .. })
        ));
        let bad_entry = tiny_elf(0x20_0000, 0x50_0000, &[0xf4]);
        assert_eq!(
            parse_elf(&bad_entry, 1 << 30),
            Err(ElfError::BadEntry(0x50_0000))
        );
        let mut truncated = tiny_elf(0x20_0000, 0x20_0000, &[0xf4; 16]);
        truncated.truncate(0x78 + 4);
        assert_eq!(
            parse_elf(&truncated, 1 << 30),
            Err(ElfError::SegmentOutOfFile { index: 0 })
        );
    }

    #[test]
    fn identity_map_covers_ram_with_2m_pages() {
        let entries = identity_map_entries(3 << 29); // 1.5 GiB
        assert_eq!(entries.len(), 1 + 2 + 768);
        assert!(entries.contains(&(PD_GPA + 0x1000 + 255 * 8, ((1 << 30) + (255 << 21)) | 0x83)));
        let map = memory_map(1 << 30, 0x20_0000, 0x30_0000);
        assert_eq!(map.len(), 4);
        assert_eq!(map.iter().map(|r| r.len).sum::<u64>(), 1 << 30);
    }
}
