/* IPI round trips between two CPUs (SYS_IPIPING, kernel/ipiping.c): this
 * CPU writes the x2APIC ICR to interrupt the target, whose handler writes
 * its ICR to interrupt this one back; the kernel times each round trip on
 * the TSC (cycles, from before the first ICR write to after the reply's
 * handler ran here). The target idles (halted) unless -b puts a thread
 * that spins in user mode on it.
 *
 * Prints the min, median and max and reports `ipiping_rounds=N
 * ipiping_min_cycles=.. ipiping_median_cycles=.. ipiping_max_cycles=..
 * ipiping_path=x2apic_icr`.
 *
 * Usage: ipiping [-n ROUNDS] [-c TARGET_CPU] [-b]. */
#include "ulib.h"

static volatile int spin_stop;

static int spinner_main(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&spin_stop, __ATOMIC_ACQUIRE))
        __builtin_ia32_pause();
    return 0;
}

static void sort(uint64_t *v, uint64_t n) {
    /* Shell sort: no recursion, fine for the sizes here. */
    for (uint64_t gap = n / 2; gap > 0; gap /= 2)
        for (uint64_t i = gap; i < n; i++) {
            uint64_t x = v[i], j = i;
            for (; j >= gap && v[j - gap] > x; j -= gap)
                v[j] = v[j - gap];
            v[j] = x;
        }
}

int ipiping_main(int argc, char **argv);

static int usage(void) {
    eprintf("usage: ipiping [-n rounds] [-c target cpu] [-b (busy target)]\n");
    return 2;
}

int ipiping_main(int argc, char **argv) {
    int cpus = ncpus(), me = getcpu();
    uint64_t rounds = 1000, target = (uint64_t)((me + 1) % cpus);
    int busy = 0;
    for (int i = 1; i < argc; i++) {
        int rc = -1;
        if (strcmp(argv[i], "-n") == 0)
            rc = opt_size("ipiping", argc, argv, &i, 1, 1000000, &rounds);
        else if (strcmp(argv[i], "-c") == 0)
            rc = opt_size("ipiping", argc, argv, &i, 0, (uint64_t)(cpus > 1 ? cpus - 1 : 0), &target);
        else if (strcmp(argv[i], "-b") == 0) {
            busy = 1;
            rc = 0;
        }
        if (rc != 0)
            return usage();
    }
    if (cpus < 2) {
        eprintf("ipiping: needs a second cpu to ping (this VM has %d)\n", cpus);
        return 1;
    }
    if ((int)target == me) {
        eprintf("ipiping: option -c: cpu %lu is this one; ping another\n", target);
        return usage();
    }
    uint64_t *cycles = mmap_anon(rounds * sizeof(uint64_t));
    if (!cycles) {
        eprintf("ipiping: cannot map %lu rounds\n", rounds);
        return 1;
    }
    int spinner = busy ? spawn_on(spinner_main, NULL, (int)target) : 0;
    if (spinner < 0) {
        eprintf("ipiping: cannot start the spinner on cpu %lu\n", target);
        return 1;
    }
    for (uint64_t r = 0; r < rounds; r++) {
        int64_t c = syscall4(SYS_IPIPING, target, 0, 0, 0);
        if (c < 0) {
            eprintf("ipiping: round %lu to cpu %lu failed: %ld\n", r, target, c);
            return 1;
        }
        cycles[r] = (uint64_t)c;
    }
    if (busy) {
        __atomic_store_n(&spin_stop, 1, __ATOMIC_RELEASE);
        wait_thread(spinner);
    }
    sort(cycles, rounds);
    uint64_t min = cycles[0], median = cycles[rounds / 2], max = cycles[rounds - 1];
    printf("ipiping: cpu %d -> cpu %lu (%s target), %lu rounds: min %lu, median %lu, max %lu cycles\n", me, target,
           busy ? "busy" : "idle", rounds, min, median, max);
    report("ipiping_rounds=%lu ipiping_min_cycles=%lu ipiping_median_cycles=%lu ipiping_max_cycles=%lu "
           "ipiping_target=%s ipiping_path=x2apic_icr",
           rounds, min, median, max, busy ? "busy" : "idle");
    return 0;
}
