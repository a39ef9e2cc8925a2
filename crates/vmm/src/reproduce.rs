//! `faultline reproduce`: every seed's experiments, run in-process as
//! the benches they are, and one table per seed of the seed's figures
//! beside faultline's (`bench::seeds`): the ratio and a computed status.
//!
//! An experiment is a `faultline bench ...` command line. `--list-runs`
//! prints them (with `--json`) for a batch system, and `--from FILE...`
//! builds the tables from their JSON outputs, as the direct run does.

mod sensitivity;

use crate::bench::seeds::{self, Comparison, Status};
use crate::signals::StopRequest;
use crate::{BenchCommand, EXIT_CONFIG, EXIT_VM_ERROR};
use clap::Parser;
use serde_json::json;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct ReproduceArgs {
    /// The seeds to reproduce (000 to 004; default: all).
    seeds: Vec<String>,
    /// Small sizes (a few minutes in all, for CI); its figures are their
    /// own reference, not the full run's.
    #[arg(long)]
    quick: bool,
    /// Print JSON instead of the tables.
    #[arg(long)]
    json: bool,
    /// Print every figure at full precision, one `key | setup | value`
    /// line each: what `docs/results.md` keeps of `--quick` and the drift
    /// test compares exactly.
    #[arg(long, conflicts_with = "json")]
    figures: bool,
    /// Write the Markdown tables, the JSON, each bench's table and the
    /// plots into this directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Leave out the experiments that boot Linux.
    #[arg(long)]
    no_linux: bool,
    /// VM runs at a time within each experiment (default: the host's
    /// CPUs).
    #[arg(long)]
    jobs: Option<usize>,
    /// Print one `faultline bench ... --json` command line per experiment
    /// instead of running them.
    #[arg(long)]
    list_runs: bool,
    /// Build the tables from the JSON outputs of the `--list-runs`
    /// commands (one file each, in the listed order).
    #[arg(long, num_args = 1..)]
    from: Vec<PathBuf>,
    /// For each figure not met: the cost entries its experiment charges,
    /// each swept over x1/8 .. x8 of its value (the experiments at the
    /// `--quick` sizes), and the factors at which the figure is met.
    #[arg(long, conflicts_with = "list_runs")]
    sensitivity: bool,
}

/// One experiment: a bench command line for a seed.
struct Experiment {
    seed: &'static str,
    args: Vec<String>,
    /// `plot` file name under `--out`, if the bench draws one.
    plot: Option<&'static str>,
}

/// Every experiment: its seed, its plot's name under `--out`, the bench
/// options at full size and with `--quick`. A quick run shrinks sizes and
/// durations but keeps the full run's devices: Linux's apf on the hdd
/// (4-17 ms a read) over a 0.05 s window timed a handful of swap-ins and
/// its off run's window stretched to 0.4 s. Even so, a 0.05 s window of
/// a Linux guest is a drift check, not an estimate: its ratios move with
/// `--seed` far more than the full run's (docs/results.md).
const EXPERIMENTS: [(&str, Option<&str>, &str, &str); 11] = [
    ("000", Some("apf.svg"), "apf", "apf --host-mem 8M --duration 0.05"),
    (
        "000",
        Some("apf-linux.svg"),
        "apf --guest linux --vcpus 2 --fault-threads 2 --work-threads 2 --duration 0.5 --swap-device ssd",
        "apf --guest linux --vcpus 2 --fault-threads 2 --work-threads 2 --duration 0.05 --swap-device ssd",
    ),
    ("001", Some("fastpf.svg"), "fastpf", "fastpf --frames 10"),
    (
        "001",
        Some("fastpf-seed-scheme.svg"),
        "fastpf --mmus shadow --fast-pf-indirect seed",
        "fastpf --frames 10 --mmus shadow --fast-pf-indirect seed",
    ),
    (
        "001",
        Some("dirty-log.svg"),
        "dirty-log -v 6 -b 170M --fast-pf on,off --modes bitmap",
        "dirty-log -v 2 -b 8M -i 2 --fast-pf on,off --modes bitmap",
    ),
    ("001", Some("migrate.svg"), "migrate", "migrate"),
    ("002", None, "apf-calc", "apf-calc"),
    (
        "002",
        Some("migrate-postcopy.svg"),
        "migrate --postcopy",
        "migrate --postcopy",
    ),
    (
        "003",
        Some("memslot.svg"),
        "memslot --zaps slow,fast,seed",
        "memslot --mem 256M --ops 2 --zaps slow,fast,seed",
    ),
    (
        "004",
        Some("ctxsw.svg"),
        "ctxsw --kvm-2007",
        "ctxsw --rounds 1000 --kvm-2007",
    ),
    (
        "004",
        Some("hackbench.svg"),
        "hackbench --kvm-2007",
        "hackbench --loops 10 --kvm-2007",
    ),
];

/// Every experiment, full size or `--quick`.
fn experiments(quick: bool, linux: bool) -> Vec<Experiment> {
    EXPERIMENTS
        .iter()
        .map(|&(seed, plot, full, small)| Experiment {
            seed,
            args: (if quick { small } else { full })
                .split_whitespace()
                .map(String::from)
                .collect(),
            plot,
        })
        .filter(|e| linux || !e.args.iter().any(|a| a == "linux"))
        .collect()
}

/// A bench command line parsed as `faultline bench` parses it.
#[derive(Parser, Debug)]
#[command(name = "faultline bench")]
struct BenchLine {
    #[command(subcommand)]
    command: BenchCommand,
}

/// One experiment's outcome.
struct Done {
    seed: &'static str,
    command: String,
    comparisons: Vec<Comparison>,
    /// `--sensitivity`: the sweeps of the figures not met.
    sweeps: Vec<sensitivity::RowSweep>,
}

pub fn reproduce(args: ReproduceArgs) -> u8 {
    match run(&args) {
        Ok(out) => {
            print!("{out}");
            0
        }
        Err((status, message)) => {
            eprintln!("faultline reproduce: {message}");
            status
        }
    }
}

fn run(args: &ReproduceArgs) -> Result<String, (u8, String)> {
    let config = |m: String| (EXIT_CONFIG, m);
    for seed in &args.seeds {
        if !seeds::FIGURES.iter().any(|f| f.seed == seed) {
            return Err(config(format!("no seed `{seed}` (000 to 004)")));
        }
    }
    let mut list = experiments(args.quick, !args.no_linux);
    list.retain(|e| args.seeds.is_empty() || args.seeds.iter().any(|s| s == e.seed));
    // `--jobs` changes only the wall time, so the commands shown leave
    // it out.
    let shown = |e: &Experiment| {
        let mut words = vec!["bench".to_string()];
        words.extend(e.args.iter().cloned());
        shell_words::join(words)
    };
    let command = |e: &Experiment| {
        let mut words = vec!["bench".to_string()];
        words.extend(e.args.iter().cloned());
        if let Some(jobs) = args.jobs {
            if e.args[0] != "migrate" {
                words.extend(["--jobs".into(), jobs.to_string()]);
            }
        }
        words
    };
    if args.list_runs {
        let exe = std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "faultline".into());
        let mut out = String::new();
        for e in &list {
            let mut line = vec![exe.clone()];
            line.extend(command(e));
            line.push("--json".into());
            let _ = writeln!(out, "{}", shell_words::join(line));
        }
        return Ok(out);
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)
            .map_err(|e| config(format!("--out {}: {e}", dir.display())))?;
    }
    let mut done = Vec::new();
    let stop = StopRequest::install().map_err(|e| config(e.to_string()))?;
    if !args.from.is_empty() {
        if args.from.len() != list.len() {
            return Err(config(format!(
                "--from: {} files for {} experiments (as --list-runs lists them)",
                args.from.len(),
                list.len()
            )));
        }
        for (e, path) in list.iter().zip(&args.from) {
            done.push(Done {
                seed: e.seed,
                command: shown(e),
                comparisons: read_comparisons(path).map_err(config)?,
                sweeps: Vec::new(),
            });
        }
    } else {
        for (i, e) in list.iter().enumerate() {
            let words = command(e);
            let line = shell_words::join(&words);
            eprintln!(
                "faultline reproduce: [{}/{}] seed {}: faultline {line}",
                i + 1,
                list.len(),
                e.seed
            );
            // `bench` stands for the program's name.
            let parsed =
                BenchLine::try_parse_from(words).map_err(|err| config(format!("{line}: {err}")))?;
            let plot = match (&args.out, e.plot) {
                (Some(dir), Some(name)) => Some(dir.join(format!("bench-{name}"))),
                _ => None,
            };
            let result = crate::bench::reproduce(parsed.command, plot, &stop);
            if let Some(signal) = stop.signal() {
                return Err((
                    signal.exit_status(),
                    format!(
                        "interrupted by {} in experiment {} of {} ({line})",
                        signal.name(),
                        i + 1,
                        list.len()
                    ),
                ));
            }
            let result = result.map_err(|err| (EXIT_VM_ERROR, format!("{line}: {err}")))?;
            if let (Some(dir), Some(name)) = (&args.out, e.plot) {
                let path = dir.join(format!("bench-{}", name.replace(".svg", ".txt")));
                std::fs::write(&path, &result.table)
                    .map_err(|err| (EXIT_VM_ERROR, format!("{}: {err}", path.display())))?;
            }
            done.push(Done {
                seed: e.seed,
                command: shown(e),
                comparisons: result.comparisons,
                sweeps: Vec::new(),
            });
        }
    }
    if args.sensitivity {
        sweep_not_met(args, &mut done, &stop)?;
    }
    let markdown = markdown(&done, args.quick);
    let json = json_of(&done, args.quick);
    if let Some(dir) = &args.out {
        for (name, text) in [("results.md", &markdown), ("results.json", &json)] {
            let path = dir.join(name);
            std::fs::write(&path, text)
                .map_err(|err| (EXIT_VM_ERROR, format!("{}: {err}", path.display())))?;
        }
        eprintln!(
            "faultline reproduce: results.md, results.json, tables and plots in {}",
            dir.display()
        );
    }
    Ok(if args.json {
        json
    } else if args.figures {
        figures(&done)
    } else {
        markdown
    })
}

/// `key | setup | value` per comparison, the value as Rust prints an
/// `f64` (it reads back to the same number), `-` when not run.
fn figures(done: &[Done]) -> String {
    let mut s = String::new();
    for c in done.iter().flat_map(|d| &d.comparisons) {
        let _ = writeln!(
            s,
            "{} | {} | {}",
            c.figure.key,
            c.setup,
            c.faultline.map_or("-".to_string(), |v| format!("{v:?}"))
        );
    }
    s
}

/// The comparisons in a `bench ... --json` output.
fn read_comparisons(path: &Path) -> Result<Vec<Comparison>, String> {
    let bytes =
        crate::config::read_input_file("reproduce --from", path, crate::config::RESULT_FILE_CAP)
            .map_err(|e| e.to_string())?;
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{}: not a bench's JSON: {e}", path.display()))?;
    let list = value["comparisons"]
        .as_array()
        .ok_or_else(|| format!("{}: no comparisons", path.display()))?;
    list.iter()
        .map(|c| {
            let key = c["key"].as_str().unwrap_or_default();
            if !seeds::FIGURES.iter().any(|f| f.key == key) {
                return Err(format!("{}: unknown figure `{key}`", path.display()));
            }
            let setup = c["setup"].as_str().unwrap_or_default();
            let cause = c["cause"].as_str().map(String::from);
            Ok(match c["faultline"].as_f64() {
                Some(v) => {
                    let mut m = Comparison::measured(key, setup, v);
                    m.cause = cause;
                    m
                }
                None => Comparison::not_run(key, setup, cause.unwrap_or_default()),
            })
        })
        .collect()
}

/// `|` in a table cell.
fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// One Markdown table per seed.
fn markdown(done: &[Done], quick: bool) -> String {
    let mut s = String::new();
    let mut seeds: Vec<&str> = done.iter().map(|d| d.seed).collect();
    seeds.dedup();
    let (mut met, mut not_met, mut not_comparable) = (0, 0, 0);
    for seed in seeds {
        let _ = writeln!(
            s,
            "## Seed {seed}{}\n",
            if quick { " (--quick)" } else { "" }
        );
        for d in done.iter().filter(|d| d.seed == seed) {
            let _ = writeln!(s, "- `faultline {}`", d.command);
        }
        let _ = writeln!(
            s,
            "\n| figure | faultline's setup | seed | from | faultline | ratio | status |\n|---|---|---|---|---|---|---|"
        );
        for d in done.iter().filter(|d| d.seed == seed) {
            for c in &d.comparisons {
                match c.status() {
                    Status::Met => met += 1,
                    Status::NotMet => not_met += 1,
                    Status::NotComparable => not_comparable += 1,
                }
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} |",
                    cell(c.figure.what),
                    cell(&c.setup),
                    c.figure.show(),
                    cell(c.figure.source),
                    c.faultline_text(),
                    c.ratio_text(),
                    cell(&c.verdict())
                );
            }
        }
        s.push('\n');
        let sweeps: Vec<&sensitivity::RowSweep> = done
            .iter()
            .filter(|d| d.seed == seed)
            .flat_map(|d| &d.sweeps)
            .collect();
        s.push_str(&sensitivity::markdown(&sweeps));
    }
    let _ = writeln!(
        s,
        "{met} met, {not_met} not met, {not_comparable} not comparable (met: within {:.0} % of the seed's figure or range).",
        seeds::TOLERANCE * 100.0
    );
    s
}

fn json_of(done: &[Done], quick: bool) -> String {
    let experiments: Vec<serde_json::Value> = done
        .iter()
        .map(|d| {
            json!({
                "seed": d.seed,
                "command": format!("faultline {}", d.command),
                "comparisons": d.comparisons.iter().map(Comparison::to_json).collect::<Vec<_>>(),
                "sensitivity": d.sweeps.iter().map(sensitivity::RowSweep::to_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    crate::bench::json_text(&json!({
        "quick": quick,
        "tolerance": seeds::TOLERANCE,
        "experiments": experiments,
    }))
}

/// `--sensitivity`: sweeps the cost entries of every experiment with a
/// figure not met, at the `--quick` sizes (the same experiments, in the
/// same order, so comparison `i` of a quick run is comparison `i` of the
/// table's).
fn sweep_not_met(
    args: &ReproduceArgs,
    done: &mut [Done],
    stop: &StopRequest,
) -> Result<(), (u8, String)> {
    let mut quick = experiments(true, !args.no_linux);
    quick.retain(|e| args.seeds.is_empty() || args.seeds.iter().any(|s| s == e.seed));
    let todo: Vec<usize> = (0..done.len())
        .filter(|&i| !sensitivity::not_met(&done[i].comparisons).is_empty())
        .collect();
    eprintln!(
        "faultline reproduce --sensitivity: {} experiments with figures not met, each entry at x1/8 .. x8, at the --quick sizes",
        todo.len()
    );
    for (n, &i) in todo.iter().enumerate() {
        let e = &quick[i];
        let mut base = vec!["bench".to_string()];
        base.extend(e.args.iter().cloned());
        if let Some(jobs) = args.jobs {
            if e.args[0] != "migrate" {
                base.extend(["--jobs".into(), jobs.to_string()]);
            }
        }
        let run = |extra: &[String]| -> Result<Vec<Comparison>, String> {
            let mut words = base.clone();
            words.extend(extra.iter().cloned());
            let line = shell_words::join(&words);
            let parsed =
                BenchLine::try_parse_from(&words).map_err(|err| format!("{line}: {err}"))?;
            let result = crate::bench::reproduce(parsed.command, None, stop);
            if let Some(signal) = stop.signal() {
                return Err(format!("interrupted by {}", signal.name()));
            }
            result
                .map(|r| r.comparisons)
                .map_err(|err| format!("{line}: {err}"))
        };
        let baseline = if args.quick {
            done[i].comparisons.clone()
        } else {
            run(&[]).map_err(|m| (EXIT_VM_ERROR, m))?
        };
        let label = shell_words::join(&e.args);
        let progress = |what: &str| {
            eprintln!(
                "faultline reproduce --sensitivity: [{}/{}] seed {}: {label} --cost {what}",
                n + 1,
                todo.len(),
                e.seed
            )
        };
        done[i].sweeps = sensitivity::sweep_experiment(
            &sensitivity::not_met(&done[i].comparisons),
            sensitivity::candidates(&e.args),
            &baseline,
            run,
            progress,
        )
        .map_err(|m| (EXIT_VM_ERROR, m))?;
    }
    Ok(())
}
