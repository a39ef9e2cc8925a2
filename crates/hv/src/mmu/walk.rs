//! The guest page-table walker (KVM's `paging_tmpl.h` `walk_addr`): the
//! shadow MMU's view of what the guest's own page tables say.
//!
//! It emulates the 4-level IA-32e walk exactly as the machine's CPU does
//! (`machine::mmu::paging`, the reference), because a fault the shadow MMU
//! injects must be the fault the bare machine would have raised:
//!
//! - entries are read top level first; a not-present entry stops the walk
//!   (error code without P), then reserved bits (physical-address bits at or
//!   above MAXPHYADDR, XD without EFER.NXE, PS in a PML4E, the address bits
//!   20:13 / 29:13 of a 2 MiB / 1 GiB leaf) stop it with P | RSVD;
//! - R/W and U/S are ANDed over the levels, XD (with EFER.NXE) ORed;
//! - the access is then checked against them with CR0.WP, CR4.SMEP and
//!   CR4.SMAP (RFLAGS.AC lifts SMAP for explicit supervisor accesses only);
//!   a denied access is a fault with P;
//! - the error code carries W/R and U/S from the access, and I/D for a
//!   fetch only when EFER.NXE or CR4.SMEP is on (SDM 4.7);
//! - only when the access is allowed are the A flags set in every entry used
//!   (top level first) and D in the leaf for a write, each by a
//!   compare-and-exchange against the value the walk read; if an entry
//!   changed under the walk it starts again, as the CPU does. A faulting
//!   walk leaves the tables untouched (the machine's choice, which the SDM
//!   allows and which is Intel's behaviour for the leaf).
//!
//! PCIDs, 5-level paging and protection keys are not modelled by the
//! machine, so not here either. With CR0.PG clear there is nothing to walk:
//! the address is guest-physical and every access is allowed.

use machine::cpu::state::{cr0, cr4, efer};
use machine::mmu::paging::{pf_error, pte, MAX_PHYS_ADDR_BITS};
use machine::mmu::AccessKind;
use machine::{Gfn, Gpa, Gva};
use thiserror::Error;

/// Physical-address bits 51:MAXPHYADDR, reserved in every entry.
const PHYS_ADDR_RESERVED: u64 = pte::ADDR_MASK & !((1 << MAX_PHYS_ADDR_BITS) - 1);
/// Reserved address bits of a 2 MiB leaf (20:13; bit 12 is PAT).
const RESERVED_2M: u64 = 0x001f_e000;
/// Reserved address bits of a 1 GiB leaf (29:13; bit 12 is PAT).
const RESERVED_1G: u64 = 0x3fff_e000;

/// How many times a walk starts again because an entry changed between its
/// read and its A/D update before giving up with [`WalkError::Raced`].
/// Every restart means another agent's write landed, so a real race ends
/// long before this; the bound only stops a broken [`GuestPtes`] from
/// hanging the host.
const MAX_RESTARTS: u32 = 64;

/// Why a guest paging-structure entry could not be read or updated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub(crate) enum PteError {
    /// The entry's address is not guest RAM (outside every memslot, or
    /// MMIO): the walk cannot go on. Hardware would read whatever the bus
    /// returns; the caller decides what the guest sees.
    #[error("guest page-table entry at gpa {gpa} is not in guest RAM")]
    NotRam { gpa: Gpa },
    /// The page holding the entry is not resident (swapped out, or its
    /// page-in is in flight): the caller faults `gfn` in and walks again.
    #[error("guest page table {gfn:?} is not resident")]
    NotResident { gfn: Gfn },
}

/// Reads and updates guest paging-structure entries by guest-physical
/// address.
pub(crate) trait GuestPtes {
    /// The 8-byte entry at `gpa` (8-byte aligned).
    fn read_pte(&mut self, gpa: Gpa) -> Result<u64, PteError>;
    /// Atomically sets `bits` in the entry at `gpa` if it still equals
    /// `old`; `Ok(false)` if it did not (nothing written).
    fn try_set_bits(&mut self, gpa: Gpa, old: u64, bits: u64) -> Result<bool, PteError>;
}

/// The guest's paging registers, as the guest sees them (the read shadows
/// under shadow paging, not what the machine runs with).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct PagingContext {
    pub cr0: u64,
    pub cr3: u64,
    pub cr4: u64,
    pub efer: u64,
}

impl PagingContext {
    fn paging(&self) -> bool {
        self.cr0 & cr0::PG != 0
    }
    fn nxe(&self) -> bool {
        self.efer & efer::NXE != 0
    }
    fn smep(&self) -> bool {
        self.cr4 & cr4::SMEP != 0
    }
    fn smap(&self) -> bool {
        self.cr4 & cr4::SMAP != 0
    }
    fn wp(&self) -> bool {
        self.cr0 & cr0::WP != 0
    }
}

/// One access to a linear address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Access {
    pub kind: AccessKind,
    /// Made at CPL 3.
    pub cpl3: bool,
    /// An implicit supervisor access (descriptor tables, TSS, interrupt
    /// frames): a supervisor access whatever the CPL, and SMAP ignores
    /// RFLAGS.AC for it.
    pub implicit_supervisor: bool,
    /// RFLAGS.AC at the time of the access.
    pub rflags_ac: bool,
}

impl Access {
    /// An explicit access by an instruction at CPL 3 (`user`) or CPL 0-2.
    pub fn new(kind: AccessKind, user: bool, rflags_ac: bool) -> Access {
        Access {
            kind,
            cpl3: user,
            implicit_supervisor: false,
            rflags_ac,
        }
    }

    /// The access a #PF error code describes, as the shadow MMU sees an
    /// intercepted fault: W, U and I/D from the code. A supervisor access
    /// at CPL 3 can only be implicit. The CPU reports I/D only with
    /// EFER.NXE or CR4.SMEP on; without both a fetch looks like a read,
    /// and the two differ under SMAP (it blocks supervisor reads of user
    /// pages, not fetches), so a shadow MMU must run the hardware with NXE
    /// on whatever the guest's (as KVM does) for the code to be exact.
    pub fn from_error_code(error_code: u32, cpl: u8, rflags_ac: bool) -> Access {
        let kind = if error_code & pf_error::FETCH != 0 {
            AccessKind::Execute
        } else if error_code & pf_error::WRITE != 0 {
            AccessKind::Write
        } else {
            AccessKind::Read
        };
        Access::reported(kind, error_code & pf_error::USER != 0, cpl, rflags_ac)
    }

    /// An access of `kind` the CPU reported as a user (`user`) or
    /// supervisor access, made at `cpl`: a supervisor access at CPL 3 can
    /// only be implicit.
    pub fn reported(kind: AccessKind, user: bool, cpl: u8, rflags_ac: bool) -> Access {
        Access {
            kind,
            cpl3: cpl == 3,
            implicit_supervisor: cpl == 3 && !user,
            rflags_ac,
        }
    }

    /// A user-mode access for the paging rules: CPL 3 and not implicit.
    pub fn user(&self) -> bool {
        self.cpl3 && !self.implicit_supervisor
    }

    /// Whether RFLAGS.AC lifts SMAP for this access.
    fn ac(&self) -> bool {
        self.rflags_ac && !self.implicit_supervisor
    }
}

/// One paging-structure entry a walk used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WalkEntry {
    /// Guest-physical address of the entry (its table is `gpa.frame()`).
    pub gpa: Gpa,
    /// The entry after the walk's A/D update.
    pub value: u64,
    /// Level of the table holding it: 4 = PML4 ... 1 = PT.
    pub level: u8,
    /// R/W, U/S and XD accumulated from the PML4E down to this entry
    /// (KVM's `pte_access` per level: what a shadow page below it may
    /// grant at most).
    pub access: Permissions,
}

/// Permissions accumulated over paging-structure entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Permissions {
    /// R/W set at every level.
    pub writable: bool,
    /// U/S set at every level.
    pub user: bool,
    /// No level has XD set (with EFER.NXE on).
    pub executable: bool,
}

/// A successful walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GuestWalk {
    entries: [WalkEntry; 4],
    len: u8,
    /// Level of the leaf: 1 (4 KiB page), 2 (2 MiB), 3 (1 GiB); 1 with
    /// paging off.
    pub level: u8,
    /// Guest-physical address of the accessed byte.
    pub gpa: Gpa,
    /// The 4 KiB guest frame holding it.
    pub gfn: Gfn,
    /// R/W set at every level.
    pub writable: bool,
    /// U/S set at every level.
    pub user: bool,
    /// No level has XD set (with EFER.NXE on).
    pub executable: bool,
    /// The leaf's D flag after the walk (set by it for a write).
    pub dirty: bool,
}

impl GuestWalk {
    /// No entries and every permission: the start of a walk, and the
    /// whole answer with paging off.
    fn unwalked(gpa: Gpa) -> GuestWalk {
        GuestWalk {
            entries: [EMPTY_ENTRY; 4],
            len: 0,
            level: 1,
            gpa,
            gfn: gpa.frame(),
            writable: true,
            user: true,
            executable: true,
            dirty: false,
        }
    }

    /// The entries used, top level first (none with paging off).
    pub fn entries(&self) -> &[WalkEntry] {
        &self.entries[..self.len as usize]
    }

    /// The leaf entry (`None` with paging off).
    pub fn leaf(&self) -> Option<&WalkEntry> {
        self.entries().last()
    }
}

/// Why a walk gave no translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub(crate) enum WalkError {
    /// The guest takes a #PF: CR2 = `address`, this error code.
    #[error("guest #PF at {address}, error code {error_code:#x}")]
    PageFault { error_code: u32, address: Gva },
    /// The address is not canonical: the CPU raises #GP (#SS for stack
    /// accesses) before any walk.
    #[error("non-canonical address {address}")]
    NonCanonical { address: Gva },
    /// An entry could not be read or updated.
    #[error(transparent)]
    Pte(#[from] PteError),
    /// Entries kept changing under the walk; re-enter the guest and let
    /// the access happen again.
    #[error("guest page-table entries for {address} kept changing during the walk")]
    Raced { address: Gva },
}

/// Walks the guest page tables for `access` to `gva` as the CPU would,
/// setting A/D flags, and returns the translation or the fault the guest
/// must see.
pub(crate) fn walk(
    ptes: &mut impl GuestPtes,
    ctx: &PagingContext,
    gva: Gva,
    access: Access,
) -> Result<GuestWalk, WalkError> {
    if !machine::addr::is_canonical(gva.0) {
        return Err(WalkError::NonCanonical { address: gva });
    }
    if !ctx.paging() {
        return Ok(GuestWalk::unwalked(Gpa(gva.0)));
    }
    for _ in 0..MAX_RESTARTS {
        if let Some(w) = walk_once(ptes, ctx, gva, access)? {
            return Ok(w);
        }
    }
    Err(WalkError::Raced { address: gva })
}

const EMPTY_ENTRY: WalkEntry = WalkEntry {
    gpa: Gpa(0),
    value: 0,
    level: 0,
    access: Permissions {
        writable: true,
        user: true,
        executable: true,
    },
};

/// One attempt; `Ok(None)` if an entry changed before its A/D update.
fn walk_once(
    ptes: &mut impl GuestPtes,
    ctx: &PagingContext,
    gva: Gva,
    access: Access,
) -> Result<Option<GuestWalk>, WalkError> {
    let fault = |extra: u32| WalkError::PageFault {
        error_code: error_code_base(ctx, access) | extra,
        address: gva,
    };
    let reserved_every_level = PHYS_ADDR_RESERVED | if ctx.nxe() { 0 } else { pte::NX };

    let mut walk = GuestWalk::unwalked(Gpa(0));
    let mut table = Gpa(ctx.cr3 & pte::ADDR_MASK);
    let mut level = 4u8;
    loop {
        let index = (gva.0 >> (12 + 9 * (level as u32 - 1))) & 0x1ff;
        let entry_gpa = table.add(index * 8);
        let entry = ptes.read_pte(entry_gpa)?;
        if entry & pte::PRESENT == 0 {
            return Err(fault(0));
        }
        let large = entry & pte::HUGE != 0;
        let reserved = reserved_every_level
            | match (level, large) {
                (4, _) => pte::HUGE,
                (3, true) => RESERVED_1G,
                (2, true) => RESERVED_2M,
                _ => 0,
            };
        if entry & reserved != 0 {
            return Err(fault(pf_error::PRESENT | pf_error::RSVD));
        }
        walk.writable &= entry & pte::WRITABLE != 0;
        walk.user &= entry & pte::USER != 0;
        walk.executable &= !(ctx.nxe() && entry & pte::NX != 0);
        walk.entries[walk.len as usize] = WalkEntry {
            gpa: entry_gpa,
            value: entry,
            level,
            access: Permissions {
                writable: walk.writable,
                user: walk.user,
                executable: walk.executable,
            },
        };
        walk.len += 1;
        if level == 1 || large {
            break;
        }
        table = Gpa(entry & pte::ADDR_MASK);
        level -= 1;
    }

    if !permitted(ctx, &walk, access) {
        return Err(fault(pf_error::PRESENT));
    }

    // A in every entry used, top level first, and D in the leaf for a
    // write; an entry that already has them is not written.
    let leaf_index = walk.len as usize - 1;
    for (i, e) in walk.entries[..walk.len as usize].iter_mut().enumerate() {
        let mut want = pte::ACCESSED;
        if i == leaf_index && access.kind == AccessKind::Write {
            want |= pte::DIRTY;
        }
        let missing = want & !e.value;
        if missing != 0 {
            if !ptes.try_set_bits(e.gpa, e.value, missing)? {
                return Ok(None);
            }
            e.value |= missing;
        }
    }

    let leaf = walk.entries[leaf_index].value;
    let page_bytes = 1u64 << (12 + 9 * (level as u32 - 1));
    let base = leaf & pte::ADDR_MASK & !(page_bytes - 1);
    walk.level = level;
    walk.gpa = Gpa(base | (gva.0 & (page_bytes - 1)));
    walk.gfn = walk.gpa.frame();
    walk.dirty = leaf & pte::DIRTY != 0;
    Ok(Some(walk))
}

/// Whether `access` is allowed by the permissions accumulated in `walk`
/// (SDM 4.6).
fn permitted(ctx: &PagingContext, walk: &GuestWalk, access: Access) -> bool {
    if access.user() {
        return walk.user
            && match access.kind {
                AccessKind::Read => true,
                AccessKind::Write => walk.writable,
                AccessKind::Execute => walk.executable,
            };
    }
    // Supervisor access to a user page: SMAP (data, unless AC lifts it for
    // an explicit access) and SMEP (fetch).
    let smap_blocks = walk.user && ctx.smap() && !access.ac();
    let smep_blocks = walk.user && ctx.smep();
    match access.kind {
        AccessKind::Read => !smap_blocks,
        AccessKind::Write => !smap_blocks && (walk.writable || !ctx.wp()),
        AccessKind::Execute => walk.executable && !smep_blocks,
    }
}

/// The W/R, U/S and I/D bits of every #PF error code for `access`.
fn error_code_base(ctx: &PagingContext, access: Access) -> u32 {
    let mut code = 0;
    if access.kind == AccessKind::Write {
        code |= pf_error::WRITE;
    }
    if access.user() {
        code |= pf_error::USER;
    }
    if access.kind == AccessKind::Execute && (ctx.nxe() || ctx.smep()) {
        code |= pf_error::FETCH;
    }
    code
}

#[cfg(test)]
mod tests;
