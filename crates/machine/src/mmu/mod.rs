//! Address translation: the guest paging walker, the EPT walker and the TLB.
//!
//! Split by concern, as `arch/x86/kvm/mmu` is:
//! - [`paging`]: 4-level IA-32e paging (4 KiB, 2 MiB, 1 GiB pages; NX, U/S,
//!   R/W, A/D, CR0.WP, SMEP/SMAP), producing #PF error codes.
//! - [`ept`]: the EPT walker (4 levels, A/D, violation qualification,
//!   misconfiguration), applied to every guest-physical reference.
//! - [`tlb`]: a set-associative, VPID-tagged TLB of combined translations
//!   with the x86 flush rules.
//!
//! STUB: to be implemented (see the helper task); signatures are the contract.
#![allow(unused_variables)]

pub mod ept;
pub mod paging;
pub mod tlb;

use crate::addr::{Gpa, Gva, Hpa};
use crate::memory::{MemError, PhysMemory};
use crate::vmx::Eptp;
use tlb::Tlb;

/// What an access does with the byte it reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessKind {
    Read,
    Write,
    Execute,
}

/// One access to a linear address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    pub kind: AccessKind,
    /// A user-mode access: made at CPL 3 and not an implicit supervisor
    /// access (descriptor-table and TSS reads are implicit supervisor).
    pub user: bool,
}

/// The registers that define paging.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PagingRegs {
    pub cr0: u64,
    pub cr3: u64,
    pub cr4: u64,
    pub efer: u64,
    /// RFLAGS.AC (for SMAP).
    pub rflags_ac: bool,
}

/// Everything a translation depends on besides the address.
#[derive(Debug, Clone, Copy)]
pub struct TranslateCtx<'a> {
    pub mem: &'a PhysMemory,
    pub regs: PagingRegs,
    /// EPT of the running guest; `None` in bare mode or guest mode without
    /// EPT (guest-physical = host-physical).
    pub ept: Option<Eptp>,
    /// VPID tag for TLB entries (0 in bare mode).
    pub vpid: u16,
}

/// Why a translation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TranslateError {
    /// A #PF for the guest: CR2 = `gva`, with this error code (P, W, U,
    /// RSVD, I/D bits).
    PageFault { gva: Gva, error_code: u32 },
    /// The address is not canonical (the CPU raises #GP or #SS).
    NonCanonical { gva: Gva },
    /// EPT forbids a guest-physical access.
    EptViolation {
        gpa: Gpa,
        gla: Option<Gva>,
        qualification: u64,
    },
    /// An EPT entry is misconfigured.
    EptMisconfig { gpa: Gpa },
    /// A walk or the final access fell outside host-physical memory.
    Memory(MemError),
}

impl From<MemError> for TranslateError {
    fn from(e: MemError) -> Self {
        TranslateError::Memory(e)
    }
}

/// Translates `gva` for `access`, through the TLB and on a miss through a
/// page walk (guest paging, and EPT for every guest-physical reference),
/// setting accessed/dirty flags as hardware does and filling the TLB.
///
/// Adds the number of memory references the walk made to `walk_refs` (0 on
/// a TLB hit; up to 24 for a 2-D walk). Returns the host-physical address
/// of `gva` itself (not the page base).
#[inline]
pub fn translate(
    tlb: &mut Tlb,
    ctx: &TranslateCtx<'_>,
    gva: Gva,
    access: Access,
    walk_refs: &mut u64,
) -> Result<Hpa, TranslateError> {
    todo!()
}
