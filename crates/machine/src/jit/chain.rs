//! Leaving a translated block: chaining straight into the next block's
//! code where the run loop would go straight on, or returning to it.

use super::*;
use crate::cpu::code_cache::MAX_INSN_LEN;
use crate::cpu::l1tlb::{book, slot_index};
use iced_x86::code_asm::{al, r15d, r8d, AsmRegister64};

/// Whether the translator runs this indirect JMP/CALL as host code (with
/// [`Emitter::indirect`]): through a register, or through memory (an
/// inline read of the target).
pub(crate) fn is_native_indirect(f: &Fast) -> bool {
    match f {
        Fast::JmpR { .. } | Fast::CallR { .. } => true,
        // An FS/GS-relative pointer is read like any other: `lea` adds the
        // segment base.
        Fast::JmpM { .. } | Fast::CallM { .. } => true,
        _ => false,
    }
}

/// Offsets of `ChainEntry`'s fields that generated code reads.
const CHAIN_VERSION: i32 = std::mem::offset_of!(ChainEntry, version) as i32;
const CHAIN_ENTRY: i32 = std::mem::offset_of!(ChainEntry, entry) as i32;
const CHAIN_BLOCK: i32 = std::mem::offset_of!(ChainEntry, block) as i32;

/// Where in the first-level TLB's book the version of the fetch slot of
/// `target`'s page is, for code of privilege `user`.
fn fetch_version_offset(user: bool, target: u64) -> i32 {
    book::FETCH_VERSIONS + ((usize::from(user) * SLOTS + slot_index(target)) * 8) as i32
}

impl Emitter {
    /// Instruction `k` completed and execution goes on at `target` (the
    /// flags written back): try to chain. The target is known here, so
    /// the checks of [`Self::chain_try`] are made with it as a constant
    /// (its first-level iTLB slot and chaining-table slot computed now);
    /// a loop to the block's own start goes to the block's self-loop exit.
    pub(super) fn leave_to(&mut self, k: usize, target: u64) -> Result<(), NotTranslated> {
        if self.is_self_loop(target) {
            return self.self_loop_exit(k, None);
        }
        // Whatever comes next looks at the `Cpu` (`jit/regs.rs`).
        self.flush_regs()?;
        self.a.mov(rax, target)?;
        let o = self.o;
        let n = k as u32 + 1;
        // r8 (this block's instructions) is set only on the ways out (the
        // shared exits read it); the chained way adds the constant.
        let mut out = self.a.create_label();
        let mut miss = self.a.create_label();
        self.a.mov(r9, n as u64 * o.instruction_cost)?;
        self.a.add(r9, qword_ptr(rbx + o.cycles))?;
        self.a.cmp(r9, qword_ptr(rbx + o.jit_deadline))?;
        self.a.jae(out)?;
        // Checked before and nothing changed since: the table's entry for
        // the target recorded the version its first-level iTLB slot has
        // now (see `ChainEntry::version`).
        let mut full = self.a.create_label();
        let s = chain_slot(target) as i32 * CHAIN_ENTRY_BYTES;
        self.a.mov(r10, qword_ptr(r14 + ENV_CHAIN))?;
        self.a.cmp(rax, qword_ptr(r10 + s))?;
        self.a.jne(full)?;
        self.fetch_version(target)?;
        self.a.cmp(rcx, qword_ptr(r10 + s + CHAIN_VERSION))?;
        self.a.jne(full)?;
        self.count_chained(true, Some(n))?;
        self.enter_chained(s)?;
        self.a.set_label(&mut full)?;
        // An instruction there may cross into the next page: such a block
        // is not in the table, so where the table does not give a block,
        // ask `Cpu::jit_chain_crossing`.
        let crossing = target & 0xfff > 0x1000 - MAX_INSN_LEN as u64;
        let mut cross = if crossing { self.a.create_label() } else { out };
        self.fetch_probe(miss, Some(target))?;
        self.chain_lookup(cross, Some((target, n)))?;
        if crossing {
            self.a.set_label(&mut cross)?;
            self.a.mov(r8d, n)?;
            self.chain_crossing(self.chain_out)?;
        }
        self.a.set_label(&mut miss)?;
        self.a.mov(r8d, n)?;
        self.a.jmp(self.fetch_miss)?;
        self.a.set_label(&mut out)?;
        self.a.mov(r8d, n)?;
        self.a.jmp(self.chain_out)?;
        Ok(())
    }

    /// Instruction `k` completed and execution goes on at `target`, with
    /// the guest flags where the emitter's state says (not yet written
    /// back, possibly): [`Self::leave_to`] after writing them back, except
    /// for a loop to the block's own start whose flags are dead at entry
    /// (`flags::flags_live_at_entry`): there they are kept in r15 and only
    /// written back on the ways that leave (see [`Self::self_loop_exit`]).
    pub(super) fn exit_to(&mut self, k: usize, target: u64) -> Result<(), NotTranslated> {
        if self.loop_live && self.is_self_loop(target) {
            // The loop top takes the flags in r15 (AF made exact there).
            let af_clear = if !self.dirty {
                self.load_saved()?;
                false
            } else {
                if !self.saved {
                    debug_assert!(self.host_valid);
                    self.save_flags()?;
                }
                self.af_clear
            };
            if af_clear {
                // AF is bit 4 of LAHF's AH: bit 12 of r15.
                self.a.and(r15d, !((AF << 8) as i32))?;
            }
            self.dirty = false;
            self.saved = false;
            self.host_valid = false;
            return self.self_loop_exit(k, Some(false));
        }
        if self.dirty && !self.live_at_entry && self.is_self_loop(target) {
            if !self.saved {
                debug_assert!(self.host_valid);
                self.save_flags()?;
            }
            let af_clear = self.af_clear;
            self.dirty = false;
            self.saved = false;
            self.host_valid = false;
            return self.self_loop_exit(k, Some(af_clear));
        }
        self.capture_if_dirty()?;
        self.leave_to(k, target)
    }

    /// Whether `target` is this block's own start, reached through its
    /// self-loop exit: not for a page-crossing instruction's block (its
    /// host-physical address `u64::MAX`: only the run loop enters it), nor
    /// where the frame's code-write generation slot is not a 32-bit
    /// displacement away.
    pub(super) fn is_self_loop(&self, target: u64) -> bool {
        let (rip, hpa, _) = self.own;
        target == rip && hpa != u64::MAX && (hpa >> 12) * 4 <= i32::MAX as u64
    }

    /// Instruction `k` went on at the block's own start (a loop, see
    /// [`Self::is_self_loop`]). As [`Self::chain_try`] would with the
    /// target known: the table would give this block (the block running
    /// is always in the table: the run loop puts the block it runs there,
    /// chaining finds blocks there, and nothing changes the table while
    /// generated code runs), so instead of the lookup the fetch's
    /// first-level iTLB slot (a constant offset) is compared with this
    /// block's page and frame, the frame's code-write generation (a
    /// constant address) with this block's, and the jump goes straight to
    /// the chained entry. Those compares are made only when Rust has run
    /// since they last passed (`Cpu::jit_loop_recheck`): only Rust changes
    /// the slot or the generation while generated code runs, and the
    /// block was checked when it was chained into (or entered from Rust,
    /// which sets the flag). Every count is a constant: k + 1 instructions
    /// (added as an immediate; r8 is set only on the way to the fetch),
    /// r9 the cycles after them.
    ///
    /// With `saved` (the AF-clear bit of their last writer) the guest
    /// flags are in r15, not in `state.rflags`, and are dead at the
    /// block's entry: the way that loops leaves them there (the block
    /// writes all six before anything observes the state's copy); the
    /// ways that leave (the deadline reached, the probe missed, another
    /// frame or generation) write them back first. The compares clobber
    /// the host flags, which is why they are in r15.
    fn self_loop_exit(&mut self, k: usize, saved: Option<bool>) -> Result<(), NotTranslated> {
        let (rip, hpa, generation) = self.own;
        let o = self.o;
        let out = self.a.create_label();
        let miss = self.a.create_label();
        let n = k as u32 + 1;
        // rax is the cycle count below (not a pool register: the guest
        // registers the loop top holds stay in theirs across the back
        // edge, r9 included).
        let kept = self.loop_back_keep()?;
        self.a.mov(rax, n as u64 * o.instruction_cost)?;
        self.a.add(rax, qword_ptr(rbx + o.cycles))?;
        self.a.cmp(rax, qword_ptr(rbx + o.jit_deadline))?;
        self.a.jae(out)?;
        // What follows holds as it did at the last check, or when the
        // block was chained into, unless Rust has run since
        // (`Cpu::jit_loop_recheck`).
        let mut checked = self.a.create_label();
        self.a.cmp(qword_ptr(rbx + o.jit_loop_recheck), 0)?;
        self.a.je(checked)?;
        // The fetch: a first-level iTLB hit for this privilege (changing
        // nothing) in the slot of this page, on this block's frame.
        let class = 2 * 2 + self.user as usize;
        let slot = ((class * SLOTS + slot_index(rip)) * SLOT_BYTES) as i32;
        self.cmp_const(slot + SLOT_JIT_PAGE as i32, rip >> 12)?;
        self.a.jne(miss)?;
        self.cmp_const(slot + SLOT_HPA as i32, hpa & !0xfff)?;
        self.a.jne(out)?;
        // The frame's code-write generation (`is_self_loop`: a 32-bit
        // displacement).
        self.a.mov(rcx, qword_ptr(r14 + ENV_CODE_GENERATION))?;
        self.a.cmp(
            dword_ptr(rcx + ((hpa >> 12) * 4) as i32),
            generation as u32 as i32,
        )?;
        self.a.jne(out)?;
        self.a.mov(qword_ptr(rbx + o.jit_loop_recheck), 0)?;
        self.a.set_label(&mut checked)?;
        // The counts, as `count_chained` adds them (the block ended in is
        // already the one reported).
        self.a.add(qword_ptr(rbx + o.instructions), n as i32)?;
        self.a.mov(qword_ptr(rbx + o.cycles), rax)?;
        if self.loop_live && saved.is_none() {
            // (Written back: the loop top takes them in r15.)
            self.load_saved()?;
        }
        // The guest registers the loop top holds in host registers.
        self.loop_back_regs()?;
        self.a.jmp(self.loop_top)?;
        // The ways out: the guest registers kept dirty stored, the flags
        // written back, rax the target.
        for (mut l, to_miss) in [(miss, true), (out, false)] {
            self.a.set_label(&mut l)?;
            self.store_dirty(&kept)?;
            if let Some(af_clear) = saved {
                self.capture_saved(af_clear)?;
            }
            self.a.mov(rax, rip)?;
            if to_miss {
                // Where the run loop's fetch would fill the iTLB (r8: this
                // block's instructions).
                self.a.mov(r8d, n)?;
                self.a.jmp(self.fetch_miss)?;
            } else {
                self.a.mov(qword_ptr(rbx + o.next_rip), rax)?;
                self.a.mov(eax, ((k as u32) << 8) | status::LEAVE as u32)?;
                self.a.jmp(self.epilogue)?;
            }
        }
        Ok(())
    }

    /// Compares the qword at rbp + `off` with `v`: as an immediate where
    /// it sign-extends to `v`, else through rdx (clobbered).
    fn cmp_const(&mut self, off: i32, v: u64) -> Result<(), NotTranslated> {
        if v <= i32::MAX as u64 {
            self.a.cmp(qword_ptr(rbp + off), v as i32)?;
        } else {
            self.a.mov(rdx, v)?;
            self.a.cmp(rdx, qword_ptr(rbp + off))?;
        }
        Ok(())
    }

    /// Chaining into a page-crossing block at rax (r8, r9 as for
    /// [`Self::count_chained`]) through `Cpu::jit_chain_crossing`, which
    /// also reports the block; to `out` (rax, r8 kept) if it gives none.
    fn chain_crossing(&mut self, out: CodeLabel) -> Result<(), NotTranslated> {
        // Four slots keep rsp 16-byte aligned for the call.
        self.a.push(rax)?;
        self.a.push(r8)?;
        self.a.push(r9)?;
        self.a.sub(rsp, 8)?;
        self.a.mov(rdi, rbx)?;
        self.a.mov(rsi, qword_ptr(r14 + ENV_MEMORY))?;
        self.a.mov(rdx, rax)?;
        self.a.call(qword_ptr(r14 + ENV_CHAIN_CROSSING))?;
        self.a.add(rsp, 8)?;
        self.a.pop(r9)?;
        self.a.pop(r8)?;
        self.a.mov(rcx, rax)?;
        self.a.pop(rax)?;
        self.a.test(rcx, rcx)?;
        self.a.je(out)?;
        self.count_chained(false, None)?;
        self.a.mov(qword_ptr(rsp), rdx)?;
        self.a.jmp(rcx)?;
        Ok(())
    }

    /// Instruction `k`, an indirect JMP or CALL (see
    /// [`is_native_indirect`]; the last of its block): the target from the
    /// register or through an inline read, CALL's return address pushed
    /// through an inline write, then on to the target as after RET
    /// (chaining through the table). When an inline access cannot be
    /// served or the target is not canonical (#GP), the interpreter runs
    /// the instruction: nothing is written before every check passed, so
    /// the interpreter starts from the same state.
    pub(super) fn indirect(
        &mut self,
        k: usize,
        f: &Fast,
        next_ip: u64,
        epilogue: CodeLabel,
    ) -> Result<(), NotTranslated> {
        // The slow path needs the flags exact in `state.rflags`.
        self.capture_if_dirty()?;
        self.host_valid = false;
        let slow = self.a.create_label();
        let call = matches!(f, Fast::CallR { .. } | Fast::CallM { .. });
        // The target, in r15: kept across the inline accesses and the calls
        // of their slow paths (callee-saved; free, the flags being written
        // back, so no inline access saves them there).
        match *f {
            Fast::JmpR { src } | Fast::CallR { src } => {
                let g = self.g(src)?;
                self.add(Instruction::with2(Code::Mov_r64_rm64, Register::R15, g))?;
            }
            Fast::JmpM { m } | Fast::CallM { m } => {
                // The pointer's read: a first-level miss filled (the
                // interpreter's first translation; its fault the
                // instruction's), then probed again.
                let miss = self.a.create_label();
                let full = self.a.create_label();
                let retry = self.retry_point()?;
                self.lea(&m)?;
                self.fast_access(false, Size::B8, miss)?;
                self.a.mov(r15, qword_ptr(rdx))?;
                // (The call-out of `full` always leaves the block.)
                self.filled_slow(k, None, miss, full, retry, epilogue, FlagsAt::State);
            }
            _ => return Err(NotTranslated::Unsupported("not a native indirect branch")),
        }
        self.check_canonical(r15, slow)?;
        if call {
            // The push, with the whole CALL through the interpreter on its
            // slow path (the target only read so far).
            self.inline_memory(k, &Fast::Call { target: 0 }, next_ip, epilogue)?;
        }
        self.a.mov(rax, r15)?;
        self.jump_chained(k, slow, epilogue)
    }

    /// Jumps to `slow` unless `reg` holds a canonical address (clobbers
    /// rdx).
    pub(super) fn check_canonical(
        &mut self,
        reg: AsmRegister64,
        slow: CodeLabel,
    ) -> Result<(), NotTranslated> {
        self.a.mov(rdx, reg)?;
        self.a.shl(rdx, 16)?;
        self.a.sar(rdx, 16)?;
        self.a.cmp(rdx, reg)?;
        self.a.jne(slow)?;
        Ok(())
    }

    /// Instruction `k`, the last of its block, went on to the RIP in rax:
    /// the shared chaining exit. Its slow path `slow` runs it through the
    /// interpreter, which always leaves the block (it never comes back).
    pub(super) fn jump_chained(
        &mut self,
        k: usize,
        slow: CodeLabel,
        epilogue: CodeLabel,
    ) -> Result<(), NotTranslated> {
        self.a.mov(ecx, k as u32)?;
        self.a.jmp(self.chain)?;
        self.slow
            .push(Slow::whole(slow, k, epilogue, false, self.regs));
        Ok(())
    }

    /// The block ends after instruction `ecx` with the next RIP in rax.
    /// Where the run loop would go straight on to the next block (no
    /// call-out asked to stop, no events to check, cycle limit and timer
    /// deadline not reached: all one compare with `Cpu::jit_deadline`) and
    /// the next block is translated, in the chaining table for this frame
    /// generation and privilege, and its fetch is a first-level iTLB hit
    /// (so fetching it changes nothing), jump to it after counting this
    /// block's instructions and cycles as the run loop would. Otherwise
    /// return: leave at instruction `ecx`.
    ///
    /// A loop to the block's own start has its own exit
    /// ([`Self::self_loop_exit`]).
    pub(super) fn chain_try(&mut self, epilogue: CodeLabel) -> Result<(), NotTranslated> {
        // The shared exit's way out is also the one of the exits to known
        // targets (`leave_to`).
        let mut out = self.chain_out;
        let o = self.o;
        self.a.lea(r8, qword_ptr(rcx + 1))?;
        // r9 = r8 * the instruction cost, without a multiply for the
        // usual costs.
        match o.instruction_cost {
            1 => self.a.mov(r9, r8)?,
            2 => self.a.lea(r9, qword_ptr(r8 + r8))?,
            c @ (4 | 8) => self.a.lea(r9, qword_ptr(r8 * (c as u32)))?,
            c => self.a.imul_3(r9, r8, c as i32)?,
        }
        self.a.add(r9, qword_ptr(rbx + o.cycles))?;
        self.a.cmp(r9, qword_ptr(rbx + o.jit_deadline))?;
        self.a.jae(out)?;
        self.fetch_probe(self.fetch_miss, None)?;
        self.chain_lookup(out, None)?;
        self.a.set_label(&mut out)?;
        self.a.mov(qword_ptr(rbx + o.next_rip), rax)?;
        self.a.lea(rax, qword_ptr(r8 - 1))?;
        self.a.shl(rax, 8)?;
        self.a.or(rax, status::LEAVE as i32)?;
        self.a.jmp(epilogue)?;
        Ok(())
    }

    /// The exits' way when the next block's fetch (RIP in rax, this
    /// block's instructions in r8, the deadline compare passed) misses the
    /// first-level iTLB, which the run loop's fetch would fill: ask
    /// `Cpu::jit_chain_fetch`, which either changes nothing (then out as
    /// before, through `chain_out`), or makes that fetch exactly as the run
    /// loop would after adding this block's counts and gives the chained
    /// entry and block to jump to (it reports the block itself), or a
    /// status for the run loop (`FETCHED`, `FETCH_FAULT`).
    ///
    /// First, most such misses being TLB hits, the fill thunk
    /// (`jit::tlb_fill`) gets the fetch's first-level fill: where it can
    /// (the fetch a usable TLB hit through the page's hint), it makes the
    /// run loop's fetch with exactly its effects, and the exit is tried
    /// again from the start (the probe now hits); where it cannot, it
    /// changes nothing and `Cpu::jit_chain_fetch` is asked. Filling before
    /// the counts are added changes nothing they depend on, and the
    /// deadline compare that led here says the run loop would fetch there
    /// next (as for a chaining exit whose probe hits).
    pub(super) fn fetch_miss_exit(&mut self, epilogue: CodeLabel) -> Result<(), NotTranslated> {
        let mut miss = self.fetch_miss;
        self.a.set_label(&mut miss)?;
        // Two slots keep rsp 16-byte aligned for the call.
        self.a.push(rax)?;
        self.a.push(r8)?;
        self.a.mov(rdx, rax)?;
        let class = 2 * 2 + self.user as u32;
        self.a.mov(ecx, class | 1 << 8)?;
        self.a.mov(rax, self.helpers.fill)?;
        self.a.call(rax)?;
        self.a.mov(ecx, eax)?;
        self.a.pop(r8)?;
        self.a.pop(rax)?;
        const _: () = assert!(fill::RETRY == 0);
        self.a.test(ecx, ecx)?;
        self.a.jne(self.fetch_rust)?;
        // The exit again, as from instruction r8 - 1.
        self.a.lea(ecx, qword_ptr(r8 - 1))?;
        self.a.jmp(self.chain)?;
        let mut rust = self.fetch_rust;
        self.a.set_label(&mut rust)?;
        self.a.push(rax)?;
        self.a.push(r8)?;
        self.a.mov(rdi, rbx)?;
        self.a.mov(rsi, qword_ptr(r14 + ENV_MEMORY))?;
        self.a.mov(rdx, rax)?;
        self.a.mov(rcx, r8)?;
        self.a.call(qword_ptr(r14 + ENV_CHAIN_FETCH))?;
        self.a.pop(r8)?;
        self.a.mov(rcx, rax)?;
        self.a.pop(rax)?;
        let mut go = self.a.create_label();
        self.a.test(rcx, rcx)?;
        self.a.jne(go)?;
        self.a.test(rdx, rdx)?;
        self.a.je(self.chain_out)?;
        self.a.mov(rax, rdx)?;
        self.a.jmp(epilogue)?;
        self.a.set_label(&mut go)?;
        self.a.mov(qword_ptr(rsp), rdx)?;
        self.a.jmp(rcx)?;
        Ok(())
    }

    /// A call-out returned the status word in rax (not "go on"): after a
    /// branch it ran (status `LEAVE`, the target in `Cpu::next_rip`), try
    /// to chain as after a native branch (the call-out has set
    /// `Cpu::jit_deadline` to 0 if the run loop must look at anything
    /// first); otherwise (a fault, a store into code) return the status.
    ///
    /// After a call-out that changed the privilege or the code size or
    /// asked for an event check (status `LEAVE_FETCH`), the way on is
    /// `Cpu::jit_chain_fetch`'s (that of a chaining exit whose iTLB probe
    /// missed): the event check, then the fetch at the new privilege.
    pub(super) fn call_exit(&mut self, epilogue: CodeLabel) -> Result<(), NotTranslated> {
        let mut fetch = self.a.create_label();
        self.a.cmp(al, status::LEAVE as i32)?;
        self.a.jne(fetch)?;
        self.a.mov(rcx, rax)?;
        self.a.shr(rcx, 8)?;
        self.a.mov(rax, qword_ptr(rbx + self.o.next_rip))?;
        self.a.jmp(self.chain)?;
        self.a.set_label(&mut fetch)?;
        self.a.cmp(al, status::LEAVE_FETCH as i32)?;
        self.a.jne(epilogue)?;
        // r8 = this block's instructions (k + 1), rax = the RIP.
        self.a.mov(r8, rax)?;
        self.a.shr(r8, 8)?;
        self.a.add(r8, 1)?;
        self.a.mov(rax, qword_ptr(rbx + self.o.next_rip))?;
        // (Not through the fill thunk: the privilege may have changed.)
        self.a.jmp(self.fetch_rust)?;
        Ok(())
    }

    /// The fetch of the block at rax (`target`: rax is that constant):
    /// jumps to `out` unless it is a first-level iTLB hit for this
    /// privilege (one that changes nothing, as the interpreter's fetch
    /// would be); otherwise leaves its host-physical address in rdx and its
    /// frame number in r11. One compare: the slots hold nothing stale
    /// while generated code runs, and a page whose frame is outside memory
    /// never matches (`l1tlb`). Keeps rax and r8-r10; clobbers rcx and the
    /// flags.
    pub(super) fn fetch_probe(
        &mut self,
        out: CodeLabel,
        target: Option<u64>,
    ) -> Result<(), NotTranslated> {
        let class = 2 * 2 + self.user as usize;
        let c = (class * SLOTS * SLOT_BYTES) as i32;
        match target {
            Some(t) => {
                // The slot is known: rbp + its offset.
                let slot = c + (slot_index(t) * SLOT_BYTES) as i32;
                self.cmp_const(slot + SLOT_JIT_PAGE as i32, t >> 12)?;
                self.a.jne(out)?;
                self.a.mov(rdx, qword_ptr(rbp + (slot + SLOT_HPA as i32)))?;
            }
            None => {
                self.probe_l1(c, 0, out)?;
                self.a
                    .mov(rdx, qword_ptr(rbp + rcx + (c + SLOT_HPA as i32)))?;
            }
        }
        self.a.mov(r11, rdx)?;
        self.a.shr(r11, 12)?;
        match target {
            Some(t) => self.a.or(rdx, (t & 0xfff) as i32)?,
            None => {
                self.a.mov(ecx, eax)?;
                self.a.and(ecx, 0xfff)?;
                self.a.or(rdx, rcx)?;
            }
        }
        Ok(())
    }

    /// Chaining through the table: rax the RIP, rdx its host-physical
    /// address, r11 its frame. With `known` = (target, instructions), rax
    /// is that constant and this block's instruction count the other
    /// (else in r8).
    pub(super) fn chain_lookup(
        &mut self,
        out: CodeLabel,
        known: Option<(u64, u32)>,
    ) -> Result<(), NotTranslated> {
        // The chaining table's slot for this RIP: r10 + s.
        let s = match known {
            Some((t, _)) => {
                self.a.mov(r10, qword_ptr(r14 + ENV_CHAIN))?;
                chain_slot(t) as i32 * CHAIN_ENTRY_BYTES
            }
            None => {
                self.a.mov(r10, rax)?;
                self.a.shr(r10, 12)?;
                self.a.xor(r10, rax)?;
                self.a.and(r10d, (CHAIN_SLOTS - 1) as i32)?;
                self.a.imul_3(r10, r10, CHAIN_ENTRY_BYTES)?;
                self.a.add(r10, qword_ptr(r14 + ENV_CHAIN))?;
                0
            }
        };
        self.a.cmp(rax, qword_ptr(r10 + s))?;
        self.a.jne(out)?;
        self.a.cmp(rdx, qword_ptr(r10 + s + 8))?;
        self.a.jne(out)?;
        self.a.cmp(qword_ptr(r10 + s + 40), self.user as i32)?;
        self.a.jne(out)?;
        self.a.mov(rcx, qword_ptr(r14 + ENV_CODE_GENERATION))?;
        self.a.mov(ecx, dword_ptr(rcx + r11 * 4))?;
        self.a.cmp(rcx, qword_ptr(r10 + s + 16))?;
        self.a.jne(out)?;
        if let Some((t, _)) = known {
            // Checked in full: the slot's version recorded for the next
            // time (`leave_to`).
            self.fetch_version(t)?;
            self.a.mov(qword_ptr(r10 + s + CHAIN_VERSION), rcx)?;
        }
        self.count_chained(true, known.map(|(_, n)| n))?;
        self.enter_chained(s)
    }

    /// rcx = the version of `target`'s first-level iTLB slot for this
    /// block's privilege (`Book::fetch_versions`).
    fn fetch_version(&mut self, target: u64) -> Result<(), NotTranslated> {
        self.a.mov(rcx, qword_ptr(r14 + ENV_L1_BOOK))?;
        self.a.mov(
            rcx,
            qword_ptr(rcx + fetch_version_offset(self.user, target)),
        )?;
        Ok(())
    }

    /// Into the chained entry of the table entry at r10 + `s`, reporting
    /// its block where call-outs find it (clobbers rcx).
    fn enter_chained(&mut self, s: i32) -> Result<(), NotTranslated> {
        self.a.mov(rcx, qword_ptr(r10 + s + CHAIN_BLOCK))?;
        self.a.mov(qword_ptr(rsp), rcx)?;
        self.a.jmp(qword_ptr(r10 + s + CHAIN_ENTRY))?;
        Ok(())
    }

    /// Going on to the next block: this block's counts (`instructions`,
    /// or r8 without it; r9 the cycle count after them), as the run loop
    /// adds them, and with `report` the RIP chained to (rax) as the block
    /// the code is in.
    pub(super) fn count_chained(
        &mut self,
        report: bool,
        instructions: Option<u32>,
    ) -> Result<(), NotTranslated> {
        let o = self.o;
        match instructions {
            Some(n) => self.a.add(qword_ptr(rbx + o.instructions), n as i32)?,
            None => self.a.add(qword_ptr(rbx + o.instructions), r8)?,
        }
        self.a.mov(qword_ptr(rbx + o.cycles), r9)?;
        if report {
            self.a.mov(qword_ptr(rbx + o.jit_chain_rip), rax)?;
        }
        Ok(())
    }
}
