/* Host unit tests for the guest's pure parts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../lib/klib.h"
#include "../kernel/pmm.h"
#include "check.h"

int failures, checks;

static void expect_fmt(const char *want, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void expect_fmt(const char *want, const char *fmt, ...) {
    char got[128], ref[128];
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = kvsnprintf(got, sizeof(got), fmt, ap);
    int m = vsnprintf(ref, sizeof(ref), fmt, ap2);
    va_end(ap2);
    va_end(ap);
    checks++;
    if (strcmp(got, want) != 0 || n != (int)strlen(want) || strcmp(ref, want) != 0 || n != m) {
        failures++;
        fprintf(stderr, "format '%s': got '%s' (%d), want '%s', libc '%s' (%d)\n", fmt, got, n, want, ref, m);
    }
}

static void test_format(void) {
    expect_fmt("plain", "plain");
    expect_fmt("42 -7 0", "%d %d %d", 42, -7, 0);
    expect_fmt("-9223372036854775808", "%ld", (long)INT64_MIN);
    expect_fmt("18446744073709551615", "%lu", (unsigned long)UINT64_MAX);
    expect_fmt("ff DEADBEEF", "%x %X", 255u, 0xdeadbeefu);
    expect_fmt("00000000000000ab", "%016lx", 0xabUL);
    expect_fmt("[   5] [5   ] [00005]", "[%4d] [%-4d] [%05d]", 5, 5, 5);
    expect_fmt("-0042", "%05d", -42);
    expect_fmt("[  hi] [hi  ]", "[%4s] [%-4s]", "hi", "hi");
    expect_fmt("c=x 100%", "c=%c 100%%", 'x');
    expect_fmt("0x1000", "%p", (void *)0x1000);
    expect_fmt("7", "%zu", (size_t)7);

    /* Truncation: always terminated, returns the untruncated length. */
    char small[5];
    int n = ksnprintf(small, sizeof(small), "%s", "abcdefgh");
    CHECK(n == 8);
    CHECK(strcmp(small, "abcd") == 0);
    CHECK(ksnprintf(small, 0, "xyz") == 3);
}

static void test_parse(void) {
    uint64_t v = 0;
    CHECK(parse_size("128M", &v) == 0 && v == 128ULL << 20);
    CHECK(parse_size("4k", &v) == 0 && v == 4096);
    CHECK(parse_size("2G", &v) == 0 && v == 2ULL << 30);
    CHECK(parse_size("17", &v) == 0 && v == 17);
    CHECK(parse_size("", &v) == -1);
    CHECK(parse_size("12Q", &v) == -1);
    CHECK(parse_size("1MB", &v) == -1);
    CHECK(parse_size("99999999999999999999", &v) == -1);
    CHECK(parse_size("17179869184G", &v) == -1); /* 2^34 GiB overflows */
    CHECK(parse_size("K", &v) == -1);            /* a suffix needs digits */
    CHECK(parse_size("-1", &v) == -1);
    CHECK(parse_size(" 1", &v) == -1);

    /* Strict ranges: memtouch -p 4294967296 must not wrap to 0 passes. */
    v = 7;
    CHECK(parse_size_in("4294967296", 1, 1000000000, &v) == -2 && v == 7);
    CHECK(parse_size_in("0", 1, 10, &v) == -2 && v == 7);
    CHECK(parse_size_in("abc", 1, 10, &v) == -1 && v == 7);
    CHECK(parse_size_in("10", 1, 10, &v) == 0 && v == 10);
    CHECK(parse_size_in("4K", 4096, 4096, &v) == 0 && v == 4096);
    CHECK(parse_size_in("18446744073709551615", 0, UINT64_MAX, &v) == 0 && v == UINT64_MAX);

    /* Plain decimals (the boot option seed=S). */
    CHECK(parse_u64("3", &v) == 0 && v == 3);
    CHECK(parse_u64("18446744073709551615", &v) == 0 && v == UINT64_MAX);
    CHECK(parse_u64("18446744073709551616", &v) == -1);
    CHECK(parse_u64("1K", &v) == -1);
    CHECK(parse_u64("", &v) == -1);
    CHECK(parse_u64("0x10", &v) == -1);

    CHECK(parse_seconds_ns("1", &v) == 0 && v == 1000000000ULL);
    CHECK(parse_seconds_ns("0.25", &v) == 0 && v == 250000000ULL);
    CHECK(parse_seconds_ns(".5", &v) == 0 && v == 500000000ULL);
    CHECK(parse_seconds_ns("2.000000001", &v) == 0 && v == 2000000001ULL);
    CHECK(parse_seconds_ns("1.0000000001", &v) == -1);
    CHECK(parse_seconds_ns("", &v) == -1);
    CHECK(parse_seconds_ns(".", &v) == -1);
    CHECK(parse_seconds_ns("1s", &v) == -1);
    CHECK(parse_seconds_ns("99999999999999999999", &v) == -1);

    char line[] = "  bm -f 4  -w 4 ";
    char *w[8];
    int n = split_words(line, w, 8);
    CHECK(n == 5);
    CHECK(n == 5 && strcmp(w[0], "bm") == 0 && strcmp(w[2], "4") == 0 && strcmp(w[4], "4") == 0);
    char line2[] = "a b c";
    CHECK(split_words(line2, w, 2) == 2);
}

static void test_ring(void) {
    uint8_t storage[8];
    struct ring r = {storage, 8, 0, 0};
    uint8_t out[16];
    CHECK(ring_write(&r, "abcdef", 6) == 6);
    CHECK(ring_read(&r, out, 4) == 4 && memcmp(out, "abcd", 4) == 0);
    /* Wraps around the end of the buffer. */
    CHECK(ring_write(&r, "ghijklmn", 8) == 6);
    CHECK(ring_used(&r) == 8 && ring_free(&r) == 0);
    CHECK(ring_read(&r, out, 16) == 8 && memcmp(out, "efghijkl", 8) == 0);
    CHECK(ring_read(&r, out, 1) == 0);
    /* Free-running counters survive wrap-around of uint32. */
    r.head = r.tail = 0xfffffffe;
    CHECK(ring_write(&r, "xyz", 3) == 3 && ring_used(&r) == 3);
    CHECK(ring_read(&r, out, 3) == 3 && memcmp(out, "xyz", 3) == 0);
}

static void test_xorshift(void) {
    uint64_t a = 1, b = 1;
    uint64_t first = xorshift64(&a);
    CHECK(first == xorshift64(&b)); /* deterministic */
    CHECK(xorshift64(&a) != first);
    /* Page choices spread over a small range. */
    int hits[16] = {0};
    uint64_t s = 12345;
    for (int i = 0; i < 16000; i++)
        hits[xorshift64(&s) % 16]++;
    for (int i = 0; i < 16; i++)
        CHECK(hits[i] > 800 && hits[i] < 1200);
}

static void test_pmm(void) {
    const size_t pages = 64;
    uint8_t *mem = aligned_alloc(PAGE_SIZE, pages * PAGE_SIZE);
    uint64_t base = (uint64_t)(uintptr_t)mem;
    struct pmm p;
    pmm_init(&p);
    /* Two holes: pages 10..11 and 40; a ragged start and end. */
    struct pmm_range holes[] = {
        {base + 10 * PAGE_SIZE, base + 12 * PAGE_SIZE},
        {base + 40 * PAGE_SIZE + 5, base + 40 * PAGE_SIZE + 6},
    };
    pmm_add_range(&p, base + 100, pages * PAGE_SIZE - 200, holes, 2);
    /* Page 0 (partial) and page 63 (partial) are dropped, 3 holes. */
    CHECK(p.total_pages == 62 - 3);
    CHECK(p.free_pages == p.total_pages);
    CHECK(pmm_check(&p) == 0);
    CHECK(!pmm_owns(&p, base));
    CHECK(!pmm_owns(&p, base + 10 * PAGE_SIZE));
    CHECK(!pmm_owns(&p, base + 40 * PAGE_SIZE));
    CHECK(pmm_owns(&p, base + 41 * PAGE_SIZE));

    /* Nothing is touched until handed out (guest RAM stays untouched). */
    CHECK(p.free_listed == 0);
    /* Hand out everything: distinct, owned, in address order. */
    uint64_t got[64];
    size_t n = 0;
    for (uint64_t pa; (pa = pmm_alloc(&p)) != 0;)
        got[n++] = pa;
    CHECK(n == p.total_pages);
    CHECK(got[0] == base + PAGE_SIZE);
    for (size_t i = 1; i < n; i++)
        CHECK(got[i] > got[i - 1]);
    for (size_t i = 0; i < n; i++) {
        CHECK(pmm_owns(&p, got[i]));
        for (size_t j = 0; j < i; j++)
            CHECK(got[i] != got[j]);
    }
    CHECK(p.free_pages == 0 && pmm_check(&p) == 0);
    for (size_t i = 0; i < n; i++)
        pmm_free(&p, got[i]);
    CHECK(p.free_pages == n && pmm_check(&p) == 0);

    /* Zeroed allocation really zeroes. */
    uint64_t pa = pmm_alloc(&p);
    memset((void *)(uintptr_t)pa, 0xab, PAGE_SIZE);
    pmm_free(&p, pa);
    uint64_t z = pmm_alloc_zeroed(&p);
    CHECK(z == pa);
    int zero = 1;
    for (size_t i = 0; i < PAGE_SIZE; i++)
        zero &= ((uint8_t *)(uintptr_t)z)[i] == 0;
    CHECK(zero);
    pmm_free(&p, z);

    /* The checker notices corruption: a foreign page, then a double free. */
    uint64_t *head = (uint64_t *)(uintptr_t)p.free_head;
    uint64_t saved = *head;
    *head = base; /* link a page the allocator does not own */
    CHECK(pmm_check(&p) == -1);
    *head = saved;
    CHECK(pmm_check(&p) == 0);
    pmm_free(&p, got[3]); /* already free: the list now has a cycle */
    CHECK(pmm_check(&p) == -2);
    free(mem);

    /* A page freed that was never handed out is caught. */
    mem = aligned_alloc(PAGE_SIZE, 8 * PAGE_SIZE);
    base = (uint64_t)(uintptr_t)mem;
    pmm_init(&p);
    pmm_add_range(&p, base, 8 * PAGE_SIZE, NULL, 0);
    CHECK(p.total_pages == 8 && pmm_check(&p) == 0);
    CHECK(pmm_alloc(&p) == base);
    pmm_free(&p, base + 5 * PAGE_SIZE);
    CHECK(pmm_check(&p) == -5);
    free(mem);
}

int main(void) {
    test_format();
    test_parse();
    test_ring();
    test_xorshift();
    test_pmm();
    test_apf_waiters();
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
