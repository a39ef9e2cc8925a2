//! Host memory overcommit and async page faults on the bundled guest
//! kernel: data integrity under every wait mode and protocol, determinism,
//! and clean stops on swap errors.
#![cfg(bundled_kernel)]

mod common;
use common::{faultline, stderr, stdout, SMALL_OVERCOMMIT, SMALL_PAGETAG};

use std::process::{Command, Output};

/// With `--stats json` stdout is one JSON document, the guest's console
/// inside it.
fn json_summary(text: &str) -> serde_json::Value {
    serde_json::from_str(text).expect("stdout is one JSON document")
}

fn pagetag(extra: &[&str]) -> (Output, String) {
    let mut args = vec!["run", "--stats", "json"];
    args.extend_from_slice(&SMALL_OVERCOMMIT);
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(&SMALL_PAGETAG);
    let out = faultline(&args);
    let text = stdout(&out);
    (out, text)
}

#[test]
fn pages_survive_swapping_under_every_mode_and_protocol() {
    let modes: [&[&str]; 5] = [
        &["--apf", "off"],
        &["--apf", "halt"],
        &["--apf", "pv"],
        &["--apf", "pv", "--apf-protocol", "event"],
        &["--apf", "pv", "--option", "no-apf"],
    ];
    for (mode, mmu) in modes.iter().flat_map(|m| [(*m, "ept"), (*m, "shadow")]) {
        let args: Vec<&str> = mode.iter().copied().chain(["--mmu", mmu]).collect();
        let (out, text) = pagetag(&args);
        let mode = (mode, mmu);
        assert!(out.status.success(), "{mode:?}: {text}\n{}", stderr(&out));
        assert!(text.contains(" 0 bad pages"), "{mode:?}: {text}");
        let v = json_summary(&text);
        let pager = &v["memory"]["pager"];
        assert!(
            pager["evictions"].as_u64().unwrap() > 1000,
            "{mode:?}: {pager}"
        );
        assert!(
            pager["swap_ins"].as_u64().unwrap() > 1000,
            "{mode:?}: {pager}"
        );
        let apf = &v["apf"];
        let notified = apf["not_present_sent"].as_u64().unwrap();
        assert_eq!(v["mmu"], mmu);
        match mode.0 {
            ["--apf", "off"] => {
                assert_eq!(notified, 0);
                assert_eq!(apf["halts"], 0);
                assert!(apf["stalls"].as_u64().unwrap() > 0);
            }
            ["--apf", "halt"] | [_, _, "--option", "no-apf"] => {
                assert_eq!(notified, 0, "{mode:?}");
                assert!(apf["halts"].as_u64().unwrap() > 0, "{mode:?}: {apf}");
            }
            _ => {
                assert!(notified > 100, "{mode:?}: {apf}");
                // Every not-present is followed by its page-ready (plus
                // the wake-all each vCPU gets when it enables delivery).
                assert_eq!(
                    apf["ready_sent"].as_u64().unwrap(),
                    notified + 2,
                    "{mode:?}: {apf}"
                );
            }
        }
    }
}

#[test]
fn swapping_runs_are_deterministic() {
    for args in [&["--apf", "pv"][..], &["--apf", "pv", "--mmu", "shadow"]] {
        let (a, text_a) = pagetag(args);
        let (b, text_b) = pagetag(args);
        assert!(a.status.success() && b.status.success());
        assert_eq!(
            text_a, text_b,
            "{args:?}: same configuration, same output and counters"
        );
    }
}

#[test]
fn a_full_swap_disk_stops_the_vm_with_a_clear_error() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let swap = dir.path().join("swap");
    let swap = swap.to_str().unwrap();
    // The disk "fills up" at 1 MiB: writes past it fail with EFBIG (with
    // SIGXFSZ ignored, which exec keeps).
    let mut command = Command::new(env!("CARGO_BIN_EXE_faultline"));
    command.args([
        "run",
        "--mem",
        "48M",
        "--host-mem",
        "8M",
        "--swap",
        swap,
        "--",
        "memtouch",
    ]);
    // SAFETY: between fork and exec the closure only makes two
    // async-signal-safe system calls on plain values.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 1 << 20,
                rlim_max: 1 << 20,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0
                || libc::signal(libc::SIGXFSZ, libc::SIG_IGN) == libc::SIG_ERR
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = command.output().expect("run faultline");
    assert_eq!(out.status.code(), Some(3), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("VM stopped"), "{err}");
    assert!(
        err.contains(swap) && err.contains("File too large"),
        "{err}"
    );
}

#[test]
fn bad_swap_and_host_memory_options_are_refused_at_boot() {
    let out = faultline(&[
        "run",
        "--mem",
        "48M",
        "--host-mem",
        "8M",
        "--swap",
        "/nonexistent/dir/swap",
        "--",
        "hello",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out)
            .contains("--swap /nonexistent/dir/swap: directory /nonexistent/dir does not exist"),
        "{}",
        stderr(&out)
    );
    let out = faultline(&["run", "--mem", "48M", "--host-mem", "1M", "--", "hello"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--host-mem 1M: host memory must be at least"),
        "{}",
        stderr(&out)
    );
    let out = faultline(&["run", "--swap-latency", "fast", "--", "hello"]);
    assert_eq!(out.status.code(), Some(2));
}

/// Every option is checked before the VM starts, with exit status 2.
#[test]
fn options_say_what_they_do() {
    let refused = |args: &[&str], message: &str| {
        let out = faultline(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(message), "{args:?}: {}", stderr(&out));
        assert!(out.stdout.is_empty(), "{args:?}: no VM ran");
    };
    // Guest memory: whole 2 MiB units, at least the kernel image's end.
    for mem in ["0", "2M", "3M", "4097K", "6M", "1T", "1024G"] {
        refused(
            &["run", "--mem", mem, "--", "hello"],
            "guest memory must be a multiple of 2 MiB between 8M (the kernel image ends at",
        );
    }
    let out = faultline(&["run", "--mem", "8M", "--", "hello"]);
    assert!(out.status.success(), "8M is the bundled kernel's minimum");
    // Host memory: the documented minimum is the kernel image's pages.
    // The figure moves with the kernel image, so it is read from the
    // refusal and then checked: exactly that much runs, 4K less does not.
    let out = faultline(&["run", "--mem", "64M", "--host-mem", "4M", "--", "hello"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let min_kib: u64 = stderr(&out)
        .split("host memory must be at least ")
        .nth(1)
        .and_then(|rest| rest.split('K').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no minimum in {}", stderr(&out)));
    assert!(min_kib > 4096, "more than the hv's 4M: {min_kib}K");
    let below = format!("{}K", min_kib - 4);
    refused(
        &["run", "--mem", "64M", "--host-mem", &below, "--", "hello"],
        &format!("host memory must be at least {min_kib}K"),
    );
    let exact = format!("{min_kib}K");
    let out = faultline(&["run", "--mem", "64M", "--host-mem", &exact, "--", "hello"]);
    assert!(out.status.success(), "{}", stderr(&out));
    refused(
        &["run", "--swap-bandwidth", "0", "--", "hello"],
        "must be more than zero",
    );
    refused(
        &[
            "run",
            "--mem",
            "48M",
            "--host-mem",
            "8M",
            "--swap",
            "/proc/version",
            "--",
            "hello",
        ],
        "--swap /proc/version: on a kernel pseudo file system",
    );
    refused(
        &[
            "run",
            "--mem",
            "48M",
            "--host-mem",
            "8M",
            "--swap",
            "/dev/null",
            "--",
            "hello",
        ],
        "--swap /dev/null: not a regular file or block device",
    );
    refused(
        &["run", "--swap", "/nonexistent-dir/x", "--", "hello"],
        "--host-mem",
    );
    refused(
        &["run", "--", "nosuch"],
        "unknown program `nosuch`; the bundled kernel has: hello bm",
    );
    refused(&["run", "--", ""], "unknown program ``");
    refused(
        &["bench", "apf", "--duration", "abc"],
        "`abc` is not a duration",
    );
    refused(
        &["bench", "apf", "--plot", "/nonexistent-dir/x.svg"],
        "--plot /nonexistent-dir/x.svg: directory /nonexistent-dir does not exist",
    );
    refused(
        &["bench", "apf", "--host-mem", "4M"],
        "host memory must be at least",
    );
    refused(
        &["bench", "apf", "--host-mem", "4M", "--list-runs"],
        "host memory must be at least",
    );
    refused(
        &["bench", "apf", "--run", "nosuch"],
        "--run nosuch: no such run",
    );
    refused(
        &["bench", "merge", "/nonexistent.json"],
        "cannot read /nonexistent.json",
    );
}

#[test]
fn bench_apf_prints_json_and_a_plot_and_repeats_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plot = dir.path().join("apf.svg");
    let plot = plot.to_str().unwrap();
    let args = [
        "bench",
        "apf",
        "--json",
        "--vcpus",
        "2",
        "--host-mem",
        "8M",
        "--duration",
        "0.01",
        "--fault-threads",
        "2",
        "--work-threads",
        "2",
        "--swap-device",
        "nvme",
        "--plot",
        plot,
    ];
    let a = faultline(&args);
    assert!(a.status.success(), "{}", stderr(&a));
    let v: serde_json::Value = serde_json::from_slice(&a.stdout).expect("json");
    for mode in ["off", "halt", "pv", "ideal"] {
        assert!(
            v["modes"][mode]["total"].as_u64().unwrap() > 0,
            "{mode}: {v}"
        );
    }
    assert!(v["ratios"]["pv_over_off"].as_f64().unwrap() > 0.0);
    assert_eq!(v["seed"]["pv_over_off"], 1.91);
    let svg = std::fs::read_to_string(plot).expect("plot written");
    assert!(svg.starts_with("<svg") && svg.contains("ideal"));
    std::fs::remove_file(plot).unwrap();

    // The same benchmark fanned out: one command line per run, each
    // printing its JSON result, merged into the same output and plot. (The
    // runs are separate processes, so this also checks determinism.)
    let mut list = args.to_vec();
    list.push("--list-runs");
    let lines = faultline(&list);
    assert!(lines.status.success(), "{}", stderr(&lines));
    let lines = stdout(&lines);
    let mut files = Vec::new();
    for (i, line) in lines.lines().enumerate() {
        let words = shell_words::split(line).expect("a shell command line");
        assert_eq!(words[0], env!("CARGO_BIN_EXE_faultline"));
        let out = Command::new(&words[0])
            .args(&words[1..])
            .output()
            .expect("run");
        assert!(out.status.success(), "{line}: {}", stderr(&out));
        let file = dir.path().join(format!("run{i}.json"));
        std::fs::write(&file, &out.stdout).unwrap();
        files.push(file.to_str().unwrap().to_string());
    }
    assert_eq!(files.len(), 4, "{lines}");
    let mut merge = vec!["bench", "merge", "--json", "--plot", plot];
    merge.extend(files.iter().map(String::as_str));
    let merged = faultline(&merge);
    assert!(merged.status.success(), "{}", stderr(&merged));
    assert_eq!(stdout(&merged), stdout(&a), "merge == direct run");
    assert!(std::fs::read_to_string(plot).unwrap().contains("ideal"));
    // A run missing or given twice is an error.
    let mut short = merge.clone();
    short.pop();
    let out = faultline(&short);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no result for run `ideal`"),
        "{}",
        stderr(&out)
    );
    short.push(&files[0]);
    let out = faultline(&short);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("two results for run `off`"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bench_apf_calc_prints_the_issue_json_shape() {
    let out = faultline(&[
        "bench",
        "apf-calc",
        "--json",
        "--host-mem",
        "8M",
        "--array",
        "8M",
        "--loops",
        "1",
        "--swap-device",
        "nvme",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    for case in ["with_calc", "without_calc"] {
        for key in ["off_s", "on_s", "change_pct"] {
            assert!(v[case][key].is_number(), "{case}.{key}: {v}");
        }
    }
    // Each comparison with seed 002 carries the cause the bench measured.
    let comparisons = v["comparisons"].as_array().expect("comparisons");
    assert_eq!(comparisons.len(), 2, "{v}");
    for c in comparisons {
        let cause = c["cause"].as_str().unwrap_or_default();
        assert!(
            cause.contains("stalled on page-ins") || cause.contains("per swap-in"),
            "{c}"
        );
    }
}

/// Issue 10's acceptance: page integrity under shadow paging with 4 vCPUs
/// swapping, under both async page fault protocols.
#[test]
fn shadow_paging_keeps_pages_intact_with_four_vcpus_and_both_protocols() {
    for protocol in ["x86", "event"] {
        let out = faultline(&[
            "run",
            "--mmu",
            "shadow",
            "--vcpus",
            "4",
            "--mem",
            "48M",
            "--host-mem",
            "8M",
            "--swap-device",
            "nvme",
            "--apf-protocol",
            protocol,
            "--stats",
            "json",
            "--",
            "pagetag",
            "-m",
            "24M",
            "-p",
            "2",
        ]);
        let text = stdout(&out);
        assert!(out.status.success(), "{protocol}: {text}\n{}", stderr(&out));
        assert!(text.contains(" 0 bad pages"), "{protocol}: {text}");
        let v = json_summary(&text);
        assert!(v["memory"]["pager"]["evictions"].as_u64().unwrap() > 1000);
        assert!(
            v["apf"]["not_present_sent"].as_u64().unwrap() > 100,
            "{}",
            v["apf"]
        );
        let shadow = &v["shadow"];
        assert!(
            shadow["guest_pf_injected"].as_u64().unwrap() > 0,
            "{shadow}"
        );
        assert!(shadow["syncs"].as_u64().unwrap() > 0, "{shadow}");
    }
}
