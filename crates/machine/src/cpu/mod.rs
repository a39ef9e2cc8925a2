//! One CPU: architectural state, the interpreter and the VMX glue.
#![allow(unused_variables, dead_code)]

pub mod state;

use crate::apic::Lapic;
use crate::cost::CycleCosts;
use crate::memory::PhysMemory;
use crate::mmu::tlb::{Tlb, TlbConfig};
use crate::vmx::{EventInjection, InveptKind, InvvpidKind, VmExit, VmxControls};
use crate::Gva;
pub use state::{CpuState, Gpr};

/// Construction parameters of a CPU.
#[derive(Debug, Clone)]
pub struct CpuConfig {
    /// x2APIC id (also what CPUID reports).
    pub apic_id: u32,
    pub tlb: TlbConfig,
    pub costs: CycleCosts,
}

impl Default for CpuConfig {
    fn default() -> Self {
        CpuConfig {
            apic_id: 0,
            tlb: TlbConfig::default(),
            costs: CycleCosts::DEFAULT,
        }
    }
}

/// Counters kept by the CPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuStats {
    pub instructions: u64,
    pub exceptions: u64,
    pub interrupts: u64,
    pub vm_exits: u64,
    pub vm_entries: u64,
    pub page_walk_refs: u64,
}

/// One x86-64 CPU.
pub struct Cpu {
    state: CpuState,
}

impl Cpu {
    /// A CPU in the default 64-bit state ([`CpuState::default`]).
    pub fn new(config: CpuConfig) -> Self {
        todo!()
    }
    /// Architectural state (the VMCS guest-state area, in guest mode).
    pub fn state(&self) -> &CpuState {
        &self.state
    }
    /// Mutable architectural state. Changing CR3 here does not flush the
    /// TLB, as writing the VMCS guest CR3 field does not.
    pub fn state_mut(&mut self) -> &mut CpuState {
        &mut self.state
    }
    /// The cycle counter (virtual time of this CPU).
    pub fn cycles(&self) -> u64 {
        todo!()
    }
    /// Moves the cycle counter forward (a halted CPU skipping idle time).
    pub fn advance_cycles(&mut self, n: u64) {
        todo!()
    }
    /// Counters.
    pub fn stats(&self) -> CpuStats {
        todo!()
    }
    /// Runs until something needs the outside world or `cycles()` reaches
    /// `cycle_limit` (then [`VmExit::CycleLimit`]).
    pub fn run(&mut self, mem: &PhysMemory, cycle_limit: u64) -> VmExit {
        todo!()
    }
    /// Enters guest mode with these controls (`Some`), or returns to bare
    /// mode (`None`).
    pub fn set_vmx(&mut self, controls: Option<VmxControls>) {
        todo!()
    }
    /// The VM-execution controls, in guest mode.
    pub fn vmx(&self) -> Option<&VmxControls> {
        todo!()
    }
    /// Mutable VM-execution controls.
    pub fn vmx_mut(&mut self) -> Option<&mut VmxControls> {
        todo!()
    }
    /// Sets the VM-entry event-injection field.
    pub fn inject_event(&mut self, event: EventInjection) {
        todo!()
    }
    /// The event waiting to be injected on the next entry, if any.
    pub fn pending_injection(&self) -> Option<EventInjection> {
        todo!()
    }
    /// Length of the instruction that caused the last exit.
    pub fn exit_instruction_len(&self) -> u8 {
        todo!()
    }
    /// Advances RIP past the instruction that caused the last exit.
    pub fn skip_instruction(&mut self) {
        todo!()
    }
    /// Completes an `in` that exited: writes AL/AX/EAX with `value` and
    /// skips the instruction.
    pub fn complete_io_in(&mut self, size: u8, value: u32) {
        todo!()
    }
    /// Completes an RDMSR that exited: EDX:EAX = value, skip.
    pub fn complete_rdmsr(&mut self, value: u64) {
        todo!()
    }
    /// A host (external) interrupt arrives at this CPU.
    pub fn post_external_interrupt(&mut self, vector: u8) {
        todo!()
    }
    /// The local APIC.
    pub fn apic(&self) -> &Lapic {
        todo!()
    }
    /// The local APIC, mutably (to deliver IPIs and device interrupts).
    pub fn apic_mut(&mut self) -> &mut Lapic {
        todo!()
    }
    /// The TLB (for statistics).
    pub fn tlb(&self) -> &Tlb {
        todo!()
    }
    /// INVEPT issued by the hypervisor.
    pub fn invept(&mut self, kind: InveptKind) {
        todo!()
    }
    /// INVVPID issued by the hypervisor.
    pub fn invvpid(&mut self, kind: InvvpidKind) {
        todo!()
    }
    /// INVLPG on behalf of the hypervisor, in the current VPID.
    pub fn invlpg(&mut self, gva: Gva) {
        todo!()
    }
}
