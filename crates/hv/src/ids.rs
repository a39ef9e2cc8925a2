//! Identifiers every floor of the hv names: the vocabulary leaf (it uses
//! nothing of the crate).

/// Identifier of a vCPU: its index in the VM (also its APIC id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VcpuId(pub usize);

impl std::fmt::Display for VcpuId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}
