//! SSE and SSE2: XMM data movement, 128-bit integer SIMD, scalar and
//! packed single/double arithmetic, conversions, MXCSR, FXSAVE/FXRSTOR.
//!
//! Integer SIMD and data movement are computed here lane by lane;
//! floating-point instructions run on the host's SSE unit under the
//! guest's MXCSR (see `hostfp`), and the guest's exception masks are
//! applied here: masked exceptions set MXCSR flags, an unmasked one raises
//! #XM (#UD when CR4.OSXMMEXCPT is clear) without writing the destination.
//!
//! Checks in the order the SDM gives them (Vol. 3, 13.? "Exceptions
//! class 4"): #UD when CR0.EM is set or CR4.OSFXSR clear (or an MMX
//! register is named: no MMX here), #NM when CR0.TS is set, then memory
//! faults (#GP(0) for a misaligned 16-byte operand of an aligned form),
//! then numeric exceptions.

use super::fpu_state::{mxcsr, FXSAVE_SIZE, FXSAVE_WRITTEN};
use super::state::{cr0, cr4, rflags};
use super::{hostfp, vector, Cpu, Fault};
use crate::alu::Size;
use crate::memory::PhysMemory;
use crate::mmu::AccessKind;
use iced_x86::{CpuidFeature, Instruction, Mnemonic as M, OpKind, Register};

use super::exec::{gp0, ud};

/// Whether `exec` hands this mnemonic to [`Cpu::exec_simd`].
pub(super) fn is_simd(m: M) -> bool {
    is_full_move(m)
        || matches!(
            m,
            M::Movnti
                | M::Emms
                | M::Movd
                | M::Movq
                | M::Movss
                | M::Movsd
                | M::Movlps
                | M::Movlpd
                | M::Movhps
                | M::Movhpd
                | M::Movhlps
                | M::Movlhps
                | M::Movmskps
                | M::Movmskpd
                | M::Pmovmskb
                | M::Ldmxcsr
                | M::Stmxcsr
                | M::Fxsave
                | M::Fxsave64
                | M::Fxrstor
                | M::Fxrstor64
                | M::Pextrw
                | M::Pinsrw
                | M::Pshufd
                | M::Pshuflw
                | M::Pshufhw
                | M::Shufps
                | M::Shufpd
                | M::Pslldq
                | M::Psrldq
                | M::Comiss
                | M::Comisd
                | M::Ucomiss
                | M::Ucomisd
                | M::Cmpss
                | M::Cmpsd
                | M::Cmpps
                | M::Cmppd
                | M::Cvtsi2ss
                | M::Cvtsi2sd
                | M::Cvtss2si
                | M::Cvttss2si
                | M::Cvtsd2si
                | M::Cvttsd2si
        )
        || lane_op(m).is_some()
        || lane_shift(m).is_some()
        || whole_op(m).is_some()
        || is_host_fp(m)
}

/// Integer SIMD instructions that rearrange whole registers: unpacks and
/// packs.
fn whole_op(m: M) -> Option<fn(u128, u128) -> u128> {
    Some(match m {
        M::Punpcklbw => |a, b| unpack(8, a, b, false),
        M::Punpcklwd => |a, b| unpack(16, a, b, false),
        M::Punpckldq | M::Unpcklps => |a, b| unpack(32, a, b, false),
        M::Punpcklqdq | M::Unpcklpd => |a, b| unpack(64, a, b, false),
        M::Punpckhbw => |a, b| unpack(8, a, b, true),
        M::Punpckhwd => |a, b| unpack(16, a, b, true),
        M::Punpckhdq | M::Unpckhps => |a, b| unpack(32, a, b, true),
        M::Punpckhqdq | M::Unpckhpd => |a, b| unpack(64, a, b, true),
        M::Packsswb => |a, b| pack(8, a, b, true),
        M::Packssdw => |a, b| pack(16, a, b, true),
        M::Packuswb => |a, b| pack(8, a, b, false),
        _ => return None,
    })
}

/// Lane shifts by an immediate or an XMM/m128 count: (lane bits, left,
/// arithmetic).
fn lane_shift(m: M) -> Option<(u32, bool, bool)> {
    Some(match m {
        M::Psllw => (16, true, false),
        M::Pslld => (32, true, false),
        M::Psllq => (64, true, false),
        M::Psrlw => (16, false, false),
        M::Psrld => (32, false, false),
        M::Psrlq => (64, false, false),
        M::Psraw => (16, false, true),
        M::Psrad => (32, false, true),
        _ => return None,
    })
}

/// Whole-register moves (XMM to XMM, or 16 bytes to or from memory).
fn is_full_move(m: M) -> bool {
    matches!(
        m,
        M::Movdqa
            | M::Movdqu
            | M::Movaps
            | M::Movups
            | M::Movapd
            | M::Movupd
            | M::Movntdq
            | M::Movntps
            | M::Movntpd
    )
}

/// Floating-point instructions whose result comes from the host unit.
fn is_host_fp(m: M) -> bool {
    matches!(
        m,
        M::Addss
            | M::Addsd
            | M::Addps
            | M::Addpd
            | M::Subss
            | M::Subsd
            | M::Subps
            | M::Subpd
            | M::Mulss
            | M::Mulsd
            | M::Mulps
            | M::Mulpd
            | M::Divss
            | M::Divsd
            | M::Divps
            | M::Divpd
            | M::Minss
            | M::Minsd
            | M::Minps
            | M::Minpd
            | M::Maxss
            | M::Maxsd
            | M::Maxps
            | M::Maxpd
            | M::Sqrtss
            | M::Sqrtsd
            | M::Sqrtps
            | M::Sqrtpd
            | M::Rcpss
            | M::Rcpps
            | M::Rsqrtss
            | M::Rsqrtps
            | M::Cvtss2sd
            | M::Cvtsd2ss
            | M::Cvtdq2ps
            | M::Cvtps2dq
            | M::Cvttps2dq
            | M::Cvtdq2pd
            | M::Cvtpd2dq
            | M::Cvttpd2dq
            | M::Cvtps2pd
            | M::Cvtpd2ps
    )
}

/// The floating-point lanes an arithmetic result can underflow in:
/// (lane bits, lanes). `None` for operations that cannot produce a tiny
/// result from normal-range arithmetic.
fn underflow_lanes(m: M) -> Option<(u32, u32)> {
    Some(match m {
        M::Addss | M::Subss | M::Mulss | M::Divss | M::Cvtsd2ss => (32, 1),
        M::Addps | M::Subps | M::Mulps | M::Divps => (32, 4),
        M::Cvtpd2ps => (32, 2),
        M::Addsd | M::Subsd | M::Mulsd | M::Divsd => (64, 1),
        M::Addpd | M::Subpd | M::Mulpd | M::Divpd => (64, 2),
        _ => return None,
    })
}

/// Whether any of the first `lanes` lanes of `v` is a denormal.
fn has_denormal(v: u128, bits: u32, lanes: u32) -> bool {
    let (exp_mask, frac_mask) = if bits == 32 {
        (0x7f80_0000u64, 0x007f_ffffu64)
    } else {
        (0x7ff0_0000_0000_0000, 0x000f_ffff_ffff_ffff)
    };
    (0..lanes).any(|k| {
        let x = (v >> (k * bits)) as u64;
        x & exp_mask == 0 && x & frac_mask != 0
    })
}

/// A lane-wise integer operation: (lane width in bits, function).
type LaneFn = fn(u64, u64) -> u64;

/// Sign-extends the low `w` bits.
#[inline]
fn sx(v: u64, w: u32) -> i64 {
    ((v << (64 - w)) as i64) >> (64 - w)
}

fn sat_signed(v: i64, w: u32) -> u64 {
    let max = (1i64 << (w - 1)) - 1;
    let min = -(1i64 << (w - 1));
    v.clamp(min, max) as u64
}

fn sat_unsigned(v: i64, w: u32) -> u64 {
    v.clamp(0, (1i64 << w) - 1) as u64
}

/// Integer SIMD instructions that combine the lanes of the two operands
/// one by one.
fn lane_op(m: M) -> Option<(u32, LaneFn)> {
    Some(match m {
        M::Paddb => (8, |a, b| a.wrapping_add(b)),
        M::Paddw => (16, |a, b| a.wrapping_add(b)),
        M::Paddd => (32, |a, b| a.wrapping_add(b)),
        M::Paddq => (64, |a, b| a.wrapping_add(b)),
        M::Psubb => (8, |a, b| a.wrapping_sub(b)),
        M::Psubw => (16, |a, b| a.wrapping_sub(b)),
        M::Psubd => (32, |a, b| a.wrapping_sub(b)),
        M::Psubq => (64, |a, b| a.wrapping_sub(b)),
        M::Paddsb => (8, |a, b| sat_signed(sx(a, 8) + sx(b, 8), 8)),
        M::Paddsw => (16, |a, b| sat_signed(sx(a, 16) + sx(b, 16), 16)),
        M::Psubsb => (8, |a, b| sat_signed(sx(a, 8) - sx(b, 8), 8)),
        M::Psubsw => (16, |a, b| sat_signed(sx(a, 16) - sx(b, 16), 16)),
        M::Paddusb => (8, |a, b| sat_unsigned(a as i64 + b as i64, 8)),
        M::Paddusw => (16, |a, b| sat_unsigned(a as i64 + b as i64, 16)),
        M::Psubusb => (8, |a, b| sat_unsigned(a as i64 - b as i64, 8)),
        M::Psubusw => (16, |a, b| sat_unsigned(a as i64 - b as i64, 16)),
        M::Pcmpeqb => (8, |a, b| if a == b { u64::MAX } else { 0 }),
        M::Pcmpeqw => (16, |a, b| if a == b { u64::MAX } else { 0 }),
        M::Pcmpeqd => (32, |a, b| if a == b { u64::MAX } else { 0 }),
        M::Pcmpgtb => (8, |a, b| if sx(a, 8) > sx(b, 8) { u64::MAX } else { 0 }),
        M::Pcmpgtw => (16, |a, b| if sx(a, 16) > sx(b, 16) { u64::MAX } else { 0 }),
        M::Pcmpgtd => (32, |a, b| if sx(a, 32) > sx(b, 32) { u64::MAX } else { 0 }),
        M::Pminub => (8, |a, b| a.min(b)),
        M::Pmaxub => (8, |a, b| a.max(b)),
        M::Pminsw => (16, |a, b| sx(a, 16).min(sx(b, 16)) as u64),
        M::Pmaxsw => (16, |a, b| sx(a, 16).max(sx(b, 16)) as u64),
        M::Pavgb => (8, |a, b| (a + b + 1) >> 1),
        M::Pavgw => (16, |a, b| (a + b + 1) >> 1),
        M::Pmullw => (16, |a, b| a.wrapping_mul(b)),
        M::Pmulhw => (16, |a, b| ((sx(a, 16) * sx(b, 16)) >> 16) as u64),
        M::Pmulhuw => (16, |a, b| (a * b) >> 16),
        M::Pmuludq => (64, |a, b| (a & 0xffff_ffff) * (b & 0xffff_ffff)),
        M::Pmaddwd => (32, |a, b| {
            let lo = sx(a, 16) * sx(b, 16);
            let hi = sx(a >> 16, 16) * sx(b >> 16, 16);
            (lo + hi) as u64
        }),
        M::Psadbw => (64, |a, b| {
            (0..8)
                .map(|k| ((a >> (8 * k)) as u8).abs_diff((b >> (8 * k)) as u8) as u64)
                .sum()
        }),
        M::Pand | M::Andps | M::Andpd => (64, |a, b| a & b),
        M::Pandn | M::Andnps | M::Andnpd => (64, |a, b| !a & b),
        M::Por | M::Orps | M::Orpd => (64, |a, b| a | b),
        M::Pxor | M::Xorps | M::Xorpd => (64, |a, b| a ^ b),
        _ => return None,
    })
}

/// Applies `f` to each `w`-bit lane pair.
fn map_lanes(w: u32, a: u128, b: u128, f: LaneFn) -> u128 {
    let mask = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
    let mut r = 0u128;
    for k in 0..128 / w {
        let s = k * w;
        let x = (a >> s) as u64 & mask;
        let y = (b >> s) as u64 & mask;
        r |= ((f(x, y) & mask) as u128) << s;
    }
    r
}

/// Lane `k` of width `w`.
#[inline]
fn lane(v: u128, w: u32, k: u32) -> u64 {
    let mask = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
    (v >> (k * w)) as u64 & mask
}

/// Interleaves the low (`high` false) or high halves of `a` and `b` in
/// `w`-bit lanes: a0 b0 a1 b1 ...
fn unpack(w: u32, a: u128, b: u128, high: bool) -> u128 {
    let n = 128 / w;
    let first = if high { n / 2 } else { 0 };
    let mut r = 0u128;
    for k in 0..n / 2 {
        r |= (lane(a, w, first + k) as u128) << (2 * k * w);
        r |= (lane(b, w, first + k) as u128) << ((2 * k + 1) * w);
    }
    r
}

/// Packs the `2w`-bit lanes of `a` then `b` into `w`-bit lanes with
/// saturation (`signed_out`: signed result range, else unsigned).
fn pack(w: u32, a: u128, b: u128, signed_out: bool) -> u128 {
    let n = 64 / w;
    let mut r = 0u128;
    for (half, v) in [a, b].into_iter().enumerate() {
        for k in 0..n {
            let x = sx(lane(v, 2 * w, k), 2 * w);
            let s = if signed_out {
                sat_signed(x, w)
            } else {
                sat_unsigned(x, w)
            };
            let mask = (1u64 << w) - 1;
            r |= ((s & mask) as u128) << ((half as u32 * n + k) * w);
        }
    }
    r
}

/// A shift of each `w`-bit lane by `count` (logical, or arithmetic when
/// `arith`); counts past the width give 0 (or the sign).
fn shift_lanes(w: u32, v: u128, count: u64, left: bool, arith: bool) -> u128 {
    let mask = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
    let mut r = 0u128;
    for k in 0..128 / w {
        let x = lane(v, w, k);
        let y = if arith {
            let c = count.min(w as u64 - 1) as u32;
            (sx(x, w) >> c) as u64 & mask
        } else if count >= w as u64 {
            0
        } else if left {
            (x << count) & mask
        } else {
            x >> count
        };
        r |= (y as u128) << (k * w);
    }
    r
}

impl Cpu {
    #[inline]
    fn xmm_index(r: Register) -> usize {
        (r as usize - Register::XMM0 as usize) & 15
    }

    /// The #UD/#NM checks every SSE instruction makes first.
    fn simd_usable(&self, i: &Instruction) -> Result<(), Fault> {
        let s = &self.state;
        if s.cr0 & cr0::EM != 0 || s.cr4 & cr4::OSFXSR == 0 {
            return Err(ud());
        }
        // No MMX: the MMX-register forms of these opcodes are #UD.
        if (0..i.op_count()).any(|n| i.op_kind(n) == OpKind::Register && i.op_register(n).is_mm()) {
            return Err(ud());
        }
        if s.cr0 & cr0::TS != 0 {
            return Err(Fault::exception(vector::NM));
        }
        Ok(())
    }

    /// Reads `bytes` (1-16) at `la`; a 16-byte `aligned` access must be
    /// 16-byte aligned (#GP(0)).
    fn read_simd_mem(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        bytes: usize,
        aligned: bool,
    ) -> Result<u128, Fault> {
        if bytes == 16 {
            if aligned && la & 15 != 0 {
                return Err(gp0());
            }
            let lo = self.read_mem(mem, la, Size::B8)?;
            let hi = self.read_mem(mem, la.wrapping_add(8), Size::B8)?;
            return Ok(lo as u128 | (hi as u128) << 64);
        }
        let size = Size::from_bytes(bytes).ok_or_else(ud)?;
        Ok(self.read_mem(mem, la, size)? as u128)
    }

    /// Writes the low `bytes` of `v` at `la`, all or nothing.
    fn write_simd_mem(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        bytes: usize,
        aligned: bool,
        v: u128,
    ) -> Result<(), Fault> {
        if bytes == 16 {
            if aligned && la & 15 != 0 {
                return Err(gp0());
            }
            // Both pages checked for writing before either half is stored.
            let user = self.state.cpl() == 3;
            self.translate(mem, la, AccessKind::Write, user)?;
            self.translate(mem, la.wrapping_add(15), AccessKind::Write, user)?;
            self.write_mem(mem, la, Size::B8, v as u64)?;
            return self.write_mem(mem, la.wrapping_add(8), Size::B8, (v >> 64) as u64);
        }
        let size = Size::from_bytes(bytes).ok_or_else(ud)?;
        self.write_mem(mem, la, size, v as u64)
    }

    /// Operand `n` as a source: an XMM register, a general register
    /// (zero-extended), memory of the instruction's memory size, or an
    /// immediate.
    fn simd_src(&mut self, mem: &PhysMemory, i: &Instruction, n: u32) -> Result<u128, Fault> {
        match i.op_kind(n) {
            OpKind::Register => {
                let r = i.op_register(n);
                if r.is_xmm() {
                    Ok(self.state.fpu.xmm[Self::xmm_index(r)])
                } else {
                    Ok(self.reg(r) as u128)
                }
            }
            OpKind::Memory => {
                let la = self.effective_address(i);
                let bytes = i.memory_size().size();
                self.read_simd_mem(mem, la, bytes, aligned_form(i.mnemonic()))
            }
            _ => Ok(i.immediate(n) as u128),
        }
    }

    /// Writes operand `n` (XMM register: whole register; general register
    /// with x86 zero-extension; memory of the instruction's memory size).
    fn simd_dst(
        &mut self,
        mem: &PhysMemory,
        i: &Instruction,
        n: u32,
        v: u128,
    ) -> Result<(), Fault> {
        match i.op_kind(n) {
            OpKind::Register => {
                let r = i.op_register(n);
                if r.is_xmm() {
                    self.state.fpu.xmm[Self::xmm_index(r)] = v;
                } else {
                    self.set_reg(r, v as u64);
                }
                Ok(())
            }
            OpKind::Memory => {
                let la = self.effective_address(i);
                let bytes = i.memory_size().size();
                self.write_simd_mem(mem, la, bytes, aligned_form(i.mnemonic()), v)
            }
            _ => Err(ud()),
        }
    }

    /// The XMM register of operand `n` (which must be one).
    fn xmm_op(&self, i: &Instruction, n: u32) -> Result<usize, Fault> {
        let r = i.op_register(n);
        if i.op_kind(n) == OpKind::Register && r.is_xmm() {
            Ok(Self::xmm_index(r))
        } else {
            Err(ud())
        }
    }

    /// Applies the MXCSR masks to the exception flags an operation raised:
    /// all masked, the flags are set and the result may be written; any
    /// unmasked, the flags that the SDM's two-stage rule reports are set
    /// and #XM (or #UD) is raised before the destination is written.
    fn simd_fp_exceptions(&mut self, flags: u32) -> Result<(), Fault> {
        let csr = self.state.fpu.mxcsr;
        let masks = (csr >> mxcsr::MASK_SHIFT) & mxcsr::FLAGS;
        if flags & !masks == 0 {
            self.state.fpu.mxcsr |= flags;
            return Ok(());
        }
        // Pre-computation exceptions (invalid, denormal, divide by zero)
        // that are unmasked stop the operation before the post-computation
        // ones (overflow, underflow, precision) are looked for.
        let pre = flags & (mxcsr::IE | mxcsr::DE | mxcsr::ZE);
        let post = flags & (mxcsr::OE | mxcsr::UE);
        let reported = if pre & !masks != 0 {
            pre
        } else if post & !masks != 0 {
            // An unmasked overflow or underflow is reported without the
            // precision flag (as the hardware we check against does).
            flags & !mxcsr::PE
        } else {
            flags
        };
        self.state.fpu.mxcsr |= reported;
        if self.state.cr4 & cr4::OSXMMEXCPT != 0 {
            Err(Fault::exception(vector::XM))
        } else {
            Err(ud())
        }
    }

    /// The MXCSR to run a host operation with: with underflow unmasked,
    /// FTZ has no effect (SDM 10.2.3.3), so it is dropped.
    fn host_csr(&self) -> u32 {
        let csr = self.state.fpu.mxcsr;
        if csr & (mxcsr::UE << mxcsr::MASK_SHIFT) == 0 {
            csr & !mxcsr::FTZ
        } else {
            csr
        }
    }

    /// Flags of a host operation, adding UE for an exact tiny result when
    /// underflow is unmasked (masked, only tiny and inexact sets it).
    fn underflow_adjusted(&self, m: M, r: u128, flags: u32) -> u32 {
        let unmasked_ue = self.state.fpu.mxcsr & (mxcsr::UE << mxcsr::MASK_SHIFT) == 0;
        match underflow_lanes(m) {
            Some((bits, lanes)) if unmasked_ue && has_denormal(r, bits, lanes) => flags | mxcsr::UE,
            _ => flags,
        }
    }

    /// Executes an SSE/SSE2 instruction ([`is_simd`]).
    pub(super) fn exec_simd(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        if super::mmx::is_mmx_move(i) {
            return self.exec_mmx_move(mem, i);
        }
        let m = i.mnemonic();
        // Later extensions reuse these mnemonics (SSE4.1 PEXTRW to memory,
        // AVX forms): only SSE, SSE2 and FXSR are implemented.
        if !i.cpuid_features().iter().all(|f| {
            matches!(
                f,
                CpuidFeature::SSE | CpuidFeature::SSE2 | CpuidFeature::FXSR
            )
        }) {
            return Err(ud());
        }
        if m == M::Movnti {
            // A general-register store: no SSE state involved.
            let size = Self::op_size(i, 0);
            let v = self.reg(i.op1_register());
            return self.write_op(mem, i, 0, size, v);
        }
        if matches!(m, M::Fxsave | M::Fxsave64 | M::Fxrstor | M::Fxrstor64) {
            return self.exec_fxsave(mem, i);
        }
        self.simd_usable(i)?;
        if let Some((w, f)) = lane_op(m) {
            let d = self.xmm_op(i, 0)?;
            let b = self.simd_src(mem, i, 1)?;
            let a = self.state.fpu.xmm[d];
            self.state.fpu.xmm[d] = map_lanes(w, a, b, f);
            return Ok(());
        }
        if let Some((w, left, arith)) = lane_shift(m) {
            let d = self.xmm_op(i, 0)?;
            // The count is an immediate or the low quadword of an XMM
            // register or m128.
            let count = self.simd_src(mem, i, 1)? as u64;
            let x = self.state.fpu.xmm[d];
            self.state.fpu.xmm[d] = shift_lanes(w, x, count, left, arith);
            return Ok(());
        }
        if let Some(f) = whole_op(m) {
            let d = self.xmm_op(i, 0)?;
            let b = self.simd_src(mem, i, 1)?;
            let a = self.state.fpu.xmm[d];
            self.state.fpu.xmm[d] = f(a, b);
            return Ok(());
        }
        if is_host_fp(m) {
            let d = self.xmm_op(i, 0)?;
            let b = self.simd_src(mem, i, 1)?;
            let a = self.state.fpu.xmm[d];
            let (r, flags) = hostfp::xmm_op(m, a, b, self.host_csr()).ok_or_else(ud)?;
            let flags = self.underflow_adjusted(m, r, flags);
            self.simd_fp_exceptions(flags)?;
            self.state.fpu.xmm[d] = r;
            return Ok(());
        }
        match m {
            m if is_full_move(m) => {
                let v = self.simd_src(mem, i, 1)?;
                self.simd_dst(mem, i, 0, v)
            }
            M::Movd | M::Movq => {
                // To an XMM register: zero-extended; to a general register
                // or memory: the low 32/64 bits.
                let v = self.simd_src(mem, i, 1)?;
                let v = if m == M::Movd || i.op1_register().is_gpr32() {
                    v & 0xffff_ffff
                } else {
                    v & u64::MAX as u128
                };
                self.simd_dst(mem, i, 0, v)
            }
            M::Movss | M::Movsd => {
                let bits = if m == M::Movss { 32 } else { 64 };
                let low = (1u128 << bits) - 1;
                let v = self.simd_src(mem, i, 1)? & low;
                if i.op0_kind() == OpKind::Register && i.op1_kind() == OpKind::Register {
                    // Register to register merges into the low element.
                    let d = self.xmm_op(i, 0)?;
                    let x = &mut self.state.fpu.xmm[d];
                    *x = (*x & !low) | v;
                    Ok(())
                } else {
                    // A load zero-extends; a store writes the element.
                    self.simd_dst(mem, i, 0, v)
                }
            }
            M::Movlps | M::Movlpd | M::Movhps | M::Movhpd | M::Movhlps | M::Movlhps => {
                self.exec_half_move(mem, i)
            }
            M::Movmskps | M::Movmskpd | M::Pmovmskb => {
                let s = self.state.fpu.xmm[self.xmm_op(i, 1)?];
                let w = match m {
                    M::Movmskps => 32,
                    M::Movmskpd => 64,
                    _ => 8,
                };
                let bits =
                    (0..128 / w).fold(0u64, |acc, k| acc | ((lane(s, w, k) >> (w - 1)) & 1) << k);
                self.set_reg(i.op0_register(), bits);
                Ok(())
            }
            M::Ldmxcsr => {
                let la = self.effective_address(i);
                let v = self.read_mem(mem, la, Size::B4)? as u32;
                if v & !mxcsr::WRITABLE != 0 {
                    return Err(gp0());
                }
                self.state.fpu.mxcsr = v;
                Ok(())
            }
            M::Stmxcsr => {
                let la = self.effective_address(i);
                self.write_mem(mem, la, Size::B4, self.state.fpu.mxcsr as u64)
            }
            M::Pextrw => {
                let s = self.state.fpu.xmm[self.xmm_op(i, 1)?];
                let v = lane(s, 16, (i.immediate8() & 7) as u32);
                self.set_reg(i.op0_register(), v);
                Ok(())
            }
            M::Pinsrw => {
                let d = self.xmm_op(i, 0)?;
                let v = (self.simd_src(mem, i, 1)? & 0xffff) as u64;
                let k = (i.immediate8() & 7) as u32;
                let x = &mut self.state.fpu.xmm[d];
                *x = (*x & !(0xffffu128 << (16 * k))) | (v as u128) << (16 * k);
                Ok(())
            }
            M::Pshufd | M::Pshuflw | M::Pshufhw => {
                let d = self.xmm_op(i, 0)?;
                let s = self.simd_src(mem, i, 1)?;
                let imm = i.immediate8() as u32;
                let sel = |k: u32| (imm >> (2 * k)) & 3;
                let r = match m {
                    M::Pshufd => {
                        (0..4).fold(0u128, |r, k| r | (lane(s, 32, sel(k)) as u128) << (32 * k))
                    }
                    M::Pshuflw => (0..4).fold(s & !(u64::MAX as u128), |r, k| {
                        r | (lane(s, 16, sel(k)) as u128) << (16 * k)
                    }),
                    _ => (0..4).fold(s & u64::MAX as u128, |r, k| {
                        r | (lane(s, 16, 4 + sel(k)) as u128) << (16 * (k + 4))
                    }),
                };
                self.state.fpu.xmm[d] = r;
                Ok(())
            }
            M::Shufps | M::Shufpd => {
                let d = self.xmm_op(i, 0)?;
                let b = self.simd_src(mem, i, 1)?;
                let a = self.state.fpu.xmm[d];
                let imm = i.immediate8() as u32;
                self.state.fpu.xmm[d] = if m == M::Shufps {
                    let sel = |k: u32| (imm >> (2 * k)) & 3;
                    (lane(a, 32, sel(0)) as u128)
                        | (lane(a, 32, sel(1)) as u128) << 32
                        | (lane(b, 32, sel(2)) as u128) << 64
                        | (lane(b, 32, sel(3)) as u128) << 96
                } else {
                    (lane(a, 64, imm & 1) as u128) | (lane(b, 64, (imm >> 1) & 1) as u128) << 64
                };
                Ok(())
            }
            M::Pslldq | M::Psrldq => {
                let d = self.xmm_op(i, 0)?;
                let bytes = i.immediate8() as u32;
                let x = self.state.fpu.xmm[d];
                self.state.fpu.xmm[d] = match (bytes, m) {
                    (16.., _) => 0,
                    (n, M::Pslldq) => x << (8 * n),
                    (n, _) => x >> (8 * n),
                };
                Ok(())
            }
            M::Comiss | M::Comisd | M::Ucomiss | M::Ucomisd => {
                let a = self.state.fpu.xmm[self.xmm_op(i, 0)?];
                let b = self.simd_src(mem, i, 1)?;
                let (fl, flags) = hostfp::xmm_comi(m, a, b, self.host_csr()).ok_or_else(ud)?;
                self.simd_fp_exceptions(flags)?;
                self.state.rflags = (self.state.rflags & !rflags::ARITH) | fl;
                Ok(())
            }
            M::Cmpss | M::Cmpsd | M::Cmpps | M::Cmppd => {
                let d = self.xmm_op(i, 0)?;
                let b = self.simd_src(mem, i, 1)?;
                let a = self.state.fpu.xmm[d];
                let pred = i.immediate8();
                // Legacy encodings use predicate bits 2:0 only.
                let (r, flags) = hostfp::xmm_cmp(m, pred, a, b, self.host_csr()).ok_or_else(ud)?;
                self.simd_fp_exceptions(flags)?;
                self.state.fpu.xmm[d] = r;
                Ok(())
            }
            M::Cvtsi2ss | M::Cvtsi2sd => {
                let d = self.xmm_op(i, 0)?;
                let wide = Self::op_size(i, 1) == Size::B8;
                let src = self.simd_src(mem, i, 1)? as u64;
                let a = self.state.fpu.xmm[d];
                let (r, flags) =
                    hostfp::int_to_xmm(m, a, src, wide, self.host_csr()).ok_or_else(ud)?;
                self.simd_fp_exceptions(flags)?;
                self.state.fpu.xmm[d] = r;
                Ok(())
            }
            M::Cvtss2si | M::Cvttss2si | M::Cvtsd2si | M::Cvttsd2si => {
                let wide = i.op0_register().is_gpr64();
                let b = self.simd_src(mem, i, 1)?;
                let (r, flags) = hostfp::xmm_to_int(m, b, wide, self.host_csr()).ok_or_else(ud)?;
                self.simd_fp_exceptions(flags)?;
                self.set_reg(i.op0_register(), r);
                Ok(())
            }
            _ => Err(ud()),
        }
    }

    /// MOVLPS/MOVLPD/MOVHPS/MOVHPD (one 64-bit half to or from memory)
    /// and MOVHLPS/MOVLHPS (between registers).
    fn exec_half_move(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        const LOW: u128 = u64::MAX as u128;
        let m = i.mnemonic();
        let high = matches!(m, M::Movhps | M::Movhpd);
        if i.op0_kind() == OpKind::Memory {
            let s = self.state.fpu.xmm[self.xmm_op(i, 1)?];
            let v = if high { s >> 64 } else { s & LOW };
            return self.simd_dst(mem, i, 0, v);
        }
        let d = self.xmm_op(i, 0)?;
        let v = self.simd_src(mem, i, 1)?;
        let x = self.state.fpu.xmm[d];
        self.state.fpu.xmm[d] = match m {
            M::Movhlps => (x & !LOW) | (v >> 64),
            M::Movlhps => (x & LOW) | (v << 64),
            _ if high => (x & LOW) | ((v & LOW) << 64),
            _ => (x & !LOW) | (v & LOW),
        };
        Ok(())
    }

    /// FXSAVE/FXRSTOR (and their REX.W forms): the 512-byte image at a
    /// 16-byte-aligned address.
    fn exec_fxsave(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        let s = &self.state;
        if s.cr0 & (cr0::EM | cr0::TS) != 0 {
            return Err(Fault::exception(vector::NM));
        }
        let la = self.effective_address(i);
        if la & 15 != 0 {
            return Err(gp0());
        }
        let m = i.mnemonic();
        let wide = matches!(m, M::Fxsave64 | M::Fxrstor64);
        let user = self.state.cpl() == 3;
        if matches!(m, M::Fxsave | M::Fxsave64) {
            let image = self.state.fpu.fxsave_image(wide);
            // Every page of the image is checked before anything is stored.
            self.translate(mem, la, AccessKind::Write, user)?;
            self.translate(
                mem,
                la.wrapping_add(FXSAVE_SIZE as u64 - 1),
                AccessKind::Write,
                user,
            )?;
            // Bytes 416-463 are reserved and 464-511 left to software:
            // FXSAVE writes neither (as the host CPU, in difftest).
            for (k, chunk) in image[..FXSAVE_WRITTEN].chunks_exact(8).enumerate() {
                let mut b = [0u8; 8];
                b.copy_from_slice(chunk);
                self.write_mem(
                    mem,
                    la.wrapping_add(8 * k as u64),
                    Size::B8,
                    u64::from_le_bytes(b),
                )?;
            }
            Ok(())
        } else {
            let mut image = [0u8; FXSAVE_SIZE];
            for (k, chunk) in image.chunks_exact_mut(8).enumerate() {
                let v = self.read_mem(mem, la.wrapping_add(8 * k as u64), Size::B8)?;
                chunk.copy_from_slice(&v.to_le_bytes());
            }
            self.state
                .fpu
                .fxrstor_image(&image, wide)
                .map_err(|_| gp0())
        }
    }
}

/// Whether a 16-byte memory operand of this instruction must be aligned
/// (all legacy SSE forms except the explicitly unaligned moves).
fn aligned_form(m: M) -> bool {
    !matches!(m, M::Movdqu | M::Movups | M::Movupd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_helpers() {
        let a = 0x8001_7fff_0000_ffffu128;
        assert_eq!(
            map_lanes(16, a, 0x0001_0001_0001_0001, lane_op(M::Paddsw).unwrap().1),
            0x8002_7fff_0001_0000
        );
        assert_eq!(unpack(8, 0x0201, 0x0403, false), 0x0402_0301);
        assert_eq!(unpack(64, 1 | 2 << 64, 3 | 4 << 64, true), 2 | 4 << 64);
        assert_eq!(
            pack(8, 0x0100_ff80_007f_fff0, 0, false) & 0xffff_ffff,
            0xff00_7f00
        );
        assert_eq!(
            pack(8, 0x0100_ff80_007f_fff0, 0, true) & 0xffff_ffff,
            0x7f80_7ff0
        );
        assert_eq!(shift_lanes(16, 0x8000, 20, false, true), 0xffff);
        assert_eq!(shift_lanes(16, 0x8000, 16, false, false), 0);
        assert!(has_denormal(1, 64, 1) && !has_denormal(1 << 52, 64, 1));
    }
}
