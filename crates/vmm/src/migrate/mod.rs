//! Snapshots and live migration from the command line: `run
//! --snapshot-at TIME --snapshot FILE` saves, `restore FILE` resumes;
//! `incoming --listen ADDR:PORT` waits for a VM that `run --migrate-to
//! ADDR:PORT --migrate-at TIME` sends (`docs/migration.md`).

mod error;
pub mod incoming;
pub mod link;
pub mod postcopy;
pub mod precopy;

pub use precopy::{MigrateSpec, Outcome, RunFor};

use crate::run::{run_vm, RunOptions};
use crate::signals::StopRequest;
use crate::units::{format_duration, parse_nonzero_size, parse_positive_duration, parse_size};
use crate::{MmuArg, OnOff, RunArgs, StatsFormat, ZapArg, EXIT_CONFIG};
use hv::snapshot::{RestoreOptions, SnapshotError};
use hv::Vm;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `faultline restore`.
#[derive(clap::Args, Debug)]
pub struct RestoreArgs {
    /// The snapshot (`run --snapshot FILE`).
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Format of the summary (as `run`).
    #[arg(long, value_enum, default_value_t = StatsFormat::Text)]
    stats: StatsFormat,
    /// Stop when the VM's virtual time (counted from its boot, not from
    /// the restore) reaches this.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    time_limit: Option<Duration>,
    /// Stop after this much host time.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    wall_limit: Option<Duration>,
    /// Host memory for guest pages here (default: as saved); `--host-mem`
    /// may differ from the saved run's.
    #[arg(long, value_parser = parse_size)]
    host_mem: Option<u64>,
    /// The swap file (default: a temporary file, unlinked at once).
    #[arg(long, value_name = "FILE")]
    swap: Option<PathBuf>,
    /// Load guest memory on first touch: the saved pages go to the swap
    /// file and each first access is a swap-in (the saved swap device's
    /// latency; the vCPU waits as the saved --apf says).
    #[arg(long)]
    lazy: bool,
    /// The swap device here (default: the saved run's model): a lazy
    /// restore's first touches are reads from it.
    #[arg(long, value_enum)]
    swap_device: Option<crate::SwapDeviceArg>,
    /// Save again: stop at this virtual time (from boot) ...
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration, requires = "snapshot")]
    snapshot_at: Option<Duration>,
    /// ... into this file.
    #[arg(long, value_name = "FILE", requires = "snapshot_at")]
    snapshot: Option<PathBuf>,
}

/// `--migrate-mode`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigrateMode {
    /// Rounds of dirty pages while the guest runs, then stop and copy.
    Precopy,
    /// Stop, send the state, run at the destination at once; pages follow
    /// on demand and in the background.
    Postcopy,
    /// Pre-copy rounds (`--max-rounds` at most), then post-copy.
    Hybrid,
}

/// Migrates `vm`, stopped at `spec.at`, as `--migrate-mode` says: the
/// one place that picks the protocol.
pub fn migrate(vm: &mut Vm, spec: &MigrateSpec, run_for: &mut RunFor<'_>) -> Outcome {
    match spec.mode {
        MigrateMode::Precopy => precopy::migrate(vm, spec, run_for),
        MigrateMode::Postcopy | MigrateMode::Hybrid => postcopy::migrate(vm, spec, run_for),
    }
}

/// `run`'s live-migration options.
#[derive(clap::Args, Debug, Clone)]
pub struct MigrateArgs {
    /// Migrate the VM to the `faultline incoming` listening there.
    #[arg(long, value_name = "ADDR:PORT", requires = "migrate_at")]
    pub migrate_to: Option<String>,
    /// When to start migrating (virtual time).
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration, requires = "migrate_to")]
    pub migrate_at: Option<Duration>,
    /// How: pre-copy, post-copy, or hybrid (pre-copy rounds, then
    /// post-copy).
    #[arg(long, value_enum, default_value_t = MigrateMode::Precopy)]
    pub migrate_mode: MigrateMode,
    /// The link model's bandwidth in bytes per second (default: 10 GbE's
    /// line rate, 1.25 GB/s).
    #[arg(long, value_name = "BYTES", default_value = "1250000000", value_parser = parse_nonzero_size)]
    pub link_bandwidth: u64,
    /// The link model's one-way latency (default 25us: half the ~50 us
    /// round trip of a 10 GbE LAN).
    #[arg(long, value_name = "DURATION", default_value = "25us", value_parser = crate::units::parse_duration)]
    pub link_latency: Duration,
    /// Stop and copy once the dirty pages left would cross the link in
    /// this long (QEMU's default downtime limit, 300 ms).
    #[arg(long, value_name = "DURATION", default_value = "300ms", value_parser = parse_positive_duration)]
    pub downtime_limit: Duration,
    /// Stop and copy (hybrid: switch to post-copy) after this many
    /// pre-copy rounds at most.
    #[arg(long, value_name = "N", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub max_rounds: u32,
    /// Host time to wait for the destination at each step.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_positive_duration)]
    pub migrate_timeout: Duration,
    /// Post-copy: after a broken connection, keep trying to reconnect to
    /// the destination for this long (host time).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_positive_duration)]
    pub reconnect_timeout: Duration,
}

impl MigrateArgs {
    /// The migration asked for, if any.
    pub fn spec(&self) -> Option<precopy::MigrateSpec> {
        Some(precopy::MigrateSpec {
            to: self.migrate_to.clone()?,
            at: self.migrate_at?,
            link: link::LinkModel {
                bandwidth: self.link_bandwidth,
                latency: self.link_latency,
            },
            downtime_limit: self.downtime_limit,
            max_rounds: self.max_rounds,
            timeout: self.migrate_timeout,
            mode: self.migrate_mode,
            reconnect_timeout: self.reconnect_timeout,
        })
    }
}

/// The `run` options a migration cannot carry (the same as a snapshot's,
/// its state is a snapshot's state section), and the modes not there yet.
pub fn check_migrate_options(args: &RunArgs) -> Result<(), String> {
    if args.snapshot_at.is_some() {
        return Err("--migrate-to and --snapshot-at together are not supported".into());
    }
    check_snapshot_options(args).map_err(|e| e.replace("--snapshot-at", "--migrate-to"))
}

/// Why a `--migrate-to` address cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MigrateAddressError {
    #[error("--migrate-to {0}: no port; give ADDR:PORT (e.g. 127.0.0.1:4444)")]
    NoPort(String),
    #[error("--migrate-to {to}: `{port}` is not a port (1 to 65535)")]
    BadPort { to: String, port: String },
    #[error("--migrate-to {to}: cannot resolve `{host}`: {source}")]
    Resolve {
        to: String,
        host: String,
        source: std::io::Error,
    },
    #[error("--migrate-to {to}: `{host}` resolves to no address")]
    NoAddress { to: String, host: String },
}

/// Checks a `--migrate-to` address before the VM boots: a host (name,
/// IPv4 or `[IPv6]`) that resolves, and a port from 1 to 65535.
pub fn check_migrate_address(to: &str) -> Result<std::net::SocketAddr, MigrateAddressError> {
    use std::net::ToSocketAddrs;
    let Some((host, port)) = to.rsplit_once(':') else {
        return Err(MigrateAddressError::NoPort(to.to_string()));
    };
    // A bare IPv6 address (`::1`) has colons but no port.
    if host.is_empty() || (host.contains(':') && !host.starts_with('[')) {
        return Err(MigrateAddressError::NoPort(to.to_string()));
    }
    match port.parse::<u16>() {
        Ok(p) if p != 0 => {}
        _ => {
            return Err(MigrateAddressError::BadPort {
                to: to.to_string(),
                port: port.to_string(),
            })
        }
    }
    let host = host.to_string();
    let mut addrs = to
        .to_socket_addrs()
        .map_err(|source| MigrateAddressError::Resolve {
            to: to.to_string(),
            host: host.clone(),
            source,
        })?;
    addrs.next().ok_or(MigrateAddressError::NoAddress {
        to: to.to_string(),
        host,
    })
}

/// The `run` options a snapshot cannot carry yet, refused before the VM
/// boots rather than at the snapshot.
pub fn check_snapshot_options(args: &RunArgs) -> Result<(), String> {
    let refuse = |what: &str| {
        Err(format!(
            "--snapshot-at: {what} is not saved in snapshots yet"
        ))
    };
    if args.overcommit.mmu == MmuArg::Native {
        return refuse("--mmu none");
    }
    if args.overcommit.cr3_cache == OnOff::On {
        return refuse("--cr3-cache on");
    }
    if args.dirty_log.is_some() {
        return refuse("--dirty-log");
    }
    if args.memslot_period.is_some() {
        return refuse("--memslot-period (a second memslot)");
    }
    Ok(())
}

/// Saves `vm` to `path` (through a temporary file renamed into place, so
/// a failed save never leaves half a snapshot under the name).
pub fn save_snapshot(vm: &mut Vm, path: &Path) -> Result<(), String> {
    let bytes = vm.snapshot().map_err(|e| e.to_string())?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".partial");
    let tmp = PathBuf::from(tmp);
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("writing the snapshot {}: {e}", path.display())
    })?;
    eprintln!(
        "faultline: snapshot of {} bytes saved to {} at {}",
        bytes.len(),
        path.display(),
        format_duration(Duration::from_nanos(vm.time().as_ns()))
    );
    Ok(())
}

/// Why a snapshot file cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadSnapshotError {
    #[error("reading the snapshot {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the snapshot {0} is not a regular file")]
    NotAFile(PathBuf),
    #[error("the snapshot {path}: {source}")]
    Bad {
        path: PathBuf,
        source: SnapshotError,
    },
}

/// The bytes of a snapshot file (a regular file only: a FIFO or a device
/// could be endless).
pub fn read_snapshot(path: &Path) -> Result<Vec<u8>, ReadSnapshotError> {
    let io = |source| ReadSnapshotError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(ReadSnapshotError::NotAFile(path.to_path_buf()));
    }
    std::fs::read(path).map_err(io)
}

/// The model of a swap device preset.
pub fn device_model(arg: crate::SwapDeviceArg) -> hv::swap::DeviceModel {
    use crate::SwapDeviceArg as A;
    use hv::swap::DevicePreset as P;
    match arg {
        A::Hdd => P::Hdd,
        A::Ssd => P::Ssd,
        A::Nvme => P::Nvme,
        A::Net => P::Net,
    }
    .model()
}

/// `faultline restore FILE`.
pub fn restore(args: RestoreArgs) -> u8 {
    let prepared = (|| -> Result<(Vm, StopRequest), String> {
        let stop =
            StopRequest::install().map_err(|e| format!("installing signal handlers: {e}"))?;
        if let Some(swap) = &args.swap {
            crate::config::check_swap_path(swap).map_err(|e| e.to_string())?;
        }
        if let Some(path) = &args.snapshot {
            crate::config::check_output_path("--snapshot", path).map_err(|e| e.to_string())?;
        }
        let bytes = read_snapshot(&args.file).map_err(|e| e.to_string())?;
        let options = RestoreOptions {
            swap_path: args.swap.clone(),
            host_mem: args.host_mem.map(Some),
            lazy: args.lazy,
            swap_device: args.swap_device.map(device_model),
        };
        let vm = Vm::restore(&bytes, &options).map_err(|source| {
            ReadSnapshotError::Bad {
                path: args.file.clone(),
                source,
            }
            .to_string()
        })?;
        Ok((vm, stop))
    })();
    let (vm, stop) = match prepared {
        Ok(ready) => ready,
        Err(message) => {
            eprintln!("faultline: {message}");
            return EXIT_CONFIG;
        }
    };
    eprintln!(
        "faultline: restored {} at {}",
        args.file.display(),
        format_duration(Duration::from_nanos(vm.time().as_ns()))
    );
    let options = RunOptions {
        stats: args.stats,
        time_limit: args.time_limit,
        wall_limit: args.wall_limit,
        memslot_period: None,
        zap: ZapArg::Fast,
        dirty_log: None,
        dirty_log_period: Duration::from_millis(10),
        snapshot: args.snapshot_at.zip(args.snapshot.clone()),
        migrate: None,
        postcopy: None,
    };
    run_vm(vm, &stop, &options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrate_addresses_are_checked_up_front() {
        check_migrate_address("127.0.0.1:4444").unwrap();
        check_migrate_address("[::1]:4444").unwrap();
        check_migrate_address("localhost:4444").unwrap();
        for (bad, says) in [
            ("127.0.0.1", "no port"),
            ("::1", "no port"),
            (":4444", "no port"),
            ("127.0.0.1:99999", "is not a port"),
            ("127.0.0.1:0", "is not a port"),
            ("127.0.0.1:x", "is not a port"),
            ("no-such-host.invalid:4444", "cannot resolve"),
        ] {
            let e = check_migrate_address(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
