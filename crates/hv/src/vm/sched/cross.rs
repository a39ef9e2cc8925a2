//! What exits ask of other vCPUs, carried out between two steps of the
//! scheduler: TLB flushes and root reloads, IPIs and their delivery,
//! kicks and AP starts, and the CR3 caches' sweep.

use super::*;

impl Vm {
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
    pub(super) fn deliver_next(&mut self) {
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
                            target
                                .cpu
                                .apic_mut()
                                .accept_interrupt_triggered(ipi.vector, ipi.trigger_level);
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
    pub(super) fn sweep_cr3_caches(&mut self, roots_reloaded: bool) {
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
