//! A cpio archive in the "newc" format (the kernel's initramfs format,
//! Documentation/driver-api/early-userspace/buffer-format.rst): each entry
//! is a 110-byte ASCII header ("070701" and 13 eight-digit hex fields), the
//! NUL-terminated name padded to 4 bytes, the data padded to 4 bytes; the
//! archive ends with the entry "TRAILER!!!".

/// File type bits of `mode` (`S_IFDIR`, `S_IFREG`, `S_IFCHR`).
pub mod mode {
    pub const DIR: u32 = 0o040000;
    pub const REGULAR: u32 = 0o100000;
    pub const CHAR_DEVICE: u32 = 0o020000;
}

/// Builds an archive entry by entry.
#[derive(Debug, Default)]
pub struct CpioWriter {
    out: Vec<u8>,
    next_inode: u32,
}

impl CpioWriter {
    pub fn new() -> CpioWriter {
        Self::with_capacity(0)
    }

    /// A writer whose archive has room for `bytes` before it grows (the
    /// files' sizes plus some headers: growing a many-megabyte archive
    /// copies it each time).
    pub fn with_capacity(bytes: usize) -> CpioWriter {
        CpioWriter {
            out: Vec::with_capacity(bytes),
            // Inode 0 is not used by real archives; start at 1.
            next_inode: 1,
        }
    }

    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        let ino = self.next_inode;
        self.next_inode += 1;
        let nlink = if mode & 0o170000 == mode::DIR { 2 } else { 1 };
        let fields = [
            ino,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime: fixed, so archives repeat byte for byte
            data.len() as u32,
            0, // devmajor
            0, // devminor
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0, // check (only for the "070702" crc format)
        ];
        self.out.extend_from_slice(b"070701");
        for field in fields {
            self.out
                .extend_from_slice(format!("{field:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while self.out.len() % 4 != 0 {
            self.out.push(0);
        }
    }

    /// A directory (`name` without a leading slash, e.g. "dev").
    pub fn dir(&mut self, name: &str) -> &mut Self {
        self.entry(name, mode::DIR | 0o755, (0, 0), &[]);
        self
    }

    /// A regular file with permission bits `perm` (e.g. 0o755).
    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) -> &mut Self {
        self.entry(name, mode::REGULAR | (perm & 0o7777), (0, 0), data);
        self
    }

    /// A character device node.
    pub fn char_device(&mut self, name: &str, perm: u32, major: u32, minor: u32) -> &mut Self {
        self.entry(
            name,
            mode::CHAR_DEVICE | (perm & 0o7777),
            (major, minor),
            &[],
        );
        self
    }

    /// Ends the archive with its trailer.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads an archive back: (name, mode, rdev major, data).
    fn read_back(mut b: &[u8]) -> Vec<(String, u32, u32, Vec<u8>)> {
        let mut entries = Vec::new();
        let start = b.as_ptr() as usize;
        loop {
            assert_eq!(&b[..6], b"070701");
            let field = |i: usize| {
                u32::from_str_radix(std::str::from_utf8(&b[6 + 8 * i..14 + 8 * i]).unwrap(), 16)
                    .unwrap()
            };
            let (mode, size, rdevmajor, namesize) =
                (field(1), field(6) as usize, field(9), field(11) as usize);
            let name = std::str::from_utf8(&b[110..110 + namesize - 1])
                .unwrap()
                .to_string();
            assert_eq!(b[110 + namesize - 1], 0);
            let data_at = (110 + namesize).next_multiple_of(4);
            let data = b[data_at..data_at + size].to_vec();
            let next = (data_at + size).next_multiple_of(4);
            assert_eq!((b.as_ptr() as usize + next - start) % 4, 0);
            b = &b[next..];
            if name == "TRAILER!!!" {
                assert!(b.is_empty());
                return entries;
            }
            entries.push((name, mode, rdevmajor, data));
        }
    }

    #[test]
    fn entries_read_back_with_their_names_modes_and_data() {
        let mut w = CpioWriter::new();
        w.dir("dev")
            .char_device("dev/console", 0o600, 5, 1)
            .file("init", 0o755, b"\x7fELF...")
            .file("a", 0o644, b"");
        let archive = w.finish();
        assert_eq!(archive.len() % 4, 0);
        let entries = read_back(&archive);
        assert_eq!(entries.len(), 4);
        assert_eq!(entries[0].0, "dev");
        assert_eq!(entries[0].1, 0o040755);
        assert_eq!(entries[1].1, 0o020600);
        assert_eq!(entries[1].2, 5);
        assert_eq!(entries[2].0, "init");
        assert_eq!(entries[2].1, 0o100755);
        assert_eq!(entries[2].3, b"\x7fELF...");
        assert!(entries[3].3.is_empty());
    }
}
