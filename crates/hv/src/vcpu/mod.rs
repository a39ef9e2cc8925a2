//! One vCPU: its machine CPU, scheduling state, requests and exit handling.
//!
//! A vCPU handles its own exits against the VM's shared state
//! ([`Vcpu::handle_exit`]`(&mut self, &mut Shared, exit) -> Next`). What it
//! needs done to other vCPUs (IPIs, kicks, starting an AP, remote TLB
//! flushes) it queues as [`CrossRequest`]s in the shared state, and the
//! scheduler carries them out before anything else runs. What must happen
//! to a vCPU before it next enters the guest is a [`Requests`] bit
//! (KVM's `KVM_REQ_*`), processed in [`Vcpu::enter`].
//!
//! Exit handlers, by concern:
//! - `cpuid`: CPUID;
//! - `msr`: RDMSR/WRMSR through the MSR table (the async-PF MSRs are
//!   `async_pf::x86`'s);
//! - `io`: port I/O (the platform's port bus, `crate::devices`);
//! - `page_fault`'s MMIO part and `xapic`: accesses outside guest RAM
//!   to the IOAPIC and the xAPIC page;
//! - `hypercall`: VMCALL (the event protocol's hypercalls are
//!   `async_pf::event`'s);
//! - `page_fault`: EPT violations (the MMU's fault path, then the
//!   async-PF policy);
//! - `shadow`: under shadow paging, guest #PF, CR3/CR0/CR4 accesses,
//!   INVLPG and the monitor-trap step of a tracked write;
//! - IPIs and HLT here.

pub(crate) mod async_pf;
mod cpuid;
pub(crate) mod cr3_cache;
mod hypercall;
mod io;
pub(crate) mod kvmclock;
pub(crate) mod msr;
mod page_fault;
mod pml;
pub(crate) mod pv_eoi;
pub(crate) mod shadow;
pub(crate) mod steal;
pub(crate) mod xapic;

use crate::apf::ApfVcpu;
use crate::error::VmError;
use crate::mmu::lock::Timed;
use crate::mmu::root::RootError;
use crate::mmu::shadow::cache::ShadowVcpu;
use crate::mmu::{LoadedRoot, MmuMode};
use crate::shared::StopReason;
use crate::shared::{CrossRequest, Shared};
use crate::stats::{ExitReason, VcpuStats};
use crate::swap::SwapSlot;
use crate::time::Cycles;
use machine::vmx::{InveptKind, Ipi, IpiMode};
use machine::{Cpu, VmExit};

pub use crate::ids::VcpuId;

/// Work a vCPU must do before its next VM entry (KVM's `KVM_REQ_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Requests(u32);

impl Requests {
    /// Choose a root again (the MMU generation changed, or none loaded).
    pub const RELOAD_ROOT: Requests = Requests(1 << 0);
    /// Flush the EPT translations of the current root (sptes were zapped
    /// or aged).
    pub const TLB_FLUSH: Requests = Requests(1 << 1);
    /// Flush the guest's own translations (KVM's `KVM_REQ_TLB_FLUSH_GUEST`):
    /// a PV TLB flush asked for while the vCPU was preempted.
    pub const GUEST_TLB_FLUSH: Requests = Requests(1 << 2);

    pub fn set(&mut self, r: Requests) {
        self.0 |= r.0;
    }

    /// Whether `r` is pending; clears it.
    pub fn take(&mut self, r: Requests) -> bool {
        let pending = self.0 & r.0 != 0;
        self.0 &= !r.0;
        pending
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// Scheduling state of a vCPU in the hv.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunState {
    /// An application processor not yet started by HC_START_CPU.
    WaitingForStart,
    Runnable,
    /// Halted by HLT until an interrupt it can take (or a kick).
    Halted,
    /// Stalled until a page read completes; nothing else happens to it
    /// (no interrupts), as a vCPU blocked in a synchronous host fault.
    Stalled {
        until: Cycles,
        slot: SwapSlot,
    },
    /// Halted in the hv on an outstanding async fault: wakes when one of
    /// its pages arrives or an interrupt can be taken (KVM's APF halt).
    ApfHalted,
}

/// What an exit handler asks the scheduler to do with the vCPU.
#[derive(Debug)]
pub(crate) enum Next {
    Continue,
    Halt,
    /// Wait, without interrupts, for the read of `slot` due at `until`.
    Stall {
        until: Cycles,
        slot: SwapSlot,
    },
    /// Halt until an outstanding page arrives or an interrupt comes.
    ApfHalt,
    /// KVM_HC_SCHED_YIELD: give this vCPU's host CPU to `target` if it is
    /// preempted (`--host-cpus`).
    YieldTo(VcpuId),
    /// A fault found `mmu_lock` held and did nothing under it: the vCPU
    /// spins `wait` cycles and handles the exit again (`handle_exit`
    /// parks it again; the scheduler never sees this).
    LockBusy {
        wait: Cycles,
    },
    /// A fault's next `mmu_lock` request, at `at`, is past the order
    /// bound: the exit is parked again, with no charge, and handled again
    /// when no other actor can ask before `at` (`handle_exit` parks it;
    /// the scheduler sees it as [`Vcpu::retry_at`]).
    NotYet {
        at: Cycles,
    },
    Stop(StopReason),
}

/// One vCPU.
#[derive(Debug)]
pub struct Vcpu {
    pub(crate) id: VcpuId,
    pub(crate) cpu: Cpu,
    pub(crate) run: RunState,
    /// KVM_HC_KICK_CPU arrived while halted or before the next HLT.
    pub(crate) kicked: bool,
    /// An NMI IPI arrived and waits for injection (one latched, as the
    /// CPU's NMI pin latches one).
    pub(crate) nmi_pending: bool,
    /// The PIC requests an interrupt this vCPU's APIC passes on (LINT0
    /// ExtINT), as of this vCPU's last device access or entry: it wakes
    /// the vCPU from HLT when interrupts are on.
    pub(crate) pic_pending: bool,
    /// Earliest virtual time at which a wake-up sent by another vCPU can be
    /// seen (the sender's clock).
    pub(crate) wake_not_before: Cycles,
    /// While halted or stalled: the deadline registered in the VM's event
    /// queue (timer, page arrival or end of a stall).
    pub(crate) wake_event: Option<Cycles>,
    pub(crate) apf: ApfVcpu,
    pub(crate) kvmclock: kvmclock::KvmClock,
    /// Steal time and the preempted byte.
    pub(crate) steal: steal::StealTime,
    /// PV EOI (`MSR_KVM_PV_EOI_EN`).
    pub(crate) pv_eoi: pv_eoi::PvEoi,
    pub(crate) stats: VcpuStats,
    pub(crate) requests: Requests,
    /// The root it entered with last.
    pub(crate) root: Option<LoadedRoot>,
    /// EPT or shadow paging (the VM's).
    pub(crate) mmu_mode: MmuMode,
    /// Shadow paging: the guest's CR3, `prev_roots`, a write in flight.
    pub(crate) shadow: ShadowVcpu,
    /// Its dirty ring is full: it waits for the VMM's harvest.
    pub(crate) ring_full: bool,
    /// Its page-modification log (allocated when a slot first logs in
    /// PML mode).
    pub(crate) pml_page: Option<machine::Hfn>,
    /// The xAPIC page's own registers.
    pub(crate) xapic: xapic::XapicRegs,
    /// The exit it took last, not yet handled: exits are handled in
    /// virtual-time order across vCPUs (`vm/sched.rs`), so one waits
    /// while another vCPU is still behind it.
    pub(crate) parked_exit: Option<VmExit>,
    /// While its parked fault waits for `mmu_lock` (`Next::LockBusy`):
    /// when it first asked. Of vCPUs due at the same time, the one that
    /// asked first replays first, as a ticket lock serves them.
    pub(crate) lock_deferred_since: Option<Cycles>,
    /// Its parked fault asks for `mmu_lock` (or the swap device) at this
    /// time, past the order bound when it was handled (`Next::NotYet`):
    /// it acts again no earlier, and its replay makes no request earlier
    /// (`ExitClock::floor`).
    pub(crate) retry_at: Option<Cycles>,
}

impl Vcpu {
    pub(crate) fn new(id: VcpuId, cpu: Cpu) -> Self {
        let mut requests = Requests::default();
        requests.set(Requests::RELOAD_ROOT);
        Vcpu {
            id,
            cpu,
            run: RunState::WaitingForStart,
            kicked: false,
            nmi_pending: false,
            pic_pending: false,
            wake_not_before: Cycles::ZERO,
            wake_event: None,
            apf: ApfVcpu::default(),
            kvmclock: kvmclock::KvmClock::default(),
            steal: steal::StealTime::default(),
            pv_eoi: pv_eoi::PvEoi::default(),
            stats: VcpuStats::default(),
            requests,
            root: None,
            mmu_mode: MmuMode::Ept,
            shadow: ShadowVcpu::default(),
            ring_full: false,
            pml_page: None,
            xapic: xapic::XapicRegs::default(),
            parked_exit: None,
            lock_deferred_since: None,
            retry_at: None,
        }
    }

    /// The machine CPU.
    pub fn cpu(&self) -> &Cpu {
        &self.cpu
    }

    /// Async page faults outstanding (reads in flight it waits for).
    pub fn apf_outstanding(&self) -> usize {
        self.apf.works.len()
    }

    /// Page-ready notifications queued for the guest.
    pub fn apf_ready_queued(&self) -> usize {
        self.apf.ready_queue.len()
    }

    /// The vCPU's clock.
    pub(crate) fn clock(&self) -> Cycles {
        Cycles(self.cpu.cycles())
    }

    pub(crate) fn rip(&self) -> u64 {
        self.cpu.state().rip
    }

    /// Charges hv work to the vCPU: the one way virtual time is charged
    /// for work (idle time is [`Vcpu::idle_until`]).
    pub(crate) fn charge(&mut self, cycles: Cycles) {
        // Work by the hv for a vCPU paused in guest mode needs it out of
        // guest mode first: a kick's exit.
        self.end_pause();
        self.cpu.advance_cycles(cycles.0);
        self.stats.busy_cycles += cycles.0;
    }

    /// Takes a vCPU paused in guest mode out of it (`Cpu::end_pause`): the
    /// VM exit is time it ran.
    pub(crate) fn end_pause(&mut self) {
        let before = self.cpu.cycles();
        self.cpu.end_pause();
        self.stats.busy_cycles += self.cpu.cycles() - before;
    }

    /// Advances the clock to `until` without running (halted, stalled or
    /// not started), counting the time as idle.
    pub(crate) fn idle_until(&mut self, until: Cycles) {
        let now = self.clock();
        if until > now {
            let idle = (until - now).0;
            self.cpu.advance_cycles(idle);
            self.stats.idle_cycles += idle;
            match self.run {
                RunState::Stalled { .. } => self.apf.stats.stall_cycles += idle,
                RunState::ApfHalted => self.apf.stats.halt_cycles += idle,
                _ => {}
            }
        }
    }

    /// Advances the clock to `until` while the vCPU wants to run but has
    /// no host CPU (`--host-cpus`): steal time.
    pub(crate) fn steal_until(&mut self, until: Cycles) {
        if until > self.clock() {
            // Preempted in the host: its thread left guest mode.
            self.end_pause();
        }
        let now = self.clock();
        if until > now {
            let steal = (until - now).0;
            self.cpu.advance_cycles(steal);
            self.stats.steal_cycles += steal;
        }
    }

    /// Processes pending requests, then runs guest code until `limit` or
    /// an exit (KVM's `vcpu_enter_guest`).
    pub(crate) fn enter(&mut self, shared: &mut Shared, limit: Cycles) -> Result<VmExit, VmError> {
        if self.cpu.is_paused() && self.needs_exit(shared) {
            self.end_pause();
        }
        match self.mmu_mode {
            MmuMode::Shadow => {
                self.process_shadow_requests(shared)?;
                self.begin_tracked_write(shared)?;
            }
            MmuMode::Ept => {
                self.process_requests(shared)
                    .map_err(|source| VmError::Root {
                        vcpu: self.id,
                        source,
                    })?;
            }
            MmuMode::Native => self.process_native_requests(),
        }
        self.inject_pending_nmi();
        self.inject_pic_interrupt(shared);
        let limit = pv_eoi::before_entry(self, shared, limit)?;
        // A write let through to a tracked guest page table runs one
        // instruction to its monitor-trap exit: no pause in between, so
        // the table is never left writable while other vCPUs run.
        let limit = if self.shadow.pending_write.is_some() {
            Cycles::MAX
        } else {
            limit
        };
        let before = self.cpu.cycles();
        let exit = self.cpu.run(&shared.host.mem, limit.0);
        self.stats.busy_cycles += self.cpu.cycles() - before;
        pv_eoi::after_exit(self, shared)?;
        Ok(exit)
    }

    /// Whether the hv has work to do on this vCPU before it runs guest
    /// code again (requests, a root to load, an NMI to inject): a vCPU
    /// paused in guest mode then takes an exit first.
    fn needs_exit(&self, shared: &Shared) -> bool {
        let root_stale = match self.mmu_mode {
            MmuMode::Native => false,
            MmuMode::Ept | MmuMode::Shadow => {
                self.root.is_none_or(|r| !shared.host.mmu.is_current(&r))
            }
        };
        !self.requests.is_empty() || root_stale || self.nmi_deliverable()
    }

    pub(crate) fn process_requests(&mut self, shared: &mut Shared) -> Result<(), RootError> {
        if self.requests.is_empty() && self.root.is_some_and(|r| shared.host.mmu.is_current(&r)) {
            return Ok(());
        }
        let stale = self.root.is_none_or(|r| !shared.host.mmu.is_current(&r));
        if self.requests.take(Requests::RELOAD_ROOT) || stale {
            self.reload_root(shared)?;
        }
        if self.requests.take(Requests::TLB_FLUSH) {
            if let Some(root) = self.root {
                self.cpu.invept(InveptKind::SingleContext(root.eptp));
            }
        }
        if self.requests.take(Requests::GUEST_TLB_FLUSH) {
            // The guest's linear translations are tagged with its VPID.
            let vpid = self.cpu.vmx().map_or(0, |v| v.vpid);
            self.cpu
                .invvpid(machine::vmx::InvvpidKind::SingleContext { vpid });
            self.charge(Cycles(shared.host.costs.invvpid));
        }
        Ok(())
    }

    /// Without memory virtualisation there is no root to load; a flush
    /// request (nothing the hv does queues one today) drops the VPID's
    /// translations.
    fn process_native_requests(&mut self) {
        self.requests.take(Requests::RELOAD_ROOT);
        if self.requests.take(Requests::TLB_FLUSH) {
            let vpid = self.cpu.vmx().map_or(0, |v| v.vpid);
            self.cpu
                .invvpid(machine::vmx::InvvpidKind::SingleContext { vpid });
        }
    }

    /// Under shadow paging: requests before entry. A root reload (and
    /// the sync it does) is charged to the vCPU like an exit's work.
    fn process_shadow_requests(&mut self, shared: &mut Shared) -> Result<(), VmError> {
        let stale = self.root.is_none_or(|r| !shared.host.mmu.is_current(&r));
        if self.requests.take(Requests::RELOAD_ROOT) || stale {
            let previous = self.root;
            let when = match previous {
                Some(_) => Timed::At(self.clock()),
                None => Timed::Untimed,
            };
            let (cycles, zap_wait) = self.load_shadow_root(shared, false, when)?;
            self.charge(cycles);
            if previous.is_some() {
                // As under EPT: a reload after a zap is a stall it caused.
                self.stats.root_reloads += 1;
                self.stats.mmu_lock_wait_cycles += zap_wait.0;
                self.stats.note_zap_stall(cycles);
            }
        }
        if self.requests.take(Requests::TLB_FLUSH) {
            let vpid = self.cpu.vmx().map_or(0, |v| v.vpid);
            self.cpu
                .invvpid(machine::vmx::InvvpidKind::SingleContext { vpid });
        }
        if self.requests.take(Requests::GUEST_TLB_FLUSH) && self.root.is_some() {
            // Under shadow paging a guest TLB flush also syncs unsync
            // pages (KVM's `kvm_vcpu_flush_tlb_guest`): what loading the
            // root for the guest's CR3 does.
            let (cycles, _) = self.load_shadow_root(shared, true, Timed::At(self.clock()))?;
            self.charge(cycles);
        }
        Ok(())
    }

    /// Loads a root (KVM's `kvm_mmu_reload`). The first load is set-up;
    /// a reload (after a zap-all) takes `mmu_lock` at the vCPU's clock,
    /// may wait behind the zap's teardown, builds the root if no vCPU has
    /// yet, and flushes what the TLB holds under the old root (its top
    /// table may be freed and reused): the vCPU pays all of it, and it
    /// counts as a stall caused by the zap.
    fn reload_root(&mut self, shared: &mut Shared) -> Result<(), RootError> {
        let previous = self.root;
        let when = match previous {
            Some(_) => Timed::At(self.clock()),
            None => Timed::Untimed,
        };
        let host = &mut shared.host;
        let (root, load) = host.mmu.load_root(
            &host.mem,
            &mut host.frames,
            &host.costs,
            previous.map(|r| r.id),
            when,
        )?;
        if let Some(old) = previous {
            self.cpu.invept(InveptKind::SingleContext(old.eptp));
            let cycles = load.cycles + Cycles(host.costs.invept);
            self.charge(cycles);
            self.stats.root_reloads += 1;
            self.stats.mmu_lock_wait_cycles += load.zap_wait.0;
            self.stats.note_zap_stall(cycles);
        }
        if let Some(c) = self.cpu.vmx_mut() {
            c.ept = Some(root.eptp);
        }
        self.root = Some(root);
        Ok(())
    }

    /// Handles one exit, charging the hv's work to the vCPU.
    /// Whether handling `exit` can end before its first request for a
    /// shared resource and be handled again later (`Next::NotYet`,
    /// `Next::LockBusy`): faults, and under shadow paging a MOV to CR3
    /// (its root load asks for `mmu_lock`; nothing changes before).
    pub(crate) fn replayable(&self, exit: &VmExit) -> bool {
        match exit {
            VmExit::EptViolation { .. } | VmExit::Exception { vector: 14, .. } => true,
            VmExit::CrAccess(machine::vmx::CrAccess::MovTo { cr: 3, .. }) => {
                self.mmu_mode == MmuMode::Shadow
            }
            _ => false,
        }
    }

    pub(crate) fn handle_exit(&mut self, shared: &mut Shared, exit: VmExit) -> Next {
        let reason = ExitReason::of(&exit);
        let vectoring = self.cpu.idt_vectoring_info();
        let mut cycles = Cycles(shared.host.costs.exit_base);
        // The guest may have switched to a cached root without exiting.
        self.cr3_cache_resync(shared);
        // PML: the log goes into the dirty bitmaps at every exit (KVM's
        // `__vmx_handle_exit`), a PML-full exit included.
        let drained = if reason == ExitReason::CycleLimit {
            Ok(Cycles::ZERO)
        } else {
            self.drain_pml(&shared.host)
        };
        match drained {
            Ok(c) => cycles += c,
            Err(error) => {
                return Next::Stop(StopReason::Error(VmError::Machine {
                    vcpu: self.id,
                    rip: self.rip(),
                    error,
                }))
            }
        }
        // A tracked write let through ends at the first exit after it,
        // whatever the exit (the monitor trap, or something the
        // instruction did first).
        let finished = self.finish_tracked_write(shared, &mut cycles);
        // A fault may find `mmu_lock` held: it is then replayed at its
        // grant, so what it does under the lock happens at that virtual
        // time (`mmu::lock::Deferral`).
        let replay = self.replayable(&exit).then(|| exit.clone());
        let next = match finished
            .and_then(|()| self.dispatch(shared, exit, vectoring.is_some(), &mut cycles))
        {
            Ok(next) => next,
            Err(error) => Next::Stop(StopReason::Error(error)),
        };
        if let (Next::LockBusy { wait }, Some(exit)) = (&next, replay.clone()) {
            // What the exit charged up to the request is charged again by
            // the replay, which makes the request again at the grant: the
            // vCPU's clock moves by the wait alone.
            self.lock_deferred_since.get_or_insert(self.clock());
            self.charge(*wait);
            self.parked_exit = Some(exit);
            return Next::Continue;
        }
        if let (Next::NotYet { at }, Some(exit)) = (&next, replay) {
            // Nothing was charged: the replay makes the request at `at`
            // again, once the others have passed it.
            self.retry_at = Some(*at);
            self.parked_exit = Some(exit);
            return Next::Continue;
        }
        // Its promise is kept (`ExitClock::floor`).
        self.retry_at = None;
        if self.lock_deferred_since.take().is_some() {
            shared.host.mmu.end_lock_deferral(self.id.0);
        }
        // An exit in the middle of delivering an event (e.g. an EPT
        // violation on the guest stack while pushing an interrupt frame)
        // loses the event unless the hv re-injects it, as on VMX.
        if let Some(event) = vectoring {
            if self.cpu.pending_injection().is_none() {
                self.cpu.inject_event(event);
                cycles += Cycles(shared.host.costs.event_injection);
            }
        }
        if reason != ExitReason::CycleLimit {
            self.charge(cycles);
            self.stats.exits.record(reason, cycles.0);
        }
        next
    }

    fn dispatch(
        &mut self,
        shared: &mut Shared,
        exit: VmExit,
        vectoring: bool,
        cycles: &mut Cycles,
    ) -> Result<Next, VmError> {
        let rip = self.rip();
        let vcpu = self.id;
        let costs = shared.host.costs;
        match exit {
            VmExit::CycleLimit
            | VmExit::MonitorTrap
            | VmExit::NmiWindow
            | VmExit::InterruptWindow => Ok(Next::Continue),
            // The log was drained above: the instruction runs again.
            VmExit::PmlFull => Ok(Next::Continue),
            VmExit::Exception {
                vector: 14,
                error_code,
                qualification,
            } if self.mmu_mode == MmuMode::Shadow => self.shadow_page_fault(
                shared,
                machine::Gva(qualification),
                error_code.unwrap_or(0),
                vectoring,
                cycles,
            ),
            VmExit::CrAccess(access) if self.mmu_mode == MmuMode::Shadow => {
                self.shadow_cr_access(shared, access, cycles)
            }
            VmExit::Invlpg { gva } if self.mmu_mode == MmuMode::Shadow => {
                self.shadow_invlpg(shared, gva, cycles)
            }
            VmExit::TripleFault => Err(VmError::TripleFault {
                vcpu,
                rip,
                cause: self.cpu.triple_fault_cause(),
            }),
            VmExit::EptViolation {
                gpa, qualification, ..
            } => self.ept_violation(shared, gpa, qualification, vectoring, cycles),
            VmExit::EptMisconfig { gpa } => Err(VmError::EptMisconfig { vcpu, gpa, rip }),
            VmExit::MachineError(error) => Err(VmError::Machine { vcpu, rip, error }),
            VmExit::Cpuid => {
                *cycles += Cycles(costs.cpuid_msr);
                self.handle_cpuid(shared.kvm_features);
                Ok(Next::Continue)
            }
            VmExit::Hlt => {
                self.cpu.skip_instruction();
                self.stats.halts += 1;
                self.wake_not_before = Cycles::ZERO;
                Ok(Next::Halt)
            }
            VmExit::Io {
                port,
                size,
                direction,
                value,
            } => {
                *cycles += Cycles(costs.io_emulation);
                Ok(self.handle_io(shared, port, size, direction, value))
            }
            VmExit::MsrRead { index } => {
                *cycles += Cycles(costs.cpuid_msr);
                if self.mmu_mode == MmuMode::Shadow && index == machine::cpu::state::msr::EFER {
                    self.shadow_read_efer();
                } else {
                    self.handle_rdmsr(shared, index);
                }
                Ok(Next::Continue)
            }
            VmExit::MsrWrite { index, value } => {
                *cycles += Cycles(costs.cpuid_msr);
                if self.mmu_mode == MmuMode::Shadow && index == machine::cpu::state::msr::EFER {
                    self.shadow_write_efer(shared, value, cycles)?;
                } else {
                    self.handle_wrmsr(shared, index, value)?;
                }
                Ok(Next::Continue)
            }
            VmExit::Vmcall => {
                *cycles += Cycles(costs.hypercall);
                self.handle_hypercall(shared)
            }
            VmExit::Ipi(ipi) => self.send_ipi(shared, ipi),
            VmExit::EoiBroadcast { vector } => {
                self.eoi_broadcast(shared, vector);
                Ok(Next::Continue)
            }
            other => Err(VmError::UnsupportedExit {
                vcpu,
                rip,
                exit: format!("{other:?}"),
            }),
        }
    }

    /// Routes an IPI this vCPU's APIC sent (by ICR MSR or the xAPIC page).
    pub(crate) fn send_ipi(&mut self, shared: &mut Shared, ipi: Ipi) -> Result<Next, VmError> {
        match ipi.mode {
            // Lowest priority is delivered like fixed to every
            // destination (the "focus processor" choice is the
            // platform's; all is legal for a single-destination use
            // and deterministic).
            // INIT and SIPI start APs the way hardware does (next to
            // HC_START_CPU); NMIs go to the target's NMI latch; the
            // targets act on them in `carry_out_cross_requests`.
            IpiMode::Fixed
            | IpiMode::LowestPriority
            | IpiMode::Init
            | IpiMode::Startup
            | IpiMode::Nmi => {
                shared.cross.push(CrossRequest::Ipi {
                    sender_apic: self.cpu.apic().id(),
                    ipi,
                    at: self.clock(),
                });
                self.stats.ipis_sent += 1;
                Ok(Next::Continue)
            }
            // SMI IPIs are not modelled (no SMM).
            other => Err(VmError::UnsupportedExit {
                vcpu: self.id,
                rip: self.rip(),
                exit: format!("IPI with delivery mode {other:?}"),
            }),
        }
    }

    /// Whether what the machine says wakes a halted CPU (an interrupt it
    /// can take, an event to inject), an NMI it can take, or a kick if it
    /// halted by HLT, can wake it now. A kick does not end an APF halt:
    /// the vCPU would fault on the same page again, and the kick must stay
    /// pending for the HLT it was meant to end.
    pub(crate) fn can_wake(&self) -> bool {
        (self.kicked && self.run == RunState::Halted)
            || self.nmi_deliverable()
            || (self.pic_pending && self.cpu.state().rflags & machine::cpu::state::rflags::IF != 0)
            || self.cpu.halted_can_wake()
    }

    /// An NMI waits and the CPU is not blocking NMIs (it blocks them from
    /// the delivery of one to the next IRET, and in the shadow of STI or
    /// MOV SS, as KVM's `vmx_nmi_blocked`).
    fn nmi_deliverable(&self) -> bool {
        let state = self.cpu.state();
        self.nmi_pending && !state.nmi_blocked && state.interruptibility == 0
    }

    /// Before an entry: a pending NMI the CPU accepts is injected (unless
    /// another event is already being injected; it waits for the next
    /// entry). One that the CPU blocks (an NMI handler before its IRET,
    /// an STI or MOV SS shadow) asks for an NMI-window exit, as KVM does,
    /// and is injected at the entry after it.
    fn inject_pending_nmi(&mut self) {
        let window = self.nmi_pending && !self.nmi_deliverable();
        if let Some(v) = self.cpu.vmx_mut() {
            v.nmi_window_exiting = window;
        }
        if self.nmi_deliverable() && self.cpu.pending_injection().is_none() {
            self.nmi_pending = false;
            self.stats.nmis_received += 1;
            self.cpu.inject_event(machine::vmx::EventInjection {
                kind: machine::vmx::EventKind::Nmi,
                vector: machine::cpu::vector::NMI,
                error_code: None,
                instruction_len: 0,
            });
        }
    }

    /// Before an entry: the PIC's interrupt, if this vCPU's APIC passes it
    /// on (`Lapic::accepts_pic_interrupts`), is injected as an external
    /// interrupt (the INTA cycle gives the vector) when the guest can take
    /// one: IF set, no STI or MOV SS shadow, no other event being
    /// injected. Otherwise an interrupt-window exit is asked for, as KVM
    /// does for its PIC.
    fn inject_pic_interrupt(&mut self, shared: &mut Shared) {
        let wants = shared.platform.pic_output() && self.cpu.apic().accepts_pic_interrupts();
        let state = self.cpu.state();
        let open = state.rflags & machine::cpu::state::rflags::IF != 0
            && state.interruptibility == 0
            && self.cpu.pending_injection().is_none();
        if let Some(v) = self.cpu.vmx_mut() {
            v.interrupt_window_exiting = wants && !open;
        }
        if wants && open {
            if let Some(vector) = shared.platform.pic_acknowledge() {
                self.cpu.inject_event(machine::vmx::EventInjection {
                    kind: machine::vmx::EventKind::ExternalInterrupt,
                    vector,
                    error_code: None,
                    instruction_len: 0,
                });
            }
        }
        self.pic_pending = shared.platform.pic_output() && self.cpu.apic().accepts_pic_interrupts();
    }

    /// The timer deadline that would wake the halted vCPU (the machine's
    /// answer).
    pub(crate) fn timer_wake_deadline(&self) -> Option<Cycles> {
        self.cpu.halted_timer_wake().map(Cycles)
    }

    /// After skipping the clock: the machine fires the APIC timer if due.
    pub(crate) fn update_timer(&mut self) {
        self.cpu.sync_apic_timer();
    }

    /// When something may wake the vCPU (halted or stalled).
    pub(crate) fn wake_deadline(&self) -> Option<Cycles> {
        match self.run {
            RunState::Halted | RunState::ApfHalted => {
                // While halted nothing but the hv touches the APIC timer,
                // so its deadline stays valid until the vCPU runs again.
                let timer = self.timer_wake_deadline();
                let page = self.apf.next_ready_at();
                match (timer, page) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            }
            RunState::Stalled { until, .. } => Some(until),
            RunState::Runnable | RunState::WaitingForStart => None,
        }
    }
}
