/* The faultline guest kernel: shared declarations. */
#ifndef KERNEL_H
#define KERNEL_H

#include <stdint.h>
#include <stddef.h>
#include "../include/faultline_abi.h"
#include "../lib/klib.h"
#include "spinlock.h"
#include "pmm.h"
#include "apf_waiters.h"
#include "syscall_nr.h"

#define KSTACK_SIZE (16 * 1024)
#define HZ 250 /* scheduler ticks per second of virtual time */
/* A task's time slice, measured on the TSC from when it was switched in
 * (2 ticks' worth): while the host stalls a vCPU, timer ticks coalesce and
 * are lost, so counting ticks would stretch a stalled task's slice. */
#define SLICE_NS (2 * 1000000000ULL / HZ)
#define MAX_TASKS 256
#define MAX_FDS 64 /* hackbench: a group's 40 pipe ends plus two control pipes */

#define SEL_KCODE 0x08
#define SEL_KDATA 0x10
#define SEL_UDATA (0x18 | 3)
#define SEL_UCODE (0x20 | 3)
#define SEL_TSS 0x28

#define VEC_TIMER 0x20
#define VEC_RESCHED 0x21
#define VEC_APF_READY 0x22      /* page ready (both protocols), through the local APIC */
#define VEC_APF_NOTPRESENT 0x23 /* event protocol's page not present, injected by the hv: no EOI */
#define VEC_TLB_FLUSH 0x28      /* remote TLB flush request (tlb.c) */
#define VEC_IPI_PING 0x29       /* ipiping.c: answer the sender with VEC_IPI_PONG */
#define VEC_IPI_PONG 0x2a       /* ipiping.c: the answer */
#define VEC_SPURIOUS 0xff

/* User space lives in PML4 slots 1..255; slot 0 is the kernel's identity
 * map of RAM, shared by every address space. */
#define USER_BASE 0x0000008000000000ULL
#define USER_TOP 0x0000800000000000ULL
#define USER_STACK_TOP 0x00007ff000000000ULL
#define USER_STACK_SIZE (256 * 1024ULL)
#define USER_MMAP_BASE 0x0000100000000000ULL

/* ---- low level ---- */
static inline void outb(uint16_t port, uint8_t v) { __asm__ volatile("outb %0, %1" ::"a"(v), "Nd"(port)); }
static inline uint8_t inb(uint16_t port) {
    uint8_t v;
    __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}
static inline uint64_t rdmsr(uint32_t msr) {
    uint32_t lo, hi;
    __asm__ volatile("rdmsr" : "=a"(lo), "=d"(hi) : "c"(msr));
    return ((uint64_t)hi << 32) | lo;
}
static inline void wrmsr(uint32_t msr, uint64_t v) {
    __asm__ volatile("wrmsr" ::"c"(msr), "a"((uint32_t)v), "d"((uint32_t)(v >> 32)) : "memory");
}
static inline uint64_t rdtsc(void) {
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}
static inline uint64_t read_cr2(void) {
    uint64_t v;
    __asm__ volatile("mov %%cr2, %0" : "=r"(v));
    return v;
}
static inline uint64_t read_cr3(void) {
    uint64_t v;
    __asm__ volatile("mov %%cr3, %0" : "=r"(v));
    return v;
}
static inline void write_cr3(uint64_t v) { __asm__ volatile("mov %0, %%cr3" ::"r"(v) : "memory"); }
static inline void invlpg(uint64_t va) { __asm__ volatile("invlpg (%0)" ::"r"(va) : "memory"); }
static inline void cpuid(uint32_t leaf, uint32_t *a, uint32_t *b, uint32_t *c, uint32_t *d) {
    __asm__ volatile("cpuid" : "=a"(*a), "=b"(*b), "=c"(*c), "=d"(*d) : "a"(leaf), "c"(0));
}
static inline void cpu_relax(void) { __asm__ volatile("pause"); }

#define MSR_EFER 0xc0000080
#define MSR_STAR 0xc0000081
#define MSR_LSTAR 0xc0000082
#define MSR_FMASK 0xc0000084
#define MSR_GS_BASE 0xc0000101
#define MSR_KERNEL_GS_BASE 0xc0000102

/* ---- console and panics ---- */
void console_init(void);
void console_write(const char *s, size_t n);
int kprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void panic(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
void shutdown(int code) __attribute__((noreturn));
void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define KASSERT(c)                                                                 \
    do {                                                                           \
        if (!(c))                                                                  \
            panic("assertion failed: %s at %s:%d", #c, __FILE__, __LINE__);        \
    } while (0)

/* ---- traps ---- */
struct trapframe {
    uint64_t r15, r14, r13, r12, r11, r10, r9, r8;
    uint64_t rbp, rdi, rsi, rdx, rcx, rbx, rax;
    uint64_t vector, error;
    uint64_t rip, cs, rflags, rsp, ss;
};

/* ---- tasks ---- */
enum task_state { T_FREE, T_RUNNABLE, T_RUNNING, T_BLOCKED, T_SLEEPING, T_DEAD };

struct mm;
struct pipe;

struct file {
    struct pipe *pipe;
    int writer; /* 1 = write end, 0 = read end */
};

struct process {
    spinlock_t lock;
    struct mm *mm;
    int refs; /* threads alive */
    struct file fds[MAX_FDS];
};

struct task {
    uint64_t rsp;        /* saved kernel stack pointer while switched out */
    uint64_t kstack;     /* base of the kernel stack (KSTACK_SIZE bytes) */
    volatile int state;
    int tid;
    int cpu;             /* the CPU whose run queue owns the task */
    int on_cpu;          /* still running on its stack (not yet switched out) */
    int exit_code;
    int reaped;
    struct task *next;   /* run queue, sleep list or wait queue link */
    uint64_t wake_tsc;   /* for T_SLEEPING */
    struct process *proc; /* NULL for kernel threads */
    struct mm *mm;       /* address space to run in (kernel_mm for kthreads) */
    struct waitq *waiters_of_exit;
    int (*kfn)(void *);
    void *karg;
    uint64_t user_rip, user_rsp, user_a0, user_a1; /* first entry to ring 3 */
    char name[16];
};

struct waitq {
    struct task *head;
};

/* A CPU's asynchronous page fault state. The areas are where the hv
 * writes tokens; the kernel's identity map makes their addresses their
 * guest-physical addresses. */
struct apf_cpu {
    struct kvm_apf_data x86_area;        /* MSR_KVM_ASYNC_PF_EN points here */
    struct apf_event_area event_area;    /* HC_APF_ENABLE points here */
    int enabled;
    uint64_t not_present; /* not-present notifications received */
    uint64_t ready;       /* page-ready notifications received (wake-alls included) */
    uint64_t early;       /* readies that found no waiter (a ready-first node) */
    uint64_t wake_all;    /* APF_WAKE_ALL readies */
    uint64_t spurious;    /* notifications with token 0 */
};

struct cpu {
    struct cpu *self;        /* %gs:0 */
    uint64_t user_rsp;       /* %gs:8  scratch during syscall entry */
    uint64_t kernel_rsp;     /* %gs:16 top of the current task's kernel stack */
    int id;                  /* %gs:24 */
    uint32_t apic_id;
    struct task *current;
    struct task *idle;
    spinlock_t rq_lock;
    struct task *rq_head, *rq_tail;
    int rq_len;
    struct task *sleepers;   /* sorted by wake_tsc */
    uint64_t slice_start_tsc; /* when the current task was switched in */
    volatile int need_resched;
    volatile int online;
    struct mm *loaded_mm;
    uint64_t cr3;            /* the guest CR3 loaded (not a shadow root) */
    uint64_t ticks;
    uint64_t ctx_switches;
    uint64_t page_faults; /* demand-zero faults served */
    uint64_t syscalls;
    struct apf_cpu apf;
    /* pv.c, tlb.c: steal time (MSR_KVM_STEAL_TIME points here), the steal
     * clock at the last tick, remote TLB flushes and PV yields/kicks. */
    struct kvm_steal_time steal_time;
    uint64_t steal_ns;
    uint64_t tlb_shootdowns;       /* remote flushes this CPU asked for */
    uint64_t tlb_ipis;             /* flush IPIs it sent */
    uint64_t tlb_ipis_preempted;   /* of them, to a vCPU marked preempted */
    uint64_t tlb_pv_skipped;       /* targets left to the hv (PV TLB flush) */
    uint64_t tlb_flush_cycles;     /* waiting for acknowledgements, in all */
    uint64_t tlb_flush_max_cycles; /* the longest wait */
    uint64_t tlb_flushes_received; /* requests it served */
    uint64_t tlb_halts;            /* halts waiting for them (PV unhalt) */
    uint64_t pv_yields, pv_kicks;
    uint64_t gdt[7];
    struct {
        uint32_t reserved0;
        uint64_t rsp0, rsp1, rsp2;
        uint64_t reserved1;
        uint64_t ist[7];
        uint64_t reserved2;
        uint16_t reserved3;
        uint16_t iomap_base;
    } __attribute__((packed)) tss;
};

extern struct cpu cpus[MAX_CPUS];
extern int ncpus;
extern struct boot_info *boot;
extern struct pmm kpmm;
extern uint64_t tsc_hz;
extern uint32_t kvm_features; /* CPUID 0x40000001 EAX when running under a KVM-like hv */
extern uint64_t boot_seed;    /* the boot option seed=S, 1 without it (SYS_SEED) */

static inline struct cpu *this_cpu(void) {
    struct cpu *c;
    __asm__ volatile("mov %%gs:0, %0" : "=r"(c));
    return c;
}

/* cpu.c */
void cpu_init_tables(struct cpu *c); /* GDT, TSS, IDT, GS base */
void idt_init(void);
void syscall_init(void);
void apic_init(struct cpu *c);
void apic_eoi(void);
void apic_send_ipi(uint32_t apic_id, uint8_t vector);
void smp_boot(void);

/* trap.c */
void trap(struct trapframe *tf);

/* vm.c */
struct mm {
    spinlock_t lock;
    uint64_t pml4; /* physical */
    int refs;
    int nvmas;
    struct vma {
        uint64_t start, end;
    } vmas[64];
    uint64_t mmap_next;
    uint64_t stack_next;
    uint64_t resident_pages;
};
extern struct mm kernel_mm;
void vm_init(void);
struct mm *mm_create(void);
void mm_destroy(struct mm *mm);
int mm_add_vma(struct mm *mm, uint64_t start, uint64_t end);
int mm_find_vma(struct mm *mm, uint64_t va);
int vm_map_page(struct mm *mm, uint64_t va, uint64_t pa, uint64_t flags);
uint64_t vm_translate(uint64_t pml4, uint64_t va, uint64_t *flags);
int vm_handle_user_fault(struct mm *mm, uint64_t va);
int user_range_ok(struct mm *mm, uint64_t va, uint64_t len);
void vm_self_check(void);
/* Maps the 2 MiB page at `pa` in the kernel's identity map (for tests). */
void vm_map_kernel_2m(uint64_t pa);
#define PTE_P 1ULL
#define PTE_W 2ULL
#define PTE_U 4ULL
#define PTE_PS 0x80ULL
#define PTE_NX (1ULL << 63)
#define PTE_ADDR 0x000ffffffffff000ULL

/* sched.c */
void sched_init_cpu(struct cpu *c);
struct task *task_alloc(const char *name);
void task_start(struct task *t, int cpu);
struct task *kthread_create(const char *name, int (*fn)(void *), void *arg);
void schedule(void);
void yield(void);
void sched_tick(void);
void sleep_until(uint64_t tsc);
void wait_event_block(struct waitq *q, spinlock_t *lock);
void waitq_wake_all(struct waitq *q);
/* Blocking in two steps, for sleepers that publish themselves under their
 * own lock: sched_block_begin marks the current task blocked and returns
 * its CPU with the run-queue lock held (a waker on another CPU then waits
 * until the task is off the CPU); the caller drops its own lock and calls
 * sched_block_finish, which switches away until the task is woken. */
struct cpu *sched_block_begin(void);
void sched_block_finish(struct cpu *c);
/* Wakes a blocked task with wakeup preemption: it goes to the front of its
 * CPU's run queue and that CPU reschedules, so it runs next. */
void task_wake_preempt(struct task *t);
void task_exit(int code) __attribute__((noreturn));
int task_wait(int tid);
struct task *task_by_tid(int tid);
void cpu_idle_loop(void) __attribute__((noreturn));
int pick_cpu(void);
/* The TSC and virtual ns since boot, monotonic across CPUs (a global
 * last-value guard: the vCPUs' TSCs differ by up to the hv's lookahead). */
uint64_t clock_tsc(void);
uint64_t now_ns(void);
uint64_t tsc_to_ns(uint64_t tsc);
extern struct task tasks[MAX_TASKS];

/* apf.c: asynchronous page faults (KVM's x86 protocol or the event one) */
enum apf_protocol { APF_NONE, APF_X86, APF_EVENT };
extern enum apf_protocol apf_protocol;
/* Once, on the boot CPU before any apf_cpu_init: picks the protocol. */
void apf_init(int disabled_by_option);
/* Each CPU at bring-up, after apic_init: enables delivery to its area. */
void apf_cpu_init(struct cpu *c);
/* The boot-time "apf: ..." line, once every CPU is up. */
void apf_print_status(void);
/* A #PF that is an x86 page-not-present notification: the task slept until
 * the page was ready. Returns 0 for an ordinary page fault. */
int apf_x86_page_fault(struct trapframe *tf, uint64_t cr2);
/* VEC_APF_NOTPRESENT / VEC_APF_READY; return 0 if unexpected here. */
int apf_event_not_present(struct trapframe *tf);
int apf_page_ready(void);
/* Console summary and HC_REPORT line, at shutdown. */
void apf_report(void);
void apf_self_check(void); /* DEBUG kernels, from a kernel thread */

/* cr3cache.c: the paravirtual CR3 cache (seed 004) */
/* Once, on the boot CPU: whether to use it. */
void cr3cache_init(int disabled_by_option);
/* Each CPU at bring-up, with the kernel's CR3 loaded: registers its table. */
void cr3cache_cpu_init(struct cpu *c);
/* Loads `cr3` on this CPU: the cached shadow root when there is one. */
void switch_cr3(struct cpu *c, uint64_t cr3);
void cr3cache_print_status(void);
/* HC_REPORT line, at shutdown. */
void cr3cache_report(void);

/* pv.c: KVM's PV features for shared host CPUs (steal time, PV TLB
 * flush, PV sched yield, PV unhalt). */
extern int pv_steal_time, pv_tlb_flush, pv_sched_yield, pv_unhalt;
/* Once, on the boot CPU: what to use (the boot options turn each off). */
void pv_init(int no_steal, int no_tlb_flush, int no_yield, int no_unhalt);
/* Each CPU at bring-up: registers its steal-time area. */
void pv_cpu_init(struct cpu *c);
uint64_t pv_steal_clock(struct cpu *c);
/* At each timer tick: the CPU's steal clock into its accounting. */
void pv_account_steal(struct cpu *c);
/* Whether the hv says CPU `cpu`'s vCPU waits for a host CPU. */
int pv_vcpu_is_preempted(int cpu);
/* KVM_HC_SCHED_YIELD to `cpu` if it is preempted; 1 if asked. */
int pv_yield_to(int cpu);
/* KVM_HC_KICK_CPU: wakes `cpu` from a halt with interrupts off. */
void pv_kick(int cpu);
void pv_print_status(void);
void pv_report(void);

/* tlb.c: remote TLB shootdown of user mappings. */
/* Flushes [start, end) here and on every other CPU running mm. */
void tlb_shootdown(struct mm *mm, uint64_t start, uint64_t end);
/* Serves the flush requests addressed to this CPU (VEC_TLB_FLUSH). */
void tlb_serve_requests(struct cpu *c);
/* vm.c: MADV_DONTNEED of at most ZAP_MAX_PAGES pages: the pages go (they
 * read as zero when touched again), flushed from every TLB before they are
 * freed. Returns the pages dropped, or -EINVAL. */
#define ZAP_MAX_PAGES 64
int64_t vm_zap_range(struct mm *mm, uint64_t start, uint64_t end);

/* ipiping.c: IPI round trips through the x2APIC ICR (SYS_IPIPING). */
/* One round trip to CPU `target`: TSC cycles, or -EINVAL / -EAGAIN. */
int64_t ipiping_round(int target);
/* VEC_IPI_PING (0 if nobody pinged: a stray) and VEC_IPI_PONG handlers. */
int ipiping_ping(void);
void ipiping_pong(void);

/* syscall.c, user.c */
int64_t syscall_dispatch(uint64_t nr, uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3);
int start_init_process(const char *cmdline);
/* The exit status of a program the OOM killer ended (128 + SIGKILL, as a
 * shell reports it), and of a program that does not exist (as a shell). */
#define EXIT_OOM_KILLED 137
#define EXIT_NO_PROGRAM 127
/* Ends the program: its process ran out of memory on a page fault at va. */
void oom_kill(struct task *t, uint64_t va) __attribute__((noreturn));
/* Ends the calling user thread; the program's main thread ends the VM. */
void thread_exit(int code) __attribute__((noreturn));
void enter_user(uint64_t rip, uint64_t rsp, uint64_t a0, uint64_t a1) __attribute__((noreturn));

/* pipe.c */
struct pipe *pipe_create(void);
int64_t pipe_read(struct pipe *p, uint8_t *dst, uint64_t n);
int64_t pipe_write(struct pipe *p, const uint8_t *src, uint64_t n);
void pipe_close(struct pipe *p, int writer);
void pipe_ref(struct pipe *p, int writer);

/* entry.S */
void context_switch(uint64_t *save_rsp, uint64_t new_rsp);
void task_trampoline(void);
extern char isr_table[];
void syscall_entry(void);
void ap_entry(void);
extern char kernel_image_start[], kernel_image_end[];

#endif
