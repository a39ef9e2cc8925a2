//! System instructions kvm-unit-tests found missing or wrong: SMSW (and
//! UMIP), LMSW, RDPMC without counters, 32-bit SYSRET, LLDT of a real LDT and
//! segment loads through it, SYSCALL from compatibility mode.

mod common;

use common::*;
use iced_x86::code_asm::*;
use machine::cpu::state::{cr0, cr4, efer, msr};
use machine::Hpa;

/// Runs to the HLT at the end of `code` or in the handler of the first
/// exception; returns the vector taken, if any.
fn run(r: &mut Rig) -> Option<u8> {
    r.vector_taken()
}

#[test]
fn smsw_reads_cr0_and_faults_under_umip_above_ring_0() {
    let code = |a: &mut CodeAssembler| {
        a.smsw(rax).unwrap();
        a.smsw(word_ptr(DATA)).unwrap();
        a.hlt().unwrap();
    };
    let mut r = rig(code);
    assert_eq!(run(&mut r), None);
    let cr0_value = r.cpu.state().cr0;
    assert_ne!(cr0_value & cr0::PG, 0);
    assert_eq!(r.gpr(0), cr0_value);
    assert_eq!(r.mem.read(Hpa(DATA), 2).unwrap(), cr0_value & 0xffff);

    let mut r = rig(|a| {
        a.smsw(eax).unwrap();
        a.hlt().unwrap();
    });
    r.enter_user_mode();
    r.cpu.state_mut().cr4 |= cr4::UMIP;
    assert_eq!(run(&mut r), Some(13));
    // Without UMIP ring 3 may read it (and then faults at the HLT).
    let mut r = rig(|a| {
        a.smsw(eax).unwrap();
        a.hlt().unwrap();
    });
    r.enter_user_mode();
    assert_eq!(run(&mut r), Some(13));
    assert_eq!(r.gpr(0), r.cpu.state().cr0 & 0xffff_ffff);
}

#[test]
fn lmsw_loads_cr0_low_bits_but_never_clears_pe() {
    let mut r = rig(|a| {
        a.smsw(eax).unwrap();
        a.mov(ebx, eax).unwrap();
        // Set TS and MP, try to clear PE.
        a.and(eax, !0xfi32).unwrap();
        a.or(eax, 0xa).unwrap();
        a.lmsw(ax).unwrap();
        a.mov(word_ptr(DATA), 0).unwrap();
        a.lmsw(word_ptr(DATA)).unwrap();
        a.hlt().unwrap();
    });
    let before = r.cpu.state().cr0;
    assert_eq!(run(&mut r), None);
    let after = r.cpu.state().cr0;
    assert_eq!(after & cr0::PE, cr0::PE, "PE stays set");
    assert_eq!(after & 0xe, 0, "the memory form cleared MP, EM, TS");
    assert_eq!(after & !0xf, before & !0xf, "bits above 3 untouched");
    // Ring 3: #GP.
    let mut r = rig(|a| {
        a.lmsw(ax).unwrap();
        a.hlt().unwrap();
    });
    r.enter_user_mode();
    assert_eq!(run(&mut r), Some(13));
}

#[test]
fn rdpmc_without_counters_is_gp() {
    let mut r = rig(|a| {
        a.xor(ecx, ecx).unwrap();
        a.rdpmc().unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(run(&mut r), Some(13));
}

/// An LDT descriptor in the GDT at 0x38 (16 bytes), the LDT at DATA with
/// a data segment at index 1 whose base is 0x12_3000.
fn with_ldt(r: &mut Rig) {
    let ldt_base = DATA;
    let low = 0x0f_u64 // limit 15
        | ((ldt_base & 0xff_ffff) << 16)
        | (0x82 << 40) // present, system type 2 (LDT)
        | ((ldt_base >> 24) & 0xff) << 56;
    r.mem.write_u64(Hpa(GDT + 0x38), low).unwrap();
    r.mem.write_u64(Hpa(GDT + 0x40), ldt_base >> 32).unwrap();
    r.cpu.state_mut().gdtr.limit = 0x47;
    let base = 0x12_3000u64;
    let data = 0xffff_u64 | ((base & 0xff_ffff) << 16) | (0x93 << 40) | (0xcf << 48);
    r.mem.write_u64(Hpa(ldt_base + 8), data).unwrap();
}

#[test]
fn lldt_loads_an_ldt_and_ti_selectors_use_it() {
    let mut r = rig(|a| {
        a.mov(eax, 0x38).unwrap();
        a.lldt(ax).unwrap();
        a.mov(eax, 0x0c).unwrap(); // index 1, TI = 1
        a.mov(ds, ax).unwrap();
        a.sldt(ebx).unwrap();
        a.hlt().unwrap();
    });
    with_ldt(&mut r);
    assert_eq!(run(&mut r), None);
    let s = r.cpu.state();
    assert_eq!(s.ldtr.base, DATA);
    assert_eq!(s.ldtr.limit, 0xf);
    assert_eq!(s.ds.base, 0x12_3000);
    assert_eq!(r.gpr(3), 0x38);

    // An index past the LDT's limit: #GP(selector).
    let mut r = rig(|a| {
        a.mov(eax, 0x38).unwrap();
        a.lldt(ax).unwrap();
        a.mov(eax, 0x14).unwrap(); // index 2: beyond limit 15
        a.mov(ds, ax).unwrap();
        a.hlt().unwrap();
    });
    with_ldt(&mut r);
    assert_eq!(run(&mut r), Some(13));
    // A selector that is not an LDT descriptor (the code segment): #GP.
    let mut r = rig(|a| {
        a.mov(eax, u32::from(KERNEL_CS)).unwrap();
        a.lldt(ax).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(run(&mut r), Some(13));
}

/// LAR, LSL and VERW look LDT selectors (TI = 1) up in the LDT (Linux's
/// segcheck: `lar` of a modify_ldt selector gave ZF = 0).
#[test]
fn lar_lsl_and_verw_read_ldt_selectors_from_the_ldt() {
    let mut r = rig(|a| {
        a.mov(eax, 0x38).unwrap();
        a.lldt(ax).unwrap();
        a.mov(ecx, 0x0c).unwrap(); // index 1, TI = 1
        a.xor(ebx, ebx).unwrap();
        a.lar(ebx, ecx).unwrap();
        a.setz(dl).unwrap();
        a.lsl(esi, ecx).unwrap();
        a.setz(dh).unwrap();
        a.verw(cx).unwrap();
        a.setz(al).unwrap();
        a.mov(ecx, 0x14).unwrap(); // index 2: beyond the LDT's limit
        a.lar(edi, ecx).unwrap();
        a.setz(ah).unwrap();
        a.hlt().unwrap();
    });
    with_ldt(&mut r);
    assert_eq!(run(&mut r), None);
    assert_eq!(r.gpr(2) & 0xffff, 0x0101, "LAR and LSL set ZF");
    assert_eq!(r.gpr(3), 0x00c0_9300, "LAR: the access rights");
    assert_eq!(r.gpr(6), 0xffff_ffff, "LSL: the page-granular limit");
    assert_eq!(
        r.gpr(0) & 0xffff,
        0x0001,
        "VERW ZF = 1; past the limit ZF = 0"
    );
}

/// SYSRETL goes to compatibility mode at STAR[63:48] | 3 with EIP = ECX;
/// SYSCALL from there enters at CSTAR.
#[test]
fn sysretl_enters_compatibility_mode_and_syscall_returns_through_cstar() {
    const USER_CS32: u64 = 0x18; // STAR[63:48]; SS = +8 = 0x20 (| 3)
    let mut r = rig(|a| {
        a.mov(ecx, (CODE + 0x100) as u32).unwrap();
        a.xor(r11d, r11d).unwrap();
        a.sysret().unwrap(); // 32-bit operand size: sysretl
    });
    // A 32-bit user code segment at 0x18 and user data at 0x20 in the rig's
    // GDT (replacing its user entries), and 32-bit code at CODE + 0x100:
    // `syscall`.
    let code32 = 0xffff_u64 | (0xfb << 40) | (0xcf << 48);
    let data = 0xffff_u64 | (0xf3 << 40) | (0xcf << 48);
    r.mem.write_u64(Hpa(GDT + 0x18), code32).unwrap();
    r.mem.write_u64(Hpa(GDT + 0x20), data).unwrap();
    r.mem.write_bytes(Hpa(CODE + 0x100), &[0x0f, 0x05]).unwrap();
    let mut handler = CodeAssembler::new(64).unwrap();
    handler.mov(r14d, 0x5ca11u32).unwrap();
    handler.hlt().unwrap();
    let bytes = handler.assemble(CODE + 0x200).unwrap();
    r.mem.write_bytes(Hpa(CODE + 0x200), &bytes).unwrap();
    let s = r.cpu.state_mut();
    s.efer |= efer::SCE;
    s.star = (USER_CS32 << 48) | (u64::from(KERNEL_CS) << 32);
    s.cstar = CODE + 0x200;
    s.lstar = CODE + 0x300;
    let _ = msr::STAR;
    assert_eq!(run(&mut r), None);
    assert_eq!(r.gpr(14), 0x5ca11, "entered through CSTAR");
    assert_eq!(r.gpr(1), CODE + 0x102, "RCX: after the SYSCALL");
}

/// A SYSCALL from compatibility mode with CSTAR = LSTAR whose FMASK
/// clears RFLAGS.AC under SMAP: the kernel's first access to a user page
/// after it faults, though the same access before (AC set) was allowed
/// and is in the first-level TLB. (The mode epoch must move for the AC
/// change; a compatibility-mode SYSCALL changes nothing else of the
/// first-level TLB's key context: CS and the privilege are not in it.)
#[test]
fn compat_syscall_with_cstar_equal_to_lstar_keeps_smap_exact() {
    const USER_CS32: u64 = 0x18;
    const AC: u64 = 1 << 18;
    for engine in [machine::Engine::Interp, machine::Engine::Jit] {
        let mut r = rig(|a| {
            a.stac().unwrap();
            a.mov(rax, qword_ptr(DATA)).unwrap(); // allowed: AC set
            a.mov(ecx, (DATA + 0x1000) as u32).unwrap();
            a.mov(r11d, (0x2 | AC) as u32).unwrap();
            a.sysret().unwrap(); // sysretl: compatibility mode, AC set
        })
        .with_engine(engine);
        let code32 = 0xffff_u64 | (0xfb << 40) | (0xcf << 48);
        let data = 0xffff_u64 | (0xf3 << 40) | (0xcf << 48);
        r.mem.write_u64(Hpa(GDT + 0x18), code32).unwrap();
        r.mem.write_u64(Hpa(GDT + 0x20), data).unwrap();
        // The first 2 MiB (code, tables, stacks) supervisor-only, so that
        // SMAP allows the CPU's implicit accesses; the user code next to
        // DATA.
        r.mem.write_u64(Hpa(PD), 0x83).unwrap();
        let user = DATA + 0x1000;
        r.mem.write_bytes(Hpa(user), &[0x0f, 0x05]).unwrap();
        let mut handler = CodeAssembler::new(64).unwrap();
        handler.mov(r14d, 0x5ca11u32).unwrap();
        handler.mov(rax, qword_ptr(DATA)).unwrap(); // AC clear: #PF
        handler.hlt().unwrap();
        let bytes = handler.assemble(CODE + 0x200).unwrap();
        r.mem.write_bytes(Hpa(CODE + 0x200), &bytes).unwrap();
        let s = r.cpu.state_mut();
        s.cr4 |= cr4::SMAP;
        s.efer |= efer::SCE;
        s.star = (USER_CS32 << 48) | (u64::from(KERNEL_CS) << 32);
        s.cstar = CODE + 0x200;
        s.lstar = CODE + 0x200;
        s.fmask = AC;
        assert_eq!(run(&mut r), Some(14), "{engine:?}");
        assert_eq!(r.gpr(14), 0x5ca11, "{engine:?}: entered through CSTAR");
        assert_eq!(r.cpu.state().rflags & AC, 0, "{engine:?}");
    }
}

/// SYSRET that loads TF from R11 (TF clear before it) takes the
/// single-step trap after itself, at the target in ring 3 (kvm-unit-tests'
/// `syscall` "syscall TF handling"; the trap was lost when the block began
/// with TF clear, and the 32-bit user code ran on past its SYSCALLs).
#[test]
fn sysret_that_sets_tf_traps_at_its_target() {
    const USER_CS32: u64 = 0x18; // sysretl: CS = 0x1b, SS = 0x23
    const USER_BASE64: u64 = 0x10; // sysretq: CS = 0x23, SS = 0x1b
    for engine in [machine::Engine::Interp, machine::Engine::Jit] {
        for wide in [true, false] {
            let mut r = rig(|a| {
                a.mov(ecx, (CODE + 0x100) as u32).unwrap();
                a.mov(r11d, 0x102).unwrap(); // TF
                if wide {
                    a.sysretq().unwrap();
                } else {
                    a.sysret().unwrap();
                }
            })
            .with_engine(engine);
            if !wide {
                let code32 = 0xffff_u64 | (0xfb << 40) | (0xcf << 48);
                let data = 0xffff_u64 | (0xf3 << 40) | (0xcf << 48);
                r.mem.write_u64(Hpa(GDT + 0x18), code32).unwrap();
                r.mem.write_u64(Hpa(GDT + 0x20), data).unwrap();
            }
            // Ring-3 code at the target: HLT (#GP at CPL 3 if no trap came).
            r.mem.write_bytes(Hpa(CODE + 0x100), &[0xf4]).unwrap();
            let s = r.cpu.state_mut();
            s.efer |= efer::SCE;
            let base = if wide { USER_BASE64 } else { USER_CS32 };
            s.star = (base << 48) | (u64::from(KERNEL_CS) << 32);
            let what = format!("{engine:?}, sysret{}", if wide { "q" } else { "l" });
            assert_eq!(run(&mut r), Some(1), "{what}");
            let stack = r.gpr(4);
            let frame_rip = r.mem.read_u64(Hpa(stack)).unwrap();
            let frame_cs = r.mem.read_u64(Hpa(stack + 8)).unwrap();
            assert_eq!(frame_rip, CODE + 0x100, "{what}");
            assert_eq!(frame_cs, if wide { 0x23 } else { 0x1b }, "{what}");
            let status = r.cpu.state().debug.dr6;
            assert_ne!(status & machine::cpu::debug_regs::DR6_BS, 0, "{what}");
        }
    }
}

/// CR4.PCIDE: set only with CR3[11:0] = 0 (in IA-32e mode); then CR3
/// holds a PCID in bits 11:0 and bit 63 of a load is not stored; paging
/// cannot be turned off while it is set.
#[test]
fn pcide_takes_a_pcid_in_cr3_and_pins_paging() {
    let set_pcide = |a: &mut CodeAssembler| {
        a.mov(rax, cr4).unwrap();
        a.or(eax, cr4::PCIDE as u32).unwrap();
        a.mov(cr4, rax).unwrap();
    };
    // CR3[11:0] != 0: #GP.
    let mut r = rig(|a| {
        a.mov(rax, cr3).unwrap();
        a.or(eax, 1).unwrap();
        a.mov(cr3, rax).unwrap();
        set_pcide(a);
        a.hlt().unwrap();
    });
    assert_eq!(run(&mut r), Some(13));
    let mut r = rig(|a| {
        set_pcide(a);
        a.mov(rax, cr3).unwrap();
        a.mov(rbx, (1u64 << 63) | 5).unwrap();
        a.or(rax, rbx).unwrap();
        a.mov(cr3, rax).unwrap();
        a.mov(rcx, cr3).unwrap();
        a.mov(rax, cr0).unwrap();
        a.btr(eax, 31).unwrap();
        a.mov(cr0, rax).unwrap(); // #GP: PG with PCIDE
        a.hlt().unwrap();
    });
    assert_eq!(run(&mut r), Some(13));
    assert_ne!(r.cpu.state().cr4 & cr4::PCIDE, 0);
    assert_eq!(r.gpr(1), PML4 | 5, "PCID kept, bit 63 dropped");
    // Without PCIDE, bit 63 of CR3 is reserved.
    let mut r = rig(|a| {
        a.mov(rax, cr3).unwrap();
        a.bts(rax, 63).unwrap();
        a.mov(cr3, rax).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(run(&mut r), Some(13));
}

/// INVPCID `kind` with the descriptor (PCID, address) at DATA, after
/// `before`; then reads the qword at `probe` into RDX.
fn invpcid_rig(
    kind: u64,
    pcid: u64,
    address: u64,
    probe: u64,
    before: impl FnOnce(&mut CodeAssembler),
) -> Rig {
    let r = rig(|a| {
        before(a);
        a.mov(rax, probe).unwrap();
        a.mov(rdx, qword_ptr(rax)).unwrap(); // cached in the TLB
        a.mov(rbx, PD + 8 * (probe >> 21)).unwrap();
        a.add(qword_ptr(rbx), 0x20_0000).unwrap(); // remap: the next 2 MiB
        a.mov(rcx, kind).unwrap();
        a.mov(rsi, DATA).unwrap();
        a.invpcid(rcx, xmmword_ptr(rsi)).unwrap();
        a.mov(rax, probe).unwrap();
        a.mov(rdx, qword_ptr(rax)).unwrap();
        a.hlt().unwrap();
    });
    r.mem.write_u64(Hpa(DATA), pcid).unwrap();
    r.mem.write_u64(Hpa(DATA + 8), address).unwrap();
    r
}

/// INVPCID types 0-3 remove the translation (the TLB is not tagged by
/// PCID, so every type removes at least what it must); #GP for type 4,
/// reserved descriptor bits, a non-canonical type-0 address, a PCID for
/// types 0 and 1 without CR4.PCIDE, and above ring 0; #UD in a guest
/// without the "enable INVPCID" control.
#[test]
fn invpcid_invalidates_and_checks_its_operands() {
    let probe = 0x80_0000u64;
    let marker = 0x5eed_u64;
    for kind in 0..4 {
        let mut r = invpcid_rig(kind, 0, probe, probe, |_| {});
        r.mem.write_u64(Hpa(probe), 1).unwrap();
        r.mem.write_u64(Hpa(probe + 0x20_0000), marker).unwrap();
        assert_eq!(run(&mut r), None, "type {kind}");
        assert_eq!(r.gpr(2), marker, "type {kind}: the new mapping");
    }
    for (kind, pcid, address) in [
        (4, 0, probe),
        (0, 1 << 12, probe),
        (0, 0, 1u64 << 63),
        (0, 1, probe),
        (1, 1, probe),
    ] {
        let mut r = invpcid_rig(kind, pcid, address, probe, |_| {});
        assert_eq!(run(&mut r), Some(13), "type {kind} pcid {pcid:#x}");
    }
    // A PCID with CR4.PCIDE set is fine.
    let mut r = invpcid_rig(1, 7, probe, probe, |a| {
        a.mov(rax, cr4).unwrap();
        a.or(eax, cr4::PCIDE as u32).unwrap();
        a.mov(cr4, rax).unwrap();
    });
    assert_eq!(run(&mut r), None);
    let mut r = invpcid_rig(2, 0, probe, probe, |_| {});
    r.enter_user_mode();
    assert_eq!(run(&mut r), Some(13), "ring 3");
    let mut r = invpcid_rig(2, 0, probe, probe, |_| {}).guest(controls());
    assert_eq!(run(&mut r), Some(6), "no enable-INVPCID control: #UD");
    let mut r = invpcid_rig(2, 0, probe, probe, |_| {}).guest(machine::VmxControls {
        enable_invpcid: true,
        ..controls()
    });
    assert_eq!(run(&mut r), None);
}

/// MOVD/MOVQ through the MMX registers (kvm-unit-tests' `emulator`
/// "movq (mmx, read/write)"): MMi is bits 63:0 of x87 register Ri with
/// bits 79:64 set; an MMX move sets TOP to 0 and tags every register
/// valid, EMMS empties them; #UD with CR0.EM, #NM with CR0.TS, #MF with an
/// unmasked x87 exception pending.
#[test]
fn mmx_moves_alias_the_x87_registers() {
    for engine in [machine::Engine::Interp, machine::Engine::Jit] {
        let mut r = rig(|a| {
            a.fninit().unwrap();
            a.fld1().unwrap(); // TOP = 7
            a.mov(rax, 0x0102_0304_0506_0708u64).unwrap();
            a.movq(mm0, rax).unwrap();
            a.movq(qword_ptr(DATA), mm0).unwrap();
            a.movd(mm1, dword_ptr(DATA + 4)).unwrap();
            a.movq(mm2, mm1).unwrap();
            a.movq(rbx, mm2).unwrap();
            a.movd(ecx, mm0).unwrap();
            a.hlt().unwrap();
        })
        .with_engine(engine);
        assert_eq!(run(&mut r), None, "{engine:?}");
        assert_eq!(r.mem.read_u64(Hpa(DATA)).unwrap(), 0x0102_0304_0506_0708);
        assert_eq!(r.gpr(3), 0x0102_0304, "{engine:?}: MOVD zero-extends");
        assert_eq!(r.gpr(1), 0x0506_0708);
        let fpu = r.cpu.state().fpu;
        assert_eq!(fpu.st[0], 0xffff_u128 << 64 | 0x0102_0304_0506_0708);
        assert_eq!((fpu.fsw >> 11) & 7, 0, "TOP");
        assert_eq!(fpu.ftw, 0xff, "all valid");
    }
    let mut r = rig(|a| {
        a.movq(mm0, rax).unwrap();
        a.emms().unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(run(&mut r), None);
    assert_eq!(r.cpu.state().fpu.ftw, 0, "EMMS: all empty");
    for (cr0_bits, fsw_es, want) in [(cr0::EM, false, 6), (cr0::TS, false, 7), (0, true, 16)] {
        let mut r = rig(|a| {
            a.movq(mm0, rax).unwrap();
            a.hlt().unwrap();
        });
        r.cpu.state_mut().cr0 |= cr0_bits;
        if fsw_es {
            let fpu = &mut r.cpu.state_mut().fpu;
            fpu.fcw &= !1; // IM clear
            fpu.fsw |= 1 | 0x80; // IE, ES
        }
        assert_eq!(run(&mut r), Some(want));
    }
}

/// A non-canonical memory operand through SS (based on RSP or RBP) is
/// #SS(0); through another segment #GP(0) (kvm-unit-tests' `emulator`
/// "non-canonical rsp-based access").
#[test]
fn non_canonical_stack_operands_are_ss_faults() {
    for engine in [machine::Engine::Interp, machine::Engine::Jit] {
        for (base, want) in [(rsp, 12), (rbp, 12), (rdx, 13)] {
            let mut r = rig(|a| {
                a.mov(rbp, STACK_TOP).unwrap();
                a.mov(rdx, STACK_TOP).unwrap();
                a.mov(rax, 0x8000_0000_0000_0000u64).unwrap();
                a.or(qword_ptr(base + rax), 0).unwrap();
                a.hlt().unwrap();
            })
            .with_engine(engine);
            assert_eq!(run(&mut r), Some(want), "{engine:?}");
        }
    }
}
