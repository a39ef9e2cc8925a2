//! Host memory overcommit and async page faults on the bundled guest
//! kernel: data integrity under every wait mode and protocol, determinism,
//! and clean stops on swap errors.
#![cfg(bundled_kernel)]

use std::process::{Command, Output};

fn faultline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_faultline"))
        .args(args)
        .output()
        .expect("run faultline")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A small overcommitted VM: 48 MiB of guest memory on 8 MiB of host
/// memory, swapping to a fast device so the test stays quick.
const SMALL: [&str; 10] = [
    "--vcpus",
    "2",
    "--mem",
    "48M",
    "--host-mem",
    "8M",
    "--swap-device",
    "nvme",
    "--stats",
    "json",
];

fn json_summary(text: &str) -> serde_json::Value {
    let start = text.find("\n{").expect("json summary") + 1;
    serde_json::from_str(&text[start..]).expect("valid json")
}

fn pagetag(extra: &[&str]) -> (Output, String) {
    let mut args = vec!["run"];
    args.extend_from_slice(&SMALL);
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "pagetag", "-m", "16M", "-p", "3", "-t", "2"]);
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
    for mode in modes {
        let (out, text) = pagetag(mode);
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
        match mode {
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
    let args = ["--apf", "pv"];
    let (a, text_a) = pagetag(&args);
    let (b, text_b) = pagetag(&args);
    assert!(a.status.success() && b.status.success());
    assert_eq!(
        text_a, text_b,
        "same configuration, same output and counters"
    );
}

#[test]
fn a_full_swap_disk_stops_the_vm_with_a_clear_error() {
    let out = faultline(&[
        "run",
        "--mem",
        "48M",
        "--host-mem",
        "8M",
        "--swap",
        "/dev/full",
        "--",
        "memtouch",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("VM stopped"), "{err}");
    assert!(
        err.contains("/dev/full") && err.contains("No space left on device"),
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
        stderr(&out).contains("cannot create swap file /nonexistent/dir/swap"),
        "{}",
        stderr(&out)
    );
    let out = faultline(&["run", "--mem", "48M", "--host-mem", "1M", "--", "hello"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("too small"), "{}", stderr(&out));
    let out = faultline(&["run", "--swap-latency", "fast", "--", "hello"]);
    assert_eq!(out.status.code(), Some(2));
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
    let b = faultline(&args);
    assert_eq!(a.stdout, b.stdout, "same command, same numbers");
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
}
