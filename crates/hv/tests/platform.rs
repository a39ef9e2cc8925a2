//! The platform as a guest finds it (`guests/platform.c`): the ACPI
//! tables, fw_cfg, the xAPIC page, COM1's input interrupt through the
//! IOAPIC, and power-off through the FADT's sleep control register.

use hv::{StopReason, Vm, VmConfig};

mod kv_lines;
use kv_lines::values;

const PLATFORM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/platform.elf"));

fn run(config: &VmConfig) -> (Vm, StopReason, String) {
    let mut vm = Vm::boot(config, PLATFORM).expect("boot");
    let reason = vm.run();
    let out = String::from_utf8_lossy(&vm.take_serial()).into_owned();
    (vm, reason, out)
}

fn config() -> VmConfig {
    VmConfig {
        vcpus: 3,
        mem_size: 16 << 20,
        console_input: b"ping".to_vec(),
        ..VmConfig::default()
    }
}

#[test]
fn a_guest_finds_the_tables_devices_and_powers_off() {
    let (vm, reason, out) = run(&config());
    assert_eq!(reason, StopReason::PowerOff, "{out}");
    let v = values(&out);
    assert_eq!(v["rsdp"], 0xe0000, "{out}");
    assert_eq!(v["xsdt_ok"], 1);
    assert!(!v.contains_key("bad_checksum"), "{out}");
    assert_eq!(v["sleep_port"], 0x600);
    assert_eq!(v["madt_cpus"], 3);
    assert_eq!(v["madt_flags"] & 1, 0, "no PCAT_COMPAT");
    assert_eq!(v["fw_cfg_sig"], u64::from(u32::from_le_bytes(*b"QEMU")));
    assert_eq!(v["fw_cfg_cpus"], 3);
    assert_eq!(v["pic"], 0xff, "no 8259");
    assert_eq!(v["xapic_id"], 0);
    assert_eq!(v["xapic_version"], 0x15);
    assert_eq!(v["xapic_svr"], 0x1ff);
    assert_eq!(v["self_irqs"], 1, "self-IPI through the xAPIC ICR");
    assert_eq!(v["ioapic_version"], 0x0017_0020);
    assert_eq!(v["ioapic_entry4"], 0x40);
    assert_eq!(v["uart_irqs"], 1);
    assert_eq!(v["received"], 4);
    assert_eq!(v["input"], u64::from(u32::from_le_bytes(*b"ping")));
    assert!(out.ends_with("bye\n"), "{out}");
    assert!(vm.stats().vcpus[0].mmio_accesses > 10);
}

#[test]
fn runs_repeat_exactly() {
    let (a, _, out_a) = run(&config());
    let (b, _, out_b) = run(&config());
    assert_eq!(out_a, out_b);
    assert_eq!(a.vcpus()[0].cpu().cycles(), b.vcpus()[0].cpu().cycles());
}

#[test]
fn without_input_the_guest_waits_and_the_hv_sees_nothing_can_wake_it() {
    let config = VmConfig {
        console_input: Vec::new(),
        ..config()
    };
    let mut vm = Vm::boot(&config, PLATFORM).expect("boot");
    // No input will come: every vCPU halted with nothing pending is the
    // hv's clean deadlock stop, not a hang waiting on the host.
    let status = vm.run_until(hv::Cycles(50_000_000));
    assert!(
        matches!(
            status,
            hv::RunStatus::Stopped(StopReason::Error(hv::VmError::AllHalted { .. }))
        ),
        "{status:?}"
    );
    let out = String::from_utf8_lossy(&vm.take_serial()).into_owned();
    assert!(
        out.contains("ioapic_entry4=") && !out.contains("received"),
        "{out}"
    );
}
