//! The VM: host memory, memslots, the MMU, vCPUs and the scheduler.
//!
//! # Scheduling
//!
//! All vCPUs run on the calling thread. Time advances in rounds of one
//! quantum of virtual cycles: in each round every vCPU, in index order,
//! runs until its own cycle counter reaches the round's end (each vCPU has
//! its own clock, as each core has its own TSC; the rounds keep them within
//! about a quantum of each other). A halted vCPU is not interpreted: its
//! clock jumps to its APIC timer deadline, or to the round's end. Halted
//! vCPUs' deadlines sit in an event queue in virtual time (`timer_events`,
//! ordered by deadline then vCPU); when no vCPU can run, the VM jumps
//! straight to the earliest event.
//! Nothing depends on host time or hash order, so the same configuration
//! gives the same output and cycle counts.

use crate::boot::{self, KernelError, KernelImage};
use crate::cost::HvCosts;
use crate::cpuid::guest_cpuid;
use crate::error::{CreateError, GuestMemoryError, VmError};
use crate::frames::{frame_hpa, FrameAllocator};
use crate::memslot::{Memslot, MemslotError, Memslots, SlotFlags, SlotId};
use crate::mmu::fault::{handle_ept_violation, FaultError};
use crate::mmu::{tdp::TdpRoot, Mmu};
use crate::stats::{VcpuStats, VmStats};
use abi::errno;
use machine::cpu::state::{efer, msr, rflags, DescriptorTable};
use machine::cpu::{vector, Activity, Gpr};
use machine::vmx::{InveptKind, InvvpidKind, IoDirection, Ipi, IpiMode, MsrExiting};
use machine::VmxControls;
use machine::{Cpu, CpuConfig, EventInjection, EventKind, Gfn, Gpa, Hfn, PhysMemory, VmExit};
use std::collections::BTreeSet;

/// How a VM is built.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// Number of vCPUs (APIC ids 0..n).
    pub vcpus: u32,
    /// Guest RAM in bytes (a multiple of 2 MiB).
    pub mem_size: u64,
    /// The command line handed to the kernel.
    pub cmdline: String,
    /// Scheduling quantum in virtual cycles.
    pub quantum: u64,
    /// Host memory for EPT tables and bookkeeping beyond guest RAM.
    pub host_overhead: u64,
    /// The hv cost table.
    pub costs: HvCosts,
}

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig {
            vcpus: 1,
            mem_size: 256 << 20,
            cmdline: String::new(),
            quantum: 100_000,
            host_overhead: 16 << 20,
            costs: HvCosts::DEFAULT,
        }
    }
}

/// Why the VM stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The guest wrote to the isa-debug-exit port: status `(v << 1) | 1`.
    DebugExit { status: u32 },
    /// The guest called HC_SHUTDOWN.
    Shutdown { status: u64 },
    /// An unsupported or fatal exit.
    Error(VmError),
}

/// Whether `run_until` returned because of the time limit or a stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunStatus {
    /// The time limit was reached; the VM can run on.
    Running,
    /// The VM stopped.
    Stopped(StopReason),
}

/// A structured result line handed over by HC_REPORT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub vcpu: usize,
    /// Virtual time of the report (the vCPU's cycle counter).
    pub cycles: u64,
    pub line: String,
}

/// Scheduling state of a vCPU in the hv.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunState {
    /// An application processor not yet started by HC_START_CPU.
    WaitingForStart,
    Runnable,
    /// Halted by HLT until an interrupt it can take (or a kick).
    Halted,
}

/// One vCPU.
#[derive(Debug)]
pub struct Vcpu {
    cpu: Cpu,
    run: RunState,
    /// KVM_HC_KICK_CPU arrived while halted or before the next HLT.
    kicked: bool,
    /// Earliest virtual time at which a wake-up sent by another vCPU can be
    /// seen (the sender's clock).
    wake_not_before: u64,
    /// While halted: the timer deadline registered in the VM's event queue.
    timer_event: Option<u64>,
    stats: VcpuStats,
}

impl Vcpu {
    /// The machine CPU.
    pub fn cpu(&self) -> &Cpu {
        &self.cpu
    }
}

/// Exits whose handler asks the scheduler to do something.
enum Next {
    Continue,
    Halt,
    Stop(StopReason),
}

/// A virtual machine.
#[derive(Debug)]
pub struct Vm {
    mem: PhysMemory,
    frames: FrameAllocator,
    slots: Memslots,
    mmu: Mmu,
    vcpus: Vec<Vcpu>,
    costs: HvCosts,
    quantum: u64,
    mem_size: u64,
    /// Global virtual time: the end of the last completed round.
    time: u64,
    serial: Vec<u8>,
    reports: Vec<Report>,
    stopped: Option<StopReason>,
    kernel: Option<KernelImage>,
    /// The event queue in virtual time: (deadline, vCPU) of the timers that
    /// will wake halted vCPUs, earliest first.
    timer_events: BTreeSet<(u64, usize)>,
}

/// MSRs the guest reads and writes without exits (the CPU's own state).
pub const PASSTHROUGH_MSRS: [u32; 8] = [
    msr::FS_BASE,
    msr::GS_BASE,
    msr::KERNEL_GS_BASE,
    msr::STAR,
    msr::LSTAR,
    msr::CSTAR,
    msr::FMASK,
    msr::TSC_AUX,
];

/// The memslot of guest RAM.
pub const RAM_SLOT: SlotId = 0;

fn gp_fault() -> EventInjection {
    EventInjection {
        kind: EventKind::HardwareException,
        vector: vector::GP,
        error_code: Some(0),
        instruction_len: 0,
    }
}

impl Vm {
    /// An empty VM: host memory, one RAM memslot of `mem_size` bytes at gpa
    /// 0 and `vcpus` vCPUs in guest mode, all waiting (no kernel loaded).
    pub fn new(config: &VmConfig) -> Result<Vm, CreateError> {
        if config.vcpus == 0 || config.vcpus as usize > abi::MAX_CPUS {
            return Err(CreateError::BadVcpuCount(config.vcpus));
        }
        let two_mib = 2 << 20;
        if config.mem_size == 0
            || config.mem_size % two_mib != 0
            || config.mem_size > boot::MAX_GUEST_MEM
        {
            return Err(CreateError::BadMemSize(config.mem_size));
        }
        // Guest RAM, its EPT tables (one 4 KiB table per 2 MiB, plus the
        // upper levels) and slack. PhysMemory is a lazily-committed mmap,
        // so untouched frames cost no host RAM.
        let ept_tables = (config.mem_size / two_mib + 64) * 4096;
        let host_size = config.mem_size + ept_tables + config.host_overhead;
        let mem = PhysMemory::new(host_size)?;
        let mut frames = FrameAllocator::new(Hfn(1), Hfn(host_size >> 12));
        let root = TdpRoot::new(&mem, &mut frames)?;
        let mmu = Mmu::new(root);
        let mut slots = Memslots::default();
        slots.add(
            RAM_SLOT,
            Gfn(0),
            config.mem_size >> 12,
            SlotFlags::default(),
        )?;
        let vcpus = (0..config.vcpus)
            .map(|id| {
                let mut cpu = Cpu::new(CpuConfig {
                    apic_id: id,
                    ..CpuConfig::default()
                });
                cpu.set_vmx(Some(Self::controls(&mmu, id)));
                Vcpu {
                    cpu,
                    run: RunState::WaitingForStart,
                    kicked: false,
                    wake_not_before: 0,
                    timer_event: None,
                    stats: VcpuStats::default(),
                }
            })
            .collect();
        Ok(Vm {
            mem,
            frames,
            slots,
            mmu,
            vcpus,
            costs: config.costs,
            quantum: config.quantum.max(1),
            mem_size: config.mem_size,
            time: 0,
            serial: Vec::new(),
            reports: Vec::new(),
            stopped: None,
            kernel: None,
            timer_events: BTreeSet::new(),
        })
    }

    /// The VM-execution controls of vCPU `id`.
    fn controls(mmu: &Mmu, id: u32) -> VmxControls {
        VmxControls {
            exception_bitmap: 0,
            hlt_exiting: true,
            io_exiting: None,
            msr_exiting: MsrExiting::Bitmap {
                read_passthrough: PASSTHROUGH_MSRS.to_vec(),
                write_passthrough: PASSTHROUGH_MSRS.to_vec(),
            },
            virtualize_x2apic: true,
            external_interrupt_exiting: false,
            ept: Some(mmu.eptp()),
            vpid: id as u16 + 1,
            ..VmxControls::default()
        }
    }

    /// A VM booted per `abi`: the kernel loaded, boot page tables, GDT,
    /// BootInfo and stack built, the bootstrap vCPU ready at the entry point.
    pub fn boot(config: &VmConfig, kernel: &[u8]) -> Result<Vm, CreateError> {
        if config.cmdline.len() >= abi::CMDLINE_LEN {
            return Err(CreateError::CmdlineTooLong(config.cmdline.len()));
        }
        let (elf, image) = boot::parse_kernel(kernel, config.mem_size)?;
        let mut vm = Vm::new(config)?;
        vm.load_kernel(&elf)?;
        vm.write_guest(Gpa(boot::GDT_GPA), &gdt_bytes())?;
        for (gpa, entry) in boot::identity_map_entries(config.mem_size) {
            vm.write_guest(Gpa(gpa), &entry.to_le_bytes())?;
        }
        let mut info = abi::BootInfo {
            num_cpus: config.vcpus,
            mem_size: config.mem_size,
            tsc_hz: machine::cost::CYCLES_PER_SECOND,
            kernel_start: image.start,
            kernel_end: image.end,
            ..abi::BootInfo::default()
        };
        let map = boot::memory_map(config.mem_size, image.start, image.end);
        info.num_regions = map.len() as u32;
        info.regions[..map.len()].copy_from_slice(&map);
        for (i, id) in info
            .apic_ids
            .iter_mut()
            .take(config.vcpus as usize)
            .enumerate()
        {
            *id = i as u32;
        }
        info.cmdline[..config.cmdline.len()].copy_from_slice(config.cmdline.as_bytes());
        vm.write_guest(Gpa(boot::BOOT_INFO_GPA), info.as_bytes())?;
        let entry = image.entry;
        vm.kernel = Some(image);
        vm.start_vcpu(0, entry, boot::BOOT_STACK_TOP, boot::BOOT_INFO_GPA, 0);
        Ok(vm)
    }

    /// Copies the kernel's segments into guest RAM (zero-filling .bss).
    fn load_kernel(&mut self, elf: &machine::elf::ElfImage<'_>) -> Result<(), CreateError> {
        // `load_into` only translates, it cannot allocate: back every page
        // the segments cover first (demand paging would otherwise leave
        // them unbacked).
        for seg in &elf.segments {
            let mut page = seg.paddr & !0xfff;
            while page < seg.paddr_end() {
                self.backing_frame(Gpa(page).frame())?;
                page += 4096;
            }
        }
        let slots = &self.slots;
        machine::elf::load_into(elf, &self.mem, |paddr| {
            let gfn = Gpa(paddr).frame();
            slots.lookup(gfn)?.backing(gfn).map(frame_hpa)
        })
        .map_err(KernelError::from)?;
        Ok(())
    }

    /// Puts vCPU `index` in the abi boot state at `rip` with `rsp` and
    /// `rdi`, runnable from virtual time `at`.
    fn start_vcpu(&mut self, index: usize, rip: u64, rsp: u64, rdi: u64, at: u64) {
        let vcpu = &mut self.vcpus[index];
        let state = vcpu.cpu.state_mut();
        state.cr3 = boot::PML4_GPA;
        state.gdtr = DescriptorTable {
            base: boot::GDT_GPA,
            limit: (boot::GDT.len() * 8 - 1) as u16,
        };
        state.rip = rip;
        state.gpr[Gpr::Rsp as usize] = rsp;
        state.gpr[Gpr::Rdi as usize] = rdi;
        state.activity = Activity::Active;
        let now = vcpu.cpu.cycles();
        if at > now {
            vcpu.cpu.advance_cycles(at - now);
            vcpu.stats.idle_cycles += at - now;
        }
        vcpu.run = RunState::Runnable;
    }

    /// Adds a memslot (no backing allocated until touched).
    pub fn add_memslot(
        &mut self,
        id: SlotId,
        base: Gpa,
        size: u64,
        flags: SlotFlags,
    ) -> Result<(), MemslotError> {
        self.slots.add(id, base.frame(), size >> 12, flags)
    }

    /// Deletes a memslot: zaps every spte mapping its pages, flushes the
    /// EPT translations of every vCPU, frees the backing frames.
    pub fn delete_memslot(&mut self, id: SlotId) -> Result<(), MemslotError> {
        let slot = self.slots.delete(id)?;
        self.zap_slot(&slot);
        for (_, frame) in slot.backed_pages() {
            self.frames.free(frame);
        }
        Ok(())
    }

    /// Moves a memslot to a new guest-physical base; its contents move with
    /// it and its old mappings are zapped (they refault at the new gpa).
    pub fn move_memslot(&mut self, id: SlotId, new_base: Gpa) -> Result<(), MemslotError> {
        let slot = self
            .slots
            .get(id)
            .ok_or(MemslotError::NoSuchSlot(id))?
            .clone();
        self.slots.move_slot(id, new_base.frame())?;
        self.zap_slot(&slot);
        Ok(())
    }

    fn zap_slot(&mut self, slot: &Memslot) {
        let frames = slot.backed_pages().map(|(_, frame)| frame);
        // The rmap holds only addresses inside EPT tables the MMU allocated
        // in host memory, so clearing them cannot fail.
        let zapped = self.mmu.zap_frames(&self.mem, frames).unwrap_or(0);
        if zapped > 0 {
            let eptp = self.mmu.eptp();
            for vcpu in &mut self.vcpus {
                vcpu.cpu.invept(InveptKind::SingleContext(eptp));
            }
        }
    }

    /// The memslot generation.
    pub fn memslot_generation(&self) -> u64 {
        self.slots.generation()
    }

    /// Copies `bytes` into guest-physical memory, allocating backing frames
    /// for pages not yet touched (as the VMM writing its own mapping).
    pub fn write_guest(&mut self, gpa: Gpa, bytes: &[u8]) -> Result<(), GuestMemoryError> {
        let mut done = 0usize;
        while done < bytes.len() {
            let at = Gpa(gpa.0 + done as u64);
            let chunk = ((4096 - at.page_offset()) as usize).min(bytes.len() - done);
            let frame = self.backing_frame(at.frame())?;
            self.mem.write_bytes(
                frame_hpa(frame).add(at.page_offset()),
                &bytes[done..done + chunk],
            )?;
            done += chunk;
        }
        Ok(())
    }

    /// Reads guest-physical memory (untouched pages read as zero).
    pub fn read_guest(&self, gpa: Gpa, buf: &mut [u8]) -> Result<(), GuestMemoryError> {
        let mut done = 0usize;
        while done < buf.len() {
            let at = Gpa(gpa.0 + done as u64);
            let chunk = ((4096 - at.page_offset()) as usize).min(buf.len() - done);
            let slot = self
                .slots
                .lookup(at.frame())
                .ok_or(GuestMemoryError::Unmapped(at))?;
            match slot.backing(at.frame()) {
                Some(frame) => self.mem.read_bytes(
                    frame_hpa(frame).add(at.page_offset()),
                    &mut buf[done..done + chunk],
                )?,
                None => buf[done..done + chunk].fill(0),
            }
            done += chunk;
        }
        Ok(())
    }

    fn backing_frame(&mut self, gfn: Gfn) -> Result<Hfn, GuestMemoryError> {
        let slot = self
            .slots
            .lookup_mut(gfn)
            .ok_or(GuestMemoryError::Unmapped(gfn.addr()))?;
        if let Some(frame) = slot.backing(gfn) {
            return Ok(frame);
        }
        let frame = self.frames.alloc()?;
        self.mem.zero(frame_hpa(frame), 4096)?;
        slot.set_backing(gfn, frame);
        Ok(frame)
    }

    /// The MMU (for inspection).
    pub fn mmu(&self) -> &Mmu {
        &self.mmu
    }

    /// Host memory (for inspection).
    pub fn host_memory(&self) -> &PhysMemory {
        &self.mem
    }

    /// Guest RAM size in bytes.
    pub fn mem_size(&self) -> u64 {
        self.mem_size
    }

    /// The vCPUs.
    pub fn vcpus(&self) -> &[Vcpu] {
        &self.vcpus
    }

    /// Global virtual time in cycles.
    pub fn time(&self) -> u64 {
        self.time
    }

    /// Serial output not yet taken.
    pub fn take_serial(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.serial)
    }

    /// HC_REPORT lines so far.
    pub fn reports(&self) -> &[Report] {
        &self.reports
    }

    /// Why the VM stopped, if it did.
    pub fn stop_reason(&self) -> Option<&StopReason> {
        self.stopped.as_ref()
    }

    /// The loaded kernel, if booted from an ELF.
    pub fn kernel(&self) -> Option<&KernelImage> {
        self.kernel.as_ref()
    }

    /// Statistics so far.
    pub fn stats(&self) -> VmStats {
        VmStats {
            virtual_cycles: self.vcpus.iter().map(|v| v.cpu.cycles()).max().unwrap_or(0),
            vcpus: self
                .vcpus
                .iter()
                .map(|v| {
                    let mut s = v.stats.clone();
                    s.cycles = v.cpu.cycles();
                    s.instructions = v.cpu.stats().instructions;
                    s
                })
                .collect(),
            frames_in_use: self.frames.in_use(),
            frames_peak: self.frames.peak(),
            ept_tables: self.mmu.lock().root.table_count() as u64,
            memslot_generation: self.slots.generation(),
        }
    }

    /// Runs until global virtual time reaches `time_limit` or the VM stops.
    pub fn run_until(&mut self, time_limit: u64) -> RunStatus {
        while self.stopped.is_none() && self.time < time_limit {
            self.run_round();
        }
        match &self.stopped {
            Some(reason) => RunStatus::Stopped(reason.clone()),
            None => RunStatus::Running,
        }
    }

    /// Runs to completion.
    pub fn run(&mut self) -> StopReason {
        loop {
            if let RunStatus::Stopped(reason) = self.run_until(u64::MAX) {
                return reason;
            }
        }
    }

    /// One scheduling round.
    fn run_round(&mut self) {
        let runnable = (0..self.vcpus.len()).any(|i| {
            self.vcpus[i].run == RunState::Runnable
                || (self.vcpus[i].run == RunState::Halted && self.can_wake(i))
        });
        if !runnable {
            // Nothing to interpret: jump to the first timer that can wake
            // a vCPU.
            match self.timer_events.first().map(|&(deadline, _)| deadline) {
                Some(deadline) => self.time = self.time.max(deadline.saturating_sub(1)),
                None => {
                    self.stopped =
                        Some(StopReason::Error(VmError::AllHalted { cycles: self.time }));
                    return;
                }
            }
        }
        let round_end = self.time.saturating_add(self.quantum);
        for index in 0..self.vcpus.len() {
            if self.stopped.is_some() {
                return;
            }
            self.run_vcpu(index, round_end);
        }
        self.time = round_end;
    }

    /// The timer deadline (in cycles) that would wake halted vCPU `index`.
    fn halted_wake_deadline(&self, index: usize) -> Option<u64> {
        let vcpu = &self.vcpus[index];
        if vcpu.run != RunState::Halted || vcpu.cpu.state().rflags & rflags::IF == 0 {
            return None;
        }
        let offset = vcpu.cpu.vmx().map_or(0, |c| c.tsc_offset);
        let deadline = vcpu.cpu.apic().next_timer_deadline()?;
        Some(deadline.wrapping_sub(offset as u64).max(vcpu.cpu.cycles()))
    }

    /// vCPU `index` halts; its timer (if it can wake it) joins the queue.
    fn halt(&mut self, index: usize) {
        self.vcpus[index].run = RunState::Halted;
        self.register_timer(index);
    }

    fn register_timer(&mut self, index: usize) {
        if let Some(old) = self.vcpus[index].timer_event.take() {
            self.timer_events.remove(&(old, index));
        }
        // While halted nothing but the hv touches the APIC timer, so the
        // deadline stays valid until the vCPU runs again.
        if let Some(deadline) = self.halted_wake_deadline(index) {
            self.timer_events.insert((deadline, index));
            self.vcpus[index].timer_event = Some(deadline);
        }
    }

    /// vCPU `index` leaves the halted state.
    fn unhalt(&mut self, index: usize) {
        let vcpu = &mut self.vcpus[index];
        if let Some(old) = vcpu.timer_event.take() {
            self.timer_events.remove(&(old, index));
        }
        vcpu.kicked = false;
        vcpu.run = RunState::Runnable;
    }

    fn can_wake(&self, index: usize) -> bool {
        let vcpu = &self.vcpus[index];
        vcpu.kicked
            || vcpu.cpu.pending_injection().is_some()
            || (vcpu.cpu.state().rflags & rflags::IF != 0
                && vcpu.cpu.apic().deliverable_vector().is_some())
    }

    fn idle_until(&mut self, index: usize, until: u64) {
        let vcpu = &mut self.vcpus[index];
        let now = vcpu.cpu.cycles();
        if until > now {
            vcpu.cpu.advance_cycles(until - now);
            vcpu.stats.idle_cycles += until - now;
        }
    }

    fn run_vcpu(&mut self, index: usize, round_end: u64) {
        loop {
            match self.vcpus[index].run {
                RunState::WaitingForStart => {
                    self.idle_until(index, round_end);
                    return;
                }
                RunState::Halted => {
                    if self.can_wake(index) {
                        let at = self.vcpus[index].wake_not_before;
                        self.idle_until(index, at);
                        self.unhalt(index);
                        continue;
                    }
                    match self.vcpus[index].timer_event {
                        Some(deadline) if deadline < round_end => {
                            self.idle_until(index, deadline);
                            let vcpu = &mut self.vcpus[index];
                            let tsc = vcpu.cpu.tsc();
                            vcpu.cpu.apic_mut().update_timer(tsc);
                            if !self.can_wake(index) {
                                // The interrupt's priority is too low to
                                // wake it; a periodic timer re-armed.
                                self.register_timer(index);
                                self.idle_until(index, round_end);
                                return;
                            }
                        }
                        _ => {
                            self.idle_until(index, round_end);
                            return;
                        }
                    }
                }
                RunState::Runnable => {
                    let vcpu = &mut self.vcpus[index];
                    if vcpu.cpu.cycles() >= round_end {
                        return;
                    }
                    let before = vcpu.cpu.cycles();
                    let exit = vcpu.cpu.run(&self.mem, round_end);
                    let vcpu = &mut self.vcpus[index];
                    vcpu.stats.busy_cycles += vcpu.cpu.cycles() - before;
                    match self.handle_exit(index, exit) {
                        Next::Continue => {}
                        Next::Halt => self.halt(index),
                        Next::Stop(reason) => {
                            self.stopped = Some(reason);
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Handles one exit of vCPU `index`, charging the hv's work to it.
    fn handle_exit(&mut self, index: usize, exit: VmExit) -> Next {
        let name = exit.name();
        let vectoring = self.vcpus[index].cpu.idt_vectoring_info();
        let mut cycles = self.costs.exit_base;
        let next = match self.dispatch(index, exit, &mut cycles) {
            Ok(next) => next,
            Err(error) => Next::Stop(StopReason::Error(error)),
        };
        let vcpu = &mut self.vcpus[index];
        // An exit in the middle of delivering an event (e.g. an EPT
        // violation on the guest stack while pushing an interrupt frame)
        // loses the event unless the hv re-injects it, as on VMX.
        if let Some(event) = vectoring {
            if vcpu.cpu.pending_injection().is_none() {
                vcpu.cpu.inject_event(event);
                cycles += self.costs.event_injection;
            }
        }
        if name != "cycle_limit" {
            vcpu.cpu.advance_cycles(cycles);
            vcpu.stats.busy_cycles += cycles;
            let stat = vcpu.stats.exits.entry(name.to_string()).or_default();
            stat.count += 1;
            stat.hv_cycles += cycles;
        }
        next
    }

    fn rip(&self, index: usize) -> u64 {
        self.vcpus[index].cpu.state().rip
    }

    fn dispatch(&mut self, index: usize, exit: VmExit, cycles: &mut u64) -> Result<Next, VmError> {
        let rip = self.rip(index);
        let vcpu_id = index;
        match exit {
            VmExit::CycleLimit => Ok(Next::Continue),
            VmExit::TripleFault => Err(VmError::TripleFault { vcpu: vcpu_id, rip }),
            VmExit::EptViolation {
                gpa, qualification, ..
            } => {
                let now = self.vcpus[index].cpu.cycles() + *cycles;
                let outcome = handle_ept_violation(
                    now,
                    &self.mem,
                    &mut self.frames,
                    &mut self.slots,
                    &self.mmu,
                    &self.costs,
                    gpa,
                    qualification,
                );
                match outcome {
                    Ok(outcome) => {
                        *cycles += outcome.cycles;
                        let stats = &mut self.vcpus[index].stats;
                        stats.ept_faults += 1;
                        stats.frames_allocated += outcome.allocated as u64;
                        stats.mmu_lock_wait_cycles += outcome.lock_wait;
                        Ok(Next::Continue)
                    }
                    Err(FaultError::OutsideMemory { gpa }) => Err(VmError::OutsideMemory {
                        vcpu: vcpu_id,
                        gpa: gpa.0,
                        rip,
                    }),
                    Err(source) => Err(VmError::EptFault {
                        vcpu: vcpu_id,
                        gpa: gpa.0,
                        rip,
                        source,
                    }),
                }
            }
            VmExit::EptMisconfig { gpa } => Err(VmError::EptMisconfig {
                vcpu: vcpu_id,
                gpa: gpa.0,
                rip,
            }),
            VmExit::MachineError(error) => Err(VmError::Machine {
                vcpu: vcpu_id,
                rip,
                error,
            }),
            VmExit::Cpuid => {
                *cycles += self.costs.cpuid_msr;
                let cpu = &mut self.vcpus[index].cpu;
                let s = cpu.state();
                let leaf = s.gpr[Gpr::Rax as usize] as u32;
                let subleaf = s.gpr[Gpr::Rcx as usize] as u32;
                let r = guest_cpuid(leaf, subleaf, cpu.apic().id());
                let s = cpu.state_mut();
                for (reg, value) in [Gpr::Rax, Gpr::Rbx, Gpr::Rcx, Gpr::Rdx].into_iter().zip(r) {
                    s.gpr[reg as usize] = value as u64;
                }
                cpu.skip_instruction();
                Ok(Next::Continue)
            }
            VmExit::Hlt => {
                let vcpu = &mut self.vcpus[index];
                vcpu.cpu.skip_instruction();
                vcpu.stats.halts += 1;
                vcpu.wake_not_before = 0;
                Ok(Next::Halt)
            }
            VmExit::Io {
                port,
                size,
                direction,
                value,
            } => {
                *cycles += self.costs.io_emulation;
                Ok(self.handle_io(index, port, size, direction, value))
            }
            VmExit::MsrRead { index: msr_index } => {
                *cycles += self.costs.cpuid_msr;
                self.handle_rdmsr(index, msr_index);
                Ok(Next::Continue)
            }
            VmExit::MsrWrite {
                index: msr_index,
                value,
            } => {
                *cycles += self.costs.cpuid_msr;
                self.handle_wrmsr(index, msr_index, value);
                Ok(Next::Continue)
            }
            VmExit::Vmcall => {
                *cycles += self.costs.hypercall;
                self.handle_hypercall(index)
            }
            VmExit::Ipi(ipi) => self.route_ipi(index, ipi).map(|()| Next::Continue),
            other => Err(VmError::UnsupportedExit {
                vcpu: vcpu_id,
                rip,
                exit: format!("{other:?}"),
            }),
        }
    }

    fn handle_io(
        &mut self,
        index: usize,
        port: u16,
        size: u8,
        dir: IoDirection,
        value: u32,
    ) -> Next {
        let cpu = &mut self.vcpus[index].cpu;
        const COM1_LSR: u16 = abi::COM1_PORT + 5;
        // Transmitter empty and holding register empty: always ready.
        const LSR_THRE_TEMT: u32 = 0x60;
        match dir {
            IoDirection::Out => {
                cpu.skip_instruction();
                if port == abi::COM1_PORT {
                    self.serial.push(value as u8);
                } else if port == abi::DEBUG_EXIT_PORT {
                    let mask = if size >= 4 {
                        u32::MAX
                    } else {
                        (1 << (size * 8)) - 1
                    };
                    let v = value & mask;
                    return Next::Stop(StopReason::DebugExit {
                        status: (v << 1) | 1,
                    });
                }
                // Other COM1 registers and other ports: writes are ignored.
            }
            IoDirection::In => {
                let result = match port {
                    COM1_LSR => LSR_THRE_TEMT,
                    p if (abi::COM1_PORT..abi::COM1_PORT + 8).contains(&p) => 0,
                    // Nothing attached: the bus floats high.
                    _ => u32::MAX,
                };
                cpu.complete_io_in(size, result);
            }
        }
        Next::Continue
    }

    fn handle_rdmsr(&mut self, index: usize, msr_index: u32) {
        let cpu = &mut self.vcpus[index].cpu;
        let s = cpu.state();
        let value = match msr_index {
            msr::EFER => Some(s.efer),
            msr::PAT => Some(s.pat),
            msr::MISC_ENABLE => Some(s.misc_enable),
            msr::MTRR_DEF_TYPE => Some(s.mtrr_def_type),
            msr::SYSENTER_CS => Some(s.sysenter_cs),
            msr::SYSENTER_ESP => Some(s.sysenter_esp),
            msr::SYSENTER_EIP => Some(s.sysenter_eip),
            msr::TSC => Some(cpu.tsc()),
            msr::APIC_BASE | msr::TSC_DEADLINE => cpu.apic().read_msr(msr_index, cpu.tsc()).ok(),
            _ => None,
        };
        match value {
            Some(value) => cpu.complete_rdmsr(value),
            None => cpu.inject_event(gp_fault()),
        }
    }

    fn handle_wrmsr(&mut self, index: usize, msr_index: u32, value: u64) {
        let cpu = &mut self.vcpus[index].cpu;
        let ok = match msr_index {
            msr::EFER => {
                let s = cpu.state();
                // As KVM: LMA is read-only (a written value is ignored);
                // long mode stays on, so the guest may change SCE and NXE.
                let fixed = efer::LME;
                if value & !(efer::WRITABLE | efer::LMA) != 0 || value & fixed != s.efer & fixed {
                    false
                } else {
                    let new = (value & efer::WRITABLE) | (s.efer & efer::LMA);
                    cpu.state_mut().efer = new;
                    // NXE changes what translations allow.
                    let vpid = cpu.vmx().map_or(0, |c| c.vpid);
                    cpu.invvpid(InvvpidKind::SingleContext { vpid });
                    true
                }
            }
            msr::PAT => {
                cpu.state_mut().pat = value;
                true
            }
            msr::MISC_ENABLE => {
                cpu.state_mut().misc_enable = value;
                true
            }
            msr::MTRR_DEF_TYPE => {
                cpu.state_mut().mtrr_def_type = value;
                true
            }
            msr::SYSENTER_CS => {
                cpu.state_mut().sysenter_cs = value;
                true
            }
            msr::SYSENTER_ESP => {
                cpu.state_mut().sysenter_esp = value;
                true
            }
            msr::SYSENTER_EIP => {
                cpu.state_mut().sysenter_eip = value;
                true
            }
            msr::TSC => {
                // As KVM: writing the TSC sets the offset.
                let cycles = cpu.cycles();
                if let Some(c) = cpu.vmx_mut() {
                    c.tsc_offset = value.wrapping_sub(cycles) as i64;
                }
                true
            }
            msr::APIC_BASE | msr::TSC_DEADLINE => {
                let tsc = cpu.tsc();
                cpu.apic_mut().write_msr(msr_index, value, tsc).is_ok()
            }
            _ => false,
        };
        if ok {
            cpu.skip_instruction();
        } else {
            cpu.inject_event(gp_fault());
        }
    }

    fn vcpu_by_apic_id(&self, apic_id: u64) -> Option<usize> {
        self.vcpus
            .iter()
            .position(|v| u64::from(v.cpu.apic().id()) == apic_id)
    }

    fn handle_hypercall(&mut self, index: usize) -> Result<Next, VmError> {
        let s = self.vcpus[index].cpu.state();
        let [nr, a0, a1, a2, a3] =
            [Gpr::Rax, Gpr::Rbx, Gpr::Rcx, Gpr::Rdx, Gpr::Rsi].map(|r| s.gpr[r as usize]);
        let now = self.vcpus[index].cpu.cycles();
        let result: i64 = if s.cpl() != 0 {
            -errno::EPERM
        } else {
            match nr {
                abi::HC_START_CPU => match self.vcpu_by_apic_id(a0) {
                    None => -errno::EINVAL,
                    Some(_)
                        if !machine::addr::is_canonical(a1) || !machine::addr::is_canonical(a2) =>
                    {
                        -errno::EINVAL
                    }
                    Some(target) if self.vcpus[target].run != RunState::WaitingForStart => {
                        -errno::EBUSY
                    }
                    Some(target) => {
                        self.start_vcpu(target, a1, a2, a3, now);
                        0
                    }
                },
                abi::HC_REPORT => {
                    if a1 > abi::REPORT_MAX {
                        -errno::E2BIG
                    } else {
                        let mut buf = vec![0; a1 as usize];
                        match self.read_guest(Gpa(a0), &mut buf) {
                            Err(_) => -errno::EFAULT,
                            Ok(()) => match String::from_utf8(buf) {
                                Err(_) => -errno::EINVAL,
                                Ok(line) => {
                                    self.reports.push(Report {
                                        vcpu: index,
                                        cycles: now,
                                        line,
                                    });
                                    0
                                }
                            },
                        }
                    }
                }
                abi::HC_SHUTDOWN => {
                    self.vcpus[index].cpu.skip_instruction();
                    return Ok(Next::Stop(StopReason::Shutdown { status: a0 }));
                }
                abi::KVM_HC_KICK_CPU => {
                    // As KVM: an unknown APIC id is ignored.
                    if let Some(target) = self.vcpu_by_apic_id(a1) {
                        self.wake(target, now);
                        self.vcpus[target].kicked = true;
                    }
                    0
                }
                _ => -errno::KVM_ENOSYS,
            }
        };
        let cpu = &mut self.vcpus[index].cpu;
        cpu.state_mut().gpr[Gpr::Rax as usize] = result as u64;
        cpu.skip_instruction();
        Ok(Next::Continue)
    }

    /// Records that vCPU `target` may wake no earlier than `at`.
    fn wake(&mut self, target: usize, at: u64) {
        let vcpu = &mut self.vcpus[target];
        vcpu.wake_not_before = vcpu.wake_not_before.max(at);
    }

    /// Routes an IPI the APIC of vCPU `index` sent.
    fn route_ipi(&mut self, index: usize, ipi: Ipi) -> Result<(), VmError> {
        let rip = self.rip(index);
        let sender = self.vcpus[index].cpu.apic().id();
        let now = self.vcpus[index].cpu.cycles();
        match ipi.mode {
            // Lowest priority is delivered like fixed to every destination
            // (the "focus processor" choice is the platform's; all is legal
            // for a single-destination use and deterministic).
            IpiMode::Fixed | IpiMode::LowestPriority => {
                for target in 0..self.vcpus.len() {
                    if self.vcpus[target]
                        .cpu
                        .apic()
                        .is_destination(ipi.dest, sender)
                    {
                        self.vcpus[target]
                            .cpu
                            .apic_mut()
                            .accept_interrupt(ipi.vector);
                        self.wake(target, now);
                    }
                }
                self.vcpus[index].stats.ipis_sent += 1;
                Ok(())
            }
            // APs are started with HC_START_CPU; INIT/SIPI, NMI and SMI
            // IPIs are not modelled.
            other => Err(VmError::UnsupportedExit {
                vcpu: index,
                rip,
                exit: format!("IPI with delivery mode {other:?} (start APs with HC_START_CPU)"),
            }),
        }
    }
}

fn gdt_bytes() -> Vec<u8> {
    boot::GDT.iter().flat_map(|d| d.to_le_bytes()).collect()
}
