/*
 * The results channel of faultline's Linux programs (docs/linux.md).
 *
 * A program of the project's own guest hands its results to the hv with
 * HC_REPORT, a hypercall Linux user space cannot make (KVM refuses
 * hypercalls at CPL 3). Under Linux, /init opens a pipe and gives the
 * program its write end as file descriptor 3 (FAULTLINE_REPORT_FD); a
 * program writes one `key=value ...` line per report there, and init
 * forwards each line to the hv through faultline's report port (0x607),
 * where it becomes a report exactly like an HC_REPORT line. Run outside
 * faultline (fd 3 not open), report() does nothing.
 */
#ifndef FAULTLINE_LINUX_REPORT_H
#define FAULTLINE_LINUX_REPORT_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#define FAULTLINE_REPORT_FD 3
/* The longest line report() writes: below PIPE_BUF (4096), so that one
 * write() puts it in the pipe whole, and below what the hv's report port
 * takes (abi::REPORT_MAX, 4096). */
#define FAULTLINE_REPORT_MAX 1024

static inline void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static inline void report(const char *fmt, ...)
{
	char line[FAULTLINE_REPORT_MAX + 2];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, FAULTLINE_REPORT_MAX + 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if (n > FAULTLINE_REPORT_MAX)
		n = FAULTLINE_REPORT_MAX;
	line[n++] = '\n';
	/* A pipe write of at most PIPE_BUF bytes is atomic: lines from
	 * several threads or processes never interleave. */
	for (int done = 0; done < n;) {
		ssize_t w = write(FAULTLINE_REPORT_FD, line + done, (size_t)(n - done));
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		done += (int)w;
	}
}

#endif
