//! The host frame allocator: hands out 4 KiB frames of the machine's
//! host-physical memory for EPT tables, guest RAM backing and boot data.
//!
//! Frames come from a bump pointer over `[first, end)` and, once freed, from
//! a LIFO free list, so allocation order (and with it every host-physical
//! address the guest's data lands on) is deterministic.

use machine::Hfn;
use thiserror::Error;

/// The allocator has no frame left (the host memory limit was reached).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("out of host frames ({total} frames in the pool, all in use)")]
pub struct OutOfFrames {
    pub total: u64,
}

/// Allocator of host frames.
#[derive(Debug)]
pub struct FrameAllocator {
    first: u64,
    next: u64,
    end: u64,
    free: Vec<Hfn>,
    in_use: u64,
    peak: u64,
}

impl FrameAllocator {
    /// Frames `[first, end)`. Frame 0 is never handed out by callers that
    /// pass `first >= 1`, which lets 0 mean "no frame" in compact tables.
    pub fn new(first: Hfn, end: Hfn) -> Self {
        FrameAllocator {
            first: first.0,
            next: first.0,
            end: end.0.max(first.0),
            free: Vec::new(),
            in_use: 0,
            peak: 0,
        }
    }

    /// One frame; its contents are whatever was there (callers zero it and
    /// pay for that).
    pub fn alloc(&mut self) -> Result<Hfn, OutOfFrames> {
        let frame = if let Some(frame) = self.free.pop() {
            frame
        } else if self.next < self.end {
            self.next += 1;
            Hfn(self.next - 1)
        } else {
            return Err(OutOfFrames {
                total: self.end - self.first,
            });
        };
        self.in_use += 1;
        self.peak = self.peak.max(self.in_use);
        Ok(frame)
    }

    /// Returns a frame to the pool.
    pub fn free(&mut self, frame: Hfn) {
        debug_assert!(frame.0 >= self.first && frame.0 < self.next);
        self.in_use -= 1;
        self.free.push(frame);
    }

    /// Frames currently allocated.
    pub fn in_use(&self) -> u64 {
        self.in_use
    }

    /// Most frames ever allocated at once.
    pub fn peak(&self) -> u64 {
        self.peak
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bump_then_reuse_freed_frames_last_in_first_out() {
        let mut frames = FrameAllocator::new(Hfn(1), Hfn(4));
        let a = frames.alloc().unwrap();
        let b = frames.alloc().unwrap();
        assert_eq!((a, b), (Hfn(1), Hfn(2)));
        frames.free(a);
        assert_eq!(frames.alloc().unwrap(), Hfn(1));
        assert_eq!(frames.alloc().unwrap(), Hfn(3));
        assert_eq!(frames.alloc(), Err(OutOfFrames { total: 3 }));
        assert_eq!((frames.in_use(), frames.peak()), (3, 3));
    }
}
