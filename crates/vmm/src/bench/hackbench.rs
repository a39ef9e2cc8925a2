//! `bench hackbench`: seed 004's second benchmark. The guest's
//! `hackbench N` runs N groups of 20 sender and 20 receiver processes over
//! pipes (every sender writes 100 messages of 100 bytes to each receiver
//! of its group), so with 40N address spaces on a few vCPUs almost every
//! context switch changes CR3. The rows are `bench ctxsw`'s: native (no
//! memory virtualisation), EPT, shadow paging with no root cache, with
//! KVM's `prev_roots`, and with the paravirtual CR3 cache of 4 and of 16
//! targets. What separates them is the work a CR3 switch costs each:
//! with 40 or 200 address spaces a 4-entry cache misses more often than a
//! 16-entry one, which is where "only 4 entries" (the seed) shows.
//!
//! `--guest linux` runs the Linux build (`guest/linux/hackbench.c`: forked
//! processes, the same loops) in Debian's kernel under the rows Linux can
//! run (`ctxsw::rows_with`: EPT, shadow, shadow with `prev_roots`; with
//! `--kvm-2007`, the 2007 trunk without the cache).

use super::ctxsw::{self, Row, LINUX_ROWS_NOTE};
use super::seeds::Comparison;
use super::{json_text, result_for, Bench, BenchError, BenchGuest, Output, RunResult, RunSpec};
use crate::config::{ConfigError, Kernel};
use crate::plot::{self, Bar};
use crate::{BenchCommon, HackbenchBenchArgs, SwapDeviceArg};
use hv::VmConfig;
use serde_json::json;
use std::fmt::Write as _;

/// The seed's hackbench figures in seconds, for 1 and 5 groups, by row:
/// native, KVM trunk (shadow, no root cache), KVM with the CR3 cache.
fn seed_seconds(row: &str, groups: u32) -> Option<f64> {
    match (row, groups) {
        ("native", 1) => Some(0.25),
        ("native", 5) => Some(0.9),
        ("shadow", 1) => Some(0.55),
        ("shadow", 5) => Some(2.8),
        ("shadow-cr3-cache-4", 1) => Some(0.36),
        ("shadow-cr3-cache-4", 5) => Some(2.2),
        // The seed's "KVM trunk" and "paravirt/cr3" rows are these
        // (`--kvm-2007`), like for like.
        ("shadow-trunk-2007", 1) => Some(0.55),
        ("shadow-trunk-2007", 5) => Some(2.8),
        ("shadow-trunk-2007-cr3-cache-4", 1) => Some(0.36),
        ("shadow-trunk-2007-cr3-cache-4", 5) => Some(2.2),
        _ => None,
    }
}

pub struct HackbenchBench {
    args: HackbenchBenchArgs,
    base: VmConfig,
    guest: BenchGuest,
}

/// One run's figures.
struct Measured {
    row: Row,
    groups: u32,
    seconds: f64,
    run: RunResult,
}

fn label(row: &Row, groups: u32) -> String {
    format!("{}-g{}", row.name, groups)
}

impl Bench for HackbenchBench {
    const NAME: &'static str = "hackbench";
    type Params = HackbenchBenchArgs;

    fn new(args: HackbenchBenchArgs) -> HackbenchBench {
        let mut base = VmConfig::default();
        args.common.overcommit(SwapDeviceArg::Nvme).apply(&mut base);
        base.host_mem = None;
        base.vcpus = args.vcpus;
        base.mem_size = args.mem;
        let guest = BenchGuest::new(&args.guest);
        HackbenchBench { args, base, guest }
    }

    fn params(&self) -> &HackbenchBenchArgs {
        &self.args
    }

    fn common(&self) -> &BenchCommon {
        &self.args.common
    }

    fn check(&self, kernel: &Kernel) -> Result<(), ConfigError> {
        self.guest
            .check(kernel, "hackbench", self.base.mem_size, None)
    }

    fn specs(&self) -> Vec<RunSpec> {
        let mut specs = Vec::new();
        for &groups in &self.args.groups {
            for row in &ctxsw::rows_with(&self.guest, self.args.kvm_2007) {
                let mut config = self.base.clone();
                config.seed = self.args.common.seed;
                row.apply(&mut config);
                let program = [
                    "hackbench".to_string(),
                    groups.to_string(),
                    "-l".into(),
                    self.args.loops.to_string(),
                ];
                config.cmdline = self.guest.cmdline(self.args.common.seed, &program);
                specs.push(self.guest.spec(label(row, groups), config));
            }
        }
        specs
    }

    fn render(&self, results: &[RunResult], output: &Output) -> Result<String, BenchError> {
        let mut rows = Vec::new();
        for &groups in &self.args.groups {
            for row in &ctxsw::rows_with(&self.guest, self.args.kvm_2007) {
                let name = label(row, groups);
                let run = result_for(results, &name)?;
                rows.push(Measured {
                    row: *row,
                    groups,
                    seconds: run.require("hackbench_ns")? as f64 / 1e9,
                    run: run.clone(),
                });
            }
        }
        let seconds = |name: &str, groups: u32| {
            rows.iter()
                .find(|m| m.row.name == name && m.groups == groups)
                .map_or(f64::NAN, |m| m.seconds)
        };
        let plot_path = output.plot_path("bench-hackbench.svg");
        // One panel per group count; each bar is the row's time over
        // the native row's (the Linux guest, which has no native row:
        // over EPT's), the seed's ratio as a mark.
        let base = if self.guest.is_linux() {
            "ept"
        } else {
            "native"
        };
        let panels: Vec<(String, Vec<Bar>)> = self
            .args
            .groups
            .iter()
            .map(|&g| {
                let bars = rows
                    .iter()
                    .filter(|m| m.groups == g)
                    .map(|m| Bar {
                        label: m
                            .row
                            .name
                            .trim_start_matches("shadow-")
                            .trim_start_matches("cr3-")
                            .to_string(),
                        value: m.seconds / seconds(base, g),
                        reference: match (seed_seconds(m.row.name, g), seed_seconds(base, g)) {
                            (Some(s), Some(b)) => Some(s / b),
                            _ => None,
                        },
                        note: String::new(),
                    })
                    .collect();
                (format!("hackbench {g}"), bars)
            })
            .collect();
        output.write_plot(&plot_path, |path| {
            plot::bar_panels(
                path,
                "Seed 004: hackbench by MMU",
                &self.describe(),
                &format!("time / {base} time"),
                "seed 004 (2007 KVM)",
                &panels,
            )
        })?;
        if output.json {
            let results: Vec<serde_json::Value> = rows
                .iter()
                .map(|m| {
                    json!({
                        "config": m.row.name,
                        "groups": m.groups,
                        "seconds": m.seconds,
                        "cr3_exits": m.run.mmu.cr3_load_exits,
                        "roots_built": m.run.mmu.roots_built,
                        "tlb_misses": m.run.mmu.tlb_misses,
                        "page_walk_refs": m.run.mmu.page_walk_refs,
                        "cr3_cache_hits": m.run.value("cr3_cache_hits"),
                        "cr3_cache_misses": m.run.value("cr3_cache_misses"),
                        "seed_seconds": seed_seconds(m.row.name, m.groups),
                        "counters": m.run.counters(),
                    })
                })
                .collect();
            let ratios: Vec<serde_json::Value> = self
                .args
                .groups
                .iter()
                .map(|&g| {
                    let mut ratios = json!({
                        "groups": g,
                        "shadow_vs_native": seconds("shadow", g) / seconds("native", g),
                        "cache4_vs_native": seconds("shadow-cr3-cache-4", g) / seconds("native", g),
                        "cache16_vs_native": seconds("shadow-cr3-cache-16", g) / seconds("native", g),
                        "shadow_vs_cache4": seconds("shadow", g) / seconds("shadow-cr3-cache-4", g),
                        "cache4_vs_cache16": seconds("shadow-cr3-cache-4", g) / seconds("shadow-cr3-cache-16", g),
                        "shadow_vs_ept": seconds("shadow", g) / seconds("ept", g),
                        "prev_roots_vs_shadow": seconds("shadow-prev-roots", g) / seconds("shadow", g),
                    });
                    if self.args.kvm_2007 && !self.guest.is_linux() {
                        ratios["trunk2007_vs_trunk2007_cache4"] = json!(
                            seconds("shadow-trunk-2007", g)
                                / seconds("shadow-trunk-2007-cr3-cache-4", g)
                        );
                    }
                    ratios
                })
                .collect();
            let out = json!({
                "benchmark": "hackbench",
                "not_run": self.guest.is_linux().then_some(LINUX_ROWS_NOTE),
                "config": {"guest": self.guest.name(), "linux_version": self.guest.linux_version(), "groups": self.args.groups, "loops": self.args.loops,
                           "vcpus": self.args.vcpus, "mem_bytes": self.args.mem,
                           "seed": self.args.common.seed},
                "results": results,
                "ratios": ratios,
                "plot": output.plot_json(&plot_path),
            });
            return Ok(json_text(&out));
        }
        let mut s = String::new();
        let _ = writeln!(s, "bench hackbench (seed 004): {}", self.describe());
        // The 2007 rows' names are longer than the column the others fit.
        let w = if self.args.kvm_2007 { 29 } else { 20 };
        let _ = writeln!(
            s,
            "{:<w$} {:>6} {:>10} {:>10} {:>11} {:>12} {:>12} {:>13} {:>9}",
            "",
            "groups",
            "seconds",
            "CR3 exits",
            "roots built",
            "TLB misses",
            "walk refs",
            "cache hit/miss",
            "seed (s)"
        );
        for m in &rows {
            let cache = match (
                m.run.value("cr3_cache_hits"),
                m.run.value("cr3_cache_misses"),
            ) {
                (Some(h), Some(x)) => format!("{h}/{x}"),
                _ => "-".to_string(),
            };
            let _ = writeln!(
                s,
                "{:<w$} {:>6} {:>10.4} {:>10} {:>11} {:>12} {:>12} {:>13} {:>9}",
                m.row.name,
                m.groups,
                m.seconds,
                m.run.mmu.cr3_load_exits,
                m.run.mmu.roots_built,
                m.run.mmu.tlb_misses,
                m.run.mmu.page_walk_refs,
                cache,
                seed_seconds(m.row.name, m.groups).map_or("-".to_string(), |u| format!("{u:.2}"))
            );
        }
        if self.guest.is_linux() {
            for &g in &self.args.groups {
                let _ = writeln!(
                    s,
                    "{g} group(s): shadow / ept {:.2}x, shadow-prev-roots / shadow {:.2}x{}",
                    seconds("shadow", g) / seconds("ept", g),
                    seconds("shadow-prev-roots", g) / seconds("shadow", g),
                    match (seed_seconds("native", g), seed_seconds("shadow", g)) {
                        (Some(n), Some(sh)) =>
                            format!(" (seed: shadow {sh} s, native {n} s, KVM of 2007 without EPT)"),
                        _ => String::new(),
                    }
                );
            }
            let _ = writeln!(s, "{LINUX_ROWS_NOTE}");
        } else {
            for &g in &self.args.groups {
                let native = seconds("native", g);
                let _ = writeln!(
                    s,
                    "{g} group(s): shadow / native {:.2}x, cache-4 / native {:.2}x, cache-16 / native {:.2}x, shadow / cache-4 {:.2}x, cache-4 / cache-16 {:.2}x{}",
                    seconds("shadow", g) / native,
                    seconds("shadow-cr3-cache-4", g) / native,
                    seconds("shadow-cr3-cache-16", g) / native,
                    seconds("shadow", g) / seconds("shadow-cr3-cache-4", g),
                    seconds("shadow-cr3-cache-4", g) / seconds("shadow-cr3-cache-16", g),
                    match (seed_seconds("native", g), seed_seconds("shadow", g), seed_seconds("shadow-cr3-cache-4", g)) {
                        (Some(n), Some(sh), Some(c)) => format!(
                            " (seed: shadow / native {:.2}x, cache-4 / native {:.2}x, shadow / cache-4 {:.2}x)",
                            sh / n,
                            c / n,
                            sh / c
                        ),
                        _ => String::new(),
                    }
                );
                if self.args.kvm_2007 {
                    let _ = writeln!(
                        s,
                        "{g} group(s): 2007 trunk / 2007 trunk + cache-4 {:.2}x{}",
                        seconds("shadow-trunk-2007", g)
                            / seconds("shadow-trunk-2007-cr3-cache-4", g),
                        match (
                            seed_seconds("shadow", g),
                            seed_seconds("shadow-cr3-cache-4", g)
                        ) {
                            (Some(sh), Some(c)) => format!(" (seed {:.2}x)", sh / c),
                            _ => String::new(),
                        }
                    );
                }
            }
        }
        let _ = writeln!(s, "plot: {}", plot_path.display());
        Ok(s)
    }

    fn comparisons(&self, results: &[RunResult]) -> Result<Vec<Comparison>, BenchError> {
        let mut out = Vec::new();
        let mut pairs = vec![
            (
                1,
                "004.hackbench.g1_shadow_over_cache4",
                "shadow",
                "shadow-cr3-cache-4",
            ),
            (
                5,
                "004.hackbench.g5_shadow_over_cache4",
                "shadow",
                "shadow-cr3-cache-4",
            ),
        ];
        if self.args.kvm_2007 {
            pairs.extend([
                (
                    1,
                    "004.hackbench.g1_trunk2007_over_trunk2007_cache4",
                    "shadow-trunk-2007",
                    "shadow-trunk-2007-cr3-cache-4",
                ),
                (
                    5,
                    "004.hackbench.g5_trunk2007_over_trunk2007_cache4",
                    "shadow-trunk-2007",
                    "shadow-trunk-2007-cr3-cache-4",
                ),
            ]);
        }
        for (groups, key, without, with) in pairs {
            let setup = format!("{}, {groups} group(s)", self.describe());
            if self.guest.is_linux() {
                out.push(Comparison::not_run(key, setup, LINUX_ROWS_NOTE));
                continue;
            }
            if !self.args.groups.contains(&groups) {
                out.push(Comparison::not_run(
                    key,
                    setup,
                    format!("{groups} group(s) not in --groups"),
                ));
                continue;
            }
            let run = |name: &str| result_for(results, &label(&ctxsw_row(name), groups));
            let seconds = |name: &str| -> Result<f64, BenchError> {
                Ok(run(name)?.require("hackbench_ns")? as f64)
            };
            let cache = run(with)?;
            let (hits, misses) = (
                cache.value("cr3_cache_hits").unwrap_or(0),
                cache.value("cr3_cache_misses").unwrap_or(0),
            );
            out.push(
                Comparison::measured(
                    key,
                    setup,
                    seconds(without)? / seconds(with)?,
                )
                .because(format!(
                    "the CR3 cache of 4 hits {:.1} % of CR3 loads ({hits} of {}); CR3-load exits: {} {}, {} {}; the cost an exit removes is not measured apart",
                    hits as f64 * 100.0 / (hits + misses).max(1) as f64,
                    hits + misses,
                    without.trim_start_matches("shadow-"),
                    run(without)?.mmu.cr3_load_exits,
                    with.trim_start_matches("shadow-").replace("cr3-cache-", "cache-"),
                    cache.mmu.cr3_load_exits
                )),
            );
        }
        Ok(out)
    }
}

/// The row of `bench ctxsw` named `name`.
fn ctxsw_row(name: &str) -> Row {
    ctxsw::ROWS
        .iter()
        .chain(&ctxsw::ROWS_2007)
        .find(|r| r.name == name)
        .copied()
        .unwrap_or(ctxsw::ROWS[0])
}

impl HackbenchBench {
    fn describe(&self) -> String {
        format!(
            "{}hackbench N -l {} (N groups of 20 senders + 20 receivers, processes over pipes), {} vCPU(s), {} MiB",
            self.guest.describe_prefix(),
            self.args.loops,
            self.args.vcpus,
            self.args.mem >> 20
        )
    }
}
