/*
 * clockwarp for Linux guests: one thread per CPU (or -t), each pinned with
 * sched_setaffinity, reads CLOCK_MONOTONIC, publishes the value in its slot
 * of a shared array, and checks the values the others published: a value
 * read from another CPU that is later than this CPU's own clock read after
 * reading it is a warp (time went backwards across CPUs). faultline does
 * not advertise kvmclock stable, so Linux guards its kvm-clock readings
 * with a global last value (pvclock_clocksource_read) and there must be
 * none; `-r` compares raw RDTSC readings instead (each vCPU's own TSC,
 * which the hv keeps only within its lookahead of the others), converted
 * to ns with a rate calibrated against CLOCK_MONOTONIC over the run.
 *
 * Prints the counts and Linux's clocksource; reports `clockwarp_checks=C
 * clockwarp_warps=W clockwarp_worst_ns=X` (and the clocksource); exit 1 if
 * W > 0 on CLOCK_MONOTONIC.
 *
 *   clockwarp [-n iterations] [-t threads] [-r]
 */
#include "common.h"
#include "report.h"
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <x86intrin.h>

#define MAX_THREADS 64

struct slot {
	volatile uint64_t value; /* the owner's last clock reading */
	uint64_t checks, warps, worst;
	int index, pin_failed;
	pthread_t thread;
} __attribute__((aligned(64)));

static struct slot slots[MAX_THREADS];
static int nthreads, ncpus, raw;
static uint64_t iterations = 10000;
static uint64_t started;

static inline uint64_t clock_read(void)
{
	return raw ? __rdtsc() : now_ns();
}

static void *reader(void *arg)
{
	struct slot *me = arg;
	if (pin_to_cpu(me->index % ncpus) != 0)
		me->pin_failed = 1;
	__atomic_add_fetch(&started, 1, __ATOMIC_SEQ_CST);
	while (__atomic_load_n(&started, __ATOMIC_ACQUIRE) < (uint64_t)nthreads)
		__builtin_ia32_pause();
	for (uint64_t k = 0; k < iterations; k++) {
		__atomic_store_n(&me->value, clock_read(), __ATOMIC_RELEASE);
		for (int j = 0; j < nthreads; j++) {
			if (j == me->index)
				continue;
			uint64_t theirs = __atomic_load_n(&slots[j].value, __ATOMIC_ACQUIRE);
			uint64_t mine = clock_read();
			me->checks++;
			if (theirs > mine) {
				me->warps++;
				if (theirs - mine > me->worst)
					me->worst = theirs - mine;
			}
		}
	}
	return NULL;
}

static void clocksource(char *buf, size_t len)
{
	snprintf(buf, len, "unknown");
	FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
	if (!f)
		return;
	if (fgets(buf, (int)len, f))
		buf[strcspn(buf, "\n")] = 0;
	fclose(f);
}

static int usage(void)
{
	fprintf(stderr, "usage: clockwarp [-n iterations] [-t threads, 2 to %d] [-r (raw TSC)]\n", MAX_THREADS);
	return 2;
}

int main(int argc, char **argv)
{
	ncpus = online_cpus();
	uint64_t threads = ncpus < 2 ? 2 : ncpus > MAX_THREADS ? MAX_THREADS : (uint64_t)ncpus;
	for (int i = 1; i < argc; i++) {
		int rc = -1;
		if (strcmp(argv[i], "-r") == 0) {
			raw = 1;
			rc = 0;
		} else if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
			rc = parse_size(argv[++i], 1, 100000000, &iterations);
		} else if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) {
			rc = parse_size(argv[++i], 2, MAX_THREADS, &threads);
		}
		if (rc != 0)
			return usage();
	}
	nthreads = (int)threads;
	uint64_t ns0 = now_ns(), tsc0 = __rdtsc();
	for (int i = 0; i < nthreads; i++) {
		slots[i].index = i;
		if (pthread_create(&slots[i].thread, NULL, reader, &slots[i]) != 0) {
			perror("pthread_create");
			return 1;
		}
	}
	uint64_t checks = 0, warps = 0, worst = 0;
	int pin_failed = 0;
	for (int i = 0; i < nthreads; i++) {
		pthread_join(slots[i].thread, NULL);
		checks += slots[i].checks;
		warps += slots[i].warps;
		pin_failed += slots[i].pin_failed;
		if (slots[i].worst > worst)
			worst = slots[i].worst;
	}
	if (raw) {
		/* TSC cycles to ns at the rate seen over the run. */
		uint64_t dns = now_ns() - ns0, dtsc = __rdtsc() - tsc0;
		worst = dtsc ? (uint64_t)((double)worst * (double)dns / (double)dtsc) : 0;
	}
	char source[64];
	clocksource(source, sizeof(source));
	printf("clockwarp: %d threads on %d cpus x %lu iterations (%s, clocksource %s): %lu checks, %lu warps, worst %lu ns\n",
	       nthreads, ncpus, (unsigned long)iterations, raw ? "raw TSC" : "CLOCK_MONOTONIC", source,
	       (unsigned long)checks, (unsigned long)warps, (unsigned long)worst);
	if (pin_failed)
		fprintf(stderr, "clockwarp: %d threads could not be pinned\n", pin_failed);
	report("clockwarp_checks=%lu clockwarp_warps=%lu clockwarp_worst_ns=%lu clockwarp_threads=%d "
	       "clockwarp_clock=%s clockwarp_clocksource=%s",
	       (unsigned long)checks, (unsigned long)warps, (unsigned long)worst, nthreads,
	       raw ? "raw_tsc" : "monotonic", source);
	return pin_failed || (warps && !raw) ? 1 : 0;
}
