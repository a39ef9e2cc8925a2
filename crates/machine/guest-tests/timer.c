/* timer.c: the local APIC in x2APIC mode (MSRs 0x800-0x8ff).
 *
 * Software-enables the APIC through the SVR, then checks the timer in
 * one-shot, periodic, masked and TSC-deadline modes (waiting with
 * STI; HLT), that an interrupt stays pending in the IRR while RFLAGS.IF is
 * clear or the TPR blocks its priority class, self-IPIs through the SELF IPI
 * register and the ICR, and EOI clearing the ISR.
 *
 * Timer periods are compared with the TSC only in ways that hold for any
 * APIC timer clock no faster than the TSC. Exits 0 when every check passes. */
#include "rt.h"

#define X2APIC_ID 0x802
#define X2APIC_VERSION 0x803
#define X2APIC_TPR 0x808
#define X2APIC_EOI 0x80b
#define X2APIC_SVR 0x80f
#define X2APIC_ISR0 0x810
#define X2APIC_IRR0 0x820
#define X2APIC_ICR 0x830
#define X2APIC_LVT_TIMER 0x832
#define X2APIC_TIMER_INITIAL 0x838
#define X2APIC_TIMER_CURRENT 0x839
#define X2APIC_TIMER_DIVIDE 0x83e
#define X2APIC_SELF_IPI 0x83f
#define MSR_TSC_DEADLINE 0x6e0

#define APIC_BASE_EXTD (1ull << 10)
#define APIC_BASE_EN (1ull << 11)
#define SVR_ENABLE (1u << 8)
#define LVT_MASKED (1u << 16)
#define LVT_PERIODIC (1u << 17)
#define LVT_TSC_DEADLINE (2u << 17)
#define DIVIDE_BY_1 0xb
#define ICR_DEST_SELF (1ull << 18)

#define TIMER_VECTOR 0x40
#define LOW_IPI_VECTOR 0x50
#define HIGH_IPI_VECTOR 0x70
#define SPURIOUS_VECTOR 0xff

#define MAX_TICKS 16
static volatile u64 ticks, tick_tsc[MAX_TICKS], low_ipis, high_ipis, spurious;

static void eoi(void) { wrmsr(X2APIC_EOI, 0); }

static void timer_handler(struct trap_frame *f)
{
    (void)f;
    if (ticks < MAX_TICKS)
        tick_tsc[ticks] = rdtsc();
    ticks++;
    eoi();
}

static void ipi_handler(struct trap_frame *f)
{
    if (f->vector == LOW_IPI_VECTOR)
        low_ipis++;
    else
        high_ipis++;
    eoi();
}

static void spurious_handler(struct trap_frame *f)
{
    (void)f;
    spurious++; /* no EOI for the spurious vector */
}

static int irr_has(u8 vector) { return (rdmsr(X2APIC_IRR0 + vector / 32) >> (vector % 32)) & 1; }
static int isr_has(u8 vector) { return (rdmsr(X2APIC_ISR0 + vector / 32) >> (vector % 32)) & 1; }

/* Halts with interrupts enabled until `ticks` reaches target. A timer that
 * never fires leaves the machine halted for good, which the machine reports
 * as an error. */
static void wait_for_ticks(u64 target)
{
    while (ticks < target)
        __asm__ volatile("sti\n\thlt\n\tcli" : : : "memory");
}

/* Runs for `cycles` TSC cycles with interrupts enabled (1) or disabled (0). */
static void spin(u64 cycles, int interrupts)
{
    if (interrupts)
        sti();
    u64 start = rdtsc();
    while (rdtsc() - start < cycles)
        __asm__ volatile("pause");
    cli();
}

static void test_registers(void)
{
    u64 base = rdmsr(MSR_APIC_BASE);
    CHECK(base & APIC_BASE_EN);
    CHECK(base & APIC_BASE_EXTD);
    CHECK_EQ(rdmsr(X2APIC_ID), 0);
    CHECK(rdmsr(X2APIC_VERSION) & 0xff); /* version 0x1x: integrated APIC */
    wrmsr(X2APIC_SVR, SVR_ENABLE | SPURIOUS_VECTOR);
    CHECK_EQ(rdmsr(X2APIC_SVR) & 0x1ff, SVR_ENABLE | SPURIOUS_VECTOR);
    wrmsr(X2APIC_TIMER_DIVIDE, DIVIDE_BY_1);
    CHECK_EQ(rdmsr(X2APIC_TIMER_DIVIDE) & 0xb, DIVIDE_BY_1);
    wrmsr(X2APIC_TPR, 0);
}

/* Returns the TSC cycles the one-shot took. */
static u64 test_one_shot(void)
{
    ticks = 0;
    wrmsr(X2APIC_LVT_TIMER, TIMER_VECTOR);
    u64 start = rdtsc();
    wrmsr(X2APIC_TIMER_INITIAL, 20000);
    CHECK(rdmsr(X2APIC_TIMER_CURRENT) <= 20000);
    wait_for_ticks(1);
    u64 elapsed = tick_tsc[0] - start;
    CHECK_EQ(ticks, 1);
    CHECK(elapsed >= 20000);
    CHECK_EQ(rdmsr(X2APIC_TIMER_CURRENT), 0);
    CHECK(!isr_has(TIMER_VECTOR));
    /* A one-shot does not re-arm. */
    spin(4 * elapsed, 1);
    CHECK_EQ(ticks, 1);
    return elapsed;
}

static void test_periodic(void)
{
    ticks = 0;
    wrmsr(X2APIC_LVT_TIMER, TIMER_VECTOR | LVT_PERIODIC);
    wrmsr(X2APIC_TIMER_INITIAL, 10000);
    wait_for_ticks(6);
    /* Stop it: a zero initial count disarms the timer. */
    wrmsr(X2APIC_TIMER_INITIAL, 0);
    u64 min = ~0ull, max = 0, sum = 0;
    for (int i = 1; i < 6; i++) {
        u64 d = tick_tsc[i] - tick_tsc[i - 1];
        min = d < min ? d : min;
        max = d > max ? d : max;
        sum += d;
    }
    u64 mean = sum / 5;
    CHECK(mean >= 10000);
    /* A periodic timer keeps its period: intervals agree within 10%. */
    CHECK(max - min <= mean / 10);
    spin(4 * mean, 1);
    CHECK_EQ(ticks, 6);
}

static void test_masked(u64 one_shot_cycles)
{
    ticks = 0;
    wrmsr(X2APIC_LVT_TIMER, TIMER_VECTOR | LVT_MASKED);
    wrmsr(X2APIC_TIMER_INITIAL, 1000);
    spin(one_shot_cycles, 1);
    CHECK_EQ(ticks, 0);
    CHECK(!irr_has(TIMER_VECTOR));
    wrmsr(X2APIC_TIMER_INITIAL, 0);
}

static void test_pending_while_if_clear(u64 one_shot_cycles)
{
    ticks = 0;
    wrmsr(X2APIC_LVT_TIMER, TIMER_VECTOR);
    wrmsr(X2APIC_TIMER_INITIAL, 1000);
    spin(one_shot_cycles, 0); /* long past expiry, IF = 0 */
    CHECK_EQ(ticks, 0);
    CHECK(irr_has(TIMER_VECTOR));
    /* STI's shadow covers the NOP; the interrupt arrives right after. */
    __asm__ volatile("sti\n\tnop\n\tcli" : : : "memory");
    CHECK_EQ(ticks, 1);
    CHECK(!irr_has(TIMER_VECTOR));
    CHECK(!isr_has(TIMER_VECTOR));
}

static void test_tpr_and_self_ipi(void)
{
    low_ipis = high_ipis = 0;
    /* TPR class 6 blocks vector 0x50 (class 5), not 0x70 (class 7). */
    wrmsr(X2APIC_TPR, 0x60);
    sti();
    wrmsr(X2APIC_SELF_IPI, LOW_IPI_VECTOR);
    wrmsr(X2APIC_SELF_IPI, HIGH_IPI_VECTOR);
    __asm__ volatile("nop" : : : "memory");
    cli();
    CHECK_EQ(high_ipis, 1);
    CHECK_EQ(low_ipis, 0);
    CHECK(irr_has(LOW_IPI_VECTOR));
    /* Lowering the TPR releases it. */
    sti();
    wrmsr(X2APIC_TPR, 0);
    __asm__ volatile("nop" : : : "memory");
    cli();
    CHECK_EQ(low_ipis, 1);
    CHECK(!irr_has(LOW_IPI_VECTOR));

    /* The same through the ICR with the "self" shorthand. */
    sti();
    wrmsr(X2APIC_ICR, ICR_DEST_SELF | LOW_IPI_VECTOR);
    __asm__ volatile("nop" : : : "memory");
    cli();
    CHECK_EQ(low_ipis, 2);
}

static void test_tsc_deadline(void)
{
    ticks = 0;
    wrmsr(X2APIC_LVT_TIMER, TIMER_VECTOR | LVT_TSC_DEADLINE);
    u64 deadline = rdtsc() + 30000;
    wrmsr(MSR_TSC_DEADLINE, deadline);
    CHECK_EQ(rdmsr(MSR_TSC_DEADLINE), deadline);
    wait_for_ticks(1);
    CHECK(tick_tsc[0] >= deadline);
    /* The timer disarms itself by clearing the deadline. */
    CHECK_EQ(rdmsr(MSR_TSC_DEADLINE), 0);
}

int kmain(void);
int kmain(void)
{
    idt_init();
    idt_set_handler(TIMER_VECTOR, timer_handler);
    idt_set_handler(LOW_IPI_VECTOR, ipi_handler);
    idt_set_handler(HIGH_IPI_VECTOR, ipi_handler);
    idt_set_handler(SPURIOUS_VECTOR, spurious_handler);

    test_registers();
    u64 one_shot_cycles = test_one_shot();
    test_periodic();
    test_masked(one_shot_cycles);
    test_pending_while_if_clear(one_shot_cycles);
    test_tpr_and_self_ipi();
    test_tsc_deadline();
    CHECK_EQ(spurious, 0);
    printf("timer: one-shot of 20000 counts took %llu TSC cycles\n", one_shot_cycles);
    return check_report("timer");
}
