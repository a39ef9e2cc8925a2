//! The MMX register moves: MOVD and MOVQ between MM0-MM7 and general
//! registers or memory, MOVQ between MMX registers, and EMMS (Intel SDM
//! Vol. 1 ch. 9). MMX arithmetic is not implemented, so CPUID does not
//! report MMX; the moves are what compilers and kvm-unit-tests' `emulator`
//! use to spill through the MMX registers.
//!
//! MMi is bits 63:0 of the physical x87 register Ri. Every MMX
//! instruction but EMMS sets TOP to 0 and tags all registers valid; a
//! write to MMi sets bits 79:64 of Ri to all ones. EMMS tags every
//! register empty. Each is #UD with CR0.EM, #NM with CR0.TS, and #MF
//! while an unmasked x87 exception is pending, checked in that order.

use super::state::cr0;
use super::{vector, Cpu, Fault};
use crate::alu::Size;
use crate::memory::PhysMemory;
use iced_x86::{Instruction, Mnemonic as M, OpKind, Register};

/// The MMX register `r` names (0-7), if it is one.
fn mmx_index(r: Register) -> Option<usize> {
    let n = (r as usize).wrapping_sub(Register::MM0 as usize);
    (n < 8).then_some(n)
}

/// Whether `i` is an MMX move or EMMS (this module's instructions).
pub(super) fn is_mmx_move(i: &Instruction) -> bool {
    match i.mnemonic() {
        M::Emms => true,
        M::Movd | M::Movq => (0..i.op_count())
            .any(|n| i.op_kind(n) == OpKind::Register && mmx_index(i.op_register(n)).is_some()),
        _ => false,
    }
}

impl Cpu {
    /// MOVD/MOVQ with an MMX register, or EMMS.
    pub(super) fn exec_mmx_move(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        if self.state.cr0 & cr0::EM != 0 {
            return Err(Fault::exception(vector::UD));
        }
        if self.state.cr0 & cr0::TS != 0 {
            return Err(Fault::exception(vector::NM));
        }
        if self.x87_exception_pending() {
            return Err(Fault::exception(vector::MF));
        }
        if i.mnemonic() == M::Emms {
            self.state.fpu.ftw = 0;
            return Ok(());
        }
        let size = if i.mnemonic() == M::Movd {
            Size::B4
        } else {
            Size::B8
        };
        let value = match i.op_kind(1) {
            OpKind::Register => match mmx_index(i.op_register(1)) {
                Some(n) => self.state.fpu.st[n] as u64,
                None => self.reg(i.op_register(1)),
            },
            _ => {
                let la = self.effective_address(i);
                self.read_mem(mem, la, size)?
            }
        } & size.mask();
        match i.op_kind(0) {
            OpKind::Register => match mmx_index(i.op_register(0)) {
                Some(n) => self.state.fpu.st[n] = u128::from(value) | 0xffff << 64,
                None => self.set_reg(i.op_register(0), value),
            },
            _ => {
                let la = self.effective_address(i);
                self.write_mem(mem, la, size, value)?;
            }
        }
        // MMX mode: TOP = 0, every register valid.
        let f = &mut self.state.fpu;
        f.fsw &= !(7 << 11);
        f.ftw = 0xff;
        Ok(())
    }
}
