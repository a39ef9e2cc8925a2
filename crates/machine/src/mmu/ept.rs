//! The EPT walker.
//!
//! STUB: to be implemented (see the helper task).

/// EPT entry bits (Intel SDM Vol. 3, 29.3.2).
pub mod epte {
    pub const READ: u64 = 1 << 0;
    pub const WRITE: u64 = 1 << 1;
    pub const EXEC: u64 = 1 << 2;
    /// Memory type (bits 5:3) of a leaf entry; 6 = write-back.
    pub const MEMTYPE_SHIFT: u32 = 3;
    pub const MEMTYPE_WB: u64 = 6 << MEMTYPE_SHIFT;
    pub const IGNORE_PAT: u64 = 1 << 6;
    /// Maps a 1 GiB (PDPTE) or 2 MiB (PDE) page.
    pub const HUGE: u64 = 1 << 7;
    pub const ACCESSED: u64 = 1 << 8;
    /// Dirty (leaf entries only).
    pub const DIRTY: u64 = 1 << 9;
    pub const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;
}
