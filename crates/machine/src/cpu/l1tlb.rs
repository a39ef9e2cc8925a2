//! The first-level TLB: a small direct-mapped cache of the last
//! translations per access kind, in front of the set-associative
//! [`crate::mmu::tlb::Tlb`] (as the L1 iTLB/dTLB sit in front of the STLB on
//! a real core).
//!
//! It is inclusive and never more permissive than the TLB behind it: a slot
//! is good while the TLB entry it was filled from is in the TLB and the
//! lookup-key context ([`KeyContext`]: CR0, CR4, EFER, RFLAGS.AC while
//! CR4.SMAP is on, the VPID, the EPTP and the PCID) is the one it was filled under.
//! So it loses:
//! - the slots of a page whose 4 KiB entry leaves the TLB (evicted by a
//!   fill, replaced, or invalidated alone: INVLPG);
//! - all its slots when more leaves the TLB (a flush, a CR3 load that
//!   drops non-global entries, INVLPG of a larger page) or the key context
//!   changes (a CR3 load to another PCID among them), except:
//! - when only RFLAGS.AC changes under CR4.SMAP (STAC, CLAC, POPF, IRET,
//!   SYSCALL's FMASK, an interrupt), the supervisor data slots of
//!   user-mode pages if AC cleared, and nothing if it set. SMAP is a
//!   permission check on each access (SDM Vol. 3A 4.6: a supervisor-mode
//!   data access to a user-mode page is allowed only while AC is set), not
//!   a flush; AC does not bear on fetches nor on user-mode accesses. The
//!   supervisor data slots holding a user-mode page are a bitmap per class
//!   (`Book::user_pages`), set from the TLB entry's U flag by both fills.
//!
//! A fill into a free way, a privilege change (the slots are per privilege
//! class), a CR3 load that finds no non-global entry, SWAPGS, RDTSC,
//! STAC/CLAC without SMAP and STAC with it leave it as it was, as they
//! leave a hardware L1 TLB. (SWAPGS, RDTSC, and SYSCALL/SYSRET without SMAP do not even move
//! the mode epoch: `Cpu::system_moves_mode`.) Hits here do not update
//! the replacement state of the TLB, exactly as L1 hits do not reach the
//! STLB on hardware. (Until session 13 it was emptied on every TLB fill
//! and every mode move: a different, coarser model with other virtual
//! times; see docs/machine.md.)
//!
//! Emptying is eager: [`L1Tlb::in_sync`] compares the TLB's removal count
//! (`mmu::tlb::Removals`) and the CPU's mode epoch with the ones the slots
//! were last synced to and, when either moved, [`L1Tlb::resync`] drops what
//! must go (one page's slots, or the slots filled since the last clear: a
//! short list, so the cost is that of the fills). A valid slot is simply
//! one whose page matches. That is what lets translated code probe a slot
//! with a single compare: the CPU syncs before generated code runs and
//! after every call-out from it, the only places the two can move, and
//! before every lookup and fill of its own (`Cpu::sync_l1`).
//!
//! The TLB lookup keys cached per class (see [`Book`]) depend on the same
//! context: they are dropped with the slots when it changes; an AC change
//! under SMAP drops only the supervisor data classes' (the others do not
//! read AC: `mmu::tlb::permit_masks`).

use crate::addr::Hpa;
use crate::mmu::tlb::{LookupKey, Removals, PAGE_NUMBER_BITS};
use crate::mmu::AccessKind;

pub(crate) const SLOTS: usize = 64;
/// The slot index (in every class) of linear address `la`'s page: its
/// page number + 1, direct-mapped (translated code computes the same).
#[inline(always)]
pub(crate) const fn slot_index(la: u64) -> usize {
    ((la >> 12) as usize + 1) & (SLOTS - 1)
}

/// Size of one slot (see [`Slot`]).
pub(crate) const SLOT_BYTES: usize = 32;
const _: () = assert!(std::mem::size_of::<Slot>() == SLOT_BYTES);
/// Access-kind classes: (read, write, execute) x (supervisor, user).
pub(crate) const CLASSES: usize = 6;
/// Byte offsets in a [`Slot`] that translated code reads.
pub(crate) const SLOT_PAGE: usize = 0;
pub(crate) const SLOT_JIT_PAGE: usize = 16;
pub(crate) const SLOT_HOST_DELTA: usize = 24;
pub(crate) const SLOT_HPA: usize = 8;
const _: () = assert!(std::mem::offset_of!(Slot, page) == SLOT_PAGE);
const _: () = assert!(std::mem::offset_of!(Slot, jit_page) == SLOT_JIT_PAGE);
const _: () = assert!(std::mem::offset_of!(Slot, host_delta) == SLOT_HOST_DELTA);
const _: () = assert!(std::mem::offset_of!(Slot, hpa) == SLOT_HPA);

/// `repr(C)`: translated code reads slots inline (`jit`), at
/// [`SLOT_BYTES`] per slot, [`SLOTS`] slots per class.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct Slot {
    /// Linear page number + 1 (0 = empty).
    pub(crate) page: u64,
    /// Host-physical page base.
    hpa: u64,
    /// The linear page number (without the + 1) when the frame lies
    /// inside the memory the slot was filled for (translated code may then
    /// access it through `host_delta`), else `u64::MAX`, which no page
    /// number equals. Also `u64::MAX` in a write slot whose frame holds
    /// decoded code ([`L1Tlb::fill`], [`L1Tlb::keep_stores_off_code`]):
    /// translated stores take their slow path there, which invalidates the
    /// code.
    pub(crate) jit_page: u64,
    /// Host address of the page minus its linear address (wrapping): the
    /// host address of a byte is its linear address plus this.
    host_delta: u64,
}

impl Slot {
    /// (Translated code's CLAC empties slots too: `jit::forms`.)
    pub(crate) const EMPTY: Slot = Slot {
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
    /// The TLB's removal count and the CPU's mode epoch last synced to.
    removals: u64,
    mode_epoch: u64,
    /// The memory (host base, size) the slots' `jit_page`/`host_delta`
    /// were computed for.
    memory: (usize, u64),
    /// What the cached lookup keys were computed under (`None`: none yet),
    /// but for `rflags_ac`, which is `Book::smap_ac` (see
    /// [`Self::keys_for`]).
    keys_for: Option<KeyContext>,
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
    /// registers, RFLAGS.AC under SMAP, VPID, EPTP), so it is dropped when
    /// that context changes (only the supervisor data classes' when AC
    /// alone does). Translated code's first-level fill reads the data classes'
    /// (the first [`DATA_CLASSES`]); the interpreter's misses and fetches
    /// use all.
    keys: [KeySlot; CLASSES],
    /// Per class, bit i: slot i is in `filled`.
    listed: [u64; CLASSES],
    /// Per class, bit i: slot i holds a user-mode page (the TLB entry's
    /// guest U flag); kept for the supervisor data classes only
    /// ([`SUPERVISOR_DATA_CLASSES`], 0 in the others) and while `smap_ac`
    /// (all 0 otherwise), a subset of `listed`. Those are the slots SMAP
    /// revokes when RFLAGS.AC clears.
    user_pages: [u64; CLASSES],
    /// Non-zero while the key context has RFLAGS.AC set under CR4.SMAP
    /// (`KeyContext::rflags_ac`): only then can a supervisor data slot
    /// that AC's clearing revokes be filled, so only then are fills noted
    /// in `user_pages` (they cost a TLB look, the Rust fill's).
    smap_ac: u64,
    /// How many of `filled` are in use.
    filled_len: u64,
    /// Slots filled since the last clear (class * SLOTS + index), each once
    /// (so `filled_len` never passes its length).
    filled: [u16; SLOTS * CLASSES],
    /// Per fetch class (supervisor, user) and slot: a number that changes
    /// whenever what the slot holds may have changed (a fill, a clear, a
    /// page dropped) and when code in memory was written
    /// ([`L1Tlb::renew_fetch_versions`]), never to a number it had before.
    /// A chaining-table entry that an exit checked in full against the
    /// slot records it (`ChainEntry::version`): while both are unchanged
    /// the full check would pass again (`jit::chain`).
    fetch_versions: [[u64; SLOTS]; 2],
    /// The last number given out to `fetch_versions` (they start at 0,
    /// which no entry records).
    last_version: u64,
}

/// Everything a TLB lookup key (`mmu::tlb::LookupKey::new`) is computed
/// from besides the access: the paging controls it reads (CR0, CR4, EFER;
/// not CR3, which the key does not depend on), RFLAGS.AC while CR4.SMAP is
/// on (false otherwise: the key reads AC only for SMAP), the VPID and the
/// EPTP. Compared, not hashed: equal contexts give equal keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyContext {
    pub cr0: u64,
    pub cr4: u64,
    pub efer: u64,
    pub rflags_ac: bool,
    pub vpid: u16,
    pub eptp: Option<u64>,
    /// CR3's PCID while CR4.PCIDE is on (the keys carry it), else 0.
    pub pcid: u64,
}

/// The write classes (supervisor, user): a class is access kind * 2 +
/// user.
pub(crate) const WRITE_CLASSES: [usize; 2] = [
    AccessKind::Write as usize * 2,
    AccessKind::Write as usize * 2 + 1,
];

/// The data-access classes (read and write, supervisor and user): the
/// ones translated code's first-level fill serves.
pub(crate) const DATA_CLASSES: usize = 4;

/// The supervisor data-access classes (a class is access kind * 2 +
/// user): the only ones whose rights RFLAGS.AC changes (SMAP).
pub(crate) const SUPERVISOR_DATA_CLASSES: [usize; 2] = [
    AccessKind::Read as usize * 2,
    AccessKind::Write as usize * 2,
];

/// Whether class `class` is a supervisor data class (its slots' user-mode
/// pages are noted, `Book::user_pages`).
#[inline(always)]
pub(crate) fn is_supervisor_data(class: usize) -> bool {
    class < DATA_CLASSES && class % 2 == 0
}
const _: () =
    assert!(SUPERVISOR_DATA_CLASSES[0] < DATA_CLASSES && SUPERVISOR_DATA_CLASSES[0] % 2 == 0);
const _: () =
    assert!(SUPERVISOR_DATA_CLASSES[1] < DATA_CLASSES && SUPERVISOR_DATA_CLASSES[1] % 2 == 0);

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
    pub const USER_PAGES: i32 = LISTED + 8 * CLASSES as i32;
    pub const SMAP_AC: i32 = USER_PAGES + 8 * CLASSES as i32;
    pub const FILLED_LEN: i32 = SMAP_AC + 8;
    pub const FILLED: i32 = FILLED_LEN + 8;
    pub const FETCH_VERSIONS: i32 = std::mem::offset_of!(Book, fetch_versions) as i32;
    pub const LAST_VERSION: i32 = std::mem::offset_of!(Book, last_version) as i32;
    /// Entries in `filled`.
    pub const FILLED_CAPACITY: u32 = (SLOTS * CLASSES) as u32;
    const _: () = assert!(size_of::<KeySlot>() == KEY_SLOT_BYTES as usize);
    const _: () = assert!(offset_of!(KeySlot, valid) == KEY_SLOT_VALID as usize);
    const _: () = assert!(offset_of!(KeySlot, key) == KEY_SLOT_KEY as usize);
    const _: () = assert!(offset_of!(Book, keys) == KEYS as usize);
    const _: () = assert!(offset_of!(Book, listed) == LISTED as usize);
    const _: () = assert!(offset_of!(Book, user_pages) == USER_PAGES as usize);
    const _: () = assert!(offset_of!(Book, smap_ac) == SMAP_AC as usize);
    const _: () = assert!(offset_of!(Book, filled_len) == FILLED_LEN as usize);
    const _: () = assert!(offset_of!(Book, filled) == FILLED as usize);
    // `listed` and `user_pages` are one u64 bitmap per class.
    const _: () = assert!(SLOTS == 64);
}

impl Book {
    /// A new number for the slot at `index` of `class` if that is a
    /// fetch class (see `fetch_versions`).
    #[inline(always)]
    fn new_fetch_version(&mut self, class: usize, index: usize) {
        if let Some(v) = class
            .checked_sub(DATA_CLASSES)
            .and_then(|c| self.fetch_versions.get_mut(c))
            .and_then(|c| c.get_mut(index))
        {
            self.last_version += 1;
            *v = self.last_version;
        }
    }
}

impl L1Tlb {
    /// Keeps translated code's stores out of frames holding decoded code:
    /// the write slots whose frame `is_code` says holds code get no
    /// translated-code view (their `jit_page`), so the probe of a store
    /// there misses and the store takes the slow path. Called when frames
    /// may have come to hold code since the slots were filled; fills check
    /// their own frame ([`Self::fill`], the fill thunk).
    pub(crate) fn keep_stores_off_code(&mut self, is_code: impl Fn(Hpa) -> bool) {
        for class in WRITE_CLASSES {
            for s in self.slots[class].iter_mut() {
                if s.jit_page != u64::MAX && is_code(Hpa(s.hpa)) {
                    s.jit_page = u64::MAX;
                }
            }
        }
    }

    /// New numbers for every fetch slot: code in memory was written, so no
    /// chaining check made before still holds (`fetch_versions`).
    pub(crate) fn renew_fetch_versions(&mut self) {
        for class in DATA_CLASSES..CLASSES {
            for index in 0..SLOTS {
                self.book.new_fetch_version(class, index);
            }
        }
    }

    pub(crate) fn new() -> Self {
        L1Tlb {
            slots: Box::new([[Slot::EMPTY; SLOTS]; CLASSES]),
            removals: 0,
            mode_epoch: 0,
            memory: (0, 0),
            keys_for: None,
            book: Box::new(Book {
                keys: [KeySlot::NONE; CLASSES],
                listed: [0; CLASSES],
                user_pages: [0; CLASSES],
                smap_ac: 0,
                filled_len: 0,
                filled: [0; SLOTS * CLASSES],
                fetch_versions: [[0; SLOTS]; 2],
                last_version: 0,
            }),
        }
    }

    /// Empties the slots filled since the last clear. Only what the
    /// probes compare is reset (`page` for the interpreter and the fill,
    /// `jit_page` for translated code): the rest of an empty slot is never
    /// read.
    fn clear(&mut self) {
        let book = &mut *self.book;
        let len = (book.filled_len as usize).min(book.filled.len());
        let slots = self.slots.as_flattened_mut();
        for k in 0..len {
            // `filled` holds class * SLOTS + index: the flat slot index.
            let i = book.filled[k] as usize;
            if let Some(s) = slots.get_mut(i) {
                s.page = Slot::EMPTY.page;
                s.jit_page = Slot::EMPTY.jit_page;
            }
            book.new_fetch_version(i / SLOTS, i % SLOTS);
        }
        book.filled_len = 0;
        book.listed = [0; CLASSES];
        book.user_pages = [0; CLASSES];
    }

    /// Whether the slots are in sync with the TLB's removal count and
    /// the mode epoch (if not, [`Self::resync`] before any probe or fill).
    #[inline(always)]
    pub(crate) fn in_sync(&self, removals: u64, mode_epoch: u64) -> bool {
        removals == self.removals && mode_epoch == self.mode_epoch
    }

    /// Whether the mode epoch is the one the slots were filled under.
    #[inline(always)]
    pub(crate) fn mode_in_sync(&self, mode_epoch: u64) -> bool {
        mode_epoch == self.mode_epoch
    }

    /// Brings the slots up to the TLB's `removals` and the mode epoch
    /// (they are out of sync, [`Self::in_sync`]). `context` is the current
    /// [`KeyContext`], given when the mode epoch moved: under another
    /// context than the slots', the slots and the cached lookup keys go,
    /// except when only RFLAGS.AC differs ([`Self::smap_ac_changed`]).
    /// Then, if entries left the TLB: one 4 KiB page since the last sync
    /// drops that page's slots, anything else all of them.
    #[inline]
    pub(crate) fn resync(
        &mut self,
        removals: Removals,
        mode_epoch: u64,
        context: Option<KeyContext>,
    ) {
        if mode_epoch != self.mode_epoch {
            match (context, self.keys_for()) {
                (Some(now), Some(was)) if now == was => {}
                (Some(now), Some(was))
                    if now
                        == (KeyContext {
                            rflags_ac: now.rflags_ac,
                            ..was
                        }) =>
                {
                    self.smap_ac_changed(now.rflags_ac);
                    self.keys_for = context;
                }
                _ => {
                    self.book.keys = [KeySlot::NONE; CLASSES];
                    self.keys_for = context;
                    self.clear();
                }
            }
            self.book.smap_ac = u64::from(context.is_some_and(|c| c.rflags_ac));
        }
        if removals.count != self.removals {
            match removals.last_page {
                Some(vpn) if removals.count == self.removals.wrapping_add(1) => self.drop_page(vpn),
                _ => self.clear(),
            }
        }
        self.removals = removals.count;
        self.mode_epoch = mode_epoch;
    }

    /// The context the cached lookup keys were computed under. Its
    /// RFLAGS.AC is `Book::smap_ac`: translated code's STAC and CLAC
    /// change it there, doing what [`Self::smap_ac_changed`] does
    /// (`jit::forms`), without a resync.
    fn keys_for(&self) -> Option<KeyContext> {
        self.keys_for.map(|c| KeyContext {
            rflags_ac: self.book.smap_ac != 0,
            ..c
        })
    }

    /// Whether fills are noted in `Book::user_pages` now (`Book::smap_ac`):
    /// the caller of [`Self::fill`] finds out whether a supervisor data
    /// fill maps a user-mode page only then, and notes it
    /// ([`Self::note_user_page`]).
    #[inline(always)]
    pub(crate) fn notes_user_pages(&self) -> bool {
        self.book.smap_ac != 0
    }

    /// RFLAGS.AC changed under CR4.SMAP, and nothing else of the key
    /// context. SMAP is a check made on each access (SDM Vol. 3A 4.6): a
    /// supervisor-mode data access to a user-mode page is allowed only
    /// while AC is set; AC does not bear on instruction fetches nor on
    /// user-mode accesses, and no TLB is flushed. So the slots stay but
    /// for the supervisor data slots of user-mode pages when AC clears
    /// (those accesses are SMAP violations now); the supervisor data
    /// classes' lookup keys, which forbid user-mode pages only while AC is
    /// clear, are made again.
    fn smap_ac_changed(&mut self, ac: bool) {
        for class in SUPERVISOR_DATA_CLASSES {
            self.book.keys[class] = KeySlot::NONE;
            if !ac {
                let mut revoked = std::mem::take(&mut self.book.user_pages[class]);
                while revoked != 0 {
                    let s = &mut self.slots[class][revoked.trailing_zeros() as usize];
                    s.page = Slot::EMPTY.page;
                    s.jit_page = Slot::EMPTY.jit_page;
                    revoked &= revoked - 1;
                }
            }
        }
    }

    /// Empties the slots of linear 4 KiB page number `vpn` (its low 36
    /// bits, as the TLB tags it), in every class.
    fn drop_page(&mut self, vpn: u64) {
        // The index reads only the page number's low bits: the 36-bit
        // tag gives the full address's slot.
        let index = slot_index(vpn << 12);
        for class in DATA_CLASSES..CLASSES {
            self.book.new_fetch_version(class, index);
        }
        for class in self.slots.iter_mut() {
            let s = &mut class[index];
            if s.page != 0 && s.page.wrapping_sub(1) & PAGE_NUMBER_BITS == vpn {
                s.page = Slot::EMPTY.page;
                s.jit_page = Slot::EMPTY.jit_page;
            }
        }
    }

    /// [`Self::resync`] if out of sync, with the key context computed only
    /// when the mode epoch moved (for tests and rare paths; the CPU's own
    /// is `Cpu::sync_l1`).
    #[cfg(test)]
    fn sync(&mut self, removals: Removals, mode_epoch: u64, keys_for: impl FnOnce() -> KeyContext) {
        if !self.in_sync(removals.count, mode_epoch) {
            let ctx = (!self.mode_in_sync(mode_epoch)).then(keys_for);
            self.resync(removals, mode_epoch, ctx);
        }
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

    /// The host-physical address of `la`, if cached for this kind. The
    /// slots must be synced.
    #[inline(always)]
    pub(crate) fn lookup(&self, class: usize, la: u64) -> Option<Hpa> {
        let page = (la >> 12) + 1;
        let s = &self.slots[class][slot_index(la)];
        (s.page == page).then_some(Hpa(s.hpa | (la & 0xfff)))
    }

    /// Whether [`Self::lookup`] hits. The slots must be synced.
    #[inline]
    pub(crate) fn peek(&self, class: usize, la: u64) -> bool {
        let page = (la >> 12) + 1;
        self.slots[class][slot_index(la)].page == page
    }

    /// The cached TLB lookup key of class `class` (see `keys`). The slots
    /// must be synced.
    #[inline]
    pub(crate) fn key(&self, class: usize) -> Option<&LookupKey> {
        self.book
            .keys
            .get(class)
            .filter(|k| k.valid != 0)
            .map(|k| &k.key)
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
        let s = &self.slots[class][slot_index(la)];
        (s.jit_page == la.wrapping_add(bytes - 1) >> 12).then_some(Hpa(s.hpa))
    }

    /// Whether the bookkeeping matches the slots (for tests): `filled`
    /// lists each slot once, exactly the slots `listed` marks, every
    /// non-empty slot among them; `user_pages` marks listed slots of the
    /// supervisor data classes only, and only while `smap_ac`.
    #[cfg(test)]
    pub(crate) fn consistent(&self) -> bool {
        let book = &*self.book;
        let Some(filled) = book.filled.get(..book.filled_len as usize) else {
            return false;
        };
        let mut listed = [0u64; CLASSES];
        for &i in filled {
            let (class, index) = (i as usize / SLOTS, i as usize % SLOTS);
            if class >= CLASSES || listed[class] & (1 << index) != 0 {
                return false;
            }
            listed[class] |= 1 << index;
        }
        listed == book.listed
            && (0..CLASSES).all(|class| {
                let nonempty = (0..SLOTS)
                    .filter(|&i| self.slots[class][i].page != 0)
                    .fold(0u64, |b, i| b | 1 << i);
                let user_pages = book.user_pages[class];
                nonempty & !listed[class] == 0
                    && user_pages & !listed[class] == 0
                    && ((is_supervisor_data(class) && book.smap_ac != 0) || user_pages == 0)
            })
    }

    /// Notes whether the slot of `la` just filled in supervisor data class
    /// `class` holds a user-mode page (`Book::user_pages`), while
    /// [`Self::notes_user_pages`].
    #[inline]
    pub(crate) fn note_user_page(&mut self, class: usize, la: u64, user_page: bool) {
        debug_assert!(is_supervisor_data(class) && self.notes_user_pages());
        let index = slot_index(la);
        let bits = &mut self.book.user_pages[class];
        *bits = (*bits & !(1 << index)) | (u64::from(user_page) << index);
    }

    /// The slots of class `class` noted as holding a user-mode page (for
    /// tests).
    #[cfg(test)]
    pub(crate) fn user_pages(&self, class: usize) -> u64 {
        self.book.user_pages[class]
    }

    /// Records a translation the TLB just gave. The slots must be synced.
    /// The slot gets a translated-code view (`jit_page`) when its frame
    /// lies inside memory, but not a write slot whose frame `is_code` says
    /// holds decoded code (asked only then): translated stores take the
    /// slow path there, which invalidates the code (as
    /// [`Self::keep_stores_off_code`] makes it for slots filled before).
    /// While [`Self::notes_user_pages`], a supervisor data fill is then
    /// noted ([`Self::note_user_page`]).
    #[inline(always)]
    pub(crate) fn fill(
        &mut self,
        class: usize,
        la: u64,
        hpa: Hpa,
        is_code: impl FnOnce(Hpa) -> bool,
    ) {
        let page = (la >> 12) + 1;
        let index = slot_index(la);
        let hpa_page = hpa.0 & !0xfff;
        let (base, size) = self.memory;
        let inside = base != 0 && hpa_page < size;
        let viewed = inside && !(WRITE_CLASSES.contains(&class) && is_code(Hpa(hpa_page)));
        self.slots[class][index] = Slot {
            page,
            hpa: hpa_page,
            jit_page: if viewed { la >> 12 } else { u64::MAX },
            host_delta: (base as u64)
                .wrapping_add(hpa_page)
                .wrapping_sub(la & !0xfff),
        };
        let book = &mut *self.book;
        book.new_fetch_version(class, index);
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

    const CTX: KeyContext = KeyContext {
        cr0: 0x8000_0011,
        cr4: 0x20,
        efer: 0x500,
        rflags_ac: false,
        vpid: 1,
        eptp: None,
        pcid: 0,
    };

    /// `count` removals from the TLB, the last not of one 4 KiB page.
    fn r(count: u64) -> Removals {
        Removals {
            count,
            last_page: None,
        }
    }

    /// Syncs under `ctx`, then fills and looks up as the CPU does.
    fn fill(l1: &mut L1Tlb, class: usize, la: u64, hpa: Hpa, tlb: u64, mode: u64) {
        l1.sync(r(tlb), mode, || CTX);
        l1.fill(class, la, hpa, |_| false);
        assert!(l1.consistent());
    }
    fn lookup(l1: &mut L1Tlb, class: usize, la: u64, tlb: u64, mode: u64) -> Option<Hpa> {
        l1.sync(r(tlb), mode, || CTX);
        l1.lookup(class, la)
    }

    #[test]
    fn slots_empty_when_entries_leave_or_the_context_changes_and_only_then() {
        let mut l1 = L1Tlb::new();
        let mut mem = [0u8; 0x4000];
        l1.use_memory(mem.as_mut_ptr(), 0x4000);
        fill(&mut l1, 0, 0x7000_1234, Hpa(0x2abc), 5, 9);
        fill(&mut l1, 3, 0x7000_1234, Hpa(0x5abc), 5, 9);
        assert_eq!(lookup(&mut l1, 0, 0x7000_1ff0, 5, 9), Some(Hpa(0x2ff0)));
        // Inside memory: the translated-code view is filled.
        let s = l1.slots[0][slot_index(0x7000_1000)];
        assert_eq!(s.jit_page, 0x70001);
        assert_eq!(
            s.host_delta.wrapping_add(0x7000_1ff0),
            mem.as_ptr() as u64 + 0x2ff0
        );
        assert_eq!(l1.jit_slot(0, 0x7000_1ff0, 16), Some(Hpa(0x2000)));
        // Outside memory: only the interpreter's view.
        assert_eq!(l1.slots[3][slot_index(0x7000_1000)].jit_page, u64::MAX);
        assert_eq!(l1.jit_slot(3, 0x7000_1000, 1), None);
        assert_eq!(lookup(&mut l1, 3, 0x7000_1000, 5, 9), Some(Hpa(0x5000)));
        l1.sync(r(6), 9, || CTX);
        assert!(l1
            .slots
            .iter()
            .flatten()
            .all(|s| s.page == 0 && s.jit_page == u64::MAX));
        assert_eq!(l1.jit_slot(0, 0x7000_1ff0, 16), None);
        assert_eq!(lookup(&mut l1, 0, 0x7000_1ff0, 6, 9), None);
        fill(&mut l1, 0, 0x7000_1234, Hpa(0x2abc), 6, 9);
        // A mode move under the same key context (a privilege change, a
        // CR3 load that removed nothing, SWAPGS) keeps the slots ...
        assert_eq!(lookup(&mut l1, 0, 0x7000_1ff0, 6, 10), Some(Hpa(0x2ff0)));
        // ... one under another context empties them.
        l1.sync(r(6), 11, || KeyContext { cr4: 0, ..CTX });
        assert_eq!(l1.lookup(0, 0x7000_1ff0), None);
        l1.sync(r(6), 12, || CTX);
        assert_eq!(lookup(&mut l1, 0, 0x7000_1ff0, 6, 12), None);
        // Another memory: the host view is remade.
        fill(&mut l1, 0, 0x7000_1234, Hpa(0x2abc), 6, 10);
        let mut other = [0u8; 0x1000];
        l1.use_memory(other.as_mut_ptr(), 0x1000);
        assert_eq!(lookup(&mut l1, 0, 0x7000_1ff0, 6, 10), None);
    }

    /// A fill gives no translated-code view to a write slot whose frame
    /// holds decoded code, and asks whether it does only for a write slot
    /// inside memory; other slots of the frame keep their view.
    #[test]
    fn a_write_fill_of_a_code_frame_gets_no_translated_view() {
        let mut l1 = L1Tlb::new();
        let mut mem = [0u8; 0x4000];
        l1.use_memory(mem.as_mut_ptr(), 0x4000);
        l1.sync(r(1), 1, || CTX);
        let code = Hpa(0x3000);
        let asked = std::cell::Cell::new(0);
        let is_code = |frame: Hpa| {
            asked.set(asked.get() + 1);
            frame == code
        };
        let la = 0x7000_1234;
        for class in 0..CLASSES {
            let write = WRITE_CLASSES.contains(&class);
            asked.set(0);
            l1.fill(class, la, Hpa(0x3abc), is_code);
            assert_eq!(asked.get(), usize::from(write), "{class}");
            assert_eq!(l1.jit_slot(class, la, 1).is_none(), write, "{class}");
            assert_eq!(l1.lookup(class, la), Some(Hpa(0x3234)), "{class}");
            l1.fill(class, la, Hpa(0x2abc), is_code);
            assert_eq!(l1.jit_slot(class, la, 1), Some(Hpa(0x2000)), "{class}");
            // Outside memory there is no view to withhold.
            asked.set(0);
            l1.fill(class, la, Hpa(0x5abc), is_code);
            assert_eq!(asked.get(), 0, "{class}");
        }
        assert!(l1.consistent());
    }

    /// One 4 KiB page's removal since the last sync drops that page's
    /// slots in every class and nothing else; two removals, or one of a
    /// larger page, empty all.
    #[test]
    fn a_page_removal_drops_that_page_only() {
        let mut l1 = L1Tlb::new();
        let mut mem = [0u8; 0x4000];
        l1.use_memory(mem.as_mut_ptr(), 0x4000);
        // Two pages in one slot index apart (SLOTS pages), a kernel-half
        // page (sign-extended: the TLB tags its low 36 bits), a neighbour.
        let high = 0xffff_8000_0012_3000u64;
        let pages = [
            0x7000_1000u64,
            0x7000_1000 + (SLOTS as u64) * 0x1000,
            high,
            0x7000_2000,
        ];
        let fill_all = |l1: &mut L1Tlb, count| {
            for class in 0..CLASSES {
                fill(l1, class, pages[class % 2 * 2], Hpa(0x1000), count, 1);
                fill(l1, class, pages[3], Hpa(0x2000), count, 1);
            }
        };
        fill_all(&mut l1, 1);
        let removed = |vpn: u64, count| Removals {
            count,
            last_page: Some(vpn),
        };
        // A page sharing page 0's slot but not held: nothing goes.
        l1.sync(removed((pages[1] >> 12) & PAGE_NUMBER_BITS, 2), 1, || CTX);
        assert!((0..CLASSES)
            .step_by(2)
            .all(|c| l1.lookup(c, pages[0]).is_some()));
        // Page 0 leaves: its slots go (classes 0, 2, 4 hold it), the rest stay.
        l1.sync(removed((pages[0] >> 12) & PAGE_NUMBER_BITS, 3), 1, || CTX);
        for class in 0..CLASSES {
            let holds_0 = class % 2 == 0;
            assert!(l1.lookup(class, pages[0]).is_none(), "{class}");
            assert_eq!(l1.lookup(class, pages[2]).is_some(), !holds_0, "{class}");
            assert_eq!(l1.lookup(class, pages[3]), Some(Hpa(0x2000)), "{class}");
        }
        // The kernel-half page, by its 36-bit tag.
        l1.sync(removed((high >> 12) & PAGE_NUMBER_BITS, 4), 1, || CTX);
        assert!((0..CLASSES).all(|c| l1.lookup(c, high).is_none()));
        assert!((0..CLASSES).all(|c| l1.lookup(c, pages[3]).is_some()));
        // Two removals since the last sync: all go, even with a page named.
        fill_all(&mut l1, 4);
        l1.sync(removed((pages[0] >> 12) & PAGE_NUMBER_BITS, 6), 1, || CTX);
        assert!(l1.slots.iter().flatten().all(|s| s.page == 0));
        // One removal of a larger page (no page named): all go.
        fill_all(&mut l1, 6);
        l1.sync(r(7), 1, || CTX);
        assert!(l1.slots.iter().flatten().all(|s| s.page == 0));
    }

    #[test]
    fn every_filled_slot_is_emptied_and_listed_once() {
        let mut l1 = L1Tlb::new();
        let mut mem = [0u8; 0x1000];
        l1.use_memory(mem.as_mut_ptr(), 0x1000);
        // All slots of all classes, some twice.
        for round in 0..2u64 {
            for class in 0..CLASSES {
                for page in 0..SLOTS as u64 {
                    let la = (page + round * SLOTS as u64) << 12;
                    fill(&mut l1, class, la, Hpa(0), 1, 1);
                }
            }
        }
        assert_eq!(l1.book.filled_len, (SLOTS * CLASSES) as u64);
        assert!(l1.slots.iter().flatten().all(|s| s.page != 0));
        l1.sync(r(2), 1, || CTX);
        assert_eq!(l1.book.filled_len, 0);
        assert_eq!(l1.book.listed, [0; CLASSES]);
        assert!(l1.consistent());
        assert!(l1
            .slots
            .iter()
            .flatten()
            .all(|s| s.page == 0 && s.jit_page == u64::MAX));
    }

    #[test]
    fn keys_survive_a_mode_move_only_under_the_same_context() {
        let mut l1 = L1Tlb::new();
        // Distinct keys (the cache stores, never interprets, them).
        let key = |vpid| {
            let access = crate::mmu::Access {
                kind: crate::mmu::AccessKind::Read,
                user: false,
            };
            LookupKey::new(vpid, &crate::mmu::PagingRegs::default(), None, access)
        };
        assert_ne!(key(7), key(8));
        l1.sync(r(1), 1, || CTX);
        l1.set_key(2, key(7));
        assert_eq!(l1.key(2), Some(&key(7)));
        // A TLB epoch move keeps them (the context is not even asked).
        l1.sync(r(2), 1, || unreachable!("the mode did not move"));
        assert_eq!(l1.key(2), Some(&key(7)));
        // A mode move under the same context keeps them.
        l1.sync(r(2), 2, || CTX);
        assert_eq!(l1.key(2), Some(&key(7)));
        // Under another one, they go.
        for other in [
            KeyContext { cr0: 0x11, ..CTX },
            KeyContext { cr4: 0, ..CTX },
            KeyContext { efer: 0, ..CTX },
            KeyContext {
                rflags_ac: true,
                ..CTX
            },
            KeyContext { vpid: 2, ..CTX },
            KeyContext {
                eptp: Some(0x1e),
                ..CTX
            },
            KeyContext { pcid: 3, ..CTX },
        ] {
            l1.sync(r(2), 2, || CTX);
            l1.set_key(2, key(7));
            let mode = l1.mode_epoch + 1;
            l1.sync(r(2), mode, || other);
            assert_eq!(l1.key(2), None, "{other:?}");
            // And the new context is the one the next keys are for.
            l1.set_key(2, key(8));
            l1.sync(r(2), mode + 1, || other);
            assert_eq!(l1.key(2), Some(&key(8)));
            l1.sync(r(2), mode + 2, || CTX);
        }
    }

    /// Under SMAP, an RFLAGS.AC change keeps every slot that stays
    /// permitted: all fetch and user slots, and the supervisor data slots
    /// but those of user-mode pages when AC clears. Only the supervisor
    /// data classes' keys are made again.
    #[test]
    fn an_ac_change_under_smap_drops_only_what_smap_revokes() {
        use crate::cpu::state::cr4;
        let mut l1 = L1Tlb::new();
        let mut mem = [0u8; 0x8000];
        l1.use_memory(mem.as_mut_ptr(), 0x8000);
        let ac_set = KeyContext {
            cr4: CTX.cr4 | cr4::SMAP,
            rflags_ac: true,
            ..CTX
        };
        let ac_clear = KeyContext {
            rflags_ac: false,
            ..ac_set
        };
        let (user_page, kernel_page) = (0x7000_1000u64, 0xffff_8000_0000_2000u64);
        let key = |n: u16| {
            let access = crate::mmu::Access {
                kind: crate::mmu::AccessKind::Read,
                user: false,
            };
            LookupKey::new(n, &crate::mmu::PagingRegs::default(), None, access)
        };
        let mut mode = 1;
        l1.sync(r(1), mode, || ac_set);
        assert!(l1.notes_user_pages());
        // Each class holds the user page and the kernel page (the user
        // classes too: no rights are checked here), the supervisor data
        // slots of the user page noted as such.
        for class in 0..CLASSES {
            l1.fill(class, user_page, Hpa(0x1000), |_| false);
            l1.fill(class, kernel_page, Hpa(0x2000), |_| false);
            if is_supervisor_data(class) {
                l1.note_user_page(class, user_page, true);
                l1.note_user_page(class, kernel_page, false);
            }
            l1.set_key(class, key(class as u16));
        }
        assert!(l1.consistent());
        let all = |l1: &L1Tlb, la| (0..CLASSES).all(|c| l1.lookup(c, la).is_some());
        // AC clears: the supervisor data slots of the user page go, with
        // the supervisor data keys; nothing else.
        mode += 1;
        l1.sync(r(1), mode, || ac_clear);
        assert!(l1.consistent() && !l1.notes_user_pages());
        for class in 0..CLASSES {
            let revoked = SUPERVISOR_DATA_CLASSES.contains(&class);
            assert_eq!(l1.lookup(class, user_page).is_none(), revoked, "{class}");
            assert_eq!(l1.jit_slot(class, user_page, 1).is_none(), revoked);
            assert_eq!(l1.key(class).is_none(), revoked, "{class}");
        }
        assert!(all(&l1, kernel_page));
        assert_eq!(l1.book.user_pages, [0; CLASSES]);
        // AC sets again: nothing is revoked, the supervisor data keys are
        // made again.
        for class in SUPERVISOR_DATA_CLASSES {
            l1.set_key(class, key(9));
        }
        mode += 1;
        l1.sync(r(1), mode, || ac_set);
        assert!(all(&l1, kernel_page));
        assert!((0..CLASSES).all(|c| l1.key(c).is_none() == SUPERVISOR_DATA_CLASSES.contains(&c)));
        for class in SUPERVISOR_DATA_CLASSES {
            l1.fill(class, user_page, Hpa(0x1000), |_| false);
            l1.note_user_page(class, user_page, true);
        }
        assert!(all(&l1, user_page));
        // A kernel page refilled over a user page's slot is not revoked.
        let same_slot = user_page + (SLOTS as u64) * 0x1000;
        l1.fill(2, user_page, Hpa(0x1000), |_| false);
        l1.note_user_page(2, user_page, true);
        l1.fill(2, same_slot, Hpa(0x3000), |_| false);
        l1.note_user_page(2, same_slot, false);
        mode += 1;
        l1.sync(r(1), mode, || ac_clear);
        assert!(l1.lookup(2, same_slot).is_some());
        assert!(l1.consistent());
        // Any other change of the context, with or without AC's, empties all.
        mode += 1;
        l1.sync(r(1), mode, || KeyContext {
            rflags_ac: true,
            pcid: 1,
            ..ac_clear
        });
        assert!(l1.slots.iter().flatten().all(|s| s.page == 0));
        assert!((0..CLASSES).all(|c| l1.key(c).is_none()));
    }

    /// [`KeyContext`] leaves CR3 out: keys must not depend on it.
    #[test]
    fn lookup_keys_do_not_depend_on_cr3() {
        use crate::mmu::{Access, AccessKind, PagingRegs};
        let regs = PagingRegs {
            cr0: 0x8001_0011,
            cr3: 0x1000,
            cr4: 0x30_0020,
            efer: 0xd01,
            rflags_ac: false,
        };
        for kind in [AccessKind::Read, AccessKind::Write, AccessKind::Execute] {
            for user in [false, true] {
                let access = Access { kind, user };
                let key = LookupKey::new(3, &regs, None, access);
                for cr3 in [0, 0x2000, 0x7fff_f000 | 0x18, u64::MAX] {
                    let other = PagingRegs { cr3, ..regs };
                    assert_eq!(LookupKey::new(3, &other, None, access), key);
                }
            }
        }
    }
}
