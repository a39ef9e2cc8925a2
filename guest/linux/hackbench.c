/*
 * hackbench for Linux guests (seed 004's second benchmark, after Rusty
 * Russell's scheduler benchmark): GROUPS groups of 20 senders and 20
 * receivers, each a forked process, so nearly every switch changes
 * address space. Each receiver owns a pipe; every sender of its group
 * writes LOOPS messages of 100 bytes to every receiver of the group, round
 * robin, so a receiver reads 20 * LOOPS messages. The loops and the
 * start barrier are the project guest's (guest/include/pipe_bench.h), the
 * output and report keys too (guest/user/hackbench.c).
 *
 * The timed part (CLOCK_MONOTONIC, virtual time under faultline) starts
 * when every task is ready (each wrote a byte to the "ready" pipe and
 * waits on the "wake" pipe) and ends when all have exited. Prints `Time:
 * S.SSS` and reports hackbench_ns, hackbench_groups, hackbench_tasks,
 * hackbench_messages, hackbench_failed.
 *
 *   hackbench [GROUPS] [-l LOOPS]
 */
#include "common.h"
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include "report.h"
#include "../include/pipe_bench.h"

#define MAX_GROUPS 40 /* 1600 processes */
#define GROUP_TASKS (HACKBENCH_SENDERS + HACKBENCH_RECEIVERS)

static void usage(void)
{
	fprintf(stderr, "usage: hackbench [GROUPS, 1 to %d] [-l LOOPS, messages per sender and receiver]\n",
		MAX_GROUPS);
}

/* Forks a task that closes what it must not hold, waits for the start
 * and runs one side of the group. */
static pid_t start_task(int ready_w, int wake_r, const int *close_fds, int nclose, int receive_fd,
			const int *send_fds, uint64_t loops)
{
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	for (int i = 0; i < nclose; i++)
		close(close_fds[i]);
	if (hackbench_start_barrier(ready_w, wake_r))
		_exit(1);
	if (receive_fd >= 0)
		_exit(hackbench_receive(receive_fd, loops * HACKBENCH_SENDERS));
	_exit(hackbench_send(send_fds, HACKBENCH_RECEIVERS, loops));
}

int main(int argc, char **argv)
{
	uint64_t groups = 1, loops = 100;
	for (int i = 1; i < argc; i++) {
		int rc;
		if (strcmp(argv[i], "-l") == 0)
			rc = i + 1 < argc ? parse_size(argv[++i], 1, 1000000, &loops) : -1;
		else
			rc = parse_size(argv[i], 1, MAX_GROUPS, &groups);
		if (rc != 0) {
			usage();
			return 2;
		}
	}
	int ready[2], wake[2];
	if (pipe(ready) || pipe(wake)) {
		printf("hackbench: pipe failed\n");
		return 1;
	}
	static pid_t pids[MAX_GROUPS * GROUP_TASKS];
	int ntasks = 0, failed = 0;
	fflush(stdout);
	for (uint64_t g = 0; g < groups; g++) {
		int rfd[HACKBENCH_RECEIVERS], wfd[HACKBENCH_RECEIVERS];
		for (int j = 0; j < HACKBENCH_RECEIVERS; j++) {
			int fds[2];
			if (pipe(fds)) {
				printf("hackbench: pipe failed (group %" PRIu64 ")\n", g);
				return 1;
			}
			rfd[j] = fds[0];
			wfd[j] = fds[1];
		}
		/* A receiver holds only its read end (so it sees end of file
		 * if its senders die); a sender only the write ends. */
		for (int j = 0; j < HACKBENCH_RECEIVERS; j++) {
			int others[2 * HACKBENCH_RECEIVERS], n = 0;
			for (int k = 0; k < HACKBENCH_RECEIVERS; k++) {
				others[n++] = wfd[k];
				if (k != j)
					others[n++] = rfd[k];
			}
			pids[ntasks] = start_task(ready[1], wake[0], others, n, rfd[j], NULL, loops);
			if (pids[ntasks++] < 0) {
				printf("hackbench: fork failed\n");
				return 1;
			}
		}
		for (int j = 0; j < HACKBENCH_SENDERS; j++) {
			pids[ntasks] = start_task(ready[1], wake[0], rfd, HACKBENCH_RECEIVERS, -1, wfd, loops);
			if (pids[ntasks++] < 0) {
				printf("hackbench: fork failed\n");
				return 1;
			}
		}
		for (int j = 0; j < HACKBENCH_RECEIVERS; j++) {
			close(rfd[j]);
			close(wfd[j]);
		}
	}
	if (hackbench_wait_ready(ready[0], ntasks)) {
		printf("hackbench: a task did not get ready\n");
		return 1;
	}
	uint64_t start = now_ns();
	if (hackbench_wake(wake[1], ntasks)) {
		printf("hackbench: wake failed\n");
		return 1;
	}
	for (int i = 0; i < ntasks; i++) {
		int wstatus;
		if (waitpid(pids[i], &wstatus, 0) < 0 || !WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0)
			failed++;
	}
	uint64_t elapsed = now_ns() - start;
	uint64_t messages = groups * HACKBENCH_SENDERS * HACKBENCH_RECEIVERS * loops;
	printf("Running with %" PRIu64 "*40 (== %d) tasks, %" PRIu64 " messages of %d bytes.\n", groups, ntasks,
	       messages, HACKBENCH_MESSAGE_BYTES);
	printf("Time: %" PRIu64 ".%03" PRIu64 "\n", elapsed / UINT64_C(1000000000), (elapsed / UINT64_C(1000000)) % 1000);
	if (failed)
		printf("hackbench: %d tasks failed\n", failed);
	report("hackbench_ns=%" PRIu64 " hackbench_groups=%" PRIu64 " hackbench_tasks=%d hackbench_messages=%" PRIu64
	       " hackbench_failed=%d",
	       elapsed, groups, ntasks, messages, failed);
	return failed ? 1 : 0;
}
