//! Seed 004's own baseline, KVM's trunk of January 2007
//! (`--shadow-unsync off` with `--shadow-prev-roots 0`, and `bench ctxsw
//! --kvm-2007`): no page goes unsync, every write to a shadowed guest
//! table is emulated, a CR3 load finds its root in the shadow page hash.
#![cfg(bundled_kernel)]

mod common;
use common::{faultline, stderr, stdout};
use serde_json::Value;

/// `run --mmu shadow --shadow-prev-roots 0 --stats json` of `ctxsw -n 200`
/// with `extra` options.
fn ctxsw_run(extra: &[&str]) -> Value {
    let mut args = vec![
        "run",
        "--mmu",
        "shadow",
        "--shadow-prev-roots",
        "0",
        "--stats",
        "json",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "ctxsw", "-n", "200"]);
    let out = faultline(&args);
    assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
    serde_json::from_str(&stdout(&out)).expect("one JSON document")
}

fn cr3_exits(v: &Value) -> u64 {
    v["vcpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["cr3"]["cr3_load_exits"].as_u64().unwrap())
        .sum()
}

#[test]
fn without_unsync_every_page_table_write_is_emulated_and_roots_come_from_the_hash() {
    let now = ctxsw_run(&[]);
    let trunk = ctxsw_run(&["--shadow-unsync", "off"]);
    let (s_now, s_trunk) = (&now["shadow"], &trunk["shadow"]);
    // Today's shadow MMU lets written leaf tables go unsync; 2007's never.
    assert!(s_now["unsynced"].as_u64().unwrap() > 0, "{s_now}");
    assert_eq!(s_trunk["unsynced"], 0, "{s_trunk}");
    assert_eq!(s_trunk["syncs"], 0, "{s_trunk}");
    // The writes that unsynced pages took are emulated instead.
    assert!(
        s_trunk["wp_emulated"].as_u64().unwrap() > s_now["wp_emulated"].as_u64().unwrap(),
        "{s_now} {s_trunk}"
    );
    // Every CR3 load exits and looks its root up: built once per address
    // space, found in the hash on every other load.
    let exits = cr3_exits(&trunk);
    assert!(exits >= 400, "{exits}");
    let (built, reused) = (
        s_trunk["roots_built"].as_u64().unwrap(),
        s_trunk["roots_reused"].as_u64().unwrap(),
    );
    assert!(built <= 8, "{built} roots built for {exits} CR3 loads");
    assert!(built + reused >= exits, "{built} + {reused} < {exits}");
    assert_eq!(s_trunk["prev_root_hits"], 0, "{s_trunk}");
}

/// The result row of `config` in a bench's JSON.
fn row<'a>(v: &'a Value, config: &str) -> &'a Value {
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["config"] == config)
        .unwrap_or_else(|| panic!("no {config} row: {v}"))
}

/// The comparison `key` in a bench's JSON.
fn comparison<'a>(v: &'a Value, key: &str) -> &'a Value {
    v["comparisons"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["key"] == key)
        .unwrap_or_else(|| panic!("no {key}: {v}"))
}

/// `bench ctxsw --rounds 400 --json` with `extra` options: raw and parsed.
fn bench_ctxsw(extra: &[&str]) -> (String, Value) {
    let mut args = vec!["bench", "ctxsw", "--rounds", "400", "--json"];
    args.extend_from_slice(extra);
    let out = faultline(&args);
    assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
    let text = stdout(&out);
    let v = serde_json::from_str(&text).expect("one JSON document");
    (text, v)
}

#[test]
fn bench_ctxsw_kvm_2007_adds_the_like_for_like_pair_and_leaves_the_rest_alone() {
    let (plain_text, plain) = bench_ctxsw(&[]);
    let (_, with) = bench_ctxsw(&["--kvm-2007"]);
    let names = |v: &Value| -> Vec<String> {
        v["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["config"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(
        !plain_text.contains("trunk-2007") && !plain_text.contains("trunk2007"),
        "the default has no 2007 row"
    );
    let mut expected = names(&plain);
    expected.extend([
        "shadow-trunk-2007".to_string(),
        "shadow-trunk-2007-cr3-cache-4".to_string(),
    ]);
    assert_eq!(names(&with), expected);
    // The rows both run are the same runs.
    for (a, b) in plain["results"]
        .as_array()
        .unwrap()
        .iter()
        .zip(with["results"].as_array().unwrap())
    {
        assert_eq!(a, b);
    }
    let (trunk, cache) = (
        row(&with, "shadow-trunk-2007"),
        row(&with, "shadow-trunk-2007-cr3-cache-4"),
    );
    // The cache removes the CR3-load exits the trunk takes on every switch.
    assert!(trunk["cr3_exits"].as_u64().unwrap() >= 800, "{trunk}");
    assert!(cache["cr3_exits"].as_u64().unwrap() <= 8, "{cache}");
    let ratio = trunk["switch_us"].as_f64().unwrap() / cache["switch_us"].as_f64().unwrap();
    assert!(
        (with["ratios"]["trunk2007_vs_trunk2007_cache4"]
            .as_f64()
            .unwrap()
            - ratio)
            .abs()
            < 1e-9,
        "{with}"
    );
    let c = comparison(&with, "004.ctxsw.trunk2007_over_trunk2007_cache4");
    assert!(
        (c["faultline"].as_f64().unwrap() - ratio).abs() < 1e-9,
        "{c}"
    );
    assert!(c["status"] == "met" || c["status"] == "not_met", "{c}");
}

#[test]
fn bench_hackbench_kvm_2007_adds_the_2007_rows_and_their_comparison() {
    let out = faultline(&[
        "bench",
        "hackbench",
        "--loops",
        "5",
        "--groups",
        "1",
        "--kvm-2007",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).expect("one JSON document");
    let configs: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["config"].as_str().unwrap())
        .collect();
    assert!(configs.ends_with(&["shadow-trunk-2007", "shadow-trunk-2007-cr3-cache-4"]));
    let seconds = |config: &str| row(&v, config)["seconds"].as_f64().unwrap();
    let ratio = seconds("shadow-trunk-2007") / seconds("shadow-trunk-2007-cr3-cache-4");
    let g1 = comparison(&v, "004.hackbench.g1_trunk2007_over_trunk2007_cache4");
    assert!(
        (g1["faultline"].as_f64().unwrap() - ratio).abs() < 1e-9,
        "{g1}"
    );
    // 5 groups were not run: not comparable, with the reason.
    let g5 = comparison(&v, "004.hackbench.g5_trunk2007_over_trunk2007_cache4");
    assert_eq!(g5["status"], "not_comparable", "{g5}");
}
