/* Dirty-logging workload (KVM's dirty_log_perf_test guest): every vCPU
 * owns a region of PAGES pages at REGION_BASE + cpu * PAGES * 4096 and, in
 * each pass, touches PAGES pages of it (in order, or at pseudo-random
 * indexes with --random), writing WPCT percent of the touches and reading
 * the rest. A write stores STAMP(pass, cpu) in the page's first word, so
 * the VMM can tell which pages a pass wrote.
 *
 * Handshake with the VMM through the control block at CTRL_GPA: a vCPU
 * starts pass p when `go` reaches p, brackets the pass with rdtsc into
 * tsc_start/tsc_end[cpu] and then sets done[cpu] = p. After pass PASSES the
 * BSP waits for every vCPU and exits through the debug port with 0.
 *
 * Parameters on the command line: pages=N passes=P wpct=W random=0|1
 * seed=S (decimal). */
#include "common.h"

#define CTRL_GPA 0x100000ul
#define REGION_BASE 0x800000ul
#define STAMP(pass, cpu) (((uint64_t)(pass) << 32) | 0xd1700000u | (uint64_t)(cpu))

struct ctrl {
    volatile uint64_t go;
    volatile uint64_t reserved[7];
    volatile uint64_t done[MAX_CPUS];
    volatile uint64_t tsc_start[MAX_CPUS];
    volatile uint64_t tsc_end[MAX_CPUS];
};

static uint8_t stacks[MAX_CPUS][8192] __attribute__((aligned(16)));
static uint64_t pages = 64, passes = 2, wpct = 100, random_access, seed = 1;

static uint64_t param(const char *cmdline, const char *key, uint64_t fallback) {
    unsigned long n = slen(key);
    for (const char *p = cmdline; *p; p++) {
        if ((p == cmdline || p[-1] == ' ') && p[n] == '=') {
            unsigned long i = 0;
            while (i < n && p[i] == key[i]) i++;
            if (i < n) continue;
            uint64_t v = 0;
            for (p += n + 1; *p >= '0' && *p <= '9'; p++) v = v * 10 + (uint64_t)(*p - '0');
            return v;
        }
    }
    return fallback;
}

/* xorshift64*: the same draws for the same (seed, cpu, pass). */
static uint64_t next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}

static void work(unsigned long cpu) {
    struct ctrl *c = (struct ctrl *)CTRL_GPA;
    volatile uint64_t *region = (volatile uint64_t *)(REGION_BASE + cpu * pages * 4096);
    uint64_t sink = 0;
    for (uint64_t pass = 1; pass <= passes; pass++) {
        while (c->go < pass) __asm__ volatile("pause");
        uint64_t s = (seed * 0x9e3779b97f4a7c15ull) ^ (cpu << 40) ^ (pass << 20) ^ 1;
        c->tsc_start[cpu] = rdtsc();
        for (uint64_t k = 0; k < pages; k++) {
            uint64_t r = next(&s);
            uint64_t page = random_access ? (r >> 8) % pages : k;
            volatile uint64_t *word = region + page * 512;
            if ((r & 0xff) * 100 < wpct * 256) *word = STAMP(pass, cpu);
            else sink += *word;
        }
        c->tsc_end[cpu] = rdtsc();
        c->done[cpu] = pass;
    }
    (void)sink;
}

static void ap_main(unsigned long cpu) {
    work(cpu);
    for (;;) __asm__ volatile("cli; hlt");
}

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    pages = param(bi->cmdline, "pages", pages);
    passes = param(bi->cmdline, "passes", passes);
    wpct = param(bi->cmdline, "wpct", wpct);
    random_access = param(bi->cmdline, "random", 0);
    seed = param(bi->cmdline, "seed", seed);
    if (REGION_BASE + bi->num_cpus * pages * 4096 > bi->mem_size) debug_exit(0x70);
    for (uint32_t i = 1; i < bi->num_cpus; i++) {
        long r = hypercall4(HC_START_CPU, bi->apic_ids[i], (unsigned long)ap_main,
                            (unsigned long)&stacks[i][8192], i);
        if (r != 0) debug_exit(0x71);
    }
    work(0);
    struct ctrl *c = (struct ctrl *)CTRL_GPA;
    for (uint32_t i = 0; i < bi->num_cpus; i++)
        while (c->done[i] < passes) __asm__ volatile("pause");
    debug_exit(0);
}
