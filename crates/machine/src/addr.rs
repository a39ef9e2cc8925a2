//! Address-space newtypes.
//!
//! A bare `u64` could be any of a guest-virtual, guest-physical or
//! host-physical address; mixing them up is the classic hypervisor bug. Each
//! space has its own type, and conversions between spaces only happen through
//! a page walk (guest paging, EPT) or an explicit, named constructor.

use std::fmt;

/// Size of a base page.
pub const PAGE_SIZE: u64 = 4096;
/// log2 of [`PAGE_SIZE`].
pub const PAGE_SHIFT: u32 = 12;

/// Whether a linear address is canonical for 48-bit linear addresses
/// (bits 63:47 all equal).
#[inline]
pub const fn is_canonical(la: u64) -> bool {
    ((la as i64) << 16 >> 16) as u64 == la
}

macro_rules! address_type {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[repr(transparent)]
        pub struct $name(pub u64);

        impl $name {
            /// The raw value.
            #[inline]
            pub const fn raw(self) -> u64 {
                self.0
            }
            /// Offset inside the 4 KiB page.
            #[inline]
            pub const fn page_offset(self) -> u64 {
                self.0 & (PAGE_SIZE - 1)
            }
            /// The address rounded down to its 4 KiB page.
            #[inline]
            pub const fn page_base(self) -> Self {
                Self(self.0 & !(PAGE_SIZE - 1))
            }
            /// `self + off`, wrapping as address arithmetic does on x86.
            #[inline]
            pub const fn add(self, off: u64) -> Self {
                Self(self.0.wrapping_add(off))
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, ":{:#x}"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }

        impl fmt::LowerHex for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::LowerHex::fmt(&self.0, f)
            }
        }
    };
}

address_type!(
    /// Guest-virtual (linear) address: what guest instructions compute.
    Gva, "gva"
);
address_type!(
    /// Guest-physical address: output of guest paging, input of EPT.
    Gpa, "gpa"
);
address_type!(
    /// Host-physical address: an offset into the machine's [`crate::PhysMemory`].
    Hpa, "hpa"
);

macro_rules! frame_type {
    ($(#[$doc:meta])* $name:ident, $addr:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[repr(transparent)]
        pub struct $name(pub u64);

        impl $name {
            /// The first address of the frame.
            #[inline]
            pub const fn addr(self) -> $addr {
                $addr(self.0 << PAGE_SHIFT)
            }
        }

        impl $addr {
            /// The 4 KiB frame holding this address.
            #[inline]
            pub const fn frame(self) -> $name {
                $name(self.0 >> PAGE_SHIFT)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, ":{:#x}"), self.0)
            }
        }
    };
}

frame_type!(
    /// Guest frame number: a guest-physical address >> 12.
    Gfn, Gpa, "gfn"
);
frame_type!(
    /// Host frame number: a host-physical address >> 12.
    Hfn, Hpa, "hfn"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let gpa = Gpa(0x12345678);
        assert_eq!(gpa.frame(), Gfn(0x12345));
        assert_eq!(gpa.frame().addr(), Gpa(0x12345000));
        assert_eq!(gpa.page_offset(), 0x678);
        assert_eq!(format!("{:?}", Hpa(0x1000)), "hpa:0x1000");
    }
}
