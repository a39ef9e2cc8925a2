//! System instructions: control registers, MSRs, descriptor tables,
//! segment loads, SYSCALL/SYSRET, IRETQ, far return, I/O, CPUID, HLT, ...
//!
//! Each one first applies the architectural checks (CPL, reserved bits),
//! then, in guest mode, the VM-execution controls decide whether it exits;
//! otherwise it executes natively on the CPU's own state.

use super::access::gpr_info;
use super::state::{
    arch_capabilities, cr0, cr4, efer, interruptibility, msr, rflags, seg_attr, Activity, Segment,
};
use super::{vector, Cpu, Fault};
use crate::addr::is_canonical;
use crate::alu::Size;
use crate::apic::{self, ApicWrite};
use crate::memory::PhysMemory;
use crate::vmx::{CrAccess, IoDirection, MsrExiting, VmExit};
use iced_x86::{Instruction, Mnemonic as M, OpKind, Register};

#[inline]
fn gp(code: u32) -> Fault {
    Fault::with_code(vector::GP, code)
}

#[inline]
fn ud() -> Fault {
    Fault::exception(vector::UD)
}

/// Whether a PAT value has only valid memory types (0, 1, 4, 5, 6, 7).
fn valid_pat(v: u64) -> bool {
    v.to_le_bytes()
        .iter()
        .all(|&b| matches!(b, 0 | 1 | 4 | 5 | 6 | 7))
}

/// The machine's own CPUID answers (what bare-mode code sees; the
/// hypervisor builds its guests' CPUID on top of this).
pub fn native_cpuid(leaf: u32, subleaf: u32, apic_id: u32) -> [u32; 4] {
    // "GenuineIntel": the machine models an Intel core (undefined flags
    // and the like follow Intel).
    const VENDOR: [u32; 3] = [0x756e_6547, 0x4965_6e69, 0x6c65_746e];
    match leaf {
        0 => [0xd, VENDOR[0], VENDOR[2], VENDOR[1]],
        1 => {
            let eax = 0x0005_0654; // family 6, model 0x55, stepping 4
            let ebx = (apic_id << 24) | (1 << 16) | (8 << 8);
            // PCID, x2APIC, POPCNT, TSC-deadline, XSAVE. (OSXSAVE, bit
            // 27, follows CR4: `with_osxsave`.)
            let ecx = (1 << 17) | (1 << 21) | (1 << 23) | (1 << 24) | (1 << 26);
            // FPU, TSC, MSR, PAE, MCE, CX8, APIC, MCA, PGE, CMOV, PAT,
            // CLFSH, FXSR, SSE, SSE2. (No MMX.)
            let edx = 1
                | (1 << 4)
                | (1 << 5)
                | (1 << 6)
                | (1 << 7)
                | (1 << 8)
                | (1 << 9)
                | (1 << 13)
                | (1 << 14)
                | (1 << 15)
                | (1 << 16)
                | (1 << 19)
                | (1 << 24)
                | (1 << 25)
                | (1 << 26);
            [eax, ebx, ecx, edx]
        }
        // SMEP, INVPCID, SMAP; UMIP (ECX bit 2: SGDT, SIDT, SLDT, STR and
        // SMSW #GP above ring 0 under CR4.UMIP); IA32_ARCH_CAPABILITIES
        // (EDX bit 29: `state::arch_capabilities`).
        7 if subleaf == 0 => [0, (1 << 7) | (1 << 10) | (1 << 20), 1 << 2, 1 << 29],
        0xb => [
            0,
            1,
            (subleaf & 0xff) | if subleaf == 0 { 1 << 8 } else { 0 },
            apic_id,
        ],
        0xd => super::xsave::cpuid_leaf_d(subleaf),
        0x8000_0000 => [0x8000_0008, 0, 0, 0],
        // LAHF/SAHF, LZCNT; SYSCALL, NX, 1 GiB pages, RDTSCP, long mode.
        0x8000_0001 => [
            0,
            0,
            1 | (1 << 5),
            (1 << 11) | (1 << 20) | (1 << 26) | (1 << 27) | (1 << 29),
        ],
        0x8000_0008 => [crate::mmu::paging::MAX_PHYS_ADDR_BITS | (48 << 8), 0, 0, 0],
        _ => [0; 4],
    }
}

/// CPUID result `r` of `leaf` with CPUID.1:ECX.OSXSAVE (bit 27) set as
/// CR4.OSXSAVE is (`cr4`).
pub fn with_osxsave(leaf: u32, mut r: [u32; 4], cr4: u64) -> [u32; 4] {
    if leaf == 1 && cr4 & cr4::OSXSAVE != 0 {
        r[2] |= 1 << 27;
    }
    r
}

impl Cpu {
    /// Whether system instruction `m` must move the mode epoch (before it
    /// runs): whether it may change the first-level TLB's lookup-key
    /// context (`Cpu::key_context`: CR0, CR4, EFER, RFLAGS.AC under
    /// CR4.SMAP, the VPID, the EPTP, the PCID). SWAPGS and RDTSC/RDTSCP change none
    /// of it (nor does a VM exit they take: the hypervisor's changes move
    /// the epoch themselves). SYSCALL and SYSRET change the privilege
    /// (the first-level TLB keeps a class per privilege), CS, SS and
    /// RFLAGS, of which the context holds only AC, and only while SMAP is
    /// on. IRET moves it itself, after its checks, when it changes
    /// RFLAGS.AC (`exec_iret`), which spares the first stack read and
    /// the sync after most IRETs a resync. Every other system instruction
    /// moves it.
    #[inline(always)]
    pub(super) fn system_moves_mode(&self, m: M) -> bool {
        match m {
            M::Swapgs | M::Rdtsc | M::Rdtscp | M::Iret | M::Iretd | M::Iretq => false,
            M::Syscall | M::Sysretq => self.state.cr4 & cr4::SMAP != 0,
            _ => true,
        }
    }

    /// System instructions and anything `exec` does not know (#UD).
    pub(super) fn exec_system(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        // System instructions may change what translations depend on.
        if self.system_moves_mode(i.mnemonic()) {
            self.mode_epoch += 1;
        }
        let cpl = self.state.cpl();
        match i.mnemonic() {
            M::Hlt => {
                self.require_cpl0()?;
                if self.vmx.as_ref().is_some_and(|v| v.hlt_exiting) {
                    return Err(Fault::exit(VmExit::Hlt));
                }
                self.state.activity = Activity::Halted;
                self.check_events = true;
                Ok(())
            }
            M::Cli | M::Sti => {
                if cpl > self.iopl() {
                    return Err(gp(0));
                }
                if i.mnemonic() == M::Cli {
                    self.state.rflags &= !rflags::IF;
                } else {
                    if self.state.rflags & rflags::IF == 0 {
                        self.state.interruptibility |= interruptibility::STI;
                    }
                    self.state.rflags |= rflags::IF;
                    self.check_events = true;
                }
                Ok(())
            }
            M::In | M::Out => self.exec_io(mem, i),
            M::Insb | M::Insw | M::Insd | M::Outsb | M::Outsw | M::Outsd => {
                self.exec_string_io(mem, i)
            }
            M::Cpuid => {
                self.cycles += self.costs.serializing;
                if self.vmx.is_some() {
                    return Err(Fault::exit(VmExit::Cpuid));
                }
                let leaf = self.state.gpr[0] as u32;
                let r = native_cpuid(leaf, self.state.gpr[1] as u32, self.apic.id());
                let r = with_osxsave(leaf, r, self.state.cr4);
                for (reg, v) in [0usize, 3, 1, 2].into_iter().zip(r) {
                    self.state.gpr[reg] = v as u64;
                }
                Ok(())
            }
            M::Rdmsr => {
                self.require_cpl0()?;
                let index = self.state.gpr[1] as u32;
                if self.msr_exits(index, false) {
                    return Err(Fault::exit(VmExit::MsrRead { index }));
                }
                let v = self.read_msr(index)?;
                self.state.gpr[0] = v & 0xffff_ffff;
                self.state.gpr[2] = v >> 32;
                Ok(())
            }
            M::Wrmsr => {
                self.require_cpl0()?;
                self.cycles += self.costs.serializing;
                let index = self.state.gpr[1] as u32;
                let value = (self.state.gpr[0] & 0xffff_ffff) | (self.state.gpr[2] << 32);
                if self.msr_exits(index, true) {
                    return Err(Fault::exit(VmExit::MsrWrite { index, value }));
                }
                self.write_msr(index, value)
            }
            M::Rdtsc | M::Rdtscp => self.exec_rdtsc(i.mnemonic() == M::Rdtscp),
            M::Invlpg => {
                self.require_cpl0()?;
                self.cycles += self.costs.serializing;
                let la = self.effective_address(i);
                if self.vmx.as_ref().is_some_and(|v| v.invlpg_exiting) {
                    return Err(Fault::exit(VmExit::Invlpg {
                        gva: crate::Gva(la),
                    }));
                }
                let vpid = self.vpid();
                self.tlb.invlpg(vpid, crate::Gva(la));
                Ok(())
            }
            M::Invpcid => self.exec_invpcid(mem, i),
            M::Lgdt | M::Lidt => {
                self.require_cpl0()?;
                let (offset, seg) = (self.operand_offset(i), i.memory_segment());
                let limit = self.read_mem(mem, self.linear(seg, offset), Size::B2)? as u16;
                let base_la = self.linear(seg, offset.wrapping_add(2));
                let base = if self.state.in_64bit_mode() {
                    self.read_mem(mem, base_la, Size::B8)?
                } else {
                    // Outside 64-bit mode the base is 32 bits (24 with a
                    // 16-bit operand size).
                    let base = self.read_mem(mem, base_la, Size::B4)?;
                    if i.code() == iced_x86::Code::Lgdt_m1632_16
                        || i.code() == iced_x86::Code::Lidt_m1632_16
                    {
                        base & 0xff_ffff
                    } else {
                        base
                    }
                };
                if !is_canonical(base) {
                    return Err(gp(0));
                }
                let t = super::state::DescriptorTable { base, limit };
                if i.mnemonic() == M::Lgdt {
                    self.state.gdtr = t;
                } else {
                    self.state.idtr = t;
                }
                Ok(())
            }
            M::Sgdt | M::Sidt => {
                if self.state.cr4 & cr4::UMIP != 0 && cpl > 0 {
                    return Err(gp(0));
                }
                let t = if i.mnemonic() == M::Sgdt {
                    self.state.gdtr
                } else {
                    self.state.idtr
                };
                let (offset, seg) = (self.operand_offset(i), i.memory_segment());
                let la = self.linear(seg, offset);
                let base_la = self.linear(seg, offset.wrapping_add(2));
                let base_size = if self.state.in_64bit_mode() {
                    Size::B8
                } else {
                    Size::B4
                };
                // Check both parts before writing either.
                self.read_mem(mem, la, Size::B2)?;
                self.read_mem(mem, base_la, base_size)?;
                self.write_mem(mem, la, Size::B2, t.limit as u64)?;
                self.write_mem(mem, base_la, base_size, t.base)
            }
            M::Ltr => {
                self.require_cpl0()?;
                let sel = self.read_op(mem, i, 0, Size::B2)? as u16;
                self.load_task_register(mem, sel)
            }
            M::Str | M::Sldt => {
                if self.state.cr4 & cr4::UMIP != 0 && cpl > 0 {
                    return Err(gp(0));
                }
                let sel = if i.mnemonic() == M::Str {
                    self.state.tr.selector
                } else {
                    self.state.ldtr.selector
                };
                let size = if i.op0_kind() == OpKind::Memory {
                    Size::B2
                } else {
                    Self::op_size(i, 0)
                };
                self.write_op(mem, i, 0, size, sel as u64)
            }
            M::Lldt => {
                self.require_cpl0()?;
                let sel = self.read_op(mem, i, 0, Size::B2)? as u16;
                self.load_ldt_register(mem, sel)
            }
            // SMSW (SDM Vol. 2B): CR0 as MOV from CR0 reads it (the
            // hypervisor's read shadow applied), 16 bits to memory, the
            // operand size to a register; #GP(0) under CR4.UMIP above
            // ring 0.
            M::Smsw => {
                if self.state.cr4 & cr4::UMIP != 0 && cpl > 0 {
                    return Err(gp(0));
                }
                let cr0 = self.guest_visible_cr0();
                let size = if i.op0_kind() == OpKind::Memory {
                    Size::B2
                } else {
                    Self::op_size(i, 0)
                };
                self.write_op(mem, i, 0, size, cr0)
            }
            // LMSW (SDM Vol. 2A): CR0 bits 3:0 (PE, MP, EM, TS) from the
            // 16-bit source; PE can be set but not cleared. As a MOV to
            // CR0 of the value that makes (so the hypervisor's guest/host
            // mask applies, and a CR access exit carries the value).
            M::Lmsw => {
                self.require_cpl0()?;
                let source = self.read_op(mem, i, 0, Size::B2)?;
                let visible = self.guest_visible_cr0();
                let value = (visible & !0xf) | (source & 0xf) | (visible & cr0::PE);
                self.mov_to_cr(0, 0, value)
            }
            // RDPMC: the machine has no performance-monitoring counters
            // (CPUID leaf 0xA reports none), so every counter index is
            // invalid: #GP(0), as for CPL > 0 without CR4.PCE.
            M::Rdpmc => Err(gp(0)),
            M::Sysret => self.exec_sysret32(),
            // SMAP's instructions (SDM Vol. 2B): #UD outside ring 0 (and
            // in real mode: the machine has SMAP, so never for lack of it).
            M::Stac | M::Clac => {
                if cpl != 0 || self.real_mode() {
                    return Err(ud());
                }
                if i.mnemonic() == M::Stac {
                    self.state.rflags |= rflags::AC;
                } else {
                    self.state.rflags &= !rflags::AC;
                }
                Ok(())
            }
            M::Verr | M::Verw => self.exec_verify_segment(mem, i),
            M::Lsl | M::Lar => self.exec_load_limit_or_rights(mem, i),
            M::Swapgs => self.exec_swapgs(),
            M::Syscall => self.exec_syscall(i),
            M::Sysretq => self.exec_sysret(),
            M::Iret | M::Iretd | M::Iretq => self.exec_iret(mem, i),
            M::Retf => self.exec_retf(mem, i),
            M::Les | M::Lds | M::Lss | M::Lfs | M::Lgs => self.exec_load_far_pointer(mem, i),
            M::Vmcall => {
                if self.vmx.is_some() {
                    Err(Fault::exit(VmExit::Vmcall))
                } else {
                    Err(ud())
                }
            }
            M::Wbinvd | M::Invd => self.require_cpl0(),
            M::Clts => {
                self.require_cpl0()?;
                if let Some(v) = self.vmx.as_deref() {
                    if v.cr0_guest_host_mask & cr0::TS != 0 && v.cr0_read_shadow & cr0::TS != 0 {
                        let value = self.guest_visible_cr0() & !cr0::TS;
                        return Err(Fault::exit(VmExit::CrAccess(CrAccess::MovTo {
                            cr: 0,
                            gpr: 0,
                            value,
                        })));
                    }
                }
                self.state.cr0 &= !cr0::TS;
                Ok(())
            }
            _ => Err(ud()),
        }
    }

    fn require_cpl0(&self) -> Result<(), Fault> {
        if self.state.cpl() == 0 {
            Ok(())
        } else {
            Err(gp(0))
        }
    }

    pub(super) fn iopl(&self) -> u8 {
        ((self.state.rflags & rflags::IOPL) >> 12) as u8
    }

    /// CR0 as the guest reads it (host-owned bits come from the shadow).
    fn guest_visible_cr0(&self) -> u64 {
        match self.vmx.as_deref() {
            Some(v) => {
                (self.state.cr0 & !v.cr0_guest_host_mask)
                    | (v.cr0_read_shadow & v.cr0_guest_host_mask)
            }
            None => self.state.cr0,
        }
    }

    fn guest_visible_cr4(&self) -> u64 {
        match self.vmx.as_deref() {
            Some(v) => {
                (self.state.cr4 & !v.cr4_guest_host_mask)
                    | (v.cr4_read_shadow & v.cr4_guest_host_mask)
            }
            None => self.state.cr4,
        }
    }

    /// MOV to/from control, debug and segment registers.
    pub(super) fn exec_mov_system(
        &mut self,
        mem: &PhysMemory,
        i: &Instruction,
    ) -> Result<(), Fault> {
        let to = i.op0_kind() == OpKind::Register
            && (i.op0_register().is_cr()
                || i.op0_register().is_segment_register()
                || i.op0_register().is_dr());
        let sys = if to {
            i.op0_register()
        } else {
            i.op1_register()
        };
        // Of what these move, the lookup-key context (`Cpu::key_context`)
        // holds CR0 and CR4, and CR3's PCID while CR4.PCIDE is on (without
        // it a CR3 load's flush empties the first-level TLB through the
        // TLB's removals); not CR2, CR8, the debug and the segment
        // registers.
        if to
            && (matches!(sys, Register::CR0 | Register::CR4)
                || (sys == Register::CR3 && self.state.cr4 & cr4::PCIDE != 0))
        {
            self.mode_epoch += 1;
        }
        if sys.is_dr() {
            let gpr = if to {
                i.op1_register()
            } else {
                i.op0_register()
            };
            return self.exec_mov_dr(sys, gpr, to);
        }
        if sys.is_segment_register() {
            if to {
                if sys == Register::CS {
                    return Err(ud());
                }
                let sel = self.read_op(mem, i, 1, Size::B2)? as u16;
                return self.load_segment_register(mem, sys, sel);
            }
            let sel = self.segment(sys).selector as u64;
            let size = if i.op0_kind() == OpKind::Memory {
                Size::B2
            } else {
                Self::op_size(i, 0)
            };
            return self.write_op(mem, i, 0, size, sel);
        }
        // Control registers.
        self.require_cpl0()?;
        self.cycles += self.costs.serializing;
        let cr = sys.number() as u8;
        let gpr_reg = if to {
            i.op1_register()
        } else {
            i.op0_register()
        };
        let gpr = gpr_info(gpr_reg).0;
        if to {
            let value = self.state.gpr[gpr as usize];
            self.mov_to_cr(cr, gpr, value)
        } else {
            let v = self.mov_from_cr(cr, gpr)?;
            self.state.gpr[gpr as usize] = v;
            Ok(())
        }
    }

    fn mov_to_cr(&mut self, cr: u8, gpr: u8, value: u64) -> Result<(), Fault> {
        // Made only when taken (a fault is boxed: no allocation per move).
        let exit = || Fault::exit(VmExit::CrAccess(CrAccess::MovTo { cr, gpr, value }));
        let vpid = self.vpid();
        match cr {
            0 => {
                let mut new = value;
                if let Some(v) = self.vmx.as_deref() {
                    if (value ^ v.cr0_read_shadow) & v.cr0_guest_host_mask != 0 {
                        return Err(exit());
                    }
                    new =
                        (value & !v.cr0_guest_host_mask) | (self.state.cr0 & v.cr0_guest_host_mask);
                }
                if new >> 32 != 0 {
                    return Err(gp(0));
                }
                let new = (new & cr0::DEFINED) | cr0::ET;
                if new & cr0::NW != 0 && new & cr0::CD == 0 {
                    return Err(gp(0));
                }
                // Checked on the guest's own view: a hypervisor that owns
                // PG (shadow paging) keeps the real bit set while the
                // guest's paging is off, even in real mode.
                if value & cr0::PG != 0 && value & cr0::PE == 0 {
                    return Err(gp(0));
                }
                let old = self.state.cr0;
                let paging_on = new & cr0::PG != 0 && old & cr0::PG == 0;
                let paging_off = new & cr0::PG == 0 && old & cr0::PG != 0;
                if paging_on {
                    // Only IA-32e paging is modelled: enabling paging
                    // needs EFER.LME and CR4.PAE (then IA-32e mode
                    // becomes active); 32-bit and PAE paging are #GP(0).
                    if self.state.efer & efer::LME == 0 || self.state.cr4 & cr4::PAE == 0 {
                        return Err(gp(0));
                    }
                    self.state.efer |= efer::LMA;
                }
                if paging_off {
                    // Leaving IA-32e mode is allowed from compatibility
                    // mode only, and not with CR4.PCIDE set.
                    if self.state.in_64bit_mode() || self.state.cr4 & cr4::PCIDE != 0 {
                        return Err(gp(0));
                    }
                    self.state.efer &= !efer::LMA;
                }
                if (old ^ new) & (cr0::PG | cr0::WP | cr0::PE) != 0 {
                    self.tlb.flush_vpid(vpid);
                }
                self.state.cr0 = new;
                Ok(())
            }
            2 => {
                self.state.cr2 = value;
                Ok(())
            }
            3 => {
                if let Some(v) = self.vmx.as_deref() {
                    if v.cr3_load_exiting
                        && !v
                            .cr3_targets
                            .iter()
                            .take(v.cr3_target_count)
                            .any(|&t| t == value)
                    {
                        return Err(exit());
                    }
                }
                // With CR4.PCIDE, bits 11:0 are the PCID and bit 63 asks
                // to keep the PCID's translations (it is not stored); the
                // TLB is tagged by PCID, so a load flushes (without bit
                // 63) only the new PCID's non-global translations (SDM
                // Vol. 3A 4.10.4.1). Without PCIDE, all non-global ones.
                let pcide = self.state.cr4 & cr4::PCIDE != 0;
                let keep = pcide && value >> 63 != 0;
                let value = if pcide { value & !(1 << 63) } else { value };
                if value >> crate::mmu::paging::MAX_PHYS_ADDR_BITS != 0 {
                    return Err(gp(0));
                }
                self.state.cr3 = value;
                if !pcide {
                    self.tlb.flush_non_global(vpid);
                } else if !keep {
                    self.tlb.flush_pcid(vpid, value & 0xfff);
                }
                Ok(())
            }
            4 => {
                let mut new = value;
                if let Some(v) = self.vmx.as_deref() {
                    if (value ^ v.cr4_read_shadow) & v.cr4_guest_host_mask != 0 {
                        return Err(exit());
                    }
                    new =
                        (value & !v.cr4_guest_host_mask) | (self.state.cr4 & v.cr4_guest_host_mask);
                }
                let host_owned = self.vmx.as_deref().map_or(0, |v| v.cr4_guest_host_mask);
                let ia32e = self.state.efer & efer::LMA != 0;
                // PCIDE may be set only in IA-32e mode with CR3[11:0] = 0.
                let pcide_on = new & !self.state.cr4 & cr4::PCIDE != 0;
                if new & !(cr4::SUPPORTED | (host_owned & cr4::VMXE)) != 0
                    || (ia32e && new & cr4::PAE == 0)
                    || (pcide_on && (!ia32e || self.state.cr3 & 0xfff != 0))
                {
                    return Err(gp(0));
                }
                let old = self.state.cr4;
                self.state.cr4 = new;
                if (old ^ new) & cr4::TLB_FLUSHING != 0 {
                    self.tlb.flush_vpid(vpid);
                }
                Ok(())
            }
            8 => {
                if self.vmx.as_ref().is_some_and(|v| v.cr8_exiting) {
                    return Err(exit());
                }
                if value >> 4 != 0 {
                    return Err(gp(0));
                }
                self.apic.set_cr8(value);
                self.check_events = true;
                Ok(())
            }
            _ => Err(ud()),
        }
    }

    /// INVPCID (SDM Vol. 2A): the type in the register operand, a 16-byte
    /// descriptor (PCID in bits 11:0, then a linear address) in memory.
    /// Type 0 invalidates one address (every PCID's), 1 the non-global
    /// translations of the PCID, 3 those of every PCID, 2 everything:
    /// each removes at least what it must. #UD in a guest without the "enable
    /// INVPCID" control; #GP(0) above ring 0, for a type above 3, reserved
    /// descriptor bits, a non-canonical type-0 address, or a non-zero
    /// PCID for types 0 and 1 while CR4.PCIDE is clear.
    fn exec_invpcid(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        if self.vmx.as_ref().is_some_and(|v| !v.enable_invpcid) {
            return Err(ud());
        }
        self.require_cpl0()?;
        self.cycles += self.costs.serializing;
        let kind = self.reg(i.op0_register());
        let la = self.effective_address(i);
        let pcid_word = self.read_mem(mem, la, Size::B8)?;
        let address = self.read_mem(mem, la.wrapping_add(8), Size::B8)?;
        let pcid = pcid_word & 0xfff;
        let pcide = self.state.cr4 & cr4::PCIDE != 0;
        if kind > 3
            || pcid_word >> 12 != 0
            || (kind == 0 && !is_canonical(address))
            || (kind <= 1 && !pcide && pcid != 0)
        {
            return Err(gp(0));
        }
        let vpid = self.vpid();
        match kind {
            0 => self.tlb.invlpg(vpid, crate::Gva(address)),
            1 => self.tlb.flush_pcid(vpid, pcid),
            2 => self.tlb.flush_vpid(vpid),
            _ => self.tlb.flush_non_global(vpid),
        }
        Ok(())
    }

    fn mov_from_cr(&mut self, cr: u8, gpr: u8) -> Result<u64, Fault> {
        match cr {
            0 => Ok(self.guest_visible_cr0()),
            2 => Ok(self.state.cr2),
            3 => {
                if self.vmx.as_ref().is_some_and(|v| v.cr3_store_exiting) {
                    return Err(Fault::exit(VmExit::CrAccess(CrAccess::MovFrom { cr, gpr })));
                }
                Ok(self.state.cr3)
            }
            4 => Ok(self.guest_visible_cr4()),
            8 => {
                if self.vmx.as_ref().is_some_and(|v| v.cr8_exiting) {
                    return Err(Fault::exit(VmExit::CrAccess(CrAccess::MovFrom { cr, gpr })));
                }
                Ok(self.apic.cr8())
            }
            _ => Err(ud()),
        }
    }

    /// The descriptor `selector` names in the GDT, or with TI = 1 in the
    /// LDT, for the instructions that test a selector without loading it
    /// (VERR, VERW, LAR, LSL): `None` for a null selector, an LDT selector
    /// with no LDT loaded, or one beyond its table's limit, which those
    /// instructions report with ZF = 0 rather than a fault.
    fn probe_descriptor(&mut self, mem: &PhysMemory, selector: u16) -> Result<Option<u64>, Fault> {
        let index = u64::from(selector & !7);
        let (base, limit) = if selector & 4 != 0 {
            let ldtr = self.state.ldtr;
            if ldtr.attr & seg_attr::UNUSABLE != 0 {
                return Ok(None);
            }
            (ldtr.base, u64::from(ldtr.limit))
        } else if selector & !3 == 0 {
            return Ok(None);
        } else {
            (self.state.gdtr.base, u64::from(self.state.gdtr.limit))
        };
        if index + 7 > limit {
            return Ok(None);
        }
        self.read_implicit(mem, base.wrapping_add(index), Size::B8)
            .map(Some)
    }

    /// Whether a descriptor's DPL admits the current CPL and `selector`'s
    /// RPL (DPL >= max(CPL, RPL)); conforming code segments skip the check.
    fn descriptor_visible(&self, d: u64, selector: u16) -> bool {
        let attr = ((d >> 40) & 0xff) as u32;
        let conforming_code = attr & seg_attr::S != 0 && attr & 0xc == 0xc;
        let dpl = ((attr >> 5) & 3) as u8;
        conforming_code || dpl >= self.state.cpl().max((selector & 3) as u8)
    }

    /// LSL and LAR (SDM Vol. 2A): for a selector whose descriptor the
    /// current privilege may see, ZF = 1 and the destination gets the
    /// segment limit (LSL: byte-granular, scaled by G) or the access
    /// rights (LAR: descriptor bytes 5 and 6 masked to 0x00f0ff00); any
    /// other selector is ZF = 0 and the destination unchanged. Code and
    /// data descriptors qualify; of system descriptors, in 64-bit mode the
    /// LDT and the available and busy 64-bit TSS, elsewhere also the
    /// 16-bit TSSs and (LAR only) call and task gates. Linux's vDSO runs
    /// LSL on a per-CPU GDT entry for `getcpu` when RDPID is absent.
    fn exec_load_limit_or_rights(
        &mut self,
        mem: &PhysMemory,
        i: &Instruction,
    ) -> Result<(), Fault> {
        if self.real_mode() {
            return Err(ud());
        }
        let selector = self.read_op(mem, i, 1, Size::B2)? as u16;
        let lsl = i.mnemonic() == M::Lsl;
        let result = match self.probe_descriptor(mem, selector)? {
            Some(d) if self.descriptor_visible(d, selector) => {
                let attr = ((d >> 40) & 0xff) as u32;
                let system_type = attr & 0xf;
                let long = self.state.in_64bit_mode();
                let qualifies = attr & seg_attr::S != 0
                    || match system_type {
                        0x2 | 0x9 | 0xb => true,
                        0x1 | 0x3 => !long,
                        0x4 | 0x5 | 0xc => !lsl && !long,
                        _ => false,
                    };
                qualifies.then(|| {
                    if lsl {
                        let raw = (d & 0xffff) | ((d >> 32) & 0xf_0000);
                        if d & (1 << 55) != 0 {
                            (raw << 12) | 0xfff
                        } else {
                            raw
                        }
                    } else {
                        (d >> 32) & 0x00f0_ff00
                    }
                })
            }
            _ => None,
        };
        match result {
            Some(v) => {
                self.state.rflags |= rflags::ZF;
                let size = Self::op_size(i, 0);
                // A 64-bit destination gets the 32-bit value zero-extended.
                self.write_op(mem, i, 0, size, v & size.mask())
            }
            None => {
                self.state.rflags &= !rflags::ZF;
                Ok(())
            }
        }
    }

    /// VERR / VERW (SDM Vol. 2B): ZF says whether the segment `selector`
    /// names is readable (VERR) or writable (VERW) at the current CPL:
    /// a code or data descriptor in the GDT (or LDT) within its limit, with
    /// DPL >= max(CPL, RPL) unless it is conforming code (VERR only).
    /// Nothing else changes; a null or out-of-range selector is ZF = 0, not
    /// a fault. (Linux runs VERW for its MDS buffer clearing.) #UD in real
    /// mode.
    fn exec_verify_segment(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        if self.real_mode() {
            return Err(ud());
        }
        let selector = self.read_op(mem, i, 0, Size::B2)? as u16;
        let ok = if let Some(d) = self.probe_descriptor(mem, selector)? {
            let attr = ((d >> 40) & 0xff) as u32;
            let code = attr & 0x8 != 0;
            let readable_or_writable = attr & 0x2 != 0;
            let visible = self.descriptor_visible(d, selector);
            if attr & seg_attr::S == 0 {
                false
            } else if i.mnemonic() == M::Verw {
                !code && readable_or_writable && visible
            } else {
                (!code || readable_or_writable) && visible
            }
        } else {
            false
        };
        if ok {
            self.state.rflags |= rflags::ZF;
        } else {
            self.state.rflags &= !rflags::ZF;
        }
        Ok(())
    }

    /// The segment register named by an iced register.
    pub(super) fn segment(&self, r: Register) -> &Segment {
        match r {
            Register::ES => &self.state.es,
            Register::CS => &self.state.cs,
            Register::SS => &self.state.ss,
            Register::FS => &self.state.fs,
            Register::GS => &self.state.gs,
            _ => &self.state.ds,
        }
    }

    /// Reads the descriptor for `selector` from the GDT, or the LDT when
    /// TI = 1. `ext` is the EXT bit of any resulting error code.
    pub(super) fn load_descriptor(
        &mut self,
        mem: &PhysMemory,
        selector: u16,
        ext: u32,
    ) -> Result<Segment, Fault> {
        let index = (selector & !7) as u64;
        // TI = 1: the LDT (which must be loaded).
        let table = if selector & 4 != 0 {
            let ldtr = self.state.ldtr;
            (
                ldtr.base,
                u64::from(ldtr.limit),
                ldtr.attr & seg_attr::UNUSABLE != 0,
            )
        } else {
            (
                self.state.gdtr.base,
                u64::from(self.state.gdtr.limit),
                false,
            )
        };
        if table.2 || index + 7 > table.1 {
            // (Made only here: a fault is an allocation.)
            return Err(gp((selector as u32 & !3) | ext));
        }
        let d = self.read_implicit(mem, table.0.wrapping_add(index), Size::B8)?;
        let attr = ((d >> 40) & 0xff) as u32 | ((((d >> 52) & 0xf) as u32) << 12);
        let mut limit = ((d & 0xffff) | ((d >> 32) & 0xf_0000)) as u32;
        if attr & seg_attr::GRANULARITY != 0 {
            limit = (limit << 12) | 0xfff;
        }
        let base = ((d >> 16) & 0xff_ffff) | ((d >> 56) << 24);
        Ok(Segment {
            selector,
            base,
            limit,
            attr,
        })
    }

    /// MOV/POP to SS, DS, ES, FS or GS.
    pub(super) fn load_segment_register(
        &mut self,
        mem: &PhysMemory,
        r: Register,
        sel: u16,
    ) -> Result<(), Fault> {
        if self.real_mode() {
            let seg = Self::real_mode_segment(self.segment(r), sel);
            match r {
                Register::SS => {
                    self.state.ss = seg;
                    self.state.interruptibility |= interruptibility::MOV_SS;
                    self.check_events = true;
                }
                Register::DS => self.state.ds = seg,
                Register::ES => self.state.es = seg,
                Register::FS => self.state.fs = seg,
                Register::GS => self.state.gs = seg,
                _ => return Err(ud()),
            }
            return Ok(());
        }
        let cpl = self.state.cpl();
        let rpl = (sel & 3) as u8;
        let null = sel & !3 == 0;
        // (Made only when taken: a fault is an allocation.)
        let err = || gp((sel & !3) as u32);
        if r == Register::SS {
            let seg = if null {
                // 64-bit mode allows a null SS below ring 3 with RPL = CPL.
                if cpl == 3 || rpl != cpl || !self.state.in_64bit_mode() {
                    return Err(gp(0));
                }
                Segment {
                    selector: sel,
                    base: 0,
                    limit: 0,
                    attr: seg_attr::UNUSABLE | ((cpl as u32) << seg_attr::DPL_SHIFT),
                }
            } else {
                let d = self.load_descriptor(mem, sel, 0)?;
                let writable_data =
                    d.attr & seg_attr::S != 0 && d.attr & 0x8 == 0 && d.attr & 0x2 != 0;
                if rpl != cpl || d.dpl() != cpl || !writable_data {
                    return Err(err());
                }
                if d.attr & seg_attr::PRESENT == 0 {
                    return Err(Fault::with_code(vector::SS, (sel & !3) as u32));
                }
                d
            };
            self.state.ss = seg;
            self.state.interruptibility |= interruptibility::MOV_SS;
            self.check_events = true;
            return Ok(());
        }
        let old_base = self.segment(r).base;
        let seg = if null {
            Segment {
                selector: sel,
                // Intel keeps the FS/GS base when a null selector is loaded.
                base: if matches!(r, Register::FS | Register::GS) {
                    old_base
                } else {
                    0
                },
                limit: 0,
                attr: seg_attr::UNUSABLE,
            }
        } else {
            let d = self.load_descriptor(mem, sel, 0)?;
            let code = d.attr & 0x8 != 0;
            let readable = !code || d.attr & 0x2 != 0;
            let conforming_code = code && d.attr & 0x4 != 0;
            if d.attr & seg_attr::S == 0 || !readable {
                return Err(err());
            }
            if !conforming_code && (d.dpl() < cpl || d.dpl() < rpl) {
                return Err(err());
            }
            if d.attr & seg_attr::PRESENT == 0 {
                return Err(Fault::with_code(vector::NP, (sel & !3) as u32));
            }
            d
        };
        match r {
            Register::DS => self.state.ds = seg,
            Register::ES => self.state.es = seg,
            Register::FS => self.state.fs = seg,
            Register::GS => self.state.gs = seg,
            _ => return Err(ud()),
        }
        Ok(())
    }

    fn load_task_register(&mut self, mem: &PhysMemory, sel: u16) -> Result<(), Fault> {
        if sel & !3 == 0 {
            return Err(gp(0));
        }
        let d = self.load_descriptor(mem, sel, 0)?;
        let index = (sel & !7) as u64;
        if index + 15 > self.state.gdtr.limit as u64 {
            return Err(gp((sel & !3) as u32));
        }
        // A 64-bit available TSS (system descriptor type 9).
        if d.attr & seg_attr::S != 0 || d.attr & seg_attr::TYPE_MASK != 0x9 {
            return Err(gp((sel & !3) as u32));
        }
        if d.attr & seg_attr::PRESENT == 0 {
            return Err(Fault::with_code(vector::NP, (sel & !3) as u32));
        }
        let desc_la = self.state.gdtr.base.wrapping_add(index);
        let high = self.read_implicit(mem, desc_la.wrapping_add(8), Size::B8)?;
        let base = (d.base & 0xffff_ffff) | ((high & 0xffff_ffff) << 32);
        if !is_canonical(base) {
            return Err(gp((sel & !3) as u32));
        }
        // Mark the descriptor busy (type 0xb).
        let low = self.read_implicit(mem, desc_la, Size::B8)?;
        self.write_implicit(mem, desc_la, Size::B8, low | (2 << 40))?;
        self.state.tr = Segment {
            selector: sel,
            base,
            limit: d.limit,
            attr: (d.attr & !seg_attr::TYPE_MASK) | seg_attr::TYPE_TSS64_BUSY,
        };
        Ok(())
    }

    fn exec_io(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        let (port, size, direction, value) = if i.mnemonic() == M::In {
            let port = if i.op1_kind() == OpKind::Register {
                self.state.gpr[2] as u16
            } else {
                i.immediate8() as u16
            };
            (
                port,
                gpr_info(i.op0_register()).1.bytes(),
                IoDirection::In,
                0,
            )
        } else {
            let port = if i.op0_kind() == OpKind::Register {
                self.state.gpr[2] as u16
            } else {
                i.immediate8() as u16
            };
            let (_, size, _) = gpr_info(i.op1_register());
            (
                port,
                size.bytes(),
                IoDirection::Out,
                (self.state.gpr[0] & size.mask()) as u32,
            )
        };
        if self.state.cpl() > self.iopl() {
            self.check_io_bitmap(mem, port, size)?;
        }
        self.note_io_access(port, size);
        let exits = match self.vmx.as_deref() {
            None => true,
            Some(v) => match &v.io_exiting {
                None => true,
                Some(ports) => ports.contains(&port),
            },
        };
        if exits {
            return Err(Fault::exit(VmExit::Io {
                port,
                size,
                direction,
                value,
            }));
        }
        // Nothing is attached to a port that does not exit: reads float high.
        if direction == IoDirection::In {
            let mask = Size::from_bytes(size as usize).map_or(0xff, |s| s.mask());
            let idx = gpr_info(i.op0_register());
            self.set_gpr_sized(idx.0, idx.1, false, mask);
        }
        Ok(())
    }

    /// INS and OUTS (SDM Vol. 2A), with or without REP: one element per
    /// I/O exit. OUTS reads DS:RSI (or its override), advances RSI (and
    /// counts RCX down under REP) and exits with the value; while elements
    /// remain, the exit leaves RIP at the instruction, which continues
    /// when it runs again. INS exits first; the value the handler gives
    /// `complete_io_in` is stored at ES:RDI when the instruction runs
    /// again (a fault there keeps it for the retry), then RDI advances.
    /// The address size picks SI/ESI/RSI, DI/EDI/RDI and CX/ECX/RCX; the
    /// port is DX, checked against the I/O bitmap above IOPL.
    fn exec_string_io(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        let (size, input) = match i.mnemonic() {
            M::Insb => (Size::B1, true),
            M::Insw => (Size::B2, true),
            M::Insd => (Size::B4, true),
            M::Outsb => (Size::B1, false),
            M::Outsw => (Size::B2, false),
            _ => (Size::B4, false),
        };
        let amask = match if input { i.op0_kind() } else { i.op1_kind() } {
            OpKind::MemoryESEDI | OpKind::MemorySegESI => 0xffff_ffffu64,
            OpKind::MemoryESDI | OpKind::MemorySegSI => 0xffff,
            _ => u64::MAX,
        };
        let rep = i.has_rep_prefix() || i.has_repe_prefix() || i.has_repne_prefix();
        if rep && self.state.gpr[1] & amask == 0 {
            return Ok(());
        }
        let port = self.state.gpr[2] as u16;
        let bytes = size.bytes();
        if self.state.cpl() > self.iopl() {
            self.check_io_bitmap(mem, port, bytes)?;
        }
        self.note_io_access(port, bytes);
        let exits = match self.vmx.as_deref() {
            None => true,
            Some(v) => v
                .io_exiting
                .as_ref()
                .is_none_or(|ports| ports.contains(&port)),
        };
        let step = u64::from(bytes);
        let delta = if self.state.rflags & rflags::DF != 0 {
            step.wrapping_neg()
        } else {
            step
        };
        let mut out_value = None;
        if input {
            let value = match self.pending_string_in.take() {
                Some(v) => u64::from(v),
                None if exits => {
                    self.string_in_exit = true;
                    self.string_io_resume = true;
                    return Err(Fault::exit(VmExit::Io {
                        port,
                        size: bytes,
                        direction: IoDirection::In,
                        value: 0,
                    }));
                }
                // Nothing attached: the bus floats high.
                None => size.mask(),
            };
            let rdi = self.linear(Register::ES, self.state.gpr[7] & amask);
            if let Err(fault) = self.write_mem(mem, rdi, size, value & size.mask()) {
                if exits {
                    self.pending_string_in = Some(value as u32);
                }
                return Err(fault);
            }
            self.advance_index(7, delta, amask);
        } else {
            let rsi = self.linear(i.memory_segment(), self.state.gpr[6] & amask);
            out_value = Some(self.read_mem(mem, rsi, size)? as u32);
            self.advance_index(6, delta, amask);
        }
        let more = rep && {
            let count = (self.state.gpr[1] & amask).wrapping_sub(1) & amask;
            let keep = if amask == 0xffff { !amask } else { 0 };
            self.state.gpr[1] = (self.state.gpr[1] & keep) | count;
            count != 0
        };
        if more {
            // The next element: this instruction again.
            self.next_rip = self.state.rip;
        }
        match out_value {
            Some(value) if exits => {
                self.string_io_resume = more;
                Err(Fault::exit(VmExit::Io {
                    port,
                    size: bytes,
                    direction: IoDirection::Out,
                    value,
                }))
            }
            _ => Ok(()),
        }
    }

    /// The I/O permission bitmap check of an access with CPL > IOPL (SDM
    /// Vol. 1 19.5.2): the TSS must be a loaded 32/64-bit TSS; the bitmap
    /// starts at the 16-bit offset at TSS + 0x66; the processor reads the
    /// two bytes holding the port's first bit, and the access is allowed
    /// only if every bit of ports `port..port + size` is clear and both
    /// bytes lie within the TSS limit. Anything else is #GP(0). (Linux's
    /// `ioperm` and `iopl` both work through this bitmap.)
    fn check_io_bitmap(&mut self, mem: &PhysMemory, port: u16, size: u8) -> Result<(), Fault> {
        let tr = self.state.tr;
        let tss_type = tr.attr & seg_attr::TYPE_MASK;
        if tr.attr & seg_attr::S != 0 || !matches!(tss_type, 0x9 | 0xb) || tr.limit < 0x67 {
            return Err(gp(0));
        }
        let map_base = self.read_implicit(mem, tr.base.wrapping_add(0x66), Size::B2)?;
        let byte = map_base + u64::from(port / 8);
        if byte + 1 > u64::from(tr.limit) {
            return Err(gp(0));
        }
        let bits = self.read_implicit(mem, tr.base.wrapping_add(byte), Size::B2)?;
        let mask = ((1u64 << size) - 1) << (port % 8);
        if bits & mask != 0 {
            return Err(gp(0));
        }
        Ok(())
    }

    /// Whether an MSR access exits in guest mode.
    fn msr_exits(&self, index: u32, write: bool) -> bool {
        let Some(v) = self.vmx.as_deref() else {
            return false;
        };
        if v.virtualize_x2apic && (apic::MSR_X2APIC_FIRST..=apic::MSR_X2APIC_LAST).contains(&index)
        {
            return false;
        }
        match &v.msr_exiting {
            MsrExiting::All => true,
            MsrExiting::Bitmap {
                read_passthrough,
                write_passthrough,
            } => {
                let list = if write {
                    write_passthrough
                } else {
                    read_passthrough
                };
                !list.contains(&index)
            }
        }
    }

    /// RDMSR on the CPU's own MSRs.
    pub(crate) fn read_msr(&mut self, index: u32) -> Result<u64, Fault> {
        let s = &self.state;
        Ok(match index {
            msr::EFER => s.efer,
            msr::STAR => s.star,
            msr::LSTAR => s.lstar,
            msr::CSTAR => s.cstar,
            msr::FMASK => s.fmask,
            msr::FS_BASE => s.fs.base,
            msr::GS_BASE => s.gs.base,
            msr::KERNEL_GS_BASE => s.kernel_gs_base,
            msr::TSC_AUX => s.tsc_aux,
            msr::PAT => s.pat,
            msr::SYSENTER_CS => s.sysenter_cs,
            msr::SYSENTER_ESP => s.sysenter_esp,
            msr::SYSENTER_EIP => s.sysenter_eip,
            msr::MISC_ENABLE => s.misc_enable,
            msr::MTRR_DEF_TYPE => s.mtrr_def_type,
            msr::TSC => self.tsc(),
            // MTRRcap: no variable or fixed ranges.
            0xfe => 0,
            msr::ARCH_CAPABILITIES => arch_capabilities::VALUE,
            msr::APIC_BASE | msr::TSC_DEADLINE | apic::MSR_X2APIC_FIRST..=apic::MSR_X2APIC_LAST => {
                let now = self.tsc();
                self.apic.read_msr(index, now).map_err(|_| gp(0))?
            }
            _ => return s.mce.read(index).ok_or_else(|| gp(0)),
        })
    }

    /// WRMSR on the CPU's own MSRs.
    pub(crate) fn write_msr(&mut self, index: u32, v: u64) -> Result<(), Fault> {
        let canonical = |v: u64| if is_canonical(v) { Ok(v) } else { Err(gp(0)) };
        match index {
            msr::EFER => {
                let paging = self.state.cr0 & cr0::PG != 0;
                if v & !(efer::WRITABLE | efer::LMA) != 0
                    || (paging && (v ^ self.state.efer) & efer::LME != 0)
                {
                    // LME changes only with paging off.
                    return Err(gp(0));
                }
                // LMA is the CPU's: LME with paging on.
                self.state.efer = (v & efer::WRITABLE) | (self.state.efer & efer::LMA);
                let vpid = self.vpid();
                self.tlb.flush_vpid(vpid);
            }
            msr::STAR => self.state.star = v,
            msr::LSTAR => self.state.lstar = canonical(v)?,
            msr::CSTAR => self.state.cstar = canonical(v)?,
            msr::FMASK => self.state.fmask = v & 0xffff_ffff,
            msr::FS_BASE => self.state.fs.base = canonical(v)?,
            msr::GS_BASE => self.state.gs.base = canonical(v)?,
            msr::KERNEL_GS_BASE => self.state.kernel_gs_base = canonical(v)?,
            msr::TSC_AUX => {
                if v >> 32 != 0 {
                    return Err(gp(0));
                }
                self.state.tsc_aux = v;
            }
            msr::PAT => {
                if !valid_pat(v) {
                    return Err(gp(0));
                }
                self.state.pat = v;
            }
            msr::SYSENTER_CS => self.state.sysenter_cs = v & 0xffff,
            msr::SYSENTER_ESP => self.state.sysenter_esp = canonical(v)?,
            msr::SYSENTER_EIP => self.state.sysenter_eip = canonical(v)?,
            msr::MISC_ENABLE => self.state.misc_enable = v,
            msr::MTRR_DEF_TYPE => {
                if v & !0xcff != 0 {
                    return Err(gp(0));
                }
                self.state.mtrr_def_type = v;
            }
            msr::TSC => {
                // Writing the TSC moves this CPU's cycle counter, as the
                // machine has no separate TSC.
                let offset = self.vmx.as_ref().map_or(0, |x| x.tsc_offset);
                self.cycles = v.wrapping_sub(offset as u64);
                self.check_events = true;
            }
            msr::APIC_BASE | msr::TSC_DEADLINE | apic::MSR_X2APIC_FIRST..=apic::MSR_X2APIC_LAST => {
                let now = self.tsc();
                match self.apic.write_msr(index, v, now).map_err(|_| gp(0))? {
                    ApicWrite::Done => {}
                    ApicWrite::SendIpi(ipi) => self.pending_apic_exit = Some(VmExit::Ipi(ipi)),
                    ApicWrite::EoiBroadcast(vector) => {
                        self.pending_apic_exit = Some(VmExit::EoiBroadcast { vector })
                    }
                }
                self.check_events = true;
            }
            _ => {
                if !self.state.mce.write(index, v) {
                    return Err(gp(0));
                }
            }
        }
        Ok(())
    }

    /// SWAPGS (the mode epoch moved by the caller, as for every system
    /// instruction; also `fast::exec_fast_system`).
    pub(super) fn exec_swapgs(&mut self) -> Result<(), Fault> {
        self.require_cpl0()?;
        std::mem::swap(&mut self.state.gs.base, &mut self.state.kernel_gs_base);
        Ok(())
    }

    /// RDTSC or RDTSCP (also `fast::exec_fast_system`).
    pub(super) fn exec_rdtsc(&mut self, rdtscp: bool) -> Result<(), Fault> {
        if self.state.cr4 & cr4::TSD != 0 && self.state.cpl() > 0 {
            return Err(gp(0));
        }
        if self.vmx.as_ref().is_some_and(|v| v.rdtsc_exiting) {
            return Err(Fault::exit(VmExit::Rdtsc { rdtscp }));
        }
        let tsc = self.tsc();
        self.state.gpr[0] = tsc & 0xffff_ffff;
        self.state.gpr[2] = tsc >> 32;
        if rdtscp {
            self.state.gpr[1] = self.state.tsc_aux & 0xffff_ffff;
        }
        Ok(())
    }

    pub(super) fn exec_syscall(&mut self, i: &Instruction) -> Result<(), Fault> {
        if self.state.efer & efer::SCE == 0 {
            return Err(ud());
        }
        self.cycles += self.costs.privilege_transition;
        self.tf_after_only = true;
        // From compatibility mode the entry point is CSTAR.
        let target = if self.state.in_64bit_mode() {
            self.state.lstar
        } else {
            self.state.cstar
        };
        let s = &mut self.state;
        s.gpr[1] = i.next_ip();
        s.gpr[11] = s.rflags & !rflags::RF;
        s.rflags = (s.rflags & !(s.fmask | rflags::RF)) | rflags::FIXED1;
        let sel = ((s.star >> 32) & 0xffff) as u16;
        s.cs = Segment {
            selector: sel & !3,
            base: 0,
            limit: 0xffff_ffff,
            attr: seg_attr::CODE64_KERNEL,
        };
        s.ss = Segment {
            selector: (sel & !3).wrapping_add(8),
            base: 0,
            limit: 0xffff_ffff,
            attr: seg_attr::DATA_KERNEL,
        };
        self.next_rip = target;
        // The mode epoch moved before the instruction if the first-level
        // TLB's key context may change (`system_moves_mode`: RFLAGS.AC
        // under SMAP); CS, the code size and the privilege are not in it,
        // so a SYSCALL from compatibility mode needs no more.
        // (`compat_syscall_with_cstar_equal_to_lstar_keeps_smap_exact`.)
        // No event check: RFLAGS.IF can only be cleared here (FMASK), so
        // nothing becomes deliverable that was not before (as POPF, which
        // asks for one only when IF changes; a timer coming due is the
        // run loop's own check).
        Ok(())
    }

    pub(super) fn exec_sysret(&mut self) -> Result<(), Fault> {
        if self.state.efer & efer::SCE == 0 {
            return Err(ud());
        }
        self.require_cpl0()?;
        let rcx = self.state.gpr[1];
        if !is_canonical(rcx) {
            return Err(gp(0));
        }
        self.cycles += self.costs.privilege_transition;
        self.tf_after_only = true;
        let s = &mut self.state;
        let base = ((s.star >> 48) & 0xffff) as u16;
        s.rflags = (s.gpr[11] & 0x3c_7fd7) | rflags::FIXED1;
        s.cs = Segment {
            selector: base.wrapping_add(16) | 3,
            base: 0,
            limit: 0xffff_ffff,
            attr: seg_attr::CODE64_USER,
        };
        s.ss = Segment {
            selector: base.wrapping_add(8) | 3,
            base: 0,
            limit: 0xffff_ffff,
            attr: seg_attr::DATA_USER,
        };
        self.next_rip = rcx;
        self.check_events = true;
        Ok(())
    }

    /// SYSRET with a 32-bit operand size (SDM Vol. 2B): back to a
    /// compatibility-mode ring-3 code segment STAR[63:48] with EIP = ECX,
    /// SS = STAR[63:48] + 8, RFLAGS = R11.
    pub(super) fn exec_sysret32(&mut self) -> Result<(), Fault> {
        if self.state.efer & efer::SCE == 0 || !self.state.in_64bit_mode() {
            return Err(ud());
        }
        self.require_cpl0()?;
        self.cycles += self.costs.privilege_transition;
        self.tf_after_only = true;
        let s = &mut self.state;
        let base = ((s.star >> 48) & 0xffff) as u16;
        s.rflags = (s.gpr[11] & 0x3c_7fd7) | rflags::FIXED1;
        s.cs = Segment {
            selector: base | 3,
            base: 0,
            limit: 0xffff_ffff,
            attr: (seg_attr::CODE64_USER & !seg_attr::LONG) | seg_attr::DB,
        };
        s.ss = Segment {
            selector: base.wrapping_add(8) | 3,
            base: 0,
            limit: 0xffff_ffff,
            attr: seg_attr::DATA_USER,
        };
        self.next_rip = s.gpr[1] & 0xffff_ffff;
        self.mode_epoch += 1;
        self.check_events = true;
        Ok(())
    }

    /// LLDT (SDM Vol. 2A): a null selector leaves LDTR unusable; otherwise
    /// a GDT selector (TI = 0) of a present LDT descriptor (system type 2,
    /// 16 bytes in IA-32e mode), else #GP(selector) / #NP(selector).
    fn load_ldt_register(&mut self, mem: &PhysMemory, sel: u16) -> Result<(), Fault> {
        if sel & !3 == 0 {
            self.state.ldtr = Segment {
                selector: sel,
                attr: seg_attr::UNUSABLE,
                ..Segment::default()
            };
            return Ok(());
        }
        let err = gp(u32::from(sel & !3));
        if sel & 4 != 0 {
            return Err(err);
        }
        let d = self.load_descriptor(mem, sel, 0)?;
        if d.attr & seg_attr::S != 0 || d.attr & seg_attr::TYPE_MASK != 0x2 {
            return Err(err);
        }
        let index = u64::from(sel & !7);
        let long = self.state.efer & efer::LMA != 0;
        let mut base = d.base;
        if long {
            if index + 15 > u64::from(self.state.gdtr.limit) {
                return Err(err);
            }
            let high =
                self.read_implicit(mem, self.state.gdtr.base.wrapping_add(index + 8), Size::B8)?;
            base = (base & 0xffff_ffff) | ((high & 0xffff_ffff) << 32);
            if !is_canonical(base) {
                return Err(err);
            }
        }
        if d.attr & seg_attr::PRESENT == 0 {
            return Err(Fault::with_code(vector::NP, u32::from(sel & !3)));
        }
        self.state.ldtr = Segment {
            selector: sel,
            base,
            limit: d.limit,
            attr: d.attr,
        };
        Ok(())
    }

    /// Checks a code-segment descriptor for a return to privilege `rpl`.
    pub(super) fn return_code_segment(
        &mut self,
        mem: &PhysMemory,
        sel: u16,
    ) -> Result<Segment, Fault> {
        // (Made only when taken: a fault is an allocation.)
        let err = || gp((sel & !3) as u32);
        if sel & !3 == 0 {
            return Err(gp(0));
        }
        let d = self.load_descriptor(mem, sel, 0)?;
        let code = d.attr & seg_attr::S != 0 && d.attr & 0x8 != 0;
        if !code || d.dpl() != (sel & 3) as u8 {
            return Err(err());
        }
        if self.state.efer & efer::LMA != 0
            && d.attr & seg_attr::LONG != 0
            && d.attr & seg_attr::DB != 0
        {
            // L and D together are reserved in IA-32e mode.
            return Err(err());
        }
        if d.attr & seg_attr::PRESENT == 0 {
            return Err(Fault::with_code(vector::NP, (sel & !3) as u32));
        }
        Ok(d)
    }

    /// Checks the SS for a return to privilege `cpl`.
    pub(super) fn return_stack_segment(
        &mut self,
        mem: &PhysMemory,
        sel: u16,
        cpl: u8,
    ) -> Result<Segment, Fault> {
        if sel & !3 == 0 {
            if cpl == 3 || (sel & 3) as u8 != cpl {
                return Err(gp(0));
            }
            return Ok(Segment {
                selector: sel,
                base: 0,
                limit: 0,
                attr: seg_attr::UNUSABLE | ((cpl as u32) << seg_attr::DPL_SHIFT),
            });
        }
        let d = self.load_descriptor(mem, sel, 0)?;
        let writable_data = d.attr & seg_attr::S != 0 && d.attr & 0x8 == 0 && d.attr & 0x2 != 0;
        if (sel & 3) as u8 != cpl || d.dpl() != cpl || !writable_data {
            return Err(gp((sel & !3) as u32));
        }
        if d.attr & seg_attr::PRESENT == 0 {
            return Err(Fault::with_code(vector::SS, (sel & !3) as u32));
        }
        Ok(d)
    }
}
