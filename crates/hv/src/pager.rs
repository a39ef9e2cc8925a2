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
use crate::mmu::lock::Timed;
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

    /// A frame for a new resident page, evicting a batch first if the pool
    /// is full. The frame's contents are stale: the caller fills it.
    pub fn alloc_frame(&mut self, host: &mut Host, now: Cycles) -> Result<(Hfn, Work), PagerError> {
        let mut work = Work::default();
        if self.resident >= self.limit {
            work.add(self.evict_batch(host, now)?);
        }
        let frame = host.frames.alloc()?;
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
    /// another instead of waiting for each other.
    fn evict_batch(&mut self, host: &mut Host, now: Cycles) -> Result<Work, PagerError> {
        let mut work = Work::default();
        let mut evicted = 0;
        let mut looked = 0;
        while evicted < EVICT_BATCH {
            if looked >= self.clock.len() {
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
                    work.add(self.evict(host, entry.page, frame, now, now + work.cycles)?);
                    self.stats.oldest_evictions += 1;
                    evicted += 1;
                }
                continue;
            }
            let Some(mut entry) = self.clock.pop_front() else {
                break;
            };
            let Some(frame) = Self::resident_frame(&host.slots, &entry) else {
                continue; // stale: evicted, freed or its memslot gone
            };
            looked += 1;
            let (young, cycles) = host.mmu.test_and_clear_young(
                &host.mem,
                &host.costs,
                frame,
                Timed::At(now + work.cycles),
            )?;
            work.cycles += cycles;
            if young {
                self.stats.second_chances += 1;
                entry.last_used = now;
                work.flush = true;
                self.clock.push_back(entry);
            } else if now.saturating_sub(entry.last_used) >= WORKING_SET_AGE {
                work.add(self.evict(host, entry.page, frame, now, now + work.cycles)?);
                evicted += 1;
            } else {
                self.clock.push_back(entry);
            }
        }
        if evicted == 0 {
            return Err(PagerError::NothingToEvict {
                limit: self.limit,
                in_flight: self.in_flight.len() as u64,
            });
        }
        self.stats.batches += 1;
        Ok(work)
    }

    fn evict(
        &mut self,
        host: &mut Host,
        page: PageRef,
        frame: Hfn,
        now: Cycles,
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
                self.device.submit_write(now.0);
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
mod tests {
    use super::*;
    use crate::cost::HvCosts;
    use crate::frames::FrameAllocator;
    use crate::memslot::SlotFlags;
    use crate::mmu::root::RootId;
    use crate::mmu::{spte, Mmu};
    use crate::swap::DevicePreset;
    use machine::{Gfn, PhysMemory};

    struct Fixture {
        host: Host,
        pager: Pager,
    }

    const MS: Cycles = Cycles(machine::cost::CYCLES_PER_SECOND / 1000);
    const ROOT: RootId = RootId(0);

    fn ms(n: u64) -> Cycles {
        Cycles(MS.0 * n)
    }

    /// 64 guest pages on a pool of `limit` pages.
    fn fixture(limit: u64) -> Fixture {
        fixture_with(limit, crate::mmu::fast_pf::MmuOptions::default())
    }

    /// [`fixture`] with the MMU's switches as `options` say.
    fn fixture_with(limit: u64, options: crate::mmu::fast_pf::MmuOptions) -> Fixture {
        let mem = PhysMemory::new(512 * PAGE_SIZE).unwrap();
        let mut frames = FrameAllocator::new(Hfn(1), Hfn(512));
        let mmu = Mmu::with_options(&mem, &mut frames, crate::mmu::MmuMode::Ept, options).unwrap();
        let mut slots = Memslots::default();
        slots
            .add(SlotId(0), Gfn(0), 64, SlotFlags::default())
            .unwrap();
        let model = DevicePreset::Ssd.model();
        Fixture {
            host: Host {
                mem,
                frames,
                slots,
                mmu,
                costs: HvCosts::DEFAULT,
                dirty_rings: crate::mmu::dirty_log::DirtyRings::new(1, 0),
            },
            pager: Pager::new(limit, None, model, 1),
        }
    }

    impl Fixture {
        /// Maps resident gfn (as the fault path does).
        fn map(&mut self, gfn: u64, frame: Hfn) {
            let h = &mut self.host;
            let mapped = h.mmu.map_gfn(
                &h.mem,
                &mut h.frames,
                &h.costs,
                ROOT,
                Gfn(gfn),
                frame,
                crate::mmu::fault::LeafWrite::Writable,
                false,
                false,
                Cycles::ZERO,
            );
            mapped.result.unwrap();
        }

        /// Makes gfn resident with `fill` in every byte, mapped by an spte,
        /// and checks the MMU's invariants.
        fn touch(&mut self, gfn: u64, fill: u8, now: Cycles) -> Work {
            let page = PageRef {
                slot: SlotId(0),
                index: gfn,
            };
            let (frame, work) = self.pager.alloc_frame(&mut self.host, now).unwrap();
            self.host
                .mem
                .write_bytes(frame.addr(), &[fill; PAGE_SIZE as usize])
                .unwrap();
            self.host
                .slots
                .get_mut(SlotId(0))
                .unwrap()
                .set_backing(Gfn(gfn), frame);
            self.pager.note_resident(page, frame, now);
            self.map(gfn, frame);
            let h = &self.host;
            h.mmu.check(&h.mem, &h.slots, &h.costs).unwrap();
            work
        }

        /// Sets the accessed (and dirty) bits of gfn's spte, as a guest
        /// access through EPT would.
        fn access(&self, gfn: u64, write: bool) {
            let bits = spte::ACCESSED | if write { spte::DIRTY } else { 0 };
            let h = &self.host;
            h.mmu.set_leaf_bits_for_test(&h.mem, Gfn(gfn), bits);
        }

        fn spte(&self, gfn: u64) -> Option<u64> {
            let h = &self.host;
            h.mmu.leaf_spte(&h.mem, &h.costs, Gfn(gfn))
        }

        fn state(&self, gfn: u64) -> PageState {
            self.host.slots.get(SlotId(0)).unwrap().state(Gfn(gfn))
        }

        /// After one eviction batch over gfns 0..24 of which 0..8 were
        /// used: those stay resident and exactly a batch of the idle ones
        /// went to swap.
        fn assert_used_stay_and_idle_go(&self, case: &str) {
            for g in 0..8 {
                assert!(
                    matches!(self.state(g), PageState::Resident(_)),
                    "{case}: gfn {g} in use"
                );
            }
            let swapped = (8..EVICT_BATCH as u64 + 8)
                .filter(|&g| matches!(self.state(g), PageState::Swapped(_)))
                .count();
            assert_eq!(swapped, EVICT_BATCH, "{case}");
        }
    }

    /// A page source that fills page `i` with byte `i` and says it
    /// arrives at `at`; fails for pages at or above `missing_from`.
    #[derive(Debug)]
    struct FakeSource {
        at: Cycles,
        missing_from: u64,
        asked: std::rc::Rc<std::cell::Cell<u32>>,
    }

    impl PageSource for FakeSource {
        fn fetch(
            &mut self,
            index: u64,
            _now: Cycles,
            data: &mut [u8; PAGE_SIZE as usize],
        ) -> Result<Cycles, String> {
            self.asked.set(self.asked.get() + 1);
            if index >= self.missing_from {
                return Err("gone".into());
            }
            data.fill(index as u8);
            Ok(self.at)
        }
    }

    #[test]
    fn a_remote_page_comes_from_the_page_source_through_the_swap_in_path() {
        let mut f = fixture(EVICT_BATCH as u64);
        let asked = std::rc::Rc::new(std::cell::Cell::new(0));
        f.pager.set_page_source(Some(Box::new(FakeSource {
            at: ms(5),
            missing_from: 10,
            asked: asked.clone(),
        })));
        for g in [3, 12] {
            let page = PageRef {
                slot: SlotId(0),
                index: g,
            };
            f.pager.place_remote(&mut f.host.slots, page).unwrap();
        }
        assert_eq!(f.pager.remote_pages(), 2);
        let PageState::Swapped(slot) = f.state(3) else {
            panic!("a remote page looks swapped out: {:?}", f.state(3));
        };
        let page = PageRef {
            slot: SlotId(0),
            index: 3,
        };
        // Touched before its arrival: in flight until then, from the
        // source, not the swap device.
        let (read, _) = f
            .pager
            .start_page_in(&mut f.host, page, slot, ms(1))
            .unwrap();
        assert_eq!(read.ready_at, ms(5));
        assert_eq!(f.pager.stats().swap_ins, 0, "no device read");
        assert_eq!(f.pager.remote_pages(), 1);
        let (_, frame) = f.pager.finish_page_in(&mut f.host.slots, slot).unwrap();
        let mut buf = [0u8; PAGE_SIZE as usize];
        f.host.mem.read_bytes(frame.addr(), &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 3), "the source's bytes");
        // Evicted clean and read again: an ordinary swap-in of the copy
        // kept in its slot; the source is not asked again.
        f.map(3, frame);
        for g in 20..40 {
            f.touch(g, 9, ms(60));
        }
        let PageState::Swapped(again) = f.state(3) else {
            panic!("gfn 3 evicted: {:?}", f.state(3));
        };
        assert_eq!(again, slot, "the same slot, dropped clean");
        let (frame, _, _) = f
            .pager
            .swap_in_now(&mut f.host, page, again, ms(70))
            .unwrap();
        f.host.mem.read_bytes(frame.addr(), &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 3), "the copy kept in the slot");
        assert_eq!(f.pager.stats().swap_ins, 1, "a device read this time");
        assert_eq!(asked.get(), 1);
        // A page the source cannot give is an error, and stays remote.
        let PageState::Swapped(slot12) = f.state(12) else {
            panic!("remote: {:?}", f.state(12));
        };
        let page12 = PageRef {
            slot: SlotId(0),
            index: 12,
        };
        let before = f.pager.resident();
        let err = f
            .pager
            .start_page_in(&mut f.host, page12, slot12, ms(80))
            .unwrap_err();
        assert!(matches!(err, PagerError::Remote { index: 12, .. }), "{err}");
        assert_eq!(f.pager.resident(), before, "the frame went back");
        assert_eq!(f.pager.remote_pages(), 1);
    }

    #[test]
    fn a_full_pool_evicts_idle_pages_and_keeps_used_ones() {
        let mut f = fixture(EVICT_BATCH as u64 + 8);
        for g in 0..EVICT_BATCH as u64 + 8 {
            f.touch(g, g as u8 + 1, Cycles::ZERO);
        }
        // Pages 0..8 are in use; the rest idle since time 0.
        for g in 0..8 {
            f.access(g, false);
        }
        let now = ms(20);
        let work = f.touch(40, 0xee, now);
        assert!(work.flush, "zapped sptes need an INVEPT");
        f.assert_used_stay_and_idle_go("A/D");
        assert_eq!(
            f.pager.stats().swap_outs,
            EVICT_BATCH as u64,
            "never on swap: written"
        );
        assert_eq!(f.pager.resident(), 9);
        // The zapped sptes are gone.
        assert_eq!(f.spte(8), Some(0));
        assert!(f.spte(0).is_some_and(spte::is_present));
    }

    #[test]
    fn pages_come_back_from_swap_intact_and_clean_ones_are_dropped_not_rewritten() {
        let mut f = fixture(EVICT_BATCH as u64);
        for g in 0..EVICT_BATCH as u64 {
            f.touch(g, 0x40 + g as u8, Cycles::ZERO);
        }
        f.touch(50, 1, ms(20)); // evicts all 16
        let PageState::Swapped(slot) = f.state(3) else {
            panic!("gfn 3 evicted: {:?}", f.state(3));
        };
        let page = PageRef {
            slot: SlotId(0),
            index: 3,
        };
        let (read, _) = f
            .pager
            .start_page_in(&mut f.host, page, slot, ms(30))
            .unwrap();
        let model = DevicePreset::Ssd.model();
        assert!(read.ready_at >= ms(30) + Cycles(model.read_latency.min));
        assert_eq!(
            f.state(3),
            PageState::Swapped(slot),
            "not resident before completion"
        );
        let (gfn, frame) = f.pager.finish_page_in(&mut f.host.slots, slot).unwrap();
        assert_eq!(gfn, Gfn(3));
        let mut buf = [0u8; PAGE_SIZE as usize];
        f.host.mem.read_bytes(frame.addr(), &mut buf).unwrap();
        assert!(
            buf.iter().all(|&b| b == 0x43),
            "contents survived the round trip"
        );
        assert_eq!(
            f.host.slots.get(SlotId(0)).unwrap().swap_slot_at(3),
            Some(slot),
            "clean copy kept"
        );
        f.map(3, frame);
        // Evict it again without a write: dropped, not written.
        let before = f.pager.stats();
        for g in 20..40 {
            f.touch(g, 9, ms(60));
        }
        let after = f.pager.stats();
        assert!(
            matches!(f.state(3), PageState::Swapped(s) if s == slot),
            "same slot"
        );
        assert_eq!(
            after.clean_drops - before.clean_drops,
            1,
            "only gfn 3 had a clean copy"
        );
        assert_eq!(
            after.swap_outs - before.swap_outs,
            after.evictions - before.evictions - 1,
            "every other victim was written"
        );
    }

    #[test]
    fn a_written_page_is_written_back_again() {
        let mut f = fixture(EVICT_BATCH as u64);
        for g in 0..EVICT_BATCH as u64 {
            f.touch(g, 7, Cycles::ZERO);
        }
        f.touch(50, 1, ms(20));
        let PageState::Swapped(slot) = f.state(0) else {
            panic!()
        };
        let page = PageRef {
            slot: SlotId(0),
            index: 0,
        };
        f.pager
            .start_page_in(&mut f.host, page, slot, ms(30))
            .unwrap();
        let (_, frame) = f.pager.finish_page_in(&mut f.host.slots, slot).unwrap();
        f.map(0, frame);
        f.access(0, true); // the guest writes it
        let drops = f.pager.stats().clean_drops;
        for g in 20..37 {
            f.touch(g, 9, ms(80) + Cycles(g));
        }
        assert!(matches!(f.state(0), PageState::Swapped(_)));
        assert_eq!(f.pager.stats().clean_drops, drops, "dirty: not dropped");
    }

    /// With EPT A/D flags off the pager ages by access tracking, and a
    /// tracked page the guest touches again comes back through the fast
    /// page fault (a cmpxchg, no lock) or, with it off, the slow path.
    /// Either way the next aging must see the page used: WSClock keeps the
    /// pages the guest used and evicts the idle ones, as with A/D flags.
    #[test]
    fn access_tracked_pages_restored_by_either_path_count_as_used() {
        use crate::mmu::fast_pf::protocol::{Access, FastFix};
        use crate::mmu::lock::Timed;
        for fast_pf in [true, false] {
            let options = crate::mmu::fast_pf::MmuOptions {
                fast_pf,
                ept_ad: false,
                seed_indirect: false,
            };
            let mut f = fixture_with(EVICT_BATCH as u64 + 8, options);
            for g in 0..EVICT_BATCH as u64 + 8 {
                f.touch(g, g as u8 + 1, Cycles::ZERO);
            }
            // An aging pass access-tracks every leaf (each was live: used).
            let h = &f.host;
            for g in 0..EVICT_BATCH as u64 + 8 {
                let PageState::Resident(frame) = f.state(g) else {
                    panic!("gfn {g} resident");
                };
                let (young, _) = h
                    .mmu
                    .test_and_clear_young(&h.mem, &h.costs, frame, Timed::Untimed)
                    .unwrap();
                assert!(young, "a new leaf counts as used");
            }
            // The guest reads pages 0..8 again; each faults on its
            // tracked leaf and is restored.
            let h = &mut f.host;
            let (root, _) = h
                .mmu
                .load_root(&h.mem, &mut h.frames, &h.costs, None, Timed::Untimed)
                .unwrap();
            let pml4 = root.eptp.pml4();
            for g in 0..8 {
                let read = Access::default();
                let h = &f.host;
                let fast = h
                    .mmu
                    .fast_page_fault_ept(&h.mem, &h.costs, pml4, Gfn(g), read, false);
                match fast {
                    Some(fast) => assert!(
                        matches!(fast.outcome, FastFix::Fixed { .. }),
                        "gfn {g}: {fast:?}"
                    ),
                    None => {
                        assert!(!fast_pf, "the fast path tries every fault with A/D off");
                        let PageState::Resident(frame) = f.state(g) else {
                            panic!()
                        };
                        f.map(g, frame);
                    }
                }
                assert!(
                    f.spte(g).is_some_and(|s| s & spte::READ != 0),
                    "gfn {g} restored"
                );
            }
            // A page needs a frame 20 ms later: the 16 idle pages go, the
            // used ones stay.
            f.touch(40, 0xee, ms(20));
            f.assert_used_stay_and_idle_go(&format!("tracked, fast PF {fast_pf}"));
        }
    }
}
