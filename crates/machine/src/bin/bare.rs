//! `bare`: run a static x86-64 ELF on the machine with no hypervisor.
//!
//! ```text
//! cargo run --release -p machine --bin bare -- FILE.elf [--mem SIZE] [--max-cycles N] [--stats] [--engine interp|jit]
//! ```
//!
//! COM1 output goes to stdout. The process exits with the program's
//! isa-debug-exit status, `(value << 1) | 1` (so a program reporting success
//! with value 0 exits 1), exactly as QEMU with `-device isa-debug-exit`
//! does. Errors of the machine itself (bad ELF, triple fault, a halt nothing
//! can wake, cycle budget exhausted) are reported on stderr with exit status
//! 2, which no program exit can produce.

use clap::Parser;
use machine::bare::page_tables::PageSize;
use machine::bare::{BareConfig, BareMachine, Mode, RunStats};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit status for errors of the runner or the machine (program statuses
/// are always odd).
const MACHINE_ERROR_STATUS: u8 = 2;

#[derive(Debug, Parser)]
#[command(about = "Run a static x86-64 ELF on faultline's machine in bare mode")]
struct Args {
    /// A static ELF64 x86-64 executable, identity-linked at or above 1 MiB,
    /// or the name of a built-in test program (hello, exceptions, usermode,
    /// timer, stringops, mips_workload, mips_workload_small).
    file: PathBuf,
    /// RAM size in bytes, or with a K, M or G suffix.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    mem: u64,
    /// Stop with an error after this many virtual cycles.
    #[arg(long)]
    max_cycles: Option<u64>,
    /// Print instruction, cycle, exit and TLB counters to stderr at the end.
    #[arg(long)]
    stats: bool,
    /// Largest page of the identity map: 4K or 2M.
    #[arg(long, default_value = "2M", value_parser = parse_page_size)]
    page_size: PageSize,
    /// Run in VMX guest mode under an identity EPT instead of on the bare CPU.
    #[arg(long)]
    guest: bool,
    /// What runs the guest code: `interp` (the interpreter) or `jit` (the
    /// translator, falling back to the interpreter for what it does not
    /// translate). Both give the same results and virtual cycles.
    #[arg(long, default_value = "jit")]
    engine: machine::Engine,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, shift) = match s.as_bytes().last().map(|c| c.to_ascii_uppercase()) {
        Some(b'K') => (&s[..s.len() - 1], 10),
        Some(b'M') => (&s[..s.len() - 1], 20),
        Some(b'G') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|e| format!("`{s}` is not a size: {e}"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("`{s}` is too large"))
}

fn parse_page_size(s: &str) -> Result<PageSize, String> {
    match s.to_ascii_uppercase().as_str() {
        "4K" | "4096" => Ok(PageSize::Size4K),
        "2M" => Ok(PageSize::Size2M),
        "1G" => Ok(PageSize::Size1G),
        _ => Err(format!("page size `{s}` is not 4K, 2M or 1G")),
    }
}

fn print_stats(stats: &RunStats) {
    let exits: Vec<String> = stats
        .exits
        .iter()
        .map(|(name, n)| format!("{name}={n}"))
        .collect();
    eprintln!("instructions:   {}", stats.cpu.instructions);
    eprintln!("cycles:         {}", stats.cycles);
    eprintln!("exits:          {}", exits.join(" "));
    eprintln!("exceptions:     {}", stats.cpu.exceptions);
    eprintln!("interrupts:     {}", stats.cpu.interrupts);
    eprintln!("vm exits:       {}", stats.cpu.vm_exits);
    eprintln!("page-walk refs: {}", stats.cpu.page_walk_refs);
    eprintln!(
        "tlb:            {} hits, {} misses, {} flushes",
        stats.tlb.hits, stats.tlb.misses, stats.tlb.flushes
    );
}

fn main() -> ExitCode {
    let args = Args::parse();
    let bytes = match std::fs::read(&args.file) {
        Ok(b) => b,
        Err(e) => match args.file.to_str().and_then(machine::programs::by_name) {
            Some(builtin) => builtin.to_vec(),
            None => {
                eprintln!("bare: cannot read {}: {e}", args.file.display());
                return ExitCode::from(MACHINE_ERROR_STATUS);
            }
        },
    };
    let config = BareConfig {
        mem_size: args.mem,
        page_size: args.page_size,
        max_cycles: args.max_cycles,
        mode: if args.guest {
            Mode::GuestEpt
        } else {
            Mode::Bare
        },
        cpu: machine::CpuConfig {
            engine: args.engine,
            ..machine::CpuConfig::default()
        },
    };
    let mut machine = match BareMachine::new(config, &bytes) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("bare: {}: {e}", args.file.display());
            return ExitCode::from(MACHINE_ERROR_STATUS);
        }
    };
    let result = {
        let mut stdout = std::io::stdout().lock();
        let r = machine.run(&mut stdout);
        let _ = stdout.flush();
        r
    };
    if args.stats {
        print_stats(&machine.stats());
        let j = machine.cpu().jit_stats();
        eprintln!(
            "translator:     {} blocks translated ({} bytes), {} interpreted, {} refused",
            j.blocks_translated, j.code_bytes, j.blocks_interpreted, j.blocks_failed
        );
    }
    match result {
        // The OS keeps the low 8 bits, as for QEMU's exit((v << 1) | 1).
        Ok(exit) => ExitCode::from(exit.status() as u8),
        Err(e) => {
            eprintln!("bare: {}: {e}", args.file.display());
            ExitCode::from(MACHINE_ERROR_STATUS)
        }
    }
}
