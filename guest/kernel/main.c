/* Boot: check the boot information, bring up memory, this CPU, the other
 * CPUs, and start the program named on the command line. */
#include "kernel.h"

struct cpu cpus[MAX_CPUS];
int ncpus;
struct boot_info *boot;
struct pmm kpmm;
uint64_t tsc_hz;

static void pmm_setup(void) {
    pmm_init(&kpmm);
    struct pmm_range holes[] = {
        {(uint64_t)(uintptr_t)kernel_image_start, (uint64_t)(uintptr_t)kernel_image_end},
        {boot->kernel_start, boot->kernel_end},
        {(uint64_t)(uintptr_t)boot, (uint64_t)(uintptr_t)boot + sizeof(*boot)},
    };
    uint32_t n = boot->num_regions < MAX_MEM_REGIONS ? boot->num_regions : MAX_MEM_REGIONS;
    for (uint32_t i = 0; i < n; i++) {
        struct mem_region *r = &boot->regions[i];
        if (r->kind == MEM_USABLE)
            pmm_add_range(&kpmm, r->base, r->len, holes, sizeof(holes) / sizeof(holes[0]));
    }
    if (kpmm.free_pages == 0)
        panic("no usable memory in the boot memory map");
}

/* The part of the command line after "--" (the program and its args). */
static const char *program_cmdline(const char *cmdline) {
    for (const char *s = cmdline; *s; s++) {
        if (s[0] == '-' && s[1] == '-' && (s == cmdline || s[-1] == ' ') && (s[2] == ' ' || !s[2])) {
            s += 2;
            while (*s == ' ')
                s++;
            return s;
        }
    }
    return cmdline;
}

#ifdef DEBUG
static void self_checks(void) {
    int rc = pmm_check(&kpmm);
    if (rc)
        panic("pmm self-check failed: %d", rc);
    /* Allocation round trip: distinct, owned, zeroed pages come back. */
    uint64_t before = kpmm.free_pages;
    uint64_t a = pmm_alloc_zeroed(&kpmm), b = pmm_alloc(&kpmm);
    KASSERT(a && b && a != b && pmm_owns(&kpmm, a) && pmm_owns(&kpmm, b));
    KASSERT(*(uint64_t *)(uintptr_t)a == 0);
    pmm_free(&kpmm, a);
    pmm_free(&kpmm, b);
    KASSERT(kpmm.free_pages == before && pmm_check(&kpmm) == 0);
    kprintf("pmm: self-check passed (%lu pages free)\n", kpmm.free_pages);
    vm_self_check();
}
#endif

void kmain(struct boot_info *bi);

void kmain(struct boot_info *bi) {
    boot = bi;
    console_init();
    if (bi->magic != BOOT_INFO_MAGIC || bi->version != BOOT_INFO_VERSION)
        panic("bad boot information (magic %lx version %u)", bi->magic, bi->version);
    bi->cmdline[CMDLINE_LEN - 1] = '\0';
    tsc_hz = bi->tsc_hz ? bi->tsc_hz : 1000000000ULL;
    ncpus = (int)(bi->num_cpus ? bi->num_cpus : 1);
    if (ncpus > MAX_CPUS)
        ncpus = MAX_CPUS;
    kprintf("faultline guest: %d cpu(s), %lu MiB, tsc %lu Hz, cmdline '%s'\n", ncpus,
            bi->mem_size >> 20, tsc_hz, bi->cmdline);

    pmm_setup();
    vm_init();
    kprintf("mem: %lu pages free of %lu\n", kpmm.free_pages, kpmm.total_pages);

    for (int i = 0; i < ncpus; i++) {
        cpus[i].id = i;
        cpus[i].self = &cpus[i];
        sched_init_cpu(&cpus[i]);
    }
    idt_init();
    cpu_init_tables(&cpus[0]);
    syscall_init();
    apic_init(&cpus[0]);
    cpus[0].online = 1;
#ifdef DEBUG
    self_checks();
#endif
    smp_boot();
    kprintf("smp: %d cpu(s) online\n", ncpus);
    start_init_process(program_cmdline(bi->cmdline));
    cpu_idle_loop();
}
