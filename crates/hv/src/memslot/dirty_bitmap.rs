//! A memslot's dirty log (KVM's `kvm_memory_slot.dirty_bitmap`): how its
//! dirty pages are collected and the bitmap they are marked in. The MMU
//! (`mmu::dirty_log`) marks, collects and re-protects through it.

use std::sync::atomic::{AtomicU64, Ordering};

/// How a slot's dirty pages are collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DirtyLogMode {
    /// `KVM_GET_DIRTY_LOG`: get-and-reset, re-protecting what it returns.
    Bitmap,
    /// `KVM_DIRTY_LOG_MANUAL_PROTECT2`: get without re-protecting, then
    /// clear (re-protect) ranges explicitly.
    Manual,
    /// The dirty ring: per-vCPU rings of (slot, offset) the VMM harvests.
    Ring,
    /// Intel page-modification logging: the CPU logs the gpa when it sets
    /// an EPT dirty bit (EPT only).
    Pml,
}

impl DirtyLogMode {
    /// Every mode, in report order.
    pub const ALL: [DirtyLogMode; 4] = [
        DirtyLogMode::Bitmap,
        DirtyLogMode::Manual,
        DirtyLogMode::Ring,
        DirtyLogMode::Pml,
    ];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            DirtyLogMode::Bitmap => "bitmap",
            DirtyLogMode::Manual => "manual",
            DirtyLogMode::Ring => "ring",
            DirtyLogMode::Pml => "pml",
        }
    }

    /// Whether writes are caught by write-protecting sptes (all but PML).
    pub fn write_protects(self) -> bool {
        self != DirtyLogMode::Pml
    }
}

/// One bit per page of a slot, set atomically.
#[derive(Debug, Default)]
pub(crate) struct DirtyBitmap {
    words: Vec<AtomicU64>,
    npages: u64,
}

impl Clone for DirtyBitmap {
    fn clone(&self) -> Self {
        DirtyBitmap {
            words: self
                .words
                .iter()
                .map(|w| AtomicU64::new(w.load(Ordering::Relaxed)))
                .collect(),
            npages: self.npages,
        }
    }
}

impl DirtyBitmap {
    /// A clean bitmap for `npages` pages.
    pub fn new(npages: u64) -> Self {
        DirtyBitmap {
            words: (0..npages.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            npages,
        }
    }

    /// Sets page `index`'s bit; true if it was clear.
    pub fn set(&self, index: u64) -> bool {
        let bit = 1u64 << (index % 64);
        self.words[(index / 64) as usize].fetch_or(bit, Ordering::AcqRel) & bit == 0
    }

    /// Whether page `index` is marked.
    pub fn get(&self, index: u64) -> bool {
        self.words[(index / 64) as usize].load(Ordering::Acquire) & (1 << (index % 64)) != 0
    }

    /// The marked pages of `first..end`, in order; cleared when `reset`.
    pub fn collect(&self, first: u64, end: u64, reset: bool) -> Vec<u64> {
        let mut pages = Vec::new();
        let end = end.min(self.npages);
        let mut index = first;
        while index < end {
            let word = &self.words[(index / 64) as usize];
            let lo = index % 64;
            let hi = (end - (index - lo)).min(64);
            let mask = range_mask(lo, hi);
            let bits = if reset {
                word.fetch_and(!mask, Ordering::AcqRel)
            } else {
                word.load(Ordering::Acquire)
            } & mask;
            let base = index - lo;
            pages.extend((0..64).filter(|b| bits & (1 << b) != 0).map(|b| base + b));
            index = base + 64;
        }
        pages
    }
}

/// Bits `lo..hi` of a word (`hi` at most 64).
fn range_mask(lo: u64, hi: u64) -> u64 {
    let upto = if hi >= 64 { u64::MAX } else { (1 << hi) - 1 };
    upto & !((1u64 << lo) - 1)
}

/// A slot's dirty-log state (present while logging is on).
#[derive(Debug, Clone)]
pub(crate) struct SlotLog {
    pub mode: DirtyLogMode,
    /// Marked pages. Under the ring this holds only what no vCPU's ring
    /// took (the hv's own stores outside a vCPU exit, or a ring that was
    /// already full: KVM's `dirty_ring_with_bitmap`).
    pub bitmap: DirtyBitmap,
}
