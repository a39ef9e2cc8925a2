/* Freestanding helpers shared by the kernel, the user programs and the
 * host unit tests: memory/string functions, formatted output, a PRNG. */
#ifndef KLIB_H
#define KLIB_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef HOSTED
#include <string.h>
#else
void *memcpy(void *dst, const void *src, size_t n);
void *memmove(void *dst, const void *src, size_t n);
void *memset(void *dst, int c, size_t n);
int memcmp(const void *a, const void *b, size_t n);
size_t strlen(const char *s);
int strcmp(const char *a, const char *b);
int strncmp(const char *a, const char *b, size_t n);
#endif

/* snprintf-style formatting: %d %i %u %x %X %p %s %c %% with flags '-' '0',
 * a width, and the length modifiers l, ll, z. Always NUL-terminates when
 * size > 0; returns the length the full output would have had. */
int kvsnprintf(char *buf, size_t size, const char *fmt, va_list ap);
int ksnprintf(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Parses a plain decimal number (digits only, at least one). Returns 0 on
 * success, -1 on malformed input or overflow. */
int parse_u64(const char *s, uint64_t *out);

/* Parses a decimal number with an optional K/M/G suffix (binary units).
 * Returns 0 on success, -1 on malformed input or overflow. */
int parse_size(const char *s, uint64_t *out);

/* parse_size, and the value must lie in [min, max]: returns -2 (and leaves
 * *out alone) when it does not. */
int parse_size_in(const char *s, uint64_t min, uint64_t max, uint64_t *out);

/* Parses seconds as a decimal with up to 9 fraction digits ("1", "0.25")
 * into nanoseconds. Returns 0 on success, -1 on malformed input or overflow. */
int parse_seconds_ns(const char *s, uint64_t *out);

/* Splits `line` in place at spaces into at most `max` words. */
int split_words(char *line, char **words, int max);

/* xorshift64*: a small deterministic generator. The state must not be 0. */
static inline uint64_t xorshift64(uint64_t *state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* A single-producer/single-consumer byte ring used by pipes; the caller
 * provides locking. `cap` must be a power of two. */
struct ring {
    uint8_t *buf;
    uint32_t cap;
    uint32_t head; /* next byte to read, free-running */
    uint32_t tail; /* next byte to write, free-running */
};

static inline uint32_t ring_used(const struct ring *r) { return r->tail - r->head; }
static inline uint32_t ring_free(const struct ring *r) { return r->cap - ring_used(r); }
size_t ring_write(struct ring *r, const void *src, size_t n);
size_t ring_read(struct ring *r, void *dst, size_t n);

#endif
