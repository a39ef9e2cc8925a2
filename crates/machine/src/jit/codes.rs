//! Tables of iced-x86 codes by operand size and operation.

use super::*;

/// Index of an operand size in the per-size code tables.
pub(super) fn si(size: Size) -> usize {
    match size {
        Size::B1 => 0,
        Size::B2 => 1,
        Size::B4 => 2,
        Size::B8 => 3,
    }
}

pub(super) const ACC: [Register; 4] = [Register::AL, Register::AX, Register::EAX, Register::RAX];
pub(super) const SEC: [Register; 4] = [Register::CL, Register::CX, Register::ECX, Register::RCX];
pub(super) const DXR: [Register; 4] = [Register::DL, Register::DX, Register::EDX, Register::RDX];
pub(super) const MOV_R_RM: [Code; 4] = [
    Code::Mov_r8_rm8,
    Code::Mov_r16_rm16,
    Code::Mov_r32_rm32,
    Code::Mov_r64_rm64,
];
pub(super) const XCHG_RM_R: [Code; 4] = [
    Code::Xchg_rm8_r8,
    Code::Xchg_rm16_r16,
    Code::Xchg_rm32_r32,
    Code::Xchg_rm64_r64,
];
pub(super) const TEST_RM_R: [Code; 4] = [
    Code::Test_rm8_r8,
    Code::Test_rm16_r16,
    Code::Test_rm32_r32,
    Code::Test_rm64_r64,
];
pub(super) const MOV_RM_R: [Code; 4] = [
    Code::Mov_rm8_r8,
    Code::Mov_rm16_r16,
    Code::Mov_rm32_r32,
    Code::Mov_rm64_r64,
];

/// Expands to the three code tables of [`alu_codes`] for `op`.
macro_rules! paste_codes {
    ($op:ident) => {
        match $op {
            BinOp::Add => (
                [
                    Code::Add_rm8_r8,
                    Code::Add_rm16_r16,
                    Code::Add_rm32_r32,
                    Code::Add_rm64_r64,
                ],
                [
                    Code::Add_r8_rm8,
                    Code::Add_r16_rm16,
                    Code::Add_r32_rm32,
                    Code::Add_r64_rm64,
                ],
                [
                    Code::Add_rm8_imm8,
                    Code::Add_rm16_imm16,
                    Code::Add_rm32_imm32,
                    Code::Add_rm64_imm32,
                ],
            ),
            BinOp::Or => (
                [
                    Code::Or_rm8_r8,
                    Code::Or_rm16_r16,
                    Code::Or_rm32_r32,
                    Code::Or_rm64_r64,
                ],
                [
                    Code::Or_r8_rm8,
                    Code::Or_r16_rm16,
                    Code::Or_r32_rm32,
                    Code::Or_r64_rm64,
                ],
                [
                    Code::Or_rm8_imm8,
                    Code::Or_rm16_imm16,
                    Code::Or_rm32_imm32,
                    Code::Or_rm64_imm32,
                ],
            ),
            BinOp::Adc => (
                [
                    Code::Adc_rm8_r8,
                    Code::Adc_rm16_r16,
                    Code::Adc_rm32_r32,
                    Code::Adc_rm64_r64,
                ],
                [
                    Code::Adc_r8_rm8,
                    Code::Adc_r16_rm16,
                    Code::Adc_r32_rm32,
                    Code::Adc_r64_rm64,
                ],
                [
                    Code::Adc_rm8_imm8,
                    Code::Adc_rm16_imm16,
                    Code::Adc_rm32_imm32,
                    Code::Adc_rm64_imm32,
                ],
            ),
            BinOp::Sbb => (
                [
                    Code::Sbb_rm8_r8,
                    Code::Sbb_rm16_r16,
                    Code::Sbb_rm32_r32,
                    Code::Sbb_rm64_r64,
                ],
                [
                    Code::Sbb_r8_rm8,
                    Code::Sbb_r16_rm16,
                    Code::Sbb_r32_rm32,
                    Code::Sbb_r64_rm64,
                ],
                [
                    Code::Sbb_rm8_imm8,
                    Code::Sbb_rm16_imm16,
                    Code::Sbb_rm32_imm32,
                    Code::Sbb_rm64_imm32,
                ],
            ),
            BinOp::And => (
                [
                    Code::And_rm8_r8,
                    Code::And_rm16_r16,
                    Code::And_rm32_r32,
                    Code::And_rm64_r64,
                ],
                [
                    Code::And_r8_rm8,
                    Code::And_r16_rm16,
                    Code::And_r32_rm32,
                    Code::And_r64_rm64,
                ],
                [
                    Code::And_rm8_imm8,
                    Code::And_rm16_imm16,
                    Code::And_rm32_imm32,
                    Code::And_rm64_imm32,
                ],
            ),
            BinOp::Sub => (
                [
                    Code::Sub_rm8_r8,
                    Code::Sub_rm16_r16,
                    Code::Sub_rm32_r32,
                    Code::Sub_rm64_r64,
                ],
                [
                    Code::Sub_r8_rm8,
                    Code::Sub_r16_rm16,
                    Code::Sub_r32_rm32,
                    Code::Sub_r64_rm64,
                ],
                [
                    Code::Sub_rm8_imm8,
                    Code::Sub_rm16_imm16,
                    Code::Sub_rm32_imm32,
                    Code::Sub_rm64_imm32,
                ],
            ),
            BinOp::Xor => (
                [
                    Code::Xor_rm8_r8,
                    Code::Xor_rm16_r16,
                    Code::Xor_rm32_r32,
                    Code::Xor_rm64_r64,
                ],
                [
                    Code::Xor_r8_rm8,
                    Code::Xor_r16_rm16,
                    Code::Xor_r32_rm32,
                    Code::Xor_r64_rm64,
                ],
                [
                    Code::Xor_rm8_imm8,
                    Code::Xor_rm16_imm16,
                    Code::Xor_rm32_imm32,
                    Code::Xor_rm64_imm32,
                ],
            ),
            BinOp::Cmp => (
                [
                    Code::Cmp_rm8_r8,
                    Code::Cmp_rm16_r16,
                    Code::Cmp_rm32_r32,
                    Code::Cmp_rm64_r64,
                ],
                [
                    Code::Cmp_r8_rm8,
                    Code::Cmp_r16_rm16,
                    Code::Cmp_r32_rm32,
                    Code::Cmp_r64_rm64,
                ],
                [
                    Code::Cmp_rm8_imm8,
                    Code::Cmp_rm16_imm16,
                    Code::Cmp_rm32_imm32,
                    Code::Cmp_rm64_imm32,
                ],
            ),
        }
    };
}

/// `op rm, r`, `op r, rm` and `op rm, imm` codes of an ALU operation.
pub(super) fn alu_codes(op: BinOp) -> ([Code; 4], [Code; 4], [Code; 4]) {
    paste_codes!(op)
}

/// CMOVcc r, r/m for condition `cc` (0-15, the encoding order) and a 16-,
/// 32- or 64-bit size; `None` if iced's code table is not laid out as
/// assumed (checked by a test).
pub(super) fn cmov_code(cc: u8, size: Size) -> Option<Code> {
    let k = match size {
        Size::B2 => 0,
        Size::B4 => 1,
        Size::B8 => 2,
        Size::B1 => return None,
    };
    let code = Code::try_from(Code::Cmovo_r16_rm16 as usize + cc as usize * 3 + k).ok()?;
    let want = [
        iced_x86::Mnemonic::Cmovo,
        iced_x86::Mnemonic::Cmovno,
        iced_x86::Mnemonic::Cmovb,
        iced_x86::Mnemonic::Cmovae,
        iced_x86::Mnemonic::Cmove,
        iced_x86::Mnemonic::Cmovne,
        iced_x86::Mnemonic::Cmovbe,
        iced_x86::Mnemonic::Cmova,
        iced_x86::Mnemonic::Cmovs,
        iced_x86::Mnemonic::Cmovns,
        iced_x86::Mnemonic::Cmovp,
        iced_x86::Mnemonic::Cmovnp,
        iced_x86::Mnemonic::Cmovl,
        iced_x86::Mnemonic::Cmovge,
        iced_x86::Mnemonic::Cmovle,
        iced_x86::Mnemonic::Cmovg,
    ];
    (code.mnemonic() == want[cc as usize & 15]).then_some(code)
}

/// The host shift or rotate `op` of an `size` operand by an immediate or
/// by CL (`None`: RCL/RCR, or iced's code table not laid out as assumed,
/// checked by a test): iced numbers the 8-bit forms by the ModRM group
/// order, then the 16/32/64-bit forms of each operation in turn.
pub(super) fn shift_code(op: ShiftOp, size: Size, by_cl: bool) -> Option<Code> {
    use iced_x86::Mnemonic as M;
    let (r, want) = match op {
        ShiftOp::Rol => (0, M::Rol),
        ShiftOp::Ror => (1, M::Ror),
        ShiftOp::Shl | ShiftOp::Sal => (4, M::Shl),
        ShiftOp::Shr => (5, M::Shr),
        ShiftOp::Sar => (7, M::Sar),
        ShiftOp::Rcl | ShiftOp::Rcr => return None,
    };
    let base = if by_cl {
        Code::Rol_rm8_CL
    } else {
        Code::Rol_rm8_imm8
    } as usize;
    let n = match size {
        Size::B1 => base + r,
        s => base + 8 + r * 3 + si(s) - 1,
    };
    let code = Code::try_from(n).ok()?;
    (code.mnemonic() == want).then_some(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shift_codes_follow_the_group_order() {
        let ops = [
            ShiftOp::Rol,
            ShiftOp::Ror,
            ShiftOp::Shl,
            ShiftOp::Sal,
            ShiftOp::Shr,
            ShiftOp::Sar,
        ];
        for op in ops {
            for size in [Size::B1, Size::B2, Size::B4, Size::B8] {
                for by_cl in [false, true] {
                    let code = shift_code(op, size, by_cl).expect("shift code");
                    use iced_x86::OpCodeOperandKind as K;
                    let info = code.op_code();
                    let dst = [K::r8_or_mem, K::r16_or_mem, K::r32_or_mem, K::r64_or_mem];
                    assert_eq!(info.op0_kind(), dst[si(size)], "{op:?} {size:?}");
                    let src = if by_cl { K::cl } else { K::imm8 };
                    assert_eq!(info.op1_kind(), src, "{op:?} {size:?} {by_cl}");
                }
            }
        }
        assert_eq!(shift_code(ShiftOp::Rcl, Size::B8, true), None);
    }

    #[test]
    fn cmov_codes_follow_the_condition_order() {
        for cc in 0..16 {
            for size in [Size::B2, Size::B4, Size::B8] {
                let code = cmov_code(cc, size).expect("cmov code");
                let want_reg = match size {
                    Size::B2 => Register::AX,
                    Size::B4 => Register::EAX,
                    _ => Register::RAX,
                };
                let i = Instruction::with2(code, want_reg, MemoryOperand::with_base(Register::RBX))
                    .expect("operands fit");
                assert_eq!(i.op0_register(), want_reg);
            }
        }
    }
}
