//! Unsync pages brought back in step with the guest (KVM's
//! `kvm_sync_page`/`FNAME(sync_spte)`), and the shadow's side of a guest
//! write to a write-tracked table: the entries it changed are zapped in
//! every shadow page of the gfn (KVM's `kvm_mmu_track_write`), or, after a
//! flood of writes, the gfn is unprotected (its shadow pages zapped, KVM's
//! `kvm_mmu_unprotect_gfn_and_retry`).
//!
//! A sync re-reads each guest entry behind a present spte: an entry that
//! is gone, reserved, not accessed, or points at another gfn zaps the
//! spte; otherwise the spte gets the entry's current rights. Then the page is sync again and
//! its gfn write-protected.

use super::gwalk::{entry_access, reserved_bits};
use super::pages::{Effects, ShadowError, Tables};
use super::role::access;
use super::spte::{self, LeafPerms};
use super::ShadowStats;
use crate::memslot::PageState;
use crate::mmu::page::ENTRIES;
use crate::mmu::tdp::{entry_at, exchange_spte, read_spte};
use machine::mmu::paging::pte;
use machine::{Gfn, Hfn};

/// The frame holding `gfn`, if resident.
pub(crate) fn resident(t: &Tables<'_>, gfn: Gfn) -> Option<Hfn> {
    match t.slots.lookup(gfn)?.state(gfn) {
        PageState::Resident(f) => Some(f),
        _ => None,
    }
}

/// Brings unsync leaf table `page` in step with its guest table.
pub(crate) fn sync_page(
    t: &mut Tables<'_>,
    stats: &mut ShadowStats,
    page: Hfn,
) -> Result<Effects, ShadowError> {
    let mut fx = Effects::default();
    let Some(sp) = t.pages.get(page).cloned() else {
        return Ok(fx);
    };
    let Some(role) = sp.role.shadow else {
        return Ok(fx);
    };
    let Some(guest) = resident(t, sp.gfn) else {
        // The guest table is on swap: start again from nothing.
        let z = t.zap(page)?;
        fx.merge(z);
        stats.pages_zapped += 1;
        return Ok(fx);
    };
    let nxe = role.context.nxe;
    for i in 0..ENTRIES {
        let at = entry_at(page.addr(), i);
        let old = read_spte(t.mem, at)?;
        fx.reads += 1;
        if !spte::is_present(old) {
            continue;
        }
        let gpte = t.mem.read_u64(entry_at(guest.addr(), i))?;
        fx.reads += 1;
        let gfn = Gfn((gpte & pte::ADDR_MASK) >> 12);
        // A cleared accessed bit drops the spte too, so the next access
        // faults and the walk sets it again (KVM's
        // `prefetch_invalid_gpte`).
        let same_page = gpte & pte::PRESENT != 0
            && gpte & pte::ACCESSED != 0
            && gpte & reserved_bits(gpte, 1, nxe) == 0
            && t.pages.leaf_gfn(at) == Some(gfn);
        if !same_page {
            let z = t.clear_entry(at, 1)?;
            fx.merge(z);
            continue;
        }
        let acc = role.access & entry_access(gpte, nxe);
        if (old & spte::USER != 0) != (acc & access::USER != 0) {
            // U/S is not a right that can lag behind: with SMEP or SMAP a
            // supervisor-only spte allows what the guest's user page does
            // not. Refault it.
            let z = t.clear_entry(at, 1)?;
            fx.merge(z);
            continue;
        }
        let perms = LeafPerms {
            writable: acc & access::WRITE != 0
                && gpte & pte::DIRTY != 0
                && old & spte::HOST_WRITABLE != 0
                && !t.pages.write_tracked(gfn)
                // Only rights the spte had: more come at the next fault.
                && old & spte::WRITABLE != 0,
            user: acc & access::USER != 0,
            no_execute: acc & access::EXEC == 0 || old & spte::NX != 0,
            host_writable: old & spte::HOST_WRITABLE != 0,
        };
        let new =
            spte::make_leaf(old & spte::ADDR_MASK, perms) | (old & (spte::ACCESSED | spte::DIRTY));
        if new != old {
            let prev = exchange_spte(t.mem, at, new)?;
            fx.writes += 1;
            fx.flush |=
                prev & !new & (spte::WRITABLE | spte::USER) != 0 || new & !prev & spte::NX != 0;
            // Keep a dirty bit the CPU set meanwhile.
            if prev & spte::DIRTY != 0 && new & spte::DIRTY == 0 {
                crate::mmu::tdp::exchange_spte(t.mem, at, new | spte::DIRTY)?;
            }
        }
    }
    t.pages.set_unsync(page, false);
    stats.syncs += 1;
    let wp = t.write_protect(sp.gfn)?;
    fx.merge(wp);
    Ok(fx)
}

/// Syncs every unsync page (a CR3 load or a guest TLB flush; KVM syncs
/// those reachable from the root, a subset).
pub(crate) fn sync_all(
    t: &mut Tables<'_>,
    stats: &mut ShadowStats,
) -> Result<Effects, ShadowError> {
    let mut fx = Effects::default();
    for page in t.pages.unsync() {
        let s = sync_page(t, stats, page)?;
        fx.merge(s);
    }
    Ok(fx)
}

/// The guest wrote the entries `changed` (indexes) of its table `gfn`:
/// zaps them in every shadow page of the gfn.
pub(crate) fn track_write(
    t: &mut Tables<'_>,
    gfn: Gfn,
    changed: &[u64],
) -> Result<Effects, ShadowError> {
    let mut fx = Effects::default();
    for page in t.pages.of_gfn(gfn).to_vec() {
        for &i in changed {
            // Zapping an upper-level entry may zap pages of this gfn too.
            let Some(level) = t.pages.get(page).map(|p| p.role.level) else {
                break;
            };
            let z = t.clear_entry(entry_at(page.addr(), i), level)?;
            fx.merge(z);
        }
    }
    Ok(fx)
}

/// Zaps every shadow page of `gfn`: its writes stop faulting.
pub(crate) fn unprotect(
    t: &mut Tables<'_>,
    stats: &mut ShadowStats,
    gfn: Gfn,
) -> Result<Effects, ShadowError> {
    let mut fx = Effects::default();
    for page in t.pages.of_gfn(gfn).to_vec() {
        let z = t.zap(page)?;
        fx.merge(z);
        stats.pages_zapped += 1;
    }
    stats.wp_unprotected += 1;
    Ok(fx)
}
