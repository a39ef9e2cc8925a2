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
mod restore;
mod save;

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

#[cfg(test)]
mod tests;
