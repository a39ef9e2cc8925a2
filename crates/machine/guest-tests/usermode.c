/* usermode.c: ring 3, SYSCALL/SYSRET and faults from user mode.
 *
 * The program marks its own image user-accessible (everything below it,
 * including the machine's GDT and TSS, stays supervisor-only), then:
 *   1. enters ring 3 with IRETQ; the user code makes system calls with
 *      SYSCALL (STAR/LSTAR/FMASK programmed here, return with SYSRETQ),
 *      and triggers #GP (HLT, INT to a DPL-0 gate), #PF (supervisor page,
 *      read and write), #UD and a permitted INT 0x80; each fault must be
 *      delivered on the TSS's RSP0 stack with the user's CS/SS/RSP saved;
 *   2. enters ring 3 again with SYSRETQ;
 *   3. runs user code that touches a supervisor page with no fixup: the
 *      kernel "kills" it from the #PF handler.
 * Throughout, SWAPGS switches between the kernel's per-CPU GS and the
 * user's. Exits 0 when every check passes. */
#include "rt.h"

extern char __image_start[], __image_end[];

#define SYS_WRITE 1
#define SYS_ADD 2
#define SYS_EXIT 3

#define RFLAGS_TF (1ull << 8)
#define RFLAGS_AC (1ull << 18)
#define RFLAGS_IOPL (3ull << 12)
#define MSR_FMASK_VALUE (RFLAGS_IF | RFLAGS_DF | RFLAGS_TF | RFLAGS_AC)

#define PF_P 1u
#define PF_W 2u
#define PF_U 4u

#define SUPERVISOR_ADDR 0x1000ull /* the machine's GDT page */

static u8 user_stack[4 * 4096] __attribute__((aligned(4096)));
static u8 syscall_stack[4 * 4096] __attribute__((aligned(16)));

/* Per-CPU data, reached through GS in the kernel as Linux does: SWAPGS on
 * kernel entry from ring 3 and before the return to it exchanges GS_BASE
 * and KERNEL_GS_BASE, so the kernel runs with GS = &percpu and ring 3 with
 * GS = &user_tls. The assembly below uses the offsets. */
#define PERCPU_MAGIC 0x7065726370755f30ull
#define USER_TLS_MAGIC 0x757365725f746c73ull
struct percpu {
    u64 syscall_stack_top; /* 0 */
    u64 user_rsp;          /* 8 */
    u64 user_rip;          /* 16 */
    u64 user_rflags;       /* 24 */
    u64 magic;             /* 32 */
};
static struct percpu percpu = { .magic = PERCPU_MAGIC };
static const u64 user_tls[1] = { USER_TLS_MAGIC };

/* Shared with the assembly below. */
u64 kernel_saved_rsp;
volatile u64 resume_rip;

/* Runs `rip` in ring 3 on stack `rsp` with RFLAGS.IF set, until the kernel
 * calls return_to_kernel(value); returns value. */
u64 enter_user_iret(u64 rip, u64 rsp);
u64 enter_user_sysret(u64 rip, u64 rsp);
__attribute__((noreturn)) void return_to_kernel(u64 value);
void syscall_entry(void);
u64 syscall_dispatch(u64 nr, u64 a1, u64 a2, u64 a3);

__asm__(".text\n"
        "enter_user_iret:\n"
        "    push %rbx\n"
        "    push %rbp\n"
        "    push %r12\n"
        "    push %r13\n"
        "    push %r14\n"
        "    push %r15\n"
        "    mov %rsp, kernel_saved_rsp(%rip)\n"
        "    swapgs\n"
        "    pushq $0x1b\n" /* SS: user data */
        "    push %rsi\n"   /* RSP */
        "    pushq $0x202\n" /* RFLAGS: IF */
        "    pushq $0x23\n" /* CS: user code */
        "    push %rdi\n"   /* RIP */
        "    iretq\n"
        "\n"
        "enter_user_sysret:\n"
        "    push %rbx\n"
        "    push %rbp\n"
        "    push %r12\n"
        "    push %r13\n"
        "    push %r14\n"
        "    push %r15\n"
        "    mov %rsp, kernel_saved_rsp(%rip)\n"
        "    mov %rdi, %rcx\n"   /* SYSRET: RIP from RCX */
        "    mov $0x202, %r11\n" /* RFLAGS from R11 */
        "    mov %rsi, %rsp\n"
        "    swapgs\n"
        "    sysretq\n"
        "\n"
        "return_to_kernel:\n"
        "    mov kernel_saved_rsp(%rip), %rsp\n"
        "    mov %rdi, %rax\n"
        "    pop %r15\n"
        "    pop %r14\n"
        "    pop %r13\n"
        "    pop %r12\n"
        "    pop %rbp\n"
        "    pop %rbx\n"
        "    ret\n"
        "\n"
        /* SYSCALL: RCX = user RIP, R11 = user RFLAGS, RSP still the user's. */
        "syscall_entry:\n"
        "    swapgs\n"
        "    mov %rsp, %gs:8\n"
        "    mov %gs:0, %rsp\n"
        "    mov %rcx, %gs:16\n"
        "    mov %r11, %gs:24\n"
        "    push %rcx\n"
        "    push %r11\n"
        "    mov %rdx, %rcx\n"
        "    mov %rsi, %rdx\n"
        "    mov %rdi, %rsi\n"
        "    mov %rax, %rdi\n"
        "    call syscall_dispatch\n"
        "    pop %r11\n"
        "    pop %rcx\n"
        "    mov %gs:8, %rsp\n"
        "    swapgs\n"
        "    sysretq\n");

/* ---- kernel side ---------------------------------------------------------- */

static volatile struct {
    u64 count, cs, ss, rflags, gs_magic;
} ksys;

u64 syscall_dispatch(u64 nr, u64 a1, u64 a2, u64 a3)
{
    ksys.count++;
    ksys.cs = read_cs();
    ksys.ss = read_ss();
    ksys.rflags = read_rflags();
    u64 magic;
    __asm__ volatile("mov %%gs:32, %0" : "=r"(magic));
    ksys.gs_magic = magic;
    switch (nr) {
    case SYS_WRITE:
        for (u64 i = 0; i < a2; i++)
            putc(((const char *)a1)[i]);
        return a2;
    case SYS_ADD:
        return a1 + a2 + a3;
    case SYS_EXIT:
        return_to_kernel(a1);
    default:
        return ~0ull;
    }
}

struct trap_record {
    u64 vector, error_code, rip, cs, ss, rsp, cr2, frame;
};
#define MAX_TRAPS 16
static volatile struct trap_record traps[MAX_TRAPS];
static volatile u64 trap_count;

static void user_trap(struct trap_frame *f)
{
    if (trap_count < MAX_TRAPS) {
        volatile struct trap_record *r = &traps[trap_count];
        r->vector = f->vector;
        r->error_code = f->error_code;
        r->rip = f->rip;
        r->cs = f->cs;
        r->ss = f->ss;
        r->rsp = f->rsp;
        r->cr2 = read_cr2();
        r->frame = (u64)f;
    }
    trap_count++;
    if (!resume_rip && (f->cs & 3) == 0) {
        /* A kernel fault with no fixup would repeat forever. */
        printf("unexpected kernel exception: vector %llu error %#llx rip %#llx cr2 %#llx\n",
               f->vector, f->error_code, f->rip, read_cr2());
        exit(0x7e);
    }
    if (resume_rip) {
        f->rip = resume_rip;
        resume_rip = 0;
    } else if ((f->cs & 3) == 3 && f->vector != 0x80) {
        /* An unexpected user fault kills the user program. This entry
         * did not SWAPGS (the handler needs no per-CPU data); the kernel
         * expects its own GS back. */
        __asm__ volatile("swapgs" : : : "memory");
        return_to_kernel(0xdead0000 | f->vector);
    }
}

/* ---- user side (runs at CPL 3: no port I/O, only system calls) ------------ */

static inline u64 syscall3(u64 nr, u64 a1, u64 a2, u64 a3)
{
    __asm__ volatile("syscall"
                     : "+a"(nr), "+D"(a1), "+S"(a2), "+d"(a3)
                     :
                     : "rcx", "r8", "r9", "r10", "r11", "memory", "cc");
    return nr;
}

/* What the user code observed; checked by the kernel afterwards. */
static volatile struct {
    u64 cs, ss, rflags, tls_magic;
    u64 write_ret, add_ret, df_syscall_ret, rflags_after_df_syscall;
    u64 fault_rip[8];
    u64 int80_after;
    u64 sysret_cs, sysret_ss, sysret_add;
} ulog;

/* Arms resume_rip with label 1 and stores the address of label 0 (the
 * faulting instruction) in operand 0. */
#define ARM_RESUME                     \
    "lea 1f(%%rip), %%rax\n\t"         \
    "mov %%rax, resume_rip(%%rip)\n\t" \
    "lea 0f(%%rip), %0\n\t"

static void user_main(void)
{
    static const char msg[] = "hello from ring 3\n";
    u64 at;
    ulog.cs = read_cs();
    ulog.ss = read_ss();
    ulog.rflags = read_rflags();
    {
        u64 magic;
        __asm__ volatile("mov %%gs:0, %0" : "=r"(magic));
        ulog.tls_magic = magic;
    }
    ulog.write_ret = syscall3(SYS_WRITE, (u64)msg, sizeof(msg) - 1, 0);
    ulog.add_ret = syscall3(SYS_ADD, 40, 2, 100);

    /* DF set by the user survives the system call (SYSRET restores RFLAGS
     * from R11) while FMASK clears it for the kernel. */
    {
        u64 nr = SYS_ADD, a1 = 1, a2 = 2, a3 = 3, flags;
        __asm__ volatile("std\n\t"
                         "syscall\n\t"
                         "pushfq\n\t"
                         "popq %4\n\t"
                         "cld\n\t"
                         : "+a"(nr), "+D"(a1), "+S"(a2), "+d"(a3), "=r"(flags)
                         :
                         : "rcx", "r8", "r9", "r10", "r11", "memory", "cc");
        ulog.df_syscall_ret = nr;
        ulog.rflags_after_df_syscall = flags;
    }

    /* HLT at CPL 3: #GP(0). */
    __asm__ volatile(ARM_RESUME "0: hlt\n\t1:\n\t" : "=&r"(at) : : "rax", "memory");
    ulog.fault_rip[0] = at;
    /* Read of a supervisor page: #PF(P|U). */
    __asm__ volatile(ARM_RESUME "0: mov (%1), %%rcx\n\t1:\n\t"
                     : "=&r"(at)
                     : "r"(SUPERVISOR_ADDR + 0x10)
                     : "rax", "rcx", "memory");
    ulog.fault_rip[1] = at;
    /* Write to a supervisor page: #PF(P|W|U). */
    __asm__ volatile(ARM_RESUME "0: movq $1, (%1)\n\t1:\n\t"
                     : "=&r"(at)
                     : "r"(SUPERVISOR_ADDR + 0x20)
                     : "rax", "memory");
    ulog.fault_rip[2] = at;
    /* UD2: #UD. */
    __asm__ volatile(ARM_RESUME "0: ud2\n\t1:\n\t" : "=&r"(at) : : "rax", "memory");
    ulog.fault_rip[3] = at;
    /* INT 0x81 through a DPL-0 gate: #GP(vector * 8 + 2). */
    __asm__ volatile(ARM_RESUME "0: int $0x81\n\t1:\n\t" : "=&r"(at) : : "rax", "memory");
    ulog.fault_rip[4] = at;
    /* INT 0x80 through a DPL-3 gate: delivered, returns after the INT. */
    __asm__ volatile("int $0x80\n\t0: lea 0b(%%rip), %0\n\t" : "=r"(at) : : "memory");
    ulog.int80_after = at;

    syscall3(SYS_EXIT, 0x55, 0, 0);
}

static void user_main_sysret(void)
{
    ulog.sysret_cs = read_cs();
    ulog.sysret_ss = read_ss();
    ulog.sysret_add = syscall3(SYS_ADD, 1000, 200, 30);
    syscall3(SYS_EXIT, 0x66, 0, 0);
}

static void user_main_killed(void)
{
    /* No fixup armed: the #PF handler kills us. */
    *(volatile u64 *)(SUPERVISOR_ADDR + 0x30) = 1;
    syscall3(SYS_EXIT, 0x77, 0, 0); /* not reached */
}

/* ---- checks --------------------------------------------------------------- */

static void make_image_user(void)
{
    for (u64 va = (u64)__image_start; va < (u64)__image_end; va += 4096) {
        int level;
        u64 *pte = pte_lookup(va, &level, 1);
        CHECK(pte != 0);
        if (pte)
            *pte |= PTE_U;
    }
    write_cr3(read_cr3());
}

static void check_user_trap(int i, u64 vector, u64 error_code, u64 rip, u64 rsp0)
{
    volatile struct trap_record *r = &traps[i];
    CHECK_EQ(r->vector, vector);
    CHECK_EQ(r->error_code, error_code);
    CHECK_EQ(r->rip, rip);
    CHECK_EQ(r->cs, USER_CS);
    CHECK_EQ(r->ss, USER_DS);
    CHECK(r->rsp > (u64)user_stack && r->rsp <= (u64)user_stack + sizeof(user_stack));
    /* Delivered on the TSS's ring-0 stack. */
    CHECK(r->frame < rsp0 && r->frame >= rsp0 - 4096);
}

int kmain(void);
int kmain(void)
{
    idt_init();
    for (int v = 0; v < 32; v++)
        idt_set_handler((u8)v, user_trap);
    idt_set_handler(0x80, user_trap);
    idt_set_gate(0x80, 3, 0);
    idt_set_handler(0x81, user_trap); /* gate stays DPL 0 */

    make_image_user();
    u64 rsp0 = current_tss()->rsp[0];
    CHECK(rsp0 != 0);

    wrmsr(MSR_EFER, rdmsr(MSR_EFER) | EFER_SCE);
    /* SYSCALL: CS = 0x08, SS = 0x10. SYSRET: CS = 0x13 + 16 = 0x23,
     * SS = 0x13 + 8 = 0x1b. */
    wrmsr(MSR_STAR, (0x13ull << 48) | ((u64)KERNEL_CS << 32));
    wrmsr(MSR_LSTAR, (u64)syscall_entry);
    wrmsr(MSR_FMASK, MSR_FMASK_VALUE);
    CHECK_EQ(rdmsr(MSR_FMASK), MSR_FMASK_VALUE);
    percpu.syscall_stack_top = (u64)(syscall_stack + sizeof(syscall_stack));
    wrmsr(MSR_GS_BASE, (u64)&percpu);
    wrmsr(MSR_KERNEL_GS_BASE, (u64)user_tls);
    /* As if called: RSP = 8 mod 16 at function entry. */
    u64 user_stack_top = (u64)(user_stack + sizeof(user_stack)) - 8;

    /* 1. IRETQ to ring 3. */
    u64 ret = enter_user_iret((u64)user_main, user_stack_top);
    CHECK_EQ(ret, 0x55);
    CHECK_EQ(read_cs(), KERNEL_CS);
    CHECK_EQ(ulog.cs, USER_CS);
    CHECK_EQ(ulog.ss, USER_DS);
    CHECK(ulog.rflags & RFLAGS_IF);
    CHECK_EQ(ulog.rflags & RFLAGS_IOPL, 0);
    CHECK_EQ(ulog.write_ret, 18);
    CHECK_EQ(ulog.add_ret, 142);
    CHECK_EQ(ulog.df_syscall_ret, 6);
    CHECK(ulog.rflags_after_df_syscall & RFLAGS_DF);
    CHECK(ulog.rflags_after_df_syscall & RFLAGS_IF);
    /* The kernel ran with CS/SS from STAR and IF/DF masked by FMASK. */
    CHECK_EQ(ksys.cs, KERNEL_CS);
    CHECK_EQ(ksys.ss, KERNEL_DS);
    CHECK_EQ(ksys.rflags & (RFLAGS_IF | RFLAGS_DF), 0);
    CHECK_EQ(ksys.count, 4);
    CHECK(percpu.user_rflags & RFLAGS_IF);
    CHECK(percpu.user_rsp > (u64)user_stack && percpu.user_rsp <= user_stack_top);
    CHECK(percpu.user_rip > (u64)user_main && percpu.user_rip < (u64)user_main + 4096);
    /* GS: the user's in ring 3, the kernel's in the system call. */
    CHECK_EQ(ulog.tls_magic, USER_TLS_MAGIC);
    CHECK_EQ(ksys.gs_magic, PERCPU_MAGIC);

    CHECK_EQ(trap_count, 6);
    check_user_trap(0, 13, 0, ulog.fault_rip[0], rsp0);
    check_user_trap(1, 14, PF_P | PF_U, ulog.fault_rip[1], rsp0);
    CHECK_EQ(traps[1].cr2, SUPERVISOR_ADDR + 0x10);
    check_user_trap(2, 14, PF_P | PF_W | PF_U, ulog.fault_rip[2], rsp0);
    CHECK_EQ(traps[2].cr2, SUPERVISOR_ADDR + 0x20);
    check_user_trap(3, 6, 0, ulog.fault_rip[3], rsp0);
    check_user_trap(4, 13, 0x81 * 8 + 2, ulog.fault_rip[4], rsp0);
    check_user_trap(5, 0x80, 0, ulog.int80_after, rsp0);

    /* 2. SYSRETQ to ring 3. */
    ret = enter_user_sysret((u64)user_main_sysret, user_stack_top);
    CHECK_EQ(ret, 0x66);
    CHECK_EQ(ulog.sysret_cs, USER_CS);
    CHECK_EQ(ulog.sysret_ss, USER_DS);
    CHECK_EQ(ulog.sysret_add, 1230);

    /* 3. A user fault with no fixup: killed by the #PF handler. */
    trap_count = 0;
    ret = enter_user_iret((u64)user_main_killed, user_stack_top);
    CHECK_EQ(ret, 0xdead0000 | 14);
    CHECK_EQ(trap_count, 1);
    CHECK_EQ(traps[0].error_code, PF_P | PF_W | PF_U);
    CHECK_EQ(traps[0].cr2, SUPERVISOR_ADDR + 0x30);

    /* Every path back to the kernel restored the kernel's GS. */
    CHECK_EQ(rdmsr(MSR_GS_BASE), (u64)&percpu);
    CHECK_EQ(rdmsr(MSR_KERNEL_GS_BASE), (u64)user_tls);
    return check_report("usermode");
}
