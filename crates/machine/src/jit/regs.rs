//! Guest registers in host registers, written back.
//!
//! The `Cpu` is the home of the guest registers wherever anything but
//! the block's own register code can look at them; between those points
//! one of the caller-saved host registers the block body does not
//! otherwise use ([`POOL`]) may hold a guest register's whole 64-bit
//! value, and be the only place its newest value is (*dirty*). A 32- or
//! 64-bit write ([`Emitter::store_acc`], [`Emitter::store_held`]) goes to
//! the pool register and marks it dirty, without a store; later reads of
//! that guest register in the block take it from there. The 32- and
//! 64-bit register forms (MOV, the ALU group, TEST, INC/DEC, CMOVcc, IMUL,
//! shifts and rotates by an immediate) run on those host registers
//! themselves ([`Emitter::hold_reg`], [`Emitter::claim_reg`]): no round
//! trip through rax and rcx, and no store per instruction. That takes
//! the `Cpu` slot off a chain of dependent guest instructions (`mov rax,
//! rbx; shl rax, 13; xor rax, rbx` was a chain of read-modify-writes of
//! one memory slot, later of stores to it).
//!
//! Dirty registers are stored to the `Cpu` ([`Emitter::flush_regs`])
//! wherever it must be exact:
//!
//! - before anything that addresses the guest register's slot itself
//!   ([`Emitter::g`] stores that one register first: an 8- or 16-bit
//!   write, POP's store, an operand read from the slot);
//! - before a dirty pool register is given to another guest register;
//! - before an instruction the cache does not follow (a call-out, an
//!   `Extra` form, RET and the indirect branches, which use some of these
//!   host registers or call into Rust): [`Emitter::regs_off`] stores
//!   them, then runs that instruction with the cache off and empty;
//! - on every way out of the block (`Emitter::exit_to` and
//!   `Emitter::leave_to`, which also serve a taken branch and a chained
//!   exit with its cycle check); the loop back to the block's own start
//!   is no way out: the registers its loop top takes dirty in the same
//!   host registers stay there, and only the ways out of its checks
//!   store them ([`Emitter::loop_back_keep`]);
//! - on an inline access's slow path, before its calls into Rust (the
//!   fill, whose fault leaves the block, and the interpreter): the
//!   registers dirty where the fast path branched there
//!   ([`Emitter::store_dirty`] of [`Slow`]'s `retry_regs`), stored before
//!   the call, not after, so a fault sees them exact.
//!
//! Where the mapping is dropped, it is stored first:
//!
//! - a write of the guest register that does not go through the pool
//!   forgets that register ([`Emitter::forget_reg`], after `g` stored
//!   it);
//! - the block's entry (also that of chained blocks) starts with no
//!   register newer than the `Cpu`: those a self-loop's top holds are
//!   loaded there (marked dirty when the back edge keeps them so);
//! - an inline access's slow path calls into Rust, which clobbers these
//!   registers: before it goes back to probe again or on after the
//!   instruction it reloads, from the `Cpu`, every register the fast path
//!   holds at that point (recorded in [`Slow`]), so both ways meet with
//!   the same mapping (a register the fast path has dirty there is then
//!   merely stored again later: the `Cpu` already has its value).

use super::*;

/// Host registers that may hold guest registers (by width: 8, 16, 32, 64
/// bits). The block body uses none of them outside instructions that run
/// with the cache off, and every call reloads them (r12 and r13,
/// callee-saved, are saved by the prologue; the block is kept on the
/// stack and the memory in the `Env` instead).
const POOL: [[Register; 4]; 8] = [
    [Register::SIL, Register::SI, Register::ESI, Register::RSI],
    [Register::DIL, Register::DI, Register::EDI, Register::RDI],
    [
        Register::R10L,
        Register::R10W,
        Register::R10D,
        Register::R10,
    ],
    [
        Register::R11L,
        Register::R11W,
        Register::R11D,
        Register::R11,
    ],
    [Register::R8L, Register::R8W, Register::R8D, Register::R8],
    [
        Register::R13L,
        Register::R13W,
        Register::R13D,
        Register::R13,
    ],
    [
        Register::R12L,
        Register::R12W,
        Register::R12D,
        Register::R12,
    ],
    [Register::R9L, Register::R9W, Register::R9D, Register::R9],
];

/// Which guest register each pool register holds, at one point of the
/// generated code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Regs {
    /// For each pool register, the guest register it holds.
    held: [Option<u8>; POOL.len()],
    /// For each pool register, whether its value is newer than the
    /// `Cpu`'s (to be stored there).
    dirty: [bool; POOL.len()],
    /// Whether the instruction being translated uses the cache.
    on: bool,
    /// rax holds guest register `.0` whole: the last instruction emitted
    /// (the `.1`th) copied it from rax into its pool register.
    acc: Option<(u8, usize)>,
}

impl Default for Regs {
    fn default() -> Self {
        Regs {
            held: [None; POOL.len()],
            dirty: [false; POOL.len()],
            on: true,
            acc: None,
        }
    }
}

impl Regs {
    /// The pool register holding guest register `idx`.
    fn find(&self, idx: u8) -> Option<usize> {
        self.held.iter().position(|h| *h == Some(idx))
    }

    /// Forgets what rax holds (code others jump to).
    pub(super) fn clear_acc(&mut self) {
        self.acc = None;
    }

    /// No pool register holds a guest register.
    pub(super) fn is_empty(&self) -> bool {
        self.held.iter().all(Option::is_none)
    }

    /// No pool register is dirty.
    pub(super) fn is_clean(&self) -> bool {
        !self.dirty.contains(&true)
    }

    /// The pool register that will hold guest register `idx`: the one
    /// holding it already, else a free one, else (Belady) the one whose
    /// guest register `uses` says is read furthest ahead, a clean one
    /// among equals (no store), never one taken for the instruction (or
    /// stack run) being translated, whose code may still use it.
    fn choose(&self, idx: u8, uses: &Uses) -> Option<usize> {
        if let Some(p) = self.find(idx) {
            return Some(p);
        }
        if let Some(p) = self.held.iter().position(Option::is_none) {
            return Some(p);
        }
        let mut best = None;
        for (p, h) in self.held.iter().enumerate() {
            let (Some(g), false) = (*h, uses.taken & 1 << p != 0) else {
                continue;
            };
            let key = (uses.next_read(g), !self.dirty[p]);
            if best.is_none_or(|(k, _)| key > k) {
                best = Some((key, p));
            }
        }
        // (None only if one instruction took the whole pool: none does.)
        best.map(|(_, p)| p)
    }
}

/// When the guest registers are read next, for each instruction of a
/// block: what [`Regs::choose`] evicts by. Computed once per block, where
/// the pool first has to evict ([`Uses::table`], one backward pass over
/// the block).
#[derive(Debug, Default)]
pub(super) struct Uses {
    /// What [`Uses::table`] computes `next` from, until it does: the
    /// block's instructions, whether it loops to its start, and which
    /// instructions keep the pool.
    block: Option<(Vec<Op>, bool, KeepsRegs)>,
    /// For instruction `k`, `next[k][r]`: the index of the first
    /// instruction from `k` on that reads guest register `r` with the pool
    /// still mapping it ([`NEVER`]: none, the register written whole
    /// first, or the pool emptied first); past the block's end for a
    /// self-loop (the loop top's instructions come after the back edge).
    next: Vec<[u32; 16]>,
    /// The instruction being translated.
    at: usize,
    /// The pool registers (bits) taken since it started.
    taken: u8,
}

/// The guest registers `i`'s operands name (bits by number), without
/// the implicit ones.
fn named_gprs(i: &Instruction) -> u16 {
    let bit = |r: Register| {
        if r.is_gpr() {
            1u16 << r.full_register().number()
        } else {
            0
        }
    };
    (0..i.op_count()).fold(0, |m, n| {
        m | match i.op_kind(n) {
            iced_x86::OpKind::Register => bit(i.op_register(n)),
            iced_x86::OpKind::Memory => bit(i.memory_base()) | bit(i.memory_index()),
            _ => 0,
        }
    })
}

/// Whether an instruction runs with the pool on (see [`Uses::new`]).
type KeepsRegs = fn(&Op) -> bool;

/// [`Uses::next`] of a register not read again.
const NEVER: u32 = u32::MAX;

impl Uses {
    /// The next reads of `insns` (`loops`: the block loops back to its
    /// start; `keeps_regs`: whether an instruction runs with the pool on,
    /// else the pool is stored and emptied there and nothing after it
    /// finds a register in it), to be computed if the pool has to evict.
    pub(super) fn new(insns: &[Op], loops: bool, keeps_regs: KeepsRegs) -> Uses {
        // Most blocks name too few guest registers to fill the pool, even
        // with two implicit ones (MUL's rdx, a shift's rcx...): they never
        // evict, and need no table. Of the others most never evict either
        // (the instruction information is the costly part).
        let named = insns.iter().fold(0u16, |m, op| m | named_gprs(&op.insn));
        if (named.count_ones() as usize) + 2 <= POOL.len() {
            return Uses::default();
        }
        Uses {
            block: Some((insns.to_vec(), loops, keeps_regs)),
            ..Uses::default()
        }
    }

    /// Computes the table, if not yet done (see [`Uses::new`]).
    fn table(&mut self) {
        let Some((insns, loops, keeps_regs)) = self.block.take() else {
            return;
        };
        let mut info = iced_x86::InstructionInfoFactory::new();
        // What each instruction reads and what it writes whole (a 32-bit
        // write zero-extends; 8- and 16-bit writes merge: reads), or
        // `None` for one that empties the pool.
        let acts: Vec<Option<(u16, u16)>> = insns
            .iter()
            .map(|op| {
                if !keeps_regs(op) {
                    return None;
                }
                let (mut read, mut whole) = (0u16, 0u16);
                let i =
                    info.info_options(&op.insn, iced_x86::InstructionInfoOptions::NO_MEMORY_USAGE);
                for u in i.used_registers() {
                    let r = u.register();
                    if !r.is_gpr() {
                        continue;
                    }
                    let bit = 1u16 << r.full_register().number();
                    match u.access() {
                        iced_x86::OpAccess::Write if r.size() >= 4 => whole |= bit,
                        _ => read |= bit,
                    }
                }
                Some((read, whole & !read))
            })
            .collect();
        let n = insns.len();
        let mut next = vec![[NEVER; 16]; n];
        let mut after = [NEVER; 16];
        // A self-loop: what the loop top reads next comes after the end
        // (a second pass, from what the first found at the top).
        for pass in 0..if loops { 2 } else { 1 } {
            if pass == 1 {
                after = next[0].map(|j| if j == NEVER { NEVER } else { j + n as u32 });
            }
            for k in (0..n).rev() {
                match acts[k] {
                    None => after = [NEVER; 16],
                    Some((read, whole)) => {
                        for (r, a) in after.iter_mut().enumerate() {
                            if read & 1 << r != 0 {
                                *a = k as u32;
                            } else if whole & 1 << r != 0 {
                                *a = NEVER;
                            }
                        }
                    }
                }
                next[k] = after;
            }
        }
        self.next = next;
    }

    /// Instruction `k` is translated next (taking no pool register yet).
    pub(super) fn start(&mut self, k: usize) {
        self.at = k;
        self.taken = 0;
    }

    /// When guest register `g` is read next, from the instruction being
    /// translated on (`NEVER` where nothing says: no pass was made).
    fn next_read(&self, g: u8) -> u32 {
        self.next.get(self.at).map_or(NEVER, |n| n[g as usize & 15])
    }
}

impl Emitter {
    /// Guest register `idx` in the `Cpu`, as it is there (what a dirty
    /// pool register holds is newer: see [`Self::g`]).
    pub(super) fn slot(&self, idx: u8) -> MemoryOperand {
        self.field(self.gpr_at(idx & 15))
    }

    /// Guest register `idx` in the `Cpu`, for code that reads or writes
    /// that slot itself: a dirty pool register holding it is stored there
    /// first (and stays mapped; a write to the slot then forgets it).
    pub(super) fn g(&mut self, idx: u8) -> Result<MemoryOperand, NotTranslated> {
        if let Some(p) = self.regs.find(idx & 15) {
            if self.regs.dirty[p] {
                self.store_pool(p)?;
            }
        }
        Ok(self.slot(idx))
    }

    /// Stores pool register `p` to the slot of the guest register it
    /// holds; it is clean then. (A MOV: the host flags are untouched.)
    fn store_pool(&mut self, p: usize) -> Result<(), NotTranslated> {
        if let Some(idx) = self.regs.held[p] {
            let m = self.slot(idx);
            self.add(Instruction::with2(Code::Mov_rm64_r64, m, POOL[p][3]))?;
        }
        self.regs.dirty[p] = false;
        Ok(())
    }

    /// Stores every dirty pool register to the `Cpu` (the mapping stays):
    /// for a point where the `Cpu` must be exact.
    pub(super) fn flush_regs(&mut self) -> Result<(), NotTranslated> {
        for p in 0..POOL.len() {
            if self.regs.dirty[p] {
                self.store_pool(p)?;
            }
        }
        Ok(())
    }

    /// Stores the pool registers `at` has dirty, with the pool registers
    /// holding what `at` says (a slow path, before it calls into Rust);
    /// the emitter's own mapping is not changed.
    pub(super) fn store_dirty(&mut self, at: &Regs) -> Result<(), NotTranslated> {
        for (p, h) in at.held.iter().enumerate() {
            if let (Some(idx), true) = (*h, at.dirty[p]) {
                let m = self.slot(idx);
                self.add(Instruction::with2(Code::Mov_rm64_r64, m, POOL[p][3]))?;
            }
        }
        Ok(())
    }

    /// Maps guest register `idx` to a pool register ([`Regs::choose`]),
    /// storing the dirty guest register it evicts; a newly mapped register
    /// is clean (its value loaded, or about to be written and marked).
    fn take(&mut self, idx: u8) -> Result<usize, NotTranslated> {
        if self.regs.find(idx).is_none() && !self.regs.held.contains(&None) {
            // An eviction.
            self.uses.table();
        }
        let p = self
            .regs
            .choose(idx, &self.uses)
            .ok_or(NotTranslated::Unsupported(
                "an instruction taking every pool register",
            ))?;
        self.uses.taken |= 1 << p;
        if self.regs.held[p] != Some(idx) {
            if self.regs.dirty[p] {
                self.store_pool(p)?;
            }
            self.regs.held[p] = Some(idx);
            self.regs.dirty[p] = false;
        }
        Ok(p)
    }

    /// Guest register `idx` at `size` in a host register, if one holds it.
    pub(super) fn cached_reg(&self, idx: u8, size: Size) -> Option<Register> {
        if !self.regs.on {
            return None;
        }
        self.regs.find(idx & 15).map(|p| POOL[p][si(size)])
    }

    /// `gpr[idx] = rax` for a 32- or 64-bit write (the whole 64-bit value
    /// in rax) with the cache on: into a pool register, dirty, no store.
    /// `false` (nothing done) otherwise.
    pub(super) fn remember_acc(&mut self, idx: u8, size: Size) -> Result<bool, NotTranslated> {
        let idx = idx & 15;
        if !self.regs.on || !matches!(size, Size::B4 | Size::B8) {
            return Ok(false);
        }
        let p = self.take(idx)?;
        self.add(Instruction::with2(
            Code::Mov_r64_rm64,
            POOL[p][3],
            Register::RAX,
        ))?;
        self.regs.dirty[p] = true;
        self.regs.acc = Some((idx, self.a.instructions().len()));
        Ok(true)
    }

    /// The pool register (by width) holding guest register `idx`, loaded
    /// from the `Cpu` if none did: for an instruction that reads and
    /// writes it in place. `None` with the cache off.
    pub(super) fn hold_reg(&mut self, idx: u8) -> Result<Option<[Register; 4]>, NotTranslated> {
        if !self.regs.on {
            return Ok(None);
        }
        let idx = idx & 15;
        if let Some(p) = self.regs.find(idx) {
            return Ok(Some(POOL[p]));
        }
        let p = self.take(idx)?;
        let m = self.slot(idx);
        self.add(Instruction::with2(Code::Mov_r64_rm64, POOL[p][3], m))?;
        Ok(Some(POOL[p]))
    }

    /// A pool register (by width) to hold guest register `idx`, its value
    /// not loaded: for an instruction that only writes it. Its operands
    /// are to be looked up before: the claim maps `idx` to a register
    /// holding no value yet (a source it evicts still has its value there
    /// when the instruction reads it, and in the `Cpu` if it was dirty).
    pub(super) fn claim_reg(&mut self, idx: u8) -> Result<Option<[Register; 4]>, NotTranslated> {
        if !self.regs.on {
            return Ok(None);
        }
        Ok(Some(POOL[self.take(idx & 15)?]))
    }

    /// [`Self::hold_reg`] for a 32- or 64-bit instruction (`None` for the
    /// others, which write part of the register).
    pub(super) fn wide_hold(
        &mut self,
        idx: u8,
        size: Size,
    ) -> Result<Option<[Register; 4]>, NotTranslated> {
        match size {
            Size::B4 | Size::B8 => self.hold_reg(idx),
            _ => Ok(None),
        }
    }

    /// [`Self::claim_reg`] for a 32- or 64-bit instruction.
    pub(super) fn wide_claim(
        &mut self,
        idx: u8,
        size: Size,
    ) -> Result<Option<[Register; 4]>, NotTranslated> {
        match size {
            Size::B4 | Size::B8 => self.claim_reg(idx),
            _ => Ok(None),
        }
    }

    /// `gpr[idx] = host` (the whole 64-bit pool register [`Self::hold_reg`]
    /// or [`Self::claim_reg`] gave for `idx`, written by the instruction
    /// just emitted: a 32-bit result already zero-extended): it is dirty.
    pub(super) fn store_held(&mut self, idx: u8, host: [Register; 4]) -> Result<(), NotTranslated> {
        debug_assert_eq!(self.cached_reg(idx, Size::B8), Some(host[3]));
        if let Some(p) = self.regs.find(idx & 15) {
            self.regs.dirty[p] = true;
        }
        Ok(())
    }

    /// `code dst, gpr[src]` at `size`, the operand from its pool register
    /// if one holds it, else from the `Cpu`.
    pub(super) fn with_gpr(
        &mut self,
        code: Code,
        dst: Register,
        src: u8,
        size: Size,
    ) -> Result<(), NotTranslated> {
        match self.cached_reg(src, size) {
            Some(h) => self.add(Instruction::with2(code, dst, h)),
            None => {
                let m = self.slot(src);
                self.add(Instruction::with2(code, dst, m))
            }
        }
    }

    /// Whether rax still holds guest register `idx` whole: nothing was
    /// emitted (no label bound either: a label needs an instruction of its
    /// own, see `Emitter::retry_point`) since [`Self::remember_acc`] copied
    /// it from rax, so a load of it into rax can be left out.
    pub(super) fn acc_holds(&self, idx: u8) -> bool {
        self.regs.on && self.regs.acc == Some((idx & 15, self.a.instructions().len()))
    }

    /// `gpr[idx]` was written in its slot (through [`Self::g`], which
    /// stored a dirty copy first): no host register holds it any more.
    pub(super) fn forget_reg(&mut self, idx: u8) {
        let idx = idx & 15;
        for (p, h) in self.regs.held.iter_mut().enumerate() {
            if *h == Some(idx) {
                debug_assert!(!self.regs.dirty[p]);
                *h = None;
                self.regs.dirty[p] = false;
            }
        }
    }

    /// The cache empty and off, the dirty registers stored first: for an
    /// instruction it does not follow, and for the code emitted after the
    /// block body (where every way out already stored them: nothing is
    /// emitted there).
    pub(super) fn regs_off(&mut self) -> Result<(), NotTranslated> {
        self.flush_regs()?;
        self.regs = Regs {
            on: false,
            ..Regs::default()
        };
        Ok(())
    }

    /// The cache on again, empty (after [`Self::regs_off`], or where both
    /// ways of a branch meet with every register stored).
    pub(super) fn regs_on(&mut self) {
        debug_assert!(self.regs.is_clean());
        self.regs = Regs::default();
    }

    /// At a loop back to the loop top, before its checks (which clobber
    /// no pool register): stores every dirty register the loop top does not
    /// take dirty in the same host register (`Emitter::preload`); those
    /// it does stay dirty across the back edge, and the ways out of the
    /// checks store them (the answer: what they are to store, see
    /// [`Self::store_dirty`]). Notes the first mapping found at a loop
    /// back (what the second translation preloads).
    pub(super) fn loop_back_keep(&mut self) -> Result<Regs, NotTranslated> {
        if !self.regs.on {
            debug_assert!(self.regs.is_clean());
            self.regs = Regs::default();
        }
        if self.loop_seen.is_none() {
            let mut seen = self.regs;
            seen.acc = None;
            self.loop_seen = Some(seen);
        }
        let want = self.preload;
        for p in 0..POOL.len() {
            let kept =
                self.regs.held[p].is_some() && want.held[p] == self.regs.held[p] && want.dirty[p];
            if self.regs.dirty[p] && !kept {
                self.store_pool(p)?;
            }
        }
        Ok(self.regs)
    }

    /// After [`Self::loop_back_keep`] and the checks, before the jump to
    /// the loop top: the host registers hold the guest registers the top
    /// expects, reloaded from the `Cpu` where they are not already there
    /// (the `Cpu` is exact for them: every
    /// dirty register not kept in place was stored). The jump follows:
    /// no code after it has this mapping (the ways out of the checks store
    /// what `loop_back_keep` answered), so nothing is left dirty.
    pub(super) fn loop_back_regs(&mut self) -> Result<(), NotTranslated> {
        let now = self.regs;
        let want = self.preload;
        for (p, h) in want.held.iter().enumerate() {
            if let Some(idx) = *h {
                if now.held[p] != Some(idx) {
                    debug_assert!(!now.dirty[p]);
                    let m = self.slot(idx);
                    self.add(Instruction::with2(Code::Mov_r64_rm64, POOL[p][3], m))?;
                }
            }
        }
        self.regs.dirty = [false; POOL.len()];
        Ok(())
    }

    /// Loads from the `Cpu` every guest register `at` says a pool register
    /// holds (a slow path going back to code that expects them there).
    pub(super) fn reload_regs(&mut self, at: &Regs) -> Result<(), NotTranslated> {
        for (p, h) in at.held.iter().enumerate() {
            if let Some(idx) = *h {
                let m = self.slot(idx);
                self.add(Instruction::with2(Code::Mov_r64_rm64, POOL[p][3], m))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::code_asm::{
        dx, eax, ecx, edx, r10, r11, r12, r13, r8, r9, rax, rbp, rcx, rdi, rdx, rsi,
    };

    /// `prog`'s instructions as a block's (their fast forms left out:
    /// `Uses::new` is given which keep the pool).
    fn ops(prog: impl FnOnce(&mut CodeAssembler)) -> Vec<Op> {
        let mut a = CodeAssembler::new(64).unwrap();
        prog(&mut a);
        a.instructions()
            .iter()
            .map(|i| Op {
                insn: *i,
                fast: Fast::Nop,
                next_ip: i.next_ip(),
            })
            .collect()
    }

    /// A full pool: guest register `g[p]` in pool register `p`.
    fn full(g: [u8; POOL.len()], dirty: [bool; POOL.len()]) -> Regs {
        Regs {
            held: g.map(Some),
            dirty,
            ..Regs::default()
        }
    }

    #[test]
    fn eviction_takes_the_register_read_furthest_ahead() {
        // rax rdx rcx rsi rdi rbp r10 r8 (0 2 1 6 7 5 10 8) are read in
        // this order; r9 (9) is not read again (written whole first).
        let insns = ops(|a| {
            a.add(rdx, rax).unwrap();
            a.add(rdx, rcx).unwrap();
            a.mov(r9, rdx).unwrap();
            a.add(rsi, rsi).unwrap();
            a.add(rdi, rdi).unwrap();
            a.add(rbp, rbp).unwrap();
            a.add(r10, r10).unwrap();
            a.add(r8, r9).unwrap();
        });
        let mut uses = Uses::new(&insns, false, |_| true);
        uses.table();
        uses.start(0);
        // A taken round (the pool's first register first) would evict rax:
        // read next. The one read furthest ahead is r8.
        let regs = full([0, 1, 2, 6, 7, 8, 10, 5], [false; POOL.len()]);
        assert_eq!(regs.choose(3, &uses), Some(5));
        // A register not read again goes first, a clean one among those.
        let regs = full([0, 9, 2, 6, 7, 8, 10, 5], [false; POOL.len()]);
        assert_eq!(regs.choose(3, &uses), Some(1));
        let mut dirty = [false; POOL.len()];
        dirty[1] = true;
        let regs = full([0, 9, 2, 6, 7, 8, 10, 4], dirty);
        assert_eq!(regs.choose(3, &uses), Some(7), "rsp: not read, clean");
        // Never one taken for the instruction being translated.
        uses.taken = 1 << 7 | 1 << 1;
        assert_eq!(regs.choose(3, &uses), Some(5));
        // The one holding it already, else a free one.
        assert_eq!(regs.choose(7, &uses), Some(4));
        let mut regs = regs;
        regs.held[3] = None;
        assert_eq!(regs.choose(3, &uses), Some(3));
    }

    #[test]
    fn next_reads_wrap_around_a_self_loop_and_stop_where_the_pool_empties() {
        let insns = ops(|a| {
            a.mov(eax, ecx).unwrap(); // 0: reads rcx, writes rax whole
            a.add(edx, 1).unwrap(); // 1: reads rdx (the pool emptied here)
            a.add(rsi, rax).unwrap(); // 2
            a.mov(ecx, 5).unwrap(); // 3: writes rcx whole
            a.mov(dx, 7).unwrap(); // 4: a 16-bit write merges: a read
                                   // (Enough registers named to need a table.)
            a.mov(r10, r11).unwrap();
            a.mov(r12, r13).unwrap();
        });
        let mut few = Uses::new(&insns[..5], true, |_| true);
        few.table();
        assert!(
            few.next.is_empty(),
            "too few registers named to fill the pool: no table"
        );
        let n = insns.len() as u32;
        let at = |uses: &Uses, k: usize, g: u8| {
            let mut u = Uses {
                next: uses.next.clone(),
                ..Uses::default()
            };
            u.start(k);
            u.next_read(g)
        };
        let mut straight = Uses::new(&insns, false, |op| op.insn.code() != Code::Add_rm32_imm8);
        straight.table();
        assert_eq!(at(&straight, 0, 1), 0);
        assert_eq!(at(&straight, 0, 2), NEVER, "rdx: after the pool empties");
        assert_eq!(at(&straight, 2, 0), 2);
        assert_eq!(at(&straight, 2, 2), 4);
        assert_eq!(at(&straight, 3, 1), NEVER);
        assert_eq!(at(&straight, 3, 6), NEVER);
        let mut looped = Uses::new(&insns, true, |_| true);
        looped.table();
        // After the end, the loop top: rcx read there (0), rsi at 2, rdx
        // at 1.
        assert_eq!(at(&looped, 4, 1), n, "rcx: read at the top");
        assert_eq!(at(&looped, 4, 6), n + 2);
        assert_eq!(at(&looped, 2, 2), 4);
        assert_eq!(at(&looped, 4, 0), NEVER, "rax: written at the top first");
        assert_eq!(at(&looped, 3, 1), NEVER);
        assert_eq!(at(&looped, 4, 2), 4);
        assert_eq!(at(&looped, 3, 2), 4);
        assert_eq!(at(&looped, 0, 2), 1);
        assert_eq!(at(&looped, 4, 7), NEVER);
    }

    #[test]
    fn the_pool_is_outside_the_pinned_registers() {
        for p in POOL {
            let r = p[3];
            assert!(!matches!(
                r,
                Register::RAX
                    | Register::RCX
                    | Register::RDX
                    | Register::RBX
                    | Register::RBP
                    | Register::RSP
                    | Register::R14
                    | Register::R15
            ));
            for (w, reg) in p.iter().enumerate() {
                assert_eq!(reg.full_register(), r);
                assert_eq!(reg.size(), 1 << w);
            }
        }
    }
}
