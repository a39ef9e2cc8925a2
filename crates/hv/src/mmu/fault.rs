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
    /// Virtual cycles spent waiting for `mmu_lock` (included in `cycles`).
    pub lock_wait: u64,
}

/// Handles an EPT violation at `gpa` with exit qualification `qual`,
/// taken by a vCPU whose clock reads `now`.
#[allow(clippy::too_many_arguments)]
pub fn handle_ept_violation(
    now: u64,
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
    let requested = now + out.cycles;
    let granted = inner.timeline.grant(requested);
    out.lock_wait = granted - requested;
    out.cycles += out.lock_wait;

    let mut held = 0;
    let result = install(
        mem, frames, inner, costs, gfn, frame, writable, &mut held, &mut out,
    );
    inner
        .timeline
        .record(granted, granted + held, out.lock_wait);
    out.cycles += held;
    result.map(|()| out)
}

/// The part of the fault under `mmu_lock`; `held` accumulates its cost.
#[allow(clippy::too_many_arguments)]
fn install(
    mem: &PhysMemory,
    frames: &mut FrameAllocator,
    inner: &mut super::MmuInner,
    costs: &HvCosts,
    gfn: machine::Gfn,
    frame: machine::Hfn,
    writable: bool,
    held: &mut u64,
    out: &mut FaultOutcome,
) -> Result<(), FaultError> {
    let mut work = tdp::WalkWork::default();
    let leaf = inner.root.leaf_for(mem, frames, gfn, &mut work)?;
    out.tables_allocated = work.tables_allocated;
    *held += work.entries_read * costs.spte_read
        + work.tables_allocated * (costs.frame_alloc + costs.zero_4k + costs.spte_write);
    let current = tdp::read_spte(mem, leaf)?;
    *held += costs.spte_read;
    if spte::is_present(current) {
        // Raced with another fault on the same gfn, which installed it.
        return Ok(());
    }
    tdp::write_spte(
        mem,
        leaf,
        spte::make_leaf(frame_hpa(frame).0, writable, true),
    )?;
    inner.rmap.add(frame, leaf);
    *held += costs.spte_write;
    out.installed = true;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memslot::SlotFlags;
    use crate::mmu::tdp::TdpRoot;
    use machine::{Gfn, Hfn};

    struct Fixture {
        mem: PhysMemory,
        frames: FrameAllocator,
        slots: Memslots,
        mmu: Mmu,
    }

    fn fixture() -> Fixture {
        let mem = PhysMemory::new(256 * 4096).unwrap();
        let mut frames = FrameAllocator::new(Hfn(1), Hfn(256));
        let mmu = Mmu::new(TdpRoot::new(&mem, &mut frames).unwrap());
        let mut slots = Memslots::default();
        slots.add(0, Gfn(0), 64, SlotFlags::default()).unwrap();
        slots
            .add(1, Gfn(64), 16, SlotFlags { readonly: true })
            .unwrap();
        Fixture {
            mem,
            frames,
            slots,
            mmu,
        }
    }

    fn fault(f: &mut Fixture, now: u64, gpa: u64, qual: u64) -> Result<FaultOutcome, FaultError> {
        handle_ept_violation(
            now,
            &f.mem,
            &mut f.frames,
            &mut f.slots,
            &f.mmu,
            &HvCosts::DEFAULT,
            Gpa(gpa),
            qual,
        )
    }

    #[test]
    fn first_touch_allocates_a_zeroed_frame_and_installs_a_writable_spte() {
        let mut f = fixture();
        let out = fault(&mut f, 0, 0x3008, ept_qual::WRITE).unwrap();
        assert!(out.installed && out.allocated);
        assert_eq!(out.tables_allocated, 3);
        let frame = f.slots.lookup(Gfn(3)).unwrap().backing(Gfn(3)).unwrap();
        let leaf = f
            .mmu
            .lock()
            .root
            .find_leaf(&f.mem, Gfn(3))
            .unwrap()
            .unwrap();
        let spte = tdp::read_spte(&f.mem, leaf).unwrap();
        assert_eq!(spte::hpa(spte), frame_hpa(frame).0);
        assert_eq!(spte & spte::RWX, spte::RWX);
        assert_eq!(f.mmu.lock().rmap.get(frame), &[leaf]);
        let again = fault(&mut f, 0, 0x3000, ept_qual::READ).unwrap();
        assert!(!again.installed && !again.allocated, "already present");
    }

    #[test]
    fn outside_every_memslot_and_readonly_writes_are_errors() {
        let mut f = fixture();
        assert_eq!(
            fault(&mut f, 0, 0x100_0000, ept_qual::READ),
            Err(FaultError::OutsideMemory {
                gpa: Gpa(0x100_0000)
            })
        );
        assert_eq!(
            fault(&mut f, 0, 64 << 12, ept_qual::WRITE),
            Err(FaultError::ReadOnly { gpa: Gpa(64 << 12) })
        );
        let ro = fault(&mut f, 0, 64 << 12, ept_qual::READ).unwrap();
        assert!(ro.installed);
    }

    #[test]
    fn simultaneous_faults_contend_for_mmu_lock_in_virtual_time() {
        let mut f = fixture();
        let first = fault(&mut f, 1000, 0x1000, ept_qual::READ).unwrap();
        assert_eq!(first.lock_wait, 0);
        // Another vCPU faulting at the same virtual time waits for the hold.
        let second = fault(&mut f, 1000, 0x2000, ept_qual::READ).unwrap();
        assert!(second.lock_wait > 0, "{second:?}");
        // Much later: no wait.
        let third = fault(&mut f, 1_000_000, 0x4000, ept_qual::READ).unwrap();
        assert_eq!(third.lock_wait, 0);
        assert_eq!(f.mmu.lock().timeline.contended, 1);
    }
}
