//! The ABI between faultline's hypervisor and its guest kernel: the boot
//! state, the boot-information block and the hypercalls.
//!
//! Shared by the host (this crate) and the guest (`guest/include/faultline_abi.h`,
//! C). Every `#[repr(C)]` struct has compile-time size and offset asserts
//! here and `_Static_assert`s with the same numbers in the header, so the
//! two cannot drift apart silently.
//!
//! # Boot state
//!
//! The bootstrap vCPU starts in 64-bit long mode at CPL 0 with interrupts
//! off, paging on through hv-built page tables that identity-map all guest
//! RAM with 2 MiB pages (writable, supervisor, executable), a GDT with a
//! 64-bit kernel code segment at 0x08 and a data segment at 0x10, RIP = the
//! kernel ELF's entry point, RSP = the top of a boot stack inside a reserved
//! region, and RDI = the guest-physical address of a [`BootInfo`] (so a C
//! entry point `void kmain(struct boot_info *)` receives it directly).
//! Application processors are started by [`HC_START_CPU`] in the same state
//! with the RIP, RSP and RDI the boot processor chose.
//!
//! # Hypercalls
//!
//! `vmcall` with KVM's register convention: RAX = number, RBX, RCX, RDX,
//! RSI = arguments, result in RAX; a negative result is an error from
//! [`errno`]. Unknown numbers return `-KVM_ENOSYS`, as KVM does.
#![no_std]

/// `BootInfo::magic`: "FLTBOOT1".
pub const BOOT_INFO_MAGIC: u64 = u64::from_le_bytes(*b"FLTBOOT1");
/// `BootInfo::version` of this layout.
pub const BOOT_INFO_VERSION: u32 = 1;
/// Capacity of `BootInfo::regions`.
pub const MAX_MEM_REGIONS: usize = 32;
/// Capacity of `BootInfo::apic_ids`.
pub const MAX_CPUS: usize = 64;
/// Capacity of `BootInfo::cmdline`, NUL included.
pub const CMDLINE_LEN: usize = 512;

/// `MemRegion::kind`: RAM the kernel may allocate.
pub const MEM_USABLE: u32 = 1;
/// `MemRegion::kind`: RAM holding the kernel image or boot structures.
pub const MEM_RESERVED: u32 = 2;

/// A range of guest-physical memory.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemRegion {
    /// Guest-physical base, 4 KiB aligned.
    pub base: u64,
    /// Length in bytes, a multiple of 4 KiB.
    pub len: u64,
    /// [`MEM_USABLE`] or [`MEM_RESERVED`].
    pub kind: u32,
    pub reserved: u32,
}

/// What the hypervisor tells the kernel at boot.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BootInfo {
    /// [`BOOT_INFO_MAGIC`].
    pub magic: u64,
    /// [`BOOT_INFO_VERSION`].
    pub version: u32,
    /// vCPUs in the VM (the boot processor is `apic_ids[0]`).
    pub num_cpus: u32,
    /// Guest RAM size in bytes.
    pub mem_size: u64,
    /// TSC frequency in Hz (virtual time: cycles per second).
    pub tsc_hz: u64,
    /// Guest-physical range of the loaded kernel image.
    pub kernel_start: u64,
    pub kernel_end: u64,
    /// Entries used in `regions`.
    pub num_regions: u32,
    pub reserved: u32,
    /// Memory map, sorted by base, non-overlapping.
    pub regions: [MemRegion; MAX_MEM_REGIONS],
    /// x2APIC ids of the vCPUs.
    pub apic_ids: [u32; MAX_CPUS],
    /// NUL-terminated command line: boot options, then `--`, then the
    /// program name and its arguments (e.g. `no-apf -- bm -f 4`).
    pub cmdline: [u8; CMDLINE_LEN],
}

impl Default for BootInfo {
    fn default() -> Self {
        BootInfo {
            magic: BOOT_INFO_MAGIC,
            version: BOOT_INFO_VERSION,
            num_cpus: 0,
            mem_size: 0,
            tsc_hz: 0,
            kernel_start: 0,
            kernel_end: 0,
            num_regions: 0,
            reserved: 0,
            regions: [MemRegion::default(); MAX_MEM_REGIONS],
            apic_ids: [0; MAX_CPUS],
            cmdline: [0; CMDLINE_LEN],
        }
    }
}

impl BootInfo {
    /// The structure as bytes, to copy into guest memory.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: BootInfo is repr(C), made only of integers and arrays of
        // integers with no padding (checked by the asserts below), so every
        // byte is initialized; the slice borrows `self`.
        unsafe {
            core::slice::from_raw_parts(
                (self as *const BootInfo).cast::<u8>(),
                core::mem::size_of::<BootInfo>(),
            )
        }
    }
}

// Layout asserts (mirrored by _Static_assert in faultline_abi.h).
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<MemRegion>() == 24);
    assert!(offset_of!(BootInfo, magic) == 0);
    assert!(offset_of!(BootInfo, version) == 8);
    assert!(offset_of!(BootInfo, num_cpus) == 12);
    assert!(offset_of!(BootInfo, mem_size) == 16);
    assert!(offset_of!(BootInfo, tsc_hz) == 24);
    assert!(offset_of!(BootInfo, kernel_start) == 32);
    assert!(offset_of!(BootInfo, kernel_end) == 40);
    assert!(offset_of!(BootInfo, num_regions) == 48);
    assert!(offset_of!(BootInfo, regions) == 56);
    assert!(offset_of!(BootInfo, apic_ids) == 56 + 24 * MAX_MEM_REGIONS);
    assert!(offset_of!(BootInfo, cmdline) == 56 + 24 * MAX_MEM_REGIONS + 4 * MAX_CPUS);
    assert!(size_of::<BootInfo>() == 56 + 24 * MAX_MEM_REGIONS + 4 * MAX_CPUS + CMDLINE_LEN);
};

/// KVM: wake a halted vCPU (RBX = flags, RCX = APIC id).
pub const KVM_HC_KICK_CPU: u64 = 5;
/// KVM: send IPIs (RBX/RCX = bitmap low/high, RDX = lowest APIC id, RSI = ICR).
pub const KVM_HC_SEND_IPI: u64 = 10;
/// KVM: yield to the vCPU with APIC id RBX.
pub const KVM_HC_SCHED_YIELD: u64 = 11;

/// First faultline-private hypercall number (outside KVM's range).
pub const HC_FAULTLINE_BASE: u64 = 0x4600_0000;
/// Start an application processor: RBX = APIC id, RCX = RIP, RDX = RSP,
/// RSI = value for RDI. Returns 0, `-EINVAL` (no such vCPU or not
/// canonical) or `-EBUSY` (already started).
pub const HC_START_CPU: u64 = HC_FAULTLINE_BASE;
/// Hand a result to the vmm: RBX = guest-physical address and RCX = length
/// of a UTF-8 line `key=value[ key=value...]`. Returns 0, `-EFAULT` or
/// `-E2BIG` (over [`REPORT_MAX`] bytes).
pub const HC_REPORT: u64 = HC_FAULTLINE_BASE + 1;
/// Power off with exit status RBX (the VM stops; does not return).
pub const HC_SHUTDOWN: u64 = HC_FAULTLINE_BASE + 2;
/// Longest [`HC_REPORT`] line.
pub const REPORT_MAX: u64 = 4096;

/// Hypercall error numbers, as KVM returns them (negated in RAX).
pub mod errno {
    pub const EPERM: i64 = 1;
    pub const E2BIG: i64 = 7;
    pub const EFAULT: i64 = 14;
    pub const EBUSY: i64 = 16;
    pub const EINVAL: i64 = 22;
    /// KVM's "no such hypercall" (`-KVM_ENOSYS` = -1000).
    pub const KVM_ENOSYS: i64 = 1000;
}

/// I/O port of the COM1 serial console.
pub const COM1_PORT: u16 = 0x3f8;
/// I/O port of the isa-debug-exit device: writing v exits with status
/// `(v << 1) | 1`.
pub const DEBUG_EXIT_PORT: u16 = 0xf4;
