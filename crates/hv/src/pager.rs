//! Host memory overcommit: the frame pool limit, eviction and page-in.
//!
//! Guest pages live in host frames while resident. The pool holds at most
//! `limit` of them (the seed's container limit, `--host-mem`); resident
//! pages plus pages being read in count against it. When a new page needs
//! a frame and the pool is full, a batch of pages is evicted:
//!
//! 1. **WSClock** (Carr and Hennessy's working-set clock) over the EPT
//!    accessed bits: the scan goes round the resident pages in order; a
//!    page found accessed has its bit cleared and its last-use time set to
//!    now; a page found idle whose last use is at least [`WORKING_SET_AGE`]
//!    of virtual time ago is the victim; other idle pages wait. If a whole
//!    turn finds no victim (everything was used within the window, as when
//!    a stream of first touches fills the pool), the page idle the longest
//!    goes. Kernel text, stacks and page tables in steady use stay; a
//!    stream of pages touched once is what leaves.
//!
//!    An accessed bit only says something if the TLB was flushed since it
//!    was cleared (a cached translation sets no bit), so every batch that
//!    clears bits or zaps sptes ends with an INVEPT on every vCPU, as
//!    Linux's `clear_flush_young` does for a KVM guest.
//! 2. **rmap zap**: every spte mapping the frame is cleared under
//!    `mmu_lock`; their dirty bits say whether the guest wrote the page.
//! 3. **Write-back**: a dirty page, or one with no copy on swap, is written
//!    to a swap slot (the data goes to the file now; the device model
//!    charges the write). A clean page with a copy on swap is just dropped.
//! 4. The frame returns to the allocator. The caller issues one INVEPT on
//!    every vCPU for the whole batch before the frames are reused.
//!
//! A page-in reads the slot into a fresh frame at once, but the page only
//! becomes resident at the completion time the device model gives: until
//! then it is "in flight" and a vCPU touching it waits (how it waits is the
//! async-page-fault policy's business, `vm.rs`). The swap slot is kept, so
//! the page stays clean on swap until the guest writes it.
//!
//! Clearing accessed bits needs no TLB flush: a cached translation keeps a
//! page looking idle until the next INVEPT, which every eviction batch
//! issues anyway (KVM's `clear_young` makes the same trade).

use crate::frames::OutOfFrames;
use crate::host::Host;
use crate::memslot::{Memslots, PageState, SlotId};
use crate::mmu::lock::{Core, Timed};
use crate::swap::{Device, DeviceModel, DeviceStats, SwapError, SwapFile, SwapSlot};
use crate::time::Cycles;
use machine::addr::PAGE_SIZE;
use machine::{Gfn, Hfn, MemError};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use thiserror::Error;

/// Pages evicted at once when the pool is full (one INVEPT per batch).
pub const EVICT_BATCH: usize = 16;

/// A page idle for at least this long (virtual cycles: 10 ms) is outside
/// the working set. Longer than the guest's 4 ms timer tick, so what runs
/// on every tick stays resident.
pub const WORKING_SET_AGE: Cycles = Cycles(machine::cost::CYCLES_PER_SECOND / 100);

/// A guest page, by memslot and index (stable across memslot moves).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct PageRef {
    pub slot: SlotId,
    pub index: u64,
}

/// A page being read from swap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InFlight {
    pub page: PageRef,
    pub frame: Hfn,
    /// Virtual time the read completes.
    pub ready_at: Cycles,
}

/// A pager operation failed; the VM stops.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PagerError {
    #[error("swap: {0}")]
    Swap(#[from] SwapError),
    #[error("{0}")]
    OutOfFrames(#[from] OutOfFrames),
    #[error("host memory: {0:?}")]
    Memory(MemError),
    #[error("host memory limit of {limit} pages reached and no page can be evicted (all {in_flight} in flight)")]
    NothingToEvict { limit: u64, in_flight: u64 },
    /// A page still at the migration source could not be had (post-copy:
    /// the source is gone for good).
    #[error("page {index:#x} not received from the migration source: {why}")]
    Remote { index: u64, why: String },
    /// The eviction batch's next `mmu_lock` request, at `at`, is past
    /// the order bound ([`Host::order_bound`]): the batch is suspended,
    /// and the fault that runs it is replayed once the other actors have
    /// passed `at` (it then goes on where it stopped).
    #[error("eviction batch suspended until {at:?}")]
    NotYet { at: Cycles },
}

/// Where a post-copy destination's pages not yet received come from (the
/// migration's return path, `docs/migration.md`). The pager asks it when
/// the guest or the hv first touches such a page, in place of reading the
/// swap file; the rest of the page-in (the frame, the wait as `--apf`
/// says, the completion) is a swap-in's.
pub trait PageSource: std::fmt::Debug {
    /// Fills `data` with page `index` of guest RAM, needed at virtual time
    /// `now`, and returns the virtual time it is (or was) here, from the
    /// link model. May block in host time until the bytes have come;
    /// an error means they never will.
    fn fetch(
        &mut self,
        index: u64,
        now: Cycles,
        data: &mut [u8; PAGE_SIZE as usize],
    ) -> Result<Cycles, String>;
}

impl From<MemError> for PagerError {
    fn from(e: MemError) -> Self {
        PagerError::Memory(e)
    }
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PagerStats {
    /// Pages evicted.
    pub evictions: u64,
    /// Evicted pages written to swap.
    pub swap_outs: u64,
    /// Evicted pages dropped because swap already held them.
    pub clean_drops: u64,
    /// Pages read from swap.
    pub swap_ins: u64,
    /// Of those, read synchronously for the hv's own access.
    pub sync_swap_ins: u64,
    /// Scan steps that found the accessed bit set.
    pub second_chances: u64,
    /// Victims taken as "idle the longest" after a turn found none outside
    /// the working set.
    pub oldest_evictions: u64,
    /// Eviction batches (INVEPTs).
    pub batches: u64,
    /// Most pages resident or in flight at once.
    pub peak_resident: u64,
}

/// A resident page on the clock.
#[derive(Debug, Clone, Copy)]
struct ClockEntry {
    page: PageRef,
    /// The frame it became resident in (an entry whose page now lives in
    /// another frame is stale).
    frame: Hfn,
    /// Virtual time it was last seen accessed (or became resident).
    last_used: Cycles,
    /// Arrival order (breaks ties: among pages last seen used at the same
    /// time, the newest goes first, as after a stream of first touches).
    arrival: u64,
}

/// The host side of guest memory: pool limit, page lists, swap.
#[derive(Debug)]
pub(crate) struct Pager {
    limit: u64,
    /// Resident plus in-flight pages.
    resident: u64,
    clock: VecDeque<ClockEntry>,
    arrivals: u64,
    in_flight: BTreeMap<SwapSlot, InFlight>,
    swap_path: Option<PathBuf>,
    swap: Option<SwapFile>,
    device: Device,
    buf: Box<[u8; PAGE_SIZE as usize]>,
    stats: PagerStats,
    /// Swap slots reserved for pages still at the migration source
    /// (post-copy): their contents come from `source`, not the file.
    remote: BTreeMap<SwapSlot, PageRef>,
    source: Option<Box<dyn PageSource>>,
    /// Eviction batches suspended at the order bound, by the core that
    /// runs them ([`PagerError::NotYet`]).
    suspended: BTreeMap<Core, Batch>,
}

/// An eviction batch in progress (see [`Pager::evict_batch`]).
#[derive(Debug, Clone, Copy, Default)]
struct Batch {
    /// When it started: what WSClock ages pages against.
    now: Cycles,
    evicted: usize,
    looked: usize,
    work: Work,
    /// A page found old enough whose eviction was suspended: it goes
    /// first when the batch goes on.
    victim: Option<ClockEntry>,
}

/// What obtaining a frame did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Work {
    /// Virtual cycles of hv work.
    pub cycles: Cycles,
    /// sptes were zapped: INVEPT every vCPU before running guest code.
    pub flush: bool,
}

impl Work {
    fn add(&mut self, other: Work) {
        self.cycles += other.cycles;
        self.flush |= other.flush;
    }
}

impl Pager {
    /// A pool of `limit` pages, swapping to `swap_path` (a temporary file
    /// if `None`, created on first use) through a device of `model`.
    pub fn new(limit: u64, swap_path: Option<PathBuf>, model: DeviceModel, seed: u64) -> Self {
        Pager {
            limit: limit.max(1),
            resident: 0,
            clock: VecDeque::new(),
            arrivals: 0,
            in_flight: BTreeMap::new(),
            swap_path,
            swap: None,
            device: Device::new(model, seed),
            buf: Box::new([0; PAGE_SIZE as usize]),
            stats: PagerStats::default(),
            remote: BTreeMap::new(),
            source: None,
            suspended: BTreeMap::new(),
        }
    }

    /// Opens the swap file now (so a bad path is reported at VM creation).
    pub fn open_swap(&mut self) -> Result<(), SwapError> {
        if self.swap.is_none() {
            self.swap = Some(match &self.swap_path {
                Some(path) => SwapFile::create(path)?,
                None => SwapFile::temporary()?,
            });
        }
        Ok(())
    }

    /// Puts `data` in the swap file as the swapped-out copy of untouched
    /// `page` (a lazy snapshot restore: the page is read in at its first
    /// touch, through the same path and device model as any swap-in). No
    /// device time is charged: the page was in the snapshot, not written.
    pub fn place_in_swap(
        &mut self,
        slots: &mut Memslots,
        page: PageRef,
        data: &[u8; PAGE_SIZE as usize],
    ) -> Result<(), PagerError> {
        self.open_swap()?;
        let swap = self.swap.as_mut().expect("just opened");
        let target = swap.alloc()?;
        swap.write(target, data)?;
        if let Some(slot) = slots.get_mut(page.slot) {
            slot.set_swapped(page.index, target);
        }
        Ok(())
    }

    /// Marks untouched `page` as still at the migration source: it looks
    /// swapped out (a reserved swap slot, nothing written), and its first
    /// page-in asks the page source instead of reading the file.
    pub fn place_remote(&mut self, slots: &mut Memslots, page: PageRef) -> Result<(), PagerError> {
        self.open_swap()?;
        let swap = self.swap.as_mut().expect("just opened");
        let target = swap.alloc()?;
        if let Some(slot) = slots.get_mut(page.slot) {
            slot.set_swapped(page.index, target);
        }
        self.remote.insert(target, page);
        Ok(())
    }

    /// Installs the source of remote pages; returns the previous one.
    pub fn set_page_source(
        &mut self,
        source: Option<Box<dyn PageSource>>,
    ) -> Option<Box<dyn PageSource>> {
        std::mem::replace(&mut self.source, source)
    }

    /// Pages still at the migration source (never touched here).
    pub fn remote_pages(&self) -> u64 {
        self.remote.len() as u64
    }

    /// Pool size in pages.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Resident plus in-flight pages.
    pub fn resident(&self) -> u64 {
        self.resident
    }

    /// Counters.
    pub fn stats(&self) -> PagerStats {
        self.stats
    }

    /// The device's counters.
    pub fn device_stats(&self) -> DeviceStats {
        self.device.stats()
    }

    /// The device model.
    pub fn device_model(&self) -> &DeviceModel {
        self.device.model()
    }

    /// The read of `slot`, if in flight.
    pub fn in_flight(&self, slot: SwapSlot) -> Option<InFlight> {
        self.in_flight.get(&slot).copied()
    }

    /// Goes on with the eviction batch the running core suspended at the
    /// order bound, if any ([`PagerError::NotYet`]), and returns its work.
    pub fn resume_batch(&mut self, host: &mut Host) -> Result<Work, PagerError> {
        match self.suspended.get(&host.mmu.running()) {
            Some(batch) => {
                let now = batch.now;
                self.evict_batch(host, now)
            }
            None => Ok(Work::default()),
        }
    }

    /// A frame for a new resident page, evicting a batch first if the pool
    /// is full. The frame's contents are stale: the caller fills it.
    pub fn alloc_frame(&mut self, host: &mut Host, now: Cycles) -> Result<(Hfn, Work), PagerError> {
        let mut work = Work::default();
        if self.resident >= self.limit {
            work.add(self.evict_batch(host, now)?);
        }
        let frame = host.frames.alloc()?;
        host.mem.use_ahead(frame.addr());
        work.cycles += Cycles(host.costs.frame_alloc);
        self.resident += 1;
        self.stats.peak_resident = self.stats.peak_resident.max(self.resident);
        Ok((frame, work))
    }

    /// The first touch of untouched `page` (at `gfn`): a zeroed frame,
    /// recorded as its backing and put on the clock.
    pub fn first_touch(
        &mut self,
        host: &mut Host,
        page: PageRef,
        gfn: Gfn,
        now: Cycles,
    ) -> Result<(Hfn, Work), PagerError> {
        let (frame, mut work) = self.alloc_frame(host, now)?;
        host.mem.zero(frame.addr(), PAGE_SIZE)?;
        work.cycles += Cycles(host.costs.zero_4k);
        if let Some(slot) = host.slots.get_mut(page.slot) {
            slot.set_backing(gfn, frame);
        }
        self.note_resident(page, frame, now);
        Ok((frame, work))
    }

    /// Records that `page` became resident in `frame` at virtual time
    /// `now`.
    pub fn note_resident(&mut self, page: PageRef, frame: Hfn, now: Cycles) {
        self.arrivals += 1;
        self.clock.push_back(ClockEntry {
            page,
            frame,
            last_used: now,
            arrival: self.arrivals,
        });
    }

    /// Resident `pages` left memory other than by eviction (the hv dropped
    /// all-zero pages, e.g. a kernel's .bss): forget their clock entries,
    /// in one pass over the clock (its order kept).
    pub fn forget_resident(&mut self, pages: &BTreeSet<PageRef>) {
        if pages.is_empty() {
            return;
        }
        self.clock.retain(|e| !pages.contains(&e.page));
        self.resident = self.resident.saturating_sub(pages.len() as u64);
    }

    /// The frame of the clock entry's page if it is still resident in the
    /// frame the entry was made for.
    fn resident_frame(slots: &Memslots, entry: &ClockEntry) -> Option<Hfn> {
        let slot = slots.get(entry.page.slot)?;
        if entry.page.index >= slot.npages {
            return None;
        }
        match slot.state_at(entry.page.index) {
            PageState::Resident(frame) if frame == entry.frame => Some(frame),
            _ => None,
        }
    }

    /// A resident page's frame was freed outside the pager (memslot
    /// deletion).
    pub fn note_freed(&mut self) {
        self.resident = self.resident.saturating_sub(1);
    }

    /// Evicts up to [`EVICT_BATCH`] pages. `now` is when the batch starts
    /// (what WSClock ages pages against); each `mmu_lock` hold is taken at
    /// `now` plus the work done so far, so the batch's own holds follow one
    /// another instead of waiting for each other. A hold past the order
    /// bound suspends the batch ([`PagerError::NotYet`]); the next call by
    /// the same core goes on with it and returns the whole batch's work.
    fn evict_batch(&mut self, host: &mut Host, now: Cycles) -> Result<Work, PagerError> {
        let core = host.mmu.running();
        let mut batch = self.suspended.remove(&core).unwrap_or(Batch {
            now,
            ..Batch::default()
        });
        let now = batch.now;
        if let Some(entry) = batch.victim.take() {
            if let Some(frame) = Self::resident_frame(&host.slots, &entry) {
                let at = now + batch.work.cycles;
                batch.work.add(self.evict(host, entry.page, frame, at)?);
                batch.evicted += 1;
            }
        }
        while batch.evicted < EVICT_BATCH {
            let at = now + batch.work.cycles;
            if host.not_yet(at) {
                self.suspended.insert(core, batch);
                return Err(PagerError::NotYet { at });
            }
            if batch.looked >= self.clock.len() {
                // A whole turn and no page outside the working set: the
                // one idle the longest goes (rare enough for a search).
                let oldest = (0..self.clock.len()).min_by_key(|&i| {
                    let e = &self.clock[i];
                    (e.last_used, std::cmp::Reverse(e.arrival))
                });
                let Some(entry) = oldest.and_then(|i| self.clock.remove(i)) else {
                    break;
                };
                if let Some(frame) = Self::resident_frame(&host.slots, &entry) {
                    batch.work.add(self.evict(host, entry.page, frame, at)?);
                    self.stats.oldest_evictions += 1;
                    batch.evicted += 1;
                }
                continue;
            }
            let Some(mut entry) = self.clock.pop_front() else {
                break;
            };
            let Some(frame) = Self::resident_frame(&host.slots, &entry) else {
                continue; // stale: evicted, freed or its memslot gone
            };
            batch.looked += 1;
            let (young, cycles) =
                host.mmu
                    .test_and_clear_young(&host.mem, &host.costs, frame, Timed::At(at))?;
            batch.work.cycles += cycles;
            if young {
                self.stats.second_chances += 1;
                entry.last_used = now;
                batch.work.flush = true;
                self.clock.push_back(entry);
            } else if now.saturating_sub(entry.last_used) >= WORKING_SET_AGE {
                let at = now + batch.work.cycles;
                if host.not_yet(at) {
                    batch.victim = Some(entry);
                    self.suspended.insert(core, batch);
                    return Err(PagerError::NotYet { at });
                }
                batch.work.add(self.evict(host, entry.page, frame, at)?);
                batch.evicted += 1;
            } else {
                self.clock.push_back(entry);
            }
        }
        if batch.evicted == 0 {
            return Err(PagerError::NothingToEvict {
                limit: self.limit,
                in_flight: self.in_flight.len() as u64,
            });
        }
        self.stats.batches += 1;
        Ok(batch.work)
    }

    fn evict(
        &mut self,
        host: &mut Host,
        page: PageRef,
        frame: Hfn,
        lock_at: Cycles,
    ) -> Result<Work, PagerError> {
        let costs = host.costs;
        let zapped = host
            .mmu
            .zap_frame(&host.mem, &costs, frame, Timed::At(lock_at))?;
        let dirty = zapped.dirty;
        let mut work = Work {
            cycles: zapped.cycles,
            flush: zapped.sptes > 0,
        };
        let slot = host
            .slots
            .get_mut(page.slot)
            .expect("evict: the caller checked the memslot");
        let copy = slot.swap_slot_at(page.index);
        let target = match copy {
            Some(copy) if !dirty => {
                self.stats.clean_drops += 1;
                copy
            }
            _ => {
                self.open_swap()?;
                let swap = self.swap.as_mut().expect("just opened");
                let target = match copy {
                    Some(copy) => copy,
                    None => swap.alloc()?,
                };
                host.mem.read_bytes(frame.addr(), &mut self.buf[..])?;
                swap.write(target, &self.buf)?;
                // Queued when the eviction starts (the zap's request, which
                // the order bound admitted), not the batch: a batch can be
                // suspended and go on later.
                self.device.submit_write(lock_at.0);
                self.stats.swap_outs += 1;
                work.cycles += Cycles(costs.copy_4k + costs.io_submit);
                target
            }
        };
        slot.set_swapped(page.index, target);
        host.frames.free(frame);
        self.resident -= 1;
        self.stats.evictions += 1;
        Ok(work)
    }

    /// Starts reading swapped-out `page` (in `slot`) at `now`, unless it is
    /// already in flight; returns the read and the hv work it took.
    pub fn start_page_in(
        &mut self,
        host: &mut Host,
        page: PageRef,
        slot: SwapSlot,
        now: Cycles,
    ) -> Result<(InFlight, Work), PagerError> {
        if let Some(read) = self.in_flight.get(&slot) {
            return Ok((*read, Work::default()));
        }
        let (frame, mut work) = self.alloc_frame(host, now)?;
        self.open_swap()?;
        let remote = self.remote.contains_key(&slot);
        let ready_at = if let Some(remote) = self.remote.remove(&slot) {
            // Post-copy: the page comes over the migration link. Once
            // here it is kept in its swap slot, a clean copy like any
            // page read in.
            let fetched = match self.source.as_mut() {
                Some(source) => source
                    .fetch(remote.index, now, &mut self.buf)
                    .map_err(|why| PagerError::Remote {
                        index: remote.index,
                        why,
                    }),
                None => Err(PagerError::Remote {
                    index: remote.index,
                    why: "no page source".into(),
                }),
            };
            let swap = self.swap.as_mut().expect("just opened");
            let fetched = fetched.and_then(|arrival| {
                swap.write(slot, &self.buf)?;
                Ok(arrival)
            });
            match fetched {
                Ok(arrival) => {
                    // Placing the received page (UFFDIO_COPY's copy).
                    work.cycles += Cycles(host.costs.copy_4k);
                    arrival.max(now)
                }
                Err(e) => {
                    self.remote.insert(slot, remote);
                    host.frames.free(frame);
                    self.resident -= 1;
                    return Err(e);
                }
            }
        } else {
            let swap = self.swap.as_ref().expect("just opened");
            if let Err(e) = swap.read(slot, &mut self.buf) {
                host.frames.free(frame);
                self.resident -= 1;
                return Err(e.into());
            }
            work.cycles += Cycles(host.costs.io_submit + host.costs.copy_4k);
            Cycles(self.device.submit_read(now.0))
        };
        host.mem.write_bytes(frame.addr(), &self.buf[..])?;
        let read = InFlight {
            page,
            frame,
            ready_at,
        };
        self.in_flight.insert(slot, read);
        if !remote {
            self.stats.swap_ins += 1;
        }
        Ok((read, work))
    }

    /// Completes the read of `slot` (its time has come): the page is
    /// resident in its frame, with its clean copy kept on swap. Returns the
    /// gfn and frame, or `None` if the read is not in flight (completed
    /// already or cancelled).
    pub fn finish_page_in(&mut self, slots: &mut Memslots, slot: SwapSlot) -> Option<(Gfn, Hfn)> {
        let read = self.in_flight.remove(&slot)?;
        let memslot = slots.get_mut(read.page.slot)?;
        if read.page.index >= memslot.npages
            || memslot.state_at(read.page.index) != PageState::Swapped(slot)
        {
            // Cannot happen while memslot changes cancel reads first; keep
            // the accounting right regardless.
            self.resident -= 1;
            return None;
        }
        let gfn = memslot.gfn_at(read.page.index);
        memslot.set_backing(gfn, read.frame);
        self.note_resident(read.page, read.frame, read.ready_at);
        Some((gfn, read.frame))
    }

    /// Reads a swapped-out page synchronously (for the hv's own accesses,
    /// which do not wait in virtual time) and returns its frame and when
    /// the read completes on the device.
    pub fn swap_in_now(
        &mut self,
        host: &mut Host,
        page: PageRef,
        slot: SwapSlot,
        now: Cycles,
    ) -> Result<(Hfn, Work, Cycles), PagerError> {
        let (read, work) = self.start_page_in(host, page, slot, now)?;
        self.stats.sync_swap_ins += 1;
        let (_, frame) = self
            .finish_page_in(&mut host.slots, slot)
            .expect("the read was just started");
        Ok((frame, work, read.ready_at))
    }

    /// The hv is about to write resident `page`: its swap copy goes stale.
    pub fn drop_swap_copy(&mut self, slots: &mut Memslots, page: PageRef) {
        if let Some(memslot) = slots.get_mut(page.slot) {
            if let Some(copy) = memslot.take_swap_copy(page.index) {
                if let Some(swap) = self.swap.as_mut() {
                    swap.free(copy);
                }
            }
        }
    }

    /// Forgets memslot `id` (being deleted): cancels its reads, frees its
    /// swap slots. Returns the in-flight frames to free.
    pub fn forget_memslot(&mut self, slots: &Memslots, id: SlotId) -> Vec<Hfn> {
        let cancelled: Vec<SwapSlot> = self
            .in_flight
            .iter()
            .filter(|(_, r)| r.page.slot == id)
            .map(|(&s, _)| s)
            .collect();
        let mut frames = Vec::new();
        for s in cancelled {
            if let Some(read) = self.in_flight.remove(&s) {
                frames.push(read.frame);
                self.resident -= 1;
            }
        }
        self.clock.retain(|e| e.page.slot != id);
        self.remote.retain(|_, page| page.slot != id);
        if let (Some(memslot), Some(swap)) = (slots.get(id), self.swap.as_mut()) {
            for s in memslot.swap_slots() {
                swap.free(s);
            }
        }
        frames
    }
}

#[cfg(test)]
mod tests;
