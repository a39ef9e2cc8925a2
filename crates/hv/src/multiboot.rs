//! Multiboot v1 (the Multiboot Specification 0.6.96) boot, as QEMU's
//! `-kernel` does it: find the multiboot header in the image's first 8 KiB,
//! load the kernel (its ELF program headers, or the a.out kludge's
//! addresses when header flag 16 is set), place the modules after it on
//! page boundaries, and build the multiboot information structure (memory
//! bounds, the BIOS-style memory map, the command line, the modules, the
//! boot loader's name) at [`INFO_GPA`]. The CPU then starts in 32-bit
//! protected mode, paging off, flat segments, EAX = [`BOOTLOADER_MAGIC`],
//! EBX = the information structure.
//!
//! Everything here is pure (bytes in, plan out) so it can be tested
//! without a VM; `boot::boot_multiboot` writes the plan into guest memory.

use std::ops::Range;
use thiserror::Error;

/// The header's magic.
pub const HEADER_MAGIC: u32 = 0x1bad_b002;
/// EAX at entry.
pub const BOOTLOADER_MAGIC: u32 = 0x2bad_b002;
/// Where the header must lie: 4-byte aligned in the first 8 KiB.
const SEARCH_LEN: usize = 8192;
/// Where the information structure (and the memory map, strings and
/// module list after it) goes: conventional memory below the EBDA.
pub const INFO_GPA: u64 = 0x9000;
/// End of its room (above the real-mode trampolines OSes put at 0x8000).
const INFO_END: u64 = 0x1_0000;
/// Start of extended memory: modules go at or above it, and the memory
/// map's second available range starts here. Kernel segments may also use
/// conventional memory (below the EBDA at 0x9fc00, as QEMU allows: the
/// kvm-unit-tests `realmode` test loads at 0x8000); the info structure then
/// moves out of their way ([`info_gpa`]).
pub const LOAD_LOW: u64 = 0x10_0000;
/// End of conventional memory (the EBDA, video memory, the BIOS area with
/// the ACPI tables follow up to 1 MiB).
const CONVENTIONAL_END: u64 = 0x9_fc00;
/// Lowest address a kernel segment may use: above the real-mode IVT and
/// BIOS data area.
const CONVENTIONAL_LOW: u64 = 0x1000;

/// Header flags the loader understands; a kernel setting another bit in
/// 0..16 (a "must honour" request) is refused, as the spec asks.
mod flag {
    pub const PAGE_ALIGN_MODULES: u32 = 1 << 0;
    pub const MEMORY_INFO: u32 = 1 << 1;
    /// Video mode: a request the loader may ignore (QEMU does); no
    /// framebuffer here.
    pub const VIDEO_MODE: u32 = 1 << 2;
    pub const AOUT_KLUDGE: u32 = 1 << 16;
    pub const REQUIRED_MASK: u32 = 0xffff;
    pub const UNDERSTOOD: u32 = PAGE_ALIGN_MODULES | MEMORY_INFO | VIDEO_MODE;
}

/// Information structure flags.
mod info_flag {
    pub const MEMORY: u32 = 1 << 0;
    pub const CMDLINE: u32 = 1 << 2;
    pub const MODS: u32 = 1 << 3;
    pub const MMAP: u32 = 1 << 6;
    pub const LOADER_NAME: u32 = 1 << 9;
}

/// Memory map entry types.
pub mod mmap_type {
    pub const AVAILABLE: u32 = 1;
    pub const RESERVED: u32 = 2;
    pub const ACPI_RECLAIMABLE: u32 = 3;
}

/// Why an image cannot be booted as a multiboot kernel.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MultibootError {
    #[error("multiboot header at offset {offset:#x}: checksum does not add up to zero")]
    BadChecksum { offset: usize },
    #[error("multiboot header asks for features this loader does not offer (flags {flags:#x})")]
    UnsupportedFlags { flags: u32 },
    #[error("multiboot header at offset {offset:#x} is cut short by the end of the file")]
    Truncated { offset: usize },
    #[error("a.out kludge addresses are inconsistent: {0}")]
    BadAddresses(&'static str),
    #[error("not an ELF file and no a.out kludge addresses in the multiboot header")]
    NotLoadable,
    #[error("ELF: {0}")]
    Elf(&'static str),
    #[error(
        "segment {start:#x}..{end:#x} is outside the RAM a kernel may occupy ({low:#x}..{mem:#x})"
    )]
    OutOfRam {
        start: u64,
        end: u64,
        low: u64,
        mem: u64,
    },
    #[error("entry point {0:#x} is not inside a loaded segment")]
    EntryNotLoaded(u64),
    #[error(
        "modules do not fit in guest RAM after the kernel (need up to {need:#x}, have {mem:#x})"
    )]
    ModulesTooBig { need: u64, mem: u64 },
    #[error(
        "the information structure ({0} bytes with the command lines) does not fit below 0x10000"
    )]
    InfoTooBig(usize),
}

/// The header's fields this loader uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Offset of the header in the file.
    pub offset: usize,
    pub flags: u32,
    /// With flag 16: header_addr, load_addr, load_end_addr, bss_end_addr,
    /// entry_addr.
    pub aout: Option<[u32; 5]>,
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        bytes.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        bytes.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        bytes.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// The multiboot header of `image`, if it has one.
pub fn find_header(image: &[u8]) -> Result<Option<Header>, MultibootError> {
    let search = &image[..image.len().min(SEARCH_LEN)];
    let Some(offset) = (0..search.len().saturating_sub(11))
        .step_by(4)
        .find(|&at| u32_at(search, at) == Some(HEADER_MAGIC))
    else {
        return Ok(None);
    };
    let field =
        |i: usize| u32_at(image, offset + 4 * i).ok_or(MultibootError::Truncated { offset });
    let (flags, checksum) = (field(1)?, field(2)?);
    if HEADER_MAGIC.wrapping_add(flags).wrapping_add(checksum) != 0 {
        return Err(MultibootError::BadChecksum { offset });
    }
    if flags & flag::REQUIRED_MASK & !flag::UNDERSTOOD != 0 {
        return Err(MultibootError::UnsupportedFlags { flags });
    }
    let aout = if flags & flag::AOUT_KLUDGE != 0 {
        Some([field(3)?, field(4)?, field(5)?, field(6)?, field(7)?])
    } else {
        None
    };
    Ok(Some(Header {
        offset,
        flags,
        aout,
    }))
}

/// One piece of the kernel to load: `file` bytes at `paddr`, then zeros
/// up to `memsz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub paddr: u64,
    pub file: Range<usize>,
    pub memsz: u64,
}

/// Where the kernel goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelPlan {
    pub chunks: Vec<Chunk>,
    pub entry: u64,
    /// Lowest and one past the highest loaded address.
    pub start: u64,
    pub end: u64,
}

/// Plans the kernel's load: by the a.out kludge addresses if the header
/// has them, else by its ELF program headers (32- or 64-bit ELF), into
/// `[LOAD_LOW, end of the RAM below the PCI hole)`.
pub fn plan_kernel(
    image: &[u8],
    header: &Header,
    mem_size: u64,
) -> Result<KernelPlan, MultibootError> {
    let mem_size = crate::memslot::low_ram_end(mem_size);
    let (chunks, entry) = match header.aout {
        Some(addresses) => aout_chunks(image, header.offset, addresses)?,
        None => elf_chunks(image)?,
    };
    let chunks: Vec<Chunk> = chunks.into_iter().filter(|c| c.memsz != 0).collect();
    for c in &chunks {
        let end = c.paddr.saturating_add(c.memsz);
        let conventional = c.paddr >= CONVENTIONAL_LOW && end <= CONVENTIONAL_END;
        if !conventional && (c.paddr < LOAD_LOW || end > mem_size) {
            return Err(MultibootError::OutOfRam {
                start: c.paddr,
                end,
                low: LOAD_LOW,
                mem: mem_size,
            });
        }
    }
    if !chunks
        .iter()
        .any(|c| c.paddr <= entry && entry < c.paddr + c.memsz)
    {
        return Err(MultibootError::EntryNotLoaded(entry));
    }
    let start = chunks.iter().map(|c| c.paddr).min().unwrap_or(0);
    let end = chunks.iter().map(|c| c.paddr + c.memsz).max().unwrap_or(0);
    Ok(KernelPlan {
        chunks,
        entry,
        start,
        end,
    })
}

fn aout_chunks(
    image: &[u8],
    offset: usize,
    a: [u32; 5],
) -> Result<(Vec<Chunk>, u64), MultibootError> {
    let [header_addr, load_addr, load_end_addr, bss_end_addr, entry_addr] = a.map(u64::from);
    if load_addr > header_addr {
        return Err(MultibootError::BadAddresses("load_addr above header_addr"));
    }
    // The file offset that load_addr corresponds to.
    let file_start = (offset as u64).checked_sub(header_addr - load_addr).ok_or(
        MultibootError::BadAddresses("load_addr before the file's start"),
    )?;
    let file_len = if load_end_addr == 0 {
        (image.len() as u64).saturating_sub(file_start)
    } else {
        load_end_addr
            .checked_sub(load_addr)
            .ok_or(MultibootError::BadAddresses(
                "load_end_addr below load_addr",
            ))?
    };
    let file_end = file_start + file_len;
    if file_end > image.len() as u64 {
        return Err(MultibootError::BadAddresses(
            "load_end_addr past the end of the file",
        ));
    }
    let mem_end = if bss_end_addr == 0 {
        load_addr + file_len
    } else if bss_end_addr < load_addr + file_len {
        return Err(MultibootError::BadAddresses(
            "bss_end_addr below load_end_addr",
        ));
    } else {
        bss_end_addr
    };
    let chunk = Chunk {
        paddr: load_addr,
        file: file_start as usize..file_end as usize,
        memsz: mem_end - load_addr,
    };
    Ok((vec![chunk], entry_addr))
}

/// PT_LOAD segments of a little-endian x86 ELF, 32- or 64-bit, by
/// physical address.
fn elf_chunks(image: &[u8]) -> Result<(Vec<Chunk>, u64), MultibootError> {
    use MultibootError::Elf;
    if image.get(..4) != Some(b"\x7fELF") {
        return Err(MultibootError::NotLoadable);
    }
    let class64 = match image.get(4) {
        Some(1) => false,
        Some(2) => true,
        _ => return Err(Elf("unknown ELF class")),
    };
    if image.get(5) != Some(&1) {
        return Err(Elf("not little-endian"));
    }
    let bad = || Elf("header cut short");
    let (entry, phoff, phentsize, phnum) = if class64 {
        (
            u64_at(image, 24).ok_or_else(bad)?,
            u64_at(image, 32).ok_or_else(bad)?,
            u16_at(image, 54).ok_or_else(bad)?,
            u16_at(image, 56).ok_or_else(bad)?,
        )
    } else {
        (
            u64::from(u32_at(image, 24).ok_or_else(bad)?),
            u64::from(u32_at(image, 28).ok_or_else(bad)?),
            u16_at(image, 42).ok_or_else(bad)?,
            u16_at(image, 44).ok_or_else(bad)?,
        )
    };
    let min_entsize = if class64 { 56 } else { 32 };
    if usize::from(phentsize) < min_entsize {
        return Err(Elf("program header entries too small"));
    }
    let mut chunks = Vec::new();
    for i in 0..u64::from(phnum) {
        let ph = phoff
            .checked_add(i * u64::from(phentsize))
            .and_then(|p| usize::try_from(p).ok())
            .ok_or(Elf("program headers outside the file"))?;
        let short = || Elf("program headers outside the file");
        const PT_LOAD: u32 = 1;
        if u32_at(image, ph).ok_or_else(short)? != PT_LOAD {
            continue;
        }
        let (offset, paddr, filesz, memsz) = if class64 {
            (
                u64_at(image, ph + 8).ok_or_else(short)?,
                u64_at(image, ph + 24).ok_or_else(short)?,
                u64_at(image, ph + 32).ok_or_else(short)?,
                u64_at(image, ph + 40).ok_or_else(short)?,
            )
        } else {
            let f = |at| u32_at(image, ph + at).map(u64::from).ok_or_else(short);
            (f(4)?, f(12)?, f(16)?, f(20)?)
        };
        if filesz > memsz {
            return Err(Elf("segment file size larger than its memory size"));
        }
        let end = offset
            .checked_add(filesz)
            .filter(|&e| e <= image.len() as u64)
            .ok_or(Elf("segment data outside the file"))?;
        chunks.push(Chunk {
            paddr,
            file: offset as usize..end as usize,
            memsz,
        });
    }
    if chunks.is_empty() {
        return Err(Elf("no loadable segment"));
    }
    Ok((chunks, entry))
}

/// A module: its bytes go at `start` (page-aligned), its command line
/// into the info area.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModulePlacement {
    pub start: u64,
    pub len: u64,
    pub cmdline: String,
}

/// Places modules of `lens` bytes after `kernel_end`, each on a page
/// boundary.
pub fn place_modules(
    kernel_end: u64,
    modules: &[(u64, String)],
    mem_size: u64,
) -> Result<Vec<ModulePlacement>, MultibootError> {
    // Below the PCI hole (a 32-bit kernel reaches them there).
    let mem_size = crate::memslot::low_ram_end(mem_size);
    let mut at = kernel_end.max(LOAD_LOW).next_multiple_of(4096);
    let mut placed = Vec::new();
    for (len, cmdline) in modules {
        let end = at + len;
        if end > mem_size {
            return Err(MultibootError::ModulesTooBig {
                need: end,
                mem: mem_size,
            });
        }
        placed.push(ModulePlacement {
            start: at,
            len: *len,
            cmdline: cmdline.clone(),
        });
        at = end.next_multiple_of(4096);
    }
    Ok(placed)
}

/// The memory map: conventional memory, the EBDA/BIOS hole, the ACPI
/// tables' area (reclaimable), the rest of RAM below the PCI hole, and
/// RAM from 4 GiB up if there is more.
pub fn memory_map(mem_size: u64) -> Vec<(u64, u64, u32)> {
    let ranges = crate::memslot::ram_ranges(mem_size);
    let low = ranges[0].1;
    let mut map = vec![
        (0, 0x9_fc00, mmap_type::AVAILABLE),
        (0x9_fc00, 0xe_0000 - 0x9_fc00, mmap_type::RESERVED),
        (
            crate::devices::acpi::ACPI_BASE,
            crate::devices::acpi::ACPI_END - crate::devices::acpi::ACPI_BASE,
            mmap_type::ACPI_RECLAIMABLE,
        ),
        (LOAD_LOW, low - LOAD_LOW, mmap_type::AVAILABLE),
    ];
    map.extend(
        ranges[1..]
            .iter()
            .map(|&(start, len)| (start, len, mmap_type::AVAILABLE)),
    );
    map
}

/// Where the information structure goes: [`INFO_GPA`], or, if a kernel
/// segment uses that room, the first page after the kernel and its modules
/// (and at or above 1 MiB).
pub fn info_gpa(plan: &KernelPlan, modules: &[ModulePlacement]) -> u64 {
    let clash = plan
        .chunks
        .iter()
        .any(|c| c.paddr < INFO_END && c.paddr + c.memsz > INFO_GPA);
    if !clash {
        return INFO_GPA;
    }
    let end = modules
        .iter()
        .map(|m| m.start + m.len)
        .fold(plan.end.max(LOAD_LOW), u64::max);
    end.next_multiple_of(4096)
}

/// The information structure and what it points to, laid out from `at`
/// ([`info_gpa`]): the 88-byte structure, the memory map, the module
/// list, then the strings.
pub fn build_info(
    mem_size: u64,
    cmdline: &str,
    modules: &[ModulePlacement],
    at: u64,
) -> Result<Vec<u8>, MultibootError> {
    const INFO_LEN: usize = 88;
    let mut area = vec![0u8; INFO_LEN];
    let gpa = |area: &Vec<u8>| at + area.len() as u64;
    let put32 =
        |area: &mut Vec<u8>, at: usize, v: u32| area[at..at + 4].copy_from_slice(&v.to_le_bytes());

    let mmap_addr = gpa(&area);
    for (base, len, kind) in memory_map(mem_size) {
        area.extend(20u32.to_le_bytes()); // size of the rest of the entry
        area.extend(base.to_le_bytes());
        area.extend(len.to_le_bytes());
        area.extend(kind.to_le_bytes());
    }
    let mmap_len = gpa(&area) - mmap_addr;
    let mods_addr = gpa(&area);
    area.resize(area.len() + 16 * modules.len(), 0);
    let strings = |area: &mut Vec<u8>, s: &str| {
        let at = gpa(area);
        area.extend_from_slice(s.as_bytes());
        area.push(0);
        at as u32
    };
    let cmdline_addr = strings(&mut area, cmdline);
    let name_addr = strings(&mut area, "faultline");
    for (i, m) in modules.iter().enumerate() {
        let string = strings(&mut area, &m.cmdline);
        let entry = (mods_addr - at) as usize + 16 * i;
        put32(&mut area, entry, m.start as u32);
        put32(&mut area, entry + 4, (m.start + m.len) as u32);
        put32(&mut area, entry + 8, string);
    }
    let low = crate::memslot::low_ram_end(mem_size);
    let limit = if at == INFO_GPA { INFO_END } else { low };
    if at + area.len() as u64 > limit {
        return Err(MultibootError::InfoTooBig(area.len()));
    }
    let flags = info_flag::MEMORY
        | info_flag::CMDLINE
        | info_flag::MODS
        | info_flag::MMAP
        | info_flag::LOADER_NAME;
    put32(&mut area, 0, flags);
    put32(&mut area, 4, 639); // mem_lower, KiB (up to the EBDA)
    put32(
        &mut area,
        8,
        ((low - LOAD_LOW) / 1024).min(u64::from(u32::MAX)) as u32,
    ); // mem_upper: from 1 MiB to the first hole
    put32(&mut area, 16, cmdline_addr);
    put32(&mut area, 20, modules.len() as u32);
    put32(&mut area, 24, mods_addr as u32);
    put32(&mut area, 44, mmap_len as u32);
    put32(&mut area, 48, mmap_addr as u32);
    put32(&mut area, 64, name_addr);
    Ok(area)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A multiboot header with `flags` (and the a.out fields if given)
    /// at offset `at` of a zero image of `len` bytes.
    fn image_with_header(len: usize, at: usize, flags: u32, aout: Option<[u32; 5]>) -> Vec<u8> {
        let mut image = vec![0u8; len];
        let checksum = 0u32.wrapping_sub(HEADER_MAGIC).wrapping_sub(flags);
        let mut words = vec![HEADER_MAGIC, flags, checksum];
        words.extend(aout.unwrap_or_default());
        for (i, w) in words.iter().enumerate() {
            image[at + 4 * i..at + 4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
        image
    }

    const AOUT: u32 = 1 << 16;

    #[test]
    fn header_is_found_in_the_first_8k_on_a_4_byte_boundary() {
        let image = image_with_header(16384, 0x40, 3, None);
        let h = find_header(&image).unwrap().unwrap();
        assert_eq!((h.offset, h.flags, h.aout), (0x40, 3, None));
        // Past 8 KiB, or misaligned: not a multiboot image.
        assert_eq!(
            find_header(&image_with_header(16384, 8192, 3, None)).unwrap(),
            None
        );
        assert_eq!(
            find_header(&image_with_header(16384, 0x42, 3, None)).unwrap(),
            None
        );
        assert_eq!(find_header(b"").unwrap(), None);
    }

    #[test]
    fn malformed_headers_are_clear_errors() {
        let mut bad = image_with_header(64, 0, 3, None);
        bad[8] ^= 1;
        assert_eq!(
            find_header(&bad),
            Err(MultibootError::BadChecksum { offset: 0 })
        );
        let unknown = image_with_header(64, 0, 1 << 5, None);
        assert_eq!(
            find_header(&unknown),
            Err(MultibootError::UnsupportedFlags { flags: 1 << 5 })
        );
        // The a.out fields run past the end of the file.
        let mut cut = image_with_header(64, 0, AOUT, Some([0; 5]));
        cut.truncate(20);
        assert_eq!(
            find_header(&cut),
            Err(MultibootError::Truncated { offset: 0 })
        );
        let msg = find_header(&bad).unwrap_err().to_string();
        assert!(msg.contains("checksum"), "{msg}");
    }

    #[test]
    fn aout_kludge_loads_from_the_header_relative_offset() {
        // Header at file offset 0x10, header_addr 0x100010: the file loads
        // from offset 0 at 0x100000; 0x40 bytes, bss to 0x100100.
        let a = [0x10_0010, 0x10_0000, 0x10_0040, 0x10_0100, 0x10_0020];
        let image = image_with_header(0x80, 0x10, AOUT, Some(a));
        let h = find_header(&image).unwrap().unwrap();
        let plan = plan_kernel(&image, &h, 4 << 20).unwrap();
        assert_eq!(
            plan.chunks,
            [Chunk {
                paddr: 0x10_0000,
                file: 0..0x40,
                memsz: 0x100
            }]
        );
        assert_eq!(
            (plan.entry, plan.start, plan.end),
            (0x10_0020, 0x10_0000, 0x10_0100)
        );
        // Inconsistent addresses.
        for (a, what) in [
            ([0x10_0010, 0x10_0020, 0, 0, 0x10_0020], "load_addr above"),
            ([0x20_0010, 0x10_0000, 0, 0, 0x10_0020], "before the file"),
            (
                [0x10_0010, 0x10_0000, 0x10_1000, 0, 0x10_0020],
                "past the end",
            ),
            (
                [0x10_0010, 0x10_0000, 0x10_0040, 0x10_0020, 0x10_0020],
                "bss_end_addr",
            ),
        ] {
            let image = image_with_header(0x80, 0x10, AOUT, Some(a));
            let h = find_header(&image).unwrap().unwrap();
            let err = plan_kernel(&image, &h, 4 << 20).unwrap_err().to_string();
            assert!(err.contains(what), "{err}");
        }
        // Entry outside, load below 1 MiB, or past RAM.
        let image = image_with_header(
            0x80,
            0x10,
            AOUT,
            Some([0x10_0010, 0x10_0000, 0, 0, 0x50_0000]),
        );
        let h = find_header(&image).unwrap().unwrap();
        assert_eq!(
            plan_kernel(&image, &h, 4 << 20),
            Err(MultibootError::EntryNotLoaded(0x50_0000))
        );
        // Into the EBDA/BIOS hole below 1 MiB, or into the IVT page.
        for load in [0x9_fc00u32, 0x500] {
            let image = image_with_header(0x80, 0x10, AOUT, Some([load + 0x10, load, 0, 0, load]));
            let h = find_header(&image).unwrap().unwrap();
            assert!(
                matches!(
                    plan_kernel(&image, &h, 4 << 20),
                    Err(MultibootError::OutOfRam { .. })
                ),
                "{load:#x}"
            );
        }
    }

    /// Segments in conventional memory load, as QEMU loads them
    /// (kvm-unit-tests' realmode test at 0x8000); the info structure then
    /// moves above the kernel and the modules go above 1 MiB.
    #[test]
    fn kernels_may_load_in_conventional_memory() {
        // .bss up to 0xb000: over the info structure's usual room.
        let image = image_with_header(0x80, 0x10, AOUT, Some([0x8010, 0x8000, 0, 0xb000, 0x8000]));
        let h = find_header(&image).unwrap().unwrap();
        let plan = plan_kernel(&image, &h, 4 << 20).unwrap();
        assert_eq!(plan.start, 0x8000);
        let modules = place_modules(plan.end, &[(100, "m".into())], 4 << 20).unwrap();
        assert_eq!(modules[0].start, LOAD_LOW);
        let at = info_gpa(&plan, &modules);
        assert_eq!(at, LOAD_LOW + 4096);
        let info = build_info(4 << 20, "x", &modules, at).unwrap();
        let mmap_addr = u32::from_le_bytes(info[48..52].try_into().unwrap());
        assert_eq!(u64::from(mmap_addr), at + 88);
    }

    /// A 32-bit ELF with one PT_LOAD of `code` at `paddr` (memsz + 0x100)
    /// and a multiboot header (flags 3) in its data.
    fn elf32(paddr: u32, entry: u32, code: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 0x54];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 1;
        f[5] = 1;
        f[6] = 1;
        f[16..18].copy_from_slice(&2u16.to_le_bytes());
        f[18..20].copy_from_slice(&3u16.to_le_bytes());
        f[24..28].copy_from_slice(&entry.to_le_bytes());
        f[28..32].copy_from_slice(&52u32.to_le_bytes());
        f[42..44].copy_from_slice(&32u16.to_le_bytes());
        f[44..46].copy_from_slice(&1u16.to_le_bytes());
        let ph = 52;
        let w = |f: &mut Vec<u8>, at: usize, v: u32| {
            f[ph + at..ph + at + 4].copy_from_slice(&v.to_le_bytes())
        };
        w(&mut f, 0, 1);
        w(&mut f, 4, 0x54);
        w(&mut f, 8, paddr);
        w(&mut f, 12, paddr);
        w(&mut f, 16, code.len() as u32 + 12);
        w(&mut f, 20, code.len() as u32 + 12 + 0x100);
        let checksum = 0u32.wrapping_sub(HEADER_MAGIC).wrapping_sub(3);
        for v in [HEADER_MAGIC, 3, checksum] {
            f.extend(v.to_le_bytes());
        }
        f.extend_from_slice(code);
        f
    }

    #[test]
    fn elf32_segments_load_by_physical_address() {
        let image = elf32(0x20_0000, 0x20_000c, &[0xf4]);
        let h = find_header(&image).unwrap().unwrap();
        assert_eq!(h.offset, 0x54);
        let plan = plan_kernel(&image, &h, 4 << 20).unwrap();
        assert_eq!(
            plan.chunks,
            [Chunk {
                paddr: 0x20_0000,
                file: 0x54..0x54 + 13,
                memsz: 13 + 0x100
            }]
        );
        // Program headers pointing outside the file.
        let mut bad = image.clone();
        bad[28..32].copy_from_slice(&0xffffu32.to_le_bytes());
        assert!(matches!(
            plan_kernel(&bad, &h, 4 << 20),
            Err(MultibootError::Elf(_))
        ));
        let mut bad = image.clone();
        bad[52 + 16..52 + 20].copy_from_slice(&0x10000u32.to_le_bytes());
        assert!(matches!(
            plan_kernel(&bad, &h, 4 << 20),
            Err(MultibootError::Elf(_))
        ));
        // Not ELF and no a.out fields.
        let raw = image_with_header(64, 0, 3, None);
        let h = find_header(&raw).unwrap().unwrap();
        assert_eq!(
            plan_kernel(&raw, &h, 4 << 20),
            Err(MultibootError::NotLoadable)
        );
    }

    #[test]
    fn modules_are_page_aligned_after_the_kernel() {
        let mods = [(10, "a".to_string()), (5000, "b x".to_string())];
        let placed = place_modules(0x20_0100, &mods, 4 << 20).unwrap();
        assert_eq!(placed[0].start, 0x20_1000);
        assert_eq!(placed[1].start, 0x20_2000);
        assert_eq!(
            place_modules(0x20_0100, &[(4 << 20, String::new())], 4 << 20),
            Err(MultibootError::ModulesTooBig {
                need: 0x20_1000 + (4 << 20),
                mem: 4 << 20
            })
        );
    }

    #[test]
    fn info_structure_layout() {
        let mods = place_modules(0x20_0000, &[(10, "initrd".to_string())], 64 << 20).unwrap();
        let info = build_info(64 << 20, "console=ttyS0", &mods, INFO_GPA).unwrap();
        let at = |o: usize| u32_at(&info, o).unwrap();
        let string = |addr: u32| {
            let from = (u64::from(addr) - INFO_GPA) as usize;
            let len = info[from..].iter().position(|&b| b == 0).unwrap();
            String::from_utf8(info[from..from + len].to_vec()).unwrap()
        };
        assert_eq!(at(0), 0b10_0100_1101);
        assert_eq!((at(4), at(8)), (639, (63 << 20) / 1024));
        assert_eq!(string(at(16)), "console=ttyS0");
        assert_eq!(string(at(64)), "faultline");
        assert_eq!(at(20), 1);
        let m = (u64::from(at(24)) - INFO_GPA) as usize;
        assert_eq!((at(m), at(m + 4)), (0x20_0000, 0x20_000a));
        assert_eq!(string(at(m + 8)), "initrd");
        // The memory map: 24-byte entries, RAM and the ACPI area.
        let (len, base) = (at(44) as usize, (u64::from(at(48)) - INFO_GPA) as usize);
        assert_eq!(len, 4 * 24);
        let entries: Vec<(u64, u64, u32)> = (0..4)
            .map(|i| {
                let e = base + 24 * i;
                assert_eq!(at(e), 20);
                (
                    u64_at(&info, e + 4).unwrap(),
                    u64_at(&info, e + 12).unwrap(),
                    at(e + 20),
                )
            })
            .collect();
        assert_eq!(
            entries[2],
            (0xe_0000, 0x2_0000, mmap_type::ACPI_RECLAIMABLE)
        );
        assert_eq!(
            entries[3],
            (LOAD_LOW, (64 << 20) - LOAD_LOW, mmap_type::AVAILABLE)
        );
        let long = "x".repeat(30_000);
        assert!(matches!(
            build_info(64 << 20, &long, &[], INFO_GPA),
            Err(MultibootError::InfoTooBig(_))
        ));
    }
}
