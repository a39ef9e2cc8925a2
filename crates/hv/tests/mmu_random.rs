//! Random mutation (tests/guests/mmu/random.c): four address spaces whose
//! page tables change under an OS's flush discipline, with the flushes
//! hardware lets an OS leave out left out; every access outcome and the
//! final tables and memory go into a digest that must not depend on where
//! the guest ran, nor on what the TLB happened to cache.

mod mmu_common;

use mmu_common::{field, run, Env};

const RANDOM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mmu-random.elf"));
/// The same with another seed.
const RANDOM_SEED2: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mmu-random-seed2.elf"));
/// Flushes everything before every access: no cached translation is ever
/// used, so its digest is what the page tables alone say.
const PARANOID: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mmu-random-paranoid.elf"));
/// Leaves out the flushes the discipline requires before an access.
const SKIP_FLUSHES: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/mmu-random-skip-flushes.elf"));
/// The same switching address spaces through the paravirtual CR3 cache
/// where the hv offers it.
const RANDOM_CR3_CACHE: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/mmu-random-cr3-cache.elf"));
const SUMMARY: &str = "mmu-random:";

fn number(out: &str, key: &str) -> u64 {
    field(out, SUMMARY, key).parse().unwrap()
}

fn digest(out: &str) -> &str {
    field(out, SUMMARY, "digest")
}

/// Runs `elf` bare and under EPT: the same output, and the run exercises
/// what it claims.
fn assert_bare_and_ept_agree(elf: &[u8]) {
    let bare = run(elf, Env::Bare);
    let ept = run(elf, Env::Ept);
    eprintln!("bare: {}", bare.trim_end());
    eprintln!("ept:  {}", ept.trim_end());
    // The run exercises what it claims: faults and successes, flushes
    // forced before accesses, and accesses through unflushed changes.
    let accesses = number(&bare, "accesses");
    let faults = number(&bare, "faults");
    assert!(accesses > 4000, "{bare}");
    assert!(
        faults > accesses / 20 && faults < accesses * 9 / 10,
        "{bare}"
    );
    for key in [
        "flushes_before_access",
        "unflushed_changes_used",
        "invlpg",
        "cr3_loads",
    ] {
        assert!(number(&bare, key) > 100, "{key}: {bare}");
    }
    assert_eq!(bare, ept);
}

#[test]
fn bare_and_ept_digests_agree() {
    assert_bare_and_ept_agree(RANDOM);
}

#[test]
fn bare_and_ept_digests_agree_with_another_seed() {
    assert_bare_and_ept_agree(RANDOM_SEED2);
    assert_ne!(
        digest(&run(RANDOM, Env::Bare)),
        digest(&run(RANDOM_SEED2, Env::Bare))
    );
}

/// The discipline is sound: flushing everything before every access
/// changes nothing, so no outcome depends on what the TLB cached (and a
/// shadow MMU, which caches differently, must give the same digest).
#[test]
fn the_discipline_leaves_nothing_to_the_tlb() {
    let normal = run(RANDOM, Env::Bare);
    let paranoid = run(PARANOID, Env::Bare);
    assert_eq!(digest(&normal), digest(&paranoid), "{normal}{paranoid}");
    assert_eq!(number(&normal, "accesses"), number(&paranoid, "accesses"));
}

/// The comparison has teeth: without the required flushes the machine's
/// TLB serves stale translations and the digest changes.
#[test]
fn leaving_out_required_flushes_changes_the_digest() {
    let normal = run(RANDOM, Env::Bare);
    let skipping = run(SKIP_FLUSHES, Env::Bare);
    assert_eq!(number(&normal, "accesses"), number(&skipping, "accesses"));
    assert_ne!(digest(&normal), digest(&skipping), "{normal}{skipping}");
}

/// Shadow paging (which caches translations in its own tables, synced at
/// the guest's flushes) gives the same outcomes as EPT.
#[test]
fn ept_and_shadow_digests_agree() {
    for elf in [RANDOM, RANDOM_SEED2] {
        let ept = run(elf, Env::Ept);
        let shadow = run(elf, Env::Shadow);
        assert_eq!(ept, shadow);
    }
}

/// With the paravirtual CR3 cache (seed 004) the four address spaces'
/// switches load cached shadow roots without an exit, while the random
/// mutation changes their tables (roots synced, zapped and dropped from
/// the cache and the CR3-target list behind the guest's back): the outcomes
/// are still EPT's, with 4 targets (every root fits) and 2 (roots replaced).
#[test]
fn the_cr3_cache_gives_the_same_outcomes_as_ept() {
    let ept = run(RANDOM, Env::Ept);
    let summary = |out: &str| -> String {
        out.lines()
            .find(|l| l.starts_with(SUMMARY))
            .unwrap_or_else(|| panic!("no summary in {out}"))
            .to_string()
    };
    let cache_line =
        |out: &str, key: &str| -> u64 { field(out, "mmu-random-cr3-cache:", key).parse().unwrap() };
    // Where the cache is not offered the kernel loads CR3 as before.
    let plain = run(RANDOM_CR3_CACHE, Env::Ept);
    assert_eq!(summary(&plain), summary(&ept));
    assert_eq!(cache_line(&plain, "on"), 0, "{plain}");
    for targets in [4, 2] {
        let cached = run(RANDOM_CR3_CACHE, Env::ShadowCr3Cache(targets));
        eprintln!("{targets} targets: {}", cached.trim_end());
        assert_eq!(summary(&cached), summary(&ept), "{targets} targets");
        assert_eq!(cache_line(&cached, "on"), 1, "{cached}");
        let hits = cache_line(&cached, "hits");
        assert!(hits > 100, "{targets} targets: {cached}");
    }
}

/// The shadow MMU's invariants, including its audit against the guest's
/// tables, hold all through the random mutation (checked every 20 000
/// cycles with a small quantum).
#[test]
fn the_shadow_invariants_hold_through_random_mutation() {
    use hv::{Cycles, RunStatus, Vm, VmConfig};
    let config = VmConfig {
        vcpus: 1,
        mem_size: mmu_common::MEM,
        mmu: hv::MmuMode::Shadow,
        quantum: 2000,
        ..VmConfig::default()
    };
    let mut vm = Vm::boot(&config, RANDOM).expect("boot");
    loop {
        if let Err(e) = vm.check_mmu() {
            panic!("at {:?}: {e}", vm.time());
        }
        if let RunStatus::Stopped(_) = vm.run_until(vm.time() + Cycles(20_000)) {
            break;
        }
    }
    vm.check_mmu().expect("at the end");
}
