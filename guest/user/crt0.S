/* User entry points and the image header the kernel reads. */
    .section .user_header, "a"
    .quad 0x31474d4955544c46 /* "FLTUIMG1" */
    .quad _start
    .quad _thread_start
    .quad _user_end

    .text
    .globl _start
/* RDI = argv block: argc, then argv[]. */
_start:
    mov %rdi, %rsi
    mov (%rsi), %rdi
    add $8, %rsi
    and $-16, %rsp
    movabs $umain, %rax
    call *%rax
    mov %eax, %edi
    movabs $exit, %rax
    call *%rax
1:  jmp 1b

/* RDI = function, RSI = its argument. */
_thread_start:
    and $-16, %rsp
    mov %rdi, %rax
    mov %rsi, %rdi
    call *%rax
    mov %eax, %edi
    movabs $exit, %rax
    call *%rax
1:  jmp 1b

    .section .note.GNU-stack, "", @progbits
