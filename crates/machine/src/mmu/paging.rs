//! IA-32e (4-level) guest paging.
//!
//! STUB: to be implemented (see the helper task).

/// Page-table entry bits.
pub mod pte {
    pub const PRESENT: u64 = 1 << 0;
    pub const WRITABLE: u64 = 1 << 1;
    pub const USER: u64 = 1 << 2;
    pub const PWT: u64 = 1 << 3;
    pub const PCD: u64 = 1 << 4;
    pub const ACCESSED: u64 = 1 << 5;
    pub const DIRTY: u64 = 1 << 6;
    /// Page size (in PDPTE/PDE): maps a 1 GiB / 2 MiB page.
    pub const HUGE: u64 = 1 << 7;
    pub const GLOBAL: u64 = 1 << 8;
    pub const NX: u64 = 1 << 63;
    /// Address bits 51:12 of a 4 KiB-aligned table or page.
    pub const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;
}

/// #PF error-code bits.
pub mod pf_error {
    pub const PRESENT: u32 = 1 << 0;
    pub const WRITE: u32 = 1 << 1;
    pub const USER: u32 = 1 << 2;
    pub const RSVD: u32 = 1 << 3;
    pub const FETCH: u32 = 1 << 4;
}

/// MAXPHYADDR reported by CPUID.80000008H:EAX[7:0]; physical-address bits
/// above it in paging entries are reserved.
pub const MAX_PHYS_ADDR_BITS: u32 = 46;
