//! `mmu_lock` and its virtual-time timeline.
//!
//! `mmu_lock` is a real `std::sync::Mutex` around the MMU's tables, page
//! headers, roots and rmap. vCPUs run on one host thread today, so it is
//! never contended on the host; contention is modelled in virtual time
//! instead: the lock keeps the virtual-time intervals during which it was
//! recently held ([`LockTimeline`]), and a request inside one of them
//! waits, in the requester's virtual time, until that hold ends.
//!
//! Every hold goes through [`MmuLock::hold`]: it charges the acquisition,
//! the wait and the work done under the lock (what the holder adds with
//! [`MmuGuard::charge`]), and records the hold on the timeline when the
//! guard drops. There is no other way to reach the protected state.

use super::MmuInner;
use crate::cost::HvCosts;
use crate::time::Cycles;
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

/// Recent virtual-time intervals during which `mmu_lock` was held.
///
/// vCPUs interleave in quanta, so a vCPU may take the lock at a virtual
/// time earlier than a hold already recorded by another vCPU; only holds
/// that contain the requested time delay it (a request before a hold
/// would, on real hardware, have won the lock first). Only the last
/// [`LockTimeline::WINDOW`] holds are kept: enough to cover a quantum's
/// worth of faults from every vCPU.
#[derive(Debug, Default)]
pub(crate) struct LockTimeline {
    holds: VecDeque<(Cycles, Cycles)>,
    /// Total virtual cycles requesters waited for the lock.
    pub waited: Cycles,
    /// Acquisitions that had to wait.
    pub contended: u64,
    /// Acquisitions recorded.
    pub acquisitions: u64,
}

impl LockTimeline {
    /// Holds remembered.
    pub const WINDOW: usize = 256;

    /// The virtual time at which a request made at `at` gets the lock.
    pub fn grant(&self, at: Cycles) -> Cycles {
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
    pub fn record(&mut self, start: Cycles, end: Cycles, waited: Cycles) {
        self.acquisitions += 1;
        if waited > Cycles::ZERO {
            self.waited += waited;
            self.contended += 1;
        }
        if self.holds.len() == Self::WINDOW {
            self.holds.pop_front();
        }
        self.holds.push_back((start, end));
    }
}

/// `mmu_lock`.
#[derive(Debug)]
pub(crate) struct MmuLock {
    mutex: Mutex<MmuInner>,
}

/// Whether a hold is put on the timeline. Every hold is, except those of
/// the hv's own set-up work that no vCPU could be waiting behind (boot,
/// inspection by tests and the invariant checker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timed {
    /// A hold at a virtual time: waits for and delays other holds.
    At(Cycles),
    /// Outside virtual time (inspection, VM set-up and teardown).
    Untimed,
}

/// A hold of `mmu_lock`: derefs to the protected state; records itself on
/// the timeline when dropped.
pub(crate) struct MmuGuard<'a> {
    inner: MutexGuard<'a, MmuInner>,
    hold: Hold,
}

#[derive(Debug, Clone, Copy)]
struct Hold {
    /// On the timeline (false: [`Timed::Untimed`]).
    timed: bool,
    granted: Cycles,
    waited: Cycles,
    acquire: Cycles,
    held: Cycles,
}

impl MmuLock {
    pub fn new(inner: MmuInner) -> Self {
        MmuLock {
            mutex: Mutex::new(inner),
        }
    }

    /// Takes `mmu_lock` for work requested at `when`. A poisoned lock (a
    /// panic while holding it) still yields the data: the tables are only
    /// ever changed by single atomic stores, so they are consistent at
    /// every point.
    pub fn hold(&self, when: Timed, costs: &HvCosts) -> MmuGuard<'_> {
        let inner = self
            .mutex
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let hold = match when {
            Timed::Untimed => Hold {
                timed: false,
                granted: Cycles::ZERO,
                waited: Cycles::ZERO,
                acquire: Cycles::ZERO,
                held: Cycles::ZERO,
            },
            Timed::At(now) => {
                let acquire = Cycles(costs.lock_acquire);
                let requested = now + acquire;
                let granted = inner.timeline.grant(requested);
                Hold {
                    timed: true,
                    granted,
                    waited: granted - requested,
                    acquire,
                    held: Cycles::ZERO,
                }
            }
        };
        MmuGuard { inner, hold }
    }
}

impl MmuGuard<'_> {
    /// Adds `cycles` of work done under the lock (it lengthens the hold).
    pub fn charge(&mut self, cycles: u64) {
        self.hold.held += Cycles(cycles);
    }

    /// Virtual cycles spent waiting for the lock.
    pub fn waited(&self) -> Cycles {
        self.hold.waited
    }

    /// Everything the holder pays: acquisition, wait and the work under
    /// the lock (an untimed hold: the work only).
    pub fn cycles(&self) -> Cycles {
        self.hold.acquire + self.hold.waited + self.hold.held
    }
}

impl std::ops::Deref for MmuGuard<'_> {
    type Target = MmuInner;
    fn deref(&self) -> &MmuInner {
        &self.inner
    }
}

impl std::ops::DerefMut for MmuGuard<'_> {
    fn deref_mut(&mut self) -> &mut MmuInner {
        &mut self.inner
    }
}

impl Drop for MmuGuard<'_> {
    fn drop(&mut self) {
        let h = self.hold;
        if h.timed {
            self.inner
                .timeline
                .record(h.granted, h.granted + h.held, h.waited);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_inside_a_hold_waits_for_its_end_and_chains() {
        let mut lock = LockTimeline::default();
        lock.record(Cycles(100), Cycles(200), Cycles::ZERO);
        lock.record(Cycles(200), Cycles(250), Cycles::ZERO);
        assert_eq!(lock.grant(Cycles(50)), Cycles(50), "before every hold");
        assert_eq!(lock.grant(Cycles(150)), Cycles(250), "through both");
        assert_eq!(lock.grant(Cycles(250)), Cycles(250), "a hold's end is free");
        lock.record(Cycles(250), Cycles(300), Cycles(100));
        assert_eq!((lock.waited, lock.contended), (Cycles(100), 1));
    }
}
