//! The guest's CPUID: the machine's own processor (`machine::cpu::native_cpuid`:
//! x2APIC, TSC-deadline, POPCNT, SMEP/SMAP, NX, SYSCALL, 1 GiB pages, RDTSCP,
//! long mode, FPU, FXSR, SSE, SSE2, XSAVE with x87/SSE, IA32_ARCH_CAPABILITIES
//! with every "not susceptible" bit, PCID/INVPCID, which
//! the CPUID exit hides under shadow paging, `vcpu::cpuid`) plus the
//! hypervisor bit, KVM's paravirtual leaves, and what a guest needs to know
//! about time without calibrating: the TSC frequency (leaves 0x15 and 0x16,
//! as Intel reports it) and an always-running APIC timer (ARAT). The TSC
//! runs at [`crate::CYCLES_PER_SECOND`].
//!
//! No invariant TSC (leaf 0x80000007 EDX bit 8), as
//! QEMU does not advertise it by default: QEMU refuses to migrate a VM
//! with `invtsc` (the TSC's rate and value cannot be promised across
//! hosts), and faultline migrates VMs. Without it Linux keeps kvm-clock's
//! rating above the TSC's and uses **kvm-clock** as its clocksource on any
//! number of vCPUs (with it, `kvmclock_init` lowers kvm-clock to 299 and a
//! 1-vCPU Linux switches to `tsc`).

/// "KVMKVMKVM\0\0\0" as EBX, ECX, EDX.
const KVM_SIGNATURE: [u32; 3] = [0x4b4d_564b, 0x564b_4d56, 0x0000_004d];

/// Leaf 1 ECX: running under a hypervisor.
pub const HYPERVISOR_BIT: u32 = 1 << 31;
/// Leaf 6 EAX: the APIC timer runs in every C-state (ARAT).
pub const ARAT_BIT: u32 = 1 << 2;
/// The nominal core crystal clock of leaf 0x15 (Intel's 25 MHz).
const CRYSTAL_HZ: u32 = 25_000_000;

/// CPUID as the guest sees it: [EAX, EBX, ECX, EDX]. `kvm_features` is
/// leaf 0x40000001 EAX: only what the VM implements (`abi::KVM_FEATURE_*`).
pub fn guest_cpuid(leaf: u32, subleaf: u32, apic_id: u32, kvm_features: u32) -> [u32; 4] {
    match leaf {
        0 => {
            let mut r = machine::cpu::native_cpuid(leaf, subleaf, apic_id);
            r[0] = r[0].max(0x16);
            r
        }
        6 => [ARAT_BIT, 0, 0, 0],
        // TSC = crystal * EBX / EAX; ECX: the crystal in Hz.
        0x15 => [
            1,
            (crate::CYCLES_PER_SECOND / u64::from(CRYSTAL_HZ)) as u32,
            CRYSTAL_HZ,
            0,
        ],
        // Base and maximum frequency in MHz (bus: 100 MHz).
        0x16 => {
            let mhz = (crate::CYCLES_PER_SECOND / 1_000_000) as u32;
            [mhz, mhz, 100, 0]
        }
        // Advanced power management: nothing, in particular no invariant
        // TSC (module doc: migration).
        0x8000_0007 => [0, 0, 0, 0],
        1 => {
            let mut r = machine::cpu::native_cpuid(leaf, subleaf, apic_id);
            r[2] |= HYPERVISOR_BIT;
            r
        }
        0x4000_0000 => [
            0x4000_0001,
            KVM_SIGNATURE[0],
            KVM_SIGNATURE[1],
            KVM_SIGNATURE[2],
        ],
        0x4000_0001 => [kvm_features, 0, 0, 0],
        _ => machine::cpu::native_cpuid(leaf, subleaf, apic_id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Leaf 0x80000007 EDX: the TSC runs at a constant rate (invariant
    /// TSC), which the hv does not advertise (module doc).
    const INVARIANT_TSC_BIT: u32 = 1 << 8;

    #[test]
    fn kvm_signature_and_hypervisor_bit() {
        let [max, b, c, d] = guest_cpuid(0x4000_0000, 0, 0, 0);
        assert_eq!(max, 0x4000_0001);
        let mut sig = Vec::new();
        for r in [b, c, d] {
            sig.extend_from_slice(&r.to_le_bytes());
        }
        assert_eq!(&sig, b"KVMKVMKVM\0\0\0");
        assert_ne!(guest_cpuid(1, 0, 3, 0)[2] & HYPERVISOR_BIT, 0);
        assert_eq!(guest_cpuid(1, 0, 3, 0)[1] >> 24, 3);
        let features = abi::KVM_FEATURE_ASYNC_PF | abi::KVM_FEATURE_PV_UNHALT;
        assert_eq!(guest_cpuid(0x4000_0001, 0, 0, features)[0], features);
    }

    #[test]
    fn the_tsc_frequency_is_reported_as_intel_does() {
        assert!(guest_cpuid(0, 0, 0, 0)[0] >= 0x16);
        let [den, num, crystal, _] = guest_cpuid(0x15, 0, 0, 0);
        let hz = u64::from(crystal) * u64::from(num) / u64::from(den);
        assert_eq!(hz, crate::CYCLES_PER_SECOND);
        assert_eq!(
            u64::from(guest_cpuid(0x16, 0, 0, 0)[0]) * 1_000_000,
            crate::CYCLES_PER_SECOND
        );
        assert_ne!(guest_cpuid(6, 0, 0, 0)[0] & ARAT_BIT, 0);
        // No invariant TSC: Linux keeps kvm-clock, and the VM can migrate.
        assert_eq!(guest_cpuid(0x8000_0007, 0, 0, 0)[3] & INVARIANT_TSC_BIT, 0);
        // TSC-deadline comes from the machine.
        assert_ne!(guest_cpuid(1, 0, 0, 0)[2] & (1 << 24), 0);
    }
}
