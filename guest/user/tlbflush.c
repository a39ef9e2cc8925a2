/* Remote TLB flushes under load: one thread per CPU (or -t), each owning a
 * page of a shared array and reading everyone else's, so every CPU holds
 * translations of every page. Each round a thread writes a new value in
 * its page, drops the page (SYS_ZAP, MADV_DONTNEED: the kernel clears the
 * PTE and flushes the page from the TLB of every CPU running the process
 * before freeing it), publishes that it did, and computes a while. The
 * time the zap takes is the flush latency as the program sees it; the
 * kernel counts the IPIs it sent and the waits (`pv_cpu=` report lines).
 *
 * Checks: after its zap a thread reads its page as zero (its own TLB was
 * flushed), and no thread reads in another's page the value written before
 * a zap whose end was published (a stale translation: the remote flush,
 * IPI or PV, was missed). The program fails if either happens.
 *
 * Usage: tlbflush [-t threads] [-r rounds] [-w work]. */
#include "ulib.h"

#define MAX_THREADS 64
#define PAGE 4096

struct worker {
    int index;
    uint64_t zaps, zap_ns, zap_max_ns;
    uint64_t stale_local, stale_remote;
};

static int nthreads;
static uint64_t rounds = 200, work = 2000;
static uint8_t *pages;
/* Per page: the value its owner wrote before its last finished zap. */
static uint64_t zapped_value[MAX_THREADS];
static uint64_t started;
static struct worker workers[MAX_THREADS];
/* Keeps the computation from being optimised away. */
static volatile uint64_t sink;

static volatile uint64_t *page_word(int i) { return (volatile uint64_t *)(pages + (uint64_t)i * PAGE); }

static int worker_main(void *arg) {
    struct worker *w = arg;
    int me = w->index;
    __atomic_add_fetch(&started, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&started, __ATOMIC_ACQUIRE) < (uint64_t)nthreads)
        __builtin_ia32_pause();
    uint64_t acc = (uint64_t)me;
    for (uint64_t r = 1; r <= rounds; r++) {
        uint64_t value = (r << 8) | (uint64_t)(me + 1);
        *page_word(me) = value;
        for (int j = 0; j < nthreads; j++) {
            if (j == me)
                continue;
            uint64_t done = __atomic_load_n(&zapped_value[j], __ATOMIC_ACQUIRE);
            if (done != 0 && *page_word(j) == done)
                w->stale_remote++;
        }
        uint64_t t0 = time_ns();
        int64_t dropped = syscall4(SYS_ZAP, (uint64_t)(uintptr_t)page_word(me), PAGE, 0, 0);
        uint64_t took = time_ns() - t0;
        if (dropped < 0) {
            eprintf("tlbflush: SYS_ZAP failed: %ld\n", dropped);
            return 1;
        }
        if (*page_word(me) != 0)
            w->stale_local++;
        __atomic_store_n(&zapped_value[me], value, __ATOMIC_RELEASE);
        w->zaps++;
        w->zap_ns += took;
        if (took > w->zap_max_ns)
            w->zap_max_ns = took;
        for (uint64_t k = 0; k < work; k++)
            acc = acc * 6364136223846793005ULL + 1442695040888963407ULL;
    }
    sink = acc;
    return 0;
}

int tlbflush_main(int argc, char **argv);

static int usage(void) {
    eprintf("usage: tlbflush [-t threads, 2 to %d] [-r rounds] [-w work per round]\n", MAX_THREADS);
    return 2;
}

int tlbflush_main(int argc, char **argv) {
    uint64_t threads = (uint64_t)ncpus();
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (threads < 2)
        threads = 2;
    for (int i = 1; i < argc; i++) {
        int rc = -1;
        if (strcmp(argv[i], "-t") == 0)
            rc = opt_size("tlbflush", argc, argv, &i, 2, MAX_THREADS, &threads);
        else if (strcmp(argv[i], "-r") == 0)
            rc = opt_size("tlbflush", argc, argv, &i, 1, 100000000, &rounds);
        else if (strcmp(argv[i], "-w") == 0)
            rc = opt_size("tlbflush", argc, argv, &i, 0, 1ULL << 32, &work);
        if (rc != 0)
            return usage();
    }
    nthreads = (int)threads;
    pages = mmap_anon((uint64_t)nthreads * PAGE);
    if (!pages) {
        eprintf("tlbflush: cannot map %d pages\n", nthreads);
        return 1;
    }
    int cpus = ncpus();
    int tids[MAX_THREADS];
    uint64_t t0 = time_ns();
    for (int i = 0; i < nthreads; i++) {
        workers[i] = (struct worker){.index = i};
        tids[i] = spawn_on(worker_main, &workers[i], i % cpus);
    }
    uint64_t failed = 0, zaps = 0, zap_ns = 0, zap_max_ns = 0, stale_local = 0, stale_remote = 0;
    for (int i = 0; i < nthreads; i++) {
        if (tids[i] < 0 || wait_thread(tids[i]) != 0)
            failed++;
        struct worker *w = &workers[i];
        zaps += w->zaps;
        zap_ns += w->zap_ns;
        if (w->zap_max_ns > zap_max_ns)
            zap_max_ns = w->zap_max_ns;
        stale_local += w->stale_local;
        stale_remote += w->stale_remote;
    }
    uint64_t elapsed = time_ns() - t0;
    printf("tlbflush: %d threads x %lu rounds: %lu zaps, mean %lu ns, max %lu ns; %lu stale local, %lu stale "
           "remote reads\n",
           nthreads, rounds, zaps, zaps ? zap_ns / zaps : 0, zap_max_ns, stale_local, stale_remote);
    report("tlbflush_threads=%d tlbflush_rounds=%lu tlbflush_zaps=%lu tlbflush_zap_ns=%lu tlbflush_zap_max_ns=%lu "
           "tlbflush_stale_local=%lu tlbflush_stale_remote=%lu tlbflush_elapsed_ns=%lu",
           nthreads, rounds, zaps, zap_ns, zap_max_ns, stale_local, stale_remote, elapsed);
    return failed || stale_local || stale_remote ? 1 : 0;
}
