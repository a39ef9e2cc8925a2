/*
 * What faultline's Linux programs share besides the results channel
 * (report.h): the virtual clock, option parsing and CPU placement.
 */
#ifndef FAULTLINE_LINUX_COMMON_H
#define FAULTLINE_LINUX_COMMON_H

#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* CLOCK_MONOTONIC in nanoseconds: under faultline, virtual time (the
 * kvm-clock or the TSC, both virtual), so a run's figures repeat. */
static inline uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* A size or count: decimal or 0x hex, with an optional K, M or G,
 * within [min, max]. 0, or -1 when malformed or out of range. */
static inline int parse_size(const char *text, uint64_t min, uint64_t max, uint64_t *out)
{
	char *end;
	unsigned long long v = strtoull(text, &end, 0);
	switch (*end) {
	case 'K': v <<= 10; end++; break;
	case 'M': v <<= 20; end++; break;
	case 'G': v <<= 30; end++; break;
	default: break;
	}
	if (end == text || *end || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

static inline int online_cpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (int)n : 1;
}

/* Pins the calling task (and what it forks later) to `cpu`. */
static inline int pin_to_cpu(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return sched_setaffinity(0, sizeof(set), &set);
}

#endif
