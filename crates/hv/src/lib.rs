//! faultline's hypervisor: VMs and vCPUs over the machine's VMX interface.
//!
//! - [`vm`]: the VM, exit handling and the deterministic vCPU scheduler;
//! - [`memslot`]: guest-physical ranges and their backing, with a generation;
//! - [`frames`]: the host frame allocator;
//! - [`mmu`]: the EPT MMU (spte layout, TDP tables, rmap, fault handler);
//! - [`boot`]: kernel ELF loading and the `abi` boot state;
//! - [`cpuid`]: the guest's CPUID with KVM's PV leaves;
//! - [`cost`]: virtual-cycle charges of hv work;
//! - [`stats`], [`error`].

pub mod apf;
pub mod boot;
pub mod cost;
pub mod cpuid;
pub mod error;
pub mod frames;
pub mod memslot;
pub mod mmu;
pub mod pager;
pub mod stats;
pub mod swap;
pub mod vm;

pub use error::{CreateError, GuestMemoryError, VmError};
/// Virtual cycles in a virtual second (the machine's clock rate), for
/// VMMs converting durations.
pub use machine::cost::CYCLES_PER_SECOND;
pub use vm::{Report, RunStatus, StopReason, Vm, VmConfig};
