//! Hand-written snippets where the differential tester found the
//! interpreter and the host CPU disagreeing, kept as regression tests. Each
//! runs natively and in the interpreter and must match exactly; the
//! expected native behaviour is asserted too, so a test documents what the
//! hardware does.
#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use machine::difftest::campaign::run_case;
use machine::difftest::compare::text_report;
use machine::difftest::layout::{CODE_ADDR, DATA_ADDR, INITIAL_RSP, WINDOW_SIZE};
use machine::difftest::native::NativeRunner;
use machine::difftest::{panics, Case, FaultKind, FinalState, InitialState, Stop};

fn initial(pairs: &[(usize, u64)]) -> InitialState {
    let mut gpr = [0u64; 16];
    gpr[4] = INITIAL_RSP;
    for &(i, v) in pairs {
        gpr[i] = v;
    }
    InitialState {
        gpr,
        rflags: 0,
        window: vec![0; WINDOW_SIZE],
        fpu: Default::default(),
    }
}

/// Runs `code` both ways; returns the native result after asserting the
/// runs match.
fn both_match(code: &[u8], init: InitialState) -> FinalState {
    panics::install_quiet_hook();
    let mut runner = NativeRunner::new().unwrap();
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
    outcome.native
}

#[test]
fn cmpxchg32_register_destination_is_not_written_when_the_compare_fails() {
    // cmpxchg r10d, ecx with EAX != R10D: EAX is loaded (RAX zero-extended)
    // and R10 keeps all 64 bits, as neither vendor writes the register
    // destination on failure.
    let native = both_match(
        &[0x41, 0x0f, 0xb1, 0xca],
        initial(&[
            (0, 0xaaaa_aaaa_0000_0000),
            (1, 5),
            (10, 0xffff_ffff_0000_0001),
        ]),
    );
    assert_eq!(native.gpr[10], 0xffff_ffff_0000_0001);
    assert_eq!(native.gpr[0], 1);
}

#[test]
fn cmpxchg32_success_writes_destination_and_keeps_rax() {
    // Equal: R10D := ECX (zero-extended), RAX untouched.
    let native = both_match(
        &[0x41, 0x0f, 0xb1, 0xca],
        initial(&[
            (0, 0xaaaa_aaaa_0000_0001),
            (1, 5),
            (10, 0xffff_ffff_0000_0001),
        ]),
    );
    assert_eq!(native.gpr[10], 5);
    assert_eq!(native.gpr[0], 0xaaaa_aaaa_0000_0001);
}

#[test]
fn an_instruction_longer_than_15_bytes_is_a_general_protection_fault() {
    // Twelve ignored CS prefixes + add eax, 1 (83 c0 01) + nop: 16 bytes.
    let mut code = vec![0x2e; 12];
    code.extend_from_slice(&[0x83, 0xc0, 0x01, 0x90]);
    code.truncate(15);
    code.insert(0, 0x2e);
    assert_eq!(code.len(), 16);
    let native = both_match(&code, initial(&[]));
    assert!(
        matches!(
            native.stop,
            Stop::Fault {
                kind: FaultKind::Protection,
                address: None,
                ..
            }
        ),
        "{:?}",
        native.stop
    );
    assert_eq!(native.rip, CODE_ADDR);
    // Fifteen bytes are fine.
    let mut code = vec![0x2e; 12];
    code.extend_from_slice(&[0x83, 0xc0, 0x01]);
    let native = both_match(&code, initial(&[]));
    assert_eq!(native.stop, Stop::Finished);
    assert_eq!(native.gpr[0], 1);
}

#[test]
fn bit_test_on_memory_with_a_negative_register_offset() {
    // bts qword [rbx], rcx with rcx = -1: bit 63 of the qword below.
    let native = both_match(
        &[0x48, 0x0f, 0xab, 0x0b],
        initial(&[(1, u64::MAX), (3, DATA_ADDR + 0x100)]),
    );
    assert_eq!(native.window[0xff], 0x80);
}

#[test]
fn a_fault_in_a_32_bit_address_rep_movs_leaves_the_upper_halves_vendor_specific() {
    // rep movsd [edi],[esi] (addr32) whose first store crosses into the
    // page after the data page: #PF before any iteration completes. Intel
    // has cleared bits 63:32 of RSI and RDI by then, AMD has not; the
    // comparison leaves those bits out, the low halves must agree.
    let src = DATA_ADDR + 0x100;
    let dst = DATA_ADDR + 0xffd;
    let native = both_match(
        &[0xfc, 0x67, 0xf3, 0xa5],
        initial(&[
            (1, 7),
            (6, 0x0400_0000_0000_0000 | src),
            (7, 0x4_0000_0000 | dst),
        ]),
    );
    assert!(
        matches!(native.stop, Stop::Fault { .. }),
        "{:?}",
        native.stop
    );
    assert_eq!(native.gpr[6] & 0xffff_ffff, src);
    assert_eq!(native.gpr[7] & 0xffff_ffff, dst);
    assert_eq!(native.gpr[1] & 0xffff_ffff, 7);
}

#[test]
fn a_fault_inside_repne_cmpsb_leaves_the_flags_vendor_specific() {
    // repne cmpsb with RSI at the last byte of the data page: one compare,
    // then #PF. AMD keeps that compare's flags, the Intel host of session 6
    // the flags from before the instruction; RSI, RDI and RCX show one
    // iteration on both.
    let src = DATA_ADDR + 0xfff;
    let dst = DATA_ADDR + 0x10;
    let mut init = initial(&[(1, 3), (6, src), (7, dst)]);
    // Unequal bytes, so REPNE goes on to the next page.
    init.window[0xfff] = 0x10;
    init.window[0x10] = 0x30;
    let native = both_match(&[0xfc, 0xf2, 0xa6], init);
    assert!(
        matches!(native.stop, Stop::Fault { .. }),
        "{:?}",
        native.stop
    );
    assert_eq!(native.gpr[6], src + 1);
    assert_eq!(native.gpr[7], dst + 1);
    assert_eq!(native.gpr[1], 2);
}
