//! The fast page fault and access tracking on the bundled guest kernel:
//! with EPT A/D flags off the pager ages pages by access-tracking their
//! sptes and the fast path restores them; every page keeps its data, the
//! eviction quality holds, and the runs repeat exactly.
#![cfg(bundled_kernel)]

mod common;
use common::{faultline, stderr, stdout, SMALL_OVERCOMMIT, SMALL_PAGETAG};

/// `pagetag` overcommitted (48 MiB of guest memory on 8 MiB of host
/// memory) with the given switches on `vcpus` vCPUs; its JSON summary.
fn pagetag(ept_ad: &str, fast_pf: &str, vcpus: &str) -> serde_json::Value {
    let mut args = vec![
        "run",
        "--stats",
        "json",
        "--ept-ad",
        ept_ad,
        "--fast-pf",
        fast_pf,
    ];
    args.extend_from_slice(&SMALL_OVERCOMMIT);
    let at = args.iter().position(|&a| a == "--vcpus").expect("--vcpus") + 1;
    args[at] = vcpus;
    args.push("--");
    args.extend_from_slice(&SMALL_PAGETAG);
    let out = faultline(&args);
    let text = stdout(&out);
    let case = (ept_ad, fast_pf);
    assert!(out.status.success(), "{case:?}: {text}\n{}", stderr(&out));
    assert!(text.contains(" 0 bad pages"), "{case:?}: {text}");
    serde_json::from_str(&text).expect("stdout is one JSON document")
}

fn swap_ins(v: &serde_json::Value) -> f64 {
    count(v, &["memory", "pager", "swap_ins"]) as f64
}

fn count(v: &serde_json::Value, path: &[&str]) -> u64 {
    path.iter()
        .fold(v, |v, key| &v[key])
        .as_u64()
        .unwrap_or_else(|| panic!("no {path:?} in {v}"))
}

#[test]
fn access_tracking_keeps_pages_and_eviction_quality_with_the_fast_path_on_and_off() {
    let with_ad = pagetag("on", "on", "2");
    let tracked_fast = pagetag("off", "on", "2");
    let tracked_slow = pagetag("off", "off", "2");
    // With A/D flags no fault is on a present spte (nothing write-protects
    // here), so the fast path never fixes anything.
    assert_eq!(count(&with_ad, &["fast_pf", "fixed"]), 0);
    // Aged pages come back through the fast path when it is on, through
    // the slow path (more EPT faults under mmu_lock) when it is off.
    let fixed = count(&tracked_fast, &["fast_pf", "fixed"]);
    assert!(fixed > 1000, "{}", tracked_fast["fast_pf"]);
    assert_eq!(count(&tracked_slow, &["fast_pf", "fixed"]), 0);
    assert!(count(&tracked_slow, &["ept_faults"]) > count(&tracked_fast, &["ept_faults"]));
    // The pager picks as well without accessed bits: swap-ins within 5 %
    // of the A/D run's. On one vCPU, where only the pager's picks differ:
    // on two, the threads' sweeps interleave at the exits' cost, and that
    // alone moves this cyclic, overcommitted sweep's swap-ins by up to
    // 14 % (docs/mmu.md, "Access tracking").
    let one_ad = pagetag("on", "on", "1");
    for fast_pf in ["on", "off"] {
        let tracked = pagetag("off", fast_pf, "1");
        let ratio = swap_ins(&tracked) / swap_ins(&one_ad);
        assert!(
            (0.95..=1.05).contains(&ratio),
            "fast PF {fast_pf}: swap-ins {} vs {} with A/D",
            swap_ins(&tracked),
            swap_ins(&one_ad)
        );
    }
    // The same command, the same numbers.
    assert_eq!(pagetag("off", "on", "2"), tracked_fast);
}

/// `bench fastpf` at a small scale: it runs, its JSON has the issue's
/// shape, the fast path fixed the EPT runs' write faults without waiting
/// for mmu_lock, and the same command prints the same numbers.
#[test]
fn bench_fastpf_runs_prints_the_json_shape_and_repeats() {
    let args = [
        "bench",
        "fastpf",
        "--json",
        "--frames",
        "12",
        "--harvest-hz",
        "600",
        "--jobs",
        "1",
        "--plot",
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    let plot = dir.path().join("fastpf.svg");
    let mut all: Vec<&str> = args.to_vec();
    all.push(plot.to_str().unwrap());
    let out = faultline(&all);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text, stdout(&faultline(&all)), "same command, same output");
    assert!(plot.exists(), "the plot was written");
    let json: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let results = json["results"].as_array().expect("results");
    assert_eq!(results.len(), 4, "{json}");
    for r in results {
        assert!(matches!(r["mmu"].as_str(), Some("ept" | "shadow")), "{r}");
        assert!(r["fast_pf"].is_boolean(), "{r}");
        for key in ["writes_per_s", "write_fault_cycles", "mmu_lock_wait_cycles"] {
            assert!(r[key].as_f64().is_some_and(|v| v >= 0.0), "{key} in {r}");
        }
        assert!(r["harvests"].as_u64().unwrap() > 0, "{r}");
        let fast = r["fast_fixes"].as_u64().unwrap();
        if r["fast_pf"] == false {
            assert_eq!(fast, 0, "{r}");
        } else if r["mmu"] == "ept" {
            assert!(fast > 0, "{r}");
        }
        // Shadow with fast PF on: fbwrite's buffer is in 4 KiB user pages
        // (indirect shadow pages), so few faults are fixed fast unless the
        // seed's scheme is on (below).
    }
}

/// Shadow paging with `--fast-pf-indirect seed`: the frame buffer's write
/// faults, on leaves of indirect shadow pages, are fixed by the seed's
/// scheme without mmu_lock; with the default (`slow`, modern KVM) most go
/// to the slow path.
#[test]
fn bench_fastpf_fixes_indirect_leaves_only_with_the_seed_scheme() {
    let fixes = |indirect: &str| {
        let out = faultline(&[
            "bench",
            "fastpf",
            "--json",
            "--mmus",
            "shadow",
            "--fast-pf",
            "on",
            "--fast-pf-indirect",
            indirect,
            "--frames",
            "12",
            "--harvest-hz",
            "600",
            "--jobs",
            "1",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let json: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
        let on = json["results"]
            .as_array()
            .expect("results")
            .iter()
            .find(|r| r["fast_pf"] == true)
            .cloned()
            .expect("a fast-PF-on row");
        (
            on["fast_fixes"].as_u64().unwrap(),
            on["mmu_lock_acquisitions"].as_u64().unwrap(),
        )
    };
    let (slow, slow_holds) = fixes("slow");
    let (seed, seed_holds) = fixes("seed");
    assert!(seed > 10 * slow.max(1), "seed {seed} vs slow {slow}");
    // The fast path takes no lock: each further fast fix is a hold of
    // mmu_lock fewer (the same frames write the same pages either way).
    assert!(
        seed_holds + (seed - slow) * 9 / 10 <= slow_holds,
        "mmu_lock holds: seed {seed_holds} ({seed} fast fixes) vs slow {slow_holds} ({slow})"
    );
}
