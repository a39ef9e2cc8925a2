//! Memslots: guest-physical ranges and the host frames backing them.
//!
//! A slot is KVM's `kvm_memory_slot`: a gfn range and its backing. The
//! backing here is demand-allocated host frames, one entry per guest page,
//! playing the role of the VMM's anonymous memory behind `userspace_addr`:
//! a page is untouched (reads as zero), resident in a host frame, or
//! swapped out to a swap-file slot (see [`PageState`]). A resident page may
//! also keep a clean copy on swap (the swap cache), so evicting it again
//! without a write in between costs no I/O. Every change to the
//! set bumps its generation, so anything derived from slot contents (sptes
//! now; cached lookups later) can tell it is stale.

pub(crate) mod dirty_bitmap;

use crate::swap::SwapSlot;
use machine::{Gfn, Hfn};
use std::collections::BTreeMap;
use thiserror::Error;

/// Identifier of a memslot, chosen by the caller (as KVM's slot number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotId(pub u32);

impl std::fmt::Display for SlotId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Memslot flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotFlags {
    /// Guest writes fault (KVM_MEM_READONLY).
    pub readonly: bool,
    /// Writes are logged (KVM_MEM_LOG_DIRTY_PAGES): set by
    /// `Vm::enable_dirty_log`; a slot added with it logs in bitmap mode.
    pub log_dirty_pages: bool,
}

/// Where a guest page's contents are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PageState {
    /// Never touched: reads as zero, no frame, no swap slot.
    Untouched,
    /// In a host frame.
    Resident(Hfn),
    /// Only on swap, in this slot.
    Swapped(SwapSlot),
}

/// `backing` value of a page that is on swap only (frame numbers never
/// come near it; 0 means untouched, as frame 0 is never allocated).
const SWAPPED: u64 = u64::MAX;

/// One guest-physical range.
#[derive(Debug, Clone)]
pub(crate) struct Memslot {
    pub id: SlotId,
    pub base_gfn: Gfn,
    pub npages: u64,
    pub flags: SlotFlags,
    /// Host frame backing each page; 0 if never touched; [`SWAPPED`].
    backing: Vec<u64>,
    /// Swap slot + 1 holding each page (the page itself when swapped out,
    /// a clean copy when resident); 0 for none.
    swap: Vec<u32>,
    /// The dirty log, while `flags.log_dirty_pages`.
    pub dirty_log: Option<dirty_bitmap::SlotLog>,
    /// Every page is resident at the host frame of its own number (gpa =
    /// hpa), for ever: the RAM of a VM without memory virtualisation
    /// (`MmuMode::Native`). `backing` and `swap` stay unused; nothing
    /// evicts, swaps or first-touches such a page.
    identity: bool,
}

impl Memslot {
    /// Whether `gfn` lies in the slot.
    pub fn contains(&self, gfn: Gfn) -> bool {
        gfn.0 >= self.base_gfn.0 && gfn.0 - self.base_gfn.0 < self.npages
    }

    /// Index of `gfn` in the slot. `gfn` must be in the slot.
    pub fn index_of(&self, gfn: Gfn) -> u64 {
        gfn.0 - self.base_gfn.0
    }

    /// The gfn of page `index`.
    pub fn gfn_at(&self, index: u64) -> Gfn {
        Gfn(self.base_gfn.0 + index)
    }

    /// The frame backing `gfn`, if resident. `gfn` must be in the slot.
    pub fn backing(&self, gfn: Gfn) -> Option<Hfn> {
        match self.state_at(self.index_of(gfn)) {
            PageState::Resident(frame) => Some(frame),
            _ => None,
        }
    }

    /// Where page `index` is. `index` must be below `npages`.
    pub fn state_at(&self, index: u64) -> PageState {
        if self.identity {
            return PageState::Resident(Hfn(self.gfn_at(index).0));
        }
        match self.backing[index as usize] {
            0 => PageState::Untouched,
            SWAPPED => match self.swap_slot_at(index) {
                Some(slot) => PageState::Swapped(slot),
                // Unreachable by construction (set_swapped takes the slot);
                // reading as untouched would lose data, so say so loudly in
                // debug builds.
                None => {
                    debug_assert!(false, "swapped page without a swap slot");
                    PageState::Untouched
                }
            },
            frame => PageState::Resident(Hfn(frame)),
        }
    }

    /// Where `gfn` is.
    pub fn state(&self, gfn: Gfn) -> PageState {
        self.state_at(self.index_of(gfn))
    }

    /// Records the frame backing `gfn` (now resident).
    pub fn set_backing(&mut self, gfn: Gfn, frame: Hfn) {
        debug_assert!(frame.0 != 0 && frame.0 != SWAPPED);
        let i = self.index_of(gfn) as usize;
        self.backing[i] = frame.0;
    }

    /// Page `index` is now only on swap, in `slot`.
    pub fn set_swapped(&mut self, index: u64, slot: SwapSlot) {
        self.backing[index as usize] = SWAPPED;
        self.swap[index as usize] = slot.0 + 1;
    }

    /// The swap slot holding page `index` (or its clean copy).
    pub fn swap_slot_at(&self, index: u64) -> Option<SwapSlot> {
        match self.swap[index as usize] {
            0 => None,
            s => Some(SwapSlot(s - 1)),
        }
    }

    /// Page `index` is untouched again (its frame and swap slot, if any,
    /// are the caller's to release): it reads as zero.
    pub fn set_untouched(&mut self, index: u64) {
        self.backing[index as usize] = 0;
        self.swap[index as usize] = 0;
    }

    /// Forgets the clean swap copy of resident page `index` (it is about to
    /// change) and returns the slot to free.
    pub fn take_swap_copy(&mut self, index: u64) -> Option<SwapSlot> {
        if self.backing[index as usize] == SWAPPED {
            return None;
        }
        let slot = self.swap_slot_at(index);
        self.swap[index as usize] = 0;
        slot
    }

    /// All resident frames with their gfns, in gfn order.
    pub fn backed_pages(&self) -> impl Iterator<Item = (Gfn, Hfn)> + '_ {
        // An identity slot's frames are its own gfns and are never the
        // allocator's, so nobody may free them: it lists none.
        self.backing
            .iter()
            .enumerate()
            .filter(|(_, &f)| !self.identity && f != 0 && f != SWAPPED)
            .map(|(i, &f)| (Gfn(self.base_gfn.0 + i as u64), Hfn(f)))
    }

    /// Whether every page is resident at the frame of its own number.
    pub fn is_identity(&self) -> bool {
        self.identity
    }

    /// All swap slots the slot's pages use, in gfn order.
    pub fn swap_slots(&self) -> impl Iterator<Item = SwapSlot> + '_ {
        self.swap
            .iter()
            .filter(|&&s| s != 0)
            .map(|&s| SwapSlot(s - 1))
    }

    /// Whether writes must fault to be logged (logging on in a
    /// write-protecting mode): leaves are installed with W clear and
    /// MMU-writable set unless the access is a write.
    pub fn write_protected_for_log(&self) -> bool {
        self.dirty_log
            .as_ref()
            .is_some_and(|l| l.mode.write_protects())
    }

    /// Whether a writable spte of `gfn` is allowed by the dirty log: the
    /// slot does not write-protect for logging, or the page is in its
    /// bitmap (bitmap and manual modes: the invariant checkers' exactness
    /// rule; a ring's entries are not searched).
    pub fn writable_spte_logged(&self, gfn: Gfn) -> bool {
        use dirty_bitmap::DirtyLogMode;
        match &self.dirty_log {
            Some(log) if matches!(log.mode, DirtyLogMode::Bitmap | DirtyLogMode::Manual) => {
                log.bitmap.get(self.index_of(gfn))
            }
            _ => true,
        }
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
    /// Zapping the MMU's tables failed (`mmu::zap::ZapError`).
    #[error("zapping MMU tables: host memory access failed: {0:?}")]
    Zap(machine::MemError),
    #[error("memslots cannot change without memory virtualisation (--mmu none): guest-physical memory is host-physical memory")]
    Native,
}

/// The set of memslots of a VM, with its generation.
#[derive(Debug, Default)]
pub(crate) struct Memslots {
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

    /// Every slot, in gpa order.
    pub fn iter(&self) -> impl Iterator<Item = &Memslot> {
        self.by_base.values()
    }

    /// The slot with this id.
    pub fn get(&self, id: SlotId) -> Option<&Memslot> {
        self.by_base.values().find(|s| s.id == id)
    }

    /// The slot with this id, mutably.
    pub fn get_mut(&mut self, id: SlotId) -> Option<&mut Memslot> {
        self.by_base.values_mut().find(|s| s.id == id)
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
        let swap = vec![0; npages as usize];
        let dirty_log = flags.log_dirty_pages.then(|| dirty_bitmap::SlotLog {
            mode: dirty_bitmap::DirtyLogMode::Bitmap,
            bitmap: dirty_bitmap::DirtyBitmap::new(npages),
        });
        self.by_base.insert(
            base_gfn.0,
            Memslot {
                id,
                base_gfn,
                npages,
                flags,
                backing,
                swap,
                dirty_log,
                identity: false,
            },
        );
        self.generation += 1;
        Ok(())
    }

    /// Makes slot `id` an identity slot: each page resident at the host
    /// frame of its own number, for ever (see `Memslot::identity`). The
    /// caller owns those host frames (the frame allocator never hands them
    /// out).
    pub fn pin_identity(&mut self, id: SlotId) -> Result<(), MemslotError> {
        let slot = self.get_mut(id).ok_or(MemslotError::NoSuchSlot(id))?;
        slot.identity = true;
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

// The guest RAM layout: which memslots hold RAM, and where.

/// The memslot of guest RAM (below the PCI hole).
pub const RAM_SLOT: SlotId = SlotId(0);

/// The memslot of guest RAM above 4 GiB, when RAM reaches the PCI hole.
pub const HIGH_RAM_SLOT: SlotId = SlotId(1);

/// Where the PCI hole below 4 GiB begins: as on a PC (QEMU's `pc` machine
/// with 3.5 GiB of RAM or more), RAM stops here and the rest of it starts
/// at [`HIGH_RAM_START`], so that the xAPIC (0xfee00000), IOAPIC
/// (0xfec00000) and other device pages below 4 GiB are never RAM.
pub const PCI_HOLE_START: u64 = 0xc000_0000;

/// Where RAM beyond the PCI hole starts.
pub const HIGH_RAM_START: u64 = 1 << 32;

/// Guest RAM of `mem_size` bytes as guest-physical (start, length) ranges:
/// up to [`PCI_HOLE_START`], and the rest from [`HIGH_RAM_START`].
pub fn ram_ranges(mem_size: u64) -> Vec<(u64, u64)> {
    let low = low_ram_end(mem_size);
    let mut ranges = vec![(0, low)];
    if mem_size > low {
        ranges.push((HIGH_RAM_START, mem_size - low));
    }
    ranges
}

/// The end of the RAM below the PCI hole (`mem_size` when all of it is).
pub fn low_ram_end(mem_size: u64) -> u64 {
    mem_size.min(PCI_HOLE_START)
}

/// One past the highest guest-physical RAM address.
pub fn ram_top(mem_size: u64) -> u64 {
    ram_ranges(mem_size)
        .last()
        .map_or(0, |&(start, len)| start + len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_slot_is_resident_at_its_own_frames_and_owns_none() {
        let mut slots = Memslots::default();
        slots
            .add(SlotId(0), Gfn(0), 16, SlotFlags::default())
            .unwrap();
        slots
            .add(SlotId(1), Gfn(32), 4, SlotFlags::default())
            .unwrap();
        slots.pin_identity(SlotId(0)).unwrap();
        assert_eq!(
            slots.pin_identity(SlotId(9)),
            Err(MemslotError::NoSuchSlot(SlotId(9)))
        );
        let ram = slots.lookup(Gfn(5)).unwrap();
        assert!(ram.is_identity());
        // gfn 0 too: frame 0 is guest RAM here, never the allocator's.
        for gfn in [0, 5, 15] {
            assert_eq!(ram.state(Gfn(gfn)), PageState::Resident(Hfn(gfn)));
        }
        // Nothing for a caller to free when the slot goes.
        assert_eq!(ram.backed_pages().count(), 0);
        let other = slots.lookup(Gfn(33)).unwrap();
        assert!(!other.is_identity());
        assert_eq!(other.state(Gfn(33)), PageState::Untouched);
    }

    #[test]
    fn add_lookup_move_delete_bump_the_generation() {
        let mut slots = Memslots::default();
        slots
            .add(SlotId(0), Gfn(0), 16, SlotFlags::default())
            .unwrap();
        slots
            .add(SlotId(1), Gfn(32), 16, SlotFlags::default())
            .unwrap();
        assert_eq!(slots.generation(), 2);
        assert_eq!(slots.lookup(Gfn(15)).unwrap().id, SlotId(0));
        assert!(slots.lookup(Gfn(16)).is_none());
        assert_eq!(slots.lookup(Gfn(40)).unwrap().id, SlotId(1));
        assert!(matches!(
            slots.add(SlotId(2), Gfn(8), 16, SlotFlags::default()),
            Err(MemslotError::Overlap {
                other: SlotId(0),
                ..
            })
        ));
        assert_eq!(
            slots.add(SlotId(1), Gfn(100), 1, SlotFlags::default()),
            Err(MemslotError::DuplicateId(SlotId(1)))
        );
        slots
            .lookup_mut(Gfn(33))
            .unwrap()
            .set_backing(Gfn(33), Hfn(7));
        slots.move_slot(SlotId(1), Gfn(64)).unwrap();
        assert!(slots.lookup(Gfn(40)).is_none());
        assert_eq!(
            slots.lookup(Gfn(65)).unwrap().backing(Gfn(65)),
            Some(Hfn(7))
        );
        assert_eq!(slots.generation(), 3);
        let removed = slots.delete(SlotId(0)).unwrap();
        assert_eq!(removed.npages, 16);
        assert!(slots.lookup(Gfn(0)).is_none());
        assert_eq!(slots.generation(), 4);
        assert_eq!(
            slots.delete(SlotId(0)).unwrap_err(),
            MemslotError::NoSuchSlot(SlotId(0))
        );
    }

    #[test]
    fn pages_move_between_untouched_resident_and_swapped() {
        let mut slots = Memslots::default();
        slots
            .add(SlotId(3), Gfn(16), 4, SlotFlags::default())
            .unwrap();
        let slot = slots.get_mut(SlotId(3)).unwrap();
        assert_eq!(slot.state(Gfn(17)), PageState::Untouched);
        slot.set_backing(Gfn(17), Hfn(9));
        assert_eq!(slot.state(Gfn(17)), PageState::Resident(Hfn(9)));
        slot.set_swapped(1, SwapSlot(4));
        assert_eq!(slot.state(Gfn(17)), PageState::Swapped(SwapSlot(4)));
        assert_eq!(slot.backing(Gfn(17)), None);
        assert_eq!(slot.backed_pages().count(), 0);
        assert_eq!(
            slot.take_swap_copy(1),
            None,
            "a swapped page keeps its slot"
        );
        // Swapped back in: resident with a clean copy on swap.
        slot.set_backing(Gfn(17), Hfn(11));
        assert_eq!(slot.swap_slot_at(1), Some(SwapSlot(4)));
        assert_eq!(slot.swap_slots().collect::<Vec<_>>(), [SwapSlot(4)]);
        assert_eq!(slot.take_swap_copy(1), Some(SwapSlot(4)));
        assert_eq!(slot.swap_slot_at(1), None);
        assert_eq!(slot.state(Gfn(17)), PageState::Resident(Hfn(11)));
    }
}
