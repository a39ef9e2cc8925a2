//! A kernel image and where it goes: the guest-physical layout of the
//! boot structures, a checked image's place in guest RAM, and why an
//! image (ELF, multiboot's ELF, a bzImage) cannot be booted. Plain data
//! on the lowest floor, so the VM can name them without reaching up to
//! the loaders (`boot`, `multiboot`, `linux`), which build VMs.

pub mod bzimage;

use bzimage::BzImageError;
use machine::addr::PAGE_SIZE;
use machine::elf::ElfError;
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
pub const MAX_GUEST_MEM: u64 = ((BOOT_STACK_TOP - 0x10000 - PD_GPA) / PAGE_SIZE) << 30;

/// GDT entries: null, code (L=1, P, DPL 0, execute/read), data.
pub const GDT: [u64; 3] = [0, 0x00af_9b00_0000_ffff, 0x00cf_9300_0000_ffff];

/// A kernel image hv cannot boot: malformed as an ELF file, or a valid
/// executable that does not fit the boot layout.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KernelError {
    /// Rejected by the ELF parser or loader.
    #[error("{0}")]
    Elf(#[from] ElfError),
    /// A segment lies (partly) outside the guest RAM a kernel may occupy.
    #[error(
        "segment {index} (physical {start:#x}..{end:#x}) is outside the guest RAM a kernel may occupy ({low:#x}..{mem:#x})"
    )]
    OutOfRam {
        index: usize,
        start: u64,
        end: u64,
        low: u64,
        mem: u64,
    },
    /// The entry point is not a loaded executable byte at its identity-mapped
    /// (physical) address.
    #[error(
        "entry point {0:#x} is not inside the physical range of an executable segment (the boot page tables identity-map guest RAM)"
    )]
    EntryNotLoaded(u64),
}

/// Where a checked kernel image lies in guest RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelImage {
    /// Guest address of the first instruction (virtual = physical at boot).
    pub entry: u64,
    /// Lowest loaded guest-physical address, rounded down to a page.
    pub start: u64,
    /// One past the highest loaded guest-physical address, rounded up to a
    /// page.
    pub end: u64,
}

/// Why a Linux kernel cannot be booted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LinuxBootError {
    #[error("{0}")]
    BzImage(#[from] BzImageError),
    #[error("command line of {len} bytes is too long: the kernel takes at most {max}")]
    CmdlineTooLong { len: usize, max: usize },
    #[error("the command line has a NUL byte")]
    CmdlineNul,
    #[error(
        "guest RAM of {mem} MiB is too small for the kernel: it needs {need:#x}..{end:#x} (its init_size) below the initrd at {initrd:#x}",
        mem = .mem >> 20
    )]
    NoRoomForKernel {
        need: u64,
        end: u64,
        initrd: u64,
        mem: u64,
    },
    #[error("the initrd of {len} bytes does not fit below {limit:#x}")]
    InitrdTooBig { len: u64, limit: u64 },
    #[error("Linux boot needs --mmu ept or shadow, not none")]
    Native,
}

/// Page-table entries of the boot identity map: (gpa, value) pairs.
pub fn identity_map_entries(mem_size: u64) -> Vec<(u64, u64)> {
    const P_RW: u64 = 0b11;
    const PS: u64 = 1 << 7;
    let gibs = mem_size.div_ceil(1 << 30);
    let mut entries = vec![(PML4_GPA, PDPT_GPA | P_RW)];
    for gib in 0..gibs {
        let pd = PD_GPA + gib * PAGE_SIZE;
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
