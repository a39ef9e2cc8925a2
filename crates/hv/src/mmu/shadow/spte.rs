//! The shadow spte: an x86-64 page-table entry as the hv writes it into
//! the tables the CPU walks under shadow paging.
//!
//! | bits  | field | meaning |
//! |-------|-------|---------|
//! | 0     | `PRESENT` | hardware |
//! | 1     | `WRITABLE` | hardware: writes allowed (leaf: the guest allows them, its dirty bit is set, the gfn is not write-tracked) |
//! | 2     | `USER` | hardware: the guest's U/S over every level |
//! | 5     | `ACCESSED` | hardware: set by the CPU on use (the pager's test-and-clear-young) |
//! | 6     | `DIRTY` | hardware, leaf: set by the CPU on write (the pager's dirty check) |
//! | 11    | `MMU_PRESENT` | software: installed by the MMU |
//! | 51:12 | `ADDR` | hardware: host frame of the page or next table |
//! | 57    | `HOST_WRITABLE` | software: the memslot is writable |
//! | 58    | `MMU_WRITABLE` | software: the MMU allows writes |
//! | 63    | `NX` | hardware: the guest's XD over every level (with EFER.NXE) |
//!
//! Bit 8 (global) is never set: a guest CR3 switch changes the shadow root
//! and must drop every translation. The CPU ignores bits 11 and 52-58 of
//! a PTE, so the software bits never change translation.

pub const PRESENT: u64 = 1 << 0;
pub const WRITABLE: u64 = 1 << 1;
pub const USER: u64 = 1 << 2;
pub const ACCESSED: u64 = 1 << 5;
pub const DIRTY: u64 = 1 << 6;
pub const MMU_PRESENT: u64 = super::super::spte::MMU_PRESENT;
pub const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;
pub const HOST_WRITABLE: u64 = super::super::spte::HOST_WRITABLE;
pub const MMU_WRITABLE: u64 = super::super::spte::MMU_WRITABLE;
pub const NX: u64 = 1 << 63;

const FIELDS: [u64; 10] = [
    PRESENT,
    WRITABLE,
    USER,
    ACCESSED,
    DIRTY,
    MMU_PRESENT,
    ADDR_MASK,
    HOST_WRITABLE,
    MMU_WRITABLE,
    NX,
];

const _: () = {
    let mut i = 0;
    while i < FIELDS.len() {
        let mut j = i + 1;
        while j < FIELDS.len() {
            assert!(FIELDS[i] & FIELDS[j] == 0, "shadow spte fields overlap");
            j += 1;
        }
        i += 1;
    }
};

/// A non-leaf entry: every permission (the leaf decides), accessed already
/// set so the CPU need not write it.
pub const fn make_nonleaf(table_hpa: u64) -> u64 {
    (table_hpa & ADDR_MASK) | PRESENT | WRITABLE | USER | ACCESSED | MMU_PRESENT
}

/// Permissions of a shadow leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeafPerms {
    pub writable: bool,
    pub user: bool,
    pub no_execute: bool,
    /// The memslot allows writes.
    pub host_writable: bool,
}

/// A 4 KiB leaf mapping `frame_hpa`.
pub const fn make_leaf(frame_hpa: u64, p: LeafPerms) -> u64 {
    let mut spte = (frame_hpa & ADDR_MASK) | PRESENT | MMU_PRESENT;
    if p.writable {
        spte |= WRITABLE | MMU_WRITABLE;
    }
    if p.host_writable {
        spte |= HOST_WRITABLE;
    }
    if p.user {
        spte |= USER;
    }
    if p.no_execute {
        spte |= NX;
    }
    spte
}

pub const fn is_present(spte: u64) -> bool {
    spte & MMU_PRESENT != 0
}

pub const fn frame(spte: u64) -> machine::Hfn {
    machine::Hpa(spte & ADDR_MASK).frame()
}

/// Writable implies MMU-writable implies host-writable.
pub const fn writable_bits_consistent(spte: u64) -> bool {
    (spte & WRITABLE == 0 || spte & MMU_WRITABLE != 0)
        && (spte & MMU_WRITABLE == 0 || spte & HOST_WRITABLE != 0)
}
