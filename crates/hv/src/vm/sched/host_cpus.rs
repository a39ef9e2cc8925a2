//! The host scheduler (`--host-cpus` below `--vcpus`): which vCPUs hold
//! the host CPUs between two ticks, their slices, EEVDF's placement of a
//! waking vCPU, and the directed yield (the module comment of
//! `vm/sched.rs` describes the policy).

use super::*;

/// Host CPUs shared by more vCPUs (`--host-cpus` below `--vcpus`).
#[derive(Debug)]
pub(crate) struct HostCpus {
    /// Host CPUs.
    pub(super) count: usize,
    /// How long a vCPU keeps a host CPU while others wait.
    pub(super) slice: Cycles,
    /// Per vCPU: the end of its slice while it holds a host CPU.
    pub(super) holding: Vec<Option<Cycles>>,
    /// Per vCPU: cycles its wake-ups added to its run time, so that a
    /// vCPU that slept is owed no more than [`HostCpus::sleeper_credit`]
    /// (its virtual run time is its busy cycles plus these).
    pub(super) placed: Vec<u64>,
    /// Per vCPU: whether it wanted a host CPU at the last tick.
    pub(super) wanted: Vec<bool>,
    /// When the host scheduler next decides who runs.
    pub(super) next_tick: Cycles,
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
    pub(super) fn new(count: usize, slice: Cycles, vcpus: usize) -> Self {
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
    pub(super) fn sleeper_credit(&self) -> u64 {
        const TICK: u64 = crate::CYCLES_PER_SECOND / 250;
        (2 * self.slice.0).max(TICK)
    }

    /// vCPU `index`'s run time as the host scheduler counts it.
    pub(super) fn vruntime(&self, index: usize, vcpu: &Vcpu) -> u64 {
        vcpu.stats.busy_cycles + self.placed[index]
    }
}

/// Whether `vcpu` needs a host CPU in a round ending at `round_end`.
pub(super) fn wants_host_cpu(vcpu: &Vcpu, round_end: Cycles) -> bool {
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

impl Vm {
    /// With fewer host CPUs than vCPUs: the host scheduler's tick at
    /// `now` (every quantum) decides who runs until the next one.
    pub(super) fn host_tick(&mut self, now: Cycles) {
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
    pub(super) fn assign_host_cpus(&mut self, now: Cycles, next: Cycles) -> Result<(), VmError> {
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
    pub(super) fn directed_yield(&mut self, index: usize, target: VcpuId) -> Result<(), VmError> {
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
}
