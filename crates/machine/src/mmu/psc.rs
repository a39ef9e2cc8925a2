//! Paging-structure caches (Intel SDM Vol. 3A 4.10.3) and cached
//! guest-physical mappings (Vol. 3C 29.4.1).
//!
//! Two caches sit beside the TLB, as in hardware:
//! - the **PML4E, PDPTE and PDE caches**: for the upper bits of a linear
//!   address, the guest-physical address of the next paging structure and
//!   the R/W, U/S and XD rights combined over the levels above it, so a
//!   walk can start at the PDPT, the PD or the PT. Tagged by VPID (not by
//!   PCID), and, as the combined mappings they feed, by EPTP; they
//!   are also tagged with CR3 and EFER.NXE, which is never wrong (a narrower
//!   match only misses).
//! - **guest-physical mappings**: the EPT translation of a 4 KiB
//!   guest-physical page (host page, R/W/X, EPT page size, whether the EPT
//!   dirty flag is set), tagged by EPTP. The guest walk uses them for every
//!   paging-structure reference and for the final guest-physical address.
//!
//! Entries are made only from walks that succeeded (so every entry cached
//! has its accessed flag set, as the SDM requires, and a non-present entry
//! is never cached). They are used until invalidated by the events the SDM
//! names, even if memory changed meanwhile: a stale entry is what hardware
//! may use too. Invalidation (through the [`Tlb`](super::tlb::Tlb) methods,
//! which every architectural event already calls):
//! - MOV to CR3 (but one that keeps its PCID's translations), INVLPG
//!   (whatever the address: SDM 4.10.4.1), CR0/CR4
//!   paging-bit and EFER changes, VPID flushes and every INVVPID: all PSC
//!   entries of the VPID;
//! - INVEPT: the PSC entries made under that EP4TA (all made under EPT for
//!   the global type) and the guest-physical mappings of that EP4TA (all);
//! - a full flush (snapshot restore): everything.
//!
//! INVPCID invalidates as INVLPG (type 0), a CR3 load (types 1 and 3) or
//! a CR4.PGE toggle (type 2) does, whatever the PCID. A CR3 load with
//! CR4.PCIDE and bit 63 set invalidates nothing (the entries are tagged
//! with CR3, PCID included).
//!
//! A guest-physical mapping allows an access only as the walk would without
//! setting a flag: its rights must allow the kind, and it must have the
//! dirty flag recorded, even for a read (another CPU may have set the flag
//! since, and the TLB entry the access fills records it); otherwise the EPT
//! is walked from memory (which may fault, set flags, log to the PML) and
//! the mapping is refilled. A translation
//! that used a cached entry and then faults is dropped and walked again
//! from memory with no cache ([`super::translate`]), after the PSC entries
//! for the address are invalidated (SDM 4.10.4.1: a page fault invalidates
//! them; 29.4.3.1: an EPT violation or misconfiguration invalidates the
//! guest-physical mappings of the address): a fault always reflects memory
//! as it is.
//!
//! **Virtual time.** The caches do not change it: a walk charges the memory
//! references of the walk it replaces (each entry records how many the
//! levels it stands for took), so `page_walk_ref` cycles, the TLB and its
//! counters are identical with the caches on or off (size 0) for a guest
//! that invalidates as the SDM requires, and identical on both engines
//! always. What they save is host work. A guest that edits a paging
//! structure and does not invalidate can see the old entry, as on hardware.
//!
//! Replacement is deterministic: a free way, else round-robin per set.

use super::ept::{EptPerms, EptTranslation};
use super::paging::GuestPerms;
use super::{PageSize, TranslateCtx};
use crate::addr::{Gpa, Hpa};
use crate::cpu::state::efer;
use crate::vmx::{Eptp, InveptKind};

/// Sizes of the caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PscConfig {
    /// Entries of each of the PML4E, PDPTE and PDE caches (0 = off). Rounded
    /// up to a power of two sets of [`PscConfig::WAYS`] ways.
    pub entries: usize,
    /// Cached guest-physical mappings (0 = off), rounded the same way.
    pub gpa_entries: usize,
}

impl Default for PscConfig {
    /// Skylake's PDE cache has 32 entries. The guest-physical mappings
    /// cover 64 MiB of 4 KiB pages: they only save host work, and a
    /// workload that misses the TLB over a larger range than they cover
    /// walks the EPT in host code for every miss. `bm -m 64M` (a byte
    /// written to a random page of 64 MiB per iteration) takes 1,615 host
    /// instructions per iteration with 256 mappings and 1,262 with 16384
    /// (callgrind, `-n 2000000` less `-n 1000000`), with the same virtual
    /// times.
    fn default() -> Self {
        PscConfig {
            entries: 32,
            gpa_entries: 16384,
        }
    }
}

impl PscConfig {
    /// Associativity of every cache.
    pub const WAYS: usize = 4;
    /// Largest number of entries of one cache.
    pub const MAX_ENTRIES: usize = 1 << 16;
    /// Both caches off.
    pub const OFF: PscConfig = PscConfig {
        entries: 0,
        gpa_entries: 0,
    };
}

/// A small set-associative array with round-robin replacement.
#[derive(Debug, Clone)]
struct Sets<T> {
    slots: Vec<Option<T>>,
    /// Per set: the way the next replacement takes.
    next: Vec<u8>,
    set_mask: usize,
    /// Number of `Some` slots.
    used: usize,
    /// Bit `i % 64` of word `i / 64` set = slot `i` is `Some`, so that
    /// invalidation visits only the entries there are (host-side
    /// bookkeeping: a flush after a CR3 load finds a few entries in
    /// caches of many slots).
    occupied: Vec<u64>,
}

impl<T: Copy> Sets<T> {
    fn new(entries: usize) -> Self {
        if entries == 0 {
            return Sets {
                slots: Vec::new(),
                next: Vec::new(),
                set_mask: 0,
                used: 0,
                occupied: Vec::new(),
            };
        }
        let sets = entries
            .min(PscConfig::MAX_ENTRIES)
            .div_ceil(PscConfig::WAYS)
            .next_power_of_two();
        let slots = sets * PscConfig::WAYS;
        Sets {
            slots: vec![None; slots],
            next: vec![0; sets],
            set_mask: sets - 1,
            used: 0,
            occupied: vec![0; slots.div_ceil(64)],
        }
    }

    #[inline]
    fn enabled(&self) -> bool {
        !self.slots.is_empty()
    }

    /// The set `key` maps to.
    #[inline(always)]
    fn set_of(&self, key: u64) -> usize {
        (key ^ (key >> 17)) as usize & self.set_mask
    }

    /// The ways of `set` that hold an entry, as a bitmap (bit w = way w),
    /// from `occupied` (a set's bits lie in one word).
    #[inline(always)]
    fn occupied_ways(&self, set: usize) -> u64 {
        const _: () = assert!(64 % PscConfig::WAYS == 0);
        let first = set * PscConfig::WAYS;
        (self.occupied[first / 64] >> (first % 64)) & ((1 << PscConfig::WAYS) - 1)
    }

    /// The first of the occupied ways `ways` of `set` whose entry
    /// `matches`, lowest way first.
    #[inline(always)]
    fn find_way(&self, set: usize, mut ways: u64, matches: impl Fn(&T) -> bool) -> Option<usize> {
        let base = set * PscConfig::WAYS;
        while ways != 0 {
            let way = ways.trailing_zeros() as usize;
            ways &= ways - 1;
            if self.slots[base + way].as_ref().is_some_and(&matches) {
                return Some(way);
            }
        }
        None
    }

    /// The entry of `key`'s set that `matches`, if any.
    #[inline(always)]
    fn get(&self, key: u64, matches: impl Fn(&T) -> bool) -> Option<&T> {
        if self.used == 0 {
            return None;
        }
        let set = self.set_of(key);
        let w = PscConfig::WAYS;
        self.slots[set * w..(set + 1) * w]
            .iter()
            .flatten()
            .find(|v| matches(v))
    }

    /// Puts `value` in the set of `key`: over the slot `same` picks, else
    /// the first free way, else the round-robin victim.
    fn insert(&mut self, key: u64, value: T, same: impl Fn(&T) -> bool) {
        self.insert_known(key, value, same, false);
    }

    /// [`Self::insert`]; `absent`: the caller knows no entry of the set
    /// is one `same` picks (it probed the set, unchanged since), so the
    /// search is skipped.
    #[inline(always)]
    fn insert_known(&mut self, key: u64, value: T, same: impl Fn(&T) -> bool, absent: bool) {
        let set = self.set_of(key);
        let occupied = self.occupied_ways(set);
        let free = !occupied & ((1 << PscConfig::WAYS) - 1);
        debug_assert!(!absent || self.find_way(set, occupied, &same).is_none());
        let found = if absent {
            None
        } else {
            self.find_way(set, occupied, same)
        };
        let way = match found {
            Some(w) => w,
            None if free != 0 => free.trailing_zeros() as usize,
            None => {
                let w = self.next[set] as usize;
                self.next[set] = ((w + 1) % PscConfig::WAYS) as u8;
                w
            }
        };
        let slot = set * PscConfig::WAYS + way;
        self.slots[slot] = Some(value);
        self.used += usize::from(occupied & (1 << way) == 0);
        self.occupied[slot / 64] |= 1 << (slot % 64);
    }

    /// Whether `used` and `occupied` match the slots (for tests).
    #[cfg(test)]
    fn consistent(&self) -> bool {
        let bits = self
            .occupied
            .iter()
            .map(|w| w.count_ones() as usize)
            .sum::<usize>();
        bits == self.used
            && self
                .slots
                .iter()
                .enumerate()
                .all(|(i, slot)| slot.is_some() == ((self.occupied[i / 64] >> (i % 64)) & 1 != 0))
    }

    /// Empties the slots of `key`'s set whose entry `drop` picks (an entry
    /// lives only in the set of the key it was inserted with).
    fn remove_in_set(&mut self, key: u64, drop: impl Fn(&T) -> bool) {
        if self.used == 0 {
            return;
        }
        let set = self.set_of(key);
        let mut ways = self.occupied_ways(set);
        while ways != 0 {
            let way = ways.trailing_zeros() as usize;
            ways &= ways - 1;
            let slot = set * PscConfig::WAYS + way;
            if self.slots[slot].as_ref().is_some_and(&drop) {
                self.vacate(slot);
            }
        }
    }

    /// Empties occupied `slot`, keeping `used` and `occupied` with it.
    #[inline(always)]
    fn vacate(&mut self, slot: usize) {
        self.slots[slot] = None;
        self.used -= 1;
        self.occupied[slot / 64] &= !(1 << (slot % 64));
    }

    /// Empties every slot whose entry `keep` rejects, visiting only the
    /// occupied slots.
    fn retain(&mut self, keep: impl Fn(&T) -> bool) {
        if self.used == 0 {
            return;
        }
        for word in 0..self.occupied.len() {
            let mut bits = self.occupied[word];
            while bits != 0 {
                let bit = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let slot = word * 64 + bit;
                if self.slots[slot].as_ref().is_some_and(|v| !keep(v)) {
                    self.vacate(slot);
                }
            }
        }
    }
}

/// What an upper-level entry is valid for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct UpperTag {
    /// Linear-address bits above the level's reach (47:12+9*level... see
    /// [`upper_prefix`]).
    prefix: u64,
    /// CR3's table address.
    root: u64,
    /// Raw EPTP (0 without EPT).
    eptp: u64,
    vpid: u16,
    nxe: bool,
}

/// A PML4E-, PDPTE- or PDE-cache entry.
#[derive(Debug, Clone, Copy)]
struct Upper {
    tag: UpperTag,
    /// Guest-physical address of the structure the entry points to.
    next: Gpa,
    /// Rights combined over this level and those above.
    perms: GuestPerms,
    /// Memory references the walk from CR3 down to this entry made.
    refs: u32,
}

/// A cached guest-physical mapping.
#[derive(Debug, Clone, Copy)]
struct GpaMapping {
    /// Guest-physical 4 KiB page number.
    gfn: u64,
    /// Raw EPTP it was made under.
    eptp: u64,
    /// Host-physical address of the 4 KiB page.
    hpa: u64,
    perms: EptPerms,
    page_size: PageSize,
    dirty_recorded: bool,
}

/// Linear-address bits `gva` shares with every address an entry of
/// `level` (3 = PML4E, 2 = PDPTE, 1 = PDE) maps.
#[inline]
fn upper_prefix(gva: u64, level: u32) -> u64 {
    (gva & ((1 << 48) - 1)) >> (PageSize::Size4K.shift() + 9 * level)
}

/// Memory references an EPT walk ending in a leaf of `size` makes.
#[inline]
pub(crate) fn ept_walk_refs(size: PageSize) -> u64 {
    match size {
        PageSize::Size4K => 4,
        PageSize::Size2M => 3,
        PageSize::Size1G => 2,
    }
}

/// Where a guest walk may start: below a cached upper-level entry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WalkStart {
    /// The level to read next (2 = PDPT, 1 = PD, 0 = PT).
    pub level: u32,
    pub table: Gpa,
    pub perms: GuestPerms,
    /// References the levels above took.
    pub refs: u64,
}

impl WalkStart {
    /// The start of a walk with no cached entry: the PML4 at CR3.
    #[inline(always)]
    pub fn from_cr3(regs: &super::PagingRegs) -> Self {
        WalkStart {
            level: 3,
            table: Gpa(regs.cr3 & super::paging::pte::ADDR_MASK),
            perms: GuestPerms::ALL,
            refs: 0,
        }
    }
}

/// One non-leaf entry a successful walk used, to cache.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UpperFill {
    /// 3 = PML4E, 2 = PDPTE, 1 = PDE.
    pub level: u32,
    pub next: Gpa,
    pub perms: GuestPerms,
    /// References from CR3 down to and including this entry.
    pub refs: u64,
}

/// Hit counters (host-side figures: they do not feed virtual time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PscStats {
    /// Guest walks that started below a PML4E, PDPTE or PDE-cache entry.
    pub upper_hits: u64,
    /// EPT translations answered by a guest-physical mapping.
    pub gpa_hits: u64,
    /// Translations that faulted after using a cached entry and were
    /// walked again from memory.
    pub rewalks: u64,
}

/// The paging-structure caches of one logical processor.
#[derive(Debug, Clone)]
pub struct Psc {
    config: PscConfig,
    /// Index 0 = PDE cache, 1 = PDPTE, 2 = PML4E.
    upper: [Sets<Upper>; 3],
    gpa: Sets<GpaMapping>,
    stats: PscStats,
    /// Host-side memo of the straight walk's last paging-structure mapping.
    memo: StructureMemo,
}

/// The guest-physical mapping [`Psc::gpa_peek_structure`] last found, and
/// a generation of the guest-physical mappings (moved by every change to
/// them: a fill, an invalidation). While the generation is the one the memo
/// was taken in, the mappings are as they were, so a probe for the memo's
/// page and EPTP would find exactly the memo's mapping. Host-side
/// bookkeeping, not part of the model: left out of `Debug` (which tests
/// compare between a machine that uses it and one that does not).
#[derive(Clone, Default)]
struct StructureMemo {
    generation: u64,
    last: std::cell::Cell<Option<(u64, GpaMapping)>>,
}

impl std::fmt::Debug for StructureMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StructureMemo")
    }
}

#[cfg(test)]
thread_local! {
    /// Structure mappings [`Psc::gpa_peek_structure`] took from its memo,
    /// on this thread (for tests: that they exercise it).
    pub(crate) static STRUCTURE_MEMO_HITS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl Psc {
    pub fn new(config: PscConfig) -> Self {
        Psc {
            config,
            upper: [
                Sets::new(config.entries),
                Sets::new(config.entries),
                Sets::new(config.entries),
            ],
            gpa: Sets::new(config.gpa_entries),
            stats: PscStats::default(),
            memo: StructureMemo::default(),
        }
    }

    /// The sizes it was made with.
    pub fn config(&self) -> PscConfig {
        self.config
    }

    /// Counters.
    pub fn stats(&self) -> PscStats {
        self.stats
    }

    /// Whether either cache is on.
    #[inline]
    pub(crate) fn enabled(&self) -> bool {
        self.upper[0].enabled() || self.gpa.enabled()
    }

    /// Whether every cache's bookkeeping matches its slots (for tests).
    #[cfg(test)]
    pub(crate) fn consistent(&self) -> bool {
        self.upper.iter().all(Sets::consistent) && self.gpa.consistent()
    }

    /// Number of valid entries (upper levels, guest-physical mappings).
    pub fn occupancy(&self) -> (usize, usize) {
        (self.upper.iter().map(|s| s.used).sum(), self.gpa.used)
    }

    #[inline(always)]
    fn upper_tag(ctx: &TranslateCtx<'_>, gva: u64, level: u32) -> UpperTag {
        UpperTag {
            prefix: upper_prefix(gva, level),
            root: ctx.regs.cr3 & super::paging::pte::ADDR_MASK,
            eptp: ctx.ept.map_or(0, |e| e.0),
            vpid: ctx.vpid,
            nxe: ctx.regs.efer & efer::NXE != 0,
        }
    }

    /// The deepest cached entry for `gva` under `ctx`: where its walk can
    /// start. Counted as a hit.
    #[inline]
    pub(crate) fn start(&mut self, ctx: &TranslateCtx<'_>, gva: u64) -> Option<WalkStart> {
        let start = self.peek_start(ctx, gva);
        self.stats.upper_hits += u64::from(start.is_some());
        start
    }

    /// [`Self::start`] without counting: changes nothing.
    #[inline(always)]
    pub(crate) fn peek_start(&self, ctx: &TranslateCtx<'_>, gva: u64) -> Option<WalkStart> {
        let mut tag = Self::upper_tag(ctx, gva, 1);
        for level in 1..=3u32 {
            tag.prefix = upper_prefix(gva, level);
            if let Some(e) = self.upper[level as usize - 1].get(tag.prefix, |e| e.tag == tag) {
                return Some(WalkStart {
                    level: level - 1,
                    table: e.next,
                    perms: e.perms,
                    refs: u64::from(e.refs),
                });
            }
        }
        None
    }

    /// Counts what a walk that changed nothing else used: a start below an
    /// upper-level entry (`upper`) and `gpa` guest-physical mappings (the
    /// counts [`Self::start`] and [`Self::gpa_lookup`] would have made).
    #[inline(always)]
    pub(crate) fn count_hits(&mut self, upper: bool, gpa: u64) {
        self.stats.upper_hits += u64::from(upper);
        self.stats.gpa_hits += gpa;
    }

    /// Caches the non-leaf entries a successful walk of `gva` used.
    pub(crate) fn fill_upper(&mut self, ctx: &TranslateCtx<'_>, gva: u64, fills: &[UpperFill]) {
        if !self.upper[0].enabled() {
            return;
        }
        for f in fills {
            let tag = Self::upper_tag(ctx, gva, f.level);
            self.upper[f.level as usize - 1].insert(
                tag.prefix,
                Upper {
                    tag,
                    next: f.next,
                    perms: f.perms,
                    refs: u32::try_from(f.refs).unwrap_or(u32::MAX),
                },
                |e| e.tag == tag,
            );
        }
    }

    /// The cached EPT translation of `gpa` under `eptp`, if it allows an
    /// access of `kind` with no flag to set; adds the references its walk
    /// took to `walk_refs`.
    #[inline(always)]
    pub(crate) fn gpa_lookup(
        &mut self,
        eptp: Eptp,
        gpa: Gpa,
        kind: super::AccessKind,
        walk_refs: &mut u64,
    ) -> Option<EptTranslation> {
        let t = self.gpa_peek(eptp, gpa, kind)?;
        self.stats.gpa_hits += 1;
        *walk_refs += ept_walk_refs(t.page_size);
        Some(t)
    }

    /// [`Self::gpa_lookup`] without counting or charging: changes nothing.
    #[inline(always)]
    pub(crate) fn gpa_peek(
        &self,
        eptp: Eptp,
        gpa: Gpa,
        kind: super::AccessKind,
    ) -> Option<EptTranslation> {
        self.gpa_peek_cached(eptp, gpa, kind).0
    }

    /// The cached mapping of guest-physical page `gfn` under `eptp`.
    #[inline(always)]
    fn mapping(&self, eptp: Eptp, gfn: u64) -> Option<&GpaMapping> {
        self.gpa.get(gfn, |m| m.gfn == gfn && m.eptp == eptp.0)
    }

    /// [`Self::gpa_peek`] for the paging structures of the straight walk
    /// (`paging::walk_cached`), through a one-entry memo: consecutive
    /// misses mostly read the same page directory, and the memo spares the
    /// probe of its mapping's set (a cache miss on the host, usually).
    /// The same answer as `gpa_peek` (see [`StructureMemo`]).
    #[inline(always)]
    pub(crate) fn gpa_peek_structure(
        &self,
        eptp: Eptp,
        gpa: Gpa,
        kind: super::AccessKind,
    ) -> Option<EptTranslation> {
        let gfn = gpa.0 >> PageSize::Size4K.shift();
        match self.memo.last.get() {
            Some((generation, m))
                if generation == self.memo.generation && m.gfn == gfn && m.eptp == eptp.0 =>
            {
                #[cfg(test)]
                STRUCTURE_MEMO_HITS.with(|n| n.set(n.get() + 1));
                Self::mapping_translation(&m, gpa, kind)
            }
            _ => {
                let m = self.mapping(eptp, gfn)?;
                self.memo.last.set(Some((self.memo.generation, *m)));
                Self::mapping_translation(m, gpa, kind)
            }
        }
    }

    /// What mapping `m` (of `gpa`'s page) gives an access of `kind`: its
    /// EPT translation if it allows the access with no flag to set.
    ///
    /// A mapping made while the leaf's EPT dirty flag was clear answers
    /// nothing, not even a read: another CPU's write may have set the flag
    /// since (hardware sets it; no software invalidates for that), and the
    /// TLB entry a read fills records whether it is set, which decides
    /// whether a later write walks again. A walk from memory sees the flag
    /// as it is now, as with no cache, so the caches' sizes stay out of
    /// virtual time (with 16384 mappings, `bm -f 2 -w 2` on 4 vCPUs took
    /// a different course before this rule).
    #[inline(always)]
    fn mapping_translation(
        m: &GpaMapping,
        gpa: Gpa,
        kind: super::AccessKind,
    ) -> Option<EptTranslation> {
        let usable = m.perms.allows(kind) && m.dirty_recorded;
        if !usable {
            return None;
        }
        Some(EptTranslation {
            hpa: Hpa(m.hpa | (gpa.0 & 0xfff)),
            perms: m.perms,
            page_size: m.page_size,
            dirty_recorded: m.dirty_recorded,
        })
    }

    /// [`Self::gpa_peek`], also telling whether a mapping of `gpa`'s page
    /// under `eptp` is cached at all (usable or not), for
    /// [`Self::gpa_fill_known`].
    #[inline(always)]
    pub(crate) fn gpa_peek_cached(
        &self,
        eptp: Eptp,
        gpa: Gpa,
        kind: super::AccessKind,
    ) -> (Option<EptTranslation>, bool) {
        match self.mapping(eptp, gpa.0 >> PageSize::Size4K.shift()) {
            Some(m) => (Self::mapping_translation(m, gpa, kind), true),
            None => (None, false),
        }
    }

    /// Caches an EPT translation of `gpa` a walk just made.
    pub(crate) fn gpa_fill(&mut self, eptp: Eptp, gpa: Gpa, t: &EptTranslation) {
        self.gpa_fill_known(eptp, gpa, t, true);
    }

    /// [`Self::gpa_fill`]; `cached` false: [`Self::gpa_peek_cached`] found
    /// no mapping of the page, and the mappings have not changed since.
    #[inline]
    pub(crate) fn gpa_fill_known(
        &mut self,
        eptp: Eptp,
        gpa: Gpa,
        t: &EptTranslation,
        cached: bool,
    ) {
        if !self.gpa.enabled() {
            return;
        }
        let gfn = gpa.0 >> PageSize::Size4K.shift();
        let eptp = eptp.0;
        self.memo.generation += 1;
        self.gpa.insert_known(
            gfn,
            GpaMapping {
                gfn,
                eptp,
                hpa: t.hpa.0 & !0xfff,
                perms: t.perms,
                page_size: t.page_size,
                dirty_recorded: t.dirty_recorded,
            },
            |m| m.gfn == gfn && m.eptp == eptp,
            !cached,
        );
    }

    /// After a fault in a translation of `gva` that used the caches: drops
    /// the PSC entries for `gva` under `ctx` (SDM 4.10.4.1) and, for an EPT
    /// violation or misconfiguration at `ept_gpa`, the guest-physical
    /// mapping of that page (SDM 29.4.3.1).
    pub(crate) fn fault(&mut self, ctx: &TranslateCtx<'_>, gva: u64, ept_gpa: Option<Gpa>) {
        self.stats.rewalks += 1;
        for level in 1..=3u32 {
            let tag = Self::upper_tag(ctx, gva, level);
            self.upper[level as usize - 1].remove_in_set(tag.prefix, |e| e.tag == tag);
        }
        if let (Some(gpa), Some(eptp)) = (ept_gpa, ctx.ept) {
            let gfn = gpa.0 >> PageSize::Size4K.shift();
            self.memo.generation += 1;
            self.gpa
                .remove_in_set(gfn, |m| m.gfn == gfn && m.eptp == eptp.0);
        }
    }

    fn retain_upper(&mut self, keep: impl Fn(&Upper) -> bool) {
        for cache in &mut self.upper {
            cache.retain(&keep);
        }
    }

    /// MOV to CR3, INVLPG, VPID flushes: every PSC entry of `vpid`.
    pub(crate) fn flush_vpid(&mut self, vpid: u16) {
        self.retain_upper(|e| e.tag.vpid != vpid);
    }

    /// All-context INVVPID: the PSC entries of every VPID but 0.
    pub(crate) fn flush_all_guest_vpids(&mut self) {
        self.retain_upper(|e| e.tag.vpid == 0);
    }

    /// INVEPT: the combined PSC entries and guest-physical mappings of the
    /// EP4TA (`SingleContext`) or of every EPTP (`Global`).
    pub(crate) fn invept(&mut self, kind: InveptKind) {
        match kind {
            InveptKind::SingleContext(eptp) => {
                let root = eptp.pml4().0;
                let same = move |raw: u64| raw != 0 && Eptp(raw).pml4().0 == root;
                self.retain_upper(|e| !same(e.tag.eptp));
                self.memo.generation += 1;
                self.gpa.retain(|m| !same(m.eptp));
            }
            InveptKind::Global => {
                self.retain_upper(|e| e.tag.eptp == 0);
                self.memo.generation += 1;
                self.gpa.retain(|_| false);
            }
        }
    }

    /// Everything.
    pub(crate) fn flush_all(&mut self) {
        self.retain_upper(|_| false);
        self.memo.generation += 1;
        self.gpa.retain(|_| false);
    }
}
