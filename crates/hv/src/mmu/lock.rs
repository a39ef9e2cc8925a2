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
//!
//! **The lock's cache line.** The seed's KVM (3.x) `mmu_lock` is a ticket
//! spin lock: one cache line that every acquisition and release writes.
//! The timeline remembers which core ([`Core`]: a vCPU's, or the VMM
//! thread's) held the lock, and an acquisition pays what the line costs
//! it on hardware (figures in `crate::cost`, `line_transfer`):
//! - the line last written by **another core** (the last hold that
//!   started before the request was another core's): the atomic that
//!   takes the ticket misses and the line moves over, `line_transfer`
//!   instead of the in-cache `lock_acquire`;
//! - a **contended** acquisition (the request found the lock held) also
//!   waits for the handoff ([`handoff_cycles`]): the release's store must
//!   invalidate every spinning waiter's copy, and the next owner's re-read
//!   is served among the reads of all spinning waiters. The lock is busy
//!   for nobody during the handoff, so it is recorded on the timeline with
//!   the hold it leads to: requests behind wait for it too, which is how a
//!   ticket lock's throughput falls as waiters pile up (Boyd-Wickizer et
//!   al., "Non-scalable locks are dangerous").

use super::MmuInner;
use crate::cost::HvCosts;
use crate::time::Cycles;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    holds: VecDeque<TimedHold>,
    /// The holds of a zap-all teardown (see `super::zap`), laid out ahead
    /// of the vCPUs in virtual time when the operation runs, in start
    /// order. Kept apart from `holds` so a burst of vCPU faults cannot
    /// push them out of the window while vCPUs may still run into them.
    zap_holds: Vec<TimedHold>,
    /// Total virtual cycles requesters waited for the lock.
    pub waited: Cycles,
    /// Acquisitions that had to wait.
    pub contended: u64,
    /// Acquisitions recorded.
    pub acquisitions: u64,
    /// Acquisitions that found the lock's line last written by another
    /// core (contended ones included).
    pub line_transfers: u64,
    /// Of [`LockTimeline::waited`], the handoffs' share.
    pub handoff: Cycles,
}

/// The core that runs hv code which takes `mmu_lock`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Core {
    /// The VMM's thread (dirty-log collection, memslot changes, zap-all)
    /// and the hv's own set-up work.
    #[default]
    Vmm,
    /// A vCPU's: its exit handling, and the pager work done inside it.
    Vcpu(usize),
}

/// A hold on the timeline: the lock was unavailable from `start` (its
/// handoff's start if it waited) to `end`, and `core` took it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimedHold {
    pub start: Cycles,
    pub end: Cycles,
    pub core: Core,
}

/// When a request gets the lock, and what its wait was made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// When the requester holds the lock.
    pub granted: Cycles,
    /// When the lock became unavailable to others for this requester: the
    /// end of the last hold it waited behind (the handoff's start), or
    /// `granted` for a request that did not wait.
    pub busy_from: Cycles,
    /// Of the wait, the time behind zap-all teardown holds.
    pub zap_wait: Cycles,
    /// Of the wait, the handoff.
    pub handoff: Cycles,
}

/// The handoff of a contended ticket lock to the next owner while
/// `spinning` cores (the next owner included) spin on its line.
///
/// The release's store finds the line shared by the spinners and must
/// invalidate their copies before it completes (a store to a Shared line,
/// priced as a transfer), then the next owner's re-read misses and gets
/// the line (a transfer). Every spinner re-reads at once, and the line's
/// reads are served one at a time (Boyd-Wickizer et al., §3: the time to
/// hand a ticket lock over grows linearly with the number of waiting
/// cores), so the next owner waits on average for half of the others:
/// `transfer * (2 + (spinning - 1) / 2)`, in halves to stay exact.
pub(crate) fn handoff_cycles(transfer: u64, spinning: u64) -> u64 {
    transfer * (spinning.max(1) + 3) / 2
}

impl LockTimeline {
    /// Holds remembered.
    pub const WINDOW: usize = 256;

    /// The virtual time at which a request made at `at` gets the lock.
    #[cfg(test)]
    pub fn grant(&self, at: Cycles) -> Cycles {
        self.grant_for(at, Core::Vmm, 0).granted
    }

    /// The core whose hold last took the lock's line before `at` (the
    /// latest start at or before it), if any is remembered.
    pub fn line_owner(&self, at: Cycles) -> Option<Core> {
        self.holds
            .iter()
            .chain(self.zap_holds.iter())
            .filter(|h| h.start <= at)
            .max_by_key(|h| h.start)
            .map(|h| h.core)
    }

    /// The grant of a request made at `at` by `core`, with the handoff of
    /// a contended acquisition priced from `transfer` (a cache-line
    /// transfer, [`handoff_cycles`]).
    ///
    /// A teardown batch delays only the requests made while it holds the
    /// lock: one made earlier was queued before the batch asked for the
    /// lock (the teardown re-asks after each lock break), so a fair lock
    /// serves it first. Pushed past a batch's start by other holds, such a
    /// request would in truth delay the batch, which the teardown, laid
    /// out ahead of time, does not see (see `super::zap`).
    ///
    /// The spinning waiters at the handoff are estimated as this request
    /// plus the other cores whose holds it waited behind after its
    /// arrival (they spun beside it: a ticket lock serves in arrival
    /// order, and a core has one request at a time). Requests that later
    /// vCPUs in the round will make are not known yet; in a steady state
    /// about as many arrive during a wait as were queued at its start.
    pub fn grant_for(&self, at: Cycles, core: Core, transfer: u64) -> Grant {
        let mut t = at;
        let mut zap_wait = Cycles::ZERO;
        let mut spinning_beside: Vec<Core> = Vec::new();
        // The core of the hold the request last waited behind: a handoff
        // moves the line only from another core (a core never spins on
        // its own hold; such overlaps come from holds laid out ahead of
        // time, as an eviction batch's or the set-up's).
        let mut behind = core;
        // Each step moves t to the end of a hold, later than t, so this
        // ends after at most one step per remembered hold.
        loop {
            let handoff = if t > at && behind != core {
                Cycles(handoff_cycles(transfer, 1 + spinning_beside.len() as u64))
            } else {
                Cycles::ZERO
            };
            // A hold that takes the lock before the handoff to this
            // requester completes got it first.
            let reach = t + handoff;
            if let Some(h) = self.holds.iter().find(|h| h.start <= reach && t < h.end) {
                if t > at && h.core != core && !spinning_beside.contains(&h.core) {
                    spinning_beside.push(h.core);
                }
                behind = h.core;
                t = h.end;
                continue;
            }
            if let Some(h) = self.zap_hold_containing(t, at) {
                zap_wait += h.end - t;
                behind = h.core;
                t = h.end;
                continue;
            }
            return Grant {
                granted: reach,
                busy_from: t,
                zap_wait,
                handoff,
            };
        }
    }

    /// The zap hold containing `t` that started no later than
    /// `requested`, if any (they never overlap, so the last one starting
    /// at or before `t` is the only candidate).
    fn zap_hold_containing(&self, t: Cycles, requested: Cycles) -> Option<TimedHold> {
        let after = self.zap_holds.partition_point(|h| h.start <= t);
        let h = self.zap_holds[..after].last()?;
        (t < h.end && h.start <= requested).then_some(*h)
    }

    /// Puts a teardown batch's hold on the timeline; batches are recorded
    /// in time order.
    pub fn record_zap_hold(&mut self, start: Cycles, end: Cycles, core: Core) {
        debug_assert!(self.zap_holds.last().is_none_or(|h| h.end <= start));
        self.acquisitions += 1;
        self.zap_holds.push(TimedHold { start, end, core });
    }

    /// Forgets teardown holds that ended before `t` (no vCPU clock is
    /// earlier).
    pub fn forget_zap_holds_before(&mut self, t: Cycles) {
        self.zap_holds.retain(|h| h.end > t);
    }

    /// Records a hold by `core` that made the lock unavailable from
    /// `start` (its handoff's start if it waited) to `end`, after waiting
    /// `waited` cycles.
    pub fn record(&mut self, start: Cycles, end: Cycles, waited: Cycles, core: Core) {
        self.acquisitions += 1;
        if waited > Cycles::ZERO {
            self.waited += waited;
            self.contended += 1;
        }
        if self.holds.len() == Self::WINDOW {
            self.holds.pop_front();
        }
        self.holds.push_back(TimedHold { start, end, core });
    }
}

/// `mmu_lock`.
#[derive(Debug)]
pub(crate) struct MmuLock {
    mutex: Mutex<MmuInner>,
    /// The core running hv code now (0: the VMM thread; v + 1: vCPU v),
    /// set by the scheduler around each vCPU's turn: the holder a timed
    /// hold is recorded for.
    running: AtomicUsize,
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
    core: Core,
    /// See [`Grant::busy_from`].
    busy_from: Cycles,
    granted: Cycles,
    waited: Cycles,
    /// Of `waited`, behind zap-all teardown holds.
    zap_waited: Cycles,
    /// Of `waited`, the handoff.
    handoff: Cycles,
    /// Taking the ticket: `lock_acquire`, or `line_transfer` when another
    /// core wrote the line last.
    acquire: Cycles,
    /// The line came from another core.
    transferred: bool,
    held: Cycles,
}

impl MmuLock {
    pub fn new(inner: MmuInner) -> Self {
        MmuLock {
            mutex: Mutex::new(inner),
            running: AtomicUsize::new(0),
        }
    }

    /// Timed holds from now on are `core`'s (see [`Core`]).
    pub fn set_running(&self, core: Core) {
        let v = match core {
            Core::Vmm => 0,
            Core::Vcpu(v) => v + 1,
        };
        self.running.store(v, Ordering::Relaxed);
    }

    /// The core running hv code now.
    pub fn running(&self) -> Core {
        match self.running.load(Ordering::Relaxed) {
            0 => Core::Vmm,
            v => Core::Vcpu(v - 1),
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
                core: Core::Vmm,
                busy_from: Cycles::ZERO,
                granted: Cycles::ZERO,
                waited: Cycles::ZERO,
                zap_waited: Cycles::ZERO,
                handoff: Cycles::ZERO,
                acquire: Cycles::ZERO,
                transferred: false,
                held: Cycles::ZERO,
            },
            Timed::At(now) => {
                let core = self.running();
                // The ticket's atomic: in cache if this core wrote the
                // line last (or no hold is remembered), else the line
                // moves over and the atomic costs the transfer.
                let transferred = inner.timeline.line_owner(now).is_some_and(|c| c != core);
                let acquire = Cycles(if transferred {
                    costs.line_transfer
                } else {
                    costs.lock_acquire
                });
                let requested = now + acquire;
                let grant = inner
                    .timeline
                    .grant_for(requested, core, costs.line_transfer);
                Hold {
                    timed: true,
                    zap: false,
                    core,
                    busy_from: grant.busy_from,
                    granted: grant.granted,
                    waited: grant.granted - requested,
                    zap_waited: grant.zap_wait,
                    handoff: grant.handoff,
                    acquire,
                    transferred: transferred || grant.handoff > Cycles::ZERO,
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

    /// Virtual cycles spent waiting for the lock (the handoff included).
    pub fn waited(&self) -> Cycles {
        self.hold.waited
    }

    /// What taking the ticket cost (see [`Hold::acquire`]).
    pub fn acquire(&self) -> Cycles {
        self.hold.acquire
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
        if !h.timed {
            return;
        }
        let timeline = &mut self.inner.timeline;
        if h.transferred {
            timeline.line_transfers += 1;
        }
        timeline.handoff += h.handoff;
        if h.zap {
            timeline.record_zap_hold(h.busy_from, h.granted + h.held, h.core);
        } else {
            timeline.record(h.busy_from, h.granted + h.held, h.waited, h.core);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The grant with free handoffs, and its wait behind zap holds.
    fn zap_grant(lock: &LockTimeline, at: Cycles) -> (Cycles, Cycles) {
        let g = lock.grant_for(at, Core::Vmm, 0);
        (g.granted, g.zap_wait)
    }

    #[test]
    fn a_request_inside_a_hold_waits_for_its_end_and_chains() {
        let mut lock = LockTimeline::default();
        lock.record(Cycles(100), Cycles(200), Cycles::ZERO, Core::Vmm);
        lock.record(Cycles(200), Cycles(250), Cycles::ZERO, Core::Vmm);
        assert_eq!(lock.grant(Cycles(50)), Cycles(50), "before every hold");
        assert_eq!(lock.grant(Cycles(150)), Cycles(250), "through both");
        assert_eq!(lock.grant(Cycles(250)), Cycles(250), "a hold's end is free");
        lock.record(Cycles(250), Cycles(300), Cycles(100), Core::Vmm);
        assert_eq!((lock.waited, lock.contended), (Cycles(100), 1));
    }

    #[test]
    fn a_request_waits_for_the_zap_batch_it_falls_in_but_not_the_next() {
        let mut lock = LockTimeline::default();
        // Two teardown batches with a lock break between them.
        lock.record_zap_hold(Cycles(1000), Cycles(2000), Core::Vmm);
        lock.record_zap_hold(Cycles(2025), Cycles(3000), Core::Vmm);
        assert_eq!(zap_grant(&lock, Cycles(999)), (Cycles(999), Cycles::ZERO));
        assert_eq!(zap_grant(&lock, Cycles(1500)), (Cycles(2000), Cycles(500)));
        assert_eq!(zap_grant(&lock, Cycles(2010)), (Cycles(2010), Cycles::ZERO));
        assert_eq!(zap_grant(&lock, Cycles(2025)), (Cycles(3000), Cycles(975)));
        // A request queued before a batch asked for the lock is served
        // before it, even when other holds keep it waiting into the
        // batch.
        lock.record(Cycles(900), Cycles(1100), Cycles::ZERO, Core::Vmm);
        assert_eq!(zap_grant(&lock, Cycles(950)), (Cycles(1100), Cycles::ZERO));
        // One made during a batch waits for it, and for a vCPU hold that
        // got in at the lock break, but not for the next batch.
        lock.record(Cycles(2000), Cycles(2100), Cycles::ZERO, Core::Vmm);
        assert_eq!(zap_grant(&lock, Cycles(1500)), (Cycles(2100), Cycles(500)));
        lock.forget_zap_holds_before(Cycles(2010));
        assert_eq!(lock.grant(Cycles(1500)), Cycles(1500));
        assert_eq!(lock.grant(Cycles(2500)), Cycles(3000));
        assert_eq!(
            lock.grant(Cycles(2050)),
            Cycles(3000),
            "made during the second batch: behind the vCPU hold, then the batch"
        );
    }

    #[test]
    fn a_contended_handoff_costs_two_transfers_plus_half_a_transfer_per_other_spinner() {
        assert_eq!(handoff_cycles(110, 1), 220);
        assert_eq!(handoff_cycles(110, 3), 330);
        assert_eq!(handoff_cycles(110, 5), 440);
        let mut lock = LockTimeline::default();
        lock.record(Cycles(100), Cycles(200), Cycles::ZERO, Core::Vcpu(0));
        // vCPU 1 asks during vCPU 0's hold: it gets the lock a handoff
        // (one spinner: two transfers) after the release.
        let g = lock.grant_for(Cycles(150), Core::Vcpu(1), 110);
        assert_eq!(
            (g.busy_from, g.granted, g.handoff),
            (Cycles(200), Cycles(420), Cycles(220))
        );
        lock.record(
            g.busy_from,
            g.granted + Cycles(100),
            g.granted - Cycles(150),
            Core::Vcpu(1),
        );
        // The handoff was the lock's: a request falling in it waits for
        // the hold it led to, then its own handoff, with vCPU 1 counted
        // as a spinner beside it.
        let g = lock.grant_for(Cycles(300), Core::Vcpu(2), 110);
        assert_eq!((g.busy_from, g.granted), (Cycles(520), Cycles(520 + 220)));
        let g = lock.grant_for(Cycles(150), Core::Vcpu(2), 110);
        assert_eq!(g.busy_from, Cycles(520), "behind both holds");
        assert_eq!(
            g.handoff,
            Cycles(handoff_cycles(110, 2)),
            "vCPU 1 spun beside it"
        );
        // Uncontended: no handoff; free handoffs leave the old timeline.
        assert_eq!(
            lock.grant_for(Cycles(50), Core::Vcpu(2), 110).granted,
            Cycles(50)
        );
        assert_eq!(lock.grant(Cycles(150)), Cycles(520));
        // A core's request inside its own hold (laid out ahead) waits for
        // it but takes no handoff: the line never left.
        let g = lock.grant_for(Cycles(150), Core::Vcpu(0), 110);
        assert_eq!(g.busy_from, Cycles(520), "behind vCPU 1's hold");
        let mut own = LockTimeline::default();
        own.record(Cycles(100), Cycles(200), Cycles::ZERO, Core::Vcpu(0));
        let g = own.grant_for(Cycles(150), Core::Vcpu(0), 110);
        assert_eq!((g.granted, g.handoff), (Cycles(200), Cycles::ZERO));
    }

    #[test]
    fn the_lines_owner_is_the_core_whose_hold_started_last_before_the_request() {
        let mut lock = LockTimeline::default();
        assert_eq!(lock.line_owner(Cycles(1000)), None, "nothing remembered");
        lock.record(Cycles(100), Cycles(200), Cycles::ZERO, Core::Vcpu(0));
        lock.record(Cycles(500), Cycles(600), Cycles::ZERO, Core::Vcpu(1));
        lock.record_zap_hold(Cycles(300), Cycles(400), Core::Vmm);
        assert_eq!(lock.line_owner(Cycles(50)), None);
        assert_eq!(lock.line_owner(Cycles(250)), Some(Core::Vcpu(0)));
        assert_eq!(lock.line_owner(Cycles(450)), Some(Core::Vmm));
        assert_eq!(lock.line_owner(Cycles(700)), Some(Core::Vcpu(1)));
    }
}
