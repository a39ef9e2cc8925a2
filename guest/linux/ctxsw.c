/*
 * ctxsw for Linux guests: two tasks ping-pong one byte through a pair of
 * pipes; every round trip is two context switches (lmbench's lat_ctx with
 * no working set). The partner is a forked process by default, so each
 * switch also changes address space; `-t` makes it a thread. Both are
 * pinned to CPU 0 unless `-x` puts the partner on CPU 1 (then
 * every wakeup is an IPI). The partner's loop is the project guest's
 * (guest/include/pipe_bench.h), the output line and report keys too
 * (guest/user/ctxsw.c): `ctxsw_switch_ns ctxsw_rounds ctxsw_mode
 * ctxsw_cpus`, in CLOCK_MONOTONIC (virtual) time. The first round trip is
 * a warm-up and is not timed.
 *
 *   ctxsw [-t] [-x] [-n rounds, at least 2]
 */
#include "common.h"
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include "report.h"
#include "../include/pipe_bench.h"

struct pair {
	int ping[2], pong[2];
	uint64_t rounds;
	int cpu;
	int status;
};

static void *partner_thread(void *arg)
{
	struct pair *p = arg;
	pin_to_cpu(p->cpu);
	p->status = ctxsw_bounce(p->ping[0], p->pong[1], p->rounds);
	return NULL;
}

int main(int argc, char **argv)
{
	uint64_t rounds = 10000;
	int threads = 0, cross = 0, opt;
	while ((opt = getopt(argc, argv, "txn:")) != -1) {
		int rc = 0;
		switch (opt) {
		case 't': threads = 1; break;
		case 'x': cross = 1; break;
		case 'n': rc = parse_size(optarg, 2, UINT32_MAX, &rounds); break;
		default: rc = -1; break;
		}
		if (rc != 0) {
			fprintf(stderr, "usage: ctxsw [-t] [-x] [-n rounds, at least 2]\n");
			return 2;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "usage: ctxsw [-t] [-x] [-n rounds, at least 2]\n");
		return 2;
	}
	static struct pair p;
	p.rounds = rounds;
	if (pipe(p.ping) || pipe(p.pong)) {
		printf("ctxsw: pipe failed\n");
		return 1;
	}
	/* CPU 0 (sched_getcpu() would do, but its vDSO path runs LSL, which
	 * faultline's machine does not implement: docs/linux.md). */
	int here = 0;
	p.cpu = cross ? (here + 1) % online_cpus() : here;
	if (pin_to_cpu(here) != 0) {
		printf("ctxsw: cannot pin to cpu %d\n", here);
		return 1;
	}
	pthread_t tid;
	pid_t child = -1;
	fflush(stdout);
	if (threads) {
		if (pthread_create(&tid, NULL, partner_thread, &p) != 0) {
			printf("ctxsw: cannot start the partner thread\n");
			return 1;
		}
	} else {
		child = fork();
		if (child < 0) {
			printf("ctxsw: fork failed\n");
			return 1;
		}
		if (child == 0) {
			if (pin_to_cpu(p.cpu) != 0)
				_exit(1);
			_exit(ctxsw_bounce(p.ping[0], p.pong[1], p.rounds));
		}
	}
	uint64_t elapsed;
	if (ctxsw_ping(p.ping[1], p.pong[0], rounds, now_ns, &elapsed)) {
		printf("ctxsw: pipe i/o failed\n");
		return 1;
	}
	int rc;
	if (threads) {
		rc = pthread_join(tid, NULL) != 0 || p.status != 0;
	} else {
		int wstatus;
		rc = waitpid(child, &wstatus, 0) < 0 || !WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0;
	}
	uint64_t switches = 2 * (rounds - 1);
	uint64_t ns_x100 = elapsed * 100 / switches;
	int cpus = p.cpu == here ? 1 : 2;
	printf("ctxsw: %s on %s, %" PRIu64 " round trips, mean switch time %" PRIu64 ".%02" PRIu64 " us (%" PRIu64
	       " ns)\n",
	       threads ? "threads" : "processes", cpus == 1 ? "one cpu" : "two cpus", rounds - 1, ns_x100 / 100000,
	       (ns_x100 / 1000) % 100, ns_x100 / 100);
	report("ctxsw_switch_ns=%" PRIu64 " ctxsw_rounds=%" PRIu64 " ctxsw_mode=%s ctxsw_cpus=%d", ns_x100 / 100,
	       rounds - 1, threads ? "threads" : "processes", cpus);
	return rc;
}
