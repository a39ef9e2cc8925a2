//! IA-32e (4-level) guest paging.
//!
//! The walker reads the four levels from CR3, checks present and reserved
//! bits at each level as it goes (a fault at one level stops the walk),
//! accumulates the permissions (R/W and U/S are ANDed over the levels, XD is
//! ORed), checks the access against them, and only then sets the accessed
//! flag in every entry used and the dirty flag in the leaf for a write.
//! Setting A/D only after the whole walk succeeded means a faulting access
//! leaves the paging structures untouched (the SDM allows A to be set on
//! upper levels even when the walk later faults; we chose the stricter
//! behaviour, which is also Intel's for the leaf).
//!
//! A/D updates use a compare-and-exchange against the value the walk read,
//! so a concurrent update by the hypervisor or another CPU is never lost; if
//! the entry changed under us the whole walk restarts (lock-free: a restart
//! means another agent's write succeeded).
//!
//! Under EPT every paging-structure entry is read through an EPT
//! translation of its guest-physical address: an EPT read, or an EPT write
//! when EPT A/D is enabled (SDM 29.3.3.2: with EPT A/D, accesses to guest
//! paging structures are treated as writes). Setting guest A/D is an EPT
//! write even without EPT A/D, so a guest page table in EPT-read-only memory
//! gives an EPT violation when a flag must be set.
//!
//! With page-modification logging on, those paging-structure accesses log
//! the table's page whenever they set its EPT dirty flag (SDM Vol. 3C
//! 29.3.6), as every write does: the EPT walker does the logging.

use super::ept::{self, EptPerms};
use super::psc::{Psc, UpperFill, WalkStart};
use super::{Access, AccessKind, PageSize, PagingRegs, TranslateCtx, TranslateError};
use crate::addr::{Gpa, Gva, Hpa};
use crate::cpu::state::{cr0, cr4, efer};

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

/// Address bits 51:MAXPHYADDR: reserved in every paging entry (guest and
/// EPT alike).
pub(crate) const PHYS_ADDR_RESERVED: u64 = pte::ADDR_MASK & !((1 << MAX_PHYS_ADDR_BITS) - 1);

/// Reserved address bits of a 2 MiB leaf (bits 20:13; bit 12 is PAT).
const RESERVED_2M: u64 = 0x001f_e000;
/// Reserved address bits of a 1 GiB leaf (bits 29:13; bit 12 is PAT).
const RESERVED_1G: u64 = 0x3fff_e000;

/// The permissions a guest translation grants, combined over all levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestPerms {
    /// R/W set at every level.
    pub writable: bool,
    /// U/S set at every level.
    pub user: bool,
    /// XD set at some level, with EFER.NXE on.
    pub no_execute: bool,
}

/// Whether `access` is allowed to a page with `perms` under `regs` (SDM
/// 4.6). `Access::user == false` counts as an *explicit* supervisor access,
/// so RFLAGS.AC can override SMAP; the interface has no way to mark an
/// implicit supervisor access (which SMAP always checks), so the CPU core
/// must pass `rflags_ac: false` for those.
#[inline]
pub fn access_permitted(perms: GuestPerms, access: Access, regs: &PagingRegs) -> bool {
    if access.user {
        if !perms.user {
            return false;
        }
        return match access.kind {
            AccessKind::Read => true,
            AccessKind::Write => perms.writable,
            AccessKind::Execute => !perms.no_execute,
        };
    }
    let smap_blocks = perms.user && regs.cr4 & cr4::SMAP != 0 && !regs.rflags_ac;
    let smep_blocks = perms.user && regs.cr4 & cr4::SMEP != 0;
    match access.kind {
        AccessKind::Read => !smap_blocks,
        AccessKind::Write => !smap_blocks && (perms.writable || regs.cr0 & cr0::WP == 0),
        AccessKind::Execute => !perms.no_execute && !smep_blocks,
    }
}

/// The W, U and I/D bits every #PF error code for `access` carries. I/D is
/// reported only when EFER.NXE or CR4.SMEP is on (SDM 4.7).
#[inline]
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

impl GuestPerms {
    /// All rights (the start of a walk from CR3).
    pub(crate) const ALL: GuestPerms = GuestPerms {
        writable: true,
        user: true,
        no_execute: false,
    };

    /// The rights combined with those of one more entry.
    #[inline(always)]
    fn and_entry(self, entry: u64, nxe: bool) -> GuestPerms {
        GuestPerms {
            writable: self.writable && entry & pte::WRITABLE != 0,
            user: self.user && entry & pte::USER != 0,
            no_execute: self.no_execute || (nxe && entry & pte::NX != 0),
        }
    }
}

/// The bits reserved in a present entry at `level` (3 = PML4E ... 0 =
/// PTE) whose PS bit is `huge`, besides `reserved_any_level`.
#[inline(always)]
fn reserved_at(level: u32, huge: bool, reserved_any_level: u64) -> u64 {
    reserved_any_level
        | match (level, huge) {
            (3, _) => pte::HUGE,
            (2, true) => RESERVED_1G,
            (1, true) => RESERVED_2M,
            _ => 0,
        }
}

/// The result of a successful guest walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestTranslation {
    /// Guest-physical address of the translated byte.
    pub gpa: Gpa,
    /// Size of the page the leaf maps.
    pub size: PageSize,
    pub perms: GuestPerms,
    /// Leaf G flag, with CR4.PGE on.
    pub global: bool,
    /// The leaf's dirty flag is set (after this access's update).
    pub dirty: bool,
}

impl GuestTranslation {
    /// The translation of `gva` by the leaf entry `leaf` (as it is after
    /// the walk's flag updates) of a page of `size`, with the rights
    /// `perms` combined over the walk.
    #[inline(always)]
    fn from_leaf(
        leaf: u64,
        size: PageSize,
        gva: Gva,
        perms: GuestPerms,
        regs: &PagingRegs,
    ) -> Self {
        let page_base = leaf & pte::ADDR_MASK & !(size.bytes() - 1);
        GuestTranslation {
            gpa: Gpa(page_base | (gva.0 & (size.bytes() - 1))),
            size,
            perms,
            global: leaf & pte::GLOBAL != 0 && regs.cr4 & cr4::PGE != 0,
            dirty: leaf & pte::DIRTY != 0,
        }
    }
}

/// One paging-structure entry the walk used, kept for the A/D update.
#[derive(Debug, Clone, Copy)]
struct UsedEntry {
    gpa: Gpa,
    hpa: Hpa,
    value: u64,
    /// EPT permissions of the entry's guest-physical address.
    ept_perms: EptPerms,
}

/// Walks the guest page tables for `access` to `gva` (CR0.PG must be set),
/// setting A/D flags, with EPT applied to every paging-structure reference
/// when `ctx.ept` is set. Does not translate the final guest-physical
/// address through EPT. Adds every entry read (guest and EPT) to
/// `walk_refs`.
pub fn walk(
    ctx: &TranslateCtx<'_>,
    gva: Gva,
    access: Access,
    walk_refs: &mut u64,
) -> Result<GuestTranslation, TranslateError> {
    loop {
        if let Some(t) = walk_once(ctx, None, gva, access, walk_refs, &mut false)? {
            return Ok(t);
        }
    }
}

/// One attempt of [`walk`]; `Ok(None)` if an entry changed before its A/D
/// update (the caller walks again). Through the paging-structure caches
/// when `psc` is given: the walk starts below the deepest cached entry for
/// `gva`, paging-structure references use cached guest-physical mappings,
/// and a successful walk caches what it used. `used_cache` is set when a
/// cached entry was used (a fault is then to be checked against memory:
/// [`super::translate`]).
pub(crate) fn walk_once(
    ctx: &TranslateCtx<'_>,
    mut psc: Option<&mut Psc>,
    gva: Gva,
    access: Access,
    walk_refs: &mut u64,
    used_cache: &mut bool,
) -> Result<Option<GuestTranslation>, TranslateError> {
    let regs = &ctx.regs;
    let nxe = regs.efer & efer::NXE != 0;
    let err_base = error_code_base(access, regs);
    let page_fault = |extra: u32| TranslateError::PageFault {
        gva,
        error_code: err_base | extra,
    };
    let reserved_any_level = PHYS_ADDR_RESERVED | if nxe { 0 } else { pte::NX };

    let mut used = [UsedEntry {
        gpa: Gpa(0),
        hpa: Hpa(0),
        value: 0,
        ept_perms: EptPerms::ALL,
    }; 4];
    let mut used_count = 0;
    // Level 3 = PML4, 2 = PDPT, 1 = PD, 0 = PT.
    let start = psc.as_deref_mut().and_then(|p| p.start(ctx, gva.0));
    let WalkStart {
        mut level,
        mut table,
        mut perms,
        refs: mut refs_from_cr3,
    } = start.unwrap_or(WalkStart::from_cr3(regs));
    if start.is_some() {
        *used_cache = true;
        *walk_refs += refs_from_cr3;
    }
    let mut fills = [UpperFill {
        level: 0,
        next: Gpa(0),
        perms,
        refs: 0,
    }; 3];
    let mut fill_count = 0;
    let size = loop {
        let index = (gva.0 >> (PageSize::Size4K.shift() + 9 * level)) & 0x1ff;
        let entry_gpa = table.add(index * 8);
        let before = *walk_refs;
        let (entry_hpa, ept_perms) = structure_hpa(
            ctx,
            psc.as_deref_mut(),
            entry_gpa,
            gva,
            walk_refs,
            used_cache,
        )?;
        let entry = ctx.mem.read_u64(entry_hpa)?;
        *walk_refs += 1;
        refs_from_cr3 += *walk_refs - before;

        if entry & pte::PRESENT == 0 {
            return Err(page_fault(0));
        }
        let huge = entry & pte::HUGE != 0;
        if entry & reserved_at(level, huge, reserved_any_level) != 0 {
            return Err(page_fault(pf_error::PRESENT | pf_error::RSVD));
        }

        perms = perms.and_entry(entry, nxe);
        used[used_count] = UsedEntry {
            gpa: entry_gpa,
            hpa: entry_hpa,
            value: entry,
            ept_perms,
        };
        used_count += 1;

        if level == 0 || huge {
            break PageSize::of_leaf_level(level);
        }
        table = Gpa(entry & pte::ADDR_MASK);
        fills[fill_count] = UpperFill {
            level,
            next: table,
            perms,
            refs: refs_from_cr3,
        };
        fill_count += 1;
        level -= 1;
    };

    if !access_permitted(perms, access, regs) {
        return Err(page_fault(pf_error::PRESENT));
    }

    let used = &used[..used_count];
    let leaf_index = used_count - 1;
    let wanted = |i: usize, e: &UsedEntry| {
        let dirty = if i == leaf_index && access.kind == AccessKind::Write {
            pte::DIRTY
        } else {
            0
        };
        e.value | pte::ACCESSED | dirty
    };
    // Every flag update is an EPT write; check them all before changing
    // anything.
    if ctx.ept.is_some() {
        for (i, e) in used.iter().enumerate() {
            if wanted(i, e) != e.value && !e.ept_perms.write() {
                return Err(ept::violation(
                    e.gpa,
                    AccessKind::Write,
                    e.ept_perms,
                    Some((gva, false)),
                ));
            }
        }
    }
    for (i, e) in used.iter().enumerate() {
        let new = wanted(i, e);
        if new != e.value && ctx.mem.cmpxchg(e.hpa, 8, e.value, new)? != e.value {
            return Ok(None);
        }
    }
    if let Some(p) = psc {
        // Every entry used now has its accessed flag set.
        p.fill_upper(ctx, gva.0, &fills[..fill_count]);
    }

    let leaf = used[leaf_index].value
        | if access.kind == AccessKind::Write {
            pte::DIRTY
        } else {
            0
        };
    Ok(Some(GuestTranslation::from_leaf(
        leaf, size, gva, perms, regs,
    )))
}

/// What [`walk_cached`] found, and what [`walk_once`] through the same
/// caches would have counted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CachedWalk {
    pub guest: GuestTranslation,
    /// Every reference the walk charges (from CR3 through the leaf).
    pub refs: u64,
    /// The walk started below a paging-structure-cache entry.
    pub upper_hit: bool,
    /// Guest-physical mappings used (one per paging structure read).
    pub gpa_hits: u64,
    /// Non-leaf entries read (to cache: the first `fill_count` of the
    /// `fills` given to `walk_cached`).
    pub fill_count: usize,
}

/// No entry (the value `walk_cached`'s `fills` start with).
pub(crate) const NO_FILL: UpperFill = UpperFill {
    level: 0,
    next: Gpa(0),
    perms: GuestPerms::ALL,
    refs: 0,
};

/// The common case of [`walk_once`] through the caches `psc`, with no
/// side effect: the walk starts where `psc` says (or at CR3), every
/// paging structure it reads is in a guest-physical mapping of `psc`
/// that allows the access (with EPT), every entry is present with no
/// reserved bit set, the access is permitted, and no accessed or dirty
/// flag has to be set. Then it returns what `walk_once` would return
/// and what it would have counted, and leaves in `fills` what it would
/// cache (the caller commits those: [`super::translate_miss`]). In every
/// other case `None`, and the caller takes `walk_once`, which gives the
/// same result for the cases this takes.
#[inline(always)]
pub(crate) fn walk_cached(
    ctx: &TranslateCtx<'_>,
    psc: &Psc,
    gva: Gva,
    access: Access,
    fills: &mut [UpperFill; 3],
) -> Option<CachedWalk> {
    let regs = &ctx.regs;
    let nxe = regs.efer & efer::NXE != 0;
    let reserved_any_level = PHYS_ADDR_RESERVED | if nxe { 0 } else { pte::NX };
    let start = psc.peek_start(ctx, gva.0);
    let upper_hit = start.is_some();
    let WalkStart {
        mut level,
        mut table,
        mut perms,
        mut refs,
    } = start.unwrap_or(WalkStart::from_cr3(regs));
    // Paging-structure references are EPT writes with EPT A/D on.
    let structure_kind = match ctx.ept {
        Some(eptp) if eptp.ad_enabled() => AccessKind::Write,
        _ => AccessKind::Read,
    };
    let write = access.kind == AccessKind::Write;
    let mut gpa_hits = 0;
    let mut fill_count = 0;
    loop {
        let index = (gva.0 >> (PageSize::Size4K.shift() + 9 * level)) & 0x1ff;
        let entry_gpa = table.add(index * 8);
        let entry_hpa = match ctx.ept {
            None => Hpa(entry_gpa.0),
            Some(eptp) => {
                let t = psc.gpa_peek_structure(eptp, entry_gpa, structure_kind)?;
                gpa_hits += 1;
                refs += super::psc::ept_walk_refs(t.page_size);
                t.hpa
            }
        };
        let entry = ctx.mem.read_u64(entry_hpa).ok()?;
        refs += 1;
        let huge = entry & pte::HUGE != 0;
        if entry & pte::PRESENT == 0 || entry & reserved_at(level, huge, reserved_any_level) != 0 {
            return None;
        }
        perms = perms.and_entry(entry, nxe);
        let leaf = level == 0 || huge;
        let flags = pte::ACCESSED | if leaf && write { pte::DIRTY } else { 0 };
        if entry & flags != flags {
            return None;
        }
        if leaf {
            if !access_permitted(perms, access, regs) {
                return None;
            }
            return Some(CachedWalk {
                guest: GuestTranslation::from_leaf(
                    entry,
                    PageSize::of_leaf_level(level),
                    gva,
                    perms,
                    regs,
                ),
                refs,
                upper_hit,
                gpa_hits,
                fill_count,
            });
        }
        table = Gpa(entry & pte::ADDR_MASK);
        // At most 3 non-leaf levels (a PML4E leaf is reserved).
        *fills.get_mut(fill_count)? = UpperFill {
            level,
            next: table,
            perms,
            refs,
        };
        fill_count += 1;
        level -= 1;
    }
}

/// Host-physical address of a paging-structure entry, and the EPT
/// permissions of its page (all permissions without EPT), through a cached
/// guest-physical mapping when `psc` has one.
#[inline]
fn structure_hpa(
    ctx: &TranslateCtx<'_>,
    psc: Option<&mut Psc>,
    entry_gpa: Gpa,
    gva: Gva,
    walk_refs: &mut u64,
    used_cache: &mut bool,
) -> Result<(Hpa, EptPerms), TranslateError> {
    match ctx.ept {
        None => Ok((Hpa(entry_gpa.0), EptPerms::ALL)),
        Some(eptp) => {
            let kind = if eptp.ad_enabled() {
                AccessKind::Write
            } else {
                AccessKind::Read
            };
            let t = ept::ept_translate_cached(
                ctx,
                psc,
                eptp,
                entry_gpa,
                kind,
                Some((gva, false)),
                walk_refs,
                used_cache,
            )?;
            Ok((t.hpa, t.perms))
        }
    }
}
