//! Cases of the `c32` group: 32-bit code run in compatibility mode.
//!
//! The native side far-jumps from its 64-bit code to the 32-bit user code
//! segment (selector 0x23) and back (0x33); the interpreter runs the same
//! bytes with CS a 32-bit ring-3 code segment under long mode. Items are
//! drawn from forms that exist or differ in 32-bit code: the one-byte
//! INC/DEC, PUSH/POP of general and segment registers, PUSHAD/POPAD, the
//! BCD adjustments, SALC, ARPL, BOUND, near CALL/RET with 32-bit stack
//! slots, far CALL/JMP/RET and IRETD within the 32-bit segment, and the
//! integer forms of 32-, 16- and 8-bit operands with 32-bit addressing.
//! Definedness is followed by the same [`Tracker`] as the 64-bit groups,
//! and the code is encoded for 32-bit mode.

use super::defined::{Definedness, Hints, Tracker};
use super::gen::{Case, Checkpoint, GenConfig, Group};
use super::layout::{self, CODE_ADDR, DATA_ADDR};
use super::rng::Rng;
use super::InitialState;
use iced_x86::{Code, Encoder, Instruction, MemoryOperand, Register};

/// The 32-bit user code selector of Linux x86-64 (and of the sandbox).
pub const USER32_CS: u16 = 0x23;

const R32: [Register; 8] = [
    Register::EAX,
    Register::ECX,
    Register::EDX,
    Register::EBX,
    Register::ESP,
    Register::EBP,
    Register::ESI,
    Register::EDI,
];
const R16: [Register; 8] = [
    Register::AX,
    Register::CX,
    Register::DX,
    Register::BX,
    Register::SP,
    Register::BP,
    Register::SI,
    Register::DI,
];
const R8: [Register; 8] = [
    Register::AL,
    Register::CL,
    Register::DL,
    Register::BL,
    Register::AH,
    Register::CH,
    Register::DH,
    Register::BH,
];

/// Registers that may hold the window base.
const BASES: [usize; 2] = [3, 5];

/// How an item's instructions are built: they may depend on the address
/// they are placed at (far transfers to the next instruction).
struct Builder<'a> {
    rng: &'a mut Rng,
    base: usize,
}

impl Builder<'_> {
    /// A register index other than ESP.
    fn reg(&mut self) -> usize {
        loop {
            let r = self.rng.index(8);
            if r != 4 {
                return r;
            }
        }
    }

    /// A dword (or smaller) in the data page through the base register.
    fn mem(&mut self) -> MemoryOperand {
        let disp = self.rng.range_i64(-0x200, 0x1f8);
        MemoryOperand::with_base_displ(R32[self.base], disp)
    }

    fn imm32(&mut self) -> u32 {
        self.rng.interesting_u64() as u32
    }

    /// One item at `ip`: its instructions, in order.
    fn item(&mut self, ip: u64) -> Option<Vec<Instruction>> {
        use Code as C;
        let alu32 = [
            C::Add_r32_rm32,
            C::Or_r32_rm32,
            C::Adc_r32_rm32,
            C::Sbb_r32_rm32,
            C::And_r32_rm32,
            C::Sub_r32_rm32,
            C::Xor_r32_rm32,
            C::Cmp_r32_rm32,
        ];
        let alu_mi = [
            C::Add_rm32_imm32,
            C::Or_rm32_imm32,
            C::Adc_rm32_imm32,
            C::Sbb_rm32_imm32,
            C::And_rm32_imm32,
            C::Sub_rm32_imm32,
            C::Xor_rm32_imm32,
            C::Cmp_rm32_imm32,
        ];
        let r = self.reg();
        let s = self.reg();
        let one = |i: Result<Instruction, iced_x86::IcedError>| i.ok().map(|i| vec![i]);
        Some(match self.rng.index(30) {
            0 => one(Instruction::with2(*self.rng.pick(&alu32), R32[r], R32[s]))?,
            1 => {
                let m = self.mem();
                one(Instruction::with2(*self.rng.pick(&alu32), R32[r], m))?
            }
            2 => {
                let code = *self.rng.pick(&alu_mi);
                let imm = self.imm32();
                if self.rng.chance(1, 2) {
                    one(Instruction::with2(code, R32[r], imm))?
                } else {
                    let m = self.mem();
                    one(Instruction::with2(code, m, imm))?
                }
            }
            3 => {
                let code = *self
                    .rng
                    .pick(&[C::Add_r16_rm16, C::Sub_r16_rm16, C::Xor_r16_rm16]);
                one(Instruction::with2(code, R16[r], R16[s]))?
            }
            4 => {
                let a = *self.rng.pick(&R8);
                let b = *self.rng.pick(&R8);
                let code = *self
                    .rng
                    .pick(&[C::Add_r8_rm8, C::Sbb_r8_rm8, C::Cmp_r8_rm8]);
                one(Instruction::with2(code, a, b))?
            }
            // The one-byte INC/DEC of 32-bit code (REX prefixes in 64-bit).
            5 => {
                let code = *self
                    .rng
                    .pick(&[C::Inc_r32, C::Dec_r32, C::Inc_r16, C::Dec_r16]);
                let reg = if matches!(code, C::Inc_r32 | C::Dec_r32) {
                    R32[r]
                } else {
                    R16[r]
                };
                one(Instruction::with1(code, reg))?
            }
            6 => {
                let m = self.mem();
                if self.rng.chance(1, 2) {
                    one(Instruction::with2(C::Mov_r32_rm32, R32[r], m))?
                } else {
                    one(Instruction::with2(C::Mov_rm32_r32, m, R32[r]))?
                }
            }
            7 => {
                let m = self.mem();
                let code = *self
                    .rng
                    .pick(&[C::Movzx_r32_rm8, C::Movsx_r32_rm16, C::Lea_r32_m]);
                one(Instruction::with2(code, R32[r], m))?
            }
            8 => vec![
                Instruction::with1(C::Push_r32, R32[s]).ok()?,
                Instruction::with1(C::Pop_r32, R32[r]).ok()?,
            ],
            // PUSHAD, then two of its slots popped (POPAD would write the
            // reserved base register).
            9 => vec![
                Instruction::with(C::Pushad),
                Instruction::with1(C::Pop_r32, R32[r]).ok()?,
                Instruction::with1(C::Pop_r32, R32[s]).ok()?,
            ],
            10 => {
                let imm = self.imm32();
                vec![
                    Instruction::with1(C::Pushd_imm32, imm).ok()?,
                    Instruction::with1(C::Pop_r32, R32[r]).ok()?,
                ]
            }
            // Segment registers: the values of the flat user data segment.
            11 => {
                let (push, pop) = *self.rng.pick(&[
                    (C::Pushd_DS, C::Popd_ES),
                    (C::Pushd_SS, C::Popd_DS),
                    (C::Pushd_ES, C::Popd_DS),
                    (C::Pushd_CS, C::Pop_r32),
                ]);
                let pop = if pop == C::Pop_r32 {
                    Instruction::with1(pop, R32[r]).ok()?
                } else {
                    Instruction::with(pop)
                };
                vec![Instruction::with(push), pop]
            }
            12 => one(Ok(Instruction::with(*self.rng.pick(&[
                C::Daa,
                C::Das,
                C::Aaa,
                C::Aas,
                C::Salc,
            ]))))?,
            13 => {
                let code = *self.rng.pick(&[C::Aam_imm8, C::Aad_imm8]);
                let base = *self.rng.pick(&[10u32, 10, 16, 7, 0, 0xff]);
                one(Instruction::with1(code, base))?
            }
            14 => one(Instruction::with2(C::Arpl_rm16_r16, R16[r], R16[s]))?,
            15 => {
                let m = self.mem();
                one(Instruction::with2(C::Bound_r32_m3232, R32[r], m))?
            }
            // A near call to the next instruction: a 32-bit return address.
            16 => {
                let next = ip + 5;
                vec![
                    Instruction::with_branch(C::Call_rel32_32, next).ok()?,
                    Instruction::with1(C::Pop_r32, R32[r]).ok()?,
                ]
            }
            // A near call and a RET (with an immediate) back.
            17 => {
                // call +1 (skips the RET), ret imm16 ... laid out as:
                // call L; jmp E; L: ret; E:
                let call_len = 5u64;
                let jmp_len = 2u64;
                let ret_at = ip + call_len + jmp_len;
                vec![
                    Instruction::with_branch(C::Call_rel32_32, ret_at).ok()?,
                    Instruction::with_branch(C::Jmp_rel8_32, ret_at + 1).ok()?,
                    Instruction::with(C::Retnd),
                ]
            }
            // Far CALL within the 32-bit segment, then pop EIP and CS.
            18 => {
                let next = ip + 7;
                vec![
                    Instruction::with_far_branch(C::Call_ptr1632, USER32_CS, next as u32).ok()?,
                    Instruction::with1(C::Pop_r32, R32[r]).ok()?,
                    Instruction::with1(C::Pop_r32, R32[s]).ok()?,
                ]
            }
            19 => {
                let next = ip + 7;
                one(Instruction::with_far_branch(
                    C::Jmp_ptr1632,
                    USER32_CS,
                    next as u32,
                ))?
            }
            // PUSH CS; PUSH target; RETF (far return to the same segment).
            20 => {
                let target = ip + 2 + 5 + 1;
                vec![
                    Instruction::with1(C::Pushd_imm8, USER32_CS as u32).ok()?,
                    Instruction::with1(C::Pushd_imm32, target as u32).ok()?,
                    Instruction::with(C::Retfd),
                ]
            }
            // PUSHFD; PUSH CS; PUSH target; IRETD.
            21 => {
                let target = ip + 1 + 2 + 5 + 1;
                vec![
                    Instruction::with(C::Pushfd),
                    Instruction::with1(C::Pushd_imm8, USER32_CS as u32).ok()?,
                    Instruction::with1(C::Pushd_imm32, target as u32).ok()?,
                    Instruction::with(C::Iretd),
                ]
            }
            22 => {
                let count = self.rng.below(40) as u32;
                let code = *self.rng.pick(&[
                    C::Shl_rm32_imm8,
                    C::Shr_rm32_imm8,
                    C::Sar_rm32_imm8,
                    C::Rol_rm32_imm8,
                ]);
                one(Instruction::with2(code, R32[r], count))?
            }
            23 => {
                let code = *self
                    .rng
                    .pick(&[C::Mul_rm32, C::Neg_rm32, C::Not_rm32, C::Bswap_r32]);
                one(Instruction::with1(code, R32[r]))?
            }
            24 => one(Instruction::with2(C::Imul_r32_rm32, R32[r], R32[s]))?,
            25 => one(Ok(Instruction::with(*self.rng.pick(&[
                C::Cdq,
                C::Cwde,
                C::Cbw,
                C::Cwd,
                C::Lahf,
                C::Sahf,
                C::Cmc,
            ]))))?,
            26 => {
                let code = *self.rng.pick(&[C::Sete_rm8, C::Setb_rm8, C::Setl_rm8]);
                one(Instruction::with1(code, *self.rng.pick(&R8)))?
            }
            27 => {
                let code = *self.rng.pick(&[C::Cmove_r32_rm32, C::Cmovb_r32_rm32]);
                one(Instruction::with2(code, R32[r], R32[s]))?
            }
            28 => one(Instruction::with2(C::Xchg_rm32_r32, R32[r], R32[s]))?,
            _ => {
                let v = self.imm32();
                one(Instruction::with2(C::Mov_r32_imm32, R32[r], v))?
            }
        })
    }
}

/// Generates a `c32` case from `rng` (None: draw again).
pub(super) fn try_generate(
    rng: &mut Rng,
    seed: u64,
    index: u64,
    config: &GenConfig,
    initial: impl FnOnce(&mut Rng, usize, u64) -> InitialState,
) -> Option<Case> {
    let base = *rng.pick(&BASES);
    let base_value = DATA_ADDR + 0x600 + rng.below(0x400);
    let initial = initial(rng, base, base_value);
    let mut tracker = Tracker::new(&[base]);
    let mut builder = Builder { rng, base };
    let n_items = 1 + builder.rng.index(config.max_items.max(1));
    let mut code = Vec::new();
    let mut checkpoints = Vec::new();
    let mut boundaries = Vec::new();
    let mut state = Definedness::ALL_DEFINED;
    let mut encoder = Encoder::new(32);
    for _ in 0..n_items {
        // Draw until the tracker accepts a whole item.
        for _ in 0..64 {
            let ip = CODE_ADDR + code.len() as u64;
            let Some(instrs) = builder.item(ip) else {
                continue;
            };
            let mut bytes = Vec::new();
            let mut points = Vec::new();
            let mut s = state;
            let mut ok = true;
            for instr in &instrs {
                let at = ip + bytes.len() as u64;
                let result = encoder.encode(instr, at);
                // Taken at once, so a rejected or failed instruction (which
                // may have written part of itself) leaves nothing behind.
                let encoded = encoder.take_buffer();
                let Ok(len) = result else {
                    ok = false;
                    break;
                };
                let hints = Hints {
                    cl: None,
                    rcx: None,
                };
                let Ok(after) = tracker.apply(&s, instr, hints) else {
                    ok = false;
                    break;
                };
                points.push((at, s));
                s = after;
                bytes.extend_from_slice(&encoded[..len]);
            }
            // The builder's layout assumptions (lengths of the forms
            // that branch to a later instruction of the item) must hold.
            let expected_len = match instrs.first().map(|i| i.code()) {
                Some(Code::Jmp_ptr1632) => Some(7),
                Some(Code::Call_ptr1632) => Some(9),
                Some(Code::Call_rel32_32) if instrs.len() == 3 => Some(8),
                Some(Code::Pushd_imm8) => Some(8),
                Some(Code::Pushfd) => Some(9),
                _ => None,
            };
            if !ok || expected_len.is_some_and(|n| n != bytes.len()) {
                continue;
            }
            if code.len() + bytes.len() > layout::MAX_SNIPPET_LEN {
                break;
            }
            for (at, s) in points {
                boundaries.push(at);
                checkpoints.push(Checkpoint {
                    addr: at,
                    defined: s,
                });
            }
            code.extend_from_slice(&bytes);
            state = s;
            break;
        }
    }
    if code.is_empty() {
        return None;
    }
    Some(Case {
        seed,
        index,
        group: Group::C32,
        code,
        initial,
        checkpoints,
        boundaries,
        end: state,
    })
}

#[cfg(test)]
mod tests {
    use super::super::gen::generate_case;
    use super::*;

    fn config() -> GenConfig {
        GenConfig {
            groups: vec![Group::C32],
            ..GenConfig::for_host()
        }
    }

    #[test]
    fn cases_decode_whole_as_32_bit_code_and_are_deterministic() {
        let mut mnemonics = std::collections::BTreeSet::new();
        for index in 0..400 {
            let case = generate_case(3, index, &config());
            let again = generate_case(3, index, &config());
            assert_eq!(case.code, again.code);
            assert_eq!(case.initial, again.initial);
            assert_eq!(case.group, Group::C32);
            for (addr, bytes, text) in case.disassembly() {
                assert!(
                    !text.starts_with("(bad"),
                    "case {index} {addr:#x}: {bytes:02x?} {:x?} {:02x?}",
                    case.boundaries,
                    case.code
                );
                mnemonics.insert(text.split(' ').next().unwrap_or("").to_string());
            }
            assert_eq!(case.checkpoints[0].addr, CODE_ADDR);
        }
        // The forms only 32-bit code has are drawn.
        for m in ["pushad", "daa", "aam", "salc", "arpl", "bound", "iretd"] {
            assert!(mnemonics.contains(m), "{m} never generated: {mnemonics:?}");
        }
    }
}
