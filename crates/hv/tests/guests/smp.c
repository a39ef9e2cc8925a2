/* The BSP starts every AP with HC_START_CPU; each AP prints its id under a
 * spinlock, counts itself in and sends a fixed IPI to the BSP, which sleeps
 * in HLT between IPIs. Then a timer test: TSC-deadline interrupt wakes HLT. */
#include "common.h"

#define IPI_VECTOR 0x40
#define TIMER_VECTOR 0x41
#define X2APIC_SVR 0x80f
#define X2APIC_EOI 0x80b
#define X2APIC_ICR 0x830
#define X2APIC_LVT_TIMER 0x832
#define MSR_TSC_DEADLINE 0x6e0

static volatile int print_lock;
static volatile int arrived;
static volatile int ipis;
static volatile int timer_fired;
static volatile int gp_faults;
static volatile int kicked_awake;
static uint8_t stacks[MAX_CPUS][8192] __attribute__((aligned(16)));

struct idt_entry { uint16_t off0, sel; uint8_t ist, type; uint16_t off1; uint32_t off2, zero; };
static struct idt_entry idt[256];
struct __attribute__((packed)) idtr { uint16_t limit; uint64_t base; };

struct interrupt_frame;
__attribute__((interrupt)) static void ipi_handler(struct interrupt_frame *f) {
    (void)f;
    __atomic_add_fetch(&ipis, 1, __ATOMIC_SEQ_CST);
    wrmsr(X2APIC_EOI, 0);
}
__attribute__((interrupt)) static void timer_handler(struct interrupt_frame *f) {
    (void)f;
    timer_fired = 1;
    wrmsr(X2APIC_EOI, 0);
}

/* #GP from an unknown MSR: count it and skip the 2-byte rdmsr/wrmsr. */
struct gp_frame { uint64_t rip, cs, rflags, rsp, ss; };
__attribute__((interrupt)) static void gp_handler(struct gp_frame *f, uint64_t code) {
    (void)code;
    gp_faults++;
    f->rip += 2;
}

static void set_gate_raw(int v, uint64_t a) {
    idt[v] = (struct idt_entry){(uint16_t)a, 0x08, 0, 0x8e, (uint16_t)(a >> 16), (uint32_t)(a >> 32), 0};
}
static void set_gate(int v, void (*h)(struct interrupt_frame *)) { set_gate_raw(v, (uint64_t)h); }
static void load_idt(void) {
    struct idtr r = {sizeof(idt) - 1, (uint64_t)idt};
    __asm__ volatile("lidt %0" ::"m"(r));
}
static void lock(void) { while (__atomic_exchange_n(&print_lock, 1, __ATOMIC_ACQUIRE)) __asm__ volatile("pause"); }
static void unlock(void) { __atomic_store_n(&print_lock, 0, __ATOMIC_RELEASE); }

static void ap_main(unsigned long id) {
    wrmsr(X2APIC_SVR, 0x1ff);
    lock();
    puts_serial("cpu ");
    putu(id);
    puts_serial(" up\n");
    unlock();
    __atomic_add_fetch(&arrived, 1, __ATOMIC_SEQ_CST);
    wrmsr(X2APIC_ICR, ((uint64_t)0 << 32) | IPI_VECTOR); /* fixed, physical, to APIC 0 */
    /* Halted with interrupts off: only KVM_HC_KICK_CPU wakes this. */
    __asm__ volatile("cli; hlt");
    __atomic_add_fetch(&kicked_awake, 1, __ATOMIC_SEQ_CST);
    for (;;) __asm__ volatile("cli; hlt");
}

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    set_gate(IPI_VECTOR, ipi_handler);
    set_gate(TIMER_VECTOR, timer_handler);
    set_gate_raw(13, (uint64_t)gp_handler);
    load_idt();
    wrmsr(X2APIC_SVR, 0x1ff); /* software-enable the APIC */
    for (uint32_t i = 1; i < bi->num_cpus; i++) {
        long r = hypercall4(HC_START_CPU, bi->apic_ids[i], (unsigned long)ap_main,
                            (unsigned long)&stacks[i][8192], i);
        if (r != 0) debug_exit(0x70);
    }
    if (bi->num_cpus > 1 && hypercall4(HC_START_CPU, bi->apic_ids[1], (unsigned long)ap_main, 0, 0) != -HC_EBUSY)
        debug_exit(0x71);
    /* Sleep until every AP has arrived; each one's IPI wakes the BSP (IPIs
     * sent while one is pending merge into one interrupt, as on hardware). */
    for (;;) {
        __asm__ volatile("cli");
        if (arrived == (int)bi->num_cpus - 1) break;
        __asm__ volatile("sti; hlt");
    }
    __asm__ volatile("sti");
    lock();
    puts_serial("all ");
    putu(arrived + 1);
    puts_serial(" cpus up\n");
    if (bi->num_cpus > 1 && ipis == 0) puts_serial("no IPI received\n");
    unlock();
    /* Timer: a deadline 1 ms ahead wakes the halted BSP. */
    wrmsr(X2APIC_LVT_TIMER, (2u << 17) | TIMER_VECTOR); /* TSC-deadline mode */
    uint64_t deadline = rdtsc() + bi->tsc_hz / 1000;
    wrmsr(MSR_TSC_DEADLINE, deadline);
    while (!timer_fired) __asm__ volatile("hlt");
    puts_serial(rdtsc() >= deadline ? "timer ok\n" : "timer EARLY\n");
    /* Unknown MSRs: #GP for both directions, as KVM. */
    wrmsr(0x12345678, 1);
    (void)rdmsr(0x12345678);
    puts_serial(gp_faults == 2 ? "msr gp ok\n" : "msr gp BAD\n");
    /* Kick AP 1 out of its interrupts-off halt. */
    if (bi->num_cpus > 1) {
        if (hypercall4(KVM_HC_KICK_CPU, 0, bi->apic_ids[1], 0, 0) != 0) debug_exit(0x72);
        while (kicked_awake != 1) __asm__ volatile("pause");
        puts_serial("kick ok\n");
    }
    debug_exit(0);
}
