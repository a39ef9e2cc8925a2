/*
 * pagetag for Linux guests: the project guest's data-integrity check
 * (guest/user/pagetag.c), with pthreads and fork, printing the same lines
 * and reporting the same keys so the vmm checks both alike.
 *
 * `-t` threads split an `-m`-byte array into slices and, `-p` times, give
 * every page of theirs a tag naming the page and the pass: its virtual
 * address and the pass number in its first 16 bytes, a mix of both in its
 * last 8. Before a page is retagged, the tag of the previous pass is
 * checked (the first pass expects zeroes), and a last pass verifies the
 * final tags. A page the host lost, mixed up with another or brought back
 * stale (an older pass) shows up as a bad page. Prints `pagetag: N pages x
 * P passes, B bad pages` and reports `pagetag_pages=N pagetag_passes=P
 * pagetag_bad=B`; exits 1 if B > 0. `-P procs` runs that many such
 * processes at once instead (each its own address space, pinned round
 * robin over the CPUs), so address spaces switch while pages move; exits 1
 * if any of them does.
 *
 *   pagetag [-m bytes] [-p passes] [-t threads] [-P processes]
 */
#include "common.h"
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "report.h"

#define MAX_THREADS 64
#define PAGE 4096
#define SHOW_BAD 8 /* bad pages described in full, per thread */

struct slice {
	uint8_t *base;
	uint64_t first, pages; /* the thread's page range */
	uint64_t passes;
	uint64_t bad;
};

struct tag {
	uint64_t va, pass; /* at the start of the page */
	uint64_t mix;      /* in the last 8 bytes */
};

static uint64_t mix(uint64_t va, uint64_t pass)
{
	uint64_t x = va ^ (pass * 0x9e3779b97f4a7c15ULL);
	x ^= x >> 31;
	x *= 0xbf58476d1ce4e5b9ULL;
	return x ^ (x >> 29);
}

static struct tag read_tag(volatile uint64_t *page)
{
	return (struct tag){page[0], page[1], page[PAGE / 8 - 1]};
}

/* `pass` is the pass whose tag the page should carry; 0 means untouched. */
static int tag_ok(struct tag t, uint64_t va, uint64_t pass)
{
	if (pass == 0)
		return t.va == 0 && t.pass == 0 && t.mix == 0;
	return t.va == va && t.pass == pass && t.mix == mix(va, pass);
}

static void check(struct slice *s, volatile uint64_t *page, uint64_t pass)
{
	uint64_t va = (uint64_t)(uintptr_t)page;
	struct tag t = read_tag(page);
	if (tag_ok(t, va, pass))
		return;
	if (s->bad++ < SHOW_BAD)
		printf("pagetag: bad page %" PRIx64 ": want pass %" PRIu64 ", found va %" PRIx64
		       " pass %" PRIu64 " mix %" PRIx64 "\n",
		       va, pass, t.va, t.pass, t.mix);
}

static void *tagger(void *arg)
{
	struct slice *s = arg;
	/* Passes are numbered from 1 so that 0 can stand for "never written". */
	for (uint64_t pass = 1; pass <= s->passes + 1; pass++) {
		for (uint64_t pg = s->first; pg < s->first + s->pages; pg++) {
			volatile uint64_t *page = (volatile uint64_t *)(s->base + pg * PAGE);
			check(s, page, pass - 1);
			if (pass > s->passes)
				continue; /* the final verify pass */
			uint64_t va = (uint64_t)(uintptr_t)page;
			page[0] = va;
			page[1] = pass;
			page[PAGE / 8 - 1] = mix(va, pass);
		}
	}
	return NULL;
}

static int usage(void)
{
	fprintf(stderr,
		"usage: pagetag [-m bytes, at least 4K] [-p passes] [-t threads, 1 to %d] [-P processes, 1 to %d]\n",
		MAX_THREADS, MAX_THREADS);
	return 2;
}

static int tag_array(uint64_t bytes, uint64_t passes, uint64_t threads)
{
	uint64_t pages = bytes / PAGE;
	if (threads > pages)
		threads = pages;
	uint8_t *base = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED) {
		fprintf(stderr, "pagetag: cannot map %" PRIu64 " bytes: not enough guest memory\n", pages * PAGE);
		return 1;
	}
	static struct slice slices[MAX_THREADS];
	pthread_t tids[MAX_THREADS];
	int started[MAX_THREADS];
	uint64_t per = pages / threads;
	for (uint64_t i = 0; i < threads; i++) {
		uint64_t first = per * i;
		slices[i] = (struct slice){.base = base,
					   .first = first,
					   .pages = i == threads - 1 ? pages - first : per,
					   .passes = passes};
		started[i] = pthread_create(&tids[i], NULL, tagger, &slices[i]) == 0;
	}
	uint64_t bad = 0;
	int failed_threads = 0;
	for (uint64_t i = 0; i < threads; i++) {
		if (!started[i] || pthread_join(tids[i], NULL) != 0)
			failed_threads++;
		bad += slices[i].bad;
	}
	if (failed_threads)
		printf("pagetag: %d thread(s) failed to start or crashed\n", failed_threads);
	printf("pagetag: %" PRIu64 " pages x %" PRIu64 " passes, %" PRIu64 " bad pages\n", pages, passes, bad);
	report("pagetag_pages=%" PRIu64 " pagetag_passes=%" PRIu64 " pagetag_bad=%" PRIu64, pages, passes, bad);
	return bad == 0 && failed_threads == 0 ? 0 : 1;
}

/* `-P`: `procs` pagetag processes of `bytes` each, at once. */
static int run_processes(uint64_t procs, uint64_t bytes, uint64_t passes, uint64_t threads)
{
	pid_t pids[MAX_THREADS];
	int failed = 0;
	fflush(stdout);
	for (uint64_t i = 0; i < procs; i++) {
		pids[i] = fork();
		if (pids[i] == 0) {
			pin_to_cpu((int)(i % (uint64_t)online_cpus()));
			int status = tag_array(bytes, passes, threads);
			fflush(stdout);
			_exit(status);
		}
	}
	for (uint64_t i = 0; i < procs; i++) {
		int wstatus;
		if (pids[i] < 0 || waitpid(pids[i], &wstatus, 0) < 0 || !WIFEXITED(wstatus) ||
		    WEXITSTATUS(wstatus) != 0)
			failed++;
	}
	printf("pagetag: %" PRIu64 " processes, %d failed\n", procs, failed);
	report("pagetag_procs=%" PRIu64 " pagetag_failed_procs=%d", procs, failed);
	return failed == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
	uint64_t bytes = 16ULL << 20, passes = 3, threads = (uint64_t)online_cpus(), procs = 0;
	int opt;
	while ((opt = getopt(argc, argv, "m:p:t:P:")) != -1) {
		int rc = -1;
		switch (opt) {
		case 'm': rc = parse_size(optarg, PAGE, 1ULL << 40, &bytes); break;
		case 'p': rc = parse_size(optarg, 1, UINT32_MAX, &passes); break;
		case 't': rc = parse_size(optarg, 1, MAX_THREADS, &threads); break;
		case 'P': rc = parse_size(optarg, 1, MAX_THREADS, &procs); break;
		default: break;
		}
		if (rc != 0)
			return usage();
	}
	if (optind != argc)
		return usage();
	if (threads > MAX_THREADS) /* more CPUs than threads, with no -t */
		threads = MAX_THREADS;
	if (procs)
		return run_processes(procs, bytes, passes, threads);
	return tag_array(bytes, passes, threads);
}
