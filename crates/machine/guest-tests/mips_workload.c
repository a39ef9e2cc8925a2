/* mips_workload.c: the standard workload of the `mips` benchmark.
 *
 * A deterministic mix of what ordinary kernel and user code does:
 *   - integer loops: a sieve of Eratosthenes, a table-driven CRC-32;
 *   - memory traffic over a 4 MiB array: sequential writes, strided reads
 *     (one access per 4 KiB page and cache line: TLB pressure), and
 *     pseudo-random read-modify-writes;
 *   - calls: naive recursive Fibonacci, calls through a function-pointer
 *     table, a recursive quicksort.
 * Every phase feeds a 64-bit checksum, printed at the end as
 *     mips_workload checksum <16 hex digits>
 * Built twice: freestanding for the machine, and with -DHOSTED as a normal
 * host program, so the machine's checksum can be compared with the real
 * CPU's. Everything is unsigned integer arithmetic with no undefined
 * behaviour, so both builds must agree.
 *
 * WORKLOAD_ROUNDS scales the run: each round is about 27 M instructions
 * (gcc 12 -O2, freestanding build). The default of 12 gives ~330 M
 * instructions: 3.3 s at 100 MIPS. */

#ifdef HOSTED
#include <stdint.h>
#include <stdio.h>
typedef uint8_t u8;
typedef uint32_t u32;
typedef uint64_t u64;
typedef unsigned long usize;
#else
#include "rt.h"
#endif

#ifndef WORKLOAD_ROUNDS
#define WORKLOAD_ROUNDS 12
#endif

#define ARRAY_WORDS ((4u << 20) / 8) /* 4 MiB of u64 */
#define SIEVE_LIMIT (256u * 1024)
#define CRC_BYTES (256u * 1024)
#define SORT_ITEMS (16u * 1024)
#define FNPTR_CALLS (200u * 1000)
#define RANDOM_UPDATES (200u * 1000)
#define FIB_N 22

static u64 array[ARRAY_WORDS];
static u8 composite[SIEVE_LIMIT];
static u32 crc_table[256];
static u32 sort_items[SORT_ITEMS];

static u64 mix(u64 h, u64 v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0x100000001b3ull;
}

/* xorshift64: a tiny deterministic generator. */
static u64 next_random(u64 *state)
{
    u64 x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return x;
}

static u64 sieve(u32 limit)
{
    for (u32 i = 0; i < limit; i++)
        composite[i] = 0;
    u64 count = 0, sum = 0;
    for (u32 i = 2; i < limit; i++) {
        if (composite[i])
            continue;
        count++;
        sum += i;
        for (u64 j = (u64)i * i; j < limit; j += i)
            composite[j] = 1;
    }
    return (count << 32) ^ sum;
}

static void crc_init(void)
{
    for (u32 n = 0; n < 256; n++) {
        u32 c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

static u32 crc32(const u8 *p, usize n, u32 crc)
{
    crc = ~crc;
    for (usize i = 0; i < n; i++)
        crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static u64 memory_traffic(u64 round, u64 *rng)
{
    /* Sequential writes. */
    for (u32 i = 0; i < ARRAY_WORDS; i++)
        array[i] = (u64)i * 0x9e3779b97f4a7c15ull ^ round;
    /* Strided reads: one word per 4 KiB page plus a cache line, wrapping
     * around the array several times. */
    u64 sum = 0;
    const u32 stride = (4096 + 64) / 8;
    u32 idx = (u32)round;
    for (u32 i = 0; i < ARRAY_WORDS / 4; i++) {
        idx += stride;
        if (idx >= ARRAY_WORDS)
            idx -= ARRAY_WORDS;
        sum += array[idx];
    }
    /* Pseudo-random read-modify-writes. */
    for (u32 i = 0; i < RANDOM_UPDATES; i++) {
        u64 r = next_random(rng);
        u32 k = (u32)(r % ARRAY_WORDS);
        array[k] = (array[k] << 1 | array[k] >> 63) + r;
        sum ^= array[k];
    }
    return sum;
}

static u64 fib(u32 n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

/* Calls through a table of small functions. */
typedef u64 (*op_fn)(u64 acc, u64 x);
static u64 op_add(u64 a, u64 x) { return a + x; }
static u64 op_xor_rot(u64 a, u64 x) { return (a ^ x) << 7 | (a ^ x) >> 57; }
static u64 op_mul(u64 a, u64 x) { return a * (x | 1); }
static u64 op_sub(u64 a, u64 x) { return a - (x >> 3); }
static u64 op_div(u64 a, u64 x) { return a / ((x & 0xff) + 1) + x; }
static u64 op_shift(u64 a, u64 x) { return (a >> (x & 31)) ^ (a << 1); }
static u64 op_popcnt(u64 a, u64 x)
{
    u64 v = a ^ x, n = 0;
    while (v) {
        v &= v - 1;
        n++;
    }
    return a + n;
}
static u64 op_branchy(u64 a, u64 x) { return (x & 1) ? a + 3 : (x & 2) ? a ^ 0x5555 : a - 1; }
static op_fn const ops[8] = { op_add, op_xor_rot, op_mul, op_sub, op_div, op_shift, op_popcnt, op_branchy };

static u64 call_table(u64 *rng)
{
    u64 acc = 1;
    for (u32 i = 0; i < FNPTR_CALLS; i++) {
        u64 r = next_random(rng);
        acc = ops[r & 7](acc, r >> 3);
    }
    return acc;
}

static void quicksort(u32 *v, long lo, long hi)
{
    while (lo < hi) {
        u32 pivot = v[lo + (hi - lo) / 2];
        long i = lo, j = hi;
        while (i <= j) {
            while (v[i] < pivot)
                i++;
            while (v[j] > pivot)
                j--;
            if (i <= j) {
                u32 t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                j--;
            }
        }
        /* Recurse into the smaller half, loop on the larger. */
        if (j - lo < hi - i) {
            quicksort(v, lo, j);
            lo = i;
        } else {
            quicksort(v, i, hi);
            hi = j;
        }
    }
}

static u64 sort_phase(u64 *rng)
{
    for (u32 i = 0; i < SORT_ITEMS; i++)
        sort_items[i] = (u32)next_random(rng);
    quicksort(sort_items, 0, SORT_ITEMS - 1);
    u64 h = 0;
    for (u32 i = 0; i < SORT_ITEMS; i++) {
        if (i && sort_items[i - 1] > sort_items[i])
            return 0; /* not sorted: poisons the checksum */
        h = mix(h, sort_items[i]);
    }
    return h;
}

static u64 workload(void)
{
    u64 h = 0xcbf29ce484222325ull;
    u64 rng = 0x243f6a8885a308d3ull;
    crc_init();
    for (u64 round = 0; round < WORKLOAD_ROUNDS; round++) {
        h = mix(h, sieve(SIEVE_LIMIT - (u32)round * 97));
        h = mix(h, memory_traffic(round, &rng));
        h = mix(h, crc32((const u8 *)array + round * 4096, CRC_BYTES, (u32)h));
        h = mix(h, fib(FIB_N + (u32)(round & 1)));
        h = mix(h, call_table(&rng));
        h = mix(h, sort_phase(&rng));
    }
    return h;
}

#ifdef HOSTED
int main(void)
{
    printf("mips_workload checksum %016llx\n", (unsigned long long)workload());
    return 0;
}
#else
int kmain(void);
int kmain(void)
{
    idt_init(); /* turns a stray exception into a diagnostic */
    printf("mips_workload checksum %016llx\n", workload());
    return 0;
}
#endif
