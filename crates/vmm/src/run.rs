//! `faultline run`: check the configuration, boot, drive the VM to its end
//! and print the summary.

use crate::config::{
    check_swap_path, read_capped, read_input_file, ConfigError, Kernel, CONSOLE_INPUT_CAP,
};
use crate::memslot_churn::{ChurnTrigger, SlotChurn};
use crate::migrate::Outcome;
use crate::report::{DirtyLogSummary, NotReached, Summary};
use crate::session::{
    drive, drive_to, Driven, Ending, Limits, PanicWatch, Progress, StopAt, StopPoint,
};
use crate::signals::StopRequest;
use crate::units::{duration_to_cycles, parse_positive_duration, parse_size};
use crate::{
    DirtyModeArg, GuestArg, OvercommitArgs, StatsFormat, ZapArg, EXIT_CONFIG, EXIT_LIMIT,
    EXIT_VM_ERROR,
};
use hv::{Cycles, StopReason, Vm, VmConfig, RAM_SLOT};
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `faultline run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Number of vCPUs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub vcpus: u32,
    /// Guest RAM, e.g. 256M or 1G (a multiple of 2 MiB, at least what the
    /// kernel image needs).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub mem: u64,
    /// Format of the summary: text after the guest's output, or one JSON
    /// document on stdout holding the guest's output as `console`.
    #[arg(long, value_enum, default_value_t = StatsFormat::Text)]
    pub stats: StatsFormat,
    /// Seed handed to the guest as the boot option `seed=S` (its programs'
    /// random streams) and to the swap device model.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run this kernel instead of the bundled guest kernel: a long-mode ELF
    /// (the `abi` boot protocol), or a multiboot v1 kernel (an image with a
    /// multiboot header, started in 32-bit protected mode as QEMU's
    /// `-kernel` does).
    #[arg(long)]
    pub kernel: Option<PathBuf>,
    /// Which guest to boot: faultline's own kernel (or --kernel), or Linux
    /// (Debian's cloud kernel from the cache `scripts/fetch-linux.sh`
    /// fills, or --kernel-image) with the project's initramfs; with
    /// `linux`, --cmdline gives the kernel options (default `console=ttyS0
    /// earlyprintk=serial,ttyS0 panic=-1 reboot=t`) and `-- PROGRAM ARGS` is appended.
    #[arg(long, value_enum, default_value_t = GuestArg::Faultline, conflicts_with = "kernel")]
    pub guest: GuestArg,
    /// The Linux bzImage for --guest linux (default: the cached one).
    #[arg(long, value_name = "FILE")]
    pub kernel_image: Option<PathBuf>,
    /// An initramfs of your own for --guest linux (a cpio archive, as
    /// QEMU's -initrd), instead of the one with the project's /init.
    #[arg(long, value_name = "FILE")]
    pub initrd: Option<PathBuf>,
    /// A multiboot module (repeatable): `FILE [ARGS]`; the whole string is
    /// the module's command line, as with QEMU.
    #[arg(long = "module", value_name = "FILE [ARGS]", requires = "kernel")]
    pub modules: Vec<String>,
    /// The kernel's options: with the bundled kernel or Linux, `--` and
    /// the program with its arguments are appended; with --kernel, the
    /// whole command line, verbatim (default: the boot options, `--`, the
    /// program and its arguments).
    #[arg(long, value_name = "STR")]
    pub cmdline: Option<String>,
    /// What the guest console (COM1) reads: a file, or `-` for this
    /// process's standard input (read to its end before the VM starts, so
    /// the run repeats). Default: no input.
    #[arg(long, value_name = "FILE|-")]
    pub console_input: Option<PathBuf>,
    /// Stop the VM at any access to unassigned MMIO (no RAM, no device),
    /// for hunting guest bugs. Default: as on a PC, such reads give all
    /// ones and writes are dropped (counted in the summary).
    #[arg(long)]
    pub strict_mmio: bool,
    /// Attach a PCI device (repeatable; `edu`: QEMU's educational
    /// device), on a PCI bus at ports 0xcf8/0xcfc. Default: none, and no
    /// PCI bus. A VM with PCI devices refuses snapshots and migration.
    #[arg(long = "device", value_enum, value_name = "DEVICE")]
    pub devices: Vec<crate::DeviceArg>,
    /// Attach an IOMMU (`intel`: a VT-d unit at 0xfed90000 with DMA and
    /// interrupt remapping, and an ACPI DMAR table). Default: none.
    #[arg(long, value_enum, value_name = "KIND")]
    pub iommu: Option<crate::IommuArg>,
    /// A guest boot option (repeatable), e.g. `--option crash=triple`.
    #[arg(long = "option", value_name = "OPT")]
    pub options: Vec<String>,
    /// With --host-cpus below --vcpus: how often, in virtual cycles, the
    /// host scheduler decides which vCPUs run. No effect otherwise.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1000..))]
    pub quantum: u64,
    /// How far, in virtual cycles, a vCPU may run guest code past the
    /// earliest other vCPU (default and maximum: the shortest IPI flight
    /// after an exit, 1,010 cycles at the default costs). Smaller values
    /// change no IPI's or lock's timing, only how finely guest code
    /// interleaves across vCPUs.
    #[arg(long, value_name = "CYCLES", value_parser = clap::value_parser!(u64).range(1..))]
    pub lookahead: Option<u64>,
    /// Host CPUs the vCPUs share (default: one per vCPU). Below --vcpus,
    /// only this many vCPUs run at a time under a fair scheduler and the
    /// others accumulate steal time.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub host_cpus: Option<u32>,
    /// How long a vCPU keeps a host CPU while others wait (default 3ms,
    /// Linux's EEVDF slice on an 8-CPU host).
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub host_slice: Option<Duration>,
    /// Stop the run after this much virtual time (`500ms`, `2s`, `1m`):
    /// stop reason `time_limit`, exit status 124.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub time_limit: Option<Duration>,
    /// Stop the run after this much host (wall-clock) time: stop reason
    /// `wall_limit`, exit status 124.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub wall_limit: Option<Duration>,
    #[command(flatten)]
    pub overcommit: OvercommitArgs,
    /// How memslot changes drop every mapping: one by one under one lock
    /// hold (slow, KVM before seed 003), by MMU generation with batched
    /// teardown and lock breaks (fast), or seed 003's v2 (seed: hash
    /// table and rmaps reset wholesale, old pages freed after the lock).
    #[arg(long, value_enum, default_value_t = ZapArg::Fast)]
    pub zap: ZapArg,
    /// Delete and re-add a 2 MiB memslot above guest RAM every DURATION of
    /// virtual time while the guest runs (each drops every mapping).
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub memslot_period: Option<Duration>,
    /// Log guest RAM's dirty pages from boot in this mode (bitmap, manual,
    /// ring, or pml: the machine's page-modification logging, EPT with
    /// --ept-ad on only) and collect the log every --dirty-log-period.
    #[arg(long, value_enum, value_name = "MODE")]
    pub dirty_log: Option<DirtyModeArg>,
    /// Virtual time between two collections of the dirty log.
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = parse_positive_duration,
        default_value = "10ms",
        requires = "dirty_log"
    )]
    pub dirty_log_period: Duration,
    /// Stop at this virtual time and save the VM to --snapshot (`faultline
    /// restore FILE` resumes it).
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration, requires = "snapshot")]
    pub snapshot_at: Option<Duration>,
    /// Where --snapshot-at saves the VM.
    #[arg(long, value_name = "FILE", requires = "snapshot_at")]
    pub snapshot: Option<PathBuf>,
    #[command(flatten)]
    pub migrate: crate::migrate::MigrateArgs,
    /// The guest program and its arguments (the bundled kernel needs one).
    #[arg(
        last = true,
        required_unless_present = "kernel",
        value_name = "PROGRAM ARGS"
    )]
    pub program: Vec<String>,
}

/// The kernel command line: boot options, `--`, the program and its
/// arguments (see `abi::BootInfo::cmdline`).
pub fn boot_cmdline(seed: Option<u64>, extra: &[String], program: &[String]) -> String {
    let mut options = extra.to_vec();
    if let Some(seed) = seed {
        options.push(format!("seed={seed}"));
    }
    format!("{} -- {}", options.join(" "), program.join(" "))
        .trim_start()
        .to_string()
}

/// The process's exit status for a run that ended so.
pub fn exit_status(ending: &Ending) -> u8 {
    match ending {
        // Modulo 256, as a process's own exit status is.
        Ending::Vm(StopReason::DebugExit { status }) => *status as u8,
        Ending::Vm(StopReason::Shutdown { status }) => *status as u8,
        Ending::Vm(StopReason::Error(_)) => EXIT_VM_ERROR,
        // A clean stop, as a shutdown with status 0.
        Ending::Vm(StopReason::PowerOff) => 0,
        Ending::Interrupted(signal) => signal.exit_status(),
        Ending::TimeLimit(_) | Ending::WallLimit(_) => EXIT_LIMIT,
        // The run did what was asked: stop and save.
        Ending::Snapshot { .. } | Ending::Migrated { .. } => 0,
        Ending::SnapshotFailed { .. } => EXIT_VM_ERROR,
        Ending::GuestPanic { .. } => EXIT_VM_ERROR,
    }
}

/// A booted VM and the signal handlers, or why there is none.
fn prepare(args: &RunArgs) -> Result<(Vm, StopRequest), ConfigError> {
    let stop = StopRequest::install().map_err(ConfigError::Signals)?;
    check_options(args)?;
    if args.guest == GuestArg::Linux {
        return Ok((prepare_linux(args)?, stop));
    }
    let kernel = Kernel::load(args.kernel.as_deref())?;
    if kernel.multiboot.is_none() {
        kernel.check_program(args.program.first().map_or("", String::as_str))?;
    }
    kernel.check_memory(args.mem, args.overcommit.host_mem)?;
    if let Some(swap) = &args.overcommit.swap {
        check_swap_path(swap)?;
    }
    // The bundled kernel's `--cmdline` gives the boot options, and the
    // program is appended (as for Linux); another kernel's is verbatim.
    let cmdline = match (&args.cmdline, &args.kernel) {
        (Some(cmdline), Some(_)) => cmdline.clone(),
        (Some(cmdline), None) => {
            let options: Vec<String> = cmdline.split_whitespace().map(String::from).collect();
            boot_cmdline(
                args.seed,
                &[args.options.clone(), options].concat(),
                &args.program,
            )
        }
        (None, _) => boot_cmdline(args.seed, &args.options, &args.program),
    };
    let mut config = vm_config(args, cmdline)?;
    config.modules = read_modules(&args.modules, args.mem)?;
    let mut vm = Vm::boot(&config, &kernel.bytes).map_err(|source| ConfigError::Boot {
        what: kernel.describe(),
        source,
    })?;
    vm.set_strict_mmio(args.strict_mmio);
    Ok((vm, stop))
}

/// The boot options the bundled kernel knows (`guest/README.md`), as
/// `--option` gives them.
const BOOT_OPTIONS: &[&str] = &[
    "no-apf",
    "no-cr3-cache",
    "no-steal-time",
    "no-pv-tlb-flush",
    "no-pv-sched-yield",
    "no-pv-unhalt",
    "crash=triple",
    "crash=wild-write",
    "crash=panic",
];

/// Options that would be accepted and then do nothing (or not what was
/// meant), refused before boot.
fn check_options(args: &RunArgs) -> Result<(), ConfigError> {
    let o = &args.overcommit;
    if o.cr3_cache == crate::OnOff::On && o.mmu != crate::MmuArg::Shadow {
        return Err(ConfigError::Invalid(
            "--cr3-cache on: the CR3 cache holds shadow roots: it needs --mmu shadow".into(),
        ));
    }
    let pci = !args.devices.is_empty() || args.iommu.is_some();
    if pci && (args.snapshot_at.is_some() || args.migrate.migrate_to.is_some()) {
        return Err(ConfigError::Invalid(
            "--device/--iommu: the PCI devices' state is not saved, so such a VM cannot be snapshotted or migrated".into(),
        ));
    }
    if args.guest == GuestArg::Linux && !args.options.is_empty() {
        return Err(ConfigError::Invalid(
            "--option: boot options of faultline's own kernel; Linux takes its options from --cmdline".into(),
        ));
    }
    if args.kernel.is_none() && args.guest == GuestArg::Faultline {
        if let Some(bad) = args
            .options
            .iter()
            .find(|o| !BOOT_OPTIONS.contains(&o.as_str()) && o.strip_prefix("seed=").is_none())
        {
            return Err(ConfigError::Invalid(format!(
                "--option {bad}: the bundled kernel has no such boot option; it knows: {} seed=S",
                BOOT_OPTIONS.join(" ")
            )));
        }
        if let Some(cmdline) = &args.cmdline {
            if cmdline.split_whitespace().any(|w| w == "--") {
                return Err(ConfigError::Invalid(format!(
                    "--cmdline {cmdline:?}: give the boot options only; the program comes after `--` \
                     on faultline's own command line and is appended"
                )));
            }
        }
    }
    Ok(())
}

/// The VM `run`'s options describe, booting with `cmdline` (the bundled
/// kernel's and Linux's differ; everything else is the same).
fn vm_config(args: &RunArgs, cmdline: String) -> Result<VmConfig, ConfigError> {
    let mut config = VmConfig {
        vcpus: args.vcpus,
        mem_size: args.mem,
        cmdline,
        console_input: read_console_input(args.console_input.as_deref())?,
        quantum: args.quantum,
        host_cpus: args.host_cpus,
        host_slice: args
            .host_slice
            .map_or(hv::DEFAULT_HOST_SLICE, crate::units::duration_to_cycles),
        seed: args.seed.unwrap_or(1),
        zap: args.zap.into(),
        devices: hv::DeviceSet {
            edu: args.devices.contains(&crate::DeviceArg::Edu),
            intel_iommu: args.iommu == Some(crate::IommuArg::Intel),
        },
        ..VmConfig::default()
    };
    args.overcommit.apply(&mut config);
    if let Some(lookahead) = args.lookahead {
        let max = hv::max_lookahead(&config.costs, &config.cpu_costs);
        if lookahead > max {
            return Err(ConfigError::Lookahead { lookahead, max });
        }
        config.lookahead = lookahead;
    }
    Ok(config)
}

/// `--guest linux`: the bzImage, the initramfs with init and the
/// programs, and the command line that names the program.
fn prepare_linux(args: &RunArgs) -> Result<Vm, ConfigError> {
    let initrd = match &args.initrd {
        Some(path) => read_input_file("--initrd", path, args.mem)?,
        None => {
            crate::linux::check_program(&args.program)?;
            crate::linux::initramfs()?
        }
    };
    let (path, image) = crate::linux::read_image(args.kernel_image.as_deref())?;
    if let Some(swap) = &args.overcommit.swap {
        check_swap_path(swap)?;
    }
    let options = args
        .cmdline
        .as_deref()
        .unwrap_or(crate::linux::DEFAULT_OPTIONS);
    let config = vm_config(args, crate::linux::cmdline(options, &args.program))?;
    let mut vm = Vm::boot_linux(&config, &image, &initrd).map_err(|source| ConfigError::Boot {
        what: path.display().to_string(),
        source,
    })?;
    vm.set_strict_mmio(args.strict_mmio);
    Ok(vm)
}

/// `--console-input`: the file's bytes, or standard input's to its end
/// (at most [`CONSOLE_INPUT_CAP`] either way).
fn read_console_input(path: Option<&std::path::Path>) -> Result<Vec<u8>, ConfigError> {
    let Some(path) = path else {
        return Ok(Vec::new());
    };
    Ok(if path.as_os_str() == "-" {
        read_capped(
            "--console-input",
            path,
            std::io::stdin().lock(),
            CONSOLE_INPUT_CAP,
            0,
        )?
    } else {
        read_input_file("--console-input", path, CONSOLE_INPUT_CAP)?
    })
}

/// `--module FILE [ARGS]`: each file's bytes (each must fit in guest
/// memory) and the whole string as its command line.
fn read_modules(modules: &[String], mem: u64) -> Result<Vec<(Vec<u8>, String)>, ConfigError> {
    modules
        .iter()
        .map(|spec| {
            let file = spec.split(' ').next().unwrap_or_default();
            let bytes = read_input_file("--module", std::path::Path::new(file), mem)?;
            Ok((bytes, spec.clone()))
        })
        .collect()
}

/// What drives a VM to its end, beyond the VM itself: the options of
/// `run` that act while it runs (`faultline restore` takes some of them
/// too).
pub struct RunOptions {
    pub stats: StatsFormat,
    pub time_limit: Option<Duration>,
    pub wall_limit: Option<Duration>,
    pub memslot_period: Option<Duration>,
    pub zap: ZapArg,
    pub dirty_log: Option<DirtyModeArg>,
    pub dirty_log_period: Duration,
    /// `--snapshot-at TIME --snapshot FILE`: stop at TIME and save.
    pub snapshot: Option<(Duration, std::path::PathBuf)>,
    /// `--migrate-to ADDR --migrate-at TIME`.
    pub migrate: Option<crate::migrate::precopy::MigrateSpec>,
    /// A post-copy destination: pages still come from the source.
    pub postcopy: Option<std::sync::Arc<crate::migrate::postcopy::Destination>>,
}

impl RunOptions {
    fn of(args: &RunArgs) -> RunOptions {
        RunOptions {
            stats: args.stats,
            time_limit: args.time_limit,
            wall_limit: args.wall_limit,
            memslot_period: args.memslot_period,
            zap: args.zap,
            dirty_log: args.dirty_log,
            dirty_log_period: args.dirty_log_period,
            snapshot: args.snapshot_at.zip(args.snapshot.clone()),
            migrate: args.migrate.spec(),
            postcopy: None,
        }
    }
}

pub fn run(args: RunArgs) -> u8 {
    if args.snapshot_at.is_some() {
        if let Err(e) = crate::migrate::check_snapshot_options(&args) {
            eprintln!("faultline: {e}");
            return EXIT_CONFIG;
        }
    }
    if let Some(path) = &args.snapshot {
        if let Err(e) = crate::config::check_output_path("--snapshot", path) {
            eprintln!("faultline: {e}");
            return EXIT_CONFIG;
        }
    }
    if let Some(to) = &args.migrate.migrate_to {
        if let Err(e) = crate::migrate::check_migrate_options(&args) {
            eprintln!("faultline: {e}");
            return EXIT_CONFIG;
        }
        if let Err(e) = crate::migrate::check_migrate_address(to) {
            eprintln!("faultline: {e}");
            return EXIT_CONFIG;
        }
    }
    let (vm, stop) = match prepare(&args) {
        Ok(ready) => ready,
        Err(e) => {
            eprintln!("faultline: {e}");
            return EXIT_CONFIG;
        }
    };
    run_vm(vm, &stop, &RunOptions::of(&args))
}

/// Drives `vm` to its end as `run` does (the guest's output on stdout,
/// then the summary) and returns the exit status.
pub fn run_vm(mut vm: Vm, stop: &StopRequest, args: &RunOptions) -> u8 {
    let limits = Limits {
        time: args.time_limit,
        wall: args.wall_limit,
        slice: None,
    };
    // `--snapshot-at` or `--migrate-at` (never both: `check_migrate_options`).
    let stop_at = match (&args.snapshot, &args.migrate) {
        (Some((at, _)), _) => Some((*at, StopPoint::Snapshot)),
        (None, Some(spec)) => Some((spec.at, StopPoint::Migrate)),
        (None, None) => None,
    }
    .map(|(at, point)| StopAt {
        at: Cycles(duration_to_cycles(at)),
        point,
    });
    let mut churn = match args.memslot_period {
        Some(period) => {
            let trigger = ChurnTrigger::Period(Cycles(duration_to_cycles(period)));
            match SlotChurn::install(&mut vm, trigger, u32::MAX) {
                Ok(churn) => Some(churn),
                Err(e) => {
                    eprintln!("faultline: --memslot-period: {e}");
                    return EXIT_CONFIG;
                }
            }
        }
        None => None,
    };
    let mut logger = match args.dirty_log {
        Some(mode) => match DirtyLogger::install(&mut vm, mode, args.dirty_log_period) {
            Ok(logger) => Some(logger),
            Err(e) => {
                eprintln!("faultline: --dirty-log: {e}");
                return EXIT_CONFIG;
            }
        },
        None => None,
    };
    let mut dirty_log_error = None;
    let json = args.stats == StatsFormat::Json;
    let started = Instant::now();
    let mut progress = Progress::single(limits.time);
    let mut stdout = std::io::stdout().lock();
    let mut console = Vec::new();
    let mut panic = PanicWatch::default();
    let mut after_slice = |vm: &mut Vm| {
        let serial = vm.take_serial();
        panic.feed(&serial);
        if json {
            console.extend_from_slice(&serial);
        } else if !serial.is_empty() {
            // The bar must not be drawn over the guest's output. A closed
            // stdout (e.g. piped into `head`) must not stop the VM.
            progress.suspend(|| {
                let _ = stdout.write_all(&serial);
                let _ = stdout.flush();
            });
        }
        if let Some(churn) = churn.as_mut() {
            churn.after_slice(vm);
        }
        if let Some(logger) = logger.as_mut() {
            if let Err(e) = logger.after_slice(vm) {
                dirty_log_error.get_or_insert(e);
            }
        }
        progress.update("", vm);
        panic.ending()
    };
    let mut migration = None;
    let mut migration_lost = false;
    let mut migration_failed = false;
    let mut ending = match drive_to(&mut vm, &limits, stop_at, stop, &mut after_slice) {
        Driven::Ended(ending) => ending,
        Driven::Reached(StopPoint::Snapshot) => {
            let (at, path) = args
                .snapshot
                .as_ref()
                .expect("a snapshot stop point comes from --snapshot-at");
            match crate::migrate::save_snapshot(&mut vm, path) {
                Ok(()) => Ending::Snapshot {
                    path: path.clone(),
                    at: *at,
                },
                Err(message) => {
                    progress.suspend(|| eprintln!("faultline: {message}"));
                    Ending::SnapshotFailed { message }
                }
            }
        }
        Driven::Reached(StopPoint::Migrate) => {
            let spec = args
                .migrate
                .as_ref()
                .expect("a migration stop point comes from --migrate-at");
            // A stretch the migration asks for ends at its time exactly,
            // before `--time-limit` if that is the same.
            let mut run_for = |vm: &mut Vm, until: Cycles| -> Option<Ending> {
                let stretch = StopAt {
                    at: until,
                    point: StopPoint::Stretch,
                };
                match drive_to(vm, &limits, Some(stretch), stop, &mut after_slice) {
                    Driven::Reached(_) => None,
                    Driven::Ended(ending) => Some(ending),
                }
            };
            match crate::migrate::migrate(&mut vm, spec, &mut run_for) {
                Outcome::Migrated(report) => {
                    let ending = Ending::Migrated {
                        to: report.to.clone(),
                    };
                    migration = Some(report);
                    ending
                }
                Outcome::Lost(report) => {
                    eprintln!(
                        "faultline: post-copy to {} failed after the switch-over: {}; the VM cannot go on here (the destination ran it) nor complete there",
                        report.to,
                        report.failed.as_deref().unwrap_or("?")
                    );
                    let ending = Ending::Migrated {
                        to: report.to.clone(),
                    };
                    migration_lost = true;
                    migration = Some(report);
                    ending
                }
                Outcome::Ended(report, ending) => {
                    migration = Some(report);
                    migration_failed = true;
                    ending
                }
                Outcome::Failed(report) => {
                    eprintln!(
                        "faultline: migration to {} failed: {}; the VM goes on here",
                        report.to,
                        report.failed.as_deref().unwrap_or("?")
                    );
                    migration = Some(report);
                    migration_failed = true;
                    drive(&mut vm, &limits, stop, &mut after_slice)
                }
            }
        }
        Driven::Reached(StopPoint::Stretch) => unreachable!("no stretch was asked for"),
    };
    progress.finish();
    let wall = started.elapsed();
    ending = panic.explain(ending);

    // A save point handles the vCPUs' parked exits first (`Vm::settle`):
    // what the guest printed in them is the source's output too.
    let serial = vm.take_serial();
    if json {
        console.extend_from_slice(&serial);
    } else {
        let _ = stdout.write_all(&serial);
        let _ = stdout.flush();
    }
    let mut status = exit_status(&ending);
    if migration_lost {
        status = EXIT_VM_ERROR;
    }
    // A post-copy destination waits for the rest of its pages (so the
    // source can go), however the run ended.
    let postcopy = args.postcopy.as_ref().map(|dest| {
        if let Err(e) = dest.finish() {
            eprintln!("faultline: post-copy: the VM's memory is incomplete: {e}");
            status = EXIT_VM_ERROR;
        }
        dest.stats()
    });
    // A guest that powers off may have said its status first (a Linux
    // guest's init, through the platform's status port).
    if let (Ending::Vm(StopReason::PowerOff), Some(guest)) = (&ending, vm.guest_status()) {
        status = guest;
    }
    // A stop point the run never reached, or a migration that failed
    // (the VM went on here): the run did not do what was asked.
    let not_reached = unreached(args, &ending, migration.is_some(), vm.time());
    if let Some(n) = &not_reached {
        eprintln!(
            "faultline: {} {} was not reached: the run ended at {:.6} s",
            n.option,
            n.at,
            crate::units::cycles_to_secs(n.ended_cycles)
        );
    }
    if (not_reached.is_some() || migration_failed) && matches!(ending, Ending::Vm(_)) {
        status = EXIT_VM_ERROR;
    }
    let memslot = match churn.map(|c| c.finish(&vm, args.zap.into())) {
        Some(Ok(run)) => Some(run),
        Some(Err(e)) => {
            eprintln!("faultline: a memslot change failed: {e}");
            status = EXIT_VM_ERROR;
            None
        }
        None => None,
    };
    if let Some(e) = dirty_log_error {
        eprintln!("faultline: collecting the dirty log: {e}");
        status = EXIT_VM_ERROR;
    }
    let console = json.then(|| String::from_utf8_lossy(&console).into_owned());
    let mut summary = Summary::new(&vm, &ending, status, console);
    summary.memslot = memslot;
    summary.dirty_log = logger.map(|l| l.finish(&vm));
    summary.migration = migration;
    summary.postcopy = postcopy;
    summary.not_reached = not_reached;
    let text = if json {
        summary.to_json()
    } else {
        summary.to_text()
    };
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
    // Host-side figures vary run to run, so they stay off stdout.
    let mips = summary.instructions as f64 / wall.as_secs_f64().max(1e-9) / 1e6;
    eprintln!(
        "faultline: wall time {:.3} s, {mips:.1} MIPS, vCPU thread {:.3} s of CPU time",
        wall.as_secs_f64(),
        thread_cpu_seconds()
    );
    match &ending {
        Ending::Vm(StopReason::Error(e)) => eprintln!("faultline: VM stopped: {e}"),
        Ending::Vm(_) => {}
        other => eprintln!("faultline: stopped: {}", other.describe()),
    }
    status
}

/// The `--snapshot-at` or `--migrate-at` a run that ended so, at `now`,
/// never reached (`migrated`: a migration was attempted).
fn unreached(
    args: &RunOptions,
    ending: &Ending,
    migrated: bool,
    now: Cycles,
) -> Option<NotReached> {
    let point = |option: &'static str, at: Duration| NotReached {
        option,
        at: crate::units::format_duration(at),
        at_cycles: duration_to_cycles(at),
        ended_cycles: now.0,
    };
    if let Some((at, _)) = &args.snapshot {
        if !matches!(
            ending,
            Ending::Snapshot { .. } | Ending::SnapshotFailed { .. }
        ) {
            return Some(point("--snapshot-at", *at));
        }
    }
    match &args.migrate {
        Some(spec) if !migrated => Some(point("--migrate-at", spec.at)),
        _ => None,
    }
}

/// `--dirty-log MODE`: guest RAM logs from boot; the VMM collects the
/// log every period of virtual time (in ring mode also whenever a vCPU
/// stopped on a full ring), as a migration or a display would.
struct DirtyLogger {
    period: Cycles,
    next: Cycles,
    summary: DirtyLogSummary,
    ring_full_seen: u64,
}

/// Summed over the vCPUs: exits of `name`, and dirty-ring-full stops.
fn exit_count(vm: &Vm, name: &str) -> u64 {
    vm.stats()
        .vcpus
        .iter()
        .filter_map(|v| v.exits.get(name))
        .map(|e| e.count)
        .sum()
}

fn ring_full_count(vm: &Vm) -> u64 {
    vm.stats()
        .vcpus
        .iter()
        .map(|v| v.dirty_ring_full_exits)
        .sum()
}

/// A virtual time as a duration from boot, rounded up (so a limit of
/// that duration is not reached before it).
fn cycles_ms(c: Cycles) -> f64 {
    c.0 as f64 / hv::CYCLES_PER_SECOND as f64 * 1e3
}

impl DirtyLogger {
    fn install(vm: &mut Vm, mode: DirtyModeArg, period: Duration) -> Result<Self, String> {
        let mode = hv::DirtyLogMode::from(mode);
        vm.enable_dirty_log(RAM_SLOT, mode)
            .map_err(|e| e.to_string())?;
        let period = Cycles(duration_to_cycles(period).max(1));
        Ok(DirtyLogger {
            period,
            next: vm.time() + period,
            summary: DirtyLogSummary {
                mode: mode.name().to_string(),
                period_ms: cycles_ms(period),
                ..DirtyLogSummary::default()
            },
            ring_full_seen: 0,
        })
    }

    fn after_slice(&mut self, vm: &mut Vm) -> Result<(), String> {
        let ring_full = ring_full_count(vm);
        let stopped_on_ring = ring_full > self.ring_full_seen;
        self.ring_full_seen = ring_full;
        if vm.time() < self.next && !stopped_on_ring {
            return Ok(());
        }
        let collected = vm.collect_dirty_log(RAM_SLOT).map_err(|e| e.to_string())?;
        self.summary.collections += 1;
        self.summary.pages += collected.pages.len() as u64;
        self.summary.get_ms += cycles_ms(collected.get.cycles);
        self.summary.clear_ms += cycles_ms(collected.clear.cycles);
        if vm.time() >= self.next {
            self.next = vm.time() + self.period;
        }
        Ok(())
    }

    fn finish(mut self, vm: &Vm) -> DirtyLogSummary {
        self.summary.ring_full_exits = ring_full_count(vm);
        self.summary.pml_full_exits = exit_count(vm, "pml_full");
        self.summary
    }
}

/// CPU time of the calling thread (the one that ran the vCPUs) so far:
/// what the run cost on the critical path, without the helper threads
/// (prefaulting, translating) and whatever else shares the host.
fn thread_cpu_seconds() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec the call writes; the clock id is a
    // constant every Linux has.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } != 0 {
        return f64::NAN;
    }
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

#[cfg(test)]
mod tests {
    use super::boot_cmdline;

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
}
