//! `bench memslot` and `run --memslot-period`: zap-all by generation
//! (seed 003) at small scale.

mod common;

use common::{faultline, stderr, stdout};
use serde_json::Value;

fn bench_json(args: &[&str]) -> Vec<Value> {
    let json = bench_json_all(args);
    json["results"].as_array().expect("results").clone()
}

/// The whole `--json` output.
fn bench_json_all(args: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("memslot.svg");
    let plot = plot.to_str().unwrap();
    let mut all = vec!["bench", "memslot", "--json", "--jobs", "2", "--plot", plot];
    all.extend_from_slice(args);
    let out = faultline(&all);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    let object = json.as_object().expect("an object");
    assert_eq!(
        object.keys().collect::<Vec<_>>(),
        ["comparisons", "results"],
        "{json}"
    );
    // The comparisons with seed 003 per MMU and size, computed.
    for c in json["comparisons"].as_array().expect("comparisons") {
        assert!(
            c["key"] == "003.memslot.slow_over_fast" || c["key"] == "003.memslot.slow_over_seed",
            "{c}"
        );
        assert!(c["faultline"].as_f64().is_some_and(|v| v > 0.0), "{c}");
    }
    json
}

#[test]
fn the_seeds_v2_zap_runs_beside_slow_and_fast_and_is_compared_like_for_like() {
    let json = bench_json_all(&[
        "--zaps",
        "slow,fast,seed",
        "--mem",
        "64M",
        "--vcpus",
        "2",
        "--ops",
        "2",
    ]);
    let results = json["results"].as_array().unwrap();
    assert_eq!(results.len(), 6, "{results:?}");
    let mem = 64u64 << 20;
    for mmu in ["ept", "shadow"] {
        let get = |zap, key: &str| find(results, mmu, zap, mem)[key].as_f64().unwrap();
        // The same pages go; one hold, no lock break.
        assert_eq!(get("seed", "pages_zapped"), get("slow", "pages_zapped"));
        assert_eq!(get("seed", "lock_breaks"), 0.0);
        // No per-entry teardown: shorter than slow, and the guest still
        // refaults everything after it.
        assert!(get("seed", "op_ms") < get("slow", "op_ms"), "{mmu}");
        assert!(get("seed", "refault_ms") > 0.0, "{mmu}");
        let c = json["comparisons"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| {
                c["key"] == "003.memslot.slow_over_seed"
                    && c["setup"].as_str().unwrap().ends_with(mmu)
            })
            .unwrap_or_else(|| panic!("no slow/seed comparison for {mmu}: {json}"));
        let ratio = get("slow", "op_ms") / get("seed", "op_ms");
        assert!(
            (c["faultline"].as_f64().unwrap() - ratio).abs() < 1e-9,
            "{c}"
        );
        assert!(c["status"] == "met" || c["status"] == "not_met", "{c}");
    }
}

fn find<'a>(results: &'a [Value], mmu: &str, zap: &str, mem: u64) -> &'a Value {
    results
        .iter()
        .find(|r| r["mmu"] == mmu && r["zap"] == zap && r["mem_bytes"] == mem)
        .unwrap_or_else(|| panic!("no {mmu} {zap} {mem} in {results:?}"))
}

#[test]
fn fast_zap_stalls_vcpus_for_one_batch_at_any_size_slow_for_the_whole_zap() {
    let results = bench_json(&["--sweep-mem", "64M,128M", "--vcpus", "2", "--ops", "3"]);
    assert_eq!(results.len(), 8, "{results:?}");
    let keys = [
        "mmu",
        "zap",
        "mem_bytes",
        "op_ms",
        "max_vcpu_stall_us",
        "pages_zapped",
        "lock_breaks",
        "refault_ms",
    ];
    for r in &results {
        // serde_json's map sorts keys when parsing: compare as sets.
        let mut have: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        have.sort_unstable();
        let mut want = keys.to_vec();
        want.sort_unstable();
        assert_eq!(have, want, "{r}");
        assert!(
            r["refault_ms"].as_f64().unwrap() > 0.0,
            "the guest refaulted: {r}"
        );
    }
    let (small, large) = (64u64 << 20, 128u64 << 20);
    for mmu in ["ept", "shadow"] {
        let stall = |zap, mem| {
            find(&results, mmu, zap, mem)["max_vcpu_stall_us"]
                .as_f64()
                .unwrap()
        };
        let field = |zap, mem, key: &str| find(&results, mmu, zap, mem)[key].clone();
        for mem in [small, large] {
            // The same pages go, one hold against batches of ten.
            assert_eq!(
                field("slow", mem, "pages_zapped"),
                field("fast", mem, "pages_zapped")
            );
            assert_eq!(field("slow", mem, "lock_breaks"), 0);
            // One break per batch of ten after the first. Both figures are
            // means over the ops, truncated, and the ops may zap different
            // counts, so the relation holds to within one (zap.rs's unit
            // tests check it exactly for a single zap).
            let pages = field("fast", mem, "pages_zapped").as_u64().unwrap();
            let breaks = field("fast", mem, "lock_breaks").as_u64().unwrap();
            let expected = pages.div_ceil(hv::BATCH_ZAP_PAGES as u64) - 1;
            assert!(
                breaks.abs_diff(expected) <= 1,
                "{mmu} {mem}: {breaks} lock breaks for {pages} pages"
            );
            assert!(
                stall("fast", mem) * 2.0 < stall("slow", mem),
                "{mmu}: fast {} us, slow {} us at {mem}",
                stall("fast", mem),
                stall("slow", mem)
            );
            assert!(stall("fast", mem) <= 100.0, "{mmu}: {}", stall("fast", mem));
        }
        // Fast stays flat as memory doubles; slow grows with it.
        let flat = stall("fast", large) / stall("fast", small);
        assert!(
            (1.0 / 1.5..=1.5).contains(&flat),
            "{mmu}: fast stall ratio {flat}"
        );
        assert!(stall("slow", large) > 1.5 * stall("slow", small), "{mmu}");
    }
}

#[test]
fn the_same_command_gives_the_same_numbers() {
    let args = ["--mem", "64M", "--vcpus", "2", "--ops", "2"];
    assert_eq!(bench_json(&args), bench_json(&args));
}

#[test]
fn run_changes_a_memslot_periodically_and_the_guest_keeps_its_data() {
    for zap in ["slow", "fast", "seed"] {
        let out = faultline(&[
            "run",
            "--vcpus",
            "2",
            "--mem",
            "64M",
            "--zap",
            zap,
            "--memslot-period",
            "1ms",
            "--stats",
            "json",
            "--",
            "memtouch",
            "-m",
            "32M",
            "-p",
            "2",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let json: Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert!(
            json["console"].as_str().unwrap().contains(" 0 errors"),
            "{json}"
        );
        let memslot = &json["memslot"];
        assert_eq!(memslot["zap"], zap);
        let ops = memslot["ops"].as_array().unwrap();
        assert!(ops.len() >= 2, "{memslot}");
        assert!(memslot["root_reloads"].as_u64().unwrap() >= 2);
        for op in ops {
            assert!(op["pages_zapped"].as_u64().unwrap() > 0, "{op}");
        }
    }
}

#[test]
fn the_seeds_v2_zap_keeps_dropped_dirty_bits_so_swapping_loses_no_write() {
    // Host memory a quarter of the array: pages are evicted and read back
    // while the seed zap drops every spte wholesale; a dirty bit it lost
    // would let the pager keep a stale swap copy.
    let out = faultline(&[
        "run",
        "--vcpus",
        "2",
        "--mem",
        "64M",
        "--host-mem",
        "16M",
        "--zap",
        "seed",
        "--memslot-period",
        "5ms",
        "--stats",
        "json",
        "--",
        "memtouch",
        "-m",
        "32M",
        "-p",
        "3",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(
        json["console"].as_str().unwrap().contains(" 0 errors"),
        "{json}"
    );
    assert_eq!(json["memslot"]["zap"], "seed");
    assert!(json["memslot"]["ops"].as_array().unwrap().len() >= 2);
    let pager = &json["memory"]["pager"];
    assert!(pager["swap_ins"].as_u64().unwrap() > 1000, "{pager}");
    assert!(pager["swap_outs"].as_u64().unwrap() > 1000, "{pager}");
}
