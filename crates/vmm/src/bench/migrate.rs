//! `faultline bench migrate`: seed 001's live-migration case. A guest
//! under a write load (`bm`'s faulting threads write pages nonstop, as
//! the seed's dbench did) migrates by pre-copy to a second faultline
//! process on loopback, with the fast page fault on and off. Each row
//! runs three processes: the destination (`incoming`), the source (`run
//! --migrate-to`), and the same source command without the migration,
//! stopped at the virtual time the migrating source stopped: the
//! difference between the two sources' write faults is what dirty
//! logging cost the guest's writes. The four rows are EPT and shadow
//! paging (the seed's two autotest cases), each with the fast page fault
//! on and off.

use super::seeds::{change_pct, Comparison};
use crate::{MigrateBenchArgs, EXIT_VM_ERROR};
use serde::Serialize;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

/// One row.
#[derive(Debug, Clone, Serialize)]
pub struct MigrateRow {
    /// `ept` or `shadow` (`run --mmu`).
    pub mmu: &'static str,
    pub fast_pf: bool,
    pub rounds: u64,
    pub pages_sent: u64,
    pub bytes_sent: u64,
    pub precopy_ms: f64,
    pub downtime_ms: f64,
    pub total_ms: f64,
    /// Write-fault exits the migrating source took beyond the same run
    /// without a migration (the dirty-logging write faults): EPT
    /// violations under EPT, intercepted #PF exceptions under shadow
    /// paging.
    pub dirty_log_faults: i64,
    /// hv cycles those extra faults cost (exit handling, beyond the
    /// machine's exit/entry transitions), and per fault.
    pub dirty_log_fault_cycles: i64,
    pub cycles_per_fault: f64,
    /// Of the faults, fixed by the fast page fault without `mmu_lock`.
    pub fast_pf_fixed: u64,
    /// The guest's total work (bm) at the destination's end.
    pub guest_total: u64,
}

pub(super) fn faultline() -> Command {
    Command::new(std::env::current_exe().unwrap_or_else(|_| "faultline".into()))
}

/// One migration between two processes on loopback: starts `dest` (an
/// `incoming --listen 127.0.0.1:0 --stats json ...` command), then the
/// source `run` with `source_args` and, before its `--`, the options
/// `migrate(address)` gives. Returns the source's and the destination's
/// JSON summaries; a source that did not migrate is an error.
pub(super) fn migrate_once(
    mut dest: Command,
    mut source_args: Vec<String>,
    migrate: impl FnOnce(String) -> Vec<String>,
) -> Result<(serde_json::Value, serde_json::Value), String> {
    let mut dest = dest
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the destination: {e}"))?;
    let mut err = BufReader::new(dest.stderr.take().ok_or("no stderr")?);
    let mut line = String::new();
    err.read_line(&mut line).map_err(|e| e.to_string())?;
    let addr = line
        .trim()
        .strip_prefix("faultline: listening on ")
        .ok_or_else(|| format!("destination: {line}"))?
        .to_string();
    let drain = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let split = source_args
        .iter()
        .position(|a| a == "--")
        .unwrap_or(source_args.len());
    source_args.splice(split..split, migrate(addr));
    let src = match faultline().args(&source_args).output() {
        Ok(src) => src,
        Err(e) => {
            let _ = dest.kill();
            return Err(format!("source: {e}"));
        }
    };
    if !String::from_utf8_lossy(&src.stdout).contains("\"migrated\"") {
        // The source did not migrate (the guest ended before the
        // migration's time, or it failed): nobody will connect.
        let _ = dest.kill();
    }
    let dst = dest.wait_with_output().map_err(|e| e.to_string())?;
    let dst_err = drain.join().unwrap_or_default();
    let src = json_of(&src.stdout, "source")?;
    if src["stop"]["reason"] != "migrated" || !src["migration"]["failed"].is_null() {
        return Err(format!("the source did not migrate: {}", src["migration"]));
    }
    let dst = json_of(&dst.stdout, &format!("destination ({dst_err})"))?;
    Ok((src, dst))
}

pub(super) fn json_of(out: &[u8], what: &str) -> Result<serde_json::Value, String> {
    serde_json::from_slice(out).map_err(|e| {
        format!(
            "{what}: not a JSON summary ({e}): {}",
            String::from_utf8_lossy(out)
        )
    })
}

/// The page-fault exits of a run and their hv cycles: EPT violations and
/// (under shadow paging) intercepted #PF exceptions.
fn fault_exits(v: &serde_json::Value) -> (i64, i64) {
    ["ept_violation", "exception"]
        .iter()
        .map(|kind| &v["exits"][kind])
        .fold((0, 0), |(n, c), e| {
            (
                n + e["count"].as_i64().unwrap_or(0),
                c + e["hv_cycles"].as_i64().unwrap_or(0),
            )
        })
}

impl MigrateBenchArgs {
    /// Seed 002's post-copy case with these options.
    fn postcopy_case(
        &self,
        json: bool,
        plot: Option<std::path::PathBuf>,
    ) -> super::migrate_postcopy::PostcopyCase {
        super::migrate_postcopy::PostcopyCase {
            json,
            vcpus: self.vcpus(),
            mem: self.mem,
            array: self.array,
            loops: self.loops,
            at: self.at(),
            link_bandwidth: self.link_bandwidth,
            seed: self.seed,
            costs: self.cost_args(),
            plot,
        }
    }

    /// `--cost NAME=CYCLES` for each of the bench's `--cost`s: the runs
    /// take them (the destination gets them with the VM's state).
    pub(super) fn cost_args(&self) -> Vec<String> {
        self.costs
            .iter()
            .flat_map(|c| ["--cost".to_string(), format!("{}={}", c.name, c.cycles)])
            .collect()
    }

    pub(super) fn at(&self) -> Duration {
        self.at
            .unwrap_or(Duration::from_millis(if self.postcopy { 30 } else { 20 }))
    }

    pub(super) fn vcpus(&self) -> u32 {
        self.vcpus.unwrap_or(if self.postcopy { 1 } else { 2 })
    }

    fn source_args(&self, mmu: &str, fast_pf: bool) -> Vec<String> {
        let program = format!(
            "bm -f {v} -w {v} -m {}M -t {}",
            self.array >> 20,
            self.duration.as_secs_f64(),
            v = self.vcpus()
        );
        let mut args: Vec<String> = [
            "run",
            "--stats",
            "json",
            "--vcpus",
            &self.vcpus().to_string(),
            "--mem",
            &self.mem.to_string(),
            "--seed",
            &self.seed.to_string(),
            "--mmu",
            mmu,
            "--fast-pf",
            if fast_pf { "on" } else { "off" },
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(self.cost_args());
        args.push("--".into());
        args.extend(program.split(' ').map(String::from));
        args
    }

    fn row(&self, mmu: &'static str, fast_pf: bool) -> Result<MigrateRow, String> {
        let mut dest = faultline();
        dest.args(["incoming", "--listen", "127.0.0.1:0", "--stats", "json"]);
        let (src, dst) = migrate_once(dest, self.source_args(mmu, fast_pf), |addr| {
            vec![
                "--migrate-to".to_string(),
                addr,
                "--migrate-at".into(),
                format!("{}ns", self.at().as_nanos()),
                "--link-bandwidth".into(),
                self.link_bandwidth.to_string(),
                "--downtime-limit".into(),
                format!("{}ns", self.downtime_limit.as_nanos()),
                "--max-rounds".into(),
                self.max_rounds.to_string(),
            ]
        })?;
        let report = &src["migration"];
        // The same run, no migration, to the source's stop.
        let stop_ns = (src["virtual_cycles"].as_u64().unwrap_or(0) as u128 * 1_000_000_000)
            .div_ceil(u128::from(hv::CYCLES_PER_SECOND));
        let mut base_args = self.source_args(mmu, fast_pf);
        let split = base_args
            .iter()
            .position(|a| a == "--")
            .unwrap_or(base_args.len());
        base_args.splice(
            split..split,
            ["--time-limit".to_string(), format!("{stop_ns}ns")],
        );
        let base = faultline()
            .args(&base_args)
            .output()
            .map_err(|e| format!("baseline: {e}"))?;
        let base = json_of(&base.stdout, "baseline")?;
        let (faults, cycles) = fault_exits(&src);
        let (base_faults, base_cycles) = fault_exits(&base);
        let dirty_log_faults = faults - base_faults;
        let dirty_log_fault_cycles = cycles - base_cycles;
        let total = dst["console"]
            .as_str()
            .and_then(|c| c.lines().find_map(|l| l.strip_prefix("total: ")))
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        Ok(MigrateRow {
            mmu,
            fast_pf,
            rounds: report["rounds"].as_u64().unwrap_or(0),
            pages_sent: report["pages_sent"].as_u64().unwrap_or(0),
            bytes_sent: report["bytes_sent"].as_u64().unwrap_or(0),
            precopy_ms: report["precopy_ms"].as_f64().unwrap_or(0.0),
            downtime_ms: report["downtime_ms"].as_f64().unwrap_or(0.0),
            total_ms: report["total_ms"].as_f64().unwrap_or(0.0),
            dirty_log_faults,
            dirty_log_fault_cycles,
            cycles_per_fault: dirty_log_fault_cycles as f64 / dirty_log_faults.max(1) as f64,
            fast_pf_fixed: src["fast_pf"]["fixed"].as_u64().unwrap_or(0)
                - base["fast_pf"]["fixed"].as_u64().unwrap_or(0),
            guest_total: total,
        })
    }
}

/// Runs the benchmark; the exit status.
pub fn bench(args: MigrateBenchArgs) -> u8 {
    if args.postcopy {
        return args.postcopy_case(args.json, args.plot.clone()).bench();
    }
    let rows = match rows(&args) {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("faultline: bench migrate: {e}");
            return EXIT_VM_ERROR;
        }
    };
    let comparisons = comparisons(&args, &rows);
    // A JSON run writes no plot unless --plot asked for one.
    if !args.json || args.plot.is_some() {
        if let Err(e) = plot_precopy(&args, &rows) {
            eprintln!("faultline: bench migrate: the plot: {e}");
            return EXIT_VM_ERROR;
        }
    }
    if args.json {
        let doc = serde_json::json!({
            "results": rows,
            "comparisons": comparisons.iter().map(Comparison::to_json).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return 0;
    }
    println!(
        "seed 001: pre-copy live migration of a guest under a write load (bm -f {v} -w {v}, {} MiB array), {} vCPUs, at {:?}, link {} B/s, downtime limit {:?}, at most {} rounds",
        args.array >> 20,
        args.vcpus(),
        args.at(),
        args.link_bandwidth,
        args.downtime_limit,
        args.max_rounds,
        v = args.vcpus()
    );
    println!(
        "{:<6} {:<8} {:>6} {:>8} {:>11} {:>11} {:>11} {:>10} {:>12} {:>12} {:>10} {:>12}",
        "mmu",
        "fast PF",
        "rounds",
        "pages",
        "bytes",
        "pre-copy ms",
        "downtime ms",
        "total ms",
        "log faults",
        "cycles/fault",
        "fast fixed",
        "guest total"
    );
    for r in &rows {
        println!(
            "{:<6} {:<8} {:>6} {:>8} {:>11} {:>11.3} {:>11.3} {:>10.3} {:>12} {:>12.0} {:>10} {:>12}",
            r.mmu,
            if r.fast_pf { "on" } else { "off" },
            r.rounds,
            r.pages_sent,
            r.bytes_sent,
            r.precopy_ms,
            r.downtime_ms,
            r.total_ms,
            r.dirty_log_faults,
            r.cycles_per_fault,
            r.fast_pf_fixed,
            r.guest_total
        );
    }
    for pair in rows.chunks(2) {
        if let [on, off] = pair {
            let change = |a: f64, b: f64| (a - b) / b.max(1e-9) * 100.0;
            println!(
                "{}: fast PF on vs off: migration total {:+.1} %, cycles per dirty-log write fault {:+.1} % (seed 001: total -4 % to -13 %, dirty-log resume -47 % to -53 %)",
                on.mmu,
                change(on.total_ms, off.total_ms),
                change(on.cycles_per_fault, off.cycles_per_fault)
            );
        }
    }
    print!("{}", super::seeds::render_lines(&comparisons));
    0
}

/// Runs the case in-process for `faultline reproduce`, drawing its plot
/// into `plot` if given.
pub(super) fn reproduce(
    mut args: MigrateBenchArgs,
    plot: Option<std::path::PathBuf>,
) -> Result<super::Reproduced, String> {
    if args.postcopy {
        let case = args.postcopy_case(true, plot.clone());
        let rows = case.rows()?;
        if plot.is_some() {
            case.plot(&rows)?;
        }
        let comparisons = case.comparisons(&rows);
        return Ok(super::Reproduced {
            table: super::json_text(&rows),
            comparisons,
        });
    }
    let rows = rows(&args)?;
    if plot.is_some() {
        args.plot = plot;
        plot_precopy(&args, &rows)?;
    }
    Ok(super::Reproduced {
        table: super::json_text(&rows),
        comparisons: comparisons(&args, &rows),
    })
}

/// The rows: EPT then shadow paging, each fast PF on then off.
pub(super) fn rows(args: &MigrateBenchArgs) -> Result<Vec<MigrateRow>, String> {
    ["ept", "shadow"]
        .into_iter()
        .flat_map(|mmu| [(mmu, true), (mmu, false)])
        .map(|(mmu, fast_pf)| {
            args.row(mmu, fast_pf)
                .map_err(|e| format!("{mmu}, fast PF {}: {e}", if fast_pf { "on" } else { "off" }))
        })
        .collect()
}

/// Seed 001's migration totals beside the rows' (per MMU: fast PF on,
/// off).
pub(super) fn comparisons(args: &MigrateBenchArgs, rows: &[MigrateRow]) -> Vec<Comparison> {
    let mut out = Vec::new();
    for pair in rows.chunks(2) {
        let [on, off] = pair else { continue };
        let (key, name) = match on.mmu {
            "ept" => ("001.migrate.total_ept", "EPT"),
            _ => ("001.migrate.total_shadow", "shadow"),
        };
        let setup = format!(
            "pre-copy, bm -f {v} -w {v} on {} MiB, {v} vCPUs, {name}",
            args.array >> 20,
            v = args.vcpus()
        );
        // The vCPUs' time over the migration, in cycles.
        let vcpu_cycles =
            off.total_ms * 1e-3 * hv::CYCLES_PER_SECOND as f64 * f64::from(args.vcpus());
        out.push(
            Comparison::measured(
                key,
                &setup,
                change_pct(off.total_ms, on.total_ms),
            )
            .because(format!(
                "dirty-log write faults are {:.2} % of the vCPUs' time over it with fast PF off, and fast PF changes their cost by {:+.1} %",
                off.dirty_log_fault_cycles as f64 * 100.0 / vcpu_cycles.max(1.0),
                change_pct(off.cycles_per_fault, on.cycles_per_fault)
            )),
        );
    }
    out
}

/// Seed 001's case as bars: the hv cycles of a dirty-log write fault with
/// the fast page fault on and off (the figure the fast path changes),
/// each noted with the migration's total and downtime (which the link
/// model sets).
fn plot_precopy(args: &MigrateBenchArgs, rows: &[MigrateRow]) -> Result<(), String> {
    let path = args
        .plot
        .clone()
        .unwrap_or_else(|| std::path::Path::new(super::RESULTS_DIR).join("bench-migrate.svg"));
    if args.plot.is_none() {
        std::fs::create_dir_all(super::RESULTS_DIR).map_err(|e| e.to_string())?;
    }
    let bars: Vec<crate::plot::Bar> = rows
        .iter()
        .map(|r| crate::plot::Bar {
            label: format!(
                "{}, fast PF {}",
                r.mmu,
                if r.fast_pf { "on" } else { "off" }
            ),
            value: r.cycles_per_fault,
            reference: None,
            note: format!(
                "total {:.3} ms, downtime {:.3} ms, {} rounds",
                r.total_ms, r.downtime_ms, r.rounds
            ),
        })
        .collect();
    crate::plot::bars(
        &path,
        "Seed 001: pre-copy live migration, EPT and shadow, fast page fault on and off",
        &format!(
            "bm -f {v} -w {v} on {} MiB, {v} vCPUs, migrated at {:?}, link {} B/s (seed: total -4 % to -13 %, dirty-log resume -47 % to -53 %)",
            args.array >> 20,
            args.at(),
            args.link_bandwidth,
            v = args.vcpus()
        ),
        "hv cycles per dirty-log write fault",
        "",
        &bars,
    )?;
    eprintln!("faultline: plot written to {}", path.display());
    Ok(())
}
