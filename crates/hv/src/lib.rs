//! faultline's hypervisor: VMs and vCPUs over the machine's VMX interface.
//!
//! The public face is small: [`Vm`] and its configuration, what a run
//! returns, statistics, the async-PF and swap-device settings, and the
//! errors. Everything else is crate-private; `docs/design.md` and
//! `docs/mmu.md` describe the inside.
//!
//! The modules stand on floors; a module uses only its own floor and the
//! ones below, and no two modules use each other
//! (`crates/hv/tests/floors.rs` checks both):
//!
//! ```text
//! 5  loaders, snapshots   boot  linux  snapshot
//! 4  the VM               vm (state, scheduler, public API)
//! 3  vCPUs                devices < multiboot  stats < shared < vcpu
//! 2  async PF, errors     error < apf
//! 1  memory               swap < memslot < mmu < host < pager < fault
//! 0  vocabulary           ids  time  cost  frames  cpuid  image
//! ```
//!
//! - `ids.rs`, `time.rs`, `cost.rs`, `frames.rs`, `cpuid.rs`: vCPU ids,
//!   virtual time, the cost table, the host frame pool, CPUID leaves;
//!   `image/`: the boot layout, a kernel image's place in RAM and why an
//!   image cannot be booted (the bzImage header parser with it);
//! - `swap/`, `memslot.rs` (with each slot's dirty bitmap), `mmu/` (roots,
//!   page headers, the leaf install, shadow paging, the fast page fault,
//!   the notifier API the pager uses, the TDP iterator, the invariant
//!   checker), `host.rs` (the bundle of host memory, frames, memslots and
//!   MMU), `pager.rs` (overcommit: eviction and page-in), `fault.rs` (the
//!   EPT-violation path: pager, then MMU);
//! - `error.rs`: why a running VM stops; `apf/`: asynchronous page
//!   faults' state and register rules;
//! - `devices/`: the platform; `multiboot.rs`: the multiboot image
//!   parser; `stats.rs`: the counters (exits in a table
//!   indexed by `ExitReason`); `shared.rs`: the state every vCPU works on;
//!   `vcpu/`: a vCPU, its requests and its exit handlers by concern
//!   (`vcpu/async_pf/`: the async-PF policy and both guest protocols);
//! - `vm/`: the VM, the scheduler and its public API;
//! - `boot.rs` (with `Vm::boot`), `linux/`: the kernel loaders;
//!   `snapshot/`.

pub mod apf;
pub(crate) mod boot;
pub mod cost;
pub(crate) mod cpuid;
pub mod devices;
pub mod error;
pub(crate) mod fault;
pub(crate) mod frames;
pub(crate) mod host;
pub(crate) mod ids;
pub mod image;
pub mod linux;
pub mod memslot;
pub(crate) mod mmu;
pub mod multiboot;
pub mod pager;
pub(crate) mod shared;
pub mod snapshot;
pub mod stats;
pub mod swap;
pub(crate) mod time;
pub(crate) mod vcpu;
pub mod vm;

pub use apf::{ApfMode, ApfProtocol, ApfState, ApfStats, EventConfig};
pub use boot::{parse_kernel, KernelError, KernelImage, MAX_GUEST_MEM};
pub use cost::HvCosts;
pub use devices::DeviceSet;
pub use error::{ApfStateError, GuestMemoryError, VmError};
/// Translate guest code on a host thread of its own (see
/// `machine::jit::background`): host time only, results unchanged.
pub use machine::jit::background::set_enabled as translate_in_background;
pub use machine::{CycleCosts, Engine, Gfn, Gpa, NamedCosts};
pub use memslot::{MemslotError, SlotFlags, SlotId};
pub use mmu::check::InvariantError;
pub use mmu::dirty_log::{DirtyGfn, DirtyLogError, DirtyLogMode};
pub use mmu::fast_pf::MmuOptions;
pub use mmu::shadow::cr3_cache::Cr3CacheStats;
pub use mmu::spte;
pub use mmu::zap::{SeedWork, ZapError, ZapMode, ZapReport, BATCH_ZAP_PAGES, SEED_HASH_BYTES};
pub use mmu::{shadow::ShadowError, shadow::ShadowStats, MmuMode};
pub use pager::{PageSource, PagerError, PagerStats};
pub use stats::{ExitReason, ExitStat, ExitTable, MmuLockStats, VcpuStats, VmStats};
pub use swap::{DeviceModel, DevicePreset, DeviceStats, LatencyRange};
pub use time::Cycles;
pub use vcpu::{Vcpu, VcpuId};
pub use vm::dirty_log::{Collected, DirtyLogCost, DirtyPages, RingHarvest};
pub use vm::{
    max_lookahead, ram_ranges, CreateError, Report, RunStatus, StopReason, Vm, VmConfig,
    DEFAULT_HOST_SLICE, HIGH_RAM_SLOT, HIGH_RAM_START, MIN_HOST_MEM, PCI_HOLE_START, RAM_SLOT,
};

/// Virtual cycles per second of virtual time (the machine's 3 GHz clock).
pub const CYCLES_PER_SECOND: u64 = machine::cost::CYCLES_PER_SECOND;
