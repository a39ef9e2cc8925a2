//! The translator (`--engine jit`) against the interpreter: the same
//! programs must end in the same state, memory, cycles and TLB counters,
//! with blocks actually translated; self-modifying code stays correct.

mod common;

use common::*;
use iced_x86::code_asm::*;
use machine::{Engine, Hpa, VmExit};

fn run_on(
    engine: Engine,
    threshold: u32,
    prog: impl FnOnce(&mut CodeAssembler),
) -> (Outcome, machine::jit::JitStats) {
    run_rig(engine, threshold, rig(prog))
}

fn run_rig(engine: Engine, threshold: u32, r: Rig) -> (Outcome, machine::jit::JitStats) {
    // Every block these tests translate is also checked against iced's
    // block encoder (a block that fails the check is not translated, and
    // the tests look for `blocks_failed == 0`).
    machine::jit::set_verify_encoding(true);
    r.outcome(engine, threshold)
}

/// Runs `prog` on both engines (and the translator at two thresholds)
/// and checks that they agree; returns the outcome and the translator's
/// counters (translating at once).
fn both(prog: impl Fn(&mut CodeAssembler)) -> (Outcome, machine::jit::JitStats) {
    let (interp, stats) = engines_agree("program", &[1, 2], |e, t| run_on(e, t, &prog));
    (interp, stats[0])
}

#[test]
fn register_forms_flags_and_branches_agree() {
    // Flags produced by one form and consumed by the next in every
    // combination the translator keeps in host flags: ADC/SBB chains,
    // INC/DEC keeping CF, CMOVcc, Jcc, logic ops (AF), 8/16/32-bit
    // partial writes, LEA with index and 32-bit addressing, MOVZX/SX.
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        let mut skip = a.create_label();
        a.mov(rcx, 3000u64).unwrap();
        a.mov(rsi, DATA).unwrap();
        a.mov(rax, 0x0123_4567_89ab_cdefu64).unwrap();
        a.mov(rdx, 0xfedc_ba98_7654_3210u64).unwrap();
        a.xor(r8d, r8d).unwrap();
        a.set_label(&mut top).unwrap();
        a.add(rax, rdx).unwrap();
        a.adc(rdx, rcx).unwrap();
        a.inc(r8d).unwrap();
        a.sbb(r9, rax).unwrap();
        a.dec(r10w).unwrap();
        a.adc(r11b, al).unwrap();
        a.and(eax, 0x7fff_ffff).unwrap();
        a.or(dx, 0x8001u32 as i32).unwrap();
        a.cmp(rax, rdx).unwrap();
        a.cmova(r12, rdx).unwrap();
        a.cmovl(r13d, eax).unwrap();
        a.test(cl, 1).unwrap();
        a.jz(skip).unwrap();
        a.lea(r14, qword_ptr(rax + rcx * 4 + 0x10)).unwrap();
        a.lea(r15d, dword_ptr(eax + ecx * 8 - 3)).unwrap();
        a.movzx(ebx, dl).unwrap();
        a.movsx(rbp, bx).unwrap();
        a.movsxd(rbp, ebp).unwrap();
        a.xor(r11, r14).unwrap();
        a.sub(r12w, r13w).unwrap();
        a.set_label(&mut skip).unwrap();
        // A memory access and a push/pop: call-outs between native code.
        a.mov(rbx, rcx).unwrap();
        a.and(ebx, 0x3ff).unwrap();
        a.add(qword_ptr(rsi + rbx * 8), r11).unwrap();
        a.push(r12).unwrap();
        a.pop(rbp).unwrap();
        a.neg(rbp).unwrap();
        a.dec(rcx).unwrap();
        a.jnz(top).unwrap();
        a.pushfq().unwrap();
        a.pop(rdi).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert!(stats.blocks_translated >= 2, "{stats:?}");
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
}

#[test]
fn register_forms_in_place_in_host_registers_agree() {
    // 32- and 64-bit register forms run on the host registers that hold
    // guest registers (`jit/regs.rs`): more live guest registers than
    // host ones (evictions), a move or product into a register not held
    // yet from itself, zeroing idioms, TEST, CMOVcc, shifts whose flags
    // an inline access and PUSHFQ observe, IMUL with live flags, and an
    // MPI-style multiply-accumulate loop.
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        a.mov(r15, 200u64).unwrap();
        a.mov(rsi, DATA).unwrap();
        a.mov(rax, 0x0123_4567_89ab_cdefu64).unwrap();
        a.mov(rdx, 0xfedc_ba98_7654_3210u64).unwrap();
        a.mov(r9, 0x1_0000_0000u64).unwrap();
        a.set_label(&mut top).unwrap();
        a.mov(rcx, rcx).unwrap();
        a.mov(r8d, r8d).unwrap();
        a.imul_3(r10, r10, 7).unwrap();
        a.mov(rcx, rax).unwrap();
        a.mov(ecx, ecx).unwrap();
        a.mov(rdi, rdx).unwrap();
        a.shr(rdi, 32).unwrap();
        a.imul_2(rcx, r9).unwrap();
        a.imul_2(rdi, rdx).unwrap();
        a.imul_3(r11d, edi, -3).unwrap();
        a.add(rcx, rdi).unwrap();
        a.adc(r12, r11).unwrap();
        a.cmp(rcx, rdi).unwrap();
        a.cmovae(r13, rdx).unwrap();
        a.cmovb(r14d, ecx).unwrap();
        a.add(rax, r12).unwrap();
        a.setb(bl).unwrap();
        a.movzx(ebx, bl).unwrap();
        a.shl(r13, 17).unwrap();
        a.mov(qword_ptr(rsi + 8), r13).unwrap();
        a.sar(r14d, 3).unwrap();
        a.add(rdx, qword_ptr(rsi + 8)).unwrap();
        a.adc(rbx, rcx).unwrap();
        a.test(rbx, r8).unwrap();
        a.test(r9d, eax).unwrap();
        a.rol(rbp, 9).unwrap();
        a.xor(r8d, r8d).unwrap();
        a.sub(rbp, rbp).unwrap();
        a.or(r8, rdx).unwrap();
        a.and(r10d, 0x7fff_ffff).unwrap();
        a.xor(r10, 0x1234_5678_9abc_def0u64 as i64 as i32).unwrap();
        a.inc(r11).unwrap();
        a.dec(r12d).unwrap();
        a.imul_2(rax, rdx).unwrap();
        a.pushfq().unwrap();
        a.pop(rdi).unwrap();
        a.dec(r15).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert!(stats.blocks_translated >= 2, "{stats:?}");
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
}

#[test]
fn rotates_by_immediates_agree() {
    // ROL/ROR by immediates, natively translated: every operand size,
    // counts of 0, 1, at and above the width (CF from the result, OF the
    // interpreter's choice for counts above 1, SF ZF AF PF kept from the
    // ADD before), the flags consumed natively (ADC, CMOVO, CMOVS) and
    // through PUSHFQ.
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        a.mov(rcx, 40u64).unwrap();
        a.mov(rax, 0x8123_4567_89ab_cdefu64).unwrap();
        a.mov(rdx, 0x7edc_ba98_7654_3211u64).unwrap();
        a.set_label(&mut top).unwrap();
        for count in [0u32, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63] {
            a.add(rdx, rax).unwrap();
            match count % 4 {
                0 => a.rol(al, count).unwrap(),
                1 => a.ror(dx, count).unwrap(),
                2 => a.rol(eax, count).unwrap(),
                _ => a.ror(rdx, count).unwrap(),
            }
            a.adc(r8, rdx).unwrap();
            a.cmovo(r9, rax).unwrap();
            a.cmovs(r10, rdx).unwrap();
            a.ror(rax, count).unwrap();
            a.rol(r11w, count).unwrap();
            a.pushfq().unwrap();
            a.pop(rdi).unwrap();
            a.xor(r12, rdi).unwrap();
            a.rol(r12, 5).unwrap();
        }
        a.xor(rax, rcx).unwrap();
        a.dec(rcx).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert!(stats.blocks_translated >= 2, "{stats:?}");
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
}

#[test]
fn faults_inside_translated_blocks_are_precise() {
    // A #PF in the middle of a translated block (a store past the mapped
    // 64 MiB on the 51st iteration): RIP, registers, flags and cycles at
    // the faulting instruction, then the handler runs.
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        a.mov(rcx, 100u64).unwrap();
        a.mov(rsi, MEM - 50 * 0x1000).unwrap();
        a.set_label(&mut top).unwrap();
        a.add(rax, rcx).unwrap();
        a.sub(rdx, rax).unwrap();
        a.mov(qword_ptr(rsi), rdx).unwrap();
        a.add(rsi, 0x1000).unwrap();
        a.inc(rbx).unwrap();
        a.dec(rcx).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(o.gpr[15], 0x1000 + 14, "the #PF handler ran");
    assert_eq!(o.gpr[3], 50, "50 iterations completed");
    assert_eq!(o.gpr[1], 50, "the faulting iteration's DEC did not run");
    assert!(stats.blocks_translated >= 1, "{stats:?}");
}

#[test]
fn self_modifying_code_runs_the_new_bytes() {
    // Each iteration patches the immediate of `mov eax, imm32` that the
    // next iteration runs, from another block: a stale translation would
    // keep adding the first value.
    let (o, stats) = both(|a| {
        let mut patch = a.create_label();
        let mut store = a.create_label();
        a.mov(ecx, 1000u32).unwrap();
        a.xor(ebx, ebx).unwrap();
        a.lea(rdi, ptr(patch)).unwrap();
        a.set_label(&mut patch).unwrap();
        a.mov(eax, 0x1234_5678u32).unwrap();
        a.add(rbx, rax).unwrap();
        a.jmp(store).unwrap();
        a.set_label(&mut store).unwrap();
        a.mov(eax, ecx).unwrap();
        a.mov(dword_ptr(rdi + 1), eax).unwrap();
        a.dec(ecx).unwrap();
        a.jnz(patch).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert!(stats.blocks_translated >= 1, "{stats:?}");
    // Iteration 1 adds the original immediate, iteration i > 1 the ECX
    // stored by iteration i - 1: 1000, 999, ..., 2.
    assert_eq!(o.gpr[3], 0x1234_5678 + (2..=1000u64).sum::<u64>());
}

#[test]
fn a_chained_exit_checked_before_a_store_into_code_checks_again() {
    // A jumps to P and P to Q on every iteration (exits to known targets:
    // once checked in full, P's chaining-table entry records its iTLB
    // slot's version and A's exit goes straight on after that). Every
    // fourth iteration Q patches P's immediate and leaves (a store into
    // code): the next A -> P must not go into P's old translation, though
    // P's entry and its slot are as they were (the run loop does not run
    // P in between). A's jump is direct (an exit to a known target), or
    // through a register (the shared exit, which checks in full).
    for indirect in [false, true] {
        let (o, stats) = both(|a| {
            let mut top = a.create_label();
            let mut p = a.create_label();
            let mut q = a.create_label();
            let mut done = a.create_label();
            a.mov(ecx, 400u32).unwrap();
            a.xor(ebx, ebx).unwrap();
            a.lea(rdi, ptr(p)).unwrap();
            a.set_label(&mut top).unwrap();
            a.add(rdx, rcx).unwrap();
            if indirect {
                a.jmp(rdi).unwrap();
            } else {
                a.jmp(p).unwrap();
            }
            a.set_label(&mut p).unwrap();
            a.mov(eax, 7u32).unwrap();
            a.add(rbx, rax).unwrap();
            a.jmp(q).unwrap();
            a.set_label(&mut q).unwrap();
            a.dec(ecx).unwrap();
            a.jz(done).unwrap();
            a.test(cl, 3).unwrap();
            a.jnz(top).unwrap();
            a.mov(dword_ptr(rdi + 1), ecx).unwrap();
            a.jmp(top).unwrap();
            a.set_label(&mut done).unwrap();
            a.hlt().unwrap();
        });
        assert_eq!(o.exit, VmExit::Hlt);
        assert_eq!(stats.blocks_failed, 0, "{stats:?}");
        let (mut imm, mut sum) = (7u64, 0u64);
        for c in (0..400u64).rev() {
            sum += imm;
            if c != 0 && c % 4 == 0 {
                imm = c;
            }
        }
        assert_eq!(o.gpr[3], sum, "indirect: {indirect}");
    }
}

#[test]
fn a_store_slot_filled_before_its_page_held_code_keeps_stores_off_it() {
    // A translated store fills the first-level write slot of a data page
    // (a loop), then writes a function there (`mov eax, 7; ret`), which
    // runs: decoding it makes the page a code frame. The same translated
    // store then patches the function's immediate through the same slot,
    // filled while the page held no code: it must take the slow path,
    // which invalidates the decoded function, so the second call returns
    // the new immediate; so must it after its slot was taken by another
    // page and filled again, and after the page left the TLB (INVLPG):
    // the Rust fill (a walk) fills the slot, which must give the next
    // patch, after the function ran again, no view either.
    let page = DATA + 0x3000;
    let (o, stats) = both(|a| {
        let mut warm = a.create_label();
        let mut poke = a.create_label();
        let mut main = a.create_label();
        a.jmp(main).unwrap();
        // poke: [rsi] = eax (mov eax, imm32), [rsi + 4] = dx (imm's top, RET).
        a.set_label(&mut poke).unwrap();
        a.mov(dword_ptr(rsi), eax).unwrap();
        a.mov(word_ptr(rsi + 4), dx).unwrap();
        a.ret().unwrap();
        a.set_label(&mut main).unwrap();
        a.mov(rsi, page).unwrap();
        a.mov(ecx, 300u32).unwrap();
        a.set_label(&mut warm).unwrap();
        a.mov(dword_ptr(rsi + 0x800), ecx).unwrap();
        a.dec(ecx).unwrap();
        a.jnz(warm).unwrap();
        a.mov(eax, 0x0000_07b8u32).unwrap();
        a.mov(edx, 0xc300u32).unwrap();
        a.call(poke).unwrap();
        a.call(rsi).unwrap();
        a.mov(ebx, eax).unwrap();
        a.mov(eax, 0x0000_09b8u32).unwrap();
        a.call(poke).unwrap();
        a.call(rsi).unwrap();
        a.add(ebx, eax).unwrap();
        // A store to the page 64 pages on takes the write slot; the next
        // patch fills it again, now for a code frame (no view either).
        a.mov(dword_ptr(rsi + 64 * 0x1000), ebx).unwrap();
        a.mov(eax, 0x0000_0bb8u32).unwrap();
        a.call(poke).unwrap();
        a.call(rsi).unwrap();
        a.add(ebx, eax).unwrap();
        a.invlpg(qword_ptr(rsi)).unwrap();
        for imm in [13u32, 15] {
            a.mov(eax, (imm << 8) | 0xb8).unwrap();
            a.call(poke).unwrap();
            a.call(rsi).unwrap();
            a.add(ebx, eax).unwrap();
        }
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    assert_eq!(
        o.gpr[3],
        7 + 9 + 11 + 13 + 15,
        "the later calls ran the patched function"
    );
}

#[test]
fn indirect_jumps_and_calls_agree() {
    // Indirect CALL/JMP run natively and chain: a function-pointer table
    // called through memory (one pointer straddling a page boundary, so
    // its inline read falls back to the interpreter), calls and jumps
    // through registers, a jump table; then a call to a non-canonical
    // target: #GP at that CALL with nothing pushed.
    let (o, stats) = both(|a| {
        let mut f = [a.create_label(), a.create_label(), a.create_label()];
        let mut top = a.create_label();
        let mut landing = a.create_label();
        let mut back = a.create_label();
        a.mov(rsi, DATA).unwrap();
        for (i, l) in f.iter().enumerate() {
            a.lea(rax, ptr(*l)).unwrap();
            a.mov(qword_ptr(rsi + 8 * i as i32), rax).unwrap();
        }
        a.lea(rax, ptr(landing)).unwrap();
        a.mov(qword_ptr(rsi + 0x40), rax).unwrap();
        // The same pointer as f[1], across the page boundary.
        a.mov(rax, qword_ptr(rsi + 8)).unwrap();
        a.mov(qword_ptr(rsi + 0xffc), rax).unwrap();
        a.lea(r12, ptr(f[2])).unwrap();
        a.lea(r13, ptr(back)).unwrap();
        a.mov(ecx, 600u32).unwrap();
        a.set_label(&mut top).unwrap();
        a.mov(eax, ecx).unwrap();
        a.and(eax, 1).unwrap();
        a.call(qword_ptr(rsi + rax * 8)).unwrap();
        a.call(r12).unwrap();
        a.test(cl, 7).unwrap();
        a.jnz(back).unwrap();
        a.call(qword_ptr(rsi + 0xffc)).unwrap();
        a.jmp(qword_ptr(rsi + 0x40)).unwrap();
        a.set_label(&mut landing).unwrap();
        a.add(rdi, rcx).unwrap();
        a.jmp(r13).unwrap();
        a.set_label(&mut back).unwrap();
        a.dec(ecx).unwrap();
        a.jnz(top).unwrap();
        a.mov(rax, 0x8000_0000_0000_0000u64).unwrap();
        a.mov(rbp, rsp).unwrap();
        a.call(rax).unwrap();
        a.hlt().unwrap();
        a.set_label(&mut f[0]).unwrap();
        a.add(rbx, 3).unwrap();
        a.ret().unwrap();
        a.set_label(&mut f[1]).unwrap();
        a.imul_3(rbx, rbx, 5).unwrap();
        a.ret().unwrap();
        a.set_label(&mut f[2]).unwrap();
        a.xor(rdx, rbx).unwrap();
        a.ret().unwrap();
    });
    assert_eq!(o.gpr[15], HANDLER_MARK + 13, "the #GP handler ran");
    assert_eq!(o.gpr[1], 0, "every iteration completed");
    assert_eq!(o.gpr[7], (1..=600u64).filter(|c| c % 8 == 0).sum::<u64>());
    assert!(stats.blocks_translated >= 4, "{stats:?}");
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
}

#[test]
fn chaining_into_a_page_crossing_instruction_agrees() {
    // A loop whose `mov rax, imm64` crosses a page boundary (its own
    // block, validated by its bytes): the block before it chains into it,
    // and every eighth iteration patches an immediate byte in the second
    // page, so a stale chain would keep loading the old value.
    let v: u64 = 0x1122_3344_5566_7788;
    let (o, stats) = both(|a| {
        let mut bytes = vec![0xb9, 0xe8, 0x03, 0x00, 0x00]; // mov ecx, 1000
        bytes.extend([0x48, 0xbf]); // mov rdi, CODE + 0x1001
        bytes.extend((CODE + 0x1001).to_le_bytes());
        bytes.extend([0x31, 0xdb]); // xor ebx, ebx
        bytes.resize(0xffa, 0x90);
        bytes.extend([0x48, 0x01, 0xcb]); // 0xffa: add rbx, rcx
        bytes.extend([0x48, 0xb8]); // 0xffd: mov rax, v (to 0x1007)
        bytes.extend(v.to_le_bytes());
        bytes.extend([0x48, 0x01, 0xc2]); // add rdx, rax
        bytes.extend([0xf6, 0xc1, 0x07]); // test cl, 7
        bytes.extend([0x75, 0x02]); // jnz +2
        bytes.extend([0x88, 0x0f]); // mov [rdi], cl
        bytes.extend([0xff, 0xc9]); // dec ecx
        bytes.extend([0x75, 0xe5]); // jnz 0xffa
        bytes.push(0xf4); // hlt
        assert_eq!(bytes.len(), 0x1016);
        a.db(&bytes).unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    let mut imm = v;
    let mut sum = 0u64;
    for c in (1..=1000u64).rev() {
        sum = sum.wrapping_add(imm);
        if c % 8 == 0 {
            imm = (imm & !0xff_0000) | (c & 0xff) << 16;
        }
    }
    assert_eq!(o.gpr[2], sum);
    assert_eq!(o.gpr[3], (1..=1000u64).sum::<u64>());
    assert!(stats.blocks_translated >= 3, "{stats:?}");
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
}

#[test]
fn shifts_and_rotates_by_cl_agree() {
    // SHL/SHR/SAR/ROL/ROR of 32- and 64-bit registers by CL, natively
    // translated, with counts whose masked value is 0 (no flags changed, a
    // 32-bit destination still zero-extended), 1, the width - 1, and
    // above the mask; the flags consumed natively (ADC, CMOVO, CMOVS, JC)
    // and through PUSHFQ. 8- and 16-bit destinations are call-outs.
    let counts = [0u8, 1, 2, 31, 32, 33, 63, 64, 65, 0xff, 0xe0, 0x9f];
    let iterations = 40u64;
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        a.mov(rsi, iterations).unwrap();
        a.mov(rax, 0x8123_4567_89ab_cdefu64).unwrap();
        a.mov(rdx, 0x7edc_ba98_7654_3211u64).unwrap();
        a.mov(rbx, 0xffff_ffff_8000_0001u64).unwrap();
        a.set_label(&mut top).unwrap();
        for (n, &count) in counts.iter().enumerate() {
            let mut no_carry = a.create_label();
            a.mov(ecx, count as u32 ^ (n as u32 * 0x100)).unwrap();
            // Flags from an ADD, which a zero count must leave alone.
            a.add(rdx, rax).unwrap();
            match n % 6 {
                0 => a.shl(rax, cl).unwrap(),
                1 => a.shr(edx, cl).unwrap(),
                2 => a.sar(rbx, cl).unwrap(),
                3 => a.rol(eax, cl).unwrap(),
                4 => a.ror(rdx, cl).unwrap(),
                _ => a.sar(ebx, cl).unwrap(),
            }
            a.adc(r8, rdx).unwrap();
            a.cmovo(r9, rax).unwrap();
            a.cmovs(r10, rdx).unwrap();
            a.shr(r11d, cl).unwrap();
            a.jnc(no_carry).unwrap();
            a.inc(r12).unwrap();
            a.set_label(&mut no_carry).unwrap();
            a.sal(r13, cl).unwrap();
            a.pushfq().unwrap();
            a.pop(rdi).unwrap();
            a.xor(r14, rdi).unwrap();
            a.add(r14, r13).unwrap();
            a.rol(r14, 3).unwrap();
            if n == 0 {
                // Call-outs: 8- and 16-bit destinations.
                a.shl(bl, cl).unwrap();
                a.sar(dx, cl).unwrap();
            }
        }
        a.lea(rax, qword_ptr(rax + rsi * 2 + 0x55)).unwrap();
        a.lea(rbx, qword_ptr(rbx + rax + 0x1234)).unwrap();
        a.mov(r11d, 0x8000_0001u32).unwrap();
        a.dec(rsi).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // The call-outs are the PUSHFQs and the two narrow shifts (and the
    // HLT): none of the shifts by CL.
    let bound = iterations * (counts.len() as u64 + 2) + 10;
    assert!(stats.call_outs <= bound, "{} > {bound}", stats.call_outs);
}

#[test]
fn divides_and_one_operand_multiplies_agree() {
    // DIV/IDIV and one-operand MUL/IMUL of 32- and 64-bit registers:
    // dividends with and without a high half, negative ones, divisors of 1
    // and -1 (IDIV's call-out), a signed dividend that does not fit one
    // register (call-out), the flags of MUL/IMUL consumed natively and
    // through PUSHFQ, the multiply and divide costs in the cycles; then a
    // DIV whose quotient overflows raises #DE at the right instruction.
    let iterations = 300u64;
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        a.mov(rsi, iterations).unwrap();
        a.mov(r8, 0x9e37_79b9_7f4a_7c15u64).unwrap();
        a.set_label(&mut top).unwrap();
        // A varying divisor: 1 + (r8 >> (rsi & 31)).
        a.imul_3(r8, r8, 0x2545_f491).unwrap();
        a.add(r8, rsi).unwrap();
        a.mov(r9, r8).unwrap();
        a.mov(ecx, esi).unwrap();
        a.shr(r9, cl).unwrap();
        a.inc(r9).unwrap();
        // 64-bit DIV with a high half below the divisor.
        a.mov(rax, r8).unwrap();
        a.mov(rdx, r8).unwrap();
        a.shr(rdx, 40).unwrap();
        a.add(r9, rdx).unwrap();
        a.div(r9).unwrap();
        a.add(r10, rax).unwrap();
        a.xor(r11, rdx).unwrap();
        // 32-bit DIV (zero-extends rax and rdx).
        a.mov(rax, r8).unwrap();
        a.xor(edx, edx).unwrap();
        a.div(r9d).unwrap();
        a.add(r10, rax).unwrap();
        a.add(r11, rdx).unwrap();
        // IDIV of a sign-extended negative dividend, 64 and 32 bits.
        a.mov(rax, r8).unwrap();
        a.or(rax, 0x8000_0000u32 as i32).unwrap();
        a.cqo().unwrap();
        a.idiv(r9).unwrap();
        a.sub(r10, rax).unwrap();
        a.add(r11, rdx).unwrap();
        a.mov(eax, r8d).unwrap();
        a.cdq().unwrap();
        a.mov(ecx, 7).unwrap();
        a.idiv(ecx).unwrap();
        a.add(r10, rdx).unwrap();
        // CBW, CWDE, CDQE, CWD (partial writes keep the bits above).
        a.mov(rax, r8).unwrap();
        a.cbw().unwrap();
        a.add(r11, rax).unwrap();
        a.cwde().unwrap();
        a.add(r10, rax).unwrap();
        a.cdqe().unwrap();
        a.mov(rdx, r9).unwrap();
        a.cwd().unwrap();
        a.add(r11, rdx).unwrap();
        // IDIV by -1 and a dividend needing both registers: call-outs.
        a.mov(rax, r8).unwrap();
        a.cqo().unwrap();
        a.mov(rcx, -1i64).unwrap();
        a.idiv(rcx).unwrap();
        a.add(r10, rax).unwrap();
        a.mov(rax, r8).unwrap();
        a.mov(edx, 1).unwrap();
        a.idiv(r9).unwrap();
        a.add(r11, rax).unwrap();
        // MUL/IMUL: CF/OF from the host, the rest kept from the CMP.
        a.cmp(r10, r11).unwrap();
        a.mov(rax, r8).unwrap();
        a.mul(r9).unwrap();
        a.adc(r12, rdx).unwrap();
        a.cmovs(r13, rax).unwrap();
        a.mov(eax, r8d).unwrap();
        a.imul(r9d).unwrap();
        a.pushfq().unwrap();
        a.pop(rdi).unwrap();
        a.add(r14, rdi).unwrap();
        a.mov(rax, rsi).unwrap();
        a.imul(r9).unwrap();
        a.cmovo(r13, rdx).unwrap();
        a.mov(eax, esi).unwrap();
        a.mul(eax).unwrap();
        a.adc(r12, rax).unwrap();
        a.dec(rsi).unwrap();
        a.jnz(top).unwrap();
        // Quotient overflow: #DE (vector 0) with rdx:rax untouched.
        a.mov(rax, 5u64).unwrap();
        a.mov(rdx, 3u64).unwrap();
        a.mov(ecx, 3).unwrap();
        a.div(rcx).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(o.gpr[15], HANDLER_MARK, "#DE delivered");
    assert_eq!((o.gpr[0], o.gpr[2]), (5, 3));
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // Per iteration: the two IDIVs that must be call-outs and the PUSHFQ.
    let bound = iterations * 3 + 10;
    assert!(stats.call_outs <= bound, "{} > {bound}", stats.call_outs);
}

#[test]
fn setcc_not_and_neg_agree() {
    // SETcc of byte registers (every condition, REX-only registers, the
    // low byte with the bits above kept) after flags from CMP, NEG and
    // ADD; NOT (no flags touched: the CMP's reach the SETcc after it) and
    // NEG of 32- and 64-bit registers, of 0 (CF clear) and of the most
    // negative value (OF set), their flags consumed natively and through
    // PUSHFQ; TEST and ALU operations on AH..BH with immediates. SETcc of
    // AH is a call-out.
    let iterations = 200u64;
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        a.mov(r15, iterations).unwrap();
        a.mov(r8, 0x9e37_79b9_7f4a_7c15u64).unwrap();
        a.mov(rbx, -1i64).unwrap();
        a.set_label(&mut top).unwrap();
        a.imul_3(r8, r8, 0x2545_f491).unwrap();
        a.add(r8, r15).unwrap();
        a.mov(rax, r8).unwrap();
        a.mov(rcx, r8).unwrap();
        a.shr(rcx, 17).unwrap();
        a.cmp(rax, rcx).unwrap();
        a.not(rcx).unwrap();
        a.seto(al).unwrap();
        a.setno(bl).unwrap();
        a.setb(sil).unwrap();
        a.setae(dil).unwrap();
        a.sete(bpl).unwrap();
        a.setne(r9b).unwrap();
        a.setbe(r10b).unwrap();
        a.seta(r11b).unwrap();
        a.add(r12, rax).unwrap();
        a.add(r12, rbx).unwrap();
        a.add(r12, rcx).unwrap();
        a.add(r12, rsi).unwrap();
        a.add(r12, rdi).unwrap();
        a.add(r13, r9).unwrap();
        a.add(r13, r10).unwrap();
        a.add(r13, r11).unwrap();
        a.add(r13, rbp).unwrap();
        a.cmp(ecx, eax).unwrap();
        a.sets(al).unwrap();
        a.setns(bl).unwrap();
        a.setp(r9b).unwrap();
        a.setnp(r10b).unwrap();
        a.setl(r11b).unwrap();
        a.setge(bpl).unwrap();
        a.setle(dl).unwrap();
        a.setg(ah).unwrap();
        a.add(r14, rax).unwrap();
        a.add(r14, rbx).unwrap();
        a.add(r14, rdx).unwrap();
        a.add(r14, r9).unwrap();
        a.add(r14, r10).unwrap();
        a.add(r14, r11).unwrap();
        a.add(r14, rbp).unwrap();
        // NEG: of a varying value, of 0 and of the most negative value,
        // 64 and 32 bits; its flags into ADC, CMOVcc, SETcc, PUSHFQ.
        a.mov(rdx, r8).unwrap();
        a.neg(rdx).unwrap();
        a.adc(r12, rdx).unwrap();
        a.mov(ecx, r8d).unwrap();
        a.and(ecx, 3).unwrap();
        a.neg(ecx).unwrap();
        a.setb(al).unwrap();
        a.cmovo(r12, rcx).unwrap();
        a.add(r12, rax).unwrap();
        a.xor(edx, edx).unwrap();
        a.neg(rdx).unwrap();
        a.setb(bl).unwrap();
        a.sete(dl).unwrap();
        a.add(r13, rbx).unwrap();
        a.mov(rdx, 0x8000_0000_0000_0000u64).unwrap();
        a.neg(rdx).unwrap();
        a.seto(al).unwrap();
        a.add(r13, rax).unwrap();
        a.mov(edx, 0x8000_0000u32).unwrap();
        a.neg(edx).unwrap();
        a.pushfq().unwrap();
        a.pop(rdi).unwrap();
        a.add(r14, rdi).unwrap();
        a.not(edx).unwrap();
        a.add(r13, rdx).unwrap();
        // TEST and the ALU group on AH, CH, DH, BH with immediates.
        a.mov(rax, r8).unwrap();
        a.mov(rcx, r8).unwrap();
        a.shr(rcx, 9).unwrap();
        a.mov(rdx, rcx).unwrap();
        a.shr(rdx, 13).unwrap();
        a.test(ah, 0x40).unwrap();
        a.cmovz(r12, rcx).unwrap();
        a.and(bh, 0xf0u32 as i32).unwrap();
        a.setp(r9b).unwrap();
        a.add(ch, 0x93u32 as i32).unwrap();
        a.adc(dh, 5).unwrap();
        a.sbb(ah, 1).unwrap();
        a.cmp(dh, 0x70).unwrap();
        a.cmovb(r13, rax).unwrap();
        a.xor(ah, 0x5a).unwrap();
        a.or(ch, 1).unwrap();
        a.sub(bh, 0x11).unwrap();
        a.add(r14, rax).unwrap();
        a.add(r14, rbx).unwrap();
        a.add(r14, rcx).unwrap();
        a.add(r14, rdx).unwrap();
        a.add(r14, r9).unwrap();
        a.dec(r15).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // Per iteration: SETcc of AH and the PUSHFQ.
    let bound = iterations * 2 + 10;
    assert!(stats.call_outs <= bound, "{} > {bound}", stats.call_outs);
}

#[test]
fn memory_inc_dec_and_immediate_pushes_agree() {
    // INC/DEC of 32- and 64-bit memory, GS-relative too (Linux's per-CPU
    // counters), wrapping through 0 and the sign boundary; CF kept across
    // them (consumed by ADC) and the rest of their flags by SETcc, CMOVcc
    // and PUSHFQ (itself native); PUSH of 8- and 32-bit immediates,
    // negative ones too.
    let iterations = 200u64;
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        gs_bases(a, DATA + 0x1000);
        a.mov(rsi, DATA).unwrap();
        a.mov(rcx, iterations).unwrap();
        a.mov(dword_ptr(rsi + 0x200), 0x7fff_fff0).unwrap();
        a.mov(qword_ptr(rsi + 0x208), 3).unwrap();
        a.set_label(&mut top).unwrap();
        a.mov(rax, rcx).unwrap();
        a.and(eax, 7).unwrap();
        a.cmp(eax, 4).unwrap();
        a.inc(dword_ptr(rsi + 0x200)).unwrap();
        a.adc(r8, 0).unwrap();
        a.seto(r9b).unwrap();
        a.add(r10, r9).unwrap();
        a.cmp(eax, 2).unwrap();
        a.dec(qword_ptr(rsi + 0x208)).unwrap();
        a.adc(r8, 0).unwrap();
        a.cmovs(r11, rcx).unwrap();
        a.cmovz(r12, rax).unwrap();
        a.inc(dword_ptr(0x10u64).gs()).unwrap();
        a.dec(qword_ptr(0x18u64).gs()).unwrap();
        a.pushfq().unwrap();
        a.pop(rdi).unwrap();
        a.add(r13, rdi).unwrap();
        a.push(0x1234_5678).unwrap();
        a.push(-5).unwrap();
        a.pop(rbx).unwrap();
        a.pop(rdx).unwrap();
        a.add(r14, rbx).unwrap();
        a.add(r14, rdx).unwrap();
        a.dec(rcx).unwrap();
        a.jnz(top).unwrap();
        a.mov(r15, qword_ptr(0x18u64).gs()).unwrap();
        a.mov(ebp, dword_ptr(0x10u64).gs()).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(o.gpr[5], iterations, "GS-relative INC");
    assert_eq!(o.gpr[15], iterations.wrapping_neg(), "GS-relative DEC");
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // None per iteration (PUSHFQ is native too): the first runs only.
    let bound = 30;
    assert!(stats.call_outs <= bound, "{} > {bound}", stats.call_outs);
}

#[test]
fn indirect_calls_and_jumps_agree() {
    // CALL/JMP through a register and through memory (a table indexed by
    // a register, and an RSP-relative slot read before the push), natively
    // translated: the return addresses pushed, RSP, the flags live across
    // them; then a JMP to a non-canonical target raises #GP with nothing
    // changed.
    let iterations = 200u64;
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        let mut f0 = a.create_label();
        let mut f1 = a.create_label();
        let mut back = a.create_label();
        let mut after_jmp = a.create_label();
        a.mov(rsi, DATA).unwrap();
        a.lea(rax, ptr(f0)).unwrap();
        a.mov(qword_ptr(rsi), rax).unwrap();
        a.lea(rax, ptr(f1)).unwrap();
        a.mov(qword_ptr(rsi + 8), rax).unwrap();
        a.lea(rax, ptr(after_jmp)).unwrap();
        a.mov(qword_ptr(rsi + 16), rax).unwrap();
        a.mov(rcx, iterations).unwrap();
        a.set_label(&mut top).unwrap();
        a.mov(ebx, ecx).unwrap();
        a.and(ebx, 1).unwrap();
        a.add(r8, rcx).unwrap();
        a.call(qword_ptr(rsi + rbx * 8)).unwrap();
        a.mov(rdx, qword_ptr(rsi + rbx * 8)).unwrap();
        a.call(rdx).unwrap();
        a.push(qword_ptr(rsi + 8)).unwrap();
        a.call(qword_ptr(rsp)).unwrap();
        a.pop(rdx).unwrap();
        a.lea(rdi, ptr(back)).unwrap();
        a.jmp(rdi).unwrap();
        a.set_label(&mut back).unwrap();
        a.jmp(qword_ptr(rsi + 16)).unwrap();
        a.set_label(&mut after_jmp).unwrap();
        a.dec(rcx).unwrap();
        a.jnz(top).unwrap();
        a.mov(rax, 0x8000_0000_0000_0000u64).unwrap();
        a.jmp(rax).unwrap();
        a.hlt().unwrap();
        a.set_label(&mut f0).unwrap();
        a.adc(r9, r8).unwrap();
        a.mov(r10, qword_ptr(rsp)).unwrap();
        a.ret().unwrap();
        a.set_label(&mut f1).unwrap();
        a.sbb(r11, r8).unwrap();
        a.xor(r12, rsp).unwrap();
        a.ret().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(o.gpr[15], HANDLER_MARK + 13, "#GP delivered");
    assert_eq!(o.gpr[0], 0x8000_0000_0000_0000);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // Only the PUSH of memory is not native (and a few first-level TLB
    // misses and the faulting JMP).
    let bound = iterations + 20;
    assert!(stats.call_outs <= bound, "{} > {bound}", stats.call_outs);
}

#[test]
fn segment_relative_operands_and_xchg_agree() {
    // FS/GS-relative memory operands through the inline access (loads,
    // stores, ALU and CMP on memory, MOVZX, CMOVcc, an indirect CALL
    // through GS), XCHG of registers (every size; 32-bit zero-extends) and
    // of a register with memory (aligned: inline with the locked cost;
    // misaligned: a call-out), the flags live across them.
    let iterations = 200u64;
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        let mut f = a.create_label();
        // GS base = DATA + 0x1000, FS base = DATA + 0x2000.
        write_msr(a, 0xc000_0101, (DATA + 0x1000) as u32);
        write_msr(a, 0xc000_0100, (DATA + 0x2000) as u32);
        a.lea(rax, ptr(f)).unwrap();
        a.mov(qword_ptr(0u64).gs(), rax).unwrap();
        a.mov(rsi, DATA).unwrap();
        a.mov(rcx, iterations).unwrap();
        a.mov(r8, 0x0123_4567_89ab_cdefu64).unwrap();
        a.mov(r12, 0x1111_2222_3333_4444u64).unwrap();
        a.mov(r13, 0x5555_6666_7777_8888u64).unwrap();
        a.mov(r14, 0x9999_aaaa_bbbb_ccccu64).unwrap();
        a.set_label(&mut top).unwrap();
        a.mov(ebx, ecx).unwrap();
        a.and(ebx, 0xff).unwrap();
        a.mov(rax, qword_ptr(rbx * 8 + 8).gs()).unwrap();
        a.add(rax, r8).unwrap();
        a.mov(qword_ptr(rbx * 8 + 8).gs(), rax).unwrap();
        a.add(qword_ptr(rbx * 4).fs(), ecx).unwrap();
        a.cmp(dword_ptr(rbx * 4).fs(), 0x1000).unwrap();
        a.cmovb(r9, qword_ptr(rbx * 8 + 8).gs()).unwrap();
        a.movzx(r10d, byte_ptr(rbx + 3).fs()).unwrap();
        a.call(qword_ptr(0u64).gs()).unwrap();
        // XCHG of registers.
        a.xchg(r8, r9).unwrap();
        a.xchg(r10d, r11d).unwrap();
        a.xchg(r12w, r13w).unwrap();
        a.xchg(r14b, al).unwrap();
        a.xchg(eax, eax).unwrap();
        // XCHG with memory: aligned (inline), misaligned (a call-out).
        a.xchg(qword_ptr(rsi + rbx * 8), r8).unwrap();
        a.xchg(dword_ptr(rsi + rbx * 4 + 0x800), r11d).unwrap();
        a.xchg(byte_ptr(rsi + rbx + 0xc00), r12b).unwrap();
        a.xchg(qword_ptr(rsi + 0xe01), r13).unwrap();
        a.adc(r14, r8).unwrap();
        a.dec(rcx).unwrap();
        a.jnz(top).unwrap();
        a.pushfq().unwrap();
        a.pop(rdi).unwrap();
        a.hlt().unwrap();
        a.set_label(&mut f).unwrap();
        a.sbb(r15, rcx).unwrap();
        a.ret().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // Per iteration only the misaligned XCHG (and first-level TLB misses).
    let bound = iterations + 40;
    assert!(stats.call_outs <= bound, "{} > {bound}", stats.call_outs);
}

#[test]
fn swapgs_runs_natively_at_cpl0() {
    // SWAPGS in translated kernel code exchanges the GS bases itself (no
    // call-out), with dirty flags live across it and GS-relative accesses
    // on both sides seeing the base of the moment.
    let iterations = 300u64;
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        // GS base = DATA + 0x1000, kernel GS base = DATA + 0x2000.
        write_msr(a, 0xc000_0101, (DATA + 0x1000) as u32);
        write_msr(a, 0xc000_0102, (DATA + 0x2000) as u32);
        a.mov(rcx, iterations).unwrap();
        a.xor(r9d, r9d).unwrap();
        a.set_label(&mut top).unwrap();
        a.mov(ebx, ecx).unwrap();
        a.and(ebx, 0x3f).unwrap();
        a.add(qword_ptr(rbx * 8).gs(), rcx).unwrap();
        a.cmp(rcx, 150).unwrap();
        a.swapgs().unwrap();
        a.adc(r9, 0).unwrap();
        a.sub(qword_ptr(rbx * 8 + 0x200).gs(), rcx).unwrap();
        a.swapgs().unwrap();
        a.swapgs().unwrap();
        a.adc(qword_ptr(rbx * 8 + 0x400).gs(), r9).unwrap();
        a.dec(rcx).unwrap();
        a.jnz(top).unwrap();
        // The bases as they ended (swapped an odd number of times per
        // iteration), read back.
        a.mov(ecx, 0xc000_0102u32).unwrap();
        a.rdmsr().unwrap();
        a.mov(r10d, eax).unwrap();
        a.mov(ecx, 0xc000_0101u32).unwrap();
        a.rdmsr().unwrap();
        a.mov(r11d, eax).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // 300 iterations swap three times each: an even count of iterations
    // leaves the bases where they started.
    assert_eq!(o.gpr[10], DATA + 0x2000);
    assert_eq!(o.gpr[11], DATA + 0x1000);
    assert_eq!(o.gpr[9], 149, "CF of the compare survives SWAPGS");
    // Three SWAPGS per iteration, none of them a call-out (the MSR
    // accesses and first-level TLB misses are).
    let bound = 40;
    assert!(stats.call_outs <= bound, "{} > {bound}", stats.call_outs);
}

#[test]
fn stack_runs_agree() {
    // Runs of PUSHes and POPs (one first-level probe for the whole run
    // when it lies in one page; one by one otherwise): the stack walks
    // over a page boundary, so some runs cross it (one by one) and the
    // first runs miss the first-level TLB (filled one by one); a value on
    // the stack is changed between the runs. Then a run of POPs that
    // reaches an unmapped page takes its #PF at the right POP.
    let iterations = 120u64;
    let pushed = [
        rax, rbx, rcx, rdx, rbp, rsi, rdi, r8, r9, r10, r11, r12, r13, r14, r15,
    ];
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        a.mov(rcx, iterations).unwrap();
        a.mov(rbx, 0x0123_4567_89ab_cdefu64).unwrap();
        a.mov(r9, 3u64).unwrap();
        a.set_label(&mut top).unwrap();
        a.mov(eax, ecx).unwrap();
        a.and(eax, 31).unwrap();
        a.lea(rsp, qword_ptr(rax * 8 + (DATA + 0x2000 - 0x40)))
            .unwrap();
        for r in pushed {
            a.push(r).unwrap();
        }
        a.add(r8, rcx).unwrap();
        a.imul_2(r9, r8).unwrap();
        a.mov(qword_ptr(rsp + 8), r9).unwrap();
        for r in pushed.iter().rev() {
            a.pop(*r).unwrap();
        }
        a.xor(rbx, r14).unwrap();
        a.push(rbx).unwrap();
        a.push(r9).unwrap();
        a.pop(r10).unwrap();
        a.pop(r11).unwrap();
        a.dec(rcx).unwrap();
        a.jnz(top).unwrap();
        // Two POPs from mapped memory, the third at the first unmapped
        // byte (the rig maps MEM bytes).
        a.mov(rsp, MEM - 0x10).unwrap();
        a.pop(rax).unwrap();
        a.pop(rdx).unwrap();
        a.pop(rsi).unwrap();
        a.pop(rdi).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(o.gpr[15], HANDLER_MARK + 14, "the third POP's #PF");
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    assert!(stats.blocks_translated > 0, "{stats:?}");
}

#[test]
fn memory_divides_pushes_and_tests_agree() {
    // DIV/IDIV by a 32/64-bit memory operand (inline read; #DE and the
    // IDIV call-out cases as for registers), PUSH of memory (RSP-relative
    // too: the address is computed before the push), TEST of memory with
    // immediates and registers at every size, the flags consumed natively
    // (Jcc, CMOVcc, ADC) and through PUSHFQ.
    let iterations = 200u64;
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        let mut skip = a.create_label();
        a.mov(rsi, DATA).unwrap();
        a.mov(rcx, iterations).unwrap();
        a.mov(r8, 0x9e37_79b9_7f4a_7c15u64).unwrap();
        a.set_label(&mut top).unwrap();
        a.imul_3(r8, r8, 0x2545_f491).unwrap();
        a.add(r8, rcx).unwrap();
        a.mov(rbx, r8).unwrap();
        a.shr(rbx, 7).unwrap();
        a.or(rbx, 1).unwrap();
        a.mov(qword_ptr(rsi + 0x100), rbx).unwrap();
        a.mov(rax, r8).unwrap();
        a.mov(edx, ecx).unwrap();
        a.div(qword_ptr(rsi + 0x100)).unwrap();
        a.add(r9, rax).unwrap();
        a.add(r10, rdx).unwrap();
        a.mov(eax, r8d).unwrap();
        a.cdq().unwrap();
        a.idiv(dword_ptr(rsi + 0x100)).unwrap();
        a.xor(r9, rax).unwrap();
        a.mov(rax, r8).unwrap();
        a.cqo().unwrap();
        a.idiv(qword_ptr(rsi + 0x100)).unwrap();
        a.add(r10, rdx).unwrap();
        // PUSH of memory, RSP-relative and not.
        a.push(qword_ptr(rsi + 0x100)).unwrap();
        a.push(qword_ptr(rsp)).unwrap();
        a.pop(r11).unwrap();
        a.pop(r12).unwrap();
        // TEST of memory.
        a.add(r13, r8).unwrap();
        a.test(byte_ptr(rsi + 0x100), 0x80).unwrap();
        a.jz(skip).unwrap();
        a.adc(r14, r8).unwrap();
        a.test(dword_ptr(rsi + 0x100), r8d).unwrap();
        a.cmovs(r14, r9).unwrap();
        a.set_label(&mut skip).unwrap();
        a.test(word_ptr(rsi + 0x100), 0x8001).unwrap();
        a.cmovp(r13, r10).unwrap();
        a.test(qword_ptr(rsi + 0x100), -2).unwrap();
        a.pushfq().unwrap();
        a.pop(rdi).unwrap();
        a.add(r15, rdi).unwrap();
        a.test(qword_ptr(rsi + 0x100), r13).unwrap();
        a.adc(r15, 0).unwrap();
        a.dec(rcx).unwrap();
        a.jnz(top).unwrap();
        // Divide by a zero in memory: #DE.
        a.mov(qword_ptr(rsi + 0x108), 0).unwrap();
        a.div(qword_ptr(rsi + 0x108)).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(o.gpr[15], HANDLER_MARK, "#DE delivered");
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // Per iteration the CDQ-free call-outs: the PUSHFQ only.
    let bound = iterations + 30;
    assert!(stats.call_outs <= bound, "{} > {bound}", stats.call_outs);
}

#[test]
fn first_level_fills_from_4k_tlb_entries_agree() {
    // 2..6 MiB of the rig remapped with 4 KiB pages: loops over their
    // 1024 pages (as many as the TLB holds), reading, updating and
    // writing, so most accesses miss the first level and hit the TLB
    // through its hints (the translator's fill thunk) in sets that are
    // full (their recently-used bits wrap), and set 0, which also holds
    // the 2 MiB code and stack pages, keeps evicting, between stack
    // accesses on a 2 MiB page (the Rust fill). The TLB must end identical, entries,
    // places and recently-used bits, as well as the counters.
    const PT: u64 = 0x9000;
    const SPLIT: u64 = 2;
    let prog = |a: &mut CodeAssembler| {
        let mut outer = a.create_label();
        let mut inner = a.create_label();
        a.mov(r8, 4u64).unwrap();
        a.xor(esi, esi).unwrap();
        a.set_label(&mut outer).unwrap();
        a.mov(rdi, 0x20_0000u64).unwrap();
        a.mov(ecx, 1024).unwrap();
        a.set_label(&mut inner).unwrap();
        a.mov(rax, qword_ptr(rdi)).unwrap();
        a.add(rax, rcx).unwrap();
        a.mov(qword_ptr(rdi), rax).unwrap();
        a.add(rsi, qword_ptr(rdi + 8)).unwrap();
        a.push(rsi).unwrap();
        a.pop(rdx).unwrap();
        a.add(rdi, 4096).unwrap();
        a.dec(ecx).unwrap();
        a.jnz(inner).unwrap();
        a.dec(r8).unwrap();
        a.jnz(outer).unwrap();
        a.hlt().unwrap();
    };
    let split = |engine, threshold| {
        let r = rig(prog);
        remap_4k(&r, PT, SPLIT);
        run_rig(engine, threshold, r)
    };
    let (interp, stats) = engines_agree("4 KiB pages", &[1], split);
    let stats = stats[0];
    assert_eq!(interp.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // Hits through the first level's misses, and evictions.
    assert!(interp.tlb.hits > 5000, "{:?}", interp.tlb);
    assert!(interp.tlb.misses > 1000, "{:?}", interp.tlb);
}

#[test]
fn first_level_fills_from_2m_and_1g_tlb_entries_agree() {
    large_page_fills(None);
}

#[test]
fn first_level_fills_under_a_pcid_agree() {
    // The same under CR4.PCIDE with PCID 5: the thunk finds the hints in
    // the slots the TLB keeps them in under that PCID.
    large_page_fills(Some(5));
}

fn large_page_fills(pcid: Option<u64>) {
    // Four rounds over the 512 4 KiB pages of a 2 MiB page (read, add,
    // write) and, through a 1 GiB page mapping linear 1..2 GiB to
    // physical 0..1 GiB, over 512 pages of other physical memory (read
    // and write). The two pages of an iteration share a first-level slot
    // (64, by page number), so every access misses the first level; their
    // hints (1024, by page number) do not collide, so from the second
    // round on each hits a large TLB entry through its hint (nothing is
    // filled then, so the TLB's epoch stays): the fill thunk's large path. The engines must end identical (registers, memory sums,
    // TLB entries, places and recently-used bits, counters), and the
    // thunk must have taken most of those hits itself.
    const ALIAS: u64 = 0x4000_0000;
    let prog = |a: &mut CodeAssembler| {
        let mut outer = a.create_label();
        let mut inner = a.create_label();
        a.mov(r8, 4u64).unwrap();
        a.mov(esi, 1).unwrap();
        a.set_label(&mut outer).unwrap();
        a.mov(rdi, 0x40_0000u64).unwrap();
        a.mov(rbx, ALIAS + 0x60_0000).unwrap();
        a.mov(ecx, 512).unwrap();
        a.set_label(&mut inner).unwrap();
        a.mov(rax, qword_ptr(rdi + 0x18)).unwrap();
        a.add(rax, rcx).unwrap();
        a.mov(qword_ptr(rdi + 0x18), rax).unwrap();
        a.add(rsi, qword_ptr(rbx + 0x7f8)).unwrap();
        a.add(rsi, rcx).unwrap();
        a.mov(qword_ptr(rbx + 0x7f8), rsi).unwrap();
        a.add(rdi, 4096).unwrap();
        a.add(rbx, 4096).unwrap();
        a.dec(ecx).unwrap();
        a.jnz(inner).unwrap();
        a.dec(r8).unwrap();
        a.jnz(outer).unwrap();
        a.mov(rax, qword_ptr(0x40_0018u64)).unwrap();
        a.mov(rdx, qword_ptr(0x5f_f018u64)).unwrap();
        a.hlt().unwrap();
    };
    let run = |engine, threshold| {
        let mut r = rig(prog);
        // PDPT[1]: a 1 GiB user+writable page at physical 0.
        r.mem
            .write_bytes(Hpa(PDPT + 8), &0x87u64.to_le_bytes())
            .unwrap();
        if let Some(pcid) = pcid {
            let s = r.cpu.state_mut();
            s.cr4 |= 1 << 17;
            s.cr3 |= pcid;
        }
        run_rig(engine, threshold, r)
    };
    let (interp, stats) = engines_agree(&format!("pcid {pcid:?}"), &[1], run);
    let stats = stats[0];
    assert_eq!(interp.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    assert_ne!(interp.gpr[6], 0);
    assert!(interp.tlb.hits > 8000, "{:?}", interp.tlb);
    // The first round's misses and hint probes go to the Rust fill; the
    // later rounds' hits stay in the thunk.
    assert!(
        stats.rust_fills * 2 < interp.tlb.hits,
        "{stats:?} {:?}",
        interp.tlb
    );
}

#[test]
fn chaining_exits_refill_the_first_level_itlb_through_the_thunk() {
    // A loop whose two blocks are 64 pages apart: their pages share a
    // first-level iTLB slot (64 slots, by page number), so each exit's
    // fetch misses the first level and hits the TLB (a 2 MiB entry
    // through its hint). The chaining exits take those fills through the
    // fill thunk and chain on; `Cpu::jit_chain_fetch` (counted in
    // `chain_fetches`) sees only the first rounds. The engines must end
    // identical (TLB hits, recently-used bits, cycles).
    let rounds = 2000u32;
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        let mut far = a.create_label();
        a.mov(ecx, rounds).unwrap();
        a.set_label(&mut top).unwrap();
        // 4 bytes, then a 5-byte JMP: `far` is 0x40000 after `top`.
        a.add(rax, 1).unwrap();
        a.jmp(far).unwrap();
        a.db(&vec![0x90; 0x40000 - 9]).unwrap();
        a.set_label(&mut far).unwrap();
        a.add(rbx, rax).unwrap();
        a.dec(ecx).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(o.gpr[0], rounds as u64);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // Two fetches a round, all hits but the first.
    assert!(o.tlb.hits + 1 >= 2 * rounds as u64, "{:?}", o.tlb);
    assert!(
        stats.chain_fetches < rounds as u64 / 10,
        "{} chaining-exit fetches through Rust",
        stats.chain_fetches
    );
}

#[test]
fn an_exit_checked_before_its_itlb_slot_changed_checks_again() {
    // A (page X) jumps to T (page P). In a first phase T goes back to A:
    // every fetch hits the first-level iTLB, so A's exit checks T's entry
    // in full once and goes straight on after that (the entry records
    // the slot's version). In the second phase T goes on to U, 64 pages
    // after P (the same first-level iTLB slot), which goes back to A: the
    // fill for U (by the fill thunk) takes P's slot, so A's next exit to
    // T must check again and fetch (a TLB hit, counted) instead of going
    // straight on.
    let rounds = 100u32;
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        let mut t = a.create_label();
        let mut u = a.create_label();
        let mut done = a.create_label();
        a.mov(ecx, rounds).unwrap();
        a.xor(esi, esi).unwrap();
        a.set_label(&mut top).unwrap();
        a.add(rax, 1).unwrap();
        a.jmp(t).unwrap();
        // T on the next page, U 64 pages after T.
        a.db(&vec![0x90; 0x1000]).unwrap();
        a.set_label(&mut t).unwrap();
        a.add(rbx, rax).unwrap();
        a.test(esi, esi).unwrap();
        a.jnz(u).unwrap();
        a.dec(ecx).unwrap();
        a.jnz(top).unwrap();
        a.test(esi, esi).unwrap();
        a.jnz(done).unwrap();
        a.mov(esi, 1u32).unwrap();
        a.mov(ecx, rounds).unwrap();
        a.jmp(top).unwrap();
        a.set_label(&mut done).unwrap();
        a.hlt().unwrap();
        a.db(&vec![0x90; 0x40000]).unwrap();
        a.set_label(&mut u).unwrap();
        a.add(rdx, rbx).unwrap();
        a.dec(ecx).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(o.gpr[0], 2 * rounds as u64);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // The second phase's fetches of T and U miss the first level and hit
    // the TLB: two hits a round.
    assert!(o.tlb.hits >= 2 * rounds as u64, "{:?}", o.tlb);
}

#[test]
fn chaining_exits_fetch_after_mode_changes_and_privilege_switches() {
    // SYSCALL/SYSRET round trips between ring 3 and ring 0, with SWAPGS
    // and RDTSC (system instructions that change nothing the first-level
    // TLB depends on: it keeps its slots) and, in the
    // kernel path, INVLPG of the next page (its entry leaves the TLB, so
    // its first-level slots go) and a jump there: that jump's chaining exit
    // misses the first-level iTLB, so the fetch is made from the exit
    // (`Cpu::jit_chain_fetch`). (SYSCALL and SYSRET go on through that
    // fetch too, which makes the event check SYSRET asks for.) The user
    // code then jumps to an unmapped page:
    // the fetch from a chaining exit takes the #PF as the run loop's would.
    let rounds = 200u32;
    let (o, stats) = both(|a| {
        let mut entry = a.create_label();
        let mut second = a.create_label();
        syscall_msrs(a, entry, 0);
        // Kernel GS base and GS base differ, so SWAPGS is seen.
        write_msr(a, 0xc000_0102, 0x5000);
        user_syscall_loop(a, 2, rounds, |a| a.add(rbx, r13).unwrap());
        // An unmapped page (the rig maps the first 64 MiB).
        a.jmp(MEM + 0x5000).unwrap();
        // The kernel side: SWAPGS, RDTSC, INVLPG of the next page, a jump
        // there, SWAPGS, SYSRET.
        a.set_label(&mut entry).unwrap();
        a.swapgs().unwrap();
        a.add(r13, rcx).unwrap();
        a.rdtsc().unwrap();
        a.add(r14, rax).unwrap();
        a.xor(r13, rdx).unwrap();
        a.invlpg(ptr(second)).unwrap();
        a.jmp(second).unwrap();
        a.db(&[0x90; 0x1000]).unwrap();
        a.set_label(&mut second).unwrap();
        a.add(r13, 7).unwrap();
        a.swapgs().unwrap();
        a.sysretq().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(
        o.gpr[15],
        HANDLER_MARK + 14,
        "the fetch's #PF was delivered"
    );
    assert_eq!(o.gpr[12], 0, "every round ran");
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // At least the jump to the next page, every round.
    let bound = rounds as u64;
    assert!(
        stats.chain_fetches >= bound,
        "{} < {bound}",
        stats.chain_fetches
    );
}

#[test]
fn syscalls_chain_into_the_kernel_through_the_fetch() {
    // SYSCALL changes the privilege and asks for no event check (IF can
    // only be cleared): translated code goes on into the kernel's entry
    // block through `Cpu::jit_chain_fetch` (the fetch at the new
    // privilege), not back through the run loop; so does SYSRET (IF set
    // again), whose event check that fetch makes.
    let rounds = 300u32;
    let (o, stats) = both(|a| {
        let mut entry = a.create_label();
        // FMASK clears IF.
        syscall_msrs(a, entry, 0x200);
        // To ring 3 with IF set.
        user_syscall_loop(a, 0x202, rounds, |_| {});
        a.syscall().unwrap();
        // The kernel: count, and halt after the last round.
        a.set_label(&mut entry).unwrap();
        a.add(r13, rcx).unwrap();
        a.pushfq().unwrap();
        a.pop(r14).unwrap();
        let mut back = a.create_label();
        a.test(r12d, r12d).unwrap();
        a.jnz(back).unwrap();
        a.hlt().unwrap();
        a.set_label(&mut back).unwrap();
        a.sysretq().unwrap();
    });
    assert_eq!(o.gpr[12], 0, "every round ran");
    assert_eq!(o.gpr[14] & 0x200, 0, "FMASK cleared IF in the kernel");
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // Every SYSCALL but the first few (before the blocks are translated).
    let bound = rounds as u64 - 10;
    assert!(
        stats.chain_fetches >= bound,
        "{} < {bound}",
        stats.chain_fetches
    );
    assert_eq!(o.exit, VmExit::Hlt);
}

#[test]
fn events_after_sysret_are_checked_where_the_run_loop_would() {
    // SYSRET to ring 3 with IF set asks for an event check; translated
    // code makes it on its way on (`Cpu::jit_chain_fetch`). Bare, an
    // external interrupt pending since the start is delivered there,
    // before the first user instruction; in guest mode with
    // interrupt-window exiting, the check ends in that VM exit. Both as
    // the interpreter does.
    let prog = |a: &mut CodeAssembler| {
        let mut user = a.create_label();
        a.lea(rcx, ptr(user)).unwrap();
        a.mov(r11d, 0x202u32).unwrap();
        a.mov(r13d, 5u32).unwrap();
        a.sysretq().unwrap();
        a.set_label(&mut user).unwrap();
        a.mov(r13d, 9u32).unwrap();
        a.mov(r14, qword_ptr(DATA)).unwrap();
        // (HLT at ring 3 is #GP: the handler stops the run.)
        a.hlt().unwrap();
    };
    for guest in [false, true] {
        let make = || {
            let mut r = rig(prog);
            // EFER.SCE; STAR: SYSRET to CS 0x23 / SS 0x1b (set here: MSR
            // accesses exit in guest mode).
            let st = r.cpu.state_mut();
            st.efer |= 1;
            st.star = 0x0013_0008 << 32;
            if guest {
                r = r.guest(machine::VmxControls {
                    interrupt_window_exiting: true,
                    ..controls()
                });
            } else {
                r.cpu.post_external_interrupt(0x30);
            }
            r
        };
        let what = format!("guest mode: {guest}");
        let (o, stats) = engines_agree(&what, &[1], |e, t| run_rig(e, t, make()));
        let stats = stats[0];
        assert_eq!(stats.blocks_failed, 0, "{stats:?}");
        assert!(stats.chain_fetches >= 1, "{stats:?}");
        // The user code never ran: the event came first.
        assert_eq!(o.gpr[13], 5, "guest mode: {guest}");
        if guest {
            assert_eq!(o.exit, VmExit::InterruptWindow);
        } else {
            assert_eq!(o.exit, VmExit::Hlt);
            assert_eq!(o.gpr[15], HANDLER_MARK + 0x30);
        }
    }
}

/// One stop of [`run_stepped`]: the exit, cycles, instructions, state
/// digest (RFLAGS included) and RIP.
type Stop = (VmExit, u64, u64, u64, u64);

/// Runs `prog` on `engine` in slices of `step` cycles (each slice a run
/// to a cycle limit) until it halts; returns every stop.
fn run_stepped(
    engine: Engine,
    threshold: u32,
    step: u64,
    prog: impl FnOnce(&mut CodeAssembler),
) -> (Vec<Stop>, machine::jit::JitStats) {
    machine::jit::set_verify_encoding(true);
    let mut r = rig(prog);
    r.cpu.set_engine(engine);
    r.cpu.set_jit_threshold(threshold);
    let mut stops = Vec::new();
    for _ in 0..100_000 {
        let limit = r.cpu.cycles() + step;
        let exit = r.cpu.run(&r.mem, limit);
        let more = exit == VmExit::CycleLimit;
        stops.push((
            exit,
            r.cpu.cycles(),
            r.cpu.stats().instructions,
            r.cpu.state_digest(),
            r.cpu.state().rip,
        ));
        if !more {
            break;
        }
    }
    (stops, r.cpu.jit_stats())
}

#[test]
fn self_loops_with_dead_entry_flags_stop_exactly() {
    // Loops back to their own block's start whose flags are dead at entry
    // (written whole before anything observes them): the back edge keeps
    // the flags in r15 and writes them back only where it leaves. Runs cut
    // into slices by odd cycle limits stop on those back edges (the
    // deadline compare), where RFLAGS must be the interpreter's: after
    // SHR (AF as the interpreter leaves it) and after TEST (AF clear).
    // The RDTSC loop runs with CR4.SMAP on and sets and clears RFLAGS.AC
    // every iteration (STAC, CLAC: call-outs that keep the first-level
    // TLB, as SMAP revokes nothing of it here), and sets and clears CR0.TS
    // (LMSW, CLTS: a change of the lookup-key context, which empties the
    // first-level TLB without ending the block), so its back edge's iTLB
    // probe misses and the fetch is made from the exit with the flags
    // written back first. A loop whose
    // flags are live at entry (ADC first) takes the back edge that writes
    // them back.
    let prog = |a: &mut CodeAssembler| {
        let mut l1 = a.create_label();
        let mut l2 = a.create_label();
        let mut l3 = a.create_label();
        let mut l4 = a.create_label();
        // Population count by shifts: flags dirty from SHR at the JNZ.
        a.mov(rbx, 0xdead_beef_f00d_1234u64).unwrap();
        a.mov(r13d, 40u32).unwrap();
        a.set_label(&mut l1).unwrap();
        a.mov(rax, rbx).unwrap();
        a.and(eax, 1).unwrap();
        a.add(rcx, rax).unwrap();
        a.shr(rbx, 1).unwrap();
        a.jnz(l1).unwrap();
        // TEST at the back edge (a logic op: AF clear).
        a.mov(ebx, 700u32).unwrap();
        a.set_label(&mut l2).unwrap();
        a.mov(rax, rbx).unwrap();
        a.and(eax, 7).unwrap();
        a.add(rcx, rax).unwrap();
        a.imul_3(rdx, rcx, 3).unwrap();
        a.sub(rbx, 1).unwrap();
        a.test(rbx, rbx).unwrap();
        a.jnz(l2).unwrap();
        // RDTSC, STAC, CLAC, LMSW and CLTS: call-outs; the last two empty
        // the first-level TLB (and do not end the block, as a MOV to CR0
        // would). The loop makes no data access (the pages are user pages,
        // which SMAP forbids to supervisor accesses with AC clear).
        a.mov(r14, cr4).unwrap();
        a.bts(r14, 21).unwrap();
        a.mov(cr4, r14).unwrap();
        a.mov(ebx, 300u32).unwrap();
        a.set_label(&mut l3).unwrap();
        a.xor(r8d, 0x55).unwrap();
        a.rdtsc().unwrap();
        a.stac().unwrap();
        a.clac().unwrap();
        // CR0.PE and TS (LMSW keeps PE set).
        a.mov(r15d, 9u32).unwrap();
        a.lmsw(r15w).unwrap();
        a.clts().unwrap();
        a.add(r9, rax).unwrap();
        a.add(r10, r8).unwrap();
        a.dec(ebx).unwrap();
        a.jnz(l3).unwrap();
        a.btr(r14, 21).unwrap();
        a.mov(cr4, r14).unwrap();
        // Flags live at entry.
        a.mov(ebx, 500u32).unwrap();
        a.set_label(&mut l4).unwrap();
        a.adc(r11, r12).unwrap();
        a.add(r12, 0x1234_5678).unwrap();
        a.rol(r12, 7).unwrap();
        a.dec(ebx).unwrap();
        a.jnz(l4).unwrap();
        a.dec(r13d).unwrap();
        a.jnz(l1).unwrap();
        a.pushfq().unwrap();
        a.pop(rdi).unwrap();
        a.hlt().unwrap();
    };
    for step in [1_000_003, 97, 31] {
        let what = format!("step {step}");
        let (interp, stats) = engines_agree(&what, &[1, 2], |e, t| run_stepped(e, t, step, prog));
        let stats = stats[0];
        assert_eq!(interp.last().unwrap().0, VmExit::Hlt, "step {step}");
        assert!(interp.len() > (step == 31) as usize * 1000, "step {step}");
        assert!(stats.blocks_translated >= 4, "{stats:?}");
        assert_eq!(stats.blocks_failed, 0, "{stats:?}");
        assert!(stats.chain_fetches > 0, "{stats:?}");
    }
}

#[test]
fn a_self_loop_whose_fills_evict_its_code_page_fetches_again() {
    // A TLB of one set of two ways, and a loop that loads from one of two
    // other 2 MiB pages, switching every 32 iterations. Between switches
    // everything hits the first-level TLB: no Rust runs, and the back edge
    // skips its fetch checks once they have passed. At a switch the load
    // misses the TLB and the Rust fill evicts the code page's entry (the
    // least recently used: first-level hits leave the TLB's order alone),
    // so that back edge must find its fetch gone and fetch again (a TLB
    // miss), as the interpreter does.
    let prog = |a: &mut CodeAssembler| {
        let mut top = a.create_label();
        a.mov(ecx, 300u32).unwrap();
        a.set_label(&mut top).unwrap();
        a.mov(edx, ecx).unwrap();
        a.and(edx, 32).unwrap();
        a.shl(edx, 16).unwrap();
        a.mov(rax, qword_ptr(rdx + 0x40_0000)).unwrap();
        a.add(rbx, rax).unwrap();
        a.add(rbx, rcx).unwrap();
        a.dec(ecx).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    };
    let tlb = machine::mmu::tlb::TlbConfig {
        entries: 2,
        ways: 2,
    };
    let (interp, stats) = engines_agree("loop evicting its code page", &[1, 2], |e, t| {
        rig(prog).with_tlb(tlb).outcome(e, t)
    });
    assert_eq!(interp.exit, VmExit::Hlt);
    // About two misses per switch: the load's, the fetch's.
    assert!(interp.tlb.misses >= 18, "{:?}", interp.tlb);
    let stats = stats[0];
    assert!(stats.blocks_translated >= 1, "{stats:?}");
    assert!(stats.chain_fetches >= 8, "{stats:?}");
}

/// Sets MSR `msr` to `value` (below 4 GiB): WRMSR with EDX zero.
/// To ring 3 (SYSRET with RFLAGS = `rflags`), then `rounds` rounds
/// (r12 counting down) of: rbx += r12, SYSCALL, rbx *= rbx, `mix`.
fn user_syscall_loop(
    a: &mut CodeAssembler,
    rflags: u32,
    rounds: u32,
    mix: impl Fn(&mut CodeAssembler),
) {
    let mut user = a.create_label();
    let mut uloop = a.create_label();
    a.lea(rcx, ptr(user)).unwrap();
    a.mov(r11d, rflags).unwrap();
    a.sysretq().unwrap();
    a.set_label(&mut user).unwrap();
    a.mov(r12d, rounds).unwrap();
    a.set_label(&mut uloop).unwrap();
    a.add(rbx, r12).unwrap();
    a.syscall().unwrap();
    a.imul_2(rbx, rbx).unwrap();
    mix(a);
    a.dec(r12d).unwrap();
    a.jnz(uloop).unwrap();
}

/// EFER.SCE; STAR: SYSCALL to CS 0x08, SYSRET to CS 0x23 / SS 0x1b;
/// LSTAR = `entry`; FMASK = `fmask`.
fn syscall_msrs(a: &mut CodeAssembler, entry: CodeLabel, fmask: u32) {
    a.mov(ecx, 0xc000_0080u32).unwrap();
    a.rdmsr().unwrap();
    a.or(eax, 1).unwrap();
    a.wrmsr().unwrap();
    a.mov(ecx, 0xc000_0081u32).unwrap();
    a.xor(eax, eax).unwrap();
    a.mov(edx, 0x0013_0008u32).unwrap();
    a.wrmsr().unwrap();
    a.mov(ecx, 0xc000_0082u32).unwrap();
    a.lea(rax, ptr(entry)).unwrap();
    a.mov(rdx, rax).unwrap();
    a.shr(rdx, 32).unwrap();
    a.wrmsr().unwrap();
    write_msr(a, 0xc000_0084, fmask);
}

fn write_msr(a: &mut CodeAssembler, msr: u32, value: u32) {
    a.mov(ecx, msr).unwrap();
    a.mov(eax, value).unwrap();
    a.xor(edx, edx).unwrap();
    a.wrmsr().unwrap();
}

/// Sets the GS base and the kernel GS base to `base` (below 4 GiB), so
/// that SWAPGS keeps GS.
fn gs_bases(a: &mut CodeAssembler, base: u64) {
    for msr in [0xc000_0101u32, 0xc000_0102] {
        write_msr(a, msr, base as u32);
    }
}

#[test]
fn memory_forms_without_fast_forms_fill_the_first_level() {
    // XCHG with memory (every size), PUSH of memory (flat and GS-relative),
    // TEST of memory, CALL and JMP through memory, each after a
    // SWAPGS (a call-out; since session 13 it keeps the first-level TLB,
    // so most of these accesses hit it); after a CR3 reload (the TLB
    // emptied) the fills walk (the Rust fill). The forms must run in
    // generated code after their fill: the call-outs are the system
    // instructions only.
    let iterations = 150u64;
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        let mut f = a.create_label();
        let mut back = a.create_label();
        gs_bases(a, DATA + 0x1000);
        a.mov(rsi, DATA).unwrap();
        a.lea(rax, ptr(f)).unwrap();
        a.mov(qword_ptr(rsi + 0x200), rax).unwrap();
        a.lea(rax, ptr(back)).unwrap();
        a.mov(qword_ptr(rsi + 0x208), rax).unwrap();
        a.mov(rcx, iterations).unwrap();
        a.mov(r8, 0x0123_4567_89ab_cdefu64).unwrap();
        a.mov(r11, 0x1111_2222_3333_4444u64).unwrap();
        a.mov(r12, 0x5555_6666_7777_8888u64).unwrap();
        a.mov(r13, 0x9999_aaaa_bbbb_ccccu64).unwrap();
        a.set_label(&mut top).unwrap();
        a.mov(ebx, ecx).unwrap();
        a.and(ebx, 0x3f).unwrap();
        a.swapgs().unwrap();
        a.xchg(qword_ptr(rsi + rbx * 8), r8).unwrap();
        a.swapgs().unwrap();
        a.xchg(dword_ptr(rsi + rbx * 4 + 0x800), r11d).unwrap();
        a.swapgs().unwrap();
        a.xchg(byte_ptr(rsi + rbx + 0xc00), r12b).unwrap();
        a.xchg(word_ptr(rsi + rbx * 2 + 0xd00), r13w).unwrap();
        a.swapgs().unwrap();
        a.push(qword_ptr(rbx * 8).gs()).unwrap();
        a.pop(r9).unwrap();
        a.swapgs().unwrap();
        a.push(qword_ptr(rsi + 0x100)).unwrap();
        a.pop(r10).unwrap();
        a.add(r14, r8).unwrap();
        a.swapgs().unwrap();
        a.test(qword_ptr(rsi + rbx * 8), r14).unwrap();
        a.cmovs(r15, r9).unwrap();
        a.swapgs().unwrap();
        a.test(byte_ptr(rsi + rbx + 0x101), 0x40).unwrap();
        a.adc(r15, 1).unwrap();
        // An odd divisor in memory; rdx below it. (DIV of memory has no
        // fill: its read hits the slot the TEST filled.)
        a.lea(rax, qword_ptr(rbx * 2 + 3)).unwrap();
        a.mov(qword_ptr(rsi + 0x110), rax).unwrap();
        a.mov(rax, r8).unwrap();
        a.xor(edx, edx).unwrap();
        a.div(qword_ptr(rsi + 0x110)).unwrap();
        a.add(r10, rdx).unwrap();
        a.swapgs().unwrap();
        a.call(qword_ptr(rsi + 0x200)).unwrap();
        // The TLB emptied: the next fills walk.
        a.mov(rax, cr3).unwrap();
        a.mov(cr3, rax).unwrap();
        a.xchg(qword_ptr(rsi + rbx * 8 + 0x400), r8).unwrap();
        a.swapgs().unwrap();
        a.jmp(qword_ptr(rsi + 0x208)).unwrap();
        a.set_label(&mut back).unwrap();
        a.dec(rcx).unwrap();
        a.jnz(top).unwrap();
        a.pushfq().unwrap();
        a.pop(rdi).unwrap();
        a.hlt().unwrap();
        a.set_label(&mut f).unwrap();
        a.sbb(rdi, rcx).unwrap();
        a.ret().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(o.gpr[1], 0, "every iteration ran");
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // Per iteration 9 SWAPGS and the two CR3 moves; nothing else.
    let bound = iterations * 11 + 40;
    assert!(stats.call_outs <= bound, "{} > {bound}", stats.call_outs);
}

#[test]
fn memory_forms_fault_precisely_after_a_fill() {
    // Each form after a SWAPGS (a call-out), on pages walking (each new
    // page misses the first level) up to the end of the mapped memory: the
    // fourth iteration's access is
    // on an unmapped page (or crosses into it), so the fill's walk (or the
    // interpreter's, for a crossing access) takes the #PF, which must be
    // delivered at the instruction (RIP in the frame, on a stack inside
    // the compared memory) with everything before it done. A generic form
    // (the interpreter has no fast path for it) stores RIP before its
    // fill for that.
    type Form = fn(&mut CodeAssembler);
    let forms: [(&str, Form); 12] = [
        ("xchg m64", |a| a.xchg(qword_ptr(rsi), rax).unwrap()),
        ("xchg m32", |a| a.xchg(dword_ptr(rsi + 4), eax).unwrap()),
        ("xchg m8", |a| a.xchg(byte_ptr(rsi + 7), al).unwrap()),
        ("push m64", |a| {
            a.push(qword_ptr(rsi)).unwrap();
            a.pop(rax).unwrap();
        }),
        ("push gs:m64", |a| {
            a.mov(r9, rbx).unwrap();
            a.shl(r9, 12).unwrap();
            a.push(qword_ptr(r9).gs()).unwrap();
            a.pop(rax).unwrap();
        }),
        ("test m32", |a| {
            a.test(dword_ptr(rsi), 0x10).unwrap();
            a.cmovz(r10, rcx).unwrap();
        }),
        // (No fill: the whole instruction through the interpreter.)
        ("div m64", |a| {
            a.mov(rax, rcx).unwrap();
            a.xor(edx, edx).unwrap();
            a.div(qword_ptr(rsi)).unwrap();
        }),
        ("jmp m64", |a| a.jmp(qword_ptr(rsi + 8)).unwrap()),
        ("call m64", |a| a.call(qword_ptr(rsi + 16)).unwrap()),
        // Crossing into the next page (the interpreter's path).
        ("test m64 crossing", |a| {
            a.test(qword_ptr(rsi - 4), rax).unwrap();
        }),
        ("xchg m64 crossing", |a| {
            a.xchg(qword_ptr(rsi - 4), rax).unwrap()
        }),
        ("push m64 crossing", |a| {
            a.push(qword_ptr(rsi - 4)).unwrap();
            a.pop(rax).unwrap();
        }),
    ];
    for (name, form) in forms {
        let (o, stats) = both(|a| {
            let mut top = a.create_label();
            let mut next = a.create_label();
            let mut ret = a.create_label();
            // The stack (and the exception frame) in the compared memory.
            a.mov(rsp, DATA + 0x7000).unwrap();
            gs_bases(a, MEM - 0x3000);
            // On each mapped page: a divisor, the JMP target (the
            // instruction after the JMP) and the CALL target.
            a.lea(rdx, ptr(next)).unwrap();
            a.lea(rdi, ptr(ret)).unwrap();
            for p in 1..=3u64 {
                a.mov(rsi, MEM - p * 0x1000).unwrap();
                a.mov(qword_ptr(rsi), 7).unwrap();
                a.mov(qword_ptr(rsi + 8), rdx).unwrap();
                a.mov(qword_ptr(rsi + 16), rdi).unwrap();
            }
            a.mov(rsi, MEM - 0x3000).unwrap();
            a.mov(ecx, 10).unwrap();
            a.xor(ebx, ebx).unwrap();
            a.set_label(&mut top).unwrap();
            a.add(r11, rcx).unwrap();
            a.swapgs().unwrap();
            form(a);
            a.set_label(&mut next).unwrap();
            a.add(rsi, 0x1000).unwrap();
            a.inc(rbx).unwrap();
            a.dec(ecx).unwrap();
            a.jnz(top).unwrap();
            a.hlt().unwrap();
            a.set_label(&mut ret).unwrap();
            a.add(r12, 1).unwrap();
            a.ret().unwrap();
        });
        assert_eq!(o.exit, VmExit::Hlt, "{name}");
        assert_eq!(o.gpr[15], HANDLER_MARK + 14, "{name}: #PF delivered");
        assert_eq!(o.gpr[3], 3, "{name}: three iterations completed");
        assert_eq!(stats.blocks_failed, 0, "{name}: {stats:?}");
    }
}

#[test]
fn xchg_into_code_runs_the_new_bytes() {
    // XCHG of a byte of a `mov eax, imm32` the next iteration runs (the
    // first level emptied by SWAPGS before it, so the fill finds a frame
    // holding code and the interpreter makes the store), and of an
    // aligned qword in the code page after the loop: stores into code.
    let iterations = 300u32;
    let (o, stats) = both(|a| {
        let mut patch = a.create_label();
        let mut slot = a.create_label();
        a.mov(ecx, iterations).unwrap();
        a.xor(ebx, ebx).unwrap();
        a.lea(rdi, ptr(patch)).unwrap();
        a.lea(rsi, ptr(slot)).unwrap();
        a.and(rsi, -8).unwrap();
        a.set_label(&mut patch).unwrap();
        a.mov(eax, 0x1234_5678u32).unwrap();
        a.add(rbx, rax).unwrap();
        a.mov(edx, ecx).unwrap();
        a.swapgs().unwrap();
        a.xchg(byte_ptr(rdi + 1), dl).unwrap();
        a.add(r8, rdx).unwrap();
        a.xchg(qword_ptr(rsi), r9).unwrap();
        a.add(r9, rcx).unwrap();
        a.dec(ecx).unwrap();
        a.jnz(patch).unwrap();
        a.hlt().unwrap();
        a.db(&[0xcc; 16]).unwrap();
        a.set_label(&mut slot).unwrap();
        a.db(&[0xcc; 16]).unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // Iteration 1 adds the original immediate, iteration i > 1 the one
    // whose low byte the XCHG of iteration i - 1 wrote.
    let mut imm = 0x1234_5678u64;
    let mut sum = 0u64;
    for c in (1..=iterations as u64).rev() {
        sum += imm;
        imm = (imm & !0xff) | (c & 0xff);
    }
    assert_eq!(o.gpr[3], sum);
}

#[test]
fn flags_written_back_around_thunk_fills_keep_other_bits() {
    // 2..6 MiB remapped with 4 KiB pages (first-level misses hit the TLB
    // through 4 KiB hints: the fill thunk's way), and accesses to pages 64
    // apart, which share a first-level slot, so every access misses. The
    // misses come with the guest flags saved in r15 after ADD (AF set)
    // and after XOR (AF clear), so the slow path writes them back, and
    // exits write host flags back after logic and arithmetic ops; the
    // merge must keep DF (STD) and every other non-arithmetic bit, which
    // PUSHFQ observes each iteration. One access crosses a page (the
    // thunk leaves it to the Rust fill, which it calls with the pointers
    // reloaded).
    let prog = |a: &mut CodeAssembler| {
        let mut top = a.create_label();
        let mut skip = a.create_label();
        a.mov(r8, 300u64).unwrap();
        a.mov(rsi, DATA).unwrap();
        a.std().unwrap();
        a.set_label(&mut top).unwrap();
        a.mov(al, 0x0f).unwrap();
        a.add(al, 1).unwrap();
        a.mov(qword_ptr(rsi), r8).unwrap();
        a.mov(rdx, qword_ptr(rsi + 0x4_0000)).unwrap();
        a.xor(ecx, r8d).unwrap();
        a.mov(qword_ptr(rsi + 0x4_0008), rdx).unwrap();
        a.mov(rbx, qword_ptr(rsi + 8)).unwrap();
        a.mov(qword_ptr(rsi + 0xffd), rbx).unwrap();
        a.pushfq().unwrap();
        a.pop(rax).unwrap();
        a.add(r9, rax).unwrap();
        a.rol(r9, 3).unwrap();
        a.test(r8b, 1).unwrap();
        a.jz(skip).unwrap();
        a.or(r10, rdx).unwrap();
        a.add(rsi, 0x1000).unwrap();
        a.and(rsi, 0x3f_7fff).unwrap();
        a.set_label(&mut skip).unwrap();
        a.dec(r8).unwrap();
        a.jnz(top).unwrap();
        a.cld().unwrap();
        a.hlt().unwrap();
    };
    let split = |engine, threshold| {
        let r = rig(prog);
        remap_4k(&r, 0x9000, 2);
        run_rig(engine, threshold, r)
    };
    let (interp, stats) = engines_agree("4 KiB pages", &[1, 2], split);
    assert_eq!(interp.exit, VmExit::Hlt);
    assert!(interp.tlb.hits > 1000, "{:?}", interp.tlb);
    for stats in stats {
        assert_eq!(stats.blocks_failed, 0, "{stats:?}");
        assert!(stats.blocks_translated >= 2, "{stats:?}");
    }
}

/// Remaps the rig's 2 MiB pages from 2 MiB on, `split` of them, with
/// 4 KiB pages (page tables at `pt`, one per 2 MiB page).
fn remap_4k(r: &Rig, pt: u64, split: u64) {
    for i in 0..512 * split {
        let pte = (0x20_0000 + (i << 12)) | 0x7;
        r.mem
            .write_bytes(Hpa(pt + i * 8), &pte.to_le_bytes())
            .unwrap();
    }
    for j in 0..split {
        let pde = (pt + 0x1000 * j) | 0x7;
        r.mem
            .write_bytes(Hpa(PD + 8 * (1 + j)), &pde.to_le_bytes())
            .unwrap();
    }
}

/// Loops to their own block's start that keep guest registers in host
/// registers across the back edge (`jit/regs.rs`: the second translation
/// loads them at the entry) and, their flags being live at entry (ADC or
/// PUSHFQ first), keep the flags in r15 there. Inline accesses in the
/// loop miss the first level on every new page (the fill's slow path
/// reloads the registers before probing again), the store of the last
/// iteration faults (#PF past the mapped memory: the registers as the
/// interpreter leaves them at the fault), and the back edge of the second
/// loop follows a logic op (AF made clear in r15) whose flags the next
/// iteration's PUSHFQ observes. Whole and in slices of odd cycle limits
/// (stops on the back edges and in the middle of the loops).
#[test]
fn self_loops_keep_registers_and_live_flags_in_host_registers() {
    let prog = |a: &mut CodeAssembler| {
        let mut l1 = a.create_label();
        let mut l2 = a.create_label();
        // 8-byte slots 0x808 apart: a new page every other iteration, the
        // 400th iteration's load past the end of memory.
        a.mov(ecx, 450u32).unwrap();
        a.mov(rsi, MEM - 200 * 0x1010).unwrap();
        a.mov(rdx, 0x9e37_79b9_7f4a_7c15u64).unwrap();
        a.mov(ebx, 60u32).unwrap();
        a.set_label(&mut l2).unwrap();
        // PUSHFQ first (flags live at entry), after TEST at the back edge.
        a.pushfq().unwrap();
        a.pop(r13).unwrap();
        a.add(r14, r13).unwrap();
        a.adc(r11, r12).unwrap();
        a.mov(r12, r11).unwrap();
        a.shl(r12, 3).unwrap();
        a.xor(r12, rdx).unwrap();
        a.sub(ebx, 1).unwrap();
        a.test(ebx, ebx).unwrap();
        a.jnz(l2).unwrap();
        a.set_label(&mut l1).unwrap();
        a.adc(rax, rdx).unwrap();
        a.mov(r8, rax).unwrap();
        a.shl(r8, 13).unwrap();
        a.xor(r8, rax).unwrap();
        a.mov(r9, qword_ptr(rsi)).unwrap();
        a.add(r9, r8).unwrap();
        a.mov(qword_ptr(rsi), r9).unwrap();
        a.lea(rsi, qword_ptr(rsi + 0x808)).unwrap();
        a.mov(r10d, r9d).unwrap();
        a.and(r10d, 0xff).unwrap();
        a.add(rdi, r10).unwrap();
        a.dec(ecx).unwrap();
        a.jnz(l1).unwrap();
        a.hlt().unwrap();
    };
    let (o, stats) = both(prog);
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(o.gpr[15], 0x1000 + 14, "the #PF handler ran");
    assert!(
        o.gpr[1] > 0 && o.gpr[1] < 100,
        "the loop stopped at the fault"
    );
    assert!(stats.blocks_translated >= 2, "{stats:?}");
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    for step in [89, 307] {
        let what = format!("step {step}");
        let (interp, stats) = engines_agree(&what, &[1, 2], |e, t| run_stepped(e, t, step, prog));
        let stats = stats[0];
        assert_eq!(interp.last().unwrap().0, VmExit::Hlt, "step {step}");
        assert!(interp.len() > 10, "step {step}");
        assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    }
}

#[test]
fn a_sysret_that_sets_tf_traps_at_its_target_in_translated_code() {
    // SYSRET loading TF from R11 (TF clear before it) traps at its target
    // before the target's first instruction, as on hardware (Linux's
    // opportunistic SYSRET avoids TF for that reason). Translated code
    // went on through its chaining fetch at the target instead: with the
    // target unmapped it took the fetch's #PF, with a HLT there its #GP
    // at CPL 3 (`fuzz --seed 3107 --case 51308` and `--case 127612`).
    for mapped in [true, false] {
        let (o, stats) = both(|a| {
            let mut entry = a.create_label();
            let mut user = a.create_label();
            syscall_msrs(a, entry, 0);
            if mapped {
                a.lea(rcx, ptr(user)).unwrap();
            } else {
                // The rig maps the first 64 MiB.
                a.mov(rcx, MEM + 0x5000).unwrap();
            }
            a.mov(r11d, 0x102).unwrap(); // TF
            a.sysretq().unwrap();
            a.set_label(&mut entry).unwrap();
            a.hlt().unwrap();
            // Ring 3: HLT (#GP at CPL 3).
            a.set_label(&mut user).unwrap();
            a.hlt().unwrap();
        });
        assert_eq!(stats.blocks_failed, 0, "{stats:?}");
        assert_eq!(o.exit, VmExit::Hlt);
        assert_eq!(o.gpr[15], HANDLER_MARK + 1, "#DB, target mapped: {mapped}");
    }
}

#[test]
fn a_popf_that_sets_tf_stops_chaining_into_translated_blocks() {
    // POPF sets TF: the instruction after it runs, then the single-step
    // trap. Translated code chained from the POPF's block into the
    // (already translated) next block and ran it whole without a trap
    // (`fuzz --seed 3103 --case 30843`: POPF, then LOOPNE back).
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        let mut body = a.create_label();
        a.xor(ebx, ebx).unwrap();
        a.mov(r12d, 2).unwrap();
        a.set_label(&mut top).unwrap();
        a.cmp(r12d, 1).unwrap();
        a.jne(body).unwrap();
        a.pushfq().unwrap();
        a.or(qword_ptr(rsp), 0x100).unwrap();
        a.popfq().unwrap();
        a.set_label(&mut body).unwrap();
        a.inc(ebx).unwrap();
        a.inc(ebx).unwrap();
        a.dec(r12d).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(o.gpr[15], HANDLER_MARK + 1, "single-step #DB");
    assert_eq!(o.gpr[3], 3, "one instruction after the POPF");
}

#[test]
fn atomics_setcc_bswap_segment_reads_prefetch_and_cli_run_natively() {
    // CMPXCHG and XADD of memory (locked and not, matching and not; the
    // 32-bit forms with junk in rax's upper half), SETcc of memory,
    // BT/BTS/BTR/BTC with an immediate or a register offset, LEAVE,
    // the fences, BSWAP, MOV from SS, CS and DS (to 16-bit registers too), PREFETCH and CLI at CPL 0: translated
    // code runs them itself, with the flags they set live after them. A
    // misaligned locked CMPXCHG goes through the interpreter (not atomic
    // there, no locked cost).
    let iterations = 300u64;
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        a.mov(rsi, DATA).unwrap();
        a.mov(rcx, iterations).unwrap();
        a.mov(r8, 0x0123_4567_89ab_cdefu64).unwrap();
        a.mov(r9, 0x1111_2222_3333_4444u64).unwrap();
        a.mov(r10, 3u64).unwrap();
        a.mov(r11, 0x5555_6666_7777_8888u64).unwrap();
        a.mov(r12, 0x0102_0304_0506_0708u64).unwrap();
        a.set_label(&mut top).unwrap();
        a.mov(ebx, ecx).unwrap();
        a.and(ebx, 0x3f).unwrap();
        // rax is 0 (memory's first value: a match) or the counter.
        a.mov(eax, ecx).unwrap();
        a.and(eax, 2).unwrap();
        a.imul_3(rax, rcx, 0).unwrap();
        a.test(cl, 2).unwrap();
        a.cmovnz(rax, rcx).unwrap();
        a.lock().cmpxchg(qword_ptr(rsi + rbx * 8), r8).unwrap();
        a.adc(r13, rax).unwrap();
        a.mov(rax, 0xdead_beef_0000_0000u64 | 7).unwrap();
        a.or(rax, rcx).unwrap();
        a.cmpxchg(dword_ptr(rsi + rbx * 4 + 0x400), r9d).unwrap();
        a.sbb(r14, rax).unwrap();
        a.lock()
            .xadd(qword_ptr(rsi + rbx * 8 + 0x600), r10)
            .unwrap();
        a.xadd(dword_ptr(rsi + rbx * 4 + 0xa00), r11d).unwrap();
        a.sete(byte_ptr(rsi + rbx + 0xc00)).unwrap();
        a.setb(byte_ptr(rsi + rcx + 0xd00)).unwrap();
        a.bswap(r12).unwrap();
        a.bswap(r11d).unwrap();
        a.mov(eax, ss).unwrap();
        a.add(r15, rax).unwrap();
        a.mov(rdx, cs).unwrap();
        a.add(r15, rdx).unwrap();
        // 16-bit: the upper 48 bits kept.
        a.mov(r9w, ds).unwrap();
        a.mov(dx, ss).unwrap();
        a.add(r15, rdx).unwrap();
        a.prefetcht0(byte_ptr(rsi + rbx * 64)).unwrap();
        // Bit tests with an immediate: CF only, the other flags kept.
        a.cmp(r13, r14).unwrap();
        a.bt(r12, 17).unwrap();
        a.bts(r13d, 5).unwrap();
        a.btr(qword_ptr(rsi + rbx * 8 + 0x600), 63).unwrap();
        a.btc(dword_ptr(rsi + rbx * 4 + 0xa00), 33).unwrap();
        a.bt(qword_ptr(rsi + rbx * 8), 2).unwrap();
        // With a register offset, positive and negative, beyond the
        // operand.
        a.mov(rdx, rcx).unwrap();
        a.sub(rdx, 150).unwrap();
        a.bt(qword_ptr(rsi + 0x800), rdx).unwrap();
        a.bts(dword_ptr(rsi + 0x900), edx).unwrap();
        a.btr(qword_ptr(rsi + 0x900), rcx).unwrap();
        a.cmovo(r14, r15).unwrap();
        a.cmovs(r13, r12).unwrap();
        a.adc(r15, rbx).unwrap();
        // A frame: LEAVE restores RSP and RBP; fences do nothing.
        a.push(rbp).unwrap();
        a.mov(rbp, rsp).unwrap();
        a.sub(rsp, 0x20).unwrap();
        a.mov(qword_ptr(rbp - 8), rcx).unwrap();
        a.lfence().unwrap();
        a.mfence().unwrap();
        a.leave().unwrap();
        a.cli().unwrap();
        a.adc(r15, r8).unwrap();
        a.dec(rcx).unwrap();
        a.jnz(top).unwrap();
        a.mov(rax, 5u64).unwrap();
        a.lock().cmpxchg(qword_ptr(rsi + 0xe01), r8).unwrap();
        a.pushfq().unwrap();
        a.pop(rdi).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // The misaligned CMPXCHG and first-level TLB misses only.
    let bound = 40;
    assert!(stats.call_outs <= bound, "{} > {bound}", stats.call_outs);
}

#[test]
fn xmm_moves_run_natively() {
    // MOVAPS/MOVAPD/MOVDQA and MOVUPS/MOVUPD/MOVDQU between XMM registers
    // and to and from memory: translated code runs them itself. A load
    // across a page and a misaligned MOVAPS (#GP) go through the
    // interpreter; the last, after the loop, ends the run in the handler.
    let iterations = 200u64;
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        a.mov(rsi, DATA).unwrap();
        a.mov(rcx, iterations).unwrap();
        a.mov(r8, 0x0123_4567_89ab_cdefu64).unwrap();
        a.set_label(&mut top).unwrap();
        a.mov(ebx, ecx).unwrap();
        a.and(ebx, 0x3f).unwrap();
        a.shl(ebx, 4).unwrap();
        a.mov(qword_ptr(rsi + 0x2000), rcx).unwrap();
        a.mov(qword_ptr(rsi + 0x2008), r8).unwrap();
        a.movdqu(xmm1, xmmword_ptr(rsi + 0x2000)).unwrap();
        a.movaps(xmmword_ptr(rsi + rbx), xmm1).unwrap();
        a.movdqa(xmm9, xmm1).unwrap();
        a.movups(xmmword_ptr(rsi + rbx + 0x1003), xmm9).unwrap();
        a.movapd(xmm4, xmmword_ptr(rsi + rbx + 0x400)).unwrap();
        a.movupd(xmmword_ptr(rsi + rbx + 0x801), xmm4).unwrap();
        a.movdqa(xmmword_ptr(rsi + rbx + 0xc00), xmm15).unwrap();
        a.movaps(xmm15, xmm9).unwrap();
        a.add(r8, qword_ptr(rsi + rbx + 0x1003)).unwrap();
        a.dec(rcx).unwrap();
        a.jnz(top).unwrap();
        a.movups(xmm3, xmmword_ptr(rsi + 0xff8)).unwrap();
        a.movaps(xmmword_ptr(rsi + 8), xmm3).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    assert_eq!(o.gpr[15], HANDLER_MARK + 13, "#GP of the misaligned MOVAPS");
    // The crossing load, the #GP and first-level TLB misses only.
    let bound = 20;
    assert!(stats.call_outs <= bound, "{} > {bound}", stats.call_outs);
}

/// Guest registers written back (`jit/regs.rs`): written by register
/// forms, they are only in host registers until the `Cpu` must be
/// exact. Here the interpreter reads them in the middle of a block: a
/// call-out (RCL, no host code) of a register written just before, a
/// page-crossing store (the interpreter's path from an inline access's
/// slow path) and a store into the code page (likewise), each of a
/// register written just before; more live registers than host ones
/// (dirty ones evicted); and a #PF of the load that walks past the
/// mapped memory, taken with the registers as the block left them.
#[test]
fn written_back_registers_are_exact_where_the_interpreter_looks() {
    let prog = |a: &mut CodeAssembler| {
        let mut top = a.create_label();
        let mut code_slot = a.create_label();
        let mut odd = a.create_label();
        a.mov(ecx, 300u32).unwrap();
        a.mov(rsi, MEM - 250 * 0x1000 + 0xffc).unwrap();
        a.mov(rdx, 0x9e37_79b9_7f4a_7c15u64).unwrap();
        a.lea(rbp, ptr(code_slot)).unwrap();
        a.set_label(&mut top).unwrap();
        a.add(rax, rcx).unwrap();
        a.imul_2(rdx, rax).unwrap();
        a.test(cl, 1).unwrap();
        a.jz(odd).unwrap();
        a.imul_3(r8, rdx, 7).unwrap();
        a.imul_2(r8, rax).unwrap();
        a.set_label(&mut odd).unwrap();
        a.xor(r8, rcx).unwrap();
        a.mov(r9, r8).unwrap();
        a.shl(r9, 7).unwrap();
        a.add(r10, r9).unwrap();
        a.mov(r11d, r10d).unwrap();
        a.sub(r12, r11).unwrap();
        a.lea(r13, qword_ptr(r12 + r8 * 2)).unwrap();
        a.rcl(r13, 1).unwrap();
        a.add(r14, r13).unwrap();
        a.add(rdi, qword_ptr(rsi + 0x1010)).unwrap();
        a.mov(qword_ptr(rsi), r14).unwrap();
        a.xor(rbx, r14).unwrap();
        a.mov(qword_ptr(rbp), rbx).unwrap();
        a.add(rsi, 0x1000).unwrap();
        a.dec(ecx).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
        a.set_label(&mut code_slot).unwrap();
        a.dq(&[0]).unwrap();
    };
    let (o, stats) = both(prog);
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(o.gpr[15], 0x1000 + 14, "the #PF handler ran");
    assert!(
        o.gpr[1] > 0 && o.gpr[1] < 300,
        "the loop stopped at the fault"
    );
    assert!(stats.blocks_translated >= 1, "{stats:?}");
    assert!(stats.call_outs >= 3 * 200, "{stats:?}");
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    for step in [97, 263] {
        let what = format!("step {step}");
        engines_agree(&what, &[1], |e, t| run_stepped(e, t, step, prog));
    }
}

#[test]
fn rdtsc_rdtscp_and_narrow_cmpxchg_run_natively() {
    // Linux's TSC synchronisation check at a CPU's bring-up: a
    // paravirtual spinlock's locked byte CMPXCHG and RDTSCP per
    // iteration. Translated code reads the TSC itself (cycles plus the
    // TSC offset in guest mode, IA32_TSC_AUX into ECX, upper halves
    // cleared) and makes 8- and 16-bit CMPXCHG (locked and not, matching
    // and not) natively; CR4.TSD and RDTSC exiting go through the
    // interpreter, which #GPs or exits as it would.
    let iterations = 300u64;
    let prog = |a: &mut CodeAssembler| {
        let mut top = a.create_label();
        a.mov(rsi, DATA).unwrap();
        a.mov(rdi, iterations).unwrap();
        a.mov(r8, 0x0123_4567_89ab_cd01u64).unwrap();
        a.mov(r9, 0x1111_2222_3333_4444u64).unwrap();
        a.set_label(&mut top).unwrap();
        a.mov(rdx, u64::MAX).unwrap();
        a.rdtsc().unwrap();
        a.add(r13, rax).unwrap();
        a.add(r14, rdx).unwrap();
        a.mov(rcx, u64::MAX).unwrap();
        a.rdtscp().unwrap();
        a.xor(r15, rcx).unwrap();
        a.sub(r13, rax).unwrap();
        a.add(r10, rax).unwrap();
        a.mov(ebx, edi).unwrap();
        a.and(ebx, 0x3f).unwrap();
        // al is memory's value (0, then 1 after a store) or not.
        a.mov(rax, 0xdead_beef_0000_0000u64).unwrap();
        a.test(dil, 4).unwrap();
        a.setz(al).unwrap();
        a.lock().cmpxchg(byte_ptr(rsi + rbx), r8b).unwrap();
        a.adc(r12, rax).unwrap();
        a.mov(rax, rdi).unwrap();
        a.and(eax, 1).unwrap();
        a.cmpxchg(word_ptr(rsi + rbx * 2 + 0x400), r9w).unwrap();
        a.adc(r12, rax).unwrap();
        a.lock().cmpxchg(byte_ptr(rsi + rbx + 0x800), sil).unwrap();
        a.adc(r11, rax).unwrap();
        a.dec(rdi).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    };
    let aux = 0xabcd_0000_0000_0007;
    for (name, vmx, tsd) in [
        ("bare", None, false),
        (
            "guest mode with a TSC offset",
            Some(machine::VmxControls {
                tsc_offset: -0x1234_5678_9abc,
                ..controls()
            }),
            false,
        ),
        (
            "RDTSC exiting",
            Some(machine::VmxControls {
                rdtsc_exiting: true,
                ..controls()
            }),
            false,
        ),
        ("CR4.TSD at CPL 0", None, true),
    ] {
        let make = || {
            let mut r = rig(prog);
            let st = r.cpu.state_mut();
            st.tsc_aux = aux;
            if tsd {
                st.cr4 |= machine::cpu::state::cr4::TSD;
            }
            match vmx.clone() {
                Some(c) => r.guest(c),
                None => r,
            }
        };
        let (o, stats) = engines_agree(name, &[1], |e, t| run_rig(e, t, make()));
        let stats = stats[0];
        assert_eq!(stats.blocks_failed, 0, "{name}: {stats:?}");
        if vmx.as_ref().is_some_and(|c| c.rdtsc_exiting) {
            assert_eq!(o.exit, VmExit::Rdtsc { rdtscp: false }, "{name}");
            continue;
        }
        assert_eq!(o.exit, VmExit::Hlt, "{name}");
        assert_eq!(o.gpr[1], aux & 0xffff_ffff, "{name}");
        assert_eq!(o.gpr[2] >> 32, 0, "{name}");
        if tsd {
            // Both TSC reads of every iteration through the interpreter.
            assert!(stats.call_outs >= 2 * iterations, "{name}: {stats:?}");
        } else {
            // First-level TLB misses only.
            let bound = 40;
            assert!(
                stats.call_outs <= bound,
                "{name}: {} > {bound}",
                stats.call_outs
            );
        }
    }
}

/// Self-loops whose back edge keeps written guest registers dirty in host
/// registers (not stored per iteration; `jit/regs.rs`): wherever the loop
/// is interrupted — a cycle limit reached at the back edge's check, a
/// first-level miss of its load (the fill's slow path), the #PF of the
/// load past the mapped memory — the registers must be the
/// interpreter's. One loop fits the host registers (flags live at entry:
/// ADC first), the other writes more guest registers than there are host
/// ones (evictions inside the loop, flags dead at entry).
#[test]
fn self_loops_keeping_dirty_registers_store_them_on_every_way_out() {
    let prog = |a: &mut CodeAssembler| {
        let mut l1 = a.create_label();
        let mut l2 = a.create_label();
        a.mov(ecx, 3000u32).unwrap();
        a.mov(rdx, 0x9e37_79b9_7f4a_7c15u64).unwrap();
        a.set_label(&mut l1).unwrap();
        a.adc(rax, rdx).unwrap();
        a.imul_2(rdx, rax).unwrap();
        a.lea(r8, qword_ptr(rax + rdx * 4 + 3)).unwrap();
        a.xor(r9d, r8d).unwrap();
        a.dec(ecx).unwrap();
        a.jnz(l1).unwrap();
        // 8-byte slots 0x808 apart: a new page every other iteration, the
        // load of the 400th iteration past the end of memory.
        a.mov(ecx, 450u32).unwrap();
        a.mov(rsi, MEM - 200 * 0x1010).unwrap();
        a.set_label(&mut l2).unwrap();
        a.mov(r10, qword_ptr(rsi)).unwrap();
        a.add(r10, rcx).unwrap();
        a.mov(r11, r10).unwrap();
        a.shr(r11, 3).unwrap();
        a.imul_2(r12, r11).unwrap();
        a.add(r12, 1).unwrap();
        a.mov(r13, r12).unwrap();
        a.shl(r13, 5).unwrap();
        a.add(r14, r13).unwrap();
        a.xor(rbx, r14).unwrap();
        a.add(rdi, rbx).unwrap();
        a.mov(qword_ptr(rsi), rdi).unwrap();
        a.lea(rsi, qword_ptr(rsi + 0x808)).unwrap();
        a.sub(ecx, 1).unwrap();
        a.jnz(l2).unwrap();
        a.hlt().unwrap();
    };
    let (o, stats) = both(prog);
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(o.gpr[15], 0x1000 + 14, "the #PF handler ran");
    assert!(
        o.gpr[1] > 0 && o.gpr[1] < 100,
        "the loop stopped at the fault"
    );
    assert!(stats.blocks_translated >= 2, "{stats:?}");
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    for step in [101, 331, 1013] {
        let what = format!("step {step}");
        let (interp, stats) = engines_agree(&what, &[1, 2], |e, t| run_stepped(e, t, step, prog));
        let stats = stats[0];
        assert_eq!(interp.last().unwrap().0, VmExit::Hlt, "step {step}");
        assert!(interp.len() > 10, "step {step}");
        assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    }
}

#[test]
fn multiply_costs_are_charged_before_anything_looks_at_cycles() {
    // Translated code charges IMUL's multiply cost with the next form
    // that is not a register form: RDTSC (which reads the cycles), a
    // store, SETcc, the loop's Jcc and the block's exit must each see
    // every multiply before them charged, as the interpreter charges it.
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        a.mov(rsi, DATA).unwrap();
        a.mov(rdi, 200u64).unwrap();
        a.mov(r8, 0x9e37_79b9_7f4a_7c15u64).unwrap();
        a.set_label(&mut top).unwrap();
        a.imul_3(r8, r8, 0x2545_f491).unwrap();
        a.imul_2(r9, r8).unwrap();
        a.rdtsc().unwrap();
        a.add(r10, rax).unwrap();
        a.imul_3(r11, r10, 3).unwrap();
        a.mov(ebx, edi).unwrap();
        a.and(ebx, 0xff).unwrap();
        a.mov(qword_ptr(rsi + rbx * 8), r11).unwrap();
        a.imul_2(r12, r11).unwrap();
        a.cmp(r12, r8).unwrap();
        a.setb(cl).unwrap();
        a.imul_2(r13, r12).unwrap();
        a.rdtsc().unwrap();
        a.add(r14, rax).unwrap();
        a.imul_2(r13, r14).unwrap();
        a.dec(rdi).unwrap();
        a.jnz(top).unwrap();
        a.imul_3(r15, r13, 5).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    assert!(stats.blocks_translated >= 2, "{stats:?}");
}

#[test]
fn shift_flags_kept_in_r15_agree() {
    // Shifts by immediates leave their flags in r15 (AF set, OF from the
    // result as the interpreter's `alu` makes it, CF SF ZF PF from the
    // host) until something looks: PUSHFQ at once, after an inline
    // access, SETcc and ADC, at 8 to 64 bits.
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        a.mov(rsi, DATA).unwrap();
        a.mov(r15, 300u64).unwrap();
        a.mov(r8, 0x9e37_79b9_7f4a_7c15u64).unwrap();
        a.set_label(&mut top).unwrap();
        a.imul_3(r8, r8, 0x2545_f491).unwrap();
        a.add(r8, r15).unwrap();
        a.mov(rax, r8).unwrap();
        a.shr(rax, 1).unwrap();
        a.pushfq().unwrap();
        a.pop(r9).unwrap();
        a.add(r10, r9).unwrap();
        a.mov(rcx, r8).unwrap();
        a.shl(rcx, 3).unwrap();
        a.mov(ebx, r15d).unwrap();
        a.and(ebx, 0xff).unwrap();
        a.mov(qword_ptr(rsi + rbx * 8), rcx).unwrap();
        a.pushfq().unwrap();
        a.pop(r9).unwrap();
        a.add(r11, r9).unwrap();
        a.mov(edx, r8d).unwrap();
        a.shr(edx, 5).unwrap();
        a.seto(bl).unwrap();
        a.adc(r12, rbx).unwrap();
        a.mov(rdi, r8).unwrap();
        a.sar(rdi, 7).unwrap();
        a.pushfq().unwrap();
        a.pop(r9).unwrap();
        a.xor(r13, r9).unwrap();
        a.mov(rdx, r8).unwrap();
        a.shl(dx, 3).unwrap();
        a.pushfq().unwrap();
        a.pop(r9).unwrap();
        a.add(r13, r9).unwrap();
        a.mov(rax, r8).unwrap();
        a.shr(al, 2).unwrap();
        a.seto(cl).unwrap();
        a.add(r14, rcx).unwrap();
        a.shl(eax, 9).unwrap();
        a.adc(r14, rax).unwrap();
        a.dec(r15).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    assert!(stats.blocks_translated >= 2, "{stats:?}");
}

/// The loop of the STI tests: `iterations` of CLI, work, STI (IF clear:
/// the STI shadow), one instruction, more work; a flag live across each.
/// Runs `prog` on both engines to cycle `stop`, then posts external
/// interrupt 0x30 and runs on: the interpreter must stop at the limit,
/// then take the interrupt (the handler halts), and the translator must
/// agree on where (cycles, instructions, state). The translator's
/// counters.
fn interrupt_posted_at(
    stop: u64,
    prog: impl Fn(&mut CodeAssembler) + Copy,
) -> machine::jit::JitStats {
    let run = |engine, threshold| {
        let mut r = rig(prog);
        r.cpu.set_engine(engine);
        r.cpu.set_jit_threshold(threshold);
        let first = r.cpu.run(&r.mem, stop);
        r.cpu.post_external_interrupt(0x30);
        let exit = r.run();
        (
            (
                first,
                exit,
                r.cpu.cycles(),
                r.cpu.stats().instructions,
                r.cpu.state_digest(),
                r.cpu.state().gpr,
            ),
            r.cpu.jit_stats(),
        )
    };
    let (interp, stats) = engines_agree(&format!("stop at {stop}"), &[1], run);
    assert_eq!(interp.0, VmExit::CycleLimit, "stop at {stop}");
    assert_eq!(interp.1, VmExit::Hlt, "stop at {stop}");
    assert_eq!(interp.5[15], HANDLER_MARK + 0x30, "stop at {stop}");
    stats[0]
}

fn sti_loop(a: &mut CodeAssembler, iterations: u64) {
    let mut top = a.create_label();
    a.mov(rcx, iterations).unwrap();
    a.mov(r8, 0x9e37_79b9_7f4a_7c15u64).unwrap();
    a.set_label(&mut top).unwrap();
    a.cli().unwrap();
    a.add(r8, rcx).unwrap();
    a.sti().unwrap();
    // The shadowed instruction: no interrupt before it.
    a.adc(r9, r8).unwrap();
    a.add(r10, r9).unwrap();
    a.sti().unwrap();
    // IF already set: no shadow.
    a.add(r11, r10).unwrap();
    a.dec(rcx).unwrap();
    a.jnz(top).unwrap();
}

#[test]
fn sti_runs_natively_and_keeps_its_interrupt_shadow() {
    // STI at CPL 0 sets IF (and the shadow when IF was clear) in
    // translated code, no call-out; the block ends there and the run loop
    // checks events as after the interpreter's STI: an interrupt posted in
    // the loop is delivered after the instruction the STI that set IF
    // shadows.
    runs_natively_and_takes_interrupts(sti_loop, &[500, 1234, 2999, 4321]);
}

/// `looped(a, iterations)` (a loop at CPL 0) then HLT: on both engines,
/// with first-level TLB misses the only call-outs; and an external
/// interrupt posted at each cycle in `stops` of a longer run is
/// delivered where the interpreter delivers it (the handler halts).
fn runs_natively_and_takes_interrupts(looped: fn(&mut CodeAssembler, u64), stops: &[u64]) {
    let iterations = 300u64;
    let (o, stats) = both(|a| {
        looped(a, iterations);
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    let bound = 40;
    assert!(stats.call_outs <= bound, "{} > {bound}", stats.call_outs);
    for &stop in stops {
        let stats = interrupt_posted_at(stop, |a| {
            looped(a, 3 * iterations);
            a.hlt().unwrap();
        });
        assert!(stats.blocks_translated >= 2, "stop at {stop}: {stats:?}");
        assert!(stats.call_outs <= bound, "stop at {stop}: {stats:?}");
    }
}

#[test]
fn stac_and_clac_run_natively_with_smap() {
    // STAC and CLAC at CPL 0 change RFLAGS.AC in translated code, no
    // call-out, with what the first-level TLB does when the key context's
    // AC changes under CR4.SMAP: after CLAC the supervisor data slots of
    // user-mode pages are gone, so the access after the loop (AC clear,
    // to a user page) takes the SMAP #PF on both engines. Without SMAP it
    // does not fault.
    let iterations = 300u64;
    let prog = |a: &mut CodeAssembler| {
        let mut top = a.create_label();
        a.mov(rsi, DATA).unwrap();
        a.mov(rcx, iterations).unwrap();
        a.set_label(&mut top).unwrap();
        a.stac().unwrap();
        a.mov(ebx, ecx).unwrap();
        a.and(ebx, 0x3f).unwrap();
        a.add(qword_ptr(rsi + rbx * 8), rcx).unwrap();
        a.mov(rax, qword_ptr(rsi + rbx * 8 + 0x800)).unwrap();
        a.add(r9, rax).unwrap();
        a.stac().unwrap();
        a.clac().unwrap();
        a.add(r10, r9).unwrap();
        a.clac().unwrap();
        // Supervisor-page accesses with AC clear: lookup keys made under
        // it, which the next STAC must drop.
        a.mov(qword_ptr(rsp - 16), r10).unwrap();
        a.add(r12, qword_ptr(rsp - 16)).unwrap();
        a.dec(rcx).unwrap();
        a.jnz(top).unwrap();
    };
    for (smap, stats) in with_and_without_smap(prog) {
        // First-level TLB misses only.
        let bound = 40;
        assert!(stats.call_outs <= bound, "smap {smap}: {stats:?}");
    }
}

/// Runs `prog` (at CPL 0, RSI = DATA at its end), then a read of DATA
/// with RFLAGS.AC clear, with the first 2 MiB (code, stack, tables)
/// supervisor-only and DATA a user-mode page, CR4.SMAP on and off, on
/// both engines: they must agree, and that read takes the SMAP #PF
/// exactly with SMAP. The translator's counters, per setting.
fn with_and_without_smap(
    prog: impl Fn(&mut CodeAssembler) + Copy,
) -> [(bool, machine::jit::JitStats); 2] {
    [true, false].map(|smap| {
        let make = || {
            let mut r = rig(|a| {
                prog(a);
                a.mov(rax, qword_ptr(rsi + 0x10)).unwrap();
                a.mov(r11d, 7u32).unwrap();
                a.hlt().unwrap();
            });
            r.mem.write_u64(Hpa(PD), 0x83).unwrap();
            if smap {
                r.cpu.state_mut().cr4 |= machine::cpu::state::cr4::SMAP;
            }
            r
        };
        let what = format!("smap: {smap}");
        let (o, stats) = engines_agree(&what, &[1], |e, t| run_rig(e, t, make()));
        let stats = stats[0];
        assert_eq!(stats.blocks_failed, 0, "{stats:?}");
        assert_eq!(o.exit, VmExit::Hlt);
        if smap {
            assert_eq!(o.gpr[15], HANDLER_MARK + 14, "the SMAP #PF");
            assert_eq!(o.gpr[11], 0);
        } else {
            assert_eq!(o.gpr[15], 0);
            assert_eq!(o.gpr[11], 7);
        }
        (smap, stats)
    })
}

#[test]
fn double_shifts_and_memory_multiplies_run_natively() {
    // SHLD and SHRD of 32- and 64-bit registers by immediates (0, 1, the
    // width - 1 and between; a 16-bit one and by CL through the
    // interpreter), their flags (OF and AF as the interpreter defines
    // them) live after them through PUSHFQ and ADC; IMUL of a register by
    // memory (32 and 64 bits, overflowing and not), its cost and CF/OF
    // as the interpreter's. A page-crossing IMUL operand goes through the
    // interpreter.
    let iterations = 200u64;
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        a.mov(rsi, DATA).unwrap();
        a.mov(rdi, iterations).unwrap();
        a.mov(r8, 0x9e37_79b9_7f4a_7c15u64).unwrap();
        a.mov(r9, 0x0123_4567_89ab_cdefu64).unwrap();
        a.set_label(&mut top).unwrap();
        a.imul_3(r8, r8, 0x2545_f491).unwrap();
        a.add(r8, rdi).unwrap();
        a.mov(ebx, edi).unwrap();
        a.and(ebx, 0xff).unwrap();
        a.mov(qword_ptr(rsi + rbx * 8), r8).unwrap();
        a.mov(rax, r9).unwrap();
        a.shrd(rax, r8, 13).unwrap();
        a.pushfq().unwrap();
        a.pop(rcx).unwrap();
        a.add(r10, rcx).unwrap();
        a.xor(r10, rax).unwrap();
        a.mov(rdx, r8).unwrap();
        a.shld(rdx, r9, 1).unwrap();
        a.adc(r11, rdx).unwrap();
        a.shrd(edx, r8d, 31).unwrap();
        a.seto(cl).unwrap();
        a.add(r11b, cl).unwrap();
        a.shld(eax, r9d, 7).unwrap();
        a.pushfq().unwrap();
        a.pop(rcx).unwrap();
        a.add(r12, rcx).unwrap();
        a.shrd(r9, r8, 63).unwrap();
        a.shld(r13, r8, 33).unwrap();
        a.pushfq().unwrap();
        a.pop(rcx).unwrap();
        a.add(r12, rcx).unwrap();
        a.shrd(r13, rdx, 1).unwrap();
        a.adc(r12, r13).unwrap();
        // A count of 0: no flag changes, a 32-bit destination still
        // zero-extended.
        a.cmp(r12, r13).unwrap();
        a.shrd(eax, edx, 0).unwrap();
        a.shld(r14, rdx, 64).unwrap();
        a.adc(r14, rax).unwrap();
        // Through the interpreter.
        a.shrd(r9w, r8w, 5).unwrap();
        a.mov(ecx, edi).unwrap();
        a.shld(r14, r8, cl).unwrap();
        // IMUL by memory; CF/OF live after it, SF ZF kept.
        a.cmp(r14, r9).unwrap();
        a.imul_2(r15, qword_ptr(rsi + rbx * 8)).unwrap();
        a.pushfq().unwrap();
        a.pop(rcx).unwrap();
        a.add(r12, rcx).unwrap();
        a.mov(r15, rdi).unwrap();
        a.imul_2(r15, qword_ptr(rsi + rbx * 8)).unwrap();
        a.adc(r12, r15).unwrap();
        a.mov(eax, edi).unwrap();
        a.imul_2(eax, dword_ptr(rsi + rbx * 4 + 0x800)).unwrap();
        a.seto(cl).unwrap();
        a.add(r12b, cl).unwrap();
        a.add(r13, rax).unwrap();
        a.dec(rdi).unwrap();
        a.jnz(top).unwrap();
        a.mov(rax, 3u64).unwrap();
        a.imul_2(rax, qword_ptr(rsi + 0xffd)).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // The 16-bit SHRD and the SHLD by CL per iteration, the crossing
    // IMUL, first-level TLB misses.
    let bound = 2 * iterations + 40;
    assert!(stats.call_outs <= bound, "{} > {bound}", stats.call_outs);
}

/// `iterations` rounds at CPL 0 of POPF loading arithmetic flags from
/// r8 with DF (IF clear), then with IOPL 3 and IF set, then the same
/// again (IF unchanged), the flags live after each (ADC, SBB, PUSHFQ).
fn popf_loop(a: &mut CodeAssembler, iterations: u64) {
    let mut top = a.create_label();
    a.mov(rcx, iterations).unwrap();
    a.mov(r8, 0x9e37_79b9_7f4a_7c15u64).unwrap();
    a.set_label(&mut top).unwrap();
    a.mov(rax, r8).unwrap();
    a.and(eax, 0x8d5).unwrap();
    a.or(eax, 0x402).unwrap();
    a.push(rax).unwrap();
    a.popfq().unwrap();
    a.adc(r9, r8).unwrap();
    a.pushfq().unwrap();
    a.pop(rdx).unwrap();
    a.add(r10, rdx).unwrap();
    a.mov(rax, r8).unwrap();
    a.and(eax, 0x8d5).unwrap();
    a.or(eax, 0x3202).unwrap();
    a.push(rax).unwrap();
    a.popfq().unwrap();
    a.sbb(r11, r9).unwrap();
    a.pushfq().unwrap();
    a.pop(rdx).unwrap();
    a.xor(r10, rdx).unwrap();
    a.push(rax).unwrap();
    a.popfq().unwrap();
    a.add(r8, rcx).unwrap();
    a.rol(r8, 7).unwrap();
    a.dec(rcx).unwrap();
    a.jnz(top).unwrap();
}

#[test]
fn popf_runs_natively_at_cpl0_and_asks_for_event_checks() {
    // POPFQ at CPL 0 loads the flags (arithmetic, DF, IOPL, IF) in
    // translated code, no call-out; when IF changes, an event check is
    // made where the interpreter's run loop makes it: an interrupt posted
    // in the loop is delivered right after the POPF that sets IF (no
    // shadow), or at once where IF is set.
    runs_natively_and_takes_interrupts(popf_loop, &[500, 1234, 2999, 4321, 5000, 6007]);
}

#[test]
fn popf_changing_ac_under_smap_goes_through_the_interpreter() {
    // POPF at CPL 0 setting or clearing RFLAGS.AC under CR4.SMAP changes
    // the first-level TLB's key context: the interpreter runs it (with
    // the SMAP revocation of the supervisor slots of user-mode pages when
    // AC clears), so the access after the loop (AC clear, to a user page)
    // takes the SMAP #PF on both engines. A POPF that keeps AC, and every
    // POPF without SMAP, runs in translated code.
    let iterations = 200u64;
    let prog = |a: &mut CodeAssembler| {
        let mut top = a.create_label();
        a.mov(rsi, DATA).unwrap();
        a.mov(rcx, iterations).unwrap();
        a.set_label(&mut top).unwrap();
        for (set, access) in [(true, true), (true, true), (false, false)] {
            a.pushfq().unwrap();
            a.pop(rax).unwrap();
            if set {
                a.or(eax, 0x4_0000).unwrap();
            } else {
                a.and(eax, !0x4_0000).unwrap();
            }
            a.push(rax).unwrap();
            a.popfq().unwrap();
            if access {
                // A user page with AC set: the supervisor read slot noted.
                a.mov(ebx, ecx).unwrap();
                a.and(ebx, 7).unwrap();
                a.add(r9, qword_ptr(rsi + rbx * 8)).unwrap();
            }
        }
        a.dec(rcx).unwrap();
        a.jnz(top).unwrap();
    };
    for (smap, stats) in with_and_without_smap(prog) {
        let bound = 40;
        // With SMAP, the two POPFs that change AC, per iteration.
        let low = if smap { 2 * iterations } else { 0 };
        assert!(
            (low..=low + bound).contains(&stats.call_outs),
            "smap {smap}: {stats:?}"
        );
    }
}

/// `rounds` SYSCALL/SYSRET round trips (see
/// `syscall_and_sysret_run_natively`).
fn syscall_round_trips(a: &mut CodeAssembler, rounds: u32) {
    let mut entry = a.create_label();
    syscall_msrs(a, entry, 0x4_0700);
    // To ring 3 with IF and DF set.
    user_syscall_loop(a, 0x602, rounds, |a| {
        a.pushfq().unwrap();
        a.pop(rax).unwrap();
        a.xor(eax, 0x3200 | 0x8d5).unwrap();
        a.push(rax).unwrap();
        a.popfq().unwrap();
        a.adc(rbx, r12).unwrap();
        a.mov(ax, cs).unwrap();
        a.mov(dx, ss).unwrap();
        a.shl(edx, 16).unwrap();
        a.or(eax, edx).unwrap();
        a.add(rbx, rax).unwrap();
    });
    a.syscall().unwrap();
    // The kernel: RCX, R11, RFLAGS, CS and SS into the sums; halt after
    // the last round.
    a.set_label(&mut entry).unwrap();
    a.add(r13, rcx).unwrap();
    a.add(r13, r11).unwrap();
    a.pushfq().unwrap();
    a.pop(rax).unwrap();
    a.add(r14, rax).unwrap();
    a.mov(ax, ss).unwrap();
    a.add(r14w, ax).unwrap();
    a.mov(ax, cs).unwrap();
    a.add(r14w, ax).unwrap();
    let mut back = a.create_label();
    a.test(r12d, r12d).unwrap();
    a.jnz(back).unwrap();
    a.hlt().unwrap();
    a.set_label(&mut back).unwrap();
    a.sysretq().unwrap();
}

#[test]
fn syscall_and_sysret_run_natively() {
    // SYSCALL/SYSRET round trips in translated code, no call-out: FMASK
    // clears IF, DF, AC and TF in the kernel, RCX and R11 as the
    // interpreter leaves them, CS and SS the STAR selectors and flat
    // segments of the ring (the state digests of runs stopped at cycle
    // limits on either side), the privilege-transition cycles. The user
    // side also runs POPF at CPL 3 (the interpreter: IOPL 0 keeps IF and
    // IOPL).
    let rounds = 300u32;
    let (o, stats) = both(|a| syscall_round_trips(a, rounds));
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(o.gpr[12], 0, "every round ran");
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // The user POPF per round, the setup (MSR writes), first-level TLB
    // misses: no SYSCALL or SYSRET goes to the interpreter.
    let (low, high) = (rounds as u64, rounds as u64 + 40);
    assert!(
        (low..=high).contains(&stats.call_outs),
        "{} not in {low}..={high}",
        stats.call_outs
    );
    // SYSRET's event check is made by the fetch from its exit, once a
    // round; SYSCALL chains into the kernel's block without it.
    assert!(
        (low..=high).contains(&stats.chain_fetches),
        "{} not in {low}..={high}",
        stats.chain_fetches
    );
    for step in [97u64, 1001] {
        let prog = |a: &mut CodeAssembler| syscall_round_trips(a, 40);
        let what = format!("step {step}");
        let (_, stats) = engines_agree(&what, &[1], |e, t| run_stepped(e, t, step, prog));
        let stats = stats[0];
        assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    }
}

#[test]
fn syscall_and_sysret_changing_ac_under_smap_go_through_the_interpreter() {
    // SYSCALL (FMASK clearing AC) and SYSRET (R11 clearing AC) change the
    // first-level TLB's key context under CR4.SMAP when AC was set: the
    // interpreter runs them, with the SMAP revocation of the supervisor
    // slots of user-mode pages, so the kernel's next read of a user page
    // (AC clear) takes the SMAP #PF on both engines; with AC kept they
    // run in translated code. Without SMAP nothing faults.
    let rounds = 100u32;
    for fmask_ac in [true, false] {
        let prog = |a: &mut CodeAssembler| {
            let mut entry = a.create_label();
            let mut user = a.create_label();
            let mut uloop = a.create_label();
            syscall_msrs(a, entry, 0x200 | if fmask_ac { 0x4_0000 } else { 0 });
            a.mov(rsi, DATA).unwrap();
            // The kernel reads a user page with AC set (STAC), then to
            // ring 3 with AC set (the context keeps AC).
            a.stac().unwrap();
            a.add(r14, qword_ptr(rsi)).unwrap();
            a.mov(r10d, 0x4_0202u32).unwrap();
            a.lea(rcx, ptr(user)).unwrap();
            a.mov(r11, r10).unwrap();
            a.sysretq().unwrap();
            a.set_label(&mut user).unwrap();
            a.mov(r12d, rounds).unwrap();
            a.set_label(&mut uloop).unwrap();
            a.add(rbx, r12).unwrap();
            // The last round returns with AC clear.
            a.cmp(r12d, 1).unwrap();
            a.mov(eax, 0x202u32).unwrap();
            a.cmove(r10d, eax).unwrap();
            a.syscall().unwrap();
            a.dec(r12d).unwrap();
            a.jnz(uloop).unwrap();
            a.syscall().unwrap();
            // The kernel: a read of the user page (allowed while AC is
            // set), back with R11 = r10; halt after the last round.
            a.set_label(&mut entry).unwrap();
            a.add(r14, qword_ptr(rsi)).unwrap();
            a.add(r13, rcx).unwrap();
            let mut back = a.create_label();
            a.test(r12d, r12d).unwrap();
            a.jnz(back).unwrap();
            a.mov(r9d, 7u32).unwrap();
            a.hlt().unwrap();
            a.set_label(&mut back).unwrap();
            a.mov(r11, r10).unwrap();
            a.sysretq().unwrap();
        };
        for smap in [true, false] {
            let make = || {
                let mut r = rig(prog);
                if smap {
                    r.cpu.state_mut().cr4 |= machine::cpu::state::cr4::SMAP;
                }
                r
            };
            let what = format!("fmask AC: {fmask_ac}, smap: {smap}");
            let (o, stats) = engines_agree(&what, &[1, 2], |e, t| run_rig(e, t, make()));
            let stats = stats[0];
            assert_eq!(stats.blocks_failed, 0, "{what}: {stats:?}");
            // (Under SMAP the #PF cannot be delivered: the rig's IDT, GDT
            // and stacks are in a user-mode page, which SMAP denies the
            // delivery's implicit supervisor accesses; it ends in a triple
            // fault, where the kernel's read faulted.)
            match (smap, fmask_ac) {
                (false, _) => {
                    assert_eq!(o.exit, VmExit::Hlt, "{what}");
                    assert_eq!(o.gpr[9], 7, "{what}");
                    assert!(stats.call_outs <= 40, "{what}: {stats:?}");
                }
                (true, true) => {
                    // At the first SYSCALL.
                    assert_eq!(o.exit, VmExit::TripleFault, "{what}");
                    assert_eq!(o.gpr[12], rounds as u64, "{what}");
                }
                (true, false) => {
                    // After the SYSRET that cleared AC, at the next read.
                    assert_eq!(o.exit, VmExit::TripleFault, "{what}");
                    assert_eq!(o.gpr[12], 0, "{what}");
                    assert!(stats.call_outs <= 40, "{what}: {stats:?}");
                }
            }
        }
    }
}

#[test]
fn a_native_popf_that_sets_tf_traps_after_one_instruction() {
    // POPF at CPL 0 loading TF goes through the interpreter (which stops
    // translated code's chaining: the trap comes after the next
    // instruction), also where both blocks around it have run translated
    // and chained before.
    let rounds = 6u32;
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        a.xor(ebx, ebx).unwrap();
        a.mov(r12d, rounds).unwrap();
        a.set_label(&mut top).unwrap();
        popf_tf_in_the_last_round(a, top);
    });
    traps_after_one_instruction(&o, &stats, rounds);
}

/// The rest of a loop from `top` (r12 rounds, ebx counting): RFLAGS
/// popped as pushed, but with TF in the last round, then two INCs of ebx;
/// HLT after the loop.
fn popf_tf_in_the_last_round(a: &mut CodeAssembler, top: CodeLabel) {
    let mut body = a.create_label();
    a.pushfq().unwrap();
    a.pop(rax).unwrap();
    a.cmp(r12d, 1).unwrap();
    a.jne(body).unwrap();
    a.or(eax, 0x100).unwrap();
    a.set_label(&mut body).unwrap();
    a.push(rax).unwrap();
    a.popfq().unwrap();
    a.inc(ebx).unwrap();
    a.inc(ebx).unwrap();
    a.dec(r12d).unwrap();
    a.jnz(top).unwrap();
    a.hlt().unwrap();
}

/// The outcome of [`popf_tf_in_the_last_round`] after `rounds`: the
/// single-step #DB after the first INC of the last round.
fn traps_after_one_instruction(o: &Outcome, stats: &machine::jit::JitStats, rounds: u32) {
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(o.gpr[15], HANDLER_MARK + 1, "single-step #DB");
    let after = 2 * rounds as u64 - 1;
    assert_eq!(o.gpr[3], after, "one instruction after the last POPF");
}

#[test]
fn a_popf_that_sets_tf_after_an_int_in_the_same_run_traps_after_one_instruction() {
    // INT n (which the run loop's single-step rule marks as trapping on
    // the TF it leaves) runs through the interpreter; translated code
    // chained on from it (through its handler's IRETQ, or a plain jump
    // back; both ways through `Cpu::jit_chain_fetch`, the delivery asking
    // for an event check) to a POPF that sets TF trapped right after the
    // POPF: the trap comes after the instruction after it, as in the
    // interpreter, whose block after the INT's starts afresh.
    let rounds = 4u32;
    for iret in [true, false] {
        let (o, stats) = both(|a| {
            let mut top = a.create_label();
            let mut back = a.create_label();
            let mut handler = a.create_label();
            // Vector 0x40's gate: the handler below.
            let gate = IDT + 0x40 * 16;
            a.lea(rax, ptr(handler)).unwrap();
            a.mov(word_ptr(gate), ax).unwrap();
            a.mov(word_ptr(gate + 2), KERNEL_CS as u32).unwrap();
            a.mov(word_ptr(gate + 4), 0x8e00u32).unwrap();
            a.shr(rax, 16).unwrap();
            a.mov(word_ptr(gate + 6), ax).unwrap();
            a.shr(rax, 16).unwrap();
            a.mov(dword_ptr(gate + 8), eax).unwrap();
            a.xor(ebx, ebx).unwrap();
            a.mov(r12d, rounds).unwrap();
            a.set_label(&mut top).unwrap();
            a.int(0x40).unwrap();
            a.set_label(&mut back).unwrap();
            popf_tf_in_the_last_round(a, top);
            a.set_label(&mut handler).unwrap();
            a.inc(r13d).unwrap();
            if iret {
                a.iretq().unwrap();
            } else {
                // The frame dropped (IF was clear before the gate too).
                a.add(rsp, 40).unwrap();
                a.jmp(back).unwrap();
            }
        });
        traps_after_one_instruction(&o, &stats, rounds);
        assert_eq!(o.gpr[13], rounds as u64, "iret: {iret}");
    }
}

#[test]
fn first_level_fills_take_only_the_pcids_own_or_global_entries() {
    // Two address spaces under CR4.PCIDE: PCID 1 (the rig's tables) and
    // PCID 2 (a copy) map linear page D to different frames, and page G
    // (global) to one frame. Each round PCID 1 reads D, then again after
    // another page took D's first-level slot (a set search that leaves a
    // hint), INVLPG drops D's entry, PCID 2 reads D (its entry takes the
    // way PCID 1's had: same tag, another PCID) and G, PCID 1 reads D and
    // G again, and INVLPG drops both PCIDs' entries for D. The hint PCID 1 left for D now points at PCID 2's entry:
    // the fill thunk must not take it (it would read PCID 2's frame),
    // while G's entry, global, serves both PCIDs through their hints.
    const D: u64 = 0x80_0000;
    const G: u64 = D + 0x1000;
    const PT_A: u64 = 0x8000;
    const PML4_B: u64 = 0x9000;
    const PDPT_B: u64 = 0xa000;
    const PD_B: u64 = 0xb000;
    const PT_B: u64 = 0xc000;
    const NO_FLUSH: u64 = 1 << 63;
    let rounds = 300u64;
    let prog = |a: &mut CodeAssembler| {
        let mut top = a.create_label();
        a.mov(r9, rounds).unwrap();
        a.xor(esi, esi).unwrap();
        a.mov(rdi, D).unwrap();
        a.set_label(&mut top).unwrap();
        a.add(rsi, qword_ptr(rdi)).unwrap();
        a.mov(rax, qword_ptr(rdi + 0x40000)).unwrap();
        a.add(rsi, qword_ptr(rdi)).unwrap();
        a.invlpg(ptr(rdi)).unwrap();
        a.mov(rcx, PML4_B | 2 | NO_FLUSH).unwrap();
        a.mov(cr3, rcx).unwrap();
        a.mov(rax, qword_ptr(rdi + 0x2000)).unwrap();
        a.add(rsi, qword_ptr(rdi)).unwrap();
        a.add(rsi, qword_ptr(rdi + (G - D) as i32)).unwrap();
        a.mov(rcx, PML4 | 1 | NO_FLUSH).unwrap();
        a.mov(cr3, rcx).unwrap();
        // (The first read after a CR3 load caches the lookup key the
        // thunk needs: through the Rust fill.)
        a.mov(rax, qword_ptr(rdi + 0x2000)).unwrap();
        a.add(rsi, qword_ptr(rdi)).unwrap();
        a.add(rsi, qword_ptr(rdi + (G - D) as i32)).unwrap();
        // Both PCIDs' entries for D go, so that each round starts alike.
        a.invlpg(ptr(rdi)).unwrap();
        a.dec(r9).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    };
    let run = |engine, threshold| {
        let r = rig(prog);
        let w = |a: u64, v: u64| r.mem.write_u64(Hpa(a), v).unwrap();
        // PCID 2's tables: a copy of the rig's 2 MiB identity map.
        w(PML4_B, PDPT_B | 0x7);
        w(PDPT_B, PD_B | 0x7);
        for i in 0..(MEM >> 21) {
            w(PD_B + i * 8, (i << 21) | 0x87);
        }
        // D's 2 MiB region through a page table in each: identity, but
        // D to 0x90_0000 (PCID 1) or 0x91_0000 (PCID 2), and G global.
        for (pd, pt, frame) in [(PD, PT_A, 0x90_0000u64), (PD_B, PT_B, 0x91_0000)] {
            w(pd + (D >> 21) * 8, pt | 0x7);
            for i in 0..512u64 {
                w(pt + i * 8, (D + (i << 12)) | 0x3);
            }
            w(pt, frame | 0x3);
            w(pt + ((G - D) >> 12) * 8, 0x92_0000 | 0x103);
        }
        w(0x90_0000, 1);
        w(0x91_0000, 1000);
        w(0x92_0000, 7);
        let mut r = r;
        let s = r.cpu.state_mut();
        // CR4.PCIDE and CR4.PGE (G's entry global).
        s.cr4 |= 1 << 17 | 1 << 7;
        s.cr3 = PML4 | 1;
        run_rig(engine, threshold, r)
    };
    let (interp, stats) = engines_agree("pcids", &[1], run);
    let stats = stats[0];
    assert_eq!(interp.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    assert_eq!(interp.gpr[6], rounds * (1 + 1 + 1000 + 7 + 1 + 7));
    // The Rust fill takes six a round (D's first miss, the set search
    // leaving D's hint, each PCID's miss of D after the INVLPG, the reads
    // that cache the key after each CR3 load) and G's first reads; the
    // thunk G's other reads (one a round under each PCID) and PCID 1's
    // read of D through the hint that must not be taken.
    assert!(stats.rust_fills <= 6 * rounds + 8, "{stats:?}");
}

#[test]
fn bit_counts_direction_and_cr2_reads_run_natively() {
    // Each round: BSF/BSR/TZCNT/LZCNT/POPCNT of 32 and 64 bits over
    // values that include 0 (BSF/BSR then keep the whole destination),
    // with the flags before each one set differently and every result's
    // flags folded in (PUSHFQ); STD and CLD around a flag-setting ADD;
    // MOV from CR2.
    let rounds = 200u64;
    let prog = |a: &mut CodeAssembler| {
        let mut top = a.create_label();
        a.mov(rdi, rounds).unwrap();
        a.mov(r8, 0x8000_0000_0000_0001u64).unwrap();
        a.xor(r13d, r13d).unwrap();
        a.set_label(&mut top).unwrap();
        // r9 = a value with runs of zeros, 0 every fourth round.
        a.mov(r9, r8).unwrap();
        a.test(dil, 3).unwrap();
        a.cmovz(r9, r13).unwrap();
        a.mov(r10, 0x1234_5678_9abc_def0u64).unwrap();
        a.mov(r11, r10).unwrap();
        for (k, size64) in [(0, true), (1, false)] {
            let src = if size64 { r9 } else { r8 };
            // Flags before: OF and CF set, or all clear.
            if k == 0 {
                a.mov(eax, 0x7fff_ffff).unwrap();
                a.add(eax, 1).unwrap();
            } else {
                a.xor(eax, eax).unwrap();
            }
            if size64 {
                a.bsf(r10, src).unwrap();
                a.pushfq().unwrap();
                a.bsr(r11, src).unwrap();
                a.pushfq().unwrap();
                a.tzcnt(r12, src).unwrap();
                a.pushfq().unwrap();
                a.lzcnt(r14, src).unwrap();
                a.pushfq().unwrap();
                a.popcnt(r15, src).unwrap();
                a.pushfq().unwrap();
            } else {
                a.bsf(r10d, r9d).unwrap();
                a.pushfq().unwrap();
                a.bsr(r11d, r9d).unwrap();
                a.pushfq().unwrap();
                a.tzcnt(r12d, r9d).unwrap();
                a.pushfq().unwrap();
                a.lzcnt(r14d, r9d).unwrap();
                a.pushfq().unwrap();
                a.popcnt(r15d, r9d).unwrap();
                a.pushfq().unwrap();
            }
            for r in [r10, r11, r12, r14, r15] {
                a.rol(r13, 7).unwrap();
                a.xor(r13, r).unwrap();
            }
            for _ in 0..5 {
                a.pop(rax).unwrap();
                a.rol(r13, 3).unwrap();
                a.xor(r13, rax).unwrap();
            }
        }
        // STD, a flag-setting ADD, the flags, CLD.
        a.std().unwrap();
        a.add(r13, r8).unwrap();
        a.pushfq().unwrap();
        a.cld().unwrap();
        a.pushfq().unwrap();
        a.pop(rax).unwrap();
        a.add(r13, rax).unwrap();
        a.pop(rax).unwrap();
        a.add(r13, rax).unwrap();
        a.mov(rax, cr2).unwrap();
        a.add(r13, rax).unwrap();
        a.rol(r8, 5).unwrap();
        a.dec(rdi).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    };
    let run = |engine, threshold| {
        let mut r = rig(prog);
        r.cpu.state_mut().cr2 = 0xdead_b000;
        run_rig(engine, threshold, r)
    };
    let (interp, stats) = engines_agree("cr2 0xdead_b000", &[1, 2], run);
    for stats in stats {
        assert_eq!(stats.blocks_failed, 0, "{stats:?}");
        // (The first run of the loop, translating at the second.)
        assert!(stats.call_outs <= 10, "{stats:?}");
    }
    assert_eq!(interp.exit, VmExit::Hlt);
}

#[test]
fn rep_stos_and_movs_within_a_page_run_natively() {
    // REP STOS and REP MOVS of every element size, each run inside one
    // page of each operand (aligned and not, whole pages, one element,
    // counts moving with the iteration): translated code runs them
    // itself, with the interpreter's memory, registers, cycles (each
    // element after the first costs extra) and TLB counters.
    let iterations = 100u64;
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        a.mov(r9, iterations).unwrap();
        a.mov(rbx, 0x0123_4567_89ab_cdefu64).unwrap();
        a.set_label(&mut top).unwrap();
        a.lea(rax, qword_ptr(rbx + r9)).unwrap();
        // Whole pages, as Linux's clear_page and copy_page.
        a.mov(rdi, DATA + 0x4000).unwrap();
        a.mov(ecx, 512).unwrap();
        a.rep().stosq().unwrap();
        a.mov(rsi, DATA + 0x4000).unwrap();
        a.mov(rdi, DATA + 0x5000).unwrap();
        a.mov(ecx, 512).unwrap();
        a.rep().movsq().unwrap();
        // Misaligned runs whose length moves with r9, up to a page's end.
        a.mov(rdi, DATA + 0x1003).unwrap();
        a.lea(rcx, qword_ptr(r9 + 5)).unwrap();
        a.rep().stosb().unwrap();
        a.mov(rdi, DATA + 0x1ffe).unwrap();
        a.sub(rdi, r9).unwrap();
        a.sub(rdi, r9).unwrap();
        a.mov(rcx, r9).unwrap();
        a.rep().stosw().unwrap();
        a.mov(rdi, DATA + 0x1802).unwrap();
        a.mov(ecx, 37).unwrap();
        a.rep().stosd().unwrap();
        a.mov(rsi, DATA + 0x1001).unwrap();
        a.lea(rdi, qword_ptr(r9 + DATA as i32 + 0x2007)).unwrap();
        a.lea(rcx, qword_ptr(r9 * 2 + 3)).unwrap();
        a.rep().movsb().unwrap();
        a.mov(rsi, DATA + 0x1800).unwrap();
        a.mov(rdi, DATA + 0x3002).unwrap();
        a.mov(ecx, 33).unwrap();
        a.rep().movsw().unwrap();
        a.lea(rsi, qword_ptr(r9 * 4 + DATA as i32 + 0x4000))
            .unwrap();
        a.mov(rdi, DATA + 0x3404).unwrap();
        a.mov(ecx, 100).unwrap();
        a.rep().movsd().unwrap();
        // One element.
        a.mov(rdi, DATA + 0x3ff8).unwrap();
        a.mov(ecx, 1).unwrap();
        a.rep().stosq().unwrap();
        a.mov(rdi, DATA + 0x3ff0).unwrap();
        a.mov(ecx, 1).unwrap();
        a.rep().movsq().unwrap();
        a.add(r10, rdi).unwrap();
        a.add(r11, rsi).unwrap();
        a.add(r12, rcx).unwrap();
        a.dec(r9).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    assert_eq!(o.gpr[1], 0);
    // Ten string instructions per iteration; none calls out.
    let bound = 20;
    assert!(stats.call_outs <= bound, "{} > {bound}", stats.call_outs);
}

#[test]
fn backward_rep_strings_by_pages_match_element_by_element() {
    // REP MOVS and STOS with DF set: overlapping with the destination
    // above the source (a memmove up), overlapping below it, unaligned,
    // apart, across pages, of every element size. The interpreter runs
    // them a page at a time, or one element at a time while DR7 enables
    // a breakpoint (here on an address none of them touches): memory and
    // the index and count registers must end the same.
    let prog = |elementwise: bool| {
        move |a: &mut CodeAssembler| {
            let mut fill = a.create_label();
            if elementwise {
                a.mov(rax, DATA + 0x7ff8).unwrap();
                a.mov(dr0, rax).unwrap();
                // L0, a data write breakpoint of one byte.
                a.mov(eax, 0x0001_0001u32).unwrap();
                a.mov(dr7, rax).unwrap();
            }
            // DATA's first 0x6000 bytes: a pattern of byte positions.
            a.mov(rdi, DATA).unwrap();
            a.mov(ecx, 0x6000u32 / 8).unwrap();
            a.mov(rax, 0x0706_0504_0302_0100u64).unwrap();
            a.mov(rdx, 0x0808_0808_0808_0808u64).unwrap();
            a.set_label(&mut fill).unwrap();
            a.mov(qword_ptr(rdi), rax).unwrap();
            a.add(rax, rdx).unwrap();
            a.add(rdi, 8).unwrap();
            a.dec(ecx).unwrap();
            a.jnz(fill).unwrap();
            a.std().unwrap();
            // (source top, destination top, count, element bytes)
            let cases: [(u64, u64, u32, u32); 6] = [
                (0x17f8, 0x19f8, 0x200, 8),
                (0x1803, 0x17f0, 0x900, 1),
                (0x2ffd, 0x3ab2, 0x310, 4),
                (0x4102, 0x0a00, 0x123, 2),
                (0x3ff8, 0x3ffc, 0x300, 8),
                (0x5006, 0x5a0e, 0x401, 2),
            ];
            for (src, dst, count, bytes) in cases {
                a.mov(rsi, DATA + src).unwrap();
                a.mov(rdi, DATA + dst).unwrap();
                a.mov(ecx, count).unwrap();
                match bytes {
                    1 => a.rep().movsb().unwrap(),
                    2 => a.rep().movsw().unwrap(),
                    4 => a.rep().movsd().unwrap(),
                    _ => a.rep().movsq().unwrap(),
                }
            }
            a.mov(rdi, DATA + 0x4ff8).unwrap();
            a.mov(rax, 0x1122_3344_5566_7788u64).unwrap();
            a.mov(ecx, 0x280u32).unwrap();
            a.rep().stosq().unwrap();
            a.mov(rdi, DATA + 0x2803).unwrap();
            a.mov(ecx, 0x605u32).unwrap();
            a.rep().stosb().unwrap();
            a.cld().unwrap();
            a.hlt().unwrap();
        }
    };
    // (The outcomes' memory hashes take in the code page, which differs.)
    let run = |elementwise: bool| {
        let mut r = rig(prog(elementwise));
        r.cpu.set_engine(Engine::Interp);
        assert_eq!(r.run(), VmExit::Hlt);
        let mut data = vec![0u8; 0x6000];
        r.mem.read_bytes(Hpa(DATA), &mut data).unwrap();
        let regs = r.cpu.state().gpr;
        (data, [regs[1], regs[6], regs[7]])
    };
    let (pages, elements) = (run(false), run(true));
    let differs = (0..pages.0.len()).find(|&i| pages.0[i] != elements.0[i]);
    assert_eq!(differs, None, "the first byte that differs");
    assert_eq!(pages.1, elements.1, "rcx, rsi, rdi");
    // The engines agree on the page runs too.
    both(prog(false));
}

#[test]
fn rep_strings_the_fast_path_leaves_to_the_interpreter_agree() {
    // Runs crossing a page (either operand), DF set, RCX = 0 (nothing at
    // all), forward copies whose ranges overlap (the destination a byte
    // or an element above the source: each element reads what the one
    // before wrote), an FS-relative source, 32-bit addressing, a MOVS
    // destination that misses the first level, and STOS/MOVS after a CR3
    // reload (the first access misses the first level: filled, then the
    // fast path).
    let iterations = 60u64;
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        a.mov(r9, iterations).unwrap();
        a.mov(rbx, 0x1111_2222_3333_4444u64).unwrap();
        // FS base for the FS-relative source.
        a.mov(ecx, 0xc000_0100u32).unwrap();
        a.mov(eax, (DATA + 0x6000) as u32).unwrap();
        a.xor(edx, edx).unwrap();
        a.wrmsr().unwrap();
        a.set_label(&mut top).unwrap();
        a.lea(rax, qword_ptr(rbx + r9)).unwrap();
        // Crossing: STOS, MOVS's destination, MOVS's source.
        a.mov(rdi, DATA + 0x0ff0).unwrap();
        a.mov(ecx, 5).unwrap();
        a.rep().stosq().unwrap();
        a.mov(rsi, DATA + 0x1000).unwrap();
        a.mov(rdi, DATA + 0x1ffd).unwrap();
        a.mov(ecx, 9).unwrap();
        a.rep().movsb().unwrap();
        a.mov(rsi, DATA + 0x2ffc).unwrap();
        a.mov(rdi, DATA + 0x3000).unwrap();
        a.mov(ecx, 4).unwrap();
        a.rep().movsw().unwrap();
        // DF set: backwards.
        a.std().unwrap();
        a.mov(rsi, DATA + 0x1010).unwrap();
        a.mov(rdi, DATA + 0x3100).unwrap();
        a.lea(rcx, qword_ptr(r9 + 2)).unwrap();
        a.rep().movsb().unwrap();
        a.mov(rdi, DATA + 0x3200).unwrap();
        a.mov(ecx, 3).unwrap();
        a.rep().stosd().unwrap();
        a.cld().unwrap();
        // RCX = 0.
        a.xor(ecx, ecx).unwrap();
        a.mov(rdi, DATA + 0x3300).unwrap();
        a.rep().stosq().unwrap();
        a.mov(rsi, DATA + 0x3400).unwrap();
        a.rep().movsb().unwrap();
        a.add(r10, rdi).unwrap();
        a.add(r10, rsi).unwrap();
        // Overlapping forward copies: a byte smeared over 40, an element
        // over 6.
        a.mov(rsi, DATA + 0x3500).unwrap();
        a.mov(byte_ptr(rsi), r9b).unwrap();
        a.lea(rdi, qword_ptr(rsi + 1)).unwrap();
        a.mov(ecx, 40).unwrap();
        a.rep().movsb().unwrap();
        a.mov(rsi, DATA + 0x3600).unwrap();
        a.mov(qword_ptr(rsi), rax).unwrap();
        a.lea(rdi, qword_ptr(rsi + 8)).unwrap();
        a.mov(ecx, 6).unwrap();
        a.rep().movsq().unwrap();
        a.mov(r13, qword_ptr(DATA + 0x3520)).unwrap();
        a.mov(r14, qword_ptr(DATA + 0x3630)).unwrap();
        // FS-relative source; 32-bit addressing.
        a.mov(esi, 0x40).unwrap();
        a.mov(rdi, DATA + 0x3700).unwrap();
        a.mov(ecx, 8).unwrap();
        a.db(&[0x64, 0xf3, 0xa4]).unwrap(); // rep movsb (fs:rsi)
        a.mov(edi, (DATA + 0x3800) as u32).unwrap();
        a.mov(ecx, 8).unwrap();
        a.db(&[0x67, 0xf3, 0x48, 0xab]).unwrap(); // rep stos qword [edi]
                                                  // The first level emptied: the next STOS and MOVS source miss
                                                  // (filled); after the MOVS's source a destination page not used
                                                  // since misses (the interpreter).
        a.mov(rdx, cr3).unwrap();
        a.mov(cr3, rdx).unwrap();
        a.mov(rdi, DATA + 0x5000).unwrap();
        a.mov(ecx, 64).unwrap();
        a.rep().stosq().unwrap();
        a.mov(rsi, DATA + 0x5000).unwrap();
        a.mov(rdi, DATA + 0x7000).unwrap();
        a.mov(ecx, 64).unwrap();
        a.rep().movsq().unwrap();
        a.add(r11, rdi).unwrap();
        a.add(r12, rsi).unwrap();
        a.dec(r9).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    // The byte smeared (r9 was 1 in the last iteration) and the element.
    assert_eq!(o.gpr[13], 0x0101_0101_0101_0101);
    assert_eq!(o.gpr[14], 0x1111_2222_3333_4445);
    // Per iteration: the three crossing runs, STD, CLD and the two runs
    // between them, the FS-relative and 32-bit ones, the CR3 moves and
    // the MOVS whose destination missed. The runs in one page (RCX = 0,
    // the overlapping copies, those after their first access's fill) do
    // not call out.
    let bound = 12 * iterations + 10;
    assert!(stats.call_outs <= bound, "{} > {bound}", stats.call_outs);
}

#[test]
fn rep_stos_and_movs_into_code_run_the_new_bytes() {
    // REP STOS and REP MOVS over the immediate of a `mov eax, imm32` the
    // next iteration runs (its frame holds decoded code: the
    // interpreter's element-by-element way, which retires the block).
    let iterations = 200u32;
    let (o, stats) = both(|a| {
        let mut patch = a.create_label();
        let mut patch2 = a.create_label();
        a.mov(r9d, iterations).unwrap();
        a.xor(ebx, ebx).unwrap();
        a.set_label(&mut patch).unwrap();
        a.mov(eax, 0x1234_5678u32).unwrap();
        a.add(rbx, rax).unwrap();
        a.set_label(&mut patch2).unwrap();
        a.mov(edx, 0x9abc_def0u32).unwrap();
        a.add(rbx, rdx).unwrap();
        a.lea(rdi, ptr(patch)).unwrap();
        a.add(rdi, 1).unwrap();
        a.mov(eax, r9d).unwrap();
        a.mov(ecx, 2).unwrap();
        a.rep().stosb().unwrap();
        a.mov(qword_ptr(DATA), r9).unwrap();
        a.mov(rsi, DATA).unwrap();
        a.lea(rdi, ptr(patch2)).unwrap();
        a.add(rdi, 2).unwrap();
        a.mov(ecx, 2).unwrap();
        a.rep().movsb().unwrap();
        a.dec(r9d).unwrap();
        a.jnz(patch).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    let mut imm = 0x1234_5678u64;
    let mut imm2 = 0x9abc_def0u64;
    let mut sum = 0u64;
    for c in (1..=iterations as u64).rev() {
        sum += imm + imm2;
        imm = (imm & 0xffff_0000) | ((c & 0xff) * 0x101);
        imm2 = (imm2 & 0xff00_00ff) | (c & 0xffff) << 8;
    }
    assert_eq!(o.gpr[3], sum);
}

#[test]
fn rep_strings_fault_precisely_after_a_fill() {
    // REP STOS and REP MOVS on pages walking up to the end of the mapped
    // memory (each new page misses the first level): the fourth
    // iteration's first access is on an unmapped page, and the fill's
    // walk takes the #PF, delivered at the instruction with nothing of it
    // done.
    type Form = fn(&mut CodeAssembler);
    let forms: [(&str, Form); 3] = [
        ("rep stosq", |a| {
            a.mov(rdi, rsi).unwrap();
            a.mov(ecx, 16).unwrap();
            a.rep().stosq().unwrap();
        }),
        ("rep movsb from", |a| {
            a.mov(rdi, DATA + 0x10).unwrap();
            a.mov(ecx, 16).unwrap();
            a.rep().movsb().unwrap();
            a.sub(rsi, 16).unwrap();
        }),
        ("rep movsq to", |a| {
            a.mov(rdi, rsi).unwrap();
            a.mov(rsi, DATA).unwrap();
            a.mov(ecx, 4).unwrap();
            a.rep().movsq().unwrap();
            a.lea(rsi, qword_ptr(rdi - 32)).unwrap();
        }),
    ];
    for (name, form) in forms {
        let (o, stats) = both(|a| {
            let mut top = a.create_label();
            a.mov(rsp, DATA + 0x7000).unwrap();
            a.mov(rsi, MEM - 0x3000).unwrap();
            a.mov(r8d, 10).unwrap();
            a.xor(ebx, ebx).unwrap();
            a.mov(rax, 0x5555_6666_7777_8888u64).unwrap();
            a.set_label(&mut top).unwrap();
            a.add(r11, r8).unwrap();
            a.swapgs().unwrap();
            form(a);
            a.add(rsi, 0x1000).unwrap();
            a.inc(rbx).unwrap();
            a.dec(r8d).unwrap();
            a.jnz(top).unwrap();
            a.hlt().unwrap();
        });
        assert_eq!(o.exit, VmExit::Hlt, "{name}");
        assert_eq!(o.gpr[15], HANDLER_MARK + 14, "{name}: #PF delivered");
        assert_eq!(o.gpr[3], 3, "{name}: three iterations completed");
        assert_ne!(o.gpr[1], 0, "{name}: RCX untouched by the faulting run");
        assert_eq!(stats.blocks_failed, 0, "{name}: {stats:?}");
    }
}

#[test]
fn rep_strings_crossing_into_a_page_mapped_elsewhere_agree() {
    // 4 KiB pages with DATA + 0x1000 and DATA + 0x2000 swapped: runs that
    // cross from DATA's page into the next (either operand) continue in
    // another frame, through a translation of their own (the
    // interpreter's way), next to runs inside one page.
    let prog = |a: &mut CodeAssembler| {
        let mut top = a.create_label();
        a.mov(r9, 50u64).unwrap();
        a.set_label(&mut top).unwrap();
        a.lea(rax, qword_ptr(r9 * 8 + 0x77)).unwrap();
        a.mov(rdi, DATA + 0x0ff0).unwrap();
        a.mov(ecx, 5).unwrap();
        a.rep().stosq().unwrap();
        a.mov(rsi, CODE).unwrap();
        a.lea(rdi, qword_ptr(r9 + DATA as i32 + 0x1fd0)).unwrap();
        a.mov(ecx, 99).unwrap();
        a.rep().movsb().unwrap();
        a.mov(rsi, DATA + 0x0ffc).unwrap();
        a.mov(rdi, DATA + 0x3000).unwrap();
        a.mov(ecx, 4).unwrap();
        a.rep().movsw().unwrap();
        a.mov(rsi, DATA + 0x1000).unwrap();
        a.mov(rdi, DATA + 0x3100).unwrap();
        a.mov(ecx, 32).unwrap();
        a.rep().movsq().unwrap();
        a.dec(r9).unwrap();
        a.jnz(top).unwrap();
        a.mov(r10, qword_ptr(DATA + 0x1000)).unwrap();
        a.mov(r11, qword_ptr(DATA + 0x2000)).unwrap();
        a.mov(r12, qword_ptr(DATA + 0x3000)).unwrap();
        a.hlt().unwrap();
    };
    let swapped = |engine, threshold| {
        let r = rig(prog);
        remap_4k(&r, 0x9000, 2);
        let pte = |la: u64| Hpa(0x9000 + ((la - 0x20_0000) >> 12) * 8);
        let (a, b) = (DATA + 0x1000, DATA + 0x2000);
        r.mem.write_u64(pte(a), b | 0x7).unwrap();
        r.mem.write_u64(pte(b), a | 0x7).unwrap();
        run_rig(engine, threshold, r)
    };
    let (interp, stats) = engines_agree("4 KiB pages", &[1, 2], swapped);
    assert_eq!(interp.exit, VmExit::Hlt);
    assert_eq!(interp.gpr[10], 8 + 0x77, "the STOS's last run, across");
    assert_ne!(interp.gpr[11], 0, "the MOVSB's last run, across");
    assert_eq!(interp.gpr[12], (8 + 0x77) << 32, "the MOVSW's, from across");
    for stats in stats {
        assert_eq!(stats.blocks_failed, 0, "{stats:?}");
        assert!(stats.blocks_translated >= 1, "{stats:?}");
    }
}

#[test]
fn extends_of_high_byte_registers_run_natively() {
    // MOVZX and MOVSX of AH, CH, DH and BH into 32-bit registers (no REX
    // prefix can name them: Linux's CRC32 table loop reads BH and AH so),
    // over values whose high byte has bit 7 set and clear, the
    // destination sometimes the source's own register.
    let rounds = 300u64;
    let prog = |a: &mut CodeAssembler| {
        let mut top = a.create_label();
        a.mov(r14, rounds).unwrap();
        a.mov(r8, 0x0123_4567_89ab_cdefu64).unwrap();
        a.mov(r9, 0xfedc_ba98_7654_3210u64).unwrap();
        a.xor(r13d, r13d).unwrap();
        a.set_label(&mut top).unwrap();
        a.mov(rax, r8).unwrap();
        a.mov(rcx, r9).unwrap();
        a.mov(rdx, r8).unwrap();
        a.mov(rbx, r9).unwrap();
        a.movzx(ebp, ah).unwrap();
        a.movsx(esi, ch).unwrap();
        a.movsx(edi, dh).unwrap();
        a.movzx(edx, bh).unwrap();
        a.movsx(eax, ah).unwrap();
        a.movzx(ebx, bh).unwrap();
        for r in [rbp, rsi, rdi, rdx, rax, rbx] {
            a.rol(r13, 9).unwrap();
            a.xor(r13, r).unwrap();
        }
        a.rol(r8, 3).unwrap();
        a.ror(r9, 5).unwrap();
        a.dec(r14).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    };
    let (o, stats) = both(prog);
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    assert!(stats.call_outs <= 2, "{stats:?}");
}

/// The loop of `setcc_and_conversions_keep_guest_registers_in_host_registers`:
/// with `by_setcc` false, its two SETcc become ADC of 0 to the 32-bit
/// register, a register form that keeps the cache and reads CF as they
/// read the flags (not the same result: a loop of about the same code).
fn setcc_loop(a: &mut CodeAssembler, by_setcc: bool) {
    let mut top = a.create_label();
    a.mov(r9, 500u64).unwrap();
    a.mov(r10, 0x9e37_79b9_7f4a_7c15u64).unwrap();
    a.mov(r11, 0x0123_4567_89ab_cdefu64).unwrap();
    a.xor(esi, esi).unwrap();
    a.xor(r13d, r13d).unwrap();
    a.set_label(&mut top).unwrap();
    // Registers dirty in host registers around each form below: r10,
    // r11, r13, rsi, rdi, rax, rdx.
    a.mov(rax, r11).unwrap();
    a.imul_3(r10, r10, 5).unwrap();
    a.add(r11, r10).unwrap();
    a.lea(rdi, qword_ptr(r11 + r10)).unwrap();
    a.cmp(r11, r10).unwrap();
    if by_setcc {
        a.setb(sil).unwrap();
    } else {
        a.adc(esi, 0).unwrap();
    }
    a.add(r13, rsi).unwrap();
    a.test(r10d, 0x10).unwrap();
    if by_setcc {
        a.setne(dil).unwrap();
    } else {
        a.adc(edi, 0).unwrap();
    }
    a.add(r13, rdi).unwrap();
    // One-operand MUL of 64 and 32 bits.
    a.mov(rax, r11).unwrap();
    a.mul(r10).unwrap();
    a.xor(r13, rdx).unwrap();
    a.add(r13, rax).unwrap();
    a.mul(r13d).unwrap();
    // A block ends here: the next reads rdx and rax from the `Cpu`.
    let mut next = a.create_label();
    a.jmp(next).unwrap();
    a.set_label(&mut next).unwrap();
    a.add(r13, rdx).unwrap();
    a.xor(r13, rax).unwrap();
    // The sign extensions: rax, and rdx from rax.
    a.mov(rdx, r11).unwrap();
    a.cqo().unwrap();
    a.xor(r13, rdx).unwrap();
    a.mov(eax, r10d).unwrap();
    a.cdq().unwrap();
    a.add(r13, rdx).unwrap();
    a.mov(rax, r11).unwrap();
    a.cbw().unwrap();
    a.add(r13, rax).unwrap();
    a.cdqe().unwrap();
    a.sub(r13, rax).unwrap();
    // NEG, NOT and BSWAP of dirty registers.
    a.mov(rdx, r10).unwrap();
    a.neg(rdx).unwrap();
    a.adc(r13, rdx).unwrap();
    a.not(edx).unwrap();
    a.bswap(rdx).unwrap();
    a.xor(r13, rdx).unwrap();
    a.rol(r13, 9).unwrap();
    a.dec(r9).unwrap();
    a.jnz(top).unwrap();
    a.hlt().unwrap();
}

#[test]
fn setcc_and_conversions_keep_guest_registers_in_host_registers() {
    // SETcc of a byte register, one-operand MUL, CQO/CDQ/CBW/CDQE, NEG,
    // NOT and BSWAP among register forms whose results are still only in host
    // registers: the engines agree on everything, with no call-out.
    let (o, stats) = both(|a| setcc_loop(a, true));
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    assert!(stats.call_outs <= 2, "{stats:?}");
    // And they run on those host registers: the SETcc do not cost the
    // stores and reloads of the dirty registers (about 50 bytes of code
    // each here) against the ADC that replaces them.
    let (_, adc) = both(|a| setcc_loop(a, false));
    assert_eq!(stats.blocks_translated, adc.blocks_translated);
    assert!(
        stats.code_bytes < adc.code_bytes + 30,
        "SETcc {} bytes, ADC {} bytes",
        stats.code_bytes,
        adc.code_bytes
    );
}

#[test]
fn rep_movs_whose_destination_misses_the_first_level_run_natively() {
    // REP MOVS whose source hits the first level and whose destination's
    // write slot a store 64 pages on has just taken (the TLB still holds
    // the page): the destination is filled (the thunk's TLB hit; in the
    // last 0x88 bytes of a page, where the thunk leaves it, the Rust
    // fill's) and the copy runs natively; into a frame holding code the
    // fill leaves it to the interpreter, the source still in its slot.
    let iterations = 100u64;
    let evict = |a: &mut CodeAssembler, page: u64| {
        a.mov(qword_ptr(page + 0x40000), rax).unwrap();
    };
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        a.mov(r9, iterations).unwrap();
        a.mov(rbx, 0x0f1e_2d3c_4b5a_6978u64).unwrap();
        a.set_label(&mut top).unwrap();
        a.lea(rax, qword_ptr(rbx + r9)).unwrap();
        a.mov(qword_ptr(DATA + 0x6000), rax).unwrap();
        a.mov(qword_ptr(DATA + 0x6ff8), r9).unwrap();
        evict(a, DATA + 0x1000);
        a.mov(rsi, DATA + 0x6000).unwrap();
        a.lea(rdi, qword_ptr(r9 * 8 + DATA as i32 + 0x1000))
            .unwrap();
        a.mov(rcx, r9).unwrap();
        a.rep().movsq().unwrap();
        evict(a, DATA + 0x3000);
        a.mov(rsi, DATA + 0x6003).unwrap();
        a.lea(rdi, qword_ptr(r9 + DATA as i32 + 0x3003)).unwrap();
        a.lea(rcx, qword_ptr(r9 + 7)).unwrap();
        a.rep().movsb().unwrap();
        // In the page's last 0x88 bytes, up to its end.
        evict(a, DATA + 0x5000);
        a.mov(rsi, DATA + 0x6200).unwrap();
        a.mov(rdi, DATA + 0x5fc0).unwrap();
        a.mov(ecx, 16).unwrap();
        a.rep().movsd().unwrap();
        // One element (the interpreter's element way).
        evict(a, DATA + 0x4000);
        a.mov(rsi, DATA + 0x6ff8).unwrap();
        a.lea(rdi, qword_ptr(r9 * 8 + DATA as i32 + 0x4000))
            .unwrap();
        a.mov(ecx, 1).unwrap();
        a.rep().movsq().unwrap();
        a.add(r10, rdi).unwrap();
        a.add(r11, rsi).unwrap();
        a.add(r12, rcx).unwrap();
        a.dec(r9).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    assert_eq!(o.gpr[1], 0);
    // Four copies per iteration, each after its destination's miss; none
    // calls out.
    let bound = 10;
    assert!(stats.call_outs <= bound, "{} > {bound}", stats.call_outs);
    // Into a frame holding code (past the program's end): after the fill,
    // the interpreter, every iteration.
    let (o, stats) = both(|a| {
        let mut top = a.create_label();
        a.mov(r9, iterations).unwrap();
        a.set_label(&mut top).unwrap();
        a.mov(qword_ptr(DATA + 0x6000), r9).unwrap();
        evict(a, CODE);
        a.mov(rsi, DATA + 0x6000).unwrap();
        a.mov(rdi, CODE + 0xf00).unwrap();
        a.mov(ecx, 8).unwrap();
        a.rep().movsb().unwrap();
        a.add(r10, qword_ptr(CODE + 0xf00)).unwrap();
        a.dec(r9).unwrap();
        a.jnz(top).unwrap();
        a.hlt().unwrap();
    });
    assert_eq!(o.exit, VmExit::Hlt);
    assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    assert_eq!(o.gpr[10], iterations * (iterations + 1) / 2);
}

#[test]
fn rep_movs_whose_destination_faults_after_a_source_hit_agree() {
    // 4 KiB pages, DATA + 0x2000 read-only: a REP MOVS inside that page,
    // its source hitting the first level, its destination missing it
    // while the TLB holds the page's entry, which does not allow the
    // write (the interpreter's lookup drops it and walks: #PF, with the
    // source's slot gone too); another whose destination page is not
    // mapped. Both deliver the #PF at the instruction with RCX, RSI and
    // RDI untouched, CR2 and the error code as the interpreter leaves
    // them (the frame on a stack in the compared memory).
    type Form = fn(&mut CodeAssembler);
    let forms: [(&str, Form); 2] = [
        ("read-only destination", |a| {
            a.mov(rdi, DATA + 0x2800).unwrap();
        }),
        ("unmapped destination", |a| {
            a.mov(rdi, DATA + 0x3040).unwrap();
        }),
    ];
    for (name, form) in forms {
        let prog = |a: &mut CodeAssembler| {
            a.mov(rsp, DATA + 0x7000).unwrap();
            a.mov(r8d, 20).unwrap();
            let mut top = a.create_label();
            a.set_label(&mut top).unwrap();
            // Copies within the writable page (its entry in the TLB).
            a.mov(rsi, DATA + 0x2010).unwrap();
            a.mov(rdi, DATA + 0x1000).unwrap();
            a.mov(ecx, 4).unwrap();
            a.rep().movsq().unwrap();
            a.dec(r8d).unwrap();
            a.jnz(top).unwrap();
            a.mov(rsi, DATA + 0x2010).unwrap();
            form(a);
            a.mov(ecx, 6).unwrap();
            a.rep().movsq().unwrap();
            a.hlt().unwrap();
        };
        let mapped = |engine, threshold| {
            let r = rig(prog);
            remap_4k(&r, 0x9000, 2);
            let pte = |la: u64| Hpa(0x9000 + ((la - 0x20_0000) >> 12) * 8);
            let ro = DATA + 0x2000;
            r.mem.write_u64(pte(ro), ro | 0x5).unwrap();
            r.mem.write_u64(pte(DATA + 0x3000), 0).unwrap();
            run_rig(engine, threshold, r)
        };
        let (interp, stats) = engines_agree(name, &[1, 2], mapped);
        assert_eq!(interp.exit, VmExit::Hlt, "{name}");
        assert_eq!(interp.gpr[15], HANDLER_MARK + 14, "{name}: #PF");
        assert_eq!(interp.gpr[1], 6, "{name}: RCX untouched");
        assert_eq!(interp.gpr[6], DATA + 0x2010, "{name}: RSI untouched");
        for stats in stats {
            assert_eq!(stats.blocks_failed, 0, "{stats:?}");
            assert!(stats.blocks_translated >= 1, "{stats:?}");
        }
    }
}

#[test]
fn rep_movs_whose_destination_fill_would_evict_the_source_goes_to_the_interpreter() {
    // 4 KiB pages, eight of them in one TLB set (pages 512 KiB apart):
    // the source's page read first (way 0), then seven written (the write
    // class: the source keeps its read slot), which leaves the source's
    // entry the set's next victim. A REP MOVS from it into a ninth page
    // of the set, mapped to the frame holding the program (decoded code):
    // the destination's walk evicts the source's entry, and the frame
    // leaves the copy to the interpreter. The translator must not fill
    // the destination first (it would leave the interpreter a source to
    // translate again: a second walk the interpreter never makes).
    let page = |vpn: u64| vpn << 12;
    let (src, dst) = (page(0x310), page(0x590));
    let fillers = [0x210, 0x290, 0x390, 0x410, 0x490, 0x510, 0x610];
    let prog = |a: &mut CodeAssembler| {
        a.mov(rsp, DATA + 0x7000).unwrap();
        a.mov(rax, qword_ptr(src + 0x100)).unwrap();
        for f in fillers {
            a.mov(qword_ptr(page(f)), rax).unwrap();
        }
        a.mov(rsi, src + 0x100).unwrap();
        a.mov(rdi, dst + 0xf00).unwrap();
        a.mov(ecx, 8).unwrap();
        a.rep().movsb().unwrap();
        a.mov(r10, qword_ptr(CODE + 0xf00)).unwrap();
        a.hlt().unwrap();
    };
    let mapped = |engine, threshold| {
        let r = rig(prog);
        remap_4k(&r, 0x9000, 3);
        let pte = |la: u64| Hpa(0x9000 + ((la - 0x20_0000) >> 12) * 8);
        r.mem.write_u64(pte(dst), CODE | 0x7).unwrap();
        r.mem
            .write_u64(Hpa(src + 0x100), 0x1122_3344_5566_7788)
            .unwrap();
        run_rig(engine, threshold, r)
    };
    let (interp, stats) = engines_agree("4 KiB pages", &[1, 2], mapped);
    assert_eq!(interp.exit, VmExit::Hlt);
    assert_eq!(interp.gpr[10], 0x1122_3344_5566_7788);
    for stats in stats {
        assert_eq!(stats.blocks_failed, 0, "{stats:?}");
    }
}
