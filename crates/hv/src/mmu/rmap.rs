//! The reverse map: host frame -> the sptes that map it.
//!
//! Used to zap or age every mapping of a frame (eviction, slot deletion;
//! write-protection later) without walking the EPT tables.
//!
//! It also keeps what a dropped spte knew: a leaf that goes while its dirty
//! bit is set (a zap-all, a shadow page zapped or synced away, a leaf
//! replaced) leaves its frame marked dirty here until the pager evicts the
//! frame (KVM's `kvm_set_pfn_dirty` in `mmu_spte_clear_track_bits`).
//! Without it the pager would see no dirty spte at eviction, keep the
//! page's older swap copy, and lose the guest's write.

use machine::{Hfn, Hpa};
use std::collections::{BTreeMap, BTreeSet};

/// Host frame -> addresses of the leaf sptes mapping it.
#[derive(Debug)]
pub(crate) struct Rmap {
    map: BTreeMap<u64, Vec<Hpa>>,
    /// The dirty bit of this MMU's leaf sptes.
    dirty_mask: u64,
    /// Frames written through an spte that is gone.
    dirtied: BTreeSet<u64>,
}

impl Rmap {
    /// An empty rmap for sptes whose dirty bit is `dirty_mask`.
    pub fn new(dirty_mask: u64) -> Self {
        Rmap {
            map: BTreeMap::new(),
            dirty_mask,
            dirtied: BTreeSet::new(),
        }
    }

    /// Forgets the leaf at `spte` that mapped `frame` and held `old`
    /// (now cleared or replaced): its dirty bit stays with the frame.
    pub fn remove_leaf(&mut self, frame: Hfn, spte: Hpa, old: u64) {
        self.remove(frame, spte);
        self.note_dropped_bits(frame, old);
    }

    /// `old` was a leaf of `frame` whose dirty bit a rewrite dropped.
    pub fn note_dropped_bits(&mut self, frame: Hfn, old: u64) {
        if old & self.dirty_mask != 0 {
            self.dirtied.insert(frame.0);
        }
    }

    /// Whether `frame` was written through an spte that is gone; clears
    /// the mark (the pager is evicting or dropping the frame).
    pub fn take_dirty(&mut self, frame: Hfn) -> bool {
        self.dirtied.remove(&frame.0)
    }
    /// Records that the spte at `spte` maps `frame`.
    pub fn add(&mut self, frame: Hfn, spte: Hpa) {
        let sptes = self.map.entry(frame.0).or_default();
        if !sptes.contains(&spte) {
            sptes.push(spte);
        }
    }

    /// Removes and returns every spte mapping `frame`.
    pub fn take(&mut self, frame: Hfn) -> Vec<Hpa> {
        self.map.remove(&frame.0).unwrap_or_default()
    }

    /// Forgets that the spte at `spte` maps `frame`.
    pub fn remove(&mut self, frame: Hfn, spte: Hpa) {
        if let Some(sptes) = self.map.get_mut(&frame.0) {
            sptes.retain(|&s| s != spte);
            if sptes.is_empty() {
                self.map.remove(&frame.0);
            }
        }
    }

    /// The sptes mapping `frame`.
    pub fn get(&self, frame: Hfn) -> &[Hpa] {
        self.map.get(&frame.0).map_or(&[], Vec::as_slice)
    }

    /// Every (frame, spte) pair, in frame order.
    pub fn iter(&self) -> impl Iterator<Item = (Hfn, Hpa)> + '_ {
        self.map
            .iter()
            .flat_map(|(&f, sptes)| sptes.iter().map(move |&s| (Hfn(f), s)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_is_idempotent_and_take_and_remove_empty() {
        let mut rmap = Rmap::new(1 << 6);
        rmap.add(Hfn(5), Hpa(0x1008));
        rmap.add(Hfn(5), Hpa(0x1008));
        rmap.add(Hfn(5), Hpa(0x2008));
        assert_eq!(rmap.get(Hfn(5)), &[Hpa(0x1008), Hpa(0x2008)]);
        rmap.remove(Hfn(5), Hpa(0x1008));
        assert_eq!(rmap.get(Hfn(5)), &[Hpa(0x2008)]);
        assert_eq!(rmap.take(Hfn(5)).len(), 1);
        assert!(rmap.get(Hfn(5)).is_empty());
        assert_eq!(rmap.iter().count(), 0);
    }

    #[test]
    fn a_dropped_dirty_leaf_leaves_its_frame_dirty_until_taken() {
        let mut rmap = Rmap::new(1 << 6);
        rmap.add(Hfn(7), Hpa(0x1010));
        rmap.add(Hfn(8), Hpa(0x1018));
        rmap.remove_leaf(Hfn(7), Hpa(0x1010), 0x7000 | 1 << 6 | 1);
        rmap.remove_leaf(Hfn(8), Hpa(0x1018), 0x8000 | 1);
        assert!(rmap.get(Hfn(7)).is_empty());
        assert!(rmap.take_dirty(Hfn(7)));
        assert!(!rmap.take_dirty(Hfn(7)), "taken once");
        assert!(!rmap.take_dirty(Hfn(8)), "clean");
    }
}
