//! The hostile-guest suite: test kernels (tests/guests/hostile) that do what
//! a hypervisor must survive. Each run must end without a host panic and
//! with a clear stop reason: the guest's own exit when the hv refused the
//! hostile act as hardware would (#GP, an error return, a floating bus), an
//! hv error naming what the guest did when it cannot go on, or, for the
//! interrupts-off spin, still running when the time limit comes.

use hv::apf::ApfMode;
use hv::{Cycles, RunStatus, StopReason, VcpuId, Vm, VmConfig, VmError};
use machine::Gpa;

const MSR: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hostile-msr.elf"));
const HYPERCALL: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hostile-hypercall.elf"));
const PORTS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hostile-ports.elf"));
const WILD: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hostile-wild.elf"));
const SMC: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hostile-smc.elf"));
const SPIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hostile-spin.elf"));
const EXITS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hostile-exits.elf"));

const MEM: u64 = 64 << 20;
/// Virtual time allowed to each run (cycles at the 3 GHz TSC): far more
/// than any of them needs, so reaching it means the guest got stuck.
const LIMIT: u64 = 3_000_000_000;

fn config(cmdline: &str) -> VmConfig {
    VmConfig {
        vcpus: 1,
        mem_size: MEM,
        cmdline: cmdline.to_string(),
        ..VmConfig::default()
    }
}

/// Boots `kernel` and runs it to LIMIT; returns how it ended and its serial
/// output.
fn run(kernel: &[u8], cmdline: &str) -> (RunStatus, String) {
    let mut vm = Vm::boot(&config(cmdline), kernel).expect("boot");
    let status = vm.run_until(Cycles(LIMIT));
    let out = String::from_utf8_lossy(&vm.take_serial()).into_owned();
    (status, out)
}

/// As [`run`] with `--strict-mmio`: an access to unassigned MMIO stops
/// the VM instead of reading all ones.
fn run_strict(kernel: &[u8], cmdline: &str) -> (RunStatus, String) {
    let mut vm = Vm::boot(&config(cmdline), kernel).expect("boot");
    vm.set_strict_mmio(true);
    let status = vm.run_until(Cycles(LIMIT));
    let out = String::from_utf8_lossy(&vm.take_serial()).into_owned();
    (status, out)
}

/// The guest exited through isa-debug-exit with `value`.
fn exited(value: u32) -> RunStatus {
    RunStatus::Stopped(StopReason::DebugExit {
        status: (value << 1) | 1,
    })
}

/// `key=N` from the kernel's output.
fn count(out: &str, key: &str) -> u64 {
    let prefix = format!("{key}=");
    out.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {key}= in {out}"))
        .parse()
        .unwrap()
}

/// The hv error the run stopped with, and its message.
fn error(status: RunStatus, out: &str) -> (VmError, String) {
    match status {
        RunStatus::Stopped(StopReason::Error(e)) => {
            let msg = e.to_string();
            (e, msg)
        }
        other => panic!("expected an hv error stop, got {other:?}\n{out}"),
    }
}

#[test]
fn random_msr_writes_with_garbage_are_refused_or_taken() {
    let (status, out) = run(MSR, "");
    assert_eq!(status, exited(0x11), "{out}");
    assert!(out.contains("msr: survived"), "{out}");
    let (writes, reads, gp) = (
        count(&out, "msr_writes"),
        count(&out, "msr_reads"),
        count(&out, "gp"),
    );
    assert_eq!(writes + reads, 4000, "{out}");
    // Both outcomes happen: garbage refused with #GP, and accepted writes.
    assert!(gp > 100 && gp < writes + reads, "{out}");
    assert_eq!(count(&out, "ud"), 0, "{out}");
}

#[test]
fn random_hypercalls_with_wild_pointers_get_answers() {
    let (status, out) = run(HYPERCALL, "");
    assert_eq!(status, exited(0x12), "{out}");
    let (calls, errors) = (count(&out, "hypercalls"), count(&out, "errors"));
    assert!(calls > 2500, "{out}");
    assert!(errors > calls / 2, "most wild calls fail: {out}");
}

#[test]
fn random_port_io_reads_a_floating_bus_and_ignores_writes() {
    let (status, out) = run(PORTS, "");
    assert_eq!(status, exited(0x13), "{out}");
    assert!(count(&out, "ins") > 2000, "{out}");
    assert!(count(&out, "floating") > 100, "{out}");
}

#[test]
fn self_modifying_code_runs_the_new_instructions() {
    let (status, out) = run(SMC, "");
    assert_eq!(status, exited(0x15), "{out}");
    assert_eq!(count(&out, "smc_bad"), 0, "{out}");
}

#[test]
fn cr3_with_reserved_bits_is_gp() {
    let (status, out) = run(WILD, "-- cr3-reserved");
    assert_eq!(status, exited(0x14), "{out}");
}

#[test]
fn paging_outside_guest_memory_stops_with_an_hv_error() {
    let outside = (MEM + (64 << 30)) & !((2 << 20) - 1);
    for variant in [
        "cr3-outside",
        "pt-table",
        "pt-leaf-read",
        "pt-leaf-exec",
        "idt-outside",
    ] {
        let (status, out) = run_strict(WILD, &format!("-- {variant}"));
        assert!(out.contains(&format!("wild: {variant}\n")), "{out}");
        assert!(!out.contains("still running"), "{variant}: {out}");
        let (e, msg) = error(status, &out);
        assert!(
            matches!(e, VmError::OutsideMemory { vcpu: VcpuId(0), gpa, .. } if gpa.0 >> 21 == outside >> 21),
            "{variant}: {msg}"
        );
        assert!(msg.contains("outside its memory"), "{variant}: {msg}");
    }
}

#[test]
fn a_garbage_idt_ends_in_a_named_triple_fault() {
    let (status, out) = run(WILD, "-- idt-garbage");
    let (e, msg) = error(status, &out);
    assert!(
        matches!(
            e,
            VmError::TripleFault {
                vcpu: VcpuId(0),
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("the chain began with #UD (invalid opcode)"),
        "{msg}"
    );
}

#[test]
fn an_interrupts_off_spin_is_still_running_at_the_limit() {
    let mut vm = Vm::boot(&config(""), SPIN).expect("boot");
    assert_eq!(vm.run_until(Cycles(LIMIT / 10)), RunStatus::Running);
    let out = String::from_utf8_lossy(&vm.take_serial()).into_owned();
    assert!(out.contains("spin: interrupts off"), "{out}");
    assert!(vm.time() >= Cycles(LIMIT / 10));
    // It can be stopped at any later limit too, and never ends by itself.
    assert_eq!(vm.run_until(Cycles(LIMIT / 5)), RunStatus::Running);
}

#[test]
fn hostile_runs_repeat_exactly() {
    for (kernel, cmdline) in [(MSR, ""), (HYPERCALL, ""), (WILD, "-- idt-garbage")] {
        let a = run(kernel, cmdline);
        let b = run(kernel, cmdline);
        assert_eq!(a, b);
    }
}

/// One operation of the `exits` guest (struct op in exits.c, 40 bytes):
/// kind 0 WRMSR, 1 RDMSR, 2 faultline hypercall BASE + (index & 0xf),
/// 3 any hypercall number; 0xff ends the list.
fn op(kind: u8, index: u32, args: [u64; 4]) -> Vec<u8> {
    let mut v = vec![kind, 0, 0, 0];
    v.extend(index.to_le_bytes());
    for a in args {
        v.extend(a.to_le_bytes());
    }
    v
}

#[test]
fn operations_written_into_guest_memory_reach_the_exit_handlers() {
    // The exit-handler fuzz target's guest, driven by hand: a valid APF
    // enable, then garbage the hv must refuse (#GP or an error return).
    let config = VmConfig {
        vcpus: 2,
        mem_size: 8 << 20,
        apf: ApfMode::Pv,
        ..VmConfig::default()
    };
    let mut ops = Vec::new();
    ops.extend(op(0, 0x4b56_4d06, [0x22, 0, 0, 0])); // MSR_KVM_ASYNC_PF_INT
    ops.extend(op(0, 0x4b56_4d02, [0x10_0000 | 1 | 8, 0, 0, 0])); // ASYNC_PF_EN
    ops.extend(op(1, 0x4b56_4d02, [0; 4]));
    ops.extend(op(0, 0x4b56_4d02, [(1 << 40) | 1, 0, 0, 0])); // outside RAM: #GP
    ops.extend(op(0, 0x4b56_4d06, [!0, 0, 0, 0])); // reserved bits: #GP
    ops.extend(op(2, 1, [!0 - 8, 4096, 0, 0])); // HC_REPORT, wild pointer
    ops.extend(op(2, 5, [1 << 40, 0x23, 0x22, 0])); // HC_APF_ENABLE outside
    ops.extend(op(3, 10, [!0, !0, !0, 0x22])); // KVM_HC_SEND_IPI
    ops.push(0xff);
    let mut vm = Vm::boot(&config, EXITS).expect("boot");
    vm.write_guest(Gpa(0x40_0000), &ops).unwrap();
    let status = vm.run_until(Cycles(LIMIT));
    let out = String::from_utf8_lossy(&vm.take_serial()).into_owned();
    assert_eq!(status, exited(0x20), "{out}");
    assert!(vm.reports().is_empty(), "the wild report was refused");
}
