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

use crate::alu::{BinOp, ShiftOp, Size};
use crate::cpu::code_cache::Block;
use crate::cpu::fast::{Fast, MemOp, NONE_REG};
use crate::cpu::l1tlb::{SLOTS, SLOT_BYTES};
use iced_x86::code_asm::{
    byte_ptr, dword_ptr, eax, ecx, edx, qword_ptr, r10, r10d, r11, r12, r13, r14, r15, r8, r9, rax,
    rbp, rbx, rcx, rdi, rdx, rsi, rsp, CodeAssembler, CodeLabel,
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
    /// The TLB's epoch and the CPU's mode epoch: a first-level TLB slot is
    /// valid while both equal the ones it recorded.
    pub tlb_epoch: i32,
    pub mode_epoch: i32,
    /// Chaining: the counters a chained block updates itself, the stop
    /// conditions it checks, and where it reports the block it ended in.
    pub instructions: i32,
    pub cycles: i32,
    pub next_timer_cycle: i32,
    pub check_events: i32,
    pub jit_stop: i32,
    pub jit_chained: i32,
    pub jit_chain_rip: i32,
    /// `CycleCosts::instruction` and `multiply` of the CPU.
    pub instruction_cost: u64,
    pub multiply_cost: u64,
}

/// Slots of the chaining table.
pub(crate) const CHAIN_SLOTS: usize = 4096;

/// One slot of the chaining table: a translated block generated code may
/// jump to directly, valid while its frame's code-write generation is the
/// one recorded (`Cpu` keeps the block, and so its code, alive while it is
/// in the table).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct ChainEntry {
    pub rip: u64,
    pub hpa: u64,
    pub generation: u64,
    /// Chained entry point of its translation.
    pub entry: u64,
    /// The `Block` (what call-outs index).
    pub block: u64,
    /// Translated for CPL 3.
    pub user: u64,
}

const CHAIN_ENTRY_BYTES: i32 = 48;
const _: () = assert!(std::mem::size_of::<ChainEntry>() == CHAIN_ENTRY_BYTES as usize);

/// The slot of `rip` in the chaining table (the generated code computes
/// the same).
pub(crate) fn chain_slot(rip: u64) -> usize {
    ((rip ^ (rip >> 12)) as usize) & (CHAIN_SLOTS - 1)
}

/// Offsets in [`native::Env`].
const ENV_L1: i32 = 0;
const ENV_MEM_BASE: i32 = 8;
const ENV_MEM_SIZE: i32 = 16;
const ENV_CODE_FRAMES: i32 = 24;
const ENV_CYCLE_LIMIT: i32 = 32;
const ENV_CHAIN: i32 = 40;
const ENV_CODE_GENERATION: i32 = 48;

/// The arithmetic flags (CF PF AF ZF SF OF).
const ARITH: u32 = 0x8d5;
const AF: u32 = 0x10;
const CF: u32 = 0x1;
const OF: u32 = 0x800;

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
            | Fast::Imul { .. }
    ) || matches!(
        // Counts at least the operand width (8- and 16-bit operands) leave
        // CF undefined: those go to the interpreter.
        *f,
        Fast::Shift { op: ShiftOp::Shl | ShiftOp::Sal | ShiftOp::Shr | ShiftOp::Sar, count: Some(n), size, .. }
            if (n & if size == Size::B8 { 0x3f } else { 0x1f }) < size.bits() as u8
    ) || matches!(
        // Rotates by an immediate: CF and OF are computed from the result,
        // so every count is native.
        f,
        Fast::Shift {
            op: ShiftOp::Rol | ShiftOp::Ror,
            count: Some(_),
            ..
        }
    )
}

/// Whether the translator runs this form with an inline first-level-TLB
/// access (falling back to the interpreter for that instruction on a miss,
/// a page-crossing access, a store into a code frame...).
pub(crate) fn is_inline_memory(f: &Fast) -> bool {
    let flat = |m: &MemOp| m.seg == 0;
    match f {
        Fast::MovRM { m, .. }
        | Fast::MovMR { m, .. }
        | Fast::ExtendM { m, .. }
        | Fast::AluRM { m, .. }
        | Fast::AluMR { m, .. }
        | Fast::CmovM { m, .. } => flat(m),
        Fast::MovMI { m, size, imm } | Fast::AluMI { m, size, imm, .. } => {
            flat(m) && (*size != Size::B8 || *imm as i64 == *imm as i32 as i64)
        }
        Fast::Push { .. } | Fast::Pop { .. } | Fast::Call { .. } | Fast::Ret => true,
        _ => false,
    }
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
/// [`native::Arena`], and the offset of its chained entry. `helper` is the address of the per-instruction
/// call-out into the interpreter.
///
/// `user`: the code runs at CPL 3 (the first-level TLB class of its inline
/// accesses).
pub(crate) fn translate(
    block: &Block,
    o: Offsets,
    helper: u64,
    user: bool,
) -> Result<(Vec<u8>, usize), NotTranslated> {
    if block.bits != 64
        || block.hpa == u64::MAX
        || o.instruction_cost > i32::MAX as u64
        || o.multiply_cost > i32::MAX as u64
        || !block
            .insns
            .iter()
            .any(|op| is_native(&op.fast) || is_inline_memory(&op.fast))
    {
        return Err(NotTranslated::NothingNative);
    }
    let mut e = Emitter {
        a: CodeAssembler::new(64)?,
        o,
        host_valid: false,
        dirty: false,
        af_clear: false,
        exits: Vec::new(),
        slow: Vec::new(),
        helper,
        user,
        chain: CodeLabel::default(),
        own: (block.rip, block.hpa, u64::from(block.generation)),
        self_loop: CodeLabel::default(),
        self_loop_used: false,
    };
    let mut epilogue = e.a.create_label();
    let mut chain_try = e.a.create_label();
    e.chain = chain_try;
    let mut self_loop = e.a.create_label();
    e.self_loop = self_loop;
    let mut chained_entry = e.a.create_label();
    // Prologue: rbx = cpu, r12 = memory, r13 = block, r14 = env. Six
    // pushes and 8 bytes after the return address leave rsp 16-byte
    // aligned for the call-outs.
    e.a.push(rbx)?;
    e.a.push(rbp)?;
    e.a.push(r12)?;
    e.a.push(r13)?;
    e.a.push(r14)?;
    e.a.push(r15)?;
    e.a.sub(rsp, 8)?;
    e.a.mov(rbx, rdi)?;
    e.a.mov(r12, rsi)?;
    e.a.mov(r13, rdx)?;
    e.a.mov(r14, rcx)?;
    // Chained blocks enter here, with rbx, r12, r14 as above, r13 their
    // block, and the flags in `state.rflags`.
    e.a.set_label(&mut chained_entry)?;
    e.a.nop()?;
    let last = block.insns.len() - 1;
    let mut ended = false;
    for (k, op) in block.insns.iter().enumerate() {
        match op.fast {
            Fast::Jmp { target } => {
                // Always the last instruction of a block.
                e.capture_if_dirty()?;
                e.leave_to(k, target)?;
                ended = true;
                break;
            }
            Fast::Call { target } => {
                e.inline_memory(k, &op.fast, op.next_ip, epilogue)?;
                e.leave_to(k, target)?;
                ended = true;
                break;
            }
            Fast::Ret => {
                // Leaves through the inline code (or the call-out).
                e.inline_memory(k, &op.fast, op.next_ip, epilogue)?;
                ended = true;
                break;
            }
            f if is_native(&f) => e.native(k, &f)?,
            f if is_inline_memory(&f) => e.inline_memory(k, &f, op.next_ip, epilogue)?,
            _ => e.call_out(k, epilogue)?,
        }
    }
    if !ended {
        e.capture_if_dirty()?;
        e.leave_to(last, block.insns[last].next_ip)?;
    }
    // Slow paths of inline accesses: the instruction through the
    // interpreter, then back (with the flags in the host if the fast path
    // leaves them there).
    let slow = std::mem::take(&mut e.slow);
    for mut x in slow {
        e.a.set_label(&mut x.label)?;
        e.emit_call(x.k, epilogue)?;
        if x.flags_in_host {
            e.host_valid = false;
            e.need_flags()?;
        }
        e.a.jmp(x.cont)?;
    }
    // Taken conditional branches leave through these stubs.
    let exits = std::mem::take(&mut e.exits);
    for mut x in exits {
        e.a.set_label(&mut x.label)?;
        if x.dirty {
            e.capture(x.af_clear)?;
        }
        e.leave_to(x.k, x.target)?;
    }
    e.a.set_label(&mut chain_try)?;
    e.chain_try(epilogue, None)?;
    if e.self_loop_used {
        e.a.set_label(&mut self_loop)?;
        e.chain_try(epilogue, Some(chained_entry))?;
    }
    e.a.set_label(&mut epilogue)?;
    e.a.add(rsp, 8)?;
    e.a.pop(r15)?;
    e.a.pop(r14)?;
    e.a.pop(r13)?;
    e.a.pop(r12)?;
    e.a.pop(rbp)?;
    e.a.pop(rbx)?;
    e.a.ret()?;
    let r = e.a.assemble_options(
        0,
        iced_x86::BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
    )?;
    let chain_offset = r.label_ip(&chained_entry)? as usize;
    Ok((r.inner.code_buffer, chain_offset))
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

/// The slow path of an inline access, emitted after the block.
struct Slow {
    label: CodeLabel,
    k: usize,
    /// Where the fast path ends.
    cont: CodeLabel,
    /// The fast path leaves the guest flags in the host flags; so must
    /// the slow path.
    flags_in_host: bool,
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
    slow: Vec<Slow>,
    helper: u64,
    user: bool,
    /// The block's exit that tries to chain (see [`Emitter::chain_try`]).
    chain: CodeLabel,
    /// This block's RIP, host-physical address and code-write generation.
    own: (u64, u64, u64),
    /// The exit to this block's own start (a loop), chaining to itself
    /// without the table lookup.
    self_loop: CodeLabel,
    self_loop_used: bool,
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
const DXR: [Register; 4] = [Register::DL, Register::DX, Register::EDX, Register::RDX];
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

    /// MOVZX/MOVSX/MOVSXD (or a plain move for equal sizes): `gpr[dst]`
    /// at `dsize` = `src` (a guest register slot or the host pointer of a
    /// memory operand) at `ssize`, zero- or sign-extended.
    fn extend(
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

    /// ADC and SBB read CF: the guest's flags must be in the host's.
    fn need_flags_for(&mut self, op: BinOp) -> Result<(), NotTranslated> {
        if matches!(op, BinOp::Adc | BinOp::Sbb) {
            self.need_flags()?;
        }
        Ok(())
    }

    /// `gpr[dst] op= src` at `size` (CMP only compares), `src` a host
    /// register (not rax) holding the operand; a 32-bit result is
    /// zero-extended. The guest's flags must already be in the host's for
    /// ADC/SBB.
    fn alu_gpr(
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

    /// An instruction that sets every arithmetic flag.
    fn wrote_flags(&mut self, logic: bool) {
        self.host_valid = true;
        self.dirty = true;
        self.af_clear = logic;
    }

    /// Instruction `k` completed and execution goes on at `target` (the
    /// flags written back): try to chain.
    fn leave_to(&mut self, k: usize, target: u64) -> Result<(), NotTranslated> {
        self.a.mov(rax, target)?;
        self.a.mov(ecx, k as u32)?;
        if target == self.own.0 {
            self.self_loop_used = true;
            self.a.jmp(self.self_loop)?;
        } else {
            self.a.jmp(self.chain)?;
        }
        Ok(())
    }

    /// The block ends after instruction `ecx` with the next RIP in rax.
    /// Where the run loop would go straight on to the next block (no
    /// call-out asked to stop, no events to check, cycle limit and timer
    /// deadline not reached) and the next block is translated, in the
    /// chaining table for this frame generation and privilege, and its
    /// fetch is a first-level iTLB hit (so fetching it changes nothing),
    /// jump to it after counting this block's instructions and cycles as
    /// the run loop would. Otherwise return: leave at instruction `ecx`.
    ///
    /// With `own_entry` the target is this block's own start (a loop): the
    /// table would give this block (the block running is always in the
    /// table: the run loop puts the block it runs there, chaining finds
    /// blocks there, and nothing changes the table while generated code
    /// runs), so instead of the lookup the fetched frame and its code-write
    /// generation are compared with this block's, and the jump goes
    /// straight to `own_entry`.
    fn chain_try(
        &mut self,
        epilogue: CodeLabel,
        own_entry: Option<CodeLabel>,
    ) -> Result<(), NotTranslated> {
        let mut out = self.a.create_label();
        let o = self.o;
        self.a.mov(qword_ptr(rbx + o.next_rip), rax)?;
        self.a.lea(r8, qword_ptr(rcx + 1))?;
        self.a.cmp(byte_ptr(rbx + o.jit_stop), 0)?;
        self.a.jne(out)?;
        self.a.cmp(byte_ptr(rbx + o.check_events), 0)?;
        self.a.jne(out)?;
        self.a.imul_3(r9, r8, o.instruction_cost as i32)?;
        self.a.add(r9, qword_ptr(rbx + o.cycles))?;
        self.a.cmp(r9, qword_ptr(r14 + ENV_CYCLE_LIMIT))?;
        self.a.jae(out)?;
        self.a.cmp(r9, qword_ptr(rbx + o.next_timer_cycle))?;
        self.a.jae(out)?;
        // The fetch: a first-level iTLB hit for this privilege.
        self.a.mov(rdx, rax)?;
        self.a.shr(rdx, 12)?;
        self.a.inc(rdx)?;
        self.a.mov(ecx, edx)?;
        self.a.and(ecx, (SLOTS - 1) as i32)?;
        self.a.shl(ecx, SLOT_BYTES.trailing_zeros())?;
        self.a.add(rcx, qword_ptr(r14 + ENV_L1))?;
        let class = 2 * 2 + self.user as usize;
        let c = (class * SLOTS * SLOT_BYTES) as i32;
        self.a.cmp(rdx, qword_ptr(rcx + c))?;
        self.a.jne(out)?;
        self.a.mov(rdx, qword_ptr(rcx + c + 16))?;
        self.a.cmp(rdx, qword_ptr(rbx + o.tlb_epoch))?;
        self.a.jne(out)?;
        self.a.mov(rdx, qword_ptr(rcx + c + 24))?;
        self.a.cmp(rdx, qword_ptr(rbx + o.mode_epoch))?;
        self.a.jne(out)?;
        self.a.mov(rdx, qword_ptr(rcx + c + 8))?;
        self.a.cmp(rdx, qword_ptr(r14 + ENV_MEM_SIZE))?;
        self.a.jae(out)?;
        self.a.mov(r11, rdx)?;
        self.a.shr(r11, 12)?;
        self.a.mov(ecx, eax)?;
        self.a.and(ecx, 0xfff)?;
        self.a.or(rdx, rcx)?;
        if let Some(entry) = own_entry {
            let (_, hpa, generation) = self.own;
            self.a.mov(r10, hpa)?;
            self.a.cmp(rdx, r10)?;
            self.a.jne(out)?;
            self.a.mov(rcx, qword_ptr(r14 + ENV_CODE_GENERATION))?;
            self.a.mov(ecx, dword_ptr(rcx + r11 * 4))?;
            self.a.mov(r10, generation)?;
            self.a.cmp(rcx, r10)?;
            self.a.jne(out)?;
            self.count_chained()?;
            self.a.jmp(entry)?;
        } else {
            self.chain_lookup(out)?;
        }
        self.a.set_label(&mut out)?;
        self.a.lea(rax, qword_ptr(r8 - 1))?;
        self.a.shl(rax, 8)?;
        self.a.or(rax, status::LEAVE as i32)?;
        self.a.jmp(epilogue)?;
        Ok(())
    }

    /// Chaining through the table: rax the RIP, rdx its host-physical
    /// address, r11 its frame.
    fn chain_lookup(&mut self, out: CodeLabel) -> Result<(), NotTranslated> {
        // The chaining table's slot for this RIP.
        self.a.mov(r10, rax)?;
        self.a.shr(r10, 12)?;
        self.a.xor(r10, rax)?;
        self.a.and(r10d, (CHAIN_SLOTS - 1) as i32)?;
        self.a.imul_3(r10, r10, CHAIN_ENTRY_BYTES)?;
        self.a.add(r10, qword_ptr(r14 + ENV_CHAIN))?;
        self.a.cmp(rax, qword_ptr(r10))?;
        self.a.jne(out)?;
        self.a.cmp(rdx, qword_ptr(r10 + 8))?;
        self.a.jne(out)?;
        self.a.cmp(qword_ptr(r10 + 40), self.user as i32)?;
        self.a.jne(out)?;
        self.a.mov(rcx, qword_ptr(r14 + ENV_CODE_GENERATION))?;
        self.a.mov(ecx, dword_ptr(rcx + r11 * 4))?;
        self.a.cmp(rcx, qword_ptr(r10 + 16))?;
        self.a.jne(out)?;
        self.count_chained()?;
        self.a.mov(r13, qword_ptr(r10 + 32))?;
        self.a.jmp(qword_ptr(r10 + 24))?;
        Ok(())
    }

    /// Going on to the next block: this block's counts (r8 instructions,
    /// r9 the cycle count after them), as the run loop adds them, and the
    /// RIP chained to (rax).
    fn count_chained(&mut self) -> Result<(), NotTranslated> {
        let o = self.o;
        self.a.add(qword_ptr(rbx + o.instructions), r8)?;
        self.a.mov(qword_ptr(rbx + o.cycles), r9)?;
        self.a.mov(qword_ptr(rbx + o.jit_chained), 1)?;
        self.a.mov(qword_ptr(rbx + o.jit_chain_rip), rax)?;
        Ok(())
    }

    /// Instruction `k` through the interpreter.
    fn call_out(&mut self, k: usize, epilogue: CodeLabel) -> Result<(), NotTranslated> {
        self.capture_if_dirty()?;
        self.emit_call(k, epilogue)?;
        self.host_valid = false;
        Ok(())
    }

    /// The call of [`Self::call_out`], the flags already written back.
    fn emit_call(&mut self, k: usize, epilogue: CodeLabel) -> Result<(), NotTranslated> {
        self.a.mov(rdi, rbx)?;
        self.a.mov(rsi, r12)?;
        self.a.mov(rdx, r13)?;
        self.a.mov(ecx, k as u32)?;
        self.a.mov(rax, self.helper)?;
        self.a.call(rax)?;
        self.a.test(rax, rax)?;
        self.a.jne(epilogue)?;
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
                self.capture_if_dirty()?;
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

    /// With the linear address in rax, leaves in rdx the host address of
    /// an access of `size` bytes, or jumps to `slow` when the first-level
    /// TLB (the class of this kind and privilege) does not hold the page
    /// for the current TLB and mode epochs, the access crosses the page,
    /// the frame is outside memory, or a store would hit a frame holding
    /// decoded code. On the fast path nothing is changed, exactly as an L1
    /// hit in the interpreter changes nothing. Clobbers rcx and the flags.
    fn fast_access(
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
    fn load_host(&mut self, reg: [Register; 4], size: Size) -> Result<(), NotTranslated> {
        let m = MemoryOperand::with_base(Register::RDX);
        self.add(Instruction::with2(MOV_R_RM[si(size)], reg[si(size)], m))
    }

    /// A memory form with an inline access (see [`is_inline_memory`]);
    /// instruction `k` through the interpreter when the fast path cannot
    /// serve it.
    fn inline_memory(
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
                self.a.mov(rdx, rcx)?;
                self.a.shl(rdx, 16)?;
                self.a.sar(rdx, 16)?;
                self.a.cmp(rdx, rcx)?;
                self.a.jne(slow)?;
                self.a.lea(rax, qword_ptr(rax + 8))?;
                self.store_acc(4, Size::B8)?;
                self.a.mov(rax, rcx)?;
                self.a.mov(ecx, k as u32)?;
                self.a.jmp(self.chain)?;
                // The call-out always leaves the block: it never comes back.
                self.slow.push(Slow {
                    label: slow,
                    k,
                    cont: epilogue,
                    flags_in_host: false,
                });
                return Ok(());
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

    /// SHL/SAL/SHR/SAR of a register by an immediate. A masked count of 0
    /// changes no flags (a 32-bit destination is still zero-extended);
    /// otherwise the host gives the result, CF, SF, ZF and PF, and the
    /// flags the SDM leaves undefined are set as the interpreter's `alu`
    /// sets them: AF set, OF = MSB(result) XOR CF (SHL), bit `bits - 2` of
    /// the result (SHR), clear (SAR), whatever the count.
    fn shift_imm(
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
        self.capture_if_dirty()?;
        let codes = match op {
            ShiftOp::Shl | ShiftOp::Sal => [
                Code::Shl_rm8_imm8,
                Code::Shl_rm16_imm8,
                Code::Shl_rm32_imm8,
                Code::Shl_rm64_imm8,
            ],
            ShiftOp::Shr => [
                Code::Shr_rm8_imm8,
                Code::Shr_rm16_imm8,
                Code::Shr_rm32_imm8,
                Code::Shr_rm64_imm8,
            ],
            ShiftOp::Sar => [
                Code::Sar_rm8_imm8,
                Code::Sar_rm16_imm8,
                Code::Sar_rm32_imm8,
                Code::Sar_rm64_imm8,
            ],
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

    /// ROL/ROR of a register by a masked, nonzero immediate count. The
    /// host rotates (by the count modulo the width, as `alu::rol`/`ror`
    /// do); CF and OF are computed from the result as the interpreter's
    /// `alu` computes them (ROL: CF = bit 0, OF = MSB XOR CF; ROR: CF =
    /// MSB, OF = MSB XOR the bit below it), not taken from the host, whose
    /// OF is undefined for counts above 1; SF ZF AF PF are kept.
    fn rotate_imm(&mut self, op: ShiftOp, dst: u8, size: Size, n: u8) -> Result<(), NotTranslated> {
        let codes = if op == ShiftOp::Rol {
            [
                Code::Rol_rm8_imm8,
                Code::Rol_rm16_imm8,
                Code::Rol_rm32_imm8,
                Code::Rol_rm64_imm8,
            ]
        } else {
            [
                Code::Ror_rm8_imm8,
                Code::Ror_rm16_imm8,
                Code::Ror_rm32_imm8,
                Code::Ror_rm64_imm8,
            ]
        };
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
