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

pub mod background;
mod chain;
mod codes;
mod encode;
mod flags;
mod forms;
mod memory;
pub(crate) mod native;
pub(crate) mod perf_map;
mod privileged;
pub(crate) mod profile;
mod regs;
mod scalar;
mod string;
pub(crate) mod tlb_fill;

pub use encode::set_verify_encoding;

use codes::*;

use crate::alu::{BinOp, ShiftOp, Size};
use crate::cpu::code_cache::Block;
use crate::cpu::fast::{Fast, MemOp, Op, SystemOp, NONE_REG};
use crate::cpu::l1tlb::{SLOTS, SLOT_BYTES, SLOT_HOST_DELTA, SLOT_HPA, SLOT_JIT_PAGE};
use forms::extra_form;
use iced_x86::code_asm::{
    ah, al, byte_ptr, cl, dword_ptr, eax, ecx, edx, qword_ptr, r10, r10d, r11, r12, r13, r14, r15,
    r15d, r8, r8d, r9, rax, rbp, rbx, rcx, rdi, rdx, rsi, rsp, word_ptr, CodeAssembler, CodeLabel,
};
use iced_x86::{Code, IcedError, Instruction, MemoryOperand, Register};
use std::fmt;
use std::str::FromStr;

/// Which engine runs guest code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Engine {
    /// The interpreter (the reference).
    Interp,
    /// The translator, with the interpreter for whatever it does not
    /// translate: the default, being the faster and exact with the
    /// interpreter.
    #[default]
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
    /// Blocks left to the interpreter: not 64-bit code. (A block with no
    /// form of its own in host code, a lone `cli` say, is translated too:
    /// its call-outs run inside the chain of translated blocks instead of
    /// returning to the run loop.)
    pub blocks_interpreted: u64,
    /// Blocks the translator or the host refused (a translator bug, or no
    /// executable memory); interpreted instead.
    pub blocks_failed: u64,
    /// Instructions translated code handed to the interpreter: forms
    /// without host code, and the slow paths of inline memory accesses.
    pub call_outs: u64,
    /// Fetches made by chaining exits whose first-level iTLB probe missed
    /// (`Cpu::jit_chain_fetch`), instead of returning to the run loop.
    pub chain_fetches: u64,
    /// First-level TLB misses of inline accesses that the fill thunk
    /// (`jit/tlb_fill.rs`) left to the Rust fill (`Cpu::jit_fill`).
    pub rust_fills: u64,
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
    /// A chaining exit made the run loop's next steps for it
    /// (`Cpu::jit_chain_fetch`: this block's counts added, RIP set, the
    /// between-block checks and the event check if one was asked for, and
    /// the fetch unless that check left events to look at again after one
    /// instruction), but no translated block there can be jumped to: the
    /// run loop runs the next block (fetching it again is a first-level
    /// iTLB hit, which changes nothing) without its between-block checks.
    pub const FETCHED: u64 = 4;
    /// That fetch faulted (the fault in `Cpu::jit_fault`), as the run
    /// loop's fetch would have.
    pub const FETCH_FAULT: u64 = 5;
    /// Only from the per-instruction call-out, which generated code turns
    /// into `LEAVE` or a chained block: instruction `k` completed, left the
    /// block, and changed the privilege or the code size or asked for an
    /// event check (SYSCALL, SYSRET, IRET), with nothing else for the run
    /// loop to look at; go on at `Cpu::next_rip` through
    /// `Cpu::jit_chain_fetch` (which makes that check and the fetch at the
    /// new privilege, as the run loop would), not through the inline iTLB
    /// probe (which probes the class of the block's own privilege).
    pub const LEAVE_FETCH: u64 = 6;
    /// The event check `Cpu::jit_chain_fetch` made for a chaining exit
    /// (as the run loop would have before the next block) ended in a VM
    /// exit (in `Cpu::jit_exit`; none: the run loop goes on from the top
    /// of its loop); this block's counts are in.
    pub const FETCH_EXIT: u64 = 7;
}

/// Where the generated code finds the guest state: byte offsets from the
/// `Cpu` it is given (computed by `Cpu::jit_offsets`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Offsets {
    pub gpr: i32,
    pub rflags: i32,
    /// `state.rip`: set by the slow path of an inline access of a form
    /// the interpreter runs generically before its fill, so that a fault
    /// of the fill finds RIP at the instruction (see [`Slow::rip`]).
    pub rip: i32,
    pub next_rip: i32,
    /// Chaining: the counters a chained block updates itself, the cycle
    /// count it must stay below (`Cpu::jit_deadline`), and where it
    /// reports the block it ended in.
    pub instructions: i32,
    pub cycles: i32,
    pub jit_deadline: i32,
    pub jit_chain_rip: i32,
    /// `Cpu::jit_loop_recheck`.
    pub jit_loop_recheck: i32,
    /// `CycleCosts::instruction`, `multiply` and `divide` of the CPU.
    pub instruction_cost: u64,
    pub multiply_cost: u64,
    pub divide_cost: u64,
    /// `CycleCosts::locked`: an aligned locked read-modify-write.
    pub locked_cost: u64,
    /// `CycleCosts::serializing` (a move from a control register).
    pub serializing_cost: u64,
    /// `CycleCosts::string_iteration`: what each element of a REP string
    /// instruction after the first adds to `instruction`.
    pub string_iteration_cost: u64,
    /// The FS and GS bases (IA32_FS_BASE, IA32_GS_BASE).
    pub fs_base: i32,
    pub gs_base: i32,
    /// IA32_KERNEL_GS_BASE (what SWAPGS exchanges with the GS base).
    pub kernel_gs_base: i32,
    /// The CS selector (its low two bits are the CPL in 64-bit code).
    pub cs_selector: i32,
    /// The selectors of ES, CS, SS, DS, FS and GS (in iced's order of
    /// the segment registers), for MOV from a segment register.
    pub selectors: [i32; 6],
    /// `Cpu::check_events` (a `bool`): set, the interpreter leaves the
    /// block after a system instruction.
    pub check_events: i32,
    /// `state.interruptibility` (a `u8`: STI and MOV SS blocking), which
    /// STI sets.
    pub interruptibility: i32,
    /// CR0 and CR4 (whether SSE instructions may run) and the XMM
    /// registers, for the XMM moves (`forms::Extra::XmmMove`).
    pub cr0: i32,
    pub cr4: i32,
    pub xmm: i32,
    /// `state.tsc_aux` (IA32_TSC_AUX, what RDTSCP puts in ECX) and
    /// `Cpu::vmx`, an `Option<Box<VmxControls>>`: a pointer, null when
    /// `None` (Rust guarantees that layout), for RDTSC and RDTSCP
    /// (`forms::Extra::Rdtsc`).
    pub tsc_aux: i32,
    pub vmx: i32,
    /// `Cpu::state` (the rest of the architectural state, addressed with
    /// `offset_of!` on `CpuState`: `Emitter::state_at`), and
    /// `CycleCosts::privilege_transition` (SYSCALL and SYSRET).
    pub state: i32,
    pub privilege_transition: u64,
}

/// Slots of the chaining table (3 MiB of entries per CPU). A chaining
/// exit whose target's slot holds another block returns to the run loop,
/// so the table must hold a Linux guest's hot blocks: on `faultline run
/// --guest linux -- hackbench 1 -l 300` such exits to blocks already
/// translated numbered 1.02 M with 4096 slots, 241 k with 16384 and
/// 123 k with 65536 (counted with a temporary counter in `run_block`).
pub(crate) const CHAIN_SLOTS: usize = 65536;

/// One slot of the chaining table: a translated block generated code may
/// jump to directly, valid while its frame's code-write generation is the
/// one recorded (`Cpu` keeps the block, and so its code, alive while it is
/// in the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// The first-level iTLB slot's version (`L1Tlb`'s `fetch_versions`)
    /// when an exit to this RIP last checked the entry in full against it
    /// ([`NO_VERSION`] until then): an exit that finds the slot's version
    /// still this goes straight on (`Emitter::leave_to`).
    pub version: u64,
}

/// `ChainEntry::version` of an entry no exit has checked yet (no slot's
/// version ever is).
pub(crate) const NO_VERSION: u64 = u64::MAX;

impl Default for ChainEntry {
    fn default() -> Self {
        ChainEntry {
            rip: 0,
            hpa: 0,
            generation: 0,
            entry: 0,
            block: 0,
            user: 0,
            version: NO_VERSION,
        }
    }
}

const CHAIN_ENTRY_BYTES: i32 = 56;
const _: () = assert!(std::mem::size_of::<ChainEntry>() == CHAIN_ENTRY_BYTES as usize);

/// The slot of `rip` in the chaining table (the generated code computes
/// the same).
pub(crate) fn chain_slot(rip: u64) -> usize {
    ((rip ^ (rip >> 12)) as usize) & (CHAIN_SLOTS - 1)
}

/// The Rust functions generated code calls.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Helpers {
    /// One instruction through the interpreter (`native::call_out`).
    pub call_out: u64,
    /// A first-level TLB miss of an inline access (`native::fill_out`).
    pub fill: u64,
}

/// What `Cpu::jit_fill` answers.
pub(crate) mod fill {
    /// The slot now holds the page: probe again.
    pub const RETRY: u64 = 0;
    /// The access cannot be inline (crossing, not canonical, a frame
    /// outside memory or holding code): the instruction through the
    /// interpreter.
    pub const FULL: u64 = 1;
    /// The access faults (`Cpu::jit_fault`).
    pub const FAULT: u64 = 2;
    /// A flag in the access's bytes: fill only as the thunk does (a TLB
    /// hit, which removes no entry); the Rust fill answers `FULL` with
    /// nothing done (a MOVS destination: `jit/string.rs`).
    pub const NO_REMOVAL: u32 = 0x80;
}

/// The argument an access site passes its block's shared slow path in ecx
/// (see `Emitter::slow_shared`).
mod slow_arg {
    // Bits 15:0: the first-level TLB class and the access's bytes (bits
    // 15:8), as `native::fill_out` takes them.
    /// Run the whole instruction through the interpreter (no fill).
    pub const FULL: u32 = 1 << 16;
    /// Load r15 from `state.rflags` after the instruction ran (the fast
    /// path leaves the flags in r15 or in the host flags).
    pub const LOAD_SAVED: u32 = 1 << 17;
    /// The index of the instruction in the block, in the bits from here.
    pub const K_SHIFT: u32 = 18;
}

/// Offsets in [`native::Env`].
const ENV_L1: i32 = 0;
const ENV_CODE_FRAMES: i32 = 24;
const ENV_CHAIN: i32 = 32;
const ENV_CODE_GENERATION: i32 = 40;
const ENV_CHAIN_CROSSING: i32 = 48;
const ENV_CHAIN_FETCH: i32 = 56;
const ENV_MEM_BASE: i32 = 8;
const ENV_MEM_SIZE: i32 = 16;
const ENV_L1_BOOK: i32 = 64;
const ENV_TLB_HINTS: i32 = 72;
const ENV_TLB_ENTRIES: i32 = 80;
const ENV_TLB_RECENTLY_USED: i32 = 88;
const ENV_TLB_HITS: i32 = 96;
const ENV_TLB_WAYS: i32 = 104;
const ENV_TLB_FULL_SET: i32 = 112;
const ENV_TLB_EPOCH: i32 = 120;
const ENV_MEMORY: i32 = 128;
const _: () = {
    use native::Env;
    use std::mem::offset_of;
    assert!(offset_of!(Env, l1_slots) == ENV_L1 as usize);
    assert!(offset_of!(Env, mem_base) == ENV_MEM_BASE as usize);
    assert!(offset_of!(Env, mem_size) == ENV_MEM_SIZE as usize);
    assert!(offset_of!(Env, code_frames) == ENV_CODE_FRAMES as usize);
    assert!(offset_of!(Env, chain) == ENV_CHAIN as usize);
    assert!(offset_of!(Env, code_generation) == ENV_CODE_GENERATION as usize);
    assert!(offset_of!(Env, chain_crossing) == ENV_CHAIN_CROSSING as usize);
    assert!(offset_of!(Env, chain_fetch) == ENV_CHAIN_FETCH as usize);
    assert!(offset_of!(Env, l1_book) == ENV_L1_BOOK as usize);
    assert!(offset_of!(Env, tlb_hints) == ENV_TLB_HINTS as usize);
    assert!(offset_of!(Env, tlb_entries) == ENV_TLB_ENTRIES as usize);
    assert!(offset_of!(Env, tlb_recently_used) == ENV_TLB_RECENTLY_USED as usize);
    assert!(offset_of!(Env, tlb_hits) == ENV_TLB_HITS as usize);
    assert!(offset_of!(Env, tlb_ways) == ENV_TLB_WAYS as usize);
    assert!(offset_of!(Env, tlb_full_set_mask) == ENV_TLB_FULL_SET as usize);
    assert!(offset_of!(Env, tlb_epoch) == ENV_TLB_EPOCH as usize);
    assert!(offset_of!(Env, memory) == ENV_MEMORY as usize);
};

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

/// The translator's own forms that are register forms too (no cycles
/// looked at, no way out, the guest-register cache kept).
fn is_register_extra(op: &Op) -> bool {
    !is_native(&op.fast)
        && !is_inline_memory(&op.fast)
        && extra_form(op).is_some_and(|x| x.keeps_cache())
}

/// Whether the translator keeps guest registers in host registers
/// (`jit/regs.rs`) across instruction `op`: the forms that keep that cache
/// exact; the others run with it empty and off.
fn keeps_regs(op: &Op) -> bool {
    match op.fast {
        Fast::Ret => false,
        Fast::Jmp { .. } | Fast::Call { .. } => true,
        f if chain::is_native_indirect(&f) => false,
        f => is_native(&f) || is_inline_memory(&f) || is_register_extra(op),
    }
}

/// Why a block was not translated.
#[derive(Debug)]
#[allow(dead_code)] // The payloads are for debugging output.
pub(crate) enum NotTranslated {
    /// Not 64-bit code (or costs too large for the code's immediates).
    Not64Bit,
    /// A form the translator has no host code for (a translator bug: the
    /// block is interpreted instead).
    Unsupported(&'static str),
    /// The assembler or the encoder refused something (a translator bug;
    /// the block is interpreted instead).
    Asm(String),
}

impl From<IcedError> for NotTranslated {
    fn from(e: IcedError) -> Self {
        NotTranslated::Asm(e.to_string())
    }
}

/// Host code for `block`: position-independent bytes to be installed in a
/// [`native::Arena`], and the offset of its chained entry. `helpers` are
/// the addresses of the Rust functions the code calls.
///
/// `user`: the code runs at CPL 3 (the first-level TLB class of its inline
/// accesses).
///
/// A page-crossing instruction's block (host-physical address `u64::MAX`:
/// the code cache checks its bytes on every fetch) is translated too: only
/// the run loop enters it (no fetch from generated code finds it: its
/// chaining-table entry never matches a fetched address, nor does its own
/// address for the self-loop exit), and it chains on out of it.
pub(crate) fn translate(
    block: &Block,
    o: Offsets,
    helpers: Helpers,
    user: bool,
) -> Result<(Vec<u8>, usize), NotTranslated> {
    // A block that loops to its own start is translated twice: the guest
    // registers host registers hold where the first translation loops
    // back are loaded at the second's entry and kept across its loop
    // (`jit/regs.rs`).
    // Again while the second's differs from what it preloaded (a few
    // times at most), so that the loop back finds the registers where
    // the loop top has them. The next-use table (`regs::Uses`) is made
    // once.
    let mut uses = None;
    let (mut code, mut entry, mut seen) = translate_with(block, o, helpers, user, None, &mut uses)?;
    let mut preload = None;
    for _ in 0..4 {
        match seen.filter(|at| !at.is_empty()) {
            Some(at) if Some(at) != preload => {
                preload = Some(at);
                (code, entry, seen) = translate_with(block, o, helpers, user, Some(at), &mut uses)?;
            }
            _ => break,
        }
    }
    encode::disassemble_if_asked(block, &code, entry, &o);
    Ok((code, entry))
}

/// [`translate`], with `preload` the guest registers held in host
/// registers at the loop top (after the chained entry); also answers
/// those held where the code first loops back to it. `uses`: the block's
/// next-use table, made here if `None` (and left there).
fn translate_with(
    block: &Block,
    o: Offsets,
    helpers: Helpers,
    user: bool,
    preload: Option<regs::Regs>,
    uses: &mut Option<regs::Uses>,
) -> Result<(Vec<u8>, usize, Option<regs::Regs>), NotTranslated> {
    if block.bits != 64 || o.instruction_cost > i32::MAX as u64 || o.multiply_cost > i32::MAX as u64
    {
        return Err(NotTranslated::Not64Bit);
    }
    let mut e = Emitter {
        a: CodeAssembler::new(64)?,
        o,
        host_valid: false,
        dirty: false,
        saved: false,
        flags_dead: false,
        af_clear: false,
        exits: Vec::new(),
        slow: Vec::new(),
        helpers,
        user,
        access: (0, 0),
        chain: CodeLabel::default(),
        chain_out: CodeLabel::default(),
        fetch_miss: CodeLabel::default(),
        fetch_rust: CodeLabel::default(),
        own: (block.rip, block.hpa, u64::from(block.generation)),
        chained_entry: CodeLabel::default(),
        epilogue: CodeLabel::default(),
        live_at_entry: flags::flags_live_at_entry(&block.insns),
        regs: regs::Regs::default(),
        retry_regs: regs::Regs::default(),
        uses: regs::Uses::default(),
        loop_top: CodeLabel::default(),
        loop_live: false,
        preload: preload.unwrap_or_default(),
        loop_seen: None,
        pending_cycles: 0,
    };
    let mut epilogue = e.a.create_label();
    // Where a call-out that did not just go on returns to: chaining on
    // after a branch it ran, the epilogue otherwise.
    let mut call_exit = e.a.create_label();
    let mut chain_try = e.a.create_label();
    e.chain = chain_try;
    e.chain_out = e.a.create_label();
    e.fetch_miss = e.a.create_label();
    e.fetch_rust = e.a.create_label();
    let mut chained_entry = e.a.create_label();
    e.chained_entry = chained_entry;
    e.epilogue = epilogue;
    // Prologue: rbx = cpu, r14 = env (which has the memory), the block at
    // [rsp] (r12 and r13 are pool registers, `jit/regs.rs`). Six pushes and that slot
    // after the return address leave rsp 16-byte aligned for the
    // call-outs.
    e.a.push(rbx)?;
    e.a.push(rbp)?;
    e.a.push(r12)?;
    e.a.push(r13)?;
    e.a.push(r14)?;
    e.a.push(r15)?;
    e.a.sub(rsp, 8)?;
    e.a.mov(rbx, rdi)?;
    e.a.mov(qword_ptr(rsp), rdx)?;
    e.a.mov(r14, rcx)?;
    e.a.mov(rbp, qword_ptr(r14 + ENV_L1))?;
    // Chained blocks enter here, with rbx, rbp, r14 as above, [rsp]
    // their block, and the flags in `state.rflags`.
    // (A zero-length instruction carries the label and gives the offset:
    // the entry is the first instruction of the body, no `nop` run on
    // every chained entry.)
    e.a.set_label(&mut chained_entry)?;
    let chained_at = e.a.instructions().len();
    e.a.zero_bytes()?;
    let last = block.insns.len() - 1;
    // The loop top: where a loop to the block's own start goes (see
    // `Emitter::self_loop_exit`), after what the entry sets up for it.
    // Where the flags are live at entry, they are kept in r15 across the
    // loop (the way in loads them there); the guest registers `preload`
    // names are in their host registers.
    let loops = e.is_self_loop(block.rip)
        && (block.insns[last].next_ip == block.rip
            || block.insns.iter().any(|op| {
                matches!(op.fast,
                    Fast::Jcc { target, .. } | Fast::Jmp { target } | Fast::Call { target }
                        if target == block.rip)
            }));
    if loops && e.live_at_entry {
        e.load_saved()?;
        e.saved = true;
        e.dirty = true;
        e.af_clear = false;
        e.loop_live = true;
    }
    // When each guest register is read next: what the pool evicts by.
    e.uses = uses
        .take()
        .unwrap_or_else(|| regs::Uses::new(&block.insns, loops, keeps_regs));
    let preload = e.preload;
    e.reload_regs(&preload)?;
    e.regs = preload;
    e.regs.clear_acc();
    let mut loop_top = e.a.create_label();
    e.a.zero_bytes()?;
    e.a.set_label(&mut loop_top)?;
    e.loop_top = loop_top;
    let mut ended = false;
    let live = flags::flags_live_after(&block.insns);
    // Instructions a stack run (`Emitter::stack_run`) took with the one
    // before.
    let mut skip = 0;
    for (k, op) in block.insns.iter().enumerate() {
        if skip > 0 {
            skip -= 1;
            continue;
        }
        e.flags_dead = !live[k];
        let register_extra = is_register_extra(op);
        // The cycles register forms left pending are charged before
        // anything that may look at `cycles` or leave the block: a register
        // form (no Jcc, JMP) does neither, so the charge may wait.
        if matches!(op.fast, Fast::Jcc { .. } | Fast::Jmp { .. })
            || !(is_native(&op.fast) || register_extra)
        {
            e.charge_pending()?;
        }
        let cached = keeps_regs(op);
        e.uses.start(k);
        if !cached {
            e.regs_off()?;
        }
        let run = memory::stack_run(&block.insns[k..]);
        if run > 0 {
            e.stack_run(k, &block.insns[k..k + run], call_exit)?;
            skip = run - 1;
            continue;
        }
        match op.fast {
            Fast::Jmp { target } => {
                // Always the last instruction of a block.
                e.exit_to(k, target)?;
                ended = true;
                break;
            }
            Fast::Call { target } => {
                e.inline_memory(k, &op.fast, op.next_ip, call_exit)?;
                e.capture_if_dirty()?;
                e.leave_to(k, target)?;
                ended = true;
                break;
            }
            Fast::Ret => {
                // Leaves through the inline code (or the call-out).
                e.inline_memory(k, &op.fast, op.next_ip, call_exit)?;
                ended = true;
                break;
            }
            f if chain::is_native_indirect(&f) => {
                // Always the last instruction of a block.
                e.indirect(k, &f, op.next_ip, call_exit)?;
                ended = true;
                break;
            }
            Fast::System(SystemOp::Swapgs) if !user => e.swapgs(k)?,
            f if is_native(&f) => e.native(k, &f)?,
            f if is_inline_memory(&f) => e.inline_memory(k, &f, op.next_ip, call_exit)?,
            _ => match extra_form(op) {
                Some(x) => e.extra(k, op.insn.ip(), x)?,
                None => e.call_out(k, call_exit)?,
            },
        }
        if !cached {
            e.regs_on();
        }
    }
    if !ended {
        e.charge_pending()?;
        e.exit_to(last, block.insns[last].next_ip)?;
    }
    debug_assert_eq!(e.pending_cycles, 0);
    // Slow paths of inline accesses: a few instructions per access that
    // call one of the block's shared slow paths (`Emitter::slow_shared`)
    // with what differs in ecx, then go back to probe again or on with the
    // flags where the fast path leaves them.
    // (Out of line: no guest register is taken from a host register.)
    e.regs_off()?;
    let slow = std::mem::take(&mut e.slow);
    let mut shared: [Option<CodeLabel>; 3] = [None; 3];
    for mut x in slow {
        let v = match (x.entry_saved, x.af_clear) {
            (false, _) => 0,
            (true, false) => 1,
            (true, true) => 2,
        };
        let target = *shared[v].get_or_insert_with(|| e.a.create_label());
        if x.k >= 1 << (32 - slow_arg::K_SHIFT) {
            return Err(NotTranslated::Unsupported(
                "a block too long for its slow paths",
            ));
        }
        let mut arg = (x.k as u32) << slow_arg::K_SHIFT;
        if matches!(x.exit, FlagsAt::Host | FlagsAt::Saved) {
            arg |= slow_arg::LOAD_SAVED;
        }
        e.a.set_label(&mut x.label)?;
        // Before the call: the guest registers the fast path had dirty
        // where it branched here, stored (the callee looks at the `Cpu`,
        // `jit/regs.rs`).
        match x.access {
            Some((class, bytes)) => {
                // The miss; `full`, the instruction through the
                // interpreter whatever the first-level TLB holds.
                arg |= class | bytes << 8;
                if let Some(ip) = x.rip {
                    e.set_rip(ip)?;
                }
                e.a.mov(ecx, arg)?;
                let mut call = e.a.create_label();
                e.a.set_label(&mut call)?;
                e.store_dirty(&x.retry_regs)?;
                e.a.call(target)?;
                e.a.test(eax, eax)?;
                if x.retry_regs.is_empty() {
                    e.a.je(x.retry)?;
                } else {
                    let mut on = e.a.create_label();
                    e.a.jne(on)?;
                    e.reload_regs(&x.retry_regs)?;
                    e.a.jmp(x.retry)?;
                    e.a.set_label(&mut on)?;
                }
                e.reload_regs(&x.cont_regs)?;
                e.slow_exit(x.exit, x.cont)?;
                e.a.set_label(&mut x.full)?;
                e.a.mov(ecx, arg | slow_arg::FULL)?;
                e.a.jmp(call)?;
            }
            None => {
                e.store_dirty(&x.retry_regs)?;
                e.a.mov(ecx, arg | slow_arg::FULL)?;
                e.a.call(target)?;
                e.reload_regs(&x.cont_regs)?;
                e.slow_exit(x.exit, x.cont)?;
            }
        }
    }
    for (v, l) in shared.iter_mut().enumerate() {
        if let Some(l) = l {
            e.a.set_label(l)?;
            e.slow_shared(v != 0, v == 2, epilogue, call_exit)?;
        }
    }
    // Taken conditional branches leave through these stubs.
    let exits = std::mem::take(&mut e.exits);
    for mut x in exits {
        e.a.set_label(&mut x.label)?;
        // The flags as the branch left them: in the host; the guest
        // registers in host registers as there (only a loop back looks).
        e.host_valid = true;
        e.dirty = x.dirty;
        e.saved = false;
        e.af_clear = x.af_clear;
        e.regs = x.regs;
        e.exit_to(x.k, x.target)?;
    }
    e.regs_off()?;
    e.a.set_label(&mut chain_try)?;
    e.chain_try(epilogue)?;
    e.fetch_miss_exit(epilogue)?;
    e.a.set_label(&mut call_exit)?;
    e.call_exit(epilogue)?;
    e.a.set_label(&mut epilogue)?;
    e.a.add(rsp, 8)?;
    e.a.pop(r15)?;
    e.a.pop(r14)?;
    e.a.pop(r13)?;
    e.a.pop(r12)?;
    e.a.pop(rbp)?;
    e.a.pop(rbx)?;
    e.a.ret()?;
    let instrs = e.a.instructions();
    let r = encode::encode(instrs)?;
    if encode::verify_encoding() {
        // Asked for by a test or a developer: say what differs.
        encode::verify(instrs, &r).map_err(|m| {
            eprintln!("jit: block at {:#x}: encoding check failed: {m}", block.rip);
            NotTranslated::Asm(m)
        })?;
    }
    let chain_offset = r.offset(chained_at) as usize;
    *uses = Some(std::mem::take(&mut e.uses));
    Ok((r.code, chain_offset, e.loop_seen))
}

/// A taken conditional branch's way out, emitted after the block.
struct Exit {
    label: CodeLabel,
    k: usize,
    target: u64,
    /// The guest flags in the host flags were not yet written back.
    dirty: bool,
    af_clear: bool,
    /// The guest registers host registers hold at the branch.
    regs: regs::Regs,
}

/// The slow path of an inline access, emitted after the block.
struct Slow {
    /// The first-level TLB probe missed.
    label: CodeLabel,
    /// The instruction must run through the interpreter.
    full: CodeLabel,
    /// The fast path's start, to probe again after a fill.
    retry: CodeLabel,
    /// The access: first-level TLB class and bytes (`None`: every way in
    /// is the whole instruction, `label` its only label).
    access: Option<(u32, u32)>,
    k: usize,
    /// Where the fast path ends.
    cont: CodeLabel,
    /// The flags were saved in r15 when it was taken (and the last
    /// writer was a logic op: AF clear).
    entry_saved: bool,
    af_clear: bool,
    /// Where the fast path leaves the guest flags; so must the slow path.
    exit: FlagsAt,
    /// The instruction's address, for a form the interpreter runs
    /// generically (`Fast::Generic`, whose path sets `state.rip` itself
    /// and whose faults the run loop takes at `state.rip`): stored there
    /// before the fill, so that a fault of the fill is taken at the
    /// instruction. (`state.rip` is not looked at inside a block
    /// otherwise: the run loop sets it after every block, and every fault
    /// path sets it first.)
    rip: Option<u64>,
    /// The guest registers host registers hold at `retry` and at `cont`
    /// (`jit/regs.rs`): reloaded after the calls, before going back.
    retry_regs: regs::Regs,
    cont_regs: regs::Regs,
}

impl Slow {
    /// A slow path that runs the whole instruction `k` through the
    /// interpreter on every way in (no fill), entered with the flags
    /// written back, then goes on at `cont` with the flags in the host
    /// (`flags_in_host`) or in `state.rflags`.
    fn whole(
        label: CodeLabel,
        k: usize,
        cont: CodeLabel,
        flags_in_host: bool,
        cont_regs: regs::Regs,
    ) -> Slow {
        Slow {
            label,
            full: label,
            retry: label,
            access: None,
            k,
            cont,
            entry_saved: false,
            af_clear: false,
            exit: if flags_in_host {
                FlagsAt::Host
            } else {
                FlagsAt::State
            },
            rip: None,
            retry_regs: regs::Regs::default(),
            cont_regs,
        }
    }
}

/// Where the guest's flags are, besides `state.rflags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FlagsAt {
    /// The host flags.
    Host,
    /// r15 (see `Emitter::save_flags`).
    Saved,
    /// Only `state.rflags`.
    State,
}

struct Emitter {
    a: CodeAssembler,
    o: Offsets,
    /// The host flags hold the guest's arithmetic flags.
    host_valid: bool,
    /// ... and they differ from `state.rflags` (must be written back).
    dirty: bool,
    /// The flags are saved in r15, not in the host flags (see
    /// `jit/flags.rs`).
    saved: bool,
    /// The flags the instruction being translated leaves are never
    /// observed ([`flags::flags_live_after`]): it need not produce them.
    flags_dead: bool,
    /// The last flag writer was a logic op: AF is clear for the interpreter.
    af_clear: bool,
    exits: Vec<Exit>,
    slow: Vec<Slow>,
    helpers: Helpers,
    user: bool,
    /// The class and size of the last inline access emitted.
    access: (u32, u32),
    /// The block's exit that tries to chain (see [`Emitter::chain_try`]),
    /// and its way out when it does not chain (also that of the exits to
    /// known targets).
    chain: CodeLabel,
    chain_out: CodeLabel,
    /// Where a chaining exit goes when the next block's fetch misses the
    /// first-level iTLB (see [`Emitter::fetch_miss_exit`]).
    fetch_miss: CodeLabel,
    /// Its way to `Cpu::jit_chain_fetch` (also that of a call-out that
    /// asks for the fetch, `Emitter::call_exit`).
    fetch_rust: CodeLabel,
    /// This block's RIP, host-physical address and code-write generation.
    own: (u64, u64, u64),
    /// Where chained blocks enter (a loop to the block's own start jumps
    /// there, see [`Emitter::self_loop_exit`]), and the epilogue.
    chained_entry: CodeLabel,
    epilogue: CodeLabel,
    /// The guest flags at the block's entry may be observed
    /// ([`flags::flags_live_at_entry`]).
    live_at_entry: bool,
    /// Guest registers host registers hold (`jit/regs.rs`), here and at
    /// the last [`Emitter::retry_point`].
    regs: regs::Regs,
    retry_regs: regs::Regs,
    /// When the block reads each guest register next (what the pool
    /// evicts by), and the instruction being translated.
    uses: regs::Uses,
    /// Where a loop to the block's own start goes; whether the flags are
    /// in r15 there (else in `state.rflags`, or dead); the guest registers
    /// host registers hold there, and those held where the code first
    /// loops back (see [`translate`]).
    loop_top: CodeLabel,
    loop_live: bool,
    preload: regs::Regs,
    loop_seen: Option<regs::Regs>,
    /// Extra cycles of the register forms emitted since the last charge
    /// (IMUL's multiply cost), not yet added to `cycles`: nothing between
    /// them looks at it, and one add replaces a chain of read-modify-writes
    /// of it ([`Emitter::charge_pending`]).
    pending_cycles: u64,
}

impl Emitter {
    fn add(&mut self, i: Result<Instruction, IcedError>) -> Result<(), NotTranslated> {
        Ok(self.a.add_instruction(i?)?)
    }

    fn field(&self, off: i32) -> MemoryOperand {
        MemoryOperand::with_base_displ(Register::RBX, off as i64)
    }

    /// The offset from rbx of guest register `idx`'s slot (exact where
    /// the register cache is off: `Extra` forms, call-outs).
    fn gpr_at(&self, idx: u8) -> i32 {
        self.o.gpr + 8 * idx as i32
    }

    /// The offset from rbx of the `CpuState` field at `field` in it
    /// (`offset_of!`).
    fn state_at(&self, field: usize) -> i32 {
        self.o.state + field as i32
    }

    /// `acc = gpr[idx]` at `size` (a 32-bit load zero-extends into rax).
    fn load(&mut self, reg: [Register; 4], idx: u8, size: Size) -> Result<(), NotTranslated> {
        if reg == ACC && size == Size::B8 && self.acc_holds(idx) {
            // rax was just written to that register (and copied from).
            return Ok(());
        }
        if let Some(h) = self.cached_reg(idx, size) {
            return self.add(Instruction::with2(MOV_R_RM[si(size)], reg[si(size)], h));
        }
        // (In no host register: the slot is exact.)
        let m = self.slot(idx);
        self.add(Instruction::with2(MOV_R_RM[si(size)], reg[si(size)], m))
    }

    /// Guest register `idx` at `size` in a host register: the pool
    /// register holding it, else `scratch`, loaded from the `Cpu`.
    fn in_reg(
        &mut self,
        scratch: [Register; 4],
        idx: u8,
        size: Size,
    ) -> Result<Register, NotTranslated> {
        match self.cached_reg(idx, size) {
            Some(h) => Ok(h),
            None => {
                self.load(scratch, idx, size)?;
                Ok(scratch[si(size)])
            }
        }
    }

    /// `gpr[idx] = acc` with the interpreter's partial-register rule: 8-
    /// and 16-bit writes keep the bits above, a 32-bit write zero-extends
    /// (the 32-bit value is already zero-extended in rax). With the cache
    /// on, a 32- or 64-bit write goes to a pool register (`jit/regs.rs`).
    fn store_acc(&mut self, idx: u8, size: Size) -> Result<(), NotTranslated> {
        if self.remember_acc(idx, size)? {
            return Ok(());
        }
        let m = self.g(idx)?;
        let r = match size {
            Size::B4 | Size::B8 => Register::RAX,
            s => ACC[si(s)],
        };
        let code = match size {
            Size::B4 | Size::B8 => Code::Mov_rm64_r64,
            s => MOV_RM_R[si(s)],
        };
        self.add(Instruction::with2(code, m, r))?;
        self.forget_reg(idx);
        Ok(())
    }

    /// `state.rip = ip` (clobbers rcx).
    fn set_rip(&mut self, ip: u64) -> Result<(), NotTranslated> {
        let rip = self.o.rip;
        if ip as i64 == ip as i32 as i64 {
            self.a.mov(qword_ptr(rbx + rip), ip as i32)?;
        } else {
            self.a.mov(rcx, ip)?;
            self.a.mov(qword_ptr(rbx + rip), rcx)?;
        }
        Ok(())
    }

    /// Instruction `k` through the interpreter.
    fn call_out(&mut self, k: usize, epilogue: CodeLabel) -> Result<(), NotTranslated> {
        self.capture_if_dirty()?;
        self.emit_call(k, epilogue)?;
        self.host_valid = false;
        Ok(())
    }

    /// The end of an access site's slow path, after the shared part came
    /// back having run the instruction: the flags where the fast path
    /// leaves them (the shared part loaded r15 from `state.rflags` for
    /// `Host` and `Saved`), then on at `cont`.
    fn slow_exit(&mut self, exit: FlagsAt, cont: CodeLabel) -> Result<(), NotTranslated> {
        if exit == FlagsAt::Host {
            self.a.mov(eax, r15d)?;
            self.a.add(al, 0x7f)?;
            self.a.sahf()?;
        }
        self.a.jmp(cont)?;
        Ok(())
    }

    /// The slow path the access sites of a block share (one per way the
    /// flags are on entry: `saved` in r15, with AF clear if `af_clear`; or
    /// only in `state.rflags`). Called (a near call from the site, so
    /// entered with rsp 8 off the call alignment) with [`slow_arg`] in
    /// ecx and, for a miss, the linear address in rax:
    ///
    /// - a miss fills the first-level TLB slot as the interpreter's access
    ///   would (`Cpu::jit_fill`) and returns 0 to probe again, or goes on
    ///   as `FULL`, or leaves the block with the fault;
    /// - `FULL` runs the instruction through the interpreter, then returns
    ///   1 (r15 loaded from `state.rflags` if `LOAD_SAVED`), or leaves the
    ///   block through `call_exit` if the instruction did.
    ///
    /// The flags are written back before either call.
    fn slow_shared(
        &mut self,
        saved: bool,
        af_clear: bool,
        epilogue: CodeLabel,
        call_exit: CodeLabel,
    ) -> Result<(), NotTranslated> {
        let mut full = self.a.create_label();
        let mut run = self.a.create_label();
        let mut not_retry = self.a.create_label();
        let mut leave = self.a.create_label();
        let mut no_load = self.a.create_label();
        // The argument stays at [rsp]; rsp is now aligned for the calls.
        self.a.push(rcx)?;
        self.a.test(ecx, slow_arg::FULL as i32)?;
        self.a.jne(full)?;
        self.a.mov(rdx, rax)?;
        self.a.mov(rdi, rbx)?;
        self.a.mov(rsi, qword_ptr(r14 + ENV_MEMORY))?;
        self.a.movzx(ecx, word_ptr(rsp))?;
        self.a.mov(rax, self.helpers.fill)?;
        self.a.call(rax)?;
        self.a.test(eax, eax)?;
        self.a.jne(not_retry)?;
        // Probe again: the fill reads no arithmetic flag, so those saved
        // in r15 stay there (written back only on the ways below, where
        // the interpreter runs the instruction or its fault pushes them).
        self.a.pop(rcx)?;
        self.a.ret()?;
        self.a.set_label(&mut not_retry)?;
        if saved {
            // (The answer in edx: the write-back clobbers rax and rcx.)
            self.a.mov(edx, eax)?;
            self.capture_saved(af_clear)?;
            self.a.cmp(edx, fill::FULL as i32)?;
        } else {
            self.a.cmp(eax, fill::FULL as i32)?;
        }
        self.a.je(run)?;
        // The fault: instruction k did not complete.
        self.a.mov(eax, dword_ptr(rsp))?;
        self.a.shr(eax, slow_arg::K_SHIFT)?;
        self.a.shl(eax, 8)?;
        self.a.or(eax, status::FAULT as i32)?;
        self.a.add(rsp, 16)?;
        self.a.jmp(epilogue)?;
        self.a.set_label(&mut full)?;
        if saved {
            self.capture_saved(af_clear)?;
        } else {
            self.a.zero_bytes()?;
        }
        self.a.set_label(&mut run)?;
        self.a.mov(rdi, rbx)?;
        self.a.mov(rsi, qword_ptr(r14 + ENV_MEMORY))?;
        // The block: above the argument and the return address.
        self.a.mov(rdx, qword_ptr(rsp + 16))?;
        self.a.mov(ecx, dword_ptr(rsp))?;
        self.a.shr(ecx, slow_arg::K_SHIFT)?;
        self.a.mov(rax, self.helpers.call_out)?;
        self.a.call(rax)?;
        self.a.test(rax, rax)?;
        self.a.jne(leave)?;
        self.a.test(dword_ptr(rsp), slow_arg::LOAD_SAVED as i32)?;
        self.a.je(no_load)?;
        self.load_saved()?;
        self.a.set_label(&mut no_load)?;
        self.a.pop(rcx)?;
        self.a.mov(eax, 1)?;
        self.a.ret()?;
        // The instruction left the block (or asked the run loop to stop):
        // as after any call-out, with its answer in rax.
        self.a.set_label(&mut leave)?;
        self.a.add(rsp, 16)?;
        self.a.jmp(call_exit)?;
        Ok(())
    }

    /// The call of [`Self::call_out`], the flags already written back.
    fn emit_call(&mut self, k: usize, epilogue: CodeLabel) -> Result<(), NotTranslated> {
        self.a.mov(rdi, rbx)?;
        self.a.mov(rsi, qword_ptr(r14 + ENV_MEMORY))?;
        self.a.mov(rdx, qword_ptr(rsp))?;
        self.a.mov(ecx, k as u32)?;
        self.a.mov(rax, self.helpers.call_out)?;
        self.a.call(rax)?;
        self.a.test(rax, rax)?;
        self.a.jne(epilogue)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::code_cache::{decode_block, Block};
    use crate::cpu::{Cpu, CpuConfig};
    use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};

    /// The host instructions (Intel syntax) translating `guest` (64-bit
    /// code at 0x1000, supervisor) gives.
    fn host_code(guest: impl Fn(&mut CodeAssembler)) -> Vec<String> {
        let mut a = CodeAssembler::new(64).unwrap();
        guest(&mut a);
        let bytes = a.assemble(0x1000).unwrap();
        let block = Block {
            rip: 0x1000,
            hpa: 0x1000,
            generation: 0,
            bits: 64,
            insns: decode_block(&bytes, 0x1000, 64).unwrap(),
            runs: Default::default(),
            jit: Default::default(),
        };
        let cpu = Cpu::new(CpuConfig::default());
        // Nothing runs: any address serves as the fill.
        let helpers = Helpers {
            call_out: native::call_out_address(),
            fill: native::call_out_address(),
        };
        let (code, _) = translate(&block, cpu.jit_offsets(), helpers, false).unwrap();
        let mut d = Decoder::with_ip(64, &code, 0, DecoderOptions::NONE);
        let mut f = IntelFormatter::new();
        d.iter()
            .map(|i| {
                let mut t = String::new();
                f.format(&i, &mut t);
                t
            })
            .collect()
    }

    #[test]
    fn register_forms_write_their_host_register_directly() {
        use iced_x86::code_asm::*;
        let code = host_code(|a| {
            a.lea(rdi, qword_ptr(rax * 8)).unwrap();
            a.lea(rsi, qword_ptr(rdi + rax + 16)).unwrap();
            a.movzx(esi, sil).unwrap();
            a.movsxd(r9, r8d).unwrap();
            a.mov(r8d, 5u32).unwrap();
            a.mov(rcx, qword_ptr(rdx)).unwrap();
            a.mov(qword_ptr(rdx + 8), rcx).unwrap();
            // Flags dead: ADD replaces them all.
            a.shr(rdx, 32).unwrap();
            a.add(rdx, rbx).unwrap();
            a.hlt().unwrap();
        });
        // The block body: up to the HLT's call-out.
        let end = code.iter().position(|t| t.starts_with("call")).unwrap();
        let code = &code[..end];
        let text = code.join("\n");
        // Each result goes straight into its pool register: none is
        // computed in rax and copied from there, and the shift runs in
        // place.
        // (rcx and rdx are the probes' scratch registers, not the pool's.)
        let copied = code.iter().find(|t| {
            t.strip_prefix("mov ")
                .and_then(|t| t.strip_suffix(",rax"))
                .is_some_and(|dst| !dst.starts_with('[') && dst != "rcx" && dst != "rdx")
        });
        assert!(copied.is_none(), "copied from rax:\n{text}");
        assert!(!code.iter().any(|t| t.starts_with("shr rax")), "{text}");
        // The store takes the loaded value from its pool register, and
        // both accesses address the page as slot delta + linear address.
        assert!(
            !code
                .iter()
                .any(|t| t.ends_with(",rcx") && t.starts_with("mov [rdx")),
            "{text}"
        );
        assert!(!code.iter().any(|t| t == "add rdx,rax"), "{text}");
        assert_eq!(
            code.iter().filter(|t| t.contains("[rdx+rax]")).count(),
            2,
            "{text}"
        );
    }

    #[test]
    fn engine_names_round_trip() {
        for e in Engine::ALL {
            assert_eq!(e.name().parse::<Engine>(), Ok(e));
        }
        assert!("qemu".parse::<Engine>().is_err());
    }
}
