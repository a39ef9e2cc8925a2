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
//!   CMOVcc, Jcc, JMP, shifts and rotates, IMUL, one-operand MUL/DIV, the
//!   sign extensions) run as the same host instruction on the same operand
//!   width; the guest's arithmetic flags live in the host flags between
//!   them and are written back (captured) before anything that may look at
//!   them: a call out, a block exit. The flags the SDM leaves undefined are
//!   made the interpreter's (AF clear after AND/OR/XOR/TEST).
//! - Memory operands, the stack, CALL/RET and indirect CALL/JMP use the
//!   first-level TLB inline; their slow paths and every other instruction
//!   of the block (system instructions, string instructions, rare forms)
//!   are a call into the
//!   interpreter's own code for that one instruction (`Cpu::exec_op`), so
//!   translation, page walks and their cycles, the TLB model, faults, MMIO
//!   and stores into code are the interpreter's, not a copy of them.
//! - The block's instruction costs are charged by the run loop after the
//!   block, exactly as for an interpreted block; the code returns how many
//!   instructions completed and why it stopped.
//!
//! All `unsafe` (the executable buffers and the calls into generated code)
//! is in [`native`].

mod chain;
mod codes;
mod flags;
mod forms;
mod memory;
pub(crate) mod native;
pub(crate) mod profile;

use codes::*;

use crate::alu::{BinOp, ShiftOp, Size};
use crate::cpu::code_cache::Block;
use crate::cpu::fast::{Fast, MemOp, Op, NONE_REG};
use crate::cpu::l1tlb::{SLOTS, SLOT_BYTES};
use forms::extra_form;
use iced_x86::code_asm::{
    byte_ptr, dword_ptr, eax, ecx, edx, qword_ptr, r10, r10d, r11, r12, r13, r14, r15, r8, r8d, r9,
    rax, rbp, rbx, rcx, rdi, rdx, rsi, rsp, CodeAssembler, CodeLabel,
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
    /// Instructions translated code handed to the interpreter: forms
    /// without host code, and the slow paths of inline memory accesses.
    pub call_outs: u64,
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
    /// `CycleCosts::instruction`, `multiply` and `divide` of the CPU.
    pub instruction_cost: u64,
    pub multiply_cost: u64,
    pub divide_cost: u64,
    /// `CycleCosts::locked`: an aligned locked read-modify-write.
    pub locked_cost: u64,
    /// The FS and GS bases (IA32_FS_BASE, IA32_GS_BASE).
    pub fs_base: i32,
    pub gs_base: i32,
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
    ) || matches!(
        // By CL: 32- and 64-bit operands (the masked count is below the
        // width), every shift and rotate but RCL/RCR.
        f,
        Fast::Shift {
            op: ShiftOp::Shl
                | ShiftOp::Sal
                | ShiftOp::Shr
                | ShiftOp::Sar
                | ShiftOp::Rol
                | ShiftOp::Ror,
            count: None,
            size: Size::B4 | Size::B8,
            ..
        }
    )
}

/// Whether the translator runs this form with an inline first-level-TLB
/// access (falling back to the interpreter for that instruction on a miss,
/// a page-crossing access, a store into a code frame...).
pub(crate) fn is_inline_memory(f: &Fast) -> bool {
    // FS/GS-relative operands too: `Emitter::lea` adds the base.
    match f {
        Fast::MovRM { .. }
        | Fast::MovMR { .. }
        | Fast::ExtendM { .. }
        | Fast::AluRM { .. }
        | Fast::AluMR { .. }
        | Fast::CmovM { .. } => true,
        Fast::MovMI { size, imm, .. } | Fast::AluMI { size, imm, .. } => {
            *size != Size::B8 || *imm as i64 == *imm as i32 as i64
        }
        Fast::Push { .. } | Fast::Pop { .. } | Fast::Call { .. } | Fast::Ret => true,
        _ => false,
    }
}

/// Whether the translator runs this indirect CALL/JMP with the target
/// read inline and the block left through the chaining exit (see
/// `Emitter::indirect_branch`).
pub(crate) fn is_indirect_branch(f: &Fast) -> bool {
    matches!(
        f,
        Fast::CallR { .. } | Fast::JmpR { .. } | Fast::CallM { .. } | Fast::JmpM { .. }
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
        || !block.insns.iter().any(|op| {
            is_native(&op.fast)
                || is_inline_memory(&op.fast)
                || is_indirect_branch(&op.fast)
                || extra_form(op).is_some()
        })
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
            f if is_indirect_branch(&f) => {
                e.indirect_branch(k, &f, op.next_ip, epilogue)?;
                ended = true;
                break;
            }
            f if is_native(&f) => e.native(k, &f)?,
            f if is_inline_memory(&f) => e.inline_memory(k, &f, op.next_ip, epilogue)?,
            _ => match extra_form(op) {
                Some(x) => e.extra(k, x)?,
                None => e.call_out(k, epilogue)?,
            },
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_names_round_trip() {
        for e in Engine::ALL {
            assert_eq!(e.name().parse::<Engine>(), Ok(e));
        }
        assert!("qemu".parse::<Engine>().is_err());
    }
}
