//! Linux on the Intel IOMMU (`--iommu intel`): Debian's cloud kernel,
//! unmodified, finds the VT-d unit through the ACPI DMAR table, turns on
//! interrupt remapping (its IOAPIC entries, COM1's among them, go through
//! the remapping table) and queued invalidation, and runs `hello` with no
//! remapping fault. Needs the cached kernel, as `tests/linux.rs`.

mod common;
use common::{faultline, linux_image, stderr};

#[test]
fn linux_turns_on_interrupt_remapping_and_runs_hello() {
    let Some(image) = linux_image() else {
        return;
    };
    let out = faultline(&[
        "run",
        "--guest",
        "linux",
        "--kernel-image",
        image.to_str().unwrap(),
        "--vcpus",
        "2",
        "--iommu",
        "intel",
        "--stats",
        "json",
        "--wall-limit",
        "300s",
        "--",
        "hello",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["stop"]["reason"], "power_off", "{v}");
    let console = v["console"].as_str().unwrap();
    for line in [
        "DMAR: dmar0: reg_base_addr fed90000 ver 1:0",
        "DMAR-IR: IOAPIC id 0 under DRHD base  0xfed90000 IOMMU 0",
        "DMAR-IR: Enabled IRQ remapping in xapic mode",
        "DMAR: dmar0: Using Queued invalidation",
        "DMAR: Intel(R) Virtualization Technology for Directed I/O",
        "hello from Linux user space",
    ] {
        assert!(console.contains(line), "no {line:?} in:\n{console}");
    }
    for bad in ["fault", "Oops", "BUG:", "Call Trace"] {
        assert!(
            !console
                .lines()
                .any(|l| l.contains(bad) && (bad != "fault" || l.contains("DMAR"))),
            "{bad:?} in:\n{console}"
        );
    }
}
