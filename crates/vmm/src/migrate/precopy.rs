//! The source side of a pre-copy live migration.
//!
//! At `--migrate-at` the source connects, says hello, turns dirty logging
//! on for guest RAM and sends every page the guest ever touched while the
//! guest keeps running for as long as the link model says those bytes
//! take. Each further round sends the pages dirtied meanwhile (the dirty
//! log collected, KVM_GET_DIRTY_LOG style), until the rest would cross the
//! link within `--downtime-limit` or `--max-rounds` rounds were made.
//! Then the VM stops, the last dirty pages and the VM's state go over,
//! and the source waits for the destination's answer: an `Ack` means the
//! VM runs there now; anything else (a `Nack`, a closed or broken
//! connection) and the source resumes the VM where it stopped, dirty
//! logging off, and reports the failure: nothing is lost.

use super::error::MigrateError;
use super::link::{self, Kind, Link, LinkError, LinkModel};
use hv::{Cycles, DirtyLogMode, Gfn, Vm, RAM_SLOT};
use serde::Serialize;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// What `--migrate-to` asks for.
#[derive(Debug, Clone)]
pub struct MigrateSpec {
    pub to: String,
    pub at: Duration,
    pub link: LinkModel,
    pub downtime_limit: Duration,
    pub max_rounds: u32,
    /// Host time to wait for the destination at each step.
    pub timeout: Duration,
    /// Pre-copy, post-copy or hybrid.
    pub mode: super::MigrateMode,
    /// Post-copy: host time to keep trying to reconnect after a break.
    pub reconnect_timeout: Duration,
}

/// A migration's figures, all in virtual time from the link model.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MigrationReport {
    pub mode: &'static str,
    pub to: String,
    /// Pre-copy rounds made while the guest ran (the first included).
    pub rounds: u32,
    pub pages_sent: u64,
    pub bytes_sent: u64,
    /// From `--migrate-at` to the VM's stop.
    pub precopy_ms: f64,
    /// The VM stopped: the last pages and the state across.
    pub downtime_ms: f64,
    pub total_ms: f64,
    /// Pages sent in the stop-and-copy round.
    pub final_pages: u64,
    /// Collecting the dirty log, in all.
    pub dirty_log_get_ms: f64,
    /// What the guest did while pre-copy ran (a guest whose pages the
    /// rounds read from swap can stall there far longer than the
    /// downtime).
    pub guest_during_precopy: GuestProgress,
    /// Set when the migration failed (the VM went on at the source, or,
    /// after a post-copy switch-over, could not be completed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// Post-copy and hybrid: what went after the switch-over.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postcopy: Option<super::postcopy::PostcopySent>,
}

/// The guest's progress over a stretch of a migration, summed over its
/// vCPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct GuestProgress {
    /// Instructions retired.
    pub instructions: u64,
    /// vCPU time running guest code or the hv's work for it.
    pub busy_ms: f64,
    /// vCPU time blocked on page reads: synchronous page-in stalls and
    /// async-PF halts.
    pub stalled_ms: f64,
    /// vCPU time halted by the guest (idle) or preempted (steal).
    pub idle_ms: f64,
}

/// The counters [`GuestProgress`] is the difference of.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct GuestCounters {
    instructions: u64,
    busy: u64,
    stalled: u64,
    idle: u64,
}

impl GuestCounters {
    pub(super) fn of(vm: &Vm) -> Self {
        let stats = vm.stats();
        let apf = stats.apf();
        let stalled = apf.stall_cycles + apf.halt_cycles;
        let (busy, idle) = stats.vcpus.iter().fold((0, 0), |(b, i), v| {
            (b + v.busy_cycles, i + v.idle_cycles + v.steal_cycles)
        });
        // A blocked vCPU's clock moves when it wakes: what it has waited
        // since counts now.
        let (mut behind_stalled, mut behind_idle) = (0, 0);
        for (behind, on_read) in vm.vcpus_behind() {
            if on_read {
                behind_stalled += behind.0;
            } else {
                behind_idle += behind.0;
            }
        }
        GuestCounters {
            instructions: stats.instructions(),
            busy,
            stalled: stalled + behind_stalled,
            // A stall or an APF halt is idle time to the scheduler.
            idle: idle.saturating_sub(stalled) + behind_idle,
        }
    }

    /// What happened between `self` and `later`.
    pub(super) fn progress_to(self, later: GuestCounters) -> GuestProgress {
        GuestProgress {
            instructions: later.instructions - self.instructions,
            busy_ms: ms(Cycles(later.busy - self.busy)),
            stalled_ms: ms(Cycles(later.stalled.saturating_sub(self.stalled))),
            idle_ms: ms(Cycles(later.idle.saturating_sub(self.idle))),
        }
    }
}

/// How a migration attempt ended.
pub enum Outcome {
    /// The VM runs at the destination now.
    Migrated(MigrationReport),
    /// The VM is intact here and runs on.
    Failed(MigrationReport),
    /// While pre-copy ran the guest, the run ended (the guest stopped, a
    /// limit, a signal): the migration was abandoned.
    Ended(MigrationReport, crate::session::Ending),
    /// Post-copy: the VM runs at the destination, but its pages could not
    /// all be sent (the connection broke for good); the VM is lost here.
    Lost(MigrationReport),
}

pub(super) fn ms(c: Cycles) -> f64 {
    c.0 as f64 / hv::CYCLES_PER_SECOND as f64 * 1e3
}

/// Runs the VM on to the given virtual time; `Some(ending)` if the run
/// ended first.
pub type RunFor<'a> = dyn FnMut(&mut Vm, Cycles) -> Option<crate::session::Ending> + 'a;

/// Sends `gfns` in frames; returns the bytes on the wire.
/// Pages sent, and when the last of them was there to send.
struct Sent {
    bytes: u64,
    /// The latest read completion among pages read back from swap
    /// (`Vm::read_guest_page`); the VM's time if none was.
    last_ready: Cycles,
}

impl Sent {
    /// When the pages are across: the link's time for them from `from`,
    /// or the last swap read's completion, whichever is later (the link
    /// sends what has been read meanwhile).
    fn across(&self, from: Cycles, link: &LinkModel) -> Cycles {
        (from + link.transfer(self.bytes)).max(self.last_ready)
    }
}

fn send_pages(vm: &mut Vm, link: &mut Link, gfns: &[u64]) -> Result<Sent, MigrateError> {
    let mut sent = Sent {
        bytes: 0,
        last_ready: vm.time(),
    };
    for chunk in gfns.chunks(link::PAGES_PER_FRAME) {
        let mut batch = Vec::with_capacity(chunk.len());
        for &gfn in chunk {
            let mut page = [0u8; 4096];
            let ready = vm
                .read_guest_page(Gfn(gfn), &mut page)
                .map_err(|source| MigrateError::ReadPage { gfn, source })?;
            sent.last_ready = sent.last_ready.max(ready);
            batch.push((gfn, page.to_vec()));
        }
        sent.bytes += link.send(Kind::Pages, &link::pages(&batch))?;
    }
    Ok(sent)
}

/// Migrates `vm` (stopped at `spec.at`) by pre-copy.
pub fn migrate(vm: &mut Vm, spec: &MigrateSpec, run_for: &mut RunFor<'_>) -> Outcome {
    let mut report = MigrationReport {
        mode: "precopy",
        to: spec.to.clone(),
        ..MigrationReport::default()
    };
    let started = vm.time();
    let before = GuestCounters::of(vm);
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
    let mut logging = false;
    let result = precopy_rounds(vm, spec, &mut link, &mut report, &mut logging, run_for);
    report.bytes_sent = link.sent;
    report.precopy_ms = ms(vm.time() - started);
    report.total_ms = report.precopy_ms;
    report.guest_during_precopy = before.progress_to(GuestCounters::of(vm));
    let final_pages = match result {
        Ok(Ok(pages)) => pages,
        Ok(Err(ending)) => {
            let report = fail(vm, report, logging, MigrateError::RunEnded);
            return Outcome::Ended(report, ending);
        }
        Err(why) => return Outcome::Failed(fail(vm, report, logging, why)),
    };
    // Stop and copy: the VM does not run from here on.
    let stopped = vm.time();
    if let Err(e) = vm.disable_dirty_log(RAM_SLOT) {
        return Outcome::Failed(fail(vm, report, false, e.into()));
    }
    let last = (|| -> Result<Sent, MigrateError> {
        let mut sent = send_pages(vm, &mut link, &final_pages)?;
        let state = vm.snapshot_state()?;
        sent.bytes += link.send(Kind::State, &state)?;
        Ok(sent)
    })();
    let last = match last {
        Ok(sent) => sent,
        Err(why) => return Outcome::Failed(fail(vm, report, false, why)),
    };
    report.final_pages = final_pages.len() as u64;
    report.pages_sent += final_pages.len() as u64;
    report.bytes_sent = link.sent;
    let downtime = last.across(stopped, &spec.link) - stopped;
    report.precopy_ms = ms(stopped - started);
    report.downtime_ms = ms(downtime);
    report.total_ms = ms(stopped - started + downtime);
    match MigrateError::from_answer(link.recv()) {
        Ok(()) => Outcome::Migrated(report),
        Err(e) => Outcome::Failed(fail(vm, report, false, e)),
    }
}

/// The report of a migration that failed with `why`; dirty logging off
/// if it was on (`logging`).
pub(super) fn fail(
    vm: &mut Vm,
    mut report: MigrationReport,
    logging: bool,
    why: MigrateError,
) -> MigrationReport {
    if logging {
        let _ = vm.disable_dirty_log(RAM_SLOT);
    }
    report.failed = Some(why.to_string());
    report
}

pub(super) fn connect(to: &str, timeout: Duration) -> Result<Link, LinkError> {
    let addr = to
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| LinkError::Protocol(format!("{to} resolves to no address")))?;
    let stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| link::timed_out(e, Some(timeout)))?;
    Ok(Link::new(stream, timeout)?)
}

/// The rounds while the guest runs; returns the pages left for the
/// stop-and-copy round (`Ok(Err(ending))`: the run ended meanwhile).
pub(super) fn precopy_rounds(
    vm: &mut Vm,
    spec: &MigrateSpec,
    link: &mut Link,
    report: &mut MigrationReport,
    logging: &mut bool,
    run_for: &mut RunFor<'_>,
) -> Result<Result<Vec<u64>, crate::session::Ending>, MigrateError> {
    let vcpus = vm.vcpus().len() as u32;
    link.send(Kind::Hello, &link::hello(vm.mem_size(), vcpus))?;
    vm.enable_dirty_log(RAM_SLOT, DirtyLogMode::Bitmap)?;
    *logging = true;
    let limit = Cycles(crate::units::duration_to_cycles(spec.downtime_limit));
    let mut pages = vm.touched_pages();
    loop {
        report.rounds += 1;
        let sent = send_pages(vm, link, &pages)?;
        report.pages_sent += pages.len() as u64;
        // The guest runs while the round's pages are read (those in swap
        // queue on the swap device with the guest's own reads) and cross
        // the link.
        // The VMM sends once its last collection returned.
        let until = sent.across(vm.vmm_now(), &spec.link);
        if let Some(ending) = run_for(vm, until) {
            return Ok(Err(ending));
        }
        // Exits still parked and IPIs in flight are handled now, so the
        // round's dirty log has what they write (`Vm::settle`).
        vm.settle();
        let collected = vm.collect_dirty_log(RAM_SLOT)?;
        report.dirty_log_get_ms += ms(collected.get.cycles + collected.clear.cycles);
        // RAM's memslot starts at gfn 0: its page indexes are gfns.
        pages = collected.pages;
        let rest = pages.len() as u64 * (link::FRAME_HEADER + 8 + 4096);
        if spec.link.transfer(rest) <= limit || report.rounds >= spec.max_rounds {
            return Ok(Ok(pages));
        }
    }
}
