//! `faultline`: boots the guest kernel under the hv and runs a guest program.
//!
//! Exit status: the guest's (HC_SHUTDOWN status, or `(v << 1) | 1` for a
//! write of v to the isa-debug-exit port, as QEMU does); 2 for a usage,
//! configuration or kernel-image error; 3 when the VM stopped with an error
//! (triple fault, access outside guest memory, unsupported exit).

mod bench;
mod plot;
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
    /// Reproduce a seed experiment (several VM runs compared side by side).
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Seed 000: `bm -f 4 -w 4` with guest memory 4x host memory, the
    /// array between the two; total work with --apf off, halt and pv, and
    /// the ideal (the array fits in host memory).
    Apf(ApfBenchArgs),
    /// Seed 002: one vCPU, guest memory 2x host memory, a task writing
    /// all its memory several times, with and without a calculation task,
    /// APF off and on.
    #[command(name = "apf-calc")]
    ApfCalc(ApfCalcBenchArgs),
}

/// Options every benchmark shares.
#[derive(clap::Args, Debug)]
struct BenchCommon {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Seed of the guest program and the device model.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// VM runs at once (each on its own host thread). Default: the host's
    /// cores.
    #[arg(long)]
    jobs: Option<usize>,
    /// Run this kernel ELF instead of the bundled guest kernel.
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// Swap device preset (the benchmark's own default if not given).
    #[arg(long, value_enum)]
    swap_device: Option<SwapDeviceArg>,
    /// Read latency, overriding the preset: `8ms` or `4ms-17ms`.
    #[arg(long, value_parser = parse_latency)]
    swap_latency: Option<hv::swap::LatencyRange>,
    /// Bandwidth in bytes per second, overriding the preset.
    #[arg(long, value_parser = parse_size)]
    swap_bandwidth: Option<u64>,
    /// Requests the device serves at once, overriding the preset.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    swap_queue: Option<u32>,
    /// The paravirtual protocol of the `pv` runs.
    #[arg(long, value_enum, default_value_t = ApfProtocolArg::X86)]
    apf_protocol: ApfProtocolArg,
}

impl BenchCommon {
    fn overcommit(&self, default_device: SwapDeviceArg) -> OvercommitArgs {
        OvercommitArgs {
            host_mem: None,
            swap: None,
            swap_device: self.swap_device.unwrap_or(default_device),
            swap_latency: self.swap_latency,
            swap_bandwidth: self.swap_bandwidth,
            swap_queue: self.swap_queue,
            apf: ApfArg::Pv,
            apf_protocol: self.apf_protocol,
        }
    }

    fn jobs(&self) -> usize {
        self.jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1)
    }
}

#[derive(clap::Args, Debug)]
struct ApfBenchArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// vCPUs (the seed: 4).
    #[arg(long, default_value_t = 4)]
    vcpus: u32,
    /// Host memory for guest pages (the container limit).
    #[arg(long, default_value = "32M", value_parser = parse_size)]
    host_mem: u64,
    /// Guest memory (default: 4x host memory, as the seed).
    #[arg(long, value_parser = parse_size)]
    mem: Option<u64>,
    /// bm's array (default: 2x host memory: larger than host memory,
    /// smaller than guest memory).
    #[arg(long, value_parser = parse_size)]
    array: Option<u64>,
    /// bm's run time in virtual seconds (the seed ran 60 s on real
    /// hardware; the ratios settle well before).
    #[arg(long, default_value = "0.2")]
    duration: String,
    /// Faulting threads.
    #[arg(long, default_value_t = 4)]
    fault_threads: u32,
    /// Work threads.
    #[arg(long, default_value_t = 4)]
    work_threads: u32,
    /// Where the SVG plot goes.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Instead: pv/off gain at each of these fixed read latencies.
    #[arg(long, num_args = 0.., value_delimiter = ',', value_parser = hv::swap::device::parse_duration,
          default_missing_value = "100us,1ms,4ms,10ms,20ms")]
    sweep_latency: Option<Vec<u64>>,
}

#[derive(clap::Args, Debug)]
struct ApfCalcBenchArgs {
    #[command(flatten)]
    common: BenchCommon,
    /// Host memory for guest pages (the container limit).
    #[arg(long, default_value = "16M", value_parser = parse_size)]
    host_mem: u64,
    /// Guest memory (default: 2x host memory, as the seed).
    #[arg(long, value_parser = parse_size)]
    mem: Option<u64>,
    /// The writer's memory (default: 1.25x host memory).
    #[arg(long, value_parser = parse_size)]
    array: Option<u64>,
    /// Times the writer writes all of it.
    #[arg(long, default_value_t = 2)]
    loops: u32,
    /// Bytes between the writer's stores.
    #[arg(long, default_value_t = 512)]
    stride: u32,
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
        Command::Bench(BenchCommand::Apf(args)) => bench_apf(args),
        Command::Bench(BenchCommand::ApfCalc(args)) => bench_apf_calc(args),
    }
}

/// The kernel image: `path`, or the bundled guest kernel.
fn load_kernel(path: Option<&PathBuf>) -> Result<Vec<u8>, String> {
    match path {
        Some(path) => {
            std::fs::read(path).map_err(|e| format!("cannot read kernel {}: {e}", path.display()))
        }
        None => BUNDLED_KERNEL.map(<[u8]>::to_vec).ok_or_else(|| {
            "this build has no bundled guest kernel (guest/ was not built); pass --kernel FILE"
                .to_string()
        }),
    }
}

/// Prints a benchmark's output, or its error (exit status 3).
fn finish_bench(result: Result<String, String>) -> ExitCode {
    match result {
        Ok(out) => {
            let _ = std::io::stdout().write_all(out.as_bytes());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("faultline: bench failed: {e}");
            ExitCode::from(3)
        }
    }
}

fn bench_apf(args: ApfBenchArgs) -> ExitCode {
    let kernel = match load_kernel(args.common.kernel.as_ref()) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("faultline: {e}");
            return ExitCode::from(2);
        }
    };
    let mem = args.mem.unwrap_or(args.host_mem * 4);
    let array = args.array.unwrap_or(args.host_mem * 2);
    if array >= mem || mem % (2 << 20) != 0 {
        eprintln!("faultline: the array ({array} bytes) must be smaller than guest memory ({mem} bytes, a multiple of 2 MiB)");
        return ExitCode::from(2);
    }
    let mut base = VmConfig::default();
    args.common.overcommit(SwapDeviceArg::Hdd).apply(&mut base);
    let bench = bench::ApfBench {
        vcpus: args.vcpus,
        host_mem: args.host_mem,
        mem,
        array,
        duration: args.duration.clone(),
        seed: args.common.seed,
        fault_threads: args.fault_threads,
        work_threads: args.work_threads,
        base,
        json: args.common.json,
        plot: args.plot.clone().unwrap_or_else(|| {
            PathBuf::from(if args.sweep_latency.is_some() {
                "faultline-bench-apf-sweep.svg"
            } else {
                "faultline-bench-apf.svg"
            })
        }),
        jobs: args.common.jobs(),
        sweep: args.sweep_latency.clone(),
    };
    finish_bench(bench.run(&kernel))
}

fn bench_apf_calc(args: ApfCalcBenchArgs) -> ExitCode {
    let kernel = match load_kernel(args.common.kernel.as_ref()) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("faultline: {e}");
            return ExitCode::from(2);
        }
    };
    let mem = args.mem.unwrap_or(args.host_mem * 2);
    let array = args.array.unwrap_or(args.host_mem / 4 * 5);
    let mut base = VmConfig::default();
    args.common.overcommit(SwapDeviceArg::Ssd).apply(&mut base);
    let bench = bench::ApfCalcBench {
        host_mem: args.host_mem,
        mem,
        array,
        loops: args.loops,
        stride: args.stride,
        seed: args.common.seed,
        base,
        json: args.common.json,
        jobs: args.common.jobs(),
    };
    finish_bench(bench.run(&kernel))
}

fn run(args: RunArgs) -> ExitCode {
    let kernel = match load_kernel(args.kernel.as_ref()) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("faultline: {e}");
            return ExitCode::from(2);
        }
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
