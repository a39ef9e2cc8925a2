//! What exception frames hold: RFLAGS.RF for fault-class exceptions (SDM
//! Vol. 3A 18.3.1.1; kvm-unit-tests' `idt_test` "#GP rflags.rf", "#UD
//! rflags.rf"), and RF lasting exactly one instruction after an IRET.

mod common;

use common::*;
use iced_x86::code_asm::*;
use machine::cpu::state::rflags;
use machine::{Engine, Hpa, VmExit};

/// Runs to the handler's HLT; returns the vector and the saved RFLAGS.
fn taken(r: &mut Rig, error_code: bool) -> (u8, u64) {
    assert_eq!(r.run(), VmExit::Hlt);
    let vector = (r.gpr(15) - HANDLER_MARK) as u8;
    let frame = r.gpr(4) + if error_code { 8 } else { 0 };
    (vector, r.mem.read_u64(Hpa(frame + 16)).unwrap())
}

/// The vector and saved RFLAGS of the exception `code` raises on `engine`.
fn frame_of(engine: Engine, error_code: bool, code: impl FnOnce(&mut CodeAssembler)) -> (u8, u64) {
    let mut r = rig(code).with_engine(engine);
    taken(&mut r, error_code)
}

#[test]
fn fault_frames_carry_rf_and_trap_frames_do_not() {
    for engine in [Engine::Interp, Engine::Jit] {
        let (vector, fl) = frame_of(engine, false, |a| {
            a.nop().unwrap();
            a.ud2().unwrap();
        });
        assert_eq!(vector, 6);
        assert_ne!(fl & rflags::RF, 0, "#UD frame: {fl:#x}");
        // #GP: a non-canonical load.
        let (vector, fl) = frame_of(engine, true, |a| {
            a.mov(rax, 0x8000_0000_0000_0000u64).unwrap();
            a.mov(rbx, qword_ptr(rax)).unwrap();
        });
        assert_eq!(vector, 13);
        assert_ne!(fl & rflags::RF, 0, "#GP frame: {fl:#x}");
        // #BP is a trap: RF stays clear.
        let (vector, fl) = frame_of(engine, false, |a| {
            a.int3().unwrap();
        });
        assert_eq!(vector, 3);
        assert_eq!(fl & rflags::RF, 0, "#BP frame: {fl:#x}");
    }
}

/// An IRETQ that loads RF=1 leaves it set for one instruction; the
/// processor clears it when that instruction completes, so a later
/// exception frame (a trap here) shows it clear.
#[test]
fn rf_from_iret_lasts_one_instruction() {
    for engine in [Engine::Interp, Engine::Jit] {
        let (vector, fl) = frame_of(engine, false, |a| {
            let mut target = a.create_label();
            // An IRETQ frame to `target` with RF set.
            a.mov(rax, rsp).unwrap();
            a.push(i32::from(KERNEL_DS)).unwrap();
            a.push(rax).unwrap();
            a.push((rflags::FIXED1 | rflags::RF) as i32).unwrap();
            a.push(i32::from(KERNEL_CS)).unwrap();
            a.lea(rax, ptr(target)).unwrap();
            a.push(rax).unwrap();
            a.iretq().unwrap();
            a.set_label(&mut target).unwrap();
            a.pushfq().unwrap(); // pushf stores RF as 0 anyway
            a.nop().unwrap();
            a.int3().unwrap();
        });
        assert_eq!(vector, 3);
        assert_eq!(fl & rflags::RF, 0, "{engine:?}: RF cleared: {fl:#x}");
    }
}
