//! Small instructions translated code runs without a call-out: CLD and
//! STD, MOV from CR2 at CPL 0 (a page-fault handler's first read), and
//! the bit scans and counts of a register (BSF, BSR, TZCNT, LZCNT,
//! POPCNT), each with exactly the interpreter's effects.

use super::forms::Extra;
use super::*;
use crate::cpu::state::rflags;
use iced_x86::code_asm::dl;

/// Which bit scan or count ([`Extra::BitCount`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BitCount {
    Bsf,
    Bsr,
    Tzcnt,
    Lzcnt,
    Popcnt,
}

/// [`Extra::BitCount`] of `i` (register operands of 32 or 64 bits), when
/// the host has the instruction (TZCNT needs BMI1, LZCNT ABM, POPCNT its
/// own bit: without them the encodings mean other things or nothing).
pub(super) fn bit_count_form(i: &iced_x86::Instruction) -> Option<Extra> {
    use iced_x86::{Mnemonic as M, OpKind};
    if i.op0_kind() != OpKind::Register || i.op1_kind() != OpKind::Register {
        return None;
    }
    let op = match i.mnemonic() {
        M::Bsf => BitCount::Bsf,
        M::Bsr => BitCount::Bsr,
        M::Tzcnt if std::arch::is_x86_feature_detected!("bmi1") => BitCount::Tzcnt,
        M::Lzcnt if std::arch::is_x86_feature_detected!("lzcnt") => BitCount::Lzcnt,
        M::Popcnt if std::arch::is_x86_feature_detected!("popcnt") => BitCount::Popcnt,
        _ => return None,
    };
    let (dst, size) = crate::cpu::fast::gpr(i.op0_register())?;
    let (src, src_size) = crate::cpu::fast::gpr(i.op1_register())?;
    (matches!(size, Size::B4 | Size::B8) && src_size == size && dst < 16 && src < 16)
        .then_some(Extra::BitCount { op, dst, src, size })
}

impl Emitter {
    /// CLD (`set` false) or STD: RFLAGS.DF in the state, as the
    /// interpreter sets it (no fault, at any CPL). The arithmetic flags
    /// stay the guest's wherever they are (in r15 if only the host held
    /// them: the OR or AND clobbers the host's).
    pub(super) fn direction(&mut self, set: bool) -> Result<(), NotTranslated> {
        self.save_flags()?;
        let df = rflags::DF as i32;
        let fl = dword_ptr(rbx + self.o.rflags);
        if set {
            self.a.or(fl, df)?;
        } else {
            self.a.and(fl, !df)?;
        }
        Ok(())
    }

    /// MOV of CR2 to 64-bit register `dst` at CPL 0 with no events to
    /// check, as `Cpu::exec_system` runs it there: the serializing cost,
    /// then the register (CR2 reads never exit to the hypervisor). The
    /// interpreter also moves the mode epoch, as for every system
    /// instruction; CR2 is not in the first-level TLB's key context, so
    /// that resync changes nothing (as for CLI, STI and SWAPGS). Elsewhere
    /// (#GP above CPL 0; the interpreter leaving the block after a system
    /// instruction when events are to be checked) the interpreter runs it.
    pub(super) fn mov_from_cr2(&mut self, k: usize, dst: u8) -> Result<(), NotTranslated> {
        let (full, mut cont) = self.begin_inline()?;
        self.unless_cpl0_without_events(full)?;
        self.add_cycles(self.o.serializing_cost)?;
        let cr2 = self.state_at(std::mem::offset_of!(crate::cpu::state::CpuState, cr2));
        self.a.mov(rax, qword_ptr(rbx + cr2))?;
        self.store_from(ACC, dst, Size::B8)?;
        self.end_inline(k, full, &mut cont, false)
    }

    /// BSF, BSR, TZCNT, LZCNT or POPCNT of register `src` into `dst`
    /// (`size` 32 or 64 bits) with the interpreter's results (`alu::bsf`
    /// and the others, `Cpu::exec_bitscan`): the host instruction, and the
    /// flags made from its ZF and CF, not taken whole (the SDM leaves some
    /// undefined). BSF and BSR of 0 leave the whole destination register
    /// as it was and set ZF; otherwise ZF is cleared; no other flag moves.
    /// TZCNT and LZCNT set CF (a zero source) and ZF (a zero count), clear
    /// SF AF PF and keep OF; POPCNT sets ZF (a zero source) and clears
    /// the other five.
    pub(super) fn bit_count(
        &mut self,
        op: BitCount,
        dst: u8,
        src: u8,
        size: Size,
    ) -> Result<(), NotTranslated> {
        use crate::cpu::state::rflags::{ARITH, CF, OF, ZF};
        self.capture_if_dirty()?;
        let s = si(size);
        // rcx = the source (zero-extended from 32 bits).
        self.load(SEC, src, size)?;
        let mask = match op {
            BitCount::Bsf | BitCount::Bsr => {
                // rdx = the index, or with a zero source (host ZF) the
                // whole old destination.
                self.load(ACC, dst, Size::B8)?;
                let code = if op == BitCount::Bsf {
                    Code::Bsf_r64_rm64
                } else {
                    Code::Bsr_r64_rm64
                };
                self.add(Instruction::with2(code, Register::RDX, Register::RCX))?;
                self.a.cmovz(rdx, rax)?;
                self.a.setz(cl)?;
                self.store_from(DXR, dst, Size::B8)?;
                self.a.movzx(ecx, cl)?;
                self.a.shl(ecx, ZF.trailing_zeros())?;
                ZF
            }
            _ => {
                let code = match (op, size) {
                    (BitCount::Tzcnt, Size::B4) => Code::Tzcnt_r32_rm32,
                    (BitCount::Tzcnt, _) => Code::Tzcnt_r64_rm64,
                    (BitCount::Lzcnt, Size::B4) => Code::Lzcnt_r32_rm32,
                    (BitCount::Lzcnt, _) => Code::Lzcnt_r64_rm64,
                    (_, Size::B4) => Code::Popcnt_r32_rm32,
                    _ => Code::Popcnt_r64_rm64,
                };
                self.add(Instruction::with2(code, ACC[s], SEC[s]))?;
                // rcx = ZF, and for TZCNT/LZCNT CF (SETcc and MOVZX keep
                // the host flags).
                self.a.setz(cl)?;
                self.a.setb(dl)?;
                self.a.movzx(ecx, cl)?;
                self.a.shl(ecx, ZF.trailing_zeros())?;
                if op == BitCount::Popcnt {
                    ARITH
                } else {
                    self.a.movzx(edx, dl)?;
                    self.a.or(ecx, edx)?;
                    const _: () = assert!(CF == 1);
                    ARITH & !OF
                }
            }
        };
        self.merge_rflags(mask as u32)?;
        if !matches!(op, BitCount::Bsf | BitCount::Bsr) {
            self.store_acc(dst, size)?;
        }
        Ok(())
    }
}
