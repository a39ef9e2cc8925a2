//! Integer, data-movement, string and control-flow instructions.
//!
//! `exec` dispatches on the mnemonic; operand forms are handled generically
//! through `access` (register, memory, immediate), and the arithmetic
//! itself lives in [`crate::alu`]. An instruction either completes (and the
//! run loop moves RIP to `next_rip`) or returns a [`Fault`] having changed no
//! architectural state, so exceptions are precise.

use super::access::Place;
use super::state::rflags;
use super::{vector, Cpu, Fault};
use crate::addr::Hpa;
use crate::alu::{self, BinOp, BitOp, ShiftOp, Size};
use crate::memory::PhysMemory;
use crate::mmu::AccessKind;
use iced_x86::{Code, Instruction, Mnemonic as M, OpKind};

/// Longest run of `rep` iterations between event checks.
const REP_CHUNK: u64 = 4096;

#[inline]
pub(super) fn ud() -> Fault {
    Fault::exception(vector::UD)
}

#[inline]
pub(super) fn gp0() -> Fault {
    Fault::with_code(vector::GP, 0)
}

impl Cpu {
    /// Executes one instruction.
    pub(super) fn exec(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        match i.mnemonic() {
            M::Mov => self.exec_mov(mem, i),
            M::Add => self.exec_binop(mem, i, BinOp::Add),
            M::Or => self.exec_binop(mem, i, BinOp::Or),
            M::Adc => self.exec_binop(mem, i, BinOp::Adc),
            M::Sbb => self.exec_binop(mem, i, BinOp::Sbb),
            M::And => self.exec_binop(mem, i, BinOp::And),
            M::Sub => self.exec_binop(mem, i, BinOp::Sub),
            M::Xor => self.exec_binop(mem, i, BinOp::Xor),
            M::Cmp => {
                let size = Self::op_size(i, 0);
                let a = self.read_op(mem, i, 0, size)?;
                let b = self.read_op(mem, i, 1, size)?;
                self.state.rflags = alu::binop(BinOp::Cmp, size, a, b, self.state.rflags).1;
                Ok(())
            }
            M::Test => {
                let size = Self::op_size(i, 0);
                let a = self.read_op(mem, i, 0, size)?;
                let b = self.read_op(mem, i, 1, size)?;
                self.state.rflags = alu::test(size, a, b, self.state.rflags);
                Ok(())
            }
            M::Inc => self.exec_unary(mem, i, alu::inc),
            M::Dec => self.exec_unary(mem, i, alu::dec),
            M::Neg => self.exec_unary(mem, i, alu::neg),
            M::Not => self.exec_unary(mem, i, |size, v, fl| (!v & size.mask(), fl)),
            M::Rol => self.exec_shift(mem, i, ShiftOp::Rol),
            M::Ror => self.exec_shift(mem, i, ShiftOp::Ror),
            M::Rcl => self.exec_shift(mem, i, ShiftOp::Rcl),
            M::Rcr => self.exec_shift(mem, i, ShiftOp::Rcr),
            M::Shl => self.exec_shift(mem, i, ShiftOp::Shl),
            M::Sal => self.exec_shift(mem, i, ShiftOp::Sal),
            M::Shr => self.exec_shift(mem, i, ShiftOp::Shr),
            M::Sar => self.exec_shift(mem, i, ShiftOp::Sar),
            M::Shld | M::Shrd => self.exec_double_shift(mem, i),
            M::Mul | M::Imul => self.exec_mul(mem, i),
            M::Div | M::Idiv => self.exec_div(mem, i),
            M::Bt => self.exec_bit(mem, i, BitOp::Bt),
            M::Bts => self.exec_bit(mem, i, BitOp::Bts),
            M::Btr => self.exec_bit(mem, i, BitOp::Btr),
            M::Btc => self.exec_bit(mem, i, BitOp::Btc),
            M::Bsf | M::Bsr | M::Tzcnt | M::Lzcnt | M::Popcnt => self.exec_bitscan(mem, i),
            M::Movzx | M::Movsx | M::Movsxd => {
                let src_size = Self::op_size(i, 1);
                let dst_size = Self::op_size(i, 0);
                let v = self.read_op(mem, i, 1, src_size)?;
                let v = if i.mnemonic() == M::Movzx {
                    v
                } else {
                    src_size.sign_extend(v)
                };
                self.write_op(mem, i, 0, dst_size, v & dst_size.mask())
            }
            M::Lea => {
                if i.op1_kind() != OpKind::Memory {
                    return Err(ud());
                }
                let size = Self::op_size(i, 0);
                let ea = self.lea_address(i);
                self.set_reg(i.op0_register(), ea & size.mask());
                Ok(())
            }
            M::Xchg => self.exec_xchg(mem, i),
            M::Cmpxchg => self.exec_cmpxchg(mem, i),
            M::Cmpxchg8b => self.exec_cmpxchg8b(mem, i),
            M::Xadd => self.exec_xadd(mem, i),
            M::Bswap => {
                let size = Self::op_size(i, 0);
                let v = self.reg(i.op0_register());
                let r = if size == Size::B2 {
                    0
                } else {
                    alu::bswap(size, v)
                };
                self.set_reg(i.op0_register(), r);
                Ok(())
            }
            M::Cbw => self.convert_acc(Size::B1, Size::B2),
            M::Cwde => self.convert_acc(Size::B2, Size::B4),
            M::Cdqe => self.convert_acc(Size::B4, Size::B8),
            M::Cwd => self.convert_to_rdx(Size::B2),
            M::Cdq => self.convert_to_rdx(Size::B4),
            M::Cqo => self.convert_to_rdx(Size::B8),
            M::Push => self.exec_push(mem, i),
            M::Pop => self.exec_pop(mem, i),
            M::Pushfq | M::Pushfd | M::Pushf => {
                let size = stack_size(i);
                // VM and RF read as 0 in the pushed image.
                let v = self.state.rflags & !(rflags::VM | rflags::RF);
                self.stack_push(mem, size, v & size.mask())
            }
            M::Popfq | M::Popfd | M::Popf => self.exec_popf(mem, i),
            M::Leave => {
                let size = match i.code() {
                    Code::Leavew => Size::B2,
                    Code::Leaved => Size::B4,
                    _ => Size::B8,
                };
                let saved = self.state.gpr[4];
                let rbp = self.state.gpr[5];
                self.set_stack_pointer(rbp);
                match self.stack_pop(mem, size) {
                    Ok(v) => {
                        self.set_gpr_sized(5, size, false, v);
                        Ok(())
                    }
                    Err(f) => {
                        self.state.gpr[4] = saved;
                        Err(f)
                    }
                }
            }
            M::Enter => self.exec_enter(mem, i),
            M::Jmp if is_far(i) => self.exec_far_jump(mem, i, false),
            M::Call if is_far(i) => self.exec_far_jump(mem, i, true),
            M::Jmp => {
                let target = self.branch_target(mem, i)?;
                self.jump(target)
            }
            M::Call => {
                let target = self.branch_target(mem, i)?;
                if !crate::addr::is_canonical(target) {
                    return Err(gp0());
                }
                let size = stack_size(i);
                self.stack_push(mem, size, self.next_rip & size.mask())?;
                self.next_rip = target;
                Ok(())
            }
            M::Ret => {
                let saved = self.state.gpr[4];
                let size = if self.state.in_64bit_mode() {
                    Size::B8
                } else {
                    Self::near_operand_size(i)
                };
                let target = self.stack_pop(mem, size)?;
                if !crate::addr::is_canonical(target) {
                    self.state.gpr[4] = saved;
                    return Err(gp0());
                }
                if i.op_count() == 1 {
                    let sp = self.state.gpr[4].wrapping_add(i.immediate16() as u64);
                    self.set_stack_pointer(sp);
                }
                self.next_rip = target;
                Ok(())
            }
            M::Jo
            | M::Jno
            | M::Jb
            | M::Jae
            | M::Je
            | M::Jne
            | M::Jbe
            | M::Ja
            | M::Js
            | M::Jns
            | M::Jp
            | M::Jnp
            | M::Jl
            | M::Jge
            | M::Jle
            | M::Jg => {
                if self.cond(i) {
                    self.jump(i.near_branch_target())
                } else {
                    Ok(())
                }
            }
            M::Jrcxz | M::Jecxz | M::Jcxz => {
                let size = match i.mnemonic() {
                    M::Jcxz => Size::B2,
                    M::Jecxz => Size::B4,
                    _ => Size::B8,
                };
                if self.state.gpr[1] & size.mask() == 0 {
                    self.jump(i.near_branch_target())
                } else {
                    Ok(())
                }
            }
            M::Loop | M::Loope | M::Loopne => {
                // The counter is CX, ECX or RCX by the address size.
                let size = match i.code() {
                    Code::Loop_rel8_16_CX
                    | Code::Loop_rel8_32_CX
                    | Code::Loope_rel8_16_CX
                    | Code::Loope_rel8_32_CX
                    | Code::Loopne_rel8_16_CX
                    | Code::Loopne_rel8_32_CX => Size::B2,
                    Code::Loop_rel8_16_ECX
                    | Code::Loop_rel8_32_ECX
                    | Code::Loop_rel8_64_ECX
                    | Code::Loope_rel8_16_ECX
                    | Code::Loope_rel8_32_ECX
                    | Code::Loope_rel8_64_ECX
                    | Code::Loopne_rel8_16_ECX
                    | Code::Loopne_rel8_32_ECX
                    | Code::Loopne_rel8_64_ECX => Size::B4,
                    _ => Size::B8,
                };
                let rcx = self.state.gpr[1].wrapping_sub(1) & size.mask();
                self.set_gpr_sized(1, size, false, rcx);
                let zf = self.state.rflags & rflags::ZF != 0;
                let taken = rcx != 0
                    && match i.mnemonic() {
                        M::Loope => zf,
                        M::Loopne => !zf,
                        _ => true,
                    };
                if taken {
                    self.jump(i.near_branch_target())
                } else {
                    Ok(())
                }
            }
            M::Seto
            | M::Setno
            | M::Setb
            | M::Setae
            | M::Sete
            | M::Setne
            | M::Setbe
            | M::Seta
            | M::Sets
            | M::Setns
            | M::Setp
            | M::Setnp
            | M::Setl
            | M::Setge
            | M::Setle
            | M::Setg => {
                let v = self.cond(i) as u64;
                self.write_op(mem, i, 0, Size::B1, v)
            }
            m if super::fast::is_cmovcc(m) => {
                let size = Self::op_size(i, 0);
                let src = self.read_op(mem, i, 1, size)?;
                let dst = self.reg(i.op0_register());
                // A 32-bit CMOV writes (zero-extends) its destination even
                // when the condition is false.
                let v = if self.cond(i) { src } else { dst };
                self.set_reg(i.op0_register(), v);
                Ok(())
            }
            M::Clc => self.set_flags(rflags::CF, false),
            M::Stc => self.set_flags(rflags::CF, true),
            M::Cmc => {
                self.state.rflags ^= rflags::CF;
                Ok(())
            }
            M::Cld => self.set_flags(rflags::DF, false),
            M::Std => self.set_flags(rflags::DF, true),
            M::Lahf => {
                let ah = (self.state.rflags & (rflags::ARITH & 0xff)) | rflags::FIXED1;
                self.set_gpr_sized(0, Size::B1, true, ah);
                Ok(())
            }
            M::Sahf => {
                let ah = (self.state.gpr[0] >> 8) & 0xff;
                let mask = rflags::CF | rflags::PF | rflags::AF | rflags::ZF | rflags::SF;
                self.state.rflags = (self.state.rflags & !mask) | (ah & mask);
                Ok(())
            }
            M::Xlatb => {
                // [rBX + AL] at the address size.
                let amask = match i.memory_base() {
                    iced_x86::Register::BX => 0xffff,
                    iced_x86::Register::EBX => 0xffff_ffff,
                    _ => u64::MAX,
                };
                let offset = self.state.gpr[3].wrapping_add(self.state.gpr[0] & 0xff) & amask;
                let la = self.linear(i.memory_segment(), offset);
                let v = self.read_mem(mem, la, Size::B1)?;
                self.set_gpr_sized(0, Size::B1, false, v);
                Ok(())
            }
            M::Movsb | M::Movsw | M::Movsd | M::Movsq => self.exec_string(mem, i, StringOp::Movs),
            M::Stosb | M::Stosw | M::Stosd | M::Stosq => self.exec_string(mem, i, StringOp::Stos),
            M::Lodsb | M::Lodsw | M::Lodsd | M::Lodsq => self.exec_string(mem, i, StringOp::Lods),
            M::Cmpsb | M::Cmpsw | M::Cmpsd | M::Cmpsq => self.exec_string(mem, i, StringOp::Cmps),
            M::Scasb | M::Scasw | M::Scasd | M::Scasq => self.exec_string(mem, i, StringOp::Scas),
            M::Nop | M::Pause | M::Lfence | M::Mfence | M::Sfence => Ok(()),
            // Hint NOPs; RDSSP leaves its register alone without CET
            // shadow stacks (not in CPUID).
            M::Endbr64 | M::Endbr32 | M::Reservednop | M::Rdsspd | M::Rdsspq => Ok(()),
            M::Prefetchnta | M::Prefetcht0 | M::Prefetcht1 | M::Prefetcht2 | M::Prefetchw => Ok(()),
            M::Clflush | M::Clflushopt => {
                // No caches to flush, but the address must be valid.
                let la = self.effective_address(i);
                self.read_mem(mem, la, Size::B1).map(|_| ())
            }
            M::Ud0 | M::Ud1 | M::Ud2 => Err(ud()),
            M::Int3 => self.software_interrupt(mem, i, vector::BP),
            M::Int => self.software_interrupt(mem, i, i.immediate8()),
            // ICEBP (INT1): a trap-like #DB, the frame after the
            // instruction, no gate DPL check, DR6.B0-B3 cleared and BS not
            // set (SDM Vol. 3A 18.3.1; kvm-unit-tests' debug "ICEBP").
            M::Int1 => {
                self.state.rip = i.next_ip();
                let d = &mut self.state.debug;
                d.dr6 = (d.dr6 & !super::debug_regs::DR6_HITS) | super::debug_regs::DR6_FIXED_1;
                Err(Fault::exception(vector::DB))
            }
            // The system instructions of every system call and interrupt
            // (frequent: translated code calls out for them), straight to
            // where the last arm would take them.
            M::Swapgs
            | M::Syscall
            | M::Sysretq
            | M::Rdtsc
            | M::Rdtscp
            | M::Iretq
            | M::Cli
            | M::Sti
            | M::Hlt
            | M::In
            | M::Out
            | M::Rdmsr
            | M::Wrmsr => self.exec_system(mem, i),
            m if super::legacy::is_legacy(m) => self.exec_legacy(mem, i),
            m if super::sse::is_simd(m) => self.exec_simd(mem, i),
            m if super::x87::is_x87(m) => self.exec_x87(mem, i),
            m if super::xsave::is_xsave(m) => self.exec_xsave(mem, i),
            _ => self.exec_system(mem, i),
        }
    }

    /// Condition of a Jcc/SETcc/CMOVcc.
    #[inline]
    fn cond(&self, i: &Instruction) -> bool {
        let cc = i.condition_code() as u8;
        cc != 0 && alu::condition(cc - 1, self.state.rflags)
    }

    #[inline]
    fn set_flags(&mut self, mask: u64, on: bool) -> Result<(), Fault> {
        if on {
            self.state.rflags |= mask;
        } else {
            self.state.rflags &= !mask;
        }
        Ok(())
    }

    /// Target of a near JMP/CALL: relative, register or memory.
    #[inline]
    fn branch_target(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<u64, Fault> {
        match i.op0_kind() {
            OpKind::NearBranch64 | OpKind::NearBranch32 | OpKind::NearBranch16 => {
                Ok(i.near_branch_target())
            }
            OpKind::Register | OpKind::Memory => {
                let size = if self.state.in_64bit_mode() {
                    Size::B8
                } else {
                    Self::near_operand_size(i)
                };
                self.read_op(mem, i, 0, size)
            }
            _ => Err(ud()),
        }
    }

    /// The operand size of a near branch or return outside 64-bit mode
    /// (16 or 32).
    fn near_operand_size(i: &Instruction) -> Size {
        let size = match i.code() {
            Code::Retnw | Code::Retnw_imm16 => Size::B2,
            Code::Retnd | Code::Retnd_imm16 => Size::B4,
            _ if matches!(i.op0_kind(), OpKind::Register | OpKind::Memory) => Self::op_size(i, 0),
            _ => stack_size(i),
        };
        if size == Size::B2 {
            Size::B2
        } else {
            Size::B4
        }
    }

    /// Transfers control; a non-canonical target faults on the branch.
    /// (Outside 64-bit mode targets are offsets at most 32 bits wide, and
    /// CS limits are not checked.)
    #[inline]
    pub(super) fn jump(&mut self, target: u64) -> Result<(), Fault> {
        if !crate::addr::is_canonical(target) {
            return Err(gp0());
        }
        self.next_rip = target;
        Ok(())
    }

    /// LEA's address: no segment base, address size applied.
    fn lea_address(&self, i: &Instruction) -> u64 {
        self.operand_offset(i)
    }

    fn exec_mov(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        if i.op0_kind() == OpKind::Register {
            let r = i.op0_register();
            if r.is_cr() || r.is_segment_register() || r.is_dr() {
                return self.exec_mov_system(mem, i);
            }
        }
        if i.op1_kind() == OpKind::Register {
            let r = i.op1_register();
            if r.is_cr() || r.is_segment_register() || r.is_dr() {
                return self.exec_mov_system(mem, i);
            }
        }
        let size = Self::op_size(i, 0);
        let v = self.read_op(mem, i, 1, size)?;
        self.write_op(mem, i, 0, size, v)
    }

    fn exec_binop(&mut self, mem: &PhysMemory, i: &Instruction, op: BinOp) -> Result<(), Fault> {
        let size = Self::op_size(i, 0);
        let src = self.read_op(mem, i, 1, size)?;
        let p = self.place(mem, i, 0, size)?;
        let fl = self.state.rflags;
        if i.has_lock_prefix() {
            let old = self.atomic_update(mem, p, size, |old| {
                Some(alu::binop(op, size, old, src, fl).0)
            })?;
            self.state.rflags = alu::binop(op, size, old, src, fl).1;
        } else {
            let old = self.read_place(mem, p, size)?;
            let (r, nf) = alu::binop(op, size, old, src, fl);
            self.write_place(mem, p, size, r)?;
            self.state.rflags = nf;
        }
        Ok(())
    }

    fn exec_unary(
        &mut self,
        mem: &PhysMemory,
        i: &Instruction,
        f: fn(Size, u64, u64) -> (u64, u64),
    ) -> Result<(), Fault> {
        let size = Self::op_size(i, 0);
        let p = self.place(mem, i, 0, size)?;
        let fl = self.state.rflags;
        let old = if i.has_lock_prefix() {
            self.atomic_update(mem, p, size, |old| Some(f(size, old, fl).0))?
        } else {
            let old = self.read_place(mem, p, size)?;
            self.write_place(mem, p, size, f(size, old, fl).0)?;
            old
        };
        self.state.rflags = f(size, old, fl).1;
        Ok(())
    }

    fn exec_shift(&mut self, mem: &PhysMemory, i: &Instruction, op: ShiftOp) -> Result<(), Fault> {
        let size = Self::op_size(i, 0);
        let count = self.read_op(mem, i, 1, Size::B1)? as u8;
        let p = self.place(mem, i, 0, size)?;
        let v = self.read_place(mem, p, size)?;
        let (r, fl) = alu::shift(op, size, v, count, self.state.rflags);
        self.write_place(mem, p, size, r)?;
        self.state.rflags = fl;
        Ok(())
    }

    fn exec_double_shift(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        let size = Self::op_size(i, 0);
        let src = self.reg(i.op1_register());
        let count = self.read_op(mem, i, 2, Size::B1)? as u8;
        let p = self.place(mem, i, 0, size)?;
        let v = self.read_place(mem, p, size)?;
        let (r, fl) = if i.mnemonic() == M::Shld {
            alu::shld(size, v, src, count, self.state.rflags)
        } else {
            alu::shrd(size, v, src, count, self.state.rflags)
        };
        self.write_place(mem, p, size, r)?;
        self.state.rflags = fl;
        Ok(())
    }

    fn exec_mul(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        self.cycles += self.costs.multiply;
        let signed = i.mnemonic() == M::Imul;
        let fl = self.state.rflags;
        match i.op_count() {
            1 => {
                let size = Self::op_size(i, 0);
                let b = self.read_op(mem, i, 0, size)?;
                let a = self.state.gpr[0] & size.mask();
                let (lo, hi, nf) = if signed {
                    alu::imul(size, a, b, fl)
                } else {
                    alu::mul(size, a, b, fl)
                };
                if size == Size::B1 {
                    self.set_gpr_sized(0, Size::B2, false, (lo & 0xff) | ((hi & 0xff) << 8));
                } else {
                    self.set_gpr_sized(0, size, false, lo);
                    self.set_gpr_sized(2, size, false, hi);
                }
                self.state.rflags = nf;
            }
            2 | 3 => {
                let size = Self::op_size(i, 0);
                let (a, b) = if i.op_count() == 2 {
                    (self.reg(i.op0_register()), self.read_op(mem, i, 1, size)?)
                } else {
                    (self.read_op(mem, i, 1, size)?, i.immediate(2) & size.mask())
                };
                let (lo, _, nf) = alu::imul(size, a, b, fl);
                self.set_reg(i.op0_register(), lo);
                self.state.rflags = nf;
            }
            _ => return Err(ud()),
        }
        Ok(())
    }

    fn exec_div(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        self.cycles += self.costs.divide;
        let size = Self::op_size(i, 0);
        let divisor = self.read_op(mem, i, 0, size)?;
        let (high, low) = if size == Size::B1 {
            ((self.state.gpr[0] >> 8) & 0xff, self.state.gpr[0] & 0xff)
        } else {
            (
                self.state.gpr[2] & size.mask(),
                self.state.gpr[0] & size.mask(),
            )
        };
        let r = if i.mnemonic() == M::Div {
            alu::div(size, high, low, divisor)
        } else {
            alu::idiv(size, high, low, divisor)
        };
        let (q, rem) = r.ok_or(Fault::exception(vector::DE))?;
        if size == Size::B1 {
            self.set_gpr_sized(0, Size::B2, false, (q & 0xff) | ((rem & 0xff) << 8));
        } else {
            self.set_gpr_sized(0, size, false, q);
            self.set_gpr_sized(2, size, false, rem);
        }
        Ok(())
    }

    fn exec_bit(&mut self, mem: &PhysMemory, i: &Instruction, op: BitOp) -> Result<(), Fault> {
        let size = Self::op_size(i, 0);
        let bits = size.bits() as u64;
        let fl = self.state.rflags;
        let (p, bit) = if i.op0_kind() == OpKind::Memory && i.op1_kind() == OpKind::Register {
            // A register bit offset addresses memory beyond the operand:
            // signed, in units of the operand size.
            let offset = size.sign_extend(self.reg(i.op1_register()));
            let ea = self.operand_offset(i);
            let la = self.linear(
                i.memory_segment(),
                ea.wrapping_add(
                    (((offset as i64) >> size.bits().trailing_zeros()) as u64)
                        .wrapping_mul(size.bytes() as u64),
                ),
            );
            let bit = (offset & (bits - 1)) as u32;
            let p = if op == BitOp::Bt {
                // BT only reads: do not require write permission.
                let v = self.read_mem(mem, la, size)?;
                self.state.rflags = alu::bit_test(op, size, v, bit, fl).1;
                return Ok(());
            } else {
                self.place_at(mem, la, size)?
            };
            (p, bit)
        } else {
            let bit = (self.read_op(mem, i, 1, size)? & (bits - 1)) as u32;
            if op == BitOp::Bt {
                let v = self.read_op(mem, i, 0, size)?;
                self.state.rflags = alu::bit_test(op, size, v, bit, fl).1;
                return Ok(());
            }
            (self.place(mem, i, 0, size)?, bit)
        };
        let old = if i.has_lock_prefix() {
            self.atomic_update(mem, p, size, |old| {
                Some(alu::bit_test(op, size, old, bit, fl).0)
            })?
        } else {
            let old = self.read_place(mem, p, size)?;
            self.write_place(mem, p, size, alu::bit_test(op, size, old, bit, fl).0)?;
            old
        };
        self.state.rflags = alu::bit_test(op, size, old, bit, fl).1;
        Ok(())
    }

    /// A memory place at an explicit linear address (write-checked).
    fn place_at(&mut self, mem: &PhysMemory, la: u64, size: Size) -> Result<Place, Fault> {
        let user = self.state.cpl() == 3;
        if self.state.debug.dr7 & super::debug_regs::DR7_ENABLES != 0 {
            self.note_data_access(la, size.bytes() as u64, true);
        }
        if (la & 0xfff) + size.bytes() as u64 <= 0x1000 {
            let hpa = self.translate(mem, la, crate::mmu::AccessKind::Write, user)?;
            Ok(Place::Mem { hpa })
        } else {
            self.translate(mem, la, crate::mmu::AccessKind::Write, user)?;
            self.translate(
                mem,
                la.wrapping_add(size.bytes() as u64 - 1),
                crate::mmu::AccessKind::Write,
                user,
            )?;
            Ok(Place::Split { la })
        }
    }

    fn exec_bitscan(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        let size = Self::op_size(i, 0);
        let src = self.read_op(mem, i, 1, size)?;
        let fl = self.state.rflags;
        let dst_reg = i.op0_register();
        let (r, nf) = match i.mnemonic() {
            M::Bsf => alu::bsf(size, src, self.reg(dst_reg), fl),
            M::Bsr => alu::bsr(size, src, self.reg(dst_reg), fl),
            M::Tzcnt => alu::tzcnt(size, src, fl),
            M::Lzcnt => alu::lzcnt(size, src, fl),
            _ => alu::popcnt(size, src, fl),
        };
        // BSF/BSR with a zero source leave the whole destination register
        // untouched (no zero-extension of a 32-bit destination), as the
        // hardware we check against does.
        let zero_scan = matches!(i.mnemonic(), M::Bsf | M::Bsr) && src == 0;
        if !zero_scan {
            self.set_reg(dst_reg, r);
        }
        self.state.rflags = nf;
        Ok(())
    }

    fn exec_xchg(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        let size = Self::op_size(i, 0);
        if i.op0_kind() == OpKind::Register && i.op1_kind() == OpKind::Register {
            let a = self.reg(i.op0_register());
            let b = self.reg(i.op1_register());
            self.set_reg(i.op0_register(), b);
            self.set_reg(i.op1_register(), a);
            return Ok(());
        }
        // XCHG with memory is always locked.
        let (mem_op, reg_op) = if i.op0_kind() == OpKind::Memory {
            (0, 1)
        } else {
            (1, 0)
        };
        let r = i.op_register(reg_op);
        let v = self.reg(r);
        let p = self.place(mem, i, mem_op, size)?;
        let old = self.atomic_update(mem, p, size, |_| Some(v))?;
        self.set_reg(r, old);
        Ok(())
    }

    fn exec_cmpxchg(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        let size = Self::op_size(i, 0);
        let src = self.reg(i.op1_register());
        let acc = self.state.gpr[0] & size.mask();
        let p = self.place(mem, i, 0, size)?;
        let old = if i.has_lock_prefix() {
            self.atomic_update(
                mem,
                p,
                size,
                |old| if old == acc { Some(src) } else { None },
            )?
        } else {
            let old = self.read_place(mem, p, size)?;
            if old == acc {
                self.write_place(mem, p, size, src)?;
            } else if let Place::Mem { .. } | Place::Split { .. } = p {
                // A memory destination is written back with its old value
                // on failure (the locked write cycle); a register one is
                // left untouched, upper half included.
                self.write_place(mem, p, size, old)?;
            }
            old
        };
        self.state.rflags = alu::binop(BinOp::Cmp, size, acc, old, self.state.rflags).1;
        if old != acc {
            self.set_gpr_sized(0, size, false, old);
        }
        Ok(())
    }

    /// CMPXCHG8B m64 (SDM Vol. 2A): compares EDX:EAX with the quadword;
    /// equal: ZF set and ECX:EBX stored; else ZF clear and EDX:EAX loaded
    /// (with the upper halves of RDX and RAX cleared, as any 32-bit
    /// register write). Only ZF changes. The destination is always written
    /// (with its old value on failure), so a read-only page faults either
    /// way. The register form does not exist (#UD).
    fn exec_cmpxchg8b(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        if i.op0_kind() != OpKind::Memory {
            return Err(Fault::exception(vector::UD));
        }
        let g = &self.state.gpr;
        let expected = (g[2] & 0xffff_ffff) << 32 | (g[0] & 0xffff_ffff);
        let new = (g[1] & 0xffff_ffff) << 32 | (g[3] & 0xffff_ffff);
        let p = self.place(mem, i, 0, Size::B8)?;
        let old = if i.has_lock_prefix() {
            self.atomic_update(mem, p, Size::B8, |old| (old == expected).then_some(new))?
        } else {
            let old = self.read_place(mem, p, Size::B8)?;
            let stored = if old == expected { new } else { old };
            self.write_place(mem, p, Size::B8, stored)?;
            old
        };
        if old == expected {
            self.state.rflags |= rflags::ZF;
        } else {
            self.state.rflags &= !rflags::ZF;
            self.state.gpr[0] = old & 0xffff_ffff;
            self.state.gpr[2] = old >> 32;
        }
        Ok(())
    }

    fn exec_xadd(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        let size = Self::op_size(i, 0);
        let src_reg = i.op1_register();
        let src = self.reg(src_reg);
        let fl = self.state.rflags;
        let p = self.place(mem, i, 0, size)?;
        let old = if i.has_lock_prefix() {
            self.atomic_update(mem, p, size, |old| {
                Some(alu::binop(BinOp::Add, size, old, src, fl).0)
            })?
        } else {
            let old = self.read_place(mem, p, size)?;
            self.write_place(mem, p, size, alu::binop(BinOp::Add, size, old, src, fl).0)?;
            old
        };
        let (sum, nf) = alu::binop(BinOp::Add, size, old, src, fl);
        self.set_reg(src_reg, old);
        if let Place::Reg { .. } = p {
            // xadd reg, reg: the destination gets the sum after the source
            // got the old value (matters when both are the same register).
            self.write_place(mem, p, size, sum)?;
        }
        self.state.rflags = nf;
        Ok(())
    }

    fn convert_acc(&mut self, from: Size, to: Size) -> Result<(), Fault> {
        let v = from.sign_extend(self.state.gpr[0] & from.mask());
        self.set_gpr_sized(0, to, false, v & to.mask());
        Ok(())
    }

    fn convert_to_rdx(&mut self, size: Size) -> Result<(), Fault> {
        let a = self.state.gpr[0] & size.mask();
        let hi = if a & size.sign_bit() != 0 {
            size.mask()
        } else {
            0
        };
        self.set_gpr_sized(2, size, false, hi);
        Ok(())
    }

    fn exec_push(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        let size = stack_size(i);
        let v = match i.op0_kind() {
            OpKind::Register if i.op0_register().is_segment_register() => {
                self.segment(i.op0_register()).selector as u64
            }
            _ => self.read_op(mem, i, 0, size)?,
        };
        self.stack_push(mem, size, v & size.mask())
    }

    fn exec_pop(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        let size = stack_size(i);
        let saved = self.state.gpr[4];
        let v = self.stack_pop(mem, size)?;
        let r = if i.op0_kind() == OpKind::Register && i.op0_register().is_segment_register() {
            self.load_segment_register(mem, i.op0_register(), v as u16)
        } else {
            // POP into memory computes the address after incrementing RSP.
            self.write_op(mem, i, 0, size, v)
        };
        if r.is_err() {
            self.state.gpr[4] = saved;
        }
        r
    }

    fn exec_popf(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        let size = stack_size(i);
        let v = self.stack_pop(mem, size)?;
        let cpl = self.state.cpl();
        let iopl = ((self.state.rflags & rflags::IOPL) >> 12) as u8;
        let mut mask = rflags::WRITABLE & !rflags::RF;
        if cpl > 0 {
            mask &= !rflags::IOPL;
        }
        if cpl > iopl {
            mask &= !rflags::IF;
        }
        if size == Size::B2 {
            mask &= 0xffff;
        }
        let old = self.state.rflags;
        self.state.rflags = (old & !mask) | (v & mask) | rflags::FIXED1;
        // RFLAGS.AC matters to SMAP.
        self.mode_epoch += 1;
        if (old ^ self.state.rflags) & rflags::IF != 0 {
            self.check_events = true;
        }
        Ok(())
    }

    fn exec_enter(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        let alloc = i.immediate16() as u64;
        let level = (i.immediate8_2nd() & 31) as u64;
        let size = match i.code() {
            Code::Enterw_imm16_imm8 => Size::B2,
            Code::Enterd_imm16_imm8 => Size::B4,
            _ => Size::B8,
        };
        let step = size.bytes() as u64;
        let saved = (self.state.gpr[4], self.state.gpr[5]);
        let r = (|| {
            let rbp = self.state.gpr[5];
            self.stack_push(mem, size, rbp & size.mask())?;
            let frame = self.state.gpr[4] & self.state.stack_mask();
            if level > 0 {
                let mut p = rbp;
                for _ in 1..level {
                    p = p.wrapping_sub(step);
                    let la = self.linear(iced_x86::Register::SS, p & self.state.stack_mask());
                    let v = self.read_mem(mem, la, size)?;
                    self.stack_push(mem, size, v)?;
                }
                self.stack_push(mem, size, frame & size.mask())?;
            }
            self.set_gpr_sized(5, size, false, frame);
            let sp = self.state.gpr[4].wrapping_sub(alloc);
            self.set_stack_pointer(sp);
            Ok(())
        })();
        if r.is_err() {
            (self.state.gpr[4], self.state.gpr[5]) = saved;
        }
        r
    }

    /// INT n / INT3: delivered through the IDT with the return address
    /// after the instruction.
    fn software_interrupt(
        &mut self,
        mem: &PhysMemory,
        i: &Instruction,
        vec: u8,
    ) -> Result<(), Fault> {
        // No single-step trap after INT n: its handler starts with TF clear.
        self.tf_after_only = true;
        let ev = crate::vmx::EventInjection {
            kind: crate::vmx::EventKind::SoftwareInterrupt,
            vector: vec,
            error_code: None,
            instruction_len: i.len() as u8,
        };
        if vec == vector::BP {
            // In guest mode INT3 is a #BP exception for the exception bitmap.
            if let Some(v) = self.vmx.as_deref() {
                if v.exception_bitmap & (1 << vector::BP) != 0 {
                    return Err(Fault::exit(crate::vmx::VmExit::Exception {
                        vector: vector::BP,
                        error_code: None,
                        qualification: 0,
                    }));
                }
            }
        }
        match self.deliver_event(mem, ev) {
            super::Step::Continue => {
                // Delivery moved RIP to the handler.
                self.next_rip = self.state.rip;
                Ok(())
            }
            super::Step::Exit(e) => Err(Fault::exit(e)),
        }
    }

    fn exec_string(
        &mut self,
        mem: &PhysMemory,
        i: &Instruction,
        op: StringOp,
    ) -> Result<(), Fault> {
        let size = match i.memory_size().size() {
            1 => Size::B1,
            2 => Size::B2,
            4 => Size::B4,
            _ => Size::B8,
        };
        // Distinguish string MOVSD/CMPSD from their SSE namesakes.
        // Every address size: 16-bit code addresses them with SI and DI.
        let is_string_operand = |k: OpKind| {
            matches!(
                k,
                OpKind::MemoryESRDI
                    | OpKind::MemoryESEDI
                    | OpKind::MemoryESDI
                    | OpKind::MemorySegRSI
                    | OpKind::MemorySegESI
                    | OpKind::MemorySegSI
            )
        };
        let string_form = is_string_operand(i.op0_kind()) || is_string_operand(i.op1_kind());
        if !string_form {
            return self.exec_simd(mem, i);
        }
        let kinds = [i.op0_kind(), i.op1_kind()];
        let amask = if kinds
            .iter()
            .any(|k| matches!(k, OpKind::MemoryESEDI | OpKind::MemorySegESI))
        {
            0xffff_ffffu64
        } else if kinds
            .iter()
            .any(|k| matches!(k, OpKind::MemoryESDI | OpKind::MemorySegSI))
        {
            0xffff
        } else {
            u64::MAX
        };
        let rep = i.has_rep_prefix() || i.has_repe_prefix() || i.has_repne_prefix();
        let src_seg = i.memory_segment();
        let es = iced_x86::Register::ES;
        let step = size.bytes() as u64;
        let delta = if self.state.rflags & rflags::DF != 0 {
            step.wrapping_neg()
        } else {
            step
        };
        let mut done = 0u64;
        loop {
            if rep {
                if self.state.gpr[1] & amask == 0 {
                    break;
                }
                if done == REP_CHUNK {
                    // Resume this instruction after an event check.
                    self.next_rip = self.state.rip;
                    break;
                }
            }
            let rsi = self.linear(src_seg, self.state.gpr[6] & amask);
            let rdi = self.linear(es, self.state.gpr[7] & amask);
            if rep && amask == u64::MAX {
                let left = (self.state.gpr[1]).min(REP_CHUNK - done);
                let down = delta != step;
                let n = self.string_run(mem, op, rsi, rdi, size, left, down)?;
                if n > 0 {
                    // The indexes move by n elements, down with DF set.
                    let bytes = if down {
                        (n * step).wrapping_neg()
                    } else {
                        n * step
                    };
                    if op == StringOp::Movs {
                        self.state.gpr[6] = self.state.gpr[6].wrapping_add(bytes);
                    }
                    self.state.gpr[7] = self.state.gpr[7].wrapping_add(bytes);
                    self.state.gpr[1] -= n;
                    done += n;
                    continue;
                }
            }
            let mut zf_stop = false;
            match op {
                StringOp::Movs => {
                    let v = self.read_mem(mem, rsi, size)?;
                    self.write_mem(mem, rdi, size, v)?;
                    self.advance_index(6, delta, amask);
                    self.advance_index(7, delta, amask);
                }
                StringOp::Stos => {
                    self.write_mem(mem, rdi, size, self.state.gpr[0] & size.mask())?;
                    self.advance_index(7, delta, amask);
                }
                StringOp::Lods => {
                    let v = self.read_mem(mem, rsi, size)?;
                    self.set_gpr_sized(0, size, false, v);
                    self.advance_index(6, delta, amask);
                }
                StringOp::Cmps => {
                    let a = self.read_mem(mem, rsi, size)?;
                    let b = self.read_mem(mem, rdi, size)?;
                    self.state.rflags = alu::binop(BinOp::Cmp, size, a, b, self.state.rflags).1;
                    self.advance_index(6, delta, amask);
                    self.advance_index(7, delta, amask);
                    zf_stop = true;
                }
                StringOp::Scas => {
                    let b = self.read_mem(mem, rdi, size)?;
                    let a = self.state.gpr[0] & size.mask();
                    self.state.rflags = alu::binop(BinOp::Cmp, size, a, b, self.state.rflags).1;
                    self.advance_index(7, delta, amask);
                    zf_stop = true;
                }
            }
            done += 1;
            if !rep {
                break;
            }
            // The counter is CX, ECX (zero-extended) or RCX by the address size.
            let count = (self.state.gpr[1] & amask).wrapping_sub(1);
            self.advance_index(1, 0, amask);
            self.state.gpr[1] = (self.state.gpr[1] & !amask) | (count & amask);
            if zf_stop {
                let zf = self.state.rflags & rflags::ZF != 0;
                if (i.has_repe_prefix() && !zf) || (i.has_repne_prefix() && zf) {
                    break;
                }
            }
        }
        if done > 1 {
            let extra = (done - 1) * (self.costs.instruction + self.costs.string_iteration);
            self.cycles += extra;
        }
        Ok(())
    }

    /// A REP STOS or MOVS with 64-bit addresses, forward or (`down`,
    /// RFLAGS.DF set) backward: the elements of the next `left` that lie
    /// whole in the current page of RDI (and of RSI), done after one
    /// translation of each page, in the order and with the effects that
    /// one element at a time would have: the first element's translations
    /// fault as its own accesses would, the later elements' would hit the
    /// first-level TLB (no side effects), and a page that is not RAM fails
    /// at the first element's access. Returns how many were done: 0
    /// (nothing done) when fewer than two fit or for other string
    /// instructions.
    #[allow(clippy::too_many_arguments)]
    fn string_run(
        &mut self,
        mem: &PhysMemory,
        op: StringOp,
        rsi: u64,
        rdi: u64,
        size: Size,
        left: u64,
        down: bool,
    ) -> Result<u64, Fault> {
        let step = size.bytes() as u64;
        // Elements from `la` on (down: from `la` down) whole in its page.
        let in_page = |la: u64| {
            let offset = la & 0xfff;
            match down {
                false => (0x1000 - offset) / step,
                true if offset + step <= 0x1000 => offset / step + 1,
                true => 0,
            }
        };
        let n = match op {
            StringOp::Stos => left.min(in_page(rdi)),
            StringOp::Movs => left.min(in_page(rdi)).min(in_page(rsi)),
            _ => return Ok(0),
        };
        // Under `emulate_mmio` each element goes the element's way, to
        // reach the MMIO page's reads and writes.
        // So does each element while DR7 enables breakpoints (each
        // access is checked against the data breakpoints).
        if n < 2
            || self.mmio_emu.is_some()
            || self.state.debug.dr7 & super::debug_regs::DR7_ENABLES != 0
        {
            return Ok(0);
        }
        let user = self.user_access();
        // The i-th element's address from the first's.
        let at = |base: Hpa, i: u64| {
            if down {
                Hpa(base.0 - i * step)
            } else {
                Hpa(base.0 + i * step)
            }
        };
        // The run's lowest element from its first.
        let lowest = |first: Hpa| if down { at(first, n - 1) } else { first };
        match op {
            StringOp::Stos => {
                let dst = self.translate(mem, rdi, AccessKind::Write, user)?;
                let value = self.state.gpr[0] & size.mask();
                // (One value: the order of the stores does not matter.)
                if !mem.store_repeated(lowest(dst), n, size.bytes(), value) {
                    // Decoded code in the frame, or not RAM (the first
                    // store fails): one store at a time.
                    for i in 0..n {
                        self.store(mem, at(dst, i), size, value)?;
                    }
                }
            }
            _ => {
                let src = self.translate(mem, rsi, AccessKind::Read, user)?;
                // Not RAM: the first element's read fails here, as its own
                // would, before the destination is translated.
                mem.read(src, size.bytes())?;
                let dst = self.translate(mem, rdi, AccessKind::Write, user)?;
                if !mem.copy_repeated(lowest(src), lowest(dst), n, size.bytes(), down) {
                    for i in 0..n {
                        let v = mem.read(at(src, i), size.bytes())?;
                        self.store(mem, at(dst, i), size, v)?;
                    }
                }
            }
        }
        Ok(n)
    }

    #[inline]
    pub(super) fn advance_index(&mut self, reg: usize, delta: u64, amask: u64) {
        let r = &mut self.state.gpr[reg];
        // A 16-bit index merges into its register; a 32-bit one
        // zero-extends.
        let keep = if amask == 0xffff { !amask } else { 0 };
        *r = (*r & keep) | (r.wrapping_add(delta) & amask);
    }
}

/// The stack operand size of a PUSH, POP, CALL, RET, PUSHF or POPF form.
pub(super) fn stack_size(i: &Instruction) -> Size {
    match i.stack_pointer_increment().unsigned_abs() {
        2 => Size::B2,
        4 => Size::B4,
        _ => Size::B8,
    }
}

/// JMP/CALL to another code segment (ptr16:16/32 or m16:16/32/64).
fn is_far(i: &Instruction) -> bool {
    matches!(i.op0_kind(), OpKind::FarBranch16 | OpKind::FarBranch32)
        || i.is_jmp_far_indirect()
        || i.is_call_far_indirect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StringOp {
    Movs,
    Stos,
    Lods,
    Cmps,
    Scas,
}
