/*
 * segcheck for Linux guests: the segment and debug-trap behaviour Linux
 * user space relies on, each checked against what the x86 CPU does (the
 * same binary passes on the host):
 *
 *   ldt      modify_ldt installs a 32-bit data segment; GS loaded with its
 *            LDT selector reads through the segment's base; LAR gives the
 *            descriptor's access rights
 *   gsbase   arch_prctl(ARCH_SET_GS) sets GS's base; a selector load
 *            replaces it with the descriptor's; ARCH_SET_GS again restores
 *   int80    a far call to the 32-bit user code segment (compatibility
 *            mode) and INT 0x80 getpid, the 32-bit system call
 *   step     TF set by POPF: one SIGTRAP (TRAP_TRACE) with RIP after the
 *            instruction that followed the POPF, TF cleared in the frame
 *   int3     SIGTRAP (SI_KERNEL) with RIP after the INT3
 *
 * On every CPU in turn (pinned), -n times. Prints one line per check,
 * reports `segcheck_checks=N segcheck_failures=F`, exits 1 on a failure.
 *
 *   segcheck [-n rounds]
 */
#define _GNU_SOURCE
#include "common.h"
#include "report.h"
#include <asm/ldt.h>
#include <asm/prctl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define USER32_CS 0x23
#define LDT_SELECTOR ((0 << 3) | 4 | 3)

static unsigned long checks, failures;

static void check(int ok, const char *what, int cpu, unsigned long got, unsigned long want)
{
	checks++;
	if (!ok) {
		failures++;
		printf("segcheck: FAIL %s on cpu %d: got %#lx, want %#lx\n", what, cpu, got, want);
	}
}

/* Below 4 GiB (a static, non-PIE executable): the LDT segment's base. */
static unsigned long ldt_data[4] = {0x1d70da7a, 0, 0, 0};

static void check_ldt(int cpu)
{
	struct user_desc d = {
		.entry_number = 0,
		.base_addr = (unsigned int)(unsigned long)ldt_data,
		.limit = 0xfffff,
		.seg_32bit = 1,
		.contents = 0,
		.read_exec_only = 0,
		.limit_in_pages = 1,
		.seg_not_present = 0,
		.useable = 1,
	};
	long r = syscall(SYS_modify_ldt, 1, &d, sizeof d);
	check(r == 0, "modify_ldt", cpu, r, 0);
	unsigned long v, rights, zf;
	unsigned short sel = LDT_SELECTOR;
	asm volatile("mov %w1, %%gs\n\t"
		     "mov %%gs:0, %0\n\t"
		     "xor %%eax, %%eax\n\t"
		     "mov %%ax, %%gs"
		     : "=r"(v)
		     : "r"(sel)
		     : "rax", "memory");
	check(v == ldt_data[0], "ldt: gs:0 through the LDT segment", cpu, v, ldt_data[0]);
	asm volatile("lar %2, %0\n\t"
		     "setz %b1"
		     : "=r"(rights), "=q"(zf)
		     : "r"((unsigned long)sel)
		     : "cc");
	/* Present, DPL 3, data read/write accessed; G and D/B set. */
	unsigned long want = 0xc0f300;
	check((zf & 1) && (rights & 0xf0ff00) == want, "ldt: lar", cpu, rights & 0xf0ff00, want);
}

static unsigned long gs_data[2] = {0x65b45e, 0};

static unsigned long read_gs0(void)
{
	unsigned long v;
	asm volatile("mov %%gs:0, %0" : "=r"(v) : : "memory");
	return v;
}

static void check_gsbase(int cpu)
{
	long r = syscall(SYS_arch_prctl, ARCH_SET_GS, (unsigned long)gs_data);
	check(r == 0, "arch_prctl(ARCH_SET_GS)", cpu, r, 0);
	unsigned long base = 0;
	r = syscall(SYS_arch_prctl, ARCH_GET_GS, &base);
	check(r == 0 && base == (unsigned long)gs_data, "arch_prctl(ARCH_GET_GS)", cpu, base,
	      (unsigned long)gs_data);
	check(read_gs0() == gs_data[0], "gsbase: gs:0 after ARCH_SET_GS", cpu, read_gs0(), gs_data[0]);
	/* A selector load takes the descriptor's base. */
	unsigned short sel = LDT_SELECTOR;
	unsigned long v;
	asm volatile("mov %w1, %%gs\n\t"
		     "mov %%gs:0, %0"
		     : "=r"(v)
		     : "r"(sel)
		     : "memory");
	check(v == ldt_data[0], "gsbase: gs:0 after loading the LDT selector", cpu, v, ldt_data[0]);
	asm volatile("xor %%eax, %%eax\n\t"
		     "mov %%ax, %%gs" ::: "rax");
	r = syscall(SYS_arch_prctl, ARCH_SET_GS, (unsigned long)gs_data);
	check(r == 0 && read_gs0() == gs_data[0], "gsbase: ARCH_SET_GS after a selector load", cpu,
	      read_gs0(), gs_data[0]);
	syscall(SYS_arch_prctl, ARCH_SET_GS, 0UL);
}

/* The 32-bit part: getpid (20) by INT 0x80, then back with a 32-bit far
 * return. The stack must lie below 4 GiB in compatibility mode. */
asm(".code32\n"
    "segcheck_compat:\n"
    "	movl $20, %eax\n"
    "	int $0x80\n"
    "	lret\n"
    ".code64\n");
extern char segcheck_compat[];
static unsigned char low_stack[4096] __attribute__((aligned(16)));
static unsigned char *const low_stack_top = low_stack + sizeof low_stack;
static struct {
	unsigned int offset;
	unsigned short selector;
} __attribute__((packed)) compat_target;
static unsigned long saved_rsp;

static void check_int80(int cpu)
{
	compat_target.offset = (unsigned int)(unsigned long)segcheck_compat;
	compat_target.selector = USER32_CS;
	unsigned long pid;
	asm volatile("mov %%rsp, %[saved]\n\t"
		     "mov %[top], %%rsp\n\t"
		     "lcall *%[target]\n\t"
		     "mov %[saved], %%rsp"
		     : "=a"(pid), [saved] "+m"(saved_rsp)
		     : [top] "m"(low_stack_top), [target] "m"(compat_target)
		     : "rbx", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "memory",
		       "cc");
	pid &= 0xffffffff;
	check(pid == (unsigned long)getpid(), "int80: 32-bit getpid", cpu, pid, getpid());
}

static volatile unsigned long trap_rip, trap_code, traps, trap_flags_after;

static void on_trap(int sig, siginfo_t *si, void *ctx)
{
	(void)sig;
	ucontext_t *uc = ctx;
	traps++;
	trap_rip = uc->uc_mcontext.gregs[REG_RIP];
	trap_code = si->si_code;
	uc->uc_mcontext.gregs[REG_EFL] &= ~0x100UL;
	trap_flags_after = uc->uc_mcontext.gregs[REG_EFL];
}

extern char segcheck_step_after[], segcheck_int3_after[];

static void check_traps(int cpu)
{
	traps = 0;
	asm volatile("pushfq\n\t"
		     "orq $0x100, (%%rsp)\n\t"
		     "popfq\n\t"
		     "nop\n"
		     "segcheck_step_after:\n\t"
		     "nop\n\t"
		     "nop" ::: "memory", "cc");
	check(traps == 1, "step: one SIGTRAP", cpu, traps, 1);
	check(trap_rip == (unsigned long)segcheck_step_after, "step: RIP after the instruction", cpu,
	      trap_rip, (unsigned long)segcheck_step_after);
	check(trap_code == TRAP_TRACE, "step: si_code TRAP_TRACE", cpu, trap_code, TRAP_TRACE);
	traps = 0;
	asm volatile("int3\n"
		     "segcheck_int3_after:\n\t"
		     "nop" ::: "memory");
	check(traps == 1, "int3: one SIGTRAP", cpu, traps, 1);
	check(trap_rip == (unsigned long)segcheck_int3_after, "int3: RIP after INT3", cpu, trap_rip,
	      (unsigned long)segcheck_int3_after);
	check(trap_code == SI_KERNEL, "int3: si_code SI_KERNEL", cpu, trap_code, SI_KERNEL);
}

int main(int argc, char **argv)
{
	uint64_t rounds = 3;
	int opt;
	while ((opt = getopt(argc, argv, "n:")) != -1) {
		if (opt != 'n') {
			fprintf(stderr, "usage: segcheck [-n rounds]\n");
			return 2;
		}
		if (opt_size(argv[0], opt, optarg, 1, 1000000, &rounds) != 0)
			return 2;
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_trap;
	sa.sa_flags = SA_SIGINFO;
	sigaction(SIGTRAP, &sa, NULL);
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	for (uint64_t n = 0; n < rounds; n++) {
		for (int cpu = 0; cpu < cpus; cpu++) {
			if (pin_to_cpu(cpu) != 0) {
				printf("segcheck: cannot pin to cpu %d\n", cpu);
				return 1;
			}
			check_ldt(cpu);
			check_gsbase(cpu);
			check_int80(cpu);
			check_traps(cpu);
		}
	}
	printf("segcheck: %lu checks on %ld CPUs, %lu failures\n", checks, cpus, failures);
	report("segcheck_checks=%lu segcheck_failures=%lu", checks, failures);
	return failures != 0;
}
