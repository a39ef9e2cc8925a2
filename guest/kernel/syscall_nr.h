/* System call numbers, shared by the kernel and the user library. */
#ifndef SYSCALL_NR_H
#define SYSCALL_NR_H

#define SYS_WRITE 0  /* (fd, buf, len) -> bytes written */
#define SYS_EXIT 1   /* (code): ends the calling thread */
#define SYS_YIELD 2
#define SYS_SLEEP 3  /* (ns) */
#define SYS_GETCPU 4
#define SYS_TIME 5   /* (how) -> virtual ns since boot, monotonic across CPUs;
                        how = SYS_TIME_RAW: this CPU's TSC, unguarded (the
                        CPUs' TSCs differ by up to the hv's lookahead) */
#define SYS_TIME_RAW 1
#define SYS_MMAP 6   /* (len) -> address of demand-zero anonymous memory */
#define SYS_SPAWN 7  /* (entry, arg, cpu) -> tid of a new thread in this process;
                        cpu = -1 picks the least loaded CPU */
#define SYS_WAIT 8   /* (tid) -> its exit code */
#define SYS_PIPE 9   /* (int fds[2]) -> 0; fds[0] reads, fds[1] writes */
#define SYS_READ 10  /* (fd, buf, len) -> bytes read, 0 at end of file */
#define SYS_CLOSE 11 /* (fd) */
#define SYS_REPORT 12 /* (buf, len): hand a key=value line to the vmm */
#define SYS_NCPUS 13
#define SYS_GETTID 14
#define SYS_SHUTDOWN 15 /* (code): power off (the init process's last word) */
#define SYS_SPAWN_PROC 16 /* (cmdline, len, cpu) -> tid of the main thread of a new
                             process running that program; it inherits the
                             caller's pipes */
#define SYS_SEED 17 /* -> the boot option seed=S (1 without it) */
#define SYS_IPIPING 25 /* (cpu) -> TSC cycles of one IPI round trip to that CPU:
                          an x2APIC ICR write there, its handler's ICR write
                          back; -EINVAL (no such other CPU), -EAGAIN (busy) */
#define SYS_ZAP 24  /* (addr, len): MADV_DONTNEED of at most 64 pages: they read as
                       zero when touched again; -> pages dropped */

#define EINVAL 22
#define EFAULT 14
#define ENOMEM 12
#define EBADF 9
#define EAGAIN 11
#define ESRCH 3
#define ENOSYS 38
#define EPIPE 32
#define EMFILE 24
#define E2BIG_ERR 7

#endif
