#include "ulib.h"

void exit(int code) {
    syscall4(SYS_EXIT, (uint64_t)code, 0, 0, 0);
    for (;;)
        ;
}

int printf(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = kvsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    write(1, buf, n < (int)sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
    return n;
}

int report(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = kvsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return (int)syscall4(SYS_REPORT, (uint64_t)buf, n < (int)sizeof(buf) ? (size_t)n : sizeof(buf) - 1, 0, 0);
}
