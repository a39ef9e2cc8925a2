//! POPFQ, SYSCALL and SYSRETQ in host code, at the case a Linux kernel
//! runs them in (each a call-out into the interpreter otherwise, on every
//! system call and every `local_irq_restore`).
//!
//! Each form checks everything that would make the interpreter do more
//! than the common case (a fault, a single-step trap, an SMAP change of
//! the first-level TLB's lookup-key context) before it changes anything,
//! and runs the instruction through the interpreter (the call-out) where
//! one holds. Then it makes exactly the interpreter's state changes, and
//! leaves the block the way the call-out path would (`Cpu::jit_call_out`):
//! a privilege change or an event check goes on through
//! `Cpu::jit_chain_fetch` (status `LEAVE_FETCH`'s way, `Emitter::call_exit`),
//! which makes the run loop's event check and fetch at the new privilege.
//!
//! The mode epoch: the interpreter moves it for POPF always and for
//! SYSCALL and SYSRET under CR4.SMAP, and the call-out then resyncs the
//! first-level TLB (`Cpu::sync_l1`). The resync changes nothing unless the
//! key context changed (`L1Tlb::resync`); of that context these change
//! only RFLAGS.AC under SMAP (`Book::smap_ac`). So the forms do not move
//! it, and fall back to the call-out when that AC would change (rare:
//! Linux's STAC and CLAC change it, which have their own form).

use super::*;
use crate::cpu::l1tlb::book;
use crate::cpu::state::{cr4, efer, rflags, seg_attr, CpuState, Segment};
use std::mem::offset_of;

/// The RFLAGS bits POPF writes at CPL 0 (`Cpu::exec_popf`'s mask: IOPL
/// and IF writable there).
const POPF_MASK: u64 = rflags::WRITABLE & !rflags::RF;
const _: () = assert!(POPF_MASK < 1 << 31);

/// The RFLAGS bits SYSRET loads from R11 (`Cpu::exec_sysret`).
const SYSRET_MASK: u64 = 0x3c_7fd7;

/// POPFQ, SYSCALL (64-bit) or SYSRETQ: its form, if any.
pub(super) fn privileged_form(op: &Op) -> Option<forms::Extra> {
    use forms::Extra;
    let next_ip = op.next_ip;
    match op.fast {
        Fast::System(SystemOp::Syscall) => Some(Extra::Syscall { next_ip }),
        Fast::System(SystemOp::Sysretq) => Some(Extra::Sysret),
        Fast::Generic if op.insn.code() == Code::Popfq && !op.insn.has_rep_prefix() => {
            Some(Extra::Popf { next_ip })
        }
        _ => None,
    }
}

impl Emitter {
    /// POPFQ at CPL 0, as `Cpu::exec_popf`: the quadword at RSP read
    /// through the first-level TLB (a miss filled as the interpreter's
    /// stack read), RFLAGS = (old & !mask) | (popped & mask) | FIXED1, RSP
    /// += 8, and an event check asked for when IF changed. Through the
    /// interpreter instead at CPL 1 to 3 (the IOPL and IF rules), and
    /// when the popped value sets TF (a single-step trap after the next
    /// instruction) or changes RFLAGS.AC under SMAP (the first-level
    /// TLB's SMAP revocations). POPF ends its block; with an event check
    /// to make (asked for now or before) the block goes on as the
    /// call-out's `LEAVE_FETCH`, otherwise to the next instruction.
    pub(super) fn popf(&mut self, k: usize, ip: u64, next_ip: u64) -> Result<(), NotTranslated> {
        if self.user {
            // Code translated for CPL 3 never runs at CPL 0.
            let (full, mut cont) = self.begin_inline()?;
            self.a.jmp(full)?;
            return self.end_inline(k, full, &mut cont, false);
        }
        let o = self.o;
        let (full, mut cont, miss, retry) = self.begin_filled()?;
        // 64-bit code runs in protected mode: the CPL is CS.RPL.
        self.a.test(word_ptr(rbx + o.cs_selector), 3)?;
        self.a.jne(full)?;
        self.a.mov(rax, qword_ptr(rbx + self.gpr_at(4)))?;
        self.fast_access(false, Size::B8, miss)?;
        // r8 = the popped value; rdx = old RFLAGS; r8 = new RFLAGS.
        self.a.mov(r8, qword_ptr(rdx))?;
        self.a.test(r8d, rflags::TF as i32)?;
        self.a.jne(full)?;
        self.a.mov(rdx, qword_ptr(rbx + o.rflags))?;
        self.a.and(r8d, POPF_MASK as i32)?;
        self.a.mov(rcx, rdx)?;
        self.a.and(rcx, !POPF_MASK as i32)?;
        self.a.or(r8, rcx)?;
        self.a.or(r8, rflags::FIXED1 as i32)?;
        self.unless_smap_ac_kept(r8, full)?;
        // Nothing changed so far: now the instruction's effects.
        self.a.mov(qword_ptr(rbx + o.rflags), r8)?;
        self.a.add(qword_ptr(rbx + self.gpr_at(4)), 8)?;
        let mut same_if = self.a.create_label();
        self.a.xor(rdx, r8)?;
        self.a.test(edx, rflags::IF as i32)?;
        self.a.je(same_if)?;
        self.a.mov(byte_ptr(rbx + o.check_events), 1)?;
        self.a.set_label(&mut same_if)?;
        self.a.cmp(byte_ptr(rbx + o.check_events), 0)?;
        self.a.je(cont)?;
        // (Next: the call-out's way after an instruction that leaves its
        // block with an event check asked for.)
        self.a.mov(rax, next_ip)?;
        self.fetch_exit(k)?;
        self.a.set_label(&mut cont)?;
        self.filled_slow(k, Some(ip), miss, full, retry, cont, FlagsAt::State);
        Ok(())
    }

    /// SYSCALL (in 64-bit code), as `Cpu::exec_syscall`: RCX = the next
    /// instruction's address, R11 = RFLAGS without RF, RFLAGS without
    /// FMASK's bits and RF, CS and SS the flat ring-0 segments of
    /// STAR[47:32], the privilege-transition cycles; then on at LSTAR at
    /// the new privilege. Through the interpreter when EFER.SCE is clear
    /// (#UD), or when RFLAGS would keep TF (its trap) or change AC under
    /// SMAP.
    pub(super) fn syscall(&mut self, k: usize, next_ip: u64) -> Result<(), NotTranslated> {
        let o = self.o;
        let (full, mut cont) = self.begin_inline()?;
        self.a.test(
            dword_ptr(rbx + self.state_at(offset_of!(CpuState, efer))),
            efer::SCE as i32,
        )?;
        self.a.je(full)?;
        // rdx = old RFLAGS; r8 = new.
        self.a.mov(rdx, qword_ptr(rbx + o.rflags))?;
        self.a.mov(
            r8,
            qword_ptr(rbx + self.state_at(offset_of!(CpuState, fmask))),
        )?;
        self.a.or(r8, rflags::RF as i32)?;
        self.a.not(r8)?;
        self.a.and(r8, rdx)?;
        self.a.or(r8, rflags::FIXED1 as i32)?;
        self.a.test(r8d, rflags::TF as i32)?;
        self.a.jne(full)?;
        self.unless_smap_ac_kept(r8, full)?;
        self.a.mov(qword_ptr(rbx + o.rflags), r8)?;
        self.a.and(rdx, !rflags::RF as i32)?;
        self.a.mov(qword_ptr(rbx + self.gpr_at(11)), rdx)?;
        self.a.mov(rax, next_ip)?;
        self.a.mov(qword_ptr(rbx + self.gpr_at(1)), rax)?;
        // The selector: STAR[47:32] with RPL 0.
        self.a.mov(
            rax,
            qword_ptr(rbx + self.state_at(offset_of!(CpuState, star))),
        )?;
        self.a.shr(rax, 32)?;
        self.a.and(eax, 0xfffc)?;
        self.flat_segments(false)?;
        self.add_cycles(o.privilege_transition)?;
        self.a.mov(
            rax,
            qword_ptr(rbx + self.state_at(offset_of!(CpuState, lstar))),
        )?;
        self.chain_into_kernel(k)?;
        self.end_inline(k, full, &mut cont, false)
    }

    /// Instruction `k` (SYSCALL) completed, changed the privilege to 0 and
    /// asked for no event check; execution goes on at the RIP in rax. As
    /// `Cpu::jit_chain_fetch` would (`fetch_exit`), without the call where
    /// its answer is known here: where the run loop would go straight on
    /// (the deadline compare) and the fetch there is a first-level iTLB
    /// hit in the supervisor class (changing nothing) of a block the
    /// chaining table holds translated for CPL 0, on into it after this
    /// block's counts; the deadline reached, out to the run loop; anything
    /// else through `fetch_exit`.
    fn chain_into_kernel(&mut self, k: usize) -> Result<(), NotTranslated> {
        let o = self.o;
        let n = k as u32 + 1;
        let (mut out, mut rust) = (self.a.create_label(), self.a.create_label());
        self.a.mov(r8d, n)?;
        self.a.mov(r9, n as u64 * o.instruction_cost)?;
        self.a.add(r9, qword_ptr(rbx + o.cycles))?;
        self.a.cmp(r9, qword_ptr(rbx + o.jit_deadline))?;
        self.a.jae(out)?;
        // The probe and the lookup of the new privilege's class and
        // translations (`user` is the emitter's, the block's own,
        // elsewhere).
        let user = std::mem::replace(&mut self.user, false);
        let chained = self
            .fetch_probe(rust, None)
            .and_then(|()| self.chain_lookup(rust, None));
        self.user = user;
        chained?;
        self.a.set_label(&mut rust)?;
        self.fetch_exit(k)?;
        self.a.set_label(&mut out)?;
        self.a.jmp(self.chain_out)?;
        Ok(())
    }

    /// SYSRETQ at CPL 0, as `Cpu::exec_sysret`: RFLAGS from R11, CS and SS
    /// the flat ring-3 segments of STAR[63:48], the privilege-transition
    /// cycles, an event check asked for; then on at RCX at CPL 3. Through
    /// the interpreter when EFER.SCE is clear (#UD), at CPL 1 or 2 (#GP),
    /// with RCX not canonical (#GP), or when R11 sets TF (its trap) or
    /// changes AC under SMAP.
    pub(super) fn sysret(&mut self, k: usize) -> Result<(), NotTranslated> {
        let o = self.o;
        let (full, mut cont) = self.begin_inline()?;
        self.a.test(word_ptr(rbx + o.cs_selector), 3)?;
        self.a.jne(full)?;
        self.a.test(
            dword_ptr(rbx + self.state_at(offset_of!(CpuState, efer))),
            efer::SCE as i32,
        )?;
        self.a.je(full)?;
        self.a.mov(r9, qword_ptr(rbx + self.gpr_at(1)))?;
        self.check_canonical(r9, full)?;
        self.a.mov(r8, qword_ptr(rbx + self.gpr_at(11)))?;
        self.a.and(r8d, SYSRET_MASK as i32)?;
        self.a.or(r8d, rflags::FIXED1 as i32)?;
        self.a.test(r8d, rflags::TF as i32)?;
        self.a.jne(full)?;
        self.unless_smap_ac_kept(r8, full)?;
        self.a.mov(qword_ptr(rbx + o.rflags), r8)?;
        // The selectors: STAR[63:48] + 16 and + 8, RPL 3 (16-bit sums).
        self.a.movzx(
            eax,
            word_ptr(rbx + self.state_at(offset_of!(CpuState, star) + 6)),
        )?;
        self.flat_segments(true)?;
        self.add_cycles(o.privilege_transition)?;
        self.a.mov(byte_ptr(rbx + o.check_events), 1)?;
        self.a.mov(rax, r9)?;
        self.fetch_exit(k)?;
        self.end_inline(k, full, &mut cont, false)
    }

    /// To `full` unless RFLAGS `new` (in a host register) leaves the
    /// first-level TLB's key-context AC (`Book::smap_ac`: RFLAGS.AC under
    /// CR4.SMAP) as it is. Clobbers rcx, r10 and the host flags.
    fn unless_smap_ac_kept(
        &mut self,
        new: iced_x86::code_asm::AsmRegister64,
        full: CodeLabel,
    ) -> Result<(), NotTranslated> {
        let mut smap = self.a.create_label();
        // ecx = the context's AC after: AC's bit under SMAP, else 0.
        self.a.mov(rcx, new)?;
        self.a.shr(ecx, rflags::AC.trailing_zeros())?;
        self.a.and(ecx, 1)?;
        self.a.test(dword_ptr(rbx + self.o.cr4), cr4::SMAP as i32)?;
        self.a.jne(smap)?;
        self.a.xor(ecx, ecx)?;
        self.a.set_label(&mut smap)?;
        self.a.mov(r10, qword_ptr(r14 + ENV_L1_BOOK))?;
        self.a.cmp(qword_ptr(r10 + book::SMAP_AC), rcx)?;
        Ok(self.a.jne(full)?)
    }

    /// CS and SS of SYSCALL (`user` false: selectors ax & !3 and ax + 8)
    /// or SYSRET (selectors (ax + 16) | 3 and (ax + 8) | 3): base 0, limit
    /// 4 GiB, the flat 64-bit code and data attributes of that ring.
    /// Clobbers rax and rcx.
    fn flat_segments(&mut self, user: bool) -> Result<(), NotTranslated> {
        let cs = offset_of!(CpuState, cs);
        let ss = offset_of!(CpuState, ss);
        self.a.lea(ecx, qword_ptr(rax + 8))?;
        if user {
            self.a.add(eax, 16)?;
            self.a.or(eax, 3)?;
            self.a.or(ecx, 3)?;
        }
        let (code, data) = if user {
            (seg_attr::CODE64_USER, seg_attr::DATA_USER)
        } else {
            (seg_attr::CODE64_KERNEL, seg_attr::DATA_KERNEL)
        };
        for (seg, sel, attr) in [(cs, Register::AX, code), (ss, Register::CX, data)] {
            let base = self.state_at(seg);
            let at = |f: usize| base + f as i32;
            self.add(Instruction::with2(
                Code::Mov_rm16_r16,
                self.field(at(offset_of!(Segment, selector))),
                sel,
            ))?;
            self.a
                .mov(qword_ptr(rbx + at(offset_of!(Segment, base))), 0)?;
            self.a
                .mov(dword_ptr(rbx + at(offset_of!(Segment, limit))), -1)?;
            self.a
                .mov(dword_ptr(rbx + at(offset_of!(Segment, attr))), attr as i32)?;
        }
        Ok(())
    }

    /// Instruction `k` completed and left the block for the RIP in rax
    /// with a privilege change or an event check to make: on as after a
    /// call-out's `LEAVE_FETCH` (`Emitter::call_exit`), through
    /// `Cpu::jit_chain_fetch`.
    fn fetch_exit(&mut self, k: usize) -> Result<(), NotTranslated> {
        self.a.mov(r8d, k as u32 + 1)?;
        self.a.jmp(self.fetch_rust)?;
        Ok(())
    }
}
