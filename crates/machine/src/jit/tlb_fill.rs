//! The first-level TLB fill of translated code, in host code.
//!
//! An inline access whose first-level probe misses calls the fill
//! (`Helpers::fill`). Most misses are TLB hits: the first-level TLB is
//! small and every TLB fill empties it, so after each walk the accesses of
//! the next instructions miss it again and hit the TLB. This thunk takes
//! exactly those: a 4 KiB TLB entry found through its hint
//! ([`Tlb::lookup_usable`](crate::mmu::tlb::Tlb::lookup_usable)'s first
//! step), allowed under the lookup key the first-level TLB caches for the
//! mode, counted as a hit and marked recently used as the TLB does, then
//! the first-level slot filled as [`L1Tlb::fill`](crate::cpu::l1tlb)
//! fills it. Anything else (a page-crossing or non-canonical address, no
//! cached key, no hint, a hint to a larger entry, an entry that does not
//! allow the access, a slot the interpreter's lookup would hit) goes,
//! before any effect, to the Rust fill (`native::fill_out`), which does
//! the same and everything else. So the thunk is a faster way to the same
//! state, never a different one; the `jit` tests and difftest compare
//! the engines.
//!
//! Calling convention: that of `fill_out` (sysv64: rdi = cpu, rsi =
//! memory, rdx = linear address, ecx = class | bytes << 8; returns a
//! [`super::fill`] code in rax), called from generated code, so r14 holds
//! the [`native::Env`](super::native::Env) and rbp the first-level slots.

use super::fill;
use super::{ENV_CODE_FRAMES, ENV_L1_BOOK, ENV_MEM_BASE, ENV_MEM_SIZE};
use super::{ENV_TLB_ENTRIES, ENV_TLB_FULL_SET, ENV_TLB_HINTS, ENV_TLB_HITS};
use super::{ENV_TLB_RECENTLY_USED, ENV_TLB_WAYS};
use crate::cpu::l1tlb::{book, SLOTS, SLOT_BYTES, SLOT_HOST_DELTA, SLOT_HPA, SLOT_JIT_PAGE};
use crate::mmu::tlb::jit_view as tv;
use iced_x86::code_asm::{
    byte_ptr, cl, dword_ptr, eax, ecx, edi, edx, qword_ptr, r10, r10d, r11, r11d, r12, r12d, r12w,
    r13, r13d, r14, r8, r8d, r9, r9d, rax, rbp, rcx, rdi, rdx, rsi, word_ptr, CodeAssembler,
};
use iced_x86::IcedError;

/// Host code of the thunk (position-independent), which goes on to
/// `fallback` (the Rust fill) when it cannot finish.
pub(crate) fn thunk(fallback: u64) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut slow = a.create_label();
    let mut outside = a.create_label();
    let mut listed = a.create_label();
    let mut full = a.create_label();
    let mut retry = a.create_label();
    // Keep the arguments for the fallback; r12 and r13 are callee-saved.
    a.push(rdi)?;
    a.push(rsi)?;
    a.push(rdx)?;
    a.push(rcx)?;
    a.push(r12)?;
    a.push(r13)?;
    // r8 = class: data classes only.
    a.movzx(r8d, cl)?;
    a.cmp(r8d, crate::cpu::l1tlb::DATA_CLASSES as i32 - 1)?;
    a.ja(slow)?;
    // Within one page: (la & 0xfff) + bytes <= 0x1000.
    a.mov(eax, edx)?;
    a.and(eax, 0xfff)?;
    a.mov(r9d, ecx)?;
    a.shr(r9d, 8)?;
    a.add(eax, r9d)?;
    a.cmp(eax, 0x1000)?;
    a.ja(slow)?;
    // Canonical.
    a.mov(rax, rdx)?;
    a.shl(rax, 16)?;
    a.sar(rax, 16)?;
    a.cmp(rax, rdx)?;
    a.jne(slow)?;
    // r9 = la >> 12, r10 = its slot's page (+1), r11 = the slot's offset.
    a.mov(r9, rdx)?;
    a.shr(r9, 12)?;
    a.lea(r10, qword_ptr(r9 + 1))?;
    a.mov(r11d, r10d)?;
    a.and(r11d, SLOTS as i32 - 1)?;
    a.mov(eax, r8d)?;
    a.shl(eax, SLOTS.trailing_zeros())?;
    a.add(r11d, eax)?;
    a.shl(r11d, SLOT_BYTES.trailing_zeros())?;
    // A slot the interpreter's lookup hits (its frame lies outside
    // memory): the Rust fill says what to do.
    a.cmp(qword_ptr(rbp + r11), r10)?;
    a.je(slow)?;
    // rsi = the class's cached key, if any.
    a.mov(rsi, qword_ptr(r14 + ENV_L1_BOOK))?;
    a.lea(rax, qword_ptr(r8 + r8 * 4))?;
    a.lea(rsi, qword_ptr(rsi + rax * 8 + book::KEYS))?;
    a.cmp(qword_ptr(rsi + book::KEY_SLOT_VALID), 0)?;
    a.je(slow)?;
    a.add(rsi, book::KEY_SLOT_KEY)?;
    // rcx = 4 KiB page number of the 48-bit address; rdi = hint key.
    a.mov(rcx, rdx)?;
    a.shl(rcx, 64 - tv::VA_BITS)?;
    a.shr(rcx, 64 - tv::VA_BITS + 12)?;
    a.mov(rdi, qword_ptr(rsi + tv::KEY_CONTEXT))?;
    a.or(rdi, rcx)?;
    // rax = the hint of that page.
    a.mov(eax, ecx)?;
    a.and(eax, tv::HINT_MASK as i32)?;
    a.shl(eax, (tv::HINT_BYTES as u32).trailing_zeros())?;
    a.add(rax, qword_ptr(r14 + ENV_TLB_HINTS))?;
    a.cmp(qword_ptr(rax + tv::HINT_KEY), rdi)?;
    a.jne(slow)?;
    a.mov(rcx, qword_ptr(rsi + tv::KEY_EPTP))?;
    a.cmp(qword_ptr(rax + tv::HINT_EPTP), rcx)?;
    a.jne(slow)?;
    a.cmp(byte_ptr(rax + tv::HINT_SMALL), 0)?;
    a.je(slow)?;
    // r13 = set, r12 = way; rax = the entry.
    a.mov(r13d, dword_ptr(rax + tv::HINT_SET))?;
    a.movzx(r12d, word_ptr(rax + tv::HINT_WAY))?;
    a.mov(rax, r13)?;
    a.imul_2(rax, qword_ptr(r14 + ENV_TLB_WAYS))?;
    a.add(rax, r12)?;
    a.lea(rax, qword_ptr(rax + rax * 2))?;
    a.shl(rax, 3)?;
    const _: () = assert!(tv::ENTRY_BYTES == 24);
    a.add(rax, qword_ptr(r14 + ENV_TLB_ENTRIES))?;
    // Still the hint's entry (tag = hint key for a 4 KiB entry).
    a.cmp(qword_ptr(rax + tv::ENTRY_TAG), rdi)?;
    a.jne(slow)?;
    a.cmp(qword_ptr(rax + tv::ENTRY_EPTP), rcx)?;
    a.jne(slow)?;
    // rax = its data; allowed: every `need` bit set, no `forbid` bit.
    a.mov(rax, qword_ptr(rax + tv::ENTRY_DATA))?;
    a.mov(rdi, qword_ptr(rsi + tv::KEY_NEED))?;
    a.mov(rcx, rax)?;
    a.and(rcx, rdi)?;
    a.cmp(rcx, rdi)?;
    a.jne(slow)?;
    a.test(qword_ptr(rsi + tv::KEY_FORBID), rax)?;
    a.jne(slow)?;
    // A usable hit: from here on, the TLB's effects. The hit is counted.
    a.mov(rcx, qword_ptr(r14 + ENV_TLB_HITS))?;
    a.add(qword_ptr(rcx), 1)?;
    // The way is marked recently used (all others cleared when that would
    // mark the whole set).
    a.mov(rcx, qword_ptr(r14 + ENV_TLB_RECENTLY_USED))?;
    a.lea(rcx, qword_ptr(rcx + r13 * 8))?;
    a.xor(edi, edi)?;
    a.bts(rdi, r12)?;
    a.mov(rsi, qword_ptr(rcx))?;
    a.or(rsi, rdi)?;
    a.cmp(rsi, qword_ptr(r14 + ENV_TLB_FULL_SET))?;
    a.cmove(rsi, rdi)?;
    a.mov(qword_ptr(rcx), rsi)?;
    // rax = host-physical page.
    a.mov(rcx, tv::DATA_HPA)?;
    a.and(rax, rcx)?;
    // The first-level slot: page, host page, the translated-code view.
    a.mov(qword_ptr(rbp + r11), r10)?;
    a.mov(qword_ptr(rbp + r11 + SLOT_HPA as i32), rax)?;
    a.mov(rdi, -1i64)?;
    a.mov(rcx, qword_ptr(r14 + ENV_MEM_BASE))?;
    a.test(rcx, rcx)?;
    a.je(outside)?;
    a.cmp(rax, qword_ptr(r14 + ENV_MEM_SIZE))?;
    a.jae(outside)?;
    a.mov(rdi, r9)?;
    a.set_label(&mut outside)?;
    a.mov(qword_ptr(rbp + r11 + SLOT_JIT_PAGE as i32), rdi)?;
    a.add(rcx, rax)?;
    a.mov(rsi, rdx)?;
    a.and(rsi, -0x1000)?;
    a.sub(rcx, rsi)?;
    a.mov(qword_ptr(rbp + r11 + SLOT_HOST_DELTA as i32), rcx)?;
    // Listed once among the slots filled since the last clear.
    a.mov(ecx, r10d)?;
    a.and(ecx, SLOTS as i32 - 1)?;
    a.mov(rsi, qword_ptr(r14 + ENV_L1_BOOK))?;
    a.mov(r12, qword_ptr(rsi + r8 * 8 + book::LISTED))?;
    a.bt(r12, rcx)?;
    a.jb(listed)?;
    a.bts(r12, rcx)?;
    a.mov(qword_ptr(rsi + r8 * 8 + book::LISTED), r12)?;
    a.mov(r13, qword_ptr(rsi + book::FILLED_LEN))?;
    a.cmp(r13, book::FILLED_CAPACITY as i32)?;
    a.jae(listed)?;
    a.mov(r12d, r8d)?;
    a.shl(r12d, SLOTS.trailing_zeros())?;
    a.add(r12d, ecx)?;
    a.mov(word_ptr(rsi + r13 * 2 + book::FILLED), r12w)?;
    a.add(r13, 1)?;
    a.mov(qword_ptr(rsi + book::FILLED_LEN), r13)?;
    a.set_label(&mut listed)?;
    // Translated code may use the slot only inside memory, and stores not
    // into a frame holding code.
    a.cmp(rdi, -1)?;
    a.je(full)?;
    a.cmp(r8d, 2)?;
    a.jb(retry)?;
    a.shr(rax, 12)?;
    a.add(rax, qword_ptr(r14 + ENV_CODE_FRAMES))?;
    a.cmp(byte_ptr(rax), 0)?;
    a.jne(full)?;
    a.set_label(&mut retry)?;
    a.mov(eax, fill::RETRY as u32)?;
    pop_arguments(&mut a)?;
    a.ret()?;
    a.set_label(&mut full)?;
    a.mov(eax, fill::FULL as u32)?;
    pop_arguments(&mut a)?;
    a.ret()?;
    // Nothing done: the Rust fill, with the arguments as they came.
    a.set_label(&mut slow)?;
    pop_arguments(&mut a)?;
    a.mov(rax, fallback)?;
    a.jmp(rax)?;
    a.assemble(0)
}

fn pop_arguments(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.pop(r13)?;
    a.pop(r12)?;
    a.pop(rcx)?;
    a.pop(rdx)?;
    a.pop(rsi)?;
    a.pop(rdi)
}
