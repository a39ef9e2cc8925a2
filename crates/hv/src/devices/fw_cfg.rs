//! QEMU's fw_cfg, the traditional port interface (QEMU
//! `docs/specs/fw_cfg.rst`): a 16-bit selector written to port 0x510
//! picks an item, whose bytes port 0x511 then reads one at a time (past
//! the end: zero). Only the basic items; no DMA interface, no files.

/// The selector port (16-bit writes).
pub const FW_CFG_SELECTOR: u16 = 0x510;
/// The data port (8-bit reads).
pub const FW_CFG_DATA: u16 = 0x511;

/// Item keys (QEMU's `FW_CFG_*`).
pub mod key {
    pub const SIGNATURE: u16 = 0x00;
    pub const ID: u16 = 0x01;
    pub const RAM_SIZE: u16 = 0x03;
    pub const NOGRAPHIC: u16 = 0x04;
    pub const NB_CPUS: u16 = 0x05;
    pub const MAX_CPUS: u16 = 0x0f;
    pub const CMDLINE_SIZE: u16 = 0x14;
    pub const CMDLINE_DATA: u16 = 0x15;
    pub const FILE_DIR: u16 = 0x19;
}

/// The device: its items and the read cursor.
#[derive(Debug, Clone)]
pub struct FwCfg {
    items: Vec<(u16, Vec<u8>)>,
    selected: Option<usize>,
    offset: usize,
}

impl FwCfg {
    /// The read cursor (selected item, offset in it), to save.
    pub fn cursor(&self) -> (Option<usize>, usize) {
        (self.selected, self.offset)
    }

    /// Restores a saved cursor, checked against the items.
    pub fn set_cursor(&mut self, selected: Option<usize>, offset: usize) -> Result<(), String> {
        if let Some(index) = selected {
            let Some((_, data)) = self.items.get(index) else {
                return Err(format!(
                    "fw_cfg: item {index} selected, there are {}",
                    self.items.len()
                ));
            };
            if offset > data.len() {
                return Err(format!(
                    "fw_cfg: offset {offset} past item {index}'s {} bytes",
                    data.len()
                ));
            }
        } else if offset != 0 {
            return Err("fw_cfg: an offset with no item selected".into());
        }
        self.selected = selected;
        self.offset = offset;
        Ok(())
    }
}

impl FwCfg {
    pub fn new(ram_size: u64, cpus: u16, cmdline: &str) -> Self {
        // QEMU counts the command line's terminating NUL in its size.
        let mut cmdline = cmdline.as_bytes().to_vec();
        cmdline.push(0);
        let items = vec![
            (key::SIGNATURE, b"QEMU".to_vec()),
            // Bit 0: the traditional interface; no DMA (bit 1).
            (key::ID, 1u32.to_le_bytes().to_vec()),
            (key::RAM_SIZE, ram_size.to_le_bytes().to_vec()),
            (key::NOGRAPHIC, 1u16.to_le_bytes().to_vec()),
            (key::NB_CPUS, cpus.to_le_bytes().to_vec()),
            (key::MAX_CPUS, cpus.to_le_bytes().to_vec()),
            (
                key::CMDLINE_SIZE,
                (cmdline.len() as u32).to_le_bytes().to_vec(),
            ),
            (key::CMDLINE_DATA, cmdline),
            // The file directory: a big-endian count, zero files.
            (key::FILE_DIR, 0u32.to_be_bytes().to_vec()),
        ];
        FwCfg {
            items,
            selected: None,
            offset: 0,
        }
    }

    pub fn select(&mut self, key: u16) {
        self.selected = self.items.iter().position(|(k, _)| *k == key);
        self.offset = 0;
    }

    /// The next byte of the selected item (zero past its end or for an
    /// unknown key).
    pub fn read_byte(&mut self) -> u8 {
        let byte = self
            .selected
            .and_then(|i| self.items[i].1.get(self.offset).copied())
            .unwrap_or(0);
        self.offset = self.offset.saturating_add(1);
        byte
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(fw: &mut FwCfg, key: u16, n: usize) -> Vec<u8> {
        fw.select(key);
        (0..n).map(|_| fw.read_byte()).collect()
    }

    #[test]
    fn basic_items_read_back() {
        let mut fw = FwCfg::new(256 << 20, 4, "console=ttyS0");
        assert_eq!(read(&mut fw, key::SIGNATURE, 4), b"QEMU");
        assert_eq!(read(&mut fw, key::NB_CPUS, 2), [4, 0]);
        assert_eq!(
            read(&mut fw, key::RAM_SIZE, 8),
            (256u64 << 20).to_le_bytes()
        );
        assert_eq!(read(&mut fw, key::CMDLINE_SIZE, 4), 14u32.to_le_bytes());
        assert_eq!(read(&mut fw, key::CMDLINE_DATA, 16), b"console=ttyS0\0\0\0");
        assert_eq!(read(&mut fw, 0x1234, 2), [0, 0], "unknown key reads zero");
    }
}
