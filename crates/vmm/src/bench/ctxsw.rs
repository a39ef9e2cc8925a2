//! `bench ctxsw`: seed 004's 2-task context switch (`ctxsw`: two processes
//! ping-pong a byte through pipes on one vCPU, every switch a change of
//! address space) under each way of virtualising memory: EPT, shadow paging
//! with no root cache, with KVM's `prev_roots`, and with the paravirtual
//! CR3 cache of 4 and of 16 targets, beside the native row.
//!
//! What separates the shadow rows is what the cost model charges for the
//! exits and root switches a cache removes: a CR3-load exit is the
//! machine's VM exit + entry (`machine::cost`: 600 + 600 cycles, with the
//! measurements it rests on cited there) plus the hv's dispatch
//! (`hv::cost::exit_base`, 300), the root lookup under `mmu_lock` and the
//! INVVPID (`hv::cost::invvpid`); the TLB flush a non-PCID CR3 load
//! implies is the machine's on every row (with or without an exit), and
//! its refill is charged by the page walks (the `walk refs` column: 2-D
//! under EPT, which the machine charges in full, with no paging-structure
//! caches). Nothing here is tuned to the seed's figures, which are shown
//! beside for comparison.
//!
//! The **native** row runs the same guest with no memory virtualisation
//! (`MmuMode::Native`, `--mmu none`): guest RAM is host-physical memory
//! from 0, EPT off, nothing shadowed, so TLB misses walk one dimension and
//! a MOV to CR3 never exits.
//!
//! `--guest linux` runs the Linux build (`guest/linux/ctxsw.c`: a forked
//! partner, both pinned to the one vCPU) in Debian's kernel under EPT,
//! shadow paging and shadow with `prev_roots`. The CR3 cache rows need a
//! guest that speaks its paravirtual interface (faultline's own) and the
//! native row is the project guest's baseline: neither runs in Linux, and
//! the output says so.

use super::seeds::Comparison;
use super::{json_text, result_for, Bench, BenchError, BenchGuest, Output, RunResult, RunSpec};
use crate::config::{ConfigError, Kernel};
use crate::plot::{self, Bar};
use crate::{BenchCommon, CtxswBenchArgs, SwapDeviceArg};
use hv::{MmuMode, VmConfig};
use serde_json::json;
use std::fmt::Write as _;

/// Seed 004's 2-task context switch, in microseconds.
pub const SEED_004_NATIVE_US: f64 = 1.11;
/// KVM trunk of January 2007: shadow paging, no root cache.
pub const SEED_004_SHADOW_US: f64 = 6.36;
/// KVM trunk with the paravirtual CR3 cache (4 targets).
pub const SEED_004_CR3_CACHE_US: f64 = 1.60;

/// One row: how memory is virtualised (`bench hackbench` has the same).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Row {
    pub name: &'static str,
    pub mmu: MmuMode,
    pub prev_roots: usize,
    /// Written guest leaf tables may go unsync (off: KVM's trunk of
    /// January 2007, every write to a shadowed guest table emulated).
    pub unsync: bool,
    /// CR3 targets of the CR3 cache; `None`: no cache.
    pub cr3_targets: Option<usize>,
    /// The seed's figure for the comparable configuration.
    pub seed_us: Option<f64>,
}

impl Row {
    /// `base` set up for this row.
    pub fn apply(&self, config: &mut VmConfig) {
        config.mmu = self.mmu;
        config.shadow_prev_roots = self.prev_roots;
        config.shadow_unsync = self.unsync;
        config.cr3_cache = self.cr3_targets.is_some();
        config.cr3_targets = self.cr3_targets.unwrap_or(VmConfig::default().cr3_targets);
    }
}

pub(super) const ROWS: [Row; 6] = [
    Row {
        name: "native",
        mmu: MmuMode::Native,
        prev_roots: 0,
        unsync: true,
        cr3_targets: None,
        seed_us: Some(SEED_004_NATIVE_US),
    },
    Row {
        name: "ept",
        mmu: MmuMode::Ept,
        prev_roots: 0,
        unsync: true,
        cr3_targets: None,
        seed_us: None,
    },
    Row {
        name: "shadow",
        mmu: MmuMode::Shadow,
        prev_roots: 0,
        unsync: true,
        cr3_targets: None,
        seed_us: Some(SEED_004_SHADOW_US),
    },
    Row {
        name: "shadow-prev-roots",
        mmu: MmuMode::Shadow,
        prev_roots: 3,
        unsync: true,
        cr3_targets: None,
        seed_us: None,
    },
    Row {
        name: "shadow-cr3-cache-4",
        mmu: MmuMode::Shadow,
        prev_roots: 0,
        unsync: true,
        cr3_targets: Some(4),
        seed_us: Some(SEED_004_CR3_CACHE_US),
    },
    Row {
        name: "shadow-cr3-cache-16",
        mmu: MmuMode::Shadow,
        prev_roots: 0,
        unsync: true,
        cr3_targets: Some(16),
        seed_us: None,
    },
];

/// Seed 004's own 2007 configurations (`--kvm-2007`): KVM's trunk of
/// January 2007, which the seed compares against (the "Cache shadow page
/// tables" series: a CR3 load exits and finds the root in the shadow page
/// hash, guest page tables stay write-protected and every write to one
/// is emulated: no unsync pages, no `prev_roots`), without and with the
/// CR3 cache of 4 targets.
pub(super) const ROWS_2007: [Row; 2] = [
    Row {
        name: "shadow-trunk-2007",
        mmu: MmuMode::Shadow,
        prev_roots: 0,
        unsync: false,
        cr3_targets: None,
        seed_us: Some(SEED_004_SHADOW_US),
    },
    Row {
        name: "shadow-trunk-2007-cr3-cache-4",
        mmu: MmuMode::Shadow,
        prev_roots: 0,
        unsync: false,
        cr3_targets: Some(4),
        seed_us: Some(SEED_004_CR3_CACHE_US),
    },
];

/// The rows a guest runs: all of them in the project's guest; in Linux
/// those that need nothing of the guest (EPT, shadow, shadow with
/// `prev_roots`, the 2007 trunk without the cache). `kvm_2007` adds
/// [`ROWS_2007`].
pub(super) fn rows_with(guest: &BenchGuest, kvm_2007: bool) -> Vec<Row> {
    let extra: &[Row] = if kvm_2007 { &ROWS_2007 } else { &[] };
    ROWS.iter()
        .chain(extra)
        .filter(|row| {
            !guest.is_linux() || (row.cr3_targets.is_none() && row.mmu != MmuMode::Native)
        })
        .copied()
        .collect()
}

/// What a Linux run of `bench ctxsw` or `bench hackbench` leaves out, and
/// why (printed with the results).
pub(super) const LINUX_ROWS_NOTE: &str = "Linux: no CR3 cache rows (the paravirtual CR3 cache needs a guest that speaks it: faultline's own) and no native row (the project guest's baseline)";

pub struct CtxswBench {
    args: CtxswBenchArgs,
    base: VmConfig,
    guest: BenchGuest,
}

/// One row's figures.
struct Measured {
    row: Row,
    switch_ns: u64,
    run: RunResult,
}

impl Bench for CtxswBench {
    const NAME: &'static str = "ctxsw";
    type Params = CtxswBenchArgs;

    fn new(args: CtxswBenchArgs) -> CtxswBench {
        let mut base = VmConfig::default();
        args.common.overcommit(SwapDeviceArg::Nvme).apply(&mut base);
        let guest = BenchGuest::new(&args.guest);
        CtxswBench { args, base, guest }
    }

    fn params(&self) -> &CtxswBenchArgs {
        &self.args
    }

    fn common(&self) -> &BenchCommon {
        &self.args.common
    }

    fn check(&self, kernel: &Kernel) -> Result<(), ConfigError> {
        self.guest.check(kernel, "ctxsw", self.base.mem_size, None)
    }

    fn specs(&self) -> Vec<RunSpec> {
        rows_with(&self.guest, self.args.kvm_2007)
            .iter()
            .map(|row| self.guest.spec(row.name, self.config(row)))
            .collect()
    }

    fn render(&self, results: &[RunResult], output: &Output) -> Result<String, BenchError> {
        let rows = rows_with(&self.guest, self.args.kvm_2007)
            .iter()
            .map(|row| {
                let run = result_for(results, row.name)?;
                Ok(Measured {
                    row: *row,
                    switch_ns: run.require("ctxsw_switch_ns")?,
                    run: run.clone(),
                })
            })
            .collect::<Result<Vec<_>, BenchError>>()?;
        let us = |name: &str| {
            rows.iter()
                .find(|m| m.row.name == name)
                .map_or(f64::NAN, |m| m.switch_ns as f64 / 1000.0)
        };
        let (native, ept, shadow, cache4, prev) = (
            us("native"),
            us("ept"),
            us("shadow"),
            us("shadow-cr3-cache-4"),
            us("shadow-prev-roots"),
        );
        let (trunk, trunk_cache4) = (us("shadow-trunk-2007"), us("shadow-trunk-2007-cr3-cache-4"));
        let plot_path = output.plot_path("bench-ctxsw.svg");
        // Each row's time over the native row's (in Linux, which has no
        // native row: over EPT's), the seed's ratio to native as a mark:
        // the seed's 2007 microseconds would dwarf the bars.
        let (base, base_us) = if self.guest.is_linux() {
            ("ept", ept)
        } else {
            ("native", native)
        };
        let bars: Vec<Bar> = rows
            .iter()
            .map(|m| Bar {
                label: m.row.name.trim_start_matches("shadow-").to_string(),
                value: m.switch_ns as f64 / 1000.0 / base_us,
                reference: m
                    .row
                    .seed_us
                    .filter(|_| base == "native")
                    .map(|s| s / SEED_004_NATIVE_US),
                note: format!("{:.2} us", m.switch_ns as f64 / 1000.0),
            })
            .collect();
        output.write_plot(&plot_path, |path| {
            plot::bars(
                path,
                "Seed 004: 2-task context switch by MMU",
                &self.describe(),
                &format!("time per switch / {base}'s"),
                "seed 004 (2007 KVM), over its native",
                &bars,
            )
        })?;
        let seed_shadow_ratio = SEED_004_SHADOW_US / SEED_004_NATIVE_US;
        let seed_cache_ratio = SEED_004_CR3_CACHE_US / SEED_004_NATIVE_US;
        if output.json {
            let results: Vec<serde_json::Value> = rows
                .iter()
                .map(|m| {
                    json!({
                        "config": m.row.name,
                        "switch_us": m.switch_ns as f64 / 1000.0,
                        "cr3_exits": m.run.mmu.cr3_load_exits,
                        "roots_built": m.run.mmu.roots_built,
                        "tlb_misses": m.run.mmu.tlb_misses,
                        "page_walk_refs": m.run.mmu.page_walk_refs,
                        "seed_switch_us": m.row.seed_us,
                        "counters": m.run.counters(),
                    })
                })
                .collect();
            let mut out = json!({
                "benchmark": "ctxsw",
                "config": {"guest": self.guest.name(), "linux_version": self.guest.linux_version(), "rounds": self.args.rounds, "seed": self.args.common.seed},
                "not_run": self.guest.is_linux().then_some(LINUX_ROWS_NOTE),
                "results": results,
                "ratios": {
                    "cache4_vs_ept": cache4 / ept,
                    "shadow_vs_cache4": shadow / cache4,
                    "shadow_vs_native": shadow / native,
                    "cache4_vs_native": cache4 / native,
                    "ept_vs_native": ept / native,
                    "shadow_vs_ept": shadow / ept,
                    "prev_roots_vs_shadow": prev / shadow,
                    "seed_shadow_vs_native": seed_shadow_ratio,
                    "seed_cache_vs_native": seed_cache_ratio,
                },
                "seed": {"native_us": SEED_004_NATIVE_US, "shadow_us": SEED_004_SHADOW_US,
                         "cr3_cache_us": SEED_004_CR3_CACHE_US},
                "plot": output.plot_json(&plot_path),
            });
            if self.args.kvm_2007 && !self.guest.is_linux() {
                let ratios = out["ratios"].as_object_mut().expect("an object");
                ratios.insert(
                    "trunk2007_vs_trunk2007_cache4".into(),
                    json!(trunk / trunk_cache4),
                );
                ratios.insert("trunk2007_vs_native".into(), json!(trunk / native));
                ratios.insert("trunk2007_vs_shadow".into(), json!(trunk / shadow));
            }
            return Ok(json_text(&out));
        }
        let mut s = String::new();
        let _ = writeln!(s, "bench ctxsw (seed 004): {}", self.describe());
        // The 2007 rows' names are longer than the column the others fit.
        let w = if self.args.kvm_2007 { 29 } else { 20 };
        let _ = writeln!(
            s,
            "{:<w$} {:>12} {:>10} {:>11} {:>11} {:>11} {:>10}",
            "", "us/switch", "CR3 exits", "roots built", "TLB misses", "walk refs", "seed (us)"
        );
        for m in &rows {
            let _ = writeln!(
                s,
                "{:<w$} {:>12.3} {:>10} {:>11} {:>11} {:>11} {:>10}",
                m.row.name,
                m.switch_ns as f64 / 1000.0,
                m.run.mmu.cr3_load_exits,
                m.run.mmu.roots_built,
                m.run.mmu.tlb_misses,
                m.run.mmu.page_walk_refs,
                m.row.seed_us.map_or("-".to_string(), |u| format!("{u:.2}"))
            );
        }
        if self.guest.is_linux() {
            let _ = writeln!(
                s,
                "shadow / ept {:.2}x; shadow-prev-roots / shadow {:.2}x (seed: shadow {SEED_004_SHADOW_US} us, native {SEED_004_NATIVE_US} us, KVM of 2007 without EPT)",
                shadow / ept,
                prev / shadow
            );
            let _ = writeln!(s, "{LINUX_ROWS_NOTE}");
        } else {
            let _ = writeln!(
                s,
                "cache-4 / ept {:.2}x; shadow / cache-4 {:.2}x (seed {:.2}x); shadow / native {:.2}x (seed {:.1}x); cache-4 / native {:.2}x (seed {:.2}x); ept / native {:.2}x",
                cache4 / ept,
                shadow / cache4,
                SEED_004_SHADOW_US / SEED_004_CR3_CACHE_US,
                shadow / native,
                seed_shadow_ratio,
                cache4 / native,
                seed_cache_ratio,
                ept / native
            );
            if self.args.kvm_2007 {
                let _ = writeln!(
                    s,
                    "2007 trunk / 2007 trunk + cache-4 {:.2}x (seed 004: {SEED_004_SHADOW_US} -> {SEED_004_CR3_CACHE_US} us, {:.2}x); 2007 trunk / native {:.2}x (seed {:.1}x); 2007 trunk / shadow {:.2}x",
                    trunk / trunk_cache4,
                    SEED_004_SHADOW_US / SEED_004_CR3_CACHE_US,
                    trunk / native,
                    seed_shadow_ratio,
                    trunk / shadow
                );
            }
        }
        let _ = writeln!(s, "plot: {}", plot_path.display());
        Ok(s)
    }

    fn comparisons(&self, results: &[RunResult]) -> Result<Vec<Comparison>, BenchError> {
        const SHADOW_OVER_CACHE: &str = "004.ctxsw.shadow_over_cache4";
        const CACHE_OVER_NATIVE: &str = "004.ctxsw.cache4_over_native";
        const TRUNK_OVER_CACHE: &str = "004.ctxsw.trunk2007_over_trunk2007_cache4";
        let setup = self.describe();
        if self.guest.is_linux() {
            return Ok([SHADOW_OVER_CACHE, CACHE_OVER_NATIVE]
                .map(|key| Comparison::not_run(key, &setup, LINUX_ROWS_NOTE))
                .to_vec());
        }
        let us = |name: &str| -> Result<f64, BenchError> {
            Ok(result_for(results, name)?.require("ctxsw_switch_ns")? as f64 / 1000.0)
        };
        let (native, shadow, cache4) = (us("native")?, us("shadow")?, us("shadow-cr3-cache-4")?);
        let seed_shadow_native = SEED_004_SHADOW_US / SEED_004_NATIVE_US;
        let mut out = vec![
            Comparison::measured(SHADOW_OVER_CACHE, &setup, shadow / cache4).because(format!(
                "the shadow row: shadow / native {:.2}x against the seed's {seed_shadow_native:.2}x (cache-4 / native {:.2}x against {:.2}x)",
                shadow / native,
                cache4 / native,
                SEED_004_CR3_CACHE_US / SEED_004_NATIVE_US
            )),
            Comparison::measured(CACHE_OVER_NATIVE, &setup, cache4 / native),
        ];
        if self.args.kvm_2007 {
            let (trunk, trunk_cache4) = (
                us("shadow-trunk-2007")?,
                us("shadow-trunk-2007-cr3-cache-4")?,
            );
            let run = result_for(results, "shadow-trunk-2007")?;
            let (exits, built) = (run.mmu.cr3_load_exits, run.mmu.roots_built);
            out.push(
                Comparison::measured(TRUNK_OVER_CACHE, &setup, trunk / trunk_cache4).because(
                    format!(
                        "the 2007 trunk row: {trunk:.3} us per switch, {:.2}x native against the seed's {seed_shadow_native:.2}x ({exits} CR3-load exits, {built} roots built); with the cache {trunk_cache4:.3} us, {:.2}x native against {:.2}x",
                        trunk / native,
                        trunk_cache4 / native,
                        SEED_004_CR3_CACHE_US / SEED_004_NATIVE_US
                    ),
                ),
            );
        }
        Ok(out)
    }
}

impl CtxswBench {
    fn config(&self, row: &Row) -> VmConfig {
        let mut config = self.base.clone();
        config.vcpus = 1;
        config.seed = self.args.common.seed;
        row.apply(&mut config);
        let program = [
            "ctxsw".to_string(),
            "-n".into(),
            self.args.rounds.to_string(),
        ];
        config.cmdline = self.guest.cmdline(self.args.common.seed, &program);
        config
    }

    fn describe(&self) -> String {
        format!(
            "{}ctxsw -n {} (2 processes, 1 vCPU, {} MiB)",
            self.guest.describe_prefix(),
            self.args.rounds,
            self.base.mem_size >> 20
        )
    }
}
