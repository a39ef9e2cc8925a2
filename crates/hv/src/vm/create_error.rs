//! Why creating a VM failed: its configuration, host memory, or the
//! kernel image it boots (the loaders' errors sit above the VM's own).

use crate::error::GuestMemoryError;
use crate::image::{KernelError, LinuxBootError, MAX_GUEST_MEM};
use crate::memslot::MemslotError;
use crate::mmu::root::RootError;
use crate::swap::SwapError;
use machine::memory::MemCreateError;
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
    #[error("guest memory must be a multiple of 2 MiB between 2 MiB and {max} bytes, not {0}", max = MAX_GUEST_MEM)]
    BadMemSize(u64),
    #[error("command line of {0} bytes is too long (at most {max})", max = abi::CMDLINE_LEN - 1)]
    CmdlineTooLong(usize),
    #[error("the own guest's BootInfo describes one RAM range from 0: at most {max:#x} bytes (below the PCI hole), not {0:#x}", max = crate::vm::PCI_HOLE_START)]
    RamBeyondHole(u64),
    #[error("allocating host memory: {0}")]
    HostMemory(#[from] MemCreateError),
    #[error("kernel image: {0}")]
    Kernel(#[from] KernelError),
    #[error("multiboot kernel: {0}")]
    Multiboot(#[from] crate::multiboot::MultibootError),
    #[error("Linux kernel: {0}")]
    Linux(#[from] LinuxBootError),
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
