/* Seed 002's "testsuite" loops, shared by the project guest's apfcalc
 * (guest/user/apfcalc.c) and the Linux program (guest/linux/apfcalc.c),
 * so both measure exactly the same work. Only the threads, the clock and
 * the output differ. Needs <stdint.h>. */
#ifndef FAULTLINE_APFCALC_CORE_H
#define FAULTLINE_APFCALC_CORE_H

#include <stdint.h>

/* The calculation thread publishes its count every this many increments. */
#define APFCALC_CHECK_EVERY 1024

/* The word the writer stores at `word` in loop `loop`. */
static inline uint64_t apfcalc_value(uint64_t loop, uint64_t word)
{
    return (loop + 1) * 0x100000001b3ULL ^ word;
}

/* The writer: one word every `stride_words`, `loops` times over. */
static inline void apfcalc_write(volatile uint64_t *array, uint64_t words, uint64_t stride_words, uint64_t loops)
{
    for (uint64_t loop = 0; loop < loops; loop++)
        for (uint64_t w = 0; w < words; w += stride_words)
            array[w] = apfcalc_value(loop, w);
}

/* The words of the last loop that do not hold what it wrote. */
static inline uint64_t apfcalc_bad_words(volatile const uint64_t *array, uint64_t words, uint64_t stride_words,
                                         uint64_t loops)
{
    uint64_t bad = 0;
    for (uint64_t w = 0; w < words; w += stride_words)
        bad += array[w] != apfcalc_value(loops - 1, w);
    return bad;
}

/* The writer's job, and the calculation's. */
struct apfcalc_job {
    volatile uint64_t *array;
    uint64_t words, stride_words, loops;
    uint64_t elapsed_ns; /* the writer's time, by the caller's clock */
    volatile int done;
};

struct apfcalc_calc {
    const struct apfcalc_job *job;
    volatile uint64_t count;
};

/* The writer thread's body: the loops, timed with `clock` (nanoseconds),
 * then `done` for the calculation. */
static inline void apfcalc_writer(struct apfcalc_job *j, uint64_t (*clock)(void))
{
    uint64_t start = clock();
    apfcalc_write(j->array, j->words, j->stride_words, j->loops);
    j->elapsed_ns = clock() - start;
    __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
}

/* The calculation: counts (as bm's work threads do) until *done is set,
 * publishing the count in *count. */
static inline void apfcalc_count(volatile const int *done, volatile uint64_t *count)
{
    uint64_t n = 0;
    while (!__atomic_load_n(done, __ATOMIC_ACQUIRE)) {
        for (int i = 0; i < APFCALC_CHECK_EVERY; i++) {
            n++;
            __asm__ volatile("" : "+r"(n)); /* keeps the increments from being folded */
        }
        *count = n;
    }
}

#endif
