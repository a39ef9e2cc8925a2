//! The VMM's side of dirty logging ([`crate::mmu::dirty_log`]): turning it
//! on and off per memslot while the guest runs, and the four ways of
//! collecting (bitmap, manual protect, ring, PML). Each operation runs as the
//! VMM thread at [`Vm::vmm_now`]: the VM's current virtual time, or the end
//! of the VMM's previous operation if that is later (an ioctl returns when
//! its work is done). Its holds of `mmu_lock` go on the lock timeline, so
//! vCPUs faulting meanwhile wait for them, and it returns what it cost.

use super::Vm;
use crate::memslot::{Memslot, SlotId};
use crate::mmu::dirty_log::{
    DirtyBitmap, DirtyGfn, DirtyLogError, DirtyLogMode, Protected, SlotLog,
};
use crate::mmu::lock::Timed;
use crate::mmu::{spte, MmuMode};
use crate::shared::CrossRequest;
use crate::time::Cycles;
use machine::Hfn;

/// Pages a collection returned and what it cost the VMM.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirtyPages {
    /// Page indexes in the slot, ascending (for a ring harvest: per slot,
    /// see [`RingHarvest`]).
    pub pages: Vec<u64>,
    /// What the operation cost in virtual cycles (its `mmu_lock` holds
    /// with their waits, and the remote TLB flush).
    pub cost: DirtyLogCost,
}

/// The virtual-time cost of a dirty-log operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirtyLogCost {
    /// Virtual cycles, waits included.
    pub cycles: Cycles,
    /// Of which waiting for `mmu_lock`.
    pub lock_wait: Cycles,
    /// Leaf sptes write-protected (or, under PML, cleaned).
    pub sptes: u64,
}

/// What a harvest of every vCPU's dirty ring returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RingHarvest {
    /// The entries, vCPU by vCPU, oldest first, then the pages logged in
    /// the slots' bitmaps (stores made outside any vCPU exit).
    pub entries: Vec<DirtyGfn>,
    /// Reading the entries.
    pub get: DirtyLogCost,
    /// The reset: re-protecting the harvested pages.
    pub clear: DirtyLogCost,
}

/// One collection of a slot's log in its mode, split as KVM's
/// `dirty_log_perf_test` times it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Collected {
    /// Page indexes in the slot, ascending, without repeats.
    pub pages: Vec<u64>,
    /// Getting the log (bitmap: get-and-reset with its re-protection;
    /// manual: the get; ring: the harvest).
    pub get: DirtyLogCost,
    /// Clearing it (manual: the clear of the whole slot; ring: the reset;
    /// bitmap: nothing, the get re-protected).
    pub clear: DirtyLogCost,
}

impl Vm {
    /// The VMM thread's time: the VM's, or the end of the VMM's last
    /// dirty-log operation if that is later. A VMM that acts after an
    /// operation returned (starts the guest's next pass, sends the pages
    /// it collected) acts at this time, as KVM's `dirty_log_perf_test`
    /// starts the next iteration only after its get and clear returned.
    pub fn vmm_now(&self) -> Cycles {
        self.time().max(self.sched.vmm_busy_until)
    }

    /// The VMM thread works for `cycles` from [`Vm::vmm_now`].
    fn vmm_spend(&mut self, cycles: Cycles) {
        self.sched.vmm_busy_until = self.vmm_now() + cycles;
    }

    fn logging_slot(&self, id: SlotId) -> Result<&Memslot, DirtyLogError> {
        let slot = self
            .shared
            .host
            .slots
            .get(id)
            .ok_or(DirtyLogError::NoSuchSlot(id))?;
        if slot.dirty_log.is_none() {
            return Err(DirtyLogError::NotEnabled(id));
        }
        Ok(slot)
    }

    fn slot_mode(&self, id: SlotId) -> Result<DirtyLogMode, DirtyLogError> {
        Ok(self
            .logging_slot(id)?
            .dirty_log
            .as_ref()
            .expect("checked")
            .mode)
    }

    /// Turns dirty logging on for memslot `id` in `mode` while the guest
    /// may be running (KVM_SET_USER_MEMORY_REGION with
    /// KVM_MEM_LOG_DIRTY_PAGES): every leaf spte of the slot is
    /// write-protected (W clear, MMU-writable kept) and every vCPU flushes.
    /// The log starts empty.
    pub fn enable_dirty_log(
        &mut self,
        id: SlotId,
        mode: DirtyLogMode,
    ) -> Result<DirtyLogCost, DirtyLogError> {
        if self.shared.host.mmu.mode == MmuMode::Native {
            return Err(DirtyLogError::Native);
        }
        if mode == DirtyLogMode::Pml {
            if self.shared.host.mmu.mode != MmuMode::Ept {
                return Err(DirtyLogError::PmlNeedsEpt);
            }
            if !self.shared.host.mmu.options.ept_ad {
                return Err(DirtyLogError::PmlNeedsEptAd);
            }
        }
        let slot = self
            .shared
            .host
            .slots
            .get_mut(id)
            .ok_or(DirtyLogError::NoSuchSlot(id))?;
        if slot.flags.readonly {
            return Err(DirtyLogError::ReadOnly(id));
        }
        if slot.dirty_log.is_some() {
            return Err(DirtyLogError::AlreadyEnabled(id));
        }
        let npages = slot.npages;
        if mode == DirtyLogMode::Pml {
            // Every vCPU logs from now on, into an empty log.
            self.set_pml_everywhere(true)?;
        }
        let slot = self.shared.host.slots.get_mut(id).expect("checked");
        slot.flags.log_dirty_pages = true;
        slot.dirty_log = Some(SlotLog {
            mode,
            bitmap: DirtyBitmap::new(npages),
        });
        let indexes: Vec<u64> = (0..npages).collect();
        if mode == DirtyLogMode::Pml {
            // sptes stay writable; with their dirty bit clear the next
            // write sets it and the CPU logs the page.
            self.clean(id, &indexes)
        } else {
            self.protect(id, &indexes)
        }
    }

    /// Turns dirty logging off for memslot `id`; its log is dropped (the
    /// VMM collects it first). sptes still write-protected become writable
    /// again at their next write fault, as in KVM.
    pub fn disable_dirty_log(&mut self, id: SlotId) -> Result<DirtyLogCost, DirtyLogError> {
        let mode = self.slot_mode(id)?;
        let slot = self.shared.host.slots.get_mut(id).expect("checked");
        slot.flags.log_dirty_pages = false;
        slot.dirty_log = None;
        if mode == DirtyLogMode::Pml {
            self.pml_off_unless_used();
        }
        Ok(DirtyLogCost::default())
    }

    /// After a PML slot stopped logging (disabled or deleted): if it was
    /// the last, the CPUs stop logging (KVM turns the "enable PML" control
    /// off when no memslot logs).
    pub(crate) fn pml_off_unless_used(&mut self) {
        if self.any_slot_logs_in(DirtyLogMode::Pml) {
            return;
        }
        for vcpu in self.vcpus.iter_mut() {
            vcpu.pml_off();
        }
    }

    fn any_slot_logs_in(&self, mode: DirtyLogMode) -> bool {
        self.shared
            .host
            .slots
            .iter()
            .any(|s| s.dirty_log.as_ref().is_some_and(|l| l.mode == mode))
    }

    /// Page-modification logging on or off in every vCPU.
    fn set_pml_everywhere(&mut self, on: bool) -> Result<(), DirtyLogError> {
        let Vm { vcpus, shared, .. } = self;
        for vcpu in vcpus.iter_mut() {
            vcpu.set_pml(&mut shared.host, on)?;
        }
        Ok(())
    }

    /// Drains every vCPU's page-modification log into the PML slots'
    /// bitmaps (KVM kicks each vCPU out of the guest, whose exit drains
    /// it; here they are out already); returns the work's cost.
    fn drain_pml_everywhere(&mut self) -> Result<Cycles, DirtyLogError> {
        self.drain_pml_logs()
            .map_err(|e| DirtyLogError::Tdp(crate::mmu::tdp::TdpError::Memory(e)))
    }

    /// Drains every vCPU's page-modification log (see
    /// [`Vm::collect_dirty_log`]); also before a memslot moves, while the
    /// logged gpas still name the slot's pages.
    pub(crate) fn drain_pml_logs(&mut self) -> Result<Cycles, machine::MemError> {
        let Vm { vcpus, shared, .. } = self;
        let mut cycles = Cycles::ZERO;
        for vcpu in vcpus.iter_mut() {
            cycles += vcpu.drain_pml(&shared.host)?;
        }
        Ok(cycles)
    }

    /// PML collection: drain every vCPU's log, get-and-reset the bitmap
    /// (`get`), then clear the dirty bits of the pages returned, with the
    /// flush (`clear`): KVM's `KVM_GET_DIRTY_LOG` with PML, whose
    /// `kvm_arch_mmu_enable_log_dirty_pt_masked` clears D bits instead of
    /// write-protecting.
    fn collect_pml(&mut self, id: SlotId) -> Result<Collected, DirtyLogError> {
        let drained = self.drain_pml_everywhere()?;
        let slot = self.logging_slot(id)?;
        let log = slot.dirty_log.as_ref().expect("checked");
        let pages = log.bitmap.collect(0, slot.npages, true);
        let get = DirtyLogCost {
            cycles: drained + Cycles(bitmap_copy_cycles(slot.npages)),
            ..DirtyLogCost::default()
        };
        self.vmm_spend(get.cycles);
        let clear = self.clean(id, &pages)?;
        Ok(Collected { pages, get, clear })
    }

    /// The PML invariant, for the checkers: a page of a PML slot whose
    /// spte has its dirty bit set is in the slot's bitmap or in some
    /// vCPU's page-modification log (so the next collection returns it;
    /// a written page whose D bit the last collection cleared is written
    /// again only by setting D again, which logs it). Returns what breaks
    /// it.
    pub(crate) fn pml_violations(&self) -> Vec<String> {
        if !self.any_slot_logs_in(DirtyLogMode::Pml) {
            return Vec::new();
        }
        let host = &self.shared.host;
        let mut logged = std::collections::BTreeSet::new();
        for vcpu in &self.vcpus {
            let Some(c) = vcpu.cpu.vmx() else { continue };
            let Some(log) = c.pml_address else { continue };
            for i in crate::mmu::dirty_log::pml_entries(c.pml_index) {
                if let Ok(gpa) = host.mem.read_u64(log.add(u64::from(i) * 8)) {
                    logged.insert(gpa >> 12);
                }
            }
        }
        let guard = host.mmu.hold(Timed::Untimed, &host.costs);
        let mut broken = Vec::new();
        for slot in host.slots.iter() {
            let Some(log) = slot.dirty_log.as_ref() else {
                continue;
            };
            if log.mode != DirtyLogMode::Pml {
                continue;
            }
            for index in 0..slot.npages {
                let crate::memslot::PageState::Resident(frame) = slot.state_at(index) else {
                    continue;
                };
                let gfn = slot.base_gfn.0 + index;
                let dirty = guard
                    .rmap
                    .get(frame)
                    .iter()
                    .any(|&at| host.mem.read_u64(at).is_ok_and(|v| v & spte::DIRTY != 0));
                if dirty && !log.bitmap.get(index) && !logged.contains(&gfn) {
                    broken.push(format!(
                        "PML: gfn {gfn:#x} of memslot {} has a dirty spte but is neither in the bitmap nor in a vCPU's log",
                        slot.id
                    ));
                }
            }
        }
        broken
    }

    /// KVM_GET_DIRTY_LOG. Bitmap mode: the pages written since the last
    /// get, reset and write-protected again. Manual mode: the pages
    /// written since they were last cleared, left as they are (clear them
    /// with [`Vm::clear_dirty_log`]). PML mode: the vCPUs' logs drained,
    /// then as bitmap mode with the returned pages' dirty bits cleared
    /// instead of write protection. Not for ring mode.
    pub fn get_dirty_log(&mut self, id: SlotId) -> Result<DirtyPages, DirtyLogError> {
        let mode = self.slot_mode(id)?;
        let slot = self.logging_slot(id)?;
        let log = slot.dirty_log.as_ref().expect("checked");
        match mode {
            DirtyLogMode::Bitmap => {
                let pages = log.bitmap.collect(0, slot.npages, true);
                let cost = self.protect(id, &pages)?;
                Ok(DirtyPages { pages, cost })
            }
            DirtyLogMode::Manual => {
                let pages = log.bitmap.collect(0, slot.npages, false);
                let cost = DirtyLogCost {
                    cycles: Cycles(bitmap_copy_cycles(slot.npages)),
                    ..DirtyLogCost::default()
                };
                self.vmm_spend(cost.cycles);
                Ok(DirtyPages { pages, cost })
            }
            DirtyLogMode::Pml => {
                let got = self.collect_pml(id)?;
                let cost = DirtyLogCost {
                    cycles: got.get.cycles + got.clear.cycles,
                    lock_wait: got.clear.lock_wait,
                    sptes: got.clear.sptes,
                };
                Ok(DirtyPages {
                    pages: got.pages,
                    cost,
                })
            }
            other => Err(DirtyLogError::WrongMode {
                slot: id,
                actual: other.name(),
                wanted: "bitmap, manual or pml",
            }),
        }
    }

    /// KVM_CLEAR_DIRTY_LOG (manual protect): clears the marks of pages
    /// `first..first + count` and write-protects the pages that were
    /// marked, so their next write is logged again. Returns those pages.
    pub fn clear_dirty_log(
        &mut self,
        id: SlotId,
        first: u64,
        count: u64,
    ) -> Result<DirtyPages, DirtyLogError> {
        let mode = self.slot_mode(id)?;
        if mode != DirtyLogMode::Manual {
            return Err(DirtyLogError::WrongMode {
                slot: id,
                actual: mode.name(),
                wanted: "manual",
            });
        }
        let slot = self.logging_slot(id)?;
        let end = first.checked_add(count).filter(|&e| e <= slot.npages);
        let Some(end) = end else {
            return Err(DirtyLogError::BadRange {
                slot: id,
                first,
                end: first.saturating_add(count),
                npages: slot.npages,
            });
        };
        let log = slot.dirty_log.as_ref().expect("checked");
        let pages = log.bitmap.collect(first, end, true);
        let cost = self.protect(id, &pages)?;
        Ok(DirtyPages { pages, cost })
    }

    /// Harvests every vCPU's dirty ring and resets it (KVM's harvest then
    /// KVM_RESET_DIRTY_RINGS): the harvested pages are write-protected
    /// again, and vCPUs stopped on a full ring may run again. Pages the hv
    /// logged outside a vCPU's exit (in ring-mode slots' bitmaps) come
    /// last.
    pub fn harvest_dirty_rings(&mut self) -> Result<RingHarvest, DirtyLogError> {
        let mut entries = Vec::new();
        let rings = &self.shared.host.dirty_rings;
        for vcpu in &self.vcpus {
            entries.extend(rings.harvest(vcpu.id));
        }
        let ring_slots: Vec<SlotId> = self
            .shared
            .host
            .slots
            .iter()
            .filter(|s| {
                s.dirty_log
                    .as_ref()
                    .is_some_and(|l| l.mode == DirtyLogMode::Ring)
            })
            .map(|s| s.id)
            .collect();
        for &id in &ring_slots {
            let slot = self.shared.host.slots.get(id).expect("listed");
            let log = slot.dirty_log.as_ref().expect("listed");
            entries.extend(
                log.bitmap
                    .collect(0, slot.npages, true)
                    .into_iter()
                    .map(|offset| DirtyGfn { slot: id, offset }),
            );
        }
        let get = DirtyLogCost {
            cycles: Cycles(entries.len() as u64 * self.shared.host.costs.spte_read),
            ..DirtyLogCost::default()
        };
        self.vmm_spend(get.cycles);
        let mut clear = DirtyLogCost::default();
        for &id in &ring_slots {
            let mut pages: Vec<u64> = entries
                .iter()
                .filter(|e| e.slot == id)
                .map(|e| e.offset)
                .collect();
            pages.sort_unstable();
            pages.dedup();
            let c = self.reset_ring_pages(id, &pages)?;
            clear.cycles += c.cycles;
            clear.lock_wait += c.lock_wait;
            clear.sptes += c.sptes;
        }
        // The reset returns at the harvest's end.
        let now = self.vmm_now();
        for vcpu in &mut self.vcpus {
            if vcpu.ring_full {
                // It was in the VMM (the exit to user space) until the
                // harvest returned.
                vcpu.ring_full = false;
                vcpu.idle_until(now);
            }
        }
        Ok(RingHarvest {
            entries,
            get,
            clear,
        })
    }

    /// Collects slot `id`'s log in its mode and re-arms it: bitmap: get
    /// (which resets and re-protects); manual: get, then clear the whole
    /// slot; ring: harvest every ring and reset (entries of other slots are
    /// dropped: a VMM logging several slots in ring mode harvests with
    /// [`Vm::harvest_dirty_rings`]).
    pub fn collect_dirty_log(&mut self, id: SlotId) -> Result<Collected, DirtyLogError> {
        match self.slot_mode(id)? {
            DirtyLogMode::Bitmap => {
                let got = self.get_dirty_log(id)?;
                Ok(Collected {
                    pages: got.pages,
                    get: got.cost,
                    clear: DirtyLogCost::default(),
                })
            }
            DirtyLogMode::Manual => {
                let got = self.get_dirty_log(id)?;
                let npages = self.logging_slot(id)?.npages;
                let cleared = self.clear_dirty_log(id, 0, npages)?;
                Ok(Collected {
                    pages: got.pages,
                    get: got.cost,
                    clear: cleared.cost,
                })
            }
            DirtyLogMode::Pml => self.collect_pml(id),
            DirtyLogMode::Ring => {
                let harvest = self.harvest_dirty_rings()?;
                let mut pages: Vec<u64> = harvest
                    .entries
                    .iter()
                    .filter(|e| e.slot == id)
                    .map(|e| e.offset)
                    .collect();
                pages.sort_unstable();
                pages.dedup();
                Ok(Collected {
                    pages,
                    get: harvest.get,
                    clear: harvest.clear,
                })
            }
        }
    }

    /// Entries now in vCPU `vcpu`'s dirty ring.
    pub fn dirty_ring_len(&self, vcpu: crate::vcpu::VcpuId) -> usize {
        self.shared.host.dirty_rings.len(vcpu)
    }

    /// Write-protects the resident pages `indexes` of slot `id` (those
    /// mapped by an spte lose hardware W, keep MMU-writable), as the VMM at
    /// the VM's current time; every vCPU flushes if any spte changed.
    fn protect(&mut self, id: SlotId, indexes: &[u64]) -> Result<DirtyLogCost, DirtyLogError> {
        self.clear_spte_bits(id, indexes, spte::WRITE)
    }

    /// PML: clears the EPT dirty bit of the resident pages `indexes` of
    /// slot `id` (the sptes stay writable), so the CPU logs each page at
    /// its next write; every vCPU flushes if any spte changed (a cached
    /// translation that knows D is set would let a write through
    /// unlogged).
    fn clean(&mut self, id: SlotId, indexes: &[u64]) -> Result<DirtyLogCost, DirtyLogError> {
        self.clear_spte_bits(id, indexes, spte::DIRTY)
    }

    /// KVM_RESET_DIRTY_RINGS for slot `id`'s harvested `pages`
    /// (ascending): write-protects them in one `mmu_lock` hold per run of
    /// at most 64 pages (KVM's `kvm_reset_dirty_gfn` takes the lock once
    /// per coalesced 64-page mask, `virt/kvm/dirty_ring.c`), so vCPUs
    /// faulting meanwhile wait for one mask, not the whole reset; one
    /// remote flush at the end, as `kvm_vm_ioctl_reset_dirty_pages` does.
    fn reset_ring_pages(
        &mut self,
        id: SlotId,
        pages: &[u64],
    ) -> Result<DirtyLogCost, DirtyLogError> {
        let mut cost = DirtyLogCost::default();
        let mut flush = false;
        let mut rest = pages;
        while let Some(&first) = rest.first() {
            let n = rest.partition_point(|&p| p < first + 64);
            let (mask, tail) = rest.split_at(n);
            rest = tail;
            let host = &self.shared.host;
            let slot = host.slots.get(id).ok_or(DirtyLogError::NoSuchSlot(id))?;
            let frames = resident_frames(slot, mask);
            let start = self.vmm_now();
            let done: Protected = host
                .mmu
                .clear_leaf_bits(
                    &host.mem,
                    &host.costs,
                    &frames,
                    spte::WRITE,
                    Timed::At(start),
                )
                .map_err(|e| DirtyLogError::Tdp(crate::mmu::tdp::TdpError::Memory(e)))?;
            self.sched.vmm_busy_until = start + done.cycles;
            cost.cycles += done.cycles;
            cost.lock_wait += done.lock_wait;
            cost.sptes += done.sptes;
            flush |= done.flush;
        }
        if flush {
            let invept = Cycles(self.shared.host.costs.invept);
            cost.cycles += invept;
            self.vmm_spend(invept);
            self.shared.cross.push(CrossRequest::FlushAll);
            self.carry_out_cross_requests();
        }
        Ok(cost)
    }

    fn clear_spte_bits(
        &mut self,
        id: SlotId,
        indexes: &[u64],
        bits: u64,
    ) -> Result<DirtyLogCost, DirtyLogError> {
        let host = &self.shared.host;
        let slot = host.slots.get(id).ok_or(DirtyLogError::NoSuchSlot(id))?;
        let frames = resident_frames(slot, indexes);
        let start = self.vmm_now();
        let at = Timed::At(start);
        let done: Protected = host
            .mmu
            .clear_leaf_bits(&host.mem, &host.costs, &frames, bits, at)
            .map_err(|e| DirtyLogError::Tdp(crate::mmu::tdp::TdpError::Memory(e)))?;
        let mut cycles = done.cycles + Cycles(bitmap_copy_cycles(slot.npages));
        if done.flush {
            cycles += Cycles(host.costs.invept);
            self.shared.cross.push(CrossRequest::FlushAll);
            self.carry_out_cross_requests();
        }
        self.sched.vmm_busy_until = start + cycles;
        Ok(DirtyLogCost {
            cycles,
            lock_wait: done.lock_wait,
            sptes: done.sptes,
        })
    }
}

/// The host frames of the resident pages `indexes` of `slot`.
fn resident_frames(slot: &Memslot, indexes: &[u64]) -> Vec<Hfn> {
    indexes
        .iter()
        .filter_map(|&i| match slot.state_at(i) {
            crate::memslot::PageState::Resident(frame) => Some(frame),
            _ => None,
        })
        .collect()
}

/// Copying a slot's bitmap to or from the VMM: one word per 64 pages.
fn bitmap_copy_cycles(npages: u64) -> u64 {
    npages.div_ceil(64)
}
