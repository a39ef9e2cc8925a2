//! Booting an unmodified Linux bzImage through the 64-bit boot protocol
//! (Documentation/x86/boot.rst, "64-bit Boot Protocol"): the protected-mode
//! kernel is loaded at a `kernel_alignment`-aligned address, a zero page
//! (`struct boot_params`) carries the setup header, the e820 memory map,
//! the command line, the initrd and the ACPI RSDP, and the bootstrap vCPU
//! starts in 64-bit mode at load + 0x200 with RSI = the zero page, under an
//! identity map of guest RAM and a GDT with `__BOOT_CS` (0x10) and
//! `__BOOT_DS` (0x18). Interrupts are off. Linux brings up the other vCPUs
//! itself with INIT/SIPI.
//!
//! Guest-physical layout (low megabyte):
//!
//! | gpa | contents |
//! |-----|----------|
//! | 0x1000 | GDT: null, null, `__BOOT_CS` 64-bit code, `__BOOT_DS` data |
//! | 0x3000.. | identity map of guest RAM (as `boot.rs`: PML4, PDPT, page directories) |
//! | 0x70000..0x80000 | a stack (the kernel sets its own at once) |
//! | 0x80000 | the zero page (`boot_params`) |
//! | 0x81000 | the command line |
//! | 0xe0000.. | ACPI tables, RSDP first (`devices::acpi`) |
//!
//! The kernel goes at its `pref_address` (16 MiB for Debian's), the initrd
//! at the top of RAM (below `initrd_addr_max`).

pub use crate::image::bzimage;
pub use crate::image::LinuxBootError;
pub mod initramfs;

use crate::boot::{self, KernelImage};
use crate::vcpu::VcpuId;
use crate::vm::CreateError;
use crate::vm::{Vm, VmConfig};
use bzimage::{offset, SetupHeader};
use machine::cpu::state::{rflags, seg_attr, DescriptorTable, Gpr};
use machine::Gpa;

/// The zero page.
pub const BOOT_PARAMS_GPA: u64 = 0x8_0000;
/// The command line.
pub const CMDLINE_GPA: u64 = 0x8_1000;
/// Room for the command line (its NUL included) before the end of the
/// usable low memory.
const CMDLINE_ROOM: u64 = 0x9_f000 - CMDLINE_GPA;
/// End of the RAM below 1 MiB; 0x9fc00..0xa0000 is the traditional EBDA
/// (reserved), 0xa0000..0xe0000 the VGA hole and option ROMs (a hole in
/// the map), 0xe0000..0x100000 the BIOS area with the ACPI tables
/// (reserved).
pub const LOW_RAM_END: u64 = 0x9_fc00;
/// The GDT's selectors the boot protocol names.
pub const BOOT_CS: u16 = 0x10;
pub const BOOT_DS: u16 = 0x18;
/// GDT: null, null (Linux's GDT_ENTRY_BOOT_CS is 2), 64-bit code, data.
pub const LINUX_GDT: [u64; 4] = [0, 0, 0x00af_9b00_0000_ffff, 0x00cf_9300_0000_ffff];

/// `boot_params` fields outside the setup header.
mod zero_page {
    pub const ACPI_RSDP_ADDR: usize = 0x070;
    pub const EXT_RAMDISK_IMAGE: usize = 0x0c0;
    pub const EXT_RAMDISK_SIZE: usize = 0x0c4;
    pub const EXT_CMD_LINE_PTR: usize = 0x0c8;
    pub const E820_ENTRIES: usize = 0x1e8;
    pub const SENTINEL: usize = 0x1ef;
    pub const E820_TABLE: usize = 0x2d0;
    pub const E820_MAX: usize = 128;
    pub const SIZE: usize = 4096;
}

/// e820 types.
pub mod e820 {
    pub const RAM: u32 = 1;
    pub const RESERVED: u32 = 2;
}

/// Where everything goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinuxPlan {
    pub header: SetupHeader,
    /// Load address of the protected-mode kernel.
    pub load: u64,
    /// Entry point (load + 0x200).
    pub entry: u64,
    /// The initrd's address (0 and length 0 without one).
    pub initrd: u64,
    pub initrd_len: u64,
    /// The zero page's bytes.
    pub zero_page: Vec<u8>,
}

/// The e820 map for `mem_size` bytes of RAM: (start, length, type); RAM
/// beyond the PCI hole is listed from 4 GiB.
pub fn e820_map(mem_size: u64) -> Vec<(u64, u64, u32)> {
    let ranges = crate::vm::ram_ranges(mem_size);
    let low = ranges[0].1;
    let mut map = vec![
        (0, LOW_RAM_END, e820::RAM),
        (LOW_RAM_END, 0xa_0000 - LOW_RAM_END, e820::RESERVED),
        (
            crate::devices::acpi::ACPI_BASE,
            0x10_0000 - crate::devices::acpi::ACPI_BASE,
            e820::RESERVED,
        ),
        (0x10_0000, low - 0x10_0000, e820::RAM),
    ];
    map.extend(
        ranges[1..]
            .iter()
            .map(|&(start, len)| (start, len, e820::RAM)),
    );
    map
}

/// Plans a Linux boot (pure: bytes in, plan out).
pub fn plan(
    image: &[u8],
    cmdline: &str,
    initrd_len: u64,
    mem_size: u64,
) -> Result<LinuxPlan, LinuxBootError> {
    let header = SetupHeader::parse(image)?;
    let max = (header.cmdline_size as usize).min(CMDLINE_ROOM as usize - 1);
    if cmdline.len() > max {
        return Err(LinuxBootError::CmdlineTooLong {
            len: cmdline.len(),
            max,
        });
    }
    if cmdline.as_bytes().contains(&0) {
        return Err(LinuxBootError::CmdlineNul);
    }
    // The initrd at the top of RAM below the PCI hole (and its limit),
    // page-aligned.
    let top = crate::vm::low_ram_end(mem_size).min(header.initrd_addr_max);
    let initrd = if initrd_len == 0 {
        top
    } else {
        top.checked_sub(initrd_len)
            .map(|a| a & !(boot::PAGE - 1))
            .filter(|&a| a >= 0x10_0000)
            .ok_or(LinuxBootError::InitrdTooBig {
                len: initrd_len,
                limit: top,
            })?
    };
    // A relocatable kernel may go anywhere aligned; its preferred address
    // is where it would run without relocation.
    let load = if header.relocatable {
        header
            .pref_address
            .max(0x10_0000)
            .next_multiple_of(header.kernel_alignment)
    } else {
        header.pref_address
    };
    let end = load.saturating_add(header.init_size);
    if end > initrd {
        return Err(LinuxBootError::NoRoomForKernel {
            need: load,
            end,
            initrd,
            mem: mem_size,
        });
    }
    let mut zp = vec![0u8; zero_page::SIZE];
    // The setup header, as the image has it.
    zp[offset::SETUP_SECTS..header.header_end]
        .copy_from_slice(&image[offset::SETUP_SECTS..header.header_end]);
    let put32 = |zp: &mut [u8], at: usize, v: u32| zp[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let put64 = |zp: &mut [u8], at: usize, v: u64| zp[at..at + 8].copy_from_slice(&v.to_le_bytes());
    // "Undefined" boot loader id: faultline has none assigned.
    zp[offset::TYPE_OF_LOADER] = 0xff;
    zp[offset::LOADFLAGS] = header.loadflags;
    zp[zero_page::SENTINEL] = 0;
    put32(&mut zp, offset::CMD_LINE_PTR, CMDLINE_GPA as u32);
    put32(
        &mut zp,
        zero_page::EXT_CMD_LINE_PTR,
        (CMDLINE_GPA >> 32) as u32,
    );
    if initrd_len != 0 {
        put32(&mut zp, offset::RAMDISK_IMAGE, initrd as u32);
        put32(&mut zp, zero_page::EXT_RAMDISK_IMAGE, (initrd >> 32) as u32);
        put32(&mut zp, offset::RAMDISK_SIZE, initrd_len as u32);
        put32(
            &mut zp,
            zero_page::EXT_RAMDISK_SIZE,
            (initrd_len >> 32) as u32,
        );
    }
    put64(
        &mut zp,
        zero_page::ACPI_RSDP_ADDR,
        crate::devices::acpi::ACPI_BASE,
    );
    let map = e820_map(mem_size);
    debug_assert!(map.len() <= zero_page::E820_MAX);
    zp[zero_page::E820_ENTRIES] = map.len() as u8;
    for (i, (start, len, kind)) in map.into_iter().enumerate() {
        let at = zero_page::E820_TABLE + 20 * i;
        put64(&mut zp, at, start);
        put64(&mut zp, at + 8, len);
        put32(&mut zp, at + 16, kind);
    }
    Ok(LinuxPlan {
        entry: load + bzimage::ENTRY_64_OFFSET,
        header,
        load,
        initrd: if initrd_len == 0 { 0 } else { initrd },
        initrd_len,
        zero_page: zp,
    })
}

impl Vm {
    /// A VM booted as the Linux 64-bit boot protocol asks: `image` (a
    /// bzImage) loaded, `initrd` (may be empty) at the top of RAM,
    /// `config.cmdline` as the command line, the ACPI tables, and the
    /// bootstrap vCPU at the 64-bit entry point.
    pub fn boot_linux(config: &VmConfig, image: &[u8], initrd: &[u8]) -> Result<Vm, CreateError> {
        if config.mmu == crate::mmu::MmuMode::Native {
            return Err(LinuxBootError::Native.into());
        }
        let plan = plan(image, &config.cmdline, initrd.len() as u64, config.mem_size)?;
        let mut vm = Vm::new(config)?;
        vm.write_guest(Gpa(plan.load), &image[plan.header.setup_len..])?;
        if !initrd.is_empty() {
            vm.write_guest(Gpa(plan.initrd), initrd)?;
        }
        let gdt: Vec<u8> = LINUX_GDT.iter().flat_map(|d| d.to_le_bytes()).collect();
        vm.write_guest(Gpa(boot::GDT_GPA), &gdt)?;
        for (gpa, entry) in boot::identity_map_entries(config.mem_size) {
            vm.write_guest(Gpa(gpa), &entry.to_le_bytes())?;
        }
        boot::write_acpi_tables(&mut vm, config.vcpus)?;
        vm.write_guest(Gpa(BOOT_PARAMS_GPA), &plan.zero_page)?;
        let mut cmdline = config.cmdline.as_bytes().to_vec();
        cmdline.push(0);
        vm.write_guest(Gpa(CMDLINE_GPA), &cmdline)?;
        vm.kernel = Some(KernelImage {
            entry: plan.entry,
            start: plan.load,
            end: plan.load + plan.header.init_size.next_multiple_of(boot::PAGE),
        });
        vm.start_vcpu(VcpuId(0), plan.entry, boot::BOOT_STACK_TOP, 0);
        enter_linux_state(vm.vcpus[0].cpu.state_mut(), plan.entry);
        Ok(vm)
    }
}

/// The state the 64-bit boot protocol gives the kernel: long mode under
/// the identity map (CR3 is set by `start_vcpu`), CS = `__BOOT_CS`, the
/// data segments `__BOOT_DS`, interrupts off, RSI = the zero page.
fn enter_linux_state(state: &mut machine::cpu::state::CpuState, entry: u64) {
    state.gdtr = DescriptorTable {
        base: boot::GDT_GPA,
        limit: (LINUX_GDT.len() * 8 - 1) as u16,
    };
    boot::load_flat_segments(state, (BOOT_CS, seg_attr::CODE64_KERNEL), BOOT_DS);
    state.rflags = rflags::FIXED1;
    state.rip = entry;
    state.gpr[Gpr::Rsi as usize] = BOOT_PARAMS_GPA;
    state.gpr[Gpr::Rdi as usize] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;
    use bzimage::tests::fake_bzimage;

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn the_zero_page_carries_header_cmdline_initrd_rsdp_and_e820() {
        let image = fake_bzimage(0x1000);
        let plan = plan(&image, "console=ttyS0", 0x12345, 256 << 20).unwrap();
        assert_eq!(plan.load, 0x100_0000);
        assert_eq!(plan.entry, 0x100_0200);
        assert_eq!(plan.initrd, ((256 << 20) - 0x12345) & !0xfff);
        let zp = &plan.zero_page;
        assert_eq!(&zp[0x202..0x206], b"HdrS");
        assert_eq!(zp[offset::TYPE_OF_LOADER], 0xff);
        assert_eq!(u32_at(zp, offset::CMD_LINE_PTR), CMDLINE_GPA as u32);
        assert_eq!(u32_at(zp, offset::RAMDISK_IMAGE), plan.initrd as u32);
        assert_eq!(u32_at(zp, offset::RAMDISK_SIZE), 0x12345);
        assert_eq!(
            u64::from(u32_at(zp, zero_page::ACPI_RSDP_ADDR)),
            crate::devices::acpi::ACPI_BASE
        );
        assert_eq!(zp[zero_page::E820_ENTRIES], 4);
        // RAM below 1 MiB, then the rest above it.
        assert_eq!(u32_at(zp, zero_page::E820_TABLE + 16), e820::RAM);
        let last = zero_page::E820_TABLE + 60;
        assert_eq!(u32_at(zp, last), 0x10_0000);
        assert_eq!(u32_at(zp, last + 8), (256 << 20) - 0x10_0000);
        assert_eq!(u32_at(zp, last + 16), e820::RAM);
        // Nothing past the header but what the loader sets.
        assert!(zp[0x290..zero_page::E820_TABLE].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_kernel_or_initrd_that_does_not_fit_is_refused() {
        let image = fake_bzimage(0x1000);
        // 16 MiB + init_size (4 MiB) does not fit in 16 MiB of RAM.
        assert!(matches!(
            plan(&image, "", 0, 16 << 20).unwrap_err(),
            LinuxBootError::NoRoomForKernel { .. }
        ));
        // The initrd would overlap the kernel's init_size (16..20 MiB):
        // 12 MiB at the top of 32 MiB starts at 20 MiB and just fits, 13
        // do not.
        plan(&image, "", 12 << 20, 32 << 20).unwrap();
        assert!(matches!(
            plan(&image, "", 13 << 20, 32 << 20).unwrap_err(),
            LinuxBootError::NoRoomForKernel { .. }
        ));
        assert!(matches!(
            plan(&image, "", 64 << 20, 32 << 20).unwrap_err(),
            LinuxBootError::InitrdTooBig { .. }
        ));
        let long = "x".repeat(0x800);
        assert_eq!(
            plan(&image, &long, 0, 64 << 20).unwrap_err(),
            LinuxBootError::CmdlineTooLong {
                len: 0x800,
                max: 0x7ff
            }
        );
        assert_eq!(
            plan(&image, "a\0b", 0, 64 << 20).unwrap_err(),
            LinuxBootError::CmdlineNul
        );
        plan(&image, "", 4 << 20, 32 << 20).unwrap();
    }

    #[test]
    fn the_e820_map_covers_ram_and_leaves_the_bios_hole() {
        let map = e820_map(64 << 20);
        let ram: u64 = map.iter().filter(|e| e.2 == e820::RAM).map(|e| e.1).sum();
        assert_eq!(ram, (64 << 20) - 0x10_0000 + LOW_RAM_END);
        for w in map.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0);
        }
    }

    #[test]
    fn ram_beyond_the_pci_hole_is_listed_from_4_gib_and_the_initrd_stays_below() {
        let mem = 6u64 << 30;
        let map = e820_map(mem);
        let ram: Vec<(u64, u64)> = map
            .iter()
            .filter(|e| e.2 == e820::RAM)
            .map(|e| (e.0, e.0 + e.1))
            .collect();
        assert_eq!(ram[1], (0x10_0000, crate::vm::PCI_HOLE_START));
        assert_eq!(
            ram[2],
            (1 << 32, (1 << 32) + mem - crate::vm::PCI_HOLE_START)
        );
        let total: u64 = ram.iter().map(|r| r.1 - r.0).sum();
        assert_eq!(total, mem - 0x10_0000 + LOW_RAM_END);
        let image = fake_bzimage(0x1000);
        let p = plan(&image, "", 4 << 20, mem).unwrap();
        assert!(p.initrd + (4 << 20) <= crate::vm::PCI_HOLE_START);
    }
}
