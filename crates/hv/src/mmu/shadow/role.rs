//! Shadow page roles (KVM's `kvm_mmu_page_role` for shadow paging).
//!
//! A shadow page translates one guest page table (or, when direct, one
//! guest huge page) under one guest paging context. Two shadow pages of the
//! same guest table differ when anything that changes the translation
//! differs: the level, the access the entries above granted (a table
//! reached through a read-only PDE must not yield writable sptes), and the
//! paging-mode bits that change permission checks (CR0.WP, EFER.NXE,
//! CR4.SMEP, CR4.SMAP).

use machine::cpu::state::{cr0, cr4, efer};

/// Access bits accumulated over the guest entries above a page.
pub(crate) mod access {
    /// Writes allowed by every entry above.
    pub const WRITE: u8 = 1 << 0;
    /// User accesses allowed by every entry above.
    pub const USER: u8 = 1 << 1;
    /// Instruction fetches allowed (no NX above).
    pub const EXEC: u8 = 1 << 2;
    /// Everything (a root: nothing above it).
    pub const ALL: u8 = WRITE | USER | EXEC;
}

/// The guest paging context a shadow page was made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PagingContext {
    /// Guest paging is on (CR0.PG). Off, the guest's linear addresses are
    /// its physical ones (real mode, protected mode without paging): the
    /// shadow is one direct mapping, gva = gpa (KVM's `nonpaging_*` MMU),
    /// and the other fields are all false, since nothing else changes
    /// that translation.
    pub paging: bool,
    pub cr0_wp: bool,
    pub nxe: bool,
    pub smep: bool,
    pub smap: bool,
}

impl PagingContext {
    /// The context of a guest with paging off.
    pub const NONPAGING: PagingContext = PagingContext {
        paging: false,
        cr0_wp: false,
        nxe: false,
        smep: false,
        smap: false,
    };

    /// The context of guest-visible CR0, CR4 and EFER.
    pub fn of(guest_cr0: u64, guest_cr4: u64, guest_efer: u64) -> Self {
        if guest_cr0 & cr0::PG == 0 {
            return PagingContext::NONPAGING;
        }
        PagingContext {
            paging: true,
            cr0_wp: guest_cr0 & cr0::WP != 0,
            nxe: guest_efer & efer::NXE != 0,
            smep: guest_cr4 & cr4::SMEP != 0,
            smap: guest_cr4 & cr4::SMAP != 0,
        }
    }
}

/// The shadow part of a page's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ShadowRole {
    /// [`access`] bits granted by the guest entries above the page.
    pub access: u8,
    pub context: PagingContext,
}
