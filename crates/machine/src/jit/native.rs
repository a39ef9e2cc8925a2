//! Executable memory and the calls into and out of generated code: every
//! `unsafe` of the translator is here.
//!
//! Code lives in chunks, each mapped twice from one memory file: a
//! read-write view the translator copies code into and a read-execute view
//! the code runs from, so no view is ever writable and executable, and
//! installing a block needs no system call. (Where the host has no
//! `memfd_create`, a chunk is one mapping switched between read-write and
//! read-execute with `mprotect` around each copy: in a Linux boot that
//! took about a tenth of the host time.) Code is only ever appended to a
//! chunk, never rewritten, so the execute view never holds stale bytes. A
//! translation keeps its chunk alive; a chunk is unmapped when the last
//! translation in it is dropped (its block went stale or the code cache
//! was emptied) and the arena has moved on to a newer chunk.

use crate::cpu::code_cache::Block;
use crate::cpu::Cpu;
use crate::memory::PhysMemory;
use std::rc::Rc;

/// Bytes per chunk of code memory.
const CHUNK_BYTES: usize = 1 << 20;

/// One chunk of code memory.
struct Chunk {
    /// Where the code runs from (read-execute).
    base: *mut u8,
    /// Where the translator writes it: a second, read-write view of the
    /// same memory, or `None` when `base` is the only mapping and is
    /// switched with `mprotect`.
    write_view: Option<*mut u8>,
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: `base` and `write_view` are mappings of CHUNK_BYTES made
        // by `Chunk::map`; no translation in the chunk is alive any more
        // (they hold the Rc), so nothing can run or read it.
        unsafe {
            libc::munmap(self.base.cast(), CHUNK_BYTES);
            if let Some(w) = self.write_view {
                libc::munmap(w.cast(), CHUNK_BYTES);
            }
        }
    }
}

/// A shared mapping of `fd` with `prot`, or `None`.
fn map_view(fd: libc::c_int, prot: libc::c_int) -> Option<*mut u8> {
    // SAFETY: a shared mapping of the whole of a file this process just
    // made, with no address hint: it touches no existing memory; the
    // result is checked against MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            CHUNK_BYTES,
            prot,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p.cast())
}

impl Chunk {
    fn map() -> Option<Chunk> {
        Self::map_dual().or_else(Self::map_single)
    }

    /// Two views of one memory file.
    fn map_dual() -> Option<Chunk> {
        // SAFETY: the name is a NUL-terminated literal; the result is
        // checked.
        let fd = unsafe { libc::memfd_create(c"faultline-jit".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` is the file just made; sizing it touches nothing
        // else.
        let sized = unsafe { libc::ftruncate(fd, CHUNK_BYTES as libc::off_t) } == 0;
        let write = sized
            .then(|| map_view(fd, libc::PROT_READ | libc::PROT_WRITE))
            .flatten();
        let exec = write
            .and_then(|_| map_view(fd, libc::PROT_READ | libc::PROT_EXEC))
            .or_else(|| {
                if let Some(w) = write {
                    // SAFETY: `w` is the view mapped just above; nothing
                    // uses it.
                    unsafe { libc::munmap(w.cast(), CHUNK_BYTES) };
                }
                None
            });
        // SAFETY: the mappings keep the memory; the descriptor is no
        // longer needed.
        unsafe { libc::close(fd) };
        Some(Chunk {
            base: exec?,
            write_view: write,
        })
    }

    /// One private mapping, made read-execute after each copy.
    fn map_single() -> Option<Chunk> {
        // SAFETY: an anonymous private mapping with no address hint touches
        // no existing memory; the result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                CHUNK_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        (p != libc::MAP_FAILED).then(|| Chunk {
            base: p.cast(),
            write_view: None,
        })
    }

    fn protect(&self, prot: libc::c_int) -> bool {
        if self.write_view.is_some() {
            return true;
        }
        // SAFETY: the range is exactly this chunk's own mapping.
        unsafe { libc::mprotect(self.base.cast(), CHUNK_BYTES, prot) == 0 }
    }

    /// Where to write the code that runs at `base + offset`.
    fn writable_at(&self, offset: usize) -> *mut u8 {
        // SAFETY (of the callers' use): `offset` is inside the chunk.
        self.write_view.unwrap_or(self.base).wrapping_add(offset)
    }
}

/// Per-CPU code memory.
#[derive(Default)]
pub(crate) struct Arena {
    chunk: Option<Rc<Chunk>>,
    used: usize,
    /// The first-level TLB fill thunk (`jit::tlb_fill`), once installed;
    /// kept for the arena's life (every translation may call it).
    fill_thunk: Option<Translation>,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena").field("used", &self.used).finish()
    }
}

/// Installed host code for one block.
pub(crate) struct Translation {
    chunk: Rc<Chunk>,
    offset: usize,
    len: usize,
    /// Made for user-mode (CPL 3) accesses: the first-level TLB class its
    /// inline accesses use. Run only at that privilege.
    pub(crate) user: bool,
    /// Offset of the entry that chained blocks jump to (after the
    /// prologue).
    chain_offset: usize,
}

impl std::fmt::Debug for Translation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Translation")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

/// What generated code reads besides the `Cpu`, passed per call (fields at
/// fixed offsets: see `jit::ENV_*`).
#[repr(C)]
pub(crate) struct Env {
    /// The first-level TLB's slots (`Cpu::l1`).
    pub l1_slots: usize,
    /// Host address of host-physical 0.
    pub mem_base: *mut u8,
    /// Bytes of host-physical memory.
    pub mem_size: u64,
    /// One byte per frame, non-zero when the frame holds decoded code.
    pub code_frames: *const u8,
    /// The chaining table (`Cpu::jit_chain`).
    pub chain: *const super::ChainEntry,
    /// One u32 per frame: its code-write generation.
    pub code_generation: *const u32,
    /// [`chain_crossing_address`].
    pub chain_crossing: u64,
    /// [`chain_fetch_address`].
    pub chain_fetch: u64,
    /// The first-level TLB's bookkeeping (`L1Tlb::book_address`) and the
    /// TLB's parts (`Tlb::jit_pointers`), for the fill thunk
    /// (`jit::tlb_fill`).
    pub l1_book: u64,
    pub tlb_hints: u64,
    pub tlb_entries: u64,
    pub tlb_recently_used: u64,
    pub tlb_hits: u64,
    pub tlb_ways: u64,
    pub tlb_full_set_mask: u64,
    pub tlb_epoch: u64,
    /// The guest's memory (what the calls into Rust take as their second
    /// argument; no host register holds it: r12 is a pool register,
    /// `jit/regs.rs`).
    pub memory: *const PhysMemory,
}

/// The signature of generated code: (cpu, memory, block, env) -> status.
type Entry = extern "sysv64" fn(*mut Cpu, *const PhysMemory, *const Block, *const Env) -> u64;

impl Arena {
    /// Copies position-independent `code` into executable memory.
    /// `None` if the host refuses the mapping or protection change (the
    /// block is then interpreted).
    pub(crate) fn install(
        &mut self,
        code: &[u8],
        chain_offset: usize,
        user: bool,
    ) -> Option<Translation> {
        if code.is_empty() || code.len() > CHUNK_BYTES || chain_offset >= code.len() {
            return None;
        }
        // Keep entries 16-byte aligned.
        let start = (self.used + 15) & !15;
        let chunk = match &self.chunk {
            Some(c) if start + code.len() <= CHUNK_BYTES => c.clone(),
            _ => {
                let c = Rc::new(Chunk::map()?);
                self.chunk = Some(c.clone());
                self.used = 0;
                return self.install(code, chain_offset, user);
            }
        };
        if !chunk.protect(libc::PROT_READ | libc::PROT_WRITE) {
            return None;
        }
        // SAFETY: [start, start + len) lies inside the chunk (checked
        // above), whose write view is writable now; `code` is a separate
        // Rust slice, so the ranges do not overlap. No code of this CPU
        // runs while it translates (translation happens between blocks),
        // and these bytes were never run: code is only appended.
        unsafe {
            std::ptr::copy_nonoverlapping(code.as_ptr(), chunk.writable_at(start), code.len());
        }
        if !chunk.protect(libc::PROT_READ | libc::PROT_EXEC) {
            return None;
        }
        self.used = start + code.len();
        Some(Translation {
            chunk,
            offset: start,
            len: code.len(),
            user,
            chain_offset,
        })
    }
}

impl Arena {
    /// The address translated code calls on a first-level TLB miss: the
    /// fill thunk, installed on first use, or the Rust fill if the thunk
    /// cannot be made (it is only a faster way to the same state).
    pub(crate) fn fill_address(&mut self) -> u64 {
        if self.fill_thunk.is_none() {
            if let Ok(code) = super::tlb_fill::thunk(fill_out_address()) {
                self.fill_thunk = self.install(&code, 0, false);
            }
        }
        match &self.fill_thunk {
            Some(t) => t.code_range().0,
            None => fill_out_address(),
        }
    }
}

impl Translation {
    /// Where the code is (start, bytes), for profiles.
    pub(crate) fn code_range(&self) -> (u64, usize) {
        (self.chunk.base as u64 + self.offset as u64, self.len)
    }

    /// The address chained blocks jump to (recorded in the chaining table;
    /// only ever jumped to by generated code).
    pub(crate) fn chain_entry(&self) -> u64 {
        self.chunk.base as u64 + (self.offset + self.chain_offset) as u64
    }

    /// Runs the block's host code on `cpu`. `block` must be the block this
    /// translation was made from (it is what the call-outs index).
    ///
    /// `env` must describe `cpu`'s first-level TLB and `mem` (the inline
    /// accesses use it: `Cpu::run_translated` builds it from them).
    pub(crate) fn run(&self, cpu: &mut Cpu, mem: &PhysMemory, block: &Block, env: &Env) -> u64 {
        // SAFETY: the chunk is mapped read-execute and stays mapped while
        // `self` holds its Rc; `offset` is the start of a complete function
        // produced by `jit::translate` with the `Entry` signature.
        let entry: Entry = unsafe { std::mem::transmute(self.chunk.base.add(self.offset)) };
        // The generated code only touches `cpu` through this pointer, at
        // the offsets `Cpu::jit_offsets` gave (guest registers, RFLAGS,
        // next_rip, the epochs), and hands it to `call_out`; `cpu` is not
        // used otherwise until the call returns. Its inline accesses read
        // first-level TLB slots and guest memory at the addresses `env`
        // gives, only inside the slots array and, after checking the frame
        // against `mem_size`, inside the memory mapping. It may jump on
        // into the translations of other blocks through `env.chain`, whose
        // entries `Cpu` keeps alive (with their blocks) for as long as they
        // are in the table, which nothing changes during the call, and into
        // those of page-crossing blocks `Cpu::jit_chain_crossing` returns,
        // which it keeps alive (`Cpu::jit_entered`) until the call returns.
        entry(
            cpu as *mut Cpu,
            mem as *const PhysMemory,
            block as *const Block,
            env as *const Env,
        )
    }
}

/// The address generated code calls for an instruction it runs through
/// the interpreter.
pub(crate) fn call_out_address() -> u64 {
    call_out as extern "sysv64" fn(*mut Cpu, *const PhysMemory, *const Block, u64) -> u64 as usize
        as u64
}

/// Runs instruction `k` of `block` through the interpreter; the status
/// word of [`super::status`] (0: go on).
extern "sysv64" fn call_out(
    cpu: *mut Cpu,
    mem: *const PhysMemory,
    block: *const Block,
    k: u64,
) -> u64 {
    // SAFETY: generated code passes on exactly the three pointers
    // `Translation::run` received from live references (the `&mut Cpu` is
    // not used by its owner until `run` returns, and the generated code
    // holds no access to the Cpu across this call).
    let (cpu, mem, block) = unsafe { (&mut *cpu, &*mem, &*block) };
    cpu.jit_call_out(mem, block, k as usize)
}

/// The address generated code calls on a first-level TLB miss of an
/// inline access.
pub(crate) fn fill_out_address() -> u64 {
    fill_out as extern "sysv64" fn(*mut Cpu, *const PhysMemory, u64, u64) -> u64 as usize as u64
}

/// Fills the first-level TLB for an inline access at `la` (`access`: the
/// class in bits 7:0, the bytes in the bits above); a [`super::fill`] code.
extern "sysv64" fn fill_out(cpu: *mut Cpu, mem: *const PhysMemory, la: u64, access: u64) -> u64 {
    // SAFETY: generated code passes on the two pointers `Translation::run`
    // received from live references (the `&mut Cpu` is not used by its
    // owner until `run` returns, and the generated code holds no access to
    // the Cpu across this call).
    let (cpu, mem) = unsafe { (&mut *cpu, &*mem) };
    cpu.jit_fill(mem, la, (access & 0xff) as usize, access >> 8)
}

/// Where translated code may go on into a page-crossing instruction's
/// block: its chained entry and the block, or zeros (return to the run
/// loop).
#[repr(C)]
pub(crate) struct CrossingEntry {
    pub entry: u64,
    pub block: u64,
}

/// The address generated code calls to chain into a page-crossing block.
pub(crate) fn chain_crossing_address() -> u64 {
    chain_crossing as extern "sysv64" fn(*mut Cpu, *const PhysMemory, u64) -> CrossingEntry as usize
        as u64
}

/// [`Cpu::jit_chain_crossing`] for generated code.
extern "sysv64" fn chain_crossing(
    cpu: *mut Cpu,
    mem: *const PhysMemory,
    rip: u64,
) -> CrossingEntry {
    // SAFETY: generated code passes on the two pointers `Translation::run`
    // received from live references (the `&mut Cpu` is not used by its
    // owner until `run` returns, and the generated code holds no access to
    // the Cpu across this call).
    let (cpu, mem) = unsafe { (&mut *cpu, &*mem) };
    cpu.jit_chain_crossing(mem, rip)
}

/// The address generated code calls when a chaining exit's fetch misses
/// the first-level iTLB.
pub(crate) fn chain_fetch_address() -> u64 {
    chain_fetch as extern "sysv64" fn(*mut Cpu, *const PhysMemory, u64, u64) -> CrossingEntry
        as usize as u64
}

/// [`Cpu::jit_chain_fetch`] for generated code.
extern "sysv64" fn chain_fetch(
    cpu: *mut Cpu,
    mem: *const PhysMemory,
    rip: u64,
    instructions: u64,
) -> CrossingEntry {
    // SAFETY: generated code passes on the two pointers `Translation::run`
    // received from live references (the `&mut Cpu` is not used by its
    // owner until `run` returns, and the generated code holds no access to
    // the Cpu across this call).
    let (cpu, mem) = unsafe { (&mut *cpu, &*mem) };
    cpu.jit_chain_fetch(mem, rip, instructions)
}
