//! Fuzzing the interpreter for panics: arbitrary bytes as code, arbitrary
//! register values, ring 0 bare mode and ring 3 guest mode.
//!
//! The property is only that `Cpu::run` returns: any `VmExit` is fine, a
//! panic is a bug (guest-controlled input must never panic the host).

use super::gen::{generate_case, GenConfig};
use super::interp::{Sandbox, SandboxError, SandboxMode};
use super::layout::{CODE_SIZE, DATA_ADDR, INITIAL_RSP, STACK_ADDR, WINDOW_SIZE};
use super::rng::Rng;
use crate::cpu::state::rflags;
use crate::jit::Engine;
use crate::vmx::{IoDirection, VmExit};
use std::fmt::Write as _;

/// Cycle budget of one fuzz run.
pub const FUZZ_CYCLE_LIMIT: u64 = 20_000;
/// How many times one input re-enters `run` after an exit it can resume
/// from (skipping the exiting instruction).
pub const FUZZ_MAX_ENTRIES: usize = 4;
/// Longest generated code.
pub const FUZZ_MAX_CODE: usize = 96;

/// One fuzz input.
#[derive(Clone, PartialEq, Eq)]
pub struct FuzzInput {
    pub code: Vec<u8>,
    pub gpr: [u64; 16],
    /// Loaded as is (masked to the writable bits), so TF, AC and IOPL can
    /// be on.
    pub rflags: u64,
    pub mode: SandboxMode,
    /// Window contents (data page, then stack page).
    pub window: Vec<u8>,
}

impl std::fmt::Debug for FuzzInput {
    /// Everything but the window in full (a shrunk proptest input stays
    /// readable); the window as its first bytes and distinct values.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut distinct: Vec<u8> = self.window.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let head: Vec<u8> = self.window.iter().take(16).copied().collect();
        f.debug_struct("FuzzInput")
            .field("code", &format_args!("{:02x?}", self.code))
            .field("gpr", &format_args!("{:#x?}", self.gpr))
            .field("rflags", &format_args!("{:#x}", self.rflags))
            .field("mode", &self.mode)
            .field(
                "window",
                &format_args!(
                    "{} bytes, first {head:02x?}, {} distinct values",
                    self.window.len(),
                    distinct.len()
                ),
            )
            .finish()
    }
}

/// Legacy and REX prefixes.
pub const PREFIXES: [u8; 27] = [
    0x66, 0x67, 0xf0, 0xf2, 0xf3, 0x2e, 0x36, 0x3e, 0x26, 0x64, 0x65, 0x40, 0x41, 0x42, 0x43, 0x44,
    0x45, 0x46, 0x47, 0x48, 0x49, 0x4a, 0x4b, 0x4c, 0x4d, 0x4e, 0x4f,
];

/// Opcode fragments that start interesting instructions: escapes, groups,
/// string and stack operations, system instructions.
pub const OPCODES: &[&[u8]] = &[
    &[0x0f],
    &[0x0f, 0x01],
    &[0x0f, 0x00],
    &[0x0f, 0x38],
    &[0x0f, 0x3a],
    &[0x0f, 0x20],
    &[0x0f, 0x22],
    &[0x0f, 0x30],
    &[0x0f, 0x32],
    &[0x0f, 0x05],
    &[0x0f, 0x07],
    &[0x0f, 0x31],
    &[0x0f, 0xa2],
    &[0x0f, 0xb0],
    &[0x0f, 0xb1],
    &[0x0f, 0xc7],
    &[0x0f, 0xc0],
    &[0x0f, 0xa3],
    &[0x0f, 0xab],
    &[0x0f, 0xba],
    &[0x0f, 0xbc],
    &[0x0f, 0xbd],
    &[0x0f, 0xa4],
    &[0x0f, 0xa5],
    &[0xf6],
    &[0xf7],
    &[0xfe],
    &[0xff],
    &[0xc0],
    &[0xd3],
    &[0x8f],
    &[0xc6],
    &[0xa4],
    &[0xa7],
    &[0xaf],
    &[0xcd],
    &[0xcf],
    &[0xe4],
    &[0xee],
    &[0xf4],
    // x87: the eight escape opcodes (register and memory forms from the
    // random ModRM that follows) and FWAIT.
    &[0xd8],
    &[0xd9],
    &[0xda],
    &[0xdb],
    &[0xdc],
    &[0xdd],
    &[0xde],
    &[0xdf],
    &[0x9b],
    // SSE/SSE2 (with 66/F2/F3 from the prefixes), FXSAVE/LDMXCSR group.
    &[0x0f, 0x10],
    &[0x0f, 0x12],
    &[0x0f, 0x16],
    &[0x0f, 0x28],
    &[0x0f, 0x2a],
    &[0x0f, 0x2c],
    &[0x0f, 0x2e],
    &[0x0f, 0x51],
    &[0x0f, 0x58],
    &[0x0f, 0x5a],
    &[0x0f, 0x5b],
    &[0x0f, 0x5e],
    &[0x0f, 0x60],
    &[0x0f, 0x6e],
    &[0x0f, 0x6f],
    &[0x0f, 0x70],
    &[0x0f, 0x73],
    &[0x0f, 0x7e],
    &[0x0f, 0xae],
    &[0x0f, 0xc2],
    &[0x0f, 0xc4],
    &[0x0f, 0xc6],
    &[0x0f, 0xd6],
    &[0x0f, 0xd7],
    &[0x0f, 0xe6],
    &[0x0f, 0xe7],
    &[0x0f, 0xf6],
    &[0x66, 0x0f, 0xef],
    &[0xf2, 0x0f, 0x59],
    &[0xf3, 0x0f, 0x7e],
];

impl FuzzInput {
    /// Draws an input: random bytes, prefix/opcode soup, or a mutated
    /// difftest snippet; registers mixing edge values and window
    /// pointers; either mode.
    pub fn generate(rng: &mut Rng) -> FuzzInput {
        let code = match rng.below(3) {
            0 => {
                let mut code = vec![0u8; 1 + rng.index(FUZZ_MAX_CODE)];
                rng.fill(&mut code);
                code
            }
            1 => soup(rng),
            _ => mutated_snippet(rng),
        };
        let mut gpr = [0u64; 16];
        for v in gpr.iter_mut() {
            *v = match rng.below(4) {
                0 => DATA_ADDR + rng.below(0x1000),
                1 => STACK_ADDR + rng.below(0x1000),
                _ => rng.interesting_u64(),
            };
        }
        if rng.chance(7, 8) {
            gpr[4] = INITIAL_RSP;
        }
        let mut flags = rng.next_u64() & (rflags::ARITH | rflags::DF);
        for (bit, odds) in [
            (rflags::TF, 16),
            (rflags::AC, 16),
            (rflags::IOPL, 8),
            (rflags::NT, 16),
        ] {
            if rng.chance(1, odds) {
                flags |= bit;
            }
        }
        let mode = match rng.below(7) {
            0 | 1 => SandboxMode::KernelBare,
            // 16-bit real mode and 32-bit protected mode (paging off).
            5 => SandboxMode::KernelReal,
            6 => SandboxMode::KernelProtected32,
            2 => SandboxMode::UserGuest {
                exception_bitmap: 0xffff_ffff,
            },
            // 32-bit decoding and execution in compatibility mode.
            3 => SandboxMode::UserGuestCompat {
                exception_bitmap: rng.next_u64() as u32,
            },
            _ => SandboxMode::UserGuest {
                exception_bitmap: rng.next_u64() as u32,
            },
        };
        let mut window = vec![0u8; WINDOW_SIZE];
        rng.fill(&mut window);
        FuzzInput {
            code,
            gpr,
            rflags: flags,
            mode,
            window,
        }
    }

    /// A reproducible description (code bytes, registers, flags, mode).
    pub fn describe(&self) -> String {
        let mut s = String::new();
        let hex: String = self.code.iter().map(|b| format!("{b:02x}")).collect();
        let _ = writeln!(s, "mode: {:?}", self.mode);
        let _ = writeln!(s, "code: {hex}");
        for (i, chunk) in self.gpr.chunks(4).enumerate() {
            let regs: Vec<String> = chunk
                .iter()
                .enumerate()
                .map(|(j, v)| format!("{}={v:016x}", super::GPR_NAMES[i * 4 + j]))
                .collect();
            let _ = writeln!(s, "{}", regs.join(" "));
        }
        let _ = writeln!(s, "rflags: {:#x}", self.rflags);
        s
    }
}

/// Prefixes, opcode fragments and random bytes, concatenated.
fn soup(rng: &mut Rng) -> Vec<u8> {
    let mut code = Vec::new();
    while code.len() < FUZZ_MAX_CODE - 16 && !(code.len() > 4 && rng.chance(1, 12)) {
        match rng.below(4) {
            0 => code.push(*rng.pick(&PREFIXES)),
            1 => {
                let opcode: &[u8] = OPCODES[rng.index(OPCODES.len())];
                code.extend_from_slice(opcode);
            }
            _ => {
                let n = 1 + rng.index(6);
                for _ in 0..n {
                    code.push(rng.next_u64() as u8);
                }
            }
        }
    }
    code
}

/// A generated difftest snippet with a few bytes flipped, inserted or
/// removed.
fn mutated_snippet(rng: &mut Rng) -> Vec<u8> {
    let config = GenConfig {
        max_items: 6,
        lzcnt: true,
        tzcnt: true,
        popcnt: true,
        groups: super::gen::Group::ALL.to_vec(),
    };
    let mut code = generate_case(rng.next_u64(), 0, &config).code;
    let edits = rng.below(4);
    for _ in 0..edits {
        let at = rng.index(code.len() + 1);
        match rng.below(3) {
            0 if at < code.len() => code[at] ^= 1 << rng.below(8),
            1 => code.insert(at, rng.next_u64() as u8),
            _ if at < code.len() => {
                code.remove(at);
            }
            _ => code.push(*rng.pick(&PREFIXES)),
        }
    }
    code.truncate(CODE_SIZE as usize - 8);
    if code.is_empty() {
        code.push(0x90);
    }
    code
}

/// Runs `input` on both engines (the interpreter, then the translator,
/// which translates every block on its first run) and returns the exits.
/// The engines must agree on the exits, the final state and cycles and
/// memory: a disagreement panics, which the fuzzer reports as a finding.
pub fn run_fuzz_input(input: &FuzzInput) -> Result<Vec<VmExit>, SandboxError> {
    let (exits, digest) = run_fuzz_input_on(input, Engine::Interp)?;
    let (jit_exits, jit_digest) = run_fuzz_input_on(input, Engine::Jit)?;
    assert!(
        exits == jit_exits && digest == jit_digest,
        "engines disagree: interp exits {exits:?} state {digest:#x}, jit exits {jit_exits:?} state {jit_digest:#x}"
    );
    Ok(exits)
}

/// Runs `input` on `engine`. After an exit that a hypervisor would
/// complete by skipping the instruction (I/O, CPUID, MSR, HLT, VMCALL, ...)
/// it re-enters, up to [`FUZZ_MAX_ENTRIES`] times. Returns the exits and a
/// digest of the final state, cycles and the memory window.
pub fn run_fuzz_input_on(
    input: &FuzzInput,
    engine: Engine,
) -> Result<(Vec<VmExit>, u64), SandboxError> {
    let sandbox = Sandbox::new(&input.code, &input.window)?;
    let mut cpu = sandbox.cpu(&input.mode, &input.gpr, 0);
    cpu.set_engine(engine);
    cpu.set_jit_threshold(1);
    cpu.state_mut().rflags = (input.rflags & rflags::WRITABLE) | rflags::FIXED1;
    let mut exits = Vec::new();
    let mut budget = FUZZ_CYCLE_LIMIT;
    for _ in 0..FUZZ_MAX_ENTRIES {
        let limit = cpu.cycles().saturating_add(budget);
        let exit = cpu.run(sandbox.memory(), limit);
        budget /= 2;
        let resume = match &exit {
            VmExit::Io {
                direction: IoDirection::In,
                size,
                ..
            } => {
                cpu.complete_io_in(*size, u32::MAX);
                true
            }
            VmExit::MsrRead { .. } => {
                cpu.complete_rdmsr(0);
                true
            }
            VmExit::Io { .. }
            | VmExit::Cpuid
            | VmExit::Vmcall
            | VmExit::Hlt
            | VmExit::Rdtsc { .. }
            | VmExit::MsrWrite { .. }
            | VmExit::Invlpg { .. }
            | VmExit::CrAccess(_) => {
                cpu.skip_instruction();
                true
            }
            _ => false,
        };
        exits.push(exit);
        if !resume {
            break;
        }
    }
    let mut h = crate::cpu::state::Fnv::default();
    h.u64(cpu.state_digest());
    for b in sandbox.window() {
        h.u64(b as u64);
    }
    Ok((exits, h.finish()))
}

#[cfg(test)]
mod tests {
    use super::super::layout::CODE_ADDR;
    use super::*;

    #[test]
    fn inputs_are_deterministic_and_varied() {
        let a = FuzzInput::generate(&mut Rng::for_item(9, 1));
        let b = FuzzInput::generate(&mut Rng::for_item(9, 1));
        assert_eq!(a, b);
        let mut kernel = 0;
        let mut legacy = 0;
        for i in 0..200 {
            let input = FuzzInput::generate(&mut Rng::for_item(9, i));
            assert!(!input.code.is_empty() && input.code.len() < CODE_SIZE as usize - 3);
            kernel += (input.mode == SandboxMode::KernelBare) as u32;
            legacy += matches!(
                input.mode,
                SandboxMode::KernelReal | SandboxMode::KernelProtected32
            ) as u32;
            assert!(input.describe().contains("code: "));
        }
        assert!((40..160).contains(&kernel));
        assert!(
            (20..100).contains(&legacy),
            "real and 32-bit protected mode: {legacy}"
        );
    }

    #[test]
    fn code_address_is_where_the_sandbox_puts_code() {
        let input = FuzzInput::generate(&mut Rng::new(1));
        let sandbox = Sandbox::new(&input.code, &input.window).unwrap();
        assert_eq!(
            sandbox.memory().read(crate::Hpa(CODE_ADDR), 1).unwrap(),
            input.code[0] as u64
        );
    }
}
