/* The pipe loops of ctxsw and hackbench (seed 004), shared by the project
 * guest's programs (guest/user/ctxsw.c, hackbench.c) and the Linux ones
 * (guest/linux/ctxsw.c, hackbench.c): the same messages over the same
 * pipes; only how tasks are started and timed differs. The includer
 * declares read(), write() and memset() (ulib.h, or <unistd.h> and
 * <string.h>). */
#ifndef FAULTLINE_PIPE_BENCH_H
#define FAULTLINE_PIPE_BENCH_H

#include <stdint.h>

/* hackbench: a group's senders and receivers, and the message size. */
#define HACKBENCH_SENDERS 20
#define HACKBENCH_RECEIVERS 20
#define HACKBENCH_MESSAGE_BYTES 100

/* ctxsw's partner: reads a byte from `in` and writes it back to `out`,
 * `rounds` times. 0, or 1 when a pipe fails. */
static inline int ctxsw_bounce(int in, int out, uint64_t rounds)
{
    char c;
    for (uint64_t i = 0; i < rounds; i++) {
        if (read(in, &c, 1) != 1)
            return 1;
        if (write(out, &c, 1) != 1)
            return 1;
    }
    return 0;
}

/* ctxsw's timed side: writes a byte to `out` and reads it back from
 * `in`, `rounds` times; the first round trip is a warm-up (stacks and
 * buffers get faulted in), the others are timed with `clock`
 * (nanoseconds) into *elapsed. 0, or 1 when a pipe fails. */
static inline int ctxsw_ping(int out, int in, uint64_t rounds, uint64_t (*clock)(void), uint64_t *elapsed)
{
    char c = 'x';
    uint64_t start = 0;
    for (uint64_t i = 0; i < rounds; i++) {
        if (i == 1)
            start = clock();
        if (write(out, &c, 1) != 1 || read(in, &c, 1) != 1)
            return 1;
    }
    *elapsed = clock() - start;
    return 0;
}

/* hackbench's start: waits for a byte from each of `ntasks` tasks on the
 * "ready" pipe. 0, or -1 when one did not come. */
static inline int hackbench_wait_ready(int ready_r, int ntasks)
{
    char c;
    for (int i = 0; i < ntasks; i++)
        if (read(ready_r, &c, 1) != 1)
            return -1;
    return 0;
}

/* ... then wakes them all: a byte each on the "wake" pipe. 0, or -1 when
 * the pipe fails. */
static inline int hackbench_wake(int wake_w, int ntasks)
{
    char go[64];
    memset(go, 'g', sizeof(go));
    for (int left = ntasks; left > 0;) {
        int n = left < (int)sizeof(go) ? left : (int)sizeof(go);
        if (write(wake_w, go, (size_t)n) != n)
            return -1;
        left -= n;
    }
    return 0;
}

/* hackbench's start barrier: a byte to the "ready" pipe, then one from
 * the "wake" pipe. 0, or -1 when a pipe fails. */
static inline int hackbench_start_barrier(int ready_w, int wake_r)
{
    char c = 'r';
    if (write(ready_w, &c, 1) != 1 || read(wake_r, &c, 1) != 1)
        return -1;
    return 0;
}

/* A sender: `loops` messages to each of the `n` receiver pipes `fds`,
 * round robin. 0, or 1 when a write fails. */
static inline int hackbench_send(const int *fds, int n, uint64_t loops)
{
    char msg[HACKBENCH_MESSAGE_BYTES];
    memset(msg, 's', sizeof(msg));
    for (uint64_t i = 0; i < loops; i++)
        for (int j = 0; j < n; j++)
            if (write(fds[j], msg, sizeof(msg)) != (int64_t)sizeof(msg))
                return 1;
    return 0;
}

/* A receiver: reads `messages` messages from `fd`. 0, or 1 on a short
 * pipe (end of file or an error). */
static inline int hackbench_receive(int fd, uint64_t messages)
{
    char buf[HACKBENCH_MESSAGE_BYTES];
    uint64_t want = messages * HACKBENCH_MESSAGE_BYTES;
    for (uint64_t got = 0; got < want;) {
        uint64_t ask = want - got < sizeof(buf) ? want - got : sizeof(buf);
        int64_t r = read(fd, buf, ask);
        if (r <= 0)
            return 1;
        got += (uint64_t)r;
    }
    return 0;
}

#endif
