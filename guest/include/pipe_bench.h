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
