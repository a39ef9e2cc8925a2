//! `--guest linux`: Debian's cloud kernel (a bzImage from the cache that
//! `scripts/fetch-linux.sh` fills, or `--kernel-image FILE`) booted through
//! Linux's 64-bit boot protocol (`hv::linux`), with an initramfs written
//! here at run time: the project's `/init` and the Linux builds of the
//! programs (`guest/linux/`, static executables built by build.rs).

use std::path::{Path, PathBuf};
use thiserror::Error;

/// The kernel options `--guest linux` boots with unless `--cmdline` gives
/// others: the console on COM1 from the first message on, and a panic
/// that reboots at once (`panic=-1`) by a triple fault (`reboot=t`: the
/// platform has no reset register or keyboard controller), which stops
/// the VM, as Firecracker's documented boot arguments do. (The vmm also
/// reads the panic on the console: `session::PanicWatch`.)
pub const DEFAULT_OPTIONS: &str = "console=ttyS0 earlyprintk=serial,ttyS0 panic=-1 reboot=t";

/// The Linux programs built into this binary: (name, executable).
#[cfg(linux_programs)]
const PROGRAMS: &[(&str, &[u8])] = &[
    (
        "hello",
        include_bytes!(concat!(env!("FAULTLINE_LINUX_PROGRAMS"), "/hello")),
    ),
    (
        "memtouch",
        include_bytes!(concat!(env!("FAULTLINE_LINUX_PROGRAMS"), "/memtouch")),
    ),
    (
        "bm",
        include_bytes!(concat!(env!("FAULTLINE_LINUX_PROGRAMS"), "/bm")),
    ),
    (
        "pagetag",
        include_bytes!(concat!(env!("FAULTLINE_LINUX_PROGRAMS"), "/pagetag")),
    ),
    (
        "apfcalc",
        include_bytes!(concat!(env!("FAULTLINE_LINUX_PROGRAMS"), "/apfcalc")),
    ),
    (
        "ctxsw",
        include_bytes!(concat!(env!("FAULTLINE_LINUX_PROGRAMS"), "/ctxsw")),
    ),
    (
        "hackbench",
        include_bytes!(concat!(env!("FAULTLINE_LINUX_PROGRAMS"), "/hackbench")),
    ),
    (
        "clockwarp",
        include_bytes!(concat!(env!("FAULTLINE_LINUX_PROGRAMS"), "/clockwarp")),
    ),
    (
        "segcheck",
        include_bytes!(concat!(env!("FAULTLINE_LINUX_PROGRAMS"), "/segcheck")),
    ),
];
#[cfg(not(linux_programs))]
const PROGRAMS: &[(&str, &[u8])] = &[];

#[cfg(linux_programs)]
const INIT: Option<&[u8]> = Some(include_bytes!(concat!(
    env!("FAULTLINE_LINUX_PROGRAMS"),
    "/init"
)));
#[cfg(not(linux_programs))]
const INIT: Option<&[u8]> = None;

/// Why a Linux guest cannot be set up.
#[derive(Debug, Error)]
pub enum LinuxSetupError {
    #[error(
        "no Linux kernel image at {0}: run `bash scripts/fetch-linux.sh` (it fetches Debian's linux-image-cloud-amd64 into that cache) or pass --kernel-image FILE"
    )]
    NoCachedImage(PathBuf),
    #[error(transparent)]
    ReadImage(#[from] crate::config::InputFileError),
    #[error("this build has no Linux guest programs (guest/linux was not built)")]
    NoPrograms,
    #[error("--guest linux needs a program: `-- PROGRAM ARGS`")]
    NoProgram,
    #[error("unknown Linux guest program `{name}`; this build has: {}", .available.join(" "))]
    UnknownProgram {
        name: String,
        available: Vec<String>,
    },
}

/// The cache directory of `scripts/fetch-linux.sh`.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("FAULTLINE_CACHE") {
        Some(dir) => PathBuf::from(dir).join("linux"),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/".into());
            PathBuf::from(home).join(".cache/faultline/linux")
        }
    }
}

/// The cached image (`vmlinuz`, the link the script points at the newest
/// image it fetched), if there is one.
pub fn cached_image() -> Option<PathBuf> {
    let path = cache_dir().join("vmlinuz");
    path.is_file().then_some(path)
}

/// `path`, or the cached image.
pub fn read_image(path: Option<&Path>) -> Result<(PathBuf, Vec<u8>), LinuxSetupError> {
    let path = match path {
        Some(path) => path.to_path_buf(),
        None => cached_image().ok_or_else(|| LinuxSetupError::NoCachedImage(cache_dir()))?,
    };
    let bytes =
        crate::config::read_input_file("--kernel-image", &path, crate::config::LINUX_IMAGE_CAP)?;
    Ok((path, bytes))
}

/// The kernel's version string from a bzImage's setup header (the
/// `kernel_version` field, as `file(1)` prints it): `6.1.0-57-cloud-amd64
/// (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC Debian
/// 6.1.192-3 (2026-11-26)`; `None` for an image without one.
pub fn image_version(image: &[u8]) -> Option<String> {
    if image.get(0x202..0x206)? != b"HdrS" {
        return None;
    }
    let offset = u16::from_le_bytes(image.get(0x20e..0x210)?.try_into().ok()?) as usize;
    if offset == 0 {
        return None;
    }
    let text = image.get(0x200 + offset..)?;
    let end = text.iter().take(256).position(|&b| b == 0)?;
    let version = std::str::from_utf8(&text[..end]).ok()?.trim();
    (!version.is_empty() && version.chars().all(|c| !c.is_control())).then(|| version.to_string())
}

/// The release part of a version string (`6.1.0-57-cloud-amd64`).
pub fn release(version: &str) -> &str {
    version.split_whitespace().next().unwrap_or(version)
}

/// The names of the Linux programs this build carries.
pub fn program_names() -> Vec<String> {
    PROGRAMS.iter().map(|(name, _)| name.to_string()).collect()
}

/// Checks that `program` names a built Linux program.
pub fn check_program(program: &[String]) -> Result<(), LinuxSetupError> {
    if INIT.is_none() {
        return Err(LinuxSetupError::NoPrograms);
    }
    let name = program.first().ok_or(LinuxSetupError::NoProgram)?;
    if PROGRAMS.iter().any(|(n, _)| n == name) {
        Ok(())
    } else {
        Err(LinuxSetupError::UnknownProgram {
            name: name.clone(),
            available: program_names(),
        })
    }
}

/// The kernel command line: the options, then `--` and the program with
/// its arguments, which the kernel hands to /init as its arguments. It
/// hands init the option words without `=` that it does not know itself
/// first (`nokaslr`, which only the boot code reads, is one); with such
/// words among the options, `faultline_argc`, which the kernel puts in
/// init's environment, says how many of init's arguments are the
/// program's. (Without them the line stays as it was, byte for byte.)
pub fn cmdline(options: &str, program: &[String]) -> String {
    let program_words = program.join(" ");
    if options.split_whitespace().any(|w| !w.contains('=')) {
        format!(
            "{options} faultline_argc={} -- {program_words}",
            program.len()
        )
    } else {
        format!("{options} -- {program_words}")
    }
}

/// The initramfs: the directories init mounts on, /dev/console (the
/// kernel opens it for init before anything is mounted), /init and every
/// program in /bin.
pub fn initramfs() -> Result<Vec<u8>, LinuxSetupError> {
    use hv::linux::initramfs::CpioWriter;
    let init = INIT.ok_or(LinuxSetupError::NoPrograms)?;
    // Each entry is a 110-byte header, its name and padding besides the
    // data: 256 bytes is room for that, for each program and the eight
    // other entries (five directories, the console, init, the trailer).
    let data: usize = init.len() + PROGRAMS.iter().map(|(_, b)| b.len()).sum::<usize>();
    let mut cpio = CpioWriter::with_capacity(data + (PROGRAMS.len() + 8) * 256);
    for dir in ["dev", "proc", "sys", "tmp", "bin"] {
        cpio.dir(dir);
    }
    // The console's device number: TTYAUX_MAJOR 5, minor 1.
    cpio.char_device("dev/console", 0o600, 5, 1);
    cpio.file("init", 0o755, init);
    for (name, bytes) in PROGRAMS {
        cpio.file(&format!("bin/{name}"), 0o755, bytes);
    }
    Ok(cpio.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_hands_the_program_to_init() {
        let program = ["hello".to_string(), "a".to_string()];
        assert_eq!(
            cmdline(DEFAULT_OPTIONS, &program),
            "console=ttyS0 earlyprintk=serial,ttyS0 panic=-1 reboot=t -- hello a"
        );
        assert_eq!(
            cmdline("console=ttyS0 nokaslr", &program),
            "console=ttyS0 nokaslr faultline_argc=2 -- hello a"
        );
    }

    #[test]
    fn the_version_comes_from_the_setup_header() {
        let mut image = vec![0u8; 0x400];
        image[0x202..0x206].copy_from_slice(b"HdrS");
        image[0x20e..0x210].copy_from_slice(&0x100u16.to_le_bytes());
        let text = b"6.1.0-57-cloud-amd64 (debian-kernel@lists.debian.org) #1 SMP\0";
        image[0x300..0x300 + text.len()].copy_from_slice(text);
        let version = image_version(&image).unwrap();
        assert!(version.ends_with("#1 SMP"), "{version}");
        assert_eq!(release(&version), "6.1.0-57-cloud-amd64");
        image[0x20e..0x210].copy_from_slice(&0xffffu16.to_le_bytes());
        assert_eq!(image_version(&image), None, "outside the image");
        assert_eq!(image_version(b"MZ"), None);
    }

    #[cfg(linux_programs)]
    #[test]
    fn programs_are_checked_and_packed() {
        check_program(&["hello".to_string()]).unwrap();
        assert!(matches!(
            check_program(&["nope".to_string()]),
            Err(LinuxSetupError::UnknownProgram { .. })
        ));
        assert!(matches!(
            check_program(&[]),
            Err(LinuxSetupError::NoProgram)
        ));
        let archive = initramfs().unwrap();
        let text = String::from_utf8_lossy(&archive);
        for name in ["dev/console", "init", "bin/hello", "TRAILER!!!"] {
            assert!(text.contains(name), "{name}");
        }
        // Written afresh, byte for byte the same.
        assert_eq!(archive, initramfs().unwrap());
    }
}
