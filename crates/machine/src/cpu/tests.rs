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
