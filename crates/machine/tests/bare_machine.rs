//! The bare machine's own behaviour, with tiny hand-assembled programs:
//! devices, exit statuses, the errors a broken program produces, and
//! determinism.

use machine::bare::{BareConfig, BareError, BareMachine, Mode, RunOutput, PROGRAM_MIN_ADDR};
use machine::elf::ElfError;
use machine::programs;

const LOAD_ADDR: u64 = 0x20_0000;

/// A static ELF64 executable with one RX segment holding `code` at `addr`,
/// entered at its first byte.
fn tiny_elf_at(addr: u64, code: &[u8]) -> Vec<u8> {
    let mut elf = vec![0u8; 64 + 56];
    elf[..4].copy_from_slice(b"\x7fELF");
    elf[4] = 2; // 64-bit
    elf[5] = 1; // little-endian
    elf[6] = 1; // version
    elf[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    elf[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
    elf[20..24].copy_from_slice(&1u32.to_le_bytes());
    elf[24..32].copy_from_slice(&addr.to_le_bytes()); // entry
    elf[32..40].copy_from_slice(&64u64.to_le_bytes()); // phoff
    elf[52..54].copy_from_slice(&64u16.to_le_bytes());
    elf[54..56].copy_from_slice(&56u16.to_le_bytes());
    elf[56..58].copy_from_slice(&1u16.to_le_bytes());
    let ph = 64;
    elf[ph..ph + 4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    elf[ph + 4..ph + 8].copy_from_slice(&5u32.to_le_bytes()); // R X
    elf[ph + 8..ph + 16].copy_from_slice(&120u64.to_le_bytes()); // offset
    elf[ph + 16..ph + 24].copy_from_slice(&addr.to_le_bytes());
    elf[ph + 24..ph + 32].copy_from_slice(&addr.to_le_bytes());
    elf[ph + 32..ph + 40].copy_from_slice(&(code.len() as u64).to_le_bytes());
    elf[ph + 40..ph + 48].copy_from_slice(&(code.len() as u64).to_le_bytes());
    elf.extend_from_slice(code);
    elf
}

fn tiny_elf(code: &[u8]) -> Vec<u8> {
    tiny_elf_at(LOAD_ADDR, code)
}

fn run_code(code: &[u8], config: BareConfig) -> Result<RunOutput, BareError> {
    BareMachine::run_elf(config, &tiny_elf(code))
}

/// mov $5, %eax; out %eax, $0xf4
const EXIT_5: &[u8] = &[0xb8, 5, 0, 0, 0, 0xe7, 0xf4];

#[test]
fn debug_exit_status_is_value_times_two_plus_one() {
    for mode in [Mode::Bare, Mode::GuestEpt] {
        let out = run_code(
            EXIT_5,
            BareConfig {
                mode,
                ..BareConfig::default()
            },
        )
        .unwrap();
        assert_eq!(out.exit.value, 5);
        assert_eq!(out.exit.status(), 11);
        assert!(!out.exit.success());
        assert!(out.serial.is_empty());
    }
}

#[test]
fn unknown_ports_read_all_ones_and_the_uart_is_always_ready() {
    // in $0x80, %al; out %al, $0xf4
    let out = run_code(&[0xe4, 0x80, 0xe6, 0xf4], BareConfig::default()).unwrap();
    assert_eq!(out.exit.value, 0xff);
    // mov $0x3fd, %dx; in (%dx), %al; out %al, $0xf4
    let out = run_code(
        &[0x66, 0xba, 0xfd, 0x03, 0xec, 0xe6, 0xf4],
        BareConfig::default(),
    )
    .unwrap();
    assert_eq!(out.exit.value, 0x60);
}

#[test]
fn serial_bytes_reach_the_sink_in_order() {
    // mov $'o', %al; mov $0x3f8, %dx; out %al, (%dx); mov $'k', %al;
    // out %al, (%dx); xor %eax, %eax; out %al, $0xf4
    let code = [
        0xb0, b'o', 0x66, 0xba, 0xf8, 0x03, 0xee, 0xb0, b'k', 0xee, 0x31, 0xc0, 0xe6, 0xf4,
    ];
    let out = run_code(&code, BareConfig::default()).unwrap();
    assert_eq!(out.serial, b"ok");
    assert!(out.exit.success());
}

#[test]
fn a_halt_nothing_can_wake_is_an_error() {
    // cli; hlt
    match run_code(&[0xfa, 0xf4], BareConfig::default()) {
        Err(BareError::Halted {
            interrupts_enabled: false,
            rip,
        }) => assert!(
            (LOAD_ADDR + 1..=LOAD_ADDR + 2).contains(&rip),
            "rip {rip:#x}"
        ),
        other => panic!("{other:?}"),
    }
    // sti; hlt with no interrupt source, in guest mode too.
    for mode in [Mode::Bare, Mode::GuestEpt] {
        match run_code(
            &[0xfb, 0xf4],
            BareConfig {
                mode,
                ..BareConfig::default()
            },
        ) {
            Err(BareError::Halted {
                interrupts_enabled: true,
                ..
            }) => {}
            other => panic!("{mode:?}: {other:?}"),
        }
    }
}

#[test]
fn an_exception_without_an_idt_triple_faults() {
    // ud2: the IDT limit is 0, so delivery fails twice over.
    for mode in [Mode::Bare, Mode::GuestEpt] {
        match run_code(
            &[0x0f, 0x0b],
            BareConfig {
                mode,
                ..BareConfig::default()
            },
        ) {
            Err(BareError::TripleFault { .. }) => {}
            other => panic!("{mode:?}: {other:?}"),
        }
    }
}

#[test]
fn the_cycle_budget_stops_a_spinning_program() {
    // jmp .
    let config = BareConfig {
        max_cycles: Some(100_000),
        ..BareConfig::default()
    };
    match run_code(&[0xeb, 0xfe], config) {
        Err(BareError::CycleLimit {
            limit: 100_000,
            rip,
        }) => assert_eq!(rip, LOAD_ADDR),
        other => panic!("{other:?}"),
    }
}

#[test]
fn page_tables_outside_memory_are_a_machine_error() {
    // mov $0x40000000, %eax; mov %rax, %cr3; nop: the next fetch walks a
    // PML4 at 1 GiB, beyond the 64 MiB of memory.
    match run_code(
        &[0xb8, 0, 0, 0, 0x40, 0x0f, 0x22, 0xd8, 0x90],
        BareConfig::default(),
    ) {
        Err(BareError::MachineError { .. }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn programs_must_stay_out_of_machine_memory() {
    let err = BareMachine::new(BareConfig::default(), &tiny_elf_at(0x8000, EXIT_5)).unwrap_err();
    assert!(
        matches!(err, BareError::ProgramOutsideArea { start: 0x8000, .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("outside the program area"),
        "{err}"
    );
    // Loading into the page tables at the top of RAM is refused too.
    let top = BareConfig::default().mem_size - 0x1000;
    let err = BareMachine::new(BareConfig::default(), &tiny_elf_at(top, EXIT_5)).unwrap_err();
    assert!(matches!(err, BareError::ProgramOutsideArea { .. }), "{err}");
    // The lowest legal address is fine.
    assert!(BareMachine::new(
        BareConfig::default(),
        &tiny_elf_at(PROGRAM_MIN_ADDR, EXIT_5)
    )
    .is_ok());
}

#[test]
fn bad_elf_and_bad_sizes_are_reported() {
    let err = BareMachine::new(BareConfig::default(), b"not an elf").unwrap_err();
    assert!(matches!(err, BareError::Elf(ElfError::NotElf)), "{err}");
    for mem_size in [0, 0x1234, 1 << 20] {
        let err = BareMachine::new(
            BareConfig {
                mem_size,
                ..BareConfig::default()
            },
            programs::HELLO,
        )
        .unwrap_err();
        assert!(matches!(err, BareError::Config(_)), "{mem_size:#x}: {err}");
    }
}

#[test]
fn the_machine_state_at_entry() {
    let m = BareMachine::new(BareConfig::default(), programs::HELLO).unwrap();
    let s = m.cpu().state();
    assert_eq!(s.rip, m.layout().entry);
    assert_eq!(s.gpr[4], machine::bare::BOOT_STACK_TOP);
    assert_eq!(s.cr3, m.layout().page_tables.start.0);
    assert_eq!(s.tr.selector, machine::bare::TSS_SELECTOR);
    assert_eq!(s.gdtr.base, machine::bare::GDT_ADDR);
    assert_eq!(s.idtr.limit, 0);
    assert_eq!(s.cpl(), 0);
    assert!(m.layout().ept.is_none());
    assert!(m.cpu().vmx().is_none());

    let g = BareMachine::new(
        BareConfig {
            mode: Mode::GuestEpt,
            ..BareConfig::default()
        },
        programs::HELLO,
    )
    .unwrap();
    let (eptp, region) = g.layout().ept.clone().unwrap();
    // The EPT lives above guest RAM.
    assert_eq!(region.start.0, g.layout().ram_size);
    assert_eq!(g.memory().size(), region.end.0);
    assert_eq!(g.cpu().vmx().unwrap().ept, Some(eptp));
}

#[test]
fn runs_are_deterministic() {
    let a = BareMachine::run_elf(BareConfig::default(), programs::STRINGOPS).unwrap();
    let b = BareMachine::run_elf(BareConfig::default(), programs::STRINGOPS).unwrap();
    assert_eq!(a, b);
}

/// CPUID.7.0:EDX[29] enumerates IA32_ARCH_CAPABILITIES, and RDMSR 0x10a
/// reads its "not susceptible" bits (`state::arch_capabilities`): here
/// RDCL_NO | MDS_NO, what Linux reads to run without page-table
/// isolation and without VERW on each return to user mode.
#[test]
fn arch_capabilities_are_enumerated_and_say_not_susceptible() {
    // The exit value: the CPUID bit in bit 8, the MSR's bits 0 and 5.
    let code = [
        0xb8, 7, 0, 0, 0, // mov $7, %eax
        0x31, 0xc9, // xor %ecx, %ecx
        0x0f, 0xa2, // cpuid
        0xc1, 0xea, 29, // shr $29, %edx
        0x83, 0xe2, 1, // and $1, %edx
        0x89, 0xd3, // mov %edx, %ebx
        0xc1, 0xe3, 8, // shl $8, %ebx
        0xb9, 0x0a, 0x01, 0, 0, // mov $0x10a, %ecx
        0x0f, 0x32, // rdmsr
        0x83, 0xe0, 0x21, // and $0x21, %eax
        0x09, 0xd8, // or %ebx, %eax
        0xe7, 0xf4, // out %eax, $0xf4
    ];
    let out = run_code(&code, BareConfig::default()).unwrap();
    assert_eq!(out.exit.value, 0x121);
}
