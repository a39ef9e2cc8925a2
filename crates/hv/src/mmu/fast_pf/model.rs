//! The loom model of the lockless spte protocol: the functions of
//! [`super::protocol`] themselves, run over loom's atomics, every
//! interleaving (within a preemption bound) explored.
//!
//! vCPUs run on one host thread in faultline, so none of these races
//! happens in a run; the model is the evidence that the protocol would
//! hold on a real SMP host. Each invariant is stated where it is checked
//! and in `docs/mmu.md` ("The fast page fault").

use super::protocol::{
    fast_fix, mark_access_tracked, seed_fast_fix, seed_write_protect, write_protect, zap, Access,
    FastFix, Identification, Layout, Protect, SpteCell,
};
use crate::mmu::spte;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

// loom 0.7 lets a plain store fall between the read and the write of a
// concurrent read-modify-write on the same atomic (tokio-rs/loom#254,
// #389), an interleaving no CPU allows; it reported lost dirty marks that
// cannot happen. So every write in the model is a read-modify-write: a
// store is a swap whose old value is dropped (the same on x86: a store
// and an `xchg` differ only in their fence).
impl SpteCell for AtomicU64 {
    fn load(&self) -> u64 {
        self.load(Ordering::SeqCst)
    }
    fn store(&self, value: u64) {
        self.swap(value, Ordering::SeqCst);
    }
    fn compare_exchange(&self, current: u64, new: u64) -> Result<u64, u64> {
        self.compare_exchange(current, new, Ordering::SeqCst, Ordering::SeqCst)
    }
    fn fetch_and(&self, mask: u64) -> u64 {
        self.fetch_and(mask, Ordering::SeqCst)
    }
    fn swap(&self, value: u64) -> u64 {
        self.swap(value, Ordering::SeqCst)
    }
    fn fence(&self) {
        loom::sync::atomic::fence(Ordering::SeqCst);
    }
}

/// Explores `f` with a preemption bound that keeps each model to seconds
/// while still reaching the races below (the seed's three-vCPU race needs
/// three preemptions).
fn explore(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

const WRITE: Access = Access {
    write: true,
    fetch: false,
};

/// A writable EPT leaf write-protected for dirty logging.
fn logged_leaf() -> u64 {
    spte::make_leaf(0x4000, true, true) & !spte::WRITE
}

/// One page's memory, its dirty-log bit, and the vCPU's guest mode.
struct LoggedPage {
    spte: AtomicU64,
    /// The dirty log (KVM's bitmap word for this page).
    logged: AtomicU64,
    /// Held while the vCPU runs guest code: a TLB flush waits for it (the
    /// IPI is acknowledged only when the vCPU has left guest mode), and a
    /// translation is cached only within one stint.
    guest_mode: Mutex<()>,
    /// 1 once the dirty-log clear has returned.
    clear_returned: AtomicU64,
    /// Writes that landed: 1 = before the clear returned, 2 = after.
    landed: AtomicU64,
}

impl LoggedPage {
    /// One guest write: with a writable translation it lands; without,
    /// the fast path fixes the spte and marks the page dirty (rule 3),
    /// and the vCPU tries again (twice at most, to bound the model).
    fn guest_write(&self) {
        for _ in 0..2 {
            {
                let _in_guest = self.guest_mode.lock().unwrap();
                if self.spte.load(Ordering::SeqCst) & spte::WRITE != 0 {
                    let after = self.clear_returned.load(Ordering::SeqCst);
                    self.landed.fetch_max(1 + after, Ordering::SeqCst);
                    return;
                }
            }
            if let FastFix::Fixed { dirtied: true, .. } = fast_fix(&self.spte, &Layout::EPT, WRITE)
            {
                // A swap, not a store: see the loom note above.
                self.logged.swap(1, Ordering::SeqCst);
            }
        }
    }

    /// KVM's get-and-clear: take the log, write-protect what it held,
    /// flush every vCPU's TLB. Returns the collected bit.
    fn get_and_clear(&self) -> u64 {
        let collected = self.logged.swap(0, Ordering::SeqCst);
        if collected != 0 {
            write_protect(&self.spte, &Layout::EPT, Protect::DirtyLog);
            drop(self.guest_mode.lock().unwrap());
        }
        self.clear_returned.store(1, Ordering::SeqCst);
        collected
    }
}

/// Invariant 1 (no write lands unlogged), with `writers` vCPUs writing
/// the page while the VMM collects its log: every write is in the log the
/// clear collected or in the log after it, and a write that lands after
/// the clear returned is in the log after it. `written`: the page was
/// already written since the last collection (its spte writable again,
/// the log has it); else it is write-protected when the vCPUs fault.
fn writers_versus_a_dirty_log_clear_lose_no_write(writers: usize, written: bool) {
    explore(move || {
        let page = Arc::new(LoggedPage {
            spte: AtomicU64::new(logged_leaf() | if written { spte::WRITE } else { 0 }),
            logged: AtomicU64::new(u64::from(written)),
            guest_mode: Mutex::new(()),
            clear_returned: AtomicU64::new(0),
            landed: AtomicU64::new(0),
        });
        let vcpus: Vec<_> = (0..writers)
            .map(|_| {
                let page = page.clone();
                thread::spawn(move || page.guest_write())
            })
            .collect();
        let collected = page.get_and_clear();
        for vcpu in vcpus {
            vcpu.join().unwrap();
        }
        let after = page.logged.load(Ordering::SeqCst);
        match page.landed.load(Ordering::SeqCst) {
            0 => {}
            1 => assert!(
                collected == 1 || after == 1,
                "a write missing from both logs"
            ),
            _ => assert_eq!(after, 1, "a write after the clear is missing from the log"),
        }
    });
}

/// Invariant 1: one vCPU, the page already written since the last
/// collection.
#[test]
fn fast_fix_versus_dirty_log_clear_loses_no_write() {
    writers_versus_a_dirty_log_clear_lose_no_write(1, true);
}

/// Invariant 1 with the page write-protected when the vCPUs fault: two
/// vCPUs race the fast fix with each other and with a collection.
#[test]
fn two_fast_fixes_and_a_clear_lose_no_write() {
    writers_versus_a_dirty_log_clear_lose_no_write(2, false);
}

/// Invariant 2 (no resurrection): once a zap has cleared the spte, a fast
/// fix that read it before cannot bring it back; a fix that landed first
/// is in the value the zap returns (so its dirtiness reaches the rmap).
#[test]
fn fast_fix_versus_zap_never_resurrects() {
    explore(|| {
        let cell = Arc::new(AtomicU64::new(logged_leaf()));
        let vcpu = {
            let cell = cell.clone();
            thread::spawn(move || fast_fix(&*cell, &Layout::EPT, WRITE))
        };
        let zapped = zap(&*cell);
        let fixed = vcpu.join().unwrap();
        assert_eq!(cell.load(Ordering::SeqCst), 0, "a zapped spte came back");
        if let FastFix::Fixed { new, .. } = fixed {
            assert_eq!(zapped, new, "the zap did not see the fix before it");
        }
    });
}

/// Invariant 3 (access tracking keeps sptes well-formed and writes
/// logged): aging races a write fix; the leaf is always either tracked
/// (no R/W/X, R/X saved) or live (nothing saved), keeps its frame, and W
/// is only ever set together with a dirty mark.
#[test]
fn fast_fix_versus_access_tracking_keeps_sptes_well_formed() {
    explore(|| {
        let leaf = spte::make_leaf(0x4000, true, true);
        let cell = Arc::new(AtomicU64::new(leaf));
        let vcpu = {
            let cell = cell.clone();
            thread::spawn(move || fast_fix(&*cell, &Layout::EPT, WRITE))
        };
        let aged = mark_access_tracked(&*cell, &Layout::EPT);
        let fixed = vcpu.join().unwrap();
        let end = cell.load(Ordering::SeqCst);
        assert_eq!(spte::hpa(end), 0x4000);
        let saved = end & spte::ACC_TRACK_SAVED_MASK;
        if Layout::EPT.is_access_tracked(end) {
            assert_eq!(
                saved >> spte::ACC_TRACK_SAVED_SHIFT,
                spte::READ | spte::EXEC
            );
        } else {
            assert_eq!(saved, 0, "a live spte kept saved bits");
            assert_eq!(end & (spte::READ | spte::EXEC), spte::READ | spte::EXEC);
        }
        if end & spte::WRITE != 0 {
            assert!(
                aged.is_none() || matches!(fixed, FastFix::Fixed { dirtied: true, .. }),
                "W came back after aging without the page being dirtied"
            );
        }
    });
}

/// The seed's scheme: vCPUs 0 and 2 take the fast path on an indirect
/// shadow page while vCPU 1 write-protects it; after
/// everything, fails if the spte is writable (the write-protection lost).
fn seed_race(ids: [Identification; 2]) {
    let layout = Layout::SHADOW;
    let leaf = 0x4000 | layout.present | 1 | layout.mmu_writable;
    let cell = Arc::new(AtomicU64::new(leaf));
    let protected = Arc::new(AtomicU64::new(0));
    let fast: Vec<_> = ids
        .into_iter()
        .map(|who| {
            let (cell, protected) = (cell.clone(), protected.clone());
            thread::spawn(move || {
                seed_fast_fix(&*cell, &*protected, &layout, who);
            })
        })
        .collect();
    seed_write_protect(&*cell, &*protected, &layout);
    for f in fast {
        f.join().unwrap();
    }
    assert_eq!(
        cell.load(Ordering::SeqCst) & layout.write,
        0,
        "the spte is writable after the write-protect path returned"
    );
}

/// Invariant 4 (the seed's identification): with each vCPU's own id in
/// the spte, no interleaving of two fast paths and the write-protect path
/// leaves the spte writable.
#[test]
fn seed_scheme_with_vcpu_ids_survives_the_three_vcpu_race() {
    explore(|| {
        seed_race([
            Identification::of_vcpu(0).unwrap(),
            Identification::of_vcpu(2).unwrap(),
        ])
    });
}

/// With one identification bit shared by every vCPU, loom finds the
/// seed's "OOPS": vCPU 2 re-sets the bit the write-protect path cleared,
/// and vCPU 0's exchange, expecting its own tag, succeeds.
#[test]
#[should_panic(expected = "writable after the write-protect path")]
fn seed_scheme_with_a_shared_bit_loses_the_three_vcpu_race() {
    explore(|| seed_race([Identification::SharedBit, Identification::SharedBit]));
}

/// Without the identification step the write-protect path's check finds
/// nothing to clear while a fast path is between its flag check and its
/// exchange: two threads suffice.
#[test]
#[should_panic(expected = "writable after the write-protect path")]
fn seed_scheme_without_identification_loses_to_one_fast_path() {
    explore(|| {
        let layout = Layout::SHADOW;
        let cell = Arc::new(AtomicU64::new(0x4000 | layout.present | 1));
        let protected = Arc::new(AtomicU64::new(0));
        let fast = {
            let (cell, protected) = (cell.clone(), protected.clone());
            thread::spawn(move || {
                seed_fast_fix(&*cell, &*protected, &layout, Identification::Disabled);
            })
        };
        seed_write_protect(&*cell, &*protected, &layout);
        fast.join().unwrap();
        assert_eq!(
            cell.load(Ordering::SeqCst) & layout.write,
            0,
            "the spte is writable after the write-protect path returned"
        );
    });
}
