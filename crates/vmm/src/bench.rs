//! `faultline bench ...`: the seed experiments, each a set of VM runs
//! compared side by side in one invocation.
//!
//! Every figure comes from the guest's own HC_REPORT lines and the hv's
//! counters, all in virtual time, so the same command prints the same
//! numbers; runs go in parallel (one host thread each, `--jobs`), which
//! changes only the wall time.

use crate::plot;
use hv::apf::ApfMode;
use hv::stats::VmStats;
use hv::{RunStatus, StopReason, Vm, VmConfig};
use serde_json::json;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One VM run of a benchmark.
pub struct RunSpec {
    pub label: String,
    pub config: VmConfig,
}

/// What a run produced.
pub struct RunOutcome {
    pub label: String,
    pub stats: VmStats,
    /// HC_REPORT lines.
    pub reports: Vec<String>,
    pub wall: Duration,
}

impl RunOutcome {
    /// `key=value` from the report lines.
    pub fn value(&self, key: &str) -> Option<u64> {
        self.reports.iter().find_map(|line| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        })
    }

    /// Like `value`, or an error naming the run.
    pub fn require(&self, key: &str) -> Result<u64, String> {
        self.value(key).ok_or_else(|| {
            format!(
                "run `{}` reported no {key} (reports: {:?})",
                self.label, self.reports
            )
        })
    }
}

/// Virtual time run between progress updates.
const SLICE: u64 = 30_000_000;

/// Runs every spec, `jobs` at a time, showing progress on a terminal.
/// Results come back in spec order.
pub fn run_all(specs: Vec<RunSpec>, kernel: &[u8], jobs: usize) -> Result<Vec<RunOutcome>, String> {
    let total = specs.len();
    let queue = Mutex::new(specs.into_iter().enumerate().collect::<Vec<_>>());
    let results: Mutex<Vec<Option<Result<RunOutcome, String>>>> =
        Mutex::new((0..total).map(|_| None).collect());
    let done = AtomicU64::new(0);
    let progress = std::io::stderr().is_terminal();
    let status: Mutex<Vec<String>> = Mutex::new(vec![String::new(); total]);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1).min(total.max(1)) {
            scope.spawn(|| loop {
                let next = {
                    let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
                    if q.is_empty() {
                        None
                    } else {
                        Some(q.remove(0))
                    }
                };
                let Some((i, spec)) = next else { break };
                let label = spec.label.clone();
                let outcome = run_one(spec, kernel, |secs| {
                    if progress {
                        let mut st = status.lock().unwrap_or_else(|e| e.into_inner());
                        st[i] = format!("{label} {secs:.2}s");
                        let active: Vec<&String> = st.iter().filter(|s| !s.is_empty()).collect();
                        eprint!(
                            "\r\x1b[K[bench {}/{} done, {:.0}s] {}",
                            done.load(Ordering::Relaxed),
                            total,
                            started.elapsed().as_secs_f64(),
                            active
                                .iter()
                                .map(|s| s.as_str())
                                .collect::<Vec<_>>()
                                .join(" | ")
                        );
                    }
                });
                done.fetch_add(1, Ordering::Relaxed);
                status.lock().unwrap_or_else(|e| e.into_inner())[i].clear();
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(outcome);
            });
        }
    });
    if progress {
        eprint!("\r\x1b[K");
    }
    // Host-side figures vary run to run, so they stay off stdout.
    let results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    let walls: Vec<String> = results
        .iter()
        .flatten()
        .flatten()
        .map(|o| format!("{} {:.1}s", o.label, o.wall.as_secs_f64()))
        .collect();
    eprintln!(
        "faultline bench: {} runs in {:.1}s wall ({})",
        total,
        started.elapsed().as_secs_f64(),
        walls.join(", ")
    );
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err("a run did not finish".into())))
        .collect()
}

fn run_one(
    spec: RunSpec,
    kernel: &[u8],
    mut progress: impl FnMut(f64),
) -> Result<RunOutcome, String> {
    let started = Instant::now();
    let mut vm =
        Vm::boot(&spec.config, kernel).map_err(|e| format!("{}: cannot boot: {e}", spec.label))?;
    let mut serial = Vec::new();
    let reason = loop {
        let status = vm.run_until(vm.time().saturating_add(SLICE));
        serial.extend(vm.take_serial());
        if let RunStatus::Stopped(reason) = status {
            break reason;
        }
        progress(vm.time() as f64 / machine::cost::CYCLES_PER_SECOND as f64);
    };
    let tail = || {
        let text = String::from_utf8_lossy(&serial);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    };
    match reason {
        StopReason::Shutdown { status: 0 } | StopReason::DebugExit { status: 1 } => {}
        StopReason::Error(e) => {
            return Err(format!(
                "{}: the VM stopped: {e}\nguest output ends with:\n{}",
                spec.label,
                tail()
            ))
        }
        other => {
            return Err(format!(
                "{}: the guest program failed ({other:?})\nguest output ends with:\n{}",
                spec.label,
                tail()
            ))
        }
    }
    Ok(RunOutcome {
        label: spec.label,
        stats: vm.stats(),
        reports: vm.reports().iter().map(|r| r.line.clone()).collect(),
        wall: started.elapsed(),
    })
}

fn mib(bytes: u64) -> u64 {
    bytes >> 20
}

fn secs(cycles: u64) -> f64 {
    cycles as f64 / machine::cost::CYCLES_PER_SECOND as f64
}

/// Counters shown for each run.
fn run_counters(o: &RunOutcome) -> serde_json::Value {
    let apf = o.stats.apf();
    json!({
        "virtual_seconds": secs(o.stats.virtual_cycles),
        "instructions": o.stats.instructions(),
        "swap_ins": o.stats.pager.swap_ins,
        "swap_outs": o.stats.pager.swap_outs,
        "evictions": o.stats.pager.evictions,
        "not_present_sent": apf.not_present,
        "ready_sent": apf.ready,
        "apf_halts": apf.halts,
        "apf_halt_cycles": apf.halt_cycles,
        "stalls": apf.stalls,
        "stall_cycles": apf.stall_cycles,
        "peak_outstanding": apf.peak_outstanding,
    })
}

// ---------------------------------------------------------------------------
// bench apf: seed 000

/// Parameters of `bench apf`.
pub struct ApfBench {
    pub vcpus: u32,
    pub host_mem: u64,
    pub mem: u64,
    pub array: u64,
    pub duration: String,
    pub seed: u64,
    pub fault_threads: u32,
    pub work_threads: u32,
    pub base: VmConfig,
    pub json: bool,
    pub plot: std::path::PathBuf,
    pub jobs: usize,
    pub sweep: Option<Vec<u64>>,
}

/// The seed's ratios (total work against master).
pub const SEED_000_PV: f64 = 1.91;
pub const SEED_000_NONPV: f64 = 1.13;

impl ApfBench {
    fn bm_config(&self, apf: ApfMode, host_mem: Option<u64>) -> VmConfig {
        let mut config = self.base.clone();
        config.vcpus = self.vcpus;
        config.mem_size = self.mem;
        config.host_mem = host_mem;
        config.apf = apf;
        config.seed = self.seed;
        config.cmdline = format!(
            "seed={} -- bm -f {} -w {} -m {}M -t {} -s {}",
            self.seed,
            self.fault_threads,
            self.work_threads,
            mib(self.array),
            self.duration,
            self.seed
        );
        config
    }

    fn describe(&self) -> String {
        format!(
            "bm -f {} -w {} -m {}M -t {}, {} vCPUs, guest {} MiB, host {} MiB, swap {}",
            self.fault_threads,
            self.work_threads,
            mib(self.array),
            self.duration,
            self.vcpus,
            mib(self.mem),
            mib(self.host_mem),
            self.base.swap_device.name
        )
    }

    pub fn run(&self, kernel: &[u8]) -> Result<String, String> {
        if let Some(latencies) = &self.sweep {
            return self.run_sweep(kernel, latencies);
        }
        let modes = [ApfMode::Off, ApfMode::Halt, ApfMode::Pv];
        let mut specs: Vec<RunSpec> = modes
            .iter()
            .map(|&m| RunSpec {
                label: m.name().to_string(),
                config: self.bm_config(m, Some(self.host_mem)),
            })
            .collect();
        specs.push(RunSpec {
            label: "ideal".into(),
            config: self.bm_config(ApfMode::Pv, None),
        });
        let outcomes = run_all(specs, kernel, self.jobs)?;
        let totals: Vec<u64> = outcomes
            .iter()
            .map(|o| o.require("bm_total"))
            .collect::<Result<_, _>>()?;
        let off = totals[0].max(1) as f64;
        let ratio = |t: u64| t as f64 / off;
        let pv_over_ideal = totals[2] as f64 / totals[3].max(1) as f64;
        let seed_ratio = |label: &str| match label {
            "off" => Some(1.0),
            "halt" => Some(SEED_000_NONPV),
            "pv" => Some(SEED_000_PV),
            _ => None,
        };
        let bars: Vec<(String, f64, String)> = outcomes
            .iter()
            .zip(&totals)
            .map(|(o, &t)| {
                let note = match seed_ratio(&o.label) {
                    Some(s) => format!("{:.2}x (seed {s:.2}x)", ratio(t)),
                    None => format!("{:.2}x, array fits", ratio(t)),
                };
                (o.label.clone(), t as f64, note)
            })
            .collect();
        let svg = plot::bars(
            &format!("seed 000: total work, {}", self.describe()),
            "total work (bm_total)",
            &bars,
        );
        std::fs::write(&self.plot, svg)
            .map_err(|e| format!("cannot write the plot {}: {e}", self.plot.display()))?;

        if self.json {
            let mut modes = serde_json::Map::new();
            for (o, &t) in outcomes.iter().zip(&totals) {
                let mut v = run_counters(o);
                v["total"] = json!(t);
                v["ratio_vs_off"] = json!(ratio(t));
                if let Some(s) = seed_ratio(&o.label) {
                    v["seed_ratio_vs_off"] = json!(s);
                }
                modes.insert(o.label.clone(), v);
            }
            let out = json!({
                "benchmark": "apf",
                "config": {
                    "vcpus": self.vcpus, "guest_mem": self.mem, "host_mem": self.host_mem,
                    "array": self.array, "duration": self.duration, "seed": self.seed,
                    "swap_device": self.base.swap_device.name,
                    "fault_threads": self.fault_threads, "work_threads": self.work_threads,
                },
                "modes": modes,
                "ratios": {
                    "halt_over_off": ratio(totals[1]),
                    "pv_over_off": ratio(totals[2]),
                    "pv_over_ideal": pv_over_ideal,
                },
                "seed": {"halt_over_off": SEED_000_NONPV, "pv_over_off": SEED_000_PV},
                "plot": self.plot.display().to_string(),
            });
            return Ok(format!(
                "{}\n",
                serde_json::to_string_pretty(&out).unwrap_or_default()
            ));
        }
        let mut s = String::new();
        use std::fmt::Write as _;
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
            let apf = o.stats.apf();
            let seed = seed_ratio(&o.label).map_or("-".to_string(), |r| format!("{r:.2}"));
            let _ = writeln!(
                s,
                "{:<6} {:>14} {:>7.2} {:>6} {:>9} {:>11} {:>9} {:>8} {:>10.3}",
                o.label,
                t,
                ratio(t),
                seed,
                o.stats.pager.swap_ins,
                apf.not_present,
                apf.halts,
                apf.stalls,
                secs(o.stats.virtual_cycles)
            );
        }
        let _ = writeln!(
            s,
            "pv/off {:.2} (seed {SEED_000_PV}), halt/off {:.2} (seed {SEED_000_NONPV}), pv/ideal {:.2} (ideal: the array fits in host memory)",
            ratio(totals[2]),
            ratio(totals[1]),
            pv_over_ideal
        );
        let _ = writeln!(s, "plot: {}", self.plot.display());
        Ok(s)
    }

    fn run_sweep(&self, kernel: &[u8], latencies: &[u64]) -> Result<String, String> {
        let mut specs = Vec::new();
        for &lat in latencies {
            for mode in [ApfMode::Off, ApfMode::Pv] {
                let mut config = self.bm_config(mode, Some(self.host_mem));
                config.swap_device.read_latency = hv::swap::LatencyRange::fixed(lat);
                config.swap_device.name = format!("{}+latency", self.base.swap_device.name);
                specs.push(RunSpec {
                    label: format!("{}@{}", mode.name(), hv::swap::device::format_duration(lat)),
                    config,
                });
            }
        }
        let outcomes = run_all(specs, kernel, self.jobs)?;
        let mut rows = Vec::new();
        for (i, &lat) in latencies.iter().enumerate() {
            let off = outcomes[2 * i].require("bm_total")?;
            let pv = outcomes[2 * i + 1].require("bm_total")?;
            rows.push((lat, off, pv, pv as f64 / off.max(1) as f64));
        }
        let points: Vec<(String, f64)> = rows
            .iter()
            .map(|r| (hv::swap::device::format_duration(r.0), r.3))
            .collect();
        let svg = plot::line(
            &format!(
                "seed 000: pv/off gain against swap latency ({})",
                self.describe()
            ),
            "swap read latency (fixed)",
            "pv / off total work",
            &points,
        );
        std::fs::write(&self.plot, svg)
            .map_err(|e| format!("cannot write the plot {}: {e}", self.plot.display()))?;
        if self.json {
            let sweep: Vec<serde_json::Value> = rows
                .iter()
                .map(|&(lat, off, pv, gain)| {
                    json!({"latency": hv::swap::device::format_duration(lat), "latency_cycles": lat,
                           "off": off, "pv": pv, "pv_over_off": gain})
                })
                .collect();
            let out = json!({"benchmark": "apf-sweep-latency", "sweep": sweep, "plot": self.plot.display().to_string()});
            return Ok(format!(
                "{}\n",
                serde_json::to_string_pretty(&out).unwrap_or_default()
            ));
        }
        let mut s = String::new();
        use std::fmt::Write as _;
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
        for &(lat, off, pv, gain) in &rows {
            let _ = writeln!(
                s,
                "{:>10} {:>14} {:>14} {:>7.2}",
                hv::swap::device::format_duration(lat),
                off,
                pv,
                gain
            );
        }
        let _ = writeln!(s, "plot: {}", self.plot.display());
        Ok(s)
    }
}

// ---------------------------------------------------------------------------
// bench apf-calc: seed 002

/// Parameters of `bench apf-calc`.
pub struct ApfCalcBench {
    pub host_mem: u64,
    pub mem: u64,
    pub array: u64,
    pub loops: u32,
    pub stride: u32,
    pub seed: u64,
    pub base: VmConfig,
    pub json: bool,
    pub jobs: usize,
}

/// The seed's changes in total time with APF on.
pub const SEED_002_WITH_CALC_PCT: f64 = -40.0;
pub const SEED_002_WITHOUT_CALC_PCT: f64 = 3.0;

impl ApfCalcBench {
    fn config(&self, apf: ApfMode, calc: bool) -> VmConfig {
        let mut config = self.base.clone();
        config.vcpus = 1;
        config.mem_size = self.mem;
        config.host_mem = Some(self.host_mem);
        config.apf = apf;
        config.seed = self.seed;
        config.cmdline = format!(
            "seed={} -- apfcalc -m {}M -l {} -s {}{}",
            self.seed,
            mib(self.array),
            self.loops,
            self.stride,
            if calc { " -c" } else { "" }
        );
        config
    }

    fn describe(&self) -> String {
        format!(
            "apfcalc -m {}M -l {} -s {} [-c], 1 vCPU, guest {} MiB, host {} MiB, swap {}",
            mib(self.array),
            self.loops,
            self.stride,
            mib(self.mem),
            mib(self.host_mem),
            self.base.swap_device.name
        )
    }

    pub fn run(&self, kernel: &[u8]) -> Result<String, String> {
        let mut specs = Vec::new();
        for calc in [true, false] {
            for mode in [ApfMode::Off, ApfMode::Pv] {
                specs.push(RunSpec {
                    label: format!(
                        "{}{}",
                        if calc { "calc+" } else { "" },
                        if mode == ApfMode::Off { "off" } else { "on" }
                    ),
                    config: self.config(mode, calc),
                });
            }
        }
        let outcomes = run_all(specs, kernel, self.jobs)?;
        let ns: Vec<u64> = outcomes
            .iter()
            .map(|o| o.require("apfcalc_ns"))
            .collect::<Result<_, _>>()?;
        let calc: Vec<u64> = outcomes
            .iter()
            .map(|o| o.value("apfcalc_calc").unwrap_or(0))
            .collect();
        let change = |off: u64, on: u64| (on as f64 - off as f64) / off.max(1) as f64 * 100.0;
        let with = change(ns[0], ns[1]);
        let without = change(ns[2], ns[3]);
        if self.json {
            let run = |i: usize| run_counters(&outcomes[i]);
            let out = json!({
                "benchmark": "apf-calc",
                "config": {"guest_mem": self.mem, "host_mem": self.host_mem, "array": self.array,
                           "loops": self.loops, "stride": self.stride, "seed": self.seed,
                           "swap_device": self.base.swap_device.name},
                "with_calc": {"off_s": ns[0] as f64 / 1e9, "on_s": ns[1] as f64 / 1e9, "change_pct": with,
                              "calc_off": calc[0], "calc_on": calc[1], "seed_change_pct": SEED_002_WITH_CALC_PCT,
                              "runs": {"off": run(0), "on": run(1)}},
                "without_calc": {"off_s": ns[2] as f64 / 1e9, "on_s": ns[3] as f64 / 1e9, "change_pct": without,
                                 "seed_change_pct": SEED_002_WITHOUT_CALC_PCT,
                                 "runs": {"off": run(2), "on": run(3)}},
            });
            return Ok(format!(
                "{}\n",
                serde_json::to_string_pretty(&out).unwrap_or_default()
            ));
        }
        let mut s = String::new();
        use std::fmt::Write as _;
        let _ = writeln!(s, "bench apf-calc (seed 002): {}", self.describe());
        let _ = writeln!(
            s,
            "{:<14} {:>10} {:>10} {:>8} {:>6} {:>13} {:>13}",
            "", "APF off", "APF on", "change", "seed", "calc (off)", "calc (on)"
        );
        let _ = writeln!(
            s,
            "{:<14} {:>9.3}s {:>9.3}s {:>+7.1}% {:>+5.0}% {:>13} {:>13}",
            "with calc",
            ns[0] as f64 / 1e9,
            ns[1] as f64 / 1e9,
            with,
            SEED_002_WITH_CALC_PCT,
            calc[0],
            calc[1]
        );
        let _ = writeln!(
            s,
            "{:<14} {:>9.3}s {:>9.3}s {:>+7.1}% {:>+5.0}%",
            "without calc",
            ns[2] as f64 / 1e9,
            ns[3] as f64 / 1e9,
            without,
            SEED_002_WITHOUT_CALC_PCT
        );
        let apf = outcomes[1].stats.apf();
        let _ = writeln!(
            s,
            "(times: the writer's elapsed virtual time; with calc, APF on: {} not-present, {} ready, {} swap-ins)",
            apf.not_present, apf.ready, outcomes[1].stats.pager.swap_ins
        );
        Ok(s)
    }
}
