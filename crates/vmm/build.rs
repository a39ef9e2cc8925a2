//! Builds what the `faultline` binary embeds and its tests boot:
//! - the guest kernel, by `make -C guest` when `guest/Makefile` exists
//!   (embedded as the default kernel; cfg `bundled_kernel`);
//! - the hv's C test kernels (crates/hv/tests/guests), for the CLI tests.

use std::path::{Path, PathBuf};
use std::process::Command;

const TEST_KERNELS: [&str; 4] = ["hello", "smp", "triple", "outside"];

fn main() {
    println!("cargo::rustc-check-cfg=cfg(bundled_kernel)");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    let root = manifest.join("../..");
    build_guest(&root.join("guest"), &out);
    build_test_kernels(&root, &out);
}

fn build_guest(guest: &Path, out: &Path) {
    println!("cargo:rerun-if-changed={}", guest.display());
    if !guest.join("Makefile").exists() {
        return;
    }
    let build = out.join("guest");
    let status = Command::new("make")
        .arg("-C")
        .arg(guest)
        .arg(format!("BUILD={}", build.display()))
        .arg(build.join("kernel.elf"))
        // Cargo reads the build script's stdout for directives.
        .stdout(std::process::Stdio::from(std::io::stderr()))
        .status()
        .unwrap_or_else(|e| panic!("running make for the guest kernel: {e}"));
    assert!(
        status.success(),
        "building the guest kernel (make -C {}) failed",
        guest.display()
    );
    println!("cargo:rustc-cfg=bundled_kernel");
    println!(
        "cargo:rustc-env=FAULTLINE_GUEST_KERNEL={}",
        build.join("kernel.elf").display()
    );
}

fn build_test_kernels(root: &Path, out: &Path) {
    let guests = root.join("crates/hv/tests/guests");
    println!("cargo:rerun-if-changed={}", guests.display());
    for name in TEST_KERNELS {
        let status = Command::new("gcc")
            .args([
                "-O2",
                "-ffreestanding",
                "-mgeneral-regs-only",
                "-mno-red-zone",
                "-nostdlib",
                "-static",
                "-fno-pie",
                "-no-pie",
                "-fno-stack-protector",
                "-fno-asynchronous-unwind-tables",
                "-Wl,--build-id=none",
                "-Wl,--no-warn-rwx-segments",
            ])
            .arg(format!("-Wl,-T,{}", guests.join("link.ld").display()))
            .arg("-I")
            .arg(root.join("guest/include"))
            .arg("-I")
            .arg(&guests)
            .arg(guests.join(format!("{name}.c")))
            .arg("-o")
            .arg(out.join(format!("test-{name}.elf")))
            .status()
            .unwrap_or_else(|e| panic!("running gcc to build test kernel {name}: {e}"));
        assert!(status.success(), "gcc failed on test kernel {name}");
    }
}
