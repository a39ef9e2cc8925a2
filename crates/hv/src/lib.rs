//! faultline's hypervisor: VMs and vCPUs over the machine's VMX interface.
//!
//! The public face is small: [`Vm`] and its configuration, what a run
//! returns, statistics, the async-PF and swap-device settings, and the
//! errors. Everything else is crate-private; `docs/design.md` and
//! `docs/mmu.md` describe the inside:
//! - `vm/`: the VM (shared state, the scheduler) and its public API;
//! - `vcpu/`: a vCPU, its requests and its exit handlers by concern;
//! - `mmu/`: the EPT MMU (roots, page headers, the fault path, the notifier
//!   API the pager uses, the TDP iterator, the invariant checker);
//! - `apf/`: asynchronous page faults (state, policy, both protocols,
//!   save/restore);
//! - `pager.rs`, `swap/`: host memory overcommit;
//! - `memslot.rs`, `frames.rs`, `host.rs`, `boot.rs`, `cpuid.rs`,
//!   `cost.rs`, `time.rs`.

pub mod apf;
pub(crate) mod boot;
pub mod cost;
pub(crate) mod cpuid;
pub mod devices;
pub mod error;
pub(crate) mod frames;
pub(crate) mod host;
pub mod linux;
pub mod memslot;
pub(crate) mod mmu;
pub mod multiboot;
pub mod pager;
pub mod snapshot;
pub mod stats;
pub mod swap;
pub(crate) mod time;
pub(crate) mod vcpu;
pub mod vm;

pub use apf::{ApfMode, ApfProtocol, ApfState, ApfStats, EventConfig};
pub use boot::{parse_kernel, KernelError, KernelImage, MAX_GUEST_MEM};
pub use cost::HvCosts;
pub use error::{ApfStateError, CreateError, GuestMemoryError, VmError};
pub use machine::{CycleCosts, Engine, Gfn, Gpa, NamedCosts};
pub use memslot::{MemslotError, SlotFlags, SlotId};
pub use mmu::check::InvariantError;
pub use mmu::dirty_log::{DirtyGfn, DirtyLogError, DirtyLogMode};
pub use mmu::fast_pf::MmuOptions;
pub use mmu::shadow::cr3_cache::Cr3CacheStats;
pub use mmu::spte;
pub use mmu::zap::{ZapError, ZapMode, ZapReport, BATCH_ZAP_PAGES};
pub use mmu::{shadow::ShadowError, shadow::ShadowStats, MmuMode};
pub use pager::{PageSource, PagerError, PagerStats};
pub use stats::{ExitStat, MmuLockStats, VcpuStats, VmStats};
pub use swap::{DeviceModel, DevicePreset, DeviceStats, LatencyRange};
pub use time::Cycles;
pub use vcpu::steal::cycles_to_ns as steal_cycles_to_ns;
pub use vcpu::{Vcpu, VcpuId};
pub use vm::dirty_log::{Collected, DirtyLogCost, DirtyPages, RingHarvest};
pub use vm::{
    max_lookahead, Report, RunStatus, StopReason, Vm, VmConfig, DEFAULT_HOST_SLICE, MIN_HOST_MEM,
    RAM_SLOT,
};

/// Virtual cycles per second of virtual time (the machine's 3 GHz clock).
pub const CYCLES_PER_SECOND: u64 = machine::cost::CYCLES_PER_SECOND;
