//! The lockless protocol from real host threads: the same functions the
//! hv and the loom model run, on `std` atomics, with vCPU threads writing
//! while a collector harvests the dirty log as a live migration does.
//! Where loom explores every interleaving of a tiny case, this runs
//! millions of operations on many pages; the check is the one migration
//! needs: after the last collection, the collector's copy of every page
//! equals the page.

use super::protocol::{
    fast_fix, seed_fast_fix, seed_write_protect, write_protect, Access, FastFix, Identification,
    Layout, Protect,
};
use crate::mmu::spte;
use rand::{RngExt, SeedableRng};
use rand_xorshift::XorShiftRng;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;

const PAGES: usize = 64;
const VCPUS: usize = 4;
const ROUNDS: usize = 200;

struct Guest {
    sptes: Vec<AtomicU64>,
    memory: Vec<AtomicU64>,
    logged: Vec<AtomicU64>,
    /// One per vCPU, held while it runs guest code (see `super::model`).
    guest_mode: Vec<Mutex<()>>,
    stop: AtomicBool,
    /// Writes that landed, so the collector can pace itself on progress
    /// rather than on time.
    writes: AtomicU64,
}

impl Guest {
    /// vCPU `id` writes increasing values to random pages until told to
    /// stop, fixing write faults on the fast path.
    fn run_vcpu(&self, id: usize) {
        let mut rng = XorShiftRng::seed_from_u64(id as u64 + 1);
        let write = Access {
            write: true,
            fetch: false,
        };
        let mut value = (id as u64) << 48;
        while !self.stop.load(Ordering::SeqCst) {
            // Let a waiting flush in between stints (std's mutex is not
            // fair: without this the collector starves on 2 cores).
            thread::yield_now();
            let _in_guest = self.guest_mode[id].lock().unwrap();
            for _ in 0..16 {
                let page = rng.random_range(0..PAGES);
                if self.sptes[page].load(Ordering::SeqCst) & spte::WRITE != 0 {
                    value += 1;
                    self.memory[page].store(value, Ordering::SeqCst);
                    self.writes.fetch_add(1, Ordering::SeqCst);
                    continue;
                }
                // The write faults: leave guest mode for the fast path.
                drop(_in_guest);
                if let FastFix::Fixed { dirtied: true, .. } =
                    fast_fix(&self.sptes[page], &Layout::EPT, write)
                {
                    self.logged[page].store(1, Ordering::SeqCst);
                }
                break;
            }
        }
    }

    /// Get-and-clear, then copy what it returned (KVM's order: the copy
    /// is made after the clear and its flush).
    fn collect(&self, copy: &mut [u64]) {
        let dirty: Vec<usize> = (0..PAGES)
            .filter(|&p| self.logged[p].swap(0, Ordering::SeqCst) != 0)
            .collect();
        for &p in &dirty {
            write_protect(&self.sptes[p], &Layout::EPT, Protect::DirtyLog);
        }
        for vcpu in &self.guest_mode {
            drop(vcpu.lock().unwrap());
        }
        for p in dirty {
            copy[p] = self.memory[p].load(Ordering::SeqCst);
        }
    }
}

#[test]
fn host_threads_racing_the_fast_fix_with_collections_lose_no_write() {
    let guest = Guest {
        sptes: (0..PAGES)
            .map(|p| {
                AtomicU64::new(spte::make_leaf((p as u64 + 1) << 12, true, true) & !spte::WRITE)
            })
            .collect(),
        memory: (0..PAGES).map(|_| AtomicU64::new(0)).collect(),
        logged: (0..PAGES).map(|_| AtomicU64::new(0)).collect(),
        guest_mode: (0..VCPUS).map(|_| Mutex::new(())).collect(),
        stop: AtomicBool::new(false),
        writes: AtomicU64::new(0),
    };
    let mut copy = vec![0u64; PAGES];
    thread::scope(|s| {
        for id in 0..VCPUS {
            let guest = &guest;
            s.spawn(move || guest.run_vcpu(id));
        }
        for round in 1..=ROUNDS as u64 {
            // At least 8 writes between collections.
            while guest.writes.load(Ordering::SeqCst) < round * 8 {
                thread::yield_now();
            }
            guest.collect(&mut copy);
        }
        guest.stop.store(true, Ordering::SeqCst);
    });
    guest.collect(&mut copy);
    let lost: Vec<usize> = (0..PAGES)
        .filter(|&p| copy[p] != guest.memory[p].load(Ordering::SeqCst))
        .collect();
    assert!(
        lost.is_empty(),
        "writes missing from every log: pages {lost:?}"
    );
    let written = (0..PAGES)
        .filter(|&p| guest.memory[p].load(Ordering::SeqCst) != 0)
        .count();
    // 1600 writes or more from four seeded sequences: one of them made
    // 400, which cover most of the 64 pages.
    assert!(written > PAGES / 2, "only {written} pages written");
}

#[test]
fn host_threads_racing_the_seed_scheme_never_leave_a_protected_spte_writable() {
    let layout = Layout::SHADOW;
    let leaf = 0x4000 | layout.present | 1 | layout.mmu_writable;
    let cell = AtomicU64::new(leaf);
    let protected = AtomicU64::new(0);
    let start = Barrier::new(VCPUS + 1);
    let end = Barrier::new(VCPUS + 1);
    thread::scope(|s| {
        for id in 0..VCPUS {
            let (cell, protected, start, end) = (&cell, &protected, &start, &end);
            s.spawn(move || {
                let who = Identification::of_vcpu(id as u32).unwrap();
                for _ in 0..ROUNDS * 10 {
                    start.wait();
                    seed_fast_fix(cell, protected, &layout, who);
                    end.wait();
                }
            });
        }
        for round in 0..ROUNDS * 10 {
            cell.store(leaf, Ordering::SeqCst);
            protected.store(0, Ordering::SeqCst);
            start.wait();
            // Let the fast paths get ahead on some rounds.
            for _ in 0..round % 64 {
                std::hint::spin_loop();
            }
            seed_write_protect(&cell, &protected, &layout);
            end.wait();
            assert_eq!(
                cell.load(Ordering::SeqCst) & layout.write,
                0,
                "round {round}: writable after the write-protect path"
            );
        }
    });
}
