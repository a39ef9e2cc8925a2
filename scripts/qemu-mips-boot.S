/* qemu-mips-boot.S: a multiboot (v1) loader stub that starts a faultline
 * bare-mode program under QEMU in the state `BareMachine` gives it.
 *
 * QEMU's `-kernel` loads only 32-bit multiboot kernels, so this stub is the
 * kernel: QEMU enters it in 32-bit protected mode, paging off. It builds an
 * identity map of the low 64 MiB with 4 KiB pages (as `mips` runs the
 * workload: `PageSize::Size4K`), enables PAE, long mode and paging, loads a
 * flat GDT, and jumps to the program's entry point (ENTRY, given by the
 * script from the ELF header) in 64-bit ring 0 with all other general
 * registers zero and interrupts off. One difference: RSP starts at 0x9f000,
 * not 0x100000, because on QEMU's PC 0xe0000-0xfffff is the BIOS's
 * read-only shadow (a stack there loses its writes); both are 16-byte
 * aligned, so the program runs the same instructions. The program's ELF itself is loaded
 * byte for byte by QEMU's generic loader (`-device loader,file=...`), which
 * copies each PT_LOAD segment and zero-fills its bss, as `elf::load_identity`
 * does. Used by scripts/qemu-mips.sh only; not part of any build or test. */

#ifndef ENTRY
#error "define ENTRY (the program's entry point)"
#endif

/* Page tables at 48 MiB: PML4, PDPT, one PD, 32 page tables. */
#define PT_BASE 0x3000000
#define PT_PAGES 32
#define PT_BYTES ((3 + PT_PAGES) * 0x1000)

    .code32
    .section .text
    .align 4
multiboot_header:
    .long 0x1BADB002            /* magic */
    .long 0                     /* flags: nothing requested */
    .long -(0x1BADB002)         /* checksum */

    .globl _start
_start:
    cli
    cld
    /* Zero the tables. */
    mov $PT_BASE, %edi
    mov $(PT_BYTES / 4), %ecx
    xor %eax, %eax
    rep stosl
    /* PML4[0] -> PDPT, PDPT[0] -> PD (present, writable). */
    movl $(PT_BASE + 0x1000 + 3), PT_BASE
    movl $(PT_BASE + 0x2000 + 3), PT_BASE + 0x1000
    /* PD[i] -> page table i. */
    mov $(PT_BASE + 0x2000), %edi
    mov $(PT_BASE + 0x3000 + 3), %eax
    mov $PT_PAGES, %ecx
1:  mov %eax, (%edi)
    add $8, %edi
    add $0x1000, %eax
    loop 1b
    /* Page table entries: 4 KiB page i at physical i * 4 KiB. */
    mov $(PT_BASE + 0x3000), %edi
    mov $3, %eax
    mov $(PT_PAGES * 512), %ecx
2:  mov %eax, (%edi)
    add $8, %edi
    add $0x1000, %eax
    loop 2b

    mov $PT_BASE, %eax
    mov %eax, %cr3
    mov %cr4, %eax
    or $((1 << 5) | (1 << 9) | (1 << 10)), %eax   /* PAE, OSFXSR, OSXMMEXCPT */
    mov %eax, %cr4
    mov $0xC0000080, %ecx       /* EFER */
    rdmsr
    or $(1 << 8), %eax          /* LME */
    wrmsr
    mov %cr0, %eax
    and $~(1 << 2), %eax        /* EM off */
    or $((1 << 31) | (1 << 1) | 1), %eax  /* PG, MP, PE */
    mov %eax, %cr0
    lgdt gdt_descriptor
    ljmp $0x08, $long_mode

    .code64
long_mode:
    mov $0x10, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    mov %eax, %fs
    mov %eax, %gs
    mov $0x9f000, %esp
    xor %eax, %eax
    xor %ebx, %ebx
    xor %ecx, %ecx
    xor %edx, %edx
    xor %esi, %esi
    xor %edi, %edi
    xor %ebp, %ebp
    xor %r8d, %r8d
    xor %r9d, %r9d
    xor %r10d, %r10d
    xor %r11d, %r11d
    xor %r12d, %r12d
    xor %r13d, %r13d
    xor %r14d, %r14d
    xor %r15d, %r15d
    jmp *entry(%rip)

    .align 8
entry:
    .quad ENTRY
gdt:
    .quad 0                     /* null */
    .quad 0x00af9a000000ffff    /* 0x08: 64-bit ring-0 code */
    .quad 0x00cf92000000ffff    /* 0x10: ring-0 data */
gdt_end:
gdt_descriptor:
    .word gdt_end - gdt - 1
    .long gdt

    .section .note.GNU-stack, "", @progbits
