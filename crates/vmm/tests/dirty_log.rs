//! `bench dirty-log` at small scale: it runs, its JSON has the issue's
//! shape, the numbers add up, and the same command prints the same output.

mod common;

use common::{faultline, stderr, stdout, SMALL_OVERCOMMIT, SMALL_PAGETAG};
use serde_json::Value;

fn bench(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("dirty-log.svg");
    let plot = plot.to_str().unwrap();
    let mut all = vec!["bench", "dirty-log", "--jobs", "2", "--plot", plot];
    all.extend_from_slice(args);
    let out = faultline(&all);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::metadata(dir.path().join("dirty-log.svg")).is_ok());
    stdout(&out)
}

const SMALL: [&str; 8] = ["-v", "3", "-b", "512K", "-i", "2", "--ring-size", "128"];

#[test]
fn small_run_has_the_issue_json_and_repeats_exactly() {
    let mut args = vec!["--json"];
    args.extend_from_slice(&SMALL);
    let first = bench(&args);
    assert_eq!(first, bench(&args), "same command, same output");
    let json: Value = serde_json::from_str(&first).expect("JSON");
    let results = json["results"].as_array().expect("results");
    // ept x bitmap, manual, ring, pml and shadow x the first three (PML
    // is EPT only); fast PF on (the default).
    assert_eq!(results.len(), 7, "{json}");
    let pml: Vec<&Value> = results.iter().filter(|r| r["mode"] == "pml").collect();
    assert_eq!(pml.len(), 1, "{json}");
    assert_eq!(pml[0]["mmu"], "ept", "{json}");
    for r in results {
        assert!(matches!(r["mmu"].as_str(), Some("ept" | "shadow")), "{r}");
        assert!(
            matches!(
                r["mode"].as_str(),
                Some("bitmap" | "manual" | "ring" | "pml")
            ),
            "{r}"
        );
        assert_eq!(r["fast_pf"], true, "{r}");
        let iterations = r["iterations"].as_array().expect("iterations");
        assert_eq!(iterations.len(), 2, "{r}");
        for i in iterations {
            for key in ["dirty_ms", "get_ms", "clear_ms"] {
                assert!(i[key].as_f64().is_some(), "{key} in {i}");
            }
            assert!(i["dirty_ms"].as_f64().unwrap() > 0.0, "{i}");
            // 3 vCPUs x 128 pages, all written each pass.
            assert!(i["pages"].as_u64().unwrap() >= 3 * 128, "{i}");
        }
        assert!(r["enable_ms"].as_f64().unwrap() > 0.0, "{r}");
        let pml_full = r["pml_full_exits"].as_u64().expect("pml_full_exits");
        if r["mode"] != "pml" {
            assert_eq!(pml_full, 0, "{r}");
        }
        if r["mode"] == "ring" {
            // 128 pages a pass into 128-entry rings (64 before soft-full).
            assert!(r["ring_full_exits"].as_u64().unwrap() > 0, "{r}");
        } else {
            assert!(
                r["iterations"][0]["get_ms"].as_f64().unwrap()
                    + r["iterations"][0]["clear_ms"].as_f64().unwrap()
                    > 0.0,
                "{r}"
            );
        }
    }
}

/// `--cost` reaches the bench's runs, and the slow path pays for
/// `mmu_lock`'s cache line moving between the vCPUs: without the
/// transfer (`line_transfer=0`) the vCPUs dirty their memory sooner.
#[test]
fn the_slow_path_pays_the_lock_lines_transfers_and_cost_overrides_apply() {
    let dirty_ms = |extra: &[&str]| -> Vec<f64> {
        let mut args = vec!["--json", "--fast-pf", "off", "--modes", "bitmap"];
        args.extend_from_slice(&SMALL);
        args.extend_from_slice(extra);
        let json: Value = serde_json::from_str(&bench(&args)).expect("JSON");
        json["results"]
            .as_array()
            .expect("results")
            .iter()
            .map(|r| r["iterations"][1]["dirty_ms"].as_f64().expect("dirty_ms"))
            .collect()
    };
    let cited = dirty_ms(&[]);
    let free = dirty_ms(&["--cost", "line_transfer=0"]);
    assert_eq!(cited.len(), 2, "ept and shadow");
    for (cited, free) in cited.iter().zip(&free) {
        assert!(
            free < cited,
            "line_transfer=0: {free} ms, cited: {cited} ms"
        );
    }
}

#[test]
fn table_names_every_row_and_bad_options_are_refused() {
    let table = bench(&SMALL);
    for row in [
        "ept    bitmap",
        "ept    ring",
        "ept    pml",
        "shadow manual",
    ] {
        assert!(table.contains(row), "{row} in\n{table}");
    }
    for bad in [
        &["-w", "101"][..],
        &["--modes", "pml", "--ept-ad", "off"],
        &["--modes", "pml", "--mmus", "shadow"],
        &["--fast-pf", "maybe"],
        &["-v", "64", "-b", "4G"],
    ] {
        let mut all = vec!["bench", "dirty-log"];
        all.extend_from_slice(bad);
        let out = faultline(&all);
        assert!(!out.status.success(), "{bad:?} accepted");
        // Our own checks name the command; clap's value parser names the
        // value it refused.
        assert!(
            stderr(&out).contains("faultline bench") || stderr(&out).contains("invalid value"),
            "{}",
            stderr(&out)
        );
    }
}

#[test]
fn pml_fills_its_logs_and_finds_every_page() {
    // 3 vCPUs x 1024 pages, all written each pass: the 512-entry logs
    // fill, and every page is collected each iteration.
    let out = bench(&[
        "--json", "-v", "3", "-b", "4M", "-i", "2", "--modes", "pml", "--mmus", "ept",
    ]);
    let json: Value = serde_json::from_str(&out).expect("JSON");
    let results = json["results"].as_array().expect("results");
    assert_eq!(results.len(), 1, "{json}");
    let r = &results[0];
    assert_eq!(r["mode"], "pml", "{r}");
    assert!(r["pml_full_exits"].as_u64().unwrap() >= 3 * 2, "{r}");
    for i in r["iterations"].as_array().unwrap() {
        assert!(i["pages"].as_u64().unwrap() >= 3 * 1024, "{i}");
    }
}

#[test]
fn run_logs_guest_ram_in_each_mode_and_refuses_pml_without_ept_ad() {
    for mode in ["bitmap", "manual", "ring", "pml"] {
        let out = faultline(&[
            "run",
            "--vcpus",
            "2",
            "--mem",
            "64M",
            "--stats",
            "json",
            "--dirty-log",
            mode,
            "--dirty-log-period",
            "5ms",
            "--",
            "memtouch",
            "-m",
            "16M",
        ]);
        assert!(out.status.success(), "{mode}: {}", stderr(&out));
        let json: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
        let d = &json["dirty_log"];
        assert_eq!(d["mode"], mode, "{d}");
        assert!(d["collections"].as_u64().unwrap() >= 1, "{d}");
        // memtouch writes its 16M (4096 pages) at least once.
        assert!(d["pages"].as_u64().unwrap() >= 4096, "{d}");
        let pml_full = d["pml_full_exits"].as_u64().unwrap();
        assert_eq!(pml_full > 0, mode == "pml", "{d}");
    }
    for refused in [&["--mmu", "shadow"][..], &["--ept-ad", "off"]] {
        let mut args = vec!["run", "--dirty-log", "pml"];
        args.extend_from_slice(refused);
        args.extend_from_slice(&["--", "hello"]);
        let out = faultline(&args);
        assert!(!out.status.success(), "{refused:?} accepted");
        assert!(stderr(&out).contains("PML needs"), "{}", stderr(&out));
    }
}

#[test]
fn pml_under_overcommit_keeps_every_write() {
    // Collections clear D bits while the pager evicts: the dirtiness must
    // stay with the frame (the rmap), or a page would be dropped for its
    // stale swap copy and pagetag would read an old tag.
    let mut args = vec![
        "run",
        "--dirty-log",
        "pml",
        "--dirty-log-period",
        "1ms",
        "--stats",
        "json",
    ];
    args.extend_from_slice(&SMALL_OVERCOMMIT);
    args.push("--");
    args.extend_from_slice(&SMALL_PAGETAG);
    let out = faultline(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert!(
        json["console"].as_str().unwrap().contains(", 0 bad pages"),
        "{json}"
    );
    assert!(
        json["dirty_log"]["collections"].as_u64().unwrap() > 100,
        "{json}"
    );
    assert!(
        json["memory"]["pager"]["evictions"].as_u64().unwrap() > 1000,
        "{json}"
    );
}

/// Each per-vCPU list of the bench's "mmu_lock per vCPU" lines: (the
/// line's configuration, the waits in ms, the wait spread in percent if
/// the bench computed one).
fn per_vcpu_waits(out: &str) -> Vec<(String, Vec<f64>, Option<f64>)> {
    out.lines()
        .filter(|l| l.starts_with("  ") && l.contains("; wait ms "))
        .map(|l| {
            let (name, rest) = l.trim().split_once(':').expect("name");
            let waits = rest.split("; wait ms ").nth(1).expect("waits");
            let (list, spread) = waits.split_once(" (").expect("spread");
            let values = list.split(' ').map(|v| v.parse().expect("ms")).collect();
            let spread = spread
                .strip_prefix("spread ")
                .and_then(|s| s.strip_suffix(" %)"))
                .map(|s| s.parse().expect("percent"));
            (name.to_string(), values, spread)
        })
        .collect()
}

/// Seed 001's dirty-log case at the issue's size: no logged pass meets
/// the VMM's collection (`dirty_log_perf_test` starts an iteration once
/// its get and clear returned), and the waits of the slow path are the
/// same for every vCPU within 10 % of their mean wherever they are long
/// enough to compare (over a microsecond on average).
#[test]
fn at_six_vcpus_the_passes_miss_the_collection_and_waits_are_symmetric() {
    let out = bench(&[
        "-v",
        "6",
        "-b",
        "170M",
        "--fast-pf",
        "on,off",
        "--modes",
        "bitmap,ring",
    ]);
    let lines = per_vcpu_waits(&out);
    assert_eq!(lines.len(), 8, "{out}");
    let mut compared = 0;
    for (name, waits, spread) in &lines {
        if name.contains("bitmap") {
            // Nothing but the vCPUs' own slow paths, which this workload
            // staggers: before, each vCPU waited for the collection's
            // 2.2 ms hold in some passes.
            assert!(waits.iter().all(|&w| w < 0.01), "{name}: {waits:?}\n{out}");
        }
        if let Some(spread) = spread {
            assert!(*spread <= 10.0, "{name}: spread {spread} %\n{out}");
            compared += 1;
        }
    }
    // The ring resets make the vCPUs wait with fast PF off.
    assert!(compared >= 2, "{out}");
}
