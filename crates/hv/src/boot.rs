//! Loading the kernel ELF and building the boot state of `abi`.
//!
//! Guest-physical layout of the boot structures (all in the reserved low
//! megabyte, which the memory map marks [`abi::MEM_RESERVED`]):
//!
//! | gpa | contents |
//! |-----|----------|
//! | 0x1000 | GDT: null, 64-bit kernel code at 0x08, data at 0x10 |
//! | 0x2000 | [`abi::BootInfo`] |
//! | 0x3000 | PML4 |
//! | 0x4000 | PDPT |
//! | 0x5000.. | one page directory per GiB of RAM (2 MiB pages) |
//! | 0x70000..0x80000 | boot stack of the bootstrap vCPU |
//! | 0xe0000.. | ACPI tables, the RSDP first (`devices::acpi`) |

use crate::memslot::PageState;
use crate::multiboot;
use crate::pager::PageRef;
use crate::vcpu::VcpuId;
use crate::vm::CreateError;
use crate::vm::{Vm, VmConfig};
use machine::addr::PAGE_SIZE;
use machine::elf::{self, ElfImage};
use machine::Gpa;

pub use crate::image::{
    identity_map_entries, KernelError, KernelImage, BOOT_INFO_GPA, BOOT_STACK_TOP, GDT, GDT_GPA,
    LOW_RESERVED_END, MAX_GUEST_MEM,
};

pub(crate) const PAGE: u64 = PAGE_SIZE;

/// Parses `bytes` with [`machine::elf::parse`] and checks what the boot
/// layout needs beyond a valid executable: every non-empty segment inside
/// guest RAM `[LOW_RESERVED_END, mem_size)` (physical addresses), and the
/// entry point inside an executable segment's physical range, because the
/// bootstrap vCPU starts under an identity map.
pub fn parse_kernel(
    bytes: &[u8],
    mem_size: u64,
) -> Result<(ElfImage<'_>, KernelImage), KernelError> {
    let image = elf::parse(bytes)?;
    // Empty segments load nothing: they need no RAM and do not widen the
    // kernel range.
    let loaded = || image.segments.iter().filter(|s| s.memsz != 0);
    for seg in loaded() {
        if seg.paddr < LOW_RESERVED_END || seg.paddr_end() > mem_size {
            return Err(KernelError::OutOfRam {
                index: seg.index,
                start: seg.paddr,
                end: seg.paddr_end(),
                low: LOW_RESERVED_END,
                mem: mem_size,
            });
        }
    }
    let entry = image.entry;
    if !loaded().any(|s| s.flags.execute && s.paddr <= entry && entry < s.paddr_end()) {
        return Err(KernelError::EntryNotLoaded(entry));
    }
    // `parse` accepts an image only if the entry lies in a non-empty
    // segment, so `loaded()` is not empty here.
    let start = loaded().map(|s| s.paddr).min().unwrap_or(0) & !(PAGE - 1);
    // Cannot overflow: every end is at most `mem_size`, itself page-aligned
    // far below 2^64.
    let end = loaded()
        .map(|s| s.paddr_end())
        .max()
        .unwrap_or(0)
        .div_ceil(PAGE)
        * PAGE;
    Ok((image, KernelImage { entry, start, end }))
}

/// Builds a VM booted per `abi`: the kernel loaded, boot page tables, GDT,
/// BootInfo and stack built, the bootstrap vCPU ready at the entry point.
pub(crate) fn boot(config: &VmConfig, kernel: &[u8]) -> Result<Vm, CreateError> {
    if config.cmdline.len() >= abi::CMDLINE_LEN {
        return Err(CreateError::CmdlineTooLong(config.cmdline.len()));
    }
    if config.mem_size > crate::vm::PCI_HOLE_START {
        return Err(CreateError::RamBeyondHole(config.mem_size));
    }
    let (elf, image) = parse_kernel(kernel, config.mem_size)?;
    let mut vm = Vm::new(config)?;
    load_kernel(&mut vm, &elf)?;
    let gdt: Vec<u8> = GDT.iter().flat_map(|d| d.to_le_bytes()).collect();
    vm.write_guest(Gpa(GDT_GPA), &gdt)?;
    write_acpi_tables(&mut vm, config.vcpus)?;
    for (gpa, entry) in identity_map_entries(config.mem_size) {
        vm.write_guest(Gpa(gpa), &entry.to_le_bytes())?;
    }
    let mut info = abi::BootInfo {
        num_cpus: config.vcpus,
        mem_size: config.mem_size,
        tsc_hz: machine::cost::CYCLES_PER_SECOND,
        kernel_start: image.start,
        kernel_end: image.end,
        ..abi::BootInfo::default()
    };
    let map = memory_map(config.mem_size, image.start, image.end);
    info.num_regions = map.len() as u32;
    info.regions[..map.len()].copy_from_slice(&map);
    for (i, id) in info
        .apic_ids
        .iter_mut()
        .take(config.vcpus as usize)
        .enumerate()
    {
        *id = i as u32;
    }
    info.cmdline[..config.cmdline.len()].copy_from_slice(config.cmdline.as_bytes());
    vm.write_guest(Gpa(BOOT_INFO_GPA), info.as_bytes())?;
    let entry = image.entry;
    vm.kernel = Some(image);
    vm.start_vcpu(VcpuId(0), entry, BOOT_STACK_TOP, BOOT_INFO_GPA);
    Ok(vm)
}

/// Builds a VM booted the multiboot v1 way (`crate::multiboot`): the
/// kernel and modules loaded, the ACPI tables and the information
/// structure written, the bootstrap vCPU in 32-bit protected mode at the
/// entry point with EAX = the boot loader magic and EBX = the structure.
pub(crate) fn boot_multiboot(
    config: &VmConfig,
    kernel: &[u8],
    header: &multiboot::Header,
) -> Result<Vm, CreateError> {
    let plan = multiboot::plan_kernel(kernel, header, config.mem_size)?;
    let lens: Vec<(u64, String)> = config
        .modules
        .iter()
        .map(|(bytes, cmdline)| (bytes.len() as u64, cmdline.clone()))
        .collect();
    let modules = multiboot::place_modules(plan.end, &lens, config.mem_size)?;
    let info_gpa = multiboot::info_gpa(&plan, &modules);
    let info = multiboot::build_info(config.mem_size, &config.cmdline, &modules, info_gpa)?;
    let mut vm = Vm::new(config)?;
    for chunk in &plan.chunks {
        let data = &kernel[chunk.file.clone()];
        vm.write_guest(Gpa(chunk.paddr), data)?;
        // The zero tail (.bss) reads as zero until touched; only a page
        // the file bytes share needs its tail cleared, and a fresh page
        // is zero already.
    }
    for (placed, (bytes, _)) in modules.iter().zip(&config.modules) {
        vm.write_guest(Gpa(placed.start), bytes)?;
    }
    // The suite's test device, the PIC, the RTC and the PM1 registers
    // (the ACPI tables describe the last two).
    vm.shared
        .platform
        .attach_test_devices(config.wall_clock_at_boot_ns);
    write_acpi_tables(&mut vm, config.vcpus)?;
    vm.write_guest(Gpa(info_gpa), &info)?;
    vm.kernel = Some(KernelImage {
        entry: plan.entry,
        start: plan.start & !(PAGE - 1),
        end: plan.end.div_ceil(PAGE) * PAGE,
    });
    // As QEMU hands a multiboot kernel over: every local APIC as after
    // RESET, in xAPIC mode (faultline's own kernel and Linux are handed
    // theirs in x2APIC mode).
    for vcpu in &mut vm.vcpus {
        let id = vcpu.cpu.apic().id();
        *vcpu.cpu.apic_mut() = machine::apic::Lapic::at_reset(id);
    }
    // The PIC, which the bootstrap processor's APIC passes on in
    // virtual-wire mode, as a PC BIOS leaves it (`devices::pic`).
    vm.vcpus[0].cpu.apic_mut().enter_virtual_wire_mode();
    vm.start_vcpu(VcpuId(0), plan.entry, 0, 0);
    enter_multiboot_state(vm.vcpus[0].cpu.state_mut(), plan.entry, info_gpa);
    if config.mmu == crate::mmu::MmuMode::Shadow {
        // Paging off under shadow paging: the guest sees its CR0/CR4
        // through the read shadows and runs on the gva = gpa root, as an
        // AP after INIT/SIPI does.
        vm.vcpus[0].reset_shadow_paging();
    }
    Ok(vm)
}

/// The machine state the multiboot spec gives the kernel: 32-bit
/// protected mode (CR0.PE, paging off, EFER clear), flat 4 GiB code and
/// data segments, interrupts off, EAX the magic, EBX the information
/// structure. (GDTR still points at the boot GDT: the spec leaves it
/// undefined, the kernel loads its own.)
fn enter_multiboot_state(state: &mut machine::cpu::state::CpuState, entry: u64, info_gpa: u64) {
    use machine::cpu::state::{seg_attr, Gpr};
    const CR0_PE_ET: u64 = 0x11;
    let code32 = seg_attr::TYPE_CODE_RX_ACCESSED
        | seg_attr::S
        | seg_attr::PRESENT
        | seg_attr::DB
        | seg_attr::GRANULARITY;
    state.cr0 = CR0_PE_ET;
    state.cr3 = 0;
    state.cr4 = 0;
    state.efer = 0;
    state.rflags = 0x2;
    load_flat_segments(state, (0x08, code32), 0x10);
    state.rip = entry;
    state.gpr = [0; 16];
    state.gpr[Gpr::Rax as usize] = u64::from(multiboot::BOOTLOADER_MAGIC);
    state.gpr[Gpr::Rbx as usize] = info_gpa;
}

/// (The flat segments a boot protocol hands over: also firmware's resume
/// path, `vm::sleep`.)
pub(crate) use crate::vm::load_flat_segments;

/// Writes the ACPI tables at their place in the reserved low megabyte
/// (`devices::acpi`).
pub(crate) fn write_acpi_tables(vm: &mut Vm, vcpus: u32) -> Result<(), CreateError> {
    let set = crate::devices::acpi::TableSet {
        intel_iommu: vm.shared.platform.has_intel_iommu(),
        legacy_pm: vm.shared.platform.legacy_pm(),
    };
    let tables = crate::devices::acpi::build_tables(vcpus, set);
    vm.write_guest(Gpa(crate::devices::acpi::ACPI_BASE), &tables)?;
    Ok(())
}

/// Copies the kernel's segments into guest RAM (zero-filling .bss).
fn load_kernel(vm: &mut Vm, elf: &ElfImage<'_>) -> Result<(), CreateError> {
    let shared = &mut vm.shared;
    // `load_into` only translates, it cannot allocate: back every page the
    // segments cover first (demand paging would otherwise leave them
    // unbacked).
    for seg in &elf.segments {
        let mut page = seg.paddr & !(PAGE - 1);
        while page < seg.paddr_end() {
            shared.backing_frame(Gpa(page).frame())?;
            page += PAGE;
        }
    }
    let slots = &shared.host.slots;
    elf::load_into(elf, &shared.host.mem, |paddr| {
        let gfn = Gpa(paddr).frame();
        slots.lookup(gfn)?.backing(gfn).map(|f| f.addr())
    })
    .map_err(KernelError::from)?;
    // Pages wholly in a segment's zero-filled tail (.bss) need no frame:
    // an untouched page reads as zero. Keeping them would make them the
    // pager's first victims, written to swap and read back later.
    let mut dropped = std::collections::BTreeSet::new();
    for seg in &elf.segments {
        let mut page = (seg.paddr + seg.data.len() as u64).next_multiple_of(PAGE);
        while page + PAGE <= seg.paddr_end() {
            let gfn = Gpa(page).frame();
            // An identity slot's frames are guest RAM itself, never the
            // allocator's (and read as zero until written).
            if let Some(slot) = shared
                .host
                .slots
                .lookup_mut(gfn)
                .filter(|s| !s.is_identity())
            {
                if let PageState::Resident(frame) = slot.state(gfn) {
                    let page = PageRef {
                        slot: slot.id,
                        index: slot.index_of(gfn),
                    };
                    slot.set_untouched(page.index);
                    shared.host.frames.free(frame);
                    dropped.insert(page);
                }
            }
            page += PAGE;
        }
    }
    shared.pager.forget_resident(&dropped);
    vm.carry_out_cross_requests();
    Ok(())
}

/// The memory map: the low region and the kernel reserved, the rest usable.
pub fn memory_map(mem_size: u64, kernel_start: u64, kernel_end: u64) -> Vec<abi::MemRegion> {
    let region = |base: u64, end: u64, kind: u32| abi::MemRegion {
        base,
        len: end - base,
        kind,
        reserved: 0,
    };
    let mut map = vec![region(0, LOW_RESERVED_END, abi::MEM_RESERVED)];
    if kernel_start > LOW_RESERVED_END {
        map.push(region(LOW_RESERVED_END, kernel_start, abi::MEM_USABLE));
    }
    map.push(region(kernel_start, kernel_end, abi::MEM_RESERVED));
    if mem_size > kernel_end {
        map.push(region(kernel_end, mem_size, abi::MEM_USABLE));
    }
    map
}

impl Vm {
    /// A VM booted per `abi`: the kernel loaded, boot page tables, GDT,
    /// BootInfo and stack built, the bootstrap vCPU ready at the entry point
    /// (see `boot.rs`).
    ///
    /// An image with a multiboot header boots the multiboot way instead
    /// (`crate::multiboot`): 32-bit protected mode, the information
    /// structure in EBX, `config.modules` loaded after the kernel.
    pub fn boot(config: &VmConfig, kernel: &[u8]) -> Result<Vm, CreateError> {
        match crate::multiboot::find_header(kernel)? {
            Some(header) => boot_multiboot(config, kernel, &header),
            None => boot(config, kernel),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::PD_GPA;
    use machine::elf::ElfError;

    /// A one-segment executable (read + execute) whose file bytes are
    /// `code` and whose memory size is `code.len() + 100`.
    fn tiny_elf(vaddr: u64, paddr: u64, entry: u64, code: &[u8]) -> Vec<u8> {
        const PT_LOAD: u32 = 1;
        const PF_RX: u32 = 5;
        let mut f = vec![0u8; 0x78];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 2;
        f[5] = 1;
        f[6] = 1;
        f[16..18].copy_from_slice(&2u16.to_le_bytes());
        f[18..20].copy_from_slice(&62u16.to_le_bytes());
        f[20..24].copy_from_slice(&1u32.to_le_bytes());
        f[24..32].copy_from_slice(&entry.to_le_bytes());
        f[32..40].copy_from_slice(&64u64.to_le_bytes());
        f[54..56].copy_from_slice(&56u16.to_le_bytes());
        f[56..58].copy_from_slice(&1u16.to_le_bytes());
        let ph = 64;
        f[ph..ph + 4].copy_from_slice(&PT_LOAD.to_le_bytes());
        f[ph + 4..ph + 8].copy_from_slice(&PF_RX.to_le_bytes());
        f[ph + 8..ph + 16].copy_from_slice(&0x78u64.to_le_bytes());
        f[ph + 16..ph + 24].copy_from_slice(&vaddr.to_le_bytes());
        f[ph + 24..ph + 32].copy_from_slice(&paddr.to_le_bytes());
        f[ph + 32..ph + 40].copy_from_slice(&(code.len() as u64).to_le_bytes());
        f[ph + 40..ph + 48].copy_from_slice(&(code.len() as u64 + 100).to_le_bytes());
        f.extend_from_slice(code);
        f
    }

    #[test]
    fn kernel_range_is_page_aligned_around_the_segments() {
        let bytes = tiny_elf(0x20_0010, 0x20_0010, 0x20_0010, &[0xf4]);
        let (image, kernel) = parse_kernel(&bytes, 1 << 30).unwrap();
        assert_eq!(image.segments.len(), 1);
        assert_eq!(
            kernel,
            KernelImage {
                entry: 0x20_0010,
                start: 0x20_0000,
                end: 0x20_1000
            }
        );
    }

    #[test]
    fn segments_must_lie_in_guest_ram_above_the_reserved_region() {
        let low = tiny_elf(0x1000, 0x1000, 0x1000, &[0xf4]);
        assert_eq!(
            parse_kernel(&low, 1 << 30).unwrap_err(),
            KernelError::OutOfRam {
                index: 0,
                start: 0x1000,
                end: 0x1000 + 101,
                low: LOW_RESERVED_END,
                mem: 1 << 30
            }
        );
        // The .bss tail (memsz past the file bytes) must fit too.
        let high = tiny_elf(0x1f_fff0, 0x1f_fff0, 0x1f_fff0, &[0xf4]);
        let err = parse_kernel(&high, 2 << 20).unwrap_err();
        assert!(
            matches!(err, KernelError::OutOfRam { end: 0x20_0055, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("outside the guest RAM"), "{err}");
        parse_kernel(&high, 4 << 20).unwrap();
    }

    #[test]
    fn entry_must_be_loaded_at_its_identity_mapped_address() {
        // Valid for the ELF parser (entry inside the segment's virtual
        // range) but the segment is loaded elsewhere physically.
        let higher_half = tiny_elf(
            0xffff_8000_0020_0000,
            0x20_0000,
            0xffff_8000_0020_0000,
            &[0xf4],
        );
        assert_eq!(
            parse_kernel(&higher_half, 1 << 30).unwrap_err(),
            KernelError::EntryNotLoaded(0xffff_8000_0020_0000)
        );
    }

    #[test]
    fn parser_errors_pass_through_with_their_message() {
        let err = parse_kernel(b"hello", 1 << 30).unwrap_err();
        assert_eq!(err, KernelError::Elf(ElfError::NotElf));
        assert!(err.to_string().contains("not an ELF file"), "{err}");
    }

    #[test]
    fn identity_map_covers_ram_with_2m_pages() {
        let entries = identity_map_entries(3 << 29); // 1.5 GiB
        assert_eq!(entries.len(), 1 + 2 + 768);
        assert!(entries.contains(&(PD_GPA + 0x1000 + 255 * 8, ((1 << 30) + (255 << 21)) | 0x83)));
        let map = memory_map(1 << 30, 0x20_0000, 0x30_0000);
        assert_eq!(map.len(), 4);
        assert_eq!(map.iter().map(|r| r.len).sum::<u64>(), 1 << 30);
    }
}
