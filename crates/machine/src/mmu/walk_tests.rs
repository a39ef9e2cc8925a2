//! The straight TLB-miss path ([`paging::walk_cached`], taken by
//! [`translate_miss`]) against the general walk: on two identical
//! machines, one translating through [`translate`] and one with every miss
//! walked the general way ([`translate_general`]), a long random run gives
//! the same results, walk references, memory (accessed and dirty flags,
//! the page-modification log), TLB (entries, places, replacement bits,
//! counters) and paging-structure caches (entries, places, counters).

use super::psc::PscConfig;
use super::*;
use std::cell::Cell;

/// Linear addresses the run uses: 4 KiB pages in two page tables of one
/// 1 GiB region, 4 KiB pages under another PML4 entry, 2 MiB pages beside
/// each of those page tables (in the same page directory) and in a 1 GiB
/// region of their own, and a 1 GiB page.
fn va_of(r: u64) -> u64 {
    let page = (r >> 8) % 16;
    let offset = (r >> 32) % 0x1000;
    match r % 9 {
        0 | 1 => 0x40_0000 + page * 0x1000 + offset,
        2 => 0x60_0000 + page * 0x1000 + offset,
        3 => 0x7f_8000_0000 + page * 0x1000 + offset,
        4 | 5 => 0x4000_0000 + (page % 4) * 2 * MIB + ((r >> 16) % 512) * 0x1000 + offset,
        6 => 0x80_0000_0000 + ((r >> 16) % 4096) * 0x1000 + offset,
        // Nothing mapped there.
        7 => 0x1234_5000 + offset,
        _ => {
            let base = [0x20_0000, 0x7f_8020_0000][(page % 2) as usize];
            base + ((r >> 16) % 512) * 0x1000 + offset
        }
    }
}

/// One machine: memory with two guest address spaces (roots) mapping the
/// same pages with random flags, and, with `ept`, an identity EPT (A/D as
/// given) with some pages' rights or flags taken away. Deterministic in
/// `seed`.
fn build(seed: u64, ept: Option<bool>) -> (TestMachine, [u64; 2], Option<Eptp>) {
    let mut m = TestMachine::new();
    let mut rand = random(seed);
    let mut roots = [0; 2];
    for root in &mut roots {
        *root = m.frame();
        let flags = |rand: &mut dyn FnMut() -> u64| {
            let r = rand();
            let mut f = P | pte::ACCESSED;
            if r % 16 == 0 {
                f &= !P;
            }
            if r % 8 == 1 {
                f &= !pte::ACCESSED;
            }
            if (r >> 4) % 4 != 0 {
                f |= W;
            }
            if (r >> 6) % 2 == 0 {
                f |= U;
            }
            if (r >> 7) % 8 == 0 {
                f |= pte::NX;
            }
            if (r >> 10) % 2 == 0 {
                f |= pte::DIRTY;
            }
            if (r >> 11) % 4 == 0 {
                f |= pte::GLOBAL;
            }
            if (r >> 13) % 64 == 0 {
                // A reserved address bit.
                f |= 1 << 50;
            }
            f
        };
        for page in 0..16u64 {
            for base in [0x40_0000, 0x60_0000, 0x7f_8000_0000] {
                let f = flags(&mut rand);
                let pa = (base / 0x1000 % 64 + page) * 0x1000;
                m.map(
                    *root,
                    base + page * 0x1000,
                    pa,
                    PageSize::Size4K,
                    f,
                    GUEST_TABLE,
                );
            }
        }
        for (j, va) in [(1, 0x20_0000), (2, 0x7f_8020_0000)] {
            let f = flags(&mut rand);
            m.map(*root, va, j * 2 * MIB, PageSize::Size2M, f, GUEST_TABLE);
        }
        for j in 0..4 {
            let f = flags(&mut rand);
            m.map(
                *root,
                0x4000_0000 + j * 2 * MIB,
                j * 2 * MIB,
                PageSize::Size2M,
                f,
                GUEST_TABLE,
            );
        }
        let f = flags(&mut rand);
        m.map(*root, 0x80_0000_0000, 0, PageSize::Size1G, f, GUEST_TABLE);
    }
    let eptp = ept.map(|ad| {
        let eptp = m.identity_ept(ad);
        // Take rights and flags away from some pages: tables and data.
        for _ in 0..8 {
            let r = rand();
            let page = if r % 2 == 0 {
                TABLE_AREA + (r >> 8) % 64 * 0x1000
            } else {
                (r >> 8) % 128 * 0x1000
            };
            let slot = m.slot(eptp.pml4().0, page, 0);
            let bits = match (r >> 16) % 4 {
                0 => epte::WRITE,
                1 => epte::EXEC,
                _ => epte::ACCESSED | epte::DIRTY,
            };
            m.clear_bits(slot, bits);
        }
        eptp
    });
    (m, roots, eptp)
}

/// Where the entry of `level` for `va` is, if the walk to it finds only
/// present non-leaf entries in memory.
fn entry_slot(m: &TestMachine, root: u64, va: u64, level: u32) -> Option<u64> {
    let mut table = root;
    for l in (level + 1..=3).rev() {
        let entry = m
            .mem
            .read_u64(Hpa(table + TestMachine::index(va, l) * 8))
            .ok()?;
        if entry & P == 0 || (l < 3 && entry & pte::HUGE != 0) {
            return None;
        }
        table = entry & pte::ADDR_MASK;
    }
    let slot = table + TestMachine::index(va, level) * 8;
    (slot < MEM_SIZE).then_some(slot)
}

fn context<'a>(
    m: &'a TestMachine,
    regs: PagingRegs,
    ept: Option<Eptp>,
    vpid: u16,
    pml_index: Option<&'a Cell<u16>>,
) -> TranslateCtx<'a> {
    TranslateCtx {
        mem: &m.mem,
        regs,
        ept,
        vpid,
        pml: pml_index.map(|index| PmlLog {
            address: Hpa(PML_PAGE),
            index,
        }),
    }
}

fn run(seed: u64, ept: Option<bool>, pml: bool) {
    let (fast_m, roots, eptp) = build(seed, ept);
    let (slow_m, slow_roots, _) = build(seed, ept);
    assert_eq!(roots, slow_roots);
    let geometry = TlbConfig {
        entries: 32,
        ways: 4,
    };
    let psc = PscConfig {
        entries: 8,
        gpa_entries: 64,
    };
    let mut fast = Tlb::with_psc(geometry, psc);
    let mut slow = Tlb::with_psc(geometry, psc);
    let fast_index = Cell::new(crate::vmx::PML_HEAD_INDEX);
    let slow_index = Cell::new(crate::vmx::PML_HEAD_INDEX);
    let mut rand = random(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut root = roots[0];
    let mut cr4 = cr4::PAE | cr4::PGE;
    let mut cr0 = cr0::PE | cr0::PG | cr0::WP;
    let mut vpid = 1;
    let before = CACHED_MISSES.with(Cell::get);
    let memo_before = super::psc::STRUCTURE_MEMO_HITS.with(Cell::get);
    let final_ept_before = FINAL_EPT_WALKS.with(Cell::get);
    let mut walks = 0;
    for step in 0..12_000 {
        let r = rand();
        let va = va_of(r >> 3);
        match (r >> 24) % 64 {
            0 => {
                fast.invlpg(vpid, Gva(va));
                slow.invlpg(vpid, Gva(va));
            }
            1 => {
                root = roots[((r >> 32) % 2) as usize];
                fast.flush_non_global(vpid);
                slow.flush_non_global(vpid);
            }
            2 => {
                // A new address space without a flush (the caches are
                // tagged by CR3).
                root = roots[((r >> 32) % 2) as usize];
            }
            3 | 4 => {
                // Clear a flag or flip a right of a guest entry, without
                // invalidating: cached entries go stale.
                let level = ((r >> 32) % 4) as u32;
                let (clear, flip) = [(pte::ACCESSED, 0), (pte::DIRTY, 0), (0, W), (0, U), (0, P)]
                    [((r >> 36) % 5) as usize];
                for m in [&fast_m, &slow_m] {
                    if let Some(slot) = entry_slot(m, root, va, level) {
                        // Rights flip in leaves only (upper entries stay
                        // present and open, or the run would mostly fault).
                        let entry = m.read(slot);
                        let leaf = level == 0 || entry & pte::HUGE != 0;
                        m.write(slot, (entry & !clear) ^ if leaf { flip } else { 0 });
                    }
                }
            }
            5 => {
                // An EPT flag cleared or a right flipped, invalidated or
                // not.
                if let Some(eptp) = eptp {
                    let page = if (r >> 45) % 2 == 0 {
                        TABLE_AREA + (r >> 32) % 64 * 0x1000
                    } else {
                        (r >> 32) % 128 * 0x1000
                    };
                    let (clear, flip) = [
                        (epte::ACCESSED, 0),
                        (epte::DIRTY, 0),
                        (0, epte::WRITE),
                        (0, epte::EXEC),
                    ][((r >> 40) % 4) as usize];
                    for m in [&fast_m, &slow_m] {
                        let slot = m.slot(eptp.pml4().0, page, 0);
                        m.write(slot, (m.read(slot) & !clear) ^ flip);
                    }
                    if (r >> 44) % 2 == 0 {
                        fast.invept(InveptKind::SingleContext(eptp));
                        slow.invept(InveptKind::SingleContext(eptp));
                    }
                }
            }
            6 => {
                // Mode changes: CR0.WP, CR4.SMEP/SMAP/PGE (a PGE change
                // flushes the VPID), another VPID.
                match (r >> 32) % 4 {
                    0 => cr0 ^= cr0::WP,
                    1 => cr4 ^= cr4::SMEP,
                    2 => cr4 ^= cr4::SMAP,
                    _ => {
                        cr4 ^= cr4::PGE;
                        fast.flush_vpid(vpid);
                        slow.flush_vpid(vpid);
                    }
                }
                vpid = 1 + ((r >> 40) % 2) as u16;
            }
            7 if pml => {
                // A nearly full log, or a full one.
                let index = [0, 1, 0xffff, crate::vmx::PML_HEAD_INDEX][((r >> 32) % 4) as usize];
                fast_index.set(index);
                slow_index.set(index);
            }
            _ => {
                let kind = [AccessKind::Read, AccessKind::Write, AccessKind::Execute]
                    [((r >> 32) % 3) as usize];
                let access = Access {
                    kind,
                    user: (r >> 34) % 2 == 0,
                };
                let regs = PagingRegs {
                    cr0,
                    cr3: root,
                    cr4,
                    efer: efer::LME | efer::LMA | efer::NXE,
                    rflags_ac: (r >> 35) % 4 == 0,
                };
                let ctx = |m, index| context(m, regs, eptp, vpid, pml.then_some(index));
                let (mut a_refs, mut b_refs) = (0, 0);
                let a = translate(
                    &mut fast,
                    &ctx(&fast_m, &fast_index),
                    Gva(va),
                    access,
                    &mut a_refs,
                );
                let b = translate_general(
                    &mut slow,
                    &ctx(&slow_m, &slow_index),
                    Gva(va),
                    access,
                    &mut b_refs,
                );
                assert_eq!(
                    (a, a_refs),
                    (b, b_refs),
                    "step {step}: {access:?} at {va:#x}"
                );
                walks += u64::from(a_refs != 0);
            }
        }
        assert_eq!(fast.stats(), slow.stats(), "step {step}");
        assert_eq!(fast.image(), slow.image(), "step {step}");
        assert_eq!(
            format!("{:?}", fast.psc),
            format!("{:?}", slow.psc),
            "step {step}"
        );
        assert_eq!(fast_index.get(), slow_index.get(), "step {step}");
        assert!(fast.psc.consistent(), "step {step}: PSC bookkeeping");
        assert!(fast.valid_bits_consistent(), "step {step}: TLB bitmaps");
        if step % 16 == 0 || (r >> 24) % 64 >= 8 {
            assert!(tables(&fast_m) == tables(&slow_m), "step {step}: memory");
        }
    }
    let cached = CACHED_MISSES.with(Cell::get) - before;
    assert!(
        cached > 500 && cached < walks,
        "both ways must be exercised: {cached} straight misses of {walks} walks"
    );
    // Under EPT the straight way reads its paging structures' mappings
    // through the memo (`Psc::gpa_peek_structure`), the general way never.
    let memo_hits = super::psc::STRUCTURE_MEMO_HITS.with(Cell::get) - memo_before;
    assert!(
        ept.is_none() || memo_hits > 100,
        "the structure memo must be used: {memo_hits}"
    );
    // Under EPT the straight way also walks the EPT for a final
    // guest-physical address with no cached mapping.
    let final_ept_walks = FINAL_EPT_WALKS.with(Cell::get) - final_ept_before;
    assert!(
        ept.is_none() || final_ept_walks > 100,
        "the straight way's final EPT walk must be used: {final_ept_walks}"
    );
}

#[test]
fn the_straight_miss_path_changes_nothing_without_ept() {
    run(1, None, false);
}

#[test]
fn the_straight_miss_path_changes_nothing_under_ept() {
    run(2, Some(false), false);
}

#[test]
fn the_straight_miss_path_changes_nothing_under_ept_with_ad_and_pml() {
    run(3, Some(true), true);
}
