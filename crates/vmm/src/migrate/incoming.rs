//! `faultline incoming --listen ADDR:PORT`: the destination of a live
//! migration. It accepts one connection, takes the source's pages (later
//! copies of a page replace earlier ones) and, once the VM has stopped
//! there, its state; checks all of it exactly as `restore` checks a file
//! (the pages and the state are put together as a snapshot and restored
//! through `Vm::restore`); answers `Ack` and runs the VM to its end as
//! `run` would, or answers `Nack` with the reason and exits with status 2.
//!
//! Post-copy and hybrid: a `Pending` list of pages still to come arrives
//! before the state; the VM is restored with those pages remote and runs
//! at once, while they come (`postcopy.rs`).

use super::link::{self, Kind, Link, LinkError};
use super::postcopy::{Destination, Receiving};
use crate::run::{run_vm, RunOptions};
use crate::signals::{Signal, StopRequest};
use crate::units::{format_duration, parse_positive_duration, parse_size};
use crate::{StatsFormat, ZapArg, EXIT_CONFIG, EXIT_VM_ERROR};
use hv::snapshot::{format, RestoreOptions};
use hv::Vm;
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// Host time to wait for the source: for its connection (status 3
    /// when none comes), then at each step of the migration.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_positive_duration)]
    timeout: Duration,
    /// Post-copy: after a broken connection, wait this long (host time)
    /// for the source to reconnect before giving up on the missing pages.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_positive_duration)]
    reconnect_timeout: Duration,
}

/// A VM received, and for post-copy the pages still to come.
struct Received {
    vm: Vm,
    mem_size: u64,
    postcopy: Option<Arc<Destination>>,
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
fn receive(link: &mut Link, options: &RestoreOptions) -> Result<Received, IncomingError> {
    let (kind, payload) = link.recv()?;
    if kind != Kind::Hello {
        return Err(LinkError::Protocol(format!("{kind:?} before Hello")).into());
    }
    let (mem_size, _vcpus) = link::parse_hello(&payload)?;
    let npages = mem_size / 4096;
    let mut pages: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    // Post-copy: the pages still to come, in the source's order.
    let mut pending: Vec<u64> = Vec::new();
    // Post-copy: the source's link model, which times the pages to come.
    let mut model = None;
    loop {
        let (kind, payload) = link.recv()?;
        match kind {
            Kind::Pages if pending.is_empty() => {
                for (gfn, data) in link::parse_pages(&payload, npages)? {
                    pages.insert(gfn, data.to_vec());
                }
            }
            Kind::LinkModel => model = Some(link::parse_link_model(&payload)?),
            Kind::Pending if model.is_some() => {
                let more = link::parse_gfn_list(&payload, npages)?;
                if pending.len() + more.len() > npages as usize {
                    return Err(LinkError::Protocol(format!(
                        "more pages to come than the guest's {npages}"
                    ))
                    .into());
                }
                pending.extend(more);
            }
            Kind::State => {
                // A page still to come replaces any copy received before.
                for gfn in &pending {
                    pages.remove(gfn);
                }
                let memory: Vec<(u64, Vec<u8>)> = pages
                    .into_iter()
                    .filter(|(_, data)| data.iter().any(|&b| b != 0))
                    .collect();
                let snapshot = format::encode(&[
                    (format::SectionKind::State, &payload),
                    (format::SectionKind::Memory, &format::encode_memory(&memory)),
                ]);
                let refused =
                    |e: hv::snapshot::SnapshotError| IncomingError::Refused(e.to_string());
                let (vm, postcopy) = if pending.is_empty() {
                    (Vm::restore(&snapshot, options).map_err(refused)?, None)
                } else {
                    // The schedule's origin is the VM's time, known once
                    // restored; the pager asks only once the VM runs.
                    let time = hv::snapshot::inspect(&snapshot).map_err(refused)?.time;
                    let model = model.ok_or_else(|| {
                        LinkError::Protocol("pages to come without a link model".into())
                    })?;
                    let dest = Destination::new(&model, pending.clone(), time);
                    let vm = Vm::restore_postcopy(&snapshot, options, &pending, dest.page_source())
                        .map_err(refused)?;
                    (vm, Some(dest))
                };
                if vm.mem_size() != mem_size {
                    return Err(IncomingError::Refused(format!(
                        "a guest of {} bytes after a Hello for {mem_size}",
                        vm.mem_size()
                    )));
                }
                return Ok(Received {
                    vm,
                    mem_size,
                    postcopy,
                });
            }
            other => return Err(LinkError::Protocol(format!("{other:?} from the source")).into()),
        }
    }
}

/// Why no source connected.
#[derive(Debug, thiserror::Error)]
enum AcceptError {
    #[error("no source within {} on {addr}", format_duration(*.waited))]
    Timeout { waited: Duration, addr: String },
    #[error("interrupted ({}) while waiting for a source", .0.name())]
    Interrupted(Signal),
    #[error("accepting a migration: {0}")]
    Io(#[from] std::io::Error),
}

impl AcceptError {
    fn exit_status(&self) -> u8 {
        match self {
            AcceptError::Interrupted(signal) => signal.exit_status(),
            AcceptError::Timeout { .. } | AcceptError::Io(_) => EXIT_VM_ERROR,
        }
    }
}

/// How often the waits below look at the clock and the signal flag.
const POLL: Duration = Duration::from_millis(20);

/// Waits for the source's connection: at most `timeout`, and no longer
/// than the first SIGINT or SIGTERM.
fn accept_source(
    listener: &TcpListener,
    timeout: Duration,
    stop: &StopRequest,
) -> Result<(TcpStream, SocketAddr), AcceptError> {
    let deadline = Instant::now() + timeout;
    listener.set_nonblocking(true)?;
    loop {
        if let Some(signal) = stop.signal() {
            return Err(AcceptError::Interrupted(signal));
        }
        match listener.accept() {
            Ok((stream, peer)) => {
                stream.set_nonblocking(false)?;
                listener.set_nonblocking(false)?;
                return Ok((stream, peer));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
        if Instant::now() >= deadline {
            return Err(AcceptError::Timeout {
                waited: timeout,
                addr: listener
                    .local_addr()
                    .map_or_else(|_| "?".to_string(), |a| a.to_string()),
            });
        }
        std::thread::sleep(POLL);
    }
}

/// A thread that shuts the connection down on the first SIGINT or
/// SIGTERM, so a receiver blocked on it returns at once.
struct SignalWatch {
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SignalWatch {
    fn start(link: &Link, stop: &StopRequest) -> SignalWatch {
        let done = Arc::new(AtomicBool::new(false));
        let thread = link.try_clone().ok().map(|handle| {
            let done = Arc::clone(&done);
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    if stop.signal().is_some() {
                        handle.shutdown();
                        return;
                    }
                    std::thread::sleep(POLL);
                }
            })
        });
        SignalWatch { done, thread }
    }

    fn finish(mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
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
    let (stream, peer) = match accept_source(&listener, args.timeout, &stop) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("faultline: {e}");
            return e.exit_status();
        }
    };
    let mut link = match Link::new(stream, args.timeout) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("faultline: migration from {peer}: {e}");
            return EXIT_VM_ERROR;
        }
    };
    // A signal while the VM comes in ends the wait: the connection is
    // shut down under the receiver, which then stops.
    let watch = SignalWatch::start(&link, &stop);
    let options = RestoreOptions {
        swap_path: args.swap.clone(),
        host_mem: args.host_mem.map(Some),
        lazy: false,
        swap_device: args.swap_device.map(super::device_model),
    };
    let received = receive(&mut link, &options);
    watch.finish();
    if let Some(signal) = stop.signal() {
        eprintln!(
            "faultline: incoming migration from {peer}: interrupted ({})",
            signal.name()
        );
        return signal.exit_status();
    }
    let received = match received {
        Ok(received) => received,
        Err(e) => {
            eprintln!("faultline: incoming migration from {peer} failed: {e}");
            if let IncomingError::Refused(why) = &e {
                let _ = link.send(Kind::Nack, &why.as_bytes()[..why.len().min(4096)]);
                return EXIT_CONFIG;
            }
            return EXIT_VM_ERROR;
        }
    };
    let vm = received.vm;
    if let Err(e) = link.send(Kind::Ack, &[]) {
        // The source did not hear that the VM runs here: it resumes it
        // there, so this copy must not run too.
        eprintln!("faultline: incoming migration from {peer}: acknowledging: {e}");
        return EXIT_VM_ERROR;
    }
    if let Some(dest) = &received.postcopy {
        let vcpus = vm.vcpus().len() as u32;
        let receiving = Receiving {
            link,
            listener,
            hello: link::hello(received.mem_size, vcpus),
            npages: received.mem_size / 4096,
            reconnect_timeout: args.reconnect_timeout,
            timeout: args.timeout,
        };
        if let Err(e) = dest.start(receiving) {
            eprintln!("faultline: incoming migration from {peer}: post-copy: {e}");
            return EXIT_VM_ERROR;
        }
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
        postcopy: received.postcopy,
    };
    run_vm(vm, &stop, &options)
}
