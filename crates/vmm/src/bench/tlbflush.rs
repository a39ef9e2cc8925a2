//! `bench tlbflush`: remote TLB flushes when vCPUs are preempted (issue
//! 13). The guest's `tlbflush` program runs one thread per vCPU; each
//! round every thread drops a page the others read (SYS_ZAP), so the
//! guest kernel flushes it from every CPU running the process
//! (`guest/kernel/tlb.c`). Four runs side by side:
//!
//! - `dedicated`: one host CPU per vCPU (no vCPU is ever preempted);
//! - `overcommit-ipi`: `--host-cpus` below `--vcpus`, PV TLB flush, PV
//!   sched yield and PV unhalt off: every flush IPIs every target and spins
//!   until all acknowledged, preempted or not;
//! - `overcommit-ipi-unhalt`: the same, but a sender that waits long halts
//!   (freeing its host CPU) until the last target kicks it;
//! - `overcommit-ipi-yield`: the same with PV sched yield instead: the
//!   waiting sender hands its host CPU to a preempted target;
//! - `overcommit-pv`: every PV feature: a preempted target gets no IPI, the
//!   hv flushes its TLB before it runs again.
//!
//! Figures: the flush latency (the guest kernel's wait for
//! acknowledgements, per remote flush, and the zap system call as the
//! program sees it), flush IPIs sent and those sent to a vCPU marked
//! preempted (both counted by the guest kernel, from the preempted byte the
//! hv keeps), targets left to the hv, the hv's own count of IPIs that found
//! their target preempted, the flushes the hv did at entry, directed yields
//! and steal time. All in virtual time: the same command prints the same
//! numbers. What a preempted target costs comes from the host scheduler
//! model (`--host-slice`, default 3 ms: Linux's EEVDF slice on an 8-CPU
//! host), not from a tuned constant.

use super::{json_text, result_for, Bench, BenchError, Output, RunResult, RunSpec};
use crate::config::{ConfigError, Kernel};
use crate::plot::{self, Bar};
use crate::{BenchCommon, SwapDeviceArg, TlbflushBenchArgs};
use hv::VmConfig;
use serde_json::json;
use std::fmt::Write as _;

/// One run: shared host CPUs or not, which PV features the guest uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Row {
    name: &'static str,
    overcommit: bool,
    /// Guest boot options turning PV features off.
    options: &'static str,
}

const ROWS: [Row; 5] = [
    Row {
        name: "dedicated",
        overcommit: false,
        options: "",
    },
    Row {
        name: "overcommit-ipi",
        overcommit: true,
        options: "no-pv-tlb-flush no-pv-sched-yield no-pv-unhalt",
    },
    Row {
        name: "overcommit-ipi-unhalt",
        overcommit: true,
        options: "no-pv-tlb-flush no-pv-sched-yield",
    },
    Row {
        name: "overcommit-ipi-yield",
        overcommit: true,
        options: "no-pv-tlb-flush no-pv-unhalt",
    },
    Row {
        name: "overcommit-pv",
        overcommit: true,
        options: "",
    },
];

pub struct TlbflushBench {
    args: TlbflushBenchArgs,
    base: VmConfig,
}

/// One run's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub name: &'static str,
    /// Remote flushes (shootdowns) the guest kernel did.
    pub flushes: u64,
    /// Mean and longest wait for acknowledgements, in microseconds.
    pub flush_us: f64,
    pub flush_max_us: f64,
    /// The zap system call as the program saw it (mean, microseconds).
    pub zap_us: f64,
    pub ipis: u64,
    pub ipis_to_preempted: u64,
    pub pv_skipped: u64,
    /// The hv's count of fixed IPIs (any vector) that found their target
    /// preempted.
    pub hv_ipis_preempted: u64,
    pub hv_pv_flushes: u64,
    pub yields: u64,
    pub yields_directed: u64,
    /// Halts waiting for acknowledgements (PV unhalt) and kicks sent.
    pub halts: u64,
    pub kicks: u64,
    pub steal_ms: f64,
    pub run_ms: f64,
    pub stale: u64,
}

/// The sum of `key` over the report lines (the guest reports one
/// `pv_cpu=` line per CPU).
fn sum(run: &RunResult, key: &str) -> u64 {
    run.reports
        .iter()
        .flat_map(|line| line.split_whitespace())
        .filter_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse::<u64>().ok())
        .sum()
}

/// The maximum of `key` over the report lines.
fn max(run: &RunResult, key: &str) -> u64 {
    run.reports
        .iter()
        .flat_map(|line| line.split_whitespace())
        .filter_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse::<u64>().ok())
        .max()
        .unwrap_or(0)
}

fn cycles_to_us(cycles: f64) -> f64 {
    cycles * 1e6 / hv::CYCLES_PER_SECOND as f64
}

impl Measured {
    pub fn from_run(name: &'static str, run: &RunResult) -> Result<Measured, BenchError> {
        let zaps = run.require("tlbflush_zaps")?;
        let flushes = sum(run, "tlb_shootdowns");
        Ok(Measured {
            name,
            flushes,
            flush_us: cycles_to_us(sum(run, "tlb_flush_cycles") as f64 / flushes.max(1) as f64),
            flush_max_us: cycles_to_us(max(run, "tlb_flush_max_cycles") as f64),
            zap_us: run.require("tlbflush_zap_ns")? as f64 / zaps.max(1) as f64 / 1000.0,
            ipis: sum(run, "tlb_ipis"),
            ipis_to_preempted: sum(run, "tlb_ipis_preempted"),
            pv_skipped: sum(run, "tlb_pv_skipped"),
            hv_ipis_preempted: run.steal.ipis_received_preempted,
            hv_pv_flushes: run.steal.pv_tlb_flushes,
            yields: sum(run, "pv_yields"),
            yields_directed: run.steal.sched_yields_directed,
            halts: sum(run, "tlb_halts"),
            kicks: sum(run, "pv_kicks"),
            steal_ms: hv::Cycles(run.steal.steal_cycles).as_ns() as f64 / 1e6,
            run_ms: run.virtual_seconds() * 1e3,
            stale: run.require("tlbflush_stale_local")? + run.require("tlbflush_stale_remote")?,
        })
    }
}

impl Bench for TlbflushBench {
    const NAME: &'static str = "tlbflush";
    type Params = TlbflushBenchArgs;

    fn new(args: TlbflushBenchArgs) -> TlbflushBench {
        let mut base = VmConfig {
            mem_size: 64 << 20,
            ..VmConfig::default()
        };
        args.common.overcommit(SwapDeviceArg::Nvme).apply(&mut base);
        TlbflushBench { args, base }
    }

    fn params(&self) -> &TlbflushBenchArgs {
        &self.args
    }

    fn common(&self) -> &BenchCommon {
        &self.args.common
    }

    fn check(&self, kernel: &Kernel) -> Result<(), ConfigError> {
        if self.args.host_cpus >= self.args.vcpus {
            return Err(ConfigError::Invalid(format!(
                "--host-cpus {} must be below --vcpus {} (the overcommitted runs need preempted vCPUs)",
                self.args.host_cpus, self.args.vcpus
            )));
        }
        kernel.check_memory(self.base.mem_size, None)?;
        kernel.check_program("tlbflush")
    }

    fn specs(&self) -> Vec<RunSpec> {
        ROWS.iter()
            .map(|row| RunSpec::new(row.name.to_string(), self.config(row)))
            .collect()
    }

    fn render(&self, results: &[RunResult], output: &Output) -> Result<String, BenchError> {
        let rows = ROWS
            .iter()
            .map(|row| {
                let run = result_for(results, row.name)?;
                Measured::from_run(row.name, run)
            })
            .collect::<Result<Vec<_>, BenchError>>()?;
        let plot_path = output.plot_path("bench-tlbflush.svg");
        let bars: Vec<Bar> = rows
            .iter()
            .map(|m| Bar {
                label: m.name.to_string(),
                value: m.flush_us,
                reference: None,
                note: format!("{} IPIs to preempted", m.ipis_to_preempted),
            })
            .collect();
        output.write_plot(&plot_path, |path| {
            plot::bars(
                path,
                "Remote TLB flush latency with preempted vCPUs",
                &self.describe(),
                "mean wait per remote flush (us)",
                "",
                &bars,
            )
        })?;
        if output.json {
            let results: Vec<serde_json::Value> = rows
                .iter()
                .map(|m| {
                    json!({
                        "config": m.name,
                        "flushes": m.flushes,
                        "flush_latency_us": m.flush_us,
                        "flush_latency_max_us": m.flush_max_us,
                        "zap_us": m.zap_us,
                        "ipis_sent": m.ipis,
                        "ipis_to_preempted": m.ipis_to_preempted,
                        "pv_skipped": m.pv_skipped,
                        "hv_ipis_preempted": m.hv_ipis_preempted,
                        "hv_pv_tlb_flushes": m.hv_pv_flushes,
                        "yields": m.yields,
                        "yields_directed": m.yields_directed,
                        "halts": m.halts,
                        "kicks": m.kicks,
                        "steal_ms": m.steal_ms,
                        "run_ms": m.run_ms,
                        "stale_reads": m.stale,
                    })
                })
                .collect();
            let out = json!({
                "benchmark": "tlbflush",
                "config": {
                    "vcpus": self.args.vcpus,
                    "host_cpus": self.args.host_cpus,
                    "host_slice_us": self.host_slice_cycles() as f64 * 1e6 / hv::CYCLES_PER_SECOND as f64,
                    "rounds": self.args.rounds,
                    "work": self.args.work,
                    "seed": self.args.common.seed,
                },
                "results": results,
                "plot": output.plot_json(&plot_path),
            });
            return Ok(json_text(&out));
        }
        let mut s = String::new();
        let _ = writeln!(s, "bench tlbflush: {}", self.describe());
        let _ = writeln!(
            s,
            "{:<21} {:>7} {:>10} {:>10} {:>9} {:>6} {:>10} {:>8} {:>10} {:>8} {:>7} {:>6} {:>9} {:>8}",
            "",
            "flushes",
            "flush us",
            "max us",
            "zap us",
            "IPIs",
            "to preempt",
            "PV skip",
            "hv preempt",
            "hv flush",
            "yields",
            "kicks",
            "steal ms",
            "run ms"
        );
        for m in &rows {
            let _ = writeln!(
                s,
                "{:<21} {:>7} {:>10.2} {:>10.2} {:>9.2} {:>6} {:>10} {:>8} {:>10} {:>8} {:>7} {:>6} {:>9.3} {:>8.3}",
                m.name,
                m.flushes,
                m.flush_us,
                m.flush_max_us,
                m.zap_us,
                m.ipis,
                m.ipis_to_preempted,
                m.pv_skipped,
                m.hv_ipis_preempted,
                m.hv_pv_flushes,
                m.yields_directed,
                m.kicks,
                m.steal_ms,
                m.run_ms
            );
        }
        let _ = writeln!(
            s,
            "flush us: the kernel's wait for acknowledgements per remote flush; zap us: the system call as the program sees it; \
             to preempt: flush IPIs sent to a vCPU marked preempted; PV skip: targets left to the hv; \
             hv preempt: IPIs (any vector) that found their target preempted; hv flush: TLB flushes the hv did at entry; \
             yields: directed yields that handed over a host CPU; kicks: KVM_HC_KICK_CPU waking a sender halted in its wait"
        );
        let _ = writeln!(s, "plot: {}", plot_path.display());
        Ok(s)
    }
}

impl TlbflushBench {
    fn host_slice_cycles(&self) -> u64 {
        self.args
            .host_slice
            .map_or(hv::DEFAULT_HOST_SLICE, crate::units::duration_to_cycles)
    }

    fn config(&self, row: &Row) -> VmConfig {
        let mut config = self.base.clone();
        config.vcpus = self.args.vcpus;
        config.seed = self.args.common.seed;
        config.host_cpus = row.overcommit.then_some(self.args.host_cpus);
        config.host_slice = self.host_slice_cycles();
        config.cmdline = format!(
            "seed={} {} -- tlbflush -t {} -r {} -w {}",
            self.args.common.seed, row.options, self.args.vcpus, self.args.rounds, self.args.work
        );
        config
    }

    fn describe(&self) -> String {
        format!(
            "tlbflush -t {v} -r {} -w {} ({v} vCPUs; overcommitted: {} host CPUs, {:.2} ms slices)",
            self.args.rounds,
            self.args.work,
            self.args.host_cpus,
            self.host_slice_cycles() as f64 * 1e3 / hv::CYCLES_PER_SECOND as f64,
            v = self.args.vcpus,
        )
    }
}
