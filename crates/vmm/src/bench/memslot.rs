//! `bench memslot`: seed 003 (delete and re-add a memslot while 6 vCPUs
//! run over 2 GiB of touched guest memory; zap-all slow and fast), with
//! the memslot changes of [`crate::memslot_churn`] that `faultline run
//! --memslot-period` makes too.

use super::seeds::Comparison;
use super::{json_text, Bench, BenchError, Output, RunResult, RunSpec};
use crate::config::{ConfigError, Kernel};
use crate::memslot_churn::{ChurnTrigger, MemslotRun};
use crate::units::format_size;
use crate::{plot, BenchCommon, MemslotBenchArgs, MmuArg, SwapDeviceArg};
use hv::{VmConfig, ZapMode};
use serde::Serialize;
use std::fmt::Write as _;

/// The seed's delete + re-add time, before and after (6 vCPUs, 2 GiB).
pub const SEED_003_BEFORE_MS: f64 = 46.1;
pub const SEED_003_AFTER_MS: f64 = 21.6;

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
                for zap in self.zaps() {
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

    fn comparisons(&self, results: &[RunResult]) -> Result<Vec<Comparison>, BenchError> {
        let mut out = Vec::new();
        let zaps = self.zaps();
        for (i, group) in results.chunks(zaps.len()).enumerate() {
            let mmus = &self.args.mmus;
            let mem = self.mems[i / mmus.len()];
            let mmu = mmu_name(mmus[i % mmus.len()]);
            let run = |mode: ZapMode| {
                zaps.iter()
                    .position(|&z| z == mode)
                    .and_then(|k| group.get(k))
                    .and_then(|r| r.memslot.as_ref())
            };
            if let (Some(slow), Some(seed)) = (run(ZapMode::Slow), run(ZapMode::Seed)) {
                out.push(
                    Comparison::measured(
                        "003.memslot.slow_over_seed",
                        format!("{} vCPUs, {}, {mmu}", self.args.vcpus, format_size(mem)),
                        slow.op_ms() / seed.op_ms().max(1e-12),
                    )
                    .because(format!(
                        "the operation is {:.3} ms slow and {:.3} ms with the seed's v2 (roots zapped, hash table and rmaps zeroed under the lock, old pages freed after it): {}",
                        slow.op_ms(),
                        seed.op_ms(),
                        seed_gap_cause(slow, seed)
                    )),
                );
            }
            let (Some(slow), Some(fast)) = (run(ZapMode::Slow), run(ZapMode::Fast)) else {
                continue;
            };
            out.push(
                Comparison::measured(
                    "003.memslot.slow_over_fast",
                    format!("{} vCPUs, {}, {mmu}", self.args.vcpus, format_size(mem)),
                    slow.op_ms() / fast.op_ms().max(1e-12),
                )
                .because(format!(
                    "the operation is {:.3} ms slow and {:.3} ms fast: faultline builds the fast zap KVM merged (generation number, zap in batches with lock breaks), not the seed's v2, so the gain is the longest vCPU stall, slow / fast {:.1}x",
                    slow.op_ms(),
                    fast.op_ms(),
                    slow.max_stall_us() / fast.max_stall_us().max(1e-9)
                )),
            );
        }
        Ok(out)
    }

    fn render(&self, results: &[RunResult], output: &Output) -> Result<String, BenchError> {
        let mut rows = Vec::new();
        let per_mmu = self.zaps().len();
        for (i, result) in results.iter().enumerate() {
            let mmus = &self.args.mmus;
            let mem = self.mems[i / (per_mmu * mmus.len())];
            let mmu = mmu_name(mmus[i / per_mmu % mmus.len()]);
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
                if let (Some(slow), Some(seed)) = (find("slow"), find("seed")) {
                    let _ = writeln!(
                        s,
                        "{mmu} {}: op time slow/seed {:.2}x ({:.3} -> {:.3} ms; seed 003's v2: {SEED_003_BEFORE_MS} -> {SEED_003_AFTER_MS} ms, {:.2}x)",
                        format_size(mem),
                        slow.run.op_ms() / seed.run.op_ms().max(1e-12),
                        slow.run.op_ms(),
                        seed.run.op_ms(),
                        SEED_003_BEFORE_MS / SEED_003_AFTER_MS
                    );
                }
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

/// Why the seed's v2 gains what it does here: the per-entry teardown it
/// skips against the rmap zeroing it adds, both from the cost table.
fn seed_gap_cause(slow: &MemslotRun, seed: &MemslotRun) -> String {
    format!(
        "slow tears down {} pages entry by entry; the seed's v2 frees them after the lock with no per-entry work but zeroes {} KiB of rmaps and hash table under it; faultline's operation time is the zap alone, while the seed's timed ioctl also did the memslot update common to both (not modelled), which narrows its ratio",
        slow.pages_zapped(),
        seed.seed_bytes_zeroed() >> 10
    )
}

/// The array the guest touches: seven eighths of guest memory, whole MiB
/// (the rest is the guest kernel's: its image, page tables, stacks).
fn array(mem: u64) -> u64 {
    (mem / 8 * 7) >> 20 << 20
}

impl MemslotBench {
    /// The zap modes each MMU runs, in `--zaps` order.
    fn zaps(&self) -> Vec<ZapMode> {
        self.args.zaps.iter().map(|&z| ZapMode::from(z)).collect()
    }

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
                for zap in self.zaps().into_iter().map(ZapMode::name) {
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
            "Seed 003: zap-all on memslot delete + re-add, by zap mode",
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
