//! Dirty logging while the overcommit pager evicts and swaps pages back in
//! (issue 11: nothing written may be missing from a dirty log, ever).
//! Two vCPUs write pseudo-random pages of regions larger than the host
//! memory given to the guest (tests/guests/dirtywrite.c), so pages
//! written since the last collection are evicted (their sptes zapped,
//! their contents written to swap) and faulted back in before the
//! collection. Every page the guest stamped in a pass, and every page the
//! hv wrote between passes, must be in that pass's collection: under EPT
//! and shadow, fast PF on and off (bitmap), and the ring once.

mod dirty_log_common;

use abi::dirtywrite::REGION_BASE;
use dirty_log_common::{assert_all_logged, next, run_pass, PAGE};
use hv::{Cycles, DirtyLogMode, MmuMode, Vm, VmConfig, RAM_SLOT};
use std::collections::BTreeSet;

const ELF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/dirtywrite.elf"));
const VCPUS: u64 = 2;
/// 2 x 768 pages = 6 MiB touched per pass, on 4 MiB of host memory.
const PAGES: u64 = 768;
const PASSES: u64 = 3;

fn config(mmu: MmuMode, fast_pf: bool) -> VmConfig {
    VmConfig {
        vcpus: VCPUS as u32,
        mem_size: 32 << 20,
        host_mem: Some(hv::MIN_HOST_MEM),
        mmu,
        dirty_ring_size: 512,
        mmu_options: hv::MmuOptions {
            fast_pf,
            ept_ad: true,
            seed_indirect: false,
        },
        cmdline: format!("pages={PAGES} passes={PASSES} wpct=70 random=1 seed=5"),
        ..VmConfig::default()
    }
}

/// Runs every pass with logging on; returns (pages checked, swap-ins,
/// evictions).
fn run_case(mmu: MmuMode, mode: DirtyLogMode, fast_pf: bool) -> (u64, u64, u64) {
    let case = format!("{mmu:?}/{mode:?}/fast_pf={fast_pf}");
    let mut vm = Vm::boot(&config(mmu, fast_pf), ELF).expect("boot");
    vm.enable_dirty_log(RAM_SLOT, mode).expect("enable");
    let first = REGION_BASE / PAGE;
    let mut checked = 0;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    for pass in 1..=PASSES {
        // The hv's own stores, into pages that may be on swap right now.
        let mut expected = BTreeSet::new();
        for _ in 0..16 {
            let page = first + next(&mut rng) % (VCPUS * PAGES);
            vm.write_guest(hv::Gpa(page * PAGE + 16), &pass.to_le_bytes())
                .expect("hv write");
            expected.insert(page);
        }
        let log = run_pass(&mut vm, pass, VCPUS, Cycles(500_000), &case);
        assert_all_logged(
            &mut vm,
            &mut expected,
            &log.logged,
            pass,
            VCPUS,
            PAGES,
            &case,
        );
        checked += expected.len() as u64;
    }
    let pager = vm.stats().pager;
    (checked, pager.swap_ins, pager.evictions)
}

#[test]
fn no_written_page_is_missing_from_the_log_while_the_pager_swaps() {
    // Bitmap everywhere; the ring (whose marks go to the running vCPU's
    // ring, the hv's own to the bitmap) once.
    let mut cases: Vec<(MmuMode, DirtyLogMode, bool)> = Vec::new();
    for mmu in [MmuMode::Ept, MmuMode::Shadow] {
        for fast_pf in [true, false] {
            cases.push((mmu, DirtyLogMode::Bitmap, fast_pf));
        }
    }
    cases.push((MmuMode::Shadow, DirtyLogMode::Ring, true));
    for (mmu, mode, fast_pf) in cases {
        {
            {
                let (checked, swap_ins, evictions) = run_case(mmu, mode, fast_pf);
                eprintln!(
                    "{mmu:?}/{mode:?}/fast_pf={fast_pf}: {checked} written pages all logged; \
                     {evictions} evictions, {swap_ins} swap-ins"
                );
                assert!(checked > PASSES * VCPUS * PAGES / 2, "{checked}");
                // The pager really moved written pages out and back.
                assert!(
                    evictions > 300 && swap_ins > 300,
                    "{evictions} / {swap_ins}"
                );
            }
        }
    }
}
