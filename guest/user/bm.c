/* The seed-000 benchmark: `-f` faulting threads write to random pages of
 * an `-m`-byte array, while `-w` work threads increment counters; after
 * `-t` seconds of virtual time each work thread's count is printed, and
 * their sum as `total: N`. As in the seed, the whole array is written
 * before the timed part (`-n` skips that), so the guest has every page and
 * the faults that remain are the host's: pages it evicted when the guest's
 * memory does not fit in its own. Deterministic for a given `-s` seed,
 * which defaults to the boot option seed=S (`faultline run --seed S`). */
#include "ulib.h"

#define MAX_THREADS 64
#define TIME_CHECK_EVERY 1024

struct worker {
    uint64_t count;
    uint64_t deadline_ns;
    uint64_t seed;
    uint8_t *array;
    uint64_t pages;
    uint8_t pad[24]; /* one cache line each */
};

static struct worker workers[MAX_THREADS];

/* The start barrier (the seed's pthread barrier): the timed part begins
 * once every thread has started, so thread creation and the first touches
 * of their stacks (which may come back from host swap) are not timed.
 * Blocking pipe reads, not spinning: a spinning waiter would burn the
 * vCPU time the others need. Each thread writes a byte to `ready_pipe`
 * and then waits for one on `go_pipe`. */
static int ready_pipe[2], go_pipe[2];

static void wait_for_start(void) {
    char c = 1;
    write(ready_pipe[1], &c, 1);
    while (read(go_pipe[0], &c, 1) != 1) {
    }
}

static int work_thread(void *arg) {
    struct worker *w = arg;
    uint64_t n = 0;
    wait_for_start();
    for (;;) {
        for (int i = 0; i < TIME_CHECK_EVERY; i++) {
            n++;
            __asm__ volatile("" : "+r"(n)); /* keeps the increments from being folded */
        }
        w->count = n;
        if (time_ns() >= w->deadline_ns)
            break;
    }
    return 0;
}

static int fault_thread(void *arg) {
    struct worker *w = arg;
    uint64_t rng = w->seed;
    uint64_t n = 0;
    wait_for_start();
    /* The deadline is checked after every write: one write can wait for a
     * host swap-in of many milliseconds, so a batch of writes could run
     * far past it. */
    while (time_ns() < w->deadline_ns) {
        uint64_t page = xorshift64(&rng) % w->pages;
        volatile uint64_t *p = (volatile uint64_t *)(w->array + page * 4096 + (n % 512) * 8);
        *p += 1;
        n++;
        w->count = n;
    }
    return 0;
}

static int usage(void) {
    eprintf("usage: bm [-f faulting_threads] [-w work_threads] [-m bytes] [-t seconds, fractions allowed] [-s seed] "
            "[-n (no prefault)]\n"
            "  at most %d threads in all; the seed defaults to the boot option seed=S (1 without it)\n",
            MAX_THREADS);
    return 2;
}

int bm_main(int argc, char **argv);

int bm_main(int argc, char **argv) {
    uint64_t nfault = 1, nwork = 1, bytes = 64ULL << 20, duration_ns = 1000000000ULL, seed = boot_seed();
    int prefault = 1;
    for (int i = 1; i < argc; i++) {
        int rc = -1;
        if (strcmp(argv[i], "-n") == 0) {
            prefault = 0;
            rc = 0;
        } else if (strcmp(argv[i], "-t") == 0) {
            if (i + 1 >= argc)
                eprintf("bm: option -t needs a value\n");
            else if ((rc = parse_seconds_ns(argv[++i], &duration_ns)) != 0)
                eprintf("bm: option -t: '%s' is not a number of seconds\n", argv[i]);
        } else if (strcmp(argv[i], "-f") == 0) {
            rc = opt_size("bm", argc, argv, &i, 0, MAX_THREADS, &nfault);
        } else if (strcmp(argv[i], "-w") == 0) {
            rc = opt_size("bm", argc, argv, &i, 0, MAX_THREADS, &nwork);
        } else if (strcmp(argv[i], "-m") == 0) {
            rc = opt_size("bm", argc, argv, &i, 4096, MAX_ARRAY_BYTES, &bytes);
        } else if (strcmp(argv[i], "-s") == 0) {
            rc = opt_size("bm", argc, argv, &i, 0, UINT64_MAX, &seed);
        }
        if (rc != 0)
            return usage();
    }
    if (nfault + nwork == 0 || nfault + nwork > MAX_THREADS)
        return usage();
    uint8_t *array = NULL;
    if (nfault) {
        array = mmap_anon(bytes);
        if (!array) {
            eprintf("bm: cannot map %lu bytes: not enough guest memory\n", bytes);
            return 1;
        }
    }
    printf("bm: %lu faulting + %lu work threads, %lu MiB array, %lu ms, %d cpus\n", nfault, nwork,
           bytes >> 20, duration_ns / 1000000, ncpus());
    uint64_t prefault_ns = 0;
    if (array && prefault) {
        /* One write per page backs it as fully as a memset would: the
         * kernel zeroes the whole page on the first touch. */
        uint64_t t0 = time_ns();
        for (uint64_t off = 0; off < bytes; off += 4096)
            ((volatile uint8_t *)array)[off] = 0;
        prefault_ns = time_ns() - t0;
    }
    int tids[MAX_THREADS];
    uint64_t n = nfault + nwork;
    if (pipe(ready_pipe) < 0 || pipe(go_pipe) < 0) {
        printf("bm: cannot create the start barrier's pipes\n");
        return 1;
    }
    for (uint64_t i = 0; i < n; i++) {
        struct worker *w = &workers[i];
        w->seed = seed * 0x9E3779B97F4A7C15ULL + i + 1;
        if (w->seed == 0) /* xorshift's one forbidden state (one seed per thread maps to it) */
            w->seed = 0x9E3779B97F4A7C15ULL;
        w->array = array;
        w->pages = bytes / 4096;
        /* Round robin over the CPUs (the kernel places a new thread on the
         * least loaded CPU, but these block at the start barrier at once,
         * so they would look like no load at all). */
        tids[i] = spawn_on(i < nfault ? fault_thread : work_thread, w, (int)(i % (uint64_t)ncpus()));
        if (tids[i] < 0) {
            printf("bm: spawn failed: %d\n", tids[i]);
            return 1;
        }
    }
    char buf[MAX_THREADS];
    for (uint64_t got = 0; got < n;) {
        int64_t r = read(ready_pipe[0], buf, n - got);
        if (r <= 0) {
            printf("bm: start barrier: read failed: %ld\n", r);
            return 1;
        }
        got += (uint64_t)r;
    }
    uint64_t start = time_ns();
    uint64_t deadline = start + duration_ns;
    for (uint64_t i = 0; i < n; i++)
        workers[i].deadline_ns = deadline;
    memset(buf, 1, sizeof(buf));
    if (write(go_pipe[1], buf, n) != (int64_t)n) {
        printf("bm: start barrier: write failed\n");
        return 1;
    }
    uint64_t total = 0, touches = 0;
    for (uint64_t i = 0; i < n; i++)
        wait_thread(tids[i]);
    uint64_t elapsed = time_ns() - start;
    for (uint64_t i = 0; i < nfault; i++)
        touches += workers[i].count;
    for (uint64_t i = 0; i < nwork; i++) {
        printf("worker %lu: %lu\n", i, workers[nfault + i].count);
        total += workers[nfault + i].count;
    }
    printf("faulting threads: %lu page writes\n", touches);
    printf("total: %lu\n", total);
    report("bm_total=%lu bm_page_writes=%lu bm_elapsed_ns=%lu bm_fault_threads=%lu bm_work_threads=%lu "
           "bm_prefault=%d bm_prefault_ns=%lu",
           total, touches, elapsed, nfault, nwork, prefault && array ? 1 : 0, prefault_ns);
    return 0;
}
