//! COM1: a 16550A UART (rust-vmm's `vm-superio`) with the console input
//! behind it.
//!
//! Input is whatever the VM was given at creation (`VmConfig::console_input`),
//! fed into the UART's 64-byte receive FIFO as the guest drains it: the
//! bytes the guest sees, and when, depend only on what the guest does, so a
//! run with the same input repeats exactly.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use vm_superio::serial::NoEvents;
use vm_superio::Trigger;

/// COM1's ISA interrupt line.
pub const COM1_IRQ: u8 = 4;
/// Registers of a 16550A: eight ports from the base.
pub const UART_PORTS: u16 = 8;

/// The UART's interrupt output: raised by `vm-superio`, taken by the
/// platform after each access (and routed through the IOAPIC).
#[derive(Debug, Default, Clone)]
pub struct IrqLine(Arc<AtomicBool>);

impl IrqLine {
    fn take(&self) -> bool {
        self.0.swap(false, Ordering::Relaxed)
    }
}

impl Trigger for IrqLine {
    type E = Infallible;

    fn trigger(&self) -> Result<(), Infallible> {
        self.0.store(true, Ordering::Relaxed);
        Ok(())
    }
}

/// COM1 with its pending console input and output.
#[derive(Debug)]
pub struct Uart {
    serial: vm_superio::Serial<IrqLine, NoEvents, Vec<u8>>,
    irq: IrqLine,
    /// Console input not yet in the receive FIFO.
    input: VecDeque<u8>,
}

impl Uart {
    pub fn new(input: &[u8]) -> Self {
        let irq = IrqLine::default();
        let mut uart = Uart {
            serial: vm_superio::Serial::new(irq.clone(), Vec::new()),
            irq,
            input: input.iter().copied().collect(),
        };
        uart.refill();
        uart
    }

    /// Moves pending input into the receive FIFO as far as it has room.
    fn refill(&mut self) {
        let room = self.serial.fifo_capacity().min(self.input.len());
        if room == 0 {
            return;
        }
        let chunk: Vec<u8> = self.input.drain(..room).collect();
        // Cannot fail: the chunk fits and the trigger is infallible; in
        // loopback mode the UART takes nothing, so keep the bytes.
        match self.serial.enqueue_raw_bytes(&chunk) {
            Ok(taken) => {
                for &b in chunk[taken..].iter().rev() {
                    self.input.push_front(b);
                }
            }
            Err(_) => {
                for &b in chunk.iter().rev() {
                    self.input.push_front(b);
                }
            }
        }
    }

    pub fn read(&mut self, offset: u8) -> u8 {
        let value = self.serial.read(offset);
        self.refill();
        value
    }

    pub fn write(&mut self, offset: u8, value: u8) {
        // Writing to a Vec cannot fail, nor can the trigger.
        let _ = self.serial.write(offset, value);
        self.refill();
    }

    /// Whether the UART raised its interrupt since the last call.
    pub fn take_interrupt(&self) -> bool {
        self.irq.take()
    }

    /// Output not yet taken.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(self.serial.writer_mut())
    }

    /// Console input bytes the guest has not read yet (FIFO included).
    pub fn unread_input(&self) -> usize {
        self.input.len() + (64 - self.serial.fifo_capacity())
    }
}

/// COM1's state in a snapshot: the 16550A registers and receive FIFO
/// (`vm-superio`'s own `SerialState`) and the console input not yet fed
/// to it. Output already taken is not part of it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UartSnapshot {
    pub baud_divisor_low: u8,
    pub baud_divisor_high: u8,
    pub interrupt_enable: u8,
    pub interrupt_identification: u8,
    pub line_control: u8,
    pub line_status: u8,
    pub modem_control: u8,
    pub modem_status: u8,
    pub scratch: u8,
    pub fifo: Vec<u8>,
    pub input: Vec<u8>,
    /// The interrupt line was raised and not yet taken.
    pub irq: bool,
}

impl Uart {
    /// The state to save.
    pub fn snapshot(&self) -> UartSnapshot {
        let s = self.serial.state();
        UartSnapshot {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            fifo: s.in_buffer,
            input: self.input.iter().copied().collect(),
            irq: self.irq.0.load(Ordering::Relaxed),
        }
    }

    /// A UART in the saved state (`vm-superio` checks the FIFO's size).
    pub fn from_snapshot(saved: &UartSnapshot) -> Result<Uart, String> {
        let state = vm_superio::serial::SerialState {
            baud_divisor_low: saved.baud_divisor_low,
            baud_divisor_high: saved.baud_divisor_high,
            interrupt_enable: saved.interrupt_enable,
            interrupt_identification: saved.interrupt_identification,
            line_control: saved.line_control,
            line_status: saved.line_status,
            modem_control: saved.modem_control,
            modem_status: saved.modem_status,
            scratch: saved.scratch,
            in_buffer: saved.fifo.clone(),
        };
        let irq = IrqLine::default();
        let serial = vm_superio::Serial::from_state(&state, irq.clone(), NoEvents, Vec::new())
            .map_err(|e| format!("COM1: {e:?}"))?;
        irq.0.store(saved.irq, Ordering::Relaxed);
        Ok(Uart {
            serial,
            irq,
            input: saved.input.iter().copied().collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATA: u8 = 0;
    const IER: u8 = 1;
    const IIR: u8 = 2;
    const LSR: u8 = 5;

    #[test]
    fn output_goes_to_the_console_and_lsr_says_ready() {
        let mut uart = Uart::new(b"");
        assert_eq!(uart.read(LSR) & 0x60, 0x60);
        for &b in b"hi\n" {
            uart.write(DATA, b);
        }
        assert_eq!(uart.take_output(), b"hi\n");
        assert!(!uart.take_interrupt(), "THRE interrupt not enabled");
    }

    #[test]
    fn input_longer_than_the_fifo_arrives_in_order_with_rda_interrupts() {
        let input: Vec<u8> = (0..200u32).map(|i| (i % 251) as u8).collect();
        let mut uart = Uart::new(&input);
        assert!(!uart.take_interrupt(), "RDA interrupt not enabled yet");
        uart.write(IER, 1);
        assert!(
            uart.take_interrupt(),
            "enabling RDA with data pending raises it"
        );
        assert_eq!(uart.read(IIR) & 0x0f, 0x04);
        let mut got = Vec::new();
        while uart.read(LSR) & 1 != 0 {
            got.push(uart.read(DATA));
        }
        assert_eq!(got, input);
        assert_eq!(uart.unread_input(), 0);
    }
}
