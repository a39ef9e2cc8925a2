//! The MMU, split as KVM's `arch/x86/kvm/mmu`:
//! - [`spte`]: the entry layout, every bit documented and overlap-checked;
//! - [`tdp`]: the EPT (TDP) tables;
//! - [`rmap`]: host frame -> sptes, for zapping;
//! - [`fault`]: the EPT-violation handler (demand paging of guest RAM).
//!
//! `mmu_lock` is a real `std::sync::Mutex` around the tables and the rmap.
//! vCPUs run on one host thread today, so it is never contended on the
//! host; contention is modelled in virtual time instead: the lock keeps the
//! virtual-time intervals during which it was recently held
//! ([`LockTimeline`]), and a vCPU asking for it inside one of them waits,
//! in its own virtual time, until that hold ends.

pub mod fault;
pub mod rmap;
pub mod spte;
pub mod tdp;

use machine::vmx::Eptp;
use machine::{Hfn, MemError, PhysMemory};
use std::sync::{Mutex, MutexGuard};

/// State protected by `mmu_lock`.
#[derive(Debug)]
pub struct MmuInner {
    pub root: tdp::TdpRoot,
    pub rmap: rmap::Rmap,
    /// When, in virtual time, the lock was held.
    pub timeline: LockTimeline,
}

/// Recent virtual-time intervals during which `mmu_lock` was held.
///
/// vCPUs interleave in quanta, so a vCPU may take the lock at a virtual
/// time earlier than a hold already recorded by another vCPU; only holds
/// that contain the requested time delay it (a request before a hold
/// would, on real hardware, have won the lock first). Only the last
/// [`LockTimeline::WINDOW`] holds are kept: enough to cover a quantum's
/// worth of faults from every vCPU.
#[derive(Debug, Default)]
pub struct LockTimeline {
    holds: std::collections::VecDeque<(u64, u64)>,
    /// Total virtual cycles vCPUs waited for the lock.
    pub waited: u64,
    /// Acquisitions that had to wait.
    pub contended: u64,
}

impl LockTimeline {
    /// Holds remembered.
    pub const WINDOW: usize = 256;

    /// The virtual time at which a request made at `at` gets the lock.
    pub fn grant(&self, at: u64) -> u64 {
        let mut t = at;
        // Each step moves t to the end of a hold containing it, so this
        // ends after at most WINDOW steps.
        while let Some(&(_, end)) = self
            .holds
            .iter()
            .find(|&&(start, end)| start <= t && t < end)
        {
            t = end;
        }
        t
    }

    /// Records a hold from `start` to `end` that waited `waited` cycles.
    pub fn record(&mut self, start: u64, end: u64, waited: u64) {
        if waited > 0 {
            self.waited += waited;
            self.contended += 1;
        }
        if self.holds.len() == Self::WINDOW {
            self.holds.pop_front();
        }
        self.holds.push_back((start, end));
    }
}

/// The VM's MMU.
#[derive(Debug)]
pub struct Mmu {
    mmu_lock: Mutex<MmuInner>,
    eptp: Eptp,
}

impl Mmu {
    /// An MMU with an empty EPT hierarchy (A/D flags enabled).
    pub fn new(root: tdp::TdpRoot) -> Self {
        let eptp = Eptp::new(root.pml4(), true);
        Mmu {
            mmu_lock: Mutex::new(MmuInner {
                root,
                rmap: rmap::Rmap::default(),
                timeline: LockTimeline::default(),
            }),
            eptp,
        }
    }

    /// The EPT pointer every vCPU uses.
    pub fn eptp(&self) -> Eptp {
        self.eptp
    }

    /// Takes `mmu_lock`. A poisoned lock (a panic while holding it) still
    /// yields the data: the tables are only ever changed by single atomic
    /// stores, so they are consistent at every point.
    pub fn lock(&self) -> MutexGuard<'_, MmuInner> {
        self.mmu_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Removes every spte mapping these frames and returns how many were
    /// cleared. The caller must INVEPT on every vCPU before the frames are
    /// reused.
    pub fn zap_frames(
        &self,
        mem: &PhysMemory,
        frames: impl IntoIterator<Item = Hfn>,
    ) -> Result<u64, MemError> {
        let mut inner = self.lock();
        let mut zapped = 0;
        for frame in frames {
            for at in inner.rmap.take(frame) {
                tdp::write_spte(mem, at, 0)?;
                zapped += 1;
            }
        }
        Ok(zapped)
    }
}

#[cfg(test)]
mod tests {
    use super::LockTimeline;

    #[test]
    fn a_request_inside_a_hold_waits_for_its_end_and_chains() {
        let mut lock = LockTimeline::default();
        lock.record(100, 200, 0);
        lock.record(200, 250, 0);
        assert_eq!(lock.grant(50), 50, "before every hold: no wait");
        assert_eq!(lock.grant(150), 250, "waits through both holds");
        assert_eq!(lock.grant(250), 250, "a hold's end is free");
        lock.record(250, 300, 100);
        assert_eq!((lock.waited, lock.contended), (100, 1));
    }
}
