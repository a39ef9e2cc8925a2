/* hackbench (seed 004's second benchmark, after Rusty Russell's
 * scheduler benchmark): GROUPS groups of 20 senders and 20 receivers, all
 * separate processes, so nearly every switch changes address space. Each
 * receiver owns a pipe; every sender of its group writes LOOPS messages of
 * 100 bytes to every receiver of the group (round robin over them), so a
 * receiver reads 20 * LOOPS messages. Pipes hold 40 messages: senders fill
 * them and block, receivers drain them and block, wakeups cross CPUs.
 *
 * The timed part starts when every task is ready (each wrote a byte to the
 * "ready" pipe and waits on the "wake" pipe) and ends when all have exited.
 * Prints `Time: S.SSS` (seconds of virtual time) and reports
 * hackbench_ns, hackbench_groups, hackbench_tasks, hackbench_messages. */
#include "ulib.h"
#include "../include/pipe_bench.h"

#define GROUP_SENDERS HACKBENCH_SENDERS
#define GROUP_RECEIVERS HACKBENCH_RECEIVERS
#define MESSAGE_BYTES HACKBENCH_MESSAGE_BYTES
#define MAX_GROUPS 6 /* 240 tasks: the kernel's process table holds 256 */

static int sender(const char *fd_list, uint64_t loops, int ready_w, int wake_r) {
    int fds[GROUP_RECEIVERS];
    int n = 0;
    /* "4,6,8,...": the write ends of the group's receiver pipes. */
    char word[16];
    for (const char *p = fd_list;; p++) {
        size_t len = 0;
        while (*p && *p != ',' && len + 1 < sizeof(word))
            word[len++] = *p++;
        word[len] = '\0';
        uint64_t fd;
        if (n == GROUP_RECEIVERS || parse_size(word, &fd) != 0)
            return 2;
        fds[n++] = (int)fd;
        if (*p != ',')
            break;
    }
    if (hackbench_start_barrier(ready_w, wake_r))
        return 1;
    return hackbench_send(fds, n, loops);
}

static int receiver(int fd, uint64_t messages, int ready_w, int wake_r) {
    if (hackbench_start_barrier(ready_w, wake_r))
        return 1;
    return hackbench_receive(fd, messages);
}

static void usage(void) { eprintf("usage: hackbench [GROUPS, 1 to %d] [-l LOOPS, messages per sender and receiver]\n", MAX_GROUPS); }

int hackbench_main(int argc, char **argv);

int hackbench_main(int argc, char **argv) {
    uint64_t a, b, c, d;
    if (argc == 6 && strcmp(argv[1], "--sender") == 0) {
        if (parse_size(argv[3], &a) || parse_size(argv[4], &b) || parse_size(argv[5], &c))
            return 2;
        return sender(argv[2], a, (int)b, (int)c);
    }
    if (argc == 6 && strcmp(argv[1], "--receiver") == 0) {
        if (parse_size(argv[2], &a) || parse_size(argv[3], &b) || parse_size(argv[4], &c) || parse_size(argv[5], &d))
            return 2;
        return receiver((int)a, b, (int)c, (int)d);
    }
    uint64_t groups = 1, loops = 100;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-l") == 0) {
            if (opt_size("hackbench", argc, argv, &i, 1, 1000000, &loops) != 0) {
                usage();
                return 2;
            }
        } else if (parse_size_in(argv[i], 1, MAX_GROUPS, &groups) != 0) {
            usage();
            return 2;
        }
    }
    int ready[2], wake[2];
    if (pipe(ready) || pipe(wake)) {
        printf("hackbench: pipe failed\n");
        return 1;
    }
    static int tids[MAX_GROUPS * (GROUP_SENDERS + GROUP_RECEIVERS)];
    int ntasks = 0;
    for (uint64_t g = 0; g < groups; g++) {
        int rfd[GROUP_RECEIVERS], wfd[GROUP_RECEIVERS];
        char list[GROUP_RECEIVERS * 4 + 1];
        int len = 0;
        for (int j = 0; j < GROUP_RECEIVERS; j++) {
            int fds[2];
            if (pipe(fds)) {
                printf("hackbench: pipe failed (group %lu)\n", g);
                return 1;
            }
            rfd[j] = fds[0];
            wfd[j] = fds[1];
            len += ksnprintf(list + len, sizeof(list) - (size_t)len, "%s%d", j ? "," : "", fds[1]);
        }
        char cmd[160];
        for (int j = 0; j < GROUP_RECEIVERS; j++) {
            ksnprintf(cmd, sizeof(cmd), "hackbench --receiver %d %lu %d %d", rfd[j], loops * GROUP_SENDERS, ready[1],
                      wake[0]);
            if ((tids[ntasks++] = spawn_proc(cmd)) < 0) {
                printf("hackbench: spawn failed: %d\n", tids[ntasks - 1]);
                return 1;
            }
        }
        for (int j = 0; j < GROUP_SENDERS; j++) {
            ksnprintf(cmd, sizeof(cmd), "hackbench --sender %s %lu %d %d", list, loops, ready[1], wake[0]);
            if ((tids[ntasks++] = spawn_proc(cmd)) < 0) {
                printf("hackbench: spawn failed: %d\n", tids[ntasks - 1]);
                return 1;
            }
        }
        /* The children hold the group's pipes; the next group reuses the
         * descriptor numbers. */
        for (int j = 0; j < GROUP_RECEIVERS; j++) {
            close(rfd[j]);
            close(wfd[j]);
        }
    }
    if (hackbench_wait_ready(ready[0], ntasks)) {
        printf("hackbench: a task did not get ready\n");
        return 1;
    }
    uint64_t start = time_ns();
    if (hackbench_wake(wake[1], ntasks)) {
        printf("hackbench: wake failed\n");
        return 1;
    }
    int failed = 0;
    for (int i = 0; i < ntasks; i++)
        if (wait_thread(tids[i]) != 0)
            failed++;
    uint64_t elapsed = time_ns() - start;
    uint64_t messages = groups * GROUP_SENDERS * GROUP_RECEIVERS * loops;
    printf("Running with %lu*40 (== %d) tasks, %lu messages of %d bytes.\n", groups, ntasks, messages,
           MESSAGE_BYTES);
    printf("Time: %lu.%03lu\n", elapsed / 1000000000UL, (elapsed / 1000000UL) % 1000);
    if (failed)
        printf("hackbench: %d tasks failed\n", failed);
    report("hackbench_ns=%lu hackbench_groups=%lu hackbench_tasks=%d hackbench_messages=%lu hackbench_failed=%d", elapsed,
           groups, ntasks, messages, failed);
    return failed ? 1 : 0;
}
