//! The exits of shadow paging (`--mmu shadow`): guest #PF (through the
//! exception bitmap), CR3 loads and stores, the paging bits of CR0/CR4,
//! INVLPG, and the monitor-trap step of a write to a write-tracked guest
//! page table. The MMU side is `mmu/shadow/`.
//!
//! The guest owns CR0/CR4 except the bits that change the translation
//! (host-owned: the guest reads them from the read shadows, a write that
//! changes one exits). The machine's CR0.WP is always set, so the shadow's
//! read-only sptes hold for the supervisor too.

mod control_regs;
mod tracked_write;

use super::{Next, Requests, Vcpu};
use crate::error::VmError;
use crate::fault::{faultin, ExitClock, FaultOutcome};
use crate::mmu::lock::Timed;
use crate::mmu::shadow::cache::{find_or_build_root, CachedRoot};
use crate::mmu::shadow::fetch::{self, MapOutcome};
use crate::mmu::shadow::gwalk::GuestWalk;
use crate::mmu::shadow::role::PagingContext;
use crate::mmu::shadow::sync;
use crate::mmu::shadow::ShadowError;
use crate::mmu::walk::{self, GuestPtes, PagingContext as WalkContext, PteError, WalkError};
use crate::mmu::LoadedRoot;
use crate::shared::{CrossRequest, Shared};
use crate::time::Cycles;
use machine::cpu::state::{cr0, cr4, efer, rflags};
use machine::mmu::{Access, AccessKind};
use machine::vmx::{CrAccess, Eptp, EventInjection, EventKind, InvvpidKind, VmxControls};
use machine::{Gpa, Gva};

/// CR0 bits the hv owns under shadow paging.
const CR0_HOST_OWNED: u64 = cr0::PG | cr0::WP;
/// CR4 bits the hv owns (they change the translation or the TLB).
const CR4_HOST_OWNED: u64 = cr4::PGE | cr4::PSE | cr4::PAE | cr4::SMEP | cr4::SMAP | cr4::PCIDE;
/// How the shadow fault path ended.
pub(super) enum ShadowFault {
    /// The guest's own tables fault: inject this #PF.
    Guest { error_code: u32 },
    /// The page is on its way in from swap.
    Wait {
        gfn: machine::Gfn,
        swap_slot: crate::swap::SwapSlot,
        ready_at: Cycles,
    },
    /// The shadow leaf's outcome, for `gfn` backed by the frame.
    Done(MapOutcome, machine::Gfn, machine::Hfn),
    /// A non-canonical address (#GP on hardware, before any walk).
    NonCanonical,
    /// The guest's entries changed under the walk: run the access again.
    Retry,
    /// The guest maps a gpa outside guest RAM: a device's MMIO (or none).
    Mmio { gpa: Gpa },
    /// `mmu_lock` is held past the request: wait `wait`, then replay.
    LockBusy { wait: Cycles },
    /// Its next `mmu_lock` request is past the order bound: replayed
    /// when the others have passed `at` (`FaultOutcome::NotYet`).
    NotYet { at: Cycles },
}

/// #PF vector.
const PF: u8 = 14;
/// Emulated writes to one guest table without a walk through it before
/// the hv stops tracking it (KVM's write-flooding threshold).
const FLOOD_WRITES: u32 = 3;

/// The controls of a vCPU under shadow paging: `base` with #PF, CR3 and
/// INVLPG exiting and the paging bits of CR0/CR4 host-owned.
pub(crate) fn shadow_controls(base: VmxControls) -> VmxControls {
    let boot = machine::cpu::state::CpuState::default();
    VmxControls {
        exception_bitmap: base.exception_bitmap | 1 << PF,
        pf_error_code_mask: 0,
        pf_error_code_match: 0,
        cr3_load_exiting: true,
        cr3_store_exiting: true,
        invlpg_exiting: true,
        // No PCIDs under shadow paging (CR4.PCIDE is refused, and CPUID
        // does not offer PCID or INVPCID: `handle_cpuid`).
        enable_invpcid: false,
        cr0_guest_host_mask: CR0_HOST_OWNED,
        cr0_read_shadow: boot.cr0 & CR0_HOST_OWNED,
        cr4_guest_host_mask: CR4_HOST_OWNED,
        cr4_read_shadow: boot.cr4 & CR4_HOST_OWNED,
        ept: None,
        ..base
    }
}

/// Guest-physical memory for the guest walk: reads through the hv's own
/// accessors (a page on swap is read back synchronously, as a host
/// `get_user` would), A/D updates by compare-and-exchange.
struct WalkMemory<'a> {
    shared: &'a mut Shared,
    reads: u64,
}

impl GuestPtes for WalkMemory<'_> {
    fn read_pte(&mut self, gpa: Gpa) -> Result<u64, PteError> {
        self.reads += 1;
        let mut buf = [0u8; 8];
        self.shared
            .read_guest(gpa, &mut buf)
            .map_err(|_| PteError::NotRam { gpa })?;
        Ok(u64::from_le_bytes(buf))
    }

    fn try_set_bits(&mut self, gpa: Gpa, old: u64, bits: u64) -> Result<bool, PteError> {
        let frame = self
            .shared
            .backing_frame(gpa.frame())
            .map_err(|_| PteError::NotRam { gpa })?;
        let seen = self
            .shared
            .host
            .mem
            .cmpxchg(frame.addr().add(gpa.page_offset()), 8, old, old | bits)
            .map_err(|_| PteError::NotRam { gpa })?;
        if seen == old {
            // The hv's store is not seen by any spte's dirty bit.
            self.shared.hv_stores_into(gpa.frame());
        }
        Ok(seen == old)
    }
}

impl Vcpu {
    /// Sets the guest's CR3 at start-up.
    pub(crate) fn set_guest_cr3(&mut self, cr3: u64) {
        match self.mmu_mode {
            crate::mmu::MmuMode::Ept | crate::mmu::MmuMode::Native => {
                self.cpu.state_mut().cr3 = cr3
            }
            crate::mmu::MmuMode::Shadow => {
                self.shadow.guest_cr3 = cr3;
                self.requests.set(Requests::RELOAD_ROOT);
            }
        }
    }

    /// After INIT or a startup IPI reset the CPU to real mode: the guest
    /// sees its reset CR0/CR4 (paging off) through the read shadows, the
    /// machine keeps the bits the hv owns as it runs every shadow root
    /// (CR0.PG and WP, CR4.PAE, EFER.NXE; IA-32e mode follows the guest's
    /// PG) and runs on the paging-off root (gva = gpa), loaded before the
    /// next entry.
    pub(crate) fn reset_shadow_paging(&mut self) {
        let s = self.cpu.state_mut();
        let (guest_cr0, guest_cr4) = (s.cr0, s.cr4);
        s.cr0 |= CR0_HOST_OWNED;
        s.cr4 = (s.cr4 & !CR4_HOST_OWNED) | cr4::PAE;
        self.shadow.guest_nxe_off = s.efer & efer::NXE == 0;
        s.efer |= efer::NXE;
        self.shadow.guest_cr3 = s.cr3;
        if let Some(v) = self.cpu.vmx_mut() {
            v.cr0_read_shadow = guest_cr0 & CR0_HOST_OWNED;
            v.cr4_read_shadow = guest_cr4 & CR4_HOST_OWNED;
        }
        self.apply_paging_cr4_bits();
        self.requests.set(Requests::RELOAD_ROOT);
    }

    /// The guest's paging context (what shadow roles depend on).
    pub(crate) fn paging_context(&self) -> PagingContext {
        PagingContext::of(self.guest_cr0(), self.guest_cr4(), self.guest_efer())
    }

    fn guest_paging_regs(&self) -> WalkContext {
        WalkContext {
            cr0: self.guest_cr0(),
            cr3: self.shadow.guest_cr3,
            cr4: self.guest_cr4(),
            efer: self.guest_efer(),
        }
    }

    fn shadow_error(&self, source: ShadowError) -> VmError {
        VmError::Shadow {
            vcpu: self.id,
            rip: self.rip(),
            source,
        }
    }

    /// Loads the shadow root for the guest's CR3 (KVM's `kvm_mmu_load`
    /// under shadow paging): from `prev_roots` when `cache` and it is
    /// there, else from the page hash (made if missing) under `mmu_lock`.
    /// Syncs unsync pages, points the machine's CR3 at the root and
    /// flushes this vCPU's TLB. Returns the cost and, of it, the wait
    /// behind a zap-all's teardown.
    pub(crate) fn load_shadow_root(
        &mut self,
        shared: &mut Shared,
        cache: bool,
        at: Timed,
    ) -> Result<(Cycles, Cycles), VmError> {
        let context = self.paging_context();
        let cr3 = self.shadow.guest_cr3;
        let host = &mut shared.host;
        let mut cycles = Cycles::ZERO;
        let cached = if cache {
            self.shadow.take(cr3, context)
        } else {
            None
        };
        let cached = cached.filter(|c| host.mmu.shadow_root_exists(c.id, &host.costs));
        let costs = host.costs;
        let hit = cached.is_some();
        let held = host
            .with_shadow(at, |t, stats, fx| {
                let root = match cached {
                    Some(c) => {
                        stats.prev_root_hits += 1;
                        let frame = t.roots.get(c.id).expect("checked").pml4;
                        (c.id, frame)
                    }
                    None => find_or_build_root(t, stats, cr3, context, fx)?,
                };
                let s = sync::sync_all(t, stats)?;
                fx.merge(s);
                Ok(root)
            })
            .map_err(|e| self.shadow_error(e))?;
        // A prev-roots hit takes no lock for the root itself: only the
        // sync's work counts (KVM's fast_pgd_switch).
        cycles += if hit {
            held.cycles.saturating_sub(held.acquire)
        } else {
            held.cycles
        };
        let (id, frame) = held.value;
        shared.queue_mmu_effects(held.flush, held.reload);
        if let Some(old) = self.root {
            if old.id != id {
                self.shadow.remember(CachedRoot {
                    cr3: self.shadow.loaded_cr3,
                    context: self.shadow.loaded_context.unwrap_or(context),
                    id: old.id,
                });
            }
        }
        self.shadow.loaded_cr3 = cr3;
        self.shadow.loaded_context = Some(context);
        self.cpu.state_mut().cr3 = frame.addr().0;
        let vpid = self.cpu.vmx().map_or(0, |v| v.vpid);
        self.cpu.invvpid(InvvpidKind::SingleContext { vpid });
        cycles += Cycles(costs.invvpid);
        self.root = Some(LoadedRoot {
            id,
            eptp: Eptp::new(frame.addr(), false),
            generation: shared.host.mmu.generation(),
        });
        Ok((cycles, held.zap_wait))
    }

    /// Injects the #PF the guest's own tables give (CR2 = the address).
    fn inject_page_fault(
        &mut self,
        shared: &mut Shared,
        gva: Gva,
        error_code: u32,
        vectoring: bool,
        cycles: &mut Cycles,
    ) {
        // A #PF while delivering a #PF is a double fault.
        let double = vectoring
            && self
                .cpu
                .idt_vectoring_info()
                .is_some_and(|e| e.kind == EventKind::HardwareException && e.vector == PF);
        let event = if double {
            EventInjection {
                kind: EventKind::HardwareException,
                vector: 8,
                error_code: Some(0),
                instruction_len: 0,
            }
        } else {
            self.cpu.state_mut().cr2 = gva.0;
            EventInjection {
                kind: EventKind::HardwareException,
                vector: PF,
                error_code: Some(error_code),
                instruction_len: 0,
            }
        };
        self.cpu.inject_event(event);
        *cycles += Cycles(shared.host.costs.event_injection);
        shared
            .host
            .mmu
            .shadow_count(&shared.host.costs, |s| s.guest_pf_injected += 1);
    }

    /// A #PF under shadow paging: the guest's fault (injected) or the
    /// shadow's (filled in, or the page waited for as under EPT).
    pub(super) fn shadow_page_fault(
        &mut self,
        shared: &mut Shared,
        gva: Gva,
        error_code: u32,
        vectoring: bool,
        cycles: &mut Cycles,
    ) -> Result<Next, VmError> {
        if let Some(next) = self.fast_shadow_page_fault(shared, gva, error_code, cycles) {
            return Ok(next);
        }
        let state = self.cpu.state();
        let access =
            walk::Access::from_error_code(error_code, state.cpl(), state.rflags & rflags::AC != 0);
        let end = self.shadow_fault(shared, gva, access, true, cycles)?;
        match end {
            ShadowFault::LockBusy { wait } => return Ok(Next::LockBusy { wait }),
            ShadowFault::NotYet { at } => return Ok(Next::NotYet { at }),
            _ => {}
        }
        if !matches!(end, ShadowFault::Guest { .. } | ShadowFault::Mmio { .. }) {
            // The hv's own fault (the summary's "EPT faults" line counts
            // these under shadow paging).
            self.stats.ept_faults += 1;
        }
        match end {
            ShadowFault::Guest { error_code } => {
                self.inject_page_fault(shared, gva, error_code, vectoring, cycles);
                Ok(Next::Continue)
            }
            ShadowFault::Wait {
                gfn,
                swap_slot,
                ready_at,
            } => {
                // Remembered with the async fault, for the page-ready
                // prefault (KVM's `work->arch.cr3` and `cr2_or_gpa`).
                self.shadow.faulting = Some(crate::apf::ShadowPrefault {
                    cr3: self.shadow.guest_cr3,
                    gva,
                    write: access.kind == AccessKind::Write,
                    user: access.user(),
                });
                let next = crate::vcpu::async_pf::policy::wait_for_page(
                    self, shared, gfn, swap_slot, ready_at, vectoring, cycles,
                );
                self.shadow.faulting = None;
                next
            }
            ShadowFault::Done(MapOutcome::Emulate { leaf }, gfn, frame) => {
                self.emulate_tracked_write(shared, gfn, gva, leaf, frame, cycles)?;
                Ok(Next::Continue)
            }
            ShadowFault::NonCanonical => {
                self.cpu.inject_event(gp());
                Ok(Next::Continue)
            }
            // As under EPT (`page_fault.rs`): the device answers; the
            // shadow never maps the page, so every access exits.
            ShadowFault::Mmio { gpa } => match self.emulate_mmio(shared, gpa, cycles)? {
                Some(next) => Ok(next),
                None => Err(VmError::OutsideMemory {
                    vcpu: self.id,
                    gpa,
                    rip: self.rip(),
                }),
            },
            ShadowFault::Done(..)
            | ShadowFault::Retry
            | ShadowFault::LockBusy { .. }
            | ShadowFault::NotYet { .. } => Ok(Next::Continue),
        }
    }

    /// The fast page fault under shadow paging (`Mmu::fast_page_fault_shadow`):
    /// a write to a present page (error code P = 1, W = 1, no reserved
    /// bit, not a fetch) whose leaf, in a direct shadow page (or an
    /// indirect one with `--fast-pf-indirect seed`), only lacks W for
    /// dirty logging is fixed by cmpxchg, without `mmu_lock`, the guest
    /// walk or the frame lookup. `Some`: handled; `None`: the slow path.
    /// A leaf that already allows the write is not taken as spurious here
    /// (unlike EPT): under shadow paging the fault may be the guest's own
    /// (SMAP, a U/S mismatch), which only the guest walk can tell, so the
    /// slow path sees it.
    fn fast_shadow_page_fault(
        &mut self,
        shared: &mut Shared,
        gva: Gva,
        error_code: u32,
        cycles: &mut Cycles,
    ) -> Option<Next> {
        const P: u32 = 1;
        const W: u32 = 1 << 1;
        const U: u32 = 1 << 2;
        const RSVD: u32 = 1 << 3;
        const FETCH: u32 = 1 << 4;
        if error_code & (P | W | RSVD | FETCH) != P | W {
            return None;
        }
        let root = self.root?;
        let host = &shared.host;
        let fast = host.mmu.fast_page_fault_shadow(
            &host.mem,
            &host.costs,
            root.eptp.pml4(),
            gva,
            error_code & U != 0,
            crate::mmu::fast_pf::protocol::Identification::of_vcpu(self.id.0 as u32),
        )?;
        *cycles += fast.cycles;
        match fast.outcome {
            crate::mmu::fast_pf::protocol::FastFix::Fixed { dirtied, .. } => {
                if dirtied {
                    // As under EPT (`vcpu/page_fault.rs`): logged before
                    // the vCPU re-enters, through the memslot lookup.
                    *cycles += Cycles(host.costs.memslot_lookup);
                    if host.mark_page_dirty(fast.gfn) {
                        *cycles += Cycles(host.costs.dirty_bit_set);
                    }
                }
                self.stats.fast_pf_fixed += 1;
                Some(Next::Continue)
            }
            _ => {
                self.stats.fast_pf_slow += 1;
                None
            }
        }
    }

    /// Maps an arrived page ahead of the retried access when the guest's
    /// CR3 is still the one it faulted under (KVM's
    /// `kvm_arch_async_page_ready`). A guest fault or a tracked write is
    /// left for the access itself.
    pub(crate) fn shadow_prefault(
        &mut self,
        shared: &mut Shared,
        fault: crate::apf::ShadowPrefault,
    ) -> Result<(), VmError> {
        if fault.cr3 != self.shadow.guest_cr3 {
            return Ok(());
        }
        let kind = if fault.write {
            AccessKind::Write
        } else {
            AccessKind::Read
        };
        let state = self.cpu.state();
        let access = walk::Access::reported(
            kind,
            fault.user,
            state.cpl(),
            state.rflags & rflags::AC != 0,
        );
        let mut cycles = Cycles::ZERO;
        let result = self.shadow_fault(shared, fault.gva, access, false, &mut cycles);
        self.charge(cycles);
        result.map(|_| ())
    }

    /// The shadow fault path: guest walk, the frame, the shadow leaf.
    /// `defer`: a request that finds `mmu_lock` held ends the fault with
    /// [`ShadowFault::LockBusy`] (the exit's fault, replayed at the
    /// grant); otherwise it waits in place (a prefault).
    pub(super) fn shadow_fault(
        &mut self,
        shared: &mut Shared,
        gva: Gva,
        access: walk::Access,
        defer: bool,
        cycles: &mut Cycles,
    ) -> Result<ShadowFault, VmError> {
        let rip = self.rip();
        let vcpu = self.id;
        let costs = shared.host.costs;
        let regs = self.guest_paging_regs();
        let walked = if self.paging_context().paging {
            let mut memory = WalkMemory { shared, reads: 0 };
            let walked = walk::walk(&mut memory, &regs, gva, access);
            *cycles += Cycles(memory.reads * costs.spte_read);
            walked.map(|w| GuestWalk::of(&w))
        } else {
            // Paging off: nothing to walk, the gva is the gpa.
            Ok(GuestWalk::nonpaging(gva))
        };
        let walk = match walked {
            Ok(walk) => walk,
            Err(WalkError::PageFault { error_code, .. }) => {
                return Ok(ShadowFault::Guest { error_code })
            }
            // Entries kept changing: let the access happen again.
            Err(WalkError::Raced { .. }) => return Ok(ShadowFault::Retry),
            Err(WalkError::NonCanonical { .. }) => return Ok(ShadowFault::NonCanonical),
            Err(WalkError::Pte(e)) => {
                let gpa = match e {
                    PteError::NotRam { gpa } => gpa,
                    PteError::NotResident { gfn } => gfn.addr(),
                };
                return Err(VmError::OutsideMemory { vcpu, gpa, rip });
            }
        };
        let gpa = walk.gfn.addr().add(gva.page_offset());
        if shared.host.slots.lookup(gpa.frame()).is_none() {
            return Ok(ShadowFault::Mmio { gpa });
        }
        let mut clock = ExitClock {
            exit: self.clock(),
            now: self.clock() + *cycles,
            cycles: *cycles,
            floor: self.retry_at.unwrap_or(Cycles::ZERO),
        };
        let write = access.kind == AccessKind::Write;
        let result = faultin(&mut shared.host, &mut shared.pager, gpa, write, &mut clock);
        *cycles = clock.cycles;
        let (fault, resident) = result.map_err(|source| self.fault_error(gpa, source))?;
        self.note_fault(shared, &fault);
        let Some(resident) = resident else {
            return Ok(match fault.outcome {
                FaultOutcome::WaitForPage {
                    gfn,
                    swap_slot,
                    ready_at,
                } => ShadowFault::Wait {
                    gfn,
                    swap_slot,
                    ready_at,
                },
                FaultOutcome::NotYet { at } => ShadowFault::NotYet { at },
                FaultOutcome::Mapped | FaultOutcome::LockBusy { .. } => {
                    ShadowFault::Done(MapOutcome::Mapped, walk.gfn, machine::Hfn(0))
                }
            });
        };
        let Some(root) = self.root else {
            self.requests.set(Requests::RELOAD_ROOT);
            return Ok(ShadowFault::Done(
                MapOutcome::NoRoot,
                walk.gfn,
                resident.frame,
            ));
        };
        if defer {
            let at = clock.request_at();
            *cycles = clock.cycles;
            if shared.host.not_yet(at) {
                return Ok(ShadowFault::NotYet { at });
            }
            if let Some(deferral) = shared.host.mmu.defer_lock(clock.exit, clock.at(), &costs) {
                self.stats.mmu_lock_wait_cycles += deferral.wait.0;
                self.stats.note_zap_stall(deferral.zap_wait);
                return Ok(ShadowFault::LockBusy {
                    wait: deferral.wait,
                });
            }
        }
        let context = self.paging_context();
        let host = &mut shared.host;
        let locked_work = crate::mmu::fault::locked_fault_work(
            &costs,
            write || resident.rights == crate::mmu::fault::LeafWrite::Writable,
            resident.dirty_marked,
        );
        let held = host
            .with_shadow(Timed::At(clock.at()), |t, stats, fx| {
                fx.work += locked_work;
                fetch::map(
                    t,
                    stats,
                    root.id,
                    context,
                    gva,
                    &walk,
                    resident.frame,
                    resident.rights,
                    Access {
                        kind: access.kind,
                        user: access.user(),
                    },
                    fx,
                )
            })
            .map_err(|e| self.shadow_error(e))?;
        *cycles += held.cycles;
        self.stats.mmu_lock_wait_cycles += held.lock_wait.0;
        self.stats.note_zap_stall(held.zap_wait);
        shared.queue_mmu_effects(held.flush, held.reload);
        if held.value == MapOutcome::NoRoot {
            self.requests.set(Requests::RELOAD_ROOT);
        }
        Ok(ShadowFault::Done(held.value, walk.gfn, resident.frame))
    }

    fn vpid(&self) -> u16 {
        self.cpu.vmx().map_or(0, |v| v.vpid)
    }
}

fn gp() -> EventInjection {
    EventInjection {
        kind: EventKind::HardwareException,
        vector: 13,
        error_code: Some(0),
        instruction_len: 0,
    }
}
