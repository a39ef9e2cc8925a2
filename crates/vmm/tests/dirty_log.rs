//! `bench dirty-log` at small scale: it runs, its JSON has the issue's
//! shape, the numbers add up, and the same command prints the same output.

mod common;

use common::{faultline, stderr, stdout};
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
    // ept and shadow x bitmap, manual, ring; fast PF on (the default).
    assert_eq!(results.len(), 6, "{json}");
    for r in results {
        assert!(matches!(r["mmu"].as_str(), Some("ept" | "shadow")), "{r}");
        assert!(
            matches!(r["mode"].as_str(), Some("bitmap" | "manual" | "ring")),
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

#[test]
fn table_names_every_row_and_bad_options_are_refused() {
    let table = bench(&SMALL);
    for row in ["ept    bitmap", "ept    ring", "shadow manual"] {
        assert!(table.contains(row), "{row} in\n{table}");
    }
    for bad in [
        &["-w", "101"][..],
        &["--modes", "pml"],
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
