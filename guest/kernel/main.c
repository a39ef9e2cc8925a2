/* Boot: check the boot information, bring up memory, this CPU, the other
 * CPUs, and start the program named on the command line. */
#include "kernel.h"

struct cpu cpus[MAX_CPUS];
int ncpus;
struct boot_info *boot;
struct pmm kpmm;
uint64_t tsc_hz;
uint32_t kvm_features;
uint64_t boot_seed = 1;

/* KVM's paravirtual interface: CPUID 0x40000000 = "KVMKVMKVM\0\0\0". */
static void pv_detect(void) {
    uint32_t a, sig[3];
    cpuid(0x40000000, &a, &sig[0], &sig[1], &sig[2]);
    if (memcmp(sig, "KVMKVMKVM\0\0\0", 12) != 0) {
        kprintf("pv: no KVM signature\n");
        return;
    }
    uint32_t b, c, d;
    cpuid(0x40000001, &kvm_features, &b, &c, &d);
    kprintf("pv: KVM signature, features %x (max leaf %x)\n", kvm_features, a);
}

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

/* Boot options (the words before "--"). `crash=KIND` makes the kernel fail
 * on purpose so the hypervisor's error paths can be tested:
 *   triple      a fault with an empty IDT: #GP, #DF, then a triple fault
 *   wild-write  a write to guest-physical memory past the end of RAM
 *   panic       a kernel panic (exit through isa-debug-exit) */
static void crash(const char *kind) {
    kprintf("crash=%s requested\n", kind);
    if (strcmp(kind, "triple") == 0) {
        struct {
            uint16_t limit;
            uint64_t base;
        } __attribute__((packed)) empty = {0, 0};
        __asm__ volatile("lidt %0; ud2" ::"m"(empty));
    } else if (strcmp(kind, "wild-write") == 0) {
        uint64_t pa = (boot->mem_size + (2ULL << 20) - 1) & ~((2ULL << 20) - 1);
        vm_map_kernel_2m(pa);
        *(volatile uint64_t *)(uintptr_t)pa = 0xbad;
        panic("wild write to %lx past the end of RAM did not stop the VM", pa);
    } else if (strcmp(kind, "panic") == 0) {
        panic("crash=panic requested");
    }
    kprintf("unknown crash kind '%s' ignored\n", kind);
}

/* Copies the boot options (the words before "--") into `line` and points
 * `words` at them; returns how many there are. */
static int boot_words(char *line, size_t size, char **words, int max) {
    size_t n = strlen(boot->cmdline);
    if (n >= size)
        n = size - 1;
    memcpy(line, boot->cmdline, n);
    line[n] = '\0';
    int nw = split_words(line, words, max);
    for (int i = 0; i < nw; i++)
        if (strcmp(words[i], "--") == 0)
            return i;
    return nw;
}

/* Whether the boot option `name` is present; for options needed before
 * the other CPUs come up. */
static int boot_flag(const char *name) {
    char line[CMDLINE_LEN];
    char *words[32];
    int nw = boot_words(line, sizeof(line), words, 32);
    for (int i = 0; i < nw; i++)
        if (strcmp(words[i], name) == 0)
            return 1;
    return 0;
}

/* The PV feature switches, acted on at bring-up (pv.c). */
static int is_pv_option(const char *word) {
    return strcmp(word, "no-steal-time") == 0 || strcmp(word, "no-pv-tlb-flush") == 0 ||
           strcmp(word, "no-pv-sched-yield") == 0 || strcmp(word, "no-pv-unhalt") == 0;
}

/* Boot options acted on once the system is up. `no-apf` (asynchronous page
 * faults off) and `no-cr3-cache` were acted on at bring-up; `seed=S` sets `boot_seed`, which
 * programs read with SYS_SEED. */
static void boot_options(void) {
    char line[CMDLINE_LEN];
    char *words[32];
    int nw = boot_words(line, sizeof(line), words, 32);
    for (int i = 0; i < nw; i++) {
        if (strncmp(words[i], "crash=", 6) == 0)
            crash(words[i] + 6);
        else if (strncmp(words[i], "seed=", 5) == 0) {
            if (parse_u64(words[i] + 5, &boot_seed) != 0)
                kprintf("boot option '%s': not a decimal number; seed %lu used\n", words[i], boot_seed);
        } else if (strcmp(words[i], "no-apf") != 0 && strcmp(words[i], "no-cr3-cache") != 0 &&
                   !is_pv_option(words[i]))
            kprintf("unknown boot option '%s' ignored\n", words[i]);
    }
}

#ifdef DEBUG
/* Scheduler self-check: kernel threads spread over the CPUs sleep for
 * staggered virtual times and must wake no earlier than asked. */
static int sleeper(void *arg) {
    uint64_t i = (uint64_t)(uintptr_t)arg;
    uint64_t until = rdtsc() + (i + 1) * (tsc_hz / 1000);
    sleep_until(until);
    if (rdtsc() < until)
        return -1;
    yield();
    return (int)i + 100;
}

/* Pipe self-check: a kernel thread (on another CPU when there is one)
 * echoes bytes back through a second pipe, chunk by chunk (three times
 * what a pipe holds in all), both sides blocking in reads and waking each
 * other. One chunk at most is in flight, so no pipe fills up. */
struct echo {
    struct pipe *in, *out;
};

static int echo_thread(void *arg) {
    struct echo *e = arg;
    uint8_t buf[512];
    int64_t n;
    while ((n = pipe_read(e->in, buf, sizeof(buf))) > 0)
        if (pipe_write(e->out, buf, (uint64_t)n) != n)
            return -1;
    pipe_close(e->in, 0);
    pipe_close(e->out, 1);
    return 0;
}

static void pipe_self_check(void) {
    static struct echo e;
    static uint8_t sent[3 * 4096 + 123], got[sizeof(sent)];
    struct pipe *a = pipe_create(), *b = pipe_create();
    KASSERT(a && b);
    e = (struct echo){a, b};
    struct task *t = task_alloc("echo");
    KASSERT(t);
    t->kfn = echo_thread;
    t->karg = &e;
    task_start(t, ncpus > 1 ? 1 : 0);
    uint64_t rng = 7;
    for (size_t i = 0; i < sizeof(sent); i++)
        sent[i] = (uint8_t)xorshift64(&rng);
    size_t off = 0;
    while (off < sizeof(sent)) {
        size_t chunk = sizeof(sent) - off < 1000 ? sizeof(sent) - off : 1000;
        KASSERT(pipe_write(a, sent + off, chunk) == (int64_t)chunk);
        for (size_t back = 0; back < chunk;) {
            int64_t n = pipe_read(b, got + off + back, chunk - back);
            KASSERT(n > 0);
            back += (size_t)n;
        }
        off += chunk;
    }
    pipe_close(a, 1);
    KASSERT(pipe_read(b, got, 1) == 0); /* the echo thread closed its end */
    pipe_close(b, 0);
    KASSERT(memcmp(sent, got, sizeof(sent)) == 0);
    KASSERT(task_wait(t->tid) == 0);
    kprintf("pipe: self-check passed (%zu bytes echoed)\n", sizeof(sent));
}

static int sched_self_check(void) {
    int n = 2 * ncpus;
    int tids[2 * MAX_CPUS];
    for (int i = 0; i < n; i++) {
        struct task *t = kthread_create("sleeper", sleeper, (void *)(uintptr_t)i);
        KASSERT(t);
        tids[i] = t->tid;
    }
    for (int i = 0; i < n; i++) {
        int rc = task_wait(tids[i]);
        if (rc != i + 100)
            panic("sched self-check: sleeper %d returned %d", i, rc);
    }
    kprintf("sched: self-check passed (%d kernel threads)\n", n);
    pipe_self_check();
    apf_self_check();
    return 0;
}

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

/* The first kernel thread: runs the debug self-checks that need a
 * scheduler, then starts the program. */
static int init_thread(void *arg) {
    (void)arg;
#ifdef DEBUG
    sched_self_check();
#endif
    start_init_process(program_cmdline(boot->cmdline));
    return 0;
}

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

    pv_detect();
    pmm_setup();
    vm_init();
    kprintf("mem: %lu pages free of %lu\n", kpmm.free_pages, kpmm.total_pages);

    for (int i = 0; i < ncpus; i++) {
        cpus[i].id = i;
        cpus[i].self = &cpus[i];
        sched_init_cpu(&cpus[i]);
    }
    apf_init(boot_flag("no-apf"));
    cr3cache_init(boot_flag("no-cr3-cache"));
    pv_init(boot_flag("no-steal-time"), boot_flag("no-pv-tlb-flush"), boot_flag("no-pv-sched-yield"),
            boot_flag("no-pv-unhalt"));
    idt_init();
    cpu_init_tables(&cpus[0]);
    syscall_init();
    apic_init(&cpus[0]);
    apf_cpu_init(&cpus[0]);
    cr3cache_cpu_init(&cpus[0]);
    pv_cpu_init(&cpus[0]);
    cpus[0].online = 1;
#ifdef DEBUG
    self_checks();
#endif
    smp_boot();
    kprintf("smp: %d cpu(s) online\n", ncpus);
    apf_print_status();
    cr3cache_print_status();
    pv_print_status();
    boot_options();
    kthread_create("init", init_thread, NULL);
    cpu_idle_loop();
}
