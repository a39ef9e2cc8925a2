//! Dirty-log exactness (issue 11's acceptance): several vCPUs write a
//! pseudo-random set of pages (tests/guests/dirtywrite.c) and the hv
//! itself writes others between passes; every collection must contain
//! every page written since the previous one. Under EPT and shadow, in
//! each collection mode, with logging turned off and on again between
//! passes. False negatives fail; false positives are counted and printed.
//!
//! Fast PF on and off: with it on, the logged pages' write faults are
//! fixed by the fast path (checked), which logs them: under EPT, and under
//! shadow through the guest's 2 MiB pages (direct shadow pages). PML (EPT
//! only) write-protects nothing, so it takes no such fault; a larger case
//! fills the vCPUs' 512-entry logs so PML-full exits happen.

mod dirty_log_common;

use abi::dirtywrite::REGION_BASE;
use dirty_log_common::{assert_all_logged, next, run_pass, PAGE};
use hv::{Cycles, DirtyLogError, DirtyLogMode, MmuMode, Vm, VmConfig, RAM_SLOT};
use std::collections::BTreeSet;

const ELF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/dirtywrite.elf"));
const VCPUS: u64 = 4;
const PAGES: u64 = 160;
const PASSES: u64 = 6;
/// The fast-page-fault settings to test (see the module comment).
const FAST_PF: [bool; 2] = [true, false];

fn config(mmu: MmuMode, fast_pf: bool) -> VmConfig {
    config_with(mmu, fast_pf, PAGES, 70, 1)
}

fn config_with(mmu: MmuMode, fast_pf: bool, pages: u64, wpct: u64, random: u8) -> VmConfig {
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
        cmdline: format!("pages={pages} passes={PASSES} wpct={wpct} random={random} seed=11"),
        ..VmConfig::default()
    }
}

/// What one case found.
#[derive(Debug, Default)]
struct Outcome {
    written: u64,
    false_positives: u64,
    ring_full_exits: u64,
    /// Write faults the fast page fault fixed.
    fast_fixes: u64,
    /// PML-full exits (all vCPUs).
    pml_full_exits: u64,
}

/// Runs the workload in `mode`, checking each pass's collection.
fn run_case(mmu: MmuMode, mode: DirtyLogMode, fast_pf: bool) -> Outcome {
    run_case_with(config(mmu, fast_pf), PAGES, mode)
}

/// Runs `config`'s workload (`pages` per vCPU) in `mode`.
fn run_case_with(config: VmConfig, pages_per_vcpu: u64, mode: DirtyLogMode) -> Outcome {
    let pages = pages_per_vcpu;
    let mmu = config.mmu;
    let mut vm = Vm::boot(&config, ELF).expect("boot");
    let mut outcome = Outcome::default();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let region_pages = VCPUS * pages;
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
        let case = format!("{mmu:?}/{mode:?}");
        let log = run_pass(&mut vm, pass, VCPUS, Cycles(200_000), &case);
        outcome.ring_full_exits += log.ring_full_exits;
        let logged = log.logged;
        assert_all_logged(&mut vm, &mut expected, &logged, pass, VCPUS, pages, &case);
        outcome.written += expected.len() as u64;
        outcome.false_positives += logged.difference(&expected).count() as u64;
        if pass % 2 == 1 && pass != PASSES {
            vm.disable_dirty_log(RAM_SLOT).expect("disable");
        }
    }
    let stats = vm.stats();
    outcome.fast_fixes = stats.vcpus.iter().map(|v| v.fast_pf_fixed).sum();
    outcome.pml_full_exits = stats
        .vcpus
        .iter()
        .filter_map(|v| v.exits.get("pml_full"))
        .map(|e| e.count)
        .sum();
    outcome
}

fn check_every_mode(mmu: MmuMode) {
    for fast_pf in FAST_PF {
        for mode in DirtyLogMode::ALL {
            if mode == DirtyLogMode::Pml && mmu != MmuMode::Ept {
                continue;
            }
            let o = run_case(mmu, mode, fast_pf);
            eprintln!(
                "{mmu:?} fast_pf={fast_pf} {mode:?}: {} pages written, all logged; \
                 {} false positives; {} ring-full exits",
                o.written, o.false_positives, o.ring_full_exits
            );
            assert!(o.written > PASSES * VCPUS * PAGES / 3, "{o:?}");
            // The fast path fixes the logged pages' write faults under EPT,
            // and under shadow too: this guest maps its memory with 2 MiB
            // pages, so its leaves are in direct shadow pages. PML leaves
            // the sptes writable: no write fault.
            let fast_expected = fast_pf && mode.write_protects();
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
fn pml_full_exits_lose_no_page() {
    // 1200 pages written in order per vCPU and pass: each vCPU's 512-entry
    // log fills twice a pass unless an exit drains it first.
    const BIG: u64 = 1200;
    for fast_pf in FAST_PF {
        let o = run_case_with(
            config_with(MmuMode::Ept, fast_pf, BIG, 100, 0),
            BIG,
            DirtyLogMode::Pml,
        );
        eprintln!(
            "Ept fast_pf={fast_pf} Pml, {BIG} pages per vCPU: {} pages written, all logged; \
             {} false positives; {} PML-full exits",
            o.written, o.false_positives, o.pml_full_exits
        );
        assert!(o.written >= PASSES * VCPUS * BIG, "{o:?}");
        assert!(o.pml_full_exits >= PASSES * VCPUS, "{o:?}");
        assert_eq!(o.fast_fixes, 0, "{o:?}");
    }
}

#[test]
fn pml_refuses_shadow_and_ept_ad_off() {
    let mut vm = Vm::boot(&config(MmuMode::Shadow, false), ELF).expect("boot");
    assert_eq!(
        vm.enable_dirty_log(RAM_SLOT, DirtyLogMode::Pml),
        Err(DirtyLogError::PmlNeedsEpt)
    );
    let mut no_ad = config(MmuMode::Ept, true);
    no_ad.mmu_options.ept_ad = false;
    let mut vm = Vm::boot(&no_ad, ELF).expect("boot");
    assert_eq!(
        vm.enable_dirty_log(RAM_SLOT, DirtyLogMode::Pml),
        Err(DirtyLogError::PmlNeedsEptAd)
    );
    // Nothing was turned on: the slot does not log.
    assert_eq!(
        vm.get_dirty_log(RAM_SLOT),
        Err(DirtyLogError::NotEnabled(RAM_SLOT))
    );
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

#[test]
fn pml_stays_on_while_a_slot_logs_in_pml_mode() {
    let mut vm = Vm::boot(&config(MmuMode::Ept, true), ELF).expect("boot");
    let pml_on = |vm: &Vm| -> Vec<bool> {
        vm.vcpus()
            .iter()
            .map(|v| v.cpu().vmx().expect("guest mode").pml_address.is_some())
            .collect()
    };
    assert!(pml_on(&vm).iter().all(|on| !on), "off at boot");
    let extra = hv::SlotId(5);
    vm.add_memslot(extra, hv::Gpa(64 << 20), 2 << 20, hv::SlotFlags::default())
        .expect("add");
    vm.enable_dirty_log(RAM_SLOT, DirtyLogMode::Pml)
        .expect("enable");
    vm.enable_dirty_log(extra, DirtyLogMode::Pml)
        .expect("enable");
    assert!(pml_on(&vm).iter().all(|&on| on));
    vm.disable_dirty_log(RAM_SLOT).expect("disable");
    assert!(
        pml_on(&vm).iter().all(|&on| on),
        "the other slot still logs"
    );
    vm.delete_memslot(extra).expect("delete");
    assert!(pml_on(&vm).iter().all(|on| !on), "no PML slot left");
}

/// The VMM's operations take virtual time one after another, and a ring
/// reset holds `mmu_lock` once per run of at most 64 pages, as KVM's
/// `kvm_reset_dirty_gfn` does per coalesced mask: a vCPU faulting during a
/// reset waits for one mask, not for the whole reset.
#[test]
fn a_ring_reset_holds_the_lock_per_64_pages_and_vmm_operations_follow_each_other() {
    use dirty_log_common::read_u64;
    let mut config = config_with(MmuMode::Ept, false, PAGES, 100, 0);
    // Rings that never fill in a pass: the harvest below gets every page.
    config.dirty_ring_size = 4096;
    let mut vm = Vm::boot(&config, ELF).expect("boot");
    let run_to_done = |vm: &mut Vm, pass: u64| {
        vm.write_guest(
            hv::Gpa(abi::dirtywrite::CTRL_GPA + abi::dirtywrite::GO),
            &pass.to_le_bytes(),
        )
        .expect("go");
        while !(0..VCPUS)
            .all(|cpu| read_u64(vm, abi::dirtywrite::CTRL_GPA + abi::dirtywrite::done(cpu)) >= pass)
        {
            let status = vm.run_until(vm.time() + Cycles(200_000));
            assert!(matches!(status, hv::RunStatus::Running), "{status:?}");
        }
    };
    run_to_done(&mut vm, 1);
    vm.enable_dirty_log(RAM_SLOT, DirtyLogMode::Ring)
        .expect("enable");
    // The VMM is busy until the enable returns; let the vCPUs run to then.
    let until = vm.vmm_now();
    assert!(until > vm.time(), "the enable took no time");
    vm.run_until(until);
    run_to_done(&mut vm, 2);
    let (start, locks_before) = (vm.vmm_now(), vm.stats().mmu_lock.acquisitions);
    let harvest = vm.harvest_dirty_rings().expect("harvest");
    let holds = vm.stats().mmu_lock.acquisitions - locks_before;
    let mut pages: Vec<u64> = harvest
        .entries
        .iter()
        .filter(|e| e.slot == RAM_SLOT)
        .map(|e| e.offset)
        .collect();
    pages.sort_unstable();
    pages.dedup();
    assert!(pages.len() as u64 >= VCPUS * PAGES, "{} pages", pages.len());
    let mut masks = 0;
    let mut rest = &pages[..];
    while let Some(&first) = rest.first() {
        rest = &rest[rest.partition_point(|&p| p < first + 64)..];
        masks += 1;
    }
    assert_eq!(holds, masks, "one hold per 64-page mask");
    assert_eq!(
        vm.vmm_now(),
        start + harvest.get.cycles + harvest.clear.cycles,
        "the reset follows the harvest's read of the rings"
    );
}

/// Manual protect: the clear starts when the get returned.
#[test]
fn a_manual_clear_starts_when_the_get_returned() {
    let mut vm = Vm::boot(&config(MmuMode::Ept, false), ELF).expect("boot");
    vm.enable_dirty_log(RAM_SLOT, DirtyLogMode::Manual)
        .expect("enable");
    let start = vm.vmm_now();
    let collected = vm.collect_dirty_log(RAM_SLOT).expect("collect");
    assert!(collected.get.cycles > Cycles::ZERO && collected.clear.cycles > Cycles::ZERO);
    assert_eq!(
        vm.vmm_now(),
        start + collected.get.cycles + collected.clear.cycles
    );
}
