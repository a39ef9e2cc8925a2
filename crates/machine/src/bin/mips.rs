//! `mips`: how fast the machine runs the standard workload.
//!
//! ```text
//! cargo run --release -p machine --bin mips -- [--runs N] [--json] [--quick] [--engine interp|jit]
//! ```
//!
//! Each setup runs on both engines (the interpreter and the translator)
//! unless `--engine` picks one; the engines must agree exactly on the
//! instruction and virtual-cycle counts and the checksum, or `mips` fails.
//!
//! Runs `guest-tests/mips_workload.c` twice over:
//! - `bare, paging (4K pages)`: on the bare CPU, identity-mapped with 4 KiB
//!   pages (so the TLB works for its living);
//! - `guest, EPT on (4K guest pages, 2M EPT pages)`: in VMX guest mode, the
//!   same guest page tables under an identity EPT, so every TLB miss is a
//!   two-dimensional walk.
//!
//! MIPS is guest instructions retired (`Cpu::stats().instructions`) per
//! second of host wall time, best of `--runs`. The same count per second of
//! the thread's CPU time is reported too: on a busy host it is the steadier
//! figure. Virtual cycles are reported as well: unlike either time they are
//! the same on every host. This is a
//! benchmark, not a test; it does check that every run prints the checksum
//! and exits successfully, and that repeated runs are identical.

use clap::Parser;
use machine::bare::page_tables::PageSize;
use machine::bare::{BareConfig, BareMachine, Mode, RunStats};
use machine::Engine;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(
    about = "Measure the machine's speed (MIPS) on the standard workload, bare and under EPT"
)]
struct Args {
    /// Runs per configuration; the fastest is reported.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Use the one-round workload (a smoke test of the command).
    #[arg(long)]
    quick: bool,
    /// Measure only this engine (default: both, side by side).
    #[arg(long)]
    engine: Option<machine::Engine>,
}

struct Setup {
    /// Stable identifier for JSON.
    key: &'static str,
    label: &'static str,
    mode: Mode,
}

const SETUPS: &[Setup] = &[
    Setup {
        key: "bare_paging_4k",
        label: "bare, paging (4K pages)",
        mode: Mode::Bare,
    },
    Setup {
        key: "guest_ept_4k",
        label: "guest, EPT on (4K guest pages, 2M EPT pages)",
        mode: Mode::GuestEpt,
    },
];

struct Measurement {
    stats: RunStats,
    wall: Duration,
    /// CPU time of the running thread.
    cpu: Duration,
    checksum_line: String,
}

impl Measurement {
    fn mips(&self) -> f64 {
        self.stats.cpu.instructions as f64 / self.wall.as_secs_f64() / 1e6
    }
    fn cpu_mips(&self) -> f64 {
        self.stats.cpu.instructions as f64 / self.cpu.as_secs_f64() / 1e6
    }
}

/// CPU time consumed by the calling thread.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID
    // is supported on every Linux this runs on, and a failure leaves the
    // zero value, which only makes the CPU-time figure meaningless.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn run_once(workload: &[u8], mode: Mode, engine: Engine) -> Result<Measurement, String> {
    let config = BareConfig {
        page_size: PageSize::Size4K,
        mode,
        cpu: machine::CpuConfig {
            engine,
            ..machine::CpuConfig::default()
        },
        ..BareConfig::default()
    };
    let mut machine = BareMachine::new(config, workload).map_err(|e| e.to_string())?;
    let mut serial = Vec::new();
    let cpu_start = thread_cpu_time();
    let start = Instant::now();
    let exit = machine.run(&mut serial).map_err(|e| e.to_string())?;
    let wall = start.elapsed();
    let cpu = thread_cpu_time().saturating_sub(cpu_start);
    let output = String::from_utf8_lossy(&serial);
    if !exit.success() {
        return Err(format!(
            "workload exited with status {}: {output}",
            exit.status()
        ));
    }
    let checksum_line = output
        .lines()
        .find(|l| l.starts_with("mips_workload checksum "))
        .ok_or_else(|| format!("workload printed no checksum: {output:?}"))?
        .to_string();
    Ok(Measurement {
        stats: machine.stats(),
        wall,
        cpu,
        checksum_line,
    })
}

/// Keeps the fastest of several runs of one setup, checking that every
/// run computed exactly the same thing.
fn keep_best(best: &mut Option<Measurement>, m: Measurement) -> Result<(), String> {
    if let Some(b) = best.as_ref() {
        if (b.stats.cpu.instructions, b.stats.cycles, &b.checksum_line)
            != (m.stats.cpu.instructions, m.stats.cycles, &m.checksum_line)
        {
            return Err(
                "two runs of the same workload differ: the machine is not deterministic".into(),
            );
        }
        if b.wall <= m.wall {
            return Ok(());
        }
    }
    *best = Some(m);
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let (name, workload) = if args.quick {
        (
            "mips_workload_small",
            machine::programs::MIPS_WORKLOAD_SMALL,
        )
    } else {
        ("mips_workload", machine::programs::MIPS_WORKLOAD)
    };
    let engines: Vec<Engine> = match args.engine {
        Some(e) => vec![e],
        None => Engine::ALL.to_vec(),
    };
    // Runs alternate between the engines and setups, so that a change in
    // host load affects all alike.
    let cells: Vec<(Engine, &Setup)> = engines
        .iter()
        .flat_map(|&e| SETUPS.iter().map(move |s| (e, s)))
        .collect();
    let mut best: Vec<Option<Measurement>> = cells.iter().map(|_| None).collect();
    for _ in 0..args.runs {
        for (&(engine, setup), slot) in cells.iter().zip(best.iter_mut()) {
            if let Err(e) = run_once(workload, setup.mode, engine).and_then(|m| keep_best(slot, m))
            {
                eprintln!("mips: {name}, {}, engine {engine}: {e}", setup.label);
                return ExitCode::FAILURE;
            }
        }
    }
    let results: Vec<(Engine, &Setup, Measurement)> = cells
        .iter()
        .zip(best)
        .filter_map(|(&(e, s), m)| Some((e, s, m?)))
        .collect();
    if let Some((engine, setup, m)) = results
        .iter()
        .find(|(_, _, m)| m.checksum_line != results[0].2.checksum_line)
    {
        eprintln!(
            "mips: {name}: `{}` computed {:?} but `{}` on {engine} computed {:?}",
            results[0].1.label, results[0].2.checksum_line, setup.label, m.checksum_line
        );
        return ExitCode::FAILURE;
    }
    // The engines must agree on every count virtual time is made of.
    for (engine, setup, m) in &results {
        for (e2, s2, m2) in &results {
            if s2.key == setup.key
                && (
                    m.stats.cpu.instructions,
                    m.stats.cycles,
                    m.stats.cpu.page_walk_refs,
                ) != (
                    m2.stats.cpu.instructions,
                    m2.stats.cycles,
                    m2.stats.cpu.page_walk_refs,
                )
            {
                eprintln!(
                    "mips: {name}, {}: engine {engine} retired {} instructions in {} cycles, \
                     engine {e2} {} in {}: the engines disagree",
                    setup.label,
                    m.stats.cpu.instructions,
                    m.stats.cycles,
                    m2.stats.cpu.instructions,
                    m2.stats.cycles
                );
                return ExitCode::FAILURE;
            }
        }
    }
    let checksum = results[0]
        .2
        .checksum_line
        .trim_start_matches("mips_workload checksum ");
    if args.json {
        let entries: Vec<String> = results
            .iter()
            .map(|(e, s, m)| {
                format!(
                    "{{\"engine\":\"{e}\",\"key\":\"{}\",\"label\":\"{}\",\"mips\":{:.1},\"cpu_mips\":{:.1},\
                     \"instructions\":{},\"cycles\":{},\"wall_seconds\":{:.6},\"cpu_seconds\":{:.6},\
                     \"tlb_hits\":{},\"tlb_misses\":{},\"page_walk_refs\":{}}}",
                    s.key,
                    s.label,
                    m.mips(),
                    m.cpu_mips(),
                    m.stats.cpu.instructions,
                    m.stats.cycles,
                    m.wall.as_secs_f64(),
                    m.cpu.as_secs_f64(),
                    m.stats.tlb.hits,
                    m.stats.tlb.misses,
                    m.stats.cpu.page_walk_refs
                )
            })
            .collect();
        let per_engine: Vec<String> = engines
            .iter()
            .map(|&e| {
                let field = |mode: Mode, f: fn(&Measurement) -> f64| {
                    results
                        .iter()
                        .find(|(e2, s, _)| *e2 == e && s.mode == mode)
                        .map_or("null".to_string(), |(_, _, m)| format!("{:.1}", f(m)))
                };
                format!(
                    "\"{e}\":{{\"bare_mips\":{},\"ept_mips\":{},\"bare_cpu_mips\":{},\"ept_cpu_mips\":{}}}",
                    field(Mode::Bare, Measurement::mips),
                    field(Mode::GuestEpt, Measurement::mips),
                    field(Mode::Bare, Measurement::cpu_mips),
                    field(Mode::GuestEpt, Measurement::cpu_mips),
                )
            })
            .collect();
        println!(
            "{{\"workload\":\"{name}\",\"checksum\":\"{checksum}\",\"runs\":{},\"engines\":{{{}}},\"results\":[{}]}}",
            args.runs,
            per_engine.join(","),
            entries.join(",")
        );
    } else {
        println!(
            "workload: {name} (checksum {checksum}), best of {} run(s)",
            args.runs
        );
        for (e, s, m) in &results {
            println!(
                "{:<6} {:<46} {:>6.1} MIPS  ({:.1} per CPU-second; {} instructions, {} virtual cycles, \
                 {:.3} s wall, {:.3} s CPU, {} TLB misses)",
                e.name(),
                format!("{}:", s.label),
                m.mips(),
                m.cpu_mips(),
                m.stats.cpu.instructions,
                m.stats.cycles,
                m.wall.as_secs_f64(),
                m.cpu.as_secs_f64(),
                m.stats.tlb.misses
            );
        }
    }
    ExitCode::SUCCESS
}
