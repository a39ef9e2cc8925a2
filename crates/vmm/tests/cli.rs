//! The `faultline` command line, run as a process on the hv's test kernels.

mod common;
use common::faultline;

fn kernel(name: &str) -> String {
    format!("{}/{name}.elf", env!("FAULTLINE_HV_TEST_KERNELS"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn runs_a_kernel_prints_its_output_then_the_summary() {
    let k = kernel("hello");
    let out = faultline(&[
        "run", "--mem", "64M", "--seed", "7", "--kernel", &k, "--", "hello", "x",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some((0x21 << 1) | 1), "{stdout}");
    assert!(stdout.contains("cmdline=seed=7 -- hello x\n"), "{stdout}");
    let summary = stdout.find("--- faultline summary ---").expect("summary");
    assert!(stdout.find("hello from the guest").unwrap() < summary);
    assert!(stdout.contains("virtual time: "), "{stdout}");
    assert!(stdout.contains("EPT faults:"), "{stdout}");
    assert!(stdout.contains("vcpu 0 "), "{stdout}");
    assert!(stdout.contains("test=hello value=42"), "{stdout}");
    // Not a terminal: no progress lines on stderr.
    assert!(!text(&out.stderr).contains("[faultline]"));
}

#[test]
fn json_stats_and_deterministic_output() {
    let k = kernel("smp");
    let args = [
        "run", "--vcpus", "3", "--mem", "32M", "--stats", "json", "--kernel", &k, "--", "smp",
    ];
    let a = faultline(&args);
    let b = faultline(&args);
    assert_eq!(a.stdout, b.stdout, "same config, same output and counts");
    let v: serde_json::Value =
        serde_json::from_slice(&a.stdout).expect("stdout is one JSON document");
    assert_eq!(v["stop"]["reason"], "debug_exit");
    assert_eq!(v["stop"]["status"], v["exit_status"]);
    assert!(
        v["console"].as_str().unwrap().contains("all 3 cpus up"),
        "{v}"
    );
    assert_eq!(v["vcpus"].as_array().unwrap().len(), 3);
    assert!(v["instructions"].as_u64().unwrap() > 100);
    assert_eq!(v["exits"]["ipi"]["count"], 2);
}

#[test]
fn guest_triple_fault_is_reported_and_the_process_exits_cleanly() {
    let out = faultline(&[
        "run",
        "--mem",
        "16M",
        "--kernel",
        &kernel("triple"),
        "--",
        "x",
    ]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("VM stopped: vCPU 0: triple fault at rip 0x"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(text(&out.stdout).contains("stopped:      error: vCPU 0: triple fault"));
}

#[test]
fn guest_write_outside_memory_is_reported_and_the_process_exits_cleanly() {
    // The stop is --strict-mmio's (the default drops unassigned writes).
    let out = faultline(&[
        "run",
        "--strict-mmio",
        "--mem",
        "16M",
        "--kernel",
        &kernel("outside"),
        "--",
        "x",
    ]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("guest access outside its memory at gpa 0x9000000, rip 0x"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn missing_or_malformed_kernels_are_clear_errors() {
    let out = faultline(&["run", "--kernel", "/nonexistent/kernel.elf", "--", "x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot read --kernel /nonexistent/kernel.elf"));
    let out = faultline(&[
        "run",
        "--kernel",
        concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
        "--",
        "x",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("not an ELF file"),
        "{}",
        text(&out.stderr)
    );
    let out = faultline(&[
        "run",
        "--mem",
        "3M",
        "--kernel",
        &kernel("hello"),
        "--",
        "x",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("multiple of 2 MiB"),
        "{}",
        text(&out.stderr)
    );
    let out = faultline(&["run", "--mem", "lots", "--", "x"]);
    assert_eq!(out.status.code(), Some(2));
    let out = faultline(&["run"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "the bundled kernel needs a program"
    );
    // A kernel of one's own needs none: its command line is its own
    // business (multiboot kernels take `--cmdline`).
    let out = faultline(&["run", "--kernel", &kernel("hello")]);
    assert_ne!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

/// `--cost-profile` sets its entries as `--cost` would, and a `--cost`
/// after it wins.
#[cfg(bundled_kernel)]
#[test]
fn a_cost_profile_is_the_same_as_its_cost_options() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("slow-zero.profile");
    std::fs::write(
        &path,
        "# a slow page clear\nzero_4k=6000\nline_transfer=300 # far cores\n",
    )
    .unwrap();
    let profile = path.to_str().unwrap();
    let cycles = |extra: &[&str]| -> u64 {
        let mut args = vec!["run", "--stats", "json"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "hello"]);
        let out = faultline(&args);
        assert_eq!(out.status.code(), Some(0));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["virtual_cycles"].as_u64().unwrap()
    };
    let default = cycles(&[]);
    let with_profile = cycles(&["--cost-profile", profile]);
    let with_costs = cycles(&["--cost", "zero_4k=6000", "--cost", "line_transfer=300"]);
    assert_ne!(with_profile, default);
    assert_eq!(with_profile, with_costs);
    let overridden = cycles(&[
        "--cost-profile",
        profile,
        "--cost",
        "zero_4k=600",
        "--cost",
        "line_transfer=110",
    ]);
    assert_eq!(overridden, default);

    std::fs::write(&path, "zero_4k=1\nzero_4k=2\n").unwrap();
    let out = faultline(&["run", "--cost-profile", profile, "--", "hello"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2: `zero_4k` is set twice"), "{err}");
}
