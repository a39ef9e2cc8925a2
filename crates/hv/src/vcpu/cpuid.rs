//! The CPUID exit.

use super::Vcpu;
use crate::cpuid::guest_cpuid;
use machine::cpu::Gpr;

impl Vcpu {
    pub(super) fn handle_cpuid(&mut self, kvm_features: u32) {
        let s = self.cpu.state();
        let leaf = s.gpr[Gpr::Rax as usize] as u32;
        let subleaf = s.gpr[Gpr::Rcx as usize] as u32;
        let r = guest_cpuid(leaf, subleaf, self.cpu.apic().id(), kvm_features);
        let s = self.cpu.state_mut();
        for (reg, value) in [Gpr::Rax, Gpr::Rbx, Gpr::Rcx, Gpr::Rdx].into_iter().zip(r) {
            s.gpr[reg as usize] = value as u64;
        }
        self.cpu.skip_instruction();
    }
}
