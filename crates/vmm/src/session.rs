//! Driving a booted VM to its end: slices of `Vm::run_until`, with the
//! stop request, the limits and the progress display looked at between
//! slices.

use crate::signals::{Signal, StopRequest};
use crate::units::{cycles_to_secs, duration_to_cycles, format_duration};
use hv::{Cycles, RunStatus, StopReason, Vm};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Virtual time run between two looks at the stop request and the limits:
/// a third of a virtual millisecond, a few tens of host milliseconds at
/// most, so a stop is prompt. Slicing does not change what the VM does
/// (its rounds do not depend on where `run_until` returns).
pub const SLICE_CYCLES: u64 = hv::CYCLES_PER_SECOND / 3000;

/// Limits on a run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Limits {
    /// Virtual time.
    pub time: Option<Duration>,
    /// Host (wall-clock) time.
    pub wall: Option<Duration>,
    /// Virtual time between two looks (default [`SLICE_CYCLES`]).
    pub slice: Option<Cycles>,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The VM stopped by itself.
    Vm(StopReason),
    /// A signal asked for a stop.
    Interrupted(Signal),
    /// `--time-limit` was reached.
    TimeLimit(Duration),
    /// `--wall-limit` was reached.
    WallLimit(Duration),
    /// `--snapshot-at`: stopped at `at` and saved the VM to `path`.
    Snapshot {
        path: std::path::PathBuf,
        at: Duration,
    },
    /// `--snapshot-at`: stopped, but the VM could not be saved.
    SnapshotFailed { message: String },
    /// `--migrate-to`: the VM runs at the destination now.
    Migrated { to: String },
    /// A Linux guest's kernel panicked (its console said `Kernel panic -
    /// not syncing: MESSAGE`).
    GuestPanic { message: String },
}

impl Ending {
    /// One line for people: `shutdown (status 0)`, `interrupted (SIGINT)`.
    pub fn describe(&self) -> String {
        match self {
            Ending::Vm(StopReason::Shutdown { status }) => format!("shutdown (status {status})"),
            Ending::Vm(StopReason::DebugExit { status }) => {
                format!("debug_exit (status {status})")
            }
            Ending::Vm(StopReason::Error(e)) => format!("error: {e}"),
            Ending::Vm(StopReason::PowerOff) => "power off".to_string(),
            Ending::Interrupted(signal) => format!("interrupted ({})", signal.name()),
            Ending::TimeLimit(d) => format!("time_limit (--time-limit {})", format_duration(*d)),
            Ending::WallLimit(d) => format!("wall_limit (--wall-limit {})", format_duration(*d)),
            Ending::Snapshot { path, at } => format!(
                "snapshot (saved to {} at {})",
                path.display(),
                format_duration(*at)
            ),
            Ending::SnapshotFailed { message } => format!("snapshot failed: {message}"),
            Ending::Migrated { to } => format!("migrated (to {to})"),
            Ending::GuestPanic { message } => format!("panic: {message}"),
        }
    }
}

/// A point in virtual time where driving pauses for the VMM's own work,
/// as opposed to a limit that ends the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopPoint {
    /// `--snapshot-at`: save the VM.
    Snapshot,
    /// `--migrate-at`: start the migration.
    Migrate,
    /// The end of a stretch the VMM asked for (a pre-copy round).
    Stretch,
}

/// Where [`drive_to`] pauses, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopAt {
    pub at: Cycles,
    pub point: StopPoint,
}

/// What [`drive_to`] came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Driven {
    /// The stop point, before any limit (one at the same time included):
    /// the VM is intact and can be driven on.
    Reached(StopPoint),
    /// The run ended.
    Ended(Ending),
}

/// Runs `vm` until it stops, a signal arrives or a limit is reached,
/// calling `after_slice` after every slice (serial output, progress);
/// an ending it returns ends the run.
pub fn drive(
    vm: &mut Vm,
    limits: &Limits,
    stop: &StopRequest,
    after_slice: impl FnMut(&mut Vm) -> Option<Ending>,
) -> Ending {
    match drive_to(vm, limits, None, stop, after_slice) {
        Driven::Ended(ending) => ending,
        Driven::Reached(point) => {
            unreachable!("no stop point was given, yet {point:?} was reached")
        }
    }
}

/// [`drive`], pausing at `stop_at` if the run gets there: a stop point
/// wins over a time limit at the same virtual time.
pub fn drive_to(
    vm: &mut Vm,
    limits: &Limits,
    stop_at: Option<StopAt>,
    stop: &StopRequest,
    mut after_slice: impl FnMut(&mut Vm) -> Option<Ending>,
) -> Driven {
    let started = Instant::now();
    let time_limit = limits.time.map(|d| Cycles(duration_to_cycles(d)));
    loop {
        if let Some(signal) = stop.signal() {
            return Driven::Ended(Ending::Interrupted(signal));
        }
        if let Some(wall) = limits.wall {
            if started.elapsed() >= wall {
                return Driven::Ended(Ending::WallLimit(wall));
            }
        }
        let now = vm.time();
        let mut until = now.saturating_add(limits.slice.unwrap_or(Cycles(SLICE_CYCLES)));
        if let Some(StopAt { at, point }) = stop_at {
            if now >= at {
                return Driven::Reached(point);
            }
            until = until.min(at);
        }
        if let (Some(limit), Some(d)) = (time_limit, limits.time) {
            if now >= limit {
                return Driven::Ended(Ending::TimeLimit(d));
            }
            until = until.min(limit);
        }
        let status = vm.run_until(until);
        if let Some(ending) = after_slice(vm) {
            return Driven::Ended(ending);
        }
        if let RunStatus::Stopped(reason) = status {
            return Driven::Ended(Ending::Vm(reason));
        }
    }
}

/// Watches a Linux guest's console for a kernel panic: Linux prints
/// `Kernel panic - not syncing: MESSAGE`, then (with `panic=-1`, the
/// default command line's) reboots at once, which the machine sees as a
/// triple fault, or (without it) `---[ end Kernel panic ...` and spins
/// forever. Either way the run ends with the panic's message.
#[derive(Debug, Default)]
pub struct PanicWatch {
    line: Vec<u8>,
    message: Option<String>,
    ended: bool,
}

/// Longest console line kept: a panic message is far shorter.
const PANIC_LINE_MAX: usize = 1024;
const PANIC_MARK: &str = "Kernel panic - not syncing: ";
const PANIC_END_MARK: &str = "---[ end Kernel panic - not syncing";

impl PanicWatch {
    /// Looks at more console output.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' {
                let line = String::from_utf8_lossy(&self.line).into_owned();
                self.line.clear();
                self.look_at(&line);
            } else if self.line.len() < PANIC_LINE_MAX {
                self.line.push(b);
            }
        }
    }

    fn look_at(&mut self, line: &str) {
        if self.message.is_none() {
            if let Some(at) = line.find(PANIC_MARK) {
                let message = line[at + PANIC_MARK.len()..].trim_end();
                self.message = Some(message.to_string());
            }
        } else if line.contains(PANIC_END_MARK) {
            self.ended = true;
        }
    }

    /// The panic's message, once the console showed one.
    pub fn message(&self) -> Option<&str> {
        self.message.as_deref()
    }

    /// The ending of a run whose guest panicked and will never go on
    /// (it printed the end of its panic and now spins).
    pub fn ending(&self) -> Option<Ending> {
        self.ended.then(|| Ending::GuestPanic {
            message: self.message.clone().unwrap_or_default(),
        })
    }

    /// How the run ended, given that the VM stopped so: an error (the
    /// triple fault of Linux's reboot) after a panic is the panic.
    pub fn explain(&self, ending: Ending) -> Ending {
        match (self.message(), ending) {
            (Some(message), Ending::Vm(StopReason::Error(_))) => Ending::GuestPanic {
                message: message.to_string(),
            },
            (_, ending) => ending,
        }
    }
}

/// Progress of one VM run on stderr: virtual time, its rate against host
/// time and the guest MIPS. Drawn only when stderr is a terminal.
pub struct Progress {
    bar: ProgressBar,
    started: Instant,
    /// When the state was last shown (`None`: not yet; the first update
    /// shows it at once, however short the run).
    last: Option<Instant>,
}

/// Whether progress is shown at all.
fn on_terminal() -> bool {
    std::io::stderr().is_terminal()
}

impl Progress {
    /// Progress of `faultline run`; a bar up to the time limit if there is
    /// one, else a spinner.
    pub fn single(limit: Option<Duration>) -> Progress {
        let bar = if !on_terminal() {
            ProgressBar::hidden()
        } else if let Some(limit) = limit {
            let bar = ProgressBar::new(duration_to_cycles(limit).max(1));
            bar.set_style(
                ProgressStyle::with_template("{bar:30} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar
        } else {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar
        };
        Progress::with_bar(bar)
    }

    fn with_bar(bar: ProgressBar) -> Progress {
        let now = Instant::now();
        Progress {
            bar,
            started: now,
            last: None,
        }
    }

    /// Shows the VM's state (at most ten times a second).
    pub fn update(&mut self, label: &str, vm: &Vm) {
        let shown_lately = self
            .last
            .is_some_and(|last| last.elapsed() < Duration::from_millis(100));
        if self.bar.is_hidden() || shown_lately {
            return;
        }
        self.last = Some(Instant::now());
        let virtual_secs = cycles_to_secs(vm.time().0);
        let wall = self.started.elapsed().as_secs_f64().max(1e-9);
        let instructions = vm.stats().instructions();
        self.bar.set_position(vm.time().0);
        self.bar.set_message(format!(
            "{label}virtual {virtual_secs:.3} s ({:.3}x host time, {:.0} MIPS)",
            virtual_secs / wall,
            instructions as f64 / wall / 1e6
        ));
    }

    /// Runs `f` (which writes to the terminal) with the display hidden.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    /// Removes the display.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// Progress of a benchmark: one line per run in flight and a total.
pub struct BenchProgress {
    multi: MultiProgress,
    total: ProgressBar,
}

impl BenchProgress {
    pub fn new(runs: usize) -> BenchProgress {
        let multi = MultiProgress::with_draw_target(if on_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        });
        let total = multi.add(ProgressBar::new(runs as u64));
        total.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} runs done, {elapsed} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        BenchProgress { multi, total }
    }

    /// A line for a run that starts.
    pub fn start(&self) -> Progress {
        let bar = if self.multi.is_hidden() {
            ProgressBar::hidden()
        } else {
            let bar = self.multi.add(ProgressBar::new_spinner());
            bar.set_style(
                ProgressStyle::with_template("  {spinner} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar
        };
        Progress::with_bar(bar)
    }

    /// A run ended.
    pub fn done(&self, run: &Progress) {
        run.finish();
        self.multi.remove(&run.bar);
        self.total.inc(1);
    }

    pub fn finish(&self) {
        self.total.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_linux_panic_is_seen_in_pieces() {
        let mut watch = PanicWatch::default();
        watch.feed(b"[    0.49] VFS: Cannot open root device\n[    0.49] Kernel pan");
        assert_eq!(watch.message(), None);
        watch.feed(b"ic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)\r\n");
        assert_eq!(
            watch.message(),
            Some("VFS: Unable to mount root fs on unknown-block(0,0)")
        );
        assert_eq!(watch.ending(), None, "the panic goes on printing");
        let error = Ending::Vm(StopReason::Error(hv::VmError::AllHalted { cycles: 0 }));
        assert!(matches!(watch.explain(error), Ending::GuestPanic { .. }));
        let shutdown = Ending::Vm(StopReason::Shutdown { status: 0 });
        assert_eq!(watch.explain(shutdown.clone()), shutdown);
        watch.feed(b"[    0.50] ---[ end Kernel panic - not syncing: VFS: Unable ]---\n");
        assert!(
            matches!(watch.ending(), Some(Ending::GuestPanic { message }) if message.starts_with("VFS"))
        );
    }

    #[test]
    fn ordinary_output_is_no_panic() {
        let mut watch = PanicWatch::default();
        watch.feed(b"hello\n---[ end Kernel panic - not syncing ]---\n");
        assert_eq!(watch.message(), None);
        assert_eq!(watch.ending(), None);
    }
}
