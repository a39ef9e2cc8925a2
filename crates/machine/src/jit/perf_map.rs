//! Names for generated code in profiles: with `FAULTLINE_PERF_MAP=1` in
//! the environment, every translation is appended to
//! `/tmp/perf-<pid>.map` (the format `perf report` reads for JIT code:
//! `START SIZE NAME`, hexadecimal), named by the guest RIP and physical
//! address of its block. Off by default: it is a host-side diagnostic and
//! writes outside the working directory.

use std::fs::File;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

static MAP: OnceLock<Option<Mutex<File>>> = OnceLock::new();

fn open() -> Option<Mutex<File>> {
    if std::env::var_os("FAULTLINE_PERF_MAP").is_none_or(|v| v.is_empty() || v == "0") {
        return None;
    }
    let path = format!("/tmp/perf-{}.map", std::process::id());
    match File::options().create(true).append(true).open(&path) {
        Ok(f) => Some(Mutex::new(f)),
        Err(e) => {
            eprintln!("faultline: FAULTLINE_PERF_MAP: cannot open {path}: {e}");
            None
        }
    }
}

/// Records generated code at `start`, `len` bytes, for the block at guest
/// `rip` (host-physical `hpa`). Does nothing unless enabled; a failed
/// write is ignored (the map is a diagnostic).
pub(crate) fn record(start: u64, len: usize, rip: u64, hpa: u64) {
    let Some(map) = MAP.get_or_init(open) else {
        return;
    };
    let Ok(mut f) = map.lock() else {
        return;
    };
    let _ = writeln!(f, "{start:x} {len:x} guest_rip_{rip:x}_hpa_{hpa:x}");
}
