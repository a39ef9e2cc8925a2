mod common;
use common::*;
use iced_x86::code_asm::*;
#[test]
#[ignore]
fn perf_probe() {
    let prog = |a: &mut CodeAssembler| {
        let mut top = a.create_label();
        a.mov(
            rcx,
            std::env::var("N")
                .map(|v| v.parse().unwrap())
                .unwrap_or(5_000_000u64),
        )
        .unwrap();
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
    let mut r = rig(prog);
    let t = std::time::Instant::now();
    r.cpu.run(&r.mem, u64::MAX);
    let dt = t.elapsed().as_secs_f64();
    let n = r.cpu.stats().instructions;
    eprintln!(
        "{} insns in {:.3}s = {:.1} MIPS",
        n,
        dt,
        n as f64 / dt / 1e6
    );
}
