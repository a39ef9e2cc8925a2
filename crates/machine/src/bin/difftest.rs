//! Differential tester: random instruction sequences run natively and in
//! the interpreter, compared register by register.
//!
//! `difftest --cases N --seed S [--groups int,sse] [--verbose] [--case K] [--json]`
//!
//! Each case belongs to one group (`int`: the integer ISA; `sse`: SSE/SSE2
//! with XMM registers and MXCSR compared too); by default all groups are
//! mixed, and the case count per group is printed. The last line of the output is always `difftest: N cases, M mismatches`;
//! the exit status is non-zero when M > 0.

use clap::Parser;
use std::io::{IsTerminal, Write};

#[derive(Parser, Debug)]
#[command(about = "Compare the interpreter with the host CPU on random instruction sequences")]
struct Args {
    /// Number of cases to run.
    #[arg(long, default_value_t = 1000)]
    cases: u64,
    /// Seed of the case generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print every case (code and how both runs stopped), not only
    /// mismatches.
    #[arg(long)]
    verbose: bool,
    /// Replay only case K of the seed (printed in full).
    #[arg(long)]
    case: Option<u64>,
    /// Print mismatches as JSON objects, one per line.
    #[arg(long)]
    json: bool,
    /// Comma-separated instruction groups to draw cases from (int, sse, x87, c32,
    /// xsave);
    /// all by default.
    #[arg(long, value_delimiter = ',')]
    groups: Vec<String>,
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn main() {
    use machine::difftest::campaign::{run_case, stop_name};
    use machine::difftest::compare::{json_report, text_report};
    use machine::difftest::native::NativeRunner;
    use machine::difftest::{generate_case, panics, GenConfig};
    use std::collections::BTreeMap;

    let args = Args::parse();
    panics::install_quiet_hook();
    let mut config = GenConfig::for_host();
    if !args.groups.is_empty() {
        let mut groups = Vec::new();
        for name in &args.groups {
            match machine::difftest::gen::Group::from_name(name) {
                Some(g) => groups.push(g),
                None => {
                    let known: Vec<&str> = machine::difftest::gen::Group::ALL
                        .iter()
                        .map(|g| g.name())
                        .collect();
                    eprintln!(
                        "difftest: unknown group {name:?} (known: {})",
                        known.join(", ")
                    );
                    std::process::exit(2);
                }
            }
        }
        config.groups = groups;
    }
    let (first, count) = match args.case {
        Some(k) => (k, 1),
        None => (0, args.cases),
    };
    let verbose = args.verbose || args.case.is_some();
    let progress = std::io::stderr().is_terminal();
    let mut runner = match NativeRunner::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("difftest: cannot start the native runner: {e}");
            println!("difftest: 0 cases, 0 mismatches");
            std::process::exit(2);
        }
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut mismatches = 0u64;
    let mut stops: BTreeMap<String, u64> = BTreeMap::new();
    let mut per_group: BTreeMap<machine::difftest::gen::Group, u64> = BTreeMap::new();
    let mut done = 0u64;
    for index in first..first + count {
        let case = generate_case(args.seed, index, &config);
        *per_group.entry(case.group).or_default() += 1;
        let outcome = match run_case(&mut runner, case) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("difftest: native runner failed on case {index}: {e}");
                mismatches += 1;
                done += 1;
                continue;
            }
        };
        done += 1;
        *stops.entry(stop_name(&outcome.native.stop)).or_default() += 1;
        let (case, native, interp, diffs) = (
            &outcome.case,
            &outcome.native,
            &outcome.interp,
            &outcome.differences,
        );
        if !diffs.is_empty() {
            mismatches += 1;
            let report = if args.json {
                json_report(case, native, interp, diffs)
            } else {
                text_report(case, native, interp, diffs)
            };
            let _ = writeln!(out, "{}", report.trim_end());
        } else if verbose && !args.json {
            let _ = writeln!(
                out,
                "case {index}: ok ({} at {:#x})",
                native.stop, native.rip
            );
            for (addr, _, text) in case.disassembly() {
                let _ = writeln!(out, "    {addr:08x}  {text}");
            }
        }
        if progress && (done % 100 == 0 || done == count) {
            eprint!("\r{done}/{count} cases, {mismatches} mismatches");
            if done == count {
                eprintln!();
            }
        }
    }
    if !args.json {
        let summary: Vec<String> = stops.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        let _ = writeln!(out, "native stops: {}", summary.join(", "));
    }
    let groups: Vec<String> = per_group
        .iter()
        .map(|(g, n)| format!("{} {n}", g.name()))
        .collect();
    let _ = writeln!(out, "cases per group: {}", groups.join(", "));
    let _ = writeln!(out, "difftest: {done} cases, {mismatches} mismatches");
    let _ = out.flush();
    if mismatches > 0 {
        std::process::exit(1);
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn main() {
    let args = Args::parse();
    let _ = (
        args.cases,
        args.seed,
        args.verbose,
        args.case,
        args.json,
        args.groups,
    );
    eprintln!("difftest: the native side needs x86-64 Linux");
    println!("difftest: 0 cases, 0 mismatches");
    std::process::exit(2);
}
