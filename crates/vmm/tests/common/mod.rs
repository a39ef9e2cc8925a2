//! What every test of the `faultline` binary needs: running it as a
//! process and reading what it printed.
// Each test file uses its own subset of these helpers.
#![allow(dead_code)]

use std::process::{Command, Output};

/// Runs `faultline ARGS...` to completion.
pub fn faultline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_faultline"))
        .args(args)
        .output()
        .expect("run faultline")
}

/// Its standard output as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Its standard error as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A small overcommitted VM: 2 vCPUs, 48 MiB of guest memory on 8 MiB of
/// host memory, swapping to a fast device so tests stay quick.
pub const SMALL_OVERCOMMIT: [&str; 8] = [
    "--vcpus",
    "2",
    "--mem",
    "48M",
    "--host-mem",
    "8M",
    "--swap-device",
    "nvme",
];

/// `pagetag` sized for [`SMALL_OVERCOMMIT`]: 16 MiB, 3 passes, 2 threads.
pub const SMALL_PAGETAG: [&str; 7] = ["pagetag", "-m", "16M", "-p", "3", "-t", "2"];
