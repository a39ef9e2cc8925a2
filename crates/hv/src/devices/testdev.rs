//! QEMU's `pc-testdev`, the ISA test device kvm-unit-tests drives
//! (QEMU `hw/misc/pc-testdev.c`), attached for multiboot kernels only
//! ([`super::Platform::attach_test_devices`]):
//!
//! | ports / addresses | what |
//! |---|---|
//! | 0xe0..0xe4 | a 32-bit data register; an access of any size at offset `o` reads or writes its bytes `o..o+size` |
//! | 0xe4..0xe8 | "flush page": QEMU re-protects a host page; nothing to do here, writes are accepted |
//! | 0xe8..0xec | the same data register, byte by byte |
//! | 0x2000..0x2018 | IRQ lines: a byte written to `0x2000 + n` sets ISA/GSI line `n` to (byte != 0); a wider write sets the following lines with its following bytes (the port takes byte accesses only, which QEMU's bus splits wider ones into) |
//! | MMIO 0xff000000..0xff010000 | 64 KiB of device memory that reads back what was written ("I/O RAM") |

/// The data register's ports.
pub const DATA_PORT: u16 = 0xe0;
/// The flush-page port.
pub const FLUSH_PORT: u16 = 0xe4;
/// The byte-wise view of the data register.
pub const DATA_BYTE_PORT: u16 = 0xe8;
/// The first IRQ-line port.
pub const IRQ_PORT: u16 = 0x2000;
/// IRQ lines (the IOAPIC's pins).
pub const IRQ_LINES: u16 = 24;
/// Guest-physical base of the I/O RAM.
pub const IOMEM_BASE: u64 = 0xff00_0000;
/// Its size.
pub const IOMEM_SIZE: u64 = 0x1_0000;

/// The test device's state.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct TestDev {
    data: u32,
    /// The I/O RAM, allocated at its first write (reads as zero before).
    iomem: Vec<u8>,
}

impl TestDev {
    /// A read of `size` bytes at `offset` (0..4) of the data register.
    pub fn data_read(&self, offset: u16, size: u8) -> u32 {
        let bytes = self.data.to_le_bytes();
        let mut out = [0u8; 4];
        for (i, slot) in out.iter_mut().take(usize::from(size)).enumerate() {
            *slot = bytes.get(usize::from(offset) + i).copied().unwrap_or(0);
        }
        u32::from_le_bytes(out)
    }

    /// A write of `size` bytes at `offset` (0..4) of the data register;
    /// bytes past the register are dropped.
    pub fn data_write(&mut self, offset: u16, size: u8, value: u32) {
        let mut bytes = self.data.to_le_bytes();
        for (i, b) in value
            .to_le_bytes()
            .iter()
            .take(usize::from(size))
            .enumerate()
        {
            if let Some(slot) = bytes.get_mut(usize::from(offset) + i) {
                *slot = *b;
            }
        }
        self.data = u32::from_le_bytes(bytes);
    }

    /// Whether `gpa` is in the I/O RAM.
    pub fn is_iomem(gpa: u64) -> bool {
        (IOMEM_BASE..IOMEM_BASE + IOMEM_SIZE).contains(&gpa)
    }

    /// A read of `size` bytes at `gpa` in the I/O RAM (bytes past its end
    /// read as zero).
    pub fn iomem_read(&self, gpa: u64, size: u8) -> u64 {
        let at = (gpa - IOMEM_BASE) as usize;
        let mut out = [0u8; 8];
        for (i, slot) in out.iter_mut().take(usize::from(size)).enumerate() {
            *slot = self.iomem.get(at + i).copied().unwrap_or(0);
        }
        u64::from_le_bytes(out)
    }

    /// A write of `size` bytes of `value` at `gpa` in the I/O RAM.
    pub fn iomem_write(&mut self, gpa: u64, size: u8, value: u64) {
        if self.iomem.is_empty() {
            self.iomem = vec![0; IOMEM_SIZE as usize];
        }
        let at = (gpa - IOMEM_BASE) as usize;
        for (i, b) in value
            .to_le_bytes()
            .iter()
            .take(usize::from(size))
            .enumerate()
        {
            if let Some(slot) = self.iomem.get_mut(at + i) {
                *slot = *b;
            }
        }
    }

    /// The (line, level) pairs an `out` of `size` bytes of `value` to
    /// IRQ port `offset` sets.
    pub fn irq_lines(offset: u16, size: u8, value: u32) -> impl Iterator<Item = (usize, bool)> {
        let bytes = value.to_le_bytes();
        (0..u16::from(size)).filter_map(move |i| {
            let line = offset + i;
            (line < IRQ_LINES).then(|| (usize::from(line), bytes[usize::from(i)] != 0))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_register_reads_back_by_offset_and_size() {
        let mut t = TestDev::default();
        t.data_write(0, 4, 0x1234_5678);
        assert_eq!(t.data_read(0, 4), 0x1234_5678);
        assert_eq!(t.data_read(2, 2), 0x1234);
        t.data_write(1, 1, 0xab);
        assert_eq!(t.data_read(0, 4), 0x1234_ab78);
        t.data_write(3, 4, 0xffff_ffcd);
        assert_eq!(
            t.data_read(0, 4),
            0xcd34_ab78,
            "bytes past the register dropped"
        );
    }

    #[test]
    fn iomem_keeps_what_was_written() {
        let mut t = TestDev::default();
        assert_eq!(t.iomem_read(IOMEM_BASE, 8), 0);
        t.iomem_write(IOMEM_BASE + 8, 8, 0x7766_5544_3322_1100);
        assert_eq!(t.iomem_read(IOMEM_BASE + 9, 2), 0x2211);
        assert_eq!(t.iomem_read(IOMEM_BASE + 8, 8), 0x7766_5544_3322_1100);
        t.iomem_write(IOMEM_BASE + IOMEM_SIZE - 2, 4, u64::MAX);
        assert_eq!(t.iomem_read(IOMEM_BASE + IOMEM_SIZE - 2, 2), 0xffff);
        assert!(TestDev::is_iomem(IOMEM_BASE + IOMEM_SIZE - 1));
        assert!(!TestDev::is_iomem(IOMEM_BASE + IOMEM_SIZE));
    }

    #[test]
    fn a_wide_irq_write_sets_one_line_per_byte() {
        let lines: Vec<_> = TestDev::irq_lines(11, 4, 1).collect();
        assert_eq!(
            lines,
            vec![(11, true), (12, false), (13, false), (14, false)]
        );
        let last: Vec<_> = TestDev::irq_lines(23, 2, 0x0101).collect();
        assert_eq!(last, vec![(23, true)]);
    }
}
