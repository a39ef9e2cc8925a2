//! Instructions that exist only outside 64-bit mode (compatibility,
//! protected and real mode): PUSHA/POPA, the BCD adjustments, BOUND, ARPL,
//! SALC and INTO. The decoder produces them only for 32- and 16-bit code
//! (in 64-bit code their bytes are invalid or mean something else), so
//! they need no mode check of their own.

use super::state::rflags;
use super::{vector, Cpu, Fault};
use crate::alu::{self, Size};
use crate::memory::PhysMemory;
use iced_x86::{Instruction, Mnemonic as M, OpKind};

/// Whether `m` is one of this module's instructions.
pub(super) fn is_legacy(m: M) -> bool {
    matches!(
        m,
        M::Pusha
            | M::Pushad
            | M::Popa
            | M::Popad
            | M::Daa
            | M::Das
            | M::Aaa
            | M::Aas
            | M::Aam
            | M::Aad
            | M::Bound
            | M::Arpl
            | M::Salc
            | M::Into
    )
}

impl Cpu {
    pub(super) fn exec_legacy(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        match i.mnemonic() {
            M::Pusha | M::Pushad => self.exec_pusha(mem, i),
            M::Popa | M::Popad => self.exec_popa(mem, i),
            M::Daa | M::Das => {
                self.decimal_adjust(i.mnemonic() == M::Das);
                Ok(())
            }
            M::Aaa | M::Aas => {
                self.ascii_adjust(i.mnemonic() == M::Aas);
                Ok(())
            }
            M::Aam => {
                let base = i.immediate8() as u64;
                if base == 0 {
                    return Err(Fault::exception(vector::DE));
                }
                let al = self.state.gpr[0] & 0xff;
                let r = ((al / base) << 8) | (al % base);
                self.set_gpr_sized(0, Size::B2, false, r);
                self.set_szp_of_al();
                Ok(())
            }
            M::Aad => {
                let base = i.immediate8() as u64;
                let ax = self.state.gpr[0];
                let al = ((ax & 0xff) + ((ax >> 8) & 0xff) * base) & 0xff;
                self.set_gpr_sized(0, Size::B2, false, al);
                self.set_szp_of_al();
                Ok(())
            }
            M::Salc => {
                let v = if self.state.rflags & rflags::CF != 0 {
                    0xff
                } else {
                    0
                };
                self.set_gpr_sized(0, Size::B1, false, v);
                Ok(())
            }
            M::Bound => self.exec_bound(mem, i),
            M::Arpl => {
                let dst = self.read_op(mem, i, 0, Size::B2)?;
                let src = self.reg(i.op1_register());
                if dst & 3 < src & 3 {
                    self.write_op(mem, i, 0, Size::B2, (dst & !3) | (src & 3))?;
                    self.state.rflags |= rflags::ZF;
                } else {
                    self.state.rflags &= !rflags::ZF;
                }
                Ok(())
            }
            M::Into => {
                if self.state.rflags & rflags::OF == 0 {
                    return Ok(());
                }
                self.software_exception(mem, i, vector::OF)
            }
            _ => Err(super::exec::ud()),
        }
    }

    /// SF, ZF and PF from AL (AAM, AAD); CF, AF and OF are left as the
    /// logic operations leave them (clear), one of the values the SDM
    /// allows for these undefined flags.
    fn set_szp_of_al(&mut self) {
        let al = self.state.gpr[0] & 0xff;
        self.state.rflags = alu::test(Size::B1, al, al, self.state.rflags);
    }

    /// DAA (`subtract` false) or DAS, as the SDM's pseudocode.
    fn decimal_adjust(&mut self, subtract: bool) {
        let old_al = self.state.gpr[0] & 0xff;
        let old_cf = self.state.rflags & rflags::CF != 0;
        let af = self.state.rflags & rflags::AF != 0;
        let mut al = old_al;
        let mut cf = false;
        let mut new_af = false;
        if al & 0xf > 9 || af {
            let (r, carry) = if subtract {
                (al.wrapping_sub(6), al < 6)
            } else {
                (al + 6, al + 6 > 0xff)
            };
            al = r & 0xff;
            cf = old_cf || carry;
            new_af = true;
        }
        if old_al > 0x99 || old_cf {
            al = if subtract {
                al.wrapping_sub(0x60)
            } else {
                al + 0x60
            } & 0xff;
            cf = true;
        } else if !subtract {
            cf = false;
        }
        self.set_gpr_sized(0, Size::B1, false, al);
        let mut fl = alu::test(Size::B1, al, al, self.state.rflags);
        fl &= !(rflags::CF | rflags::AF);
        if cf {
            fl |= rflags::CF;
        }
        if new_af {
            fl |= rflags::AF;
        }
        self.state.rflags = fl;
    }

    /// AAA (`subtract` false) or AAS.
    fn ascii_adjust(&mut self, subtract: bool) {
        let ax = self.state.gpr[0] & 0xffff;
        let adjust = ax & 0xf > 9 || self.state.rflags & rflags::AF != 0;
        let ax = if !adjust {
            ax
        } else if subtract {
            // AX - 6 (a borrow from AL reaches AH), then AH - 1.
            ax.wrapping_sub(6).wrapping_sub(0x100) & 0xffff
        } else {
            ax.wrapping_add(0x106) & 0xffff
        };
        self.set_gpr_sized(0, Size::B2, false, ax & 0xff0f);
        if adjust {
            self.state.rflags |= rflags::AF | rflags::CF;
        } else {
            self.state.rflags &= !(rflags::AF | rflags::CF);
        }
    }

    fn exec_pusha(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        let size = if i.mnemonic() == M::Pusha {
            Size::B2
        } else {
            Size::B4
        };
        let saved = self.state.gpr[4];
        let original_sp = saved & size.mask();
        for r in 0..8 {
            let v = if r == 4 {
                original_sp
            } else {
                self.state.gpr[r] & size.mask()
            };
            if let Err(f) = self.stack_push(mem, size, v) {
                self.state.gpr[4] = saved;
                return Err(f);
            }
        }
        Ok(())
    }

    fn exec_popa(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        let size = if i.mnemonic() == M::Popa {
            Size::B2
        } else {
            Size::B4
        };
        // Read all eight before writing any register.
        let mut values = [0u64; 8];
        for (k, v) in values.iter_mut().enumerate() {
            *v = self.stack_peek(mem, (k * size.bytes() as usize) as u64, size)?;
        }
        // Popped in the order DI, SI, BP, (SP skipped), BX, DX, CX, AX.
        for (k, &v) in values.iter().enumerate() {
            let r = 7 - k;
            if r != 4 {
                self.set_gpr_sized(r as u8, size, false, v);
            }
        }
        let sp = self.state.gpr[4].wrapping_add(8 * size.bytes() as u64);
        self.set_stack_pointer(sp);
        Ok(())
    }

    fn exec_bound(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        if i.op1_kind() != OpKind::Memory {
            return Err(super::exec::ud());
        }
        let size = Self::op_size(i, 0);
        let la = self.effective_address(i);
        let lower = size.sign_extend(self.read_mem(mem, la, size)?) as i64;
        let upper_la = self.linear(
            i.memory_segment(),
            self.operand_offset(i).wrapping_add(size.bytes() as u64),
        );
        let upper = size.sign_extend(self.read_mem(mem, upper_la, size)?) as i64;
        let index = size.sign_extend(self.reg(i.op0_register())) as i64;
        if index < lower || index > upper {
            return Err(Fault::exception(vector::BR));
        }
        Ok(())
    }

    /// A trap-like exception raised by an instruction (INTO): delivered
    /// with the return address after it, as a software exception is.
    fn software_exception(
        &mut self,
        mem: &PhysMemory,
        i: &Instruction,
        vec: u8,
    ) -> Result<(), Fault> {
        if let Some(v) = self.vmx.as_deref() {
            if v.exception_bitmap & (1 << vec) != 0 {
                return Err(Fault::exit(crate::vmx::VmExit::Exception {
                    vector: vec,
                    error_code: None,
                    qualification: 0,
                }));
            }
        }
        let ev = crate::vmx::EventInjection {
            kind: crate::vmx::EventKind::SoftwareInterrupt,
            vector: vec,
            error_code: None,
            instruction_len: i.len() as u8,
        };
        match self.deliver_event(mem, ev) {
            super::Step::Continue => {
                self.next_rip = self.state.rip;
                Ok(())
            }
            super::Step::Exit(e) => Err(Fault::exit(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    // The BCD adjustments against values worked from the SDM's pseudocode.
    use super::*;
    use crate::cpu::CpuConfig;

    fn run_adjust(al: u64, fl: u64, f: impl Fn(&mut Cpu)) -> (u64, u64) {
        let mut cpu = Cpu::new(CpuConfig::default());
        cpu.state_mut().gpr[0] = al;
        cpu.state_mut().rflags = fl | rflags::FIXED1;
        f(&mut cpu);
        (
            cpu.state.gpr[0],
            cpu.state.rflags & (rflags::CF | rflags::AF),
        )
    }

    #[test]
    fn daa_and_das_follow_the_sdm() {
        // 0x79 + 0x35 = 0xae -> DAA -> 0x14 with carry (79 + 35 = 114).
        assert_eq!(
            run_adjust(0xae, 0, |c| c.decimal_adjust(false)),
            (0x14, rflags::CF | rflags::AF)
        );
        // 0x35 - 0x47 = 0xee with CF -> DAS -> 0x88, CF (35 - 47 = -12).
        assert_eq!(
            run_adjust(0xee, rflags::CF, |c| c.decimal_adjust(true)),
            (0x88, rflags::CF | rflags::AF)
        );
        assert_eq!(run_adjust(0x12, 0, |c| c.decimal_adjust(false)), (0x12, 0));
    }

    #[test]
    fn aaa_and_aas_follow_the_sdm() {
        // AX = 0x000f: AAA -> AX = 0x0105, AF and CF.
        assert_eq!(
            run_adjust(0x0f, 0, |c| c.ascii_adjust(false)),
            (0x0105, rflags::CF | rflags::AF)
        );
        // AX = 0x020f: AAS -> AH 1, AL 9.
        assert_eq!(
            run_adjust(0x020f, 0, |c| c.ascii_adjust(true)),
            (0x0109, rflags::CF | rflags::AF)
        );
        // AX = 0x0002 with AF: AX - 6 borrows from AH, then AH - 1 (as
        // the host CPU does, found by the c32 difftest).
        assert_eq!(
            run_adjust(0x0002, rflags::AF, |c| c.ascii_adjust(true)),
            (0xfe0c, rflags::CF | rflags::AF)
        );
        assert_eq!(
            run_adjust(0x0234, 0, |c| c.ascii_adjust(false)),
            (0x0204, 0)
        );
    }
}
