//! Fuzz target: restoring a VM snapshot. The input is a snapshot with its
//! section checksums recomputed (`hv::snapshot::format::reseal`), so the
//! fuzzer's mutations reach the container parser, the bincode decoder and
//! every check of the restore instead of all stopping at a CRC mismatch.
//! Any panic is a bug; every refusal must be an error value.

use hv::snapshot::{format, inspect, RestoreOptions};
use hv::Vm;

fn main() {
    afl::fuzz!(|data: &[u8]| {
        let mut bytes = data.to_vec();
        format::reseal(&mut bytes);
        let _ = inspect(&bytes);
        let _ = Vm::restore(&bytes, &RestoreOptions::default());
    });
}
