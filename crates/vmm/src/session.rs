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
        }
    }
}

/// Runs `vm` until it stops, a signal arrives or a limit is reached,
/// calling `after_slice` after every slice (serial output, progress).
pub fn drive(
    vm: &mut Vm,
    limits: &Limits,
    stop: &StopRequest,
    mut after_slice: impl FnMut(&mut Vm),
) -> Ending {
    let started = Instant::now();
    let time_limit = limits.time.map(|d| Cycles(duration_to_cycles(d)));
    loop {
        if let Some(signal) = stop.signal() {
            return Ending::Interrupted(signal);
        }
        if let Some(wall) = limits.wall {
            if started.elapsed() >= wall {
                return Ending::WallLimit(wall);
            }
        }
        let now = vm.time();
        let mut until = now.saturating_add(limits.slice.unwrap_or(Cycles(SLICE_CYCLES)));
        if let (Some(limit), Some(d)) = (time_limit, limits.time) {
            if now >= limit {
                return Ending::TimeLimit(d);
            }
            until = until.min(limit);
        }
        let status = vm.run_until(until);
        after_slice(vm);
        if let RunStatus::Stopped(reason) = status {
            return Ending::Vm(reason);
        }
    }
}

/// Progress of one VM run on stderr: virtual time, its rate against host
/// time and the guest MIPS. Drawn only when stderr is a terminal.
pub struct Progress {
    bar: ProgressBar,
    started: Instant,
    last: Instant,
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
            last: now,
        }
    }

    /// Shows the VM's state (at most ten times a second).
    pub fn update(&mut self, label: &str, vm: &Vm) {
        if self.bar.is_hidden() || self.last.elapsed() < Duration::from_millis(100) {
            return;
        }
        self.last = Instant::now();
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
