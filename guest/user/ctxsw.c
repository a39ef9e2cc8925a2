/* Two tasks ping-pong one byte through a pair of pipes; every round trip
 * is two context switches. Prints the mean switch time in virtual time. */
#include "ulib.h"

struct pair {
    int ping[2], pong[2];
    int rounds;
};

static int partner(void *arg) {
    struct pair *p = arg;
    char c;
    for (int i = 0; i < p->rounds; i++) {
        if (read(p->ping[0], &c, 1) != 1)
            return 1;
        if (write(p->pong[1], &c, 1) != 1)
            return 1;
    }
    return 0;
}

int ctxsw_main(int argc, char **argv);

int ctxsw_main(int argc, char **argv) {
    uint64_t rounds = 10000;
    if (argc >= 3 && strcmp(argv[1], "-n") == 0 && parse_size(argv[2], &rounds) != 0)
        rounds = 10000;
    static struct pair p;
    p.rounds = (int)rounds;
    if (pipe(p.ping) || pipe(p.pong)) {
        printf("ctxsw: pipe failed\n");
        return 1;
    }
    int tid = spawn(partner, &p);
    if (tid < 0) {
        printf("ctxsw: spawn failed\n");
        return 1;
    }
    char c = 'x';
    /* One warm-up round so both stacks and buffers are faulted in. */
    uint64_t start = 0;
    for (uint64_t i = 0; i < rounds; i++) {
        if (i == 1)
            start = time_ns();
        if (write(p.ping[1], &c, 1) != 1 || read(p.pong[0], &c, 1) != 1) {
            printf("ctxsw: pipe i/o failed\n");
            return 1;
        }
    }
    uint64_t elapsed = time_ns() - start;
    int rc = wait_thread(tid);
    uint64_t switches = 2 * (rounds - 1);
    uint64_t ns_x100 = switches ? elapsed * 100 / switches : 0;
    printf("ctxsw: %lu round trips, mean switch time %lu.%02lu us (%lu ns)\n", rounds - 1,
           ns_x100 / 100000, (ns_x100 / 1000) % 100, ns_x100 / 100);
    report("ctxsw_switch_ns=%lu ctxsw_rounds=%lu", ns_x100 / 100, rounds - 1);
    return rc;
}
