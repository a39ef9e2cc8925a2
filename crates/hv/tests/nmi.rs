//! NMIs (`guests/nmi.c`): a self-NMI through the x2APIC ICR and one
//! through KVM_HC_SEND_IPI are taken with interrupts off; an NMI sent
//! inside the NMI handler waits for its IRET (blocking by NMI), never
//! nesting.

use hv::VmConfig;

mod probe;

const NMI: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/nmi.elf"));

const EINVAL: u64 = (-22i64) as u64;

#[test]
fn nmis_are_taken_with_interrupts_off_and_blocked_until_iret() {
    let config = VmConfig {
        mem_size: 16 << 20,
        ..VmConfig::default()
    };
    let (vm, v) = probe::run_probes(&config, NMI);
    assert_eq!(v["icr_nmis"], 1, "IF = 0 does not hold an NMI back");
    assert_eq!(v["pv_sent"], 1);
    assert_eq!(v["pv_nmis"], 2);
    assert_eq!(v["pv_smi"], EINVAL);
    assert_eq!(v["held_in_handler"], 3, "blocked until the handler's IRET");
    assert_eq!(v["after_iret"], 4);
    assert_eq!(v["max_depth"], 1, "never nested");
    assert_eq!(vm.stats().vcpus[0].nmis_received, 4);
}
