//! The fast page fault under shadow paging, stressed by random guest
//! page-table mutation (tests/guests/mmu/random.c: four address spaces
//! mapping, unmapping, remapping, protecting and ageing pages, a 2 MiB
//! large-page slot, CR0.WP / SMEP / SMAP toggles) while dirty logging
//! write-protects every page again every 300 000 cycles, so that writes
//! keep faulting on present, write-protected leaves: the fast path's case.
//!
//! Both shadow fast paths run: direct shadow pages only (modern KVM; the
//! large-page slot's leaves), and the seed's scheme for indirect pages as
//! well (`MmuOptions::seed_indirect`). Each must
//! - give the guest the same outcomes as EPT (the mutation kernel's digest
//!   of every access outcome, table entry and data frame);
//! - keep the shadow MMU's invariants and its audit against the guest's
//!   tables at every collection;
//! - log every page whose contents changed between two collections (no
//!   false negative; compared byte for byte with a copy of guest memory);
//! - fix faults on the fast path (and, with the seed's scheme, more of
//!   them: the indirect leaves' too).

mod mmu_common;

use hv::{Cycles, DirtyLogMode, MmuMode, RunStatus, StopReason, Vm, VmConfig, RAM_SLOT};
use mmu_common::{field, run, Env, MEM};

const RANDOM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mmu-random.elf"));
const PAGE: usize = 4096;
/// Virtual cycles between two collections.
const SLICE: u64 = 300_000;

/// What one logged run saw.
struct Logged {
    serial: String,
    fast_fixes: u64,
    collections: u64,
    /// Pages found changed between collections (each was in the log).
    changed_pages: u64,
}

fn memory(vm: &mut Vm) -> Vec<u8> {
    let mut mem = vec![0u8; MEM as usize];
    for (i, page) in mem.chunks_mut(PAGE).enumerate() {
        // A page the guest never touched reads as zeros either way.
        let _ = vm.read_guest(hv::Gpa((i * PAGE) as u64), page);
    }
    mem
}

fn run_logged(seed_indirect: bool) -> Logged {
    let config = VmConfig {
        vcpus: 1,
        mem_size: MEM,
        mmu: MmuMode::Shadow,
        quantum: 2000,
        mmu_options: hv::MmuOptions {
            fast_pf: true,
            ept_ad: true,
            seed_indirect,
        },
        ..VmConfig::default()
    };
    let mut vm = Vm::boot(&config, RANDOM).expect("boot");
    vm.enable_dirty_log(RAM_SLOT, DirtyLogMode::Bitmap)
        .expect("enable");
    let mut before = memory(&mut vm);
    let mut logged = Logged {
        serial: String::new(),
        fast_fixes: 0,
        collections: 0,
        changed_pages: 0,
    };
    loop {
        let status = vm.run_until(vm.time() + Cycles(SLICE));
        if let Err(e) = vm.check_mmu() {
            panic!("seed_indirect={seed_indirect}, at {:?}: {e}", vm.time());
        }
        let collected = vm.collect_dirty_log(RAM_SLOT).expect("collect");
        logged.collections += 1;
        let log: std::collections::BTreeSet<u64> = collected.pages.iter().copied().collect();
        let now = memory(&mut vm);
        for (i, (a, b)) in before.chunks(PAGE).zip(now.chunks(PAGE)).enumerate() {
            if a != b {
                logged.changed_pages += 1;
                assert!(
                    log.contains(&(i as u64)),
                    "seed_indirect={seed_indirect}: page {i:#x} changed since the last \
                     collection but is not in the log (collection {})",
                    logged.collections
                );
            }
        }
        before = now;
        match status {
            RunStatus::Running => {}
            RunStatus::Stopped(StopReason::DebugExit { status: 1 }) => break,
            other => panic!(
                "seed_indirect={seed_indirect}: {other:?}\n{}",
                String::from_utf8_lossy(&vm.take_serial())
            ),
        }
    }
    logged.serial = String::from_utf8_lossy(&vm.take_serial()).into_owned();
    logged.fast_fixes = vm.stats().vcpus.iter().map(|v| v.fast_pf_fixed).sum();
    logged
}

#[test]
fn shadow_fast_paths_keep_outcomes_invariants_and_the_log_through_random_mutation() {
    let ept = run(RANDOM, Env::Ept);
    let direct = run_logged(false);
    let seed = run_logged(true);
    for (name, r) in [("direct only", &direct), ("seed scheme", &seed)] {
        eprintln!(
            "{name}: {} fast fixes, {} collections, {} changed pages all logged",
            r.fast_fixes, r.collections, r.changed_pages
        );
        assert_eq!(
            field(&r.serial, "mmu-random:", "digest"),
            field(&ept, "mmu-random:", "digest"),
            "{name}: the guest saw other outcomes than under EPT:\n{}",
            mmu_common::first_difference(&r.serial, &ept)
        );
        assert!(r.collections > 10, "{name}: too short a run");
        assert!(r.changed_pages > 100, "{name}: nothing written?");
        assert!(
            r.fast_fixes > 0,
            "{name}: the fast path never fixed a fault"
        );
    }
    assert!(
        seed.fast_fixes > direct.fast_fixes,
        "the seed's scheme fixes indirect leaves too: {} vs {}",
        seed.fast_fixes,
        direct.fast_fixes
    );
}
