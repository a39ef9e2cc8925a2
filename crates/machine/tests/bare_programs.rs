//! Runs the C test programs of `guest-tests/` on the machine, in bare mode
//! and in guest mode under EPT, and checks their output and exit status.
//!
//! The system tests check themselves and exit with value 0 only if every
//! check passed; their serial output (which names each failed check) is
//! shown when they fail.

use machine::bare::page_tables::PageSize;
use machine::bare::{BareConfig, BareMachine, Mode, RunOutput};
use machine::programs;
use std::process::Command;

fn config(mode: Mode, page_size: PageSize) -> BareConfig {
    BareConfig {
        mode,
        page_size,
        // Generous, but turns a runaway program into a failure.
        max_cycles: Some(20_000_000_000),
        ..BareConfig::default()
    }
}

fn run(name: &str, elf: &[u8], mode: Mode, page_size: PageSize) -> RunOutput {
    match BareMachine::run_elf(config(mode, page_size), elf) {
        Ok(out) => out,
        Err(e) => panic!("{name} ({mode:?}, {} pages): {e}", page_size.name()),
    }
}

/// Runs a self-checking program and asserts it reported success.
fn assert_passes(name: &str, elf: &[u8], mode: Mode, page_size: PageSize) {
    let out = run(name, elf, mode, page_size);
    let serial = String::from_utf8_lossy(&out.serial);
    assert!(
        out.exit.success(),
        "{name} ({mode:?}, {} pages) exited with value {:#x} (status {}); serial output:\n{serial}",
        page_size.name(),
        out.exit.value,
        out.exit.status()
    );
    assert!(
        serial.contains(&format!("{name}: ")) && serial.contains(" checks, 0 failed"),
        "{name}: no summary line in:\n{serial}"
    );
}

#[test]
fn hello_prints_its_line_and_exits_with_status_1() {
    for (mode, page_size) in [
        (Mode::Bare, PageSize::Size2M),
        (Mode::Bare, PageSize::Size4K),
        (Mode::GuestEpt, PageSize::Size2M),
    ] {
        let out = run("hello", programs::HELLO, mode, page_size);
        assert_eq!(
            String::from_utf8_lossy(&out.serial),
            "hello from the machine\n",
            "{mode:?}"
        );
        assert_eq!(out.exit.value, 0);
        assert_eq!(out.exit.status(), 1);
        assert!(out.stats.cpu.instructions > 0);
        // One exit per polled line-status read and per byte, plus the exit.
        let io_exits = 2 * 23 + 1;
        assert_eq!(out.stats.exits.get("io"), Some(&io_exits), "{mode:?}");
        if mode == Mode::GuestEpt {
            assert!(out.stats.cpu.vm_exits >= io_exits);
        }
    }
}

#[test]
fn exceptions_test_passes() {
    assert_passes(
        "exceptions",
        programs::EXCEPTIONS,
        Mode::Bare,
        PageSize::Size2M,
    );
    assert_passes(
        "exceptions",
        programs::EXCEPTIONS,
        Mode::Bare,
        PageSize::Size4K,
    );
}

#[test]
fn usermode_test_passes() {
    assert_passes("usermode", programs::USERMODE, Mode::Bare, PageSize::Size2M);
    assert_passes("usermode", programs::USERMODE, Mode::Bare, PageSize::Size4K);
}

#[test]
fn timer_test_passes() {
    assert_passes("timer", programs::TIMER, Mode::Bare, PageSize::Size2M);
}

#[test]
fn stringops_test_passes() {
    assert_passes(
        "stringops",
        programs::STRINGOPS,
        Mode::Bare,
        PageSize::Size2M,
    );
}

#[test]
fn realmode_test_passes() {
    for page_size in [PageSize::Size2M, PageSize::Size4K] {
        assert_passes("realmode", programs::REALMODE, Mode::Bare, page_size);
    }
}

#[test]
fn system_tests_pass_in_guest_mode_under_ept() {
    for (name, elf) in programs::SYSTEM_TESTS {
        assert_passes(name, elf, Mode::GuestEpt, PageSize::Size4K);
    }
}

/// The checksum line of a native build of the workload.
fn native_checksum(host_binary: &str) -> String {
    let out = Command::new(host_binary)
        .output()
        .unwrap_or_else(|e| panic!("running {host_binary}: {e}"));
    assert!(out.status.success(), "{host_binary} failed: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn assert_workload_matches_native(name: &str, elf: &[u8], host_binary: &str, mode: Mode) {
    let out = run(name, elf, mode, PageSize::Size4K);
    assert!(
        out.exit.success(),
        "{name} exited with {:#x}",
        out.exit.value
    );
    let machine = String::from_utf8_lossy(&out.serial);
    let native = native_checksum(host_binary);
    assert!(native.starts_with("mips_workload checksum "), "{native}");
    assert_eq!(
        machine, native,
        "{name} ({mode:?}): machine vs native checksum"
    );
}

#[test]
fn small_workload_checksum_matches_the_native_cpu() {
    let host = concat!(env!("OUT_DIR"), "/mips_workload_small_host");
    for mode in [Mode::Bare, Mode::GuestEpt] {
        assert_workload_matches_native(
            "mips_workload_small",
            programs::MIPS_WORKLOAD_SMALL,
            host,
            mode,
        );
    }
}

/// The full benchmark workload: a few hundred million instructions, slow
/// in the dev profile. Run with `cargo test --release -- --ignored`.
#[test]
#[ignore]
fn full_workload_checksum_matches_the_native_cpu() {
    let host = concat!(env!("OUT_DIR"), "/mips_workload_host");
    assert_workload_matches_native("mips_workload", programs::MIPS_WORKLOAD, host, Mode::Bare);
}

/// Runs `elf` on the machine and `host` natively; their outputs must be
/// identical.
fn assert_output_matches_native(name: &str, elf: &[u8], host: &str, mode: Mode) {
    let out = run(name, elf, mode, PageSize::Size2M);
    let serial = String::from_utf8_lossy(&out.serial).into_owned();
    assert!(
        out.exit.success(),
        "{name} ({mode:?}) exited with value {:#x}; serial output:\n{serial}",
        out.exit.value
    );
    let native = Command::new(host)
        .output()
        .unwrap_or_else(|e| panic!("running {host}: {e}"));
    assert!(native.status.success(), "{host}: {:?}", native.status);
    let native = String::from_utf8_lossy(&native.stdout);
    assert!(native.ends_with(" done\n"), "{host}: {native}");
    assert_eq!(
        serial, native,
        "{name} ({mode:?}): machine vs native output"
    );
}

#[test]
fn sse_floating_point_program_matches_the_native_cpu() {
    // gcc's default code generation (SSE2: scalar double arithmetic,
    // conversions, vectorised loops at -O3) and a printf of doubles.
    let o2 = concat!(env!("OUT_DIR"), "/fpmath_o2_host");
    let o3 = concat!(env!("OUT_DIR"), "/fpmath_o3_host");
    assert_output_matches_native("fpmath_o2", programs::FPMATH_O2, o2, Mode::Bare);
    assert_output_matches_native("fpmath_o3", programs::FPMATH_O3, o3, Mode::Bare);
    assert_output_matches_native("fpmath_o3", programs::FPMATH_O3, o3, Mode::GuestEpt);
}

#[test]
fn x87_long_double_program_matches_the_native_cpu() {
    // long double in the x87 unit: loads and stores of every width,
    // integer conversions under FLDCW, compares, FCMOV, rounding modes,
    // FSQRT/FPREM/FSCALE/FXAM, and a formatter computing in long double.
    let host = concat!(env!("OUT_DIR"), "/x87math_host");
    assert_output_matches_native("x87math", programs::X87MATH, host, Mode::Bare);
    assert_output_matches_native("x87math", programs::X87MATH, host, Mode::GuestEpt);
}
