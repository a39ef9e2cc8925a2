//! The host side of a VM: its host-physical memory, the frame allocator,
//! the memslots, the MMU and the cost table. Everything here is shared by
//! the vCPUs; the pager works on it (`pager.rs`) and the fault path maps
//! through it (`mmu/fault.rs`).

use crate::cost::HvCosts;
use crate::frames::FrameAllocator;
use crate::memslot::Memslots;
use crate::mmu::Mmu;
use machine::PhysMemory;

/// The host state behind guest memory.
#[derive(Debug)]
pub(crate) struct Host {
    pub mem: PhysMemory,
    pub frames: FrameAllocator,
    pub slots: Memslots,
    pub mmu: Mmu,
    pub costs: HvCosts,
}
