//! The state every vCPU works on (the VM owns it; exit handlers get it): guest memory behind the MMU and the
//! pager, the APF configuration, the console, the reports, and the queue
//! of cross-vCPU requests the scheduler carries out.

use crate::apf::ApfConfig;
use crate::error::GuestMemoryError;
use crate::error::VmError;
use crate::host::Host;
use crate::ids::VcpuId;
use crate::memslot::PageState;
use crate::pager::{PageRef, Pager, Work};
use crate::time::Cycles;
use machine::addr::PAGE_SIZE;
use machine::vmx::Ipi;
use machine::{Gfn, Gpa, Hfn};

/// Why the VM stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The guest wrote to the isa-debug-exit port: status `(v << 1) | 1`.
    DebugExit { status: u32 },
    /// The guest called HC_SHUTDOWN.
    Shutdown { status: u64 },
    /// The guest entered S5 through the FADT's sleep control register.
    PowerOff,
    /// An unsupported or fatal exit.
    Error(VmError),
}

/// A structured result line handed over by HC_REPORT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub vcpu: usize,
    /// Virtual time of the report (the vCPU's cycle counter).
    pub cycles: u64,
    pub line: String,
}

/// The VM-wide wall clock: the wall time (ns since the Unix epoch) at
/// which kvmclock read zero, and `MSR_KVM_WALL_CLOCK_NEW` as last written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct WallClock {
    pub boot_ns: u64,
    pub msr: u64,
    pub version: u32,
}

/// What the sweep saw last: a change in either drops every entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SweepMark {
    /// The MMU generation (a fast zap obsoletes every root).
    generation: u64,
    /// Pages that ever went unsync.
    unsynced: u64,
}

impl SweepMark {
    /// Whether the MMU changed in a way that drops cached roots since the
    /// last look; remembers what it sees.
    pub(crate) fn changed(&mut self, shared_host: &Host) -> bool {
        let now = SweepMark {
            generation: shared_host.mmu.generation(),
            unsynced: shared_host.mmu.shadow_unsynced_total(&shared_host.costs),
        };
        let changed = now != *self;
        *self = now;
        changed
    }
}

/// Something a vCPU (or the hv) needs done to other vCPUs; the scheduler
/// carries these out before any vCPU runs guest code again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CrossRequest {
    /// Every vCPU flushes its EPT translations before its next entry
    /// (sptes were zapped or aged).
    FlushAll,
    /// Every vCPU loads a root again before its next entry (a zap-all
    /// freed or obsoleted the one it has).
    ReloadRoots,
    /// A fixed (or lowest-priority) IPI from the APIC `sender_apic`.
    Ipi {
        sender_apic: u32,
        ipi: Ipi,
        at: Cycles,
    },
    /// KVM_HC_KICK_CPU.
    Kick { target: VcpuId, at: Cycles },
    /// HC_START_CPU: the AP starts at `rip` with `rsp` and `rdi`.
    StartCpu {
        target: VcpuId,
        rip: u64,
        rsp: u64,
        rdi: u64,
        at: Cycles,
    },
}

/// What every vCPU may know about the others.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DirectoryEntry {
    pub apic_id: u32,
    /// Started (the bootstrap vCPU, or an AP after HC_START_CPU).
    pub started: bool,
}

/// The VM's shared state.
#[derive(Debug)]
pub(crate) struct Shared {
    pub host: Host,
    pub pager: Pager,
    pub apf: ApfConfig,
    /// CPUID 0x40000001 EAX.
    pub kvm_features: u32,
    /// The CR3 cache's entries per vCPU when it is offered (`--mmu shadow
    /// --cr3-cache on`).
    pub cr3_cache: Option<usize>,
    /// What the CR3 cache's sweep saw last.
    pub cr3_sweep: SweepMark,
    /// kvmclock's wall clock.
    pub wall_clock: WallClock,
    /// The devices (the console's output included).
    pub platform: crate::devices::Platform,
    pub reports: Vec<Report>,
    pub directory: Vec<DirectoryEntry>,
    pub cross: Vec<CrossRequest>,
    /// Global virtual time: the end of the last completed round (stamps
    /// the hv's own accesses).
    pub time: Cycles,
}

impl Shared {
    pub fn vcpu_by_apic_id(&self, apic_id: u64) -> Option<VcpuId> {
        self.directory
            .iter()
            .position(|d| u64::from(d.apic_id) == apic_id)
            .map(VcpuId)
    }

    fn page_ref(&self, gfn: Gfn) -> Result<PageRef, GuestMemoryError> {
        let slot = self
            .host
            .slots
            .lookup(gfn)
            .ok_or(GuestMemoryError::Unmapped(gfn.addr()))?;
        Ok(PageRef {
            slot: slot.id,
            index: slot.index_of(gfn),
        })
    }

    /// What an MMU change asks of every vCPU before it runs guest code
    /// again: a TLB flush (`flush`: sptes were cleared or restricted) and
    /// a root reload (`reload`: roots were zapped).
    pub fn queue_mmu_effects(&mut self, flush: bool, reload: bool) {
        if flush {
            self.cross.push(CrossRequest::FlushAll);
        }
        if reload {
            self.cross.push(CrossRequest::ReloadRoots);
        }
    }

    /// Copies `bytes` into guest-physical memory, allocating backing frames
    /// for pages not yet touched and reading swapped-out pages back first
    /// (as the VMM writing its own mapping).
    pub fn write_guest(&mut self, gpa: Gpa, bytes: &[u8]) -> Result<(), GuestMemoryError> {
        let mut done = 0usize;
        while done < bytes.len() {
            let at = gpa.add(done as u64);
            let chunk = ((PAGE_SIZE - at.page_offset()) as usize).min(bytes.len() - done);
            let frame = self.backing_frame(at.frame())?;
            self.hv_stores_into(at.frame());
            self.host.mem.write_bytes(
                frame.addr().add(at.page_offset()),
                &bytes[done..done + chunk],
            )?;
            done += chunk;
        }
        Ok(())
    }

    /// Reads guest-physical memory (untouched pages read as zero; swapped
    /// pages are read back in).
    pub fn read_guest(&mut self, gpa: Gpa, buf: &mut [u8]) -> Result<(), GuestMemoryError> {
        let mut done = 0usize;
        while done < buf.len() {
            let at = gpa.add(done as u64);
            let chunk = ((PAGE_SIZE - at.page_offset()) as usize).min(buf.len() - done);
            let slot = self
                .host
                .slots
                .lookup(at.frame())
                .ok_or(GuestMemoryError::Unmapped(at))?;
            match slot.state(at.frame()) {
                PageState::Untouched => buf[done..done + chunk].fill(0),
                _ => {
                    let frame = self.backing_frame(at.frame())?;
                    self.host.mem.read_bytes(
                        frame.addr().add(at.page_offset()),
                        &mut buf[done..done + chunk],
                    )?;
                }
            }
            done += chunk;
        }
        Ok(())
    }

    /// Carries out the devices' work that reaches guest memory (the
    /// edu's DMA, interrupt remapping, the IOMMU's invalidation queue:
    /// `devices::Chipset::service`) until none is left; what it raises
    /// joins the platform's interrupt messages.
    pub fn service_devices(&mut self) {
        // A DMA completion can raise INTx, whose remappable IOAPIC entry
        // is more work: a few rounds settle any chain the devices make.
        for _ in 0..4 {
            if !self.platform.device_work_pending() {
                return;
            }
            let Some(mut chipset) = self.platform.chipset.take() else {
                return;
            };
            let requests = self.platform.take_ioapic_requests();
            let messages = chipset.service(self, requests);
            self.platform.chipset = Some(chipset);
            self.platform.after_service(messages);
        }
    }

    /// Reads a little-endian u32 of guest memory.
    pub fn read_u32(&mut self, gpa: Gpa) -> Result<u32, GuestMemoryError> {
        let mut buf = [0u8; 4];
        self.read_guest(gpa, &mut buf)?;
        Ok(u32::from_le_bytes(buf))
    }

    /// Writes a little-endian u32 of guest memory.
    pub fn write_u32(&mut self, gpa: Gpa, value: u32) -> Result<(), GuestMemoryError> {
        self.write_guest(gpa, &value.to_le_bytes())
    }

    /// The hv stores (or is about to store) into `gfn` behind the MMU's
    /// back, where no spte's dirty bit and no write fault sees it: the
    /// page's swap copy, if any, is stale, and the page goes into the dirty
    /// log if its slot logs. Every store the hv makes into guest memory
    /// calls this (the write helpers above, the shadow walker's A/D
    /// updates, the tracked-write step): nothing written may be missing
    /// from a dirty log.
    pub fn hv_stores_into(&mut self, gfn: Gfn) {
        if let Ok(page) = self.page_ref(gfn) {
            self.pager.drop_swap_copy(&mut self.host.slots, page);
        }
        self.host.mark_page_dirty(gfn);
    }

    /// The frame holding `gfn` for an access by the hv itself: allocated
    /// and zeroed on first touch, read back synchronously from swap.
    pub fn backing_frame(&mut self, gfn: Gfn) -> Result<Hfn, GuestMemoryError> {
        self.backing_frame_ready(gfn).map(|(frame, _)| frame)
    }

    /// [`Shared::backing_frame`], and when its contents are there in
    /// virtual time: now for a resident or new page, the read's
    /// completion on the swap device for a swapped one (the hv does not
    /// wait for it, but a VMM that sends the contents on cannot send them
    /// earlier).
    pub fn backing_frame_ready(&mut self, gfn: Gfn) -> Result<(Hfn, Cycles), GuestMemoryError> {
        // The hv's own access cannot be replayed: its eviction work, if
        // any, waits in place even under a fault's order bound.
        let bound = self.host.order_bound.take();
        let result = self.backing_frame_unbounded(gfn);
        self.host.order_bound = bound;
        result
    }

    fn backing_frame_unbounded(&mut self, gfn: Gfn) -> Result<(Hfn, Cycles), GuestMemoryError> {
        let page = self.page_ref(gfn)?;
        let now = self.time;
        let state = self
            .host
            .slots
            .lookup(gfn)
            .ok_or(GuestMemoryError::Unmapped(gfn.addr()))?
            .state(gfn);
        let (frame, work, ready) = match state {
            PageState::Resident(frame) => return Ok((frame, now)),
            PageState::Untouched => {
                let (frame, work) = self.pager.first_touch(&mut self.host, page, gfn, now)?;
                (frame, work, now)
            }
            PageState::Swapped(slot) => match self.pager.in_flight(slot) {
                // On its way in: the hv does not wait in virtual time.
                Some(read) => {
                    let (_, frame) = self
                        .pager
                        .finish_page_in(&mut self.host.slots, slot)
                        .ok_or(GuestMemoryError::Unmapped(gfn.addr()))?;
                    (frame, Work::default(), read.ready_at.max(now))
                }
                None => {
                    let (frame, work, ready) =
                        self.pager.swap_in_now(&mut self.host, page, slot, now)?;
                    (frame, work, ready.max(now))
                }
            },
        };
        if work.flush {
            self.cross.push(CrossRequest::FlushAll);
        }
        Ok((frame, ready))
    }
}

/// Devices reach guest memory as the hv's own accesses do: pages fault in
/// (from swap too), and written pages are marked dirty for dirty logging.
impl crate::devices::GuestMemory for Shared {
    fn read(&mut self, gpa: u64, buf: &mut [u8]) -> bool {
        self.read_guest(Gpa(gpa), buf).is_ok()
    }

    fn write(&mut self, gpa: u64, bytes: &[u8]) -> bool {
        self.write_guest(Gpa(gpa), bytes).is_ok()
    }
}
