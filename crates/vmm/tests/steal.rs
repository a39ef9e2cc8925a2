//! Preempted vCPUs (issue 13) on the bundled guest kernel: `--host-cpus`
//! below `--vcpus` makes steal time, which the guest sees through KVM's
//! steal-time area as the hv counts it; with PV TLB flush no flush IPI
//! goes to a preempted vCPU; `bench tlbflush` repeats exactly.
#![cfg(bundled_kernel)]

mod common;
use common::{faultline, stderr, stdout};

fn json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["run", "--stats", "json"];
    all.extend_from_slice(args);
    let out = faultline(&all);
    assert!(
        out.status.success(),
        "{args:?}: {}\n{}",
        stdout(&out),
        stderr(&out)
    );
    serde_json::from_str(&stdout(&out)).expect("one JSON document")
}

/// `key` of the report line that starts with `pv_cpu=cpu`.
fn cpu_report(v: &serde_json::Value, cpu: usize, key: &str) -> u64 {
    let prefix = format!("pv_cpu={cpu} ");
    v["reports"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["line"].as_str())
        .find(|line| line.starts_with(&prefix))
        .and_then(|line| {
            line.split(' ')
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        })
        .unwrap_or_else(|| panic!("no {key} for cpu {cpu}: {}", v["reports"]))
}

fn report<'a>(v: &'a serde_json::Value, key: &str) -> Option<&'a str> {
    v["reports"].as_array()?.iter().find_map(|r| {
        let line = r["line"].as_str()?;
        line.split(' ')
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
    })
}

/// The host slice the runs use: 3 ms.
const SLICE_NS: u64 = 3_000_000;

#[test]
fn the_guest_sees_the_steal_the_hv_counts() {
    let v = json(&[
        "--vcpus",
        "4",
        "--host-cpus",
        "2",
        "--mem",
        "64M",
        "--",
        "tlbflush",
        "-r",
        "20",
    ]);
    assert_eq!(v["host_cpus"], 2);
    assert_eq!(report(&v, "pv_steal_time"), Some("on"));
    let mut total = 0;
    for (cpu, vcpu) in v["vcpus"].as_array().unwrap().iter().enumerate() {
        let hv_ns = vcpu["steal"]["steal_ns"].as_u64().unwrap();
        let guest_ns = cpu_report(&v, cpu, "steal_ns");
        // The guest read its areas at shutdown: steal after a vCPU's last
        // schedule-in is not in its area yet (at most the slices it then
        // waited).
        assert!(guest_ns <= hv_ns, "cpu {cpu}: guest {guest_ns} hv {hv_ns}");
        assert!(
            hv_ns - guest_ns <= 2 * SLICE_NS,
            "cpu {cpu}: guest {guest_ns} hv {hv_ns}"
        );
        total += guest_ns;
    }
    assert!(total > 0, "4 busy vCPUs on 2 host CPUs wait");

    // One host CPU each: nobody waits.
    let dedicated = json(&["--vcpus", "4", "--mem", "64M", "--", "tlbflush", "-r", "5"]);
    assert!(dedicated["host_cpus"].is_null());
    for (cpu, vcpu) in dedicated["vcpus"].as_array().unwrap().iter().enumerate() {
        assert_eq!(vcpu["steal"]["steal_ns"], 0);
        assert_eq!(cpu_report(&dedicated, cpu, "steal_ns"), 0);
    }
}

#[test]
fn pv_tlb_flush_sends_no_ipi_to_a_preempted_vcpu_and_the_options_turn_features_off() {
    let base = [
        "--vcpus",
        "4",
        "--host-cpus",
        "2",
        "--mem",
        "64M",
        "--",
        "tlbflush",
        "-r",
        "10",
    ];
    let sum =
        |v: &serde_json::Value, key: &str| -> u64 { (0..4).map(|c| cpu_report(v, c, key)).sum() };
    let pv = json(&base);
    assert_eq!(report(&pv, "pv_tlb_flush"), Some("on"));
    assert_eq!(sum(&pv, "tlb_ipis_preempted"), 0);
    assert!(sum(&pv, "tlb_pv_skipped") > 0, "some target was preempted");
    let hv_flushes: u64 = pv["vcpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["steal"]["pv_tlb_flushes"].as_u64().unwrap())
        .sum();
    assert!(hv_flushes > 0, "the hv flushed the skipped vCPUs");
    assert_eq!(report(&pv, "tlbflush_stale_remote"), Some("0"));

    let ipi = json(
        &[
            &[
                "--option",
                "no-pv-tlb-flush",
                "--option",
                "no-pv-sched-yield",
            ][..],
            &base,
        ]
        .concat(),
    );
    assert_eq!(report(&ipi, "pv_tlb_flush"), Some("off"));
    assert_eq!(report(&ipi, "pv_sched_yield"), Some("off"));
    assert!(sum(&ipi, "tlb_ipis_preempted") > 0);
    assert_eq!(sum(&ipi, "tlb_pv_skipped"), 0);
    assert_eq!(sum(&ipi, "pv_yields"), 0);

    let no_steal = json(&[&["--option", "no-steal-time"][..], &base].concat());
    assert_eq!(report(&no_steal, "pv_steal_time"), Some("off"));
    // PV TLB flush needs the preempted byte, as in Linux.
    assert_eq!(report(&no_steal, "pv_tlb_flush"), Some("off"));
    assert_eq!(sum(&no_steal, "steal_ns"), 0);
}

#[test]
fn bench_tlbflush_repeats_and_pv_flush_cuts_ipis_to_preempted_vcpus() {
    let dir = std::env::temp_dir().join(format!("faultline-tlbflush-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plot = dir.join("tlbflush.svg");
    let run = || {
        let out = faultline(&[
            "bench",
            "tlbflush",
            "--rounds",
            "8",
            "--json",
            "--plot",
            plot.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let first = run();
    assert_eq!(first, run(), "same command, same numbers");
    let v: serde_json::Value = serde_json::from_str(&first).unwrap();
    let row = |name: &str| {
        v["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["config"] == name)
            .unwrap_or_else(|| panic!("no row {name}"))
            .clone()
    };
    for r in v["results"].as_array().unwrap() {
        assert_eq!(r["stale_reads"], 0, "{r}");
        assert_eq!(r["flushes"], 4 * 8, "{r}");
    }
    assert_eq!(row("dedicated")["ipis_to_preempted"], 0);
    assert_eq!(row("dedicated")["steal_ms"], 0.0);
    assert!(row("overcommit-ipi")["ipis_to_preempted"].as_u64().unwrap() > 0);
    assert_eq!(row("overcommit-pv")["ipis_to_preempted"], 0);
    assert!(row("overcommit-pv")["pv_skipped"].as_u64().unwrap() > 0);
    assert!(
        row("overcommit-pv")["flush_latency_us"].as_f64().unwrap()
            < row("overcommit-ipi")["flush_latency_us"].as_f64().unwrap()
    );
    assert!(
        row("overcommit-ipi-yield")["yields_directed"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(row("overcommit-ipi-unhalt")["kicks"].as_u64().unwrap() > 0);
    assert_eq!(row("overcommit-ipi")["kicks"], 0);
    assert!(plot.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pv_tlb_flush_under_shadow_paging_loses_no_flush_and_bad_options_are_usage_errors() {
    // Under shadow paging the hv's flush at entry also syncs the shadow
    // tables (KVM's kvm_vcpu_flush_tlb_guest).
    let v = json(&[
        "--mmu",
        "shadow",
        "--vcpus",
        "4",
        "--host-cpus",
        "2",
        "--mem",
        "64M",
        "--",
        "tlbflush",
        "-r",
        "10",
    ]);
    assert_eq!(report(&v, "tlbflush_stale_local"), Some("0"));
    assert_eq!(report(&v, "tlbflush_stale_remote"), Some("0"));
    let hv_flushes: u64 = v["vcpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["steal"]["pv_tlb_flushes"].as_u64().unwrap())
        .sum();
    assert!(hv_flushes > 0);

    for (args, says) in [
        (&["tlbflush", "-t", "1"][..], "out of range"),
        (&["tlbflush", "-r", "0"], "out of range"),
        (&["tlbflush", "-x"], "usage: tlbflush"),
    ] {
        let mut all = vec!["run", "--mem", "64M", "--"];
        all.extend_from_slice(args);
        let out = faultline(&all);
        let text = format!("{}{}", stdout(&out), stderr(&out));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {text}");
        assert!(text.contains(says), "{args:?}: {text}");
    }
    // --host-cpus 0 is refused before boot.
    let out = faultline(&["run", "--host-cpus", "0", "--", "hello"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}
