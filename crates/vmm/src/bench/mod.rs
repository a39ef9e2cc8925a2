//! `faultline bench ...`: the seed experiments, each a set of independent
//! VM runs compared side by side.
//!
//! Every figure comes from the guest's own HC_REPORT lines and the hv's
//! counters, all in virtual time, so the same command prints the same
//! numbers; runs go in parallel (one host thread each, `--jobs`), which
//! changes only the wall time.
//!
//! A benchmark is a list of labelled runs ([`RunSpec`]) and a rendering
//! of their results ([`RunResult`]) into a table or JSON and a plot. The
//! runs can also be fanned out: `--list-runs` prints one command line per
//! run (`... --run LABEL`), each prints its result as a JSON [`RunFile`],
//! and `bench merge` renders those files exactly as the direct run does.

mod apf;
mod apf_calc;
mod ctxsw;
mod dirty_log;
mod fastpf;
mod hackbench;
mod memslot;
mod migrate;
mod migrate_postcopy;
pub mod seeds;
mod tlbflush;

use crate::config::{check_output_path, ConfigError, Kernel};
use crate::memslot_churn::{ChurnTrigger, MemslotRun, SlotChurn};
use crate::session::{drive, BenchProgress, Ending, Limits, PanicWatch};
use crate::signals::{Signal, StopRequest};
use crate::units::cycles_to_secs;
use crate::{BenchCommand, BenchCommon, MergeArgs, EXIT_CONFIG, EXIT_VM_ERROR};
use hv::{StopReason, Vm, VmConfig};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use thiserror::Error;

/// A benchmark failed.
#[derive(Debug, Error)]
pub enum BenchError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{label}: cannot boot: {source}")]
    Boot {
        label: String,
        source: hv::CreateError,
    },
    #[error("{label}: the VM stopped: {message}\nguest output ends with:\n{tail}")]
    VmStopped {
        label: String,
        message: String,
        tail: String,
    },
    #[error("{label}: the guest program failed ({reason})\nguest output ends with:\n{tail}")]
    GuestFailed {
        label: String,
        reason: String,
        tail: String,
    },
    #[error("run `{label}` reported no {key} (reports: {reports:?})")]
    Missing {
        label: String,
        key: String,
        reports: Vec<String>,
    },
    #[error("interrupted by {}: {}", .signal.name(), describe_interrupted(.runs))]
    Interrupted {
        signal: Signal,
        runs: Vec<(String, RunState)>,
    },
    #[error("cannot write the plot {path}: {reason}")]
    Plot { path: PathBuf, reason: String },
    #[error("cannot read {path}: {reason}")]
    ReadResult { path: PathBuf, reason: String },
    #[error("merge: {0}")]
    Merge(String),
}

impl BenchError {
    fn exit_status(&self) -> u8 {
        match self {
            BenchError::Config(_)
            | BenchError::Boot { .. }
            | BenchError::ReadResult { .. }
            | BenchError::Merge(_) => EXIT_CONFIG,
            BenchError::Interrupted { signal, .. } => signal.exit_status(),
            BenchError::VmStopped { .. }
            | BenchError::GuestFailed { .. }
            | BenchError::Missing { .. }
            | BenchError::Plot { .. } => EXIT_VM_ERROR,
        }
    }
}

/// Where each run of an interrupted benchmark was.
#[derive(Debug, Clone, PartialEq)]
pub enum RunState {
    Finished,
    /// Stopped at this virtual time (seconds).
    Interrupted(f64),
    NotStarted,
}

fn describe_interrupted(runs: &[(String, RunState)]) -> String {
    let list = |want: fn(&RunState) -> Option<String>| -> String {
        let names: Vec<String> = runs
            .iter()
            .filter_map(|(label, state)| want(state).map(|extra| format!("{label}{extra}")))
            .collect();
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    };
    format!(
        "finished: {}; interrupted: {}; not started: {}",
        list(|s| (*s == RunState::Finished).then(String::new)),
        list(|s| match s {
            RunState::Interrupted(secs) => Some(format!(" (at {secs:.3} virtual s)")),
            _ => None,
        }),
        list(|s| (*s == RunState::NotStarted).then(String::new)),
    )
}

/// One VM run of a benchmark.
pub struct RunSpec {
    pub label: String,
    pub config: VmConfig,
    /// Memslot changes the VMM makes while the guest runs, and how many.
    pub memslot: Option<(ChurnTrigger, u32)>,
    /// A dirty-logging run: it boots the dirtywrite kernel instead of the
    /// guest kernel and the VMM drives its passes.
    pub dirty_log: Option<dirty_log::DirtyLogSpec>,
    /// Dirty logging of guest RAM from boot, harvested every period of
    /// virtual time (`bench fastpf`).
    pub harvest: Option<hv::Cycles>,
    /// Boot this Linux guest instead of the guest kernel (`--guest linux`).
    pub linux: Option<std::sync::Arc<LinuxGuest>>,
}

/// A Linux guest for a benchmark run: Debian's bzImage and the project's
/// initramfs (`/init` and the Linux programs). The command line is the
/// run's `VmConfig::cmdline`.
pub struct LinuxGuest {
    pub image: Vec<u8>,
    pub initrd: Vec<u8>,
    /// The kernel's version string (its setup header), printed with
    /// every Linux result.
    pub version: String,
}

impl LinuxGuest {
    /// The cached (or given) image and the built-in initramfs.
    pub fn load(image: Option<&Path>) -> Result<LinuxGuest, crate::linux::LinuxSetupError> {
        let initrd = crate::linux::initramfs()?;
        let (path, image) = crate::linux::read_image(image)?;
        let version = crate::linux::image_version(&image)
            .unwrap_or_else(|| format!("unknown version ({})", path.display()));
        Ok(LinuxGuest {
            image,
            initrd,
            version,
        })
    }
}

/// The guest a benchmark boots (`--guest`): the project's kernel, or
/// Linux with its image and initramfs loaded once for every run, or why
/// they could not be (reported by [`BenchGuest::check`], before any run).
pub struct BenchGuest {
    linux: Option<Result<std::sync::Arc<LinuxGuest>, String>>,
}

impl BenchGuest {
    pub fn new(args: &crate::BenchGuestArgs) -> BenchGuest {
        let linux = (args.guest == crate::GuestArg::Linux).then(|| {
            LinuxGuest::load(args.kernel_image.as_deref())
                .map(std::sync::Arc::new)
                .map_err(|e| e.to_string())
        });
        BenchGuest { linux }
    }

    pub fn is_linux(&self) -> bool {
        self.linux.is_some()
    }

    /// `linux` or `faultline`, for the JSON outputs.
    pub fn name(&self) -> &'static str {
        if self.is_linux() {
            "linux"
        } else {
            "faultline"
        }
    }

    /// Checks that the guest can run `program`: Linux was set up and has
    /// it, or the kernel has it and takes `mem` (and `host_mem`).
    pub fn check(
        &self,
        kernel: &Kernel,
        program: &str,
        mem: u64,
        host_mem: Option<u64>,
    ) -> Result<(), ConfigError> {
        match &self.linux {
            Some(Err(e)) => Err(ConfigError::Invalid(e.clone())),
            Some(Ok(_)) => crate::linux::check_program(&[program.to_string()])
                .map_err(|e| ConfigError::Invalid(e.to_string())),
            None => {
                kernel.check_memory(mem, host_mem)?;
                kernel.check_program(program)
            }
        }
    }

    /// The command line that runs `program` (its name, then its
    /// arguments): after Linux's default options, or after the project
    /// kernel's `seed=`.
    pub fn cmdline(&self, seed: u64, program: &[String]) -> String {
        if self.is_linux() {
            crate::linux::cmdline(crate::linux::DEFAULT_OPTIONS, program)
        } else {
            format!("seed={seed} -- {}", program.join(" "))
        }
    }

    /// The Linux kernel's version string, for `--guest linux`.
    pub fn linux_version(&self) -> Option<&str> {
        match &self.linux {
            Some(Ok(linux)) => Some(&linux.version),
            _ => None,
        }
    }

    /// `Linux 6.1.0-57-cloud-amd64, ` before a Linux bench's description,
    /// nothing for the project's kernel.
    pub fn describe_prefix(&self) -> String {
        self.linux_version().map_or(String::new(), |v| {
            format!("Linux {}, ", crate::linux::release(v))
        })
    }

    /// What Linux reports available to programs (MemAvailable, bytes) in
    /// a guest of `config`'s size, from a run of `hello` (init reports it
    /// before it starts the program).
    pub fn probe_available(
        &self,
        kernel: &Kernel,
        config: &VmConfig,
        stop: &StopRequest,
    ) -> Result<u64, BenchError> {
        let mut config = config.clone();
        config.host_mem = None;
        config.cmdline = self.cmdline(config.seed, &["hello".to_string()]);
        let spec = self.spec("probe", config);
        let result = run_all(vec![spec], &kernel.bytes, 1, stop)?.remove(0);
        Ok(result.require("linux_mem_available_kb")? << 10)
    }

    /// A run of this guest.
    pub fn spec(&self, label: impl Into<String>, config: VmConfig) -> RunSpec {
        let mut spec = RunSpec::new(label, config);
        spec.linux = self.linux.as_ref().and_then(|l| l.as_ref().ok().cloned());
        spec
    }
}

/// Linux's async-PF events from both sides: what the hv sent, what Linux
/// acknowledged (`MSR_KVM_ASYNC_PF_ACK`) and Linux's own count of the
/// page-ready interrupts it took (`/proc/interrupts`' HYP line, reported by
/// init when the program has ended, so init's own last steps are not in
/// it). Linux has no counter of the page-not-present #PFs it took; each one
/// it took is answered by a page-ready, so with every task finished,
/// page-ready = not-present + wake-alls. The last column is the program's
/// timed part (`timed_key`, nanoseconds), in seconds.
pub(crate) fn render_async_pf_both_sides(s: &mut String, outcomes: &[RunResult], timed_key: &str) {
    use std::fmt::Write as _;
    let _ = writeln!(
        s,
        "async PF, both sides: {:<8} {:>11} {:>10} {:>9} {:>11} {:>10}  agree  {:>8}",
        "run", "not-present", "page-ready", "wake-all", "Linux acked", "Linux HYP", "timed s"
    );
    for o in outcomes {
        let hyp = o.value("linux_hyp_interrupts");
        let _ = writeln!(
            s,
            "                      {:<8} {:>11} {:>10} {:>9} {:>11} {:>10}  {:<5}  {:>8}",
            o.label,
            o.apf.not_present,
            o.apf.ready,
            o.apf.wake_all,
            o.apf.acks,
            hyp.map_or("-".to_string(), |h| h.to_string()),
            if o.async_pf_sides_agree() {
                "yes"
            } else {
                "NO"
            },
            o.value(timed_key)
                .map_or("-".to_string(), |ns| format!("{:.3}", ns as f64 / 1e9))
        );
    }
}

impl RunSpec {
    /// A plain run of the guest kernel: no memslot changes, no dirty
    /// logging.
    pub fn new(label: impl Into<String>, config: VmConfig) -> RunSpec {
        RunSpec {
            label: label.into(),
            config,
            memslot: None,
            dirty_log: None,
            harvest: None,
            linux: None,
        }
    }
}

/// `value` as the pretty-printed JSON a `--json` run prints, with its
/// newline.
pub(crate) fn json_text(value: &impl Serialize) -> String {
    format!(
        "{}\n",
        serde_json::to_string_pretty(value).unwrap_or_default()
    )
}

/// The result of the run labelled `label` among `results`.
pub(crate) fn result_for<'a>(
    results: &'a [RunResult],
    label: &str,
) -> Result<&'a RunResult, BenchError> {
    results
        .iter()
        .find(|r| r.label == label)
        .ok_or_else(|| BenchError::Merge(format!("no result for `{label}`")))
}

/// Asynchronous page fault counters of a run, summed over vCPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApfCounters {
    pub not_present: u64,
    pub ready: u64,
    pub halts: u64,
    pub halt_cycles: u64,
    pub stalls: u64,
    pub stall_cycles: u64,
    pub peak_outstanding: u64,
    /// Wake-alls among the page-ready notifications.
    #[serde(default)]
    pub wake_all: u64,
    /// Page-ready acknowledgements the guest wrote.
    #[serde(default)]
    pub acks: u64,
}

/// What a run produced: every figure a benchmark renders, all integers
/// (so a result read back from JSON is bit-for-bit the one written).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunResult {
    pub label: String,
    pub virtual_cycles: u64,
    pub instructions: u64,
    pub swap_ins: u64,
    pub swap_outs: u64,
    pub evictions: u64,
    pub apf: ApfCounters,
    /// HC_REPORT lines.
    pub reports: Vec<String>,
    /// The memslot changes made during the run, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memslot: Option<MemslotRun>,
    /// The dirty-logging run's record, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirty_log: Option<dirty_log::DirtyLogRun>,
    /// The harvested run's record, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harvest: Option<fastpf::HarvestRun>,
    /// Address-space switching counters, summed over vCPUs.
    #[serde(default)]
    pub mmu: MmuCounters,
    /// Host CPUs (`--host-cpus`): steal time and the PV features for it,
    /// summed over vCPUs.
    #[serde(default)]
    pub steal: StealCounters,
}

/// Steal time and what the hv did about preempted vCPUs, summed over
/// vCPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StealCounters {
    pub steal_cycles: u64,
    pub preemptions: u64,
    /// TLB flushes the hv did at entry for a PV TLB flush.
    pub pv_tlb_flushes: u64,
    pub ipis_received: u64,
    /// IPIs that found their target preempted.
    pub ipis_received_preempted: u64,
    pub sched_yields: u64,
    pub sched_yields_directed: u64,
}

/// What a run's address-space switches cost the MMU, summed over vCPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmuCounters {
    /// MOV-to-CR3 exits.
    pub cr3_load_exits: u64,
    /// Shadow roots built.
    pub roots_built: u64,
    /// TLB lookups that needed a walk.
    pub tlb_misses: u64,
    /// Paging-structure entries those walks read (guest and EPT).
    #[serde(default)]
    pub page_walk_refs: u64,
}

impl RunResult {
    fn new(label: String, vm: &Vm) -> RunResult {
        let stats = vm.stats();
        let apf = stats.apf();
        RunResult {
            label,
            virtual_cycles: stats.virtual_cycles,
            instructions: stats.instructions(),
            swap_ins: stats.pager.swap_ins,
            swap_outs: stats.pager.swap_outs,
            evictions: stats.pager.evictions,
            apf: ApfCounters {
                not_present: apf.not_present,
                ready: apf.ready,
                halts: apf.halts,
                halt_cycles: apf.halt_cycles,
                stalls: apf.stalls,
                stall_cycles: apf.stall_cycles,
                peak_outstanding: apf.peak_outstanding,
                wake_all: apf.wake_all,
                acks: apf.acks,
            },
            reports: vm.reports().iter().map(|r| r.line.clone()).collect(),
            memslot: None,
            dirty_log: None,
            harvest: None,
            mmu: MmuCounters {
                cr3_load_exits: stats.vcpus.iter().map(|v| v.cr3_cache.cr3_load_exits).sum(),
                roots_built: stats.shadow.map_or(0, |s| s.roots_built),
                tlb_misses: stats.vcpus.iter().map(|v| v.tlb_misses).sum(),
                page_walk_refs: stats.vcpus.iter().map(|v| v.page_walk_refs).sum(),
            },
            steal: {
                let sum = |f: fn(&hv::VcpuStats) -> u64| stats.vcpus.iter().map(f).sum();
                StealCounters {
                    steal_cycles: sum(|v| v.steal_cycles),
                    preemptions: sum(|v| v.preemptions),
                    pv_tlb_flushes: sum(|v| v.pv_tlb_flushes),
                    ipis_received: sum(|v| v.ipis_received),
                    ipis_received_preempted: sum(|v| v.ipis_received_preempted),
                    sched_yields: sum(|v| v.sched_yields),
                    sched_yields_directed: sum(|v| v.sched_yields_directed),
                }
            },
        }
    }

    /// `key=value` from the report lines.
    pub fn value(&self, key: &str) -> Option<u64> {
        self.reports.iter().find_map(|line| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        })
    }

    /// Like `value`, or an error naming the run.
    pub fn require(&self, key: &str) -> Result<u64, BenchError> {
        self.value(key).ok_or_else(|| BenchError::Missing {
            label: self.label.clone(),
            key: key.to_string(),
            reports: self.reports.clone(),
        })
    }

    /// A Linux run's async-PF counts agree: Linux acknowledged every
    /// page-ready, each page-not-present got one (with every task finished)
    /// besides the wake-alls, and Linux's own HYP count is at most that
    /// (no HYP line: Linux never installed the vector, so it took none;
    /// init reads it after the program and before its own last steps, whose
    /// page-not-presents, init running in user mode, come after).
    pub fn async_pf_sides_agree(&self) -> bool {
        self.value("linux_hyp_interrupts").unwrap_or(0) <= self.apf.ready
            && self.apf.acks == self.apf.ready
            && self.apf.ready == self.apf.not_present + self.apf.wake_all
    }

    pub fn virtual_seconds(&self) -> f64 {
        cycles_to_secs(self.virtual_cycles)
    }

    /// Counters shown for each run in the JSON output.
    pub fn counters(&self) -> serde_json::Value {
        json!({
            "virtual_seconds": self.virtual_seconds(),
            "instructions": self.instructions,
            "swap_ins": self.swap_ins,
            "swap_outs": self.swap_outs,
            "evictions": self.evictions,
            "not_present_sent": self.apf.not_present,
            "ready_sent": self.apf.ready,
            "apf_halts": self.apf.halts,
            "apf_halt_cycles": self.apf.halt_cycles,
            "stalls": self.apf.stalls,
            "stall_cycles": self.apf.stall_cycles,
            "peak_outstanding": self.apf.peak_outstanding,
            "wake_all_sent": self.apf.wake_all,
            "acks_received": self.apf.acks,
        })
    }
}

/// The JSON a `--run LABEL` invocation prints: the benchmark, its
/// parameters (the options that shape its runs) and the run's result.
#[derive(Debug, Serialize, Deserialize)]
pub struct RunFile {
    pub benchmark: String,
    pub params: serde_json::Value,
    pub run: RunResult,
}

/// How a benchmark's output is wanted.
pub struct Output {
    pub json: bool,
    /// Where the plot goes; `None`: the benchmark's default under
    /// [`RESULTS_DIR`].
    pub plot: Option<PathBuf>,
}

/// Where plots go unless `--plot` says otherwise (under the current
/// directory; created when needed).
pub const RESULTS_DIR: &str = "faultline-results";

impl Output {
    /// The plot's path: `--plot`, or `faultline-results/<default_name>`.
    pub fn plot_path(&self, default_name: &str) -> PathBuf {
        self.plot
            .clone()
            .unwrap_or_else(|| Path::new(RESULTS_DIR).join(default_name))
    }

    /// Checks `--plot` before any run.
    pub fn check(&self) -> Result<(), ConfigError> {
        match &self.plot {
            Some(path) => check_output_path("--plot", path),
            None => Ok(()),
        }
    }

    /// Whether a plot is drawn: always for a table, for `--json` only
    /// when `--plot FILE` asked for one (a JSON run writes nothing
    /// unasked into the current directory).
    pub fn wants_plot(&self) -> bool {
        !self.json || self.plot.is_some()
    }

    /// The `plot` field of a JSON result: the file, or null when none
    /// was drawn.
    pub fn plot_json(&self, path: &Path) -> serde_json::Value {
        if self.wants_plot() {
            json!(path.display().to_string())
        } else {
            serde_json::Value::Null
        }
    }

    /// Writes a plot drawn by `draw` into `path` (if one is wanted).
    pub fn write_plot(
        &self,
        path: &Path,
        draw: impl FnOnce(&Path) -> Result<(), String>,
    ) -> Result<(), BenchError> {
        if !self.wants_plot() {
            return Ok(());
        }
        let error = |reason: String| BenchError::Plot {
            path: path.to_path_buf(),
            reason,
        };
        if self.plot.is_none() {
            std::fs::create_dir_all(RESULTS_DIR).map_err(|e| error(e.to_string()))?;
        }
        draw(path).map_err(error)
    }
}

/// A benchmark: its runs and how their results are shown.
pub trait Bench {
    /// `apf`, `apf-calc`: the name in `faultline bench NAME`.
    const NAME: &'static str;
    /// The options that shape the runs (serialized into each run file).
    type Params: Serialize + serde::de::DeserializeOwned;

    fn new(params: Self::Params) -> Self;
    fn params(&self) -> &Self::Params;
    fn common(&self) -> &BenchCommon;
    /// Checks the options against each other and the kernel, before any
    /// run.
    fn check(&self, kernel: &Kernel) -> Result<(), ConfigError>;
    /// Settles what depends on the guest itself (e.g. sizes from what
    /// Linux reports available), after `check` and before `specs`.
    fn prepare(&mut self, _kernel: &Kernel, _stop: &StopRequest) -> Result<(), BenchError> {
        Ok(())
    }
    fn specs(&self) -> Vec<RunSpec>;
    fn render(&self, results: &[RunResult], output: &Output) -> Result<String, BenchError>;
    /// faultline's figures beside the seed's (printed under the table,
    /// and collected by `faultline reproduce`).
    fn comparisons(&self, _results: &[RunResult]) -> Result<Vec<seeds::Comparison>, BenchError> {
        Ok(Vec::new())
    }
    /// The table (or JSON) with its comparisons.
    fn render_compared(
        &self,
        results: &[RunResult],
        output: &Output,
    ) -> Result<String, BenchError> {
        let out = self.render(results, output)?;
        let comparisons = self.comparisons(results)?;
        Ok(seeds::attach(out, output.json, &comparisons))
    }
}

pub fn main(command: BenchCommand) -> u8 {
    let result = match command {
        BenchCommand::Apf(args) => {
            let output = Output {
                json: args.common.json,
                plot: args.plot.clone(),
            };
            execute(apf::ApfBench::new(args), &output)
        }
        BenchCommand::ApfCalc(args) => {
            let output = Output {
                json: args.common.json,
                plot: None,
            };
            execute(apf_calc::ApfCalcBench::new(args), &output)
        }
        BenchCommand::Memslot(args) => {
            let output = Output {
                json: args.common.json,
                plot: args.plot.clone(),
            };
            execute(memslot::MemslotBench::new(args), &output)
        }
        BenchCommand::DirtyLog(args) => {
            let output = Output {
                json: args.common.json,
                plot: args.plot.clone(),
            };
            execute(dirty_log::DirtyLogBench::new(args), &output)
        }
        BenchCommand::Fastpf(args) => {
            let output = Output {
                json: args.common.json,
                plot: args.plot.clone(),
            };
            execute(fastpf::FastpfBench::new(args), &output)
        }
        BenchCommand::Ctxsw(args) => {
            let output = Output {
                json: args.common.json,
                plot: args.plot.clone(),
            };
            execute(ctxsw::CtxswBench::new(args), &output)
        }
        BenchCommand::Tlbflush(args) => {
            let output = Output {
                json: args.common.json,
                plot: args.plot.clone(),
            };
            execute(tlbflush::TlbflushBench::new(args), &output)
        }
        BenchCommand::Hackbench(args) => {
            let output = Output {
                json: args.common.json,
                plot: args.plot.clone(),
            };
            execute(hackbench::HackbenchBench::new(args), &output)
        }
        BenchCommand::Migrate(args) => return migrate::bench(args),
        BenchCommand::Merge(args) => merge(&args),
    };
    match result {
        Ok(out) => {
            use std::io::Write;
            let _ = std::io::stdout().write_all(out.as_bytes());
            0
        }
        Err(e) => {
            eprintln!("faultline bench: {e}");
            e.exit_status()
        }
    }
}

/// A bench run in-process by `faultline reproduce`.
pub struct Reproduced {
    /// The bench's table as it prints it (with a plot drawn), or its JSON.
    pub table: String,
    pub comparisons: Vec<seeds::Comparison>,
}

/// Runs `command` in-process for `faultline reproduce`, drawing its plot
/// into `plot` if given (nothing is written otherwise).
pub fn reproduce(
    command: BenchCommand,
    plot: Option<PathBuf>,
    stop: &StopRequest,
) -> Result<Reproduced, String> {
    let result = match command {
        BenchCommand::Apf(args) => reproduce_bench(apf::ApfBench::new(args), plot, stop),
        BenchCommand::ApfCalc(args) => {
            // No plot.
            reproduce_bench(apf_calc::ApfCalcBench::new(args), None, stop)
        }
        BenchCommand::Memslot(args) => {
            reproduce_bench(memslot::MemslotBench::new(args), plot, stop)
        }
        BenchCommand::DirtyLog(args) => {
            reproduce_bench(dirty_log::DirtyLogBench::new(args), plot, stop)
        }
        BenchCommand::Fastpf(args) => reproduce_bench(fastpf::FastpfBench::new(args), plot, stop),
        BenchCommand::Ctxsw(args) => reproduce_bench(ctxsw::CtxswBench::new(args), plot, stop),
        BenchCommand::Tlbflush(args) => {
            reproduce_bench(tlbflush::TlbflushBench::new(args), plot, stop)
        }
        BenchCommand::Hackbench(args) => {
            reproduce_bench(hackbench::HackbenchBench::new(args), plot, stop)
        }
        BenchCommand::Migrate(args) => return migrate::reproduce(args, plot),
        BenchCommand::Merge(_) => return Err("bench merge: not an experiment".into()),
    };
    result.map_err(|e| e.to_string())
}

fn reproduce_bench<B: Bench>(
    mut bench: B,
    plot: Option<PathBuf>,
    stop: &StopRequest,
) -> Result<Reproduced, BenchError> {
    let kernel = Kernel::load(bench.common().kernel.as_deref())?;
    bench.check(&kernel)?;
    bench.prepare(&kernel, stop)?;
    let results = run_all(bench.specs(), &kernel.bytes, bench.common().jobs(), stop)?;
    let output = Output {
        json: plot.is_none(),
        plot,
    };
    Ok(Reproduced {
        table: bench.render(&results, &output)?,
        comparisons: bench.comparisons(&results)?,
    })
}

/// Lists, runs one of, or runs all of `bench`'s runs.
fn execute<B: Bench>(mut bench: B, output: &Output) -> Result<String, BenchError> {
    let common = bench.common();
    // Checked before listing too: a listed run must not fail on its options.
    let kernel = Kernel::load(common.kernel.as_deref())?;
    if B::NAME != dirty_log::DirtyLogBench::NAME && common.fast_pf.len() != 1 {
        return Err(ConfigError::Invalid(format!(
            "--fast-pf: one setting (on or off) for bench {}",
            B::NAME
        ))
        .into());
    }
    bench.check(&kernel)?;
    let stop = StopRequest::install().map_err(ConfigError::Signals)?;
    bench.prepare(&kernel, &stop)?;
    let specs = bench.specs();
    let common = bench.common();
    if common.list_runs {
        return Ok(list_runs(&specs));
    }
    if let Some(label) = &common.run {
        let spec = specs
            .into_iter()
            .find(|s| &s.label == label)
            .ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "--run {label}: no such run (see --list-runs for the labels)"
                ))
            })?;
        let result = run_all(vec![spec], &kernel.bytes, 1, &stop)?.remove(0);
        let file = RunFile {
            benchmark: B::NAME.to_string(),
            params: params_json(&bench),
            run: result,
        };
        return Ok(json_text(&file));
    }
    output.check()?;
    let results = run_all(specs, &kernel.bytes, common.jobs(), &stop)?;
    bench.render_compared(&results, output)
}

fn params_json<B: Bench>(bench: &B) -> serde_json::Value {
    serde_json::to_value(bench.params()).unwrap_or_default()
}

/// One shell command line per run: this invocation with `--list-runs`
/// replaced by `--run LABEL`.
fn list_runs(specs: &[RunSpec]) -> String {
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "faultline".into());
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--list-runs")
        .collect();
    let mut out = String::new();
    for spec in specs {
        let mut line = vec![exe.clone()];
        line.extend(args.iter().cloned());
        line.extend(["--run".to_string(), spec.label.clone()]);
        out.push_str(&shell_words::join(line));
        out.push('\n');
    }
    out
}

/// Renders the results of separately run runs (`--run LABEL`, as
/// `--list-runs` printed them) as the direct run does.
fn merge(args: &MergeArgs) -> Result<String, BenchError> {
    let mut files = Vec::new();
    for path in &args.files {
        let read_error = |reason: String| BenchError::ReadResult {
            path: path.clone(),
            reason,
        };
        let bytes =
            crate::config::read_input_file("bench merge", path, crate::config::RESULT_FILE_CAP)
                .map_err(|e| read_error(e.to_string()))?;
        let text = String::from_utf8(bytes).map_err(|e| read_error(e.to_string()))?;
        let file: RunFile = serde_json::from_str(&text)
            .map_err(|e| read_error(format!("not a `bench --run` result: {e}")))?;
        files.push(file);
    }
    let first = &files[0];
    if let Some(other) = files
        .iter()
        .find(|f| f.benchmark != first.benchmark || f.params != first.params)
    {
        return Err(BenchError::Merge(format!(
            "the results come from different benchmarks or options ({} {} and {} {})",
            first.benchmark, first.params, other.benchmark, other.params
        )));
    }
    let output = Output {
        json: args.json,
        plot: args.plot.clone(),
    };
    output.check()?;
    match first.benchmark.as_str() {
        apf::ApfBench::NAME => merge_into::<apf::ApfBench>(files, &output),
        apf_calc::ApfCalcBench::NAME => merge_into::<apf_calc::ApfCalcBench>(files, &output),
        memslot::MemslotBench::NAME => merge_into::<memslot::MemslotBench>(files, &output),
        dirty_log::DirtyLogBench::NAME => merge_into::<dirty_log::DirtyLogBench>(files, &output),
        fastpf::FastpfBench::NAME => merge_into::<fastpf::FastpfBench>(files, &output),
        ctxsw::CtxswBench::NAME => merge_into::<ctxsw::CtxswBench>(files, &output),
        tlbflush::TlbflushBench::NAME => merge_into::<tlbflush::TlbflushBench>(files, &output),
        hackbench::HackbenchBench::NAME => merge_into::<hackbench::HackbenchBench>(files, &output),
        other => Err(BenchError::Merge(format!("unknown benchmark `{other}`"))),
    }
}

fn merge_into<B: Bench>(files: Vec<RunFile>, output: &Output) -> Result<String, BenchError> {
    let params: B::Params = serde_json::from_value(files[0].params.clone())
        .map_err(|e| BenchError::Merge(format!("the options do not parse: {e}")))?;
    let bench = B::new(params);
    let mut results = Vec::new();
    for spec in bench.specs() {
        let mut matching = files.iter().filter(|f| f.run.label == spec.label);
        let file = matching
            .next()
            .ok_or_else(|| BenchError::Merge(format!("no result for run `{}`", spec.label)))?;
        if matching.next().is_some() {
            return Err(BenchError::Merge(format!(
                "two results for run `{}`",
                spec.label
            )));
        }
        results.push(file.run.clone());
    }
    if files.len() != results.len() {
        return Err(BenchError::Merge(format!(
            "{} results for {} runs: some are not runs of this benchmark",
            files.len(),
            results.len()
        )));
    }
    bench.render_compared(&results, output)
}

/// How one run ended.
enum Outcome {
    Done(Box<RunResult>, Duration),
    Interrupted(f64),
}

/// Runs every spec, `jobs` at a time, showing progress on a terminal.
/// Results come back in spec order. A signal stops every run in flight
/// and starts no more.
fn run_all(
    specs: Vec<RunSpec>,
    kernel: &[u8],
    jobs: usize,
    stop: &StopRequest,
) -> Result<Vec<RunResult>, BenchError> {
    let total = specs.len();
    let labels: Vec<String> = specs.iter().map(|s| s.label.clone()).collect();
    let queue = Mutex::new(specs.into_iter().enumerate().collect::<Vec<_>>());
    let outcomes: Mutex<Vec<Option<Result<Outcome, BenchError>>>> =
        Mutex::new((0..total).map(|_| None).collect());
    let progress = BenchProgress::new(total);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1).min(total.max(1)) {
            scope.spawn(|| loop {
                if stop.signal().is_some() {
                    break;
                }
                let next = {
                    let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
                    (!q.is_empty()).then(|| q.remove(0))
                };
                let Some((i, spec)) = next else { break };
                let outcome = run_one(spec, kernel, stop, &progress);
                outcomes.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(outcome);
            });
        }
    });
    progress.finish();
    let outcomes = outcomes.into_inner().unwrap_or_else(|e| e.into_inner());
    // Host-side figures vary run to run, so they stay off stdout.
    let walls: Vec<String> = outcomes
        .iter()
        .zip(&labels)
        .filter_map(|(o, label)| match o {
            Some(Ok(Outcome::Done(_, wall))) => Some(format!("{label} {:.1}s", wall.as_secs_f64())),
            _ => None,
        })
        .collect();
    eprintln!(
        "faultline bench: {} runs in {:.1}s wall ({})",
        total,
        started.elapsed().as_secs_f64(),
        walls.join(", ")
    );
    if let Some(signal) = stop.signal() {
        let runs = labels
            .into_iter()
            .zip(&outcomes)
            .map(|(label, o)| {
                let state = match o {
                    Some(Ok(Outcome::Done(..))) => RunState::Finished,
                    Some(Ok(Outcome::Interrupted(secs))) => RunState::Interrupted(*secs),
                    // A run that failed on its own before the signal.
                    Some(Err(_)) => RunState::Finished,
                    None => RunState::NotStarted,
                };
                (label, state)
            })
            .collect();
        return Err(BenchError::Interrupted { signal, runs });
    }
    outcomes
        .into_iter()
        .map(|o| match o {
            Some(Ok(Outcome::Done(result, _))) => Ok(*result),
            Some(Err(e)) => Err(e),
            // Not reached: without a signal every run finishes.
            Some(Ok(Outcome::Interrupted(_))) | None => {
                Err(BenchError::Merge("a run did not finish".into()))
            }
        })
        .collect()
}

fn run_one(
    spec: RunSpec,
    kernel: &[u8],
    stop: &StopRequest,
    bench_progress: &BenchProgress,
) -> Result<Outcome, BenchError> {
    let started = Instant::now();
    let kernel = if spec.dirty_log.is_some() {
        dirty_log::KERNEL
    } else {
        kernel
    };
    let booted = match &spec.linux {
        Some(linux) => Vm::boot_linux(&spec.config, &linux.image, &linux.initrd),
        None => Vm::boot(&spec.config, kernel),
    };
    let mut vm = booted.map_err(|source| BenchError::Boot {
        label: spec.label.clone(),
        source,
    })?;
    if let Some(dirty) = spec.dirty_log {
        let slice = hv::Cycles(spec.config.quantum.max(1));
        let mut progress = bench_progress.start();
        let run = dirty_log::drive(&mut vm, &dirty, slice, stop);
        progress.update(&format!("{}: ", spec.label), &vm);
        bench_progress.done(&progress);
        if stop.signal().is_some() {
            return Ok(Outcome::Interrupted(cycles_to_secs(vm.time().0)));
        }
        let run = run.map_err(|message| BenchError::VmStopped {
            label: spec.label.clone(),
            message,
            tail: String::from_utf8_lossy(&vm.take_serial()).into_owned(),
        })?;
        let mut result = RunResult::new(spec.label, &vm);
        result.dirty_log = Some(run);
        return Ok(Outcome::Done(Box::new(result), started.elapsed()));
    }
    let mut churn = match spec.memslot {
        Some((trigger, ops)) => {
            Some(
                SlotChurn::install(&mut vm, trigger, ops).map_err(|e| BenchError::VmStopped {
                    label: spec.label.clone(),
                    message: format!("adding the memslot to change: {e}"),
                    tail: String::new(),
                })?,
            )
        }
        None => None,
    };
    let mut harvester =
        match spec.harvest {
            Some(period) => Some(fastpf::Harvester::install(&mut vm, period).map_err(
                |message| BenchError::VmStopped {
                    label: spec.label.clone(),
                    message,
                    tail: String::new(),
                },
            )?),
            None => None,
        };
    let mut harvest_error = None;
    let mut serial = Vec::new();
    let mut progress = bench_progress.start();
    let prefix = format!("{}: ", spec.label);
    // With memslot changes, slices of one quantum: a change is due when
    // the guest reports a pass, and should follow it closely. Harvests
    // go once per period.
    let limits = Limits {
        slice: churn
            .as_ref()
            .map(|_| hv::Cycles(spec.config.quantum.max(1)))
            .or(harvester.as_ref().map(fastpf::Harvester::slice)),
        ..Limits::default()
    };
    let mut panic = PanicWatch::default();
    let ending = drive(&mut vm, &limits, stop, |vm| {
        let output = vm.take_serial();
        panic.feed(&output);
        serial.extend(output);
        if let Some(churn) = churn.as_mut() {
            churn.after_slice(vm);
        }
        if let Some(harvester) = harvester.as_mut() {
            if let Err(e) = harvester.after_slice(vm) {
                harvest_error.get_or_insert(e);
            }
        }
        progress.update(&prefix, vm);
        panic.ending()
    });
    let ending = panic.explain(ending);
    bench_progress.done(&progress);
    let tail = || {
        let text = String::from_utf8_lossy(&serial);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    };
    // A Linux guest's init powers off after writing its program's exit
    // status to the status port.
    let succeeded = match &ending {
        Ending::Vm(StopReason::Shutdown { status: 0 } | StopReason::DebugExit { status: 1 }) => {
            true
        }
        Ending::Vm(StopReason::PowerOff) => vm.guest_status() == Some(0),
        _ => false,
    };
    match ending {
        _ if succeeded => {
            if let Some(message) = harvest_error {
                return Err(BenchError::VmStopped {
                    label: spec.label.clone(),
                    message,
                    tail: tail(),
                });
            }
            let mut result = RunResult::new(spec.label.clone(), &vm);
            result.harvest = harvester.map(|h| h.finish(&vm));
            if let Some(churn) = churn {
                let run =
                    churn
                        .finish(&vm, spec.config.zap)
                        .map_err(|e| BenchError::VmStopped {
                            label: spec.label.clone(),
                            message: format!("a memslot change failed: {e}"),
                            tail: tail(),
                        })?;
                result.memslot = Some(run);
            }
            Ok(Outcome::Done(Box::new(result), started.elapsed()))
        }
        Ending::Interrupted(_) => Ok(Outcome::Interrupted(cycles_to_secs(vm.time().0))),
        Ending::Vm(StopReason::Error(e)) => Err(BenchError::VmStopped {
            label: spec.label,
            message: e.to_string(),
            tail: tail(),
        }),
        Ending::Vm(StopReason::PowerOff) => Err(BenchError::GuestFailed {
            label: spec.label,
            reason: match vm.guest_status() {
                Some(137) => format!(
                    "Linux's init powered off with status 137: the program was killed by SIGKILL, \
                     Linux's OOM killer: it needed more memory than the guest had ({})",
                    available_note(&vm)
                ),
                Some(status) => format!("Linux's init powered off with status {status}"),
                None => "Linux powered off with no exit status".to_string(),
            },
            tail: tail(),
        }),
        other => Err(BenchError::GuestFailed {
            label: spec.label,
            reason: other.describe(),
            tail: tail(),
        }),
    }
}

/// What Linux's init reported available before the program started, for
/// an OOM kill's message.
fn available_note(vm: &hv::Vm) -> String {
    let value = |key: &str| {
        vm.reports().iter().find_map(|r| {
            r.line
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse::<u64>().ok())
        })
    };
    match (value("linux_mem_available_kb"), value("linux_mem_total_kb")) {
        (Some(available), Some(total)) => format!(
            "MemAvailable {} KiB of MemTotal {} KiB when it started, in a guest of {} MiB",
            available,
            total,
            vm.mem_size() >> 20
        ),
        _ => format!("a guest of {} MiB", vm.mem_size() >> 20),
    }
}

/// MiB in `bytes` (for the guest programs' `-m` options).
fn mib(bytes: u64) -> u64 {
    bytes >> 20
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_run_draws_a_plot_only_when_asked() {
        let drawn = |output: &Output| {
            let mut called = false;
            output
                .write_plot(Path::new("/nonexistent/x.svg"), |_| {
                    called = true;
                    Ok(())
                })
                .unwrap();
            (called, output.plot_json(Path::new("/nonexistent/x.svg")))
        };
        let asked = Output {
            json: true,
            plot: Some(PathBuf::from("/nonexistent/x.svg")),
        };
        assert_eq!(drawn(&asked), (true, json!("/nonexistent/x.svg")));
        let unasked = Output {
            json: true,
            plot: None,
        };
        assert_eq!(drawn(&unasked), (false, serde_json::Value::Null));
    }
}
