/* rt.h: the tiny freestanding runtime shared by the bare-mode test programs.
 *
 * Conventions of the machine (crates/machine/src/bare.rs):
 *   - COM1 at port 0x3f8: bytes written there go to the machine's serial
 *     output; the line-status register (0x3fd) always reports "transmitter
 *     empty".
 *   - isa-debug-exit at port 0xf4: writing value v stops the machine with
 *     exit status (v << 1) | 1, exactly as QEMU's isa-debug-exit device does.
 *     exit(0) therefore yields status 1 (success); exit(n) yields 2n + 1.
 *   - GDT selectors: 0x08 kernel code, 0x10 kernel data, 0x1b user data,
 *     0x23 user code (the SYSCALL/SYSRET layout), 0x28 the TSS.
 */
#ifndef RT_H
#define RT_H

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed long long s64;
typedef unsigned long usize;

#define KERNEL_CS 0x08
#define KERNEL_DS 0x10
#define USER_DS 0x1b
#define USER_CS 0x23
#define TSS_SELECTOR 0x28

#define COM1 0x3f8
#define DEBUG_EXIT_PORT 0xf4

#define RFLAGS_IF (1ull << 9)
#define RFLAGS_DF (1ull << 10)

#define PTE_P (1ull << 0)
#define PTE_W (1ull << 1)
#define PTE_U (1ull << 2)
#define PTE_A (1ull << 5)
#define PTE_D (1ull << 6)
#define PTE_PS (1ull << 7)
#define PTE_NX (1ull << 63)
#define PTE_ADDR 0x000ffffffffff000ull

#define MSR_APIC_BASE 0x1b
#define MSR_EFER 0xc0000080
#define MSR_STAR 0xc0000081
#define MSR_LSTAR 0xc0000082
#define MSR_FMASK 0xc0000084
#define MSR_GS_BASE 0xc0000101
#define MSR_KERNEL_GS_BASE 0xc0000102
#define EFER_SCE (1ull << 0)
#define EFER_NXE (1ull << 11)

static inline void outb(u16 port, u8 v) { __asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port)); }
static inline void outl(u16 port, u32 v) { __asm__ volatile("outl %0, %1" : : "a"(v), "Nd"(port)); }
static inline u8 inb(u16 port)
{
    u8 v;
    __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}

static inline u64 rdmsr(u32 msr)
{
    u32 lo, hi;
    __asm__ volatile("rdmsr" : "=a"(lo), "=d"(hi) : "c"(msr));
    return ((u64)hi << 32) | lo;
}
static inline void wrmsr(u32 msr, u64 v)
{
    __asm__ volatile("wrmsr" : : "c"(msr), "a"((u32)v), "d"((u32)(v >> 32)) : "memory");
}
static inline u64 rdtsc(void)
{
    u32 lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((u64)hi << 32) | lo;
}
static inline u64 read_cr2(void)
{
    u64 v;
    __asm__ volatile("mov %%cr2, %0" : "=r"(v));
    return v;
}
static inline u64 read_cr3(void)
{
    u64 v;
    __asm__ volatile("mov %%cr3, %0" : "=r"(v));
    return v;
}
static inline void write_cr3(u64 v) { __asm__ volatile("mov %0, %%cr3" : : "r"(v) : "memory"); }
static inline void invlpg(const void *va) { __asm__ volatile("invlpg (%0)" : : "r"(va) : "memory"); }
static inline u64 read_rflags(void)
{
    u64 v;
    __asm__ volatile("pushfq; popq %0" : "=r"(v));
    return v;
}
static inline u16 read_cs(void)
{
    u16 v;
    __asm__ volatile("mov %%cs, %0" : "=r"(v));
    return v;
}
static inline u16 read_ss(void)
{
    u16 v;
    __asm__ volatile("mov %%ss, %0" : "=r"(v));
    return v;
}
/* Keeps the compiler from moving memory accesses across this point (e.g.
 * a page-table store past the access it is meant to affect). */
static inline void barrier(void) { __asm__ volatile("" : : : "memory"); }
static inline void cli(void) { __asm__ volatile("cli" : : : "memory"); }
static inline void sti(void) { __asm__ volatile("sti" : : : "memory"); }

/* Serial output. */
void putc(char c);
void puts(const char *s);
void printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Stops the machine through isa-debug-exit: status (code << 1) | 1. */
__attribute__((noreturn)) void exit(int code);

/* Self-checks: a failed check prints its location and values and is
 * counted; check_report() prints a summary and returns the exit code. */
extern int check_failures;
extern int check_count;
void check_failed(const char *file, int line, const char *expr, u64 got, u64 want);
int check_report(const char *program);
#define CHECK(cond)                                                   \
    do {                                                              \
        check_count++;                                                \
        if (!(cond))                                                  \
            check_failed(__FILE__, __LINE__, #cond, 0, 0);            \
    } while (0)
#define CHECK_EQ(got, want)                                           \
    do {                                                              \
        u64 got_ = (u64)(got), want_ = (u64)(want);                   \
        check_count++;                                                \
        if (got_ != want_)                                            \
            check_failed(__FILE__, __LINE__, #got " == " #want, got_, want_); \
    } while (0)

/* Interrupt descriptor table. */
struct trap_frame {
    u64 r15, r14, r13, r12, r11, r10, r9, r8, rbp, rdi, rsi, rdx, rcx, rbx, rax;
    u64 vector, error_code;
    u64 rip, cs, rflags, rsp, ss; /* pushed by the CPU */
};
typedef void (*trap_handler_t)(struct trap_frame *frame);
/* Points all 256 vectors at the stubs of isr.S (DPL 0 interrupt gates, no
 * IST) and loads the IDT. Unhandled vectors stop the machine with a dump. */
void idt_init(void);
void idt_set_handler(u8 vector, trap_handler_t handler);
/* Gate options: dpl 0-3, ist 0 (none) or 1-7. */
void idt_set_gate(u8 vector, int dpl, int ist);
/* Marks a gate present or not present (delivery through it is then #NP). */
void idt_set_present(u8 vector, int present);

/* The TSS the machine set up (found through STR and SGDT). */
struct tss64 {
    u32 reserved0;
    u64 rsp[3];
    u64 reserved1;
    u64 ist[7];
    u64 reserved2;
    u16 reserved3;
    u16 iomap_base;
} __attribute__((packed));
struct tss64 *current_tss(void);

/* Page tables (identity-mapped, so physical addresses are usable as
 * pointers). Returns the leaf entry mapping va and its level (1 = 4 KiB
 * PTE, 2 = 2 MiB PDE, 3 = 1 GiB PDPTE), or 0 if va is unmapped. The
 * entries walked on the way have their U bit set if set_user is non-zero. */
u64 *pte_lookup(u64 va, int *level, int set_user);

void *memcpy(void *dst, const void *src, usize n);
void *memset(void *dst, int c, usize n);
void *memmove(void *dst, const void *src, usize n);
int memcmp(const void *a, const void *b, usize n);

#endif
