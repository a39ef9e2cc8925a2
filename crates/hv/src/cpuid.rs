//! The guest's CPUID: the machine's processor with the hypervisor bit and
//! KVM's paravirtual leaves.
//!
//! `machine::cpu::system::native_cpuid` is private to the machine, so the
//! leaves are restated here; they describe what the machine implements
//! (x2APIC, TSC-deadline, POPCNT, SMEP/SMAP, NX, SYSCALL, 1 GiB pages,
//! RDTSCP, long mode) and no SSE/x87, which the machine does not run.

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
    const VENDOR: [u32; 3] = [0x756e_6547, 0x4965_6e69, 0x6c65_746e]; // GenuineIntel
    match leaf {
        0 => [0xb, VENDOR[0], VENDOR[2], VENDOR[1]],
        1 => {
            let eax = 0x0005_0654;
            let ebx = (apic_id << 24) | (1 << 16) | (8 << 8);
            let ecx = (1 << 21) | (1 << 23) | (1 << 24) | HYPERVISOR_BIT;
            // TSC, MSR, PAE, APIC, PGE, CMOV, PAT, CLFSH.
            let edx = (1 << 4)
                | (1 << 5)
                | (1 << 6)
                | (1 << 9)
                | (1 << 13)
                | (1 << 15)
                | (1 << 16)
                | (1 << 19);
            [eax, ebx, ecx, edx]
        }
        7 if subleaf == 0 => [0, (1 << 7) | (1 << 20), 0, 0],
        0xb => [
            0,
            1,
            (subleaf & 0xff) | if subleaf == 0 { 1 << 8 } else { 0 },
            apic_id,
        ],
        0x4000_0000 => [
            0x4000_0001,
            KVM_SIGNATURE[0],
            KVM_SIGNATURE[1],
            KVM_SIGNATURE[2],
        ],
        0x4000_0001 => [KVM_FEATURES, 0, 0, 0],
        0x8000_0000 => [0x8000_0008, 0, 0, 0],
        0x8000_0001 => [
            0,
            0,
            1 | (1 << 5),
            (1 << 11) | (1 << 20) | (1 << 26) | (1 << 27) | (1 << 29),
        ],
        0x8000_0008 => [
            machine::mmu::paging::MAX_PHYS_ADDR_BITS | (48 << 8),
            0,
            0,
            0,
        ],
        _ => [0; 4],
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
