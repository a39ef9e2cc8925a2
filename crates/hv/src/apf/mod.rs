//! Asynchronous page faults: the configuration, the per-vCPU host state
//! (outstanding faults, tokens, the gfn hash, counters) and the protocols'
//! register rules. What a vCPU does with them is the vCPU's
//! (`vcpu/async_pf/`): the policy (when a vCPU stalls, halts or tells the
//! guest, consuming the fault path's `WaitForPage` outcome, and what
//! happens when a page arrives), KVM's x86 protocol (MSRs, #PF with the
//! token in CR2, page-ready as an interrupt) and the event protocol
//! (hypercalls, both notifications as interrupts); the VM saves and
//! restores the guest-visible state (`vm/apf_state.rs`).
//!
//! The shared areas are read and written at the offsets of the `abi`
//! crate's structures ([`abi::KvmApfData`], [`abi::ApfEventArea`]).
//!
//! KVM's host rules:
//! - at most [`abi::APF_MAX_OUTSTANDING`] (64) outstanding per vCPU;
//! - a per-vCPU hash of the gfns with an outstanding fault ([`GfnHash`]),
//!   so a second fault on one of them halts instead of notifying twice;
//! - token = `(id++ << 12) | vcpu_id`, never 0;
//! - page-ready notifications wait until the guest frees the token slot;
//! - cancel everything when the guest disables delivery; wake every waiter
//!   ([`abi::APF_WAKE_ALL`]) when it enables it or when state is restored.

use crate::time::Cycles;
use machine::{Gfn, Gpa};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::mem::{align_of, offset_of};

/// Where in the shared area the page-not-present token (event protocol)
/// or reason flags (x86) go: the first u32 of both structures.
const NOT_PRESENT_OFFSET: u64 = {
    assert!(offset_of!(abi::KvmApfData, flags) == offset_of!(abi::ApfEventArea, notpresent_token));
    offset_of!(abi::KvmApfData, flags) as u64
};

/// Where the page-ready token goes: the second u32 of both structures.
const READY_OFFSET: u64 = {
    assert!(offset_of!(abi::KvmApfData, token) == offset_of!(abi::ApfEventArea, ready_token));
    offset_of!(abi::KvmApfData, token) as u64
};

/// Both areas are 64-byte aligned; the low bits of the MSR carry flags.
pub(crate) const AREA_ALIGN: u64 = {
    assert!(align_of::<abi::KvmApfData>() == align_of::<abi::ApfEventArea>());
    align_of::<abi::KvmApfData>() as u64
};

/// The APF configuration of a VM (`--apf`, `--apf-protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ApfConfig {
    pub mode: ApfMode,
    pub protocol: ApfProtocol,
}

impl ApfConfig {
    /// CPUID 0x40000001 EAX.
    pub fn kvm_features(self) -> u32 {
        let mut features = abi::KVM_FEATURE_PV_UNHALT;
        if self.x86_offered() {
            features |= abi::KVM_FEATURE_ASYNC_PF | abi::KVM_FEATURE_ASYNC_PF_INT;
        }
        features
    }

    /// Whether the x86 APF MSRs exist (advertised in CPUID).
    pub fn x86_offered(self) -> bool {
        self.mode == ApfMode::Pv && self.protocol == ApfProtocol::X86
    }

    /// Whether the event protocol's hypercalls answer.
    pub fn event_offered(self) -> bool {
        self.mode == ApfMode::Pv && self.protocol == ApfProtocol::Event
    }

    /// `"pv with protocol x86"`, for errors.
    pub fn describe(self) -> String {
        format!(
            "{} with protocol {}",
            self.mode.name(),
            self.protocol.name()
        )
    }
}

/// How a vCPU waits for a page that is on swap (`--apf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApfMode {
    /// Stall until the page is in; no interrupts meanwhile (the seed's
    /// "master").
    #[default]
    Off,
    /// Halt in the hv; interrupts still come (the seed's "nonpv").
    Halt,
    /// Tell a PV guest: page not present, later page ready.
    Pv,
}

impl ApfMode {
    pub fn name(self) -> &'static str {
        match self {
            ApfMode::Off => "off",
            ApfMode::Halt => "halt",
            ApfMode::Pv => "pv",
        }
    }
}

/// Which paravirtual protocol `ApfMode::Pv` speaks (`--apf-protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApfProtocol {
    /// KVM's x86 ABI: CPUID bits, MSRs, #PF with the token in CR2.
    #[default]
    X86,
    /// The seed-002 design: hypercalls, both notifications as interrupts.
    Event,
}

impl ApfProtocol {
    pub fn name(self) -> &'static str {
        match self {
            ApfProtocol::X86 => "x86",
            ApfProtocol::Event => "event",
        }
    }
}

/// Low bits of a token holding the vCPU id (KVM's token layout).
const TOKEN_VCPU_BITS: u32 = 12;

/// Slots of the gfn hash (KVM's ASYNC_PF_PER_VCPU).
const HASH_SLOTS: usize = abi::APF_MAX_OUTSTANDING as usize;
const EMPTY: u64 = u64::MAX;

/// The gfns with an outstanding async fault: open addressing with linear
/// probing over 64 slots (never more than 64 entries), deletion by
/// backward shift so lookups stay correct without tombstones.
#[derive(Debug, Clone)]
pub(crate) struct GfnHash {
    slots: [u64; HASH_SLOTS],
}

impl Default for GfnHash {
    fn default() -> Self {
        GfnHash {
            slots: [EMPTY; HASH_SLOTS],
        }
    }
}

impl GfnHash {
    fn home(gfn: u64) -> usize {
        // Multiplicative hashing of the low 32 bits (as Linux's hash_32).
        ((gfn as u32).wrapping_mul(0x61C8_8647) >> (32 - HASH_SLOTS.trailing_zeros())) as usize
    }

    fn next(i: usize) -> usize {
        (i + 1) % HASH_SLOTS
    }

    /// The slot holding `gfn`, or the empty slot ending its probe.
    fn probe(&self, gfn: u64) -> usize {
        let mut i = Self::home(gfn);
        for _ in 0..HASH_SLOTS {
            if self.slots[i] == gfn || self.slots[i] == EMPTY {
                break;
            }
            i = Self::next(i);
        }
        i
    }

    /// Adds `gfn`. The caller keeps at most 64 entries.
    pub fn add(&mut self, gfn: Gfn) {
        let mut i = Self::home(gfn.0);
        for _ in 0..HASH_SLOTS {
            if self.slots[i] == EMPTY {
                self.slots[i] = gfn.0;
                return;
            }
            i = Self::next(i);
        }
        debug_assert!(false, "gfn hash full");
    }

    /// Whether `gfn` is present.
    pub fn contains(&self, gfn: Gfn) -> bool {
        self.slots[self.probe(gfn.0)] == gfn.0
    }

    /// Removes `gfn` (if present), shifting later entries of its probe run
    /// back so none becomes unreachable.
    pub fn remove(&mut self, gfn: Gfn) {
        let mut hole = self.probe(gfn.0);
        if self.slots[hole] != gfn.0 {
            return;
        }
        self.slots[hole] = EMPTY;
        let mut j = hole;
        loop {
            j = Self::next(j);
            if self.slots[j] == EMPTY {
                return;
            }
            let home = Self::home(self.slots[j]);
            // The entry at j may move to the hole only if its home is not
            // cyclically within (hole, j].
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.slots[hole] = self.slots[j];
                self.slots[j] = EMPTY;
                hole = j;
            }
        }
    }

    /// Empties the hash.
    pub fn clear(&mut self) {
        self.slots = [EMPTY; HASH_SLOTS];
    }

    /// Entries.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|&&s| s != EMPTY).count()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One outstanding async fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ApfWork {
    pub token: u32,
    /// The gfn the guest touched, in memslot generation `generation`.
    pub gfn: Gfn,
    /// The same page by memslot and index, which a memslot move keeps.
    pub page: crate::pager::PageRef,
    /// The memslot generation `gfn` was seen in.
    pub generation: u64,
    /// The swap slot being read (keys the pager's in-flight read).
    pub swap_slot: crate::swap::SwapSlot,
    pub ready_at: Cycles,
    /// Page-not-present was delivered, so page-ready must be too.
    pub notified: bool,
    /// Under shadow paging: the faulting access, for the page-ready
    /// prefault.
    pub shadow: Option<ShadowPrefault>,
}

pub(crate) use crate::mmu::shadow::cache::ShadowPrefault;

/// Bits of `MSR_KVM_ASYNC_PF_EN` KVM refuses with #GP.
pub(crate) const EN_REFUSED: u64 =
    abi::KVM_ASYNC_PF_RESERVED | abi::KVM_ASYNC_PF_DELIVERY_AS_PF_VMEXIT;

/// Whether `MSR_KVM_ASYNC_PF_INT` accepts `value` (bits 63:8 reserved).
pub(crate) fn int_msr_valid(value: u64) -> bool {
    value >> 8 == 0
}

/// The area `MSR_KVM_ASYNC_PF_EN` points at.
pub(crate) fn en_area(value: u64) -> Gpa {
    Gpa(value & !(AREA_ALIGN - 1))
}

/// The event protocol's per-vCPU configuration (from `HC_APF_ENABLE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventConfig {
    pub area: u64,
    pub notpresent_vector: u8,
    pub ready_vector: u8,
    pub send_always: bool,
}

/// Guest-visible APF state of one vCPU: what a VMM saves and restores
/// (for migration). Outstanding faults are host I/O and do not move;
/// restoring wakes every guest waiter instead, as KVM does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ApfState {
    /// `MSR_KVM_ASYNC_PF_EN` (x86 protocol).
    pub msr_en: u64,
    /// `MSR_KVM_ASYNC_PF_INT` (x86 protocol).
    pub msr_int: u64,
    /// The event protocol's configuration, when enabled.
    pub event: Option<EventConfig>,
    /// The next token id.
    pub next_id: u32,
}

/// APF counters of one vCPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApfStats {
    /// Page-not-present notifications delivered.
    pub not_present: u64,
    /// Page-ready notifications delivered (wake-alls included).
    pub ready: u64,
    /// Wake-all notifications delivered.
    pub wake_all: u64,
    /// Times the vCPU halted in the hv waiting for a page.
    pub halts: u64,
    /// Virtual cycles halted waiting for a page.
    pub halt_cycles: u64,
    /// Times the vCPU stalled (no interrupts) waiting for a page.
    pub stalls: u64,
    /// Virtual cycles stalled.
    pub stall_cycles: u64,
    /// Most async faults outstanding at once.
    pub peak_outstanding: u64,
    /// Faults on pages already on their way in.
    pub repeat_faults: u64,
    /// Page-ready acknowledgements from the guest (`MSR_KVM_ASYNC_PF_ACK`
    /// with bit 0, or `HC_APF_ACK`): the guest's own count of the
    /// page-ready notifications it handled.
    #[serde(default)]
    pub acks: u64,
}

/// The host APF state of one vCPU.
#[derive(Debug, Clone, Default)]
pub(crate) struct ApfVcpu {
    pub state: ApfState,
    /// Outstanding faults, oldest first.
    pub works: Vec<ApfWork>,
    /// Tokens whose page-ready notification waits for a free slot.
    pub ready_queue: VecDeque<u32>,
    pub gfns: GfnHash,
    pub stats: ApfStats,
}

impl ApfWork {
    /// Where the page is now: `gfn` while the memslots are as they were
    /// when the fault was taken; after a change (the memslot generation
    /// moved), found again from the page's memslot and index (`None` if
    /// the memslot is gone).
    pub fn current_gfn(&self, slots: &crate::memslot::Memslots) -> Option<Gfn> {
        if slots.generation() == self.generation {
            return Some(self.gfn);
        }
        let slot = slots.get(self.page.slot)?;
        (self.page.index < slot.npages).then(|| slot.gfn_at(self.page.index))
    }
}

impl ApfVcpu {
    /// Delivery enabled by the guest under `protocol`.
    pub fn enabled(&self, protocol: ApfProtocol) -> bool {
        match protocol {
            ApfProtocol::X86 => {
                let both = abi::KVM_ASYNC_PF_ENABLED | abi::KVM_ASYNC_PF_DELIVERY_AS_INT;
                self.state.msr_en & both == both
            }
            ApfProtocol::Event => self.state.event.is_some(),
        }
    }

    /// The shared area.
    pub fn area(&self, protocol: ApfProtocol) -> Gpa {
        match protocol {
            ApfProtocol::X86 => Gpa(self.state.msr_en & !(AREA_ALIGN - 1)),
            ApfProtocol::Event => Gpa(self.state.event.map_or(0, |e| e.area)),
        }
    }

    /// The not-present slot of the shared area.
    pub fn not_present_slot(&self, protocol: ApfProtocol) -> Gpa {
        self.area(protocol).add(NOT_PRESENT_OFFSET)
    }

    /// The page-ready slot of the shared area.
    pub fn ready_slot(&self, protocol: ApfProtocol) -> Gpa {
        self.area(protocol).add(READY_OFFSET)
    }

    /// Whether page-not-present may be sent at CPL 0.
    pub fn send_always(&self, protocol: ApfProtocol) -> bool {
        match protocol {
            ApfProtocol::X86 => self.state.msr_en & abi::KVM_ASYNC_PF_SEND_ALWAYS != 0,
            ApfProtocol::Event => self.state.event.is_some_and(|e| e.send_always),
        }
    }

    /// The page-ready vector.
    pub fn ready_vector(&self, protocol: ApfProtocol) -> u8 {
        match protocol {
            ApfProtocol::X86 => self.state.msr_int as u8,
            ApfProtocol::Event => self.state.event.map_or(0, |e| e.ready_vector),
        }
    }

    /// A fresh token for vCPU `vcpu_id`: `(id++ << 12) | vcpu_id`, never 0.
    pub fn new_token(&mut self, vcpu_id: u32) -> u32 {
        loop {
            let token =
                (self.state.next_id << TOKEN_VCPU_BITS) | (vcpu_id & ((1 << TOKEN_VCPU_BITS) - 1));
            self.state.next_id = self.state.next_id.wrapping_add(1);
            if token != 0 && token != abi::APF_WAKE_ALL {
                return token;
            }
        }
    }

    /// Earliest completion among outstanding faults.
    pub fn next_ready_at(&self) -> Option<Cycles> {
        self.works.iter().map(|w| w.ready_at).min()
    }

    /// Cancels everything outstanding (the guest disabled delivery). The
    /// reads themselves go on; the pages just arrive unannounced.
    pub fn cancel_all(&mut self) {
        self.works.clear();
        self.ready_queue.clear();
        self.gfns.clear();
    }

    /// Queues a wake-all (after enabling or restoring).
    pub fn queue_wake_all(&mut self) {
        self.ready_queue.push_back(abi::APF_WAKE_ALL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gfn_hash_survives_collisions_and_deletions() {
        let mut hash = GfnHash::default();
        // Many gfns, several sharing home slots.
        let gfns: Vec<Gfn> = (0..64).map(|i| Gfn(i * 64 + 5)).collect();
        for &g in &gfns {
            hash.add(g);
        }
        assert_eq!(hash.len(), 64);
        for &g in &gfns {
            assert!(hash.contains(g));
        }
        assert!(!hash.contains(Gfn(3)));
        // Remove every other one: the rest must stay reachable.
        for &g in gfns.iter().step_by(2) {
            hash.remove(g);
        }
        for (i, &g) in gfns.iter().enumerate() {
            assert_eq!(hash.contains(g), i % 2 == 1, "gfn {g:?}");
        }
        hash.remove(Gfn(3)); // absent: no effect
        assert_eq!(hash.len(), 32);
        hash.clear();
        assert!(hash.is_empty());
    }

    #[test]
    fn gfn_hash_matches_a_reference_set_under_random_operations() {
        let mut hash = GfnHash::default();
        let mut reference = std::collections::BTreeSet::new();
        let mut x: u64 = 0x1234_5678;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // A small universe forces collisions and probe runs that wrap.
            let gfn = Gfn(x % 200);
            if x & 1 == 0 && reference.len() < 64 && !reference.contains(&gfn) {
                hash.add(gfn);
                reference.insert(gfn);
            } else {
                hash.remove(gfn);
                reference.remove(&gfn);
            }
            assert_eq!(hash.len(), reference.len());
        }
        for g in 0..200 {
            assert_eq!(hash.contains(Gfn(g)), reference.contains(&Gfn(g)));
        }
    }

    #[test]
    fn tokens_carry_the_vcpu_id_and_are_never_zero() {
        let mut apf = ApfVcpu::default();
        assert_eq!(apf.new_token(0), 1 << 12, "id 0 with vCPU 0 would be 0");
        assert_eq!(apf.new_token(0), 2 << 12);
        let mut other = ApfVcpu::default();
        assert_eq!(other.new_token(3), 3);
        assert_eq!(other.new_token(3), (1 << 12) | 3);
    }

    #[test]
    fn x86_enable_needs_both_bits() {
        let mut apf = ApfVcpu::default();
        apf.state.msr_en = 0x1000 | abi::KVM_ASYNC_PF_ENABLED;
        assert!(!apf.enabled(ApfProtocol::X86));
        apf.state.msr_en |= abi::KVM_ASYNC_PF_DELIVERY_AS_INT;
        assert!(apf.enabled(ApfProtocol::X86));
        assert_eq!(apf.area(ApfProtocol::X86), Gpa(0x1000));
        assert!(!apf.enabled(ApfProtocol::Event));
    }

    #[test]
    fn an_outstanding_fault_follows_its_page_when_the_memslot_moves() {
        use crate::memslot::{Memslots, SlotFlags, SlotId};
        let mut slots = Memslots::default();
        slots
            .add(SlotId(4), Gfn(0x100), 16, SlotFlags::default())
            .unwrap();
        let work = ApfWork {
            token: 1,
            gfn: Gfn(0x105),
            page: crate::pager::PageRef {
                slot: SlotId(4),
                index: 5,
            },
            generation: slots.generation(),
            swap_slot: crate::swap::SwapSlot(0),
            ready_at: Cycles::ZERO,
            notified: false,
            shadow: None,
        };
        assert_eq!(work.current_gfn(&slots), Some(Gfn(0x105)));
        slots.move_slot(SlotId(4), Gfn(0x800)).unwrap();
        assert_eq!(work.current_gfn(&slots), Some(Gfn(0x805)), "new generation");
        slots.delete(SlotId(4)).unwrap();
        assert_eq!(work.current_gfn(&slots), None);
    }
}
