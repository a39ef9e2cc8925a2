/* exceptions.c: exception delivery through the IDT.
 *
 * Triggers #DE, #UD, #BP, #GP and #PF (several causes) and checks that the
 * handler sees the right vector, error code, faulting RIP and CR2, that the
 * interrupted context is restored by IRETQ (stack and registers), and that
 * IST and CR0.WP, NX, reserved bits, accessed/dirty bits and INVLPG behave.
 * Also: a REP STOSB faulting half-way is restartable (RCX/RDI show the
 * progress), a not-present IDT gate raises #NP, and a fault while
 * delivering a #PF escalates to #DF.
 * Exits 0 when every check passes. */
#include "rt.h"

/* What the last trap looked like. */
static volatile struct {
    u64 count, vector, error_code, rip, cr2, rflags, handler_stack, handler_rflags, rcx, rdi;
} last;

/* If non-zero, the handler resumes here instead of at the frame's RIP (used
 * for faults, whose saved RIP is the faulting instruction). */
volatile u64 resume_rip;

static void record_trap(struct trap_frame *f)
{
    /* A fault nobody armed a fixup for would return to the faulting
     * instruction and fault forever: report it and stop instead. #BP is a
     * trap and returns after the INT3. */
    if (!resume_rip && f->vector != 3) {
        printf("unexpected exception: vector %llu error %#llx rip %#llx cr2 %#llx\n", f->vector,
               f->error_code, f->rip, read_cr2());
        exit(0x7e);
    }
    last.count++;
    last.vector = f->vector;
    last.error_code = f->error_code;
    last.rip = f->rip;
    last.cr2 = read_cr2();
    last.rflags = f->rflags;
    last.handler_stack = (u64)f;
    last.handler_rflags = read_rflags();
    last.rcx = f->rcx;
    last.rdi = f->rdi;
    if (resume_rip) {
        f->rip = resume_rip;
        resume_rip = 0;
    }
}

static void reset_last(void)
{
    last.count = 0;
    last.vector = last.error_code = last.rip = last.cr2 = ~0ull;
}

/* Checks that exactly one trap with this vector, error code and RIP
 * happened since reset_last(). */
#define CHECK_TRAP(vec, err, at)              \
    do {                                      \
        CHECK_EQ(last.count, 1);              \
        CHECK_EQ(last.vector, (vec));         \
        CHECK_EQ(last.error_code, (err));     \
        CHECK_EQ(last.rip, (at));             \
    } while (0)

/* Inline-asm prologue: arms resume_rip with local label 1 (after the
 * faulting instruction) and puts the address of label 0 (the faulting
 * instruction) in operand 0. */
#define ARM_RESUME                    \
    "lea 1f(%%rip), %%rax\n\t"        \
    "mov %%rax, resume_rip(%%rip)\n\t" \
    "lea 0f(%%rip), %0\n\t"

static void test_divide_error(void)
{
    u64 fault;
    reset_last();
    __asm__ volatile(ARM_RESUME
                     "mov $1, %%eax\n\t"
                     "xor %%edx, %%edx\n\t"
                     "xor %%ecx, %%ecx\n\t"
                     "0: div %%ecx\n\t"
                     "1:\n\t"
                     : "=&r"(fault)
                     :
                     : "rax", "rcx", "rdx", "memory", "cc");
    CHECK_TRAP(0, 0, fault);

    /* Quotient overflow is #DE too: INT64_MIN / -1. */
    reset_last();
    __asm__ volatile(ARM_RESUME
                     "mov $0x8000000000000000, %%rax\n\t"
                     "cqo\n\t"
                     "mov $-1, %%rcx\n\t"
                     "0: idiv %%rcx\n\t"
                     "1:\n\t"
                     : "=&r"(fault)
                     :
                     : "rax", "rcx", "rdx", "memory", "cc");
    CHECK_TRAP(0, 0, fault);
}

static void test_invalid_opcode(void)
{
    u64 fault, rsp_before, rsp_after, rbx_after;
    reset_last();
    /* Also checks that IRETQ restores RSP and that registers survive the
     * handler (the stub saves and restores them all). */
    __asm__ volatile(ARM_RESUME
                     "mov %%rsp, %1\n\t"
                     "mov $0x1122334455667788, %%rbx\n\t"
                     "0: ud2\n\t"
                     "1:\n\t"
                     "mov %%rsp, %2\n\t"
                     "mov %%rbx, %3\n\t"
                     : "=&r"(fault), "=&r"(rsp_before), "=&r"(rsp_after), "=&r"(rbx_after)
                     :
                     : "rax", "rbx", "memory");
    CHECK_TRAP(6, 0, fault);
    CHECK_EQ(rsp_after, rsp_before);
    CHECK_EQ(rbx_after, 0x1122334455667788ull);

    /* PUSH ES (0x06) does not exist in 64-bit mode. */
    reset_last();
    __asm__ volatile(ARM_RESUME "0: .byte 0x06\n\t"
                                "1:\n\t"
                     : "=&r"(fault)
                     :
                     : "rax", "memory");
    CHECK_TRAP(6, 0, fault);

    /* An interrupt gate clears IF in the handler; the frame keeps the
     * interrupted RFLAGS. Nothing can interrupt us: no interrupt source is
     * programmed. */
    reset_last();
    __asm__ volatile(ARM_RESUME "sti\n\t"
                                "0: ud2\n\t"
                                "1: cli\n\t"
                     : "=&r"(fault)
                     :
                     : "rax", "memory");
    CHECK_TRAP(6, 0, fault);
    CHECK(last.rflags & RFLAGS_IF);
    CHECK(!(last.handler_rflags & RFLAGS_IF));
}

static void test_breakpoint(void)
{
    u64 after;
    /* #BP is a trap: the saved RIP is the next instruction. It runs on
     * IST1 here; the handler's frame must be on that stack. */
    u64 ist1 = current_tss()->ist[0];
    CHECK(ist1 != 0);
    idt_set_gate(3, 0, 1);
    reset_last();
    __asm__ volatile("int3\n\t"
                     "0: lea 0b(%%rip), %0\n\t"
                     : "=r"(after)
                     :
                     : "memory");
    CHECK_TRAP(3, 0, after);
    CHECK(last.handler_stack < ist1 && last.handler_stack >= ist1 - 4096);
    idt_set_gate(3, 0, 0);

    /* The two-byte form INT 3 behaves the same, minus the IST. */
    reset_last();
    __asm__ volatile("int $3\n\t"
                     "0: lea 0b(%%rip), %0\n\t"
                     : "=r"(after)
                     :
                     : "memory");
    CHECK_TRAP(3, 0, after);
    CHECK(last.handler_stack < ist1 - 4096 || last.handler_stack >= ist1);
}

static void test_general_protection(void)
{
    u64 fault;
    /* A non-canonical data address is #GP(0). */
    reset_last();
    __asm__ volatile(ARM_RESUME "mov $0x8000000000000000, %%rcx\n\t"
                                "0: mov (%%rcx), %%rdx\n\t"
                                "1:\n\t"
                     : "=&r"(fault)
                     :
                     : "rax", "rcx", "rdx", "memory");
    CHECK_TRAP(13, 0, fault);

    /* RDMSR of an MSR that does not exist is #GP(0). */
    reset_last();
    __asm__ volatile(ARM_RESUME "mov $0x0badc0de, %%ecx\n\t"
                                "0: rdmsr\n\t"
                                "1:\n\t"
                     : "=&r"(fault)
                     :
                     : "rax", "rcx", "rdx", "memory");
    CHECK_TRAP(13, 0, fault);

    /* Setting a reserved CR4 bit is #GP(0), and CR4 is unchanged. */
    u64 cr4_before, cr4_after;
    __asm__ volatile("mov %%cr4, %0" : "=r"(cr4_before));
    reset_last();
    __asm__ volatile(ARM_RESUME "mov %%cr4, %%rcx\n\t"
                                "bts $31, %%rcx\n\t"
                                "0: mov %%rcx, %%cr4\n\t"
                                "1:\n\t"
                     : "=&r"(fault)
                     :
                     : "rax", "rcx", "memory");
    __asm__ volatile("mov %%cr4, %0" : "=r"(cr4_after));
    CHECK_TRAP(13, 0, fault);
    CHECK_EQ(cr4_after, cr4_before);
}

/* ---- page faults --------------------------------------------------------- */

/* A private mapping at TEST_VA (PML4 slot 254, far from the identity map):
 * page 0 read/write, page 1 read-only, page 2 not present, page 3 no-execute,
 * page 4 with a reserved physical-address bit, page 5 read/write, page 6 not
 * present (until the REP test maps it), page 7 never mapped. */
#define TEST_VA 0x00007f0000000000ull
#define PML4_SLOT 254
/* volatile: the CPU reads and updates (A/D bits) these behind the
 * compiler's back. */
static volatile u64 pdpt[512] __attribute__((aligned(4096)));
static volatile u64 pd[512] __attribute__((aligned(4096)));
static volatile u64 pt[512] __attribute__((aligned(4096)));
static u8 pages[7][4096] __attribute__((aligned(4096)));

#define PF_P 1u
#define PF_W 2u
#define PF_RSVD 8u
#define PF_ID 16u

static u64 page_va(int n) { return TEST_VA + (u64)n * 4096; }

static void map_test_pages(void)
{
    u64 *pml4 = (u64 *)(read_cr3() & PTE_ADDR);
    CHECK(!(pml4[PML4_SLOT] & PTE_P));
    pml4[PML4_SLOT] = (u64)pdpt | PTE_P | PTE_W;
    pdpt[0] = (u64)pd | PTE_P | PTE_W;
    pd[0] = (u64)pt | PTE_P | PTE_W;
    pt[0] = (u64)pages[0] | PTE_P | PTE_W;
    pt[1] = (u64)pages[1] | PTE_P;
    pt[2] = 0;
    pt[3] = (u64)pages[3] | PTE_P | PTE_W | PTE_NX;
    pt[4] = (u64)pages[4] | PTE_P | PTE_W | (1ull << 50); /* above MAXPHYADDR */
    pt[5] = (u64)pages[5] | PTE_P | PTE_W;
    pt[6] = 0;
    pt[7] = 0;
    write_cr3(read_cr3());
}

static u64 faulting_read(u64 va, u64 *fault)
{
    u64 value = 0;
    __asm__ volatile(ARM_RESUME "0: mov (%2), %1\n\t"
                                "1:\n\t"
                     : "=&r"(*fault), "+r"(value)
                     : "r"(va)
                     : "rax", "memory");
    return value;
}

static void faulting_write(u64 va, u64 value, u64 *fault)
{
    __asm__ volatile(ARM_RESUME "0: mov %2, (%1)\n\t"
                                "1:\n\t"
                     : "=&r"(*fault)
                     : "r"(va), "r"(value)
                     : "rax", "memory");
}

static void test_page_faults(void)
{
    u64 fault;
    map_test_pages();

    /* Translation works and reaches the right frames. */
    reset_last();
    *(volatile u64 *)page_va(0) = 0xabcdef;
    CHECK_EQ(*(volatile u64 *)pages[0], 0xabcdef);
    *(volatile u64 *)(pages[1] + 8) = 0x5151;
    CHECK_EQ(*(volatile u64 *)(page_va(1) + 8), 0x5151);
    CHECK_EQ(last.count, 0);
    /* The walk set accessed and dirty bits. */
    CHECK(pt[0] & PTE_A);
    CHECK(pt[0] & PTE_D);
    CHECK(pt[1] & PTE_A);
    CHECK(!(pt[1] & PTE_D));

    /* Write to a read-only page: P|W, CR2 = the address written. */
    reset_last();
    faulting_write(page_va(1) + 0x18, 7, &fault);
    CHECK_TRAP(14, PF_P | PF_W, fault);
    CHECK_EQ(last.cr2, page_va(1) + 0x18);
    CHECK_EQ(*(volatile u64 *)(pages[1] + 0x18), 0);

    /* With CR0.WP clear, ring 0 may write read-only pages. */
    u64 cr0;
    __asm__ volatile("mov %%cr0, %0" : "=r"(cr0));
    __asm__ volatile("mov %0, %%cr0" : : "r"(cr0 & ~(1ull << 16)) : "memory");
    reset_last();
    *(volatile u64 *)(page_va(1) + 0x18) = 9;
    __asm__ volatile("mov %0, %%cr0" : : "r"(cr0) : "memory");
    CHECK_EQ(last.count, 0);
    CHECK_EQ(*(volatile u64 *)(pages[1] + 0x18), 9);

    /* Read and write of a not-present page. */
    reset_last();
    faulting_read(page_va(2) + 0x10, &fault);
    CHECK_TRAP(14, 0, fault);
    CHECK_EQ(last.cr2, page_va(2) + 0x10);
    reset_last();
    faulting_write(page_va(2) + 0xff8, 1, &fault);
    CHECK_TRAP(14, PF_W, fault);
    CHECK_EQ(last.cr2, page_va(2) + 0xff8);

    /* An access straddling into the not-present page faults (not-present
     * error code). The SDM only says CR2 is "the linear address that
     * generated the exception": real CPUs give the first byte of the
     * missing page, the start of the access is also defensible. */
    reset_last();
    faulting_read(page_va(1) + 0xffc, &fault);
    CHECK_TRAP(14, 0, fault);
    CHECK(last.cr2 == page_va(2) || last.cr2 == page_va(1) + 0xffc);

    /* Mapping the page (no INVLPG needed: not-present entries are not
     * cached) makes the access work. */
    pt[2] = (u64)pages[2] | PTE_P | PTE_W;
    pages[2][0x10] = 0x42;
    barrier();
    reset_last();
    CHECK_EQ(*(volatile u8 *)(page_va(2) + 0x10), 0x42);
    CHECK_EQ(last.count, 0);

    /* Instruction fetch from a no-execute page: P|I/D, and the saved RIP
     * and CR2 are the target. */
    pages[3][0] = 0xc3; /* ret, never executed */
    barrier();
    reset_last();
    u64 resume;
    __asm__ volatile("lea 1f(%%rip), %%rax\n\t"
                     "mov %%rax, resume_rip(%%rip)\n\t"
                     "mov %%rax, %0\n\t"
                     "jmp *%1\n\t"
                     "1:\n\t"
                     : "=&r"(resume)
                     : "r"(page_va(3))
                     : "rax", "memory");
    CHECK_TRAP(14, PF_P | PF_ID, page_va(3));
    CHECK_EQ(last.cr2, page_va(3));

    /* A reserved bit in the PTE: P|RSVD. */
    reset_last();
    faulting_read(page_va(4), &fault);
    CHECK_TRAP(14, PF_P | PF_RSVD, fault);
    CHECK_EQ(last.cr2, page_va(4));

    /* Remapping page 0 to page 2's frame is visible only after INVLPG. */
    CHECK_EQ(*(volatile u64 *)page_va(0), 0xabcdef); /* cached */
    pt[0] = (u64)pages[2] | PTE_P | PTE_W;
    invlpg((void *)page_va(0));
    CHECK_EQ(*(volatile u8 *)(page_va(0) + 0x10), 0x42);
}

/* A REP STOSB that runs into a not-present page faults with RCX and RDI
 * showing the progress made; mapping the page and executing it again with
 * those registers finishes the job. */
static void test_restartable_rep(void)
{
    u64 fault;
    const u64 start = page_va(6) - 96;
    reset_last();
    __asm__ volatile(ARM_RESUME "mov %1, %%rdi\n\t"
                                "mov $200, %%ecx\n\t"
                                "mov $0x5a, %%eax\n\t"
                                "0: rep stosb\n\t"
                                "1:\n\t"
                     : "=&r"(fault)
                     : "r"(start)
                     : "rax", "rcx", "rdi", "memory");
    CHECK_TRAP(14, PF_W, fault);
    CHECK_EQ(last.cr2, page_va(6));
    CHECK_EQ(last.rcx, 200 - 96);
    CHECK_EQ(last.rdi, page_va(6));
    CHECK_EQ(pages[5][4095], 0x5a);
    CHECK_EQ(pages[5][4000], 0x5a);
    CHECK_EQ(pages[5][3999], 0);

    pt[6] = (u64)pages[6] | PTE_P | PTE_W;
    barrier();
    u64 count = last.rcx, dest = last.rdi;
    __asm__ volatile("rep stosb" : "+c"(count), "+D"(dest) : "a"(0x5a) : "memory");
    CHECK_EQ(count, 0);
    CHECK_EQ(pages[6][103], 0x5a);
    CHECK_EQ(pages[6][104], 0);
}

static void test_not_present_gate_and_double_fault(void)
{
    u64 fault;
    /* INT 0x90 through a not-present gate: #NP with the IDT flag (bit 1)
     * and the gate's index in the error code. */
    idt_set_present(0x90, 0);
    reset_last();
    __asm__ volatile(ARM_RESUME "0: int $0x90\n\t1:\n\t" : "=&r"(fault) : : "rax", "memory");
    CHECK_TRAP(11, 0x90 * 8 + 2, fault);
    idt_set_present(0x90, 1);

    /* A #PF whose gate is not present raises #NP while delivering the #PF:
     * a contributory fault after a page fault is a double fault, with error
     * code 0, here on IST1 as operating systems configure it. The saved RIP
     * of a #DF is undefined, so it is not checked. */
    u64 ist1 = current_tss()->ist[0];
    idt_set_gate(8, 0, 1);
    idt_set_present(14, 0);
    reset_last();
    faulting_read(page_va(7), &fault);
    idt_set_present(14, 1);
    idt_set_gate(8, 0, 0);
    CHECK_EQ(last.count, 1);
    CHECK_EQ(last.vector, 8);
    CHECK_EQ(last.error_code, 0);
    CHECK_EQ(last.cr2, page_va(7));
    CHECK(last.handler_stack < ist1 && last.handler_stack >= ist1 - 4096);
}

int kmain(void);
int kmain(void)
{
    idt_init();
    for (int v = 0; v < 32; v++)
        idt_set_handler((u8)v, record_trap);
    test_divide_error();
    test_invalid_opcode();
    test_breakpoint();
    test_general_protection();
    test_page_faults();
    test_restartable_rep();
    test_not_present_gate_and_double_fault();
    return check_report("exceptions");
}
