//! The guest walk ([`crate::mmu::walk`]) as the shadow MMU uses it: the
//! guest table read at each level and the access each level grants, by
//! level (KVM's `guest_walker` arrays).

use crate::mmu::walk::GuestWalk as Walked;
use machine::mmu::paging::{pte, GuestPerms, MAX_PHYS_ADDR_BITS};
use machine::Gfn;

/// A successful walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GuestWalk {
    /// The gfn of the 4 KiB page holding the address.
    pub gfn: Gfn,
    /// Level of the leaf entry: 1 (4 KiB), 2 (2 MiB) or 3 (1 GiB).
    pub level: u8,
    /// Gfn of the guest table read at each level, index `level - 1`
    /// (entries above `level` are valid).
    pub tables: [Gfn; 4],
    /// The entries used, index `level - 1`, after the A/D update.
    pub entries: [u64; 4],
    /// Effective permissions over every level.
    pub perms: GuestPerms,
    /// The leaf's dirty bit (after the update).
    pub dirty: bool,
}

impl GuestWalk {
    /// The walker's answer by level (a walk with paging on).
    pub fn of(w: &Walked) -> GuestWalk {
        let mut walk = GuestWalk {
            gfn: w.gfn,
            level: w.level,
            tables: [Gfn(0); 4],
            entries: [0; 4],
            perms: GuestPerms {
                writable: w.writable,
                user: w.user,
                no_execute: !w.executable,
            },
            dirty: w.dirty,
        };
        for e in w.entries() {
            let i = e.level as usize - 1;
            walk.tables[i] = e.gpa.frame();
            walk.entries[i] = e.value;
        }
        walk
    }

    /// The "walk" of a guest with paging off: `gva` is the gpa, every
    /// access is allowed, and the whole address space is one direct
    /// mapping, as if a guest page at the root's level held it (so
    /// [`super::fetch::map`] builds direct pages from the root down).
    pub fn nonpaging(gva: machine::Gva) -> GuestWalk {
        let mut entries = [0; 4];
        entries[3] = pte::PRESENT | pte::WRITABLE | pte::USER;
        GuestWalk {
            gfn: Gfn(gva.0 >> 12),
            level: 4,
            tables: [Gfn(0); 4],
            entries,
            perms: GuestPerms {
                writable: true,
                user: true,
                no_execute: false,
            },
            dirty: true,
        }
    }

    /// The [`super::role::access`] bits the entries above `level` grant
    /// (`level` 4: the root, all of them).
    pub fn access_above(&self, level: u8, nxe: bool) -> u8 {
        let mut acc = super::role::access::ALL;
        // Levels below the leaf were not walked.
        for l in (level + 1).max(self.level)..=4 {
            acc &= entry_access(self.entries[l as usize - 1], nxe);
        }
        acc
    }
}

/// The [`super::role::access`] bits one entry grants.
pub(crate) fn entry_access(entry: u64, nxe: bool) -> u8 {
    use super::role::access;
    let mut acc = 0;
    if entry & pte::WRITABLE != 0 {
        acc |= access::WRITE;
    }
    if entry & pte::USER != 0 {
        acc |= access::USER;
    }
    if !(nxe && entry & pte::NX != 0) {
        acc |= access::EXEC;
    }
    acc
}

const PHYS_RESERVED: u64 = pte::ADDR_MASK & !((1 << MAX_PHYS_ADDR_BITS) - 1);
const RESERVED_2M: u64 = 0x001f_e000;
const RESERVED_1G: u64 = 0x3fff_e000;

/// Reserved bits of a guest entry at `level` (4 = PML4).
pub(crate) fn reserved_bits(entry: u64, level: u8, nxe: bool) -> u64 {
    let huge = entry & pte::HUGE != 0;
    let any = PHYS_RESERVED | if nxe { 0 } else { pte::NX };
    any | match (level, huge) {
        (4, _) => pte::HUGE,
        (3, true) => RESERVED_1G,
        (2, true) => RESERVED_2M,
        _ => 0,
    }
}
