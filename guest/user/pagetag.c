/* Data integrity across paging: `-t` threads split an `-m`-byte array into
 * slices and, `-p` times, give every page of theirs a tag naming the page
 * and the pass: its virtual address and the pass number in its first 16
 * bytes, a mix of both in its last 8. Before a page is retagged, the tag of
 * the previous pass is checked (the first pass expects zeroes), and a last
 * pass verifies the final tags. A page the host lost, mixed up with
 * another or brought back stale (an older pass) shows up as a bad page.
 * Prints `pagetag: N pages x P passes, B bad pages`; exits 1 if B > 0.
 * `-P procs` runs that many such processes at once instead (each with its
 * own address space, spread over the CPUs), so address spaces switch while
 * pages move; exits 1 if any of them does. */
#include "ulib.h"

#define MAX_THREADS 64
#define PAGE 4096
#define SHOW_BAD 8 /* bad pages described in full, per thread */

struct slice {
    uint8_t *base;
    uint64_t first, pages; /* the thread's page range */
    uint64_t passes;
    uint64_t bad;
    uint8_t pad[24];
};

struct tag {
    uint64_t va, pass; /* at the start of the page */
    uint64_t mix;      /* in the last 8 bytes */
};

static uint64_t mix(uint64_t va, uint64_t pass) {
    uint64_t x = va ^ (pass * 0x9e3779b97f4a7c15ULL);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ULL;
    return x ^ (x >> 29);
}

static struct tag read_tag(volatile uint64_t *page) {
    return (struct tag){page[0], page[1], page[PAGE / 8 - 1]};
}

/* `pass` is the pass whose tag the page should carry; 0 means untouched. */
static int tag_ok(struct tag t, uint64_t va, uint64_t pass) {
    if (pass == 0)
        return t.va == 0 && t.pass == 0 && t.mix == 0;
    return t.va == va && t.pass == pass && t.mix == mix(va, pass);
}

static void check(struct slice *s, volatile uint64_t *page, uint64_t pass) {
    uint64_t va = (uint64_t)(uintptr_t)page;
    struct tag t = read_tag(page);
    if (tag_ok(t, va, pass))
        return;
    if (s->bad++ < SHOW_BAD)
        printf("pagetag: bad page %lx: want pass %lu, found va %lx pass %lu mix %lx\n", va, pass, t.va, t.pass,
               t.mix);
}

static int tagger(void *arg) {
    struct slice *s = arg;
    /* Passes are numbered from 1 so that 0 can stand for "never written". */
    for (uint64_t pass = 1; pass <= s->passes + 1; pass++) {
        for (uint64_t pg = s->first; pg < s->first + s->pages; pg++) {
            volatile uint64_t *page = (volatile uint64_t *)(s->base + pg * PAGE);
            check(s, page, pass - 1);
            if (pass > s->passes)
                continue; /* the final verify pass */
            uint64_t va = (uint64_t)(uintptr_t)page;
            page[0] = va;
            page[1] = pass;
            page[PAGE / 8 - 1] = mix(va, pass);
        }
    }
    return 0;
}

static int usage(void) {
    eprintf("usage: pagetag [-m bytes, at least 4K] [-p passes] [-t threads, 1 to %d] [-P processes, 1 to %d]\n",
            MAX_THREADS, MAX_THREADS);
    return 2;
}

/* `-P`: `procs` pagetag processes of `bytes` each, at once. */
static int run_processes(uint64_t procs, uint64_t bytes, uint64_t passes, uint64_t threads) {
    int tids[MAX_THREADS];
    int failed = 0;
    for (uint64_t i = 0; i < procs; i++) {
        char cmd[96];
        ksnprintf(cmd, sizeof(cmd), "pagetag -m %lu -p %lu -t %lu", bytes, passes, threads);
        tids[i] = spawn_proc_on(cmd, (int)(i % (uint64_t)ncpus()));
    }
    for (uint64_t i = 0; i < procs; i++)
        if (tids[i] < 0 || wait_thread(tids[i]) != 0)
            failed++;
    printf("pagetag: %lu processes, %d failed\n", procs, failed);
    report("pagetag_procs=%lu pagetag_failed_procs=%d", procs, failed);
    return failed == 0 ? 0 : 1;
}

int pagetag_main(int argc, char **argv);

int pagetag_main(int argc, char **argv) {
    uint64_t bytes = 16ULL << 20, passes = 3, threads = (uint64_t)ncpus(), procs = 0;
    for (int i = 1; i < argc; i++) {
        int rc = -1;
        if (strcmp(argv[i], "-m") == 0)
            rc = opt_size("pagetag", argc, argv, &i, PAGE, MAX_ARRAY_BYTES, &bytes);
        else if (strcmp(argv[i], "-p") == 0)
            rc = opt_size("pagetag", argc, argv, &i, 1, UINT32_MAX, &passes);
        else if (strcmp(argv[i], "-t") == 0)
            rc = opt_size("pagetag", argc, argv, &i, 1, MAX_THREADS, &threads);
        else if (strcmp(argv[i], "-P") == 0)
            rc = opt_size("pagetag", argc, argv, &i, 1, MAX_THREADS, &procs);
        if (rc != 0)
            return usage();
    }
    if (procs)
        return run_processes(procs, bytes, passes, threads);
    uint64_t pages = bytes / PAGE;
    if (threads > MAX_THREADS) /* more CPUs than threads, with no -t */
        threads = MAX_THREADS;
    if (threads > pages)
        threads = pages;
    uint8_t *base = mmap_anon(pages * PAGE);
    if (!base) {
        eprintf("pagetag: cannot map %lu bytes: not enough guest memory\n", pages * PAGE);
        return 1;
    }
    static struct slice slices[MAX_THREADS];
    int tids[MAX_THREADS];
    uint64_t per = pages / threads;
    for (uint64_t i = 0; i < threads; i++) {
        uint64_t first = per * i;
        slices[i] = (struct slice){.base = base,
                                   .first = first,
                                   .pages = i == threads - 1 ? pages - first : per,
                                   .passes = passes};
        tids[i] = spawn(tagger, &slices[i]);
    }
    uint64_t bad = 0;
    int failed_threads = 0;
    for (uint64_t i = 0; i < threads; i++) {
        if (tids[i] < 0 || wait_thread(tids[i]) != 0)
            failed_threads++;
        bad += slices[i].bad;
    }
    if (failed_threads)
        printf("pagetag: %d thread(s) failed to start or crashed\n", failed_threads);
    printf("pagetag: %lu pages x %lu passes, %lu bad pages\n", pages, passes, bad);
    report("pagetag_pages=%lu pagetag_passes=%lu pagetag_bad=%lu", pages, passes, bad);
    return bad == 0 && failed_threads == 0 ? 0 : 1;
}
