//! `mmu_lock` and its virtual-time timeline.
//!
//! `mmu_lock` is a real `std::sync::Mutex` around the MMU's tables, page
//! headers, roots and rmap. vCPUs run on one host thread, so it is never
//! contended on the host; contention is modelled in virtual time instead:
//! requests arrive in virtual-time order (the scheduler handles exits in
//! that order) and the lock serves them first come, first served
//! ([`LockTimeline`]): a request made while the lock is held waits, in
//! the requester's virtual time, for every hold granted before it and
//! the handoff. Holds never overlap.
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
//! - the line last written by **another core** (the last hold granted
//!   was another core's): the atomic that
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

/// `mmu_lock`'s holds in virtual time, granted in one order.
///
/// The scheduler handles exits (and the VMM's work) in virtual-time order
/// (`vm/sched.rs`), so requests reach the lock in that order, and the
/// lock serves them first come, first served, as a ticket lock does: a
/// request waits for the hold in progress and every hold granted before
/// it, then the handoff. A hold never overlaps another
/// ([`LockTimeline::overlaps`], checked). The one approximation: requests
/// are ordered by the exits that make them, so of two exits a few cycles
/// apart, the later one's request can come first in virtual time when
/// the earlier one's handler works longer before asking for the lock; it
/// still waits behind it.
#[derive(Debug, Default)]
pub(crate) struct LockTimeline {
    /// The last [`LockTimeline::WINDOW`] holds in the order granted.
    holds: VecDeque<TimedHold>,
    /// When the lock is next free: the end of the last hold granted.
    free_at: Cycles,
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
    /// Holds recorded while an earlier one had not ended: a broken order
    /// (always 0; with the `order-checks` feature, a panic).
    pub overlaps: u64,
    /// Per vCPU: (acquisitions, contended ones).
    pub per_vcpu: Vec<(u64, u64)>,
    /// Requests that waited behind a hold asked for later than
    /// themselves: served out of first-come order. A fault's first
    /// request waits its turn ([`MmuLock::defer`]), but a handler that
    /// takes the lock many times over a long stretch (the pager's
    /// eviction batch, a shadow CR3 load) makes its later requests ahead
    /// of the other vCPUs' clocks (`docs/design.md`, "What is
    /// approximate"), so this is counted, not ruled out.
    pub inversions: u64,
    /// vCPUs whose fault waits for the lock deferred ([`MmuLock::defer`]),
    /// in ticket order: each holds its place until its replay takes the
    /// lock (or ends without it).
    waiters: Vec<Waiter>,
}

/// A vCPU in the lock's queue (see [`LockTimeline::waiters`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Waiter {
    vcpu: usize,
    /// When it first asked: its place in the queue.
    ticket: Cycles,
    /// The vCPU's clock when it replays its fault.
    replay: Cycles,
    /// The waits it was deferred by, summed.
    waited: Deferral,
}

/// A fault's request that found `mmu_lock` held: the vCPU waits for its
/// grant without taking the lock, and replays the fault at the grant
/// (`docs/design.md`, "Virtual time and the order of events"), so what
/// it does under the lock happens at the grant's virtual time, not when
/// the host happens to process it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Deferral {
    /// From the request to the grant (the handoff included).
    pub wait: Cycles,
    /// Of `wait`, the handoff.
    pub handoff: Cycles,
    /// Of `wait`, behind zap-all teardown holds.
    pub zap_wait: Cycles,
}

/// The core that runs hv code which takes `mmu_lock`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
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
    /// When it was asked for (a replayed fault's: its place in the
    /// queue, when it first asked).
    pub requested: Cycles,
    pub core: Core,
    /// A batch of a zap-all teardown.
    pub zap: bool,
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
    /// It waits behind a hold asked for later than itself: served out
    /// of first-come order (see [`LockTimeline::inversions`]).
    pub served_late: bool,
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
    /// Holds remembered (for the spinners at a handoff and the wait
    /// behind zap batches): more than the cores that can queue at once.
    pub const WINDOW: usize = 256;

    /// The virtual time at which a request made at `at` gets the lock.
    #[cfg(test)]
    pub fn grant(&self, at: Cycles) -> Cycles {
        self.grant_for(at, Core::Vmm, 0).granted
    }

    /// The core whose hold last took the lock's line (the last hold
    /// granted), if any is remembered.
    pub fn line_owner(&self) -> Option<Core> {
        self.holds.back().map(|h| h.core)
    }

    /// The grant of a request made at `at` by `core`, with the handoff of
    /// a contended acquisition priced from `transfer` (a cache-line
    /// transfer, [`handoff_cycles`]).
    ///
    /// A request at or after the lock's release gets it at once. One made
    /// earlier waits to the release of the last hold granted, then the
    /// handoff (none when that hold was its own core's: the line never
    /// left). The spinners at the handoff are this request and the other
    /// cores whose holds it waits behind, apart from the one in progress
    /// when it arrived (they queued before it: a core has one request at
    /// a time).
    pub fn grant_for(&self, at: Cycles, core: Core, transfer: u64) -> Grant {
        let Some(last) = self.holds.back() else {
            return Grant::at_once(at);
        };
        if at >= self.free_at {
            return Grant::at_once(at);
        }
        let mut spinning_beside: Vec<Core> = Vec::new();
        let mut zap_wait = Cycles::ZERO;
        let mut served_late = false;
        for h in self.holds.iter().rev().take_while(|h| h.end > at) {
            served_late |= h.requested > at && h.core != core;
            if h.zap {
                zap_wait += h.end - h.start.max(at);
            }
            if h.start > at && h.core != core && !spinning_beside.contains(&h.core) {
                spinning_beside.push(h.core);
            }
        }
        // vCPUs whose requests wait deferred spin on the line too.
        for w in &self.waiters {
            let waiter = Core::Vcpu(w.vcpu);
            if waiter != core && !spinning_beside.contains(&waiter) {
                spinning_beside.push(waiter);
            }
        }
        let handoff = if last.core != core {
            Cycles(handoff_cycles(transfer, 1 + spinning_beside.len() as u64))
        } else {
            Cycles::ZERO
        };
        Grant {
            granted: self.free_at + handoff,
            busy_from: self.free_at,
            zap_wait,
            handoff,
            served_late,
        }
    }

    /// vCPU `v`'s place in the queue, if it waits.
    fn waiter(&self, v: usize) -> Option<usize> {
        self.waiters.iter().position(|w| w.vcpu == v)
    }

    /// Takes vCPU `v` out of the queue, with what it waited.
    fn leave_queue(&mut self, v: usize) -> Option<Waiter> {
        let at = self.waiter(v)?;
        Some(self.waiters.remove(at))
    }

    /// vCPU `v`'s replay ended without taking the lock (another vCPU's
    /// work made its own unneeded): its wait still counts, as a wait.
    fn end_deferral(&mut self, v: usize) {
        if let Some(Waiter { waited: d, .. }) = self.leave_queue(v) {
            self.waited += d.wait;
            self.handoff += d.handoff;
            self.contended += 1;
            if let Some(per) = self.per_vcpu.get_mut(v) {
                per.1 += 1;
            }
        }
    }

    /// Notes a request that waits behind a hold asked for later than
    /// itself ([`Grant::served_late`]).
    fn note_served_late(&mut self) {
        self.inversions += 1;
    }

    /// Records a hold by `core` that made the lock unavailable from
    /// `start` (its handoff's start if it waited) to `end`, after waiting
    /// `waited` cycles.
    pub fn record(&mut self, mut hold: TimedHold, waited: Cycles) {
        if hold.start < self.free_at {
            self.overlaps += 1;
            if cfg!(feature = "order-checks") {
                panic!(
                    "mmu_lock: a hold from {} overlaps the one before, which ends at {}",
                    hold.start.0, self.free_at.0
                );
            }
        }
        self.acquisitions += 1;
        let mut waited = waited;
        if let Core::Vcpu(v) = hold.core {
            if let Some(w) = self.leave_queue(v) {
                waited += w.waited.wait;
                self.handoff += w.waited.handoff;
                hold.requested = hold.requested.min(w.ticket);
            }
            if self.per_vcpu.len() <= v {
                self.per_vcpu.resize(v + 1, (0, 0));
            }
            self.per_vcpu[v].0 += 1;
            self.per_vcpu[v].1 += u64::from(waited > Cycles::ZERO);
        }
        if waited > Cycles::ZERO {
            self.waited += waited;
            self.contended += 1;
        }
        self.free_at = self.free_at.max(hold.end);
        if self.holds.len() == Self::WINDOW {
            self.holds.pop_front();
        }
        self.holds.push_back(hold);
    }
}

impl Grant {
    /// A request that finds the lock free.
    fn at_once(at: Cycles) -> Grant {
        Grant {
            granted: at,
            busy_from: at,
            zap_wait: Cycles::ZERO,
            handoff: Cycles::ZERO,
            served_late: false,
        }
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
        let mut inner = self
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
                let transferred = inner.timeline.line_owner().is_some_and(|c| c != core);
                let acquire = Cycles(if transferred {
                    costs.line_transfer
                } else {
                    costs.lock_acquire
                });
                let requested = now + acquire;
                let grant = inner
                    .timeline
                    .grant_for(requested, core, costs.line_transfer);
                if grant.served_late {
                    inner.timeline.note_served_late();
                }
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
    /// A vCPU's fault asks for the lock at `now`: if the request would
    /// wait, it is not granted but deferred, and the wait is returned:
    /// the vCPU waits that long and replays the fault, whose request then
    /// finds the lock free (unless another took it meanwhile: it defers
    /// again). Nothing is recorded but the deferral; `None`: the lock is
    /// free at `now`, take it with [`MmuLock::hold`].
    pub fn defer(&self, exit: Cycles, now: Cycles, costs: &HvCosts) -> Option<Deferral> {
        let Core::Vcpu(v) = self.running() else {
            return None;
        };
        let mut inner = self
            .mutex
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let timeline = &mut inner.timeline;
        let core = Core::Vcpu(v);
        let transferred = timeline.line_owner().is_some_and(|c| c != core);
        let acquire = if transferred {
            costs.line_transfer
        } else {
            costs.lock_acquire
        };
        let requested = now + Cycles(acquire);
        let place = timeline.waiter(v);
        let ticket = place.map_or(requested, |p| timeline.waiters[p].ticket);
        let grant = timeline.grant_for(requested, core, costs.line_transfer);
        // A waiter ahead (an earlier ticket) takes the lock first; its
        // hold's length is known only when it replays, so this one replays
        // after it has (it then finds the hold on the timeline).
        let ahead = timeline
            .waiters
            .iter()
            .filter(|w| w.vcpu != v && (w.ticket, w.vcpu) < (ticket, v))
            .map(|w| w.replay)
            .max();
        let mut until = grant.granted;
        if let Some(ahead) = ahead {
            until = until.max(requested + (ahead + Cycles(1)).saturating_sub(exit));
        }
        if until <= requested {
            return None;
        }
        let wait = Deferral {
            wait: until - requested,
            handoff: if until == grant.granted {
                grant.handoff
            } else {
                Cycles::ZERO
            },
            zap_wait: grant.zap_wait,
        };
        let replay = exit + wait.wait;
        match place {
            Some(p) => {
                let w = &mut timeline.waiters[p];
                w.replay = replay;
                w.waited.wait += wait.wait;
                w.waited.handoff += wait.handoff;
                w.waited.zap_wait += wait.zap_wait;
            }
            None => {
                let w = Waiter {
                    vcpu: v,
                    ticket,
                    replay,
                    waited: wait,
                };
                let at = timeline
                    .waiters
                    .iter()
                    .position(|o| (o.ticket, o.vcpu) > (ticket, v))
                    .unwrap_or(timeline.waiters.len());
                timeline.waiters.insert(at, w);
            }
        }
        Some(wait)
    }

    /// vCPU `v`'s replayed fault ended without taking the lock.
    pub fn end_deferral(&self, v: usize) {
        self.mutex
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .timeline
            .end_deferral(v);
    }

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
        let hold = TimedHold {
            start: h.busy_from,
            end: h.granted + h.held,
            requested: h.granted - h.waited,
            core: h.core,
            zap: h.zap,
        };
        timeline.record(hold, h.waited);
    }
}

/// `mmu_lock`'s own counters, over every core that took it (vCPUs and
/// the VMM's thread): how often it was taken, how often a taker waited,
/// how often its cache line came from another core, and how much of the
/// waiting was the ticket lock's handoff (`mmu::lock`, `docs/mmu.md`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MmuLockStats {
    /// Timed acquisitions (hv work in virtual time).
    pub acquisitions: u64,
    /// Acquisitions that had to wait.
    pub contended: u64,
    /// Acquisitions that found the lock's line last written by another
    /// core (the contended ones included).
    pub line_transfers: u64,
    /// Virtual cycles takers waited, in all.
    pub waited_cycles: u64,
    /// Of `waited_cycles`, the handoffs' share.
    pub handoff_cycles: u64,
    /// Holds that overlapped the one before (a broken order; always 0).
    #[serde(default)]
    pub overlaps: u64,
    /// Requests made earlier in virtual time than one that reached the
    /// lock before them (`mmu::lock`): served after it.
    #[serde(default)]
    pub inversions: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records a hold of `held` cycles by `core`, requested at `at`, as
    /// `MmuLock::hold` does (without the ticket's own cost); returns the
    /// wait.
    fn take(lock: &mut LockTimeline, at: u64, core: Core, held: u64, transfer: u64) -> u64 {
        let g = lock.grant_for(Cycles(at), core, transfer);
        let waited = g.granted - Cycles(at);
        let hold = TimedHold {
            start: g.busy_from,
            end: g.granted + Cycles(held),
            requested: Cycles(at),
            core,
            zap: false,
        };
        lock.record(hold, waited);
        waited.0
    }

    #[test]
    fn a_request_waits_for_every_hold_granted_before_it() {
        let mut lock = LockTimeline::default();
        assert_eq!(take(&mut lock, 100, Core::Vcpu(0), 100, 0), 0);
        // Inside vCPU 0's hold: to its end.
        assert!(!lock.grant_for(Cycles(150), Core::Vcpu(1), 0).served_late);
        assert_eq!(take(&mut lock, 150, Core::Vcpu(1), 50, 0), 50);
        // Made before vCPU 1's request but reaching the lock after its
        // hold: it waits behind it (no overlap), which the checker flags
        // as served out of first-come order.
        assert!(lock.grant_for(Cycles(120), Core::Vcpu(2), 0).served_late);
        assert_eq!(take(&mut lock, 120, Core::Vcpu(2), 10, 0), 130);
        assert_eq!(lock.grant(Cycles(260)), Cycles(260), "free again");
        assert_eq!(lock.overlaps, 0);
        assert_eq!((lock.contended, lock.waited), (2, Cycles(180)));
        assert_eq!(lock.per_vcpu, vec![(1, 0), (1, 1), (1, 1)]);
    }

    #[test]
    fn a_contended_handoff_costs_two_transfers_plus_half_a_transfer_per_other_spinner() {
        assert_eq!(handoff_cycles(110, 1), 220);
        assert_eq!(handoff_cycles(110, 3), 330);
        assert_eq!(handoff_cycles(110, 5), 440);
        let mut lock = LockTimeline::default();
        take(&mut lock, 100, Core::Vcpu(0), 100, 110);
        // vCPU 1 asks during vCPU 0's hold: one spinner, two transfers.
        let g = lock.grant_for(Cycles(150), Core::Vcpu(1), 110);
        assert_eq!(
            (g.busy_from, g.granted, g.handoff),
            (Cycles(200), Cycles(420), Cycles(220))
        );
        take(&mut lock, 150, Core::Vcpu(1), 100, 110);
        // vCPU 2 asked at 150 too: vCPU 1 spun beside it.
        let g = lock.grant_for(Cycles(150), Core::Vcpu(2), 110);
        assert_eq!(g.busy_from, Cycles(520));
        assert_eq!(g.handoff, Cycles(handoff_cycles(110, 2)));
        // Behind its own core's hold: no handoff, the line never left.
        let g = lock.grant_for(Cycles(450), Core::Vcpu(1), 110);
        assert_eq!((g.granted, g.handoff), (Cycles(520), Cycles::ZERO));
    }

    #[test]
    fn zap_batches_count_as_zap_wait() {
        let mut lock = LockTimeline::default();
        lock.record(
            TimedHold {
                start: Cycles(1000),
                end: Cycles(2000),
                requested: Cycles(1000),
                core: Core::Vmm,
                zap: true,
            },
            Cycles::ZERO,
        );
        let g = lock.grant_for(Cycles(1500), Core::Vcpu(0), 0);
        assert_eq!((g.granted, g.zap_wait), (Cycles(2000), Cycles(500)));
    }

    #[test]
    #[cfg_attr(feature = "order-checks", should_panic(expected = "overlaps"))]
    fn the_checker_counts_a_hold_that_overlaps_the_one_before() {
        let mut lock = LockTimeline::default();
        let hold = |start, end| TimedHold {
            start: Cycles(start),
            end: Cycles(end),
            requested: Cycles(start),
            core: Core::Vmm,
            zap: false,
        };
        lock.record(hold(100, 200), Cycles::ZERO);
        lock.record(hold(150, 250), Cycles::ZERO);
        assert_eq!(lock.overlaps, 1);
    }

    /// N cores ask for the lock every `period` cycles, all from the same
    /// start, each holding it `held` cycles, with free handoffs: the
    /// waits must be what first come, first served gives, worked out by
    /// hand below, and the same for every core in the steady state.
    fn periodic_waits(cores: usize, held: u64, period: u64, rounds: u64) -> Vec<u64> {
        let mut lock = LockTimeline::default();
        // The order requests reach the lock: by time, then core index
        // (the scheduler's tie-break), each core asking again `period`
        // after its previous hold ended.
        let mut next: Vec<u64> = vec![0; cores];
        let mut waits = vec![0u64; cores];
        for _ in 0..rounds * cores as u64 {
            let core = (0..cores).min_by_key(|&c| (next[c], c)).unwrap();
            let at = next[core];
            let waited = take(&mut lock, at, Core::Vcpu(core), held, 0);
            waits[core] += waited;
            next[core] = at + waited + held + period;
        }
        assert_eq!(lock.overlaps, 0);
        waits
    }

    #[test]
    fn synthetic_cores_wait_what_the_exact_calculation_gives() {
        // Unsaturated (N * held <= period + held): in the first round
        // core k waits k * held; afterwards each core asks `period`
        // after its release, when the lock is free again, and never
        // waits. Total per core: k * held.
        let waits = periodic_waits(4, 100, 1000, 50);
        assert_eq!(waits, vec![0, 100, 200, 300]);
        // Saturated (N * held > period + held): the lock is busy all the
        // time and serves the cores in turn, so each waits
        // (N - 1) * held - period per round once the rotation settles.
        let (n, held, period, rounds) = (6u64, 200u64, 500u64, 40u64);
        let waits = periodic_waits(n as usize, held, period, rounds);
        let steady = (n - 1) * held - period;
        for (k, w) in waits.iter().enumerate() {
            // First round: k * held; later rounds: `steady` each.
            let exact = k as u64 * held + (rounds - 1) * steady;
            assert_eq!(*w, exact, "core {k}");
        }
    }
}
