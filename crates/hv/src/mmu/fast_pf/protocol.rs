//! The lockless spte protocol: every change the fast page fault makes to
//! an spte without `mmu_lock`, and every change the locked paths make
//! that the fast path can race with, as small functions over an atomic
//! cell ([`SpteCell`]).
//!
//! The same functions run on the sptes in machine memory (through
//! `std::sync::atomic::AtomicU64`), under the loom model checker (through
//! loom's atomics, `super::model`) and from racing host threads
//! (`super::stress`), so what the model proves is what the hv runs.
//!
//! The rules (KVM's `Documentation/virt/kvm/locking.rst`, adapted):
//! 1. Without `mmu_lock`, an spte only changes by compare-and-exchange
//!    from a value read before: a lockless writer never overwrites a
//!    change it did not see.
//! 2. The fast path only adds permissions (restores access-tracked R/X,
//!    sets W), and only on a present spte; it never changes the frame and
//!    never makes a not-present spte present, so it cannot resurrect a
//!    zapped one.
//! 3. W is set without the lock only when `MMU_WRITABLE` is set, and the
//!    fixing vCPU marks the page dirty after its compare-and-exchange
//!    succeeds and before it enters the guest again.
//! 4. Every locked change that removes W (write-protection, dirty-log
//!    clear, access tracking, zap) is one atomic read-modify-write, so a
//!    concurrent fast fix either lands before it (and is undone by it) or
//!    fails its compare-and-exchange.
//! 5. Write-protection for the shadow MMU's page tracker clears
//!    `MMU_WRITABLE` too; dirty logging clears W only (the fast path may
//!    restore it, logging the page).
//!
//! The seed's own scheme for indirect shadow pages (2012, before sptes had
//! an MMU-writable bit the fast path could trust) is here too:
//! [`seed_fast_fix`] and [`seed_write_protect`], with the identification
//! step switchable ([`Identification`]) so the model can show why the
//! vCPU id is needed.

/// An spte (or a flag word) the protocol reads and changes atomically.
/// Every operation is sequentially consistent: the fast path relies on
/// its compare-and-exchange being a full barrier, as x86's `lock cmpxchg`
/// is.
pub(crate) trait SpteCell {
    fn load(&self) -> u64;
    fn store(&self, value: u64);
    /// Replaces `current` with `new`; the value found on failure.
    fn compare_exchange(&self, current: u64, new: u64) -> Result<u64, u64>;
    /// Clears the bits not in `mask`, returning the old value.
    fn fetch_and(&self, mask: u64) -> u64;
    /// Replaces the value, returning the old one.
    fn swap(&self, value: u64) -> u64;
    /// A full memory barrier (`smp_mb()`).
    fn fence(&self);
}

impl SpteCell for std::sync::atomic::AtomicU64 {
    fn load(&self) -> u64 {
        self.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn store(&self, value: u64) {
        self.store(value, std::sync::atomic::Ordering::SeqCst);
    }
    fn compare_exchange(&self, current: u64, new: u64) -> Result<u64, u64> {
        use std::sync::atomic::Ordering::SeqCst;
        self.compare_exchange(current, new, SeqCst, SeqCst)
    }
    fn fetch_and(&self, mask: u64) -> u64 {
        self.fetch_and(mask, std::sync::atomic::Ordering::SeqCst)
    }
    fn swap(&self, value: u64) -> u64 {
        self.swap(value, std::sync::atomic::Ordering::SeqCst)
    }
    fn fence(&self) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}

/// Where an MMU's sptes keep what the protocol looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Software: installed by the MMU (present even when access tracking
    /// has cleared every permission).
    pub present: u64,
    /// Hardware: reads allowed (zero for x86 PTEs, where present is read).
    pub read: u64,
    /// Hardware: writes allowed.
    pub write: u64,
    /// Hardware: fetches allowed (EPT's X; zero where `no_exec` rules).
    pub exec: u64,
    /// Hardware: fetches forbidden (the x86 PTE's NX; zero under EPT).
    pub no_exec: u64,
    /// Software: the MMU allows writes.
    pub mmu_writable: u64,
    /// Access tracking: where R and X are saved while cleared (`None`:
    /// this MMU never access-tracks; its CPU keeps accessed bits).
    pub saved_shift: Option<u32>,
}

impl Layout {
    /// EPT leaves (see `super::super::spte`); access tracking when the
    /// EPTP leaves A/D flags off.
    pub const EPT: Layout = {
        use super::super::spte;
        Layout {
            present: spte::MMU_PRESENT,
            read: spte::READ,
            write: spte::WRITE,
            exec: spte::EXEC,
            no_exec: 0,
            mmu_writable: spte::MMU_WRITABLE,
            saved_shift: Some(spte::ACC_TRACK_SAVED_SHIFT),
        }
    };

    /// Shadow leaves (x86 PTEs, `super::super::shadow::spte`): the CPU
    /// sets accessed bits, so no access tracking.
    pub const SHADOW: Layout = {
        use super::super::shadow::spte;
        Layout {
            present: spte::MMU_PRESENT,
            read: 0,
            write: spte::WRITABLE,
            exec: 0,
            no_exec: spte::NX,
            mmu_writable: spte::MMU_WRITABLE,
            saved_shift: None,
        }
    };

    /// The hardware permissions access tracking clears.
    const fn tracked_perms(&self) -> u64 {
        self.read | self.write | self.exec
    }

    /// The permissions it saves: R and X. W is not saved: a write after
    /// access tracking faults again and W comes back from `mmu_writable`
    /// with the page marked dirty (rule 3), as KVM does.
    const fn saved_perms(&self) -> u64 {
        self.read | self.exec
    }

    /// Whether `spte` is an access-tracked leaf.
    pub const fn is_access_tracked(&self, spte: u64) -> bool {
        self.saved_shift.is_some() && spte & self.present != 0 && spte & self.tracked_perms() == 0
    }

    /// `spte` with access tracking undone (R/X back from the saved bits).
    const fn restore_access_tracked(&self, spte: u64) -> u64 {
        match self.saved_shift {
            Some(shift) => {
                let saved = (spte >> shift) & self.saved_perms();
                (spte & !(self.saved_perms() << shift)) | saved
            }
            None => spte,
        }
    }

    /// Whether `spte` allows `access` (KVM's `is_access_allowed`).
    pub const fn allows(&self, spte: u64, access: Access) -> bool {
        if spte & self.present == 0 || self.is_access_tracked(spte) {
            return false;
        }
        if access.write && spte & self.write == 0 {
            return false;
        }
        if access.fetch && (spte & self.no_exec != 0 || (self.exec != 0 && spte & self.exec == 0)) {
            return false;
        }
        self.read == 0 || spte & self.read != 0
    }
}

/// The access that faulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Access {
    pub write: bool,
    pub fetch: bool,
}

/// Why the fast path left a fault to the slow path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlowReason {
    /// No spte: the slow path must find the frame.
    NotPresent,
    /// A write to an spte the MMU keeps read-only (a read-only slot, a
    /// write-tracked guest page table, or the seed's write-protect flag).
    WriteProtected,
    /// The access needs more than restoring a bit (a fetch of a
    /// no-execute page).
    NotFixable,
    /// The compare-and-exchange lost [`MAX_RETRIES`] + 1 times in a row.
    Contended,
    /// A leaf of an indirect shadow page: its gfn is not fixed by its
    /// position, so (as modern KVM) the slow path handles it.
    Indirect,
}

/// What the fast path did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FastFix {
    /// The spte went from `old` to `new`. `dirtied`: W was set, so the
    /// caller marks the page dirty before the vCPU enters again.
    Fixed { old: u64, new: u64, dirtied: bool },
    /// The spte already allows the access (another vCPU fixed it, or the
    /// fault came from a TLB entry since flushed): just retry.
    Spurious,
    /// Take the slow path.
    Slow(SlowReason),
}

/// Retries after a lost compare-and-exchange before the fast path gives
/// up (KVM's `fast_page_fault` gives up after 4).
pub(crate) const MAX_RETRIES: u32 = 4;

/// The fast fix (KVM's `fast_page_fault` loop around
/// `fast_pf_fix_direct_spte`): restores what `access` needs on the spte
/// in `cell` by compare-and-exchange, or says why it cannot.
pub(crate) fn fast_fix(cell: &impl SpteCell, layout: &Layout, access: Access) -> FastFix {
    for _ in 0..=MAX_RETRIES {
        let old = cell.load();
        if old & layout.present == 0 {
            return FastFix::Slow(SlowReason::NotPresent);
        }
        if layout.allows(old, access) {
            return FastFix::Spurious;
        }
        let mut new = layout.restore_access_tracked(old);
        if access.write {
            if old & layout.mmu_writable == 0 {
                return FastFix::Slow(SlowReason::WriteProtected);
            }
            new |= layout.write;
        }
        if !layout.allows(new, access) {
            return FastFix::Slow(SlowReason::NotFixable);
        }
        if cell.compare_exchange(old, new).is_ok() {
            let dirtied = old & layout.write == 0 && new & layout.write != 0;
            return FastFix::Fixed { old, new, dirtied };
        }
    }
    FastFix::Slow(SlowReason::Contended)
}

/// What a write-protection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protect {
    /// Dirty logging: clear W, keep `MMU_WRITABLE` (the fast path may
    /// restore W, logging the page).
    DirtyLog,
    /// The shadow MMU's page tracker: clear W and `MMU_WRITABLE` (writes
    /// must reach the slow path, which emulates them).
    PageTable,
}

/// Write-protects the spte in `cell` (KVM's `spte_write_protect`); the
/// caller holds `mmu_lock`. Returns the old value; if it had W, every
/// vCPU's TLB must be flushed before the protection counts (a cached
/// writable translation could still be used).
pub(crate) fn write_protect(cell: &impl SpteCell, layout: &Layout, why: Protect) -> u64 {
    let clear = match why {
        Protect::DirtyLog => layout.write,
        Protect::PageTable => layout.write | layout.mmu_writable,
    };
    cell.fetch_and(!clear)
}

/// Ages the spte in `cell` by access tracking (KVM's `mmu_spte_age` with
/// A/D bits off): clears R/W/X, saving R and X. Returns the old value (a
/// leaf not access-tracked already was used since the last aging; one
/// with W may have been written: the caller keeps that, as the CPU keeps
/// no dirty bit). `None`: nothing to age (not present, already tracked,
/// or this MMU does not access-track).
pub(crate) fn mark_access_tracked(cell: &impl SpteCell, layout: &Layout) -> Option<u64> {
    let shift = layout.saved_shift?;
    loop {
        let old = cell.load();
        if old & layout.present == 0 || layout.is_access_tracked(old) {
            return None;
        }
        let saved = (old & layout.saved_perms()) << shift;
        let new = (old & !layout.tracked_perms()) | saved;
        // Only the CPU (A/D off: nothing) and the fast path (which only
        // restores what this clears) change a leaf under the holder of
        // `mmu_lock`, so this settles after a retry or two.
        if cell.compare_exchange(old, new).is_ok() {
            return Some(old);
        }
    }
}

/// Zaps the spte in `cell`, returning the old value (the caller holds
/// `mmu_lock`, drops the rmap entry and flushes before freeing the
/// frame). A fast fix racing with it fails its compare-and-exchange
/// (rule 2).
pub(crate) fn zap(cell: &impl SpteCell) -> u64 {
    cell.swap(0)
}

/// The seed's identification: a vCPU tags the spte before checking the
/// write-protect flag, so the write-protect path, which clears the tag,
/// makes the vCPU's final compare-and-exchange fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Identification {
    /// The vCPU's own id (1-based) in the spte's id field: the seed's fix.
    VcpuId(u64),
    /// One bit shared by every vCPU: the seed's three-vCPU race ("OOPS").
    SharedBit,
    /// No tag at all: a plain read-check-modify race with the
    /// write-protect path.
    Disabled,
}

/// The id field of the seed's scheme: bits 52-56, which the CPU ignores
/// in x86 PTEs and the shadow spte leaves free (31 ids; vCPUs beyond take
/// the slow path, as the seed's 127 on the soft MMU).
pub(crate) const SEED_ID_SHIFT: u32 = 52;
/// See [`SEED_ID_SHIFT`].
pub(crate) const SEED_ID_MASK: u64 = 0x1f << SEED_ID_SHIFT;

impl Identification {
    /// The identification of vCPU `index` (0-based): its id, or `None` if
    /// the field cannot hold it.
    pub(crate) fn of_vcpu(index: u32) -> Option<Self> {
        let id = u64::from(index) + 1;
        (id <= SEED_ID_MASK >> SEED_ID_SHIFT).then_some(Identification::VcpuId(id))
    }

    fn tag(self) -> u64 {
        match self {
            Identification::VcpuId(id) => (id << SEED_ID_SHIFT) & SEED_ID_MASK,
            Identification::SharedBit => 1 << SEED_ID_SHIFT,
            Identification::Disabled => 0,
        }
    }
}

/// The seed's fast path for an indirect shadow page: `protected` is the
/// gfn's write-protect flag in the rmap (`PTE_LIST_WRITE_PROTECT`), set
/// by [`seed_write_protect`]. Only write faults on a present, read-only
/// spte are fixed.
pub(crate) fn seed_fast_fix(
    cell: &impl SpteCell,
    protected: &impl SpteCell,
    layout: &Layout,
    who: Identification,
) -> FastFix {
    for _ in 0..=MAX_RETRIES {
        let old = cell.load();
        if old & layout.present == 0 {
            return FastFix::Slow(SlowReason::NotPresent);
        }
        if old & layout.write != 0 {
            return FastFix::Spurious;
        }
        if protected.load() != 0 {
            return FastFix::Slow(SlowReason::WriteProtected);
        }
        // Set identification in the spte, then smp_mb(), then look at the
        // flag: either the write-protect path sees the tag (and clears
        // it, failing the exchange below), or this sees the flag.
        let tagged = (old & !SEED_ID_MASK) | who.tag();
        if tagged != old && cell.compare_exchange(old, tagged).is_err() {
            continue;
        }
        cell.fence();
        if protected.load() != 0 {
            return FastFix::Slow(SlowReason::WriteProtected);
        }
        let new = (tagged & !SEED_ID_MASK) | layout.write;
        if cell.compare_exchange(tagged, new).is_ok() {
            return FastFix::Fixed {
                old,
                new,
                dirtied: true,
            };
        }
    }
    FastFix::Slow(SlowReason::Contended)
}

/// The seed's write-protect path: set the flag, smp_mb(), then clear W
/// and any identification if either is there (a read-check-modify: the
/// check decides whether to write). Returns whether the spte changed.
pub(crate) fn seed_write_protect(
    cell: &impl SpteCell,
    protected: &impl SpteCell,
    layout: &Layout,
) -> bool {
    protected.store(1);
    protected.fence();
    let spte = cell.load();
    if spte & (layout.write | SEED_ID_MASK) != 0 {
        cell.fetch_and(!(layout.write | SEED_ID_MASK));
        true
    } else {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mmu::spte;
    use std::sync::atomic::AtomicU64;

    const WRITE: Access = Access {
        write: true,
        fetch: false,
    };
    const READ: Access = Access {
        write: false,
        fetch: false,
    };

    #[test]
    fn a_dirty_log_protected_spte_is_fixed_and_dirtied_then_spurious() {
        let leaf = spte::make_leaf(0x5000, true, true);
        let cell = AtomicU64::new(leaf);
        write_protect(&cell, &Layout::EPT, Protect::DirtyLog);
        assert!(matches!(
            fast_fix(&cell, &Layout::EPT, WRITE),
            FastFix::Fixed { dirtied: true, new, .. } if new == leaf
        ));
        assert_eq!(fast_fix(&cell, &Layout::EPT, WRITE), FastFix::Spurious);
    }

    #[test]
    fn a_page_table_protected_or_read_only_spte_goes_slow() {
        let cell = AtomicU64::new(spte::make_leaf(0x5000, true, true));
        write_protect(&cell, &Layout::EPT, Protect::PageTable);
        assert_eq!(
            fast_fix(&cell, &Layout::EPT, WRITE),
            FastFix::Slow(SlowReason::WriteProtected)
        );
        assert_eq!(fast_fix(&cell, &Layout::EPT, READ), FastFix::Spurious);
        let cell = AtomicU64::new(0);
        assert_eq!(
            fast_fix(&cell, &Layout::EPT, READ),
            FastFix::Slow(SlowReason::NotPresent)
        );
    }

    #[test]
    fn access_tracking_saves_r_and_x_drops_w_and_a_read_restores_without_w() {
        let leaf = spte::make_leaf(0x7000, true, true);
        let cell = AtomicU64::new(leaf);
        assert_eq!(mark_access_tracked(&cell, &Layout::EPT), Some(leaf));
        let tracked = cell.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(tracked & spte::RWX, 0);
        assert!(Layout::EPT.is_access_tracked(tracked));
        assert_eq!(spte::hpa(tracked), 0x7000);
        assert_eq!(mark_access_tracked(&cell, &Layout::EPT), None, "not young");
        assert!(matches!(
            fast_fix(&cell, &Layout::EPT, READ),
            FastFix::Fixed { dirtied: false, new, .. } if new == leaf & !spte::WRITE
        ));
        assert!(matches!(
            fast_fix(&cell, &Layout::EPT, WRITE),
            FastFix::Fixed { dirtied: true, new, .. } if new == leaf
        ));
        assert_eq!(mark_access_tracked(&cell, &Layout::SHADOW), None);
    }

    #[test]
    fn a_fetch_of_a_no_execute_shadow_page_is_not_fixable() {
        use crate::mmu::shadow::spte as s;
        let cell = AtomicU64::new(0x9000 | s::PRESENT | s::MMU_PRESENT | s::NX | s::MMU_WRITABLE);
        let fetch = Access {
            write: false,
            fetch: true,
        };
        assert_eq!(
            fast_fix(&cell, &Layout::SHADOW, fetch),
            FastFix::Slow(SlowReason::NotFixable)
        );
        assert!(matches!(
            fast_fix(&cell, &Layout::SHADOW, WRITE),
            FastFix::Fixed { dirtied: true, .. }
        ));
    }

    #[test]
    fn vcpu_ids_fit_the_field_and_the_seed_path_fixes_unless_protected() {
        assert_eq!(Identification::of_vcpu(0), Some(Identification::VcpuId(1)));
        assert_eq!(
            Identification::of_vcpu(30),
            Some(Identification::VcpuId(31))
        );
        assert_eq!(Identification::of_vcpu(31), None);
        let layout = Layout::SHADOW;
        let leaf = 0x9000 | layout.present | 1;
        let (cell, flag) = (AtomicU64::new(leaf), AtomicU64::new(0));
        let who = Identification::of_vcpu(3).unwrap();
        assert!(matches!(
            seed_fast_fix(&cell, &flag, &layout, who),
            FastFix::Fixed { new, .. } if new == leaf | layout.write
        ));
        assert!(seed_write_protect(&cell, &flag, &layout));
        assert_eq!(cell.load(std::sync::atomic::Ordering::Relaxed), leaf);
        assert_eq!(
            seed_fast_fix(&cell, &flag, &layout, who),
            FastFix::Slow(SlowReason::WriteProtected)
        );
    }
}
