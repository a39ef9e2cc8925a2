//! Fuzzer for "the interpreter never panics": random code and registers in
//! ring 0 bare mode and ring 3 guest mode, for a given time.
//!
//! `fuzz --seconds N --seed S [--case K] [--engine both|interp|jit]`
//!
//! Prints every panic with the input that reproduces it (`--case K` replays
//! one) and a summary; exits non-zero if anything panicked.

use clap::Parser;
use clap::ValueEnum;
use machine::difftest::fuzz::{run_fuzz_input, run_fuzz_input_on, FuzzInput};
use machine::difftest::panics;
use machine::difftest::rng::Rng;
use machine::Engine;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "Fuzz the interpreter for panics")]
struct Args {
    /// How long to run.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Seed of the input generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Replay only input K of the seed.
    #[arg(long)]
    case: Option<u64>,
    /// Which engines run each input: both, compared (the default), or
    /// one alone (about twice the cases per second, no comparison).
    #[arg(long, value_enum, default_value_t = Engines::Both)]
    engine: Engines,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Engines {
    Both,
    Interp,
    Jit,
}

impl Engines {
    /// Runs `input` on the chosen engines; the exits.
    fn run(
        self,
        input: &FuzzInput,
    ) -> Result<Vec<machine::vmx::VmExit>, machine::difftest::interp::SandboxError> {
        let alone = |engine| run_fuzz_input_on(input, engine).map(|(exits, _)| exits);
        match self {
            Engines::Both => run_fuzz_input(input),
            Engines::Interp => alone(Engine::Interp),
            Engines::Jit => alone(Engine::Jit),
        }
    }
}

/// Stop after this many distinct panic messages.
const MAX_DISTINCT_PANICS: usize = 20;

fn main() {
    let args = Args::parse();
    panics::install_quiet_hook();
    let deadline = Duration::from_secs(args.seconds);
    let start = Instant::now();
    let progress = std::io::stderr().is_terminal();
    let mut exits: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut cases = 0u64;
    let mut panicked = 0u64;
    // Distinct panic messages (with location): count and first input.
    let mut distinct: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut index = args.case.unwrap_or(0);
    loop {
        if args.case.is_some() && cases == 1 {
            break;
        }
        if args.case.is_none()
            && (start.elapsed() >= deadline || distinct.len() >= MAX_DISTINCT_PANICS)
        {
            break;
        }
        let input = FuzzInput::generate(&mut Rng::for_item(args.seed, index));
        match panics::catching(|| args.engine.run(&input)) {
            Ok(Ok(run)) => {
                for exit in &run {
                    *exits.entry(exit.name()).or_default() += 1;
                }
                if args.case.is_some() {
                    println!("{}exits: {run:?}", input.describe());
                }
            }
            Ok(Err(e)) => {
                eprintln!("fuzz: sandbox setup failed on case {index}: {e}");
                std::process::exit(2);
            }
            Err(message) => {
                panicked += 1;
                let entry = distinct.entry(message.clone()).or_insert((0, index));
                entry.0 += 1;
                // The full reproducer is printed for the first input hitting
                // each distinct panic; the rest are counted.
                if entry.0 == 1 {
                    println!("PANIC case {index} (seed {}): {message}", args.seed);
                    println!("{}", input.describe().trim_end());
                }
            }
        }
        cases += 1;
        index += 1;
        if progress && cases % 1000 == 0 {
            eprint!("\r{cases} cases, {panicked} panics");
        }
    }
    if progress && cases >= 1000 {
        eprintln!();
    }
    for (message, (count, first)) in &distinct {
        println!(
            "panic x{count} (first: --seed {} --case {first}): {message}",
            args.seed
        );
    }
    let summary: Vec<String> = exits.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    println!("exits: {}", summary.join(", "));
    let secs = start.elapsed().as_secs_f64();
    println!(
        "fuzz: {cases} cases in {secs:.1} s ({:.0} a second, seed {}, engine {:?}), {panicked} panics ({} distinct)",
        cases as f64 / secs.max(1e-9),
        args.seed,
        args.engine,
        distinct.len()
    );
    if panicked > 0 {
        std::process::exit(1);
    }
}
