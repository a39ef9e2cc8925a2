//! The first-level TLB: a small direct-mapped cache of the last
//! translations per access kind, in front of the set-associative
//! [`crate::mmu::tlb::Tlb`] (as the L1 iTLB/dTLB sit in front of the STLB on
//! a real core).
//!
//! It is inclusive and never more permissive than the TLB behind it: a slot
//! is valid only while the TLB's epoch and the CPU's mode epoch are the
//! ones it was filled under. Any fill, eviction or invalidation in the TLB,
//! or any change of CR0/CR3/CR4/EFER, CPL, RFLAGS.AC or the VMX controls,
//! therefore empties it at once. Hits here do not update the replacement
//! state of the TLB, exactly as L1 hits do not reach the STLB on hardware.
//!
//! Emptying is eager: [`L1Tlb::sync`] compares the two epochs with the ones
//! the slots were filled under and, when either moved, clears the slots
//! filled since (a short list, so the cost is that of the fills), so a
//! valid slot is simply one whose page matches. That is what lets
//! translated code probe a slot with a single compare: the CPU syncs before
//! generated code runs and after every call-out from it, the only places
//! the epochs can move. Lookups and fills sync first, so the interpreter
//! needs no such discipline.

use crate::addr::Hpa;
use crate::mmu::tlb::LookupKey;

pub(crate) const SLOTS: usize = 64;
/// Size of one slot (see [`Slot`]).
pub(crate) const SLOT_BYTES: usize = 32;
const _: () = assert!(std::mem::size_of::<Slot>() == SLOT_BYTES);
/// Access-kind classes: (read, write, execute) x (supervisor, user).
pub(crate) const CLASSES: usize = 6;
/// Byte offsets in a [`Slot`] that translated code reads.
pub(crate) const SLOT_JIT_PAGE: usize = 16;
pub(crate) const SLOT_HOST_DELTA: usize = 24;
pub(crate) const SLOT_HPA: usize = 8;
const _: () = assert!(std::mem::offset_of!(Slot, jit_page) == SLOT_JIT_PAGE);
const _: () = assert!(std::mem::offset_of!(Slot, host_delta) == SLOT_HOST_DELTA);
const _: () = assert!(std::mem::offset_of!(Slot, hpa) == SLOT_HPA);

/// `repr(C)`: translated code reads slots inline (`jit`), at
/// [`SLOT_BYTES`] per slot, [`SLOTS`] slots per class.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
struct Slot {
    /// Linear page number + 1 (0 = empty).
    page: u64,
    /// Host-physical page base.
    hpa: u64,
    /// The linear page number (without the + 1) when the frame lies
    /// inside the memory the slot was filled for (translated code may then
    /// access it through `host_delta`), else `u64::MAX`, which no page
    /// number equals.
    jit_page: u64,
    /// Host address of the page minus its linear address (wrapping): the
    /// host address of a byte is its linear address plus this.
    host_delta: u64,
}

impl Slot {
    const EMPTY: Slot = Slot {
        page: 0,
        hpa: 0,
        jit_page: u64::MAX,
        host_delta: 0,
    };
}

/// Per access kind (read, write, execute), for user and supervisor.
#[derive(Debug, Clone)]
pub(crate) struct L1Tlb {
    slots: Box<[[Slot; SLOTS]; CLASSES]>,
    /// The epochs every valid slot was filled under.
    tlb_epoch: u64,
    mode_epoch: u64,
    /// The memory (host base, size) the slots' `jit_page`/`host_delta`
    /// were computed for.
    memory: (usize, u64),
    /// What a fill updates besides the slot (boxed: translated code's
    /// first-level fill writes it at a fixed address, `book_address`).
    book: Box<Book>,
}

/// A first-level TLB's bookkeeping. `repr(C)`: the translator's
/// first-level fill (`jit::tlb_fill`) reads and writes it at the offsets
/// below, exactly as [`L1Tlb::fill`] and [`L1Tlb::key`] do.
#[derive(Debug, Clone)]
#[repr(C)]
pub(crate) struct Book {
    /// The TLB lookup key of each class under the current mode, once
    /// computed: it depends only on what the mode epoch covers (paging
    /// registers, RFLAGS.AC, VPID, EPTP), so it is dropped when that epoch
    /// moves. Translated code's first-level fill reads the data classes'
    /// (the first [`DATA_CLASSES`]); the interpreter's misses and fetches
    /// use all.
    keys: [KeySlot; CLASSES],
    /// Per class, bit i: slot i is in `filled`.
    listed: [u64; CLASSES],
    /// How many of `filled` are in use.
    filled_len: u64,
    /// Slots filled since the last clear (class * SLOTS + index), each once
    /// (so `filled_len` never passes its length).
    filled: [u16; SLOTS * CLASSES],
}

/// The data-access classes (read and write, supervisor and user): the
/// ones translated code's first-level fill serves.
pub(crate) const DATA_CLASSES: usize = 4;

/// A cached lookup key.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
struct KeySlot {
    /// Non-zero when `key` is the key under the current mode.
    valid: u64,
    key: LookupKey,
}

impl KeySlot {
    const NONE: KeySlot = KeySlot {
        valid: 0,
        key: LookupKey::ZERO,
    };
}

/// Offsets in a [`Book`] and a [`KeySlot`] that translated code uses.
pub(crate) mod book {
    use super::{Book, KeySlot, CLASSES, SLOTS};
    use std::mem::{offset_of, size_of};
    pub const KEYS: i32 = 0;
    pub const KEY_SLOT_BYTES: i32 = 40;
    pub const KEY_SLOT_VALID: i32 = 0;
    pub const KEY_SLOT_KEY: i32 = 8;
    pub const LISTED: i32 = KEYS + CLASSES as i32 * KEY_SLOT_BYTES;
    pub const FILLED_LEN: i32 = LISTED + 8 * CLASSES as i32;
    pub const FILLED: i32 = FILLED_LEN + 8;
    /// Entries in `filled`.
    pub const FILLED_CAPACITY: u32 = (SLOTS * CLASSES) as u32;
    const _: () = assert!(size_of::<KeySlot>() == KEY_SLOT_BYTES as usize);
    const _: () = assert!(offset_of!(KeySlot, valid) == KEY_SLOT_VALID as usize);
    const _: () = assert!(offset_of!(KeySlot, key) == KEY_SLOT_KEY as usize);
    const _: () = assert!(offset_of!(Book, keys) == KEYS as usize);
    const _: () = assert!(offset_of!(Book, listed) == LISTED as usize);
    const _: () = assert!(offset_of!(Book, filled_len) == FILLED_LEN as usize);
    const _: () = assert!(offset_of!(Book, filled) == FILLED as usize);
    // `listed` is one u64 bitmap per class.
    const _: () = assert!(SLOTS == 64);
}

impl L1Tlb {
    pub(crate) fn new() -> Self {
        L1Tlb {
            slots: Box::new([[Slot::EMPTY; SLOTS]; CLASSES]),
            tlb_epoch: 0,
            mode_epoch: 0,
            memory: (0, 0),
            book: Box::new(Book {
                keys: [KeySlot::NONE; CLASSES],
                listed: [0; CLASSES],
                filled_len: 0,
                filled: [0; SLOTS * CLASSES],
            }),
        }
    }

    /// Empties the slots filled since the last clear.
    fn clear(&mut self) {
        let book = &mut *self.book;
        let len = (book.filled_len as usize).min(book.filled.len());
        for &i in &book.filled[..len] {
            let (c, k) = (i as usize / SLOTS, i as usize % SLOTS);
            self.slots[c][k] = Slot::EMPTY;
        }
        book.filled_len = 0;
        book.listed = [0; CLASSES];
    }

    /// Brings the slots up to the current epochs: empties them if either
    /// moved since they were filled.
    #[inline]
    pub(crate) fn sync(&mut self, tlb_epoch: u64, mode_epoch: u64) {
        if tlb_epoch != self.tlb_epoch || mode_epoch != self.mode_epoch {
            if mode_epoch != self.mode_epoch {
                self.book.keys = [KeySlot::NONE; CLASSES];
            }
            self.clear();
            self.tlb_epoch = tlb_epoch;
            self.mode_epoch = mode_epoch;
        }
    }

    /// Whether the slots are in sync with these epochs.
    pub(crate) fn in_sync(&self, tlb_epoch: u64, mode_epoch: u64) -> bool {
        (tlb_epoch, mode_epoch) == (self.tlb_epoch, self.mode_epoch)
    }

    /// Makes the slots' host addresses those of the memory at `base` of
    /// `size` bytes (empties them if they were made for another).
    #[inline]
    pub(crate) fn use_memory(&mut self, base: *mut u8, size: u64) {
        let memory = (base as usize, size);
        if self.memory != memory {
            self.clear();
            self.memory = memory;
        }
    }

    /// The host-physical address of `la`, if cached for this kind.
    #[inline]
    pub(crate) fn lookup(
        &mut self,
        class: usize,
        la: u64,
        tlb_epoch: u64,
        mode_epoch: u64,
    ) -> Option<Hpa> {
        self.sync(tlb_epoch, mode_epoch);
        let page = (la >> 12) + 1;
        let s = &self.slots[class][(page as usize) & (SLOTS - 1)];
        (s.page == page).then_some(Hpa(s.hpa | (la & 0xfff)))
    }

    /// [`Self::lookup`] without the sync: for translated code's misses,
    /// which only happen with the slots in sync (the CPU syncs them before
    /// generated code runs and after every call-out from it).
    #[inline]
    pub(crate) fn peek(&self, class: usize, la: u64) -> bool {
        let page = (la >> 12) + 1;
        self.slots[class][(page as usize) & (SLOTS - 1)].page == page
    }

    /// The cached TLB lookup key of class `class` (see `keys`). The slots
    /// must be synced.
    #[inline]
    pub(crate) fn key(&self, class: usize) -> Option<LookupKey> {
        self.book
            .keys
            .get(class)
            .filter(|k| k.valid != 0)
            .map(|k| k.key)
    }

    /// Caches the TLB lookup key of class `class` under the current mode.
    #[inline]
    pub(crate) fn set_key(&mut self, class: usize, key: LookupKey) {
        if let Some(k) = self.book.keys.get_mut(class) {
            *k = KeySlot { valid: 1, key };
        }
    }

    /// The bookkeeping's address (see [`Book`]): fixed for the life of
    /// this first-level TLB.
    pub(crate) fn book_address(&mut self) -> u64 {
        std::ptr::addr_of_mut!(*self.book) as u64
    }

    /// The slots' base address: class `c`, slot `i` at
    /// `base + (c * SLOTS + i) * SLOT_BYTES`. The slots are only read
    /// there, by code that ran [`Self::sync`] and [`Self::use_memory`]
    /// since the epochs or the memory last changed.
    pub(crate) fn slots_address(&self) -> usize {
        self.slots.as_ptr() as usize
    }

    /// What translated code's probe of `class` for an access of `bytes`
    /// bytes at `la` finds (see `jit::memory`): the host-physical page if
    /// it hits. The slots must be synced.
    pub(crate) fn jit_slot(&self, class: usize, la: u64, bytes: u64) -> Option<Hpa> {
        let s = &self.slots[class][((la >> 12) as usize + 1) & (SLOTS - 1)];
        (s.jit_page == la.wrapping_add(bytes - 1) >> 12).then_some(Hpa(s.hpa))
    }

    /// Records a translation the TLB just gave.
    #[inline(always)]
    pub(crate) fn fill(
        &mut self,
        class: usize,
        la: u64,
        hpa: Hpa,
        tlb_epoch: u64,
        mode_epoch: u64,
    ) {
        self.sync(tlb_epoch, mode_epoch);
        let page = (la >> 12) + 1;
        let index = (page as usize) & (SLOTS - 1);
        let hpa_page = hpa.0 & !0xfff;
        let (base, size) = self.memory;
        let inside = base != 0 && hpa_page < size;
        self.slots[class][index] = Slot {
            page,
            hpa: hpa_page,
            jit_page: if inside { la >> 12 } else { u64::MAX },
            host_delta: (base as u64)
                .wrapping_add(hpa_page)
                .wrapping_sub(la & !0xfff),
        };
        let book = &mut *self.book;
        if book.listed[class] & (1 << index) == 0 {
            book.listed[class] |= 1 << index;
            // Listed once each: at most SLOTS * CLASSES entries.
            if let Some(f) = book.filled.get_mut(book.filled_len as usize) {
                *f = (class * SLOTS + index) as u16;
                book.filled_len += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_empty_when_an_epoch_moves_and_only_then() {
        let mut l1 = L1Tlb::new();
        let mut mem = [0u8; 0x4000];
        l1.use_memory(mem.as_mut_ptr(), 0x4000);
        l1.fill(0, 0x7000_1234, Hpa(0x2abc), 5, 9);
        l1.fill(3, 0x7000_1234, Hpa(0x5abc), 5, 9);
        assert_eq!(l1.lookup(0, 0x7000_1ff0, 5, 9), Some(Hpa(0x2ff0)));
        // Inside memory: the translated-code view is filled.
        let s = l1.slots[0][(0x70001 + 1) & (SLOTS - 1)];
        assert_eq!(s.jit_page, 0x70001);
        assert_eq!(
            s.host_delta.wrapping_add(0x7000_1ff0),
            mem.as_ptr() as u64 + 0x2ff0
        );
        // Outside memory: only the interpreter's view.
        assert_eq!(l1.slots[3][(0x70001 + 1) & (SLOTS - 1)].jit_page, u64::MAX);
        assert_eq!(l1.lookup(3, 0x7000_1000, 5, 9), Some(Hpa(0x5000)));
        l1.sync(6, 9);
        assert!(l1
            .slots
            .iter()
            .flatten()
            .all(|s| s.page == 0 && s.jit_page == u64::MAX));
        assert_eq!(l1.lookup(0, 0x7000_1ff0, 6, 9), None);
        l1.fill(0, 0x7000_1234, Hpa(0x2abc), 6, 9);
        assert_eq!(l1.lookup(0, 0x7000_1ff0, 6, 10), None);
        // Another memory: the host view is remade.
        l1.fill(0, 0x7000_1234, Hpa(0x2abc), 6, 10);
        let mut other = [0u8; 0x1000];
        l1.use_memory(other.as_mut_ptr(), 0x1000);
        assert_eq!(l1.lookup(0, 0x7000_1ff0, 6, 10), None);
    }
}
