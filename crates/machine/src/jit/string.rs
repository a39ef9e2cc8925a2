//! REP STOS and REP MOVS ([`Extra::RepString`]): a run that lies whole in
//! one page of each operand, where the first-level TLB serves the first
//! element, is the host's own REP STOS/MOVS on the host addresses.
//!
//! That is what the interpreter's run does there (`Cpu::exec_string` and
//! `Cpu::string_run` in `cpu/exec.rs`): with DF clear and 64-bit
//! addresses it translates the first element's page once (the source for
//! reading, then the destination for writing), and the later elements of
//! the page hit the first-level TLB, which changes nothing; it stores the
//! whole run with `store_repeated` / `copy_repeated`, which leave the
//! memory as element-by-element stores do (a forward copy whose ranges
//! overlap included: the host's REP MOVS is architecturally element by
//! element too) unless the destination frame holds decoded code or the
//! range is not RAM, neither of which a first-level hit for the fast path
//! allows (the write probe checks the code marks; slots hold frames in
//! memory only). Element by element it goes only under MMIO emulation or
//! while DR7 enables breakpoints, and translated code never runs then
//! (the run loop takes one instruction at a time). A run of one element
//! (`string_run` leaves it to the element's own accesses) translates and
//! stores the same way.
//!
//! Cycles: the instruction's own cost is charged with the block's; each
//! element after the first adds `instruction + string_iteration`, as
//! `exec_string` charges them.
//!
//! A MOVS destination's first-level miss is filled only where the TLB
//! holds a usable entry for it (a hit: no entry removed or inserted), so
//! the source's slot, which the interpreter has used already, survives
//! the fill; a destination the TLB lacks (or whose entry does not allow
//! the write) goes to the interpreter before anything is done.
//!
//! Everything else (DF set, a run leaving a page, a destination frame
//! holding code, a first-level miss that the fill leaves to the
//! interpreter) is the instruction through the interpreter, with nothing
//! done before but the fills. RCX = 0 does nothing at all (no access, no
//! extra cycle).

use super::forms::Extra;
use super::*;
use crate::cpu::state::rflags;

/// [`Extra::RepString`] of `i` (with a REP or REPNE prefix, which the
/// interpreter takes alike for STOS and MOVS): 64-bit addresses (RDI,
/// RSI and RCX whole), no LOCK, and for MOVS a source through a segment
/// whose base is 0 in 64-bit mode (not FS or GS, whose base `linear`
/// adds); the destination is always ES (base 0).
pub(super) fn rep_string_form(i: &Instruction) -> Option<Extra> {
    use iced_x86::{Mnemonic as M, OpKind};
    if i.has_lock_prefix() || i.op0_kind() != OpKind::MemoryESRDI {
        return None;
    }
    let movs = match i.mnemonic() {
        M::Stosb | M::Stosw | M::Stosd | M::Stosq => false,
        M::Movsb | M::Movsw | M::Movsd | M::Movsq => {
            if i.op1_kind() != OpKind::MemorySegRSI
                || matches!(i.memory_segment(), Register::FS | Register::GS)
            {
                return None;
            }
            true
        }
        _ => return None,
    };
    let size = Size::from_bytes(i.memory_size().size())?;
    Some(Extra::RepString { movs, size })
}

impl Emitter {
    /// [`Extra::RepString`] of instruction `k` at `ip` (see the module
    /// documentation). A first-level miss of the first access (the source
    /// for MOVS, the destination for STOS) is filled as the interpreter's
    /// translation would fill it, then everything is checked again. A miss
    /// of MOVS's destination is filled only through a TLB hit
    /// ([`fill::NO_REMOVAL`]), then the destination alone is probed again,
    /// the source's host address kept in r13: a walk could evict the
    /// source's TLB entry (emptying its slot), and were the fill then to
    /// leave the instruction to the interpreter (a frame holding code),
    /// the interpreter would translate the source a second time. The
    /// guest flags end in `state.rflags`.
    pub(super) fn rep_string(
        &mut self,
        k: usize,
        ip: u64,
        movs: bool,
        size: Size,
    ) -> Result<(), NotTranslated> {
        let cost = i32::try_from(self.o.instruction_cost + self.o.string_iteration_cost)
            .map_err(|_| NotTranslated::Unsupported("a string iteration cost above 2^31"))?;
        let (full, mut cont, miss, retry) = self.begin_filled()?;
        // MOVS: the destination's slow path (labels and access).
        let mut dst = None;
        let bytes = size.bytes() as i32;
        let shift = bytes.trailing_zeros();
        let reg = |e: &Self, idx: u8| qword_ptr(rbx + e.gpr_at(idx));
        let (rax_at, rcx_at, rsi_at, rdi_at) =
            (reg(self, 0), reg(self, 1), reg(self, 6), reg(self, 7));
        self.a.mov(rcx, rcx_at)?;
        self.a.test(rcx, rcx)?;
        self.a.je(cont)?;
        self.a
            .test(dword_ptr(rbx + self.o.rflags), rflags::DF as i32)?;
        self.a.jne(full)?;
        // At most a page of elements (so that the byte count below cannot
        // wrap), then the whole run inside each operand's page.
        self.a.cmp(rcx, 0x1000 >> shift)?;
        self.a.ja(full)?;
        self.a.mov(r8, rcx)?;
        if shift > 0 {
            self.a.shl(r8, shift)?;
        }
        let in_page = |e: &mut Self, at| -> Result<(), NotTranslated> {
            e.a.mov(rax, at)?;
            e.a.mov(edx, eax)?;
            e.a.and(edx, 0xfff)?;
            e.a.add(rdx, r8)?;
            e.a.cmp(rdx, 0x1000)?;
            e.a.ja(full)?;
            Ok(())
        };
        in_page(self, rdi_at)?;
        if movs {
            in_page(self, rsi_at)?;
            // The source first, as the interpreter translates it (rax is
            // RSI); its host address in rsi (free: no guest register is
            // held in host registers around `Extra` forms, and the probe
            // keeps it).
            self.fast_access(false, size, miss)?;
            let read = self.access;
            // Its host address in r13 (callee-saved: it survives the
            // destination's fill; free, as the cache is off here).
            self.a.mov(r13, rdx)?;
            let (dst_miss, dst_full) = (self.a.create_label(), self.a.create_label());
            let dst_retry = self.retry_point()?;
            self.a.mov(rax, rdi_at)?;
            self.fast_access(true, size, dst_miss)?;
            // The destination's miss is filled only where the fill cannot
            // remove a TLB entry (`fill::NO_REMOVAL`): the source, already
            // translated, must stay in its slot for the interpreter should
            // the fill leave the instruction to it; after a fill the
            // destination alone is probed again (at `dst_retry`).
            let (class, bytes) = self.access;
            dst = Some((
                dst_miss,
                dst_full,
                dst_retry,
                (class, bytes | fill::NO_REMOVAL),
            ));
            self.access = read;
            self.a.mov(rsi, r13)?;
        } else {
            self.a.mov(rax, rdi_at)?;
            self.fast_access(true, size, miss)?;
            self.a.mov(rax, rax_at)?;
        }
        // rdx: the destination's host address; rcx: the count again (the
        // probes clobbered it).
        self.a.mov(rcx, rcx_at)?;
        self.a.lea(r8, qword_ptr(rcx - 1))?;
        self.a.imul_3(r8, r8, cost)?;
        self.a.add(qword_ptr(rbx + self.o.cycles), r8)?;
        self.a.mov(rdi, rdx)?;
        // (The host's DF is clear: the ABI's state on entry, and generated
        // code never sets it.)
        let rep = match (movs, size) {
            (false, Size::B1) => Instruction::with_rep_stosb(64),
            (false, Size::B2) => Instruction::with_rep_stosw(64),
            (false, Size::B4) => Instruction::with_rep_stosd(64),
            (false, Size::B8) => Instruction::with_rep_stosq(64),
            (true, Size::B1) => Instruction::with_rep_movsb(64),
            (true, Size::B2) => Instruction::with_rep_movsw(64),
            (true, Size::B4) => Instruction::with_rep_movsd(64),
            (true, Size::B8) => Instruction::with_rep_movsq(64),
        };
        self.add(rep)?;
        // The bytes done, added to RDI (and RSI); RCX is 0.
        self.a.sub(rdi, rdx)?;
        self.a.add(rdi_at, rdi)?;
        if movs {
            self.a.add(rsi_at, rdi)?;
        }
        self.a.mov(rcx_at, 0)?;
        self.a.set_label(&mut cont)?;
        self.a.zero_bytes()?;
        self.filled_slow(k, Some(ip), miss, full, retry, cont, FlagsAt::State);
        if let Some((dst_miss, dst_full, dst_retry, access)) = dst {
            self.access = access;
            let exit = FlagsAt::State;
            self.filled_slow(k, Some(ip), dst_miss, dst_full, dst_retry, cont, exit);
        }
        Ok(())
    }
}
