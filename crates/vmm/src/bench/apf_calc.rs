//! `bench apf-calc`: seed 002 (a memory-limited guest with and without a
//! calculation task, APF off and on). `--guest linux` runs the same loops
//! as a Linux program with pthreads (`guest/linux/apfcalc.c`): Linux's
//! scheduler and Linux's own async-PF code.

use super::apf::LinuxFit;
use super::seeds::{change_pct, Comparison};
use super::{
    json_text, mib, result_for, Bench, BenchError, BenchGuest, Output, RunResult, RunSpec,
};
use crate::config::{ConfigError, Kernel};
use crate::signals::StopRequest;
use crate::units::format_size;
use crate::{ApfCalcBenchArgs, BenchCommon, SwapDeviceArg};
use hv::apf::ApfMode;
use hv::VmConfig;
use serde_json::json;
use std::fmt::Write as _;

/// The seed's changes in total time with APF on.
pub const SEED_002_WITH_CALC_PCT: f64 = -40.0;
pub const SEED_002_WITHOUT_CALC_PCT: f64 = 3.0;

/// Host memory by default: the project's guest, and Linux (whose own
/// working set, the kernel and page cache, does not fit in 16 MiB).
const DEFAULT_HOST_MEM: u64 = 16 << 20;
const DEFAULT_HOST_MEM_LINUX: u64 = 48 << 20;

pub struct ApfCalcBench {
    args: ApfCalcBenchArgs,
    host_mem: u64,
    mem: u64,
    array: u64,
    base: VmConfig,
    guest: BenchGuest,
}

impl Bench for ApfCalcBench {
    const NAME: &'static str = "apf-calc";
    type Params = ApfCalcBenchArgs;

    fn new(args: ApfCalcBenchArgs) -> ApfCalcBench {
        let guest = BenchGuest::new(&args.guest);
        let host_mem = args.host_mem.unwrap_or(if guest.is_linux() {
            DEFAULT_HOST_MEM_LINUX
        } else {
            DEFAULT_HOST_MEM
        });
        // Linux keeps about 55 MiB of guest memory for itself (its kernel,
        // the unpacked initramfs, init): 8/3 of host memory for the guest
        // and 4/3 for the writer (128 and 64 MiB by default) leave it that
        // and still put the writer beyond host memory, as the seed's
        // writer of "all the available memory" was.
        let linux = guest.is_linux();
        let mem = args.mem.unwrap_or(if linux {
            host_mem / 3 * 8
        } else {
            host_mem.saturating_mul(2)
        });
        let array = args.array.unwrap_or(if linux {
            host_mem / 3 * 4
        } else {
            host_mem / 4 * 5
        });
        let mut base = VmConfig::default();
        args.common.overcommit(SwapDeviceArg::Ssd).apply(&mut base);
        ApfCalcBench {
            args,
            host_mem,
            mem,
            array,
            base,
            guest,
        }
    }

    fn params(&self) -> &ApfCalcBenchArgs {
        &self.args
    }

    fn common(&self) -> &BenchCommon {
        &self.args.common
    }

    fn check(&self, kernel: &Kernel) -> Result<(), ConfigError> {
        self.guest
            .check(kernel, "apfcalc", self.mem, Some(self.host_mem))?;
        if self.array < 1 << 20 || self.array >= self.mem {
            return Err(ConfigError::Invalid(format!(
                "the writer's memory ({} MiB) must be at least 1 MiB and smaller than guest memory ({} MiB)",
                mib(self.array),
                mib(self.mem)
            )));
        }
        Ok(())
    }

    /// `--guest linux`: the writer must fit in what Linux leaves to
    /// programs, not in guest memory (as bm in `bench apf`): one boot of
    /// `hello` at the bench's guest size reads MemAvailable, and the
    /// writer is at most that less [`super::apf::LINUX_HEADROOM`]
    /// (apfcalc, like bm, is a few threads beside its array). The default
    /// shrinks to fit; a given --array that does not fit is refused, and
    /// so is a writer that fits only within host memory (nothing would
    /// swap), each with the figures, before the four runs.
    fn prepare(&mut self, kernel: &Kernel, stop: &StopRequest) -> Result<(), BenchError> {
        if !self.guest.is_linux() {
            return Ok(());
        }
        let config = self.config(ApfMode::Pv, true);
        let available = self.guest.probe_available(kernel, &config, stop)?;
        let fit = LinuxFit {
            available,
            guest_mem: self.mem,
            needs: "apfcalc needs its writer's memory",
        };
        let array = fit.size(self.args.array, self.array)?;
        if self.args.array.is_none() {
            fit.must_swap(array, self.host_mem)?;
        }
        if array != self.array {
            eprintln!(
                "faultline bench apf-calc: {}: the writer's memory is {} (at most 4/3 of --host-mem, and what fits)",
                fit.figures(),
                format_size(array)
            );
        }
        self.array = array;
        Ok(())
    }

    fn specs(&self) -> Vec<RunSpec> {
        let mut specs = Vec::new();
        for calc in [true, false] {
            for mode in [ApfMode::Off, ApfMode::Pv] {
                specs.push(self.guest.spec(
                    format!(
                        "{}{}",
                        if calc { "calc+" } else { "" },
                        if mode == ApfMode::Off { "off" } else { "on" }
                    ),
                    self.config(mode, calc),
                ));
            }
        }
        specs
    }

    fn comparisons(&self, outcomes: &[RunResult]) -> Result<Vec<Comparison>, BenchError> {
        let ns = |label: &str| -> Result<f64, BenchError> {
            Ok(result_for(outcomes, label)?.require("apfcalc_ns")? as f64)
        };
        let setup = self.describe();
        let seconds = |cycles: u64| cycles as f64 / hv::CYCLES_PER_SECOND as f64;
        // With the calculation: what APF on can give it is the time the
        // vCPU sits stalled on page-ins with APF off.
        let calc_off = result_for(outcomes, "calc+off")?;
        let stalled = seconds(calc_off.apf.stall_cycles);
        let run = seconds(calc_off.virtual_cycles);
        let with_cause = format!(
            "with APF off the vCPU sits stalled on page-ins for {:.0} % of the run ({stalled:.3} of {run:.3} s), time APF on gives to the calculation",
            stalled / run.max(f64::MIN_POSITIVE) * 100.0
        );
        // Without it: APF on only adds its own work to each swap-in.
        let on = result_for(outcomes, "on")?;
        let added_ns = ns("on")? - ns("off")?;
        let without_cause = format!(
            "APF on changes the writer's time by {:+.0} ns per swap-in ({:+.3} ms over {} swap-ins, {} not-present events)",
            added_ns / on.swap_ins.max(1) as f64,
            added_ns / 1e6,
            on.swap_ins,
            on.apf.not_present
        );
        Ok(vec![
            Comparison::measured(
                "002.apf_calc.with_calc",
                &setup,
                change_pct(ns("calc+off")?, ns("calc+on")?),
            )
            .because(with_cause),
            Comparison::measured(
                "002.apf_calc.without_calc",
                &setup,
                change_pct(ns("off")?, ns("on")?),
            )
            .because(without_cause),
        ])
    }

    fn render(&self, outcomes: &[RunResult], output: &Output) -> Result<String, BenchError> {
        let a = &self.args;
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
        if output.json {
            let run = |i: usize| outcomes[i].counters();
            let out = json!({
                "benchmark": "apf-calc",
                "config": {"guest": self.guest.name(), "linux_version": self.guest.linux_version(), "guest_mem": self.mem, "host_mem": self.host_mem, "array": self.array,
                           "loops": a.loops, "stride": a.stride, "seed": a.common.seed,
                           "swap_device": self.base.swap_device.name},
                "with_calc": {"off_s": ns[0] as f64 / 1e9, "on_s": ns[1] as f64 / 1e9, "change_pct": with,
                              "calc_off": calc[0], "calc_on": calc[1], "seed_change_pct": SEED_002_WITH_CALC_PCT,
                              "runs": {"off": run(0), "on": run(1)}},
                "without_calc": {"off_s": ns[2] as f64 / 1e9, "on_s": ns[3] as f64 / 1e9, "change_pct": without,
                                 "seed_change_pct": SEED_002_WITHOUT_CALC_PCT,
                                 "runs": {"off": run(2), "on": run(3)}},
            });
            return Ok(json_text(&out));
        }
        let mut s = String::new();
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
        let on = &outcomes[1];
        let _ = writeln!(
            s,
            "(times: the writer's elapsed virtual time; with calc, APF on: {} not-present, {} ready, {} swap-ins)",
            on.apf.not_present, on.apf.ready, on.swap_ins
        );
        if self.guest.is_linux() {
            super::render_async_pf_both_sides(&mut s, outcomes, "apfcalc_ns");
        }
        Ok(s)
    }
}

impl ApfCalcBench {
    fn config(&self, apf: ApfMode, calc: bool) -> VmConfig {
        let a = &self.args;
        let mut config = self.base.clone();
        config.vcpus = 1;
        config.mem_size = self.mem;
        config.host_mem = Some(self.host_mem);
        config.apf = apf;
        config.seed = a.common.seed;
        let mut program: Vec<String> = vec![
            "apfcalc".into(),
            "-m".into(),
            format!("{}M", mib(self.array)),
            "-l".into(),
            a.loops.to_string(),
            "-s".into(),
            a.stride.to_string(),
        ];
        if calc {
            program.push("-c".into());
        }
        config.cmdline = self.guest.cmdline(a.common.seed, &program);
        config
    }

    fn describe(&self) -> String {
        let a = &self.args;
        format!(
            "{}apfcalc -m {}M -l {} -s {} [-c], 1 vCPU, guest {} MiB, host {} MiB, swap {}",
            self.guest.describe_prefix(),
            mib(self.array),
            a.loops,
            a.stride,
            mib(self.mem),
            mib(self.host_mem),
            self.base.swap_device.name
        )
    }
}
