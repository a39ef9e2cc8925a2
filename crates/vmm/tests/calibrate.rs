//! `faultline calibrate --json`: the shape of its report, and every figure
//! it measured positive and finite. No timing thresholds: the figures are
//! whatever this (shared) host gives.

mod common;
use common::{faultline, stderr, stdout};
use serde_json::Value;
use std::sync::Mutex;

/// One calibration at a time: two would share the two cores and the
/// memory of the 1 GiB test.
static SERIAL: Mutex<()> = Mutex::new(());

/// Every test the command runs, in its order.
const TESTS: [&str; 29] = [
    "line_transfer",
    "ticket_lock_handoff",
    "ticket_lock_uncontended",
    "mutex_uncontended",
    "lock_add",
    "lock_cmpxchg",
    "lock_or",
    "load_l1",
    "load_l2",
    "load_l2_tlb_miss",
    "load_dram_tlb_miss",
    "zero_4k",
    "copy_4k",
    "syscall",
    "kvm_cpuid_exit",
    "context_switch",
    "rep_movsb",
    "rep_stosb",
    "memslot_lookup",
    "frame_alloc_free",
    "spte_write_rmap",
    "host_read_4k",
    "kvm_vmcall_exit",
    "kvm_rdmsr_exit",
    "kvm_pio_exit",
    "kvm_guest_loop",
    "kvm_int_iret",
    "int80_syscall",
    "kvm_pio_kernel_exit",
];

fn positive(v: &Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: not a number: {v}"));
    assert!(x.is_finite() && x > 0.0, "{what}: {x}");
    x
}

#[test]
fn calibrate_json_has_every_test_with_positive_finite_figures() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = faultline(&["calibrate", "--json", "--iterations", "3"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    let v: Value = serde_json::from_str(&text).expect("stdout is one JSON document");

    assert_eq!(v["repetitions"], 3);
    positive(&v["table_ghz"], "table_ghz");
    let host = &v["host"];
    let cpus = host["cpus"].as_u64().expect("host.cpus");
    assert!(cpus >= 1);
    assert!(
        host["tsc"].is_string() && host["pinning"].is_string(),
        "{host}"
    );
    assert!(host["virtualized"].is_boolean(), "{host}");
    let tsc = &host["tsc_ghz"];
    assert!(tsc.is_null() || positive(tsc, "tsc_ghz") > 0.0);

    let tests = v["tests"].as_array().expect("tests");
    let names: Vec<&str> = tests.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, TESTS);
    for t in tests {
        let name = t["name"].as_str().unwrap();
        assert!(t["what"].as_str().is_some_and(|w| !w.is_empty()), "{t}");
        assert_eq!(t["repetitions"], 3, "{name}");
        assert!(t["ops_per_repetition"].as_u64().unwrap() > 0, "{name}");
        for i in t["informs"].as_array().expect("informs") {
            assert!(matches!(i["table"].as_str(), Some("machine" | "hv")), "{i}");
            assert!(i["entry"].as_str().is_some_and(|e| !e.is_empty()), "{i}");
            assert!(i["value"].as_u64().is_some(), "{i}");
        }
        match t["status"].as_str() {
            Some("ok") => {
                let median = positive(&t["median_ns"], name);
                let lo = positive(&t["min_ns"], name);
                let hi = positive(&t["max_ns"], name);
                assert!(lo <= median && median <= hi, "{name}: {lo} {median} {hi}");
                if tsc.is_null() {
                    assert!(t["median_cycles"].is_null(), "{name}");
                } else {
                    positive(&t["median_cycles"], name);
                }
            }
            Some("skipped") => {
                // Only a host this test cannot run on skips it.
                let reason = t["reason"].as_str().expect("a reason");
                if name == "line_transfer" || name == "ticket_lock_handoff" {
                    assert!(cpus < 2 && reason.contains("needs 2 CPUs"), "{t}");
                } else if name == "int80_syscall" {
                    // A kernel without the 32-bit entry.
                    assert!(reason.contains("INT 0x80"), "{t}");
                } else if name.starts_with("kvm_") {
                    // A host without a usable /dev/kvm, or whose KVM does
                    // not complete the loop in the kernel.
                    assert!(!std::path::Path::new("/dev/kvm").exists() || !reason.is_empty());
                } else {
                    panic!("{name} skipped: {reason}");
                }
                assert!(t.get("median_ns").is_none(), "{t}");
            }
            other => panic!("{name}: status {other:?}: {t}"),
        }
    }
    // An empty guest loop, timed before the tests, decides whether the
    // KVM tests run: where KVM emulates the guest's instructions (an
    // iteration over 100 ns) the others are skipped, saying so; where it
    // runs them, they are not skipped for that reason.
    let kvm = host["kvm"].as_str().expect("host.kvm");
    let by_name = |n: &str| tests.iter().find(|t| t["name"] == n).unwrap();
    let guest_loop = by_name("kvm_guest_loop");
    let emulated = "emulates the guest's instructions";
    let others = TESTS
        .iter()
        .filter(|n| n.starts_with("kvm_") && **n != "kvm_guest_loop");
    if kvm.starts_with("emulated: ") {
        assert_eq!(guest_loop["status"], "ok", "{guest_loop}");
        for n in others {
            let t = by_name(n);
            assert_eq!(t["status"], "skipped", "{t}");
            assert!(t["reason"].as_str().unwrap().contains(emulated), "{t}");
        }
    } else if kvm.starts_with("native: ") {
        assert_eq!(guest_loop["status"], "ok", "{guest_loop}");
        for n in others {
            let t = by_name(n);
            assert!(
                !t["reason"].as_str().unwrap_or("").contains(emulated),
                "{t}"
            );
        }
    } else {
        assert!(kvm.starts_with("no guest ran: "), "{kvm}");
        assert_eq!(guest_loop["status"], "skipped", "{guest_loop}");
    }
    // The two-core tests inform line_transfer with its current value.
    let lt = &tests[0]["informs"][0];
    assert_eq!(lt["entry"], "line_transfer");
    assert_eq!(lt["table"], "hv");
    assert_eq!(lt["value"], 110);
}

#[test]
fn calibrate_table_names_each_test_and_entry() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = faultline(&["calibrate", "--iterations", "1"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    for name in TESTS {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{name} "))),
            "{name} missing:\n{text}"
        );
    }
    assert!(text.contains("line_transfer=110"), "{text}");
    assert!(text.contains("privilege_transition=40"), "{text}");
}

#[test]
fn calibrate_refuses_zero_iterations() {
    let out = faultline(&["calibrate", "--iterations", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn calibrate_writes_a_profile_of_the_entries_it_measures() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.profile");
    let out = faultline(&[
        "calibrate",
        "--iterations",
        "1",
        "--write-profile",
        path.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = std::fs::read_to_string(&path).unwrap();
    let entries: Vec<(&str, u64)> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (name, rest) = l.split_once('=').unwrap();
            let cycles = rest.split_whitespace().next().unwrap().parse().unwrap();
            (name, cycles)
        })
        .collect();
    let names: Vec<&str> = entries.iter().map(|e| e.0).collect();
    assert_eq!(
        names,
        [
            "line_transfer",
            "lock_acquire",
            "locked",
            "spte_cmpxchg",
            "dirty_bit_set",
            "zero_4k",
            "copy_4k"
        ],
        "{text}"
    );
    assert!(entries.iter().all(|e| e.1 > 0), "{text}");
}
