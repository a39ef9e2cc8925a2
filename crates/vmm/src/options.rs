//! Options shared by `run`, `restore` and the benchmarks: host memory,
//! swap and async page faults, the MMU, the cost tables, the output.

use crate::costs::{parse_cost_override, parse_cost_profile, CostOverride, CostProfile};
use crate::units::{self, parse_nonzero_size, parse_size};
use clap::ValueEnum;
use hv::VmConfig;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// A swap read latency: fixed (`8ms`) or a uniform range (`4ms-17ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyArg {
    pub min: Duration,
    pub max: Duration,
}

impl LatencyArg {
    pub fn cycles(self) -> hv::swap::LatencyRange {
        hv::swap::LatencyRange {
            min: units::duration_to_cycles(self.min),
            max: units::duration_to_cycles(self.max),
        }
    }
}

pub fn parse_latency(s: &str) -> Result<LatencyArg, String> {
    let (min, max) = match s.split_once('-') {
        Some((a, b)) => (units::parse_duration(a)?, units::parse_duration(b)?),
        None => {
            let d = units::parse_duration(s)?;
            (d, d)
        }
    };
    if min > max {
        return Err(format!("latency range `{s}` has min above max"));
    }
    Ok(LatencyArg { min, max })
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DirtyModeArg {
    Bitmap,
    Manual,
    Ring,
    Pml,
}

impl From<DirtyModeArg> for hv::DirtyLogMode {
    fn from(m: DirtyModeArg) -> Self {
        match m {
            DirtyModeArg::Bitmap => hv::DirtyLogMode::Bitmap,
            DirtyModeArg::Manual => hv::DirtyLogMode::Manual,
            DirtyModeArg::Ring => hv::DirtyLogMode::Ring,
            DirtyModeArg::Pml => hv::DirtyLogMode::Pml,
        }
    }
}

/// Host memory, swap and async page fault options (shared by `run` and
/// the benchmarks).
#[derive(clap::Args, Debug, Clone)]
pub struct OvercommitArgs {
    /// Host memory for guest pages (the container limit), e.g. 64M; the
    /// guest may have more. Default: as much as guest memory (no swapping).
    #[arg(long, value_parser = parse_size)]
    pub host_mem: Option<u64>,
    /// Swap file (created or truncated; a regular file or a block device).
    /// Needs --host-mem: without a limit nothing is swapped. Default: a
    /// temporary file in $TMPDIR, unlinked at once.
    #[arg(long, value_name = "FILE", requires = "host_mem")]
    pub swap: Option<PathBuf>,
    /// Swap device preset (see docs/apf.md for where the numbers come from).
    #[arg(long, value_enum, default_value_t = SwapDeviceArg::Hdd)]
    pub swap_device: SwapDeviceArg,
    /// Read latency, overriding the preset: fixed (`8ms`) or a uniform
    /// range (`4ms-17ms`).
    #[arg(long, value_parser = parse_latency)]
    pub swap_latency: Option<LatencyArg>,
    /// Bandwidth in bytes per second, overriding the preset (e.g. 500M).
    #[arg(long, value_parser = parse_nonzero_size)]
    pub swap_bandwidth: Option<u64>,
    /// Requests the device serves at once, overriding the preset.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub swap_queue: Option<u32>,
    /// How a vCPU waits for a page on swap: stall (off), halt in the hv
    /// (halt), or tell the PV guest (pv).
    #[arg(long, value_enum, default_value_t = ApfArg::Pv)]
    pub apf: ApfArg,
    /// The paravirtual protocol of `--apf pv`.
    #[arg(long, value_enum, default_value_t = ApfProtocolArg::X86)]
    pub apf_protocol: ApfProtocolArg,
    /// How guest memory is virtualised: EPT, or shadow page tables.
    #[arg(long, value_enum, default_value_t = MmuArg::Ept)]
    pub mmu: MmuArg,
    /// Shadow paging: roots each vCPU keeps for a CR3 switch back (KVM's
    /// prev_roots).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(0..=64))]
    pub shadow_prev_roots: u64,
    /// Shadow paging: let a written guest leaf table go unsync until the
    /// next CR3 load (on, KVM since 2008); off, every write to a shadowed
    /// guest table is emulated, as in KVM's trunk of January 2007 (seed
    /// 004's baseline; with --shadow-prev-roots 0 that configuration).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub shadow_unsync: OnOff,
    /// Shadow paging: offer the guest the paravirtual CR3 cache (seed
    /// 004), so its context switches to a cached address space do not
    /// exit.
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    pub cr3_cache: OnOff,
    /// The CPU's CR3-target count (4 on Intel CPUs): the entries of each
    /// vCPU's CR3 cache.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub cr3_targets: u64,
    /// The fast page fault: fix faults on present sptes without mmu_lock.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub fast_pf: OnOff,
    /// EPT accessed/dirty flags; off, the pager ages pages by access
    /// tracking (the fast page fault restores them).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub ept_ad: OnOff,
    /// Shadow paging, fast page fault on: write faults on leaves of
    /// indirect shadow pages take the slow path (`slow`, as modern KVM) or
    /// are fixed with seed 001's own scheme (`seed`).
    #[arg(long, value_enum, default_value_t = FastPfIndirectArg::Slow)]
    pub fast_pf_indirect: FastPfIndirectArg,
    /// Set one entry of the machine's or the hv's cost table (repeatable),
    /// e.g. `exit_base=600`, for a sensitivity study of a cited figure.
    #[arg(long = "cost", value_name = "NAME=CYCLES", value_parser = parse_cost_override)]
    pub costs: Vec<CostOverride>,
    /// A whole cost table in a file, `NAME=CYCLES` per line (`faultline
    /// calibrate --write-profile FILE` writes this host's), applied
    /// before any `--cost`; entries it leaves out keep the default.
    #[arg(long, value_name = "FILE", value_parser = parse_cost_profile)]
    pub cost_profile: Option<CostProfile>,
    /// What runs guest code: `interp` (the interpreter) or `jit` (the
    /// translator); the same guest state and virtual time either way.
    #[arg(long, default_value = "jit")]
    pub engine: hv::Engine,
}

/// `--fast-pf-indirect`: what the shadow MMU's fast path does with a leaf
/// of an indirect shadow page.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FastPfIndirectArg {
    /// The slow path (modern KVM).
    Slow,
    /// Seed 001's scheme: the vCPU's id in the spte, a flag per gfn.
    Seed,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MmuArg {
    Ept,
    Shadow,
    /// No memory virtualisation: gpa = hpa, EPT off, nothing shadowed
    /// (the benchmarks' native row).
    #[value(name = "none")]
    #[serde(rename = "none")]
    Native,
}

/// `--device`: an optional device the platform attaches (with a PCI bus).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceArg {
    /// QEMU's educational PCI device (ids 1234:11e8): registers, a DMA
    /// engine, INTx and MSI.
    Edu,
}

/// `--iommu`: an IOMMU the platform attaches (with a PCI bus).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum IommuArg {
    /// An Intel VT-d remapping unit with interrupt remapping, named by an
    /// ACPI DMAR table.
    Intel,
}

/// A switch on the command line.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnOff {
    On,
    Off,
}

impl OnOff {
    pub fn on(self) -> bool {
        self == OnOff::On
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SwapDeviceArg {
    Hdd,
    Ssd,
    Nvme,
    Net,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ZapArg {
    Slow,
    Fast,
    /// Seed 003's v2: roots zapped, hash table and rmaps reset wholesale,
    /// the old pages freed after the lock.
    Seed,
}

impl From<ZapArg> for hv::ZapMode {
    fn from(z: ZapArg) -> Self {
        match z {
            ZapArg::Slow => hv::ZapMode::Slow,
            ZapArg::Fast => hv::ZapMode::Fast,
            ZapArg::Seed => hv::ZapMode::Seed,
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApfArg {
    Off,
    Halt,
    Pv,
}

impl From<ApfArg> for hv::apf::ApfMode {
    fn from(a: ApfArg) -> Self {
        match a {
            ApfArg::Off => hv::apf::ApfMode::Off,
            ApfArg::Halt => hv::apf::ApfMode::Halt,
            ApfArg::Pv => hv::apf::ApfMode::Pv,
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApfProtocolArg {
    X86,
    Event,
}

impl OvercommitArgs {
    /// The device model: the preset with the overrides applied.
    pub fn device(&self) -> hv::swap::DeviceModel {
        use hv::swap::DevicePreset;
        let preset = match self.swap_device {
            SwapDeviceArg::Hdd => DevicePreset::Hdd,
            SwapDeviceArg::Ssd => DevicePreset::Ssd,
            SwapDeviceArg::Nvme => DevicePreset::Nvme,
            SwapDeviceArg::Net => DevicePreset::Net,
        };
        let mut model = preset.model();
        let overridden = self.swap_latency.is_some()
            || self.swap_bandwidth.is_some()
            || self.swap_queue.is_some();
        if let Some(latency) = self.swap_latency {
            model.read_latency = latency.cycles();
        }
        if let Some(bandwidth) = self.swap_bandwidth {
            model.bandwidth = bandwidth;
        }
        if let Some(queue) = self.swap_queue {
            model.queue = queue;
        }
        if overridden {
            model.name.push('+');
        }
        model
    }

    /// Applies these options to `config`.
    pub fn apply(&self, config: &mut VmConfig) {
        config.host_mem = self.host_mem;
        config.swap_path = self.swap.clone();
        config.swap_device = self.device();
        config.apf = self.apf.into();
        config.apf_protocol = match self.apf_protocol {
            ApfProtocolArg::X86 => hv::apf::ApfProtocol::X86,
            ApfProtocolArg::Event => hv::apf::ApfProtocol::Event,
        };
        config.mmu = match self.mmu {
            MmuArg::Ept => hv::MmuMode::Ept,
            MmuArg::Shadow => hv::MmuMode::Shadow,
            MmuArg::Native => hv::MmuMode::Native,
        };
        config.shadow_prev_roots = self.shadow_prev_roots as usize;
        config.shadow_unsync = self.shadow_unsync.on();
        config.cr3_cache = self.cr3_cache.on();
        config.cr3_targets = self.cr3_targets as usize;
        config.mmu_options = hv::MmuOptions {
            fast_pf: self.fast_pf.on(),
            ept_ad: self.ept_ad.on(),
            seed_indirect: self.fast_pf_indirect == FastPfIndirectArg::Seed,
        };
        if let Some(profile) = &self.cost_profile {
            profile.apply(config);
        }
        for cost in &self.costs {
            cost.apply(config);
        }
        config.engine = self.engine;
    }
}

/// `--guest`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GuestArg {
    #[default]
    Faultline,
    Linux,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatsFormat {
    Text,
    Json,
}
