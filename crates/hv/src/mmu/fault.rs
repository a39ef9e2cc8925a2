//! Installing a guest page's mapping after an EPT violation.
//!
//! The VM (`vm.rs`) finds the frame behind the faulting gfn: allocated and
//! zeroed on first touch, read back from swap, or already resident (see
//! `pager.rs`). This module then takes `mmu_lock`, walks the EPT tables
//! (allocating missing ones) and installs a 4 KiB leaf, recording it in
//! the rmap.
//!
//! No INVEPT is needed here: the fault replaced a not-present entry, and
//! the CPU caches no translation for a not-present entry. INVEPT is issued
//! where a present spte is removed or restricted (memslot deletion,
//! eviction).

use super::{spte, tdp, Mmu};
use crate::cost::HvCosts;
use crate::frames::{frame_hpa, FrameAllocator, OutOfFrames};
use machine::{Gfn, Gpa, Hfn, MemError, PhysMemory};
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
    /// EPT tables allocated on the way down.
    pub tables_allocated: u64,
    /// Virtual cycles spent waiting for `mmu_lock` (included in `cycles`).
    pub lock_wait: u64,
}

/// Maps `gfn` to `frame` (writable or not) for a vCPU whose clock reads
/// `now`, under `mmu_lock` with its contention modelled.
#[allow(clippy::too_many_arguments)]
pub fn install_mapping(
    now: u64,
    mem: &PhysMemory,
    frames: &mut FrameAllocator,
    mmu: &Mmu,
    costs: &HvCosts,
    gfn: Gfn,
    frame: Hfn,
    writable: bool,
) -> Result<FaultOutcome, FaultError> {
    let mut out = FaultOutcome {
        cycles: costs.lock_acquire,
        ..FaultOutcome::default()
    };
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
    gfn: Gfn,
    frame: Hfn,
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
    use crate::mmu::tdp::TdpRoot;

    struct Fixture {
        mem: PhysMemory,
        frames: FrameAllocator,
        mmu: Mmu,
    }

    fn fixture() -> Fixture {
        let mem = PhysMemory::new(256 * 4096).unwrap();
        let mut frames = FrameAllocator::new(Hfn(1), Hfn(256));
        let mmu = Mmu::new(TdpRoot::new(&mem, &mut frames).unwrap());
        Fixture { mem, frames, mmu }
    }

    fn map(f: &mut Fixture, now: u64, gfn: u64, frame: u64) -> FaultOutcome {
        install_mapping(
            now,
            &f.mem,
            &mut f.frames,
            &f.mmu,
            &HvCosts::DEFAULT,
            Gfn(gfn),
            Hfn(frame),
            true,
        )
        .unwrap()
    }

    #[test]
    fn installs_a_writable_spte_once_and_records_it_in_the_rmap() {
        let mut f = fixture();
        let out = map(&mut f, 0, 3, 200);
        assert!(out.installed);
        assert_eq!(out.tables_allocated, 3);
        let leaf = f
            .mmu
            .lock()
            .root
            .find_leaf(&f.mem, Gfn(3))
            .unwrap()
            .unwrap();
        let spte = tdp::read_spte(&f.mem, leaf).unwrap();
        assert_eq!(spte::hpa(spte), frame_hpa(Hfn(200)).0);
        assert_eq!(spte & spte::RWX, spte::RWX);
        assert_eq!(f.mmu.lock().rmap.get(Hfn(200)), &[leaf]);
        let again = map(&mut f, 0, 3, 200);
        assert!(!again.installed, "already present");
        let ro = install_mapping(
            0,
            &f.mem,
            &mut f.frames,
            &f.mmu,
            &HvCosts::DEFAULT,
            Gfn(4),
            Hfn(201),
            false,
        )
        .unwrap();
        assert!(ro.installed);
        let leaf = f
            .mmu
            .lock()
            .root
            .find_leaf(&f.mem, Gfn(4))
            .unwrap()
            .unwrap();
        assert_eq!(tdp::read_spte(&f.mem, leaf).unwrap() & spte::WRITE, 0);
    }

    #[test]
    fn simultaneous_faults_contend_for_mmu_lock_in_virtual_time() {
        let mut f = fixture();
        let first = map(&mut f, 1000, 1, 201);
        assert_eq!(first.lock_wait, 0);
        // Another vCPU faulting at the same virtual time waits for the hold.
        let second = map(&mut f, 1000, 2, 202);
        assert!(second.lock_wait > 0, "{second:?}");
        // Much later: no wait.
        let third = map(&mut f, 1_000_000, 4, 203);
        assert_eq!(third.lock_wait, 0);
        assert_eq!(f.mmu.lock().timeline.contended, 1);
    }
}
