//! The guest's CPUID: the machine's own processor (`machine::cpu::native_cpuid`:
//! x2APIC, TSC-deadline, POPCNT, SMEP/SMAP, NX, SYSCALL, 1 GiB pages, RDTSCP,
//! long mode; no SSE/x87, which the machine does not run) plus the
//! hypervisor bit and KVM's paravirtual leaves.

/// "KVMKVMKVM\0\0\0" as EBX, ECX, EDX.
const KVM_SIGNATURE: [u32; 3] = [0x4b4d_564b, 0x564b_4d56, 0x0000_004d];

/// KVM_FEATURE_PV_UNHALT: KVM_HC_KICK_CPU wakes a halted vCPU.
pub const KVM_FEATURE_PV_UNHALT: u32 = 1 << 7;

/// Feature bits of leaf 0x40000001: only what the hv implements.
pub const KVM_FEATURES: u32 = KVM_FEATURE_PV_UNHALT;

/// Leaf 1 ECX: running under a hypervisor.
pub const HYPERVISOR_BIT: u32 = 1 << 31;

/// CPUID as the guest sees it: [EAX, EBX, ECX, EDX].
pub fn guest_cpuid(leaf: u32, subleaf: u32, apic_id: u32) -> [u32; 4] {
    match leaf {
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
        0x4000_0001 => [KVM_FEATURES, 0, 0, 0],
        _ => machine::cpu::native_cpuid(leaf, subleaf, apic_id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kvm_signature_and_hypervisor_bit() {
        let [max, b, c, d] = guest_cpuid(0x4000_0000, 0, 0);
        assert_eq!(max, 0x4000_0001);
        let mut sig = Vec::new();
        for r in [b, c, d] {
            sig.extend_from_slice(&r.to_le_bytes());
        }
        assert_eq!(&sig, b"KVMKVMKVM\0\0\0");
        assert_ne!(guest_cpuid(1, 0, 3)[2] & HYPERVISOR_BIT, 0);
        assert_eq!(guest_cpuid(1, 0, 3)[1] >> 24, 3);
    }
}
