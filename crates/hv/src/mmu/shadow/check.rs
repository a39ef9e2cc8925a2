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
//! - every rmap entry is such a leaf.

use super::pages::ShadowPages;
use super::spte;
use crate::memslot::{Memslots, PageState};
use crate::mmu::check::InvariantError;
use crate::mmu::page::{PageHeaders, ENTRIES};
use crate::mmu::rmap::Rmap;
use crate::mmu::root::Roots;
use crate::mmu::tdp::{entry_at, read_spte};
use machine::{Hpa, PhysMemory};
use std::collections::BTreeSet;

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
            if page.role.level > 1 {
                let child = spte::frame(e);
                match pages.get(child) {
                    Some(c) if c.role.level + 1 == page.role.level && c.parents.contains(&at) => {}
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
