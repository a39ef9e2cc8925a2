//! What every test of the `faultline` binary needs: running it as a
//! process and reading what it printed.
// Each test file uses its own subset of these helpers.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

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

/// `faultline incoming --listen 127.0.0.1:0 EXTRA...`, once it listens:
/// the process, the address it bound and the rest of its stderr, read as
/// it comes so it never blocks.
pub fn incoming(extra: &[&str]) -> (Child, String, std::thread::JoinHandle<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_faultline"))
        .args(["incoming", "--listen", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the destination");
    let mut err = BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    err.read_line(&mut line).expect("read stderr");
    let addr = line
        .trim()
        .strip_prefix("faultline: listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line}"))
        .to_string();
    let rest = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    (child, addr, rest)
}

/// The cached Linux kernel image, or `None` (after saying so loudly) when there
/// is none outside CI.
pub fn linux_image() -> Option<PathBuf> {
    let cache = match std::env::var_os("FAULTLINE_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/faultline")
        }
    };
    let image = cache.join("linux/vmlinuz");
    if image.is_file() {
        return Some(image);
    }
    let message = format!(
        "no Linux kernel at {}: run `bash scripts/fetch-linux.sh` first",
        image.display()
    );
    if std::env::var_os("CI").is_some() {
        panic!("{message} (CI is set: the Linux tests must run)");
    }
    eprintln!("\n*** SKIP: {message} ***\n");
    None
}
