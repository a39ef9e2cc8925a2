//! The access matrix (tests/guests/mmu/matrix.c): thousands of page-table
//! configurations and access contexts, each outcome (fault, error code,
//! CR2, A/D bits left in the guest entries) folded into one digest, which
//! must be the same on the bare machine and under the hv.

mod mmu_common;

use mmu_common::{field, first_difference, run, Env};

const MATRIX: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mmu-matrix.elf"));
const MATRIX_LOG: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mmu-matrix-log.elf"));
/// The same reloading CR3 through the paravirtual CR3 cache where offered.
const MATRIX_CR3_CACHE: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/mmu-matrix-cr3-cache.elf"));
const SUMMARY: &str = "mmu-matrix:";

/// On a mismatch, rerun both with the per-case log and show where they
/// first part.
fn assert_same_digest(a: Env, b: Env) {
    let out_a = run(MATRIX, a);
    let out_b = run(MATRIX, b);
    let cases: u64 = field(&out_a, SUMMARY, "cases").parse().unwrap();
    eprintln!("{a:?}: {}", out_a.trim_end());
    eprintln!("{b:?}: {}", out_b.trim_end());
    assert!(cases >= 10_000, "only {cases} cases");
    // Every kind of outcome occurs, so a kernel that stopped testing
    // anything would not pass.
    for key in ["ok", "faults"] {
        let n: u64 = field(&out_a, SUMMARY, key).parse().unwrap();
        assert!(n > cases / 10, "{key}={n} of {cases}");
    }
    assert_eq!(field(&out_a, SUMMARY, "other"), "0", "{out_a}");
    if field(&out_a, SUMMARY, "digest") != field(&out_b, SUMMARY, "digest") {
        let log_a = run(MATRIX_LOG, a);
        let log_b = run(MATRIX_LOG, b);
        panic!(
            "{a:?} and {b:?} differ:\n{}\n{}\n{}",
            out_a.trim_end(),
            out_b.trim_end(),
            first_difference(&log_a, &log_b)
        );
    }
}

#[test]
fn bare_and_ept_digests_agree() {
    assert_same_digest(Env::Bare, Env::Ept);
}

#[test]
fn the_digest_repeats_and_the_log_variant_agrees() {
    let a = run(MATRIX, Env::Bare);
    let b = run(MATRIX, Env::Bare);
    assert_eq!(a, b);
    let log = run(MATRIX_LOG, Env::Bare);
    let cases: usize = field(&a, SUMMARY, "cases").parse().unwrap();
    assert_eq!(
        log.lines().filter(|l| l.starts_with("case ")).count(),
        cases
    );
    assert_eq!(field(&log, SUMMARY, "digest"), field(&a, SUMMARY, "digest"));
}

/// With the paravirtual CR3 cache (seed 004) every case's CR3 reload
/// loads the cached shadow root without an exit, while each case rewrites
/// the tables under it (the hv syncs or zaps the root and takes it out of
/// the cache first): the outcomes are EPT's.
#[test]
fn the_cr3_cache_gives_the_same_outcomes() {
    let ept = run(MATRIX, Env::Ept);
    let cached = run(MATRIX_CR3_CACHE, Env::ShadowCr3Cache(4));
    for key in ["cases", "ok", "faults", "other", "digest"] {
        assert_eq!(
            field(&cached, SUMMARY, key),
            field(&ept, SUMMARY, key),
            "{key}"
        );
    }
    let on: u64 = field(&cached, "mmu-matrix-cr3-cache:", "on")
        .parse()
        .unwrap();
    let hits: u64 = field(&cached, "mmu-matrix-cr3-cache:", "hits")
        .parse()
        .unwrap();
    assert_eq!(on, 1, "{cached}");
    assert!(hits > 1000, "{cached}");
}

/// Shadow paging must give the same digest.
#[test]
fn bare_and_shadow_digests_agree() {
    assert_same_digest(Env::Bare, Env::Shadow);
}
