//! Register forms that run as host instructions.

use super::*;
use crate::alu::BitOp;

impl Emitter {
    pub(super) fn native(&mut self, k: usize, f: &Fast) -> Result<(), NotTranslated> {
        match *f {
            Fast::Nop => {}
            Fast::MovRR { dst, src, size } => {
                // (The source looked up before the destination is
                // claimed: for `mov rsi, rsi` with rsi in no host register
                // the claim maps one that holds no value yet.)
                let from = self.cached_reg(src, size);
                if let Some(h) = self.wide_claim(dst, size)? {
                    let code = MOV_R_RM[si(size)];
                    match from {
                        Some(r) => self.add(Instruction::with2(code, h[si(size)], r))?,
                        None => {
                            let m = self.g(src)?;
                            self.add(Instruction::with2(code, h[si(size)], m))?;
                        }
                    }
                    return self.store_held(dst, h);
                }
                self.load(ACC, src, size)?;
                self.store_acc(dst, size)?;
            }
            Fast::MovRI { dst, size, imm } => {
                if let Some(h) = self.wide_claim(dst, size)? {
                    // Straight into the destination's host register (a
                    // 32-bit move zero-extends).
                    if size == Size::B8 {
                        self.add(Instruction::with2(Code::Mov_r64_imm64, h[3], imm))?;
                    } else {
                        self.add(Instruction::with2(Code::Mov_r32_imm32, h[2], imm as u32))?;
                    }
                    return self.store_held(dst, h);
                }
                match size {
                    Size::B8 => self.a.mov(rax, imm)?,
                    Size::B4 => self.a.mov(eax, imm as u32)?,
                    Size::B2 => self.a.mov(iced_x86::code_asm::ax, imm as u32)?,
                    Size::B1 => self.a.mov(iced_x86::code_asm::al, imm as u32)?,
                }
                self.store_acc(dst, size)?;
            }
            Fast::Lea { dst, size, m } => {
                // Straight into the destination's host register: held
                // (its value loaded) when the address reads it, else
                // claimed.
                let h = if m.base == dst || m.index == dst {
                    self.wide_hold(dst, size)?
                } else {
                    self.wide_claim(dst, size)?
                };
                if let Some(h) = h {
                    self.lea_to(&m, h)?;
                    if size == Size::B4 {
                        self.add(Instruction::with2(Code::Mov_r32_rm32, h[2], h[2]))?;
                    }
                    return self.store_held(dst, h);
                }
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
                // The source where a host register holds it (a dirty one
                // is not stored for this).
                let from = self.cached_reg(src, ssize);
                if let Some(h) = self.wide_claim(dst, dsize)? {
                    // Straight into the destination's host register.
                    let (code, r) = extend_code_to(ssize, signed, dsize, h);
                    match from {
                        Some(f) => self.add(Instruction::with2(code, r, f))?,
                        None => {
                            let m = self.slot(src);
                            self.add(Instruction::with2(code, r, m))?;
                        }
                    }
                    return self.store_held(dst, h);
                }
                match from {
                    Some(h) => {
                        let (code, r) = extend_code(ssize, signed);
                        self.add(Instruction::with2(code, r, h))?;
                        self.extended(dst, dsize)?;
                    }
                    None => {
                        let m = self.slot(src);
                        self.extend(dst, dsize, m, ssize, signed)?;
                    }
                }
            }
            Fast::AluRR { op, dst, src, size } => {
                self.need_flags_for(op)?;
                if matches!(size, Size::B4 | Size::B8) {
                    // In place in the guest register's host register; XOR
                    // or SUB of a register with itself does not read it.
                    let zeroing = dst == src && matches!(op, BinOp::Xor | BinOp::Sub);
                    let h = if zeroing {
                        self.claim_reg(dst)?
                    } else {
                        self.hold_reg(dst)?
                    };
                    if let Some(h) = h {
                        let (_, r_rm, _) = alu_codes(op);
                        self.with_gpr(r_rm[si(size)], h[si(size)], src, size)?;
                        if op != BinOp::Cmp {
                            self.store_held(dst, h)?;
                        }
                        self.wrote_flags(matches!(op, BinOp::And | BinOp::Or | BinOp::Xor));
                        return Ok(());
                    }
                }
                self.load(SEC, src, size)?;
                self.alu_gpr(op, dst, size, SEC)?;
                self.wrote_flags(matches!(op, BinOp::And | BinOp::Or | BinOp::Xor));
            }
            Fast::AluRI { op, dst, size, imm } => {
                self.need_flags_for(op)?;
                let (rm_r, _, rm_imm) = alu_codes(op);
                if let Some(h) = self.wide_hold(dst, size)? {
                    // In place in the guest register's host register.
                    if size == Size::B8 && imm as i64 != imm as i32 as i64 {
                        // mov rcx, imm64 does not touch the flags.
                        self.a.mov(rcx, imm)?;
                        self.add(Instruction::with2(rm_r[3], h[3], Register::RCX))?;
                    } else if size == Size::B8 {
                        self.add(Instruction::with2(rm_imm[3], h[3], imm as i32))?;
                    } else {
                        self.add(Instruction::with2(rm_imm[2], h[2], imm as u32))?;
                    }
                    if op != BinOp::Cmp {
                        self.store_held(dst, h)?;
                    }
                    self.wrote_flags(matches!(op, BinOp::And | BinOp::Or | BinOp::Xor));
                    return Ok(());
                }
                // 32 and 64 bits in rax (the value stays in a host register,
                // `jit/regs.rs`); 8 and 16 bits on the slot.
                match size {
                    Size::B4 => {
                        self.load(ACC, dst, size)?;
                        self.add(Instruction::with2(rm_imm[2], Register::EAX, imm as u32))?;
                    }
                    Size::B8 if imm as i64 != imm as i32 as i64 => {
                        // mov rcx, imm64 does not touch the flags.
                        self.a.mov(rcx, imm)?;
                        self.load(ACC, dst, size)?;
                        self.add(Instruction::with2(rm_r[3], Register::RAX, Register::RCX))?;
                    }
                    Size::B8 => {
                        self.load(ACC, dst, size)?;
                        self.add(Instruction::with2(rm_imm[3], Register::RAX, imm as i32))?;
                    }
                    s => {
                        let m = self.g(dst)?;
                        self.add(Instruction::with2(rm_imm[si(s)], m, imm as u32))?;
                        self.forget_reg(dst);
                    }
                }
                if op != BinOp::Cmp && matches!(size, Size::B4 | Size::B8) {
                    self.store_acc(dst, size)?;
                }
                self.wrote_flags(matches!(op, BinOp::And | BinOp::Or | BinOp::Xor));
            }
            Fast::TestRR { a, b, size } => {
                // (TEST is commutative: a register held in a host register
                // tests the other where it is.)
                let code = TEST_RM_R[si(size)];
                let (ha, hb) = (self.cached_reg(a, size), self.cached_reg(b, size));
                if let Some(h) = hb.or(ha) {
                    let other = if hb.is_some() { a } else { b };
                    match self.cached_reg(other, size) {
                        Some(o) => self.add(Instruction::with2(code, o, h))?,
                        None => {
                            let m = self.g(other)?;
                            self.add(Instruction::with2(code, m, h))?;
                        }
                    }
                    self.wrote_flags(true);
                    return Ok(());
                }
                self.load(SEC, b, size)?;
                let m = self.g(a)?;
                self.add(Instruction::with2(TEST_RM_R[si(size)], m, SEC[si(size)]))?;
                self.wrote_flags(true);
            }
            Fast::TestRI { a, size, imm } => {
                // The register where a host register holds it, else its
                // slot (exact: in no host register).
                let held = self.cached_reg(a, size);
                let m = self.slot(a);
                let i = match (size, held) {
                    (Size::B8, _) if imm as i64 != imm as i32 as i64 => {
                        self.a.mov(rcx, imm)?;
                        match held {
                            Some(h) => Instruction::with2(Code::Test_rm64_r64, h, Register::RCX),
                            None => Instruction::with2(Code::Test_rm64_r64, m, Register::RCX),
                        }
                    }
                    (Size::B8, Some(h)) => Instruction::with2(Code::Test_rm64_imm32, h, imm as i32),
                    (Size::B8, None) => Instruction::with2(Code::Test_rm64_imm32, m, imm as i32),
                    (s, held) => {
                        let code = [
                            Code::Test_rm8_imm8,
                            Code::Test_rm16_imm16,
                            Code::Test_rm32_imm32,
                        ][si(s)];
                        match held {
                            Some(h) => Instruction::with2(code, h, imm as u32),
                            None => Instruction::with2(code, m, imm as u32),
                        }
                    }
                };
                self.add(i)?;
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
                if let Some(h) = self.wide_hold(dst, size)? {
                    self.add(Instruction::with1(codes[si(size)], h[si(size)]))?;
                    self.store_held(dst, h)?;
                } else if matches!(size, Size::B4 | Size::B8) {
                    self.load(ACC, dst, size)?;
                    self.add(Instruction::with1(codes[si(size)], ACC[si(size)]))?;
                    self.store_acc(dst, size)?;
                } else {
                    let m = self.g(dst)?;
                    self.add(Instruction::with1(codes[si(size)], m))?;
                    self.forget_reg(dst);
                }
                self.wrote_flags(false);
            }
            Fast::CmovR { cc, dst, src, size } => {
                self.need_flags()?;
                let code =
                    cmov_code(cc, size).ok_or(NotTranslated::Unsupported("CMOVcc of this size"))?;
                if let Some(h) = self.wide_hold(dst, size)? {
                    // (A 32-bit CMOVcc zero-extends whether it moves or not.)
                    self.with_gpr(code, h[si(size)], src, size)?;
                    return self.store_held(dst, h);
                }
                self.load(ACC, dst, size)?;
                let m = self.g(src)?;
                self.add(Instruction::with2(code, ACC[si(size)], m))?;
                self.store_acc(dst, size)?;
            }
            Fast::Shift {
                op,
                dst,
                size,
                count: Some(count),
            } => self.shift_imm(op, dst, size, count)?,
            Fast::Shift {
                op,
                dst,
                size,
                count: None,
            } => self.shift_cl(op, dst, size)?,
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
                // The multiply cost, charged before the next instruction
                // that is not a register form (`Emitter::charge_pending`).
                self.pending_cycles += self.o.multiply_cost;
                // (The source's slot is read only where no host register
                // holds it: exact there.)
                let g = self.slot(src);
                // The product in the destination's host register where
                // one holds it (32 and 64 bits), else in rax.
                let held;
                match imm {
                    None => {
                        held = self.wide_hold(dst, size)?;
                        let code = [
                            Code::Imul_r16_rm16,
                            Code::Imul_r16_rm16,
                            Code::Imul_r32_rm32,
                            Code::Imul_r64_rm64,
                        ][si(size)];
                        match held {
                            Some(h) => self.with_gpr(code, h[si(size)], src, size)?,
                            None => {
                                // (16 bits: the source may be in a host
                                // register, dirty.)
                                self.load(ACC, dst, size)?;
                                self.with_gpr(code, ACC[si(size)], src, size)?;
                            }
                        }
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
                        // (The source looked up before the claim, see
                        // `Emitter::claim_reg`.)
                        let from = self.cached_reg(src, size);
                        held = self.wide_claim(dst, size)?;
                        let to = held.unwrap_or(ACC)[si(size)];
                        match from {
                            Some(r) => self.add(Instruction::with3(code, to, r, v))?,
                            None => self.add(Instruction::with3(code, to, g, v))?,
                        }
                    }
                }
                let store = |e: &mut Self| match held {
                    Some(h) => e.store_held(dst, h),
                    None => e.store_acc(dst, size),
                };
                if dead {
                    store(self)?;
                    self.flags_clobbered();
                    return Ok(());
                }
                // The store is MOVs only: the host flags survive it.
                store(self)?;
                self.merge_multiply_flags()?;
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
                    regs: self.regs,
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
        if let Some(h) = self.wide_claim(dst, dsize)? {
            // Straight into the destination's host register.
            let (code, r) = extend_code_to(ssize, signed, dsize, h);
            self.add(Instruction::with2(code, r, src))?;
            return self.store_held(dst, h);
        }
        let (code, r) = extend_code(ssize, signed);
        self.add(Instruction::with2(code, r, src))?;
        self.extended(dst, dsize)
    }

    /// `gpr[dst]` = the extended value in rax, at `dsize`.
    fn extended(&mut self, dst: u8, dsize: Size) -> Result<(), NotTranslated> {
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
        if matches!(size, Size::B4 | Size::B8) {
            self.load(ACC, dst, size)?;
            self.add(Instruction::with2(
                r_rm[si(size)],
                ACC[si(size)],
                src[si(size)],
            ))?;
            if op != BinOp::Cmp {
                self.store_acc(dst, size)?;
            }
            Ok(())
        } else {
            let g = self.g(dst)?;
            self.add(Instruction::with2(rm_r[si(size)], g, src[si(size)]))?;
            self.forget_reg(dst);
            Ok(())
        }
    }

    /// SHL/SAL/SHR/SAR of a register by an immediate. A masked count of 0
    /// changes no flags (a 32-bit destination is still zero-extended);
    /// otherwise see [`Self::shift_flags`].
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
        let rotate = matches!(op, ShiftOp::Rol | ShiftOp::Ror);
        if rotate {
            self.capture_if_dirty()?;
        } else {
            // All six are replaced in the state below: the ones not yet
            // written back never will be.
            self.flags_overwritten();
        }
        let code = shift_code(op, size, false).ok_or(NotTranslated::Unsupported("RCL/RCR"))?;
        // In the destination's host register where one holds it (32 and
        // 64 bits), else in rax.
        let held = self.wide_hold(dst, size)?;
        let r = match held {
            Some(h) => h,
            None => {
                self.load(ACC, dst, size)?;
                ACC
            }
        };
        self.add(Instruction::with2(code, r[si(size)], n as u32))?;
        if rotate {
            self.rotate_flags(op, size, r[3])?;
        } else {
            self.shift_flags_saved(op, size, r[3])?;
        }
        match held {
            Some(h) => self.store_held(dst, h),
            None => self.store_acc(dst, size),
        }
    }

    /// SHL/SAL/SHR/SAR/ROL/ROR of a 32- or 64-bit register by CL (an 8-
    /// or 16-bit destination is a call-out: the interpreter's CF for
    /// counts at least the width is not the host's). The count is masked
    /// as the interpreter masks it (5 or 6 bits); a masked count of 0
    /// changes no flags and still writes (zero-extends) a 32-bit
    /// destination; otherwise the flags are those of the immediate forms.
    pub(super) fn shift_cl(
        &mut self,
        op: ShiftOp,
        dst: u8,
        size: Size,
    ) -> Result<(), NotTranslated> {
        if !matches!(size, Size::B4 | Size::B8) {
            return Err(NotTranslated::Unsupported("8/16-bit shift by CL"));
        }
        let code = shift_code(op, size, true).ok_or(NotTranslated::Unsupported("RCL/RCR"))?;
        self.capture_if_dirty()?;
        let mut zero = self.a.create_label();
        self.load(ACC, dst, size)?;
        self.load(SEC, 1, Size::B1)?;
        self.a.test(
            iced_x86::code_asm::cl,
            if size == Size::B8 { 0x3f } else { 0x1f },
        )?;
        self.a.je(zero)?;
        self.add(Instruction::with2(code, ACC[si(size)], Register::CL))?;
        if matches!(op, ShiftOp::Rol | ShiftOp::Ror) {
            self.rotate_flags(op, size, Register::RAX)?;
        } else {
            self.shift_flags(op, size, Register::RAX)?;
        }
        self.a.set_label(&mut zero)?;
        self.store_acc(dst, size)?;
        self.host_valid = false;
        Ok(())
    }

    /// After a host SHL/SAL/SHR/SAR by a masked, nonzero count with the
    /// result in `result` (a 64-bit register other than rcx and rdx): the host gives CF, SF, ZF and PF, and the flags the
    /// SDM leaves undefined are set as the interpreter's `alu` sets them:
    /// AF set, OF = MSB(result) XOR CF (SHL), bit `bits - 2` of the result
    /// (SHR), clear (SAR), whatever the count. Written into
    /// `state.rflags` (clobbers rcx, rdx).
    fn shift_flags(
        &mut self,
        op: ShiftOp,
        size: Size,
        result: Register,
    ) -> Result<(), NotTranslated> {
        // rcx = host flags with AF set and OF clear. LAHF, not PUSHFQ
        // (which stalls far longer on the host), with rax kept in rdx:
        // MOV and MOVZX leave the flags alone.
        self.a.mov(rdx, rax)?;
        self.a.lahf()?;
        self.a.movzx(ecx, ah)?;
        self.a.mov(rax, rdx)?;
        self.a.and(ecx, (ARITH & !0x800) as i32)?;
        self.a.or(ecx, AF as i32)?;
        if self.shift_of(op, size, result, Register::CL)? {
            self.a.shl(edx, 11)?;
            self.a.or(rcx, rdx)?;
        }
        self.merge_rflags(ARITH)
    }

    /// rdx = the OF a shift by a nonzero count leaves for the interpreter
    /// (`alu::shift`), `result` the shifted register and bit 0 of `cf` the
    /// CF: MSB(result) XOR CF for SHL, bit `bits - 2` of the result for
    /// SHR. `false` (nothing emitted) for SAR, whose OF is clear.
    fn shift_of(
        &mut self,
        op: ShiftOp,
        size: Size,
        result: Register,
        cf: Register,
    ) -> Result<bool, NotTranslated> {
        let bits = size.bits();
        let shl = match op {
            ShiftOp::Shl | ShiftOp::Sal => true,
            ShiftOp::Shr => false,
            _ => return Ok(false),
        };
        self.add(Instruction::with2(
            Code::Mov_r64_rm64,
            Register::RDX,
            result,
        ))?;
        self.a.shr(rdx, if shl { bits - 1 } else { bits - 2 })?;
        if shl {
            self.add(Instruction::with2(Code::Xor_r8_rm8, Register::DL, cf))?;
        }
        self.a.and(edx, 1)?;
        Ok(true)
    }

    /// [`Self::shift_flags`]' flags, saved in r15 in `save_flags`' form
    /// (AH = SF ZF AF PF CF, AL = OF) instead of merged into
    /// `state.rflags`: written back only where something looks at them,
    /// and not at all when the next writer replaces them first. Keeps
    /// rax; clobbers rcx, rdx.
    fn shift_flags_saved(
        &mut self,
        op: ShiftOp,
        size: Size,
        result: Register,
    ) -> Result<(), NotTranslated> {
        self.shift_flags_saved_as(op, false, size, result)
    }

    /// [`Self::shift_flags_saved`], or with `shrd` (`op` SHR) SHRD's OF:
    /// the XOR of the result's two top bits.
    fn shift_flags_saved_as(
        &mut self,
        op: ShiftOp,
        shrd: bool,
        size: Size,
        result: Register,
    ) -> Result<(), NotTranslated> {
        self.a.mov(rcx, rax)?;
        self.a.lahf()?;
        // (LAHF clobbered AH: a result in rax is in rcx now.)
        let result = if result == Register::RAX {
            Register::RCX
        } else {
            result
        };
        if shrd {
            // The two top bits as bits 1:0 of dl: their XOR is the
            // inverse of the parity TEST leaves in PF.
            self.add(Instruction::with2(
                Code::Mov_r64_rm64,
                Register::RDX,
                result,
            ))?;
            self.a.shr(rdx, size.bits() - 2)?;
            self.a.test(iced_x86::code_asm::dl, 3)?;
            self.a.setnp(iced_x86::code_asm::dl)?;
        } else if !self.shift_of(op, size, result, Register::AH)? {
            self.a.xor(edx, edx)?;
        }
        // AF set (the host's is undefined).
        self.a.or(ah, AF as i32)?;
        self.add(Instruction::with2(
            Code::Mov_r8_rm8,
            Register::AL,
            Register::DL,
        ))?;
        self.a.mov(r15d, eax)?;
        self.a.mov(rax, rcx)?;
        self.host_valid = false;
        self.dirty = true;
        self.saved = true;
        self.af_clear = false;
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
        let code = shift_code(op, size, false).ok_or(NotTranslated::Unsupported("RCL/RCR"))?;
        self.flags_clobbered();
        if let Some(h) = self.wide_hold(dst, size)? {
            // In place in the destination's host register.
            self.add(Instruction::with2(code, h[si(size)], n as u32))?;
            return self.store_held(dst, h);
        }
        if matches!(size, Size::B4 | Size::B8) {
            self.load(ACC, dst, size)?;
            self.add(Instruction::with2(code, ACC[si(size)], n as u32))?;
            self.store_acc(dst, size)
        } else {
            let g = self.g(dst)?;
            self.add(Instruction::with2(code, g, n as u32))?;
            self.forget_reg(dst);
            Ok(())
        }
    }

    /// After a host ROL/ROR by a masked, nonzero count (the host rotates
    /// by the count modulo the width, as `alu::rol`/`ror` do) with the
    /// result in `result` (a 64-bit register other than rcx and rdx): CF
    /// and OF are computed from the result as the
    /// interpreter's `alu` computes them (ROL: CF = bit 0, OF = MSB XOR CF;
    /// ROR: CF = MSB, OF = MSB XOR the bit below it), not taken from the
    /// host, whose OF is undefined for counts above 1; SF ZF AF PF are
    /// kept. Written into `state.rflags` (clobbers rcx, rdx).
    fn rotate_flags(
        &mut self,
        op: ShiftOp,
        size: Size,
        result: Register,
    ) -> Result<(), NotTranslated> {
        let bits = size.bits();
        // rcx = CF (bit 0), rdx = the other bit OF compares it with.
        self.add(Instruction::with2(
            Code::Mov_r64_rm64,
            Register::RCX,
            result,
        ))?;
        self.add(Instruction::with2(
            Code::Mov_r64_rm64,
            Register::RDX,
            result,
        ))?;
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
        self.merge_rflags(CF | OF)
    }

    /// After a host MUL or IMUL, which set CF and OF alike: those two into
    /// `state.rflags` (rcx = OF ? CF | OF : 0, by SETO, not PUSHFQ, which
    /// the host runs far slower), the other flags kept. Clobbers rcx, rdx.
    fn merge_multiply_flags(&mut self) -> Result<(), NotTranslated> {
        self.a.seto(cl)?;
        self.a.movzx(ecx, cl)?;
        self.a.imul_3(ecx, ecx, (CF | OF) as i32)?;
        self.merge_rflags(CF | OF)
    }

    /// `state.rflags = state.rflags & !mask | rcx` (rcx holds only bits
    /// of `mask`); the guest flags are then exact there and not in the
    /// host's. Clobbers rdx.
    pub(super) fn merge_rflags(&mut self, mask: u32) -> Result<(), NotTranslated> {
        let fl = self.field(self.o.rflags);
        self.add(Instruction::with2(Code::Mov_r64_rm64, Register::RDX, fl))?;
        self.a.and(rdx, !(mask as i32))?;
        self.a.or(rdx, rcx)?;
        self.add(Instruction::with2(Code::Mov_rm64_r64, fl, Register::RDX))?;
        self.host_valid = false;
        self.dirty = false;
        Ok(())
    }
}

impl Emitter {
    /// The start of a form with an inline access: the flags written back
    /// (its slow path needs them exact in `state.rflags`, and the checks
    /// clobber the host flags); labels for the slow path and for where the
    /// fast path ends.
    pub(super) fn begin_inline(&mut self) -> Result<(CodeLabel, CodeLabel), NotTranslated> {
        self.capture_if_dirty()?;
        self.host_valid = false;
        Ok((self.a.create_label(), self.a.create_label()))
    }

    /// [`Self::begin_inline`] for a form whose first-level misses are
    /// filled (`filled_slow`): also the miss label and the retry point.
    pub(super) fn begin_filled(
        &mut self,
    ) -> Result<(CodeLabel, CodeLabel, CodeLabel, CodeLabel), NotTranslated> {
        let (full, cont) = self.begin_inline()?;
        let miss = self.a.create_label();
        let retry = self.retry_point()?;
        Ok((full, cont, miss, retry))
    }

    /// The end of the fast path of instruction `k`'s inline form: its slow
    /// path (the instruction through the interpreter) comes back to here,
    /// with the guest flags loaded into the host's if `flags_in_host`.
    pub(super) fn end_inline(
        &mut self,
        k: usize,
        slow: CodeLabel,
        cont: &mut CodeLabel,
        flags_in_host: bool,
    ) -> Result<(), NotTranslated> {
        self.a.set_label(cont)?;
        self.slow
            .push(Slow::whole(slow, k, *cont, flags_in_host, self.regs));
        Ok(())
    }
}
/// Instructions without a fast form (`Fast::Generic`, which the
/// interpreter runs through `exec`) that the translator runs natively,
/// with their operands resolved; classified from the decoded instruction
/// by [`extra_form`], so the interpreter's own path is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extra {
    /// DIV/IDIV of rdx:rax (edx:eax) by a 32- or 64-bit register or
    /// memory operand (`m`, through the inline access; `src` unused).
    Div {
        signed: bool,
        size: Size,
        src: u8,
        m: Option<MemOp>,
    },
    /// PUSH of a 64-bit memory operand (both accesses inline).
    PushM { m: MemOp },
    /// TEST of memory with an immediate (`src` None) or a register.
    TestM {
        size: Size,
        m: MemOp,
        src: Option<u8>,
        imm: u64,
    },
    /// One-operand MUL/IMUL of rax (eax) by a 32- or 64-bit register.
    Mul { signed: bool, size: Size, src: u8 },
    /// CBW/CWDE/CDQE (`to_rdx` false) and CWD/CDQ/CQO: the host
    /// instruction, on rax and rdx loaded whole (so the partial-register
    /// rule is the host's, which is the interpreter's).
    Convert { code: Code, to_rdx: bool },
    /// XCHG of two registers.
    XchgRR { a: u8, b: u8, size: Size },
    /// XCHG of a register with memory (always locked): inline when the
    /// access is aligned (the interpreter's atomic path, with the `locked`
    /// cost) and the first-level TLB serves it.
    XchgMR { reg: u8, size: Size, m: MemOp },
    /// SETcc of a byte register other than AH/CH/DH/BH (`code`, one of
    /// the `Set*_rm8` codes): the host instruction on the low byte of the
    /// pool register holding it, with the guest flags in the host flags.
    Setcc { code: Code, dst: u8 },
    /// NOT (`neg` false) or NEG of a 32- or 64-bit register: the host
    /// instruction. NOT touches no flag; NEG writes all six as SUB from 0
    /// does (`alu::neg`), which the host's are.
    Unary { neg: bool, size: Size, dst: u8 },
    /// INC or DEC of a 32- or 64-bit memory operand (Linux's per-CPU
    /// counters, `incl %gs:...`), through the inline access for writing
    /// as ADD to memory is.
    IncDecM { dec: bool, size: Size, m: MemOp },
    /// PUSH of an immediate (sign-extended to 64 bits; `None`: PUSHFQ,
    /// RFLAGS with VM and RF clear), the push through the inline access
    /// as PUSH of a register is.
    PushI { imm: Option<u64> },
    /// TEST (`op` None) or an ALU operation of AH, CH, DH or BH (byte 1
    /// of register `idx`, 0 to 3) with an immediate: the host
    /// instruction on that byte of the register in the `Cpu`.
    HighByteI { op: Option<BinOp>, idx: u8, imm: u8 },
    /// MOVZX or (`signed`) MOVSX of AH, CH, DH or BH (byte 1 of register
    /// `idx`, 0 to 3) into a 32-bit register (no REX prefix, so one of
    /// the first eight): the host's from that byte of the register in the
    /// `Cpu`.
    ExtendHigh { signed: bool, dst: u8, idx: u8 },
    /// PREFETCHh, LFENCE, MFENCE, SFENCE: no architectural effect here
    /// (the interpreter does nothing, not even a translation; the machine
    /// runs one access at a time in program order), so no code.
    NoEffect,
    /// LEAVE (64-bit): RSP = RBP, then RBP popped, the pop's read through
    /// the inline access.
    Leave,
    /// BSWAP of a 32- or 64-bit register (no flags).
    Bswap { dst: u8, size: Size },
    /// MOV of segment register `seg` (iced's order: ES CS SS DS FS GS)
    /// to a register: the selector, zero-extended to 32 or 64 bits, or
    /// in the low 16 bits (`size` B2; Linux saves DS, ES, FS and GS so
    /// at each context switch).
    MovFromSegment { dst: u8, seg: u8, size: Size },
    /// SETcc of a byte of memory: the condition from the guest flags,
    /// stored through the inline access for writing.
    SetccM { code: Code, m: MemOp },
    /// CLI: IF cleared where CPL is 0 (always allowed there); at any
    /// other CPL the instruction through the interpreter (IOPL check).
    Cli,
    /// STI where CPL is 0, as CLI; always the last instruction of its
    /// block (`code_cache::is_serializing`).
    Sti,
    /// SHLD (`left`) or SHRD of a 32- or 64-bit register with a register
    /// by an immediate (`count`, masked as the interpreter masks it).
    DoubleShift {
        left: bool,
        dst: u8,
        src: u8,
        size: Size,
        count: u8,
    },
    /// Two-operand IMUL of a 32- or 64-bit register by memory, the read
    /// inline (a first-level miss runs the instruction through the
    /// interpreter, as for `Div`).
    ImulM { dst: u8, size: Size, m: MemOp },
    /// STAC (`set`) or CLAC where CPL is 0 (#UD elsewhere: the
    /// interpreter), with the first-level TLB's SMAP bookkeeping.
    Ac { set: bool },
    /// CMPXCHG of a memory operand with `reg` (and the accumulator of
    /// its size; `reg` not AH, CH, DH or BH), locked or not, through the
    /// inline access for writing. (Linux's paravirtual spinlocks release
    /// a lock with a locked byte CMPXCHG.)
    CmpxchgM {
        reg: u8,
        size: Size,
        m: MemOp,
        locked: bool,
    },
    /// BT, BTS, BTR or BTC of a 32- or 64-bit register (`dst`) or, not
    /// locked, of memory (`m`) with an immediate bit index: only CF
    /// changes.
    BitTestI {
        op: BitOp,
        size: Size,
        dst: u8,
        m: Option<MemOp>,
        bit: u8,
    },
    /// BT, BTS, BTR or BTC, not locked, of a 32- or 64-bit memory operand
    /// with the bit offset in register `src`: signed, it can address
    /// beyond the operand.
    BitTestMR {
        op: BitOp,
        size: Size,
        m: MemOp,
        src: u8,
    },
    /// XADD of `reg` to a 32- or 64-bit memory operand, locked or not,
    /// through the inline access for writing.
    XaddM {
        reg: u8,
        size: Size,
        m: MemOp,
        locked: bool,
    },
    /// RDTSC, or RDTSCP (`aux`): the time-stamp counter from the cycle
    /// count and the TSC offset, as the interpreter reads it; with
    /// CR4.TSD set, RDTSC exiting on or events pending, the instruction
    /// through the interpreter. (Linux's TSC synchronisation check at each CPU's
    /// bring-up reads it in a loop, once per iteration.)
    Rdtsc { aux: bool },
    /// MOVAPS, MOVAPD, MOVDQA (`aligned`), MOVUPS, MOVUPD or MOVDQU (legacy
    /// SSE encodings) of a whole XMM register: to another, or to or from
    /// 16 bytes of memory through the inline access.
    XmmMove {
        dst: XmmPlace,
        src: XmmPlace,
        aligned: bool,
    },
    /// CLD (`set` false) or STD (`scalar.rs`).
    Direction { set: bool },
    /// MOV of CR2 to a 64-bit register, at CPL 0 (`scalar.rs`).
    MovFromCr2 { dst: u8 },
    /// BSF, BSR, TZCNT, LZCNT or POPCNT of a 32- or 64-bit register
    /// (`scalar.rs`).
    BitCount {
        op: super::scalar::BitCount,
        dst: u8,
        src: u8,
        size: Size,
    },
    /// REP STOS or (`movs`) REP MOVS of `size` elements with 64-bit
    /// addresses (`jit/string.rs`).
    RepString { movs: bool, size: Size },
    /// POPFQ at CPL 0 (`jit::privileged`; `next_ip` the address after it).
    Popf { next_ip: u64 },
    /// SYSCALL (`jit::privileged`).
    Syscall { next_ip: u64 },
    /// SYSRETQ (`jit::privileged`).
    Sysret,
}

impl Extra {
    /// Whether the form runs with the guest-register cache on
    /// (`jit/regs.rs`) instead of storing every dirty register before it
    /// and reloading after: its code reads and writes guest registers
    /// only through the cache's accessors (`load`, `store_acc`,
    /// `hold_reg`, ...), uses no pool register as scratch and calls into
    /// nothing. Kernel code runs SETcc and CQO between register forms in
    /// its hot loops (`setb %sil` in `mpihelp_submul_1`).
    pub(super) fn keeps_cache(&self) -> bool {
        matches!(
            self,
            Extra::Setcc { .. }
                | Extra::Unary { .. }
                | Extra::Bswap { .. }
                | Extra::Convert { .. }
                | Extra::Mul { .. }
        )
    }
}

/// An operand of [`Extra::XmmMove`]: an XMM register (0-15) or memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum XmmPlace {
    Reg(u8),
    Mem(MemOp),
}

/// [`Extra::XmmMove`] of instruction `i` (a full XMM move mnemonic).
fn xmm_move(i: &iced_x86::Instruction) -> Option<Extra> {
    use iced_x86::{EncodingKind, Mnemonic as M, OpKind};
    if i.encoding() != EncodingKind::Legacy {
        return None;
    }
    let place = |n: u32| match i.op_kind(n) {
        OpKind::Register => {
            let r = i.op_register(n);
            let x = (r as usize).wrapping_sub(Register::XMM0 as usize);
            (r.is_xmm() && x < 16).then_some(XmmPlace::Reg(x as u8))
        }
        OpKind::Memory if i.memory_size().size() == 16 => {
            crate::cpu::fast::mem_operand(i).map(XmmPlace::Mem)
        }
        _ => None,
    };
    let (dst, src) = (place(0)?, place(1)?);
    if matches!((dst, src), (XmmPlace::Mem(_), XmmPlace::Mem(_))) {
        return None;
    }
    let aligned = matches!(i.mnemonic(), M::Movaps | M::Movapd | M::Movdqa);
    Some(Extra::XmmMove { dst, src, aligned })
}

/// The host instruction of an extension from `ssize` (MOVZX, MOVSX,
/// MOVSXD, or a plain move), and the register it writes (32-bit moves
/// zero-extend).
fn extend_code(ssize: Size, signed: bool) -> (Code, Register) {
    match (ssize, signed) {
        (Size::B1, true) => (Code::Movsx_r64_rm8, Register::RAX),
        (Size::B2, true) => (Code::Movsx_r64_rm16, Register::RAX),
        (Size::B4, true) => (Code::Movsxd_r64_rm32, Register::RAX),
        (Size::B1, false) => (Code::Movzx_r64_rm8, Register::RAX),
        (Size::B2, false) => (Code::Movzx_r64_rm16, Register::RAX),
        (Size::B4, false) => (Code::Mov_r32_rm32, Register::EAX),
        (Size::B8, _) => (Code::Mov_r64_rm64, Register::RAX),
    }
}

/// [`extend_code`] writing pool register `h` for a 32- or 64-bit
/// destination: a 32-bit destination takes the 32-bit forms, which
/// zero-extend.
fn extend_code_to(ssize: Size, signed: bool, dsize: Size, h: [Register; 4]) -> (Code, Register) {
    if dsize == Size::B8 {
        let (code, r) = extend_code(ssize, signed);
        return (code, if r == Register::EAX { h[2] } else { h[3] });
    }
    let code = match (ssize, signed) {
        (Size::B1, true) => Code::Movsx_r32_rm8,
        (Size::B2, true) => Code::Movsx_r32_rm16,
        (Size::B1, false) => Code::Movzx_r32_rm8,
        (Size::B2, false) => Code::Movzx_r32_rm16,
        _ => Code::Mov_r32_rm32,
    };
    (code, h[2])
}

/// A full-width register operand (32 or 64 bits): its index.
fn wide_gpr(r: Register) -> Option<(u8, Size)> {
    let size = if r.is_gpr64() {
        Size::B8
    } else if r.is_gpr32() {
        Size::B4
    } else {
        return None;
    };
    Some(((r.number() & 15) as u8, size))
}

/// The size of a 32- or 64-bit memory operand.
fn wide_memory(i: &iced_x86::Instruction) -> Option<Size> {
    match i.memory_size().size() {
        4 => Some(Size::B4),
        8 => Some(Size::B8),
        _ => None,
    }
}

/// The register (0 to 3) whose byte 1 AH, CH, DH or BH is.
fn high_byte_index(r: Register) -> Option<u8> {
    match r {
        Register::AH => Some(0),
        Register::CH => Some(1),
        Register::DH => Some(2),
        Register::BH => Some(3),
        _ => None,
    }
}

/// BT, BTS, BTR or BTC by mnemonic.
fn bit_op(m: iced_x86::Mnemonic) -> BitOp {
    use iced_x86::Mnemonic as M;
    match m {
        M::Bts => BitOp::Bts,
        M::Btr => BitOp::Btr,
        M::Btc => BitOp::Btc,
        _ => BitOp::Bt,
    }
}

/// CMPXCHG (of any size) or XADD (32 or 64 bits) of a memory operand
/// with a register, with or without LOCK (nothing else with LOCK has a
/// form).
fn locked_form(i: &iced_x86::Instruction) -> Option<Extra> {
    use iced_x86::{Mnemonic as M, OpKind};
    if i.op0_kind() != OpKind::Memory || i.op1_kind() != OpKind::Register {
        return None;
    }
    let (reg, size) = crate::cpu::fast::gpr(i.op1_register())?;
    let m = crate::cpu::fast::mem_operand(i)?;
    let locked = i.has_lock_prefix();
    match i.mnemonic() {
        M::Cmpxchg => Some(Extra::CmpxchgM {
            reg,
            size,
            m,
            locked,
        }),
        M::Xadd if matches!(size, Size::B4 | Size::B8) => Some(Extra::XaddM {
            reg,
            size,
            m,
            locked,
        }),
        _ => None,
    }
}

/// The translator's own native form of a generic instruction, if any.
pub(crate) fn extra_form(op: &Op) -> Option<Extra> {
    use iced_x86::{Mnemonic as M, OpKind};
    let i = &op.insn;
    if op.fast == Fast::System(SystemOp::Rdtsc) {
        return Some(Extra::Rdtsc { aux: false });
    }
    if let Some(x) = super::privileged::privileged_form(op) {
        return Some(x);
    }
    if op.fast == Fast::Generic && (i.has_rep_prefix() || i.has_repne_prefix()) {
        return super::string::rep_string_form(i);
    }
    if op.fast != Fast::Generic {
        return None;
    }
    let m = i.mnemonic();
    if i.has_lock_prefix() {
        return locked_form(i);
    }
    match m {
        M::Cmpxchg | M::Xadd => locked_form(i),
        M::Prefetchnta
        | M::Prefetcht0
        | M::Prefetcht1
        | M::Prefetcht2
        | M::Prefetchw
        | M::Lfence
        | M::Mfence
        | M::Sfence => Some(Extra::NoEffect),
        M::Leave if i.code() == Code::Leaveq => Some(Extra::Leave),
        M::Bswap => {
            let (dst, size) = wide_gpr(i.op0_register())?;
            Some(Extra::Bswap { dst, size })
        }
        M::Mov
            if i.op0_kind() == OpKind::Register
                && i.op1_kind() == OpKind::Register
                && i.op1_register().is_segment_register() =>
        {
            let (dst, size) = crate::cpu::fast::gpr(i.op0_register())?;
            let seg = i.op1_register() as u8 - Register::ES as u8;
            (seg < 6 && size != Size::B1).then_some(Extra::MovFromSegment { dst, seg, size })
        }
        M::Cli => Some(Extra::Cli),
        M::Sti => Some(Extra::Sti),
        M::Cld => Some(Extra::Direction { set: false }),
        M::Std => Some(Extra::Direction { set: true }),
        M::Mov
            if i.op0_kind() == OpKind::Register
                && i.op1_kind() == OpKind::Register
                && i.op1_register() == Register::CR2 =>
        {
            let (dst, size) = wide_gpr(i.op0_register())?;
            (size == Size::B8).then_some(Extra::MovFromCr2 { dst })
        }
        M::Bsf | M::Bsr | M::Tzcnt | M::Lzcnt | M::Popcnt => super::scalar::bit_count_form(i),
        M::Stac => Some(Extra::Ac { set: true }),
        M::Clac => Some(Extra::Ac { set: false }),
        M::Rdtscp => Some(Extra::Rdtsc { aux: true }),
        M::Bt | M::Bts | M::Btr | M::Btc
            if i.op0_kind() == OpKind::Memory && i.op1_kind() == OpKind::Register =>
        {
            let m_op = crate::cpu::fast::mem_operand(i)?;
            // (With 32-bit addressing the interpreter adds the bit
            // offset's displacement after truncating: not done here.)
            (!m_op.addr32).then_some(())?;
            Some(Extra::BitTestMR {
                op: bit_op(m),
                size: wide_memory(i)?,
                m: m_op,
                src: wide_gpr(i.op1_register())?.0,
            })
        }
        M::Bt | M::Bts | M::Btr | M::Btc if i.op1_kind() == OpKind::Immediate8 => {
            let op = bit_op(m);
            let (dst, size, m) = match i.op0_kind() {
                OpKind::Register => {
                    let (dst, size) = wide_gpr(i.op0_register())?;
                    (dst, size, None)
                }
                OpKind::Memory => (0, wide_memory(i)?, Some(crate::cpu::fast::mem_operand(i)?)),
                _ => return None,
            };
            Some(Extra::BitTestI {
                op,
                size,
                dst,
                m,
                bit: i.immediate8() & (size.bits() as u8 - 1),
            })
        }
        // SETcc of memory (of a register: below).
        _ if i.condition_code() != iced_x86::ConditionCode::None
            && i.op_count() == 1
            && i.op0_kind() == OpKind::Memory
            && i.memory_size().size() == 1 =>
        {
            Some(Extra::SetccM {
                code: i.code(),
                m: crate::cpu::fast::mem_operand(i)?,
            })
        }
        M::Div | M::Idiv | M::Mul | M::Imul
            if i.op_count() == 1 && i.op0_kind() == OpKind::Register =>
        {
            let (src, size) = wide_gpr(i.op0_register())?;
            let signed = matches!(m, M::Idiv | M::Imul);
            Some(if matches!(m, M::Div | M::Idiv) {
                Extra::Div {
                    signed,
                    size,
                    src,
                    m: None,
                }
            } else {
                Extra::Mul { signed, size, src }
            })
        }
        M::Shld | M::Shrd
            if i.op0_kind() == OpKind::Register
                && i.op1_kind() == OpKind::Register
                && i.op2_kind() == OpKind::Immediate8 =>
        {
            let (dst, size) = wide_gpr(i.op0_register())?;
            let count = i.immediate8() & if size == Size::B8 { 0x3f } else { 0x1f };
            Some(Extra::DoubleShift {
                left: m == M::Shld,
                dst,
                src: wide_gpr(i.op1_register())?.0,
                size,
                count,
            })
        }
        M::Imul if i.op_count() == 2 && i.op1_kind() == OpKind::Memory => Some(Extra::ImulM {
            dst: wide_gpr(i.op0_register())?.0,
            size: wide_memory(i)?,
            m: crate::cpu::fast::mem_operand(i)?,
        }),
        M::Div | M::Idiv if i.op0_kind() == OpKind::Memory => Some(Extra::Div {
            signed: m == M::Idiv,
            size: wide_memory(i)?,
            src: 0,
            m: Some(crate::cpu::fast::mem_operand(i)?),
        }),
        M::Push
            if i.op0_kind() == OpKind::Memory
                && i.stack_pointer_increment() == -8
                && i.memory_size().size() == 8 =>
        {
            Some(Extra::PushM {
                m: crate::cpu::fast::mem_operand(i)?,
            })
        }
        M::Test if i.op0_kind() == OpKind::Memory => {
            let size = Size::from_bytes(i.memory_size().size())?;
            let (src, imm) = match i.op1_kind() {
                OpKind::Register => (Some(crate::cpu::fast::gpr(i.op1_register())?.0), 0),
                OpKind::Immediate8 | OpKind::Immediate16 | OpKind::Immediate32 => {
                    (None, i.immediate(1) & size.mask())
                }
                OpKind::Immediate32to64 => (None, i.immediate(1)),
                _ => return None,
            };
            Some(Extra::TestM {
                size,
                m: crate::cpu::fast::mem_operand(i)?,
                src,
                imm,
            })
        }
        M::Xchg => match (i.op0_kind(), i.op1_kind()) {
            (OpKind::Register, OpKind::Register) => {
                let (a, size) = crate::cpu::fast::gpr(i.op0_register())?;
                let (b, _) = crate::cpu::fast::gpr(i.op1_register())?;
                Some(Extra::XchgRR { a, b, size })
            }
            (OpKind::Memory, OpKind::Register) | (OpKind::Register, OpKind::Memory) => {
                let r = if i.op0_kind() == OpKind::Register {
                    i.op0_register()
                } else {
                    i.op1_register()
                };
                let (reg, size) = crate::cpu::fast::gpr(r)?;
                let m = crate::cpu::fast::mem_operand(i)?;
                Some(Extra::XchgMR { reg, size, m })
            }
            _ => None,
        },
        // SETcc of a register: the one form with a condition and a
        // single register operand (Jcc's and LOOPcc's is a branch target,
        // CMOVcc has two).
        _ if i.condition_code() != iced_x86::ConditionCode::None
            && i.op_count() == 1
            && i.op0_kind() == OpKind::Register =>
        {
            match crate::cpu::fast::gpr(i.op0_register())? {
                (dst, Size::B1) => Some(Extra::Setcc {
                    code: i.code(),
                    dst,
                }),
                _ => None,
            }
        }
        M::Inc | M::Dec if i.op0_kind() == OpKind::Memory => Some(Extra::IncDecM {
            dec: m == M::Dec,
            size: wide_memory(i)?,
            m: crate::cpu::fast::mem_operand(i)?,
        }),
        M::Push
            if matches!(
                i.op0_kind(),
                OpKind::Immediate8to64 | OpKind::Immediate32to64
            ) && i.stack_pointer_increment() == -8 =>
        {
            Some(Extra::PushI {
                imm: Some(i.immediate(0)),
            })
        }
        M::Pushfq if i.stack_pointer_increment() == -8 => Some(Extra::PushI { imm: None }),
        M::Test | M::Add | M::Or | M::Adc | M::Sbb | M::And | M::Sub | M::Xor | M::Cmp
            if i.op0_kind() == OpKind::Register && i.op1_kind() == OpKind::Immediate8 =>
        {
            let idx = high_byte_index(i.op0_register())?;
            Some(Extra::HighByteI {
                op: crate::cpu::fast::alu_op(m),
                idx,
                imm: i.immediate(1) as u8,
            })
        }
        M::Movzx | M::Movsx
            if i.op0_kind() == OpKind::Register && i.op1_kind() == OpKind::Register =>
        {
            let idx = high_byte_index(i.op1_register())?;
            let (dst, size) = wide_gpr(i.op0_register())?;
            (size == Size::B4).then_some(Extra::ExtendHigh {
                signed: m == M::Movsx,
                dst,
                idx,
            })
        }
        M::Not | M::Neg if i.op0_kind() == OpKind::Register => {
            let (dst, size) = wide_gpr(i.op0_register())?;
            Some(Extra::Unary {
                neg: m == M::Neg,
                size,
                dst,
            })
        }
        M::Movaps | M::Movapd | M::Movdqa | M::Movups | M::Movupd | M::Movdqu => xmm_move(i),
        M::Cbw | M::Cwde | M::Cdqe | M::Cwd | M::Cdq | M::Cqo => Some(Extra::Convert {
            code: i.code(),
            to_rdx: matches!(m, M::Cwd | M::Cdq | M::Cqo),
        }),
        _ => None,
    }
}

impl Emitter {
    /// An [`Extra`] form; `slow` paths run instruction `k` through the
    /// interpreter and come back after it.
    ///
    /// `ip`: the instruction's address (the interpreter runs these forms
    /// generically: a fault of an inline access's fill must find RIP
    /// there, see `Slow::rip`).
    pub(super) fn extra(&mut self, k: usize, ip: u64, x: Extra) -> Result<(), NotTranslated> {
        match x {
            Extra::Div {
                signed,
                size,
                src,
                m,
            } => self.div(k, signed, size, src, m),
            Extra::PushM { m } => self.push_mem(k, ip, &m),
            Extra::TestM { size, m, src, imm } => self.test_mem(k, ip, size, &m, src, imm),
            Extra::Mul { signed, size, src } => self.mul1(signed, size, src),
            Extra::XchgRR { a, b, size } => {
                // No flags are touched.
                self.load(ACC, a, size)?;
                self.load(SEC, b, size)?;
                self.store_acc(b, size)?;
                self.store_from(SEC, a, size)
            }
            Extra::XchgMR { reg, size, m } => self.xchg_mem(k, ip, reg, size, &m),
            Extra::IncDecM { dec, size, m } => self.inc_dec_mem(k, ip, dec, size, &m),
            Extra::PushI { imm } => self.push_imm(k, ip, imm),
            Extra::ExtendHigh { signed, dst, idx } => {
                // No flags; the 32-bit result is zero-extended in rax, as
                // `store_acc` needs it.
                let byte = self.field(self.gpr_at(idx) + 1);
                let code = if signed {
                    Code::Movsx_r32_rm8
                } else {
                    Code::Movzx_r32_rm8
                };
                self.add(Instruction::with2(code, Register::EAX, byte))?;
                self.store_acc(dst, Size::B4)
            }
            Extra::HighByteI { op, idx, imm } => {
                let byte = self.field(self.gpr_at(idx) + 1);
                match op {
                    None => {
                        self.add(Instruction::with2(Code::Test_rm8_imm8, byte, imm as u32))?;
                        self.wrote_flags(true);
                    }
                    Some(op) => {
                        self.need_flags_for(op)?;
                        let (_, _, rm_imm) = alu_codes(op);
                        self.add(Instruction::with2(rm_imm[0], byte, imm as u32))?;
                        self.forget_reg(idx);
                        self.wrote_flags(matches!(op, BinOp::And | BinOp::Or | BinOp::Xor));
                    }
                }
                Ok(())
            }
            Extra::Setcc { code, dst } => {
                self.need_flags()?;
                // (The load into the pool register is a MOV: the host
                // flags survive it.)
                match self.hold_reg(dst)? {
                    Some(h) => {
                        self.add(Instruction::with1(code, h[0]))?;
                        self.store_held(dst, h)
                    }
                    None => {
                        let g = self.g(dst)?;
                        self.add(Instruction::with1(code, g))
                    }
                }
            }
            Extra::Unary { neg, size, dst } => {
                let code = match (neg, size) {
                    (false, Size::B4) => Code::Not_rm32,
                    (false, _) => Code::Not_rm64,
                    (true, Size::B4) => Code::Neg_rm32,
                    (true, _) => Code::Neg_rm64,
                };
                self.load(ACC, dst, size)?;
                self.add(Instruction::with1(code, ACC[si(size)]))?;
                self.store_acc(dst, size)?;
                if neg {
                    self.wrote_flags(false);
                }
                Ok(())
            }
            Extra::NoEffect => Ok(()),
            Extra::Bswap { dst, size } => {
                // No flags are touched.
                self.load(ACC, dst, size)?;
                let code = if size == Size::B8 {
                    Code::Bswap_r64
                } else {
                    Code::Bswap_r32
                };
                self.add(Instruction::with1(code, ACC[si(size)]))?;
                self.store_acc(dst, size)
            }
            Extra::MovFromSegment { dst, seg, size } => {
                // movzx does not touch the flags.
                let sel = MemoryOperand::with_base_displ(
                    Register::RBX,
                    self.o.selectors[seg as usize] as i64,
                );
                self.add(Instruction::with2(Code::Movzx_r32_rm16, Register::EAX, sel))?;
                self.store_acc(dst, if size == Size::B2 { size } else { Size::B8 })
            }
            Extra::SetccM { code, m } => self.setcc_mem(k, ip, code, &m),
            Extra::Cli => self.cli(k),
            Extra::Direction { set } => self.direction(set),
            Extra::MovFromCr2 { dst } => self.mov_from_cr2(k, dst),
            Extra::BitCount { op, dst, src, size } => self.bit_count(op, dst, src, size),
            Extra::Sti => self.sti(k),
            Extra::Ac { set } => self.stac_clac(k, set),
            Extra::DoubleShift {
                left,
                dst,
                src,
                size,
                count,
            } => self.double_shift(left, dst, src, size, count),
            Extra::ImulM { dst, size, m } => self.imul_mem(k, dst, size, &m),
            Extra::Rdtsc { aux } => self.rdtsc(k, aux),
            Extra::Leave => self.leave(k, ip),
            Extra::BitTestMR { op, size, m, src } => self.bit_test_reg(k, ip, op, size, &m, src),
            Extra::BitTestI {
                op,
                size,
                dst,
                m,
                bit,
            } => self.bit_test_imm(k, ip, op, size, dst, m, bit),
            Extra::CmpxchgM {
                reg,
                size,
                m,
                locked,
            } => self.cmpxchg_mem(k, ip, reg, size, &m, locked),
            Extra::XaddM {
                reg,
                size,
                m,
                locked,
            } => self.xadd_mem(k, ip, reg, size, &m, locked),
            Extra::XmmMove { dst, src, aligned } => self.xmm_move(k, ip, dst, src, aligned),
            Extra::RepString { movs, size } => self.rep_string(k, ip, movs, size),
            Extra::Popf { next_ip } => self.popf(k, ip, next_ip),
            Extra::Syscall { next_ip } => self.syscall(k, next_ip),
            Extra::Sysret => self.sysret(k),
            Extra::Convert { code, to_rdx } => {
                // No flags are touched: they may stay in the host.
                self.load(ACC, 0, Size::B8)?;
                if to_rdx {
                    self.load(DXR, 2, Size::B8)?;
                }
                self.add(Ok(Instruction::with(code)))?;
                // The whole register (CBW and CWD keep the bits above the
                // 16 they write, which were loaded).
                if to_rdx {
                    self.store_from(DXR, 2, Size::B8)
                } else {
                    self.store_acc(0, Size::B8)
                }
            }
        }
    }

    /// `gpr[idx] = reg` at `size` with the partial-register rule (a
    /// 32-bit value must already be zero-extended in the 64-bit register).
    /// With the cache on, a 32- or 64-bit value goes to the pool register
    /// of `idx`, dirty (`jit/regs.rs`).
    pub(super) fn store_from(
        &mut self,
        reg: [Register; 4],
        idx: u8,
        size: Size,
    ) -> Result<(), NotTranslated> {
        if let Some(h) = self.wide_claim(idx, size)? {
            self.add(Instruction::with2(Code::Mov_r64_rm64, h[3], reg[3]))?;
            return self.store_held(idx, h);
        }
        let g = self.g(idx)?;
        match size {
            Size::B4 | Size::B8 => self.add(Instruction::with2(Code::Mov_rm64_r64, g, reg[3])),
            s => self.add(Instruction::with2(MOV_RM_R[si(s)], g, reg[si(s)])),
        }
    }

    /// XCHG of `gpr[reg]` with memory. The interpreter's aligned path is an
    /// atomic compare-exchange that charges the `locked` cost after its
    /// one translation (for writing); inline, an aligned access the
    /// first-level TLB serves for writing is the host's (atomic) XCHG with
    /// that cost, and a first-level miss is filled as that translation
    /// (its fault the instruction's). A misaligned access (no locked cost,
    /// not atomic in the interpreter) and every other case (a frame
    /// outside memory or holding code, a page-crossing or non-canonical
    /// address) is the instruction through the interpreter. Flags are not
    /// touched.
    fn xchg_mem(
        &mut self,
        k: usize,
        ip: u64,
        reg: u8,
        size: Size,
        m: &MemOp,
    ) -> Result<(), NotTranslated> {
        let (full, mut cont, miss, retry) = self.begin_filled()?;
        let n = size.bytes();
        self.lea(m)?;
        if n > 1 {
            self.a.test(eax, n as i32 - 1)?;
            self.a.jne(full)?;
        }
        self.fast_access(true, size, miss)?;
        self.add_cycles(self.o.locked_cost)?;
        self.load(SEC, reg, size)?;
        self.add(Instruction::with2(
            XCHG_RM_R[si(size)],
            MemoryOperand::with_base(Register::RDX),
            SEC[si(size)],
        ))?;
        self.store_from(SEC, reg, size)?;
        self.a.set_label(&mut cont)?;
        self.filled_slow(k, Some(ip), miss, full, retry, cont, FlagsAt::State);
        Ok(())
    }

    /// PUSH of a 64-bit memory operand: the operand read (its address
    /// computed with RSP before the push) and the push, both through the
    /// inline access with a fill, in the interpreter's order (a miss of
    /// the push probes again only the push: its fill may have emptied the
    /// first level, and the operand, kept in r15, was read already);
    /// anything else is the instruction through the interpreter, which
    /// starts over (nothing was changed).
    fn push_mem(&mut self, k: usize, ip: u64, m: &MemOp) -> Result<(), NotTranslated> {
        let (full, mut cont) = self.begin_inline()?;
        // r15 is free: the flags are written back (nothing saved there),
        // and neither the fill nor the call-out clobbers it.
        debug_assert!(!self.saved);
        let miss = self.a.create_label();
        let retry = self.retry_point()?;
        self.lea(m)?;
        self.fast_access(false, Size::B8, miss)?;
        let read = self.access;
        self.a.mov(r15, qword_ptr(rdx))?;
        let push_miss = self.a.create_label();
        let push_full = self.a.create_label();
        let push_retry = self.retry_point()?;
        self.load(ACC, 4, Size::B8)?;
        self.a.lea(rax, qword_ptr(rax - 8))?;
        self.fast_access(true, Size::B8, push_miss)?;
        self.a.mov(qword_ptr(rdx), r15)?;
        self.store_acc(4, Size::B8)?;
        self.a.set_label(&mut cont)?;
        let push = self.access;
        self.access = read;
        self.filled_slow(k, Some(ip), miss, full, retry, cont, FlagsAt::State);
        self.access = push;
        let exit = FlagsAt::State;
        self.filled_slow(k, Some(ip), push_miss, push_full, push_retry, cont, exit);
        Ok(())
    }

    /// TEST of memory (inline read) with an immediate or a register: the
    /// host's TEST on the host pointer sets the flags as the interpreter's
    /// `alu::test` does (AF written back clear), left in the host flags;
    /// the slow path leaves them there too.
    fn test_mem(
        &mut self,
        k: usize,
        ip: u64,
        size: Size,
        m: &MemOp,
        src: Option<u8>,
        imm: u64,
    ) -> Result<(), NotTranslated> {
        let (full, mut cont) = self.begin_inline()?;
        let miss = self.a.create_label();
        let retry = self.retry_point()?;
        let at_rdx = MemoryOperand::with_base(Register::RDX);
        self.lea(m)?;
        self.fast_access(false, size, miss)?;
        match src {
            Some(r) => {
                self.load(SEC, r, size)?;
                self.add(Instruction::with2(
                    TEST_RM_R[si(size)],
                    at_rdx,
                    SEC[si(size)],
                ))?;
            }
            None if size == Size::B8 => {
                self.add(Instruction::with2(
                    Code::Test_rm64_imm32,
                    at_rdx,
                    imm as i32,
                ))?;
            }
            None => {
                let code = [
                    Code::Test_rm8_imm8,
                    Code::Test_rm16_imm16,
                    Code::Test_rm32_imm32,
                ][si(size)];
                self.add(Instruction::with2(code, at_rdx, imm as u32))?;
            }
        }
        self.a.set_label(&mut cont)?;
        self.filled_slow(k, Some(ip), miss, full, retry, cont, FlagsAt::Host);
        self.wrote_flags(true);
        Ok(())
    }

    /// INC/DEC of memory: the access for writing through the first-level
    /// TLB (a miss filled as the interpreter's translation, anything else
    /// the instruction through the interpreter), then the host's INC/DEC
    /// on it with the guest flags in the host's (CF kept).
    fn inc_dec_mem(
        &mut self,
        k: usize,
        ip: u64,
        dec: bool,
        size: Size,
        m: &MemOp,
    ) -> Result<(), NotTranslated> {
        let (full, mut cont, miss, retry) = self.begin_filled()?;
        self.lea(m)?;
        self.fast_access(true, size, miss)?;
        // (Loads the flags through rax and rcx: rdx, the host address,
        // stays.)
        self.need_flags()?;
        let code = match (dec, size) {
            (false, Size::B4) => Code::Inc_rm32,
            (false, _) => Code::Inc_rm64,
            (true, Size::B4) => Code::Dec_rm32,
            (true, _) => Code::Dec_rm64,
        };
        self.add(Instruction::with1(
            code,
            MemoryOperand::with_base(Register::RDX),
        ))?;
        self.a.set_label(&mut cont)?;
        self.filled_slow(k, Some(ip), miss, full, retry, cont, FlagsAt::Host);
        self.wrote_flags(false);
        Ok(())
    }

    /// PUSH of an immediate or PUSHFQ (`imm` None; the flags written back
    /// first): the push through the first-level TLB as PUSH of a
    /// register's (anything else the instruction through the
    /// interpreter). Flags are not touched.
    fn push_imm(&mut self, k: usize, ip: u64, imm: Option<u64>) -> Result<(), NotTranslated> {
        let (full, mut cont, miss, retry) = self.begin_filled()?;
        self.push_value(imm, miss)?;
        self.a.set_label(&mut cont)?;
        self.filled_slow(k, Some(ip), miss, full, retry, cont, FlagsAt::State);
        Ok(())
    }

    /// SETcc of a byte of memory: the guest flags written back and loaded
    /// into the host's, the condition into r15b (callee-saved: it
    /// survives a fill, after which the retry computes it again), then
    /// the store through the first-level TLB for writing (a miss filled
    /// as the interpreter's translation, anything else the instruction
    /// through the interpreter). The flags stay exact in the state.
    fn setcc_mem(&mut self, k: usize, ip: u64, code: Code, m: &MemOp) -> Result<(), NotTranslated> {
        let (full, mut cont, miss, retry) = self.begin_filled()?;
        self.need_flags()?;
        self.add(Instruction::with1(code, Register::R15L))?;
        // The probe clobbers the host flags; the state has them.
        self.host_valid = false;
        self.lea(m)?;
        self.fast_access(true, Size::B1, miss)?;
        self.a.mov(byte_ptr(rdx), iced_x86::code_asm::r15b)?;
        self.a.set_label(&mut cont)?;
        self.filled_slow(k, Some(ip), miss, full, retry, cont, FlagsAt::State);
        Ok(())
    }

    /// A whole XMM register moved as the interpreter's `exec_simd` moves
    /// it, which checks, in this order: CR0.EM set or CR4.OSFXSR clear
    /// (#UD), CR0.TS set (#NM), a misaligned operand of an aligned form
    /// (#GP(0)), then the access: the first byte's translation (its
    /// fault), a page-crossing access's second page, a frame outside
    /// memory or holding code for a store; the 16 bytes as two 8-byte
    /// accesses, which hit the first-level TLB after the first byte's.
    /// Inline when none of that stops it (a first-level miss filled as
    /// that translation); anything else is the instruction through the
    /// interpreter. No flag is touched.
    fn xmm_move(
        &mut self,
        k: usize,
        ip: u64,
        dst: XmmPlace,
        src: XmmPlace,
        aligned: bool,
    ) -> Result<(), NotTranslated> {
        let o = self.o;
        let xmm = |x: u8| o.xmm + 16 * x as i32;
        if let (XmmPlace::Reg(d), XmmPlace::Reg(s)) = (dst, src) {
            let (full, mut cont) = self.begin_inline()?;
            self.unless_sse_usable(full)?;
            for half in [0, 8] {
                self.a.mov(rcx, qword_ptr(rbx + xmm(s) + half))?;
                self.a.mov(qword_ptr(rbx + xmm(d) + half), rcx)?;
            }
            return self.end_inline(k, full, &mut cont, false);
        }
        let (full, mut cont, miss, retry) = self.begin_filled()?;
        self.unless_sse_usable(full)?;
        match (dst, src) {
            (XmmPlace::Reg(d), XmmPlace::Mem(m)) | (XmmPlace::Mem(m), XmmPlace::Reg(d)) => {
                let store = matches!(dst, XmmPlace::Mem(_));
                self.lea(&m)?;
                if aligned {
                    self.a.test(eax, 15)?;
                    self.a.jne(full)?;
                }
                self.fast_access_bytes(store, 16, miss)?;
                for half in [0, 8] {
                    if store {
                        self.a.mov(rcx, qword_ptr(rbx + xmm(d) + half))?;
                        self.a.mov(qword_ptr(rdx + half), rcx)?;
                    } else {
                        self.a.mov(rcx, qword_ptr(rdx + half))?;
                        self.a.mov(qword_ptr(rbx + xmm(d) + half), rcx)?;
                    }
                }
            }
            _ => return Err(NotTranslated::Unsupported("an XMM move without a register")),
        }
        self.a.set_label(&mut cont)?;
        self.filled_slow(k, Some(ip), miss, full, retry, cont, FlagsAt::State);
        Ok(())
    }

    /// To `full` (the instruction through the interpreter, which raises
    /// #UD or #NM) unless SSE instructions may run: CR0.EM and CR0.TS
    /// clear, CR4.OSFXSR set. Clobbers the host flags.
    fn unless_sse_usable(&mut self, full: CodeLabel) -> Result<(), NotTranslated> {
        use crate::cpu::state::{cr0, cr4};
        let o = self.o;
        self.a
            .test(dword_ptr(rbx + o.cr0), (cr0::EM | cr0::TS) as i32)?;
        self.a.jne(full)?;
        self.a.test(dword_ptr(rbx + o.cr4), cr4::OSFXSR as i32)?;
        Ok(self.a.je(full)?)
    }

    /// RDTSC, or RDTSCP (`aux`), as `Cpu::exec_rdtsc`: CR4.TSD set (a
    /// #GP outside ring 0), RDTSC exiting on or events pending (the
    /// interpreter leaves the block after it) goes to the interpreter;
    /// else the TSC, `cycles` plus the TSC offset (none outside guest
    /// mode), goes to EDX:EAX, and for RDTSCP IA32_TSC_AUX to ECX (each
    /// a 32-bit write, zero-extended). No flag changes.
    fn rdtsc(&mut self, k: usize, aux: bool) -> Result<(), NotTranslated> {
        use crate::vmx::VmxControls;
        let (full, mut cont) = self.begin_inline()?;
        self.a.test(
            dword_ptr(rbx + self.o.cr4),
            crate::cpu::state::cr4::TSD as i32,
        )?;
        self.a.jne(full)?;
        self.a.cmp(byte_ptr(rbx + self.o.check_events), 0)?;
        self.a.jne(full)?;
        let mut outside_guest_mode = self.a.create_label();
        self.a.xor(eax, eax)?;
        self.a.mov(rcx, qword_ptr(rbx + self.o.vmx))?;
        self.a.test(rcx, rcx)?;
        self.a.je(outside_guest_mode)?;
        let exiting = std::mem::offset_of!(VmxControls, rdtsc_exiting) as i32;
        self.a.cmp(byte_ptr(rcx + exiting), 0)?;
        self.a.jne(full)?;
        let offset = std::mem::offset_of!(VmxControls, tsc_offset) as i32;
        self.a.mov(rax, qword_ptr(rcx + offset))?;
        self.a.set_label(&mut outside_guest_mode)?;
        self.a.add(rax, qword_ptr(rbx + self.o.cycles))?;
        self.a.mov(rcx, rax)?;
        self.a.shr(rcx, 32)?;
        self.a.mov(eax, eax)?;
        self.store_from(ACC, 0, Size::B4)?;
        self.store_from(SEC, 2, Size::B4)?;
        if aux {
            self.a.mov(eax, dword_ptr(rbx + self.o.tsc_aux))?;
            self.store_from(ACC, 1, Size::B4)?;
        }
        self.end_inline(k, full, &mut cont, false)
    }

    /// CLI at CPL 0 clears IF in the state, as the interpreter does where
    /// CPL <= IOPL always holds; at another CPL, or with events to check,
    /// the interpreter runs it (as SWAPGS). The guest flags are written
    /// back first (the checks and the AND clobber the host's).
    fn cli(&mut self, k: usize) -> Result<(), NotTranslated> {
        let (full, mut cont) = self.begin_inline()?;
        self.unless_cpl0_without_events(full)?;
        let not_if = !(crate::cpu::state::rflags::IF as u32) as i32;
        self.a.and(dword_ptr(rbx + self.o.rflags), not_if)?;
        self.end_inline(k, full, &mut cont, false)
    }

    /// STI at CPL 0, as `Cpu::exec_system` runs it there: the STI
    /// interrupt shadow if IF was clear, IF set, and an event check asked
    /// for (`check_events`); then, as `Cpu::jit_call_out` after such a
    /// call-out, the deadline at 0 so that the block's exit returns to
    /// the run loop, which makes that check (and runs the shadowed
    /// instruction alone) exactly as after the interpreter's STI. (The
    /// interpreter also moves the mode epoch, as for every system
    /// instruction; IF is not in the first-level TLB's key context, so
    /// its resync would change nothing: CLI's native form does not move
    /// it either.) Elsewhere (CPL above 0: the IOPL check; events to
    /// check) the interpreter runs it.
    fn sti(&mut self, k: usize) -> Result<(), NotTranslated> {
        use crate::cpu::state::{interruptibility, rflags};
        let (full, mut cont) = self.begin_inline()?;
        self.unless_cpl0_without_events(full)?;
        let mut was_set = self.a.create_label();
        self.a
            .test(dword_ptr(rbx + self.o.rflags), rflags::IF as i32)?;
        self.a.jne(was_set)?;
        self.a.or(
            byte_ptr(rbx + self.o.interruptibility),
            interruptibility::STI as i32,
        )?;
        self.a
            .or(dword_ptr(rbx + self.o.rflags), rflags::IF as i32)?;
        self.a.set_label(&mut was_set)?;
        self.a.mov(byte_ptr(rbx + self.o.check_events), 1)?;
        self.a.mov(qword_ptr(rbx + self.o.jit_deadline), 0)?;
        self.end_inline(k, full, &mut cont, false)
    }

    /// STAC (`set`) or CLAC at CPL 0: RFLAGS.AC set or cleared, and what
    /// the interpreter's path does to the first-level TLB through the mode
    /// epoch it moves (`Cpu::exec_system`, then the call-out's
    /// `Cpu::sync_l1`): nothing unless the key context's AC
    /// (`KeyContext::rflags_ac`: AC under CR4.SMAP, which `Book::smap_ac`
    /// holds for the context the slots were synced to) changes; if it does,
    /// as `L1Tlb::smap_ac_changed`: the supervisor data classes' lookup
    /// keys dropped and, AC clearing, their slots noted as holding
    /// user-mode pages emptied (and no longer noted), then `smap_ac` set to
    /// the new AC. (The mode epoch is not moved: the slots are then what
    /// the resync would have made them, `L1Tlb::keys_for`.) With events to
    /// check (the interpreter leaves the block after a system
    /// instruction) the interpreter runs it.
    fn stac_clac(&mut self, k: usize, set: bool) -> Result<(), NotTranslated> {
        use crate::cpu::l1tlb::{book, Slot, SLOT_PAGE, SUPERVISOR_DATA_CLASSES};
        use crate::cpu::state::{cr4, rflags};
        let (full, mut cont) = self.begin_inline()?;
        self.unless_cpl0_without_events(full)?;
        let mut done = self.a.create_label();
        if set {
            self.a
                .or(dword_ptr(rbx + self.o.rflags), rflags::AC as i32)?;
            // The context's AC becomes set only under SMAP, and only if
            // it was clear.
            self.a.test(dword_ptr(rbx + self.o.cr4), cr4::SMAP as i32)?;
            self.a.je(done)?;
            self.a.mov(rcx, qword_ptr(r14 + ENV_L1_BOOK))?;
            self.a.cmp(qword_ptr(rcx + book::SMAP_AC), 0)?;
            self.a.jne(done)?;
        } else {
            self.a
                .and(dword_ptr(rbx + self.o.rflags), !(rflags::AC as u32) as i32)?;
            // The context's AC was set (under SMAP) or stays clear.
            self.a.mov(rcx, qword_ptr(r14 + ENV_L1_BOOK))?;
            self.a.cmp(qword_ptr(rcx + book::SMAP_AC), 0)?;
            self.a.je(done)?;
        }
        self.a.mov(qword_ptr(rcx + book::SMAP_AC), set as i32)?;
        for class in SUPERVISOR_DATA_CLASSES {
            let key = book::KEYS + class as i32 * book::KEY_SLOT_BYTES + book::KEY_SLOT_VALID;
            self.a.mov(qword_ptr(rcx + key), 0)?;
            if set {
                continue;
            }
            // Each slot noted: rdx the bits left, rax the slot's index.
            let user_pages = book::USER_PAGES + 8 * class as i32;
            let (mut again, mut none) = (self.a.create_label(), self.a.create_label());
            self.a.mov(rdx, qword_ptr(rcx + user_pages))?;
            self.a.mov(qword_ptr(rcx + user_pages), 0)?;
            self.a.test(rdx, rdx)?;
            self.a.je(none)?;
            self.a.set_label(&mut again)?;
            self.a.bsf(rax, rdx)?;
            self.a.shl(eax, SLOT_BYTES.trailing_zeros())?;
            let base = (class * SLOTS * SLOT_BYTES) as i32;
            self.a.mov(
                qword_ptr(rbp + rax + base + SLOT_PAGE as i32),
                Slot::EMPTY.page as i32,
            )?;
            self.a.mov(
                qword_ptr(rbp + rax + base + SLOT_JIT_PAGE as i32),
                Slot::EMPTY.jit_page as i64 as i32,
            )?;
            // The lowest bit off.
            self.a.lea(rax, qword_ptr(rdx - 1))?;
            self.a.and(rdx, rax)?;
            self.a.jne(again)?;
            self.a.set_label(&mut none)?;
            // (Each label on an instruction of its own.)
            self.a.zero_bytes()?;
        }
        self.a.set_label(&mut done)?;
        self.a.zero_bytes()?;
        self.end_inline(k, full, &mut cont, false)
    }

    /// The start of a CMPXCHG or XADD of memory: the flags written back,
    /// the address of `m`, a locked misaligned operand to `full` (the
    /// interpreter), then the access for writing (rdx its host address).
    /// Returns (`full`, `cont`, `miss`, `retry`) as `begin_filled`.
    fn begin_read_modify_write(
        &mut self,
        size: Size,
        m: &MemOp,
        locked: bool,
    ) -> Result<(CodeLabel, CodeLabel, CodeLabel, CodeLabel), NotTranslated> {
        let (full, cont, miss, retry) = self.begin_filled()?;
        self.lea(m)?;
        if locked && size != Size::B1 {
            self.a.test(eax, size.bytes() as i32 - 1)?;
            self.a.jne(full)?;
        }
        self.fast_access(true, size, miss)?;
        Ok((full, cont, miss, retry))
    }

    /// The host's `code [rdx], ecx/rcx` (`size`), with LOCK if `locked`.
    fn read_modify_write_with_rcx(
        &mut self,
        code: Code,
        size: Size,
        locked: bool,
    ) -> Result<(), NotTranslated> {
        let at_rdx = MemoryOperand::with_base(Register::RDX);
        let mut insn = Instruction::with2(code, at_rdx, SEC[si(size)])?;
        insn.set_has_lock_prefix(locked);
        self.add(Ok(insn))
    }

    /// BT/BTS/BTR/BTC with an immediate bit index, of a register or (not
    /// locked) of memory through the access for writing (reading for
    /// BT). The host's instruction sets CF as the interpreter does but
    /// leaves OF SF AF PF undefined, which the interpreter keeps: so the
    /// guest flags are written back first and only CF (from SETC) is
    /// merged into `state.rflags`, where the flags stay.
    #[allow(clippy::too_many_arguments)]
    fn bit_test_imm(
        &mut self,
        k: usize,
        ip: u64,
        op: BitOp,
        size: Size,
        dst: u8,
        m: Option<MemOp>,
        bit: u8,
    ) -> Result<(), NotTranslated> {
        let wide = (size == Size::B8) as usize;
        let code = match op {
            BitOp::Bt => [Code::Bt_rm32_imm8, Code::Bt_rm64_imm8],
            BitOp::Bts => [Code::Bts_rm32_imm8, Code::Bts_rm64_imm8],
            BitOp::Btr => [Code::Btr_rm32_imm8, Code::Btr_rm64_imm8],
            BitOp::Btc => [Code::Btc_rm32_imm8, Code::Btc_rm64_imm8],
        }[wide];
        let bit = u32::from(bit);
        let Some(m) = m else {
            self.capture_if_dirty()?;
            self.host_valid = false;
            self.load(ACC, dst, size)?;
            self.add(Instruction::with2(code, ACC[si(size)], bit))?;
            self.merge_carry()?;
            return if op == BitOp::Bt {
                Ok(())
            } else {
                self.store_acc(dst, size)
            };
        };
        let labels = self.begin_filled()?;
        self.lea(&m)?;
        let insn = Instruction::with2(code, MemoryOperand::with_base(Register::RDX), bit);
        self.bit_test_at(k, ip, op != BitOp::Bt, size, insn, labels)
    }

    /// The host's CF (a bit test's) into `state.rflags`, every other bit
    /// kept (clobbers rcx and the host flags).
    fn merge_carry(&mut self) -> Result<(), NotTranslated> {
        self.a.setc(iced_x86::code_asm::cl)?;
        self.a.movzx(ecx, iced_x86::code_asm::cl)?;
        let fl = self.field(self.o.rflags);
        self.add(Instruction::with2(Code::And_rm32_imm32, fl, !1u32))?;
        self.add(Instruction::with2(Code::Or_rm32_r32, fl, Register::ECX))
    }

    /// BT/BTS/BTR/BTC of memory with a register bit offset, as the
    /// interpreter's `exec_bit`: the operand at the effective address
    /// plus the offset (sign-extended from the operand size) shifted
    /// right by log2 of the operand's bits, times its bytes; the bit the
    /// offset modulo the operand's bits (kept in r15, which a fill
    /// leaves; the retry computes everything again). Through the access
    /// for writing (reading for BT); only CF merged, as for the
    /// immediate forms.
    fn bit_test_reg(
        &mut self,
        k: usize,
        ip: u64,
        op: BitOp,
        size: Size,
        m: &MemOp,
        src: u8,
    ) -> Result<(), NotTranslated> {
        let wide = (size == Size::B8) as usize;
        let code = match op {
            BitOp::Bt => [Code::Bt_rm32_r32, Code::Bt_rm64_r64],
            BitOp::Bts => [Code::Bts_rm32_r32, Code::Bts_rm64_r64],
            BitOp::Btr => [Code::Btr_rm32_r32, Code::Btr_rm64_r64],
            BitOp::Btc => [Code::Btc_rm32_r32, Code::Btc_rm64_r64],
        }[wide];
        let labels = self.begin_filled()?;
        self.lea(m)?;
        if size == Size::B8 {
            self.load(SEC, src, Size::B8)?;
        } else {
            self.a
                .movsxd(rcx, qword_ptr(rbx + self.o.gpr + 8 * i32::from(src & 15)))?;
        }
        self.a.mov(r15, rcx)?;
        self.a.and(r15d, size.bits() as i32 - 1)?;
        let shift = size.bits().trailing_zeros();
        self.a.sar(rcx, shift)?;
        self.a
            .lea(rax, qword_ptr(rax + rcx * size.bytes() as u32))?;
        let bit = [Register::R15D, Register::R15][wide];
        let insn = Instruction::with2(code, MemoryOperand::with_base(Register::RDX), bit);
        self.bit_test_at(k, ip, op != BitOp::Bt, size, insn, labels)
    }

    /// The end of a bit test of memory at the address in rax: the access
    /// (for writing unless BT) of `size`, `insn` (the host's bit test on
    /// [rdx]), CF merged into the state; the slow path the instruction
    /// through the interpreter (`labels`: `begin_filled`'s).
    fn bit_test_at(
        &mut self,
        k: usize,
        ip: u64,
        write: bool,
        size: Size,
        insn: Result<Instruction, IcedError>,
        labels: (CodeLabel, CodeLabel, CodeLabel, CodeLabel),
    ) -> Result<(), NotTranslated> {
        let (full, mut cont, miss, retry) = labels;
        self.fast_access(write, size, miss)?;
        self.add(insn)?;
        self.merge_carry()?;
        self.a.set_label(&mut cont)?;
        self.filled_slow(k, Some(ip), miss, full, retry, cont, FlagsAt::State);
        Ok(())
    }

    /// LEAVE: the quadword at RBP read through the first-level TLB
    /// (nothing changed before it: a miss is filled as the
    /// interpreter's stack read, anything else the instruction through
    /// the interpreter), then RSP = RBP + 8 and RBP = that quadword.
    /// Flags are not touched.
    fn leave(&mut self, k: usize, ip: u64) -> Result<(), NotTranslated> {
        let (full, mut cont, miss, retry) = self.begin_filled()?;
        self.load(ACC, 5, Size::B8)?;
        self.fast_access(false, Size::B8, miss)?;
        self.a.mov(rcx, qword_ptr(rdx))?;
        self.a.lea(rax, qword_ptr(rax + 8))?;
        self.store_acc(4, Size::B8)?;
        self.store_from(SEC, 5, Size::B8)?;
        self.a.set_label(&mut cont)?;
        self.filled_slow(k, Some(ip), miss, full, retry, cont, FlagsAt::State);
        Ok(())
    }

    /// Charges the cycles register forms left pending
    /// ([`Emitter::pending_cycles`]), without touching the host flags
    /// where they hold the guest's.
    pub(super) fn charge_pending(&mut self) -> Result<(), NotTranslated> {
        let cost = std::mem::take(&mut self.pending_cycles);
        if cost == 0 {
            Ok(())
        } else if self.host_valid {
            self.add_cycles_keeping_flags(cost)
        } else {
            self.add_cycles(cost)
        }
    }

    /// `cycles += cost` without touching the host flags.
    fn add_cycles_keeping_flags(&mut self, cost: u64) -> Result<(), NotTranslated> {
        let cost = i32::try_from(cost)
            .map_err(|_| NotTranslated::Unsupported("a locked cost above 2^31 cycles"))?;
        self.a.mov(rcx, qword_ptr(rbx + self.o.cycles))?;
        self.a.lea(rcx, qword_ptr(rcx + cost))?;
        self.a.mov(qword_ptr(rbx + self.o.cycles), rcx)?;
        Ok(())
    }

    /// CMPXCHG of memory with `gpr[reg]` and rax/eax: the host's CMPXCHG
    /// on the host address of an access for writing, which compares,
    /// stores (the new value, or the old one back on a mismatch, as the
    /// interpreter's unlocked path and the locked write cycle do) and
    /// sets the six flags as CMP, as `alu::binop(Cmp)` does. On a
    /// mismatch rax/eax gets the old value (32 bits zero-extend, as the
    /// host's). LOCK: the host's locked instruction, with the `locked`
    /// cost only when it stored (the interpreter's `atomic_update`), and
    /// a misaligned operand through the interpreter (its path is not
    /// atomic and costs no lock).
    fn cmpxchg_mem(
        &mut self,
        k: usize,
        ip: u64,
        reg: u8,
        size: Size,
        m: &MemOp,
        locked: bool,
    ) -> Result<(), NotTranslated> {
        let (full, mut cont, miss, retry) = self.begin_read_modify_write(size, m, locked)?;
        self.load(SEC, reg, size)?;
        self.load(ACC, 0, Size::B8)?;
        let code = [
            Code::Cmpxchg_rm8_r8,
            Code::Cmpxchg_rm16_r16,
            Code::Cmpxchg_rm32_r32,
            Code::Cmpxchg_rm64_r64,
        ][si(size)];
        self.read_modify_write_with_rcx(code, size, locked)?;
        let mut mismatch = self.a.create_label();
        self.a.jne(mismatch)?;
        if locked {
            self.add_cycles_keeping_flags(self.o.locked_cost)?;
        }
        self.a.jmp(cont)?;
        self.a.set_label(&mut mismatch)?;
        self.store_from(ACC, 0, Size::B8)?;
        self.a.set_label(&mut cont)?;
        self.filled_slow(k, Some(ip), miss, full, retry, cont, FlagsAt::Host);
        self.wrote_flags(false);
        Ok(())
    }

    /// XADD of `gpr[reg]` to memory: the host's XADD on the host address
    /// of an access for writing (flags as ADD, `gpr[reg]` the old
    /// value). LOCK: the host's locked XADD with the `locked` cost
    /// (`atomic_update` always stores), a misaligned operand through the
    /// interpreter.
    fn xadd_mem(
        &mut self,
        k: usize,
        ip: u64,
        reg: u8,
        size: Size,
        m: &MemOp,
        locked: bool,
    ) -> Result<(), NotTranslated> {
        let (full, mut cont, miss, retry) = self.begin_read_modify_write(size, m, locked)?;
        if locked {
            self.add_cycles(self.o.locked_cost)?;
        }
        self.load(SEC, reg, size)?;
        let code = [Code::Xadd_rm32_r32, Code::Xadd_rm64_r64][(size == Size::B8) as usize];
        self.read_modify_write_with_rcx(code, size, locked)?;
        self.store_from(SEC, reg, size)?;
        self.a.set_label(&mut cont)?;
        self.filled_slow(k, Some(ip), miss, full, retry, cont, FlagsAt::Host);
        self.wrote_flags(false);
        Ok(())
    }

    /// `cycles += cost` (the interpreter's extra cost of an instruction,
    /// charged whether or not it faults; the fast paths here cannot).
    pub(super) fn add_cycles(&mut self, cost: u64) -> Result<(), NotTranslated> {
        if cost <= i32::MAX as u64 {
            self.a.add(qword_ptr(rbx + self.o.cycles), cost as i32)?;
        } else {
            self.a.mov(rcx, cost)?;
            self.a.add(qword_ptr(rbx + self.o.cycles), rcx)?;
        }
        Ok(())
    }

    /// DIV/IDIV by a register. The host divides only when it cannot
    /// fault: DIV with rdx below the divisor (unsigned; this rules out 0),
    /// IDIV with rdx the sign of rax (a dividend that fits one register)
    /// and a divisor neither 0 nor -1. Everything else (#DE, a real
    /// 128-bit signed dividend, a divisor of -1) is the instruction
    /// through the interpreter. The flags are left as they were (the
    /// interpreter's choice for these undefined flags); the divide cost is
    /// charged as the interpreter charges it.
    fn div(
        &mut self,
        k: usize,
        signed: bool,
        size: Size,
        src: u8,
        m: Option<MemOp>,
    ) -> Result<(), NotTranslated> {
        let (slow, mut cont) = self.begin_inline()?;
        let s = si(size);
        // A memory operand's read has no fill: the interpreter charges the
        // divide cost before it, so a fill's fault would have to as well;
        // a first-level miss runs the instruction through the interpreter.
        match m {
            Some(m) => {
                self.lea(&m)?;
                let at = self.fast_access_at(false, size, slow)?;
                self.load_host(SEC, size, at)?;
            }
            None => self.load(SEC, src, size)?,
        }
        self.load(ACC, 0, size)?;
        self.load(DXR, 2, size)?;
        // The loads zero-extend 32-bit values into the 64-bit registers.
        let wide = size == Size::B8;
        if signed {
            // rdx must be the sign extension of rax, and the divisor + 1
            // above 1 (unsigned: neither 0 nor -1).
            if wide {
                self.a.mov(r8, rax)?;
                self.a.sar(r8, 63)?;
                self.a.cmp(r8, rdx)?;
                self.a.jne(slow)?;
                self.a.lea(r8, qword_ptr(rcx + 1))?;
                self.a.cmp(r8, 1)?;
            } else {
                self.a.mov(r8d, eax)?;
                self.a.sar(r8d, 31)?;
                self.a.cmp(r8d, edx)?;
                self.a.jne(slow)?;
                self.a.lea(r8d, qword_ptr(rcx + 1))?;
                self.a.cmp(r8d, 1)?;
            }
            self.a.jbe(slow)?;
        } else {
            // The quotient fits (and the divisor is not 0) when rdx is
            // below the divisor.
            self.a.cmp(rdx, rcx)?;
            self.a.jae(slow)?;
        }
        self.add_cycles(self.o.divide_cost)?;
        let code = match (signed, size) {
            (false, Size::B4) => Code::Div_rm32,
            (false, Size::B8) => Code::Div_rm64,
            (true, Size::B4) => Code::Idiv_rm32,
            (true, Size::B8) => Code::Idiv_rm64,
            _ => return Err(NotTranslated::Unsupported("8/16-bit divide")),
        };
        self.add(Instruction::with1(code, SEC[s]))?;
        // 32-bit results are zero-extended in rax and rdx.
        let g0 = self.g(0)?;
        let g2 = self.g(2)?;
        self.add(Instruction::with2(Code::Mov_rm64_r64, g0, Register::RAX))?;
        self.add(Instruction::with2(Code::Mov_rm64_r64, g2, Register::RDX))?;
        self.end_inline(k, slow, &mut cont, false)
    }

    /// SWAPGS (in code translated for CPL 0-2): the GS base and
    /// IA32_KERNEL_GS_BASE exchanged in the `Cpu`, as `Cpu::exec_swapgs`
    /// does. It touches nothing else the guest sees: no flag, register or
    /// cycle beyond the block's instruction cost, and not the first-level
    /// TLB (the GS base is not in its lookup-key context). Through the
    /// interpreter when that would do more: at CPL 1 or 2 (#GP), or with
    /// `check_events` set, where the interpreter leaves the block after a
    /// system instruction.
    pub(super) fn swapgs(&mut self, k: usize) -> Result<(), NotTranslated> {
        let o = self.o;
        let (slow, mut cont) = self.begin_inline()?;
        self.unless_cpl0_without_events(slow)?;
        self.a.mov(rax, qword_ptr(rbx + o.gs_base))?;
        self.a.mov(rcx, qword_ptr(rbx + o.kernel_gs_base))?;
        self.a.mov(qword_ptr(rbx + o.gs_base), rcx)?;
        self.a.mov(qword_ptr(rbx + o.kernel_gs_base), rax)?;
        self.end_inline(k, slow, &mut cont, false)
    }

    /// To `slow` (the instruction through the interpreter) unless the
    /// CPL is 0 and `check_events` is clear: the case where a system
    /// instruction the interpreter allows at CPL 0 only changes its
    /// state (at another CPL it checks privilege; with events to check
    /// it leaves the block after the instruction). Clobbers the host
    /// flags.
    pub(super) fn unless_cpl0_without_events(
        &mut self,
        slow: CodeLabel,
    ) -> Result<(), NotTranslated> {
        // 64-bit code runs in protected mode: the CPL is CS.RPL.
        self.a.test(word_ptr(rbx + self.o.cs_selector), 3)?;
        self.a.jne(slow)?;
        self.a.cmp(byte_ptr(rbx + self.o.check_events), 0)?;
        Ok(self.a.jne(slow)?)
    }

    /// SHLD (`left`) or SHRD of `dst` with `src` by a masked count `n`, as
    /// `alu::shld`/`alu::shrd` for 32 and 64 bits (counts below the
    /// width): a count of 0 changes no flag (a 32-bit destination is still
    /// zero-extended, as the interpreter writes it); otherwise the host
    /// instruction gives the result, CF, SF, ZF and PF, and the undefined
    /// flags are the interpreter's: AF set, OF = MSB(result) XOR CF
    /// (SHLD) or the XOR of the result's two top bits (SHRD), in r15 as a
    /// shift's ([`Self::shift_flags_saved`]).
    fn double_shift(
        &mut self,
        left: bool,
        dst: u8,
        src: u8,
        size: Size,
        n: u8,
    ) -> Result<(), NotTranslated> {
        if n == 0 {
            if size == Size::B4 {
                self.load(ACC, dst, size)?;
                self.store_acc(dst, size)?;
            }
            return Ok(());
        }
        let code = match (left, size) {
            (true, Size::B4) => Code::Shld_rm32_r32_imm8,
            (true, Size::B8) => Code::Shld_rm64_r64_imm8,
            (false, Size::B4) => Code::Shrd_rm32_r32_imm8,
            (false, Size::B8) => Code::Shrd_rm64_r64_imm8,
            _ => return Err(NotTranslated::Unsupported("8/16-bit double shift")),
        };
        // All six are replaced below (or never observed).
        self.flags_overwritten();
        self.load(ACC, dst, size)?;
        self.load(SEC, src, size)?;
        self.add(Instruction::with3(
            code,
            ACC[si(size)],
            SEC[si(size)],
            n as u32,
        ))?;
        if !self.flags_dead {
            let op = if left { ShiftOp::Shl } else { ShiftOp::Shr };
            self.shift_flags_saved_as(op, !left, size, Register::RAX)?;
        }
        self.store_acc(dst, size)
    }

    /// Two-operand IMUL of `gpr[dst]` by a 32- or 64-bit memory operand:
    /// as `Cpu::exec_mul`, the multiply cost charged (before the read:
    /// a first-level miss, which the interpreter's read may fill or fault
    /// on, runs the whole instruction through the interpreter, as for a
    /// memory DIV), CF and OF from the host, SF ZF AF PF kept.
    fn imul_mem(&mut self, k: usize, dst: u8, size: Size, m: &MemOp) -> Result<(), NotTranslated> {
        let (slow, mut cont) = self.begin_inline()?;
        self.lea(m)?;
        let at = self.fast_access_at(false, size, slow)?;
        self.load_host(SEC, size, at)?;
        self.add_cycles(self.o.multiply_cost)?;
        self.load(ACC, dst, size)?;
        let code = [Code::Imul_r32_rm32, Code::Imul_r64_rm64][(size == Size::B8) as usize];
        self.add(Instruction::with2(code, ACC[si(size)], SEC[si(size)]))?;
        // (MOVs only: the host flags survive the store.)
        self.store_acc(dst, size)?;
        self.merge_multiply_flags()?;
        self.end_inline(k, slow, &mut cont, false)
    }

    /// One-operand MUL/IMUL by a register: rdx:rax = rax * src, CF and OF
    /// from the host (set when the high half is significant), SF ZF AF PF
    /// left as they were (the interpreter's choice), the multiply cost
    /// charged.
    fn mul1(&mut self, signed: bool, size: Size, src: u8) -> Result<(), NotTranslated> {
        self.capture_if_dirty()?;
        self.add_cycles(self.o.multiply_cost)?;
        self.load(ACC, 0, size)?;
        let code = match (signed, size) {
            (false, Size::B4) => Code::Mul_rm32,
            (false, Size::B8) => Code::Mul_rm64,
            (true, Size::B4) => Code::Imul_rm32,
            (true, Size::B8) => Code::Imul_rm64,
            _ => return Err(NotTranslated::Unsupported("8/16-bit one-operand multiply")),
        };
        match self.cached_reg(src, size) {
            Some(h) => self.add(Instruction::with1(code, h))?,
            None => {
                let m = self.slot(src);
                self.add(Instruction::with1(code, m))?
            }
        }
        // rdx:rax whole (a 32-bit multiply zero-extends both). MOVs only:
        // the host flags survive them.
        self.store_acc(0, Size::B8)?;
        self.store_from(DXR, 2, Size::B8)?;
        self.merge_multiply_flags()
    }
}
