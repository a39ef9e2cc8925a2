//! Compares every `machine::alu` function with the host CPU executing the
//! real instruction (via `asm!`, flags set with POPFQ and read with PUSHFQ).
//!
//! Flags (and results) the SDM defines must match exactly; any mismatch fails
//! the test. Flags the SDM leaves undefined are tallied per instruction and
//! size and printed (run with `--nocapture` to see the table); set
//! `ALU_STRICT_UNDEFINED=1` to make those mismatches fail as well (only
//! meaningful on a host of the vendor the ALU's choices follow, see alu.rs).
#![cfg(target_arch = "x86_64")]

use core::arch::asm;
use std::collections::BTreeMap;

use machine::alu::{self, rflags, BinOp, BitOp, ShiftOp, Size};
use rflags::{AF, ARITH, CF, OF, PF, SF, ZF};

const SIZES: [Size; 4] = [Size::B1, Size::B2, Size::B4, Size::B8];
const FLAG_NAMES: [(u64, &str); 6] = [
    (CF, "CF"),
    (PF, "PF"),
    (AF, "AF"),
    (ZF, "ZF"),
    (SF, "SF"),
    (OF, "OF"),
];
/// Random input tuples per function and size (besides the edge values).
const RANDOM_CASES: usize = 4000;

// ---------------------------------------------------------------------------
// Inputs.

/// xorshift64: deterministic, good enough to scatter operands.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        XorShift(seed | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// An operand of `size`, biased towards the interesting shapes (small,
    /// near the sign bit, mostly ones) as well as uniform values.
    fn operand(&mut self, size: Size) -> u64 {
        let x = self.next();
        let shaped = match self.next() % 5 {
            0 | 1 => x,
            2 => x >> (self.next() % 64),
            3 => size.sign_bit() ^ (x & 0xff),
            _ => !(x >> (self.next() % 64)),
        };
        shaped & size.mask()
    }
    /// A random subset of the arithmetic flags.
    fn arith_flags(&mut self) -> u64 {
        self.next() & ARITH
    }
}

/// Edge values of `size`: 0, 1, the sign bit and its neighbours, all ones,
/// max/min signed, nibble-carry boundaries, alternating patterns.
fn edge_values(size: Size) -> Vec<u64> {
    let mask = size.mask();
    let sign = size.sign_bit();
    let mut values: Vec<u64> = [
        0,
        1,
        2,
        3,
        0x0f,
        0x10,
        0x7f,
        0x80,
        0xff,
        sign - 1,
        sign,
        sign + 1,
        mask - 1,
        mask,
        0x5555_5555_5555_5555,
        0xaaaa_aaaa_aaaa_aaaa,
        0x0123_4567_89ab_cdef,
    ]
    .iter()
    .map(|v| v & mask)
    .collect();
    values.sort_unstable();
    values.dedup();
    values
}

/// Host input flags: the reserved bit, IF (user mode cannot clear it), and
/// the chosen arithmetic flags.
fn host_flags_in(arith: u64) -> u64 {
    rflags::FIXED1 | rflags::IF | (arith & ARITH)
}

/// What the ALU gets: the host flags plus some non-arithmetic bits the host
/// asm cannot carry safely (DF, AC, ID), which must come back unchanged.
fn alu_flags_in(arith: u64) -> u64 {
    host_flags_in(arith) | rflags::DF | rflags::AC | rflags::ID
}

// ---------------------------------------------------------------------------
// Checking.

#[derive(Debug, Clone, Copy)]
struct Outcome {
    result: u64,
    flags: u64,
}

#[derive(Default)]
struct UndefinedTally {
    matches: u64,
    total: u64,
    first_mismatch: Option<String>,
}

/// Collects defined-behaviour failures and undefined-behaviour agreement.
struct Checker {
    name: &'static str,
    failures: Vec<String>,
    failure_count: usize,
    undefined: BTreeMap<(String, &'static str), UndefinedTally>,
    strict_undefined: bool,
    comparisons: u64,
}

impl Checker {
    fn new(name: &'static str) -> Self {
        Checker {
            name,
            failures: Vec::new(),
            failure_count: 0,
            undefined: BTreeMap::new(),
            strict_undefined: std::env::var_os("ALU_STRICT_UNDEFINED").is_some_and(|v| v == "1"),
            comparisons: 0,
        }
    }

    fn fail(&mut self, message: String) {
        self.failure_count += 1;
        if self.failures.len() < 25 {
            self.failures.push(message);
        }
    }

    /// Compares one execution. `defined_flags` are the arithmetic flags the
    /// SDM defines for these inputs (including ones it leaves unaffected);
    /// the rest of ARITH is tallied as undefined. `result_defined` is false
    /// where the SDM leaves the result itself undefined.
    #[allow(clippy::too_many_arguments)]
    fn compare(
        &mut self,
        label: &str,
        inputs: &dyn Fn() -> String,
        alu_in: u64,
        host: Outcome,
        ours: Outcome,
        defined_flags: u64,
        result_defined: bool,
    ) {
        self.comparisons += 1;
        let defined_flags = defined_flags & ARITH;
        let flag_diff = (host.flags ^ ours.flags) & defined_flags;
        if flag_diff != 0 || (result_defined && host.result != ours.result) {
            self.fail(format!(
                "{label} {}: host result {:#x} flags {}, alu result {:#x} flags {} (defined flags {})",
                inputs(),
                host.result,
                flag_string(host.flags),
                ours.result,
                flag_string(ours.flags),
                flag_string(defined_flags),
            ));
        }
        if (ours.flags ^ alu_in) & !ARITH != 0 {
            self.fail(format!(
                "{label} {}: non-arithmetic flags changed: in {alu_in:#x}, out {:#x}",
                inputs(),
                ours.flags
            ));
        }
        for (flag, flag_name) in FLAG_NAMES {
            if defined_flags & flag == 0 {
                self.tally_undefined(
                    label,
                    flag_name,
                    (host.flags ^ ours.flags) & flag == 0,
                    || {
                        format!(
                            "{} host {} alu {}",
                            inputs(),
                            flag_string(host.flags),
                            flag_string(ours.flags)
                        )
                    },
                );
            }
        }
        if !result_defined {
            self.tally_undefined(label, "result", host.result == ours.result, || {
                format!(
                    "{} host {:#x} alu {:#x}",
                    inputs(),
                    host.result,
                    ours.result
                )
            });
        }
    }

    fn tally_undefined(
        &mut self,
        label: &str,
        what: &'static str,
        matched: bool,
        describe: impl FnOnce() -> String,
    ) {
        let tally = self.undefined.entry((label.to_string(), what)).or_default();
        tally.total += 1;
        if matched {
            tally.matches += 1;
        } else if tally.first_mismatch.is_none() {
            tally.first_mismatch = Some(describe());
        }
    }

    /// Prints the undefined-behaviour table and fails on any defined
    /// mismatch (or undefined one, in strict mode).
    fn finish(mut self) {
        eprintln!("== {}: {} comparisons", self.name, self.comparisons);
        let mut undefined_mismatch = Vec::new();
        for ((label, what), tally) in &self.undefined {
            let note = tally.first_mismatch.as_deref().unwrap_or("");
            eprintln!(
                "   undefined {label:<10} {what:<6} matches host {:>6}/{:<6} {note}",
                tally.matches, tally.total
            );
            if tally.matches != tally.total {
                undefined_mismatch.push(format!("{label} {what}: {note}"));
            }
        }
        if self.strict_undefined {
            for m in undefined_mismatch {
                self.fail(format!("undefined behaviour differs: {m}"));
            }
        }
        assert!(
            self.failure_count == 0,
            "{}: {} mismatches with the host, first ones:\n{}",
            self.name,
            self.failure_count,
            self.failures.join("\n")
        );
    }
}

fn flag_string(flags: u64) -> String {
    FLAG_NAMES
        .iter()
        .filter(|(f, _)| flags & f != 0)
        .map(|(_, n)| *n)
        .collect::<Vec<_>>()
        .join("|")
}

fn size_label(name: &str, size: Size) -> String {
    format!("{name}/{}", size.bits())
}

// ---------------------------------------------------------------------------
// Running instructions on the host. Each macro expands to one `asm!` per
// operand size listed; the template loads RFLAGS with POPFQ right before the
// instruction and saves them with PUSHFQ right after. The push/pop pairs are
// balanced and the asm is not `nostack`, so the compiler keeps the red zone
// free.

/// `mn d, s` with flags in and out.
macro_rules! host_rr {
    ($mn:literal, $size:expr, $dst:expr, $src:expr, $flags:expr; $($sz:ident => $m:literal),+) => {{
        let mut d: u64 = $dst;
        let s: u64 = $src;
        let mut f: u64 = $flags;
        // SAFETY: the instruction reads and writes only the registers bound
        // here and RFLAGS (whose input holds only status bits, IF and the
        // fixed bit); the stack use is balanced.
        unsafe {
            match $size {
                $(Size::$sz => asm!(
                    "push {f}",
                    "popfq",
                    concat!($mn, " {d:", $m, "}, {s:", $m, "}"),
                    "pushfq",
                    "pop {f}",
                    d = inout(reg) d,
                    s = in(reg) s,
                    f = inout(reg) f,
                ),)+
                #[allow(unreachable_patterns)]
                _ => unreachable!("{} has no {:?} form", $mn, $size),
            }
        }
        Outcome { result: d & $size.mask(), flags: f }
    }};
}

macro_rules! host_rr_all {
    ($mn:literal, $size:expr, $dst:expr, $src:expr, $flags:expr) => {
        host_rr!($mn, $size, $dst, $src, $flags; B1 => "l", B2 => "x", B4 => "e", B8 => "r")
    };
}

/// `mn d` with flags in and out.
macro_rules! host_r {
    ($mn:literal, $size:expr, $dst:expr, $flags:expr) => {{
        let mut d: u64 = $dst;
        let mut f: u64 = $flags;
        // SAFETY: as in `host_rr`.
        unsafe {
            match $size {
                Size::B1 => asm!("push {f}", "popfq", concat!($mn, " {d:l}"), "pushfq", "pop {f}",
                    d = inout(reg) d, f = inout(reg) f),
                Size::B2 => asm!("push {f}", "popfq", concat!($mn, " {d:x}"), "pushfq", "pop {f}",
                    d = inout(reg) d, f = inout(reg) f),
                Size::B4 => asm!("push {f}", "popfq", concat!($mn, " {d:e}"), "pushfq", "pop {f}",
                    d = inout(reg) d, f = inout(reg) f),
                Size::B8 => asm!("push {f}", "popfq", concat!($mn, " {d:r}"), "pushfq", "pop {f}",
                    d = inout(reg) d, f = inout(reg) f),
            }
        }
        Outcome { result: d & $size.mask(), flags: f }
    }};
}

/// `mn d, cl` with flags in and out.
macro_rules! host_r_cl {
    ($mn:literal, $size:expr, $dst:expr, $count:expr, $flags:expr) => {{
        let mut d: u64 = $dst;
        let c: u8 = $count;
        let mut f: u64 = $flags;
        // SAFETY: as in `host_rr`.
        unsafe {
            match $size {
                Size::B1 => asm!("push {f}", "popfq", concat!($mn, " {d:l}, cl"), "pushfq", "pop {f}",
                    d = inout(reg) d, in("cl") c, f = inout(reg) f),
                Size::B2 => asm!("push {f}", "popfq", concat!($mn, " {d:x}, cl"), "pushfq", "pop {f}",
                    d = inout(reg) d, in("cl") c, f = inout(reg) f),
                Size::B4 => asm!("push {f}", "popfq", concat!($mn, " {d:e}, cl"), "pushfq", "pop {f}",
                    d = inout(reg) d, in("cl") c, f = inout(reg) f),
                Size::B8 => asm!("push {f}", "popfq", concat!($mn, " {d:r}, cl"), "pushfq", "pop {f}",
                    d = inout(reg) d, in("cl") c, f = inout(reg) f),
            }
        }
        Outcome { result: d & $size.mask(), flags: f }
    }};
}

/// `mn d, s, cl` (SHLD/SHRD; no 8-bit form) with flags in and out.
macro_rules! host_rr_cl {
    ($mn:literal, $size:expr, $dst:expr, $src:expr, $count:expr, $flags:expr) => {{
        let mut d: u64 = $dst;
        let s: u64 = $src;
        let c: u8 = $count;
        let mut f: u64 = $flags;
        // SAFETY: as in `host_rr`.
        unsafe {
            match $size {
                Size::B1 => unreachable!("{} has no 8-bit form", $mn),
                Size::B2 => asm!("push {f}", "popfq", concat!($mn, " {d:x}, {s:x}, cl"), "pushfq",
                    "pop {f}", d = inout(reg) d, s = in(reg) s, in("cl") c, f = inout(reg) f),
                Size::B4 => asm!("push {f}", "popfq", concat!($mn, " {d:e}, {s:e}, cl"), "pushfq",
                    "pop {f}", d = inout(reg) d, s = in(reg) s, in("cl") c, f = inout(reg) f),
                Size::B8 => asm!("push {f}", "popfq", concat!($mn, " {d:r}, {s:r}, cl"), "pushfq",
                    "pop {f}", d = inout(reg) d, s = in(reg) s, in("cl") c, f = inout(reg) f),
            }
        }
        Outcome { result: d & $size.mask(), flags: f }
    }};
}

/// One-operand MUL/IMUL: returns (low, high, flags).
macro_rules! host_widening_mul {
    ($mn:literal, $size:expr, $a:expr, $b:expr, $flags:expr) => {{
        let mut a: u64 = $a;
        let b: u64 = $b;
        let mut d: u64 = 0;
        let mut f: u64 = $flags;
        // SAFETY: as in `host_rr`; the instruction also writes RAX and RDX,
        // both bound.
        unsafe {
            match $size {
                Size::B1 => asm!("push {f}", "popfq", concat!($mn, " {b:l}"), "pushfq", "pop {f}",
                    b = in(reg) b, f = inout(reg) f, inout("rax") a, inout("rdx") d),
                Size::B2 => asm!("push {f}", "popfq", concat!($mn, " {b:x}"), "pushfq", "pop {f}",
                    b = in(reg) b, f = inout(reg) f, inout("rax") a, inout("rdx") d),
                Size::B4 => asm!("push {f}", "popfq", concat!($mn, " {b:e}"), "pushfq", "pop {f}",
                    b = in(reg) b, f = inout(reg) f, inout("rax") a, inout("rdx") d),
                Size::B8 => asm!("push {f}", "popfq", concat!($mn, " {b:r}"), "pushfq", "pop {f}",
                    b = in(reg) b, f = inout(reg) f, inout("rax") a, inout("rdx") d),
            }
        }
        match $size {
            Size::B1 => (a & 0xff, (a >> 8) & 0xff, f),
            _ => (a & $size.mask(), d & $size.mask(), f),
        }
    }};
}

/// One-operand DIV/IDIV: returns (quotient, remainder). The caller must
/// know the division does not fault.
macro_rules! host_divide {
    ($mn:literal, $size:expr, $high:expr, $low:expr, $divisor:expr) => {{
        let (high, low): (u64, u64) = ($high, $low);
        let divisor: u64 = $divisor;
        let (mut a, mut d) = match $size {
            Size::B1 => (((high & 0xff) << 8) | (low & 0xff), 0),
            _ => (low, high),
        };
        // SAFETY: the caller checked the division does not raise #DE; the
        // instruction only writes RAX, RDX and flags.
        unsafe {
            match $size {
                Size::B1 => asm!(concat!($mn, " {v:l}"), v = in(reg) divisor,
                    inout("rax") a, inout("rdx") d),
                Size::B2 => asm!(concat!($mn, " {v:x}"), v = in(reg) divisor,
                    inout("rax") a, inout("rdx") d),
                Size::B4 => asm!(concat!($mn, " {v:e}"), v = in(reg) divisor,
                    inout("rax") a, inout("rdx") d),
                Size::B8 => asm!(concat!($mn, " {v:r}"), v = in(reg) divisor,
                    inout("rax") a, inout("rdx") d),
            }
        }
        match $size {
            Size::B1 => (a & 0xff, (a >> 8) & 0xff),
            _ => (a & $size.mask(), d & $size.mask()),
        }
    }};
}

// ---------------------------------------------------------------------------
// Tests.

#[test]
fn host_cpu_identification() {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "model name: unknown".to_owned());
    eprintln!(
        "host {model}; lzcnt {} bmi1(tzcnt) {} popcnt {}",
        std::is_x86_feature_detected!("lzcnt"),
        std::is_x86_feature_detected!("bmi1"),
        std::is_x86_feature_detected!("popcnt"),
    );
}

fn run_host_binop(op: BinOp, size: Size, dst: u64, src: u64, flags: u64) -> Outcome {
    match op {
        BinOp::Add => host_rr_all!("add", size, dst, src, flags),
        BinOp::Or => host_rr_all!("or", size, dst, src, flags),
        BinOp::Adc => host_rr_all!("adc", size, dst, src, flags),
        BinOp::Sbb => host_rr_all!("sbb", size, dst, src, flags),
        BinOp::And => host_rr_all!("and", size, dst, src, flags),
        BinOp::Sub => host_rr_all!("sub", size, dst, src, flags),
        BinOp::Xor => host_rr_all!("xor", size, dst, src, flags),
        BinOp::Cmp => {
            // CMP leaves dst alone; its "result" is the SUB difference.
            let cmp = host_rr_all!("cmp", size, dst, src, flags);
            assert_eq!(cmp.result, dst & size.mask());
            let sub = host_rr_all!("sub", size, dst, src, flags);
            Outcome {
                result: sub.result,
                flags: cmp.flags,
            }
        }
    }
}

#[test]
fn binop_matches_host() {
    let ops = [
        BinOp::Add,
        BinOp::Or,
        BinOp::Adc,
        BinOp::Sbb,
        BinOp::And,
        BinOp::Sub,
        BinOp::Xor,
        BinOp::Cmp,
    ];
    let mut checker = Checker::new("binop");
    let mut rng = XorShift::new(0x0b1e_5eed);
    for size in SIZES {
        let edges = edge_values(size);
        for op in ops {
            let label = size_label(&format!("{op:?}").to_lowercase(), size);
            let defined = match op {
                BinOp::And | BinOp::Or | BinOp::Xor => ARITH & !AF,
                _ => ARITH,
            };
            let run = |checker: &mut Checker, dst: u64, src: u64, arith: u64| {
                let host = run_host_binop(op, size, dst, src, host_flags_in(arith));
                let alu_in = alu_flags_in(arith);
                let (result, flags) = alu::binop(op, size, dst, src, alu_in);
                checker.compare(
                    &label,
                    &|| format!("dst {dst:#x} src {src:#x} in {}", flag_string(arith)),
                    alu_in,
                    host,
                    Outcome { result, flags },
                    defined,
                    true,
                );
            };
            for &dst in &edges {
                for &src in &edges {
                    for arith in [0, ARITH] {
                        run(&mut checker, dst, src, arith);
                    }
                }
            }
            for _ in 0..RANDOM_CASES {
                let (dst, src, arith) = (rng.operand(size), rng.operand(size), rng.arith_flags());
                run(&mut checker, dst, src, arith);
            }
        }
    }
    checker.finish();
}

#[test]
fn test_inc_dec_neg_match_host() {
    let mut checker = Checker::new("test/inc/dec/neg");
    let mut rng = XorShift::new(0x1dec);
    for size in SIZES {
        let edges = edge_values(size);
        let mut inputs: Vec<(u64, u64, u64)> = Vec::new();
        for &a in &edges {
            for &b in &edges {
                inputs.push((a, b, 0));
                inputs.push((a, b, ARITH));
            }
        }
        for _ in 0..RANDOM_CASES {
            inputs.push((rng.operand(size), rng.operand(size), rng.arith_flags()));
        }
        let labels = ["test", "inc", "dec", "neg"].map(|n| size_label(n, size));
        for &(a, b, arith) in &inputs {
            let alu_in = alu_flags_in(arith);
            let host_in = host_flags_in(arith);
            let describe = || format!("a {a:#x} b {b:#x} in {}", flag_string(arith));

            let host = host_rr_all!("test", size, a, b, host_in);
            let flags = alu::test(size, a, b, alu_in);
            let ours = Outcome { result: a, flags };
            checker.compare(&labels[0], &describe, alu_in, host, ours, ARITH & !AF, true);

            let host = host_r!("inc", size, a, host_in);
            let (result, flags) = alu::inc(size, a, alu_in);
            let ours = Outcome { result, flags };
            checker.compare(&labels[1], &describe, alu_in, host, ours, ARITH, true);

            let host = host_r!("dec", size, a, host_in);
            let (result, flags) = alu::dec(size, a, alu_in);
            let ours = Outcome { result, flags };
            checker.compare(&labels[2], &describe, alu_in, host, ours, ARITH, true);

            let host = host_r!("neg", size, a, host_in);
            let (result, flags) = alu::neg(size, a, alu_in);
            let ours = Outcome { result, flags };
            checker.compare(&labels[3], &describe, alu_in, host, ours, ARITH, true);
        }
    }
    checker.finish();
}

fn run_host_shift(op: ShiftOp, size: Size, v: u64, count: u8, flags: u64) -> Outcome {
    match op {
        ShiftOp::Rol => host_r_cl!("rol", size, v, count, flags),
        ShiftOp::Ror => host_r_cl!("ror", size, v, count, flags),
        ShiftOp::Rcl => host_r_cl!("rcl", size, v, count, flags),
        ShiftOp::Rcr => host_r_cl!("rcr", size, v, count, flags),
        ShiftOp::Shl => host_r_cl!("shl", size, v, count, flags),
        ShiftOp::Shr => host_r_cl!("shr", size, v, count, flags),
        ShiftOp::Sal => host_r_cl!("sal", size, v, count, flags),
        ShiftOp::Sar => host_r_cl!("sar", size, v, count, flags),
    }
}

/// The arithmetic flags the SDM defines for a shift/rotate by the raw
/// `count` (unaffected flags count as defined).
fn shift_defined_flags(op: ShiftOp, size: Size, count: u8) -> u64 {
    let masked = u32::from(count) & if size == Size::B8 { 0x3f } else { 0x1f };
    if masked == 0 {
        return ARITH;
    }
    let of = if masked == 1 { OF } else { 0 };
    match op {
        ShiftOp::Rol | ShiftOp::Ror | ShiftOp::Rcl | ShiftOp::Rcr => ARITH & !OF | of,
        ShiftOp::Shl | ShiftOp::Sal | ShiftOp::Shr => {
            let cf = if masked < size.bits() { CF } else { 0 };
            SF | ZF | PF | cf | of
        }
        ShiftOp::Sar => SF | ZF | PF | CF | of,
    }
}

#[test]
fn shifts_match_host() {
    let ops = [
        ShiftOp::Rol,
        ShiftOp::Ror,
        ShiftOp::Rcl,
        ShiftOp::Rcr,
        ShiftOp::Shl,
        ShiftOp::Shr,
        ShiftOp::Sal,
        ShiftOp::Sar,
    ];
    let mut checker = Checker::new("shift");
    let mut rng = XorShift::new(0x5417);
    for size in SIZES {
        let mut values = edge_values(size);
        for _ in 0..8 {
            values.push(rng.operand(size));
        }
        for op in ops {
            let label = size_label(&format!("{op:?}").to_lowercase(), size);
            let run = |checker: &mut Checker, v: u64, count: u8, arith: u64| {
                let host = run_host_shift(op, size, v, count, host_flags_in(arith));
                let alu_in = alu_flags_in(arith);
                let (result, flags) = alu::shift(op, size, v, count, alu_in);
                checker.compare(
                    &label,
                    &|| format!("v {v:#x} count {count} in {}", flag_string(arith)),
                    alu_in,
                    host,
                    Outcome { result, flags },
                    shift_defined_flags(op, size, count),
                    true,
                );
            };
            // Every raw count byte, both carries, on edge and a few random
            // values; then random values with random counts and flags.
            for &v in &values {
                for count in 0..=255u8 {
                    for arith in [0, ARITH] {
                        run(&mut checker, v, count, arith);
                    }
                }
            }
            for _ in 0..RANDOM_CASES {
                let (v, count, arith) = (rng.operand(size), rng.next() as u8, rng.arith_flags());
                run(&mut checker, v, count, arith);
            }
        }
    }
    checker.finish();
}

#[test]
fn double_shifts_match_host() {
    let mut checker = Checker::new("shld/shrd");
    let mut rng = XorShift::new(0xd0b1e);
    for size in [Size::B2, Size::B4, Size::B8] {
        let mut values = edge_values(size);
        for _ in 0..4 {
            values.push(rng.operand(size));
        }
        let labels = [size_label("shld", size), size_label("shrd", size)];
        let run = |checker: &mut Checker, dst: u64, src: u64, count: u8, arith: u64| {
            let masked = u32::from(count) & if size == Size::B8 { 0x3f } else { 0x1f };
            // A count above the operand size (16-bit only) leaves the result
            // and all flags undefined; otherwise AF, and OF unless the count
            // is 1, are undefined.
            let (defined, result_defined) = match masked {
                0 => (ARITH, true),
                1 => (ARITH & !AF, true),
                c if c <= size.bits() => (CF | SF | ZF | PF, true),
                _ => (0, false),
            };
            let host_in = host_flags_in(arith);
            let alu_in = alu_flags_in(arith);
            let describe = || {
                format!(
                    "dst {dst:#x} src {src:#x} count {count} in {}",
                    flag_string(arith)
                )
            };
            let host = host_rr_cl!("shld", size, dst, src, count, host_in);
            let (result, flags) = alu::shld(size, dst, src, count, alu_in);
            let ours = Outcome { result, flags };
            checker.compare(
                &labels[0],
                &describe,
                alu_in,
                host,
                ours,
                defined,
                result_defined,
            );
            let host = host_rr_cl!("shrd", size, dst, src, count, host_in);
            let (result, flags) = alu::shrd(size, dst, src, count, alu_in);
            let ours = Outcome { result, flags };
            checker.compare(
                &labels[1],
                &describe,
                alu_in,
                host,
                ours,
                defined,
                result_defined,
            );
        };
        for &dst in &values {
            for &src in &values {
                for count in 0..=255u8 {
                    run(&mut checker, dst, src, count, rng.arith_flags());
                }
            }
        }
        for _ in 0..RANDOM_CASES {
            let (dst, src) = (rng.operand(size), rng.operand(size));
            run(&mut checker, dst, src, rng.next() as u8, rng.arith_flags());
        }
    }
    checker.finish();
}

#[test]
fn mul_imul_match_host() {
    let mut checker = Checker::new("mul/imul");
    let mut rng = XorShift::new(0x3417);
    for size in SIZES {
        let edges = edge_values(size);
        let mut inputs: Vec<(u64, u64, u64)> = Vec::new();
        for &a in &edges {
            for &b in &edges {
                inputs.push((a, b, rng.arith_flags()));
            }
        }
        for _ in 0..RANDOM_CASES {
            inputs.push((rng.operand(size), rng.operand(size), rng.arith_flags()));
        }
        let labels = ["mul", "imul", "imul2"].map(|n| size_label(n, size));
        for &(a, b, arith) in &inputs {
            let alu_in = alu_flags_in(arith);
            let host_in = host_flags_in(arith);
            let describe = || format!("a {a:#x} b {b:#x} in {}", flag_string(arith));

            let (low, high, host_flags) = host_widening_mul!("mul", size, a, b, host_in);
            let (our_low, our_high, flags) = alu::mul(size, a, b, alu_in);
            if our_high != high {
                checker.fail(format!(
                    "{} {}: high {our_high:#x}, host {high:#x}",
                    labels[0],
                    describe()
                ));
            }
            let host = Outcome {
                result: low,
                flags: host_flags,
            };
            let ours = Outcome {
                result: our_low,
                flags,
            };
            checker.compare(&labels[0], &describe, alu_in, host, ours, CF | OF, true);

            let (low, high, host_flags) = host_widening_mul!("imul", size, a, b, host_in);
            let (our_low, our_high, flags) = alu::imul(size, a, b, alu_in);
            if our_high != high {
                checker.fail(format!(
                    "{} {}: high {our_high:#x}, host {high:#x}",
                    labels[1],
                    describe()
                ));
            }
            let host = Outcome {
                result: low,
                flags: host_flags,
            };
            let ours = Outcome {
                result: our_low,
                flags,
            };
            checker.compare(&labels[1], &describe, alu_in, host, ours, CF | OF, true);

            // The two-operand form (no 8-bit encoding) shares `alu::imul`.
            if size != Size::B1 {
                let host = host_rr!("imul", size, a, b, host_in; B2 => "x", B4 => "e", B8 => "r");
                checker.compare(&labels[2], &describe, alu_in, host, ours, CF | OF, true);
            }
        }
    }
    checker.finish();
}

/// Reference division in 128-bit arithmetic, independent of `alu`: `None`
/// when the hardware raises #DE.
fn reference_divide(
    signed: bool,
    size: Size,
    high: u64,
    low: u64,
    divisor: u64,
) -> Option<(u64, u64)> {
    let bits = size.bits();
    let mask = size.mask();
    if signed {
        let dividend = (i128::from(size.sign_extend(high) as i64) << bits) | i128::from(low & mask);
        let divisor = i128::from(size.sign_extend(divisor) as i64);
        if divisor == 0 {
            return None;
        }
        let q = dividend.checked_div(divisor)?;
        let r = dividend % divisor;
        let limit = 1i128 << (bits - 1);
        (-limit..limit)
            .contains(&q)
            .then_some((q as u64 & mask, r as u64 & mask))
    } else {
        let dividend = (u128::from(high & mask) << bits) | u128::from(low & mask);
        let divisor = u128::from(divisor & mask);
        if divisor == 0 {
            return None;
        }
        let q = dividend / divisor;
        (q <= u128::from(mask)).then_some((q as u64, (dividend % divisor) as u64))
    }
}

#[test]
fn div_idiv_match_host() {
    let mut checker = Checker::new("div/idiv");
    let mut rng = XorShift::new(0xd1d1);
    let mut faults = [0u64; 2];
    for size in SIZES {
        let edges = edge_values(size);
        let mut inputs: Vec<(u64, u64, u64)> = Vec::new();
        for &high in &edges {
            for &low in &edges {
                for &divisor in &edges {
                    inputs.push((high, low, divisor));
                }
            }
        }
        for _ in 0..RANDOM_CASES {
            let divisor = rng.operand(size);
            // Keep `high` mostly below the divisor (in magnitude) so most
            // cases divide rather than fault.
            let high = match rng.next() % 4 {
                0 => rng.operand(size),
                1 => 0,
                2 => size.mask(),
                _ => rng.next() % divisor.max(1),
            };
            inputs.push((high & size.mask(), rng.operand(size), divisor));
        }
        for &(high, low, divisor) in &inputs {
            let describe = || format!("{high:#x}:{low:#x} / {divisor:#x} (size {})", size.bits());
            for signed in [false, true] {
                let ours = if signed {
                    alu::idiv(size, high, low, divisor)
                } else {
                    alu::div(size, high, low, divisor)
                };
                let reference = reference_divide(signed, size, high, low, divisor);
                let Some(expected) = reference else {
                    faults[usize::from(signed)] += 1;
                    if ours.is_some() {
                        checker.fail(format!(
                            "signed {signed} {}: expected #DE, got {ours:x?}",
                            describe()
                        ));
                    }
                    continue;
                };
                let host = if signed {
                    host_divide!("idiv", size, high, low, divisor)
                } else {
                    host_divide!("div", size, high, low, divisor)
                };
                checker.comparisons += 1;
                if host != expected || ours != Some(host) {
                    checker.fail(format!(
                        "signed {signed} {}: host {host:x?} reference {expected:x?} alu {ours:x?}",
                        describe()
                    ));
                }
            }
        }
    }
    eprintln!("   #DE cases checked: div {} idiv {}", faults[0], faults[1]);
    checker.finish();
}

#[test]
fn divide_error_cases() {
    for size in SIZES {
        let min = size.sign_bit();
        let minus_one = size.mask();
        assert_eq!(alu::div(size, 0, 5, 0), None, "div by zero");
        assert_eq!(alu::idiv(size, 0, 5, 0), None, "idiv by zero");
        // INT_MIN / -1, the dividend sign-extended into `high`; by 1 it fits.
        assert_eq!(
            alu::idiv(size, minus_one, min, minus_one),
            None,
            "INT_MIN / -1"
        );
        assert_eq!(alu::idiv(size, minus_one, min, 1), Some((min, 0)));
        // Unsigned quotient overflow exactly when high >= divisor.
        assert_eq!(alu::div(size, 3, 0, 3), None);
        let (q, r) = alu::div(size, 2, 1, 3).expect("2:1 / 3 fits");
        assert_eq!(
            u128::from(q) * 3 + u128::from(r),
            (2u128 << size.bits()) + 1
        );
        assert!(r < 3);
        // Signed: -2^n / 2 gives the most negative quotient; / -2 overflows.
        assert_eq!(alu::idiv(size, minus_one, 0, 2), Some((min, 0)));
        assert_eq!(alu::idiv(size, minus_one, 0, minus_one - 1), None);
        assert_eq!(alu::idiv(size, 0, min, 1), None, "+2^(n-1) overflows");
        // The remainder takes the dividend's sign: -7 / 2 = -3 rem -1.
        let minus_seven = size.mask() - 6;
        assert_eq!(
            alu::idiv(size, minus_one, minus_seven, 2),
            Some((size.mask() - 2, minus_one))
        );
    }
    // 128-bit dividends: i128::MIN / -1 must not panic.
    assert_eq!(alu::idiv(Size::B8, 1 << 63, 0, u64::MAX), None);
    assert_eq!(
        alu::div(Size::B8, u64::MAX - 1, u64::MAX, u64::MAX),
        Some((u64::MAX, u64::MAX - 1))
    );
}

#[test]
fn bit_test_matches_host() {
    let mut checker = Checker::new("bt*");
    let mut rng = XorShift::new(0xb175);
    for size in [Size::B2, Size::B4, Size::B8] {
        let mut inputs: Vec<(u64, u32, u64)> = Vec::new();
        for v in edge_values(size) {
            for bit in 0..size.bits() {
                inputs.push((v, bit, rng.arith_flags()));
            }
        }
        for _ in 0..RANDOM_CASES {
            inputs.push((
                rng.operand(size),
                rng.next() as u32 % size.bits(),
                rng.arith_flags(),
            ));
        }
        let labels = ["bt", "bts", "btr", "btc"].map(|n| size_label(n, size));
        for &(v, bit, arith) in &inputs {
            let alu_in = alu_flags_in(arith);
            let host_in = host_flags_in(arith);
            let describe = || format!("v {v:#x} bit {bit} in {}", flag_string(arith));
            let b = u64::from(bit);
            let cases = [
                (
                    BitOp::Bt,
                    host_rr!("bt", size, v, b, host_in; B2 => "x", B4 => "e", B8 => "r"),
                ),
                (
                    BitOp::Bts,
                    host_rr!("bts", size, v, b, host_in; B2 => "x", B4 => "e", B8 => "r"),
                ),
                (
                    BitOp::Btr,
                    host_rr!("btr", size, v, b, host_in; B2 => "x", B4 => "e", B8 => "r"),
                ),
                (
                    BitOp::Btc,
                    host_rr!("btc", size, v, b, host_in; B2 => "x", B4 => "e", B8 => "r"),
                ),
            ];
            for (i, (op, host)) in cases.into_iter().enumerate() {
                let (result, flags) = alu::bit_test(op, size, v, bit, alu_in);
                let ours = Outcome { result, flags };
                checker.compare(&labels[i], &describe, alu_in, host, ours, CF | ZF, true);
            }
        }
    }
    checker.finish();
}

#[test]
fn bit_scans_and_counts_match_host() {
    let has_lzcnt = std::is_x86_feature_detected!("lzcnt");
    let has_tzcnt = std::is_x86_feature_detected!("bmi1");
    let has_popcnt = std::is_x86_feature_detected!("popcnt");
    if !(has_lzcnt && has_tzcnt && has_popcnt) {
        eprintln!(
            "skipping host comparison of: lzcnt {has_lzcnt} tzcnt {has_tzcnt} popcnt {has_popcnt}"
        );
    }
    let mut checker = Checker::new("bsf/bsr/tzcnt/lzcnt/popcnt");
    let mut rng = XorShift::new(0xb5f);
    for size in [Size::B2, Size::B4, Size::B8] {
        let mut inputs: Vec<(u64, u64, u64)> = Vec::new();
        for v in edge_values(size) {
            inputs.push((v, rng.next(), rng.arith_flags()));
        }
        for bit in 0..size.bits() {
            inputs.push((1 << bit, rng.next(), rng.arith_flags()));
            inputs.push((
                size.mask() << bit & size.mask(),
                rng.next(),
                rng.arith_flags(),
            ));
        }
        for _ in 0..RANDOM_CASES {
            inputs.push((rng.operand(size), rng.next(), rng.arith_flags()));
        }
        let labels = ["bsf", "bsr", "tzcnt", "lzcnt", "popcnt"].map(|n| size_label(n, size));
        for &(src, old_dst, arith) in &inputs {
            let alu_in = alu_flags_in(arith);
            let host_in = host_flags_in(arith);
            let describe = || {
                format!(
                    "src {src:#x} old dst {old_dst:#x} in {}",
                    flag_string(arith)
                )
            };

            let host =
                host_rr!("bsf", size, old_dst, src, host_in; B2 => "x", B4 => "e", B8 => "r");
            let (result, flags) = alu::bsf(size, src, old_dst, alu_in);
            checker.compare(
                &labels[0],
                &describe,
                alu_in,
                host,
                Outcome { result, flags },
                ZF,
                true,
            );

            let host =
                host_rr!("bsr", size, old_dst, src, host_in; B2 => "x", B4 => "e", B8 => "r");
            let (result, flags) = alu::bsr(size, src, old_dst, alu_in);
            checker.compare(
                &labels[1],
                &describe,
                alu_in,
                host,
                Outcome { result, flags },
                ZF,
                true,
            );

            if has_tzcnt {
                let host =
                    host_rr!("tzcnt", size, old_dst, src, host_in; B2 => "x", B4 => "e", B8 => "r");
                let (result, flags) = alu::tzcnt(size, src, alu_in);
                let ours = Outcome { result, flags };
                checker.compare(&labels[2], &describe, alu_in, host, ours, CF | ZF, true);
            }
            if has_lzcnt {
                let host =
                    host_rr!("lzcnt", size, old_dst, src, host_in; B2 => "x", B4 => "e", B8 => "r");
                let (result, flags) = alu::lzcnt(size, src, alu_in);
                let ours = Outcome { result, flags };
                checker.compare(&labels[3], &describe, alu_in, host, ours, CF | ZF, true);
            }
            if has_popcnt {
                let host = host_rr!("popcnt", size, old_dst, src, host_in; B2 => "x", B4 => "e", B8 => "r");
                let (result, flags) = alu::popcnt(size, src, alu_in);
                let ours = Outcome { result, flags };
                checker.compare(&labels[4], &describe, alu_in, host, ours, ARITH, true);
            }
        }
    }
    checker.finish();
}

#[test]
fn bswap_matches_host() {
    let mut rng = XorShift::new(0xb5a9);
    let mut values = edge_values(Size::B8);
    values.extend((0..RANDOM_CASES).map(|_| rng.next()));
    for v in values {
        let mut r64 = v;
        let mut r32 = v;
        let mut r16 = v;
        // SAFETY: BSWAP only rewrites its register operand. The 16-bit form
        // (66 0F C8, `bswap ax`) is encoded by hand as assemblers refuse it.
        unsafe {
            asm!("bswap {r}", r = inout(reg) r64);
            asm!("bswap {r:e}", r = inout(reg) r32);
            asm!(".byte 0x66, 0x0f, 0xc8", inout("rax") r16);
        }
        assert_eq!(alu::bswap(Size::B8, v), r64, "bswap64 {v:#x}");
        assert_eq!(alu::bswap(Size::B4, v), r32, "bswap32 {v:#x}");
        assert_eq!(alu::bswap(Size::B2, v), r16 & 0xffff, "bswap16 {v:#x}");
    }
}

/// SETcc on the host for condition code `cc`.
fn host_condition(cc: u8, flags: u64) -> bool {
    macro_rules! setcc {
        ($mn:literal) => {{
            let mut out: u64 = 0;
            // SAFETY: SETcc writes only the bound register; POPFQ loads
            // status flags, IF and the fixed bit; the stack use is balanced.
            unsafe {
                asm!("push {f}", "popfq", concat!($mn, " {o:l}"), f = in(reg) flags,
                    o = inout(reg) out);
            }
            out & 1 != 0
        }};
    }
    match cc & 15 {
        0 => setcc!("seto"),
        1 => setcc!("setno"),
        2 => setcc!("setb"),
        3 => setcc!("setae"),
        4 => setcc!("sete"),
        5 => setcc!("setne"),
        6 => setcc!("setbe"),
        7 => setcc!("seta"),
        8 => setcc!("sets"),
        9 => setcc!("setns"),
        10 => setcc!("setp"),
        11 => setcc!("setnp"),
        12 => setcc!("setl"),
        13 => setcc!("setge"),
        14 => setcc!("setle"),
        _ => setcc!("setg"),
    }
}

#[test]
fn conditions_match_host_setcc() {
    // Every combination of the six arithmetic flags.
    for combo in 0..64u64 {
        let arith = FLAG_NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| combo >> i & 1 != 0)
            .fold(0, |acc, (_, (flag, _))| acc | flag);
        for cc in 0..16u8 {
            let host = host_condition(cc, host_flags_in(arith));
            assert_eq!(
                alu::condition(cc, alu_flags_in(arith)),
                host,
                "cc {cc} flags {}",
                flag_string(arith)
            );
            // Only the low nibble counts.
            assert_eq!(alu::condition(cc | 0xf0, alu_flags_in(arith)), host);
        }
    }
}
