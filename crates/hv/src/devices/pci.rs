//! PCI bus 0 behind configuration mechanism #1 (PCI Local Bus
//! Specification 3.0, 3.2.2.3.2): a 32-bit write to port 0xcf8 selects
//! bus, device, function and register (bit 31 enables), and ports
//! 0xcfc..0xd00 read and write that register's bytes. A function that is
//! not there reads all ones. Present only with a PCI device or the IOMMU
//! (`--device edu`, `--iommu intel`); without them ports 0xcf8/0xcfc float
//! high like every absent port.
//!
//! On the bus: a host bridge at 00:00.0 (the q35 MCH's ids, 8086:29c0,
//! class 06/00) and the devices attached. There is no BIOS: the platform
//! assigns BARs and INTERRUPT_LINE when it builds the machine, as firmware
//! would, and enables memory decoding.

/// The configuration address port.
pub const CONFIG_ADDRESS: u16 = 0xcf8;
/// The first configuration data port (0xcfc..0xd00).
pub const CONFIG_DATA: u16 = 0xcfc;

/// Standard configuration-header offsets.
pub mod cfg {
    pub const VENDOR_ID: usize = 0x00;
    pub const DEVICE_ID: usize = 0x02;
    pub const COMMAND: usize = 0x04;
    pub const STATUS: usize = 0x06;
    pub const REVISION: usize = 0x08;
    pub const CLASS_PROG: usize = 0x09;
    pub const CLASS_DEVICE: usize = 0x0a;
    pub const HEADER_TYPE: usize = 0x0e;
    pub const BAR0: usize = 0x10;
    pub const SUBSYSTEM_VENDOR_ID: usize = 0x2c;
    pub const SUBSYSTEM_ID: usize = 0x2e;
    pub const CAPABILITIES: usize = 0x34;
    pub const INTERRUPT_LINE: usize = 0x3c;
    pub const INTERRUPT_PIN: usize = 0x3d;
}

/// COMMAND bits.
pub mod command {
    pub const MEMORY: u16 = 1 << 1;
    pub const MASTER: u16 = 1 << 2;
    pub const INTX_DISABLE: u16 = 1 << 10;
}

/// STATUS bits.
pub mod status {
    pub const INTERRUPT: u16 = 1 << 3;
    pub const CAP_LIST: u16 = 1 << 4;
}

/// A function's 256-byte configuration space: the bytes, which bits of
/// each the guest may write, and one 32-bit memory BAR.
#[derive(Debug, Clone)]
pub struct ConfigSpace {
    bytes: [u8; 256],
    writable: [u8; 256],
    /// BAR0's size (a power of two, at least 16), 0 if none.
    bar0_size: u32,
}

impl ConfigSpace {
    /// A type-0 header with these ids and class (base class << 8 |
    /// subclass); nothing writable but COMMAND's I/O, memory, bus-master
    /// and INTx-disable bits.
    pub fn new(vendor: u16, device: u16, class: u16, revision: u8) -> ConfigSpace {
        let mut space = ConfigSpace {
            bytes: [0; 256],
            writable: [0; 256],
            bar0_size: 0,
        };
        space.set16(cfg::VENDOR_ID, vendor);
        space.set16(cfg::DEVICE_ID, device);
        space.bytes[cfg::REVISION] = revision;
        space.set16(cfg::CLASS_DEVICE, class);
        space.writable_bits16(cfg::COMMAND, 0b111 | command::INTX_DISABLE);
        space
    }

    pub fn get8(&self, at: usize) -> u8 {
        self.bytes[at]
    }

    pub fn get16(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.bytes[at], self.bytes[at + 1]])
    }

    pub fn get32(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.bytes[at..at + 4].try_into().unwrap())
    }

    /// Sets bytes as the platform (not the guest) does.
    pub fn set8(&mut self, at: usize, value: u8) {
        self.bytes[at] = value;
    }

    pub fn set16(&mut self, at: usize, value: u16) {
        self.bytes[at..at + 2].copy_from_slice(&value.to_le_bytes());
    }

    pub fn set32(&mut self, at: usize, value: u32) {
        self.bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
    }

    /// Lets the guest write `mask`'s bits of the byte at `at`.
    pub fn writable_bits8(&mut self, at: usize, mask: u8) {
        self.writable[at] = mask;
    }

    pub fn writable_bits16(&mut self, at: usize, mask: u16) {
        self.writable[at..at + 2].copy_from_slice(&mask.to_le_bytes());
    }

    pub fn writable_bits32(&mut self, at: usize, mask: u32) {
        self.writable[at..at + 4].copy_from_slice(&mask.to_le_bytes());
    }

    /// Gives the function a 32-bit non-prefetchable memory BAR0 of `size`
    /// bytes at `address` (as firmware assigns it).
    pub fn set_bar0(&mut self, size: u32, address: u32) {
        assert!(size.is_power_of_two() && size >= 16 && address % size == 0);
        self.bar0_size = size;
        self.set32(cfg::BAR0, address);
        // The address bits above the size are writable; a write of all
        // ones reads back the size mask (the sizing protocol).
        self.writable_bits32(cfg::BAR0, !(size - 1));
    }

    /// BAR0's address and size, if it has one.
    pub fn bar0(&self) -> Option<(u64, u64)> {
        (self.bar0_size != 0).then(|| {
            (
                u64::from(self.get32(cfg::BAR0) & !0xf),
                u64::from(self.bar0_size),
            )
        })
    }

    /// Appends a capability to the list (id at `at`, the list through
    /// the capabilities pointer).
    pub fn add_capability(&mut self, at: usize, id: u8) {
        let mut link = cfg::CAPABILITIES;
        while self.bytes[link] != 0 {
            link = usize::from(self.bytes[link]) + 1;
        }
        self.bytes[link] = at as u8;
        self.bytes[at] = id;
        self.bytes[at + 1] = 0;
        let status = self.get16(cfg::STATUS) | status::CAP_LIST;
        self.set16(cfg::STATUS, status);
    }

    /// A guest read of `size` bytes at `at` (within the space).
    pub fn read(&self, at: usize, size: u8) -> u32 {
        let mut out = [0u8; 4];
        for (i, b) in out.iter_mut().take(usize::from(size)).enumerate() {
            *b = self.bytes.get(at + i).copied().unwrap_or(0xff);
        }
        u32::from_le_bytes(out)
    }

    /// A guest write: only writable bits change.
    pub fn write(&mut self, at: usize, size: u8, value: u32) {
        for (i, b) in value
            .to_le_bytes()
            .iter()
            .take(usize::from(size))
            .enumerate()
        {
            let Some(slot) = self.bytes.get_mut(at + i) else {
                break;
            };
            let mask = self.writable[at + i];
            *slot = (*slot & !mask) | (b & mask);
        }
    }
}

/// The q35 host bridge's configuration space.
pub fn host_bridge() -> ConfigSpace {
    ConfigSpace::new(0x8086, 0x29c0, 0x0600, 0)
}

/// A configuration address (port 0xcf8) decoded: `None` if the enable bit
/// is clear; else (bus, devfn, register).
pub fn decode_address(address: u32) -> Option<(u8, u8, usize)> {
    (address & (1 << 31) != 0).then_some((
        (address >> 16) as u8,
        (address >> 8) as u8,
        (address & 0xff) as usize,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_sizing_reads_back_the_size_mask_and_only_writable_bits_change() {
        let mut space = ConfigSpace::new(0x1234, 0x11e8, 0x00ff, 0x10);
        space.set_bar0(1 << 20, 0xfe00_0000);
        assert_eq!(space.bar0(), Some((0xfe00_0000, 1 << 20)));
        space.write(cfg::BAR0, 4, u32::MAX);
        assert_eq!(space.read(cfg::BAR0, 4), 0xfff0_0000);
        space.write(cfg::BAR0, 4, 0xfe00_0000);
        assert_eq!(space.bar0(), Some((0xfe00_0000, 1 << 20)));
        // The ids are read-only; COMMAND takes its enable bits only.
        space.write(cfg::VENDOR_ID, 4, 0);
        assert_eq!(space.read(cfg::VENDOR_ID, 4), 0x11e8_1234);
        space.write(cfg::COMMAND, 2, 0xffff);
        assert_eq!(space.get16(cfg::COMMAND), 0x0407);
        assert_eq!(space.read(0xfe, 4), 0xffff_0000, "past the end: ones");
    }

    #[test]
    fn capabilities_chain_through_the_pointer() {
        let mut space = host_bridge();
        assert_eq!(space.get16(cfg::STATUS) & status::CAP_LIST, 0);
        space.add_capability(0x40, 0x05);
        space.add_capability(0x50, 0x10);
        assert_eq!(space.get8(cfg::CAPABILITIES), 0x40);
        assert_eq!(space.get8(0x41), 0x50);
        assert_eq!(space.get8(0x51), 0);
        assert_ne!(space.get16(cfg::STATUS) & status::CAP_LIST, 0);
    }

    #[test]
    fn configuration_addresses_decode_only_when_enabled() {
        assert_eq!(decode_address(0x0000_1804), None);
        assert_eq!(decode_address(0x8000_1806), Some((0, 0x18, 6)));
        assert_eq!(decode_address(0x8001_0000), Some((1, 0, 0)));
    }
}
