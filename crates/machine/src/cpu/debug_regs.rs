//! Debug registers DR0-DR3, DR6 and DR7: `mov` to and from them with the
//! architectural checks (Intel SDM Vol. 2, "MOV—Move to/from Debug
//! Registers"; Vol. 3, 18.2), in the order KVM's emulator applies them:
//!
//! 1. CPL > 0: #GP(0);
//! 2. DR4/DR5 with CR4.DE set: #UD; with CR4.DE clear they alias DR6/DR7;
//!    DR8-DR15: #UD;
//! 3. DR7.GD (general detect) set: #DB before the move, with DR6.BD set and
//!    GD cleared so the handler can use the registers;
//! 4. a write of a 1 to bits 63:32 of DR6 or DR7: #GP(0).
//!
//! Reserved low bits read back as their fixed values (DR6 0xffff0ff0, DR7
//! bit 10). Instruction breakpoints (R/W = 00) fire as #DB faults before
//! the instruction at DRn's linear address unless RFLAGS.RF is set, and
//! RFLAGS.TF single-steps with DR6.BS (`Cpu::run_block`). Data and I/O
//! breakpoints (R/W = 01, 10, 11) are not modelled: they never fire.

use super::access::gpr_info;
use super::state::cr4;
use super::{vector, Cpu, Fault};
use iced_x86::Register;

/// DR6 bits that read back as 1 whatever is written (reserved, RTM and
/// bus-lock detection not supported).
pub const DR6_FIXED_1: u64 = 0xffff_0ff0;
/// DR6 bits software can change: B0-B3, BD, BS, BT.
pub const DR6_VOLATILE: u64 = 0xe00f;
/// DR6.BD: the #DB came from general detect.
pub const DR6_BD: u64 = 1 << 13;
/// DR7 bit 10 reads as 1.
pub const DR7_FIXED_1: u64 = 0x400;
/// DR7 bits software can change: L0-G3, LE, GE, RTM, GD, R/W and LEN.
pub const DR7_VOLATILE: u64 = 0xffff_2bff;
/// DR6.BS: the #DB came from single-stepping (RFLAGS.TF).
pub const DR6_BS: u64 = 1 << 14;
/// DR6.B0-B3: which breakpoint conditions were met.
pub const DR6_HITS: u64 = 0xf;
/// DR7.L0-G3: the local and global enables of the four breakpoints.
pub const DR7_ENABLES: u64 = 0xff;
/// DR7.GD: general detect, #DB on any debug-register move.
pub const DR7_GD: u64 = 1 << 13;

/// The debug registers' architectural state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct DebugRegs {
    /// DR0-DR3: breakpoint linear addresses (any 64-bit value).
    pub dr: [u64; 4],
    pub dr6: u64,
    pub dr7: u64,
}

impl Default for DebugRegs {
    /// The values after reset.
    fn default() -> Self {
        DebugRegs {
            dr: [0; 4],
            dr6: DR6_FIXED_1,
            dr7: DR7_FIXED_1,
        }
    }
}

impl Cpu {
    /// DR6 bits B0-B3 of the enabled instruction breakpoints (R/W = 00)
    /// at the linear address of the next instruction, if any.
    pub(super) fn instruction_breakpoint_hits(&self) -> Option<u64> {
        let s = &self.state;
        let la = if s.code_bits() == 64 {
            s.rip
        } else {
            s.cs.base.wrapping_add(s.rip) & 0xffff_ffff
        };
        let dr7 = s.debug.dr7;
        let hits = (0..4).fold(0, |hits, n| {
            let enabled = dr7 >> (2 * n) & 3 != 0;
            let execute = dr7 >> (16 + 4 * n) & 3 == 0;
            if enabled && execute && s.debug.dr[n] == la {
                hits | 1 << n
            } else {
                hits
            }
        });
        (hits != 0).then_some(hits)
    }

    /// Raises #DB with the DR6 conditions `bits` (B0-B3 replaced, as KVM
    /// delivers a #DB payload; BS, BD, BT kept).
    pub(super) fn debug_exception(
        &mut self,
        mem: &crate::memory::PhysMemory,
        bits: u64,
    ) -> super::Step {
        let d = &mut self.state.debug;
        d.dr6 = (d.dr6 & !DR6_HITS) | bits | DR6_FIXED_1;
        self.raise_exception(mem, vector::DB, None, None)
    }

    /// `mov drN, r64` (`to`) or `mov r64, drN`; `dr` is the iced register
    /// of the debug register, `gpr` the general-purpose one.
    pub(super) fn exec_mov_dr(
        &mut self,
        dr: Register,
        gpr: Register,
        to: bool,
    ) -> Result<(), Fault> {
        if self.state.cpl() != 0 {
            return Err(Fault::with_code(vector::GP, 0));
        }
        let n = dr as u32 - Register::DR0 as u32;
        let index = match n {
            0..=3 | 6 | 7 => n,
            4 | 5 if self.state.cr4 & cr4::DE == 0 => n + 2,
            _ => return Err(Fault::exception(vector::UD)),
        };
        let dbg = &mut self.state.debug;
        if dbg.dr7 & DR7_GD != 0 {
            dbg.dr6 |= DR6_BD;
            dbg.dr7 &= !DR7_GD;
            return Err(Fault::exception(vector::DB));
        }
        let g = gpr_info(gpr).0 as usize;
        if to {
            let value = self.state.gpr[g];
            if index >= 6 && value >> 32 != 0 {
                return Err(Fault::with_code(vector::GP, 0));
            }
            self.cycles += self.costs.serializing;
            let dbg = &mut self.state.debug;
            match index {
                6 => dbg.dr6 = (value & DR6_VOLATILE) | DR6_FIXED_1,
                7 => dbg.dr7 = (value & DR7_VOLATILE) | DR7_FIXED_1,
                i => dbg.dr[i as usize] = value,
            }
        } else {
            let dbg = &self.state.debug;
            self.state.gpr[g] = match index {
                6 => dbg.dr6,
                7 => dbg.dr7,
                i => dbg.dr[i as usize],
            };
        }
        Ok(())
    }
}
