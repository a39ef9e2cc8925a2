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

/// Breakpoint register `dr` at `at`, then DR7 `dr7_value` (through RAX).
fn arm(a: &mut CodeAssembler, dr: AsmRegisterDr, at: u64, dr7_value: u32) {
    a.mov(rax, at).unwrap();
    a.mov(dr, rax).unwrap();
    a.mov(eax, dr7_value).unwrap();
    a.mov(dr7, rax).unwrap();
}

/// An instruction breakpoint (R/W0 = 00) at `at` with DR7 `dr7_value`.
fn arm_dr0_execute(a: &mut CodeAssembler, at: u64, dr7_value: u32) {
    arm(a, dr0, at, dr7_value);
}

/// DR0 with DR7.L0 and R/W0 = 00: a #DB fault before the instruction at
/// the address, DR6.B0 set.
#[test]
fn instruction_breakpoint_faults_before_the_instruction() {
    let setup = |a: &mut CodeAssembler, at: u64| arm_dr0_execute(a, at, 1);
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

/// The length of the code `f` assembles.
fn code_len(f: impl FnOnce(&mut CodeAssembler)) -> i64 {
    let mut probe = CodeAssembler::new(64).unwrap();
    f(&mut probe);
    probe.assemble(CODE).unwrap().len() as i64
}

/// Runs `r` to its final HLT, checks it took exactly one #DB and returns
/// that #DB's frame RIP as an offset from CODE.
fn the_one_debug_trap(r: &mut Rig) -> i64 {
    count_debug_exceptions(r);
    assert_eq!(run(r), None);
    assert_eq!(r.gpr(14), 1, "one #DB");
    r.mem.read_u64(machine::Hpa(DATA + 8)).unwrap() as i64 - CODE as i64
}

/// DR6 `dr6_value`, then DR1 at DATA + 0x100 with DR7 `dr7_value`.
fn arm_dr1(a: &mut CodeAssembler, dr7_value: u32, dr6_value: u32) {
    a.mov(eax, dr6_value).unwrap();
    a.mov(dr6, rax).unwrap();
    arm(a, dr1, DATA + 0x100, dr7_value);
}

/// kvm-unit-tests' `debug` "hw watchpoint": a 4-byte write breakpoint
/// (DR7 R/W1 = 01, LEN1 = 11) traps after a store that overlaps it from
/// below, with DR6.B1 and a BS that software left set; reads, and stores
/// beside it, do not trap.
#[test]
fn write_watchpoint_traps_after_an_overlapping_store() {
    let store = |a: &mut CodeAssembler| {
        arm_dr1(a, 0x00d0_040a, 0x4000);
        a.mov(rcx, DATA + 0xfc).unwrap();
        a.mov(qword_ptr(rcx), rbx).unwrap(); // bytes 0xfc..0x104
    };
    let after_store = code_len(store);
    for engine in [machine::Engine::Interp, machine::Engine::Jit] {
        let mut r = rig(|a| {
            store(a);
            a.mov(rdx, qword_ptr(rcx + 4)).unwrap(); // a read: no trap
            a.mov(dword_ptr(rcx + 8), edx).unwrap(); // 0x104..0x108: none
            a.hlt().unwrap();
        })
        .with_engine(engine);
        let rip = the_one_debug_trap(&mut r);
        assert_eq!(rip, after_store, "{engine:?}: a trap after the store");
        assert_eq!(r.cpu.state().debug.dr6, DR6_FIXED_1 | 0x4000 | 2);
    }
}

/// Stores the kernel data selector at DATA + 0x100, puts a 4-byte
/// read/write watchpoint there (DR1) and loads SS from it.
fn mov_ss_from_a_watched_word(a: &mut CodeAssembler) {
    a.mov(ecx, u32::from(KERNEL_DS)).unwrap();
    a.mov(rdx, DATA + 0x100).unwrap();
    a.mov(qword_ptr(rdx), rcx).unwrap();
    arm_dr1(a, 0x00f0_040a, 0);
    a.mov(ss, word_ptr(rdx)).unwrap();
}

/// A read/write watchpoint met by MOV SS waits one more instruction (SDM
/// Vol. 3A 6.8.3): after a NOP its #DB follows the NOP; an ICEBP there
/// raises one #DB for both (kvm-unit-tests' "MOV SS + watchpoint + ICEBP").
#[test]
fn mov_ss_holds_a_watchpoint_trap_for_one_instruction() {
    let load = mov_ss_from_a_watched_word;
    for engine in [machine::Engine::Interp, machine::Engine::Jit] {
        for icebp in [false, true] {
            let after = code_len(|a| {
                load(a);
                a.nop().unwrap();
            });
            let mut r = rig(|a| {
                load(a);
                if icebp {
                    a.db(&[0xf1]).unwrap();
                } else {
                    a.nop().unwrap();
                }
                a.mov(rax, 0x400u64).unwrap();
                a.mov(dr7, rax).unwrap();
                a.hlt().unwrap();
            })
            .with_engine(engine);
            let rip = the_one_debug_trap(&mut r);
            assert_eq!(rip, after, "{engine:?} icebp {icebp}");
            assert_eq!(r.cpu.state().debug.dr6 & 0xf, 2, "{engine:?} B1");
        }
    }
}

/// After MOV SS and INT3 the held watchpoint #DB is delivered at the #BP
/// handler's first instruction (kvm-unit-tests' "MOV SS + watchpoint +
/// INT3": the #DB handler runs, then the #BP handler).
#[test]
fn a_watchpoint_held_over_int3_traps_at_the_bp_handler() {
    for engine in [machine::Engine::Interp, machine::Engine::Jit] {
        let mut r = rig(|a| {
            mov_ss_from_a_watched_word(a);
            a.int3().unwrap();
            a.hlt().unwrap();
        })
        .with_engine(engine);
        count_debug_exceptions(&mut r);
        assert_eq!(run(&mut r), Some(3), "{engine:?}: the #BP handler ran");
        assert_eq!(r.gpr(14), 1, "{engine:?}: one #DB");
        let rip = r.mem.read_u64(machine::Hpa(DATA + 8)).unwrap();
        assert_eq!(rip, HANDLERS + 3 * 16, "{engine:?}: at the #BP handler");
    }
}

/// An I/O breakpoint (R/W0 = 10, CR4.DE set) on port 0x80: the OUT exits
/// and skipping it queues a #DB with DR6.B0; without CR4.DE, R/W = 10
/// does not match and only the exit happens.
#[test]
fn io_breakpoint_traps_after_the_out_with_cr4_de() {
    for de in [false, true] {
        let mut r = rig(|a| {
            a.mov(eax, 0x80).unwrap();
            a.mov(dr0, rax).unwrap();
            a.mov(eax, 0x0002_0401).unwrap();
            a.mov(dr7, rax).unwrap();
            a.out(0x80, al).unwrap();
            a.hlt().unwrap();
        });
        if de {
            r.cpu.state_mut().cr4 |= cr4::DE;
        }
        assert!(matches!(r.run(), VmExit::Io { port: 0x80, .. }));
        r.cpu.skip_instruction();
        let injected = r.cpu.pending_injection();
        if de {
            assert_eq!(injected.map(|e| e.vector), Some(1));
            assert_eq!(r.cpu.state().debug.dr6 & 0xf, 1);
            assert_eq!(run(&mut r), Some(1));
        } else {
            assert_eq!(injected, None);
            assert_eq!(run(&mut r), None);
        }
    }
}

/// An instruction breakpoint on the instruction after MOV SS does not
/// fire (Intel; kvm-unit-tests' emulator "#DB suppressed after MOV SS");
/// one on the instruction after that does.
#[test]
fn instruction_breakpoints_are_inhibited_after_mov_ss() {
    let setup = |a: &mut CodeAssembler, at: u64| {
        arm_dr0_execute(a, at, 0x401);
        a.mov(ecx, u32::from(KERNEL_DS)).unwrap();
        a.mov(ss, cx).unwrap();
    };
    let after_mov_ss = code_len(|a| setup(a, CODE)) as u64;
    for engine in [machine::Engine::Interp, machine::Engine::Jit] {
        for (at, fires) in [(after_mov_ss, false), (after_mov_ss + 1, true)] {
            let mut r = rig(|a| {
                setup(a, CODE + at);
                a.nop().unwrap();
                a.nop().unwrap();
                a.hlt().unwrap();
            })
            .with_engine(engine);
            let want = fires.then_some(1);
            assert_eq!(run(&mut r), want, "{engine:?} breakpoint at +{at}");
        }
    }
}
