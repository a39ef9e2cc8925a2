//! ACPI S3 and resume (`guests/s3/boot.S`): a multiboot kernel finds the
//! FACS, the PM1a blocks and `_S3_` through the ACPI tables, sets the RTC
//! alarm and RTC_EN, and enters S3; the platform wakes it at the alarm in
//! real mode at its FACS waking vector, with memory as it was and the
//! wake status set. On both MMUs and both engines, with an AP that was
//! never started (it stays stopped).

use hv::{Engine, Gpa, MmuMode, StopReason, Vm, VmConfig};

const S3: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/s3.elf"));
const SECOND: u64 = hv::CYCLES_PER_SECOND;

fn run(mmu: MmuMode, engine: Engine, vcpus: u32) {
    let config = VmConfig {
        vcpus,
        mem_size: 16 << 20,
        mmu,
        engine,
        ..VmConfig::default()
    };
    let what = format!("{mmu:?} {engine:?} {vcpus} vCPUs");
    let mut vm = Vm::boot(&config, S3).expect("boot");
    let reason = vm.run();
    let mut out = [0u8; 24];
    vm.read_guest(Gpa(0x500), &mut out).unwrap();
    let u16_at = |at: usize| u16::from_le_bytes([out[at], out[at + 1]]);
    let u32_at = |at: usize| u32::from_le_bytes(out[at..at + 4].try_into().unwrap());
    assert_eq!(u32_at(20), 0, "{what}: ran on after SLP_EN");
    assert_eq!(reason, StopReason::DebugExit { status: 1 }, "{what}");
    // CS:IP = 0x800:4 for the waking vector 0x8004.
    assert_eq!((u16_at(0), u16_at(2)), (0x800, 4), "{what}");
    // PM1_STS: WAK_STS and RTC_STS.
    assert_eq!(u16_at(4), 0x8400, "{what}");
    // RTC register C: IRQF (AF with AIE), PF (the 1024 Hz rate register
    // A starts with), AF, UF.
    assert_eq!(out[6], 0xf0, "{what}");
    // It slept from second 0 to the alarm at second 1 (BCD).
    assert_eq!((out[16], out[8]), (0x00, 0x01), "{what}");
    // The pattern below 1 MiB is intact.
    let sum: u32 = (0..0x1000u32).map(|i| (i * 7 + 3) & 0xff).sum();
    assert_eq!(u32_at(12), sum, "{what}");
    // Woken at the alarm: one second of virtual time, and a little.
    let time = vm.time().0;
    assert!(
        (SECOND..SECOND + SECOND / 100).contains(&time),
        "{what}: {time}"
    );
}

#[test]
fn s3_resumes_at_the_facs_waking_vector_with_memory_intact() {
    for mmu in [MmuMode::Ept, MmuMode::Shadow] {
        for engine in [Engine::default(), Engine::Interp] {
            run(mmu, engine, 1);
        }
    }
    run(MmuMode::Ept, Engine::default(), 2);
}
