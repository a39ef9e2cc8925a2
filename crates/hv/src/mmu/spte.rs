//! The spte: an EPT leaf or non-leaf entry as the hv writes it.
//!
//! | bits  | field | meaning |
//! |-------|-------|---------|
//! | 0     | `READ` | hardware: reads allowed |
//! | 1     | `WRITE` | hardware: writes allowed |
//! | 2     | `EXEC` | hardware: instruction fetches allowed |
//! | 5:3   | `MEMTYPE` | hardware, leaf: memory type (6 = write-back) |
//! | 6     | `IGNORE_PAT` | hardware, leaf: ignore the guest PAT |
//! | 7     | `HUGE` | hardware: 2 MiB / 1 GiB leaf (unused: the TDP MMU maps 4 KiB) |
//! | 8     | `ACCESSED` | hardware: set by the CPU on use (EPT A/D on) |
//! | 9     | `DIRTY` | hardware, leaf: set by the CPU on write |
//! | 11    | `MMU_PRESENT` | software: the entry was installed by the MMU (distinguishes a valid entry from zero even when access tracking cleared R/W/X) |
//! | 51:12 | `ADDR` | hardware: host frame of the page or next table |
//! | 54:52 | `ACC_TRACK_SAVED` | software: R/W/X saved while access tracking has cleared them |
//! | 57    | `HOST_WRITABLE` | software: the host allows writes to the backing (not a read-only slot / CoW page) |
//! | 58    | `MMU_WRITABLE` | software: the MMU allows writes (clear while write-protected for dirty logging); a write fault on a present spte with it set can be fixed locklessly (fast page fault) |
//!
//! The CPU ignores bits 11 and 52-62 of EPT entries (bit 63 is
//! suppress-#VE, left clear), so the software bits never change translation.
//! `NO_OVERLAP` below fails the build if two fields share a bit.

/// Hardware read permission.
pub const READ: u64 = 1 << 0;
/// Hardware write permission.
pub const WRITE: u64 = 1 << 1;
/// Hardware execute permission.
pub const EXEC: u64 = 1 << 2;
/// All three permissions.
pub const RWX: u64 = READ | WRITE | EXEC;
/// Memory type field of a leaf.
pub const MEMTYPE_MASK: u64 = 7 << 3;
/// Write-back memory type.
pub const MEMTYPE_WB: u64 = 6 << 3;
/// Ignore the guest PAT.
pub const IGNORE_PAT: u64 = 1 << 6;
/// Large-page leaf.
pub const HUGE: u64 = 1 << 7;
/// Accessed flag (hardware-set with EPT A/D).
pub const ACCESSED: u64 = 1 << 8;
/// Dirty flag (hardware-set with EPT A/D).
pub const DIRTY: u64 = 1 << 9;
/// Software: installed by the MMU.
pub const MMU_PRESENT: u64 = 1 << 11;
/// Host frame address.
pub const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;
/// Software: R/W/X saved by access tracking.
pub const ACC_TRACK_SAVED_SHIFT: u32 = 52;
/// See [`ACC_TRACK_SAVED_SHIFT`].
pub const ACC_TRACK_SAVED_MASK: u64 = RWX << ACC_TRACK_SAVED_SHIFT;
/// Software: the host allows writes.
pub const HOST_WRITABLE: u64 = 1 << 57;
/// Software: the MMU allows writes.
pub const MMU_WRITABLE: u64 = 1 << 58;

/// Every field, for the overlap check.
const FIELDS: [u64; 14] = [
    READ,
    WRITE,
    EXEC,
    MEMTYPE_MASK,
    IGNORE_PAT,
    HUGE,
    ACCESSED,
    DIRTY,
    MMU_PRESENT,
    ADDR_MASK,
    ACC_TRACK_SAVED_MASK,
    HOST_WRITABLE,
    MMU_WRITABLE,
    // Suppress-#VE: hardware, must stay clear; listed so nothing reuses it.
    1 << 63,
];

const fn fields_are_disjoint(fields: &[u64]) -> bool {
    let mut i = 0;
    while i < fields.len() {
        let mut j = i + 1;
        while j < fields.len() {
            if fields[i] & fields[j] != 0 {
                return false;
            }
            j += 1;
        }
        i += 1;
    }
    true
}

/// Compile-time proof that no two spte fields overlap.
const NO_OVERLAP: () = assert!(fields_are_disjoint(&FIELDS));
#[allow(clippy::let_unit_value)]
const _: () = NO_OVERLAP;

/// Software bits agree with what the CPU ignores: 11 and 52..=62.
const _: () = {
    let software = MMU_PRESENT | ACC_TRACK_SAVED_MASK | HOST_WRITABLE | MMU_WRITABLE;
    let ignored_by_cpu = (1 << 11) | (0x7ff << 52);
    assert!(software & !ignored_by_cpu == 0);
};

/// A non-leaf entry pointing at the table in `table_hpa`: all permissions
/// (the leaf decides), marked present.
pub const fn make_nonleaf(table_hpa: u64) -> u64 {
    (table_hpa & ADDR_MASK) | RWX | MMU_PRESENT
}

/// A 4 KiB leaf mapping `frame_hpa`. `writable` sets hardware W and both
/// software writable bits.
pub const fn make_leaf(frame_hpa: u64, writable: bool, executable: bool) -> u64 {
    let mut spte = (frame_hpa & ADDR_MASK) | READ | MEMTYPE_WB | IGNORE_PAT | MMU_PRESENT;
    if writable {
        spte |= WRITE | HOST_WRITABLE | MMU_WRITABLE;
    }
    if executable {
        spte |= EXEC;
    }
    spte
}

/// Whether the MMU installed this entry.
pub const fn is_present(spte: u64) -> bool {
    spte & MMU_PRESENT != 0
}

/// The host address the entry points at.
pub const fn hpa(spte: u64) -> u64 {
    spte & ADDR_MASK
}

/// The host frame the entry points at.
pub const fn frame(spte: u64) -> machine::Hfn {
    machine::Hpa(hpa(spte)).frame()
}

/// Writable implies MMU-writable implies host-writable (the spte invariant
/// dirty logging and the fast page fault rely on).
pub const fn writable_bits_consistent(spte: u64) -> bool {
    (spte & WRITE == 0 || spte & MMU_WRITABLE != 0)
        && (spte & MMU_WRITABLE == 0 || spte & HOST_WRITABLE != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_check_catches_a_shared_bit() {
        assert!(fields_are_disjoint(&FIELDS));
        assert!(!fields_are_disjoint(&[READ, RWX]));
    }

    #[test]
    fn leaf_layout() {
        let spte = make_leaf(0x1234_5000, true, false);
        assert!(is_present(spte));
        assert_eq!(hpa(spte), 0x1234_5000);
        assert_eq!(spte & RWX, READ | WRITE);
        assert_eq!(spte & MEMTYPE_MASK, MEMTYPE_WB);
        assert_ne!(spte & MMU_WRITABLE, 0);
        let ro = make_leaf(0x1000, false, true);
        assert_eq!(ro & (WRITE | HOST_WRITABLE | MMU_WRITABLE), 0);
        assert_eq!(
            machine::mmu::ept::epte::MEMTYPE_WB,
            MEMTYPE_WB,
            "hardware layout agrees with the machine's EPT walker"
        );
    }
}
