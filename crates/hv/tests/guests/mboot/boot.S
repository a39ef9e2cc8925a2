/* The acceptance kernel's entry (issue 14): a multiboot v1 header, the
 * 32-bit protected-mode entry that builds page tables and enters long
 * mode, and the real-mode trampoline the application processors start in
 * (copied to TRAMPOLINE, started by INIT/SIPI with vector TRAMPOLINE >> 12).
 * Everything runs at its link address, one to one. */

#define MB_MAGIC 0x1badb002
#define MB_FLAGS 0x00000003 /* page-aligned modules, memory information */
#define TRAMPOLINE 0x8000
#define EFER 0xc0000080
#define PAGE_2M_RW 0x83          /* present, writable, 2 MiB */
#define PAGE_2M_RW_UC 0x9b       /* the same, cache-disabled (MMIO) */
#define TR(sym) (TRAMPOLINE + (sym) - trampoline_start)

    .section .multiboot, "a"
    .align 4
    .long MB_MAGIC, MB_FLAGS, -(MB_MAGIC + MB_FLAGS)

    .section .text.start, "ax"
    .code32
    .globl _start
_start:
    cmpl $0x2badb002, %eax
    jne halt32
    movl %ebx, mb_info
    movl $bsp_stack_top, %esp
    /* Identity map the first GiB with 2 MiB pages, and the 2 MiB pages
     * holding the IOAPIC (0xfec00000) and the local APIC (0xfee00000). */
    movl $boot_pd, %edi
    xorl %ecx, %ecx
1:  movl %ecx, %eax
    shll $21, %eax
    orl $PAGE_2M_RW, %eax
    movl %eax, (%edi,%ecx,8)
    movl $0, 4(%edi,%ecx,8)
    incl %ecx
    cmpl $512, %ecx
    jne 1b
    movl $(0xfec00000 | PAGE_2M_RW_UC), boot_pd_high + 8 * 0x1f6
    movl $(0xfee00000 | PAGE_2M_RW_UC), boot_pd_high + 8 * 0x1f7
    movl $(boot_pd + 3), boot_pdpt
    movl $(boot_pd_high + 3), boot_pdpt + 8 * 3
    movl $(boot_pdpt + 3), boot_pml4
    /* The long-mode enable sequence: PAE, CR3, EFER.LME, CR0.PG, then a
     * far jump to a 64-bit code segment. */
    movl %cr4, %eax
    orl $0x20, %eax
    movl %eax, %cr4
    movl $boot_pml4, %eax
    movl %eax, %cr3
    movl $EFER, %ecx
    rdmsr
    orl $0x100, %eax
    wrmsr
    movl %cr0, %eax
    orl $0x80000000, %eax
    movl %eax, %cr0
    lgdt gdt_ptr
    ljmp $0x08, $long_mode
halt32:
    hlt
    jmp halt32

    .code64
long_mode:
    movw $0x10, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    xorw %ax, %ax
    movw %ax, %fs
    movw %ax, %gs
    movq $bsp_stack_top, %rsp
    movl mb_info(%rip), %edi
    call kmain
2:  cli
    hlt
    jmp 2b

/* The AP trampoline: 16-bit real mode at TRAMPOLINE (CS = TRAMPOLINE >> 4,
 * IP = 0), through 32-bit protected mode into long mode with the BSP's page
 * tables, then to ap_entry on the stack the BSP left in tr_stack. */
    .code16
    .globl trampoline_start, trampoline_end, tr_cr3, tr_stack
trampoline_start:
    cli
    movw %cs, %ax
    movw %ax, %ds
    lgdtl tr_gdt_ptr - trampoline_start
    movl %cr0, %eax
    orl $1, %eax
    movl %eax, %cr0
    ljmpl $0x18, $TR(tr_protected)

    .code32
tr_protected:
    movw $0x20, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    movl %cr4, %eax
    orl $0x20, %eax
    movl %eax, %cr4
    movl TR(tr_cr3), %eax
    movl %eax, %cr3
    movl $EFER, %ecx
    rdmsr
    orl $0x100, %eax
    wrmsr
    movl %cr0, %eax
    orl $0x80000000, %eax
    movl %eax, %cr0
    ljmp $0x08, $TR(tr_long)

    .code64
tr_long:
    movw $0x10, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    movq TR(tr_stack), %rsp
    movabsq $ap_entry, %rax
    call *%rax
3:  cli
    hlt
    jmp 3b

    .align 8
/* null, 64-bit code (0x08), data (0x10), 32-bit code (0x18), 32-bit data (0x20) */
tr_gdt:
    .quad 0, 0x00af9a000000ffff, 0x00cf92000000ffff, 0x00cf9a000000ffff, 0x00cf92000000ffff
tr_gdt_end:
tr_gdt_ptr:
    .word tr_gdt_end - tr_gdt - 1
    .long TR(tr_gdt)
    .align 8
tr_cr3:
    .quad 0
tr_stack:
    .quad 0
trampoline_end:

    .section .rodata
    .align 8
/* The BSP's GDT is the trampoline's, at its link address. */
gdt_ptr:
    .word tr_gdt_end - tr_gdt - 1
    .long tr_gdt

    .section .bss
    .align 4096
    .globl boot_pml4
boot_pml4: .skip 4096
boot_pdpt: .skip 4096
boot_pd: .skip 4096
boot_pd_high: .skip 4096
    .align 16
    .skip 16384
bsp_stack_top:
mb_info: .skip 8
    .section .note.GNU-stack, "", @progbits
