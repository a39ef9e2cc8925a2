/*
 * faultline's /init for Linux guests (the initramfs the vmm writes).
 *
 * The kernel passes what follows "--" on its command line to init as its
 * arguments: the program (in /bin), then its arguments. Before them it
 * passes the words of the command line it does not know itself (such as
 * nokaslr, which only the boot code reads), so the vmm also says how many
 * of the arguments are the program's: faultline_argc=N, which the kernel
 * puts in init's environment (without it, argv[1] is the program).
 * init mounts what the programs need, runs the program with the console
 * (which the kernel opened as fds 0-2) as its standard streams and the
 * write end of a pipe as fd 3 (report.h: the results channel), forwards
 * every line the program writes there to the hv's report port, reports
 * its exit status on the console and to the hv (the status port, see
 * docs/linux.md), and powers the VM off.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/io.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>
#include "report.h"

/* faultline's guest exit-status port (docs/linux.md): a byte written here
 * becomes the exit status of `faultline run` when the VM then powers off. */
#define FAULTLINE_STATUS_PORT 0x606
/* faultline's report port: bytes written here one at a time form lines;
 * each newline hands the line to the hv as a report, as HC_REPORT does. */
#define FAULTLINE_REPORT_PORT 0x607

static int have_ports;

/* Forwards one report line (without its newline) to the hv. */
static void forward_report(const char *line, size_t len)
{
	if (!have_ports)
		return;
	for (size_t i = 0; i < len; i++)
		outb((unsigned char)line[i], FAULTLINE_REPORT_PORT);
	outb('\n', FAULTLINE_REPORT_PORT);
}

/* Reads the program's report lines from `fd` until every writer has
 * closed it (the program and anything it started have exited) and
 * forwards them. A line longer than report.h's limit is cut there. */
static void forward_reports(int fd)
{
	char line[FAULTLINE_REPORT_MAX + 1];
	size_t len = 0;
	char buf[4096];
	for (;;) {
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		for (ssize_t i = 0; i < n; i++) {
			if (buf[i] == '\n') {
				forward_report(line, len);
				len = 0;
			} else if (len < FAULTLINE_REPORT_MAX) {
				line[len++] = buf[i];
			}
		}
	}
	if (len)
		forward_report(line, len);
	close(fd);
}

static void mount_or_warn(const char *source, const char *target, const char *type)
{
	mkdir(target, 0755);
	if (mount(source, target, type, 0, NULL) != 0 && errno != EBUSY)
		fprintf(stderr, "faultline-init: mount %s on %s: %s\n", type, target, strerror(errno));
}

/* Linux's own count of the hypervisor callback interrupts it took (the
 * "HYP" line of /proc/interrupts, summed over CPUs): under KVM's async PF
 * these are the page-ready notifications (wake-alls included), counted by
 * Linux's sysvec_kvm_asyncpf_interrupt. Reported to the hv as
 * `linux_hyp_interrupts=N` (nothing if the line is absent), so the vmm can
 * set the guest's count beside its own. */
static void report_hyp_interrupts(void)
{
	FILE *f = fopen("/proc/interrupts", "r");
	char text[1024];
	if (!f)
		return;
	while (fgets(text, sizeof(text), f)) {
		char *p = text;
		while (*p == ' ')
			p++;
		if (strncmp(p, "HYP:", 4) != 0)
			continue;
		unsigned long long sum = 0;
		char *end;
		p += 4;
		for (;;) {
			unsigned long long n = strtoull(p, &end, 10);
			if (end == p)
				break;
			sum += n;
			p = end;
		}
		char line[64];
		int len = snprintf(line, sizeof(line), "linux_hyp_interrupts=%llu", sum);
		forward_report(line, (size_t)len);
		break;
	}
	fclose(f);
}

/* What Linux has for programs before the program starts: /proc/meminfo's
 * MemTotal and MemAvailable (its estimate of the memory a new program can
 * use without swapping), reported as `linux_mem_total_kb=N
 * linux_mem_available_kb=M`, so a benchmark can size its program to the
 * guest (`bench apf --guest linux`) and explain an OOM kill. */
static void report_memory(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char text[256];
	unsigned long long total = 0, available = 0;
	if (!f)
		return;
	while (fgets(text, sizeof(text), f)) {
		sscanf(text, "MemTotal: %llu kB", &total);
		sscanf(text, "MemAvailable: %llu kB", &available);
	}
	fclose(f);
	char line[96];
	int len = snprintf(line, sizeof(line), "linux_mem_total_kb=%llu linux_mem_available_kb=%llu", total,
			   available);
	forward_report(line, (size_t)len);
}

static void power_off(int status)
{
	fflush(stdout);
	fflush(stderr);
	/* The serial driver sends the console's output by interrupts: wait
	 * until the UART has taken all of it, or power-off would cut it. */
	tcdrain(STDOUT_FILENO);
	tcdrain(STDERR_FILENO);
	if (have_ports)
		outb((unsigned char)status, FAULTLINE_STATUS_PORT);
	sync();
	reboot(RB_POWER_OFF);
	/* Not reached unless the kernel cannot power off. */
	fprintf(stderr, "faultline-init: reboot(RB_POWER_OFF): %s\n", strerror(errno));
	for (;;)
		pause();
}

/* Where the program and its arguments start in init's arguments. */
static int program_index(int argc)
{
	const char *count = getenv("faultline_argc");
	char *end;
	long n;

	if (!count)
		return 1;
	n = strtol(count, &end, 10);
	if (*end || n < 1 || n >= argc) {
		fprintf(stderr, "faultline-init: faultline_argc=%s does not fit %d arguments\n", count, argc - 1);
		power_off(2);
	}
	return argc - (int)n;
}

int main(int argc, char **argv)
{
	char path[256];
	pid_t pid;
	int wstatus, status;
	int reports[2];
	char **program;

	mount_or_warn("proc", "/proc", "proc");
	mount_or_warn("sysfs", "/sys", "sysfs");
	mount_or_warn("devtmpfs", "/dev", "devtmpfs");
	mount_or_warn("tmpfs", "/tmp", "tmpfs");
	setvbuf(stdout, NULL, _IOLBF, 0);

	if (argc < 2) {
		fprintf(stderr, "faultline-init: no program named on the kernel command line (... -- PROGRAM ARGS)\n");
		power_off(2);
	}
	program = argv + program_index(argc);
	if (strchr(program[0], '/'))
		snprintf(path, sizeof(path), "%s", program[0]);
	else
		snprintf(path, sizeof(path), "/bin/%s", program[0]);

	/* The ports: the status and report ports are next to each other. */
	have_ports = ioperm(FAULTLINE_STATUS_PORT, 2, 1) == 0;
	if (!have_ports)
		fprintf(stderr, "faultline-init: ioperm: %s\n", strerror(errno));
	report_memory();
	if (pipe(reports) != 0) {
		fprintf(stderr, "faultline-init: pipe: %s\n", strerror(errno));
		power_off(1);
	}
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "faultline-init: fork: %s\n", strerror(errno));
		power_off(1);
	}
	if (pid == 0) {
		close(reports[0]);
		if (reports[1] != FAULTLINE_REPORT_FD) {
			dup2(reports[1], FAULTLINE_REPORT_FD);
			close(reports[1]);
		}
		execv(path, program);
		fprintf(stderr, "faultline-init: cannot run %s: %s\n", path, strerror(errno));
		_exit(127);
	}
	close(reports[1]);
	forward_reports(reports[0]);
	while (waitpid(pid, &wstatus, 0) < 0) {
		if (errno != EINTR) {
			fprintf(stderr, "faultline-init: waitpid: %s\n", strerror(errno));
			power_off(1);
		}
	}
	report_hyp_interrupts();
	if (WIFEXITED(wstatus)) {
		status = WEXITSTATUS(wstatus);
		printf("faultline-init: %s exited with status %d\n", program[0], status);
	} else {
		status = 128 + WTERMSIG(wstatus);
		printf("faultline-init: %s killed by signal %d\n", program[0], WTERMSIG(wstatus));
	}
	power_off(status);
	return 0;
}
