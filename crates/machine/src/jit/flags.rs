//! The guest's arithmetic flags in generated code: where they live (the
//! host flags or `state.rflags`), writing them back and loading them.

use super::*;

impl Emitter {
    /// Writes the host's arithmetic flags into `state.rflags` (clobbers
    /// rax, rcx and the host flags).
    pub(super) fn capture(&mut self, af_clear: bool) -> Result<(), NotTranslated> {
        let mask = if af_clear { ARITH & !AF } else { ARITH };
        let fl = self.field(self.o.rflags);
        self.a.pushfq()?;
        self.a.pop(rax)?;
        self.a.and(eax, mask as i32)?;
        self.add(Instruction::with2(Code::Mov_r64_rm64, Register::RCX, fl))?;
        self.a.and(rcx, !(ARITH as i32))?;
        self.a.or(rcx, rax)?;
        self.add(Instruction::with2(Code::Mov_rm64_r64, fl, Register::RCX))
    }

    pub(super) fn capture_if_dirty(&mut self) -> Result<(), NotTranslated> {
        if self.dirty {
            self.capture(self.af_clear)?;
            self.dirty = false;
        }
        Ok(())
    }

    /// Makes the host flags hold the guest's, loading them from
    /// `state.rflags` if needed (the host's other flags are kept).
    pub(super) fn need_flags(&mut self) -> Result<(), NotTranslated> {
        if self.host_valid {
            return Ok(());
        }
        let fl = self.field(self.o.rflags);
        self.a.pushfq()?;
        self.a.pop(rax)?;
        self.a.and(rax, !(ARITH as i32))?;
        self.add(Instruction::with2(Code::Mov_r64_rm64, Register::RCX, fl))?;
        self.a.and(ecx, ARITH as i32)?;
        self.a.or(rax, rcx)?;
        self.a.push(rax)?;
        self.a.popfq()?;
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

    /// An instruction that sets every arithmetic flag.
    pub(super) fn wrote_flags(&mut self, logic: bool) {
        self.host_valid = true;
        self.dirty = true;
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
