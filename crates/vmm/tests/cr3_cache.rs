//! The paravirtual CR3 cache (issue 13) on the bundled guest kernel: every
//! program runs as under EPT with it on, a hit costs no exit, and cached
//! roots freed and obsoleted while processes switch (memslot deletes with
//! the fast zap, swapping) lose no page.
#![cfg(bundled_kernel)]

mod common;
use common::{faultline, stderr, stdout, SMALL_OVERCOMMIT};

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

fn report<'a>(v: &'a serde_json::Value, key: &str) -> Option<&'a str> {
    v["reports"].as_array()?.iter().find_map(|r| {
        let line = r["line"].as_str()?;
        line.split(' ')
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
    })
}

fn sum_cr3(v: &serde_json::Value, key: &str) -> u64 {
    v["vcpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["cr3"][key].as_u64().unwrap())
        .sum()
}

/// `bench ctxsw --rounds 400 --json` with `extra` options: its raw
/// output (to compare runs byte for byte) and its JSON.
fn bench_ctxsw(extra: &[&str]) -> (Vec<u8>, serde_json::Value) {
    let mut args = vec!["bench", "ctxsw", "--rounds", "400", "--json"];
    args.extend_from_slice(extra);
    let out = faultline(&args);
    assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
    let v = serde_json::from_str(&stdout(&out)).expect("one JSON document");
    (out.stdout, v)
}

/// The result row of `config` in a bench's JSON.
fn row<'a>(v: &'a serde_json::Value, config: &str) -> &'a serde_json::Value {
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["config"] == config)
        .unwrap_or_else(|| panic!("no {config} row: {v}"))
}

/// `bench ctxsw`'s acceptance ratios: cache-4 within 1.1x of EPT and at
/// least 1.5x faster than shadow without a root cache.
fn assert_ctxsw_acceptance(v: &serde_json::Value) {
    let us = |name: &str| row(v, name)["switch_us"].as_f64().unwrap();
    assert!(us("shadow-cr3-cache-4") <= 1.1 * us("ept"), "{v}");
    assert!(us("shadow") >= 1.5 * us("shadow-cr3-cache-4"), "{v}");
}

#[test]
fn every_program_runs_the_same_with_the_cr3_cache() {
    for program in [
        &["hello", "a", "b"][..],
        &["memtouch", "-m", "8M", "-p", "2"],
        &["ctxsw", "-n", "200"],
        &["ctxsw", "-x", "-n", "200"],
        &["fault", "ud"],
        &["fault", "thread"],
        &["pagetag", "-m", "2M", "-p", "2", "-P", "3"],
        &["apfcalc", "-m", "2M", "-l", "1", "-c"],
        &["touchloop", "-m", "2M", "-p", "2"],
        &["bm", "-f", "1", "-w", "1", "-m", "2M", "-t", "0.002"],
        &["fbwrite", "-w", "64", "-h", "64", "-s", "16", "-f", "2"],
        // 41 address spaces for 4 targets: entries replaced all the time.
        &["hackbench", "1", "-l", "5"],
    ] {
        let run = |extra: &[&str]| {
            let mut args = vec!["run", "--vcpus", "2", "--mem", "64M"];
            args.extend_from_slice(extra);
            args.push("--");
            args.extend_from_slice(program);
            faultline(&args)
        };
        let ept = run(&[]);
        let cached = run(&["--mmu", "shadow", "--cr3-cache", "on"]);
        let text = stdout(&cached);
        assert_eq!(
            cached.status.code(),
            ept.status.code(),
            "{program:?}: {text}"
        );
        assert!(
            text.contains("cr3-cache: enabled, 4 entries"),
            "{program:?}: {text}"
        );
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
fn a_hit_costs_no_exit_and_the_boot_option_turns_it_off() {
    let base = ["--mmu", "shadow", "--", "ctxsw", "-n", "500"];
    let on = json(&[&["--cr3-cache", "on"][..], &base].concat());
    let hits: u64 = report(&on, "cr3_cache_hits").unwrap().parse().unwrap();
    let misses: u64 = report(&on, "cr3_cache_misses").unwrap().parse().unwrap();
    assert!(
        hits >= 2 * 499,
        "every switch after the first few hits: {hits}"
    );
    // Each exit is a miss (or a boot-time load): hits add none.
    let exits = sum_cr3(&on, "cr3_load_exits");
    assert!(
        exits <= misses + 2,
        "{exits} CR3-load exits for {misses} misses"
    );
    assert_eq!(sum_cr3(&on, "stale_loads"), 0);

    let off = json(
        &[
            &["--cr3-cache", "on", "--option", "no-cr3-cache"][..],
            &base,
        ]
        .concat(),
    );
    assert_eq!(report(&off, "cr3_cache"), Some("off"));
    assert!(sum_cr3(&off, "cr3_load_exits") >= 2 * 499);
    assert_eq!(sum_cr3(&off, "entries_added"), 0);
}

#[test]
fn cached_roots_freed_and_obsoleted_while_processes_switch_lose_no_page() {
    let mut args = vec!["--mmu", "shadow", "--cr3-cache", "on"];
    args.extend_from_slice(&SMALL_OVERCOMMIT);
    args.extend_from_slice(&[
        "--memslot-period",
        "1ms",
        "--",
        "pagetag",
        "-m",
        "4M",
        "-p",
        "2",
        "-t",
        "1",
        "-P",
        "4",
    ]);
    let v = json(&args);
    assert_eq!(report(&v, "pagetag_failed_procs"), Some("0"));
    let console = v["console"].as_str().unwrap();
    assert_eq!(console.matches(", 0 bad pages").count(), 4, "{console}");
    assert!(v["memory"]["pager"]["evictions"].as_u64().unwrap() > 100);
    assert!(v["memslot"]["ops"].as_array().unwrap().len() > 100);
    // Roots were cached, dropped (zaps, unsync) and switched to without
    // exits throughout.
    assert!(sum_cr3(&v, "entries_dropped") > 100, "{}", v["vcpus"]);
    assert!(sum_cr3(&v, "switches_seen") > 1000, "{}", v["vcpus"]);
    let hits: u64 = report(&v, "cr3_cache_hits").unwrap().parse().unwrap();
    assert!(hits > 1000, "{hits}");
}

/// `bench ctxsw`, small: every row, the JSON keys, the acceptance
/// ratios (cache-4 within 1.1x of EPT, at least 1.5x faster than shadow
/// without a root cache) and no CR3-load exits on hits.
#[test]
fn bench_ctxsw_rows_keys_and_acceptance() {
    let dir = std::env::temp_dir().join(format!("faultline-ctxsw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plot = dir.join("ctxsw.svg");
    let (out, v) = bench_ctxsw(&["--plot", plot.to_str().unwrap()]);
    let results = v["results"].as_array().unwrap();
    let configs: Vec<&str> = results
        .iter()
        .map(|r| r["config"].as_str().unwrap())
        .collect();
    assert_eq!(
        configs,
        [
            "native",
            "ept",
            "shadow",
            "shadow-prev-roots",
            "shadow-cr3-cache-4",
            "shadow-cr3-cache-16"
        ]
    );
    let us = |name: &str| row(&v, name)["switch_us"].as_f64().unwrap();
    let exits = |name: &str| row(&v, name)["cr3_exits"].as_u64().unwrap();
    for r in results {
        for key in ["switch_us", "cr3_exits", "roots_built", "tlb_misses"] {
            assert!(r[key].is_number(), "{key}: {r}");
        }
    }
    assert_ctxsw_acceptance(&v);
    // Every switch exits without a cache; with one only the first loads.
    assert!(exits("shadow") >= 2 * 399, "{v}");
    assert!(exits("shadow-cr3-cache-4") <= 8, "{v}");
    assert_eq!(exits("ept"), 0);
    assert_eq!(exits("native"), 0);
    // No memory virtualisation is the floor; the ratios beside the seed's.
    assert!(us("native") < us("shadow-cr3-cache-4"), "{v}");
    for key in ["shadow_vs_native", "cache4_vs_native", "ept_vs_native"] {
        assert!(v["ratios"][key].as_f64().unwrap() > 1.0, "{key}: {v}");
    }
    assert!(std::fs::metadata(&plot).unwrap().len() > 0);
    let (again, _) = bench_ctxsw(&["--plot", plot.to_str().unwrap()]);
    assert_eq!(again, out, "the same numbers again");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The acceptance ratios rest on the exits the cache removes; two of the
/// entries they are charged with have no direct measurement (`exit_base`,
/// the hv's dispatch, bounded by the KVM software around one VMRUN that
/// an LKML thread measured, 576 + 576 cycles; `invvpid`, no published
/// latency). `--cost` sets them to the ends of their ranges: the ratios
/// hold at both, and the shadow row moves with them (the override is in
/// effect).
#[test]
fn bench_ctxsw_acceptance_holds_across_the_exit_cost_range() {
    let run = |exit_base: u64, invvpid: u64| {
        let (_, v) = bench_ctxsw(&[
            "--cost",
            &format!("exit_base={exit_base}"),
            "--cost",
            &format!("invvpid={invvpid}"),
        ]);
        assert_ctxsw_acceptance(&v);
        row(&v, "shadow")["switch_us"].as_f64().unwrap()
    };
    let low = run(0, 0);
    let high = run(1152, 1000);
    assert!(
        high > low,
        "shadow {low} us at the low end, {high} us at the high end"
    );
}

/// The invariant checked from outside, on the bundled kernel, while it
/// matters: with the cache on, address spaces switch (three `pagetag`
/// processes under memory pressure; `hackbench`'s 41 processes, far more
/// than the 4 targets), and every few slices a fast zap-all obsoletes every
/// cached root. After every slice `Vm::check_mmu` holds: each cached root
/// exists, is current, is in sync and is in the target list exactly when
/// it is in the table.
#[test]
fn check_mmu_holds_with_the_cache_on_while_cached_roots_are_zapped() {
    const KERNEL: &[u8] = include_bytes!(env!("FAULTLINE_GUEST_KERNEL"));
    for (cmdline, host_mem, says) in [
        (
            "-- pagetag -m 4M -p 2 -t 1 -P 3",
            Some(8 << 20),
            "pagetag: 3 processes, 0 failed",
        ),
        (
            "-- hackbench 1 -l 5",
            None,
            "Running with 1*40 (== 40) tasks",
        ),
    ] {
        let config = hv::VmConfig {
            vcpus: 2,
            mem_size: 48 << 20,
            host_mem,
            swap_device: hv::DevicePreset::Nvme.model(),
            // A task waiting for a swap-in lets another run: switches.
            apf: hv::ApfMode::Pv,
            mmu: hv::MmuMode::Shadow,
            cr3_cache: true,
            cr3_targets: 4,
            cmdline: cmdline.into(),
            ..hv::VmConfig::default()
        };
        let mut vm = hv::Vm::boot(&config, KERNEL).expect("boot");
        let mut slices = 0u64;
        let reason = loop {
            match vm.run_until(vm.time() + hv::Cycles(1_500_000)) {
                hv::RunStatus::Stopped(reason) => break reason,
                hv::RunStatus::Running | hv::RunStatus::DirtyRingFull => {}
            }
            slices += 1;
            if let Err(e) = vm.check_mmu() {
                panic!("{cmdline}: slice {slices}: {e}");
            }
            if slices % 8 == 0 {
                vm.zap_all().expect("zap-all");
                vm.check_mmu().expect("after the zap");
            }
        };
        let out = String::from_utf8_lossy(&vm.take_serial()).into_owned();
        assert_eq!(
            reason,
            hv::StopReason::Shutdown { status: 0 },
            "{cmdline}: {out}"
        );
        assert!(out.contains(says), "{cmdline}: {out}");
        assert!(slices >= 8, "{cmdline}: {slices} slices: too short to zap");
        let stats = vm.stats();
        let dropped: u64 = stats
            .vcpus
            .iter()
            .map(|v| v.cr3_cache.entries_dropped)
            .sum();
        let seen: u64 = stats.vcpus.iter().map(|v| v.cr3_cache.switches_seen).sum();
        assert!(dropped > 0, "{cmdline}: zaps dropped no cached root");
        let reports: Vec<&str> = vm.reports().iter().map(|r| r.line.as_str()).collect();
        assert!(seen > 0, "{cmdline}: no exitless switch: {reports:?}");
    }
}
