//! The first-level TLB fill of translated code, in host code.
//!
//! An inline access whose first-level probe misses calls the fill
//! (`Helpers::fill`). Most misses are TLB hits: the first-level TLB is
//! small and direct-mapped, and every flush or lookup-key context change
//! empties it, so most of its misses hit the TLB. This thunk takes
//! exactly those: a TLB entry found through the page's hint
//! ([`Tlb::lookup_keyed`](crate::mmu::tlb::Tlb::lookup_keyed)'s first
//! step when it hits: a hint to a 4 KiB entry, of the key's PCID or
//! global, checked against the entry, one to a 2 MiB or 1 GiB entry good
//! while the TLB's epoch has not moved), allowed under the lookup key
//! the first-level TLB caches for the mode, counted as a hit and marked recently used as the TLB does, then
//! the first-level slot filled as [`L1Tlb::fill`](crate::cpu::l1tlb)
//! fills it (a translated-code view when the frame lies inside memory,
//! but not for a write slot whose frame holds decoded code), with the
//! 4 KiB piece of a larger entry's page (and the
//! entry's U flag noted for a supervisor data class while RFLAGS.AC is
//! set under SMAP). Most of a Linux guest's first-level misses are hits
//! on the kernel's global pages. Anything else (a page-crossing or
//! non-canonical address, no
//! cached key, no hint, a stale hint, an entry that does not
//! allow the access, a slot the interpreter's lookup would hit) goes,
//! before any effect, to the Rust fill (`native::fill_out`), which does
//! the same and everything else. So the thunk is a faster way to the same
//! state, never a different one; the `jit` tests and difftest compare
//! the engines.
//!
//! A chaining exit whose next block's fetch misses the first-level iTLB
//! calls it too, with the fetch class (`Emitter::fetch_miss_exit`): the
//! same TLB hit and fill, and where the thunk cannot finish it answers
//! `FULL` (the exit then asks `Cpu::jit_chain_fetch`, which makes the
//! fetch the run loop's way) instead of going on to the Rust fill, which
//! takes data accesses only.
//!
//! Calling convention: that of `fill_out` (sysv64: rdi = cpu, rsi =
//! memory, rdx = linear address, ecx = class | bytes << 8; returns a
//! [`super::fill`] code in rax), called from generated code, so r14 holds
//! the [`native::Env`](super::native::Env), rbp the first-level slots, and
//! rbx the cpu pointer and the `Env` the memory pointer (the shared slow
//! path passes those as rdi and rsi). The thunk clobbers only caller-saved registers
//! and keeps rdx and rcx until it has decided: on the way to the Rust fill
//! it reloads rdi and rsi from rbx and the `Env`, so nothing is pushed or
//! popped.
//!
//! Host instructions per call on `mips --quick --engine jit` (callgrind):
//! 104 on average (a 4 KiB hit whose slot is already listed is 97),
//! against 123 for the version that pushed and popped its arguments.

use super::fill;
use super::{ENV_CODE_FRAMES, ENV_L1_BOOK, ENV_MEMORY, ENV_MEM_BASE, ENV_MEM_SIZE};
use super::{ENV_TLB_ENTRIES, ENV_TLB_FULL_SET, ENV_TLB_HINTS, ENV_TLB_HITS};
use super::{ENV_TLB_EPOCH, ENV_TLB_RECENTLY_USED, ENV_TLB_WAYS};
use crate::cpu::l1tlb::{book, SLOTS, SLOT_BYTES, SLOT_HOST_DELTA, SLOT_HPA, SLOT_JIT_PAGE};
use crate::mmu::tlb::jit_view as tv;
use iced_x86::code_asm::{
    byte_ptr, cl, dword_ptr, eax, ecx, edi, edx, esi, qword_ptr, r10, r10d, r11, r11d, r14, r8,
    r8d, r9, r9d, r9w, rax, rbp, rbx, rcx, rdi, rdx, rsi, word_ptr, CodeAssembler,
};
use iced_x86::IcedError;

const _: () = assert!(SLOTS.is_power_of_two() && SLOT_BYTES.is_power_of_two());
const _: () = assert!((tv::HINT_BYTES as u32).is_power_of_two());
const _: () = assert!(tv::ENTRY_BYTES == 24);
const _: () = assert!(tv::DATA_GUEST_USER <= i32::MAX as u64);
// The key slot's fields are addressed from the key (`KEY_SLOT_KEY` in).
const _: () = assert!(book::KEY_SLOT_KEY == 8 && book::KEY_SLOT_VALID == 0);
const _: () = assert!(book::KEY_SLOT_BYTES == 40);

/// Host code of the thunk (position-independent), which goes on to
/// `fallback` (the Rust fill) when it cannot finish.
pub(crate) fn thunk(fallback: u64) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut slow = a.create_label();
    let mut outside = a.create_label();
    let mut viewed = a.create_label();
    let mut listed = a.create_label();
    let mut noted = a.create_label();
    let mut full = a.create_label();
    let mut retry = a.create_label();
    let mut large = a.create_label();
    let mut sized = a.create_label();
    let mut data_loaded = a.create_label();
    let mut own_pcid = a.create_label();
    let mut versioned = a.create_label();
    let slot_shift = SLOT_BYTES.trailing_zeros();
    let class_shift = SLOTS.trailing_zeros();
    // Data and fetch classes (a fetch's fill is a chaining exit's: see
    // `Emitter::fetch_miss_exit`).
    a.cmp(cl, crate::cpu::l1tlb::CLASSES as i32 - 1)?;
    a.ja(slow)?;
    // Within one page: the last byte (la + bytes - 1) on la's page.
    a.mov(eax, ecx)?;
    a.shr(eax, 8)?;
    a.lea(r8, qword_ptr(rdx + rax - 1))?;
    a.xor(r8, rdx)?;
    a.shr(r8, 12)?;
    a.jne(slow)?;
    // Canonical; rdi = the 4 KiB page number of the 48-bit address.
    a.mov(rdi, rdx)?;
    a.shl(rdi, 64 - tv::VA_BITS)?;
    a.mov(rax, rdi)?;
    a.sar(rax, 64 - tv::VA_BITS)?;
    a.cmp(rax, rdx)?;
    a.jne(slow)?;
    a.shr(rdi, 64 - tv::VA_BITS + 12)?;
    // r9 = the class's cached key slot; none: the Rust fill.
    a.movzx(r8d, cl)?;
    a.lea(r8, qword_ptr(r8 + r8 * 4))?;
    const _: () = assert!(book::KEY_SLOT_BYTES == 5 * 8);
    a.mov(r9, qword_ptr(r14 + ENV_L1_BOOK))?;
    a.lea(
        r9,
        qword_ptr(r9 + r8 * 8 + (book::KEYS + book::KEY_SLOT_KEY)),
    )?;
    a.cmp(qword_ptr(r9 - book::KEY_SLOT_KEY + book::KEY_SLOT_VALID), 0)?;
    a.je(slow)?;
    // rsi = the key's second word (EPTP and PCID); rax = the hint of
    // that page under that PCID (`tlb::hint_slot`); rdi = the hint key.
    a.mov(rsi, qword_ptr(r9 + tv::KEY_EPTP))?;
    a.mov(rax, rsi)?;
    a.shr(rax, tv::HINT_PCID_SHIFT)?;
    a.imul_3(eax, eax, tv::HINT_PCID_MIX)?;
    a.xor(eax, edi)?;
    a.and(eax, tv::HINT_MASK as i32)?;
    a.shl(eax, (tv::HINT_BYTES as u32).trailing_zeros())?;
    a.add(rax, qword_ptr(r14 + ENV_TLB_HINTS))?;
    a.or(rdi, qword_ptr(r9 + tv::KEY_CONTEXT))?;
    a.cmp(qword_ptr(rax + tv::HINT_KEY), rdi)?;
    a.jne(slow)?;
    a.cmp(qword_ptr(rax + tv::HINT_EPTP), rsi)?;
    a.jne(slow)?;
    // r8 = set, r10 = way.
    a.mov(r8d, dword_ptr(rax + tv::HINT_SET))?;
    a.movzx(r10d, word_ptr(rax + tv::HINT_WAY))?;
    a.cmp(byte_ptr(rax + tv::HINT_SMALL), 0)?;
    a.je(large)?;
    // rax = the entry.
    entry_address(&mut a)?;
    // Still the hint's entry (tag = hint key for a 4 KiB entry), of the
    // key's PCID or global (the key's second word with its PCID cleared
    // and "any PCID" set).
    a.cmp(qword_ptr(rax + tv::ENTRY_TAG), rdi)?;
    a.jne(slow)?;
    a.cmp(qword_ptr(rax + tv::ENTRY_EPTP), rsi)?;
    a.je(own_pcid)?;
    a.mov(r11, rsi)?;
    a.shl(r11, tv::PCID_BITS)?;
    a.shr(r11, tv::PCID_BITS)?;
    a.or(r11, tv::ANY_PCID)?;
    a.cmp(qword_ptr(rax + tv::ENTRY_EPTP), r11)?;
    a.jne(slow)?;
    a.set_label(&mut own_pcid)?;
    // rax = its data.
    a.mov(rax, qword_ptr(rax + tv::ENTRY_DATA))?;
    // Allowed: every `need` bit set, no `forbid` bit.
    a.set_label(&mut data_loaded)?;
    a.mov(rdi, qword_ptr(r9 + tv::KEY_NEED))?;
    a.mov(rsi, rax)?;
    a.and(rsi, rdi)?;
    a.cmp(rsi, rdi)?;
    a.jne(slow)?;
    a.test(qword_ptr(r9 + tv::KEY_FORBID), rax)?;
    a.jne(slow)?;
    // r11 = la >> 12, rdi = the slot's page (+1), r9 = class << 6, rsi =
    // the slot's offset.
    a.mov(r11, rdx)?;
    a.shr(r11, 12)?;
    a.lea(rdi, qword_ptr(r11 + 1))?;
    a.movzx(r9d, cl)?;
    a.shl(r9d, class_shift)?;
    a.mov(esi, edi)?;
    a.and(esi, SLOTS as i32 - 1)?;
    a.or(esi, r9d)?;
    a.shl(esi, slot_shift)?;
    // A slot the interpreter's lookup hits (its frame lies outside
    // memory): the Rust fill says what to do.
    a.cmp(qword_ptr(rbp + rsi), rdi)?;
    a.je(slow)?;
    // A usable hit: from here on, the TLB's effects (rcx and rdx are free
    // now). The hit is counted.
    a.mov(rcx, qword_ptr(r14 + ENV_TLB_HITS))?;
    a.add(qword_ptr(rcx), 1)?;
    // The way is marked recently used (all others cleared when that would
    // mark the whole set).
    a.mov(rcx, qword_ptr(r14 + ENV_TLB_RECENTLY_USED))?;
    a.xor(edx, edx)?;
    a.bts(rdx, r10)?;
    a.mov(r10, qword_ptr(rcx + r8 * 8))?;
    a.or(r10, rdx)?;
    a.cmp(r10, qword_ptr(r14 + ENV_TLB_FULL_SET))?;
    a.cmove(r10, rdx)?;
    a.mov(qword_ptr(rcx + r8 * 8), r10)?;
    // r10 = the entry's guest U flag (the way is no longer needed); rax =
    // host-physical page.
    a.mov(r10d, eax)?;
    a.and(r10d, tv::DATA_GUEST_USER as i32)?;
    a.mov(rcx, tv::DATA_HPA)?;
    a.and(rax, rcx)?;
    // The first-level slot: page, host page, the translated-code view
    // (rdx: the page inside memory, else -1, set out of line).
    a.mov(qword_ptr(rbp + rsi), rdi)?;
    a.mov(qword_ptr(rbp + rsi + SLOT_HPA as i32), rax)?;
    a.mov(rdx, r11)?;
    a.mov(rcx, qword_ptr(r14 + ENV_MEM_BASE))?;
    a.test(rcx, rcx)?;
    a.je(outside)?;
    a.cmp(rax, qword_ptr(r14 + ENV_MEM_SIZE))?;
    a.jae(outside)?;
    // A write slot (r9 = class << 6: writes are 2 and 3) whose frame
    // holds decoded code (asked only then) gets no view either, as
    // `L1Tlb::fill` decides it: translated stores take the slow path
    // there, which invalidates the code.
    a.cmp(r9d, 2 << class_shift)?;
    a.jb(viewed)?;
    a.cmp(r9d, (crate::cpu::l1tlb::DATA_CLASSES as i32) << class_shift)?;
    a.jae(viewed)?;
    a.mov(r8, rax)?;
    a.shr(r8, 12)?;
    a.add(r8, qword_ptr(r14 + ENV_CODE_FRAMES))?;
    a.cmp(byte_ptr(r8), 0)?;
    a.jne(outside)?;
    a.set_label(&mut viewed)?;
    a.mov(qword_ptr(rbp + rsi + SLOT_JIT_PAGE as i32), rdx)?;
    a.add(rcx, rax)?;
    a.shl(r11, 12)?;
    a.sub(rcx, r11)?;
    a.mov(qword_ptr(rbp + rsi + SLOT_HOST_DELTA as i32), rcx)?;
    // Listed once among the slots filled since the last clear: bit (slot
    // index) of the class's `listed`, then class << 6 | index in `filled`.
    a.and(edi, SLOTS as i32 - 1)?;
    a.mov(rsi, qword_ptr(r14 + ENV_L1_BOOK))?;
    a.mov(r8d, r9d)?;
    a.shr(r8d, class_shift)?;
    // While AC is set under SMAP, in a supervisor data class (an even
    // one: `l1tlb::is_supervisor_data`), the slot's bit of the class's
    // `user_pages` is the entry's U flag.
    a.cmp(qword_ptr(rsi + book::SMAP_AC), 0)?;
    a.je(noted)?;
    a.test(r8d, 1)?;
    a.jne(noted)?;
    a.cmp(r8d, crate::cpu::l1tlb::DATA_CLASSES as i32)?;
    a.jae(noted)?;
    a.mov(r11, qword_ptr(rsi + r8 * 8 + book::USER_PAGES))?;
    a.btr(r11, rdi)?;
    a.mov(rcx, r11)?;
    a.bts(rcx, rdi)?;
    a.test(r10d, r10d)?;
    a.cmovne(r11, rcx)?;
    a.mov(qword_ptr(rsi + r8 * 8 + book::USER_PAGES), r11)?;
    a.set_label(&mut noted)?;
    a.mov(r11, qword_ptr(rsi + r8 * 8 + book::LISTED))?;
    a.bts(r11, rdi)?;
    a.jb(listed)?;
    a.mov(qword_ptr(rsi + r8 * 8 + book::LISTED), r11)?;
    a.mov(r10, qword_ptr(rsi + book::FILLED_LEN))?;
    a.cmp(r10, book::FILLED_CAPACITY as i32)?;
    a.jae(listed)?;
    a.or(r9d, edi)?;
    a.mov(word_ptr(rsi + r10 * 2 + book::FILLED), r9w)?;
    a.add(r10, 1)?;
    a.mov(qword_ptr(rsi + book::FILLED_LEN), r10)?;
    a.set_label(&mut listed)?;
    // A fetch slot gets a new version (`Book::fetch_versions`; r8 = class,
    // edi = index, rsi = the book): class - 4, then << 6 | index.
    a.cmp(r8d, crate::cpu::l1tlb::DATA_CLASSES as i32)?;
    a.jb(versioned)?;
    a.mov(r10, qword_ptr(rsi + book::LAST_VERSION))?;
    a.add(r10, 1)?;
    a.mov(qword_ptr(rsi + book::LAST_VERSION), r10)?;
    a.lea(r11d, dword_ptr(r8 - crate::cpu::l1tlb::DATA_CLASSES as i32))?;
    a.shl(r11d, class_shift)?;
    a.or(r11d, edi)?;
    a.mov(qword_ptr(rsi + r11 * 8 + book::FETCH_VERSIONS), r10)?;
    a.set_label(&mut versioned)?;
    // Translated code may use the slot only where it has a view: inside
    // memory, and for stores not into a frame holding code.
    a.cmp(rdx, -1)?;
    a.je(full)?;
    a.set_label(&mut retry)?;
    a.mov(eax, fill::RETRY as u32)?;
    a.ret()?;
    a.set_label(&mut full)?;
    a.mov(eax, fill::FULL as u32)?;
    a.ret()?;
    // A frame outside memory (or a write slot of code): no translated-code
    // view.
    a.set_label(&mut outside)?;
    a.mov(rdx, -1i64)?;
    a.jmp(viewed)?;
    // A hint to a larger entry: good while nothing changed in the TLB
    // (its epoch), as
    // `Tlb::lookup_keyed` takes it. rax = the entry; its data with the
    // offset of la's 4 KiB page in the entry's page ORed into the
    // host-physical page bits (aligned to the entry's size, so this is
    // the page's host-physical address; the flag bits are untouched).
    a.set_label(&mut large)?;
    a.mov(r11, qword_ptr(r14 + ENV_TLB_EPOCH))?;
    a.mov(r11, qword_ptr(r11))?;
    a.cmp(qword_ptr(rax + tv::HINT_EPOCH), r11)?;
    a.jne(slow)?;
    entry_address(&mut a)?;
    a.mov(rsi, qword_ptr(rax + tv::ENTRY_TAG))?;
    a.shr(rsi, tv::TAG_SIZE_SHIFT)?;
    a.and(esi, 3)?;
    // rdi = the offset mask of the entry's size (4 KiB: none).
    a.xor(edi, edi)?;
    a.cmp(esi, 1)?;
    a.jb(sized)?;
    a.mov(edi, 0x1f_f000)?;
    a.je(sized)?;
    a.mov(edi, 0x3fff_f000)?;
    a.cmp(esi, 2)?;
    a.jne(slow)?;
    a.set_label(&mut sized)?;
    a.and(rdi, rdx)?;
    a.mov(rax, qword_ptr(rax + tv::ENTRY_DATA))?;
    a.or(rax, rdi)?;
    a.jmp(data_loaded)?;
    // Nothing done: the Rust fill, with the arguments as they came (rdx
    // and rcx untouched; rdi and rsi as the generated code passes them);
    // for a fetch, `FULL` (its caller goes to `Cpu::jit_chain_fetch`).
    a.set_label(&mut slow)?;
    a.cmp(cl, crate::cpu::l1tlb::DATA_CLASSES as i32 - 1)?;
    a.ja(full)?;
    a.mov(rdi, rbx)?;
    a.mov(rsi, qword_ptr(r14 + ENV_MEMORY))?;
    a.mov(rax, fallback)?;
    a.jmp(rax)?;
    a.assemble(0)
}

/// rax = the address of the TLB entry at set r8, way r10 (clobbers r11).
fn entry_address(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.mov(rax, r8)?;
    a.imul_2(rax, qword_ptr(r14 + ENV_TLB_WAYS))?;
    a.add(rax, r10)?;
    a.lea(rax, qword_ptr(rax + rax * 2))?;
    a.mov(r11, qword_ptr(r14 + ENV_TLB_ENTRIES))?;
    a.lea(rax, qword_ptr(r11 + rax * 8))?;
    Ok(())
}
