//! Tests of the modes other than 64-bit: compatibility mode under long
//! mode, real mode, 32-bit protected mode and the transitions between them.

use super::*;
use crate::mmu::paging::pte;
use crate::Hpa;
use iced_x86::code_asm::*;

const MEM: u64 = 4 << 20;
const PML4: u64 = 0x1000;
const GDT: u64 = 0x8000;
/// GDT selectors of these tests.
const CODE64: u16 = 0x08;
const DATA: u16 = 0x10;
const CODE32: u16 = 0x18;
const CODE16: u16 = 0x20;

/// 4 MiB of memory: identity page tables (two 2 MiB pages) at PML4 and a
/// GDT with flat 64-bit code, data, 32-bit code and 16-bit code.
fn memory() -> PhysMemory {
    let mem = PhysMemory::new(MEM).unwrap();
    let table = pte::PRESENT | pte::WRITABLE;
    mem.write_u64(Hpa(PML4), 0x2000 | table).unwrap();
    mem.write_u64(Hpa(0x2000), 0x3000 | table).unwrap();
    mem.write_u64(Hpa(0x3000), table | pte::HUGE).unwrap();
    mem.write_u64(Hpa(0x3008), (1 << 21) | table | pte::HUGE)
        .unwrap();
    let gdt = [
        (CODE64, 0x00af_9b00_0000_ffffu64),
        (DATA, 0x00cf_9300_0000_ffff),
        (CODE32, 0x00cf_9b00_0000_ffff),
        (CODE16, 0x0000_9b00_0000_ffff),
    ];
    for (sel, d) in gdt {
        mem.write_u64(Hpa(GDT + sel as u64), d).unwrap();
    }
    mem
}

fn assemble(
    bits: u32,
    at: u64,
    f: impl FnOnce(&mut CodeAssembler) -> Result<(), IcedError>,
) -> Vec<u8> {
    let mut a = CodeAssembler::new(bits).unwrap();
    f(&mut a).unwrap();
    a.assemble(at).unwrap()
}

/// `jmp far selector:offset` (EA ptr16:32) in 32-bit code.
fn far_jump32(selector: u16, offset: u32) -> Vec<u8> {
    let mut v = vec![0xea];
    v.extend_from_slice(&offset.to_le_bytes());
    v.extend_from_slice(&selector.to_le_bytes());
    v
}

/// `jmp far selector:offset` (EA ptr16:16) in 16-bit code, with an
/// operand-size prefix when `offset32`.
fn far_jump16(selector: u16, offset: u32, offset32: bool) -> Vec<u8> {
    let mut v = if offset32 {
        vec![0x66, 0xea]
    } else {
        vec![0xea]
    };
    if offset32 {
        v.extend_from_slice(&offset.to_le_bytes());
    } else {
        v.extend_from_slice(&(offset as u16).to_le_bytes());
    }
    v.extend_from_slice(&selector.to_le_bytes());
    v
}

fn run_to_hlt(cpu: &mut Cpu, mem: &PhysMemory) {
    let limit = cpu.cycles() + 1_000_000;
    assert_eq!(cpu.run(mem, limit), VmExit::Hlt, "{:#x?}", cpu.state().rip);
}

/// A 64-bit CPU using `memory()`'s tables.
fn long_mode_cpu() -> Cpu {
    let mut cpu = Cpu::new(CpuConfig::default());
    let s = cpu.state_mut();
    s.cr3 = PML4;
    s.gdtr.base = GDT;
    s.gdtr.limit = 0xff;
    s.gpr[4] = 0x3f_f000;
    cpu
}

#[test]
fn compatibility_mode_round_trip() {
    let mem = memory();
    let mut cpu = long_mode_cpu();
    let code64 = 0x10000u64;
    let code32 = 0x20000u64;
    let back = 0x30000u64;
    // 64-bit: far return into the 32-bit segment.
    let c = assemble(64, code64, |a| {
        a.push(CODE32 as i32)?;
        a.push(code32 as i32)?;
        a.db(&[0x48, 0xcb]) // retfq
    });
    mem.write_bytes(Hpa(code64), &c).unwrap();
    // 32-bit: one-byte INC (0x40), PUSHAD/POPAD, a near call, a 32-bit
    // address wrap, then a far jump back to 64-bit code.
    let c = assemble(32, code32, |a| {
        let mut sub = a.create_label();
        a.mov(eax, 0x1234_5677)?;
        a.inc(eax)?;
        a.mov(ebx, 0xffff_fff0u32)?;
        a.mov(dword_ptr(ebx + 0x10020), eax)?; // wraps to 0x10010
        a.pushad()?;
        a.xor(eax, eax)?;
        a.popad()?;
        a.call(sub)?;
        a.db(&far_jump32(CODE64, back as u32))?;
        a.set_label(&mut sub)?;
        a.mov(ecx, dword_ptr(0x10010))?;
        a.ret()
    });
    assert_eq!(c[5], 0x40, "a one-byte INC");
    mem.write_bytes(Hpa(code32), &c).unwrap();
    let c = assemble(64, back, |a| {
        a.mov(rdx, 0x1122_3344_5566_7788u64)?;
        a.hlt()
    });
    mem.write_bytes(Hpa(back), &c).unwrap();
    cpu.state_mut().rip = code64;
    run_to_hlt(&mut cpu, &mem);
    let s = cpu.state();
    assert_eq!(s.gpr[0], 0x1234_5678, "inc eax ran as a one-byte INC");
    assert_eq!(s.gpr[1], 0x1234_5678, "the store wrapped at 4 GiB");
    assert_eq!(s.gpr[2], 0x1122_3344_5566_7788, "back in 64-bit mode");
    assert_eq!(s.cs.selector, CODE64);
    assert_eq!(s.gpr[4], 0x3f_f000, "stack balanced");
}

#[test]
fn real_mode_through_protected_mode_into_long_mode() {
    let mem = memory();
    // The GDTR image at 0x7000 and the IVT entry for INT 0x21 at 0x84.
    mem.write(Hpa(0x7000), 2, 0xff).unwrap();
    mem.write(Hpa(0x7002), 4, GDT).unwrap();
    let handler = 0x0600u64; // 0000:0600
    mem.write(Hpa(0x21 * 4), 4, handler).unwrap();
    // The handler: mov si, 0x5a5a; iret.
    let h = assemble(16, handler, |a| {
        a.mov(si, 0x5a5a)?;
        a.iret()
    });
    mem.write_bytes(Hpa(handler), &h).unwrap();
    // Real mode at 07c0:0000 (linear 0x7c00), stack at 0000:7000.
    let start = 0x7c00u64;
    let pm32 = 0x9000u64;
    let lm64 = 0xa000u64;
    let c = assemble(16, 0, |a| {
        a.xor(ax, ax)?;
        a.mov(ss, ax)?;
        a.mov(sp, 0x7000)?;
        a.mov(ds, ax)?;
        a.int(0x21)?;
        // 16-bit addressing with a segment base: [bx+di] in DS = 0x0700.
        a.mov(ax, 0x0700)?;
        a.mov(es, ax)?;
        a.mov(bx, 0x10)?;
        a.mov(di, 0x4)?;
        a.mov(word_ptr(bx + di).es(), 0xbeef)?; // linear 0x7014
        a.lgdt(ptr(0x7000))?;
        a.mov(eax, cr0)?;
        a.or(eax, 1)?;
        a.mov(cr0, eax)?;
        a.db(&far_jump16(CODE32, pm32 as u32, true))
    });
    mem.write_bytes(Hpa(start), &c).unwrap();
    let c = assemble(32, pm32, |a| {
        a.mov(ax, DATA as u32)?;
        a.mov(ds, ax)?;
        a.mov(ss, ax)?;
        a.mov(esp, 0x3f_f000)?;
        a.mov(ecx, dword_ptr(0x7014))?;
        a.mov(eax, cr4)?;
        a.or(eax, 0x20)?; // PAE
        a.mov(cr4, eax)?;
        a.mov(eax, PML4 as u32)?;
        a.mov(cr3, eax)?;
        a.mov(ecx, 0xc000_0080u32)?; // EFER
        a.rdmsr()?;
        a.or(eax, 0x100)?; // LME
        a.wrmsr()?;
        a.mov(eax, cr0)?;
        a.or(eax, 0x8000_0000u32)?; // PG: IA-32e mode active
        a.mov(cr0, eax)?;
        a.mov(ecx, dword_ptr(0x7014))?;
        a.db(&far_jump32(CODE64, lm64 as u32))
    });
    mem.write_bytes(Hpa(pm32), &c).unwrap();
    let c = assemble(64, lm64, |a| {
        a.mov(rdx, 0x1122_3344_5566_7788u64)?;
        a.hlt()
    });
    mem.write_bytes(Hpa(lm64), &c).unwrap();
    let mut cpu = Cpu::new(CpuConfig::default());
    *cpu.state_mut() = CpuState::real_mode_at(0x07c0, 0);
    run_to_hlt(&mut cpu, &mem);
    let s = cpu.state();
    assert_eq!(s.gpr[6] & 0xffff, 0x5a5a, "INT 0x21 through the IVT");
    assert_eq!(mem.read(Hpa(0x7014), 2).unwrap(), 0xbeef);
    assert_eq!(s.gpr[1] & 0xffff, 0xbeef);
    assert_eq!(s.gpr[2], 0x1122_3344_5566_7788);
    assert!(s.in_64bit_mode());
    assert_ne!(s.efer & state::efer::LMA, 0);
    assert_eq!(s.cs.selector, CODE64);
}

#[test]
fn paging_needs_long_mode_enable_and_leaves_only_from_compatibility_mode() {
    let mem = memory();
    // Protected mode, paging off, no LME: setting PG is #GP (legacy
    // paging is not modelled), which with no IDT shuts the CPU down.
    let mut cpu = Cpu::new(CpuConfig::default());
    *cpu.state_mut() = CpuState::real_mode_at(0, 0x5000);
    let c = assemble(16, 0x5000, |a| {
        a.mov(eax, cr0)?;
        a.or(eax, 0x8000_0001u32)?;
        a.mov(cr0, eax)?;
        a.hlt()
    });
    mem.write_bytes(Hpa(0x5000), &c).unwrap();
    cpu.state_mut().idtr.limit = 0;
    assert_eq!(cpu.run(&mem, 1_000_000), VmExit::TripleFault);
    // In 64-bit mode clearing PG is #GP too.
    let mut cpu = long_mode_cpu();
    let c = assemble(64, 0x10000, |a| {
        a.mov(rax, cr0)?;
        a.btr(eax, 31)?;
        a.mov(cr0, rax)?;
        a.hlt()
    });
    mem.write_bytes(Hpa(0x10000), &c).unwrap();
    cpu.state_mut().rip = 0x10000;
    assert_eq!(cpu.run(&mem, 1_000_000), VmExit::TripleFault);
}

#[test]
fn the_same_bytes_decode_by_the_code_size() {
    // `40 90`: REX + NOP in 64-bit code, INC EAX + NOP in 32-bit code.
    let mem = memory();
    let at = 0x10000u64;
    mem.write_bytes(Hpa(at), &[0x40, 0x90, 0xf4]).unwrap();
    let mut cpu = long_mode_cpu();
    cpu.state_mut().rip = at;
    run_to_hlt(&mut cpu, &mem);
    assert_eq!(cpu.state().gpr[0], 0);
    let s = cpu.state_mut();
    s.rip = at;
    s.cs = state::Segment {
        selector: CODE32,
        base: 0,
        limit: 0xffff_ffff,
        attr: state::seg_attr::TYPE_CODE_RX_ACCESSED
            | state::seg_attr::S
            | state::seg_attr::PRESENT
            | state::seg_attr::DB,
    };
    s.activity = Activity::Active;
    run_to_hlt(&mut cpu, &mem);
    assert_eq!(
        cpu.state().gpr[0],
        1,
        "the cached 64-bit block was not reused"
    );
}

#[test]
fn init_then_startup_runs_16_bit_code_at_the_vector_page() {
    let mem = memory();
    // The trampoline at vector 0x08 (linear 0x8000 is the GDT here, so
    // use vector 0x09: CS 0x0900, linear 0x9000).
    let c = assemble(16, 0, |a| {
        a.mov(ax, cs)?;
        a.mov(bx, 0x1234)?;
        a.hlt()
    });
    mem.write_bytes(Hpa(0x9000), &c).unwrap();
    let mut cpu = long_mode_cpu();
    cpu.state_mut().fpu.mxcsr = 0x1f80 | 0x6000;
    assert!(!cpu.receive_startup(0x09), "a running CPU ignores SIPI");
    cpu.receive_init();
    assert_eq!(cpu.state().activity, Activity::WaitForSipi);
    assert_eq!(cpu.run(&mem, 1_000_000), VmExit::Hlt, "waits for SIPI");
    assert!(cpu.receive_startup(0x09));
    run_to_hlt(&mut cpu, &mem);
    let s = cpu.state();
    assert_eq!(s.gpr[0] & 0xffff, 0x0900);
    assert_eq!(s.gpr[3] & 0xffff, 0x1234);
    assert_eq!(s.cs.base, 0x9000);
    assert_eq!(s.fpu.mxcsr, 0x1f80 | 0x6000, "INIT keeps the x87/SSE state");
    assert_eq!(s.efer, 0);
}

#[test]
fn string_instructions_with_16_bit_addresses_use_si_di_and_cx() {
    let mem = memory();
    // Real mode at 0x1000:0; the source string at DS:0x100 (DS = 0x1000),
    // the copy to ES:0x200 (ES = 0x1100, linear 0x11200). The upper halves
    // of ESI, EDI and ECX hold garbage that a 16-bit address size ignores.
    let c = assemble(16, 0, |a| {
        a.mov(ax, 0x1000)?;
        a.mov(ds, ax)?;
        a.mov(ax, 0x1100)?;
        a.mov(es, ax)?;
        a.mov(esi, 0x5555_0100u32)?;
        a.mov(edi, 0x6666_0200u32)?;
        a.mov(ecx, 0x7777_0008u32)?;
        a.cld()?;
        a.rep().movsb()?;
        a.mov(si, 0x100)?;
        a.mov(di, 0x200)?;
        a.mov(cx, 8)?;
        a.repe().cmpsb()?;
        a.hlt()
    });
    mem.write_bytes(Hpa(0x10000), &c).unwrap();
    mem.write_bytes(Hpa(0x10100), b"16bitstr").unwrap();
    let mut cpu = Cpu::new(CpuConfig::default());
    *cpu.state_mut() = CpuState::real_mode_at(0x1000, 0);
    run_to_hlt(&mut cpu, &mem);
    let mut copy = [0u8; 8];
    mem.read_bytes(Hpa(0x11200), &mut copy).unwrap();
    assert_eq!(&copy, b"16bitstr");
    let s = cpu.state();
    assert_eq!(s.gpr[1], 0x7777_0000, "CX counted down, ECX's top kept");
    assert_eq!(s.gpr[6], 0x5555_0108, "SI advanced, ESI's top kept");
    assert_eq!(s.gpr[7], 0x6666_0208);
    assert_ne!(s.rflags & rflags::ZF, 0, "the copy compares equal");
}

/// ENDBR32, ENDBR64 and the reserved hint NOPs (0F 19-0F 1F; RDSSP is one
/// of them without CET) execute as NOPs in real mode, as on a CPU without
/// CET enabled (kvm-unit-tests' `realmode`, built with `-fcf-protection`,
/// opens each function with ENDBR32; it took #UD into a zero IVT).
#[test]
fn endbr_and_hint_nops_are_nops_in_real_mode() {
    // endbr32, endbr64, nop dword [eax] (0F 1F /0), 0F 19 /0 (reserved
    // NOP), 0F 1E /1 (rdsspd, a NOP without CET), then HLT.
    let hints: &[&[u8]] = &[
        &[0xf3, 0x0f, 0x1e, 0xfb],
        &[0xf3, 0x0f, 0x1e, 0xfa],
        &[0x0f, 0x1f, 0x00],
        &[0x0f, 0x19, 0x00],
        &[0xf3, 0x0f, 0x1e, 0xc8],
    ];
    for engine in [crate::jit::Engine::Interp, crate::jit::Engine::Jit] {
        let config = CpuConfig {
            engine,
            ..CpuConfig::default()
        };
        for hint in hints {
            let mut code = vec![0xb8, 0x34, 0x12]; // mov ax, 0x1234 (16-bit)
            code.extend_from_slice(hint);
            code.push(0xf4);
            let mem = memory();
            mem.write_bytes(Hpa(0x10000), &code).unwrap();
            let mut cpu = Cpu::new(config.clone());
            *cpu.state_mut() = CpuState::real_mode_at(0x1000, 0);
            run_to_hlt(&mut cpu, &mem);
            let s = cpu.state();
            assert_eq!(s.gpr[0] & 0xffff, 0x1234, "{engine:?} {hint:x?}");
            assert_eq!(s.cs.selector, 0x1000, "{engine:?} {hint:x?}: no #UD");
            assert_eq!(s.gpr[4], 0, "{engine:?} {hint:x?}: nothing pushed");
        }
    }
}
