//! The shadow MMU's invariants (run by `Mmu::check` under shadow paging):
//!
//! - every shadow page has a header of the same gfn and role, every header
//!   a shadow page, every root a root page;
//! - every parent link is a present non-leaf entry pointing at its page,
//!   and every present non-leaf entry is a parent link of a page one level
//!   down;
//! - every present leaf (level 1) maps the frame the memslot says its gfn
//!   is resident in, is in that frame's rmap, has consistent writable bits
//!   (writable ⇒ MMU-writable ⇒ host-writable; host-writable ⇒ the slot is
//!   writable), and is writable only if its gfn is not write-tracked;
//! - every rmap entry is such a leaf;
//! - a sync indirect page agrees with the guest table it shadows (KVM's
//!   audit): each present entry's guest entry is present, accessed and
//!   points where the shadow does (the child's table, or the leaf's gfn),
//!   and a leaf grants nothing the guest entry does not.

use super::pages::ShadowPages;
use super::role::access;
use super::spte;
use crate::memslot::{Memslots, PageState};
use crate::mmu::check::InvariantError;
use crate::mmu::page::{PageHeaders, ENTRIES};
use crate::mmu::rmap::Rmap;
use crate::mmu::root::Roots;
use crate::mmu::tdp::{entry_at, read_spte};
use machine::mmu::paging::pte;
use machine::{Hpa, PhysMemory};
use std::collections::BTreeSet;

/// Entries one entry of a table at `level` spans, in gfns.
fn span(level: u8) -> u64 {
    1 << (9 * (level as u64 - 1))
}

/// The guest entry behind entry `i` of a sync indirect page, if its table
/// is resident.
fn guest_entry(
    mem: &PhysMemory,
    slots: &Memslots,
    page: &super::pages::ShadowPage,
    i: u64,
) -> Option<u64> {
    if page.role.direct || page.unsync || page.obsolete {
        return None;
    }
    let PageState::Resident(frame) = slots.lookup(page.gfn)?.state(page.gfn) else {
        return None;
    };
    mem.read_u64(entry_at(frame.addr(), i)).ok()
}

fn fail<T>(what: String) -> Result<T, InvariantError> {
    Err(InvariantError(what))
}

/// Checks the invariants above.
pub(crate) fn check(
    mem: &PhysMemory,
    slots: &Memslots,
    pages: &ShadowPages,
    headers: &PageHeaders,
    roots: &Roots,
    rmap: &Rmap,
) -> Result<(), InvariantError> {
    let read = |at: Hpa| read_spte(mem, at).map_err(|e| InvariantError(format!("{e:?}")));
    let mut leaves = BTreeSet::new();
    let mut count = 0;
    for (frame, page) in pages.iter() {
        count += 1;
        match headers.get(frame) {
            Some(h) if h.gfn == page.gfn && h.role == page.role => {}
            other => {
                return fail(format!(
                    "shadow page {frame:?} {page:?} has header {other:?}"
                ))
            }
        }
        for &parent in &page.parents {
            let e = read(parent)?;
            if !spte::is_present(e) || spte::frame(e) != frame {
                return fail(format!("{frame:?}: parent link {parent:?} holds {e:#x}"));
            }
        }
        for i in 0..ENTRIES {
            let at = entry_at(frame.addr(), i);
            let e = read(at)?;
            if !spte::is_present(e) {
                continue;
            }
            let guest = guest_entry(mem, slots, page, i);
            if page.role.level > 1 {
                let child = spte::frame(e);
                match pages.get(child) {
                    Some(c) if c.role.level + 1 == page.role.level && c.parents.contains(&at) => {
                        if let Some(g) = guest {
                            let points = (g & pte::ADDR_MASK) >> 12;
                            let huge = g & pte::HUGE != 0;
                            let ok = g & pte::PRESENT != 0
                                && g & pte::ACCESSED != 0
                                && (huge || (!c.role.direct && c.gfn.0 == points))
                                && (!huge
                                    || (c.role.direct
                                        && c.gfn.0 & !(span(page.role.level) - 1)
                                            == points & !(span(page.role.level) - 1)));
                            if !ok {
                                return fail(format!(
                                    "{at:?} links {c:?} but the guest entry is {g:#x}"
                                ));
                            }
                        }
                    }
                    other => return fail(format!("{at:?} links {child:?}: {other:?}")),
                }
                continue;
            }
            let Some(gfn) = pages.leaf_gfn(at) else {
                return fail(format!("leaf {at:?} = {e:#x} has no gfn"));
            };
            let Some(slot) = slots.lookup(gfn) else {
                return fail(format!("leaf {at:?} maps {gfn:?} outside every memslot"));
            };
            if slot.state(gfn) != PageState::Resident(spte::frame(e)) {
                return fail(format!(
                    "leaf {at:?} maps {:?}, memslot says {:?}",
                    spte::frame(e),
                    slot.state(gfn)
                ));
            }
            if !rmap.get(spte::frame(e)).contains(&at) {
                return fail(format!("leaf {at:?} is missing from the rmap"));
            }
            if !spte::writable_bits_consistent(e)
                || (e & spte::HOST_WRITABLE != 0 && slot.flags.readonly)
            {
                return fail(format!("leaf {at:?} = {e:#x}: inconsistent writable bits"));
            }
            if let (Some(g), Some(role)) = (guest, page.role.shadow) {
                let nxe = role.context.nxe;
                let acc = role.access & super::gwalk::entry_access(g, nxe);
                let ok = g & pte::PRESENT != 0
                    && g & pte::ACCESSED != 0
                    && (g & pte::ADDR_MASK) >> 12 == gfn.0
                    && (e & spte::WRITABLE == 0
                        || (g & pte::DIRTY != 0
                            && (acc & access::WRITE != 0 || !role.context.cr0_wp)))
                    && (e & spte::USER == 0 || acc & access::USER != 0)
                    && (e & spte::NX != 0 || acc & access::EXEC != 0);
                if !ok {
                    return fail(format!("leaf {at:?} = {e:#x} ({gfn:?}) grants more than guest entry {g:#x} (role {role:?})"));
                }
            }
            if e & spte::WRITABLE != 0 && !slot.writable_spte_logged(gfn) {
                return fail(format!(
                    "leaf {at:?} writable but {gfn:?} is not in the dirty log"
                ));
            }
            if e & spte::WRITABLE != 0 && pages.write_tracked(gfn) {
                return fail(format!("leaf {at:?} writable but {gfn:?} is write-tracked"));
            }
            leaves.insert(at);
        }
    }
    if count != headers.len() {
        return fail(format!(
            "{count} shadow pages but {} headers",
            headers.len()
        ));
    }
    for root in roots.iter() {
        if pages.get(root.pml4).and_then(|p| p.root) != Some(root.id) {
            return fail(format!("root {:?} has no root page", root.id));
        }
    }
    for (frame, at) in rmap.iter() {
        if !leaves.contains(&at) {
            return fail(format!(
                "rmap of {frame:?} lists {at:?}, not a present shadow leaf"
            ));
        }
    }
    if pages.leaves().count() != leaves.len() {
        return fail("a zapped leaf kept its gfn".to_string());
    }
    Ok(())
}
