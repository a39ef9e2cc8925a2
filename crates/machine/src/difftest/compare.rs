//! Comparing a native run with an interpreter run, and reporting.

use super::gen::Case;
use super::layout::window_addr;
use super::{FinalState, Stop, GPR_NAMES};
use crate::cpu::fpu_state::FpuState;
use crate::cpu::state::rflags;
use std::fmt::Write as _;

/// One way the two runs differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Difference {
    /// They stopped differently (finished vs fault, or different faults).
    Stop { native: Stop, interp: Stop },
    /// They stopped at different instructions.
    Rip { native: u64, interp: u64 },
    /// A register differs in its compared bits `mask`.
    Gpr {
        index: usize,
        native: u64,
        interp: u64,
        mask: u64,
    },
    /// RFLAGS differ in the compared bits `mask`.
    Rflags { native: u64, interp: u64, mask: u64 },
    /// A window byte differs.
    Memory { addr: u64, native: u8, interp: u8 },
    /// An x87/SSE register differs (`name`: xmm3, mxcsr, st2, fsw, ...).
    Fpu {
        name: String,
        native: u128,
        interp: u128,
    },
    /// The translator (`jit` engine) ended differently from the
    /// interpreter: `what` (a register, `rflags`, `cycles`, `memory`...)
    /// with both values. The engines must agree on everything.
    Engines {
        what: String,
        interp: String,
        jit: String,
    },
}

/// The compared x87/SSE fields: XMM0-15, MXCSR, the x87 control, status
/// and abridged tag words and the eight physical x87 registers. The last
/// instruction and data pointers are not: AMD processors save them only
/// while an exception is pending.
fn fpu_fields(f: &FpuState) -> Vec<(String, u128)> {
    let mut v: Vec<(String, u128)> = (0..16).map(|i| (format!("xmm{i}"), f.xmm[i])).collect();
    v.push(("mxcsr".into(), f.mxcsr as u128));
    v.push(("fcw".into(), f.fcw as u128));
    v.push(("fsw".into(), f.fsw as u128));
    v.push(("ftw".into(), f.ftw as u128));
    for (i, r) in f.st.iter().enumerate() {
        v.push((format!("r{i}"), *r));
    }
    v
}

/// Compares the runs of `case`. Registers and flags are compared in the
/// bits defined where the runs stopped; memory in full.
pub fn compare(case: &Case, native: &FinalState, interp: &FinalState) -> Vec<Difference> {
    let mut diffs = Vec::new();
    let same_stop = match (&native.stop, &interp.stop) {
        (Stop::Finished, Stop::Finished) => true,
        (Stop::Fault { kind: a, .. }, Stop::Fault { kind: b, .. }) => a == b,
        _ => false,
    };
    if !same_stop {
        diffs.push(Difference::Stop {
            native: native.stop.clone(),
            interp: interp.stop.clone(),
        });
        // Registers of runs that stopped in different ways are not
        // comparable; where each stopped is the useful part.
        if native.rip != interp.rip && !matches!(interp.stop, Stop::Abnormal(_)) {
            diffs.push(Difference::Rip {
                native: native.rip,
                interp: interp.rip,
            });
        }
        return diffs;
    }
    if native.rip != interp.rip {
        diffs.push(Difference::Rip {
            native: native.rip,
            interp: interp.rip,
        });
    }
    // Registers are compared where the native run stopped.
    let defined = case.defined_at(native.rip, native.stop == Stop::Finished);
    let faulting_string = match native.stop {
        Stop::Fault { .. } => repeated_string_at(case, native.rip),
        _ => None,
    };
    for index in 0..16 {
        let mut mask = defined.compared_bits(index);
        if let Some(string) = faulting_string {
            if string.addr32 && matches!(index, 1 | 6 | 7) {
                // A fault inside a repeated string instruction with a
                // 32-bit address size: Intel has cleared bits 63:32 of
                // RCX/RSI/RDI already (even before the first iteration
                // completes), AMD not: vendor-specific, not compared.
                mask &= 0xffff_ffff;
            }
        }
        if (native.gpr[index] ^ interp.gpr[index]) & mask != 0 {
            diffs.push(Difference::Gpr {
                index,
                native: native.gpr[index],
                interp: interp.gpr[index],
                mask,
            });
        }
    }
    let mut mask = defined.compared_flags();
    if faulting_string.is_some_and(|string| string.compare) {
        // A fault inside REPE/REPNE CMPS/SCAS after some iterations: AMD
        // leaves the flags of the last completed compare, the Intel host
        // of session 6 the flags from before the instruction (RSI, RDI
        // and RCX show the progress on both): vendor-specific, not
        // compared.
        mask &= !(rflags::CF | rflags::PF | rflags::AF | rflags::ZF | rflags::SF | rflags::OF);
    }
    if (native.rflags ^ interp.rflags) & mask != 0 {
        diffs.push(Difference::Rflags {
            native: native.rflags,
            interp: interp.rflags,
            mask,
        });
    }
    for ((name, a), (_, b)) in fpu_fields(&native.fpu)
        .into_iter()
        .zip(fpu_fields(&interp.fpu))
    {
        if a != b {
            diffs.push(Difference::Fpu {
                name,
                native: a,
                interp: b,
            });
        }
    }
    for (offset, (a, b)) in native.window.iter().zip(interp.window.iter()).enumerate() {
        if a != b {
            diffs.push(Difference::Memory {
                addr: window_addr(offset),
                native: *a,
                interp: *b,
            });
        }
    }
    diffs
}

/// Names of the set flags among `bits`.
pub fn flag_names(bits: u64) -> String {
    const NAMES: [(u64, &str); 7] = [
        (rflags::CF, "CF"),
        (rflags::PF, "PF"),
        (rflags::AF, "AF"),
        (rflags::ZF, "ZF"),
        (rflags::SF, "SF"),
        (rflags::OF, "OF"),
        (rflags::DF, "DF"),
    ];
    let names: Vec<&str> = NAMES
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| *n)
        .collect();
    if names.is_empty() {
        "-".into()
    } else {
        names.join(" ")
    }
}

/// At most this many differing memory bytes are listed.
const MAX_MEMORY_LINES: usize = 32;

/// A human-readable report of a mismatching case.
pub fn text_report(
    case: &Case,
    native: &FinalState,
    interp: &FinalState,
    diffs: &[Difference],
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "case {} (seed {}): MISMATCH", case.index, case.seed);
    let _ = writeln!(s, "  code:");
    for (addr, bytes, text) in case.disassembly() {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let _ = writeln!(s, "    {addr:08x}  {hex:<30} {text}");
    }
    let _ = writeln!(s, "  initial state:");
    for row in 0..4 {
        let line: Vec<String> = (0..4)
            .map(|c| {
                let i = row * 4 + c;
                format!("{:>3}={:016x}", GPR_NAMES[i], case.initial.gpr[i])
            })
            .collect();
        let _ = writeln!(s, "    {}", line.join(" "));
    }
    let _ = writeln!(
        s,
        "    rflags={:#x} [{}]",
        case.initial.rflags,
        flag_names(case.initial.rflags)
    );
    let fpu = &case.initial.fpu;
    if *fpu != FpuState::default() {
        let _ = writeln!(s, "    mxcsr={:#x}", fpu.mxcsr);
        for (k, x) in fpu.xmm.iter().enumerate() {
            let _ = writeln!(s, "    xmm{k}={x:032x}");
        }
        let _ = writeln!(
            s,
            "    fcw={:#06x} fsw={:#06x} ftw={:#04x}",
            fpu.fcw, fpu.fsw, fpu.ftw
        );
        for (k, r) in fpu.st.iter().enumerate() {
            let _ = writeln!(s, "    r{k}={r:020x}");
        }
    }
    let _ = writeln!(s, "  native: {} at {:#x}", native.stop, native.rip);
    let _ = writeln!(s, "  interp: {} at {:#x}", interp.stop, interp.rip);
    let mut memory_lines = 0;
    for d in diffs {
        match d {
            Difference::Stop { .. } => {}
            Difference::Rip { native, interp } => {
                let _ = writeln!(s, "  rip: native={native:#x} interp={interp:#x}");
            }
            Difference::Gpr {
                index,
                native,
                interp,
                mask,
            } => {
                let _ = write!(
                    s,
                    "  {}: native={native:016x} interp={interp:016x} differ={:016x}",
                    GPR_NAMES[*index],
                    (native ^ interp) & mask
                );
                if *mask != u64::MAX {
                    let _ = write!(s, " (compared bits {mask:016x})");
                }
                let _ = writeln!(s);
            }
            Difference::Rflags {
                native,
                interp,
                mask,
            } => {
                let _ = writeln!(
                    s,
                    "  rflags: native={native:#x} [{}] interp={interp:#x} [{}] differ: {} (compared: {})",
                    flag_names(*native & mask),
                    flag_names(*interp & mask),
                    flag_names((native ^ interp) & mask),
                    flag_names(*mask)
                );
            }
            Difference::Fpu {
                name,
                native,
                interp,
            } => {
                let _ = writeln!(s, "  {name}: native={native:032x} interp={interp:032x}");
            }
            Difference::Engines { what, interp, jit } => {
                let _ = writeln!(s, "  engines, {what}: interp={interp} jit={jit}");
            }
            Difference::Memory {
                addr,
                native,
                interp,
            } => {
                memory_lines += 1;
                if memory_lines <= MAX_MEMORY_LINES {
                    let _ = writeln!(
                        s,
                        "  mem {addr:#x}: native={native:02x} interp={interp:02x}"
                    );
                }
            }
        }
    }
    if memory_lines > MAX_MEMORY_LINES {
        let _ = writeln!(
            s,
            "  ... {} more differing bytes",
            memory_lines - MAX_MEMORY_LINES
        );
    }
    s
}

/// Escapes a string for JSON.
fn json_string(v: &str) -> String {
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(s, "\\u{:04x}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

fn json_hex(v: u64) -> String {
    format!("\"{v:#x}\"")
}

fn json_state(state: &FinalState) -> String {
    let gprs: Vec<String> = (0..16)
        .map(|i| format!("{}:{}", json_string(GPR_NAMES[i]), json_hex(state.gpr[i])))
        .collect();
    format!(
        "{{\"stop\":{},\"rip\":{},\"rflags\":{},\"gpr\":{{{}}}}}",
        json_string(&state.stop.to_string()),
        json_hex(state.rip),
        json_hex(state.rflags),
        gprs.join(",")
    )
}

/// One JSON object (a single line) describing a mismatching case.
pub fn json_report(
    case: &Case,
    native: &FinalState,
    interp: &FinalState,
    diffs: &[Difference],
) -> String {
    let code: Vec<String> = case
        .disassembly()
        .into_iter()
        .map(|(addr, bytes, text)| {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            format!(
                "{{\"addr\":{},\"bytes\":{},\"asm\":{}}}",
                json_hex(addr),
                json_string(&hex),
                json_string(&text)
            )
        })
        .collect();
    let initial: Vec<String> = (0..16)
        .map(|i| {
            format!(
                "{}:{}",
                json_string(GPR_NAMES[i]),
                json_hex(case.initial.gpr[i])
            )
        })
        .collect();
    let differences: Vec<String> = diffs
        .iter()
        .map(|d| match d {
            Difference::Stop { native, interp } => format!(
                "{{\"kind\":\"stop\",\"native\":{},\"interp\":{}}}",
                json_string(&native.to_string()),
                json_string(&interp.to_string())
            ),
            Difference::Rip { native, interp } => format!(
                "{{\"kind\":\"rip\",\"native\":{},\"interp\":{}}}",
                json_hex(*native),
                json_hex(*interp)
            ),
            Difference::Gpr {
                index,
                native,
                interp,
                mask,
            } => format!(
                "{{\"kind\":\"gpr\",\"reg\":{},\"native\":{},\"interp\":{},\"mask\":{}}}",
                json_string(GPR_NAMES[*index]),
                json_hex(*native),
                json_hex(*interp),
                json_hex(*mask)
            ),
            Difference::Rflags {
                native,
                interp,
                mask,
            } => format!(
                "{{\"kind\":\"rflags\",\"native\":{},\"interp\":{},\"mask\":{},\"differ\":{}}}",
                json_hex(*native),
                json_hex(*interp),
                json_hex(*mask),
                json_string(&flag_names((native ^ interp) & mask))
            ),
            Difference::Fpu {
                name,
                native,
                interp,
            } => format!(
                "{{\"kind\":\"fpu\",\"reg\":{},\"native\":\"{native:#x}\",\"interp\":\"{interp:#x}\"}}",
                json_string(name)
            ),
            Difference::Engines { what, interp, jit } => format!(
                "{{\"kind\":\"engines\",\"what\":{},\"interp\":{},\"jit\":{}}}",
                json_string(what),
                json_string(interp),
                json_string(jit)
            ),
            Difference::Memory {
                addr,
                native,
                interp,
            } => format!(
                "{{\"kind\":\"memory\",\"addr\":{},\"native\":{},\"interp\":{}}}",
                json_hex(*addr),
                native,
                interp
            ),
        })
        .collect();
    format!(
        "{{\"case\":{},\"seed\":{},\"code\":[{}],\"initial\":{{\"gpr\":{{{}}},\"rflags\":{}}},\"native\":{},\"interp\":{},\"differences\":[{}]}}",
        case.index,
        case.seed,
        code.join(","),
        initial.join(","),
        json_hex(case.initial.rflags),
        json_state(native),
        json_state(interp),
        differences.join(",")
    )
}

/// Compares the two engines' runs of one case: everything must be equal
/// (every register and RFLAGS bit, the window, the stop, virtual cycles,
/// retired instructions and the TLB's counters).
pub fn compare_engines(
    interp: &super::interp::EngineRun,
    jit: &super::interp::EngineRun,
) -> Vec<Difference> {
    let mut diffs = Vec::new();
    let mut differ = |what: &str, a: String, b: String| {
        if a != b {
            diffs.push(Difference::Engines {
                what: what.into(),
                interp: a,
                jit: b,
            });
        }
    };
    let (a, b) = (&interp.state, &jit.state);
    differ("stop", a.stop.to_string(), b.stop.to_string());
    differ("rip", format!("{:#x}", a.rip), format!("{:#x}", b.rip));
    for (i, name) in GPR_NAMES.iter().enumerate() {
        differ(name, format!("{:#x}", a.gpr[i]), format!("{:#x}", b.gpr[i]));
    }
    differ(
        "rflags",
        format!("{:#x}", a.rflags),
        format!("{:#x}", b.rflags),
    );
    if let Some(k) = (0..a.window.len().min(b.window.len())).find(|&k| a.window[k] != b.window[k]) {
        differ(
            "memory (first differing window byte)",
            format!("[{k:#x}]={:#04x}", a.window[k]),
            format!("[{k:#x}]={:#04x}", b.window[k]),
        );
    }
    differ("fpu", format!("{:?}", a.fpu), format!("{:?}", b.fpu));
    differ("cycles", interp.cycles.to_string(), jit.cycles.to_string());
    differ(
        "instructions",
        interp.instructions.to_string(),
        jit.instructions.to_string(),
    );
    differ("tlb", format!("{:?}", interp.tlb), format!("{:?}", jit.tlb));
    diffs
}

#[cfg(test)]
mod tests {
    use super::super::gen::{generate_case, GenConfig};
    use super::super::FaultKind;
    use super::*;

    fn finished(case: &Case) -> FinalState {
        FinalState {
            stop: Stop::Finished,
            rip: super::super::layout::CODE_ADDR + case.code.len() as u64,
            gpr: case.initial.gpr,
            rflags: case.initial.rflags,
            window: case.initial.window.clone(),
            fpu: case.initial.fpu,
        }
    }

    #[test]
    fn identical_runs_do_not_differ_and_each_field_is_compared() {
        let case = generate_case(1, 0, &GenConfig::for_host());
        let a = finished(&case);
        assert!(compare(&case, &a, &a).is_empty());

        let mut b = a.clone();
        b.gpr[3] ^= 1 << 40;
        b.window[5] ^= 0xff;
        let diffs = compare(&case, &a, &b);
        assert!(diffs
            .iter()
            .any(|d| matches!(d, Difference::Gpr { index: 3, .. })));
        assert!(diffs.iter().any(
            |d| matches!(d, Difference::Memory { native, interp, .. } if native ^ interp == 0xff)
        ));

        let mut c = a.clone();
        c.stop = Stop::Fault {
            kind: FaultKind::DivideError,
            raw: 0,
            address: None,
        };
        assert!(matches!(compare(&case, &a, &c)[0], Difference::Stop { .. }));
        let report = text_report(&case, &a, &b, &diffs);
        assert!(report.contains("MISMATCH") && report.contains("rbx"));
        let json = json_report(&case, &a, &b, &diffs);
        assert!(json.starts_with("{\"case\":0") && !json.contains('\n'));
    }

    #[test]
    fn undefined_flags_are_masked() {
        let case = generate_case(1, 0, &GenConfig::for_host());
        let mut end = case.clone();
        end.end.undefined_flags = rflags::AF;
        let a = finished(&end);
        let mut b = a.clone();
        b.rflags ^= rflags::AF;
        assert!(compare(&end, &a, &b).is_empty());
        b.rflags ^= rflags::CF;
        assert_eq!(compare(&end, &a, &b).len(), 1);
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
    }
}

/// A repeated string instruction, as far as the comparison cares.
#[derive(Debug, Clone, Copy)]
struct RepeatedString {
    /// CMPS or SCAS (they write the flags).
    compare: bool,
    /// ESI/EDI addressing in 64-bit mode.
    addr32: bool,
}

/// The repeated string instruction of `case` at `rip`, if that is one.
fn repeated_string_at(case: &Case, rip: u64) -> Option<RepeatedString> {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind};
    let offset = rip.checked_sub(super::layout::CODE_ADDR)?;
    let bytes = case.code.get(offset as usize..)?;
    let bitness = if case.group == super::gen::Group::C32 {
        32
    } else {
        64
    };
    let instr = Decoder::with_ip(bitness, bytes, rip, DecoderOptions::NONE).decode();
    if !(instr.has_rep_prefix() || instr.has_repne_prefix()) || !instr.is_string_instruction() {
        return None;
    }
    let compare = matches!(
        instr.mnemonic(),
        Mnemonic::Cmpsb
            | Mnemonic::Cmpsw
            | Mnemonic::Cmpsd
            | Mnemonic::Cmpsq
            | Mnemonic::Scasb
            | Mnemonic::Scasw
            | Mnemonic::Scasd
            | Mnemonic::Scasq
    );
    let addr32 = bitness == 64
        && [instr.op0_kind(), instr.op1_kind()]
            .iter()
            .any(|k| matches!(k, OpKind::MemoryESEDI | OpKind::MemorySegESI));
    Some(RepeatedString { compare, addr32 })
}
