//! The reverse map: host frame -> the sptes that map it.
//!
//! Used to zap every mapping of a frame (slot deletion now; eviction and
//! write-protection later) without walking the EPT tables.

use machine::{Hfn, Hpa};
use std::collections::BTreeMap;

/// Host frame -> addresses of the leaf sptes mapping it.
#[derive(Debug, Default)]
pub struct Rmap {
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

    /// The sptes mapping `frame`.
    pub fn get(&self, frame: Hfn) -> &[Hpa] {
        self.map.get(&frame.0).map_or(&[], Vec::as_slice)
    }

    /// Frames with at least one mapping.
    pub fn mapped_frames(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_is_idempotent_and_take_empties() {
        let mut rmap = Rmap::default();
        rmap.add(Hfn(5), Hpa(0x1008));
        rmap.add(Hfn(5), Hpa(0x1008));
        rmap.add(Hfn(5), Hpa(0x2008));
        assert_eq!(rmap.get(Hfn(5)), &[Hpa(0x1008), Hpa(0x2008)]);
        assert_eq!(rmap.take(Hfn(5)).len(), 2);
        assert!(rmap.get(Hfn(5)).is_empty());
        assert_eq!(rmap.mapped_frames(), 0);
    }
}
