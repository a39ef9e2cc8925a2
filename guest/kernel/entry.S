/* Entry points, interrupt stubs, the syscall path and the context switch. */
#define SEL_UDATA (0x18 | 3)

    .section .text.entry, "ax"
    .globl _start
_start:
    /* RDI = struct boot_info * (the hv's boot protocol). */
    lea boot_stack_top(%rip), %rsp
    xor %ebp, %ebp
    call kmain
1:  cli
    hlt
    jmp 1b

    .text
    /* Application processors: RSP = the idle task's stack, RDI = struct cpu *. */
    .globl ap_entry
ap_entry:
    xor %ebp, %ebp
    call ap_main
1:  cli
    hlt
    jmp 1b

/* One stub per vector: push a zero error code where the CPU pushes none,
 * then the vector number, and join the common path. */
.macro isr_stub vec
    .align 16
isr_\vec:
    .if (\vec == 8) || (\vec == 10) || (\vec == 11) || (\vec == 12) || (\vec == 13) || (\vec == 14) || (\vec == 17) || (\vec == 21) || (\vec == 29) || (\vec == 30)
    .else
    pushq $0
    .endif
    pushq $\vec
    jmp isr_common
.endm

.altmacro
.macro isr_stub_n n
    isr_stub %n
.endm
.set vec, 0
.rept 256
    isr_stub_n %vec
    .set vec, vec + 1
.endr

isr_common:
    /* Stack: vector, error, rip, cs, rflags, rsp, ss. From user mode the
     * GS base is the user's: swap in the per-CPU one. */
    testb $3, 24(%rsp)
    jz 1f
    swapgs
1:  push %rax
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
    cld
    mov %rsp, %rdi
    call trap
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
    testb $3, 24(%rsp)
    jz 2f
    swapgs
2:  add $16, %rsp
    iretq

    .section .rodata
    .align 8
    .globl isr_table
isr_table:
.macro isr_addr n
    .quad isr_\n
.endm
.set vec, 0
.rept 256
    isr_addr %vec
    .set vec, vec + 1
.endr

    .text
/* SYSCALL: RAX = number, RDI, RSI, RDX, R10 = arguments; RCX = user RIP,
 * R11 = user RFLAGS. Interrupts are off (FMASK) until SYSRET. Every
 * register but RAX, RCX and R11 is preserved for the caller. */
    .globl syscall_entry
syscall_entry:
    swapgs
    mov %rsp, %gs:8
    mov %gs:16, %rsp
    pushq %gs:8
    push %rcx
    push %r11
    push %rdi
    push %rsi
    push %rdx
    push %r8
    push %r9
    push %r10
    sub $8, %rsp
    mov %r10, %r8
    mov %rdx, %rcx
    mov %rsi, %rdx
    mov %rdi, %rsi
    mov %rax, %rdi
    call syscall_dispatch
    add $8, %rsp
    pop %r10
    pop %r9
    pop %r8
    pop %rdx
    pop %rsi
    pop %rdi
    pop %r11
    pop %rcx
    pop %rsp
    swapgs
    sysretq

/* enter_user(rip, rsp, a0, a1): first entry of a thread into ring 3 with
 * RDI = a0 and RSI = a1. */
    .globl enter_user
enter_user:
    cli
    mov %rcx, %r8
    mov %rdi, %rcx
    mov %rsi, %rax
    mov %rdx, %rdi
    mov %r8, %rsi
    mov $0x202, %r11
    xor %edx, %edx
    xor %ebx, %ebx
    xor %ebp, %ebp
    xor %r8d, %r8d
    xor %r9d, %r9d
    xor %r10d, %r10d
    xor %r12d, %r12d
    xor %r13d, %r13d
    xor %r14d, %r14d
    xor %r15d, %r15d
    mov %rax, %rsp
    xor %eax, %eax
    swapgs
    sysretq

/* context_switch(&old->rsp, new->rsp): callee-saved registers on the old
 * stack, then resume the new one where it switched out. */
    .globl context_switch
context_switch:
    push %rbx
    push %rbp
    push %r12
    push %r13
    push %r14
    push %r15
    mov %rsp, (%rdi)
    mov %rsi, %rsp
    pop %r15
    pop %r14
    pop %r13
    pop %r12
    pop %rbp
    pop %rbx
    ret

    .globl task_trampoline
task_trampoline:
    call task_first_run
1:  hlt
    jmp 1b

    .bss
    .align 16
boot_stack:
    .space 16384
boot_stack_top:

    .section .note.GNU-stack, "", @progbits
