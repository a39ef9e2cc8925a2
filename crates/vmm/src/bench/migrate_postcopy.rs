//! `faultline bench migrate --postcopy`: seed 002's migration case. A
//! loaded guest (`apfcalc -c`: the seed's "testsuite", a writer thread
//! sweeping an array plus a calculation thread counting while it runs)
//! migrates by post-copy to a second faultline process on loopback, with
//! async page faults off and on (`--apf off`, `--apf pv`). For each mode:
//!
//! 1. the migration, to the guest's end: the post-copy figures (pages,
//!    requests, waits, time on the link), the source's total, the
//!    writer's time and the calculation count after the switch-over;
//! 2. the same migration with the destination stopped when the last page
//!    is in (virtual time): the guest instructions retired while pages
//!    were still coming (guest progress during the post-copy);
//! 3. the same guest without a migration, stopped at that same time, and
//!    run to its end: the instructions of the same window and the
//!    writer's time and count without a migration, beside.
//!
//! The seed measured its scenario (b) twice: with the calculation
//! thread (the loaded guest) and without it (`apfcalc` without `-c`: the
//! writer alone, which the seed found +13.6 % to +14.7 % slower with
//! async PF). The rows are both, each with async PF off and on. The
//! writer alone ends sooner, so the case without it migrates at the same
//! point of its run: `--at` scaled by the two guests' run times without a
//! migration (async PF off), to the microsecond.

use super::migrate::{faultline, json_of, migrate_once};
use super::seeds::{change_pct, Comparison};
use crate::plot;
use serde::Serialize;
use std::time::Duration;

/// Seed 002, scenario (b) (migrating the workload, calculation thread
/// on): total time with async PF against without, in %, over its five
/// runs (−5.4, −3.3, −5.5, −7.1, −4.4).
const SEED_002_TIME_PCT: (f64, f64) = (-7.1, -3.3);

/// The options of seed 002's case.
#[derive(Debug, Clone)]
pub struct PostcopyCase {
    pub json: bool,
    pub vcpus: u32,
    pub mem: u64,
    pub array: u64,
    pub loops: u64,
    pub at: Duration,
    pub link_bandwidth: u64,
    pub seed: u64,
    /// `--cost NAME=CYCLES` options for every run.
    pub costs: Vec<String>,
    pub plot: Option<std::path::PathBuf>,
}

/// One row: with or without the calculation thread, one async-PF mode.
#[derive(Debug, Clone, Serialize)]
pub struct PostcopyRow {
    /// The calculation thread runs (`apfcalc -c`).
    pub load: bool,
    pub apf: &'static str,
    /// When the migration started (virtual ms).
    pub at_ms: f64,
    /// Pages still at the source at the switch-over.
    pub pages: u64,
    pub requested: u64,
    pub waited: u64,
    pub wait_ms: f64,
    /// From the switch-over to the last page (virtual time).
    pub postcopy_ms: f64,
    /// The source's total: downtime + post-copy.
    pub total_ms: f64,
    /// Guest instructions retired from the switch-over to the last page,
    /// migrated and not.
    pub during_instructions: u64,
    pub during_instructions_unmigrated: u64,
    /// The writer's time and the calculation count (apfcalc), migrated
    /// and not.
    pub writer_ms: f64,
    pub calc: u64,
    pub writer_ms_unmigrated: f64,
    pub calc_unmigrated: u64,
    /// Page-not-present notifications at the destination's end.
    pub not_present: u64,
}

/// `key=value` from the guest's report lines.
fn report(v: &serde_json::Value, key: &str) -> Result<u64, String> {
    v["reports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["line"].as_str())
        .flat_map(|l| l.split_whitespace())
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        .ok_or_else(|| format!("the guest did not report {key}"))
}

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn ns_arg(d: Duration) -> String {
    format!("{}ns", d.as_nanos())
}

impl PostcopyCase {
    fn run_args(&self, load: bool, apf: &str, limit: Option<Duration>) -> Vec<String> {
        let mut args: Vec<String> = [
            "run",
            "--stats",
            "json",
            "--vcpus",
            &self.vcpus.to_string(),
            "--mem",
            &self.mem.to_string(),
            "--seed",
            &self.seed.to_string(),
            "--apf",
            apf,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(limit) = limit {
            args.extend(["--time-limit".to_string(), ns_arg(limit)]);
        }
        args.extend(self.costs.iter().cloned());
        args.extend(
            format!("-- apfcalc -m {}M -l {}", self.array >> 20, self.loops)
                .split(' ')
                .map(String::from),
        );
        if load {
            args.push("-c".into());
        }
        args
    }

    /// A migration of the guest; the destination stops at `dest_limit`
    /// if given. Returns (source, destination) summaries.
    fn migrate(
        &self,
        load: bool,
        apf: &str,
        at: Duration,
        dest_limit: Option<Duration>,
    ) -> Result<(serde_json::Value, serde_json::Value), String> {
        let mut dest = faultline();
        dest.args(["incoming", "--listen", "127.0.0.1:0", "--stats", "json"]);
        if let Some(limit) = dest_limit {
            dest.args(["--time-limit".to_string(), ns_arg(limit)]);
        }
        migrate_once(dest, self.run_args(load, apf, None), |addr| {
            vec![
                "--migrate-to".to_string(),
                addr,
                "--migrate-at".into(),
                ns_arg(at),
                "--migrate-mode".into(),
                "postcopy".into(),
                "--link-bandwidth".into(),
                self.link_bandwidth.to_string(),
            ]
        })
    }

    fn plain(
        &self,
        load: bool,
        apf: &str,
        limit: Option<Duration>,
    ) -> Result<serde_json::Value, String> {
        let out = faultline()
            .args(self.run_args(load, apf, limit))
            .output()
            .map_err(|e| format!("run: {e}"))?;
        json_of(&out.stdout, "run without migration")
    }

    fn row(&self, load: bool, apf: &'static str, at: Duration) -> Result<PostcopyRow, String> {
        let (src, dst) = self.migrate(load, apf, at, None)?;
        let post = &dst["postcopy"];
        let postcopy_ms = post["complete_ms"].as_f64().unwrap_or(0.0);
        let switch_cycles = u(&src["virtual_cycles"]);
        // The last page's arrival, rounded up to a nanosecond.
        let window_end = Duration::from_nanos(
            ((u128::from(switch_cycles) * 1_000_000_000).div_ceil(u128::from(hv::CYCLES_PER_SECOND))
                as u64)
                + (postcopy_ms * 1e6).ceil() as u64,
        );
        let (_, during) = self.migrate(load, apf, at, Some(window_end))?;
        let at_switch = self.plain(load, apf, Some(at))?;
        let unmigrated_during = self.plain(load, apf, Some(window_end))?;
        let unmigrated = self.plain(load, apf, None)?;
        Ok(PostcopyRow {
            load,
            apf,
            at_ms: at.as_secs_f64() * 1e3,
            pages: u(&post["pages"]),
            requested: u(&post["requested"]),
            waited: u(&post["waited"]),
            wait_ms: post["wait_ms"].as_f64().unwrap_or(0.0),
            postcopy_ms,
            total_ms: src["migration"]["total_ms"].as_f64().unwrap_or(0.0),
            during_instructions: u(&during["instructions"]).saturating_sub(u(&src["instructions"])),
            during_instructions_unmigrated: u(&unmigrated_during["instructions"])
                .saturating_sub(u(&at_switch["instructions"])),
            writer_ms: report(&dst, "apfcalc_ns")? as f64 / 1e6,
            calc: report(&dst, "apfcalc_calc")?,
            writer_ms_unmigrated: report(&unmigrated, "apfcalc_ns")? as f64 / 1e6,
            calc_unmigrated: report(&unmigrated, "apfcalc_calc")?,
            not_present: u(&dst["apf"]["not_present_sent"]),
        })
    }

    fn describe(&self) -> String {
        self.describe_case("[-c]", self.at)
    }

    /// The setup with `calc` (`-c`, `[-c]` or nothing) after apfcalc's
    /// options and the migration at `at`.
    fn describe_case(&self, calc: &str, at: Duration) -> String {
        let calc = if calc.is_empty() {
            String::new()
        } else {
            format!(" {calc}")
        };
        format!(
            "apfcalc -m {}M -l {}{calc}, {} vCPU(s), {} MiB guest, post-copy at {:?} over {} B/s",
            self.array >> 20,
            self.loops,
            self.vcpus,
            self.mem >> 20,
            at,
            self.link_bandwidth
        )
    }

    /// When the case without the calculation thread migrates: `--at`
    /// scaled by the run times of the two guests without a migration
    /// (async PF off), so both migrate at the same point of their runs.
    fn at_without_load(&self) -> Result<Duration, String> {
        let seconds = |load| -> Result<f64, String> {
            let v = self.plain(load, "off", None)?;
            v["virtual_seconds"]
                .as_f64()
                .filter(|s| *s > 0.0)
                .ok_or_else(|| format!("no run time in {v}"))
        };
        let scaled = self.at.as_secs_f64() * seconds(false)? / seconds(true)?;
        Ok(Duration::from_micros(
            ((scaled * 1e6).round() as u64).max(1),
        ))
    }

    /// The rows: with the calculation thread, then without; each async
    /// PF off then on.
    pub fn rows(&self) -> Result<Vec<PostcopyRow>, String> {
        let quiet_at = self.at_without_load()?;
        [true, false]
            .into_iter()
            .flat_map(|load| [(load, "off"), (load, "pv")])
            .map(|(load, apf)| {
                let at = if load { self.at } else { quiet_at };
                self.row(load, apf, at).map_err(|e| {
                    format!(
                        "{} load, apf {apf}: {e}",
                        if load { "with" } else { "without" }
                    )
                })
            })
            .collect()
    }

    /// Seed 002's migration figures beside the rows' (APF off, on).
    pub fn comparisons(&self, rows: &[PostcopyRow]) -> Vec<Comparison> {
        let mut out = Vec::new();
        for pair in rows.chunks(2) {
            let [off, on] = pair else { continue };
            let (key, calc) = if off.load {
                ("002.postcopy.with_load", "-c")
            } else {
                ("002.postcopy.without_load", "")
            };
            let at = Duration::from_nanos((off.at_ms * 1e6).round() as u64);
            let setup = format!("post-copy, {}", self.describe_case(calc, at));
            out.push(
                Comparison::measured(
                    key,
                    &setup,
                    change_pct(off.writer_ms, on.writer_ms),
                )
                .because(format!(
                    "with APF on, guest instructions while pages came {:+.1} %, pages waited for {} -> {}, the post-copy phase {:.3} of the writer's {:.3} ms (APF off)",
                    change_pct(off.during_instructions as f64, on.during_instructions as f64),
                    off.waited,
                    on.waited,
                    off.postcopy_ms,
                    off.writer_ms
                )),
            );
        }
        out
    }

    /// Runs seed 002's case; the exit status.
    pub fn bench(&self) -> u8 {
        let rows = match self.rows() {
            Ok(rows) => rows,
            Err(e) => {
                eprintln!("faultline: bench migrate --postcopy: {e}");
                return crate::EXIT_VM_ERROR;
            }
        };
        let comparisons = self.comparisons(&rows);
        let change = |on: f64, off: f64| (on - off) / off.max(1e-9) * 100.0;
        let (off, on) = (&rows[0], &rows[1]);
        let time_change = change(on.writer_ms, off.writer_ms);
        let calc_change = change(on.calc as f64, off.calc as f64);
        let during_change = change(
            on.during_instructions as f64,
            off.during_instructions as f64,
        );
        // A JSON run writes no plot unless --plot asked for one.
        if !self.json || self.plot.is_some() {
            if let Err(e) = self.plot(&rows) {
                eprintln!("faultline: bench migrate --postcopy: the plot: {e}");
                return crate::EXIT_VM_ERROR;
            }
        }
        if self.json {
            let doc = serde_json::json!({
                "case": "seed 002: post-copy of a guest with and without load",
                "results": rows,
                "apf_on_vs_off": {
                    "writer_time_pct": time_change,
                    "calc_pct": calc_change,
                    "during_instructions_pct": during_change,
                    "seed_002_time_pct": [SEED_002_TIME_PCT.0, SEED_002_TIME_PCT.1],
                },
                "comparisons": comparisons.iter().map(Comparison::to_json).collect::<Vec<_>>(),
            });
            println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
            return 0;
        }
        println!(
            "seed 002: post-copy migration of a guest with and without the calculation thread, {}",
            self.describe()
        );
        println!(
            "{:<5} {:<4} {:>6} {:>9} {:>7} {:>8} {:>10} {:>9} {:>14} {:>14} {:>10} {:>11} {:>12} {:>11}",
            "calc.",
            "apf",
            "pages",
            "requested",
            "waited",
            "wait ms",
            "postcopy ms",
            "total ms",
            "instr. during",
            "(no migration)",
            "writer ms",
            "(no migr.)",
            "calculation",
            "(no migr.)"
        );
        for r in &rows {
            println!(
                "{:<5} {:<4} {:>6} {:>9} {:>7} {:>8.3} {:>10.3} {:>9.3} {:>14} {:>14} {:>10.3} {:>11.3} {:>12} {:>11}",
                if r.load { "on" } else { "off" },
                r.apf,
                r.pages,
                r.requested,
                r.waited,
                r.wait_ms,
                r.postcopy_ms,
                r.total_ms,
                r.during_instructions,
                r.during_instructions_unmigrated,
                r.writer_ms,
                r.writer_ms_unmigrated,
                r.calc,
                r.calc_unmigrated
            );
        }
        println!(
            "with load, APF on vs off, migrated: writer time {time_change:+.1} % (seed 002: {:+.1} % to {:+.1} %), calculation {calc_change:+.1} %, guest instructions while pages came {during_change:+.1} %",
            SEED_002_TIME_PCT.0, SEED_002_TIME_PCT.1
        );
        if let [.., off, on] = rows.as_slice() {
            println!(
                "without load, APF on vs off, migrated: writer time {:+.1} % (seed 002: +13.6 % to +14.7 %)",
                change(on.writer_ms, off.writer_ms)
            );
        }
        print!("{}", super::seeds::render_lines(&comparisons));
        0
    }

    pub(super) fn plot(&self, rows: &[PostcopyRow]) -> Result<(), String> {
        let path = self.plot.clone().unwrap_or_else(|| {
            std::path::Path::new(super::RESULTS_DIR).join("bench-migrate-postcopy.svg")
        });
        if self.plot.is_none() {
            std::fs::create_dir_all(super::RESULTS_DIR).map_err(|e| e.to_string())?;
        }
        let bars: Vec<plot::Bar> = rows
            .iter()
            .map(|r| plot::Bar {
                label: format!("{} load, apf {}", if r.load { "with" } else { "no" }, r.apf),
                value: r.during_instructions as f64,
                reference: Some(r.during_instructions_unmigrated as f64),
                note: format!(
                    "{:.0} % of unmigrated; writer {:.1} ms",
                    r.during_instructions as f64 * 100.0
                        / r.during_instructions_unmigrated.max(1) as f64,
                    r.writer_ms
                ),
            })
            .collect();
        plot::bars(
            &path,
            "Seed 002: guest progress while post-copy pages come",
            &self.describe(),
            "guest instructions, switch-over to last page",
            "the same window without a migration",
            &bars,
        )?;
        eprintln!("faultline: plot written to {}", path.display());
        Ok(())
    }
}
