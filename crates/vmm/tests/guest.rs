//! Acceptance tests of issue 3 on the bundled guest kernel (built from
//! guest/ by build.rs). Without guest/ in the tree there is nothing to test.
#![cfg(bundled_kernel)]

mod common;
use common::{faultline, stdout};

#[test]
fn hello_runs_on_the_bundled_kernel() {
    let out = faultline(&["run", "--mem", "64M", "--", "hello"]);
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("hello"), "{text}");
    assert!(text.contains("--- faultline summary ---"), "{text}");
}

#[test]
fn memtouch_verifies_on_two_vcpus() {
    let out = faultline(&["run", "--vcpus", "2", "--mem", "64M", "--", "memtouch"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(" 0 errors"), "{text}");
}

#[test]
fn ctxsw_prints_a_switch_time() {
    let out = faultline(&["run", "--mem", "64M", "--", "ctxsw"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("mean switch time"), "{text}");
}

#[test]
fn bm_total_is_deterministic() {
    // A short run of the seed-000 benchmark (the acceptance command uses
    // -m 128M -t 1 with 256M; this keeps the test quick in debug builds).
    let args = [
        "run", "--vcpus", "2", "--mem", "64M", "--", "bm", "-f", "2", "-w", "2", "-m", "8M", "-t",
        "0",
    ];
    let a = faultline(&args);
    let b = faultline(&args);
    let text = stdout(&a);
    assert!(
        text.contains("total:"),
        "{text}\n{}",
        String::from_utf8_lossy(&a.stderr)
    );
    assert_eq!(a.stdout, b.stdout);
}

#[test]
fn kernel_triple_fault_stops_the_vm_cleanly() {
    let out = faultline(&[
        "run",
        "--mem",
        "64M",
        "--option",
        "crash=triple",
        "--",
        "hello",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("triple fault at rip"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn kernel_write_outside_memory_stops_the_vm_cleanly() {
    // The stop is --strict-mmio's; by default such a write is dropped as
    // unassigned MMIO.
    let out = faultline(&[
        "run",
        "--strict-mmio",
        "--mem",
        "64M",
        "--option",
        "crash=wild-write",
        "--",
        "hello",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("guest access outside its memory at gpa 0x4000000"),
        "{stderr}"
    );
    assert!(!stdout(&out).contains("did not stop the VM"));
}

#[test]
fn stats_json_is_exactly_one_document_with_the_console_inside() {
    let out = faultline(&["run", "--stats", "json", "--", "hello"]);
    assert!(out.status.success());
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("stdout is one JSON document");
    assert_eq!(v["stop"]["reason"], "shutdown");
    assert_eq!(v["stop"]["status"], 0);
    assert_eq!(v["exit_status"], 0);
    let console = v["console"].as_str().expect("console");
    assert!(console.contains("hello from user space"), "{console}");
    assert!(v["reports"].as_array().is_some_and(|r| !r.is_empty()));
}

#[test]
fn the_guest_takes_the_seed_boot_option() {
    let out = faultline(&["run", "--mem", "64M", "--seed", "3", "--", "hello"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("cmdline 'seed=3 -- hello'"), "{text}");
    assert!(!text.contains("unknown boot option"), "{text}");
}
