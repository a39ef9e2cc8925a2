/*
 * faultline's /init for Linux guests (the initramfs the vmm writes).
 *
 * The kernel passes what follows "--" on its command line to init as its
 * arguments: argv[1] is the program (in /bin), the rest its arguments.
 * init mounts what the programs need, runs the program with the console
 * (which the kernel opened as fds 0-2) as its standard streams, reports
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

/* faultline's guest exit-status port (docs/linux.md): a byte written here
 * becomes the exit status of `faultline run` when the VM then powers off. */
#define FAULTLINE_STATUS_PORT 0x606

static void mount_or_warn(const char *source, const char *target, const char *type)
{
	mkdir(target, 0755);
	if (mount(source, target, type, 0, NULL) != 0 && errno != EBUSY)
		fprintf(stderr, "faultline-init: mount %s on %s: %s\n", type, target, strerror(errno));
}

static void power_off(int status)
{
	fflush(stdout);
	fflush(stderr);
	/* The serial driver sends the console's output by interrupts: wait
	 * until the UART has taken all of it, or power-off would cut it. */
	tcdrain(STDOUT_FILENO);
	tcdrain(STDERR_FILENO);
	if (ioperm(FAULTLINE_STATUS_PORT, 1, 1) == 0)
		outb((unsigned char)status, FAULTLINE_STATUS_PORT);
	else
		fprintf(stderr, "faultline-init: ioperm: %s\n", strerror(errno));
	sync();
	reboot(RB_POWER_OFF);
	/* Not reached unless the kernel cannot power off. */
	fprintf(stderr, "faultline-init: reboot(RB_POWER_OFF): %s\n", strerror(errno));
	for (;;)
		pause();
}

int main(int argc, char **argv)
{
	char path[256];
	pid_t pid;
	int wstatus, status;

	mount_or_warn("proc", "/proc", "proc");
	mount_or_warn("sysfs", "/sys", "sysfs");
	mount_or_warn("devtmpfs", "/dev", "devtmpfs");
	mount_or_warn("tmpfs", "/tmp", "tmpfs");
	setvbuf(stdout, NULL, _IOLBF, 0);

	if (argc < 2) {
		fprintf(stderr, "faultline-init: no program named on the kernel command line (... -- PROGRAM ARGS)\n");
		power_off(2);
	}
	if (strchr(argv[1], '/'))
		snprintf(path, sizeof(path), "%s", argv[1]);
	else
		snprintf(path, sizeof(path), "/bin/%s", argv[1]);

	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "faultline-init: fork: %s\n", strerror(errno));
		power_off(1);
	}
	if (pid == 0) {
		execv(path, argv + 1);
		fprintf(stderr, "faultline-init: cannot run %s: %s\n", path, strerror(errno));
		_exit(127);
	}
	while (waitpid(pid, &wstatus, 0) < 0) {
		if (errno != EINTR) {
			fprintf(stderr, "faultline-init: waitpid: %s\n", strerror(errno));
			power_off(1);
		}
	}
	if (WIFEXITED(wstatus)) {
		status = WEXITSTATUS(wstatus);
		printf("faultline-init: %s exited with status %d\n", argv[1], status);
	} else {
		status = 128 + WTERMSIG(wstatus);
		printf("faultline-init: %s killed by signal %d\n", argv[1], WTERMSIG(wstatus));
	}
	power_off(status);
	return 0;
}
