/*
 * apfcalc for Linux guests: seed 002's "testsuite" with pthreads. A writer
 * thread writes one word every `-s` bytes of an `-m`-byte array, `-l`
 * times over; with `-c` a calculation thread counts until the writer is
 * done. The loops are the project guest's (guest/include/apfcalc_core.h),
 * the output lines and report keys too (guest/user/apfcalc.c): prints the
 * writer's elapsed time (CLOCK_MONOTONIC, virtual time under faultline)
 * and the count, verifies the last loop's words (exit 1 on a mismatch),
 * and reports `apfcalc_ns apfcalc_calc apfcalc_loops apfcalc_bytes
 * apfcalc_bad`.
 *
 * With guest memory larger than what the host gives it, the writer keeps
 * touching pages the host evicted: without async PF its vCPU stalls on
 * each; with it, Linux puts the writer to sleep and runs the calculation.
 *
 *   apfcalc [-m bytes] [-l loops] [-c] [-s stride bytes, a multiple of 8]
 */
#include "common.h"
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>
#include "report.h"
#include "../include/apfcalc_core.h"

static void *writer_thread(void *arg)
{
	apfcalc_writer(arg, now_ns);
	return NULL;
}

static void *calc_thread(void *arg)
{
	struct apfcalc_calc *c = arg;
	apfcalc_count(&c->job->done, &c->count);
	return NULL;
}

static int usage(void)
{
	fprintf(stderr, "usage: apfcalc [-m bytes] [-l loops] [-c (calculation thread)] [-s stride bytes, a multiple of 8]\n");
	return 2;
}

int main(int argc, char **argv)
{
	uint64_t bytes = 48ULL << 20, loops = 3, stride = 512;
	int with_calc = 0, opt;
	while ((opt = getopt(argc, argv, "cm:l:s:")) != -1) {
		int rc = -1;
		switch (opt) {
		case 'c': with_calc = 1; rc = 0; break;
		case 'm': rc = parse_size(optarg, 8, 1ULL << 40, &bytes); break;
		case 'l': rc = parse_size(optarg, 1, UINT32_MAX, &loops); break;
		case 's':
			rc = parse_size(optarg, 8, 1ULL << 40, &stride);
			if (rc == 0 && stride % 8 != 0) {
				fprintf(stderr, "apfcalc: option -s: %" PRIu64 " is not a multiple of 8\n", stride);
				rc = -1;
			}
			break;
		default: break;
		}
		if (rc != 0)
			return usage();
	}
	if (optind != argc)
		return usage();
	static struct apfcalc_job job;
	static struct apfcalc_calc calc;
	job = (struct apfcalc_job){.words = bytes / 8, .stride_words = stride / 8, .loops = loops};
	void *array = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (array == MAP_FAILED) {
		fprintf(stderr, "apfcalc: cannot map %" PRIu64 " bytes: not enough guest memory\n", bytes);
		return 1;
	}
	job.array = array;
	calc = (struct apfcalc_calc){.job = &job};
	printf("apfcalc: writer over %" PRIu64 " MiB, stride %" PRIu64 ", %" PRIu64 " loops, %s, %d cpus\n",
	       bytes >> 20, stride, loops, with_calc ? "with a calculation thread" : "alone", online_cpus());
	fflush(stdout);
	pthread_t writer, calculator;
	if (with_calc && pthread_create(&calculator, NULL, calc_thread, &calc) != 0) {
		printf("apfcalc: cannot start the calculation thread\n");
		return 1;
	}
	if (pthread_create(&writer, NULL, writer_thread, &job) != 0) {
		printf("apfcalc: cannot start the writer thread\n");
		return 1;
	}
	int rc = pthread_join(writer, NULL);
	if (with_calc)
		rc |= pthread_join(calculator, NULL);
	uint64_t bad = apfcalc_bad_words(job.array, job.words, job.stride_words, loops);
	uint64_t us = job.elapsed_ns / 1000;
	printf("apfcalc: writer %" PRIu64 ".%06" PRIu64 " s, calculation %" PRIu64 ", %" PRIu64 " bad words\n",
	       us / 1000000, us % 1000000, calc.count, bad);
	report("apfcalc_ns=%" PRIu64 " apfcalc_calc=%" PRIu64 " apfcalc_loops=%" PRIu64 " apfcalc_bytes=%" PRIu64
	       " apfcalc_bad=%" PRIu64,
	       job.elapsed_ns, calc.count, loops, bytes, bad);
	return rc == 0 && bad == 0 ? 0 : 1;
}
