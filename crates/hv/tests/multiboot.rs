//! Multiboot v1 boot: the state a multiboot kernel starts in (the run
//! itself needs the machine's 32-bit protected mode).

use hv::{CreateError, Gpa, MmuMode, Vm, VmConfig};

const HEADER_MAGIC: u32 = 0x1bad_b002;
const AOUT: u32 = 1 << 16;

/// A flat binary loaded at 1 MiB by the a.out kludge: the header, then
/// `code` at 0x100020, with bss up to `bss_end` (0: none).
fn aout_image(code: &[u8], bss_end: u32) -> Vec<u8> {
    aout_image_at(0x10_0000, code, bss_end)
}

/// [`aout_image`] loaded at `load` (the code at `load + 0x20`).
fn aout_image_at(load: u32, code: &[u8], bss_end: u32) -> Vec<u8> {
    let flags = AOUT | 3;
    let checksum = 0u32.wrapping_sub(HEADER_MAGIC).wrapping_sub(flags);
    let words = [
        HEADER_MAGIC,
        flags,
        checksum,
        load,        // header_addr
        load,        // load_addr
        0,           // load_end_addr: the whole file
        bss_end,     // bss_end_addr
        load + 0x20, // entry_addr
    ];
    let mut image: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    image.extend(code);
    image
}

/// `cli; hlt` at 0x100020, bss to 0x102000.
fn aout_kernel() -> Vec<u8> {
    aout_image(&[0xfa, 0xf4], 0x10_2000)
}

fn config() -> VmConfig {
    VmConfig {
        vcpus: 2,
        mem_size: 16 << 20,
        cmdline: "hello=1".to_string(),
        modules: vec![(b"module one".to_vec(), "one arg".to_string())],
        ..VmConfig::default()
    }
}

#[test]
fn the_kernel_starts_in_32_bit_protected_mode_with_the_info_in_ebx() {
    let mut vm = Vm::boot(&config(), &aout_kernel()).expect("boot");
    let state = vm.vcpus()[0].cpu().state().clone();
    assert_eq!(state.rip, 0x10_0020);
    assert_eq!(state.gpr[0], 0x2bad_b002, "EAX");
    assert_eq!(state.gpr[3], 0x9000, "EBX");
    assert_eq!(state.cr0 & 0x8000_0001, 1, "PE, paging off");
    assert_eq!(state.efer, 0);
    assert_eq!(state.cs.limit, u32::MAX);
    assert_ne!(state.cs.attr & (1 << 14), 0, "32-bit code segment");
    assert_eq!(state.rflags & (1 << 9), 0, "interrupts off");
    let mut code = [0u8; 2];
    vm.read_guest(Gpa(0x10_0020), &mut code).unwrap();
    assert_eq!(code, [0xfa, 0xf4]);
    // The information structure: flags, the module after the kernel's
    // bss, its bytes and command line.
    let mut info = [0u8; 88];
    vm.read_guest(Gpa(0x9000), &mut info).unwrap();
    let at = |o: usize| u32::from_le_bytes(info[o..o + 4].try_into().unwrap());
    assert_eq!(at(0) & 0b1001, 0b1001, "memory and modules");
    assert_eq!(at(20), 1);
    let mut entry = [0u8; 16];
    vm.read_guest(Gpa(u64::from(at(24))), &mut entry).unwrap();
    let start = u32::from_le_bytes(entry[..4].try_into().unwrap());
    assert_eq!(start, 0x10_2000);
    let mut module = [0u8; 10];
    vm.read_guest(Gpa(u64::from(start)), &mut module).unwrap();
    assert_eq!(&module, b"module one");
    // The ACPI tables are there too.
    let mut rsdp = [0u8; 8];
    vm.read_guest(Gpa(0xe_0000), &mut rsdp).unwrap();
    assert_eq!(&rsdp, b"RSD PTR ");
}

#[test]
fn malformed_multiboot_images_are_refused_cleanly() {
    let mut bad = aout_kernel();
    bad[8] ^= 0xff;
    let err = Vm::boot(&config(), &bad).unwrap_err();
    assert!(matches!(err, CreateError::Multiboot(_)), "{err}");
    assert!(err.to_string().contains("checksum"), "{err}");
    let too_big = VmConfig {
        modules: vec![(vec![0; 16 << 20], String::new())],
        ..config()
    };
    let err = Vm::boot(&too_big, &aout_kernel()).unwrap_err();
    assert!(err.to_string().contains("modules do not fit"), "{err}");
}

/// A flat 32-bit multiboot kernel (a.out kludge at 1 MiB): checks EAX,
/// prints `MB` and the low byte of the info flags to COM1, reads the CPU
/// count from fw_cfg and prints it as a digit, then powers off.
fn running_kernel() -> Vec<u8> {
    #[rustfmt::skip]
    let code = [
        0x3d, 0x02, 0xb0, 0xad, 0x2b,   // cmp eax, 0x2badb002
        0x75, 0x27,                     // jne fail
        0x66, 0xba, 0xf8, 0x03,         // mov dx, 0x3f8
        0xb0, b'M', 0xee,               // mov al, 'M'; out dx, al
        0xb0, b'B', 0xee,               // mov al, 'B'; out dx, al
        0x8a, 0x03,                     // mov al, [ebx]  (info flags, low byte)
        0xee,                           // out dx, al
        0x66, 0xba, 0x10, 0x05,         // mov dx, 0x510
        0x66, 0xb8, 0x05, 0x00,         // mov ax, 5 (FW_CFG_NB_CPUS)
        0x66, 0xef,                     // out dx, ax
        0x42,                           // inc edx (0x511)
        0xec,                           // in al, dx
        0x04, b'0',                     // add al, '0'
        0x66, 0xba, 0xf8, 0x03,         // mov dx, 0x3f8
        0xee,                           // out dx, al
        0x66, 0xba, 0x00, 0x06,         // mov dx, 0x600
        0xb0, 0x34,                     // mov al, SLP_TYP 5 | SLP_EN
        0xee,                           // out dx, al
        0xf4,                           // fail: hlt
    ];
    aout_image(&code, 0)
}

/// `code` booted at 0x100020 on one vCPU with 16 MiB under `mmu`, run to
/// its `out 0xf4` of 1.
fn run_to_debug_exit_3(mmu: MmuMode, code: &[u8]) -> Vm {
    let mut vm = one_vcpu_vm(mmu, &aout_image(code, 0x10_2000));
    let reason = vm.run();
    assert_eq!(reason, hv::StopReason::DebugExit { status: 3 }, "{mmu:?}");
    vm
}

/// `image` booted on one vCPU with 16 MiB under `mmu`.
fn one_vcpu_vm(mmu: MmuMode, image: &[u8]) -> Vm {
    let config = VmConfig {
        vcpus: 1,
        mem_size: 16 << 20,
        mmu,
        ..VmConfig::default()
    };
    Vm::boot(&config, image).expect("boot")
}

/// Both MMUs: under shadow paging the kernel starts on the paging-off
/// root (gva = gpa), as an AP after INIT/SIPI does.
const MMUS: [MmuMode; 2] = [MmuMode::Ept, MmuMode::Shadow];

#[test]
fn a_multiboot_kernel_runs_in_32_bit_mode_and_powers_off() {
    for mmu in MMUS {
        let config = VmConfig {
            vcpus: 3,
            mmu,
            ..config()
        };
        let mut vm = Vm::boot(&config, &running_kernel()).expect("boot");
        let reason = vm.run();
        let out = vm.take_serial();
        assert_eq!(reason, hv::StopReason::PowerOff, "{mmu:?} {out:?}");
        assert_eq!(out, [b'M', b'B', 0x4d, b'3'], "{mmu:?}");
    }
}

/// The acceptance kernel of issue 14 (`guests/mboot/`): a multiboot ELF
/// that starts in 32-bit protected mode, enters long mode, starts the APs
/// through INIT/SIPI and a real-mode trampoline using the xAPIC by MMIO,
/// moves every CPU to x2APIC mode and IPIs each AP through it, reads the
/// CPU count from fw_cfg, takes COM1's input interrupt and powers off
/// through the FADT.
const MBOOT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mboot.elf"));

fn mboot_values(out: &str) -> std::collections::BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn the_acceptance_kernel_brings_up_four_cpus_and_powers_off() {
    for mmu in MMUS {
        acceptance_kernel_on(mmu);
    }
}

fn acceptance_kernel_on(mmu: MmuMode) {
    let config = VmConfig {
        vcpus: 4,
        mem_size: 16 << 20,
        cmdline: "console=ttyS0 quiet".to_string(),
        console_input: b"ping\n".to_vec(),
        mmu,
        ..VmConfig::default()
    };
    let mut vm = Vm::boot(&config, MBOOT).expect("boot");
    let reason = vm.run();
    let out = String::from_utf8_lossy(&vm.take_serial()).into_owned();
    assert_eq!(reason, hv::StopReason::PowerOff, "{mmu:?} {out}");
    let v = mboot_values(&out);
    let hex = |k: &str| {
        let s = v.get(k).unwrap_or_else(|| panic!("no {k} in {out}"));
        u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap()
    };
    assert_eq!(v["cmdline"], "console=ttyS0 quiet");
    assert_eq!(hex("acpi_cpus"), 4);
    assert_eq!(hex("fw_cfg_cpus"), 4);
    assert_eq!(hex("bsp_xapic_id"), 0);
    assert_eq!(hex("aps_started"), 3);
    assert_eq!(hex("bsp_x2apic_id"), 0);
    assert_eq!(hex("x2apic_ipis"), 3);
    // Each AP reported its id by MMIO, then by MSR.
    for id in 1..4u64 {
        let tag = format!("{id:#018x}");
        assert_eq!(
            out.lines()
                .filter(|l| l.ends_with(&tag) && l.starts_with("ap_"))
                .count(),
            2,
            "AP {id}: {out}"
        );
    }
    assert!(hex("uart_irqs") >= 1);
    assert_eq!(v["input"], "ping");
    assert_eq!(hex("s5_type"), 5);
    assert!(!v.contains_key("fail"), "{out}");
    // Every vCPU ran; the APs started in real mode through the trampoline.
    assert!(
        vm.vcpus()
            .iter()
            .all(|c| c.cpu().state().efer & (1 << 10) != 0),
        "all in long mode"
    );
}

/// MMIO by an instruction other than a plain `mov` (the machine emulates
/// the whole instruction, `Cpu::emulate_mmio`; the hv answers its reads):
/// unassigned MMIO reads all ones and drops writes whatever the
/// instruction, and the xAPIC page takes a read-modify-write.
#[test]
fn any_instruction_reads_unassigned_mmio_as_all_ones_and_the_xapic_takes_an_or() {
    let code = [
        &[0xb8, 5, 0, 0, 0][..],                                       // mov eax, 5
        &[0x03, 0x05, 0x00, 0x00, 0x00, 0xd0],                         // add eax, [0xd0000000]
        &[0xb9, 0xcd, 0xab, 0, 0],                                     // mov ecx, 0xabcd
        &[0x87, 0x0d, 0x08, 0x00, 0x00, 0xd0],                         // xchg [0xd0000008], ecx
        &[0x89, 0xc3],                                                 // mov ebx, eax
        &[0x81, 0x0d, 0xf0, 0x00, 0xe0, 0xfe, 0x00, 0x01, 0x00, 0x00], // or dword [0xfee000f0], 0x100
        &[0x8b, 0x15, 0xf0, 0x00, 0xe0, 0xfe],                         // mov edx, [0xfee000f0]
        &[0xb0, 0x01, 0xe6, 0xf4],                                     // mov al, 1; out 0xf4, al
        &[0xf4],
    ]
    .concat();
    for mmu in MMUS {
        let vm = run_to_debug_exit_3(mmu, &code);
        let s = vm.vcpus()[0].cpu().state();
        assert_eq!(s.gpr[3] & 0xffff_ffff, 4, "{mmu:?}: 5 + 0xffffffff");
        assert_eq!(s.gpr[1] & 0xffff_ffff, 0xffff_ffff, "{mmu:?}: XCHG");
        // SVR: reset 0xff, OR 0x100 (APIC enabled).
        assert_eq!(s.gpr[2] & 0x1ff, 0x1ff, "{mmu:?}: SVR");
        let stats = vm.stats();
        // ADD's read, XCHG's read and its dropped write.
        assert_eq!(stats.vcpus[0].unassigned_mmio, 3, "{mmu:?}");
    }
}

/// A multiboot kernel drives the suite's test device: a store to its I/O
/// RAM at 0xff000000 reads back, and IRQ 11 raised and lowered through
/// its IRQ-line port (a 32-bit `out` to 0x200b) in real mode, as the
/// suite's `realmode` does, reaches the CPU through the PIC (vector 0x73,
/// slave base 0x70) and LINT0 in virtual-wire mode, waking the HLT after
/// STI. The handler reports the vector through isa-debug-exit.
#[test]
fn the_test_device_irq_line_reaches_the_cpu_through_the_pic() {
    // Loaded at 64 KiB, so that real mode reaches it.
    let image = aout_image_at(0x1_0000, &pic_kernel_code(), 0);
    for mmu in MMUS {
        let mut vm = one_vcpu_vm(mmu, &image);
        let reason = vm.run();
        assert_eq!(
            reason,
            hv::StopReason::DebugExit {
                status: (0x73 << 1) | 1
            },
            "{mmu:?}"
        );
        let s = vm.vcpus()[0].cpu().state();
        assert_eq!(s.gpr[3] & 0xffff_ffff, 0x1234_5678, "{mmu:?}: I/O RAM");
        assert_eq!(vm.stats().vcpus[0].unassigned_mmio, 0, "{mmu:?}");
    }
}

/// The code of [`the_test_device_irq_line_reaches_the_cpu_through_the_pic`]
/// at 0x10020 (offsets below are from 0x10000).
#[rustfmt::skip]
fn pic_kernel_code() -> Vec<u8> {
    [
        // 32-bit protected mode.
        &[0xc7, 0x05, 0x10, 0x00, 0x00, 0xff, 0x78, 0x56, 0x34, 0x12][..], // mov dword [0xff000010], 0x12345678
        &[0x8b, 0x1d, 0x10, 0x00, 0x00, 0xff],             // mov ebx, [0xff000010]
        &[0x0f, 0x01, 0x15, 0x93, 0x00, 0x01, 0x00],       // lgdt [0x10093]
        &[0x0f, 0x01, 0x1d, 0x99, 0x00, 0x01, 0x00],       // lidt [0x10099]: the IVT
        &[0xea, 0x45, 0x00, 0x00, 0x00, 0x08, 0x00],       // jmp 0x08:0x45 (16-bit, base 0x10000)
        // 0x45: 16-bit protected mode: leave it.
        &[0x0f, 0x20, 0xc0, 0x24, 0xfe, 0x0f, 0x22, 0xc0], // mov eax, cr0; and al, 0xfe; mov cr0, eax
        &[0xea, 0x52, 0x00, 0x00, 0x10],                   // jmp 0x1000:0x52
        // 0x52: real mode.
        &[0x31, 0xc0, 0x8e, 0xd8, 0x8e, 0xd0],             // xor ax, ax; mov ds, ax; mov ss, ax
        &[0xbc, 0x00, 0x80],                               // mov sp, 0x8000
        &[0xc7, 0x06, 0xcc, 0x01, 0x7e, 0x00],             // IVT[0x73].offset = 0x7e
        &[0xc7, 0x06, 0xce, 0x01, 0x00, 0x10],             // IVT[0x73].segment = 0x1000
        &[0xba, 0x0b, 0x20],                               // mov dx, 0x200b
        &[0x66, 0xb8, 0x01, 0x00, 0x00, 0x00, 0x66, 0xef], // mov eax, 1; out dx, eax
        &[0x66, 0x31, 0xc0, 0x66, 0xef],                   // xor eax, eax; out dx, eax
        &[0xfb, 0xf4],                                     // sti; hlt
        &[0xb0, 0x01, 0xe6, 0xf4, 0xf4],                   // not woken by it: exit 3
        // 0x7e: the handler.
        &[0xb0, 0x73, 0xe6, 0xf4, 0xf4],                   // mov al, 0x73; out 0xf4, al; hlt
        // 0x83: the GDT: null, 16-bit code at base 0x10000.
        &[0; 8],
        &[0xff, 0xff, 0x00, 0x00, 0x01, 0x9a, 0x00, 0x00],
        // 0x93: its pointer; 0x99: the IVT's.
        &[0x0f, 0x00, 0x83, 0x00, 0x01, 0x00],
        &[0xff, 0x03, 0x00, 0x00, 0x00, 0x00],
    ]
    .concat()
}

/// With 4 GiB of RAM the layout is a PC's: RAM up to the PCI hole at
/// 0xc0000000 and the rest from 4 GiB, in the multiboot memory map too.
/// The kernel enters IA-32e compatibility mode (tables the test writes)
/// with 0x40000000 mapped to 4 GiB and the xAPIC page identity-mapped: a store to high RAM reads
/// back, and the xAPIC version register answers (before, RAM ran straight
/// through 0xfee00000 and ended at 4 GiB).
#[test]
fn with_4_gib_ram_skips_the_pci_hole_and_the_xapic_answers() {
    const GIB: u64 = 1 << 30;
    #[rustfmt::skip]
    let code = [
        &[0xb9, 0x80, 0x00, 0x00, 0xc0][..],                         // mov ecx, EFER
        &[0x0f, 0x32, 0x0d, 0x00, 0x01, 0x00, 0x00, 0x0f, 0x30],     // rdmsr; or eax, LME; wrmsr
        &[0xb8, 0x00, 0x00, 0x20, 0x00],                             // mov eax, 0x200000
        &[0x0f, 0x22, 0xd8],                                         // mov cr3, eax
        &[0x0f, 0x20, 0xe0, 0x83, 0xc8, 0x20, 0x0f, 0x22, 0xe0],     // cr4 |= PAE
        &[0x0f, 0x20, 0xc0, 0x0d, 0x00, 0x00, 0x00, 0x80],           // mov eax, cr0; or eax, PG
        &[0x0f, 0x22, 0xc0],                                         // mov cr0, eax
        &[0xc7, 0x05, 0x10, 0x00, 0x00, 0x40, 0xa5, 0xa5, 0x5a, 0x5a], // mov dword [0x40000010], 0x5a5aa5a5
        &[0x8b, 0x1d, 0x10, 0x00, 0x00, 0x40],                       // mov ebx, [0x40000010]
        &[0x8b, 0x35, 0x30, 0x00, 0xe0, 0xfe],                       // mov esi, [0xfee00030]
        &[0xb0, 0x01, 0xe6, 0xf4, 0xf4],                             // mov al, 1; out 0xf4, al; hlt
    ]
    .concat();
    let image = aout_image(&code, 0x10_2000);
    for mmu in MMUS {
        let config = VmConfig {
            vcpus: 1,
            mem_size: 4 * GIB,
            mmu,
            ..VmConfig::default()
        };
        let mut vm = Vm::boot(&config, &image).expect("boot");
        // PML4 at 0x200000; PD0 identity-maps the first 4 MiB, PD1 maps
        // 0x40000000 to 4 GiB, PD3 the xAPIC page.
        let (pml4, pdpt, pd0, pd1, pd3) =
            (0x20_0000u64, 0x20_4000, 0x20_1000, 0x20_2000, 0x20_3000);
        let mut put = |gpa: u64, v: u64| vm.write_guest(Gpa(gpa), &v.to_le_bytes()).unwrap();
        put(pml4, pdpt | 3);
        put(pdpt, pd0 | 3);
        put(pdpt + 8, pd1 | 3);
        put(pdpt + 24, pd3 | 3);
        put(pd0, 0x83);
        put(pd0 + 8, 0x20_0000 | 0x83);
        put(pd1, (4 * GIB) | 0x83);
        put(
            pd3 + 8 * ((0xfee0_0000 - 3 * GIB) >> 21),
            0xfee0_0000 | 0x83,
        );
        // The memory map of the information structure at EBX.
        let ebx = u64::from(vm.vcpus()[0].cpu().state().gpr[3] as u32);
        let mut info = [0u8; 52];
        vm.read_guest(Gpa(ebx), &mut info).unwrap();
        let word = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        assert_eq!(
            word(&info, 8),
            ((3 * GIB - (1 << 20)) / 1024) as u32,
            "mem_upper"
        );
        let mut mmap = vec![0u8; word(&info, 44) as usize];
        vm.read_guest(Gpa(u64::from(word(&info, 48))), &mut mmap)
            .unwrap();
        let ram: Vec<(u64, u64)> = mmap
            .chunks(24)
            .filter(|e| word(e, 20) == 1)
            .map(|e| {
                let base = u64::from_le_bytes(e[4..12].try_into().unwrap());
                (
                    base,
                    base + u64::from_le_bytes(e[12..20].try_into().unwrap()),
                )
            })
            .collect();
        assert_eq!(ram.last(), Some(&(4 * GIB, 5 * GIB)), "{mmu:?}: {ram:x?}");
        assert!(
            ram.iter().all(|&(s, e)| e <= 3 * GIB || s >= 4 * GIB),
            "{ram:x?}"
        );
        let reason = vm.run();
        assert_eq!(reason, hv::StopReason::DebugExit { status: 3 }, "{mmu:?}");
        let s = vm.vcpus()[0].cpu().state();
        assert_eq!(s.gpr[3] & 0xffff_ffff, 0x5a5a_a5a5, "{mmu:?}: high RAM");
        assert_eq!(
            s.gpr[6] & 0xffff_ffff,
            0x0006_0015,
            "{mmu:?}: xAPIC version"
        );
        let mut back = [0u8; 4];
        vm.read_guest(Gpa(4 * GIB + 0x10), &mut back).unwrap();
        assert_eq!(u32::from_le_bytes(back), 0x5a5a_a5a5, "{mmu:?}");
        assert_eq!(vm.stats().vcpus[0].unassigned_mmio, 0, "{mmu:?}");
    }
}

/// An instruction that reads MMIO and writes a RAM page the MMU has not
/// mapped yet (a MOVS from unassigned MMIO to untouched RAM): the RAM
/// page is faulted in and the emulation retried, under EPT (an EPT
/// violation) and under shadow paging (a #PF exit, which stopped the VM).
#[test]
fn an_mmio_instruction_that_also_writes_unmapped_ram_completes() {
    #[rustfmt::skip]
    let code = [
        &[0xbe, 0x00, 0x00, 0x00, 0xd0][..], // mov esi, 0xd0000000
        &[0xbf, 0x00, 0x00, 0x30, 0x00],     // mov edi, 0x300000
        &[0xa5],                             // movsd
        &[0x8b, 0x1d, 0x00, 0x00, 0x30, 0x00], // mov ebx, [0x300000]
        &[0xb0, 0x01, 0xe6, 0xf4, 0xf4],     // mov al, 1; out 0xf4, al; hlt
    ]
    .concat();
    for mmu in MMUS {
        let vm = run_to_debug_exit_3(mmu, &code);
        let s = vm.vcpus()[0].cpu().state();
        assert_eq!(s.gpr[3] & 0xffff_ffff, 0xffff_ffff, "{mmu:?}");
        assert_eq!(s.gpr[7] & 0xffff_ffff, 0x30_0004, "{mmu:?}: EDI");
        assert_eq!(vm.stats().vcpus[0].unassigned_mmio, 1, "{mmu:?}");
    }
}
