//! Floating-point arithmetic run on the host CPU's own SSE unit.
//!
//! Why: SSE arithmetic is IEEE 754 with MXCSR's rounding modes, DAZ/FTZ
//! and six sticky exception flags whose exact rules (tininess after
//! rounding, denormal-operand detection, x86's NaN propagation and the
//! "indefinite" default NaN) every x86-64 processor implements identically.
//! Running the same instruction on the host is exact by construction and
//! needs no soft-float library to re-derive those rules. Each function
//! here is one `asm!` block that saves the host MXCSR, loads the guest's
//! rounding/DAZ/FTZ bits with every exception masked and the flags clear,
//! runs the one instruction on values passed through memory, reads the
//! result and the raised flags, and restores the host MXCSR, so no Rust
//! code ever runs with a changed MXCSR. The caller applies the guest's
//! masks (#XM or not) in software.
//!
//! Only the approximations RCPPS/RSQRTPS differ between vendors; they are
//! the host's.
//!
//! On a host that is not x86-64 these return `None` and the instructions
//! raise #UD in the guest (documented in docs/machine.md).

use iced_x86::Mnemonic;

/// Host MXCSR for a guest operation: the guest's rounding, DAZ and FTZ,
/// all exceptions masked, no flags set.
#[inline]
fn host_mxcsr(guest: u32) -> u32 {
    (guest & 0xffc0) | 0x1f80
}

/// Runs the asm `lines` between saving the host MXCSR and loading the
/// guest's (see [`host_mxcsr`]), and reading the raised flags and restoring
/// the host MXCSR; evaluates to the flags. The caller's lines may touch only
/// the operands it passes, which it must declare (clobbered registers
/// included).
#[cfg(target_arch = "x86_64")]
macro_rules! under_guest_mxcsr {
    ($guest:expr, [$($line:expr),* $(,)?], $($operand:tt)*) => {{
        let mut csr: u32 = host_mxcsr($guest);
        let mut saved: u32 = 0;
        // SAFETY: every use in this module passes lines that read and write
        // only the locals whose addresses (valid and aligned for their
        // types, accessed with unaligned-tolerant instructions) or values
        // it hands over as operands, and declares every register it
        // clobbers. The host MXCSR is restored before the block ends, so
        // the Rust code around it sees an unchanged floating-point
        // environment, and nothing can trap: every exception is masked
        // while the guest operation runs.
        unsafe {
            core::arch::asm!(
                "stmxcsr [{saved}]",
                "ldmxcsr [{csr}]",
                $($line,)*
                "stmxcsr [{csr}]",
                "ldmxcsr [{saved}]",
                saved = in(reg) &mut saved as *mut u32,
                csr = in(reg) &mut csr as *mut u32,
                $($operand)*
            );
        }
        csr & 0x3f
    }};
}

/// `$insn` (operating on xmm0 and xmm1) with xmm0 = `$a`, xmm1 = `$b`:
/// (new xmm0, flags).
#[cfg(target_arch = "x86_64")]
macro_rules! run_xmm {
    ($insn:expr, $a:expr, $b:expr, $csr:expr) => {{
        let mut r: u128 = $a;
        let b: u128 = $b;
        let flags = under_guest_mxcsr!(
            $csr,
            ["movdqu xmm0, [{r}]", "movdqu xmm1, [{b}]", $insn, "movdqu [{r}], xmm0"],
            r = in(reg) &mut r as *mut u128,
            b = in(reg) &b as *const u128,
            out("xmm0") _,
            out("xmm1") _,
            options(nostack, preserves_flags),
        );
        (r, flags)
    }};
}

/// `op xmm0, xmm1` for a two-operand SSE arithmetic or conversion
/// instruction with xmm0 = `a`, xmm1 = `b` under the guest MXCSR `csr`:
/// the new xmm0 and the exception flags raised (all masked). `None` for a
/// mnemonic this does not run.
#[cfg(target_arch = "x86_64")]
pub fn xmm_op(m: Mnemonic, a: u128, b: u128, csr: u32) -> Option<(u128, u32)> {
    macro_rules! ops {
        ($($name:ident => $text:literal),* $(,)?) => {
            match m {
                $(Mnemonic::$name => Some(run_xmm!(concat!($text, " xmm0, xmm1"), a, b, csr)),)*
                _ => None,
            }
        };
    }
    ops!(
        Addss => "addss", Addsd => "addsd", Addps => "addps", Addpd => "addpd",
        Subss => "subss", Subsd => "subsd", Subps => "subps", Subpd => "subpd",
        Mulss => "mulss", Mulsd => "mulsd", Mulps => "mulps", Mulpd => "mulpd",
        Divss => "divss", Divsd => "divsd", Divps => "divps", Divpd => "divpd",
        Minss => "minss", Minsd => "minsd", Minps => "minps", Minpd => "minpd",
        Maxss => "maxss", Maxsd => "maxsd", Maxps => "maxps", Maxpd => "maxpd",
        Sqrtss => "sqrtss", Sqrtsd => "sqrtsd", Sqrtps => "sqrtps", Sqrtpd => "sqrtpd",
        Rcpss => "rcpss", Rcpps => "rcpps", Rsqrtss => "rsqrtss", Rsqrtps => "rsqrtps",
        Cvtss2sd => "cvtss2sd", Cvtsd2ss => "cvtsd2ss",
        Cvtdq2ps => "cvtdq2ps", Cvtps2dq => "cvtps2dq", Cvttps2dq => "cvttps2dq",
        Cvtdq2pd => "cvtdq2pd", Cvtpd2dq => "cvtpd2dq", Cvttpd2dq => "cvttpd2dq",
        Cvtps2pd => "cvtps2pd", Cvtpd2ps => "cvtpd2ps",
    )
}

/// CMPSS/CMPSD/CMPPS/CMPPD with predicate `pred` (0-7).
#[cfg(target_arch = "x86_64")]
pub fn xmm_cmp(m: Mnemonic, pred: u8, a: u128, b: u128, csr: u32) -> Option<(u128, u32)> {
    macro_rules! preds {
        ($text:literal) => {
            match pred & 7 {
                0 => run_xmm!(concat!($text, " xmm0, xmm1, 0"), a, b, csr),
                1 => run_xmm!(concat!($text, " xmm0, xmm1, 1"), a, b, csr),
                2 => run_xmm!(concat!($text, " xmm0, xmm1, 2"), a, b, csr),
                3 => run_xmm!(concat!($text, " xmm0, xmm1, 3"), a, b, csr),
                4 => run_xmm!(concat!($text, " xmm0, xmm1, 4"), a, b, csr),
                5 => run_xmm!(concat!($text, " xmm0, xmm1, 5"), a, b, csr),
                6 => run_xmm!(concat!($text, " xmm0, xmm1, 6"), a, b, csr),
                _ => run_xmm!(concat!($text, " xmm0, xmm1, 7"), a, b, csr),
            }
        };
    }
    Some(match m {
        Mnemonic::Cmpss => preds!("cmpss"),
        Mnemonic::Cmpsd => preds!("cmpsd"),
        Mnemonic::Cmpps => preds!("cmpps"),
        Mnemonic::Cmppd => preds!("cmppd"),
        _ => return None,
    })
}

/// COMISS/COMISD/UCOMISS/UCOMISD: the ZF, PF and CF they set (as RFLAGS
/// bits) and the exception flags raised.
#[cfg(target_arch = "x86_64")]
pub fn xmm_comi(m: Mnemonic, a: u128, b: u128, csr: u32) -> Option<(u64, u32)> {
    macro_rules! comi {
        ($text:literal) => {{
            let ah: u16;
            // The instruction sets RFLAGS, which LAHF copies into AH.
            let flags = under_guest_mxcsr!(
                csr,
                [
                    "movdqu xmm0, [{a}]",
                    "movdqu xmm1, [{b}]",
                    concat!($text, " xmm0, xmm1"),
                    "lahf"
                ],
                a = in(reg) &a as *const u128,
                b = in(reg) &b as *const u128,
                out("ax") ah,
                out("xmm0") _,
                out("xmm1") _,
                options(nostack),
            );
            // AH holds SF ZF 0 AF 0 PF 1 CF; COMI* set only ZF PF CF.
            (((ah >> 8) as u64) & 0x45, flags)
        }};
    }
    Some(match m {
        Mnemonic::Comiss => comi!("comiss"),
        Mnemonic::Comisd => comi!("comisd"),
        Mnemonic::Ucomiss => comi!("ucomiss"),
        Mnemonic::Ucomisd => comi!("ucomisd"),
        _ => return None,
    })
}

/// CVTSI2SS/CVTSI2SD from a 32-bit (`wide` false) or 64-bit integer into
/// the low element of `a`.
#[cfg(target_arch = "x86_64")]
pub fn int_to_xmm(m: Mnemonic, a: u128, src: u64, wide: bool, csr: u32) -> Option<(u128, u32)> {
    macro_rules! cvt {
        ($text:literal) => {{
            let mut r: u128 = a;
            let flags = under_guest_mxcsr!(
                csr,
                ["movdqu xmm0, [{r}]", $text, "movdqu [{r}], xmm0"],
                r = in(reg) &mut r as *mut u128,
                s = in(reg) src,
                out("xmm0") _,
                options(nostack, preserves_flags),
            );
            (r, flags)
        }};
    }
    Some(match (m, wide) {
        (Mnemonic::Cvtsi2ss, false) => cvt!("cvtsi2ss xmm0, {s:e}"),
        (Mnemonic::Cvtsi2ss, true) => cvt!("cvtsi2ss xmm0, {s}"),
        (Mnemonic::Cvtsi2sd, false) => cvt!("cvtsi2sd xmm0, {s:e}"),
        (Mnemonic::Cvtsi2sd, true) => cvt!("cvtsi2sd xmm0, {s}"),
        _ => return None,
    })
}

/// CVT(T)SS2SI/CVT(T)SD2SI of the low element of `b` into a 32-bit
/// (`wide` false, zero-extended) or 64-bit integer.
#[cfg(target_arch = "x86_64")]
pub fn xmm_to_int(m: Mnemonic, b: u128, wide: bool, csr: u32) -> Option<(u64, u32)> {
    macro_rules! cvt {
        ($text:literal) => {{
            let mut d: u64 = 0;
            // A 32-bit destination register is zero-extended.
            let flags = under_guest_mxcsr!(
                csr,
                ["movdqu xmm1, [{b}]", $text],
                b = in(reg) &b as *const u128,
                d = inout(reg) d,
                out("xmm1") _,
                options(nostack, preserves_flags),
            );
            (d, flags)
        }};
    }
    Some(match (m, wide) {
        (Mnemonic::Cvtss2si, false) => cvt!("cvtss2si {d:e}, xmm1"),
        (Mnemonic::Cvtss2si, true) => cvt!("cvtss2si {d}, xmm1"),
        (Mnemonic::Cvttss2si, false) => cvt!("cvttss2si {d:e}, xmm1"),
        (Mnemonic::Cvttss2si, true) => cvt!("cvttss2si {d}, xmm1"),
        (Mnemonic::Cvtsd2si, false) => cvt!("cvtsd2si {d:e}, xmm1"),
        (Mnemonic::Cvtsd2si, true) => cvt!("cvtsd2si {d}, xmm1"),
        (Mnemonic::Cvttsd2si, false) => cvt!("cvttsd2si {d:e}, xmm1"),
        (Mnemonic::Cvttsd2si, true) => cvt!("cvttsd2si {d}, xmm1"),
        _ => return None,
    })
}

#[cfg(not(target_arch = "x86_64"))]
pub fn xmm_op(_: Mnemonic, _: u128, _: u128, _: u32) -> Option<(u128, u32)> {
    None
}
#[cfg(not(target_arch = "x86_64"))]
pub fn xmm_cmp(_: Mnemonic, _: u8, _: u128, _: u128, _: u32) -> Option<(u128, u32)> {
    None
}
#[cfg(not(target_arch = "x86_64"))]
pub fn xmm_comi(_: Mnemonic, _: u128, _: u128, _: u32) -> Option<(u64, u32)> {
    None
}
#[cfg(not(target_arch = "x86_64"))]
pub fn int_to_xmm(_: Mnemonic, _: u128, _: u64, _: bool, _: u32) -> Option<(u128, u32)> {
    None
}
#[cfg(not(target_arch = "x86_64"))]
pub fn xmm_to_int(_: Mnemonic, _: u128, _: bool, _: u32) -> Option<(u64, u32)> {
    None
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    fn pd(lo: f64, hi: f64) -> u128 {
        (lo.to_bits() as u128) | ((hi.to_bits() as u128) << 64)
    }

    #[test]
    fn rounding_modes_and_flags_come_from_the_guest_mxcsr() {
        let third = |rc: u32| {
            let (r, flags) = xmm_op(Mnemonic::Divsd, pd(1.0, 7.0), pd(3.0, 0.0), rc << 13).unwrap();
            assert_eq!(r >> 64, 7.0f64.to_bits() as u128, "upper half kept");
            assert_eq!(flags, 1 << 5, "inexact");
            f64::from_bits(r as u64)
        };
        let nearest = third(0);
        let down = third(1);
        let up = third(2);
        let zero = third(3);
        assert_eq!(nearest, 1.0 / 3.0);
        assert!(down < up && zero == down && (nearest == down || nearest == up));
        // Division by zero: ZE, +inf.
        let (r, flags) = xmm_op(Mnemonic::Divsd, pd(1.0, 0.0), pd(0.0, 0.0), 0x1f80).unwrap();
        assert_eq!(f64::from_bits(r as u64), f64::INFINITY);
        assert_eq!(flags, 1 << 2);
        // 0/0: the default NaN (negative quiet "indefinite") and IE.
        let (r, flags) = xmm_op(Mnemonic::Divsd, pd(0.0, 0.0), pd(0.0, 0.0), 0x1f80).unwrap();
        assert_eq!(r as u64, 0xfff8_0000_0000_0000);
        assert_eq!(flags, 1);
    }

    #[test]
    fn conversions_and_compares() {
        let (r, flags) = xmm_to_int(Mnemonic::Cvttsd2si, pd(-2.75, 0.0), true, 0x1f80).unwrap();
        assert_eq!((r as i64, flags), (-2, 1 << 5));
        let (r, flags) = xmm_to_int(Mnemonic::Cvtsd2si, pd(1e300, 0.0), false, 0x1f80).unwrap();
        assert_eq!(
            (r, flags),
            (0x8000_0000, 1),
            "32-bit indefinite, zero-extended"
        );
        let (r, _) = int_to_xmm(Mnemonic::Cvtsi2sd, 0, u64::MAX, true, 0x1f80).unwrap();
        assert_eq!(f64::from_bits(r as u64), -1.0);
        let (fl, flags) =
            xmm_comi(Mnemonic::Ucomisd, pd(1.0, 0.0), pd(f64::NAN, 0.0), 0x1f80).unwrap();
        assert_eq!(
            (fl, flags),
            (0x45, 0),
            "unordered: ZF PF CF, quiet NaN no IE"
        );
        let (fl, _) = xmm_comi(Mnemonic::Comisd, pd(1.0, 0.0), pd(2.0, 0.0), 0x1f80).unwrap();
        assert_eq!(fl, 0x01, "less: CF");
        let (r, _) = xmm_cmp(Mnemonic::Cmppd, 1, pd(1.0, 3.0), pd(2.0, 2.0), 0x1f80).unwrap();
        assert_eq!(r, u64::MAX as u128, "1<2 true, 3<2 false");
    }
}
