/*
 * memtouch for Linux guests: T threads each write and then re-read their
 * share of an M byte buffer (a size with K, M or G), P passes, one word per page; then it prints the
 * time taken, a checksum of what it read back (so a page that came back
 * from the hv's swap with the wrong contents shows), and the steal time
 * Linux accounted (/proc/stat's cpu lines: the sum, then each CPU's).
 * Under `--host-mem` below the buffer the hv swaps, and Linux's own async
 * page fault code sees it. With -s each thread write-protects its share
 * after every pass and opens it again: Linux flushes the TLBs of the other
 * CPUs that ran the process (a shootdown per pass and thread, which
 * reaches preempted vCPUs through PV TLB flush).
 *
 *   memtouch [-m bytes] [-p passes] [-t threads] [-s]
 */
#include "common.h"
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL

static uint8_t *buffer;
static size_t pages_per_thread;
static int passes = 2;
static int shootdowns;

struct worker {
	pthread_t thread;
	size_t first;
	uint64_t bad;
};

static uint64_t tag(size_t page, int pass)
{
	return (page * 0x9e3779b97f4a7c15ULL) ^ (uint64_t)pass;
}

static void *work(void *arg)
{
	struct worker *w = arg;
	for (int pass = 0; pass < passes; pass++) {
		for (size_t i = 0; i < pages_per_thread; i++) {
			size_t page = w->first + i;
			uint64_t *word = (uint64_t *)(buffer + page * PAGE);
			if (pass > 0 && *word != tag(page, pass - 1))
				w->bad++;
			*word = tag(page, pass);
		}
		if (shootdowns) {
			uint8_t *share = buffer + w->first * PAGE;
			if (mprotect(share, pages_per_thread * PAGE, PROT_READ) != 0 ||
			    mprotect(share, pages_per_thread * PAGE, PROT_READ | PROT_WRITE) != 0) {
				perror("mprotect");
				exit(1);
			}
		}
	}
	return NULL;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	uint64_t bytes = 64ULL << 20, p = 0, t = 0;
	int threads = 1, opt;
	while ((opt = getopt(argc, argv, "m:p:t:s")) != -1) {
		int rc = -1;
		switch (opt) {
		case 'm': rc = opt_size("memtouch", opt, optarg, PAGE, 1ULL << 40, &bytes); break;
		case 'p':
			rc = opt_size("memtouch", opt, optarg, 1, 1000000, &p);
			passes = (int)p;
			break;
		case 't':
			rc = opt_size("memtouch", opt, optarg, 1, 64, &t);
			threads = (int)t;
			break;
		case 's':
			shootdowns = 1;
			rc = 0;
			break;
		default: break;
		}
		if (rc != 0) {
			fprintf(stderr, "usage: memtouch [-m bytes, K/M/G] [-p passes] [-t threads] [-s]\n");
			return 2;
		}
	}
	size_t pages = bytes / PAGE;
	pages_per_thread = pages / threads;
	buffer = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buffer == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	struct worker *w = calloc(threads, sizeof(*w));
	double start = now();
	for (int t = 0; t < threads; t++) {
		w[t].first = t * pages_per_thread;
		if (pthread_create(&w[t].thread, NULL, work, &w[t]) != 0) {
			perror("pthread_create");
			return 1;
		}
	}
	uint64_t bad = 0;
	for (int t = 0; t < threads; t++) {
		pthread_join(w[t].thread, NULL);
		bad += w[t].bad;
	}
	double elapsed = now() - start;
	if (bytes % (1 << 20) == 0)
		printf("memtouch: %llu MiB", (unsigned long long)(bytes >> 20));
	else
		printf("memtouch: %llu bytes", (unsigned long long)bytes);
	printf(", %d passes, %d threads: %.3f s, %llu bad pages\n", passes, threads, elapsed,
	       (unsigned long long)bad);
	FILE *stat = fopen("/proc/stat", "r");
	char line[256];
	while (stat && fgets(line, sizeof(line), stat) && strncmp(line, "cpu", 3) == 0)
		printf("memtouch: /proc/stat %s", line);
	if (stat)
		fclose(stat);
	return bad ? 1 : 0;
}
