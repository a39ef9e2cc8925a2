//! Checks of a configuration before any VM starts: what the kernel image
//! needs of guest and host memory, the swap file, output paths and the
//! program name. Every failure is a [`ConfigError`] (exit status 2).

use crate::units::format_size;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// A configuration that cannot run.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("this build has no bundled guest kernel (guest/ was not built); pass --kernel FILE")]
    NoBundledKernel,
    #[error(transparent)]
    Input(#[from] InputFileError),
    #[error("multiboot kernel {what}: {source}")]
    Multiboot {
        what: String,
        source: hv::multiboot::MultibootError,
    },
    #[error("kernel image {what}: {source}")]
    Kernel {
        what: String,
        source: hv::KernelError,
    },
    #[error("--mem {}: guest memory must be a multiple of 2 MiB between {} (the kernel image ends at {image_end:#x}) and {}", format_size(*.mem), format_size(*.min), format_size(*.max))]
    MemSize {
        mem: u64,
        min: u64,
        max: u64,
        image_end: u64,
    },
    #[error("--host-mem {}: host memory must be at least {} (the hv's minimum is {}; the kernel image's {} pages are all resident while it loads)", format_size(*.host_mem), format_size(*.min), format_size(hv::MIN_HOST_MEM), .kernel / PAGE)]
    HostMemTooSmall {
        host_mem: u64,
        min: u64,
        kernel: u64,
    },
    #[error("--lookahead {lookahead}: at most {max} cycles (the shortest IPI flight after an exit at these costs); more would let IPIs land late")]
    Lookahead { lookahead: u64, max: u64 },
    #[error("--swap {path}: {reason}")]
    SwapPath { path: PathBuf, reason: String },
    #[error("{option} {path}: {reason}")]
    OutputPath {
        option: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("unknown program `{name}`; the bundled kernel has: {}", .available.join(" "))]
    UnknownProgram {
        name: String,
        available: Vec<&'static str>,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("cannot boot {what}: {source}")]
    Boot {
        what: String,
        source: hv::CreateError,
    },
    #[error("{0}")]
    Linux(#[from] crate::linux::LinuxSetupError),
    #[error("cannot install the SIGINT/SIGTERM handlers: {0}")]
    Signals(std::io::Error),
}

#[cfg(bundled_kernel)]
const BUNDLED_KERNEL: Option<&[u8]> = Some(include_bytes!(env!("FAULTLINE_GUEST_KERNEL")));
#[cfg(not(bundled_kernel))]
const BUNDLED_KERNEL: Option<&[u8]> = None;

/// The programs of the bundled kernel's user image (from the program table
/// in `guest/user/main.c`, read by build.rs).
#[cfg(bundled_kernel)]
const BUNDLED_PROGRAMS: &str = env!("FAULTLINE_GUEST_PROGRAMS");
#[cfg(not(bundled_kernel))]
const BUNDLED_PROGRAMS: &str = "";

/// A kernel image and what it needs.
pub struct Kernel {
    pub bytes: Vec<u8>,
    /// `None` for the bundled kernel, else the file it came from.
    pub path: Option<PathBuf>,
    /// Least guest memory: the image's end, rounded up to 2 MiB.
    pub min_mem: u64,
    /// One past the image's highest loaded byte.
    pub image_end: u64,
    /// Bytes of the pages the image's segments cover: the hv backs them
    /// all while it loads the kernel, before it lets the .bss pages go.
    pub loaded_bytes: u64,
    /// The multiboot header, for a multiboot kernel.
    pub multiboot: Option<hv::multiboot::Header>,
}

const PAGE: u64 = 4096;
const TWO_MIB: u64 = 2 << 20;

impl Kernel {
    /// `path`, or the bundled guest kernel.
    pub fn load(path: Option<&Path>) -> Result<Kernel, ConfigError> {
        let bytes = match path {
            Some(path) => read_input_file("--kernel", path, KERNEL_CAP)?,
            None => BUNDLED_KERNEL.ok_or(ConfigError::NoBundledKernel)?.to_vec(),
        };
        let path = path.map(Path::to_path_buf);
        let multiboot_error = |source| ConfigError::Multiboot {
            what: describe(path.as_deref()),
            source,
        };
        if let Some(header) = hv::multiboot::find_header(&bytes).map_err(multiboot_error)? {
            let plan = hv::multiboot::plan_kernel(&bytes, &header, hv::MAX_GUEST_MEM)
                .map_err(multiboot_error)?;
            let end = plan.end.next_multiple_of(PAGE);
            return Ok(Kernel {
                min_mem: end.next_multiple_of(TWO_MIB),
                image_end: plan.end,
                loaded_bytes: end - (plan.start & !(PAGE - 1)),
                multiboot: Some(header),
                bytes,
                path,
            });
        }
        let (elf, image) =
            hv::parse_kernel(&bytes, hv::MAX_GUEST_MEM).map_err(|source| ConfigError::Kernel {
                what: describe(path.as_deref()),
                source,
            })?;
        let mut pages: Vec<(u64, u64)> = elf
            .segments
            .iter()
            .filter(|s| s.memsz != 0)
            .map(|s| (s.paddr / PAGE, s.paddr_end().div_ceil(PAGE)))
            .collect();
        pages.sort_unstable();
        let (mut covered, mut end) = (0, 0);
        for (first, last) in pages {
            let first = first.max(end);
            if last > first {
                covered += last - first;
                end = last;
            }
        }
        Ok(Kernel {
            min_mem: image.end.next_multiple_of(TWO_MIB).max(TWO_MIB),
            image_end: image.end,
            loaded_bytes: covered * PAGE,
            multiboot: None,
            bytes,
            path,
        })
    }

    /// `bundled kernel` or the file name, for messages.
    pub fn describe(&self) -> String {
        describe(self.path.as_deref())
    }

    /// Least host memory (`--host-mem`) a VM with this kernel can boot in.
    pub fn min_host_mem(&self) -> u64 {
        self.loaded_bytes.max(hv::MIN_HOST_MEM)
    }

    /// Checks guest and host memory sizes against what this kernel and the
    /// hv need.
    pub fn check_memory(&self, mem: u64, host_mem: Option<u64>) -> Result<(), ConfigError> {
        let max = hv::MAX_GUEST_MEM - hv::MAX_GUEST_MEM % TWO_MIB;
        if mem % TWO_MIB != 0 || mem < self.min_mem || mem > max {
            return Err(ConfigError::MemSize {
                mem,
                min: self.min_mem,
                max,
                image_end: self.image_end,
            });
        }
        if let Some(host_mem) = host_mem {
            if host_mem < self.min_host_mem() {
                return Err(ConfigError::HostMemTooSmall {
                    host_mem,
                    min: self.min_host_mem(),
                    kernel: self.loaded_bytes,
                });
            }
        }
        Ok(())
    }

    /// Checks that the bundled kernel has `program` (other kernels are not
    /// checked: their programs are their own business).
    pub fn check_program(&self, program: &str) -> Result<(), ConfigError> {
        let available: Vec<&'static str> = BUNDLED_PROGRAMS.split(',').collect();
        if self.path.is_some() || available.contains(&program) {
            return Ok(());
        }
        Err(ConfigError::UnknownProgram {
            name: program.to_string(),
            available,
        })
    }
}

fn describe(path: Option<&Path>) -> String {
    path.map_or("bundled kernel".to_string(), |p| p.display().to_string())
}

/// Largest `--kernel` file: far above any kernel ELF or multiboot image
/// (the bundled kernel is well under 1 MiB).
pub const KERNEL_CAP: u64 = 128 << 20;
/// Largest `--kernel-image` (Debian's cloud bzImage is about 14 MiB).
pub const LINUX_IMAGE_CAP: u64 = 256 << 20;
/// Largest `--console-input`: the bytes wait in host memory for the guest
/// to read them.
pub const CONSOLE_INPUT_CAP: u64 = 64 << 20;
/// Largest JSON result file `bench merge` reads.
pub const RESULT_FILE_CAP: u64 = 64 << 20;

/// Why a file given on the command line cannot be read.
#[derive(Debug, Error)]
pub enum InputFileError {
    #[error("cannot read {option} {}: {source}", .path.display())]
    Io {
        option: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{option} {}: not a regular file (a device, FIFO or directory may never end)", .path.display())]
    NotAFile { option: &'static str, path: PathBuf },
    #[error("{option} {}: more than {} ({what})", .path.display(), format_size(*.cap))]
    TooLarge {
        option: &'static str,
        path: PathBuf,
        cap: u64,
        what: &'static str,
    },
}

/// What a cap on an input stands for, for the message.
fn cap_reason(option: &str) -> &'static str {
    match option {
        "--initrd" | "--module" => "it must fit in guest memory, --mem",
        "--console-input" => "the most this option takes",
        _ => "the most a file of this kind can be here",
    }
}

/// Reads a file named on the command line whole: a regular file (after
/// symbolic links) of at most `cap` bytes, so `/dev/zero` or a FIFO is
/// refused at once instead of filling host memory.
pub fn read_input_file(
    option: &'static str,
    path: &Path,
    cap: u64,
) -> Result<Vec<u8>, InputFileError> {
    let io = |source| InputFileError::Io {
        option,
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(InputFileError::NotAFile {
            option,
            path: path.to_path_buf(),
        });
    }
    read_capped(option, path, file, cap, meta.len())
}

/// Reads `reader` to its end, refusing more than `cap` bytes (a file that
/// grows while read, or standard input). `expected`: the bytes it likely
/// holds (a file's size, or 0), room made for at the start: the kernel
/// image is tens of megabytes, and a vector grown while read copies it
/// over and over.
pub fn read_capped(
    option: &'static str,
    path: &Path,
    reader: impl std::io::Read,
    cap: u64,
    expected: u64,
) -> Result<Vec<u8>, InputFileError> {
    use std::io::Read;
    // (One byte over: the read that finds the end needs room.)
    let room = expected.min(cap).saturating_add(1);
    let mut bytes = Vec::with_capacity(usize::try_from(room).unwrap_or(0));
    reader
        .take(cap.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| InputFileError::Io {
            option,
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() as u64 > cap {
        return Err(InputFileError::TooLarge {
            option,
            path: path.to_path_buf(),
            cap,
            what: cap_reason(option),
        });
    }
    Ok(bytes)
}

/// A swap file must be a regular file on a disk-backed file system (or a
/// new one in an existing directory) or a block device: the pager writes
/// and reads pages at offsets. Character devices (`/dev/null` would lose
/// every page), pipes, directories and files of kernel pseudo file systems
/// (`/proc`, `/sys`) are refused before the VM starts.
pub fn check_swap_path(path: &Path) -> Result<(), ConfigError> {
    use std::os::unix::fs::FileTypeExt;
    let refuse = |reason: &str| ConfigError::SwapPath {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    let dir = match std::fs::metadata(path) {
        Ok(meta) => {
            let kind = meta.file_type();
            if kind.is_block_device() {
                return Ok(());
            }
            if !kind.is_file() {
                return Err(refuse(
                    "not a regular file or block device (the swap file is written and read at offsets)",
                ));
            }
            path.to_path_buf()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = parent_dir(path);
            if !parent.is_dir() {
                return Err(refuse(&format!(
                    "directory {} does not exist",
                    parent.display()
                )));
            }
            parent
        }
        Err(e) => return Err(refuse(&e.to_string())),
    };
    if on_pseudo_file_system(&dir) {
        return Err(refuse(
            "on a kernel pseudo file system (proc, sysfs, ...), not a disk",
        ));
    }
    Ok(())
}

/// The directory a path names a file in (`.` for a bare file name).
fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Whether `path` lies on procfs, sysfs or a similar kernel interface
/// whose "files" are not storage.
// `f_type` and the magic constants have target-dependent widths: the casts
// are no-ops on x86-64 only.
#[allow(clippy::unnecessary_cast)]
fn on_pseudo_file_system(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: an all-zero `statfs` is a valid value of this plain C struct.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a NUL-terminated string and `fs` a writable
    // `statfs` that outlives the call.
    if unsafe { libc::statfs(c_path.as_ptr(), &mut fs) } != 0 {
        return false;
    }
    const PSEUDO: [i64; 12] = [
        libc::PROC_SUPER_MAGIC as i64,
        libc::SYSFS_MAGIC as i64,
        libc::DEBUGFS_MAGIC as i64,
        libc::TRACEFS_MAGIC as i64,
        libc::SECURITYFS_MAGIC as i64,
        libc::CGROUP_SUPER_MAGIC as i64,
        libc::CGROUP2_SUPER_MAGIC as i64,
        libc::DEVPTS_SUPER_MAGIC as i64,
        libc::BPF_FS_MAGIC as i64,
        0x6265_6570, // configfs
        0xde5e_81e4, // efivarfs
        0x6165_676c, // pstore
    ];
    PSEUDO.contains(&(fs.f_type as i64))
}

/// An output file (`--plot`) must go into an existing directory, so a run
/// of many minutes does not fail at its very end.
pub fn check_output_path(option: &'static str, path: &Path) -> Result<(), ConfigError> {
    let refuse = |reason: String| ConfigError::OutputPath {
        option,
        path: path.to_path_buf(),
        reason,
    };
    if path.is_dir() {
        return Err(refuse("is a directory (give a file name)".into()));
    }
    let parent = parent_dir(path);
    if !parent.is_dir() {
        return Err(refuse(format!(
            "directory {} does not exist",
            parent.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_paths() {
        let dir = tempfile::tempdir().unwrap();
        check_swap_path(&dir.path().join("new")).unwrap();
        std::fs::write(dir.path().join("old"), b"x").unwrap();
        check_swap_path(&dir.path().join("old")).unwrap();
        for bad in ["/proc/version", "/dev/null", "/nonexistent-dir/x"] {
            assert!(check_swap_path(Path::new(bad)).is_err(), "{bad}");
        }
        assert!(check_swap_path(dir.path()).is_err(), "a directory");
    }

    #[test]
    fn input_files_are_regular_and_capped() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("k");
        std::fs::write(&file, b"12345678").unwrap();
        assert_eq!(read_input_file("--kernel", &file, 8).unwrap(), b"12345678");
        assert!(matches!(
            read_input_file("--kernel", &file, 7),
            Err(InputFileError::TooLarge { cap: 7, .. })
        ));
        for endless in ["/dev/zero", "/dev/urandom"] {
            let e = read_input_file("--initrd", Path::new(endless), 1 << 20).unwrap_err();
            assert!(matches!(e, InputFileError::NotAFile { .. }), "{endless}");
            assert!(e.to_string().contains("not a regular file"), "{e}");
        }
        assert!(matches!(
            read_input_file("--kernel", dir.path(), 1 << 20),
            Err(InputFileError::NotAFile { .. })
        ));
        assert!(matches!(
            read_input_file("--kernel", &dir.path().join("none"), 1 << 20),
            Err(InputFileError::Io { .. })
        ));
        // Standard input (any reader) is cut at the cap, not read to its end.
        let endless = std::io::repeat(0);
        let e = read_capped("--console-input", Path::new("-"), endless, 4096, 0).unwrap_err();
        assert!(e.to_string().contains("more than 4K"), "{e}");
    }

    #[test]
    fn output_paths() {
        let dir = tempfile::tempdir().unwrap();
        check_output_path("--plot", &dir.path().join("x.svg")).unwrap();
        assert!(check_output_path("--plot", &dir.path().join("no/x.svg")).is_err());
        assert!(check_output_path("--plot", dir.path()).is_err());
    }
}
