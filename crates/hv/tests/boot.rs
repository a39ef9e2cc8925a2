//! Integration tests: boot the C test kernels of tests/guests under the hv.

use hv::{
    spte, CreateError, Cycles, KernelError, RunStatus, StopReason, VcpuId, Vm, VmConfig, VmError,
    RAM_SLOT,
};

const HELLO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hello.elf"));
const SMP: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/smp.elf"));
const TRIPLE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/triple.elf"));
const OUTSIDE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/outside.elf"));

fn config(vcpus: u32, cmdline: &str) -> VmConfig {
    VmConfig {
        vcpus,
        mem_size: 64 << 20,
        cmdline: cmdline.to_string(),
        ..VmConfig::default()
    }
}

fn run(kernel: &[u8], config: &VmConfig) -> (Vm, StopReason, String) {
    let mut vm = Vm::boot(config, kernel).expect("boot");
    let reason = vm.run();
    let out = String::from_utf8_lossy(&vm.take_serial()).into_owned();
    (vm, reason, out)
}

#[test]
fn hello_prints_reports_and_exits_through_the_debug_port() {
    let (vm, reason, out) = run(HELLO, &config(1, "seed=1 -- hello a b"));
    assert_eq!(
        reason,
        StopReason::DebugExit {
            status: (0x21 << 1) | 1
        },
        "{out}"
    );
    assert!(out.contains("hello from the guest\n"), "{out}");
    assert!(
        out.contains("cpus=1 mem=64M cmdline=seed=1 -- hello a b\n"),
        "{out}"
    );
    assert!(out.contains("signature=KVMKVMKVM\n"), "{out}");
    assert!(out.contains("enosys ok\n"), "{out}");
    assert_eq!(vm.reports().len(), 1);
    assert_eq!(vm.reports()[0].line, "test=hello value=42");
    let stats = vm.stats();
    // Demand paging: only touched pages got frames, far fewer than 64 MiB.
    assert!(stats.ept_faults() >= 3, "{stats:?}");
    assert!(stats.vcpus[0].frames_allocated >= 1);
    assert!(stats.frames_in_use < 1000, "{stats:?}");
    let exits = stats.exits();
    assert!(exits["io"].count > 20);
    assert_eq!(exits["cpuid"].count, 1);
    assert_eq!(exits["vmcall"].count, 2);
    assert!(stats.instructions() > 100);
}

#[test]
fn smp_starts_aps_routes_ipis_and_wakes_on_the_timer() {
    let (vm, reason, out) = run(SMP, &config(4, ""));
    assert_eq!(reason, StopReason::DebugExit { status: 1 }, "{out}");
    for id in 1..4 {
        assert!(out.contains(&format!("cpu {id} up\n")), "{out}");
    }
    assert!(out.contains("all 4 cpus up\n"), "{out}");
    assert!(out.contains("timer ok\n"), "{out}");
    assert!(!out.contains("no IPI received"), "{out}");
    assert!(out.contains("msr gp ok\n"), "{out}");
    assert!(out.contains("kick ok\n"), "{out}");
    let stats = vm.stats();
    assert_eq!(stats.vcpus.iter().map(|v| v.ipis_sent).sum::<u64>(), 3);
    // The BSP slept through the 1 ms timer without interpreting it.
    assert!(
        stats.vcpus[0].idle_cycles >= 3_000_000 - 100_000,
        "{stats:?}"
    );
    assert!(stats.vcpus[0].cycles >= 3_000_000);
}

#[test]
fn same_config_same_output_and_cycles() {
    let a = run(SMP, &config(3, ""));
    let b = run(SMP, &config(3, ""));
    assert_eq!(a.1, b.1);
    assert_eq!(a.2, b.2);
    assert_eq!(a.0.stats(), b.0.stats());
    let digests = |vm: &Vm| {
        vm.vcpus()
            .iter()
            .map(|v| v.cpu().state_digest())
            .collect::<Vec<_>>()
    };
    assert_eq!(digests(&a.0), digests(&b.0));
}

#[test]
fn triple_fault_stops_the_vm_with_a_clear_error() {
    let (_, reason, out) = run(TRIPLE, &config(1, ""));
    assert!(out.contains("about to triple fault"));
    match reason {
        StopReason::Error(
            e @ VmError::TripleFault {
                vcpu: VcpuId(0), ..
            },
        ) => {
            assert!(
                e.to_string().contains("vCPU 0: triple fault at rip 0x2"),
                "{e}"
            );
        }
        other => panic!("expected a triple fault, got {other:?}"),
    }
}

/// By default an access where there is neither RAM nor a device is
/// unassigned MMIO, as on a PC: the write is dropped, and counted.
#[test]
fn write_outside_guest_memory_is_dropped_as_unassigned_mmio() {
    let (vm, reason, out) = run(OUTSIDE, &config(1, ""));
    assert!(out.contains("writing outside guest memory"), "{out}");
    assert!(out.contains("still alive"), "{out}");
    assert_eq!(reason, StopReason::DebugExit { status: 3 }, "{out}");
    assert_eq!(vm.stats().vcpus[0].unassigned_mmio, 1);
}

/// `--strict-mmio`: the same write stops the VM with a clear error.
#[test]
fn write_outside_guest_memory_stops_the_vm_with_a_clear_error() {
    let mut vm = Vm::boot(&config(1, ""), OUTSIDE).expect("boot");
    vm.set_strict_mmio(true);
    let reason = vm.run();
    let out = String::from_utf8_lossy(&vm.take_serial()).into_owned();
    assert!(out.contains("writing outside guest memory"), "{out}");
    assert!(!out.contains("still alive"), "{out}");
    let expected_gpa = (64u64 << 20) + (128 << 20);
    match reason {
        StopReason::Error(
            e @ VmError::OutsideMemory {
                vcpu: VcpuId(0),
                gpa,
                ..
            },
        ) => {
            assert_eq!(gpa, machine::Gpa(expected_gpa));
            let msg = e.to_string();
            assert!(
                msg.contains(&format!(
                    "guest access outside its memory at gpa {expected_gpa:#x}, rip 0x"
                )),
                "{msg}"
            );
        }
        other => panic!("expected an outside-memory error, got {other:?}"),
    }
}

#[test]
fn bad_kernels_are_refused_before_running() {
    let err = Vm::boot(&config(1, ""), b"not an elf").unwrap_err();
    assert_eq!(
        err.to_string(),
        "kernel image: not an ELF file (bad magic number)"
    );
    // A valid executable that does not fit in 2 MiB of guest RAM (the
    // kernel loads at 2 MiB).
    let no_room = VmConfig {
        mem_size: 2 << 20,
        ..config(1, "")
    };
    let err = Vm::boot(&no_room, HELLO).unwrap_err();
    assert!(
        matches!(
            err,
            CreateError::Kernel(KernelError::OutOfRam { mem: 0x20_0000, .. })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("outside the guest RAM"), "{err}");
    let too_small = VmConfig {
        mem_size: 3 << 20,
        ..config(1, "")
    };
    assert!(Vm::boot(&too_small, HELLO).is_err());
}

/// Runs `kernel` and checks the MMU's invariants on the way.
fn run_checked(kernel: &[u8], config: &VmConfig) -> (Vm, StopReason) {
    let mut vm = Vm::boot(config, kernel).expect("boot");
    loop {
        vm.check_mmu().expect("MMU invariants");
        if let RunStatus::Stopped(reason) = vm.run_until(vm.time() + Cycles(2_000_000)) {
            vm.check_mmu().expect("MMU invariants at the end");
            return (vm, reason);
        }
    }
}

#[test]
fn the_mmu_invariants_hold_through_boot_smp_and_the_end() {
    let (_, reason) = run_checked(SMP, &config(4, ""));
    assert_eq!(reason, StopReason::DebugExit { status: 1 });
    let (_, reason) = run_checked(HELLO, &config(1, "-- hello"));
    assert!(matches!(reason, StopReason::DebugExit { .. }));
}

#[test]
fn memslot_delete_zaps_and_refaults() {
    // Run the SMP kernel part way (its text, data and stacks are mapped),
    // move guest RAM away and back (every spte of it zapped), and let it
    // finish: the guest refaults what it touches and ends as an
    // undisturbed run does, with more EPT violations.
    let config = config(2, "");
    let (undisturbed, reason, out) = run(SMP, &config);
    assert_eq!(reason, StopReason::DebugExit { status: 1 }, "{out}");

    let mut vm = Vm::boot(&config, SMP).expect("boot");
    assert_eq!(vm.run_until(Cycles(1_000_000)), RunStatus::Running);
    let text = machine::Gpa(0x20_0000);
    let mapped = vm.spte(text).expect("the kernel's first page is mapped");
    assert!(spte::is_present(mapped));
    assert_ne!(mapped & spte::ACCESSED, 0, "the CPU set the accessed flag");
    let generation = vm.memslot_generation();
    let faults_before = vm.stats().ept_faults();
    vm.move_memslot(RAM_SLOT, machine::Gpa(1 << 32)).unwrap();
    assert!(vm.spte(text).is_none_or(|s| !spte::is_present(s)), "zapped");
    vm.check_mmu().unwrap();
    vm.move_memslot(RAM_SLOT, machine::Gpa(0)).unwrap();
    assert_eq!(vm.memslot_generation(), generation + 2);
    let reason = vm.run();
    let out = String::from_utf8_lossy(&vm.take_serial()).into_owned();
    assert_eq!(reason, StopReason::DebugExit { status: 1 }, "{out}");
    assert!(out.contains("all 2 cpus up\n"), "{out}");
    vm.check_mmu().unwrap();
    assert!(vm.spte(text).is_some_and(spte::is_present), "refaulted");
    let refaults = vm.stats().ept_faults() - faults_before;
    assert!(refaults > 0);
    assert!(
        vm.stats().ept_faults() > undisturbed.stats().ept_faults(),
        "the zapped pages faulted in again"
    );

    // A second slot, through the hv's own accesses.
    vm.add_memslot(
        hv::SlotId(7),
        machine::Gpa(1 << 32),
        1 << 20,
        Default::default(),
    )
    .unwrap();
    vm.write_guest(machine::Gpa((1 << 32) + 8), b"abc").unwrap();
    let mut buf = [0u8; 3];
    vm.read_guest(machine::Gpa((1 << 32) + 8), &mut buf)
        .unwrap();
    assert_eq!(&buf, b"abc");
    vm.move_memslot(hv::SlotId(7), machine::Gpa(2 << 32))
        .unwrap();
    vm.read_guest(machine::Gpa((2 << 32) + 8), &mut buf)
        .unwrap();
    assert_eq!(&buf, b"abc");
    let in_use = vm.stats().frames_in_use;
    let tables = vm.stats().ept_tables;
    let report = vm.delete_memslot(hv::SlotId(7)).unwrap();
    assert_eq!(report.pages_zapped, tables, "zap-all frees every table");
    assert_eq!(vm.stats().ept_tables, 0, "until a vCPU loads a new root");
    assert_eq!(vm.stats().frames_in_use, in_use - 1 - tables);
    assert!(vm.read_guest(machine::Gpa(2 << 32), &mut buf).is_err());

    // Deleting guest RAM zaps every spte and frees every guest frame.
    let before = vm.stats().frames_in_use;
    vm.delete_memslot(RAM_SLOT).unwrap();
    vm.check_mmu().unwrap();
    assert!(vm.spte(text).is_none_or(|s| !spte::is_present(s)));
    let after = vm.stats().frames_in_use;
    assert!(before > after, "{before} -> {after}");
    assert_eq!(after, 0, "no guest frame and no EPT table remains");
    assert!(vm
        .read_guest(machine::Gpa(0x200000), &mut [0u8; 1])
        .is_err());
}

#[test]
fn zap_all_slow_fast_and_seed_drop_every_mapping_and_the_guest_ends_as_undisturbed() {
    let (_, undisturbed, out) = run(SMP, &config(2, ""));
    for zap in [hv::ZapMode::Slow, hv::ZapMode::Fast, hv::ZapMode::Seed] {
        let config = VmConfig {
            zap,
            ..config(2, "")
        };
        let mut vm = Vm::boot(&config, SMP).expect("boot");
        assert_eq!(vm.run_until(Cycles(1_000_000)), RunStatus::Running);
        let tables = vm.stats().ept_tables;
        let report = vm.zap_all().unwrap();
        assert_eq!(report.mode, zap);
        assert_eq!(report.pages_zapped, tables);
        assert!(report.sptes_zapped > 0);
        assert_eq!(report.started, vm.time());
        assert!(report.ended > report.started);
        match zap {
            hv::ZapMode::Slow => assert_eq!(report.lock_breaks, 0),
            hv::ZapMode::Fast => assert_eq!(
                report.lock_breaks,
                tables.div_ceil(hv::BATCH_ZAP_PAGES as u64) - 1
            ),
            hv::ZapMode::Seed => {
                assert_eq!(report.lock_breaks, 0);
                let work = report.seed.expect("the seed's work");
                assert_eq!(work.pages_freed, tables);
                // Hash table and the rmaps of guest RAM, zeroed.
                assert!(work.bytes_zeroed > hv::SEED_HASH_BYTES + (config.mem_size >> 12) * 8);
            }
        }
        vm.check_mmu().unwrap();
        assert_eq!(vm.stats().ept_tables, 0);
        let reason = vm.run();
        let text = String::from_utf8_lossy(&vm.take_serial()).into_owned();
        assert_eq!(reason, undisturbed, "{zap:?}: {text}");
        assert_eq!(text, out, "{zap:?}");
        vm.check_mmu().unwrap();
        let stats = vm.stats();
        let reloads: u64 = stats.vcpus.iter().map(|v| v.root_reloads).sum();
        // Each vCPU that had entered reloads once (the AP may not have
        // started yet: its first load is set-up, not a reload).
        assert!((1..=2).contains(&reloads), "{reloads}");
        assert!(stats.vcpus.iter().any(|v| v.zap_stall_max > 0));
    }
}

#[test]
fn any_quantum_makes_progress() {
    // A quantum below the VM entry + exit cost used to hang: every entry
    // paid the transition, ran nothing, and pushed the clock past the
    // round's end. 0 is taken as 1.
    for quantum in [0, 1, 10, 100, 300, 650, 1000, 1201, 100_000] {
        let config = VmConfig {
            quantum,
            ..config(2, "")
        };
        let mut vm = Vm::boot(&config, SMP).expect("boot");
        // The run takes about 3.5 M cycles of virtual time; allow ample.
        let status = vm.run_until(Cycles(100_000_000));
        let out = String::from_utf8_lossy(&vm.take_serial()).into_owned();
        assert_eq!(
            status,
            RunStatus::Stopped(StopReason::DebugExit { status: 1 }),
            "quantum {quantum}: {out}"
        );
        assert!(out.contains("all 2 cpus up\n"), "quantum {quantum}: {out}");
    }
}

/// `config` under shadow paging.
fn shadow(config: VmConfig) -> VmConfig {
    VmConfig {
        mmu: hv::MmuMode::Shadow,
        ..config
    }
}

#[test]
fn the_test_kernels_run_the_same_under_shadow_paging() {
    for (kernel, config) in [
        (HELLO, config(1, "seed=1 -- hello a b")),
        (SMP, config(4, "")),
        (SMP, config(2, "")),
    ] {
        let (ept, ept_reason, ept_out) = run(kernel, &config);
        let (vm, reason, out) = run(kernel, &shadow(config.clone()));
        assert_eq!(reason, ept_reason, "{out}");
        // The same lines; APs that come up within a few cycles of each
        // other print in the order their (mode-dependent) timing gives.
        let sorted = |s: &str| {
            let mut lines: Vec<&str> = s.lines().collect();
            lines.sort_unstable();
            lines.join("\n")
        };
        assert_eq!(sorted(&out), sorted(&ept_out));
        // Virtual times differ (other exits); the lines do not.
        let lines = |vm: &Vm| {
            vm.reports()
                .iter()
                .map(|r| r.line.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(lines(&vm), lines(&ept));
        let stats = vm.stats();
        assert_eq!(stats.mmu, "shadow");
        let shadow = stats.shadow.expect("shadow counters");
        assert!(shadow.roots_built >= 1, "{shadow:?}");
        assert!(shadow.pages_by_level.iter().all(|&n| n > 0), "{shadow:?}");
        assert!(stats.exits().contains_key("exception"), "#PF exits");
        assert!(ept.stats().shadow.is_none());
    }
}

#[test]
fn shadow_paging_repeats_exactly() {
    let config = shadow(config(3, ""));
    let a = run(SMP, &config);
    let b = run(SMP, &config);
    assert_eq!(a.1, b.1);
    assert_eq!(a.2, b.2);
    assert_eq!(a.0.stats(), b.0.stats());
}

#[test]
fn the_shadow_invariants_hold_through_boot_smp_memslot_moves_and_the_end() {
    let (_, reason) = run_checked(SMP, &shadow(config(4, "")));
    assert_eq!(reason, StopReason::DebugExit { status: 1 });
    let (_, reason) = run_checked(HELLO, &shadow(config(1, "-- hello")));
    assert!(matches!(reason, StopReason::DebugExit { .. }));

    let config = shadow(config(2, ""));
    let mut vm = Vm::boot(&config, SMP).expect("boot");
    assert_eq!(vm.run_until(Cycles(1_000_000)), RunStatus::Running);
    let faults = vm.stats().ept_faults();
    vm.move_memslot(RAM_SLOT, machine::Gpa(1 << 32)).unwrap();
    vm.check_mmu().unwrap();
    vm.move_memslot(RAM_SLOT, machine::Gpa(0)).unwrap();
    vm.check_mmu().unwrap();
    let reason = vm.run();
    let out = String::from_utf8_lossy(&vm.take_serial()).into_owned();
    assert_eq!(reason, StopReason::DebugExit { status: 1 }, "{out}");
    assert!(out.contains("all 2 cpus up\n"), "{out}");
    vm.check_mmu().unwrap();
    assert!(vm.stats().ept_faults() > faults, "zapped leaves refaulted");
}

#[test]
fn shadow_paging_makes_progress_with_any_quantum() {
    for quantum in [1, 650, 100_000] {
        let config = VmConfig {
            quantum,
            ..shadow(config(2, ""))
        };
        let mut vm = Vm::boot(&config, SMP).expect("boot");
        let status = vm.run_until(Cycles(100_000_000));
        assert_eq!(
            status,
            RunStatus::Stopped(StopReason::DebugExit { status: 1 }),
            "quantum {quantum}"
        );
    }
}
