/*
 * Seed 000's benchmark (Gleb Natapov, "KVM: Add host swap event
 * notifications for PV guest", v6 00/12, 4 Oct 2010), as the seed wrote
 * it, for Linux guests: -f threads write to random pages of an -m byte
 * array, -w threads increment counters, for -t seconds; each work
 * thread's count is printed and their sum as "total: N".
 *
 * The seed's listing (/work/shared/seeds/000_*.txt) lost its braces,
 * `break`s and some whole lines. Restored here, each marked RESTORED
 * (docs/linux.md lists them):
 *   - the braces of every function, loop, `switch` and `for` body, and the
 *     `break` after every `case` (the listing falls through from -f to -w
 *     to -m...);
 *   - `int ft = 1, wt = 1;`: the thread counts, used but never declared
 *     in the listing (one of each by default, like the seed's usage line);
 *   - `pthread_barrier_wait(&barrier);` at the start and the end of both
 *     thread functions, and twice in main: after the prefault (the start:
 *     the barrier counts ft + wt + 1 parties) and after `stop = 1` (the
 *     end, on the barrier main re-initialises while the threads run; a
 *     race, CHANGED below: the end waits on a barrier of its own);
 *   - `(*i)++;`, the work thread's loop body ("increment counter");
 *   - `sleep(timeout);` between the re-initialisation and `stop = 1`;
 *   - `verbose = 1;` for -v, and a `default:` case with `exit(1)` for
 *     the usage line (the listing prints the usage under -v);
 *   - `pthread_attr_init(&pattr);` (pattr is used uninitialised).
 * Changed, for faultline's benchmark (each marked CHANGED): -t takes
 * fractions of a second (nanosleep instead of sleep), every option is
 * read as the project guest's bm reads it (common.h: -m a size in bytes
 * with K, M or G, at least a page, where atoi stopped at 2 GiB and
 * `-m 64M` read 64 bytes, then divided by 0 pages; counts and seconds
 * checked), a bad value or option is a usage error with status 2, and
 * the total
 * also goes to the hv as a report line (report.h), with the timed part's
 * length as main saw it (from the start barrier to the end one: stop = 1
 * comes late when main's CPU or main itself waits for a page).
 * Added (ADDED): -n N, a fixed amount of work instead of -t: every fault
 * thread writes N pages and every work thread counts to N, then each
 * stops on its own (a workload timed on other machines, e.g.
 * scripts/qemu-linux.sh --seeds); the loops without -n are the seed's.
 */
#include "common.h"		/* CHANGED: option parsing */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>
#include <time.h>		/* CHANGED: nanosleep */
#include "report.h"		/* CHANGED: the results channel */

#define TIMEOUT 5
#define MEMORY 1024*1024*1024
#define MAX_THREADS 64			/* CHANGED: -f and -w checked */
#define MAX_ARRAY (1ULL << 40)		/* CHANGED: -m checked */

pthread_barrier_t barrier;
pthread_barrier_t end_barrier;	/* CHANGED: the end's own barrier */
volatile int stop;
size_t pages;
unsigned long limit;		/* ADDED: -n, 0 for the seed's -t */
int ft = 1, wt = 1;		/* RESTORED */

void *fault_thread(void* p)
{				/* RESTORED: braces */
	char *mem = p;

	pthread_barrier_wait(&barrier);	/* RESTORED */

	if (limit) {		/* ADDED: -n */
		for (unsigned long n = 0; n < limit; n++)
			mem[(random() % pages) << 12] = 10;
	} else {
		while (!stop)
			mem[(random() % pages) << 12] = 10;
	}

	pthread_barrier_wait(&end_barrier);	/* RESTORED; CHANGED: end_barrier */

	return NULL;
}

void *work_thread(void* p)
{
	unsigned long *i = p;

	pthread_barrier_wait(&barrier);	/* RESTORED */

	if (limit) {		/* ADDED: -n; volatile, one load and store each, as the seed's loop */
		volatile unsigned long *v = i;
		while (*v < limit)
			(*v)++;
	} else {
		while (!stop)
			(*i)++;		/* RESTORED */
	}

	pthread_barrier_wait(&end_barrier);	/* RESTORED; CHANGED: end_barrier */

	return NULL;
}

static void usage(const char *prog)	/* CHANGED: exit 2, as every program's */
{
	fprintf(stderr, "Usage %s [-f num] [-w num] [-m bytes, K/M/G] [-t secs | -n iterations]\n", prog);
	exit(2);
}

int main(int argc, char **argv)
{
	double timeout = TIMEOUT;	/* CHANGED: fractions of a second */
	size_t mem = MEMORY;
	void *buf;
	int i, opt, verbose = 0;
	pthread_t t;
	pthread_attr_t pattr;
	unsigned long *res, sum = 0;

	while((opt = getopt(argc, argv, "f:w:m:t:n:v")) != -1) {
		uint64_t v = 0;	/* CHANGED: checked values */
		int rc = 0;
		switch (opt) {
		case 'f':
			rc = opt_size("bm", opt, optarg, 0, MAX_THREADS, &v);	/* CHANGED: atoi */
			ft = (int)v;
			break;	/* RESTORED */
		case 'w':
			rc = opt_size("bm", opt, optarg, 0, MAX_THREADS, &v);	/* CHANGED: atoi */
			wt = (int)v;
			break;	/* RESTORED */
		case 'm':
			rc = opt_size("bm", opt, optarg, 4096, MAX_ARRAY, &v);	/* CHANGED: atoi */
			mem = (size_t)v;
			break;	/* RESTORED */
		case 't':
			rc = opt_seconds("bm", opt, optarg, 1e6, &timeout);	/* CHANGED: atoi */
			limit = 0;	/* ADDED: the last of -t and -n counts */
			break;	/* RESTORED */
		case 'n':	/* ADDED */
			rc = opt_size("bm", opt, optarg, 1, UINT32_MAX, &v);
			limit = (unsigned long)v;
			timeout = 0;
			break;
		case 'v':
			verbose = 1;	/* RESTORED */
			break;	/* RESTORED */
		default:	/* RESTORED */
			rc = -1;
		}
		if (rc != 0)	/* CHANGED: a usage error, status 2 */
			usage(argv[0]);
	}
	if (ft + wt == 0)	/* CHANGED */
		usage(argv[0]);

	if (verbose)
		printf("fault=%d work=%d mem=%lu timeout=%g\n", ft, wt, (unsigned long)mem, timeout);

	pages = mem >> 12;
	if (posix_memalign(&buf, 4096, pages << 12) != 0) {	/* CHANGED: checked */
		fprintf(stderr, "bm: cannot allocate %lu bytes\n", (unsigned long)mem);
		return 1;
	}
	res = malloc(sizeof (unsigned long) * wt);
	memset(res, 0, sizeof (unsigned long) * wt);

	pthread_barrier_init(&barrier, NULL, ft + wt + 1);
	pthread_barrier_init(&end_barrier, NULL, ft + wt + 1);	/* CHANGED */
	pthread_attr_init(&pattr);	/* RESTORED */

	for (i = 0; i < ft; i++) {
		pthread_create(&t, &pattr, fault_thread, buf);
	}

	for (i = 0; i < wt; i++) {
		pthread_create(&t, &pattr, work_thread, &res[i]);
	}

	/* prefault memory */
	memset(buf, 0, pages << 12);

	pthread_barrier_wait(&barrier);	/* RESTORED */
	struct timespec t0, t1;	/* CHANGED: the timed part's length */
	clock_gettime(CLOCK_MONOTONIC, &t0);

	/* CHANGED: the seed re-initialised `barrier` here for the end, while
	 * the threads could still be inside its first wait (a woken waiter
	 * reads the barrier on its way out): with more than one CPU they
	 * then all slept in the end barrier for good. The end has its own. */
	if (!limit) {		/* CHANGED: sleep(timeout), in fractions; ADDED: not with -n */
		struct timespec ts = { (time_t)timeout,
				       (long)((timeout - (time_t)timeout) * 1e9) };
		while (nanosleep(&ts, &ts) != 0)
			;
	}
	stop = 1;

	pthread_barrier_wait(&end_barrier);	/* RESTORED; CHANGED: end_barrier */
	clock_gettime(CLOCK_MONOTONIC, &t1);	/* CHANGED */

	for (i = 0; i < wt; i++) {
		sum += res[i];
		printf("worker %d: %lu\n", i, res[i]);
	}
	printf("total: %lu\n", sum);
	/* CHANGED: the figures for faultline's bench, through init. */
	report("bm_total=%lu bm_fault_threads=%d bm_work_threads=%d bm_array_bytes=%lu bm_timeout_ns=%lu "
	       "bm_elapsed_ns=%lu bm_iterations=%lu",
	       sum, ft, wt, (unsigned long)mem, (unsigned long)(timeout * 1e9),
	       (unsigned long)((t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec)), limit);

	return 0;
}
