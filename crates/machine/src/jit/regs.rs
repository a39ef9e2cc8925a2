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
/// with the cache off, and every call reloads them (r13, callee-saved, is
/// saved by the prologue; the block is kept on the stack instead).
/// (R9 last: a loop back clobbers it with the cycle count.)
const POOL: [[Register; 4]; 7] = [
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
    /// The pool register the next allocation takes when none is free.
    next: u8,
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
            next: 0,
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
    /// holding it already, else a free one, else the next in turn (whose
    /// guest register is to be stored first if dirty).
    fn choose(&mut self, idx: u8) -> usize {
        match self.find(idx) {
            Some(p) => p,
            None => match self.held.iter().position(Option::is_none) {
                Some(p) => p,
                None => {
                    let p = self.next as usize;
                    self.next = ((p + 1) % POOL.len()) as u8;
                    p
                }
            },
        }
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
        let p = self.regs.choose(idx);
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
    /// `clobbered`): stores every dirty register the loop top does not
    /// take dirty in the same host register (`Emitter::preload`); those
    /// it does stay dirty across the back edge, and the ways out of the
    /// checks store them (the answer: what they are to store, see
    /// [`Self::store_dirty`]). Notes the first mapping found at a loop
    /// back (what the second translation preloads).
    pub(super) fn loop_back_keep(&mut self, clobbered: &[Register]) -> Result<Regs, NotTranslated> {
        if !self.regs.on {
            debug_assert!(self.regs.is_clean());
            self.regs = Regs::default();
        }
        if self.loop_seen.is_none() {
            let mut seen = self.regs;
            seen.acc = None;
            for (p, h) in seen.held.iter_mut().enumerate() {
                if clobbered.contains(&POOL[p][3]) {
                    *h = None;
                    seen.dirty[p] = false;
                }
            }
            self.loop_seen = Some(seen);
        }
        let want = self.preload;
        for (p, host) in POOL.iter().enumerate() {
            let kept = self.regs.held[p].is_some()
                && want.held[p] == self.regs.held[p]
                && want.dirty[p]
                && !clobbered.contains(&host[3]);
            if self.regs.dirty[p] && !kept {
                self.store_pool(p)?;
            }
        }
        Ok(self.regs)
    }

    /// After [`Self::loop_back_keep`] and the checks, before the jump to
    /// the loop top: the host registers hold the guest registers the top
    /// expects, reloaded from the `Cpu` where they are not already there
    /// or were `clobbered` since (the `Cpu` is exact for them: every
    /// dirty register not kept in place was stored). The jump follows:
    /// no code after it has this mapping (the ways out of the checks store
    /// what `loop_back_keep` answered), so nothing is left dirty.
    pub(super) fn loop_back_regs(&mut self, clobbered: &[Register]) -> Result<(), NotTranslated> {
        let now = self.regs;
        let want = self.preload;
        for (p, h) in want.held.iter().enumerate() {
            if let Some(idx) = *h {
                if now.held[p] != Some(idx) || clobbered.contains(&POOL[p][3]) {
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
                    | Register::R12
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
