//! The deterministic vCPU scheduler: vCPUs, deliveries, the host
//! scheduler's tick and the VMM's teardown act in one virtual-time order
//! (a conservative discrete-event simulation; `docs/design.md`, "Virtual
//! time and the order of events"). All vCPUs run on the calling thread.
//! Each vCPU has its own clock, as each core has its own TSC; the earliest
//! actor acts next (ties: deliveries, the tick, the teardown, then vCPUs
//! by index). A vCPU runs guest code no further than its horizon, the
//! earliest time another actor could reach it, and its exits are parked
//! and handled only when it is the earliest actor, so every exit handler
//! sees shared state in virtual-time order. Nothing depends on host time
//! or hash order: the same configuration gives the same output and cycle
//! counts.
//!
//! Host CPUs (`--host-cpus N`, [`HostCpus`]): with fewer host CPUs than
//! vCPUs, at each host tick (every quantum) the vCPUs that want to run
//! (runnable, or halted with something due before the next tick) get the
//! host CPUs: a vCPU keeps one for its slice (`--host-slice`) unless it
//! blocks (halts or stalls); then the free ones go to the waiting vCPUs
//! with the least virtual run time (busy cycles, a waking vCPU placed no
//! further back than EEVDF's lag bound; the lower index on a tie), as the
//! host's fair scheduler does. A vCPU that wants to run without a host CPU
//! is preempted: its clock advances as steal time, its steal-time area
//! says `KVM_VCPU_PREEMPTED`, and when it gets a host CPU again the hv
//! records the steal and carries out a PV TLB flush asked meanwhile
//! (`vcpu/steal.rs`). A halted vCPU holds no host CPU. KVM_HC_SCHED_YIELD
//! to a preempted vCPU hands it the caller's host CPU.

use super::{RunStatus, StopReason, Vm};
use crate::error::VmError;
use crate::image;
use crate::mmu::zap::ZapError;
use crate::shared::CrossRequest;
use crate::time::Cycles;
use crate::vcpu::async_pf::policy;
use crate::vcpu::{Next, Requests, RunState, Vcpu, VcpuId};
use machine::cpu::state::DescriptorTable;
use machine::cpu::{Activity, Gpr};
use machine::vmx::{IpiMode, VmExit};
use std::collections::BTreeSet;

mod cross;
mod host_cpus;

pub(crate) use host_cpus::{HostCpuState, HostCpus};

/// The longest run of guest code without a look back at the scheduler
/// when nothing else bounds it (a vCPU alone, the others blocked): a
/// guest spinning with interrupts off still returns to the VMM, whose
/// slices and signals it would otherwise never see. A pause is free and
/// invisible, so the value changes no result.
const MAX_RUN: Cycles = Cycles(1_000_000);

/// Who acts next in virtual time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Actor {
    /// The earliest pending delivery lands.
    Delivery,
    /// The host scheduler's tick (`--host-cpus`).
    HostTick,
    /// The VMM thread's next batch of a fast zap-all's teardown.
    Teardown,
    Vcpu(usize),
}

/// A fast zap-all's teardown in progress: the VMM thread asks for
/// `mmu_lock` again for each batch when the one before ends
/// (`report.ended`), in virtual-time order with the vCPUs' requests.
#[derive(Debug)]
pub(crate) struct Teardown {
    pub obsolete: crate::mmu::zap::Obsolete,
    pub report: crate::mmu::zap::ZapReport,
}

/// Scheduling state of the VM.
#[derive(Debug)]
pub(crate) struct Scheduler {
    /// With fewer host CPUs than vCPUs, the host scheduler's tick.
    pub quantum: Cycles,
    /// How far guest code may run past the earliest other vCPU; never
    /// more than the shortest cross-vCPU delivery (see the module's
    /// comment), which bounds it anyway.
    pub lookahead: Cycles,
    /// IPIs and kicks in flight, by landing time and then the order they
    /// were sent.
    deliveries: std::collections::BTreeMap<(Cycles, u64), CrossRequest>,
    /// Deliveries queued so far (the tie-breaker).
    delivery_seq: u64,
    /// Per vCPU: wake-ups at a deadline that moved nothing in a row.
    stuck: Vec<u8>,
    /// A teardown that finished (or failed) inside the run loop.
    teardown_report: crate::mmu::zap::ZapReport,
    teardown_error: Option<ZapError>,
    /// Fewer host CPUs than vCPUs; `None`: one host CPU per vCPU.
    pub host: Option<HostCpus>,
    /// The event queue in virtual time: (deadline, vCPU) of what will wake
    /// halted or stalled vCPUs (timers, page arrivals), earliest first.
    events: BTreeSet<(Cycles, usize)>,
    pub stopped: Option<StopReason>,
    /// The time `run_until` runs to: the VMM's work comes at it.
    limit: Cycles,
    /// Parked exits are handled out of the time order (a save point, or
    /// tracked writes finished before `run_until` returns): no bound.
    settling: bool,
    /// A vCPU's dirty ring is (soft) full: `run_until` returns for the
    /// VMM to harvest.
    pub ring_full: bool,
    /// The VMM thread's last operation (a dirty-log get, clear or
    /// harvest) ends then: its next one starts no earlier ([`Vm::vmm_now`]).
    pub vmm_busy_until: Cycles,
}

impl Scheduler {
    pub fn new(quantum: Cycles, lookahead: Cycles) -> Self {
        Scheduler {
            quantum,
            lookahead,
            deliveries: std::collections::BTreeMap::new(),
            delivery_seq: 0,
            stuck: Vec::new(),
            teardown_report: crate::mmu::zap::ZapReport::default(),
            teardown_error: None,
            host: None,
            events: BTreeSet::new(),
            stopped: None,
            limit: Cycles::MAX,
            settling: false,
            ring_full: false,
            vmm_busy_until: Cycles::ZERO,
        }
    }

    /// Shares `count` host CPUs among `vcpus` vCPUs (nothing to share when
    /// there are as many as vCPUs), each keeping one for `slice` while
    /// others wait.
    pub fn set_host_cpus(&mut self, count: usize, slice: Cycles, vcpus: usize) {
        self.host = (count < vcpus).then(|| HostCpus::new(count.max(1), slice, vcpus));
    }

    /// The host scheduler's next tick, with fewer host CPUs than vCPUs.
    fn next_tick(&self) -> Option<Cycles> {
        self.host.as_ref().map(|h| h.next_tick)
    }

    /// `request` (an IPI or a kick) lands at `at`.
    fn queue_delivery(&mut self, at: Cycles, request: CrossRequest) {
        self.deliveries.insert((at, self.delivery_seq), request);
        self.delivery_seq += 1;
    }

    /// Host CPUs shared by the vCPUs, when fewer than the vCPUs.
    pub fn host_cpus(&self) -> Option<usize> {
        self.host.as_ref().map(|h| h.count)
    }

    /// The host scheduler's state, for a snapshot.
    pub(crate) fn host_cpu_state(&self) -> Option<HostCpuState> {
        self.host.as_ref().map(|h| HostCpuState {
            holding: h.holding.iter().map(|e| e.map(|c| c.0)).collect(),
            placed: h.placed.clone(),
            wanted: h.wanted.clone(),
            next_tick: h.next_tick.0,
        })
    }

    /// Restores a saved host scheduler state: as many entries as vCPUs,
    /// no more holders than host CPUs.
    pub(crate) fn set_host_cpu_state(&mut self, state: &HostCpuState) -> Result<(), String> {
        let Some(host) = self.host.as_mut() else {
            return Err("host CPU state for a VM whose vCPUs each have one".into());
        };
        let vcpus = host.holding.len();
        if [state.holding.len(), state.placed.len(), state.wanted.len()]
            .iter()
            .any(|&n| n != vcpus)
        {
            return Err(format!(
                "host CPU state for {} vCPUs, the VM has {vcpus}",
                state.holding.len()
            ));
        }
        let holding: Vec<Option<Cycles>> = state.holding.iter().map(|e| e.map(Cycles)).collect();
        let holders = holding.iter().filter(|h| h.is_some()).count();
        if holders > host.count {
            return Err(format!(
                "{holders} vCPUs hold one of {} host CPUs",
                host.count
            ));
        }
        host.holding = holding;
        host.placed = state.placed.clone();
        host.wanted = state.wanted.clone();
        host.next_tick = Cycles(state.next_tick);
        Ok(())
    }

    /// Whether vCPU `index` may run guest code now.
    fn holds_host_cpu(&self, index: usize) -> bool {
        self.host
            .as_ref()
            .is_none_or(|h| h.holding[index].is_some())
    }

    /// Whether vCPU `index` (in `run`) is preempted: it wants to run but
    /// holds no host CPU.
    fn is_preempted(&self, index: usize, run: RunState) -> bool {
        run == RunState::Runnable && !self.holds_host_cpu(index)
    }

    /// `vcpu` enters `state` (halted or stalled); what can wake it joins
    /// the event queue.
    pub(crate) fn block(&mut self, vcpu: &mut Vcpu, state: RunState) {
        vcpu.run = state;
        self.register_event(vcpu);
    }

    fn register_event(&mut self, vcpu: &mut Vcpu) {
        if let Some(old) = vcpu.wake_event.take() {
            self.events.remove(&(old, vcpu.id.0));
        }
        if let Some(deadline) = vcpu.wake_deadline() {
            self.events.insert((deadline, vcpu.id.0));
            vcpu.wake_event = Some(deadline);
        }
    }

    /// `vcpu` becomes runnable. A pending kick is consumed only by
    /// leaving a HLT (KVM clears `pv_unhalted` when the vCPU leaves
    /// `KVM_MP_STATE_HALTED`, and only then): a kick that arrived while
    /// the vCPU ran, stalled on a page-in or waited in an APF halt stays
    /// for the HLT it was meant to end (Linux's `kvm_wait` halts with
    /// interrupts off and only a kick ends it).
    pub fn set_runnable(&mut self, vcpu: &mut Vcpu) {
        if let Some(old) = vcpu.wake_event.take() {
            self.events.remove(&(old, vcpu.id.0));
        }
        if vcpu.run == RunState::Halted {
            vcpu.kicked = false;
        }
        vcpu.run = RunState::Runnable;
    }
}

/// Puts `vcpu` in the abi boot state at `rip` with `rsp` and `rdi`,
/// runnable from virtual time `at`.
pub(crate) fn start_vcpu(vcpu: &mut Vcpu, rip: u64, rsp: u64, rdi: u64, at: Cycles) {
    vcpu.set_guest_cr3(image::PML4_GPA);
    let state = vcpu.cpu.state_mut();
    state.gdtr = DescriptorTable {
        base: image::GDT_GPA,
        limit: (image::GDT.len() * 8 - 1) as u16,
    };
    state.rip = rip;
    state.gpr[Gpr::Rsp as usize] = rsp;
    state.gpr[Gpr::Rdi as usize] = rdi;
    state.activity = Activity::Active;
    vcpu.idle_until(at);
    vcpu.run = RunState::Runnable;
}

impl Vm {
    /// Runs until every vCPU and pending delivery is at or past
    /// `time_limit` in virtual time, or the VM stops. Where it returns
    /// changes nothing the VM does: guest code runs to horizons that do
    /// not depend on `time_limit`, and an exit at or past it stays parked
    /// for the next call.
    pub fn run_until(&mut self, time_limit: Cycles) -> RunStatus {
        self.sched.ring_full = false;
        while self.sched.stopped.is_none() {
            if !self.step(time_limit) {
                self.finish_tracked_writes();
                break;
            }
            if self.sched.ring_full && self.sched.stopped.is_none() {
                return RunStatus::DirtyRingFull;
            }
        }
        match &self.sched.stopped {
            Some(reason) => RunStatus::Stopped(reason.clone()),
            None => RunStatus::Running,
        }
    }

    /// Lets the earliest actor act, unless it is at or past `time_limit`
    /// (then global time moves to `time_limit` and it returns false).
    fn step(&mut self, time_limit: Cycles) -> bool {
        let Some((at, actor)) = self.next_actor() else {
            self.sched.stopped = Some(StopReason::Error(VmError::AllHalted {
                cycles: self.shared.time.0,
            }));
            return false;
        };
        if at >= time_limit {
            self.shared.time = self.shared.time.max(time_limit);
            return false;
        }
        self.sched.limit = time_limit;
        self.shared.time = self.shared.time.max(at);
        match actor {
            Actor::Delivery => self.deliver_next(),
            Actor::HostTick => self.host_tick(at),
            Actor::Teardown => self.teardown_batch(),
            Actor::Vcpu(index) => self.step_vcpu(index),
        }
        true
    }

    /// Runs the VM until the zap-all teardown in progress is done (the
    /// VMM thread waits in it), and returns its report. If the VM stops
    /// or a dirty ring fills first, the rest is torn down at once.
    pub(crate) fn run_teardown(&mut self) -> Result<crate::mmu::zap::ZapReport, ZapError> {
        self.sched.ring_full = false;
        while self.teardown.is_some()
            && self.sched.stopped.is_none()
            && !self.sched.ring_full
            && self.step(Cycles::MAX)
        {}
        let ring_full = std::mem::take(&mut self.sched.ring_full);
        let _ = ring_full;
        let Some(mut teardown) = self.teardown.take() else {
            return match self.sched.teardown_error.take() {
                Some(e) => Err(e),
                None => Ok(std::mem::take(&mut self.sched.teardown_report)),
            };
        };
        let host = &mut self.shared.host;
        host.mmu.zap_rest(
            &host.mem,
            &mut host.frames,
            &host.costs,
            &mut teardown.report,
            &mut teardown.obsolete,
        )?;
        Ok(teardown.report)
    }

    /// The VMM thread's next teardown batch (see [`Teardown`]).
    fn teardown_batch(&mut self) {
        let Some(teardown) = self.teardown.as_mut() else {
            return;
        };
        let host = &mut self.shared.host;
        let at = teardown.report.ended;
        let result = host.mmu.zap_batch(
            &host.mem,
            &mut host.frames,
            &host.costs,
            &mut teardown.report,
            &mut teardown.obsolete,
            at,
        );
        match result {
            Err(e) => {
                self.teardown = None;
                self.sched.teardown_error = Some(e);
            }
            Ok(()) if teardown.obsolete.is_done() => {
                self.sched.teardown_report = teardown.report;
                self.teardown = None;
            }
            Ok(()) => {}
        }
    }

    /// Handles the parked exits of vCPUs whose write to a tracked guest
    /// page table is in flight (its exit ends it), earliest first, so the
    /// VMM never sees such a table writable between two `run_until`
    /// calls. They are at or after the limit `run_until` stopped at.
    fn finish_tracked_writes(&mut self) {
        self.sched.settling = true;
        while self.sched.stopped.is_none() {
            match self.earliest_parked(|v| v.shadow.pending_write.is_some()) {
                Some(index) => self.step_vcpu(index),
                None => break,
            }
        }
        self.sched.settling = false;
    }

    /// The vCPU with a parked exit that `also` holds for, earliest first
    /// (then by index).
    fn earliest_parked(&self, also: impl Fn(&Vcpu) -> bool) -> Option<usize> {
        (0..self.vcpus.len())
            .filter(|&i| self.vcpus[i].parked_exit.is_some() && also(&self.vcpus[i]))
            .min_by_key(|&i| (self.vcpus[i].clock(), i))
    }

    /// Runs to completion (harvesting and dropping dirty rings that fill:
    /// a VMM that logs in ring mode runs with [`Vm::run_until`]).
    pub fn run(&mut self) -> StopReason {
        loop {
            match self.run_until(Cycles::MAX) {
                RunStatus::Stopped(reason) => return reason,
                RunStatus::DirtyRingFull => {
                    let _ = self.harvest_dirty_rings();
                }
                RunStatus::Running => {}
            }
        }
    }

    /// When vCPU `index` next does something the others could see (see
    /// the module's comment), `Cycles::MAX` for never without a delivery.
    fn vcpu_time(&self, index: usize) -> Cycles {
        let vcpu = &self.vcpus[index];
        let clock = vcpu.clock();
        match vcpu.run {
            // A fault replayed past the order bound acts again at its
            // request (`Next::NotYet`).
            RunState::Runnable => match (vcpu.parked_exit.is_some(), vcpu.retry_at) {
                (true, Some(at)) => clock.max(at),
                _ => clock,
            },
            RunState::Halted | RunState::ApfHalted => {
                if vcpu.can_wake() {
                    clock.max(vcpu.wake_not_before)
                } else {
                    vcpu.wake_event.map_or(Cycles::MAX, |d| d.max(clock))
                }
            }
            RunState::Stalled { until, .. } => until.max(clock),
            RunState::WaitingForStart => Cycles::MAX,
        }
    }

    /// The earliest virtual time at which vCPU `index` could make a
    /// delivery land on another vCPU: an IPI or kick is sent by an exit
    /// handler, so a vCPU that is not already in one must first exit.
    fn earliest_delivery_from(&self, index: usize, time: Cycles) -> Cycles {
        let vcpu = &self.vcpus[index];
        let to_exit = match vcpu.run {
            RunState::Runnable if vcpu.parked_exit.is_some() => 0,
            _ => vcpu.cpu.costs().vm_exit,
        };
        time.saturating_add(Cycles(to_exit + self.shared.host.costs.ipi_latency()))
    }

    /// The next thing to happen in virtual time: the earliest of the
    /// pending deliveries, the host CPUs' next tick and the vCPUs' times;
    /// on a tie deliveries first, then the tick, then the lowest vCPU
    /// index. `None` when nothing can ever happen again.
    fn next_actor(&self) -> Option<(Cycles, Actor)> {
        let mut best: Option<(Cycles, Actor)> = self
            .sched
            .deliveries
            .keys()
            .next()
            .map(|&(at, _)| (at, Actor::Delivery));
        if let Some(tick) = self.sched.next_tick() {
            if best.is_none_or(|(at, _)| tick < at) {
                best = Some((tick, Actor::HostTick));
            }
        }
        if let Some(teardown) = &self.teardown {
            let at = teardown.report.ended;
            if best.is_none_or(|(b, _)| at < b) {
                best = Some((at, Actor::Teardown));
            }
        }
        // Of vCPUs due at the same time, those replaying a fault that
        // waited for `mmu_lock` go first, in the order they asked.
        let earliest_vcpu = (0..self.vcpus.len())
            .map(|index| {
                let ticket = self.vcpus[index].lock_deferred_since.unwrap_or(Cycles::MAX);
                (self.vcpu_time(index), ticket, index)
            })
            .filter(|&(at, _, _)| at != Cycles::MAX)
            .min();
        if let Some((at, _, index)) = earliest_vcpu {
            if best.is_none_or(|(b, _)| at < b) {
                best = Some((at, Actor::Vcpu(index)));
            }
        }
        best
    }

    /// How far vCPU `index` may run guest code before the others catch
    /// up: no further than the earliest delivery another vCPU could still
    /// make (so one always lands on time), the lookahead past the
    /// earliest other vCPU, the next pending delivery and the host CPUs'
    /// next tick.
    fn horizon(&self, index: usize) -> Cycles {
        let mut horizon = Cycles::MAX;
        for other in (0..self.vcpus.len()).filter(|&o| o != index) {
            let time = self.vcpu_time(other);
            if time == Cycles::MAX {
                continue;
            }
            horizon = horizon
                .min(self.earliest_delivery_from(other, time))
                .min(time.saturating_add(self.sched.lookahead));
        }
        if let Some(&(at, _)) = self.sched.deliveries.keys().next() {
            horizon = horizon.min(at);
        }
        if let Some(tick) = self.sched.next_tick() {
            horizon = horizon.min(tick);
        }
        horizon
    }

    /// vCPU `index`'s next step (it is the earliest actor): finish what
    /// is due on its clock, wake it, handle its parked exit, or run its
    /// guest code to the horizon. The pages it dirties go to its ring.
    fn step_vcpu(&mut self, index: usize) {
        let rings = &self.shared.host.dirty_rings;
        rings.set_running(Some(VcpuId(index)));
        self.shared.host.mmu.set_running(Some(index));
        if let Err(error) = self.step_vcpu_inner(index) {
            self.sched.stopped = Some(StopReason::Error(error));
        }
        self.shared.host.dirty_rings.set_running(None);
        self.shared.host.mmu.set_running(None);
    }

    fn step_vcpu_inner(&mut self, index: usize) -> Result<(), VmError> {
        // A blocked vCPU acts at its time (a wake-up, a page arrival, a
        // stall's end): it idled until then, and what it completes now
        // (a prefault under `mmu_lock`) happens then, not at the clock it
        // blocked at, which the others have run past.
        let clock_before = self.vcpus[index].clock();
        if !matches!(
            self.vcpus[index].run,
            RunState::Runnable | RunState::WaitingForStart
        ) {
            let at = self.vcpu_time(index);
            if at != Cycles::MAX {
                self.vcpus[index].idle_until(at);
            }
        }
        self.complete_io(index)?;
        let horizon = self
            .horizon(index)
            .min(self.vcpus[index].clock().saturating_add(MAX_RUN));
        let Vm {
            vcpus,
            shared,
            sched,
            ..
        } = self;
        let vcpu = &mut vcpus[index];
        match vcpu.run {
            RunState::WaitingForStart => Ok(()),
            RunState::Stalled { until, .. } => {
                // complete_io made it runnable if the read is done.
                vcpu.idle_until(until);
                Ok(())
            }
            RunState::Halted | RunState::ApfHalted => {
                if vcpu.can_wake() {
                    let at = vcpu.wake_not_before;
                    vcpu.idle_until(at);
                    sched.set_runnable(vcpu);
                    return Ok(());
                }
                if let Some(deadline) = vcpu.wake_event {
                    if sched.stuck.len() <= index {
                        sched.stuck.resize(index + 1, 0);
                    }
                    if deadline <= clock_before {
                        sched.stuck[index] += 1;
                        if sched.stuck[index] > 2 {
                            // Nothing moves (a timer interrupt of too low
                            // a priority, say): only a delivery can wake
                            // it now.
                            sched.stuck[index] = 0;
                            if let Some(old) = vcpu.wake_event.take() {
                                sched.events.remove(&(old, index));
                            }
                            return Ok(());
                        }
                    } else {
                        sched.stuck[index] = 0;
                    }
                    vcpu.idle_until(deadline);
                    vcpu.update_timer();
                    sched.register_event(vcpu);
                }
                Ok(())
            }
            RunState::Runnable if !sched.holds_host_cpu(index) => {
                // Preempted: it waits for a host CPU, as steal time, to
                // the next tick or as far as the others allow.
                vcpu.steal_until(horizon.max(vcpu.clock() + Cycles(1)));
                Ok(())
            }
            RunState::Runnable => {
                if vcpu.parked_exit.is_some() {
                    return self.handle_parked_exit(index);
                }
                if shared.host.dirty_rings.is_soft_full(vcpu.id) {
                    // KVM_EXIT_DIRTY_RING_FULL: no entry until the VMM
                    // harvests (`run_until` returns).
                    if !vcpu.ring_full {
                        vcpu.ring_full = true;
                        vcpu.stats.dirty_ring_full_exits += 1;
                    }
                    sched.ring_full = true;
                    return Ok(());
                }
                // Stop at the next page arrival to announce it on time.
                let limit = vcpu.apf.next_ready_at().map_or(horizon, |t| t.min(horizon));
                let exit = vcpu.enter(shared, limit)?;
                // A pause at the limit is no exit: nothing to handle.
                if exit != VmExit::CycleLimit {
                    vcpu.parked_exit = Some(exit);
                }
                self.carry_out_cross_requests();
                Ok(())
            }
        }
    }

    /// Handles vCPU `index`'s parked exit (it is the earliest actor). A
    /// fault or a shadow CR3 load, which can be replayed, runs under the
    /// order bound: its
    /// requests for `mmu_lock` and the swap device come no later than any
    /// other actor could make one, or it ends as `Next::NotYet` and is
    /// parked again until the others have passed its request.
    fn handle_parked_exit(&mut self, index: usize) -> Result<(), VmError> {
        let Some(exit) = self.vcpus[index].parked_exit.take() else {
            return Ok(());
        };
        let bounded = self.vcpus[index].replayable(&exit);
        if bounded && !self.sched.settling {
            self.shared.host.order_bound = Some(self.order_bound(index));
        }
        // The devices' time (the RTC's) is the exiting vCPU's clock.
        self.shared.platform.set_clock(self.vcpus[index].clock().0);
        let next = self.vcpus[index].handle_exit(&mut self.shared, exit);
        self.shared.host.order_bound = None;
        self.carry_out_cross_requests();
        if self.shared.platform.take_suspend_request() && self.suspend(index) {
            return Ok(());
        }
        self.after_exit(index, next)
    }

    /// The latest virtual time at which vCPU `index`, the earliest actor,
    /// may ask for a shared resource knowing that nobody else can ask
    /// earlier: the earliest request each other vCPU could still make,
    /// the next delivery, host tick and teardown batch, and the time the
    /// VMM's own work comes at (`run_until`'s limit).
    ///
    /// A vCPU running guest code must exit first (`vm_exit`); one with a
    /// parked exit, work due on its clock (a page that arrived) or a
    /// fault to replay can ask at its own time (the hv's own accesses to
    /// guest memory are stamped with it). A blocked vCPU can be woken by a
    /// delivery before its own deadline: by one pending, or one a third
    /// vCPU could still send. Deliveries this handler sends are not
    /// waited for (it cannot wait for itself): a vCPU they wake asks
    /// after the handler's requests in the order of service, which the
    /// checkers count if it is earlier in virtual time.
    fn order_bound(&self, index: usize) -> Cycles {
        let times: Vec<Cycles> = (0..self.vcpus.len()).map(|o| self.vcpu_time(o)).collect();
        let next_delivery = self.sched.deliveries.keys().next().map(|&(at, _)| at);
        let mut bound = self.sched.limit;
        for other in (0..self.vcpus.len()).filter(|&o| o != index) {
            let vcpu = &self.vcpus[other];
            let busy = vcpu.parked_exit.is_some()
                || !vcpu.apf.works.is_empty()
                || !vcpu.apf.ready_queue.is_empty();
            let earliest = match vcpu.run {
                RunState::Runnable if !busy => {
                    times[other].saturating_add(Cycles(vcpu.cpu.costs().vm_exit))
                }
                RunState::Runnable | RunState::WaitingForStart => times[other],
                RunState::Halted | RunState::ApfHalted | RunState::Stalled { .. } => {
                    let woken = (0..self.vcpus.len())
                        .filter(|&x| x != other && x != index && times[x] != Cycles::MAX)
                        .map(|x| self.earliest_delivery_from(x, times[x]))
                        .chain(next_delivery)
                        .min()
                        .unwrap_or(Cycles::MAX);
                    times[other].min(woken)
                }
            };
            bound = bound.min(earliest);
        }
        if let Some(at) = next_delivery {
            bound = bound.min(at);
        }
        if let Some(tick) = self.sched.next_tick() {
            bound = bound.min(tick);
        }
        if let Some(teardown) = &self.teardown {
            bound = bound.min(teardown.report.ended);
        }
        bound
    }

    /// Carries out what the handler of vCPU `index`'s exit asked of the
    /// scheduler.
    fn after_exit(&mut self, index: usize, next: Next) -> Result<(), VmError> {
        let Vm { vcpus, sched, .. } = self;
        let vcpu = &mut vcpus[index];
        match next {
            Next::Continue => {}
            Next::Halt => sched.block(vcpu, RunState::Halted),
            Next::Stall { until, slot } => {
                vcpu.apf.stats.stalls += 1;
                sched.block(vcpu, RunState::Stalled { until, slot });
            }
            Next::ApfHalt => {
                vcpu.apf.stats.halts += 1;
                sched.block(vcpu, RunState::ApfHalted);
            }
            Next::YieldTo(target) => {
                self.directed_yield(index, target)?;
                self.carry_out_cross_requests();
            }
            Next::Stop(reason) => sched.stopped = Some(reason),
            // `handle_exit` parked the exit again for its replay.
            Next::LockBusy { .. } | Next::NotYet { .. } => {}
        }
        Ok(())
    }

    /// Handles every parked exit, earliest first, and lands every pending
    /// delivery: what a snapshot or a migration's last dirty-log round
    /// needs before it saves the VM (neither is part of the saved state).
    /// It changes where the VM's events fall against the caller's own
    /// work, so only the VMM's save points call it.
    pub fn settle(&mut self) {
        self.sched.settling = true;
        loop {
            if self.sched.stopped.is_some() {
                break;
            }
            if !self.sched.deliveries.is_empty() {
                self.deliver_next();
                continue;
            }
            match self.earliest_parked(|_| true) {
                Some(index) => self.step_vcpu(index),
                None => break,
            }
        }
        self.sched.settling = false;
    }

    /// Completes what is due on vCPU `index`'s clock: the read it stalls
    /// on, its async faults whose pages arrived (prefaulted, announced).
    fn complete_io(&mut self, index: usize) -> Result<(), VmError> {
        let vcpu = &self.vcpus[index];
        if vcpu.run == RunState::Runnable
            && vcpu.apf.works.is_empty()
            && vcpu.apf.ready_queue.is_empty()
        {
            // Nothing in flight for it (the common case, checked cheaply).
            return Ok(());
        }
        let result = self.complete_io_of(index);
        self.carry_out_cross_requests();
        result
    }

    fn complete_io_of(&mut self, index: usize) -> Result<(), VmError> {
        let Vm {
            vcpus,
            shared,
            sched,
            ..
        } = self;
        let vcpu = &mut vcpus[index];
        if let RunState::Stalled { until, slot } = vcpu.run {
            if until <= vcpu.clock() {
                shared.pager.finish_page_in(&mut shared.host.slots, slot);
                sched.set_runnable(vcpu);
            }
        }
        let arrived = policy::complete_arrived(vcpu, shared)?;
        if arrived && vcpu.run == RunState::ApfHalted {
            sched.set_runnable(vcpu);
        }
        if !vcpu.apf.ready_queue.is_empty() {
            policy::deliver_ready(vcpu, shared)?;
            if matches!(vcpu.run, RunState::Halted | RunState::ApfHalted) {
                sched.register_event(vcpu);
            }
        } else if arrived && vcpu.run == RunState::Halted {
            sched.register_event(vcpu);
        }
        Ok(())
    }
}

/// Records that `target` may wake no earlier than `at`.
fn wake(target: &mut Vcpu, at: Cycles) {
    target.wake_not_before = target.wake_not_before.max(at);
}

#[cfg(test)]
mod tests;
