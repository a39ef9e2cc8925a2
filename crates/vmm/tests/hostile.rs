//! The hostile-guest suite at the vmm level: a guest that spins with
//! interrupts off (crates/hv/tests/guests/hostile/spin.c) can only be
//! stopped by a limit, and `--time-limit` stops it cleanly.

use std::process::Command;

#[test]
fn an_interrupts_off_spin_ends_at_the_time_limit() {
    let kernel = format!("{}/hostile-spin.elf", env!("FAULTLINE_HV_TEST_KERNELS"));
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_faultline"))
            .args(["run", "--kernel", &kernel, "--time-limit", "10ms"])
            .args(["--stats", "json", "--", "spin"])
            .output()
            .expect("run faultline")
    };
    let out = run();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(doc["stop"]["reason"], "time_limit", "{doc}");
    assert_eq!(doc["stop"]["limit_cycles"], 30_000_000, "{doc}");
    assert!(
        doc["console"]
            .as_str()
            .unwrap()
            .contains("spin: interrupts off, spinning"),
        "{doc}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Virtual time: the same limit stops it at the same point every time.
    let again: serde_json::Value = serde_json::from_slice(&run().stdout).unwrap();
    assert_eq!(doc["virtual_cycles"], again["virtual_cycles"]);
    assert_eq!(doc["instructions"], again["instructions"]);
}
