/* Interrupt and exception entry stubs for all 256 vectors.
 *
 * Each stub pushes a dummy error code (for vectors where the CPU pushes
 * none), then the vector number, and jumps to isr_common, which saves the
 * general registers into a struct trap_frame (rt.h) and calls
 * trap_dispatch(frame). The handler may edit the frame (e.g. RIP, to resume
 * after a faulting instruction); isr_common restores it with IRETQ.
 * isr_stub_table[n] holds the address of the stub for vector n. */

    .text

/* Vectors for which the CPU pushes an error code. */
#define HAS_ERROR_CODE(n) ((n) == 8 || (n) == 10 || (n) == 11 || (n) == 12 || \
                           (n) == 13 || (n) == 14 || (n) == 17 || (n) == 21 || \
                           (n) == 29 || (n) == 30)

    .altmacro
    .macro isr_stub n
    .align 16
isr_stub_\n:
    .if HAS_ERROR_CODE(\n)
    .else
    pushq $0
    .endif
    pushq $\n
    jmp isr_common
    .endm

    .macro isr_stub_address n
    .quad isr_stub_\n
    .endm

    .set vec, 0
    .rept 256
    isr_stub %vec
    .set vec, vec + 1
    .endr

isr_common:
    push %rax
    push %rbx
    push %rcx
    push %rdx
    push %rsi
    push %rdi
    push %rbp
    push %r8
    push %r9
    push %r10
    push %r11
    push %r12
    push %r13
    push %r14
    push %r15
    mov %rsp, %rdi          /* struct trap_frame * */
    mov %rsp, %rbx          /* callee-saved: survives the call */
    and $-16, %rsp          /* ABI stack alignment for the C handler */
    cld
    call trap_dispatch
    mov %rbx, %rsp
    pop %r15
    pop %r14
    pop %r13
    pop %r12
    pop %r11
    pop %r10
    pop %r9
    pop %r8
    pop %rbp
    pop %rdi
    pop %rsi
    pop %rdx
    pop %rcx
    pop %rbx
    pop %rax
    add $16, %rsp           /* vector and error code */
    iretq

    .section .rodata
    .align 8
    .globl isr_stub_table
isr_stub_table:
    .set vec, 0
    .rept 256
    isr_stub_address %vec
    .set vec, vec + 1
    .endr

    .section .note.GNU-stack, "", @progbits
