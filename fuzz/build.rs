//! Compiles the exit-handler fuzz target's guest kernel (guests/exits.c)
//! with the flags of the hv's test kernels.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    let guests = manifest.join("guests");
    let hv_guests = manifest.join("../crates/hv/tests/guests");
    println!("cargo:rerun-if-changed={}", guests.display());
    println!("cargo:rerun-if-changed={}", hv_guests.display());
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
            "-Wall",
            "-Werror",
            "-Wl,--build-id=none",
            "-Wl,--no-warn-rwx-segments",
        ])
        .arg(format!("-Wl,-T,{}", hv_guests.join("link.ld").display()))
        .arg("-I")
        .arg(manifest.join("../guest/include"))
        .arg("-I")
        .arg(&hv_guests)
        .arg("-I")
        .arg(hv_guests.join("hostile"))
        .arg(guests.join("exits.c"))
        .arg("-o")
        .arg(out.join("exits.elf"))
        .status()
        .expect("running gcc");
    assert!(status.success(), "gcc failed on guests/exits.c");
}
