//! `bench fastpf`: seed 001's frame-buffer case. The guest's `fbwrite`
//! composites a window into a 1920x1080x4 frame buffer frame after frame
//! (x11perf -comppixwin500) while the VMM harvests the dirty pages of
//! guest memory at 60 Hz of virtual time, as a display does: each
//! harvest write-protects the pages it returns, so the next frame's first
//! write to each faults. Guest throughput (pixels written per virtual
//! second) with the fast page fault on and off, under EPT and shadow
//! paging, with the cost of a write fault (the hv's handling and the VM
//! exit + entry apart) and the `mmu_lock` wait per fault; the seed's
//! +1.3 % (EPT) and +7.3 % (shadow) beside.

use super::seeds::{change_pct, Comparison};
use super::{json_text, Bench, BenchError, Output, RunResult, RunSpec};
use crate::config::{ConfigError, Kernel};
use crate::{plot, BenchCommon, FastpfBenchArgs, MmuArg};
use hv::{Cycles, DirtyLogMode, Vm, VmConfig, RAM_SLOT};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Seed 001's x11perf -comppixwin500 (ops/s), baseline and fast PF.
const SEED_EPT: (f64, f64) = (7060.0, 7150.0);
const SEED_SHADOW: (f64, f64) = (6980.0, 7490.0);

/// Virtual cycles per second (the machine's 3 GHz clock).
const HZ: u64 = 3_000_000_000;

/// What a harvested run recorded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HarvestRun {
    /// Collections of the dirty log.
    pub harvests: u64,
    /// Pages they returned.
    pub pages: u64,
    /// Fault exits (EPT violations; under shadow, #PF exits) over the run.
    pub fault_exits: u64,
    /// The hv's cycles handling them.
    pub fault_hv_cycles: u64,
    /// Their VM exit and entry transitions.
    pub fault_exit_cycles: u64,
    /// Cycles the vCPUs waited for `mmu_lock`.
    pub mmu_lock_wait_cycles: u64,
    /// The vCPUs' timed holds of `mmu_lock`.
    #[serde(default)]
    pub mmu_lock_acquisitions: u64,
    /// Faults the fast page fault fixed.
    pub fast_fixes: u64,
}

/// The VMM's side of a harvested run: logging on from the start, a
/// collection every `period`.
pub struct Harvester {
    period: Cycles,
    next: Cycles,
    run: HarvestRun,
}

impl Harvester {
    /// Turns on dirty logging of guest RAM (bitmap mode).
    pub fn install(vm: &mut Vm, period: Cycles) -> Result<Self, String> {
        vm.enable_dirty_log(RAM_SLOT, DirtyLogMode::Bitmap)
            .map_err(|e| format!("enabling dirty logging: {e}"))?;
        Ok(Harvester {
            period,
            next: vm.time() + period,
            run: HarvestRun::default(),
        })
    }

    /// The slice the run goes in: one period.
    pub fn slice(&self) -> Cycles {
        self.period
    }

    /// Harvests if a period has passed.
    pub fn after_slice(&mut self, vm: &mut Vm) -> Result<(), String> {
        if vm.time() < self.next {
            return Ok(());
        }
        let collected = vm
            .collect_dirty_log(RAM_SLOT)
            .map_err(|e| format!("harvesting the dirty log: {e}"))?;
        self.run.harvests += 1;
        self.run.pages += collected.pages.len() as u64;
        self.next = vm.time() + self.period;
        Ok(())
    }

    /// The record, with the run's fault counters.
    pub fn finish(mut self, vm: &Vm) -> HarvestRun {
        let totals = crate::memslot_churn::fault_totals(vm);
        self.run.fault_exits = totals.count;
        self.run.fault_hv_cycles = totals.hv_cycles;
        self.run.fault_exit_cycles = totals.exit_cycles;
        let stats = vm.stats();
        self.run.mmu_lock_wait_cycles = stats.vcpus.iter().map(|v| v.mmu_lock_wait_cycles).sum();
        self.run.mmu_lock_acquisitions = stats.vcpus.iter().map(|v| v.mmu_lock_acquisitions).sum();
        self.run.fast_fixes = stats.vcpus.iter().map(|v| v.fast_pf_fixed).sum();
        self.run
    }
}

pub struct FastpfBench {
    args: FastpfBenchArgs,
    /// (mmu, fast PF) of each run, in order.
    combos: Vec<(MmuArg, bool)>,
}

/// One rendered row.
#[derive(Debug, Clone, Serialize)]
struct JsonRow {
    mmu: &'static str,
    fast_pf: bool,
    writes_per_s: f64,
    write_fault_cycles: f64,
    mmu_lock_wait_cycles: f64,
    /// Of `write_fault_cycles`: the hv's handling, and the exit + entry.
    hv_cycles_per_fault: f64,
    exit_cycles_per_fault: f64,
    fault_exits: u64,
    fast_fixes: u64,
    /// The vCPUs' holds of `mmu_lock` over the run (a fast fix takes none).
    mmu_lock_acquisitions: u64,
    harvests: u64,
    pages_harvested: u64,
}

fn mmu_name(mmu: MmuArg) -> &'static str {
    match mmu {
        MmuArg::Ept => "ept",
        MmuArg::Shadow => "shadow",
        MmuArg::Native => "none",
    }
}

fn per(total: u64, count: u64) -> f64 {
    if count == 0 {
        0.0
    } else {
        total as f64 / count as f64
    }
}

impl FastpfBench {
    fn config(&self, mmu: MmuArg, fast_pf: bool) -> VmConfig {
        let a = &self.args;
        let mut config = VmConfig::default();
        let mut options = a.common.overcommit(crate::SwapDeviceArg::Ssd);
        options.mmu = mmu;
        options.apply(&mut config);
        config.mmu_options.fast_pf = fast_pf;
        config.host_mem = None;
        config.vcpus = 1;
        config.mem_size = 64 << 20;
        config.seed = a.common.seed;
        config.cmdline = format!(
            "seed={} -- fbwrite -w {} -h {} -s {} -f {}",
            a.common.seed, a.width, a.height, a.window, a.frames
        );
        config
    }

    fn row(
        &self,
        (mmu, fast_pf): (MmuArg, bool),
        result: &RunResult,
    ) -> Result<JsonRow, BenchError> {
        let run = result.harvest.ok_or_else(|| BenchError::Missing {
            label: result.label.clone(),
            key: "harvest".into(),
            reports: result.reports.clone(),
        })?;
        let pixels = result.require("fbwrite_pixels")?;
        let ns = result.require("fbwrite_ns")?.max(1);
        Ok(JsonRow {
            mmu: mmu_name(mmu),
            fast_pf,
            writes_per_s: pixels as f64 * 1e9 / ns as f64,
            write_fault_cycles: per(run.fault_hv_cycles + run.fault_exit_cycles, run.fault_exits),
            mmu_lock_wait_cycles: per(run.mmu_lock_wait_cycles, run.fault_exits),
            hv_cycles_per_fault: per(run.fault_hv_cycles, run.fault_exits),
            exit_cycles_per_fault: per(run.fault_exit_cycles, run.fault_exits),
            fault_exits: run.fault_exits,
            fast_fixes: run.fast_fixes,
            mmu_lock_acquisitions: run.mmu_lock_acquisitions,
            harvests: run.harvests,
            pages_harvested: run.pages,
        })
    }

    /// Throughput change with fast PF, in %, per MMU (when both ran).
    fn changes(rows: &[JsonRow]) -> Vec<(&'static str, f64, f64)> {
        let mut out = Vec::new();
        for mmu in ["ept", "shadow"] {
            let find = |fast| rows.iter().find(|r| r.mmu == mmu && r.fast_pf == fast);
            if let (Some(on), Some(off)) = (find(true), find(false)) {
                let seed = if mmu == "ept" { SEED_EPT } else { SEED_SHADOW };
                out.push((
                    mmu,
                    (on.writes_per_s / off.writes_per_s - 1.0) * 100.0,
                    (seed.1 / seed.0 - 1.0) * 100.0,
                ));
            }
        }
        out
    }

    fn describe(&self) -> String {
        let a = &self.args;
        format!(
            "fbwrite: {}x{} window in a {}x{}x4 frame buffer, {} frames; dirty log harvested at {} Hz (bitmap); 1 vCPU; shadow fast PF on indirect pages: {}",
            a.window,
            a.window,
            a.width,
            a.height,
            a.frames,
            a.harvest_hz,
            match a.common.fast_pf_indirect {
                crate::FastPfIndirectArg::Slow => "slow path (modern KVM)",
                crate::FastPfIndirectArg::Seed => "seed 001's scheme",
            }
        )
    }
}

impl Bench for FastpfBench {
    const NAME: &'static str = "fastpf";
    type Params = FastpfBenchArgs;

    fn new(args: FastpfBenchArgs) -> Self {
        let combos = args
            .mmus
            .iter()
            .flat_map(|&m| [(m, true), (m, false)])
            .collect();
        FastpfBench { args, combos }
    }

    fn params(&self) -> &FastpfBenchArgs {
        &self.args
    }

    fn common(&self) -> &BenchCommon {
        &self.args.common
    }

    fn check(&self, _kernel: &Kernel) -> Result<(), ConfigError> {
        let a = &self.args;
        if self.combos.is_empty() {
            return Err(ConfigError::Invalid("--mmus leaves no run".into()));
        }
        if a.window > a.width || a.window > a.height {
            return Err(ConfigError::Invalid(format!(
                "--window {}: larger than the {}x{} frame buffer",
                a.window, a.width, a.height
            )));
        }
        if a.width * a.height * 4 > 32 << 20 {
            return Err(ConfigError::Invalid(
                "--width x --height x 4: at most 32 MiB (the guest has 64)".into(),
            ));
        }
        Ok(())
    }

    fn specs(&self) -> Vec<RunSpec> {
        let period = Cycles(HZ / u64::from(self.args.harvest_hz));
        self.combos
            .iter()
            .map(|&(mmu, fast)| RunSpec {
                label: format!("{}-pf-{}", mmu_name(mmu), if fast { "on" } else { "off" }),
                config: self.config(mmu, fast),
                memslot: None,
                dirty_log: None,
                harvest: Some(period),
                linux: None,
            })
            .collect()
    }

    fn comparisons(&self, results: &[RunResult]) -> Result<Vec<Comparison>, BenchError> {
        let mut out = Vec::new();
        for (mmu, key) in [
            (MmuArg::Ept, "001.fastpf.x11perf_ept"),
            (MmuArg::Shadow, "001.fastpf.x11perf_shadow"),
        ] {
            if !self.args.mmus.contains(&mmu) {
                continue;
            }
            let setup = format!("{}, {}", self.describe(), mmu_name(mmu));
            let find = |fast| {
                self.combos
                    .iter()
                    .zip(results)
                    .find(|(&c, _)| c == (mmu, fast))
                    .map(|(&c, r)| (c, r))
            };
            let (Some(on), Some(off)) = (find(true), find(false)) else {
                continue;
            };
            let (on_row, off_row) = (self.row(on.0, on.1)?, self.row(off.0, off.1)?);
            let harvest = off.1.harvest.unwrap_or_default();
            let share = (harvest.fault_hv_cycles + harvest.fault_exit_cycles) as f64 * 100.0
                / off.1.virtual_cycles.max(1) as f64;
            out.push(
                Comparison::measured(
                    key,
                    setup,
                    change_pct(off_row.writes_per_s, on_row.writes_per_s),
                )
                .because(format!(
                    "write faults are {share:.1} % of the run with fast PF off ({:.0} -> {:.0} cycles per fault with it on), which bounds the gain",
                    off_row.write_fault_cycles, on_row.write_fault_cycles
                )),
            );
        }
        Ok(out)
    }

    fn render(&self, results: &[RunResult], output: &Output) -> Result<String, BenchError> {
        let rows = self
            .combos
            .iter()
            .zip(results)
            .map(|(&combo, result)| self.row(combo, result))
            .collect::<Result<Vec<_>, _>>()?;
        let changes = Self::changes(&rows);
        let plot_path = output.plot_path("bench-fastpf.svg");
        let bars: Vec<plot::Bar> = changes
            .iter()
            .map(|&(mmu, change, seed)| plot::Bar {
                label: mmu.to_string(),
                value: change,
                reference: Some(seed),
                note: format!("{change:+.2} %"),
            })
            .collect();
        output.write_plot(&plot_path, |path| {
            plot::bars(
                path,
                "Seed 001: frame-buffer throughput change with the fast page fault",
                &self.describe(),
                "throughput change (%)",
                "seed (x11perf)",
                &bars,
            )
        })?;
        if output.json {
            let json = serde_json::json!({ "results": rows });
            return Ok(json_text(&json));
        }
        let mut s = String::new();
        let _ = writeln!(s, "{}", self.describe());
        let _ = writeln!(
            s,
            "mmu    fast PF   pixels/s   fault exits  fast fixes  cycles/fault (hv + exit)  mmu_lock wait/fault"
        );
        for r in &rows {
            let _ = writeln!(
                s,
                "{:<6} {:<7} {:>10}   {:>11}  {:>10}  {:>8.0} ({:.0} + {:.0})  {:>10.1}",
                r.mmu,
                if r.fast_pf { "on" } else { "off" },
                plot::si(r.writes_per_s),
                r.fault_exits,
                r.fast_fixes,
                r.write_fault_cycles,
                r.hv_cycles_per_fault,
                r.exit_cycles_per_fault,
                r.mmu_lock_wait_cycles
            );
        }
        for (mmu, change, seed) in changes {
            let _ = writeln!(
                s,
                "{mmu}: throughput {change:+.1} % with fast PF (seed 001, x11perf: {seed:+.1} %)"
            );
        }
        let _ = writeln!(s, "plot: {}", plot_path.display());
        Ok(s)
    }
}
