//! `faultline run` and the platform: console input (`--console-input`),
//! power-off as a stop reason, multiboot images refused with a clear error.

mod common;
use common::{faultline, stderr, stdout};
use std::io::Write;
use std::process::{Command, Stdio};

fn kernel(name: &str) -> String {
    format!("{}/{name}.elf", env!("FAULTLINE_HV_TEST_KERNELS"))
}

#[test]
fn console_input_from_a_file_reaches_the_guest_which_powers_off() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input");
    std::fs::write(&input, "ping").unwrap();
    let k = kernel("platform");
    let args = [
        "run",
        "--vcpus",
        "2",
        "--mem",
        "16M",
        "--stats",
        "json",
        "--kernel",
        &k,
        "--console-input",
        input.to_str().unwrap(),
    ];
    let out = faultline(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["stop"]["reason"], "power_off");
    let console = v["console"].as_str().unwrap();
    assert!(console.contains("input=0x00000000676e6970"), "{console}");
    assert!(
        console.contains("madt_cpus=0x0000000000000002"),
        "{console}"
    );
    assert_eq!(faultline(&args).stdout, out.stdout, "runs repeat");
}

/// Issue 14's acceptance kernel under `faultline run --kernel` on 4 vCPUs:
/// 32-bit multiboot entry, long mode, three APs by INIT/SIPI through a
/// real-mode trampoline, xAPIC by MMIO then x2APIC, fw_cfg's CPU count,
/// COM1's input interrupt, power-off through the FADT.
#[test]
fn the_multiboot_acceptance_kernel_runs_on_four_vcpus() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input");
    std::fs::write(&input, "hello from the console\n").unwrap();
    let k = kernel("mboot");
    let args = [
        "run",
        "--vcpus",
        "4",
        "--stats",
        "json",
        "--kernel",
        &k,
        "--cmdline",
        "mboot test",
        "--console-input",
        input.to_str().unwrap(),
    ];
    let out = faultline(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["stop"]["reason"], "power_off");
    let console = v["console"].as_str().unwrap();
    for expected in [
        "cmdline=mboot test\n",
        "loader=faultline\n",
        "fw_cfg_cpus=0x0000000000000004\n",
        "aps_started=0x0000000000000003\n",
        "x2apic_ipis=0x0000000000000003\n",
        "input=hello from the console\n",
        "stage=power off\n",
    ] {
        assert!(
            console.contains(expected),
            "{expected:?} missing from {console}"
        );
    }
    assert!(!console.contains("fail="), "{console}");
    assert_eq!(faultline(&args).stdout, out.stdout, "runs repeat");
}

#[test]
fn console_input_from_stdin() {
    let k = kernel("platform");
    let mut child = Command::new(env!("CARGO_BIN_EXE_faultline"))
        .args([
            "run",
            "--mem",
            "16M",
            "--kernel",
            &k,
            "--console-input",
            "-",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"pong").unwrap();
    let out = child.wait_with_output().unwrap();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("input=0x00000000676e6f70"), "{text}");
    assert!(text.contains("power off"), "{text}");
}

#[test]
fn a_malformed_multiboot_image_is_a_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("bad.bin");
    // The magic, flags 3 and a wrong checksum.
    let words = [0x1bad_b002u32, 3, 0];
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    std::fs::write(&image, bytes).unwrap();
    let out = faultline(&["run", "--kernel", image.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("checksum"), "{}", stderr(&out));
    let out = faultline(&["run", "--console-input", "/nonexistent/x", "--", "hello"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("/nonexistent/x"), "{}", stderr(&out));
}
