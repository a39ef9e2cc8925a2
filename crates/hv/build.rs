//! Compiles the hv's C test kernels (tests/guests/*.c) with the host gcc
//! and the guest's flags, into OUT_DIR/<name>.elf for the integration tests.

use std::path::{Path, PathBuf};
use std::process::Command;

const KERNELS: [&str; 12] = [
    "hello",
    "smp",
    "triple",
    "outside",
    "apfabi",
    "kvmclock",
    "platform",
    "dirtywrite",
    "steal",
    "pveoi",
    "nmi",
    "iommu",
];
/// The hostile-guest suite (tests/guests/hostile/NAME.c -> hostile-NAME.elf);
/// `exits` is the guest of the exit-handler fuzz target (fuzz/).
const HOSTILE: [&str; 7] = ["msr", "hypercall", "ports", "wild", "smc", "spin", "exits"];
/// The MMU correctness kernels (tests/guests/mmu/SOURCE.c -> NAME.elf, with
/// extra gcc flags): the access matrix (and its per-case log variant) and
/// the random-mutation guest (with a second seed, and variants that flush
/// before every access or leave out required flushes), and both with the
/// paravirtual CR3 cache compiled in.
const MMU: [(&str, &str, &[&str]); 8] = [
    ("matrix", "mmu-matrix", &[]),
    ("matrix", "mmu-matrix-log", &["-DCASE_LOG"]),
    ("random", "mmu-random", &[]),
    (
        "random",
        "mmu-random-seed2",
        &["-DSEED=0x2b992ddfa23249d6ull"],
    ),
    ("random", "mmu-random-paranoid", &["-DPARANOID"]),
    ("random", "mmu-random-skip-flushes", &["-DSKIP_FLUSHES"]),
    // Both switching address spaces through the paravirtual CR3 cache
    // where the hv offers it (shadow paging with the cache on).
    ("matrix", "mmu-matrix-cr3-cache", &["-DCR3_CACHE"]),
    ("random", "mmu-random-cr3-cache", &["-DCR3_CACHE"]),
];

/// Kernels built from several sources with a link script of their own
/// (tests/guests/DIR/{*.S,*.c} with DIR/link.ld -> NAME.elf): the multiboot
/// acceptance kernel, which starts in 32-bit mode at 1 MiB, and the S3
/// kernel.
const MULTI_SOURCE: [(&str, &str, &[&str]); 2] = [
    ("mboot", "mboot", &["boot.S", "main.c"]),
    // ACPI S3 and resume (32-bit, no C).
    ("s3", "s3", &["boot.S"]),
];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    let guests = manifest.join("tests/guests");
    let include = manifest.join("../../guest/include");
    println!("cargo:rerun-if-changed={}", guests.display());
    println!("cargo:rerun-if-changed={}", include.display());
    // Dependents (the vmm's CLI tests) read this as DEP_..._DIR.
    println!("cargo:dir={}", out.display());
    let no_flags: &[&str] = &[];
    let kernels = KERNELS
        .iter()
        .map(|k| (format!("{k}.c"), k.to_string(), no_flags));
    let hostile = HOSTILE
        .iter()
        .map(|k| (format!("hostile/{k}.c"), format!("hostile-{k}"), no_flags));
    let mmu = MMU
        .iter()
        .map(|&(src, name, flags)| (format!("mmu/{src}.c"), name.to_string(), flags));
    for (source, name, flags) in kernels.chain(hostile).chain(mmu) {
        let src = guests.join(source);
        let elf = out.join(format!("{name}.elf"));
        gcc(
            &guests,
            &include,
            &guests.join("link.ld"),
            flags,
            &[src],
            &elf,
        );
    }
    for (dir, name, sources) in MULTI_SOURCE {
        let dir = guests.join(dir);
        let sources: Vec<PathBuf> = sources.iter().map(|s| dir.join(s)).collect();
        let elf = out.join(format!("{name}.elf"));
        gcc(
            &guests,
            &include,
            &dir.join("link.ld"),
            no_flags,
            &sources,
            &elf,
        );
    }
}

/// Compiles and links one test kernel with the guest's flags.
fn gcc(
    guests: &Path,
    include: &Path,
    link_script: &Path,
    flags: &[&str],
    sources: &[PathBuf],
    elf: &Path,
) {
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
        .arg(format!("-Wl,-T,{}", link_script.display()))
        .arg("-I")
        .arg(include)
        .arg("-I")
        .arg(guests)
        .args(flags)
        .args(sources)
        .arg("-o")
        .arg(elf)
        .status()
        .unwrap_or_else(|e| panic!("running gcc to build {}: {e}", elf.display()));
    assert!(status.success(), "gcc failed on {sources:?}");
}
