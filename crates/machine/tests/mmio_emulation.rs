//! `Cpu::emulate_mmio`: any instruction that touches an MMIO page runs
//! whole on the interpreter, its reads of the page supplied by the VMM one
//! at a time, its stores handed back in order (kvm-unit-tests' `syscall`
//! and `realmode` stopped on "MMIO access ... by an instruction other
//! than a mov", and unassigned MMIO is meant to read all ones for any
//! instruction).

mod common;

use common::*;
use iced_x86::code_asm::*;
use machine::cpu::{MmioEmulation, MmioWrite};
use machine::mmu::ept::epte;
use machine::vmx::Eptp;
use machine::{Gpa, Hpa, VmExit};

const EPT_BASE: u64 = 0x0200_0000;
/// The fourth 2 MiB page: no EPT mapping (EPT), or no guest mapping
/// (shadow): MMIO.
const MMIO: u64 = 0x80_0000;

/// What the device returns for a read at `gpa`.
fn device(gpa: u64) -> u64 {
    0x1111_2222_3300_0040 | (gpa & 0x3f)
}

/// Reads and writes, in the order the device saw them.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Read(u64, u8),
    Write(MmioWrite),
}

/// Runs the rig as a VMM would: each exit on the MMIO page emulated
/// through `emulate_mmio`, to the HLT. `page_of` gives the MMIO gpa an
/// exit is about.
fn run(r: &mut Rig, page_of: impl Fn(&VmExit) -> Option<u64>) -> Vec<Seen> {
    let mut seen = Vec::new();
    loop {
        let exit = r.run();
        if exit == VmExit::Hlt {
            return seen;
        }
        let gpa = page_of(&exit).unwrap_or_else(|| panic!("unexpected exit {exit:?}"));
        emulate(r, gpa, &mut seen, None);
    }
}

/// One instruction emulated to its end at the MMIO page `gpa`, the
/// device accesses appended to `seen`; `next_page`: the (linear page,
/// MMIO page) a #PF exit of the emulation may stop at once (under shadow
/// paging). The number of attempts.
fn emulate(r: &mut Rig, gpa: u64, seen: &mut Vec<Seen>, next_page: Option<(u64, u64)>) -> u32 {
    let mut reads = Vec::new();
    let mut linear = Vec::new();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let rip = r.cpu.state().rip;
        match r.cpu.emulate_mmio_paged(&r.mem, Gpa(gpa), &reads, &linear) {
            MmioEmulation::NeedRead { gpa, size } => {
                assert_eq!(r.cpu.state().rip, rip, "nothing done before the read");
                seen.push(Seen::Read(gpa.0, size));
                reads.push(device(gpa.0));
            }
            MmioEmulation::Done { writes, exit } => {
                assert_eq!(exit, None);
                seen.extend(writes.into_iter().map(Seen::Write));
                return attempts;
            }
            MmioEmulation::Exit(VmExit::Exception {
                vector: 14,
                qualification,
                ..
            }) if next_page.is_some_and(|p| p.0 == qualification & !0xfff) && linear.is_empty() => {
                linear.extend(next_page);
            }
            MmioEmulation::Exit(e) => panic!("emulation stopped at {e:?}"),
        }
    }
}

/// ADD from MMIO, XCHG with MMIO (a read, then a write), REP MOVSB from
/// MMIO to RAM: 32-bit forms.
fn program(a: &mut CodeAssembler) {
    a.mov(eax, 5).unwrap();
    a.mov(ecx, 0xabcd).unwrap();
    a.add(eax, dword_ptr(MMIO)).unwrap();
    a.xchg(dword_ptr(MMIO + 8), ecx).unwrap();
    a.mov(rsi, MMIO + 0x10).unwrap();
    a.mov(rdi, DATA).unwrap();
    a.mov(edx, eax).unwrap();
    a.mov(ecx, 3).unwrap();
    a.rep().movsb().unwrap();
    a.mov(ecx, 0x0102_0304).unwrap();
    a.or(word_ptr(MMIO + 0x20), cx).unwrap();
    a.hlt().unwrap();
}

/// `r` in guest mode under an EPT mapping all memory with 2 MiB pages
/// but the one at MMIO.
fn ept_guest(r: Rig) -> Rig {
    let (pml4, pdpt, pd) = (EPT_BASE, EPT_BASE + 0x1000, EPT_BASE + 0x2000);
    r.mem.write_u64(Hpa(pml4), pdpt | 7).unwrap();
    r.mem.write_u64(Hpa(pdpt), pd | 7).unwrap();
    for i in 0..(MEM >> 21) {
        let perm = if i << 21 == MMIO { 0 } else { 7 };
        r.mem
            .write_u64(
                Hpa(pd + i * 8),
                (i << 21) | epte::HUGE | epte::MEMTYPE_WB | perm,
            )
            .unwrap();
    }
    r.guest(machine::VmxControls {
        ept: Some(Eptp::new(Hpa(pml4), true)),
        ..controls()
    })
}

/// The rig in guest mode without EPT, #PF intercepted: as under a shadow
/// MMU, which sees MMIO as #PF exits.
fn shadow_guest(r: Rig) -> Rig {
    r.guest(machine::VmxControls {
        exception_bitmap: 1 << 14,
        ..controls()
    })
}

/// Runs the rig as a VMM with a shadow MMU would, to the HLT: each #PF
/// exit on the linear page MMIO emulated at `device_gpa`; an emulation
/// that stops at the #PF of the next linear page is given that page as
/// `device_gpa` too (`emulate_mmio_paged`). The device accesses and the
/// number of emulation attempts.
fn run_shadow(r: &mut Rig, device_gpa: u64) -> (Vec<Seen>, u32) {
    let mut seen = Vec::new();
    let mut attempts = 0;
    loop {
        let exit = r.run();
        let la = match exit {
            VmExit::Hlt => return (seen, attempts),
            VmExit::Exception {
                vector: 14,
                qualification,
                ..
            } => qualification,
            other => panic!("unexpected exit {other:?}"),
        };
        assert_eq!(la & !0xfff, MMIO);
        attempts += emulate(r, device_gpa, &mut seen, Some((MMIO + 0x1000, device_gpa)));
    }
}

/// The MMIO gpa of an EPT violation.
fn ept_page(e: &VmExit) -> Option<u64> {
    match e {
        VmExit::EptViolation { gpa, .. } => Some(gpa.0),
        _ => None,
    }
}

fn check(r: &Rig, seen: &[Seen]) {
    let write = |gpa: u64, size: u8, value: u64| {
        Seen::Write(MmioWrite {
            gpa: Gpa(gpa),
            size,
            value,
        })
    };
    assert_eq!(
        seen,
        &[
            Seen::Read(MMIO, 4),
            Seen::Read(MMIO + 8, 4),
            write(MMIO + 8, 4, 0xabcd),
            Seen::Read(MMIO + 0x10, 1),
            Seen::Read(MMIO + 0x11, 1),
            Seen::Read(MMIO + 0x12, 1),
            Seen::Read(MMIO + 0x20, 2),
            write(MMIO + 0x20, 2, (device(MMIO + 0x20) & 0xffff) | 0x0304),
        ]
    );
    assert_eq!(r.gpr(2), (5 + device(MMIO)) & 0xffff_ffff, "ADD");
    assert_eq!(r.gpr(1), 0x0102_0304);
    let mut copy = [0u8; 3];
    r.mem.read_bytes(Hpa(DATA), &mut copy).unwrap();
    assert_eq!(copy, [0x50, 0x51, 0x52], "REP MOVSB");
    assert_eq!(r.gpr(6), MMIO + 0x13);
    let zf = 1 << 6;
    assert_eq!(r.cpu.state().rflags & zf, 0, "OR's flags");
}

#[test]
fn any_instruction_on_an_ept_mmio_page_is_emulated_with_the_vmm_s_reads() {
    for engine in [machine::Engine::Interp, machine::Engine::Jit] {
        let mut r = ept_guest(rig(program).with_engine(engine));
        let seen = run(&mut r, ept_page);
        check(&r, &seen);
    }
}

/// Under shadow paging the VMM's tables never map the MMIO page: the
/// access exits as a #PF, and the page is the faulting linear page's.
#[test]
fn under_shadow_paging_the_faulting_linear_page_is_the_mmio_page() {
    const DEVICE_GPA: u64 = 0xfec0_0000;
    let r = rig(program);
    // The linear page MMIO is not mapped (as a shadow MMU leaves it).
    r.mem.write_u64(Hpa(PD + (MMIO >> 21) * 8), 0).unwrap();
    let mut r = shadow_guest(r);
    let (seen, _) = run_shadow(&mut r, DEVICE_GPA);
    let at_mmio = |gpa: u64| gpa - DEVICE_GPA + MMIO;
    let seen: Vec<Seen> = seen
        .into_iter()
        .map(|x| match x {
            Seen::Read(gpa, size) => Seen::Read(at_mmio(gpa), size),
            Seen::Write(w) => Seen::Write(MmioWrite {
                gpa: Gpa(at_mmio(w.gpa.0)),
                ..w
            }),
        })
        .collect();
    check(&r, &seen);
}

/// Under EPT, a plain `mov` whose operand crosses from one linear page to
/// the next is not described as one access (`mmio_access` is `None`): run
/// through `emulate_mmio` each byte reaches the device at its own page's
/// address. Here both linear pages map the same MMIO page, as in
/// kvm-unit-tests' `emulator` "cross-page mmio read/write", which read
/// 0x99 0x99 instead of 0x99 0x77 when the VMM took the described 2-byte
/// access at 0xfff.
#[test]
fn a_mov_crossing_two_linear_pages_reaches_the_device_per_page() {
    const PT: u64 = 0x4000;
    let r = rig(|a| {
        a.mov(ecx, 0x88aa).unwrap();
        a.mov(ax, word_ptr(MMIO + 0xfff)).unwrap();
        a.mov(word_ptr(MMIO + 0xfff), cx).unwrap();
        a.mov(dx, word_ptr(MMIO + 0xffe)).unwrap(); // within the page
        a.hlt().unwrap();
    });
    // Linear MMIO and MMIO + 0x1000 both map the MMIO page (4 KiB pages).
    r.mem.write_u64(Hpa(PD + (MMIO >> 21) * 8), PT | 7).unwrap();
    r.mem.write_u64(Hpa(PT), MMIO | 7).unwrap();
    r.mem.write_u64(Hpa(PT + 8), MMIO | 7).unwrap();
    let mut r = ept_guest(r);
    let seen = run(&mut r, ept_page);
    assert_crossing_word(&r, &seen[..4], MMIO);
    assert_eq!(seen[4..], [Seen::Read(MMIO + 0xffe, 2)]);
}

/// The device accesses of `mov ax, [0xfff]; mov [0xfff], cx` (CX =
/// 0x88aa) through two linear pages of the MMIO page at `page`, one byte
/// per page, and AX made of the two bytes read.
fn assert_crossing_word(r: &Rig, seen: &[Seen], page: u64) {
    let write = |gpa: u64, value: u64| {
        Seen::Write(MmioWrite {
            gpa: Gpa(gpa),
            size: 1,
            value,
        })
    };
    assert_eq!(
        seen,
        [
            Seen::Read(page + 0xfff, 1),
            Seen::Read(page, 1),
            write(page + 0xfff, 0xaa),
            write(page, 0x88),
        ]
    );
    let byte = |gpa: u64| device(gpa) & 0xff;
    assert_eq!(r.gpr(0) & 0xffff, byte(page + 0xfff) | byte(page) << 8);
}

/// `mmio_access` describes a plain `mov` within one page and not one that
/// crosses into the next page (under EPT).
#[test]
fn only_a_mov_within_one_page_is_described_as_one_access() {
    for (offset, describes) in [(0xffe_u64, true), (0xfff, false)] {
        let r = rig(|a| {
            a.mov(ax, word_ptr(MMIO + offset)).unwrap();
            a.hlt().unwrap();
        });
        let mut r = ept_guest(r);
        assert!(matches!(r.run(), VmExit::EptViolation { .. }));
        assert_eq!(r.cpu.mmio_access().is_some(), describes, "at +{offset:#x}");
    }
}

/// Under shadow paging a `mov` crossing from one linear page of MMIO into
/// the next: the VMM's tables map neither, the first attempt stops at the
/// #PF of the second page (`MmioEmulation::Exit`), and the VMM, having
/// found that page to map MMIO too, gives it to the next attempt
/// (`emulate_mmio_paged`): each byte reaches the device at its own page's
/// address, as under EPT (kvm-unit-tests' `emulator` "cross-page mmio"
/// under `--mmu shadow`, which saw the 2-byte access at 0xfff).
#[test]
fn under_shadow_paging_a_crossing_mov_reaches_both_linear_pages() {
    const DEVICE_GPA: u64 = 0xff00_0000;
    const PT: u64 = 0x4000;
    let r = rig(|a| {
        a.mov(ecx, 0x88aa).unwrap();
        a.mov(ax, word_ptr(MMIO + 0xfff)).unwrap();
        a.mov(word_ptr(MMIO + 0xfff), cx).unwrap();
        a.hlt().unwrap();
    });
    // 4 KiB pages, MMIO and MMIO + 0x1000 not present (a shadow MMU never
    // maps MMIO).
    r.mem.write_u64(Hpa(PD + (MMIO >> 21) * 8), PT | 7).unwrap();
    let mut r = shadow_guest(r);
    let (seen, attempts) = run_shadow(&mut r, DEVICE_GPA);
    assert_crossing_word(&r, &seen, DEVICE_GPA);
    assert!(attempts >= 6, "{attempts}");
}
