//! x87 and SSE register state, and its FXSAVE image.
//!
//! The state lives in [`FpuState`] inside [`super::CpuState`]; the
//! instructions that use it are in `sse` (and x87 arithmetic, where
//! implemented, in `hostfp`). The FXSAVE layout follows SDM Vol. 1,
//! 10.5.1 (Table 10-2 for the 64-bit-pointer form, 10-1 for the 32-bit
//! one).

/// MXCSR bits.
pub mod mxcsr {
    /// The six exception flags (IE DE ZE OE UE PE).
    pub const FLAGS: u32 = 0x3f;
    pub const IE: u32 = 1 << 0;
    pub const DE: u32 = 1 << 1;
    pub const ZE: u32 = 1 << 2;
    pub const OE: u32 = 1 << 3;
    pub const UE: u32 = 1 << 4;
    pub const PE: u32 = 1 << 5;
    pub const DAZ: u32 = 1 << 6;
    /// The six exception masks (bits 7-12), in flag order.
    pub const MASKS: u32 = 0x3f << 7;
    pub const MASK_SHIFT: u32 = 7;
    pub const FTZ: u32 = 1 << 15;
    /// The power-on value: all exceptions masked, round to nearest.
    pub const DEFAULT: u32 = 0x1f80;
    /// Writable bits (reported as MXCSR_MASK in the FXSAVE image): with
    /// DAZ, as on every SSE2 processor since the Pentium 4.
    pub const WRITABLE: u32 = 0xffff;
}

/// The x87 control word after FNINIT: all exceptions masked, 64-bit
/// precision, round to nearest.
pub const FCW_DEFAULT: u16 = 0x037f;

/// Size of an FXSAVE image.
pub const FXSAVE_SIZE: usize = 512;

/// The bytes of the image FXSAVE writes: x87, MXCSR and the XMM registers
/// (416-463 are reserved, 464-511 left to software).
pub const FXSAVE_WRITTEN: usize = 416;

/// Size of an FNSTENV image and of an FNSAVE image (32-bit formats), and
/// of the 16-bit environment (an operand-size prefix).
pub const ENV_SIZE: usize = 28;
pub const FSAVE_SIZE: usize = 108;
pub const ENV16_SIZE: usize = 14;

/// The tag of a non-empty x87 register: 0 valid, 1 zero, 2 special (NaN,
/// infinity, denormal, or an unsupported encoding without the integer bit).
pub fn x87_tag(r: u128) -> u16 {
    let exp = (r >> 64) as u16 & 0x7fff;
    let sig = r as u64;
    match exp {
        0x7fff => 2,
        0 if sig == 0 => 1,
        0 => 2,
        _ if sig >> 63 == 0 => 2,
        _ => 0,
    }
}

/// x87, MMX-less SSE state: what FXSAVE saves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct FpuState {
    /// XMM0-XMM15.
    pub xmm: [u128; 16],
    pub mxcsr: u32,
    /// x87 control word.
    pub fcw: u16,
    /// x87 status word (TOP in bits 11-13).
    pub fsw: u16,
    /// Abridged tag word: bit i set when physical register R`i` is not
    /// empty (the FXSAVE form).
    pub ftw: u8,
    /// Physical registers R0-R7, 80 bits each in the low bytes.
    pub st: [u128; 8],
    /// Last x87 opcode (11 bits).
    pub fop: u16,
    /// Last x87 instruction pointer and data pointer (64-bit form).
    pub fip: u64,
    pub fdp: u64,
    /// Code and data selectors of the 32-bit pointer form.
    pub fcs: u16,
    pub fds: u16,
}

impl Default for FpuState {
    /// The state after FNINIT with MXCSR at its power-on value (what a
    /// 64-bit boot protocol hands over, as Firecracker sets it).
    fn default() -> Self {
        FpuState {
            xmm: [0; 16],
            mxcsr: mxcsr::DEFAULT,
            fcw: FCW_DEFAULT,
            fsw: 0,
            ftw: 0,
            st: [0; 8],
            fop: 0,
            fip: 0,
            fdp: 0,
            fcs: 0,
            fds: 0,
        }
    }
}

/// Why an FXRSTOR image is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FxrstorError {
    /// The MXCSR field has bits outside MXCSR_MASK set (#GP(0)).
    #[error("MXCSR {0:#x} sets reserved bits")]
    ReservedMxcsr(u32),
}

impl FpuState {
    /// FNINIT: the x87 part to its initial state (MXCSR and XMM stay).
    pub fn x87_init(&mut self) {
        self.fcw = FCW_DEFAULT;
        self.fsw = 0;
        self.ftw = 0;
        self.fop = 0;
        self.fip = 0;
        self.fdp = 0;
        self.fcs = 0;
        self.fds = 0;
    }

    /// The FXSAVE image. `wide` is the REX.W form (64-bit FIP/FDP);
    /// otherwise FIP/FDP are 32 bits followed by their selectors.
    pub fn fxsave_image(&self, wide: bool) -> [u8; FXSAVE_SIZE] {
        let mut m = [0u8; FXSAVE_SIZE];
        m[0..2].copy_from_slice(&self.fcw.to_le_bytes());
        m[2..4].copy_from_slice(&self.fsw.to_le_bytes());
        m[4] = self.ftw;
        m[6..8].copy_from_slice(&self.fop.to_le_bytes());
        if wide {
            m[8..16].copy_from_slice(&self.fip.to_le_bytes());
            m[16..24].copy_from_slice(&self.fdp.to_le_bytes());
        } else {
            m[8..12].copy_from_slice(&(self.fip as u32).to_le_bytes());
            m[12..14].copy_from_slice(&self.fcs.to_le_bytes());
            m[16..20].copy_from_slice(&(self.fdp as u32).to_le_bytes());
            m[20..22].copy_from_slice(&self.fds.to_le_bytes());
        }
        m[24..28].copy_from_slice(&self.mxcsr.to_le_bytes());
        m[28..32].copy_from_slice(&mxcsr::WRITABLE.to_le_bytes());
        // ST(i)/MM(i) slots hold the registers in stack order.
        let top = self.top();
        for i in 0..8 {
            let phys = (top + i) & 7;
            let off = 32 + 16 * i;
            m[off..off + 10].copy_from_slice(&self.st[phys].to_le_bytes()[..10]);
        }
        for (i, x) in self.xmm.iter().enumerate() {
            let off = 160 + 16 * i;
            m[off..off + 16].copy_from_slice(&x.to_le_bytes());
        }
        m
    }

    /// Loads an FXSAVE image (FXRSTOR), checking MXCSR first so that a
    /// refused image changes nothing.
    pub fn fxrstor_image(&mut self, m: &[u8; FXSAVE_SIZE], wide: bool) -> Result<(), FxrstorError> {
        let u16_at = |o: usize| u16::from_le_bytes([m[o], m[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes([m[o], m[o + 1], m[o + 2], m[o + 3]]);
        let u64_at = |o: usize| (u32_at(o) as u64) | ((u32_at(o + 4) as u64) << 32);
        let new_mxcsr = u32_at(24);
        if new_mxcsr & !mxcsr::WRITABLE != 0 {
            return Err(FxrstorError::ReservedMxcsr(new_mxcsr));
        }
        self.mxcsr = new_mxcsr;
        // As FLDENV: the control word's reserved bits fixed, the status
        // word's ES and B derived (the host CPU's FXRSTOR, in difftest).
        self.set_fcw(u16_at(0));
        self.set_fsw(u16_at(2));
        self.ftw = m[4];
        self.fop = u16_at(6) & 0x7ff;
        if wide {
            self.fip = u64_at(8);
            self.fdp = u64_at(16);
        } else {
            self.fip = u32_at(8) as u64;
            self.fcs = u16_at(12);
            self.fdp = u32_at(16) as u64;
            self.fds = u16_at(20);
        }
        let top = self.top();
        for i in 0..8 {
            let off = 32 + 16 * i;
            let mut b = [0u8; 16];
            b[..10].copy_from_slice(&m[off..off + 10]);
            self.st[(top + i) & 7] = u128::from_le_bytes(b);
        }
        for (i, x) in self.xmm.iter_mut().enumerate() {
            let off = 160 + 16 * i;
            let mut b = [0u8; 16];
            b.copy_from_slice(&m[off..off + 16]);
            *x = u128::from_le_bytes(b);
        }
        Ok(())
    }

    /// The full x87 tag word (two bits per physical register: 00 valid,
    /// 01 zero, 10 special, 11 empty) derived from the abridged one and the
    /// register contents, as FNSAVE reports it.
    pub fn full_tag_word(&self) -> u16 {
        (0..8).fold(0u16, |w, r| {
            let tag = if self.ftw & (1 << r) == 0 {
                3
            } else {
                x87_tag(self.st[r])
            };
            w | (tag << (2 * r))
        })
    }

    /// The FNSAVE image (32-bit protected-mode format, used in 64-bit
    /// mode; SDM Vol. 1, Figure 8-9): the FNSTENV environment in the first
    /// 28 bytes, then ST(0)-ST(7) in stack order. Reserved halves read as
    /// ones, as the hardware stores them.
    pub fn fsave_image(&self) -> [u8; FSAVE_SIZE] {
        let mut m = [0xffu8; FSAVE_SIZE];
        m[0..2].copy_from_slice(&self.fcw.to_le_bytes());
        m[4..6].copy_from_slice(&self.fsw.to_le_bytes());
        m[8..10].copy_from_slice(&self.full_tag_word().to_le_bytes());
        m[12..16].copy_from_slice(&(self.fip as u32).to_le_bytes());
        m[16..18].copy_from_slice(&self.fcs.to_le_bytes());
        m[18..20].copy_from_slice(&(self.fop & 0x7ff).to_le_bytes());
        m[20..24].copy_from_slice(&(self.fdp as u32).to_le_bytes());
        m[24..26].copy_from_slice(&self.fds.to_le_bytes());
        let top = self.top();
        for i in 0..8 {
            let off = ENV_SIZE + 10 * i;
            m[off..off + 10].copy_from_slice(&self.st[(top + i) & 7].to_le_bytes()[..10]);
        }
        m
    }

    /// Loads the environment part of an FNSAVE image (FLDENV), as the
    /// hardware does: the tag word keeps only empty or not, the control
    /// word's reserved bits read back fixed (bit 6 one, 7 and 13-15
    /// zero), and the status word's ES and B bits are recomputed.
    pub fn load_env_image(&mut self, m: &[u8]) {
        let u16_at = |o: usize| u16::from_le_bytes([m[o], m[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes([m[o], m[o + 1], m[o + 2], m[o + 3]]);
        self.set_fcw(u16_at(0));
        self.set_fsw(u16_at(4));
        self.set_full_tag_word(u16_at(8));
        self.fip = u32_at(12) as u64;
        self.fcs = u16_at(16);
        self.fop = u16_at(18) & 0x7ff;
        self.fdp = u32_at(20) as u64;
        self.fds = u16_at(24);
    }

    /// Loads a 16-bit environment (FLDENV with an operand-size prefix; the
    /// protected-mode format: 16-bit pointers, no opcode).
    pub fn load_env16_image(&mut self, m: &[u8]) {
        let u16_at = |o: usize| u16::from_le_bytes([m[o], m[o + 1]]);
        self.set_fcw(u16_at(0));
        self.set_fsw(u16_at(2));
        self.set_full_tag_word(u16_at(4));
        self.fip = u16_at(6) as u64;
        self.fcs = u16_at(8);
        self.fdp = u16_at(10) as u64;
        self.fds = u16_at(12);
    }

    /// The 16-bit environment (FNSTENV with an operand-size prefix).
    pub fn env16_image(&self) -> [u8; ENV16_SIZE] {
        let mut m = [0u8; ENV16_SIZE];
        let words = [
            self.fcw,
            self.fsw,
            self.full_tag_word(),
            self.fip as u16,
            self.fcs,
            self.fdp as u16,
            self.fds,
        ];
        for (k, w) in words.iter().enumerate() {
            m[2 * k..2 * k + 2].copy_from_slice(&w.to_le_bytes());
        }
        m
    }

    fn set_fcw(&mut self, v: u16) {
        self.fcw = (v & 0x1f3f) | 0x40;
    }

    /// The error summary (and busy, its copy) is derived: set when an
    /// exception flag is set whose mask is clear. Call after `set_fcw`.
    fn set_fsw(&mut self, v: u16) {
        let summary = if v & !self.fcw & 0x3f != 0 { 0x8080 } else { 0 };
        self.fsw = (v & 0x7f7f) | summary;
    }

    fn set_full_tag_word(&mut self, tags: u16) {
        self.ftw = (0..8).fold(0u8, |t, r| t | (u8::from((tags >> (2 * r)) & 3 != 3) << r));
    }

    /// The registers of an FNSAVE image (stack order, under the current
    /// TOP), after an environment of `env_size` bytes.
    pub fn load_fsave_registers(&mut self, m: &[u8], env_size: usize) {
        let top = self.top();
        for i in 0..8 {
            let off = env_size + 10 * i;
            let mut b = [0u8; 16];
            b[..10].copy_from_slice(&m[off..off + 10]);
            self.st[(top + i) & 7] = u128::from_le_bytes(b);
        }
    }

    /// The x87 stack top (FSW bits 11-13).
    pub fn top(&self) -> usize {
        ((self.fsw >> 11) & 7) as usize
    }

    /// Mixes the state into a digest.
    pub fn digest_into(&self, h: &mut super::state::Fnv) {
        for x in self.xmm {
            h.bytes(&x.to_le_bytes());
        }
        for r in self.st {
            h.bytes(&r.to_le_bytes());
        }
        h.u64(self.mxcsr as u64);
        h.u64(((self.fcw as u64) << 32) | ((self.fsw as u64) << 16) | self.ftw as u64);
        h.u64(self.fop as u64);
        h.u64(self.fip);
        h.u64(self.fdp);
        h.u64(((self.fcs as u64) << 16) | self.fds as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fxrstor_fixes_the_control_word_and_derives_the_error_summary() {
        let mut img = FpuState::default().fxsave_image(true);
        // Reserved FCW bits 13-15 set, bit 6 clear; DE and ZE unmasked
        // and pending in FSW, whose ES and B bits are clear.
        img[0..2].copy_from_slice(&0xf938u16.to_le_bytes());
        img[2..4].copy_from_slice(&0x581eu16.to_le_bytes());
        let mut s = FpuState::default();
        s.fxrstor_image(&img, true).unwrap();
        assert_eq!(s.fcw, 0x1978);
        assert_eq!(s.fsw, 0xd89e);
    }

    #[test]
    fn fxsave_image_round_trips_and_has_the_sdm_layout() {
        let mut s = FpuState::default();
        s.xmm[3] = 0x0011_2233_4455_6677_8899_aabb_ccdd_eeff;
        s.mxcsr = 0x1fa0;
        s.fsw = 5 << 11;
        s.ftw = 0x80;
        s.st[5] = 0x3fff_8000_0000_0000_0000; // 1.0 in R5 = ST(0)
        s.fip = 0x1234_5678_9abc;
        let img = s.fxsave_image(true);
        assert_eq!(&img[0..2], &[0x7f, 0x03]);
        assert_eq!(img[4], 0x80);
        assert_eq!(&img[24..28], &0x1fa0u32.to_le_bytes());
        assert_eq!(&img[28..32], &0xffffu32.to_le_bytes());
        assert_eq!(&img[32..42], &s.st[5].to_le_bytes()[..10]);
        assert_eq!(&img[160 + 48..160 + 64], &s.xmm[3].to_le_bytes());
        assert_eq!(&img[8..16], &0x1234_5678_9abcu64.to_le_bytes());
        let mut t = FpuState::default();
        t.fxrstor_image(&img, true).unwrap();
        assert_eq!(t, s);
        // The 32-bit form truncates FIP and stores the selector after it.
        let narrow = s.fxsave_image(false);
        assert_eq!(&narrow[8..12], &0x5678_9abcu32.to_le_bytes());
        let mut bad = img;
        bad[26] = 1; // MXCSR bit 16
        assert_eq!(
            t.fxrstor_image(&bad, true),
            Err(FxrstorError::ReservedMxcsr(0x11fa0))
        );
        assert_eq!(t, s, "a refused image changes nothing");
    }
}
