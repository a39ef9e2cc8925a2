//! A set of the 256 interrupt vectors, laid out like the IRR/ISR/TMR.

/// 256 bits, one per vector; bit `v` of the set is bit `v % 64` of word
/// `v / 64`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct VectorSet([u64; 4]);

impl VectorSet {
    pub(super) fn insert(&mut self, vector: u8) {
        self.0[usize::from(vector / 64)] |= 1 << (vector % 64);
    }

    pub(super) fn remove(&mut self, vector: u8) {
        self.0[usize::from(vector / 64)] &= !(1 << (vector % 64));
    }

    pub(super) fn contains(&self, vector: u8) -> bool {
        self.0[usize::from(vector / 64)] & (1 << (vector % 64)) != 0
    }

    /// The highest vector in the set (the highest priority).
    pub(super) fn highest(&self) -> Option<u8> {
        let (index, word) = self
            .0
            .iter()
            .enumerate()
            .rev()
            .find(|(_, &word)| word != 0)?;
        // index < 4 and the bit number < 64, so the vector fits in a u8.
        u8::try_from(index * 64 + word.ilog2() as usize).ok()
    }

    /// The 32-bit register `index` (0..8) of the set: vectors
    /// `32 * index ..= 32 * index + 31`, as ISR0..ISR7 etc. read.
    pub(super) fn register(&self, index: usize) -> u32 {
        let word = self.0[index / 2];
        // Truncation keeps the requested half.
        (word >> (32 * (index % 2))) as u32
    }

    /// The eight 32-bit registers, lowest vectors first.
    pub(super) fn registers(&self) -> [u32; 8] {
        std::array::from_fn(|index| self.register(index))
    }
}
