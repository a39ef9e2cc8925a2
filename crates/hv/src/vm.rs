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
//! vCPUs' deadlines sit in an event queue in virtual time (`events`,
//! ordered by deadline then vCPU); when no vCPU can run, the VM jumps
//! straight to the earliest event.
//! Nothing depends on host time or hash order, so the same configuration
//! gives the same output and cycle counts.

use crate::apf::{ApfMode, ApfProtocol, ApfState, ApfVcpu, ApfWork, EventConfig};
use crate::boot::{self, KernelError, KernelImage};
use crate::cost::HvCosts;
use crate::cpuid::guest_cpuid;
use crate::error::{ApfStateError, CreateError, GuestMemoryError, VmError};
use crate::frames::{frame_hpa, FrameAllocator};
use crate::memslot::{Memslot, MemslotError, Memslots, PageState, SlotFlags, SlotId};
use crate::mmu::fault::{install_mapping, FaultError};
use crate::mmu::{tdp::TdpRoot, Mmu};
use crate::pager::{Host, PageRef, Pager, Work};
use crate::stats::{VcpuStats, VmStats};
use crate::swap::{DeviceModel, SwapSlot};
use abi::errno;
use machine::cpu::state::{efer, msr, rflags, DescriptorTable};
use machine::cpu::{vector, Activity, Gpr};
use machine::vmx::{InveptKind, InvvpidKind, IoDirection, Ipi, IpiMode, MsrExiting};
use machine::VmxControls;
use machine::{Cpu, CpuConfig, EventInjection, EventKind, Gfn, Gpa, Hfn, PhysMemory, VmExit};
use std::collections::BTreeSet;
use std::path::PathBuf;

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
    /// Host frames for guest pages (the container limit); `None`: as much
    /// as guest memory, so nothing is ever evicted.
    pub host_mem: Option<u64>,
    /// The swap file; `None`: a temporary file, removed at exit.
    pub swap_path: Option<PathBuf>,
    /// The swap device model.
    pub swap_device: DeviceModel,
    /// How a vCPU waits for a page on swap.
    pub apf: ApfMode,
    /// The paravirtual protocol of `ApfMode::Pv`.
    pub apf_protocol: ApfProtocol,
    /// Seeds the device model's latency draws.
    pub seed: u64,
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
            host_mem: None,
            swap_path: None,
            swap_device: DeviceModel::default(),
            apf: ApfMode::Off,
            apf_protocol: ApfProtocol::X86,
            seed: 1,
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
    /// Stalled until a page read completes; nothing else happens to it
    /// (no interrupts), as a vCPU blocked in a synchronous host fault.
    Stalled {
        until: u64,
        slot: SwapSlot,
    },
    /// Halted in the hv on an outstanding async fault: wakes when one of
    /// its pages arrives or an interrupt can be taken (KVM's APF halt).
    ApfHalted,
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
    /// While halted or stalled: the deadline registered in the VM's event
    /// queue (timer, page arrival or end of a stall).
    wake_event: Option<u64>,
    apf: ApfVcpu,
    stats: VcpuStats,
}

impl Vcpu {
    /// The machine CPU.
    pub fn cpu(&self) -> &Cpu {
        &self.cpu
    }

    /// The host APF state.
    pub fn apf(&self) -> &ApfVcpu {
        &self.apf
    }
}

/// Exits whose handler asks the scheduler to do something.
enum Next {
    Continue,
    Halt,
    /// Wait, without interrupts, for the read of `slot` due at `until`.
    Stall {
        until: u64,
        slot: SwapSlot,
    },
    /// Halt until an outstanding page arrives or an interrupt comes.
    ApfHalt,
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
    /// The event queue in virtual time: (deadline, vCPU) of what will wake
    /// halted or stalled vCPUs (timers, page arrivals), earliest first.
    events: BTreeSet<(u64, usize)>,
    pager: Pager,
    apf_mode: ApfMode,
    apf_protocol: ApfProtocol,
    /// CPUID 0x40000001 EAX.
    kvm_features: u32,
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

/// Disjoint borrows of the VM's parts the pager works on (a macro, so the
/// borrow checker sees the individual fields).
macro_rules! host {
    ($vm:expr) => {
        Host {
            mem: &$vm.mem,
            frames: &mut $vm.frames,
            slots: &mut $vm.slots,
            mmu: &$vm.mmu,
            costs: &$vm.costs,
        }
    };
}

/// The smallest host memory pool: room for every page one instruction can
/// need at once (code, data, stack, four levels of guest page tables, an
/// IDT/TSS delivery) many times over, so eviction cannot livelock.
pub const MIN_HOST_MEM: u64 = 4 << 20;

/// CPUID 0x40000001 EAX for an APF configuration.
fn kvm_features(mode: ApfMode, protocol: ApfProtocol) -> u32 {
    let mut features = abi::KVM_FEATURE_PV_UNHALT;
    if mode == ApfMode::Pv && protocol == ApfProtocol::X86 {
        features |= abi::KVM_FEATURE_ASYNC_PF | abi::KVM_FEATURE_ASYNC_PF_INT;
    }
    features
}

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
        let limit = config
            .host_mem
            .unwrap_or(config.mem_size)
            .min(config.mem_size);
        if limit < MIN_HOST_MEM {
            return Err(CreateError::HostMemTooSmall {
                host_mem: limit,
                min: MIN_HOST_MEM,
            });
        }
        let mut pager = Pager::new(
            limit >> 12,
            config.swap_path.clone(),
            config.swap_device.clone(),
            config.seed,
        );
        if limit < config.mem_size {
            pager.open_swap()?;
        }
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
                    wake_event: None,
                    apf: ApfVcpu::default(),
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
            events: BTreeSet::new(),
            pager,
            apf_mode: config.apf,
            apf_protocol: config.apf_protocol,
            kvm_features: kvm_features(config.apf, config.apf_protocol),
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
        // Pages wholly in a segment's zero-filled tail (.bss) need no frame:
        // an untouched page reads as zero. Keeping them would make them
        // the pager's first victims, written to swap and read back later.
        for seg in &elf.segments {
            let zero_from = (seg.paddr + seg.data.len() as u64).next_multiple_of(4096);
            let mut page = zero_from;
            while page + 4096 <= seg.paddr_end() {
                let gfn = Gpa(page).frame();
                if let Some(slot) = self.slots.lookup_mut(gfn) {
                    if let PageState::Resident(frame) = slot.state(gfn) {
                        let page = PageRef {
                            slot: slot.id,
                            index: slot.index_of(gfn),
                        };
                        slot.set_untouched(page.index);
                        self.frames.free(frame);
                        self.pager.forget_resident(page);
                    }
                }
                page += 4096;
            }
        }
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
        let cancelled = self.pager.forget_memslot(&self.slots, id);
        for vcpu in &mut self.vcpus {
            // Their pages are gone: forget the faults, the pages will
            // never be announced.
            vcpu.apf
                .works
                .retain(|w| self.slots.lookup(w.gfn).is_none_or(|s| s.id != id));
        }
        let slot = self.slots.delete(id)?;
        self.zap_slot(&slot);
        for (_, frame) in slot.backed_pages() {
            self.frames.free(frame);
            self.pager.note_freed();
        }
        for frame in cancelled {
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
    /// for pages not yet touched and reading swapped-out pages back first
    /// (as the VMM writing its own mapping).
    pub fn write_guest(&mut self, gpa: Gpa, bytes: &[u8]) -> Result<(), GuestMemoryError> {
        let mut done = 0usize;
        while done < bytes.len() {
            let at = Gpa(gpa.0 + done as u64);
            let chunk = ((4096 - at.page_offset()) as usize).min(bytes.len() - done);
            let frame = self.backing_frame(at.frame())?;
            // The EPT dirty bit does not see the hv's own stores: make the
            // swap copy stale explicitly.
            let page = self.page_ref(at.frame())?;
            self.pager.drop_swap_copy(&mut self.slots, page);
            self.mem.write_bytes(
                frame_hpa(frame).add(at.page_offset()),
                &bytes[done..done + chunk],
            )?;
            done += chunk;
        }
        Ok(())
    }

    /// Reads guest-physical memory (untouched pages read as zero; swapped
    /// pages are read back in).
    pub fn read_guest(&mut self, gpa: Gpa, buf: &mut [u8]) -> Result<(), GuestMemoryError> {
        let mut done = 0usize;
        while done < buf.len() {
            let at = Gpa(gpa.0 + done as u64);
            let chunk = ((4096 - at.page_offset()) as usize).min(buf.len() - done);
            let slot = self
                .slots
                .lookup(at.frame())
                .ok_or(GuestMemoryError::Unmapped(at))?;
            match slot.state(at.frame()) {
                PageState::Untouched => buf[done..done + chunk].fill(0),
                _ => {
                    let frame = self.backing_frame(at.frame())?;
                    self.mem.read_bytes(
                        frame_hpa(frame).add(at.page_offset()),
                        &mut buf[done..done + chunk],
                    )?;
                }
            }
            done += chunk;
        }
        Ok(())
    }

    fn page_ref(&self, gfn: Gfn) -> Result<PageRef, GuestMemoryError> {
        let slot = self
            .slots
            .lookup(gfn)
            .ok_or(GuestMemoryError::Unmapped(gfn.addr()))?;
        Ok(PageRef {
            slot: slot.id,
            index: slot.index_of(gfn),
        })
    }

    /// The frame holding `gfn` for an access by the hv itself: allocated
    /// and zeroed on first touch, read back synchronously from swap.
    fn backing_frame(&mut self, gfn: Gfn) -> Result<Hfn, GuestMemoryError> {
        let page = self.page_ref(gfn)?;
        let now = self.time;
        let state = self
            .slots
            .lookup(gfn)
            .ok_or(GuestMemoryError::Unmapped(gfn.addr()))?
            .state(gfn);
        let (frame, work) = match state {
            PageState::Resident(frame) => return Ok(frame),
            PageState::Untouched => {
                let mut host = host!(self);
                self.pager.first_touch(&mut host, page, gfn, now)?
            }
            PageState::Swapped(slot) => match self.pager.in_flight(slot) {
                // On its way in: the hv does not wait in virtual time.
                Some(_) => {
                    let (_, frame) = self
                        .pager
                        .finish_page_in(&mut self.slots, slot)
                        .ok_or(GuestMemoryError::Unmapped(gfn.addr()))?;
                    (frame, Work::default())
                }
                None => {
                    let mut host = host!(self);
                    self.pager.swap_in_now(&mut host, page, slot, now)?
                }
            },
        };
        if work.flush {
            self.flush_ept();
        }
        Ok(frame)
    }

    /// INVEPT on every vCPU (after sptes were zapped).
    fn flush_ept(&mut self) {
        let eptp = self.mmu.eptp();
        for vcpu in &mut self.vcpus {
            vcpu.cpu.invept(InveptKind::SingleContext(eptp));
        }
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
                    s.apf = v.apf.stats;
                    s
                })
                .collect(),
            frames_in_use: self.frames.in_use(),
            frames_peak: self.frames.peak(),
            ept_tables: self.mmu.lock().root.table_count() as u64,
            memslot_generation: self.slots.generation(),
            host_mem_pages: self.pager.limit(),
            resident_pages: self.pager.resident(),
            pager: self.pager.stats(),
            device: self.pager.device_stats(),
            device_desc: {
                let m = self.pager.device_model();
                format!(
                    "{}: read latency {}, write setup {}, {} MB/s, queue {}",
                    m.name,
                    m.read_latency,
                    crate::swap::device::format_duration(m.write_latency),
                    m.bandwidth / 1_000_000,
                    m.queue
                )
            },
            apf_mode: self.apf_mode.name(),
            apf_protocol: self.apf_protocol.name(),
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
        let runnable = (0..self.vcpus.len()).any(|i| match self.vcpus[i].run {
            RunState::Runnable => true,
            RunState::Halted | RunState::ApfHalted => self.can_wake(i),
            RunState::WaitingForStart | RunState::Stalled { .. } => false,
        });
        if !runnable {
            // Nothing to interpret: jump to the first event that can wake
            // a vCPU.
            match self.events.first().map(|&(deadline, _)| deadline) {
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
    fn timer_wake_deadline(&self, index: usize) -> Option<u64> {
        let vcpu = &self.vcpus[index];
        if vcpu.cpu.state().rflags & rflags::IF == 0 {
            return None;
        }
        let offset = vcpu.cpu.vmx().map_or(0, |c| c.tsc_offset);
        let deadline = vcpu.cpu.apic().next_timer_deadline()?;
        Some(deadline.wrapping_sub(offset as u64).max(vcpu.cpu.cycles()))
    }

    /// When something may wake vCPU `index` (halted or stalled).
    fn wake_deadline(&self, index: usize) -> Option<u64> {
        let vcpu = &self.vcpus[index];
        match vcpu.run {
            RunState::Halted | RunState::ApfHalted => {
                // While halted nothing but the hv touches the APIC timer,
                // so its deadline stays valid until the vCPU runs again.
                let timer = self.timer_wake_deadline(index);
                let page = vcpu.apf.next_ready_at();
                match (timer, page) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            }
            RunState::Stalled { until, .. } => Some(until),
            RunState::Runnable | RunState::WaitingForStart => None,
        }
    }

    /// vCPU `index` enters `state` (halted or stalled); what can wake it
    /// joins the event queue.
    fn block(&mut self, index: usize, state: RunState) {
        self.vcpus[index].run = state;
        self.register_event(index);
    }

    fn register_event(&mut self, index: usize) {
        if let Some(old) = self.vcpus[index].wake_event.take() {
            self.events.remove(&(old, index));
        }
        if let Some(deadline) = self.wake_deadline(index) {
            self.events.insert((deadline, index));
            self.vcpus[index].wake_event = Some(deadline);
        }
    }

    /// vCPU `index` becomes runnable.
    fn set_runnable(&mut self, index: usize) {
        let vcpu = &mut self.vcpus[index];
        if let Some(old) = vcpu.wake_event.take() {
            self.events.remove(&(old, index));
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

    /// Advances vCPU `index`'s clock to `until` without running it.
    fn idle_until(&mut self, index: usize, until: u64) {
        let vcpu = &mut self.vcpus[index];
        let now = vcpu.cpu.cycles();
        if until > now {
            let idle = until - now;
            vcpu.cpu.advance_cycles(idle);
            vcpu.stats.idle_cycles += idle;
            match vcpu.run {
                RunState::Stalled { .. } => vcpu.apf.stats.stall_cycles += idle,
                RunState::ApfHalted => vcpu.apf.stats.halt_cycles += idle,
                _ => {}
            }
        }
    }

    fn run_vcpu(&mut self, index: usize, round_end: u64) {
        // Wake-ups of a halted vCPU that moved no clock (a guard against
        // spinning on a deadline that cannot wake it).
        let mut stuck = 0;
        loop {
            if let Err(error) = self.process_io(index) {
                self.stopped = Some(StopReason::Error(error));
                return;
            }
            match self.vcpus[index].run {
                RunState::WaitingForStart => {
                    self.idle_until(index, round_end);
                    return;
                }
                RunState::Stalled { until, .. } => {
                    // process_io made it runnable if the read is done.
                    if until >= round_end {
                        self.idle_until(index, round_end);
                        return;
                    }
                    self.idle_until(index, until);
                }
                RunState::Halted | RunState::ApfHalted => {
                    if self.can_wake(index) {
                        let at = self.vcpus[index].wake_not_before;
                        self.idle_until(index, at);
                        self.set_runnable(index);
                        continue;
                    }
                    let now = self.vcpus[index].cpu.cycles();
                    match self.vcpus[index].wake_event {
                        Some(deadline) if deadline < round_end => {
                            if deadline <= now {
                                stuck += 1;
                                if stuck > 2 {
                                    // Nothing moves (a timer interrupt of
                                    // too low a priority, say): let the
                                    // round end.
                                    self.idle_until(index, round_end);
                                    return;
                                }
                            }
                            self.idle_until(index, deadline);
                            let vcpu = &mut self.vcpus[index];
                            let tsc = vcpu.cpu.tsc();
                            vcpu.cpu.apic_mut().update_timer(tsc);
                            self.register_event(index);
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
                    // Stop at the next page arrival to announce it on time.
                    let limit = vcpu
                        .apf
                        .next_ready_at()
                        .map_or(round_end, |t| t.min(round_end));
                    let before = vcpu.cpu.cycles();
                    let exit = vcpu.cpu.run(&self.mem, limit);
                    let vcpu = &mut self.vcpus[index];
                    vcpu.stats.busy_cycles += vcpu.cpu.cycles() - before;
                    match self.handle_exit(index, exit) {
                        Next::Continue => {}
                        Next::Halt => self.block(index, RunState::Halted),
                        Next::Stall { until, slot } => {
                            self.vcpus[index].apf.stats.stalls += 1;
                            self.block(index, RunState::Stalled { until, slot });
                        }
                        Next::ApfHalt => {
                            self.vcpus[index].apf.stats.halts += 1;
                            self.block(index, RunState::ApfHalted);
                        }
                        Next::Stop(reason) => {
                            self.stopped = Some(reason);
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Completes what is due on vCPU `index`'s clock: the read it stalls
    /// on, its async faults whose pages arrived (prefaulted, announced).
    fn process_io(&mut self, index: usize) -> Result<(), VmError> {
        let now = self.vcpus[index].cpu.cycles();
        if let RunState::Stalled { until, slot } = self.vcpus[index].run {
            if until <= now {
                self.pager.finish_page_in(&mut self.slots, slot);
                self.set_runnable(index);
            }
        }
        let mut arrived = false;
        while let Some(i) = self.next_due_work(index, now) {
            let work = self.vcpus[index].apf.works.remove(i);
            arrived = true;
            self.pager.finish_page_in(&mut self.slots, work.swap_slot);
            // Prefault: map the page now so the retried access does not
            // exit again (KVM's kvm_arch_async_page_ready).
            self.prefault(index, work.gfn, now)?;
            let apf = &mut self.vcpus[index].apf;
            apf.gfns.remove(work.gfn);
            if work.notified {
                apf.ready_queue.push_back(work.token);
            }
        }
        if arrived && self.vcpus[index].run == RunState::ApfHalted {
            self.set_runnable(index);
        }
        if !self.vcpus[index].apf.ready_queue.is_empty() {
            self.deliver_ready(index)?;
            if matches!(
                self.vcpus[index].run,
                RunState::Halted | RunState::ApfHalted
            ) {
                self.register_event(index);
            }
        } else if arrived && self.vcpus[index].run == RunState::Halted {
            self.register_event(index);
        }
        Ok(())
    }

    /// The index of the earliest async fault of vCPU `index` due by `now`.
    fn next_due_work(&self, index: usize, now: u64) -> Option<usize> {
        let works = &self.vcpus[index].apf.works;
        (0..works.len())
            .filter(|&i| works[i].ready_at <= now)
            .min_by_key(|&i| (works[i].ready_at, works[i].token))
    }

    /// Maps resident `gfn` ahead of the guest's access, charging vCPU
    /// `index`.
    fn prefault(&mut self, index: usize, gfn: Gfn, now: u64) -> Result<(), VmError> {
        let rip = self.rip(index);
        let Some(slot) = self.slots.lookup(gfn) else {
            return Ok(());
        };
        let PageState::Resident(frame) = slot.state(gfn) else {
            return Ok(());
        };
        let writable = !slot.flags.readonly;
        let outcome = install_mapping(
            now,
            &self.mem,
            &mut self.frames,
            &self.mmu,
            &self.costs,
            gfn,
            frame,
            writable,
        )
        .map_err(|source| VmError::EptFault {
            vcpu: index,
            gpa: gfn.addr().0,
            rip,
            source,
        })?;
        let vcpu = &mut self.vcpus[index];
        vcpu.cpu.advance_cycles(outcome.cycles);
        vcpu.stats.busy_cycles += outcome.cycles;
        vcpu.stats.mmu_lock_wait_cycles += outcome.lock_wait;
        Ok(())
    }

    fn guest_u32(&mut self, index: usize, gpa: Gpa) -> Result<u32, VmError> {
        let mut buf = [0u8; 4];
        self.read_guest(gpa, &mut buf)
            .map_err(|source| self.guest_memory_error(index, source))?;
        Ok(u32::from_le_bytes(buf))
    }

    fn set_guest_u32(&mut self, index: usize, gpa: Gpa, value: u32) -> Result<(), VmError> {
        self.write_guest(gpa, &value.to_le_bytes())
            .map_err(|source| self.guest_memory_error(index, source))
    }

    fn guest_memory_error(&self, index: usize, source: GuestMemoryError) -> VmError {
        VmError::GuestMemory {
            vcpu: index,
            rip: self.rip(index),
            source,
        }
    }

    /// Sends queued page-ready notifications of vCPU `index`, one at a
    /// time: each waits until the guest has emptied the token slot.
    fn deliver_ready(&mut self, index: usize) -> Result<(), VmError> {
        let protocol = self.apf_protocol;
        if !self.vcpus[index].apf.enabled(protocol) {
            self.vcpus[index].apf.ready_queue.clear();
            return Ok(());
        }
        let slot = Gpa(self.vcpus[index].apf.area(protocol).0 + 4);
        while let Some(&token) = self.vcpus[index].apf.ready_queue.front() {
            if self.guest_u32(index, slot)? != 0 {
                break; // not acknowledged yet
            }
            self.set_guest_u32(index, slot, token)?;
            let vcpu = &mut self.vcpus[index];
            let vector = vcpu.apf.ready_vector(protocol);
            vcpu.cpu.apic_mut().accept_interrupt(vector);
            vcpu.apf.ready_queue.pop_front();
            vcpu.apf.stats.ready += 1;
            if token == abi::APF_WAKE_ALL {
                vcpu.apf.stats.wake_all += 1;
            }
            let cost = self.costs.event_injection;
            vcpu.cpu.advance_cycles(cost);
            vcpu.stats.busy_cycles += cost;
        }
        Ok(())
    }

    /// Handles one exit of vCPU `index`, charging the hv's work to it.
    fn handle_exit(&mut self, index: usize, exit: VmExit) -> Next {
        let name = exit.name();
        let vectoring = self.vcpus[index].cpu.idt_vectoring_info();
        let mut cycles = self.costs.exit_base;
        let next = match self.dispatch(index, exit, vectoring.is_some(), &mut cycles) {
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

    fn dispatch(
        &mut self,
        index: usize,
        exit: VmExit,
        vectoring: bool,
        cycles: &mut u64,
    ) -> Result<Next, VmError> {
        let rip = self.rip(index);
        let vcpu_id = index;
        match exit {
            VmExit::CycleLimit => Ok(Next::Continue),
            VmExit::TripleFault => Err(VmError::TripleFault {
                vcpu: vcpu_id,
                rip,
                cause: self.vcpus[index].cpu.triple_fault_cause(),
            }),
            VmExit::EptViolation {
                gpa, qualification, ..
            } => self.ept_violation(index, gpa, qualification, vectoring, cycles),
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
                let r = guest_cpuid(leaf, subleaf, cpu.apic().id(), self.kvm_features);
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
                if !self.apf_rdmsr(index, msr_index) {
                    self.handle_rdmsr(index, msr_index);
                }
                Ok(Next::Continue)
            }
            VmExit::MsrWrite {
                index: msr_index,
                value,
            } => {
                *cycles += self.costs.cpuid_msr;
                if !self.apf_wrmsr(index, msr_index, value)? {
                    self.handle_wrmsr(index, msr_index, value);
                }
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

    /// An EPT violation: demand paging of guest RAM, and the async page
    /// fault policy when the page is on swap.
    fn ept_violation(
        &mut self,
        index: usize,
        gpa: Gpa,
        qual: u64,
        vectoring: bool,
        cycles: &mut u64,
    ) -> Result<Next, VmError> {
        let rip = self.rip(index);
        let now = self.vcpus[index].cpu.cycles() + *cycles;
        let fault_error = |source| VmError::EptFault {
            vcpu: index,
            gpa: gpa.0,
            rip,
            source,
        };
        let pager_error = |source| VmError::Pager {
            vcpu: index,
            gpa: gpa.0,
            rip,
            source,
        };
        *cycles += self.costs.memslot_lookup;
        let gfn = gpa.frame();
        let slot = self.slots.lookup(gfn).ok_or(VmError::OutsideMemory {
            vcpu: index,
            gpa: gpa.0,
            rip,
        })?;
        let writable = !slot.flags.readonly;
        if qual & machine::vmx::ept_qual::WRITE != 0 && !writable {
            return Err(fault_error(FaultError::ReadOnly { gpa }));
        }
        let page = PageRef {
            slot: slot.id,
            index: slot.index_of(gfn),
        };
        let frame = match slot.state(gfn) {
            PageState::Resident(frame) => frame,
            PageState::Untouched => {
                let mut host = host!(self);
                let (frame, work) = self
                    .pager
                    .first_touch(&mut host, page, gfn, now)
                    .map_err(pager_error)?;
                *cycles += work.cycles;
                if work.flush {
                    self.flush_ept();
                    *cycles += self.costs.invept;
                }
                self.vcpus[index].stats.frames_allocated += 1;
                frame
            }
            PageState::Swapped(swap_slot) => {
                let read = match self.pager.in_flight(swap_slot) {
                    Some(read) => {
                        self.vcpus[index].apf.stats.repeat_faults += 1;
                        read
                    }
                    None => {
                        let mut host = host!(self);
                        let (read, work) = self
                            .pager
                            .start_page_in(&mut host, page, swap_slot, now)
                            .map_err(pager_error)?;
                        *cycles += work.cycles;
                        if work.flush {
                            self.flush_ept();
                            *cycles += self.costs.invept;
                        }
                        read
                    }
                };
                if read.ready_at > now + *cycles {
                    self.vcpus[index].stats.ept_faults += 1;
                    return self.wait_for_page(
                        index,
                        gfn,
                        swap_slot,
                        read.ready_at,
                        vectoring,
                        cycles,
                    );
                }
                self.pager
                    .finish_page_in(&mut self.slots, swap_slot)
                    .map(|(_, frame)| frame)
                    .ok_or_else(|| VmError::UnsupportedExit {
                        vcpu: index,
                        rip,
                        exit: format!("page-in of gpa {:#x} vanished (an hv bug)", gpa.0),
                    })?
            }
        };
        let outcome = install_mapping(
            now + *cycles,
            &self.mem,
            &mut self.frames,
            &self.mmu,
            &self.costs,
            gfn,
            frame,
            writable,
        )
        .map_err(fault_error)?;
        *cycles += outcome.cycles;
        let stats = &mut self.vcpus[index].stats;
        stats.ept_faults += 1;
        stats.mmu_lock_wait_cycles += outcome.lock_wait;
        Ok(Next::Continue)
    }

    /// vCPU `index` touched `gfn`, whose read from swap completes at
    /// `ready_at`: KVM's choice between waiting synchronously, halting,
    /// and telling the guest.
    fn wait_for_page(
        &mut self,
        index: usize,
        gfn: Gfn,
        slot: SwapSlot,
        ready_at: u64,
        vectoring: bool,
        cycles: &mut u64,
    ) -> Result<Next, VmError> {
        let stall = Next::Stall {
            until: ready_at,
            slot,
        };
        if self.apf_mode == ApfMode::Off {
            return Ok(stall);
        }
        let vcpu = &self.vcpus[index];
        // kvm_can_do_async_pf: with interrupts off, or an event to
        // re-inject, not even the halt can be used.
        let interrupts_allowed = vcpu.cpu.state().rflags & rflags::IF != 0
            && vcpu.cpu.pending_injection().is_none()
            && !vectoring;
        if !interrupts_allowed {
            return Ok(stall);
        }
        if vcpu.apf.gfns.contains(gfn) {
            // Already outstanding (the guest retried, or another task of
            // it touched the page): halt until it arrives.
            return Ok(Next::ApfHalt);
        }
        if vcpu.apf.works.len() as u64 >= abi::APF_MAX_OUTSTANDING {
            return Ok(stall);
        }
        let apic_id = vcpu.cpu.apic().id();
        let apf = &mut self.vcpus[index].apf;
        let token = apf.new_token(apic_id);
        apf.gfns.add(gfn);
        apf.works.push(ApfWork {
            token,
            gfn,
            swap_slot: slot,
            ready_at,
            notified: false,
        });
        apf.stats.peak_outstanding = apf.stats.peak_outstanding.max(apf.works.len() as u64);
        if self.apf_mode == ApfMode::Pv && self.notify_not_present(index, token)? {
            *cycles += self.costs.event_injection;
            let apf = &mut self.vcpus[index].apf;
            if let Some(work) = apf.works.last_mut() {
                work.notified = true;
            }
            apf.stats.not_present += 1;
            return Ok(Next::Continue);
        }
        Ok(Next::ApfHalt)
    }

    /// Delivers page-not-present for `token` if the guest can take it now
    /// (delivery enabled; CPL 3 unless it asked for CPL 0 too; the
    /// notification slot free). Returns whether it was delivered.
    fn notify_not_present(&mut self, index: usize, token: u32) -> Result<bool, VmError> {
        let protocol = self.apf_protocol;
        let apf = &self.vcpus[index].apf;
        if !apf.enabled(protocol) {
            return Ok(false);
        }
        let cpl = self.vcpus[index].cpu.state().cpl();
        if cpl != 3 && !apf.send_always(protocol) {
            return Ok(false);
        }
        let area = apf.area(protocol);
        let event = apf.state.event;
        if self.guest_u32(index, area)? != 0 {
            return Ok(false);
        }
        match protocol {
            ApfProtocol::X86 => {
                self.set_guest_u32(index, area, abi::KVM_PV_REASON_PAGE_NOT_PRESENT)?;
                let cpu = &mut self.vcpus[index].cpu;
                cpu.state_mut().cr2 = u64::from(token);
                cpu.inject_event(EventInjection {
                    kind: EventKind::HardwareException,
                    vector: vector::PF,
                    error_code: Some(0),
                    instruction_len: 0,
                });
            }
            ApfProtocol::Event => {
                self.set_guest_u32(index, area, token)?;
                let vector = event.map_or(0, |e| e.notpresent_vector);
                self.vcpus[index].cpu.inject_event(EventInjection {
                    kind: EventKind::ExternalInterrupt,
                    vector,
                    error_code: None,
                    instruction_len: 0,
                });
            }
        }
        Ok(true)
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

    /// Whether the x86 APF MSRs exist (advertised in CPUID).
    fn x86_apf_offered(&self) -> bool {
        self.kvm_features & abi::KVM_FEATURE_ASYNC_PF != 0
    }

    /// RDMSR of an APF MSR; false if `msr_index` is not one of them.
    fn apf_rdmsr(&mut self, index: usize, msr_index: u32) -> bool {
        if !self.x86_apf_offered() {
            return false;
        }
        let vcpu = &mut self.vcpus[index];
        let value = match msr_index {
            abi::MSR_KVM_ASYNC_PF_EN => vcpu.apf.state.msr_en,
            abi::MSR_KVM_ASYNC_PF_INT => vcpu.apf.state.msr_int,
            abi::MSR_KVM_ASYNC_PF_ACK => 0,
            _ => return false,
        };
        vcpu.cpu.complete_rdmsr(value);
        true
    }

    /// WRMSR of an APF MSR, with KVM's checks (a bad value is #GP); false
    /// if `msr_index` is not one of them.
    fn apf_wrmsr(&mut self, index: usize, msr_index: u32, value: u64) -> Result<bool, VmError> {
        if !self.x86_apf_offered() {
            return Ok(false);
        }
        let ok = match msr_index {
            abi::MSR_KVM_ASYNC_PF_EN => self.write_apf_en(index, value)?,
            abi::MSR_KVM_ASYNC_PF_INT => {
                // Bits 63:8 are reserved.
                let ok = value >> 8 == 0;
                if ok {
                    self.vcpus[index].apf.state.msr_int = value;
                }
                ok
            }
            abi::MSR_KVM_ASYNC_PF_ACK => {
                if value & 1 != 0 {
                    self.deliver_ready(index)?;
                }
                true
            }
            _ => return Ok(false),
        };
        let cpu = &mut self.vcpus[index].cpu;
        if ok {
            cpu.skip_instruction();
        } else {
            cpu.inject_event(gp_fault());
        }
        Ok(true)
    }

    /// MSR_KVM_ASYNC_PF_EN: false for a value KVM refuses with #GP.
    fn write_apf_en(&mut self, index: usize, value: u64) -> Result<bool, VmError> {
        if value & (abi::KVM_ASYNC_PF_RESERVED | abi::KVM_ASYNC_PF_DELIVERY_AS_PF_VMEXIT) != 0 {
            return Ok(false);
        }
        let area = Gpa(value & !0x3f);
        let enabling = value & abi::KVM_ASYNC_PF_ENABLED != 0;
        if enabling && self.slots.lookup(area.frame()).is_none() {
            return Ok(false);
        }
        let apf = &mut self.vcpus[index].apf;
        apf.state.msr_en = value;
        if apf.enabled(ApfProtocol::X86) {
            // Whatever a previous incarnation of the guest waited for is
            // gone: wake every waiter.
            apf.queue_wake_all();
            self.deliver_ready(index)?;
        } else {
            apf.cancel_all();
        }
        Ok(true)
    }

    /// The event protocol's hypercalls; `None` if `nr` is not one.
    fn apf_hypercall(
        &mut self,
        index: usize,
        nr: u64,
        args: [u64; 4],
    ) -> Result<Option<i64>, VmError> {
        let offered = self.apf_mode == ApfMode::Pv && self.apf_protocol == ApfProtocol::Event;
        let result = match nr {
            abi::HC_APF_VERSION
            | abi::HC_APF_SLOTS
            | abi::HC_APF_ENABLE
            | abi::HC_APF_DISABLE
            | abi::HC_APF_ACK
                if !offered =>
            {
                -errno::KVM_ENOSYS
            }
            abi::HC_APF_VERSION => abi::APF_EVENT_VERSION as i64,
            abi::HC_APF_SLOTS => abi::APF_MAX_OUTSTANDING as i64,
            abi::HC_APF_ENABLE => {
                let [area, np, ready, flags] = args;
                let vector_ok = |v: u64| (32..=255).contains(&v);
                if area % 64 != 0
                    || !vector_ok(np)
                    || !vector_ok(ready)
                    || np == ready
                    || flags & !abi::APF_EVENT_SEND_ALWAYS != 0
                {
                    -errno::EINVAL
                } else if self.slots.lookup(Gpa(area).frame()).is_none() {
                    -errno::EFAULT
                } else {
                    let apf = &mut self.vcpus[index].apf;
                    apf.cancel_all();
                    apf.state.event = Some(EventConfig {
                        area,
                        notpresent_vector: np as u8,
                        ready_vector: ready as u8,
                        send_always: flags & abi::APF_EVENT_SEND_ALWAYS != 0,
                    });
                    apf.queue_wake_all();
                    self.deliver_ready(index)?;
                    0
                }
            }
            abi::HC_APF_DISABLE => {
                let apf = &mut self.vcpus[index].apf;
                apf.state.event = None;
                apf.cancel_all();
                0
            }
            abi::HC_APF_ACK => {
                if self.vcpus[index].apf.enabled(ApfProtocol::Event) {
                    self.deliver_ready(index)?;
                    0
                } else {
                    -errno::EINVAL
                }
            }
            _ => return Ok(None),
        };
        Ok(Some(result))
    }

    /// The guest-visible APF state of vCPU `index` (to save for migration).
    pub fn apf_state(&self, index: usize) -> Option<ApfState> {
        self.vcpus.get(index).map(|v| v.apf.state)
    }

    /// Restores vCPU `index`'s APF state (after migration). Outstanding
    /// faults are host I/O and do not move: every guest waiter is woken
    /// instead, and retries its access.
    pub fn set_apf_state(&mut self, index: usize, state: &ApfState) -> Result<(), ApfStateError> {
        if index >= self.vcpus.len() {
            return Err(ApfStateError::NoSuchVcpu(index));
        }
        let running = || {
            format!(
                "{} with protocol {}",
                self.apf_mode.name(),
                self.apf_protocol.name()
            )
        };
        let x86 = state.msr_en & abi::KVM_ASYNC_PF_ENABLED != 0;
        if x86 && !self.x86_apf_offered() {
            return Err(ApfStateError::WrongProtocol {
                wanted: "x86",
                running: running(),
            });
        }
        if state.event.is_some()
            && !(self.apf_mode == ApfMode::Pv && self.apf_protocol == ApfProtocol::Event)
        {
            return Err(ApfStateError::WrongProtocol {
                wanted: "event",
                running: running(),
            });
        }
        if state.msr_en & (abi::KVM_ASYNC_PF_RESERVED | abi::KVM_ASYNC_PF_DELIVERY_AS_PF_VMEXIT)
            != 0
            || state.msr_int >> 8 != 0
        {
            return Err(ApfStateError::Invalid(format!(
                "MSR values {:#x}/{:#x} have reserved bits set",
                state.msr_en, state.msr_int
            )));
        }
        let area = match state.event {
            Some(e) => Some(e.area),
            None if x86 => Some(state.msr_en & !0x3f),
            None => None,
        };
        if let Some(area) = area {
            if area % 64 != 0 || self.slots.lookup(Gpa(area).frame()).is_none() {
                return Err(ApfStateError::Invalid(format!(
                    "area {area:#x} is not 64-byte aligned guest memory"
                )));
            }
        }
        let apf = &mut self.vcpus[index].apf;
        apf.cancel_all();
        apf.state = *state;
        if apf.enabled(self.apf_protocol) {
            apf.queue_wake_all();
        }
        // A vCPU halted on a fault that no longer exists retries instead.
        if self.vcpus[index].run == RunState::ApfHalted {
            self.set_runnable(index);
        }
        Ok(())
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
        } else if let Some(result) = self.apf_hypercall(index, nr, [a0, a1, a2, a3])? {
            result
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
