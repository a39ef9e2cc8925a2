//! Dirty logging (KVM's `KVM_MEM_LOG_DIRTY_PAGES`, `KVM_GET_DIRTY_LOG`,
//! `KVM_CLEAR_DIRTY_LOG` and the dirty ring, `virt/kvm/dirty_ring.c`).
//!
//! A memslot with logging on has a [`DirtyBitmap`] (one bit per page).
//! How pages get into the log depends on the [`DirtyLogMode`]:
//! - **write protection** (bitmap, manual protect, ring): every leaf spte
//!   of the slot has its hardware W bit cleared and keeps `MMU_WRITABLE`;
//!   the first write faults, the fault marks the page ([`mark_page_dirty`])
//!   and makes the spte writable again. Collection re-protects what it
//!   reports (bitmap: at get; manual: at the explicit clear; ring: at the
//!   reset after a harvest);
//! - **PML** (EPT with A/D flags only): sptes stay writable with their EPT
//!   dirty bit clear; the CPU logs the gpa of every page whose dirty bit
//!   it sets in the vCPU's page-modification log ([`drain_pml`] moves a
//!   log into the slots' bitmaps: at every exit, a PML-full exit
//!   included, and at every collection); collection clears the dirty
//!   bits of the pages it returns.
//!
//! [`mark_page_dirty`] is the one way into a log: the slow path, the hv's
//! own stores into guest memory and the lockless fast path all call it.
//! It takes only shared references (the bitmap is atomic, each ring has
//! its own small lock) so the fast path can call it without `mmu_lock`.

use super::lock::Timed;
use super::Mmu;
use crate::cost::HvCosts;
use crate::ids::VcpuId;
pub use crate::memslot::dirty_bitmap::DirtyLogMode;
pub(crate) use crate::memslot::dirty_bitmap::{DirtyBitmap, SlotLog};
use crate::memslot::{Memslots, SlotId};
use crate::time::Cycles;
use machine::Gfn;
use machine::{Hfn, MemError, PhysMemory};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use thiserror::Error;

/// Why a dirty-log operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DirtyLogError {
    #[error("no memslot {0}")]
    NoSuchSlot(crate::memslot::SlotId),
    #[error("dirty logging is not enabled on memslot {0}")]
    NotEnabled(crate::memslot::SlotId),
    #[error("dirty logging is already enabled on memslot {0}")]
    AlreadyEnabled(crate::memslot::SlotId),
    #[error("memslot {0} is read-only: nothing to log")]
    ReadOnly(crate::memslot::SlotId),
    #[error("memslot {slot} logs in {actual} mode, not {wanted}")]
    WrongMode {
        slot: crate::memslot::SlotId,
        actual: &'static str,
        wanted: &'static str,
    },
    #[error("PML needs EPT (the MMU is shadow)")]
    PmlNeedsEpt,
    #[error("PML needs the EPT accessed/dirty flags (--ept-ad is off)")]
    PmlNeedsEptAd,
    #[error("no host frame for a vCPU's page-modification log: {0}")]
    PmlPage(#[from] crate::frames::OutOfFrames),
    #[error("dirty logging needs memory virtualisation (--mmu none maps nothing it could write-protect)")]
    Native,
    #[error("pages {first}..{end} are outside memslot {slot} of {npages} pages")]
    BadRange {
        slot: crate::memslot::SlotId,
        first: u64,
        end: u64,
        npages: u64,
    },
    #[error("write-protecting: {0}")]
    Tdp(#[from] super::tdp::TdpError),
}

/// One entry of a dirty ring (KVM's `struct kvm_dirty_gfn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct DirtyGfn {
    pub slot: SlotId,
    /// Page index in the slot.
    pub offset: u64,
}

/// Room kept in a ring after its soft limit: the marks one exit can make
/// after the ring went soft-full (KVM's `kvm_dirty_ring_get_rsvd_entries`).
pub const RING_RESERVED: usize = 64;

/// A vCPU's dirty ring.
#[derive(Debug, Default)]
struct Ring {
    entries: VecDeque<DirtyGfn>,
}

/// The dirty rings of the VM's vCPUs, and which vCPU is running (the ring
/// a mark goes to).
#[derive(Debug)]
pub(crate) struct DirtyRings {
    rings: Vec<Mutex<Ring>>,
    /// Entries per ring.
    capacity: usize,
    /// A vCPU whose ring holds this many entries exits (ring full) before
    /// its next entry.
    soft_limit: usize,
    /// The vCPU whose exit is being handled, plus one (0: none, the hv's
    /// own store).
    running: AtomicU64,
    /// Some ring reached its soft limit.
    any_full: AtomicBool,
}

impl DirtyRings {
    /// Rings of `capacity` entries for `vcpus` vCPUs (`capacity` at least
    /// twice [`RING_RESERVED`]).
    pub fn new(vcpus: usize, capacity: usize) -> Self {
        let capacity = capacity.max(2 * RING_RESERVED);
        DirtyRings {
            rings: (0..vcpus).map(|_| Mutex::new(Ring::default())).collect(),
            capacity,
            soft_limit: capacity - RING_RESERVED,
            running: AtomicU64::new(0),
            any_full: AtomicBool::new(false),
        }
    }

    /// Marks now go to `vcpu`'s ring (`None`: the hv's own, to the bitmap).
    pub fn set_running(&self, vcpu: Option<VcpuId>) {
        let v = vcpu.map_or(0, |v| v.0 as u64 + 1);
        self.running.store(v, Ordering::Relaxed);
    }

    fn running(&self) -> Option<usize> {
        match self.running.load(Ordering::Relaxed) {
            0 => None,
            v => Some(v as usize - 1),
        }
    }

    /// Pushes to the running vCPU's ring; false if there is no running
    /// vCPU or its ring is full (the caller logs in the bitmap instead).
    fn push(&self, entry: DirtyGfn) -> bool {
        let Some(ring) = self.running().and_then(|v| self.rings.get(v)) else {
            return false;
        };
        let mut ring = ring.lock().unwrap_or_else(|e| e.into_inner());
        if ring.entries.len() >= self.capacity {
            return false;
        }
        ring.entries.push_back(entry);
        if ring.entries.len() >= self.soft_limit {
            self.any_full.store(true, Ordering::Release);
        }
        true
    }

    /// Whether `vcpu`'s ring reached its soft limit (it must not enter
    /// until harvested).
    pub fn is_soft_full(&self, vcpu: VcpuId) -> bool {
        self.any_full.load(Ordering::Acquire)
            && self.rings.get(vcpu.0).is_some_and(|r| {
                r.lock().unwrap_or_else(|e| e.into_inner()).entries.len() >= self.soft_limit
            })
    }

    /// Takes every entry of `vcpu`'s ring, oldest first.
    pub fn harvest(&self, vcpu: VcpuId) -> Vec<DirtyGfn> {
        let Some(ring) = self.rings.get(vcpu.0) else {
            return Vec::new();
        };
        let taken: Vec<DirtyGfn> = ring
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .drain(..)
            .collect();
        let still_full = (0..self.rings.len()).any(|v| self.is_full_now(v));
        self.any_full.store(still_full, Ordering::Release);
        taken
    }

    fn is_full_now(&self, v: usize) -> bool {
        self.rings[v]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .len()
            >= self.soft_limit
    }

    /// Entries in `vcpu`'s ring now.
    pub fn len(&self, vcpu: VcpuId) -> usize {
        self.rings.get(vcpu.0).map_or(0, |r| {
            r.lock().unwrap_or_else(|e| e.into_inner()).entries.len()
        })
    }
}

/// Marks `gfn` dirty in its slot's log, if the slot logs: in the running
/// vCPU's ring under [`DirtyLogMode::Ring`] (the bitmap when there is no
/// running vCPU or its ring is full), else in the bitmap. Returns whether
/// the page is logged (false: no slot, or logging off). Needs no lock.
pub(crate) fn mark_page_dirty(slots: &Memslots, rings: &DirtyRings, gfn: Gfn) -> bool {
    let Some(slot) = slots.lookup(gfn) else {
        return false;
    };
    let Some(log) = slot.dirty_log.as_ref() else {
        return false;
    };
    let offset = slot.index_of(gfn);
    if log.mode == DirtyLogMode::Ring
        && rings.push(DirtyGfn {
            slot: slot.id,
            offset,
        })
    {
        return true;
    }
    log.bitmap.set(offset);
    true
}

/// What draining a page-modification log did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PmlDrain {
    /// Entries read from the log.
    pub entries: u64,
    /// Of which pages of slots logging in PML mode (marked in their
    /// bitmaps; the rest are first writes elsewhere, which PML logs too).
    pub marked: u64,
}

/// The entries of a page-modification log whose PML index is `index`,
/// in the order the CPU wrote them (511 down; KVM's
/// `vmx_flush_pml_buffer`): the log is empty at
/// [`machine::vmx::PML_HEAD_INDEX`] and full once the index left 0..=511.
pub(crate) fn pml_entries(index: u16) -> std::ops::RangeInclusive<u16> {
    use machine::vmx::{PML_ENTRIES, PML_HEAD_INDEX};
    let tail = if index >= PML_ENTRIES { 0 } else { index + 1 };
    // An empty log gives an empty range (512..=511).
    tail..=PML_HEAD_INDEX
}

/// Moves the entries of the page-modification log at `log` (PML index
/// `index`) into the bitmaps of the slots that log in PML mode. The
/// caller resets the index and charges the work: each entry is one read
/// and one `mark_page_dirty` (KVM's `kvm_vcpu_mark_page_dirty`).
pub(crate) fn drain_pml(
    mem: &PhysMemory,
    slots: &Memslots,
    log: machine::Hpa,
    index: u16,
) -> Result<PmlDrain, MemError> {
    let mut drain = PmlDrain::default();
    for i in pml_entries(index).rev() {
        let gpa = machine::Gpa(mem.read_u64(log.add(u64::from(i) * 8))?);
        drain.entries += 1;
        let gfn = gpa.frame();
        let Some(slot) = slots.lookup(gfn) else {
            continue;
        };
        if let Some(l) = slot
            .dirty_log
            .as_ref()
            .filter(|l| l.mode == DirtyLogMode::Pml)
        {
            l.bitmap.set(slot.index_of(gfn));
            drain.marked += 1;
        }
    }
    Ok(drain)
}

/// What clearing bits in a set of sptes did, for the caller to charge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Protected {
    /// The hold's cost (acquisition, wait, work).
    pub cycles: Cycles,
    /// Of which waiting for `mmu_lock`.
    pub lock_wait: Cycles,
    /// Leaf sptes that had a bit cleared.
    pub sptes: u64,
    /// A cleared bit may be cached in a TLB: every vCPU flushes.
    pub flush: bool,
}

impl Mmu {
    /// Clears `bits` in every leaf spte mapping one of `frames` (through
    /// the rmap: EPT leaves and shadow leaves alike), under `mmu_lock`
    /// taken `when`. For write protection `bits` is the hardware W bit
    /// (bit 1 in both formats), leaving `MMU_WRITABLE` set so the next
    /// write is a slow-path (or fast-path) fault that logs the page; for
    /// PML it is the EPT dirty bit. A cleared bit that was the frame's
    /// dirtiness (the EPT D bit; W itself with EPT A/D off) stays with the
    /// frame in the rmap, as KVM's `clear_dirty_pt_masked` calls
    /// `kvm_set_pfn_dirty`: the pager must still write the page back.
    pub fn clear_leaf_bits(
        &self,
        mem: &PhysMemory,
        costs: &HvCosts,
        frames: &[Hfn],
        bits: u64,
        when: Timed,
    ) -> Result<Protected, MemError> {
        let dirty_bits = bits & self.dirty_mask();
        use super::fast_pf::protocol::{self, Layout, Protect};
        let layout = match self.mode {
            super::MmuMode::Shadow => Layout::SHADOW,
            // Native maps nothing to log (`DirtyLogError::Native`).
            super::MmuMode::Ept | super::MmuMode::Native => Layout::EPT,
        };
        let mut guard = self.hold(when, costs);
        let mut done = Protected::default();
        let mut work = 0;
        for &frame in frames {
            let mut dirtied = false;
            for &at in guard.rmap.get(frame) {
                let cell = mem.atomic_u64(at)?;
                // Write protection for the log is the lockless protocol's
                // own `write_protect` (the loom-checked code), W only.
                let old = if bits == layout.write {
                    protocol::write_protect(cell, &layout, Protect::DirtyLog)
                } else {
                    cell.fetch_and(!bits, Ordering::AcqRel)
                };
                work += costs.spte_read;
                if old & bits != 0 {
                    work += costs.spte_write;
                    done.sptes += 1;
                    done.flush = true;
                }
                dirtied |= old & dirty_bits != 0;
            }
            if dirtied {
                guard.rmap.note_dropped_bits(frame, self.dirty_mask());
            }
        }
        guard.charge(work);
        done.cycles = guard.cycles();
        done.lock_wait = guard.waited();
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_collects_ranges_and_resets_only_when_asked() {
        let bitmap = DirtyBitmap::new(200);
        for i in [0, 5, 63, 64, 130, 199] {
            assert!(bitmap.set(i));
        }
        assert!(!bitmap.set(5), "already set");
        assert_eq!(bitmap.collect(0, 200, false), [0, 5, 63, 64, 130, 199]);
        assert_eq!(bitmap.collect(5, 131, true), [5, 63, 64, 130]);
        assert_eq!(bitmap.collect(0, 200, false), [0, 199]);
        assert!(!bitmap.get(64));
        assert!(bitmap.get(199));
        assert_eq!(bitmap.collect(0, 1000, true), [0, 199]);
        assert!(bitmap.collect(0, 200, false).is_empty());
    }

    #[test]
    fn pml_entries_run_from_the_head_down_to_the_last_written() {
        assert!(pml_entries(511).is_empty(), "empty log");
        assert_eq!(pml_entries(510), 511..=511);
        assert_eq!(pml_entries(0), 1..=511);
        assert_eq!(pml_entries(0xffff), 0..=511, "full: all 512");
        assert_eq!(pml_entries(600), 0..=511, "any index past 511 is full");
    }

    #[test]
    fn ring_goes_soft_full_and_falls_back_when_full() {
        let rings = DirtyRings::new(2, 2 * RING_RESERVED);
        let entry = |offset| DirtyGfn {
            slot: SlotId(0),
            offset,
        };
        assert!(!rings.push(entry(0)), "no running vCPU: bitmap");
        rings.set_running(Some(VcpuId(1)));
        for i in 0..RING_RESERVED as u64 {
            assert!(rings.push(entry(i)));
        }
        assert!(rings.is_soft_full(VcpuId(1)));
        assert!(!rings.is_soft_full(VcpuId(0)));
        for i in 0..RING_RESERVED as u64 {
            assert!(rings.push(entry(i)));
        }
        assert!(!rings.push(entry(0)), "full: bitmap");
        assert_eq!(rings.harvest(VcpuId(1)).len(), 2 * RING_RESERVED);
        assert!(!rings.is_soft_full(VcpuId(1)));
        assert_eq!(rings.len(VcpuId(1)), 0);
    }
}
