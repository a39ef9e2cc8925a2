use super::*;

const ID: u32 = 0x802;
const VERSION: u32 = 0x803;
const TPR: u32 = 0x808;
const PPR: u32 = 0x80a;
const EOI: u32 = 0x80b;
const LDR: u32 = 0x80d;
const SVR: u32 = 0x80f;
const ISR0: u32 = 0x810;
const TMR0: u32 = 0x818;
const IRR0: u32 = 0x820;
const ESR: u32 = 0x828;
const LVT_CMCI: u32 = 0x82f;
const ICR: u32 = 0x830;
const LVT_TIMER: u32 = 0x832;
const LVT_THERMAL: u32 = 0x833;
const LVT_PERF: u32 = 0x834;
const LVT_LINT0: u32 = 0x835;
const LVT_LINT1: u32 = 0x836;
const LVT_ERROR: u32 = 0x837;
const INITIAL_COUNT: u32 = 0x838;
const CURRENT_COUNT: u32 = 0x839;
const DIVIDE_CONFIG: u32 = 0x83e;
const SELF_IPI: u32 = 0x83f;

const ALL_LVTS: [u32; 7] = [
    LVT_CMCI,
    LVT_TIMER,
    LVT_THERMAL,
    LVT_PERF,
    LVT_LINT0,
    LVT_LINT1,
    LVT_ERROR,
];

const ONE_SHOT: u64 = 0;
const PERIODIC: u64 = 1 << 17;
const TSC_DEADLINE: u64 = 2 << 17;
const MASKED: u64 = 1 << 16;
const DIVIDE_BY_1: u64 = 0b1011;

// ICR encodings.
const DM_FIXED: u64 = 0 << 8;
const DM_LOWEST: u64 = 1 << 8;
const DM_SMI: u64 = 2 << 8;
const DM_NMI: u64 = 4 << 8;
const DM_INIT: u64 = 5 << 8;
const DM_STARTUP: u64 = 6 << 8;
const LOGICAL: u64 = 1 << 11;
const LEVEL_ASSERT: u64 = 1 << 14;
const TRIGGER_LEVEL: u64 = 1 << 15;
const SH_SELF: u64 = 1 << 18;
const SH_ALL_INCLUDING_SELF: u64 = 2 << 18;
const SH_ALL_EXCLUDING_SELF: u64 = 3 << 18;

/// A software-enabled APIC.
fn enabled(id: u32) -> Lapic {
    let mut apic = Lapic::new(id);
    write(&mut apic, SVR, 0x1ff, 0);
    apic
}

fn write(apic: &mut Lapic, msr: u32, value: u64, now: u64) -> ApicWrite {
    apic.write_msr(msr, value, now)
        .unwrap_or_else(|gp| panic!("wrmsr {msr:#x} <- {value:#x}: {gp}"))
}

fn read(apic: &Lapic, msr: u32, now: u64) -> u64 {
    apic.read_msr(msr, now)
        .unwrap_or_else(|gp| panic!("rdmsr {msr:#x}: {gp}"))
}

/// The ESR after latching the errors detected so far.
fn latch_esr(apic: &mut Lapic, now: u64) -> u64 {
    write(apic, ESR, 0, now);
    read(apic, ESR, now)
}

fn irr_contains(apic: &Lapic, vector: u8) -> bool {
    apic.irr()[usize::from(vector / 32)] & (1 << (vector % 32)) != 0
}

/// Delivers every deliverable vector and EOIs it, returning them in order.
fn deliver_all(apic: &mut Lapic, now: u64) -> Vec<u8> {
    let mut delivered = Vec::new();
    while let Some(vector) = apic.deliverable_vector() {
        apic.start_delivery(vector);
        write(apic, EOI, 0, now);
        delivered.push(vector);
    }
    delivered
}

// --- Register access rules -------------------------------------------------

#[test]
fn reset_values_and_identity_registers() {
    let bsp = Lapic::new(0);
    assert_eq!(
        read(&bsp, MSR_APIC_BASE, 0),
        0xfee0_0000 | 1 << 11 | 1 << 10 | 1 << 8
    );
    let ap = Lapic::new(0x23);
    assert_eq!(read(&ap, MSR_APIC_BASE, 0), 0xfee0_0000 | 1 << 11 | 1 << 10);
    assert_eq!(read(&ap, ID, 0), 0x23);
    assert_eq!(ap.id(), 0x23);
    assert_eq!(read(&ap, VERSION, 0), 0x0006_0015);
    // Cluster 2, bit 3.
    assert_eq!(read(&ap, LDR, 0), 0x0002_0008);
    assert_eq!(read(&bsp, LDR, 0), 0x0000_0001);
    assert_eq!(read(&ap, SVR, 0), 0xff);
    assert!(!ap.software_enabled());
    for lvt in ALL_LVTS {
        assert_eq!(read(&ap, lvt, 0), MASKED, "LVT {lvt:#x}");
    }
    for msr in [
        TPR,
        PPR,
        ESR,
        ICR,
        INITIAL_COUNT,
        CURRENT_COUNT,
        DIVIDE_CONFIG,
    ] {
        assert_eq!(read(&ap, msr, 0), 0, "{msr:#x}");
    }
    assert_eq!(read(&ap, MSR_TSC_DEADLINE, 0), 0);
}

#[test]
fn reserved_addresses_and_foreign_msrs_fault() {
    let mut apic = enabled(1);
    for msr in [
        0x800, 0x801, 0x804, 0x809, 0x80c, 0x80e, 0x829, 0x82e, 0x831, 0x83a, 0x83d, 0x840, 0x8ff,
        0x10, 0x1a, 0x6e1,
    ] {
        assert_eq!(apic.read_msr(msr, 0), Err(ApicGp { msr }), "rdmsr {msr:#x}");
        assert_eq!(
            apic.write_msr(msr, 0, 0),
            Err(ApicGp { msr }),
            "wrmsr {msr:#x}"
        );
    }
}

#[test]
fn write_only_registers_fault_on_read() {
    let apic = enabled(1);
    assert_eq!(apic.read_msr(EOI, 0), Err(ApicGp { msr: EOI }));
    assert_eq!(apic.read_msr(SELF_IPI, 0), Err(ApicGp { msr: SELF_IPI }));
}

#[test]
fn read_only_registers_fault_on_write() {
    let mut apic = enabled(1);
    let read_only = [ID, VERSION, PPR, LDR, CURRENT_COUNT]
        .into_iter()
        .chain(ISR0..ISR0 + 8)
        .chain(TMR0..TMR0 + 8)
        .chain(IRR0..IRR0 + 8);
    for msr in read_only {
        let before = apic.clone();
        assert_eq!(apic.write_msr(msr, 0, 0), Err(ApicGp { msr }), "{msr:#x}");
        assert_eq!(apic, before, "a faulting write to {msr:#x} changed state");
    }
}

#[test]
fn reserved_bits_fault_and_leave_state_unchanged() {
    let mut apic = enabled(1);
    write(&mut apic, TPR, 0x20, 0);
    let faulting = [
        (TPR, 0x100),
        (TPR, 1 << 32),
        (SVR, 1 << 12), // EOI-broadcast suppression is not advertised
        (SVR, 1 << 10),
        (SVR, 0x1ff | 1 << 32),
        (EOI, 1),
        (EOI, 1 << 32),
        (ESR, 1),
        (LVT_TIMER, 3 << 17), // reserved timer mode
        (LVT_TIMER, 1 << 8),  // no delivery mode in the timer entry
        (LVT_TIMER, 1 << 19),
        (LVT_ERROR, 4 << 8),
        (LVT_CMCI, 1 << 11),
        (LVT_THERMAL, 1 << 13),
        (LVT_PERF, 1 << 17),
        (LVT_LINT0, 1 << 11),
        (LVT_LINT1, 1 << 17),
        (INITIAL_COUNT, 1 << 32),
        (DIVIDE_CONFIG, 0b0100),
        (DIVIDE_CONFIG, 0b1_0000),
        (SELF_IPI, 0x100),
        (ICR, 1 << 13),
        (ICR, 1 << 16),
        (ICR, 1 << 17),
        (ICR, 1 << 20),
        (ICR, 3 << 8 | 0x40), // reserved delivery mode 011b
        (ICR, 7 << 8 | 0x40), // reserved delivery mode 111b
    ];
    for (msr, value) in faulting {
        let before = apic.clone();
        assert_eq!(
            apic.write_msr(msr, value, 0),
            Err(ApicGp { msr }),
            "wrmsr {msr:#x} <- {value:#x}"
        );
        assert_eq!(apic, before, "wrmsr {msr:#x} <- {value:#x} changed state");
    }
    assert_eq!(read(&apic, TPR, 0), 0x20);
}

#[test]
fn defined_bits_are_accepted_and_read_back() {
    let mut apic = enabled(1);
    write(&mut apic, TPR, 0xff, 0);
    assert_eq!(read(&apic, TPR, 0), 0xff);
    write(&mut apic, SVR, 0x3ff, 0);
    assert_eq!(read(&apic, SVR, 0), 0x3ff);
    // Vector, delivery mode (NMI), polarity, trigger, unmasked.
    write(&mut apic, LVT_LINT1, 0x0000_a4ff, 0);
    assert_eq!(read(&apic, LVT_LINT1, 0), 0x0000_a4ff);
    write(&mut apic, LVT_CMCI, 0x0001_02ee, 0);
    assert_eq!(read(&apic, LVT_CMCI, 0), 0x0001_02ee);
    write(&mut apic, LVT_TIMER, PERIODIC | 0xec, 0);
    assert_eq!(read(&apic, LVT_TIMER, 0), PERIODIC | 0xec);
    write(&mut apic, DIVIDE_CONFIG, 0b1010, 0);
    assert_eq!(read(&apic, DIVIDE_CONFIG, 0), 0b1010);
}

#[test]
fn read_only_status_bits_ignore_writes() {
    let mut apic = enabled(1);
    // Delivery status (12) and remote IRR (14) are read-only.
    write(&mut apic, LVT_LINT0, 1 << 12 | 1 << 14 | 0x30, 0);
    assert_eq!(read(&apic, LVT_LINT0, 0), 0x30);
    write(&mut apic, LVT_ERROR, 1 << 12 | 0x31, 0);
    assert_eq!(read(&apic, LVT_ERROR, 0), 0x31);
    // The ICR delivery status always reads idle.
    let icr = 5u64 << 32 | 1 << 12 | 0x40;
    write(&mut apic, ICR, icr, 0);
    assert_eq!(read(&apic, ICR, 0), 5u64 << 32 | 0x40);
}

/// IA32_APIC_BASE's EN (bit 11) and EXTD (bit 10) as the SDM's "x2APIC
/// State Transitions" allow them (kvm-unit-tests' `apic` test and its boot
/// code, which disables the APIC and re-enables it in xAPIC mode).
#[test]
fn apic_base_follows_the_x2apic_state_transitions() {
    const EN: u64 = 1 << 11;
    const EXTD: u64 = 1 << 10;
    let mut apic = Lapic::new(0);
    let base = read(&apic, MSR_APIC_BASE, 0);
    assert_eq!(base, 0xfee0_0000 | EN | EXTD | 1 << 8);
    assert_eq!(apic.mode(), ApicMode::X2apic);
    let address = base & !(EN | EXTD);
    let gp = Err(ApicGp { msr: MSR_APIC_BASE });
    // Reserved bits, and from x2APIC: the invalid state and xAPIC mode.
    for value in [
        base | 1 << 9,
        base | 1,
        base | 1 << 46, // above MAXPHYADDR
        address | EXTD, // EN=0, EXTD=1: invalid
        address | EN,   // x2APIC -> xAPIC
    ] {
        assert_eq!(apic.write_msr(MSR_APIC_BASE, value, 0), gp, "{value:#x}");
        assert_eq!(read(&apic, MSR_APIC_BASE, 0), base);
    }
    // x2APIC -> disabled resets the registers (the id stays).
    write(&mut apic, SVR, 0x1ff, 0);
    write(&mut apic, TPR, 0x20, 0);
    write(&mut apic, MSR_APIC_BASE, address, 0);
    assert_eq!(apic.mode(), ApicMode::Disabled);
    assert_eq!(apic.tpr(), 0);
    assert!(!apic.software_enabled());
    assert_eq!(apic.id(), 0);
    // Disabled: no x2APIC MSRs, no interrupts, and no way to x2APIC or the
    // invalid state directly.
    assert_eq!(apic.read_msr(SVR, 0), Err(ApicGp { msr: SVR }));
    assert_eq!(apic.write_msr(SVR, 0x1ff, 0), Err(ApicGp { msr: SVR }));
    apic.accept_interrupt(0x40);
    assert_eq!(apic.deliverable_vector(), None);
    for value in [address | EN | EXTD, address | EXTD] {
        assert_eq!(apic.write_msr(MSR_APIC_BASE, value, 0), gp, "{value:#x}");
    }
    // Disabled -> xAPIC: the registers are reached through the MMIO page
    // (`read_xapic`/`write_xapic`), the x2APIC MSRs still raise #GP.
    write(&mut apic, MSR_APIC_BASE, address | EN, 0);
    assert_eq!(apic.mode(), ApicMode::Xapic);
    assert_eq!(apic.read_msr(VERSION, 0), Err(ApicGp { msr: VERSION }));
    apic.write_xapic(SVR, 0x1ff, 0).unwrap();
    assert!(apic.software_enabled());
    assert_eq!(apic.read_xapic(VERSION, 0), Some(u64::from(APIC_VERSION)));
    // xAPIC -> invalid faults; xAPIC -> x2APIC keeps the registers.
    assert_eq!(apic.write_msr(MSR_APIC_BASE, address | EXTD, 0), gp);
    write(&mut apic, MSR_APIC_BASE, address | EN | EXTD, 0);
    assert_eq!(apic.mode(), ApicMode::X2apic);
    assert_eq!(read(&apic, SVR, 0), 0x1ff);
    // Moving the MMIO base is allowed; the BSP flag is not software's to
    // change.
    let moved = 0x3f_fee0_0000 | EN | EXTD;
    write(&mut apic, MSR_APIC_BASE, moved, 0);
    assert_eq!(read(&apic, MSR_APIC_BASE, 0), moved | 1 << 8);
    assert_eq!(apic.mmio_base(), 0x3f_fee0_0000);
}

/// After RESET the APIC is in xAPIC mode at 0xfee00000 (IA32_APIC_BASE
/// 0xfee00900 on the BSP, 0xfee00800 on an AP); INIT keeps the mode.
#[test]
fn reset_state_is_xapic_mode_and_init_keeps_the_mode() {
    let bsp = Lapic::at_reset(0);
    assert_eq!(bsp.read_msr(MSR_APIC_BASE, 0), Ok(0xfee0_0900));
    assert_eq!(bsp.mode(), ApicMode::Xapic);
    let mut ap = Lapic::at_reset(3);
    assert_eq!(ap.read_msr(MSR_APIC_BASE, 0), Ok(0xfee0_0800));
    ap.reset();
    assert_eq!(ap.mode(), ApicMode::Xapic);
    let mut x2 = Lapic::new(3);
    x2.reset();
    assert_eq!(x2.mode(), ApicMode::X2apic);
}

// --- Priorities ------------------------------------------------------------

#[test]
fn nested_vectors_are_ordered_by_priority_class() {
    let mut apic = enabled(0);
    for vector in [0x31, 0x52, 0x45] {
        apic.accept_interrupt(vector);
    }
    assert_eq!(apic.deliverable_vector(), Some(0x52));
    assert_eq!(apic.deliverable_vector(), Some(0x52), "query changed state");
    apic.start_delivery(0x52);
    assert_eq!(read(&apic, ISR0 + 2, 0), 1 << (0x52 - 0x40));
    assert_eq!(read(&apic, IRR0 + 2, 0), 1 << (0x45 - 0x40));
    assert_eq!(read(&apic, PPR, 0), 0x50);
    // 0x45 (class 4) and a newcomer in the same class 5 wait.
    apic.accept_interrupt(0x55);
    assert_eq!(apic.deliverable_vector(), None);

    // A higher class nests.
    apic.accept_interrupt(0x61);
    assert_eq!(apic.deliverable_vector(), Some(0x61));
    apic.start_delivery(0x61);
    assert_eq!(read(&apic, PPR, 0), 0x60);
    assert_eq!(apic.deliverable_vector(), None);

    // EOI retires the highest in-service vector first.
    write(&mut apic, EOI, 0, 0);
    assert_eq!(apic.isr()[2], 1 << (0x52 - 0x40));
    assert_eq!(apic.isr()[3], 0);
    assert_eq!(read(&apic, PPR, 0), 0x50);
    assert_eq!(apic.deliverable_vector(), None);

    write(&mut apic, EOI, 0, 0);
    assert_eq!(apic.isr(), [0; 8]);
    assert_eq!(read(&apic, PPR, 0), 0);
    assert_eq!(deliver_all(&mut apic, 0), vec![0x55, 0x45, 0x31]);
    // EOI with nothing in service is harmless.
    write(&mut apic, EOI, 0, 0);
    assert_eq!(apic.ppr(), 0);
}

#[test]
fn start_delivery_of_a_vector_not_pending_does_nothing() {
    let mut apic = enabled(0);
    apic.start_delivery(0x80);
    assert_eq!(apic.isr(), [0; 8]);
}

#[test]
fn tpr_blocks_classes_at_or_below_it() {
    let mut apic = enabled(0);
    write(&mut apic, TPR, 0x5f, 0);
    apic.accept_interrupt(0x52);
    apic.accept_interrupt(0x45);
    assert_eq!(apic.deliverable_vector(), None);
    assert_eq!(read(&apic, PPR, 0), 0x5f);
    apic.accept_interrupt(0x60);
    assert_eq!(apic.deliverable_vector(), Some(0x60));
    apic.start_delivery(0x60);
    // The in-service class is higher than the TPR's.
    assert_eq!(read(&apic, PPR, 0), 0x60);
    write(&mut apic, EOI, 0, 0);
    assert_eq!(read(&apic, PPR, 0), 0x5f);
    // Lowering the TPR releases the waiting vectors.
    apic.set_cr8(4);
    assert_eq!(read(&apic, TPR, 0), 0x40);
    assert_eq!(apic.deliverable_vector(), Some(0x52));
    apic.set_cr8(0);
    assert_eq!(deliver_all(&mut apic, 0), vec![0x52, 0x45]);
}

#[test]
fn cr8_is_tpr_bits_7_to_4() {
    let mut apic = enabled(0);
    write(&mut apic, TPR, 0x7b, 0);
    assert_eq!(apic.cr8(), 7);
    apic.set_cr8(0xc);
    assert_eq!(read(&apic, TPR, 0), 0xc0);
    assert_eq!(apic.tpr(), 0xc0);
    apic.set_cr8(0x13);
    assert_eq!(apic.cr8(), 3);
}

// --- Timer -----------------------------------------------------------------

/// An enabled APIC whose timer is in `mode` with vector 0xec, dividing by 1.
fn with_timer(mode: u64) -> Lapic {
    let mut apic = enabled(0);
    write(&mut apic, DIVIDE_CONFIG, DIVIDE_BY_1, 0);
    write(&mut apic, LVT_TIMER, mode | 0xec, 0);
    apic
}

#[test]
fn one_shot_fires_once_at_its_deadline() {
    let mut apic = with_timer(ONE_SHOT);
    write(&mut apic, INITIAL_COUNT, 1000, 100);
    assert_eq!(apic.next_timer_deadline(), Some(1100));
    apic.update_timer(1099);
    assert_eq!(apic.deliverable_vector(), None);
    assert_eq!(read(&apic, CURRENT_COUNT, 1099), 1);
    apic.update_timer(1100);
    assert_eq!(apic.deliverable_vector(), Some(0xec));
    assert_eq!(apic.next_timer_deadline(), None);
    assert_eq!(read(&apic, CURRENT_COUNT, 1100), 0);
    assert_eq!(read(&apic, INITIAL_COUNT, 1100), 1000);
    assert_eq!(deliver_all(&mut apic, 1100), vec![0xec]);
    apic.update_timer(1_000_000);
    assert_eq!(apic.deliverable_vector(), None, "one-shot fired twice");
}

#[test]
fn writing_zero_initial_count_stops_the_timer() {
    let mut apic = with_timer(ONE_SHOT);
    write(&mut apic, INITIAL_COUNT, 1000, 0);
    write(&mut apic, INITIAL_COUNT, 0, 500);
    assert_eq!(apic.next_timer_deadline(), None);
    assert_eq!(read(&apic, CURRENT_COUNT, 500), 0);
    apic.update_timer(5000);
    assert_eq!(apic.deliverable_vector(), None);
}

#[test]
fn rewriting_initial_count_rearms_from_now() {
    let mut apic = with_timer(ONE_SHOT);
    write(&mut apic, INITIAL_COUNT, 1000, 0);
    write(&mut apic, INITIAL_COUNT, 1000, 600);
    assert_eq!(apic.next_timer_deadline(), Some(1600));
    apic.update_timer(1000);
    assert_eq!(apic.deliverable_vector(), None);
}

#[test]
fn periodic_timer_does_not_drift() {
    let mut apic = with_timer(PERIODIC);
    let start = 7;
    let period = 1000;
    write(&mut apic, INITIAL_COUNT, period, start);
    for k in 1..=500u64 {
        let deadline = start + k * period;
        assert_eq!(apic.next_timer_deadline(), Some(deadline));
        // The CPU notices each expiry late, by a varying amount.
        let late = (k * 37) % 300;
        apic.update_timer(deadline + late);
        assert_eq!(
            deliver_all(&mut apic, deadline + late),
            vec![0xec],
            "period {k}"
        );
        // The count reloaded at the deadline, not when it was noticed.
        assert_eq!(read(&apic, CURRENT_COUNT, deadline + late), period - late);
    }
    assert_eq!(apic.next_timer_deadline(), Some(start + 501 * period));
}

#[test]
fn periodic_timer_fires_once_for_many_missed_periods() {
    let mut apic = with_timer(PERIODIC);
    write(&mut apic, INITIAL_COUNT, 100, 0);
    apic.update_timer(1050);
    assert_eq!(deliver_all(&mut apic, 1050), vec![0xec]);
    assert_eq!(apic.next_timer_deadline(), Some(1100));
    // Exactly on a lattice point: the next deadline is one period later.
    apic.update_timer(1300);
    assert_eq!(deliver_all(&mut apic, 1300), vec![0xec]);
    assert_eq!(apic.next_timer_deadline(), Some(1400));
}

#[test]
fn periodic_current_count_reloads_even_before_an_update() {
    let mut apic = with_timer(PERIODIC);
    write(&mut apic, DIVIDE_CONFIG, 0b0001, 0); // divide by 4
    write(&mut apic, INITIAL_COUNT, 100, 0);
    assert_eq!(read(&apic, CURRENT_COUNT, 0), 100);
    assert_eq!(read(&apic, CURRENT_COUNT, 399), 1);
    assert_eq!(read(&apic, CURRENT_COUNT, 400), 100);
    assert_eq!(read(&apic, CURRENT_COUNT, 404), 99);
    assert_eq!(read(&apic, CURRENT_COUNT, 10 * 400 + 8), 98);
}

#[test]
fn current_count_counts_down_at_tsc_over_divisor() {
    let mut apic = with_timer(ONE_SHOT);
    write(&mut apic, DIVIDE_CONFIG, 0b0001, 0); // divide by 4
    write(&mut apic, INITIAL_COUNT, 100, 1000);
    for (now, count) in [
        (1000, 100),
        (1001, 100),
        (1003, 100),
        (1004, 99),
        (1200, 50),
        (1399, 1),
        (1400, 0),
        (9999, 0),
    ] {
        assert_eq!(read(&apic, CURRENT_COUNT, now), count, "at {now}");
    }
    assert_eq!(apic.next_timer_deadline(), Some(1400));
}

#[test]
fn divide_configuration_selects_the_divisor() {
    // Bits 3,1:0: 000 -> 2, 001 -> 4, ..., 110 -> 128, 111 -> 1.
    let cases = [
        (0b0000, 2),
        (0b0001, 4),
        (0b0010, 8),
        (0b0011, 16),
        (0b1000, 32),
        (0b1001, 64),
        (0b1010, 128),
        (0b1011, 1),
    ];
    for (config, divisor) in cases {
        let mut apic = with_timer(ONE_SHOT);
        write(&mut apic, DIVIDE_CONFIG, config, 0);
        write(&mut apic, INITIAL_COUNT, 10, 50);
        assert_eq!(
            apic.next_timer_deadline(),
            Some(50 + 10 * divisor),
            "config {config:#b}"
        );
        assert_eq!(
            read(&apic, CURRENT_COUNT, 50 + divisor),
            9,
            "config {config:#b}"
        );
    }
}

#[test]
fn reset_divide_configuration_is_divide_by_two() {
    let mut apic = enabled(0);
    write(&mut apic, LVT_TIMER, 0xec, 0);
    write(&mut apic, INITIAL_COUNT, 10, 0);
    assert_eq!(apic.next_timer_deadline(), Some(20));
}

#[test]
fn changing_the_divisor_mid_count_keeps_the_remaining_ticks() {
    let mut apic = with_timer(PERIODIC);
    write(&mut apic, INITIAL_COUNT, 100, 0); // divide by 1
    write(&mut apic, DIVIDE_CONFIG, 0b0000, 40); // 60 ticks left, now 2 cycles each
    assert_eq!(read(&apic, CURRENT_COUNT, 40), 60);
    assert_eq!(apic.next_timer_deadline(), Some(160));
    apic.update_timer(160);
    assert_eq!(deliver_all(&mut apic, 160), vec![0xec]);
    // Later periods use the new divisor.
    assert_eq!(apic.next_timer_deadline(), Some(360));
}

#[test]
fn masked_timer_counts_but_raises_nothing() {
    let mut apic = with_timer(ONE_SHOT | MASKED);
    write(&mut apic, INITIAL_COUNT, 1000, 0);
    assert_eq!(apic.next_timer_deadline(), None);
    assert_eq!(read(&apic, CURRENT_COUNT, 250), 750);
    apic.update_timer(1000);
    assert_eq!(read(&apic, CURRENT_COUNT, 1000), 0);
    // Unmasking after the expiry does not deliver it late.
    write(&mut apic, LVT_TIMER, ONE_SHOT | 0xec, 2000);
    apic.update_timer(3000);
    assert_eq!(apic.deliverable_vector(), None);
    assert_eq!(apic.next_timer_deadline(), None);
}

#[test]
fn unmasking_a_periodic_timer_does_not_replay_masked_periods() {
    let mut apic = with_timer(PERIODIC | MASKED);
    write(&mut apic, INITIAL_COUNT, 100, 0);
    // No update_timer calls while masked: the CPU has no deadline to wait for.
    write(&mut apic, LVT_TIMER, PERIODIC | 0xec, 550);
    assert_eq!(apic.deliverable_vector(), None);
    assert_eq!(apic.next_timer_deadline(), Some(600));
    apic.update_timer(600);
    assert_eq!(deliver_all(&mut apic, 600), vec![0xec]);
}

#[test]
fn tsc_deadline_mode() {
    let mut apic = with_timer(TSC_DEADLINE);
    assert_eq!(apic.next_timer_deadline(), None);
    write(&mut apic, MSR_TSC_DEADLINE, 5000, 0);
    assert_eq!(read(&apic, MSR_TSC_DEADLINE, 0), 5000);
    assert_eq!(apic.next_timer_deadline(), Some(5000));
    // The count registers are inert in this mode.
    write(&mut apic, INITIAL_COUNT, 10, 0);
    assert_eq!(read(&apic, INITIAL_COUNT, 0), 0);
    assert_eq!(read(&apic, CURRENT_COUNT, 0), 0);
    assert_eq!(apic.next_timer_deadline(), Some(5000));

    apic.update_timer(4999);
    assert_eq!(apic.deliverable_vector(), None);
    apic.update_timer(5000);
    assert_eq!(deliver_all(&mut apic, 5000), vec![0xec]);
    assert_eq!(read(&apic, MSR_TSC_DEADLINE, 5000), 0);
    assert_eq!(apic.next_timer_deadline(), None);

    // A deadline already passed fires at once.
    write(&mut apic, MSR_TSC_DEADLINE, 100, 6000);
    assert_eq!(apic.deliverable_vector(), Some(0xec));
    assert_eq!(read(&apic, MSR_TSC_DEADLINE, 6000), 0);
    deliver_all(&mut apic, 6000);

    // Writing 0 disarms.
    write(&mut apic, MSR_TSC_DEADLINE, 9000, 6000);
    write(&mut apic, MSR_TSC_DEADLINE, 0, 6001);
    apic.update_timer(10_000);
    assert_eq!(apic.deliverable_vector(), None);
}

#[test]
fn tsc_deadline_is_ignored_in_other_modes() {
    let mut apic = with_timer(ONE_SHOT);
    write(&mut apic, MSR_TSC_DEADLINE, 5000, 0);
    assert_eq!(read(&apic, MSR_TSC_DEADLINE, 0), 0);
    assert_eq!(apic.next_timer_deadline(), None);
    apic.update_timer(6000);
    assert_eq!(apic.deliverable_vector(), None);
}

#[test]
fn masked_tsc_deadline_expires_silently() {
    let mut apic = with_timer(TSC_DEADLINE | MASKED);
    write(&mut apic, MSR_TSC_DEADLINE, 5000, 0);
    assert_eq!(apic.next_timer_deadline(), None);
    apic.update_timer(5000);
    assert_eq!(read(&apic, MSR_TSC_DEADLINE, 5000), 0);
    assert_eq!(apic.deliverable_vector(), None);
}

/// One-shot <-> periodic keeps the initial count and the running count
/// (KVM's `apic_update_lvtt`, kvm-unit-tests' `apic` "TMICT value reset"
/// and "TMCCT should be reset to the initial-count").
#[test]
fn one_shot_periodic_switches_keep_the_count_running() {
    let mut apic = with_timer(ONE_SHOT);
    write(&mut apic, DIVIDE_CONFIG, DIVIDE_BY_1, 0);
    write(&mut apic, INITIAL_COUNT, 1000, 0);
    write(&mut apic, LVT_TIMER, PERIODIC | 0xec, 600);
    assert_eq!(read(&apic, INITIAL_COUNT, 600), 1000);
    assert_eq!(read(&apic, CURRENT_COUNT, 600), 400);
    assert_eq!(apic.next_timer_deadline(), Some(1000));
    // Periodic now: it reloads the initial count at expiry.
    apic.update_timer(1000);
    assert_eq!(deliver_all(&mut apic, 1000), vec![0xec]);
    assert_eq!(read(&apic, CURRENT_COUNT, 1100), 900);
    // Back to one-shot: runs down from where it is, then stays at 0.
    write(&mut apic, LVT_TIMER, ONE_SHOT | 0xec, 1100);
    assert_eq!(read(&apic, CURRENT_COUNT, 1100), 900);
    apic.update_timer(2000);
    assert_eq!(deliver_all(&mut apic, 2000), vec![0xec]);
    assert_eq!(read(&apic, CURRENT_COUNT, 2500), 0);
    // An expired one-shot switched to periodic stays at 0.
    write(&mut apic, LVT_TIMER, PERIODIC | 0xec, 2500);
    assert_eq!(read(&apic, CURRENT_COUNT, 2500), 0);
    assert_eq!(apic.next_timer_deadline(), None);
}

#[test]
fn switching_to_or_from_tsc_deadline_disarms() {
    let mut apic = with_timer(ONE_SHOT);
    write(&mut apic, INITIAL_COUNT, 1000, 0);
    write(&mut apic, LVT_TIMER, TSC_DEADLINE | 0xec, 10);
    assert_eq!(apic.next_timer_deadline(), None);
    assert_eq!(read(&apic, INITIAL_COUNT, 10), 0);
    assert_eq!(read(&apic, CURRENT_COUNT, 10), 0);

    write(&mut apic, LVT_TIMER, TSC_DEADLINE | 0xec, 10);
    write(&mut apic, MSR_TSC_DEADLINE, 500, 10);
    write(&mut apic, LVT_TIMER, ONE_SHOT | 0xec, 20);
    assert_eq!(apic.next_timer_deadline(), None);
    write(&mut apic, LVT_TIMER, TSC_DEADLINE | 0xec, 30);
    assert_eq!(read(&apic, MSR_TSC_DEADLINE, 30), 0);
    apic.update_timer(1000);
    assert_eq!(apic.deliverable_vector(), None);

    // Rewriting the same mode (here: a new vector) keeps the timer armed.
    write(&mut apic, MSR_TSC_DEADLINE, 2000, 1000);
    write(&mut apic, LVT_TIMER, TSC_DEADLINE | 0xed, 1000);
    apic.update_timer(2000);
    assert_eq!(apic.deliverable_vector(), Some(0xed));
}

#[test]
fn timer_snapshot_continues_identically() {
    let mut apic = with_timer(PERIODIC);
    write(&mut apic, INITIAL_COUNT, 300, 0);
    apic.update_timer(450);
    let mut copy = apic.clone();
    for now in [600, 601, 1000, 1234, 5000] {
        apic.update_timer(now);
        copy.update_timer(now);
        assert_eq!(apic, copy);
        assert_eq!(
            read(&apic, CURRENT_COUNT, now),
            read(&copy, CURRENT_COUNT, now)
        );
    }
}

// --- ICR and IPIs ----------------------------------------------------------

fn ipi(dest: IpiDest, vector: u8, mode: IpiMode, level_assert: bool) -> ApicWrite {
    ApicWrite::SendIpi(Ipi {
        dest,
        vector,
        mode,
        level_assert,
        trigger_level: false,
    })
}

#[test]
fn icr_physical_and_logical_destinations() {
    let mut apic = enabled(3);
    let sent = write(
        &mut apic,
        ICR,
        5u64 << 32 | DM_FIXED | LEVEL_ASSERT | 0x40,
        0,
    );
    assert_eq!(sent, ipi(IpiDest::Physical(5), 0x40, IpiMode::Fixed, true));
    assert_eq!(apic.irr(), [0; 8]);

    let sent = write(&mut apic, ICR, 0x0001_0003u64 << 32 | LOGICAL | 0x41, 0);
    assert_eq!(
        sent,
        ipi(IpiDest::Logical(0x0001_0003), 0x41, IpiMode::Fixed, false)
    );
    // Cluster 1 does not contain APIC 3 (cluster 0, bit 3).
    assert_eq!(apic.irr(), [0; 8]);
    assert_eq!(read(&apic, ICR, 0), 0x0001_0003u64 << 32 | LOGICAL | 0x41);
}

#[test]
fn icr_fixed_to_own_id_is_a_self_ipi() {
    let mut apic = enabled(3);
    assert_eq!(write(&mut apic, ICR, 3u64 << 32 | 0x42, 0), ApicWrite::Done);
    assert!(irr_contains(&apic, 0x42));
}

#[test]
fn icr_self_shorthand() {
    let mut apic = enabled(3);
    assert_eq!(write(&mut apic, ICR, SH_SELF | 0x43, 0), ApicWrite::Done);
    assert!(irr_contains(&apic, 0x43));
    // Other delivery modes to self are the CPU's to handle.
    let sent = write(&mut apic, ICR, SH_SELF | DM_NMI | LEVEL_ASSERT, 0);
    assert_eq!(sent, ipi(IpiDest::SelfOnly, 0, IpiMode::Nmi, true));
}

#[test]
fn icr_all_including_self_is_also_accepted_here() {
    let mut apic = enabled(3);
    let sent = write(&mut apic, ICR, SH_ALL_INCLUDING_SELF | 0x44, 0);
    assert_eq!(
        sent,
        ipi(IpiDest::AllIncludingSelf, 0x44, IpiMode::Fixed, false)
    );
    assert!(irr_contains(&apic, 0x44));
}

#[test]
fn icr_all_excluding_self() {
    let mut apic = enabled(3);
    let sent = write(&mut apic, ICR, SH_ALL_EXCLUDING_SELF | 0x45, 0);
    assert_eq!(
        sent,
        ipi(IpiDest::AllExcludingSelf, 0x45, IpiMode::Fixed, false)
    );
    assert_eq!(apic.irr(), [0; 8]);
}

#[test]
fn icr_fixed_broadcasts_include_this_apic() {
    let mut apic = enabled(3);
    let sent = write(&mut apic, ICR, 0xffff_ffffu64 << 32 | 0x46, 0);
    assert_eq!(
        sent,
        ipi(IpiDest::Physical(0xffff_ffff), 0x46, IpiMode::Fixed, false)
    );
    assert!(irr_contains(&apic, 0x46));
    // A logical destination naming this APIC's cluster and bit.
    let sent = write(&mut apic, ICR, 0x0000_0009u64 << 32 | LOGICAL | 0x47, 0);
    assert_eq!(sent, ipi(IpiDest::Logical(9), 0x47, IpiMode::Fixed, false));
    assert!(irr_contains(&apic, 0x47));
}

#[test]
fn icr_delivery_modes() {
    let mut apic = enabled(0);
    let dest = 7u64 << 32;
    let cases = [
        (DM_LOWEST | 0x50, 0x50, IpiMode::LowestPriority, false),
        (DM_SMI | LEVEL_ASSERT, 0, IpiMode::Smi, true),
        (DM_NMI | LEVEL_ASSERT, 0, IpiMode::Nmi, true),
        (DM_INIT | LEVEL_ASSERT, 0, IpiMode::Init, true),
        // INIT level de-assert.
        (DM_INIT | TRIGGER_LEVEL, 0, IpiMode::Init, false),
        // SIPI vectors are page numbers: low values are legal.
        (
            DM_STARTUP | LEVEL_ASSERT | 0x08,
            0x08,
            IpiMode::Startup,
            true,
        ),
    ];
    for (icr, vector, mode, level) in cases {
        let mut expected = ipi(IpiDest::Physical(7), vector, mode, level);
        if let ApicWrite::SendIpi(e) = &mut expected {
            e.trigger_level = icr & TRIGGER_LEVEL != 0;
        }
        assert_eq!(
            write(&mut apic, ICR, dest | icr, 0),
            expected,
            "icr {icr:#x}"
        );
    }
    // Lowest priority to this APIC only is still routed by the caller.
    assert_eq!(
        write(&mut apic, ICR, DM_LOWEST | 0x51, 0),
        ipi(IpiDest::Physical(0), 0x51, IpiMode::LowestPriority, false)
    );
    assert_eq!(apic.irr(), [0; 8]);
    assert_eq!(latch_esr(&mut apic, 0), 0);
}

#[test]
fn is_destination_routes_each_form() {
    let apic = Lapic::new(0x12); // cluster 1, bit 2
    assert!(apic.is_destination(IpiDest::Physical(0x12), 0));
    assert!(apic.is_destination(IpiDest::Physical(0xffff_ffff), 0));
    assert!(!apic.is_destination(IpiDest::Physical(0x13), 0));
    assert!(apic.is_destination(IpiDest::Logical(0x0001_0004), 0));
    assert!(apic.is_destination(IpiDest::Logical(0x0001_ffff), 0));
    assert!(!apic.is_destination(IpiDest::Logical(0x0001_0008), 0));
    assert!(!apic.is_destination(IpiDest::Logical(0x0000_0004), 0));
    assert!(apic.is_destination(IpiDest::Logical(0xffff_ffff), 0));
    assert!(apic.is_destination(IpiDest::SelfOnly, 0x12));
    assert!(!apic.is_destination(IpiDest::SelfOnly, 0));
    assert!(apic.is_destination(IpiDest::AllIncludingSelf, 0x12));
    assert!(apic.is_destination(IpiDest::AllExcludingSelf, 0));
    assert!(!apic.is_destination(IpiDest::AllExcludingSelf, 0x12));
}

#[test]
fn self_ipi_register() {
    let mut apic = enabled(0);
    assert_eq!(write(&mut apic, SELF_IPI, 0x99, 0), ApicWrite::Done);
    assert!(irr_contains(&apic, 0x99));
    assert_eq!(apic.deliverable_vector(), Some(0x99));
}

// --- Illegal vectors and errors ---------------------------------------------

#[test]
fn illegal_vectors_are_not_accepted() {
    let mut apic = enabled(0);
    apic.accept_interrupt(15);
    assert_eq!(apic.irr(), [0; 8]);
    // The ESR shows errors only once latched by a write.
    assert_eq!(read(&apic, ESR, 0), 0);
    assert_eq!(latch_esr(&mut apic, 0), ESR_RECEIVE_ILLEGAL_VECTOR.into());
    // Latching again clears it.
    assert_eq!(latch_esr(&mut apic, 0), 0);
    apic.accept_interrupt(16);
    assert!(irr_contains(&apic, 16));
    assert_eq!(latch_esr(&mut apic, 0), 0);
}

#[test]
fn illegal_vectors_in_ipis_are_not_sent() {
    let mut apic = enabled(0);
    assert_eq!(write(&mut apic, ICR, 4u64 << 32 | 0x0f, 0), ApicWrite::Done);
    assert_eq!(latch_esr(&mut apic, 0), ESR_SEND_ILLEGAL_VECTOR.into());
    assert_eq!(
        write(&mut apic, ICR, 4u64 << 32 | DM_LOWEST | 0x01, 0),
        ApicWrite::Done
    );
    assert_eq!(latch_esr(&mut apic, 0), ESR_SEND_ILLEGAL_VECTOR.into());
    // To self, it is both sent and received illegally.
    assert_eq!(write(&mut apic, SELF_IPI, 0x02, 0), ApicWrite::Done);
    assert_eq!(
        latch_esr(&mut apic, 0),
        (ESR_SEND_ILLEGAL_VECTOR | ESR_RECEIVE_ILLEGAL_VECTOR).into()
    );
    assert_eq!(
        write(&mut apic, ICR, SH_ALL_INCLUDING_SELF | 0x03, 0),
        ApicWrite::Done
    );
    assert_eq!(
        latch_esr(&mut apic, 0),
        (ESR_SEND_ILLEGAL_VECTOR | ESR_RECEIVE_ILLEGAL_VECTOR).into()
    );
    assert_eq!(apic.irr(), [0; 8]);
}

#[test]
fn illegal_timer_vector_logs_an_error() {
    let mut apic = enabled(0);
    write(&mut apic, DIVIDE_CONFIG, DIVIDE_BY_1, 0);
    write(&mut apic, LVT_TIMER, 0x05, 0);
    write(&mut apic, INITIAL_COUNT, 10, 0);
    apic.update_timer(10);
    assert_eq!(apic.irr(), [0; 8]);
    assert_eq!(latch_esr(&mut apic, 10), ESR_RECEIVE_ILLEGAL_VECTOR.into());
}

#[test]
fn errors_raise_the_lvt_error_interrupt_when_unmasked() {
    let mut apic = enabled(0);
    apic.accept_interrupt(3);
    assert_eq!(apic.deliverable_vector(), None, "masked error LVT raised");
    write(&mut apic, LVT_ERROR, 0xfe, 0);
    apic.accept_interrupt(3);
    assert_eq!(apic.deliverable_vector(), Some(0xfe));
    // An illegal vector in the error entry itself only logs.
    let mut apic = enabled(0);
    write(&mut apic, LVT_ERROR, 0x04, 0);
    write(&mut apic, SELF_IPI, 0x01, 0);
    assert_eq!(apic.irr(), [0; 8]);
    assert_eq!(
        latch_esr(&mut apic, 0),
        (ESR_SEND_ILLEGAL_VECTOR | ESR_RECEIVE_ILLEGAL_VECTOR).into()
    );
}

// --- Software enable -------------------------------------------------------

#[test]
fn software_disabled_apic_accepts_nothing() {
    let mut apic = Lapic::new(0);
    apic.accept_interrupt(0x40);
    assert_eq!(write(&mut apic, SELF_IPI, 0x41, 0), ApicWrite::Done);
    assert_eq!(apic.irr(), [0; 8]);
    assert_eq!(apic.deliverable_vector(), None);
    // It can still send IPIs.
    assert_eq!(
        write(&mut apic, ICR, 1u64 << 32 | DM_INIT | LEVEL_ASSERT, 0),
        ipi(IpiDest::Physical(1), 0, IpiMode::Init, true)
    );
    write(&mut apic, SVR, 0x1ff, 0);
    assert!(apic.software_enabled());
    apic.accept_interrupt(0x40);
    assert_eq!(apic.deliverable_vector(), Some(0x40));
}

#[test]
fn software_disable_masks_the_lvt_for_good() {
    let mut apic = enabled(0);
    for lvt in ALL_LVTS {
        write(&mut apic, lvt, 0x30, 0);
    }
    apic.accept_interrupt(0x70);
    write(&mut apic, SVR, 0x0ff, 0);
    for lvt in ALL_LVTS {
        assert_eq!(read(&apic, lvt, 0), MASKED | 0x30, "{lvt:#x}");
        // Unmasking is refused while disabled.
        write(&mut apic, lvt, 0x31, 0);
        assert_eq!(read(&apic, lvt, 0), MASKED | 0x31, "{lvt:#x}");
    }
    // Pending interrupts are held, not delivered.
    assert!(irr_contains(&apic, 0x70));
    assert_eq!(apic.deliverable_vector(), None);
    // Re-enabling does not unmask.
    write(&mut apic, SVR, 0x1ff, 0);
    assert_eq!(read(&apic, LVT_TIMER, 0), MASKED | 0x31);
    assert_eq!(apic.deliverable_vector(), Some(0x70));
    write(&mut apic, LVT_TIMER, 0x31, 0);
    assert_eq!(read(&apic, LVT_TIMER, 0), 0x31);
}

#[test]
fn software_disable_silences_a_running_timer() {
    let mut apic = with_timer(PERIODIC);
    write(&mut apic, INITIAL_COUNT, 100, 0);
    write(&mut apic, SVR, 0xff, 50);
    assert_eq!(apic.next_timer_deadline(), None);
    apic.update_timer(1000);
    assert_eq!(apic.irr(), [0; 8]);
    // Still counting.
    assert_eq!(read(&apic, CURRENT_COUNT, 1050), 50);
}

// --- INIT ------------------------------------------------------------------

#[test]
fn reset_keeps_the_id_and_x2apic_mode() {
    let mut apic = with_timer(PERIODIC);
    write(&mut apic, MSR_APIC_BASE, 0xfed0_0000 | 1 << 11 | 1 << 10, 0);
    write(&mut apic, TPR, 0x30, 0);
    write(&mut apic, INITIAL_COUNT, 100, 0);
    apic.accept_interrupt(0x80);
    apic.start_delivery(0x80);
    apic.accept_interrupt(0x90);
    let base = read(&apic, MSR_APIC_BASE, 0);

    apic.reset();
    let mut fresh = Lapic::new(0);
    write(&mut fresh, MSR_APIC_BASE, base, 0);
    assert_eq!(apic, fresh);
    assert_eq!(read(&apic, MSR_APIC_BASE, 0), base);
    assert_eq!(apic.id(), 0);
    assert!(!apic.software_enabled());
    assert_eq!(apic.irr(), [0; 8]);
    assert_eq!(apic.isr(), [0; 8]);
    assert_eq!(read(&apic, TPR, 0), 0);
    assert_eq!(apic.next_timer_deadline(), None);
    assert_eq!(read(&apic, LVT_TIMER, 0), MASKED);

    let mut ap = enabled(9);
    ap.reset();
    assert_eq!(ap, Lapic::new(9));
}

// --- Timer against a tick-by-tick reference ---------------------------------

mod reference {
    use super::*;
    use proptest::prelude::*;

    /// The reference count at `now` of a timer armed with `initial` ticks
    /// of `divisor` cycles at `start`, by counting ticks one cycle at a time.
    fn reference_count(periodic: bool, initial: u64, divisor: u64, start: u64, now: u64) -> u64 {
        let mut count = initial;
        for t in start + 1..=now {
            if (t - start) % divisor == 0 && count > 0 {
                count -= 1;
                if count == 0 && periodic {
                    count = initial;
                }
            }
        }
        count
    }

    /// Whether the reference timer reaches zero in `(after, until]`.
    fn reference_fires(
        periodic: bool,
        initial: u64,
        divisor: u64,
        start: u64,
        after: u64,
        until: u64,
    ) -> bool {
        let period = initial * divisor;
        (after + 1..=until).any(|t| {
            let elapsed = t - start;
            elapsed % period == 0 && (periodic || elapsed == period)
        })
    }

    proptest! {
        #[test]
        fn timer_matches_tick_by_tick_reference(
            periodic in any::<bool>(),
            initial in 1u64..40,
            divide_config in prop::sample::select(vec![0b0000u64, 0b0001, 0b0010, 0b1011]),
            start in 0u64..100,
            steps in prop::collection::vec(0u64..400, 1..12),
        ) {
            let divisor = timer::divisor(divide_config as u32);
            let mode = if periodic { PERIODIC } else { ONE_SHOT };
            let mut apic = enabled(0);
            write(&mut apic, DIVIDE_CONFIG, divide_config, 0);
            write(&mut apic, LVT_TIMER, mode | 0xec, 0);
            write(&mut apic, INITIAL_COUNT, initial, start);
            let mut last = start;
            for step in steps {
                let now = last + step;
                apic.update_timer(now);
                let fired = deliver_all(&mut apic, now) == vec![0xec];
                prop_assert_eq!(
                    fired,
                    reference_fires(periodic, initial, divisor, start, last, now),
                    "firing in ({}, {}]", last, now
                );
                prop_assert_eq!(
                    read(&apic, CURRENT_COUNT, now),
                    reference_count(periodic, initial, divisor, start, now),
                    "count at {}", now
                );
                if let Some(deadline) = apic.next_timer_deadline() {
                    prop_assert!(deadline > now);
                    prop_assert!(reference_fires(periodic, initial, divisor, start, now, deadline));
                    prop_assert!(!reference_fires(periodic, initial, divisor, start, now, deadline - 1));
                } else {
                    prop_assert!(!periodic);
                    prop_assert!(!reference_fires(periodic, initial, divisor, start, now, now + 10_000));
                }
                last = now;
            }
        }
    }
}

#[test]
fn level_triggered_vectors_set_the_tmr_and_their_eoi_is_broadcast() {
    let mut apic = enabled(0);
    apic.accept_interrupt_triggered(0x79, true);
    apic.accept_interrupt_triggered(0x41, false);
    assert_eq!(
        read(&apic, TMR0 + 3, 0),
        1 << (0x79 - 0x60),
        "TMR3: vector 0x79"
    );
    assert_eq!(read(&apic, TMR0 + 2, 0), 0, "edge: clear");
    // 0x79 is taken first; then 0x41, as if 0x79's handler had lowered
    // the priority (the ISR order is what matters).
    apic.start_delivery(0x41);
    apic.start_delivery(0x79);
    // The EOI of 0x79 (the highest in service) is broadcast, 0x41's not.
    assert_eq!(write(&mut apic, EOI, 0, 0), ApicWrite::EoiBroadcast(0x79));
    assert_eq!(write(&mut apic, EOI, 0, 0), ApicWrite::Done);
    // The same vector arriving edge-triggered clears its TMR bit.
    apic.accept_interrupt_triggered(0x79, false);
    assert_eq!(read(&apic, TMR0 + 3, 0), 0);
    // An ICR with trigger mode level to self sets it too.
    write(&mut apic, ICR, 0x79 | (1 << 14) | (1 << 15) | (1 << 18), 0);
    assert_eq!(read(&apic, TMR0 + 3, 0), 1 << (0x79 - 0x60));
}

#[test]
fn virtual_wire_mode_passes_pic_interrupts_through_lint0() {
    let mut apic = Lapic::at_reset(0);
    assert!(!apic.accepts_pic_interrupts(), "LINT0 masked at reset");
    apic.enter_virtual_wire_mode();
    assert!(apic.accepts_pic_interrupts());
    assert_eq!(read_x(&apic, LVT_LINT0), 0x700);
    assert_eq!(read_x(&apic, LVT_LINT1), 0x400);
    assert_eq!(read_x(&apic, SVR) & 0x1ff, 0x1ff);
    // Masking LINT0 stops them; a globally disabled APIC passes them.
    apic.write_xapic(LVT_LINT0, 0x1_0700, 0).unwrap();
    assert!(!apic.accepts_pic_interrupts());
    apic.write_msr(MSR_APIC_BASE, 0, 0).unwrap();
    assert!(apic.accepts_pic_interrupts());
}

fn read_x(apic: &Lapic, msr: u32) -> u64 {
    apic.read_xapic(msr, 0).unwrap()
}
