//! The guest page-table walk the shadow MMU needs at a fault: the
//! hardware's IA-32e walk over the guest's tables in guest-physical memory
//! (present and reserved bits per level, U/S and R/W ANDed, XD ORed, the
//! access checked with CR0.WP, EFER.NXE, CR4.SMEP/SMAP), setting the
//! accessed bits of every entry used and the dirty bit of the leaf for a
//! write, only once the walk succeeded (as the machine's walker does).
//!
//! A walk that faults gives the #PF error code the bare machine would
//! have produced; the hv injects it with CR2 = the address.

use machine::cpu::state::{cr4, efer};
use machine::mmu::paging::{access_permitted, pf_error, pte, GuestPerms, MAX_PHYS_ADDR_BITS};
use machine::mmu::{Access, AccessKind, PagingRegs};
use machine::{Gfn, Gpa, Gva};

/// Guest-physical memory as the walker sees it.
pub(crate) trait GuestPtes {
    type Error;
    /// Reads the entry at `gpa`.
    fn read(&mut self, gpa: Gpa) -> Result<u64, Self::Error>;
    /// Replaces the entry at `gpa` if it still holds `old`.
    fn cmpxchg(&mut self, gpa: Gpa, old: u64, new: u64) -> Result<bool, Self::Error>;
}

/// Why a walk stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WalkError<E> {
    /// The guest must see a #PF with this error code.
    PageFault { error_code: u32 },
    /// Reading guest memory failed.
    Memory(E),
}

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

/// The W, U and I/D bits of a #PF for `access`.
fn error_code_base(access: Access, regs: &PagingRegs) -> u32 {
    let mut code = 0;
    if access.kind == AccessKind::Write {
        code |= pf_error::WRITE;
    }
    if access.user {
        code |= pf_error::USER;
    }
    if access.kind == AccessKind::Execute
        && (regs.efer & efer::NXE != 0 || regs.cr4 & cr4::SMEP != 0)
    {
        code |= pf_error::FETCH;
    }
    code
}

/// Walks the guest tables from `regs.cr3` for `access` to `gva`.
pub(crate) fn walk<M: GuestPtes>(
    mem: &mut M,
    regs: &PagingRegs,
    gva: Gva,
    access: Access,
) -> Result<GuestWalk, WalkError<M::Error>> {
    'retry: loop {
        let nxe = regs.efer & efer::NXE != 0;
        let fault = |extra: u32| WalkError::PageFault {
            error_code: error_code_base(access, regs) | extra,
        };
        let mut walk = GuestWalk {
            gfn: Gfn(0),
            level: 0,
            tables: [Gfn(0); 4],
            entries: [0; 4],
            perms: GuestPerms {
                writable: true,
                user: true,
                no_execute: false,
            },
            dirty: false,
        };
        let mut table = Gpa(regs.cr3 & pte::ADDR_MASK);
        let mut level = 4u8;
        loop {
            let index = (gva.0 >> (12 + 9 * (level as u32 - 1))) & 0x1ff;
            let entry = mem.read(table.add(index * 8)).map_err(WalkError::Memory)?;
            if entry & pte::PRESENT == 0 {
                return Err(fault(0));
            }
            if entry & reserved_bits(entry, level, nxe) != 0 {
                return Err(fault(pf_error::PRESENT | pf_error::RSVD));
            }
            walk.tables[level as usize - 1] = table.frame();
            walk.entries[level as usize - 1] = entry;
            walk.perms.writable &= entry & pte::WRITABLE != 0;
            walk.perms.user &= entry & pte::USER != 0;
            walk.perms.no_execute |= nxe && entry & pte::NX != 0;
            if level == 1 || entry & pte::HUGE != 0 {
                let span = 1u64 << (9 * (level as u32 - 1));
                let base = (entry & pte::ADDR_MASK) >> 12 & !(span - 1);
                walk.gfn = Gfn(base | (gva.0 >> 12) & (span - 1));
                walk.level = level;
                break;
            }
            table = Gpa(entry & pte::ADDR_MASK);
            level -= 1;
        }
        if !access_permitted(walk.perms, access, regs) {
            return Err(fault(pf_error::PRESENT));
        }
        // Accessed on every entry used, dirty on the leaf for a write.
        let mut table = Gpa(regs.cr3 & pte::ADDR_MASK);
        for l in (walk.level..=4).rev() {
            let i = l as usize - 1;
            let old = walk.entries[i];
            let mut new = old | pte::ACCESSED;
            if l == walk.level && access.kind == AccessKind::Write {
                new |= pte::DIRTY;
            }
            let index = (gva.0 >> (12 + 9 * (l as u32 - 1))) & 0x1ff;
            if new != old {
                if !mem
                    .cmpxchg(table.add(index * 8), old, new)
                    .map_err(WalkError::Memory)?
                {
                    continue 'retry;
                }
                walk.entries[i] = new;
            }
            table = Gpa(new & pte::ADDR_MASK);
        }
        walk.dirty = walk.entries[walk.level as usize - 1] & pte::DIRTY != 0;
        return Ok(walk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use machine::cpu::state::cr0;
    use std::collections::BTreeMap;

    struct Mem(BTreeMap<u64, u64>);
    impl GuestPtes for Mem {
        type Error = ();
        fn read(&mut self, gpa: Gpa) -> Result<u64, ()> {
            Ok(*self.0.get(&gpa.0).unwrap_or(&0))
        }
        fn cmpxchg(&mut self, gpa: Gpa, old: u64, new: u64) -> Result<bool, ()> {
            let e = self.0.entry(gpa.0).or_insert(0);
            if *e != old {
                return Ok(false);
            }
            *e = new;
            Ok(true)
        }
    }

    fn regs() -> PagingRegs {
        PagingRegs {
            cr0: cr0::PG | cr0::WP | cr0::PE,
            cr3: 0x1000,
            cr4: cr4::PAE,
            efer: efer::NXE | efer::LME | efer::LMA,
            rflags_ac: false,
        }
    }

    /// PML4 0x1000 -> PDPT 0x2000 -> PD 0x3000 -> PT 0x4000 -> page 0x9000
    /// for gva 0x20_1000, and a 2 MiB page at gva 0x40_0000 -> 0x60_0000.
    fn mem(leaf: u64) -> Mem {
        let rw = pte::PRESENT | pte::WRITABLE | pte::USER;
        Mem(BTreeMap::from([
            (0x1000, 0x2000 | rw),
            (0x2000, 0x3000 | rw),
            (0x3000 + 8, 0x4000 | rw),
            (0x3000 + 16, 0x60_0000 | rw | pte::HUGE),
            (0x4000 + 8, leaf),
        ]))
    }

    #[test]
    fn a_write_sets_accessed_everywhere_and_dirty_on_the_leaf() {
        let mut m = mem(0x9000 | pte::PRESENT | pte::WRITABLE);
        let w = walk(
            &mut m,
            &regs(),
            Gva(0x20_1234),
            Access {
                kind: AccessKind::Write,
                user: false,
            },
        )
        .unwrap();
        assert_eq!((w.gfn, w.level, w.dirty), (Gfn(9), 1, true));
        assert_eq!(w.tables, [Gfn(4), Gfn(3), Gfn(2), Gfn(1)]);
        assert_eq!(
            m.0[&0x4008] & (pte::ACCESSED | pte::DIRTY),
            pte::ACCESSED | pte::DIRTY
        );
        assert_ne!(m.0[&0x1000] & pte::ACCESSED, 0);
        assert_eq!(w.access_above(1, true), super::super::role::access::ALL);
    }

    #[test]
    fn faults_carry_the_hardware_error_code_and_change_nothing() {
        let user_write = Access {
            kind: AccessKind::Write,
            user: true,
        };
        let mut m = mem(0x9000 | pte::PRESENT);
        let before = m.0.clone();
        assert_eq!(
            walk(&mut m, &regs(), Gva(0x20_1000), user_write),
            Err(WalkError::PageFault { error_code: 0b111 })
        );
        assert_eq!(m.0, before, "no A/D on a fault");
        let mut m = mem(0);
        assert_eq!(
            walk(
                &mut m,
                &regs(),
                Gva(0x20_1000),
                Access {
                    kind: AccessKind::Execute,
                    user: false
                }
            ),
            Err(WalkError::PageFault {
                error_code: pf_error::FETCH
            })
        );
        let mut m = mem(0x9000 | pte::PRESENT | (1 << 50));
        assert_eq!(
            walk(
                &mut m,
                &regs(),
                Gva(0x20_1000),
                Access {
                    kind: AccessKind::Read,
                    user: false
                }
            ),
            Err(WalkError::PageFault {
                error_code: pf_error::PRESENT | pf_error::RSVD
            })
        );
    }

    #[test]
    fn a_2mib_page_gives_the_4kib_gfn_inside_it() {
        let mut m = mem(0);
        let w = walk(
            &mut m,
            &regs(),
            Gva(0x40_5000),
            Access {
                kind: AccessKind::Read,
                user: true,
            },
        )
        .unwrap();
        assert_eq!((w.gfn, w.level, w.dirty), (Gfn(0x605), 2, false));
    }
}
