//! The software-VMX interface: every exit kind, every injection kind, the
//! CR3-target list, the TLB's flush rules, triple faults and determinism.

mod common;

use common::*;
use iced_x86::code_asm::*;
use machine::cpu::state::{cr0, Activity};
use machine::mmu::ept::epte;
use machine::vmx::{
    ept_qual, CrAccess, Eptp, EventInjection, EventKind, InveptKind, IoDirection, IpiDest, IpiMode,
    MsrExiting,
};
use machine::{Gpa, Gva, Hpa, VmExit};

const EPT_BASE: u64 = 0x0200_0000;

/// Identity EPT over all of memory with 2 MiB leaves; `perm(i)` gives the
/// R/W/X bits of leaf i (or any raw low bits for misconfig tests).
fn build_ept(rig: &Rig, perm: impl Fn(u64) -> u64) -> Eptp {
    let pml4 = EPT_BASE;
    let pdpt = EPT_BASE + 0x1000;
    let pd = EPT_BASE + 0x2000;
    let m = &rig.mem;
    m.write_u64(Hpa(pml4), pdpt | 7).unwrap();
    m.write_u64(Hpa(pdpt), pd | 7).unwrap();
    for i in 0..(MEM >> 21) {
        m.write_u64(
            Hpa(pd + i * 8),
            (i << 21) | epte::HUGE | epte::MEMTYPE_WB | perm(i),
        )
        .unwrap();
    }
    Eptp::new(Hpa(pml4), true)
}

#[test]
fn cpuid_exits_in_guest_mode_and_runs_natively_in_bare_mode() {
    let prog = |a: &mut CodeAssembler| {
        a.mov(eax, 0).unwrap();
        a.cpuid().unwrap();
        a.hlt().unwrap();
    };
    let mut bare = rig(prog);
    assert_eq!(bare.run(), VmExit::Hlt);
    assert_eq!(bare.gpr(3) as u32, u32::from_le_bytes(*b"Genu"));

    let mut g = rig(prog).guest(controls());
    assert_eq!(g.run(), VmExit::Cpuid);
    assert_eq!(g.cpu.state().rip, CODE + 5);
    assert_eq!(g.cpu.exit_instruction_len(), 2);
    g.cpu.skip_instruction();
    assert_eq!(g.run(), VmExit::Hlt);
    assert_eq!(
        g.cpu.state().rip,
        CODE + 7,
        "HLT exit leaves RIP at the HLT"
    );
}

#[test]
fn io_exits_and_completion() {
    let mut g = rig(|a| {
        a.mov(al, 0x42).unwrap();
        a.out(0x80, al).unwrap();
        a.mov(dx, 0x3f8).unwrap();
        a.in_(al, dx).unwrap();
        a.mov(bl, al).unwrap();
        a.hlt().unwrap();
    })
    .guest(controls());
    assert_eq!(
        g.run(),
        VmExit::Io {
            port: 0x80,
            size: 1,
            direction: IoDirection::Out,
            value: 0x42
        }
    );
    g.cpu.skip_instruction();
    let e = g.run();
    assert!(
        matches!(
            e,
            VmExit::Io {
                port: 0x3f8,
                size: 1,
                direction: IoDirection::In,
                ..
            }
        ),
        "{e:?}"
    );
    g.cpu.complete_io_in(1, 0x5a);
    assert_eq!(g.run(), VmExit::Hlt);
    assert_eq!(g.gpr(3) & 0xff, 0x5a);
}

#[test]
fn io_bitmap_lets_unlisted_ports_through() {
    let mut g = rig(|a| {
        a.out(0x80, al).unwrap();
        a.in_(al, 0x81).unwrap();
        a.out(0xf4, al).unwrap();
    })
    .guest(machine::VmxControls {
        io_exiting: Some(vec![0xf4]),
        ..controls()
    });
    let e = g.run();
    assert!(
        matches!(
            e,
            VmExit::Io {
                port: 0xf4,
                value: 0xff,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn msr_exits_and_bitmap_passthrough() {
    let prog = |a: &mut CodeAssembler| {
        a.mov(ecx, 0xc000_0082u32).unwrap(); // LSTAR
        a.mov(eax, 0x1234_5678).unwrap();
        a.mov(edx, 0xffff_8000u32).unwrap();
        a.wrmsr().unwrap();
        a.rdmsr().unwrap();
        a.hlt().unwrap();
    };
    let mut g = rig(prog).guest(controls());
    assert_eq!(
        g.run(),
        VmExit::MsrWrite {
            index: 0xc000_0082,
            value: 0xffff_8000_1234_5678
        }
    );
    g.cpu.skip_instruction();
    assert_eq!(g.run(), VmExit::MsrRead { index: 0xc000_0082 });
    g.cpu.complete_rdmsr(0xaaaa_bbbb_cccc_dddd);
    assert_eq!(g.run(), VmExit::Hlt);
    assert_eq!(g.gpr(0), 0xcccc_dddd);
    assert_eq!(g.gpr(2), 0xaaaa_bbbb);

    let mut g = rig(prog).guest(machine::VmxControls {
        msr_exiting: MsrExiting::Bitmap {
            read_passthrough: vec![0xc000_0082],
            write_passthrough: vec![0xc000_0082],
        },
        ..controls()
    });
    assert_eq!(g.run(), VmExit::Hlt);
    assert_eq!(g.cpu.state().lstar, 0xffff_8000_1234_5678);
}

#[test]
fn unknown_msr_is_gp_in_bare_mode() {
    let mut b = rig(|a| {
        a.mov(ecx, 0x1234_5678).unwrap();
        a.rdmsr().unwrap();
    });
    assert_eq!(b.run(), VmExit::Hlt);
    assert_eq!(b.gpr(15), HANDLER_MARK + 13);
}

#[test]
fn vmcall_exits_in_guest_mode_and_is_ud_in_bare_mode() {
    let prog = |a: &mut CodeAssembler| {
        a.vmcall().unwrap();
        a.hlt().unwrap();
    };
    let mut g = rig(prog).guest(controls());
    assert_eq!(g.run(), VmExit::Vmcall);
    assert_eq!(g.cpu.exit_instruction_len(), 3);
    let mut b = rig(prog);
    assert_eq!(b.run(), VmExit::Hlt);
    assert_eq!(b.gpr(15), HANDLER_MARK + 6);
}

#[test]
fn exception_bitmap_decides_between_exit_and_idt() {
    let prog = |a: &mut CodeAssembler| {
        a.ud2().unwrap();
    };
    let mut g = rig(prog).guest(machine::VmxControls {
        exception_bitmap: 1 << 6,
        ..controls()
    });
    assert_eq!(
        g.run(),
        VmExit::Exception {
            vector: 6,
            error_code: None,
            qualification: 0
        }
    );
    assert_eq!(g.cpu.state().rip, CODE);
    let mut g = rig(prog).guest(controls());
    assert_eq!(g.run(), VmExit::Hlt);
    assert_eq!(g.gpr(15), HANDLER_MARK + 6);
}

#[test]
fn page_fault_error_code_mask_and_match() {
    // 2 GiB is not mapped (PDPT entry 2 is empty).
    let prog = |a: &mut CodeAssembler| {
        a.mov(rax, 0x8000_0000u64).unwrap();
        a.mov(rbx, qword_ptr(rax)).unwrap();
    };
    // Bit set, mask 0 / match 0: every #PF exits; CR2 untouched.
    let mut g = rig(prog).guest(machine::VmxControls {
        exception_bitmap: 1 << 14,
        ..controls()
    });
    assert_eq!(
        g.run(),
        VmExit::Exception {
            vector: 14,
            error_code: Some(0),
            qualification: 0x8000_0000
        }
    );
    assert_eq!(g.cpu.state().cr2, 0);
    // Bit set, but only present-bit faults match: this one goes to the guest.
    let mut g = rig(prog).guest(machine::VmxControls {
        exception_bitmap: 1 << 14,
        pf_error_code_mask: 1,
        pf_error_code_match: 1,
        ..controls()
    });
    assert_eq!(g.run(), VmExit::Hlt);
    assert_eq!(g.gpr(15), HANDLER_MARK + 14);
    assert_eq!(g.cpu.state().cr2, 0x8000_0000);
    let stack_ptr = g.cpu.state().gpr[4];
    assert_eq!(
        g.mem.read_u64(Hpa(stack_ptr)).unwrap(),
        0,
        "error code: not present, read, supervisor"
    );
    assert_eq!(
        g.mem.read_u64(Hpa(stack_ptr + 8)).unwrap(),
        CODE + 10,
        "faulting RIP"
    );
}

#[test]
fn user_write_to_supervisor_page_error_code() {
    // Make the 2 MiB page at DATA supervisor-only, then write from ring 3.
    let mut g = rig(|a| {
        a.mov(rax, DATA).unwrap();
        a.mov(qword_ptr(rax), rbx).unwrap();
    })
    .guest(machine::VmxControls {
        exception_bitmap: 1 << 14,
        ..controls()
    });
    let pde = PD + (DATA >> 21) * 8;
    let v = g.mem.read_u64(Hpa(pde)).unwrap();
    g.mem.write_u64(Hpa(pde), v & !4).unwrap();
    g.enter_user_mode();
    assert_eq!(
        g.run(),
        VmExit::Exception {
            vector: 14,
            error_code: Some(0b111),
            qualification: DATA
        }
    );
}

#[test]
fn cr0_guest_host_mask_and_read_shadow() {
    let mut g = rig(|a| {
        a.mov(rax, cr0).unwrap();
        a.mov(rbx, rax).unwrap();
        a.and(rax, !(cr0::TS as i32)).unwrap();
        a.mov(cr0, rax).unwrap();
        a.hlt().unwrap();
    })
    .guest(machine::VmxControls {
        cr0_guest_host_mask: cr0::TS,
        cr0_read_shadow: cr0::TS,
        ..controls()
    });
    let e = g.run();
    // The guest read TS=1 from the shadow, cleared it: a change of a
    // host-owned bit relative to the shadow exits.
    let real = g.cpu.state().cr0;
    assert_eq!(real & cr0::TS, 0);
    assert_eq!(g.gpr(3) & cr0::TS, cr0::TS, "guest sees the shadow");
    match e {
        VmExit::CrAccess(CrAccess::MovTo {
            cr: 0,
            gpr: 0,
            value,
        }) => assert_eq!(value & cr0::TS, 0),
        e => panic!("{e:?}"),
    }
}

#[test]
fn cr3_target_list_hit_does_not_exit_and_miss_exits() {
    let prog = |a: &mut CodeAssembler| {
        a.mov(rax, PML4).unwrap();
        a.mov(cr3, rax).unwrap();
        a.mov(rbx, PML4 + 0x10_0000).unwrap();
        a.mov(cr3, rbx).unwrap();
        a.hlt().unwrap();
    };
    let mut g = rig(prog).guest(machine::VmxControls {
        cr3_load_exiting: true,
        cr3_targets: vec![0x9000, PML4],
        ..controls()
    });
    let e = g.run();
    assert_eq!(
        e,
        VmExit::CrAccess(CrAccess::MovTo {
            cr: 3,
            gpr: 3,
            value: PML4 + 0x10_0000
        })
    );
    assert_eq!(
        g.cpu.state().cr3,
        PML4,
        "the listed value loaded without an exit"
    );
    assert_eq!(g.cpu.stats().vm_exits, 1);
}

#[test]
fn cr3_store_and_cr8_exiting() {
    let mut g = rig(|a| {
        a.mov(rax, cr3).unwrap();
    })
    .guest(machine::VmxControls {
        cr3_store_exiting: true,
        ..controls()
    });
    assert_eq!(
        g.run(),
        VmExit::CrAccess(CrAccess::MovFrom { cr: 3, gpr: 0 })
    );
    let mut g = rig(|a| {
        a.mov(eax, 5).unwrap();
        a.mov(cr8, rax).unwrap();
    })
    .guest(machine::VmxControls {
        cr8_exiting: true,
        ..controls()
    });
    assert_eq!(
        g.run(),
        VmExit::CrAccess(CrAccess::MovTo {
            cr: 8,
            gpr: 0,
            value: 5
        })
    );
}

#[test]
fn invlpg_and_rdtsc_exiting_and_tsc_offset() {
    let mut g = rig(|a| {
        a.invlpg(byte_ptr(0x1000u64)).unwrap();
    })
    .guest(machine::VmxControls {
        invlpg_exiting: true,
        ..controls()
    });
    assert_eq!(g.run(), VmExit::Invlpg { gva: Gva(0x1000) });

    let prog = |a: &mut CodeAssembler| {
        a.rdtsc().unwrap();
        a.hlt().unwrap();
    };
    let mut g = rig(prog).guest(machine::VmxControls {
        rdtsc_exiting: true,
        ..controls()
    });
    assert_eq!(g.run(), VmExit::Rdtsc { rdtscp: false });
    let mut g = rig(prog).guest(machine::VmxControls {
        tsc_offset: 1 << 40,
        ..controls()
    });
    assert_eq!(g.run(), VmExit::Hlt);
    let tsc = (g.gpr(2) << 32) | g.gpr(0);
    assert!(tsc >= 1 << 40 && tsc < (1 << 40) + g.cpu.cycles());
}

#[test]
fn external_interrupts_exit_or_go_to_the_guest() {
    let prog = |a: &mut CodeAssembler| {
        a.sti().unwrap();
        a.nop().unwrap();
        a.jmp(CODE + 1).unwrap();
    };
    let mut g = rig(prog).guest(machine::VmxControls {
        external_interrupt_exiting: true,
        ..controls()
    });
    g.cpu.post_external_interrupt(0x30);
    assert_eq!(g.run(), VmExit::ExternalInterrupt { vector: 0x30 });
    assert_eq!(
        g.cpu.state().rip,
        CODE,
        "exits before any instruction, IF or not"
    );

    let mut g = rig(prog).guest(controls());
    g.cpu.post_external_interrupt(0x30);
    assert_eq!(g.run(), VmExit::Hlt);
    assert_eq!(g.gpr(15), HANDLER_MARK + 0x30);
}

#[test]
fn interrupt_window_exit_respects_sti_blocking() {
    let mut g = rig(|a| {
        a.sti().unwrap();
        a.nop().unwrap();
        a.hlt().unwrap();
    })
    .guest(machine::VmxControls {
        interrupt_window_exiting: true,
        ..controls()
    });
    assert_eq!(g.run(), VmExit::InterruptWindow);
    assert_eq!(
        g.cpu.state().rip,
        CODE + 2,
        "the instruction after STI runs first"
    );
}

/// NMI-window exiting: no exit while NMIs are blocked (an NMI handler
/// before its IRET), and none inside an STI shadow (an NMI is not taken
/// there: kvm-unit-tests' `apic` "nmi-after-sti").
#[test]
fn nmi_window_exit_waits_for_nmi_unblocking_and_the_sti_shadow() {
    let prog = |a: &mut CodeAssembler| {
        a.nop().unwrap();
        a.nop().unwrap();
        a.hlt().unwrap();
    };
    let nmi_window = || machine::VmxControls {
        nmi_window_exiting: true,
        ..controls()
    };
    let mut g = rig(prog).guest(nmi_window());
    g.cpu.state_mut().nmi_blocked = true;
    assert_eq!(g.run(), VmExit::Hlt);

    let mut g = rig(prog).guest(nmi_window());
    g.cpu.state_mut().interruptibility = machine::cpu::state::interruptibility::STI;
    assert_eq!(g.run(), VmExit::NmiWindow);
    assert_eq!(
        g.cpu.state().rip,
        CODE + 1,
        "the instruction in the shadow runs first"
    );

    let mut g = rig(prog).guest(nmi_window());
    assert_eq!(g.run(), VmExit::NmiWindow);
    assert_eq!(g.cpu.state().rip, CODE);
}

/// An instruction the hypervisor emulates under RFLAGS.TF single-steps
/// too: skipping it queues the #DB trap (KVM's
/// kvm_skip_emulated_instruction; kvm-unit-tests' debug "Single-step #DB
/// on emulated instructions").
#[test]
fn skipping_an_emulated_instruction_under_tf_queues_a_debug_trap() {
    let mut g = rig(|a| {
        a.cpuid().unwrap();
        a.hlt().unwrap();
    })
    .guest(controls());
    g.cpu.state_mut().rflags |= machine::cpu::state::rflags::TF;
    assert_eq!(g.run(), VmExit::Cpuid);
    assert_eq!(g.cpu.pending_injection(), None);
    g.cpu.skip_instruction();
    let event = g.cpu.pending_injection().expect("a #DB is queued");
    assert_eq!(
        (event.kind, event.vector),
        (EventKind::HardwareException, 1)
    );
    assert_ne!(
        g.cpu.state().debug.dr6 & machine::cpu::debug_regs::DR6_BS,
        0
    );
}

#[test]
fn triple_fault_is_a_shutdown_exit() {
    for guest in [false, true] {
        let mut r = rig(|a| {
            a.ud2().unwrap();
        });
        r.cpu.state_mut().idtr.limit = 0;
        if guest {
            r = r.guest(controls());
        }
        assert_eq!(r.run(), VmExit::TripleFault);
        assert_eq!(r.cpu.state().activity, Activity::Shutdown);
        assert_eq!(r.run(), VmExit::TripleFault, "a shut-down CPU stays down");
    }
}

#[test]
fn double_fault_goes_through_ist() {
    // #PF whose delivery hits a non-present stack -> #DF on IST1.
    let mut r = rig(|a| {
        a.mov(rsp, 0x8000_1000u64).unwrap();
        a.mov(rax, qword_ptr(0x8000_0000u64)).unwrap();
    });
    // IDT entry 8 uses IST1.
    let e = IDT + 8 * 16;
    let lo = r.mem.read_u64(Hpa(e)).unwrap();
    r.mem.write_u64(Hpa(e), lo | (1 << 32)).unwrap();
    assert_eq!(r.run(), VmExit::Hlt);
    assert_eq!(r.gpr(15), HANDLER_MARK + 8);
    assert_eq!(
        r.cpu.state().gpr[4],
        IST1 - 48,
        "frame with error code on IST1"
    );
}

#[test]
fn each_injection_kind() {
    let prog = |a: &mut CodeAssembler| {
        a.hlt().unwrap();
    };
    let cases = [
        (EventKind::ExternalInterrupt, 0x40u8, None, 0u8, CODE),
        (EventKind::Nmi, 2, None, 0, CODE),
        (EventKind::HardwareException, 13, Some(0x18u32), 0, CODE),
        (EventKind::HardwareException, 6, None, 0, CODE),
        (EventKind::SoftwareInterrupt, 0x80, None, 2, CODE + 2),
    ];
    for (kind, vector, error_code, len, ret) in cases {
        let mut g = rig(prog).guest(controls());
        g.cpu.inject_event(EventInjection {
            kind,
            vector,
            error_code,
            instruction_len: len,
        });
        assert_eq!(g.run(), VmExit::Hlt);
        assert_eq!(g.gpr(15), HANDLER_MARK + vector as u64, "{kind:?}");
        let stack_ptr = g.cpu.state().gpr[4];
        let mut frame_at = stack_ptr;
        if let Some(code) = error_code {
            assert_eq!(g.mem.read_u64(Hpa(stack_ptr)).unwrap(), code as u64);
            frame_at += 8;
        }
        assert_eq!(
            g.mem.read_u64(Hpa(frame_at)).unwrap(),
            ret,
            "{kind:?} return RIP"
        );
        assert!(g.cpu.pending_injection().is_none());
    }
}

#[test]
fn injected_page_fault_keeps_the_cr2_set_by_the_hypervisor() {
    let mut g = rig(|a| {
        a.hlt().unwrap();
    })
    .guest(controls());
    g.cpu.state_mut().cr2 = 0xdead_b000;
    g.cpu.inject_event(EventInjection {
        kind: EventKind::HardwareException,
        vector: 14,
        error_code: Some(2),
        instruction_len: 0,
    });
    assert_eq!(g.run(), VmExit::Hlt);
    assert_eq!(g.gpr(15), HANDLER_MARK + 14);
    assert_eq!(g.cpu.state().cr2, 0xdead_b000);
}

#[test]
fn ept_violation_qualification_and_fix_up() {
    const RO: u64 = 0x60_0000; // third 2 MiB page: read-only in EPT
    const NP: u64 = 0x80_0000; // fourth: not present
    let prog = |a: &mut CodeAssembler| {
        a.mov(rax, qword_ptr(RO)).unwrap();
        a.mov(qword_ptr(RO), rbx).unwrap();
        a.mov(rcx, qword_ptr(NP + 8)).unwrap();
        a.hlt().unwrap();
    };
    let mut g = rig(prog);
    let eptp = build_ept(&g, |i| match i {
        3 => epte::READ,
        4 => 0,
        _ => epte::READ | epte::WRITE | epte::EXEC,
    });
    let mut g2 = g.guest(machine::VmxControls {
        ept: Some(eptp),
        ..controls()
    });
    g = std::mem::replace(&mut g2, rig(|_| {}));
    let e = g.run();
    assert_eq!(
        e,
        VmExit::EptViolation {
            gpa: Gpa(RO),
            gla: Some(Gva(RO)),
            qualification: ept_qual::WRITE
                | ept_qual::READABLE
                | ept_qual::GLA_VALID
                | ept_qual::GLA_TRANSLATED
        }
    );
    // The hv makes it writable, flushes, resumes.
    let pde = EPT_BASE + 0x2000 + 3 * 8;
    let v = g.mem.read_u64(Hpa(pde)).unwrap();
    g.mem.write_u64(Hpa(pde), v | epte::WRITE).unwrap();
    g.cpu.invept(InveptKind::SingleContext(eptp));
    let e = g.run();
    assert_eq!(
        e,
        VmExit::EptViolation {
            gpa: Gpa(NP + 8),
            gla: Some(Gva(NP + 8)),
            qualification: ept_qual::READ | ept_qual::GLA_VALID | ept_qual::GLA_TRANSLATED
        }
    );
    let pde = EPT_BASE + 0x2000 + 4 * 8;
    let v = g.mem.read_u64(Hpa(pde)).unwrap();
    g.mem.write_u64(Hpa(pde), v | epte::READ).unwrap();
    g.cpu.invept(InveptKind::Global);
    assert_eq!(g.run(), VmExit::Hlt);
}

/// Where the PML tests keep the log (above the EPT tables).
const PML_PAGE: u64 = 0x0210_0000;

#[test]
fn pml_full_exit_stops_the_write_until_the_log_is_reset() {
    use machine::vmx::PML_HEAD_INDEX;
    // Three writes to three 2 MiB EPT leaves (3, 4, 5) that nothing else
    // touches; the log has room for three entries (index 2), and the
    // first entry is the guest page-table page the first walk dirties.
    let prog = |a: &mut CodeAssembler| {
        a.mov(qword_ptr(0x60_0008u64), rbx).unwrap();
        a.mov(qword_ptr(0x80_0010u64), rbx).unwrap();
        a.mov(qword_ptr(0xa0_0018u64), rbx).unwrap();
        a.hlt().unwrap();
    };
    let g = rig(prog);
    let eptp = build_ept(&g, |_| 7);
    let mut g = g.guest(machine::VmxControls {
        ept: Some(eptp),
        pml_address: Some(Hpa(PML_PAGE)),
        pml_index: 2,
        ..controls()
    });
    let entry = |g: &Rig, i: u64| g.mem.read_u64(Hpa(PML_PAGE + 8 * i)).unwrap();
    let leaf5 = EPT_BASE + 0x2000 + 5 * 8;
    assert_eq!(g.run(), VmExit::PmlFull);
    // Entry 2: the PML4's page (the fetch's walk, a write with EPT A/D);
    // then the first two stores, each at its 4 KiB-aligned gpa.
    assert_eq!(
        [entry(&g, 2), entry(&g, 1), entry(&g, 0)],
        [PML4, 0x60_0000, 0x80_0000]
    );
    assert_eq!(g.cpu.vmx().unwrap().pml_index, 0xffff);
    assert_eq!(g.cpu.stats().pml_entries_logged, 3);
    // The third store did not happen: RIP at it, its leaf untouched.
    let third = g.cpu.state().rip;
    assert_eq!(
        g.mem.read_u64(Hpa(leaf5)).unwrap() & (epte::ACCESSED | epte::DIRTY),
        0
    );
    // The VMM drains the log and resets the index: the store runs and logs.
    g.cpu.vmx_mut().unwrap().pml_index = PML_HEAD_INDEX;
    assert_eq!(g.run(), VmExit::Hlt);
    assert!(g.cpu.state().rip > third);
    assert_eq!(entry(&g, 511), 0xa0_0000);
    assert_eq!(g.cpu.vmx().unwrap().pml_index, PML_HEAD_INDEX - 1);
    assert_eq!(g.cpu.stats().pml_entries_logged, 4);
}

#[test]
fn pml_logs_nothing_with_ept_ad_off_and_costs_its_writes() {
    let prog = |a: &mut CodeAssembler| {
        a.mov(qword_ptr(0x60_0008u64), rbx).unwrap();
        a.mov(qword_ptr(0x80_0010u64), rbx).unwrap();
        a.hlt().unwrap();
    };
    let run = |ad: bool, pml: bool| {
        let g = rig(prog);
        let mut eptp = build_ept(&g, |_| 7);
        if !ad {
            eptp = Eptp::new(eptp.pml4(), false);
        }
        let mut g = g.guest(machine::VmxControls {
            ept: Some(eptp),
            pml_address: pml.then_some(Hpa(PML_PAGE)),
            ..controls()
        });
        assert_eq!(g.run(), VmExit::Hlt);
        (
            g.cpu.stats().pml_entries_logged,
            g.cpu.vmx().unwrap().pml_index,
            g.cpu.cycles(),
        )
    };
    let head = machine::vmx::PML_HEAD_INDEX;
    let (off_logged, off_index, off_cycles) = run(false, true);
    assert_eq!((off_logged, off_index), (0, head), "A/D off: no logging");
    let (logged, index, cycles) = run(true, true);
    assert_eq!((logged, index), (3, head - 3));
    let (_, _, no_pml_cycles) = run(true, false);
    assert_eq!(
        cycles - no_pml_cycles,
        3 * machine::CycleCosts::DEFAULT.pml_log_write,
        "each entry costs one log write"
    );
    assert!(off_cycles > 0);
}

#[test]
fn ept_misconfig() {
    let mut g = rig(|a| {
        a.mov(rax, qword_ptr(0x60_0000u64)).unwrap();
    });
    let eptp = build_ept(&g, |i| if i == 3 { epte::WRITE } else { 7 });
    g.cpu.set_vmx(Some(machine::VmxControls {
        ept: Some(eptp),
        ..controls()
    }));
    assert_eq!(
        g.run(),
        VmExit::EptMisconfig {
            gpa: Gpa(0x60_0000)
        }
    );
}

#[test]
fn intercepted_page_fault_during_page_fault_delivery_exits_instead_of_double_faulting() {
    // A #PF whose delivery pushes onto an unmapped stack: with #PF in the
    // exception bitmap the second #PF exits (a shadow MMU fixes the stack
    // and re-injects the first); no #DF.
    let mut g = rig(|a| {
        a.hlt().unwrap();
    })
    .guest(machine::VmxControls {
        exception_bitmap: 1 << 14,
        ..controls()
    });
    g.cpu.state_mut().gpr[4] = 0x8000_1000;
    let ev = EventInjection {
        kind: EventKind::HardwareException,
        vector: 14,
        error_code: Some(2),
        instruction_len: 0,
    };
    g.cpu.inject_event(ev);
    let e = g.run();
    assert!(
        matches!(
            e,
            VmExit::Exception {
                vector: 14,
                qualification: 0x8000_0ff8,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(g.cpu.idt_vectoring_info(), Some(ev));
}

#[test]
fn ept_violation_during_interrupt_delivery_records_idt_vectoring() {
    let mut g = rig(|a| {
        a.hlt().unwrap();
    });
    // Stack page not present in EPT.
    let eptp = build_ept(&g, |i| if i == 0 { 0 } else { 7 });
    // Put code and handlers in page 0 but the stack in page 0 too: use a
    // stack in the not-present 2 MiB page 0? Code is there too, so instead
    // make page 0 present and the stack page (RSP in page 1) absent.
    let eptp = {
        let _ = eptp;
        build_ept(&g, |i| if i == 1 { 0 } else { 7 })
    };
    g.cpu.state_mut().gpr[4] = 0x30_0000;
    g.cpu.set_vmx(Some(machine::VmxControls {
        ept: Some(eptp),
        ..controls()
    }));
    let ev = EventInjection {
        kind: EventKind::ExternalInterrupt,
        vector: 0x41,
        error_code: None,
        instruction_len: 0,
    };
    g.cpu.inject_event(ev);
    let e = g.run();
    assert!(matches!(e, VmExit::EptViolation { .. }), "{e:?}");
    assert_eq!(g.cpu.idt_vectoring_info(), Some(ev));
    assert_eq!(g.cpu.state().rip, CODE, "nothing committed");
}

#[test]
fn stale_tlb_entry_after_a_missing_flush() {
    const A: u64 = 0x60_0000;
    const B: u64 = 0x80_0000;
    let mut r = rig(|a| {
        a.mov(rax, qword_ptr(A)).unwrap();
        // Remap A's 2 MiB page to B's frame without flushing.
        a.mov(rdx, B | 0x87).unwrap();
        a.mov(qword_ptr(PD + (A >> 21) * 8), rdx).unwrap();
        a.mov(rbx, qword_ptr(A)).unwrap();
        a.invlpg(byte_ptr(A)).unwrap();
        a.mov(rcx, qword_ptr(A)).unwrap();
        a.hlt().unwrap();
    });
    r.mem.write_u64(Hpa(A), 0xaaaa).unwrap();
    r.mem.write_u64(Hpa(B), 0xbbbb).unwrap();
    assert_eq!(r.run(), VmExit::Hlt);
    assert_eq!(r.gpr(0), 0xaaaa);
    assert_eq!(r.gpr(3), 0xaaaa, "stale translation used");
    assert_eq!(r.gpr(1), 0xbbbb, "fresh after INVLPG");
}

#[test]
fn ipi_to_another_cpu_exits_after_the_write() {
    let mut r = rig(|a| {
        a.mov(ecx, 0x80f).unwrap(); // SVR: software enable
        a.mov(eax, 0x1ff).unwrap();
        a.xor(edx, edx).unwrap();
        a.wrmsr().unwrap();
        a.mov(ecx, 0x830).unwrap(); // ICR
        a.mov(eax, 0x4041).unwrap(); // fixed, level assert, vector 0x41
        a.mov(edx, 1).unwrap(); // destination APIC 1
        a.wrmsr().unwrap();
        a.hlt().unwrap();
    });
    let e = r.run();
    match e {
        VmExit::Ipi(ipi) => {
            assert_eq!(ipi.dest, IpiDest::Physical(1));
            assert_eq!(ipi.vector, 0x41);
            assert_eq!(ipi.mode, IpiMode::Fixed);
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(
        r.run(),
        VmExit::Hlt,
        "the write completed; execution goes on"
    );
}

#[test]
fn apic_timer_wakes_a_halted_cpu() {
    let mut r = rig(|a| {
        a.mov(ecx, 0x80f).unwrap();
        a.mov(eax, 0x1ff).unwrap();
        a.xor(edx, edx).unwrap();
        a.wrmsr().unwrap();
        a.mov(ecx, 0x83e).unwrap(); // divide by 1
        a.mov(eax, 0xb).unwrap();
        a.wrmsr().unwrap();
        a.mov(ecx, 0x832).unwrap(); // LVT timer: one-shot, vector 0x40
        a.mov(eax, 0x40).unwrap();
        a.wrmsr().unwrap();
        a.mov(ecx, 0x838).unwrap(); // initial count
        a.mov(eax, 100_000).unwrap();
        a.wrmsr().unwrap();
        a.sti().unwrap();
        a.hlt().unwrap();
        a.ud2().unwrap();
    });
    assert_eq!(r.run(), VmExit::Hlt);
    assert_eq!(r.gpr(15), HANDLER_MARK + 0x40);
    assert!(
        r.cpu.cycles() >= 100_000,
        "idle time skipped to the deadline"
    );
    assert!(r.cpu.stats().instructions < 50, "without spinning");
}

#[test]
fn cycle_limit_stops_an_endless_loop() {
    let mut r = rig(|a| {
        a.jmp(CODE).unwrap();
    });
    assert_eq!(r.cpu.run(&r.mem, 5000), VmExit::CycleLimit);
    assert!(r.cpu.cycles() >= 5000);
}

#[test]
fn access_outside_machine_memory_is_a_machine_error() {
    let mut r = rig(|a| {
        a.mov(rax, qword_ptr(0xc000_0000u64)).unwrap();
    });
    // PDPT entry 3: a 1 GiB page at 4 GiB, far outside 64 MiB of memory.
    r.mem
        .write_u64(Hpa(PDPT + 3 * 8), 0x1_0000_0000 | 0x87)
        .unwrap();
    let e = r.run();
    assert!(matches!(e, VmExit::MachineError(_)), "{e:?}");
    assert_eq!(r.cpu.state().rip, CODE);
}

#[test]
fn syscall_sysret_round_trip() {
    // LSTAR -> handler at CODE+0x800 that returns with sysretq.
    let mut r = rig(|a| {
        let mut user = a.create_label();
        let mut handler = a.create_label();
        a.mov(ecx, 0xc000_0081u32).unwrap(); // STAR
        a.xor(eax, eax).unwrap();
        a.mov(edx, 0x0013_0008).unwrap(); // sysret base 0x13 -> ss 0x1b, cs 0x23
        a.wrmsr().unwrap();
        a.mov(ecx, 0xc000_0082u32).unwrap(); // LSTAR
        a.lea(rax, ptr(handler)).unwrap();
        a.mov(rdx, rax).unwrap();
        a.shr(rdx, 32).unwrap();
        a.wrmsr().unwrap();
        // Enter ring 3 via sysret.
        a.lea(rcx, ptr(user)).unwrap();
        a.mov(r11d, 0x202).unwrap();
        a.sysretq().unwrap();
        a.set_label(&mut user).unwrap();
        a.mov(r12, 7u64).unwrap();
        a.syscall().unwrap();
        a.hlt().unwrap(); // CPL3: #GP -> handler 13
        a.set_label(&mut handler).unwrap();
        a.mov(r13, rcx).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(r.run(), VmExit::Hlt);
    assert_eq!(r.gpr(12), 7);
    assert_eq!(r.cpu.state().cpl(), 0);
    assert_eq!(r.cpu.state().cs.selector, 0x08);
    assert_ne!(r.gpr(13), 0, "RCX holds the user return address");
}

#[test]
fn same_program_same_cycles_and_state() {
    let prog = |a: &mut CodeAssembler| {
        let mut top = a.create_label();
        a.mov(rcx, 20_000u64).unwrap();
        a.mov(rsi, DATA).unwrap();
        a.xor(eax, eax).unwrap();
        a.set_label(&mut top).unwrap();
        a.imul_3(rdx, rcx, 0x9e37).unwrap();
        a.xor(rax, rdx).unwrap();
        a.mov(rbx, rcx).unwrap();
        a.and(rbx, 0xfff).unwrap();
        a.add(qword_ptr(rsi + rbx * 8), rax).unwrap();
        a.dec(rcx).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    };
    let run = |engine: machine::Engine| {
        let mut r = rig(prog);
        r.cpu.set_engine(engine);
        assert_eq!(r.run(), VmExit::Hlt);
        let mut page = vec![0u8; 0x8000];
        r.mem.read_bytes(Hpa(DATA), &mut page).unwrap();
        let mut h = machine::cpu::state::Fnv::default();
        h.bytes(&page);
        (
            r.cpu.cycles(),
            r.cpu.state_digest(),
            h.finish(),
            r.cpu.stats().instructions,
        )
    };
    let a = run(machine::Engine::Interp);
    let b = run(machine::Engine::Interp);
    assert_eq!(a, b);
    assert_eq!(a.3, 3 + 20_000 * 7 + 1);
    // The translator gives the same cycles, state and memory.
    let c = run(machine::Engine::Jit);
    assert_eq!(a, c, "interp vs jit");
    assert_eq!(c, run(machine::Engine::Jit));
}
