/* Per-CPU descriptor tables, the SYSCALL MSRs, the x2APIC and AP start-up. */
#include "kernel.h"

struct idt_gate {
    uint16_t off_lo;
    uint16_t sel;
    uint8_t ist;
    uint8_t type;
    uint16_t off_mid;
    uint32_t off_hi;
    uint32_t zero;
} __attribute__((packed));

static struct idt_gate idt[256];

struct desc_ptr {
    uint16_t limit;
    uint64_t base;
} __attribute__((packed));

#define IST_DOUBLE_FAULT 1
#define IST_NMI 2
#define IST_SIZE 4096
static uint8_t ist_stacks[MAX_CPUS][2][IST_SIZE] __attribute__((aligned(16)));

void idt_init(void) {
    const uint64_t *stubs = (const uint64_t *)isr_table;
    for (int v = 0; v < 256; v++) {
        uint64_t off = stubs[v];
        idt[v] = (struct idt_gate){
            .off_lo = (uint16_t)off,
            .sel = SEL_KCODE,
            .ist = v == 8 ? IST_DOUBLE_FAULT : v == 2 ? IST_NMI : 0,
            .type = 0x8e, /* present, DPL 0, 64-bit interrupt gate: IF off */
            .off_mid = (uint16_t)(off >> 16),
            .off_hi = (uint32_t)(off >> 32),
        };
    }
}

void cpu_init_tables(struct cpu *c) {
    c->self = c;
    c->gdt[0] = 0;
    c->gdt[1] = 0x00af9a000000ffffULL; /* 0x08 kernel code, 64-bit */
    c->gdt[2] = 0x00cf92000000ffffULL; /* 0x10 kernel data */
    c->gdt[3] = 0x00cff2000000ffffULL; /* 0x18 user data (SYSRET SS = STAR[63:48] + 8) */
    c->gdt[4] = 0x00affa000000ffffULL; /* 0x20 user code (SYSRET CS = STAR[63:48] + 16) */
    uint64_t tss = (uint64_t)(uintptr_t)&c->tss;
    uint64_t limit = sizeof(c->tss) - 1;
    c->gdt[5] = (limit & 0xffff) | ((tss & 0xffffff) << 16) | (0x89ULL << 40) |
                (((limit >> 16) & 0xf) << 48) | (((tss >> 24) & 0xff) << 56);
    c->gdt[6] = tss >> 32;
    memset(&c->tss, 0, sizeof(c->tss));
    c->tss.ist[IST_DOUBLE_FAULT - 1] = (uint64_t)(uintptr_t)(ist_stacks[c->id][0] + IST_SIZE);
    c->tss.ist[IST_NMI - 1] = (uint64_t)(uintptr_t)(ist_stacks[c->id][1] + IST_SIZE);
    c->tss.iomap_base = sizeof(c->tss); /* no I/O bitmap */
    c->tss.rsp0 = c->kernel_rsp;

    struct desc_ptr gdtr = {sizeof(c->gdt) - 1, (uint64_t)(uintptr_t)c->gdt};
    struct desc_ptr idtr = {sizeof(idt) - 1, (uint64_t)(uintptr_t)idt};
    __asm__ volatile("lgdt %0\n\t"
                     "lidt %1\n\t"
                     "mov %2, %%ds\n\t"
                     "mov %2, %%es\n\t"
                     "mov %2, %%ss\n\t"
                     "xor %%eax, %%eax\n\t"
                     "mov %%eax, %%fs\n\t"
                     "mov %%eax, %%gs\n\t"
                     "pushq %3\n\t"
                     "lea 1f(%%rip), %%rax\n\t"
                     "pushq %%rax\n\t"
                     "lretq\n"
                     "1:\n\t"
                     "ltr %w4"
                     :
                     : "m"(gdtr), "m"(idtr), "r"((uint64_t)SEL_KDATA), "i"(SEL_KCODE), "r"(SEL_TSS)
                     : "rax", "memory");
    /* GS base last: loading the GS selector above may have cleared it. */
    wrmsr(MSR_GS_BASE, (uint64_t)(uintptr_t)c);
    wrmsr(MSR_KERNEL_GS_BASE, 0);
}

void syscall_init(void) {
    /* SCE. LMA (bit 10) is read-only; leave it out of the write, as some
     * hypervisors reject writing it back. */
    wrmsr(MSR_EFER, (rdmsr(MSR_EFER) | 1) & ~(1ULL << 10));
    /* SYSCALL: CS = 0x08, SS = 0x10. SYSRET: CS = 0x10 + 16, SS = 0x10 + 8. */
    wrmsr(MSR_STAR, ((uint64_t)0x10 << 48) | ((uint64_t)SEL_KCODE << 32));
    wrmsr(MSR_LSTAR, (uint64_t)(uintptr_t)syscall_entry);
    wrmsr(MSR_FMASK, 0x47700); /* IF, TF, DF, AC, NT, IOPL cleared on entry */
}

/* x2APIC registers (MSR 0x800 + offset / 16). */
#define MSR_APIC_BASE 0x1b
#define X2APIC_ID 0x802
#define X2APIC_TPR 0x808
#define X2APIC_EOI 0x80b
#define X2APIC_SVR 0x80f
#define X2APIC_ICR 0x830
#define X2APIC_LVT_TIMER 0x832
#define X2APIC_TIMER_INIT 0x838
#define X2APIC_TIMER_DIV 0x83e
#define LVT_PERIODIC (1u << 17)

void apic_init(struct cpu *c) {
    uint64_t base = rdmsr(MSR_APIC_BASE);
    if ((base & 0xc00) != 0xc00)
        wrmsr(MSR_APIC_BASE, base | 0xc00); /* global enable + x2APIC mode */
    c->apic_id = (uint32_t)rdmsr(X2APIC_ID);
    wrmsr(X2APIC_TPR, 0);
    wrmsr(X2APIC_SVR, 0x100 | VEC_SPURIOUS);
    wrmsr(X2APIC_TIMER_DIV, 0xb); /* divide by 1: one timer tick per TSC cycle */
    wrmsr(X2APIC_LVT_TIMER, LVT_PERIODIC | VEC_TIMER);
    uint64_t count = tsc_hz / HZ;
    wrmsr(X2APIC_TIMER_INIT, count ? count : 1);
}

void apic_eoi(void) { wrmsr(X2APIC_EOI, 0); }

void apic_send_ipi(uint32_t apic_id, uint8_t vector) {
    /* Fixed delivery, physical destination, no shorthand. */
    wrmsr(X2APIC_ICR, ((uint64_t)apic_id << 32) | vector);
}

void ap_main(struct cpu *c);

void ap_main(struct cpu *c) {
    cpu_init_tables(c);
    write_cr3(kernel_mm.pml4);
    c->loaded_mm = &kernel_mm;
    syscall_init();
    apic_init(c);
    apf_cpu_init(c);
    cr3cache_cpu_init(c);
    pv_cpu_init(c);
    __atomic_store_n(&c->online, 1, __ATOMIC_RELEASE);
    cpu_idle_loop();
}

void smp_boot(void) {
    for (int i = 1; i < ncpus; i++) {
        struct cpu *c = &cpus[i];
        struct task *idle = c->idle;
        uint64_t rsp = idle->kstack + KSTACK_SIZE;
        long rc = hypercall4(HC_START_CPU, boot->apic_ids[i], (uintptr_t)ap_entry, rsp, (uintptr_t)c);
        if (rc != 0) {
            kprintf("smp: starting cpu %d (apic %u) failed: %ld\n", i, boot->apic_ids[i], rc);
            ncpus = i;
            break;
        }
        while (!__atomic_load_n(&c->online, __ATOMIC_ACQUIRE))
            cpu_relax();
    }
}
