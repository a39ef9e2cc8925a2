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
use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, ConditionCode, Decoder, DecoderOptions, Encoder,
    Instruction, InstructionBlock, OpKind,
};
use std::sync::atomic::{AtomicU8, Ordering};

/// Labels above this are refused (the label table is a vector indexed by
/// label id; the emitter creates a few per guest instruction).
const MAX_LABEL: u64 = 1 << 20;

/// A direct branch to a label of the block.
#[derive(Clone, Copy)]
struct Branch {
    /// Index of the branch in the instruction list.
    at: usize,
    /// Index of the instruction it goes to.
    to: usize,
    kind: Kind,
    short: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
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
/// independent), and the offset of each instruction in it.
#[derive(Debug)]
pub(super) struct Encoded {
    pub code: Vec<u8>,
    pub offsets: Vec<u32>,
}

fn err(msg: &str) -> NotTranslated {
    NotTranslated::Asm(msg.to_string())
}

/// The offset of every instruction (and the end, at index `n`) with the
/// branches in the forms `branches` says; `piece` holds the other
/// instructions' encoded bounds.
fn layout(piece: &[u32], branches: &[Branch], offsets: &mut [u32]) {
    let n = piece.len() - 1;
    let mut off = 0u32;
    let mut bi = 0;
    for k in 0..n {
        offsets[k] = off;
        match branches.get(bi) {
            Some(b) if b.at == k => {
                off += b.kind.len(b.short);
                bi += 1;
            }
            _ => off += piece[k + 1] - piece[k],
        }
    }
    offsets[n] = off;
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
    // Pass 1: everything but the branches, once, into one buffer.
    let mut enc = Encoder::try_with_capacity(64, n * 6)?;
    let mut piece = Vec::with_capacity(n + 1);
    let mut branches = Vec::new();
    let mut at = 0u32;
    for (k, i) in instrs.iter().enumerate() {
        piece.push(at);
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
                kind,
                short: false,
            });
            continue;
        }
        if i.code() == Code::Zero_bytes {
            continue;
        }
        if i.is_ip_rel_memory_operand() {
            return Err(err("a RIP-relative operand"));
        }
        at += enc.encode(i, 0)? as u32;
    }
    piece.push(at);
    let bytes = enc.take_buffer();
    // Pass 2: the layout, branches shortened while that changes something.
    let mut offsets = vec![0u32; n + 1];
    layout(&piece, &branches, &mut offsets);
    loop {
        let mut changed = false;
        for b in branches.iter_mut() {
            if b.short || b.kind == Kind::Call {
                continue;
            }
            // The displacement in this layout were this branch short: a
            // forward target moves back with the branch's own end.
            let (long, short) = (b.kind.len(false), b.kind.len(true));
            let end = offsets[b.at] + short;
            let target = if b.to > b.at {
                offsets[b.to] - (long - short)
            } else {
                offsets[b.to]
            };
            let d = i64::from(target) - i64::from(end);
            if d == d as i8 as i64 {
                b.short = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
        layout(&piece, &branches, &mut offsets);
    }
    // Pass 3: the bytes.
    let mut code = Vec::with_capacity(offsets[n] as usize);
    let mut bi = 0;
    for k in 0..n {
        match branches.get(bi) {
            Some(&b) if b.at == k => {
                bi += 1;
                let end = offsets[k] + b.kind.len(b.short);
                let d = i64::from(offsets[b.to]) - i64::from(end);
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
            _ => code.extend_from_slice(&bytes[piece[k] as usize..piece[k + 1] as usize]),
        }
    }
    debug_assert_eq!(code.len() as u32, offsets[n]);
    offsets.truncate(n);
    Ok(Encoded { code, offsets })
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
    if e.offsets.len() != instrs.len() || their_off.len() != instrs.len() {
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
        let end = e.offsets.get(k + 1).copied().unwrap_or(e.code.len() as u32);
        let (ours_at, theirs_at) = (e.offsets[k], their_off[k]);
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
            if ours.near_branch_target() != e.offsets[to] as u64
                || their.near_branch_target() != their_off[to] as u64
            {
                return Err(format!(
                    "instruction {k}: {ours} does not go to instruction {to} ({:#x}; the block encoder: {their})",
                    e.offsets[to]
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
    use iced_x86::code_asm::*;

    fn check(a: &CodeAssembler) -> Encoded {
        let e = encode(a.instructions()).expect("encodes");
        verify(a.instructions(), &e).expect("agrees with the block encoder");
        e
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
