/*
 * What faultline's Linux programs share besides the results channel
 * (report.h): the virtual clock, option parsing and CPU placement.
 */
#ifndef FAULTLINE_LINUX_COMMON_H
#define FAULTLINE_LINUX_COMMON_H

#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
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

/* A size or count, as the project guest's programs take them
 * (guest/README.md): decimal digits with an optional K, M or G (x 1024^n),
 * within [min, max]. 0, or -1 when malformed or out of range. */
static inline int parse_size(const char *text, uint64_t min, uint64_t max, uint64_t *out)
{
	uint64_t v = 0;
	const char *p = text;
	if (*p < '0' || *p > '9')
		return -1;
	for (; *p >= '0' && *p <= '9'; p++) {
		if (v > (UINT64_MAX - (uint64_t)(*p - '0')) / 10)
			return -1;
		v = v * 10 + (uint64_t)(*p - '0');
	}
	int shift = 0;
	switch (*p) {
	case 'K': shift = 10; p++; break;
	case 'M': shift = 20; p++; break;
	case 'G': shift = 30; p++; break;
	default: break;
	}
	if (*p || v > (UINT64_MAX >> shift))
		return -1;
	v <<= shift;
	if (v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

/* Option -`opt`'s value as parse_size reads it, or a message on stderr
 * naming the program, the option and the range: 0, or -1. */
static inline int opt_size(const char *prog, int opt, const char *val, uint64_t min, uint64_t max,
			   uint64_t *out)
{
	if (parse_size(val, min, max, out) == 0)
		return 0;
	fprintf(stderr, "%s: option -%c: '%s' is not a number from %llu to %llu (decimal digits, optionally K, M or G)\n",
		prog, opt, val, (unsigned long long)min, (unsigned long long)max);
	return -1;
}

/* A number of seconds, fractions allowed (`0.2`), from 0 to `max`: 0, or
 * -1 with a message on stderr. */
static inline int opt_seconds(const char *prog, int opt, const char *val, double max, double *out)
{
	char *end;
	double v = strtod(val, &end);
	if (end != val && !*end && v >= 0 && v <= max && *val >= '0' && *val <= '9') {
		*out = v;
		return 0;
	}
	fprintf(stderr, "%s: option -%c: '%s' is not a number of seconds from 0 to %g\n", prog, opt, val, max);
	return -1;
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
