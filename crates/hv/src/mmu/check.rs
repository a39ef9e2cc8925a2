//! The MMU invariant checker (run by the tests, and by the VM after
//! memslot changes in debug builds).
//!
//! - every present non-leaf entry points at a table whose header names
//!   that entry as its parent, one level down, covering the entry's gfns,
//!   in the same root;
//! - every leaf spte is a 4 KiB mapping listed in the rmap; under a
//!   current root, of a gfn inside a memslot, of the frame the memslot
//!   says the page is resident in (an obsolete root's leaves may map what
//!   a memslot change since has moved or removed: no vCPU uses them);
//! - writable implies MMU-writable implies host-writable, and a
//!   host-writable spte's memslot is not read-only;
//! - under dirty logging (bitmap, manual), a writable leaf's page is in
//!   the log;
//! - every rmap entry is a present leaf mapping its frame;
//! - every header's table is reachable from its root, or is an obsolete
//!   table a fast zap has unlinked and not yet freed.

use super::lock::Timed;
use super::page::ROOT_LEVEL;
use super::root::RootId;
use super::tdp::read_spte;
use super::tdp_iter::TdpIter;
use super::{spte, Mmu};
use crate::cost::HvCosts;
use crate::memslot::{Memslots, PageState};
use machine::{Gfn, Hfn, Hpa, PhysMemory};
use std::collections::BTreeSet;
use thiserror::Error;

/// Where a walk of the checker starts.
struct Top {
    table: Hfn,
    level: u8,
    gfn: Gfn,
    root: RootId,
    /// Made before the current MMU generation.
    obsolete: bool,
}

/// An MMU invariant that does not hold.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("MMU invariant broken: {0}")]
pub struct InvariantError(pub String);

impl Mmu {
    /// Checks every invariant listed in the module documentation.
    pub fn check(
        &self,
        mem: &PhysMemory,
        slots: &Memslots,
        costs: &HvCosts,
    ) -> Result<(), InvariantError> {
        let fail = |what: String| Err(InvariantError(what));
        let inner = self.hold(Timed::Untimed, costs);
        if self.mode == super::MmuMode::Shadow {
            return super::shadow::check::check(
                mem,
                slots,
                &inner.shadow.pages,
                &inner.headers,
                &inner.roots,
                &inner.rmap,
            );
        }
        let mut reached: BTreeSet<Hfn> = BTreeSet::new();
        let mut leaves: BTreeSet<Hpa> = BTreeSet::new();
        let generation = self.generation();
        // Where the walks start: every root, and the obsolete tables a
        // fast zap's teardown has unlinked but not freed yet.
        let mut tops: Vec<Top> = inner
            .roots
            .iter()
            .map(|r| Top {
                table: r.pml4,
                level: ROOT_LEVEL,
                gfn: Gfn(0),
                root: r.id,
                obsolete: r.generation != generation,
            })
            .collect();
        for (frame, h) in inner.headers.iter() {
            if h.parent.is_none() && inner.roots.by_table(frame).is_none() {
                if h.generation == generation {
                    return fail(format!("table {frame:?} ({h:?}) is detached but current"));
                }
                tops.push(Top {
                    table: frame,
                    level: h.role.level,
                    gfn: h.gfn,
                    root: h.root,
                    obsolete: true,
                });
            }
        }
        for top in tops {
            reached.insert(top.table);
            let all = Gfn(0)..Gfn(1 << (9 * ROOT_LEVEL as u32));
            for entry in TdpIter::below(mem, top.table, top.level, top.gfn, all) {
                let entry = entry.map_err(|e| InvariantError(format!("reading an spte: {e:?}")))?;
                let value = entry.spte;
                if !entry.is_leaf() {
                    let child = spte::frame(value);
                    let Some(h) = inner.headers.get(child) else {
                        return fail(format!(
                            "{:?} points at {child:?}, which has no header",
                            entry.at
                        ));
                    };
                    if h.parent != Some(entry.at)
                        || h.role.level != entry.level - 1
                        || h.gfn != entry.gfn
                        || h.root != top.root
                    {
                        return fail(format!(
                            "header of {child:?} {h:?} disagrees with its parent entry {entry:?}"
                        ));
                    }
                    reached.insert(child);
                    continue;
                }
                if entry.level != 1 {
                    return fail(format!("huge leaf {entry:?}: the TDP MMU maps 4 KiB pages"));
                }
                let frame = spte::frame(value);
                if !inner.rmap.get(frame).contains(&entry.at) {
                    return fail(format!("{entry:?} is missing from the rmap of {frame:?}"));
                }
                leaves.insert(entry.at);
                if top.obsolete {
                    // No vCPU enters with it again: its memslot may have
                    // gone or moved since it was made.
                    continue;
                }
                let Some(slot) = slots.lookup(entry.gfn) else {
                    return fail(format!(
                        "{entry:?} maps gfn {:?} outside every memslot",
                        entry.gfn
                    ));
                };
                if slot.state(entry.gfn) != PageState::Resident(frame) {
                    return fail(format!(
                        "{entry:?} maps {frame:?} but the memslot says {:?}",
                        slot.state(entry.gfn)
                    ));
                }
                if !spte::writable_bits_consistent(value) {
                    return fail(format!("{entry:?}: writable without MMU- or host-writable"));
                }
                if value & spte::HOST_WRITABLE != 0 && slot.flags.readonly {
                    return fail(format!("{entry:?}: host-writable in a read-only memslot"));
                }
                if value & spte::WRITE != 0 && !slot.writable_spte_logged(entry.gfn) {
                    return fail(format!("{entry:?}: writable but not in the dirty log"));
                }
            }
        }
        for (frame, at) in inner.rmap.iter() {
            if !leaves.contains(&at) {
                return fail(format!(
                    "rmap of {frame:?} lists {at:?}, which is not a present leaf"
                ));
            }
            let value = read_spte(mem, at).map_err(|e| InvariantError(format!("{e:?}")))?;
            if spte::frame(value) != frame {
                return fail(format!(
                    "rmap of {frame:?} lists {at:?}, which maps another frame"
                ));
            }
        }
        for (frame, header) in inner.headers.iter() {
            if !reached.contains(&frame) {
                return fail(format!(
                    "table {frame:?} ({header:?}) is not reachable from its root"
                ));
            }
        }
        Ok(())
    }
}
