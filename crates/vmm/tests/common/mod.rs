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
