//! The translator's final assembly step: the emitter's instruction list
//! (from iced's `CodeAssembler`) to bytes, in one encoding pass.
//!
//! iced's `BlockEncoder` (what `CodeAssembler::assemble` runs) is general:
//! it wraps every instruction, encodes it to learn its size, then iterates
//! the layout, re-encoding as branches are shortened. On translated blocks
//! (a few hundred instructions, most of them in slow paths and exit stubs
//! run rarely) that was most of the cost of translating a block. The code
//! the emitter produces is much simpler: every label is an instruction of
//! the block itself, and the only instructions whose bytes depend on where
//! they are are the direct branches to those labels (no RIP-relative
//! operands). So:
//!
//! 1. every instruction but the direct branches is encoded once, with one
//!    [`Encoder`], into one buffer (their bytes do not depend on where they
//!    end up);
//! 2. the layout is computed with every branch in its near (rel32) form,
//!    then each branch whose displacement fits in a byte in that layout
//!    takes its short form (shortening only brings every other branch's
//!    target closer, so a branch that fits keeps fitting), repeated while
//!    that shortens something;
//! 3. the pieces are copied out and the branches written by hand.
//!
//! Labels are as `CodeAssembler` represents them: the labelled
//! instruction's IP is the label's id (0 for no label) and a branch's
//! target is the id of the label it goes to.
//!
//! [`verify`] checks a result against iced's `BlockEncoder` (the same
//! instruction sequence, byte for byte outside the branches, and every
//! branch of the same kind going to the same instruction); translation
//! runs it when [`set_verify_encoding`] or `FAULTLINE_JIT_VERIFY` asks.

use super::NotTranslated;
use crate::cpu::code_cache::Block;
use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, ConditionCode, Decoder, DecoderOptions, Encoder,
    Instruction, InstructionBlock, OpKind, Register,
};
use std::sync::atomic::{AtomicU8, Ordering};

/// Labels above this are refused (the label table is a vector indexed by
/// label id; the emitter creates a few per guest instruction).
const MAX_LABEL: u64 = 1 << 20;

/// A direct branch to a label of the block.
#[derive(Clone, Copy, Debug)]
struct Branch {
    /// Index of the branch in the instruction list.
    at: usize,
    /// Index of the instruction it goes to.
    to: usize,
    /// The number of branches before that instruction.
    rank: usize,
    kind: Kind,
    short: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Jcc with this condition (the low nibble of its opcode).
    Jcc(u8),
    Jmp,
    Call,
}

impl Kind {
    fn len(self, short: bool) -> u32 {
        match (self, short) {
            (Kind::Jcc(_) | Kind::Jmp, true) => 2,
            (Kind::Jcc(_), false) => 6,
            (Kind::Jmp | Kind::Call, false) => 5,
            // CALL has no short form.
            (Kind::Call, true) => 5,
        }
    }
}

/// The code of `instrs` placed at any address (it is position
/// independent), and where each instruction is in it.
#[derive(Debug)]
pub(super) struct Encoded {
    pub code: Vec<u8>,
    /// Where each instruction's bytes start in pass 1's buffer (where
    /// there are no branches), and the end of that buffer.
    piece: Vec<u32>,
    /// The branches, in order, and `prefix[j]`: the bytes of the
    /// branches before branch `j` (`prefix[len]`: of all of them).
    branches: Vec<Branch>,
    prefix: Vec<u32>,
}

impl Encoded {
    /// The offset of instruction `k` in the code (`k` = the number of
    /// instructions: the end).
    pub fn offset(&self, k: usize) -> u32 {
        self.piece[k] + self.prefix[self.branches.partition_point(|b| b.at < k)]
    }
}

fn err(msg: &str) -> NotTranslated {
    NotTranslated::Asm(msg.to_string())
}

/// Encodes `instrs` (see the module documentation). Fails on anything the
/// emitter does not produce: a branch to a label no instruction carries,
/// a label on two instructions, a branch other than JMP, Jcc or CALL to a
/// label, a RIP-relative operand, or an instruction iced refuses.
pub(super) fn encode(instrs: &[Instruction]) -> Result<Encoded, NotTranslated> {
    let n = instrs.len();
    // Label id -> instruction index.
    let max_label = instrs.iter().map(|i| i.ip()).max().unwrap_or(0);
    if max_label > MAX_LABEL {
        return Err(err("label id out of range"));
    }
    let mut label_at = vec![u32::MAX; max_label as usize + 1];
    for (k, i) in instrs.iter().enumerate() {
        let id = i.ip() as usize;
        if id != 0 {
            if label_at[id] != u32::MAX {
                return Err(err("a label on two instructions"));
            }
            label_at[id] = k as u32;
        }
    }
    // Pass 1: everything but the branches, once, into one buffer: by hand
    // for the shapes the emitter uses most, by iced's encoder otherwise.
    let mut bytes = Vec::with_capacity(n * 5);
    let mut enc: Option<Encoder> = None;
    let mut piece = Vec::with_capacity(n + 1);
    let mut branches = Vec::new();
    for (k, i) in instrs.iter().enumerate() {
        piece.push(bytes.len() as u32);
        if i.op_count() == 1 && i.op0_kind() == OpKind::NearBranch64 {
            let kind = match i.code() {
                Code::Jmp_rel8_64 | Code::Jmp_rel32_64 => Kind::Jmp,
                Code::Call_rel32_64 => Kind::Call,
                _ if i.is_jcc_short_or_near() => match i.condition_code() {
                    ConditionCode::None => return Err(err("a Jcc without a condition")),
                    cc => Kind::Jcc(cc as u8 - 1),
                },
                _ => return Err(err("a direct branch other than JMP, Jcc or CALL")),
            };
            let target = i.near_branch_target();
            let to = match label_at.get(target as usize) {
                Some(&t) if target != 0 && t != u32::MAX => t as usize,
                _ => return Err(err("a branch to a label no instruction carries")),
            };
            branches.push(Branch {
                at: k,
                to,
                rank: 0,
                kind,
                short: false,
            });
            continue;
        }
        if i.code() == Code::Zero_bytes || hand(i, &mut bytes) {
            continue;
        }
        if i.is_ip_rel_memory_operand() {
            return Err(err("a RIP-relative operand"));
        }
        let e = match &mut enc {
            Some(e) => e,
            None => enc.insert(Encoder::try_with_capacity(64, 0)?),
        };
        e.set_buffer(std::mem::take(&mut bytes));
        let r = e.encode(i, 0);
        bytes = e.take_buffer();
        r?;
    }
    piece.push(bytes.len() as u32);
    // Pass 2: the layout. An instruction's offset is where pass 1 put it
    // plus the bytes of the branches before it (`prefix`). All branches
    // start near; then, in rounds, each branch whose displacement fits in
    // a byte takes its short form. Within a round the branches are taken
    // in order, each seeing the shortenings before it; those after it
    // would only bring its target closer (so it keeps fitting).
    for j in 0..branches.len() {
        let to = branches[j].to;
        branches[j].rank = branches.partition_point(|b| b.at < to);
    }
    let mut prefix = Vec::with_capacity(branches.len() + 1);
    prefix.push(0u32);
    for b in &branches {
        prefix.push(prefix.last().copied().unwrap_or(0) + b.kind.len(false));
    }
    loop {
        let mut changed = false;
        // `prefix[..=j]` is this round's; the rest last round's, minus
        // `saved`.
        let mut saved = 0u32;
        for j in 0..branches.len() {
            let b = branches[j];
            let at = piece[b.at] + prefix[j];
            if !b.short && b.kind != Kind::Call {
                let (long, short) = (b.kind.len(false), b.kind.len(true));
                let target = if b.rank > j {
                    piece[b.to] + prefix[b.rank] - saved - (long - short)
                } else {
                    piece[b.to] + prefix[b.rank]
                };
                let d = i64::from(target) - i64::from(at + short);
                if d == d as i8 as i64 {
                    branches[j].short = true;
                    saved += long - short;
                    changed = true;
                }
            }
            prefix[j + 1] = prefix[j] + branches[j].kind.len(branches[j].short);
        }
        if !changed {
            break;
        }
    }
    // Pass 3: the bytes, the runs between branches copied whole.
    let end = piece[n] + prefix[branches.len()];
    let mut code = Vec::with_capacity(end as usize);
    let mut from = 0usize;
    for (j, b) in branches.iter().enumerate() {
        code.extend_from_slice(&bytes[from..piece[b.at] as usize]);
        from = piece[b.at] as usize;
        let next = piece[b.at] + prefix[j + 1];
        let d = i64::from(piece[b.to] + prefix[b.rank]) - i64::from(next);
        match (b.kind, b.short) {
            (Kind::Jcc(cc), true) => code.extend_from_slice(&[0x70 | cc, d as i8 as u8]),
            (Kind::Jmp, true) => code.extend_from_slice(&[0xeb, d as i8 as u8]),
            (Kind::Jcc(cc), false) => {
                code.extend_from_slice(&[0x0f, 0x80 | cc]);
                code.extend_from_slice(&(d as i32).to_le_bytes());
            }
            (Kind::Jmp, false) | (Kind::Call, _) => {
                code.push(if b.kind == Kind::Jmp { 0xe9 } else { 0xe8 });
                code.extend_from_slice(&(d as i32).to_le_bytes());
            }
        }
    }
    code.extend_from_slice(&bytes[from..]);
    debug_assert_eq!(code.len() as u32, end);
    Ok(Encoded {
        code,
        piece,
        branches,
        prefix,
    })
}

/// How an instruction's operands are placed in its bytes (the forms the
/// hand encoder knows; see [`shape`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// `reg, r/m`: operand 0 in ModRM.reg, operand 1 in ModRM.rm.
    Rm,
    /// `reg, m` (LEA): as `Rm`, operand 1 memory only.
    Lea,
    /// `r/m, reg`: operand 0 in ModRM.rm, operand 1 in ModRM.reg.
    Mr,
    /// `r/m`: operand 0 in ModRM.rm, this opcode extension in ModRM.reg.
    Digit(u8),
    /// `r/m, cl`: as `Digit`, operand 1 CL.
    DigitCl(u8),
    /// `reg`: operand 0 in the low three bits of the opcode.
    OpReg,
    /// `acc, imm`: operand 0 this register, implicit in the opcode.
    Acc(Register),
    /// No operands.
    Bare,
}

/// One instruction shape: prefix 66h, REX.W, the opcode (two bytes when
/// above 0xff: 0Fh and the low byte), the form, the immediate's bytes
/// (the last operand), and the widths of operands 0 and 1 when they are
/// registers (0: never a register).
#[derive(Clone, Copy, Debug)]
struct Shape {
    p66: bool,
    w: bool,
    op: u16,
    form: Form,
    imm: u8,
    w0: u8,
    w1: u8,
}

const fn s(p66: bool, w: bool, op: u16, form: Form, imm: u8, w0: u8, w1: u8) -> Option<Shape> {
    Some(Shape {
        p66,
        w,
        op,
        form,
        imm,
        w0,
        w1,
    })
}

/// The shapes the hand encoder knows: the legacy-map integer forms the
/// emitter produces (the test `hand_encoding_is_iced_encoding` checks
/// every one against iced's encoder).
fn shape(c: Code) -> Option<Shape> {
    match c {
        Code::Add_rm8_r8 => s(false, false, 0x0000, Form::Mr, 0, 8, 8),
        Code::Add_rm16_r16 => s(true, false, 0x0001, Form::Mr, 0, 16, 16),
        Code::Add_rm32_r32 => s(false, false, 0x0001, Form::Mr, 0, 32, 32),
        Code::Add_rm64_r64 => s(false, true, 0x0001, Form::Mr, 0, 64, 64),
        Code::Add_r8_rm8 => s(false, false, 0x0002, Form::Rm, 0, 8, 8),
        Code::Add_r16_rm16 => s(true, false, 0x0003, Form::Rm, 0, 16, 16),
        Code::Add_r32_rm32 => s(false, false, 0x0003, Form::Rm, 0, 32, 32),
        Code::Add_r64_rm64 => s(false, true, 0x0003, Form::Rm, 0, 64, 64),
        Code::Add_AL_imm8 => s(false, false, 0x0004, Form::Acc(Register::AL), 1, 8, 0),
        Code::Add_AX_imm16 => s(true, false, 0x0005, Form::Acc(Register::AX), 2, 16, 0),
        Code::Add_EAX_imm32 => s(false, false, 0x0005, Form::Acc(Register::EAX), 4, 32, 0),
        Code::Add_RAX_imm32 => s(false, true, 0x0005, Form::Acc(Register::RAX), 4, 64, 0),
        Code::Add_rm8_imm8 => s(false, false, 0x0080, Form::Digit(0), 1, 8, 0),
        Code::Add_rm16_imm16 => s(true, false, 0x0081, Form::Digit(0), 2, 16, 0),
        Code::Add_rm32_imm32 => s(false, false, 0x0081, Form::Digit(0), 4, 32, 0),
        Code::Add_rm64_imm32 => s(false, true, 0x0081, Form::Digit(0), 4, 64, 0),
        Code::Add_rm16_imm8 => s(true, false, 0x0083, Form::Digit(0), 1, 16, 0),
        Code::Add_rm32_imm8 => s(false, false, 0x0083, Form::Digit(0), 1, 32, 0),
        Code::Add_rm64_imm8 => s(false, true, 0x0083, Form::Digit(0), 1, 64, 0),
        Code::Or_rm8_r8 => s(false, false, 0x0008, Form::Mr, 0, 8, 8),
        Code::Or_rm16_r16 => s(true, false, 0x0009, Form::Mr, 0, 16, 16),
        Code::Or_rm32_r32 => s(false, false, 0x0009, Form::Mr, 0, 32, 32),
        Code::Or_rm64_r64 => s(false, true, 0x0009, Form::Mr, 0, 64, 64),
        Code::Or_r8_rm8 => s(false, false, 0x000a, Form::Rm, 0, 8, 8),
        Code::Or_r16_rm16 => s(true, false, 0x000b, Form::Rm, 0, 16, 16),
        Code::Or_r32_rm32 => s(false, false, 0x000b, Form::Rm, 0, 32, 32),
        Code::Or_r64_rm64 => s(false, true, 0x000b, Form::Rm, 0, 64, 64),
        Code::Or_AL_imm8 => s(false, false, 0x000c, Form::Acc(Register::AL), 1, 8, 0),
        Code::Or_AX_imm16 => s(true, false, 0x000d, Form::Acc(Register::AX), 2, 16, 0),
        Code::Or_EAX_imm32 => s(false, false, 0x000d, Form::Acc(Register::EAX), 4, 32, 0),
        Code::Or_RAX_imm32 => s(false, true, 0x000d, Form::Acc(Register::RAX), 4, 64, 0),
        Code::Or_rm8_imm8 => s(false, false, 0x0080, Form::Digit(1), 1, 8, 0),
        Code::Or_rm16_imm16 => s(true, false, 0x0081, Form::Digit(1), 2, 16, 0),
        Code::Or_rm32_imm32 => s(false, false, 0x0081, Form::Digit(1), 4, 32, 0),
        Code::Or_rm64_imm32 => s(false, true, 0x0081, Form::Digit(1), 4, 64, 0),
        Code::Or_rm16_imm8 => s(true, false, 0x0083, Form::Digit(1), 1, 16, 0),
        Code::Or_rm32_imm8 => s(false, false, 0x0083, Form::Digit(1), 1, 32, 0),
        Code::Or_rm64_imm8 => s(false, true, 0x0083, Form::Digit(1), 1, 64, 0),
        Code::Adc_rm8_r8 => s(false, false, 0x0010, Form::Mr, 0, 8, 8),
        Code::Adc_rm16_r16 => s(true, false, 0x0011, Form::Mr, 0, 16, 16),
        Code::Adc_rm32_r32 => s(false, false, 0x0011, Form::Mr, 0, 32, 32),
        Code::Adc_rm64_r64 => s(false, true, 0x0011, Form::Mr, 0, 64, 64),
        Code::Adc_r8_rm8 => s(false, false, 0x0012, Form::Rm, 0, 8, 8),
        Code::Adc_r16_rm16 => s(true, false, 0x0013, Form::Rm, 0, 16, 16),
        Code::Adc_r32_rm32 => s(false, false, 0x0013, Form::Rm, 0, 32, 32),
        Code::Adc_r64_rm64 => s(false, true, 0x0013, Form::Rm, 0, 64, 64),
        Code::Adc_AL_imm8 => s(false, false, 0x0014, Form::Acc(Register::AL), 1, 8, 0),
        Code::Adc_AX_imm16 => s(true, false, 0x0015, Form::Acc(Register::AX), 2, 16, 0),
        Code::Adc_EAX_imm32 => s(false, false, 0x0015, Form::Acc(Register::EAX), 4, 32, 0),
        Code::Adc_RAX_imm32 => s(false, true, 0x0015, Form::Acc(Register::RAX), 4, 64, 0),
        Code::Adc_rm8_imm8 => s(false, false, 0x0080, Form::Digit(2), 1, 8, 0),
        Code::Adc_rm16_imm16 => s(true, false, 0x0081, Form::Digit(2), 2, 16, 0),
        Code::Adc_rm32_imm32 => s(false, false, 0x0081, Form::Digit(2), 4, 32, 0),
        Code::Adc_rm64_imm32 => s(false, true, 0x0081, Form::Digit(2), 4, 64, 0),
        Code::Adc_rm16_imm8 => s(true, false, 0x0083, Form::Digit(2), 1, 16, 0),
        Code::Adc_rm32_imm8 => s(false, false, 0x0083, Form::Digit(2), 1, 32, 0),
        Code::Adc_rm64_imm8 => s(false, true, 0x0083, Form::Digit(2), 1, 64, 0),
        Code::Sbb_rm8_r8 => s(false, false, 0x0018, Form::Mr, 0, 8, 8),
        Code::Sbb_rm16_r16 => s(true, false, 0x0019, Form::Mr, 0, 16, 16),
        Code::Sbb_rm32_r32 => s(false, false, 0x0019, Form::Mr, 0, 32, 32),
        Code::Sbb_rm64_r64 => s(false, true, 0x0019, Form::Mr, 0, 64, 64),
        Code::Sbb_r8_rm8 => s(false, false, 0x001a, Form::Rm, 0, 8, 8),
        Code::Sbb_r16_rm16 => s(true, false, 0x001b, Form::Rm, 0, 16, 16),
        Code::Sbb_r32_rm32 => s(false, false, 0x001b, Form::Rm, 0, 32, 32),
        Code::Sbb_r64_rm64 => s(false, true, 0x001b, Form::Rm, 0, 64, 64),
        Code::Sbb_AL_imm8 => s(false, false, 0x001c, Form::Acc(Register::AL), 1, 8, 0),
        Code::Sbb_AX_imm16 => s(true, false, 0x001d, Form::Acc(Register::AX), 2, 16, 0),
        Code::Sbb_EAX_imm32 => s(false, false, 0x001d, Form::Acc(Register::EAX), 4, 32, 0),
        Code::Sbb_RAX_imm32 => s(false, true, 0x001d, Form::Acc(Register::RAX), 4, 64, 0),
        Code::Sbb_rm8_imm8 => s(false, false, 0x0080, Form::Digit(3), 1, 8, 0),
        Code::Sbb_rm16_imm16 => s(true, false, 0x0081, Form::Digit(3), 2, 16, 0),
        Code::Sbb_rm32_imm32 => s(false, false, 0x0081, Form::Digit(3), 4, 32, 0),
        Code::Sbb_rm64_imm32 => s(false, true, 0x0081, Form::Digit(3), 4, 64, 0),
        Code::Sbb_rm16_imm8 => s(true, false, 0x0083, Form::Digit(3), 1, 16, 0),
        Code::Sbb_rm32_imm8 => s(false, false, 0x0083, Form::Digit(3), 1, 32, 0),
        Code::Sbb_rm64_imm8 => s(false, true, 0x0083, Form::Digit(3), 1, 64, 0),
        Code::And_rm8_r8 => s(false, false, 0x0020, Form::Mr, 0, 8, 8),
        Code::And_rm16_r16 => s(true, false, 0x0021, Form::Mr, 0, 16, 16),
        Code::And_rm32_r32 => s(false, false, 0x0021, Form::Mr, 0, 32, 32),
        Code::And_rm64_r64 => s(false, true, 0x0021, Form::Mr, 0, 64, 64),
        Code::And_r8_rm8 => s(false, false, 0x0022, Form::Rm, 0, 8, 8),
        Code::And_r16_rm16 => s(true, false, 0x0023, Form::Rm, 0, 16, 16),
        Code::And_r32_rm32 => s(false, false, 0x0023, Form::Rm, 0, 32, 32),
        Code::And_r64_rm64 => s(false, true, 0x0023, Form::Rm, 0, 64, 64),
        Code::And_AL_imm8 => s(false, false, 0x0024, Form::Acc(Register::AL), 1, 8, 0),
        Code::And_AX_imm16 => s(true, false, 0x0025, Form::Acc(Register::AX), 2, 16, 0),
        Code::And_EAX_imm32 => s(false, false, 0x0025, Form::Acc(Register::EAX), 4, 32, 0),
        Code::And_RAX_imm32 => s(false, true, 0x0025, Form::Acc(Register::RAX), 4, 64, 0),
        Code::And_rm8_imm8 => s(false, false, 0x0080, Form::Digit(4), 1, 8, 0),
        Code::And_rm16_imm16 => s(true, false, 0x0081, Form::Digit(4), 2, 16, 0),
        Code::And_rm32_imm32 => s(false, false, 0x0081, Form::Digit(4), 4, 32, 0),
        Code::And_rm64_imm32 => s(false, true, 0x0081, Form::Digit(4), 4, 64, 0),
        Code::And_rm16_imm8 => s(true, false, 0x0083, Form::Digit(4), 1, 16, 0),
        Code::And_rm32_imm8 => s(false, false, 0x0083, Form::Digit(4), 1, 32, 0),
        Code::And_rm64_imm8 => s(false, true, 0x0083, Form::Digit(4), 1, 64, 0),
        Code::Sub_rm8_r8 => s(false, false, 0x0028, Form::Mr, 0, 8, 8),
        Code::Sub_rm16_r16 => s(true, false, 0x0029, Form::Mr, 0, 16, 16),
        Code::Sub_rm32_r32 => s(false, false, 0x0029, Form::Mr, 0, 32, 32),
        Code::Sub_rm64_r64 => s(false, true, 0x0029, Form::Mr, 0, 64, 64),
        Code::Sub_r8_rm8 => s(false, false, 0x002a, Form::Rm, 0, 8, 8),
        Code::Sub_r16_rm16 => s(true, false, 0x002b, Form::Rm, 0, 16, 16),
        Code::Sub_r32_rm32 => s(false, false, 0x002b, Form::Rm, 0, 32, 32),
        Code::Sub_r64_rm64 => s(false, true, 0x002b, Form::Rm, 0, 64, 64),
        Code::Sub_AL_imm8 => s(false, false, 0x002c, Form::Acc(Register::AL), 1, 8, 0),
        Code::Sub_AX_imm16 => s(true, false, 0x002d, Form::Acc(Register::AX), 2, 16, 0),
        Code::Sub_EAX_imm32 => s(false, false, 0x002d, Form::Acc(Register::EAX), 4, 32, 0),
        Code::Sub_RAX_imm32 => s(false, true, 0x002d, Form::Acc(Register::RAX), 4, 64, 0),
        Code::Sub_rm8_imm8 => s(false, false, 0x0080, Form::Digit(5), 1, 8, 0),
        Code::Sub_rm16_imm16 => s(true, false, 0x0081, Form::Digit(5), 2, 16, 0),
        Code::Sub_rm32_imm32 => s(false, false, 0x0081, Form::Digit(5), 4, 32, 0),
        Code::Sub_rm64_imm32 => s(false, true, 0x0081, Form::Digit(5), 4, 64, 0),
        Code::Sub_rm16_imm8 => s(true, false, 0x0083, Form::Digit(5), 1, 16, 0),
        Code::Sub_rm32_imm8 => s(false, false, 0x0083, Form::Digit(5), 1, 32, 0),
        Code::Sub_rm64_imm8 => s(false, true, 0x0083, Form::Digit(5), 1, 64, 0),
        Code::Xor_rm8_r8 => s(false, false, 0x0030, Form::Mr, 0, 8, 8),
        Code::Xor_rm16_r16 => s(true, false, 0x0031, Form::Mr, 0, 16, 16),
        Code::Xor_rm32_r32 => s(false, false, 0x0031, Form::Mr, 0, 32, 32),
        Code::Xor_rm64_r64 => s(false, true, 0x0031, Form::Mr, 0, 64, 64),
        Code::Xor_r8_rm8 => s(false, false, 0x0032, Form::Rm, 0, 8, 8),
        Code::Xor_r16_rm16 => s(true, false, 0x0033, Form::Rm, 0, 16, 16),
        Code::Xor_r32_rm32 => s(false, false, 0x0033, Form::Rm, 0, 32, 32),
        Code::Xor_r64_rm64 => s(false, true, 0x0033, Form::Rm, 0, 64, 64),
        Code::Xor_AL_imm8 => s(false, false, 0x0034, Form::Acc(Register::AL), 1, 8, 0),
        Code::Xor_AX_imm16 => s(true, false, 0x0035, Form::Acc(Register::AX), 2, 16, 0),
        Code::Xor_EAX_imm32 => s(false, false, 0x0035, Form::Acc(Register::EAX), 4, 32, 0),
        Code::Xor_RAX_imm32 => s(false, true, 0x0035, Form::Acc(Register::RAX), 4, 64, 0),
        Code::Xor_rm8_imm8 => s(false, false, 0x0080, Form::Digit(6), 1, 8, 0),
        Code::Xor_rm16_imm16 => s(true, false, 0x0081, Form::Digit(6), 2, 16, 0),
        Code::Xor_rm32_imm32 => s(false, false, 0x0081, Form::Digit(6), 4, 32, 0),
        Code::Xor_rm64_imm32 => s(false, true, 0x0081, Form::Digit(6), 4, 64, 0),
        Code::Xor_rm16_imm8 => s(true, false, 0x0083, Form::Digit(6), 1, 16, 0),
        Code::Xor_rm32_imm8 => s(false, false, 0x0083, Form::Digit(6), 1, 32, 0),
        Code::Xor_rm64_imm8 => s(false, true, 0x0083, Form::Digit(6), 1, 64, 0),
        Code::Cmp_rm8_r8 => s(false, false, 0x0038, Form::Mr, 0, 8, 8),
        Code::Cmp_rm16_r16 => s(true, false, 0x0039, Form::Mr, 0, 16, 16),
        Code::Cmp_rm32_r32 => s(false, false, 0x0039, Form::Mr, 0, 32, 32),
        Code::Cmp_rm64_r64 => s(false, true, 0x0039, Form::Mr, 0, 64, 64),
        Code::Cmp_r8_rm8 => s(false, false, 0x003a, Form::Rm, 0, 8, 8),
        Code::Cmp_r16_rm16 => s(true, false, 0x003b, Form::Rm, 0, 16, 16),
        Code::Cmp_r32_rm32 => s(false, false, 0x003b, Form::Rm, 0, 32, 32),
        Code::Cmp_r64_rm64 => s(false, true, 0x003b, Form::Rm, 0, 64, 64),
        Code::Cmp_AL_imm8 => s(false, false, 0x003c, Form::Acc(Register::AL), 1, 8, 0),
        Code::Cmp_AX_imm16 => s(true, false, 0x003d, Form::Acc(Register::AX), 2, 16, 0),
        Code::Cmp_EAX_imm32 => s(false, false, 0x003d, Form::Acc(Register::EAX), 4, 32, 0),
        Code::Cmp_RAX_imm32 => s(false, true, 0x003d, Form::Acc(Register::RAX), 4, 64, 0),
        Code::Cmp_rm8_imm8 => s(false, false, 0x0080, Form::Digit(7), 1, 8, 0),
        Code::Cmp_rm16_imm16 => s(true, false, 0x0081, Form::Digit(7), 2, 16, 0),
        Code::Cmp_rm32_imm32 => s(false, false, 0x0081, Form::Digit(7), 4, 32, 0),
        Code::Cmp_rm64_imm32 => s(false, true, 0x0081, Form::Digit(7), 4, 64, 0),
        Code::Cmp_rm16_imm8 => s(true, false, 0x0083, Form::Digit(7), 1, 16, 0),
        Code::Cmp_rm32_imm8 => s(false, false, 0x0083, Form::Digit(7), 1, 32, 0),
        Code::Cmp_rm64_imm8 => s(false, true, 0x0083, Form::Digit(7), 1, 64, 0),
        Code::Rol_rm8_imm8 => s(false, false, 0x00c0, Form::Digit(0), 1, 8, 0),
        Code::Rol_rm16_imm8 => s(true, false, 0x00c1, Form::Digit(0), 1, 16, 0),
        Code::Rol_rm32_imm8 => s(false, false, 0x00c1, Form::Digit(0), 1, 32, 0),
        Code::Rol_rm64_imm8 => s(false, true, 0x00c1, Form::Digit(0), 1, 64, 0),
        Code::Rol_rm32_CL => s(false, false, 0x00d3, Form::DigitCl(0), 0, 32, 0),
        Code::Rol_rm64_CL => s(false, true, 0x00d3, Form::DigitCl(0), 0, 64, 0),
        Code::Ror_rm8_imm8 => s(false, false, 0x00c0, Form::Digit(1), 1, 8, 0),
        Code::Ror_rm16_imm8 => s(true, false, 0x00c1, Form::Digit(1), 1, 16, 0),
        Code::Ror_rm32_imm8 => s(false, false, 0x00c1, Form::Digit(1), 1, 32, 0),
        Code::Ror_rm64_imm8 => s(false, true, 0x00c1, Form::Digit(1), 1, 64, 0),
        Code::Ror_rm32_CL => s(false, false, 0x00d3, Form::DigitCl(1), 0, 32, 0),
        Code::Ror_rm64_CL => s(false, true, 0x00d3, Form::DigitCl(1), 0, 64, 0),
        Code::Rcl_rm8_imm8 => s(false, false, 0x00c0, Form::Digit(2), 1, 8, 0),
        Code::Rcl_rm16_imm8 => s(true, false, 0x00c1, Form::Digit(2), 1, 16, 0),
        Code::Rcl_rm32_imm8 => s(false, false, 0x00c1, Form::Digit(2), 1, 32, 0),
        Code::Rcl_rm64_imm8 => s(false, true, 0x00c1, Form::Digit(2), 1, 64, 0),
        Code::Rcl_rm32_CL => s(false, false, 0x00d3, Form::DigitCl(2), 0, 32, 0),
        Code::Rcl_rm64_CL => s(false, true, 0x00d3, Form::DigitCl(2), 0, 64, 0),
        Code::Rcr_rm8_imm8 => s(false, false, 0x00c0, Form::Digit(3), 1, 8, 0),
        Code::Rcr_rm16_imm8 => s(true, false, 0x00c1, Form::Digit(3), 1, 16, 0),
        Code::Rcr_rm32_imm8 => s(false, false, 0x00c1, Form::Digit(3), 1, 32, 0),
        Code::Rcr_rm64_imm8 => s(false, true, 0x00c1, Form::Digit(3), 1, 64, 0),
        Code::Rcr_rm32_CL => s(false, false, 0x00d3, Form::DigitCl(3), 0, 32, 0),
        Code::Rcr_rm64_CL => s(false, true, 0x00d3, Form::DigitCl(3), 0, 64, 0),
        Code::Shl_rm8_imm8 => s(false, false, 0x00c0, Form::Digit(4), 1, 8, 0),
        Code::Shl_rm16_imm8 => s(true, false, 0x00c1, Form::Digit(4), 1, 16, 0),
        Code::Shl_rm32_imm8 => s(false, false, 0x00c1, Form::Digit(4), 1, 32, 0),
        Code::Shl_rm64_imm8 => s(false, true, 0x00c1, Form::Digit(4), 1, 64, 0),
        Code::Shl_rm32_CL => s(false, false, 0x00d3, Form::DigitCl(4), 0, 32, 0),
        Code::Shl_rm64_CL => s(false, true, 0x00d3, Form::DigitCl(4), 0, 64, 0),
        Code::Shr_rm8_imm8 => s(false, false, 0x00c0, Form::Digit(5), 1, 8, 0),
        Code::Shr_rm16_imm8 => s(true, false, 0x00c1, Form::Digit(5), 1, 16, 0),
        Code::Shr_rm32_imm8 => s(false, false, 0x00c1, Form::Digit(5), 1, 32, 0),
        Code::Shr_rm64_imm8 => s(false, true, 0x00c1, Form::Digit(5), 1, 64, 0),
        Code::Shr_rm32_CL => s(false, false, 0x00d3, Form::DigitCl(5), 0, 32, 0),
        Code::Shr_rm64_CL => s(false, true, 0x00d3, Form::DigitCl(5), 0, 64, 0),
        Code::Sal_rm8_imm8 => s(false, false, 0x00c0, Form::Digit(6), 1, 8, 0),
        Code::Sal_rm16_imm8 => s(true, false, 0x00c1, Form::Digit(6), 1, 16, 0),
        Code::Sal_rm32_imm8 => s(false, false, 0x00c1, Form::Digit(6), 1, 32, 0),
        Code::Sal_rm64_imm8 => s(false, true, 0x00c1, Form::Digit(6), 1, 64, 0),
        Code::Sal_rm32_CL => s(false, false, 0x00d3, Form::DigitCl(6), 0, 32, 0),
        Code::Sal_rm64_CL => s(false, true, 0x00d3, Form::DigitCl(6), 0, 64, 0),
        Code::Sar_rm8_imm8 => s(false, false, 0x00c0, Form::Digit(7), 1, 8, 0),
        Code::Sar_rm16_imm8 => s(true, false, 0x00c1, Form::Digit(7), 1, 16, 0),
        Code::Sar_rm32_imm8 => s(false, false, 0x00c1, Form::Digit(7), 1, 32, 0),
        Code::Sar_rm64_imm8 => s(false, true, 0x00c1, Form::Digit(7), 1, 64, 0),
        Code::Sar_rm32_CL => s(false, false, 0x00d3, Form::DigitCl(7), 0, 32, 0),
        Code::Sar_rm64_CL => s(false, true, 0x00d3, Form::DigitCl(7), 0, 64, 0),
        Code::Mov_rm8_r8 => s(false, false, 0x0088, Form::Mr, 0, 8, 8),
        Code::Mov_rm16_r16 => s(true, false, 0x0089, Form::Mr, 0, 16, 16),
        Code::Mov_rm32_r32 => s(false, false, 0x0089, Form::Mr, 0, 32, 32),
        Code::Mov_rm64_r64 => s(false, true, 0x0089, Form::Mr, 0, 64, 64),
        Code::Mov_r8_rm8 => s(false, false, 0x008a, Form::Rm, 0, 8, 8),
        Code::Mov_r16_rm16 => s(true, false, 0x008b, Form::Rm, 0, 16, 16),
        Code::Mov_r32_rm32 => s(false, false, 0x008b, Form::Rm, 0, 32, 32),
        Code::Mov_r64_rm64 => s(false, true, 0x008b, Form::Rm, 0, 64, 64),
        Code::Lea_r32_m => s(false, false, 0x008d, Form::Lea, 0, 32, 0),
        Code::Lea_r64_m => s(false, true, 0x008d, Form::Lea, 0, 64, 0),
        Code::Mov_rm8_imm8 => s(false, false, 0x00c6, Form::Digit(0), 1, 8, 0),
        Code::Mov_rm16_imm16 => s(true, false, 0x00c7, Form::Digit(0), 2, 16, 0),
        Code::Mov_rm32_imm32 => s(false, false, 0x00c7, Form::Digit(0), 4, 32, 0),
        Code::Mov_rm64_imm32 => s(false, true, 0x00c7, Form::Digit(0), 4, 64, 0),
        Code::Mov_r32_imm32 => s(false, false, 0x00b8, Form::OpReg, 4, 32, 0),
        Code::Mov_r64_imm64 => s(false, true, 0x00b8, Form::OpReg, 8, 64, 0),
        Code::Push_r64 => s(false, false, 0x0050, Form::OpReg, 0, 64, 0),
        Code::Pop_r64 => s(false, false, 0x0058, Form::OpReg, 0, 64, 0),
        Code::Test_rm8_r8 => s(false, false, 0x0084, Form::Mr, 0, 8, 8),
        Code::Test_rm16_r16 => s(true, false, 0x0085, Form::Mr, 0, 16, 16),
        Code::Test_rm32_r32 => s(false, false, 0x0085, Form::Mr, 0, 32, 32),
        Code::Test_rm64_r64 => s(false, true, 0x0085, Form::Mr, 0, 64, 64),
        Code::Test_AL_imm8 => s(false, false, 0x00a8, Form::Acc(Register::AL), 1, 8, 0),
        Code::Test_EAX_imm32 => s(false, false, 0x00a9, Form::Acc(Register::EAX), 4, 32, 0),
        Code::Test_RAX_imm32 => s(false, true, 0x00a9, Form::Acc(Register::RAX), 4, 64, 0),
        Code::Test_rm8_imm8 => s(false, false, 0x00f6, Form::Digit(0), 1, 8, 0),
        Code::Test_rm32_imm32 => s(false, false, 0x00f7, Form::Digit(0), 4, 32, 0),
        Code::Test_rm64_imm32 => s(false, true, 0x00f7, Form::Digit(0), 4, 64, 0),
        Code::Not_rm32 => s(false, false, 0x00f7, Form::Digit(2), 0, 32, 0),
        Code::Not_rm64 => s(false, true, 0x00f7, Form::Digit(2), 0, 64, 0),
        Code::Neg_rm32 => s(false, false, 0x00f7, Form::Digit(3), 0, 32, 0),
        Code::Neg_rm64 => s(false, true, 0x00f7, Form::Digit(3), 0, 64, 0),
        Code::Mul_rm32 => s(false, false, 0x00f7, Form::Digit(4), 0, 32, 0),
        Code::Mul_rm64 => s(false, true, 0x00f7, Form::Digit(4), 0, 64, 0),
        Code::Imul_rm32 => s(false, false, 0x00f7, Form::Digit(5), 0, 32, 0),
        Code::Imul_rm64 => s(false, true, 0x00f7, Form::Digit(5), 0, 64, 0),
        Code::Div_rm32 => s(false, false, 0x00f7, Form::Digit(6), 0, 32, 0),
        Code::Div_rm64 => s(false, true, 0x00f7, Form::Digit(6), 0, 64, 0),
        Code::Idiv_rm32 => s(false, false, 0x00f7, Form::Digit(7), 0, 32, 0),
        Code::Idiv_rm64 => s(false, true, 0x00f7, Form::Digit(7), 0, 64, 0),
        Code::Inc_rm32 => s(false, false, 0x00ff, Form::Digit(0), 0, 32, 0),
        Code::Inc_rm64 => s(false, true, 0x00ff, Form::Digit(0), 0, 64, 0),
        Code::Dec_rm32 => s(false, false, 0x00ff, Form::Digit(1), 0, 32, 0),
        Code::Dec_rm64 => s(false, true, 0x00ff, Form::Digit(1), 0, 64, 0),
        Code::Call_rm64 => s(false, false, 0x00ff, Form::Digit(2), 0, 64, 0),
        Code::Jmp_rm64 => s(false, false, 0x00ff, Form::Digit(4), 0, 64, 0),
        Code::Movzx_r32_rm8 => s(false, false, 0x0fb6, Form::Rm, 0, 32, 8),
        Code::Movzx_r32_rm16 => s(false, false, 0x0fb7, Form::Rm, 0, 32, 16),
        Code::Movzx_r64_rm8 => s(false, true, 0x0fb6, Form::Rm, 0, 64, 8),
        Code::Movzx_r64_rm16 => s(false, true, 0x0fb7, Form::Rm, 0, 64, 16),
        Code::Movsx_r32_rm8 => s(false, false, 0x0fbe, Form::Rm, 0, 32, 8),
        Code::Movsx_r32_rm16 => s(false, false, 0x0fbf, Form::Rm, 0, 32, 16),
        Code::Movsx_r64_rm8 => s(false, true, 0x0fbe, Form::Rm, 0, 64, 8),
        Code::Movsx_r64_rm16 => s(false, true, 0x0fbf, Form::Rm, 0, 64, 16),
        Code::Movsxd_r64_rm32 => s(false, true, 0x0063, Form::Rm, 0, 64, 32),
        Code::Imul_r32_rm32 => s(false, false, 0x0faf, Form::Rm, 0, 32, 32),
        Code::Imul_r64_rm64 => s(false, true, 0x0faf, Form::Rm, 0, 64, 64),
        Code::Imul_r32_rm32_imm8 => s(false, false, 0x006b, Form::Rm, 1, 32, 32),
        Code::Imul_r64_rm64_imm8 => s(false, true, 0x006b, Form::Rm, 1, 64, 64),
        Code::Imul_r32_rm32_imm32 => s(false, false, 0x0069, Form::Rm, 4, 32, 32),
        Code::Imul_r64_rm64_imm32 => s(false, true, 0x0069, Form::Rm, 4, 64, 64),
        Code::Cmovo_r32_rm32 => s(false, false, 0x0f40, Form::Rm, 0, 32, 32),
        Code::Cmovo_r64_rm64 => s(false, true, 0x0f40, Form::Rm, 0, 64, 64),
        Code::Seto_rm8 => s(false, false, 0x0f90, Form::Digit(0), 0, 8, 0),
        Code::Cmovno_r32_rm32 => s(false, false, 0x0f41, Form::Rm, 0, 32, 32),
        Code::Cmovno_r64_rm64 => s(false, true, 0x0f41, Form::Rm, 0, 64, 64),
        Code::Setno_rm8 => s(false, false, 0x0f91, Form::Digit(0), 0, 8, 0),
        Code::Cmovb_r32_rm32 => s(false, false, 0x0f42, Form::Rm, 0, 32, 32),
        Code::Cmovb_r64_rm64 => s(false, true, 0x0f42, Form::Rm, 0, 64, 64),
        Code::Setb_rm8 => s(false, false, 0x0f92, Form::Digit(0), 0, 8, 0),
        Code::Cmovae_r32_rm32 => s(false, false, 0x0f43, Form::Rm, 0, 32, 32),
        Code::Cmovae_r64_rm64 => s(false, true, 0x0f43, Form::Rm, 0, 64, 64),
        Code::Setae_rm8 => s(false, false, 0x0f93, Form::Digit(0), 0, 8, 0),
        Code::Cmove_r32_rm32 => s(false, false, 0x0f44, Form::Rm, 0, 32, 32),
        Code::Cmove_r64_rm64 => s(false, true, 0x0f44, Form::Rm, 0, 64, 64),
        Code::Sete_rm8 => s(false, false, 0x0f94, Form::Digit(0), 0, 8, 0),
        Code::Cmovne_r32_rm32 => s(false, false, 0x0f45, Form::Rm, 0, 32, 32),
        Code::Cmovne_r64_rm64 => s(false, true, 0x0f45, Form::Rm, 0, 64, 64),
        Code::Setne_rm8 => s(false, false, 0x0f95, Form::Digit(0), 0, 8, 0),
        Code::Cmovbe_r32_rm32 => s(false, false, 0x0f46, Form::Rm, 0, 32, 32),
        Code::Cmovbe_r64_rm64 => s(false, true, 0x0f46, Form::Rm, 0, 64, 64),
        Code::Setbe_rm8 => s(false, false, 0x0f96, Form::Digit(0), 0, 8, 0),
        Code::Cmova_r32_rm32 => s(false, false, 0x0f47, Form::Rm, 0, 32, 32),
        Code::Cmova_r64_rm64 => s(false, true, 0x0f47, Form::Rm, 0, 64, 64),
        Code::Seta_rm8 => s(false, false, 0x0f97, Form::Digit(0), 0, 8, 0),
        Code::Cmovs_r32_rm32 => s(false, false, 0x0f48, Form::Rm, 0, 32, 32),
        Code::Cmovs_r64_rm64 => s(false, true, 0x0f48, Form::Rm, 0, 64, 64),
        Code::Sets_rm8 => s(false, false, 0x0f98, Form::Digit(0), 0, 8, 0),
        Code::Cmovns_r32_rm32 => s(false, false, 0x0f49, Form::Rm, 0, 32, 32),
        Code::Cmovns_r64_rm64 => s(false, true, 0x0f49, Form::Rm, 0, 64, 64),
        Code::Setns_rm8 => s(false, false, 0x0f99, Form::Digit(0), 0, 8, 0),
        Code::Cmovp_r32_rm32 => s(false, false, 0x0f4a, Form::Rm, 0, 32, 32),
        Code::Cmovp_r64_rm64 => s(false, true, 0x0f4a, Form::Rm, 0, 64, 64),
        Code::Setp_rm8 => s(false, false, 0x0f9a, Form::Digit(0), 0, 8, 0),
        Code::Cmovnp_r32_rm32 => s(false, false, 0x0f4b, Form::Rm, 0, 32, 32),
        Code::Cmovnp_r64_rm64 => s(false, true, 0x0f4b, Form::Rm, 0, 64, 64),
        Code::Setnp_rm8 => s(false, false, 0x0f9b, Form::Digit(0), 0, 8, 0),
        Code::Cmovl_r32_rm32 => s(false, false, 0x0f4c, Form::Rm, 0, 32, 32),
        Code::Cmovl_r64_rm64 => s(false, true, 0x0f4c, Form::Rm, 0, 64, 64),
        Code::Setl_rm8 => s(false, false, 0x0f9c, Form::Digit(0), 0, 8, 0),
        Code::Cmovge_r32_rm32 => s(false, false, 0x0f4d, Form::Rm, 0, 32, 32),
        Code::Cmovge_r64_rm64 => s(false, true, 0x0f4d, Form::Rm, 0, 64, 64),
        Code::Setge_rm8 => s(false, false, 0x0f9d, Form::Digit(0), 0, 8, 0),
        Code::Cmovle_r32_rm32 => s(false, false, 0x0f4e, Form::Rm, 0, 32, 32),
        Code::Cmovle_r64_rm64 => s(false, true, 0x0f4e, Form::Rm, 0, 64, 64),
        Code::Setle_rm8 => s(false, false, 0x0f9e, Form::Digit(0), 0, 8, 0),
        Code::Cmovg_r32_rm32 => s(false, false, 0x0f4f, Form::Rm, 0, 32, 32),
        Code::Cmovg_r64_rm64 => s(false, true, 0x0f4f, Form::Rm, 0, 64, 64),
        Code::Setg_rm8 => s(false, false, 0x0f9f, Form::Digit(0), 0, 8, 0),
        Code::Pushfq => s(false, false, 0x009c, Form::Bare, 0, 0, 0),
        Code::Popfq => s(false, false, 0x009d, Form::Bare, 0, 0, 0),
        Code::Lahf => s(false, false, 0x009f, Form::Bare, 0, 0, 0),
        Code::Sahf => s(false, false, 0x009e, Form::Bare, 0, 0, 0),
        Code::Retnq => s(false, false, 0x00c3, Form::Bare, 0, 0, 0),
        Code::Nopd => s(false, false, 0x0090, Form::Bare, 0, 0, 0),
        Code::Cdq => s(false, false, 0x0099, Form::Bare, 0, 0, 0),
        Code::Cqo => s(false, true, 0x0099, Form::Bare, 0, 0, 0),
        Code::Cdqe => s(false, true, 0x0098, Form::Bare, 0, 0, 0),
        Code::Cwde => s(false, false, 0x0098, Form::Bare, 0, 0, 0),

        _ => None,
    }
}

/// The number of `r` as a register of `width` bits, and whether it needs
/// a REX prefix (SPL BPL SIL DIL); `None` for another width, AH CH DH BH,
/// or no register.
fn reg_num(r: Register, width: u8) -> Option<(u8, bool)> {
    let (first, count) = match width {
        8 => (Register::AL, 20),
        16 => (Register::AX, 16),
        32 => (Register::EAX, 16),
        64 => (Register::RAX, 16),
        _ => return None,
    };
    let x = (r as u32).wrapping_sub(first as u32);
    if x >= count {
        return None;
    }
    let x = x as u8;
    Some(match (width, x) {
        (8, 4..=7) => return None,
        (8, 8..=11) => (x - 4, true),
        (8, 12..) => (x - 4, false),
        _ => (x, false),
    })
}

/// A 64-bit general register's number (not RIP), for addressing.
fn addr_num(r: Register) -> Option<u8> {
    let x = (r as u32).wrapping_sub(Register::RAX as u32);
    (x < 16).then_some(x as u8)
}

/// Encodes `i` by hand into `out` when it is one of the [`shape`]s and
/// its operands are as iced would encode them without complaint (no
/// prefixes, registers of the form's widths, 64-bit addressing without
/// RIP, displacements as iced sizes them); `false` (nothing written)
/// otherwise, for iced's encoder to encode or refuse. The bytes are
/// those iced's encoder gives.
fn hand(i: &Instruction, out: &mut Vec<u8>) -> bool {
    let Some(sh) = shape(i.code()) else {
        return false;
    };
    if i.has_lock_prefix()
        || i.has_repe_prefix()
        || i.has_repne_prefix()
        || i.segment_prefix() != Register::None
    {
        return false;
    }
    let n_ops = match sh.form {
        Form::Rm | Form::Lea | Form::Mr | Form::DigitCl(_) => 2,
        Form::Digit(_) | Form::OpReg => 1,
        Form::Acc(_) => 1,
        Form::Bare => 0,
    } + u32::from(sh.imm != 0);
    if i.op_count() != n_ops {
        return false;
    }
    // Room for the longest shape with whole-width copies below (each
    // part written at its full size, the length advanced by its own).
    let mut b = [0u8; 24];
    let mut len = 0;
    let mut rex = if sh.w { 0x48u8 } else { 0x40 };
    let mut force_rex = false;
    // Operand `op`, a register of `width` bits: its number.
    let mut reg_of = |op: u32, width: u8| -> Option<u8> {
        if i.op_kind(op) != OpKind::Register {
            return None;
        }
        let (r, f) = reg_num(i.op_register(op), width)?;
        force_rex |= f;
        Some(r)
    };
    // ModRM.reg and the r/m operand (its index).
    let (reg, rm) = match sh.form {
        Form::Rm | Form::Lea => {
            if matches!(sh.form, Form::Lea) && i.op1_kind() != OpKind::Memory {
                return false;
            }
            let Some(r) = reg_of(0, sh.w0) else {
                return false;
            };
            (r, Some(1))
        }
        Form::Mr => {
            let Some(r) = reg_of(1, sh.w1) else {
                return false;
            };
            (r, Some(0))
        }
        Form::Digit(d) => (d, Some(0)),
        Form::DigitCl(d) => {
            if i.op1_kind() != OpKind::Register || i.op1_register() != Register::CL {
                return false;
            }
            (d, Some(0))
        }
        Form::OpReg => {
            let Some(r) = reg_of(0, sh.w0) else {
                return false;
            };
            (r, None)
        }
        Form::Acc(a) => {
            if i.op0_kind() != OpKind::Register || i.op0_register() != a {
                return false;
            }
            (0, None)
        }
        Form::Bare => (0, None),
    };
    // ModRM, SIB and displacement of the r/m operand.
    let mut modrm = [0u8; 2];
    let mut modrm_len = 0;
    let mut disp = [0u8; 4];
    let mut disp_len = 0;
    if let Some(op) = rm {
        rex |= (reg >> 3) << 2;
        let kind = if op == 0 { i.op0_kind() } else { i.op1_kind() };
        match kind {
            OpKind::Register => {
                let r = if op == 0 {
                    i.op0_register()
                } else {
                    i.op1_register()
                };
                let width = if op == 0 { sh.w0 } else { sh.w1 };
                let Some((n, f)) = reg_num(r, width) else {
                    return false;
                };
                force_rex |= f;
                rex |= n >> 3;
                modrm[0] = 0xc0 | (reg & 7) << 3 | (n & 7);
                modrm_len = 1;
            }
            OpKind::Memory => {
                let displ = i.memory_displacement64() as i64;
                if displ != displ as i32 as i64 {
                    return false;
                }
                let base = match i.memory_base() {
                    Register::None => None,
                    r => match addr_num(r) {
                        Some(n) => Some(n),
                        None => return false,
                    },
                };
                let index = match i.memory_index() {
                    Register::None => None,
                    Register::RSP => return false,
                    r => match addr_num(r) {
                        Some(n) => Some(n),
                        None => return false,
                    },
                };
                let scale = match i.memory_index_scale() {
                    1 => 0u8,
                    2 => 1,
                    4 => 2,
                    8 => 3,
                    _ => return false,
                };
                let d = displ as i32;
                let mut ds = i.memory_displ_size();
                if ds == 0 && d != 0 {
                    return false;
                }
                // (No base and no index: iced picks the address size from
                // the displacement size; the emitter never does that.)
                if base.is_none() && index.is_none() {
                    return false;
                }
                let (mode, d_len) = match base {
                    None => (0u8, 4),
                    Some(bn) => {
                        if ds == 0 && bn & 7 == 5 {
                            ds = 1;
                        }
                        if ds == 1 && d != d as i8 as i32 {
                            ds = 8;
                        }
                        match ds {
                            0 => (0, 0),
                            1 => (0x40, 1),
                            8 => (0x80, 4),
                            _ => return false,
                        }
                    }
                };
                let reg_bits = (reg & 7) << 3;
                match (base, index) {
                    (Some(bn), None) if bn & 7 != 4 && scale == 0 => {
                        modrm[0] = mode | reg_bits | (bn & 7);
                        modrm_len = 1;
                    }
                    _ => {
                        modrm[0] = mode | reg_bits | 4;
                        modrm[1] = scale << 6
                            | base.map_or(5, |bn| bn & 7)
                            | index.map_or(0x20, |x| (x & 7) << 3);
                        modrm_len = 2;
                    }
                }
                rex |= base.map_or(0, |bn| bn >> 3) | index.map_or(0, |x| (x >> 3) << 1);
                disp = d.to_le_bytes();
                disp_len = d_len;
            }
            _ => return false,
        }
    }
    if sh.p66 {
        b[len] = 0x66;
        len += 1;
    }
    let mut op_lo = sh.op as u8;
    if matches!(sh.form, Form::OpReg) {
        rex |= reg >> 3;
        op_lo |= reg & 7;
    }
    if rex != 0x40 || force_rex {
        b[len] = rex;
        len += 1;
    }
    if sh.op > 0xff {
        b[len] = (sh.op >> 8) as u8;
        len += 1;
    }
    b[len] = op_lo;
    len += 1;
    b[len] = modrm[0];
    b[len + 1] = modrm[1];
    len += modrm_len;
    b[len..len + 4].copy_from_slice(&disp);
    len += disp_len;
    if sh.imm != 0 {
        // (Not an immediate: the instruction was built wrong; iced says so.)
        let Ok(v) = i.try_immediate(n_ops - 1) else {
            return false;
        };
        b[len..len + 8].copy_from_slice(&v.to_le_bytes());
        len += sh.imm as usize;
    }
    // (A fixed-size copy, then the length: cheaper than a copy of `len`.)
    let start = out.len();
    out.extend_from_slice(&b);
    out.truncate(start + len);
    true
}

/// 0: not yet read from the environment; 1: off; 2: on.
static VERIFY: AtomicU8 = AtomicU8::new(0);

/// Makes every translation check its encoding against iced's
/// `BlockEncoder` ([`verify`]); a block that fails the check is not
/// translated (counted in `JitStats::blocks_failed`). Slow: for tests.
/// Without a call, the environment variable `FAULTLINE_JIT_VERIFY`
/// (set, not empty) turns it on.
pub fn set_verify_encoding(on: bool) {
    VERIFY.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// Whether translations check their encoding ([`set_verify_encoding`]).
pub(super) fn verify_encoding() -> bool {
    match VERIFY.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var_os("FAULTLINE_JIT_VERIFY").is_some_and(|v| !v.is_empty());
            // A concurrent `set_verify_encoding` wins.
            let _ = VERIFY.compare_exchange(
                0,
                if on { 2 } else { 1 },
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            VERIFY.load(Ordering::Relaxed) == 2
        }
        v => v == 2,
    }
}

/// With `FAULTLINE_JIT_DISASM` set to a guest RIP in hex (or to `all`),
/// prints the translation of the block there to stderr, one host
/// instruction a line, from `entry` (the chained entry) marked: a
/// developer's view of what the emitter makes of a block. The header
/// line names the `Cpu` fields the code addresses through rbx (for
/// `scripts/jit-profile.py`). Host side only.
pub(super) fn disassemble_if_asked(block: &Block, code: &[u8], entry: usize, o: &super::Offsets) {
    let rip = block.rip;
    let Some(want) = std::env::var_os("FAULTLINE_JIT_DISASM") else {
        return;
    };
    let want = want.to_string_lossy();
    let hex = want.trim_start_matches("0x");
    if want != "all" && u64::from_str_radix(hex, 16).ok() != Some(rip) {
        return;
    }
    use iced_x86::{Formatter, IntelFormatter};
    let mut text = format!(
        "jit: block {rip:#x}: {} bytes; rbx+: gpr {:#x} cycles {:#x} instructions {:#x} \
         deadline {:#x} chain_rip {:#x} rflags {:#x} next_rip {:#x}\n",
        code.len(),
        o.gpr,
        o.cycles,
        o.instructions,
        o.jit_deadline,
        o.jit_chain_rip,
        o.rflags,
        o.next_rip,
    );
    let mut formatter = IntelFormatter::new();
    for op in &block.insns {
        text.push_str(&format!("  guest {:x}  ", op.insn.ip()));
        formatter.format(&op.insn, &mut text);
        text.push('\n');
    }
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    for insn in &mut decoder {
        let mark = if insn.ip() == entry as u64 { '>' } else { ' ' };
        text.push_str(&format!("{mark}{:5x}  ", insn.ip()));
        formatter.format(&insn, &mut text);
        text.push('\n');
    }
    eprint!("{text}");
}

/// Checks `e` (from [`encode`]) against iced's `BlockEncoder` on the same
/// instructions: both decode to the same sequence of instructions, the
/// bytes of every instruction but the direct branches are the same, and
/// every direct branch is of the same kind (short or near alike) and goes
/// to the instruction it goes to in the other. `Err` names the first
/// difference.
pub(super) fn verify(instrs: &[Instruction], e: &Encoded) -> Result<(), String> {
    let block = InstructionBlock::new(instrs, 0);
    let r = BlockEncoder::encode(
        64,
        block,
        BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
    )
    .map_err(|x| format!("the block encoder refuses the block: {x}"))?;
    let theirs = &r.code_buffer;
    let their_off = &r.new_instruction_offsets;
    if e.piece.len() != instrs.len() + 1 || their_off.len() != instrs.len() {
        return Err("instruction offsets missing".into());
    }
    let decode = |code: &[u8], off: u32| -> Result<Instruction, String> {
        let mut d = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
        d.set_position(off as usize)
            .map_err(|x| format!("offset {off:#x} outside the code: {x}"))?;
        d.set_ip(u64::from(off));
        let i = d.decode();
        if i.is_invalid() {
            return Err(format!("invalid instruction at {off:#x}"));
        }
        Ok(i)
    };
    let label_at = |id: u64| instrs.iter().position(|i| i.ip() == id && id != 0);
    for (k, i) in instrs.iter().enumerate() {
        let end = e.offset(k + 1);
        let (ours_at, theirs_at) = (e.offset(k), their_off[k]);
        if theirs_at == u32::MAX {
            return Err(format!("instruction {k}: the block encoder rewrote it"));
        }
        if i.code() == Code::Zero_bytes {
            if end != ours_at {
                return Err(format!("instruction {k}: ZERO_BYTES has bytes"));
            }
            continue;
        }
        let ours = decode(&e.code, ours_at)?;
        let their = decode(theirs, theirs_at)?;
        if ours_at + ours.len() as u32 != end {
            return Err(format!(
                "instruction {k} ({ours}) at {ours_at:#x} decodes to {} bytes, laid out as {}",
                ours.len(),
                end - ours_at
            ));
        }
        if i.op_count() == 1 && i.op0_kind() == OpKind::NearBranch64 {
            if ours.code().as_near_branch() != their.code().as_near_branch()
                || ours.code().as_near_branch() != i.code().as_near_branch()
            {
                return Err(format!(
                    "instruction {k}: {ours} where the block encoder has {their}"
                ));
            }
            let to = label_at(i.near_branch_target())
                .ok_or_else(|| format!("instruction {k}: a branch to no label"))?;
            if ours.near_branch_target() != u64::from(e.offset(to))
                || their.near_branch_target() != their_off[to] as u64
            {
                return Err(format!(
                    "instruction {k}: {ours} does not go to instruction {to} ({:#x}; the block encoder: {their})",
                    e.offset(to)
                ));
            }
        } else {
            let a = &e.code[ours_at as usize..end as usize];
            let b = theirs
                .get(theirs_at as usize..theirs_at as usize + their.len())
                .ok_or_else(|| format!("instruction {k}: outside the block encoder's code"))?;
            if a != b || ours.code() != i.code() {
                return Err(format!(
                    "instruction {k}: {ours} ({a:02x?}) where the block encoder has {their} ({b:02x?})"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::code_asm::{ptr, qword_ptr, rax, rbx, rcx, CodeAssembler, CodeLabel};
    use iced_x86::MemoryOperand;

    fn check(a: &CodeAssembler) -> Encoded {
        let e = encode(a.instructions()).expect("encodes");
        verify(a.instructions(), &e).expect("agrees with the block encoder");
        e
    }

    /// Registers of `width` bits to try (all of them, AH..BH included:
    /// the hand encoder must leave those to iced).
    fn regs(width: u8) -> Vec<Register> {
        let (first, count) = match width {
            8 => (Register::AL as u32, 20),
            16 => (Register::AX as u32, 16),
            32 => (Register::EAX as u32, 16),
            _ => (Register::RAX as u32, 16),
        };
        Register::values()
            .filter(|r| (*r as u32).wrapping_sub(first) < count)
            .collect()
    }

    fn mems() -> Vec<MemoryOperand> {
        let bases = [
            Register::None,
            Register::RAX,
            Register::RSP,
            Register::RBP,
            Register::R12,
            Register::R13,
            Register::R15,
            Register::RIP,
            Register::EAX,
        ];
        let indexes = [
            Register::None,
            Register::RCX,
            Register::R9,
            Register::RBP,
            Register::RSP,
        ];
        let displs: [i64; 8] = [0, 1, -128, 127, 128, -129, 0x1234_5678, 1 << 33];
        let mut v = Vec::new();
        for &base in &bases {
            for &index in &indexes {
                for scale in [1, 2, 4, 8] {
                    for &displ in &displs {
                        for displ_size in [0, 1, 4, 8] {
                            v.push(MemoryOperand::new(
                                base,
                                index,
                                scale,
                                displ,
                                displ_size,
                                false,
                                Register::None,
                            ));
                        }
                    }
                }
            }
        }
        v
    }

    /// Every shape the hand encoder knows, with every register, a spread
    /// of memory operands and immediates: where it encodes, its bytes are
    /// iced's; where iced refuses, it does not encode.
    #[test]
    fn hand_encoding_is_iced_encoding() {
        let mems = mems();
        let imms: [i64; 7] = [0, 1, -1, 0x7f, -0x80, 0x1234, -0x1234_5678];
        let mut enc = Encoder::new(64);
        let (mut hand_count, mut iced_only) = (0u64, 0u64);
        let mut check = |i: Instruction| {
            let mut ours = Vec::new();
            let by_hand = hand(&i, &mut ours);
            let r = enc.encode(&i, 0);
            // (A refused instruction may leave bytes behind.)
            let buf = enc.take_buffer();
            let theirs = r.map(|_| buf);
            match (by_hand, theirs) {
                (true, Ok(t)) => {
                    assert_eq!(ours, t, "{:?} {i}", i.code());
                    hand_count += 1;
                }
                (true, Err(e)) => panic!("{:?} {i}: by hand, but iced refuses: {e}", i.code()),
                (false, _) => {
                    assert!(ours.is_empty());
                    iced_only += 1;
                }
            }
        };
        let mut shapes = 0;
        for code in Code::values() {
            let Some(sh) = shape(code) else { continue };
            shapes += 1;
            // Candidates for the r/m operand and the register operand.
            let rm_width = match sh.form {
                Form::Mr | Form::Digit(_) | Form::DigitCl(_) => sh.w0,
                _ => sh.w1,
            };
            let reg_width = match sh.form {
                Form::Mr => sh.w1,
                _ => sh.w0,
            };
            let mut rms: Vec<Op> = regs(rm_width).into_iter().map(Op::R).collect();
            rms.extend(mems.iter().map(|m| Op::M(*m)));
            let with_imm = |ops: &[Op], f: &mut dyn FnMut(Instruction)| {
                if sh.imm == 0 {
                    f(build(code, ops, None));
                } else {
                    for &x in &imms {
                        if let Some(i) = try_build(code, ops, x) {
                            f(i);
                        }
                    }
                }
            };
            match sh.form {
                Form::Rm | Form::Lea => {
                    for r in regs(reg_width) {
                        for rm in &rms {
                            with_imm(&[Op::R(r), *rm], &mut check);
                        }
                    }
                }
                Form::Mr => {
                    for r in regs(reg_width) {
                        for rm in &rms {
                            with_imm(&[*rm, Op::R(r)], &mut check);
                        }
                    }
                }
                Form::Digit(_) => {
                    for rm in &rms {
                        with_imm(&[*rm], &mut check);
                    }
                }
                Form::DigitCl(_) => {
                    for rm in &rms {
                        with_imm(&[*rm, Op::R(Register::CL)], &mut check);
                        with_imm(&[*rm, Op::R(Register::DL)], &mut check);
                    }
                }
                Form::OpReg => {
                    for r in regs(reg_width) {
                        with_imm(&[Op::R(r)], &mut check);
                    }
                    with_imm(&[Op::R(Register::EAX)], &mut check);
                }
                Form::Acc(a) => {
                    with_imm(&[Op::R(a)], &mut check);
                    with_imm(&[Op::R(Register::RCX)], &mut check);
                }
                Form::Bare => with_imm(&[], &mut check),
            }
        }
        assert!(shapes > 250, "{shapes} shapes");
        assert!(
            hand_count > 100_000,
            "{hand_count} by hand, {iced_only} left to iced"
        );
        assert!(
            iced_only > 1000,
            "{hand_count} by hand, {iced_only} left to iced"
        );
    }

    #[derive(Clone, Copy)]
    enum Op {
        R(Register),
        M(MemoryOperand),
    }

    fn build(code: Code, ops: &[Op], imm: Option<i64>) -> Instruction {
        try_build_inner(code, ops, imm).expect("builds")
    }

    fn try_build(code: Code, ops: &[Op], imm: i64) -> Option<Instruction> {
        try_build_inner(code, ops, Some(imm))
    }

    fn try_build_inner(code: Code, ops: &[Op], imm: Option<i64>) -> Option<Instruction> {
        use Op::*;
        let r = match (ops, imm) {
            ([], None) => Ok(Instruction::with(code)),
            ([R(a)], None) => Instruction::with1(code, *a),
            ([M(a)], None) => Instruction::with1(code, *a),
            ([R(a), R(b)], None) => Instruction::with2(code, *a, *b),
            ([R(a), M(b)], None) => Instruction::with2(code, *a, *b),
            ([M(a), R(b)], None) => Instruction::with2(code, *a, *b),
            ([R(a)], Some(x)) if x == x as i32 as i64 => Instruction::with2(code, *a, x as i32),
            ([R(a)], Some(x)) => Instruction::with2(code, *a, x),
            ([M(a)], Some(x)) => Instruction::with2(code, *a, x as i32),
            ([R(a), R(b)], Some(x)) => Instruction::with3(code, *a, *b, x as i32),
            ([R(a), M(b)], Some(x)) => Instruction::with3(code, *a, *b, x as i32),
            _ => return None,
        };
        r.ok()
    }

    #[test]
    fn short_and_near_branches_both_ways() {
        let mut a = CodeAssembler::new(64).unwrap();
        let mut top = a.create_label();
        let mut near = a.create_label();
        let mut mid = a.create_label();
        a.set_label(&mut top).unwrap();
        a.zero_bytes().unwrap();
        a.jne(near).unwrap();
        a.je(mid).unwrap();
        for _ in 0..20 {
            a.mov(rax, 0x1122_3344_5566_7788u64).unwrap();
        }
        a.set_label(&mut mid).unwrap();
        a.jmp(top).unwrap();
        for _ in 0..20 {
            a.mov(qword_ptr(rbx + 0x100), rcx).unwrap();
        }
        a.set_label(&mut near).unwrap();
        a.call(top).unwrap();
        a.jb(top).unwrap();
        a.ret().unwrap();
        let e = check(&a);
        // jne near (far forward) is rel32, je mid rel32 (200 bytes on),
        // jmp top goes back over 200+ bytes: rel32.
        assert_eq!(&e.code[0..2], &[0x0f, 0x85]);
        assert_eq!(&e.code[6..8], &[0x0f, 0x84]);
    }

    #[test]
    fn shortening_reaches_a_fixed_point() {
        // A chain of forward branches each just too far until the others
        // shrink.
        let mut a = CodeAssembler::new(64).unwrap();
        let mut labels: Vec<CodeLabel> = (0..8).map(|_| a.create_label()).collect();
        for l in &labels {
            a.je(*l).unwrap();
        }
        for _ in 0..12 {
            a.mov(rax, 1u64 << 40).unwrap();
        }
        for l in labels.iter_mut() {
            a.set_label(l).unwrap();
            a.nop().unwrap();
        }
        let e = check(&a);
        assert!(e.code.len() < 8 * 6 + 12 * 10 + 8);
    }

    #[test]
    fn refuses_what_it_cannot_place() {
        let mut a = CodeAssembler::new(64).unwrap();
        let mut l = a.create_label();
        a.jrcxz(l).unwrap();
        a.set_label(&mut l).unwrap();
        a.nop().unwrap();
        assert!(encode(a.instructions()).is_err());
        let mut a = CodeAssembler::new(64).unwrap();
        let l = a.create_label();
        a.jmp(l).unwrap();
        a.nop().unwrap();
        assert!(encode(a.instructions()).is_err());
        let mut a = CodeAssembler::new(64).unwrap();
        let mut l = a.create_label();
        a.set_label(&mut l).unwrap();
        a.lea(rax, ptr(l)).unwrap();
        assert!(encode(a.instructions()).is_err());
    }
}
