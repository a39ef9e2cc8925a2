//! Post-copy live migration, and the post-copy phase of a hybrid one
//! (`docs/migration.md`, "Post-copy").
//!
//! The source stops, sends the list of pages still to come (`Pending`)
//! and the VM's state; the destination restores the state with those
//! pages marked remote and runs at once. A first touch of a remote page
//! is a page-in through the pager's swap-in path whose bytes come from
//! the source instead of the swap file: the destination requests the page
//! on the return path (the same TCP connection) and the vCPU waits for it
//! as `--apf` says, while the source pushes the rest in the background.
//!
//! Host time and virtual time are kept apart so that runs repeat exactly:
//! the real bytes go as fast as the host moves them (a requested page
//! jumps the source's queue), and the virtual time at which each page is
//! at the destination comes from [`Schedule`], a model of the one link
//! that requests and background pushes share, driven only by the guest's
//! touches in virtual time.
//!
//! A broken connection after the switch-over pauses both sides: the
//! destination's vCPU that needs a missing page waits (in host time), the
//! source keeps the pages and reconnects to the same address for up to
//! `--reconnect-timeout`; the destination accepts on the address it
//! listened on, answers the source's `Recover` with the pages it still
//! needs (`Need`), and both go on (QEMU's `migrate-pause` /
//! `migrate-recover`, done automatically). If nobody comes back in time,
//! the destination stops with an error rather than run without its pages.

use super::error::MigrateError;
use super::link::{self, Kind, Link, LinkError, LinkModel};
use super::precopy::{
    connect, fail, ms, precopy_rounds, GuestCounters, MigrateSpec, MigrationReport, Outcome, RunFor,
};
use super::MigrateMode;
use hv::{Cycles, Gpa, Vm, RAM_SLOT};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::TcpListener;
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The post-copy link in virtual time, at the destination.
///
/// Pages cross one at a time in `Pages` frames of one page
/// ([`link::ONE_PAGE_FRAME`] bytes, `record` of wire time each), back to
/// back from the switch-over: the first background page is at the
/// destination one record after the VM resumed there. The background
/// order is the pending list's (increasing gfns). A request made at
/// virtual time `t` reaches the source after a `Request` frame's transfer
/// (latency + its bytes); the page goes out as soon as the page then on
/// the wire is through, and arrives one latency later; the background
/// stream resumes behind it. Pages never cross twice, so the link is busy
/// from the switch-over until the last page, which arrives after exactly
/// `pending × record` whatever the guest touches.
#[derive(Debug)]
pub struct Schedule {
    order: Vec<u64>,
    next: usize,
    wire_end: Cycles,
    record: Cycles,
    request_delay: Cycles,
    arrival: HashMap<u64, Cycles>,
    origin: Cycles,
    stats: PostcopyStats,
    /// The last requests' (first touch, start on the wire), for the order
    /// check: the source serves requests first come, first served.
    recent_requests: std::collections::VecDeque<(Cycles, Cycles)>,
}

/// The destination's post-copy figures, all from [`Schedule`] (virtual
/// time), except `reconnects`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PostcopyStats {
    /// Pages still at the source at the switch-over.
    pub pages: u64,
    /// Of those, pages the destination asked for (a touch before the
    /// background push brought them).
    pub requested: u64,
    /// First touches that found the page here already.
    pub touched_present: u64,
    /// First touches that waited for the page (requested, or on the wire).
    pub waited: u64,
    /// Virtual time those touches waited, in all.
    pub wait_ms: f64,
    /// From the switch-over to the last page's arrival.
    pub complete_ms: f64,
    /// The pages' bytes on the link (one frame per page).
    pub bytes: u64,
    /// Requests put on the wire after a request made later than
    /// themselves (always 0; with the `order-checks` feature, a panic).
    pub out_of_order: u64,
    /// Connections made again after a break (host-side).
    pub reconnects: u32,
}

impl Schedule {
    /// The link from `origin` (the destination's virtual time when the VM
    /// resumed) for the `pending` pages (increasing gfns).
    pub fn new(model: &LinkModel, pending: Vec<u64>, origin: Cycles) -> Schedule {
        let record = model.transfer(link::ONE_PAGE_FRAME) - model.transfer(0);
        let latency = model.transfer(0);
        let pages = pending.len() as u64;
        Schedule {
            order: pending,
            next: 0,
            wire_end: origin,
            record,
            request_delay: model.transfer(link::REQUEST_FRAME) + latency,
            arrival: HashMap::new(),
            recent_requests: std::collections::VecDeque::new(),
            origin,
            stats: PostcopyStats {
                pages,
                complete_ms: ms(Cycles(record.0.saturating_mul(pages))),
                bytes: pages * link::ONE_PAGE_FRAME,
                ..PostcopyStats::default()
            },
        }
    }

    /// Background pages put on the wire while `go(start)` holds for the
    /// next one's start of arrival.
    fn push_background(&mut self, mut go: impl FnMut(Cycles, Cycles) -> bool) {
        while let Some(&gfn) = self.order.get(self.next) {
            if self.arrival.contains_key(&gfn) {
                self.next += 1;
                continue;
            }
            let start = self.wire_end;
            let end = start + self.record;
            if !go(start, end) {
                break;
            }
            self.arrival.insert(gfn, end);
            self.wire_end = end;
            self.next += 1;
        }
    }

    /// When page `gfn`, first touched at `now`, is (or was) here; asks
    /// for it if the background push has not brought it by then.
    pub fn fetch_time(&mut self, gfn: u64, now: Cycles) -> Cycles {
        self.push_background(|_, end| end <= now);
        let arrival = match self.arrival.get(&gfn) {
            Some(&t) => t,
            None => {
                let reaches_source = now + self.request_delay;
                self.push_background(|start, _| start < reaches_source);
                match self.arrival.get(&gfn) {
                    Some(&t) => t,
                    None => {
                        let start = self.wire_end.max(reaches_source);
                        self.check_request_order(now, start);
                        let end = start + self.record;
                        self.wire_end = end;
                        self.arrival.insert(gfn, end);
                        self.stats.requested += 1;
                        end
                    }
                }
            }
        };
        if arrival <= now {
            self.stats.touched_present += 1;
        } else {
            self.stats.waited += 1;
            self.stats.wait_ms += ms(arrival - now);
        }
        arrival
    }

    /// Requests remembered for the order check: more than vCPUs.
    const RECENT: usize = 256;

    /// Checks that a request for a page first touched at `now`, put on
    /// the wire at `start`, does not go after one touched later.
    fn check_request_order(&mut self, now: Cycles, start: Cycles) {
        let late = self
            .recent_requests
            .iter()
            .any(|&(touched, started)| touched > now && started < start);
        if late {
            self.stats.out_of_order += 1;
            if cfg!(feature = "order-checks") {
                panic!(
                    "post-copy link: a request at {} is served after a later one",
                    now.0
                );
            }
        }
        if self.recent_requests.len() == Self::RECENT {
            self.recent_requests.pop_front();
        }
        self.recent_requests.push_back((now, start));
    }

    /// Virtual time the last page arrives.
    pub fn complete_at(&self) -> Cycles {
        self.origin + Cycles(self.record.0.saturating_mul(self.stats.pages))
    }
}

/// The destination's receive side, shared by the pager's page source
/// (the vCPUs' first touches), the receiver thread and the VMM.
struct Inbox {
    /// Not received yet (host).
    missing: BTreeSet<u64>,
    /// Received, not yet taken by a first touch.
    pages: HashMap<u64, Box<[u8; 4096]>>,
    /// Asked for and not received yet.
    requested: BTreeSet<u64>,
    /// The return path (`None` while the connection is down).
    writer: Option<Link>,
    /// The pages will never come: why.
    failed: Option<String>,
    /// Every page came and `Done` went back.
    done: bool,
    reconnects: u32,
}

/// A post-copy destination: the link schedule and the pages as they come.
pub struct Destination {
    inbox: Mutex<Inbox>,
    changed: Condvar,
    schedule: Mutex<Schedule>,
    receiver: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("post-copy destination")
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A thread that panicked holding it left consistent data: every
    // critical section only inserts or removes whole entries.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What the receiver thread needs to take the rest of the pages and to
/// accept the source again after a break.
pub struct Receiving {
    pub link: Link,
    pub listener: TcpListener,
    pub hello: Vec<u8>,
    pub npages: u64,
    pub reconnect_timeout: Duration,
    /// Host time to wait for the source at each step.
    pub timeout: Duration,
}

impl Destination {
    /// For `pending` (increasing gfns) over `model`; the VM resumes at
    /// `origin`.
    pub fn new(model: &LinkModel, pending: Vec<u64>, origin: Cycles) -> Arc<Destination> {
        Arc::new(Destination {
            inbox: Mutex::new(Inbox {
                missing: pending.iter().copied().collect(),
                pages: HashMap::new(),
                requested: BTreeSet::new(),
                writer: None,
                failed: None,
                done: pending.is_empty(),
                reconnects: 0,
            }),
            changed: Condvar::new(),
            schedule: Mutex::new(Schedule::new(model, pending, origin)),
            receiver: Mutex::new(None),
        })
    }

    /// The page source the pager asks.
    pub fn page_source(self: &Arc<Self>) -> Box<dyn hv::PageSource> {
        Box::new(RemotePages(Arc::clone(self)))
    }

    /// Starts taking pages from the source (after the `Ack`).
    pub fn start(self: &Arc<Self>, receiving: Receiving) -> Result<(), String> {
        let writer = receiving
            .link
            .try_clone()
            .map_err(|e| format!("the return path: {e}"))?;
        reader_blocks(&receiving.link).map_err(|e| format!("the connection: {e}"))?;
        lock(&self.inbox).writer = Some(writer);
        let me = Arc::clone(self);
        let handle = std::thread::Builder::new()
            .name("postcopy-recv".into())
            .spawn(move || me.receive(receiving))
            .map_err(|e| format!("starting the receiver: {e}"))?;
        *lock(&self.receiver) = Some(handle);
        Ok(())
    }

    /// The figures so far.
    pub fn stats(&self) -> PostcopyStats {
        let mut stats = lock(&self.schedule).stats.clone();
        stats.reconnects = lock(&self.inbox).reconnects;
        stats
    }

    /// Waits (host time) until every page has come or they never will;
    /// `Err` says why not.
    pub fn finish(&self) -> Result<(), String> {
        let mut inbox = lock(&self.inbox);
        while !inbox.done && inbox.failed.is_none() {
            inbox = self
                .changed
                .wait(inbox)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        let result = match &inbox.failed {
            Some(why) if !inbox.done => Err(why.clone()),
            _ => Ok(()),
        };
        drop(inbox);
        if let Some(handle) = lock(&self.receiver).take() {
            let _ = handle.join();
        }
        result
    }

    /// The receiver thread: pages in until all are here, through breaks.
    fn receive(&self, mut r: Receiving) {
        loop {
            let broke = match r.link.recv() {
                Ok((Kind::Pages, payload)) => match link::parse_pages(&payload, r.npages) {
                    Ok(records) => {
                        let mut inbox = lock(&self.inbox);
                        for (gfn, data) in records {
                            if inbox.missing.remove(&gfn) {
                                let mut page = Box::new([0u8; 4096]);
                                page.copy_from_slice(data);
                                inbox.pages.insert(gfn, page);
                                inbox.requested.remove(&gfn);
                            }
                        }
                        if inbox.missing.is_empty() {
                            if let Some(w) = inbox.writer.as_mut() {
                                let _ = w.send(Kind::Done, &[]);
                            }
                            inbox.done = true;
                            inbox.writer = None;
                            self.changed.notify_all();
                            return;
                        }
                        self.changed.notify_all();
                        None
                    }
                    Err(e) => Some(e.to_string()),
                },
                Ok((kind, _)) => Some(format!("{kind:?} from the source during post-copy")),
                Err(e) => Some(e.to_string()),
            };
            let Some(why) = broke else { continue };
            r.link.shutdown();
            lock(&self.inbox).writer = None;
            eprintln!(
                "faultline: post-copy: the connection broke ({why}); waiting up to {:?} for the source to reconnect",
                r.reconnect_timeout
            );
            match self.accept_again(&r) {
                Ok(link) => r.link = link,
                Err(e) => {
                    let why = format!(
                        "the connection broke ({why}) and the source did not come back: {e}"
                    );
                    eprintln!("faultline: post-copy: {why}");
                    lock(&self.inbox).failed = Some(why);
                    self.changed.notify_all();
                    return;
                }
            }
        }
    }

    /// Accepts the source's new connection on the address listened on,
    /// answers its `Recover` with the pages still missing and sends again
    /// the requests not answered.
    fn accept_again(&self, r: &Receiving) -> Result<Link, String> {
        let deadline = Instant::now() + r.reconnect_timeout;
        r.listener
            .set_nonblocking(true)
            .map_err(|e| format!("listening: {e}"))?;
        loop {
            if Instant::now() >= deadline {
                return Err(format!("no connection within {:?}", r.reconnect_timeout));
            }
            let (stream, peer) = match r.listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                Err(e) => return Err(format!("accepting: {e}")),
            };
            let attempt = || -> Result<Link, LinkError> {
                stream.set_nonblocking(false)?;
                let mut link = Link::new(stream, r.timeout)?;
                let (kind, payload) = link.recv()?;
                if kind != Kind::Recover || payload != r.hello {
                    return Err(LinkError::Protocol(format!(
                        "{kind:?} where the VM's Recover was expected"
                    )));
                }
                let mut inbox = lock(&self.inbox);
                let missing: Vec<u64> = inbox.missing.iter().copied().collect();
                for chunk in missing.chunks(link::GFNS_PER_FRAME) {
                    link.send(Kind::Need, &link::gfn_list(chunk))?;
                }
                link.send(Kind::Ack, &[])?;
                for gfn in inbox.requested.clone() {
                    link.send(Kind::Request, &gfn.to_le_bytes())?;
                }
                reader_blocks(&link)
                    .map_err(|e| LinkError::Protocol(format!("the connection: {e}")))?;
                inbox.writer = Some(link.try_clone()?);
                inbox.reconnects += 1;
                Ok(link)
            };
            match attempt() {
                Ok(link) => {
                    eprintln!("faultline: post-copy: the source is back ({peer})");
                    return Ok(link);
                }
                Err(e) => eprintln!("faultline: post-copy: a connection from {peer} refused: {e}"),
            }
        }
    }

    /// The page source's side: page `gfn` into `data`, blocking (host
    /// time) until its bytes are here.
    fn take(&self, gfn: u64, data: &mut [u8; 4096]) -> Result<(), String> {
        let mut inbox = lock(&self.inbox);
        loop {
            if let Some(page) = inbox.pages.remove(&gfn) {
                data.copy_from_slice(&page[..]);
                return Ok(());
            }
            if !inbox.missing.contains(&gfn) {
                return Err(format!("page {gfn:#x} was not among the pages to come"));
            }
            if let Some(why) = &inbox.failed {
                return Err(why.clone());
            }
            if inbox.requested.insert(gfn) {
                if let Some(w) = inbox.writer.as_mut() {
                    // A failed send is the receiver's to notice; the
                    // request goes again after a reconnect.
                    let _ = w.send(Kind::Request, &gfn.to_le_bytes());
                }
            }
            inbox = self
                .changed
                .wait(inbox)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }
}

/// The reading side of a post-copy connection waits as long as it takes:
/// a quiet peer is not a dead one (a broken connection ends the read).
/// Reads on `link` wait as long as it takes (a return path is quiet
/// while no page is missing).
fn reader_blocks(link: &Link) -> std::io::Result<()> {
    link.set_read_timeout(None)
}

/// The pager's [`hv::PageSource`] at a post-copy destination.
#[derive(Debug)]
struct RemotePages(Arc<Destination>);

impl hv::PageSource for RemotePages {
    fn fetch(&mut self, index: u64, now: Cycles, data: &mut [u8; 4096]) -> Result<Cycles, String> {
        // RAM's memslot starts at gfn 0: its page indexes are gfns.
        let arrival = lock(&self.0.schedule).fetch_time(index, now);
        self.0.take(index, data)?;
        Ok(arrival)
    }
}

/// The source's post-copy figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PostcopySent {
    /// Pages sent after the switch-over.
    pub pages: u64,
    /// Their time on the link ([`Schedule`]: the last one's arrival after
    /// the VM resumed at the destination).
    pub postcopy_ms: f64,
    /// Connections made again after a break.
    pub reconnects: u32,
}

/// Migrates `vm` (stopped at `spec.at`) by post-copy, or by hybrid:
/// pre-copy rounds first (`--max-rounds` at most), then post-copy.
pub fn migrate(vm: &mut Vm, spec: &MigrateSpec, run_for: &mut RunFor<'_>) -> Outcome {
    let hybrid = spec.mode == MigrateMode::Hybrid;
    let mut report = MigrationReport {
        mode: if hybrid { "hybrid" } else { "postcopy" },
        to: spec.to.clone(),
        ..MigrationReport::default()
    };
    let started = vm.time();
    let mut link = match connect(&spec.to, spec.timeout) {
        Ok(link) => link,
        Err(e) => {
            let e = MigrateError::Connect {
                to: spec.to.clone(),
                source: e,
            };
            report.failed = Some(e.to_string());
            return Outcome::Failed(report);
        }
    };
    let vcpus = vm.vcpus().len() as u32;
    let hello = link::hello(vm.mem_size(), vcpus);
    let mut logging = false;
    let mut pending = if hybrid {
        let before = GuestCounters::of(vm);
        let rounds = precopy_rounds(vm, spec, &mut link, &mut report, &mut logging, run_for);
        report.guest_during_precopy = before.progress_to(GuestCounters::of(vm));
        match rounds {
            Ok(Ok(pages)) => pages,
            Ok(Err(ending)) => {
                report.bytes_sent = link.sent;
                let report = fail(vm, report, logging, MigrateError::RunEnded);
                return Outcome::Ended(report, ending);
            }
            Err(why) => {
                report.bytes_sent = link.sent;
                return Outcome::Failed(fail(vm, report, logging, why));
            }
        }
    } else {
        if let Err(e) = link.send(Kind::Hello, &hello) {
            return Outcome::Failed(fail(vm, report, false, e.into()));
        }
        vm.touched_pages()
    };
    // The background order, and what the destination checks.
    pending.sort_unstable();
    pending.dedup();
    // The switch-over: the VM does not run here from now on.
    let stopped = vm.time();
    if logging {
        if let Err(e) = vm.disable_dirty_log(RAM_SLOT) {
            return Outcome::Failed(fail(vm, report, false, e.into()));
        }
    }
    let switch_bytes = (|| -> Result<u64, MigrateError> {
        let mut bytes = link.send(Kind::LinkModel, &link::link_model(&spec.link))?;
        for chunk in pending.chunks(link::GFNS_PER_FRAME) {
            bytes += link.send(Kind::Pending, &link::gfn_list(chunk))?;
        }
        let state = vm.snapshot_state()?;
        bytes += link.send(Kind::State, &state)?;
        Ok(bytes)
    })();
    let switch_bytes = match switch_bytes {
        Ok(b) => b,
        Err(why) => return Outcome::Failed(fail(vm, report, false, why)),
    };
    if let Err(why) = MigrateError::from_answer(link.recv()) {
        // The destination did not take the VM: it goes on here.
        report.bytes_sent = link.sent;
        return Outcome::Failed(fail(vm, report, false, why));
    }
    let schedule = Schedule::new(&spec.link, pending.clone(), Cycles::ZERO);
    let postcopy = schedule.complete_at();
    let downtime = spec.link.transfer(switch_bytes);
    report.pages_sent += pending.len() as u64;
    report.bytes_sent = link.sent + pending.len() as u64 * link::ONE_PAGE_FRAME;
    report.precopy_ms = ms(stopped - started);
    report.downtime_ms = ms(downtime);
    report.total_ms = ms(stopped - started + downtime + postcopy);
    let mut sent = PostcopySent {
        pages: pending.len() as u64,
        postcopy_ms: ms(postcopy),
        reconnects: 0,
    };
    // Nothing left to send (a hybrid whose last round found no dirty
    // page): the destination took it as a pre-copy, and is done.
    let served = if pending.is_empty() {
        Ok(())
    } else {
        serve(vm, link, pending, spec, &hello, &mut sent.reconnects)
    };
    report.postcopy = Some(sent);
    match served {
        Ok(()) => Outcome::Migrated(report),
        Err(why) => {
            report.failed = Some(why.to_string());
            Outcome::Lost(report)
        }
    }
}

/// What the source's reader thread hears on the return path.
enum Heard {
    Request(u64),
    Done,
    Broken(String),
}

/// Reads the return path of connection number `generation` until it
/// ends.
fn spawn_reader(
    link: &Link,
    generation: u32,
    npages: u64,
    tx: mpsc::Sender<(u32, Heard)>,
) -> Result<(), MigrateError> {
    let mut reader = link.try_clone().map_err(MigrateError::ReturnPath)?;
    reader_blocks(&reader).map_err(MigrateError::ReturnPathBlocking)?;
    std::thread::Builder::new()
        .name("postcopy-requests".into())
        .spawn(move || loop {
            let heard = match reader.recv() {
                Ok((Kind::Request, p)) => match link::parse_request(&p, npages) {
                    Ok(gfn) => Heard::Request(gfn),
                    Err(e) => Heard::Broken(e.to_string()),
                },
                Ok((Kind::Done, _)) => Heard::Done,
                Ok((kind, _)) => Heard::Broken(format!("{kind:?} from the destination")),
                Err(e) => Heard::Broken(e.to_string()),
            };
            let last = !matches!(heard, Heard::Request(_));
            if tx.send((generation, heard)).is_err() || last {
                return;
            }
        })
        .map(|_| ())
        .map_err(MigrateError::SpawnReader)
}

/// The source after the switch-over: pushes the pending pages in order,
/// a requested one first, until the destination says `Done`; reconnects
/// after a break.
fn serve(
    vm: &mut Vm,
    mut link: Link,
    pending: Vec<u64>,
    spec: &MigrateSpec,
    hello: &[u8],
    reconnects: &mut u32,
) -> Result<(), MigrateError> {
    let npages = vm.mem_size() / 4096;
    let mut to_send: BTreeSet<u64> = pending.into_iter().collect();
    let mut urgent: VecDeque<u64> = VecDeque::new();
    let (tx, rx) = mpsc::channel();
    let mut generation = 0;
    spawn_reader(&link, generation, npages, tx.clone())?;
    let mut page = vec![0u8; 4096];
    loop {
        let mut broken = None;
        while let Ok((g, heard)) = rx.try_recv() {
            if g != generation {
                continue; // from a connection gone
            }
            match heard {
                Heard::Request(gfn) => urgent.push_back(gfn),
                Heard::Done => return Ok(()),
                Heard::Broken(why) => {
                    broken = Some(why);
                    break;
                }
            }
        }
        if broken.is_none() {
            let next = loop {
                match urgent.pop_front() {
                    Some(gfn) if to_send.remove(&gfn) => break Some(gfn),
                    Some(_) => continue, // sent already
                    None => break to_send.pop_first(),
                }
            };
            match next {
                Some(gfn) => {
                    vm.read_guest(Gpa(gfn * 4096), &mut page)
                        .map_err(|source| MigrateError::ReadPage { gfn, source })?;
                    if let Err(e) = link.send(Kind::Pages, &link::pages(&[(gfn, page.clone())])) {
                        to_send.insert(gfn);
                        broken = Some(e.to_string());
                    }
                }
                None => match rx.recv_timeout(spec.timeout) {
                    Ok((g, _)) if g != generation => {}
                    Ok((_, Heard::Request(_))) => {} // sent already
                    Ok((_, Heard::Done)) => return Ok(()),
                    Ok((_, Heard::Broken(why))) => broken = Some(why),
                    Err(_) => return Err(MigrateError::Silent(spec.timeout)),
                },
            }
        }
        let Some(why) = broken else { continue };
        link.shutdown();
        eprintln!(
            "faultline: post-copy: the connection to {} broke ({why}); reconnecting for up to {:?}",
            spec.to, spec.reconnect_timeout
        );
        let (again, need) =
            reconnect(spec, hello, npages).map_err(|e| MigrateError::Reconnect {
                why,
                source: Box::new(e),
            })?;
        eprintln!(
            "faultline: post-copy: reconnected to {}; {} pages still to send",
            spec.to,
            need.len()
        );
        link = again;
        to_send = need.into_iter().collect();
        urgent.clear();
        generation += 1;
        *reconnects += 1;
        spawn_reader(&link, generation, npages, tx.clone())?;
    }
}

/// Connects again to the destination for up to `--reconnect-timeout`;
/// returns the link and the pages the destination still needs.
fn reconnect(
    spec: &MigrateSpec,
    hello: &[u8],
    npages: u64,
) -> Result<(Link, Vec<u64>), MigrateError> {
    let deadline = Instant::now() + spec.reconnect_timeout;
    let mut last = String::from("no attempt");
    while Instant::now() < deadline {
        let step = (deadline - Instant::now()).clamp(Duration::from_millis(1), spec.timeout);
        let attempt = || -> Result<(Link, Vec<u64>), LinkError> {
            let mut link = connect(&spec.to, step)?;
            link.send(Kind::Recover, hello)?;
            let mut need = Vec::new();
            loop {
                match link.recv()? {
                    (Kind::Need, p) => need.extend(link::parse_gfn_list(&p, npages)?),
                    (Kind::Ack, _) => return Ok((link, need)),
                    (kind, _) => {
                        return Err(LinkError::Protocol(format!(
                            "{kind:?} where the pages needed were expected"
                        )))
                    }
                }
            }
        };
        match attempt() {
            Ok(done) => return Ok(done),
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(MigrateError::NoDestination {
        within: spec.reconnect_timeout,
        last,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1 byte per cycle's worth of bandwidth keeps the arithmetic plain:
    /// a record is `ONE_PAGE_FRAME` cycles' worth of seconds.
    fn model() -> LinkModel {
        LinkModel {
            bandwidth: hv::CYCLES_PER_SECOND,
            latency: Duration::from_nanos(0),
        }
    }

    #[test]
    fn background_pages_arrive_back_to_back_from_the_resume() {
        let origin = Cycles(1_000_000);
        let mut s = Schedule::new(&model(), vec![3, 5, 7], origin);
        let record = link::ONE_PAGE_FRAME;
        // Long after: every page was pushed, in order, without a request.
        let late = Cycles(origin.0 + 100 * record);
        assert_eq!(s.fetch_time(7, late), Cycles(origin.0 + 3 * record));
        assert_eq!(s.fetch_time(3, late), Cycles(origin.0 + record));
        assert_eq!(s.stats.requested, 0);
        assert_eq!(s.stats.touched_present, 2);
        assert_eq!(s.complete_at(), Cycles(origin.0 + 3 * record));
    }

    #[test]
    fn a_request_jumps_the_queue_and_the_stream_goes_on_behind_it() {
        let origin = Cycles(0);
        let pending: Vec<u64> = (0..10).collect();
        let mut s = Schedule::new(&model(), pending, origin);
        let record = link::ONE_PAGE_FRAME;
        let request = s.request_delay.0;
        // At the resume, page 9 is wanted: page 0 is on the wire when the
        // request reaches the source (latency 0: after the request's
        // bytes), so page 9 follows page 0.
        let t = s.fetch_time(9, Cycles(0));
        assert!(request < record, "the request is quicker than a page");
        assert_eq!(t, Cycles(2 * record));
        assert_eq!(s.stats.requested, 1);
        assert_eq!(s.stats.waited, 1);
        // Page 1 comes after page 9; the last page still at 10 records.
        assert_eq!(s.fetch_time(1, Cycles(0)), Cycles(3 * record));
        assert_eq!(s.fetch_time(8, Cycles(10 * record)), Cycles(10 * record));
        assert_eq!(s.complete_at(), Cycles(10 * record));
    }

    #[test]
    #[cfg_attr(
        feature = "order-checks",
        should_panic(expected = "served after a later one")
    )]
    fn the_checker_counts_a_request_served_after_a_later_one() {
        let mut s = Schedule::new(&model(), (0..10).collect(), Cycles(0));
        let record = link::ONE_PAGE_FRAME;
        s.fetch_time(9, Cycles(0));
        assert_eq!(s.stats.out_of_order, 0);
        // Touched after the next request but reaching the schedule first.
        s.fetch_time(8, Cycles(record / 2));
        s.fetch_time(7, Cycles(record / 4));
        assert_eq!(s.stats.out_of_order, 1);
    }

    #[test]
    fn the_same_touches_give_the_same_times() {
        let touches = [(5u64, 0u64), (2, 1), (9, 50_000), (0, 50_001), (7, 90_000)];
        let run = || {
            let mut s = Schedule::new(&model(), (0..12).collect(), Cycles(0));
            let times: Vec<Cycles> = touches
                .iter()
                .map(|&(g, t)| s.fetch_time(g, Cycles(t)))
                .collect();
            (times, s.stats.clone())
        };
        assert_eq!(run(), run());
    }
}
