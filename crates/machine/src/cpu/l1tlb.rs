//! The first-level TLB: a small direct-mapped cache of the last
//! translations per access kind, in front of the set-associative
//! [`crate::mmu::tlb::Tlb`] (as the L1 iTLB/dTLB sit in front of the STLB on
//! a real core).
//!
//! It is inclusive and never more permissive than the TLB behind it: an
//! entry records the TLB's epoch and the CPU's mode epoch when it was made,
//! and is used only while neither has changed. Any fill, eviction or
//! invalidation in the TLB, or any change of CR0/CR3/CR4/EFER, CPL,
//! RFLAGS.AC or the VMX controls, therefore empties it at once. Hits here
//! do not update the replacement state of the TLB, exactly as L1 hits do
//! not reach the STLB on hardware.

use crate::addr::Hpa;

pub(crate) const SLOTS: usize = 64;
/// Size of one slot: page, hpa, tlb_epoch, mode_epoch.
pub(crate) const SLOT_BYTES: usize = 32;
const _: () = assert!(std::mem::size_of::<Slot>() == SLOT_BYTES);

/// `repr(C)`: translated code reads slots inline (`jit`), at
/// [`SLOT_BYTES`] per slot, [`SLOTS`] slots per class.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
struct Slot {
    /// Linear page number + 1 (0 = empty).
    page: u64,
    /// Host-physical page base.
    hpa: u64,
    tlb_epoch: u64,
    mode_epoch: u64,
}

/// Per access kind (read, write, execute), for user and supervisor.
#[derive(Debug, Clone)]
pub(crate) struct L1Tlb {
    slots: Box<[[Slot; SLOTS]; 6]>,
}

impl L1Tlb {
    pub(crate) fn new() -> Self {
        L1Tlb {
            slots: Box::new([[Slot::default(); SLOTS]; 6]),
        }
    }

    /// The host-physical address of `la`, if cached for this kind.
    #[inline]
    pub(crate) fn lookup(
        &self,
        class: usize,
        la: u64,
        tlb_epoch: u64,
        mode_epoch: u64,
    ) -> Option<Hpa> {
        let page = (la >> 12) + 1;
        let s = &self.slots[class][(page as usize) & (SLOTS - 1)];
        if s.page == page && s.tlb_epoch == tlb_epoch && s.mode_epoch == mode_epoch {
            Some(Hpa(s.hpa | (la & 0xfff)))
        } else {
            None
        }
    }

    /// The slots' base address: class `c`, slot `i` at
    /// `base + (c * SLOTS + i) * SLOT_BYTES`.
    pub(crate) fn slots_address(&self) -> usize {
        self.slots.as_ptr() as usize
    }

    /// Records a translation the TLB just gave.
    #[inline]
    pub(crate) fn fill(
        &mut self,
        class: usize,
        la: u64,
        hpa: Hpa,
        tlb_epoch: u64,
        mode_epoch: u64,
    ) {
        let page = (la >> 12) + 1;
        self.slots[class][(page as usize) & (SLOTS - 1)] = Slot {
            page,
            hpa: hpa.0 & !0xfff,
            tlb_epoch,
            mode_epoch,
        };
    }
}
