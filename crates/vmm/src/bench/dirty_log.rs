//! `faultline bench dirty-log`: KVM's `dirty_log_perf_test` (seed 001's
//! "dirty-log resume time"). N vCPUs each write their own region of the
//! hv's dirtywrite kernel (`crates/hv/tests/guests/dirtywrite.c`); the VMM
//! populates memory (pass 1, logging off), enables dirty logging, and for
//! each iteration lets the vCPUs dirty their regions again, then gets and
//! clears the log; at the end it disables logging. Every time is virtual:
//! the dirty time from the guest's rdtsc around its pass (the slowest
//! vCPU's end minus the earliest start, ring-full waits included), the
//! get / clear / enable / disable times from the hv's cost of each
//! operation (its `mmu_lock` holds, waits and flushes).

use super::seeds::{change_pct, Comparison};
use super::{json_text, Bench, BenchError, Output, RunResult, RunSpec};
use crate::config::{ConfigError, Kernel};
use crate::plot::{self, Bar};
use crate::signals::StopRequest;
use crate::units::format_size;
use crate::{BenchCommon, DirtyLogBenchArgs, DirtyModeArg, MmuArg};
use abi::dirtywrite::{self, CTRL_GPA, REGION_BASE};
use hv::{Cycles, DirtyLogMode, MmuMode, RunStatus, StopReason, Vm, VmConfig, RAM_SLOT};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// The workload kernel, built by the hv's build script.
pub const KERNEL: &[u8] = include_bytes!(concat!(
    env!("FAULTLINE_HV_TEST_KERNELS"),
    "/dirtywrite.elf"
));

const PAGE: u64 = 4096;

/// What one run does beyond booting (carried by its [`RunSpec`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirtyLogSpec {
    pub mode: DirtyLogMode,
    pub vcpus: u64,
    pub iterations: u64,
}

/// One logged iteration, in virtual cycles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Iteration {
    /// The vCPUs dirtying their memory (seed 001's resume time).
    pub dirty_cycles: u64,
    pub get_cycles: u64,
    pub clear_cycles: u64,
    /// Pages the collection returned.
    pub pages: u64,
}

/// A run's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirtyLogRun {
    pub populate_cycles: u64,
    pub enable_cycles: u64,
    pub disable_cycles: u64,
    pub iterations: Vec<Iteration>,
    /// The vCPUs' waits for `mmu_lock` in the logged passes, summed.
    pub mmu_lock_wait_cycles: u64,
    pub ring_full_exits: u64,
    /// PML-full exits, summed over vCPUs over the logged iterations.
    #[serde(default)]
    pub pml_full_exits: u64,
    /// `mmu_lock`'s counters over the whole run (every core).
    #[serde(default)]
    pub mmu_lock: hv::MmuLockStats,
    /// Per vCPU over the logged passes (from the VMM's start of each pass
    /// to its last vCPU's end; not the populating pass, nor the time
    /// between passes, when KVM's test has its vCPUs out of the guest):
    /// its timed holds of `mmu_lock`, the
    /// contended ones and its wait.
    #[serde(default)]
    pub lock_per_vcpu: Vec<VcpuLock>,
}

/// One vCPU's use of `mmu_lock` over a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuLock {
    pub acquisitions: u64,
    pub contended: u64,
    pub wait_cycles: u64,
}

impl VcpuLock {
    /// The contended share of its acquisitions, in percent.
    fn contended_pct(&self) -> f64 {
        self.contended as f64 * 100.0 / self.acquisitions.max(1) as f64
    }
}

/// The largest distance of `values` from their mean, in percent of it, or
/// `None` when the mean is under `floor` (a spread of a few cycles or of
/// one or two contended acquisitions says nothing).
fn spread_pct(values: &[f64], floor: f64) -> Option<f64> {
    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
    if mean < floor || mean == 0.0 {
        return None;
    }
    Some(
        values
            .iter()
            .map(|v| (v - mean).abs() * 100.0 / mean)
            .fold(0.0, f64::max),
    )
}

/// A spread for the per-vCPU line.
fn spread_text(spread: Option<f64>, floor: &str) -> String {
    match spread {
        Some(p) => format!("spread {p:.1} %"),
        None => format!("spread -: mean under {floor}"),
    }
}

/// The mean dirty time of a run's iterations, in ms.
fn mean_dirty_ms(r: &DirtyLogRun) -> f64 {
    let n = r.iterations.len().max(1) as f64;
    ms((r.iterations.iter().map(|i| i.dirty_cycles).sum::<u64>() as f64 / n) as u64)
}

/// Seed 001's change of the dirty-log resume time with the fast page
/// fault, the middle of its -47 % to -53 %.
const SEED_001_DIRTY_CHANGE: f64 = 0.50;

fn ms(cycles: u64) -> f64 {
    cycles as f64 / hv::CYCLES_PER_SECOND as f64 * 1e3
}

fn read_u64(vm: &mut Vm, gpa: u64) -> Result<u64, String> {
    let mut b = [0u8; 8];
    vm.read_guest(hv::Gpa(gpa), &mut b)
        .map_err(|e| format!("reading the control block: {e}"))?;
    Ok(u64::from_le_bytes(b))
}

/// Costs of ring harvests made while a pass ran (the ring filled).
#[derive(Default)]
struct Harvests {
    get: u64,
    clear: u64,
    /// Pages of the RAM slot they returned.
    pages: u64,
    exits: u64,
}

/// Lets the VM run (the vCPUs spin on `go`) until the VMM's last
/// operation has returned: `dirty_log_perf_test` starts an iteration only
/// after its get and clear returned, so no pass meets the collection's
/// `mmu_lock` hold.
fn wait_for_vmm(vm: &mut Vm, stop: &StopRequest) -> Result<(), String> {
    while vm.time() < vm.vmm_now() {
        if let Some(signal) = stop.signal() {
            return Err(format!("interrupted by {}", signal.name()));
        }
        match vm.run_until(vm.vmm_now()) {
            RunStatus::Running | RunStatus::Stopped(StopReason::DebugExit { status: 1 }) => {}
            RunStatus::DirtyRingFull => {
                return Err("a dirty ring filled between passes".to_string())
            }
            RunStatus::Stopped(other) => return Err(format!("the VM stopped: {other:?}")),
        }
    }
    Ok(())
}

/// Lets the vCPUs run pass `pass` (once the VMM's last operation has
/// returned) and waits for all of them; returns the pass's dirty time
/// (latest end minus earliest start, guest rdtsc) and each vCPU's use of
/// `mmu_lock` from the start to the end of the pass.
fn run_pass(
    vm: &mut Vm,
    spec: &DirtyLogSpec,
    pass: u64,
    slice: Cycles,
    stop: &StopRequest,
    harvests: &mut Harvests,
) -> Result<(u64, Vec<VcpuLock>), String> {
    wait_for_vmm(vm, stop)?;
    let lock_before = lock_per_vcpu(vm);
    vm.write_guest(hv::Gpa(CTRL_GPA + dirtywrite::GO), &pass.to_le_bytes())
        .map_err(|e| format!("starting pass {pass}: {e}"))?;
    loop {
        if let Some(signal) = stop.signal() {
            return Err(format!("interrupted by {}", signal.name()));
        }
        match vm.run_until(vm.time() + slice) {
            RunStatus::Running | RunStatus::Stopped(StopReason::DebugExit { status: 1 }) => {}
            RunStatus::DirtyRingFull => {
                let h = vm.harvest_dirty_rings().map_err(|e| e.to_string())?;
                harvests.get += h.get.cycles.0;
                harvests.clear += h.clear.cycles.0;
                harvests.pages += h.entries.iter().filter(|e| e.slot == RAM_SLOT).count() as u64;
                harvests.exits += 1;
            }
            RunStatus::Stopped(other) => return Err(format!("the VM stopped: {other:?}")),
        }
        let mut all_done = true;
        for cpu in 0..spec.vcpus {
            all_done &= read_u64(vm, CTRL_GPA + dirtywrite::done(cpu))? >= pass;
        }
        if all_done {
            break;
        }
    }
    let (mut start, mut end) = (u64::MAX, 0);
    for cpu in 0..spec.vcpus {
        start = start.min(read_u64(vm, CTRL_GPA + dirtywrite::tsc_start(cpu))?);
        end = end.max(read_u64(vm, CTRL_GPA + dirtywrite::tsc_end(cpu))?);
    }
    let lock = lock_per_vcpu(vm)
        .iter()
        .zip(&lock_before)
        .map(|(now, before)| VcpuLock {
            acquisitions: now.acquisitions - before.acquisitions,
            contended: now.contended - before.contended,
            wait_cycles: now.wait_cycles - before.wait_cycles,
        })
        .collect();
    Ok((end.saturating_sub(start), lock))
}

/// Drives one run: populate, enable, the iterations, disable.
pub fn drive(
    vm: &mut Vm,
    spec: &DirtyLogSpec,
    slice: Cycles,
    stop: &StopRequest,
) -> Result<DirtyLogRun, String> {
    let mut harvests = Harvests::default();
    let (populate_cycles, _) = run_pass(vm, spec, 1, slice, stop, &mut harvests)?;
    let pml_full_before = pml_full_exits(vm);
    let mut lock_in_passes = vec![VcpuLock::default(); spec.vcpus as usize];
    let enable = vm
        .enable_dirty_log(RAM_SLOT, spec.mode)
        .map_err(|e| format!("enabling dirty logging: {e}"))?;
    let mut iterations = Vec::new();
    for i in 1..=spec.iterations {
        harvests = Harvests {
            exits: harvests.exits,
            ..Harvests::default()
        };
        let (dirty_cycles, lock) = run_pass(vm, spec, i + 1, slice, stop, &mut harvests)?;
        for (sum, pass) in lock_in_passes.iter_mut().zip(lock) {
            sum.acquisitions += pass.acquisitions;
            sum.contended += pass.contended;
            sum.wait_cycles += pass.wait_cycles;
        }
        let collected = vm
            .collect_dirty_log(RAM_SLOT)
            .map_err(|e| format!("collecting the log: {e}"))?;
        iterations.push(Iteration {
            dirty_cycles,
            get_cycles: collected.get.cycles.0 + harvests.get,
            clear_cycles: collected.clear.cycles.0 + harvests.clear,
            pages: collected.pages.len() as u64 + harvests.pages,
        });
    }
    let disable = vm
        .disable_dirty_log(RAM_SLOT)
        .map_err(|e| format!("disabling dirty logging: {e}"))?;
    let stats = vm.stats();
    Ok(DirtyLogRun {
        populate_cycles,
        enable_cycles: enable.cycles.0,
        disable_cycles: disable.cycles.0,
        iterations,
        mmu_lock_wait_cycles: lock_in_passes.iter().map(|v| v.wait_cycles).sum(),
        ring_full_exits: harvests.exits,
        pml_full_exits: pml_full_exits(vm) - pml_full_before,
        mmu_lock: stats.mmu_lock,
        lock_per_vcpu: lock_in_passes,
    })
}

/// Each vCPU's use of `mmu_lock` so far.
fn lock_per_vcpu(vm: &Vm) -> Vec<VcpuLock> {
    vm.stats()
        .vcpus
        .iter()
        .map(|v| VcpuLock {
            acquisitions: v.mmu_lock_acquisitions,
            contended: v.mmu_lock_contended,
            wait_cycles: v.mmu_lock_wait_cycles,
        })
        .collect()
}

/// PML-full exits so far, summed over the vCPUs.
fn pml_full_exits(vm: &Vm) -> u64 {
    vm.stats()
        .vcpus
        .iter()
        .filter_map(|v| v.exits.get("pml_full"))
        .map(|e| e.count)
        .sum()
}

fn mmu_of(arg: MmuArg) -> MmuMode {
    match arg {
        MmuArg::Ept => MmuMode::Ept,
        MmuArg::Shadow => MmuMode::Shadow,
        MmuArg::Native => MmuMode::Native,
    }
}

/// One row: which configuration a run measured.
#[derive(Debug, Clone, Copy)]
struct Combo {
    mmu: MmuMode,
    mode: DirtyLogMode,
    fast_pf: bool,
}

pub struct DirtyLogBench {
    args: DirtyLogBenchArgs,
    combos: Vec<Combo>,
}

impl DirtyLogBench {
    fn pages(&self) -> u64 {
        self.args.bytes.div_ceil(PAGE)
    }

    /// Guest memory: the regions above their base, rounded up to 2 MiB.
    fn mem(&self) -> u64 {
        let need = REGION_BASE + u64::from(self.args.vcpus) * self.pages() * PAGE;
        need.div_ceil(2 << 20) * (2 << 20)
    }

    fn config(&self, combo: Combo) -> VmConfig {
        let a = &self.args;
        let mut config = VmConfig {
            vcpus: a.vcpus,
            mem_size: self.mem(),
            mmu: combo.mmu,
            seed: a.common.seed,
            engine: a.common.engine,
            dirty_ring_size: a.ring_size as usize,
            mmu_options: hv::MmuOptions {
                fast_pf: combo.fast_pf,
                ept_ad: a.common.ept_ad.on(),
                seed_indirect: a.common.fast_pf_indirect == crate::FastPfIndirectArg::Seed,
            },
            cmdline: format!(
                "pages={} passes={} wpct={} random={} seed={}",
                self.pages(),
                a.iterations + 1,
                a.write_percent,
                u8::from(a.random),
                a.common.seed
            ),
            ..VmConfig::default()
        };
        // `--cost-profile` and `--cost` (the other common options,
        // overcommit, do not apply: this bench runs without a host memory
        // limit).
        a.common.apply_costs(&mut config);
        config
    }

    fn label(combo: Combo) -> String {
        format!(
            "{}-{}-pf-{}",
            combo.mmu.name(),
            combo.mode.name(),
            if combo.fast_pf { "on" } else { "off" }
        )
    }
}

impl Bench for DirtyLogBench {
    const NAME: &'static str = "dirty-log";
    type Params = DirtyLogBenchArgs;

    fn new(args: DirtyLogBenchArgs) -> Self {
        let mut combos = Vec::new();
        for &mmu in &args.mmus {
            for &mode in &args.modes {
                for &fast_pf in &args.common.fast_pf {
                    let (mmu, mode) = (mmu_of(mmu), DirtyLogMode::from(mode));
                    // PML is an EPT feature: no shadow row.
                    if mode == DirtyLogMode::Pml && mmu != MmuMode::Ept {
                        continue;
                    }
                    combos.push(Combo { mmu, mode, fast_pf });
                }
            }
        }
        DirtyLogBench { args, combos }
    }

    fn params(&self) -> &DirtyLogBenchArgs {
        &self.args
    }

    fn common(&self) -> &BenchCommon {
        &self.args.common
    }

    fn check(&self, _kernel: &Kernel) -> Result<(), ConfigError> {
        let a = &self.args;
        if self.combos.is_empty() {
            return Err(ConfigError::Invalid(
                "--mmus, --modes and --fast-pf leave no run".into(),
            ));
        }
        if a.modes.contains(&DirtyModeArg::Pml) && !a.common.ept_ad.on() {
            return Err(ConfigError::Invalid(
                "--modes pml needs the EPT accessed/dirty flags (--ept-ad on)".into(),
            ));
        }
        if a.write_percent > 100 {
            return Err(ConfigError::Invalid(format!(
                "-w {}: a percentage is at most 100",
                a.write_percent
            )));
        }
        if self.mem() > hv::MAX_GUEST_MEM {
            return Err(ConfigError::Invalid(format!(
                "{} vCPUs x {} need {} of guest memory, more than {}",
                a.vcpus,
                format_size(a.bytes),
                format_size(self.mem()),
                format_size(hv::MAX_GUEST_MEM)
            )));
        }
        Ok(())
    }

    fn specs(&self) -> Vec<RunSpec> {
        self.combos
            .iter()
            .map(|&combo| RunSpec {
                label: Self::label(combo),
                config: self.config(combo),
                memslot: None,
                dirty_log: Some(DirtyLogSpec {
                    mode: combo.mode,
                    vcpus: u64::from(self.args.vcpus),
                    iterations: self.args.iterations,
                }),
                harvest: None,
                linux: None,
            })
            .collect()
    }

    fn comparisons(&self, results: &[RunResult]) -> Result<Vec<Comparison>, BenchError> {
        let runs: Vec<(Combo, &DirtyLogRun)> = self
            .combos
            .iter()
            .zip(results)
            .filter_map(|(c, r)| r.dirty_log.as_ref().map(|run| (*c, run)))
            .collect();
        let mut out = Vec::new();
        for (i, (c, _)) in runs.iter().enumerate() {
            // One comparison per MMU and mode, at its first run.
            if runs[..i]
                .iter()
                .any(|(o, _)| o.mmu == c.mmu && o.mode == c.mode)
            {
                continue;
            }
            let find = |fast: bool| {
                runs.iter()
                    .find(|(o, _)| o.mmu == c.mmu && o.mode == c.mode && o.fast_pf == fast)
                    .map(|(_, r)| *r)
            };
            let a = &self.args;
            let setup = format!(
                "{} vCPUs x {}, {}, {}",
                a.vcpus,
                format_size(a.bytes),
                c.mmu.name(),
                c.mode.name()
            );
            let key = "001.dirty_log.resume";
            match (find(true), find(false)) {
                (Some(on), Some(off)) => {
                    // Per page a vCPU writes in a pass (each takes one
                    // write fault): the pass's time with fast PF off,
                    // and what the fast path saves of it.
                    let pages = self.pages().max(1) as f64;
                    let cycles_per_ms = hv::CYCLES_PER_SECOND as f64 / 1e3;
                    let per_page = mean_dirty_ms(off) * cycles_per_ms / pages;
                    let saved = (mean_dirty_ms(off) - mean_dirty_ms(on)) * cycles_per_ms / pages;
                    out.push(
                        Comparison::measured(key, setup, change_pct(mean_dirty_ms(off), mean_dirty_ms(on)))
                            .because(format!(
                                "the fast path saves {saved:.0} of the {per_page:.0} cycles a page written costs a vCPU with fast PF off (the slow path's exit and handler); mmu_lock waits in the passes {:.3} ms on, {:.3} ms off",
                                ms(on.mmu_lock_wait_cycles),
                                ms(off.mmu_lock_wait_cycles)
                            )),
                    )
                }
                _ => out.push(Comparison::not_run(
                    key,
                    setup,
                    "fast PF on or off not run (give --fast-pf on,off)",
                )),
            }
        }
        Ok(out)
    }

    fn render(&self, results: &[RunResult], output: &Output) -> Result<String, BenchError> {
        let mut rows = Vec::new();
        for (combo, result) in self.combos.iter().zip(results) {
            let run = result
                .dirty_log
                .as_ref()
                .ok_or_else(|| BenchError::Missing {
                    label: result.label.clone(),
                    key: "dirty_log".into(),
                    reports: result.reports.clone(),
                })?;
            rows.push((*combo, run));
        }
        let plot_path = output.plot_path("bench-dirty-log.svg");
        output.write_plot(&plot_path, |path| self.plot(path, &rows))?;
        if output.json {
            let results: Vec<JsonRow> = rows.iter().map(|&(c, r)| JsonRow::of(c, r)).collect();
            return Ok(json_text(&JsonOut { results }));
        }
        let mut s = String::new();
        let a = &self.args;
        let _ = writeln!(
            s,
            "bench dirty-log (seed 001): {} vCPUs x {} each, {} % writes, {} access, {} iterations",
            a.vcpus,
            format_size(a.bytes),
            a.write_percent,
            if a.random { "random" } else { "sequential" },
            a.iterations
        );
        let _ = writeln!(
            s,
            "{:<6} {:<7} {:<7} {:>11} {:>10} {:>9} {:>10} {:>10} {:>9} {:>12} {:>10} {:>10} {:>9}",
            "mmu",
            "mode",
            "fast pf",
            "populate ms",
            "enable ms",
            "dirty ms",
            "get ms",
            "clear ms",
            "pages",
            "lock wait ms",
            "line xfers",
            "ring full",
            "pml full"
        );
        for (c, r) in &rows {
            let n = r.iterations.len().max(1) as f64;
            let mean =
                |f: fn(&Iteration) -> u64| r.iterations.iter().map(f).sum::<u64>() as f64 / n;
            let _ = writeln!(
                s,
                "{:<6} {:<7} {:<7} {:>11.3} {:>10.3} {:>9.3} {:>10.3} {:>10.3} {:>9} {:>12.3} {:>10} {:>10} {:>9}",
                c.mmu.name(),
                c.mode.name(),
                if c.fast_pf { "on" } else { "off" },
                ms(r.populate_cycles),
                ms(r.enable_cycles),
                ms(mean(|i| i.dirty_cycles) as u64),
                ms(mean(|i| i.get_cycles) as u64),
                ms(mean(|i| i.clear_cycles) as u64),
                mean(|i| i.pages) as u64,
                ms(r.mmu_lock_wait_cycles),
                r.mmu_lock.line_transfers,
                r.ring_full_exits,
                r.pml_full_exits
            );
        }
        // The comparison the seed made: the dirty time with the fast page
        // fault on against off, per MMU and mode.
        let dirty_ms = |r: &DirtyLogRun| {
            let n = r.iterations.len().max(1) as f64;
            ms((r.iterations.iter().map(|i| i.dirty_cycles).sum::<u64>() as f64 / n) as u64)
        };
        let mut compared = false;
        for (c, on) in rows.iter().filter(|(c, _)| c.fast_pf) {
            let off = rows
                .iter()
                .find(|(o, _)| !o.fast_pf && o.mmu == c.mmu && o.mode == c.mode);
            if let Some((_, off)) = off {
                compared = true;
                let _ = writeln!(
                    s,
                    "{} {}: dirty time fast PF on vs off {:+.1} % ({:.3} vs {:.3} ms; seed 001: -47 % to -53 %)",
                    c.mmu.name(),
                    c.mode.name(),
                    (dirty_ms(on) / dirty_ms(off).max(1e-12) - 1.0) * 100.0,
                    dirty_ms(on),
                    dirty_ms(off)
                );
            }
        }
        if !compared {
            let _ = writeln!(
                s,
                "fast PF on vs off: not compared (give --fast-pf on,off; seed 001: -47 % to -53 % dirty time)"
            );
        }
        let _ = writeln!(
            s,
            "(virtual time; dirty, get, clear and pages are means over the iterations; the dirty time is seed 001's \"dirty-log resume time\": the last vCPU's end minus the first one's start, guest rdtsc; lock wait: the vCPUs' waits for mmu_lock in those passes, summed)"
        );
        let _ = writeln!(
            s,
            "mmu_lock per vCPU (logged passes: its acquisitions, their contended share, its wait; spread: the largest distance from the mean):"
        );
        for (c, r) in &rows {
            if r.lock_per_vcpu.is_empty() {
                continue;
            }
            let shares: Vec<f64> = r
                .lock_per_vcpu
                .iter()
                .map(VcpuLock::contended_pct)
                .collect();
            let waits: Vec<f64> = r.lock_per_vcpu.iter().map(|v| ms(v.wait_cycles)).collect();
            let contended: Vec<f64> = r.lock_per_vcpu.iter().map(|v| v.contended as f64).collect();
            // Shares of fewer than 10 contended acquisitions per vCPU, or
            // waits under a microsecond, are too few to compare.
            let share_spread = spread_pct(&contended, 10.0).and_then(|_| spread_pct(&shares, 0.0));
            let wait_spread = spread_pct(&waits, 0.001);
            let list = |v: &[f64], digits: usize| {
                v.iter()
                    .map(|x| format!("{x:.digits$}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let _ = writeln!(
                s,
                "  {} {} fast pf {}: acquisitions {}; contended % {} ({}); wait ms {} ({})",
                c.mmu.name(),
                c.mode.name(),
                if c.fast_pf { "on" } else { "off" },
                r.lock_per_vcpu
                    .iter()
                    .map(|v| v.acquisitions.to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
                list(&shares, 1),
                spread_text(share_spread, "10 contended"),
                list(&waits, 3),
                spread_text(wait_spread, "1 us")
            );
        }
        let _ = writeln!(s, "plot: {}", plot_path.display());
        Ok(s)
    }
}

impl DirtyLogBench {
    fn plot(&self, path: &std::path::Path, rows: &[(Combo, &DirtyLogRun)]) -> Result<(), String> {
        let dirty_ms = |r: &DirtyLogRun| {
            let n = r.iterations.len().max(1) as u64;
            ms(r.iterations.iter().map(|i| i.dirty_cycles).sum::<u64>() / n)
        };
        let bars: Vec<Bar> = rows
            .iter()
            .map(|(c, r)| {
                let value = dirty_ms(r);
                // A fast-PF-on row beside its off row: the change, and
                // the seed's (the middle of -47 % to -53 %) as a mark.
                let off = rows
                    .iter()
                    .find(|(o, _)| c.fast_pf && !o.fast_pf && o.mmu == c.mmu && o.mode == c.mode)
                    .map(|(_, off)| dirty_ms(off));
                Bar {
                    label: Self::label(*c),
                    value,
                    reference: off.map(|off| off * (1.0 - SEED_001_DIRTY_CHANGE)),
                    note: match off {
                        Some(off) => format!(
                            "ms, {:+.0} % vs off",
                            (value / off.max(1e-12) - 1.0) * 100.0
                        ),
                        None => "ms".to_string(),
                    },
                }
            })
            .collect();
        plot::bars(
            path,
            "faultline bench dirty-log: time to dirty memory after a collection",
            &format!(
                "{} vCPUs x {}, {} % writes, mean of {} iterations (virtual time)",
                self.args.vcpus,
                format_size(self.args.bytes),
                self.args.write_percent,
                self.args.iterations
            ),
            "dirty ms",
            "seed 001: fast PF on = off x 0.50 (-47 % to -53 %)",
            &bars,
        )
    }
}

/// The `--json` output (a struct, so the keys keep this order).
#[derive(Serialize)]
struct JsonOut {
    results: Vec<JsonRow>,
}

#[derive(Serialize)]
struct JsonIteration {
    dirty_ms: f64,
    get_ms: f64,
    clear_ms: f64,
    pages: u64,
}

#[derive(Serialize)]
struct JsonRow {
    mmu: &'static str,
    mode: &'static str,
    fast_pf: bool,
    iterations: Vec<JsonIteration>,
    populate_ms: f64,
    enable_ms: f64,
    disable_ms: f64,
    mmu_lock_wait_ms: f64,
    /// `mmu_lock` over the run, every core: acquisitions, waits, line
    /// transfers, handoffs.
    mmu_lock: hv::MmuLockStats,
    ring_full_exits: u64,
    pml_full_exits: u64,
}

impl JsonRow {
    fn of(c: Combo, r: &DirtyLogRun) -> Self {
        JsonRow {
            mmu: c.mmu.name(),
            mode: c.mode.name(),
            fast_pf: c.fast_pf,
            iterations: r
                .iterations
                .iter()
                .map(|i| JsonIteration {
                    dirty_ms: ms(i.dirty_cycles),
                    get_ms: ms(i.get_cycles),
                    clear_ms: ms(i.clear_cycles),
                    pages: i.pages,
                })
                .collect(),
            populate_ms: ms(r.populate_cycles),
            enable_ms: ms(r.enable_cycles),
            disable_ms: ms(r.disable_cycles),
            mmu_lock_wait_ms: ms(r.mmu_lock_wait_cycles),
            mmu_lock: r.mmu_lock,
            ring_full_exits: r.ring_full_exits,
            pml_full_exits: r.pml_full_exits,
        }
    }
}
