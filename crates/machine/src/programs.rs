//! The bare-mode test programs of `guest-tests/`, built by `build.rs` with
//! the host gcc and embedded as ELF images.
//!
//! Each program writes to COM1 and stops through the isa-debug-exit port:
//! value 0 (status 1) means success. See `guest-tests/rt.h` for the
//! conventions and [`crate::bare`] for the machine they run on.

/// Prints "hello from the machine\n" and exits with value 0.
pub const HELLO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hello.elf"));
/// Self-checking test of exception delivery (#DE, #UD, #BP, #GP, #PF).
pub const EXCEPTIONS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/exceptions.elf"));
/// Self-checking test of ring 3, SYSCALL/SYSRET and user-mode faults.
pub const USERMODE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/usermode.elf"));
/// Self-checking test of the x2APIC timer, TPR and self-IPIs.
pub const TIMER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/timer.elf"));
/// Self-checking test of string instructions and locked atomics.
pub const STRINGOPS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/stringops.elf"));
/// Self-checking test of 16-bit real mode and the way down to it from long
/// mode and back (compatibility mode, paging off, 16-bit protected mode).
pub const REALMODE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/realmode.elf"));
/// The `mips` benchmark workload (a few hundred million instructions);
/// prints `mips_workload checksum <16 hex digits>`.
pub const MIPS_WORKLOAD: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mips_workload.elf"));
/// One round of the same workload (~1/12 of it), for tests.
pub const MIPS_WORKLOAD_SMALL: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/mips_workload_small.elf"));

/// Floating point and auto-vectorised loops built with SSE on at -O2;
/// prints results (doubles through its own formatter) and "fpmath done".
pub const FPMATH_O2: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fpmath_o2.elf"));
/// The same program at -O3 (more vectorisation).
pub const FPMATH_O3: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fpmath_o3.elf"));
/// long double arithmetic in the x87 unit (-O2, default flags); prints
/// long doubles through its own formatter and "x87math done".
pub const X87MATH: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/x87math.elf"));

/// Every program with its name.
pub const ALL: &[(&str, &[u8])] = &[
    ("hello", HELLO),
    ("exceptions", EXCEPTIONS),
    ("usermode", USERMODE),
    ("timer", TIMER),
    ("stringops", STRINGOPS),
    ("realmode", REALMODE),
    ("mips_workload", MIPS_WORKLOAD),
    ("mips_workload_small", MIPS_WORKLOAD_SMALL),
    ("fpmath_o2", FPMATH_O2),
    ("fpmath_o3", FPMATH_O3),
    ("x87math", X87MATH),
];

/// The self-checking system tests (exit value 0 on success).
pub const SYSTEM_TESTS: &[(&str, &[u8])] = &[
    ("exceptions", EXCEPTIONS),
    ("usermode", USERMODE),
    ("timer", TIMER),
    ("stringops", STRINGOPS),
    ("realmode", REALMODE),
];

/// Looks a program up by name.
pub fn by_name(name: &str) -> Option<&'static [u8]> {
    ALL.iter()
        .find(|(n, _)| *n == name)
        .map(|(_, bytes)| *bytes)
}
