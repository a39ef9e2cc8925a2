//! Memory operands: effective addresses and the inline first-level-TLB
//! access, with the instruction through the interpreter on its slow path.

use super::*;

impl Emitter {
    /// Loads the linear address of `m` (the effective address, plus the
    /// FS or GS base for such an operand) into rax without touching the
    /// flags.
    pub(super) fn lea(&mut self, m: &MemOp) -> Result<(), NotTranslated> {
        self.lea_to(m, ACC)
    }

    /// [`Self::lea`] into `to` (rax, or a pool register by width),
    /// clobbering rax and rcx on the way for registers no host register
    /// holds.
    pub(super) fn lea_to(&mut self, m: &MemOp, to: [Register; 4]) -> Result<(), NotTranslated> {
        let disp = m.disp as i64;
        let short = disp == disp as i32 as i64;
        let scale = 1u32 << m.scale_shift;
        let dst = to[3];
        // Registers a host register holds (`jit/regs.rs`) are used where
        // they are (`Self::in_reg`).
        match (m.base != NONE_REG, m.index != NONE_REG) {
            (true, true) if short => {
                let b = self.in_reg(ACC, m.base, Size::B8)?;
                let i = self.in_reg(SEC, m.index, Size::B8)?;
                let mo = MemoryOperand::with_base_index_scale_displ_size(
                    b,
                    i,
                    scale,
                    disp,
                    if disp == 0 { 0 } else { 1 },
                );
                self.add(Instruction::with2(Code::Lea_r64_m, dst, mo))?;
            }
            (true, false) if short => match self.cached_reg(m.base, Size::B8) {
                Some(h) if disp != 0 => {
                    let mo = MemoryOperand::with_base_displ(h, disp);
                    self.add(Instruction::with2(Code::Lea_r64_m, dst, mo))?;
                }
                _ => {
                    self.load(to, m.base, Size::B8)?;
                    if disp != 0 {
                        let mo = MemoryOperand::with_base_displ(dst, disp);
                        self.add(Instruction::with2(Code::Lea_r64_m, dst, mo))?;
                    }
                }
            },
            (false, true) if short => {
                let i = self.in_reg(SEC, m.index, Size::B8)?;
                let mo = MemoryOperand::with_base_index_scale_displ_size(
                    Register::None,
                    i,
                    scale,
                    disp,
                    4,
                );
                self.add(Instruction::with2(Code::Lea_r64_m, dst, mo))?;
            }
            (base, index) => {
                self.a.mov(rax, m.disp)?;
                if base {
                    self.load(SEC, m.base, Size::B8)?;
                    self.a.lea(rax, qword_ptr(rax + rcx))?;
                }
                if index {
                    self.load(SEC, m.index, Size::B8)?;
                    self.a.lea(rax, qword_ptr(rax + rcx * scale))?;
                }
                if dst != Register::RAX {
                    self.add(Instruction::with2(Code::Mov_r64_rm64, dst, Register::RAX))?;
                }
            }
        }
        if m.addr32 {
            self.add(Instruction::with2(Code::Mov_r32_rm32, to[2], to[2]))?;
        }
        let base = match m.seg {
            1 => Some(self.o.fs_base),
            2 => Some(self.o.gs_base),
            _ => None,
        };
        if let Some(off) = base {
            self.a.mov(rcx, qword_ptr(rbx + off))?;
            let mo = MemoryOperand::with_base_index(dst, Register::RCX);
            self.add(Instruction::with2(Code::Lea_r64_m, dst, mo))?;
        }
        Ok(())
    }

    /// The first-level TLB probe for the address in rax: jumps to `miss`
    /// unless the slot of class offset `c` for the page of rax holds the
    /// page of rax + `last` (see [`Self::fast_access`]). Leaves the slot's
    /// offset from `rbp` minus `c` in rcx; clobbers rdx and the flags.
    pub(super) fn probe_l1(
        &mut self,
        c: i32,
        last: i32,
        miss: CodeLabel,
    ) -> Result<(), NotTranslated> {
        if last == 0 {
            self.a.mov(rdx, rax)?;
        } else {
            self.a.lea(rdx, qword_ptr(rax + last))?;
        }
        self.a.shr(rdx, 12)?;
        // Slots are indexed by page + 1.
        self.a.lea(rcx, qword_ptr(rax + 0x1000))?;
        self.a.shr(rcx, 12 - SLOT_BYTES.trailing_zeros())?;
        self.a.and(ecx, ((SLOTS - 1) * SLOT_BYTES) as i32)?;
        self.a
            .cmp(rdx, qword_ptr(rbp + rcx + (c + SLOT_JIT_PAGE as i32)))?;
        self.a.jne(miss)?;
        Ok(())
    }

    /// With the linear address in rax, leaves in rdx the host address of
    /// an access of `size` bytes, or jumps to `slow` when the first-level
    /// TLB (the class of this kind and privilege) does not hold the page,
    /// the access crosses the page, the frame is outside memory, or a
    /// store would hit a frame holding decoded code. On the fast path
    /// nothing is changed, exactly as an L1 hit in the interpreter changes
    /// nothing. Clobbers rcx and the flags; rax is kept.
    ///
    /// The slots hold nothing stale when generated code runs (`l1tlb`:
    /// they are emptied eagerly when an epoch moves), so a hit is one
    /// compare of the page. The page compared is that of the access's
    /// last byte, in the slot of its first byte's page: a page-crossing
    /// access looks for the next page in a slot that can only hold pages
    /// congruent to this one modulo the slot count, and misses.
    pub(super) fn fast_access(
        &mut self,
        write: bool,
        size: Size,
        slow: CodeLabel,
    ) -> Result<(), NotTranslated> {
        self.fast_access_bytes(write, size.bytes() as u32, slow)
    }

    /// [`Self::fast_access`] of `bytes` bytes (up to 16: an XMM move).
    pub(super) fn fast_access_bytes(
        &mut self,
        write: bool,
        bytes: u32,
        slow: CodeLabel,
    ) -> Result<(), NotTranslated> {
        self.fast_access_delta(write, bytes, slow)?;
        self.a.add(rdx, rax)?;
        Ok(())
    }

    /// [`Self::fast_access`], but leaving in rdx the page's host address
    /// minus its linear address: the access is `[rdx + rax]` (the operand
    /// returned), one host instruction fewer, for code that accesses the
    /// memory once before it changes rax.
    pub(super) fn fast_access_at(
        &mut self,
        write: bool,
        size: Size,
        slow: CodeLabel,
    ) -> Result<MemoryOperand, NotTranslated> {
        self.fast_access_delta(write, size.bytes() as u32, slow)?;
        Ok(MemoryOperand::with_base_index(Register::RDX, Register::RAX))
    }

    /// The probe of [`Self::fast_access_bytes`], leaving the slot's host
    /// delta in rdx.
    fn fast_access_delta(
        &mut self,
        write: bool,
        bytes: u32,
        slow: CodeLabel,
    ) -> Result<(), NotTranslated> {
        let last = bytes as i32 - 1;
        let class = (write as usize) * 2 + self.user as usize;
        self.access = (class as u32, bytes);
        let c = (class * SLOTS * SLOT_BYTES) as i32;
        // rdx = the last byte's page; rcx = the slot offset of the first
        // byte's page (slots are indexed by page + 1).
        self.probe_l1(c, last, slow)?;
        self.probed_host_delta(c)
    }

    /// After a hit of [`Self::probe_l1`] (rcx the slot's offset): rdx =
    /// the host address of the page minus its linear address (the host
    /// address of rax is rdx + rax). A write slot hits only when its frame
    /// holds no decoded code (`l1tlb::L1Tlb::keep_stores_off_code`): a
    /// store into code takes the slow path, which invalidates it.
    fn probed_host_delta(&mut self, c: i32) -> Result<(), NotTranslated> {
        self.a
            .mov(rdx, qword_ptr(rbp + rcx + (c + SLOT_HOST_DELTA as i32)))?;
        Ok(())
    }

    /// Where an inline access probes again after its fill: a label here.
    /// A first-level TLB miss fills the slot (`Cpu::jit_fill`) and comes
    /// back to it.
    pub(super) fn retry_point(&mut self) -> Result<CodeLabel, NotTranslated> {
        let mut retry = self.a.create_label();
        // (A label needs an instruction to sit on: a zero-length one takes
        // any label the code before left pending, such as a `cont`.)
        self.a.zero_bytes()?;
        self.a.set_label(&mut retry)?;
        self.retry_regs = self.regs;
        Ok(retry)
    }

    /// The slow path of the last inline access ([`Self::fast_access`]
    /// jumping to `miss`) of instruction `k`, entered with the flags
    /// written back: a miss fills the first-level TLB as the
    /// interpreter's access would and probes again at `retry` (or takes
    /// the access's fault, or runs the instruction); `full` runs the whole
    /// instruction through the interpreter, which then goes on at `cont`
    /// (set already) with the flags where `exit` says. `rip`: the
    /// instruction's address when the interpreter runs it generically
    /// (see [`Slow::rip`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn filled_slow(
        &mut self,
        k: usize,
        rip: Option<u64>,
        miss: CodeLabel,
        full: CodeLabel,
        retry: CodeLabel,
        cont: CodeLabel,
        exit: FlagsAt,
    ) {
        self.slow.push(Slow {
            label: miss,
            full,
            retry,
            access: Some(self.access),
            k,
            cont,
            entry_saved: false,
            af_clear: false,
            exit,
            rip,
            retry_regs: self.retry_regs,
            cont_regs: self.regs,
        });
    }

    /// `reg = [at]` at `size` (32 bits zero-extend): `at` the operand
    /// [`Self::fast_access_at`] gave.
    pub(super) fn load_host(
        &mut self,
        reg: [Register; 4],
        size: Size,
        at: MemoryOperand,
    ) -> Result<(), NotTranslated> {
        self.add(Instruction::with2(MOV_R_RM[si(size)], reg[si(size)], at))
    }

    /// The push of `value` (`None`: RFLAGS from the state as PUSHFQ
    /// pushes it, VM and RF clear) through the first-level TLB (to
    /// `miss` if it cannot serve it), RSP updated (clobbers rax, rcx, rdx
    /// and the host flags).
    pub(super) fn push_value(
        &mut self,
        value: Option<u64>,
        miss: CodeLabel,
    ) -> Result<(), NotTranslated> {
        self.load(ACC, 4, Size::B8)?;
        self.a.lea(rax, qword_ptr(rax - 8))?;
        self.fast_access(true, Size::B8, miss)?;
        match value {
            Some(v) => self.a.mov(rcx, v)?,
            None => {
                let fl = self.field(self.o.rflags);
                self.add(Instruction::with2(Code::Mov_r64_rm64, Register::RCX, fl))?;
                self.a.and(
                    rcx,
                    !(crate::cpu::state::rflags::VM | crate::cpu::state::rflags::RF) as i32,
                )?;
            }
        }
        self.a.mov(qword_ptr(rdx), rcx)?;
        self.store_acc(4, Size::B8)
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
        // The checks clobber the host flags: dirty flags move to r15 (the
        // slow path writes them back before running the instruction).
        self.save_flags()?;
        let entry_saved = self.saved;
        let af_clear = self.af_clear;
        let retry = self.retry_point()?;
        let full = self.a.create_label();
        let slow = self.a.create_label();
        let mut cont = self.a.create_label();
        let at_rdx = MemoryOperand::with_base(Register::RDX);
        let mut writes_flags = None;
        match *f {
            Fast::MovRM { dst, size, m } => {
                self.lea(&m)?;
                let at = self.fast_access_at(false, size, slow)?;
                // Straight into the destination's host register if it
                // takes one (32 and 64 bits).
                match self.wide_claim(dst, size)? {
                    Some(h) => {
                        self.load_host(h, size, at)?;
                        self.store_held(dst, h)?;
                    }
                    None => {
                        self.load_host(ACC, size, at)?;
                        self.store_acc(dst, size)?;
                    }
                }
            }
            Fast::MovMR { src, size, m } => {
                self.lea(&m)?;
                let at = self.fast_access_at(true, size, slow)?;
                // From the source's host register where one holds it.
                let from = self.in_reg(SEC, src, size)?;
                self.add(Instruction::with2(MOV_RM_R[si(size)], at, from))?;
            }
            Fast::MovMI { size, imm, m } => {
                self.lea(&m)?;
                let at = self.fast_access_at(true, size, slow)?;
                let code = [
                    Code::Mov_rm8_imm8,
                    Code::Mov_rm16_imm16,
                    Code::Mov_rm32_imm32,
                    Code::Mov_rm64_imm32,
                ][si(size)];
                if size == Size::B8 {
                    self.add(Instruction::with2(code, at, imm as i32))?;
                } else {
                    self.add(Instruction::with2(code, at, imm as u32))?;
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
                let at = self.fast_access_at(false, ssize, slow)?;
                self.extend(dst, dsize, at, ssize, signed)?;
            }
            Fast::AluRM { op, dst, size, m } => {
                self.lea(&m)?;
                let at = self.fast_access_at(false, size, slow)?;
                self.load_host(DXR, size, at)?;
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
                let at = self.fast_access_at(false, size, slow)?;
                self.load_host(DXR, size, at)?;
                self.need_flags()?;
                let code =
                    cmov_code(cc, size).ok_or(NotTranslated::Unsupported("CMOVcc of this size"))?;
                self.load(ACC, dst, size)?;
                self.add(Instruction::with2(code, ACC[si(size)], DXR[si(size)]))?;
                self.store_acc(dst, size)?;
            }
            Fast::Push { src } => {
                self.load(ACC, 4, Size::B8)?;
                self.a.lea(rax, qword_ptr(rax - 8))?;
                let at = self.fast_access_at(true, Size::B8, slow)?;
                let from = self.in_reg(SEC, src, Size::B8)?;
                self.add(Instruction::with2(Code::Mov_rm64_r64, at, from))?;
                self.store_acc(4, Size::B8)?;
            }
            Fast::Pop { dst } => {
                self.load(ACC, 4, Size::B8)?;
                let at = self.fast_access_at(false, Size::B8, slow)?;
                self.add(Instruction::with2(Code::Mov_r64_rm64, Register::RCX, at))?;
                self.a.lea(rax, qword_ptr(rax + 8))?;
                self.store_acc(4, Size::B8)?;
                let g = self.g(dst)?;
                self.add(Instruction::with2(Code::Mov_rm64_r64, g, Register::RCX))?;
                self.forget_reg(dst);
            }
            Fast::Call { .. } => self.push_value(Some(next_ip), slow)?,
            Fast::Ret => {
                self.load(ACC, 4, Size::B8)?;
                let at = self.fast_access_at(false, Size::B8, slow)?;
                self.add(Instruction::with2(Code::Mov_r64_rm64, Register::RSI, at))?;
                // A non-canonical return address faults: the slow path.
                self.check_canonical(rsi, full)?;
                self.a.lea(rax, qword_ptr(rax + 8))?;
                self.store_acc(4, Size::B8)?;
                self.capture_if_dirty()?;
                self.a.mov(rax, rsi)?;
                self.a.mov(ecx, k as u32)?;
                self.a.jmp(self.chain)?;
                // The call-out always leaves the block: it never comes back.
                self.slow.push(Slow {
                    label: slow,
                    full,
                    retry,
                    access: Some(self.access),
                    k,
                    cont: epilogue,
                    entry_saved,
                    af_clear,
                    exit: FlagsAt::State,
                    rip: None,
                    retry_regs: self.retry_regs,
                    cont_regs: self.regs,
                });
                return Ok(());
            }
            _ => return Err(NotTranslated::Unsupported("not an inline memory form")),
        }
        if let Some(logic) = writes_flags {
            self.wrote_flags(logic);
        }
        self.a.set_label(&mut cont)?;
        // (A label needs an instruction to sit on, and the next access's
        // `retry` may come straight after.)
        self.a.zero_bytes()?;
        let exit = if self.host_valid {
            FlagsAt::Host
        } else if self.saved {
            FlagsAt::Saved
        } else {
            FlagsAt::State
        };
        self.slow.push(Slow {
            label: slow,
            full,
            retry,
            access: Some(self.access),
            k,
            cont,
            entry_saved,
            af_clear,
            exit,
            rip: None,
            retry_regs: self.retry_regs,
            cont_regs: self.regs,
        });
        Ok(())
    }

    /// A run of `ops` (from [`stack_run`]: consecutive PUSHes or POPs of
    /// registers other than RSP), the first being instruction `k`, with
    /// one probe of the first-level TLB for the whole stack range it
    /// touches: where that range lies in one page the slot serves (for
    /// writing: not a frame holding code), every access of the run would
    /// hit the same slot one by one, and hits change nothing, so the
    /// values move with no further check. Otherwise the run's instructions
    /// as they are translated one by one (each with its own probe and slow
    /// path). Both ways meet with the host flags where they were and no
    /// guest register in a host register.
    pub(super) fn stack_run(
        &mut self,
        k: usize,
        ops: &[Op],
        call_exit: CodeLabel,
    ) -> Result<(), NotTranslated> {
        let n = ops.len();
        let push = matches!(ops[0].fast, Fast::Push { .. });
        let span = 8 * n as i32;
        self.save_flags()?;
        let (flags_state, regs) = (self.flags_state(), self.regs);
        let mut fallback = self.a.create_label();
        let mut done = self.a.create_label();
        let class = (push as usize) * 2 + self.user as usize;
        let c = (class * SLOTS * SLOT_BYTES) as i32;
        // rax = the lowest address of the range: RSP after the run for
        // pushes, before it for pops.
        self.load(ACC, 4, Size::B8)?;
        if push {
            self.a.lea(rax, qword_ptr(rax - span))?;
        }
        self.probe_l1(c, span - 1, fallback)?;
        self.probed_host_delta(c)?;
        self.a.add(rdx, rax)?;
        for (i, op) in ops.iter().enumerate() {
            match op.fast {
                Fast::Push { src } => {
                    // The i-th push stores at RSP - 8 (i + 1).
                    self.load(SEC, src, Size::B8)?;
                    let at = 8 * (n - 1 - i) as i32;
                    self.a.mov(qword_ptr(rdx + at), rcx)?;
                }
                Fast::Pop { dst } => {
                    self.a.mov(rcx, qword_ptr(rdx + 8 * i as i32))?;
                    let g = self.g(dst)?;
                    self.add(Instruction::with2(Code::Mov_rm64_r64, g, Register::RCX))?;
                    self.forget_reg(dst);
                }
                _ => return Err(NotTranslated::Unsupported("not a stack run")),
            }
        }
        if !push {
            self.a.lea(rax, qword_ptr(rax + span))?;
        }
        self.store_acc(4, Size::B8)?;
        // Both ways meet with no guest register in a host register: what
        // is dirty is stored on each.
        self.flush_regs()?;
        self.a.jmp(done)?;
        // One by one, from the state the run started in.
        self.a.set_label(&mut fallback)?;
        self.a.zero_bytes()?;
        self.regs = regs;
        for (i, op) in ops.iter().enumerate() {
            self.inline_memory(k + i, &op.fast, op.next_ip, call_exit)?;
        }
        self.flush_regs()?;
        debug_assert_eq!(self.flags_state(), flags_state);
        self.a.set_label(&mut done)?;
        self.a.zero_bytes()?;
        // (Everything stored: forgetting what host registers hold is
        // exact.)
        self.regs_on();
        Ok(())
    }

    /// Where the emitter has the guest flags (`host_valid`, `dirty`,
    /// `saved`, `af_clear`).
    fn flags_state(&self) -> (bool, bool, bool, bool) {
        (self.host_valid, self.dirty, self.saved, self.af_clear)
    }
}

/// The length of the run of stack instructions [`Emitter::stack_run`]
/// takes at the start of `ops`: consecutive PUSHes (or POPs) of 64-bit
/// registers other than RSP, at most 16; 0 when fewer than two.
pub(super) fn stack_run(ops: &[Op]) -> usize {
    let push = match ops.first().map(|op| op.fast) {
        Some(Fast::Push { .. }) => true,
        Some(Fast::Pop { .. }) => false,
        _ => return 0,
    };
    let n = ops
        .iter()
        .take(16)
        .take_while(|op| match op.fast {
            Fast::Push { src } => push && src & 15 != 4,
            Fast::Pop { dst } => !push && dst & 15 != 4,
            _ => false,
        })
        .count();
    if n >= 2 {
        n
    } else {
        0
    }
}
