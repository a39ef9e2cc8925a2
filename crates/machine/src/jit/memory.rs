//! Memory operands: effective addresses and the inline first-level-TLB
//! access, with the instruction through the interpreter on its slow path.

use super::*;

impl Emitter {
    /// Loads the linear address of `m` (the effective address, plus the
    /// FS or GS base for such an operand) into rax without touching the
    /// flags.
    pub(super) fn lea(&mut self, m: &MemOp) -> Result<(), NotTranslated> {
        self.a.mov(rax, m.disp)?;
        if m.base != NONE_REG {
            self.load(SEC, m.base, Size::B8)?;
            self.a.lea(rax, qword_ptr(rax + rcx))?;
        }
        if m.index != NONE_REG {
            self.load(SEC, m.index, Size::B8)?;
            self.a
                .lea(rax, qword_ptr(rax + rcx * (1u32 << m.scale_shift)))?;
        }
        if m.addr32 {
            self.a.mov(eax, eax)?;
        }
        let base = match m.seg {
            1 => Some(self.o.fs_base),
            2 => Some(self.o.gs_base),
            _ => None,
        };
        if let Some(off) = base {
            self.a.mov(rcx, qword_ptr(rbx + off))?;
            self.a.lea(rax, qword_ptr(rax + rcx))?;
        }
        Ok(())
    }

    /// With the linear address in rax, leaves in rdx the host address of
    /// an access of `size` bytes, or jumps to `slow` when the first-level
    /// TLB (the class of this kind and privilege) does not hold the page
    /// for the current TLB and mode epochs, the access crosses the page,
    /// the frame is outside memory, or a store would hit a frame holding
    /// decoded code. On the fast path nothing is changed, exactly as an L1
    /// hit in the interpreter changes nothing. Clobbers rcx and the flags.
    pub(super) fn fast_access(
        &mut self,
        write: bool,
        size: Size,
        slow: CodeLabel,
    ) -> Result<(), NotTranslated> {
        let n = size.bytes() as i32;
        self.a.mov(ecx, eax)?;
        self.a.and(ecx, 0xfff)?;
        self.a.cmp(ecx, 0x1000 - n)?;
        self.a.ja(slow)?;
        // Page number + 1, as the slots record it.
        self.a.mov(rdx, rax)?;
        self.a.shr(rdx, 12)?;
        self.a.inc(rdx)?;
        self.a.mov(ecx, edx)?;
        self.a.and(ecx, (SLOTS - 1) as i32)?;
        self.a.shl(ecx, SLOT_BYTES.trailing_zeros())?;
        self.a.add(rcx, qword_ptr(r14 + ENV_L1))?;
        let class = (write as usize) * 2 + self.user as usize;
        let c = (class * SLOTS * SLOT_BYTES) as i32;
        self.a.cmp(rdx, qword_ptr(rcx + c))?;
        self.a.jne(slow)?;
        self.a.mov(rdx, qword_ptr(rcx + c + 16))?;
        self.a.cmp(rdx, qword_ptr(rbx + self.o.tlb_epoch))?;
        self.a.jne(slow)?;
        self.a.mov(rdx, qword_ptr(rcx + c + 24))?;
        self.a.cmp(rdx, qword_ptr(rbx + self.o.mode_epoch))?;
        self.a.jne(slow)?;
        // The frame: inside memory (its size is a multiple of 4 KiB).
        self.a.mov(rdx, qword_ptr(rcx + c + 8))?;
        self.a.cmp(rdx, qword_ptr(r14 + ENV_MEM_SIZE))?;
        self.a.jae(slow)?;
        if write {
            self.a.mov(rcx, rdx)?;
            self.a.shr(rcx, 12)?;
            self.a.add(rcx, qword_ptr(r14 + ENV_CODE_FRAMES))?;
            self.a.cmp(byte_ptr(rcx), 0)?;
            self.a.jne(slow)?;
        }
        self.a.mov(ecx, eax)?;
        self.a.and(ecx, 0xfff)?;
        self.a.add(rdx, rcx)?;
        self.a.add(rdx, qword_ptr(r14 + ENV_MEM_BASE))?;
        Ok(())
    }

    /// `reg = [rdx]` at `size` (32 bits zero-extend).
    pub(super) fn load_host(
        &mut self,
        reg: [Register; 4],
        size: Size,
    ) -> Result<(), NotTranslated> {
        let m = MemoryOperand::with_base(Register::RDX);
        self.add(Instruction::with2(MOV_R_RM[si(size)], reg[si(size)], m))
    }

    /// A memory form with an inline access (see [`is_inline_memory`]);
    /// instruction `k` through the interpreter when the fast path cannot
    /// serve it.
    pub(super) fn inline_memory(
        &mut self,
        k: usize,
        f: &Fast,
        next_ip: u64,
        epilogue: CodeLabel,
    ) -> Result<(), NotTranslated> {
        // The slow path needs the flags exact in `state.rflags`, and the
        // checks clobber the host flags.
        self.capture_if_dirty()?;
        self.host_valid = false;
        let slow = self.a.create_label();
        let mut cont = self.a.create_label();
        let at_rdx = MemoryOperand::with_base(Register::RDX);
        let mut writes_flags = None;
        match *f {
            Fast::MovRM { dst, size, m } => {
                self.lea(&m)?;
                self.fast_access(false, size, slow)?;
                self.load_host(ACC, size)?;
                self.store_acc(dst, size)?;
            }
            Fast::MovMR { src, size, m } => {
                self.lea(&m)?;
                self.fast_access(true, size, slow)?;
                self.load(SEC, src, size)?;
                self.add(Instruction::with2(
                    MOV_RM_R[si(size)],
                    at_rdx,
                    SEC[si(size)],
                ))?;
            }
            Fast::MovMI { size, imm, m } => {
                self.lea(&m)?;
                self.fast_access(true, size, slow)?;
                let code = [
                    Code::Mov_rm8_imm8,
                    Code::Mov_rm16_imm16,
                    Code::Mov_rm32_imm32,
                    Code::Mov_rm64_imm32,
                ][si(size)];
                if size == Size::B8 {
                    self.add(Instruction::with2(code, at_rdx, imm as i32))?;
                } else {
                    self.add(Instruction::with2(code, at_rdx, imm as u32))?;
                }
            }
            Fast::ExtendM {
                dst,
                dsize,
                ssize,
                signed,
                m,
            } => {
                self.lea(&m)?;
                self.fast_access(false, ssize, slow)?;
                self.extend(dst, dsize, at_rdx, ssize, signed)?;
            }
            Fast::AluRM { op, dst, size, m } => {
                self.lea(&m)?;
                self.fast_access(false, size, slow)?;
                self.load_host(DXR, size)?;
                self.need_flags_for(op)?;
                self.alu_gpr(op, dst, size, DXR)?;
                writes_flags = Some(matches!(op, BinOp::And | BinOp::Or | BinOp::Xor));
            }
            Fast::AluMR { op, src, size, m } => {
                self.lea(&m)?;
                // CMP only reads (the interpreter translates it for reading).
                self.fast_access(op != BinOp::Cmp, size, slow)?;
                self.need_flags_for(op)?;
                self.load(SEC, src, size)?;
                let (rm_r, _, _) = alu_codes(op);
                self.add(Instruction::with2(rm_r[si(size)], at_rdx, SEC[si(size)]))?;
                writes_flags = Some(matches!(op, BinOp::And | BinOp::Or | BinOp::Xor));
            }
            Fast::AluMI { op, size, imm, m } => {
                self.lea(&m)?;
                self.fast_access(op != BinOp::Cmp, size, slow)?;
                self.need_flags_for(op)?;
                let (_, _, rm_imm) = alu_codes(op);
                if size == Size::B8 {
                    self.add(Instruction::with2(rm_imm[3], at_rdx, imm as i32))?;
                } else {
                    self.add(Instruction::with2(rm_imm[si(size)], at_rdx, imm as u32))?;
                }
                writes_flags = Some(matches!(op, BinOp::And | BinOp::Or | BinOp::Xor));
            }
            Fast::CmovM { cc, dst, size, m } => {
                // The source is read whatever the condition.
                self.lea(&m)?;
                self.fast_access(false, size, slow)?;
                self.load_host(DXR, size)?;
                self.need_flags()?;
                let code =
                    cmov_code(cc, size).ok_or(NotTranslated::Unsupported("CMOVcc of this size"))?;
                self.load(ACC, dst, size)?;
                self.add(Instruction::with2(code, ACC[si(size)], DXR[si(size)]))?;
                self.store_acc(dst, size)?;
                // The fast path loaded the flags, the slow path did not.
                self.host_valid = false;
            }
            Fast::Push { src } => {
                self.load(ACC, 4, Size::B8)?;
                self.a.lea(rax, qword_ptr(rax - 8))?;
                self.fast_access(true, Size::B8, slow)?;
                self.load(SEC, src, Size::B8)?;
                self.a.mov(qword_ptr(rdx), rcx)?;
                self.store_acc(4, Size::B8)?;
            }
            Fast::Pop { dst } => {
                self.load(ACC, 4, Size::B8)?;
                self.fast_access(false, Size::B8, slow)?;
                self.a.mov(rcx, qword_ptr(rdx))?;
                self.a.lea(rax, qword_ptr(rax + 8))?;
                self.store_acc(4, Size::B8)?;
                let g = self.g(dst);
                self.add(Instruction::with2(Code::Mov_rm64_r64, g, Register::RCX))?;
            }
            Fast::Call { .. } => {
                self.load(ACC, 4, Size::B8)?;
                self.a.lea(rax, qword_ptr(rax - 8))?;
                self.fast_access(true, Size::B8, slow)?;
                self.a.mov(rcx, next_ip)?;
                self.a.mov(qword_ptr(rdx), rcx)?;
                self.store_acc(4, Size::B8)?;
            }
            Fast::Ret => {
                self.load(ACC, 4, Size::B8)?;
                self.fast_access(false, Size::B8, slow)?;
                self.a.mov(rcx, qword_ptr(rdx))?;
                // A non-canonical return address faults: the slow path.
                self.canonical_or(Register::RCX, slow)?;
                self.a.lea(rax, qword_ptr(rax + 8))?;
                self.store_acc(4, Size::B8)?;
                self.a.mov(rax, rcx)?;
                return self.leave_dynamic(k, slow, epilogue);
            }
            _ => return Err(NotTranslated::Unsupported("not an inline memory form")),
        }
        self.a.set_label(&mut cont)?;
        self.slow.push(Slow {
            label: slow,
            k,
            cont,
            flags_in_host: writes_flags.is_some(),
        });
        match writes_flags {
            Some(logic) => self.wrote_flags(logic),
            None => self.host_valid = false,
        }
        Ok(())
    }
}
