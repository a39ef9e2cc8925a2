/* ACPI S3 as an OS enters it and resumes (tests/s3.rs): a multiboot
 * kernel that stays in 32-bit protected mode, finds the FADT through the
 * RSDP and XSDT, the FACS and the PM1a blocks through the FADT and S3's
 * SLP_TYP in the DSDT's `_S3_`, fills a pattern below 1 MiB, copies its
 * real-mode resume code to RESUME and writes that address to the FACS's
 * firmware waking vector, sets the RTC alarm (every field "don't care",
 * AIE) and RTC_EN, and writes SLP_EN with S3's SLP_TYP to PM1a_CNT.
 * The resume code records, at OUT, what it finds: its CS and IP, PM1_STS,
 * RTC register C, the RTC's seconds and the pattern's byte sum; then it
 * exits through isa-debug-exit with 0 (status 1). Anything found missing
 * stops it at once with the step's number (status 2 * step + 1). */

#define MB_MAGIC 0x1badb002
#define MB_FLAGS 0x00000000
/* The waking vector: CS = 0x800, IP = 4. */
#define RESUME 0x8004
#define PATTERN 0x9000
#define PATTERN_END 0xa000
/* What the test reads back (all below 64 KiB: real mode reaches it). */
#define OUT 0x500
#define OUT_CS (OUT + 0)
#define OUT_IP (OUT + 2)
#define OUT_PM1_STS (OUT + 4)
#define OUT_RTC_C (OUT + 6)
#define OUT_SECONDS (OUT + 8)
#define OUT_SUM (OUT + 12)
#define OUT_SECONDS_BEFORE (OUT + 16)
#define OUT_AFTER_SLP_EN (OUT + 20)
/* The PM1a event block's port, for the resume code. */
#define PM1A_EVT (OUT + 32)

    .section .multiboot, "a"
    .align 4
    .long MB_MAGIC, MB_FLAGS, -(MB_MAGIC + MB_FLAGS)

    .text
    .code32
    .globl _start
_start:
    movl $1, %ecx
    cmpl $0x2badb002, %eax
    jne fail
    movl $stack_top, %esp
    /* The RSDP: "RSD PTR " on a 16-byte boundary in 0xe0000..0x100000. */
    movl $2, %ecx
    movl $0xe0000, %esi
1:  cmpl $0x20445352, (%esi)
    jne 2f
    cmpl $0x20525450, 4(%esi)
    je 3f
2:  addl $16, %esi
    cmpl $0x100000, %esi
    jb 1b
    jmp fail
    /* The XSDT (below 4 GiB), and the FADT ("FACP") among its entries. */
3:  movl $3, %ecx
    movl 24(%esi), %esi
    cmpl $0x54445358, (%esi)
    jne fail
    movl 4(%esi), %edx
    addl %esi, %edx
    leal 36(%esi), %ebx
4:  cmpl %edx, %ebx
    jae fail
    movl (%ebx), %edi
    cmpl $0x50434146, (%edi)
    je 5f
    addl $8, %ebx
    jmp 4b
    /* FIRMWARE_CTRL, PM1a_EVT_BLK, PM1a_CNT_BLK, X_DSDT. */
5:  movl $4, %ecx
    movl 36(%edi), %eax
    testl %eax, %eax
    jz fail
    cmpl $0x53434146, (%eax)
    jne fail
    movl %eax, facs
    movl 56(%edi), %eax
    testl %eax, %eax
    jz fail
    movw %ax, PM1A_EVT
    movl 64(%edi), %eax
    testl %eax, %eax
    jz fail
    movl %eax, pm1a_cnt
    /* `_S3_`'s first element: Name, PackageOp, PkgLength, NumElements,
     * then ZeroOp, OneOp or BytePrefix n. */
    movl $5, %ecx
    movl 140(%edi), %esi
    movl 4(%esi), %edx
    addl %esi, %edx
6:  cmpl %edx, %esi
    jae fail
    cmpl $0x5f33535f, (%esi)
    je 7f
    incl %esi
    jmp 6b
7:  cmpb $0x12, 4(%esi)
    jne fail
    movzbl 7(%esi), %eax
    cmpb $0x0a, %al
    jne 8f
    movzbl 8(%esi), %eax
8:  cmpl $7, %eax
    ja fail
    movl %eax, slp_typ
    /* The pattern, and the resume code at RESUME. */
    xorl %ecx, %ecx
9:  leal (%ecx,%ecx,2), %eax
    leal 3(%eax,%ecx,4), %eax
    movb %al, PATTERN(%ecx)
    incl %ecx
    cmpl $(PATTERN_END - PATTERN), %ecx
    jne 9b
    movl $resume_start, %esi
    movl $RESUME, %edi
    movl $(resume_end - resume_start), %ecx
    rep movsb
    movl facs, %eax
    movl $RESUME, 12(%eax)
    /* RTC: clear register C, alarm don't care everywhere, AIE. */
    movb $0x0c, %al
    outb %al, $0x70
    inb $0x71, %al
    movb $0x00, %al
    outb %al, $0x70
    inb $0x71, %al
    movb %al, OUT_SECONDS_BEFORE
    movb $1, %bl
10: movb %bl, %al
    outb %al, $0x70
    movb $0xc0, %al
    outb %al, $0x71
    addb $2, %bl
    cmpb $7, %bl
    jne 10b
    movb $0x0b, %al
    outb %al, $0x70
    inb $0x71, %al
    orb $0x20, %al
    movb %al, %ah
    movb $0x0b, %al
    outb %al, $0x70
    movb %ah, %al
    outb %al, $0x71
    /* RTC_EN in PM1_EN (PM1a_EVT_BLK + 2), then SLP_EN with S3. */
    movzwl PM1A_EVT, %edx
    addl $2, %edx
    movw $0x400, %ax
    outw %ax, %dx
    movl slp_typ, %eax
    shll $10, %eax
    orl $0x2000, %eax
    movl pm1a_cnt, %edx
    outw %ax, %dx
    /* Not asleep: count the loops (the test sees them). */
11: incl OUT_AFTER_SLP_EN
    jmp 11b

    /* Stops with status 2 * step + 1. */
fail:
    movl %ecx, %eax
    outb %al, $0xf4
12: hlt
    jmp 12b

    /* Real mode at CS:IP = 0x800:4, as firmware hands over on resume. */
    .code16
resume_start:
    call 1f
1:  popw %ax
    subw $(1b - resume_start), %ax
    movw %ax, OUT_IP
    movw %cs, %ax
    movw %ax, OUT_CS
    movw PM1A_EVT, %dx
    inw %dx, %ax
    movw %ax, OUT_PM1_STS
    movb $0x0c, %al
    outb %al, $0x70
    inb $0x71, %al
    movb %al, OUT_RTC_C
    movb $0x00, %al
    outb %al, $0x70
    inb $0x71, %al
    movb %al, OUT_SECONDS
    xorl %ebx, %ebx
    movw $PATTERN, %si
2:  movzbl (%si), %eax
    addl %eax, %ebx
    incw %si
    cmpw $PATTERN_END, %si
    jne 2b
    movl %ebx, OUT_SUM
    xorw %ax, %ax
    outb %al, $0xf4
3:  hlt
    jmp 3b
resume_end:
    .code32

    .data
    .align 4
facs: .long 0
pm1a_cnt: .long 0
slp_typ: .long 0
    .align 16
stack: .space 4096
stack_top:
