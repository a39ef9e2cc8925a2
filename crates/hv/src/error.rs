//! Errors: one enum per operation.

use crate::boot::KernelError;
use crate::frames::OutOfFrames;
use crate::memslot::MemslotError;
use crate::mmu::fault::FaultError;
use crate::mmu::root::RootError;
use crate::pager::PagerError;
use crate::swap::SwapError;
use crate::vcpu::VcpuId;
use machine::cpu::triple_fault::TripleFaultCause;
use machine::memory::MemCreateError;
use machine::{Gpa, MemError};
use thiserror::Error;

/// Creating a VM failed.
#[derive(Debug, Error)]
pub enum CreateError {
    #[error("a VM needs 1 to {max} vCPUs, not {0}", max = abi::MAX_CPUS)]
    BadVcpuCount(u32),
    #[error("a VM needs at least one host CPU, not {0}")]
    BadHostCpus(u32),
    #[error("the host time slice must be above zero")]
    BadHostSlice,
    #[error("guest memory must be a multiple of 2 MiB between 2 MiB and {max} bytes, not {0}", max = crate::boot::MAX_GUEST_MEM)]
    BadMemSize(u64),
    #[error("command line of {0} bytes is too long (at most {max})", max = abi::CMDLINE_LEN - 1)]
    CmdlineTooLong(usize),
    #[error("allocating host memory: {0}")]
    HostMemory(#[from] MemCreateError),
    #[error("kernel image: {0}")]
    Kernel(#[from] KernelError),
    #[error("multiboot kernel: {0}")]
    Multiboot(#[from] crate::multiboot::MultibootError),
    #[error("Linux kernel: {0}")]
    Linux(#[from] crate::linux::LinuxBootError),
    #[error("building the EPT root: {0}")]
    Root(#[from] RootError),
    #[error("writing guest memory during boot: {0}")]
    GuestMemory(#[from] GuestMemoryError),
    #[error("memslot: {0}")]
    Memslot(#[from] MemslotError),
    #[error("{0}")]
    Swap(#[from] SwapError),
    #[error("host memory of {host_mem} bytes is too small (at least {min})")]
    HostMemTooSmall { host_mem: u64, min: u64 },
    #[error("the CR3-target count must be 1 to {max}, not {0}", max = abi::CR3_CACHE_MAX)]
    BadCr3Targets(usize),
    #[error("--mmu none (no memory virtualisation) cannot run with {0}")]
    Native(&'static str),
}

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
