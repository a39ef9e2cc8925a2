#include "klib.h"

#ifndef HOSTED
/* gcc may emit calls to these itself, so they are plain loops that cannot
 * be turned back into calls to themselves (-fno-builtin in the Makefile). */
void *memcpy(void *dst, const void *src, size_t n) {
    uint8_t *d = dst;
    const uint8_t *s = src;
    while (n >= 8 && (((uintptr_t)d | (uintptr_t)s) & 7) == 0) {
        *(uint64_t *)d = *(const uint64_t *)s;
        d += 8;
        s += 8;
        n -= 8;
    }
    while (n--)
        *d++ = *s++;
    return dst;
}

void *memmove(void *dst, const void *src, size_t n) {
    uint8_t *d = dst;
    const uint8_t *s = src;
    if (d <= s || d >= s + n)
        return memcpy(dst, src, n);
    while (n--)
        d[n] = s[n];
    return dst;
}

void *memset(void *dst, int c, size_t n) {
    uint8_t *d = dst;
    uint64_t pattern = (uint8_t)c * 0x0101010101010101ULL;
    while (n && ((uintptr_t)d & 7)) {
        *d++ = (uint8_t)c;
        n--;
    }
    while (n >= 8) {
        *(uint64_t *)d = pattern;
        d += 8;
        n -= 8;
    }
    while (n--)
        *d++ = (uint8_t)c;
    return dst;
}

int memcmp(const void *a, const void *b, size_t n) {
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i])
            return x[i] < y[i] ? -1 : 1;
    return 0;
}

size_t strlen(const char *s) {
    size_t n = 0;
    while (s[n])
        n++;
    return n;
}

int strcmp(const char *a, const char *b) {
    while (*a && *a == *b) {
        a++;
        b++;
    }
    return (unsigned char)*a - (unsigned char)*b;
}

int strncmp(const char *a, const char *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (a[i] != b[i] || !a[i])
            return (unsigned char)a[i] - (unsigned char)b[i];
    }
    return 0;
}
#endif

struct out {
    char *buf;
    size_t size;
    size_t len;
};

static void put(struct out *o, char c) {
    if (o->len + 1 < o->size)
        o->buf[o->len] = c;
    o->len++;
}

static void put_padded(struct out *o, const char *s, size_t n, int width, int left, char pad) {
    int fill = width > (int)n ? width - (int)n : 0;
    if (!left && pad == '0' && n > 0 && s[0] == '-') {
        put(o, '-');
        s++;
        n--;
    }
    if (!left)
        while (fill-- > 0)
            put(o, pad);
    for (size_t i = 0; i < n; i++)
        put(o, s[i]);
    if (left)
        while (fill-- > 0)
            put(o, ' ');
}

int kvsnprintf(char *buf, size_t size, const char *fmt, va_list ap) {
    struct out o = {buf, size, 0};
    for (; *fmt; fmt++) {
        if (*fmt != '%') {
            put(&o, *fmt);
            continue;
        }
        fmt++;
        int left = 0;
        char pad = ' ';
        for (;; fmt++) {
            if (*fmt == '-')
                left = 1;
            else if (*fmt == '0')
                pad = '0';
            else
                break;
        }
        int width = 0;
        while (*fmt >= '0' && *fmt <= '9')
            width = width * 10 + (*fmt++ - '0');
        int longs = 0;
        while (*fmt == 'l' || *fmt == 'z') {
            longs = *fmt == 'z' ? 2 : longs + 1;
            fmt++;
        }
        char tmp[24];
        size_t n = 0;
        switch (*fmt) {
        case 'd':
        case 'i': {
            int64_t v = longs ? va_arg(ap, int64_t) : va_arg(ap, int);
            uint64_t u = v < 0 ? -(uint64_t)v : (uint64_t)v;
            char rev[24];
            size_t r = 0;
            do {
                rev[r++] = '0' + u % 10;
                u /= 10;
            } while (u);
            if (v < 0)
                tmp[n++] = '-';
            while (r)
                tmp[n++] = rev[--r];
            put_padded(&o, tmp, n, width, left, pad);
            break;
        }
        case 'u':
        case 'x':
        case 'X':
        case 'p': {
            uint64_t u;
            unsigned base = *fmt == 'u' ? 10 : 16;
            const char *digits = *fmt == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
            if (*fmt == 'p')
                u = (uint64_t)(uintptr_t)va_arg(ap, void *);
            else
                u = longs ? va_arg(ap, uint64_t) : va_arg(ap, unsigned);
            char rev[24];
            size_t r = 0;
            do {
                rev[r++] = digits[u % base];
                u /= base;
            } while (u);
            if (*fmt == 'p') {
                tmp[n++] = '0';
                tmp[n++] = 'x';
            }
            while (r)
                tmp[n++] = rev[--r];
            put_padded(&o, tmp, n, width, left, pad);
            break;
        }
        case 's': {
            const char *s = va_arg(ap, const char *);
            if (!s)
                s = "(null)";
            put_padded(&o, s, strlen(s), width, left, ' ');
            break;
        }
        case 'c':
            tmp[0] = (char)va_arg(ap, int);
            put_padded(&o, tmp, 1, width, left, ' ');
            break;
        case '%':
            put(&o, '%');
            break;
        case '\0':
            fmt--; /* a trailing '%': stop at the NUL */
            break;
        default:
            put(&o, '%');
            put(&o, *fmt);
            break;
        }
    }
    if (size > 0)
        buf[o.len < size ? o.len : size - 1] = '\0';
    return (int)o.len;
}

int ksnprintf(char *buf, size_t size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = kvsnprintf(buf, size, fmt, ap);
    va_end(ap);
    return n;
}

/* Leading decimal digits of *s into *v, advancing *s; -1 if there are
 * none or they overflow. */
static int parse_digits(const char **s, uint64_t *v) {
    const char *p = *s;
    uint64_t n = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        uint64_t d = (uint64_t)(*p - '0');
        if (n > (UINT64_MAX - d) / 10)
            return -1;
        n = n * 10 + d;
    }
    if (p == *s)
        return -1;
    *s = p;
    *v = n;
    return 0;
}

int parse_u64(const char *s, uint64_t *out) {
    uint64_t v;
    if (parse_digits(&s, &v) != 0 || *s)
        return -1;
    *out = v;
    return 0;
}

int parse_size(const char *s, uint64_t *out) {
    uint64_t v = 0;
    if (parse_digits(&s, &v) != 0)
        return -1;
    unsigned shift = 0;
    switch (*s) {
    case '\0':
        break;
    case 'k':
    case 'K':
        shift = 10;
        s++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        s++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        s++;
        break;
    default:
        return -1;
    }
    if (*s)
        return -1;
    if (shift && v > (UINT64_MAX >> shift))
        return -1;
    *out = v << shift;
    return 0;
}

int parse_size_in(const char *s, uint64_t min, uint64_t max, uint64_t *out) {
    uint64_t v;
    if (parse_size(s, &v) != 0)
        return -1;
    if (v < min || v > max)
        return -2;
    *out = v;
    return 0;
}

int parse_seconds_ns(const char *s, uint64_t *out) {
    uint64_t whole = 0, frac = 0, scale = 1000000000ULL;
    int digits = 0;
    for (; *s >= '0' && *s <= '9'; s++, digits++) {
        if (whole > (UINT64_MAX / scale - 9) / 10)
            return -1;
        whole = whole * 10 + (uint64_t)(*s - '0');
    }
    if (*s == '.') {
        s++;
        for (; *s >= '0' && *s <= '9'; s++, digits++) {
            if (scale == 1)
                return -1; /* finer than a nanosecond */
            scale /= 10;
            frac += (uint64_t)(*s - '0') * scale;
        }
    }
    if (*s || digits == 0)
        return -1;
    *out = whole * 1000000000ULL + frac;
    return 0;
}

int split_words(char *line, char **words, int max) {
    int n = 0;
    while (*line) {
        while (*line == ' ')
            *line++ = '\0';
        if (!*line || n == max)
            break;
        words[n++] = line;
        while (*line && *line != ' ')
            line++;
    }
    return n;
}

size_t ring_write(struct ring *r, const void *src, size_t n) {
    const uint8_t *s = src;
    size_t done = 0;
    while (done < n && ring_free(r)) {
        r->buf[r->tail & (r->cap - 1)] = s[done++];
        r->tail++;
    }
    return done;
}

size_t ring_read(struct ring *r, void *dst, size_t n) {
    uint8_t *d = dst;
    size_t done = 0;
    while (done < n && ring_used(r)) {
        d[done++] = r->buf[r->head & (r->cap - 1)];
        r->head++;
    }
    return done;
}
