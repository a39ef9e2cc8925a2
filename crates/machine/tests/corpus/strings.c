/* String and memory routines as a freestanding kernel writes them. */
typedef unsigned long size_t;

void *memcpy(void *d, const void *s, size_t n) {
    unsigned char *dd = d;
    const unsigned char *ss = s;
    while (n--) *dd++ = *ss++;
    return d;
}

void *memset(void *d, int c, size_t n) {
    unsigned char *dd = d;
    while (n--) *dd++ = (unsigned char)c;
    return d;
}

void *memmove(void *d, const void *s, size_t n) {
    unsigned char *dd = d;
    const unsigned char *ss = s;
    if (dd < ss) {
        while (n--) *dd++ = *ss++;
    } else {
        while (n--) dd[n] = ss[n];
    }
    return d;
}

int memcmp(const void *a, const void *b, size_t n) {
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) return x[i] - y[i];
    return 0;
}

size_t strlen(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return n;
}

int strcmp(const char *a, const char *b) {
    while (*a && *a == *b) { a++; b++; }
    return (unsigned char)*a - (unsigned char)*b;
}

char *strncpy(char *d, const char *s, size_t n) {
    size_t i = 0;
    for (; i < n && s[i]; i++) d[i] = s[i];
    for (; i < n; i++) d[i] = 0;
    return d;
}

static char hexdig[] = "0123456789abcdef";

int format_u64(char *buf, unsigned long v, int base) {
    char tmp[32];
    int n = 0;
    do { tmp[n++] = hexdig[v % base]; v /= base; } while (v);
    for (int i = 0; i < n; i++) buf[i] = tmp[n - 1 - i];
    buf[n] = 0;
    return n;
}

int format_i64(char *buf, long v) {
    if (v < 0) { buf[0] = '-'; return 1 + format_u64(buf + 1, -(unsigned long)v, 10); }
    return format_u64(buf, v, 10);
}

int parse_int(const char *s, long *out) {
    long sign = 1, v = 0;
    if (*s == '-') { sign = -1; s++; }
    if (!*s) return -1;
    while (*s) {
        if (*s < '0' || *s > '9') return -1;
        v = v * 10 + (*s++ - '0');
    }
    *out = v * sign;
    return 0;
}
