//! Architectural state of one CPU: what the VMCS guest-state area holds.

/// RFLAGS bits.
pub mod rflags {
    pub const CF: u64 = 1 << 0;
    /// Always 1.
    pub const FIXED1: u64 = 1 << 1;
    pub const PF: u64 = 1 << 2;
    pub const AF: u64 = 1 << 4;
    pub const ZF: u64 = 1 << 6;
    pub const SF: u64 = 1 << 7;
    pub const TF: u64 = 1 << 8;
    pub const IF: u64 = 1 << 9;
    pub const DF: u64 = 1 << 10;
    pub const OF: u64 = 1 << 11;
    pub const IOPL: u64 = 3 << 12;
    pub const NT: u64 = 1 << 14;
    pub const RF: u64 = 1 << 16;
    pub const VM: u64 = 1 << 17;
    pub const AC: u64 = 1 << 18;
    pub const VIF: u64 = 1 << 19;
    pub const VIP: u64 = 1 << 20;
    pub const ID: u64 = 1 << 21;
    /// The six arithmetic status flags.
    pub const ARITH: u64 = CF | PF | AF | ZF | SF | OF;
    /// Bits software can change with POPF at CPL 0 (VM/VIF/VIP kept clear).
    pub const WRITABLE: u64 = ARITH | TF | IF | DF | IOPL | NT | RF | AC | ID;
}

/// CR0 bits.
pub mod cr0 {
    pub const PE: u64 = 1 << 0;
    pub const MP: u64 = 1 << 1;
    pub const EM: u64 = 1 << 2;
    pub const TS: u64 = 1 << 3;
    pub const ET: u64 = 1 << 4;
    pub const NE: u64 = 1 << 5;
    pub const WP: u64 = 1 << 16;
    pub const AM: u64 = 1 << 18;
    pub const NW: u64 = 1 << 29;
    pub const CD: u64 = 1 << 30;
    pub const PG: u64 = 1 << 31;
    /// Bits that exist; setting any other is #GP.
    pub const DEFINED: u64 = PE | MP | EM | TS | ET | NE | WP | AM | NW | CD | PG;
}

/// CR4 bits.
pub mod cr4 {
    pub const VME: u64 = 1 << 0;
    pub const PVI: u64 = 1 << 1;
    pub const TSD: u64 = 1 << 2;
    pub const DE: u64 = 1 << 3;
    pub const PSE: u64 = 1 << 4;
    pub const PAE: u64 = 1 << 5;
    pub const MCE: u64 = 1 << 6;
    pub const PGE: u64 = 1 << 7;
    pub const PCE: u64 = 1 << 8;
    pub const OSFXSR: u64 = 1 << 9;
    pub const OSXMMEXCPT: u64 = 1 << 10;
    pub const UMIP: u64 = 1 << 11;
    pub const VMXE: u64 = 1 << 13;
    pub const FSGSBASE: u64 = 1 << 16;
    pub const PCIDE: u64 = 1 << 17;
    pub const OSXSAVE: u64 = 1 << 18;
    pub const SMEP: u64 = 1 << 20;
    pub const SMAP: u64 = 1 << 21;
    /// Bits this CPU accepts; setting any other is #GP.
    pub const SUPPORTED: u64 = VME
        | PVI
        | TSD
        | DE
        | PSE
        | PAE
        | MCE
        | PGE
        | PCE
        | OSFXSR
        | OSXMMEXCPT
        | UMIP
        | FSGSBASE
        | PCIDE
        | OSXSAVE
        | SMEP
        | SMAP;
    /// Changing these flushes the TLB (SDM 4.10.4.1).
    pub const TLB_FLUSHING: u64 = PGE | PAE | PSE | SMEP | SMAP | PCIDE;
}

/// IA32_EFER bits.
pub mod efer {
    pub const SCE: u64 = 1 << 0;
    pub const LME: u64 = 1 << 8;
    pub const LMA: u64 = 1 << 10;
    pub const NXE: u64 = 1 << 11;
    /// Bits software may set.
    pub const WRITABLE: u64 = SCE | LME | NXE;
}

/// Architectural MSR indices this CPU implements.
pub mod msr {
    pub const TSC: u32 = 0x10;
    pub const APIC_BASE: u32 = 0x1b;
    pub const MISC_ENABLE: u32 = 0x1a0;
    pub const PAT: u32 = 0x277;
    pub const SYSENTER_CS: u32 = 0x174;
    pub const SYSENTER_ESP: u32 = 0x175;
    pub const SYSENTER_EIP: u32 = 0x176;
    pub const MTRR_DEF_TYPE: u32 = 0x2ff;
    pub const TSC_DEADLINE: u32 = 0x6e0;
    pub const EFER: u32 = 0xc000_0080;
    pub const STAR: u32 = 0xc000_0081;
    pub const LSTAR: u32 = 0xc000_0082;
    pub const CSTAR: u32 = 0xc000_0083;
    pub const FMASK: u32 = 0xc000_0084;
    pub const FS_BASE: u32 = 0xc000_0100;
    pub const GS_BASE: u32 = 0xc000_0101;
    pub const KERNEL_GS_BASE: u32 = 0xc000_0102;
    pub const TSC_AUX: u32 = 0xc000_0103;
    /// IA32_ARCH_CAPABILITIES (read-only; enumerated by CPUID.7.0:EDX[29]).
    pub const ARCH_CAPABILITIES: u32 = 0x10a;
}

/// IA32_ARCH_CAPABILITIES as the machine reports it: every "not
/// susceptible" bit, since the machine executes nothing speculatively
/// (no transient loads, no fill or store buffers, no branch predictors).
/// KVM synthesizes the same bits for a guest on a host that is not
/// affected (`kvm_get_arch_capabilities` in `arch/x86/kvm/x86.c`); bit
/// numbers as in Linux's `arch/x86/include/asm/msr-index.h` and the SDM
/// Vol. 4, Table 2-2. Linux reads them in `cpu_set_bug_bits`: with
/// RDCL_NO it runs without page-table isolation, with MDS_NO it does not
/// VERW on every return to user mode.
pub mod arch_capabilities {
    /// Not susceptible to Rogue Data Cache Load (Meltdown).
    pub const RDCL_NO: u64 = 1 << 0;
    /// No L1D flush needed on VM entry (nested guests).
    pub const SKIP_L1DFL_VMENTRY: u64 = 1 << 3;
    /// Not susceptible to Speculative Store Bypass.
    pub const SSB_NO: u64 = 1 << 4;
    /// Not susceptible to Microarchitectural Data Sampling.
    pub const MDS_NO: u64 = 1 << 5;
    /// No machine check on a page-size change without TLB invalidation.
    pub const PSCHANGE_MC_NO: u64 = 1 << 6;
    /// Not susceptible to TSX Asynchronous Abort.
    pub const TAA_NO: u64 = 1 << 8;
    /// Not susceptible to the SBDR/SSDP MMIO stale-data variants.
    pub const SBDR_SSDP_NO: u64 = 1 << 13;
    /// Not susceptible to the FBSDP MMIO stale-data variant.
    pub const FBSDP_NO: u64 = 1 << 14;
    /// Not susceptible to the PSDP MMIO stale-data variant.
    pub const PSDP_NO: u64 = 1 << 15;
    /// Not susceptible to Branch History Injection.
    pub const BHI_NO: u64 = 1 << 20;
    /// Not susceptible to Post-Barrier RSB predictions.
    pub const PBRSB_NO: u64 = 1 << 24;
    /// Not susceptible to Gather Data Sampling.
    pub const GDS_NO: u64 = 1 << 26;
    /// Not susceptible to Register File Data Sampling.
    pub const RFDS_NO: u64 = 1 << 27;
    /// Not susceptible to Indirect Target Selection (a bit VMMs
    /// synthesize; hardware does not set it).
    pub const ITS_NO: u64 = 1 << 62;
    /// The value RDMSR returns.
    pub const VALUE: u64 = RDCL_NO
        | SKIP_L1DFL_VMENTRY
        | SSB_NO
        | MDS_NO
        | PSCHANGE_MC_NO
        | TAA_NO
        | SBDR_SSDP_NO
        | FBSDP_NO
        | PSDP_NO
        | BHI_NO
        | PBRSB_NO
        | GDS_NO
        | RFDS_NO
        | ITS_NO;
}

/// General-purpose registers in encoding order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Gpr {
    Rax = 0,
    Rcx,
    Rdx,
    Rbx,
    Rsp,
    Rbp,
    Rsi,
    Rdi,
    R8,
    R9,
    R10,
    R11,
    R12,
    R13,
    R14,
    R15,
}

impl Gpr {
    /// All sixteen, in encoding order.
    pub const ALL: [Gpr; 16] = [
        Gpr::Rax,
        Gpr::Rcx,
        Gpr::Rdx,
        Gpr::Rbx,
        Gpr::Rsp,
        Gpr::Rbp,
        Gpr::Rsi,
        Gpr::Rdi,
        Gpr::R8,
        Gpr::R9,
        Gpr::R10,
        Gpr::R11,
        Gpr::R12,
        Gpr::R13,
        Gpr::R14,
        Gpr::R15,
    ];
}

/// Segment access rights in the VMCS format (SDM 25.4.1): type 3:0, S 4,
/// DPL 6:5, P 7, AVL 12, L 13, D/B 14, G 15, unusable 16.
pub mod seg_attr {
    pub const TYPE_MASK: u32 = 0xf;
    /// Code/data (not system) descriptor.
    pub const S: u32 = 1 << 4;
    pub const DPL_SHIFT: u32 = 5;
    pub const DPL_MASK: u32 = 3 << DPL_SHIFT;
    pub const PRESENT: u32 = 1 << 7;
    pub const LONG: u32 = 1 << 13;
    pub const DB: u32 = 1 << 14;
    pub const GRANULARITY: u32 = 1 << 15;
    pub const UNUSABLE: u32 = 1 << 16;
    /// Type of an execute/read accessed code segment.
    pub const TYPE_CODE_RX_ACCESSED: u32 = 0xb;
    /// Type of a read/write accessed data segment.
    pub const TYPE_DATA_RW_ACCESSED: u32 = 0x3;
    /// Type of a busy 64-bit TSS.
    pub const TYPE_TSS64_BUSY: u32 = 0xb;
    /// 64-bit ring-0 code segment.
    pub const CODE64_KERNEL: u32 = TYPE_CODE_RX_ACCESSED | S | PRESENT | LONG | GRANULARITY;
    /// 64-bit ring-3 code segment.
    pub const CODE64_USER: u32 = CODE64_KERNEL | (3 << DPL_SHIFT);
    /// Ring-0 data segment.
    pub const DATA_KERNEL: u32 = TYPE_DATA_RW_ACCESSED | S | PRESENT | DB | GRANULARITY;
    /// Ring-3 data segment.
    pub const DATA_USER: u32 = DATA_KERNEL | (3 << DPL_SHIFT);
}

/// A segment register with its hidden part.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Segment {
    pub selector: u16,
    pub base: u64,
    pub limit: u32,
    /// Access rights, [`seg_attr`] format.
    pub attr: u32,
}

impl Segment {
    /// The descriptor privilege level.
    pub fn dpl(&self) -> u8 {
        ((self.attr & seg_attr::DPL_MASK) >> seg_attr::DPL_SHIFT) as u8
    }
}

/// GDTR or IDTR.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct DescriptorTable {
    pub base: u64,
    pub limit: u16,
}

/// What the CPU is doing between instructions.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Activity {
    #[default]
    Active,
    /// After HLT: waits for an interrupt.
    Halted,
    /// An application processor after INIT, waiting for a startup IPI.
    WaitForSipi,
    /// After a triple fault.
    Shutdown,
}

/// Interrupt-blocking state after STI or MOV SS (VMCS interruptibility).
pub mod interruptibility {
    /// Blocking by STI: interrupts wait one more instruction.
    pub const STI: u8 = 1 << 0;
    /// Blocking by MOV SS / POP SS.
    pub const MOV_SS: u8 = 1 << 1;
}

/// The full architectural state of one CPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct CpuState {
    /// RAX..R15 in encoding order.
    pub gpr: [u64; 16],
    pub rip: u64,
    pub rflags: u64,
    pub cr0: u64,
    pub cr2: u64,
    pub cr3: u64,
    pub cr4: u64,
    pub efer: u64,
    pub es: Segment,
    pub cs: Segment,
    pub ss: Segment,
    pub ds: Segment,
    /// `fs.base` is IA32_FS_BASE.
    pub fs: Segment,
    /// `gs.base` is IA32_GS_BASE.
    pub gs: Segment,
    pub ldtr: Segment,
    pub tr: Segment,
    pub gdtr: DescriptorTable,
    pub idtr: DescriptorTable,
    pub star: u64,
    pub lstar: u64,
    pub cstar: u64,
    pub fmask: u64,
    pub kernel_gs_base: u64,
    pub tsc_aux: u64,
    pub pat: u64,
    pub sysenter_cs: u64,
    pub sysenter_esp: u64,
    pub sysenter_eip: u64,
    pub misc_enable: u64,
    pub mtrr_def_type: u64,
    /// DR0-DR3, DR6, DR7 (values only: no breakpoints fire).
    pub debug: super::debug_regs::DebugRegs,
    /// [`interruptibility`] bits.
    pub interruptibility: u8,
    /// Blocking by NMI (VMCS interruptibility bit 3): set by delivering an
    /// NMI, cleared by the next IRET (SDM Vol. 3A 6.7.1). The CPU itself
    /// has no NMI source; the hypervisor injects NMIs and reads this to
    /// hold the next one back.
    #[serde(default)]
    pub nmi_blocked: bool,
    pub activity: Activity,
    /// x87 and SSE registers.
    pub fpu: super::fpu_state::FpuState,
    /// The machine-check registers (`mce`).
    #[serde(default)]
    pub mce: super::mce::MceRegs,
    /// XCR0, the XSAVE feature mask (`xsave`): bit 0 (x87) always set.
    #[serde(default = "super::xsave::xcr0_at_reset")]
    pub xcr0: u64,
}

impl Default for CpuState {
    /// The 64-bit flat ring-0 state the hypervisor normally builds (as
    /// Firecracker does): long mode, paging on with CR3 = 0, interrupts off.
    /// Callers set CR3, GDTR/IDTR, TR, RIP and RSP.
    fn default() -> Self {
        let code = Segment {
            selector: 0x08,
            base: 0,
            limit: 0xffff_ffff,
            attr: seg_attr::CODE64_KERNEL,
        };
        let data = Segment {
            selector: 0x10,
            base: 0,
            limit: 0xffff_ffff,
            attr: seg_attr::DATA_KERNEL,
        };
        CpuState {
            gpr: [0; 16],
            rip: 0,
            rflags: rflags::FIXED1,
            cr0: cr0::PE | cr0::MP | cr0::ET | cr0::NE | cr0::WP | cr0::PG,
            cr2: 0,
            cr3: 0,
            cr4: cr4::PAE | cr4::PGE | cr4::OSFXSR | cr4::OSXMMEXCPT,
            efer: efer::LME | efer::LMA | efer::NXE | efer::SCE,
            es: data,
            cs: code,
            ss: data,
            ds: data,
            fs: data,
            gs: data,
            ldtr: Segment {
                attr: seg_attr::UNUSABLE,
                ..Segment::default()
            },
            tr: Segment {
                selector: 0,
                base: 0,
                limit: 0x67,
                attr: seg_attr::TYPE_TSS64_BUSY | seg_attr::PRESENT,
            },
            gdtr: DescriptorTable::default(),
            idtr: DescriptorTable::default(),
            star: 0,
            lstar: 0,
            cstar: 0,
            fmask: 0,
            kernel_gs_base: 0,
            tsc_aux: 0,
            pat: 0x0007_0406_0007_0406,
            sysenter_cs: 0,
            sysenter_esp: 0,
            sysenter_eip: 0,
            misc_enable: 1,
            mtrr_def_type: 0xc06,
            debug: super::debug_regs::DebugRegs::default(),
            interruptibility: 0,
            nmi_blocked: false,
            activity: Activity::Active,
            fpu: super::fpu_state::FpuState::default(),
            mce: super::mce::MceRegs::default(),
            xcr0: super::xsave::xcr0_at_reset(),
        }
    }
}

impl CpuState {
    /// The architectural state after RESET or INIT (SDM Vol. 3, 10.1.1,
    /// Table 10-1), but executing at `selector:ip` in real mode: CS base
    /// `selector * 16`, every segment limit 0xffff, CR0 = 0x60000010 (CD,
    /// NW, ET), paging and protection off, EFER clear, GDTR/IDTR base 0
    /// limit 0xffff. RESET itself is `real_mode_at(0xf000, 0xfff0)` with
    /// the CS base 0xffff0000 hardware uses instead (see
    /// [`CpuState::reset`]); a startup IPI is `real_mode_at(vector << 8, 0)`.
    pub fn real_mode_at(selector: u16, ip: u16) -> CpuState {
        let data = Segment {
            selector: 0,
            base: 0,
            limit: 0xffff,
            attr: seg_attr::TYPE_DATA_RW_ACCESSED | seg_attr::S | seg_attr::PRESENT,
        };
        CpuState {
            rip: ip as u64,
            rflags: rflags::FIXED1,
            cr0: cr0::CD | cr0::NW | cr0::ET,
            cr4: 0,
            efer: 0,
            cs: Segment {
                selector,
                base: (selector as u64) << 4,
                limit: 0xffff,
                attr: seg_attr::TYPE_CODE_RX_ACCESSED | seg_attr::S | seg_attr::PRESENT,
            },
            ss: data,
            ds: data,
            es: data,
            fs: data,
            gs: data,
            ldtr: Segment {
                attr: 0x82 | seg_attr::PRESENT,
                limit: 0xffff,
                ..Segment::default()
            },
            tr: Segment {
                selector: 0,
                base: 0,
                limit: 0xffff,
                attr: 0x8b,
            },
            gdtr: DescriptorTable {
                base: 0,
                limit: 0xffff,
            },
            idtr: DescriptorTable {
                base: 0,
                limit: 0xffff,
            },
            ..CpuState::default()
        }
    }

    /// The state after RESET: real mode at F000:FFF0 with the CS base
    /// 0xffff0000, so the first fetch is at physical 0xfffffff0.
    pub fn reset() -> CpuState {
        let mut s = CpuState::real_mode_at(0xf000, 0xfff0);
        s.cs.base = 0xffff_0000;
        s
    }

    /// Current privilege level (0 in real mode, whatever CS holds).
    #[inline]
    pub fn cpl(&self) -> u8 {
        if self.cr0 & cr0::PE == 0 {
            return 0;
        }
        (self.cs.selector & 3) as u8
    }

    /// Whether the CPU is in 64-bit mode (IA-32e active and CS.L set).
    #[inline]
    pub fn in_64bit_mode(&self) -> bool {
        self.efer & efer::LMA != 0 && self.cs.attr & seg_attr::LONG != 0
    }

    /// The default operand and address size of the running code, in bits:
    /// 64 in 64-bit mode, else 32 or 16 by CS.D (compatibility mode,
    /// protected mode, and real mode, whose CS.D is normally clear).
    #[inline]
    pub fn code_bits(&self) -> u32 {
        if self.in_64bit_mode() {
            64
        } else if self.cs.attr & seg_attr::DB != 0 {
            32
        } else {
            16
        }
    }

    /// The mask of the stack pointer outside 64-bit mode: SS.B selects ESP
    /// or SP.
    #[inline]
    pub fn stack_mask(&self) -> u64 {
        if self.in_64bit_mode() {
            u64::MAX
        } else if self.ss.attr & seg_attr::DB != 0 {
            0xffff_ffff
        } else {
            0xffff
        }
    }

    /// A general register.
    #[inline]
    pub fn gpr(&self, r: Gpr) -> u64 {
        self.gpr[r as usize]
    }

    /// Sets a general register.
    #[inline]
    pub fn set_gpr(&mut self, r: Gpr, v: u64) {
        self.gpr[r as usize] = v;
    }

    /// A stable 64-bit hash of the whole state (FNV-1a over its Debug-free
    /// field encoding), for determinism checks.
    pub fn digest(&self) -> u64 {
        let mut h = Fnv::default();
        for v in self.gpr {
            h.u64(v);
        }
        for v in [
            self.rip,
            self.rflags,
            self.cr0,
            self.cr2,
            self.cr3,
            self.cr4,
            self.efer,
            self.star,
            self.lstar,
            self.cstar,
            self.fmask,
            self.kernel_gs_base,
            self.tsc_aux,
        ] {
            h.u64(v);
        }
        for s in [
            self.es, self.cs, self.ss, self.ds, self.fs, self.gs, self.ldtr, self.tr,
        ] {
            h.u64(s.selector as u64);
            h.u64(s.base);
            h.u64(s.limit as u64);
            h.u64(s.attr as u64);
        }
        for t in [self.gdtr, self.idtr] {
            h.u64(t.base);
            h.u64(t.limit as u64);
        }
        for v in self.debug.dr {
            h.u64(v);
        }
        h.u64(self.debug.dr6);
        h.u64(self.debug.dr7);
        h.u64(self.interruptibility as u64);
        h.u64(self.activity as u64);
        self.fpu.digest_into(&mut h);
        h.finish()
    }
}

/// FNV-1a, 64-bit: a tiny, stable hash (std's hasher may change between
/// Rust releases, which would break recorded digests).
#[derive(Debug, Clone, Copy)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    /// Mixes in 8 bytes.
    pub fn u64(&mut self, v: u64) {
        for b in v.to_le_bytes() {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    /// Mixes in bytes.
    pub fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    /// The hash.
    pub fn finish(&self) -> u64 {
        self.0
    }
}
