//! The EPT-violation path: from a faulting gpa to an installed spte.
//!
//! 1. Look the gfn up in the memslots (outside guest memory, or a write to
//!    a read-only slot, is an error).
//! 2. Find the frame behind it (KVM's `kvm_faultin_pfn`): resident already;
//!    allocated and zeroed on first touch; or on swap: the read is started
//!    (or found in flight) and, if it completes later than now, the fault
//!    ends with [`FaultOutcome::WaitForPage`] for the async-PF policy to
//!    decide how the vCPU waits. The pager may evict to make room (its
//!    holds of `mmu_lock` go through `mmu::notifier`).
//! 3. Install a 4 KiB leaf under `mmu_lock` (`Mmu::map_gfn`), in the root the
//!    vCPU entered with, and record it in the rmap. A request that finds
//!    the lock held installs nothing: it ends with
//!    [`FaultOutcome::LockBusy`], and the vCPU replays the fault when its
//!    turn comes, so the leaf goes in at the grant's virtual time.
//!
//! The path never calls the policy and never flushes a TLB itself: it
//! returns what happened, and whether a remote TLB flush is needed (the
//! pager zapped or aged sptes), for the vCPU to request.
//!
//! It sits above the MMU and the pager and uses both: the MMU knows
//! nothing of the pager.

use crate::frames::OutOfFrames;
use crate::host::Host;
use crate::memslot::PageState;
use crate::mmu::fault::{LeafWrite, MapError};
use crate::mmu::root::RootId;
use crate::mmu::tdp;
use crate::pager::{PageRef, Pager, PagerError, Work};
use crate::swap::SwapSlot;
use crate::time::Cycles;
use machine::{Gfn, Gpa, Hfn, MemError};
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

impl From<MapError> for FaultError {
    fn from(e: MapError) -> Self {
        match e {
            MapError::Tdp(e) => FaultError::Tdp(e),
            MapError::Memory(e) => FaultError::Memory(e),
        }
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
    /// `mmu_lock` is held past the request: nothing was installed; the
    /// vCPU waits `wait` and replays the fault (see
    /// [`crate::mmu::lock::Deferral`]).
    LockBusy { wait: Cycles },
    /// Its next request for `mmu_lock`, at `at`, is past the order bound
    /// ([`Host::order_bound`]): another actor could still ask earlier.
    /// Nothing more was done (a suspended eviction batch keeps its
    /// place); the vCPU replays the fault when the others have passed
    /// `at`, without a charge: the replay asks at `at` again.
    NotYet { at: Cycles },
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

/// The clock of one exit: `exit` is the vCPU's clock at the exit, `now`
/// stamps the pager's work (`exit` plus what the exit charged before the
/// fault path began) and `cycles` is what the exit has charged so far;
/// the fault adds to it, and takes `mmu_lock` at `exit + cycles`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExitClock {
    pub exit: Cycles,
    pub now: Cycles,
    pub cycles: Cycles,
    /// A replayed fault's promise (`Next::NotYet`): it makes no request
    /// before this time, which the other actors have run up to. A replay
    /// that takes a shorter path than the first attempt waits for it.
    pub floor: Cycles,
}

impl ExitClock {
    /// The virtual time at which the next step happens.
    pub fn at(&self) -> Cycles {
        self.exit + self.cycles
    }

    /// The time of a request for a shared resource: the next step, no
    /// earlier than the floor (the difference is waited for).
    pub fn request_at(&mut self) -> Cycles {
        if self.at() < self.floor {
            self.cycles = self.floor - self.exit;
        }
        self.at()
    }

    /// When the pager's work for this fault happens: `now`, no earlier
    /// than the floor.
    pub fn pager_now(&self) -> Cycles {
        self.now.max(self.floor)
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
    let at = clock.request_at();
    if host.not_yet(at) {
        fault.outcome = FaultOutcome::NotYet { at };
        return Ok(fault);
    }
    if let Some(deferral) = host.mmu.defer_lock(clock.exit, clock.at(), &host.costs) {
        fault.outcome = FaultOutcome::LockBusy {
            wait: deferral.wait,
        };
        fault.lock_wait = deferral.wait;
        fault.zap_wait = deferral.zap_wait;
        return Ok(fault);
    }
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
    let now = clock.pager_now();
    let pager_error = |source| FaultError::Pager { gpa, source };
    let not_yet = |at| {
        let fault = Fault {
            outcome: FaultOutcome::NotYet { at },
            frame_allocated: false,
            repeat: false,
            flush: false,
            lock_wait: Cycles::ZERO,
            zap_wait: Cycles::ZERO,
        };
        Ok((fault, None))
    };
    // The memslot lookup, then the host side of the frame lookup (KVM's
    // `hva_to_pfn`: GUP-fast first, on every fault; a page that is not
    // resident costs the pager's work on top, standing for GUP's slow
    // path and the host's fault).
    clock.cycles += Cycles(costs.memslot_lookup + costs.host_pfn_lookup);
    // An eviction batch this fault suspended at the order bound goes on
    // first, whatever the page's state is now.
    let resumed = match pager.resume_batch(host) {
        Err(PagerError::NotYet { at }) => return not_yet(at),
        result => result.map_err(pager_error)?,
    };
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
    charge(&mut fault, resumed);
    let frame = match slot.state(gfn) {
        PageState::Resident(frame) => frame,
        PageState::Untouched => {
            let (frame, work) = match pager.first_touch(host, page, gfn, now) {
                Err(PagerError::NotYet { at }) => return not_yet(at),
                result => result.map_err(pager_error)?,
            };
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
                // The read goes to the device at `now`: in order, or not
                // yet.
                None if host.not_yet(now) => return not_yet(now),
                None => {
                    let (read, work) = match pager.start_page_in(host, page, swap_slot, now) {
                        Err(PagerError::NotYet { at }) => return not_yet(at),
                        result => result.map_err(pager_error)?,
                    };
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
