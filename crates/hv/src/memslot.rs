//! Memslots: guest-physical ranges and the host frames backing them.
//!
//! A slot is KVM's `kvm_memory_slot`: a gfn range and its backing. The
//! backing here is demand-allocated host frames, one entry per guest page
//! (0 = not yet allocated; frame 0 is never allocated), playing the role of
//! the VMM's anonymous memory behind `userspace_addr`. Every change to the
//! set bumps its generation, so anything derived from slot contents (sptes
//! now; cached lookups later) can tell it is stale.

use machine::{Gfn, Hfn};
use std::collections::BTreeMap;
use thiserror::Error;

/// Identifier of a memslot, chosen by the caller (as KVM's slot number).
pub type SlotId = u32;

/// Memslot flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotFlags {
    /// Guest writes fault (KVM_MEM_READONLY).
    pub readonly: bool,
}

/// One guest-physical range.
#[derive(Debug, Clone)]
pub struct Memslot {
    pub id: SlotId,
    pub base_gfn: Gfn,
    pub npages: u64,
    pub flags: SlotFlags,
    /// Host frame backing each page, 0 if never touched.
    backing: Vec<u64>,
}

impl Memslot {
    /// Whether `gfn` lies in the slot.
    pub fn contains(&self, gfn: Gfn) -> bool {
        gfn.0 >= self.base_gfn.0 && gfn.0 - self.base_gfn.0 < self.npages
    }

    /// The frame backing `gfn`, if allocated. `gfn` must be in the slot.
    pub fn backing(&self, gfn: Gfn) -> Option<Hfn> {
        let frame = self.backing[(gfn.0 - self.base_gfn.0) as usize];
        (frame != 0).then_some(Hfn(frame))
    }

    /// Records the frame backing `gfn`.
    pub fn set_backing(&mut self, gfn: Gfn, frame: Hfn) {
        debug_assert!(frame.0 != 0);
        self.backing[(gfn.0 - self.base_gfn.0) as usize] = frame.0;
    }

    /// All allocated backing frames with their gfns, in gfn order.
    pub fn backed_pages(&self) -> impl Iterator<Item = (Gfn, Hfn)> + '_ {
        self.backing
            .iter()
            .enumerate()
            .filter(|(_, &f)| f != 0)
            .map(|(i, &f)| (Gfn(self.base_gfn.0 + i as u64), Hfn(f)))
    }

    /// One past the last gfn.
    pub fn end_gfn(&self) -> Gfn {
        Gfn(self.base_gfn.0 + self.npages)
    }
}

/// Why a memslot change was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MemslotError {
    #[error("memslot {0} already exists")]
    DuplicateId(SlotId),
    #[error("no memslot {0}")]
    NoSuchSlot(SlotId),
    #[error("memslot of {npages} pages at gfn {base:#x} is empty or overflows")]
    BadRange { base: u64, npages: u64 },
    #[error("memslot at gfns {base:#x}..{end:#x} overlaps memslot {other}")]
    Overlap { base: u64, end: u64, other: SlotId },
}

/// The set of memslots of a VM, with its generation.
#[derive(Debug, Default)]
pub struct Memslots {
    /// Keyed by base gfn (slots never overlap), so lookup is a range query.
    by_base: BTreeMap<u64, Memslot>,
    generation: u64,
}

impl Memslots {
    /// Bumped on every add, delete or move.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The slot containing `gfn`.
    pub fn lookup(&self, gfn: Gfn) -> Option<&Memslot> {
        let (_, slot) = self.by_base.range(..=gfn.0).next_back()?;
        slot.contains(gfn).then_some(slot)
    }

    /// The slot containing `gfn`, mutably.
    pub fn lookup_mut(&mut self, gfn: Gfn) -> Option<&mut Memslot> {
        let (_, slot) = self.by_base.range_mut(..=gfn.0).next_back()?;
        slot.contains(gfn).then_some(slot)
    }

    /// The slot with this id.
    pub fn get(&self, id: SlotId) -> Option<&Memslot> {
        self.by_base.values().find(|s| s.id == id)
    }

    /// All slots in gfn order.
    pub fn iter(&self) -> impl Iterator<Item = &Memslot> {
        self.by_base.values()
    }

    fn check_free(
        &self,
        base: Gfn,
        npages: u64,
        ignore: Option<SlotId>,
    ) -> Result<(), MemslotError> {
        let bad = MemslotError::BadRange {
            base: base.0,
            npages,
        };
        let end = base.0.checked_add(npages).ok_or(bad.clone())?;
        // Guest-physical addresses have at most 52 bits.
        if npages == 0 || end > (1 << 40) {
            return Err(bad);
        }
        for slot in self.by_base.values() {
            if Some(slot.id) != ignore && slot.base_gfn.0 < end && base.0 < slot.end_gfn().0 {
                return Err(MemslotError::Overlap {
                    base: base.0,
                    end,
                    other: slot.id,
                });
            }
        }
        Ok(())
    }

    /// Adds a slot with no backing allocated yet.
    pub fn add(
        &mut self,
        id: SlotId,
        base_gfn: Gfn,
        npages: u64,
        flags: SlotFlags,
    ) -> Result<(), MemslotError> {
        if self.get(id).is_some() {
            return Err(MemslotError::DuplicateId(id));
        }
        self.check_free(base_gfn, npages, None)?;
        let backing = vec![0; npages as usize];
        self.by_base.insert(
            base_gfn.0,
            Memslot {
                id,
                base_gfn,
                npages,
                flags,
                backing,
            },
        );
        self.generation += 1;
        Ok(())
    }

    /// Removes a slot and returns it (its backing frames are the caller's
    /// to free once no spte maps them).
    pub fn delete(&mut self, id: SlotId) -> Result<Memslot, MemslotError> {
        let base = self.get(id).ok_or(MemslotError::NoSuchSlot(id))?.base_gfn;
        let slot = self
            .by_base
            .remove(&base.0)
            .ok_or(MemslotError::NoSuchSlot(id))?;
        self.generation += 1;
        Ok(slot)
    }

    /// Moves a slot to a new base gfn, keeping its backing: the contents
    /// move with it, as when a VMM re-registers the same host memory at a
    /// new guest-physical address.
    pub fn move_slot(&mut self, id: SlotId, new_base: Gfn) -> Result<(), MemslotError> {
        let old = self.get(id).ok_or(MemslotError::NoSuchSlot(id))?;
        let (old_base, npages) = (old.base_gfn, old.npages);
        self.check_free(new_base, npages, Some(id))?;
        let mut slot = self
            .by_base
            .remove(&old_base.0)
            .ok_or(MemslotError::NoSuchSlot(id))?;
        slot.base_gfn = new_base;
        self.by_base.insert(new_base.0, slot);
        self.generation += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_lookup_move_delete_bump_the_generation() {
        let mut slots = Memslots::default();
        slots.add(0, Gfn(0), 16, SlotFlags::default()).unwrap();
        slots.add(1, Gfn(32), 16, SlotFlags::default()).unwrap();
        assert_eq!(slots.generation(), 2);
        assert_eq!(slots.lookup(Gfn(15)).unwrap().id, 0);
        assert!(slots.lookup(Gfn(16)).is_none());
        assert_eq!(slots.lookup(Gfn(40)).unwrap().id, 1);
        assert!(matches!(
            slots.add(2, Gfn(8), 16, SlotFlags::default()),
            Err(MemslotError::Overlap { other: 0, .. })
        ));
        assert_eq!(
            slots.add(1, Gfn(100), 1, SlotFlags::default()),
            Err(MemslotError::DuplicateId(1))
        );
        slots
            .lookup_mut(Gfn(33))
            .unwrap()
            .set_backing(Gfn(33), Hfn(7));
        slots.move_slot(1, Gfn(64)).unwrap();
        assert!(slots.lookup(Gfn(40)).is_none());
        assert_eq!(
            slots.lookup(Gfn(65)).unwrap().backing(Gfn(65)),
            Some(Hfn(7))
        );
        assert_eq!(slots.generation(), 3);
        let removed = slots.delete(0).unwrap();
        assert_eq!(removed.npages, 16);
        assert!(slots.lookup(Gfn(0)).is_none());
        assert_eq!(slots.generation(), 4);
        assert_eq!(slots.delete(0).unwrap_err(), MemslotError::NoSuchSlot(0));
    }
}
