/* The user programs, linked separately (user/user.ld) and embedded here. */
    .section .rodata
    .align 4096
    .globl user_image
user_image:
    .incbin USER_BIN
    .globl user_image_end
user_image_end:
    .section .note.GNU-stack, "", @progbits
