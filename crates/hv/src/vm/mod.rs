//! The VM: the shared state (`crate::shared`), the vCPUs (`crate::vcpu`) and
//! the scheduler ([`sched`]), behind a small public API.

#[cfg(test)]
mod apf_policy_tests;
mod apf_state;
mod create_error;
pub mod dirty_log;

pub use crate::shared::{Report, StopReason};
pub(crate) mod sched;
mod sleep;

use crate::apf::{ApfConfig, ApfMode, ApfProtocol};
use crate::cost::HvCosts;
use crate::error::GuestMemoryError;
use crate::frames::FrameAllocator;
use crate::host::Host;
use crate::image::KernelImage;
use crate::memslot::{MemslotError, Memslots, SlotFlags, SlotId};
use crate::mmu::check::InvariantError;
use crate::mmu::dirty_log::DirtyRings;
use crate::mmu::fast_pf::MmuOptions;
use crate::mmu::zap::{ZapError, ZapMode, ZapReport};
use crate::mmu::{Mmu, MmuMode};
use crate::pager::Pager;
use crate::shared::WallClock;
use crate::shared::{CrossRequest, DirectoryEntry, Shared};
use crate::stats::VmStats;
use crate::swap::DeviceModel;
use crate::time::Cycles;
use crate::vcpu::msr::PASSTHROUGH_MSRS;
use crate::vcpu::{Vcpu, VcpuId};
pub use create_error::CreateError;
use machine::addr::PAGE_SIZE;
use machine::vmx::MsrExiting;
use machine::{Cpu, CpuConfig, Gfn, Gpa, Hfn, PhysMemory, VmxControls};
use sched::Scheduler;
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
    /// With fewer host CPUs than vCPUs (`host_cpus`), the host
    /// scheduler's tick in virtual cycles: how often it decides which
    /// vCPUs run. No effect otherwise.
    pub quantum: u64,
    /// How far a vCPU may run guest code past the earliest other vCPU,
    /// in virtual cycles; 0: as far as exactness allows, the shortest
    /// cross-vCPU delivery ([`max_lookahead`]), which bounds any value.
    pub lookahead: u64,
    /// Host CPUs the vCPUs share (`--host-cpus`); `None` or at least
    /// `vcpus`: one each, no vCPU is ever preempted.
    pub host_cpus: Option<u32>,
    /// How long a vCPU keeps a host CPU while others wait for one, in
    /// virtual cycles (`--host-slice`).
    pub host_slice: u64,
    /// Host memory for EPT tables and bookkeeping beyond guest RAM.
    pub host_overhead: u64,
    /// The hv cost table.
    pub costs: HvCosts,
    /// The machine's cost table (each vCPU's).
    pub cpu_costs: machine::CycleCosts,
    /// What runs guest code on each vCPU: the interpreter or the
    /// translator (same guest state and virtual time either way).
    pub engine: machine::Engine,
    /// Host frames for guest pages (the container limit); `None`: as much
    /// as guest memory, so nothing is ever evicted.
    pub host_mem: Option<u64>,
    /// The swap file; `None`: a temporary file, unlinked at creation.
    pub swap_path: Option<PathBuf>,
    /// The swap device model.
    pub swap_device: DeviceModel,
    /// How a vCPU waits for a page on swap.
    pub apf: ApfMode,
    /// The paravirtual protocol of `ApfMode::Pv`.
    pub apf_protocol: ApfProtocol,
    /// Seeds the device model's latency draws.
    pub seed: u64,
    /// EPT or shadow paging.
    pub mmu: MmuMode,
    /// Shadow paging: roots each vCPU remembers for a CR3 switch back
    /// (KVM's `prev_roots`, 3).
    pub shadow_prev_roots: usize,
    /// Shadow paging: let a written guest leaf table go unsync until the
    /// next CR3 load or flush (KVM since 2008). Off, every shadowed guest
    /// table stays write-protected and each write to one is emulated, as
    /// in KVM's trunk of January 2007 (the "Cache shadow page tables"
    /// series), seed 004's baseline: a CR3 load then finds the root in
    /// the shadow page hash, with nothing to sync.
    pub shadow_unsync: bool,
    /// Shadow paging: offer the paravirtual CR3 cache (seed 004).
    pub cr3_cache: bool,
    /// The CPU's CR3-target count (IA32_VMX_MISC; 4 on Intel CPUs), 1 to
    /// `abi::CR3_CACHE_MAX`: the entries of a vCPU's CR3 cache.
    pub cr3_targets: usize,
    /// kvmclock's wall clock when the VM starts, in nanoseconds since the
    /// Unix epoch (a fixed default, so runs repeat).
    pub wall_clock_at_boot_ns: u64,
    /// How memslot deletion and moves (and [`Vm::zap_all`]) drop every
    /// mapping.
    pub zap: ZapMode,
    /// The fast page fault and EPT A/D flags (`--fast-pf`, `--ept-ad`).
    pub mmu_options: MmuOptions,
    /// Entries in each vCPU's dirty ring (KVM_CAP_DIRTY_LOG_RING's size
    /// in entries; at least 128).
    pub dirty_ring_size: usize,
    /// What the console (COM1) offers the guest to read; empty: nothing.
    pub console_input: Vec<u8>,
    /// Multiboot modules (contents, command line), for a kernel with a
    /// multiboot header.
    pub modules: Vec<(Vec<u8>, String)>,
    /// The optional devices (`--device edu`, `--iommu intel`).
    pub devices: crate::devices::DeviceSet,
}

/// The default host time slice: 3 ms, Linux's EEVDF base slice (0.75 ms,
/// `sysctl_sched_base_slice` in `kernel/sched/fair.c`) scaled by
/// `1 + ilog2(CPUs)` for a host of 8 or more CPUs, as the default
/// logarithmic tunable scaling does.
pub const DEFAULT_HOST_SLICE: u64 = 3 * crate::CYCLES_PER_SECOND / 1000;

/// The largest lookahead that keeps every IPI and kick landing at its
/// send time plus its latency: a vCPU running guest code must exit
/// (`vm_exit`) before its handler can send one, which then flies for
/// [`HvCosts::ipi_latency`] (`vm/sched.rs`).
pub fn max_lookahead(costs: &HvCosts, cpu_costs: &machine::CycleCosts) -> u64 {
    cpu_costs.vm_exit + costs.ipi_latency()
}

/// 2026-01-01T00:00:00Z.
pub const DEFAULT_WALL_CLOCK_AT_BOOT_NS: u64 = 1_767_225_600 * 1_000_000_000;

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig {
            vcpus: 1,
            mem_size: 256 << 20,
            cmdline: String::new(),
            quantum: 100_000,
            lookahead: 0,
            host_cpus: None,
            host_slice: DEFAULT_HOST_SLICE,
            host_overhead: 16 << 20,
            costs: HvCosts::DEFAULT,
            cpu_costs: machine::CycleCosts::DEFAULT,
            engine: machine::Engine::default(),
            host_mem: None,
            swap_path: None,
            swap_device: DeviceModel::default(),
            apf: ApfMode::Off,
            apf_protocol: ApfProtocol::X86,
            seed: 1,
            mmu: MmuMode::Ept,
            shadow_prev_roots: 3,
            shadow_unsync: true,
            cr3_cache: false,
            cr3_targets: machine::vmx::MAX_CR3_TARGETS,
            wall_clock_at_boot_ns: DEFAULT_WALL_CLOCK_AT_BOOT_NS,
            zap: ZapMode::Fast,
            mmu_options: MmuOptions::default(),
            dirty_ring_size: 4096,
            console_input: Vec::new(),
            modules: Vec::new(),
            devices: Default::default(),
        }
    }
}

/// Whether `run_until` returned because of the time limit or a stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunStatus {
    /// The time limit was reached; the VM can run on.
    Running,
    /// The VM stopped.
    Stopped(StopReason),
    /// A vCPU's dirty ring is full (KVM_EXIT_DIRTY_RING_FULL): it runs
    /// again once the VMM has called [`Vm::harvest_dirty_rings`].
    DirtyRingFull,
}

pub use crate::memslot::{
    low_ram_end, ram_ranges, ram_top, HIGH_RAM_SLOT, HIGH_RAM_START, PCI_HOLE_START, RAM_SLOT,
};

/// The smallest host memory pool: room for every page one instruction can
/// need at once (code, data, stack, four levels of guest page tables, an
/// IDT/TSS delivery) many times over, so eviction cannot livelock.
pub const MIN_HOST_MEM: u64 = 4 << 20;

/// A virtual machine.
#[derive(Debug)]
pub struct Vm {
    pub(crate) shared: Shared,
    pub(crate) vcpus: Vec<Vcpu>,
    pub(crate) sched: Scheduler,
    mem_size: u64,
    pub(crate) kernel: Option<KernelImage>,
    zap: ZapMode,
    /// The configuration it was built with (without the console input
    /// and modules, which are in the devices and memory by now): what a
    /// snapshot saves to rebuild it.
    pub(crate) config: VmConfig,
    /// A fast zap-all's teardown in progress (`zap_all`).
    pub(crate) teardown: Option<sched::Teardown>,
}

/// The VM-execution controls of vCPU `id` (the EPT pointer, or under
/// shadow paging CR3, is set at each VM entry from the root the vCPU
/// enters with).
fn controls(id: u32, mmu: MmuMode) -> VmxControls {
    let base = base_controls(id);
    match mmu {
        // Native: no EPT pointer is ever set (the vCPU loads no root), so
        // the machine walks the guest's tables with gpa = hpa.
        MmuMode::Ept | MmuMode::Native => base,
        MmuMode::Shadow => crate::vcpu::shadow::shadow_controls(base),
    }
}

fn base_controls(id: u32) -> VmxControls {
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
        enable_invpcid: true,
        ept: None,
        vpid: id as u16 + 1,
        ..VmxControls::default()
    }
}

impl Vm {
    /// `--strict-mmio`: an access to unassigned MMIO (no RAM and no device
    /// there) stops the VM with an error, for hunting guest bugs. Off by
    /// default: as on a PC, such a read gives all ones and a write is
    /// dropped (each counted in `VcpuStats::unassigned_mmio`).
    pub fn set_strict_mmio(&mut self, strict: bool) {
        self.shared.platform.strict_mmio = strict;
    }

    /// An empty VM: host memory, RAM memslots of `mem_size` bytes in all
    /// ([`ram_ranges`]: from gpa 0, and from 4 GiB for what does not fit
    /// below the PCI hole) and `vcpus` vCPUs in guest mode, all waiting (no kernel loaded).
    pub fn new(config: &VmConfig) -> Result<Vm, CreateError> {
        if config.vcpus == 0 || config.vcpus as usize > abi::MAX_CPUS {
            return Err(CreateError::BadVcpuCount(config.vcpus));
        }
        if config.host_cpus == Some(0) {
            return Err(CreateError::BadHostCpus(0));
        }
        if config.host_slice == 0 {
            return Err(CreateError::BadHostSlice);
        }
        let two_mib = 2 << 20;
        if config.mem_size == 0
            || config.mem_size % two_mib != 0
            || config.mem_size > crate::image::MAX_GUEST_MEM
        {
            return Err(CreateError::BadMemSize(config.mem_size));
        }
        // Guest RAM, its EPT tables (one table per 2 MiB, plus the upper
        // levels) and slack. PhysMemory is a lazily-committed mmap, so
        // untouched frames cost no host RAM.
        let native = config.mmu == MmuMode::Native;
        let ept_tables = (config.mem_size / two_mib + 64) * PAGE_SIZE;
        // Without memory virtualisation guest RAM is host-physical memory
        // from 0 (gpa = hpa) and nothing else: the hv makes no tables, so
        // the allocator is empty, and a guest access past RAM reaches no
        // memory at all (an error stop, as an EPT violation outside every
        // memslot is), never the hv's own frames.
        let host_size = if native {
            config.mem_size
        } else {
            config.mem_size + ept_tables + config.host_overhead
        };
        let mem = PhysMemory::new(host_size)?;
        let end_frame = machine::Hpa(host_size).frame();
        let mut frames = if native {
            FrameAllocator::new(end_frame, end_frame)
        } else {
            FrameAllocator::new(Hfn(1), end_frame)
        };
        let limit = config
            .host_mem
            .unwrap_or(config.mem_size)
            .min(config.mem_size);
        if native {
            if config.mem_size > PCI_HOLE_START {
                return Err(CreateError::Native(
                    "RAM beyond the PCI hole (--mem above 3 GiB): it would start at 4 GiB, and guest RAM is host-physical memory from 0",
                ));
            }
            if limit < config.mem_size {
                return Err(CreateError::Native(
                    "host memory overcommit (--host-mem below --mem): guest RAM is host-physical memory itself, nothing can be paged out",
                ));
            }
            if config.cr3_cache {
                return Err(CreateError::Native(
                    "the CR3 cache (--cr3-cache on): it caches shadow roots, and there are none",
                ));
            }
        }
        if limit < MIN_HOST_MEM {
            return Err(CreateError::HostMemTooSmall {
                host_mem: limit,
                min: MIN_HOST_MEM,
            });
        }
        let mut pager = Pager::new(
            limit / PAGE_SIZE,
            config.swap_path.clone(),
            config.swap_device.clone(),
            config.seed,
        );
        if limit < config.mem_size {
            pager.open_swap()?;
        }
        if !(1..=abi::CR3_CACHE_MAX).contains(&config.cr3_targets) {
            return Err(CreateError::BadCr3Targets(config.cr3_targets));
        }
        let cr3_cache =
            (config.cr3_cache && config.mmu == MmuMode::Shadow).then_some(config.cr3_targets);
        let mmu = Mmu::with_options(&mem, &mut frames, config.mmu, config.mmu_options)?;
        mmu.set_shadow_unsync(config.shadow_unsync);
        let mut slots = Memslots::default();
        for ((start, len), id) in ram_ranges(config.mem_size)
            .into_iter()
            .zip([RAM_SLOT, HIGH_RAM_SLOT])
        {
            slots.add(
                id,
                Gfn(start / PAGE_SIZE),
                len / PAGE_SIZE,
                SlotFlags::default(),
            )?;
        }
        if native {
            slots.pin_identity(RAM_SLOT)?;
        }
        let vcpus: Vec<Vcpu> = (0..config.vcpus)
            .map(|id| {
                let mut cpu = Cpu::new(CpuConfig {
                    apic_id: id,
                    costs: config.cpu_costs,
                    engine: config.engine,
                    ..CpuConfig::default()
                });
                cpu.set_vmx(Some(VmxControls {
                    cr3_target_count: config.cr3_targets,
                    ..controls(id, config.mmu)
                }));
                let mut vcpu = Vcpu::new(VcpuId(id as usize), cpu);
                vcpu.mmu_mode = config.mmu;
                vcpu.shadow.capacity = config.shadow_prev_roots;
                vcpu
            })
            .collect();
        let apf = ApfConfig {
            mode: config.apf,
            protocol: config.apf_protocol,
        };
        let lookahead = match config.lookahead {
            0 => Cycles::MAX,
            n => Cycles(n),
        };
        let mut sched = Scheduler::new(Cycles(config.quantum.max(1)), lookahead);
        if let Some(host_cpus) = config.host_cpus {
            sched.set_host_cpus(
                host_cpus as usize,
                Cycles(config.host_slice),
                config.vcpus as usize,
            );
        }
        Ok(Vm {
            shared: Shared {
                host: Host {
                    mem,
                    frames,
                    slots,
                    mmu,
                    costs: config.costs,
                    dirty_rings: DirtyRings::new(config.vcpus as usize, config.dirty_ring_size),
                    order_bound: None,
                },
                pager,
                apf,
                kvm_features: apf.kvm_features()
                    | abi::KVM_FEATURE_CLOCKSOURCE2
                    | abi::KVM_FEATURE_STEAL_TIME
                    | abi::KVM_FEATURE_PV_TLB_FLUSH
                    | abi::KVM_FEATURE_PV_SCHED_YIELD
                    | abi::KVM_FEATURE_PV_SEND_IPI
                    | abi::KVM_FEATURE_PV_EOI
                    | if cr3_cache.is_some() {
                        abi::KVM_FEATURE_CR3_CACHE
                    } else {
                        0
                    },
                cr3_cache,
                cr3_sweep: Default::default(),
                wall_clock: WallClock {
                    boot_ns: config.wall_clock_at_boot_ns,
                    ..WallClock::default()
                },
                platform: crate::devices::Platform::new(&crate::devices::PlatformConfig {
                    ram_size: config.mem_size,
                    vcpus: config.vcpus as u16,
                    cmdline: config.cmdline.clone(),
                    console_input: config.console_input.clone(),
                    devices: config.devices,
                }),
                reports: Vec::new(),
                directory: vcpus
                    .iter()
                    .map(|v| DirectoryEntry {
                        apic_id: v.cpu.apic().id(),
                        started: false,
                    })
                    .collect(),
                cross: Vec::new(),
                time: Cycles::ZERO,
            },
            vcpus,
            sched,
            mem_size: config.mem_size,
            kernel: None,
            zap: config.zap,
            config: VmConfig {
                console_input: Vec::new(),
                modules: Vec::new(),
                ..config.clone()
            },
            teardown: None,
        })
    }

    /// Starts vCPU `id` at `rip` (the bootstrap vCPU at boot).
    pub(crate) fn start_vcpu(&mut self, id: VcpuId, rip: u64, rsp: u64, rdi: u64) {
        self.shared.directory[id.0].started = true;
        self.shared.cross.push(CrossRequest::StartCpu {
            target: id,
            rip,
            rsp,
            rdi,
            at: Cycles::ZERO,
        });
        self.carry_out_cross_requests();
    }

    /// Adds a memslot (no backing allocated until touched).
    pub fn add_memslot(
        &mut self,
        id: SlotId,
        base: Gpa,
        size: u64,
        flags: SlotFlags,
    ) -> Result<(), MemslotError> {
        self.refuse_native()?;
        self.shared
            .host
            .slots
            .add(id, base.frame(), size / PAGE_SIZE, flags)
    }

    /// Deletes a memslot at the VM's current virtual time: drops every
    /// mapping ([`Vm::zap_all`]) and frees the slot's backing frames.
    pub fn delete_memslot(&mut self, id: SlotId) -> Result<ZapReport, MemslotError> {
        self.refuse_native()?;
        let shared = &mut self.shared;
        let cancelled = shared.pager.forget_memslot(&shared.host.slots, id);
        for vcpu in &mut self.vcpus {
            // Their pages are gone: forget the faults, the pages will
            // never be announced.
            vcpu.apf.works.retain(|w| w.page.slot != id);
        }
        let slot = shared.host.slots.delete(id)?;
        let report = self.zap_all()?;
        if slot.dirty_log.is_some() {
            self.pml_off_unless_used();
        }
        let shared = &mut self.shared;
        for (_, frame) in slot.backed_pages() {
            shared.host.frames.free(frame);
            shared.pager.note_freed();
        }
        for frame in cancelled {
            shared.host.frames.free(frame);
        }
        Ok(report)
    }

    /// Moves a memslot to a new guest-physical base at the VM's current
    /// virtual time; its contents move with it and every mapping is
    /// dropped ([`Vm::zap_all`]; the guest refaults at the new gpa).
    pub fn move_memslot(&mut self, id: SlotId, new_base: Gpa) -> Result<ZapReport, MemslotError> {
        self.refuse_native()?;
        // PML logs hold gpas: into the bitmaps while they name the slot.
        self.drain_pml_logs()
            .map_err(crate::mmu::zap::ZapError::from)?;
        self.shared.host.slots.move_slot(id, new_base.frame())?;
        Ok(self.zap_all()?)
    }

    /// Memslot changes need memory virtualisation: under
    /// `MmuMode::Native` guest-physical memory is the host's own.
    fn refuse_native(&self) -> Result<(), MemslotError> {
        if self.shared.host.mmu.mode == MmuMode::Native {
            return Err(MemslotError::Native);
        }
        Ok(())
    }

    /// Drops every mapping of the VM, the configured way
    /// ([`VmConfig::zap`]), as the VMM thread at the VM's current virtual
    /// time (KVM: the memslot ioctl's thread): its holds of `mmu_lock`
    /// go on the lock timeline, every vCPU reloads its root before it
    /// next enters, and the vCPUs that fault or reload meanwhile wait for
    /// the holds they run into. Call it between `run_until` slices.
    pub fn zap_all(&mut self) -> Result<ZapReport, ZapError> {
        let at = self.time();
        let host = &mut self.shared.host;
        let rmap_bytes = crate::mmu::zap::seed_rmap_bytes(&host.slots);
        let (report, left) = host.mmu.zap_begin(
            &host.mem,
            &mut host.frames,
            &host.costs,
            self.zap,
            rmap_bytes,
            at,
        )?;
        self.shared.cross.push(CrossRequest::ReloadRoots);
        self.carry_out_cross_requests();
        let Some(obsolete) = left else {
            return Ok(report);
        };
        // The VMM thread is busy in the ioctl while the vCPUs run: its
        // batches and their faults take the lock in virtual-time order.
        self.teardown = Some(sched::Teardown { obsolete, report });
        self.run_teardown()
    }

    /// The memslot generation.
    pub fn memslot_generation(&self) -> u64 {
        self.shared.host.slots.generation()
    }

    /// Copies `bytes` into guest-physical memory, allocating backing frames
    /// for pages not yet touched and reading swapped-out pages back first
    /// (as the VMM writing its own mapping).
    pub fn write_guest(&mut self, gpa: Gpa, bytes: &[u8]) -> Result<(), GuestMemoryError> {
        let result = self.shared.write_guest(gpa, bytes);
        self.carry_out_cross_requests();
        result
    }

    /// Reads guest-physical memory (untouched pages read as zero; swapped
    /// pages are read back in).
    pub fn read_guest(&mut self, gpa: Gpa, buf: &mut [u8]) -> Result<(), GuestMemoryError> {
        let result = self.shared.read_guest(gpa, buf);
        self.carry_out_cross_requests();
        result
    }

    /// Per vCPU: how far its clock is behind the VM's time (a blocked
    /// vCPU's clock moves only when it wakes), and whether it waits on a
    /// page read there (stalled on a page-in or halted by async PF).
    pub fn vcpus_behind(&self) -> Vec<(Cycles, bool)> {
        let now = self.shared.time;
        self.vcpus
            .iter()
            .map(|v| {
                let on_read = matches!(
                    v.run,
                    crate::vcpu::RunState::Stalled { .. } | crate::vcpu::RunState::ApfHalted
                );
                (now.saturating_sub(v.clock()), on_read)
            })
            .collect()
    }

    /// Reads guest page `gfn` as [`Vm::read_guest`] does, and returns when
    /// its contents are there in virtual time: now, or for a page read
    /// back from swap the read's completion on the swap device (a
    /// migration cannot send it earlier).
    pub fn read_guest_page(
        &mut self,
        gfn: Gfn,
        page: &mut [u8; PAGE_SIZE as usize],
    ) -> Result<Cycles, GuestMemoryError> {
        let untouched = matches!(
            self.shared.host.slots.lookup(gfn).map(|s| s.state(gfn)),
            Some(crate::memslot::PageState::Untouched)
        );
        let ready = if untouched {
            page.fill(0);
            self.shared.time
        } else {
            let result = self.shared.backing_frame_ready(gfn);
            self.carry_out_cross_requests();
            let (frame, ready) = result?;
            self.shared.host.mem.read_bytes(frame.addr(), page)?;
            ready
        };
        Ok(ready)
    }

    /// The leaf spte mapping `gpa` now, if any (see [`crate::spte`] for its
    /// bits): for tests and inspection.
    pub fn spte(&self, gpa: Gpa) -> Option<u64> {
        let host = &self.shared.host;
        host.mmu.leaf_spte(&host.mem, &host.costs, gpa.frame())
    }

    /// Checks the MMU's invariants (every spte consistent with its memslot,
    /// the rmap and its page header; writable implies MMU-writable implies
    /// host-writable; every cached CR3 root valid and in sync).
    pub fn check_mmu(&self) -> Result<(), InvariantError> {
        let host = &self.shared.host;
        let cached: Vec<String> = self
            .vcpus
            .iter()
            .flat_map(|v| v.cr3_cache_violations(&self.shared))
            .collect();
        if !cached.is_empty() {
            return Err(InvariantError(format!("CR3 cache: {}", cached.join("; "))));
        }
        if let Some(broken) = self.pml_violations().first() {
            return Err(InvariantError(broken.clone()));
        }
        host.mmu.check(&host.mem, &host.slots, &host.costs)
    }

    /// Guest RAM size in bytes.
    pub fn mem_size(&self) -> u64 {
        self.mem_size
    }

    /// The vCPUs.
    pub fn vcpus(&self) -> &[Vcpu] {
        &self.vcpus
    }

    /// Global virtual time: the end of the last scheduling round.
    pub fn time(&self) -> Cycles {
        self.shared.time
    }

    /// Serial output not yet taken.
    pub fn take_serial(&mut self) -> Vec<u8> {
        self.shared.platform.uart.take_output()
    }

    /// The exit status the guest wrote to the platform's status port
    /// (`devices::GUEST_STATUS_PORT`), if it wrote one.
    pub fn guest_status(&self) -> Option<u8> {
        self.shared.platform.guest_status
    }

    /// HC_REPORT lines so far.
    pub fn reports(&self) -> &[Report] {
        &self.shared.reports
    }

    /// Why the VM stopped, if it did.
    pub fn stop_reason(&self) -> Option<&StopReason> {
        self.sched.stopped.as_ref()
    }

    /// The loaded kernel, if booted from an ELF.
    pub fn kernel(&self) -> Option<&KernelImage> {
        self.kernel.as_ref()
    }

    /// Statistics so far.
    pub fn stats(&self) -> VmStats {
        let shared = &self.shared;
        let host = &shared.host;
        let lock_per_vcpu = host.mmu.lock_stats_per_vcpu(&host.costs);
        VmStats {
            virtual_cycles: self.vcpus.iter().map(|v| v.cpu.cycles()).max().unwrap_or(0),
            vcpus: self
                .vcpus
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let mut s = v.stats.clone();
                    let (taken, contended) = lock_per_vcpu.get(i).copied().unwrap_or((0, 0));
                    s.mmu_lock_acquisitions = taken;
                    s.mmu_lock_contended = contended;
                    s.cycles = v.cpu.cycles();
                    s.instructions = v.cpu.stats().instructions;
                    s.tlb_misses = v.cpu.tlb().stats().misses;
                    s.page_walk_refs = v.cpu.stats().page_walk_refs;
                    s.apf = v.apf.stats;
                    s
                })
                .collect(),
            frames_in_use: host.frames.in_use(),
            frames_peak: host.frames.peak(),
            ept_tables: host.mmu.table_count(&host.costs),
            memslot_generation: host.slots.generation(),
            host_mem_pages: shared.pager.limit(),
            resident_pages: shared.pager.resident(),
            pager: shared.pager.stats(),
            device: shared.pager.device_stats(),
            device_desc: {
                let m = shared.pager.device_model();
                format!(
                    "{}: read latency {}, write setup {}, {} MB/s, queue {}",
                    m.name,
                    m.read_latency,
                    crate::swap::device::format_duration(m.write_latency),
                    m.bandwidth / 1_000_000,
                    m.queue
                )
            },
            host_cpus: self.sched.host_cpus(),
            apf_mode: shared.apf.mode.name(),
            apf_protocol: shared.apf.protocol.name(),
            mmu: host.mmu.mode.name(),
            shadow: (host.mmu.mode == MmuMode::Shadow).then(|| host.mmu.shadow_stats(&host.costs)),
            mmu_lock: host.mmu.lock_stats(&host.costs),
        }
    }
}

/// Loads CS with the flat 4 GiB segment (`selector`, `attr`) of `code`
/// and DS, ES, SS, FS, GS with the flat kernel data segment of
/// `data_selector`: what a boot protocol hands the kernel.
pub(crate) fn load_flat_segments(
    state: &mut machine::cpu::state::CpuState,
    code: (u16, u32),
    data_selector: u16,
) {
    use machine::cpu::state::{seg_attr, Segment};
    let flat = |selector: u16, attr: u32| Segment {
        selector,
        base: 0,
        limit: u32::MAX,
        attr,
    };
    state.cs = flat(code.0, code.1);
    for seg in [
        &mut state.ds,
        &mut state.es,
        &mut state.ss,
        &mut state.fs,
        &mut state.gs,
    ] {
        *seg = flat(data_selector, seg_attr::DATA_KERNEL);
    }
}

/// A VM with the boot page tables and GDT written and no kernel (unit
/// tests put their code in it and start vCPUs there).
#[cfg(test)]
pub(crate) fn bare_vm(config: &VmConfig) -> Vm {
    let mut vm = Vm::new(config).unwrap();
    let gdt: Vec<u8> = crate::image::GDT
        .iter()
        .flat_map(|d| d.to_le_bytes())
        .collect();
    vm.write_guest(Gpa(crate::image::GDT_GPA), &gdt).unwrap();
    for (gpa, entry) in crate::image::identity_map_entries(vm.mem_size()) {
        vm.write_guest(Gpa(gpa), &entry.to_le_bytes()).unwrap();
    }
    vm
}
