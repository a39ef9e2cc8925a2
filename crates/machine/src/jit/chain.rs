//! Leaving a translated block: chaining straight into the next block's
//! code where the run loop would go straight on, or returning to it.

use super::*;

impl Emitter {
    /// Instruction `k` completed and execution goes on at `target` (the
    /// flags written back): try to chain.
    pub(super) fn leave_to(&mut self, k: usize, target: u64) -> Result<(), NotTranslated> {
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
    pub(super) fn chain_try(
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
        self.itlb_probe(out)?;
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
    pub(super) fn chain_lookup(&mut self, out: CodeLabel) -> Result<(), NotTranslated> {
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
    pub(super) fn count_chained(&mut self) -> Result<(), NotTranslated> {
        let o = self.o;
        self.a.add(qword_ptr(rbx + o.instructions), r8)?;
        self.a.mov(qword_ptr(rbx + o.cycles), r9)?;
        self.a.mov(qword_ptr(rbx + o.jit_chained), 1)?;
        self.a.mov(qword_ptr(rbx + o.jit_chain_rip), rax)?;
        Ok(())
    }

    /// The fetch at rax (a RIP) is a first-level iTLB hit for this
    /// privilege (so the interpreter's fetch would change nothing), or
    /// jump to `out`. Leaves the host-physical address in rdx and its
    /// frame in r11; clobbers rcx. One compare: the slots hold nothing
    /// stale while generated code runs, and a page whose frame is outside
    /// memory never matches (`l1tlb`).
    pub(super) fn itlb_probe(&mut self, out: CodeLabel) -> Result<(), NotTranslated> {
        let class = 2 * 2 + self.user as usize;
        let c = (class * SLOTS * SLOT_BYTES) as i32;
        self.a.mov(rdx, rax)?;
        self.a.shr(rdx, 12)?;
        self.a.lea(rcx, qword_ptr(rax + 0x1000))?;
        self.a.shr(rcx, 12 - SLOT_BYTES.trailing_zeros())?;
        self.a.and(ecx, ((SLOTS - 1) * SLOT_BYTES) as i32)?;
        self.a
            .cmp(rdx, qword_ptr(rbp + rcx + (c + SLOT_JIT_PAGE as i32)))?;
        self.a.jne(out)?;
        self.a
            .mov(rdx, qword_ptr(rbp + rcx + (c + SLOT_HPA as i32)))?;
        self.a.mov(r11, rdx)?;
        self.a.shr(r11, 12)?;
        self.a.mov(ecx, eax)?;
        self.a.and(ecx, 0xfff)?;
        self.a.or(rdx, rcx)?;
        Ok(())
    }
}
