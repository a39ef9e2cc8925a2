//! Instruction coverage against what gcc emits for freestanding kernel code.
//!
//! Compiles the C corpus in `tests/corpus/` with the host gcc using the
//! guest's flags (`-ffreestanding -mgeneral-regs-only -mno-red-zone`) at
//! several optimization levels, disassembles every text section with
//! iced-x86 and executes each distinct instruction form once on the
//! interpreter (in guest mode, every exception exiting). An instruction the
//! interpreter does not implement raises #UD; the test lists them all.

mod common;

use common::*;
use iced_x86::{Code, Decoder, DecoderOptions, Formatter, IntelFormatter};
use machine::{Hpa, VmExit};
use object::{Object, ObjectSection, SectionKind};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

const FLAGS: &[&str] = &[
    "-ffreestanding",
    "-mgeneral-regs-only",
    "-mno-red-zone",
    "-nostdlib",
    "-fno-stack-protector",
    "-fno-pic",
    "-mcmodel=kernel",
    "-c",
];

fn corpus() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/corpus")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
        .collect();
    files.sort();
    files
}

/// Distinct instruction forms (by iced `Code`) with one example's bytes.
fn compile_and_collect() -> BTreeMap<Code, (Vec<u8>, String)> {
    let out = std::env::temp_dir().join(format!("faultline-coverage-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let mut forms = BTreeMap::new();
    for src in corpus() {
        for opt in ["-O0", "-O2", "-Os", "-O3"] {
            let obj = out.join(format!(
                "{}{}.o",
                src.file_stem().unwrap().to_string_lossy(),
                opt
            ));
            let st = Command::new("gcc")
                .args(FLAGS)
                .arg(opt)
                .arg(&src)
                .arg("-o")
                .arg(&obj)
                .status()
                .expect("gcc must be installed (see .ci/run)");
            assert!(st.success(), "gcc failed on {}", src.display());
            let data = std::fs::read(&obj).unwrap();
            let file = object::File::parse(&*data).unwrap();
            for sec in file.sections().filter(|s| s.kind() == SectionKind::Text) {
                let bytes = sec.data().unwrap();
                let mut dec = Decoder::with_ip(64, bytes, 0, DecoderOptions::NONE);
                for insn in dec.iter() {
                    let start = insn.ip() as usize;
                    let raw = bytes[start..start + insn.len()].to_vec();
                    forms.entry(insn.code()).or_insert_with(|| {
                        let mut text = String::new();
                        IntelFormatter::new().format(&insn, &mut text);
                        (
                            raw,
                            format!(
                                "{text}   ({}{opt})",
                                src.file_name().unwrap().to_string_lossy()
                            ),
                        )
                    });
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    forms
}

#[test]
fn every_instruction_gcc_emits_is_implemented() {
    let forms = compile_and_collect();
    assert!(forms.len() > 150, "corpus too small: {} forms", forms.len());
    let mut missing = Vec::new();
    for (code, (bytes, text)) in &forms {
        if matches!(code, Code::Ud2 | Code::INVALID) {
            continue;
        }
        let mut r = rig(|a| {
            a.nop().unwrap();
        });
        r.mem.write_bytes(Hpa(CODE), bytes).unwrap();
        for g in 0..16 {
            if g != 4 {
                r.cpu.state_mut().gpr[g] = DATA + 0x100 + 8 * g as u64;
            }
        }
        // Small count registers for string instructions.
        r.cpu.state_mut().gpr[1] = 4;
        let mut r = r.guest(machine::VmxControls {
            exception_bitmap: u32::MAX,
            ..controls()
        });
        let limit = r.cpu.cycles() + 100_000;
        // Only a #UD on the instruction itself counts: control transfers
        // may run on into whatever the registers point at.
        let exit = r.cpu.run(&r.mem, limit);
        if matches!(exit, VmExit::Exception { vector: 6, .. }) && r.cpu.state().rip == CODE {
            missing.push(text.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} instruction forms raise #UD:\n{}",
        missing.len(),
        forms.len(),
        missing.join("\n")
    );
}
