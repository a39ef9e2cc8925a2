//! Tests of the walkers and the TLB against hand-built page tables.

use super::ept::{ept_translate, epte, EptPerms};
use super::paging::{pf_error, pte};
use super::tlb::{Tlb, TlbConfig};
use super::*;
use crate::cpu::state::{cr0, cr4, efer};
use crate::vmx::{ept_qual, InveptKind, InvvpidKind};

#[path = "ept_tests.rs"]
mod ept_tests;
#[path = "psc_tests.rs"]
mod psc_tests;
#[path = "walk_tests.rs"]
mod walk_tests;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const MEM_SIZE: u64 = 16 * MIB;
/// Page-table frames come from here up; data pages are placed below.
const TABLE_AREA: u64 = 8 * MIB;

const P: u64 = pte::PRESENT;
const W: u64 = pte::WRITABLE;
const U: u64 = pte::USER;
const GUEST_TABLE: u64 = P | W | U;
const EPT_TABLE: u64 = epte::READ | epte::WRITE | epte::EXEC;
const EPT_RWX: u64 = EPT_TABLE | epte::MEMTYPE_WB;

const READ: Access = Access {
    kind: AccessKind::Read,
    user: false,
};
const WRITE: Access = Access {
    kind: AccessKind::Write,
    user: false,
};
const FETCH: Access = Access {
    kind: AccessKind::Execute,
    user: false,
};
const USER_READ: Access = Access {
    kind: AccessKind::Read,
    user: true,
};
const USER_WRITE: Access = Access {
    kind: AccessKind::Write,
    user: true,
};
const USER_FETCH: Access = Access {
    kind: AccessKind::Execute,
    user: true,
};

/// Machine memory with a bump allocator of zeroed frames and a builder for
/// 4-level tables (guest paging and EPT share the layout).
struct TestMachine {
    mem: PhysMemory,
    next_frame: u64,
}

impl TestMachine {
    fn new() -> Self {
        TestMachine {
            mem: PhysMemory::new(MEM_SIZE).unwrap(),
            next_frame: TABLE_AREA,
        }
    }

    fn frame(&mut self) -> u64 {
        let f = self.next_frame;
        assert!(f < MEM_SIZE, "test machine out of frames");
        self.next_frame += 4096;
        f
    }

    fn read(&self, hpa: u64) -> u64 {
        self.mem.read_u64(Hpa(hpa)).unwrap()
    }

    fn write(&self, hpa: u64, value: u64) {
        self.mem.write_u64(Hpa(hpa), value).unwrap()
    }

    fn index(va: u64, level: u32) -> u64 {
        (va >> (12 + 9 * level)) & 0x1ff
    }

    /// Maps `va` -> `pa` with a leaf of `size`, creating missing tables with
    /// `table_flags`. Tables are addressed as host-physical (the tests keep
    /// guest tables in EPT-identity-mapped memory).
    fn map(
        &mut self,
        root: u64,
        va: u64,
        pa: u64,
        size: PageSize,
        leaf_flags: u64,
        table_flags: u64,
    ) {
        let leaf_level = match size {
            PageSize::Size4K => 0,
            PageSize::Size2M => 1,
            PageSize::Size1G => 2,
        };
        let mut table = root;
        for level in (leaf_level + 1..=3).rev() {
            let slot = table + Self::index(va, level) * 8;
            let entry = self.read(slot);
            table = if entry == 0 {
                let t = self.frame();
                self.write(slot, t | table_flags);
                t
            } else {
                entry & pte::ADDR_MASK
            };
        }
        let huge = if leaf_level > 0 { pte::HUGE } else { 0 };
        self.write(
            table + Self::index(va, leaf_level) * 8,
            pa | leaf_flags | huge,
        );
    }

    /// Host-physical address of the entry for `va` at `level` (3 = top).
    fn slot(&self, root: u64, va: u64, level: u32) -> u64 {
        let mut table = root;
        for l in (level + 1..=3).rev() {
            table = self.read(table + Self::index(va, l) * 8) & pte::ADDR_MASK;
        }
        table + Self::index(va, level) * 8
    }

    fn set_bits(&self, hpa: u64, bits: u64) {
        self.write(hpa, self.read(hpa) | bits);
    }

    fn clear_bits(&self, hpa: u64, bits: u64) {
        self.write(hpa, self.read(hpa) & !bits);
    }

    /// An EPT identity map of all machine memory with 4 KiB pages.
    fn identity_ept(&mut self, ad: bool) -> Eptp {
        let root = self.frame();
        for page in (0..MEM_SIZE).step_by(4096) {
            self.map(root, page, page, PageSize::Size4K, EPT_RWX, EPT_TABLE);
        }
        Eptp::new(Hpa(root), ad)
    }

    fn ctx(&self, regs: PagingRegs, ept: Option<Eptp>, vpid: u16) -> TranslateCtx<'_> {
        TranslateCtx {
            mem: &self.mem,
            regs,
            ept,
            vpid,
            pml: None,
        }
    }
}

/// Long mode with WP, PGE and NXE; SMEP/SMAP off.
fn regs(cr3: u64) -> PagingRegs {
    PagingRegs {
        cr0: cr0::PE | cr0::PG | cr0::WP,
        cr3,
        cr4: cr4::PAE | cr4::PGE,
        efer: efer::LME | efer::LMA | efer::NXE,
        rflags_ac: false,
    }
}

/// A fixed pseudo-random sequence (xorshift64*) from `seed`.
fn random(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed | 1;
    move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The words of the page tables (and EPT tables) and the PML log, to
/// compare.
fn tables(m: &TestMachine) -> Vec<u64> {
    (TABLE_AREA..m.next_frame)
        .chain(PML_PAGE..PML_PAGE + 0x1000)
        .step_by(8)
        .map(|a| m.read(a))
        .collect()
}

fn new_tlb() -> Tlb {
    Tlb::new(TlbConfig::default())
}

/// Translates and returns the result with the walk references it made.
fn tr(
    tlb: &mut Tlb,
    ctx: &TranslateCtx<'_>,
    gva: u64,
    access: Access,
) -> (Result<Hpa, TranslateError>, u64) {
    let mut refs = 0;
    let r = translate(tlb, ctx, Gva(gva), access, &mut refs);
    (r, refs)
}

/// The #PF error code of a translation that must fault at `gva`.
fn pf_code(ctx: &TranslateCtx<'_>, gva: u64, access: Access) -> u32 {
    match tr(&mut new_tlb(), ctx, gva, access).0 {
        Err(TranslateError::PageFault {
            gva: cr2,
            error_code,
        }) => {
            assert_eq!(cr2, Gva(gva));
            error_code
        }
        other => panic!("expected #PF at {gva:#x}, got {other:?}"),
    }
}

/// Guest tables with one 4 KiB page `va` -> `pa` with `leaf_flags`.
fn one_page(m: &mut TestMachine, va: u64, pa: u64, leaf_flags: u64) -> u64 {
    let root = m.frame();
    m.map(root, va, pa, PageSize::Size4K, leaf_flags, GUEST_TABLE);
    root
}

// ---------------------------------------------------------------------------
// Guest paging without EPT.

#[test]
fn translates_4k_2m_1g_pages() {
    let mut m = TestMachine::new();
    let root = m.frame();
    m.map(
        root,
        0x7000_0000_1000,
        0x30_0000,
        PageSize::Size4K,
        P | W,
        GUEST_TABLE,
    );
    m.map(
        root,
        0x4020_0000,
        0x60_0000,
        PageSize::Size2M,
        P | W,
        GUEST_TABLE,
    );
    m.map(
        root,
        0x80_0000_0000,
        0x4000_0000,
        PageSize::Size1G,
        P | W,
        GUEST_TABLE,
    );
    m.map(
        root,
        0xffff_8000_0000_0000,
        0x31_0000,
        PageSize::Size4K,
        P | W,
        GUEST_TABLE,
    );
    let ctx = m.ctx(regs(root), None, 0);
    let mut tlb = new_tlb();

    assert_eq!(
        tr(&mut tlb, &ctx, 0x7000_0000_1234, READ),
        (Ok(Hpa(0x30_0234)), 4)
    );
    assert_eq!(
        tr(&mut tlb, &ctx, 0x4020_0000 + 0x12345, READ),
        (Ok(Hpa(0x61_2345)), 3)
    );
    assert_eq!(
        tr(&mut tlb, &ctx, 0x80_0000_0000 + 0x1234_5678, WRITE),
        (Ok(Hpa(0x4000_0000 + 0x1234_5678)), 2)
    );
    assert_eq!(
        tr(&mut tlb, &ctx, 0xffff_8000_0000_0008, READ),
        (Ok(Hpa(0x31_0008)), 4)
    );
    // The low-half page with the same low 47 bits is not mapped.
    assert_eq!(pf_code(&ctx, 0x0000_0000_0000_0008, READ), 0);
}

#[test]
fn non_canonical_and_paging_off() {
    let m = TestMachine::new();
    let mut tlb = new_tlb();
    let mut r = regs(0);
    for gva in [
        0x0000_8000_0000_0000,
        0xffff_7fff_ffff_ffff,
        0x0001_0000_0000_0000,
    ] {
        assert_eq!(
            tr(&mut tlb, &m.ctx(r, None, 0), gva, READ).0,
            Err(TranslateError::NonCanonical { gva: Gva(gva) })
        );
    }
    r.cr0 &= !cr0::PG;
    assert_eq!(
        tr(&mut tlb, &m.ctx(r, None, 0), 0x1234_5678, WRITE),
        (Ok(Hpa(0x1234_5678)), 0)
    );
    assert_eq!(tlb.occupancy(), 0);
}

#[test]
fn not_present_error_codes() {
    let mut m = TestMachine::new();
    let root = one_page(&mut m, 0x1000, 0x5000, P | W | U);
    let r = regs(root);
    let ctx = m.ctx(r, None, 0);
    let unmapped = 0x2000;
    assert_eq!(pf_code(&ctx, unmapped, READ), 0);
    assert_eq!(pf_code(&ctx, unmapped, WRITE), pf_error::WRITE);
    assert_eq!(pf_code(&ctx, unmapped, USER_READ), pf_error::USER);
    assert_eq!(
        pf_code(&ctx, unmapped, USER_WRITE),
        pf_error::WRITE | pf_error::USER
    );
    assert_eq!(pf_code(&ctx, unmapped, FETCH), pf_error::FETCH);
    assert_eq!(
        pf_code(&ctx, unmapped, USER_FETCH),
        pf_error::FETCH | pf_error::USER
    );
    // Not present at the PML4 level.
    assert_eq!(pf_code(&ctx, 0x7f00_0000_0000, READ), 0);

    // I/D is reported only with NXE or SMEP.
    let mut no_nx = r;
    no_nx.efer &= !efer::NXE;
    assert_eq!(pf_code(&m.ctx(no_nx, None, 0), unmapped, FETCH), 0);
    let mut smep_only = no_nx;
    smep_only.cr4 |= cr4::SMEP;
    assert_eq!(
        pf_code(&m.ctx(smep_only, None, 0), unmapped, FETCH),
        pf_error::FETCH
    );
}

#[test]
fn user_access_to_supervisor_page() {
    let mut m = TestMachine::new();
    let root = m.frame();
    m.map(root, 0x1000, 0x5000, PageSize::Size4K, P | W, GUEST_TABLE);
    // U clear in the upper entries only: still a supervisor page.
    m.map(
        root,
        0x4000_0000,
        0x6000,
        PageSize::Size4K,
        P | W | U,
        P | W,
    );
    let ctx = m.ctx(regs(root), None, 0);
    for gva in [0x1000, 0x4000_0000] {
        assert_eq!(
            pf_code(&ctx, gva, USER_READ),
            pf_error::PRESENT | pf_error::USER
        );
        assert_eq!(
            pf_code(&ctx, gva, USER_WRITE),
            pf_error::PRESENT | pf_error::WRITE | pf_error::USER
        );
        assert_eq!(
            pf_code(&ctx, gva, USER_FETCH),
            pf_error::PRESENT | pf_error::USER | pf_error::FETCH
        );
        assert!(tr(&mut new_tlb(), &ctx, gva, READ).0.is_ok());
    }
}

#[test]
fn write_protection_and_cr0_wp() {
    let mut m = TestMachine::new();
    let root = m.frame();
    m.map(root, 0x1000, 0x5000, PageSize::Size4K, P | U, GUEST_TABLE);
    // Read-only in the upper entries only.
    m.map(
        root,
        0x80_0000_0000,
        0x6000,
        PageSize::Size4K,
        P | W | U,
        P | U,
    );
    let mut r = regs(root);
    for gva in [0x1000, 0x80_0000_0000] {
        let ctx = m.ctx(r, None, 0);
        assert_eq!(
            pf_code(&ctx, gva, WRITE),
            pf_error::PRESENT | pf_error::WRITE
        );
        assert_eq!(
            pf_code(&ctx, gva, USER_WRITE),
            pf_error::PRESENT | pf_error::WRITE | pf_error::USER
        );
        assert!(tr(&mut new_tlb(), &ctx, gva, USER_READ).0.is_ok());
    }
    r.cr0 &= !cr0::WP;
    let ctx = m.ctx(r, None, 0);
    for gva in [0x1000, 0x80_0000_0000] {
        // Supervisor writes ignore R/W with WP clear; user writes never do.
        assert!(tr(&mut new_tlb(), &ctx, gva, WRITE).0.is_ok());
        assert_eq!(
            pf_code(&ctx, gva, USER_WRITE),
            pf_error::PRESENT | pf_error::WRITE | pf_error::USER
        );
    }
}

#[test]
fn no_execute() {
    let mut m = TestMachine::new();
    let root = m.frame();
    m.map(
        root,
        0x1000,
        0x5000,
        PageSize::Size4K,
        P | W | U | pte::NX,
        GUEST_TABLE,
    );
    // XD in the PML4E covers everything below it.
    m.map(
        root,
        0x80_0000_0000,
        0x6000,
        PageSize::Size4K,
        P | W | U,
        GUEST_TABLE,
    );
    m.set_bits(m.slot(root, 0x80_0000_0000, 3), pte::NX);
    let ctx = m.ctx(regs(root), None, 0);
    for gva in [0x1000, 0x80_0000_0000] {
        assert_eq!(
            pf_code(&ctx, gva, FETCH),
            pf_error::PRESENT | pf_error::FETCH
        );
        assert_eq!(
            pf_code(&ctx, gva, USER_FETCH),
            pf_error::PRESENT | pf_error::FETCH | pf_error::USER
        );
        assert!(tr(&mut new_tlb(), &ctx, gva, WRITE).0.is_ok());
    }
}

#[test]
fn reserved_bits() {
    const RSVD: u32 = pf_error::PRESENT | pf_error::RSVD;
    // Each case: (page size, level to corrupt, bits to set).
    let cases: [(PageSize, u32, u64); 9] = [
        (PageSize::Size4K, 3, 1 << 46),   // PML4E address above MAXPHYADDR
        (PageSize::Size4K, 2, 1 << 51),   // PDPTE
        (PageSize::Size4K, 1, 1 << 48),   // PDE
        (PageSize::Size4K, 0, 1 << 50),   // PTE
        (PageSize::Size4K, 3, pte::HUGE), // PS in a PML4E
        (PageSize::Size2M, 1, 1 << 13),   // 2 MiB leaf, bit 13
        (PageSize::Size2M, 1, 1 << 20),   // 2 MiB leaf, bit 20
        (PageSize::Size1G, 2, 1 << 13),   // 1 GiB leaf, bit 13
        (PageSize::Size1G, 2, 1 << 29),   // 1 GiB leaf, bit 29
    ];
    for (size, level, bits) in cases {
        let mut m = TestMachine::new();
        let root = m.frame();
        let va = 0x40_0000_0000;
        m.map(root, va, GIB, size, P | W | U, GUEST_TABLE);
        let ctx = m.ctx(regs(root), None, 0);
        assert!(tr(&mut new_tlb(), &ctx, va, READ).0.is_ok());
        m.set_bits(m.slot(root, va, level), bits);
        let ctx = m.ctx(regs(root), None, 0);
        let what = format!("{size:?} level {level} bits {bits:#x}");
        assert_eq!(pf_code(&ctx, va, READ), RSVD, "{what}");
        assert_eq!(
            pf_code(&ctx, va, USER_WRITE),
            RSVD | pf_error::WRITE | pf_error::USER,
            "{what}"
        );
        assert_eq!(pf_code(&ctx, va, FETCH), RSVD | pf_error::FETCH, "{what}");
        // Reserved bits in a not-present entry do not matter.
        m.clear_bits(m.slot(root, va, level), P);
        assert_eq!(pf_code(&m.ctx(regs(root), None, 0), va, READ), 0, "{what}");
    }

    // The PAT bit (12) of a large leaf is not reserved, and not address.
    let mut m = TestMachine::new();
    let root = m.frame();
    m.map(
        root,
        0x20_0000,
        0x40_0000 | (1 << 12),
        PageSize::Size2M,
        P | W,
        GUEST_TABLE,
    );
    let ctx = m.ctx(regs(root), None, 0);
    assert_eq!(
        tr(&mut new_tlb(), &ctx, 0x20_0010, READ).0,
        Ok(Hpa(0x40_0010))
    );
}

#[test]
fn xd_without_nxe_is_reserved() {
    let mut m = TestMachine::new();
    let root = one_page(&mut m, 0x1000, 0x5000, P | W | pte::NX);
    let mut r = regs(root);
    r.efer &= !efer::NXE;
    let ctx = m.ctx(r, None, 0);
    assert_eq!(
        pf_code(&ctx, 0x1000, READ),
        pf_error::PRESENT | pf_error::RSVD
    );
    // No I/D bit: neither NXE nor SMEP is on.
    assert_eq!(
        pf_code(&ctx, 0x1000, FETCH),
        pf_error::PRESENT | pf_error::RSVD
    );
    // With NXE the same entry is a valid no-execute page.
    let ctx = m.ctx(regs(root), None, 0);
    assert!(tr(&mut new_tlb(), &ctx, 0x1000, READ).0.is_ok());
}

#[test]
fn smep_and_smap() {
    let mut m = TestMachine::new();
    let root = m.frame();
    m.map(
        root,
        0x1000,
        0x5000,
        PageSize::Size4K,
        P | W | U,
        GUEST_TABLE,
    );
    m.map(root, 0x2000, 0x6000, PageSize::Size4K, P | W, GUEST_TABLE);
    let mut r = regs(root);
    r.cr4 |= cr4::SMEP;
    let ctx = m.ctx(r, None, 0);
    assert_eq!(
        pf_code(&ctx, 0x1000, FETCH),
        pf_error::PRESENT | pf_error::FETCH
    );
    assert!(tr(&mut new_tlb(), &ctx, 0x1000, USER_FETCH).0.is_ok());
    assert!(tr(&mut new_tlb(), &ctx, 0x2000, FETCH).0.is_ok());
    // SMEP does not restrict data accesses.
    assert!(tr(&mut new_tlb(), &ctx, 0x1000, WRITE).0.is_ok());

    r.cr4 = (r.cr4 & !cr4::SMEP) | cr4::SMAP;
    let ctx = m.ctx(r, None, 0);
    assert_eq!(pf_code(&ctx, 0x1000, READ), pf_error::PRESENT);
    assert_eq!(
        pf_code(&ctx, 0x1000, WRITE),
        pf_error::PRESENT | pf_error::WRITE
    );
    assert!(tr(&mut new_tlb(), &ctx, 0x1000, FETCH).0.is_ok());
    assert!(tr(&mut new_tlb(), &ctx, 0x1000, USER_WRITE).0.is_ok());
    assert!(tr(&mut new_tlb(), &ctx, 0x2000, WRITE).0.is_ok());
    r.rflags_ac = true;
    let ctx = m.ctx(r, None, 0);
    assert!(tr(&mut new_tlb(), &ctx, 0x1000, READ).0.is_ok());
    assert!(tr(&mut new_tlb(), &ctx, 0x1000, WRITE).0.is_ok());
}

#[test]
fn accessed_and_dirty_flags() {
    let mut m = TestMachine::new();
    let root = m.frame();
    let va = 0x1000;
    m.map(root, va, 0x5000, PageSize::Size4K, P | W, GUEST_TABLE);
    m.map(
        root,
        0x4000_0000,
        0x40_0000,
        PageSize::Size2M,
        P | W,
        GUEST_TABLE,
    );
    m.map(root, 0x7000, 0x7000, PageSize::Size4K, P, GUEST_TABLE);
    let ctx = m.ctx(regs(root), None, 0);
    let slots: Vec<u64> = (0..4).rev().map(|l| m.slot(root, va, l)).collect();
    let mut tlb = new_tlb();

    // A faulting access changes nothing.
    assert!(tr(&mut tlb, &ctx, 0x7000, WRITE).0.is_err());
    assert_eq!(
        m.read(m.slot(root, 0x7000, 0)) & (pte::ACCESSED | pte::DIRTY),
        0
    );

    tr(&mut tlb, &ctx, va, READ).0.unwrap();
    for &s in &slots {
        assert_eq!(m.read(s) & (pte::ACCESSED | pte::DIRTY), pte::ACCESSED);
    }
    // A write that hits an entry without D known re-walks and sets D in the
    // leaf only.
    assert_eq!(tr(&mut tlb, &ctx, va, WRITE).1, 4);
    assert_eq!(m.read(slots[3]) & pte::DIRTY, pte::DIRTY);
    for &s in &slots[..3] {
        assert_eq!(m.read(s) & pte::DIRTY, 0);
    }
    assert_eq!(tr(&mut tlb, &ctx, va, WRITE).1, 0);

    // 2 MiB leaf gets D as well.
    tr(&mut tlb, &ctx, 0x4000_0000, WRITE).0.unwrap();
    assert_eq!(
        m.read(m.slot(root, 0x4000_0000, 1)) & (pte::ACCESSED | pte::DIRTY),
        pte::ACCESSED | pte::DIRTY
    );
}

#[test]
fn permissions_are_checked_at_lookup_time() {
    let mut m = TestMachine::new();
    let root = one_page(&mut m, 0x1000, 0x5000, P);
    let mut r = regs(root);
    r.cr0 &= !cr0::WP;
    let mut tlb = new_tlb();
    assert_eq!(
        tr(&mut tlb, &m.ctx(r, None, 0), 0x1000, WRITE),
        (Ok(Hpa(0x5000)), 4)
    );
    assert_eq!(
        tr(&mut tlb, &m.ctx(r, None, 0), 0x1000, WRITE),
        (Ok(Hpa(0x5000)), 0)
    );
    // Setting WP needs no flush: the cached entry no longer allows it.
    r.cr0 |= cr0::WP;
    assert_eq!(
        tr(&mut tlb, &m.ctx(r, None, 0), 0x1000, WRITE).0,
        Err(TranslateError::PageFault {
            gva: Gva(0x1000),
            error_code: pf_error::PRESENT | pf_error::WRITE
        })
    );
    assert!(matches!(
        tr(&mut tlb, &m.ctx(r, None, 0), 0x1000, USER_READ).0,
        Err(TranslateError::PageFault { .. })
    ));
    assert_eq!(
        tr(&mut tlb, &m.ctx(r, None, 0), 0x1000, READ),
        (Ok(Hpa(0x5000)), 4)
    );
    assert_eq!(
        tr(&mut tlb, &m.ctx(r, None, 0), 0x1000, READ),
        (Ok(Hpa(0x5000)), 0)
    );
}

#[test]
fn tables_outside_memory_are_memory_errors() {
    let mut m = TestMachine::new();
    let ctx = m.ctx(regs(MEM_SIZE + 0x1000), None, 0);
    assert!(matches!(
        tr(&mut new_tlb(), &ctx, 0x1000, READ).0,
        Err(TranslateError::Memory(MemError::OutOfRange { .. }))
    ));
    let root = one_page(&mut m, 0x1000, 0x5000, P | W);
    let pd = m.slot(root, 0x1000, 1);
    m.write(pd, (40 * GIB) | GUEST_TABLE);
    let ctx = m.ctx(regs(root), None, 0);
    assert!(matches!(
        tr(&mut new_tlb(), &ctx, 0x1000, READ).0,
        Err(TranslateError::Memory(MemError::OutOfRange { .. }))
    ));
    // The same under EPT: an EPT root outside memory.
    let ctx = m.ctx(regs(root), Some(Eptp::new(Hpa(MEM_SIZE), false)), 1);
    assert!(matches!(
        tr(&mut new_tlb(), &ctx, 0x1000, READ).0,
        Err(TranslateError::Memory(_))
    ));
}

// ---------------------------------------------------------------------------
// EPT.

/// An EPT with one 4 KiB mapping `gpa` -> `hpa` with `flags`.
fn one_ept_page(m: &mut TestMachine, gpa: u64, hpa: u64, flags: u64, ad: bool) -> (u64, Eptp) {
    let root = m.frame();
    m.map(root, gpa, hpa, PageSize::Size4K, flags, EPT_TABLE);
    (root, Eptp::new(Hpa(root), ad))
}

fn ept_walk(
    m: &TestMachine,
    eptp: Eptp,
    gpa: u64,
    kind: AccessKind,
) -> (Result<ept::EptTranslation, TranslateError>, u64) {
    let mut refs = 0;
    let r = ept_translate(&m.mem, eptp, None, Gpa(gpa), kind, None, &mut refs);
    (r, refs)
}

fn qualification(r: Result<ept::EptTranslation, TranslateError>) -> u64 {
    match r {
        Err(TranslateError::EptViolation { qualification, .. }) => qualification,
        other => panic!("expected an EPT violation, got {other:?}"),
    }
}

#[test]
fn ept_identity_and_remapped_translation() {
    let mut m = TestMachine::new();
    let eptp = m.identity_ept(false);
    let (t, refs) = ept_walk(&m, eptp, 0x12345, AccessKind::Write);
    let t = t.unwrap();
    assert_eq!(
        (t.hpa, t.perms, t.page_size, refs),
        (Hpa(0x12345), EptPerms::ALL, PageSize::Size4K, 4)
    );

    let root = eptp.pml4().0;
    m.map(
        root,
        0x1_0000_0000,
        0x60_0000,
        PageSize::Size2M,
        EPT_RWX,
        EPT_TABLE,
    );
    m.map(
        root,
        0x40_0000_0000,
        0x4000_0000,
        PageSize::Size1G,
        EPT_RWX,
        EPT_TABLE,
    );
    let (t, refs) = ept_walk(&m, eptp, 0x1_0001_2345, AccessKind::Read);
    assert_eq!((t.unwrap().hpa, refs), (Hpa(0x61_2345), 3));
    let (t, refs) = ept_walk(&m, eptp, 0x40_1234_5678, AccessKind::Execute);
    let t = t.unwrap();
    assert_eq!(
        (t.hpa, t.page_size, refs),
        (Hpa(0x5234_5678), PageSize::Size1G, 2)
    );
}

#[test]
fn ept_violation_qualification() {
    use ept_qual::*;
    let mut m = TestMachine::new();
    let root = m.frame();
    let eptp = Eptp::new(Hpa(root), false);
    let r_only = 0x1000;
    let x_only = 0x2000;
    let rx = 0x3000;
    m.map(
        root,
        r_only,
        0x10_0000,
        PageSize::Size4K,
        epte::READ | epte::MEMTYPE_WB,
        EPT_TABLE,
    );
    m.map(
        root,
        x_only,
        0x10_1000,
        PageSize::Size4K,
        epte::EXEC | epte::MEMTYPE_WB,
        EPT_TABLE,
    );
    m.map(
        root,
        rx,
        0x10_2000,
        PageSize::Size4K,
        epte::READ | epte::EXEC,
        EPT_TABLE,
    );
    // Permissions AND across levels: write denied by the PDE.
    let upper_ro = 0x4000_0000;
    m.map(
        root,
        upper_ro,
        0x10_3000,
        PageSize::Size4K,
        EPT_RWX,
        epte::READ | epte::EXEC,
    );

    assert!(ept_walk(&m, eptp, r_only, AccessKind::Read).0.is_ok());
    assert_eq!(
        qualification(ept_walk(&m, eptp, r_only, AccessKind::Write).0),
        WRITE | READABLE
    );
    assert_eq!(
        qualification(ept_walk(&m, eptp, r_only, AccessKind::Execute).0),
        FETCH | READABLE
    );
    assert_eq!(
        qualification(ept_walk(&m, eptp, x_only, AccessKind::Read).0),
        READ | EXECUTABLE
    );
    assert!(ept_walk(&m, eptp, x_only, AccessKind::Execute).0.is_ok());
    assert_eq!(
        qualification(ept_walk(&m, eptp, rx, AccessKind::Write).0),
        WRITE | READABLE | EXECUTABLE
    );
    assert_eq!(
        qualification(ept_walk(&m, eptp, upper_ro + 8, AccessKind::Write).0),
        WRITE | READABLE | EXECUTABLE
    );
    assert!(ept_walk(&m, eptp, upper_ro + 8, AccessKind::Read).0.is_ok());

    // Not present (in the PT, and at the PML4 level): no permission bits.
    let (r, refs) = ept_walk(&m, eptp, 0x5000, AccessKind::Write);
    assert_eq!((qualification(r), refs), (WRITE, 4));
    let (r, refs) = ept_walk(&m, eptp, 0x100_0000_0000, AccessKind::Execute);
    assert_eq!((qualification(r), refs), (FETCH, 1));
    // A gpa above MAXPHYADDR cannot be mapped.
    assert_eq!(
        qualification(ept_walk(&m, eptp, 1 << 46, AccessKind::Read).0),
        READ
    );

    match ept_walk(&m, eptp, r_only + 0x10, AccessKind::Write).0 {
        Err(TranslateError::EptViolation { gpa, gla, .. }) => {
            assert_eq!((gpa, gla), (Gpa(r_only + 0x10), None));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn ept_misconfigurations() {
    let mut m = TestMachine::new();
    let root = m.frame();
    let eptp = Eptp::new(Hpa(root), false);
    let gpa = 0x20_0000;
    let misconfig = Some(TranslateError::EptMisconfig { gpa: Gpa(gpa) });
    m.map(root, gpa, 0x30_0000, PageSize::Size4K, EPT_RWX, EPT_TABLE);
    let pte_slot = m.slot(root, gpa, 0);
    let good = m.read(pte_slot);
    assert!(ept_walk(&m, eptp, gpa, AccessKind::Read).0.is_ok());

    let bad_leaves = [
        0x30_0000 | epte::WRITE | epte::MEMTYPE_WB, // W without R
        0x30_0000 | epte::WRITE | epte::EXEC | epte::MEMTYPE_WB, // W|X without R
        0x30_0000 | EPT_TABLE | (2 << epte::MEMTYPE_SHIFT), // memory type 2
        0x30_0000 | EPT_TABLE | (3 << epte::MEMTYPE_SHIFT), // memory type 3
        0x30_0000 | EPT_TABLE | (7 << epte::MEMTYPE_SHIFT), // memory type 7
        0x30_0000 | EPT_RWX | (1 << 46),            // above MAXPHYADDR
    ];
    for leaf in bad_leaves {
        m.write(pte_slot, leaf);
        assert_eq!(
            ept_walk(&m, eptp, gpa, AccessKind::Read).0.err(),
            misconfig,
            "{leaf:#x}"
        );
    }
    // Execute-only and the UC/WB memory types are fine.
    for leaf in [0x30_0000 | epte::EXEC, 0x30_0000 | EPT_TABLE, good] {
        m.write(pte_slot, leaf);
        assert!(
            ept_walk(&m, eptp, gpa, AccessKind::Execute).0.is_ok(),
            "{leaf:#x}"
        );
    }

    // Bit 7 in a PML4E; W without R in a non-leaf entry; address above
    // MAXPHYADDR in a non-leaf entry.
    for (level, bits) in [(3, epte::HUGE), (2, 1 << 50)] {
        let slot = m.slot(root, gpa, level);
        let saved = m.read(slot);
        m.write(slot, saved | bits);
        assert_eq!(
            ept_walk(&m, eptp, gpa, AccessKind::Read).0.err(),
            misconfig,
            "level {level}"
        );
        m.write(slot, saved);
    }
    let pd_slot = m.slot(root, gpa, 1);
    let saved = m.read(pd_slot);
    m.write(pd_slot, saved & !epte::READ);
    assert_eq!(ept_walk(&m, eptp, gpa, AccessKind::Read).0.err(), misconfig);
    m.write(pd_slot, saved);

    // Reserved address bits of large leaves.
    m.map(
        root,
        0x4000_0000,
        0x60_0000 | (1 << 12),
        PageSize::Size2M,
        EPT_RWX,
        EPT_TABLE,
    );
    assert_eq!(
        ept_walk(&m, eptp, 0x4000_0000, AccessKind::Read).0.err(),
        Some(TranslateError::EptMisconfig {
            gpa: Gpa(0x4000_0000)
        })
    );
    m.map(
        root,
        0x80_0000_0000,
        0x4000_0000 | (1 << 29),
        PageSize::Size1G,
        EPT_RWX,
        EPT_TABLE,
    );
    assert_eq!(
        ept_walk(&m, eptp, 0x80_0000_0000, AccessKind::Read).0.err(),
        Some(TranslateError::EptMisconfig {
            gpa: Gpa(0x80_0000_0000)
        })
    );
}

#[test]
fn ept_accessed_and_dirty() {
    let mut m = TestMachine::new();
    let gpa = 0x20_0000;
    let (root, eptp) = one_ept_page(&mut m, gpa, 0x30_0000, EPT_RWX, true);
    let slots: Vec<u64> = (0..4).rev().map(|l| m.slot(root, gpa, l)).collect();
    let ad = epte::ACCESSED | epte::DIRTY;

    // A violation sets nothing.
    m.clear_bits(slots[3], epte::WRITE);
    assert!(ept_walk(&m, eptp, gpa, AccessKind::Write).0.is_err());
    assert!(slots.iter().all(|&s| m.read(s) & ad == 0));
    m.set_bits(slots[3], epte::WRITE);

    let t = ept_walk(&m, eptp, gpa, AccessKind::Read).0.unwrap();
    assert!(!t.dirty_recorded);
    assert!(slots.iter().all(|&s| m.read(s) & ad == epte::ACCESSED));
    let t = ept_walk(&m, eptp, gpa, AccessKind::Write).0.unwrap();
    assert!(t.dirty_recorded);
    assert_eq!(m.read(slots[3]) & ad, ad);
    assert!(slots[..3].iter().all(|&s| m.read(s) & ad == epte::ACCESSED));

    // Without A/D in the EPTP the flags are left alone.
    let (root, eptp) = one_ept_page(&mut m, gpa, 0x30_0000, EPT_RWX, false);
    assert!(
        ept_walk(&m, eptp, gpa, AccessKind::Write)
            .0
            .unwrap()
            .dirty_recorded
    );
    assert_eq!(m.read(m.slot(root, gpa, 0)) & ad, 0);
}

/// Guest tables for `va` -> `gpa` (4 KiB) plus an identity EPT.
fn two_d_setup(m: &mut TestMachine, va: u64, gpa: u64, ad: bool) -> (u64, Eptp) {
    let root = one_page(m, va, gpa, P | W | U);
    (root, m.identity_ept(ad))
}

#[test]
fn two_dimensional_walk_references() {
    let mut m = TestMachine::new();
    let va = 0x7f12_3456_7000;
    let (root, eptp) = two_d_setup(&mut m, va, 0x30_0000, false);
    let mut tlb = new_tlb();
    let ctx = m.ctx(regs(root), Some(eptp), 1);
    assert_eq!(
        tr(&mut tlb, &ctx, va + 0x10, READ),
        (Ok(Hpa(0x30_0010)), 24)
    );
    assert_eq!(tr(&mut tlb, &ctx, va + 0x18, READ), (Ok(Hpa(0x30_0018)), 0));

    // Bare 4 KiB walk: 4; TLB hit: 0.
    let bare = m.ctx(regs(root), None, 0);
    assert_eq!(tr(&mut tlb, &bare, va, READ), (Ok(Hpa(0x30_0000)), 4));
    assert_eq!(tr(&mut tlb, &bare, va, READ), (Ok(Hpa(0x30_0000)), 0));

    // Guest 2 MiB page under 4 KiB EPT: 3 * (4 + 1) + 4.
    m.map(
        root,
        0x4000_0000,
        0x40_0000,
        PageSize::Size2M,
        P | W,
        GUEST_TABLE,
    );
    let ctx = m.ctx(regs(root), Some(eptp), 1);
    assert_eq!(
        tr(&mut tlb, &ctx, 0x4000_1008, READ),
        (Ok(Hpa(0x40_1008)), 19)
    );

    // Guest paging off under EPT: the EPT walk alone, then cached.
    let mut off = regs(root);
    off.cr0 &= !cr0::PG;
    let ctx = m.ctx(off, Some(eptp), 1);
    assert_eq!(tr(&mut tlb, &ctx, 0x5008, WRITE), (Ok(Hpa(0x5008)), 4));
    assert_eq!(tr(&mut tlb, &ctx, 0x5010, READ), (Ok(Hpa(0x5010)), 0));
    assert_eq!(tlb.stats().hits, 3);
    assert_eq!(tlb.stats().misses, 4);
}

#[test]
fn ept_violation_in_guest_walk_vs_final_access() {
    use ept_qual::{EXECUTABLE, GLA_TRANSLATED, GLA_VALID, READABLE, WRITABLE};
    let mut m = TestMachine::new();
    let va = 0x1000;
    let data_gpa = 0x30_0000;
    let (root, eptp) = two_d_setup(&mut m, va, data_gpa, false);
    let ept_root = eptp.pml4().0;
    let ctx = m.ctx(regs(root), Some(eptp), 1);

    // Final access: EPT leaf of the data page not present.
    let data_slot = m.slot(ept_root, data_gpa, 0);
    let saved = m.read(data_slot);
    m.write(data_slot, 0);
    assert_eq!(
        tr(&mut new_tlb(), &ctx, va + 4, USER_WRITE).0,
        Err(TranslateError::EptViolation {
            gpa: Gpa(data_gpa + 4),
            gla: Some(Gva(va + 4)),
            qualification: ept_qual::WRITE | GLA_VALID | GLA_TRANSLATED,
        })
    );
    // Permission violation on the final access: execute-disabled page.
    m.write(data_slot, saved & !epte::EXEC);
    assert_eq!(
        tr(&mut new_tlb(), &ctx, va, FETCH).0,
        Err(TranslateError::EptViolation {
            gpa: Gpa(data_gpa),
            gla: Some(Gva(va)),
            qualification: ept_qual::FETCH | READABLE | WRITABLE | GLA_VALID | GLA_TRANSLATED,
        })
    );
    m.write(data_slot, saved);

    // Paging-structure access: the guest PT page not present in EPT.
    let guest_pte = m.slot(root, va, 0);
    let pt_page = guest_pte & !0xfff;
    let pt_slot = m.slot(ept_root, pt_page, 0);
    let saved = m.read(pt_slot);
    m.write(pt_slot, 0);
    assert_eq!(
        tr(&mut new_tlb(), &ctx, va, READ).0,
        Err(TranslateError::EptViolation {
            gpa: Gpa(guest_pte),
            gla: Some(Gva(va)),
            qualification: ept_qual::READ | GLA_VALID,
        })
    );
    // With EPT A/D, paging-structure accesses are writes.
    let ctx_ad = m.ctx(regs(root), Some(Eptp::new(Hpa(ept_root), true)), 1);
    assert_eq!(
        tr(&mut new_tlb(), &ctx_ad, va, READ).0,
        Err(TranslateError::EptViolation {
            gpa: Gpa(guest_pte),
            gla: Some(Gva(va)),
            qualification: ept_qual::WRITE | GLA_VALID,
        })
    );

    // Guest PT page EPT-read-only: reading works if A is already set in the
    // guest PTE, else setting A is an EPT write violation.
    m.write(pt_slot, saved & !epte::WRITE);
    m.clear_bits(guest_pte, pte::ACCESSED | pte::DIRTY);
    assert_eq!(
        tr(&mut new_tlb(), &ctx, va, READ).0,
        Err(TranslateError::EptViolation {
            gpa: Gpa(guest_pte),
            gla: Some(Gva(va)),
            qualification: ept_qual::WRITE | READABLE | EXECUTABLE | GLA_VALID,
        })
    );
    assert_eq!(m.read(guest_pte) & pte::ACCESSED, 0);
    m.set_bits(guest_pte, pte::ACCESSED);
    assert_eq!(tr(&mut new_tlb(), &ctx, va, READ).0, Ok(Hpa(data_gpa)));
    // ... and a write still needs to set D.
    assert!(matches!(
        tr(&mut new_tlb(), &ctx, va, WRITE).0,
        Err(TranslateError::EptViolation { gpa, .. }) if gpa == Gpa(guest_pte)
    ));
}

#[test]
fn ept_ad_with_guest_walk() {
    let mut m = TestMachine::new();
    let va = 0x1000;
    let data_gpa = 0x30_0000;
    let (root, eptp) = two_d_setup(&mut m, va, data_gpa, true);
    let ept_root = eptp.pml4().0;
    let ctx = m.ctx(regs(root), Some(eptp), 1);
    let mut tlb = new_tlb();
    let ad = epte::ACCESSED | epte::DIRTY;

    assert_eq!(tr(&mut tlb, &ctx, va, READ), (Ok(Hpa(data_gpa)), 24));
    // Guest paging-structure pages were accessed as writes: EPT D set.
    for level in 0..4 {
        let table_page = m.slot(root, va, level) & !0xfff;
        assert_eq!(
            m.read(m.slot(ept_root, table_page, 0)) & ad,
            ad,
            "guest level {level}"
        );
    }
    let data_slot = m.slot(ept_root, data_gpa, 0);
    assert_eq!(m.read(data_slot) & ad, epte::ACCESSED);
    // The cached entry does not know the EPT D flag: the write re-walks.
    assert_eq!(tr(&mut tlb, &ctx, va, WRITE), (Ok(Hpa(data_gpa)), 24));
    assert_eq!(m.read(data_slot) & ad, ad);
    assert_eq!(tr(&mut tlb, &ctx, va, WRITE), (Ok(Hpa(data_gpa)), 0));
}

// ---------------------------------------------------------------------------
// Page-modification logging.

/// Where the PML tests keep the log (below the table area).
const PML_PAGE: u64 = 0x70_0000;

fn pml_entry(m: &TestMachine, index: u16) -> u64 {
    m.read(PML_PAGE + u64::from(index) * 8)
}

fn ept_walk_pml(
    m: &TestMachine,
    eptp: Eptp,
    index: &std::cell::Cell<u16>,
    gpa: u64,
    kind: AccessKind,
) -> Result<ept::EptTranslation, TranslateError> {
    let pml = PmlLog {
        address: Hpa(PML_PAGE),
        index,
    };
    let mut refs = 0;
    ept_translate(&m.mem, eptp, Some(pml), Gpa(gpa), kind, None, &mut refs)
}

#[test]
fn pml_logs_each_dirty_flag_it_sets_once_in_descending_entries() {
    use crate::vmx::PML_HEAD_INDEX;
    let mut m = TestMachine::new();
    let eptp = m.identity_ept(true);
    let index = std::cell::Cell::new(PML_HEAD_INDEX);
    // A read sets A only: no entry.
    ept_walk_pml(&m, eptp, &index, 0x3_4008, AccessKind::Read).unwrap();
    assert_eq!(index.get(), PML_HEAD_INDEX);
    // Writes log the 4 KiB-aligned gpa when they set D, once per page.
    for gpa in [0x3_4008, 0x3_4ff0, 0x5_1000, 0x3_4000, 0x2_0abc] {
        ept_walk_pml(&m, eptp, &index, gpa, AccessKind::Write).unwrap();
    }
    assert_eq!(index.get(), PML_HEAD_INDEX - 3);
    assert_eq!(
        [pml_entry(&m, 511), pml_entry(&m, 510), pml_entry(&m, 509)],
        [0x3_4000, 0x5_1000, 0x2_0000]
    );
    assert_eq!(pml_entry(&m, 508), 0, "nothing beyond the index");
    // Once the hv clears D (and flushes), the next write logs again.
    let leaf = m.slot(eptp.pml4().0, 0x5_1000, 0);
    m.clear_bits(leaf, epte::DIRTY);
    ept_walk_pml(&m, eptp, &index, 0x5_1234, AccessKind::Write).unwrap();
    assert_eq!(index.get(), PML_HEAD_INDEX - 4);
    assert_eq!(pml_entry(&m, 508), 0x5_1000);
}

#[test]
fn pml_full_exits_before_any_flag_and_the_index_wraps_at_zero() {
    let mut m = TestMachine::new();
    let eptp = m.identity_ept(true);
    let ept_root = eptp.pml4().0;
    let ad = epte::ACCESSED | epte::DIRTY;
    let index = std::cell::Cell::new(0);
    ept_walk_pml(&m, eptp, &index, 0x1_0000, AccessKind::Write).unwrap();
    assert_eq!(pml_entry(&m, 0), 0x1_0000);
    assert_eq!(index.get(), 0xffff, "0 wraps to 0xffff");
    // Full: a write that would set D exits and sets nothing, in the leaf
    // or above it.
    let leaf = m.slot(ept_root, 0x2_0000, 0);
    assert_eq!(
        ept_walk_pml(&m, eptp, &index, 0x2_0000, AccessKind::Write),
        Err(TranslateError::PmlFull)
    );
    assert_eq!(m.read(leaf) & ad, 0);
    // So does a read that would only set A (SDM 29.3.6: "accessed or
    // dirty flag").
    assert_eq!(
        ept_walk_pml(&m, eptp, &index, 0x2_0000, AccessKind::Read),
        Err(TranslateError::PmlFull)
    );
    // An access with every flag already set needs no log: it goes on.
    ept_walk_pml(&m, eptp, &index, 0x1_0008, AccessKind::Write).unwrap();
    ept_walk_pml(&m, eptp, &index, 0x1_0010, AccessKind::Read).unwrap();
    assert_eq!(index.get(), 0xffff);
    // Any index above 511 is full, not only the wrapped one.
    index.set(512);
    assert_eq!(
        ept_walk_pml(&m, eptp, &index, 0x2_0000, AccessKind::Write),
        Err(TranslateError::PmlFull)
    );
    // The VMM empties the log and resets the index: the access happens.
    index.set(crate::vmx::PML_HEAD_INDEX);
    ept_walk_pml(&m, eptp, &index, 0x2_0000, AccessKind::Write).unwrap();
    assert_eq!(m.read(leaf) & ad, ad);
    assert_eq!(pml_entry(&m, 511), 0x2_0000);
}

#[test]
fn pml_logs_nothing_without_ept_ad() {
    let mut m = TestMachine::new();
    let eptp = m.identity_ept(false);
    // Even a full log: with A/D off no flag is ever set, so no event.
    let index = std::cell::Cell::new(0xffff);
    for gpa in [0x1_0000, 0x2_0000, 0x3_0000] {
        ept_walk_pml(&m, eptp, &index, gpa, AccessKind::Write).unwrap();
    }
    assert_eq!(index.get(), 0xffff);
    assert_eq!(pml_entry(&m, 511), 0);
}

#[test]
fn pml_logs_guest_paging_structures_whose_dirty_flag_a_walk_sets() {
    use crate::vmx::PML_HEAD_INDEX;
    let mut m = TestMachine::new();
    let va = 0x1000;
    let data_gpa = 0x30_0000;
    let (root, eptp) = two_d_setup(&mut m, va, data_gpa, true);
    let index = std::cell::Cell::new(PML_HEAD_INDEX);
    let mut ctx = m.ctx(regs(root), Some(eptp), 1);
    ctx.pml = Some(PmlLog {
        address: Hpa(PML_PAGE),
        index: &index,
    });
    let mut tlb = new_tlb();
    // A read: the walk's four table accesses are EPT writes (A/D on),
    // logged top level first; the data page is only read.
    assert_eq!(tr(&mut tlb, &ctx, va, READ).0, Ok(Hpa(data_gpa)));
    let tables: Vec<u64> = (0..4)
        .rev()
        .map(|level| m.slot(root, va, level) & !0xfff)
        .collect();
    let logged: Vec<u64> = (0..4).map(|i| pml_entry(&m, PML_HEAD_INDEX - i)).collect();
    assert_eq!(logged, tables);
    assert_eq!(index.get(), PML_HEAD_INDEX - 4);
    // The write re-walks (the TLB entry does not know EPT D) and logs
    // the data page only: the tables' D flags are set.
    assert_eq!(tr(&mut tlb, &ctx, va, WRITE).0, Ok(Hpa(data_gpa)));
    assert_eq!(pml_entry(&m, PML_HEAD_INDEX - 4), data_gpa);
    assert_eq!(index.get(), PML_HEAD_INDEX - 5);
}

// ---------------------------------------------------------------------------
// TLB.

#[test]
fn stale_entry_until_invlpg() {
    let mut m = TestMachine::new();
    let va = 0x1000;
    let root = one_page(&mut m, va, 0x5000, P | W);
    let ctx = m.ctx(regs(root), None, 3);
    let mut tlb = new_tlb();
    assert_eq!(tr(&mut tlb, &ctx, va, READ), (Ok(Hpa(0x5000)), 4));

    let leaf = m.slot(root, va, 0);
    m.clear_bits(leaf, P);
    // No flush: the old translation still works.
    assert_eq!(tr(&mut tlb, &ctx, va + 8, READ), (Ok(Hpa(0x5008)), 0));
    // INVLPG of another VPID or another page does nothing.
    tlb.invlpg(4, Gva(va));
    tlb.invlpg(3, Gva(va + 0x1000));
    assert_eq!(tr(&mut tlb, &ctx, va, READ), (Ok(Hpa(0x5000)), 0));
    tlb.invlpg(3, Gva(va + 0xfff));
    assert_eq!(
        tr(&mut tlb, &ctx, va, READ).0,
        Err(TranslateError::PageFault {
            gva: Gva(va),
            error_code: 0
        })
    );

    // Remapping without a flush keeps the old frame.
    m.write(leaf, 0x6000 | P | W);
    assert_eq!(tr(&mut tlb, &ctx, va, READ), (Ok(Hpa(0x6000)), 4));
    m.write(leaf, 0x7000 | P | W);
    assert_eq!(tr(&mut tlb, &ctx, va, READ).0, Ok(Hpa(0x6000)));
    tlb.invlpg(3, Gva(va));
    assert_eq!(tr(&mut tlb, &ctx, va, READ).0, Ok(Hpa(0x7000)));
    assert_eq!(tlb.stats().flushes, 4);
}

#[test]
fn cr3_load_keeps_global_entries() {
    let mut m = TestMachine::new();
    let root = m.frame();
    m.map(
        root,
        0x1000,
        0x5000,
        PageSize::Size4K,
        P | W | pte::GLOBAL,
        GUEST_TABLE,
    );
    m.map(root, 0x2000, 0x6000, PageSize::Size4K, P | W, GUEST_TABLE);
    let run = |pge: bool| {
        let mut r = regs(root);
        if !pge {
            r.cr4 &= !cr4::PGE;
        }
        let ctx = m.ctx(r, None, 1);
        let mut tlb = new_tlb();
        tr(&mut tlb, &ctx, 0x1000, READ).0.unwrap();
        tr(&mut tlb, &ctx, 0x2000, READ).0.unwrap();
        tlb.flush_non_global(1);
        (
            tr(&mut tlb, &ctx, 0x1000, READ).1,
            tr(&mut tlb, &ctx, 0x2000, READ).1,
        )
    };
    assert_eq!(run(true), (0, 4));
    // G is honoured only with CR4.PGE.
    assert_eq!(run(false), (4, 4));

    // A CR3 flush of another VPID leaves this one alone; a VPID flush drops
    // globals too.
    let ctx = m.ctx(regs(root), None, 1);
    let mut tlb = new_tlb();
    tr(&mut tlb, &ctx, 0x2000, READ).0.unwrap();
    tr(&mut tlb, &ctx, 0x1000, READ).0.unwrap();
    tlb.flush_non_global(2);
    assert_eq!(tr(&mut tlb, &ctx, 0x2000, READ).1, 0);
    tlb.flush_vpid(1);
    assert_eq!(tr(&mut tlb, &ctx, 0x1000, READ).1, 4);
}

/// SDM Vol. 3A 4.10.1 and 4.10.4.1: with CR4.PCIDE, translations belong
/// to the PCID (CR3 bits 11:0) they were made under; a lookup uses its
/// own PCID's and global ones; a CR3 load without bit 63 drops only the
/// new PCID's non-global translations (`Tlb::flush_pcid`), INVPCID type 3
/// every PCID's.
#[test]
fn pcid_tags_translations_and_flushes_only_its_own() {
    let mut m = TestMachine::new();
    let va = 0x40_0000;
    let gva = 0x80_0000;
    let root_a = one_page(&mut m, va, 0x5000, P | W);
    let root_b = one_page(&mut m, va, 0x6000, P | W);
    for root in [root_a, root_b] {
        m.map(
            root,
            gva,
            0x7000,
            PageSize::Size4K,
            P | W | pte::GLOBAL,
            GUEST_TABLE,
        );
    }
    let pcid = |root: u64, pcid: u64| {
        let mut r = regs(root | pcid);
        r.cr4 |= cr4::PCIDE;
        r
    };
    let a = m.ctx(pcid(root_a, 1), None, 1);
    let b = m.ctx(pcid(root_b, 2), None, 1);
    let mut tlb = new_tlb();
    assert_eq!(tr(&mut tlb, &a, va, READ), (Ok(Hpa(0x5000)), 4));
    assert_eq!(tr(&mut tlb, &a, gva, READ), (Ok(Hpa(0x7000)), 4));
    // Another PCID misses the first one's entry, hits its global one.
    assert_eq!(tr(&mut tlb, &b, va, READ), (Ok(Hpa(0x6000)), 4));
    assert_eq!(tr(&mut tlb, &b, gva, READ), (Ok(Hpa(0x7000)), 0));
    // Both stay: switching back and forth walks nothing.
    assert_eq!(tr(&mut tlb, &a, va, READ), (Ok(Hpa(0x5000)), 0));
    assert_eq!(tr(&mut tlb, &b, va, READ), (Ok(Hpa(0x6000)), 0));
    // A flush of PCID 2 (a CR3 load without bit 63) leaves PCID 1's and
    // the global entry.
    tlb.flush_pcid(1, 2);
    assert_eq!(tr(&mut tlb, &b, va, READ), (Ok(Hpa(0x6000)), 4));
    assert_eq!(tr(&mut tlb, &a, va, READ), (Ok(Hpa(0x5000)), 0));
    assert_eq!(tr(&mut tlb, &a, gva, READ), (Ok(Hpa(0x7000)), 0));
    // Another VPID's flush of the PCID leaves them.
    tlb.flush_pcid(2, 1);
    assert_eq!(tr(&mut tlb, &a, va, READ).1, 0);
    // INVLPG drops the address for every PCID.
    tlb.invlpg(1, Gva(va));
    assert_eq!(tr(&mut tlb, &a, va, READ).1, 4);
    assert_eq!(tr(&mut tlb, &b, va, READ).1, 4);
    // Every PCID's non-global entries (INVPCID type 3), not the global one.
    tlb.flush_non_global(1);
    assert_eq!(tr(&mut tlb, &a, va, READ).1, 4);
    assert_eq!(tr(&mut tlb, &b, va, READ).1, 4);
    assert_eq!(tr(&mut tlb, &b, gva, READ).1, 0);
    // Without CR4.PCIDE, CR3 bits 11:0 tag nothing.
    let plain = m.ctx(regs(root_a | 1), None, 3);
    let plain0 = m.ctx(regs(root_a), None, 3);
    assert_eq!(tr(&mut tlb, &plain, va, READ).1, 4);
    assert_eq!(tr(&mut tlb, &plain0, va, READ).1, 0);
    // A snapshot image keeps the tags (the PCID in `data`'s bits 63:52,
    // the EPTP field plain).
    let image = tlb.image();
    assert!(image
        .entries
        .iter()
        .any(|e| e.data >> 52 == 2 && e.eptp == 0));
    assert!(image.entries.iter().all(|e| e.hpa().0 < MEM_SIZE));
    let mut copy = new_tlb();
    copy.load_image(&tlb.image(), |_| true).unwrap();
    assert_eq!(copy.image(), tlb.image());
    assert_eq!(tr(&mut copy, &a, va, READ).1, 0);
    assert_eq!(tr(&mut copy, &b, gva, READ).1, 0);
    assert!(tlb.valid_bits_consistent());
}

#[test]
fn vpid_isolation() {
    let mut m = TestMachine::new();
    let va = 0x40_0000;
    let root_a = one_page(&mut m, va, 0x5000, P | W);
    let root_b = one_page(&mut m, va, 0x6000, P | W);
    let a = m.ctx(regs(root_a), None, 1);
    let b = m.ctx(regs(root_b), None, 2);
    let mut tlb = new_tlb();
    assert_eq!(tr(&mut tlb, &a, va, READ), (Ok(Hpa(0x5000)), 4));
    assert_eq!(tr(&mut tlb, &b, va, READ), (Ok(Hpa(0x6000)), 4));
    assert_eq!(tr(&mut tlb, &a, va, READ), (Ok(Hpa(0x5000)), 0));
    assert_eq!(tr(&mut tlb, &b, va, READ), (Ok(Hpa(0x6000)), 0));
    tlb.flush_vpid(1);
    assert_eq!(tr(&mut tlb, &b, va, READ).1, 0);
    assert_eq!(tr(&mut tlb, &a, va, READ).1, 4);
}

#[test]
fn invept_single_context_and_global() {
    let mut m = TestMachine::new();
    let va = 0x1000;
    let gpa = 0x20_0000;
    let root = one_page(&mut m, va, gpa, P | W);
    // Two EPTs: guest tables identity-mapped in both, the data page not.
    let eptp1 = m.identity_ept(false);
    let eptp2 = m.identity_ept(false);
    m.map(
        eptp1.pml4().0,
        gpa,
        0x30_0000,
        PageSize::Size4K,
        EPT_RWX,
        EPT_TABLE,
    );
    m.map(
        eptp2.pml4().0,
        gpa,
        0x31_0000,
        PageSize::Size4K,
        EPT_RWX,
        EPT_TABLE,
    );
    let c1 = m.ctx(regs(root), Some(eptp1), 1);
    let c2 = m.ctx(regs(root), Some(eptp2), 1);
    let bare = m.ctx(regs(root), None, 1);
    let mut tlb = new_tlb();
    let fill = |tlb: &mut Tlb| [&c1, &c2, &bare].map(|c| tr(tlb, c, va, READ));
    assert_eq!(
        fill(&mut tlb),
        [
            (Ok(Hpa(0x30_0000)), 24),
            (Ok(Hpa(0x31_0000)), 24),
            (Ok(Hpa(gpa)), 4)
        ]
    );
    assert_eq!(fill(&mut tlb).map(|(_, refs)| refs), [0, 0, 0]);

    // Single context: keyed by the PML4 address, whatever the A/D bit.
    tlb.invept(InveptKind::SingleContext(Eptp::new(eptp1.pml4(), true)));
    assert_eq!(fill(&mut tlb).map(|(_, refs)| refs), [24, 0, 0]);
    // Global: every EPT-derived entry, not the ones made without EPT.
    tlb.invept(InveptKind::Global);
    assert_eq!(fill(&mut tlb).map(|(_, refs)| refs), [24, 24, 0]);
}

#[test]
fn invvpid_kinds() {
    let mut m = TestMachine::new();
    let root = m.frame();
    m.map(
        root,
        0x1000,
        0x5000,
        PageSize::Size4K,
        P | W | pte::GLOBAL,
        GUEST_TABLE,
    );
    m.map(root, 0x2000, 0x6000, PageSize::Size4K, P | W, GUEST_TABLE);
    let ctxs: Vec<TranslateCtx<'_>> = [0, 1, 2]
        .iter()
        .map(|&v| m.ctx(regs(root), None, v))
        .collect();
    // Walk references for (vpid 0, 1, 2) x (global page, non-global page).
    let probe = |tlb: &mut Tlb| -> Vec<(u64, u64)> {
        ctxs.iter()
            .map(|c| (tr(tlb, c, 0x1000, READ).1, tr(tlb, c, 0x2000, READ).1))
            .collect()
    };
    let cases = [
        (
            InvvpidKind::IndividualAddress {
                vpid: 1,
                gva: Gva(0x2abc),
            },
            [(0, 0), (0, 4), (0, 0)],
        ),
        (
            InvvpidKind::SingleContext { vpid: 2 },
            [(0, 0), (0, 0), (4, 4)],
        ),
        (InvvpidKind::AllContext, [(0, 0), (4, 4), (4, 4)]),
        (
            InvvpidKind::SingleContextRetainingGlobals { vpid: 1 },
            [(0, 0), (0, 4), (0, 0)],
        ),
    ];
    for (kind, expected) in cases {
        let mut tlb = new_tlb();
        probe(&mut tlb);
        assert_eq!(probe(&mut tlb), vec![(0, 0); 3]);
        tlb.invvpid(kind);
        assert_eq!(probe(&mut tlb), expected.to_vec(), "{kind:?}");
    }
}

#[test]
fn large_page_entries_and_invlpg() {
    let mut m = TestMachine::new();
    let root = m.frame();
    let large = 0x4000_0000;
    m.map(root, large, 0x40_0000, PageSize::Size2M, P | W, GUEST_TABLE);
    m.map(root, 0x1000, 0x5000, PageSize::Size4K, P | W, GUEST_TABLE);
    let ctx = m.ctx(regs(root), None, 1);
    let mut tlb = new_tlb();
    // One entry serves the whole 2 MiB page.
    assert_eq!(tr(&mut tlb, &ctx, large + 0x1000, READ).1, 3);
    assert_eq!(
        tr(&mut tlb, &ctx, large + 0x1f_f008, READ),
        (Ok(Hpa(0x5f_f008)), 0)
    );
    tr(&mut tlb, &ctx, 0x1000, READ).0.unwrap();
    assert_eq!(tlb.occupancy(), 2);
    tlb.invlpg(1, Gva(large + 0x12_3000));
    assert_eq!(tlb.occupancy(), 1);
    assert_eq!(tr(&mut tlb, &ctx, large, READ).1, 3);

    // Guest 2 MiB page on 4 KiB EPT pages: cached as 4 KiB pieces, and an
    // INVLPG anywhere in the guest page drops them all.
    let eptp = m.identity_ept(false);
    let ctx = m.ctx(regs(root), Some(eptp), 1);
    let mut tlb = new_tlb();
    for off in [0, 0x1000, 0x1f_f000] {
        assert_eq!(tr(&mut tlb, &ctx, large + off, READ).1, 19);
    }
    assert_eq!(
        tr(&mut tlb, &ctx, large + 0x1008, READ),
        (Ok(Hpa(0x40_1008)), 0)
    );
    tr(&mut tlb, &ctx, 0x1000, READ).0.unwrap();
    assert_eq!(tlb.occupancy(), 4);
    tlb.invlpg(2, Gva(large + 0x8_0000));
    assert_eq!(tlb.occupancy(), 4);
    tlb.invlpg(1, Gva(large + 0x8_0000));
    assert_eq!(tlb.occupancy(), 1);
    assert_eq!(tr(&mut tlb, &ctx, 0x1000, READ).1, 0);

    // Guest 1 GiB page on 2 MiB EPT pages: 2 MiB pieces.
    let ept_root = m.frame();
    for page in (0..MEM_SIZE).step_by(2 * MIB as usize) {
        m.map(ept_root, page, page, PageSize::Size2M, EPT_RWX, EPT_TABLE);
    }
    m.map(
        ept_root,
        GIB,
        0x20_0000,
        PageSize::Size2M,
        EPT_RWX,
        EPT_TABLE,
    );
    m.map(
        ept_root,
        GIB + 2 * MIB,
        0x60_0000,
        PageSize::Size2M,
        EPT_RWX,
        EPT_TABLE,
    );
    m.map(
        root,
        0x80_0000_0000,
        GIB,
        PageSize::Size1G,
        P | W,
        GUEST_TABLE,
    );
    let ctx = m.ctx(regs(root), Some(Eptp::new(Hpa(ept_root), false)), 1);
    let mut tlb = new_tlb();
    let base = 0x80_0000_0000;
    assert_eq!(
        tr(&mut tlb, &ctx, base + 0x1234, READ),
        (Ok(Hpa(0x20_1234)), 2 * 4 + 3)
    );
    assert_eq!(
        tr(&mut tlb, &ctx, base + 0x1f_0000, READ),
        (Ok(Hpa(0x3f_0000)), 0)
    );
    assert_eq!(
        tr(&mut tlb, &ctx, base + 0x20_0010, READ),
        (Ok(Hpa(0x60_0010)), 11)
    );
    assert_eq!(tlb.occupancy(), 2);
    tlb.invlpg(1, Gva(base + 0x3000_0000));
    assert_eq!(tlb.occupancy(), 0);
}

#[test]
fn odd_geometries_and_deterministic_replacement() {
    for (entries, ways) in [
        (0, 0),
        (1, 1),
        (1000, 3),
        (1536, 12),
        (7, 100),
        (usize::MAX, usize::MAX),
    ] {
        let config = TlbConfig { entries, ways }.normalized();
        assert!(config.ways >= 1 && config.ways <= TlbConfig::MAX_WAYS);
        assert!((config.entries / config.ways).is_power_of_two());
        assert_eq!(config.entries % config.ways, 0);
        if (1536, 12) == (entries, ways) {
            assert_eq!(
                config,
                TlbConfig {
                    entries: 1536,
                    ways: 12
                }
            );
        }
    }
    assert_eq!(
        TlbConfig {
            entries: 1000,
            ways: 3
        }
        .normalized(),
        TlbConfig {
            entries: 1536,
            ways: 3
        }
    );
    assert_eq!(
        Tlb::new(TlbConfig {
            entries: 0,
            ways: 0
        })
        .config(),
        TlbConfig {
            entries: 1,
            ways: 1
        }
    );

    // One set of two ways: A, B, hit A, then C evicts B (least recent).
    let mut m = TestMachine::new();
    let root = m.frame();
    for page in 0..3u64 {
        m.map(
            root,
            0x1000 * (page + 1),
            0x5000 + 0x1000 * page,
            PageSize::Size4K,
            P | W,
            GUEST_TABLE,
        );
    }
    let ctx = m.ctx(regs(root), None, 0);
    let mut tlb = Tlb::new(TlbConfig {
        entries: 2,
        ways: 2,
    });
    let (a, b, c) = (0x1000, 0x2000, 0x3000);
    assert_eq!(tr(&mut tlb, &ctx, a, READ).1, 4);
    assert_eq!(tr(&mut tlb, &ctx, b, READ).1, 4);
    assert_eq!(tr(&mut tlb, &ctx, a, READ).1, 0);
    assert_eq!(tr(&mut tlb, &ctx, c, READ).1, 4);
    assert_eq!(tr(&mut tlb, &ctx, a, READ).1, 0);
    assert_eq!(tr(&mut tlb, &ctx, c, READ).1, 0);
    assert_eq!(tr(&mut tlb, &ctx, b, READ).1, 4);

    // A direct-mapped TLB still works.
    let mut tlb = Tlb::new(TlbConfig {
        entries: 1,
        ways: 1,
    });
    for _ in 0..2 {
        assert_eq!(tr(&mut tlb, &ctx, a, READ).1, 4);
        assert_eq!(tr(&mut tlb, &ctx, b, READ).1, 4);
    }
}

/// A hint to a 2 MiB entry, or to a global entry found under another
/// PCID, is checked only by the TLB's epoch: it must go when its entry
/// leaves (evicted by a 4 KiB fill, or dropped by a CR3 load's flush),
/// or a lookup of its page would read whatever the way holds then. Each
/// lookup against a TLB whose hints are wiped first (same results,
/// references, counters, entries and replacement state).
#[test]
fn hints_checked_by_the_epoch_go_with_their_entry() {
    let large = 0x4000_0000u64;
    let global = 0x80_9000u64;
    let small = small_page;
    let mut m = TestMachine::new();
    let root = m.frame();
    m.map(root, large, 0, PageSize::Size2M, P | W, GUEST_TABLE);
    m.map(
        root,
        global,
        0x20_0000,
        PageSize::Size4K,
        P | W | pte::GLOBAL,
        GUEST_TABLE,
    );
    map_four_small_pages(&mut m, root);
    // (The pages looked up through hints have hint slots of their own:
    // 7, 5 and 9 against the small pages' 0 to 3.)
    let mut tlbs = HintedAndPlain::one_set();
    let mut both = |pcid: Option<u64>, op: &dyn Fn(&mut Tlb, &TranslateCtx<'_>) -> String| {
        let mut r = regs(root);
        if let Some(pcid) = pcid {
            r.cr4 |= cr4::PCIDE;
            r.cr3 |= pcid;
        }
        tlbs.both(&m.ctx(r, None, 0), op);
    };
    let look =
        |va: u64| move |t: &mut Tlb, ctx: &TranslateCtx<'_>| format!("{:?}", tr(t, ctx, va, READ));
    // The 2 MiB entry, hinted for one page, then evicted by four fills.
    for _ in 0..2 {
        both(None, &look(large + 0x7000));
    }
    for i in 0..4 {
        both(None, &look(small(i)));
    }
    both(None, &look(large + 0x7000));
    // Again, then dropped by a CR3 load's flush; four fills take the
    // ways it left.
    let flush = |t: &mut Tlb, _: &TranslateCtx<'_>| {
        t.flush_non_global(0);
        String::new()
    };
    both(None, &look(large + 0x5000));
    both(None, &look(large + 0x5000));
    both(None, &flush);
    for i in 0..4 {
        both(None, &look(small(i)));
    }
    both(None, &look(large + 0x5000));
    // A global 4 KiB entry filled under PCID 1 (after a flush, so that
    // nothing else moves the epoch), found (and hinted) under PCID 2,
    // then evicted by PCID 2's fills.
    both(None, &flush);
    both(Some(1), &look(global));
    for _ in 0..2 {
        both(Some(2), &look(global));
    }
    for i in 0..4 {
        both(Some(2), &look(small(i)));
    }
    both(Some(2), &look(global));
}

/// Small page `i` of the hint tests (0 to 3).
fn small_page(i: u64) -> u64 {
    0x40_0000 + i * 0x1000
}

/// Maps the four small pages under `root`, writable, not global.
fn map_four_small_pages(m: &mut TestMachine, root: u64) {
    for i in 0..4 {
        m.map(
            root,
            small_page(i),
            0x30_0000 + i * 0x1000,
            PageSize::Size4K,
            P | W,
            GUEST_TABLE,
        );
    }
}

/// A TLB with hints and one whose hints are wiped before every lookup:
/// one set of four ways (every fill competes with every entry).
struct HintedAndPlain {
    hinted: Tlb,
    plain: Tlb,
    step: u32,
}

impl HintedAndPlain {
    fn one_set() -> HintedAndPlain {
        let config = TlbConfig {
            entries: 4,
            ways: 4,
        };
        HintedAndPlain {
            hinted: Tlb::new(config),
            plain: Tlb::new(config),
            step: 0,
        }
    }

    /// `op` on both, which must answer and end the same; the answer.
    fn both(
        &mut self,
        ctx: &TranslateCtx<'_>,
        op: &dyn Fn(&mut Tlb, &TranslateCtx<'_>) -> String,
    ) -> String {
        let step = self.step;
        let a = op(&mut self.hinted, ctx);
        self.plain.forget_hints();
        let b = op(&mut self.plain, ctx);
        assert_eq!(a, b, "step {step}");
        assert_eq!(self.hinted.stats(), self.plain.stats(), "step {step}");
        assert_eq!(self.hinted.image(), self.plain.image(), "step {step}");
        self.step += 1;
        a
    }
}

/// Hints to global 4 KiB entries found under another PCID are checked
/// against the entry, as those to the key's own: they survive other
/// global fills, and give way where the search would answer otherwise.
/// Each PCID has its own page tables here, so one linear page can be a
/// global 4 KiB page under one and not under another:
/// - a global entry hinted under PCID 3 stays hinted (a hit through the
///   hint, with no set search) across fills of other global pages;
/// - evicted, and its way taken by PCID 2's own entry for the page, the
///   hint does not answer for PCID 3 (that entry is not PCID 3's);
/// - a global 4 KiB entry filled while PCID 1's 2 MiB entry for the page
///   is hinted takes precedence there: the hint to the larger entry goes.
#[test]
fn global_hints_are_checked_against_their_entry() {
    let page = 0x4000_3000u64;
    let other_globals = |i: u64| 0x80_0000 + i * 0x1000;
    let small = small_page;
    let mut m = TestMachine::new();
    // PCID 1: the 2 MiB page holding `page`, not global. PCID 2: `page`
    // as a 4 KiB page, not global. PCID 3: `page` and the other globals
    // as global 4 KiB pages. Every root: four small pages.
    let roots = [m.frame(), m.frame(), m.frame()];
    m.map(
        roots[0],
        page & !0x1f_ffff,
        0,
        PageSize::Size2M,
        P | W,
        GUEST_TABLE,
    );
    m.map(
        roots[1],
        page,
        0x50_0000,
        PageSize::Size4K,
        P | W,
        GUEST_TABLE,
    );
    let global = P | W | pte::GLOBAL;
    m.map(
        roots[2],
        page,
        0x60_0000,
        PageSize::Size4K,
        global,
        GUEST_TABLE,
    );
    for i in 0..4 {
        m.map(
            roots[2],
            other_globals(i),
            0x70_0000 + i * 0x1000,
            PageSize::Size4K,
            global,
            GUEST_TABLE,
        );
    }
    for &root in &roots {
        map_four_small_pages(&mut m, root);
    }
    let mut tlbs = HintedAndPlain::one_set();
    let mut both = |pcid: u64, op: &dyn Fn(&mut Tlb, &TranslateCtx<'_>) -> String| -> String {
        let mut r = regs(roots[pcid as usize - 1]);
        r.cr4 |= cr4::PCIDE;
        r.cr3 |= pcid;
        tlbs.both(&m.ctx(r, None, 0), op)
    };
    let look =
        |va: u64| move |t: &mut Tlb, ctx: &TranslateCtx<'_>| format!("{:?}", tr(t, ctx, va, READ));
    let flush = |t: &mut Tlb, _: &TranslateCtx<'_>| {
        t.flush_all();
        String::new()
    };
    // The global entry, filled and hinted under PCID 3, then other global
    // fills (which change nothing the hint depends on): the hint still
    // answers, without a set search.
    both(3, &look(page));
    both(3, &look(page));
    for i in 0..2 {
        both(3, &look(other_globals(i)));
    }
    let probes = || super::tlb::SET_PROBES.with(std::cell::Cell::get);
    let before = probes();
    both(3, &look(page));
    // (The plain TLB probed once.)
    assert_eq!(probes() - before, 1, "the hint answers");
    // Evicted by four fills under PCID 2; then PCID 2's own entry for the
    // page (not global) fills a way, and PCID 3 looks the page up again.
    for i in 0..4 {
        both(2, &look(small(i)));
    }
    both(2, &look(page));
    both(3, &look(page));
    // PCID 1's 2 MiB entry, hinted for the page; PCID 3's global 4 KiB
    // entry for it comes, and wins under PCID 1 too.
    both(1, &flush);
    both(1, &look(page));
    both(1, &look(page));
    both(3, &look(page));
    let found = both(1, &look(page));
    assert!(found.contains("60"), "the global entry answers: {found}");
}

/// A fill after a miss skips the search of its set for an entry with its
/// tag (`Tlb::absent`) only when the miss found none: a miss that dropped
/// the key's own entry, as not allowing the access, may leave a global
/// entry for the page (made under another PCID), which a global fill must
/// replace in its way. The run: PCID 1's own read-only entry for a page,
/// PCID 2's global entry for it, then a write under PCID 1 after the page
/// became global and writable there.
#[test]
fn a_fill_after_a_dropped_entry_replaces_the_global_one() {
    let page = 0x4000_3000u64;
    let mut m = TestMachine::new();
    let roots = [m.frame(), m.frame()];
    m.map(roots[0], page, 0x50_0000, PageSize::Size4K, P, GUEST_TABLE);
    let global = P | W | pte::GLOBAL;
    m.map(
        roots[1],
        page,
        0x60_0000,
        PageSize::Size4K,
        global,
        GUEST_TABLE,
    );
    let mut tlbs = HintedAndPlain::one_set();
    tlbs.plain.full_probes = true;
    let mut both = |pcid: u64, m: &TestMachine, access: Access| -> String {
        let mut r = regs(roots[pcid as usize - 1]);
        r.cr4 |= cr4::PCIDE;
        r.cr3 |= pcid;
        tlbs.both(&m.ctx(r, None, 0), &move |t, ctx| {
            format!("{:?}", tr(t, ctx, page, access))
        })
    };
    both(1, &m, READ);
    both(2, &m, READ);
    let slot = m.slot(roots[0], page, 0);
    m.write(slot, 0x60_0000 | global | pte::ACCESSED);
    let found = both(1, &m, WRITE);
    assert!(found.contains("60"), "the global entry answers: {found}");
    let image = tlbs.hinted.image();
    assert_eq!(image.entries.len(), 1, "one entry for the page: {image:?}");
}

/// Host-side hints (and the hint every 4 KiB fill leaves), the empty-set
/// shortcut of a miss and a fill's skipped search after a miss never
/// change what the TLB answers: a TLB whose hints are wiped before every
/// lookup, whose misses always probe the sets and whose fills always
/// search their set gives the same results, walk references, counters, entries and
/// replacement state over a long mixed run (4 KiB and 2 MiB pages, user and
/// supervisor, global and not, reads, writes and fetches, permission
/// changes, INVLPG and CR3-load flushes, evictions in a small TLB; in its
/// second half under CR4.PCIDE with three PCIDs and their flushes).
#[test]
fn hints_never_change_what_the_tlb_answers() {
    const PAGES: u64 = 24;
    let small_va = |i: u64| 0x40_0000 + i * 0x1000;
    let large_va = |j: u64| 0x4000_0000 + j * 2 * MIB;
    let build = || {
        let mut m = TestMachine::new();
        let root = m.frame();
        for i in 0..PAGES {
            let flags = P
                | if i % 3 != 0 { W } else { 0 }
                | if i % 2 == 0 { U } else { 0 }
                | if i % 5 == 4 { pte::NX } else { 0 }
                | if i % 7 == 3 { pte::GLOBAL } else { 0 };
            m.map(
                root,
                small_va(i),
                0x10_0000 + i * 0x1000,
                PageSize::Size4K,
                flags,
                GUEST_TABLE,
            );
        }
        for j in 0..2 {
            m.map(
                root,
                large_va(j),
                j * 2 * MIB,
                PageSize::Size2M,
                P | W | if j == 0 { U } else { 0 },
                GUEST_TABLE,
            );
        }
        (m, root)
    };
    let (hinted_m, root) = build();
    let (plain_m, plain_root) = build();
    assert_eq!(root, plain_root);
    let config = TlbConfig {
        entries: 16,
        ways: 4,
    };
    let mut hinted = Tlb::new(config);
    let mut plain = Tlb::new(config);
    plain.full_probes = true;
    let shortcuts_before = super::tlb::EMPTY_SET_MISSES.with(std::cell::Cell::get);
    let known_absent_before = super::tlb::KNOWN_ABSENT_FILLS.with(std::cell::Cell::get);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut hits = 0;
    for step in 0..20_000 {
        let r = next();
        let va = if r % 4 == 0 {
            large_va((r >> 8) % 2) + ((r >> 16) % 512) * 0x1000
        } else {
            small_va((r >> 8) % PAGES)
        } + (r >> 32) % 0x1000;
        match (r >> 20) % 64 {
            0 => {
                hinted.invlpg(0, Gva(va));
                plain.invlpg(0, Gva(va));
            }
            1 => {
                hinted.flush_non_global(0);
                plain.flush_non_global(0);
            }
            3 => {
                hinted.flush_pcid(0, (r >> 44) % 3);
                plain.flush_pcid(0, (r >> 44) % 3);
            }
            2 => {
                // Flip W of a 4 KiB leaf: cached entries go stale.
                let i = (r >> 40) % PAGES;
                for m in [&hinted_m, &plain_m] {
                    let slot = m.slot(root, small_va(i), 0);
                    m.write(slot, m.read(slot) ^ W);
                }
            }
            _ => {
                let kind = [AccessKind::Read, AccessKind::Write, AccessKind::Execute]
                    [((r >> 26) % 3) as usize];
                let access = Access {
                    kind,
                    user: (r >> 28) & 1 == 1,
                };
                let mut regs = regs(root);
                if step >= 10_000 {
                    regs.cr4 |= cr4::PCIDE;
                    regs.cr3 |= (r >> 44) % 3;
                }
                let a = tr(&mut hinted, &hinted_m.ctx(regs, None, 0), va, access);
                plain.forget_hints();
                let b = tr(&mut plain, &plain_m.ctx(regs, None, 0), va, access);
                assert_eq!(a, b, "step {step}: {access:?} at {va:#x}");
                hits += u64::from(a.0.is_ok() && a.1 == 0);
            }
        }
        assert_eq!(hinted.stats(), plain.stats(), "step {step}");
        assert_eq!(hinted.image(), plain.image(), "step {step}");
        assert!(hinted.valid_bits_consistent(), "step {step}");
    }
    assert!(hits > 1000, "the run must hit the TLB: {hits}");
    assert!(
        hinted.stats().misses > 1000,
        "and miss it: {:?}",
        hinted.stats()
    );
    let shortcuts = super::tlb::EMPTY_SET_MISSES.with(std::cell::Cell::get) - shortcuts_before;
    assert!(shortcuts > 100, "misses must find empty sets: {shortcuts}");
    let known_absent =
        super::tlb::KNOWN_ABSENT_FILLS.with(std::cell::Cell::get) - known_absent_before;
    assert!(
        known_absent > 100,
        "fills must follow misses that searched their set: {known_absent}"
    );
}

#[test]
fn concurrent_entry_updates_are_not_lost() {
    // Another agent flips a software-available bit of the guest PTE while
    // the walker sets A: the walker's compare-and-exchange must neither lose
    // the other agent's bit nor give up.
    const AVAILABLE: u64 = 1 << 9;
    const FLIPS: usize = 20_000;
    let mut m = TestMachine::new();
    let va = 0x1000;
    let root = one_page(&mut m, va, 0x5000, P | W);
    let leaf = Hpa(m.slot(root, va, 0));
    let entry = m.mem.atomic_u64(leaf).unwrap();
    let start = entry.load(std::sync::atomic::Ordering::SeqCst);
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..FLIPS {
                entry.fetch_xor(AVAILABLE, std::sync::atomic::Ordering::SeqCst);
            }
        });
        let ctx = m.ctx(regs(root), None, 0);
        let mut tlb = new_tlb();
        for _ in 0..2_000 {
            entry.fetch_and(!pte::ACCESSED, std::sync::atomic::Ordering::SeqCst);
            tlb.invlpg(0, Gva(va));
            assert_eq!(tr(&mut tlb, &ctx, va, READ).0, Ok(Hpa(0x5000)));
            assert_ne!(
                entry.load(std::sync::atomic::Ordering::SeqCst) & pte::ACCESSED,
                0
            );
        }
    });
    assert_eq!(
        entry.load(std::sync::atomic::Ordering::SeqCst) & AVAILABLE,
        start & AVAILABLE
    );
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    /// Everything one fuzz case depends on.
    #[derive(Debug, Clone)]
    struct Case {
        seed: u64,
        gvas: Vec<u64>,
        kinds: Vec<u8>,
        cr3: u64,
        ept_root: Option<u64>,
        ept_ad: bool,
        reg_bits: u8,
    }

    /// A fixed pseudo-random sequence (xorshift64*) from the case's seed.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Fills 16 frames with garbage entries: mostly present, mostly
    /// pointing at frames 0..18 (two outside memory), random low flags (PS
    /// rarely),
    /// sometimes reserved address bits, ignored high bits or XD. Then runs
    /// every access twice and returns each result with its walk references.
    fn run(case: &Case) -> Vec<(Result<Hpa, TranslateError>, u64)> {
        let mem = PhysMemory::new(16 * 4096).unwrap();
        let mut state = case.seed | 1;
        for slot in 0..16 * 512u64 {
            let r = next(&mut state);
            let mut value = (((r >> 8) % 18) << 12) | (r & 0x17e);
            if (r >> 40) & 7 == 0 {
                value |= pte::HUGE;
            }
            if (r >> 20) & 7 != 0 {
                value |= 1; // present (guest) / readable (EPT)
            }
            if (r >> 24) & 15 == 0 {
                value |= 1 << (46 + (r >> 28) % 6);
            }
            if (r >> 32) & 7 == 0 {
                value |= (r << 52) & 0x7ff0_0000_0000_0000;
            }
            if (r >> 36) & 3 == 0 {
                value |= pte::NX;
            }
            mem.write_u64(Hpa(slot * 8), value).unwrap();
        }
        let mut regs = regs(case.cr3 << 12);
        let bits = case.reg_bits;
        if bits & 1 != 0 {
            regs.cr4 |= cr4::SMEP;
        }
        if bits & 2 != 0 {
            regs.cr4 |= cr4::SMAP;
        }
        if bits & 4 != 0 {
            regs.cr0 &= !cr0::WP;
        }
        if bits & 8 != 0 {
            regs.efer &= !efer::NXE;
        }
        if bits & 0x90 == 0x90 {
            regs.cr0 &= !cr0::PG;
        }
        regs.rflags_ac = bits & 32 != 0;
        let ctx = TranslateCtx {
            mem: &mem,
            regs,
            ept: case.ept_root.map(|r| Eptp::new(Hpa(r << 12), case.ept_ad)),
            vpid: 1,
            pml: None,
        };
        let mut tlb = Tlb::new(TlbConfig {
            entries: 16,
            ways: 4,
        });
        let mut results = Vec::new();
        for (&gva, &k) in case.gvas.iter().zip(&case.kinds) {
            let access = Access {
                kind: [AccessKind::Read, AccessKind::Write, AccessKind::Execute][k as usize % 3],
                user: k >= 3,
            };
            // Mostly canonical low-half addresses, some arbitrary ones.
            let gva = if gva & 3 != 0 {
                gva & 0x7fff_ffff_ffff
            } else {
                gva
            };
            for _ in 0..2 {
                let mut refs = 0;
                let r = translate(&mut tlb, &ctx, Gva(gva), access, &mut refs);
                results.push((r, refs));
            }
        }
        results
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Whatever the tables contain, translation returns without
        /// panicking, and the same inputs give the same results.
        #[test]
        fn garbage_tables_never_panic(
            seed in any::<u64>(),
            gvas in proptest::collection::vec(any::<u64>(), 8),
            kinds in proptest::collection::vec(0u8..6, 8),
            cr3 in 0u64..18,
            ept_root in proptest::option::of(0u64..18),
            ept_ad in any::<bool>(),
            reg_bits in any::<u8>(),
        ) {
            let case = Case { seed, gvas, kinds, cr3, ept_root, ept_ad, reg_bits };
            prop_assert_eq!(run(&case), run(&case));
        }
    }
}
