/* Keeps an array touched, pass after pass, from one thread per CPU, and
 * checks that every page still holds what the previous pass wrote: the
 * guest side of `faultline bench memslot` (the VMM drops every mapping
 * while the threads run; the next pass refaults the whole array). The
 * threads meet at a barrier after each pass, so they stay in step (the
 * first pass, with the guest's own page faults, would otherwise let the
 * first thread run passes ahead), and the first thread reports
 * `touchloop_pass=P` when all have finished pass P: what the bench waits
 * for before its next memslot change. */
#include "ulib.h"

#define MAX_THREADS 64
#define MAX_PASSES 1000000

/* Threads that have finished a pass, over all passes. */
static uint64_t arrived;

struct slice {
    int index, threads;
    uint64_t *base;
    uint64_t first, pages; /* page range of this thread */
    uint64_t passes;
    uint64_t errors;
};

static uint64_t tag(uint64_t page, uint64_t pass) { return (page << 20) ^ pass ^ 0x7a7a000000000000ULL; }

static int toucher(void *arg) {
    struct slice *s = arg;
    for (uint64_t pass = 1; pass <= s->passes; pass++) {
        for (uint64_t pg = s->first; pg < s->first + s->pages; pg++) {
            uint64_t *word = &s->base[pg * 512];
            uint64_t want = pass == 1 ? 0 : tag(pg, pass - 1);
            if (*word != want)
                s->errors++;
            *word = tag(pg, pass);
        }
        __atomic_add_fetch(&arrived, 1, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(&arrived, __ATOMIC_ACQUIRE) < (uint64_t)s->threads * pass)
            __builtin_ia32_pause();
        if (s->index == 0)
            report("touchloop_pass=%lu", pass);
    }
    return 0;
}

int touchloop_main(int argc, char **argv);

static int usage(void) {
    eprintf("usage: touchloop [-m bytes, at least 4K] [-p passes, 1 to %d]\n", MAX_PASSES);
    return 2;
}

int touchloop_main(int argc, char **argv) {
    uint64_t bytes = 16ULL << 20, passes = 3;
    for (int i = 1; i < argc; i++) {
        int rc = -1;
        if (strcmp(argv[i], "-m") == 0)
            rc = opt_size("touchloop", argc, argv, &i, 4096, MAX_ARRAY_BYTES, &bytes);
        else if (strcmp(argv[i], "-p") == 0)
            rc = opt_size("touchloop", argc, argv, &i, 1, MAX_PASSES, &passes);
        if (rc != 0)
            return usage();
    }
    uint64_t pages = bytes / 4096;
    uint64_t *base = mmap_anon(pages * 4096);
    if (!base) {
        eprintf("touchloop: cannot map %lu bytes: not enough guest memory\n", pages * 4096);
        return 1;
    }
    int n = ncpus();
    if (n > MAX_THREADS)
        n = MAX_THREADS;
    if ((uint64_t)n > pages)
        n = (int)pages;
    static struct slice slices[MAX_THREADS];
    int tids[MAX_THREADS];
    uint64_t per = pages / (uint64_t)n;
    for (int i = 0; i < n; i++) {
        slices[i] = (struct slice){i, n, base, per * (uint64_t)i, i == n - 1 ? pages - per * (uint64_t)i : per, passes, 0};
        tids[i] = spawn_on(toucher, &slices[i], i);
    }
    uint64_t errors = 0;
    for (int i = 0; i < n; i++) {
        if (tids[i] < 0 || wait_thread(tids[i]) != 0)
            errors++;
        errors += slices[i].errors;
    }
    printf("touchloop: %lu pages x %lu passes, %lu errors\n", pages, passes, errors);
    report("touchloop_threads=%d touchloop_pages=%lu touchloop_errors=%lu", n, pages, errors);
    return errors ? 1 : 0;
}
