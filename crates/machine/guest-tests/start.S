/* Entry point of a bare-mode test program.
 *
 * The machine enters here in 64-bit ring 0, paging on (identity map of all
 * RAM), interrupts off, RSP at the 16-byte aligned top of the boot stack,
 * all other general registers zero. The loader has already zero-filled .bss.
 * kmain's return value becomes the exit code (see exit() in rt.c). */
    .section .text.start, "ax"
    .globl _start
    .type _start, @function
_start:
    xor %ebp, %ebp          /* terminate frame-pointer chains */
    call kmain
    mov %eax, %edi
    call exit               /* does not return */
1:  cli
    hlt
    jmp 1b
    .size _start, . - _start

    .section .note.GNU-stack, "", @progbits
