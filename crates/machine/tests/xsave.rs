//! The XSAVE feature set with the x87 and SSE components: CR4.OSXSAVE,
//! XCR0 through XGETBV/XSETBV, XSAVE/XSAVEOPT/XRSTOR of the standard-form
//! area, and CPUID leaves 1 and 0xD (kvm-unit-tests' `xsave`).

mod common;

use common::*;
use iced_x86::code_asm::*;
use machine::cpu::state::cr4;
use machine::Hpa;

/// Runs to the HLT at the end of `code` or in the handler of the first
/// exception; returns the vector taken, if any.
fn run(r: &mut Rig) -> Option<u8> {
    r.vector_taken()
}

/// A rig running `code` with CR4.OSXSAVE set (or not).
fn xrig(osxsave: bool, code: impl FnOnce(&mut CodeAssembler)) -> Rig {
    let mut r = rig(code);
    if osxsave {
        r.cpu.state_mut().cr4 |= cr4::OSXSAVE;
    }
    r
}

/// XSETBV of EDX:EAX = `value` to XCR `ecx`.
fn xsetbv_code(a: &mut CodeAssembler, ecx_value: u64, value: u64) {
    a.mov(rcx, ecx_value).unwrap();
    a.mov(eax, value as u32).unwrap();
    a.mov(edx, (value >> 32) as u32).unwrap();
    a.xsetbv().unwrap();
}

#[test]
fn xcr0_moves_need_osxsave_and_take_only_x87_with_or_without_sse() {
    // Without CR4.OSXSAVE both are #UD.
    assert_eq!(run(&mut xrig(false, |a| a.xgetbv().unwrap())), Some(6));
    assert_eq!(run(&mut xrig(false, |a| xsetbv_code(a, 0, 3))), Some(6));
    // XCR0 = 3 sticks; RCX[63:32] are ignored.
    let mut r = xrig(true, |a| {
        xsetbv_code(a, 0xdead_0000_0000, 3);
        a.xor(eax, eax).unwrap();
        a.mov(rcx, 0x1234_0000_0000u64).unwrap();
        a.xgetbv().unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(r.cpu.state().xcr0, 1, "x87 only after reset");
    assert_eq!(run(&mut r), None);
    assert_eq!((r.gpr(0), r.gpr(2)), (3, 0));
    assert_eq!(r.cpu.state().xcr0, 3);
    // #GP: no x87, SSE alone, an unsupported component (AVX), XCR 1.
    for (ecx_value, value) in [(0, 0), (0, 2), (0, 7), (0, 1 << 32), (1, 3)] {
        let mut r = xrig(true, |a| {
            xsetbv_code(a, ecx_value, value);
            a.hlt().unwrap();
        });
        assert_eq!(run(&mut r), Some(13), "XSETBV({ecx_value}, {value:#x})");
        assert_eq!(r.cpu.state().xcr0, 1);
    }
    let mut r = xrig(true, |a| {
        a.mov(ecx, 1).unwrap();
        a.xgetbv().unwrap();
    });
    assert_eq!(run(&mut r), Some(13), "XGETBV(1)");
    // XSETBV is privileged; XGETBV is not.
    let mut r = xrig(true, |a| xsetbv_code(a, 0, 3));
    r.enter_user_mode();
    assert_eq!(run(&mut r), Some(13));
}

/// XCR0 = x87 | SSE, RBX = `area`, EDX:EAX = `components`.
fn enable_and_point_at(a: &mut CodeAssembler, area: u64, components: u32) {
    xsetbv_code(a, 0, 3);
    a.mov(rbx, area).unwrap();
    a.mov(eax, components).unwrap();
    a.xor(edx, edx).unwrap();
}

/// XSAVE of x87 and SSE then XRSTOR from the image brings the registers
/// back; XSTATE_BV gets the requested components and keeps other bits;
/// a component not requested is not written.
#[test]
fn xsave_and_xrstor_round_trip_the_requested_components() {
    let area = DATA + 0x1000;
    let mut r = xrig(true, |a| {
        enable_and_point_at(a, area, 3);
        a.xsave64(ptr(rbx)).unwrap();
        // Clobber XMM3, MXCSR and the x87 control word, then restore.
        a.pxor(xmm3, xmm3).unwrap();
        a.mov(dword_ptr(rbx + 0x800), 0x1f80 | 0x6000).unwrap();
        a.ldmxcsr(dword_ptr(rbx + 0x800)).unwrap();
        a.fninit().unwrap();
        a.mov(eax, 3).unwrap();
        a.xrstor64(ptr(rbx)).unwrap();
        // x87 alone to a second area whose XSTATE_BV has SSE.
        a.mov(rbx, area + 0x400).unwrap();
        a.mov(eax, 1).unwrap();
        a.xsave(ptr(rbx)).unwrap();
        a.hlt().unwrap();
    });
    // Something to save; the second area's SSE bit and XMM0 marker.
    r.mem.write_u64(Hpa(area + 0x400 + 512), 2).unwrap();
    r.mem.write_u64(Hpa(area + 0x400 + 160), 0x5a5a).unwrap();
    {
        let fpu = &mut r.cpu.state_mut().fpu;
        fpu.xmm[3] = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;
        fpu.mxcsr = 0x1f80 | 0x20;
        fpu.fcw = 0x027f;
    }
    assert_eq!(run(&mut r), None);
    let fpu = &r.cpu.state().fpu;
    assert_eq!(fpu.xmm[3], 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210);
    assert_eq!(fpu.mxcsr, 0x1f80 | 0x20);
    assert_eq!(fpu.fcw, 0x027f);
    assert_eq!(r.mem.read_u64(Hpa(area + 512)).unwrap(), 3);
    assert_eq!(r.mem.read_u64(Hpa(area + 0x400 + 512)).unwrap(), 3);
    assert_eq!(r.mem.read_u64(Hpa(area + 0x400 + 160)).unwrap(), 0x5a5a);
    assert_eq!(r.mem.read(Hpa(area + 0x400), 2).unwrap(), 0x027f, "FCW");
    assert_eq!(r.mem.read(Hpa(area + 24), 4).unwrap(), 0x1f80 | 0x20);
    assert_eq!(
        r.mem.read_u64(Hpa(area + 160 + 16 * 3)).unwrap(),
        0x7654_3210_u64 | 0xfedc_ba98 << 32
    );
}

/// XRSTOR: a requested component whose XSTATE_BV bit is clear gets its
/// initial configuration, and MXCSR is loaded from the area whenever SSE
/// is requested (SDM Vol. 1 13.8.1); a component not requested stays.
#[test]
fn xrstor_initializes_components_not_in_xstate_bv() {
    let area = DATA + 0x1000;
    let mut r = xrig(true, |a| {
        enable_and_point_at(a, area, 2);
        a.xrstor64(ptr(rbx)).unwrap();
        a.hlt().unwrap();
    });
    {
        let fpu = &mut r.cpu.state_mut().fpu;
        fpu.xmm[0] = 5;
        fpu.fcw = 0x027f;
    }
    r.mem.write_u64(Hpa(area + 160), 7).unwrap(); // XMM0 in the area
    r.mem
        .write_u64(Hpa(area + 24), 0x0000_ffff_0000_1f00)
        .unwrap(); // MXCSR, mask
    r.mem.write_u64(Hpa(area + 512), 0).unwrap(); // XSTATE_BV: none
    assert_eq!(run(&mut r), None);
    let fpu = &r.cpu.state().fpu;
    assert_eq!(fpu.xmm[0], 0, "SSE initialized");
    assert_eq!(fpu.mxcsr, 0x1f00, "MXCSR from the area");
    assert_eq!(fpu.fcw, 0x027f, "x87 not requested: kept");
}

/// #GP: a misaligned area, XSTATE_BV beyond XCR0, a compacted-form
/// XCOMP_BV, a reserved MXCSR bit; #NM with CR0.TS; #UD without OSXSAVE.
#[test]
fn xsave_area_faults() {
    let area = DATA + 0x1000;
    let attempt = |offset: u64, bv: u64, comp: u64, mxcsr: u32, ts: bool, osx: bool| {
        let mut r = xrig(osx, |a| {
            if osx {
                xsetbv_code(a, 0, 3);
            }
            if ts {
                a.mov(rax, cr0).unwrap();
                a.or(eax, 8).unwrap();
                a.mov(cr0, rax).unwrap();
            }
            a.mov(rbx, area + offset).unwrap();
            a.mov(eax, 3).unwrap();
            a.xor(edx, edx).unwrap();
            a.xrstor64(ptr(rbx)).unwrap();
            a.hlt().unwrap();
        });
        r.mem.write_u64(Hpa(area + 24), u64::from(mxcsr)).unwrap();
        r.mem.write_u64(Hpa(area + 512), bv).unwrap();
        r.mem.write_u64(Hpa(area + 520), comp).unwrap();
        run(&mut r)
    };
    assert_eq!(attempt(0, 3, 0, 0x1f80, false, true), None);
    assert_eq!(
        attempt(16, 3, 0, 0x1f80, false, true),
        Some(13),
        "alignment"
    );
    assert_eq!(attempt(0, 7, 0, 0x1f80, false, true), Some(13), "XSTATE_BV");
    assert_eq!(attempt(0, 3, 1 << 63 | 3, 0x1f80, false, true), Some(13));
    assert_eq!(attempt(0, 3, 0, 0x1_0000, false, true), Some(13), "MXCSR");
    assert_eq!(attempt(0, 3, 0, 0x1f80, true, true), Some(7), "CR0.TS");
    assert_eq!(attempt(0, 3, 0, 0x1f80, false, false), Some(6), "OSXSAVE");
}

/// CPUID.1:ECX reports XSAVE, and OSXSAVE as CR4 has it; leaf 0xD gives
/// the x87 and SSE components, a 576-byte area and XSAVEOPT.
#[test]
fn cpuid_reports_xsave_and_follows_cr4_osxsave() {
    for osx in [false, true] {
        let mut r = xrig(osx, |a| {
            a.mov(eax, 1).unwrap();
            a.cpuid().unwrap();
            a.mov(r8, rcx).unwrap();
            a.mov(eax, 0xd).unwrap();
            a.xor(ecx, ecx).unwrap();
            a.cpuid().unwrap();
            a.mov(r9, rax).unwrap();
            a.mov(r10, rbx).unwrap();
            a.mov(r11, rcx).unwrap();
            a.mov(eax, 0xd).unwrap();
            a.mov(ecx, 1).unwrap();
            a.cpuid().unwrap();
            a.hlt().unwrap();
        });
        assert_eq!(run(&mut r), None);
        assert_ne!(r.gpr(8) & 1 << 26, 0, "XSAVE");
        assert_eq!(r.gpr(8) & 1 << 27 != 0, osx, "OSXSAVE");
        assert_eq!((r.gpr(9), r.gpr(10), r.gpr(11)), (3, 576, 576));
        assert_eq!(r.gpr(0) & 0xf, 1, "XSAVEOPT only");
    }
}

/// XSAVE then XRSTOR with the area across a 4 KiB boundary take every
/// way of the area's accesses to the same bytes and registers: a page at
/// a time, byte by byte while DR7 enables a breakpoint (elsewhere), and
/// byte by byte into a frame holding decoded code (here, the code's own).
#[test]
fn xsave_across_a_page_boundary_is_the_same_every_way() {
    let run_at = |area: u64, breakpoint: bool| {
        let mut r = xrig(true, |a| {
            enable_and_point_at(a, area, 3);
            a.xsave64(ptr(rbx)).unwrap();
            a.pxor(xmm7, xmm7).unwrap();
            a.fninit().unwrap();
            a.xrstor64(ptr(rbx)).unwrap();
            a.hlt().unwrap();
        });
        {
            let s = r.cpu.state_mut();
            s.fpu.xmm[7] = 0x1111_2222_3333_4444_5555_6666_7777_8888;
            s.fpu.xmm[15] = u128::MAX - 5;
            s.fpu.fcw = 0x027f;
            if breakpoint {
                // An instruction breakpoint at 0, never reached.
                s.debug.dr7 |= 1;
            }
        }
        assert_eq!(run(&mut r), None);
        let fpu = &r.cpu.state().fpu;
        assert_eq!(fpu.xmm[7], 0x1111_2222_3333_4444_5555_6666_7777_8888);
        assert_eq!(fpu.fcw, 0x027f);
        let mut bytes = vec![0u8; 576];
        r.mem.read_bytes(Hpa(area), &mut bytes).unwrap();
        bytes
    };
    let data = DATA + 0x1000 - 0xc0;
    let reference = run_at(data, true);
    assert_eq!(reference[512..520], 3u64.to_le_bytes());
    assert_eq!(
        reference[160 + 16 * 15..160 + 16 * 16],
        (u128::MAX - 5).to_le_bytes()
    );
    assert_eq!(run_at(data, false), reference);
    // In the code's frame, past the code.
    assert_eq!(run_at(CODE + 0x1000 - 0xc0, false), reference);
    // Within one page (a quadword at a time).
    assert_eq!(run_at(DATA + 0x40, false), reference);
}
