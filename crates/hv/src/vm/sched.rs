//! The deterministic vCPU scheduler.
//!
//! All vCPUs run on the calling thread. Time advances in rounds of one
//! quantum of virtual cycles: in each round every vCPU, in index order,
//! runs until its own cycle counter reaches the round's end (each vCPU has
//! its own clock, as each core has its own TSC; the rounds keep them within
//! about a quantum of each other). A halted vCPU is not interpreted: its
//! clock jumps to its APIC timer deadline, or to the round's end. Halted
//! vCPUs' deadlines sit in an event queue in virtual time (ordered by
//! deadline then vCPU); when no vCPU can run, the VM jumps straight to the
//! earliest event. After every exit the scheduler carries out the
//! cross-vCPU requests the exit queued (IPIs, kicks, AP starts, remote TLB
//! flushes). Nothing depends on host time or hash order, so the same
//! configuration gives the same output and cycle counts.

use super::shared::CrossRequest;
use super::{RunStatus, StopReason, Vm};
use crate::apf::policy;
use crate::boot;
use crate::error::VmError;
use crate::time::Cycles;
use crate::vcpu::{Next, Requests, RunState, Vcpu, VcpuId};
use machine::cpu::state::DescriptorTable;
use machine::cpu::{Activity, Gpr};
use std::collections::BTreeSet;

/// Scheduling state of the VM.
#[derive(Debug)]
pub(crate) struct Scheduler {
    pub quantum: Cycles,
    /// The event queue in virtual time: (deadline, vCPU) of what will wake
    /// halted or stalled vCPUs (timers, page arrivals), earliest first.
    events: BTreeSet<(Cycles, usize)>,
    pub stopped: Option<StopReason>,
}

impl Scheduler {
    pub fn new(quantum: Cycles) -> Self {
        Scheduler {
            quantum,
            events: BTreeSet::new(),
            stopped: None,
        }
    }

    /// `vcpu` enters `state` (halted or stalled); what can wake it joins
    /// the event queue.
    fn block(&mut self, vcpu: &mut Vcpu, state: RunState) {
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

    /// `vcpu` becomes runnable.
    pub fn set_runnable(&mut self, vcpu: &mut Vcpu) {
        if let Some(old) = vcpu.wake_event.take() {
            self.events.remove(&(old, vcpu.id.0));
        }
        vcpu.kicked = false;
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
    /// Runs until global virtual time reaches `time_limit` or the VM stops.
    pub fn run_until(&mut self, time_limit: Cycles) -> RunStatus {
        while self.sched.stopped.is_none() && self.shared.time < time_limit {
            self.run_round();
        }
        match &self.sched.stopped {
            Some(reason) => RunStatus::Stopped(reason.clone()),
            None => RunStatus::Running,
        }
    }

    /// Runs to completion.
    pub fn run(&mut self) -> StopReason {
        loop {
            if let RunStatus::Stopped(reason) = self.run_until(Cycles::MAX) {
                return reason;
            }
        }
    }

    /// One scheduling round.
    fn run_round(&mut self) {
        let runnable = self.vcpus.iter().any(|v| match v.run {
            RunState::Runnable => true,
            RunState::Halted | RunState::ApfHalted => v.can_wake(),
            RunState::WaitingForStart | RunState::Stalled { .. } => false,
        });
        if !runnable {
            // Nothing to interpret: jump to the first event that can wake
            // a vCPU.
            match self.sched.events.first().map(|&(deadline, _)| deadline) {
                Some(deadline) => {
                    self.shared.time = self.shared.time.max(deadline.saturating_sub(Cycles(1)))
                }
                None => {
                    self.sched.stopped = Some(StopReason::Error(VmError::AllHalted {
                        cycles: self.shared.time.0,
                    }));
                    return;
                }
            }
        }
        let round_end = self.shared.time.saturating_add(self.sched.quantum);
        for index in 0..self.vcpus.len() {
            if self.sched.stopped.is_some() {
                return;
            }
            self.run_vcpu(index, round_end);
        }
        self.shared.time = round_end;
    }

    fn run_vcpu(&mut self, index: usize, round_end: Cycles) {
        // Wake-ups of a halted vCPU that moved no clock (a guard against
        // spinning on a deadline that cannot wake it).
        let mut stuck = 0;
        let turn_start = self.vcpus[index].clock();
        loop {
            if let Err(error) = self.complete_io(index) {
                self.sched.stopped = Some(StopReason::Error(error));
                return;
            }
            let Vm {
                vcpus,
                shared,
                sched,
                ..
            } = self;
            let vcpu = &mut vcpus[index];
            match vcpu.run {
                RunState::WaitingForStart => {
                    vcpu.idle_until(round_end);
                    return;
                }
                RunState::Stalled { until, .. } => {
                    // complete_io made it runnable if the read is done.
                    if until >= round_end {
                        vcpu.idle_until(round_end);
                        return;
                    }
                    vcpu.idle_until(until);
                }
                RunState::Halted | RunState::ApfHalted => {
                    if vcpu.can_wake() {
                        let at = vcpu.wake_not_before;
                        vcpu.idle_until(at);
                        sched.set_runnable(vcpu);
                        continue;
                    }
                    let now = vcpu.clock();
                    match vcpu.wake_event {
                        Some(deadline) if deadline < round_end => {
                            if deadline <= now {
                                stuck += 1;
                                if stuck > 2 {
                                    // Nothing moves (a timer interrupt of
                                    // too low a priority, say): let the
                                    // round end.
                                    vcpu.idle_until(round_end);
                                    return;
                                }
                            }
                            vcpu.idle_until(deadline);
                            vcpu.update_timer();
                            sched.register_event(vcpu);
                        }
                        _ => {
                            vcpu.idle_until(round_end);
                            return;
                        }
                    }
                }
                RunState::Runnable => {
                    // A vCPU whose clock, when its turn in the round came,
                    // left less than a VM entry's cost before the round's
                    // end could not retire an instruction: entering would
                    // pay the entry and exit and push its clock past the
                    // next round's end too, so with a quantum below that
                    // cost no instruction would ever run. It sits the round
                    // out and its budget carries over. (A vCPU that already
                    // ran in the round re-enters as before.)
                    let entry = Cycles(vcpu.cpu.costs().vm_entry);
                    if vcpu.clock() >= round_end || turn_start + entry >= round_end {
                        return;
                    }
                    // Stop at the next page arrival to announce it on time.
                    let limit = vcpu
                        .apf
                        .next_ready_at()
                        .map_or(round_end, |t| t.min(round_end));
                    let next = match vcpu.enter(shared, limit) {
                        Ok(exit) => vcpu.handle_exit(shared, exit),
                        Err(error) => Next::Stop(StopReason::Error(error)),
                    };
                    self.carry_out_cross_requests();
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
                        Next::Stop(reason) => {
                            sched.stopped = Some(reason);
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Completes what is due on vCPU `index`'s clock: the read it stalls
    /// on, its async faults whose pages arrived (prefaulted, announced).
    fn complete_io(&mut self, index: usize) -> Result<(), VmError> {
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
        let Vm { vcpus, shared, .. } = self;
        let mut roots_reloaded = false;
        let requests: Vec<CrossRequest> = shared.cross.drain(..).collect();
        for request in requests {
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
                CrossRequest::Ipi {
                    sender_apic,
                    ipi,
                    at,
                } => {
                    for target in vcpus.iter_mut() {
                        if target.cpu.apic().is_destination(ipi.dest, sender_apic) {
                            target.cpu.apic_mut().accept_interrupt(ipi.vector);
                            wake(target, at);
                        }
                    }
                }
                CrossRequest::Kick { target, at } => {
                    let target = &mut vcpus[target.0];
                    wake(target, at);
                    target.kicked = true;
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
        self.sweep_cr3_caches(roots_reloaded);
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
        let mut vm = Vm::new(&VmConfig {
            vcpus,
            mem_size: 4 << 20,
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
        assert_eq!(vm.run_until(Cycles(10_000)), RunStatus::Running);
        assert_eq!(vm.vcpus[0].run, RunState::Halted);
        let at = Cycles(5_000_000);
        vm.shared.cross.push(CrossRequest::Kick {
            target: VcpuId(0),
            at,
        });
        vm.carry_out_cross_requests();
        assert!(vm.vcpus[0].can_wake());
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
    fn an_ap_starts_at_the_start_time_and_the_rounds_keep_clocks_together() {
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
        vm.run_until(Cycles(50_000));
        assert_eq!(vm.vcpus[1].stats.halts, 1);
        // Two halted vCPUs and no event: the VM stops, deterministically.
        let reason = vm.run();
        assert!(matches!(
            reason,
            StopReason::Error(VmError::AllHalted { .. })
        ));
    }
}
