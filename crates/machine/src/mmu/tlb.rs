//! The TLB.
//!
//! A set-associative cache of *combined* translations: linear page ->
//! host-physical page, with everything needed to decide at lookup time
//! whether an access may use the entry (guest W/U/NX combined over the
//! levels, the EPT R/W/X of the final guest-physical page, and whether the
//! guest and EPT dirty flags are known to be set). Access rights that
//! depend on CR0.WP, CR4.SMEP/SMAP, RFLAGS.AC and the CPL are evaluated on
//! every hit, so changing them needs no flush.
//!
//! Entries are tagged with the VPID, the EPTP (when EPT is on), the PCID
//! (with CR4.PCIDE set), whether guest paging was on (entries made with
//! CR0.PG clear are guest-physical mappings: linear = guest-physical,
//! through EPT), and the page size. A global translation made with
//! CR4.PCIDE set is tagged "any PCID" and serves every PCID (SDM Vol. 3A
//! 4.10.2.4); made with CR4.PCIDE clear it carries PCID 0 like the rest,
//! and serves the others too. A lookup prefers an entry of its own PCID.
//! A CR3 load keeps the translations of other PCIDs ([`Tlb::flush_pcid`]),
//! so an address-space switch by PCID (Linux's page-table isolation:
//! two loads per system call, with bit 63 set) keeps them all.
//!
//! Page sizes: an entry maps a page of the *effective* size, the smaller of
//! the guest page and the EPT page (a guest 2 MiB page on 4 KiB EPT pages is
//! not contiguous in host memory). An entry of size S lives in the set
//! indexed by its page number at size S; a lookup probes the 4 KiB set, and
//! in the 2 MiB and 1 GiB sets only the ways a per-set bitmap marks as
//! holding a large entry (and only while the TLB may hold one at all). INVLPG likewise probes the set of each size,
//! which drops every large entry covering the address exactly. When the effective size is smaller than
//! the guest page ("splintered" entries), an INVLPG anywhere in the guest
//! page must drop all the pieces (SDM 4.10.2.3): the entry records the guest
//! page size, and while any splintered entry may be present INVLPG also
//! scans the whole TLB for pieces of the guest page containing the address.
//!
//! Replacement is deterministic: an invalid way if there is one, otherwise
//! bit-PLRU (each way has a "recently used" bit set on hit or fill; when all
//! bits of a set would be set, all but the newest are cleared; the victim
//! is the lowest way whose bit is clear).
//!
//! Invalidation is never narrower than the SDM requires, sometimes wider
//! (which is architecturally allowed): INVVPID and VPID flushes also drop
//! guest-physical mappings of that VPID, and INVLPG drops guest-physical
//! mappings of the address.

use super::ept::EptTranslation;
use super::paging::GuestTranslation;
#[cfg(test)]
use super::paging::{access_permitted, GuestPerms};
use super::psc::{Psc, PscConfig};
use super::{Access, AccessKind, PageSize, TranslateCtx};
use crate::addr::{Gva, Hpa};
use crate::cpu::state::cr0;
use crate::vmx::{InveptKind, InvvpidKind};

/// TLB geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlbConfig {
    /// Total entries. [`Tlb::new`] uses [`TlbConfig::normalized`]: a
    /// power-of-two number of sets times `ways`, rounded up.
    pub entries: usize,
    /// Associativity.
    pub ways: usize,
}

impl Default for TlbConfig {
    /// 1536-entry unified STLB on Skylake, rounded to a power of two.
    fn default() -> Self {
        TlbConfig {
            entries: 1024,
            ways: 8,
        }
    }
}

impl TlbConfig {
    /// Largest associativity (the replacement state is a 64-bit mask).
    pub const MAX_WAYS: usize = 64;
    /// Largest number of sets.
    pub const MAX_SETS: usize = 1 << 16;

    /// The geometry actually built from `self`, never panicking: `ways` is
    /// clamped to `1..=MAX_WAYS` (it need not be a power of two: 12 ways x
    /// 128 sets gives Skylake's 1536 entries), and the number of sets,
    /// `entries / ways` rounded up, is clamped to `1..=MAX_SETS` and rounded
    /// up to a power of two. `entries` is then `sets * ways`.
    pub fn normalized(self) -> TlbConfig {
        let ways = self.ways.clamp(1, Self::MAX_WAYS);
        let sets = self
            .entries
            .div_ceil(ways)
            .clamp(1, Self::MAX_SETS)
            .next_power_of_two();
        TlbConfig {
            entries: sets * ways,
            ways,
        }
    }
}

/// Hit/miss/flush counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TlbStats {
    /// Lookups answered by an entry.
    pub hits: u64,
    /// Lookups that needed a walk (including hits on an entry that did not
    /// allow the access, which is dropped).
    pub misses: u64,
    /// Invalidation operations (each INVLPG, CR3-load flush, VPID flush,
    /// INVVPID, INVEPT or full flush counts once).
    pub flushes: u64,
}

/// What a walk found, to be cached by [`Tlb::insert`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct TlbFill {
    /// Host-physical address of the translated byte.
    pub hpa: Hpa,
    /// The guest translation; `None` with guest paging off.
    pub guest: Option<GuestTranslation>,
    /// The EPT translation of the final guest-physical address; `None`
    /// without EPT.
    pub ept: Option<EptTranslation>,
}

/// The bits of a linear 4 KiB page number that a 4 KiB entry's tag holds
/// (and [`Removals::last_page`] gives): 48-bit linear addresses.
pub(crate) const PAGE_NUMBER_BITS: u64 = tag::VPN;

/// Bits of [`Entry::tag`]. The tag holds everything a lookup must match
/// except the EPTP, which is compared as a second word.
mod tag {
    /// Page number at the entry's page size (linear bits 47:size).
    pub const VPN: u64 = (1 << 36) - 1;
    pub const VPID_SHIFT: u32 = 40;
    pub const VPID: u64 = 0xffff << VPID_SHIFT;
    pub const SIZE_SHIFT: u32 = 56;
    pub const SIZE: u64 = 3 << SIZE_SHIFT;
    /// Made with guest paging on (a linear or combined mapping).
    pub const PAGING: u64 = 1 << 58;
    /// Made with EPT on (`Entry::eptp` is meaningful).
    pub const EPT: u64 = 1 << 59;
    pub const VALID: u64 = 1 << 63;
    /// What INVLPG matches: address, size and VPID, whatever the mode.
    pub const ADDRESS_MATCH: u64 = VALID | VPID | SIZE | VPN;
}

/// Bits of [`Entry::data`]: the host-physical page base (bits 51:12) and
/// flags in bits 11:0.
mod data {
    pub const GUEST_WRITABLE: u64 = 1 << 0;
    pub const GUEST_USER: u64 = 1 << 1;
    pub const GUEST_NX: u64 = 1 << 2;
    /// The guest leaf's D flag is set (or guest paging is off).
    pub const GUEST_DIRTY: u64 = 1 << 3;
    pub const EPT_READ: u64 = 1 << 4;
    pub const EPT_WRITE: u64 = 1 << 5;
    pub const EPT_EXEC: u64 = 1 << 6;
    /// The EPT leaf's D flag is set (or EPT A/D / EPT is off).
    pub const EPT_DIRTY: u64 = 1 << 7;
    /// `EPT_READ`, `EPT_WRITE` and `EPT_EXEC` are the EPT R/W/X bits
    /// (2:0) shifted by this.
    pub const EPT_PERMS_SHIFT: u32 = 4;
    /// Survives CR3 loads.
    pub const GLOBAL: u64 = 1 << 8;
    /// Size of the guest page the entry is a piece of (2 bits).
    pub const LINEAR_SIZE_SHIFT: u32 = 9;
    pub const HPA: u64 = 0x000f_ffff_ffff_f000;
}

const _: () = {
    use super::ept::epte;
    assert!(data::EPT_READ == epte::READ << data::EPT_PERMS_SHIFT);
    assert!(data::EPT_WRITE == epte::WRITE << data::EPT_PERMS_SHIFT);
    assert!(data::EPT_EXEC == epte::EXEC << data::EPT_PERMS_SHIFT);
};

/// Linear-address bits a 4-level translation uses.
const VA_MASK: u64 = (1 << 48) - 1;

/// Bits of an entry's second word ([`Entry::eptp`]) and of a lookup key's
/// besides the EPTP: the PCID in bits 63:52 (reserved in an EPTP, as
/// bits 51:46 past the physical-address width) and the "any PCID" flag of
/// a global entry in bit 11 (reserved in an EPTP). The EPTP part keeps
/// its other bits.
pub(crate) mod ctx_word {
    pub const PCID_SHIFT: u32 = 52;
    pub const PCID: u64 = 0xfff << PCID_SHIFT;
    pub const ANY_PCID: u64 = 1 << 11;
    /// What is not the EPTP.
    pub const NOT_EPTP: u64 = PCID | ANY_PCID;
}

/// The PCID translations are made and looked up under: CR3 bits 11:0 with
/// CR4.PCIDE and paging on, else 0.
#[inline]
fn current_pcid(regs: &super::PagingRegs) -> u64 {
    use crate::cpu::state::cr4;
    if regs.cr4 & cr4::PCIDE != 0 && regs.cr0 & cr0::PG != 0 {
        regs.cr3 & 0xfff
    } else {
        0
    }
}

/// The second word of a key or entry: the EPTP (0 without EPT) and `pcid`.
#[inline]
fn context_word(ept: Option<crate::vmx::Eptp>, pcid: u64) -> u64 {
    (ept.map_or(0, |e| e.0) & !ctx_word::NOT_EPTP) | (pcid << ctx_word::PCID_SHIFT)
}

/// The second word of a global entry that serves every PCID, for a key's
/// second word `word`.
#[inline(always)]
fn any_pcid_word(word: u64) -> u64 {
    (word & !ctx_word::PCID) | ctx_word::ANY_PCID
}

const fn size_code(size: PageSize) -> u64 {
    match size {
        PageSize::Size4K => 0,
        PageSize::Size2M => 1,
        PageSize::Size1G => 2,
    }
}

// Size codes are ordered as the sizes (`Entry::splintered` compares them).
const _: () = assert!(
    size_code(PageSize::Size4K) == 0
        && size_code(PageSize::Size2M) == 1
        && size_code(PageSize::Size1G) == 2
);

const fn size_from_code(code: u64) -> PageSize {
    match code & 3 {
        0 => PageSize::Size4K,
        1 => PageSize::Size2M,
        _ => PageSize::Size1G,
    }
}

/// One cached translation. `tag == 0` means invalid. `repr(C)`: the
/// translator's first-level fill reads entries ([`jit_view`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
struct Entry {
    tag: u64,
    /// Raw EPTP the entry was made under (0 without EPT), with the PCID
    /// ([`ctx_word`]).
    eptp: u64,
    data: u64,
}

impl Entry {
    const INVALID: Entry = Entry {
        tag: 0,
        eptp: 0,
        data: 0,
    };

    #[inline]
    fn valid(&self) -> bool {
        self.tag & tag::VALID != 0
    }
    fn vpid(&self) -> u16 {
        ((self.tag & tag::VPID) >> tag::VPID_SHIFT) as u16
    }
    fn size(&self) -> PageSize {
        size_from_code(self.tag >> tag::SIZE_SHIFT)
    }
    fn linear_size(&self) -> PageSize {
        size_from_code(self.data >> data::LINEAR_SIZE_SHIFT)
    }
    /// A piece of a larger guest page: its linear size is larger than
    /// its size (compared as codes, which are ordered as the sizes).
    #[inline(always)]
    fn splintered(&self) -> bool {
        (self.data >> data::LINEAR_SIZE_SHIFT) & 3 > (self.tag >> tag::SIZE_SHIFT) & 3
    }
    /// Larger than 4 KiB (size code not 0).
    #[inline(always)]
    fn large(&self) -> bool {
        self.tag & tag::SIZE != 0
    }
    /// A hint to this entry is checked by the epoch, not against the
    /// entry: one larger than 4 KiB (see [`Hint`]).
    #[inline(always)]
    fn hinted_by_epoch(&self) -> bool {
        self.large()
    }
    /// A global entry, serving lookups under every PCID.
    fn any_pcid(&self) -> bool {
        self.eptp & ctx_word::ANY_PCID != 0
    }
    /// First linear address (bits 47:0) the entry maps.
    /// Made with guest paging on and not global: a CR3 load without PCID
    /// drops it.
    fn non_global(&self) -> bool {
        self.tag & tag::PAGING != 0 && self.data & data::GLOBAL == 0
    }
    fn linear_base(&self) -> u64 {
        (self.tag & tag::VPN) << self.size().shift()
    }
}

/// `mask` if `set`, else 0.
#[inline(always)]
fn flag(set: bool, mask: u64) -> u64 {
    u64::from(set) * mask
}

/// A byte of `tag` for [`Tlb::candidate_ways`]: the top byte of a
/// multiplicative hash, so every tag bit bears on it (tags in one set
/// share their low page-number bits).
#[inline(always)]
fn fingerprint(tag: u64) -> u8 {
    (tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8
}

/// Bit i set = byte i of `x` is zero (exactly: no carries between bytes).
#[inline(always)]
fn zero_byte_bits(x: u64) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let nonzero = ((x & LOW7) + LOW7) | x;
    let zero_high_bits = !nonzero & !LOW7;
    // Gathers bit 8i to bit 56 + i (the products land on distinct bits).
    (zero_high_bits >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56
}

/// The tag bits that come from the translation context.
#[inline]
fn context_tag(vpid: u16, paging: bool, ept: bool) -> u64 {
    tag::VALID
        | ((vpid as u64) << tag::VPID_SHIFT)
        | if paging { tag::PAGING } else { 0 }
        | if ept { tag::EPT } else { 0 }
}

/// What a lookup compares and checks, computed once per access from the
/// translation context: the entry's tag bits that come from the context,
/// the EPTP, and the access rights as two masks over an entry's `data`
/// (every bit of `need` set, no bit of `forbid` set), so that the check on
/// a hit is two compares. [`permit_masks`] is the one definition of those
/// rights; a test checks it against [`access_permitted`] exhaustively.
///
/// `repr(C)`: the translator's first-level fill reads keys ([`jit_view`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct LookupKey {
    context: u64,
    eptp: u64,
    need: u64,
    forbid: u64,
}

impl LookupKey {
    /// A key no entry matches (the context tag lacks the valid bit).
    pub(crate) const ZERO: LookupKey = LookupKey {
        context: 0,
        eptp: 0,
        need: 0,
        forbid: 0,
    };

    /// The key of `access` under the paging registers `regs`, VPID `vpid`
    /// and `ept` (the running guest's EPTP, if EPT is on).
    #[inline]
    pub(crate) fn new(
        vpid: u16,
        regs: &super::PagingRegs,
        ept: Option<crate::vmx::Eptp>,
        access: Access,
    ) -> Self {
        let paging = regs.cr0 & cr0::PG != 0;
        let (need, forbid) = permit_masks(access, regs, paging);
        LookupKey {
            context: context_tag(vpid, paging, ept.is_some()),
            eptp: context_word(ept, current_pcid(regs)),
            need,
            forbid,
        }
    }

    #[inline]
    fn permits(&self, entry_data: u64) -> bool {
        entry_data & self.need == self.need && entry_data & self.forbid == 0
    }
}

/// The access rights of a cached translation for `access` now, as (bits of
/// an entry's `data` that must be set, bits that must be clear): the guest
/// rights under the current CR0.WP, CR4.SMEP/SMAP and RFLAGS.AC when
/// `paging` (as [`access_permitted`] decides them), and the EPT rights of
/// the final page. A write also needs both dirty flags known to be set:
/// otherwise the walk has to run again to set them.
#[inline]
fn permit_masks(access: Access, regs: &super::PagingRegs, paging: bool) -> (u64, u64) {
    use crate::cpu::state::cr4;
    let mut need = match access.kind {
        AccessKind::Read => data::EPT_READ,
        AccessKind::Write => data::EPT_WRITE | data::GUEST_DIRTY | data::EPT_DIRTY,
        AccessKind::Execute => data::EPT_EXEC,
    };
    let mut forbid = 0;
    if paging {
        if access.user {
            need |= data::GUEST_USER;
        } else {
            let smap = regs.cr4 & cr4::SMAP != 0 && !regs.rflags_ac;
            let smep = regs.cr4 & cr4::SMEP != 0;
            if match access.kind {
                AccessKind::Read | AccessKind::Write => smap,
                AccessKind::Execute => smep,
            } {
                forbid |= data::GUEST_USER;
            }
        }
        match access.kind {
            AccessKind::Read => {}
            AccessKind::Write => {
                if access.user || regs.cr0 & cr0::WP != 0 {
                    need |= data::GUEST_WRITABLE;
                }
            }
            AccessKind::Execute => forbid |= data::GUEST_NX,
        }
    }
    (need, forbid)
}

/// Where [`Tlb::locate`] found an entry: its size, set and way.
struct Located {
    size: PageSize,
    set: usize,
    way: usize,
}

/// What [`Tlb::find`] found.
enum Found {
    /// An entry that allows the access (counted as a hit, marked used).
    Usable(Hpa),
    /// An entry that does not allow it, at (set, way): nothing changed.
    Forbidden(usize, usize),
    /// No entry: nothing changed.
    Absent,
}

/// One valid entry of a [`TlbImage`]: its place (`set * ways + way`) and
/// its words. The host address in `data` and the EPTP are the saving
/// host's; a restore re-points them ([`Tlb::load_image`]). `eptp` is the
/// plain EPTP (0 without EPT); the entry's PCID and "any PCID" flag ride
/// in `data` at the bits they take in the entry's second word
/// (`ctx_word`), which `data` leaves free, so images of entries with
/// PCID 0 are what they were before PCIDs were tagged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TlbImageEntry {
    pub index: u32,
    pub tag: u64,
    pub eptp: u64,
    pub data: u64,
}

// The PCID bits of an entry's second word are free in its `data`.
const _: () = assert!(
    (data::HPA | ((1 << 11) - 1)) & ctx_word::NOT_EPTP == 0 && data::LINEAR_SIZE_SHIFT + 2 <= 11
);

impl TlbImageEntry {
    /// The entry's (second word, data) from the image's fields.
    fn words(&self) -> (u64, u64) {
        (
            (self.eptp & !ctx_word::NOT_EPTP) | (self.data & ctx_word::NOT_EPTP),
            self.data & !ctx_word::NOT_EPTP,
        )
    }

    /// Whether the entry was made with EPT on (its EPTP means something).
    pub fn under_ept(&self) -> bool {
        self.tag & tag::EPT != 0
    }

    /// The size of the page the entry maps.
    pub fn size(&self) -> PageSize {
        size_from_code(self.tag >> tag::SIZE_SHIFT)
    }

    /// The host-physical page the entry translates to.
    pub fn hpa(&self) -> Hpa {
        Hpa(self.data & data::HPA)
    }

    /// Points the entry at another host page.
    pub fn set_hpa(&mut self, hpa: Hpa) {
        self.data = (self.data & !data::HPA) | (hpa.0 & data::HPA);
    }
}

/// A TLB's contents (for VM snapshots): the valid entries where they sit
/// and each set's recently-used bits, so a restored TLB hits, misses and
/// replaces exactly as the saved one would have.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct TlbImage {
    pub entries: Vec<TlbImageEntry>,
    pub recently_used: Vec<u64>,
}

/// Host-side lookup accelerator, not part of the modelled TLB: for
/// recently used 4 KiB linear pages, where their entry sits, so the TLB
/// answers, counts and replaces exactly as it would without them.
///
/// A hint to a 4 KiB entry stays good while that entry does: the set
/// search would find exactly it (its tag holds the address, context and
/// size, so it sits in the set the search probes first, and no set ever
/// holds two entries with one tag and EPTP: `insert` replaces). So it is
/// checked against the entry itself, and survives other fills (the
/// first-level TLB's misses, which come in runs after each fill, mostly
/// hit here). That holds for a global 4 KiB entry found under another
/// PCID too (the entry's second word is then the key's with "any PCID"):
/// the search prefers an entry of the key's own PCID, and a 4 KiB entry
/// of one PCID filled since, which would take precedence in the search
/// for its own page, clears that page's hint (`Tlb::place`); a global
/// entry for the page filled since replaces the one hinted, in its way.
/// A hint to a larger entry is good while the TLB's epoch (`Tlb::epoch`)
/// stays: it moves when such an entry leaves or comes, and when a global
/// 4 KiB entry comes while larger ones may be present (it takes
/// precedence over them under every PCID, whose hints are in other
/// slots).
/// `repr(C)`: the translator's first-level fill reads hints ([`jit_view`]).
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
struct Hint {
    /// Context tag | 4 KiB page number (0 = empty).
    key: u64,
    eptp: u64,
    /// For a hint to a larger entry: the epoch it was made in.
    epoch: u64,
    set: u32,
    way: u16,
    /// A hint to a 4 KiB entry (checked against the entry, not the epoch).
    small: bool,
}

/// Number of hints (direct-mapped by 4 KiB page number and PCID, see
/// [`hint_slot`]).
const HINTS: usize = 1024;

/// What a PCID moves a page's hint slot by (times the PCID, XORed in):
/// processes forked from one another use the same linear pages under
/// different PCIDs, and a context switch would otherwise find every hint
/// of the other process in the slots it needs (the kernel's global pages
/// are hinted under the PCID they were looked up in).
const HINT_PCID_MIX: u32 = 0x2d3;

/// The hint slot of 4 KiB page `page` looked up under the second key word
/// `word` (its PCID).
#[inline(always)]
fn hint_slot(page: u64, word: u64) -> usize {
    let pcid = (word >> ctx_word::PCID_SHIFT) as u32;
    ((page as u32) ^ pcid.wrapping_mul(HINT_PCID_MIX)) as usize & (HINTS - 1)
}

/// What the translator's first-level TLB fill (`jit::tlb_fill`) reads and
/// writes of a TLB to take a usable hit through a hint, exactly as
/// [`Tlb::lookup_keyed`] takes it: where things are, and the layout of hints
/// and entries (checked at compile time).
pub(crate) mod jit_view {
    use super::{data, tag, Entry, Hint, LookupKey, HINTS};
    use std::mem::{offset_of, size_of};

    pub const KEY_BYTES: i32 = 32;
    pub const KEY_CONTEXT: i32 = 0;
    pub const KEY_EPTP: i32 = 8;
    pub const KEY_NEED: i32 = 16;
    pub const KEY_FORBID: i32 = 24;
    const _: () = assert!(size_of::<LookupKey>() == KEY_BYTES as usize);
    const _: () = assert!(offset_of!(LookupKey, context) == KEY_CONTEXT as usize);
    const _: () = assert!(offset_of!(LookupKey, eptp) == KEY_EPTP as usize);
    const _: () = assert!(offset_of!(LookupKey, need) == KEY_NEED as usize);
    const _: () = assert!(offset_of!(LookupKey, forbid) == KEY_FORBID as usize);
    pub const HINT_BYTES: i32 = 32;
    pub const HINT_KEY: i32 = 0;
    pub const HINT_EPTP: i32 = 8;
    pub const HINT_EPOCH: i32 = 16;
    pub const HINT_SET: i32 = 24;
    pub const HINT_WAY: i32 = 28;
    pub const HINT_SMALL: i32 = 30;
    pub const HINT_MASK: u32 = HINTS as u32 - 1;
    /// A hint's slot: the page number XOR the PCID (a key's second word
    /// shifted right by this) times [`HINT_PCID_MIX`], masked.
    pub const HINT_PCID_SHIFT: u32 = super::ctx_word::PCID_SHIFT;
    pub const HINT_PCID_MIX: i32 = super::HINT_PCID_MIX as i32;
    /// A key's or entry's second word: the PCID is its top bits, and a
    /// global entry's has this "any PCID" flag instead.
    pub const PCID_BITS: u32 = 64 - super::ctx_word::PCID_SHIFT;
    pub const ANY_PCID: i32 = super::ctx_word::ANY_PCID as i32;
    const _: () = assert!(super::ctx_word::PCID == u64::MAX << super::ctx_word::PCID_SHIFT);
    const _: () = assert!(super::ctx_word::ANY_PCID <= i32::MAX as u64);
    pub const ENTRY_BYTES: i32 = 24;
    pub const ENTRY_TAG: i32 = 0;
    pub const ENTRY_EPTP: i32 = 8;
    pub const ENTRY_DATA: i32 = 16;
    /// The host-physical page of an entry's `data`.
    pub const DATA_HPA: u64 = data::HPA;
    /// An entry's guest U flag (see [`super::Tlb::maps_user_page`]).
    pub const DATA_GUEST_USER: u64 = data::GUEST_USER;
    /// Where an entry's tag holds its page size code (2 bits: 1 for
    /// 2 MiB, 2 for 1 GiB).
    pub const TAG_SIZE_SHIFT: u32 = tag::SIZE_SHIFT;
    const _: () = assert!(super::size_code(super::PageSize::Size2M) == 1);
    const _: () = assert!(super::size_code(super::PageSize::Size1G) == 2);
    /// Linear-address bits a lookup uses.
    pub const VA_BITS: u32 = 48;
    const _: () = assert!(size_of::<Hint>() == HINT_BYTES as usize);
    const _: () = assert!(offset_of!(Hint, key) == HINT_KEY as usize);
    const _: () = assert!(offset_of!(Hint, eptp) == HINT_EPTP as usize);
    const _: () = assert!(offset_of!(Hint, epoch) == HINT_EPOCH as usize);
    const _: () = assert!(offset_of!(Hint, set) == HINT_SET as usize);
    const _: () = assert!(offset_of!(Hint, way) == HINT_WAY as usize);
    const _: () = assert!(offset_of!(Hint, small) == HINT_SMALL as usize);
    const _: () = assert!(size_of::<Entry>() == ENTRY_BYTES as usize);
    const _: () = assert!(offset_of!(Entry, tag) == ENTRY_TAG as usize);
    const _: () = assert!(offset_of!(Entry, eptp) == ENTRY_EPTP as usize);
    const _: () = assert!(offset_of!(Entry, data) == ENTRY_DATA as usize);
    // A 4 KiB entry's tag is the hint key (size code 0).
    const _: () = assert!(super::size_code(super::PageSize::Size4K) == 0);
    const _: () = assert!(tag::VPN == (1 << (VA_BITS - 12)) - 1);

    /// Addresses of a TLB's parts, valid while the TLB is neither moved
    /// nor dropped (its buffers never reallocate).
    #[derive(Debug, Clone, Copy)]
    pub struct Pointers {
        pub hints: u64,
        pub entries: u64,
        pub recently_used: u64,
        pub hits: u64,
        pub ways: u64,
        pub full_set_mask: u64,
        /// The epoch a hint to a larger entry is good in (`Tlb::epoch`).
        pub epoch: u64,
    }
}

/// A count of the times valid entries left the TLB, with the last one's
/// page when that was a single 4 KiB entry. The first-level TLB in front
/// of the TLB (`cpu::l1tlb`) is inclusive: a slot is good while the entry
/// it was filled from is in the TLB, and the TLB's context (what lookup
/// keys depend on) is as it was. So it follows this count: one removal
/// of a 4 KiB page since it last looked drops that page's slots, anything
/// more empties it. Fills into free ways and hits move nothing here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Removals {
    /// Moves by one per removal of a single entry, by two for a flush
    /// (so a flush never looks like one page's removal).
    pub count: u64,
    /// The 4 KiB page number (linear, 36 bits) of the last removal when
    /// it was of a 4 KiB entry, else `None`.
    pub last_page: Option<u64>,
}

impl Removals {
    /// `entry` (valid) leaves the TLB.
    #[inline(always)]
    fn note(&mut self, entry: &Entry) {
        self.count += 1;
        self.last_page = (!entry.large()).then_some(entry.tag & tag::VPN);
    }

    /// Any number of entries leave the TLB (a flush).
    fn note_many(&mut self) {
        self.count += 2;
        self.last_page = None;
    }
}

/// Which ways of one TLB set hold what, as bitmaps (bit w = way w), and
/// their fingerprints, kept together so that a fill or a probe reads and
/// writes one host cache line of them (host-side bookkeeping, mirroring the entries).
#[derive(Debug, Clone, Copy, Default)]
#[repr(align(64))]
struct SetBits {
    /// Valid entries. With `Tlb::nonempty`, lets flushes visit only the
    /// valid entries.
    valid: u64,
    /// Valid entries larger than 4 KiB, so that lookups and INVLPG probe
    /// the 2 MiB and 1 GiB sets only where such an entry is.
    large: u64,
    /// Valid non-global entries made with paging on: a CR3 load's flush
    /// visits only these, not the global (kernel) entries it keeps.
    non_global: u64,
    /// Valid splintered entries, so that a CR3 load's flush, which does
    /// not visit the entries it keeps, still recomputes
    /// `Tlb::may_hold_splinters`.
    splintered: u64,
    /// Byte w: the [`fingerprint`] of way w's tag while the way is valid
    /// (ways 0 to 7; a TLB of more ways has none). A search of a set with
    /// more than two valid ways compares them all at once and reads only
    /// the entries whose byte matches: this line, not the set's entries'
    /// three.
    fingerprints: u64,
}

#[cfg(test)]
thread_local! {
    /// Misses [`Tlb::lookup_probe`] answered without probing, on this
    /// thread (for tests: that they exercise the shortcut).
    pub(crate) static EMPTY_SET_MISSES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Lookups the hints did not answer (sets probed), on this thread.
    pub(crate) static SET_PROBES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Fills that skipped the search for their entry's tag after a miss
    /// (`Tlb::absent`), on this thread.
    pub(crate) static KNOWN_ABSENT_FILLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A VPID- and PCID-tagged translation lookaside buffer.
#[derive(Clone)]
pub struct Tlb {
    /// Lookup accelerator (see [`Hint`]).
    hints: Box<[Hint; HINTS]>,
    /// Bumped when a hint checked by it may have gone stale (see [`Hint`]).
    epoch: u64,
    /// Bumped whenever valid entries leave the TLB (evicted, replaced,
    /// invalidated, flushed); see [`Removals`].
    removals: Removals,
    /// `sets * ways` entries, set by set.
    entries: Vec<Entry>,
    /// Per set: bit w set = way w recently used.
    recently_used: Vec<u64>,
    /// Per set, which ways hold what (host-side bookkeeping, see
    /// [`SetBits`]).
    sets: Vec<SetBits>,
    /// Bit s % 64 of word s / 64 set = set s has a valid entry.
    nonempty: Vec<u64>,
    /// Bit s % 64 of word s / 64 set = set s has a valid non-global
    /// entry made with paging on (`SetBits::non_global`): a CR3 load's
    /// flush visits only these sets.
    non_global_sets: Vec<u64>,
    ways: usize,
    /// `sets - 1` (sets is a power of two).
    set_mask: usize,
    /// All ways' bits.
    full_set_mask: u64,
    /// A larger-than-4 KiB entry may be present (set by fills, recomputed
    /// by full scans): without, lookups skip the 2 MiB and 1 GiB sets
    /// (host-side bookkeeping).
    may_hold_large: bool,
    /// A splintered entry may be present (cleared by full scans).
    may_hold_splinters: bool,
    /// The 4 KiB tag and second word of the last lookup that found no
    /// entry, while that still holds for the page (tag 0: none). Host-side
    /// bookkeeping: entries come only through [`Tlb::place`], which takes
    /// it, and `load_image`, which clears it; so when the fill that follows
    /// a miss places that page's entry, `place` knows its set holds none
    /// with its tag and second word (the lookup searched for one of the
    /// key's PCID and a global one) and skips the search.
    absent: (u64, u64),
    /// For tests: every miss probes the sets (no empty-set shortcut in
    /// [`Tlb::lookup_probe`]) and every fill searches its set (no
    /// `absent` shortcut in [`Tlb::place`]), to check that the shortcuts
    /// answer the same.
    #[cfg(test)]
    pub(crate) full_probes: bool,
    stats: TlbStats,
    /// The paging-structure caches, invalidated with the TLB.
    pub(crate) psc: Psc,
}

impl std::fmt::Debug for Tlb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tlb")
            .field("config", &self.config())
            .field("occupancy", &self.occupancy())
            .field("stats", &self.stats)
            .field("psc", &self.psc.config())
            .finish()
    }
}

impl Tlb {
    /// An empty TLB with the geometry `config.normalized()` and the
    /// default paging-structure caches.
    pub fn new(config: TlbConfig) -> Self {
        Self::with_psc(config, PscConfig::default())
    }

    /// An empty TLB with the geometry `config.normalized()` and
    /// paging-structure caches of `psc`'s sizes.
    pub fn with_psc(config: TlbConfig, psc: PscConfig) -> Self {
        let config = config.normalized();
        let sets = config.entries / config.ways;
        Tlb {
            hints: Box::new([Hint::default(); HINTS]),
            epoch: 1,
            removals: Removals::default(),
            entries: vec![Entry::INVALID; config.entries],
            recently_used: vec![0; sets],
            sets: vec![SetBits::default(); sets],
            may_hold_large: false,
            nonempty: vec![0; sets.div_ceil(64)],
            non_global_sets: vec![0; sets.div_ceil(64)],
            ways: config.ways,
            set_mask: sets - 1,
            full_set_mask: if config.ways == 64 {
                u64::MAX
            } else {
                (1u64 << config.ways) - 1
            },
            may_hold_splinters: false,
            absent: (0, 0),
            #[cfg(test)]
            full_probes: false,
            stats: TlbStats::default(),
            psc: Psc::new(psc),
        }
    }

    /// The geometry in use.
    pub fn config(&self) -> TlbConfig {
        TlbConfig {
            entries: self.entries.len(),
            ways: self.ways,
        }
    }

    /// Number of valid entries.
    pub fn occupancy(&self) -> usize {
        self.entries.iter().filter(|e| e.valid()).count()
    }

    /// The set of page number `vpn` (at any size) as an index range.
    #[inline]
    fn set_range(&self, vpn: u64) -> (usize, std::ops::Range<usize>) {
        let set = (vpn as usize) & self.set_mask;
        (set, set * self.ways..(set + 1) * self.ways)
    }

    /// The bookkeeping of set `set` (taken modulo the number of sets),
    /// without a bounds check: the miss path reads and writes it several
    /// times per fill.
    #[inline(always)]
    fn bits(&self, set: usize) -> &SetBits {
        let set = set & self.set_mask;
        // SAFETY: `sets` holds `set_mask + 1` elements (made so by
        // `with_psc`, never resized), and `set <= set_mask`.
        unsafe { self.sets.get_unchecked(set) }
    }

    /// [`Self::bits`], mutable.
    #[inline(always)]
    fn bits_mut(&mut self, set: usize) -> &mut SetBits {
        let set = set & self.set_mask;
        // SAFETY: as in `bits`.
        unsafe { self.sets.get_unchecked_mut(set) }
    }

    /// The recently-used bits of set `set` (taken modulo the number of
    /// sets), without a bounds check.
    #[inline(always)]
    fn recent_mut(&mut self, set: usize) -> &mut u64 {
        let set = set & self.set_mask;
        // SAFETY: `recently_used` holds `set_mask + 1` elements (made so by
        // `with_psc`, only ever copied into), and `set <= set_mask`.
        unsafe { self.recently_used.get_unchecked_mut(set) }
    }

    /// The words of `nonempty` and `non_global_sets` holding set `set`'s
    /// bit (`set` taken modulo the number of sets), without bounds checks.
    #[inline(always)]
    fn set_words_mut(&mut self, set: usize) -> (&mut u64, &mut u64) {
        let word = (set & self.set_mask) / 64;
        // SAFETY: both hold `(set_mask + 1).div_ceil(64)` words (made so by
        // `with_psc`, never resized), and `word <= set_mask / 64`.
        unsafe {
            (
                self.nonempty.get_unchecked_mut(word),
                self.non_global_sets.get_unchecked_mut(word),
            )
        }
    }

    /// Way `way` of `set` now holds the valid entry `e`.
    #[inline(always)]
    fn mark_valid(&mut self, set: usize, way: usize, e: &Entry) {
        let (large, non_global) = (e.large(), e.non_global());
        let bits = self.bits_mut(set);
        let others = !(1 << way);
        if way < 8 {
            let shift = way * 8;
            bits.fingerprints =
                (bits.fingerprints & !(0xff << shift)) | u64::from(fingerprint(e.tag)) << shift;
        }
        bits.splintered = (bits.splintered & others) | (u64::from(e.splintered()) << way);
        bits.valid |= 1 << way;
        bits.large = (bits.large & others) | (u64::from(large) << way);
        bits.non_global = (bits.non_global & others) | (u64::from(non_global) << way);
        let any_non_global = bits.non_global != 0;
        self.may_hold_large |= large;
        let (nonempty, non_global_sets) = self.set_words_mut(set);
        *nonempty |= 1 << (set % 64);
        if !any_non_global {
            *non_global_sets &= !(1 << (set % 64));
        } else {
            *non_global_sets |= 1 << (set % 64);
        }
    }

    #[inline]
    fn mark_invalid(&mut self, set: usize, way: usize) {
        self.mark_invalid_ways(set, 1 << way);
    }

    /// Drops the valid entry in way `way` of `set`, noting the removal
    /// (see [`Removals`]).
    #[inline]
    fn remove(&mut self, set: usize, way: usize) {
        let index = set * self.ways + way;
        self.removals.note(&self.entries[index]);
        self.entries[index] = Entry::INVALID;
        self.mark_invalid(set, way);
    }

    /// The ways of `set` in the bitmap `ways` no longer hold entries.
    #[inline]
    fn mark_invalid_ways(&mut self, set: usize, ways: u64) {
        let bits = self.bits_mut(set);
        bits.valid &= !ways;
        bits.large &= !ways;
        bits.non_global &= !ways;
        bits.splintered &= !ways;
        let (any_valid, any_non_global) = (bits.valid != 0, bits.non_global != 0);
        let (nonempty, non_global_sets) = self.set_words_mut(set);
        if !any_valid {
            *nonempty &= !(1 << (set % 64));
        }
        if !any_non_global {
            *non_global_sets &= !(1 << (set % 64));
        }
    }

    /// Drops every hint (for tests: a TLB without them answers the same).
    #[cfg(test)]
    pub(crate) fn forget_hints(&mut self) {
        *self.hints = [Hint::default(); HINTS];
    }

    /// Whether the valid-entry and large-entry bitmaps match the entries
    /// (for tests).
    #[cfg(test)]
    pub(crate) fn valid_bits_consistent(&self) -> bool {
        (0..self.sets.len()).all(|set| {
            let ways = |keep: &dyn Fn(&Entry) -> bool| {
                (0..self.ways)
                    .filter(|&w| keep(&self.entries[set * self.ways + w]))
                    .fold(0u64, |b, w| b | 1 << w)
            };
            let bits = ways(&|e| e.valid());
            let non_global = ways(&|e| e.valid() && e.non_global());
            bits == self.sets[set].valid
                && ways(&|e| e.valid() && e.size() != PageSize::Size4K) == self.sets[set].large
                && non_global == self.sets[set].non_global
                && ways(&|e| e.valid() && e.splintered()) == self.sets[set].splintered
                && (0..self.ways.min(8)).all(|w| {
                    let e = &self.entries[set * self.ways + w];
                    let fingerprints = self.sets[set].fingerprints;
                    !e.valid() || (fingerprints >> (w * 8)) as u8 == fingerprint(e.tag)
                })
                && (self.non_global_sets[set / 64] >> (set % 64)) & 1 == u64::from(non_global != 0)
                && (self.may_hold_large || self.sets[set].large == 0)
                && (self.nonempty[set / 64] >> (set % 64)) & 1 == u64::from(bits != 0)
        })
    }

    /// `ways` (valid ways of `set`) narrowed to those that may hold `tag`
    /// by their fingerprints, when there are more than two to look at
    /// (fewer are read faster) and the set has at most 8 ways (the
    /// fingerprints of one word).
    #[inline(always)]
    fn candidate_ways(&self, set: usize, ways: u64, tag: u64) -> u64 {
        let beyond_one = ways & ways.wrapping_sub(1);
        if beyond_one & beyond_one.wrapping_sub(1) == 0 || self.ways > 8 {
            ways
        } else {
            let pattern = u64::from(fingerprint(tag)) * 0x0101_0101_0101_0101;
            ways & zero_byte_bits(self.bits(set).fingerprints ^ pattern)
        }
    }

    /// The way of `set` among `ways` (a bitmap) holding an entry with
    /// `tag` and `eptp`. There is at most one: a fill replaces an entry
    /// with the same tag and EPTP.
    #[inline(always)]
    fn way_of(&self, set: usize, ways: u64, tag: u64, eptp: u64) -> Option<usize> {
        let mut ways = self.candidate_ways(set, ways, tag);
        let base = set * self.ways;
        while ways != 0 {
            let way = ways.trailing_zeros() as usize;
            let e = &self.entries[base + way];
            if e.tag == tag && e.eptp == eptp {
                return Some(way);
            }
            ways &= ways - 1;
        }
        None
    }

    /// The way of `set` among `ways` holding the entry a lookup with tag
    /// `tag` and second word `word` uses: one of the key's own PCID, else
    /// a global one of any PCID.
    #[inline(always)]
    fn way_of_key(&self, set: usize, ways: u64, tag: u64, word: u64) -> Option<usize> {
        let mut ways = self.candidate_ways(set, ways, tag);
        let base = set * self.ways;
        let any = any_pcid_word(word);
        let mut global = None;
        while ways != 0 {
            let way = ways.trailing_zeros() as usize;
            let e = &self.entries[base + way];
            if e.tag == tag {
                if e.eptp == word {
                    return Some(way);
                }
                if e.eptp == any && global.is_none() {
                    global = Some(way);
                }
            }
            ways &= ways - 1;
        }
        global
    }

    #[inline]
    fn touch(&mut self, set: usize, way: usize) {
        let full = self.full_set_mask;
        let bits = self.recent_mut(set);
        *bits |= 1 << way;
        if *bits == full {
            *bits = 1 << way;
        }
    }

    /// Looks `gva` up for `access`. Returns the host-physical address on a
    /// usable hit; on a hit that does not allow the access, drops the entry
    /// so that the walk that follows refills it.
    #[inline]
    pub(crate) fn lookup(
        &mut self,
        ctx: &TranslateCtx<'_>,
        gva: Gva,
        access: Access,
    ) -> Option<Hpa> {
        let key = LookupKey::new(ctx.vpid, &ctx.regs, ctx.ept, access);
        self.lookup_keyed(&key, gva)
    }

    /// [`Self::lookup`] with the access's key already made (the key of
    /// the access under the context, as `lookup` makes it): the same
    /// result and effects. The CPU caches keys per mode and takes this way
    /// on its first-level TLB misses (data and fetches).
    ///
    /// A usable hit through the page's hint is answered here; everything
    /// else (a stale hint, a probe, a miss) out of line.
    #[inline]
    pub(crate) fn lookup_keyed(&mut self, key: &LookupKey, gva: Gva) -> Option<Hpa> {
        let va = gva.0 & VA_MASK;
        let hint_key = key.context | (va >> 12);
        let h = &self.hints[hint_slot(va >> 12, key.eptp)];
        if h.key == hint_key && h.eptp == key.eptp {
            let (set, way) = (h.set as usize, h.way as usize);
            let e = self.entries[set * self.ways + way];
            // A 4 KiB hint: still that entry (of the key's PCID, or global);
            // a larger one: nothing moved.
            let good = if h.small {
                e.tag == hint_key && (e.eptp == key.eptp || e.eptp == any_pcid_word(key.eptp))
            } else {
                h.epoch == self.epoch
            };
            if good && key.permits(e.data) {
                self.stats.hits += 1;
                self.touch(set, way);
                let size = e.size();
                return Some(Hpa((e.data & data::HPA) | (va & (size.bytes() - 1))));
            }
        }
        self.lookup_probe(key, va)
    }

    /// [`Self::lookup_keyed`] past the hint: the set of each page size
    /// that may hold the page, then on a hit that does not allow the
    /// access the entry is dropped; a miss is counted. When the page's
    /// 4 KiB set is empty and no larger entry may be present (after a CR3
    /// load's flush, the common miss), the probe cannot find anything: the
    /// miss is counted here, without the probe's set-up.
    #[inline(never)]
    fn lookup_probe(&mut self, key: &LookupKey, va: u64) -> Option<Hpa> {
        let set = ((va >> PageSize::Size4K.shift()) as usize) & self.set_mask;
        #[cfg(test)]
        let shortcut = !self.full_probes;
        #[cfg(not(test))]
        let shortcut = true;
        if shortcut && !self.may_hold_large && self.bits(set).valid == 0 {
            #[cfg(test)]
            EMPTY_SET_MISSES.with(|n| n.set(n.get() + 1));
            self.stats.misses += 1;
            return None;
        }
        self.lookup_probe_sets(key, va)
    }

    /// [`Self::lookup_probe`] with the sets probed.
    #[inline(never)]
    fn lookup_probe_sets(&mut self, key: &LookupKey, va: u64) -> Option<Hpa> {
        #[cfg(test)]
        SET_PROBES.with(|n| n.set(n.get() + 1));
        match self.probe(key, va) {
            Found::Usable(hpa) => return Some(hpa),
            Found::Forbidden(set, way) => {
                self.remove(set, way);
                self.epoch += 1;
            }
            Found::Absent => self.absent = (key.context | (va >> 12), key.eptp),
        }
        self.stats.misses += 1;
        None
    }

    /// The entry for `va` under `key` in the set of each page size that
    /// may hold it (the hint did not answer). A usable entry is counted,
    /// marked used and hinted here; nothing else changes the TLB.
    #[inline(always)]
    fn probe(&mut self, key: &LookupKey, va: u64) -> Found {
        let hint_key = key.context | (va >> 12);
        let hint_slot = hint_slot(va >> 12, key.eptp);
        let Some(Located { size, set, way }) = self.locate(key, va) else {
            return Found::Absent;
        };
        let entry_data = self.entries[set * self.ways + way].data;
        if !key.permits(entry_data) {
            return Found::Forbidden(set, way);
        }
        self.stats.hits += 1;
        self.touch(set, way);
        self.hints[hint_slot] = Hint {
            key: hint_key,
            eptp: key.eptp,
            epoch: self.epoch,
            set: set as u32,
            way: way as u16,
            small: size == PageSize::Size4K,
        };
        Found::Usable(Hpa((entry_data & data::HPA) | (va & (size.bytes() - 1))))
    }

    /// Where the entry for `va` under `key` is, in the set of each page
    /// size that may hold it: the valid ways of the 4 KiB set, then the
    /// large ways of the 2 MiB and 1 GiB sets (the only ways a tag of that
    /// size can be in; none when the TLB holds no large entry).
    #[inline(always)]
    fn locate(&self, key: &LookupKey, va: u64) -> Option<Located> {
        let sizes = if self.may_hold_large { 3 } else { 1 };
        for size in &PageSize::ALL[..sizes] {
            let size = *size;
            let vpn = va >> size.shift();
            let wanted = key.context | (size_code(size) << tag::SIZE_SHIFT) | vpn;
            let set = (vpn as usize) & self.set_mask;
            let ways = if size == PageSize::Size4K {
                self.bits(set).valid
            } else {
                self.bits(set).large
            };
            if let Some(way) = self.way_of_key(set, ways, wanted, key.eptp) {
                return Some(Located { size, set, way });
            }
        }
        None
    }

    /// Whether a lookup of `gva` under `key` would now be a usable hit
    /// (an entry that allows the access: nothing removed, nothing to
    /// insert). Changes nothing.
    pub(crate) fn holds_usable(&self, key: &LookupKey, gva: Gva) -> bool {
        self.locate(key, gva.0 & VA_MASK)
            .is_some_and(|l| key.permits(self.entries[l.set * self.ways + l.way].data))
    }

    /// Whether the entry a lookup of `gva` under `key` finds now maps a
    /// user-mode page (its guest U flag, which entries made without guest
    /// paging carry too); `None` when there is no entry. Changes nothing
    /// (nothing counted, marked used or hinted): the first-level TLB asks
    /// it for the supervisor data slots it fills, which SMAP revokes when
    /// RFLAGS.AC clears.
    pub(crate) fn maps_user_page(&self, key: &LookupKey, gva: Gva) -> Option<bool> {
        let found = self.locate(key, gva.0 & VA_MASK)?;
        let entry_data = self.entries[found.set * self.ways + found.way].data;
        Some(entry_data & data::GUEST_USER != 0)
    }

    /// Caches the translation of `gva` a walk just made under `ctx`.
    #[inline(always)]
    pub(crate) fn insert(&mut self, ctx: &TranslateCtx<'_>, gva: Gva, fill: TlbFill) {
        let guest_size = fill.guest.map_or(PageSize::Size1G, |g| g.size);
        let ept_size = fill.ept.map_or(PageSize::Size1G, |t| t.page_size);
        let size = guest_size.min(ept_size);
        // Without guest paging there is no larger linear page to splinter.
        let linear_size = if fill.guest.is_some() {
            guest_size
        } else {
            size
        };
        let guest_flags = match fill.guest {
            Some(g) => {
                flag(g.perms.writable, data::GUEST_WRITABLE)
                    | flag(g.perms.user, data::GUEST_USER)
                    | flag(g.perms.no_execute, data::GUEST_NX)
                    | flag(g.dirty, data::GUEST_DIRTY)
                    | flag(g.global, data::GLOBAL)
            }
            None => data::GUEST_WRITABLE | data::GUEST_USER | data::GUEST_DIRTY,
        };
        let ept_flags = match fill.ept {
            Some(t) => {
                (t.perms.bits() << data::EPT_PERMS_SHIFT) | flag(t.dirty_recorded, data::EPT_DIRTY)
            }
            None => data::EPT_READ | data::EPT_WRITE | data::EPT_EXEC | data::EPT_DIRTY,
        };
        let vpn = (gva.0 & VA_MASK) >> size.shift();
        let pcid = current_pcid(&ctx.regs);
        let pcide = ctx.regs.cr4 & crate::cpu::state::cr4::PCIDE != 0;
        let word = context_word(ctx.ept, pcid);
        let entry = Entry {
            tag: context_tag(ctx.vpid, fill.guest.is_some(), ctx.ept.is_some())
                | (size_code(size) << tag::SIZE_SHIFT)
                | vpn,
            eptp: if pcide && fill.guest.is_some_and(|g| g.global) {
                any_pcid_word(word)
            } else {
                word
            },
            data: (fill.hpa.0 & data::HPA & !(size.bytes() - 1))
                | guest_flags
                | ept_flags
                | (size_code(linear_size) << data::LINEAR_SIZE_SHIFT),
        };
        self.place(entry, linear_size > size);
    }

    /// Puts `entry` (`splintered` if a piece of a
    /// larger guest page) in its set: over the entry with its tag and
    /// EPTP, else in the first invalid way, else over the PLRU victim.
    #[inline(always)]
    fn place(&mut self, entry: Entry, splintered: bool) {
        let set = ((entry.tag & tag::VPN) as usize) & self.set_mask;
        let valid = self.bits(set).valid;
        // The first invalid way is the lowest clear bit of the set's
        // valid bitmap (which mirrors the entries).
        let invalid = !valid & self.full_set_mask;
        // (A miss of this page just searched the set: `absent`.)
        let (absent_tag, absent_word) = std::mem::take(&mut self.absent);
        #[cfg(test)]
        let shortcut = !self.full_probes;
        #[cfg(not(test))]
        let shortcut = true;
        let known_absent = shortcut
            && entry.tag == absent_tag
            && (entry.eptp == absent_word || entry.eptp == any_pcid_word(absent_word));
        #[cfg(test)]
        {
            assert!(
                !known_absent || self.way_of(set, valid, entry.tag, entry.eptp).is_none(),
                "a fill's entry said absent is in its set"
            );
            KNOWN_ABSENT_FILLS.with(|n| n.set(n.get() + u64::from(known_absent)));
        }
        let found = if known_absent {
            None
        } else {
            self.way_of(set, valid, entry.tag, entry.eptp)
        };
        let way = match found {
            Some(way) => way,
            None if invalid != 0 => invalid.trailing_zeros() as usize,
            None => {
                let not_recent = !*self.recent_mut(set) & self.full_set_mask;
                if not_recent == 0 {
                    0
                } else {
                    not_recent.trailing_zeros() as usize
                }
            }
        };
        let index = set * self.ways + way;
        let replaced = valid & (1 << way) != 0;
        if replaced {
            // An eviction, or the page's entry remade.
            self.removals.note(&self.entries[index]);
        }
        // The hints checked by the epoch (to larger entries) go when the
        // entry one may point to leaves, or when a larger entry comes, or
        // a global 4 KiB one while larger ones may be present (it takes
        // precedence over them in lookups of its page under any PCID,
        // whose hints are in other slots). A new 4 KiB entry of one PCID
        // takes precedence only in lookups of its own page under that
        // PCID: that one hint goes (hints to 4 KiB entries are checked
        // against the entry).
        if entry.hinted_by_epoch()
            || (entry.any_pcid() && self.may_hold_large)
            || (replaced && self.entries[index].hinted_by_epoch())
        {
            self.epoch += 1;
        } else {
            // (A hint whose key is 0 is empty.)
            self.hints[hint_slot(entry.tag & tag::VPN, entry.eptp)].key = 0;
        }
        self.entries[index] = entry;
        self.mark_valid(set, way, &entry);
        self.touch(set, way);
        self.may_hold_splinters |= splintered;
    }

    /// Drops every entry for which `drop` is true, and recomputes the
    /// splintered and large-entry summaries. Counts one flush.
    fn drop_where(&mut self, drop: impl FnMut(&Entry) -> bool) {
        self.drop_visiting(false, drop);
    }

    /// [`Self::drop_where`] visiting only the valid entries (through the
    /// `nonempty` and `valid` bitmaps), or only the non-global ones made
    /// with paging on (`non_global_sets` and `non_global`) if
    /// `non_global_only` and `drop` keeps every other entry; so a flush
    /// costs in proportion to what it may drop, not to the TLB's size (a
    /// CR3 load's flush finds about one entry in each set it visits).
    fn drop_visiting(&mut self, non_global_only: bool, mut drop: impl FnMut(&Entry) -> bool) {
        self.stats.flushes += 1;
        let mut any_dropped = false;
        // Hints to 4 KiB entries of their PCID are checked against the
        // entry; the others go if their entry may have (`place`).
        let mut epoch_hinted = false;
        for word in 0..self.nonempty.len() {
            let mut sets = if non_global_only {
                self.non_global_sets[word]
            } else {
                self.nonempty[word]
            };
            while sets != 0 {
                let bit = sets.trailing_zeros() as usize;
                sets &= sets - 1;
                let set = word * 64 + bit;
                let base = set * self.ways;
                let mut ways = if non_global_only {
                    self.sets[set].non_global
                } else {
                    self.sets[set].valid
                };
                let mut dropped = 0;
                while ways != 0 {
                    let way = ways.trailing_zeros() as usize;
                    ways &= ways - 1;
                    let e = &mut self.entries[base + way];
                    if drop(e) {
                        epoch_hinted |= e.hinted_by_epoch();
                        *e = Entry::INVALID;
                        dropped |= 1 << way;
                    }
                }
                if dropped != 0 {
                    self.mark_invalid_ways(set, dropped);
                    any_dropped = true;
                }
            }
        }
        if self.may_hold_splinters {
            self.may_hold_splinters = self.sets.iter().any(|b| b.splintered != 0);
        }
        if self.may_hold_large {
            self.may_hold_large = self.sets.iter().any(|b| b.large != 0);
        }
        if any_dropped {
            self.removals.note_many();
        }
        if epoch_hinted {
            self.epoch += 1;
        }
    }

    /// INVLPG: drop entries of `vpid` covering `gva`, global or not, and
    /// every paging-structure-cache entry of `vpid` (SDM 4.10.4.1).
    pub fn invlpg(&mut self, vpid: u16, gva: Gva) {
        self.psc.flush_vpid(vpid);
        self.epoch += 1;
        let va = gva.0 & VA_MASK;
        for size in PageSize::ALL {
            let vpn = va >> size.shift();
            let wanted = tag::VALID
                | ((vpid as u64) << tag::VPID_SHIFT)
                | (size_code(size) << tag::SIZE_SHIFT)
                | vpn;
            let set = (vpn as usize) & self.set_mask;
            // Entries of a size larger than 4 KiB are only in large ways.
            let mut ways = if size == PageSize::Size4K {
                self.sets[set].valid
            } else {
                self.sets[set].large
            };
            while ways != 0 {
                let way = ways.trailing_zeros() as usize;
                ways &= ways - 1;
                let index = set * self.ways + way;
                if self.entries[index].tag & tag::ADDRESS_MATCH == wanted {
                    self.remove(set, way);
                }
            }
        }
        if self.may_hold_splinters {
            // Pieces of a guest large page live in the sets of their own
            // 4 KiB / 2 MiB page numbers: find them all.
            self.drop_where(|e| {
                let linear = e.linear_size();
                e.vpid() == vpid
                    && e.splintered()
                    && e.linear_base() >> linear.shift() == va >> linear.shift()
            });
        } else {
            self.stats.flushes += 1;
        }
    }

    /// MOV to CR3 without CR4.PCIDE, INVPCID type 3, INVVPID type 3: drop
    /// the non-global entries of `vpid`, every PCID's. Guest-physical
    /// mappings (made with paging off) do not depend on CR3 and are kept.
    /// All paging-structure-cache entries of `vpid` go.
    ///
    /// Visits only the non-global entries (`non_global`): with Linux's
    /// kernel mapped global (page-table isolation without PCID), most of
    /// the TLB survives every system call's two CR3 loads.
    pub fn flush_non_global(&mut self, vpid: u16) {
        self.psc.flush_vpid(vpid);
        let paging_of_vpid = ((vpid as u64) << tag::VPID_SHIFT) | tag::PAGING;
        self.drop_visiting(true, |e| {
            e.tag & (tag::VPID | tag::PAGING) == paging_of_vpid && e.data & data::GLOBAL == 0
        });
    }

    /// Drop all entries of `vpid` (e.g. CR4.PGE toggled).
    /// MOV to CR3 with CR4.PCIDE and bit 63 clear, and INVPCID type 1
    /// (SDM Vol. 3A 4.10.4.1): drop the non-global entries of `vpid` made
    /// under `pcid`, and the paging-structure caches of `vpid` (all its
    /// PCIDs: wider than needed). Other PCIDs' translations stay.
    pub fn flush_pcid(&mut self, vpid: u16, pcid: u64) {
        self.psc.flush_vpid(vpid);
        let paging_of_vpid = ((vpid as u64) << tag::VPID_SHIFT) | tag::PAGING;
        let pcid_bits = (pcid & 0xfff) << ctx_word::PCID_SHIFT;
        self.drop_visiting(true, |e| {
            e.tag & (tag::VPID | tag::PAGING) == paging_of_vpid
                && e.data & data::GLOBAL == 0
                && e.eptp & ctx_word::NOT_EPTP == pcid_bits
        });
    }

    pub fn flush_vpid(&mut self, vpid: u16) {
        self.psc.flush_vpid(vpid);
        self.drop_where(|e| e.vpid() == vpid);
    }

    /// Drop everything.
    pub fn flush_all(&mut self) {
        self.psc.flush_all();
        self.drop_where(|_| true);
    }

    /// INVVPID. `AllContext` spares VPID 0 (the host's).
    pub fn invvpid(&mut self, kind: InvvpidKind) {
        match kind {
            InvvpidKind::IndividualAddress { vpid, gva } => self.invlpg(vpid, gva),
            InvvpidKind::SingleContext { vpid } => self.flush_vpid(vpid),
            InvvpidKind::AllContext => {
                self.psc.flush_all_guest_vpids();
                self.drop_where(|e| e.vpid() != 0)
            }
            InvvpidKind::SingleContextRetainingGlobals { vpid } => self.flush_non_global(vpid),
        }
    }

    /// INVEPT: drop the mappings made under EPT, all of them (`Global`) or
    /// those whose EPTP has the same PML4 address (`SingleContext`, which
    /// the SDM keys by the EP4TA, bits 51:12).
    pub fn invept(&mut self, kind: InveptKind) {
        self.psc.invept(kind);
        match kind {
            InveptKind::SingleContext(eptp) => {
                let root = eptp.pml4().0;
                self.drop_where(|e| e.tag & tag::EPT != 0 && e.eptp & data::HPA == root);
            }
            InveptKind::Global => self.drop_where(|e| e.tag & tag::EPT != 0),
        }
    }

    /// The contents, for a snapshot.
    pub fn image(&self) -> TlbImage {
        TlbImage {
            entries: self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.valid())
                .map(|(index, e)| TlbImageEntry {
                    index: index as u32,
                    tag: e.tag,
                    eptp: e.eptp & !ctx_word::NOT_EPTP,
                    data: e.data | (e.eptp & ctx_word::NOT_EPTP),
                })
                .collect(),
            recently_used: self.recently_used.clone(),
        }
    }

    /// Replaces the contents with `image` (from a TLB of this geometry);
    /// `repoint` adjusts each entry to this host (its host page, its
    /// EPTP) or refuses it (`false`: the entry is left out, as if
    /// evicted). An image that does not fit is an error and leaves the
    /// TLB empty.
    pub fn load_image(
        &mut self,
        image: &TlbImage,
        mut repoint: impl FnMut(&mut TlbImageEntry) -> bool,
    ) -> Result<(), String> {
        self.flush_all();
        self.absent = (0, 0);
        if image.recently_used.len() != self.recently_used.len() {
            return Err(format!(
                "a TLB image of {} sets for a TLB of {}",
                image.recently_used.len(),
                self.recently_used.len()
            ));
        }
        let ways_mask = self.full_set_mask;
        if image
            .recently_used
            .iter()
            .any(|&bits| bits & !ways_mask != 0)
        {
            return Err("TLB recently-used bits past the ways".into());
        }
        for saved in &image.entries {
            let index = saved.index as usize;
            if index >= self.entries.len() || saved.tag & tag::VALID == 0 {
                self.flush_all();
                return Err(format!("TLB entry {index} is not a valid place"));
            }
            let mut entry = *saved;
            if !repoint(&mut entry) {
                continue;
            }
            let (word, data) = entry.words();
            let e = Entry {
                tag: entry.tag,
                eptp: word,
                data,
            };
            // An entry must sit in the set its page number selects.
            let (_, range) = self.set_range(e.tag & tag::VPN);
            if !range.contains(&index) {
                self.flush_all();
                return Err(format!("TLB entry {index} is in the wrong set"));
            }
            // Nor share its tag and EPTP with another in the set: a fill
            // never makes such a pair (it replaces), and lookups rely on it.
            if self.entries[range]
                .iter()
                .any(|o| o.tag == e.tag && o.eptp == e.eptp)
            {
                self.flush_all();
                return Err(format!("TLB entry {index} duplicates another in its set"));
            }
            self.may_hold_splinters |= e.splintered();
            self.entries[index] = e;
            self.mark_valid(index / self.ways, index % self.ways, &e);
        }
        self.recently_used.copy_from_slice(&image.recently_used);
        self.epoch += 1;
        *self.hints = [Hint::default(); HINTS];
        Ok(())
    }

    /// Where the translator's first-level fill finds this TLB's parts.
    pub(crate) fn jit_pointers(&mut self) -> jit_view::Pointers {
        jit_view::Pointers {
            hints: self.hints.as_ptr() as u64,
            entries: self.entries.as_ptr() as u64,
            recently_used: self.recently_used.as_mut_ptr() as u64,
            hits: std::ptr::addr_of_mut!(self.stats.hits) as u64,
            ways: self.ways as u64,
            full_set_mask: self.full_set_mask,
            epoch: std::ptr::addr_of!(self.epoch) as u64,
        }
    }

    /// A number that changes whenever any entry changes (fill, eviction,
    /// invalidation). Caches derived from this TLB, such as the CPU's
    /// first-level TLB, stay valid exactly while it does not change.
    #[inline]
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// How many times valid entries have left the TLB, and which page
    /// left last (see [`Removals`]): what the first-level TLB in front
    /// follows.
    #[inline(always)]
    pub(crate) fn removals(&self) -> Removals {
        self.removals
    }

    /// Counters.
    pub fn stats(&self) -> TlbStats {
        self.stats
    }

    /// The paging-structure caches' sizes and counters.
    pub fn psc(&self) -> &Psc {
        &self.psc
    }
}

#[cfg(test)]
mod image_tests {
    use super::*;

    fn entry(index: u32, vpn: u64) -> TlbImageEntry {
        TlbImageEntry {
            index,
            tag: tag::VALID | vpn,
            eptp: 0,
            data: 0x5000 | data::EPT_READ,
        }
    }

    #[test]
    fn an_image_loads_where_it_was_and_checks_its_places() {
        let config = TlbConfig {
            entries: 64,
            ways: 4,
        };
        let mut tlb = Tlb::new(config);
        let sets = tlb.recently_used.len();
        // Page 5 belongs to set 5: ways 20..24.
        let image = TlbImage {
            entries: vec![entry(21, 5)],
            recently_used: vec![0b10; sets],
        };
        let epoch = tlb.epoch();
        tlb.load_image(&image, |e| {
            e.set_hpa(Hpa(0x9000));
            true
        })
        .expect("fits");
        assert_ne!(tlb.epoch(), epoch, "the hints must be invalidated");
        let again = tlb.image();
        assert_eq!(again.entries.len(), 1);
        assert_eq!(again.entries[0].index, 21);
        assert_eq!(again.entries[0].hpa(), Hpa(0x9000));
        assert_eq!(again.recently_used, image.recently_used);
        // Refused by the caller: left out.
        tlb.load_image(&image, |_| false).expect("fits");
        assert_eq!(tlb.occupancy(), 0);
        // The wrong set, a place past the TLB, one page twice in its set,
        // the wrong geometry, ways that do not exist: errors, and the TLB
        // is left empty.
        for bad in [
            TlbImage {
                entries: vec![entry(21, 5), entry(22, 5)],
                ..image.clone()
            },
            TlbImage {
                entries: vec![entry(0, 5)],
                ..image.clone()
            },
            TlbImage {
                entries: vec![entry(21, 5), entry(64, 5)],
                ..image.clone()
            },
            TlbImage {
                entries: vec![],
                recently_used: vec![0; sets + 1],
            },
            TlbImage {
                entries: vec![],
                recently_used: vec![1 << 4; sets],
            },
        ] {
            assert!(tlb.load_image(&bad, |_| true).is_err(), "{bad:?}");
            assert_eq!(tlb.occupancy(), 0);
        }
    }
}

#[cfg(test)]
mod permit_tests {
    use super::*;
    use crate::cpu::state::cr4;
    use crate::mmu::PagingRegs;

    /// The mask form of the access rights decides exactly as
    /// `access_permitted` plus the EPT rights and dirty flags, over every
    /// combination of entry bits, access and paging register that matters.
    #[test]
    fn permit_masks_decide_as_access_permitted() {
        let kinds = [AccessKind::Read, AccessKind::Write, AccessKind::Execute];
        for bits in 0..256u64 {
            let perms = GuestPerms {
                writable: bits & data::GUEST_WRITABLE != 0,
                user: bits & data::GUEST_USER != 0,
                no_execute: bits & data::GUEST_NX != 0,
            };
            for kind in kinds {
                for user in [false, true] {
                    for regs_bits in 0..32u32 {
                        let regs = PagingRegs {
                            cr0: if regs_bits & 1 != 0 { cr0::PG } else { 0 }
                                | if regs_bits & 2 != 0 { cr0::WP } else { 0 },
                            cr3: 0,
                            cr4: if regs_bits & 4 != 0 { cr4::SMAP } else { 0 }
                                | if regs_bits & 8 != 0 { cr4::SMEP } else { 0 },
                            efer: 0,
                            rflags_ac: regs_bits & 16 != 0,
                        };
                        let paging = regs.cr0 & cr0::PG != 0;
                        let access = Access { kind, user };
                        let ept_needed = match kind {
                            AccessKind::Read => data::EPT_READ,
                            AccessKind::Write => {
                                data::EPT_WRITE | data::GUEST_DIRTY | data::EPT_DIRTY
                            }
                            AccessKind::Execute => data::EPT_EXEC,
                        };
                        let expected = (!paging || access_permitted(perms, access, &regs))
                            && bits & ept_needed == ept_needed;
                        let key = LookupKey::new(0, &regs, None, access);
                        assert_eq!(
                            key.permits(bits),
                            expected,
                            "data {bits:#x} {access:?} regs {regs:?}"
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod fingerprint_tests {
    use super::*;

    /// `zero_byte_bits` marks exactly the zero bytes, and a set's
    /// fingerprint search finds every way of the tag, whatever the other
    /// ways hold.
    #[test]
    fn fingerprint_search_finds_exactly_the_matching_bytes() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..100_000 {
            // Bytes mostly 0, 0x80, 0x01 or 0xff: the carry-prone ones.
            let r = next();
            let x = (0..8).fold(0u64, |x, i| {
                let byte = match (r >> (i * 3)) & 7 {
                    0..=2 => 0,
                    3 => 0x80,
                    4 => 0x01,
                    5 => 0xff,
                    _ => (r >> (24 + i * 5)) & 0xff,
                };
                x | byte << (i * 8)
            });
            let naive = (0..8).fold(0, |b, i| b | u64::from((x >> (i * 8)) & 0xff == 0) << i);
            assert_eq!(zero_byte_bits(x), naive, "{x:#018x}");
        }
        let mut tlb = Tlb::new(TlbConfig {
            entries: 16,
            ways: 8,
        });
        for _ in 0..1000 {
            let tags: Vec<u64> = (0..8).map(|_| next() % 5).collect();
            tlb.sets[1].fingerprints = 0;
            for (w, &t) in tags.iter().enumerate() {
                tlb.sets[1].fingerprints |= u64::from(fingerprint(t)) << (w * 8);
            }
            for t in 0..5 {
                let expected = tags
                    .iter()
                    .enumerate()
                    .fold(0u64, |b, (w, &u)| b | u64::from(u == t) << w);
                assert_eq!(tlb.candidate_ways(1, 0xff, t), expected, "{tags:?} {t}");
            }
        }
    }
}
