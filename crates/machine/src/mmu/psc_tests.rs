//! Tests of the paging-structure caches: what they cache, that every
//! invalidating event drops what it must (and only that), that a fault is
//! checked against memory, and that they never change results or walk
//! references for a guest that invalidates as the SDM requires.

use super::psc::PscConfig;
use super::*;

/// The linear page the stale-PDE scenario fills the caches with, and two
/// more pages of the same 2 MiB region (the same PDE).
const VA1: u64 = 0x20_1000;
const VA2: u64 = 0x20_2000;
const VA3: u64 = 0x20_3000;
const VPID: u16 = 1;
/// An address none of the tests maps.
const FAR: Gva = Gva(0x7fff_0000);

/// Guest tables mapping VA1..VA3 through page table PT1 (VA2 -> 0x8000,
/// VA3 -> 0x9000), and a second table PT2 (VA2 -> 0x6000, VA3 -> 0x7000)
/// nothing points to yet. Returns (root, PDE slot, PT2).
fn two_tables(m: &mut TestMachine) -> (u64, u64, u64) {
    let root = m.frame();
    m.map(root, VA1, 0x5000, PageSize::Size4K, P | W, GUEST_TABLE);
    m.map(root, VA2, 0x8000, PageSize::Size4K, P | W, GUEST_TABLE);
    m.map(root, VA3, 0x9000, PageSize::Size4K, P | W, GUEST_TABLE);
    let pt2 = m.frame();
    m.write(pt2 + TestMachine::index(VA2, 0) * 8, 0x6000 | P | W);
    m.write(pt2 + TestMachine::index(VA3, 0) * 8, 0x7000 | P | W);
    (root, m.slot(root, VA1, 1), pt2)
}

/// Fills the caches through VA1, points the PDE at PT2 without an
/// invalidation, checks that VA2 still goes through PT1 (the PDE-cache
/// entry is used, charged as the full walk), runs `event`, and returns
/// what VA3 translates to afterwards.
fn after_event(ept: bool, event: impl FnOnce(&mut Tlb, Eptp)) -> Hpa {
    let mut m = TestMachine::new();
    let (root, pde, pt2) = two_tables(&mut m);
    let eptp = m.identity_ept(false);
    let ctx = m.ctx(regs(root), ept.then_some(eptp), VPID);
    let full = if ept { 24 } else { 4 };
    let mut tlb = new_tlb();
    assert_eq!(tr(&mut tlb, &ctx, VA1, READ), (Ok(Hpa(0x5000)), full));
    m.write(pde, pt2 | GUEST_TABLE);
    assert_eq!(tr(&mut tlb, &ctx, VA2, READ), (Ok(Hpa(0x8000)), full));
    assert_eq!(tlb.psc().stats().upper_hits, 1);
    event(&mut tlb, eptp);
    let (hpa, refs) = tr(&mut tlb, &ctx, VA3, READ);
    assert_eq!(refs, full);
    hpa.expect("VA3 is mapped either way")
}

#[test]
fn every_invalidating_event_drops_the_stale_pde_cache_entry() {
    let fresh = Hpa(0x7000);
    let stale = Hpa(0x9000);
    type Event = fn(&mut Tlb, Eptp);
    let cases: [(&str, bool, Event, Hpa); 14] = [
        ("MOV to CR3", false, |t, _| t.flush_non_global(VPID), fresh),
        (
            "INVLPG of another page",
            false,
            |t, _| t.invlpg(VPID, FAR),
            fresh,
        ),
        (
            "INVLPG of another VPID",
            false,
            |t, _| t.invlpg(VPID + 1, FAR),
            stale,
        ),
        (
            "CR0/CR4/EFER paging bits",
            false,
            |t, _| t.flush_vpid(VPID),
            fresh,
        ),
        (
            "flush of another VPID",
            false,
            |t, _| t.flush_vpid(VPID + 1),
            stale,
        ),
        (
            "INVVPID individual address",
            false,
            |t, _| {
                t.invvpid(InvvpidKind::IndividualAddress {
                    vpid: VPID,
                    gva: FAR,
                })
            },
            fresh,
        ),
        (
            "INVVPID single context",
            false,
            |t, _| t.invvpid(InvvpidKind::SingleContext { vpid: VPID }),
            fresh,
        ),
        (
            "INVVPID all contexts",
            false,
            |t, _| t.invvpid(InvvpidKind::AllContext),
            fresh,
        ),
        (
            "INVVPID retaining globals",
            false,
            |t, _| t.invvpid(InvvpidKind::SingleContextRetainingGlobals { vpid: VPID }),
            fresh,
        ),
        ("full flush", false, |t, _| t.flush_all(), fresh),
        (
            "MOV to CR3 under EPT",
            true,
            |t, _| t.flush_non_global(VPID),
            fresh,
        ),
        (
            "INVEPT single context",
            true,
            |t, e| t.invept(InveptKind::SingleContext(e)),
            fresh,
        ),
        (
            "INVEPT of another EPTP",
            true,
            |t, _| t.invept(InveptKind::SingleContext(Eptp::new(Hpa(0x1000), false))),
            stale,
        ),
        (
            "INVEPT global",
            true,
            |t, _| t.invept(InveptKind::Global),
            fresh,
        ),
    ];
    for (name, ept, event, want) in cases {
        assert_eq!(after_event(ept, event), want, "{name}");
    }
}

#[test]
fn size_zero_turns_the_caches_off() {
    let mut m = TestMachine::new();
    let (root, pde, pt2) = two_tables(&mut m);
    let eptp = m.identity_ept(false);
    let ctx = m.ctx(regs(root), Some(eptp), VPID);
    let mut tlb = Tlb::with_psc(TlbConfig::default(), PscConfig::OFF);
    assert_eq!(tr(&mut tlb, &ctx, VA1, READ), (Ok(Hpa(0x5000)), 24));
    m.write(pde, pt2 | GUEST_TABLE);
    // Nothing cached above the TLB: the new table is seen at once.
    assert_eq!(tr(&mut tlb, &ctx, VA2, READ), (Ok(Hpa(0x6000)), 24));
    assert_eq!(tlb.psc().stats(), psc::PscStats::default());
    assert_eq!(tlb.psc().occupancy(), (0, 0));
}

#[test]
fn a_fault_through_a_cached_entry_is_checked_against_memory() {
    let mut m = TestMachine::new();
    let (root, pde, pt2) = two_tables(&mut m);
    let ctx = m.ctx(regs(root), None, VPID);
    let mut tlb = new_tlb();
    assert_eq!(tr(&mut tlb, &ctx, VA1, READ), (Ok(Hpa(0x5000)), 4));
    // The cached PDE leads to PT1, where VA2 is now not present; memory's
    // PDE leads to PT2, where it is.
    m.clear_bits(m.slot(root, VA2, 0), P);
    m.write(pde, pt2 | GUEST_TABLE);
    // The walk through the cache faults; the walk from memory alone
    // succeeds, and only its references are charged.
    assert_eq!(tr(&mut tlb, &ctx, VA2, READ), (Ok(Hpa(0x6000)), 4));
    assert_eq!(tlb.psc().stats().rewalks, 1);
    // The entries for the address were dropped (SDM 4.10.4.1) and the
    // successful walk cached PT2: VA3 now goes through PT2.
    assert_eq!(tr(&mut tlb, &ctx, VA3, READ), (Ok(Hpa(0x7000)), 4));

    // A fault that memory confirms is the fault a walk without the caches
    // gives, with its references.
    let va4 = 0x20_4000;
    let (r, refs) = tr(&mut tlb, &ctx, va4, WRITE);
    let code = pf_code(&ctx, va4, WRITE);
    assert_eq!(
        r,
        Err(TranslateError::PageFault {
            gva: Gva(va4),
            error_code: code
        })
    );
    assert_eq!(refs, 4);
}

#[test]
fn guest_physical_mappings_survive_cr3_loads_until_invept() {
    let mut m = TestMachine::new();
    let (root, _, _) = two_tables(&mut m);
    // VA1 and a second linear page share the guest-physical page 0x5000.
    let alias = 0x40_0000;
    m.map(root, alias, 0x5000, PageSize::Size4K, P | W, GUEST_TABLE);
    let eptp = m.identity_ept(false);
    let ctx = m.ctx(regs(root), Some(eptp), VPID);
    let mut tlb = new_tlb();
    assert_eq!(tr(&mut tlb, &ctx, VA1, READ), (Ok(Hpa(0x5000)), 24));
    // The hypervisor moves guest page 0x5000 to host page 0xa000 and does
    // not invalidate yet.
    let ept_leaf = m.slot(eptp.pml4().0, 0x5000, 0);
    m.write(ept_leaf, 0xa000 | EPT_RWX);
    tlb.flush_non_global(VPID);
    tlb.invvpid(InvvpidKind::SingleContext { vpid: VPID });
    // Neither a CR3 load nor INVVPID drops guest-physical mappings (SDM
    // 29.4.3.1): the alias still reaches the old host page.
    assert_eq!(tr(&mut tlb, &ctx, alias, READ), (Ok(Hpa(0x5000)), 24));
    assert!(tlb.psc().stats().gpa_hits > 0);
    tlb.invept(InveptKind::SingleContext(eptp));
    tlb.flush_non_global(VPID);
    assert_eq!(tr(&mut tlb, &ctx, alias, READ), (Ok(Hpa(0xa000)), 24));
}

#[test]
fn a_mapping_without_the_right_or_the_dirty_flag_is_walked_again() {
    let mut m = TestMachine::new();
    let (root, _, _) = two_tables(&mut m);
    let eptp = m.identity_ept(true);
    let ctx = m.ctx(regs(root), Some(eptp), VPID);
    let mut tlb = new_tlb();
    let ept_leaf = m.slot(eptp.pml4().0, 0x5000, 0);
    assert_eq!(tr(&mut tlb, &ctx, VA1, READ), (Ok(Hpa(0x5000)), 24));
    assert_eq!(m.read(ept_leaf) & epte::DIRTY, 0);
    // A write needs the EPT dirty flag: the mapping the read cached does
    // not have it, so the EPT is walked and the flag set.
    tlb.flush_non_global(VPID);
    assert_eq!(tr(&mut tlb, &ctx, VA1, WRITE), (Ok(Hpa(0x5000)), 24));
    assert_ne!(m.read(ept_leaf) & epte::DIRTY, 0);
    // Read-only in EPT, invalidated: a read caches the read-only mapping,
    // and a write is an EPT violation found in memory.
    m.write(ept_leaf, m.read(ept_leaf) & !epte::WRITE);
    tlb.invept(InveptKind::SingleContext(eptp));
    assert_eq!(tr(&mut tlb, &ctx, VA1, READ), (Ok(Hpa(0x5000)), 24));
    let (r, refs) = tr(&mut tlb, &ctx, VA1, WRITE);
    assert!(
        matches!(
            r,
            Err(TranslateError::EptViolation {
                gpa: Gpa(0x5000),
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(refs, 24);
    // Writable again without an INVEPT: the cached mapping lacks the
    // right, so it is not used, and the write succeeds.
    m.write(ept_leaf, m.read(ept_leaf) | epte::WRITE);
    assert_eq!(tr(&mut tlb, &ctx, VA1, WRITE), (Ok(Hpa(0x5000)), 24));
}

#[test]
fn a_dirty_flag_another_cpu_set_is_seen_through_a_cached_mapping() {
    // CPU A reads a page while its EPT dirty flag is clear; another CPU's
    // write then sets the flag in memory. A's next fill sees it as a walk
    // from memory does, so with the caches on or off A's write after its
    // second read hits the TLB.
    for psc in [PscConfig::default(), PscConfig::OFF] {
        let mut m = TestMachine::new();
        let root = m.frame();
        let flags = P | W | pte::ACCESSED | pte::DIRTY;
        m.map(root, VA1, 0x5000, PageSize::Size4K, flags, GUEST_TABLE);
        let eptp = m.identity_ept(true);
        let ctx = m.ctx(regs(root), Some(eptp), VPID);
        let mut tlb = Tlb::with_psc(TlbConfig::default(), psc);
        let ept_leaf = m.slot(eptp.pml4().0, 0x5000, 0);
        assert_eq!(tr(&mut tlb, &ctx, VA1, READ), (Ok(Hpa(0x5000)), 24));
        assert_eq!(m.read(ept_leaf) & epte::DIRTY, 0);
        m.write(ept_leaf, m.read(ept_leaf) | epte::DIRTY);
        tlb.flush_non_global(VPID);
        assert_eq!(tr(&mut tlb, &ctx, VA1, READ), (Ok(Hpa(0x5000)), 24));
        assert_eq!(
            tr(&mut tlb, &ctx, VA1, WRITE),
            (Ok(Hpa(0x5000)), 0),
            "{psc:?}"
        );
    }
}

/// The 2 MiB page of [`switch_run`] and where it maps.
const BIG: u64 = 0xc000_0000;
const BIG_PA: u64 = 0x60_0000;

/// A translation's result and the references it charged.
type Outcome = (Result<Hpa, TranslateError>, u64);

/// A fixed pseudo-random sequence (xorshift64*).
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Two address spaces over shared and private pages (4 KiB and 2 MiB,
/// some user, some read-only, some not present), under EPT with A/D or
/// without EPT; a pseudo-random run of accesses, CR3 switches, INVLPGs
/// and edits of leaf entries followed by INVLPG. Returns every result
/// with its references, and the memory the walks wrote flags into.
fn switch_run(seed: u64, ept: bool, psc: PscConfig) -> (Vec<Outcome>, u64) {
    let mut m = TestMachine::new();
    let roots = [m.frame(), m.frame()];
    let mut state = seed | 1;
    let mut pages = Vec::new();
    for i in 0..48u64 {
        let r = next(&mut state);
        let va = 0x40_0000 * (r % 6) + 0x1000 * (i % 40) + ((r >> 20) % 3) * 0x80_0000_0000;
        let flags = P | if r & 0x100 != 0 { W } else { 0 } | if r & 0x200 != 0 { U } else { 0 };
        let space = (r >> 12) as usize % 3;
        for (s, &root) in roots.iter().enumerate() {
            if space == 2 || space == s {
                m.map(
                    root,
                    va,
                    0x10_0000 + i * 0x1000,
                    PageSize::Size4K,
                    flags,
                    GUEST_TABLE,
                );
            }
        }
        pages.push(va);
    }
    // One 2 MiB page in both spaces.
    for &root in &roots {
        m.map(root, BIG, BIG_PA, PageSize::Size2M, P | W, GUEST_TABLE);
    }
    pages.push(BIG);
    let eptp = m.identity_ept(true);
    let mut tlb = Tlb::with_psc(
        TlbConfig {
            entries: 32,
            ways: 4,
        },
        psc,
    );
    let mut space = 0;
    let mut out = Vec::new();
    for _ in 0..3000 {
        let r = next(&mut state);
        let page = pages[(r % pages.len() as u64) as usize];
        let offset_mask = if page == 0x4000_0000 {
            0x1f_fff8
        } else {
            0xff8
        };
        let va = page + ((r >> 8) & offset_mask);
        match (r >> 16) % 16 {
            0 => {
                space ^= 1;
                tlb.flush_non_global(VPID);
            }
            1 => tlb.invlpg(VPID, Gva(va)),
            2 => {
                // Edit a leaf (rights or presence), then invalidate it as
                // the SDM requires.
                let slot = m.slot(roots[space], va, 0);
                if m.read(slot) & P != 0 && va >> 21 != BIG >> 21 {
                    m.write(slot, m.read(slot) ^ [W, U, P][(r >> 24) as usize % 3]);
                    tlb.invlpg(VPID, Gva(va));
                }
            }
            k => {
                let ctx = m.ctx(regs(roots[space]), ept.then_some(eptp), VPID);
                let access =
                    [READ, WRITE, FETCH, USER_READ, USER_WRITE, USER_FETCH][k as usize % 6];
                out.push(tr(&mut tlb, &ctx, va, access));
            }
        }
        assert!(tlb.valid_bits_consistent());
    }
    if psc != PscConfig::OFF {
        let stats = tlb.psc().stats();
        assert!(stats.upper_hits > 0, "the PDE cache was used");
        assert!(
            !ept || stats.gpa_hits > 0,
            "guest-physical mappings were used"
        );
    }
    let mut hash = 0u64;
    for a in (0..MEM_SIZE).step_by(8) {
        hash = hash.rotate_left(5) ^ m.read(a);
    }
    (out, hash)
}

#[test]
fn the_caches_change_no_result_and_no_reference_count() {
    for seed in 1..=6u64 {
        for ept in [false, true] {
            let off = switch_run(seed, ept, PscConfig::OFF);
            let on = switch_run(seed, ept, PscConfig::default());
            let tiny = switch_run(
                seed,
                ept,
                PscConfig {
                    entries: 1,
                    gpa_entries: 3,
                },
            );
            assert!(
                off.0.iter().any(|(r, _)| r.is_err()),
                "seed {seed}: some faults"
            );
            assert!(
                off.0.iter().any(|(_, refs)| *refs > 0),
                "seed {seed}: some walks"
            );
            for (name, run) in [("default", &on), ("tiny", &tiny)] {
                let first = (0..off.0.len()).find(|&i| run.0.get(i) != off.0.get(i));
                assert_eq!(
                    first.map(|i| (i, run.0.get(i), off.0.get(i))),
                    None,
                    "seed {seed} ept {ept}: {name} caches differ from none at access"
                );
                assert_eq!(run.0.len(), off.0.len());
                assert_eq!(run.1, off.1, "seed {seed} ept {ept}: {name}: memory");
            }
        }
    }
}

/// The straight walk's memo of its last paging-structure mapping
/// (`Psc::gpa_peek_structure`) answers exactly as a probe
/// (`Psc::gpa_peek`) over random fills (new rights, host pages, dirty
/// flags), INVEPT of either type, single-mapping drops after an EPT fault,
/// and full flushes, for a few pages under two EPTPs.
#[test]
fn the_structure_memo_answers_as_a_probe() {
    use super::ept::{EptPerms, EptTranslation};
    use super::psc::Psc;
    use crate::vmx::{Eptp, InveptKind};
    let mut psc = Psc::new(PscConfig {
        entries: 8,
        gpa_entries: 16,
    });
    let m = TestMachine::new();
    let eptps = [
        Eptp::new(Hpa(0x10_0000), false),
        Eptp::new(Hpa(0x20_0000), true),
    ];
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let kinds = [AccessKind::Read, AccessKind::Write, AccessKind::Execute];
    let (mut memo_answers, mut changes) = (0u64, 0u64);
    for step in 0..40_000 {
        let r = next();
        let eptp = eptps[(r & 1) as usize];
        // Eight pages, some sharing a set of the 16-entry cache.
        let gpa = Gpa(((r >> 1) % 8) * 0x4_0000 + ((r >> 8) & 0xff8));
        match (r >> 16) % 16 {
            0..=3 => {
                let t = EptTranslation {
                    hpa: Hpa(0x100_0000 + ((r >> 20) % 64) * 0x1000),
                    perms: EptPerms::from_bits((r >> 28) & 7),
                    page_size: PageSize::Size4K,
                    // As a walk gives it: always without EPT A/D.
                    dirty_recorded: !eptp.ad_enabled() || (r >> 31) & 1 == 1,
                };
                psc.gpa_fill(eptp, gpa, &t);
                changes += 1;
            }
            4 => {
                psc.invept(if (r >> 20) & 1 == 0 {
                    InveptKind::Global
                } else {
                    InveptKind::SingleContext(eptp)
                });
                changes += 1;
            }
            5 => {
                // An EPT fault at `gpa` drops its mapping.
                let ctx = m.ctx(regs(0x1000), Some(eptp), VPID);
                psc.fault(&ctx, 0x40_0000, Some(gpa));
                changes += 1;
            }
            6 if (r >> 20) % 8 == 0 => {
                psc.flush_all();
                changes += 1;
            }
            _ => {
                let kind = kinds[((r >> 20) % 3) as usize];
                let probe = psc.gpa_peek(eptp, gpa, kind);
                let memo = psc.gpa_peek_structure(eptp, gpa, kind);
                assert_eq!(memo, probe, "step {step}: {gpa:?} {kind:?}");
                let again = psc.gpa_peek_structure(eptp, gpa, kind);
                assert_eq!(again, probe, "step {step}: {gpa:?} {kind:?} again");
                memo_answers += u64::from(probe.is_some());
            }
        }
    }
    assert!(
        memo_answers > 1000 && changes > 6000,
        "{memo_answers} {changes}"
    );
}

/// A fault drops the PSC entries of its linear address and the
/// guest-physical mapping of its EPT page, and nothing else: with sets
/// shared by many addresses, after each fault every other address still
/// starts its walk and translates as before, and the bookkeeping matches
/// the slots.
#[test]
fn a_fault_drops_exactly_the_entries_of_its_address() {
    use super::ept::{EptPerms, EptTranslation};
    use super::psc::{Psc, UpperFill};
    use crate::vmx::Eptp;
    let mut psc = Psc::new(PscConfig {
        entries: 16,
        gpa_entries: 16,
    });
    let m = TestMachine::new();
    let eptp = Eptp::new(Hpa(0x10_0000), true);
    let ctx = m.ctx(regs(0x1000), Some(eptp), VPID);
    // Linear addresses one PML4E apart (a PDE, PDPTE and PML4E entry
    // each), and guest-physical pages, more of both than the sets hold
    // apart.
    let gvas: Vec<u64> = (0..12u64).map(|i| i << 39).collect();
    let gpas: Vec<Gpa> = (0..12u64).map(|i| Gpa(i * 0x2000)).collect();
    let fill = |psc: &mut Psc| {
        for &gva in &gvas {
            let fills = [3u32, 2, 1].map(|level| UpperFill {
                level,
                next: Gpa(0x3000 * u64::from(level)),
                perms: super::paging::GuestPerms::ALL,
                refs: u64::from(4 - level) * 5,
            });
            psc.fill_upper(&ctx, gva, &fills);
        }
        for (i, &gpa) in gpas.iter().enumerate() {
            let t = EptTranslation {
                hpa: Hpa(0x40_0000 + i as u64 * 0x1000),
                perms: EptPerms::ALL,
                page_size: PageSize::Size4K,
                dirty_recorded: true,
            };
            psc.gpa_fill(eptp, gpa, &t);
        }
    };
    let starts = |psc: &Psc| -> Vec<Option<u32>> {
        gvas.iter()
            .map(|&gva| psc.peek_start(&ctx, gva).map(|s| s.level))
            .collect()
    };
    let mappings = |psc: &Psc| -> Vec<Option<Hpa>> {
        gpas.iter()
            .map(|&gpa| psc.gpa_peek(eptp, gpa, AccessKind::Read).map(|t| t.hpa))
            .collect()
    };
    for victim in 0..gvas.len() {
        fill(&mut psc);
        let (mut want_starts, mut want_maps) = (starts(&psc), mappings(&psc));
        assert!(want_starts.iter().filter(|s| s.is_some()).count() >= 4);
        assert!(want_maps.iter().filter(|s| s.is_some()).count() >= 8);
        psc.fault(&ctx, gvas[victim], Some(gpas[victim]));
        want_starts[victim] = None;
        want_maps[victim] = None;
        assert_eq!(starts(&psc), want_starts, "fault at {victim}");
        assert_eq!(mappings(&psc), want_maps, "fault at {victim}");
        assert!(psc.consistent());
    }
}
