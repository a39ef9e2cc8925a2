//! The I/O APIC at 0xfec00000 (82093AA-style, version 0x20): 24 pins,
//! each with a redirection entry naming a vector, delivery mode,
//! destination, polarity, trigger mode and mask. A pin that fires sends an
//! interrupt message to the local APICs it names.
//!
//! Level-triggered pins set Remote IRR on delivery and fire again only
//! after an EOI for their vector: the local APICs broadcast the EOI of a
//! level-triggered vector (`Platform::eoi_broadcast`), and version 0x20
//! also has the directed-EOI register at 0x40. Its messages carry the
//! pin's trigger mode, which the receiving local APIC records in its TMR.
//! With an Intel IOMMU attached ([`IoApic::set_remappable`]), an entry
//! with bit 48 set is in remappable format (VT-d spec 5.1.5.1): bits
//! 63:49 and 11 hold an interrupt index, and the pin's message goes to the
//! IOMMU's interrupt remapping ([`IoApic::take_remap_requests`]) instead
//! of straight to the local APICs. The entry's vector still names the
//! pin for EOI matching, as the spec asks software to keep it equal to
//! the IRTE's.
//! The UART pulses its ISA line (IRQ 4); the test device of multiboot
//! kernels (`testdev`) sets line levels ([`IoApic::set_line`]).

use super::vtd::IoApicRequest;
use machine::vmx::{Ipi, IpiDest, IpiMode};

/// Guest-physical base of the IOAPIC's registers.
pub const IOAPIC_BASE: u64 = 0xfec0_0000;
/// Size of its MMIO window.
pub const IOAPIC_SIZE: u64 = 0x1000;
/// Pins (GSIs 0..24).
pub const IOAPIC_PINS: usize = 24;
/// Its id (the MADT says the same).
pub const IOAPIC_ID: u8 = 0;

const IOREGSEL: u64 = 0x00;
const IOWIN: u64 = 0x10;
const EOI: u64 = 0x40;

const REG_ID: u32 = 0x00;
const REG_VERSION: u32 = 0x01;
const REG_ARBITRATION: u32 = 0x02;
const REG_REDIRECTION: u32 = 0x10;
/// Version 0x20 with `IOAPIC_PINS - 1` as the highest entry.
const VERSION: u32 = 0x20 | ((IOAPIC_PINS as u32 - 1) << 16);

mod entry {
    pub const VECTOR: u64 = 0xff;
    pub const DELIVERY_MODE_SHIFT: u32 = 8;
    pub const DEST_LOGICAL: u64 = 1 << 11;
    pub const DELIVERY_STATUS: u64 = 1 << 12;
    pub const REMOTE_IRR: u64 = 1 << 14;
    pub const LEVEL: u64 = 1 << 15;
    pub const MASKED: u64 = 1 << 16;
    pub const DEST_SHIFT: u32 = 56;
    /// Interrupt format: remappable (with an IOMMU).
    pub const REMAPPABLE: u64 = 1 << 48;
    pub const INDEX_SHIFT: u32 = 49;
    pub const INDEX_15: u64 = 1 << 11;
    /// Bits the guest can write (delivery status and Remote IRR are
    /// read-only).
    pub const WRITABLE: u64 = !(DELIVERY_STATUS | REMOTE_IRR);
}

/// The IOAPIC's state.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct IoApic {
    select: u32,
    id: u32,
    redirection: [u64; IOAPIC_PINS],
    /// Line levels (a pulse leaves its line low).
    asserted: [bool; IOAPIC_PINS],
    /// Whether bit 48 selects the remappable format (an IOMMU with
    /// interrupt remapping is attached).
    #[serde(default)]
    remappable: bool,
    /// Remappable-format messages waiting for the IOMMU (taken before any
    /// vCPU runs again, so never saved).
    #[serde(skip)]
    remap_requests: Vec<IoApicRequest>,
}

impl Default for IoApic {
    fn default() -> Self {
        IoApic {
            select: 0,
            id: u32::from(IOAPIC_ID) << 24,
            // Every pin masked at reset.
            redirection: [entry::MASKED; IOAPIC_PINS],
            asserted: [false; IOAPIC_PINS],
            remappable: false,
            remap_requests: Vec::new(),
        }
    }
}

impl IoApic {
    /// Whether a restored IOAPIC's id register holds what a guest could
    /// have written (bits 27:24 only). Any redirection entry and select
    /// value is one the device already handles.
    pub fn check_restored(&self) -> Result<(), String> {
        if self.id & !(0xf << 24) != 0 {
            return Err(format!(
                "IOAPIC id register {:#x} has reserved bits",
                self.id
            ));
        }
        Ok(())
    }
}

impl IoApic {
    /// Honour remappable-format entries (an IOMMU is attached).
    pub fn set_remappable(&mut self, remappable: bool) {
        self.remappable = remappable;
    }

    /// Whether remappable-format messages wait for the IOMMU.
    pub fn has_remap_requests(&self) -> bool {
        !self.remap_requests.is_empty()
    }

    /// The remappable-format messages sent since the last call.
    pub fn take_remap_requests(&mut self) -> Vec<IoApicRequest> {
        std::mem::take(&mut self.remap_requests)
    }

    /// A 32-bit read at `offset` in the MMIO window (other sizes read the
    /// same register, truncated by the caller).
    pub fn read(&self, offset: u64) -> u32 {
        match offset {
            IOREGSEL => self.select,
            IOWIN => self.read_register(self.select),
            _ => 0,
        }
    }

    /// A write at `offset`; returns the messages it causes (a level pin
    /// still asserted after its EOI fires again).
    pub fn write(&mut self, offset: u64, value: u32) -> Vec<Ipi> {
        match offset {
            IOREGSEL => self.select = value & 0xff,
            IOWIN => return self.write_register(self.select, value),
            EOI => return self.eoi(value as u8),
            _ => {}
        }
        Vec::new()
    }

    fn read_register(&self, reg: u32) -> u32 {
        match reg {
            REG_ID => self.id,
            REG_VERSION => VERSION,
            REG_ARBITRATION => self.id,
            r => match Self::redirection_index(r) {
                Some((pin, high)) => {
                    let e = self.redirection[pin];
                    if high {
                        (e >> 32) as u32
                    } else {
                        e as u32
                    }
                }
                None => 0,
            },
        }
    }

    fn write_register(&mut self, reg: u32, value: u32) -> Vec<Ipi> {
        match reg {
            REG_ID => self.id = value & (0xf << 24),
            r => {
                if let Some((pin, high)) = Self::redirection_index(r) {
                    let old = self.redirection[pin];
                    let merged = if high {
                        (old & 0xffff_ffff) | (u64::from(value) << 32)
                    } else {
                        (old & !0xffff_ffff) | u64::from(value)
                    };
                    self.redirection[pin] = (merged & entry::WRITABLE) | (old & !entry::WRITABLE);
                    // Unmasking a level pin whose line is up delivers it.
                    return self.service_level(pin).into_iter().collect();
                }
            }
        }
        Vec::new()
    }

    fn redirection_index(reg: u32) -> Option<(usize, bool)> {
        let index = reg.checked_sub(REG_REDIRECTION)? as usize;
        (index < 2 * IOAPIC_PINS).then_some((index / 2, index % 2 == 1))
    }

    /// An edge on `pin` (an edge-triggered source pulsed its line):
    /// the message, unless the pin is masked or out of range.
    pub fn pulse(&mut self, pin: usize) -> Option<Ipi> {
        let e = *self.redirection.get(pin)?;
        if e & entry::MASKED != 0 {
            return None;
        }
        if e & entry::LEVEL != 0 {
            // A level pin given a pulse: up, delivered, down again.
            self.asserted[pin] = true;
            let message = self.service_level(pin);
            self.asserted[pin] = false;
            return message;
        }
        self.message(e)
    }

    /// Sets the level of `pin`'s input line: an edge-triggered pin fires
    /// on a rising edge (if unmasked then; an edge while masked is lost),
    /// a level-triggered one while the line is up, once per EOI.
    pub fn set_line(&mut self, pin: usize, level: bool) -> Option<Ipi> {
        let was = std::mem::replace(self.asserted.get_mut(pin)?, level);
        let e = self.redirection[pin];
        if e & entry::LEVEL != 0 {
            return self.service_level(pin);
        }
        if level && !was && e & entry::MASKED == 0 {
            return self.message(e);
        }
        None
    }

    /// Sets the line level of a level-triggered `pin`.
    pub fn set_level(&mut self, pin: usize, asserted: bool) -> Option<Ipi> {
        *self.asserted.get_mut(pin)? = asserted;
        self.service_level(pin)
    }

    fn service_level(&mut self, pin: usize) -> Option<Ipi> {
        let e = self.redirection[pin];
        if e & entry::LEVEL == 0
            || !self.asserted[pin]
            || e & (entry::MASKED | entry::REMOTE_IRR) != 0
        {
            return None;
        }
        self.redirection[pin] |= entry::REMOTE_IRR;
        self.message(e)
    }

    /// An EOI for `vector`: clears Remote IRR of the level pins using it
    /// and delivers those whose line is still up.
    pub fn eoi(&mut self, vector: u8) -> Vec<Ipi> {
        let mut messages = Vec::new();
        for pin in 0..IOAPIC_PINS {
            let e = self.redirection[pin];
            if e & entry::REMOTE_IRR != 0 && (e & entry::VECTOR) as u8 == vector {
                self.redirection[pin] &= !entry::REMOTE_IRR;
                messages.extend(self.service_level(pin));
            }
        }
        messages
    }

    /// The message entry `e` sends: to the local APICs, or (remappable
    /// format) queued for the IOMMU.
    fn message(&mut self, e: u64) -> Option<Ipi> {
        if self.remappable && e & entry::REMAPPABLE != 0 {
            let index = ((e >> entry::INDEX_SHIFT) & 0x7fff) as u16
                | (u16::from(e & entry::INDEX_15 != 0) << 15);
            self.remap_requests.push(IoApicRequest {
                index,
                vector: (e & entry::VECTOR) as u8,
                level: e & entry::LEVEL != 0,
            });
            return None;
        }
        Some(Self::compatibility_message(e))
    }

    fn compatibility_message(e: u64) -> Ipi {
        let dest = (e >> entry::DEST_SHIFT) as u32;
        Ipi {
            dest: if e & entry::DEST_LOGICAL != 0 {
                IpiDest::Logical(dest)
            } else if dest == 0xff {
                IpiDest::Physical(u32::MAX)
            } else {
                IpiDest::Physical(dest)
            },
            vector: (e & entry::VECTOR) as u8,
            mode: match (e >> entry::DELIVERY_MODE_SHIFT) & 7 {
                1 => IpiMode::LowestPriority,
                _ => IpiMode::Fixed,
            },
            level_assert: true,
            trigger_level: e & entry::LEVEL != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(ioapic: &mut IoApic, pin: u32, low: u32, dest: u32) {
        ioapic.write(IOREGSEL, REG_REDIRECTION + 2 * pin + 1);
        ioapic.write(IOWIN, dest << 24);
        ioapic.write(IOREGSEL, REG_REDIRECTION + 2 * pin);
        ioapic.write(IOWIN, low);
    }

    #[test]
    fn id_and_version_registers() {
        let mut ioapic = IoApic::default();
        ioapic.write(IOREGSEL, REG_VERSION);
        assert_eq!(ioapic.read(IOWIN), 0x0017_0020);
        ioapic.write(IOREGSEL, REG_ID);
        assert_eq!(ioapic.read(IOWIN), 0);
        assert_eq!(ioapic.read(IOREGSEL), REG_ID);
    }

    #[test]
    fn masked_pins_stay_quiet_and_unmasked_edges_deliver() {
        let mut ioapic = IoApic::default();
        assert_eq!(ioapic.pulse(4), None, "masked at reset");
        program(&mut ioapic, 4, 0x34, 2);
        let ipi = ioapic.pulse(4).unwrap();
        assert_eq!((ipi.vector, ipi.dest), (0x34, IpiDest::Physical(2)));
        assert_eq!(
            ioapic.pulse(4).map(|i| i.vector),
            Some(0x34),
            "edges repeat"
        );
        assert_eq!(ioapic.pulse(99), None);
        // Remote IRR is read-only.
        ioapic.write(IOREGSEL, REG_REDIRECTION + 8);
        assert_eq!(ioapic.read(IOWIN), 0x34);
    }

    #[test]
    fn edge_pins_fire_on_rising_edges_of_their_line() {
        let mut ioapic = IoApic::default();
        program(&mut ioapic, 14, 0x76, 0);
        let ipi = ioapic.set_line(14, true).unwrap();
        assert_eq!((ipi.vector, ipi.trigger_level), (0x76, false));
        assert!(ioapic.set_line(14, true).is_none(), "no edge: still high");
        assert!(ioapic.set_line(14, false).is_none());
        assert!(ioapic.set_line(14, true).is_some());
        // A level pin whose line stays up fires again after each EOI.
        ioapic.set_line(14, false);
        program(&mut ioapic, 14, 0x77 | entry::LEVEL as u32, 0);
        assert!(ioapic.set_line(14, true).unwrap().trigger_level);
        assert!(ioapic.set_line(14, true).is_none(), "Remote IRR set");
        assert_eq!(ioapic.eoi(0x77).len(), 1);
        ioapic.set_line(14, false);
        assert!(ioapic.eoi(0x77).is_empty());
    }

    #[test]
    fn level_pins_wait_for_eoi() {
        let mut ioapic = IoApic::default();
        program(&mut ioapic, 9, 0x41 | entry::LEVEL as u32, 0);
        assert!(ioapic.set_level(9, true).is_some());
        assert!(ioapic.set_level(9, true).is_none(), "Remote IRR set");
        ioapic.write(IOREGSEL, REG_REDIRECTION + 18);
        assert_ne!(u64::from(ioapic.read(IOWIN)) & entry::REMOTE_IRR, 0);
        assert_eq!(ioapic.write(EOI, 0x41).len(), 1, "still asserted: again");
        ioapic.set_level(9, false);
        assert!(ioapic.write(EOI, 0x41).is_empty());
        assert!(ioapic.set_level(9, true).is_some());
    }

    #[test]
    fn remappable_entries_go_to_the_iommu_only_when_one_is_attached() {
        // Index 0x8005: bits 63:49 hold 5, bit 11 index bit 15.
        let low = 0xed | entry::INDEX_15 as u32;
        let high = ((entry::REMAPPABLE | (5 << entry::INDEX_SHIFT)) >> 32) as u32;
        let mut plain = IoApic::default();
        plain.write(IOREGSEL, REG_REDIRECTION + 2 * 16 + 1);
        plain.write(IOWIN, high);
        plain.write(IOREGSEL, REG_REDIRECTION + 2 * 16);
        plain.write(IOWIN, low);
        assert!(
            plain.set_line(16, true).is_some(),
            "no IOMMU: bit 48 is ignored"
        );
        assert!(!plain.has_remap_requests());
        let mut ioapic = IoApic::default();
        ioapic.set_remappable(true);
        ioapic.write(IOREGSEL, REG_REDIRECTION + 2 * 16 + 1);
        ioapic.write(IOWIN, high);
        ioapic.write(IOREGSEL, REG_REDIRECTION + 2 * 16);
        ioapic.write(IOWIN, low);
        assert_eq!(ioapic.set_line(16, true), None);
        assert_eq!(
            ioapic.take_remap_requests(),
            vec![IoApicRequest {
                index: 0x8005,
                vector: 0xed,
                level: false
            }]
        );
        assert!(!ioapic.has_remap_requests());
    }
}
