//! Snapshots: `run --snapshot-at T --snapshot FILE` then `restore FILE`
//! round-trips the bundled guest programs (overcommitted memory with
//! pages in the swap file included), restored runs repeat byte for byte,
//! and a damaged or hostile snapshot fails cleanly (status 2, a message,
//! never a panic).
#![cfg(bundled_kernel)]

mod common;
use common::{faultline, stderr, stdout, SMALL_OVERCOMMIT, SMALL_PAGETAG};

use std::path::Path;
use std::process::Output;

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).expect("stdout is one JSON document")
}

/// `run ARGS --snapshot-at AT --snapshot FILE --stats json -- PROGRAM`.
fn run_and_save(args: &[&str], at: &str, file: &Path, program: &[&str]) -> Output {
    let mut all = vec!["run", "--stats", "json"];
    all.extend_from_slice(args);
    let file = file.to_str().expect("utf-8 path");
    all.extend_from_slice(&["--snapshot-at", at, "--snapshot", file, "--"]);
    all.extend_from_slice(program);
    faultline(&all)
}

fn run_plain(args: &[&str], program: &[&str]) -> Output {
    let mut all = vec!["run", "--stats", "json"];
    all.extend_from_slice(args);
    all.push("--");
    all.extend_from_slice(program);
    faultline(&all)
}

fn restore(file: &Path, extra: &[&str]) -> Output {
    let mut all = vec![
        "restore",
        file.to_str().expect("utf-8 path"),
        "--stats",
        "json",
    ];
    all.extend_from_slice(extra);
    faultline(&all)
}

/// Saves mid-run, checks the save, restores twice: both restored runs end
/// as the guest's own successful end and print the same bytes. Returns
/// the saved run's and a restored run's summaries.
fn round_trip(
    args: &[&str],
    at: &str,
    program: &[&str],
    restore_extra: &[&str],
) -> (serde_json::Value, serde_json::Value) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("vm.snap");
    let saved = run_and_save(args, at, &file, program);
    let saved_text = stdout(&saved);
    assert!(
        saved.status.success(),
        "{program:?}: {saved_text}\n{}",
        stderr(&saved)
    );
    let saved_json = json(&saved_text);
    assert_eq!(
        saved_json["stop"]["reason"], "snapshot",
        "{program:?} ended before {at}: {saved_text}"
    );
    assert!(file.exists(), "no snapshot written");
    let first = restore(&file, restore_extra);
    let second = restore(&file, restore_extra);
    let first_text = stdout(&first);
    assert!(
        first.status.success(),
        "{program:?} restored: {first_text}\n{}",
        stderr(&first)
    );
    assert_eq!(
        first_text,
        stdout(&second),
        "{program:?}: two restores of one snapshot differ"
    );
    assert_eq!(first.status.code(), second.status.code());
    let restored = json(&first_text);
    assert!(
        restored["virtual_cycles"].as_u64() > saved_json["virtual_cycles"].as_u64(),
        "the restored run went on from the saved time"
    );
    (saved_json, restored)
}

#[test]
fn hello_round_trips_and_continues_the_output() {
    let program = ["hello"];
    let whole = run_plain(&["--vcpus", "2"], &program);
    assert!(whole.status.success());
    let whole = json(&stdout(&whole));
    let (saved, restored) = round_trip(&["--vcpus", "2"], "300us", &program, &[]);
    let joined = format!(
        "{}{}",
        saved["console"].as_str().unwrap(),
        restored["console"].as_str().unwrap()
    );
    assert_eq!(
        joined,
        whole["console"].as_str().unwrap(),
        "the saved output and the restored output together are the uninterrupted run's"
    );
    assert_eq!(restored["stop"], whole["stop"]);
}

#[test]
fn hello_round_trips_under_shadow_paging() {
    let args = ["--vcpus", "2", "--mmu", "shadow"];
    let whole = json(&stdout(&run_plain(&args, &["hello"])));
    let (saved, restored) = round_trip(&args, "300us", &["hello"], &[]);
    assert_eq!(
        format!(
            "{}{}",
            saved["console"].as_str().unwrap(),
            restored["console"].as_str().unwrap()
        ),
        whole["console"].as_str().unwrap()
    );
}

#[test]
fn bm_round_trips() {
    let program = ["bm", "-f", "2", "-w", "2", "-m", "16M", "-t", "0.05"];
    let (_, restored) = round_trip(&["--vcpus", "2", "--mem", "64M"], "20ms", &program, &[]);
    let console = restored["console"].as_str().unwrap();
    assert!(console.contains("total: "), "{console}");
}

#[test]
fn pagetag_round_trips_with_pages_in_swap() {
    for (apf, mmu) in [
        (["--apf", "pv"], "ept"),
        (["--apf", "off"], "ept"),
        (["--apf", "pv"], "shadow"),
        (["--apf", "halt"], "shadow"),
    ] {
        let args: Vec<&str> = SMALL_OVERCOMMIT
            .iter()
            .copied()
            .chain(apf)
            .chain(["--mmu", mmu])
            .collect();
        let (saved, restored) = round_trip(&args, "100ms", &SMALL_PAGETAG, &[]);
        assert!(
            saved["memory"]["pager"]["evictions"].as_u64().unwrap() > 0,
            "pages were in swap when saved: {}",
            saved["memory"]
        );
        let console = restored["console"].as_str().unwrap();
        assert!(console.contains(" 0 bad pages"), "{apf:?} {mmu}: {console}");
        assert_eq!(restored["mmu"], mmu);
    }
}

#[test]
fn pagetag_restores_with_other_host_memory() {
    // Saved overcommitted, restored with no limit, and the reverse.
    let (_, restored) = round_trip(
        &SMALL_OVERCOMMIT,
        "100ms",
        &SMALL_PAGETAG,
        &["--host-mem", "48M"],
    );
    assert!(restored["console"]
        .as_str()
        .unwrap()
        .contains(" 0 bad pages"));
    let (_, restored) = round_trip(
        &["--vcpus", "2", "--mem", "48M"],
        "4ms",
        &SMALL_PAGETAG,
        &["--host-mem", "8M"],
    );
    assert!(restored["console"]
        .as_str()
        .unwrap()
        .contains(" 0 bad pages"));
    assert!(restored["memory"]["pager"]["evictions"].as_u64().unwrap() > 0);
}

/// A real snapshot to damage.
fn hello_snapshot(dir: &Path) -> Vec<u8> {
    let file = dir.join("good.snap");
    let out = run_and_save(&["--vcpus", "2"], "300us", &file, &["hello"]);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::read(&file).expect("read snapshot")
}

fn assert_refused(file: &Path, what: &str) {
    let out = restore(file, &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{what}: {err}");
    assert!(err.contains("faultline: "), "{what}: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
}

#[test]
fn damaged_snapshots_fail_cleanly() {
    let dir = tempfile::tempdir().expect("temp dir");
    let good = hello_snapshot(dir.path());
    let bad = dir.path().join("bad.snap");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("truncated header", good[..10].to_vec()),
        ("truncated state", good[..200].to_vec()),
        ("truncated memory", good[..good.len() - 100].to_vec()),
        ("flipped bit", {
            let mut b = good.clone();
            let at = b.len() / 2;
            b[at] ^= 0x10;
            b
        }),
        ("wrong version", {
            let mut b = good.clone();
            b[8] = 99;
            b
        }),
        ("huge section", {
            let mut b = good.clone();
            b[20..28].copy_from_slice(&u64::MAX.to_le_bytes());
            b
        }),
        (
            "not a snapshot",
            b"hello world, this is not a snapshot".to_vec(),
        ),
        ("trailing bytes", {
            let mut b = good.clone();
            b.extend_from_slice(&[0; 7]);
            b
        }),
    ];
    for (what, bytes) in cases {
        std::fs::write(&bad, &bytes).expect("write");
        assert_refused(&bad, what);
    }
    assert_refused(dir.path(), "a directory");
    assert_refused(&dir.path().join("missing"), "a missing file");
}

/// The offsets of the state section's payload and of its CRC.
fn state_section(bytes: &[u8]) -> (usize, usize, usize) {
    let len = u64::from_le_bytes(bytes[20..28].try_into().unwrap()) as usize;
    (32, 32 + len, 28)
}

fn fix_crc(bytes: &mut [u8], start: usize, end: usize, crc_at: usize) {
    let crc = crc32fast::hash(&bytes[start..end]);
    bytes[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn hostile_state_with_valid_checksums_never_panics() {
    let dir = tempfile::tempdir().expect("temp dir");
    let good = hello_snapshot(dir.path());
    let (start, end, crc_at) = state_section(&good);
    let options = hv::snapshot::RestoreOptions::default();
    assert!(
        hv::Vm::restore(&good, &options).is_ok(),
        "the good one restores"
    );
    let mut refused = 0;
    let mut tried = 0;
    // Every byte of the state section set to 0xff, and to 0x00, with the
    // checksum fixed: decoded values out of range, lengths huge, counts
    // wrong. Each is refused or gives a VM; none panics.
    for at in (start..end).step_by(((end - start) / 400).max(1)) {
        for value in [0xffu8, 0x00, 0x80] {
            let mut bytes = good.clone();
            if bytes[at] == value {
                continue;
            }
            bytes[at] = value;
            fix_crc(&mut bytes, start, end, crc_at);
            tried += 1;
            let result = std::panic::catch_unwind(|| hv::Vm::restore(&bytes, &options).is_err());
            match result {
                Ok(true) => refused += 1,
                Ok(false) => {}
                Err(_) => panic!("restoring with byte {at} = {value:#x} panicked"),
            }
        }
    }
    assert!(refused > tried / 4, "only {refused} of {tried} refused");
}

#[test]
fn hostile_memory_section_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let good = hello_snapshot(dir.path());
    let (_, state_end, _) = state_section(&good);
    // The memory section: kind (4), length (8), crc (4), then the count.
    let mem_start = state_end + 16;
    let crc_at = state_end + 12;
    let options = hv::snapshot::RestoreOptions::default();
    let count_at = mem_start;
    let first_gfn_at = mem_start + 8;
    let cases: [(&str, usize, u64); 3] = [
        ("page count above the guest's", count_at, u64::MAX / 4096),
        ("page count off by one", count_at, {
            u64::from_le_bytes(good[count_at..count_at + 8].try_into().unwrap()) + 1
        }),
        ("gfn outside guest memory", first_gfn_at, 1 << 40),
    ];
    for (what, at, value) in cases {
        let mut bytes = good.clone();
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        let end = bytes.len();
        fix_crc(&mut bytes, mem_start, end, crc_at);
        let err = hv::Vm::restore(&bytes, &options).expect_err(what);
        assert!(
            matches!(err, hv::snapshot::SnapshotError::Invalid(_)),
            "{what}: {err}"
        );
    }
}

#[test]
fn unsupported_configurations_are_refused_before_boot() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("x.snap");
    for extra in [["--mmu", "none"], ["--dirty-log", "bitmap"]] {
        let out = run_and_save(&extra, "1ms", &file, &["hello"]);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("--snapshot-at"), "{}", stderr(&out));
    }
}

#[test]
fn lazy_restore_loads_memory_on_first_touch() {
    // Saved on an nvme-speed swap device so each first touch is quick.
    let args = ["--vcpus", "2", "--mem", "48M", "--swap-device", "nvme"];
    for apf in ["pv", "off"] {
        let args: Vec<&str> = args.iter().copied().chain(["--apf", apf]).collect();
        let (eager_saved, eager) = round_trip(&args, "4ms", &SMALL_PAGETAG, &[]);
        let (_, lazy) = round_trip(&args, "4ms", &SMALL_PAGETAG, &["--lazy"]);
        let console = lazy["console"].as_str().unwrap();
        assert!(console.contains(" 0 bad pages"), "{apf}: {console}");
        assert_eq!(
            eager_saved["memory"]["pager"]["swap_ins"], 0,
            "nothing was in swap at the save"
        );
        let swap_ins = lazy["memory"]["pager"]["swap_ins"].as_u64().unwrap();
        assert!(
            swap_ins > 100,
            "{apf}: pages came in on first touch: {swap_ins}"
        );
        assert_eq!(eager["memory"]["pager"]["swap_ins"], 0);
        if apf == "pv" {
            assert!(
                lazy["apf"]["not_present_sent"].as_u64().unwrap() > 0,
                "{}",
                lazy["apf"]
            );
        }
    }
}

/// Every bundled program, saved halfway through its run and restored
/// eagerly and lazily, ends as the uninterrupted run does (exit status
/// and stop reason); the console differs only where the program prints
/// virtual times or async-PF counters (docs/migration.md, "Bit-identical
/// or not").
#[test]
fn every_guest_program_round_trips_its_result() {
    let programs: [&[&str]; 12] = [
        &["hello", "a", "b"],
        &["memtouch", "-m", "8M", "-p", "2"],
        &["ctxsw", "-n", "200"],
        &["fault", "ud"],
        &["fault", "thread"],
        &["pagetag", "-m", "8M", "-p", "2"],
        &["apfcalc", "-m", "2M", "-l", "1", "-c"],
        &["bm", "-f", "2", "-w", "2", "-m", "8M", "-t", "0.01"],
        &["tlbflush", "-r", "20"],
        &["touchloop", "-m", "8M", "-p", "2"],
        &["fbwrite", "-f", "2"],
        &["hackbench", "1", "-l", "2"],
    ];
    // nvme: a lazy restore's first touches are swap-ins at the saved
    // device's latency (an hdd's 8 ms each would make this test minutes).
    let args = ["--vcpus", "2", "--mem", "64M", "--swap-device", "nvme"];
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("p.snap");
    for program in programs {
        let whole = run_plain(&args, program);
        let whole_json = json(&stdout(&whole));
        let half_us = whole_json["virtual_cycles"].as_u64().unwrap() / 3000 / 2;
        let at = format!("{}us", half_us.max(1));
        let saved = run_and_save(&args, &at, &file, program);
        let saved_json = json(&stdout(&saved));
        assert_eq!(saved_json["stop"]["reason"], "snapshot", "{program:?}");
        for extra in [&[][..], &["--lazy"]] {
            let restored = restore(&file, extra);
            let restored_json = json(&stdout(&restored));
            assert_eq!(
                restored.status.code(),
                whole.status.code(),
                "{program:?} {extra:?}: {}",
                stderr(&restored)
            );
            assert_eq!(
                restored_json["stop"], whole_json["stop"],
                "{program:?} {extra:?}"
            );
            let console = format!(
                "{}{}",
                saved_json["console"].as_str().unwrap(),
                restored_json["console"].as_str().unwrap()
            );
            assert_eq!(
                console.lines().count(),
                whole_json["console"].as_str().unwrap().lines().count(),
                "{program:?} {extra:?}: the output continues line for line"
            );
        }
    }
}

/// `key=value` from the report line holding `key`.
fn report_value(summary: &serde_json::Value, key: &str) -> u64 {
    let prefix = format!("{key}=");
    summary["reports"]
        .as_array()
        .expect("reports")
        .iter()
        .filter_map(|r| r["line"].as_str())
        .flat_map(str::split_whitespace)
        .find_map(|field| field.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {key} report"))
        .parse()
        .expect("a number")
}

/// A restore is invisible to the guest's timing: apfcalc (a writer and a
/// calculation thread sharing one vCPU, so the interleaving hangs on where
/// each time slice ends) saved at several times and restored ends at the
/// uninterrupted run's virtual cycle with the same instructions, EPT
/// faults and every report line at the same cycle (the writer's time, the
/// calculation's count, the guest's tick and switch counters). Before the
/// EPT and the TLB were carried, the restored guest paid a refault and a
/// walk for every page it had mapped; saved at 20 ms that delay moved one
/// preemption past a timer tick and the writer took 9.35 ms instead of
/// 21.35 ms while the calculation stopped.
#[test]
fn a_restore_keeps_the_guests_timing() {
    let program = ["apfcalc", "-m", "16M", "-l", "8", "-c"];
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("t.snap");
    for (apf, times) in [
        ("pv", &["5ms", "20ms", "24ms", "33ms"][..]),
        ("off", &["20ms", "24ms"][..]),
    ] {
        let args = ["--vcpus", "1", "--mem", "64M", "--apf", apf];
        let whole = json(&stdout(&run_plain(&args, &program)));
        for at in times {
            let saved = json(&stdout(&run_and_save(&args, at, &file, &program)));
            assert_eq!(saved["stop"]["reason"], "snapshot", "{apf} {at}");
            let restored = json(&stdout(&restore(&file, &[])));
            for key in ["stop", "virtual_cycles", "instructions", "ept_faults"] {
                assert_eq!(restored[key], whole[key], "{apf} {at}: {key}");
            }
            assert_eq!(
                report_value(&restored, "apfcalc_calc"),
                report_value(&whole, "apfcalc_calc"),
                "{apf} {at}: calculation progress"
            );
            assert_eq!(
                report_value(&restored, "apfcalc_ns"),
                report_value(&whole, "apfcalc_ns"),
                "{apf} {at}: the writer's time"
            );
            assert_eq!(restored["reports"], whole["reports"], "{apf} {at}");
        }
    }
}
