//! The machine's host-physical memory.
//!
//! One anonymous mmap region, addressed by [`Hpa`] from 0 to `size`. The
//! hypervisor carves frames out of it for guest memory, EPT tables and
//! everything else; the CPU reads page tables and guest data from it.
//!
//! All accesses go through atomics (relaxed for data, sequentially consistent
//! for cmpxchg), so several host threads may run CPUs over the same memory
//! without data races in the Rust sense: on x86-64 a relaxed atomic load or
//! store is a plain `mov`. Unaligned multi-byte accesses are split into bytes.
//! An access outside the region is a [`MemError`], never a host fault.

use crate::addr::{Hpa, PAGE_SIZE};
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use thiserror::Error;

/// An access the machine's memory cannot satisfy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum MemError {
    /// The range `[hpa, hpa + len)` is not inside host-physical memory.
    #[error("host-physical access {hpa:?}+{len} outside machine memory of {size:#x} bytes")]
    OutOfRange { hpa: Hpa, len: u64, size: u64 },
    /// An atomic access that must be naturally aligned was not.
    #[error("misaligned atomic access at {hpa:?}")]
    Misaligned { hpa: Hpa },
}

/// Errors creating the memory region.
#[derive(Debug, Error)]
pub enum MemCreateError {
    #[error("memory size {0:#x} is zero or not a multiple of 4 KiB")]
    BadSize(u64),
    #[error("mmap of {size:#x} bytes failed: {source}")]
    Mmap { size: u64, source: std::io::Error },
}

/// Host-physical memory of the machine.
pub struct PhysMemory {
    base: *mut u8,
    size: u64,
    /// Per frame: non-zero if some CPU has decoded code from it.
    code_frames: Box<[AtomicU8]>,
    /// Per frame: bumped by every store into a frame in `code_frames`, so
    /// decoded blocks of that frame become stale on every CPU.
    code_generation: Box<[AtomicU32]>,
    /// Stores into frames in `code_frames` so far (any frame): whether any
    /// generation moved since a moment, in one compare.
    code_writes: AtomicU64,
    /// Frames that came to hold code so far (`code_frames` set): whether
    /// any did since a moment, in one compare.
    code_marks: AtomicU64,
    /// Backs memory ahead of the hypervisor's use on another host thread.
    prefault: crate::prefault::Prefaulter,
}

// SAFETY: the region is only accessed through atomic operations (or through
// `&mut self`), so sharing it between threads cannot cause data races.
unsafe impl Send for PhysMemory {}
// SAFETY: as above.
unsafe impl Sync for PhysMemory {}

impl std::fmt::Debug for PhysMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhysMemory")
            .field("size", &self.size)
            .finish()
    }
}

impl PhysMemory {
    /// Maps `size` bytes of zeroed memory (lazily backed by the host).
    pub fn new(size: u64) -> Result<Self, MemCreateError> {
        if size == 0 || size % PAGE_SIZE != 0 || size > (1u64 << 46) {
            return Err(MemCreateError::BadSize(size));
        }
        // Mapped with a huge page's worth of slack and trimmed to start on a
        // 2 MiB boundary, so that Hpa 2 MiB regions are the host's huge
        // pages.
        const HUGE: usize = 2 << 20;
        let mapped = size as usize + HUGE;
        // SAFETY: an anonymous private mapping with no address hint touches no
        // existing memory; the result is checked against MAP_FAILED.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(MemCreateError::Mmap {
                size,
                source: std::io::Error::last_os_error(),
            });
        }
        let head = (raw as usize).next_multiple_of(HUGE) - raw as usize;
        // SAFETY: `head` is below `HUGE`, so the aligned start and the
        // region after it lie inside the mapping.
        let ptr = unsafe { raw.cast::<u8>().add(head) }.cast::<libc::c_void>();
        // SAFETY: both ranges are parts of the mapping just made, outside
        // `[ptr, ptr + size)`; nothing refers to them.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            libc::munmap(ptr.cast::<u8>().add(size as usize).cast(), HUGE - head);
        }
        // Back guest memory with transparent huge pages where the host
        // allows it (as QEMU does for guest RAM): a guest's scattered
        // accesses then cost the host no TLB walk of its own. Advice only:
        // a refusal changes nothing but speed.
        // SAFETY: the range is exactly the mapping kept.
        let _ = unsafe { libc::madvise(ptr, size as usize, libc::MADV_HUGEPAGE) };
        let frames = (size / PAGE_SIZE) as usize;
        Ok(Self {
            base: ptr.cast(),
            size,
            code_frames: (0..frames).map(|_| AtomicU8::new(0)).collect(),
            code_generation: (0..frames).map(|_| AtomicU32::new(0)).collect(),
            code_writes: AtomicU64::new(0),
            code_marks: AtomicU64::new(0),
            prefault: crate::prefault::Prefaulter::new(ptr.cast(), size),
        })
    }

    /// The hypervisor is about to use memory at `hpa` and, by its bump
    /// allocation, what follows: have the host back it ahead, off this
    /// thread (`prefault`). Changes nothing but host speed.
    pub fn use_ahead(&self, hpa: Hpa) {
        self.prefault.ahead_of(hpa.0);
    }

    /// Size in bytes.
    #[inline]
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Checks that `[hpa, hpa+len)` lies inside memory.
    #[inline]
    pub fn check(&self, hpa: Hpa, len: u64) -> Result<(), MemError> {
        match hpa.0.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(MemError::OutOfRange {
                hpa,
                len,
                size: self.size,
            }),
        }
    }

    /// The mapping's base, the per-frame code marks (one byte per frame,
    /// non-zero: holds decoded code) and code-write generations (u32 per
    /// frame), for the translator's inline accesses and block chaining.
    pub(crate) fn jit_view(&self) -> (*mut u8, *const u8, *const u32) {
        (
            self.base,
            self.code_frames.as_ptr().cast(),
            self.code_generation.as_ptr().cast(),
        )
    }

    /// Raw pointer to `hpa`. Only valid after [`Self::check`].
    #[inline]
    fn ptr(&self, hpa: Hpa) -> *mut u8 {
        // SAFETY (of the arithmetic): callers checked hpa < size, so the
        // result stays inside the mapping.
        self.base.wrapping_add(hpa.0 as usize)
    }

    /// Reads a little-endian value of `len` bytes (1, 2, 4 or 8).
    #[inline]
    pub fn read(&self, hpa: Hpa, len: u8) -> Result<u64, MemError> {
        self.check(hpa, len as u64)?;
        let p = self.ptr(hpa);
        if hpa.0 & (len as u64 - 1) == 0 {
            // SAFETY: the range is inside the mapping (checked above) and
            // naturally aligned, so it is a valid atomic of that width.
            unsafe {
                Ok(match len {
                    1 => (*(p as *const AtomicU8)).load(Ordering::Relaxed) as u64,
                    2 => (*(p as *const AtomicU16)).load(Ordering::Relaxed) as u64,
                    4 => (*(p as *const AtomicU32)).load(Ordering::Relaxed) as u64,
                    _ => (*(p as *const AtomicU64)).load(Ordering::Relaxed),
                })
            }
        } else {
            let mut v = 0u64;
            for i in 0..len as usize {
                // SAFETY: each byte is inside the checked range.
                let b = unsafe { (*(p.add(i) as *const AtomicU8)).load(Ordering::Relaxed) };
                v |= (b as u64) << (8 * i);
            }
            Ok(v)
        }
    }

    /// Writes the low `len` bytes (1, 2, 4 or 8) of `value`, little-endian.
    #[inline]
    pub fn write(&self, hpa: Hpa, len: u8, value: u64) -> Result<(), MemError> {
        self.write_noting_code(hpa, len, value).map(|_| ())
    }

    /// [`Self::write`], also telling whether the bytes written lie in a
    /// frame holding decoded code (whose blocks are now stale).
    #[inline]
    pub fn write_noting_code(&self, hpa: Hpa, len: u8, value: u64) -> Result<bool, MemError> {
        self.check(hpa, len as u64)?;
        let code = self.note_store(hpa, len as u64);
        self.store_unchecked(hpa, len, value);
        Ok(code)
    }

    /// The store of [`Self::write`], for a range already checked.
    #[inline]
    fn store_unchecked(&self, hpa: Hpa, len: u8, value: u64) {
        let p = self.ptr(hpa);
        if hpa.0 & (len as u64 - 1) == 0 {
            // SAFETY: in range and naturally aligned (see `read`).
            unsafe {
                match len {
                    1 => (*(p as *const AtomicU8)).store(value as u8, Ordering::Relaxed),
                    2 => (*(p as *const AtomicU16)).store(value as u16, Ordering::Relaxed),
                    4 => (*(p as *const AtomicU32)).store(value as u32, Ordering::Relaxed),
                    _ => (*(p as *const AtomicU64)).store(value, Ordering::Relaxed),
                }
            }
        } else {
            for i in 0..len as usize {
                // SAFETY: each byte is inside the checked range.
                unsafe {
                    (*(p.add(i) as *const AtomicU8))
                        .store((value >> (8 * i)) as u8, Ordering::Relaxed)
                };
            }
        }
    }

    /// `count` stores of the low `size` bytes of `value`, element after
    /// element from `hpa` up, as that many [`Self::write_noting_code`]
    /// calls would make them, for a range in one frame that holds no
    /// decoded code (`false`, nothing written, if it is not all RAM or
    /// its frame holds code: the caller then stores one at a time).
    pub(crate) fn store_repeated(&self, hpa: Hpa, count: u64, size: u8, value: u64) -> bool {
        let len = count * size as u64;
        if len == 0 || self.check(hpa, len).is_err() || self.is_code(hpa) {
            return false;
        }
        debug_assert_eq!(hpa.0 / PAGE_SIZE, (hpa.0 + len - 1) / PAGE_SIZE);
        // The bytes repeat every `size` bytes, so every 8 (the sizes
        // divide 8): byte k of `period` is byte k of the range modulo 8.
        let size = size as u32;
        let mut period = 0u64;
        for k in 0..8 {
            period |= ((value >> (8 * (k % size))) & 0xff) << (8 * k);
        }
        self.fill_periodic(hpa, len, period);
        true
    }

    /// Stores `len` bytes from `hpa` (a range already checked), the byte
    /// at offset k being byte `k % 8` of `period`: 8-byte aligned words
    /// where they fit, single bytes at the ends. (The memory ends up as
    /// element-by-element stores leave it; the vCPUs run on one host
    /// thread, so nothing sees the order.)
    #[inline]
    fn fill_periodic(&self, hpa: Hpa, len: u64, period: u64) {
        let p = self.ptr(hpa);
        let len = len as usize;
        let head = ((8 - (hpa.0 & 7)) & 7).min(len as u64) as usize;
        for i in 0..head {
            // SAFETY: inside the checked range.
            unsafe {
                (*(p.add(i) as *const AtomicU8))
                    .store((period >> (8 * (i & 7))) as u8, Ordering::Relaxed)
            };
        }
        // Every aligned word starts `head` bytes (mod 8) into the period.
        let word = period.rotate_right(8 * head as u32);
        let words = (len - head) / 8;
        for w in 0..words {
            // SAFETY: inside the checked range and 8-byte aligned.
            unsafe { (*(p.add(head + 8 * w) as *const AtomicU64)).store(word, Ordering::Relaxed) };
        }
        for i in head + 8 * words..len {
            // SAFETY: inside the checked range.
            unsafe {
                (*(p.add(i) as *const AtomicU8))
                    .store((period >> (8 * (i & 7))) as u8, Ordering::Relaxed)
            };
        }
    }

    /// `count` elements of `size` bytes copied from `src` to `dst` (each
    /// its lowest element) in address order, or (`down`: a string move
    /// with RFLAGS.DF set) from the highest element down, each read then
    /// written before the next (so overlapping ranges behave as the
    /// string move), as that many [`Self::read`] and
    /// [`Self::write_noting_code`] calls would; both ranges in one frame
    /// each, `dst`'s holding no decoded code (`false`, nothing done,
    /// otherwise).
    pub(crate) fn copy_repeated(
        &self,
        src: Hpa,
        dst: Hpa,
        count: u64,
        size: u8,
        down: bool,
    ) -> bool {
        let len = count * size as u64;
        if len == 0
            || self.check(src, len).is_err()
            || self.check(dst, len).is_err()
            || self.is_code(dst)
        {
            return false;
        }
        // Element by element reads each byte before any element written
        // earlier could cover it when the destination lies behind the
        // source in the copy's order (below it forward, above it down) or
        // the ranges are apart: then it copies the bytes as they were, so
        // aligned words in that order do the same when both ranges are
        // equally aligned.
        let behind = if down { dst.0 >= src.0 } else { dst.0 <= src.0 };
        let apart = dst.0 + len <= src.0 || dst.0 >= src.0 + len;
        if (src.0 ^ dst.0) & 7 == 0 && (behind || apart) {
            self.copy_words(src, dst, len, down);
            return true;
        }
        for k in 0..count {
            let i = if down { count - 1 - k } else { k };
            let offset = i * size as u64;
            let Ok(v) = self.read(Hpa(src.0 + offset), size) else {
                unreachable!("checked above")
            };
            self.store_unchecked(Hpa(dst.0 + offset), size, v);
        }
        true
    }

    /// `len` bytes copied from `src` to `dst` (ranges checked, equally
    /// aligned modulo 8), forward or (`down`) from the highest byte down:
    /// 8-byte aligned words where they fit, single bytes at the ends.
    #[inline]
    fn copy_words(&self, src: Hpa, dst: Hpa, len: u64, down: bool) {
        let (s, d) = (self.ptr(src), self.ptr(dst));
        let len = len as usize;
        let head = ((8 - (dst.0 & 7)) & 7).min(len as u64) as usize;
        let words = (len - head) / 8;
        let byte = |i: usize| {
            // SAFETY: inside both checked ranges.
            unsafe {
                let b = (*(s.add(i) as *const AtomicU8)).load(Ordering::Relaxed);
                (*(d.add(i) as *const AtomicU8)).store(b, Ordering::Relaxed);
            }
        };
        let word = |w: usize| {
            let i = head + 8 * w;
            // SAFETY: inside both checked ranges, both 8-byte aligned.
            unsafe {
                let v = (*(s.add(i) as *const AtomicU64)).load(Ordering::Relaxed);
                (*(d.add(i) as *const AtomicU64)).store(v, Ordering::Relaxed);
            }
        };
        let tail = head + 8 * words..len;
        if down {
            tail.rev().for_each(byte);
            (0..words).rev().for_each(word);
            (0..head).rev().for_each(byte);
        } else {
            (0..head).for_each(byte);
            (0..words).for_each(word);
            tail.for_each(byte);
        }
    }

    /// 8-byte read.
    #[inline]
    pub fn read_u64(&self, hpa: Hpa) -> Result<u64, MemError> {
        self.read(hpa, 8)
    }

    /// 8-byte write.
    #[inline]
    pub fn write_u64(&self, hpa: Hpa, value: u64) -> Result<(), MemError> {
        self.write(hpa, 8, value)
    }

    /// The 8-byte word at `hpa` as an atomic, e.g. a page-table entry that
    /// the CPU and the hypervisor update concurrently.
    ///
    /// Stores through the returned atomic bypass code-cache invalidation:
    /// use it for page tables, not for code.
    #[inline]
    pub fn atomic_u64(&self, hpa: Hpa) -> Result<&AtomicU64, MemError> {
        self.check(hpa, 8)?;
        if hpa.0 & 7 != 0 {
            return Err(MemError::Misaligned { hpa });
        }
        // SAFETY: in range and 8-byte aligned; the reference lives no longer
        // than `&self`, and the mapping lives as long as `self`.
        Ok(unsafe { &*(self.ptr(hpa) as *const AtomicU64) })
    }

    /// Compare-and-exchange of `len` bytes at a naturally aligned `hpa`.
    /// Returns `Ok(previous)`; the swap happened iff `previous == current`.
    pub fn cmpxchg(&self, hpa: Hpa, len: u8, current: u64, new: u64) -> Result<u64, MemError> {
        self.check(hpa, len as u64)?;
        self.note_store(hpa, len as u64);
        if hpa.0 & (len as u64 - 1) != 0 {
            return Err(MemError::Misaligned { hpa });
        }
        let p = self.ptr(hpa);
        let sc = Ordering::SeqCst;
        // SAFETY: in range and naturally aligned.
        unsafe {
            Ok(match len {
                1 => {
                    let a = &*(p as *const AtomicU8);
                    a.compare_exchange(current as u8, new as u8, sc, sc)
                        .unwrap_or_else(|v| v) as u64
                }
                2 => {
                    let a = &*(p as *const AtomicU16);
                    a.compare_exchange(current as u16, new as u16, sc, sc)
                        .unwrap_or_else(|v| v) as u64
                }
                4 => {
                    let a = &*(p as *const AtomicU32);
                    a.compare_exchange(current as u32, new as u32, sc, sc)
                        .unwrap_or_else(|v| v) as u64
                }
                _ => {
                    let a = &*(p as *const AtomicU64);
                    a.compare_exchange(current, new, sc, sc)
                        .unwrap_or_else(|v| v)
                }
            })
        }
    }

    /// Copies bytes out of memory.
    pub fn read_bytes(&self, hpa: Hpa, buf: &mut [u8]) -> Result<(), MemError> {
        self.check(hpa, buf.len() as u64)?;
        let p = self.ptr(hpa);
        for (i, b) in buf.iter_mut().enumerate() {
            // SAFETY: inside the checked range.
            *b = unsafe { (*(p.add(i) as *const AtomicU8)).load(Ordering::Relaxed) };
        }
        Ok(())
    }

    /// Copies bytes into memory.
    pub fn write_bytes(&self, hpa: Hpa, buf: &[u8]) -> Result<(), MemError> {
        self.check(hpa, buf.len() as u64)?;
        self.note_store(hpa, buf.len() as u64);
        let p = self.ptr(hpa);
        for (i, b) in buf.iter().enumerate() {
            // SAFETY: inside the checked range.
            unsafe { (*(p.add(i) as *const AtomicU8)).store(*b, Ordering::Relaxed) };
        }
        Ok(())
    }

    /// Records a store to `[hpa, hpa+len)` (already bounds-checked): stores
    /// into frames holding decoded code invalidate that code. Returns
    /// whether there was any.
    #[inline]
    fn note_store(&self, hpa: Hpa, len: u64) -> bool {
        let first = (hpa.0 / PAGE_SIZE) as usize;
        let last = ((hpa.0 + len.max(1) - 1) / PAGE_SIZE) as usize;
        if first == last {
            // The usual case, without a loop.
            return self.note_frame_store(first);
        }
        let mut code = false;
        for f in first..=last {
            code |= self.note_frame_store(f);
        }
        code
    }

    #[inline(always)]
    fn note_frame_store(&self, frame: usize) -> bool {
        let code = self.code_frames[frame].load(Ordering::Relaxed) != 0;
        if code {
            self.code_generation[frame].fetch_add(1, Ordering::Relaxed);
            self.code_writes.fetch_add(1, Ordering::Relaxed);
        }
        code
    }

    /// Whether the frame of `hpa` holds decoded code.
    #[inline]
    pub fn is_code(&self, hpa: Hpa) -> bool {
        self.code_frames
            .get((hpa.0 / PAGE_SIZE) as usize)
            .is_some_and(|f| f.load(Ordering::Relaxed) != 0)
    }

    /// Marks the frame of `hpa` as holding decoded code; returns its
    /// current code-write generation.
    pub fn mark_code(&self, hpa: Hpa) -> u32 {
        let f = (hpa.0 / PAGE_SIZE) as usize;
        match self.code_frames.get(f) {
            Some(flag) => {
                if flag.swap(1, Ordering::Relaxed) == 0 {
                    self.code_marks.fetch_add(1, Ordering::Relaxed);
                }
                self.code_generation[f].load(Ordering::Relaxed)
            }
            None => 0,
        }
    }

    /// How many stores into frames holding decoded code there have been
    /// (each moved a frame's code-write generation).
    #[inline]
    pub fn code_writes(&self) -> u64 {
        self.code_writes.load(Ordering::Relaxed)
    }

    /// How many frames have come to hold decoded code (each once: a
    /// frame holding code keeps that mark).
    #[inline]
    pub fn code_marks(&self) -> u64 {
        self.code_marks.load(Ordering::Relaxed)
    }

    /// The code-write generation of the frame of `hpa`.
    #[inline]
    pub fn code_generation(&self, hpa: Hpa) -> u32 {
        self.code_generation
            .get((hpa.0 / PAGE_SIZE) as usize)
            .map_or(0, |g| g.load(Ordering::Relaxed))
    }

    /// Fills `[hpa, hpa+len)` with zeros.
    ///
    /// The range is checked, and its code frames noted, once for the whole
    /// range rather than per word: the hv zeroes a 4 KiB frame on every
    /// demand-paging fault.
    pub fn zero(&self, hpa: Hpa, len: u64) -> Result<(), MemError> {
        self.check(hpa, len)?;
        if len == 0 {
            return Ok(());
        }
        self.note_store(hpa, len);
        self.fill_periodic(hpa, len, 0);
        Ok(())
    }
}

impl Drop for PhysMemory {
    fn drop(&mut self) {
        self.prefault.stop();
        // SAFETY: base/size are exactly what mmap returned; nothing borrows
        // the region past `self`'s lifetime.
        unsafe {
            libc::munmap(self.base.cast(), self.size as usize);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_ahead_of_use_is_backed_with_its_contents_kept() {
        let m = PhysMemory::new(64 << 20).unwrap();
        assert_eq!(
            m.base as usize % (2 << 20),
            0,
            "not on a huge page boundary"
        );
        m.write_u64(Hpa(0x5008), 0xfeed_f00d).unwrap();
        // Used up to 8 MiB: the window reaches 16 MiB.
        m.use_ahead(Hpa(8 << 20));
        let start = std::time::Instant::now();
        loop {
            let (backed, off) = m.prefault.progress();
            assert!(
                !off,
                "the kernel refused MADV_POPULATE_WRITE (Linux 5.14 has it)"
            );
            if backed >= 16 << 20 {
                break;
            }
            assert!(start.elapsed().as_secs() < 30, "backed only {backed:#x}");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let pages = (16 << 20) / PAGE_SIZE as usize;
        let mut resident = vec![0u8; pages];
        // SAFETY: the range is inside the mapping; `resident` has one byte
        // per page of it.
        let r = unsafe { libc::mincore(m.base.cast(), 16 << 20, resident.as_mut_ptr()) };
        assert_eq!(r, 0);
        assert!(
            resident.iter().all(|&b| b & 1 == 1),
            "a page in the window is not backed"
        );
        assert_eq!(m.read_u64(Hpa(0x5008)).unwrap(), 0xfeed_f00d);
        assert_eq!(m.read_u64(Hpa(12 << 20)).unwrap(), 0);
    }

    #[test]
    fn read_write_and_bounds() {
        let m = PhysMemory::new(2 * PAGE_SIZE).unwrap();
        m.write(Hpa(8), 8, 0x1122334455667788).unwrap();
        assert_eq!(m.read(Hpa(8), 8).unwrap(), 0x1122334455667788);
        assert_eq!(m.read(Hpa(9), 2).unwrap(), 0x6677);
        m.write(Hpa(0x1fff), 1, 0xab).unwrap();
        assert!(matches!(
            m.read(Hpa(0x1fff), 2),
            Err(MemError::OutOfRange { .. })
        ));
        assert!(m.read(Hpa(u64::MAX), 8).is_err());
        assert_eq!(
            m.cmpxchg(Hpa(8), 8, 0x1122334455667788, 5).unwrap(),
            0x1122334455667788
        );
        assert_eq!(m.read_u64(Hpa(8)).unwrap(), 5);
        assert!(PhysMemory::new(123).is_err());
    }

    /// The bytes of `[0, len)`.
    fn bytes(m: &PhysMemory, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        m.read_bytes(Hpa(0), &mut v).unwrap();
        v
    }

    /// A memory of one page with a different byte at each offset.
    fn patterned() -> PhysMemory {
        let m = PhysMemory::new(PAGE_SIZE).unwrap();
        let init: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7 + 3) as u8).collect();
        m.write_bytes(Hpa(0), &init).unwrap();
        m
    }

    #[test]
    fn repeated_stores_and_copies_match_element_by_element() {
        let value = 0x8877_6655_4433_2211u64;
        for size in [1u8, 2, 4, 8] {
            for start in 0..17u64 {
                for count in [0u64, 1, 2, 3, 5, 9, 17, 40] {
                    // STOS: the reference stores one element at a time.
                    let (m, r) = (patterned(), patterned());
                    if m.store_repeated(Hpa(start), count, size, value) {
                        for i in 0..count {
                            r.write(Hpa(start + i * size as u64), size, value).unwrap();
                        }
                    }
                    assert_eq!(
                        bytes(&m, 128),
                        bytes(&r, 128),
                        "stos size {size} at {start} x{count}"
                    );
                    // MOVS, with sources on both sides of the destination,
                    // overlapping and apart.
                    for src in [0u64, 1, 3, 8, 16, 24, 29, 64, 100] {
                        let (m, r) = (patterned(), patterned());
                        let done = m.copy_repeated(Hpa(src), Hpa(start), count, size, false);
                        assert_eq!(done, count > 0);
                        for i in 0..count {
                            let at = i * size as u64;
                            let v = r.read(Hpa(src + at), size).unwrap();
                            r.write(Hpa(start + at), size, v).unwrap();
                        }
                        assert_eq!(
                            bytes(&m, 512),
                            bytes(&r, 512),
                            "movs size {size} from {src} to {start} x{count}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn zero_clears_exactly_the_range_and_invalidates_code() {
        let m = PhysMemory::new(2 * PAGE_SIZE).unwrap();
        m.write_bytes(Hpa(0), &[0xff; 0x2000]).unwrap();
        let gen = m.mark_code(Hpa(0x1000));
        m.zero(Hpa(0xffd), 0x13).unwrap();
        let mut buf = [0u8; 0x20];
        m.read_bytes(Hpa(0xff0), &mut buf).unwrap();
        for (k, b) in buf.iter().enumerate() {
            let inside = (0xd..0xd + 0x13).contains(&k);
            assert_eq!(*b, if inside { 0 } else { 0xff }, "byte {:#x}", 0xff0 + k);
        }
        assert_ne!(
            m.code_generation(Hpa(0x1000)),
            gen,
            "code in the range is stale"
        );
        assert!(m.zero(Hpa(0x1ff8), 16).is_err());
        assert_eq!(
            m.read(Hpa(0x1ff8), 8).unwrap(),
            u64::MAX,
            "nothing written on error"
        );
    }
}
