//! Which result bits an instruction sequence leaves architecturally defined.
//!
//! The SDM leaves some results undefined (e.g. SF/ZF/AF/PF after MUL, all
//! flags after DIV, OF after a multi-bit shift) and real CPUs differ there,
//! so those bits are not compared. The tracker follows a sequence one
//! instruction at a time: iced-x86's instruction info gives the flags each
//! instruction reads, writes and leaves undefined and the registers it
//! reads and writes; shifts and rotates, whose flag effects depend on the
//! count (a masked count of 0 changes nothing, OF is defined only for
//! 1-bit counts, CF is undefined for SHL/SHR by at least the operand width,
//! SHLD/SHRD by more than the width leave everything undefined), are
//! handled here from the SDM pseudocode, using the count when the
//! generator knows it and the union over all counts when it does not.
//!
//! An instruction that would read an undefined flag or register bit is
//! rejected ([`Reject`]): its result would depend on a value the
//! architecture does not determine, so comparing it proves nothing.

use super::COMPARED_FLAGS;
use crate::cpu::state::rflags;
use iced_x86::{
    Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register, RflagsBits,
};

/// The undefined parts of the architectural state at one point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Definedness {
    /// RFLAGS bits whose value is undefined.
    pub undefined_flags: u64,
    /// For each general register (encoding order), its undefined bits.
    pub undefined_bits: [u64; 16],
}

impl Definedness {
    /// Everything defined (the initial state).
    pub const ALL_DEFINED: Definedness = Definedness {
        undefined_flags: 0,
        undefined_bits: [0; 16],
    };

    /// The state at a point reached from either `self` or `other`: a bit is
    /// defined only if it is defined on both paths.
    pub fn merge(&mut self, other: &Definedness) {
        self.undefined_flags |= other.undefined_flags;
        for (a, b) in self
            .undefined_bits
            .iter_mut()
            .zip(other.undefined_bits.iter())
        {
            *a |= *b;
        }
    }

    /// The RFLAGS bits to compare.
    pub fn compared_flags(&self) -> u64 {
        COMPARED_FLAGS & !self.undefined_flags
    }

    /// The bits of register `index` to compare.
    pub fn compared_bits(&self, index: usize) -> u64 {
        !self.undefined_bits[index]
    }
}

/// What the generator knows about values when an instruction runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hints {
    /// CL, when the generator set it just before (shift counts).
    pub cl: Option<u8>,
    /// RCX, when the generator set it just before (repeat counts).
    pub rcx: Option<u64>,
}

/// Why an instruction cannot be part of a sequence at this point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// It reads RFLAGS bits that are undefined here.
    ReadsUndefinedFlags(u64),
    /// It reads undefined bits of this register.
    ReadsUndefinedRegister(Register),
    /// It writes a register the sequence must keep (window base/index), or
    /// RSP other than as a stack instruction.
    WritesReservedRegister(Register),
    /// It would leave undefined bytes in memory (not tracked).
    UndefinedMemoryResult,
    /// Its definedness depends on a count the generator does not know.
    UnknownCount,
}

/// Converts iced's [`RflagsBits`] to RFLAGS bit positions.
pub fn iced_flags_to_rflags(bits: u32) -> u64 {
    const MAP: [(u32, u64); 7] = [
        (RflagsBits::CF, rflags::CF),
        (RflagsBits::PF, rflags::PF),
        (RflagsBits::AF, rflags::AF),
        (RflagsBits::ZF, rflags::ZF),
        (RflagsBits::SF, rflags::SF),
        (RflagsBits::OF, rflags::OF),
        (RflagsBits::DF, rflags::DF),
    ];
    MAP.iter()
        .filter(|(i, _)| bits & i != 0)
        .map(|(_, r)| r)
        .fold(0, |a, b| a | b)
}

/// The general register an iced register belongs to (encoding order) and
/// the bits of it that the name covers.
pub fn gpr_bits(reg: Register) -> Option<(usize, u64)> {
    if !reg.is_gpr() {
        return None;
    }
    let index = (reg.full_register() as u32 - Register::RAX as u32) as usize;
    let mask = match reg {
        Register::AH | Register::CH | Register::DH | Register::BH => 0xff00,
        _ => match reg.size() {
            1 => 0xff,
            2 => 0xffff,
            4 => 0xffff_ffff,
            _ => u64::MAX,
        },
    };
    Some((index, mask))
}

/// Flag effect of one shift/rotate with a known, already masked count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct CountEffect {
    /// Flags written with a defined value.
    defined: u64,
    /// Flags left undefined.
    undefined: u64,
    /// The destination value is undefined (SHLD/SHRD past the width).
    result_undefined: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ShiftFamily {
    /// SHL/SAL/SHR.
    Logical,
    Sar,
    /// ROL/ROR.
    Rotate,
    /// RCL/RCR.
    RotateThroughCarry,
    /// SHLD/SHRD.
    DoublePrecision,
}

impl ShiftFamily {
    fn of(m: Mnemonic) -> Option<ShiftFamily> {
        Some(match m {
            Mnemonic::Shl | Mnemonic::Sal | Mnemonic::Shr => ShiftFamily::Logical,
            Mnemonic::Sar => ShiftFamily::Sar,
            Mnemonic::Rol | Mnemonic::Ror => ShiftFamily::Rotate,
            Mnemonic::Rcl | Mnemonic::Rcr => ShiftFamily::RotateThroughCarry,
            Mnemonic::Shld | Mnemonic::Shrd => ShiftFamily::DoublePrecision,
            _ => return None,
        })
    }
}

const OF: u64 = rflags::OF;
const CF: u64 = rflags::CF;
const AF: u64 = rflags::AF;
const SZP: u64 = rflags::SF | rflags::ZF | rflags::PF;

/// The SDM's flag rules for a masked count `count` on a `width`-bit
/// operand.
fn count_effect(family: ShiftFamily, width: u32, count: u32) -> CountEffect {
    if count == 0 {
        return CountEffect::default();
    }
    // OF is defined only for 1-bit shifts and rotates.
    let of_defined = if count == 1 { OF } else { 0 };
    let of_undefined = OF & !of_defined;
    match family {
        ShiftFamily::Logical => {
            // CF is the last bit shifted out, undefined for SHL/SHR by at
            // least the width (possible for 8- and 16-bit operands).
            let cf = if count < width { CF } else { 0 };
            CountEffect {
                defined: SZP | cf | of_defined,
                undefined: AF | (CF & !cf) | of_undefined,
                result_undefined: false,
            }
        }
        ShiftFamily::Sar => CountEffect {
            defined: SZP | CF | of_defined,
            undefined: AF | of_undefined,
            result_undefined: false,
        },
        ShiftFamily::Rotate => CountEffect {
            defined: CF | of_defined,
            undefined: of_undefined,
            result_undefined: false,
        },
        ShiftFamily::RotateThroughCarry => {
            // The rotation itself runs (count mod width+1) times for 8- and
            // 16-bit operands; with 0 rotations CF keeps its value.
            let rotations = match width {
                8 => count % 9,
                16 => count % 17,
                _ => count,
            };
            CountEffect {
                defined: (if rotations != 0 { CF } else { 0 }) | of_defined,
                undefined: of_undefined,
                result_undefined: false,
            }
        }
        ShiftFamily::DoublePrecision => {
            if count > width {
                CountEffect {
                    defined: 0,
                    undefined: rflags::ARITH,
                    result_undefined: true,
                }
            } else {
                CountEffect {
                    defined: SZP | CF | of_defined,
                    undefined: AF | of_undefined,
                    result_undefined: false,
                }
            }
        }
    }
}

/// Follows definedness through instructions.
pub struct Tracker {
    factory: InstructionInfoFactory,
    /// Registers (encoding order) no generated instruction may write.
    reserved: Vec<usize>,
}

impl std::fmt::Debug for Tracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracker")
            .field("reserved", &self.reserved)
            .finish()
    }
}

const RSP_INDEX: usize = 4;

impl Tracker {
    /// A tracker that rejects writes to the `reserved` registers (and to
    /// RSP by anything but a stack instruction).
    pub fn new(reserved: &[usize]) -> Tracker {
        Tracker {
            factory: InstructionInfoFactory::new(),
            reserved: reserved.to_vec(),
        }
    }

    /// The definedness after `instr` runs from `before`.
    pub fn apply(
        &mut self,
        before: &Definedness,
        instr: &Instruction,
        hints: Hints,
    ) -> Result<Definedness, Reject> {
        let mut after = *before;
        let is_stack_instruction = instr.stack_pointer_increment() != 0;
        let info = self.factory.info(instr);
        for used in info.used_registers() {
            let Some((index, mask)) = gpr_bits(used.register()) else {
                continue;
            };
            let reads = matches!(
                used.access(),
                OpAccess::Read | OpAccess::CondRead | OpAccess::ReadWrite | OpAccess::ReadCondWrite
            );
            let writes = matches!(
                used.access(),
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            );
            if reads && before.undefined_bits[index] & mask != 0 {
                return Err(Reject::ReadsUndefinedRegister(used.register()));
            }
            if writes
                && (self.reserved.contains(&index) || (index == RSP_INDEX && !is_stack_instruction))
            {
                return Err(Reject::WritesReservedRegister(used.register()));
            }
        }
        for used in info.used_registers() {
            if let Some((index, mask)) = gpr_bits(used.register()) {
                // A conditional write may leave the old value, so it defines
                // nothing for sure.
                if matches!(used.access(), OpAccess::Write | OpAccess::ReadWrite) {
                    after.undefined_bits[index] &= !mask;
                }
            }
        }

        let read = iced_flags_to_rflags(instr.rflags_read());
        if read & before.undefined_flags != 0 {
            return Err(Reject::ReadsUndefinedFlags(read & before.undefined_flags));
        }

        let mnemonic = instr.mnemonic();
        if matches!(mnemonic, Mnemonic::Bsf | Mnemonic::Bsr) && instr.op0_kind() == OpKind::Register
        {
            // With a zero source the destination is "undefined" (SDM). Both
            // vendors leave it unchanged, except that Intel clears bits
            // 63:32 of a 32-bit destination: only those bits differ.
            if instr.op0_register().size() == 4 {
                if let Some((index, _)) = gpr_bits(instr.op0_register()) {
                    after.undefined_bits[index] |= 0xffff_ffff_0000_0000;
                }
            }
        }

        let instr_undefined = iced_flags_to_rflags(instr.rflags_undefined());
        let instr_defined = iced_flags_to_rflags(
            instr.rflags_written() | instr.rflags_cleared() | instr.rflags_set(),
        );

        if let Some(family) = ShiftFamily::of(mnemonic) {
            let width = operand_width(instr, 0);
            let count_operand = instr.op_count() - 1;
            let raw_count = match instr.op_kind(count_operand) {
                OpKind::Register => hints.cl.map(u32::from),
                OpKind::Immediate8 => Some(instr.immediate8() as u32),
                _ => None,
            };
            let mask = if width == 64 { 0x3f } else { 0x1f };
            match raw_count {
                Some(raw) => {
                    let effect = count_effect(family, width, raw & mask);
                    if effect.result_undefined {
                        match instr.op0_kind() {
                            OpKind::Register => {
                                if let Some((index, bits)) = gpr_bits(instr.op0_register()) {
                                    after.undefined_bits[index] |= bits;
                                }
                            }
                            _ => return Err(Reject::UndefinedMemoryResult),
                        }
                    }
                    after.undefined_flags =
                        (before.undefined_flags & !effect.defined) | effect.undefined;
                }
                None => {
                    // Any count may occur, including 0 (no change): a flag
                    // stays defined only if no count makes it undefined.
                    let mut undefined = 0;
                    for count in 0..=mask {
                        let effect = count_effect(family, width, count);
                        if effect.result_undefined {
                            return Err(Reject::UnknownCount);
                        }
                        undefined |= effect.undefined;
                    }
                    after.undefined_flags = before.undefined_flags | undefined;
                }
            }
            return Ok(after);
        }

        let repeated = instr.has_rep_prefix() || instr.has_repne_prefix();
        if repeated
            && uses_32_bit_string_addresses(instr)
            && hints.rcx.is_none_or(|c| c as u32 == 0)
        {
            // A repeated string instruction with a 32-bit address size in
            // 64-bit mode and ECX = 0 runs no iteration, yet Intel clears
            // bits 63:32 of RCX (and of RSI/RDI for MOVS and STOS) while
            // AMD changes nothing: vendor-specific, not compared.
            for reg in [Register::RCX, Register::RSI, Register::RDI] {
                if let Some((index, _)) = gpr_bits(reg) {
                    after.undefined_bits[index] |= 0xffff_ffff_0000_0000;
                }
            }
        }
        if repeated && instr_defined != 0 {
            // REPE/REPNE CMPS/SCAS with RCX = 0 run no iteration and change
            // no flag.
            after.undefined_flags = match hints.rcx {
                Some(0) => before.undefined_flags,
                Some(_) => (before.undefined_flags & !instr_defined) | instr_undefined,
                None => before.undefined_flags | instr_undefined,
            };
            return Ok(after);
        }

        after.undefined_flags = (before.undefined_flags & !instr_defined) | instr_undefined;
        Ok(after)
    }
}

/// Whether `instr` is a string instruction addressing with ESI/EDI (a
/// 32-bit address size in 64-bit mode).
fn uses_32_bit_string_addresses(instr: &Instruction) -> bool {
    [instr.op0_kind(), instr.op1_kind()]
        .iter()
        .any(|k| matches!(k, OpKind::MemoryESEDI | OpKind::MemorySegESI))
}

/// Width in bits of operand `operand` (a register or memory).
fn operand_width(instr: &Instruction, operand: u32) -> u32 {
    match instr.op_kind(operand) {
        OpKind::Register => instr.op_register(operand).size() as u32 * 8,
        _ => instr.memory_size().size() as u32 * 8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Code, Decoder, DecoderOptions};

    fn decode(bytes: &[u8]) -> Instruction {
        Decoder::new(64, bytes, DecoderOptions::NONE).decode()
    }

    fn after(bytes: &[u8], hints: Hints) -> Result<Definedness, Reject> {
        Tracker::new(&[15]).apply(&Definedness::ALL_DEFINED, &decode(bytes), hints)
    }

    #[test]
    fn mul_leaves_szap_undefined_and_adc_after_div_is_rejected() {
        let d = after(b"\xf7\xe1", Hints::default()).unwrap(); // mul ecx
        assert_eq!(
            d.undefined_flags,
            rflags::SF | rflags::ZF | rflags::AF | rflags::PF
        );
        let d = after(b"\xf7\xf1", Hints::default()).unwrap(); // div ecx
        assert_eq!(d.undefined_flags, rflags::ARITH);
        let adc = decode(b"\x11\xc8"); // adc eax, ecx
        assert_eq!(
            Tracker::new(&[]).apply(&d, &adc, Hints::default()),
            Err(Reject::ReadsUndefinedFlags(rflags::CF))
        );
    }

    #[test]
    fn shift_counts_follow_the_sdm() {
        // shl eax, 1: OF defined, AF undefined.
        let d = after(b"\xd1\xe0", Hints::default()).unwrap();
        assert_eq!(d.undefined_flags, rflags::AF);
        // shl eax, 0: nothing changes.
        let d = after(b"\xc1\xe0\x00", Hints::default()).unwrap();
        assert_eq!(d.undefined_flags, 0);
        // shl eax, 32 masks to 0.
        let d = after(b"\xc1\xe0\x20", Hints::default()).unwrap();
        assert_eq!(d.undefined_flags, 0);
        // shl al, 9: CF and OF and AF undefined.
        let d = after(b"\xc0\xe0\x09", Hints::default()).unwrap();
        assert_eq!(d.undefined_flags, rflags::AF | rflags::OF | rflags::CF);
        // shl al, cl with unknown cl: the union.
        let d = after(b"\xd2\xe0", Hints::default()).unwrap();
        assert_eq!(d.undefined_flags, rflags::AF | rflags::OF | rflags::CF);
        // ...and with cl known to be 1.
        let d = after(
            b"\xd2\xe0",
            Hints {
                cl: Some(1),
                rcx: None,
            },
        )
        .unwrap();
        assert_eq!(d.undefined_flags, rflags::AF);
        // rcl al, 9: no rotation, CF kept, OF undefined.
        let d = after(b"\xc0\xd0\x09", Hints::default()).unwrap();
        assert_eq!(d.undefined_flags, rflags::OF);
    }

    #[test]
    fn shld16_past_width_taints_the_destination() {
        // shld ax, cx, 20
        let d = after(b"\x66\x0f\xa4\xc8\x14", Hints::default()).unwrap();
        assert_eq!(d.undefined_bits[0], 0xffff);
        assert_eq!(d.undefined_flags, rflags::ARITH);
        // shld ax, cx, cl with unknown cl is rejected.
        assert_eq!(
            after(b"\x66\x0f\xa5\xc8", Hints::default()),
            Err(Reject::UnknownCount)
        );
        // shld [rax], cx, 20 is rejected (undefined memory).
        assert_eq!(
            after(b"\x66\x0f\xa4\x08\x14", Hints::default()),
            Err(Reject::UndefinedMemoryResult)
        );
    }

    #[test]
    fn register_taint_blocks_reads_and_clears_on_full_writes() {
        // bsf eax, ecx: bits 63:32 of rax undefined.
        let d = after(b"\x0f\xbc\xc1", Hints::default()).unwrap();
        assert_eq!(d.undefined_bits[0], 0xffff_ffff_0000_0000);
        let mut t = Tracker::new(&[]);
        // add rbx, rax reads them: rejected. add ebx, eax does not.
        assert!(t
            .apply(&d, &decode(b"\x48\x01\xc3"), Hints::default())
            .is_err());
        assert!(t.apply(&d, &decode(b"\x01\xc3"), Hints::default()).is_ok());
        // mov eax, 1 defines all of rax again.
        let d2 = t
            .apply(&d, &decode(b"\xb8\x01\x00\x00\x00"), Hints::default())
            .unwrap();
        assert_eq!(d2.undefined_bits[0], 0);
        // mov ax, 1 only the low 16 bits.
        let d3 = t
            .apply(&d, &decode(b"\x66\xb8\x01\x00"), Hints::default())
            .unwrap();
        assert_eq!(d3.undefined_bits[0], 0xffff_ffff_0000_0000);
    }

    #[test]
    fn reserved_registers_and_rsp_are_protected() {
        let mut t = Tracker::new(&[15]);
        let all = Definedness::ALL_DEFINED;
        let inc_r15 = Instruction::with1(Code::Inc_rm64, Register::R15).unwrap();
        assert!(matches!(
            t.apply(&all, &inc_r15, Hints::default()),
            Err(Reject::WritesReservedRegister(_))
        ));
        let add_rsp = decode(b"\x48\x83\xc4\x08");
        assert!(t.apply(&all, &add_rsp, Hints::default()).is_err());
        let push = decode(b"\x50");
        assert!(t.apply(&all, &push, Hints::default()).is_ok());
    }

    #[test]
    fn repeated_compare_with_zero_count_keeps_flags() {
        let mut t = Tracker::new(&[]);
        let mut d = Definedness::ALL_DEFINED;
        d.undefined_flags = rflags::ZF;
        let repe_cmpsb = decode(b"\xf3\xa6");
        let zero = t
            .apply(
                &d,
                &repe_cmpsb,
                Hints {
                    cl: None,
                    rcx: Some(0),
                },
            )
            .unwrap();
        assert_eq!(zero.undefined_flags, rflags::ZF);
        let some = t
            .apply(
                &d,
                &repe_cmpsb,
                Hints {
                    cl: None,
                    rcx: Some(3),
                },
            )
            .unwrap();
        assert_eq!(some.undefined_flags, 0);
    }
}
