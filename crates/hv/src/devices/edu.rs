//! QEMU's educational PCI device `edu` (QEMU `docs/specs/edu.rst`),
//! attached with `--device edu` at 00:03.0: vendor 0x1234, device 0x11e8,
//! revision 0x10, class 00/ff, a 1 MiB memory BAR0 at [`EDU_BAR0`],
//! INTx pin A on [`EDU_GSI`], and a 64-bit MSI capability (one vector).
//!
//! BAR0's registers (32-bit accesses; the DMA registers from 0x80 also
//! 64-bit; other sizes read all ones and are ignored):
//!
//! | offset | register |
//! |---|---|
//! | 0x00 | identification, 0x010000ed (version 1.0) |
//! | 0x04 | liveness check: reads the inverse of what was written |
//! | 0x08 | factorial: a write computes the value's factorial (mod 2^32) |
//! | 0x20 | status: bit 0 computing (never seen: it completes at once), bit 7 raise interrupt 0x01 after a factorial |
//! | 0x24 | interrupt status (read-only) |
//! | 0x60 | interrupt raise: ORs the value into the status and raises the interrupt |
//! | 0x64 | interrupt acknowledge: clears bits; the line falls when none is left |
//! | 0x80, 0x88, 0x90 | DMA source, destination, count |
//! | 0x98 | DMA command: bit 0 start, bit 1 direction (1: from the device's buffer to RAM), bit 2 raise interrupt 0x100 when done |
//!
//! The DMA buffer is 4 KiB at device address 0x40000; RAM addresses are
//! masked to the device's 28-bit DMA mask, as QEMU's default. A transfer
//! outside the buffer is not done (QEMU stops the VM with a hardware
//! error). The interrupt is an MSI when the MSI capability is enabled,
//! else INTx (unless COMMAND disables it); DMA and MSIs need bus
//! mastering (COMMAND bit 2).
//!
//! A started transfer is done before the guest runs again: the platform
//! carries it out right after the access that starts it
//! ([`Edu::take_dma`]; `devices::Chipset::service`). The device has no
//! clock of its own and the copy is not a vCPU's work, so it costs no
//! virtual time: the vCPU pays only the MMIO exit of its command write.
//! (QEMU completes it from a timer 100 ms of virtual time later; the
//! spec promises no duration, and a guest polls bit 0 or waits for the
//! interrupt either way.)

use super::pci::{self, cfg, ConfigSpace};

/// Where the platform places BAR0 (in the PCI hole below 4 GiB, clear
/// of the IOAPIC, the VT-d unit and the test device).
pub const EDU_BAR0: u32 = 0xfe00_0000;
/// BAR0's size.
pub const EDU_BAR0_SIZE: u32 = 1 << 20;
/// The IOAPIC pin INTx A reaches (INTERRUPT_LINE): the first of the PCI
/// GSIs 16..23.
pub const EDU_GSI: u8 = 16;
/// Bus 0, device 3, function 0.
pub const EDU_DEVFN: u8 = 3 << 3;
/// The MSI capability's offset.
pub const MSI_CAP: usize = 0x40;

/// The DMA buffer's device address and size.
pub const DMA_START: u64 = 0x40000;
pub const DMA_SIZE: u64 = 4096;
/// QEMU's default DMA mask: 28 bits.
const DMA_MASK: u64 = (1 << 28) - 1;

mod regs {
    pub const ID: u64 = 0x00;
    pub const ALIVE: u64 = 0x04;
    pub const FACTORIAL: u64 = 0x08;
    pub const STATUS: u64 = 0x20;
    pub const INTR_STATUS: u64 = 0x24;
    pub const INTR_RAISE: u64 = 0x60;
    pub const INTR_ACK: u64 = 0x64;
    pub const DMA_SRC: u64 = 0x80;
    pub const DMA_DST: u64 = 0x88;
    pub const DMA_COUNT: u64 = 0x90;
    pub const DMA_CMD: u64 = 0x98;
}

const ID_VALUE: u32 = 0x0100_00ed;
const STATUS_IRQ_FACTORIAL: u32 = 0x80;
const DMA_CMD_START: u64 = 1;
const DMA_CMD_FROM_DEVICE: u64 = 2;
const DMA_CMD_IRQ: u64 = 4;
const DMA_IRQ: u32 = 0x100;
const FACTORIAL_IRQ: u32 = 0x1;

/// A transfer the device asks the platform to carry out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaRequest {
    /// The DMA (bus) address of the RAM side: what the IOMMU translates.
    pub ram: u64,
    /// Offset in the device's buffer.
    pub buffer: usize,
    pub len: usize,
    /// From the buffer to RAM.
    pub to_ram: bool,
}

/// The device's state.
#[derive(Debug, Clone)]
pub struct Edu {
    pub config: ConfigSpace,
    alive: u32,
    factorial: u32,
    status: u32,
    irq_status: u32,
    dma_src: u64,
    dma_dst: u64,
    dma_count: u64,
    dma_cmd: u64,
    buffer: Vec<u8>,
    /// MSI messages raised, not yet sent: (address, data).
    msis: Vec<(u64, u32)>,
}

impl Default for Edu {
    fn default() -> Self {
        Self::new()
    }
}

impl Edu {
    /// The device as the platform leaves it after assigning its
    /// resources: BAR0 at [`EDU_BAR0`], INTERRUPT_LINE [`EDU_GSI`],
    /// memory decoding on.
    pub fn new() -> Edu {
        let mut config = ConfigSpace::new(0x1234, 0x11e8, 0x00ff, 0x10);
        config.set16(cfg::SUBSYSTEM_VENDOR_ID, 0x1af4);
        config.set16(cfg::SUBSYSTEM_ID, 0x1100);
        config.set_bar0(EDU_BAR0_SIZE, EDU_BAR0);
        config.set8(cfg::INTERRUPT_PIN, 1);
        config.set8(cfg::INTERRUPT_LINE, EDU_GSI);
        config.writable_bits8(cfg::INTERRUPT_LINE, 0xff);
        config.set16(cfg::COMMAND, pci::command::MEMORY);
        // MSI: 64-bit addresses, one vector, no per-vector masking.
        config.add_capability(MSI_CAP, 0x05);
        config.set16(MSI_CAP + 2, 1 << 7);
        config.writable_bits16(MSI_CAP + 2, 0x0071);
        config.writable_bits32(MSI_CAP + 4, !3);
        config.writable_bits32(MSI_CAP + 8, u32::MAX);
        config.writable_bits16(MSI_CAP + 12, 0xffff);
        Edu {
            config,
            alive: 0,
            factorial: 1,
            status: 0,
            irq_status: 0,
            dma_src: 0,
            dma_dst: 0,
            dma_count: 0,
            dma_cmd: 0,
            buffer: vec![0; DMA_SIZE as usize],
            msis: Vec::new(),
        }
    }

    fn command(&self) -> u16 {
        self.config.get16(cfg::COMMAND)
    }

    /// Whether BAR0 decodes `gpa`.
    pub fn owns(&self, gpa: u64) -> bool {
        self.command() & pci::command::MEMORY != 0
            && self
                .config
                .bar0()
                .is_some_and(|(base, size)| (base..base + size).contains(&gpa))
    }

    fn bar_offset(&self, gpa: u64) -> u64 {
        gpa - self.config.bar0().map_or(0, |(base, _)| base)
    }

    fn msi_enabled(&self) -> bool {
        self.config.get16(MSI_CAP + 2) & 1 != 0
    }

    fn bus_master(&self) -> bool {
        self.command() & pci::command::MASTER != 0
    }

    /// The INTx line's level: asserted while an interrupt is pending and
    /// neither MSI nor INTX_DISABLE take it away.
    pub fn intx_level(&self) -> bool {
        self.irq_status != 0
            && !self.msi_enabled()
            && self.command() & pci::command::INTX_DISABLE == 0
    }

    /// The configuration space as the guest sees it (STATUS's interrupt
    /// bit follows the line).
    pub fn config_read(&self, at: usize, size: u8) -> u32 {
        let mut space = self.config.clone();
        if self.irq_status != 0 {
            let s = space.get16(cfg::STATUS) | pci::status::INTERRUPT;
            space.set16(cfg::STATUS, s);
        }
        space.read(at, size)
    }

    /// A guest write to the configuration space.
    pub fn config_write(&mut self, at: usize, size: u8, value: u32) {
        self.config.write(at, size, value);
    }

    /// A read of BAR0 at `gpa`.
    pub fn mmio_read(&self, gpa: u64, size: u8) -> u64 {
        let offset = self.bar_offset(gpa);
        let wide = offset >= regs::DMA_SRC;
        if !(size == 4 || (wide && size == 8)) {
            return u64::MAX >> (64 - 8 * u32::from(size.min(8)));
        }
        let value = match offset {
            regs::ID => u64::from(ID_VALUE),
            regs::ALIVE => u64::from(!self.alive),
            regs::FACTORIAL => u64::from(self.factorial),
            regs::STATUS => u64::from(self.status),
            regs::INTR_STATUS => u64::from(self.irq_status),
            regs::DMA_SRC => self.dma_src,
            regs::DMA_DST => self.dma_dst,
            regs::DMA_COUNT => self.dma_count,
            regs::DMA_CMD => self.dma_cmd,
            _ => u64::MAX,
        };
        if size == 4 {
            value & 0xffff_ffff
        } else {
            value
        }
    }

    /// A write to BAR0 at `gpa`.
    pub fn mmio_write(&mut self, gpa: u64, size: u8, value: u64) {
        let offset = self.bar_offset(gpa);
        let wide = offset >= regs::DMA_SRC;
        if !(size == 4 || (wide && size == 8)) {
            return;
        }
        let value = if size == 4 {
            value & 0xffff_ffff
        } else {
            value
        };
        match offset {
            regs::ALIVE => self.alive = value as u32,
            regs::FACTORIAL => {
                self.factorial = (1..=value as u32).fold(1u32, |acc, n| acc.wrapping_mul(n));
                if self.status & STATUS_IRQ_FACTORIAL != 0 {
                    self.raise(FACTORIAL_IRQ);
                }
            }
            // Bit 0 (computing) is read-only.
            regs::STATUS => self.status = value as u32 & STATUS_IRQ_FACTORIAL,
            regs::INTR_RAISE => self.raise(value as u32),
            regs::INTR_ACK => self.irq_status &= !(value as u32),
            regs::DMA_SRC => self.dma_src = value,
            regs::DMA_DST => self.dma_dst = value,
            regs::DMA_COUNT => self.dma_count = value,
            // A transfer in flight takes no new command.
            regs::DMA_CMD if self.dma_cmd & DMA_CMD_START == 0 => self.dma_cmd = value & 7,
            _ => {}
        }
    }

    /// Raises interrupt bits `value` (QEMU's `edu_raise_irq`): an MSI per
    /// raise while MSI is enabled, else the INTx line stays up while any
    /// bit is set.
    fn raise(&mut self, value: u32) {
        self.irq_status |= value;
        if self.irq_status != 0 && self.msi_enabled() && self.bus_master() {
            let c = MSI_CAP;
            let address =
                u64::from(self.config.get32(c + 4)) | (u64::from(self.config.get32(c + 8)) << 32);
            let data = u32::from(self.config.get16(c + 12));
            self.msis.push((address, data));
        }
    }

    /// Whether a transfer was started or MSIs were raised (work for the
    /// platform).
    pub fn has_work(&self) -> bool {
        self.dma_cmd & DMA_CMD_START != 0 || !self.msis.is_empty()
    }

    /// The MSI writes raised since the last call.
    pub fn take_msis(&mut self) -> Vec<(u64, u32)> {
        std::mem::take(&mut self.msis)
    }

    /// The transfer a DMA command started, if any (the platform then
    /// does it and calls [`Edu::dma_done`]). Without bus mastering, or
    /// outside the buffer, the command completes with nothing moved.
    pub fn take_dma(&mut self) -> Option<DmaRequest> {
        if self.dma_cmd & DMA_CMD_START == 0 {
            return None;
        }
        let to_ram = self.dma_cmd & DMA_CMD_FROM_DEVICE != 0;
        let (device, ram) = if to_ram {
            (self.dma_src, self.dma_dst)
        } else {
            (self.dma_dst, self.dma_src)
        };
        let in_buffer = device >= DMA_START
            && self.dma_count <= DMA_SIZE
            && device - DMA_START <= DMA_SIZE - self.dma_count;
        if !self.bus_master() || !in_buffer {
            self.dma_done();
            return None;
        }
        Some(DmaRequest {
            ram: ram & DMA_MASK,
            buffer: (device - DMA_START) as usize,
            len: self.dma_count as usize,
            to_ram,
        })
    }

    /// The DMA buffer (a transfer reads or fills it).
    pub fn buffer_mut(&mut self) -> &mut [u8] {
        &mut self.buffer
    }

    /// Ends the transfer: clears START, raises 0x100 if asked.
    pub fn dma_done(&mut self) {
        let irq = self.dma_cmd & DMA_CMD_IRQ != 0;
        self.dma_cmd &= !DMA_CMD_START;
        if irq {
            self.raise(DMA_IRQ);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u64 = EDU_BAR0 as u64;

    #[test]
    fn identification_liveness_factorial_and_access_sizes() {
        let mut edu = Edu::new();
        assert!(edu.owns(B) && edu.owns(B + 0xf_ffff) && !edu.owns(B + 0x10_0000));
        assert_eq!(edu.mmio_read(B, 4), 0x0100_00ed);
        edu.mmio_write(B + 4, 4, 0x1234_5678);
        assert_eq!(edu.mmio_read(B + 4, 4), u64::from(!0x1234_5678u32));
        edu.mmio_write(B + 8, 4, 5);
        assert_eq!(edu.mmio_read(B + 8, 4), 120);
        assert_eq!(edu.mmio_read(B, 2), 0xffff, "16-bit: all ones");
        assert_eq!(edu.mmio_read(B, 8), u64::MAX, "64-bit below 0x80");
        edu.mmio_write(B + 0x80, 8, 0x1_2345_6789);
        assert_eq!(edu.mmio_read(B + 0x80, 8), 0x1_2345_6789);
        // Memory decoding off: BAR0 decodes nothing.
        edu.config_write(cfg::COMMAND, 2, 0);
        assert!(!edu.owns(B));
    }

    #[test]
    fn interrupts_go_to_intx_or_msi_and_acknowledge_lowers_the_line() {
        let mut edu = Edu::new();
        assert_eq!(edu.config_read(cfg::INTERRUPT_LINE, 1), u32::from(EDU_GSI));
        assert_eq!(edu.config_read(cfg::INTERRUPT_PIN, 1), 1);
        edu.mmio_write(B + 0x60, 4, 0x5);
        assert!(edu.intx_level());
        assert_eq!(edu.mmio_read(B + 0x24, 4), 5);
        assert_ne!(edu.config_read(cfg::STATUS, 2) & 8, 0, "interrupt status");
        edu.mmio_write(B + 0x64, 4, 0x1);
        assert!(edu.intx_level(), "bit 2 still set");
        edu.mmio_write(B + 0x64, 4, 0x4);
        assert!(!edu.intx_level());
        // MSI: bus master on, address and data, enable.
        edu.config_write(cfg::COMMAND, 2, 0x6);
        assert_eq!(edu.config_read(MSI_CAP, 1), 0x05);
        assert_eq!(edu.config_read(MSI_CAP + 2, 2), 0x80, "64-bit capable");
        edu.config_write(MSI_CAP + 4, 4, 0xfee0_1010);
        edu.config_write(MSI_CAP + 8, 4, 0);
        edu.config_write(MSI_CAP + 12, 4, 0x0);
        edu.config_write(MSI_CAP + 2, 2, 1);
        edu.mmio_write(B + 0x60, 4, 1);
        assert!(!edu.intx_level(), "MSI takes the line away");
        assert_eq!(edu.take_msis(), vec![(0xfee0_1010, 0)]);
        edu.mmio_write(B + 0x60, 4, 0);
        assert_eq!(edu.take_msis().len(), 1, "raised again while set, as QEMU");
    }

    #[test]
    fn dma_commands_name_the_buffer_window_and_need_bus_mastering() {
        let mut edu = Edu::new();
        edu.mmio_write(B + 0x80, 8, 0x1000);
        edu.mmio_write(B + 0x88, 8, DMA_START + 8);
        edu.mmio_write(B + 0x90, 8, 4);
        edu.mmio_write(B + 0x98, 4, 1 | 4);
        assert_eq!(edu.take_dma(), None, "no bus mastering: nothing moves");
        assert_eq!(edu.mmio_read(B + 0x98, 4) & 1, 0, "but it completes");
        assert_eq!(edu.mmio_read(B + 0x24, 4), 0x100);
        edu.mmio_write(B + 0x64, 4, 0x100);
        edu.config_write(cfg::COMMAND, 2, 0x6);
        edu.mmio_write(B + 0x98, 4, 1);
        let request = edu.take_dma().unwrap();
        assert_eq!(
            request,
            DmaRequest {
                ram: 0x1000,
                buffer: 8,
                len: 4,
                to_ram: false
            }
        );
        assert_eq!(edu.mmio_read(B + 0x98, 4) & 1, 1, "in flight");
        edu.dma_done();
        assert_eq!(edu.mmio_read(B + 0x98, 4), 0);
        // Past the buffer's end: refused.
        edu.mmio_write(B + 0x88, 8, DMA_START + DMA_SIZE - 2);
        edu.mmio_write(B + 0x98, 4, 1);
        assert_eq!(edu.take_dma(), None);
        // From the device, with the RAM address masked to 28 bits.
        edu.mmio_write(B + 0x80, 8, DMA_START);
        edu.mmio_write(B + 0x88, 8, 0x1_0000_3000);
        edu.mmio_write(B + 0x98, 4, 3);
        assert_eq!(
            edu.take_dma().map(|r| (r.ram, r.to_ram)),
            Some((0x3000, true))
        );
    }
}
