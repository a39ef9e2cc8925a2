//! The guest's CPUID: the machine's own processor (`machine::cpu::native_cpuid`:
//! x2APIC, TSC-deadline, POPCNT, SMEP/SMAP, NX, SYSCALL, 1 GiB pages, RDTSCP,
//! long mode, FPU, FXSR, SSE, SSE2) plus the
//! hypervisor bit and KVM's paravirtual leaves.

/// "KVMKVMKVM\0\0\0" as EBX, ECX, EDX.
const KVM_SIGNATURE: [u32; 3] = [0x4b4d_564b, 0x564b_4d56, 0x0000_004d];

/// Leaf 1 ECX: running under a hypervisor.
pub const HYPERVISOR_BIT: u32 = 1 << 31;

/// CPUID as the guest sees it: [EAX, EBX, ECX, EDX]. `kvm_features` is
/// leaf 0x40000001 EAX: only what the VM implements (`abi::KVM_FEATURE_*`).
pub fn guest_cpuid(leaf: u32, subleaf: u32, apic_id: u32, kvm_features: u32) -> [u32; 4] {
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
        0x4000_0001 => [kvm_features, 0, 0, 0],
        _ => machine::cpu::native_cpuid(leaf, subleaf, apic_id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
