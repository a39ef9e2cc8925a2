//! How runs end, with real processes on the bundled guest kernel: signals
//! (SIGINT, SIGTERM, a second signal, SIGKILL) and the temporary swap file,
//! `--time-limit` and `--wall-limit`, and the stop reasons in the summary.
#![cfg(bundled_kernel)]

mod common;
use common::faultline;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// An overcommitted `bm` that runs for a very long virtual time, its
/// temporary swap file in `tmpdir`.
fn start_overcommitted_bm(tmpdir: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_faultline"))
        .args(["run", "--vcpus", "2", "--mem", "64M", "--host-mem", "8M"])
        .args(["--swap-device", "nvme"])
        .args(extra)
        .args(["--", "bm", "-f", "2", "-w", "2", "-m", "32M", "-t", "1000"])
        .env("TMPDIR", tmpdir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn faultline")
}

/// Reads the child's console until bm has started (its threads are then
/// faulting pages through swap); returns what was read.
fn wait_for_bm(child: &mut Child) -> (String, BufReader<std::process::ChildStdout>) {
    let mut reader = BufReader::new(child.stdout.take().expect("stdout"));
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line).expect("read console");
        assert!(n > 0, "faultline ended before bm started: {seen}");
        seen.push_str(&line);
        if line.starts_with("bm: ") {
            return (seen, reader);
        }
    }
}

/// Swap files of this process still linked into `dir` (none, ever) and
/// open-but-unlinked ones (the live temporary swap file).
fn swap_files(pid: u32, dir: &Path) -> (usize, usize) {
    let linked = std::fs::read_dir(dir).expect("tmpdir").count();
    let deleted = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .filter(|target| {
                    target.starts_with(dir) && target.to_string_lossy().ends_with("(deleted)")
                })
                .count()
        })
        .unwrap_or(0);
    (linked, deleted)
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid, with a valid signal number.
    let rc = unsafe { libc::kill(child.id() as i32, sig) };
    assert_eq!(rc, 0, "kill");
}

/// Waits until `pid` has `n` swap files open (each VM opens its own when
/// it is created).
fn wait_for_swap_files(pid: u32, dir: &Path, n: usize) {
    while swap_files(pid, dir).1 < n {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Sends `sig` once bm runs; returns the exit code and all of stdout.
fn interrupt(sig: i32, extra: &[&str]) -> (Option<i32>, String, String, tempfile::TempDir) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut child = start_overcommitted_bm(tmp.path(), extra);
    let mut stdout = String::new();
    if extra.contains(&"json") {
        // The console goes into the JSON at the end: nothing to read yet.
        wait_for_swap_files(child.id(), tmp.path(), 1);
    } else {
        let (seen, mut rest) = wait_for_bm(&mut child);
        stdout = seen;
        signal(&child, sig);
        rest.read_to_string(&mut stdout).expect("read stdout");
    }
    // The swap file exists and is already unlinked.
    let (linked, _) = swap_files(child.id(), tmp.path());
    assert_eq!(linked, 0, "nothing linked in TMPDIR while running");
    if extra.contains(&"json") {
        signal(&child, sig);
        child
            .stdout
            .take()
            .expect("stdout")
            .read_to_string(&mut stdout)
            .expect("read stdout");
    }
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    let status = child.wait().expect("wait");
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "no swap file left behind"
    );
    (status.code(), stdout, stderr, tmp)
}

#[test]
fn sigint_stops_at_a_safe_point_with_the_summary_and_no_swap_file() {
    let (code, stdout, stderr, _tmp) = interrupt(libc::SIGINT, &[]);
    assert_eq!(code, Some(130), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("--- faultline summary ---")
            && stdout.contains("stopped:      interrupted (SIGINT)"),
        "{stdout}"
    );
    assert!(stdout.contains("host memory:"), "{stdout}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn sigterm_gives_143_and_a_json_stop_reason() {
    let (code, stdout, stderr, _tmp) = interrupt(libc::SIGTERM, &["--stats", "json"]);
    assert_eq!(code, Some(143), "{stdout}\n{stderr}");
    // In JSON mode the console is inside the document: the `bm:` line
    // the test waited for is part of it, and stdout is one document.
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document");
    assert_eq!(v["stop"]["reason"], "interrupted");
    assert_eq!(v["stop"]["signal"], "SIGTERM");
    assert_eq!(v["exit_status"], 143);
    assert!(v["memory"]["pager"]["evictions"].is_u64(), "{v}");
}

#[test]
fn a_second_signal_exits_at_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut child = start_overcommitted_bm(tmp.path(), &[]);
    let (_, mut rest) = wait_for_bm(&mut child);
    // SIGINT then SIGTERM (two different signals cannot merge into one
    // pending signal): the second arrives long before the first one's
    // stop (the end of a slice) and exits without a summary, with its own
    // status (the kernel may deliver the two in either order).
    signal(&child, libc::SIGINT);
    signal(&child, libc::SIGTERM);
    let mut stdout = String::new();
    rest.read_to_string(&mut stdout).expect("read stdout");
    let status = child.wait().expect("wait");
    assert!(!stdout.contains("--- faultline summary ---"), "{stdout}");
    assert!(matches!(status.code(), Some(130 | 143)), "{status:?}");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[test]
fn sigkill_leaves_no_swap_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut child = start_overcommitted_bm(tmp.path(), &[]);
    let (_, _rest) = wait_for_bm(&mut child);
    let (linked, deleted) = swap_files(child.id(), tmp.path());
    assert_eq!(
        (linked, deleted),
        (0, 1),
        "the swap file is open and already unlinked"
    );
    child.kill().expect("SIGKILL");
    child.wait().expect("wait");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[test]
fn time_limit_ends_the_run_cleanly_and_repeats_exactly() {
    let args = [
        "run",
        "--vcpus",
        "2",
        "--mem",
        "64M",
        "--stats",
        "json",
        "--time-limit",
        "5ms",
        "--",
        "bm",
        "-f",
        "2",
        "-w",
        "2",
        "-m",
        "8M",
        "-t",
        "1000",
    ];
    let a = faultline(&args);
    assert_eq!(a.status.code(), Some(124));
    let v: serde_json::Value = serde_json::from_slice(&a.stdout).expect("json");
    assert_eq!(v["stop"]["reason"], "time_limit");
    assert_eq!(v["stop"]["limit"], "5ms");
    let cycles = v["virtual_cycles"].as_u64().unwrap();
    let limit = v["stop"]["limit_cycles"].as_u64().unwrap();
    // Stopped at the limit, within a scheduling round (one quantum).
    assert!(
        cycles >= limit && cycles <= limit + 100_000,
        "{cycles} {limit}"
    );
    let b = faultline(&args);
    assert_eq!(a.stdout, b.stdout, "virtual time limits are deterministic");
}

#[test]
fn wall_limit_ends_the_run_cleanly() {
    let out = faultline(&[
        "run",
        "--mem",
        "64M",
        "--wall-limit",
        "300ms",
        "--",
        "bm",
        "-f",
        "1",
        "-w",
        "1",
        "-m",
        "8M",
        "-t",
        "1000",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(124), "{stdout}");
    assert!(
        stdout.contains("stopped:      wall_limit (--wall-limit 300ms)"),
        "{stdout}"
    );
}

#[test]
fn limits_are_parsed_strictly() {
    for bad in ["0s", "2", "1.5", "abc", "-1s", "1e3ms", ""] {
        for option in ["--time-limit", "--wall-limit"] {
            let out = faultline(&["run", option, bad, "--", "hello"]);
            assert_eq!(out.status.code(), Some(2), "{option} {bad:?}");
        }
    }
}

#[test]
fn bench_interrupted_reports_its_runs_and_exits_130() {
    let child = Command::new(env!("CARGO_BIN_EXE_faultline"))
        .args(["bench", "apf", "--vcpus", "2", "--host-mem", "8M"])
        .args(["--duration", "1000", "--jobs", "2", "--swap-device", "nvme"])
        .args(["--plot", "/dev/null/never-written.svg"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // --plot is checked before any run: /dev/null/... is refused at once.
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(2));

    let dir = tempfile::tempdir().expect("tempdir");
    let plot = dir.path().join("apf.svg");
    let child = Command::new(env!("CARGO_BIN_EXE_faultline"))
        .args(["bench", "apf", "--vcpus", "2", "--host-mem", "8M"])
        .args(["--duration", "1000", "--jobs", "2", "--swap-device", "nvme"])
        .arg("--plot")
        .arg(&plot)
        .env("TMPDIR", dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Two runs are in flight once their swap files exist.
    wait_for_swap_files(child.id(), dir.path(), 2);
    signal(&child, libc::SIGINT);
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("interrupted by SIGINT")
            && stderr.contains("interrupted: off (at ")
            && stderr.contains("not started: pv, ideal"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
    assert!(!plot.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn progress_shows_on_a_terminal_only() {
    let args = [
        "run",
        "--vcpus",
        "2",
        "--mem",
        "64M",
        "--time-limit",
        "20ms",
        "--",
        "bm",
        "-f",
        "2",
        "-w",
        "2",
        "-m",
        "8M",
        "-t",
        "1",
    ];
    let out = faultline(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("virtual"), "not a terminal: {stderr}");
    // On a terminal (a pseudo-terminal from script(1), when installed).
    let Ok(probe) = Command::new("script").arg("--version").output() else {
        return;
    };
    if !probe.status.success() {
        return;
    }
    let command = std::iter::once(env!("CARGO_BIN_EXE_faultline"))
        .chain(args)
        .collect::<Vec<_>>();
    let out = Command::new("script")
        .args(["-qec", &shell_words::join(command), "/dev/null"])
        .output()
        .expect("script");
    let seen = String::from_utf8_lossy(&out.stdout);
    assert!(
        seen.contains("virtual 0.0") && seen.contains("MIPS"),
        "{seen}"
    );
}
