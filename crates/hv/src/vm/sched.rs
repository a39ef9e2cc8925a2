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

use super::shared::CrossRequest;
use super::{RunStatus, StopReason, Vm};
use crate::apf::policy;
use crate::boot;
use crate::error::VmError;
use crate::mmu::zap::ZapError;
use crate::time::Cycles;
use crate::vcpu::{Next, Requests, RunState, Vcpu, VcpuId};
use machine::cpu::state::DescriptorTable;
use machine::cpu::{Activity, Gpr};
use machine::vmx::{IpiMode, VmExit};
use std::collections::BTreeSet;

/// Host CPUs shared by more vCPUs (`--host-cpus` below `--vcpus`).
#[derive(Debug)]
pub(crate) struct HostCpus {
    /// Host CPUs.
    count: usize,
    /// How long a vCPU keeps a host CPU while others wait.
    slice: Cycles,
    /// Per vCPU: the end of its slice while it holds a host CPU.
    holding: Vec<Option<Cycles>>,
    /// Per vCPU: cycles its wake-ups added to its run time, so that a
    /// vCPU that slept is owed no more than [`HostCpus::sleeper_credit`]
    /// (its virtual run time is its busy cycles plus these).
    placed: Vec<u64>,
    /// Per vCPU: whether it wanted a host CPU at the last tick.
    wanted: Vec<bool>,
    /// When the host scheduler next decides who runs.
    next_tick: Cycles,
}

/// The host scheduler's state a snapshot keeps (see [`HostCpus`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct HostCpuState {
    pub holding: Vec<Option<u64>>,
    pub placed: Vec<u64>,
    pub wanted: Vec<bool>,
    pub next_tick: u64,
}

impl HostCpus {
    fn new(count: usize, slice: Cycles, vcpus: usize) -> Self {
        HostCpus {
            count,
            slice,
            holding: vec![None; vcpus],
            placed: vec![0; vcpus],
            wanted: vec![false; vcpus],
            next_tick: Cycles::ZERO,
        }
    }

    /// How far behind the others a waking vCPU may be placed: the bound
    /// on a task's lag in Linux's EEVDF (kernel/sched/fair.c since 6.6,
    /// `update_entity_lag`: `limit = calc_delta_fair(max_t(u64,
    /// 2*se->slice, TICK_NSEC), se)`, for a nice-0 task 2 slices or a tick),
    /// with the host slice (`--host-slice`, its base slice) and a tick at
    /// Debian's `CONFIG_HZ=250`. Without the bound a vCPU that slept long
    /// would keep its host CPU until its run time caught up with the
    /// others', for hundreds of milliseconds, while they starve.
    fn sleeper_credit(&self) -> u64 {
        const TICK: u64 = crate::CYCLES_PER_SECOND / 250;
        (2 * self.slice.0).max(TICK)
    }

    /// vCPU `index`'s run time as the host scheduler counts it.
    fn vruntime(&self, index: usize, vcpu: &Vcpu) -> u64 {
        vcpu.stats.busy_cycles + self.placed[index]
    }
}

/// Whether `vcpu` needs a host CPU in a round ending at `round_end`.
fn wants_host_cpu(vcpu: &Vcpu, round_end: Cycles) -> bool {
    match vcpu.run {
        RunState::Runnable => true,
        RunState::Halted | RunState::ApfHalted => {
            vcpu.can_wake() || vcpu.wake_event.is_some_and(|d| d < round_end)
        }
        // Blocked in the host on a synchronous page-in: no host CPU until
        // the read is done.
        RunState::Stalled { until, .. } => until < round_end,
        RunState::WaitingForStart => false,
    }
}

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
    /// A vCPU's dirty ring is (soft) full: `run_until` returns for the
    /// VMM to harvest.
    pub ring_full: bool,
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
            ring_full: false,
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
    vcpu.set_guest_cr3(boot::PML4_GPA);
    let state = vcpu.cpu.state_mut();
    state.gdtr = DescriptorTable {
        base: boot::GDT_GPA,
        limit: (boot::GDT.len() * 8 - 1) as u16,
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
        while self.sched.stopped.is_none() {
            match self.earliest_parked(|v| v.shadow.pending_write.is_some()) {
                Some(index) => self.step_vcpu(index),
                None => return,
            }
        }
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
            RunState::Runnable => clock,
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
        for index in 0..self.vcpus.len() {
            let at = self.vcpu_time(index);
            if at != Cycles::MAX && best.is_none_or(|(b, _)| at < b) {
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

    /// With fewer host CPUs than vCPUs: the host scheduler's tick at
    /// `now` (every quantum) decides who runs until the next one.
    fn host_tick(&mut self, now: Cycles) {
        let next = now.saturating_add(self.sched.quantum);
        if let Some(host) = self.sched.host.as_mut() {
            host.next_tick = next;
        }
        if let Err(error) = self.assign_host_cpus(now, next) {
            self.sched.stopped = Some(StopReason::Error(error));
        }
    }

    /// With fewer host CPUs than vCPUs: who runs from `now` to the next
    /// tick at `next` (see the module's comment). A vCPU that gets a host
    /// CPU back has its steal recorded; one that loses it while it wants
    /// to run counts a preemption and its steal-time area says so.
    fn assign_host_cpus(&mut self, now: Cycles, next: Cycles) -> Result<(), VmError> {
        let Vm {
            vcpus,
            shared,
            sched,
            ..
        } = self;
        let Some(host) = sched.host.as_mut() else {
            return Ok(());
        };
        let wants: Vec<bool> = vcpus.iter().map(|v| wants_host_cpu(v, next)).collect();
        // A waking vCPU is placed as EEVDF places a task with its lag
        // clamped (`HostCpus::sleeper_credit`): no further back than the
        // others' least run time less the bound.
        let credit = host.sleeper_credit();
        for i in 0..vcpus.len() {
            if !wants[i] || host.wanted[i] {
                continue;
            }
            let least = (0..vcpus.len())
                .filter(|&j| j != i && wants[j] && host.wanted[j])
                .map(|j| host.vruntime(j, &vcpus[j]))
                .min();
            if let Some(least) = least {
                let floor = least.saturating_sub(credit);
                let mine = host.vruntime(i, &vcpus[i]);
                if mine < floor {
                    host.placed[i] += floor - mine;
                }
            }
        }
        host.wanted.clone_from(&wants);
        let held_before: Vec<bool> = host.holding.iter().map(Option::is_some).collect();
        let waiting = (0..vcpus.len())
            .filter(|&i| wants[i] && host.holding[i].is_none())
            .count();
        for (i, holding) in host.holding.iter_mut().enumerate() {
            match *holding {
                // It blocked: the host CPU is free.
                Some(_) if !wants[i] => *holding = None,
                // Its slice is over and others wait: it queues again.
                Some(end) if end <= now && waiting > 0 => *holding = None,
                // Its slice is over and nobody waits: a new one.
                Some(end) if end <= now => *holding = Some(now + host.slice),
                _ => {}
            }
        }
        let mut queue: Vec<usize> = (0..vcpus.len())
            .filter(|&i| wants[i] && host.holding[i].is_none())
            .collect();
        queue.sort_by_key(|&i| (host.vruntime(i, &vcpus[i]), i));
        let free = host.count - host.holding.iter().filter(|h| h.is_some()).count();
        for &i in queue.iter().take(free) {
            host.holding[i] = Some(now + host.slice);
        }
        for (i, vcpu) in vcpus.iter_mut().enumerate() {
            let holds = host.holding[i].is_some();
            if holds && !held_before[i] {
                // Scheduled in: KVM's `record_steal_time` at the entry
                // after `vcpu_load`.
                if vcpu.run == RunState::Runnable {
                    vcpu.steal_until(now);
                }
                crate::vcpu::steal::record(vcpu, shared)?;
            } else if !holds && held_before[i] && wants[i] {
                vcpu.stats.preemptions += 1;
                if vcpu.run == RunState::Runnable {
                    // Preempted in guest mode: the host's timer interrupt
                    // exits it.
                    vcpu.end_pause();
                    crate::vcpu::steal::set_preempted(vcpu, shared)?;
                }
            }
        }
        self.carry_out_cross_requests();
        Ok(())
    }

    /// KVM_HC_SCHED_YIELD from vCPU `index` to `target`: if the target is
    /// preempted, the caller's host CPU becomes the target's at the
    /// caller's clock, and the caller is preempted.
    fn directed_yield(&mut self, index: usize, target: VcpuId) -> Result<(), VmError> {
        let Vm {
            vcpus,
            shared,
            sched,
            ..
        } = self;
        let Some(host) = sched.host.as_mut() else {
            return Ok(());
        };
        let t = target.0;
        if host.holding[index].is_none()
            || host.holding[t].is_some()
            || !wants_host_cpu(&vcpus[t], host.next_tick)
        {
            return Ok(());
        }
        host.holding[index] = None;
        vcpus[index].stats.sched_yields_directed += 1;
        vcpus[index].stats.preemptions += 1;
        let at = vcpus[index].clock();
        crate::vcpu::steal::set_preempted(&mut vcpus[index], shared)?;
        let target = &mut vcpus[t];
        if target.run == RunState::Runnable {
            target.steal_until(at);
        }
        host.holding[t] = Some(at + host.slice);
        crate::vcpu::steal::record(target, shared)
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
                    if deadline <= vcpu.clock() {
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
                if let Some(exit) = vcpu.parked_exit.take() {
                    let next = vcpu.handle_exit(shared, exit);
                    self.carry_out_cross_requests();
                    return self.after_exit(index, next);
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
        }
        Ok(())
    }

    /// Handles every parked exit, earliest first, and lands every pending
    /// delivery: what a snapshot or a migration's last dirty-log round
    /// needs before it saves the VM (neither is part of the saved state).
    /// It changes where the VM's events fall against the caller's own
    /// work, so only the VMM's save points call it.
    pub fn settle(&mut self) {
        loop {
            if self.sched.stopped.is_some() {
                return;
            }
            if !self.sched.deliveries.is_empty() {
                self.deliver_next();
                continue;
            }
            match self.earliest_parked(|_| true) {
                Some(index) => self.step_vcpu(index),
                None => return,
            }
        }
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

    /// Carries out what exits (and the hv's own accesses) asked of other
    /// vCPUs, in the order asked.
    pub(crate) fn carry_out_cross_requests(&mut self) {
        if self.shared.cross.is_empty() && self.shared.cr3_cache.is_none() {
            return;
        }
        let Vm {
            vcpus,
            shared,
            sched,
            ..
        } = self;
        let mut roots_reloaded = false;
        // Taken out and put back (emptied) to keep its allocation:
        // nothing below queues requests.
        let mut requests = std::mem::take(&mut shared.cross);
        for request in requests.drain(..) {
            match request {
                CrossRequest::FlushAll => {
                    for vcpu in vcpus.iter_mut() {
                        vcpu.requests.set(Requests::TLB_FLUSH);
                    }
                }
                CrossRequest::ReloadRoots => {
                    roots_reloaded = true;
                    for vcpu in vcpus.iter_mut() {
                        vcpu.requests.set(Requests::RELOAD_ROOT);
                    }
                }
                CrossRequest::Ipi { at, .. } | CrossRequest::Kick { at, .. } => {
                    let lands = at.saturating_add(Cycles(shared.host.costs.ipi_latency()));
                    sched.queue_delivery(lands, request);
                }
                CrossRequest::StartCpu {
                    target,
                    rip,
                    rsp,
                    rdi,
                    at,
                } => {
                    let VcpuId(i) = target;
                    start_vcpu(&mut vcpus[i], rip, rsp, rdi, at);
                }
            }
        }
        self.shared.cross = requests;
        self.sweep_cr3_caches(roots_reloaded);
    }

    /// Lands the earliest pending delivery (an IPI or a kick) on its
    /// targets, at its time.
    fn deliver_next(&mut self) {
        let Some(((at, _), request)) = self.sched.deliveries.pop_first() else {
            return;
        };
        let Vm {
            vcpus,
            shared,
            sched,
            ..
        } = self;
        match request {
            CrossRequest::Ipi {
                sender_apic, ipi, ..
            } => {
                for (i, target) in vcpus.iter_mut().enumerate() {
                    if !target.cpu.apic().is_destination(ipi.dest, sender_apic) {
                        continue;
                    }
                    match ipi.mode {
                        // INIT (not the level de-assert): wait for SIPI.
                        IpiMode::Init if ipi.level_assert => {
                            target.cpu.receive_init();
                            target.nmi_pending = false;
                            target.parked_exit = None;
                            if target.mmu_mode == crate::mmu::MmuMode::Shadow {
                                target.reset_shadow_paging();
                            }
                            target.run = RunState::WaitingForStart;
                            shared.directory[i].started = false;
                        }
                        IpiMode::Init => {}
                        // NMI: latched; injected at the target's next
                        // entry that the CPU accepts it (it wakes a
                        // halted vCPU whatever IF says). A CPU waiting
                        // for SIPI takes none.
                        IpiMode::Nmi if target.run == RunState::WaitingForStart => {}
                        IpiMode::Nmi => {
                            target.nmi_pending = true;
                            wake(target, at);
                        }
                        // SIPI: real mode at vector << 8 (ignored unless
                        // the target waits for one).
                        IpiMode::Startup => {
                            if target.cpu.receive_startup(ipi.vector) {
                                if target.mmu_mode == crate::mmu::MmuMode::Shadow {
                                    target.reset_shadow_paging();
                                }
                                shared.directory[i].started = true;
                                target.idle_until(at);
                                target.run = RunState::Runnable;
                            }
                        }
                        _ => {
                            target.stats.ipis_received += 1;
                            if sched.is_preempted(i, target.run) {
                                target.stats.ipis_received_preempted += 1;
                            }
                            target.cpu.apic_mut().accept_interrupt(ipi.vector);
                            wake(target, at);
                        }
                    }
                }
            }
            CrossRequest::Kick { target, .. } => {
                let target = &mut vcpus[target.0];
                wake(target, at);
                target.kicked = true;
            }
            _ => unreachable!("only IPIs and kicks are delivered later"),
        }
    }

    /// Keeps the CR3 cache's invariant (`mmu/shadow/cr3_cache.rs`): after
    /// anything that freed or obsoleted roots (`roots_reloaded`, a
    /// generation bump) or let a page go unsync, every vCPU's cached roots
    /// leave its table and CR3-target list before any guest code runs.
    fn sweep_cr3_caches(&mut self, roots_reloaded: bool) {
        let Vm { vcpus, shared, .. } = self;
        if shared.cr3_cache.is_none() {
            return;
        }
        let changed = shared.cr3_sweep.changed(&shared.host);
        if !(changed || roots_reloaded) {
            return;
        }
        for vcpu in vcpus.iter_mut().filter(|v| v.has_cr3_entries()) {
            vcpu.drop_cr3_cache(shared);
        }
    }
}

/// Records that `target` may wake no earlier than `at`.
fn wake(target: &mut Vcpu, at: Cycles) {
    target.wake_not_before = target.wake_not_before.max(at);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::VmConfig;
    use machine::Gpa;

    const CODE: u64 = 0x10_0000;

    /// A VM whose vCPU 0 runs `cli; 1: hlt; jmp 1b` (no guest kernel: the
    /// boot page tables, the GDT and four bytes of code).
    fn halting_vm(vcpus: u32) -> Vm {
        halting_vm_with(vcpus, crate::mmu::MmuMode::Ept)
    }

    fn halting_vm_with(vcpus: u32, mmu: crate::mmu::MmuMode) -> Vm {
        let mut vm = Vm::new(&VmConfig {
            vcpus,
            mem_size: 4 << 20,
            mmu,
            ..VmConfig::default()
        })
        .unwrap();
        let gdt: Vec<u8> = boot::GDT.iter().flat_map(|d| d.to_le_bytes()).collect();
        vm.write_guest(Gpa(boot::GDT_GPA), &gdt).unwrap();
        for (gpa, entry) in boot::identity_map_entries(vm.mem_size()) {
            vm.write_guest(Gpa(gpa), &entry.to_le_bytes()).unwrap();
        }
        vm.write_guest(Gpa(CODE), &[0xfa, 0xf4, 0xeb, 0xfd])
            .unwrap();
        vm.start_vcpu(VcpuId(0), CODE, boot::BOOT_STACK_TOP, 0);
        vm
    }

    /// A VM whose `vcpus` vCPUs all spin (`jmp .`) on `host_cpus` host
    /// CPUs with 1 ms slices.
    fn spinning_vm(vcpus: u32, host_cpus: u32) -> Vm {
        let mut vm = Vm::new(&VmConfig {
            vcpus,
            mem_size: 4 << 20,
            host_cpus: Some(host_cpus),
            host_slice: 3_000_000,
            ..VmConfig::default()
        })
        .unwrap();
        let gdt: Vec<u8> = boot::GDT.iter().flat_map(|d| d.to_le_bytes()).collect();
        vm.write_guest(Gpa(boot::GDT_GPA), &gdt).unwrap();
        for (gpa, entry) in boot::identity_map_entries(vm.mem_size()) {
            vm.write_guest(Gpa(gpa), &entry.to_le_bytes()).unwrap();
        }
        vm.write_guest(Gpa(CODE), &[0xeb, 0xfe]).unwrap();
        for i in 0..vcpus as usize {
            vm.start_vcpu(VcpuId(i), CODE, boot::BOOT_STACK_TOP, 0);
        }
        vm
    }

    #[test]
    fn fewer_host_cpus_are_shared_fairly_and_the_wait_is_steal() {
        let run = || {
            let mut vm = spinning_vm(3, 2);
            assert_eq!(vm.run_until(Cycles(60_000_000)), RunStatus::Running);
            vm
        };
        let vm = run();
        let now = vm.time().0;
        let slice = 3_000_000;
        let mut busy_total = 0;
        for v in &vm.vcpus {
            let s = &v.stats;
            // Every cycle of its clock was either run or waited for.
            assert_eq!(s.busy_cycles + s.steal_cycles + s.idle_cycles, v.clock().0);
            assert_eq!(s.idle_cycles, 0, "spinning vCPUs never idle");
            // Two host CPUs for three vCPUs: each runs about 2/3 of the
            // time, within a slice.
            assert!(
                s.busy_cycles.abs_diff(2 * now / 3) <= slice,
                "vcpu {}: {} busy of {now}",
                v.id,
                s.busy_cycles
            );
            assert!(s.preemptions > 0);
            busy_total += s.busy_cycles;
        }
        assert!(
            busy_total <= 2 * (now + vm.sched.quantum.0),
            "at most 2 run at a time"
        );
        // Deterministic.
        let again = run();
        for (a, b) in vm.vcpus.iter().zip(&again.vcpus) {
            assert_eq!(a.stats, b.stats);
        }
        // One host CPU each: no steal.
        let mut dedicated = spinning_vm(3, 3);
        dedicated.run_until(Cycles(6_000_000));
        assert!(dedicated.sched.host.is_none());
        assert!(dedicated.vcpus.iter().all(|v| v.stats.steal_cycles == 0));
    }

    #[test]
    fn a_halted_vcpu_holds_no_host_cpu() {
        // vCPU 0 halts for good; vCPUs 1 and 2 spin on 2 host CPUs and
        // never wait.
        let mut vm = spinning_vm(3, 2);
        vm.write_guest(Gpa(CODE + 0x100), &[0xfa, 0xf4, 0xeb, 0xfd])
            .unwrap();
        vm.vcpus[0].cpu.state_mut().rip = CODE + 0x100;
        vm.run_until(Cycles(30_000_000));
        assert_eq!(vm.vcpus[0].run, RunState::Halted);
        for v in &vm.vcpus[1..] {
            // At most the first slice, before vCPU 0 halted, was shared.
            assert!(
                v.stats.steal_cycles <= 3_000_000,
                "{}",
                v.stats.steal_cycles
            );
        }
    }

    #[test]
    fn nothing_left_to_wake_stops_the_vm_instead_of_spinning() {
        let mut vm = halting_vm(2);
        match vm.run() {
            StopReason::Error(VmError::AllHalted { .. }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(vm.vcpus[0].stats.halts, 1);
        assert_eq!(vm.vcpus[1].run, RunState::WaitingForStart);
    }

    #[test]
    fn a_kick_wakes_a_halted_vcpu_no_earlier_than_the_sender_clock() {
        let mut vm = halting_vm(1);
        let at = Cycles(5_000_000);
        vm.shared.cross.push(CrossRequest::Kick {
            target: VcpuId(0),
            at,
        });
        vm.carry_out_cross_requests();
        assert!(!vm.vcpus[0].kicked, "in flight");
        assert_eq!(vm.run_until(at), RunStatus::Running);
        assert_eq!(vm.vcpus[0].run, RunState::Halted);
        assert!(!vm.vcpus[0].can_wake());
        // It lands at the send time plus its latency, not before.
        let landed = at + Cycles(vm.shared.host.costs.ipi_latency());
        assert_eq!(vm.run_until(landed), RunStatus::Running);
        assert_eq!(vm.vcpus[0].run, RunState::Halted);
        assert!(!vm.vcpus[0].kicked);
        assert_eq!(vm.run_until(landed + Cycles(1)), RunStatus::Running);
        assert!(vm.vcpus[0].clock() >= landed, "woken at the landing");
        // It wakes, runs, halts again; then nothing is left to wake it.
        let status = vm.run_until(vm.time() + Cycles(6_000_000));
        assert!(
            matches!(
                status,
                RunStatus::Stopped(StopReason::Error(VmError::AllHalted { .. }))
            ),
            "{status:?}"
        );
        assert_eq!(vm.vcpus[0].stats.halts, 2);
        assert!(vm.vcpus[0].clock() >= at, "not before the kick was sent");
        assert!(!vm.vcpus[0].kicked, "a wake-up consumes the kick");
    }

    #[test]
    fn a_kick_sent_before_the_hlt_survives_an_apf_halt_and_a_page_in_and_ends_the_hlt() {
        // Linux's `kvm_wait` halts with interrupts off; the lock holder may
        // kick before the waiter reaches its HLT, and the waiter may block
        // in the hv on a page on the way (the boot stall with PV send-IPI).
        let mut vm = halting_vm(1);
        vm.shared.cross.push(CrossRequest::Kick {
            target: VcpuId(0),
            at: Cycles::ZERO,
        });
        vm.carry_out_cross_requests();
        vm.deliver_next();
        let Vm { vcpus, sched, .. } = &mut vm;
        let vcpu = &mut vcpus[0];
        vcpu.run = RunState::ApfHalted;
        assert!(!vcpu.can_wake(), "a kick does not end an APF halt");
        sched.set_runnable(vcpu);
        vcpu.run = RunState::Stalled {
            until: Cycles::ZERO,
            slot: crate::swap::SwapSlot(0),
        };
        sched.set_runnable(vcpu);
        assert!(vcpu.kicked, "still pending for the HLT");
        // `cli; hlt`: the kick ends the first HLT, the second stays.
        match vm.run() {
            StopReason::Error(VmError::AllHalted { .. }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(vm.vcpus[0].stats.halts, 2);
        assert!(!vm.vcpus[0].kicked, "the HLT's wake-up consumed it");
    }

    #[test]
    fn an_nmi_ipi_wakes_a_vcpu_halted_with_interrupts_off() {
        // Linux's RCU stall detector NMIs a CPU that may sit in `kvm_wait`'s
        // HLT with IF = 0.
        let mut vm = halting_vm(2);
        assert!(matches!(
            vm.run(),
            StopReason::Error(VmError::AllHalted { .. })
        ));
        assert_eq!(vm.vcpus[0].run, RunState::Halted);
        assert!(!vm.vcpus[0].can_wake());
        let nmi = |dest| CrossRequest::Ipi {
            sender_apic: 1,
            ipi: machine::vmx::Ipi {
                dest: machine::vmx::IpiDest::Physical(dest),
                vector: 0,
                mode: IpiMode::Nmi,
                level_assert: true,
            },
            at: Cycles(20_000),
        };
        // vCPU 1 waits for SIPI: it takes none.
        vm.shared.cross.extend([nmi(0), nmi(1)]);
        vm.carry_out_cross_requests();
        vm.deliver_next();
        vm.deliver_next();
        assert!(vm.vcpus[0].nmi_pending);
        assert!(vm.vcpus[0].can_wake());
        assert!(!vm.vcpus[1].nmi_pending);
        vm.vcpus[0].cpu.state_mut().nmi_blocked = true;
        assert!(!vm.vcpus[0].can_wake(), "held until the IRET");
    }

    #[test]
    fn an_ap_starts_at_the_start_time() {
        let mut vm = halting_vm(2);
        vm.shared.directory[1].started = true;
        vm.shared.cross.push(CrossRequest::StartCpu {
            target: VcpuId(1),
            rip: CODE,
            rsp: boot::BOOT_STACK_TOP,
            rdi: 0,
            at: Cycles(70_000),
        });
        vm.carry_out_cross_requests();
        assert_eq!(vm.vcpus[1].clock(), Cycles(70_000), "idle until started");
        assert_eq!(vm.vcpus[1].stats.idle_cycles, 70_000);
        vm.run_until(Cycles(200_000));
        assert_eq!(vm.vcpus[1].stats.halts, 1);
        // Two halted vCPUs and no event: the VM stops, deterministically.
        let reason = vm.run();
        assert!(matches!(
            reason,
            StopReason::Error(VmError::AllHalted { .. })
        ));
    }

    /// The BSP's INIT (level assert) and SIPI (vector 0x20) to APIC 1
    /// through the x2APIC ICR, then `cli; hlt`.
    const INIT_SIPI_TO_APIC_1: [u8; 26] = [
        0xb9, 0x30, 0x08, 0x00, 0x00, // mov ecx, 0x830 (ICR)
        0xba, 0x01, 0x00, 0x00, 0x00, // mov edx, 1 (destination)
        0xb8, 0x00, 0x45, 0x00, 0x00, // mov eax, 0x4500 (INIT, assert)
        0x0f, 0x30, // wrmsr
        0xb8, 0x20, 0x46, 0x00, 0x00, // mov eax, 0x4620 (SIPI 0x20)
        0x0f, 0x30, // wrmsr
        0xfa, 0xf4, // cli; hlt
    ];

    /// Under shadow paging an AP started by INIT/SIPI runs with its paging
    /// off on the paging-off root (gva = gpa), as Linux's AP trampoline
    /// needs: a store in real mode, one in protected mode without paging,
    /// then it turns on PAE, LME and PG (the boot page tables) and stores
    /// again in 64-bit mode. Every store lands at its gpa.
    #[test]
    fn under_shadow_paging_an_ap_runs_real_and_protected_mode_then_enters_long_mode() {
        let mut vm = halting_vm_with(2, crate::mmu::MmuMode::Shadow);
        vm.write_guest(Gpa(CODE), &INIT_SIPI_TO_APIC_1).unwrap();
        // 16-bit, at 0x20000 (CS = 0x2000): mov ax, 0x3000; mov ds, ax;
        // mov word [0], 0xbeef; mov ax, 0x2000; mov ds, ax;
        // lgdt [0x1020]; mov eax, cr0; or eax, 1; mov cr0, eax;
        // jmp dword 0x08:0x20100.
        let real: [u8; 40] = [
            0xb8, 0x00, 0x30, 0x8e, 0xd8, 0xc7, 0x06, 0x00, 0x00, 0xef, 0xbe, 0xb8, 0x00, 0x20,
            0x8e, 0xd8, 0x66, 0x0f, 0x01, 0x16, 0x20, 0x10, 0x0f, 0x20, 0xc0, 0x66, 0x83, 0xc8,
            0x01, 0x0f, 0x22, 0xc0, 0x66, 0xea, 0x00, 0x01, 0x02, 0x00, 0x08, 0x00,
        ];
        // 32-bit, at 0x20100: mov ax, 0x10; mov ds/es/ss, ax;
        // mov dword [0x30004], 0xcafe0032; mov eax, cr4; or eax, 0x20
        // (PAE); mov cr4, eax; mov eax, 0x3000 (the boot PML4);
        // mov cr3, eax; mov ecx, 0xc0000080; rdmsr; or eax, 0x100 (LME);
        // wrmsr; mov eax, cr0; or eax, 0x80000000 (PG); mov cr0, eax;
        // jmp 0x18:0x20200.
        let protected: [u8; 69] = [
            0x66, 0xb8, 0x10, 0x00, 0x8e, 0xd8, 0x8e, 0xc0, 0x8e, 0xd0, 0xc7, 0x05, 0x04, 0x00,
            0x03, 0x00, 0x32, 0x00, 0xfe, 0xca, 0x0f, 0x20, 0xe0, 0x83, 0xc8, 0x20, 0x0f, 0x22,
            0xe0, 0xb8, 0x00, 0x30, 0x00, 0x00, 0x0f, 0x22, 0xd8, 0xb9, 0x80, 0x00, 0x00, 0xc0,
            0x0f, 0x32, 0x0d, 0x00, 0x01, 0x00, 0x00, 0x0f, 0x30, 0x0f, 0x20, 0xc0, 0x0d, 0x00,
            0x00, 0x00, 0x80, 0x0f, 0x22, 0xc0, 0xea, 0x00, 0x02, 0x02, 0x00, 0x18, 0x00,
        ];
        // 64-bit, at 0x20200: mov dword [0x30008], 0x64646464; hlt.
        let long: [u8; 12] = [
            0xc7, 0x04, 0x25, 0x08, 0x00, 0x03, 0x00, 0x64, 0x64, 0x64, 0x64, 0xf4,
        ];
        vm.write_guest(Gpa(0x20000), &real).unwrap();
        vm.write_guest(Gpa(0x20100), &protected).unwrap();
        vm.write_guest(Gpa(0x20200), &long).unwrap();
        // The GDT at 0x21000 (null, 32-bit code, data, 64-bit code) and
        // its pointer at 0x21020.
        let gdt = [
            0u64,
            0x00cf_9b00_0000_ffff,
            0x00cf_9300_0000_ffff,
            0x00af_9b00_0000_ffff,
        ];
        let gdt: Vec<u8> = gdt.iter().flat_map(|d| d.to_le_bytes()).collect();
        vm.write_guest(Gpa(0x21000), &gdt).unwrap();
        let mut gdtr = vec![31u8, 0];
        gdtr.extend_from_slice(&0x21000u32.to_le_bytes());
        vm.write_guest(Gpa(0x21020), &gdtr).unwrap();
        // Bounded: an AP lost in the wrong memory would spin forever.
        let status = vm.run_until(Cycles(50_000_000));
        assert!(
            matches!(
                status,
                RunStatus::Stopped(StopReason::Error(VmError::AllHalted { .. }))
            ),
            "{status:?}"
        );
        let mut seen = [0u8; 12];
        vm.read_guest(Gpa(0x30000), &mut seen).unwrap();
        assert_eq!(u16::from_le_bytes([seen[0], seen[1]]), 0xbeef, "real mode");
        assert_eq!(
            u32::from_le_bytes(seen[4..8].try_into().unwrap()),
            0xcafe_0032
        );
        assert_eq!(
            u32::from_le_bytes(seen[8..12].try_into().unwrap()),
            0x6464_6464
        );
        let ap = &vm.vcpus[1];
        assert!(ap.cpu.state().in_64bit_mode(), "the AP reached 64-bit mode");
        assert_eq!(ap.shadow.guest_cr3, 0x3000);
        assert!(ap.paging_context().paging);
        assert_eq!(vm.vcpus[1].stats.halts, 1);
    }

    /// KVM_HC_SEND_IPI: one fixed IPI per bit whose APIC id exists (64
    /// bits per word from 64-bit code, the high word from `min + 64`);
    /// KVM's refusals for logical destinations and shorthands, and (here)
    /// the SMI delivery mode; NMI goes as NMI.
    #[test]
    fn pv_send_ipi_sends_one_ipi_per_bit_to_existing_apic_ids() {
        let mut vm = halting_vm(3);
        let Vm { vcpus, shared, .. } = &mut vm;
        use machine::vmx::Ipi;
        let ipi = |id: u32| Ipi {
            dest: machine::vmx::IpiDest::Physical(id),
            vector: 0x30,
            mode: IpiMode::Fixed,
            level_assert: true,
        };
        // Bits 1 and 2 (APIC ids 1, 2), bit 40 (no such id), and bit 0 of
        // the high word (id 64: none).
        let sent = vcpus[0].pv_send_ipi(shared, [0b110 | 1 << 40, 1], 0, 0x30);
        assert_eq!(sent, 2);
        let routed: Vec<Ipi> = shared
            .cross
            .iter()
            .filter_map(|r| match r {
                CrossRequest::Ipi { ipi, .. } => Some(*ipi),
                _ => None,
            })
            .collect();
        assert_eq!(routed, vec![ipi(1), ipi(2)]);
        assert_eq!(vcpus[0].stats.ipis_sent, 2);
        // `min` shifts the ids; past the last APIC id nothing is sent.
        shared.cross.clear();
        assert_eq!(vcpus[0].pv_send_ipi(shared, [0b1, 0], 2, 0x30), 1);
        assert_eq!(vcpus[0].pv_send_ipi(shared, [!0, !0], u32::MAX, 0x30), 0);
        for refused in [0x30 | 1 << 11, 0x30 | 1 << 18, 0x30 | 2 << 8] {
            assert_eq!(
                vcpus[0].pv_send_ipi(shared, [0b10, 0], 0, refused),
                -abi::errno::EINVAL,
                "{refused:#x}"
            );
        }
        assert_eq!(shared.cross.len(), 1);
        // Linux's NMI: `APIC_DM_NMI`, no vector.
        assert_eq!(vcpus[0].pv_send_ipi(shared, [0b10, 0], 0, 4 << 8), 1);
        assert!(matches!(
            shared.cross.last(),
            Some(CrossRequest::Ipi {
                ipi: Ipi {
                    mode: IpiMode::Nmi,
                    dest: machine::vmx::IpiDest::Physical(1),
                    ..
                },
                ..
            })
        ));
    }

    #[test]
    fn init_and_sipi_start_an_ap_in_real_mode_at_the_vector_page() {
        let mut vm = halting_vm(2);
        vm.write_guest(Gpa(CODE), &INIT_SIPI_TO_APIC_1).unwrap();
        // The AP's 16-bit code at 0x20000: mov ax, cs; mov bx, 0x1234; hlt.
        vm.write_guest(Gpa(0x20000), &[0x8c, 0xc8, 0xbb, 0x34, 0x12, 0xf4])
            .unwrap();
        let reason = vm.run();
        assert!(
            matches!(reason, StopReason::Error(VmError::AllHalted { .. })),
            "{reason:?}"
        );
        let ap = vm.vcpus[1].cpu.state();
        assert!(vm.shared.directory[1].started);
        assert_eq!(ap.cs.base, 0x20000);
        assert_eq!(ap.gpr[Gpr::Rax as usize] & 0xffff, 0x2000);
        assert_eq!(ap.gpr[Gpr::Rbx as usize] & 0xffff, 0x1234);
        assert_eq!(vm.vcpus[1].stats.halts, 1);
    }
}
