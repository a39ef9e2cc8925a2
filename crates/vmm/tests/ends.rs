//! Runs that end well (issue 32): processes that stop on their own
//! deadline and on the first SIGINT or SIGTERM, and inputs checked before
//! anything runs. Every child is waited for with a deadline, so a
//! regression fails the test instead of hanging it.

mod common;
use common::{faultline, incoming, stderr, stdout};

use std::io::Read;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Waits for `child` at most `limit`; kills it and fails if it is still
/// running then. Returns its exit code.
fn wait_bounded(child: &mut Child, limit: Duration, what: &str) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `faultline ARGS` with `stdin`, at most `limit`: its exit code and
/// stderr.
fn run_bounded(args: &[&str], stdin: Stdio, limit: Duration) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_faultline"))
        .args(args)
        .stdin(stdin)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut err = String::new();
        let _ = stderr.read_to_string(&mut err);
        err
    });
    let code = wait_bounded(&mut child, limit, &args.join(" "));
    (code, reader.join().unwrap())
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid, with a valid signal number.
    let rc = unsafe { libc::kill(child.id() as i32, sig) };
    assert_eq!(rc, 0, "kill");
}

#[test]
fn incoming_without_a_source_ends_at_its_timeout() {
    let started = Instant::now();
    let (mut child, _, err) = incoming(&["--timeout", "1s"]);
    let code = wait_bounded(&mut child, Duration::from_secs(20), "incoming --timeout 1s");
    let err = err.join().unwrap();
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("no source within 1s"), "{err}");
    assert!(started.elapsed() >= Duration::from_secs(1));
}

#[test]
fn incoming_stops_on_the_first_sigint_or_sigterm_while_it_waits() {
    for (sig, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let (mut child, _, err) = incoming(&[]);
        signal(&child, sig);
        let got = wait_bounded(&mut child, Duration::from_secs(10), "incoming, signalled");
        let err = err.join().unwrap();
        assert_eq!(got, Some(code), "{err}");
        assert!(err.contains("while waiting for a source"), "{err}");
    }
}

#[test]
fn incoming_stops_on_a_signal_while_a_silent_source_is_connected() {
    let (mut child, addr, err) = incoming(&[]);
    // A "source" that connects and says nothing: the destination waits in
    // its first read (60 s by default).
    let stream = std::net::TcpStream::connect(&addr).expect("connect");
    std::thread::sleep(Duration::from_millis(200));
    signal(&child, libc::SIGTERM);
    let got = wait_bounded(&mut child, Duration::from_secs(10), "incoming, connected");
    let err = err.join().unwrap();
    assert_eq!(got, Some(143), "{err}");
    assert!(err.contains("interrupted (SIGTERM)"), "{err}");
    drop(stream);
}

#[test]
fn endless_or_special_input_files_are_refused_at_once() {
    for args in [
        &["run", "--kernel", "/dev/zero", "--", "x"][..],
        &["run", "--console-input", "/dev/zero", "--", "hello"][..],
        &["run", "--console-input", "/proc", "--", "hello"][..],
        &[
            "run",
            "--guest",
            "linux",
            "--kernel-image",
            "/dev/zero",
            "--",
            "hello",
        ][..],
        &[
            "run",
            "--guest",
            "linux",
            "--kernel-image",
            "/dev/null",
            "--initrd",
            "/dev/zero",
            "--",
            "hello",
        ][..],
    ] {
        let (code, err) = run_bounded(args, Stdio::null(), Duration::from_secs(20));
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains("not a regular file"), "{args:?}: {err}");
    }
}

#[test]
fn endless_standard_input_is_cut_at_the_cap() {
    let zero = std::fs::File::open("/dev/zero").expect("/dev/zero");
    let args = ["run", "--console-input", "-", "--", "hello"];
    let (code, err) = run_bounded(&args, Stdio::from(zero), Duration::from_secs(30));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--console-input -: more than 64M"), "{err}");
}

#[test]
fn snapshot_and_migration_targets_are_checked_before_the_guest_runs() {
    let out = faultline(&[
        "run",
        "--snapshot-at",
        "1ms",
        "--snapshot",
        "/nonexistent-dir/snap",
        "--",
        "hello",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("directory /nonexistent-dir does not exist"));
    assert!(stdout(&out).is_empty(), "the guest did not run");
    for (to, says) in [
        ("127.0.0.1", "no port"),
        ("127.0.0.1:99999", "is not a port"),
        ("no-such-host.invalid:4444", "cannot resolve"),
    ] {
        let out = faultline(&[
            "run",
            "--migrate-to",
            to,
            "--migrate-at",
            "1ms",
            "--",
            "hello",
        ]);
        assert_eq!(out.status.code(), Some(2), "{to}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{to}: {}", stderr(&out));
        assert!(stdout(&out).is_empty(), "{to}: the guest did not run");
    }
}

/// `run --stats json --migrate-to ADDR --migrate-at AT EXTRA -- hello`:
/// the process's output and its JSON summary.
#[cfg(bundled_kernel)]
fn migrate_hello(
    addr: &str,
    at: &str,
    extra: &[&str],
) -> (std::process::Output, serde_json::Value) {
    let mut args = vec![
        "run",
        "--stats",
        "json",
        "--migrate-to",
        addr,
        "--migrate-at",
        at,
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "hello"]);
    let out = faultline(&args);
    let v = serde_json::from_slice(&out.stdout).expect("JSON");
    (out, v)
}

#[cfg(bundled_kernel)]
#[test]
fn a_stop_point_after_the_program_ends_is_reported_and_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap");
    let snap = snap.to_str().unwrap();
    let out = faultline(&[
        "run",
        "--snapshot-at",
        "10s",
        "--snapshot",
        snap,
        "--",
        "hello",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("not reached:  --snapshot-at 10s: the run ended at"),
        "{}",
        stdout(&out)
    );
    assert!(!std::path::Path::new(snap).exists());
    // Nobody listens there: it is never connected to either.
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let (out, v) = migrate_hello(&addr, "10s", &[]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(v["stop"]["reason"], "shutdown");
    assert_eq!(v["not_reached"]["option"], "--migrate-at");
    assert_eq!(v["exit_status"], 3);
    assert!(stderr(&out).contains("--migrate-at 10s was not reached"));
}

/// A stop point is not a time limit: at the same virtual time the save
/// happens, and a limit before it ends the run without one.
#[cfg(bundled_kernel)]
#[test]
fn a_stop_point_at_the_time_limit_is_reached_and_one_after_it_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let run = |limit: &str, snap: &str| {
        faultline(&[
            "run",
            "--stats",
            "json",
            "--time-limit",
            limit,
            "--snapshot-at",
            "2ms",
            "--snapshot",
            snap,
            "--",
            "pagetag",
            "-m",
            "8M",
            "-p",
            "3",
        ])
    };
    let at_limit = dir.path().join("at-limit");
    let out = run("2ms", at_limit.to_str().unwrap());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["stop"]["reason"], "snapshot", "{v}");
    assert!(at_limit.exists());

    let after_limit = dir.path().join("after-limit");
    let out = run("1ms", after_limit.to_str().unwrap());
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["stop"]["reason"], "time_limit", "{v}");
    assert_eq!(v["not_reached"]["option"], "--snapshot-at", "{v}");
    assert!(!after_limit.exists());
}

#[cfg(bundled_kernel)]
#[test]
fn a_destination_that_never_answers_is_said_so_and_fails_the_run() {
    // Takes everything the source sends and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let sink = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 1 << 16];
        while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
    });
    let (out, v) = migrate_hello(&addr, "300us", &["--migrate-timeout", "2s"]);
    let _ = sink.join();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(v["stop"]["reason"], "shutdown", "the VM went on here");
    assert_eq!(
        v["migration"]["failed"], "no answer from the destination within 2s",
        "{}",
        v["migration"]
    );
    assert!(!stderr(&out).contains("os error"), "{}", stderr(&out));
}

/// Options that used to be accepted and then did nothing, or not what was
/// meant (issue 32, item 6): each is a usage error before anything runs.
#[test]
fn options_that_would_do_nothing_are_refused() {
    for (args, says) in [
        (
            &["run", "--cr3-cache", "on", "--", "hello"][..],
            "needs --mmu shadow",
        ),
        (
            &["run", "--option", "no-apff", "--", "hello"][..],
            "no such boot option",
        ),
        (
            &[
                "run", "--guest", "linux", "--option", "no-apf", "--", "hello",
            ][..],
            "Linux takes its options from --cmdline",
        ),
        (
            &["run", "--cmdline", "x -- hello", "--", "hello"][..],
            "boot options only",
        ),
        (&["run", "--vcpus", "0", "--", "hello"][..], "--vcpus"),
        (&["bench", "apf", "--duration", "0"][..], "above zero"),
        (&["bench", "apf", "--vcpus", "0"][..], "--vcpus"),
        (
            &["bench", "apf", "--host-mem", "1K"][..],
            "--host-mem 1K: guest memory, 4x",
        ),
    ] {
        let out = faultline(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("runs in"), "{args:?}: nothing ran");
    }
}

/// The bundled kernel's `--cmdline` gives boot options; the program after
/// `--` is appended, never dropped.
#[cfg(bundled_kernel)]
#[test]
fn cmdline_keeps_the_program() {
    let out = faultline(&["run", "--cmdline", "no-apf", "--", "hello", "a"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("cmdline 'no-apf -- hello a'"),
        "{}",
        stdout(&out)
    );
    let out = faultline(&["run", "--cmdline", "", "--", "hello"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}
