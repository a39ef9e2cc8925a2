//! Decoded-instruction cache.
//!
//! Decoding is the most expensive part of interpreting x86, so each CPU
//! keeps decoded blocks keyed by the host-physical address of their first
//! byte. A block never crosses a page, so one translation of RIP validates
//! the whole block. A block also remembers the linear address it was
//! decoded at (RIP-relative operands and branch targets depend on it) and
//! the code-write generation of its frame: any store into a frame that
//! holds cached code bumps the frame's generation in [`PhysMemory`], which
//! makes the blocks of that frame stale on every CPU (self-modifying code,
//! and the hypervisor loading new code, both work).
//!
//! The same bytes mean different instructions in 64-bit, 32-bit and
//! 16-bit code, so a block also records the code size (`bits`) it was
//! decoded for, and a lookup matches it: one byte compare on the hot path.

use super::fast::Op;
use crate::addr::Hpa;
use crate::memory::PhysMemory;
use iced_x86::{Code, Decoder, DecoderOptions, Instruction, Mnemonic};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;

/// Longest block, in instructions.
const MAX_BLOCK_INSNS: usize = 64;
/// Blocks kept before the cache is emptied (a crude but deterministic bound).
const MAX_BLOCKS: usize = 1 << 16;
/// Direct-mapped front cache in front of the hash map.
const FRONT_SIZE: usize = 4096;
/// Direct-mapped cache of page-crossing instructions.
const CROSSING_SLOTS: usize = 64;
/// The longest x86 instruction, in bytes.
pub const MAX_INSN_LEN: usize = 15;

/// A decoded straight-line run of instructions.
#[derive(Debug)]
pub struct Block {
    /// Linear address of the first instruction.
    pub rip: u64,
    /// Host-physical address of the first byte.
    pub hpa: u64,
    /// Code-write generation of the frame when decoded.
    pub generation: u32,
    /// Code size decoded for: 64, 32 or 16.
    pub bits: u8,
    /// The instructions, in order, with their fast forms.
    pub insns: Vec<Op>,
    /// Full runs of the block by the translating engine so far (it is
    /// translated on its `Cpu::set_jit_threshold`-th), or `u32::MAX` once
    /// its translation was asked of the translator thread
    /// (`jit::background`).
    pub(crate) runs: std::cell::Cell<u32>,
    /// The block's host code, once translated (`None` inside: not
    /// translatable). Valid exactly as long as the block.
    pub(crate) jit: std::cell::OnceCell<Option<crate::jit::native::Translation>>,
}

impl Block {
    /// A one-instruction block that is not cached (page-crossing).
    pub fn uncached(op: Op, bits: u32) -> Block {
        Block {
            rip: op.insn.ip(),
            hpa: u64::MAX,
            generation: 0,
            bits: bits as u8,
            insns: vec![op],
            runs: Default::default(),
            jit: Default::default(),
        }
    }
}

/// Multiplicative hasher for host-physical addresses.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A decoded instruction that crosses a page boundary.
///
/// Such an instruction is not in the block map: its frames are not marked
/// as code (marking them would make stores to them end blocks, changing
/// timing), so it is validated instead by the fifteen bytes it was decoded
/// from, on both pages, and the frames they came from.
struct CrossingEntry {
    rip: u64,
    hpa: u64,
    next_hpa: u64,
    bytes: [u8; MAX_INSN_LEN],
    block: Rc<Block>,
    /// The same bytes as memory holds them, when the instruction starts in
    /// the last 15 bytes of its page: the last 16 bytes of the first page
    /// and the first 16 of the second, as little-endian words, each with
    /// the mask of the bytes that are the instruction's.
    words: Option<CrossingWords>,
}

/// See [`CrossingEntry::words`].
struct CrossingWords {
    tail: [u64; 2],
    tail_mask: [u64; 2],
    head: [u64; 2],
    head_mask: [u64; 2],
}

impl CrossingWords {
    /// For an instruction at `hpa` made of `bytes` (None unless it starts
    /// in the last 15 bytes of its page).
    fn new(hpa: Hpa, bytes: &[u8; MAX_INSN_LEN]) -> Option<CrossingWords> {
        let room = 4096 - (hpa.0 & 0xfff) as usize;
        if room >= MAX_INSN_LEN {
            return None;
        }
        let (mut tail, mut tail_mask) = ([0u8; 16], [0u8; 16]);
        tail[16 - room..].copy_from_slice(&bytes[..room]);
        tail_mask[16 - room..].fill(0xff);
        let (mut head, mut head_mask) = ([0u8; 16], [0u8; 16]);
        head[..MAX_INSN_LEN - room].copy_from_slice(&bytes[room..]);
        head_mask[..MAX_INSN_LEN - room].fill(0xff);
        let words = |b: [u8; 16]| {
            let (lo, hi) = b.split_at(8);
            [
                u64::from_le_bytes(lo.try_into().unwrap_or_default()),
                u64::from_le_bytes(hi.try_into().unwrap_or_default()),
            ]
        };
        Some(CrossingWords {
            tail: words(tail),
            tail_mask: words(tail_mask),
            head: words(head),
            head_mask: words(head_mask),
        })
    }

    /// Whether the 16 bytes at the 8-aligned `at` hold `want` under `mask`
    /// (false if they cannot be read).
    #[inline]
    fn in_memory(mem: &PhysMemory, at: u64, want: &[u64; 2], mask: &[u64; 2]) -> bool {
        let word = |k: usize| mem.read(Hpa(at + 8 * k as u64), 8);
        matches!((word(0), word(1)), (Ok(a), Ok(b))
            if (a ^ want[0]) & mask[0] == 0 && (b ^ want[1]) & mask[1] == 0)
    }

    /// Whether the first page (the frame of `hpa`) still holds the bytes.
    #[inline]
    fn first_page_matches(&self, mem: &PhysMemory, hpa: Hpa) -> bool {
        Self::in_memory(mem, (hpa.0 & !0xfff) + 4080, &self.tail, &self.tail_mask)
    }

    /// Whether the second page (at `next_hpa`, page-aligned) still holds
    /// the rest.
    #[inline]
    fn second_page_matches(&self, mem: &PhysMemory, next_hpa: Hpa) -> bool {
        Self::in_memory(mem, next_hpa.0, &self.head, &self.head_mask)
    }
}

impl CrossingEntry {
    fn matches(&self, rip: u64, hpa: Hpa, bits: u32) -> bool {
        self.rip == rip && self.hpa == hpa.0 && self.block.bits as u32 == bits
    }
}

/// Per-CPU cache of decoded blocks.
pub struct CodeCache {
    map: HashMap<u64, Rc<Block>, BuildHasherDefault<AddrHasher>>,
    front: Vec<Option<Rc<Block>>>,
    crossing: Vec<Option<CrossingEntry>>,
}

impl Default for CodeCache {
    fn default() -> Self {
        Self::new()
    }
}

impl CodeCache {
    /// An empty cache.
    pub fn new() -> Self {
        CodeCache {
            map: HashMap::default(),
            front: vec![None; FRONT_SIZE],
            crossing: (0..CROSSING_SLOTS).map(|_| None).collect(),
        }
    }

    #[inline]
    fn crossing_slot(rip: u64) -> usize {
        (rip as usize ^ (rip >> 12) as usize) & (CROSSING_SLOTS - 1)
    }

    /// Whether the page-crossing instruction cached for `rip` was decoded
    /// from exactly these first-page bytes at `hpa` (the bytes up to the
    /// page end). If so, its decoding depends only on the rest of its
    /// bytes, checked by [`Self::lookup_crossing`].
    pub fn crossing_prefix_matches(&self, rip: u64, hpa: Hpa, bits: u32, first: &[u8]) -> bool {
        match &self.crossing[Self::crossing_slot(rip)] {
            Some(e) => e.matches(rip, hpa, bits) && e.bytes[..first.len()] == *first,
            None => false,
        }
    }

    /// [`Self::crossing_prefix_matches`] read from memory (`hpa` in the
    /// last 15 bytes of its page), a word at a time: true only if it would
    /// be true with the bytes up to the page end (which can be read).
    #[inline]
    pub fn crossing_prefix_in_memory(
        &self,
        mem: &PhysMemory,
        rip: u64,
        hpa: Hpa,
        bits: u32,
    ) -> bool {
        match &self.crossing[Self::crossing_slot(rip)] {
            Some(e) => {
                e.matches(rip, hpa, bits)
                    && e.words
                        .as_ref()
                        .is_some_and(|w| w.first_page_matches(mem, hpa))
            }
            None => false,
        }
    }

    /// [`Self::lookup_crossing`] with the bytes read from memory (the
    /// instruction at `hpa`, in the last 15 bytes of its page, continued
    /// at the page-aligned `next_hpa`), a word at a time: `Some` only when
    /// that would give the block (and the bytes can be read).
    #[inline]
    pub fn lookup_crossing_in_memory(
        &self,
        mem: &PhysMemory,
        rip: u64,
        hpa: Hpa,
        next_hpa: Hpa,
        bits: u32,
    ) -> Option<Rc<Block>> {
        match &self.crossing[Self::crossing_slot(rip)] {
            Some(e) if e.matches(rip, hpa, bits) && e.next_hpa == next_hpa.0 => {
                let w = e.words.as_ref()?;
                (next_hpa.0 & 0xfff == 0
                    && w.first_page_matches(mem, hpa)
                    && w.second_page_matches(mem, next_hpa))
                .then(|| e.block.clone())
            }
            _ => None,
        }
    }

    /// The page-crossing instruction at `rip`, if it was decoded from the
    /// same frames and the same bytes.
    pub fn lookup_crossing(
        &self,
        rip: u64,
        hpa: Hpa,
        next_hpa: Hpa,
        bits: u32,
        bytes: &[u8; MAX_INSN_LEN],
    ) -> Option<Rc<Block>> {
        match &self.crossing[Self::crossing_slot(rip)] {
            Some(e)
                if e.matches(rip, hpa, bits) && e.next_hpa == next_hpa.0 && e.bytes == *bytes =>
            {
                Some(e.block.clone())
            }
            _ => None,
        }
    }

    /// Caches a page-crossing instruction decoded from `bytes`.
    pub fn insert_crossing(
        &mut self,
        rip: u64,
        hpa: Hpa,
        next_hpa: Hpa,
        bytes: &[u8; MAX_INSN_LEN],
        op: Op,
        bits: u32,
    ) -> Rc<Block> {
        let block = Rc::new(Block::uncached(op, bits));
        self.crossing[Self::crossing_slot(rip)] = Some(CrossingEntry {
            rip,
            hpa: hpa.0,
            next_hpa: next_hpa.0,
            bytes: *bytes,
            block: block.clone(),
            words: CrossingWords::new(hpa, bytes),
        });
        block
    }

    #[inline]
    fn slot(hpa: u64) -> usize {
        ((hpa ^ (hpa >> 12)) as usize) & (FRONT_SIZE - 1)
    }

    /// The valid block starting at `hpa`, decoded at `rip` for `bits`-bit
    /// code, if cached.
    ///
    /// The front cache's hit is inline (it is the run loop's, once per
    /// block); the map behind it is not.
    #[inline(always)]
    pub fn lookup(&mut self, mem: &PhysMemory, hpa: Hpa, rip: u64, bits: u32) -> Option<Rc<Block>> {
        let gen = mem.code_generation(hpa);
        let slot = Self::slot(hpa.0);
        if let Some(b) = &self.front[slot] {
            if b.hpa == hpa.0 && b.rip == rip && b.generation == gen && b.bits as u32 == bits {
                return Some(b.clone());
            }
        }
        self.lookup_map(hpa, rip, bits, gen, slot)
    }

    /// [`Self::lookup`] behind a front-cache miss.
    #[inline(never)]
    fn lookup_map(
        &mut self,
        hpa: Hpa,
        rip: u64,
        bits: u32,
        gen: u32,
        slot: usize,
    ) -> Option<Rc<Block>> {
        let b = self.map.get(&hpa.0)?;
        if b.rip == rip && b.generation == gen && b.bits as u32 == bits {
            let b = b.clone();
            self.front[slot] = Some(b.clone());
            Some(b)
        } else {
            None
        }
    }

    /// Caches a freshly decoded block and marks its frame as holding code.
    pub fn insert(
        &mut self,
        mem: &PhysMemory,
        hpa: Hpa,
        rip: u64,
        bits: u32,
        insns: Vec<Op>,
    ) -> Rc<Block> {
        if self.map.len() >= MAX_BLOCKS {
            self.map.clear();
            self.front.iter_mut().for_each(|s| *s = None);
        }
        let generation = mem.mark_code(hpa);
        let b = Rc::new(Block {
            rip,
            hpa: hpa.0,
            generation,
            bits: bits as u8,
            insns,
            runs: Default::default(),
            jit: Default::default(),
        });
        self.map.insert(hpa.0, b.clone());
        self.front[Self::slot(hpa.0)] = Some(b.clone());
        b
    }

    /// Drops every block.
    pub fn clear(&mut self) {
        self.map.clear();
        self.front.iter_mut().for_each(|s| *s = None);
        self.crossing.iter_mut().for_each(|s| *s = None);
    }
}

/// Decodes a block of `bits`-bit code (64, 32 or 16) from `bytes` (which
/// run to the end of the page) at `rip` (the offset in CS). `None` when
/// the first instruction does not fit in `bytes` (it crosses the page end).
///
/// The block's vector is allocated once, at its exact length: it lives as
/// long as the block, and a vector grown by doubling would reallocate and
/// copy on the way and leave up to half its (fresh, host-zeroed) memory
/// unused (massif, a Linux boot to 300 ms: 24 MB of a 55 MB heap were such
/// grown vectors).
pub fn decode_block(bytes: &[u8], rip: u64, bits: u32) -> Option<Vec<Op>> {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<Op>> =
            std::cell::RefCell::new(Vec::with_capacity(MAX_BLOCK_INSNS));
    }
    // (Never reentered: decoding calls nothing that decodes.)
    SCRATCH.with_borrow_mut(|insns| {
        insns.clear();
        decode_block_into(bytes, rip, bits, insns);
        (!insns.is_empty()).then(|| insns.to_vec())
    })
}

/// [`decode_block`]'s work: the block's instructions appended to `insns`.
fn decode_block_into(bytes: &[u8], rip: u64, bits: u32, insns: &mut Vec<Op>) {
    let mut decoder = Decoder::with_ip(bits, bytes, rip, DecoderOptions::NONE);
    while decoder.can_decode() && insns.len() < MAX_BLOCK_INSNS {
        let pos = decoder.position();
        let insn = decoder.decode();
        if insn.code() == Code::INVALID {
            if too_long(&bytes[pos..], bits) {
                insns.push(Op::too_long(insn));
                break;
            }
            if decoder.last_error() == iced_x86::DecoderError::NoMoreBytes {
                // Runs off the page: end the block before it; if it is the
                // first instruction, the caller fetches across the boundary.
                break;
            }
        }
        let end = super::ends_block(&insn) || insn.code() == Code::INVALID;
        insns.push(Op::for_code(insn, bits));
        if end {
            break;
        }
    }
}

/// Whether the bytes start with an instruction longer than 15 bytes
/// (possible only with redundant prefixes), which is #GP(0), not #UD.
pub fn too_long(bytes: &[u8], bits: u32) -> bool {
    // REX exists only in 64-bit code (elsewhere 0x40-0x4f are INC/DEC).
    let rex_exists = bits == 64;
    let is_rex = |b: u8| rex_exists && b & 0xf0 == 0x40;
    let is_prefix = |b: u8| {
        matches!(
            b,
            0x26 | 0x2e | 0x36 | 0x3e | 0x64 | 0x65 | 0x66 | 0x67 | 0xf0 | 0xf2 | 0xf3
        ) || is_rex(b)
    };
    let prefixes = bytes.iter().take_while(|&&b| is_prefix(b)).count();
    if prefixes >= 15 {
        return true;
    }
    if prefixes < 2 {
        return false;
    }
    // Shorten the prefix run without changing the instruction's meaning or
    // length: segment overrides go (they never change the length), other
    // legacy prefixes keep only their last occurrence, and a REX prefix
    // counts only right before the opcode. Decode that to learn the length.
    let mut short: Vec<u8> = Vec::with_capacity(32);
    for (k, &b) in bytes[..prefixes].iter().enumerate() {
        let segment = matches!(b, 0x26 | 0x2e | 0x36 | 0x3e | 0x64 | 0x65);
        let rex = is_rex(b);
        let last_rex = rex && k + 1 == prefixes;
        if (!segment && !rex && !bytes[k + 1..prefixes].contains(&b)) || last_rex {
            short.push(b);
        }
    }
    let removed = prefixes - short.len();
    short.extend_from_slice(&bytes[prefixes..bytes.len().min(prefixes + 15)]);
    let mut d = Decoder::new(bits, &short, DecoderOptions::NONE);
    let insn = d.decode();
    insn.code() != Code::INVALID && insn.len() + removed > 15
}

/// Decodes one instruction from up to 15 bytes (an instruction that
/// crosses into the next page).
pub fn decode_one(bytes: &[u8], rip: u64, bits: u32) -> Op {
    let mut decoder = Decoder::with_ip(bits, bytes, rip, DecoderOptions::NONE);
    let insn = decoder.decode();
    if insn.code() == Code::INVALID && too_long(bytes, bits) {
        Op::too_long(insn)
    } else {
        Op::for_code(insn, bits)
    }
}

/// Serializing or state-changing instructions end a block so that their
/// effects (new translation, privilege, interrupt flag, descriptor tables)
/// apply to the next instruction fetch and pending events are checked.
pub fn is_serializing(insn: &Instruction) -> bool {
    match insn.mnemonic() {
        Mnemonic::Cpuid
        | Mnemonic::Wrmsr
        | Mnemonic::Invlpg
        | Mnemonic::Lgdt
        | Mnemonic::Lidt
        | Mnemonic::Ltr
        | Mnemonic::Sti
        | Mnemonic::Cli
        | Mnemonic::Popfq
        | Mnemonic::Popfd
        | Mnemonic::Popf
        | Mnemonic::Hlt
        | Mnemonic::Vmcall
        | Mnemonic::Wbinvd => true,
        // MOV to a control, segment or debug register (a DR7 write may
        // arm a breakpoint on the very next instruction).
        Mnemonic::Mov => {
            insn.op0_kind() == iced_x86::OpKind::Register
                && (insn.op0_register().is_cr()
                    || insn.op0_register().is_segment_register()
                    || insn.op0_register().is_dr())
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The word-at-a-time check of a cached page-crossing instruction
    /// agrees with the byte-by-byte one, for every split of its 15 bytes
    /// between the pages: every byte of it counts, the bytes around it in
    /// the words read do not, and neither do other frames or a bad read.
    #[test]
    fn crossing_words_agree_with_bytes() {
        let mem = PhysMemory::new(0x4000).unwrap();
        let (page, next) = (0x1000u64, 0x3000u64);
        for room in 1..MAX_INSN_LEN {
            let mut cache = CodeCache::new();
            let hpa = Hpa(page + 4096 - room as u64);
            let rip = 0x7000_0000_u64 - room as u64;
            let bytes: [u8; MAX_INSN_LEN] = std::array::from_fn(|i| 0x90 ^ (i as u8 * 17));
            mem.write_bytes(hpa, &bytes[..room]).unwrap();
            mem.write_bytes(Hpa(next), &bytes[room..]).unwrap();
            let op = decode_one(&bytes, rip, 64);
            cache.insert_crossing(rip, hpa, Hpa(next), &bytes, op, 64);
            let agree = |cache: &CodeCache, want: bool| {
                let mut read = [0u8; MAX_INSN_LEN];
                mem.read_bytes(hpa, &mut read[..room]).unwrap();
                mem.read_bytes(Hpa(next), &mut read[room..]).unwrap();
                let by_bytes = cache.lookup_crossing(rip, hpa, Hpa(next), 64, &read);
                let by_words = cache.lookup_crossing_in_memory(&mem, rip, hpa, Hpa(next), 64);
                assert_eq!(by_bytes.is_some(), want, "room {room}");
                assert_eq!(by_words.is_some(), want, "room {room}");
                assert_eq!(
                    cache.crossing_prefix_in_memory(&mem, rip, hpa, 64),
                    cache.crossing_prefix_matches(rip, hpa, 64, &read[..room]),
                    "room {room}"
                );
            };
            agree(&cache, true);
            // Bytes next to the instruction, in the words read: no change.
            mem.write_bytes(Hpa(page + 4080), &[0xcc; 2]).unwrap();
            mem.write_bytes(Hpa(hpa.0 - 1), &[0xcc]).unwrap();
            mem.write_bytes(Hpa(next + (MAX_INSN_LEN - room) as u64), &[0xcc])
                .unwrap();
            agree(&cache, true);
            // Each byte of the instruction, on either page: a miss.
            for (i, &b) in bytes.iter().enumerate() {
                let at = if i < room {
                    hpa.0 + i as u64
                } else {
                    next + (i - room) as u64
                };
                mem.write_bytes(Hpa(at), &[!b]).unwrap();
                agree(&cache, false);
                mem.write_bytes(Hpa(at), &[b]).unwrap();
                agree(&cache, true);
            }
            // Another frame for the second page, another RIP or code size,
            // a frame outside memory: a miss.
            assert!(cache
                .lookup_crossing_in_memory(&mem, rip, hpa, Hpa(0x2000), 64)
                .is_none());
            assert!(cache
                .lookup_crossing_in_memory(&mem, rip + 1, hpa, Hpa(next), 64)
                .is_none());
            assert!(cache
                .lookup_crossing_in_memory(&mem, rip, hpa, Hpa(next), 32)
                .is_none());
            let far = Hpa(0x10_0000 - room as u64);
            let mut far_cache = CodeCache::new();
            let op = decode_one(&bytes, rip, 64);
            far_cache.insert_crossing(rip, far, Hpa(next), &bytes, op, 64);
            assert!(far_cache
                .lookup_crossing_in_memory(&mem, rip, far, Hpa(next), 64)
                .is_none());
            assert!(!far_cache.crossing_prefix_in_memory(&mem, rip, far, 64));
        }
    }
}
