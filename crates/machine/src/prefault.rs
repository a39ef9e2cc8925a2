//! Backing machine memory before its first use, on another host thread.
//!
//! The host kernel backs an anonymous mapping on first touch and zeroes
//! what it backs (2 MiB at a time with transparent huge pages). Done on
//! the thread that runs the vCPUs, that zeroing is a tenth of a Linux
//! boot's host time. The hypervisor hands out frames from a bump pointer
//! (`hv::frames`), so the next frames it will touch are known: a helper
//! thread asks the kernel to back a window ahead of that pointer with
//! `MADV_POPULATE_WRITE`, which faults pages in without changing the
//! contents of any page already there. Nothing the machine models
//! depends on it (the memory reads the same either way); it only moves
//! host work off the vCPU thread, as QEMU's memory preallocation threads
//! do. Where the kernel refuses (before Linux 5.14), the thread stops
//! and the first touch happens where it did.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// One step of the helper: a huge page, the unit the kernel backs.
const CHUNK: u64 = 2 << 20;
/// At most this far ahead of the highest address asked for; never more
/// than what was used so far, so a small VM backs little it does not use.
const MAX_AHEAD: u64 = 16 << 20;

/// What the requesting side and the helper thread share.
struct Shared {
    /// The mapping's start as an address (the thread only passes it to
    /// `madvise`; it never dereferences it).
    base: usize,
    size: u64,
    /// Back the mapping up to this offset (a multiple of `CHUNK`).
    wanted: AtomicU64,
    /// Backed so far, from offset 0.
    backed: AtomicU64,
    stop: AtomicBool,
    /// The kernel refused (or the thread could not start): ask no more.
    off: AtomicBool,
}

/// The helper thread, started on the first request.
pub(crate) struct Prefaulter {
    shared: Arc<Shared>,
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Prefaulter {
    /// A prefaulter for the mapping `[base, base + size)`, which must stay
    /// mapped until [`Prefaulter::stop`] returns.
    pub(crate) fn new(base: *mut u8, size: u64) -> Self {
        Prefaulter {
            shared: Arc::new(Shared {
                base: base as usize,
                size,
                wanted: AtomicU64::new(0),
                backed: AtomicU64::new(0),
                stop: AtomicBool::new(false),
                off: AtomicBool::new(false),
            }),
            thread: std::sync::Mutex::new(None),
        }
    }

    /// The machine is about to use memory at offset `at`: have the window
    /// after it backed in the background.
    pub(crate) fn ahead_of(&self, at: u64) {
        let ahead = at.clamp(CHUNK, MAX_AHEAD);
        let want = (at + ahead).next_multiple_of(CHUNK).min(self.shared.size);
        // Re-arm when the use has crossed into the window's second half.
        if want <= self.shared.wanted.load(Ordering::Relaxed) + ahead / 2
            || self.shared.off.load(Ordering::Relaxed)
        {
            return;
        }
        self.shared.wanted.fetch_max(want, Ordering::Release);
        let mut thread = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        match thread.as_ref() {
            Some(handle) => handle.thread().unpark(),
            None => {
                let shared = self.shared.clone();
                match std::thread::Builder::new()
                    .name("prefault".into())
                    .spawn(move || shared.run())
                {
                    Ok(handle) => *thread = Some(handle),
                    Err(_) => self.shared.off.store(true, Ordering::Relaxed),
                }
            }
        }
    }

    /// How far the helper has backed the mapping, and whether it has
    /// given up (the kernel refused).
    #[cfg(test)]
    pub(crate) fn progress(&self) -> (u64, bool) {
        (
            self.shared.backed.load(Ordering::Acquire),
            self.shared.off.load(Ordering::Relaxed),
        )
    }

    /// Stops the helper and waits for it: after this, nothing touches the
    /// mapping on its behalf.
    pub(crate) fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        let handle = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(handle) = handle {
            handle.thread().unpark();
            let _ = handle.join();
        }
    }
}

impl Shared {
    /// The helper thread: back chunk after chunk up to `wanted`, park when
    /// there; end on `stop` or on the kernel's refusal.
    fn run(&self) {
        let mut done = 0;
        while !self.stop.load(Ordering::Acquire) {
            if done >= self.wanted.load(Ordering::Acquire) {
                std::thread::park();
                continue;
            }
            let len = CHUNK.min(self.size - done);
            // SAFETY: `[base + done, +len)` lies inside the mapping, which
            // stays mapped until `stop` has joined this thread.
            // MADV_POPULATE_WRITE only faults pages in: contents already
            // there are left as they are, so the vCPU thread's concurrent
            // use of the same pages is unaffected.
            let refused = unsafe {
                libc::madvise(
                    (self.base + done as usize) as *mut libc::c_void,
                    len as usize,
                    libc::MADV_POPULATE_WRITE,
                )
            } != 0;
            if refused {
                self.off.store(true, Ordering::Relaxed);
                return;
            }
            done += len;
            self.backed.store(done, Ordering::Release);
        }
    }
}
