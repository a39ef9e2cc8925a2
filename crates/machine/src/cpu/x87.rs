//! The x87 FPU: every x87 instruction of 64-bit mode.
//!
//! Arithmetic, loads, stores, compares and stack operations run on the
//! host's x87 unit (`hostx87`), on the guest's state loaded as an FNSAVE
//! image, so 80-bit results, precision and rounding control, the tag word,
//! TOP, C0-C3 and stack faults are exact. The control instructions that
//! only move state (FNINIT, FNCLEX, FNSTSW, FNSTCW, FNSTENV, FLDENV, FNSAVE,
//! FRSTOR, FWAIT) are done here.
//!
//! Checks in the SDM's order: #NM when CR0.EM or CR0.TS is set (FWAIT:
//! when CR0.TS and CR0.MP are); then a waiting instruction with an
//! unmasked exception pending raises #MF before it does anything (the
//! delayed delivery of x87 exceptions; with CR0.NE clear as well, since
//! the FERR# pin is not modelled); then memory faults. An unmasked
//! exception raised by an instruction sets FSW.ES (the host does it) and
//! is delivered by the next waiting instruction.

use super::fpu_state::{ENV16_SIZE, ENV_SIZE, FSAVE_SIZE};
use super::state::{cr0, rflags};
use super::{hostx87, vector, Cpu, Fault};
use crate::alu::Size;
use crate::memory::PhysMemory;
use crate::mmu::AccessKind;
use iced_x86::{CpuidFeature, Encoder, Instruction, MemorySize, Mnemonic as M, OpKind, Register};

use super::exec::ud;

/// FSW bits: the six exception flags, stack fault, error summary, busy.
mod fsw {
    pub const EXCEPTIONS: u16 = 0x3f;
    pub const ES: u16 = 1 << 7;
    /// What FNCLEX clears: the exception flags, SF, ES and B.
    pub const CLEARED_BY_FNCLEX: u16 = 0x80ff;
}

/// Whether `exec` hands this mnemonic to [`Cpu::exec_x87`].
pub(super) fn is_x87(m: M) -> bool {
    let in_range = (M::F2xm1 as u16..=M::Fyl2xp1 as u16).contains(&(m as u16));
    (in_range
        && !matches!(
            m,
            M::Femms | M::Fxsave | M::Fxsave64 | M::Fxrstor | M::Fxrstor64
        ))
        || m == M::Wait
}

/// The non-waiting control instructions: they never raise #MF.
fn is_non_waiting(m: M) -> bool {
    matches!(
        m,
        M::Fninit | M::Fnclex | M::Fnstsw | M::Fnstcw | M::Fnstenv | M::Fnsave
    )
}

/// Control instructions leave the last-instruction pointers alone.
fn is_control(m: M) -> bool {
    matches!(
        m,
        M::Fninit
            | M::Finit
            | M::Fnclex
            | M::Fclex
            | M::Fnstsw
            | M::Fstsw
            | M::Fnstcw
            | M::Fstcw
            | M::Fldcw
            | M::Fnstenv
            | M::Fstenv
            | M::Fldenv
            | M::Fnsave
            | M::Fsave
            | M::Frstor
            | M::Wait
    )
}

/// Memory forms that store their result.
fn is_store(m: M) -> bool {
    matches!(
        m,
        M::Fst | M::Fstp | M::Fist | M::Fistp | M::Fisttp | M::Fbstp
    )
}

/// The CPUID features x87 instructions may need here: FWAIT is the
/// 8086's, FNSTSW AX the 287's, FLDENV/FRSTOR the 387's, FCMOVcc and FCOMI
/// CMOV's, FISTTP SSE3's. (Not FPU287XL_ONLY and the like: FSETPM and the
/// other 287-only forms are #UD on every 64-bit processor.)
fn feature_implemented(f: &CpuidFeature) -> bool {
    matches!(
        f,
        CpuidFeature::INTEL8086
            | CpuidFeature::FPU
            | CpuidFeature::FPU287
            | CpuidFeature::FPU387
            | CpuidFeature::CMOV
            | CpuidFeature::SSE3
    )
}

/// The escape opcode (D8-DF) and ModRM byte of an x87 instruction, from
/// its encoding.
fn escape_and_modrm(i: &Instruction) -> Option<(u8, u8)> {
    let mut encoder = Encoder::new(64);
    encoder.encode(i, i.ip()).ok()?;
    let bytes = encoder.take_buffer();
    let at = bytes.iter().position(|b| (0xd8..=0xdf).contains(b))?;
    Some((bytes[at], *bytes.get(at + 1)?))
}

impl Cpu {
    /// Executes an x87 instruction ([`is_x87`]).
    pub(super) fn exec_x87(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        let m = i.mnemonic();
        if !i.cpuid_features().iter().all(feature_implemented) {
            return Err(ud());
        }
        let cr0 = self.state.cr0;
        let no_fpu = if m == M::Wait {
            cr0 & cr0::TS != 0 && cr0 & cr0::MP != 0
        } else {
            cr0 & (cr0::EM | cr0::TS) != 0
        };
        if no_fpu {
            return Err(Fault::exception(vector::NM));
        }
        if !is_non_waiting(m) && self.x87_exception_pending() {
            return Err(Fault::exception(vector::MF));
        }
        match m {
            M::Wait => Ok(()),
            M::Fninit | M::Finit => {
                self.state.fpu.x87_init();
                Ok(())
            }
            M::Fnclex | M::Fclex => {
                self.state.fpu.fsw &= !fsw::CLEARED_BY_FNCLEX;
                Ok(())
            }
            M::Fnstsw | M::Fstsw if i.op0_kind() == OpKind::Register => {
                let v = self.state.fpu.fsw as u64;
                self.set_reg(Register::AX, v);
                Ok(())
            }
            M::Fnstsw | M::Fstsw | M::Fnstcw | M::Fstcw => {
                let v = if matches!(m, M::Fnstcw | M::Fstcw) {
                    self.state.fpu.fcw
                } else {
                    self.state.fpu.fsw
                };
                let la = self.effective_address(i);
                self.write_mem(mem, la, Size::B2, v as u64)
            }
            M::Fnstenv | M::Fstenv | M::Fnsave | M::Fsave => self.x87_save_env(mem, i),
            M::Fldenv | M::Frstor => self.x87_load_env(mem, i),
            _ => self.x87_on_host(mem, i),
        }
    }

    /// An unmasked exception waits for delivery: FSW.ES, or a flag whose
    /// mask is clear (after FLDENV, FRSTOR or FXRSTOR loaded one).
    pub(super) fn x87_exception_pending(&self) -> bool {
        let f = &self.state.fpu;
        f.fsw & fsw::ES != 0 || f.fsw & !f.fcw & fsw::EXCEPTIONS != 0
    }

    /// The environment size of FNSTENV/FLDENV/FNSAVE/FRSTOR (28 bytes, or
    /// 14 with an operand-size prefix) and whether the registers follow.
    fn x87_image_layout(i: &Instruction) -> Result<(usize, bool), Fault> {
        match i.memory_size() {
            MemorySize::FpuEnv28 => Ok((ENV_SIZE, false)),
            MemorySize::FpuState108 => Ok((ENV_SIZE, true)),
            MemorySize::FpuEnv14 => Ok((ENV16_SIZE, false)),
            MemorySize::FpuState94 => Ok((ENV16_SIZE, true)),
            _ => Err(ud()),
        }
    }

    /// FNSTENV (then all exceptions masked) and FNSAVE (then FNINIT).
    fn x87_save_env(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        let (env, registers) = Self::x87_image_layout(i)?;
        let la = self.effective_address(i);
        let mut image = self.state.fpu.fsave_image();
        if env == ENV16_SIZE {
            // The same registers after the shorter environment.
            image.copy_within(ENV_SIZE.., ENV16_SIZE);
            image[..ENV16_SIZE].copy_from_slice(&self.state.fpu.env16_image());
        }
        let size = if registers { env + 80 } else { env };
        self.write_bytes(mem, la, &image[..size])?;
        let f = &mut self.state.fpu;
        if registers {
            f.x87_init();
        } else {
            f.fcw |= fsw::EXCEPTIONS;
        }
        Ok(())
    }

    /// FLDENV and FRSTOR.
    fn x87_load_env(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        let (env, registers) = Self::x87_image_layout(i)?;
        let la = self.effective_address(i);
        let mut image = [0u8; FSAVE_SIZE];
        let size = if registers { env + 80 } else { env };
        self.read_bytes(mem, la, &mut image[..size])?;
        let f = &mut self.state.fpu;
        if env == ENV16_SIZE {
            f.load_env16_image(&image);
        } else {
            f.load_env_image(&image);
        }
        if registers {
            f.load_fsave_registers(&image, env);
        }
        Ok(())
    }

    /// Runs an arithmetic, load, store, compare or stack instruction on the
    /// host's x87 unit.
    fn x87_on_host(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        if !cfg!(target_arch = "x86_64") {
            return Err(ud());
        }
        let m = i.mnemonic();
        let (esc, modrm) = escape_and_modrm(i).ok_or_else(ud)?;
        let mut operand = [0u8; 16];
        let memory = (0..i.op_count()).any(|n| i.op_kind(n) == OpKind::Memory);
        let (entry, la, bytes) = if memory {
            let bytes = i.memory_size().size();
            if bytes > 10 {
                return Err(ud());
            }
            let la = self.effective_address(i);
            if !is_store(m) {
                self.read_bytes(mem, la, &mut operand[..bytes])?;
            }
            (hostx87::memory_form(esc, modrm >> 3), la, bytes)
        } else {
            (hostx87::register_form(esc, modrm), 0, 0)
        };
        let mut image = self.state.fpu.fsave_image();
        let flags_in = self.state.rflags as u8;
        let flags_out = hostx87::run(entry, &mut image, &mut operand, flags_in);
        let mut next = self.state.fpu;
        next.load_env_image(&image);
        next.load_fsave_registers(&image, ENV_SIZE);
        // The pointers are the guest's, not the host's.
        let old = &self.state.fpu;
        (next.fip, next.fcs, next.fop, next.fdp, next.fds) =
            (old.fip, old.fcs, old.fop, old.fdp, old.fds);
        if memory && is_store(m) {
            // An unmasked invalid, denormal, divide, overflow or underflow
            // exception suppresses the store; precision does not. Nothing
            // was pending before, so the unmasked flags now are new.
            let unmasked = next.fsw & !next.fcw & fsw::EXCEPTIONS;
            if unmasked & 0x1f == 0 {
                self.write_bytes(mem, la, &operand[..bytes])?;
            }
        }
        if !is_control(m) {
            next.fip = i.ip();
            next.fop = (((esc & 7) as u16) << 8) | modrm as u16;
            if memory {
                next.fdp = la;
            }
        }
        self.state.fpu = next;
        if matches!(m, M::Fcomi | M::Fcomip | M::Fucomi | M::Fucomip) {
            let set = (flags_out as u64) & (rflags::ZF | rflags::PF | rflags::CF);
            self.state.rflags = (self.state.rflags & !rflags::ARITH) | set;
        }
        Ok(())
    }

    /// Reads `out.len()` bytes at `la`; every byte's page is checked before
    /// the caller changes any state.
    fn read_bytes(&mut self, mem: &PhysMemory, la: u64, out: &mut [u8]) -> Result<(), Fault> {
        for (k, b) in out.iter_mut().enumerate() {
            *b = self.read_mem(mem, la.wrapping_add(k as u64), Size::B1)? as u8;
        }
        Ok(())
    }

    /// Writes `bytes` at `la`, all or nothing: the first and last byte's
    /// pages (the only ones, for at most 108 bytes) are checked first.
    fn write_bytes(&mut self, mem: &PhysMemory, la: u64, bytes: &[u8]) -> Result<(), Fault> {
        let user = self.state.cpl() == 3;
        self.translate(mem, la, AccessKind::Write, user)?;
        self.translate(
            mem,
            la.wrapping_add(bytes.len() as u64 - 1),
            AccessKind::Write,
            user,
        )?;
        for (k, b) in bytes.iter().enumerate() {
            self.write_mem(mem, la.wrapping_add(k as u64), Size::B1, *b as u64)?;
        }
        Ok(())
    }
}
