use super::*;
use crate::image as boot;
use crate::vm::VmConfig;
use machine::Gpa;

const CODE: u64 = 0x10_0000;

/// A VM whose vCPU 0 runs `cli; 1: hlt; jmp 1b` (no guest kernel: the
/// boot page tables, the GDT and four bytes of code).
fn halting_vm(vcpus: u32) -> Vm {
    halting_vm_with(vcpus, crate::mmu::MmuMode::Ept)
}

fn halting_vm_with(vcpus: u32, mmu: crate::mmu::MmuMode) -> Vm {
    let mut vm = crate::vm::bare_vm(&VmConfig {
        vcpus,
        mem_size: 4 << 20,
        mmu,
        ..VmConfig::default()
    });
    vm.write_guest(Gpa(CODE), &[0xfa, 0xf4, 0xeb, 0xfd])
        .unwrap();
    vm.start_vcpu(VcpuId(0), CODE, boot::BOOT_STACK_TOP, 0);
    vm
}

/// A VM whose `vcpus` vCPUs all spin (`jmp .`) on `host_cpus` host
/// CPUs with 1 ms slices.
fn spinning_vm(vcpus: u32, host_cpus: u32) -> Vm {
    let mut vm = crate::vm::bare_vm(&VmConfig {
        vcpus,
        mem_size: 4 << 20,
        host_cpus: Some(host_cpus),
        host_slice: 3_000_000,
        ..VmConfig::default()
    });
    vm.write_guest(Gpa(CODE), &[0xeb, 0xfe]).unwrap();
    for i in 0..vcpus as usize {
        vm.start_vcpu(VcpuId(i), CODE, boot::BOOT_STACK_TOP, 0);
    }
    vm
}

#[test]
fn fewer_host_cpus_are_shared_fairly_and_the_wait_is_steal() {
    let run = || {
        let mut vm = spinning_vm(3, 2);
        assert_eq!(vm.run_until(Cycles(60_000_000)), RunStatus::Running);
        vm
    };
    let vm = run();
    let now = vm.time().0;
    let slice = 3_000_000;
    let mut busy_total = 0;
    for v in &vm.vcpus {
        let s = &v.stats;
        // Every cycle of its clock was either run or waited for.
        assert_eq!(s.busy_cycles + s.steal_cycles + s.idle_cycles, v.clock().0);
        assert_eq!(s.idle_cycles, 0, "spinning vCPUs never idle");
        // Two host CPUs for three vCPUs: each runs about 2/3 of the
        // time, within a slice.
        assert!(
            s.busy_cycles.abs_diff(2 * now / 3) <= slice,
            "vcpu {}: {} busy of {now}",
            v.id,
            s.busy_cycles
        );
        assert!(s.preemptions > 0);
        busy_total += s.busy_cycles;
    }
    assert!(
        busy_total <= 2 * (now + vm.sched.quantum.0),
        "at most 2 run at a time"
    );
    // Deterministic.
    let again = run();
    for (a, b) in vm.vcpus.iter().zip(&again.vcpus) {
        assert_eq!(a.stats, b.stats);
    }
    // One host CPU each: no steal.
    let mut dedicated = spinning_vm(3, 3);
    dedicated.run_until(Cycles(6_000_000));
    assert!(dedicated.sched.host.is_none());
    assert!(dedicated.vcpus.iter().all(|v| v.stats.steal_cycles == 0));
}

#[test]
fn a_halted_vcpu_holds_no_host_cpu() {
    // vCPU 0 halts for good; vCPUs 1 and 2 spin on 2 host CPUs and
    // never wait.
    let mut vm = spinning_vm(3, 2);
    vm.write_guest(Gpa(CODE + 0x100), &[0xfa, 0xf4, 0xeb, 0xfd])
        .unwrap();
    vm.vcpus[0].cpu.state_mut().rip = CODE + 0x100;
    vm.run_until(Cycles(30_000_000));
    assert_eq!(vm.vcpus[0].run, RunState::Halted);
    for v in &vm.vcpus[1..] {
        // At most the first slice, before vCPU 0 halted, was shared.
        assert!(
            v.stats.steal_cycles <= 3_000_000,
            "{}",
            v.stats.steal_cycles
        );
    }
}

#[test]
fn nothing_left_to_wake_stops_the_vm_instead_of_spinning() {
    let mut vm = halting_vm(2);
    match vm.run() {
        StopReason::Error(VmError::AllHalted { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(vm.vcpus[0].stats.halts, 1);
    assert_eq!(vm.vcpus[1].run, RunState::WaitingForStart);
}

#[test]
fn a_kick_wakes_a_halted_vcpu_no_earlier_than_the_sender_clock() {
    let mut vm = halting_vm(1);
    let at = Cycles(5_000_000);
    vm.shared.cross.push(CrossRequest::Kick {
        target: VcpuId(0),
        at,
    });
    vm.carry_out_cross_requests();
    assert!(!vm.vcpus[0].kicked, "in flight");
    assert_eq!(vm.run_until(at), RunStatus::Running);
    assert_eq!(vm.vcpus[0].run, RunState::Halted);
    assert!(!vm.vcpus[0].can_wake());
    // It lands at the send time plus its latency, not before.
    let landed = at + Cycles(vm.shared.host.costs.ipi_latency());
    assert_eq!(vm.run_until(landed), RunStatus::Running);
    assert_eq!(vm.vcpus[0].run, RunState::Halted);
    assert!(!vm.vcpus[0].kicked);
    assert_eq!(vm.run_until(landed + Cycles(1)), RunStatus::Running);
    assert!(vm.vcpus[0].clock() >= landed, "woken at the landing");
    // It wakes, runs, halts again; then nothing is left to wake it.
    let status = vm.run_until(vm.time() + Cycles(6_000_000));
    assert!(
        matches!(
            status,
            RunStatus::Stopped(StopReason::Error(VmError::AllHalted { .. }))
        ),
        "{status:?}"
    );
    assert_eq!(vm.vcpus[0].stats.halts, 2);
    assert!(vm.vcpus[0].clock() >= at, "not before the kick was sent");
    assert!(!vm.vcpus[0].kicked, "a wake-up consumes the kick");
}

#[test]
fn a_kick_sent_before_the_hlt_survives_an_apf_halt_and_a_page_in_and_ends_the_hlt() {
    // Linux's `kvm_wait` halts with interrupts off; the lock holder may
    // kick before the waiter reaches its HLT, and the waiter may block
    // in the hv on a page on the way (the boot stall with PV send-IPI).
    let mut vm = halting_vm(1);
    vm.shared.cross.push(CrossRequest::Kick {
        target: VcpuId(0),
        at: Cycles::ZERO,
    });
    vm.carry_out_cross_requests();
    vm.deliver_next();
    let Vm { vcpus, sched, .. } = &mut vm;
    let vcpu = &mut vcpus[0];
    vcpu.run = RunState::ApfHalted;
    assert!(!vcpu.can_wake(), "a kick does not end an APF halt");
    sched.set_runnable(vcpu);
    vcpu.run = RunState::Stalled {
        until: Cycles::ZERO,
        slot: crate::swap::SwapSlot(0),
    };
    sched.set_runnable(vcpu);
    assert!(vcpu.kicked, "still pending for the HLT");
    // `cli; hlt`: the kick ends the first HLT, the second stays.
    match vm.run() {
        StopReason::Error(VmError::AllHalted { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(vm.vcpus[0].stats.halts, 2);
    assert!(!vm.vcpus[0].kicked, "the HLT's wake-up consumed it");
}

#[test]
fn an_nmi_ipi_wakes_a_vcpu_halted_with_interrupts_off() {
    // Linux's RCU stall detector NMIs a CPU that may sit in `kvm_wait`'s
    // HLT with IF = 0.
    let mut vm = halting_vm(2);
    assert!(matches!(
        vm.run(),
        StopReason::Error(VmError::AllHalted { .. })
    ));
    assert_eq!(vm.vcpus[0].run, RunState::Halted);
    assert!(!vm.vcpus[0].can_wake());
    let nmi = |dest| CrossRequest::Ipi {
        sender_apic: 1,
        ipi: machine::vmx::Ipi {
            dest: machine::vmx::IpiDest::Physical(dest),
            vector: 0,
            mode: IpiMode::Nmi,
            level_assert: true,
            trigger_level: false,
        },
        at: Cycles(20_000),
    };
    // vCPU 1 waits for SIPI: it takes none.
    vm.shared.cross.extend([nmi(0), nmi(1)]);
    vm.carry_out_cross_requests();
    vm.deliver_next();
    vm.deliver_next();
    assert!(vm.vcpus[0].nmi_pending);
    assert!(vm.vcpus[0].can_wake());
    assert!(!vm.vcpus[1].nmi_pending);
    vm.vcpus[0].cpu.state_mut().nmi_blocked = true;
    assert!(!vm.vcpus[0].can_wake(), "held until the IRET");
}

#[test]
fn an_ap_starts_at_the_start_time() {
    let mut vm = halting_vm(2);
    vm.shared.directory[1].started = true;
    vm.shared.cross.push(CrossRequest::StartCpu {
        target: VcpuId(1),
        rip: CODE,
        rsp: boot::BOOT_STACK_TOP,
        rdi: 0,
        at: Cycles(70_000),
    });
    vm.carry_out_cross_requests();
    assert_eq!(vm.vcpus[1].clock(), Cycles(70_000), "idle until started");
    assert_eq!(vm.vcpus[1].stats.idle_cycles, 70_000);
    vm.run_until(Cycles(200_000));
    assert_eq!(vm.vcpus[1].stats.halts, 1);
    // Two halted vCPUs and no event: the VM stops, deterministically.
    let reason = vm.run();
    assert!(matches!(
        reason,
        StopReason::Error(VmError::AllHalted { .. })
    ));
}

/// The BSP's INIT (level assert) and SIPI (vector 0x20) to APIC 1
/// through the x2APIC ICR, then `cli; hlt`.
const INIT_SIPI_TO_APIC_1: [u8; 26] = [
    0xb9, 0x30, 0x08, 0x00, 0x00, // mov ecx, 0x830 (ICR)
    0xba, 0x01, 0x00, 0x00, 0x00, // mov edx, 1 (destination)
    0xb8, 0x00, 0x45, 0x00, 0x00, // mov eax, 0x4500 (INIT, assert)
    0x0f, 0x30, // wrmsr
    0xb8, 0x20, 0x46, 0x00, 0x00, // mov eax, 0x4620 (SIPI 0x20)
    0x0f, 0x30, // wrmsr
    0xfa, 0xf4, // cli; hlt
];

/// Under shadow paging an AP started by INIT/SIPI runs with its paging
/// off on the paging-off root (gva = gpa), as Linux's AP trampoline
/// needs: a store in real mode, one in protected mode without paging,
/// then it turns on PAE, LME and PG (the boot page tables) and stores
/// again in 64-bit mode. Every store lands at its gpa.
#[test]
fn under_shadow_paging_an_ap_runs_real_and_protected_mode_then_enters_long_mode() {
    let mut vm = halting_vm_with(2, crate::mmu::MmuMode::Shadow);
    vm.write_guest(Gpa(CODE), &INIT_SIPI_TO_APIC_1).unwrap();
    // 16-bit, at 0x20000 (CS = 0x2000): mov ax, 0x3000; mov ds, ax;
    // mov word [0], 0xbeef; mov ax, 0x2000; mov ds, ax;
    // lgdt [0x1020]; mov eax, cr0; or eax, 1; mov cr0, eax;
    // jmp dword 0x08:0x20100.
    let real: [u8; 40] = [
        0xb8, 0x00, 0x30, 0x8e, 0xd8, 0xc7, 0x06, 0x00, 0x00, 0xef, 0xbe, 0xb8, 0x00, 0x20, 0x8e,
        0xd8, 0x66, 0x0f, 0x01, 0x16, 0x20, 0x10, 0x0f, 0x20, 0xc0, 0x66, 0x83, 0xc8, 0x01, 0x0f,
        0x22, 0xc0, 0x66, 0xea, 0x00, 0x01, 0x02, 0x00, 0x08, 0x00,
    ];
    // 32-bit, at 0x20100: mov ax, 0x10; mov ds/es/ss, ax;
    // mov dword [0x30004], 0xcafe0032; mov eax, cr4; or eax, 0x20
    // (PAE); mov cr4, eax; mov eax, 0x3000 (the boot PML4);
    // mov cr3, eax; mov ecx, 0xc0000080; rdmsr; or eax, 0x100 (LME);
    // wrmsr; mov eax, cr0; or eax, 0x80000000 (PG); mov cr0, eax;
    // jmp 0x18:0x20200.
    let protected: [u8; 69] = [
        0x66, 0xb8, 0x10, 0x00, 0x8e, 0xd8, 0x8e, 0xc0, 0x8e, 0xd0, 0xc7, 0x05, 0x04, 0x00, 0x03,
        0x00, 0x32, 0x00, 0xfe, 0xca, 0x0f, 0x20, 0xe0, 0x83, 0xc8, 0x20, 0x0f, 0x22, 0xe0, 0xb8,
        0x00, 0x30, 0x00, 0x00, 0x0f, 0x22, 0xd8, 0xb9, 0x80, 0x00, 0x00, 0xc0, 0x0f, 0x32, 0x0d,
        0x00, 0x01, 0x00, 0x00, 0x0f, 0x30, 0x0f, 0x20, 0xc0, 0x0d, 0x00, 0x00, 0x00, 0x80, 0x0f,
        0x22, 0xc0, 0xea, 0x00, 0x02, 0x02, 0x00, 0x18, 0x00,
    ];
    // 64-bit, at 0x20200: mov dword [0x30008], 0x64646464; hlt.
    let long: [u8; 12] = [
        0xc7, 0x04, 0x25, 0x08, 0x00, 0x03, 0x00, 0x64, 0x64, 0x64, 0x64, 0xf4,
    ];
    vm.write_guest(Gpa(0x20000), &real).unwrap();
    vm.write_guest(Gpa(0x20100), &protected).unwrap();
    vm.write_guest(Gpa(0x20200), &long).unwrap();
    // The GDT at 0x21000 (null, 32-bit code, data, 64-bit code) and
    // its pointer at 0x21020.
    let gdt = [
        0u64,
        0x00cf_9b00_0000_ffff,
        0x00cf_9300_0000_ffff,
        0x00af_9b00_0000_ffff,
    ];
    let gdt: Vec<u8> = gdt.iter().flat_map(|d| d.to_le_bytes()).collect();
    vm.write_guest(Gpa(0x21000), &gdt).unwrap();
    let mut gdtr = vec![31u8, 0];
    gdtr.extend_from_slice(&0x21000u32.to_le_bytes());
    vm.write_guest(Gpa(0x21020), &gdtr).unwrap();
    // Bounded: an AP lost in the wrong memory would spin forever.
    let status = vm.run_until(Cycles(50_000_000));
    assert!(
        matches!(
            status,
            RunStatus::Stopped(StopReason::Error(VmError::AllHalted { .. }))
        ),
        "{status:?}"
    );
    let mut seen = [0u8; 12];
    vm.read_guest(Gpa(0x30000), &mut seen).unwrap();
    assert_eq!(u16::from_le_bytes([seen[0], seen[1]]), 0xbeef, "real mode");
    assert_eq!(
        u32::from_le_bytes(seen[4..8].try_into().unwrap()),
        0xcafe_0032
    );
    assert_eq!(
        u32::from_le_bytes(seen[8..12].try_into().unwrap()),
        0x6464_6464
    );
    let ap = &vm.vcpus[1];
    assert!(ap.cpu.state().in_64bit_mode(), "the AP reached 64-bit mode");
    assert_eq!(ap.shadow.guest_cr3, 0x3000);
    assert!(ap.paging_context().paging);
    assert_eq!(vm.vcpus[1].stats.halts, 1);
}

/// KVM_HC_SEND_IPI: one fixed IPI per bit whose APIC id exists (64
/// bits per word from 64-bit code, the high word from `min + 64`);
/// KVM's refusals for logical destinations and shorthands, and (here)
/// the SMI delivery mode; NMI goes as NMI.
#[test]
fn pv_send_ipi_sends_one_ipi_per_bit_to_existing_apic_ids() {
    let mut vm = halting_vm(3);
    let Vm { vcpus, shared, .. } = &mut vm;
    use machine::vmx::Ipi;
    let ipi = |id: u32| Ipi {
        dest: machine::vmx::IpiDest::Physical(id),
        vector: 0x30,
        mode: IpiMode::Fixed,
        level_assert: true,
        trigger_level: false,
    };
    // Bits 1 and 2 (APIC ids 1, 2), bit 40 (no such id), and bit 0 of
    // the high word (id 64: none).
    let sent = vcpus[0].pv_send_ipi(shared, [0b110 | 1 << 40, 1], 0, 0x30);
    assert_eq!(sent, 2);
    let routed: Vec<Ipi> = shared
        .cross
        .iter()
        .filter_map(|r| match r {
            CrossRequest::Ipi { ipi, .. } => Some(*ipi),
            _ => None,
        })
        .collect();
    assert_eq!(routed, vec![ipi(1), ipi(2)]);
    assert_eq!(vcpus[0].stats.ipis_sent, 2);
    // `min` shifts the ids; past the last APIC id nothing is sent.
    shared.cross.clear();
    assert_eq!(vcpus[0].pv_send_ipi(shared, [0b1, 0], 2, 0x30), 1);
    assert_eq!(vcpus[0].pv_send_ipi(shared, [!0, !0], u32::MAX, 0x30), 0);
    for refused in [0x30 | 1 << 11, 0x30 | 1 << 18, 0x30 | 2 << 8] {
        assert_eq!(
            vcpus[0].pv_send_ipi(shared, [0b10, 0], 0, refused),
            -abi::errno::EINVAL,
            "{refused:#x}"
        );
    }
    assert_eq!(shared.cross.len(), 1);
    // Linux's NMI: `APIC_DM_NMI`, no vector.
    assert_eq!(vcpus[0].pv_send_ipi(shared, [0b10, 0], 0, 4 << 8), 1);
    assert!(matches!(
        shared.cross.last(),
        Some(CrossRequest::Ipi {
            ipi: Ipi {
                mode: IpiMode::Nmi,
                dest: machine::vmx::IpiDest::Physical(1),
                ..
            },
            ..
        })
    ));
}

#[test]
fn init_and_sipi_start_an_ap_in_real_mode_at_the_vector_page() {
    let mut vm = halting_vm(2);
    vm.write_guest(Gpa(CODE), &INIT_SIPI_TO_APIC_1).unwrap();
    // The AP's 16-bit code at 0x20000: mov ax, cs; mov bx, 0x1234; hlt.
    vm.write_guest(Gpa(0x20000), &[0x8c, 0xc8, 0xbb, 0x34, 0x12, 0xf4])
        .unwrap();
    let reason = vm.run();
    assert!(
        matches!(reason, StopReason::Error(VmError::AllHalted { .. })),
        "{reason:?}"
    );
    let ap = vm.vcpus[1].cpu.state();
    assert!(vm.shared.directory[1].started);
    assert_eq!(ap.cs.base, 0x20000);
    assert_eq!(ap.gpr[Gpr::Rax as usize] & 0xffff, 0x2000);
    assert_eq!(ap.gpr[Gpr::Rbx as usize] & 0xffff, 0x1234);
    assert_eq!(vm.vcpus[1].stats.halts, 1);
}
