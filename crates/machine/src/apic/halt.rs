//! A halted CPU and its local APIC: what wakes it and when.
//!
//! A hypervisor that does not interpret a halted vCPU (it skips its clock
//! ahead instead) needs the same answers the CPU's own idle loop uses: when
//! the APIC timer would wake it, whether something can wake it now, and to
//! bring the timer up to the CPU's clock after skipping. The machine
//! decides these; the hypervisor asks.

use crate::cpu::state::rflags;
use crate::Cpu;

impl Cpu {
    /// The cycle (of this CPU's clock) at which the APIC timer would wake
    /// it from HLT: `None` when interrupts are off (the timer cannot wake
    /// it) or no unmasked timer is armed. Never earlier than now.
    pub fn halted_timer_wake(&self) -> Option<u64> {
        if self.state().rflags & rflags::IF == 0 {
            return None;
        }
        let offset = self.vmx().map_or(0, |c| c.tsc_offset);
        let deadline = self.apic().next_timer_deadline()?;
        Some(deadline.wrapping_sub(offset as u64).max(self.cycles()))
    }

    /// Whether the halted CPU would wake now: an event waits for VM-entry
    /// injection, or interrupts are on and the APIC has one it may deliver.
    pub fn halted_can_wake(&self) -> bool {
        self.pending_injection().is_some()
            || (self.state().rflags & rflags::IF != 0 && self.apic().deliverable_vector().is_some())
    }

    /// Brings the APIC timer up to the CPU's clock after it was moved
    /// without running: an expired timer raises its interrupt.
    pub fn sync_apic_timer(&mut self) {
        let tsc = self.tsc();
        self.apic_mut().update_timer(tsc);
    }
}

#[cfg(test)]
mod tests {
    use crate::{Cpu, CpuConfig};

    #[test]
    fn a_halted_cpu_wakes_at_its_timer_only_with_interrupts_on() {
        let mut cpu = Cpu::new(CpuConfig::default());
        let tsc = cpu.tsc();
        // Software-enable the APIC (SVR bit 8) with the timer on vector
        // 0x40, TSC-deadline mode, due in 1000 cycles.
        cpu.apic_mut().write_msr(0x80f, 0x1ff, tsc).unwrap();
        cpu.apic_mut()
            .write_msr(0x832, 0x40 | (2 << 17), tsc)
            .unwrap();
        cpu.apic_mut().write_msr(0x6e0, tsc + 1000, tsc).unwrap();
        assert_eq!(cpu.halted_timer_wake(), None, "IF = 0");
        cpu.state_mut().rflags |= crate::cpu::state::rflags::IF;
        assert_eq!(cpu.halted_timer_wake(), Some(tsc + 1000));
        assert!(!cpu.halted_can_wake());
        cpu.advance_cycles(1000);
        assert!(!cpu.halted_can_wake(), "not yet brought up to the clock");
        cpu.sync_apic_timer();
        assert!(cpu.halted_can_wake(), "the timer fired");
    }
}
