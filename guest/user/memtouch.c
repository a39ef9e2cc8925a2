/* Writes every page of an array several times, from one thread per CPU,
 * then verifies every word. */
#include "ulib.h"

#define MAX_THREADS 64
#define MAX_PASSES 1000000000 /* fits the int each thread counts in */

struct slice {
    uint64_t *base;
    uint64_t first, pages; /* page range of this thread */
    int passes;
    uint64_t errors;
};

static uint64_t pattern(uint64_t page, uint64_t word, int pass) {
    return (page << 20) ^ (word << 4) ^ (uint64_t)pass ^ 0x5a5a000000000000ULL;
}

static int toucher(void *arg) {
    struct slice *s = arg;
    for (int pass = 0; pass < s->passes; pass++)
        for (uint64_t pg = s->first; pg < s->first + s->pages; pg++)
            for (uint64_t w = 0; w < 512; w += 8)
                s->base[pg * 512 + w] = pattern(pg, w, pass);
    for (uint64_t pg = s->first; pg < s->first + s->pages; pg++)
        for (uint64_t w = 0; w < 512; w++) {
            uint64_t want = w % 8 == 0 ? pattern(pg, w, s->passes - 1) : 0;
            if (s->base[pg * 512 + w] != want)
                s->errors++;
        }
    return 0;
}

int memtouch_main(int argc, char **argv);

static int usage(void) {
    eprintf("usage: memtouch [-m bytes, at least 4K] [-p passes, 1 to %d]\n", MAX_PASSES);
    return 2;
}

int memtouch_main(int argc, char **argv) {
    uint64_t bytes = 16ULL << 20, passes = 3;
    for (int i = 1; i < argc; i++) {
        int rc = -1;
        if (strcmp(argv[i], "-m") == 0)
            rc = opt_size("memtouch", argc, argv, &i, 4096, MAX_ARRAY_BYTES, &bytes);
        else if (strcmp(argv[i], "-p") == 0)
            rc = opt_size("memtouch", argc, argv, &i, 1, MAX_PASSES, &passes);
        if (rc != 0)
            return usage();
    }
    uint64_t pages = bytes / 4096;
    uint64_t *base = mmap_anon(pages * 4096);
    if (!base) {
        eprintf("memtouch: cannot map %lu bytes: not enough guest memory\n", pages * 4096);
        return 1;
    }
    int n = ncpus();
    if (n > MAX_THREADS)
        n = MAX_THREADS;
    static struct slice slices[MAX_THREADS];
    int tids[MAX_THREADS];
    uint64_t per = pages / (uint64_t)n;
    for (int i = 0; i < n; i++) {
        slices[i] = (struct slice){base, per * (uint64_t)i, i == n - 1 ? pages - per * (uint64_t)i : per,
                                   (int)passes, 0};
        tids[i] = spawn(toucher, &slices[i]);
    }
    uint64_t errors = 0;
    for (int i = 0; i < n; i++) {
        if (tids[i] < 0 || wait_thread(tids[i]) != 0)
            errors++;
        errors += slices[i].errors;
    }
    printf("memtouch: %lu pages verified, %lu errors\n", pages, errors);
    report("memtouch_pages=%lu memtouch_errors=%lu", pages, errors);
    return errors ? 1 : 0;
}
