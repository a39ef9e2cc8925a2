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
    /// The holds of a zap-all teardown (see `super::zap`), laid out ahead
    /// of the vCPUs in virtual time when the operation runs, in start
    /// order. Kept apart from `holds` so a burst of vCPU faults cannot
    /// push them out of the window while vCPUs may still run into them.
    zap_holds: Vec<(Cycles, Cycles)>,
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
    #[cfg(test)]
    pub fn grant(&self, at: Cycles) -> Cycles {
        self.grant_with_zap_wait(at).0
    }

    /// The grant time of a request made at `at`, and how much of the wait
    /// was spent behind zap-all teardown holds.
    ///
    /// A teardown batch delays only the requests made while it holds the
    /// lock: one made earlier was queued before the batch asked for the
    /// lock (the teardown re-asks after each lock break), so a fair lock
    /// serves it first. Pushed past a batch's start by other holds, such a
    /// request would in truth delay the batch, which the teardown, laid
    /// out ahead of time, does not see (see `super::zap`).
    pub fn grant_with_zap_wait(&self, at: Cycles) -> (Cycles, Cycles) {
        let mut t = at;
        let mut zap_wait = Cycles::ZERO;
        // Each step moves t to the end of a hold containing it, so this
        // ends after at most one step per remembered hold.
        loop {
            if let Some(&(_, end)) = self
                .holds
                .iter()
                .find(|&&(start, end)| start <= t && t < end)
            {
                t = end;
                continue;
            }
            if let Some(end) = self.zap_hold_containing(t, at) {
                zap_wait += end - t;
                t = end;
                continue;
            }
            return (t, zap_wait);
        }
    }

    /// The end of the zap hold containing `t` that started no later than
    /// `requested`, if any (they never overlap, so the last one starting
    /// at or before `t` is the only candidate).
    fn zap_hold_containing(&self, t: Cycles, requested: Cycles) -> Option<Cycles> {
        let after = self.zap_holds.partition_point(|&(start, _)| start <= t);
        let &(start, end) = self.zap_holds[..after].last()?;
        (t < end && start <= requested).then_some(end)
    }

    /// Puts a teardown batch's hold on the timeline; batches are recorded
    /// in time order.
    pub fn record_zap_hold(&mut self, start: Cycles, end: Cycles) {
        debug_assert!(self.zap_holds.last().is_none_or(|&(_, e)| e <= start));
        self.acquisitions += 1;
        self.zap_holds.push((start, end));
    }

    /// Forgets teardown holds that ended before `t` (no vCPU clock is
    /// earlier).
    pub fn forget_zap_holds_before(&mut self, t: Cycles) {
        self.zap_holds.retain(|&(_, end)| end > t);
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
    /// A zap-all teardown hold (recorded apart, see [`LockTimeline`]).
    zap: bool,
    granted: Cycles,
    waited: Cycles,
    /// Of `waited`, behind zap-all teardown holds.
    zap_waited: Cycles,
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
                zap: false,
                granted: Cycles::ZERO,
                waited: Cycles::ZERO,
                zap_waited: Cycles::ZERO,
                acquire: Cycles::ZERO,
                held: Cycles::ZERO,
            },
            Timed::At(now) => {
                let acquire = Cycles(costs.lock_acquire);
                let requested = now + acquire;
                let (granted, zap_waited) = inner.timeline.grant_with_zap_wait(requested);
                Hold {
                    timed: true,
                    zap: false,
                    granted,
                    waited: granted - requested,
                    zap_waited,
                    acquire,
                    held: Cycles::ZERO,
                }
            }
        };
        MmuGuard { inner, hold }
    }
}

impl MmuLock {
    /// Takes `mmu_lock` at `at` for a batch of a zap-all teardown: a timed
    /// hold kept on the timeline apart from the others.
    pub fn hold_for_zap(&self, at: Cycles, costs: &HvCosts) -> MmuGuard<'_> {
        let mut guard = self.hold(Timed::At(at), costs);
        guard.hold.zap = true;
        guard
    }
}

impl MmuGuard<'_> {
    /// The work charged so far under the lock.
    pub fn held(&self) -> Cycles {
        self.hold.held
    }

    /// Adds `cycles` of work done under the lock (it lengthens the hold).
    pub fn charge(&mut self, cycles: u64) {
        self.hold.held += Cycles(cycles);
    }

    /// Virtual cycles spent waiting for the lock.
    pub fn waited(&self) -> Cycles {
        self.hold.waited
    }

    /// Of [`MmuGuard::waited`], the part spent behind zap-all teardown
    /// holds (what a zap-all costs the vCPUs).
    pub fn zap_waited(&self) -> Cycles {
        self.hold.zap_waited
    }

    /// When the holder got the lock (zero for an untimed hold).
    pub fn granted(&self) -> Cycles {
        self.hold.granted
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
        if h.zap {
            self.inner
                .timeline
                .record_zap_hold(h.granted, h.granted + h.held);
        } else if h.timed {
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

    #[test]
    fn a_request_waits_for_the_zap_batch_it_falls_in_but_not_the_next() {
        let mut lock = LockTimeline::default();
        // Two teardown batches with a lock break between them.
        lock.record_zap_hold(Cycles(1000), Cycles(2000));
        lock.record_zap_hold(Cycles(2025), Cycles(3000));
        assert_eq!(
            lock.grant_with_zap_wait(Cycles(999)),
            (Cycles(999), Cycles::ZERO)
        );
        assert_eq!(
            lock.grant_with_zap_wait(Cycles(1500)),
            (Cycles(2000), Cycles(500))
        );
        assert_eq!(
            lock.grant_with_zap_wait(Cycles(2010)),
            (Cycles(2010), Cycles::ZERO)
        );
        assert_eq!(
            lock.grant_with_zap_wait(Cycles(2025)),
            (Cycles(3000), Cycles(975))
        );
        // A request queued before a batch asked for the lock is served
        // before it, even when other holds keep it waiting into the
        // batch.
        lock.record(Cycles(900), Cycles(1100), Cycles::ZERO);
        assert_eq!(
            lock.grant_with_zap_wait(Cycles(950)),
            (Cycles(1100), Cycles::ZERO)
        );
        // One made during a batch waits for it, and for a vCPU hold that
        // got in at the lock break, but not for the next batch.
        lock.record(Cycles(2000), Cycles(2100), Cycles::ZERO);
        assert_eq!(
            lock.grant_with_zap_wait(Cycles(1500)),
            (Cycles(2100), Cycles(500))
        );
        lock.forget_zap_holds_before(Cycles(2010));
        assert_eq!(lock.grant(Cycles(1500)), Cycles(1500));
        assert_eq!(lock.grant(Cycles(2500)), Cycles(3000));
        assert_eq!(
            lock.grant(Cycles(2050)),
            Cycles(3000),
            "made during the second batch: behind the vCPU hold, then the batch"
        );
    }
}
