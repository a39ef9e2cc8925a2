//! RDMSR and WRMSR exits, through the MSR table.
//!
//! MSRs the guest reads and writes without exits are listed in
//! [`PASSTHROUGH_MSRS`]; the others exit and are looked up in [`MSRS`]:
//! each entry says how to read and how to write one MSR (a write that
//! returns false is refused with #GP, as KVM refuses it). The async-PF
//! MSRs exist only when offered and are `async_pf::x86`'s; kvmclock's are
//! `kvmclock`'s, steal time's `steal`'s; the machine-check registers are
//! the CPU's (`machine::cpu::mce`). Anything else is #GP.

use super::Vcpu;
use crate::error::VmError;
use crate::shared::Shared;
use machine::cpu::state::{arch_capabilities, cr0, efer, msr};
use machine::cpu::vector;
use machine::vmx::InvvpidKind;
use machine::{Cpu, EventInjection, EventKind};

/// MSRs the guest reads and writes without exits (the CPU's own state).
pub const PASSTHROUGH_MSRS: [u32; 8] = [
    msr::FS_BASE,
    msr::GS_BASE,
    msr::KERNEL_GS_BASE,
    msr::STAR,
    msr::LSTAR,
    msr::CSTAR,
    msr::FMASK,
    msr::TSC_AUX,
];

/// IA32_BIOS_SIGN_ID (0x8b).
pub const MSR_IA32_UCODE_REV: u32 = 0x8b;
/// What it reads: KVM's default for a guest, revision 1 in bits 63:32.
pub const GUEST_MICROCODE_VERSION: u64 = 0x1_0000_0000;

/// How one emulated MSR is read and written.
pub(crate) struct MsrEntry {
    pub index: u32,
    pub read: fn(&Cpu) -> Option<u64>,
    /// False: refused (#GP).
    pub write: fn(&mut Cpu, u64) -> bool,
}

/// The emulated MSRs.
pub(crate) const MSRS: &[MsrEntry] = &[
    MsrEntry {
        index: msr::EFER,
        read: |cpu| Some(cpu.state().efer),
        write: |cpu, v| {
            let paging = cpu.state().cr0 & cr0::PG != 0;
            write_efer(cpu, v, paging)
        },
    },
    MsrEntry {
        index: msr::PAT,
        read: |cpu| Some(cpu.state().pat),
        write: |cpu, v| {
            cpu.state_mut().pat = v;
            true
        },
    },
    MsrEntry {
        index: msr::MISC_ENABLE,
        read: |cpu| Some(cpu.state().misc_enable),
        write: |cpu, v| {
            cpu.state_mut().misc_enable = v;
            true
        },
    },
    MsrEntry {
        index: msr::MTRR_DEF_TYPE,
        read: |cpu| Some(cpu.state().mtrr_def_type),
        write: |cpu, v| {
            cpu.state_mut().mtrr_def_type = v;
            true
        },
    },
    MsrEntry {
        index: msr::SYSENTER_CS,
        read: |cpu| Some(cpu.state().sysenter_cs),
        write: |cpu, v| {
            cpu.state_mut().sysenter_cs = v;
            true
        },
    },
    MsrEntry {
        index: msr::SYSENTER_ESP,
        read: |cpu| Some(cpu.state().sysenter_esp),
        write: |cpu, v| {
            cpu.state_mut().sysenter_esp = v;
            true
        },
    },
    MsrEntry {
        index: msr::SYSENTER_EIP,
        read: |cpu| Some(cpu.state().sysenter_eip),
        write: |cpu, v| {
            cpu.state_mut().sysenter_eip = v;
            true
        },
    },
    MsrEntry {
        index: msr::TSC,
        read: |cpu| Some(cpu.tsc()),
        write: |cpu, v| {
            // As KVM: writing the TSC sets the offset.
            let cycles = cpu.cycles();
            if let Some(c) = cpu.vmx_mut() {
                c.tsc_offset = v.wrapping_sub(cycles) as i64;
            }
            true
        },
    },
    MsrEntry {
        index: msr::APIC_BASE,
        read: |cpu| cpu.apic().read_msr(msr::APIC_BASE, cpu.tsc()).ok(),
        write: |cpu, v| {
            let tsc = cpu.tsc();
            cpu.apic_mut().write_msr(msr::APIC_BASE, v, tsc).is_ok()
        },
    },
    // IA32_BIOS_SIGN_ID, the microcode revision (bits 63:32 after a
    // write of 0 and a CPUID, SDM Vol. 3A 10.11.7.1). As KVM
    // (arch/x86/kvm/x86.c: `microcode_version = 0x100000000` at vCPU
    // creation; a guest write is accepted and ignored): revision 1. Linux
    // reads it in early_init_intel.
    MsrEntry {
        index: MSR_IA32_UCODE_REV,
        read: |_| Some(GUEST_MICROCODE_VERSION),
        write: |_, _| true,
    },
    // The machine's "not susceptible" bits (`arch_capabilities`): the
    // guest runs on a CPU that does not speculate, as KVM tells a guest
    // on an unaffected host. Read-only: a write is #GP, as on hardware.
    MsrEntry {
        index: msr::ARCH_CAPABILITIES,
        read: |_| Some(arch_capabilities::VALUE),
        write: |_, _| false,
    },
    MsrEntry {
        index: msr::TSC_DEADLINE,
        read: |cpu| cpu.apic().read_msr(msr::TSC_DEADLINE, cpu.tsc()).ok(),
        write: |cpu, v| {
            let tsc = cpu.tsc();
            cpu.apic_mut().write_msr(msr::TSC_DEADLINE, v, tsc).is_ok()
        },
    },
];

/// As KVM: LMA is read-only (a written value is ignored), and as hardware
/// LME changes only while paging is off (SDM Vol. 3A 10.8.5: a 32-bit boot
/// sets it before CR0.PG); with paging on the guest may change SCE and NXE.
/// `paging`: the guest's CR0.PG (under shadow paging the machine's own is
/// always set).
pub(super) fn write_efer(cpu: &mut Cpu, value: u64, paging: bool) -> bool {
    let s = cpu.state();
    if value & !(efer::WRITABLE | efer::LMA) != 0 || (paging && (value ^ s.efer) & efer::LME != 0) {
        return false;
    }
    let new = (value & efer::WRITABLE) | (s.efer & efer::LMA);
    cpu.state_mut().efer = new;
    // NXE changes what translations allow.
    let vpid = cpu.vmx().map_or(0, |c| c.vpid);
    cpu.invvpid(InvvpidKind::SingleContext { vpid });
    true
}

fn msr_entry(index: u32) -> Option<&'static MsrEntry> {
    MSRS.iter().find(|e| e.index == index)
}

/// The #GP a refused MSR access gets.
pub(crate) fn gp_fault() -> EventInjection {
    EventInjection {
        kind: EventKind::HardwareException,
        vector: vector::GP,
        error_code: Some(0),
        instruction_len: 0,
    }
}

impl Vcpu {
    pub(super) fn handle_rdmsr(&mut self, shared: &Shared, index: u32) {
        let value = super::async_pf::x86::rdmsr(self, shared, index)
            .or_else(|| super::kvmclock::rdmsr(self, shared, index))
            .or_else(|| super::steal::rdmsr(self, index))
            .or_else(|| super::pv_eoi::rdmsr(self, index))
            .or_else(|| msr_entry(index).and_then(|e| (e.read)(&self.cpu)))
            .or_else(|| self.cpu.state().mce.read(index));
        match value {
            Some(value) => self.cpu.complete_rdmsr(value),
            None => self.cpu.inject_event(gp_fault()),
        }
    }

    pub(super) fn handle_wrmsr(
        &mut self,
        shared: &mut Shared,
        index: u32,
        value: u64,
    ) -> Result<(), VmError> {
        let ok = match super::async_pf::x86::wrmsr(self, shared, index, value)? {
            Some(ok) => ok,
            None => match super::kvmclock::wrmsr(self, shared, index, value)? {
                Some(ok) => ok,
                None => match super::steal::wrmsr(self, shared, index, value)? {
                    Some(ok) => ok,
                    None => match super::pv_eoi::wrmsr(self, shared, index, value) {
                        Some(ok) => ok,
                        None => match msr_entry(index) {
                            Some(e) => (e.write)(&mut self.cpu, value),
                            // The machine-check registers (KVM offers them).
                            None => self.cpu.state_mut().mce.write(index, value),
                        },
                    },
                },
            },
        };
        if ok && index == msr::TSC {
            // The TSC moved: kvmclock's time info must follow it.
            super::kvmclock::update_time_info(self, shared)?;
        }
        if ok {
            self.cpu.skip_instruction();
        } else {
            self.cpu.inject_event(gp_fault());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use machine::CpuConfig;

    fn cpu() -> Cpu {
        let mut cpu = Cpu::new(CpuConfig::default());
        cpu.set_vmx(Some(machine::VmxControls::default()));
        cpu.state_mut().efer = efer::LME | efer::LMA;
        cpu
    }

    #[test]
    fn efer_keeps_long_mode_and_ignores_lma_writes() {
        let mut cpu = cpu();
        let e = msr_entry(msr::EFER).unwrap();
        assert!((e.write)(&mut cpu, efer::LME | efer::NXE | efer::SCE));
        assert_eq!(
            (e.read)(&cpu),
            Some(efer::LME | efer::LMA | efer::NXE | efer::SCE)
        );
        assert!(
            !(e.write)(&mut cpu, 0),
            "clearing LME with paging on is refused"
        );
        assert!(!(e.write)(&mut cpu, efer::LME | (1 << 20)), "reserved bit");
        // LMA is read-only: writing it clear is ignored, not refused.
        assert!((e.write)(&mut cpu, efer::LME));
        assert_ne!(cpu.state().efer & efer::LMA, 0);
    }

    #[test]
    fn lme_changes_only_with_paging_off() {
        let mut cpu = cpu();
        cpu.state_mut().efer = 0;
        cpu.state_mut().cr0 = cr0::PE;
        let e = msr_entry(msr::EFER).unwrap();
        assert!((e.write)(&mut cpu, efer::LME), "a 32-bit boot sets LME");
        assert_eq!(cpu.state().efer, efer::LME, "LMA stays the CPU's");
        assert!((e.write)(&mut cpu, 0), "and may clear it again");
        cpu.state_mut().cr0 = cr0::PE | cr0::PG;
        assert!(!(e.write)(&mut cpu, efer::LME), "not with paging on");
    }

    #[test]
    fn tsc_writes_set_the_offset_and_unknown_msrs_are_absent() {
        let mut cpu = cpu();
        cpu.advance_cycles(1000);
        let e = msr_entry(msr::TSC).unwrap();
        assert!((e.write)(&mut cpu, 5000));
        assert_eq!(cpu.vmx().unwrap().tsc_offset, 4000);
        assert_eq!((e.read)(&cpu), Some(5000));
        assert!(msr_entry(0xdead_beef).is_none());
        for m in PASSTHROUGH_MSRS {
            assert!(msr_entry(m).is_none(), "{m:#x} never exits");
        }
    }

    #[test]
    fn arch_capabilities_says_not_susceptible_and_refuses_writes() {
        let mut cpu = cpu();
        let e = msr_entry(msr::ARCH_CAPABILITIES).unwrap();
        let v = (e.read)(&cpu).unwrap();
        // Linux's cpu_set_bug_bits: RDCL_NO turns off page-table
        // isolation, MDS_NO the VERW on every return to user mode.
        assert_ne!(v & arch_capabilities::RDCL_NO, 0);
        assert_ne!(v & arch_capabilities::MDS_NO, 0);
        // IBRS_ALL (bit 1) and RSBA (bit 2) describe predictors the
        // machine does not have: never set.
        assert_eq!(v & 0b110, 0);
        assert!(!(e.write)(&mut cpu, v));
        // Enumerated in CPUID.7.0:EDX[29], which Linux checks first.
        let [_, _, _, edx] = crate::cpuid::guest_cpuid(7, 0, 0, 0);
        assert_ne!(edx & (1 << 29), 0);
    }

    #[test]
    fn the_microcode_revision_reads_as_kvm_reports_it_and_writes_are_ignored() {
        let mut cpu = cpu();
        let e = msr_entry(MSR_IA32_UCODE_REV).unwrap();
        assert!((e.write)(&mut cpu, 0), "Linux writes 0 before CPUID");
        assert_eq!((e.read)(&cpu), Some(1 << 32));
    }
}
