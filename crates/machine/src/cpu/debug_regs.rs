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
//! RFLAGS.TF single-steps with DR6.BS (`Cpu::run_block`).
//!
//! Data breakpoints (R/W = 01 writes, 11 reads or writes) and I/O
//! breakpoints (R/W = 10 with CR4.DE) are traps (SDM Vol. 3B 18.2.4,
//! 18.3.1.2): an access of the running instruction that overlaps the
//! DRn-aligned range of LEN bytes (1, 2, 8 or 4 for LEN 00, 01, 10, 11)
//! notes the breakpoint (`Cpu::note_data_access`), and the #DB follows the
//! instruction with DR6.Bn set (and BS too when single-stepping). Implicit
//! supervisor accesses (descriptor tables, interrupt frames) do not match.
//! After a MOV SS or POP SS the trap waits one more instruction (SDM Vol.
//! 3A 6.8.3): then a #DB that instruction raises (ICEBP) carries it, and
//! after an INT n or INT3 it is delivered at the handler's first
//! instruction. Instruction breakpoints on the instruction after MOV SS
//! are inhibited, as on Intel. While any breakpoint is enabled in DR7 the
//! CPU runs one instruction at a time through the interpreter, whose
//! accesses are the only ones checked.

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

/// The bytes breakpoint `n` of `dr7` covers: (aligned start, length).
fn breakpoint_range(dr: u64, dr7: u64, n: usize) -> (u64, u64) {
    let len = match dr7 >> (18 + 4 * n) & 3 {
        0 => 1,
        1 => 2,
        2 => 8,
        _ => 4,
    };
    (dr & !(len - 1), len)
}

/// Whether `[a, a + alen)` and `[b, b + blen)` share a byte (modulo
/// 2^64 for the address space, 2^16 for ports: callers pass a mask).
fn overlaps(a: u64, alen: u64, b: u64, blen: u64, mask: u64) -> bool {
    // `a` lies in `[b, b + blen)`, or `b` in `[a, a + alen)`.
    a.wrapping_sub(b) & mask < blen || b.wrapping_sub(a) & mask < alen
}

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

    /// DR6 bits B0-B3 of the enabled data breakpoints (R/W = 01 when
    /// `write`, 11 either way) that an access of `size` bytes at linear
    /// address `la` meets.
    pub(super) fn data_breakpoint_hits(&self, la: u64, size: u64, write: bool) -> u64 {
        let d = &self.state.debug;
        (0..4).fold(0, |hits, n| {
            let enabled = d.dr7 >> (2 * n) & 3 != 0;
            let rw = d.dr7 >> (16 + 4 * n) & 3;
            let kind = rw == 3 || (rw == 1 && write);
            let (start, len) = breakpoint_range(d.dr[n], d.dr7, n);
            if enabled && kind && overlaps(la, size, start, len, u64::MAX) {
                hits | 1 << n
            } else {
                hits
            }
        })
    }

    /// DR6 bits B0-B3 of the enabled I/O breakpoints (R/W = 10, which
    /// needs CR4.DE) that an access of `size` bytes at `port` meets.
    pub(super) fn io_breakpoint_hits(&self, port: u16, size: u8) -> u64 {
        let d = &self.state.debug;
        if self.state.cr4 & cr4::DE == 0 {
            return 0;
        }
        (0..4).fold(0, |hits, n| {
            let enabled = d.dr7 >> (2 * n) & 3 != 0;
            let io = d.dr7 >> (16 + 4 * n) & 3 == 2;
            let (start, len) = breakpoint_range(d.dr[n] & 0xffff, d.dr7, n);
            if enabled && io && overlaps(u64::from(port), u64::from(size), start, len, 0xffff) {
                hits | 1 << n
            } else {
                hits
            }
        })
    }

    /// Notes the data breakpoints an access of the running instruction
    /// meets (called only while DR7 enables a breakpoint): their #DB trap
    /// follows the instruction.
    #[cold]
    #[inline(never)]
    pub(super) fn note_data_access(&mut self, la: u64, size: u64, write: bool) {
        self.db_pending |= self.data_breakpoint_hits(la, size, write);
    }

    /// Notes the I/O breakpoints an IN, OUT, INS or OUTS meets.
    pub(super) fn note_io_access(&mut self, port: u16, size: u8) {
        if self.state.debug.dr7 & DR7_ENABLES != 0 {
            self.db_pending |= self.io_breakpoint_hits(port, size);
        }
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

    /// Takes the data and I/O breakpoint hits held for the #DB being
    /// delivered (one #DB carries them all: an ICEBP after a MOV SS that
    /// met a watchpoint raises one).
    pub(super) fn merge_pending_breakpoints(&mut self) {
        let hits = std::mem::take(&mut self.db_pending);
        self.state.debug.dr6 |= hits;
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
