//! The local APIC in x2APIC mode, programmed through MSRs 0x800-0x8ff.
//!
//! Time is the CPU's TSC (passed in as `now`), so the timer is as
//! deterministic as everything else.
//!
//! STUB: to be implemented (see the helper task); signatures are the contract.
#![allow(unused_variables)]

use crate::vmx::Ipi;

/// IA32_APIC_BASE.
pub const MSR_APIC_BASE: u32 = 0x1b;
/// IA32_TSC_DEADLINE.
pub const MSR_TSC_DEADLINE: u32 = 0x6e0;
/// First x2APIC MSR.
pub const MSR_X2APIC_FIRST: u32 = 0x800;
/// Last x2APIC MSR.
pub const MSR_X2APIC_LAST: u32 = 0x8ff;

/// An APIC register access the architecture rejects with #GP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("x2APIC MSR {msr:#x} access raises #GP")]
pub struct ApicGp {
    pub msr: u32,
}

/// What a register write asks the outside world to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApicWrite {
    /// Nothing more.
    Done,
    /// An IPI was written to the ICR; self-IPIs are already in the IRR and
    /// never returned.
    SendIpi(Ipi),
}

/// A local APIC.
#[derive(Debug, Clone)]
pub struct Lapic {}

impl Lapic {
    /// A reset APIC with this x2APIC id, globally enabled in x2APIC mode
    /// (IA32_APIC_BASE bits 10 and 11 set; the software-enable bit in the
    /// SVR is clear, as after reset).
    pub fn new(apic_id: u32) -> Self {
        todo!()
    }

    /// The x2APIC id.
    pub fn id(&self) -> u32 {
        todo!()
    }

    /// RDMSR of IA32_APIC_BASE, IA32_TSC_DEADLINE or an x2APIC MSR.
    pub fn read_msr(&self, msr: u32, now: u64) -> Result<u64, ApicGp> {
        todo!()
    }

    /// WRMSR of IA32_APIC_BASE, IA32_TSC_DEADLINE or an x2APIC MSR.
    pub fn write_msr(&mut self, msr: u32, value: u64, now: u64) -> Result<ApicWrite, ApicGp> {
        todo!()
    }

    /// Moves an expired timer into the IRR (and re-arms a periodic one).
    pub fn update_timer(&mut self, now: u64) {
        todo!()
    }

    /// The TSC value at which the timer next fires, if armed and unmasked.
    pub fn next_timer_deadline(&self) -> Option<u64> {
        todo!()
    }

    /// Sets `vector` pending in the IRR (an IPI or device interrupt).
    pub fn accept_interrupt(&mut self, vector: u8) {
        todo!()
    }

    /// The highest-priority pending vector that the processor priority
    /// allows to be delivered now, if any (does not change state).
    pub fn deliverable_vector(&self) -> Option<u8> {
        todo!()
    }

    /// The CPU is delivering `vector`: IRR -> ISR.
    pub fn start_delivery(&mut self, vector: u8) {
        todo!()
    }

    /// CR8 view of the TPR (TPR bits 7:4).
    pub fn cr8(&self) -> u64 {
        todo!()
    }

    /// MOV to CR8.
    pub fn set_cr8(&mut self, value: u64) {
        todo!()
    }

    /// Whether the APIC is software-enabled (SVR bit 8); when disabled it
    /// accepts no interrupts except NMI/INIT/SIPI.
    pub fn software_enabled(&self) -> bool {
        todo!()
    }
}
