//! The reverse map: host frame -> the sptes that map it.
//!
//! Used to zap or age every mapping of a frame (eviction, slot deletion;
//! write-protection later) without walking the EPT tables.

use machine::{Hfn, Hpa};
use std::collections::BTreeMap;

/// Host frame -> addresses of the leaf sptes mapping it.
#[derive(Debug, Default)]
pub(crate) struct Rmap {
    map: BTreeMap<u64, Vec<Hpa>>,
}

impl Rmap {
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
        let mut rmap = Rmap::default();
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
}
