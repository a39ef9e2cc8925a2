//! The local APIC in x2APIC mode, programmed through MSRs 0x800-0x8ff.
//!
//! Time is the CPU's TSC (passed in as `now`), so the timer is as
//! deterministic as everything else.
//!
//! Follows the Intel SDM Vol. 3, chapter "Advanced Programmable Interrupt
//! Controller (APIC)", x2APIC mode only:
//! - Register access: RDMSR/WRMSR of an address the x2APIC register table
//!   does not list, RDMSR of a write-only register, WRMSR of a read-only
//!   register, and non-zero writes to reserved bits (including the upper 32
//!   bits of every register but the ICR) raise #GP ([`ApicGp`]); a faulting
//!   write changes nothing. Read-only status bits inside writable registers
//!   (delivery status, remote IRR) ignore writes and read 0. Reserved
//!   encodings of the ICR delivery mode (011b, 111b) and of the LVT timer
//!   mode (11b) raise #GP as well.
//! - A fixed interrupt accepted with trigger mode level (from an IOAPIC's
//!   level-triggered pin, or an ICR with bit 15 set) sets its TMR bit,
//!   an edge-triggered one clears it (SDM Vol. 3A, "Trigger Mode
//!   Register"). The EOI of an in-service vector whose TMR bit is set is
//!   broadcast to the IOAPICs ([`ApicWrite::EoiBroadcast`]); EOI-broadcast
//!   suppression is not offered.
//! - IA32_APIC_BASE selects the mode (SDM Vol. 3A, "x2APIC State
//!   Transitions"): disabled (EN=0, EXTD=0), xAPIC (EN=1, EXTD=0) or x2APIC
//!   (EN=1, EXTD=1). EN=0 with EXTD=1 is invalid, and so are x2APIC ->
//!   xAPIC and disabled -> x2APIC; each raises #GP. Entering the disabled
//!   state returns every register but the id to its reset value. The
//!   x2APIC MSRs exist only in x2APIC mode (#GP otherwise); in xAPIC mode
//!   the same registers are reached through the MMIO page, which the
//!   hypervisor decodes ([`Lapic::read_xapic`], [`Lapic::write_xapic`]).
//!   After RESET the APIC is in xAPIC mode ([`Lapic::at_reset`]); INIT
//!   keeps the mode.
//! - Errors are logged like the SDM's ESR: detected errors accumulate
//!   internally and become visible in the ESR when software writes it (with
//!   0); each detected error raises the LVT error interrupt if unmasked.

mod halt;
mod timer;
mod vectors;

#[cfg(test)]
mod tests;

use crate::mmu::paging::MAX_PHYS_ADDR_BITS;
use crate::vmx::{Ipi, IpiDest, IpiMode};
use timer::{Timer, TimerMode, DIVIDE_CONFIG_BITS, LVT_TIMER_MODE_MASK};
use vectors::VectorSet;

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

/// The APIC's mode, from IA32_APIC_BASE's EN (bit 11) and EXTD (bit 10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApicMode {
    /// EN=0: the processor behaves as one without an APIC.
    Disabled,
    /// EN=1, EXTD=0: registers through the MMIO page.
    Xapic,
    /// EN=1, EXTD=1: registers through MSRs 0x800-0x8ff.
    X2apic,
}

/// What a register write asks the outside world to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApicWrite {
    /// Nothing more.
    Done,
    /// An IPI was written to the ICR; self-IPIs are already in the IRR and
    /// never returned.
    ///
    /// A fixed-mode IPI whose destinations include this APIC as well as
    /// others (all-including-self shorthand, physical broadcast
    /// 0xffff_ffff, a logical destination matching this APIC's LDR) is
    /// already in this APIC's IRR too: the caller delivers fixed IPIs only
    /// to the *other* destinations (see [`Lapic::is_destination`]). Every
    /// other delivery mode, including lowest priority, is left entirely to
    /// the caller, self included.
    SendIpi(Ipi),
    /// The EOI of a level-triggered vector (its TMR bit set): the IOAPICs
    /// must see it. The ISR bit is already cleared.
    EoiBroadcast(u8),
}

/// The version register: version 0x15, highest LVT entry index 6 in bits
/// 23:16 (seven entries, CMCI included), bit 24 (directed EOI) clear.
const APIC_VERSION: u32 = 0x15 | ((LVT_ENTRIES as u32 - 1) << 16);

/// IA32_APIC_BASE: this processor is the bootstrap processor.
const APIC_BASE_BSP: u64 = 1 << 8;
/// IA32_APIC_BASE: x2APIC mode enable.
const APIC_BASE_X2APIC_ENABLE: u64 = 1 << 10;
/// IA32_APIC_BASE: APIC global enable.
const APIC_BASE_GLOBAL_ENABLE: u64 = 1 << 11;
/// IA32_APIC_BASE: the xAPIC MMIO base (bits 12 to MAXPHYADDR-1); kept but
/// meaningless in x2APIC mode.
const APIC_BASE_ADDRESS_MASK: u64 = ((1 << MAX_PHYS_ADDR_BITS) - 1) & !0xfff;
/// The reset value of the MMIO base.
const APIC_BASE_DEFAULT_ADDRESS: u64 = 0xfee0_0000;

/// SVR bits 7:0: the spurious-interrupt vector.
const SVR_VECTOR: u32 = 0xff;
/// SVR bit 8: APIC software enable.
const SVR_SOFTWARE_ENABLE: u32 = 1 << 8;
/// SVR bit 9: focus processor checking (stored, no effect: there is no
/// lowest-priority arbitration here).
const SVR_FOCUS_DISABLE: u32 = 1 << 9;
/// SVR bits that exist; bit 12 (EOI-broadcast suppression) is reserved
/// because the version register does not advertise it.
const SVR_WRITABLE: u32 = SVR_VECTOR | SVR_SOFTWARE_ENABLE | SVR_FOCUS_DISABLE;
/// SVR after reset: vector 0xff, software-disabled.
const SVR_RESET: u32 = 0xff;

/// LVT bits 7:0: the vector.
const LVT_VECTOR: u32 = 0xff;
/// LVT bits 10:8: delivery mode (not in the timer and error entries).
const LVT_DELIVERY_MODE: u32 = 0b111 << 8;
/// LVT bit 12: delivery status (read-only, always idle here).
const LVT_DELIVERY_STATUS: u32 = 1 << 12;
/// LVT delivery mode NMI (100b).
const LVT_DELIVERY_NMI: u32 = 0b100 << 8;
/// LVT delivery mode ExtINT (111b).
const LVT_DELIVERY_EXTINT: u32 = 0b111 << 8;
/// LINT bit 13: input pin polarity.
const LVT_PIN_POLARITY: u32 = 1 << 13;
/// LINT bit 14: remote IRR (read-only, 0: no level-triggered inputs).
const LVT_REMOTE_IRR: u32 = 1 << 14;
/// LINT bit 15: trigger mode.
const LVT_TRIGGER_MODE: u32 = 1 << 15;
/// LVT bit 16: masked.
const LVT_MASKED: u32 = 1 << 16;
/// Number of LVT entries.
const LVT_ENTRIES: usize = 7;

/// ESR bit 5: an illegal vector (0-15) in a message being sent.
const ESR_SEND_ILLEGAL_VECTOR: u32 = 1 << 5;
/// ESR bit 6: an illegal vector (0-15) in an interrupt received, generated
/// from the LVT or sent to self.
const ESR_RECEIVE_ILLEGAL_VECTOR: u32 = 1 << 6;

/// Vectors 0-15 are reserved for exceptions and never accepted.
const FIRST_LEGAL_VECTOR: u8 = 16;

/// ICR bits 7:0: vector.
const ICR_VECTOR: u64 = 0xff;
/// ICR bits 10:8: delivery mode.
const ICR_DELIVERY_MODE_SHIFT: u32 = 8;
/// ICR bit 11: logical destination mode.
const ICR_LOGICAL: u64 = 1 << 11;
/// ICR bit 12: delivery status. Removed in x2APIC mode; writes are
/// ignored and it reads as idle.
const ICR_DELIVERY_STATUS: u64 = 1 << 12;
/// ICR bit 14: level (assert).
const ICR_LEVEL_ASSERT: u64 = 1 << 14;
/// ICR bit 15: trigger mode (level).
const ICR_TRIGGER_LEVEL: u64 = 1 << 15;
/// ICR bits 19:18: destination shorthand.
const ICR_SHORTHAND_SHIFT: u32 = 18;
/// ICR bits 63:32: destination (x2APIC id or logical id).
const ICR_DESTINATION_SHIFT: u32 = 32;
/// ICR bits that exist in x2APIC mode; the rest (13, 17:16, 31:20) are
/// reserved.
const ICR_DEFINED: u64 = ICR_VECTOR
    | (0b111 << ICR_DELIVERY_MODE_SHIFT)
    | ICR_LOGICAL
    | ICR_DELIVERY_STATUS
    | ICR_LEVEL_ASSERT
    | ICR_TRIGGER_LEVEL
    | (0b11 << ICR_SHORTHAND_SHIFT)
    | (0xffff_ffff << ICR_DESTINATION_SHIFT);

/// The destination that addresses every APIC (physical or logical).
const BROADCAST_DESTINATION: u32 = 0xffff_ffff;

/// The LVT entries, in LVT index order (the version register counts them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LvtEntry {
    Cmci,
    Timer,
    Thermal,
    PerfCounter,
    Lint0,
    Lint1,
    Error,
}

impl LvtEntry {
    fn index(self) -> usize {
        self as usize
    }

    /// Bits software can set; everything outside these and
    /// [`LvtEntry::read_only_bits`] is reserved.
    fn writable_bits(self) -> u32 {
        match self {
            LvtEntry::Timer => LVT_VECTOR | LVT_MASKED | LVT_TIMER_MODE_MASK,
            LvtEntry::Error => LVT_VECTOR | LVT_MASKED,
            LvtEntry::Cmci | LvtEntry::Thermal | LvtEntry::PerfCounter => {
                LVT_VECTOR | LVT_DELIVERY_MODE | LVT_MASKED
            }
            LvtEntry::Lint0 | LvtEntry::Lint1 => {
                LVT_VECTOR | LVT_DELIVERY_MODE | LVT_PIN_POLARITY | LVT_TRIGGER_MODE | LVT_MASKED
            }
        }
    }

    /// Status bits software may write but that ignore the write.
    fn read_only_bits(self) -> u32 {
        match self {
            LvtEntry::Lint0 | LvtEntry::Lint1 => LVT_DELIVERY_STATUS | LVT_REMOTE_IRR,
            _ => LVT_DELIVERY_STATUS,
        }
    }
}

/// An x2APIC register, decoded from its MSR address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Register {
    Id,
    Version,
    Tpr,
    Ppr,
    Eoi,
    Ldr,
    Svr,
    /// ISR bits `32 * n ..= 32 * n + 31`.
    Isr(usize),
    Tmr(usize),
    Irr(usize),
    Esr,
    Lvt(LvtEntry),
    Icr,
    InitialCount,
    CurrentCount,
    DivideConfig,
    SelfIpi,
}

impl Register {
    /// The register at x2APIC MSR `msr`; `None` for reserved addresses
    /// (among them 0x809 APR, 0x80c RRD, 0x80e DFR and 0x831 ICR-high,
    /// which exist only in xAPIC mode).
    fn decode(msr: u32) -> Option<Register> {
        let bank = |first: u32| (msr - first) as usize;
        Some(match msr {
            0x802 => Register::Id,
            0x803 => Register::Version,
            0x808 => Register::Tpr,
            0x80a => Register::Ppr,
            0x80b => Register::Eoi,
            0x80d => Register::Ldr,
            0x80f => Register::Svr,
            0x810..=0x817 => Register::Isr(bank(0x810)),
            0x818..=0x81f => Register::Tmr(bank(0x818)),
            0x820..=0x827 => Register::Irr(bank(0x820)),
            0x828 => Register::Esr,
            0x82f => Register::Lvt(LvtEntry::Cmci),
            0x830 => Register::Icr,
            0x832 => Register::Lvt(LvtEntry::Timer),
            0x833 => Register::Lvt(LvtEntry::Thermal),
            0x834 => Register::Lvt(LvtEntry::PerfCounter),
            0x835 => Register::Lvt(LvtEntry::Lint0),
            0x836 => Register::Lvt(LvtEntry::Lint1),
            0x837 => Register::Lvt(LvtEntry::Error),
            0x838 => Register::InitialCount,
            0x839 => Register::CurrentCount,
            0x83e => Register::DivideConfig,
            0x83f => Register::SelfIpi,
            _ => return None,
        })
    }
}

/// A local APIC.
///
/// `Clone` is a complete snapshot (for migration and checkpoints): the
/// timer is stored as the TSC value of its next expiry, so a clone restored
/// on a CPU whose TSC continues from the same value behaves identically.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Lapic {
    id: u32,
    /// IA32_APIC_BASE.
    apic_base: u64,
    tpr: u8,
    svr: u32,
    irr: VectorSet,
    isr: VectorSet,
    /// The trigger mode of each accepted vector (1: level).
    #[serde(default)]
    tmr: VectorSet,
    /// The ESR as software reads it (latched by the last ESR write).
    esr: u32,
    /// Errors detected since the last ESR write.
    esr_pending: u32,
    /// LVT entries by [`LvtEntry::index`]; the timer entry without its mode
    /// bits, which live in `timer`.
    lvt: [u32; LVT_ENTRIES],
    /// The ICR as last written (delivery status clear).
    icr: u64,
    timer: Timer,
}

impl Lapic {
    /// A reset APIC with this x2APIC id that firmware has switched to
    /// x2APIC mode (IA32_APIC_BASE bits 10 and 11 set; the software-enable
    /// bit in the SVR is clear, as after reset): what faultline's own
    /// kernel and Linux are handed. [`Lapic::at_reset`] is the state after
    /// RESET.
    pub fn new(apic_id: u32) -> Self {
        let mut apic = Lapic::at_reset(apic_id);
        apic.apic_base |= APIC_BASE_X2APIC_ENABLE;
        apic
    }

    /// The APIC after RESET (SDM Vol. 3A, "Local APIC State After
    /// Power-Up or Reset"): globally enabled in xAPIC mode at 0xfee00000
    /// (IA32_APIC_BASE 0xfee00900 on the bootstrap processor), the SVR's
    /// software enable clear, every LVT entry masked.
    pub fn at_reset(apic_id: u32) -> Self {
        let bsp = if apic_id == 0 { APIC_BASE_BSP } else { 0 };
        Lapic {
            id: apic_id,
            apic_base: APIC_BASE_DEFAULT_ADDRESS | APIC_BASE_GLOBAL_ENABLE | bsp,
            tpr: 0,
            svr: SVR_RESET,
            irr: VectorSet::default(),
            isr: VectorSet::default(),
            tmr: VectorSet::default(),
            esr: 0,
            esr_pending: 0,
            lvt: [LVT_MASKED; LVT_ENTRIES],
            icr: 0,
            timer: Timer::default(),
        }
    }

    /// INIT: every register returns to its reset value except the x2APIC id
    /// and IA32_APIC_BASE (the APIC stays in x2APIC mode, as the SDM
    /// specifies for INIT in x2APIC mode). Pending and in-service
    /// interrupts are discarded and the timer is disarmed.
    pub fn reset(&mut self) {
        *self = Lapic {
            apic_base: self.apic_base,
            ..Lapic::new(self.id)
        };
    }

    /// The mode IA32_APIC_BASE selects.
    pub fn mode(&self) -> ApicMode {
        match (
            self.apic_base & APIC_BASE_GLOBAL_ENABLE != 0,
            self.apic_base & APIC_BASE_X2APIC_ENABLE != 0,
        ) {
            (false, _) => ApicMode::Disabled,
            (true, false) => ApicMode::Xapic,
            (true, true) => ApicMode::X2apic,
        }
    }

    /// The guest-physical base of the xAPIC MMIO page (meaningful in
    /// xAPIC mode only).
    pub fn mmio_base(&self) -> u64 {
        self.apic_base & APIC_BASE_ADDRESS_MASK
    }

    /// The x2APIC id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The logical x2APIC id (LDR), fixed by the x2APIC id in cluster
    /// mode: cluster `id >> 4` in bits 31:16, bit `id & 0xf` set in 15:0.
    pub fn logical_id(&self) -> u32 {
        ((self.id >> 4) << 16) | (1 << (self.id & 0xf))
    }

    /// Whether an IPI sent by the APIC `sender_id` to `dest` targets this
    /// APIC (for routing [`ApicWrite::SendIpi`]).
    pub fn is_destination(&self, dest: IpiDest, sender_id: u32) -> bool {
        match dest {
            IpiDest::Physical(id) => id == self.id || id == BROADCAST_DESTINATION,
            IpiDest::Logical(logical) => {
                let ldr = self.logical_id();
                logical == BROADCAST_DESTINATION
                    || (logical >> 16 == ldr >> 16 && logical & ldr & 0xffff != 0)
            }
            IpiDest::SelfOnly => sender_id == self.id,
            IpiDest::AllIncludingSelf => true,
            IpiDest::AllExcludingSelf => sender_id != self.id,
        }
    }

    /// RDMSR of IA32_APIC_BASE, IA32_TSC_DEADLINE or an x2APIC MSR.
    /// The x2APIC MSRs raise #GP unless the APIC is in x2APIC mode.
    pub fn read_msr(&self, msr: u32, now: u64) -> Result<u64, ApicGp> {
        let gp = ApicGp { msr };
        match msr {
            MSR_APIC_BASE => Ok(self.apic_base),
            MSR_TSC_DEADLINE => Ok(self.timer.tsc_deadline()),
            _ if self.mode() != ApicMode::X2apic => Err(gp),
            _ => {
                let register = Register::decode(msr).ok_or(gp)?;
                self.read_register(register, now).ok_or(gp)
            }
        }
    }

    /// A read of the xAPIC register with x2APIC MSR index
    /// `MSR_X2APIC_FIRST + (offset >> 4)` through the MMIO page, whatever
    /// the mode (the caller decodes the page only in xAPIC mode); `None`
    /// for a register the x2APIC table does not have or cannot read.
    pub fn read_xapic(&self, msr: u32, now: u64) -> Option<u64> {
        self.read_register(Register::decode(msr)?, now)
    }

    /// A write through the MMIO page (see [`Lapic::read_xapic`]); `Err`
    /// for what the x2APIC would refuse with #GP (an xAPIC drops it).
    pub fn write_xapic(&mut self, msr: u32, value: u64, now: u64) -> Result<ApicWrite, ApicGp> {
        self.update_timer(now);
        let result = match Register::decode(msr) {
            Some(register) => self.write_register(register, value, now),
            None => Err(()),
        };
        self.update_timer(now);
        result.map_err(|()| ApicGp { msr })
    }

    /// WRMSR of IA32_APIC_BASE, IA32_TSC_DEADLINE or an x2APIC MSR.
    pub fn write_msr(&mut self, msr: u32, value: u64, now: u64) -> Result<ApicWrite, ApicGp> {
        // Timer expiries up to `now` happened under the configuration
        // before this write (e.g. a periodic timer masked until now must not
        // fire for the periods it spent masked once this write unmasks it).
        self.update_timer(now);
        let gp = ApicGp { msr };
        let result = match msr {
            MSR_APIC_BASE => self.write_apic_base(value).map(|()| ApicWrite::Done),
            MSR_TSC_DEADLINE => {
                self.timer.write_tsc_deadline(value);
                Ok(ApicWrite::Done)
            }
            _ if self.mode() != ApicMode::X2apic => Err(()),
            _ => match Register::decode(msr) {
                Some(register) => self.write_register(register, value, now),
                None => Err(()),
            },
        };
        // A deadline already in the past fires at once.
        self.update_timer(now);
        result.map_err(|()| gp)
    }

    /// Moves an expired timer into the IRR (and re-arms a periodic one).
    pub fn update_timer(&mut self, now: u64) {
        if self.timer.fire_if_due(now) {
            let lvt = self.lvt[LvtEntry::Timer.index()];
            // A masked timer still counts; it just raises nothing.
            if lvt & LVT_MASKED == 0 {
                self.accept_interrupt(lvt_vector(lvt));
            }
        }
    }

    /// The TSC value at which the timer next fires, if armed and unmasked.
    /// It can be at or before the current TSC if [`Lapic::update_timer`]
    /// has not been called since then.
    pub fn next_timer_deadline(&self) -> Option<u64> {
        if self.lvt[LvtEntry::Timer.index()] & LVT_MASKED != 0 {
            return None;
        }
        self.timer.expiry()
    }

    /// Sets `vector` pending in the IRR (an IPI or device interrupt).
    ///
    /// A software-disabled APIC drops it (it accepts only NMI, SMI, INIT
    /// and SIPI, which the CPU handles without the IRR). An illegal vector
    /// (0-15) is not accepted either; it sets the ESR's receive-illegal-
    /// vector bit.
    pub fn accept_interrupt(&mut self, vector: u8) {
        self.accept_interrupt_triggered(vector, false);
    }

    /// [`Lapic::accept_interrupt`] with the message's trigger mode, which
    /// the TMR records (`level`: set, edge: clear).
    pub fn accept_interrupt_triggered(&mut self, vector: u8, level: bool) {
        if !self.software_enabled() {
            return;
        }
        if vector < FIRST_LEGAL_VECTOR {
            self.record_error(ESR_RECEIVE_ILLEGAL_VECTOR);
            return;
        }
        self.irr.insert(vector);
        if level {
            self.tmr.insert(vector);
        } else {
            self.tmr.remove(vector);
        }
    }

    /// Whether the 8259 PIC's INTR output reaches the processor: with the
    /// APIC globally disabled, or through LINT0 unmasked in ExtINT
    /// delivery mode (virtual-wire mode). Such an interrupt bypasses the
    /// IRR and ISR: the processor takes its vector from the PIC.
    pub fn accepts_pic_interrupts(&self) -> bool {
        let lint0 = self.lvt[LvtEntry::Lint0.index()];
        self.mode() == ApicMode::Disabled
            || (lint0 & LVT_MASKED == 0 && lint0 & LVT_DELIVERY_MODE == LVT_DELIVERY_EXTINT)
    }

    /// What a PC BIOS leaves the APIC in (MP specification, virtual-wire
    /// mode): software-enabled (SVR 0x1ff), LINT0 unmasked ExtINT (the
    /// PIC's output), LINT1 unmasked NMI.
    pub fn enter_virtual_wire_mode(&mut self) {
        self.write_svr(SVR_SOFTWARE_ENABLE | 0xff);
        self.lvt[LvtEntry::Lint0.index()] = LVT_DELIVERY_EXTINT;
        self.lvt[LvtEntry::Lint1.index()] = LVT_DELIVERY_NMI;
    }

    /// TMR0..TMR7 (vectors 0-31 first), for debugging.
    pub fn tmr(&self) -> [u32; 8] {
        self.tmr.registers()
    }

    /// The highest-priority pending vector that the processor priority
    /// allows to be delivered now, if any (does not change state): the
    /// highest IRR vector whose priority class (bits 7:4) is above the PPR's,
    /// and only while the APIC is software-enabled (a disabled APIC holds
    /// its IRR).
    pub fn deliverable_vector(&self) -> Option<u8> {
        if !self.software_enabled() {
            return None;
        }
        let vector = self.irr.highest()?;
        (priority_class(vector) > priority_class(self.ppr())).then_some(vector)
    }

    /// The CPU is delivering `vector`: IRR -> ISR. Does nothing if `vector`
    /// is not pending.
    pub fn start_delivery(&mut self, vector: u8) {
        if self.irr.contains(vector) {
            self.irr.remove(vector);
            self.isr.insert(vector);
        }
    }

    /// CR8 view of the TPR (TPR bits 7:4).
    pub fn cr8(&self) -> u64 {
        u64::from(self.tpr >> 4)
    }

    /// MOV to CR8: TPR bits 7:4 = CR8 bits 3:0, TPR bits 3:0 = 0. (Reserved
    /// CR8 bits are the CPU's to reject; they are ignored here.)
    pub fn set_cr8(&mut self, value: u64) {
        self.tpr = ((value & 0xf) as u8) << 4;
    }

    /// Whether the APIC is software-enabled (SVR bit 8); when disabled it
    /// accepts no interrupts except NMI/INIT/SIPI.
    pub fn software_enabled(&self) -> bool {
        self.svr & SVR_SOFTWARE_ENABLE != 0
    }

    /// The task-priority register.
    pub fn tpr(&self) -> u8 {
        self.tpr
    }

    /// The processor-priority register: the TPR, or the priority class of
    /// the highest in-service vector if that class is higher.
    pub fn ppr(&self) -> u8 {
        let in_service_class = self.isr.highest().map_or(0, priority_class);
        if priority_class(self.tpr) >= in_service_class {
            self.tpr
        } else {
            in_service_class
        }
    }

    /// IRR0..IRR7 (vectors 0-31 first), for debugging.
    pub fn irr(&self) -> [u32; 8] {
        self.irr.registers()
    }

    /// ISR0..ISR7 (vectors 0-31 first), for debugging.
    pub fn isr(&self) -> [u32; 8] {
        self.isr.registers()
    }

    /// The register's value, or `None` if reading it raises #GP.
    fn read_register(&self, register: Register, now: u64) -> Option<u64> {
        let value = match register {
            Register::Id => self.id,
            Register::Version => APIC_VERSION,
            Register::Tpr => u32::from(self.tpr),
            Register::Ppr => u32::from(self.ppr()),
            Register::Ldr => self.logical_id(),
            Register::Svr => self.svr,
            Register::Isr(index) => self.isr.register(index),
            // Everything is edge-triggered.
            Register::Tmr(index) => self.tmr.register(index),
            Register::Irr(index) => self.irr.register(index),
            Register::Esr => self.esr,
            Register::Lvt(entry) => self.read_lvt(entry),
            Register::Icr => return Some(self.icr),
            Register::InitialCount => self.timer.initial_count(),
            Register::CurrentCount => self.timer.current_count(now),
            Register::DivideConfig => self.timer.divide_config(),
            Register::Eoi | Register::SelfIpi => return None,
        };
        Some(u64::from(value))
    }

    /// Writes a register; `Err(())` means #GP and nothing changed.
    fn write_register(
        &mut self,
        register: Register,
        value: u64,
        now: u64,
    ) -> Result<ApicWrite, ()> {
        // `value` as a 32-bit register value with only `defined` bits set;
        // only the ICR is 64 bits wide, the upper halves of the others are
        // reserved.
        let checked = |defined: u32| match u32::try_from(value) {
            Ok(low) if low & !defined == 0 => Ok(low),
            _ => Err(()),
        };
        match register {
            Register::Icr => return self.write_icr(value),
            Register::Tpr => self.tpr = checked(0xff)? as u8,
            Register::Eoi => {
                checked(0)?;
                if let Some(vector) = self.end_of_interrupt() {
                    return Ok(ApicWrite::EoiBroadcast(vector));
                }
            }
            Register::Svr => self.write_svr(checked(SVR_WRITABLE)?),
            Register::Esr => {
                checked(0)?;
                self.esr = std::mem::take(&mut self.esr_pending);
            }
            Register::Lvt(entry) => self.write_lvt(entry, checked(u32::MAX)?)?,
            Register::InitialCount => self.timer.write_initial_count(checked(u32::MAX)?, now),
            Register::DivideConfig => {
                self.timer
                    .write_divide_config(checked(DIVIDE_CONFIG_BITS)?, now);
            }
            Register::SelfIpi => self.send_to_self(checked(0xff)? as u8),
            Register::Id
            | Register::Version
            | Register::Ppr
            | Register::Ldr
            | Register::Isr(_)
            | Register::Tmr(_)
            | Register::Irr(_)
            | Register::CurrentCount => return Err(()),
        }
        Ok(ApicWrite::Done)
    }

    /// IA32_APIC_BASE (SDM Vol. 3A, "x2APIC State Transitions"): the MMIO
    /// base may change; reserved bits, the invalid state (EN=0, EXTD=1),
    /// x2APIC -> xAPIC and disabled -> x2APIC raise #GP. Entering the
    /// disabled state resets every register but the id (IRR, ISR and the
    /// timer are lost, as the SDM warns). The BSP flag is the hardware's and
    /// ignores writes.
    fn write_apic_base(&mut self, value: u64) -> Result<(), ()> {
        let modes = APIC_BASE_GLOBAL_ENABLE | APIC_BASE_X2APIC_ENABLE;
        let defined = APIC_BASE_ADDRESS_MASK | modes | APIC_BASE_BSP;
        if value & !defined != 0 {
            return Err(());
        }
        let new = match (
            value & APIC_BASE_GLOBAL_ENABLE != 0,
            value & APIC_BASE_X2APIC_ENABLE != 0,
        ) {
            (false, true) => return Err(()),
            (false, false) => ApicMode::Disabled,
            (true, false) => ApicMode::Xapic,
            (true, true) => ApicMode::X2apic,
        };
        let old = self.mode();
        match (old, new) {
            (ApicMode::X2apic, ApicMode::Xapic) | (ApicMode::Disabled, ApicMode::X2apic) => {
                return Err(())
            }
            _ => {}
        }
        let apic_base =
            (value & (APIC_BASE_ADDRESS_MASK | modes)) | (self.apic_base & APIC_BASE_BSP);
        if new == ApicMode::Disabled && old != ApicMode::Disabled {
            *self = Lapic::at_reset(self.id);
        }
        self.apic_base = apic_base;
        Ok(())
    }

    /// SVR: clearing the software enable masks every LVT entry (they stay
    /// masked until software unmasks them after re-enabling).
    fn write_svr(&mut self, value: u32) {
        self.svr = value;
        if !self.software_enabled() {
            for entry in &mut self.lvt {
                *entry |= LVT_MASKED;
            }
        }
    }

    fn read_lvt(&self, entry: LvtEntry) -> u32 {
        let stored = self.lvt[entry.index()];
        match entry {
            LvtEntry::Timer => stored | self.timer.mode().lvt_bits(),
            _ => stored,
        }
    }

    /// An LVT entry: reserved bits (and the reserved timer mode) raise #GP,
    /// read-only status bits are ignored, and while the APIC is
    /// software-disabled the mask bit cannot be cleared.
    fn write_lvt(&mut self, entry: LvtEntry, value: u32) -> Result<(), ()> {
        if value & !(entry.writable_bits() | entry.read_only_bits()) != 0 {
            return Err(());
        }
        if entry == LvtEntry::Timer {
            let mode = TimerMode::from_lvt(value).ok_or(())?;
            self.timer.set_mode(mode);
        }
        let mut stored = value & entry.writable_bits() & !LVT_TIMER_MODE_MASK;
        if !self.software_enabled() {
            stored |= LVT_MASKED;
        }
        self.lvt[entry.index()] = stored;
        Ok(())
    }

    /// EOI: the highest in-service vector is done; `Some(vector)` when
    /// it was level-triggered (its TMR bit set), for the EOI broadcast.
    fn end_of_interrupt(&mut self) -> Option<u8> {
        let vector = self.isr.highest()?;
        self.isr.remove(vector);
        self.tmr.contains(vector).then_some(vector)
    }

    /// The SELF IPI register: a fixed, edge-triggered IPI to this APIC.
    fn send_to_self(&mut self, vector: u8) {
        if vector < FIRST_LEGAL_VECTOR {
            self.record_error(ESR_SEND_ILLEGAL_VECTOR);
        }
        // Receiving it checks the vector again (receive-illegal-vector).
        self.accept_interrupt(vector);
    }

    /// ICR write: decodes the IPI, delivers the fixed-mode part aimed at
    /// this APIC, and hands the rest to the caller (see [`ApicWrite`]).
    fn write_icr(&mut self, value: u64) -> Result<ApicWrite, ()> {
        if value & !ICR_DEFINED != 0 {
            return Err(());
        }
        let mode = match (value >> ICR_DELIVERY_MODE_SHIFT) & 0b111 {
            0b000 => IpiMode::Fixed,
            0b001 => IpiMode::LowestPriority,
            0b010 => IpiMode::Smi,
            0b100 => IpiMode::Nmi,
            0b101 => IpiMode::Init,
            0b110 => IpiMode::Startup,
            _ => return Err(()),
        };
        let destination = (value >> ICR_DESTINATION_SHIFT) as u32;
        let dest = match (value >> ICR_SHORTHAND_SHIFT) & 0b11 {
            0b00 if value & ICR_LOGICAL != 0 => IpiDest::Logical(destination),
            0b00 => IpiDest::Physical(destination),
            0b01 => IpiDest::SelfOnly,
            0b10 => IpiDest::AllIncludingSelf,
            _ => IpiDest::AllExcludingSelf,
        };
        // INIT de-assert is recognised by `level_assert == false`; a fixed
        // IPI's trigger mode goes to the receivers' TMR.
        let ipi = Ipi {
            dest,
            vector: (value & ICR_VECTOR) as u8,
            mode,
            level_assert: value & ICR_LEVEL_ASSERT != 0,
            trigger_level: value & ICR_TRIGGER_LEVEL != 0,
        };
        self.icr = value & !ICR_DELIVERY_STATUS;

        let carries_vector = matches!(mode, IpiMode::Fixed | IpiMode::LowestPriority);
        if mode == IpiMode::Fixed && self.is_destination(dest, self.id) {
            self.accept_interrupt_triggered(ipi.vector, ipi.trigger_level);
        }
        if carries_vector && ipi.vector < FIRST_LEGAL_VECTOR {
            // The message is not sent.
            self.record_error(ESR_SEND_ILLEGAL_VECTOR);
            return Ok(ApicWrite::Done);
        }
        let only_self = matches!(dest, IpiDest::SelfOnly)
            || (dest == IpiDest::Physical(self.id) && self.id != BROADCAST_DESTINATION);
        if mode == IpiMode::Fixed && only_self {
            Ok(ApicWrite::Done)
        } else {
            Ok(ApicWrite::SendIpi(ipi))
        }
    }

    /// Logs an error for the ESR and raises the LVT error interrupt if
    /// unmasked (an illegal vector in the LVT error entry itself only logs
    /// receive-illegal-vector, so errors never recurse).
    fn record_error(&mut self, error: u32) {
        self.esr_pending |= error;
        let lvt = self.lvt[LvtEntry::Error.index()];
        if lvt & LVT_MASKED == 0 {
            let vector = lvt_vector(lvt);
            if vector < FIRST_LEGAL_VECTOR {
                self.esr_pending |= ESR_RECEIVE_ILLEGAL_VECTOR;
            } else {
                self.irr.insert(vector);
            }
        }
    }
}

/// The priority class of a vector or priority (bits 7:4).
fn priority_class(priority: u8) -> u8 {
    priority & 0xf0
}

/// The vector field of an LVT entry.
fn lvt_vector(lvt: u32) -> u8 {
    (lvt & LVT_VECTOR) as u8
}

impl Lapic {
    /// Checks an APIC restored from a snapshot: the id must be `apic_id`
    /// (the CPU it is restored into) and every register must hold a value
    /// the guest could have written, so restoring never gives the APIC a
    /// state its code was not written for.
    pub fn check_restored(&self, apic_id: u32) -> Result<(), String> {
        if self.id != apic_id {
            return Err(format!(
                "APIC id {} restored into the CPU with APIC id {apic_id}",
                self.id
            ));
        }
        let base_bits = APIC_BASE_ADDRESS_MASK
            | APIC_BASE_BSP
            | APIC_BASE_X2APIC_ENABLE
            | APIC_BASE_GLOBAL_ENABLE;
        if self.apic_base & !base_bits != 0 {
            return Err(format!(
                "IA32_APIC_BASE {:#x} has reserved bits",
                self.apic_base
            ));
        }
        if self.svr & !SVR_WRITABLE != 0 {
            return Err(format!("APIC SVR {:#x} has reserved bits", self.svr));
        }
        self.timer.check_restored()
    }
}
