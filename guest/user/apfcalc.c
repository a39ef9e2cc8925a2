/* Seed 002's "testsuite": a writer thread writes one word every `-s` bytes
 * of an `-m`-byte array, `-l` times over; with `-c` a calculation thread
 * counts (as bm's work threads do) until the writer is done. With the
 * guest's memory larger than what the host gives it, the writer keeps
 * hitting pages the host evicted: without asynchronous page faults its
 * vCPU stalls on each, with them the calculation thread runs meanwhile.
 * Prints the writer's elapsed virtual time and the calculation count; the
 * last loop's words are verified afterwards (exit 1 on a mismatch). */
#include "ulib.h"
#include "../include/apfcalc_core.h"

static int writer_thread(void *arg) {
    apfcalc_writer(arg, time_ns);
    return 0;
}

static int calc_thread(void *arg) {
    struct apfcalc_calc *c = arg;
    apfcalc_count(&c->job->done, &c->count);
    return 0;
}

static int usage(void) {
    eprintf("usage: apfcalc [-m bytes] [-l loops] [-c (calculation thread)] [-s stride bytes, a multiple of 8]\n");
    return 2;
}

int apfcalc_main(int argc, char **argv);

int apfcalc_main(int argc, char **argv) {
    uint64_t bytes = 48ULL << 20, loops = 3, stride = 512;
    int with_calc = 0;
    for (int i = 1; i < argc; i++) {
        int rc = -1;
        if (strcmp(argv[i], "-c") == 0) {
            with_calc = 1;
            rc = 0;
        } else if (strcmp(argv[i], "-m") == 0) {
            rc = opt_size("apfcalc", argc, argv, &i, 8, MAX_ARRAY_BYTES, &bytes);
        } else if (strcmp(argv[i], "-l") == 0) {
            rc = opt_size("apfcalc", argc, argv, &i, 1, UINT32_MAX, &loops);
        } else if (strcmp(argv[i], "-s") == 0) {
            rc = opt_size("apfcalc", argc, argv, &i, 8, MAX_ARRAY_BYTES, &stride);
            if (rc == 0 && stride % 8 != 0) {
                eprintf("apfcalc: option -s: %lu is not a multiple of 8\n", stride);
                rc = -1;
            }
        }
        if (rc != 0)
            return usage();
    }
    static struct apfcalc_job job;
    static struct apfcalc_calc calc;
    job = (struct apfcalc_job){.words = bytes / 8, .stride_words = stride / 8, .loops = loops};
    job.array = mmap_anon(bytes);
    if (!job.array) {
        eprintf("apfcalc: cannot map %lu bytes: not enough guest memory\n", bytes);
        return 1;
    }
    calc = (struct apfcalc_calc){.job = &job};
    printf("apfcalc: writer over %lu MiB, stride %lu, %lu loops, %s, %d cpus\n", bytes >> 20, stride, loops,
           with_calc ? "with a calculation thread" : "alone", ncpus());
    int calc_tid = with_calc ? spawn(calc_thread, &calc) : 0;
    int writer_tid = spawn(writer_thread, &job);
    if (writer_tid < 0 || calc_tid < 0) {
        printf("apfcalc: spawn failed: %d %d\n", writer_tid, calc_tid);
        return 1;
    }
    int rc = wait_thread(writer_tid);
    if (with_calc)
        rc |= wait_thread(calc_tid);
    uint64_t bad = apfcalc_bad_words(job.array, job.words, job.stride_words, loops);
    uint64_t us = job.elapsed_ns / 1000;
    printf("apfcalc: writer %lu.%06lu s, calculation %lu, %lu bad words\n", us / 1000000, us % 1000000, calc.count,
           bad);
    report("apfcalc_ns=%lu apfcalc_calc=%lu apfcalc_loops=%lu apfcalc_bytes=%lu apfcalc_bad=%lu", job.elapsed_ns,
           calc.count, loops, bytes, bad);
    return rc == 0 && bad == 0 ? 0 : 1;
}
