//! The EPT walker.
//!
//! Four levels from [`Eptp::pml4`], 1 GiB (PDPTE) and 2 MiB (PDE) leaves via
//! bit 7. The permissions of a translation are the AND of the R/W/X bits of
//! every entry used. An entry with R, W and X all clear is not present and
//! ends the walk with a violation. Each present entry is checked for
//! misconfiguration (SDM 29.3.3.1) before the walk goes on:
//! - W set with R clear (execute-only, X set with R and W clear, is
//!   supported, as with IA32_VMX_EPT_VPID_CAP bit 0);
//! - address bits 51:46 set (above MAXPHYADDR);
//! - bit 7 set in a PML4E;
//! - in a leaf: memory type 2, 3 or 7; in a large leaf, the reserved
//!   address bits (20:12 for 2 MiB, 29:12 for 1 GiB).
//!
//! Other reserved bits of non-leaf entries (e.g. bits 6:3) are not checked.
//!
//! A guest-physical address with bits above MAXPHYADDR cannot be mapped and
//! gives a violation with no permissions (as for a not-present entry).
//!
//! With EPT A/D enabled in the EPTP, a successful walk sets A in every entry
//! used and D in the leaf for a write, by compare-and-exchange; if an entry
//! changed since it was read the EPT walk restarts. A walk that ends in a
//! violation or misconfiguration sets no flags.
//!
//! Page-modification logging (SDM Vol. 3C 29.3.6), with EPT A/D on and a
//! [`PmlLog`] given: before setting any accessed or dirty flag the walker
//! looks at the PML index; outside 0..=511 the walk ends in
//! [`TranslateError::PmlFull`] with no flag set (the access does not
//! happen). When the walk changes the leaf's dirty flag from 0 to 1 it
//! writes the 4 KiB-aligned guest-physical address at `address + 8 *
//! index` and decrements the index (wrapping from 0 to 0xffff). Only the
//! leaf has a dirty flag, so one walk logs at most once; a guest walk
//! logs each paging-structure page whose dirty flag it sets too (its
//! accesses are writes with EPT A/D on).

use super::paging::{MAX_PHYS_ADDR_BITS, PHYS_ADDR_RESERVED};
use super::psc::ept_walk_refs;
use super::{AccessKind, PageSize, PmlLog, TranslateError};
use crate::addr::{Gpa, Gva, Hpa};
use crate::memory::PhysMemory;
use crate::vmx::{ept_qual, Eptp, PML_ENTRIES};

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

/// Reserved address bits of a 2 MiB EPT leaf (20:12).
const RESERVED_2M: u64 = 0x001f_f000;
/// Reserved address bits of a 1 GiB EPT leaf (29:12).
const RESERVED_1G: u64 = 0x3fff_f000;

/// Effective EPT permissions of a guest-physical address: the R/W/X bits
/// (2:0) of an entry, or of the AND of the entries of a walk. One byte, so
/// that translations carrying it move through registers and the stack
/// without split stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EptPerms(u8);

impl EptPerms {
    /// Everything allowed (no EPT).
    pub const ALL: EptPerms = EptPerms(7);
    /// Nothing allowed (not present).
    pub const NONE: EptPerms = EptPerms(0);

    /// From the R/W/X bits (2:0) of an entry or an AND of entries.
    #[inline]
    pub const fn from_bits(bits: u64) -> EptPerms {
        EptPerms((bits & (epte::READ | epte::WRITE | epte::EXEC)) as u8)
    }

    /// The R/W/X bits (2:0).
    #[inline]
    pub const fn bits(self) -> u64 {
        self.0 as u64
    }

    /// Reads allowed.
    #[inline]
    pub const fn read(self) -> bool {
        self.0 as u64 & epte::READ != 0
    }

    /// Writes allowed.
    #[inline]
    pub const fn write(self) -> bool {
        self.0 as u64 & epte::WRITE != 0
    }

    /// Instruction fetches allowed.
    #[inline]
    pub const fn exec(self) -> bool {
        self.0 as u64 & epte::EXEC != 0
    }

    /// Whether an access of `kind` is allowed.
    #[inline]
    pub const fn allows(self, kind: AccessKind) -> bool {
        match kind {
            AccessKind::Read => self.read(),
            AccessKind::Write => self.write(),
            AccessKind::Execute => self.exec(),
        }
    }

    /// The READABLE/WRITABLE/EXECUTABLE bits of an exit qualification.
    #[inline]
    pub const fn qualification_bits(self) -> u64 {
        (if self.read() { ept_qual::READABLE } else { 0 })
            | (if self.write() { ept_qual::WRITABLE } else { 0 })
            | (if self.exec() { ept_qual::EXECUTABLE } else { 0 })
    }
}

/// A successful EPT translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EptTranslation {
    /// Host-physical address of the guest-physical address translated.
    pub hpa: Hpa,
    /// Permissions (AND over the levels).
    pub perms: EptPerms,
    /// Size of the page the leaf maps.
    pub page_size: PageSize,
    /// A later write needs no EPT dirty-flag update: the leaf's D flag is
    /// set, or EPT A/D is disabled.
    pub dirty_recorded: bool,
}

/// The EPT-violation error for an access of `kind` to `gpa`, with the
/// permissions of the translation as far as it was walked. `gla` is the
/// linear address the access came from and whether it was the final access
/// (`true`) or a guest paging-structure access (`false`).
pub fn violation(
    gpa: Gpa,
    kind: AccessKind,
    perms: EptPerms,
    gla: Option<(Gva, bool)>,
) -> TranslateError {
    let access = match kind {
        AccessKind::Read => ept_qual::READ,
        AccessKind::Write => ept_qual::WRITE,
        AccessKind::Execute => ept_qual::FETCH,
    };
    let gla_bits = match gla {
        None => 0,
        Some((_, false)) => ept_qual::GLA_VALID,
        Some((_, true)) => ept_qual::GLA_VALID | ept_qual::GLA_TRANSLATED,
    };
    TranslateError::EptViolation {
        gpa,
        gla: gla.map(|(gva, _)| gva),
        qualification: access | perms.qualification_bits() | gla_bits,
    }
}

/// Translates `gpa` through the EPT rooted at `eptp` for an access of
/// `kind`, setting EPT A/D flags when the EPTP enables them, and logging
/// the page in `pml` when that sets the leaf's dirty flag. `gla` is the
/// linear address the access came from, if any, and whether the access is
/// to the translated address itself (`true`) or to a guest paging
/// structure (`false`); it only shapes the violation qualification. Adds
/// every EPT entry read to `walk_refs` (4 for a 4 KiB page).
///
/// Inlined: the common case is a few loads and mask tests
/// ([`ept_walk_quick`]); every other case is out of line.
#[inline(always)]
pub fn ept_translate(
    mem: &PhysMemory,
    eptp: Eptp,
    pml: Option<PmlLog<'_>>,
    gpa: Gpa,
    kind: AccessKind,
    gla: Option<(Gva, bool)>,
    walk_refs: &mut u64,
) -> Result<EptTranslation, TranslateError> {
    if let Some(t) = ept_walk_quick(mem, eptp, gpa, kind) {
        #[cfg(test)]
        QUICK_WALKS.with(|n| n.set(n.get() + 1));
        *walk_refs += ept_walk_refs(PageSize::Size4K);
        return Ok(t);
    }
    ept_translate_general(mem, eptp, pml, gpa, kind, gla, walk_refs)
}

/// [`ept_translate`] without its quick path: every case (for tests: the
/// quick path must give the same).
#[inline(never)]
pub(crate) fn ept_translate_general(
    mem: &PhysMemory,
    eptp: Eptp,
    pml: Option<PmlLog<'_>>,
    gpa: Gpa,
    kind: AccessKind,
    gla: Option<(Gva, bool)>,
    walk_refs: &mut u64,
) -> Result<EptTranslation, TranslateError> {
    if gpa.0 >> MAX_PHYS_ADDR_BITS != 0 {
        return Err(violation(gpa, kind, EptPerms::NONE, gla));
    }
    loop {
        if let Some(t) = ept_walk_once(mem, eptp, pml, gpa, kind, gla, walk_refs)? {
            return Ok(t);
        }
    }
}

#[cfg(test)]
thread_local! {
    /// Translations [`ept_translate`] took the quick way for, on this
    /// thread (for tests: that they exercise it).
    pub(crate) static QUICK_WALKS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The common case of [`ept_walk_once`], with no side effect: a 4 KiB
/// page through four readable entries (R set: with it, neither "not
/// present" nor "W without R"), no reserved address bit, no bit 7 above
/// the leaf, a leaf memory type that is not reserved, the access allowed,
/// and no accessed or dirty flag to set. Then the translation
/// `ept_walk_once` gives, which makes 4 references and changes nothing
/// either; in every other case `None` (the general walk decides).
#[inline(always)]
fn ept_walk_quick(
    mem: &PhysMemory,
    eptp: Eptp,
    gpa: Gpa,
    kind: AccessKind,
) -> Option<EptTranslation> {
    if gpa.0 >> MAX_PHYS_ADDR_BITS != 0 {
        return None;
    }
    let ad = eptp.ad_enabled();
    let accessed = if ad { epte::ACCESSED } else { 0 };
    // One mask test per non-leaf entry: R and (with A/D) A set, bit 7
    // (a PML4E misconfiguration, a large leaf below) and the reserved
    // address bits clear.
    let upper_mask = epte::READ | epte::HUGE | PHYS_ADDR_RESERVED | accessed;
    let upper_want = epte::READ | accessed;
    let mut perm_bits = epte::READ | epte::WRITE | epte::EXEC;
    let mut table = eptp.pml4().0;
    for level in [3u32, 2, 1] {
        let index = (gpa.0 >> (PageSize::Size4K.shift() + 9 * level)) & 0x1ff;
        let entry = mem.read_u64(Hpa(table + index * 8)).ok()?;
        if entry & upper_mask != upper_want {
            return None;
        }
        perm_bits &= entry;
        table = entry & epte::ADDR_MASK;
    }
    let index = (gpa.0 >> PageSize::Size4K.shift()) & 0x1ff;
    let leaf = mem.read_u64(Hpa(table + index * 8)).ok()?;
    // The leaf's bit 7 is ignored; a write with A/D needs D set already.
    let dirty = if ad && kind == AccessKind::Write {
        epte::DIRTY
    } else {
        0
    };
    let leaf_mask = epte::READ | PHYS_ADDR_RESERVED | accessed | dirty;
    if leaf & leaf_mask != epte::READ | accessed | dirty {
        return None;
    }
    // Memory types 2, 3 and 7 are reserved.
    let memory_type = (leaf >> epte::MEMTYPE_SHIFT) & 7;
    if (1u32 << memory_type) & 0b1000_1100 != 0 {
        return None;
    }
    let perms = EptPerms::from_bits(perm_bits & leaf);
    if !perms.allows(kind) {
        return None;
    }
    Some(EptTranslation {
        hpa: Hpa((leaf & epte::ADDR_MASK) | (gpa.0 & 0xfff)),
        perms,
        page_size: PageSize::Size4K,
        dirty_recorded: !ad || leaf & epte::DIRTY != 0,
    })
}

/// [`ept_translate`] through the cached guest-physical mappings of `psc`
/// (when given): a mapping that allows `kind` with no flag to set answers,
/// counting the references its walk made; otherwise the EPT is walked and a
/// successful walk is cached. Sets `used_cache` on a hit.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn ept_translate_cached(
    ctx: &super::TranslateCtx<'_>,
    psc: Option<&mut super::psc::Psc>,
    eptp: Eptp,
    gpa: Gpa,
    kind: AccessKind,
    gla: Option<(Gva, bool)>,
    walk_refs: &mut u64,
    used_cache: &mut bool,
) -> Result<EptTranslation, TranslateError> {
    let Some(psc) = psc else {
        return ept_translate(ctx.mem, eptp, ctx.pml, gpa, kind, gla, walk_refs);
    };
    if let Some(t) = psc.gpa_lookup(eptp, gpa, kind, walk_refs) {
        *used_cache = true;
        return Ok(t);
    }
    ept_translate_and_cache(ctx, psc, eptp, gpa, kind, gla, walk_refs)
}

/// The miss side of [`ept_translate_cached`]: walk, and cache a success.
#[cold]
#[inline(never)]
fn ept_translate_and_cache(
    ctx: &super::TranslateCtx<'_>,
    psc: &mut super::psc::Psc,
    eptp: Eptp,
    gpa: Gpa,
    kind: AccessKind,
    gla: Option<(Gva, bool)>,
    walk_refs: &mut u64,
) -> Result<EptTranslation, TranslateError> {
    let t = ept_translate(ctx.mem, eptp, ctx.pml, gpa, kind, gla, walk_refs)?;
    psc.gpa_fill(eptp, gpa, &t);
    Ok(t)
}

/// Whether a present EPT entry at `level` (3 = PML4E ... 0 = PTE) is
/// misconfigured.
fn misconfigured(entry: u64, level: u32) -> bool {
    if entry & (epte::READ | epte::WRITE) == epte::WRITE || entry & PHYS_ADDR_RESERVED != 0 {
        return true;
    }
    let huge = entry & epte::HUGE != 0;
    if level == 3 {
        return huge;
    }
    if level == 0 || huge {
        let memory_type = (entry >> epte::MEMTYPE_SHIFT) & 7;
        let reserved_addr = match level {
            2 => RESERVED_1G,
            1 => RESERVED_2M,
            _ => 0,
        };
        return matches!(memory_type, 2 | 3 | 7) || entry & reserved_addr != 0;
    }
    false
}

/// One attempt; `Ok(None)` if an entry changed before its A/D update.
fn ept_walk_once(
    mem: &PhysMemory,
    eptp: Eptp,
    pml: Option<PmlLog<'_>>,
    gpa: Gpa,
    kind: AccessKind,
    gla: Option<(Gva, bool)>,
    walk_refs: &mut u64,
) -> Result<Option<EptTranslation>, TranslateError> {
    let mut used = [(Hpa(0), 0u64); 4];
    let mut used_count = 0;
    let mut perm_bits = epte::READ | epte::WRITE | epte::EXEC;
    // The AND of the entries: whether all have their accessed flag set.
    let mut and_bits = !0u64;
    let mut table = eptp.pml4();
    let mut level = 3u32;
    let size = loop {
        let index = (gpa.0 >> (PageSize::Size4K.shift() + 9 * level)) & 0x1ff;
        let entry_hpa = table.add(index * 8);
        let entry = mem.read_u64(entry_hpa)?;
        *walk_refs += 1;

        let entry_perms = entry & (epte::READ | epte::WRITE | epte::EXEC);
        perm_bits &= entry_perms;
        and_bits &= entry;
        if entry_perms == 0 {
            return Err(violation(gpa, kind, EptPerms::NONE, gla));
        }
        if misconfigured(entry, level) {
            return Err(TranslateError::EptMisconfig { gpa });
        }
        used[used_count] = (entry_hpa, entry);
        used_count += 1;
        if level == 0 || entry & epte::HUGE != 0 {
            break PageSize::of_leaf_level(level);
        }
        table = Hpa(entry & epte::ADDR_MASK);
        level -= 1;
    };

    let perms = EptPerms::from_bits(perm_bits);
    if !perms.allows(kind) {
        return Err(violation(gpa, kind, perms, gla));
    }

    let leaf_index = used_count - 1;
    let mut leaf = used[leaf_index].1;
    // Every flag the walk would set is set already (the usual case): the
    // A/D pass below would change nothing, log nothing, and not look at
    // the PML index.
    let flags_set =
        and_bits & epte::ACCESSED != 0 && (kind != AccessKind::Write || leaf & epte::DIRTY != 0);
    if eptp.ad_enabled() && !flags_set {
        let wanted = |i: usize, value: u64| {
            let dirty = if i == leaf_index && kind == AccessKind::Write {
                epte::DIRTY
            } else {
                0
            };
            value | epte::ACCESSED | dirty
        };
        let used = &used[..used_count];
        // PML: a flag to set with the log full is a PML-full exit, before
        // any flag changes (SDM 29.3.6: "the accessed or dirty flag is not
        // set, and the guest-physical access that triggered the event
        // does not occur").
        if let Some(pml) = pml {
            let any_flag = used
                .iter()
                .enumerate()
                .any(|(i, &(_, v))| wanted(i, v) != v);
            if any_flag && pml.index.get() >= PML_ENTRIES {
                return Err(TranslateError::PmlFull);
            }
        }
        for (i, &(hpa, value)) in used.iter().enumerate() {
            let new = wanted(i, value);
            if new != value && mem.cmpxchg(hpa, 8, value, new)? != value {
                return Ok(None);
            }
            if i == leaf_index {
                leaf = new;
            }
        }
        let leaf_was = used[leaf_index].1;
        if let Some(pml) = pml {
            if leaf & epte::DIRTY != 0 && leaf_was & epte::DIRTY == 0 {
                let index = pml.index.get();
                let entry = pml.address.add(u64::from(index) * 8);
                mem.write_u64(entry, gpa.0 & !0xfff)?;
                pml.index.set(index.wrapping_sub(1));
            }
        }
    }

    let offset_mask = size.bytes() - 1;
    Ok(Some(EptTranslation {
        hpa: Hpa((leaf & epte::ADDR_MASK & !offset_mask) | (gpa.0 & offset_mask)),
        perms,
        page_size: size,
        dirty_recorded: !eptp.ad_enabled() || leaf & epte::DIRTY != 0,
    }))
}
