//! The EPT-violation path: from a faulting gpa to an installed spte.
//!
//! 1. Look the gfn up in the memslots (outside guest memory, or a write to
//!    a read-only slot, is an error).
//! 2. Find the frame behind it (KVM's `kvm_faultin_pfn`): resident already;
//!    allocated and zeroed on first touch; or on swap: the read is started
//!    (or found in flight) and, if it completes later than now, the fault
//!    ends with [`FaultOutcome::WaitForPage`] for the async-PF policy to
//!    decide how the vCPU waits. The pager may evict to make room (its
//!    holds of `mmu_lock` go through [`super::notifier`]).
//! 3. Install a 4 KiB leaf under `mmu_lock` ([`map_gfn`]), in the root the
//!    vCPU entered with, and record it in the rmap.
//!
//! The path never calls the policy and never flushes a TLB itself: it
//! returns what happened, and whether a remote TLB flush is needed (the
//! pager zapped or aged sptes), for the vCPU to request.
//!
//! No INVEPT is needed for the new spte: the fault replaced a not-present
//! entry, and the CPU caches no translation for a not-present entry.

use super::fast_pf::protocol::{fast_fix, Access, FastFix, Layout};
use super::lock::Timed;
use super::root::RootId;
use super::{spte, tdp, Mmu, MmuInner};
use crate::cost::HvCosts;
use crate::frames::{FrameAllocator, OutOfFrames};
use crate::host::Host;
use crate::memslot::PageState;
use crate::pager::{PageRef, Pager, PagerError, Work};
use crate::swap::SwapSlot;
use crate::time::Cycles;
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
    #[error("paging in gpa {gpa}: {source}")]
    Pager { gpa: Gpa, source: PagerError },
    #[error("page-in of gpa {gpa} vanished (an hv bug)")]
    PageInVanished { gpa: Gpa },
}

impl From<MemError> for FaultError {
    fn from(e: MemError) -> Self {
        FaultError::Memory(e)
    }
}

/// How a fault ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultOutcome {
    /// The spte is installed (or another vCPU had installed it): retry.
    Mapped,
    /// The page is on its way in from swap and arrives at `ready_at`: the
    /// vCPU must wait for it (how is the async-PF policy's choice).
    WaitForPage {
        gfn: Gfn,
        swap_slot: SwapSlot,
        ready_at: Cycles,
    },
}

/// What the fault did, for the vCPU to charge and count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fault {
    pub outcome: FaultOutcome,
    /// A first touch allocated a frame.
    pub frame_allocated: bool,
    /// The page was already being read in (a repeated fault).
    pub repeat: bool,
    /// sptes were zapped or aged: every vCPU must flush its TLB before
    /// running guest code again.
    pub flush: bool,
    /// Virtual cycles spent waiting for `mmu_lock`.
    pub lock_wait: Cycles,
    /// Of which behind a zap-all's teardown.
    pub zap_wait: Cycles,
}

/// The clock of one exit: `now` stamps the pager's work (the vCPU's clock
/// at the exit plus the exit's base charge) and `cycles` is what the exit
/// has charged so far; the fault adds to it, and takes `mmu_lock` at
/// `now + cycles`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExitClock {
    pub now: Cycles,
    pub cycles: Cycles,
}

impl ExitClock {
    /// The virtual time at which the next step happens.
    pub fn at(&self) -> Cycles {
        self.now + self.cycles
    }
}

/// Handles an EPT violation at `gpa` (`write`: the access was a write) by a
/// vCPU that entered with `root`.
pub(crate) fn page_fault(
    host: &mut Host,
    pager: &mut Pager,
    root: RootId,
    gpa: Gpa,
    write: bool,
    clock: &mut ExitClock,
) -> Result<Fault, FaultError> {
    let (mut fault, resident) = faultin(host, pager, gpa, write, clock)?;
    let Some(Resident {
        gfn,
        frame,
        rights,
        dirty_marked,
    }) = resident
    else {
        return Ok(fault);
    };
    let mapped = host.mmu.map_gfn(
        &host.mem,
        &mut host.frames,
        &host.costs,
        root,
        gfn,
        frame,
        rights,
        write,
        dirty_marked,
        clock.at(),
    );
    clock.cycles += mapped.cycles;
    fault.lock_wait = mapped.lock_wait;
    fault.zap_wait = mapped.zap_wait;
    mapped.result?;
    Ok(fault)
}

/// The frame a fault found, to be mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resident {
    pub gfn: Gfn,
    pub frame: Hfn,
    /// The write rights the new leaf gets.
    pub rights: LeafWrite,
    /// A write fault marked the page in its slot's dirty log (the bitmap
    /// bit or ring entry the hold charges, see [`locked_fault_work`]).
    pub dirty_marked: bool,
}

/// What KVM's slow path does inside `mmu_lock` around the spte itself
/// (the walk and the spte write are charged where they happen), in the
/// seed's KVM (3.x: `tdp_page_fault` / `FNAME(page_fault)` →
/// `__direct_map` / `FNAME(fetch)` → `mmu_set_spte` → `set_spte`):
/// `mmu_notifier_retry`; `mark_page_dirty` when the new spte is writable
/// (its memslot lookup, and the bitmap bit when the slot logs);
/// `kvm_release_pfn_clean` (the page reference `hva_to_pfn` took). Charged
/// to the hold, so it lengthens the lock's hold on the timeline and other
/// vCPUs wait behind it.
pub(crate) fn locked_fault_work(costs: &HvCosts, writable: bool, dirty_marked: bool) -> u64 {
    let mut cycles = costs.mmu_notifier_check + costs.host_page_release;
    if writable {
        cycles += costs.memslot_lookup;
    }
    if dirty_marked {
        cycles += costs.dirty_bit_set;
    }
    cycles
}

/// The write rights of a new leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeafWrite {
    /// A read-only memslot: no write bit at all.
    ReadOnly,
    /// Hardware W, MMU-writable and host-writable.
    Writable,
    /// Dirty logging write-protects the slot and the access is not a
    /// write: MMU-writable and host-writable, W clear, so the first write
    /// faults and is logged.
    LogProtected,
}

impl LeafWrite {
    /// The rights for a leaf of `slot` installed by an access (`write`).
    pub fn for_slot(slot: &crate::memslot::Memslot, write: bool) -> Self {
        if slot.flags.readonly {
            LeafWrite::ReadOnly
        } else if !write && slot.write_protected_for_log() {
            LeafWrite::LogProtected
        } else {
            LeafWrite::Writable
        }
    }

    /// Whether the memslot allows writes at all.
    pub fn host_writable(self) -> bool {
        self != LeafWrite::ReadOnly
    }

    /// The EPT leaf for `frame_hpa` with these rights.
    fn ept_leaf(self, frame_hpa: u64) -> u64 {
        let leaf = spte::make_leaf(frame_hpa, self.host_writable(), true);
        if self == LeafWrite::LogProtected {
            leaf & !spte::WRITE
        } else {
            leaf
        }
    }
}

/// Steps 1 and 2 of a fault (KVM's `kvm_faultin_pfn`): the frame behind
/// `gpa`, or the wait for it (`None`, with the outcome in the fault).
pub(crate) fn faultin(
    host: &mut Host,
    pager: &mut Pager,
    gpa: Gpa,
    write: bool,
    clock: &mut ExitClock,
) -> Result<(Fault, Option<Resident>), FaultError> {
    let costs = host.costs;
    let now = clock.now;
    let pager_error = |source| FaultError::Pager { gpa, source };
    // The memslot lookup, then the host side of the frame lookup (KVM's
    // `hva_to_pfn`: GUP-fast first, on every fault; a page that is not
    // resident costs the pager's work on top, standing for GUP's slow
    // path and the host's fault).
    clock.cycles += Cycles(costs.memslot_lookup + costs.host_pfn_lookup);
    let gfn = gpa.frame();
    let slot = host
        .slots
        .lookup(gfn)
        .ok_or(FaultError::OutsideMemory { gpa })?;
    let rights = LeafWrite::for_slot(slot, write);
    if write && !rights.host_writable() {
        return Err(FaultError::ReadOnly { gpa });
    }
    let page = PageRef {
        slot: slot.id,
        index: slot.index_of(gfn),
    };
    let mut fault = Fault {
        outcome: FaultOutcome::Mapped,
        frame_allocated: false,
        repeat: false,
        flush: false,
        lock_wait: Cycles::ZERO,
        zap_wait: Cycles::ZERO,
    };
    // The pager's work is the vCPU's; sptes it zapped or aged need a
    // remote flush (the INVEPT is charged here, issued before entry).
    let mut charge = |fault: &mut Fault, work: Work| {
        clock.cycles += work.cycles;
        if work.flush {
            fault.flush = true;
            clock.cycles += Cycles(costs.invept);
        }
    };
    let frame = match slot.state(gfn) {
        PageState::Resident(frame) => frame,
        PageState::Untouched => {
            let (frame, work) = pager
                .first_touch(host, page, gfn, now)
                .map_err(pager_error)?;
            charge(&mut fault, work);
            fault.frame_allocated = true;
            frame
        }
        PageState::Swapped(swap_slot) => {
            let read = match pager.in_flight(swap_slot) {
                Some(read) => {
                    fault.repeat = true;
                    read
                }
                None => {
                    let (read, work) = pager
                        .start_page_in(host, page, swap_slot, now)
                        .map_err(pager_error)?;
                    charge(&mut fault, work);
                    read
                }
            };
            if read.ready_at > clock.at() {
                fault.outcome = FaultOutcome::WaitForPage {
                    gfn,
                    swap_slot,
                    ready_at: read.ready_at,
                };
                return Ok((fault, None));
            }
            pager
                .finish_page_in(&mut host.slots, swap_slot)
                .map(|(_, frame)| frame)
                .ok_or(FaultError::PageInVanished { gpa })?
        }
    };
    // Logged before the leaf becomes writable: a write the log misses
    // cannot happen (the page's bit or ring entry is there before the
    // guest can store without faulting). Its cost is the hold's (KVM marks
    // under `mmu_lock`, see `locked_fault_work`).
    let dirty_marked = write && host.mark_page_dirty(gfn);
    Ok((
        fault,
        Some(Resident {
            gfn,
            frame,
            rights,
            dirty_marked,
        }),
    ))
}

/// What installing a mapping did.
#[derive(Debug)]
pub(crate) struct Mapped {
    /// Virtual cycles the hold cost (acquisition, wait, work).
    pub cycles: Cycles,
    /// Of which waiting for `mmu_lock`.
    pub lock_wait: Cycles,
    /// Of which behind a zap-all's teardown.
    pub zap_wait: Cycles,
    /// Whether a new spte went in (false: another vCPU had installed it),
    /// or why not.
    pub result: Result<bool, FaultError>,
}

impl Mmu {
    /// Maps `gfn` to `frame` (with `rights`) in `root`, under `mmu_lock`
    /// taken at virtual time `at`, with its contention modelled; `write`:
    /// the fault was a write (a present leaf gets W back if the MMU
    /// allows it); `dirty_marked`: the fault logged the page (the hold
    /// charges the bitmap's bit, [`locked_fault_work`]). The cost is
    /// charged even when it fails (the hold happened).
    #[allow(clippy::too_many_arguments)]
    pub fn map_gfn(
        &self,
        mem: &PhysMemory,
        frames: &mut FrameAllocator,
        costs: &HvCosts,
        root: RootId,
        gfn: Gfn,
        frame: Hfn,
        rights: LeafWrite,
        write: bool,
        dirty_marked: bool,
        at: Cycles,
    ) -> Mapped {
        if self.mode == super::MmuMode::Shadow {
            // A shadow leaf needs the guest-virtual address and the guest
            // walk (`vcpu/shadow.rs` maps it); nothing to do by gfn.
            return Mapped {
                cycles: Cycles::ZERO,
                lock_wait: Cycles::ZERO,
                zap_wait: Cycles::ZERO,
                result: Ok(false),
            };
        }
        let mut guard = self.hold(Timed::At(at), costs);
        let access = Access {
            write,
            fetch: false,
        };
        let result = install(
            mem, frames, &mut guard, costs, root, gfn, frame, rights, access,
        );
        let writable = write || rights == LeafWrite::Writable;
        guard.charge(locked_fault_work(costs, writable, dirty_marked));
        Mapped {
            cycles: guard.cycles(),
            lock_wait: guard.waited(),
            zap_wait: guard.zap_waited(),
            result,
        }
    }
}

/// The part of the fault under `mmu_lock`.
#[allow(clippy::too_many_arguments)]
fn install(
    mem: &PhysMemory,
    frames: &mut FrameAllocator,
    guard: &mut super::lock::MmuGuard<'_>,
    costs: &HvCosts,
    root: RootId,
    gfn: Gfn,
    frame: Hfn,
    rights: LeafWrite,
    access: Access,
) -> Result<bool, FaultError> {
    let (walked, work) = {
        let MmuInner { roots, headers, .. } = &mut **guard;
        // A root zapped since the vCPU entered: nothing to install into;
        // the vCPU reloads its root before it enters again.
        let Some(root) = roots.get(root) else {
            return Ok(false);
        };
        let mut work = tdp::WalkWork::default();
        (
            tdp::leaf_for(mem, frames, headers, root, gfn, &mut work),
            work,
        )
    };
    let leaf = walked?;
    guard.charge(
        work.entries_read * costs.spte_read
            + work.tables_allocated * (costs.frame_alloc + costs.zero_4k + costs.spte_write),
    );
    let current = tdp::read_spte(mem, leaf)?;
    guard.charge(costs.spte_read);
    if spte::is_present(current) {
        // Raced with another fault on the same gfn, which installed it;
        // or a leaf that only needs an access bit back: access-tracked
        // (`--ept-ad off`), or W on an MMU-writable leaf write-protected
        // for dirty logging (the caller logged the page). The fast path's
        // fix, taken here under the lock when it is off or gave up.
        let fix = fast_fix(mem.atomic_u64(leaf)?, &Layout::EPT, access);
        if let FastFix::Fixed { .. } = fix {
            guard.charge(costs.spte_cmpxchg);
            return Ok(true);
        }
        return Ok(false);
    }
    tdp::write_spte(mem, leaf, rights.ept_leaf(frame.addr().0))?;
    guard.rmap.add(frame, leaf);
    guard.charge(costs.spte_write);
    Ok(true)
}
