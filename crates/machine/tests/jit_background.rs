//! Translating on the translator thread (`jit::background`): the run's
//! outcome is the interpreter's whatever the moment each translation
//! arrives. In a test binary of its own: the switch is process-wide, and
//! `tests/jit.rs` counts what was translated when.

mod common;

use common::*;
use iced_x86::code_asm::*;
use machine::{Engine, VmExit};

/// Hot blocks of several shapes: a loop with inline loads and stores, a
/// call through a register and its return, a store into code that a later
/// block runs (its translation, asked before the store, comes for a block
/// no longer current).
fn program(a: &mut CodeAssembler) {
    let mut top = a.create_label();
    let mut f = a.create_label();
    let mut patch = a.create_label();
    a.mov(ecx, 20_000u32).unwrap();
    a.mov(rsi, DATA).unwrap();
    a.lea(r12, ptr(f)).unwrap();
    a.lea(rdi, ptr(patch)).unwrap();
    a.set_label(&mut top).unwrap();
    a.mov(eax, ecx).unwrap();
    a.and(eax, 0x1ff).unwrap();
    a.add(qword_ptr(rsi + rax * 8), rcx).unwrap();
    a.call(r12).unwrap();
    a.set_label(&mut patch).unwrap();
    a.mov(edx, 5u32).unwrap();
    a.add(r9, rdx).unwrap();
    a.test(ecx, 0xfff).unwrap();
    let mut skip = a.create_label();
    a.jnz(skip).unwrap();
    a.mov(dword_ptr(rdi + 1), ecx).unwrap();
    a.set_label(&mut skip).unwrap();
    a.dec(ecx).unwrap();
    a.jnz(top).unwrap();
    a.hlt().unwrap();
    a.set_label(&mut f).unwrap();
    a.imul_3(rbx, rbx, 3).unwrap();
    a.add(rbx, rcx).unwrap();
    a.ret().unwrap();
}

#[test]
fn translations_from_the_translator_thread_change_nothing() {
    let outcome = |engine| rig(program).outcome(engine, 2);
    let (interp, _) = outcome(Engine::Interp);
    assert_eq!(interp.exit, VmExit::Hlt);
    machine::jit::background::set_enabled(true);
    // Every run agrees, whenever the answers come; at least three runs,
    // and more (up to 30) until one had answers installed: on a loaded
    // host the translator thread may not run before a run ends.
    let mut most = 0;
    for round in 0..30 {
        let (jit, stats) = outcome(Engine::Jit);
        assert_eq!(interp, jit, "round {round}");
        most = most.max(stats.blocks_translated);
        if round >= 2 && most >= 2 {
            break;
        }
    }
    assert!(most >= 2, "at most {most} blocks translated in a run");
}
