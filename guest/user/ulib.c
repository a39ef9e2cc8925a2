#include "ulib.h"

void exit(int code) {
    syscall4(SYS_EXIT, (uint64_t)code, 0, 0, 0);
    for (;;)
        ;
}

static int vfdprintf(int fd, const char *fmt, va_list ap) {
    char buf[512];
    int n = kvsnprintf(buf, sizeof(buf), fmt, ap);
    write(fd, buf, n < (int)sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
    return n;
}

int printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vfdprintf(1, fmt, ap);
    va_end(ap);
    return n;
}

int eprintf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vfdprintf(2, fmt, ap);
    va_end(ap);
    return n;
}

int opt_size(const char *prog, int argc, char **argv, int *i, uint64_t min, uint64_t max, uint64_t *out) {
    const char *opt = argv[*i];
    if (*i + 1 >= argc) {
        eprintf("%s: option %s needs a value\n", prog, opt);
        return -1;
    }
    const char *val = argv[++*i];
    int rc = parse_size_in(val, min, max, out);
    if (rc == -1)
        eprintf("%s: option %s: '%s' is not a number (decimal digits, optionally K, M or G)\n", prog, opt, val);
    else if (rc == -2)
        eprintf("%s: option %s: %s is out of range (%lu to %lu)\n", prog, opt, val, min, max);
    return rc ? -1 : 0;
}

int report(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = kvsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return (int)syscall4(SYS_REPORT, (uint64_t)buf, n < (int)sizeof(buf) ? (size_t)n : sizeof(buf) - 1, 0, 0);
}
