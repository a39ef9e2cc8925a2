//! Dirty-log exactness (issue 11's acceptance): several vCPUs write a
//! pseudo-random set of pages (tests/guests/dirtywrite.c) and the hv
//! itself writes others between passes; every collection must contain
//! every page written since the previous one. Under EPT and shadow, in
//! each collection mode, with logging turned off and on again between
//! passes. False negatives fail; false positives are counted and printed.
//!
//! Fast PF on and off: with it on, the logged pages' write faults are
//! fixed by the fast path (checked), which logs them: under EPT, and under
//! shadow through the guest's 2 MiB pages (direct shadow pages).

use abi::dirtywrite::{self, CTRL_GPA, REGION_BASE};
use hv::{
    Cycles, DirtyLogError, DirtyLogMode, MmuMode, RunStatus, StopReason, Vm, VmConfig, RAM_SLOT,
};
use std::collections::BTreeSet;

const ELF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/dirtywrite.elf"));
const PAGE: u64 = 4096;
const VCPUS: u64 = 4;
const PAGES: u64 = 160;
const PASSES: u64 = 6;
/// The fast-page-fault settings to test (see the module comment).
const FAST_PF: [bool; 2] = [true, false];

fn config(mmu: MmuMode, fast_pf: bool) -> VmConfig {
    VmConfig {
        vcpus: VCPUS as u32,
        mem_size: 32 << 20,
        mmu,
        // Small rings, so they fill in a pass and the ring-full exit runs.
        dirty_ring_size: 128,
        mmu_options: hv::MmuOptions {
            fast_pf,
            ept_ad: true,
            seed_indirect: false,
        },
        cmdline: format!("pages={PAGES} passes={PASSES} wpct=70 random=1 seed=11"),
        ..VmConfig::default()
    }
}

fn read_u64(vm: &mut Vm, gpa: u64) -> u64 {
    let mut b = [0u8; 8];
    vm.read_guest(hv::Gpa(gpa), &mut b).expect("guest memory");
    u64::from_le_bytes(b)
}

/// A tiny deterministic generator for the hv's own writes.
fn next(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// What one case found.
#[derive(Debug, Default)]
struct Outcome {
    written: u64,
    false_positives: u64,
    ring_full_exits: u64,
    /// Write faults the fast page fault fixed.
    fast_fixes: u64,
}

/// Runs the workload in `mode`, checking each pass's collection.
fn run_case(mmu: MmuMode, mode: DirtyLogMode, fast_pf: bool) -> Outcome {
    let mut vm = Vm::boot(&config(mmu, fast_pf), ELF).expect("boot");
    let mut outcome = Outcome::default();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let region_pages = VCPUS * PAGES;
    let first_region_page = REGION_BASE / PAGE;
    for pass in 1..=PASSES {
        // Logging on; every other pass it was off in between.
        if pass == 1 || pass % 2 == 0 {
            vm.enable_dirty_log(RAM_SLOT, mode).expect("enable");
        }
        // The hv's own stores: pages of the regions this pass's guest
        // writes may or may not touch, stamped apart.
        let mut expected = BTreeSet::new();
        for _ in 0..8 {
            let page = first_region_page + next(&mut rng) % region_pages;
            let value = 0xfeed_0000_0000_0000 | pass;
            vm.write_guest(hv::Gpa(page * PAGE + 8), &value.to_le_bytes())
                .expect("hv write");
            expected.insert(page);
        }
        vm.write_guest(hv::Gpa(CTRL_GPA + dirtywrite::GO), &pass.to_le_bytes())
            .expect("go");
        let mut harvested = BTreeSet::new();
        loop {
            match vm.run_until(vm.time() + Cycles(200_000)) {
                RunStatus::Running => {}
                RunStatus::DirtyRingFull => {
                    outcome.ring_full_exits += 1;
                    let h = vm.harvest_dirty_rings().expect("harvest");
                    harvested.extend(h.entries.iter().map(|e| e.offset));
                }
                RunStatus::Stopped(StopReason::DebugExit { status: 1 }) => {}
                RunStatus::Stopped(other) => panic!(
                    "{mmu:?}/{mode:?}: stopped: {other:?}\n{}",
                    String::from_utf8_lossy(&vm.take_serial())
                ),
            }
            let done =
                (0..VCPUS).all(|cpu| read_u64(&mut vm, CTRL_GPA + dirtywrite::done(cpu)) >= pass);
            if done {
                break;
            }
        }
        vm.check_mmu().expect("MMU invariants");
        let collected = vm.collect_dirty_log(RAM_SLOT).expect("collect");
        let logged: BTreeSet<u64> = collected.pages.iter().copied().chain(harvested).collect();
        for cpu in 0..VCPUS {
            for i in 0..PAGES {
                let page = first_region_page + cpu * PAGES + i;
                if read_u64(&mut vm, page * PAGE) == dirtywrite::stamp(pass, cpu) {
                    expected.insert(page);
                }
            }
        }
        // The control block: the guest's done words, the VMM's go.
        expected.insert(CTRL_GPA / PAGE);
        let missing: Vec<u64> = expected.difference(&logged).copied().collect();
        assert!(
            missing.is_empty(),
            "{mmu:?}/{mode:?} pass {pass}: {} written pages missing from the log: {missing:x?}",
            missing.len()
        );
        outcome.written += expected.len() as u64;
        outcome.false_positives += logged.difference(&expected).count() as u64;
        if pass % 2 == 1 && pass != PASSES {
            vm.disable_dirty_log(RAM_SLOT).expect("disable");
        }
    }
    outcome.fast_fixes = vm.stats().vcpus.iter().map(|v| v.fast_pf_fixed).sum();
    outcome
}

fn check_every_mode(mmu: MmuMode) {
    for fast_pf in FAST_PF {
        for mode in [
            DirtyLogMode::Bitmap,
            DirtyLogMode::Manual,
            DirtyLogMode::Ring,
        ] {
            let o = run_case(mmu, mode, fast_pf);
            eprintln!(
                "{mmu:?} fast_pf={fast_pf} {mode:?}: {} pages written, all logged; \
                 {} false positives; {} ring-full exits",
                o.written, o.false_positives, o.ring_full_exits
            );
            assert!(o.written > PASSES * VCPUS * PAGES / 3, "{o:?}");
            // The fast path fixes the logged pages' write faults under EPT,
            // and under shadow too: this guest maps its memory with 2 MiB
            // pages, so its leaves are in direct shadow pages.
            let fast_expected = fast_pf;
            assert_eq!(o.fast_fixes > 0, fast_expected, "{o:?}");
            if mode == DirtyLogMode::Ring {
                assert!(o.ring_full_exits > 0, "the rings never filled: {o:?}");
            }
        }
    }
}

#[test]
fn every_written_page_is_logged_under_ept() {
    check_every_mode(MmuMode::Ept);
}

#[test]
fn every_written_page_is_logged_under_shadow() {
    check_every_mode(MmuMode::Shadow);
}

#[test]
fn bad_requests_are_refused_cleanly() {
    let mut vm = Vm::boot(&config(MmuMode::Shadow, false), ELF).expect("boot");
    assert_eq!(
        vm.get_dirty_log(RAM_SLOT),
        Err(DirtyLogError::NotEnabled(RAM_SLOT))
    );
    assert_eq!(
        vm.enable_dirty_log(RAM_SLOT, DirtyLogMode::Pml),
        Err(DirtyLogError::PmlNeedsEpt)
    );
    vm.enable_dirty_log(RAM_SLOT, DirtyLogMode::Bitmap).unwrap();
    assert_eq!(
        vm.enable_dirty_log(RAM_SLOT, DirtyLogMode::Ring),
        Err(DirtyLogError::AlreadyEnabled(RAM_SLOT))
    );
    assert!(matches!(
        vm.clear_dirty_log(RAM_SLOT, 0, 1),
        Err(DirtyLogError::WrongMode { .. })
    ));
    vm.disable_dirty_log(RAM_SLOT).unwrap();
    vm.enable_dirty_log(RAM_SLOT, DirtyLogMode::Manual).unwrap();
    assert!(matches!(
        vm.clear_dirty_log(RAM_SLOT, 1, u64::MAX),
        Err(DirtyLogError::BadRange { .. })
    ));
    assert_eq!(
        vm.enable_dirty_log(hv::SlotId(9), DirtyLogMode::Bitmap),
        Err(DirtyLogError::NoSuchSlot(hv::SlotId(9)))
    );
}
