//! The translator: decoded blocks of 64-bit guest code become host x86-64
//! code that runs the block's register instructions as themselves.
//!
//! Exactness with the interpreter is kept by construction rather than by
//! imitation (the full story is in `docs/machine.md`, "The translator"):
//!
//! - A translation is attached to a decoded [`Block`] of the code cache, so
//!   it is valid exactly while the block is: self-modifying code and code
//!   the hypervisor loads bump the frame's code-write generation, the block
//!   goes stale and its translation with it.
//! - The generated code keeps the guest registers, RFLAGS and the branch
//!   target in the `Cpu` itself, addressed from one pinned host register
//!   (`rbx`), so nothing has to be copied in or out around a block.
//! - Register-only forms (MOV, the ALU group, TEST, INC/DEC, LEA, MOVZX/SX,
//!   CMOVcc, Jcc, JMP) run as the same host instruction on the same operand
//!   width; the guest's arithmetic flags live in the host flags between
//!   them and are written back (captured) before anything that may look at
//!   them: a call out, a block exit. The flags the SDM leaves undefined are
//!   made the interpreter's (AF clear after AND/OR/XOR/TEST).
//! - Every other instruction of the block (memory operands, the stack,
//!   CALL/RET, shifts, multiplies, system instructions) is a call into the
//!   interpreter's own code for that one instruction (`Cpu::exec_op`), so
//!   translation, page walks and their cycles, the TLB model, faults, MMIO
//!   and stores into code are the interpreter's, not a copy of them.
//! - The block's instruction costs are charged by the run loop after the
//!   block, exactly as for an interpreted block; the code returns how many
//!   instructions completed and why it stopped.
//!
//! All `unsafe` (the executable buffers and the calls into generated code)
//! is in [`native`].

pub(crate) mod native;

use crate::alu::{BinOp, Size};
use crate::cpu::code_cache::Block;
use crate::cpu::fast::{Fast, MemOp, NONE_REG};
use iced_x86::code_asm::{
    eax, ecx, qword_ptr, r12, r13, rax, rbx, rcx, rdi, rdx, rsi, CodeAssembler, CodeLabel,
};
use iced_x86::{Code, IcedError, Instruction, MemoryOperand, Register};
use std::fmt;
use std::str::FromStr;

/// Which engine runs guest code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Engine {
    /// The interpreter (the reference).
    #[default]
    Interp,
    /// The translator, with the interpreter for whatever it does not translate.
    Jit,
}

impl Engine {
    /// Both engines, the reference first.
    pub const ALL: [Engine; 2] = [Engine::Interp, Engine::Jit];

    /// The name used on command lines and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Interp => "interp",
            Engine::Jit => "jit",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Engine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "interp" => Ok(Engine::Interp),
            "jit" => Ok(Engine::Jit),
            _ => Err(format!("engine `{s}` is not `interp` or `jit`")),
        }
    }
}

/// Counters of the translator (host-side only: they do not affect guest
/// state or virtual time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JitStats {
    /// Blocks translated to host code.
    pub blocks_translated: u64,
    /// Bytes of host code generated.
    pub code_bytes: u64,
    /// Blocks left to the interpreter: nothing in them runs natively
    /// (or not 64-bit code).
    pub blocks_interpreted: u64,
    /// Blocks the translator or the host refused (a translator bug, or no
    /// executable memory); interpreted instead.
    pub blocks_failed: u64,
}

/// How a translated block stopped, in the low byte of its return value;
/// the index of the instruction it stopped at is in the bits above.
pub(crate) mod status {
    /// Keep going (only ever returned by the per-instruction call-out).
    pub const NEXT: u64 = 0;
    /// Instruction `k` completed and left the block: go on at `Cpu::next_rip`.
    pub const LEAVE: u64 = 1;
    /// Instruction `k` faulted (the fault is in `Cpu::jit_fault`); it did
    /// not complete.
    pub const FAULT: u64 = 2;
    /// Instruction `k` completed and execution goes on after it (the end of
    /// the block, or a store into cached code).
    pub const NEXT_IP: u64 = 3;
}

/// Where the generated code finds the guest state: byte offsets from the
/// `Cpu` it is given (computed by `Cpu::jit_offsets`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Offsets {
    pub gpr: i32,
    pub rflags: i32,
    pub next_rip: i32,
}

/// The arithmetic flags (CF PF AF ZF SF OF).
const ARITH: u32 = 0x8d5;
const AF: u32 = 0x10;

/// Whether the translator runs this fast form as host code (otherwise it
/// is a call into the interpreter for that instruction).
pub(crate) fn is_native(f: &Fast) -> bool {
    matches!(
        f,
        Fast::MovRR { .. }
            | Fast::MovRI { .. }
            | Fast::Lea { .. }
            | Fast::AluRR { .. }
            | Fast::AluRI { .. }
            | Fast::TestRR { .. }
            | Fast::TestRI { .. }
            | Fast::IncDec { .. }
            | Fast::ExtendR { .. }
            | Fast::CmovR { .. }
            | Fast::Nop
            | Fast::Jcc { .. }
            | Fast::Jmp { .. }
    )
}

/// Why a block was not translated.
#[derive(Debug)]
#[allow(dead_code)] // The payloads are for debugging output.
pub(crate) enum NotTranslated {
    /// Not 64-bit code, or nothing in it would run natively.
    NothingNative,
    /// A form the translator has no host code for (a translator bug: the
    /// block is interpreted instead).
    Unsupported(&'static str),
    /// The assembler refused something (a translator bug; the block is
    /// interpreted instead).
    Asm(IcedError),
}

impl From<IcedError> for NotTranslated {
    fn from(e: IcedError) -> Self {
        NotTranslated::Asm(e)
    }
}

/// Host code for `block`: position-independent bytes to be installed in a
/// [`native::Arena`]. `helper` is the address of the per-instruction
/// call-out into the interpreter.
pub(crate) fn translate(block: &Block, o: Offsets, helper: u64) -> Result<Vec<u8>, NotTranslated> {
    if block.bits != 64 || !block.insns.iter().any(|op| is_native(&op.fast)) {
        return Err(NotTranslated::NothingNative);
    }
    let mut e = Emitter {
        a: CodeAssembler::new(64)?,
        o,
        host_valid: false,
        dirty: false,
        af_clear: false,
        exits: Vec::new(),
        helper,
    };
    let mut epilogue = e.a.create_label();
    // Prologue: rbx = cpu, r12 = memory, r13 = block. Three pushes after
    // the return address leave rsp 16-byte aligned for the call-outs.
    e.a.push(rbx)?;
    e.a.push(r12)?;
    e.a.push(r13)?;
    e.a.mov(rbx, rdi)?;
    e.a.mov(r12, rsi)?;
    e.a.mov(r13, rdx)?;
    let last = block.insns.len() - 1;
    let mut ended = false;
    for (k, op) in block.insns.iter().enumerate() {
        match op.fast {
            Fast::Jmp { target } => {
                // Always the last instruction of a block.
                e.capture_if_dirty()?;
                e.set_next_rip(target)?;
                e.a.mov(eax, (status::LEAVE | (k as u64) << 8) as u32)?;
                e.a.jmp(epilogue)?;
                ended = true;
                break;
            }
            f if is_native(&f) => e.native(k, &f)?,
            _ => e.call_out(k, epilogue)?,
        }
    }
    if !ended {
        e.capture_if_dirty()?;
        e.a.mov(eax, (status::NEXT_IP | (last as u64) << 8) as u32)?;
        e.a.jmp(epilogue)?;
    }
    // Taken conditional branches leave through these stubs.
    let exits = std::mem::take(&mut e.exits);
    for mut x in exits {
        e.a.set_label(&mut x.label)?;
        if x.dirty {
            e.capture(x.af_clear)?;
        }
        e.set_next_rip(x.target)?;
        e.a.mov(eax, (status::LEAVE | (x.k as u64) << 8) as u32)?;
        e.a.jmp(epilogue)?;
    }
    e.a.set_label(&mut epilogue)?;
    e.a.pop(r13)?;
    e.a.pop(r12)?;
    e.a.pop(rbx)?;
    e.a.ret()?;
    Ok(e.a.assemble(0)?)
}

/// A taken conditional branch's way out, emitted after the block.
struct Exit {
    label: CodeLabel,
    k: usize,
    target: u64,
    /// The guest flags in the host flags were not yet written back.
    dirty: bool,
    af_clear: bool,
}

struct Emitter {
    a: CodeAssembler,
    o: Offsets,
    /// The host flags hold the guest's arithmetic flags.
    host_valid: bool,
    /// ... and they differ from `state.rflags` (must be written back).
    dirty: bool,
    /// The last flag writer was a logic op: AF is clear for the interpreter.
    af_clear: bool,
    exits: Vec<Exit>,
    helper: u64,
}

/// Index of an operand size in the per-size code tables.
fn si(size: Size) -> usize {
    match size {
        Size::B1 => 0,
        Size::B2 => 1,
        Size::B4 => 2,
        Size::B8 => 3,
    }
}

const ACC: [Register; 4] = [Register::AL, Register::AX, Register::EAX, Register::RAX];
const SEC: [Register; 4] = [Register::CL, Register::CX, Register::ECX, Register::RCX];
const MOV_R_RM: [Code; 4] = [
    Code::Mov_r8_rm8,
    Code::Mov_r16_rm16,
    Code::Mov_r32_rm32,
    Code::Mov_r64_rm64,
];
const MOV_RM_R: [Code; 4] = [
    Code::Mov_rm8_r8,
    Code::Mov_rm16_r16,
    Code::Mov_rm32_r32,
    Code::Mov_rm64_r64,
];

/// Expands to the three code tables of [`alu_codes`] for `op`.
macro_rules! paste_codes {
    ($op:ident) => {
        match $op {
            BinOp::Add => (
                [
                    Code::Add_rm8_r8,
                    Code::Add_rm16_r16,
                    Code::Add_rm32_r32,
                    Code::Add_rm64_r64,
                ],
                [
                    Code::Add_r8_rm8,
                    Code::Add_r16_rm16,
                    Code::Add_r32_rm32,
                    Code::Add_r64_rm64,
                ],
                [
                    Code::Add_rm8_imm8,
                    Code::Add_rm16_imm16,
                    Code::Add_rm32_imm32,
                    Code::Add_rm64_imm32,
                ],
            ),
            BinOp::Or => (
                [
                    Code::Or_rm8_r8,
                    Code::Or_rm16_r16,
                    Code::Or_rm32_r32,
                    Code::Or_rm64_r64,
                ],
                [
                    Code::Or_r8_rm8,
                    Code::Or_r16_rm16,
                    Code::Or_r32_rm32,
                    Code::Or_r64_rm64,
                ],
                [
                    Code::Or_rm8_imm8,
                    Code::Or_rm16_imm16,
                    Code::Or_rm32_imm32,
                    Code::Or_rm64_imm32,
                ],
            ),
            BinOp::Adc => (
                [
                    Code::Adc_rm8_r8,
                    Code::Adc_rm16_r16,
                    Code::Adc_rm32_r32,
                    Code::Adc_rm64_r64,
                ],
                [
                    Code::Adc_r8_rm8,
                    Code::Adc_r16_rm16,
                    Code::Adc_r32_rm32,
                    Code::Adc_r64_rm64,
                ],
                [
                    Code::Adc_rm8_imm8,
                    Code::Adc_rm16_imm16,
                    Code::Adc_rm32_imm32,
                    Code::Adc_rm64_imm32,
                ],
            ),
            BinOp::Sbb => (
                [
                    Code::Sbb_rm8_r8,
                    Code::Sbb_rm16_r16,
                    Code::Sbb_rm32_r32,
                    Code::Sbb_rm64_r64,
                ],
                [
                    Code::Sbb_r8_rm8,
                    Code::Sbb_r16_rm16,
                    Code::Sbb_r32_rm32,
                    Code::Sbb_r64_rm64,
                ],
                [
                    Code::Sbb_rm8_imm8,
                    Code::Sbb_rm16_imm16,
                    Code::Sbb_rm32_imm32,
                    Code::Sbb_rm64_imm32,
                ],
            ),
            BinOp::And => (
                [
                    Code::And_rm8_r8,
                    Code::And_rm16_r16,
                    Code::And_rm32_r32,
                    Code::And_rm64_r64,
                ],
                [
                    Code::And_r8_rm8,
                    Code::And_r16_rm16,
                    Code::And_r32_rm32,
                    Code::And_r64_rm64,
                ],
                [
                    Code::And_rm8_imm8,
                    Code::And_rm16_imm16,
                    Code::And_rm32_imm32,
                    Code::And_rm64_imm32,
                ],
            ),
            BinOp::Sub => (
                [
                    Code::Sub_rm8_r8,
                    Code::Sub_rm16_r16,
                    Code::Sub_rm32_r32,
                    Code::Sub_rm64_r64,
                ],
                [
                    Code::Sub_r8_rm8,
                    Code::Sub_r16_rm16,
                    Code::Sub_r32_rm32,
                    Code::Sub_r64_rm64,
                ],
                [
                    Code::Sub_rm8_imm8,
                    Code::Sub_rm16_imm16,
                    Code::Sub_rm32_imm32,
                    Code::Sub_rm64_imm32,
                ],
            ),
            BinOp::Xor => (
                [
                    Code::Xor_rm8_r8,
                    Code::Xor_rm16_r16,
                    Code::Xor_rm32_r32,
                    Code::Xor_rm64_r64,
                ],
                [
                    Code::Xor_r8_rm8,
                    Code::Xor_r16_rm16,
                    Code::Xor_r32_rm32,
                    Code::Xor_r64_rm64,
                ],
                [
                    Code::Xor_rm8_imm8,
                    Code::Xor_rm16_imm16,
                    Code::Xor_rm32_imm32,
                    Code::Xor_rm64_imm32,
                ],
            ),
            BinOp::Cmp => (
                [
                    Code::Cmp_rm8_r8,
                    Code::Cmp_rm16_r16,
                    Code::Cmp_rm32_r32,
                    Code::Cmp_rm64_r64,
                ],
                [
                    Code::Cmp_r8_rm8,
                    Code::Cmp_r16_rm16,
                    Code::Cmp_r32_rm32,
                    Code::Cmp_r64_rm64,
                ],
                [
                    Code::Cmp_rm8_imm8,
                    Code::Cmp_rm16_imm16,
                    Code::Cmp_rm32_imm32,
                    Code::Cmp_rm64_imm32,
                ],
            ),
        }
    };
}

/// `op rm, r`, `op r, rm` and `op rm, imm` codes of an ALU operation.
fn alu_codes(op: BinOp) -> ([Code; 4], [Code; 4], [Code; 4]) {
    paste_codes!(op)
}

/// CMOVcc r, r/m for condition `cc` (0-15, the encoding order) and a 16-,
/// 32- or 64-bit size; `None` if iced's code table is not laid out as
/// assumed (checked by a test).
fn cmov_code(cc: u8, size: Size) -> Option<Code> {
    let k = match size {
        Size::B2 => 0,
        Size::B4 => 1,
        Size::B8 => 2,
        Size::B1 => return None,
    };
    let code = Code::try_from(Code::Cmovo_r16_rm16 as usize + cc as usize * 3 + k).ok()?;
    let want = [
        iced_x86::Mnemonic::Cmovo,
        iced_x86::Mnemonic::Cmovno,
        iced_x86::Mnemonic::Cmovb,
        iced_x86::Mnemonic::Cmovae,
        iced_x86::Mnemonic::Cmove,
        iced_x86::Mnemonic::Cmovne,
        iced_x86::Mnemonic::Cmovbe,
        iced_x86::Mnemonic::Cmova,
        iced_x86::Mnemonic::Cmovs,
        iced_x86::Mnemonic::Cmovns,
        iced_x86::Mnemonic::Cmovp,
        iced_x86::Mnemonic::Cmovnp,
        iced_x86::Mnemonic::Cmovl,
        iced_x86::Mnemonic::Cmovge,
        iced_x86::Mnemonic::Cmovle,
        iced_x86::Mnemonic::Cmovg,
    ];
    (code.mnemonic() == want[cc as usize & 15]).then_some(code)
}

impl Emitter {
    fn add(&mut self, i: Result<Instruction, IcedError>) -> Result<(), NotTranslated> {
        Ok(self.a.add_instruction(i?)?)
    }

    /// Guest register `idx` in the `Cpu`.
    fn g(&self, idx: u8) -> MemoryOperand {
        MemoryOperand::with_base_displ(Register::RBX, (self.o.gpr + 8 * (idx as i32 & 15)) as i64)
    }

    fn field(&self, off: i32) -> MemoryOperand {
        MemoryOperand::with_base_displ(Register::RBX, off as i64)
    }

    /// `acc = gpr[idx]` at `size` (a 32-bit load zero-extends into rax).
    fn load(&mut self, reg: [Register; 4], idx: u8, size: Size) -> Result<(), NotTranslated> {
        let m = self.g(idx);
        self.add(Instruction::with2(MOV_R_RM[si(size)], reg[si(size)], m))
    }

    /// `gpr[idx] = acc` with the interpreter's partial-register rule: 8-
    /// and 16-bit writes keep the bits above, a 32-bit write zero-extends
    /// (the 32-bit value is already zero-extended in rax).
    fn store_acc(&mut self, idx: u8, size: Size) -> Result<(), NotTranslated> {
        let m = self.g(idx);
        let r = match size {
            Size::B4 | Size::B8 => Register::RAX,
            s => ACC[si(s)],
        };
        let code = match size {
            Size::B4 | Size::B8 => Code::Mov_rm64_r64,
            s => MOV_RM_R[si(s)],
        };
        self.add(Instruction::with2(code, m, r))
    }

    /// Writes the host's arithmetic flags into `state.rflags` (clobbers
    /// rax, rcx and the host flags).
    fn capture(&mut self, af_clear: bool) -> Result<(), NotTranslated> {
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

    fn capture_if_dirty(&mut self) -> Result<(), NotTranslated> {
        if self.dirty {
            self.capture(self.af_clear)?;
            self.dirty = false;
        }
        Ok(())
    }

    /// Makes the host flags hold the guest's, loading them from
    /// `state.rflags` if needed (the host's other flags are kept).
    fn need_flags(&mut self) -> Result<(), NotTranslated> {
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

    /// An instruction that sets every arithmetic flag.
    fn wrote_flags(&mut self, logic: bool) {
        self.host_valid = true;
        self.dirty = true;
        self.af_clear = logic;
    }

    fn set_next_rip(&mut self, target: u64) -> Result<(), NotTranslated> {
        self.a.mov(rax, target)?;
        let m = self.field(self.o.next_rip);
        self.add(Instruction::with2(Code::Mov_rm64_r64, m, Register::RAX))
    }

    /// Instruction `k` through the interpreter.
    fn call_out(&mut self, k: usize, epilogue: CodeLabel) -> Result<(), NotTranslated> {
        self.capture_if_dirty()?;
        self.a.mov(rdi, rbx)?;
        self.a.mov(rsi, r12)?;
        self.a.mov(rdx, r13)?;
        self.a.mov(ecx, k as u32)?;
        self.a.mov(rax, self.helper)?;
        self.a.call(rax)?;
        self.a.test(rax, rax)?;
        self.a.jne(epilogue)?;
        self.host_valid = false;
        Ok(())
    }

    /// Loads the effective address of `m` (no segment base) into rax
    /// without touching the flags.
    fn lea(&mut self, m: &MemOp) -> Result<(), NotTranslated> {
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
        Ok(())
    }

    fn native(&mut self, k: usize, f: &Fast) -> Result<(), NotTranslated> {
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
                self.add(Instruction::with2(code, r, m))?;
                if dsize == Size::B4 {
                    self.a.mov(eax, eax)?;
                }
                self.store_acc(dst, dsize)?;
            }
            Fast::AluRR { op, dst, src, size } => {
                if matches!(op, BinOp::Adc | BinOp::Sbb) {
                    self.need_flags()?;
                }
                let (rm_r, r_rm, _) = alu_codes(op);
                if size == Size::B4 {
                    self.load(ACC, dst, size)?;
                    let m = self.g(src);
                    self.add(Instruction::with2(r_rm[2], Register::EAX, m))?;
                    if op != BinOp::Cmp {
                        self.store_acc(dst, size)?;
                    }
                } else {
                    self.load(SEC, src, size)?;
                    let m = self.g(dst);
                    self.add(Instruction::with2(rm_r[si(size)], m, SEC[si(size)]))?;
                }
                self.wrote_flags(matches!(op, BinOp::And | BinOp::Or | BinOp::Xor));
            }
            Fast::AluRI { op, dst, size, imm } => {
                if matches!(op, BinOp::Adc | BinOp::Sbb) {
                    self.need_flags()?;
                }
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
                    Size::B8 => self.add(Instruction::with2(Code::Test_rm64_imm32, m, imm as i32))?,
                    s => {
                        let code =
                            [Code::Test_rm8_imm8, Code::Test_rm16_imm16, Code::Test_rm32_imm32]
                                [si(s)];
                        self.add(Instruction::with2(code, m, imm as u32))?;
                    }
                }
                self.wrote_flags(true);
            }
            Fast::IncDec { dst, size, dec } => {
                // INC and DEC keep CF: the guest's must be in the host flags.
                self.need_flags()?;
                let codes = if dec {
                    [Code::Dec_rm8, Code::Dec_rm16, Code::Dec_rm32, Code::Dec_rm64]
                } else {
                    [Code::Inc_rm8, Code::Inc_rm16, Code::Inc_rm32, Code::Inc_rm64]
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
                let code = cmov_code(cc, size)
                    .ok_or(NotTranslated::Unsupported("CMOVcc of this size"))?;
                self.load(ACC, dst, size)?;
                let m = self.g(src);
                self.add(Instruction::with2(code, ACC[si(size)], m))?;
                self.store_acc(dst, size)?;
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

    fn jcc(&mut self, cc: u8, l: CodeLabel) -> Result<(), NotTranslated> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmov_codes_follow_the_condition_order() {
        for cc in 0..16 {
            for size in [Size::B2, Size::B4, Size::B8] {
                let code = cmov_code(cc, size).expect("cmov code");
                let want_reg = match size {
                    Size::B2 => Register::AX,
                    Size::B4 => Register::EAX,
                    _ => Register::RAX,
                };
                let i = Instruction::with2(code, want_reg, MemoryOperand::with_base(Register::RBX))
                    .expect("operands fit");
                assert_eq!(i.op0_register(), want_reg);
            }
        }
    }

    #[test]
    fn engine_names_round_trip() {
        for e in Engine::ALL {
            assert_eq!(e.name().parse::<Engine>(), Ok(e));
        }
        assert!("qemu".parse::<Engine>().is_err());
    }
}
