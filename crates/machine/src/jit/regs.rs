//! Guest registers in host registers, write-through.
//!
//! The `Cpu` stays the only home of the guest registers: every write
//! still stores the value there, so exits, call-outs, faults and the
//! interpreter find the state exact without anything to copy back. What
//! the cache adds is a copy: after a 32- or 64-bit write through
//! [`Emitter::store_acc`], one of the caller-saved host registers the
//! block body does not otherwise use ([`POOL`]) holds the whole 64-bit
//! value, and later reads of that guest register in the block take it
//! from there instead of loading it back from the `Cpu`. The 32- and
//! 64-bit register forms (MOV, the ALU group, TEST, INC/DEC, CMOVcc,
//! IMUL, shifts and rotates by an immediate) run on those host registers
//! themselves ([`Emitter::hold_reg`], [`Emitter::claim_reg`]), the result
//! then stored to the `Cpu` ([`Emitter::store_held`]): no round trip
//! through rax and rcx. That takes the
//! store-to-load forwarding of the `Cpu` slot off a chain of dependent
//! guest instructions (`mov rax, rbx; shl rax, 13; xor rax, rbx` was a
//! chain of read-modify-writes of one memory slot).
//!
//! Where the copy could go stale or the host register be clobbered, the
//! mapping is dropped (nothing is ever written back):
//!
//! - a write of the guest register that does not go through
//!   `store_acc` (an 8- or 16-bit read-modify-write of its slot, POP's
//!   store) forgets that register ([`Emitter::forget_reg`]);
//! - an instruction the cache does not follow (a call-out, an `Extra`
//!   form, RET and the indirect branches, which use some of these host
//!   registers or call into Rust) runs with the cache off and empty
//!   ([`Emitter::regs_off`]);
//! - the block's entry (also that of chained blocks and of a block's loop
//!   to itself) starts empty;
//! - an inline access's slow path calls into Rust (the fill, the
//!   interpreter), which clobbers these registers: before it goes back to
//!   probe again or on after the instruction it reloads, from the `Cpu`,
//!   every register the fast path holds at that point (recorded in
//!   [`Slow`]), so both ways meet with the same mapping.

use super::*;

/// Host registers that may hold guest registers (by width: 8, 16, 32, 64
/// bits). Caller-saved: the block body uses none of them outside
/// instructions that run with the cache off, and every call reloads them.
/// (R9 last: a loop back clobbers it with the cycle count.)
const POOL: [[Register; 4]; 6] = [
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
    [Register::R9L, Register::R9W, Register::R9D, Register::R9],
];

/// Which guest register each pool register holds, at one point of the
/// generated code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Regs {
    /// For each pool register, the guest register it holds.
    held: [Option<u8>; POOL.len()],
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

    /// The pool register that will hold guest register `idx`: the one
    /// holding it already, else a free one, else the next in turn (its
    /// guest register dropped: the `Cpu` has it).
    fn take(&mut self, idx: u8) -> usize {
        let p = match self.find(idx) {
            Some(p) => p,
            None => match self.held.iter().position(Option::is_none) {
                Some(p) => p,
                None => {
                    let p = self.next as usize;
                    self.next = ((p + 1) % POOL.len()) as u8;
                    p
                }
            },
        };
        self.held[p] = Some(idx);
        p
    }
}

impl Emitter {
    /// Guest register `idx` at `size` in a host register, if one holds it.
    pub(super) fn cached_reg(&self, idx: u8, size: Size) -> Option<Register> {
        if !self.regs.on {
            return None;
        }
        self.regs.find(idx & 15).map(|p| POOL[p][si(size)])
    }

    /// After `gpr[idx]` was written at `size` from rax (the whole 64-bit
    /// value in rax for 32 and 64 bits): a pool register holds it too, or
    /// (8 and 16 bits) none does.
    pub(super) fn remember_acc(&mut self, idx: u8, size: Size) -> Result<(), NotTranslated> {
        let idx = idx & 15;
        if !self.regs.on || !matches!(size, Size::B4 | Size::B8) {
            self.forget_reg(idx);
            return Ok(());
        }
        let p = self.regs.take(idx);
        self.add(Instruction::with2(
            Code::Mov_r64_rm64,
            POOL[p][3],
            Register::RAX,
        ))?;
        self.regs.acc = Some((idx, self.a.instructions().len()));
        Ok(())
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
        let p = self.regs.take(idx);
        let m = self.g(idx);
        self.add(Instruction::with2(Code::Mov_r64_rm64, POOL[p][3], m))?;
        Ok(Some(POOL[p]))
    }

    /// A pool register (by width) to hold guest register `idx`, its value
    /// not loaded: for an instruction that only writes it. Its operands
    /// are to be looked up before: the claim maps `idx` to a register
    /// holding no value yet (a source it evicts still has its value there
    /// when the instruction reads it).
    pub(super) fn claim_reg(&mut self, idx: u8) -> Option<[Register; 4]> {
        if !self.regs.on {
            return None;
        }
        Some(POOL[self.regs.take(idx & 15)])
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
    pub(super) fn wide_claim(&mut self, idx: u8, size: Size) -> Option<[Register; 4]> {
        match size {
            Size::B4 | Size::B8 => self.claim_reg(idx),
            _ => None,
        }
    }

    /// `gpr[idx] = host` (the whole 64-bit pool register [`Self::hold_reg`]
    /// or [`Self::claim_reg`] gave for `idx`, written by the instruction
    /// just emitted: a 32-bit result already zero-extended).
    pub(super) fn store_held(&mut self, idx: u8, host: [Register; 4]) -> Result<(), NotTranslated> {
        debug_assert_eq!(self.cached_reg(idx, Size::B8), Some(host[3]));
        let m = self.g(idx);
        self.add(Instruction::with2(Code::Mov_rm64_r64, m, host[3]))
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
                let m = self.g(src);
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

    /// `gpr[idx]` was written other than through [`Self::store_acc`]: no
    /// host register holds it any more.
    pub(super) fn forget_reg(&mut self, idx: u8) {
        let idx = idx & 15;
        for h in self.regs.held.iter_mut() {
            if *h == Some(idx) {
                *h = None;
            }
        }
    }

    /// The cache empty and off: for an instruction it does not follow, and
    /// for the code emitted after the block body.
    pub(super) fn regs_off(&mut self) {
        self.regs = Regs {
            on: false,
            ..Regs::default()
        };
    }

    /// The cache on again, empty (after [`Self::regs_off`]).
    pub(super) fn regs_on(&mut self) {
        self.regs = Regs::default();
    }

    /// Before a loop back to the loop top: the host registers hold the
    /// guest registers the top expects (`Emitter::preload`), reloaded
    /// from the `Cpu` where they are not already there or were
    /// `clobbered` since. Notes the first mapping found at a loop back
    /// (what the second translation preloads).
    pub(super) fn loop_back_regs(&mut self, clobbered: &[Register]) -> Result<(), NotTranslated> {
        let now = if self.regs.on {
            self.regs
        } else {
            Regs::default()
        };
        if self.loop_seen.is_none() {
            let mut seen = now;
            seen.acc = None;
            for (p, h) in seen.held.iter_mut().enumerate() {
                if clobbered.contains(&POOL[p][3]) {
                    *h = None;
                }
            }
            self.loop_seen = Some(seen);
        }
        let want = self.preload;
        for (p, h) in want.held.iter().enumerate() {
            if let Some(idx) = *h {
                if now.held[p] != Some(idx) || clobbered.contains(&POOL[p][3]) {
                    let m = self.g(idx);
                    self.add(Instruction::with2(Code::Mov_r64_rm64, POOL[p][3], m))?;
                }
            }
        }
        Ok(())
    }

    /// Loads from the `Cpu` every guest register `at` says a pool register
    /// holds (a slow path going back to code that expects them there).
    pub(super) fn reload_regs(&mut self, at: &Regs) -> Result<(), NotTranslated> {
        for (p, h) in at.held.iter().enumerate() {
            if let Some(idx) = *h {
                let m = self.g(idx);
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
    fn the_pool_is_caller_saved_and_outside_the_pinned_registers() {
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
                    | Register::R13
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
