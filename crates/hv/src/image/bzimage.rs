//! The bzImage's setup header (Documentation/x86/boot.rst, "The real-mode
//! kernel header"), parsed and checked field by field. Only what the 64-bit
//! boot protocol needs is read; anything an image gets wrong is a
//! [`BzImageError`], never a panic.

use thiserror::Error;

/// Offsets of the setup header's fields in the image (and in `boot_params`,
/// which holds a copy of the header at the same offsets).
pub mod offset {
    pub const SETUP_SECTS: usize = 0x1f1;
    pub const SYSSIZE: usize = 0x1f4;
    pub const BOOT_FLAG: usize = 0x1fe;
    /// The jump instruction; its second byte is the length of the header
    /// past 0x202.
    pub const JUMP: usize = 0x200;
    pub const HEADER: usize = 0x202;
    pub const VERSION: usize = 0x206;
    pub const TYPE_OF_LOADER: usize = 0x210;
    pub const LOADFLAGS: usize = 0x211;
    pub const RAMDISK_IMAGE: usize = 0x218;
    pub const RAMDISK_SIZE: usize = 0x21c;
    pub const CMD_LINE_PTR: usize = 0x228;
    pub const INITRD_ADDR_MAX: usize = 0x22c;
    pub const KERNEL_ALIGNMENT: usize = 0x230;
    pub const RELOCATABLE_KERNEL: usize = 0x234;
    pub const XLOADFLAGS: usize = 0x236;
    pub const CMDLINE_SIZE: usize = 0x238;
    pub const PREF_ADDRESS: usize = 0x258;
    pub const INIT_SIZE: usize = 0x260;
}

/// "HdrS".
const HEADER_MAGIC: u32 = 0x5372_6448;
const BOOT_FLAG_MAGIC: u16 = 0xaa55;
/// `xloadflags` (2.12+) came with the 64-bit entry point's flag.
const MIN_VERSION: u16 = 0x020c;
/// loadflags: the protected-mode code loads at 0x100000 or above.
pub const LOADED_HIGH: u8 = 1 << 0;
/// xloadflags: the kernel has the 64-bit entry point at load + 0x200.
const XLF_KERNEL_64: u16 = 1 << 0;
/// xloadflags: kernel, boot_params, command line and initrd may be above
/// 4 GiB.
const XLF_CAN_BE_LOADED_ABOVE_4G: u16 = 1 << 1;
/// The 64-bit entry point's offset from the load address.
pub const ENTRY_64_OFFSET: u64 = 0x200;

/// Why an image is not a bzImage this loader can boot.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BzImageError {
    #[error("the file is {0} bytes: too short for a bzImage's setup header")]
    TooShort(usize),
    #[error("no bzImage boot flag 0xaa55 at 0x1fe (found {0:#06x}): not a Linux kernel image")]
    BadBootFlag(u16),
    #[error("no \"HdrS\" magic at 0x202: a pre-2.0 boot protocol image")]
    NoHeaderMagic,
    #[error("boot protocol {major}.{minor:02} is too old: the 64-bit entry needs 2.12 or later")]
    OldProtocol { major: u8, minor: u8 },
    #[error("the setup header's length ({0:#x}, from the jump at 0x200) runs past the setup code")]
    BadHeaderLength(usize),
    #[error("setup code of {setup} bytes leaves no protected-mode kernel in a {len}-byte file")]
    NoKernel { setup: usize, len: usize },
    #[error("the image is not a bzImage (loadflags {0:#x} lacks LOADED_HIGH)")]
    NotLoadedHigh(u8),
    #[error("the kernel has no 64-bit entry point (xloadflags {0:#x} lacks XLF_KERNEL_64)")]
    No64BitEntry(u16),
    #[error("kernel_alignment {0:#x} is not a power of two of at least 4 KiB")]
    BadAlignment(u32),
    #[error("syssize says {syssize_bytes} bytes of protected-mode kernel; the file holds {have}")]
    BadSyssize { syssize_bytes: u64, have: u64 },
    #[error(
        "init_size {init_size:#x} is smaller than the protected-mode kernel ({kernel:#x} bytes)"
    )]
    BadInitSize { init_size: u32, kernel: usize },
    #[error(
        "a non-relocatable kernel wants pref_address {0:#x}, not 2 MiB-aligned or below 1 MiB"
    )]
    BadPrefAddress(u64),
}

/// What the loader needs from a checked setup header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupHeader {
    /// Boot protocol version (0x020f is 2.15).
    pub version: u16,
    /// Bytes of real-mode setup code before the protected-mode kernel
    /// (the boot sector included).
    pub setup_len: usize,
    /// File range of the header to copy into `boot_params` (0x1f1 up to
    /// the end the jump at 0x200 gives).
    pub header_end: usize,
    pub loadflags: u8,
    pub xloadflags: u16,
    /// Highest address an initrd may end at, plus one (below 4 GiB unless
    /// the kernel may be loaded above it).
    pub initrd_addr_max: u64,
    pub kernel_alignment: u64,
    pub relocatable: bool,
    /// Longest command line the kernel accepts, without the NUL.
    pub cmdline_size: u32,
    /// Where a non-relocatable kernel must go; the preferred address of a
    /// relocatable one.
    pub pref_address: u64,
    /// Bytes the kernel needs from its load address on while it
    /// decompresses itself.
    pub init_size: u64,
}

fn u8_at(b: &[u8], at: usize) -> u8 {
    b[at]
}
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from(u32_at(b, at)) | (u64::from(u32_at(b, at + 4)) << 32)
}

/// The fields up to `init_size` (0x264) must be in the file for a 2.12+
/// header.
const MIN_LEN: usize = 0x268;

impl SetupHeader {
    /// Parses and checks the setup header of `image`.
    pub fn parse(image: &[u8]) -> Result<SetupHeader, BzImageError> {
        use offset::*;
        if image.len() < MIN_LEN {
            return Err(BzImageError::TooShort(image.len()));
        }
        let boot_flag = u16_at(image, BOOT_FLAG);
        if boot_flag != BOOT_FLAG_MAGIC {
            return Err(BzImageError::BadBootFlag(boot_flag));
        }
        if u32_at(image, HEADER) != HEADER_MAGIC {
            return Err(BzImageError::NoHeaderMagic);
        }
        let version = u16_at(image, VERSION);
        if version < MIN_VERSION {
            return Err(BzImageError::OldProtocol {
                major: (version >> 8) as u8,
                minor: version as u8,
            });
        }
        // "If setup_sects is 0, the real value is 4."
        let sects = match u8_at(image, SETUP_SECTS) {
            0 => 4,
            n => usize::from(n),
        };
        let setup_len = (sects + 1) * 512;
        if setup_len >= image.len() {
            return Err(BzImageError::NoKernel {
                setup: setup_len,
                len: image.len(),
            });
        }
        let header_end = HEADER + usize::from(u8_at(image, JUMP + 1));
        if header_end < INIT_SIZE + 4 || header_end > setup_len || header_end > 0x290 {
            return Err(BzImageError::BadHeaderLength(header_end));
        }
        let loadflags = u8_at(image, LOADFLAGS);
        if loadflags & LOADED_HIGH == 0 {
            return Err(BzImageError::NotLoadedHigh(loadflags));
        }
        let xloadflags = u16_at(image, XLOADFLAGS);
        if xloadflags & XLF_KERNEL_64 == 0 {
            return Err(BzImageError::No64BitEntry(xloadflags));
        }
        let alignment = u32_at(image, KERNEL_ALIGNMENT);
        if !alignment.is_power_of_two() || alignment < 4096 {
            return Err(BzImageError::BadAlignment(alignment));
        }
        let kernel_len = image.len() - setup_len;
        // syssize counts 16-byte paragraphs of the protected-mode kernel;
        // the file may carry padding after it but not less than it.
        let syssize_bytes = u64::from(u32_at(image, SYSSIZE)) * 16;
        if syssize_bytes > (kernel_len as u64).next_multiple_of(16) {
            return Err(BzImageError::BadSyssize {
                syssize_bytes,
                have: kernel_len as u64,
            });
        }
        let init_size = u32_at(image, INIT_SIZE);
        if (init_size as usize) < kernel_len.min(syssize_bytes as usize) || init_size == 0 {
            return Err(BzImageError::BadInitSize {
                init_size,
                kernel: kernel_len,
            });
        }
        let relocatable = u8_at(image, RELOCATABLE_KERNEL) != 0;
        let pref_address = u64_at(image, PREF_ADDRESS);
        if !relocatable && (pref_address < 0x10_0000 || pref_address % (2 << 20) != 0) {
            return Err(BzImageError::BadPrefAddress(pref_address));
        }
        let initrd_addr_max = if xloadflags & XLF_CAN_BE_LOADED_ABOVE_4G != 0 {
            u64::MAX
        } else {
            u64::from(u32_at(image, INITRD_ADDR_MAX)) + 1
        };
        Ok(SetupHeader {
            version,
            setup_len,
            header_end,
            loadflags,
            xloadflags,
            initrd_addr_max,
            kernel_alignment: u64::from(alignment),
            relocatable,
            cmdline_size: u32_at(image, CMDLINE_SIZE),
            pref_address,
            init_size: u64::from(init_size),
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal well-formed 2.15 bzImage: 4 setup sectors (after the boot
    /// sector) and `kernel_len` bytes of "kernel".
    pub(crate) fn fake_bzimage(kernel_len: usize) -> Vec<u8> {
        use offset::*;
        let setup_len = 5 * 512;
        let mut b = vec![0u8; setup_len + kernel_len];
        b[SETUP_SECTS] = 4;
        b[SYSSIZE..SYSSIZE + 4].copy_from_slice(&(kernel_len.div_ceil(16) as u32).to_le_bytes());
        b[BOOT_FLAG..BOOT_FLAG + 2].copy_from_slice(&0xaa55u16.to_le_bytes());
        b[JUMP] = 0xeb;
        b[JUMP + 1] = 0x6a; // header up to 0x26c
        b[HEADER..HEADER + 4].copy_from_slice(b"HdrS");
        b[VERSION..VERSION + 2].copy_from_slice(&0x020fu16.to_le_bytes());
        b[LOADFLAGS] = LOADED_HIGH;
        b[INITRD_ADDR_MAX..INITRD_ADDR_MAX + 4].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
        b[KERNEL_ALIGNMENT..KERNEL_ALIGNMENT + 4].copy_from_slice(&0x20_0000u32.to_le_bytes());
        b[RELOCATABLE_KERNEL] = 1;
        b[XLOADFLAGS..XLOADFLAGS + 2].copy_from_slice(&0x7fu16.to_le_bytes());
        b[CMDLINE_SIZE..CMDLINE_SIZE + 4].copy_from_slice(&0x7ffu32.to_le_bytes());
        b[PREF_ADDRESS..PREF_ADDRESS + 8].copy_from_slice(&0x100_0000u64.to_le_bytes());
        b[INIT_SIZE..INIT_SIZE + 4].copy_from_slice(&0x40_0000u32.to_le_bytes());
        b
    }

    #[test]
    fn a_well_formed_header_parses() {
        let h = SetupHeader::parse(&fake_bzimage(0x1000)).unwrap();
        assert_eq!(h.version, 0x020f);
        assert_eq!(h.setup_len, 2560);
        assert_eq!(h.header_end, 0x26c);
        assert_eq!(h.initrd_addr_max, u64::MAX); // XLF_CAN_BE_LOADED_ABOVE_4G
        assert_eq!(h.kernel_alignment, 2 << 20);
        assert!(h.relocatable);
        assert_eq!(h.cmdline_size, 0x7ff);
        assert_eq!(h.pref_address, 0x100_0000);
        assert_eq!(h.init_size, 0x40_0000);
    }

    #[test]
    fn malformed_headers_are_clear_errors() {
        use offset::*;
        let good = fake_bzimage(0x1000);
        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.clone();
            f(&mut b);
            SetupHeader::parse(&b).unwrap_err()
        };
        assert_eq!(
            SetupHeader::parse(&good[..0x100]).unwrap_err(),
            BzImageError::TooShort(0x100)
        );
        assert_eq!(
            with(&|b| b[BOOT_FLAG] = 0),
            BzImageError::BadBootFlag(0xaa00)
        );
        assert_eq!(with(&|b| b[HEADER] = b'X'), BzImageError::NoHeaderMagic);
        assert_eq!(
            with(&|b| b[VERSION] = 0x0b),
            BzImageError::OldProtocol {
                major: 2,
                minor: 11
            }
        );
        assert!(matches!(
            with(&|b| b.truncate(2560)),
            BzImageError::NoKernel { setup: 2560, .. }
        ));
        assert!(matches!(
            with(&|b| b[SETUP_SECTS] = 200),
            BzImageError::NoKernel { .. }
        ));
        assert_eq!(
            with(&|b| b[JUMP + 1] = 0x10),
            BzImageError::BadHeaderLength(0x212)
        );
        assert_eq!(with(&|b| b[LOADFLAGS] = 0), BzImageError::NotLoadedHigh(0));
        assert_eq!(
            with(&|b| b[XLOADFLAGS] = 0x7e),
            BzImageError::No64BitEntry(0x7e)
        );
        assert_eq!(
            with(&|b| b[KERNEL_ALIGNMENT + 2] = 0x30),
            BzImageError::BadAlignment(0x30_0000)
        );
        assert!(matches!(
            with(&|b| b[SYSSIZE + 1] = 0x10),
            BzImageError::BadSyssize { .. }
        ));
        assert!(matches!(
            with(&|b| b[INIT_SIZE..INIT_SIZE + 4].fill(0)),
            BzImageError::BadInitSize { init_size: 0, .. }
        ));
        assert_eq!(
            with(&|b| {
                b[RELOCATABLE_KERNEL] = 0;
                b[PREF_ADDRESS] = 0x10;
            }),
            BzImageError::BadPrefAddress(0x100_0010)
        );
        // Every error has a message that says what is wrong.
        assert!(with(&|b| b[BOOT_FLAG] = 0)
            .to_string()
            .contains("not a Linux kernel image"));
    }

    #[test]
    fn garbage_never_panics() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in [0usize, 1, 0x267, 0x268, 0x300, 4096] {
            for _ in 0..200 {
                let mut b = fake_bzimage(0x800);
                b.truncate(len.min(b.len()));
                for byte in b.iter_mut().take(0x300) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if x % 7 == 0 {
                        *byte = x as u8;
                    }
                }
                let _ = SetupHeader::parse(&b);
            }
        }
    }
}
