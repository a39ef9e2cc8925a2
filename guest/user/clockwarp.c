/* Clock warps across CPUs: one thread per CPU (or -t), each pinned, reads
 * the kernel's clock (SYS_TIME), publishes the value in its slot of a
 * shared array, and checks the values the others published: a value read
 * from another CPU that is later than this CPU's own clock read after
 * reading it is a warp (time went backwards across CPUs). The kernel's
 * clock is guarded (kernel/sched.c, clock_tsc), so there must be none;
 * `-r` reads each CPU's raw TSC instead (SYS_TIME_RAW), which the hv keeps
 * only within its lookahead of the others, to show what the guard hides.
 *
 * Prints `clockwarp: T threads x N iterations: C checks, W warps, worst
 * X ns` and reports `clockwarp_checks=C clockwarp_warps=W
 * clockwarp_worst_ns=X`; exit 1 if W > 0 on the guarded clock.
 *
 * Usage: clockwarp [-n ITERATIONS] [-t THREADS] [-r]. */
#include "ulib.h"

#define MAX_THREADS 64

struct slot {
    volatile uint64_t value; /* the owner's last clock reading */
    uint64_t checks, warps, worst_ns;
    int index;
} __attribute__((aligned(64)));

static struct slot slots[MAX_THREADS];
static int nthreads;
static uint64_t iterations = 10000;
static uint64_t how; /* 0 or SYS_TIME_RAW */
static uint64_t started;

static uint64_t clock_read(void) { return (uint64_t)syscall4(SYS_TIME, how, 0, 0, 0); }

static int reader_main(void *arg) {
    struct slot *me = arg;
    __atomic_add_fetch(&started, 1, __ATOMIC_SEQ_CST);
    /* Yield, not pause: the thread on the main thread's CPU runs as soon
     * as it is spawned, and spinning would keep main from spawning the
     * others until the end of its slice (8 ms). */
    while (__atomic_load_n(&started, __ATOMIC_ACQUIRE) < (uint64_t)nthreads)
        yield();
    for (uint64_t k = 0; k < iterations; k++) {
        __atomic_store_n(&me->value, clock_read(), __ATOMIC_RELEASE);
        for (int j = 0; j < nthreads; j++) {
            if (j == me->index)
                continue;
            uint64_t theirs = __atomic_load_n(&slots[j].value, __ATOMIC_ACQUIRE);
            uint64_t mine = clock_read();
            me->checks++;
            if (theirs > mine) {
                me->warps++;
                if (theirs - mine > me->worst_ns)
                    me->worst_ns = theirs - mine;
            }
        }
    }
    return 0;
}

int clockwarp_main(int argc, char **argv);

static int usage(void) {
    eprintf("usage: clockwarp [-n iterations] [-t threads, 2 to %d] [-r (raw TSC, unguarded)]\n", MAX_THREADS);
    return 2;
}

int clockwarp_main(int argc, char **argv) {
    int cpus = ncpus();
    uint64_t threads = (uint64_t)(cpus < 2 ? 2 : cpus > MAX_THREADS ? MAX_THREADS : cpus);
    for (int i = 1; i < argc; i++) {
        int rc = -1;
        if (strcmp(argv[i], "-n") == 0)
            rc = opt_size("clockwarp", argc, argv, &i, 1, 100000000, &iterations);
        else if (strcmp(argv[i], "-t") == 0)
            rc = opt_size("clockwarp", argc, argv, &i, 2, MAX_THREADS, &threads);
        else if (strcmp(argv[i], "-r") == 0) {
            how = SYS_TIME_RAW;
            rc = 0;
        }
        if (rc != 0)
            return usage();
    }
    nthreads = (int)threads;
    int tids[MAX_THREADS];
    for (int i = 0; i < nthreads; i++) {
        slots[i].index = i;
        tids[i] = spawn_on(reader_main, &slots[i], i % cpus);
    }
    uint64_t failed = 0, checks = 0, warps = 0, worst = 0;
    for (int i = 0; i < nthreads; i++) {
        if (tids[i] < 0 || wait_thread(tids[i]) != 0)
            failed++;
        checks += slots[i].checks;
        warps += slots[i].warps;
        if (slots[i].worst_ns > worst)
            worst = slots[i].worst_ns;
    }
    const char *clock = how ? "raw TSC" : "SYS_TIME";
    printf("clockwarp: %d threads on %d cpus x %lu iterations (%s): %lu checks, %lu warps, worst %lu ns\n", nthreads,
           cpus, iterations, clock, checks, warps, worst);
    report("clockwarp_checks=%lu clockwarp_warps=%lu clockwarp_worst_ns=%lu clockwarp_threads=%d clockwarp_clock=%s",
           checks, warps, worst, nthreads, how ? "raw_tsc" : "sys_time");
    return failed || (warps && !how) ? 1 : 0;
}
