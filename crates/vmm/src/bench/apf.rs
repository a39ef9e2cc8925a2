//! `bench apf`: seed 000 (`bm` with APF off, halt and pv, and the ideal),
//! or with `--sweep-latency` the pv/off gain against the swap latency.
//! `--guest linux` runs the seed's own bm (pthreads, `guest/linux/bm.c`)
//! in Debian's kernel: Linux's scheduler and Linux's async-PF code.

use super::seeds::Comparison;
use super::{
    json_text, mib, result_for, Bench, BenchError, BenchGuest, Output, RunResult, RunSpec,
};
use crate::config::{ConfigError, Kernel};
use crate::signals::StopRequest;
use crate::units::{duration_to_cycles, format_duration, format_seconds, format_size};
use crate::{plot, ApfBenchArgs, BenchCommon, SwapDeviceArg};
use hv::apf::ApfMode;
use hv::VmConfig;
use serde_json::json;
use std::fmt::Write as _;
use std::time::Duration;

/// What bm in Linux needs beyond its array, of what Linux reports
/// available (MemAvailable) before it starts: measured with Debian's
/// 6.1.0-57 on 1 vCPU and 128 MiB (68 MiB available), `bm -f 4 -w 4 -m
/// 60M` runs and `-m 62M` is OOM-killed, so bm's threads, stacks, page
/// tables and Linux's reserves take 6 to 8 MiB; twice that, for kernels
/// to come.
pub const LINUX_HEADROOM: u64 = 16 << 20;

/// What fits of a program's array in what Linux leaves to programs
/// (`bench apf`'s bm, `bench apf-calc`'s writer): MemAvailable, read by
/// one boot of `hello` at the bench's guest size, less
/// [`LINUX_HEADROOM`].
pub(super) struct LinuxFit {
    /// MemAvailable, bytes.
    pub available: u64,
    /// Guest memory, bytes.
    pub guest_mem: u64,
    /// Who needs what, for the figures: "bm needs its array".
    pub needs: &'static str,
}

impl LinuxFit {
    /// The largest array that fits, in whole MiB.
    fn fits(&self) -> u64 {
        self.available.saturating_sub(LINUX_HEADROOM) & !((1 << 20) - 1)
    }

    /// The figures behind a refusal or a shrunk default.
    pub fn figures(&self) -> String {
        format!(
            "Linux reports {} MiB available to programs (MemAvailable) in a guest of {} MiB; \
             {} and {} MiB more",
            self.available >> 20,
            mib(self.guest_mem),
            self.needs,
            mib(LINUX_HEADROOM)
        )
    }

    /// A `requested` --array that fits, or the `default` shrunk to fit;
    /// a requested one that does not fit is refused with the figures.
    pub fn size(&self, requested: Option<u64>, default: u64) -> Result<u64, ConfigError> {
        match requested {
            Some(array) if array > self.fits() => Err(ConfigError::Invalid(format!(
                "--array {}: does not fit: {}; give a larger --mem or a smaller --array",
                format_size(array),
                self.figures()
            ))),
            Some(array) => Ok(array),
            None => Ok(default.min(self.fits())),
        }
    }

    /// Refuses an array that fits only within host memory (nothing would
    /// swap).
    pub fn must_swap(&self, array: u64, host_mem: u64) -> Result<(), ConfigError> {
        if array <= host_mem {
            return Err(ConfigError::Invalid(format!(
                "the array that fits ({}) is no larger than --host-mem {}: nothing would swap; {}; \
                 give a larger --mem",
                format_size(array),
                format_size(host_mem),
                self.figures()
            )));
        }
        Ok(())
    }
}

/// The seed's ratios (total work against master).
pub const SEED_000_PV: f64 = 1.91;
pub const SEED_000_NONPV: f64 = 1.13;

pub struct ApfBench {
    args: ApfBenchArgs,
    mem: u64,
    array: u64,
    base: VmConfig,
    guest: BenchGuest,
    /// `--guest linux`: MemAvailable in the guest before bm starts.
    available: Option<u64>,
}

/// The seed's ratio against `off` for a run label.
fn seed_ratio(label: &str) -> Option<f64> {
    match label {
        "off" => Some(1.0),
        "halt" => Some(SEED_000_NONPV),
        "pv" => Some(SEED_000_PV),
        _ => None,
    }
}

impl Bench for ApfBench {
    const NAME: &'static str = "apf";
    type Params = ApfBenchArgs;

    fn new(args: ApfBenchArgs) -> ApfBench {
        let mem = args.mem.unwrap_or(args.host_mem.saturating_mul(4));
        let array = args.array.unwrap_or(args.host_mem.saturating_mul(2));
        let mut base = VmConfig::default();
        args.common.overcommit(SwapDeviceArg::Hdd).apply(&mut base);
        let guest = BenchGuest::new(&args.guest);
        ApfBench {
            args,
            mem,
            array,
            base,
            guest,
            available: None,
        }
    }

    fn params(&self) -> &ApfBenchArgs {
        &self.args
    }

    fn common(&self) -> &BenchCommon {
        &self.args.common
    }

    fn check(&self, kernel: &Kernel) -> Result<(), ConfigError> {
        self.guest
            .check(kernel, "bm", self.mem, Some(self.args.host_mem))
            .map_err(|e| match (e, self.args.mem) {
                // The user gave no --mem: say where guest memory came from.
                (ConfigError::MemSize { mem, min, .. }, None) => ConfigError::Invalid(format!(
                    "--host-mem {}: guest memory, 4x host memory unless --mem is given, would be {}; \
                     it must be a multiple of 2 MiB, at least {}",
                    format_size(self.args.host_mem),
                    format_size(mem),
                    format_size(min)
                )),
                (e, _) => e,
            })?;
        if self.array >= self.mem {
            return Err(ConfigError::Invalid(format!(
                "the array ({} MiB) must be smaller than guest memory ({} MiB)",
                mib(self.array),
                mib(self.mem)
            )));
        }
        if self.array < 1 << 20 {
            return Err(ConfigError::Invalid(
                "the array must be at least 1 MiB (bm takes whole MiB)".into(),
            ));
        }
        Ok(())
    }

    /// `--guest linux`: bm's array must fit in what Linux leaves to
    /// programs, not in guest memory: one boot of `hello` at the bench's
    /// guest size reads MemAvailable, and the array is at most that less
    /// [`LINUX_HEADROOM`] (the default: 2x host memory as the seed, or
    /// less to fit; refused, with the figures, when what fits is no
    /// larger than host memory, or when a given --array does not fit).
    fn prepare(&mut self, kernel: &Kernel, stop: &StopRequest) -> Result<(), BenchError> {
        if !self.is_linux() {
            return Ok(());
        }
        let config = self.bm_config(ApfMode::Pv, None);
        let available = self.guest.probe_available(kernel, &config, stop)?;
        let fit = LinuxFit {
            available,
            guest_mem: self.mem,
            needs: "bm needs its array",
        };
        let array = fit.size(self.args.array, self.array)?;
        fit.must_swap(array, self.args.host_mem)?;
        if array != self.array {
            eprintln!(
                "faultline bench apf: {}: bm's array is {} (at most 2x --host-mem, and what fits)",
                fit.figures(),
                format_size(array)
            );
        }
        self.array = array;
        self.available = Some(available);
        Ok(())
    }

    fn specs(&self) -> Vec<RunSpec> {
        if let Some(latencies) = &self.args.sweep_latency {
            let mut specs = Vec::new();
            for &latency in latencies {
                for mode in [ApfMode::Off, ApfMode::Pv] {
                    let mut config = self.bm_config(mode, Some(self.args.host_mem));
                    config.swap_device.read_latency =
                        hv::swap::LatencyRange::fixed(duration_to_cycles(latency));
                    config.swap_device.name = format!("{}+latency", self.base.swap_device.name);
                    let label = format!("{}@{}", mode.name(), format_duration(latency));
                    specs.push(self.spec(label, config));
                }
            }
            return specs;
        }
        let mut specs: Vec<RunSpec> = [ApfMode::Off, ApfMode::Halt, ApfMode::Pv]
            .iter()
            .map(|&m| {
                self.spec(
                    m.name().to_string(),
                    self.bm_config(m, Some(self.args.host_mem)),
                )
            })
            .collect();
        specs.push(self.spec("ideal".into(), self.bm_config(ApfMode::Pv, None)));
        specs
    }

    fn render(&self, results: &[RunResult], output: &Output) -> Result<String, BenchError> {
        match &self.args.sweep_latency {
            Some(latencies) => self.render_sweep(latencies, results, output),
            None => self.render_modes(results, output),
        }
    }

    fn comparisons(&self, results: &[RunResult]) -> Result<Vec<Comparison>, BenchError> {
        if self.args.sweep_latency.is_some() {
            return Ok(Vec::new());
        }
        let total = |label: &str| -> Result<f64, BenchError> {
            Ok(result_for(results, label)?.require("bm_total")? as f64)
        };
        let off = total("off")?;
        let ideal_over_off = total("ideal")? / off;
        let cause = if ideal_over_off >= 1.0 {
            format!(
                "off loses {:.0} % of its work to swapping here (ideal / off {ideal_over_off:.2}, ideal: the array in host memory)",
                (1.0 - 1.0 / ideal_over_off) * 100.0
            )
        } else {
            // bm's timed part ends when its threads see `stop`; one
            // blocked on a page sees it late, so the part lasts longer
            // under paging and total work covers unequal stretches.
            let timed = |label: &str| -> Result<f64, BenchError> {
                Ok(result_for(results, label)?.require("bm_elapsed_ns")? as f64 / 1e9)
            };
            format!(
                "the timed parts differ: {:.3} s under off, {:.3} s in the ideal run (ideal / off {ideal_over_off:.2}), so total work compares unequal stretches",
                timed("off")?,
                timed("ideal")?
            )
        };
        let setup = self.describe();
        Ok(vec![
            Comparison::measured("000.apf.pv_over_off", &setup, total("pv")? / off)
                .because(cause.clone()),
            Comparison::measured("000.apf.halt_over_off", &setup, total("halt")? / off)
                .because(cause),
        ])
    }
}

impl ApfBench {
    /// A run of the bundled kernel, or of Linux with `--guest linux`.
    fn spec(&self, label: String, config: VmConfig) -> RunSpec {
        self.guest.spec(label, config)
    }

    fn is_linux(&self) -> bool {
        self.guest.is_linux()
    }

    fn bm_config(&self, apf: ApfMode, host_mem: Option<u64>) -> VmConfig {
        let a = &self.args;
        let mut config = self.base.clone();
        config.vcpus = a.vcpus;
        config.mem_size = self.mem;
        config.host_mem = host_mem;
        config.apf = apf;
        config.seed = a.common.seed;
        if self.is_linux() {
            config.cmdline = crate::linux::cmdline(crate::linux::DEFAULT_OPTIONS, &self.program());
            return config;
        }
        config.cmdline = format!("seed={} -- {}", a.common.seed, self.program().join(" "));
        config
    }

    /// bm's command line, exactly as the guest runs it (the seed's own bm
    /// in Linux takes no seed: random()'s default seed).
    fn program(&self) -> Vec<String> {
        let a = &self.args;
        let mut program: Vec<String> = vec![
            "bm".into(),
            "-f".into(),
            a.fault_threads.to_string(),
            "-w".into(),
            a.work_threads.to_string(),
            "-m".into(),
            format_size(self.array),
            "-t".into(),
            format_seconds(a.duration),
        ];
        if !self.is_linux() {
            program.extend(["-s".into(), a.common.seed.to_string()]);
        }
        program
    }

    fn describe(&self) -> String {
        let a = &self.args;
        format!(
            "{}{}, {} vCPUs, guest {} MiB, host {} MiB, swap {}",
            self.guest.describe_prefix(),
            self.program().join(" "),
            a.vcpus,
            mib(self.mem),
            mib(a.host_mem),
            self.base.swap_device.name
        )
    }

    fn render_modes(&self, outcomes: &[RunResult], output: &Output) -> Result<String, BenchError> {
        let totals: Vec<u64> = outcomes
            .iter()
            .map(|o| o.require("bm_total"))
            .collect::<Result<_, _>>()?;
        let off = totals[0].max(1) as f64;
        let ratio = |t: u64| t as f64 / off;
        let pv_over_ideal = totals[2] as f64 / totals[3].max(1) as f64;
        let bars: Vec<plot::Bar> = outcomes
            .iter()
            .zip(&totals)
            .map(|(o, &t)| plot::Bar {
                label: o.label.clone(),
                value: t as f64,
                reference: seed_ratio(&o.label).map(|s| s * off),
                note: match seed_ratio(&o.label) {
                    Some(s) => format!("{:.2}x (seed {s:.2}x)", ratio(t)),
                    None => format!("{:.2}x, array fits", ratio(t)),
                },
            })
            .collect();
        let plot_path = output.plot_path("bench-apf.svg");
        output.write_plot(&plot_path, |path| {
            plot::bars(
                path,
                "Seed 000: total work by async page fault mode",
                &self.describe(),
                "total work (bm_total)",
                "seed 000's ratio to off, times off's total",
                &bars,
            )
        })?;

        if output.json {
            let a = &self.args;
            let mut modes = serde_json::Map::new();
            for (o, &t) in outcomes.iter().zip(&totals) {
                let mut v = o.counters();
                v["total"] = json!(t);
                v["ratio_vs_off"] = json!(ratio(t));
                if let Some(s) = seed_ratio(&o.label) {
                    v["seed_ratio_vs_off"] = json!(s);
                }
                if self.is_linux() {
                    v["linux_hyp_interrupts"] = json!(o.value("linux_hyp_interrupts"));
                    v["bm_elapsed_ns"] = json!(o.value("bm_elapsed_ns"));
                }
                modes.insert(o.label.clone(), v);
            }
            let out = json!({
                "benchmark": "apf",
                "config": {
                    "guest": self.guest.name(),
                    "linux_version": self.guest.linux_version(),
                    "linux_mem_available": self.available,
                    "vcpus": a.vcpus, "guest_mem": self.mem, "host_mem": a.host_mem,
                    "array": self.array, "duration": format_seconds(a.duration), "seed": a.common.seed,
                    "swap_device": self.base.swap_device.name,
                    "fault_threads": a.fault_threads, "work_threads": a.work_threads,
                },
                "modes": modes,
                "ratios": {
                    "halt_over_off": ratio(totals[1]),
                    "pv_over_off": ratio(totals[2]),
                    "pv_over_ideal": pv_over_ideal,
                },
                "seed": {"halt_over_off": SEED_000_NONPV, "pv_over_off": SEED_000_PV},
                "plot": output.plot_json(&plot_path),
            });
            return Ok(json_text(&out));
        }
        let mut s = String::new();
        let _ = writeln!(s, "bench apf (seed 000): {}", self.describe());
        let _ = writeln!(
            s,
            "{:<6} {:>14} {:>7} {:>6} {:>9} {:>11} {:>9} {:>8} {:>10}",
            "mode",
            "total work",
            "vs off",
            "seed",
            "swap-ins",
            "not-present",
            "apf halts",
            "stalls",
            "virtual s"
        );
        for (o, &t) in outcomes.iter().zip(&totals) {
            let seed = seed_ratio(&o.label).map_or("-".to_string(), |r| format!("{r:.2}"));
            let _ = writeln!(
                s,
                "{:<6} {:>14} {:>7.2} {:>6} {:>9} {:>11} {:>9} {:>8} {:>10.3}",
                o.label,
                t,
                ratio(t),
                seed,
                o.swap_ins,
                o.apf.not_present,
                o.apf.halts,
                o.apf.stalls,
                o.virtual_seconds()
            );
        }
        let _ = writeln!(
            s,
            "pv/off {:.2} (seed {SEED_000_PV}), halt/off {:.2} (seed {SEED_000_NONPV}), pv/ideal {:.2} (ideal: the array fits in host memory)",
            ratio(totals[2]),
            ratio(totals[1]),
            pv_over_ideal
        );
        if self.is_linux() {
            super::render_async_pf_both_sides(&mut s, outcomes, "bm_elapsed_ns");
        }
        let _ = writeln!(s, "plot: {}", plot_path.display());
        Ok(s)
    }

    fn render_sweep(
        &self,
        latencies: &[Duration],
        outcomes: &[RunResult],
        output: &Output,
    ) -> Result<String, BenchError> {
        let mut rows = Vec::new();
        for (i, &latency) in latencies.iter().enumerate() {
            let off = outcomes[2 * i].require("bm_total")?;
            let pv = outcomes[2 * i + 1].require("bm_total")?;
            rows.push((latency, off, pv, pv as f64 / off.max(1) as f64));
        }
        let points: Vec<(f64, f64)> = rows.iter().map(|r| (r.0.as_secs_f64(), r.3)).collect();
        let plot_path = output.plot_path("bench-apf-sweep.svg");
        output.write_plot(&plot_path, |path| {
            plot::sweep(
                path,
                "Seed 000: pv/off gain against swap read latency",
                &self.describe(),
                "swap read latency (fixed, log scale)",
                "pv / off total work",
                &points,
                ("seed 000's pv/off", SEED_000_PV),
            )
        })?;
        if output.json {
            let sweep: Vec<serde_json::Value> = rows
                .iter()
                .map(|&(latency, off, pv, gain)| {
                    json!({"latency": format_duration(latency), "latency_cycles": duration_to_cycles(latency),
                           "off": off, "pv": pv, "pv_over_off": gain})
                })
                .collect();
            let out = json!({"benchmark": "apf-sweep-latency", "sweep": sweep,
                             "seed": {"pv_over_off": SEED_000_PV},
                             "plot": output.plot_json(&plot_path)});
            return Ok(json_text(&out));
        }
        let mut s = String::new();
        let _ = writeln!(
            s,
            "bench apf --sweep-latency (seed 000): {}",
            self.describe()
        );
        let _ = writeln!(
            s,
            "{:>10} {:>14} {:>14} {:>7}",
            "latency", "off total", "pv total", "pv/off"
        );
        for &(latency, off, pv, gain) in &rows {
            let _ = writeln!(
                s,
                "{:>10} {:>14} {:>14} {:>7.2}",
                format_duration(latency),
                off,
                pv,
                gain
            );
        }
        let _ = writeln!(s, "plot: {}", plot_path.display());
        Ok(s)
    }
}
