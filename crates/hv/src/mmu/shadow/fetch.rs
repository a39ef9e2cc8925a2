//! Filling in the shadow path for a guest translation (KVM's
//! `FNAME(fetch)`): from the root down, a shadow page per guest table
//! (indirect, keyed by the table's gfn and the access above it), direct
//! pages below a guest huge page, then the 4 KiB leaf.
//!
//! The leaf is writable only when the guest allows the write (all levels,
//! or CR0.WP clear for a supervisor write: then the spte is made
//! supervisor-only, as KVM does), the guest's dirty bit is set (so the
//! first write faults and the walk sets it), the memslot is writable and
//! the gfn is not write-tracked. A write to a tracked gfn either unsyncs
//! its shadow pages (every one of them a leaf table: KVM's rule) or must
//! be emulated.

use super::gwalk::GuestWalk;
use super::pages::{Effects, ShadowError, Tables};
use super::role::{access, PagingContext, ShadowRole};
use super::spte::{self, LeafPerms};
use super::ShadowStats;
use crate::mmu::fault::LeafWrite;
use crate::mmu::page::PageRole;
use crate::mmu::root::RootId;
use crate::mmu::tdp::{entry_at, exchange_spte, read_spte};
use machine::mmu::{Access, AccessKind};
use machine::{Gfn, Gva, Hfn, Hpa};

/// How a shadow fault ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MapOutcome {
    /// The leaf is installed: retry the access.
    Mapped,
    /// A write to a write-tracked guest table that cannot go unsync: the
    /// leaf at `leaf` is read-only; the write must be emulated.
    Emulate { leaf: Hpa },
    /// The root is gone (zapped): reload it and retry.
    NoRoot,
}

/// Index of `gva`'s entry in a table at `level`.
pub(crate) fn index(gva: Gva, level: u8) -> u64 {
    (gva.0 >> (12 + 9 * (level as u32 - 1))) & 0x1ff
}

/// The guest's translation of `gva`, for `access`, in the shadow under
/// `root`: `frame` backs `walk.gfn`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn map(
    t: &mut Tables<'_>,
    stats: &mut ShadowStats,
    root: RootId,
    context: PagingContext,
    gva: Gva,
    walk: &GuestWalk,
    frame: Hfn,
    rights: LeafWrite,
    want: Access,
    fx: &mut Effects,
) -> Result<MapOutcome, ShadowError> {
    let Some(root) = t.roots.get(root) else {
        return Ok(MapOutcome::NoRoot);
    };
    let mut table = root.pml4;
    let nxe = context.nxe;
    let role = |level: u8, direct: bool, access: u8| PageRole {
        level,
        direct,
        shadow: Some(ShadowRole { access, context }),
    };
    // Indirect pages for the guest tables below the root.
    for level in ((walk.level + 1)..=4).rev() {
        let at = entry_at(table.addr(), index(gva, level));
        let gfn = walk.tables[level as usize - 2];
        table = child(
            t,
            stats,
            at,
            gfn,
            role(level - 1, false, walk.access_above(level - 1, nxe)),
            fx,
        )?;
    }
    // Direct pages below a guest huge page.
    for level in (2..=walk.level).rev() {
        let at = entry_at(table.addr(), index(gva, level));
        let span = 1u64 << (9 * (level as u32 - 1));
        let gfn = Gfn(walk.gfn.0 & !(span - 1));
        table = child(
            t,
            stats,
            at,
            gfn,
            role(level - 1, true, walk.access_above(level - 1, nxe)),
            fx,
        )?;
    }
    let leaf = entry_at(table.addr(), index(gva, 1));
    let acc = walk.access_above(0, nxe);
    let host_writable = rights.host_writable();
    let mut perms = LeafPerms {
        writable: acc & access::WRITE != 0,
        user: acc & access::USER != 0,
        no_execute: acc & access::EXEC == 0,
        host_writable,
    };
    if !context.cr0_wp && want.kind == AccessKind::Write && !want.user && !perms.writable {
        // CR0.WP clear: the supervisor may write a read-only page; the
        // spte allows it but no longer user accesses (KVM's choice).
        perms.writable = true;
        perms.user = false;
    }
    perms.writable &= walk.dirty && host_writable;
    let mut outcome = MapOutcome::Mapped;
    if perms.writable && t.pages.write_tracked(walk.gfn) {
        if want.kind == AccessKind::Write && try_unsync(t, stats, walk.gfn) {
            // The guest's leaf table goes writable until the next sync.
        } else {
            perms.writable = false;
            if want.kind == AccessKind::Write {
                outcome = MapOutcome::Emulate { leaf };
            }
        }
    }
    // Dirty logging: a read leaves the leaf write-protected (MMU-writable,
    // W clear) so the first write faults and is logged.
    let log_protect = rights == LeafWrite::LogProtected;
    install_leaf(t, leaf, walk.gfn, frame, perms, log_protect, fx)?;
    Ok(outcome)
}

/// Writes the leaf at `at`, keeping the rmap and the leaf's gfn current.
pub(crate) fn install_leaf(
    t: &mut Tables<'_>,
    at: Hpa,
    gfn: Gfn,
    frame: Hfn,
    perms: LeafPerms,
    log_protect: bool,
    fx: &mut Effects,
) -> Result<(), ShadowError> {
    let mut new = spte::make_leaf(frame.addr().0, perms);
    if log_protect {
        new &= !spte::WRITABLE;
    }
    let old = exchange_spte(t.mem, at, new)?;
    fx.reads += 1;
    fx.writes += 1;
    if spte::is_present(old) {
        // Replacing a present leaf (another frame, or fewer rights) needs
        // every vCPU to drop what it cached.
        if spte::frame(old) != frame {
            t.rmap.remove_leaf(spte::frame(old), at, old);
            fx.flush = true;
        } else {
            // The new leaf starts clean: a write the old one saw stays
            // known to the pager.
            t.rmap.note_dropped_bits(frame, old);
            if old & !new & (spte::WRITABLE | spte::USER) != 0 || new & !old & spte::NX != 0 {
                fx.flush = true;
            }
        }
    }
    t.rmap.add(frame, at);
    t.pages.set_leaf(at, gfn);
    Ok(())
}

/// The shadow page of (`gfn`, `role`) linked below the entry at `at`.
fn child(
    t: &mut Tables<'_>,
    stats: &mut ShadowStats,
    at: Hpa,
    gfn: Gfn,
    role: PageRole,
    fx: &mut Effects,
) -> Result<Hfn, ShadowError> {
    if !role.direct {
        // The guest uses this table: its writes are not a flood.
        t.pages.flood.remove(&gfn);
    }
    let current = read_spte(t.mem, at)?;
    fx.reads += 1;
    if spte::is_present(current) {
        let linked = spte::frame(current);
        if t.pages
            .get(linked)
            .is_some_and(|p| p.gfn == gfn && p.role == role)
        {
            return Ok(linked);
        }
        // The guest entry now points elsewhere (or with other rights).
        let z = t.clear_entry(at, role.level + 1)?;
        fx.merge(z);
    }
    let page = match t.pages.find(gfn, role) {
        Some(page) => {
            if t.pages.get(page).is_some_and(|p| p.unsync) {
                // Linked into a new path: bring it up to date first.
                let s = super::sync::sync_page(t, stats, page)?;
                fx.merge(s);
            }
            page
        }
        None => t.create(gfn, role, None, fx)?,
    };
    // Creating the page may have zapped pages above (unsync leaves of the
    // same gfn never are above), so `at` is still ours.
    t.link(at, page)?;
    fx.writes += 1;
    Ok(page)
}

/// Lets `gfn`'s shadow pages go unsync if every one is a leaf table
/// (KVM's `mmu_try_to_unsync_pages`).
fn try_unsync(t: &mut Tables<'_>, stats: &mut ShadowStats, gfn: Gfn) -> bool {
    if t.pages.never_unsync {
        return false;
    }
    let pages: Vec<Hfn> = t.pages.of_gfn(gfn).to_vec();
    let all_leaf = pages.iter().all(|&f| {
        t.pages
            .get(f)
            .is_some_and(|p| p.role.level == 1 && p.root.is_none())
    });
    if !all_leaf {
        return false;
    }
    for f in pages {
        if t.pages.get(f).is_some_and(|p| !p.unsync) {
            t.pages.set_unsync(f, true);
            stats.unsynced += 1;
        }
    }
    true
}
