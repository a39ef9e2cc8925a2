//! Errors: one enum per operation.

use crate::fault::FaultError;
use crate::frames::OutOfFrames;
use crate::ids::VcpuId;
use crate::mmu::root::RootError;
use crate::pager::PagerError;
use machine::cpu::triple_fault::TripleFaultCause;
use machine::{Gpa, MemError};
use thiserror::Error;

/// An hv access to guest-physical memory failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GuestMemoryError {
    #[error("gpa {0} is outside every memslot")]
    Unmapped(Gpa),
    #[error("{0}")]
    OutOfFrames(#[from] OutOfFrames),
    #[error("host memory: {0:?}")]
    Host(MemError),
    #[error("{0}")]
    Pager(#[from] PagerError),
}

impl From<MemError> for GuestMemoryError {
    fn from(e: MemError) -> Self {
        GuestMemoryError::Host(e)
    }
}

/// Why a running VM stopped with an error. Every variant names the vCPU
/// and the guest RIP where it happened.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum VmError {
    #[error("vCPU {vcpu}: triple fault at rip {rip:#x}: {}", triple_fault_cause(.cause))]
    TripleFault {
        vcpu: VcpuId,
        rip: u64,
        /// The exception that began the chain and the one that made the
        /// double fault undeliverable.
        cause: Option<TripleFaultCause>,
    },
    #[error("vCPU {vcpu}: guest access outside its memory at gpa {gpa:#x}, rip {rip:#x}")]
    OutsideMemory { vcpu: VcpuId, gpa: Gpa, rip: u64 },
    #[error("vCPU {vcpu}: EPT violation at gpa {gpa:#x}, rip {rip:#x}: {source}")]
    EptFault {
        vcpu: VcpuId,
        gpa: Gpa,
        rip: u64,
        source: FaultError,
    },
    #[error("vCPU {vcpu}: EPT misconfiguration at gpa {gpa:#x}, rip {rip:#x} (an hv bug)")]
    EptMisconfig { vcpu: VcpuId, gpa: Gpa, rip: u64 },
    #[error("vCPU {vcpu}: machine error {error:?} at rip {rip:#x}")]
    Machine {
        vcpu: VcpuId,
        rip: u64,
        error: MemError,
    },
    #[error("vCPU {vcpu}: unsupported VM exit `{exit}` at rip {rip:#x}")]
    UnsupportedExit {
        vcpu: VcpuId,
        rip: u64,
        exit: String,
    },
    #[error("vCPU {vcpu}: the hv could not access guest memory at rip {rip:#x}: {source}")]
    GuestMemory {
        vcpu: VcpuId,
        rip: u64,
        source: GuestMemoryError,
    },
    #[error("vCPU {vcpu}: loading its EPT root: {source}")]
    Root { vcpu: VcpuId, source: RootError },
    #[error("vCPU {vcpu}: shadow MMU at rip {rip:#x}: {source}")]
    Shadow {
        vcpu: VcpuId,
        rip: u64,
        source: crate::mmu::shadow::ShadowError,
    },
    #[error("every vCPU is halted with nothing to wake it (virtual time {cycles} cycles)")]
    AllHalted { cycles: u64 },
    #[error("vCPU {vcpu}: paging in gpa {gpa:#x} at rip {rip:#x}: {source}")]
    Pager {
        vcpu: VcpuId,
        gpa: Gpa,
        rip: u64,
        source: PagerError,
    },
}

fn triple_fault_cause(cause: &Option<TripleFaultCause>) -> String {
    match cause {
        Some(c) => c.to_string(),
        None => "the guest could not deliver a double fault".to_string(),
    }
}

/// Setting a vCPU's APF state (a VMM restoring it) failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ApfStateError {
    #[error("no vCPU {0}")]
    NoSuchVcpu(usize),
    #[error("the state enables the {wanted} protocol but this VM runs {running}")]
    WrongProtocol {
        wanted: &'static str,
        running: String,
    },
    #[error("invalid APF state: {0}")]
    Invalid(String),
}
