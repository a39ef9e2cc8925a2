/* The user-space library: system call wrappers and printf. */
#ifndef ULIB_H
#define ULIB_H

#include <stdint.h>
#include <stddef.h>
#include "../lib/klib.h"
#include "../kernel/syscall_nr.h"

static inline int64_t syscall4(uint64_t nr, uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3) {
    int64_t ret;
    register uint64_t r10 __asm__("r10") = a3;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(nr), "D"(a0), "S"(a1), "d"(a2), "r"(r10)
                     : "rcx", "r11", "memory");
    return ret;
}

static inline int64_t write(int fd, const void *buf, size_t n) { return syscall4(SYS_WRITE, fd, (uint64_t)buf, n, 0); }
static inline int64_t read(int fd, void *buf, size_t n) { return syscall4(SYS_READ, fd, (uint64_t)buf, n, 0); }
void exit(int code) __attribute__((noreturn));
static inline void yield(void) { syscall4(SYS_YIELD, 0, 0, 0, 0); }
static inline void sleep_ns(uint64_t ns) { syscall4(SYS_SLEEP, ns, 0, 0, 0); }
static inline int getcpu(void) { return (int)syscall4(SYS_GETCPU, 0, 0, 0, 0); }
static inline int gettid(void) { return (int)syscall4(SYS_GETTID, 0, 0, 0, 0); }
static inline int ncpus(void) { return (int)syscall4(SYS_NCPUS, 0, 0, 0, 0); }
static inline uint64_t time_ns(void) { return (uint64_t)syscall4(SYS_TIME, 0, 0, 0, 0); }
static inline void *mmap_anon(size_t len) {
    int64_t r = syscall4(SYS_MMAP, len, 0, 0, 0);
    return r < 0 ? NULL : (void *)r;
}
/* A new thread running fn(arg) on the least loaded CPU, or on `cpu`. */
static inline int spawn(int (*fn)(void *), void *arg) {
    return (int)syscall4(SYS_SPAWN, (uint64_t)fn, (uint64_t)arg, (uint64_t)-1, 0);
}
static inline int spawn_on(int (*fn)(void *), void *arg, int cpu) {
    return (int)syscall4(SYS_SPAWN, (uint64_t)fn, (uint64_t)arg, (uint64_t)(int64_t)cpu, 0);
}
/* Starts a new process running the program named first in `cmd`; it
 * inherits this process's pipes. Returns the tid of its main thread. */
static inline int spawn_proc(const char *cmd) {
    return (int)syscall4(SYS_SPAWN_PROC, (uint64_t)cmd, strlen(cmd), (uint64_t)-1, 0);
}
/* The same on a given CPU. */
static inline int spawn_proc_on(const char *cmd, int cpu) {
    return (int)syscall4(SYS_SPAWN_PROC, (uint64_t)cmd, strlen(cmd), (uint64_t)(int64_t)cpu, 0);
}
static inline int wait_thread(int tid) { return (int)syscall4(SYS_WAIT, (uint64_t)tid, 0, 0, 0); }
static inline int pipe(int fds[2]) { return (int)syscall4(SYS_PIPE, (uint64_t)fds, 0, 0, 0); }
static inline int close(int fd) { return (int)syscall4(SYS_CLOSE, (uint64_t)fd, 0, 0, 0); }

/* The boot option seed=S (1 without it): the default seed of the programs'
 * random streams, so `faultline run --seed S` varies them. */
static inline uint64_t boot_seed(void) { return (uint64_t)syscall4(SYS_SEED, 0, 0, 0, 0); }

int printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* printf to stderr (fd 2): usage and error messages. */
int eprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Largest array a program accepts (the kernel's mmap limit). */
#define MAX_ARRAY_BYTES (1ULL << 40)

/* The value of option argv[*i], the next word, parsed strictly (digits
 * with an optional K/M/G suffix) and checked against [min, max]; advances
 * *i past it. A missing, malformed or out-of-range value is an error: it
 * prints why on stderr, naming the program and option, and returns -1. */
int opt_size(const char *prog, int argc, char **argv, int *i, uint64_t min, uint64_t max, uint64_t *out);
/* Hands a key=value line to the vmm (HC_REPORT through the kernel). */
int report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
