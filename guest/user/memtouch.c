/* Writes every page of an array several times, from one thread per CPU,
 * then verifies every word. */
#include "ulib.h"

#define MAX_THREADS 64

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

int memtouch_main(int argc, char **argv) {
    uint64_t bytes = 16ULL << 20, passes = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-m") == 0)
            parse_size(argv[i + 1], &bytes);
        else if (strcmp(argv[i], "-p") == 0)
            parse_size(argv[i + 1], &passes);
    }
    if (passes == 0)
        passes = 1;
    uint64_t pages = bytes / 4096;
    uint64_t *base = mmap_anon(pages * 4096);
    if (!base) {
        printf("memtouch: mmap failed\n");
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
