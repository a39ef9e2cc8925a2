//! `faultline run --device edu --iommu intel`: the options reach the
//! platform (the hv's iommu test kernel finds the devices and uses them),
//! bad values and combinations are refused before anything runs.

mod common;
use common::{faultline, stderr, stdout};

fn kernel(name: &str) -> String {
    format!("{}/{name}.elf", env!("FAULTLINE_HV_TEST_KERNELS"))
}

#[test]
fn the_devices_are_there_only_when_asked_for() {
    let k = kernel("iommu");
    let out = faultline(&[
        "run", "--mem", "16M", "--kernel", &k, "--device", "edu", "--iommu", "intel",
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}{}", stderr(&out));
    assert!(text.contains("edu_ids=0x0000000011e81234"), "{text}");
    assert!(text.contains("dma_word=0x0000000012345678"), "{text}");
    assert!(text.contains("msi_irqs=0x0000000000000001"), "{text}");
    // Without them: no PCI bus (configuration reads float high).
    let out = faultline(&["run", "--mem", "16M", "--kernel", &k, "--wall-limit", "10s"]);
    let text = stdout(&out);
    assert!(text.contains("host_bridge=0x00000000ffffffff"), "{text}");
}

#[test]
fn bad_values_and_snapshots_with_the_devices_are_refused_before_boot() {
    // Refused before boot: the file is never written.
    let snap = std::env::temp_dir().join("faultline-devices-test.snap");
    let snap = snap.to_str().expect("utf-8");
    let out = faultline(&["run", "--device", "e1000", "--", "hello"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("invalid value 'e1000'"),
        "{}",
        stderr(&out)
    );
    let out = faultline(&["run", "--iommu", "amd", "--", "hello"]);
    assert_eq!(out.status.code(), Some(2));
    let out = faultline(&[
        "run",
        "--device",
        "edu",
        "--snapshot-at",
        "1ms",
        "--snapshot",
        snap,
        "--",
        "hello",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot be snapshotted or migrated"),
        "{}",
        stderr(&out)
    );
}
