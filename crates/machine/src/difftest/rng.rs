//! A small deterministic pseudo-random generator (SplitMix64).
//!
//! The tester must produce the same cases from the same seed on every host
//! and with every dependency version, so it carries its own generator
//! instead of depending on an external crate's algorithm choice.

/// SplitMix64 (Steele, Lea, Flood 2014): 64-bit state, passes BigCrush,
/// and any seed (including 0) is fine.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    /// A generator for item `index` of a run seeded with `seed`, independent
    /// of all other items (so one case can be replayed alone).
    pub fn for_item(seed: u64, index: u64) -> Self {
        let mut mixer = Rng::new(seed ^ 0x6a09_e667_f3bc_c909);
        let a = mixer.next_u64();
        let mut rng = Rng::new(a ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        // Discard one output so neighbouring indices decorrelate at once.
        rng.next_u64();
        rng
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), by widening multiplication (bias below
    /// 2^-32 for the small ranges used here).
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range_i64(&mut self, lo: i64, hi: i64) -> i64 {
        debug_assert!(lo <= hi);
        let span = (hi as i128 - lo as i128 + 1) as u128;
        if span > u64::MAX as u128 {
            return self.next_u64() as i64;
        }
        lo.wrapping_add(self.below(span as u64) as i64)
    }

    /// Uniform index into a slice of length `len` (`len > 0`).
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    /// A uniformly chosen element.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.index(items.len())]
    }

    /// An index chosen with probability proportional to `weights[i]`.
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|&w| w as u64).sum();
        let mut x = self.below(total.max(1));
        for (i, &w) in weights.iter().enumerate() {
            if x < w as u64 {
                return i;
            }
            x -= w as u64;
        }
        weights.len() - 1
    }

    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    /// A value biased towards the edge cases of integer instructions
    /// (zero, one, all-ones, sign boundaries of every width, small
    /// numbers) with uniformly random values mixed in.
    pub fn interesting_u64(&mut self) -> u64 {
        const EDGES: [u64; 16] = [
            0,
            1,
            2,
            u64::MAX,
            0x7f,
            0x80,
            0xff,
            0x7fff,
            0x8000,
            0xffff,
            0x7fff_ffff,
            0x8000_0000,
            0xffff_ffff,
            0x1_0000_0000,
            0x7fff_ffff_ffff_ffff,
            0x8000_0000_0000_0000,
        ];
        match self.below(8) {
            0 | 1 => *self.pick(&EDGES),
            2 => self.below(64),
            3 => (self.below(256) as i64 - 128) as u64,
            4 => self.next_u64() & 0xffff_ffff,
            5 => {
                // An edge value with noise in the low bits.
                self.pick(&EDGES)
                    .wrapping_add(self.below(5))
                    .wrapping_sub(2)
            }
            _ => self.next_u64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_item_independent() {
        let a: Vec<u64> = (0..4).map(|_| Rng::new(7).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        let mut x = Rng::for_item(7, 3);
        let mut y = Rng::for_item(7, 3);
        let mut z = Rng::for_item(7, 4);
        let (x0, y0, z0) = (x.next_u64(), y.next_u64(), z.next_u64());
        assert_eq!(x0, y0);
        assert_ne!(x0, z0);
    }

    #[test]
    fn ranges_are_respected() {
        let mut r = Rng::new(1);
        for _ in 0..10_000 {
            let v = r.range_i64(-3, 5);
            assert!((-3..=5).contains(&v));
            assert!(r.below(7) < 7);
            assert!(r.weighted(&[0, 3, 0, 1]) % 2 == 1);
        }
        // The full range must not overflow.
        let _ = r.range_i64(i64::MIN, i64::MAX);
    }
}
