use super::*;
use crate::cost::HvCosts;
use crate::frames::FrameAllocator;
use crate::memslot::SlotFlags;
use crate::mmu::root::RootId;
use crate::mmu::{spte, Mmu};
use crate::swap::DevicePreset;
use machine::{Gfn, PhysMemory};

struct Fixture {
    host: Host,
    pager: Pager,
}

const MS: Cycles = Cycles(machine::cost::CYCLES_PER_SECOND / 1000);
const ROOT: RootId = RootId(0);

fn ms(n: u64) -> Cycles {
    Cycles(MS.0 * n)
}

/// 64 guest pages on a pool of `limit` pages.
fn fixture(limit: u64) -> Fixture {
    fixture_with(limit, crate::mmu::fast_pf::MmuOptions::default())
}

/// [`fixture`] with the MMU's switches as `options` say.
fn fixture_with(limit: u64, options: crate::mmu::fast_pf::MmuOptions) -> Fixture {
    let mem = PhysMemory::new(512 * PAGE_SIZE).unwrap();
    let mut frames = FrameAllocator::new(Hfn(1), Hfn(512));
    let mmu = Mmu::with_options(&mem, &mut frames, crate::mmu::MmuMode::Ept, options).unwrap();
    let mut slots = Memslots::default();
    slots
        .add(SlotId(0), Gfn(0), 64, SlotFlags::default())
        .unwrap();
    let model = DevicePreset::Ssd.model();
    Fixture {
        host: Host {
            mem,
            frames,
            slots,
            mmu,
            costs: HvCosts::DEFAULT,
            dirty_rings: crate::mmu::dirty_log::DirtyRings::new(1, 0),
            order_bound: None,
        },
        pager: Pager::new(limit, None, model, 1),
    }
}

impl Fixture {
    /// Maps resident gfn (as the fault path does).
    fn map(&mut self, gfn: u64, frame: Hfn) {
        let h = &mut self.host;
        let mapped = h.mmu.map_gfn(
            &h.mem,
            &mut h.frames,
            &h.costs,
            ROOT,
            Gfn(gfn),
            frame,
            crate::mmu::fault::LeafWrite::Writable,
            false,
            false,
            Cycles::ZERO,
        );
        mapped.result.unwrap();
    }

    /// Makes gfn resident with `fill` in every byte, mapped by an spte,
    /// and checks the MMU's invariants.
    fn touch(&mut self, gfn: u64, fill: u8, now: Cycles) -> Work {
        let page = PageRef {
            slot: SlotId(0),
            index: gfn,
        };
        let (frame, work) = self.pager.alloc_frame(&mut self.host, now).unwrap();
        self.host
            .mem
            .write_bytes(frame.addr(), &[fill; PAGE_SIZE as usize])
            .unwrap();
        self.host
            .slots
            .get_mut(SlotId(0))
            .unwrap()
            .set_backing(Gfn(gfn), frame);
        self.pager.note_resident(page, frame, now);
        self.map(gfn, frame);
        let h = &self.host;
        h.mmu.check(&h.mem, &h.slots, &h.costs).unwrap();
        work
    }

    /// Sets the accessed (and dirty) bits of gfn's spte, as a guest
    /// access through EPT would.
    fn access(&self, gfn: u64, write: bool) {
        let bits = spte::ACCESSED | if write { spte::DIRTY } else { 0 };
        let h = &self.host;
        h.mmu.set_leaf_bits_for_test(&h.mem, Gfn(gfn), bits);
    }

    fn spte(&self, gfn: u64) -> Option<u64> {
        let h = &self.host;
        h.mmu.leaf_spte(&h.mem, &h.costs, Gfn(gfn))
    }

    fn state(&self, gfn: u64) -> PageState {
        self.host.slots.get(SlotId(0)).unwrap().state(Gfn(gfn))
    }

    /// After one eviction batch over gfns 0..24 of which 0..8 were
    /// used: those stay resident and exactly a batch of the idle ones
    /// went to swap.
    fn assert_used_stay_and_idle_go(&self, case: &str) {
        for g in 0..8 {
            assert!(
                matches!(self.state(g), PageState::Resident(_)),
                "{case}: gfn {g} in use"
            );
        }
        let swapped = (8..EVICT_BATCH as u64 + 8)
            .filter(|&g| matches!(self.state(g), PageState::Swapped(_)))
            .count();
        assert_eq!(swapped, EVICT_BATCH, "{case}");
    }
}

/// A page source that fills page `i` with byte `i` and says it
/// arrives at `at`; fails for pages at or above `missing_from`.
#[derive(Debug)]
struct FakeSource {
    at: Cycles,
    missing_from: u64,
    asked: std::rc::Rc<std::cell::Cell<u32>>,
}

impl PageSource for FakeSource {
    fn fetch(
        &mut self,
        index: u64,
        _now: Cycles,
        data: &mut [u8; PAGE_SIZE as usize],
    ) -> Result<Cycles, String> {
        self.asked.set(self.asked.get() + 1);
        if index >= self.missing_from {
            return Err("gone".into());
        }
        data.fill(index as u8);
        Ok(self.at)
    }
}

#[test]
fn a_remote_page_comes_from_the_page_source_through_the_swap_in_path() {
    let mut f = fixture(EVICT_BATCH as u64);
    let asked = std::rc::Rc::new(std::cell::Cell::new(0));
    f.pager.set_page_source(Some(Box::new(FakeSource {
        at: ms(5),
        missing_from: 10,
        asked: asked.clone(),
    })));
    for g in [3, 12] {
        let page = PageRef {
            slot: SlotId(0),
            index: g,
        };
        f.pager.place_remote(&mut f.host.slots, page).unwrap();
    }
    assert_eq!(f.pager.remote_pages(), 2);
    let PageState::Swapped(slot) = f.state(3) else {
        panic!("a remote page looks swapped out: {:?}", f.state(3));
    };
    let page = PageRef {
        slot: SlotId(0),
        index: 3,
    };
    // Touched before its arrival: in flight until then, from the
    // source, not the swap device.
    let (read, _) = f
        .pager
        .start_page_in(&mut f.host, page, slot, ms(1))
        .unwrap();
    assert_eq!(read.ready_at, ms(5));
    assert_eq!(f.pager.stats().swap_ins, 0, "no device read");
    assert_eq!(f.pager.remote_pages(), 1);
    let (_, frame) = f.pager.finish_page_in(&mut f.host.slots, slot).unwrap();
    let mut buf = [0u8; PAGE_SIZE as usize];
    f.host.mem.read_bytes(frame.addr(), &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 3), "the source's bytes");
    // Evicted clean and read again: an ordinary swap-in of the copy
    // kept in its slot; the source is not asked again.
    f.map(3, frame);
    for g in 20..40 {
        f.touch(g, 9, ms(60));
    }
    let PageState::Swapped(again) = f.state(3) else {
        panic!("gfn 3 evicted: {:?}", f.state(3));
    };
    assert_eq!(again, slot, "the same slot, dropped clean");
    let (frame, _, _) = f
        .pager
        .swap_in_now(&mut f.host, page, again, ms(70))
        .unwrap();
    f.host.mem.read_bytes(frame.addr(), &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 3), "the copy kept in the slot");
    assert_eq!(f.pager.stats().swap_ins, 1, "a device read this time");
    assert_eq!(asked.get(), 1);
    // A page the source cannot give is an error, and stays remote.
    let PageState::Swapped(slot12) = f.state(12) else {
        panic!("remote: {:?}", f.state(12));
    };
    let page12 = PageRef {
        slot: SlotId(0),
        index: 12,
    };
    let before = f.pager.resident();
    let err = f
        .pager
        .start_page_in(&mut f.host, page12, slot12, ms(80))
        .unwrap_err();
    assert!(matches!(err, PagerError::Remote { index: 12, .. }), "{err}");
    assert_eq!(f.pager.resident(), before, "the frame went back");
    assert_eq!(f.pager.remote_pages(), 1);
}

#[test]
fn a_full_pool_evicts_idle_pages_and_keeps_used_ones() {
    let mut f = fixture(EVICT_BATCH as u64 + 8);
    for g in 0..EVICT_BATCH as u64 + 8 {
        f.touch(g, g as u8 + 1, Cycles::ZERO);
    }
    // Pages 0..8 are in use; the rest idle since time 0.
    for g in 0..8 {
        f.access(g, false);
    }
    let now = ms(20);
    let work = f.touch(40, 0xee, now);
    assert!(work.flush, "zapped sptes need an INVEPT");
    f.assert_used_stay_and_idle_go("A/D");
    assert_eq!(
        f.pager.stats().swap_outs,
        EVICT_BATCH as u64,
        "never on swap: written"
    );
    assert_eq!(f.pager.resident(), 9);
    // The zapped sptes are gone.
    assert_eq!(f.spte(8), Some(0));
    assert!(f.spte(0).is_some_and(spte::is_present));
}

#[test]
fn pages_come_back_from_swap_intact_and_clean_ones_are_dropped_not_rewritten() {
    let mut f = fixture(EVICT_BATCH as u64);
    for g in 0..EVICT_BATCH as u64 {
        f.touch(g, 0x40 + g as u8, Cycles::ZERO);
    }
    f.touch(50, 1, ms(20)); // evicts all 16
    let PageState::Swapped(slot) = f.state(3) else {
        panic!("gfn 3 evicted: {:?}", f.state(3));
    };
    let page = PageRef {
        slot: SlotId(0),
        index: 3,
    };
    let (read, _) = f
        .pager
        .start_page_in(&mut f.host, page, slot, ms(30))
        .unwrap();
    let model = DevicePreset::Ssd.model();
    assert!(read.ready_at >= ms(30) + Cycles(model.read_latency.min));
    assert_eq!(
        f.state(3),
        PageState::Swapped(slot),
        "not resident before completion"
    );
    let (gfn, frame) = f.pager.finish_page_in(&mut f.host.slots, slot).unwrap();
    assert_eq!(gfn, Gfn(3));
    let mut buf = [0u8; PAGE_SIZE as usize];
    f.host.mem.read_bytes(frame.addr(), &mut buf).unwrap();
    assert!(
        buf.iter().all(|&b| b == 0x43),
        "contents survived the round trip"
    );
    assert_eq!(
        f.host.slots.get(SlotId(0)).unwrap().swap_slot_at(3),
        Some(slot),
        "clean copy kept"
    );
    f.map(3, frame);
    // Evict it again without a write: dropped, not written.
    let before = f.pager.stats();
    for g in 20..40 {
        f.touch(g, 9, ms(60));
    }
    let after = f.pager.stats();
    assert!(
        matches!(f.state(3), PageState::Swapped(s) if s == slot),
        "same slot"
    );
    assert_eq!(
        after.clean_drops - before.clean_drops,
        1,
        "only gfn 3 had a clean copy"
    );
    assert_eq!(
        after.swap_outs - before.swap_outs,
        after.evictions - before.evictions - 1,
        "every other victim was written"
    );
}

#[test]
fn a_written_page_is_written_back_again() {
    let mut f = fixture(EVICT_BATCH as u64);
    for g in 0..EVICT_BATCH as u64 {
        f.touch(g, 7, Cycles::ZERO);
    }
    f.touch(50, 1, ms(20));
    let PageState::Swapped(slot) = f.state(0) else {
        panic!()
    };
    let page = PageRef {
        slot: SlotId(0),
        index: 0,
    };
    f.pager
        .start_page_in(&mut f.host, page, slot, ms(30))
        .unwrap();
    let (_, frame) = f.pager.finish_page_in(&mut f.host.slots, slot).unwrap();
    f.map(0, frame);
    f.access(0, true); // the guest writes it
    let drops = f.pager.stats().clean_drops;
    for g in 20..37 {
        f.touch(g, 9, ms(80) + Cycles(g));
    }
    assert!(matches!(f.state(0), PageState::Swapped(_)));
    assert_eq!(f.pager.stats().clean_drops, drops, "dirty: not dropped");
}

/// With EPT A/D flags off the pager ages by access tracking, and a
/// tracked page the guest touches again comes back through the fast
/// page fault (a cmpxchg, no lock) or, with it off, the slow path.
/// Either way the next aging must see the page used: WSClock keeps the
/// pages the guest used and evicts the idle ones, as with A/D flags.
#[test]
fn access_tracked_pages_restored_by_either_path_count_as_used() {
    use crate::mmu::fast_pf::protocol::{Access, FastFix};
    use crate::mmu::lock::Timed;
    for fast_pf in [true, false] {
        let options = crate::mmu::fast_pf::MmuOptions {
            fast_pf,
            ept_ad: false,
            seed_indirect: false,
        };
        let mut f = fixture_with(EVICT_BATCH as u64 + 8, options);
        for g in 0..EVICT_BATCH as u64 + 8 {
            f.touch(g, g as u8 + 1, Cycles::ZERO);
        }
        // An aging pass access-tracks every leaf (each was live: used).
        let h = &f.host;
        for g in 0..EVICT_BATCH as u64 + 8 {
            let PageState::Resident(frame) = f.state(g) else {
                panic!("gfn {g} resident");
            };
            let (young, _) = h
                .mmu
                .test_and_clear_young(&h.mem, &h.costs, frame, Timed::Untimed)
                .unwrap();
            assert!(young, "a new leaf counts as used");
        }
        // The guest reads pages 0..8 again; each faults on its
        // tracked leaf and is restored.
        let h = &mut f.host;
        let (root, _) = h
            .mmu
            .load_root(&h.mem, &mut h.frames, &h.costs, None, Timed::Untimed)
            .unwrap();
        let pml4 = root.eptp.pml4();
        for g in 0..8 {
            let read = Access::default();
            let h = &f.host;
            let fast = h
                .mmu
                .fast_page_fault_ept(&h.mem, &h.costs, pml4, Gfn(g), read, false);
            match fast {
                Some(fast) => assert!(
                    matches!(fast.outcome, FastFix::Fixed { .. }),
                    "gfn {g}: {fast:?}"
                ),
                None => {
                    assert!(!fast_pf, "the fast path tries every fault with A/D off");
                    let PageState::Resident(frame) = f.state(g) else {
                        panic!()
                    };
                    f.map(g, frame);
                }
            }
            assert!(
                f.spte(g).is_some_and(|s| s & spte::READ != 0),
                "gfn {g} restored"
            );
        }
        // A page needs a frame 20 ms later: the 16 idle pages go, the
        // used ones stay.
        f.touch(40, 0xee, ms(20));
        f.assert_used_stay_and_idle_go(&format!("tracked, fast PF {fast_pf}"));
    }
}
