//! Register forms that run as host instructions.

use super::*;

impl Emitter {
    pub(super) fn native(&mut self, k: usize, f: &Fast) -> Result<(), NotTranslated> {
        match *f {
            Fast::Nop => {}
            Fast::MovRR { dst, src, size } => {
                self.load(ACC, src, size)?;
                self.store_acc(dst, size)?;
            }
            Fast::MovRI { dst, size, imm } => {
                match size {
                    Size::B8 => self.a.mov(rax, imm)?,
                    Size::B4 => self.a.mov(eax, imm as u32)?,
                    Size::B2 => self.a.mov(iced_x86::code_asm::ax, imm as u32)?,
                    Size::B1 => self.a.mov(iced_x86::code_asm::al, imm as u32)?,
                }
                self.store_acc(dst, size)?;
            }
            Fast::Lea { dst, size, m } => {
                self.lea(&m)?;
                if size == Size::B4 {
                    self.a.mov(eax, eax)?;
                }
                self.store_acc(dst, size)?;
            }
            Fast::ExtendR {
                dst,
                dsize,
                src,
                ssize,
                signed,
            } => {
                let m = self.g(src);
                self.extend(dst, dsize, m, ssize, signed)?;
            }
            Fast::AluRR { op, dst, src, size } => {
                self.need_flags_for(op)?;
                self.load(SEC, src, size)?;
                self.alu_gpr(op, dst, size, SEC)?;
                self.wrote_flags(matches!(op, BinOp::And | BinOp::Or | BinOp::Xor));
            }
            Fast::AluRI { op, dst, size, imm } => {
                self.need_flags_for(op)?;
                let (rm_r, _, rm_imm) = alu_codes(op);
                let m = self.g(dst);
                match size {
                    Size::B4 => {
                        self.load(ACC, dst, size)?;
                        self.add(Instruction::with2(rm_imm[2], Register::EAX, imm as u32))?;
                        if op != BinOp::Cmp {
                            self.store_acc(dst, size)?;
                        }
                    }
                    Size::B8 if imm as i64 != imm as i32 as i64 => {
                        // mov rcx, imm64 does not touch the flags.
                        self.a.mov(rcx, imm)?;
                        self.add(Instruction::with2(rm_r[3], m, Register::RCX))?;
                    }
                    Size::B8 => self.add(Instruction::with2(rm_imm[3], m, imm as i32))?,
                    s => self.add(Instruction::with2(rm_imm[si(s)], m, imm as u32))?,
                }
                self.wrote_flags(matches!(op, BinOp::And | BinOp::Or | BinOp::Xor));
            }
            Fast::TestRR { a, b, size } => {
                self.load(SEC, b, size)?;
                let m = self.g(a);
                let code = [
                    Code::Test_rm8_r8,
                    Code::Test_rm16_r16,
                    Code::Test_rm32_r32,
                    Code::Test_rm64_r64,
                ][si(size)];
                self.add(Instruction::with2(code, m, SEC[si(size)]))?;
                self.wrote_flags(true);
            }
            Fast::TestRI { a, size, imm } => {
                let m = self.g(a);
                match size {
                    Size::B8 if imm as i64 != imm as i32 as i64 => {
                        self.a.mov(rcx, imm)?;
                        self.add(Instruction::with2(Code::Test_rm64_r64, m, Register::RCX))?;
                    }
                    Size::B8 => {
                        self.add(Instruction::with2(Code::Test_rm64_imm32, m, imm as i32))?
                    }
                    s => {
                        let code = [
                            Code::Test_rm8_imm8,
                            Code::Test_rm16_imm16,
                            Code::Test_rm32_imm32,
                        ][si(s)];
                        self.add(Instruction::with2(code, m, imm as u32))?;
                    }
                }
                self.wrote_flags(true);
            }
            Fast::IncDec { dst, size, dec } => {
                // INC and DEC keep CF: the guest's must be in the host flags.
                self.need_flags()?;
                let codes = if dec {
                    [
                        Code::Dec_rm8,
                        Code::Dec_rm16,
                        Code::Dec_rm32,
                        Code::Dec_rm64,
                    ]
                } else {
                    [
                        Code::Inc_rm8,
                        Code::Inc_rm16,
                        Code::Inc_rm32,
                        Code::Inc_rm64,
                    ]
                };
                if size == Size::B4 {
                    self.load(ACC, dst, size)?;
                    self.add(Instruction::with1(codes[2], Register::EAX))?;
                    self.store_acc(dst, size)?;
                } else {
                    let m = self.g(dst);
                    self.add(Instruction::with1(codes[si(size)], m))?;
                }
                self.wrote_flags(false);
            }
            Fast::CmovR { cc, dst, src, size } => {
                self.need_flags()?;
                let code =
                    cmov_code(cc, size).ok_or(NotTranslated::Unsupported("CMOVcc of this size"))?;
                self.load(ACC, dst, size)?;
                let m = self.g(src);
                self.add(Instruction::with2(code, ACC[si(size)], m))?;
                self.store_acc(dst, size)?;
            }
            Fast::Shift {
                op,
                dst,
                size,
                count: Some(count),
            } => self.shift_imm(op, dst, size, count)?,
            Fast::Imul {
                dst,
                src,
                size,
                imm,
            } => {
                // CF and OF from the host; SF ZF AF PF stay as they were
                // (the interpreter's choice for these undefined flags).
                let dead = self.flags_dead;
                if !dead {
                    self.capture_if_dirty()?;
                }
                self.a
                    .add(qword_ptr(rbx + self.o.cycles), self.o.multiply_cost as i32)?;
                let g = self.g(src);
                match imm {
                    None => {
                        self.load(ACC, dst, size)?;
                        let code = [
                            Code::Imul_r16_rm16,
                            Code::Imul_r16_rm16,
                            Code::Imul_r32_rm32,
                            Code::Imul_r64_rm64,
                        ][si(size)];
                        self.add(Instruction::with2(code, ACC[si(size)], g))?;
                    }
                    Some(imm) => {
                        let (code, v) = match size {
                            Size::B2 => (Code::Imul_r16_rm16_imm16, imm as u16 as i16 as i32),
                            Size::B4 => (Code::Imul_r32_rm32_imm32, imm as u32 as i32),
                            _ => {
                                if imm as i64 != imm as i32 as i64 {
                                    return Err(NotTranslated::Unsupported("IMUL imm64"));
                                }
                                (Code::Imul_r64_rm64_imm32, imm as i32)
                            }
                        };
                        if size == Size::B1 {
                            return Err(NotTranslated::Unsupported("8-bit IMUL"));
                        }
                        self.add(Instruction::with3(code, ACC[si(size)], g, v))?;
                    }
                }
                if dead {
                    self.store_acc(dst, size)?;
                    self.flags_clobbered();
                    return Ok(());
                }
                self.a.pushfq()?;
                self.store_acc(dst, size)?;
                self.a.pop(rcx)?;
                self.a.and(ecx, 0x801)?;
                let fl = self.field(self.o.rflags);
                self.add(Instruction::with2(Code::Mov_r64_rm64, Register::RDX, fl))?;
                self.a.and(rdx, !0x801i32)?;
                self.a.or(rdx, rcx)?;
                self.add(Instruction::with2(Code::Mov_rm64_r64, fl, Register::RDX))?;
                self.host_valid = false;
                self.dirty = false;
            }
            Fast::Jcc { cc, target } => {
                self.need_flags()?;
                let label = self.a.create_label();
                self.jcc(cc, label)?;
                self.exits.push(Exit {
                    label,
                    k,
                    target,
                    dirty: self.dirty,
                    af_clear: self.af_clear,
                });
            }
            _ => return Err(NotTranslated::Unsupported("not a native form")),
        }
        Ok(())
    }

    /// MOVZX/MOVSX/MOVSXD (or a plain move for equal sizes): `gpr[dst]`
    /// at `dsize` = `src` (a guest register slot or the host pointer of a
    /// memory operand) at `ssize`, zero- or sign-extended.
    pub(super) fn extend(
        &mut self,
        dst: u8,
        dsize: Size,
        src: MemoryOperand,
        ssize: Size,
        signed: bool,
    ) -> Result<(), NotTranslated> {
        let code = match (ssize, signed) {
            (Size::B1, true) => Code::Movsx_r64_rm8,
            (Size::B2, true) => Code::Movsx_r64_rm16,
            (Size::B4, true) => Code::Movsxd_r64_rm32,
            (Size::B1, false) => Code::Movzx_r64_rm8,
            (Size::B2, false) => Code::Movzx_r64_rm16,
            (Size::B4, false) => Code::Mov_r32_rm32,
            (Size::B8, _) => Code::Mov_r64_rm64,
        };
        let r = if code == Code::Mov_r32_rm32 {
            Register::EAX
        } else {
            Register::RAX
        };
        self.add(Instruction::with2(code, r, src))?;
        if dsize == Size::B4 {
            self.a.mov(eax, eax)?;
        }
        self.store_acc(dst, dsize)
    }

    /// `gpr[dst] op= src` at `size` (CMP only compares), `src` a host
    /// register (not rax) holding the operand; a 32-bit result is
    /// zero-extended. The guest's flags must already be in the host's for
    /// ADC/SBB.
    pub(super) fn alu_gpr(
        &mut self,
        op: BinOp,
        dst: u8,
        size: Size,
        src: [Register; 4],
    ) -> Result<(), NotTranslated> {
        let (rm_r, r_rm, _) = alu_codes(op);
        if size == Size::B4 {
            self.load(ACC, dst, size)?;
            self.add(Instruction::with2(r_rm[2], Register::EAX, src[2]))?;
            if op != BinOp::Cmp {
                self.store_acc(dst, size)?;
            }
            Ok(())
        } else {
            let g = self.g(dst);
            self.add(Instruction::with2(rm_r[si(size)], g, src[si(size)]))
        }
    }

    /// SHL/SAL/SHR/SAR of a register by an immediate. A masked count of 0
    /// changes no flags (a 32-bit destination is still zero-extended);
    /// otherwise the host gives the result, CF, SF, ZF and PF, and the
    /// flags the SDM leaves undefined are set as the interpreter's `alu`
    /// sets them: AF set, OF = MSB(result) XOR CF (SHL), bit `bits - 2` of
    /// the result (SHR), clear (SAR), whatever the count.
    pub(super) fn shift_imm(
        &mut self,
        op: ShiftOp,
        dst: u8,
        size: Size,
        count: u8,
    ) -> Result<(), NotTranslated> {
        let n = count & if size == Size::B8 { 0x3f } else { 0x1f };
        if n == 0 {
            if size == Size::B4 {
                self.load(ACC, dst, size)?;
                self.store_acc(dst, size)?;
            }
            return Ok(());
        }
        if self.flags_dead {
            return self.shift_flags_dead(op, dst, size, n);
        }
        self.capture_if_dirty()?;
        let codes = match op {
            ShiftOp::Shl | ShiftOp::Sal => SHL_IMM,
            ShiftOp::Shr => SHR_IMM,
            ShiftOp::Sar => SAR_IMM,
            ShiftOp::Rol | ShiftOp::Ror => return self.rotate_imm(op, dst, size, n),
            _ => return Err(NotTranslated::Unsupported("rotate through carry")),
        };
        self.load(ACC, dst, size)?;
        self.add(Instruction::with2(codes[si(size)], ACC[si(size)], n as u32))?;
        // rcx = host flags with AF set and OF clear.
        self.a.pushfq()?;
        self.a.pop(rcx)?;
        self.a.and(ecx, (ARITH & !0x800) as i32)?;
        self.a.or(ecx, AF as i32)?;
        let bits = size.bits();
        match op {
            ShiftOp::Shl | ShiftOp::Sal => {
                // OF = MSB(result) ^ CF.
                self.a.mov(rdx, rax)?;
                self.a.shr(rdx, bits - 1)?;
                self.a.xor(rdx, rcx)?;
                self.a.and(edx, 1)?;
                self.a.shl(edx, 11)?;
                self.a.or(rcx, rdx)?;
            }
            ShiftOp::Shr => {
                self.a.mov(rdx, rax)?;
                self.a.shr(rdx, bits - 2)?;
                self.a.and(edx, 1)?;
                self.a.shl(edx, 11)?;
                self.a.or(rcx, rdx)?;
            }
            _ => {}
        }
        self.store_acc(dst, size)?;
        let fl = self.field(self.o.rflags);
        self.add(Instruction::with2(Code::Mov_r64_rm64, Register::RDX, fl))?;
        self.a.and(rdx, !(ARITH as i32))?;
        self.a.or(rdx, rcx)?;
        self.add(Instruction::with2(Code::Mov_rm64_r64, fl, Register::RDX))?;
        self.host_valid = false;
        self.dirty = false;
        Ok(())
    }

    /// A shift or rotate by a masked, nonzero immediate whose flags are
    /// never observed (and so, since it reads none, neither are the ones
    /// before it): the host instruction alone; the flags are then nowhere
    /// (none of the emitter's places holds them) until the next writer.
    fn shift_flags_dead(
        &mut self,
        op: ShiftOp,
        dst: u8,
        size: Size,
        n: u8,
    ) -> Result<(), NotTranslated> {
        let codes = match op {
            ShiftOp::Shl | ShiftOp::Sal => SHL_IMM,
            ShiftOp::Shr => SHR_IMM,
            ShiftOp::Sar => SAR_IMM,
            ShiftOp::Rol => ROL_IMM,
            ShiftOp::Ror => ROR_IMM,
            _ => return Err(NotTranslated::Unsupported("rotate through carry")),
        };
        self.flags_clobbered();
        if size == Size::B4 {
            self.load(ACC, dst, size)?;
            self.add(Instruction::with2(codes[2], Register::EAX, n as u32))?;
            self.store_acc(dst, size)
        } else {
            let g = self.g(dst);
            self.add(Instruction::with2(codes[si(size)], g, n as u32))
        }
    }

    /// ROL/ROR of a register by a masked, nonzero immediate count. The
    /// host rotates (by the count modulo the width, as `alu::rol`/`ror`
    /// do); CF and OF are computed from the result as the interpreter's
    /// `alu` computes them (ROL: CF = bit 0, OF = MSB XOR CF; ROR: CF =
    /// MSB, OF = MSB XOR the bit below it), not taken from the host, whose
    /// OF is undefined for counts above 1; SF ZF AF PF are kept.
    pub(super) fn rotate_imm(
        &mut self,
        op: ShiftOp,
        dst: u8,
        size: Size,
        n: u8,
    ) -> Result<(), NotTranslated> {
        let codes = if op == ShiftOp::Rol { ROL_IMM } else { ROR_IMM };
        self.load(ACC, dst, size)?;
        self.add(Instruction::with2(codes[si(size)], ACC[si(size)], n as u32))?;
        let bits = size.bits();
        // rcx = CF (bit 0), rdx = the other bit OF compares it with.
        self.a.mov(rcx, rax)?;
        self.a.mov(rdx, rax)?;
        if op == ShiftOp::Rol {
            self.a.shr(rdx, bits - 1)?;
        } else {
            self.a.shr(rcx, bits - 1)?;
            self.a.shr(rdx, bits - 2)?;
        }
        self.a.and(ecx, 1)?;
        self.a.xor(rdx, rcx)?;
        self.a.and(edx, 1)?;
        self.a.shl(edx, 11)?;
        self.a.or(rcx, rdx)?;
        self.store_acc(dst, size)?;
        let fl = self.field(self.o.rflags);
        self.add(Instruction::with2(Code::Mov_r64_rm64, Register::RDX, fl))?;
        self.a.and(rdx, !((CF | OF) as i32))?;
        self.a.or(rdx, rcx)?;
        self.add(Instruction::with2(Code::Mov_rm64_r64, fl, Register::RDX))?;
        self.host_valid = false;
        self.dirty = false;
        Ok(())
    }
}
