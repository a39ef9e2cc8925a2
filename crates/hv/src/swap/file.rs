//! The swap file: page-sized slots in a real file.
//!
//! Every page written is checksummed (CRC-32) in memory; a read whose data
//! does not match (the file was truncated, overwritten or the disk returned
//! garbage) is an error, never silently wrong guest memory. Slots are
//! handed out lowest-first from a bump pointer and a LIFO free list, so the
//! file layout is deterministic.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use thiserror::Error;

/// Bytes in a slot.
pub const SLOT_BYTES: usize = machine::addr::PAGE_SIZE as usize;

/// Index of a page-sized slot in the swap file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SwapSlot(pub u32);

impl SwapSlot {
    fn offset(self) -> u64 {
        u64::from(self.0) * SLOT_BYTES as u64
    }
}

/// A swap-file operation failed. The VM stops with this error.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SwapError {
    #[error("cannot create swap file {path}: {reason}")]
    Create { path: String, reason: String },
    #[error("writing slot {slot} (offset {offset}) of swap file {path}: {reason}")]
    Write {
        path: String,
        slot: u32,
        offset: u64,
        reason: String,
    },
    #[error("reading slot {slot} (offset {offset}) of swap file {path}: {reason}")]
    Read {
        path: String,
        slot: u32,
        offset: u64,
        reason: String,
    },
    #[error("swap file {path} is corrupt: slot {slot} (offset {offset}) has checksum {found:#010x}, {expected:#010x} was written")]
    Corrupt {
        path: String,
        slot: u32,
        offset: u64,
        expected: u32,
        found: u32,
    },
    #[error("swap file {path} is full ({slots} slots of 4 KiB)")]
    Full { path: String, slots: u32 },
}

/// The swap file.
#[derive(Debug)]
pub struct SwapFile {
    file: File,
    /// Shown in errors.
    path: String,
    next: u32,
    free: Vec<SwapSlot>,
    /// CRC-32 of what each slot holds; `None` for a free slot.
    checksums: Vec<Option<u32>>,
    max_slots: u32,
}

impl SwapFile {
    /// Creates (or truncates) the swap file at `path`.
    pub fn create(path: &Path) -> Result<Self, SwapError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(!is_char_device(path))
            .open(path)
            .map_err(|e| SwapError::Create {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
        Ok(Self::from_file(file, path.display().to_string()))
    }

    /// A temporary swap file in the system's temporary directory
    /// (`$TMPDIR`), unlinked as soon as it is created: only the open
    /// descriptor keeps it, so it cannot outlive the process, even one
    /// killed by SIGKILL.
    pub fn temporary() -> Result<Self, SwapError> {
        let dir = std::env::temp_dir();
        let file = tempfile::tempfile_in(&dir).map_err(|e| SwapError::Create {
            path: dir.display().to_string(),
            reason: e.to_string(),
        })?;
        Ok(Self::from_file(
            file,
            format!("(unlinked temporary file in {})", dir.display()),
        ))
    }

    fn from_file(file: File, path: String) -> Self {
        SwapFile {
            file,
            path,
            next: 0,
            free: Vec::new(),
            checksums: Vec::new(),
            // 16 TiB of 4 KiB slots.
            max_slots: u32::MAX,
        }
    }

    /// Limits the file to `slots` slots (for tests of a full swap).
    #[cfg(test)]
    pub fn set_max_slots(&mut self, slots: u32) {
        self.max_slots = slots;
    }

    /// Slots holding data.
    #[cfg(test)]
    pub fn slots_in_use(&self) -> u64 {
        self.next as u64 - self.free.len() as u64
    }

    /// A free slot.
    pub fn alloc(&mut self) -> Result<SwapSlot, SwapError> {
        if let Some(slot) = self.free.pop() {
            return Ok(slot);
        }
        if self.next >= self.max_slots {
            return Err(SwapError::Full {
                path: self.path.clone(),
                slots: self.max_slots,
            });
        }
        self.next += 1;
        self.checksums.push(None);
        Ok(SwapSlot(self.next - 1))
    }

    /// Returns a slot; its contents are forgotten.
    pub fn free(&mut self, slot: SwapSlot) {
        if let Some(sum) = self.checksums.get_mut(slot.0 as usize) {
            if sum.take().is_some() {
                self.free.push(slot);
            }
        }
    }

    /// Writes a page into `slot`.
    pub fn write(&mut self, slot: SwapSlot, page: &[u8; SLOT_BYTES]) -> Result<(), SwapError> {
        let error = |reason: String| SwapError::Write {
            path: self.path.clone(),
            slot: slot.0,
            offset: slot.offset(),
            reason,
        };
        if slot.0 >= self.next {
            return Err(error("slot was never allocated".into()));
        }
        self.file
            .write_all_at(page, slot.offset())
            .map_err(|e| error(e.to_string()))?;
        self.checksums[slot.0 as usize] = Some(crc32fast::hash(page));
        Ok(())
    }

    /// Reads the page in `slot`, checking it is what was written.
    pub fn read(&self, slot: SwapSlot, page: &mut [u8; SLOT_BYTES]) -> Result<(), SwapError> {
        let error = |reason: String| SwapError::Read {
            path: self.path.clone(),
            slot: slot.0,
            offset: slot.offset(),
            reason,
        };
        let expected = self
            .checksums
            .get(slot.0 as usize)
            .copied()
            .flatten()
            .ok_or_else(|| error("slot holds no page".into()))?;
        self.file
            .read_exact_at(page, slot.offset())
            .map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => {
                    error("the file is shorter than written (truncated?)".into())
                }
                _ => error(e.to_string()),
            })?;
        let found = crc32fast::hash(page);
        if found != expected {
            return Err(SwapError::Corrupt {
                path: self.path.clone(),
                slot: slot.0,
                offset: slot.offset(),
                expected,
                found,
            });
        }
        Ok(())
    }
}

fn is_char_device(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_char_device())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(fill: u8) -> [u8; SLOT_BYTES] {
        [fill; SLOT_BYTES]
    }

    #[test]
    fn pages_round_trip_and_slots_are_reused() {
        let mut swap = SwapFile::temporary().unwrap();
        // Unlinked from the start: nothing on disk to leave behind.
        use std::os::unix::fs::MetadataExt;
        assert_eq!(swap.file.metadata().unwrap().nlink(), 0);
        let a = swap.alloc().unwrap();
        let b = swap.alloc().unwrap();
        assert_eq!((a, b), (SwapSlot(0), SwapSlot(1)));
        swap.write(a, &page(0xaa)).unwrap();
        swap.write(b, &page(0xbb)).unwrap();
        let mut buf = page(0);
        swap.read(b, &mut buf).unwrap();
        assert_eq!(buf, page(0xbb));
        swap.free(a);
        assert!(
            swap.read(a, &mut buf).is_err(),
            "a freed slot holds nothing"
        );
        assert_eq!(swap.alloc().unwrap(), a);
        assert_eq!(swap.slots_in_use(), 2);
    }

    #[test]
    fn a_corrupted_or_truncated_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("swap");
        let mut swap = SwapFile::create(&path).unwrap();
        let a = swap.alloc().unwrap();
        let b = swap.alloc().unwrap();
        swap.write(a, &page(1)).unwrap();
        swap.write(b, &page(2)).unwrap();
        // Someone else scribbles over slot 0.
        let other = OpenOptions::new().write(true).open(&path).unwrap();
        other.write_all_at(&[9; 16], 100).unwrap();
        let mut buf = page(0);
        let err = swap.read(a, &mut buf).unwrap_err();
        assert!(matches!(err, SwapError::Corrupt { slot: 0, .. }), "{err}");
        // ...and truncates it.
        other.set_len(SLOT_BYTES as u64).unwrap();
        let err = swap.read(b, &mut buf).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    #[test]
    fn a_full_disk_and_a_full_file_are_errors() {
        let mut full = SwapFile::create(Path::new("/dev/full")).unwrap();
        let slot = full.alloc().unwrap();
        let err = full.write(slot, &page(1)).unwrap_err();
        assert!(err.to_string().contains("No space left on device"), "{err}");

        let mut small = SwapFile::temporary().unwrap();
        small.set_max_slots(1);
        small.alloc().unwrap();
        assert!(matches!(
            small.alloc(),
            Err(SwapError::Full { slots: 1, .. })
        ));
        assert!(SwapFile::create(Path::new("/nonexistent/dir/swap")).is_err());
    }
}
