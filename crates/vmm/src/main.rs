//! `faultline`: boots the guest kernel under the hv and runs a guest
//! program, or runs the seed benchmarks.
//!
//! Exit status (see the README):
//! - `run`: the guest's (the HC_SHUTDOWN status, or `(v << 1) | 1` for a
//!   write of v to the isa-debug-exit port, as QEMU does), modulo 256;
//! - 2: a usage or configuration error (options, kernel image, swap file,
//!   output path), found before any VM runs;
//! - 3: the VM (or a benchmark run) stopped with an error, or a result
//!   could not be written;
//! - 124: `--time-limit` or `--wall-limit` ended the run;
//! - 130 / 143: SIGINT / SIGTERM stopped the run (a second one exits at
//!   once with the same status).

mod bench;
mod plot;
mod reproduce;

// The product (run, restore, incoming, calibrate, the summary) is the
// library; the benchmarks here use it, never the other way round.
use vmm::*;

use clap::{Parser, Subcommand};
use costs::{parse_cost_override, parse_cost_profile, CostOverride, CostProfile};
use hv::VmConfig;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use units::{parse_nonzero_size, parse_positive_duration, parse_positive_seconds, parse_size};

/// mimalloc instead of glibc's malloc: the vCPU thread frees what the
/// translator thread allocated (requests, code), and glibc serialises
/// such frees on the owning arena's lock (futex waits and wakes on both
/// threads); mimalloc frees across threads without a lock.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "faultline",
    version,
    about = "A hypervisor with its own memory virtualization",
    after_help = "Exit status: the guest's for `run`; 2 configuration error; 3 VM error; \
                  124 --time-limit/--wall-limit; 130 SIGINT; 143 SIGTERM."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Boot the guest kernel and run a guest program.
    Run(Box<RunArgs>),
    /// Reproduce a seed experiment (several VM runs compared side by side).
    #[command(subcommand)]
    Bench(Box<BenchCommand>),
    /// Resume a VM saved by `run --snapshot-at TIME --snapshot FILE` and
    /// run it to its end as `run` would (its output continues the saved
    /// run's).
    Restore(migrate::RestoreArgs),
    /// Wait for one VM migrated by `run --migrate-to`, then run it to its
    /// end as `run` would (its output continues the source's).
    Incoming(migrate::incoming::IncomingArgs),
    /// Run host micro-benchmarks (cache-line transfer, locks, TLB-missing
    /// loads, a system call, a context switch, ...) and print each beside
    /// the cost-table entries it informs (`docs/costs.md`).
    Calibrate(calibrate::CalibrateArgs),
    /// Run every seed's experiments and print one table per seed: the
    /// seed's figure, faultline's, the ratio and whether it is met.
    Reproduce(reproduce::ReproduceArgs),
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Seed 000: `bm -f 4 -w 4` with guest memory 4x host memory, the
    /// array between the two; total work with --apf off, halt and pv, and
    /// the ideal (the array fits in host memory).
    Apf(ApfBenchArgs),
    /// Seed 002: one vCPU, guest memory 2x host memory, a task writing
    /// all its memory several times, with and without a calculation task,
    /// APF off and on.
    #[command(name = "apf-calc")]
    ApfCalc(ApfCalcBenchArgs),
    /// Seed 003: 6 vCPUs keep 2 GiB of guest memory touched while the VMM
    /// deletes and re-adds a memslot 10 times; zap-all slow and fast: the
    /// operation's time, the longest vCPU stall, pages zapped, lock
    /// breaks, the refault cost.
    Memslot(MemslotBenchArgs),
    /// Seed 001 / KVM's dirty_log_perf_test: N vCPUs each dirty their own
    /// region while the VMM collects the dirty log after each pass; the
    /// time to dirty memory, get and clear times, populate / enable /
    /// disable times, per MMU and collection mode.
    #[command(name = "dirty-log")]
    DirtyLog(DirtyLogBenchArgs),
    /// Seed 001's frame-buffer case: a window composited into a frame
    /// buffer while the VMM harvests its dirty pages at 60 Hz; guest
    /// throughput with the fast page fault on and off, the cost of a
    /// write fault and the mmu_lock wait per fault, under EPT and shadow.
    Fastpf(FastpfBenchArgs),
    /// Seed 004: a 2-task context switch (two processes ping-ponging
    /// through pipes) under EPT, shadow paging, shadow with prev_roots and
    /// shadow with the paravirtual CR3 cache of 4 and 16 targets: the time
    /// per switch, CR3-load exits, roots built, TLB misses.
    Ctxsw(CtxswBenchArgs),
    /// Remote TLB flushes with fewer host CPUs than vCPUs
    /// (preempted vCPUs), PV TLB flush and PV sched yield on and off:
    /// flush latency, IPIs sent and those sent to preempted vCPUs.
    Tlbflush(TlbflushBenchArgs),
    /// Seed 004: hackbench (N groups of 20 sender and 20 receiver
    /// processes over pipes) under the same rows as `bench ctxsw`: time,
    /// CR3-load exits, roots built, TLB misses, CR3-cache hits.
    Hackbench(HackbenchBenchArgs),
    /// Seed 001's live migration: a guest under a write load migrates by
    /// pre-copy to a second faultline process on loopback, fast page
    /// fault on and off: total time, downtime, rounds, pages, the cost of
    /// the dirty-logging write faults.
    Migrate(MigrateBenchArgs),
    /// Merge the JSON results of the runs `--list-runs` printed into the
    /// benchmark's table (or JSON) and plot, as a direct run prints them.
    Merge(MergeArgs),
}

/// Options every benchmark shares.
#[derive(clap::Args, Debug, Clone, Serialize, Deserialize)]
pub struct BenchCommon {
    /// Print JSON instead of a table.
    #[arg(long)]
    #[serde(skip)]
    json: bool,
    /// Seed of the guest program and the device model.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// VM runs at once (each on its own host thread). Default: the host's
    /// cores.
    #[arg(long)]
    #[serde(skip)]
    jobs: Option<usize>,
    /// Run this kernel ELF instead of the bundled guest kernel.
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// Swap device preset (the benchmark's own default if not given).
    #[arg(long, value_enum)]
    swap_device: Option<SwapDeviceArg>,
    /// Read latency, overriding the preset: `8ms` or `4ms-17ms`.
    #[arg(long, value_parser = parse_latency)]
    swap_latency: Option<LatencyArg>,
    /// Bandwidth in bytes per second, overriding the preset.
    #[arg(long, value_parser = parse_nonzero_size)]
    swap_bandwidth: Option<u64>,
    /// Requests the device serves at once, overriding the preset.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    swap_queue: Option<u32>,
    /// The paravirtual protocol of the `pv` runs.
    #[arg(long, value_enum, default_value_t = ApfProtocolArg::X86)]
    apf_protocol: ApfProtocolArg,
    /// How guest memory is virtualised: EPT, or shadow page tables.
    #[arg(long, value_enum, default_value_t = MmuArg::Ept)]
    mmu: MmuArg,
    /// Shadow paging: roots each vCPU keeps for a CR3 switch back (KVM's
    /// prev_roots).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(0..=64))]
    shadow_prev_roots: u64,
    /// The fast page fault (fix faults on present sptes without
    /// mmu_lock): on or off; `bench dirty-log` takes a list (`on,off`)
    /// and runs each.
    #[arg(long = "fast-pf", value_delimiter = ',', default_value = "on", value_parser = parse_on_off)]
    fast_pf: Vec<bool>,
    /// Shadow paging, fast page fault on: write faults on leaves of
    /// indirect shadow pages take the slow path (`slow`, as modern KVM) or
    /// are fixed with seed 001's own scheme (`seed`: the vCPU's id in the
    /// spte, a write-protect flag per gfn).
    #[arg(long, value_enum, default_value_t = FastPfIndirectArg::Slow)]
    fast_pf_indirect: FastPfIndirectArg,
    /// EPT accessed/dirty flags; off, the pager ages pages by access
    /// tracking (the fast page fault restores them).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    ept_ad: OnOff,
    /// Set one entry of the machine's or the hv's cost table (repeatable),
    /// e.g. `exit_base=600`: every run of the benchmark uses it.
    #[arg(long = "cost", value_name = "NAME=CYCLES", value_parser = parse_cost_override)]
    costs: Vec<CostOverride>,
    /// A whole cost table in a file, `NAME=CYCLES` per line (`faultline
    /// calibrate --write-profile FILE` writes this host's), applied
    /// before any `--cost`.
    #[arg(long, value_name = "FILE", value_parser = parse_cost_profile)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cost_profile: Option<CostProfile>,
    /// What runs guest code: `interp` or `jit` (the translator). Results
    /// are the same either way, so it is not one of the recorded params.
    #[arg(long, default_value = "jit")]
    #[serde(skip)]
    engine: hv::Engine,
    /// Print the benchmark's independent runs as command lines (one per
    /// line, each printing its result as JSON) instead of running them;
    /// `faultline bench merge` combines their results.
    #[arg(long, conflicts_with = "run")]
    #[serde(skip)]
    list_runs: bool,
    /// Run only the run of this label (as `--list-runs` prints it) and
    /// print its result as JSON.
    #[arg(long, value_name = "LABEL")]
    #[serde(skip)]
    run: Option<String>,
}

impl BenchCommon {
    fn overcommit(&self, default_device: SwapDeviceArg) -> OvercommitArgs {
        OvercommitArgs {
            host_mem: None,
            swap: None,
            swap_device: self.swap_device.unwrap_or(default_device),
            swap_latency: self.swap_latency,
            swap_bandwidth: self.swap_bandwidth,
            swap_queue: self.swap_queue,
            apf: ApfArg::Pv,
            apf_protocol: self.apf_protocol,
            mmu: self.mmu,
            shadow_prev_roots: self.shadow_prev_roots,
            shadow_unsync: OnOff::On,
            cr3_cache: OnOff::Off,
            cr3_targets: 4,
            fast_pf: if self.fast_pf.last() == Some(&false) {
                OnOff::Off
            } else {
                OnOff::On
            },
            ept_ad: self.ept_ad,
            fast_pf_indirect: self.fast_pf_indirect,
            costs: self.costs.clone(),
            cost_profile: self.cost_profile.clone(),
            engine: self.engine,
        }
    }

    /// `--cost-profile`, then every `--cost`.
    pub fn apply_costs(&self, config: &mut VmConfig) {
        if let Some(profile) = &self.cost_profile {
            profile.apply(config);
        }
        for cost in &self.costs {
            cost.apply(config);
        }
    }

    fn jobs(&self) -> usize {
        self.jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1)
    }
}

#[derive(clap::Args, Debug, Clone, Serialize, Deserialize)]
pub struct ApfBenchArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// vCPUs (the seed: 4).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    vcpus: u32,
    /// Host memory for guest pages (the container limit).
    #[arg(long, default_value = "32M", value_parser = parse_size)]
    host_mem: u64,
    /// Guest memory (default: 4x host memory, as the seed).
    #[arg(long, value_parser = parse_size)]
    mem: Option<u64>,
    /// bm's array (default: 2x host memory: larger than host memory,
    /// smaller than guest memory).
    #[arg(long, value_parser = parse_size)]
    array: Option<u64>,
    /// bm's run time in virtual seconds, `0.2` or `200ms` (the seed ran
    /// 60 s on real hardware; the ratios settle well before).
    #[arg(long, default_value = "0.2", value_parser = parse_positive_seconds)]
    duration: Duration,
    /// Faulting threads.
    #[arg(long, default_value_t = 4)]
    fault_threads: u32,
    /// Work threads.
    #[arg(long, default_value_t = 4)]
    work_threads: u32,
    /// Where the SVG plot goes (default: faultline-results/bench-apf.svg,
    /// or bench-apf-sweep.svg, under the current directory).
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    plot: Option<PathBuf>,
    /// Instead: pv/off gain at each of these fixed read latencies.
    #[arg(long, num_args = 0.., value_delimiter = ',', value_parser = parse_positive_duration,
          default_missing_value = "100us,1ms,4ms,10ms,20ms")]
    sweep_latency: Option<Vec<Duration>>,
    #[command(flatten)]
    #[serde(flatten)]
    guest: BenchGuestArgs,
}

/// `--guest` and `--kernel-image` of the benches that run in Linux too.
#[derive(clap::Args, Debug, Clone, Default, Serialize, Deserialize)]
pub struct BenchGuestArgs {
    /// The guest: the project's kernel, or Debian's cloud kernel running
    /// the Linux build of the bench's program (pthreads, processes and
    /// pipes; Linux's scheduler and its own async-PF code; docs/linux.md).
    #[arg(long, value_enum, default_value_t = GuestArg::Faultline)]
    #[serde(default)]
    guest: GuestArg,
    /// The Linux bzImage for --guest linux (default: the one
    /// `scripts/fetch-linux.sh` cached).
    #[arg(long, value_name = "FILE")]
    #[serde(default)]
    kernel_image: Option<PathBuf>,
}

#[derive(clap::Args, Debug, Clone, Serialize, Deserialize)]
pub struct ApfCalcBenchArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// Host memory for guest pages (the container limit; default 16M,
    /// 48M with --guest linux, whose own working set is larger).
    #[arg(long, value_parser = parse_size)]
    host_mem: Option<u64>,
    /// Guest memory (default: 2x host memory, as the seed; with --guest
    /// linux 8/3x, room for Linux's own 55 MiB).
    #[arg(long, value_parser = parse_size)]
    mem: Option<u64>,
    /// The writer's memory (default: 1.25x host memory; with --guest
    /// linux 4/3x).
    #[arg(long, value_parser = parse_size)]
    array: Option<u64>,
    /// Times the writer writes all of it.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    loops: u32,
    /// Bytes between the writer's stores.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    stride: u32,
    #[command(flatten)]
    #[serde(flatten)]
    guest: BenchGuestArgs,
}

fn default_memslot_zaps() -> Vec<ZapArg> {
    vec![ZapArg::Slow, ZapArg::Fast]
}

#[derive(clap::Args, Debug, Clone, Serialize, Deserialize)]
pub struct MemslotBenchArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// vCPUs (the seed: 6).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=64))]
    vcpus: u32,
    /// Guest memory (the seed: 2 GiB); the guest touches 7/8 of it.
    #[arg(long, default_value = "2G", value_parser = parse_size)]
    mem: u64,
    /// The MMUs measured, each with every zap of --zaps (this
    /// benchmark's own list: `--mmu` is not used).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "ept,shadow")]
    mmus: Vec<MmuArg>,
    /// The zap-all modes measured on each MMU: slow (KVM before seed
    /// 003), fast (as merged), seed (the seed's v2: hash table and rmaps
    /// reset wholesale).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "slow,fast")]
    #[serde(default = "default_memslot_zaps")]
    zaps: Vec<ZapArg>,
    /// Memslot deletes + re-adds per run (the seed: 10).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    ops: u32,
    /// Instead of --mem: each of these guest memory sizes.
    #[arg(long, num_args = 0.., value_delimiter = ',', value_parser = parse_size,
          default_missing_value = "256M,512M,1G,2G")]
    sweep_mem: Option<Vec<u64>>,
    /// Where the SVG plot goes (default: faultline-results/bench-memslot.svg
    /// under the current directory).
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    plot: Option<PathBuf>,
}

#[derive(clap::Args, Debug, Clone, Serialize, Deserialize)]
pub struct FastpfBenchArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// The MMUs measured, each with fast PF on and off.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "ept,shadow")]
    mmus: Vec<MmuArg>,
    /// Frames composited.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    frames: u64,
    /// The window's side in pixels (x11perf -comppixwin500: 500).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(16..=8192))]
    window: u64,
    /// Frame buffer width in pixels.
    #[arg(long, default_value_t = 1920, value_parser = clap::value_parser!(u64).range(16..=8192))]
    width: u64,
    /// Frame buffer height in pixels.
    #[arg(long, default_value_t = 1080, value_parser = clap::value_parser!(u64).range(16..=8192))]
    height: u64,
    /// Dirty-log harvests per virtual second (a display's refresh).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    harvest_hz: u32,
    /// Where the SVG plot goes (default: faultline-results/bench-fastpf.svg
    /// under the current directory).
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    plot: Option<PathBuf>,
}

#[derive(clap::Args, Debug, Clone, Serialize, Deserialize)]
pub struct CtxswBenchArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// Round trips (two switches each).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(2..=10_000_000))]
    rounds: u64,
    /// Also run seed 004's own 2007 configurations: KVM's trunk of
    /// January 2007 (roots cached in the shadow page hash, guest page
    /// tables write-protected, every write to one emulated: no unsync, no
    /// prev_roots), without and with the CR3 cache of 4 targets.
    #[arg(long)]
    #[serde(default)]
    kvm_2007: bool,
    #[command(flatten)]
    #[serde(flatten)]
    guest: BenchGuestArgs,
    /// Where the SVG plot goes (default: faultline-results/bench-ctxsw.svg
    /// under the current directory).
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    plot: Option<PathBuf>,
}

#[derive(clap::Args, Debug, Clone, Serialize, Deserialize)]
pub struct TlbflushBenchArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// vCPUs, one `tlbflush` thread each.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=64))]
    vcpus: u32,
    /// Host CPUs of the overcommitted runs (below --vcpus).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=63))]
    host_cpus: u32,
    /// How long a vCPU keeps a host CPU while others wait (default 3ms).
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    host_slice: Option<Duration>,
    /// Rounds per thread (one remote flush each).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    rounds: u64,
    /// Computation between flushes (iterations of a multiply-add).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(0..=1 << 32))]
    work: u64,
    /// Where the SVG plot goes (default: faultline-results/bench-tlbflush.svg
    /// under the current directory).
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    plot: Option<PathBuf>,
}

#[derive(clap::Args, Debug, Clone, Serialize, Deserialize)]
pub struct HackbenchBenchArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// Group counts to run (`hackbench N`: 40N processes), each under
    /// every row.
    #[arg(long, value_delimiter = ',', default_value = "1,5",
          value_parser = clap::value_parser!(u32).range(1..=6))]
    groups: Vec<u32>,
    /// Messages each sender writes to each receiver of its group.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    loops: u64,
    /// vCPUs of the guest.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    vcpus: u32,
    /// Guest memory.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    mem: u64,
    /// Also run seed 004's own 2007 configurations (`bench ctxsw
    /// --kvm-2007`): KVM's trunk of January 2007 without and with the CR3
    /// cache of 4 targets.
    #[arg(long)]
    #[serde(default)]
    kvm_2007: bool,
    #[command(flatten)]
    #[serde(flatten)]
    guest: BenchGuestArgs,
    /// Where the SVG plot goes (default:
    /// faultline-results/bench-hackbench.svg under the current directory).
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    plot: Option<PathBuf>,
}

/// `faultline bench migrate`.
#[derive(clap::Args, Debug, Clone)]
pub struct MigrateBenchArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// vCPUs (default: 2; 1 with --postcopy, as the seed's guest).
    #[arg(long)]
    vcpus: Option<u32>,
    /// Guest memory.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    mem: u64,
    /// The writers' array.
    #[arg(long, default_value = "16M", value_parser = parse_size)]
    array: u64,
    /// bm's run time (virtual).
    #[arg(long, default_value = "0.2", value_parser = parse_positive_seconds)]
    duration: Duration,
    /// When the migration starts (default 20ms; 30ms with --postcopy,
    /// when apfcalc's writer is sweeping its array).
    #[arg(long, value_parser = parse_positive_duration)]
    at: Option<Duration>,
    /// The link's bandwidth, bytes per second.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    link_bandwidth: u64,
    /// The downtime limit.
    #[arg(long, default_value = "1ms", value_parser = parse_positive_duration)]
    downtime_limit: Duration,
    /// Pre-copy rounds at most.
    #[arg(long, default_value_t = 5)]
    max_rounds: u32,
    /// Seed of the guest program.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seed 002's case instead: a loaded guest (`apfcalc -c` on the
    /// `--array`) migrated by post-copy at `--at`, async PF off and on.
    #[arg(long)]
    postcopy: bool,
    /// --postcopy: the writer's sweeps over the array.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1000))]
    loops: u64,
    /// Set one entry of the machine's or the hv's cost table (repeatable),
    /// e.g. `exit_base=600`: every run of the benchmark uses it.
    #[arg(long = "cost", value_name = "NAME=CYCLES", value_parser = parse_cost_override)]
    costs: Vec<CostOverride>,
    /// Where the SVG plot goes (default:
    /// faultline-results/bench-migrate.svg, or
    /// faultline-results/bench-migrate-postcopy.svg with --postcopy).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

#[derive(clap::Args, Debug, Clone, Serialize, Deserialize)]
pub struct DirtyLogBenchArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// vCPUs, each writing its own region (KVM's -v).
    #[arg(short = 'v', long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=64))]
    vcpus: u32,
    /// Bytes per vCPU (KVM's -b).
    #[arg(short = 'b', long, default_value = "32M", value_parser = parse_size)]
    bytes: u64,
    /// Percentage of the accesses that write (KVM's -w); the rest read.
    #[arg(short = 'w', long, default_value_t = 100)]
    write_percent: u32,
    /// Logged iterations after the populating pass (KVM's -i).
    #[arg(short = 'i', long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=1000))]
    iterations: u64,
    /// Random page order (with repeats) instead of sequential (KVM's -a).
    #[arg(long)]
    random: bool,
    /// The MMUs measured.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "ept,shadow")]
    mmus: Vec<MmuArg>,
    /// The collection modes measured (pml runs under EPT only).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "bitmap,manual,ring,pml"
    )]
    modes: Vec<DirtyModeArg>,
    /// Entries per vCPU dirty ring (ring mode).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(128..=1 << 20))]
    ring_size: u32,
    /// Where the SVG plot goes (default:
    /// faultline-results/bench-dirty-log.svg under the current directory).
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    plot: Option<PathBuf>,
}

/// `on` or `off`.
fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("`{other}`: expected on or off")),
    }
}

#[derive(clap::Args, Debug)]
pub struct MergeArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Where the SVG plot goes (for benchmarks that draw one; default as
    /// the benchmark's).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// The runs' JSON results.
    #[arg(required = true, value_name = "FILES")]
    files: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Blocks are translated on a host thread of their own while the vCPU
    // thread interprets them (`FAULTLINE_JIT_SYNC=1`: on the vCPU thread,
    // for host instruction counts that repeat).
    hv::translate_in_background(true);
    let status = match cli.command {
        Command::Run(args) => run::run(*args),
        Command::Bench(command) => bench::main(*command),
        Command::Restore(args) => migrate::restore(args),
        Command::Incoming(args) => migrate::incoming::incoming(args),
        Command::Calibrate(args) => calibrate::calibrate(args),
        Command::Reproduce(args) => reproduce::reproduce(args),
    };
    ExitCode::from(status)
}
