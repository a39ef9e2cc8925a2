//! SIGINT and SIGTERM: the first asks the running VMs to stop at their next
//! safe point (between two slices of `Vm::run_until`), so the summary is
//! printed and the process exits 130 or 143; a second one exits at once
//! with the same status. The temporary swap file is unlinked from the
//! start (see `hv::swap::SwapFile::temporary`), so neither leaves it behind.

use signal_hook::consts::{SIGINT, SIGTERM};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// A signal that stops runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Int,
    Term,
}

impl Signal {
    fn from_number(n: usize) -> Option<Signal> {
        match i32::try_from(n).ok()? {
            SIGINT => Some(Signal::Int),
            SIGTERM => Some(Signal::Term),
            _ => None,
        }
    }

    fn number(self) -> i32 {
        match self {
            Signal::Int => SIGINT,
            Signal::Term => SIGTERM,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Signal::Int => "SIGINT",
            Signal::Term => "SIGTERM",
        }
    }

    /// The shell's status for a process ended by this signal: 128 + n.
    pub fn exit_status(self) -> u8 {
        128 + self.number() as u8
    }
}

/// Whether a stop was asked for, and by which signal.
#[derive(Debug, Clone, Default)]
pub struct StopRequest {
    signal: Arc<AtomicUsize>,
}

impl StopRequest {
    /// Installs the handlers for SIGINT and SIGTERM.
    pub fn install() -> std::io::Result<StopRequest> {
        let stop = StopRequest::default();
        let seen = Arc::new(AtomicBool::new(false));
        for signal in [Signal::Int, Signal::Term] {
            let n = signal.number();
            // Registered first, so it runs before `seen` is set: it exits
            // only on a signal that arrives after the first one.
            signal_hook::flag::register_conditional_shutdown(
                n,
                i32::from(signal.exit_status()),
                Arc::clone(&seen),
            )?;
            signal_hook::flag::register(n, Arc::clone(&seen))?;
            signal_hook::flag::register_usize(n, Arc::clone(&stop.signal), n as usize)?;
        }
        Ok(stop)
    }

    /// The signal that asked for a stop, if one did.
    pub fn signal(&self) -> Option<Signal> {
        Signal::from_number(self.signal.load(Ordering::Relaxed))
    }
}
