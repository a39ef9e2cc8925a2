//! Virtual time: one type for every clock reading and every charge.
//!
//! Each vCPU has its own clock (its cycle counter, as each core has its own
//! TSC); the VM's time is the end of the last scheduling round. Both, and
//! every duration the hv charges, are [`Cycles`] of the 3 GHz virtual
//! clock (`machine::cost::CYCLES_PER_SECOND`).

use std::fmt;
use std::ops::{Add, AddAssign, Sub, SubAssign};

/// A point in, or a span of, virtual time, in cycles.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cycles(pub u64);

impl Cycles {
    pub const ZERO: Cycles = Cycles(0);
    pub const MAX: Cycles = Cycles(u64::MAX);

    /// `self - other`, or zero if `other` is later.
    pub const fn saturating_sub(self, other: Cycles) -> Cycles {
        Cycles(self.0.saturating_sub(other.0))
    }

    /// `self + other`, stopping at the end of time.
    pub const fn saturating_add(self, other: Cycles) -> Cycles {
        Cycles(self.0.saturating_add(other.0))
    }

    /// Whole nanoseconds of the virtual clock in `self` (rounded down).
    pub const fn as_ns(self) -> u64 {
        (self.0 as u128 * 1_000_000_000 / machine::cost::CYCLES_PER_SECOND as u128) as u64
    }

    /// The first cycle at or after `ns` nanoseconds.
    pub const fn from_ns_ceil(ns: u64) -> Cycles {
        Cycles(
            (ns as u128 * machine::cost::CYCLES_PER_SECOND as u128).div_ceil(1_000_000_000) as u64,
        )
    }
}

impl Add for Cycles {
    type Output = Cycles;
    fn add(self, rhs: Cycles) -> Cycles {
        Cycles(self.0 + rhs.0)
    }
}

impl AddAssign for Cycles {
    fn add_assign(&mut self, rhs: Cycles) {
        self.0 += rhs.0;
    }
}

impl Sub for Cycles {
    type Output = Cycles;
    fn sub(self, rhs: Cycles) -> Cycles {
        Cycles(self.0 - rhs.0)
    }
}

impl SubAssign for Cycles {
    fn sub_assign(&mut self, rhs: Cycles) {
        self.0 -= rhs.0;
    }
}

impl From<u64> for Cycles {
    fn from(c: u64) -> Cycles {
        Cycles(c)
    }
}

impl From<Cycles> for u64 {
    fn from(c: Cycles) -> u64 {
        c.0
    }
}

impl fmt::Display for Cycles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} cycles", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nanoseconds_round_down_and_back_up() {
        assert_eq!(Cycles(0).as_ns(), 0);
        assert_eq!(Cycles(2).as_ns(), 0);
        assert_eq!(Cycles(3).as_ns(), 1);
        assert_eq!(Cycles(3_000_000_000).as_ns(), 1_000_000_000);
        assert_eq!(Cycles(u64::MAX).as_ns(), u64::MAX / 3);
        assert_eq!(Cycles::from_ns_ceil(0), Cycles(0));
        assert_eq!(Cycles::from_ns_ceil(1), Cycles(3));
        assert_eq!(Cycles::from_ns_ceil(1_000_000_000), Cycles(3_000_000_000));
        for ns in [1, 7, 999, 123_456_789] {
            assert_eq!(Cycles::from_ns_ceil(ns).as_ns(), ns);
        }
    }
}
