/* Two tasks ping-pong one byte through a pair of pipes; every round trip
 * is two context switches. Prints the mean switch time in virtual time.
 * By default the partner is another process (so each switch also changes
 * address space, as in lmbench's lat_ctx); `-t` makes it a thread. Both
 * run on the same CPU unless `-x` puts the partner on another one (then
 * every wakeup is an IPI). */
#include "ulib.h"
#include "../include/pipe_bench.h"

struct pair {
    int ping[2], pong[2];
    uint64_t rounds;
};

static int partner_thread(void *arg) {
    struct pair *p = arg;
    return ctxsw_bounce(p->ping[0], p->pong[1], p->rounds);
}

int ctxsw_main(int argc, char **argv);

int ctxsw_main(int argc, char **argv) {
    uint64_t rounds = 10000;
    int threads = 0, cross = 0;
    if (argc == 5 && strcmp(argv[1], "--child") == 0) {
        uint64_t in, out;
        if (parse_size(argv[2], &in) || parse_size(argv[3], &out) || parse_size(argv[4], &rounds))
            return 2;
        return ctxsw_bounce((int)in, (int)out, rounds);
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-t") == 0) {
            threads = 1;
        } else if (strcmp(argv[i], "-x") == 0) {
            cross = 1;
        } else if (strcmp(argv[i], "-n") != 0 || opt_size("ctxsw", argc, argv, &i, 2, UINT32_MAX, &rounds) != 0) {
            eprintf("usage: ctxsw [-t] [-x] [-n rounds, at least 2]\n");
            return 2;
        }
    }
    static struct pair p;
    p.rounds = rounds;
    if (pipe(p.ping) || pipe(p.pong)) {
        printf("ctxsw: pipe failed\n");
        return 1;
    }
    int here = getcpu();
    int cpu = cross ? (here + 1) % ncpus() : here;
    int tid;
    if (threads) {
        tid = spawn_on(partner_thread, &p, cpu);
    } else {
        char cmd[64];
        ksnprintf(cmd, sizeof(cmd), "ctxsw --child %d %d %lu", p.ping[0], p.pong[1], rounds);
        tid = spawn_proc_on(cmd, cpu);
    }
    if (tid < 0) {
        printf("ctxsw: spawn failed: %d\n", tid);
        return 1;
    }
    uint64_t elapsed;
    if (ctxsw_ping(p.ping[1], p.pong[0], rounds, time_ns, &elapsed)) {
        printf("ctxsw: pipe i/o failed\n");
        return 1;
    }
    int rc = wait_thread(tid);
    uint64_t switches = 2 * (rounds - 1);
    uint64_t ns_x100 = elapsed * 100 / switches;
    printf("ctxsw: %s on %s, %lu round trips, mean switch time %lu.%02lu us (%lu ns)\n",
           threads ? "threads" : "processes", cpu == here ? "one cpu" : "two cpus", rounds - 1, ns_x100 / 100000, (ns_x100 / 1000) % 100,
           ns_x100 / 100);
    report("ctxsw_switch_ns=%lu ctxsw_rounds=%lu ctxsw_mode=%s ctxsw_cpus=%d", ns_x100 / 100, rounds - 1,
           threads ? "threads" : "processes", cpu == here ? 1 : 2);
    return rc;
}
