//! Pre-decoded fast paths for the most frequent instruction forms.
//!
//! When a block is decoded, each instruction is classified once into a
//! [`Fast`] form with its operands resolved to register indices, immediates
//! and a compact memory operand. The common forms of compiled C (register
//! and memory MOV, the ALU group, LEA, INC/DEC, PUSH/POP, near branches)
//! then execute without going through iced-x86's generic operand accessors.
//! Everything else, and every unusual variant (high-byte registers, LOCK,
//! segment tricks), stays [`Fast::Generic`] and runs through `exec`, which
//! is the reference: `fast_matches_generic` in the tests runs both paths on
//! random states and compares them.

use super::state::rflags;
use super::{Cpu, Fault};
use crate::alu::{self, BinOp, ShiftOp, Size};
use crate::memory::PhysMemory;
use iced_x86::{CodeSize, Instruction, Mnemonic as M, OpKind, Register};

/// Register index meaning "none".
const NONE: u8 = 16;
/// [`NONE`], for the translator.
pub(crate) const NONE_REG: u8 = NONE;

/// A memory operand with everything resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemOp {
    pub(crate) base: u8,
    pub(crate) index: u8,
    pub(crate) scale_shift: u8,
    /// 0: no segment base, 1: FS, 2: GS.
    pub(crate) seg: u8,
    pub(crate) addr32: bool,
    /// Displacement, or the absolute target of a RIP-relative operand.
    pub(crate) disp: u64,
}

/// An instruction form with a fast path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fast {
    /// No fast path: run the generic interpreter.
    Generic,
    /// More than 15 bytes with prefixes: #GP(0).
    TooLong,
    MovRR {
        dst: u8,
        src: u8,
        size: Size,
    },
    MovRI {
        dst: u8,
        size: Size,
        imm: u64,
    },
    MovRM {
        dst: u8,
        size: Size,
        m: MemOp,
    },
    MovMR {
        src: u8,
        size: Size,
        m: MemOp,
    },
    MovMI {
        size: Size,
        imm: u64,
        m: MemOp,
    },
    /// MOVZX/MOVSX/MOVSXD from a register or memory.
    ExtendR {
        dst: u8,
        dsize: Size,
        src: u8,
        ssize: Size,
        signed: bool,
    },
    ExtendM {
        dst: u8,
        dsize: Size,
        ssize: Size,
        signed: bool,
        m: MemOp,
    },
    Lea {
        dst: u8,
        size: Size,
        m: MemOp,
    },
    AluRR {
        op: BinOp,
        dst: u8,
        src: u8,
        size: Size,
    },
    AluRI {
        op: BinOp,
        dst: u8,
        size: Size,
        imm: u64,
    },
    AluRM {
        op: BinOp,
        dst: u8,
        size: Size,
        m: MemOp,
    },
    AluMR {
        op: BinOp,
        src: u8,
        size: Size,
        m: MemOp,
    },
    AluMI {
        op: BinOp,
        size: Size,
        imm: u64,
        m: MemOp,
    },
    /// Shift or rotate of a register by an immediate or by CL (`None`).
    Shift {
        op: ShiftOp,
        dst: u8,
        size: Size,
        count: Option<u8>,
    },
    /// Two- and three-operand IMUL with register sources.
    Imul {
        dst: u8,
        src: u8,
        size: Size,
        imm: Option<u64>,
    },
    TestRR {
        a: u8,
        b: u8,
        size: Size,
    },
    TestRI {
        a: u8,
        size: Size,
        imm: u64,
    },
    IncDec {
        dst: u8,
        size: Size,
        dec: bool,
    },
    Push {
        src: u8,
    },
    Pop {
        dst: u8,
    },
    Jcc {
        cc: u8,
        target: u64,
    },
    Jmp {
        target: u64,
    },
    Call {
        target: u64,
    },
    Ret,
    /// Indirect CALL/JMP through a register or memory.
    CallR {
        src: u8,
    },
    CallM {
        m: MemOp,
    },
    JmpR {
        src: u8,
    },
    JmpM {
        m: MemOp,
    },
    /// CMOVcc from a register or memory.
    CmovR {
        cc: u8,
        dst: u8,
        src: u8,
        size: Size,
    },
    CmovM {
        cc: u8,
        dst: u8,
        size: Size,
        m: MemOp,
    },
    /// NOP, PAUSE, ENDBR64.
    Nop,
    /// A system instruction of every system call (64-bit mode): what the
    /// generic path does for it (`exec_generic`, `exec_system`), without
    /// the dispatch (see [`Cpu::exec_fast_system`]).
    System(SystemOp),
}

/// The system instructions with a [`Fast::System`] form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SystemOp {
    Swapgs,
    Syscall,
    Sysretq,
    Rdtsc,
}

impl SystemOp {
    /// The instruction's mnemonic (known without a table lookup).
    #[inline(always)]
    fn mnemonic(self) -> M {
        match self {
            SystemOp::Swapgs => M::Swapgs,
            SystemOp::Syscall => M::Syscall,
            SystemOp::Sysretq => M::Sysretq,
            SystemOp::Rdtsc => M::Rdtsc,
        }
    }
}

/// A decoded instruction with its fast form.
#[derive(Debug, Clone)]
pub struct Op {
    pub insn: Instruction,
    pub fast: Fast,
    /// Address of the next instruction.
    pub next_ip: u64,
}

impl Op {
    /// An instruction longer than 15 bytes (`insn` is the decoder's
    /// invalid result; its IP is the instruction's).
    pub fn too_long(insn: Instruction) -> Op {
        Op {
            fast: Fast::TooLong,
            next_ip: insn.ip(),
            insn,
        }
    }

    /// A decoded instruction of `bits`-bit code. Only 64-bit code gets
    /// fast forms (they assume 64-bit stack and flat segments); 32- and
    /// 16-bit code runs through the generic interpreter, with the next
    /// IP wrapping at the code size.
    pub fn for_code(insn: Instruction, bits: u32) -> Op {
        if bits == 64 {
            return Op::new(insn);
        }
        let mask = if bits == 32 { 0xffff_ffff } else { 0xffff };
        Op {
            fast: Fast::Generic,
            next_ip: insn.next_ip() & mask,
            insn,
        }
    }

    /// Classifies a decoded instruction of 64-bit code.
    pub fn new(insn: Instruction) -> Op {
        Op {
            fast: classify(&insn),
            next_ip: insn.next_ip(),
            insn,
        }
    }
}

/// What the run loop does after an instruction completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flow {
    /// Go on with the next instruction of the block.
    Next,
    /// Go on, unless the instruction stored into cached code.
    Stored,
    /// Leave the block; execution continues at `Cpu::next_rip`.
    Leave,
}

/// Which computation the pending arithmetic flags come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LazyKind {
    /// Nothing pending: RFLAGS is exact.
    None,
    /// ADD: flags of `a + b = r`.
    Add,
    /// SUB or CMP: flags of `a - b = r`.
    Sub,
    /// AND, OR, XOR, TEST: SF, ZF, PF of `r`; CF, OF, AF clear.
    Logic,
}

/// Arithmetic flags (CF PF AF ZF SF OF) not yet folded into RFLAGS.
///
/// Most ALU results' flags are overwritten before anything reads them, so
/// the fast ALU forms record their operands and result here instead of
/// computing flags. While something is pending the arithmetic bits of
/// `state.rflags` are stale (the other bits are always exact);
/// [`Cpu::flush_flags`] folds the pending flags in. Every reader of the
/// arithmetic flags outside the fast forms flushes first: the generic
/// interpreter, event delivery, and `Cpu::run` before it returns, so
/// nothing outside a run ever sees pending flags.
#[derive(Debug, Clone, Copy)]
pub(super) struct LazyFlags {
    kind: LazyKind,
    size: Size,
    a: u64,
    b: u64,
    r: u64,
}

impl LazyFlags {
    pub(super) const NONE: LazyFlags = LazyFlags {
        kind: LazyKind::None,
        size: Size::B8,
        a: 0,
        b: 0,
        r: 0,
    };

    /// The arithmetic flags in their RFLAGS positions (nothing pending: 0).
    #[inline]
    fn arith(&self) -> u64 {
        let LazyFlags {
            kind,
            size,
            a,
            b,
            r,
        } = *self;
        let sbit = size.bits() - 1;
        match kind {
            LazyKind::None => 0,
            LazyKind::Add => {
                let of = (((a ^ r) & (b ^ r)) >> sbit) & 1;
                (r < a) as u64 | ((a ^ b ^ r) & 0x10) | szp(size, r) | (of << 11)
            }
            LazyKind::Sub => {
                let of = (((a ^ b) & (a ^ r)) >> sbit) & 1;
                (a < b) as u64 | ((a ^ b ^ r) & 0x10) | szp(size, r) | (of << 11)
            }
            LazyKind::Logic => szp(size, r),
        }
    }

    /// Condition `cc` (as in [`alu::condition`]) straight from the pending
    /// operands, when that is cheap: everything but PF after SUB/CMP and
    /// the logic ops. `None`: flush and use RFLAGS.
    #[inline(always)]
    fn condition(&self, cc: u8) -> Option<bool> {
        let LazyFlags {
            kind,
            size,
            a,
            b,
            r,
        } = *self;
        let negative = (r >> (size.bits() - 1)) & 1 != 0;
        let base = match (kind, cc >> 1) {
            (LazyKind::Sub, 1) => a < b,
            (LazyKind::Sub, 2) => a == b,
            (LazyKind::Sub, 3) => a <= b,
            (LazyKind::Sub, 4) => negative,
            (LazyKind::Sub, 6) => (size.sign_extend(a) as i64) < (size.sign_extend(b) as i64),
            (LazyKind::Sub, 7) => (size.sign_extend(a) as i64) <= (size.sign_extend(b) as i64),
            (LazyKind::Add, 1) => r < a,
            (LazyKind::Add, 2) => r == 0,
            (LazyKind::Add, 3) => r < a || r == 0,
            (LazyKind::Add, 4) => negative,
            (LazyKind::Logic, 0 | 1) => false,
            (LazyKind::Logic, 2 | 3) => r == 0,
            (LazyKind::Logic, 4 | 6) => negative,
            (LazyKind::Logic, 7) => r == 0 || negative,
            _ => return None,
        };
        Some(base ^ (cc & 1 != 0))
    }
}

/// Flags an ALU instruction produces, to apply once it has completed.
#[derive(Debug, Clone, Copy)]
enum NewFlags {
    /// Left pending.
    Lazy(LazyFlags),
    /// Computed (ADC and SBB, which read CF): the whole new RFLAGS.
    Exact(u64),
}

/// PF for each low byte of a result.
static PARITY: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        if (i as u8).count_ones() % 2 == 0 {
            t[i] = rflags::PF as u8;
        }
        i += 1;
    }
    t
};

/// SF, ZF and PF of a result.
#[inline(always)]
fn szp(size: Size, r: u64) -> u64 {
    (PARITY[(r & 0xff) as usize] as u64)
        | (((r == 0) as u64) << 6)
        | (((r >> (size.bits() - 1)) & 1) << 7)
}

/// INC/DEC with flags (CF preserved), for a masked input.
#[inline(always)]
pub fn incdec_fast(size: Size, a: u64, dec: bool, fl: u64) -> (u64, u64) {
    let mask = size.mask();
    let sign = size.sign_bit();
    let (r, of) = if dec {
        let r = a.wrapping_sub(1) & mask;
        (r, (a == sign) as u64)
    } else {
        let r = a.wrapping_add(1) & mask;
        (r, (r == sign) as u64)
    };
    let af = (a ^ 1 ^ r) & 0x10;
    let keep = fl & !(rflags::ARITH & !rflags::CF);
    (r, keep | af | szp(size, r) | (of << 11))
}

/// A general-purpose register other than AH/CH/DH/BH: its index and size.
pub(crate) fn gpr(r: Register) -> Option<(u8, Size)> {
    if !r.is_gpr() {
        return None;
    }
    match r {
        Register::AH | Register::CH | Register::DH | Register::BH => None,
        _ => {
            let (idx, size, high) = super::access::gpr_info(r);
            if high {
                None
            } else {
                Some((idx, size))
            }
        }
    }
}

/// The memory operand of `i`, resolved (`None` if it uses a register the
/// fast forms do not handle).
pub(crate) fn mem_operand(i: &Instruction) -> Option<MemOp> {
    let base = i.memory_base();
    let index = i.memory_index();
    // RIP-relative operands carry their absolute target in the displacement.
    let b = match base {
        Register::None | Register::RIP | Register::EIP => NONE,
        r => gpr(r)?.0,
    };
    let x = match index {
        Register::None => NONE,
        r => gpr(r)?.0,
    };
    let seg = match i.memory_segment() {
        Register::FS => 1,
        Register::GS => 2,
        _ => 0,
    };
    let scale = i.memory_index_scale();
    Some(MemOp {
        base: b,
        index: x,
        scale_shift: scale.trailing_zeros() as u8,
        seg,
        addr32: base.is_gpr32() || index.is_gpr32() || base == Register::EIP,
        disp: i.memory_displacement64(),
    })
}

/// CMOVcc, whatever the condition.
pub(crate) fn is_cmovcc(m: M) -> bool {
    matches!(
        m,
        M::Cmovo
            | M::Cmovno
            | M::Cmovb
            | M::Cmovae
            | M::Cmove
            | M::Cmovne
            | M::Cmovbe
            | M::Cmova
            | M::Cmovs
            | M::Cmovns
            | M::Cmovp
            | M::Cmovnp
            | M::Cmovl
            | M::Cmovge
            | M::Cmovle
            | M::Cmovg
    )
}

pub(crate) fn alu_op(m: M) -> Option<BinOp> {
    Some(match m {
        M::Add => BinOp::Add,
        M::Or => BinOp::Or,
        M::Adc => BinOp::Adc,
        M::Sbb => BinOp::Sbb,
        M::And => BinOp::And,
        M::Sub => BinOp::Sub,
        M::Xor => BinOp::Xor,
        M::Cmp => BinOp::Cmp,
        _ => return None,
    })
}

fn is_imm(k: OpKind) -> bool {
    matches!(
        k,
        OpKind::Immediate8
            | OpKind::Immediate16
            | OpKind::Immediate32
            | OpKind::Immediate64
            | OpKind::Immediate8to16
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32to64
    )
}

/// The fast form of `i`, if it has one.
pub fn classify(i: &Instruction) -> Fast {
    if i.has_lock_prefix() || i.has_rep_prefix() || i.has_repne_prefix() || i.has_xacquire_prefix()
    {
        return Fast::Generic;
    }
    classify_inner(i).unwrap_or(Fast::Generic)
}

fn classify_inner(i: &Instruction) -> Option<Fast> {
    let k0 = i.op0_kind();
    let k1 = if i.op_count() > 1 {
        i.op1_kind()
    } else {
        OpKind::Register
    };
    let m = i.mnemonic();
    Some(match m {
        M::Mov => match (k0, k1) {
            (OpKind::Register, OpKind::Register) => {
                let (dst, size) = gpr(i.op0_register())?;
                let (src, _) = gpr(i.op1_register())?;
                Fast::MovRR { dst, src, size }
            }
            (OpKind::Register, OpKind::Memory) => {
                let (dst, size) = gpr(i.op0_register())?;
                Fast::MovRM {
                    dst,
                    size,
                    m: mem_operand(i)?,
                }
            }
            (OpKind::Memory, OpKind::Register) => {
                let (src, size) = gpr(i.op1_register())?;
                Fast::MovMR {
                    src,
                    size,
                    m: mem_operand(i)?,
                }
            }
            (OpKind::Register, k) if is_imm(k) => {
                let (dst, size) = gpr(i.op0_register())?;
                Fast::MovRI {
                    dst,
                    size,
                    imm: i.immediate(1) & size.mask(),
                }
            }
            (OpKind::Memory, k) if is_imm(k) => {
                let size = Size::from_bytes(i.memory_size().size())?;
                Fast::MovMI {
                    size,
                    imm: i.immediate(1) & size.mask(),
                    m: mem_operand(i)?,
                }
            }
            _ => return None,
        },
        M::Movzx | M::Movsx | M::Movsxd => {
            let (dst, dsize) = gpr(i.op0_register())?;
            let signed = m != M::Movzx;
            match k1 {
                OpKind::Register => {
                    let (src, ssize) = gpr(i.op1_register())?;
                    Fast::ExtendR {
                        dst,
                        dsize,
                        src,
                        ssize,
                        signed,
                    }
                }
                OpKind::Memory => Fast::ExtendM {
                    dst,
                    dsize,
                    ssize: Size::from_bytes(i.memory_size().size())?,
                    signed,
                    m: mem_operand(i)?,
                },
                _ => return None,
            }
        }
        M::Lea if k1 == OpKind::Memory => {
            let (dst, size) = gpr(i.op0_register())?;
            let mut mo = mem_operand(i)?;
            // LEA ignores segment bases.
            mo.seg = 0;
            Fast::Lea { dst, size, m: mo }
        }
        M::Test => match (k0, k1) {
            (OpKind::Register, OpKind::Register) => {
                let (a, size) = gpr(i.op0_register())?;
                let (b, _) = gpr(i.op1_register())?;
                Fast::TestRR { a, b, size }
            }
            (OpKind::Register, k) if is_imm(k) => {
                let (a, size) = gpr(i.op0_register())?;
                Fast::TestRI {
                    a,
                    size,
                    imm: i.immediate(1) & size.mask(),
                }
            }
            _ => return None,
        },
        M::Imul if i.op_count() >= 2 && k1 == OpKind::Register => {
            let (dst, size) = gpr(i.op0_register())?;
            let (src, _) = gpr(i.op1_register())?;
            let imm = if i.op_count() == 3 {
                Some(i.immediate(2) & size.mask())
            } else {
                None
            };
            Fast::Imul {
                dst,
                src,
                size,
                imm,
            }
        }
        M::Shl | M::Sal | M::Shr | M::Sar | M::Rol | M::Ror if k0 == OpKind::Register => {
            let (dst, size) = gpr(i.op0_register())?;
            let op = match m {
                M::Shl => ShiftOp::Shl,
                M::Sal => ShiftOp::Sal,
                M::Shr => ShiftOp::Shr,
                M::Sar => ShiftOp::Sar,
                M::Rol => ShiftOp::Rol,
                _ => ShiftOp::Ror,
            };
            let count = match k1 {
                OpKind::Register if i.op1_register() == Register::CL => None,
                OpKind::Immediate8 => Some(i.immediate8()),
                _ => return None,
            };
            Fast::Shift {
                op,
                dst,
                size,
                count,
            }
        }
        M::Inc | M::Dec if k0 == OpKind::Register => {
            let (dst, size) = gpr(i.op0_register())?;
            Fast::IncDec {
                dst,
                size,
                dec: m == M::Dec,
            }
        }
        M::Push if k0 == OpKind::Register && i.stack_pointer_increment() == -8 => Fast::Push {
            src: gpr(i.op0_register())?.0,
        },
        M::Pop if k0 == OpKind::Register && i.stack_pointer_increment() == 8 => {
            let (dst, _) = gpr(i.op0_register())?;
            Fast::Pop { dst }
        }
        M::Jmp
            if k0 == OpKind::NearBranch64 && crate::addr::is_canonical(i.near_branch_target()) =>
        {
            Fast::Jmp {
                target: i.near_branch_target(),
            }
        }
        M::Call
            if k0 == OpKind::NearBranch64 && crate::addr::is_canonical(i.near_branch_target()) =>
        {
            Fast::Call {
                target: i.near_branch_target(),
            }
        }
        M::Ret if i.op_count() == 0 => Fast::Ret,
        M::Call | M::Jmp if k0 == OpKind::Register && i.op0_register().size() == 8 => {
            let src = gpr(i.op0_register())?.0;
            if m == M::Call {
                Fast::CallR { src }
            } else {
                Fast::JmpR { src }
            }
        }
        M::Call | M::Jmp
            if k0 == OpKind::Memory
                && i.memory_size().size() == 8
                && !i.is_call_far_indirect()
                && !i.is_jmp_far_indirect() =>
        {
            let mo = mem_operand(i)?;
            if m == M::Call {
                Fast::CallM { m: mo }
            } else {
                Fast::JmpM { m: mo }
            }
        }
        M::Nop | M::Pause | M::Endbr64 | M::Endbr32 | M::Reservednop => Fast::Nop,
        // (64-bit encodings only: SWAPGS and SYSRETQ exist only there, and
        // SYSCALL and RDTSC are left generic elsewhere.)
        M::Swapgs if i.code() == iced_x86::Code::Swapgs => Fast::System(SystemOp::Swapgs),
        M::Syscall if i.code() == iced_x86::Code::Syscall && i.code_size() == CodeSize::Code64 => {
            Fast::System(SystemOp::Syscall)
        }
        M::Sysretq if i.code() == iced_x86::Code::Sysretq => Fast::System(SystemOp::Sysretq),
        M::Rdtsc if i.code_size() == CodeSize::Code64 => Fast::System(SystemOp::Rdtsc),
        m if is_cmovcc(m) => {
            let (dst, size) = gpr(i.op0_register())?;
            let cc = i.condition_code() as u8 - 1;
            match k1 {
                OpKind::Register => Fast::CmovR {
                    cc,
                    dst,
                    src: gpr(i.op1_register())?.0,
                    size,
                },
                OpKind::Memory => Fast::CmovM {
                    cc,
                    dst,
                    size,
                    m: mem_operand(i)?,
                },
                _ => return None,
            }
        }
        _ if i.is_jcc_short_or_near()
            && k0 == OpKind::NearBranch64
            && crate::addr::is_canonical(i.near_branch_target()) =>
        {
            Fast::Jcc {
                cc: i.condition_code() as u8 - 1,
                target: i.near_branch_target(),
            }
        }
        _ => {
            let op = alu_op(m)?;
            match (k0, k1) {
                (OpKind::Register, OpKind::Register) => {
                    let (dst, size) = gpr(i.op0_register())?;
                    let (src, _) = gpr(i.op1_register())?;
                    Fast::AluRR { op, dst, src, size }
                }
                (OpKind::Register, OpKind::Memory) => {
                    let (dst, size) = gpr(i.op0_register())?;
                    Fast::AluRM {
                        op,
                        dst,
                        size,
                        m: mem_operand(i)?,
                    }
                }
                (OpKind::Memory, OpKind::Register) => {
                    let (src, size) = gpr(i.op1_register())?;
                    Fast::AluMR {
                        op,
                        src,
                        size,
                        m: mem_operand(i)?,
                    }
                }
                (OpKind::Register, k) if is_imm(k) => {
                    let (dst, size) = gpr(i.op0_register())?;
                    Fast::AluRI {
                        op,
                        dst,
                        size,
                        imm: i.immediate(1) & size.mask(),
                    }
                }
                (OpKind::Memory, k) if is_imm(k) => {
                    let size = Size::from_bytes(i.memory_size().size())?;
                    Fast::AluMI {
                        op,
                        size,
                        imm: i.immediate(1) & size.mask(),
                        m: mem_operand(i)?,
                    }
                }
                _ => return None,
            }
        }
    })
}

impl Cpu {
    /// Folds pending arithmetic flags into RFLAGS (see [`LazyFlags`]).
    #[inline(always)]
    pub(super) fn flush_flags(&mut self) {
        if self.lazy.kind != LazyKind::None {
            self.fold_lazy_flags();
        }
    }

    #[inline(never)]
    fn fold_lazy_flags(&mut self) {
        self.state.rflags = (self.state.rflags & !rflags::ARITH) | self.lazy.arith();
        self.lazy = LazyFlags::NONE;
    }

    /// Condition `cc` of the current flags, pending or not.
    #[inline(always)]
    fn condition_now(&mut self, cc: u8) -> bool {
        match self.lazy.condition(cc) {
            Some(c) => c,
            None => {
                self.flush_flags();
                alu::condition(cc, self.state.rflags)
            }
        }
    }

    /// `a op b` for masked inputs: the result, and the flags to apply with
    /// [`Self::apply_flags`] once nothing can fault any more.
    #[inline(always)]
    fn alu_op(&mut self, op: BinOp, size: Size, a: u64, b: u64) -> (u64, NewFlags) {
        let mask = size.mask();
        let (kind, r) = match op {
            BinOp::Add => (LazyKind::Add, a.wrapping_add(b) & mask),
            BinOp::Sub | BinOp::Cmp => (LazyKind::Sub, a.wrapping_sub(b) & mask),
            BinOp::And => (LazyKind::Logic, a & b),
            BinOp::Or => (LazyKind::Logic, a | b),
            BinOp::Xor => (LazyKind::Logic, a ^ b),
            BinOp::Adc | BinOp::Sbb => {
                self.flush_flags();
                let (r, f) = alu::binop(op, size, a, b, self.state.rflags);
                return (r, NewFlags::Exact(f));
            }
        };
        (
            r,
            NewFlags::Lazy(LazyFlags {
                kind,
                size,
                a,
                b,
                r,
            }),
        )
    }

    /// `dst op= b` for a register destination and a masked `b`. Nothing
    /// can fault here, so the pending flags are recorded at once rather
    /// than returned (the common ops then stay in registers).
    #[inline(always)]
    fn alu_reg(&mut self, op: BinOp, dst: u8, size: Size, b: u64) {
        let a = self.r(dst, size);
        let mask = size.mask();
        let (kind, r) = match op {
            BinOp::Add => (LazyKind::Add, a.wrapping_add(b) & mask),
            BinOp::Sub | BinOp::Cmp => (LazyKind::Sub, a.wrapping_sub(b) & mask),
            BinOp::And => (LazyKind::Logic, a & b),
            BinOp::Or => (LazyKind::Logic, a | b),
            BinOp::Xor => (LazyKind::Logic, a ^ b),
            BinOp::Adc | BinOp::Sbb => return self.alu_reg_with_carry(op, dst, size, a, b),
        };
        self.lazy = LazyFlags {
            kind,
            size,
            a,
            b,
            r,
        };
        if op != BinOp::Cmp {
            self.w(dst, size, r);
        }
    }

    /// TEST of two masked values: only the flags, left pending.
    #[inline(always)]
    fn test_flags(&mut self, size: Size, a: u64, b: u64) {
        self.lazy = LazyFlags {
            kind: LazyKind::Logic,
            size,
            a,
            b,
            r: a & b,
        };
    }

    /// ADC and SBB of [`Self::alu_reg`], which read CF and so compute
    /// RFLAGS exactly.
    #[inline(never)]
    fn alu_reg_with_carry(&mut self, op: BinOp, dst: u8, size: Size, a: u64, b: u64) {
        let (r, f) = self.alu_op(op, size, a, b);
        self.w(dst, size, r);
        self.apply_flags(f);
    }

    #[inline(always)]
    fn apply_flags(&mut self, f: NewFlags) {
        match f {
            NewFlags::Lazy(l) => self.lazy = l,
            NewFlags::Exact(fl) => self.state.rflags = fl,
        }
    }

    #[inline(always)]
    fn fast_ea(&self, m: &MemOp) -> u64 {
        let mut a = m.disp;
        if m.base != NONE {
            a = a.wrapping_add(self.state.gpr[m.base as usize & 15]);
        }
        if m.index != NONE {
            a = a.wrapping_add(self.state.gpr[m.index as usize & 15] << m.scale_shift);
        }
        if m.addr32 {
            a &= 0xffff_ffff;
        }
        match m.seg {
            1 => a.wrapping_add(self.state.fs.base),
            2 => a.wrapping_add(self.state.gs.base),
            _ => a,
        }
    }

    #[inline(always)]
    fn r(&self, idx: u8, size: Size) -> u64 {
        self.state.gpr[idx as usize & 15] & size.mask()
    }

    #[inline(always)]
    fn w(&mut self, idx: u8, size: Size, v: u64) {
        self.set_gpr_sized(idx, size, false, v);
    }

    /// Executes an instruction, through its fast path if it has one.
    #[inline(always)]
    pub(super) fn exec_op(&mut self, mem: &PhysMemory, op: &Op) -> Result<Flow, Fault> {
        match op.fast {
            // (One arm for both: an arm of its own for the system forms
            // made LLVM's code for the interpreter's loop about 5 host
            // instructions per guest instruction slower, callgrind on
            // `ctxsw`.)
            Fast::Generic | Fast::System(_) => self.exec_generic(mem, op),
            Fast::TooLong => Err(Fault::with_code(super::vector::GP, 0)),
            Fast::MovRR { dst, src, size } => {
                let v = self.r(src, size);
                self.w(dst, size, v);
                Ok(Flow::Next)
            }
            Fast::MovRI { dst, size, imm } => {
                self.w(dst, size, imm);
                Ok(Flow::Next)
            }
            Fast::MovRM { dst, size, m } => {
                let v = self.read_mem(mem, self.fast_ea(&m), size)?;
                self.w(dst, size, v);
                Ok(Flow::Next)
            }
            Fast::MovMR { src, size, m } => {
                let v = self.r(src, size);
                self.write_mem(mem, self.fast_ea(&m), size, v)?;
                Ok(Flow::Stored)
            }
            Fast::MovMI { size, imm, m } => {
                self.write_mem(mem, self.fast_ea(&m), size, imm)?;
                Ok(Flow::Stored)
            }
            Fast::ExtendR {
                dst,
                dsize,
                src,
                ssize,
                signed,
            } => {
                let v = self.r(src, ssize);
                let v = if signed { ssize.sign_extend(v) } else { v };
                self.w(dst, dsize, v & dsize.mask());
                Ok(Flow::Next)
            }
            Fast::ExtendM {
                dst,
                dsize,
                ssize,
                signed,
                m,
            } => {
                let v = self.read_mem(mem, self.fast_ea(&m), ssize)?;
                let v = if signed { ssize.sign_extend(v) } else { v };
                self.w(dst, dsize, v & dsize.mask());
                Ok(Flow::Next)
            }
            Fast::Lea { dst, size, m } => {
                let a = self.fast_ea(&m);
                self.w(dst, size, a & size.mask());
                Ok(Flow::Next)
            }
            Fast::AluRR { op, dst, src, size } => {
                let b = self.r(src, size);
                self.alu_reg(op, dst, size, b);
                Ok(Flow::Next)
            }
            Fast::AluRI { op, dst, size, imm } => {
                self.alu_reg(op, dst, size, imm);
                Ok(Flow::Next)
            }
            Fast::AluRM { op, dst, size, m } => {
                let b = self.read_mem(mem, self.fast_ea(&m), size)?;
                self.alu_reg(op, dst, size, b);
                Ok(Flow::Next)
            }
            Fast::AluMR { op, src, size, m } => {
                let b = self.r(src, size);
                self.alu_mem(mem, op, size, self.fast_ea(&m), b)?;
                Ok(Flow::Stored)
            }
            Fast::AluMI { op, size, imm, m } => {
                self.alu_mem(mem, op, size, self.fast_ea(&m), imm)?;
                Ok(Flow::Stored)
            }
            Fast::TestRR { a, b, size } => {
                self.test_flags(size, self.r(a, size), self.r(b, size));
                Ok(Flow::Next)
            }
            Fast::Shift {
                op: shift,
                dst,
                size,
                count,
            } => {
                let n = count.unwrap_or(self.state.gpr[1] as u8);
                let v = self.r(dst, size);
                let count_mask = if size == Size::B8 { 0x3f } else { 0x1f };
                if n & count_mask == 0 {
                    // Leaves the flags alone; a 32-bit destination is
                    // still written (zero-extended).
                    self.w(dst, size, v);
                    return Ok(Flow::Next);
                }
                if matches!(
                    shift,
                    ShiftOp::Shl | ShiftOp::Sal | ShiftOp::Shr | ShiftOp::Sar
                ) {
                    // Shifts by a nonzero count define every arithmetic
                    // flag: what was pending no longer matters.
                    self.lazy = LazyFlags::NONE;
                } else {
                    // Rotates keep SF ZF AF PF.
                    self.flush_flags();
                }
                let fl = self.state.rflags;
                // Constant ops let the compiler specialize each shift.
                let (r, f) = match shift {
                    ShiftOp::Shl | ShiftOp::Sal => alu::shift(ShiftOp::Shl, size, v, n, fl),
                    ShiftOp::Shr => alu::shift(ShiftOp::Shr, size, v, n, fl),
                    ShiftOp::Sar => alu::shift(ShiftOp::Sar, size, v, n, fl),
                    ShiftOp::Rol => alu::shift(ShiftOp::Rol, size, v, n, fl),
                    _ => alu::shift(shift, size, v, n, fl),
                };
                self.w(dst, size, r);
                self.state.rflags = f;
                Ok(Flow::Next)
            }
            Fast::Imul {
                dst,
                src,
                size,
                imm,
            } => {
                self.cycles += self.costs.multiply;
                // IMUL leaves SF ZF AF PF unchanged.
                self.flush_flags();
                let (a, b) = match imm {
                    Some(imm) => (self.r(src, size), imm),
                    None => (self.r(dst, size), self.r(src, size)),
                };
                let (lo, _, f) = alu::imul(size, a, b, self.state.rflags);
                self.w(dst, size, lo);
                self.state.rflags = f;
                Ok(Flow::Next)
            }
            Fast::TestRI { a, size, imm } => {
                self.test_flags(size, self.r(a, size), imm);
                Ok(Flow::Next)
            }
            Fast::IncDec { dst, size, dec } => {
                // INC and DEC leave CF unchanged.
                self.flush_flags();
                let a = self.r(dst, size);
                let (r, f) = incdec_fast(size, a, dec, self.state.rflags);
                self.w(dst, size, r);
                self.state.rflags = f;
                Ok(Flow::Next)
            }
            Fast::Push { src } => {
                let v = self.state.gpr[src as usize & 15];
                self.push(mem, Size::B8, v)?;
                Ok(Flow::Stored)
            }
            Fast::Pop { dst } => {
                let v = self.pop(mem, Size::B8)?;
                self.state.gpr[dst as usize & 15] = v;
                Ok(Flow::Next)
            }
            Fast::Jcc { cc, target } => {
                if self.condition_now(cc) {
                    self.next_rip = target;
                    Ok(Flow::Leave)
                } else {
                    Ok(Flow::Next)
                }
            }
            Fast::Jmp { target } => {
                self.next_rip = target;
                Ok(Flow::Leave)
            }
            Fast::Call { target } => {
                self.push(mem, Size::B8, op.next_ip)?;
                self.next_rip = target;
                Ok(Flow::Leave)
            }
            Fast::CallR { src } => {
                let target = self.state.gpr[src as usize & 15];
                self.call_to(mem, op, target)?;
                Ok(Flow::Leave)
            }
            Fast::CallM { m } => {
                let target = self.read_mem(mem, self.fast_ea(&m), Size::B8)?;
                self.call_to(mem, op, target)?;
                Ok(Flow::Leave)
            }
            Fast::JmpR { src } => {
                let target = self.state.gpr[src as usize & 15];
                self.jump(target)?;
                Ok(Flow::Leave)
            }
            Fast::JmpM { m } => {
                let target = self.read_mem(mem, self.fast_ea(&m), Size::B8)?;
                self.jump(target)?;
                Ok(Flow::Leave)
            }
            Fast::CmovR { cc, dst, src, size } => {
                // A 32-bit CMOV writes (zero-extends) its destination even
                // when the condition is false.
                let v = if self.condition_now(cc) {
                    self.r(src, size)
                } else {
                    self.r(dst, size)
                };
                self.w(dst, size, v);
                Ok(Flow::Next)
            }
            Fast::CmovM { cc, dst, size, m } => {
                let src = self.read_mem(mem, self.fast_ea(&m), size)?;
                let v = if self.condition_now(cc) {
                    src
                } else {
                    self.r(dst, size)
                };
                self.w(dst, size, v);
                Ok(Flow::Next)
            }
            Fast::Nop => Ok(Flow::Next),
            Fast::Ret => {
                let rsp = self.state.gpr[4];
                let target = self
                    .read_mem(mem, rsp, Size::B8)
                    .map_err(super::access::stack_fault)?;
                if !crate::addr::is_canonical(target) {
                    return Err(Fault::with_code(super::vector::GP, 0));
                }
                self.state.gpr[4] = rsp.wrapping_add(8);
                self.next_rip = target;
                Ok(Flow::Leave)
            }
        }
    }

    /// An instruction without a fast form, through the generic
    /// interpreter, which reads RIP (REP, INT n) and sets `next_rip`; or a
    /// [`Fast::System`] form, which takes the same way around the
    /// instruction but skips the generic dispatch
    /// ([`Cpu::exec_fast_system`]).
    #[inline(never)]
    fn exec_generic(&mut self, mem: &PhysMemory, op: &Op) -> Result<Flow, Fault> {
        self.flush_flags();
        self.state.rip = op.insn.ip();
        self.next_rip = op.next_ip;
        match op.fast {
            Fast::System(sys) => self.exec_fast_system(&op.insn, sys)?,
            _ => self.exec(mem, &op.insn)?,
        }
        // Leave on a jump, or when something between instructions needs a
        // look: new STI/MOV-SS blocking, pending events or IPIs, HLT, a
        // store into cached code.
        if self.next_rip != op.next_ip || self.check_events || self.code_written {
            Ok(Flow::Leave)
        } else {
            Ok(Flow::Next)
        }
    }

    /// A [`Fast::System`] instruction: exactly what `exec` and
    /// `exec_system` do for it, without their dispatch (these run on every
    /// system call, and translated code calls out for each of them): the
    /// mode epoch moved when `exec_system` moves it
    /// ([`Cpu::system_moves_mode`]), then the instruction. The lazy flags
    /// are already folded (SYSCALL saves RFLAGS) and leaving the block is
    /// decided by `exec_generic`.
    #[inline(never)]
    fn exec_fast_system(&mut self, insn: &Instruction, sys: SystemOp) -> Result<(), Fault> {
        if self.system_moves_mode(sys.mnemonic()) {
            self.mode_epoch += 1;
        }
        match sys {
            SystemOp::Swapgs => self.exec_swapgs(),
            SystemOp::Syscall => self.exec_syscall(insn),
            SystemOp::Sysretq => self.exec_sysret(),
            SystemOp::Rdtsc => self.exec_rdtsc(false),
        }
    }

    /// Near call to `target`: push the return address, then jump; a
    /// non-canonical target faults before anything is pushed.
    #[inline(always)]
    fn call_to(&mut self, mem: &PhysMemory, op: &Op, target: u64) -> Result<(), Fault> {
        if !crate::addr::is_canonical(target) {
            return Err(Fault::with_code(super::vector::GP, 0));
        }
        self.push(mem, Size::B8, op.next_ip)?;
        self.next_rip = target;
        Ok(())
    }

    /// `op [la], b` (not locked): read, compute, write back unless CMP.
    #[inline(always)]
    fn alu_mem(
        &mut self,
        mem: &PhysMemory,
        op: BinOp,
        size: Size,
        la: u64,
        b: u64,
    ) -> Result<(), Fault> {
        if op == BinOp::Cmp {
            let a = self.read_mem(mem, la, size)?;
            let (_, f) = self.alu_op(op, size, a, b);
            self.apply_flags(f);
            return Ok(());
        }
        if self.state.debug.dr7 & super::debug_regs::DR7_ENABLES != 0 {
            self.note_data_access(la, size.bytes() as u64, true);
        }
        if (la & 0xfff) + size.bytes() as u64 <= 0x1000 {
            let user = self.state.cpl() == 3;
            let hpa = self.translate(mem, la, crate::mmu::AccessKind::Write, user)?;
            let a = self.phys_read(mem, hpa, size.bytes())?;
            let (r, f) = self.alu_op(op, size, a, b);
            self.store(mem, hpa, size, r)?;
            self.apply_flags(f);
            Ok(())
        } else {
            // Page-crossing: let the generic path check both pages.
            let a = self.read_mem(mem, la, size)?;
            let (r, f) = self.alu_op(op, size, a, b);
            self.write_mem(mem, la, size, r)?;
            self.apply_flags(f);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::l1tlb::KeyContext;

    fn xorshift(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    #[test]
    fn lazy_alu_flags_equal_reference_alu() {
        let mut cpu = Cpu::new(super::super::CpuConfig::default());
        let mut s = 0x1234_5678_9abc_def1u64;
        let sizes = [Size::B1, Size::B2, Size::B4, Size::B8];
        let ops = [
            BinOp::Add,
            BinOp::Sub,
            BinOp::Cmp,
            BinOp::And,
            BinOp::Or,
            BinOp::Xor,
            BinOp::Adc,
            BinOp::Sbb,
        ];
        let mut answered = 0;
        for n in 0..100_000 {
            let size = sizes[n % 4];
            let edge = [0, 1, size.sign_bit(), size.mask(), size.sign_bit() - 1];
            let a = if n % 7 == 0 {
                edge[n % 5]
            } else {
                xorshift(&mut s) & size.mask()
            };
            let b = if n % 11 == 0 {
                edge[(n / 3) % 5]
            } else if n % 13 == 0 {
                a
            } else {
                xorshift(&mut s) & size.mask()
            };
            let fl = xorshift(&mut s) & (rflags::ARITH | rflags::DF | rflags::IF) | rflags::FIXED1;
            for op in ops {
                let want = alu::binop(op, size, a, b, fl);
                cpu.state.rflags = fl;
                cpu.lazy = LazyFlags::NONE;
                let (r, f) = cpu.alu_op(op, size, a, b);
                cpu.apply_flags(f);
                assert_eq!(r, want.0, "{op:?} {size:?} {a:#x} {b:#x}");
                for cc in 0..16u8 {
                    if let Some(c) = cpu.lazy.condition(cc) {
                        answered += 1;
                        assert_eq!(
                            c,
                            alu::condition(cc, want.1),
                            "cc {cc} after {op:?} {size:?} {a:#x} {b:#x}"
                        );
                    }
                }
                cpu.flush_flags();
                assert_eq!(cpu.state.rflags, want.1, "{op:?} {size:?} {a:#x} {b:#x}");
                assert_eq!(cpu.lazy.kind, LazyKind::None);

                // The register-destination form, with partial-register
                // rules: bits above a 1- or 2-byte result are kept.
                let upper = xorshift(&mut s) & !size.mask();
                cpu.state.gpr[3] = upper | a;
                cpu.state.rflags = fl;
                cpu.alu_reg(op, 3, size, b);
                cpu.flush_flags();
                let reg = match (op, size) {
                    (BinOp::Cmp, _) => upper | a,
                    (_, Size::B4 | Size::B8) => want.0,
                    _ => upper | want.0,
                };
                assert_eq!(
                    cpu.state.gpr[3], reg,
                    "alu_reg {op:?} {size:?} {a:#x} {b:#x}"
                );
                assert_eq!(
                    cpu.state.rflags, want.1,
                    "alu_reg {op:?} {size:?} {a:#x} {b:#x}"
                );
            }
        }
        assert!(answered > 100_000, "conditions come from pending flags");
    }

    #[test]
    fn system_fast_forms_equal_the_generic_path() {
        use super::super::code_cache::decode_one;
        use super::super::state::{cr4, efer, seg_attr, Segment};
        use crate::vmx::VmxControls;
        let mem = PhysMemory::new(1 << 20).unwrap();
        let rip = 0x4000u64;
        let forms: [(&[u8], SystemOp); 4] = [
            (&[0x0f, 0x01, 0xf8], SystemOp::Swapgs),
            (&[0x0f, 0x05], SystemOp::Syscall),
            (&[0x48, 0x0f, 0x07], SystemOp::Sysretq),
            (&[0x0f, 0x31], SystemOp::Rdtsc),
        ];
        // Every combination of what the four look at: CPL, EFER.SCE,
        // CR4.TSD, RDTSC exiting, a canonical RCX or not, events already
        // to check, lazy flags pending, CR4.SMAP and RFLAGS.AC (the mode
        // epoch); random registers and MSRs.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut seen = [0usize; 3];
        // Runs that left the mode epoch alone, and runs that changed the
        // lookup-key context (SYSCALL/SYSRET flipping AC under SMAP: always
        // AC alone, which the first-level TLB takes as such, keeping the
        // slots SMAP still permits).
        let (mut kept, mut context_moved) = (0usize, 0usize);
        for (bytes, sys) in forms {
            let op = decode_one(bytes, rip, 64);
            assert_eq!(op.fast, Fast::System(sys), "{sys:?}");
            assert_eq!(sys.mnemonic(), op.insn.mnemonic(), "{sys:?}");
            let generic = Op {
                fast: Fast::Generic,
                ..op.clone()
            };
            for case in 0..512u32 {
                let bit = |n: u32| case & (1 << n) != 0;
                let r = [
                    xorshift(&mut seed),
                    xorshift(&mut seed),
                    xorshift(&mut seed),
                ];
                let setup = || {
                    let mut cpu = Cpu::new(super::super::CpuConfig::default());
                    if bit(3) {
                        cpu.set_vmx(Some(VmxControls {
                            rdtsc_exiting: true,
                            ..VmxControls::default()
                        }));
                    }
                    let st = cpu.state_mut();
                    if bit(0) {
                        st.cs = Segment {
                            selector: 0x23,
                            base: 0,
                            limit: 0xffff_ffff,
                            attr: seg_attr::CODE64_USER,
                        };
                    }
                    if bit(1) {
                        st.efer |= efer::SCE;
                    }
                    if bit(2) {
                        st.cr4 |= cr4::TSD;
                    }
                    if bit(7) {
                        st.cr4 |= cr4::SMAP;
                    }
                    st.gpr[1] = if bit(4) { r[0] } else { r[0] >> 17 };
                    st.gpr[11] = r[1];
                    st.gs.base = r[2];
                    st.kernel_gs_base = r[0] ^ r[2];
                    st.star = r[1] ^ r[2];
                    st.lstar = r[2] >> 16;
                    st.fmask = r[0] & 0x3f_7fd5;
                    st.rflags = r[1] & (rflags::ARITH | rflags::DF | rflags::IF) | rflags::FIXED1;
                    if bit(8) {
                        st.rflags |= rflags::AC;
                    }
                    cpu.check_events = bit(5);
                    if bit(6) {
                        // Flags pending from an ALU operation.
                        let (_, f) = cpu.alu_op(BinOp::Sub, Size::B8, r[0], r[1]);
                        cpu.apply_flags(f);
                    }
                    cpu.cycles = r[2] >> 20;
                    cpu
                };
                let mut fast = setup();
                let mut reference = setup();
                let (epoch, context) = (fast.mode_epoch, fast.key_context());
                let got = fast.exec_op(&mem, &op);
                let want = reference.exec_op(&mem, &generic);
                let what = format!("{sys:?}, case {case:#b}");
                assert_eq!(got, want, "{what}");
                seen[match got {
                    Ok(Flow::Next) => 0,
                    Ok(_) => 1,
                    Err(_) => 2,
                }] += 1;
                fast.flush_flags();
                reference.flush_flags();
                assert_eq!(fast.state_digest(), reference.state_digest(), "{what}");
                assert_eq!(fast.next_rip, reference.next_rip, "{what}");
                assert_eq!(fast.check_events, reference.check_events, "{what}");
                assert_eq!(fast.mode_epoch, reference.mode_epoch, "{what}");
                assert_eq!(fast.code_written, reference.code_written, "{what}");
                // What the epoch is for: the first-level TLB and its cached
                // keys stay only while the lookup-key context is the same.
                if fast.mode_epoch == epoch {
                    assert_eq!(fast.key_context(), context, "{what}");
                    kept += 1;
                }
                let now = fast.key_context();
                if now != context {
                    assert_eq!(
                        KeyContext {
                            rflags_ac: context.rflags_ac,
                            ..now
                        },
                        context,
                        "{what}"
                    );
                    context_moved += 1;
                }
            }
        }
        assert!(seen.iter().all(|&n| n > 20), "{seen:?}");
        assert!(kept > 500 && context_moved > 20, "{kept} {context_moved}");
    }

    #[test]
    fn moves_to_and_from_system_registers_move_the_mode_epoch_when_the_key_context_may_change() {
        // MOV to and from CR0, CR3, CR4 and CR8, to DS and ES, from CR2, in
        // ring 0 (bare and in guest mode), with random values: whenever the
        // mode epoch stays, the lookup-key context must be the same (the
        // first-level TLB and its cached keys are kept on that promise).
        use super::super::code_cache::decode_one;
        use super::super::state::{cr0, cr4, efer};
        use crate::vmx::VmxControls;
        use iced_x86::code_asm::{self as asm, rax, CodeAssembler};
        let mem = PhysMemory::new(1 << 20).unwrap();
        let rip = 0x4000u64;
        type Form = fn(&mut CodeAssembler);
        let forms: [Form; 11] = [
            |a| a.mov(asm::cr0, rax).unwrap(),
            |a| a.mov(asm::cr3, rax).unwrap(),
            |a| a.mov(asm::cr4, rax).unwrap(),
            |a| a.mov(asm::cr8, rax).unwrap(),
            |a| a.mov(rax, asm::cr0).unwrap(),
            |a| a.mov(rax, asm::cr2).unwrap(),
            |a| a.mov(rax, asm::cr3).unwrap(),
            |a| a.mov(rax, asm::cr4).unwrap(),
            |a| a.mov(asm::ds, rax).unwrap(),
            |a| a.mov(asm::es, rax).unwrap(),
            |a| a.mov(rax, asm::ds).unwrap(),
        ];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let (mut kept, mut moved, mut context_moved) = (0usize, 0usize, 0usize);
        for (n, form) in forms.iter().enumerate() {
            let mut a = CodeAssembler::new(64).unwrap();
            form(&mut a);
            let op = decode_one(&a.assemble(rip).unwrap(), rip, 64);
            for case in 0..64u32 {
                let r = xorshift(&mut seed);
                let mut cpu = Cpu::new(super::super::CpuConfig::default());
                if case & 1 != 0 {
                    cpu.set_vmx(Some(VmxControls::default()));
                }
                let st = cpu.state_mut();
                if case & 2 != 0 {
                    st.cr4 |= cr4::SMAP;
                }
                if case & 4 != 0 {
                    st.rflags |= rflags::AC;
                }
                if case & 8 != 0 {
                    // Long mode with PCIDs: CR3 bits 11:0 are in the context.
                    st.cr0 |= cr0::PE | cr0::PG;
                    st.efer |= efer::LME | efer::LMA;
                    st.cr4 |= cr4::PAE | cr4::PCIDE;
                }
                let flips = [cr0::WP, 0, cr4::SMAP | cr4::SMEP, 0, cr4::TSD, cr4::PGE];
                st.gpr[0] = match n {
                    0 => st.cr0 ^ flips[(r % 2) as usize],
                    1 => r & 0xff_ffff_ffff,
                    2 => st.cr4 ^ flips[2 + (r % 4) as usize],
                    3 => r & 0xf,
                    _ => 0,
                };
                let (epoch, context) = (cpu.mode_epoch, cpu.key_context());
                let _ = cpu.exec_op(&mem, &op);
                if cpu.mode_epoch == epoch {
                    assert_eq!(cpu.key_context(), context, "form {n}, case {case}");
                    kept += 1;
                } else {
                    moved += 1;
                }
                context_moved += usize::from(cpu.key_context() != context);
            }
        }
        assert!(
            kept > 400 && moved > 100 && context_moved > 50,
            "{kept} {moved} {context_moved}"
        );
    }

    #[test]
    fn fast_incdec_equals_reference_alu() {
        let mut s = 0x1234_5678_9abc_def1u64;
        let sizes = [Size::B1, Size::B2, Size::B4, Size::B8];
        for n in 0..200_000 {
            let size = sizes[n % 4];
            let edge = [0, 1, size.sign_bit(), size.mask(), size.sign_bit() - 1];
            let a = if n % 7 == 0 {
                edge[n % 5]
            } else {
                xorshift(&mut s) & size.mask()
            };
            let fl = xorshift(&mut s) & (rflags::ARITH | rflags::DF | rflags::IF) | rflags::FIXED1;
            let (r, f) = incdec_fast(size, a, false, fl);
            assert_eq!((r, f), alu::inc(size, a, fl), "inc {size:?} {a:#x}");
            let (r, f) = incdec_fast(size, a, true, fl);
            assert_eq!((r, f), alu::dec(size, a, fl), "dec {size:?} {a:#x}");
        }
    }
}
