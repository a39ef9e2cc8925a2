//! Interpreter tests that need the CPU's insides: the code cache and the
//! run loop's bookkeeping.

use super::*;
use crate::Hpa;

const MEM: u64 = 4 << 20;
const PML4: u64 = 0x1000;

/// 4 MiB identity-mapped with two 2 MiB pages, and a CPU in the default
/// 64-bit ring-0 state using them.
fn machine() -> (PhysMemory, Cpu) {
    let mem = PhysMemory::new(MEM).unwrap();
    mem.write_u64(Hpa(PML4), 0x2000 | 0x3).unwrap();
    mem.write_u64(Hpa(0x2000), 0x3000 | 0x3).unwrap();
    mem.write_u64(Hpa(0x3000), 0x83).unwrap();
    mem.write_u64(Hpa(0x3008), (1 << 21) | 0x83).unwrap();
    let mut cpu = Cpu::new(CpuConfig::default());
    let s = cpu.state_mut();
    s.cr3 = PML4;
    s.gpr[Gpr::Rsp as usize] = 0x3f_f000;
    (mem, cpu)
}

/// Runs from `rip` to a HLT (interrupts are off, so HLT stops `run`).
fn run_from(cpu: &mut Cpu, mem: &PhysMemory, rip: u64) {
    let s = cpu.state_mut();
    s.rip = rip;
    s.activity = Activity::Active;
    let limit = cpu.cycles() + 1_000_000;
    assert_eq!(cpu.run(mem, limit), VmExit::Hlt);
}

#[test]
fn page_crossing_instruction_is_cached_and_revalidated() {
    let (mem, mut cpu) = machine();
    // mov eax, 0x44332211 at 0x10ffd: opcode and two immediate bytes on
    // the first page, two immediate bytes on the second; then HLT.
    let at = 0x10ffd;
    mem.write_bytes(Hpa(at), &[0xb8, 0x11, 0x22, 0x33, 0x44, 0xf4])
        .unwrap();
    run_from(&mut cpu, &mem, at);
    assert_eq!(cpu.state().gpr[0], 0x4433_2211);
    let decoded = cpu.stats().blocks_decoded;
    run_from(&mut cpu, &mem, at);
    assert_eq!(cpu.state().gpr[0], 0x4433_2211);
    assert_eq!(
        cpu.stats().blocks_decoded,
        decoded,
        "the crossing instruction came from the cache"
    );
    // A new byte on the second page, then on the first: each is seen.
    mem.write_bytes(Hpa(0x11001), &[0x55]).unwrap();
    run_from(&mut cpu, &mem, at);
    assert_eq!(cpu.state().gpr[0], 0x5533_2211);
    mem.write_bytes(Hpa(0x10ffe), &[0x66]).unwrap();
    run_from(&mut cpu, &mem, at);
    assert_eq!(cpu.state().gpr[0], 0x5533_2266);
    // A different instruction: `add eax, 0x01020304` (05 imm32) is as long.
    mem.write_bytes(Hpa(at), &[0x05, 0x04, 0x03, 0x02, 0x01])
        .unwrap();
    run_from(&mut cpu, &mem, at);
    assert_eq!(cpu.state().gpr[0], 0x5533_2266 + 0x0102_0304);
}

#[test]
fn shift_by_a_masked_zero_count_keeps_pending_flags_and_zero_extends() {
    let (mem, mut cpu) = machine();
    let at = 0x10000;
    // cmp eax, ebx; mov cl, 32; shl edx, cl; jb +1; hlt; hlt
    mem.write_bytes(
        Hpa(at),
        &[0x39, 0xd8, 0xb1, 0x20, 0xd3, 0xe2, 0x72, 0x01, 0xf4, 0xf4],
    )
    .unwrap();
    let s = cpu.state_mut();
    s.gpr[Gpr::Rax as usize] = 1;
    s.gpr[Gpr::Rbx as usize] = 2;
    s.gpr[Gpr::Rdx as usize] = 0xffff_ffff_0000_0001;
    run_from(&mut cpu, &mem, at);
    assert_eq!(cpu.state().gpr[Gpr::Rdx as usize], 1, "32-bit write");
    assert_eq!(cpu.state().rip, at + 10, "JB saw CF from the CMP");
    assert_ne!(cpu.state().rflags & state::rflags::CF, 0, "flags folded in");
    assert_eq!(cpu.stats().instructions, 5);
}

/// Runs `code` at 0x10000 in guest mode with every exception exiting;
/// returns the exception vector, or `None` when it reached the final HLT.
fn run_guest_code(mem: &PhysMemory, cpu: &mut Cpu, code: &[u8]) -> Option<u8> {
    let at = 0x10000;
    mem.write_bytes(Hpa(at), code).unwrap();
    mem.write_bytes(Hpa(at + code.len() as u64), &[0xf4])
        .unwrap();
    cpu.set_vmx(Some(crate::vmx::VmxControls {
        exception_bitmap: !0,
        hlt_exiting: true,
        ..Default::default()
    }));
    let s = cpu.state_mut();
    s.rip = at;
    s.activity = Activity::Active;
    let limit = cpu.cycles() + 1_000_000;
    match cpu.run(mem, limit) {
        VmExit::Hlt => None,
        VmExit::Exception { vector, .. } => Some(vector),
        other => panic!("unexpected exit {other:?}"),
    }
}

#[test]
fn sse_control_bits_and_mxcsr_masks_decide_ud_nm_and_xm() {
    use state::{cr0, cr4};
    const DIVSD_XMM0_XMM1: [u8; 4] = [0xf2, 0x0f, 0x5e, 0xc1];
    let one = 1.0f64.to_bits() as u128;
    let setup = |cpu: &mut Cpu, cr0_set: u64, cr4_clear: u64, mxcsr: u32| {
        let s = cpu.state_mut();
        s.cr0 |= cr0_set;
        s.cr4 &= !cr4_clear;
        s.fpu.mxcsr = mxcsr;
        s.fpu.xmm[0] = one;
        s.fpu.xmm[1] = 0;
    };
    let cases: [(u64, u64, u32, Option<u8>); 5] = [
        (cr0::TS, 0, 0x1f80, Some(vector::NM)),
        (cr0::EM, 0, 0x1f80, Some(vector::UD)),
        (0, cr4::OSFXSR, 0x1f80, Some(vector::UD)),
        // Division by zero with ZE unmasked: #XM, or #UD without
        // OSXMMEXCPT.
        (0, 0, 0x1f80 & !(1 << 9), Some(vector::XM)),
        (0, cr4::OSXMMEXCPT, 0x1f80 & !(1 << 9), Some(vector::UD)),
    ];
    for (k, (cr0_set, cr4_clear, mxcsr, want)) in cases.into_iter().enumerate() {
        let (mem, mut cpu) = machine();
        setup(&mut cpu, cr0_set, cr4_clear, mxcsr);
        assert_eq!(
            run_guest_code(&mem, &mut cpu, &DIVSD_XMM0_XMM1),
            want,
            "case {k}"
        );
        let fpu = &cpu.state().fpu;
        assert_eq!(fpu.xmm[0], one, "case {k}: destination not written");
        let ze_flag = fpu.mxcsr & 0x4 != 0;
        assert_eq!(
            ze_flag,
            k >= 3,
            "case {k}: ZE flag set by the numeric check only"
        );
    }
    // Masked: +inf and the ZE flag.
    let (mem, mut cpu) = machine();
    setup(&mut cpu, 0, 0, 0x1f80);
    assert_eq!(run_guest_code(&mem, &mut cpu, &DIVSD_XMM0_XMM1), None);
    assert_eq!(cpu.state().fpu.xmm[0], f64::INFINITY.to_bits() as u128);
    assert_eq!(cpu.state().fpu.mxcsr, 0x1f84);
    // FXSAVE: #NM with CR0.TS, #GP(0) at a misaligned address, and the
    // image otherwise (fxsave64 [0x20000] / [0x20008]).
    let fxsave_at = |disp: u8| [0x48, 0x0f, 0xae, 0x04, 0x25, disp, 0x00, 0x02, 0x00];
    let (mem, mut cpu) = machine();
    setup(&mut cpu, cr0::TS, 0, 0x1f80);
    assert_eq!(
        run_guest_code(&mem, &mut cpu, &fxsave_at(0)),
        Some(vector::NM)
    );
    let (mem, mut cpu) = machine();
    setup(&mut cpu, 0, 0, 0x1f80);
    assert_eq!(
        run_guest_code(&mem, &mut cpu, &fxsave_at(8)),
        Some(vector::GP)
    );
    assert_eq!(run_guest_code(&mem, &mut cpu, &fxsave_at(0)), None);
    assert_eq!(mem.read(Hpa(0x20000 + 24), 4).unwrap(), 0x1f80, "MXCSR");
    assert_eq!(mem.read(Hpa(0x20000 + 160), 8).unwrap(), one as u64, "XMM0");
}

#[test]
fn x87_control_bits_decide_nm_and_a_pending_exception_raises_mf_at_the_next_waiting_instruction() {
    use state::cr0;
    // fld1; fldz; fdivp st(1), st (1/0: ZE); fwait
    const DIVIDE_BY_ZERO_THEN_FWAIT: [u8; 7] = [0xd9, 0xe8, 0xd9, 0xee, 0xde, 0xf9, 0x9b];
    // #NM: CR0.EM or CR0.TS for an x87 instruction; FWAIT only with TS and MP.
    for (set, code, want) in [
        (cr0::TS, &[0xd9, 0xe8][..], Some(vector::NM)),
        (cr0::EM, &[0xd9, 0xe8][..], Some(vector::NM)),
        (cr0::TS, &[0x9b][..], None),
        (cr0::TS | cr0::MP, &[0x9b][..], Some(vector::NM)),
        (cr0::EM, &[0x9b][..], None),
    ] {
        let (mem, mut cpu) = machine();
        let s = cpu.state_mut();
        s.cr0 = (s.cr0 & !(cr0::TS | cr0::EM | cr0::MP)) | set;
        assert_eq!(
            run_guest_code(&mem, &mut cpu, code),
            want,
            "cr0 {set:#x} {code:x?}"
        );
    }
    // Masked: +inf, ZE set, no #MF.
    let (mem, mut cpu) = machine();
    assert_eq!(
        run_guest_code(&mem, &mut cpu, &DIVIDE_BY_ZERO_THEN_FWAIT),
        None
    );
    let fpu = cpu.state().fpu;
    assert_eq!(fpu.fsw & 0x80ff, 0x04, "ZE only, no summary");
    assert_eq!(fpu.st[fpu.top()], 0x7fff_8000_0000_0000_0000, "+inf");
    // Unmasked: the division leaves the stack as it was (no pop) and sets ES;
    // the FWAIT after it raises #MF, with RIP at the FWAIT.
    let (mem, mut cpu) = machine();
    cpu.state_mut().fpu.fcw = 0x037f & !0x04;
    assert_eq!(
        run_guest_code(&mem, &mut cpu, &DIVIDE_BY_ZERO_THEN_FWAIT),
        Some(vector::MF)
    );
    let fpu = cpu.state().fpu;
    assert_eq!(cpu.state().rip, 0x10006);
    assert_eq!(fpu.fsw & 0x80ff, 0x8084, "ZE, ES and B");
    assert_eq!(fpu.top(), 6, "not popped");
    assert_eq!(fpu.st[7], 0x3fff_8000_0000_0000_0000, "ST(1) = 1.0 kept");
    assert_eq!(fpu.fop, 0x6f9, "last opcode: DE F9");
    assert_eq!(fpu.fip, 0x10004, "last instruction: the FDIVP");
    // FNCLEX (non-waiting) clears it; then FWAIT passes.
    assert_eq!(run_guest_code(&mem, &mut cpu, &[0xdb, 0xe2, 0x9b]), None);
    assert_eq!(cpu.state().fpu.fsw & 0x80ff, 0);
}

#[test]
fn x87_store_is_suppressed_by_an_unmasked_invalid_operation() {
    // fld1; fchs; fsqrt (invalid); fstp qword [0x20000]
    let code = [
        0xd9, 0xe8, 0xd9, 0xe0, 0xd9, 0xfa, 0xdd, 0x1c, 0x25, 0x00, 0x00, 0x02, 0x00,
    ];
    let (mem, mut cpu) = machine();
    mem.write_u64(Hpa(0x20000), 0x1234).unwrap();
    assert_eq!(run_guest_code(&mem, &mut cpu, &code), None);
    assert_eq!(
        mem.read_u64(Hpa(0x20000)).unwrap(),
        0xfff8_0000_0000_0000,
        "masked: the indefinite NaN is stored"
    );
    // With IE unmasked the FSQRT leaves ST(0) alone and the FSTP raises
    // #MF before storing.
    let (mem, mut cpu) = machine();
    mem.write_u64(Hpa(0x20000), 0x1234).unwrap();
    cpu.state_mut().fpu.fcw = 0x037e;
    assert_eq!(run_guest_code(&mem, &mut cpu, &code), Some(vector::MF));
    assert_eq!(cpu.state().rip, 0x10006);
    assert_eq!(mem.read_u64(Hpa(0x20000)).unwrap(), 0x1234);
    let fpu = cpu.state().fpu;
    assert_eq!(fpu.st[fpu.top()], 0xbfff_8000_0000_0000_0000, "-1.0 kept");
    // The store itself raising an unmasked invalid operation: FISTP of
    // 1e30 to a word (fld qword [0x20008]; fistp word [0x20000]) stores
    // nothing, pops nothing, and leaves #MF pending.
    let code = [
        0xdd, 0x04, 0x25, 0x08, 0x00, 0x02, 0x00, 0xdf, 0x1c, 0x25, 0x00, 0x00, 0x02, 0x00,
    ];
    for (fcw, stored) in [(0x037f, 0x8000), (0x037e, 0x1234)] {
        let (mem, mut cpu) = machine();
        mem.write_u64(Hpa(0x20000), 0x1234).unwrap();
        mem.write_u64(Hpa(0x20008), 1e30f64.to_bits()).unwrap();
        cpu.state_mut().fpu.fcw = fcw;
        assert_eq!(run_guest_code(&mem, &mut cpu, &code), None);
        assert_eq!(mem.read_u64(Hpa(0x20000)).unwrap(), stored, "fcw {fcw:#x}");
        let fpu = cpu.state().fpu;
        let unmasked = fcw & 1 == 0;
        assert_eq!(fpu.fsw & 0x80 != 0, unmasked, "ES");
        assert_eq!(
            fpu.top(),
            if unmasked { 7 } else { 0 },
            "popped only when masked"
        );
    }
}

#[test]
fn x87_environment_and_state_round_trip_through_memory() {
    // fldpi; fld1; fnstenv [0x20000]; fnsave [0x20100]; frstor [0x20100]
    let code = [
        0xd9, 0xeb, 0xd9, 0xe8, 0xd9, 0x34, 0x25, 0x00, 0x00, 0x02, 0x00, 0xdd, 0x34, 0x25, 0x00,
        0x01, 0x02, 0x00, 0xdd, 0x24, 0x25, 0x00, 0x01, 0x02, 0x00,
    ];
    let (mem, mut cpu) = machine();
    assert_eq!(run_guest_code(&mem, &mut cpu, &code), None);
    let env = |o: u64| mem.read(Hpa(0x20000 + o), 2).unwrap();
    assert_eq!(env(0), 0x037f, "FCW");
    assert_eq!(env(2), 0xffff, "reserved half reads as ones");
    assert_eq!(env(4), 6 << 11, "FSW: TOP 6");
    assert_eq!(env(8), 0x0fff, "tags: R6 and R7 valid, the rest empty");
    assert_eq!(env(18), 0x1e8, "FOP of FLD1 (D9 E8)");
    // FNSTENV masked every exception; FNSAVE reinitialised, FRSTOR brought
    // back the saved state: FCW as stored (all masked), the two values.
    let fpu = cpu.state().fpu;
    assert_eq!(fpu.fcw, 0x037f);
    assert_eq!(fpu.top(), 6);
    assert_eq!(fpu.ftw, 0xc0);
    assert_eq!(fpu.st[6], 0x3fff_8000_0000_0000_0000);
    assert_eq!(fpu.st[7], 0x4000_c90f_daa2_2168_c235);
    assert_eq!(
        mem.read(Hpa(0x20100 + 28), 8).unwrap(),
        0x8000_0000_0000_0000,
        "ST(0) = 1.0 first"
    );
}

// Instructions and checks Linux needs (issue 15).

/// `lock cmpxchg8b [rdi]` then the same without LOCK: the first matches
/// EDX:EAX and stores ECX:EBX with ZF set; the second fails, loads
/// EDX:EAX from memory (upper halves cleared) and clears ZF.
#[test]
fn cmpxchg8b_compares_edx_eax_and_stores_ecx_ebx() {
    let (mem, mut cpu) = machine();
    let data = 0x30000;
    mem.write_u64(Hpa(data), 0x1111_2222_3333_4444).unwrap();
    let at = 0x10000;
    mem.write_bytes(Hpa(at), &[0xf0, 0x0f, 0xc7, 0x0f, 0xf4])
        .unwrap();
    let s = cpu.state_mut();
    s.gpr[Gpr::Rdi as usize] = data;
    s.gpr[Gpr::Rdx as usize] = 0xdead_0000_1111_2222;
    s.gpr[Gpr::Rax as usize] = 0x3333_4444;
    s.gpr[Gpr::Rcx as usize] = 0xaaaa_bbbb;
    s.gpr[Gpr::Rbx as usize] = 0xffff_ffff_cccc_dddd;
    run_from(&mut cpu, &mem, at);
    assert_eq!(mem.read_u64(Hpa(data)).unwrap(), 0xaaaa_bbbb_cccc_dddd);
    let s = cpu.state();
    assert_ne!(s.rflags & state::rflags::ZF, 0);
    assert_eq!(
        s.gpr[Gpr::Rdx as usize],
        0xdead_0000_1111_2222,
        "untouched on success"
    );
    mem.write_bytes(Hpa(at), &[0x0f, 0xc7, 0x0f, 0xf4]).unwrap();
    run_from(&mut cpu, &mem, at);
    let s = cpu.state();
    assert_eq!(s.rflags & state::rflags::ZF, 0);
    assert_eq!(s.gpr[Gpr::Rdx as usize], 0xaaaa_bbbb);
    assert_eq!(s.gpr[Gpr::Rax as usize], 0xcccc_dddd);
    assert_eq!(mem.read_u64(Hpa(data)).unwrap(), 0xaaaa_bbbb_cccc_dddd);
    // The register form does not exist.
    let (mem, mut cpu) = machine();
    assert_eq!(
        run_guest_code(&mem, &mut cpu, &[0x0f, 0xc7, 0xc8]),
        Some(vector::UD)
    );
}

#[test]
fn stac_and_clac_set_and_clear_ac_in_ring_0_only() {
    let (mem, mut cpu) = machine();
    assert_eq!(run_guest_code(&mem, &mut cpu, &[0x0f, 0x01, 0xcb]), None);
    assert_ne!(cpu.state().rflags & state::rflags::AC, 0);
    assert_eq!(run_guest_code(&mem, &mut cpu, &[0x0f, 0x01, 0xca]), None);
    assert_eq!(cpu.state().rflags & state::rflags::AC, 0);
    let (mem, mut cpu) = user_machine();
    assert_eq!(
        run_guest_code(&mem, &mut cpu, &[0x0f, 0x01, 0xcb]),
        Some(vector::UD)
    );
}

/// Writes `descriptors` as the GDT (at 0x40000) and points GDTR at it.
fn load_gdt(mem: &PhysMemory, cpu: &mut Cpu, descriptors: &[u64]) {
    let gdt = 0x40000;
    for (i, &d) in descriptors.iter().enumerate() {
        mem.write_u64(Hpa(gdt + 8 * i as u64), d).unwrap();
    }
    cpu.state_mut().gdtr = state::DescriptorTable {
        base: gdt,
        limit: (descriptors.len() * 8 - 1) as u16,
    };
}

/// VERW/VERR on a GDT of null, kernel code, kernel data, user data.
#[test]
fn verw_and_verr_report_writable_and_readable_segments_in_zf() {
    let (mem, mut cpu) = machine();
    load_gdt(
        &mem,
        &mut cpu,
        &[
            0,
            0x00af_9b00_0000_ffff,
            0x00cf_9300_0000_ffff,
            0x00cf_f300_0000_ffff,
        ],
    );
    // mov ax, SEL; verw ax (or verr ax)
    let zf = |cpu: &mut Cpu, sel: u16, verw: bool| {
        let [lo, hi] = sel.to_le_bytes();
        let op = if verw { 0xe8 } else { 0xe0 };
        assert_eq!(
            run_guest_code(&mem, cpu, &[0x66, 0xb8, lo, hi, 0x0f, 0x00, op]),
            None
        );
        cpu.state().rflags & state::rflags::ZF != 0
    };
    assert!(zf(&mut cpu, 0x10, true), "kernel data is writable at CPL 0");
    assert!(zf(&mut cpu, 0x1b, true), "user data too");
    assert!(!zf(&mut cpu, 0x08, true), "code is never writable");
    assert!(zf(&mut cpu, 0x08, false), "readable code");
    assert!(!zf(&mut cpu, 0x00, true), "null");
    assert!(!zf(&mut cpu, 0x20, true), "beyond the GDT limit");
    assert!(!zf(&mut cpu, 0x13, true), "RPL 3 above the DPL 0");
}

/// LSL and LAR on a GDT of null, kernel code, kernel data, a user data
/// segment shaped like Linux's per-CPU `getcpu` entry (byte-granular limit
/// 0x1003: CPU 3 on node 1), a 64-bit TSS and an interrupt gate type.
#[test]
fn lsl_and_lar_load_limits_and_rights_of_visible_descriptors() {
    let (mem, mut cpu) = machine();
    load_gdt(
        &mem,
        &mut cpu,
        &[
            0,
            0x00af_9b00_0000_ffff,
            0x00cf_9300_0000_ffff,
            0x0040_f500_0000_1003,
            0x0000_8900_1000_0067,
            0,
            0x0000_8e00_0000_0000,
        ],
    );
    // mov ecx, SEL; mov rax, -1; lsl rax, ecx (or lar): the result in RAX,
    // ZF (the code must run without a fault).
    let run = |cpu: &mut Cpu, sel: u16, lar: bool| {
        let [lo, hi] = sel.to_le_bytes();
        let op = if lar { 0x02 } else { 0x03 };
        let code = [
            0xb9, lo, hi, 0, 0, 0x48, 0xc7, 0xc0, 0xff, 0xff, 0xff, 0xff, 0x48, 0x0f, op, 0xc1,
        ];
        assert_eq!(run_guest_code(&mem, cpu, &code), None);
        (
            cpu.state().gpr[0],
            cpu.state().rflags & state::rflags::ZF != 0,
        )
    };
    assert_eq!(
        run(&mut cpu, 0x08, false),
        (0xffff_ffff, true),
        "4 GiB code"
    );
    assert_eq!(run(&mut cpu, 0x1b, false), (0x1003, true), "getcpu's entry");
    assert_eq!(run(&mut cpu, 0x20, false), (0x67, true), "64-bit TSS");
    assert_eq!(run(&mut cpu, 0x1b, true), (0x0040_f500, true));
    assert_eq!(
        run(&mut cpu, 0x10, true),
        (0x00c0_9300, true),
        "no limit bits"
    );
    assert_eq!(run(&mut cpu, 0x00, false), (u64::MAX, false), "null");
    assert_eq!(
        run(&mut cpu, 0x38, false),
        (u64::MAX, false),
        "past the limit"
    );
    assert_eq!(
        run(&mut cpu, 0x30, true),
        (u64::MAX, false),
        "a gate in long mode"
    );
    assert_eq!(
        run(&mut cpu, 0x1c, false),
        (u64::MAX, false),
        "an LDT selector"
    );
}

/// The CPU of `machine()` at CPL 3 with user-accessible pages and IOPL 0.
fn user_machine() -> (PhysMemory, Cpu) {
    let (mem, mut cpu) = machine();
    mem.write_u64(Hpa(PML4), 0x2000 | 0x7).unwrap();
    mem.write_u64(Hpa(0x2000), 0x3000 | 0x7).unwrap();
    mem.write_u64(Hpa(0x3000), 0x87).unwrap();
    mem.write_u64(Hpa(0x3008), (1 << 21) | 0x87).unwrap();
    let s = cpu.state_mut();
    s.cs.selector = 0x33;
    s.cs.attr = state::seg_attr::CODE64_USER;
    s.ss.selector = 0x2b;
    s.ss.attr = state::seg_attr::DATA_USER;
    (mem, cpu)
}

/// With CPL > IOPL, IN/OUT consult the TSS's I/O permission bitmap: a
/// port whose bits are all clear is allowed (here: the exit for the port
/// access), any set bit is #GP, as is a bitmap past the TSS limit.
#[test]
fn the_tss_io_bitmap_decides_user_port_access() {
    let tss = 0x20000u64;
    let map_base = 0x68u64;
    let setup = |limit: u32, set_port: Option<u16>| {
        let (mem, mut cpu) = user_machine();
        mem.write_bytes(Hpa(tss + 0x66), &(map_base as u16).to_le_bytes())
            .unwrap();
        if let Some(port) = set_port {
            let byte = tss + map_base + u64::from(port / 8);
            mem.write_bytes(Hpa(byte), &[1 << (port % 8)]).unwrap();
        }
        cpu.state_mut().tr = state::Segment {
            selector: 0x40,
            base: tss,
            limit,
            attr: state::seg_attr::TYPE_TSS64_BUSY | state::seg_attr::PRESENT,
        };
        (mem, cpu)
    };
    // mov dx, PORT; out dx, al (or out dx, ax)
    let out = |port: u16, word: bool| {
        let [lo, hi] = port.to_le_bytes();
        let mut code = vec![0x66, 0xba, lo, hi];
        code.extend_from_slice(if word { &[0x66, 0xef] } else { &[0xee] });
        code
    };
    let full = (map_base + 0x2000) as u32;
    let run = |mem: &PhysMemory, cpu: &mut Cpu, code: &[u8]| {
        let at = 0x10000;
        mem.write_bytes(Hpa(at), code).unwrap();
        cpu.set_vmx(Some(crate::vmx::VmxControls {
            exception_bitmap: !0,
            ..Default::default()
        }));
        let s = cpu.state_mut();
        s.rip = at;
        s.activity = Activity::Active;
        let limit = cpu.cycles() + 1_000_000;
        cpu.run(mem, limit)
    };
    let (mem, mut cpu) = setup(full, None);
    assert!(
        matches!(
            run(&mem, &mut cpu, &out(0x606, false)),
            VmExit::Io { port: 0x606, .. }
        ),
        "a clear bit allows the port"
    );
    let (mem, mut cpu) = setup(full, Some(0x606));
    assert!(matches!(
        run(&mem, &mut cpu, &out(0x606, false)),
        VmExit::Exception {
            vector: vector::GP,
            ..
        }
    ));
    assert!(
        matches!(run(&mem, &mut cpu, &out(0x605, false)), VmExit::Io { .. }),
        "the neighbour's bit is clear"
    );
    assert!(
        matches!(
            run(&mem, &mut cpu, &out(0x605, true)),
            VmExit::Exception {
                vector: vector::GP,
                ..
            }
        ),
        "a word access needs both ports' bits clear"
    );
    // The bitmap's bytes for port 0x606 lie past a short TSS limit.
    let (mem, mut cpu) = setup((map_base + 0x606 / 8) as u32, None);
    assert!(matches!(
        run(&mem, &mut cpu, &out(0x606, false)),
        VmExit::Exception {
            vector: vector::GP,
            ..
        }
    ));
    // IOPL 3 needs no bitmap.
    let (mem, mut cpu) = setup(0x67, Some(0x606));
    cpu.state_mut().rflags |= state::rflags::IOPL;
    assert!(matches!(
        run(&mem, &mut cpu, &out(0x606, false)),
        VmExit::Io { .. }
    ));
}

/// IRET moves the mode epoch itself, once it has changed state, rather
/// than before it runs (`system_moves_mode`), and only when it changes the
/// first-level TLB's lookup-key context (RFLAGS.AC under SMAP): in 64-bit
/// and in real mode, AC set, cleared or kept.
#[test]
fn iret_moves_the_mode_epoch_when_it_changes_the_key_context() {
    use iced_x86::{Decoder, DecoderOptions};
    // IRETQ; in real mode IRETD (IRET's 16-bit FLAGS hold no AC).
    for (bits, code) in [(64, &[0x48u8, 0xcf][..]), (16, &[0x66, 0xcf][..])] {
        for (ac_before, ac_after) in [(false, true), (true, false), (true, true), (false, false)] {
            let (mem, mut cpu) = machine();
            // Null, 64-bit kernel code, kernel data.
            load_gdt(
                &mem,
                &mut cpu,
                &[0, 0x00af_9b00_0000_ffff, 0x00cf_9300_0000_ffff],
            );
            let flags = if ac_after {
                rflags::FIXED1 | rflags::AC
            } else {
                rflags::FIXED1
            };
            let s = cpu.state_mut();
            s.cr4 |= state::cr4::SMAP;
            if ac_before {
                s.rflags |= rflags::AC;
            }
            if bits == 16 {
                s.cr0 &= !(state::cr0::PG | state::cr0::PE);
                s.efer &= !state::efer::LMA;
                s.ss.base = 0;
                s.gpr[Gpr::Rsp as usize] = 0x8000;
                for (k, v) in [0x100u32, 0, flags as u32].into_iter().enumerate() {
                    mem.write_bytes(Hpa(0x8000 + 4 * k as u64), &v.to_le_bytes())
                        .unwrap();
                }
            } else {
                s.gpr[Gpr::Rsp as usize] = 0x3f_e000;
                for (k, v) in [0x1234, 0x8, flags, 0x3f_f000, 0x10]
                    .into_iter()
                    .enumerate()
                {
                    mem.write_u64(Hpa(0x3f_e000 + 8 * k as u64), v).unwrap();
                }
            }
            let insn = Decoder::with_ip(bits, code, 0x1000, DecoderOptions::NONE).decode();
            cpu.next_rip = insn.next_ip();
            let (epoch, context) = (cpu.mode_epoch, cpu.key_context());
            cpu.exec_system(&mem, &insn).unwrap();
            let what = format!("{bits}-bit, AC {ac_before} -> {ac_after}");
            assert_eq!(cpu.state().rflags & rflags::AC != 0, ac_after, "{what}");
            let moved = ac_before != ac_after;
            assert_eq!(cpu.key_context() != context, moved, "{what}");
            assert_eq!(cpu.mode_epoch != epoch, moved, "{what}");
        }
    }
}
