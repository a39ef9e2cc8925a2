//! The guest's arithmetic flags in generated code: where they live (the
//! host flags, `state.rflags`, or saved in r15 across an inline access),
//! writing them back and loading them.
//!
//! The state is three booleans of the [`Emitter`]: `host_valid` (the
//! host flags hold the guest's), `dirty` (`state.rflags` is behind), and
//! `saved` (r15 holds them, in `lahf`/`seto` form; then `dirty` and not
//! `host_valid`). Flags that are dirty are always somewhere: in the host
//! or in r15.

use super::*;
use iced_x86::code_asm::{ah, al, ax, cl, r15d};

impl Emitter {
    /// Writes the host's arithmetic flags into `state.rflags` (clobbers
    /// rax and the host flags; rcx kept). As one masked merge, `rflags ^=
    /// (rflags ^ new) & ARITH`: the bits outside `ARITH` are kept, those
    /// in it become the new ones (AF clear after a logic operation, whose
    /// host AF is undefined).
    pub(super) fn capture(&mut self, af_clear: bool) -> Result<(), NotTranslated> {
        // AH = SF ZF AF PF CF (LAHF), AL = OF << 3 (SETO, shifted), then
        // AX rotated to OF in bit 11 and the others in bits 7:0: no PUSHF,
        // which the host runs far slower.
        self.a.lahf()?;
        self.a.seto(al)?;
        self.a.shl(al, 3)?;
        self.a.ror(ax, 8)?;
        if af_clear {
            self.a.and(eax, (ARITH & !AF) as i32)?;
        }
        self.merge_arith(Register::RAX)
    }

    /// `state.rflags ^= (state.rflags ^ reg) & ARITH`: `reg`'s arithmetic
    /// flags into the state, every other bit kept (clobbers `reg` and the
    /// host flags).
    fn merge_arith(&mut self, reg: Register) -> Result<(), NotTranslated> {
        let fl = self.field(self.o.rflags);
        self.add(Instruction::with2(Code::Xor_r64_rm64, reg, fl))?;
        let reg32 = match reg {
            Register::RAX => Register::EAX,
            _ => Register::ECX,
        };
        debug_assert!(matches!(reg, Register::RAX | Register::RCX));
        // (A 32-bit AND clears the upper half: ARITH is below bit 32.)
        self.add(Instruction::with2(Code::And_rm32_imm32, reg32, ARITH))?;
        self.add(Instruction::with2(Code::Xor_rm64_r64, fl, reg))
    }

    /// Writes the flags saved in r15 (see [`Self::save_flags`]) into
    /// `state.rflags` (clobbers rax, rcx and the host flags).
    pub(super) fn capture_saved(&mut self, af_clear: bool) -> Result<(), NotTranslated> {
        // AH = SF ZF AF PF CF (LAHF, bit 1 set), AL = OF (SETO: 0 or 1).
        self.a.mov(eax, r15d)?;
        self.a.movzx(ecx, ah)?;
        self.a.movzx(eax, al)?;
        self.a.shl(eax, 11)?;
        self.a.or(ecx, eax)?;
        if af_clear {
            self.a.and(ecx, (ARITH & !AF) as i32)?;
        }
        self.merge_arith(Register::RCX)
    }

    pub(super) fn capture_if_dirty(&mut self) -> Result<(), NotTranslated> {
        if self.dirty {
            if self.saved {
                self.capture_saved(self.af_clear)?;
            } else {
                self.capture(self.af_clear)?;
            }
            self.dirty = false;
            self.saved = false;
        }
        Ok(())
    }

    /// Before code that clobbers the host flags but changes no guest flag
    /// (an inline access): if the host holds flags not yet written back,
    /// keep them in r15 (`lahf`/`seto`: AH = SF ZF AF PF CF, AL = OF),
    /// far cheaper than writing them back; otherwise just forget the host
    /// copy. Clobbers rax.
    pub(super) fn save_flags(&mut self) -> Result<(), NotTranslated> {
        if self.host_valid && self.dirty {
            self.a.lahf()?;
            self.a.seto(al)?;
            self.a.mov(r15d, eax)?;
            self.saved = true;
        }
        self.host_valid = false;
        Ok(())
    }

    /// `state.rflags`' arithmetic flags into r15 in [`Self::save_flags`]'
    /// format (clobbers rax, rcx): a slow path that leaves the flags exact
    /// in the state converges with a fast path that keeps them in r15.
    pub(super) fn load_saved(&mut self) -> Result<(), NotTranslated> {
        let fl = self.field(self.o.rflags);
        self.add(Instruction::with2(Code::Mov_r64_rm64, Register::RCX, fl))?;
        self.a.mov(eax, ecx)?;
        self.a.shr(eax, 11)?;
        self.a.and(eax, 1)?;
        self.a.mov(ah, cl)?;
        self.a.mov(r15d, eax)?;
        Ok(())
    }

    /// Makes the host flags hold the guest's: from r15 if saved there,
    /// else from `state.rflags` (`sahf` for SF ZF AF PF CF, an addition
    /// that overflows exactly when OF is set for OF; no `popfq`).
    /// Clobbers rax and rcx.
    pub(super) fn need_flags(&mut self) -> Result<(), NotTranslated> {
        if self.host_valid {
            return Ok(());
        }
        if self.saved {
            self.a.mov(eax, r15d)?;
            self.a.add(al, 0x7f)?;
            self.a.sahf()?;
            self.saved = false;
            self.host_valid = true;
            return Ok(());
        }
        debug_assert!(!self.dirty, "dirty flags neither in the host nor in r15");
        let fl = self.field(self.o.rflags);
        self.add(Instruction::with2(Code::Mov_r64_rm64, Register::RCX, fl))?;
        self.a.mov(eax, ecx)?;
        self.a.shr(eax, 11)?;
        self.a.and(eax, 1)?;
        self.a.add(al, 0x7f)?;
        self.a.mov(ah, cl)?;
        self.a.sahf()?;
        self.host_valid = true;
        self.dirty = false;
        Ok(())
    }

    /// ADC and SBB read CF: the guest's flags must be in the host's.
    pub(super) fn need_flags_for(&mut self, op: BinOp) -> Result<(), NotTranslated> {
        if matches!(op, BinOp::Adc | BinOp::Sbb) {
            self.need_flags()?;
        }
        Ok(())
    }

    /// An instruction whose flags are never observed clobbered the host
    /// flags: nothing holds the guest's any more, and nothing needs to
    /// (see [`flags_live_after`]).
    pub(super) fn flags_clobbered(&mut self) {
        debug_assert!(self.flags_dead);
        self.flags_overwritten();
    }

    /// Before code that replaces every arithmetic flag in `state.rflags`
    /// (a shift's merge): flags not yet written back need not be, nor
    /// kept anywhere.
    pub(super) fn flags_overwritten(&mut self) {
        self.host_valid = false;
        self.dirty = false;
        self.saved = false;
    }

    /// An instruction that sets every arithmetic flag.
    pub(super) fn wrote_flags(&mut self, logic: bool) {
        self.host_valid = true;
        self.dirty = true;
        self.saved = false;
        self.af_clear = logic;
    }

    pub(super) fn jcc(&mut self, cc: u8, l: CodeLabel) -> Result<(), NotTranslated> {
        let a = &mut self.a;
        Ok(match cc & 15 {
            0 => a.jo(l),
            1 => a.jno(l),
            2 => a.jb(l),
            3 => a.jae(l),
            4 => a.je(l),
            5 => a.jne(l),
            6 => a.jbe(l),
            7 => a.ja(l),
            8 => a.js(l),
            9 => a.jns(l),
            10 => a.jp(l),
            11 => a.jnp(l),
            12 => a.jl(l),
            13 => a.jge(l),
            14 => a.jle(l),
            _ => a.jg(l),
        }?)
    }
}

/// For each instruction of a block, whether the arithmetic flags it leaves
/// can be observed: read by a later instruction, seen by the interpreter
/// (a call-out, or an inline access whose slow path may fault and push
/// RFLAGS), or left in the state at the block's end, before a later
/// instruction overwrites all of them. Where they cannot, the translator
/// need not make the flags the SDM leaves undefined equal the
/// interpreter's (nor compute them at all). Conservative: any form not
/// listed observes them.
pub(super) fn flags_live_after(insns: &[crate::cpu::fast::Op]) -> Vec<bool> {
    let mut live = vec![true; insns.len()];
    // At the end of the block the state must be exact.
    let mut after = true;
    for (k, op) in insns.iter().enumerate().rev() {
        live[k] = after;
        after = match effect(&op.fast) {
            Effect::Kill => false,
            Effect::Keep => after,
            Effect::Observe => true,
        };
    }
    live
}

/// Whether the arithmetic flags at the block's entry can be observed
/// (the live-in of [`flags_live_after`]'s analysis): false when, before
/// any observer (a reader, a call-out, an inline access, an exit), an
/// instruction writes all six of them. A loop back to the block's own
/// start then need not write them back to the state (see
/// `Emitter::self_loop_exit`): the block overwrites them before anything
/// could see the state's copy.
pub(super) fn flags_live_at_entry(insns: &[crate::cpu::fast::Op]) -> bool {
    for op in insns {
        match effect(&op.fast) {
            Effect::Kill => return false,
            Effect::Keep => {}
            Effect::Observe => return true,
        }
    }
    // Through the end of the block: exact there.
    true
}

/// What an instruction does to the liveness of the flags before it.
enum Effect {
    /// Writes every arithmetic flag without reading any.
    Kill,
    /// Leaves some or all of them as they were, reading none.
    Keep,
    /// Reads them, or they may be observed at it.
    Observe,
}

fn effect(f: &Fast) -> Effect {
    if !is_native(f) {
        // Call-outs and inline accesses (whose slow path may fault).
        return Effect::Observe;
    }
    match *f {
        Fast::AluRR { op, .. } | Fast::AluRI { op, .. } => {
            if matches!(op, BinOp::Adc | BinOp::Sbb) {
                Effect::Observe
            } else {
                Effect::Kill
            }
        }
        Fast::TestRR { .. } | Fast::TestRI { .. } => Effect::Kill,
        Fast::Shift {
            op: ShiftOp::Shl | ShiftOp::Sal | ShiftOp::Shr | ShiftOp::Sar,
            count: Some(n),
            size,
            ..
        } if n & if size == Size::B8 { 0x3f } else { 0x1f } != 0 => Effect::Kill,
        // Rotates write CF and OF only, IMUL CF and OF only (SF ZF AF PF
        // kept), INC/DEC all but CF; a masked count of 0 writes nothing.
        Fast::Shift { .. }
        | Fast::Imul { .. }
        | Fast::IncDec { .. }
        | Fast::MovRR { .. }
        | Fast::MovRI { .. }
        | Fast::Lea { .. }
        | Fast::ExtendR { .. }
        | Fast::Nop => Effect::Keep,
        _ => Effect::Observe,
    }
}
