//! `faultline incoming --listen ADDR:PORT`: the destination of a live
//! migration. It accepts one connection, takes the source's pages (later
//! copies of a page replace earlier ones) and, once the VM has stopped
//! there, its state; checks all of it exactly as `restore` checks a file
//! (the pages and the state are put together as a snapshot and restored
//! through `Vm::restore`); answers `Ack` and runs the VM to its end as
//! `run` would, or answers `Nack` with the reason and exits with status 2.

use super::link::{self, Kind, Link, LinkError};
use crate::run::{run_vm, RunOptions};
use crate::signals::StopRequest;
use crate::units::{parse_positive_duration, parse_size};
use crate::{StatsFormat, ZapArg, EXIT_CONFIG, EXIT_VM_ERROR};
use hv::snapshot::{format, RestoreOptions};
use hv::Vm;
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::time::Duration;

/// `faultline incoming`.
#[derive(clap::Args, Debug)]
pub struct IncomingArgs {
    /// Where to wait for the source (`127.0.0.1:4444`; port 0: any free
    /// port). The address actually bound is printed on stderr.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: String,
    /// Format of the summary (as `run`).
    #[arg(long, value_enum, default_value_t = StatsFormat::Text)]
    stats: StatsFormat,
    /// Stop when the VM's virtual time (from its boot) reaches this.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    time_limit: Option<Duration>,
    /// Stop after this much host time once the VM runs.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    wall_limit: Option<Duration>,
    /// Host memory for guest pages here (default: as at the source).
    #[arg(long, value_parser = parse_size)]
    host_mem: Option<u64>,
    /// The swap file here (default: a temporary file).
    #[arg(long, value_name = "FILE")]
    swap: Option<PathBuf>,
    /// The swap device here (default: the source's model).
    #[arg(long, value_enum)]
    swap_device: Option<crate::SwapDeviceArg>,
    /// Host time to wait for the source at each step.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_positive_duration)]
    timeout: Duration,
}

/// Why no VM came in.
#[derive(Debug, thiserror::Error)]
enum IncomingError {
    #[error("{0}")]
    Link(#[from] LinkError),
    #[error("the VM sent is invalid: {0}")]
    Refused(String),
}

/// Receives one VM; returns it restored, or why not (after telling the
/// source when it is still there to hear it).
fn receive(link: &mut Link, options: &RestoreOptions) -> Result<Vm, IncomingError> {
    let (kind, payload) = link.recv()?;
    if kind != Kind::Hello {
        return Err(LinkError::Protocol(format!("{kind:?} before Hello")).into());
    }
    let (mem_size, _vcpus) = link::parse_hello(&payload)?;
    let npages = mem_size / 4096;
    let mut pages: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    loop {
        let (kind, payload) = link.recv()?;
        match kind {
            Kind::Pages => {
                for (gfn, data) in link::parse_pages(&payload, npages)? {
                    pages.insert(gfn, data.to_vec());
                }
            }
            Kind::State => {
                let memory: Vec<(u64, Vec<u8>)> = pages
                    .into_iter()
                    .filter(|(_, data)| data.iter().any(|&b| b != 0))
                    .collect();
                let snapshot = format::encode(&[
                    (format::SectionKind::State, &payload),
                    (format::SectionKind::Memory, &format::encode_memory(&memory)),
                ]);
                let vm = Vm::restore(&snapshot, options)
                    .map_err(|e| IncomingError::Refused(e.to_string()))?;
                if vm.mem_size() != mem_size {
                    return Err(IncomingError::Refused(format!(
                        "a guest of {} bytes after a Hello for {mem_size}",
                        vm.mem_size()
                    )));
                }
                return Ok(vm);
            }
            other => return Err(LinkError::Protocol(format!("{other:?} from the source")).into()),
        }
    }
}

pub fn incoming(args: IncomingArgs) -> u8 {
    let stop = match StopRequest::install() {
        Ok(stop) => stop,
        Err(e) => {
            eprintln!("faultline: installing signal handlers: {e}");
            return EXIT_CONFIG;
        }
    };
    if let Some(swap) = &args.swap {
        if let Err(e) = crate::config::check_swap_path(swap) {
            eprintln!("faultline: {e}");
            return EXIT_CONFIG;
        }
    }
    let listener = match TcpListener::bind(&args.listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("faultline: listening on {}: {e}", args.listen);
            return EXIT_CONFIG;
        }
    };
    match listener.local_addr() {
        Ok(addr) => eprintln!("faultline: listening on {addr}"),
        Err(e) => {
            eprintln!("faultline: listening on {}: {e}", args.listen);
            return EXIT_CONFIG;
        }
    }
    let (stream, peer) = match listener.accept() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("faultline: accepting a migration: {e}");
            return EXIT_VM_ERROR;
        }
    };
    let mut link = match Link::new(stream, args.timeout) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("faultline: migration from {peer}: {e}");
            return EXIT_VM_ERROR;
        }
    };
    let options = RestoreOptions {
        swap_path: args.swap.clone(),
        host_mem: args.host_mem.map(Some),
        lazy: false,
        swap_device: args.swap_device.map(super::device_model),
    };
    let vm = match receive(&mut link, &options) {
        Ok(vm) => vm,
        Err(e) => {
            eprintln!("faultline: incoming migration from {peer} failed: {e}");
            if let IncomingError::Refused(why) = &e {
                let _ = link.send(Kind::Nack, &why.as_bytes()[..why.len().min(4096)]);
                return EXIT_CONFIG;
            }
            return EXIT_VM_ERROR;
        }
    };
    if let Err(e) = link.send(Kind::Ack, &[]) {
        // The source did not hear that the VM runs here: it resumes it
        // there, so this copy must not run too.
        eprintln!("faultline: incoming migration from {peer}: acknowledging: {e}");
        return EXIT_VM_ERROR;
    }
    eprintln!(
        "faultline: VM from {peer} running at {:.6} s",
        crate::units::cycles_to_secs(vm.time().0)
    );
    let options = RunOptions {
        stats: args.stats,
        time_limit: args.time_limit,
        wall_limit: args.wall_limit,
        memslot_period: None,
        zap: ZapArg::Fast,
        dirty_log: None,
        dirty_log_period: Duration::from_millis(10),
        snapshot: None,
        migrate: None,
    };
    run_vm(vm, &stop, &options)
}
