//! The native side of the differential tester, checked on its own: known
//! snippets run on the host CPU give the architecturally expected results,
//! and generated cases only ever finish or raise #DE.
#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use machine::cpu::state::rflags;
use machine::difftest::layout::{
    window_addr, window_offset, CODE_ADDR, DATA_ADDR, INITIAL_RSP, STACK_ADDR, WINDOW_SIZE,
};
use machine::difftest::native::NativeRunner;
use machine::difftest::{generate_case, FaultKind, GenConfig, InitialState, Stop};

fn initial(gpr: [u64; 16], flags: u64) -> InitialState {
    InitialState {
        gpr,
        rflags: flags,
        window: (0..WINDOW_SIZE).map(|i| (i * 7) as u8).collect(),
        fpu: Default::default(),
    }
}

fn regs(pairs: &[(usize, u64)]) -> [u64; 16] {
    let mut gpr = [0u64; 16];
    gpr[4] = INITIAL_RSP;
    for &(i, v) in pairs {
        gpr[i] = v;
    }
    gpr
}

#[test]
fn add_sets_result_and_flags() {
    let mut runner = NativeRunner::new().unwrap();
    // add rax, rbx
    let code = [0x48, 0x01, 0xd8];
    let init = initial(regs(&[(0, u64::MAX), (3, 1), (9, 0x1234)]), rflags::DF);
    let out = runner.run(&code, &init).unwrap();
    assert_eq!(out.stop, Stop::Finished);
    assert_eq!(out.rip, CODE_ADDR + 3);
    assert_eq!(out.gpr[0], 0);
    assert_eq!(out.gpr[3], 1);
    assert_eq!(
        out.gpr[9], 0x1234,
        "untouched registers survive the trampoline"
    );
    assert_eq!(out.gpr[4], INITIAL_RSP);
    let f = out.rflags;
    assert!(
        f & rflags::CF != 0 && f & rflags::ZF != 0 && f & rflags::AF != 0 && f & rflags::PF != 0
    );
    assert!(f & (rflags::SF | rflags::OF) == 0);
    assert!(f & rflags::DF != 0, "DF passes through");
    assert_eq!(out.window, init.window);
}

#[test]
fn divide_by_zero_is_sigfpe_at_the_instruction() {
    let mut runner = NativeRunner::new().unwrap();
    // inc rdx; div ecx
    let code = [0x48, 0xff, 0xc2, 0xf7, 0xf1];
    let init = initial(regs(&[(0, 10), (1, 0), (2, 0)]), 0);
    let out = runner.run(&code, &init).unwrap();
    assert!(
        matches!(
            out.stop,
            Stop::Fault {
                kind: FaultKind::DivideError,
                ..
            }
        ),
        "{:?}",
        out.stop
    );
    assert_eq!(out.rip, CODE_ADDR + 3);
    assert_eq!(out.gpr[2], 1, "state at the faulting instruction");
    assert_eq!(out.gpr[0], 10);
}

#[test]
fn stack_and_string_writes_reach_the_window() {
    let mut runner = NativeRunner::new().unwrap();
    // push rax; pop rbx; push rbx; mov rdi, DATA+0x10 (lea via imm); std; mov ecx,3; rep stosb; cld
    let mut code = vec![0x50, 0x5b, 0x53];
    code.extend_from_slice(&[0x48, 0xbf]);
    code.extend_from_slice(&(DATA_ADDR + 0x10).to_le_bytes());
    code.extend_from_slice(&[0xfd, 0xb9, 0x03, 0x00, 0x00, 0x00, 0xf3, 0xaa]);
    let init = initial(regs(&[(0, 0x1122_3344_5566_77aa)]), 0);
    let out = runner.run(&code, &init).unwrap();
    assert_eq!(out.stop, Stop::Finished);
    assert_eq!(out.gpr[3], 0x1122_3344_5566_77aa);
    assert_eq!(out.gpr[4], INITIAL_RSP - 8);
    let slot = window_offset(INITIAL_RSP - 8).unwrap();
    assert_eq!(
        &out.window[slot..slot + 8],
        &0x1122_3344_5566_77aau64.to_le_bytes()
    );
    // rep stosb with DF=1 stored AL at DATA+0x10, 0xf, 0xe.
    for a in [DATA_ADDR + 0x10, DATA_ADDR + 0xf, DATA_ADDR + 0xe] {
        assert_eq!(out.window[window_offset(a).unwrap()], 0xaa);
    }
    assert_eq!(
        out.window[window_offset(DATA_ADDR + 0xd).unwrap()],
        init.window[0xd]
    );
    assert_eq!(out.gpr[7], DATA_ADDR + 0xd);
    assert!(out.rflags & rflags::DF != 0);
    // The rest of the window is untouched.
    let changed = (0..WINDOW_SIZE)
        .filter(|&i| out.window[i] != init.window[i])
        .count();
    assert!(changed <= 11, "{changed} bytes changed");
}

#[test]
fn page_faults_and_invalid_opcodes_are_reported() {
    let mut runner = NativeRunner::new().unwrap();
    // mov eax, [rbx] with rbx just past the data page
    let out = runner
        .run(
            &[0x8b, 0x03],
            &initial(regs(&[(3, window_addr(0xfff) + 1)]), 0),
        )
        .unwrap();
    assert!(
        matches!(out.stop, Stop::Fault { kind: FaultKind::Protection, address: Some(a), .. } if a == DATA_ADDR + 0x1000)
    );
    assert_eq!(out.rip, CODE_ADDR);
    // ud2
    let out = runner
        .run(&[0x90, 0x0f, 0x0b], &initial(regs(&[]), 0))
        .unwrap();
    assert!(matches!(
        out.stop,
        Stop::Fault {
            kind: FaultKind::InvalidOpcode,
            ..
        }
    ));
    assert_eq!(out.rip, CODE_ADDR + 1);
    // A non-canonical address is #GP: SIGSEGV without an address.
    let out = runner
        .run(
            &[0x8b, 0x03],
            &initial(regs(&[(3, 0x8000_0000_0000_0000)]), 0),
        )
        .unwrap();
    assert!(
        matches!(
            out.stop,
            Stop::Fault {
                kind: FaultKind::Protection,
                address: None,
                ..
            }
        ),
        "{:?}",
        out.stop
    );
}

#[test]
fn runaway_child_is_killed() {
    let mut runner = NativeRunner::new().unwrap();
    runner.set_timeout(std::time::Duration::from_millis(200));
    // jmp $
    let out = runner.run(&[0xeb, 0xfe], &initial(regs(&[]), 0)).unwrap();
    assert!(
        matches!(&out.stop, Stop::Abnormal(why) if why.contains("timed out")),
        "{:?}",
        out.stop
    );
    // The runner still works afterwards.
    let out = runner.run(&[0x90], &initial(regs(&[]), 0)).unwrap();
    assert_eq!(out.stop, Stop::Finished);
}

#[test]
fn generated_cases_only_finish_or_fault_as_intended_natively() {
    // The generator keeps every access inside the window and every
    // instruction valid on this host, except where it means to fault: UD2
    // and misplaced LOCK prefixes (#UD), page-edge accesses running into a
    // guard page next to the window (#PF), 16-byte instructions (#GP), and
    // divisions (#DE). Any other stop is a generator bug.
    let mut runner = NativeRunner::new().unwrap();
    // The integer group (SSE cases also fault on misalignment and #XM).
    let config = GenConfig {
        groups: vec![machine::difftest::gen::Group::Int],
        ..GenConfig::for_host()
    };
    let guards = [
        DATA_ADDR - 0x1000,
        DATA_ADDR + 0x1000,
        STACK_ADDR - 0x1000,
        STACK_ADDR + 0x1000,
    ];
    let (mut finished, mut divide, mut invalid, mut protection) = (0, 0, 0, 0);
    for index in 0..600 {
        let case = generate_case(21, index, &config);
        let out = runner.run(&case.code, &case.initial).unwrap();
        let at = || {
            case.disassembly()
                .into_iter()
                .find(|d| d.0 == out.rip)
                .unwrap()
        };
        match out.stop {
            Stop::Finished => finished += 1,
            Stop::Fault {
                kind: FaultKind::DivideError,
                ..
            } => divide += 1,
            Stop::Fault {
                kind: FaultKind::InvalidOpcode,
                ..
            } => {
                invalid += 1;
                let at = at();
                assert!(
                    at.2 == "ud2" || at.2.starts_with("lock "),
                    "case {index}: #UD at {at:?}"
                );
            }
            Stop::Fault {
                kind: FaultKind::Protection,
                address: Some(a),
                ..
            } => {
                protection += 1;
                assert!(
                    guards.iter().any(|&g| (g..g + 0x1000).contains(&a)),
                    "case {index}: #PF at {a:#x}"
                );
            }
            Stop::Fault {
                kind: FaultKind::Protection,
                address: None,
                ..
            } => {
                protection += 1;
                let at = at();
                assert!(at.1.len() > 15, "case {index}: #GP at {at:?}");
            }
            ref other => panic!(
                "case {index}: {other:?} at {:#x}\n{:#?}",
                out.rip,
                case.disassembly()
            ),
        }
        assert!(case.checkpoints.iter().any(|c| c.addr == out.rip) || out.stop == Stop::Finished);
    }
    assert!(
        finished > 400 && divide > 0 && invalid > 0 && protection > 0,
        "finished {finished}, #DE {divide}, #UD {invalid}, #GP/#PF {protection}"
    );
}
