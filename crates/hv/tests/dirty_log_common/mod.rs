//! One pass of the `dirtywrite` test kernel (tests/guests/dirtywrite.c)
//! with dirty logging on, and the check that its collection holds every
//! page written: shared by the exactness tests (`dirty_log.rs`) and the
//! swapping ones (`dirty_log_swap.rs`).

#![allow(dead_code)] // each test file uses its own part

use abi::dirtywrite::{self, CTRL_GPA, REGION_BASE};
use hv::{Cycles, RunStatus, StopReason, Vm, RAM_SLOT};
use std::collections::BTreeSet;

pub const PAGE: u64 = 4096;

pub fn read_u64(vm: &mut Vm, gpa: u64) -> u64 {
    let mut b = [0u8; 8];
    vm.read_guest(hv::Gpa(gpa), &mut b).expect("guest memory");
    u64::from_le_bytes(b)
}

/// A tiny deterministic generator (xorshift) for the hv's own writes.
pub fn next(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// What one pass's collection held.
pub struct PassLog {
    /// Pages in the collected bitmap or harvested from the rings.
    pub logged: BTreeSet<u64>,
    /// Ring-full exits during the pass.
    pub ring_full_exits: u64,
}

/// Starts pass `pass` on `vcpus` vCPUs, runs it in `slice`s of virtual
/// time until every vCPU reports it done (harvesting full rings), checks
/// the MMU invariants and collects the log.
pub fn run_pass(vm: &mut Vm, pass: u64, vcpus: u64, slice: Cycles, case: &str) -> PassLog {
    vm.write_guest(hv::Gpa(CTRL_GPA + dirtywrite::GO), &pass.to_le_bytes())
        .expect("go");
    let mut logged = BTreeSet::new();
    let mut ring_full_exits = 0;
    loop {
        match vm.run_until(vm.time() + slice) {
            RunStatus::Running | RunStatus::Stopped(StopReason::DebugExit { status: 1 }) => {}
            RunStatus::DirtyRingFull => {
                ring_full_exits += 1;
                let h = vm.harvest_dirty_rings().expect("harvest");
                logged.extend(h.entries.iter().map(|e| e.offset));
            }
            RunStatus::Stopped(other) => panic!(
                "{case}: stopped: {other:?}\n{}",
                String::from_utf8_lossy(&vm.take_serial())
            ),
        }
        if (0..vcpus).all(|cpu| read_u64(vm, CTRL_GPA + dirtywrite::done(cpu)) >= pass) {
            break;
        }
    }
    vm.check_mmu().expect("MMU invariants");
    let collected = vm.collect_dirty_log(RAM_SLOT).expect("collect");
    logged.extend(collected.pages.iter().copied());
    PassLog {
        logged,
        ring_full_exits,
    }
}

/// Adds to `expected` every page of the regions (`pages` per vCPU) that
/// holds pass `pass`'s stamp, and the control block (the guest's done
/// words, the VMM's go), then asserts that `logged` holds them all.
pub fn assert_all_logged(
    vm: &mut Vm,
    expected: &mut BTreeSet<u64>,
    logged: &BTreeSet<u64>,
    pass: u64,
    vcpus: u64,
    pages: u64,
    case: &str,
) {
    let first = REGION_BASE / PAGE;
    for cpu in 0..vcpus {
        for i in 0..pages {
            let page = first + cpu * pages + i;
            if read_u64(vm, page * PAGE) == dirtywrite::stamp(pass, cpu) {
                expected.insert(page);
            }
        }
    }
    expected.insert(CTRL_GPA / PAGE);
    let missing: Vec<u64> = expected.difference(logged).copied().collect();
    assert!(
        missing.is_empty(),
        "{case} pass {pass}: {} written pages missing from the log: {missing:x?}",
        missing.len()
    );
}
