//! The XSAVE feature set with its two legacy state components, x87 (XCR0
//! bit 0) and SSE (bit 1): XGETBV, XSETBV, XSAVE, XSAVEOPT, XRSTOR and
//! their REX.W forms (Intel SDM Vol. 1 ch. 13; Vol. 2 for each
//! instruction), enabled by CR4.OSXSAVE and reported by CPUID leaf 0xD.
//!
//! The XSAVE area is the standard form: the 512-byte legacy region laid
//! out as FXSAVE's (x87 in bytes 0-23 and 32-159, SSE in 160-415 with
//! MXCSR and MXCSR_MASK at 24-31), then the 64-byte header whose first
//! quadword is XSTATE_BV. The processor tracks every component as in use
//! (XINUSE = all ones, which the SDM allows: the init optimization is
//! optional), so XSAVE sets XSTATE_BV[i] for each requested component i,
//! and XSAVEOPT, whose optimizations are optional too, saves as XSAVE.
//! Compaction (XSAVEC, XRSTOR's compacted form), XSAVES and XGETBV with
//! ECX = 1 are not offered.

use super::debug_regs::DR7_ENABLES;
use super::fpu_state::FXSAVE_SIZE;
use super::state::{cr0, cr4};
use super::{vector, Cpu, Fault};
use crate::addr::Hpa;
use crate::alu::Size;
use crate::memory::PhysMemory;
use crate::mmu::AccessKind;
use iced_x86::{Instruction, Mnemonic as M};

/// XCR0 bit 0: x87 state.
pub const XCR0_X87: u64 = 1;
/// XCR0 bit 1: SSE state (XMM registers and MXCSR).
pub const XCR0_SSE: u64 = 2;
/// The XCR0 bits this CPU supports (CPUID.(EAX=0DH,ECX=0):EDX:EAX).
pub const XCR0_SUPPORTED: u64 = XCR0_X87 | XCR0_SSE;
/// Size of an XSAVE area holding the supported components: the legacy
/// region and the header.
pub const XSAVE_AREA_SIZE: u32 = FXSAVE_SIZE as u32 + 64;

/// XCR0 after RESET: x87 only.
pub fn xcr0_at_reset() -> u64 {
    XCR0_X87
}

/// Whether `m` is one of the instructions of this module.
pub(super) fn is_xsave(m: M) -> bool {
    matches!(
        m,
        M::Xgetbv
            | M::Xsetbv
            | M::Xsave
            | M::Xsave64
            | M::Xsaveopt
            | M::Xsaveopt64
            | M::Xrstor
            | M::Xrstor64
    )
}

/// CPUID leaf 0xD, sub-leaf `subleaf`: [EAX, EBX, ECX, EDX].
pub fn cpuid_leaf_d(subleaf: u32) -> [u32; 4] {
    match subleaf {
        // Supported XCR0 bits; the area size for XCR0's components and
        // for all supported ones (both the legacy region and header).
        0 => [XCR0_SUPPORTED as u32, XSAVE_AREA_SIZE, XSAVE_AREA_SIZE, 0],
        // XSAVEOPT (bit 0); no XSAVEC, XGETBV(1) or XSAVES.
        1 => [1, 0, 0, 0],
        _ => [0; 4],
    }
}

/// The legacy-region bytes of a component: x87 (0) or SSE (1), MXCSR and
/// MXCSR_MASK apart (`MXCSR_BYTES`).
fn component_bytes(i: usize) -> [std::ops::Range<usize>; 2] {
    if i == 0 {
        [0..24, 32..160]
    } else {
        [160..416, 0..0]
    }
}

/// MXCSR and MXCSR_MASK in the legacy region.
const MXCSR_BYTES: std::ops::Range<usize> = 24..32;

/// The header's XSTATE_BV.
const XSTATE_BV: u64 = FXSAVE_SIZE as u64;

impl Cpu {
    /// XGETBV, XSETBV, XSAVE, XSAVEOPT, XRSTOR (and REX.W forms).
    pub(super) fn exec_xsave(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        if self.state.cr4 & cr4::OSXSAVE == 0 {
            return Err(Fault::exception(vector::UD));
        }
        let gp0 = || Fault::with_code(vector::GP, 0);
        // ECX[31:0] names the XCR (bits 63:32 are ignored); only XCR0.
        let xcr = self.state.gpr[1] as u32;
        let edx_eax = (self.state.gpr[2] << 32) | (self.state.gpr[0] & 0xffff_ffff);
        match i.mnemonic() {
            M::Xgetbv => {
                if xcr != 0 {
                    return Err(gp0());
                }
                self.state.gpr[0] = self.state.xcr0 & 0xffff_ffff;
                self.state.gpr[2] = self.state.xcr0 >> 32;
                Ok(())
            }
            M::Xsetbv => {
                // x87 is always enabled; nothing unsupported.
                if self.state.cpl() != 0
                    || xcr != 0
                    || edx_eax & XCR0_X87 == 0
                    || edx_eax & !XCR0_SUPPORTED != 0
                {
                    return Err(gp0());
                }
                self.cycles += self.costs.serializing;
                self.state.xcr0 = edx_eax;
                Ok(())
            }
            m => {
                if self.state.cr0 & cr0::TS != 0 {
                    return Err(Fault::exception(vector::NM));
                }
                let la = self.effective_address(i);
                if la & 63 != 0 {
                    return Err(gp0());
                }
                let rfbm = edx_eax & self.state.xcr0;
                let wide = matches!(m, M::Xsave64 | M::Xsaveopt64 | M::Xrstor64);
                if matches!(m, M::Xrstor | M::Xrstor64) {
                    self.xrstor(mem, la, rfbm, wide)
                } else {
                    self.xsave(mem, la, rfbm, wide)
                }
            }
        }
    }

    /// XSAVE (and XSAVEOPT) of the components in `rfbm` to the area at
    /// `la`: every page is checked for writing before anything is stored.
    fn xsave(&mut self, mem: &PhysMemory, la: u64, rfbm: u64, wide: bool) -> Result<(), Fault> {
        let user = self.state.cpl() == 3;
        for end in [0, u64::from(XSAVE_AREA_SIZE) - 1] {
            self.translate(mem, la.wrapping_add(end), AccessKind::Write, user)?;
        }
        let image = self.state.fpu.fxsave_image(wide);
        // The requested components' bytes, then MXCSR with SSE (no list
        // built: an allocation per XSAVE).
        for c in 0..2 {
            if rfbm >> c & 1 != 0 {
                for r in component_bytes(c) {
                    self.write_bytes_linear(mem, la.wrapping_add(r.start as u64), &image[r])?;
                }
            }
        }
        if rfbm & XCR0_SSE != 0 {
            let r = MXCSR_BYTES;
            self.write_bytes_linear(mem, la.wrapping_add(r.start as u64), &image[r])?;
        }
        // XSTATE_BV: the requested components are in use; others keep
        // what the area held.
        let bv_la = la.wrapping_add(XSTATE_BV);
        let bv = self.read_mem(mem, bv_la, Size::B8)?;
        self.write_mem(mem, bv_la, Size::B8, bv | rfbm)
    }

    /// XRSTOR (standard form) of the components in `rfbm` from `la`.
    fn xrstor(&mut self, mem: &PhysMemory, la: u64, rfbm: u64, wide: bool) -> Result<(), Fault> {
        let gp0 = || Fault::with_code(vector::GP, 0);
        let bv = self.read_mem(mem, la.wrapping_add(XSTATE_BV), Size::B8)?;
        let comp_bv = self.read_mem(mem, la.wrapping_add(XSTATE_BV + 8), Size::B8)?;
        let reserved = self.read_mem(mem, la.wrapping_add(XSTATE_BV + 16), Size::B8)?;
        // No compacted form; header bytes 8-23 must be zero; XSTATE_BV
        // only within XCR0.
        if comp_bv != 0 || reserved != 0 || bv & !self.state.xcr0 != 0 {
            return Err(gp0());
        }
        let mut image = self.state.fpu.fxsave_image(wide);
        for c in 0..2 {
            if rfbm >> c & 1 == 0 {
                continue;
            }
            for r in component_bytes(c) {
                if bv >> c & 1 != 0 {
                    self.read_bytes_linear(mem, la.wrapping_add(r.start as u64), &mut image[r])?;
                }
            }
        }
        // The standard form loads MXCSR whenever SSE is requested,
        // whatever XSTATE_BV says (SDM Vol. 1 13.8.1).
        if rfbm & XCR0_SSE != 0 {
            self.read_bytes_linear(
                mem,
                la.wrapping_add(MXCSR_BYTES.start as u64),
                &mut image[MXCSR_BYTES],
            )?;
        }
        // Components requested but not in XSTATE_BV: their initial
        // configuration (x87 as after FNINIT, XMM registers zero).
        for c in 0..2 {
            if rfbm >> c & 1 != 0 && bv >> c & 1 == 0 {
                for r in component_bytes(c) {
                    image[r].fill(0);
                }
                if c == 0 {
                    image[..2].copy_from_slice(&0x037f_u16.to_le_bytes());
                }
            }
        }
        let mut fpu = self.state.fpu;
        fpu.fxrstor_image(&image, wide).map_err(|_| gp0())?;
        if rfbm & XCR0_X87 != 0 && bv & XCR0_X87 == 0 {
            // FNINIT's FCS/FDS (the image's 64-bit form does not hold them).
            fpu.fcs = 0;
            fpu.fds = 0;
        }
        self.state.fpu = fpu;
        Ok(())
    }
    /// Byte-wise data accesses ([`Self::write_mem`] and [`Self::read_mem`]
    /// of one byte each, from `la` up) take the page's translation once:
    /// after the first byte's translation, which has all its effects, the
    /// page's later bytes hit the first-level TLB, which has none (a fill
    /// always follows a translation with no MMIO emulation). So each run
    /// of bytes within a page is one translation and one copy. Each byte
    /// goes its own way where its access does more: under MMIO emulation,
    /// while DR7 enables breakpoints (each access is checked), into a
    /// frame holding decoded code (each store bumps its generation), or
    /// outside RAM (the failing byte ends the access).
    fn bytewise(&self) -> bool {
        self.mmio_emu.is_some() || self.state.debug.dr7 & DR7_ENABLES != 0
    }

    /// `bytes` stored from `la` up, as one [`Self::write_mem`] of a byte
    /// each (see [`Self::bytewise`]).
    fn write_bytes_linear(&mut self, mem: &PhysMemory, la: u64, bytes: &[u8]) -> Result<(), Fault> {
        let bytewise = self.bytewise();
        let user = self.user_access();
        let mut k = 0;
        while k < bytes.len() {
            let at = la.wrapping_add(k as u64);
            let run = page_run(at, bytes.len() - k);
            let (first, rest) = bytes[k..k + run].split_at(1);
            if bytewise {
                self.write_mem(mem, at, Size::B1, u64::from(first[0]))?;
            } else {
                let hpa = self.translate(mem, at, AccessKind::Write, user)?;
                if mem.check(hpa, run as u64).is_ok() && !mem.is_code(hpa) {
                    mem.write_bytes(hpa, &bytes[k..k + run])?;
                    k += run;
                    continue;
                }
                self.store(mem, hpa, Size::B1, u64::from(first[0]))?;
            }
            for (j, b) in rest.iter().enumerate() {
                self.write_mem(mem, at.wrapping_add(1 + j as u64), Size::B1, u64::from(*b))?;
            }
            k += run;
        }
        Ok(())
    }

    /// `buf` loaded from `la` up, as one [`Self::read_mem`] of a byte each
    /// (see [`Self::bytewise`]).
    fn read_bytes_linear(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        buf: &mut [u8],
    ) -> Result<(), Fault> {
        let bytewise = self.bytewise();
        let user = self.user_access();
        let mut k = 0;
        while k < buf.len() {
            let at = la.wrapping_add(k as u64);
            let run = page_run(at, buf.len() - k);
            let (first, rest) = buf[k..k + run].split_at_mut(1);
            if bytewise {
                first[0] = self.read_mem(mem, at, Size::B1)? as u8;
            } else {
                let hpa = self.translate(mem, at, AccessKind::Read, user)?;
                if mem.check(hpa, run as u64).is_ok() {
                    load_words(mem, hpa, &mut buf[k..k + run])?;
                    k += run;
                    continue;
                }
                first[0] = self.phys_read(mem, hpa, 1)? as u8;
            }
            for (j, b) in rest.iter_mut().enumerate() {
                *b = self.read_mem(mem, at.wrapping_add(1 + j as u64), Size::B1)? as u8;
            }
            k += run;
        }
        Ok(())
    }
}

/// `buf` copied from `hpa` (in memory): `PhysMemory::read_bytes`, a
/// quadword at a time when the range is quadword-aligned (the XSAVE
/// area's ranges are) rather than a byte at a time. (The same for stores
/// through `PhysMemory::write`, which checks and notes code per call,
/// was slower than `PhysMemory::write_bytes`.)
fn load_words(mem: &PhysMemory, hpa: Hpa, buf: &mut [u8]) -> Result<(), Fault> {
    if hpa.0 % 8 != 0 || buf.len() % 8 != 0 {
        return Ok(mem.read_bytes(hpa, buf)?);
    }
    let mut at = hpa.0;
    for w in buf.chunks_exact_mut(8) {
        w.copy_from_slice(&mem.read(Hpa(at), 8)?.to_le_bytes());
        at += 8;
    }
    Ok(())
}

/// How many of `len` bytes from `la` up lie in `la`'s page.
fn page_run(la: u64, len: usize) -> usize {
    len.min((0x1000 - (la & 0xfff)) as usize)
}
