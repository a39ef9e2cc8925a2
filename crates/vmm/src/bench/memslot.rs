//! `bench memslot`: seed 003 (delete and re-add a memslot while 6 vCPUs
//! run over 2 GiB of touched guest memory; zap-all slow and fast), and
//! [`SlotChurn`], the memslot changes while a guest runs that both the
//! benchmark and `faultline run --memslot-period` drive.
//!
//! The slot the VMM deletes and re-adds is a small one above guest RAM
//! that the guest never touches, as a VMM remapping a device region does:
//! deleting any slot drops every mapping of the VM (zap-all), so the
//! guest's own memory refaults afterwards while its contents stay where
//! they are.

use super::{json_text, Bench, BenchError, Output, RunResult, RunSpec};
use crate::config::{ConfigError, Kernel};
use crate::units::{cycles_to_secs, format_size};
use crate::{plot, BenchCommon, MemslotBenchArgs, MmuArg, SwapDeviceArg};
use hv::{Cycles, Gpa, MemslotError, SlotFlags, SlotId, Vm, VmConfig, ZapMode};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// The seed's delete + re-add time, before and after (6 vCPUs, 2 GiB).
pub const SEED_003_BEFORE_MS: f64 = 46.1;
pub const SEED_003_AFTER_MS: f64 = 21.6;

/// The slot the VMM deletes and re-adds.
pub const CHURN_SLOT: SlotId = SlotId(1);
/// Its size.
pub const CHURN_SLOT_SIZE: u64 = 2 << 20;

/// The report key the benchmark's guest program sends after each pass.
const PASS_KEY: &str = "touchloop_pass";

/// When the VMM changes the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChurnTrigger {
    /// After each pass the guest reports (`touchloop_pass=N`): op k once
    /// pass k is done, so each op is followed by a pass that refaults the
    /// whole array.
    GuestPasses,
    /// Every period of virtual time, from the first period on.
    Period(Cycles),
}

/// One delete + re-add of the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemslotOp {
    /// Virtual time when it started.
    pub at_cycles: u64,
    /// The operation's virtual time (the VMM thread's, start to end).
    pub op_cycles: u64,
    pub pages_zapped: u64,
    pub sptes_zapped: u64,
    pub lock_breaks: u64,
    /// Fault exits (EPT violations; under shadow, #PF exits) from this op
    /// to the next (or the end), all vCPUs.
    pub refaults: u64,
    /// Their cost: the hv's handling plus the VM exit and entry, summed
    /// over vCPUs.
    pub refault_cycles: u64,
}

/// The memslot changes of one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemslotRun {
    pub zap: String,
    pub ops: Vec<MemslotOp>,
    /// The longest single stall any vCPU had from a zap (a wait behind
    /// its teardown holds, or a root reload).
    pub max_vcpu_stall_cycles: u64,
    /// Every vCPU's stalls from zaps, summed.
    pub total_vcpu_stall_cycles: u64,
    pub root_reloads: u64,
}

impl MemslotRun {
    fn mean(&self, f: impl Fn(&MemslotOp) -> u64) -> f64 {
        self.ops.iter().map(|o| f(o) as f64).sum::<f64>() / self.ops.len().max(1) as f64
    }

    /// Mean operation time in virtual milliseconds.
    pub fn op_ms(&self) -> f64 {
        self.mean(|o| o.op_cycles) / hv::CYCLES_PER_SECOND as f64 * 1e3
    }

    /// Mean refault cost per op in virtual milliseconds (CPU time over
    /// all vCPUs).
    pub fn refault_ms(&self) -> f64 {
        self.mean(|o| o.refault_cycles) / hv::CYCLES_PER_SECOND as f64 * 1e3
    }

    pub fn max_stall_us(&self) -> f64 {
        cycles_to_secs(self.max_vcpu_stall_cycles) * 1e6
    }

    /// Pages zapped per op (the mean, rounded down).
    pub fn pages_zapped(&self) -> u64 {
        self.mean(|o| o.pages_zapped) as u64
    }

    /// Lock breaks per op (the mean, rounded down).
    pub fn lock_breaks(&self) -> u64 {
        self.mean(|o| o.lock_breaks) as u64
    }
}

/// The exits a refault takes: an EPT violation, or under shadow paging the
/// guest #PF intercepted through the exception bitmap (the only exception
/// it intercepts; once the array is touched the guest takes no #PF of its
/// own).
const FAULT_EXITS: [&str; 2] = ["ept_violation", "exception"];

/// Fault-exit totals over every vCPU.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FaultTotals {
    pub count: u64,
    /// The hv's handling.
    pub hv_cycles: u64,
    /// The VM exit and entry transitions.
    pub exit_cycles: u64,
}

impl FaultTotals {
    fn cycles(&self) -> u64 {
        self.hv_cycles + self.exit_cycles
    }
}

pub(crate) fn fault_totals(vm: &Vm) -> FaultTotals {
    let mut totals = FaultTotals::default();
    for (vcpu, stats) in vm.vcpus().iter().zip(vm.stats().vcpus) {
        let costs = vcpu.cpu().costs();
        for stat in FAULT_EXITS.iter().filter_map(|name| stats.exits.get(*name)) {
            totals.count += stat.count;
            totals.hv_cycles += stat.hv_cycles;
            totals.exit_cycles += stat.count * (costs.vm_exit + costs.vm_entry);
        }
    }
    totals
}

/// Deletes and re-adds [`CHURN_SLOT`] while a guest runs, recording
/// each operation.
pub struct SlotChurn {
    trigger: ChurnTrigger,
    wanted: u32,
    base: Gpa,
    ops: Vec<MemslotOp>,
    /// Passes the guest has reported done, and the reports read so far.
    passes: u64,
    reports_read: usize,
    /// Faults at the last op.
    since: FaultTotals,
    error: Option<MemslotError>,
}

impl SlotChurn {
    /// Adds the slot (just above guest RAM) to a booted VM.
    pub fn install(vm: &mut Vm, trigger: ChurnTrigger, ops: u32) -> Result<Self, MemslotError> {
        let base = Gpa(vm.mem_size());
        vm.add_memslot(CHURN_SLOT, base, CHURN_SLOT_SIZE, SlotFlags::default())?;
        Ok(SlotChurn {
            trigger,
            wanted: ops,
            base,
            ops: Vec::new(),
            passes: 0,
            reports_read: 0,
            since: FaultTotals::default(),
            error: None,
        })
    }

    /// Does the next operation if it is due (call between slices).
    pub fn after_slice(&mut self, vm: &mut Vm) {
        for report in &vm.reports()[self.reports_read..] {
            for kv in report.line.split_whitespace() {
                if let Some(n) = kv.strip_prefix(PASS_KEY).and_then(|v| v.strip_prefix('=')) {
                    self.passes = self.passes.max(n.parse().unwrap_or(0));
                }
            }
        }
        self.reports_read = vm.reports().len();
        if self.error.is_some() || self.ops.len() as u32 >= self.wanted {
            return;
        }
        let next = self.ops.len() as u64 + 1;
        let due = match self.trigger {
            ChurnTrigger::GuestPasses => self.passes >= next,
            ChurnTrigger::Period(period) => vm.time().0 >= period.0.saturating_mul(next),
        };
        if due {
            if let Err(e) = self.change(vm) {
                self.error = Some(e);
            }
        }
    }

    fn change(&mut self, vm: &mut Vm) -> Result<(), MemslotError> {
        self.close_window(vm);
        let at = vm.time();
        let report = vm.delete_memslot(CHURN_SLOT)?;
        vm.add_memslot(CHURN_SLOT, self.base, CHURN_SLOT_SIZE, SlotFlags::default())?;
        self.ops.push(MemslotOp {
            at_cycles: at.0,
            op_cycles: report.cycles().0,
            pages_zapped: report.pages_zapped,
            sptes_zapped: report.sptes_zapped,
            lock_breaks: report.lock_breaks,
            refaults: 0,
            refault_cycles: 0,
        });
        Ok(())
    }

    /// Charges the faults since the last op to it.
    fn close_window(&mut self, vm: &Vm) {
        let now = fault_totals(vm);
        if let Some(last) = self.ops.last_mut() {
            last.refaults = now.count - self.since.count;
            last.refault_cycles = now.cycles() - self.since.cycles();
        }
        self.since = now;
    }

    /// The run's record, or why an operation failed.
    pub fn finish(mut self, vm: &Vm, zap: ZapMode) -> Result<MemslotRun, MemslotError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.close_window(vm);
        let stats = vm.stats();
        Ok(MemslotRun {
            zap: zap.name().to_string(),
            ops: self.ops,
            max_vcpu_stall_cycles: stats
                .vcpus
                .iter()
                .map(|v| v.zap_stall_max)
                .max()
                .unwrap_or(0),
            total_vcpu_stall_cycles: stats.vcpus.iter().map(|v| v.zap_stall_cycles).sum(),
            root_reloads: stats.vcpus.iter().map(|v| v.root_reloads).sum(),
        })
    }
}

pub struct MemslotBench {
    args: MemslotBenchArgs,
    mems: Vec<u64>,
}

/// The name of an MMU mode, as the bench's output spells it.
fn mmu_name(mmu: MmuArg) -> &'static str {
    match mmu {
        MmuArg::Ept => "ept",
        MmuArg::Shadow => "shadow",
        MmuArg::Native => "none",
    }
}

impl Bench for MemslotBench {
    const NAME: &'static str = "memslot";
    type Params = MemslotBenchArgs;

    fn new(args: MemslotBenchArgs) -> MemslotBench {
        let mems = args.sweep_mem.clone().unwrap_or_else(|| vec![args.mem]);
        MemslotBench { args, mems }
    }

    fn params(&self) -> &MemslotBenchArgs {
        &self.args
    }

    fn common(&self) -> &BenchCommon {
        &self.args.common
    }

    fn check(&self, kernel: &Kernel) -> Result<(), ConfigError> {
        if self.args.mmus.is_empty() {
            return Err(ConfigError::Invalid("--mmus names no MMU".into()));
        }
        for &mem in &self.mems {
            kernel.check_memory(mem, None)?;
            if array(mem) < 1 << 20 {
                return Err(ConfigError::Invalid(format!(
                    "guest memory {} leaves no array to touch",
                    format_size(mem)
                )));
            }
        }
        Ok(())
    }

    fn specs(&self) -> Vec<RunSpec> {
        let mut specs = Vec::new();
        for &mem in &self.mems {
            for &mmu in &self.args.mmus {
                for zap in [ZapMode::Slow, ZapMode::Fast] {
                    specs.push(RunSpec {
                        label: format!("{}-{}-{}", mmu_name(mmu), zap.name(), format_size(mem)),
                        config: self.config(mem, mmu, zap),
                        memslot: Some((ChurnTrigger::GuestPasses, self.args.ops)),
                        dirty_log: None,
                        harvest: None,
                        linux: None,
                    });
                }
            }
        }
        specs
    }

    fn render(&self, results: &[RunResult], output: &Output) -> Result<String, BenchError> {
        let mut rows = Vec::new();
        for (i, result) in results.iter().enumerate() {
            let mmus = &self.args.mmus;
            let mem = self.mems[i / (2 * mmus.len())];
            let mmu = mmu_name(mmus[i / 2 % mmus.len()]);
            let run = result.memslot.as_ref().ok_or_else(|| BenchError::Missing {
                label: result.label.clone(),
                key: "memslot".into(),
                reports: result.reports.clone(),
            })?;
            if run.ops.len() != self.args.ops as usize {
                return Err(BenchError::Merge(format!(
                    "run `{}` did {} memslot changes of {} (the guest ended first)",
                    result.label,
                    run.ops.len(),
                    self.args.ops
                )));
            }
            rows.push(Row { mmu, mem, run });
        }
        let plot_path = output.plot_path("bench-memslot.svg");
        output.write_plot(&plot_path, |path| self.plot(path, &rows))?;
        if output.json {
            let results: Vec<JsonRow> = rows
                .iter()
                .map(|r| JsonRow {
                    mmu: r.mmu,
                    zap: r.run.zap.clone(),
                    mem_bytes: r.mem,
                    op_ms: r.run.op_ms(),
                    max_vcpu_stall_us: r.run.max_stall_us(),
                    pages_zapped: r.run.pages_zapped(),
                    lock_breaks: r.run.lock_breaks(),
                    refault_ms: r.run.refault_ms(),
                })
                .collect();
            return Ok(json_text(&JsonOut { results }));
        }
        let mut s = String::new();
        let _ = writeln!(s, "bench memslot (seed 003): {}", self.describe());
        let _ = writeln!(
            s,
            "{:<5} {:<5} {:>6} {:>10} {:>15} {:>13} {:>12} {:>12} {:>12} {:>8}",
            "mmu",
            "zap",
            "mem",
            "op ms",
            "max stall us",
            "pages zapped",
            "lock breaks",
            "refaults",
            "refault ms",
            "reloads"
        );
        for r in &rows {
            let _ = writeln!(
                s,
                "{:<5} {:<5} {:>6} {:>10.3} {:>15.1} {:>13} {:>12} {:>12} {:>12.3} {:>8}",
                r.mmu,
                r.run.zap,
                format_size(r.mem),
                r.run.op_ms(),
                r.run.max_stall_us(),
                r.run.pages_zapped(),
                r.run.lock_breaks(),
                r.run.mean(|o| o.refaults) as u64,
                r.run.refault_ms(),
                r.run.root_reloads
            );
        }
        let _ = writeln!(
            s,
            "seed 003 (KVM, 6 vCPUs, 2 GiB, real hardware): delete + re-add {SEED_003_BEFORE_MS} ms before, {SEED_003_AFTER_MS} ms after"
        );
        for mmu in self.args.mmus.iter().map(|&m| mmu_name(m)) {
            for &mem in &self.mems {
                let find = |zap: &str| {
                    rows.iter()
                        .find(|r| r.mmu == mmu && r.mem == mem && r.run.zap == zap)
                };
                if let (Some(slow), Some(fast)) = (find("slow"), find("fast")) {
                    let _ = writeln!(
                        s,
                        "{mmu} {}: longest vCPU stall slow/fast {:.1}x, op time slow/fast {:.2}x (seed 003: {:.2}x)",
                        format_size(mem),
                        slow.run.max_stall_us() / fast.run.max_stall_us().max(1e-9),
                        slow.run.op_ms() / fast.run.op_ms().max(1e-12),
                        SEED_003_BEFORE_MS / SEED_003_AFTER_MS
                    );
                }
            }
        }
        let _ = writeln!(
            s,
            "(op: the VMM's delete + re-add in virtual time; stall: the longest single wait of a vCPU behind a zap's lock hold or its root reload; refault: EPT violations (shadow: #PF exits) after each op, hv work + exit/entry, summed over vCPUs; means over {} ops)",
            self.args.ops
        );
        let _ = writeln!(s, "plot: {}", plot_path.display());
        Ok(s)
    }
}

/// The `--json` output (a struct, so the keys keep this order).
#[derive(Serialize)]
struct JsonOut {
    results: Vec<JsonRow>,
}

#[derive(Serialize)]
struct JsonRow {
    mmu: &'static str,
    zap: String,
    mem_bytes: u64,
    op_ms: f64,
    max_vcpu_stall_us: f64,
    pages_zapped: u64,
    lock_breaks: u64,
    refault_ms: f64,
}

/// One result row.
struct Row<'a> {
    mmu: &'static str,
    mem: u64,
    run: &'a MemslotRun,
}

/// The array the guest touches: seven eighths of guest memory, whole MiB
/// (the rest is the guest kernel's: its image, page tables, stacks).
fn array(mem: u64) -> u64 {
    (mem / 8 * 7) >> 20 << 20
}

impl MemslotBench {
    fn config(&self, mem: u64, mmu: MmuArg, zap: ZapMode) -> VmConfig {
        let a = &self.args;
        let mut config = VmConfig::default();
        let mut options = a.common.overcommit(SwapDeviceArg::Ssd);
        options.mmu = mmu;
        options.apply(&mut config);
        config.host_mem = None;
        config.vcpus = a.vcpus;
        config.mem_size = mem;
        config.seed = a.common.seed;
        config.zap = zap;
        // Two passes more than ops: op k follows pass k, and every op is
        // followed by a full pass that refaults the array.
        config.cmdline = format!(
            "seed={} -- touchloop -m {}M -p {}",
            a.common.seed,
            array(mem) >> 20,
            a.ops + 2
        );
        config
    }

    fn describe(&self) -> String {
        let a = &self.args;
        format!(
            "{} vCPUs, touchloop over 7/8 of guest memory, {} deletes + re-adds of a 2 MiB slot, one after each pass",
            a.vcpus, a.ops
        )
    }

    fn plot(&self, path: &std::path::Path, rows: &[Row]) -> Result<(), String> {
        let series = |value: fn(&MemslotRun) -> f64| -> Vec<plot::Series> {
            let mut out = Vec::new();
            for mmu in self.args.mmus.iter().map(|&m| mmu_name(m)) {
                for zap in ["slow", "fast"] {
                    out.push(plot::Series {
                        label: format!("{mmu} {zap}"),
                        points: rows
                            .iter()
                            .filter(|r| r.mmu == mmu && r.run.zap == zap)
                            .map(|r| ((r.mem >> 20) as f64, value(r.run)))
                            .collect(),
                    });
                }
            }
            out
        };
        plot::panels(
            path,
            "Seed 003: zap-all on memslot delete + re-add, slow and fast",
            &self.describe(),
            "guest memory (MiB, log scale)",
            &[
                plot::Panel {
                    y_label: "operation time (virtual ms)".into(),
                    series: series(MemslotRun::op_ms),
                    reference: Some((
                        format!("seed: {SEED_003_BEFORE_MS} ms before, {SEED_003_AFTER_MS} ms after (2 GiB)"),
                        vec![(2048.0, SEED_003_BEFORE_MS), (2048.0, SEED_003_AFTER_MS)],
                    )),
                },
                plot::Panel {
                    y_label: "longest vCPU stall (virtual us)".into(),
                    series: series(MemslotRun::max_stall_us),
                    reference: None,
                },
            ],
        )
    }
}
