/* realmode.c: 16-bit real mode, and the way down to it and back up.
 *
 * A blob copied to RM_BASE (below 1 MiB) leaves 64-bit mode through a far
 * return to a compatibility-mode code segment, turns paging off (leaving
 * IA-32e mode) and EFER.LME off, far-jumps to a 16-bit protected-mode code
 * segment, clears CR0.PE and far-jumps to real mode. There it checks what
 * real-mode code relies on (segment bases of selector x 16 with every
 * segment register and override, 16-bit [base+index+disp] addressing with
 * DS and SS defaults, INT and IRET through the interrupt vector table,
 * far CALL/RET to another segment, string instructions with DS:SI and
 * ES:DI, 32-bit operands and addresses by prefix, LOOP, LES, PUSHA/POPA,
 * 16-bit MUL/DIV, unreal mode: a 4 GiB limit loaded in protected mode kept
 * after CR0.PE is cleared), writes what it saw to a results table, and goes
 * back up the way Linux's real-mode trampoline does: LGDT, CR0.PE, a far
 * jump to 32-bit code, CR3, EFER.LME, CR0.PG, a far jump to 64-bit code.
 * The C side checks the table. Exits 0 when every check passes. */
#include "rt.h"

#define RM_BASE 0x20000ull /* linear address of the blob; real-mode CS = RM_BASE >> 4 */
#define RM_SEG "0x2000"
#define LIN(x) "(0x20000 + " #x " - rm_start)"
#define OFF(x) "(" #x " - rm_start)"

extern char rm_start[], rm_end[], rm_results[], rm_unreal_addr[];
#define RESULTS 16

__asm__(
    ".pushsection .text\n"
    ".globl rm_start, rm_end, rm_results, rm_unreal_addr\n"
    ".code64\n"
    "rm_start:\n"
    /* void rm_enter(void), called at its copy: save what the way back needs. */
    "  push %rbx; push %rbp; push %r12; push %r13; push %r14; push %r15\n"
    "  pushfq; cli\n"
    "  movq %rsp, " LIN(rm_save_rsp) "\n"
    "  movq %cr3, %rax; movq %rax, " LIN(rm_save_cr3) "\n"
    "  sgdt " LIN(rm_save_gdt) "\n"
    "  sidt " LIN(rm_save_idt) "\n"
    "  lgdt " LIN(rm_gdt_ptr) "\n"
    "  pushq $0x18\n"
    "  pushq $" LIN(rm_compat) "\n"
    "  lretq\n"
    ".code32\n"
    "rm_compat:\n" /* compatibility mode */
    "  movw $0x20, %ax; movw %ax, %ds; movw %ax, %es; movw %ax, %ss\n"
    "  movl %cr0, %eax; andl $0x7fffffff, %eax; movl %eax, %cr0\n" /* paging off: IA-32e mode ends */
    "  movl $0xc0000080, %ecx; rdmsr; andl $~0x100, %eax; wrmsr\n"  /* EFER.LME off */
    "  ljmp $0x28, $" OFF(rm_pm16) "\n"
    ".code16\n"
    "rm_pm16:\n" /* 16-bit protected mode, segment base RM_BASE */
    "  movw $0x30, %ax; movw %ax, %ds; movw %ax, %es; movw %ax, %ss; movw %ax, %fs; movw %ax, %gs\n"
    "  movl %cr0, %eax; andl $~1, %eax; movl %eax, %cr0\n"
    "  ljmp $" RM_SEG ", $" OFF(rm_real) "\n"
    "rm_real:\n" /* real mode */
    "  movw %cs, %ax; movw %ax, %ds; movw %ax, %ss; movw $0x8000, %sp\n"
    "  lidt " OFF(rm_ivt_ptr) "\n"
    /* 0: ES:0x10 with ES = 0x2100 is linear 0x21010, which DS:0x1010 reads. */
    "  movw $0x2100, %ax; movw %ax, %es\n"
    "  movw $0xbeef, %es:0x10\n"
    "  movw 0x1010, %bx\n"
    "  movw %bx, " OFF(rm_results) "\n"
    /* 1: [bx+si] (DS) and [bp+di+2] (SS) reach the same word. */
    "  movw $0x1000, %bx; movw $0x10, %si; movw (%bx,%si), %ax\n"
    "  movw $0x1000, %bp; movw $0x0e, %di; movw 2(%bp,%di), %cx\n"
    "  movw %ax, " OFF(rm_results) "+4\n"
    "  movw %cx, " OFF(rm_results) "+6\n"
    /* 2-4: INT 0x30 through the IVT (entry written through ES = 0). */
    "  xorw %ax, %ax; movw %ax, %es\n"
    "  movw $" OFF(rm_int30) ", %es:0xc0\n"
    "  movw $" RM_SEG ", %es:0xc2\n"
    "  xorw %dx, %dx\n"
    "  stc\n"
    "  int $0x30\n"
    "  sbbw %ax, %ax\n" /* CF back from the frame: -1 */
    "  movw %dx, " OFF(rm_results) "+8\n"
    "  movw %ax, " OFF(rm_results) "+16\n"
    /* 5: a far call into segment RM_SEG - 1 (base 0x10 lower). */
    "  lcall $(" RM_SEG " - 1), $(" OFF(rm_farfunc) " + 0x10)\n"
    "  movw %ax, " OFF(rm_results) "+20\n"
    /* 6: REP MOVSB DS:SI -> ES:DI, then REPE CMPSB over the copy. */
    "  movw $0x2100, %ax; movw %ax, %es\n"
    "  movw $" OFF(rm_text) ", %si; movw $0x20, %di; movw $16, %cx; cld\n"
    "  rep movsb\n"
    "  movw $" OFF(rm_text) ", %si; movw $0x20, %di; movw $16, %cx\n"
    "  repe cmpsb\n"
    "  setz %al; movb %cl, %ah\n"
    "  movw %ax, " OFF(rm_results) "+24\n"
    "  movw %es:0x20, %ax\n"
    "  movw %ax, " OFF(rm_results) "+26\n"
    /* 7: 32-bit operands by prefix. */
    "  movl $0x12345678, %eax; addl $0x11111111, %eax\n"
    "  movl %eax, " OFF(rm_results) "+28\n"
    /* 8: PUSHA / POPA. */
    "  movw $1, %ax; movw $2, %cx; movw $3, %dx; movw $4, %bx; movw $5, %bp; movw $6, %si; movw $7, %di\n"
    "  pushaw\n"
    "  xorw %ax, %ax; xorw %cx, %cx; xorw %dx, %dx; xorw %bx, %bx; xorw %bp, %bp; xorw %si, %si; xorw %di, %di\n"
    "  popaw\n"
    "  addw %cx, %ax; addw %dx, %ax; addw %bx, %ax; addw %bp, %ax; addw %si, %ax; addw %di, %ax\n"
    "  movw %ax, " OFF(rm_results) "+32\n"
    "  movw %sp, " OFF(rm_results) "+34\n"
    /* 9: LOOP counts CX down. */
    "  xorw %ax, %ax; movw $5, %cx\n"
    "1: addw $3, %ax; loop 1b\n"
    "  movw %ax, " OFF(rm_results) "+36\n"
    /* 10: LES loads ES:BX from a far pointer. */
    "  lesw " OFF(rm_farptr) ", %bx\n"
    "  movw %bx, " OFF(rm_results) "+40\n"
    "  movw %es, " OFF(rm_results) "+42\n"
    /* 11: 16-bit MUL and DIV. */
    "  movw $1000, %ax; movw $300, %cx; mulw %cx\n"
    "  movw %ax, " OFF(rm_results) "+44\n"
    "  movw %dx, " OFF(rm_results) "+46\n"
    "  movw $7, %cx; divw %cx\n"
    "  movw %ax, " OFF(rm_results) "+48\n"
    "  movw %dx, " OFF(rm_results) "+50\n"
    /* 12: unreal mode: FS loaded with a 4 GiB flat segment in protected
     * mode keeps its limit after CR0.PE is cleared; a 32-bit address reads
     * the program's image above 1 MiB. */
    "  lgdtl " OFF(rm_gdt_ptr) "\n"
    "  movl %cr0, %eax; orl $1, %eax; movl %eax, %cr0\n"
    "  movw $0x20, %bx; movw %bx, %fs\n"
    "  andl $~1, %eax; movl %eax, %cr0\n"
    "  movl " OFF(rm_unreal_addr) ", %esi\n"
    "  addr32 movl %fs:(%esi), %eax\n"
    "  movl %eax, " OFF(rm_results) "+52\n"
    /* 13: the stack is SS:SP: a push lands at SS:SP-2. */
    "  movw $0xa5a5, %ax; pushw %ax; movw %sp, %bx; movw (%bx), %cx; popw %ax\n"
    "  movw %cx, " OFF(rm_results) "+56\n"
    "  movw %bx, " OFF(rm_results) "+58\n"
    /* Back up: protected mode, paging, long mode. */
    "  lgdtl " OFF(rm_gdt_ptr) "\n"
    "  movl %cr0, %eax; orl $1, %eax; movl %eax, %cr0\n"
    "  ljmpl $0x18, $" LIN(rm_pm32) "\n"
    "rm_int30:\n"
    "  movw $0x1234, %dx\n"
    "  movw %sp, %bp\n"
    "  movw 4(%bp), %ax\n" /* FLAGS as pushed */
    "  movw %ax, %cs:" OFF(rm_results) "+12\n"
    "  pushfw; popw %ax\n"
    "  movw %ax, %cs:" OFF(rm_results) "+14\n"
    "  iretw\n"
    "rm_farfunc:\n"
    "  movw %cs, %ax\n"
    "  lretw\n"
    ".code32\n"
    "rm_pm32:\n"
    "  movw $0x20, %ax; movw %ax, %ds; movw %ax, %es; movw %ax, %ss; movw %ax, %fs; movw %ax, %gs\n"
    "  movl " LIN(rm_save_cr3) ", %eax; movl %eax, %cr3\n"
    "  movl $0xc0000080, %ecx; rdmsr; orl $0x100, %eax; wrmsr\n"
    "  movl %cr0, %eax; orl $0x80000000, %eax; movl %eax, %cr0\n"
    "  ljmp $0x08, $" LIN(rm_long) "\n"
    ".code64\n"
    "rm_long:\n"
    "  lgdt " LIN(rm_save_gdt) "\n"
    "  lidt " LIN(rm_save_idt) "\n"
    "  movw $0x10, %ax; movw %ax, %ds; movw %ax, %es; movw %ax, %ss\n"
    "  xorw %ax, %ax; movw %ax, %fs; movw %ax, %gs\n"
    "  movq " LIN(rm_save_rsp) ", %rsp\n"
    "  pushq $0x08\n"
    "  pushq $" LIN(rm_back) "\n"
    "  lretq\n"
    "rm_back:\n"
    "  popfq\n"
    "  pop %r15; pop %r14; pop %r13; pop %r12; pop %rbp; pop %rbx\n"
    "  ret\n"
    ".balign 8\n"
    /* null, 64-bit code, data, 32-bit code, 32-bit data (4 GiB), 16-bit
     * code and data based at RM_BASE (64 KiB) */
    "rm_gdt:\n"
    "  .quad 0, 0x00af9a000000ffff, 0x00cf92000000ffff, 0x00cf9a000000ffff, 0x00cf92000000ffff\n"
    "  .quad 0x00009a020000ffff, 0x000092020000ffff\n"
    "rm_gdt_end:\n"
    "rm_gdt_ptr: .word rm_gdt_end - rm_gdt - 1; .long " LIN(rm_gdt) "; .long 0\n"
    "rm_ivt_ptr: .word 0x3ff; .long 0\n"
    ".balign 8\n"
    "rm_save_rsp: .quad 0\n"
    "rm_save_cr3: .quad 0\n"
    "rm_save_gdt: .skip 16\n"
    "rm_save_idt: .skip 16\n"
    "rm_unreal_addr: .long 0\n"
    "rm_farptr: .word 0x5678, 0x1234\n"
    "rm_text: .ascii \"real mode works!\"\n"
    ".balign 8\n"
    "rm_results: .skip 64\n"
    "rm_end:\n"
    ".popsection\n");

static volatile u32 unreal_probe = 0xcafed00d;

int kmain(void);
int kmain(void)
{
    usize len = (usize)(rm_end - rm_start);
    u8 *blob = (u8 *)RM_BASE;
    memcpy(blob, rm_start, len);
    *(u32 *)(blob + (rm_unreal_addr - rm_start)) = (u32)(u64)&unreal_probe;
    memset(blob + (rm_results - rm_start), 0, RESULTS * 4);
    u64 cr3 = read_cr3();
    u64 efer = rdmsr(MSR_EFER);

    ((void (*)(void))blob)();

    const u16 *r = (const u16 *)(blob + (rm_results - rm_start));
    CHECK_EQ(r[0], 0xbeef);         /* ES:0x10 = DS:0x1010 */
    CHECK_EQ(r[2], 0xbeef);         /* [bx+si] */
    CHECK_EQ(r[3], 0xbeef);         /* [bp+di+2] through SS */
    CHECK_EQ(r[4], 0x1234);         /* INT 0x30's handler ran */
    CHECK_EQ(r[6] & 1, 1);          /* it saw CF set in the pushed FLAGS */
    CHECK_EQ(r[7] & (1 << 9), 0);   /* IF clear inside the handler */
    CHECK_EQ(r[7] & (1 << 8), 0);   /* TF clear */
    CHECK_EQ(r[8], 0xffff);         /* IRET gave CF back */
    CHECK_EQ(r[10], 0x1fff);        /* CS in the far-called function */
    CHECK_EQ(r[12] & 0xff, 1);      /* REPE CMPSB: equal */
    CHECK_EQ(r[12] >> 8, 0);        /* CX ran out */
    CHECK_EQ(r[13], 'r' | ('e' << 8));
    CHECK_EQ(r[14] | ((u32)r[15] << 16), 0x23456789u); /* 32-bit ADD */
    CHECK_EQ(r[16], 1 + 2 + 3 + 4 + 5 + 6 + 7);        /* POPA restored all */
    CHECK_EQ(r[17], 0x8000);                           /* and SP */
    CHECK_EQ(r[18], 15);                               /* LOOP ran 5 times */
    CHECK_EQ(r[20], 0x5678);                           /* LES: offset */
    CHECK_EQ(r[21], 0x1234);                           /* and segment */
    CHECK_EQ(r[22] | ((u32)r[23] << 16), 300000u);     /* MUL: DX:AX */
    CHECK_EQ(r[24], 300000u / 7);                      /* DIV: quotient */
    CHECK_EQ(r[25], 300000u % 7);                      /* and remainder */
    CHECK_EQ(r[26] | ((u32)r[27] << 16), 0xcafed00du); /* unreal mode */
    CHECK_EQ(r[28], 0xa5a5);                           /* PUSH at SS:SP */
    CHECK_EQ(r[29], 0x8000 - 2);
    /* Back in long mode with what was there before. */
    CHECK_EQ(read_cr3(), cr3);
    CHECK_EQ(rdmsr(MSR_EFER), efer);
    CHECK_EQ(read_cs(), KERNEL_CS);
    return check_report("realmode");
}
