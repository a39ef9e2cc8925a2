/* hello for Linux guests: says hello with the kernel's name and the CPUs
 * it sees, so a run shows the program ran in Linux user space. */
#include <stdio.h>
#include <sys/utsname.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	struct utsname u;

	if (uname(&u) != 0) {
		perror("uname");
		return 1;
	}
	printf("hello from Linux user space: %s %s on %s, %ld CPUs online\n", u.sysname, u.release,
	       u.machine, sysconf(_SC_NPROCESSORS_ONLN));
	for (int i = 1; i < argc; i++)
		printf("argv[%d] = %s\n", i, argv[i]);
	return 0;
}
