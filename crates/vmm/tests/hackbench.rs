//! Issue 13's hackbench and native row on the bundled guest kernel:
//! hackbench finishes when its pipes fill and senders exit while
//! receivers still wait (the guest's blocking path once hung there),
//! `--mmu none` runs the programs as EPT does and refuses what it cannot
//! do, and `bench hackbench` has its rows, keys and repeatable numbers.
#![cfg(bundled_kernel)]

mod common;
use common::{faultline, stderr, stdout};

fn report<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// 20 senders fill each receiver's 4 KiB pipe (40 messages) many times
/// over and exit before their receivers are done. Before the fix the
/// kernel closed an exiting process's pipes under its run-queue lock and
/// the wakeup of a receiver on the same CPU spun on that lock for ever:
/// this run then reached its 1 s time limit (the fixed kernel needs
/// under 0.1 s of virtual time).
#[test]
fn hackbench_finishes_when_pipes_fill_and_senders_exit_first() {
    for mmu in ["ept", "shadow"] {
        let out = faultline(&[
            "run",
            "--mmu",
            mmu,
            "--vcpus",
            "2",
            "--mem",
            "64M",
            "--time-limit",
            "1s",
            "--",
            "hackbench",
            "1",
        ]);
        let text = stdout(&out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{mmu}: {text}\n{}",
            stderr(&out)
        );
        assert!(text.contains("Running with 1*40 (== 40) tasks"), "{text}");
        assert_eq!(report(&text, "hackbench_failed"), Some("0"), "{text}");
        assert_eq!(report(&text, "hackbench_messages"), Some("40000"), "{text}");
    }
}

#[test]
fn hackbench_refuses_bad_arguments() {
    for args in [
        &["hackbench", "0"][..],
        &["hackbench", "7"],
        &["hackbench", "-l"],
    ] {
        let mut all = vec!["run", "--mem", "64M", "--"];
        all.extend_from_slice(args);
        let out = faultline(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stdout(&out));
        assert!(
            stdout(&out).contains("usage: hackbench"),
            "{}",
            stdout(&out)
        );
    }
}

/// Without memory virtualisation every program gives what it gives under
/// EPT, with no EPT fault and no CR3-load exit.
#[test]
fn native_runs_the_programs_as_ept_does() {
    for program in [
        &["hello", "a", "b"][..],
        &["memtouch", "-m", "8M", "-p", "2"],
        &["ctxsw", "-n", "200"],
        &["ctxsw", "-x", "-n", "200"],
        &["fault", "ud"],
        &["pagetag", "-m", "2M", "-p", "2", "-P", "3"],
        &["touchloop", "-m", "2M", "-p", "2"],
        &["hackbench", "1", "-l", "5"],
    ] {
        let run = |mmu: &str| {
            let mut args = vec!["run", "--mmu", mmu, "--vcpus", "2", "--mem", "64M"];
            args.push("--");
            args.extend_from_slice(program);
            faultline(&args)
        };
        let ept = run("ept");
        let native = run("none");
        let text = stdout(&native);
        assert_eq!(
            native.status.code(),
            ept.status.code(),
            "{program:?}: {text}\n{}",
            stderr(&native)
        );
        assert!(text.contains("mmu:          none"), "{text}");
        assert!(text.contains("EPT faults:   0 "), "{program:?}: {text}");
        let stable = |t: String| {
            t.lines()
                .filter(|l| {
                    (l.starts_with("memtouch:")
                        || l.starts_with("pagetag:")
                        || l.starts_with("touchloop:")
                        || l.starts_with("Running with")
                        || l.starts_with("hello"))
                        && !l.contains("ns")
                })
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(stable(text), stable(stdout(&ept)), "{program:?}");
    }
}

#[test]
fn native_refuses_what_needs_memory_virtualisation() {
    for (args, why) in [
        (&["--host-mem", "16M"][..], "overcommit"),
        (&["--cr3-cache", "on"], "CR3 cache"),
        (&["--memslot-period", "1ms"], "memslots cannot change"),
    ] {
        let mut all = vec!["run", "--mmu", "none", "--mem", "64M"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--", "hello"]);
        let out = faultline(&all);
        assert!(!out.status.success(), "{args:?}");
        let err = stderr(&out);
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// `bench hackbench`, small: every row for each group count, the issue's
/// JSON keys, exits only under shadow, more cache hits with 16 targets
/// than with 4 once there are more address spaces than targets, and the
/// same numbers again.
#[test]
fn bench_hackbench_rows_keys_and_determinism() {
    let dir = std::env::temp_dir().join(format!("faultline-hackbench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plot = dir.join("hackbench.svg");
    let args = [
        "bench",
        "hackbench",
        "--groups",
        "1,2",
        "--loops",
        "5",
        "--json",
        "--plot",
        plot.to_str().unwrap(),
    ];
    let out = faultline(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 12, "{v}");
    let rows = [
        "native",
        "ept",
        "shadow",
        "shadow-prev-roots",
        "shadow-cr3-cache-4",
        "shadow-cr3-cache-16",
    ];
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["config"], rows[i % 6], "{r}");
        assert_eq!(r["groups"], if i < 6 { 1 } else { 2 }, "{r}");
        for key in ["seconds", "cr3_exits", "roots_built", "tlb_misses"] {
            assert!(r[key].is_number(), "{key}: {r}");
        }
        assert!(r["seconds"].as_f64().unwrap() > 0.0, "{r}");
    }
    let row = |name: &str, groups: u64| {
        results
            .iter()
            .find(|r| r["config"] == name && r["groups"] == groups)
            .unwrap()
    };
    for groups in [1, 2] {
        assert_eq!(row("native", groups)["cr3_exits"], 0);
        assert_eq!(row("ept", groups)["cr3_exits"], 0);
        assert!(row("shadow", groups)["cr3_exits"].as_u64().unwrap() > 100);
        let hits = |name: &str| row(name, groups)["cr3_cache_hits"].as_u64().unwrap();
        assert!(
            hits("shadow-cr3-cache-16") > hits("shadow-cr3-cache-4"),
            "{v}"
        );
    }
    assert!(std::fs::metadata(&plot).unwrap().len() > 0);
    let again = faultline(&args);
    assert_eq!(again.stdout, out.stdout, "the same numbers again");
    let _ = std::fs::remove_dir_all(&dir);
}
