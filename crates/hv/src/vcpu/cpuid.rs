//! The CPUID exit.

use super::Vcpu;
use crate::cpuid::guest_cpuid;
use machine::apic::ApicMode;
use machine::cpu::Gpr;

/// CPUID.1:EDX bit 9: an enabled on-chip APIC.
const CPUID_1_EDX_APIC: u32 = 1 << 9;
/// CPUID.1:ECX bit 17: PCID.
const CPUID_1_ECX_PCID: u32 = 1 << 17;
/// CPUID.(EAX=7,ECX=0):EBX bit 10: INVPCID.
const CPUID_7_EBX_INVPCID: u32 = 1 << 10;

impl Vcpu {
    pub(super) fn handle_cpuid(&mut self, kvm_features: u32) {
        let s = self.cpu.state();
        let leaf = s.gpr[Gpr::Rax as usize] as u32;
        let subleaf = s.gpr[Gpr::Rcx as usize] as u32;
        let cr4 = s.cr4;
        let r = guest_cpuid(leaf, subleaf, self.cpu.apic().id(), kvm_features);
        let mut r = machine::cpu::with_osxsave(leaf, r, cr4);
        let invpcid = self.cpu.vmx().is_some_and(|v| v.enable_invpcid);
        if !invpcid {
            // PCID and INVPCID only where the controls enable INVPCID
            // (not under shadow paging).
            match leaf {
                1 => r[2] &= !CPUID_1_ECX_PCID,
                7 => r[1] &= !CPUID_7_EBX_INVPCID,
                _ => {}
            }
        }
        if leaf == 1 && self.cpu.apic().mode() == ApicMode::Disabled {
            // CPUID.1:EDX.APIC follows IA32_APIC_BASE.EN (SDM Vol. 3A,
            // "Enabling or Disabling the Local APIC").
            r[3] &= !CPUID_1_EDX_APIC;
        }
        let s = self.cpu.state_mut();
        for (reg, value) in [Gpr::Rax, Gpr::Rbx, Gpr::Rcx, Gpr::Rdx].into_iter().zip(r) {
            s.gpr[reg as usize] = value as u64;
        }
        self.cpu.skip_instruction();
    }
}
