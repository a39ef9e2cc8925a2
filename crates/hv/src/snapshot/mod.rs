//! VM snapshots: everything a running VM is, saved to bytes and restored
//! into a new VM (`docs/migration.md`).
//!
//! What is saved is the guest-visible state: each vCPU's CPU
//! ([`machine::cpu::snapshot::CpuSnapshot`]: registers, MSRs, x87/SSE,
//! local APIC with its timer, pending and in-service events, the VMX
//! fields the hv changes), the hv's per-vCPU state (run state, kvmclock,
//! steal time, xAPIC registers, async-PF state, counters), the devices
//! (COM1 with its unread input, IOAPIC, fw_cfg cursor), the HC_REPORT
//! lines, the virtual clock, the host-CPU assignment, and guest memory,
//! swapped pages included. Under EPT the MMU's leaves and each vCPU's TLB
//! are saved too (re-pointed at the restoring VM's frames and root), so
//! the restored guest pays no refault or walk the saved one never made:
//! its timing is the uninterrupted run's. What is rebuilt instead is
//! host-side model state: shadow paging's pages (they refault) and TLB
//! (flushed), the first-level TLB and decoded-code caches (empty), the
//! pager's residency and the swap device's queue (the pages are written
//! back in gfn order at restore), the `mmu_lock` timeline. Outstanding async page faults are
//! host I/O and do not move: the restored VM wakes every guest waiter
//! (KVM's wake-all after migration, seed 000) and a vCPU that was waiting
//! for a page retries its access.

pub mod format;

use crate::apf::{ApfMode, ApfProtocol, ApfState, ApfStats};
use crate::boot::KernelImage;
use crate::devices::PlatformSnapshot;
use crate::error::{ApfStateError, GuestMemoryError};
use crate::mmu::fast_pf::MmuOptions;
use crate::mmu::zap::ZapMode;
use crate::mmu::MmuMode;
use crate::stats::VcpuStats;
use crate::swap::{DeviceModel, LatencyRange};
use crate::time::Cycles;
use crate::vcpu::kvmclock::{KvmClock, WallClock};
use crate::vcpu::pv_eoi::PvEoi;
use crate::vcpu::steal::StealTime;
use crate::vcpu::xapic::XapicRegs;
use crate::vcpu::{Requests, RunState};
use crate::vm::CreateError;
use crate::vm::{Report, Vm, VmConfig, RAM_SLOT};
use bincode::Options;
use machine::addr::PAGE_SIZE;
use machine::cpu::snapshot::{CpuSnapshot, CpuSnapshotError};
use machine::mmu::tlb::TlbImage;
use machine::{Gpa, NamedCosts};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Why a snapshot cannot be taken or restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("not a faultline snapshot (bad magic number)")]
    BadMagic,
    #[error("snapshot format version {found}; this faultline reads version {supported}")]
    UnsupportedVersion { found: u32, supported: u32 },
    #[error("snapshot truncated: {what} needs {needed} bytes, {have} left")]
    Truncated {
        what: &'static str,
        needed: u64,
        have: u64,
    },
    #[error("snapshot has {found} sections, the format has {expected}")]
    SectionCount { found: u32, expected: u32 },
    #[error("unknown snapshot section kind {0}")]
    UnknownSection(u32),
    #[error("snapshot section {found} where {expected} was expected")]
    SectionOrder {
        found: &'static str,
        expected: &'static str,
    },
    #[error("snapshot section {section} claims {len} bytes (at most {max})")]
    SectionTooLarge {
        section: &'static str,
        len: u64,
        max: u64,
    },
    #[error("snapshot section {section} is corrupted (CRC-32 {stored:#010x} stored, {computed:#010x} computed)")]
    Checksum {
        section: &'static str,
        stored: u32,
        computed: u32,
    },
    #[error("{0} bytes after the last snapshot section")]
    TrailingBytes(u64),
    #[error("snapshot state section does not decode: {0}")]
    Decode(String),
    #[error("invalid snapshot: {0}")]
    Invalid(String),
    #[error("cannot snapshot this VM: {0}")]
    Unsupported(String),
    #[error("building the VM to restore into: {0}")]
    Create(#[from] CreateError),
    #[error("vCPU {vcpu}: {source}")]
    Cpu {
        vcpu: usize,
        source: CpuSnapshotError,
    },
    #[error("async-PF state: {0}")]
    Apf(#[from] ApfStateError),
    #[error("guest memory: {0}")]
    GuestMemory(#[from] GuestMemoryError),
}

/// Most vCPUs, bytes of command line and ring entries a snapshot may
/// ask for (the limits `Vm::new` and the vmm apply, so a hostile file
/// cannot make the restore allocate more than a command line could).
const MAX_CMDLINE: usize = 64 << 10;
const MAX_HOST_OVERHEAD: u64 = 1 << 30;
const MAX_DIRTY_RING: u64 = 1 << 16;
const MAX_QUANTUM: u64 = 1 << 40;

/// The swap device as saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct DeviceState {
    name: String,
    read_min: u64,
    read_max: u64,
    write_latency: u64,
    bandwidth: u64,
    queue: u32,
}

/// The VM's configuration: what `Vm::new` rebuilds the VM from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ConfigState {
    vcpus: u32,
    mem_size: u64,
    cmdline: String,
    quantum: u64,
    host_cpus: Option<u32>,
    host_slice: u64,
    host_overhead: u64,
    host_mem: Option<u64>,
    swap_device: DeviceState,
    apf: ApfMode,
    apf_protocol: ApfProtocol,
    seed: u64,
    fast_pf: bool,
    ept_ad: bool,
    wall_clock_at_boot_ns: u64,
    zap_fast: bool,
    dirty_ring_size: u64,
    /// Shadow paging (`--mmu shadow`) instead of EPT.
    shadow: bool,
    shadow_prev_roots: u64,
    /// Both cost tables, every entry by name (`--cost NAME=CYCLES` may
    /// have changed any), so the restored run is charged as the saved one.
    cpu_costs: Vec<(String, u64)>,
    hv_costs: Vec<(String, u64)>,
}

/// A vCPU's TLB as saved: the 4 KiB entries that translate to a resident
/// page of guest RAM, with its guest-physical address in place of the
/// host's, and under EPT the root marked current (`root`) or old.
fn saved_tlb(
    mut image: TlbImage,
    root: Option<u64>,
    gfn_of: &std::collections::HashMap<u64, u64>,
) -> TlbImage {
    image.entries.retain_mut(|e| {
        let Some(&gfn) = gfn_of.get(&(e.hpa().0 / PAGE_SIZE)) else {
            return false;
        };
        if e.size() != machine::mmu::PageSize::Size4K {
            return false;
        }
        if e.under_ept() {
            e.eptp = if Some(e.eptp) == root {
                TLB_CURRENT_ROOT
            } else {
                TLB_OLD_ROOT
            };
        }
        e.set_hpa(machine::Hpa(gfn * PAGE_SIZE));
        true
    });
    image
}

/// Every entry of a cost table by name.
fn cost_entries(mut table: impl NamedCosts) -> Vec<(String, u64)> {
    table
        .entries_mut()
        .into_iter()
        .map(|(name, value)| (name.to_string(), *value))
        .collect()
}

/// `saved` into `table`: exactly its entries, each once.
fn set_costs<T: NamedCosts>(
    mut table: T,
    saved: &[(String, u64)],
    what: &str,
) -> Result<T, SnapshotError> {
    let names = table.names();
    let mut seen: Vec<&str> = saved.iter().map(|(n, _)| n.as_str()).collect();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != saved.len() || saved.len() != names.len() {
        return Err(SnapshotError::Invalid(format!(
            "the {what} cost table has {} entries, this faultline {}",
            saved.len(),
            names.len()
        )));
    }
    for (name, cycles) in saved {
        if !table.set(name, *cycles) {
            return Err(SnapshotError::Invalid(format!(
                "no {what} cost entry named {name:?}"
            )));
        }
    }
    Ok(table)
}

/// How a vCPU was scheduled. A vCPU stalled or halted in the hv on a
/// page read is saved runnable: the read does not move, it retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum RunSnap {
    WaitingForStart,
    Runnable,
    Halted,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct VcpuState {
    cpu: CpuSnapshot,
    run: RunSnap,
    kicked: bool,
    nmi_pending: bool,
    wake_not_before: u64,
    started: bool,
    apf: ApfState,
    /// Guest tasks wait for pages: async faults were outstanding or
    /// page-ready notifications queued. They do not move; the restored
    /// vCPU wakes every waiter (a wake-all) instead.
    apf_waiters: bool,
    apf_stats: ApfStats,
    kvmclock: KvmClock,
    steal: StealTime,
    /// Nothing is pending between runs: the MSR only.
    pv_eoi: PvEoi,
    stats: VcpuStats,
    xapic: XapicRegs,
    /// Shadow paging: the CR3 the guest loaded (the CPU's is the shadow
    /// root, rebuilt at restore) and whether the guest cleared EFER.NXE
    /// (the CPU keeps it set).
    shadow: Option<(u64, bool)>,
    /// The TLB's 4 KiB entries that map guest RAM, host addresses
    /// replaced by guest-physical ones and EPTPs by [`TLB_CURRENT_ROOT`]
    /// or [`TLB_OLD_ROOT`]: the restore points them at its own frames and
    /// root, so the restored vCPU walks exactly where the saved one would.
    tlb: TlbImage,
}

/// A saved TLB entry's EPTP: made under the vCPU's root at the save.
const TLB_CURRENT_ROOT: u64 = 1;
/// A saved TLB entry's EPTP: made under an older root (it can no longer
/// hit; it keeps its way until replaced, as in the saved TLB).
const TLB_OLD_ROOT: u64 = 2;
/// The EPTP a restored old-root entry gets: no root has it (an EPTP's
/// low bits are its memory type and walk length, never all ones).
const NO_ROOT_EPTP: u64 = u64::MAX;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ReportState {
    vcpu: u32,
    cycles: u64,
    line: String,
}

/// The state section.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct VmState {
    config: ConfigState,
    time: u64,
    /// The kernel image's entry, start and end, if booted from an ELF.
    kernel: Option<(u64, u64, u64)>,
    wall_clock: WallClock,
    platform: PlatformSnapshot,
    reports: Vec<ReportState>,
    vcpus: Vec<VcpuState>,
    /// The host scheduler's state (`--host-cpus`).
    host_cpus: Option<crate::vm::sched::HostCpuState>,
    /// EPT: the RAM pages mapped at the save, `(gfn, leaf spte without
    /// its host address)`, gfns increasing. A restore maps them again
    /// (uncharged) so the guest does not pay refaults the saved VM never
    /// made: a restore leaves the guest's timing as it was.
    ept: Vec<(u64, u64)>,
}

fn options() -> impl Options {
    bincode::DefaultOptions::new()
        .with_limit(format::MAX_STATE_LEN)
        .reject_trailing_bytes()
}

/// Choices the restoring side makes for itself: where its swap file is
/// and how much host memory it gives the guest (`--host-mem` may differ
/// on either side of a migration).
#[derive(Debug, Clone, Default)]
pub struct RestoreOptions {
    pub swap_path: Option<PathBuf>,
    /// `Some`: replaces the saved `--host-mem` (`Some(None)`: no limit).
    pub host_mem: Option<Option<u64>>,
    /// Load guest memory on first touch (`restore --lazy`): every saved
    /// page goes to the swap file, and the guest's first access to it is
    /// a swap-in, which the vCPU waits for as `--apf` says.
    pub lazy: bool,
    /// `Some`: replaces the saved swap device model (the restoring host's
    /// own disk).
    pub swap_device: Option<DeviceModel>,
}

/// What a snapshot says about itself, without restoring it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub vcpus: u32,
    pub mem_size: u64,
    pub time: Cycles,
    pub cmdline: String,
    pub pages: u64,
}

impl ConfigState {
    fn of(config: &VmConfig) -> ConfigState {
        let d = &config.swap_device;
        ConfigState {
            vcpus: config.vcpus,
            mem_size: config.mem_size,
            cmdline: config.cmdline.clone(),
            quantum: config.quantum,
            host_cpus: config.host_cpus,
            host_slice: config.host_slice,
            host_overhead: config.host_overhead,
            host_mem: config.host_mem,
            swap_device: DeviceState {
                name: d.name.clone(),
                read_min: d.read_latency.min,
                read_max: d.read_latency.max,
                write_latency: d.write_latency,
                bandwidth: d.bandwidth,
                queue: d.queue,
            },
            apf: config.apf,
            apf_protocol: config.apf_protocol,
            seed: config.seed,
            fast_pf: config.mmu_options.fast_pf,
            ept_ad: config.mmu_options.ept_ad,
            wall_clock_at_boot_ns: config.wall_clock_at_boot_ns,
            zap_fast: config.zap == ZapMode::Fast,
            dirty_ring_size: config.dirty_ring_size as u64,
            shadow: config.mmu == MmuMode::Shadow,
            shadow_prev_roots: config.shadow_prev_roots as u64,
            cpu_costs: cost_entries(config.cpu_costs),
            hv_costs: cost_entries(config.costs),
        }
    }

    /// The `VmConfig` to rebuild the VM from, after the checks `Vm::new`
    /// does not make (sizes a hostile file could make huge).
    fn to_config(&self, options: &RestoreOptions) -> Result<VmConfig, SnapshotError> {
        let invalid = |what: String| Err(SnapshotError::Invalid(what));
        if self.cmdline.len() > MAX_CMDLINE {
            return invalid(format!("a command line of {} bytes", self.cmdline.len()));
        }
        if self.host_overhead > MAX_HOST_OVERHEAD {
            return invalid(format!("{} bytes of host overhead", self.host_overhead));
        }
        if !(128..=MAX_DIRTY_RING).contains(&self.dirty_ring_size) {
            return invalid(format!("a dirty ring of {} entries", self.dirty_ring_size));
        }
        if self.shadow_prev_roots > 64 {
            return invalid(format!("{} previous shadow roots", self.shadow_prev_roots));
        }
        if self.quantum == 0 || self.quantum > MAX_QUANTUM {
            return invalid(format!("a scheduling quantum of {} cycles", self.quantum));
        }
        let d = &self.swap_device;
        if d.bandwidth == 0 || d.queue == 0 || d.read_min > d.read_max || d.name.len() > 64 {
            return invalid(format!("swap device model {d:?}"));
        }
        Ok(VmConfig {
            vcpus: self.vcpus,
            mem_size: self.mem_size,
            cmdline: self.cmdline.clone(),
            quantum: self.quantum,
            host_cpus: self.host_cpus,
            host_slice: self.host_slice,
            host_overhead: self.host_overhead,
            host_mem: options.host_mem.unwrap_or(self.host_mem),
            swap_path: options.swap_path.clone(),
            swap_device: options.swap_device.clone().unwrap_or(DeviceModel {
                name: d.name.clone(),
                read_latency: LatencyRange {
                    min: d.read_min,
                    max: d.read_max,
                },
                write_latency: d.write_latency,
                bandwidth: d.bandwidth,
                queue: d.queue,
            }),
            apf: self.apf,
            apf_protocol: self.apf_protocol,
            seed: self.seed,
            mmu: if self.shadow {
                MmuMode::Shadow
            } else {
                MmuMode::Ept
            },
            shadow_prev_roots: self.shadow_prev_roots as usize,
            wall_clock_at_boot_ns: self.wall_clock_at_boot_ns,
            zap: if self.zap_fast {
                ZapMode::Fast
            } else {
                ZapMode::Slow
            },
            mmu_options: MmuOptions {
                fast_pf: self.fast_pf,
                ept_ad: self.ept_ad,
                seed_indirect: false,
            },
            dirty_ring_size: self.dirty_ring_size as usize,
            costs: set_costs(crate::cost::HvCosts::DEFAULT, &self.hv_costs, "hv")?,
            cpu_costs: set_costs(machine::CycleCosts::DEFAULT, &self.cpu_costs, "machine")?,
            ..VmConfig::default()
        })
    }
}

fn decode_state(bytes: &[u8]) -> Result<(VmState, &[u8]), SnapshotError> {
    let sections = format::parse(bytes)?;
    let state: VmState = options()
        .deserialize(sections.state)
        .map_err(|e| SnapshotError::Decode(e.to_string()))?;
    Ok((state, sections.memory))
}

/// Reads a snapshot's header and state, checking everything but guest
/// memory's contents.
pub fn inspect(bytes: &[u8]) -> Result<SnapshotInfo, SnapshotError> {
    let (state, memory) = decode_state(bytes)?;
    let npages = state.config.mem_size / PAGE_SIZE;
    let pages = format::memory_pages(memory, npages)?.count() as u64;
    Ok(SnapshotInfo {
        vcpus: state.config.vcpus,
        mem_size: state.config.mem_size,
        time: Cycles(state.time),
        cmdline: state.config.cmdline,
        pages,
    })
}

impl Vm {
    /// Why this VM cannot be saved now, if it cannot: state the format
    /// does not carry yet (shadow paging, `--mmu none`, the CR3 cache,
    /// dirty logging, memslots beyond RAM), or a VM that has stopped.
    fn check_snapshottable(&self) -> Result<(), SnapshotError> {
        let unsupported = |what: &str| Err(SnapshotError::Unsupported(what.to_string()));
        if self.sched.stopped.is_some() {
            return unsupported("it has stopped");
        }
        if self.shared.host.mmu.mode == MmuMode::Native {
            return unsupported("--mmu none is not saved in snapshots");
        }
        if self.vcpus.iter().any(|v| v.shadow.pending_write.is_some()) {
            return unsupported("a vCPU is in the middle of a write to a tracked guest page table");
        }
        if self.shared.cr3_cache.is_some() {
            return unsupported("the CR3 cache is not saved");
        }
        let slots: Vec<_> = self.shared.host.slots.iter().collect();
        if slots.len() != 1 || slots[0].id != RAM_SLOT {
            return unsupported("memslots other than guest RAM are not saved");
        }
        if slots[0].dirty_log.is_some() {
            return unsupported("dirty logging is on");
        }
        if !self.shared.cross.is_empty() {
            return unsupported("cross-vCPU requests are pending (save between run slices)");
        }
        if self
            .vcpus
            .iter()
            .any(|v| v.ring_full || v.pml_page.is_some())
        {
            return unsupported("a vCPU logs dirty pages");
        }
        Ok(())
    }

    /// Saves the VM (between two `run_until` slices). Swapped-out pages
    /// are read back to be saved, so the pager's state changes as the
    /// VMM's reads of guest memory change it.
    pub fn snapshot(&mut self) -> Result<Vec<u8>, SnapshotError> {
        let state_bytes = self.snapshot_state()?;
        let pages = self.saved_pages()?;
        let memory = format::encode_memory(&pages);
        Ok(format::encode(&[
            (format::SectionKind::State, &state_bytes),
            (format::SectionKind::Memory, &memory),
        ]))
    }

    /// The gfns of guest RAM that were ever touched (resident or in the
    /// swap file): what a migration's first round sends.
    pub fn touched_pages(&self) -> Vec<u64> {
        let Some(slot) = self.shared.host.slots.get(RAM_SLOT) else {
            return Vec::new();
        };
        (0..slot.npages)
            .filter(|&i| !matches!(slot.state_at(i), crate::memslot::PageState::Untouched))
            .map(|i| slot.gfn_at(i).0)
            .collect()
    }

    /// The state section alone (everything but guest memory), for a
    /// migration that sends memory its own way.
    pub fn snapshot_state(&mut self) -> Result<Vec<u8>, SnapshotError> {
        self.settle();
        self.check_snapshottable()?;
        let platform = self.shared.platform.snapshot().ok_or_else(|| {
            SnapshotError::Unsupported("device interrupts wait for delivery".into())
        })?;
        let gfn_of = self.gfn_of_frame();
        let mut vcpus = Vec::with_capacity(self.vcpus.len());
        for (index, vcpu) in self.vcpus.iter_mut().enumerate() {
            let cpu = vcpu.cpu.snapshot().map_err(|source| SnapshotError::Cpu {
                vcpu: index,
                source,
            })?;
            let run = match vcpu.run {
                RunState::WaitingForStart => RunSnap::WaitingForStart,
                RunState::Halted => RunSnap::Halted,
                RunState::Runnable | RunState::Stalled { .. } | RunState::ApfHalted => {
                    RunSnap::Runnable
                }
            };
            vcpus.push(VcpuState {
                cpu,
                run,
                kicked: vcpu.kicked,
                nmi_pending: vcpu.nmi_pending,
                wake_not_before: vcpu.wake_not_before.0,
                started: self.shared.directory[index].started,
                apf: vcpu.apf.state,
                apf_waiters: !vcpu.apf.works.is_empty() || !vcpu.apf.ready_queue.is_empty(),
                apf_stats: vcpu.apf.stats,
                kvmclock: vcpu.kvmclock,
                steal: vcpu.steal,
                pv_eoi: vcpu.pv_eoi,
                stats: vcpu.stats.clone(),
                xapic: vcpu.xapic,
                shadow: (vcpu.mmu_mode == MmuMode::Shadow)
                    .then_some((vcpu.shadow.guest_cr3, vcpu.shadow.guest_nxe_off)),
                tlb: if vcpu.mmu_mode == MmuMode::Ept {
                    saved_tlb(vcpu.cpu.tlb().image(), vcpu.root.map(|r| r.eptp.0), &gfn_of)
                } else {
                    TlbImage::default()
                },
            });
        }
        let shared = &self.shared;
        let config = self.config_state();
        let state = VmState {
            config,
            time: shared.time.0,
            kernel: self.kernel.as_ref().map(|k| (k.entry, k.start, k.end)),
            wall_clock: shared.wall_clock,
            platform,
            reports: shared
                .reports
                .iter()
                .map(|r| ReportState {
                    vcpu: r.vcpu as u32,
                    cycles: r.cycles,
                    line: r.line.clone(),
                })
                .collect(),
            vcpus,
            host_cpus: self.sched.host_cpu_state(),
            ept: self.ept_leaves(),
        };
        options()
            .serialize(&state)
            .map_err(|e| SnapshotError::Unsupported(format!("encoding the state: {e}")))
    }

    /// Host frame → gfn, for the resident pages of guest RAM.
    fn gfn_of_frame(&self) -> std::collections::HashMap<u64, u64> {
        let Some(slot) = self.shared.host.slots.get(RAM_SLOT) else {
            return Default::default();
        };
        (0..slot.npages)
            .filter_map(|i| match slot.state_at(i) {
                crate::memslot::PageState::Resident(frame) => Some((frame.0, slot.gfn_at(i).0)),
                _ => None,
            })
            .collect()
    }

    /// Points a saved TLB entry ([`saved_tlb`]) at this VM's frame for its
    /// page and at its root, or refuses it (`false`): a page not resident
    /// here (a lazy restore's, a post-copy's remote ones, one evicted by a
    /// smaller `--host-mem`) or, under EPT, not mapped, must fault as it
    /// would, not hit a cached translation.
    fn repoint_tlb_entry(
        &self,
        entry: &mut machine::mmu::tlb::TlbImageEntry,
        eptp: Option<u64>,
    ) -> bool {
        let host = &self.shared.host;
        let gfn = entry.hpa().0 / PAGE_SIZE;
        let Some(slot) = host.slots.get(RAM_SLOT) else {
            return false;
        };
        if entry.size() != machine::mmu::PageSize::Size4K || !slot.contains(machine::Gfn(gfn)) {
            return false;
        }
        let crate::memslot::PageState::Resident(frame) = slot.state(machine::Gfn(gfn)) else {
            return false;
        };
        if entry.under_ept() {
            entry.eptp = match (entry.eptp, eptp) {
                (TLB_CURRENT_ROOT, Some(eptp)) => {
                    if host
                        .mmu
                        .leaf_spte(&host.mem, &host.costs, machine::Gfn(gfn))
                        .is_none()
                    {
                        return false;
                    }
                    eptp
                }
                (TLB_OLD_ROOT, _) => NO_ROOT_EPTP,
                _ => return false,
            };
        } else if entry.eptp != 0 {
            return false;
        }
        entry.set_hpa(frame.addr());
        true
    }

    /// The RAM pages the EPT maps, with their leaf bits (empty under
    /// shadow paging, whose sptes a restore rebuilds from the guest's page
    /// tables as it refaults).
    fn ept_leaves(&self) -> Vec<(u64, u64)> {
        let host = &self.shared.host;
        if host.mmu.mode != MmuMode::Ept {
            return Vec::new();
        }
        let Some(slot) = host.slots.get(RAM_SLOT) else {
            return Vec::new();
        };
        let resident = (0..slot.npages)
            .filter(|&i| matches!(slot.state_at(i), crate::memslot::PageState::Resident(_)))
            .map(|i| slot.gfn_at(i));
        host.mmu
            .leaf_bits(&host.mem, &host.costs, resident)
            .into_iter()
            .map(|(gfn, bits)| (gfn.0, bits))
            .collect()
    }

    /// Maps the saved EPT leaves `ept` again, for the pages resident here
    /// (a lazy restore's, a post-copy's still-`remote` and pages a smaller
    /// `--host-mem` evicted while loading fault in as they would have).
    /// Every entry is checked: gfns increasing inside RAM, the bits those
    /// of a present 4 KiB leaf the MMU could have made.
    fn restore_ept(&mut self, ept: &[(u64, u64)], remote: &[u64]) -> Result<(), SnapshotError> {
        use crate::mmu::spte;
        let npages = self.mem_size() / PAGE_SIZE;
        if !ept.is_empty() && self.shared.host.mmu.mode != MmuMode::Ept {
            return Err(SnapshotError::Invalid(
                "EPT mappings in a shadow-paging snapshot".into(),
            ));
        }
        let mut previous = None;
        for &(gfn, bits) in ept {
            let host = &mut self.shared.host;
            let invalid = |why: &str| {
                Err(SnapshotError::Invalid(format!(
                    "EPT leaf of gfn {gfn:#x} ({bits:#x}): {why}"
                )))
            };
            if gfn >= npages || previous.is_some_and(|p| p >= gfn) {
                return invalid("outside guest RAM or out of order");
            }
            previous = Some(gfn);
            if bits & spte::ADDR_MASK != 0 || bits & spte::HUGE != 0 {
                return invalid("address bits or a large page");
            }
            if !spte::is_present(bits)
                || bits & spte::READ == 0
                || !spte::writable_bits_consistent(bits)
            {
                return invalid("not a leaf the MMU makes");
            }
            let state = |host: &crate::host::Host| {
                host.slots
                    .get(RAM_SLOT)
                    .map(|slot| slot.state(machine::Gfn(gfn)))
            };
            if remote.binary_search(&gfn).is_ok() {
                continue;
            }
            if matches!(state(host), Some(crate::memslot::PageState::Untouched)) {
                // A page the guest touched that reads as zero (the memory
                // section leaves those out): touched again here, as it
                // was, rather than at the guest's cost.
                self.shared
                    .write_guest(Gpa(gfn * PAGE_SIZE), &[0; PAGE_SIZE as usize])?;
            }
            let host = &mut self.shared.host;
            let Some(crate::memslot::PageState::Resident(frame)) = state(host) else {
                continue;
            };
            host.mmu
                .restore_leaf(
                    &host.mem,
                    &mut host.frames,
                    machine::Gfn(gfn),
                    frame,
                    bits,
                    &host.costs,
                )
                .map_err(|e| SnapshotError::Unsupported(format!("rebuilding the EPT: {e}")))?;
        }
        Ok(())
    }

    /// The configuration the VM was built with, as saved.
    fn config_state(&self) -> ConfigState {
        ConfigState::of(&self.config)
    }

    /// Every page of guest RAM that has been touched and does not read as
    /// zero, with its contents (swapped pages read back).
    fn saved_pages(&mut self) -> Result<Vec<(u64, Vec<u8>)>, SnapshotError> {
        let npages = self.mem_size() / PAGE_SIZE;
        let mut pages = Vec::new();
        let mut buf = vec![0u8; PAGE_SIZE as usize];
        for gfn in 0..npages {
            let touched =
                self.shared.host.slots.get(RAM_SLOT).is_some_and(|s| {
                    !matches!(s.state_at(gfn), crate::memslot::PageState::Untouched)
                });
            if !touched {
                continue;
            }
            self.shared.read_guest(Gpa(gfn * PAGE_SIZE), &mut buf)?;
            if buf.iter().any(|&b| b != 0) {
                pages.push((gfn, buf.clone()));
            }
        }
        self.carry_out_cross_requests();
        Ok(pages)
    }

    /// A VM restored from `bytes` ([`Vm::snapshot`]'s output), ready to
    /// run on from the saved virtual time. Everything is checked; a bad
    /// snapshot is an error, never a panic.
    pub fn restore(bytes: &[u8], options: &RestoreOptions) -> Result<Vm, SnapshotError> {
        Vm::restore_with_remote(bytes, options, &[])
    }

    /// [`Vm::restore`], with the gfns `remote` (a post-copy's pages still
    /// at the source, increasing) left out of the EPT it rebuilds.
    fn restore_with_remote(
        bytes: &[u8],
        options: &RestoreOptions,
        remote: &[u64],
    ) -> Result<Vm, SnapshotError> {
        let (state, memory) = decode_state(bytes)?;
        let config = state.config.to_config(options)?;
        let npages = config.mem_size / PAGE_SIZE;
        if state.vcpus.len() != config.vcpus as usize {
            return Err(SnapshotError::Invalid(format!(
                "{} vCPU states for {} vCPUs",
                state.vcpus.len(),
                config.vcpus
            )));
        }
        let pages = format::memory_pages(memory, npages)?;
        let mut vm = Vm::new(&config)?;
        vm.kernel = state
            .kernel
            .map(|(entry, start, end)| KernelImage { entry, start, end });
        vm.shared.time = Cycles(state.time);
        for (gfn, data) in pages {
            if options.lazy {
                let page: &[u8; PAGE_SIZE as usize] = data
                    .try_into()
                    .map_err(|_| SnapshotError::Invalid("a short page".into()))?;
                let shared = &mut vm.shared;
                shared
                    .pager
                    .place_in_swap(
                        &mut shared.host.slots,
                        crate::pager::PageRef {
                            slot: RAM_SLOT,
                            index: gfn,
                        },
                        page,
                    )
                    .map_err(|e| SnapshotError::Unsupported(format!("lazy restore: {e}")))?;
            } else {
                vm.shared.write_guest(Gpa(gfn * PAGE_SIZE), data)?;
            }
        }
        vm.carry_out_cross_requests();
        if !options.lazy {
            vm.restore_ept(&state.ept, remote)?;
        }
        vm.shared.wall_clock = WallClock {
            boot_ns: config.wall_clock_at_boot_ns,
            ..state.wall_clock
        };
        vm.shared
            .platform
            .restore(&state.platform)
            .map_err(SnapshotError::Invalid)?;
        for r in &state.reports {
            if r.vcpu >= config.vcpus {
                return Err(SnapshotError::Invalid(format!(
                    "a report from vCPU {}",
                    r.vcpu
                )));
            }
        }
        vm.shared.reports = state
            .reports
            .iter()
            .map(|r| Report {
                vcpu: r.vcpu as usize,
                cycles: r.cycles,
                line: r.line.clone(),
            })
            .collect();
        for (index, saved) in state.vcpus.iter().enumerate() {
            let vcpu = &mut vm.vcpus[index];
            vcpu.cpu
                .restore_snapshot(&saved.cpu)
                .map_err(|source| SnapshotError::Cpu {
                    vcpu: index,
                    source,
                })?;
            vcpu.kicked = saved.kicked;
            vcpu.nmi_pending = saved.nmi_pending;
            vcpu.wake_not_before = Cycles(saved.wake_not_before);
            vcpu.kvmclock = saved.kvmclock;
            vcpu.steal = saved.steal;
            vcpu.pv_eoi = saved.pv_eoi;
            vcpu.stats = saved.stats.clone();
            vcpu.xapic = saved.xapic;
            match (saved.shadow, vcpu.mmu_mode) {
                (Some((guest_cr3, nxe_off)), MmuMode::Shadow) => {
                    if guest_cr3 >> machine::mmu::paging::MAX_PHYS_ADDR_BITS != 0 {
                        return Err(SnapshotError::Invalid(format!(
                            "vCPU {index}: guest CR3 {guest_cr3:#x} has reserved bits"
                        )));
                    }
                    vcpu.shadow.guest_cr3 = guest_cr3;
                    vcpu.shadow.guest_nxe_off = nxe_off;
                }
                (None, MmuMode::Ept) => {}
                _ => {
                    return Err(SnapshotError::Invalid(format!(
                        "vCPU {index}: shadow-paging state does not match the MMU"
                    )))
                }
            }
            vcpu.requests.set(Requests::RELOAD_ROOT);
            if vcpu.mmu_mode == MmuMode::Ept {
                let eptp = vm.shared.host.mmu.current_eptp(&vm.shared.host.costs);
                let mut tlb = saved.tlb.clone();
                tlb.entries.retain_mut(|e| vm.repoint_tlb_entry(e, eptp));
                vm.vcpus[index]
                    .cpu
                    .load_tlb_image(&tlb, |_| true)
                    .map_err(|source| SnapshotError::Cpu {
                        vcpu: index,
                        source,
                    })?;
                // Paused in guest mode at the save, its EPTP was in the
                // VMCS: load its root now (untimed, as at boot), so the
                // first run resumes the pause as the unsaved run would.
                let vcpu = &mut vm.vcpus[index];
                if vcpu.cpu.is_paused() {
                    vcpu.process_requests(&mut vm.shared).map_err(|e| {
                        SnapshotError::Invalid(format!("vCPU {index}: loading its EPT root: {e}"))
                    })?;
                }
            } else {
                // Shadow paging rebuilds its shadow pages and their write
                // protection from nothing: no cached translation may
                // outlive them.
                vcpu.requests.set(Requests::TLB_FLUSH);
            }
            vm.shared.directory[index].started = saved.started;
            vm.restore_apf_state(index, &saved.apf, saved.apf_waiters)?;
            let vcpu = &mut vm.vcpus[index];
            vcpu.apf.stats = saved.apf_stats;
            match saved.run {
                RunSnap::WaitingForStart => vcpu.run = RunState::WaitingForStart,
                RunSnap::Runnable => vm.sched.set_runnable(vcpu),
                RunSnap::Halted => vm.sched.block(vcpu, RunState::Halted),
            }
        }
        match (&state.host_cpus, vm.sched.host_cpus()) {
            (Some(host), Some(_)) => {
                vm.sched
                    .set_host_cpu_state(host)
                    .map_err(SnapshotError::Invalid)?;
            }
            (None, None) => {}
            _ => {
                return Err(SnapshotError::Invalid(
                    "host CPU state does not match --host-cpus".into(),
                ))
            }
        }
        Ok(vm)
    }

    /// A post-copy destination's VM: restored from `bytes` (its memory
    /// section holds the pages received before the switch-over), with the
    /// guest RAM pages `remote` (gfns, strictly increasing, none of them
    /// in the memory section) still at the source. Each is fetched from
    /// `source` at its first touch, through the swap-in path: the vCPU
    /// waits for it as `--apf` says (`docs/migration.md`, "Post-copy").
    pub fn restore_postcopy(
        bytes: &[u8],
        options: &RestoreOptions,
        remote: &[u64],
        source: Box<dyn crate::pager::PageSource>,
    ) -> Result<Vm, SnapshotError> {
        let mut vm = Vm::restore_with_remote(bytes, options, remote)?;
        let npages = vm.mem_size() / PAGE_SIZE;
        let mut previous = None;
        for &gfn in remote {
            if gfn >= npages || previous.is_some_and(|p| p >= gfn) {
                return Err(SnapshotError::Invalid(format!(
                    "remote page {gfn:#x}: outside the guest's {npages} pages or out of order"
                )));
            }
            previous = Some(gfn);
            let shared = &mut vm.shared;
            let untouched =
                shared.host.slots.get(RAM_SLOT).is_some_and(|s| {
                    matches!(s.state_at(gfn), crate::memslot::PageState::Untouched)
                });
            if !untouched {
                return Err(SnapshotError::Invalid(format!(
                    "page {gfn:#x} both received and still to come"
                )));
            }
            shared
                .pager
                .place_remote(
                    &mut shared.host.slots,
                    crate::pager::PageRef {
                        slot: RAM_SLOT,
                        index: gfn,
                    },
                )
                .map_err(|e| SnapshotError::Unsupported(format!("post-copy: {e}")))?;
        }
        vm.shared.pager.set_page_source(Some(source));
        Ok(vm)
    }

    /// Post-copy: guest pages still at the source, never touched here.
    pub fn remote_pages(&self) -> u64 {
        self.shared.pager.remote_pages()
    }
}

#[cfg(test)]
mod tests;
