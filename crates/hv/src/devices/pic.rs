//! The legacy 8259A interrupt controller pair (master at ports 0x20/0x21,
//! slave at 0xa0/0xa1 cascaded on the master's IRQ 2), attached for
//! multiboot kernels only ([`super::Platform::attach_test_devices`]).
//!
//! Modelled from the 8259A data sheet: the ICW1-ICW4 initialization
//! sequence, the interrupt mask (OCW1), non-specific, specific and
//! rotating EOIs (OCW2), reading IRR or ISR (OCW3), automatic EOI,
//! edge-triggered inputs (an IRR bit latches on a rising edge and stays
//! until acknowledged) and fully nested priority with rotation. Not
//! modelled: level-triggered inputs (the ELCR), special mask and special
//! fully nested modes, poll mode (OCW3's P bit reads as an IRR read) and
//! buffered mode.
//!
//! Its output reaches a vCPU as an external interrupt through LINT0 in
//! ExtINT mode (virtual-wire mode, which faultline's firmware sets up for
//! multiboot kernels) or with the local APIC globally disabled:
//! [`Pic::output`] says whether it requests an interrupt and
//! [`Pic::acknowledge`] is the INTA cycle that yields the vector.
//!
//! faultline hands the pair over initialized as a PC BIOS leaves it
//! (vector bases 0x08 and 0x70) with only IRQ 4, the UART's, masked (a
//! kernel that takes COM1's interrupts routes them through the IOAPIC,
//! and would otherwise get them twice). The test device's lines stay
//! unmasked: the suite's `realmode` waits in HLT for the IRQ 11 it
//! raises (on QEMU, SeaBIOS masks IRQ 11 and the HLT ends at the BIOS
//! timer tick instead; faultline has no PIT). The kvm-unit-tests library
//! masks every line at setup.

/// The master's command port.
pub const MASTER_PORT: u16 = 0x20;
/// The slave's command port.
pub const SLAVE_PORT: u16 = 0xa0;
/// The master input the slave is cascaded on.
const CASCADE_IRQ: u8 = 2;
/// The master's mask at handover: IRQ 4 (COM1).
const HANDOVER_MASTER_IMR: u8 = 1 << 4;

/// One 8259A.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Chip {
    irr: u8,
    isr: u8,
    imr: u8,
    /// The input levels, for edge detection.
    lines: u8,
    vector_base: u8,
    /// The lowest-priority input is `priority_add - 1` (mod 8).
    priority_add: u8,
    /// The next data-port write is ICW2, ICW3 or ICW4 (1, 2, 3); 0: OCW1.
    init_step: u8,
    /// ICW1 asked for ICW4.
    expect_icw4: bool,
    /// ICW1 said single (no ICW3).
    single: bool,
    auto_eoi: bool,
    rotate_on_auto_eoi: bool,
    /// OCW3: reads of the command port give the ISR (else the IRR).
    read_isr: bool,
}

impl Chip {
    fn bios_state(vector_base: u8, imr: u8) -> Chip {
        Chip {
            vector_base,
            imr,
            ..Chip::default()
        }
    }

    /// Sets input `irq`'s level: a rising edge latches the IRR bit.
    fn set_line(&mut self, irq: u8, level: bool) {
        let bit = 1 << irq;
        if level && self.lines & bit == 0 {
            self.irr |= bit;
        }
        if level {
            self.lines |= bit;
        } else {
            self.lines &= !bit;
        }
    }

    /// The highest-priority input set in `mask`, by the rotation.
    fn highest(&self, mask: u8) -> Option<u8> {
        (0..8)
            .map(|i| (i + self.priority_add) & 7)
            .find(|&irq| mask & (1 << irq) != 0)
    }

    /// The input this chip requests service for: the highest-priority
    /// unmasked IRR bit above every in-service one (fully nested).
    fn request(&self) -> Option<u8> {
        let irq = self.highest(self.irr & !self.imr)?;
        match self.highest(self.isr) {
            Some(busy) if self.priority(busy) <= self.priority(irq) => None,
            _ => Some(irq),
        }
    }

    /// 0 is the highest priority.
    fn priority(&self, irq: u8) -> u8 {
        irq.wrapping_sub(self.priority_add) & 7
    }

    /// INTA for `irq`: IRR -> ISR (or not, with automatic EOI).
    fn acknowledge(&mut self, irq: u8) {
        let bit = 1 << irq;
        self.irr &= !bit;
        if self.auto_eoi {
            if self.rotate_on_auto_eoi {
                self.priority_add = (irq + 1) & 7;
            }
        } else {
            self.isr |= bit;
        }
    }

    fn read(&self, data_port: bool) -> u8 {
        if data_port {
            self.imr
        } else if self.read_isr {
            self.isr
        } else {
            self.irr
        }
    }

    fn write(&mut self, data_port: bool, value: u8) {
        if !data_port {
            if value & 0x10 != 0 {
                // ICW1: starts initialization.
                *self = Chip {
                    lines: self.lines,
                    expect_icw4: value & 1 != 0,
                    single: value & 2 != 0,
                    init_step: 1,
                    ..Chip::default()
                };
            } else if value & 0x08 != 0 {
                // OCW3.
                if value & 0x02 != 0 {
                    self.read_isr = value & 0x01 != 0;
                }
            } else {
                self.ocw2(value);
            }
            return;
        }
        match self.init_step {
            1 => {
                self.vector_base = value & 0xf8;
                self.init_step = if !self.single {
                    2
                } else if self.expect_icw4 {
                    3
                } else {
                    0
                };
            }
            2 => self.init_step = if self.expect_icw4 { 3 } else { 0 },
            3 => {
                self.auto_eoi = value & 0x02 != 0;
                self.init_step = 0;
            }
            _ => self.imr = value,
        }
    }

    /// OCW2: EOIs and rotation.
    fn ocw2(&mut self, value: u8) {
        let level = value & 7;
        match value >> 5 {
            // Non-specific EOI, with rotation (0b101).
            0b001 | 0b101 => {
                if let Some(irq) = self.highest(self.isr) {
                    self.isr &= !(1 << irq);
                    if value >> 5 == 0b101 {
                        self.priority_add = (irq + 1) & 7;
                    }
                }
            }
            // Specific EOI, with rotation (0b111).
            0b011 | 0b111 => {
                self.isr &= !(1 << level);
                if value >> 5 == 0b111 {
                    self.priority_add = (level + 1) & 7;
                }
            }
            // Rotate in automatic EOI mode: set / clear.
            0b100 => self.rotate_on_auto_eoi = true,
            0b000 => self.rotate_on_auto_eoi = false,
            // Set priority: `level` becomes the lowest.
            0b110 => self.priority_add = (level + 1) & 7,
            _ => {}
        }
    }
}

/// The master and slave pair.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Pic {
    master: Chip,
    slave: Chip,
}

impl Default for Pic {
    /// As faultline's firmware hands it over (see the module).
    fn default() -> Self {
        Pic {
            master: Chip::bios_state(0x08, HANDOVER_MASTER_IMR),
            slave: Chip::bios_state(0x70, 0),
        }
    }
}

impl Pic {
    /// Sets ISA IRQ `irq`'s (0..16) level.
    pub fn set_line(&mut self, irq: usize, level: bool) {
        match irq {
            0..=7 => self.master.set_line(irq as u8, level),
            8..=15 => self.slave.set_line(irq as u8 - 8, level),
            _ => {}
        }
        self.update_cascade();
    }

    fn update_cascade(&mut self) {
        let slave_out = self.slave.request().is_some();
        self.master.set_line(CASCADE_IRQ, slave_out);
    }

    /// Whether the master's INTR output is up.
    pub fn output(&self) -> bool {
        self.master.request().is_some()
    }

    /// The INTA cycle: the vector of the interrupt the pair delivers, or
    /// the spurious IRQ 7 vector of the master (or of the slave) if the
    /// request went away.
    pub fn acknowledge(&mut self) -> u8 {
        let vector = match self.master.request() {
            Some(CASCADE_IRQ) => {
                self.master.acknowledge(CASCADE_IRQ);
                match self.slave.request() {
                    Some(irq) => {
                        self.slave.acknowledge(irq);
                        self.slave.vector_base + irq
                    }
                    None => self.slave.vector_base + 7,
                }
            }
            Some(irq) => {
                self.master.acknowledge(irq);
                self.master.vector_base + irq
            }
            None => self.master.vector_base + 7,
        };
        self.update_cascade();
        vector
    }

    /// Whether `port` is one of the pair's four.
    pub fn owns(port: u16) -> bool {
        matches!(port, 0x20 | 0x21 | 0xa0 | 0xa1)
    }

    /// An `in` from one of the pair's ports.
    pub fn read(&self, port: u16) -> u8 {
        let chip = if port & !1 == SLAVE_PORT {
            &self.slave
        } else {
            &self.master
        };
        chip.read(port & 1 != 0)
    }

    /// An `out` to one of the pair's ports.
    pub fn write(&mut self, port: u16, value: u8) {
        if port & !1 == SLAVE_PORT {
            self.slave.write(port & 1 != 0, value);
        } else {
            self.master.write(port & 1 != 0, value);
        }
        self.update_cascade();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slave_edge_is_delivered_through_the_cascade_and_waits_for_eoi() {
        let mut pic = Pic::default();
        assert!(!pic.output());
        pic.set_line(11, true);
        pic.set_line(11, false);
        assert!(pic.output(), "the edge latched");
        assert_eq!(pic.acknowledge(), 0x73);
        assert!(!pic.output());
        // In service: a second edge waits for the EOIs.
        pic.set_line(11, true);
        pic.set_line(3, true);
        assert!(!pic.output(), "IRQ 3 ranks below the in-service IRQ 2");
        pic.write(0xa0, 0x20);
        pic.write(0x20, 0x20);
        // IRQ 2 (the slave) outranks IRQ 3.
        assert_eq!(pic.acknowledge(), 0x73);
        assert_eq!(pic.acknowledge(), 0x0f, "spurious: IRQ 3 still blocked");
        pic.write(0xa0, 0x20);
        pic.write(0x20, 0x20);
        assert_eq!(pic.acknowledge(), 0x0b);
    }

    #[test]
    fn the_uart_line_is_masked_at_handover() {
        let mut pic = Pic::default();
        assert_eq!(pic.read(0x21), 0x10);
        pic.set_line(4, true);
        assert!(!pic.output());
    }

    #[test]
    fn masks_and_reinitialization() {
        let mut pic = Pic::default();
        // ICW1-ICW4: master at 0x20, slave at 0x28.
        for (port, v) in [(0x20, 0x11), (0x21, 0x20), (0x21, 0x04), (0x21, 0x01)] {
            pic.write(port, v);
        }
        for (port, v) in [(0xa0, 0x11), (0xa1, 0x28), (0xa1, 0x02), (0xa1, 0x01)] {
            pic.write(port, v);
        }
        pic.write(0x21, 0xff);
        assert_eq!(pic.read(0x21), 0xff);
        pic.set_line(1, true);
        assert!(!pic.output(), "masked");
        pic.write(0x21, 0xfd);
        assert!(pic.output());
        pic.write(0x20, 0x0a);
        assert_eq!(pic.read(0x20), 0x02, "IRR");
        assert_eq!(pic.acknowledge(), 0x21);
        pic.write(0x20, 0x0b);
        assert_eq!(pic.read(0x20), 0x02, "ISR");
        pic.write(0x20, 0x61);
        assert_eq!(pic.read(0x20), 0, "specific EOI");
        assert_eq!(pic.acknowledge(), 0x27, "spurious");
    }
}
