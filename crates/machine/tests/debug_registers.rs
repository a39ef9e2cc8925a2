//! Debug-register moves (DR0-DR3, DR6, DR7; DR4/DR5 aliases) with their
//! #GP/#UD/#DB rules, and the cause a triple fault records.

mod common;

use common::*;
use iced_x86::code_asm::*;
use machine::cpu::debug_regs::{DebugRegs, DR6_BD, DR6_FIXED_1, DR7_GD};
use machine::cpu::state::cr4;
use machine::cpu::triple_fault::TripleFaultCause;
use machine::{EventInjection, EventKind, VmExit};

/// Runs to the HLT at the end of `code` or in the handler of the first
/// exception; returns the vector taken (from r15's mark), if any.
fn run(r: &mut Rig) -> Option<u8> {
    r.vector_taken()
}

#[test]
fn ring0_moves_store_and_read_back_with_fixed_bits() {
    let mut r = rig(|a| {
        a.mov(rax, 0xffff_8000_dead_beefu64).unwrap();
        a.mov(dr0, rax).unwrap();
        a.mov(rax, 0x1234u64).unwrap();
        a.mov(dr3, rax).unwrap();
        a.mov(rbx, dr0).unwrap();
        a.mov(rcx, dr3).unwrap();
        // DR7: reserved bits 12, 14, 15 read 0, bit 10 reads 1 (GD, bit
        // 13, stays clear: it would make the next move #DB).
        a.mov(rax, 0xffff_dfffu64).unwrap();
        a.mov(dr7, rax).unwrap();
        a.mov(rdx, dr7).unwrap();
        // DR6: only B0-B3, BD, BS, BT change; the rest reads 0xffff0ff0.
        a.xor(eax, eax).unwrap();
        a.mov(dr6, rax).unwrap();
        a.mov(rsi, dr6).unwrap();
        a.mov(rax, 0xffff_ffffu64).unwrap();
        a.mov(dr6, rax).unwrap();
        a.mov(rdi, dr6).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(r.cpu.state().debug, DebugRegs::default());
    assert_eq!(run(&mut r), None);
    assert_eq!(r.gpr(3), 0xffff_8000_dead_beef);
    assert_eq!(r.gpr(1), 0x1234);
    assert_eq!(r.gpr(2), 0xffff_0fff);
    assert_eq!(r.gpr(6), DR6_FIXED_1);
    assert_eq!(r.gpr(7), 0xffff_efff);
    assert_eq!(r.cpu.state().debug.dr[0], 0xffff_8000_dead_beef);
}

#[test]
fn upper_half_of_dr6_and_dr7_is_gp() {
    for write_dr7 in [false, true] {
        let mut r = rig(|a| {
            a.mov(rax, 1u64 << 32).unwrap();
            if write_dr7 {
                a.mov(dr7, rax).unwrap();
            } else {
                a.mov(dr6, rax).unwrap();
            }
            a.hlt().unwrap();
        });
        assert_eq!(run(&mut r), Some(13));
        assert_eq!(r.cpu.state().debug, DebugRegs::default(), "nothing written");
    }
}

#[test]
fn dr4_and_dr5_alias_dr6_and_dr7_unless_cr4_de() {
    let code = |a: &mut CodeAssembler| {
        a.mov(rax, 0x401u64).unwrap();
        a.mov(dr5, rax).unwrap();
        a.mov(rbx, dr4).unwrap();
        a.hlt().unwrap();
    };
    let mut r = rig(code);
    assert_eq!(run(&mut r), None);
    assert_eq!(r.cpu.state().debug.dr7, 0x401);
    assert_eq!(r.gpr(3), DR6_FIXED_1);

    let mut r = rig(code);
    r.cpu.state_mut().cr4 |= cr4::DE;
    assert_eq!(run(&mut r), Some(6));
    assert_eq!(r.cpu.state().debug, DebugRegs::default());
}

#[test]
fn general_detect_raises_db_once_and_sets_bd() {
    let mut r = rig(|a| {
        a.mov(rax, DR7_GD).unwrap();
        a.mov(dr7, rax).unwrap();
        a.mov(rbx, dr0).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(run(&mut r), Some(1));
    let d = r.cpu.state().debug;
    assert_eq!(d.dr6 & DR6_BD, DR6_BD);
    assert_eq!(d.dr7 & DR7_GD, 0, "GD is cleared for the handler");
}

#[test]
fn user_mode_moves_are_gp() {
    for to in [false, true] {
        let mut r = rig(|a| {
            if to {
                a.mov(dr7, rax).unwrap();
            } else {
                a.mov(rax, dr7).unwrap();
            }
            a.hlt().unwrap();
        });
        r.enter_user_mode();
        assert_eq!(run(&mut r), Some(13));
    }
}

#[test]
fn triple_fault_names_the_exception_that_began_the_chain() {
    for guest in [false, true] {
        let mut r = rig(|a| {
            a.ud2().unwrap();
        });
        r.cpu.state_mut().idtr.limit = 0;
        if guest {
            r = r.guest(controls());
        }
        assert_eq!(r.cpu.triple_fault_cause(), None);
        assert_eq!(r.run(), VmExit::TripleFault);
        let cause = r.cpu.triple_fault_cause().expect("recorded");
        assert_eq!(
            cause,
            TripleFaultCause {
                first: EventInjection {
                    kind: EventKind::HardwareException,
                    vector: 6,
                    error_code: None,
                    instruction_len: 0,
                },
                during_double_fault: 13,
            }
        );
        assert_eq!(
            cause.to_string(),
            "the chain began with #UD (invalid opcode); delivering #DF raised #GP (general protection)"
        );
    }
}

/// The host CPU agrees: a debug-register move from ring 3 is #GP (SIGSEGV)
/// there too, not #UD. (Ring 0 cannot be run natively; the rules above
/// follow the SDM and KVM's emulator.)
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[test]
fn user_mode_moves_fault_like_the_host_cpu() {
    use machine::difftest::campaign::run_case;
    use machine::difftest::compare::text_report;
    use machine::difftest::layout::{INITIAL_RSP, WINDOW_SIZE};
    use machine::difftest::native::NativeRunner;
    use machine::difftest::{panics, Case, FaultKind, InitialState, Stop};

    panics::install_quiet_hook();
    let mut runner = NativeRunner::new().unwrap();
    // mov %rax,%dr7 ; mov %dr6,%rax ; mov %rax,%dr0
    for code in [[0x0f, 0x23, 0xf8], [0x0f, 0x21, 0xf0], [0x0f, 0x23, 0xc0]] {
        let mut gpr = [0u64; 16];
        gpr[4] = INITIAL_RSP;
        let init = InitialState {
            gpr,
            rflags: 0,
            window: vec![0; WINDOW_SIZE],
            fpu: Default::default(),
        };
        let outcome = run_case(&mut runner, Case::handwritten(code.to_vec(), init)).unwrap();
        assert!(
            outcome.matches(),
            "{}",
            text_report(
                &outcome.case,
                &outcome.native,
                &outcome.interp,
                &outcome.differences
            )
        );
        assert!(
            matches!(
                outcome.native.stop,
                Stop::Fault {
                    kind: FaultKind::Protection,
                    ..
                }
            ),
            "{:?}",
            outcome.native.stop
        );
    }
}

/// RFLAGS.TF single-steps: POPF that sets TF does not trap, the next
/// instruction does, with DR6.BS and the frame at the instruction after it.
#[test]
fn tf_single_step_traps_after_the_next_instruction() {
    for engine in [machine::Engine::Interp, machine::Engine::Jit] {
        let mut r = rig(|a| {
            a.pushfq().unwrap();
            a.or(qword_ptr(rsp), 0x100).unwrap();
            a.popfq().unwrap();
            a.nop().unwrap(); // traps after this one
            a.nop().unwrap();
            a.hlt().unwrap();
        })
        .with_engine(engine);
        assert_eq!(run(&mut r), Some(1), "{engine:?}");
        let d = r.cpu.state().debug;
        assert_ne!(d.dr6 & machine::cpu::debug_regs::DR6_BS, 0);
        let after_first_nop = {
            let mut probe = CodeAssembler::new(64).unwrap();
            probe.pushfq().unwrap();
            probe.or(qword_ptr(rsp), 0x100).unwrap();
            probe.popfq().unwrap();
            probe.nop().unwrap();
            probe.assemble(CODE).unwrap().len() as u64
        };
        let frame_rip = r.mem.read_u64(machine::Hpa(r.gpr(4))).unwrap();
        assert_eq!(frame_rip, CODE + after_first_nop, "{engine:?}");
    }
}

/// DR0 with DR7.L0 and R/W0 = 00: a #DB fault before the instruction at
/// the address, DR6.B0 set.
#[test]
fn instruction_breakpoint_faults_before_the_instruction() {
    let setup = |a: &mut CodeAssembler, at: u64| {
        a.mov(rax, at).unwrap();
        a.mov(dr0, rax).unwrap();
        a.mov(eax, 1).unwrap();
        a.mov(dr7, rax).unwrap();
    };
    let nop = {
        let mut probe = CodeAssembler::new(64).unwrap();
        setup(&mut probe, CODE);
        probe.assemble(CODE).unwrap().len() as u64
    };
    for engine in [machine::Engine::Interp, machine::Engine::Jit] {
        let mut r = rig(|a| {
            setup(a, CODE + nop);
            a.nop().unwrap();
            a.hlt().unwrap();
        })
        .with_engine(engine);
        assert_eq!(run(&mut r), Some(1), "{engine:?}");
        assert_eq!(r.cpu.state().debug.dr6 & 0xf, 1, "B0");
        let frame_rip = r.mem.read_u64(machine::Hpa(r.gpr(4))).unwrap();
        assert_eq!(frame_rip, CODE + nop);
    }
}

/// Points #DB at a handler that counts in r14 and stores each frame's RIP
/// at DATA + 8 * count, then returns.
fn count_debug_exceptions(r: &mut Rig) {
    const DB_HANDLER: u64 = HANDLERS + 0x2000;
    let mut h = CodeAssembler::new(64).unwrap();
    h.inc(r14).unwrap();
    h.mov(r12, qword_ptr(rsp)).unwrap();
    h.mov(r13, DATA).unwrap();
    h.mov(qword_ptr(r13 + r14 * 8), r12).unwrap();
    h.iretq().unwrap();
    let bytes = h.assemble(DB_HANDLER).unwrap();
    r.mem.write_bytes(machine::Hpa(DB_HANDLER), &bytes).unwrap();
    let lo = (DB_HANDLER & 0xffff)
        | (u64::from(KERNEL_CS) << 16)
        | (0x8e_u64 << 40)
        | (((DB_HANDLER >> 16) & 0xffff) << 48);
    r.mem.write_u64(machine::Hpa(IDT + 16), lo).unwrap();
    r.mem
        .write_u64(machine::Hpa(IDT + 24), DB_HANDLER >> 32)
        .unwrap();
}

/// The frame RIPs of the #DBs `code` took, as offsets from CODE.
fn debug_exception_rips(
    engine: machine::Engine,
    code: impl FnOnce(&mut CodeAssembler),
) -> Vec<i64> {
    let mut r = rig(code).with_engine(engine);
    count_debug_exceptions(&mut r);
    assert_eq!(run(&mut r), None, "{engine:?}");
    (1..=r.gpr(14))
        .map(|k| r.mem.read_u64(machine::Hpa(DATA + 8 * k)).unwrap() as i64 - CODE as i64)
        .collect()
}

/// Sets TF with PUSHF/OR/POPF (RAX keeps the flags).
fn set_tf(a: &mut CodeAssembler) {
    a.pushfq().unwrap();
    a.pop(rax).unwrap();
    a.or(rax, 0x100).unwrap();
    a.push(rax).unwrap();
    a.popfq().unwrap();
}

/// Clears TF with AND/PUSH/POPF, each single-stepped, then halts.
fn clear_tf(a: &mut CodeAssembler) {
    a.and(rax, !0x100).unwrap();
    a.push(rax).unwrap();
    a.popfq().unwrap();
    a.hlt().unwrap();
}

/// kvm-unit-tests' `debug` "Single-step #DB basic test": TF set by POPF,
/// then AND, PUSH and the POPF that clears TF each trap once, with the
/// frame's RIP after each (2 #DBs before the fix: none after that POPF).
#[test]
fn single_step_traps_each_instruction_until_a_popf_clears_tf() {
    for engine in [machine::Engine::Interp, machine::Engine::Jit] {
        let rips = debug_exception_rips(engine, |a| {
            set_tf(a);
            clear_tf(a);
        });
        // set_tf is 10 bytes, AND 6, PUSH and POPF 1 each.
        assert_eq!(rips, vec![16, 17, 18], "{engine:?}");
    }
}

/// MOV SS holds its single-step trap back (the next instruction's covers
/// it); ICEBP is a trap-like #DB with the frame after it and no second
/// single-step trap.
#[test]
fn mov_ss_holds_single_step_back_and_icebp_traps_after_itself() {
    for engine in [machine::Engine::Interp, machine::Engine::Jit] {
        let rips = debug_exception_rips(engine, |a| {
            a.mov(ecx, u32::from(KERNEL_DS)).unwrap();
            set_tf(a); // offsets 5..15
            a.mov(ss, cx).unwrap(); // 15..18 (66 8e d1): no trap after it
            a.db(&[0xf1]).unwrap(); // ICEBP at 18: #DB, RIP 19
            clear_tf(a); // AND 19..25, PUSH 25, POPF 26
        });
        assert_eq!(rips, vec![19, 25, 26, 27], "{engine:?}");
    }
}
