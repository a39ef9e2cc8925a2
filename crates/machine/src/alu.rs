//! Integer-instruction semantics with exact RFLAGS, as pure functions.
//!
//! The interpreter decodes operands and calls these; they know nothing of
//! registers or memory. Every function takes the old RFLAGS and returns the
//! new RFLAGS with exactly the bits the instruction defines changed; bits the
//! SDM leaves undefined are set as a recent Intel core sets them where that
//! is cheap to match, otherwise left unchanged.
//!
//! Values are passed zero-extended in a `u64`; results come back masked to
//! the operand size.
//!
//! STUB: to be implemented (see the helper task); signatures are the contract.
#![allow(unused_variables)]

pub use crate::cpu::state::rflags;

/// Operand size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Size {
    B1 = 1,
    B2 = 2,
    B4 = 4,
    B8 = 8,
}

impl Size {
    /// Bytes.
    #[inline]
    pub const fn bytes(self) -> u8 {
        self as u8
    }
    /// Bits.
    #[inline]
    pub const fn bits(self) -> u32 {
        (self as u32) * 8
    }
    /// Mask of the low `bits()` bits.
    #[inline]
    pub const fn mask(self) -> u64 {
        match self {
            Size::B1 => 0xff,
            Size::B2 => 0xffff,
            Size::B4 => 0xffff_ffff,
            Size::B8 => u64::MAX,
        }
    }
    /// The sign bit.
    #[inline]
    pub const fn sign_bit(self) -> u64 {
        1u64 << (self.bits() - 1)
    }
    /// From a byte count (1, 2, 4, 8).
    pub const fn from_bytes(n: usize) -> Option<Size> {
        match n {
            1 => Some(Size::B1),
            2 => Some(Size::B2),
            4 => Some(Size::B4),
            8 => Some(Size::B8),
            _ => None,
        }
    }
    /// Sign-extends the low `bits()` of `v` to 64 bits.
    #[inline]
    pub const fn sign_extend(self, v: u64) -> u64 {
        let s = 64 - self.bits();
        (((v << s) as i64) >> s) as u64
    }
}

/// The eight classic ALU operations, in the order of their `/digit`
/// encodings (`80 /0` add ... `80 /7` cmp).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Or,
    Adc,
    Sbb,
    And,
    Sub,
    Xor,
    /// Computes `dst - src` for the flags; the caller does not store it.
    Cmp,
}

/// `dst op src`: returns (result, new rflags). Flags: CF OF SF ZF AF PF as
/// the SDM defines (AF undefined for logic ops: cleared, as Intel does).
pub fn binop(op: BinOp, size: Size, dst: u64, src: u64, rflags: u64) -> (u64, u64) {
    todo!()
}

/// `test a, b`: new rflags.
pub fn test(size: Size, a: u64, b: u64, rflags: u64) -> u64 {
    todo!()
}

/// `inc`: CF preserved.
pub fn inc(size: Size, v: u64, rflags: u64) -> (u64, u64) {
    todo!()
}

/// `dec`: CF preserved.
pub fn dec(size: Size, v: u64, rflags: u64) -> (u64, u64) {
    todo!()
}

/// `neg`: CF = (v != 0).
pub fn neg(size: Size, v: u64, rflags: u64) -> (u64, u64) {
    todo!()
}

/// Shift and rotate operations in `/digit` order of `C0`/`D0`/`D2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShiftOp {
    Rol,
    Ror,
    Rcl,
    Rcr,
    Shl,
    Shr,
    /// `/6`: an alias of SHL.
    Sal,
    Sar,
}

/// Shift/rotate `v` by the raw count operand (`cl` or an immediate); the
/// function masks it (5 bits, 6 for 64-bit operands) and, for RCL/RCR on 8-
/// and 16-bit operands, reduces it modulo 9/17. A masked count of 0 changes
/// no flags.
pub fn shift(op: ShiftOp, size: Size, v: u64, count: u8, rflags: u64) -> (u64, u64) {
    todo!()
}

/// `shld dst, src, count` (count masked as for shifts; 16-bit counts above
/// 16 give Intel's result).
pub fn shld(size: Size, dst: u64, src: u64, count: u8, rflags: u64) -> (u64, u64) {
    todo!()
}

/// `shrd dst, src, count`.
pub fn shrd(size: Size, dst: u64, src: u64, count: u8, rflags: u64) -> (u64, u64) {
    todo!()
}

/// Unsigned multiply (`mul`): returns (low, high, rflags); CF=OF=(high!=0).
pub fn mul(size: Size, a: u64, b: u64, rflags: u64) -> (u64, u64, u64) {
    todo!()
}

/// Signed multiply (`imul`, all forms): returns (low, high, rflags);
/// CF=OF=(the full product does not fit the sign-extended low half).
pub fn imul(size: Size, a: u64, b: u64, rflags: u64) -> (u64, u64, u64) {
    todo!()
}

/// Unsigned divide of `high:low` by `divisor`: `Some((quotient, remainder))`
/// or `None` for #DE (divisor 0 or quotient overflow). Flags are undefined
/// after DIV; the caller leaves them unchanged.
pub fn div(size: Size, high: u64, low: u64, divisor: u64) -> Option<(u64, u64)> {
    todo!()
}

/// Signed divide (`idiv`), as `div`.
pub fn idiv(size: Size, high: u64, low: u64, divisor: u64) -> Option<(u64, u64)> {
    todo!()
}

/// Bit-test operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BitOp {
    Bt,
    Bts,
    Btr,
    Btc,
}

/// `bt*` on a value with the bit index already reduced modulo the operand
/// width: returns (new value, rflags) with CF = the old bit.
pub fn bit_test(op: BitOp, size: Size, v: u64, bit: u32, rflags: u64) -> (u64, u64) {
    todo!()
}

/// `bsf`: returns (new dst, rflags). ZF=1 and dst unchanged when src is 0.
pub fn bsf(size: Size, src: u64, old_dst: u64, rflags: u64) -> (u64, u64) {
    todo!()
}

/// `bsr`, as `bsf`.
pub fn bsr(size: Size, src: u64, old_dst: u64, rflags: u64) -> (u64, u64) {
    todo!()
}

/// `tzcnt`: (count, rflags) with CF=(src==0), ZF=(count==0).
pub fn tzcnt(size: Size, src: u64, rflags: u64) -> (u64, u64) {
    todo!()
}

/// `lzcnt`, as `tzcnt`.
pub fn lzcnt(size: Size, src: u64, rflags: u64) -> (u64, u64) {
    todo!()
}

/// `popcnt`: (count, rflags) with ZF=(src==0), other arithmetic flags clear.
pub fn popcnt(size: Size, src: u64, rflags: u64) -> (u64, u64) {
    todo!()
}

/// `bswap` of a 32- or 64-bit value.
pub fn bswap(size: Size, v: u64) -> u64 {
    todo!()
}

/// Condition code `cc` (0..=15, the low nibble of `Jcc`/`SETcc`/`CMOVcc`
/// opcodes: O, NO, B, AE, E, NE, BE, A, S, NS, P, NP, L, GE, LE, G).
pub fn condition(cc: u8, rflags: u64) -> bool {
    todo!()
}
