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
