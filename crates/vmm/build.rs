//! Builds what the `faultline` binary embeds and its tests boot:
//! - the guest kernel, by `make -C guest` when `guest/Makefile` exists
//!   (embedded as the default kernel; cfg `bundled_kernel`), and the names
//!   of its programs, read from the program table of `guest/user/main.c`
//!   (so `faultline run` can refuse an unknown program before booting);
//! - nothing for the CLI tests: they boot the hv's C test kernels, which
//!   the hv's build script compiled and whose directory it hands over.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(bundled_kernel)");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    let root = manifest.join("../..");
    build_guest(&root.join("guest"), &out);
    build_linux_programs(&root.join("guest/linux"), &out);
    let kernels = std::env::var("DEP_FAULTLINE_HV_TEST_KERNELS_DIR")
        .expect("the hv build script reports its test-kernel directory");
    println!("cargo:rustc-env=FAULTLINE_HV_TEST_KERNELS={kernels}");
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
    println!(
        "cargo:rustc-env=FAULTLINE_GUEST_PROGRAMS={}",
        guest_programs(&guest.join("user/main.c")).join(",")
    );
    println!("cargo:rustc-cfg=bundled_kernel");
    println!(
        "cargo:rustc-env=FAULTLINE_GUEST_KERNEL={}",
        build.join("kernel.elf").display()
    );
}

/// The Linux guest's /init and programs (`guest/linux/Makefile`: static
/// executables), packed into an initramfs at run time by `--guest linux`.
fn build_linux_programs(dir: &Path, out: &Path) {
    println!("cargo::rustc-check-cfg=cfg(linux_programs)");
    println!("cargo:rerun-if-changed={}", dir.display());
    if !dir.join("Makefile").exists() {
        return;
    }
    let build = out.join("linux");
    let status = Command::new("make")
        .arg("-C")
        .arg(dir)
        .arg(format!("BUILD={}", build.display()))
        .stdout(std::process::Stdio::from(std::io::stderr()))
        .status()
        .unwrap_or_else(|e| panic!("running make for the Linux guest programs: {e}"));
    assert!(
        status.success(),
        "building the Linux guest programs (make -C {}) failed",
        dir.display()
    );
    println!("cargo:rustc-cfg=linux_programs");
    println!(
        "cargo:rustc-env=FAULTLINE_LINUX_PROGRAMS={}",
        build.display()
    );
}

/// The names in the `programs[]` table of the guest's `user/main.c`: its
/// entries look like `{"hello", hello_main},`.
fn guest_programs(main_c: &Path) -> Vec<String> {
    let source = std::fs::read_to_string(main_c)
        .unwrap_or_else(|e| panic!("reading {}: {e}", main_c.display()));
    let table = source
        .split_once("programs[] = {")
        .and_then(|(_, rest)| rest.split_once("};"))
        .map(|(table, _)| table)
        .unwrap_or_else(|| panic!("no `programs[] = {{ ... }};` table in {}", main_c.display()));
    let names: Vec<String> = table
        .lines()
        .filter_map(|line| {
            let entry = line.trim().strip_prefix("{\"")?;
            Some(entry.split_once('"')?.0.to_string())
        })
        .collect();
    assert!(
        !names.is_empty(),
        "the program table of {} lists no programs",
        main_c.display()
    );
    names
}
