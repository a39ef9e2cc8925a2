//! The CPUID exit.

use super::Vcpu;
use crate::cpuid::guest_cpuid;
use machine::apic::ApicMode;
use machine::cpu::Gpr;

/// CPUID.1:EDX bit 9: an enabled on-chip APIC.
const CPUID_1_EDX_APIC: u32 = 1 << 9;

impl Vcpu {
    pub(super) fn handle_cpuid(&mut self, kvm_features: u32) {
        let s = self.cpu.state();
        let leaf = s.gpr[Gpr::Rax as usize] as u32;
        let subleaf = s.gpr[Gpr::Rcx as usize] as u32;
        let cr4 = s.cr4;
        let r = guest_cpuid(leaf, subleaf, self.cpu.apic().id(), kvm_features);
        let mut r = machine::cpu::with_osxsave(leaf, r, cr4);
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
