//! The EPT-violation handler: demand paging of guest RAM.
//!
//! 1. Look up the memslot of the faulting gfn; none means the guest touched
//!    guest-physical memory it does not have, which stops the VM.
//! 2. Find (or allocate and zero) the host frame backing the page.
//! 3. Under `mmu_lock`, walk the EPT tables (allocating missing ones) and
//!    install a 4 KiB leaf, recording it in the rmap.
//!
//! No INVEPT is needed here: the fault replaced a not-present entry, and
//! the CPU caches no translation for a not-present entry. INVEPT is issued
//! where a present spte is removed or restricted (`Vm::delete_memslot`).

use super::{spte, tdp, Mmu};
use crate::cost::HvCosts;
use crate::frames::{frame_hpa, FrameAllocator, OutOfFrames};
use crate::memslot::Memslots;
use machine::vmx::ept_qual;
use machine::{Gpa, MemError, PhysMemory};
use thiserror::Error;

/// Why an EPT violation could not be fixed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FaultError {
    #[error("guest access outside its memory at gpa {gpa}")]
    OutsideMemory { gpa: Gpa },
    #[error("guest write to read-only memory at gpa {gpa}")]
    ReadOnly { gpa: Gpa },
    #[error("backing guest memory: {0}")]
    OutOfFrames(#[from] OutOfFrames),
    #[error("EPT tables: {0}")]
    Tdp(#[from] tdp::TdpError),
    #[error("host memory: {0:?}")]
    Memory(MemError),
}

impl From<MemError> for FaultError {
    fn from(e: MemError) -> Self {
        FaultError::Memory(e)
    }
}

/// What the handler did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultOutcome {
    /// Virtual cycles the work costs (charged to the faulting vCPU).
    pub cycles: u64,
    /// A new spte was installed (false: another vCPU already had).
    pub installed: bool,
    /// A guest frame was allocated and zeroed (first touch of the page).
    pub allocated: bool,
    /// EPT tables allocated on the way down.
    pub tables_allocated: u64,
}

/// Handles an EPT violation at `gpa` with exit qualification `qual`.
pub fn handle_ept_violation(
    mem: &PhysMemory,
    frames: &mut FrameAllocator,
    slots: &mut Memslots,
    mmu: &Mmu,
    costs: &HvCosts,
    gpa: Gpa,
    qual: u64,
) -> Result<FaultOutcome, FaultError> {
    let mut out = FaultOutcome {
        cycles: costs.memslot_lookup,
        ..FaultOutcome::default()
    };
    let gfn = gpa.frame();
    let slot = slots
        .lookup_mut(gfn)
        .ok_or(FaultError::OutsideMemory { gpa })?;
    let writable = !slot.flags.readonly;
    if qual & ept_qual::WRITE != 0 && !writable {
        return Err(FaultError::ReadOnly { gpa });
    }
    let frame = match slot.backing(gfn) {
        Some(frame) => frame,
        None => {
            let frame = frames.alloc()?;
            mem.zero(frame_hpa(frame), machine::addr::PAGE_SIZE)?;
            slot.set_backing(gfn, frame);
            out.allocated = true;
            out.cycles += costs.frame_alloc + costs.zero_4k;
            frame
        }
    };

    out.cycles += costs.lock_acquire;
    let mut guard = mmu.lock();
    let inner = &mut *guard;
    let mut work = tdp::WalkWork::default();
    let leaf = inner.root.leaf_for(mem, frames, gfn, &mut work)?;
    out.tables_allocated = work.tables_allocated;
    out.cycles += work.entries_read * costs.spte_read
        + work.tables_allocated * (costs.frame_alloc + costs.zero_4k + costs.spte_write);
    let current = tdp::read_spte(mem, leaf)?;
    out.cycles += costs.spte_read;
    if spte::is_present(current) {
        // Raced with another fault on the same gfn, which installed it.
        return Ok(out);
    }
    tdp::write_spte(
        mem,
        leaf,
        spte::make_leaf(frame_hpa(frame).0, writable, true),
    )?;
    inner.rmap.add(frame, leaf);
    out.cycles += costs.spte_write;
    out.installed = true;
    Ok(out)
}
