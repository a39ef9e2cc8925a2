//! Address translation: the guest paging walker, the EPT walker and the TLB.
//!
//! Split by concern, as `arch/x86/kvm/mmu` is:
//! - [`paging`]: 4-level IA-32e paging (4 KiB, 2 MiB, 1 GiB pages; NX, U/S,
//!   R/W, A/D, CR0.WP, SMEP/SMAP), producing #PF error codes.
//! - [`ept`]: the EPT walker (4 levels, A/D, violation qualification,
//!   misconfiguration), applied to every guest-physical reference.
//! - [`tlb`]: a set-associative, VPID- and PCID-tagged TLB of combined translations
//!   with the x86 flush rules.
//! - [`psc`]: the paging-structure caches (PML4E/PDPTE/PDE) and cached
//!   guest-physical mappings, owned and invalidated with the TLB; they save
//!   host work and charge the references of the walk they replace.
//!
//! [`translate`] ties them together. Its order of work for one access:
//! 1. canonical check (48-bit linear addresses);
//! 2. CR0.PG clear and no EPT: the address is host-physical, done;
//! 3. TLB lookup (tag compare in one set per page size), with the
//!    permission check done against the *current* CR0.WP/CR4.SMEP/SMAP/
//!    RFLAGS.AC, so changing those needs no flush;
//! 4. on a miss: the guest walk (every paging-structure reference through
//!    EPT when EPT is on), permission checks, A/D updates, then the EPT walk
//!    of the final guest-physical address, then a TLB fill. The guest walk
//!    starts below the deepest paging-structure-cache entry for the
//!    address, and EPT translations come from cached guest-physical
//!    mappings when one allows the access ([`psc`]).
//!
//! `walk_refs` counts paging-structure entry reads, guest and EPT, including
//! re-reads after a walk restarts because an entry changed under its A/D
//! update; the A/D writes themselves are not counted. A 4 KiB guest page
//! under 4 KiB EPT pages costs 4 * (4 + 1) + 4 = 24, a bare 4 KiB walk 4.
//!
//! Scope: with CR0.PG set, paging is always IA-32e 4-level paging (the
//! machine runs 64-bit guests); 32-bit and PAE paging are not modelled.
//! TLB entries are tagged by VPID and, with CR4.PCIDE, by PCID (CR3 bits
//! 11:0; [`tlb`]); the paging-structure caches by VPID and CR3.
//! Protection keys are not modelled.

pub mod ept;
pub mod paging;
pub mod psc;
pub mod tlb;

#[cfg(test)]
mod tests;

use crate::addr::{Gpa, Gva, Hpa};
use crate::cpu::state::cr0;
use crate::memory::{MemError, PhysMemory};
use crate::vmx::Eptp;
use tlb::{Tlb, TlbFill};

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
    /// Page-modification logging, when the controls enable it (only
    /// consulted with EPT A/D on).
    pub pml: Option<PmlLog<'a>>,
}

/// The page-modification log of the running guest (SDM Vol. 3C 29.3.6):
/// where it is and the PML index, which the EPT walker decrements as it
/// logs (a cell, so a translation context can stay shared).
#[derive(Debug, Clone, Copy)]
pub struct PmlLog<'a> {
    /// Host-physical address of the 4 KiB log.
    pub address: Hpa,
    /// The PML index: the next entry to write (511 down to 0; outside
    /// 0..=511 the log is full).
    pub index: &'a std::cell::Cell<u16>,
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
    /// An EPT accessed or dirty flag had to be set with the
    /// page-modification log full (PML index outside 0..=511): the access
    /// did not happen.
    PmlFull,
    /// A walk or the final access fell outside host-physical memory.
    Memory(MemError),
}

impl From<MemError> for TranslateError {
    fn from(e: MemError) -> Self {
        TranslateError::Memory(e)
    }
}

/// Size of the page a translation maps (guest paging or EPT leaf).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PageSize {
    Size4K,
    Size2M,
    Size1G,
}

impl PageSize {
    /// Every size, smallest first.
    pub const ALL: [PageSize; 3] = [PageSize::Size4K, PageSize::Size2M, PageSize::Size1G];

    /// log2 of the size in bytes.
    #[inline]
    pub const fn shift(self) -> u32 {
        match self {
            PageSize::Size4K => 12,
            PageSize::Size2M => 21,
            PageSize::Size1G => 30,
        }
    }

    /// Size in bytes.
    #[inline]
    pub const fn bytes(self) -> u64 {
        1 << self.shift()
    }

    /// The size of a leaf found at paging-structure `level` (0 = PT,
    /// 1 = PD, 2 = PDPT); the same numbering in guest paging and EPT.
    #[inline]
    pub(crate) const fn of_leaf_level(level: u32) -> PageSize {
        match level {
            0 => PageSize::Size4K,
            1 => PageSize::Size2M,
            _ => PageSize::Size1G,
        }
    }
}

/// Number of implemented linear-address bits (4-level paging).
const LINEAR_ADDRESS_BITS: u32 = 48;

/// Whether bits 63:47 of `gva` are all equal.
#[inline]
pub fn is_canonical(gva: Gva) -> bool {
    let shift = 64 - LINEAR_ADDRESS_BITS;
    (((gva.0 << shift) as i64) >> shift) as u64 == gva.0
}

/// Translates `gva` for `access`, through the TLB and on a miss through a
/// page walk (guest paging, and EPT for every guest-physical reference),
/// setting accessed/dirty flags as hardware does and filling the TLB.
///
/// Adds the number of memory references the walk made to `walk_refs` (0 on
/// a TLB hit; up to 24 for a 2-D walk). Returns the host-physical address
/// of `gva` itself (not the page base).
///
/// A TLB entry is used only if it allows this access under the current
/// paging registers; a write also needs the guest (and, with EPT A/D, the
/// EPT) dirty flag known to be set. Otherwise the entry is dropped and the
/// translation walked again, as hardware re-walks before faulting, so a
/// fault always reflects what is in memory now.
#[inline]
pub fn translate(
    tlb: &mut Tlb,
    ctx: &TranslateCtx<'_>,
    gva: Gva,
    access: Access,
    walk_refs: &mut u64,
) -> Result<Hpa, TranslateError> {
    translate_with(tlb, ctx, gva, access, walk_refs, translate_miss)
}

/// A TLB-miss path: [`translate_miss`] or [`translate_miss_walk`].
type MissPath =
    fn(&mut Tlb, &TranslateCtx<'_>, Gva, Access, &mut u64) -> Result<Hpa, TranslateError>;

/// [`translate`] with its misses taken by `miss`.
#[inline(always)]
fn translate_with(
    tlb: &mut Tlb,
    ctx: &TranslateCtx<'_>,
    gva: Gva,
    access: Access,
    walk_refs: &mut u64,
    miss: MissPath,
) -> Result<Hpa, TranslateError> {
    if !is_canonical(gva) {
        return Err(TranslateError::NonCanonical { gva });
    }
    if ctx.regs.cr0 & cr0::PG == 0 && ctx.ept.is_none() {
        // No paging and no EPT: linear = physical, nothing to cache.
        return Ok(Hpa(gva.0));
    }
    if let Some(hpa) = tlb.lookup(ctx, gva, access) {
        return Ok(hpa);
    }
    miss(tlb, ctx, gva, access, walk_refs)
}

/// The TLB-miss path: the walk (through the paging-structure caches), then
/// a TLB fill. A walk that used a cached entry and faulted is dropped, the
/// caches' entries for the address invalidated, and the translation walked
/// again from memory alone, so a fault (and what it costs) is what memory
/// says now.
///
/// [`translate`] after its TLB lookup missed (a canonical address, with
/// paging or EPT on): callers that made that lookup themselves, with its
/// effects, continue here.
///
/// The common case, a walk through the caches that faults nowhere and sets
/// no flag ([`paging::walk_cached`]), takes a straight path that changes
/// nothing until it knows it succeeds; every other case takes the general
/// walk, which gives the same result for the common case
/// ([`translate_miss_walk`]).
#[inline(never)]
pub(crate) fn translate_miss(
    tlb: &mut Tlb,
    ctx: &TranslateCtx<'_>,
    gva: Gva,
    access: Access,
    walk_refs: &mut u64,
) -> Result<Hpa, TranslateError> {
    if ctx.regs.cr0 & cr0::PG != 0 {
        let mut fills = [paging::NO_FILL; 3];
        if let Some(w) = paging::walk_cached(ctx, &tlb.psc, gva, access, &mut fills) {
            let final_ept = match ctx.ept {
                None => None,
                Some(eptp) => match tlb.psc.gpa_peek_cached(eptp, w.guest.gpa, access.kind) {
                    (Some(t), _) => Some(t),
                    (None, cached) => {
                        return translate_miss_final_ept(
                            tlb, ctx, gva, access, walk_refs, &w, &fills, eptp, cached,
                        )
                    }
                },
            };
            #[cfg(test)]
            CACHED_MISSES.with(|n| n.set(n.get() + 1));
            // What the general walk would have counted, charged and cached.
            let final_refs = final_ept.map_or(0, |t| psc::ept_walk_refs(t.page_size));
            commit_cached_walk(tlb, ctx, gva, &w, &fills, final_ept.is_some());
            *walk_refs += w.refs + final_refs;
            let hpa = final_ept.map_or(Hpa(w.guest.gpa.0), |t| t.hpa);
            tlb.insert(
                ctx,
                gva,
                TlbFill {
                    hpa,
                    guest: Some(w.guest),
                    ept: final_ept,
                },
            );
            return Ok(hpa);
        }
    }
    translate_miss_walk(tlb, ctx, gva, access, walk_refs)
}

/// Counts and caches what the general walk's guest part would have for
/// the straight walk `w` (its non-leaf entries are the first
/// `w.fill_count` of `fills`); `final_gpa_hit`: the final guest-physical
/// address was translated by a cached mapping too.
#[inline(always)]
fn commit_cached_walk(
    tlb: &mut Tlb,
    ctx: &TranslateCtx<'_>,
    gva: Gva,
    w: &paging::CachedWalk,
    fills: &[psc::UpperFill; 3],
    final_gpa_hit: bool,
) {
    tlb.psc
        .count_hits(w.upper_hit, w.gpa_hits + u64::from(final_gpa_hit));
    if w.fill_count != 0 {
        tlb.psc.fill_upper(ctx, gva.0, &fills[..w.fill_count]);
    }
}

/// [`translate_miss`] after the straight guest walk `w` succeeded and the
/// final guest-physical address has no cached mapping that allows the
/// access: the EPT walk of that address, as the general walk makes it
/// after the same guest walk (whose effects this commits first), so the
/// guest walk is not made twice. A fault there is handled as the general
/// way handles it: with EPT, the guest walk always used a cached mapping.
/// `cached`: a mapping of that address's page is cached (one that does
/// not allow the access); else there is none, which the fill need not
/// look for again.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn translate_miss_final_ept(
    tlb: &mut Tlb,
    ctx: &TranslateCtx<'_>,
    gva: Gva,
    access: Access,
    walk_refs: &mut u64,
    w: &paging::CachedWalk,
    fills: &[psc::UpperFill; 3],
    eptp: Eptp,
    cached: bool,
) -> Result<Hpa, TranslateError> {
    #[cfg(test)]
    FINAL_EPT_WALKS.with(|n| n.set(n.get() + 1));
    debug_assert!(w.gpa_hits != 0, "under EPT every structure read is mapped");
    commit_cached_walk(tlb, ctx, gva, w, fills, false);
    let gpa = w.guest.gpa;
    let mut refs = w.refs;
    match ept::ept_translate(
        ctx.mem,
        eptp,
        ctx.pml,
        gpa,
        access.kind,
        Some((gva, true)),
        &mut refs,
    ) {
        Ok(t) => {
            *walk_refs += refs;
            // The mappings are as the peek saw them: the commit above
            // changed only the upper-level caches.
            tlb.psc.gpa_fill_known(eptp, gpa, &t, cached);
            tlb.insert(
                ctx,
                gva,
                TlbFill {
                    hpa: t.hpa,
                    guest: Some(w.guest),
                    ept: Some(t),
                },
            );
            Ok(t.hpa)
        }
        Err(e) => rewalk_after_fault(tlb, ctx, gva, access, walk_refs, e),
    }
}

#[cfg(test)]
thread_local! {
    /// Misses [`translate_miss`] took the straight way for, on this
    /// thread (for tests: that they exercise it).
    pub(crate) static CACHED_MISSES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Straight misses that walked the EPT for their final
    /// guest-physical address ([`translate_miss_final_ept`]).
    pub(crate) static FINAL_EPT_WALKS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// [`translate`] with its misses always taken the general way (for tests:
/// the straight way must change nothing).
#[cfg(test)]
pub(crate) fn translate_general(
    tlb: &mut Tlb,
    ctx: &TranslateCtx<'_>,
    gva: Gva,
    access: Access,
    walk_refs: &mut u64,
) -> Result<Hpa, TranslateError> {
    translate_with(tlb, ctx, gva, access, walk_refs, translate_miss_walk)
}

/// [`translate_miss`] the general way: every case, every effect.
#[cold]
#[inline(never)]
pub(crate) fn translate_miss_walk(
    tlb: &mut Tlb,
    ctx: &TranslateCtx<'_>,
    gva: Gva,
    access: Access,
    walk_refs: &mut u64,
) -> Result<Hpa, TranslateError> {
    let fill = if tlb.psc.enabled() {
        let mut refs = 0;
        let mut used_cache = false;
        match walk(
            Some(&mut tlb.psc),
            ctx,
            gva,
            access,
            &mut refs,
            &mut used_cache,
        ) {
            Ok(fill) => {
                *walk_refs += refs;
                fill
            }
            Err(e) if used_cache => return rewalk_after_fault(tlb, ctx, gva, access, walk_refs, e),
            Err(e) => {
                *walk_refs += refs;
                return Err(e);
            }
        }
    } else {
        walk(None, ctx, gva, access, walk_refs, &mut false)?
    };
    let hpa = fill.hpa;
    tlb.insert(ctx, gva, fill);
    Ok(hpa)
}

/// After a walk that used the caches faulted with `e`: drops the caches'
/// entries for `gva` (and the mapping of the page EPT faulted on), walks
/// again from memory alone, and fills the TLB if that succeeds.
#[cold]
#[inline(never)]
fn rewalk_after_fault(
    tlb: &mut Tlb,
    ctx: &TranslateCtx<'_>,
    gva: Gva,
    access: Access,
    walk_refs: &mut u64,
    e: TranslateError,
) -> Result<Hpa, TranslateError> {
    let ept_gpa = match e {
        TranslateError::EptViolation { gpa, .. } | TranslateError::EptMisconfig { gpa } => {
            Some(gpa)
        }
        _ => None,
    };
    tlb.psc.fault(ctx, gva.0, ept_gpa);
    let fill = walk(None, ctx, gva, access, walk_refs, &mut false)?;
    let hpa = fill.hpa;
    tlb.insert(ctx, gva, fill);
    Ok(hpa)
}

/// The guest walk and the EPT translation of its result, through `psc`
/// when given.
fn walk(
    mut psc: Option<&mut psc::Psc>,
    ctx: &TranslateCtx<'_>,
    gva: Gva,
    access: Access,
    walk_refs: &mut u64,
    used_cache: &mut bool,
) -> Result<TlbFill, TranslateError> {
    let guest = if ctx.regs.cr0 & cr0::PG != 0 {
        loop {
            let psc = psc.as_deref_mut();
            if let Some(t) = paging::walk_once(ctx, psc, gva, access, walk_refs, used_cache)? {
                break Some(t);
            }
        }
    } else {
        None
    };
    let gpa = guest.map_or(Gpa(gva.0), |g| g.gpa);
    let final_ept = match ctx.ept {
        Some(eptp) => Some(ept::ept_translate_cached(
            ctx,
            psc,
            eptp,
            gpa,
            access.kind,
            Some((gva, true)),
            walk_refs,
            used_cache,
        )?),
        None => None,
    };
    let hpa = final_ept.map_or(Hpa(gpa.0), |t| t.hpa);
    Ok(TlbFill {
        hpa,
        guest,
        ept: final_ept,
    })
}
