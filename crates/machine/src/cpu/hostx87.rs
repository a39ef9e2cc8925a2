//! x87 instructions run on the host CPU's own x87 unit.
//!
//! Why: 80-bit extended arithmetic with the control word's precision and
//! rounding, the tag word, stack overflow/underflow (C1 and SF), the
//! condition codes and the masked and unmasked exception responses are
//! what every x86-64 processor implements; running the guest's
//! instruction on the host is exact by construction (the transcendental
//! instructions FSIN, FCOS, FPTAN, FPATAN, F2XM1, FYL2X, FYL2XP1 and FSINCOS
//! are the host's, as RCPPS is for SSE).
//!
//! How: one `asm!` block saves the host x87 state with FNSAVE (which also
//! reinitialises the unit), loads the guest's with FRSTOR, sets the
//! arithmetic flags from the guest's (for FCMOVcc), runs the one
//! instruction, reads the flags back (for FCOMI), saves the guest's new
//! state with FNSAVE and restores the host's with FRSTOR. The instruction
//! is picked from a table inside the block that holds every x87 encoding
//! once: the 512 register forms (escape byte D8-DF, ModRM C0-FF) and the
//! 64 memory forms with the operand at `[rdi]` (ModRM reg field 0-7,
//! mod 00, rm 111), so an instruction runs exactly as the guest encoded it,
//! on its own registers, with no per-instruction asm.
//!
//! An unmasked x87 exception never traps in the instruction that raises
//! it: it sets FSW.ES and is delivered by the next waiting x87 instruction.
//! The caller guarantees the loaded guest state has no exception pending
//! (it raises #MF first, as the hardware does), the block ends with the
//! non-waiting FNSAVE (which clears the unit), and the host state it
//! restores is the one it saved, so no host instruction ever traps.

use super::fpu_state::FSAVE_SIZE;

/// Index of the table entry for the register form `esc modrm` (`modrm` of
/// the form 11 reg rm).
pub fn register_form(esc: u8, modrm: u8) -> usize {
    ((esc as usize & 7) << 6) | (modrm as usize & 0x3f)
}

/// Index of the table entry for the memory form with escape `esc` and
/// ModRM reg field `reg`.
pub fn memory_form(esc: u8, reg: u8) -> usize {
    512 + ((esc as usize & 7) << 3) + (reg as usize & 7)
}

/// Runs table entry `entry` ([`register_form`], [`memory_form`]) on the
/// FNSAVE image `image` with the memory operand (if any) in `operand` and
/// the guest's arithmetic flags in `flags` (RFLAGS bits 0-7): writes the
/// new state into `image`, a stored operand into `operand`, and returns
/// the flags afterwards.
///
/// The caller must only pass entries that decode as an x87 instruction
/// other than the non-waiting control instructions, and an image with no
/// unmasked exception pending (FSW.ES clear, no flag set whose mask is
/// clear).
#[cfg(target_arch = "x86_64")]
#[inline(never)]
pub fn run(entry: usize, image: &mut [u8; FSAVE_SIZE], operand: &mut [u8; 16], flags: u8) -> u8 {
    assert!(entry < 576, "x87 table entry {entry} out of range");
    let mut host = [0u8; FSAVE_SIZE];
    let mut ax: u16 = (flags as u16) << 8;
    // SAFETY: the block reads and writes only `host` and `image` (108-byte
    // FNSAVE/FRSTOR areas, valid for writes; x87 save areas have no
    // alignment requirement) and `operand` (16 bytes, at rdi; no x87 memory
    // form accesses more than 10), and the registers it declares. The jump
    // goes to one 8-byte slot of the table, in range by the assert above;
    // every slot runs its two instruction bytes and jumps to label 3. The
    // caller passes only entries that decode as x87 instructions and a
    // guest state with no pending unmasked exception, so the instruction
    // cannot trap (x87 exceptions are delivered by the next waiting
    // instruction, and the block ends with the non-waiting FNSAVE, which
    // also clears the unit). The host x87 state is saved first and
    // restored last, so the code around the block sees it unchanged.
    unsafe {
        core::arch::asm!(
            "fnsave [{host}]",
            "frstor [{image}]",
            "lea {slot}, [rip + 2f]",
            "shl {entry}, 3",
            "add {slot}, {entry}",
            // After the address arithmetic, which changes the flags.
            "sahf",
            "jmp {slot}",
            ".balign 8",
            "2:",
            ".set faultline_x87_slot, 0",
            ".rept 512",
            ".byte 0xd8 + (faultline_x87_slot >> 6), 0xc0 + (faultline_x87_slot & 63)",
            "jmp 3f",
            ".balign 8",
            ".set faultline_x87_slot, faultline_x87_slot + 1",
            ".endr",
            ".set faultline_x87_slot, 0",
            ".rept 64",
            ".byte 0xd8 + (faultline_x87_slot >> 3), ((faultline_x87_slot & 7) << 3) | 7",
            "jmp 3f",
            ".balign 8",
            ".set faultline_x87_slot, faultline_x87_slot + 1",
            ".endr",
            "3:",
            "lahf",
            "fnsave [{image}]",
            "frstor [{host}]",
            host = in(reg) host.as_mut_ptr(),
            image = in(reg) image.as_mut_ptr(),
            entry = inout(reg) entry => _,
            slot = out(reg) _,
            inout("ax") ax,
            in("rdi") operand.as_mut_ptr(),
            out("st(0)") _, out("st(1)") _, out("st(2)") _, out("st(3)") _,
            out("st(4)") _, out("st(5)") _, out("st(6)") _, out("st(7)") _,
            options(nostack),
        );
    }
    (ax >> 8) as u8
}

/// On a host that is not x86-64 there is no x87 unit to run on; the
/// caller raises #UD instead of calling this.
#[cfg(not(target_arch = "x86_64"))]
pub fn run(_: usize, _: &mut [u8; FSAVE_SIZE], _: &mut [u8; 16], flags: u8) -> u8 {
    flags
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// An FNSAVE image of the initialised unit (FCW 0x37f, all empty).
    fn empty() -> [u8; FSAVE_SIZE] {
        let mut m = [0u8; FSAVE_SIZE];
        m[0..2].copy_from_slice(&0x037fu16.to_le_bytes());
        m[8..10].copy_from_slice(&0xffffu16.to_le_bytes());
        m
    }

    fn st0(m: &[u8; FSAVE_SIZE]) -> [u8; 10] {
        m[28..38].try_into().unwrap()
    }

    #[test]
    fn loads_add_and_stores_in_extended_precision() {
        let mut m = empty();
        let mut op = [0u8; 16];
        op[..8].copy_from_slice(&1.5f64.to_le_bytes());
        run(memory_form(0xdd, 0), &mut m, &mut op, 0); // fld qword [rdi]
        run(register_form(0xd9, 0xe8), &mut m, &mut op, 0); // fld1
        run(register_form(0xde, 0xc1), &mut m, &mut op, 0); // faddp st(1), st
        let fsw = u16::from_le_bytes([m[4], m[5]]);
        assert_eq!((fsw >> 11) & 7, 7, "one value on the stack");
        // 2.5 as an 80-bit value: exponent 0x4000, significand 0xa000...
        let mut want = [0u8; 10];
        want[..8].copy_from_slice(&0xa000_0000_0000_0000u64.to_le_bytes());
        want[8..].copy_from_slice(&0x4000u16.to_le_bytes());
        assert_eq!(st0(&m), want);
        // fstp qword [rdi]
        let mut out = [0u8; 16];
        run(memory_form(0xdd, 3), &mut m, &mut out, 0);
        assert_eq!(f64::from_le_bytes(out[..8].try_into().unwrap()), 2.5);
        assert_eq!(
            u16::from_le_bytes([m[8], m[9]]),
            0xffff,
            "stack empty again"
        );
    }

    #[test]
    fn compares_set_the_flags_and_underflow_is_reported() {
        let mut m = empty();
        let mut op = [0u8; 16];
        run(register_form(0xd9, 0xee), &mut m, &mut op, 0); // fldz
        run(register_form(0xd9, 0xe8), &mut m, &mut op, 0); // fld1
                                                            // fcomi st, st(1): 1 > 0 clears ZF PF CF.
        let fl = run(register_form(0xdb, 0xf1), &mut m, &mut op, 0x45);
        assert_eq!(fl & 0x45, 0);
        // Pop three times: the third is a stack underflow (IE|SF, masked).
        for _ in 0..3 {
            run(register_form(0xdd, 0xd8), &mut m, &mut op, 0); // fstp st(0)
        }
        let fsw = u16::from_le_bytes([m[4], m[5]]);
        assert_eq!(fsw & 0x41, 0x41, "invalid operation by stack fault");
    }
}
