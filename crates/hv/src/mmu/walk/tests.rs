//! The walker against the machine's own walker (`machine::mmu::paging`) on
//! random page-table graphs, and its contract with [`GuestPtes`].

use super::*;
use machine::cpu::state::{cr0, cr4, efer};
use machine::mmu::paging::{self, GuestTranslation};
use machine::mmu::{PageSize, PagingRegs, TranslateCtx, TranslateError};
use machine::{Hpa, PhysMemory};
use rand::{RngExt, SeedableRng};
use rand_xorshift::XorShiftRng;

/// Guest memory as host memory (no EPT): what the bare machine walks.
struct MemPtes<'a>(&'a PhysMemory);

impl GuestPtes for MemPtes<'_> {
    fn read_pte(&mut self, gpa: Gpa) -> Result<u64, PteError> {
        self.0
            .read_u64(Hpa(gpa.0))
            .map_err(|_| PteError::NotRam { gpa })
    }
    fn try_set_bits(&mut self, gpa: Gpa, old: u64, bits: u64) -> Result<bool, PteError> {
        let seen = self
            .0
            .cmpxchg(Hpa(gpa.0), 8, old, old | bits)
            .map_err(|_| PteError::NotRam { gpa })?;
        Ok(seen == old)
    }
}

/// Frames of the random tables (the graph's nodes); memory covers
/// `MEM_FRAMES` frames so some leaf and table addresses fall outside it.
const TABLES: [u64; 4] = [1, 2, 3, 4];
const MEM_FRAMES: u64 = 256;

/// A random paging-structure entry: mostly pointing at one of the tables
/// (so walks wander through a random graph, self-references included),
/// every flag random, sometimes reserved bits.
fn random_entry(rng: &mut XorShiftRng) -> u64 {
    let mut e = if rng.random_bool(0.8) {
        TABLES[rng.random_range(0..TABLES.len())] << 12
    } else {
        // Anywhere below MAXPHYADDR, mostly inside memory.
        let limit = if rng.random_bool(0.8) {
            MEM_FRAMES
        } else {
            1 << (MAX_PHYS_ADDR_BITS - 12)
        };
        rng.random_range(0..limit) << 12
    };
    for (bit, p) in [
        (pte::PRESENT, 0.95),
        (pte::WRITABLE, 0.8),
        (pte::USER, 0.8),
        (pte::PWT, 0.2),
        (pte::PCD, 0.2),
        (pte::ACCESSED, 0.4),
        (pte::DIRTY, 0.4),
        (pte::HUGE, 0.25),
        (pte::GLOBAL, 0.2),
        (pte::NX, 0.15),
    ] {
        if rng.random_bool(p) {
            e |= bit;
        }
    }
    // Ignored bits 11:9 and 62:52 (no protection keys).
    if rng.random_bool(0.2) {
        e |= rng.random_range(0..8u64) << 9;
    }
    if rng.random_bool(0.2) {
        e |= rng.random_range(0..0x800u64) << 52;
    }
    // Reserved: address bits at or above MAXPHYADDR; low address bits of a
    // large leaf (and PAT, bit 12).
    if rng.random_bool(0.02) {
        e |= 1 << rng.random_range(MAX_PHYS_ADDR_BITS..52);
    }
    if rng.random_bool(0.05) {
        e |= 1 << rng.random_range(12..30);
    }
    e
}

fn random_regs(rng: &mut XorShiftRng) -> PagingContext {
    let mut ctx = PagingContext {
        cr0: cr0::PG | cr0::PE,
        cr3: TABLES[rng.random_range(0..TABLES.len())] << 12,
        cr4: cr4::PAE,
        efer: efer::LME | efer::LMA,
    };
    if rng.random_bool(0.5) {
        ctx.cr0 |= cr0::WP;
    }
    if rng.random_bool(0.5) {
        ctx.efer |= efer::NXE;
    }
    if rng.random_bool(0.5) {
        ctx.cr4 |= cr4::SMEP;
    }
    if rng.random_bool(0.5) {
        ctx.cr4 |= cr4::SMAP;
    }
    // CR3's low bits (PWT/PCD, ignored without PCIDs).
    if rng.random_bool(0.2) {
        ctx.cr3 |= 0x18;
    }
    ctx
}

fn random_access(rng: &mut XorShiftRng) -> Access {
    let kind = [AccessKind::Read, AccessKind::Write, AccessKind::Execute][rng.random_range(0..3)];
    Access {
        kind,
        cpl3: rng.random_bool(0.5),
        implicit_supervisor: rng.random_bool(0.1),
        rflags_ac: rng.random_bool(0.5),
    }
}

/// The table slots the random addresses index (at every level), so only
/// these need random entries: the low half's first ones and, for the
/// canonical upper half, the first ones above 256.
const SLOTS: [std::ops::Range<u64>; 2] = [0..16, 256..272];

/// A random canonical address whose index at every level is in `SLOTS`.
fn random_gva(rng: &mut XorShiftRng) -> Gva {
    let mut la = rng.random_range(0..1u64 << 12);
    for level in 1..=4 {
        let slot = SLOTS[rng.random_range(0..SLOTS.len())].clone();
        la |= rng.random_range(slot) << (12 + 9 * (level - 1));
    }
    Gva((((la << 16) as i64) >> 16) as u64)
}

/// What the machine's walker says, in the hv walker's terms.
fn machine_walk(mem: &PhysMemory, ctx: &PagingContext, gva: Gva, access: Access) -> Outcome {
    let tctx = TranslateCtx {
        mem,
        regs: PagingRegs {
            cr0: ctx.cr0,
            cr3: ctx.cr3,
            cr4: ctx.cr4,
            efer: ctx.efer,
            rflags_ac: access.rflags_ac && !access.implicit_supervisor,
        },
        ept: None,
        vpid: 0,
        pml: None,
    };
    let m_access = machine::mmu::Access {
        kind: access.kind,
        user: access.cpl3 && !access.implicit_supervisor,
    };
    match paging::walk(&tctx, gva, m_access, &mut 0) {
        Ok(GuestTranslation {
            gpa,
            size,
            perms,
            dirty,
            ..
        }) => Outcome::Mapped {
            gpa,
            level: match size {
                PageSize::Size4K => 1,
                PageSize::Size2M => 2,
                PageSize::Size1G => 3,
            },
            writable: perms.writable,
            user: perms.user,
            executable: !perms.no_execute,
            dirty,
        },
        Err(TranslateError::PageFault { gva, error_code }) => Outcome::Fault {
            error_code,
            address: gva,
        },
        Err(TranslateError::Memory(_)) => Outcome::NotRam,
        Err(e) => panic!("bare walk gave {e:?}"),
    }
}

fn hv_walk(mem: &PhysMemory, ctx: &PagingContext, gva: Gva, access: Access) -> Outcome {
    match walk(&mut MemPtes(mem), ctx, gva, access) {
        Ok(w) => {
            assert_eq!(w.gfn, w.gpa.frame());
            let leaf = w.leaf().expect("paging is on");
            assert_eq!(
                (
                    leaf.access.writable,
                    leaf.access.user,
                    leaf.access.executable
                ),
                (w.writable, w.user, w.executable)
            );
            // Each level grants at most what the one above it does.
            for pair in w.entries().windows(2) {
                let (up, down) = (pair[0].access, pair[1].access);
                assert!(up.writable >= down.writable && up.user >= down.user);
                assert!(up.executable >= down.executable);
                assert_eq!(pair[0].level, pair[1].level + 1);
            }
            assert_eq!(w.leaf().map(|e| e.value & pte::DIRTY != 0), Some(w.dirty));
            Outcome::Mapped {
                gpa: w.gpa,
                level: w.level,
                writable: w.writable,
                user: w.user,
                executable: w.executable,
                dirty: w.dirty,
            }
        }
        Err(WalkError::PageFault {
            error_code,
            address,
        }) => Outcome::Fault {
            error_code,
            address,
        },
        Err(WalkError::Pte(PteError::NotRam { .. })) => Outcome::NotRam,
        Err(e) => panic!("hv walk gave {e:?}"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Mapped {
        gpa: Gpa,
        level: u8,
        writable: bool,
        user: bool,
        executable: bool,
        dirty: bool,
    },
    Fault {
        error_code: u32,
        address: Gva,
    },
    NotRam,
}

/// Every entry a walk can reach (the others stay zero).
fn tables_of(mem: &PhysMemory) -> Vec<u64> {
    let mut out = Vec::with_capacity(TABLES.len() * 32);
    for frame in TABLES {
        for i in SLOTS.iter().cloned().flatten() {
            out.push(mem.read_u64(Hpa((frame << 12) + i * 8)).unwrap());
        }
    }
    out
}

/// Tens of thousands of random trees, a few accesses each: the hv walker
/// and the machine's agree on the outcome, the error code, the address
/// and the A/D bits left in the tables.
#[test]
fn agrees_with_the_machine_walker_on_random_tables() {
    const TREES: usize = 30_000;
    const ACCESSES: usize = 4;
    let bare = PhysMemory::new(MEM_FRAMES << 12).unwrap();
    let hv = PhysMemory::new(MEM_FRAMES << 12).unwrap();
    let mut rng = XorShiftRng::seed_from_u64(0x5eed_0010);
    // How often each kind of outcome came up, so a generator that stops
    // reaching some of them fails the test.
    let mut mapped = [0u32; 4];
    let mut faults = std::collections::BTreeMap::<u32, u32>::new();
    let mut not_ram = 0u32;
    let mut ad_written = 0u32;
    for tree in 0..TREES {
        for frame in TABLES {
            for i in SLOTS.iter().cloned().flatten() {
                let e = random_entry(&mut rng);
                let at = Hpa((frame << 12) + i * 8);
                bare.write_u64(at, e).unwrap();
                hv.write_u64(at, e).unwrap();
            }
        }
        // Every access of a tree follows the same path more often than
        // not, so later accesses see the A/D bits earlier ones set.
        let mut gva = random_gva(&mut rng);
        for n in 0..ACCESSES {
            if n > 0 && rng.random_bool(0.3) {
                gva = random_gva(&mut rng);
            }
            let ctx = random_regs(&mut rng);
            let access = random_access(&mut rng);
            let before = tables_of(&hv);
            let want = machine_walk(&bare, &ctx, gva, access);
            let got = hv_walk(&hv, &ctx, gva, access);
            assert_eq!(
                got, want,
                "tree {tree} access {n}: {ctx:x?} {gva:?} {access:?}"
            );
            let after = tables_of(&hv);
            assert_eq!(
                after,
                tables_of(&bare),
                "tree {tree} access {n}: A/D bits differ"
            );
            if after != before {
                ad_written += 1;
            }
            match got {
                Outcome::Mapped { level, .. } => mapped[level as usize] += 1,
                Outcome::Fault { error_code, .. } => *faults.entry(error_code).or_default() += 1,
                Outcome::NotRam => not_ram += 1,
            }
        }
    }
    let total = (TREES * ACCESSES) as u32;
    eprintln!(
        "{total} walks: mapped 4K/2M/1G {:?}, not RAM {not_ram}, A/D written {ad_written}, faults by error code {faults:x?}",
        &mapped[1..]
    );
    for (what, n) in [
        ("4 KiB leaves", mapped[1]),
        ("2 MiB leaves", mapped[2]),
        ("1 GiB leaves", mapped[3]),
        ("tables outside RAM", not_ram),
        ("walks that set A/D", ad_written),
    ] {
        assert!(n > total / 400, "only {n} {what}");
    }
    // Not present, reserved, protection; write, user, fetch each seen.
    for bits in [
        0,
        pf_error::PRESENT | pf_error::RSVD,
        pf_error::PRESENT,
        pf_error::PRESENT | pf_error::WRITE,
        pf_error::PRESENT | pf_error::USER,
        pf_error::PRESENT | pf_error::FETCH,
        pf_error::PRESENT | pf_error::USER | pf_error::FETCH,
        pf_error::PRESENT | pf_error::USER | pf_error::WRITE,
    ] {
        assert!(
            faults.get(&bits).copied().unwrap_or(0) > 20,
            "error code {bits:#x} seen only {:?} times",
            faults.get(&bits)
        );
    }
}

/// A 4 KiB mapping of `gva` through tables at frames 1..=4 (no A/D set).
fn map_4k(mem: &PhysMemory, gva: Gva, leaf: u64) -> PagingContext {
    let flags = pte::PRESENT | pte::WRITABLE | pte::USER;
    for (level, frame) in [(4u32, 1u64), (3, 2), (2, 3)] {
        let index = (gva.0 >> (12 + 9 * (level - 1))) & 0x1ff;
        mem.write_u64(Hpa((frame << 12) + index * 8), ((frame + 1) << 12) | flags)
            .unwrap();
    }
    let index = (gva.0 >> 12) & 0x1ff;
    mem.write_u64(Hpa((4 << 12) + index * 8), leaf).unwrap();
    PagingContext {
        cr0: cr0::PG | cr0::PE | cr0::WP,
        cr3: 1 << 12,
        cr4: cr4::PAE,
        efer: efer::LME | efer::LMA | efer::NXE,
    }
}

/// Entries read and updated through a [`GuestPtes`] that can be told to
/// change an entry before an update or to refuse residency.
struct Scripted<'a> {
    mem: MemPtes<'a>,
    /// Before the next update of this entry, OR these bits into it (as
    /// another CPU would).
    race: Option<(Gpa, u64)>,
    /// Every update fails.
    always_race: bool,
    not_resident: Option<Gfn>,
    updates: u32,
}

impl GuestPtes for Scripted<'_> {
    fn read_pte(&mut self, gpa: Gpa) -> Result<u64, PteError> {
        if self.not_resident == Some(gpa.frame()) {
            return Err(PteError::NotResident { gfn: gpa.frame() });
        }
        self.mem.read_pte(gpa)
    }
    fn try_set_bits(&mut self, gpa: Gpa, old: u64, bits: u64) -> Result<bool, PteError> {
        self.updates += 1;
        if self.always_race {
            return Ok(false);
        }
        if let Some((at, extra)) = self.race {
            if at == gpa {
                self.race = None;
                let v = self.mem.read_pte(gpa)?;
                self.mem.0.write_u64(Hpa(gpa.0), v | extra).unwrap();
            }
        }
        self.mem.try_set_bits(gpa, old, bits)
    }
}

#[test]
fn an_entry_changed_under_the_walk_restarts_it_and_keeps_the_change() {
    let mem = PhysMemory::new(MEM_FRAMES << 12).unwrap();
    let gva = Gva(0x7f12_3456_7abc);
    let ctx = map_4k(&mem, gva, (0x42 << 12) | pte::PRESENT | pte::WRITABLE);
    let leaf_gpa = Gpa((4 << 12) + ((gva.0 >> 12) & 0x1ff) * 8);
    // Another CPU sets an ignored bit in the leaf just before the walk
    // updates it: the compare-and-exchange fails and the walk starts again.
    let mut ptes = Scripted {
        mem: MemPtes(&mem),
        race: Some((leaf_gpa, 1 << 52)),
        always_race: false,
        not_resident: None,
        updates: 0,
    };
    let w = walk(
        &mut ptes,
        &ctx,
        gva,
        Access::new(AccessKind::Write, false, false),
    )
    .unwrap();
    assert_eq!(w.gpa, Gpa((0x42 << 12) | 0xabc));
    assert!(w.dirty);
    let leaf = mem.read_u64(Hpa(leaf_gpa.0)).unwrap();
    assert_eq!(
        leaf,
        (0x42 << 12) | pte::PRESENT | pte::WRITABLE | pte::ACCESSED | pte::DIRTY | 1 << 52
    );
    assert_eq!(w.leaf().unwrap().value, leaf);
    // 4 updates in the first attempt (the last one lost), then only the
    // leaf again: the upper entries already have A.
    assert_eq!(ptes.updates, 5);
    assert_eq!(
        w.entries().iter().map(|e| e.level).collect::<Vec<_>>(),
        [4, 3, 2, 1]
    );
}

#[test]
fn a_walk_that_never_wins_its_update_gives_up() {
    let mem = PhysMemory::new(MEM_FRAMES << 12).unwrap();
    let gva = Gva(0x1000);
    let ctx = map_4k(&mem, gva, (0x42 << 12) | pte::PRESENT);
    let mut ptes = Scripted {
        mem: MemPtes(&mem),
        race: None,
        always_race: true,
        not_resident: None,
        updates: 0,
    };
    let r = walk(
        &mut ptes,
        &ctx,
        gva,
        Access::new(AccessKind::Read, false, false),
    );
    assert_eq!(r, Err(WalkError::Raced { address: gva }));
    assert_eq!(ptes.updates, MAX_RESTARTS);
}

#[test]
fn a_table_not_resident_is_reported_with_its_gfn() {
    let mem = PhysMemory::new(MEM_FRAMES << 12).unwrap();
    let gva = Gva(0x40_0000);
    let ctx = map_4k(&mem, gva, (0x42 << 12) | pte::PRESENT);
    let mut ptes = Scripted {
        mem: MemPtes(&mem),
        race: None,
        always_race: false,
        not_resident: Some(Gfn(3)),
        updates: 0,
    };
    let r = walk(
        &mut ptes,
        &ctx,
        gva,
        Access::new(AccessKind::Read, false, false),
    );
    assert_eq!(
        r,
        Err(WalkError::Pte(PteError::NotResident { gfn: Gfn(3) }))
    );
    assert_eq!(ptes.updates, 0, "nothing set before the walk completes");
}

#[test]
fn paging_off_is_the_identity_and_non_canonical_is_refused() {
    let mem = PhysMemory::new(MEM_FRAMES << 12).unwrap();
    let ctx = PagingContext::default();
    let w = walk(
        &mut MemPtes(&mem),
        &ctx,
        Gva(0x1234_5678),
        Access::new(AccessKind::Write, true, false),
    )
    .unwrap();
    assert_eq!(w.gpa, Gpa(0x1234_5678));
    assert_eq!(w.gfn, Gfn(0x12345));
    assert!(w.entries().is_empty() && w.writable && w.user && w.executable);
    let bad = Gva(0x0000_8000_0000_0000);
    assert_eq!(
        walk(
            &mut MemPtes(&mem),
            &map_4k(&mem, Gva(0), pte::PRESENT),
            bad,
            Access::new(AccessKind::Read, false, false)
        ),
        Err(WalkError::NonCanonical { address: bad })
    );
}

#[test]
fn the_access_of_an_error_code_walks_to_the_same_error_code() {
    let mem = PhysMemory::new(MEM_FRAMES << 12).unwrap();
    let gva = Gva(0x5000);
    // A read-only, no-execute supervisor page.
    let mut ctx = map_4k(&mem, gva, (0x42 << 12) | pte::PRESENT | pte::NX);
    ctx.cr4 |= cr4::SMEP;
    let upper = (gva.0 >> 39) & 0x1ff;
    mem.write_u64(
        Hpa((1 << 12) + upper * 8),
        (2 << 12) | pte::PRESENT | pte::WRITABLE,
    )
    .unwrap();
    for (kind, cpl) in [
        (AccessKind::Write, 0),
        (AccessKind::Write, 3),
        (AccessKind::Read, 3),
        (AccessKind::Execute, 0),
        (AccessKind::Execute, 3),
    ] {
        let access = Access::new(kind, cpl == 3, false);
        let Err(WalkError::PageFault { error_code, .. }) =
            walk(&mut MemPtes(&mem), &ctx, gva, access)
        else {
            panic!("{kind:?} at CPL {cpl} must fault");
        };
        let again = Access::from_error_code(error_code, cpl, false);
        assert_eq!(again, access, "{error_code:#x}");
        assert_eq!(
            walk(&mut MemPtes(&mem), &ctx, gva, again),
            Err(WalkError::PageFault {
                error_code,
                address: gva
            })
        );
    }
    // An implicit supervisor access at CPL 3 (U clear in the error code).
    let implicit = Access::from_error_code(pf_error::PRESENT, 3, true);
    assert!(implicit.implicit_supervisor && !implicit.user() && !implicit.ac());
}

/// The access matrix's per-case log (tests/guests/mmu/matrix.c built with
/// -DCASE_LOG), as the machine's CPU executed it on the bare machine.
const MATRIX_LOG: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mmu-matrix-log.elf"));

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex")
}

/// Every case of the access matrix, replayed through the walker from the
/// entries the kernel installed: the walker predicts what the CPU did
/// (fault or not, error code, A/D bits left), with the access the shadow
/// MMU would describe (kind, CPL 3, RFLAGS.AC).
#[test]
fn predicts_every_case_of_the_access_matrix() {
    let config = machine::bare::BareConfig {
        mem_size: 64 << 20,
        max_cycles: Some(50_000_000_000),
        ..Default::default()
    };
    let out = machine::bare::BareMachine::run_elf(config, MATRIX_LOG).expect("bare run");
    assert!(out.exit.success());
    let log = String::from_utf8(out.serial).unwrap();
    let mut lines = log.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header[0], "entries", "{header:?}");
    let at: Vec<Hpa> = header[1..5].iter().map(|h| Hpa(hex(h))).collect();
    let cr3 = hex(header[5].strip_prefix("cr3=").unwrap());
    let va = Gva(hex(header[6].strip_prefix("va=").unwrap()));

    let mem = PhysMemory::new(64 << 20).unwrap();
    let mut cases = 0;
    for line in lines.filter(|l| l.starts_with("case ")) {
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
                .unwrap_or_else(|| panic!("{key} in {line}"))
        };
        let ctx_bits: u64 = field("ctx").parse().unwrap();
        let before: Vec<u64> = field("before").split(',').map(hex).collect();
        for (a, e) in at.iter().zip(&before) {
            mem.write_u64(*a, *e).unwrap();
        }
        let ctx = PagingContext {
            cr0: cr0::PG | cr0::PE | if ctx_bits & 1 != 0 { cr0::WP } else { 0 },
            cr3,
            cr4: cr4::PAE
                | if ctx_bits & 4 != 0 { cr4::SMEP } else { 0 }
                | if ctx_bits & 8 != 0 { cr4::SMAP } else { 0 },
            efer: efer::LME | efer::LMA | if ctx_bits & 2 != 0 { efer::NXE } else { 0 },
        };
        let mode = ctx_bits >> 4;
        let kind = [AccessKind::Read, AccessKind::Write, AccessKind::Execute]
            [field("kind").parse::<usize>().unwrap()];
        let access = Access::new(kind, mode == 2, mode == 1);
        let got = walk(&mut MemPtes(&mem), &ctx, va, access);
        match field("vector") {
            "128" => assert!(got.is_ok(), "{line}: {got:?}"),
            "14" => assert_eq!(
                got,
                Err(WalkError::PageFault {
                    error_code: hex(field("error")) as u32,
                    address: va
                }),
                "{line}"
            ),
            v => panic!("{line}: vector {v}"),
        }
        let ad = at.iter().enumerate().fold(0, |ad, (lvl, a)| {
            ad | (mem.read_u64(*a).unwrap() & (pte::ACCESSED | pte::DIRTY)) << (8 * lvl)
        });
        assert_eq!(ad, hex(field("ad")), "{line}");
        cases += 1;
    }
    assert_eq!(cases, 28_512);
}
