//! Saving and restoring a CPU (for VM snapshots and migration).
//!
//! A [`CpuSnapshot`] is the architectural state plus what a VMCS would
//! also carry between two VM entries: the cycle counter (the CPU's virtual
//! time), the local APIC, the event waiting to be injected and the one an
//! exit interrupted, pending host interrupts, the guest-mode fields the
//! hypervisor changes at run time (TSC offset, interrupt-window exiting,
//! monitor trap flag). Model state that no guest can observe is not saved:
//! the TLB, the first-level TLB, the decoded-code cache and the lazy flags
//! (folded into RFLAGS first). A restored CPU starts with them empty, as
//! after a full flush, which the architecture allows at any time. The TLB
//! costs virtual cycles when it misses, so a hypervisor that wants the
//! restored guest's timing unchanged saves it apart
//! ([`crate::mmu::tlb::Tlb::image`]: its entries hold host addresses,
//! which only the hypervisor can re-point) and loads it back with
//! [`Cpu::load_tlb_image`].

use super::state::{cr0, cr4, efer, rflags, CpuState};
use super::{triple_fault::TripleFaultCause, Cpu, CpuStats, PendingVectors};
use crate::apic::Lapic;
use crate::vmx::EventInjection;
use serde::{Deserialize, Serialize};

/// Everything of a [`Cpu`] a snapshot keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuSnapshot {
    pub state: CpuState,
    pub cycles: u64,
    pub apic: Lapic,
    pub injection: Option<EventInjection>,
    pub idt_vectoring: Option<EventInjection>,
    /// The 256-bit set of pending host interrupts.
    pub host_interrupts: [u64; 4],
    pub chain_first: Option<EventInjection>,
    pub triple_fault: Option<TripleFaultCause>,
    pub stats: CpuStats,
    /// Guest mode: the VMX fields the hypervisor changes while the guest
    /// runs; `None` in bare mode.
    pub vmx: Option<VmxRuntime>,
    /// Paused in guest mode at a cycle limit (see [`Cpu::run`]): the next
    /// run resumes without a VM entry, as it would have without the save.
    pub paused: bool,
}

/// The VM-execution controls a hypervisor changes at run time; the rest
/// are its configuration, which it sets again when it rebuilds the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmxRuntime {
    pub tsc_offset: i64,
    pub interrupt_window_exiting: bool,
    pub monitor_trap_flag: bool,
    /// The CR0 and CR4 values the guest reads in the bits the hypervisor
    /// owns (shadow paging keeps them apart from the real ones).
    pub cr0_read_shadow: u64,
    pub cr4_read_shadow: u64,
}

/// Why a CPU cannot be saved or restored now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuSnapshotError {
    /// An exit is half made (an IPI the APIC produced and the CPU has
    /// not yet turned into an exit): save between two runs.
    #[error("the CPU is in the middle of an exit ({0}); save it between VM entries")]
    MidExit(&'static str),
    /// Bare mode in the snapshot and guest mode in the CPU, or the reverse.
    #[error("the snapshot is of a CPU {snapshot} guest mode, the CPU restored into is {cpu}")]
    ModeMismatch {
        snapshot: &'static str,
        cpu: &'static str,
    },
    /// A value no guest could have produced.
    #[error("invalid CPU state: {0}")]
    Invalid(String),
}

fn in_or_out(guest: bool) -> &'static str {
    if guest {
        "in"
    } else {
        "not in"
    }
}

impl Cpu {
    /// The CPU's state for a snapshot. Call it between two runs, once the
    /// hypervisor has handled the last exit.
    pub fn snapshot(&mut self) -> Result<CpuSnapshot, CpuSnapshotError> {
        // `mmio` is not checked: it describes the data access of the last
        // exit (any EPT violation by a `mov`) for the handler of that
        // exit, and the next exit replaces it; nothing reads it between.
        if self.pending_string_in.is_some() || self.string_in_exit {
            return Err(CpuSnapshotError::MidExit("an INS"));
        }
        if self.pending_apic_exit.is_some() {
            return Err(CpuSnapshotError::MidExit("an IPI or EOI broadcast"));
        }
        self.flush_flags();
        Ok(CpuSnapshot {
            state: self.state.clone(),
            cycles: self.cycles,
            apic: self.apic.clone(),
            injection: self.injection,
            idt_vectoring: self.idt_vectoring,
            host_interrupts: self.host_interrupts.0,
            chain_first: self.chain_first,
            triple_fault: self.triple_fault,
            stats: self.stats,
            vmx: self.vmx.as_deref().map(|v| VmxRuntime {
                tsc_offset: v.tsc_offset,
                interrupt_window_exiting: v.interrupt_window_exiting,
                monitor_trap_flag: v.monitor_trap_flag,
                cr0_read_shadow: v.cr0_read_shadow,
                cr4_read_shadow: v.cr4_read_shadow,
            }),
            paused: self.paused,
        })
    }

    /// Restores `snapshot` into this CPU, which keeps its configuration
    /// (cost table, TLB geometry, APIC id, VMX controls but the run-time
    /// fields) and starts with empty TLBs and code cache. The snapshot is
    /// checked first; on an error the CPU is unchanged.
    pub fn restore_snapshot(&mut self, snapshot: &CpuSnapshot) -> Result<(), CpuSnapshotError> {
        check_state(&snapshot.state)?;
        snapshot
            .apic
            .check_restored(self.apic.id())
            .map_err(CpuSnapshotError::Invalid)?;
        for event in [
            snapshot.injection,
            snapshot.idt_vectoring,
            snapshot.chain_first,
        ]
        .into_iter()
        .flatten()
        {
            check_event(&event)?;
        }
        if snapshot.vmx.is_some() != self.vmx.is_some() {
            return Err(CpuSnapshotError::ModeMismatch {
                snapshot: in_or_out(snapshot.vmx.is_some()),
                cpu: in_or_out(self.vmx.is_some()),
            });
        }
        if let (Some(runtime), Some(controls)) = (snapshot.vmx, self.vmx.as_deref_mut()) {
            controls.tsc_offset = runtime.tsc_offset;
            controls.interrupt_window_exiting = runtime.interrupt_window_exiting;
            controls.monitor_trap_flag = runtime.monitor_trap_flag;
            // Only the owned bits mean anything; the rest are kept clear
            // as the hypervisor keeps them.
            controls.cr0_read_shadow = runtime.cr0_read_shadow & controls.cr0_guest_host_mask;
            controls.cr4_read_shadow = runtime.cr4_read_shadow & controls.cr4_guest_host_mask;
        }
        self.state = snapshot.state.clone();
        self.cycles = snapshot.cycles;
        self.apic = snapshot.apic.clone();
        self.injection = snapshot.injection;
        self.idt_vectoring = snapshot.idt_vectoring;
        self.host_interrupts = PendingVectors(snapshot.host_interrupts);
        self.chain_first = snapshot.chain_first;
        self.triple_fault = snapshot.triple_fault;
        self.stats = snapshot.stats;
        self.paused = snapshot.paused && self.vmx.is_some();
        self.exit_len = 0;
        self.mmio = None;
        self.pending_apic_exit = None;
        self.lazy = super::fast::LazyFlags::NONE;
        self.next_rip = self.state.rip;
        self.tlb.flush_all();
        self.l1 = super::l1tlb::L1Tlb::new();
        self.code.clear();
        self.code_written = false;
        self.mode_epoch += 1;
        self.check_events = true;
        self.next_timer_cycle = 0;
        Ok(())
    }
}

impl Cpu {
    /// Loads a saved TLB's contents ([`crate::mmu::tlb::Tlb::image`]) into
    /// this CPU's TLB, after [`Cpu::restore_snapshot`]; `repoint` adjusts
    /// each entry to this host or leaves it out (see
    /// [`crate::mmu::tlb::Tlb::load_image`]).
    pub fn load_tlb_image(
        &mut self,
        image: &crate::mmu::tlb::TlbImage,
        repoint: impl FnMut(&mut crate::mmu::tlb::TlbImageEntry) -> bool,
    ) -> Result<(), CpuSnapshotError> {
        self.tlb
            .load_image(image, repoint)
            .map_err(CpuSnapshotError::Invalid)?;
        self.l1 = super::l1tlb::L1Tlb::new();
        Ok(())
    }
}

/// The checks a VM entry makes on the guest-state area that matter to
/// this CPU (SDM Vol. 3C 27.3.1, in part): no reserved bit set in CR0,
/// CR4, EFER and RFLAGS, RFLAGS bit 1 set, interruptibility bits known.
fn check_state(state: &CpuState) -> Result<(), CpuSnapshotError> {
    let bad = |what: &str, value: u64| {
        Err(CpuSnapshotError::Invalid(format!(
            "{what} {value:#x} has reserved bits"
        )))
    };
    if state.cr0 & !cr0::DEFINED != 0 {
        return bad("CR0", state.cr0);
    }
    if state.cr4 & !(cr4::SUPPORTED | cr4::VMXE | cr4::PCIDE | cr4::OSXSAVE) != 0 {
        return bad("CR4", state.cr4);
    }
    if state.efer & !(efer::WRITABLE | efer::LMA) != 0 {
        return bad("EFER", state.efer);
    }
    let rflags_defined = rflags::WRITABLE | rflags::FIXED1 | rflags::VM | rflags::VIF | rflags::VIP;
    if state.rflags & !rflags_defined != 0 || state.rflags & rflags::FIXED1 == 0 {
        return bad("RFLAGS", state.rflags);
    }
    let known = super::state::interruptibility::STI | super::state::interruptibility::MOV_SS;
    if state.interruptibility & !known != 0 {
        return bad("interruptibility", u64::from(state.interruptibility));
    }
    Ok(())
}

fn check_event(event: &EventInjection) -> Result<(), CpuSnapshotError> {
    use crate::vmx::EventKind;
    let exception = event.kind == EventKind::HardwareException;
    if exception && event.vector >= 32 {
        return Err(CpuSnapshotError::Invalid(format!(
            "an exception with vector {}",
            event.vector
        )));
    }
    if event.instruction_len > 15 {
        return Err(CpuSnapshotError::Invalid(format!(
            "an event after an instruction of {} bytes",
            event.instruction_len
        )));
    }
    Ok(())
}
