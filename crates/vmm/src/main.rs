//! `faultline`: boots the guest kernel under the hv and runs a guest program.
//!
//! Exit status: the guest's (HC_SHUTDOWN status, or `(v << 1) | 1` for a
//! write of v to the isa-debug-exit port, as QEMU does); 2 for a usage,
//! configuration or kernel-image error; 3 when the VM stopped with an error
//! (triple fault, access outside guest memory, unsupported exit).

mod report;

use clap::{Parser, Subcommand, ValueEnum};
use hv::{RunStatus, StopReason, Vm, VmConfig};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "faultline",
    version,
    about = "A hypervisor with its own memory virtualization"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Boot the guest kernel and run a guest program.
    Run(RunArgs),
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Number of vCPUs.
    #[arg(long, default_value_t = 1)]
    vcpus: u32,
    /// Guest RAM, e.g. 256M or 1G (a multiple of 2 MiB).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    mem: u64,
    /// Format of the summary printed after the guest's output.
    #[arg(long, value_enum, default_value_t = StatsFormat::Text)]
    stats: StatsFormat,
    /// Seed handed to the guest as the boot option `seed=S`.
    #[arg(long)]
    seed: Option<u64>,
    /// Run this kernel ELF instead of the bundled guest kernel.
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// A guest boot option (repeatable), e.g. `--option crash=triple`.
    #[arg(long = "option", value_name = "OPT")]
    options: Vec<String>,
    /// Scheduling quantum in virtual cycles.
    #[arg(long, default_value_t = 100_000)]
    quantum: u64,
    #[command(flatten)]
    overcommit: OvercommitArgs,
    /// The guest program and its arguments.
    #[arg(last = true, required = true, value_name = "PROGRAM ARGS")]
    program: Vec<String>,
}

/// Host memory, swap and async page fault options (shared by `run` and
/// the benchmarks).
#[derive(clap::Args, Debug, Clone)]
pub struct OvercommitArgs {
    /// Host memory for guest pages (the container limit), e.g. 64M; the
    /// guest may have more. Default: as much as guest memory (no swapping).
    #[arg(long, value_parser = parse_size)]
    host_mem: Option<u64>,
    /// Swap file (created or truncated). Default: a temporary file, removed
    /// at exit.
    #[arg(long, value_name = "FILE")]
    swap: Option<PathBuf>,
    /// Swap device preset (see docs/apf.md for where the numbers come from).
    #[arg(long, value_enum, default_value_t = SwapDeviceArg::Hdd)]
    swap_device: SwapDeviceArg,
    /// Read latency, overriding the preset: fixed (`8ms`) or a uniform
    /// range (`4ms-17ms`).
    #[arg(long, value_parser = parse_latency)]
    swap_latency: Option<hv::swap::LatencyRange>,
    /// Bandwidth in bytes per second, overriding the preset (e.g. 500M).
    #[arg(long, value_parser = parse_size)]
    swap_bandwidth: Option<u64>,
    /// Requests the device serves at once, overriding the preset.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    swap_queue: Option<u32>,
    /// How a vCPU waits for a page on swap: stall (off), halt in the hv
    /// (halt), or tell the PV guest (pv).
    #[arg(long, value_enum, default_value_t = ApfArg::Pv)]
    apf: ApfArg,
    /// The paravirtual protocol of `--apf pv`.
    #[arg(long, value_enum, default_value_t = ApfProtocolArg::X86)]
    apf_protocol: ApfProtocolArg,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwapDeviceArg {
    Hdd,
    Ssd,
    Nvme,
    Net,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApfArg {
    Off,
    Halt,
    Pv,
}

impl From<ApfArg> for hv::apf::ApfMode {
    fn from(a: ApfArg) -> Self {
        match a {
            ApfArg::Off => hv::apf::ApfMode::Off,
            ApfArg::Halt => hv::apf::ApfMode::Halt,
            ApfArg::Pv => hv::apf::ApfMode::Pv,
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApfProtocolArg {
    X86,
    Event,
}

impl OvercommitArgs {
    /// The device model: the preset with the overrides applied.
    pub fn device(&self) -> hv::swap::DeviceModel {
        use hv::swap::DevicePreset;
        let preset = match self.swap_device {
            SwapDeviceArg::Hdd => DevicePreset::Hdd,
            SwapDeviceArg::Ssd => DevicePreset::Ssd,
            SwapDeviceArg::Nvme => DevicePreset::Nvme,
            SwapDeviceArg::Net => DevicePreset::Net,
        };
        let mut model = preset.model();
        let overridden = self.swap_latency.is_some()
            || self.swap_bandwidth.is_some()
            || self.swap_queue.is_some();
        if let Some(latency) = self.swap_latency {
            model.read_latency = latency;
        }
        if let Some(bandwidth) = self.swap_bandwidth {
            model.bandwidth = bandwidth.max(1);
        }
        if let Some(queue) = self.swap_queue {
            model.queue = queue;
        }
        if overridden {
            model.name.push('+');
        }
        model
    }

    /// Applies these options to `config`.
    pub fn apply(&self, config: &mut VmConfig) {
        config.host_mem = self.host_mem;
        config.swap_path = self.swap.clone();
        config.swap_device = self.device();
        config.apf = self.apf.into();
        config.apf_protocol = match self.apf_protocol {
            ApfProtocolArg::X86 => hv::apf::ApfProtocol::X86,
            ApfProtocolArg::Event => hv::apf::ApfProtocol::Event,
        };
    }
}

fn parse_latency(s: &str) -> Result<hv::swap::LatencyRange, String> {
    s.parse()
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum StatsFormat {
    Text,
    Json,
}

/// Parses `256M`, `1G`, `4096K` or a byte count.
fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, shift) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 10),
        Some((i, 'm' | 'M')) => (&s[..i], 20),
        Some((i, 'g' | 'G')) => (&s[..i], 30),
        _ => (s, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{s}` is not a size (e.g. 256M, 1G)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// The kernel command line: boot options, `--`, the program and its
/// arguments (see `abi::BootInfo::cmdline`).
fn boot_cmdline(seed: Option<u64>, extra: &[String], program: &[String]) -> String {
    let mut options = extra.to_vec();
    if let Some(seed) = seed {
        options.push(format!("seed={seed}"));
    }
    format!("{} -- {}", options.join(" "), program.join(" "))
        .trim_start()
        .to_string()
}

#[cfg(bundled_kernel)]
const BUNDLED_KERNEL: Option<&[u8]> = Some(include_bytes!(env!("FAULTLINE_GUEST_KERNEL")));
#[cfg(not(bundled_kernel))]
const BUNDLED_KERNEL: Option<&[u8]> = None;

/// Virtual time run between looks at serial output and progress.
const SLICE_CYCLES: u64 = 30_000_000;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(args),
    }
}

fn run(args: RunArgs) -> ExitCode {
    let kernel = match &args.kernel {
        Some(path) => match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) => {
                eprintln!("faultline: cannot read kernel {}: {e}", path.display());
                return ExitCode::from(2);
            }
        },
        None => match BUNDLED_KERNEL {
            Some(bytes) => bytes.to_vec(),
            None => {
                eprintln!(
                    "faultline: this build has no bundled guest kernel (guest/ was not built); pass --kernel FILE"
                );
                return ExitCode::from(2);
            }
        },
    };
    let mut config = VmConfig {
        vcpus: args.vcpus,
        mem_size: args.mem,
        cmdline: boot_cmdline(args.seed, &args.options, &args.program),
        quantum: args.quantum,
        seed: args.seed.unwrap_or(1),
        ..VmConfig::default()
    };
    args.overcommit.apply(&mut config);
    let mut vm = match Vm::boot(&config, &kernel) {
        Ok(vm) => vm,
        Err(e) => {
            let what = args
                .kernel
                .as_ref()
                .map_or("bundled kernel".to_string(), |p| p.display().to_string());
            eprintln!("faultline: cannot boot {what}: {e}");
            return ExitCode::from(2);
        }
    };

    let started = Instant::now();
    let progress = std::io::stderr().is_terminal();
    let mut last_progress = Instant::now();
    let mut stdout = std::io::stdout().lock();
    let reason = loop {
        let status = vm.run_until(vm.time().saturating_add(SLICE_CYCLES));
        // A closed stdout (e.g. piped into `head`) must not stop the VM.
        let _ = stdout.write_all(&vm.take_serial());
        let _ = stdout.flush();
        if let RunStatus::Stopped(reason) = status {
            break reason;
        }
        if progress && last_progress.elapsed() >= Duration::from_millis(250) {
            last_progress = Instant::now();
            let secs = vm.time() as f64 / machine::cost::CYCLES_PER_SECOND as f64;
            eprint!("\r[faultline] virtual time {secs:.3} s ");
        }
    };
    if progress {
        eprint!("\r\x1b[K");
    }
    let wall = started.elapsed();

    let summary = report::Summary::new(&vm, &reason);
    let text = match args.stats {
        StatsFormat::Text => summary.to_text(),
        StatsFormat::Json => summary.to_json(),
    };
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
    // Host-side figures vary run to run, so they stay off stdout.
    let mips = summary.instructions as f64 / wall.as_secs_f64().max(1e-9) / 1e6;
    eprintln!(
        "faultline: wall time {:.3} s, {mips:.1} MIPS",
        wall.as_secs_f64()
    );
    match reason {
        StopReason::DebugExit { status } => ExitCode::from(status as u8),
        StopReason::Shutdown { status } => ExitCode::from(status as u8),
        StopReason::Error(e) => {
            eprintln!("faultline: VM stopped: {e}");
            ExitCode::from(3)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{boot_cmdline, parse_size};

    #[test]
    fn cmdline() {
        let program = ["bm".to_string(), "-f".to_string(), "4".to_string()];
        assert_eq!(boot_cmdline(Some(3), &[], &program), "seed=3 -- bm -f 4");
        assert_eq!(boot_cmdline(None, &[], &program), "-- bm -f 4");
        let crash = ["crash=triple".to_string()];
        assert_eq!(
            boot_cmdline(Some(1), &crash, &program),
            "crash=triple seed=1 -- bm -f 4"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("8k"), Ok(8192));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999G").is_err());
    }
}
