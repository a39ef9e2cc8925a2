//! The EPT walker's quick path (taken by [`ept_translate`]) against its
//! general walk ([`ept::ept_translate_general`]): on two identical
//! machines whose EPT entries are randomly changed (rights, accessed and
//! dirty flags, bit 7, memory types, reserved bits), a long random run
//! gives the same results, references, EPT entries and page-modification
//! log, with EPT A/D on and off.

use super::ept::ept_translate_general;
use super::*;
use std::cell::Cell;

/// Guest-physical addresses the run uses: 4 KiB pages in two page tables
/// and under a second PML4 entry, a 2 MiB and a 1 GiB page, and addresses
/// nothing maps or past MAXPHYADDR.
fn gpa_of(r: u64) -> u64 {
    let page = (r >> 8) % 16;
    let offset = (r >> 32) % 0x1000;
    match r % 8 {
        0..=2 => 0x40_0000 + page * 0x1000 + offset,
        3 => 0x60_0000 + page * 0x1000 + offset,
        4 => 0x80_0000_0000 + page * 0x1000 + offset,
        5 => 0x20_0000 + ((r >> 16) % 512) * 0x1000 + offset,
        6 => 0x4000_0000 + ((r >> 16) % 0x4_0000) * 0x1000 + offset,
        _ => [0x1234_5000, (1 << 48) | 0x40_0000, 0x7f_0000_0000][(page % 3) as usize] + offset,
    }
}

/// The EPT (and nothing else) of one machine. Deterministic.
fn build() -> (TestMachine, u64) {
    let mut m = TestMachine::new();
    let root = m.frame();
    let rwx_a = EPT_RWX | epte::ACCESSED | epte::DIRTY;
    let table = EPT_TABLE | epte::ACCESSED;
    for page in 0..16u64 {
        for base in [0x40_0000, 0x60_0000, 0x80_0000_0000] {
            let pa = (base / 0x1000 % 64 + page) * 0x1000;
            m.map(
                root,
                base + page * 0x1000,
                pa,
                PageSize::Size4K,
                rwx_a,
                table,
            );
        }
    }
    m.map(root, 0x20_0000, 2 * MIB, PageSize::Size2M, rwx_a, table);
    m.map(root, 0x4000_0000, 0, PageSize::Size1G, rwx_a, table);
    (m, root)
}

/// An entry bit the run flips: the rights, A, D (more often: a flag to
/// set is the quick walk's most frequent way out), bit 7, the memory
/// type's bits, a reserved address bit, an address bit of a large leaf.
const FLIPS: [u64; 15] = [
    epte::ACCESSED,
    epte::DIRTY,
    epte::ACCESSED,
    epte::DIRTY,
    epte::READ,
    epte::WRITE,
    epte::EXEC,
    epte::ACCESSED,
    epte::DIRTY,
    epte::HUGE,
    1 << 3,
    1 << 4,
    1 << 5,
    1 << 47,
    1 << 13,
];

fn run(seed: u64, pml: bool) {
    let (quick_m, root) = build();
    let (general_m, _) = build();
    let (original, _) = build();
    let quick_index = Cell::new(crate::vmx::PML_HEAD_INDEX);
    let general_index = Cell::new(crate::vmx::PML_HEAD_INDEX);
    let log = |index| {
        pml.then_some(PmlLog {
            address: Hpa(PML_PAGE),
            index,
        })
    };
    let mut rand = random(seed);
    let quick_before = ept::QUICK_WALKS.with(Cell::get);
    let mut translations = 0;
    let mut successes = 0;
    for step in 0..20_000 {
        let r = rand();
        let gpa = gpa_of(r >> 3);
        match (r >> 24) % 16 {
            0 | 1 => {
                // Flip a bit of an entry on the way to `gpa`, or (more
                // often, so that most walks succeed) set an entry back to
                // what `build` made.
                // Mostly leaves.
                let level = [0, 0, 0, 1, 2, 3][((r >> 32) % 6) as usize];
                let bit = FLIPS[((r >> 36) % FLIPS.len() as u64) as usize];
                let restore = (r >> 40) % 4 != 0;
                for m in [&quick_m, &general_m] {
                    if let Some(slot) = ept_slot(m, root, gpa, level) {
                        let value = if restore {
                            original.read(slot)
                        } else {
                            m.read(slot) ^ bit
                        };
                        m.write(slot, value);
                    }
                }
            }
            2 if pml => {
                let index = [0, 1, 0xffff, crate::vmx::PML_HEAD_INDEX][((r >> 32) % 4) as usize];
                quick_index.set(index);
                general_index.set(index);
            }
            _ => {
                let kind = [AccessKind::Read, AccessKind::Write, AccessKind::Execute]
                    [((r >> 32) % 3) as usize];
                let eptp = Eptp::new(Hpa(root), (r >> 34) % 2 == 0);
                let gla = [None, Some((Gva(0x1000), false)), Some((Gva(0x2000), true))]
                    [((r >> 35) % 3) as usize];
                let (mut a_refs, mut b_refs) = (0, 0);
                let a = ept_translate(
                    &quick_m.mem,
                    eptp,
                    log(&quick_index),
                    Gpa(gpa),
                    kind,
                    gla,
                    &mut a_refs,
                );
                let b = ept_translate_general(
                    &general_m.mem,
                    eptp,
                    log(&general_index),
                    Gpa(gpa),
                    kind,
                    gla,
                    &mut b_refs,
                );
                assert_eq!(
                    (a, a_refs),
                    (b, b_refs),
                    "step {step}: {kind:?} at {gpa:#x}"
                );
                translations += 1;
                successes += u64::from(a.is_ok());
            }
        }
        assert_eq!(quick_index.get(), general_index.get(), "step {step}");
        if step % 16 == 0 {
            assert!(
                tables(&quick_m) == tables(&general_m),
                "step {step}: memory"
            );
        }
    }
    let quick = ept::QUICK_WALKS.with(Cell::get) - quick_before;
    assert!(
        quick > 1000 && quick + 1000 < successes && successes < translations,
        "both ways must be exercised: {quick} quick walks, {successes} successes of {translations}"
    );
}

/// Where the EPT entry of `level` for `gpa` is, if the walk to it finds
/// only entries with some right and bit 7 clear above it.
fn ept_slot(m: &TestMachine, root: u64, gpa: u64, level: u32) -> Option<u64> {
    let mut table = root;
    for l in (level + 1..=3).rev() {
        let entry = m
            .mem
            .read_u64(Hpa(table + TestMachine::index(gpa, l) * 8))
            .ok()?;
        if entry & 7 == 0 || entry & epte::HUGE != 0 {
            return None;
        }
        table = entry & epte::ADDR_MASK;
    }
    let slot = table + TestMachine::index(gpa, level) * 8;
    (slot < MEM_SIZE).then_some(slot)
}

#[test]
fn the_quick_ept_walk_changes_nothing() {
    run(1, false);
}

#[test]
fn the_quick_ept_walk_changes_nothing_with_pml() {
    run(2, true);
}
