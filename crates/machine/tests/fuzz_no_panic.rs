//! "No panic on any input": arbitrary bytes (and bytes mixed with valid
//! prefixes and opcodes) run as code with arbitrary registers, in ring 0
//! bare mode and ring 3 guest mode. Any VM exit is fine; a panic fails.

use machine::difftest::fuzz::{run_fuzz_input, FuzzInput, OPCODES, PREFIXES};
use machine::difftest::layout::{DATA_ADDR, INITIAL_RSP, STACK_ADDR, WINDOW_SIZE};
use machine::difftest::SandboxMode;
use proptest::prelude::*;

/// Random bytes, or a soup of prefixes, opcode fragments and random bytes.
fn code() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        prop::sample::select(&PREFIXES[..]).prop_map(|b| vec![b]),
        prop::sample::select(OPCODES).prop_map(|o| o.to_vec()),
        prop::collection::vec(any::<u8>(), 1..6),
    ];
    prop_oneof![
        prop::collection::vec(any::<u8>(), 1..64),
        prop::collection::vec(token, 1..16).prop_map(|t| t.concat()),
    ]
}

/// Register values: anything, or pointers into the window.
fn register() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        (0u64..0x1000).prop_map(|o| DATA_ADDR + o),
        (0u64..0x1000).prop_map(|o| STACK_ADDR + o),
        prop::sample::select(&[0u64, 1, u64::MAX, 0x8000_0000_0000_0000, 0xffff_ffff][..]),
    ]
}

fn mode() -> impl Strategy<Value = SandboxMode> {
    prop_oneof![
        Just(SandboxMode::KernelBare),
        Just(SandboxMode::KernelReal),
        Just(SandboxMode::KernelProtected32),
        any::<u32>().prop_map(|exception_bitmap| SandboxMode::UserGuest { exception_bitmap }),
        any::<u32>().prop_map(|exception_bitmap| SandboxMode::UserGuestCompat { exception_bitmap }),
        Just(SandboxMode::UserGuest {
            exception_bitmap: u32::MAX
        }),
    ]
}

fn input() -> impl Strategy<Value = FuzzInput> {
    (
        code(),
        prop::array::uniform16(register()),
        any::<bool>(),
        any::<u64>(),
        mode(),
        any::<u8>(),
    )
        .prop_map(|(code, mut gpr, keep_rsp, rflags, mode, fill)| {
            if keep_rsp {
                gpr[4] = INITIAL_RSP;
            }
            FuzzInput {
                code,
                gpr,
                rflags,
                mode,
                window: vec![fill; WINDOW_SIZE],
            }
        })
}

proptest! {
    // Failures are not persisted to a file: reproducers that proptest finds
    // become the explicit regression tests below.
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn interpreter_never_panics(input in input()) {
        let exits = run_fuzz_input(&input).expect("sandbox setup");
        prop_assert!(!exits.is_empty());
    }
}

/// Inputs proptest found, kept as fixed regression cases.
#[test]
fn found_inputs_do_not_panic() {
    // bt [rax+0fh], ecx (the displacement byte is the sentinel's first
    // byte) with ecx = -1: a negative bit offset on a memory operand.
    let mut gpr = [0u64; 16];
    gpr[1] = u64::MAX;
    let bt_negative_offset = FuzzInput {
        code: vec![0x0f, 0xa3, 0x48],
        gpr,
        rflags: 0,
        mode: SandboxMode::KernelBare,
        window: vec![0; WINDOW_SIZE],
    };
    run_fuzz_input(&bt_negative_offset).expect("sandbox setup");
}
