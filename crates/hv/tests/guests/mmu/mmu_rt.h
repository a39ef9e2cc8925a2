/* The runtime of the MMU test kernels (access matrix, random mutation).
 *
 * They run unchanged on the bare machine (no hypervisor) and under the hv
 * (EPT or shadow paging), so they take nothing from either environment but
 * RAM at 0..64 MiB identity-mapped at entry, COM1 and the isa-debug-exit
 * port: no boot info, no hypercalls. They bring their own GDT (ring-0 and
 * ring-3 segments), TSS, IDT and page tables, and their own stack.
 *
 * Accesses under test run through run_access(): an iretq to the access
 * stub at the chosen CPL and RFLAGS; the stub ends in `int $0x80` (DPL 3),
 * and every exception handler, like the int 0x80 handler, records what
 * happened (vector, error code, CR2, RAX) and longjmps back to the caller
 * of run_access(). So a fault is an outcome, never a crash.
 *
 * Virtual layout (PML4 slots):
 *   0: identity map of the first 1 GiB with 2 MiB supervisor pages (the
 *      kernel, its tables and the physical pages the tests use);
 *   1, 3, 4, ...: the tests' own address spaces;
 *   2: USER_STUBS, an alias of the access stubs' page, user and read-only,
 *      for ring-3 accesses.
 */
#ifndef MMU_RT_H
#define MMU_RT_H
#include <stdint.h>

#define COM1 0x3f8
#define EXIT_PORT 0xf4

#define PTE_P (1ull << 0)
#define PTE_W (1ull << 1)
#define PTE_U (1ull << 2)
#define PTE_A (1ull << 5)
#define PTE_D (1ull << 6)
#define PTE_PS (1ull << 7)
#define PTE_G (1ull << 8)
#define PTE_NX (1ull << 63)
#define PTE_ADDR 0x000ffffffffff000ull

#define PF_P (1u << 0)
#define PF_W (1u << 1)
#define PF_U (1u << 2)
#define PF_RSVD (1u << 3)
#define PF_I (1u << 4)

#define CR0_WP (1ull << 16)
#define CR4_PGE (1ull << 7)
#define CR4_SMEP (1ull << 20)
#define CR4_SMAP (1ull << 21)
#define EFER_MSR 0xc0000080u
#define EFER_NXE (1ull << 11)
#define RFLAGS_AC (1ull << 18)

#define KERNEL_CS 0x08
#define KERNEL_DS 0x10
#define USER_DS (0x18 | 3)
#define USER_CS (0x20 | 3)
#define TSS_SEL 0x28

/* Vector of the "access done" software interrupt. */
#define VEC_DONE 0x80
/* GVA of the user alias of the stub page (PML4 slot 2). */
#define USER_STUBS 0x0000010000000000ull

static inline void outb(uint16_t port, uint8_t v) { __asm__ volatile("outb %0, %1" ::"a"(v), "Nd"(port)); }
static inline uint8_t inb(uint16_t port) { uint8_t v; __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port)); return v; }
static inline uint64_t rdmsr(uint32_t m) { uint32_t lo, hi; __asm__ volatile("rdmsr" : "=a"(lo), "=d"(hi) : "c"(m)); return ((uint64_t)hi << 32) | lo; }
static inline void wrmsr(uint32_t m, uint64_t v) { __asm__ volatile("wrmsr" ::"c"(m), "a"((uint32_t)v), "d"((uint32_t)(v >> 32))); }
static inline uint64_t read_cr0(void) { uint64_t v; __asm__ volatile("mov %%cr0, %0" : "=r"(v)); return v; }
static inline uint64_t read_cr4(void) { uint64_t v; __asm__ volatile("mov %%cr4, %0" : "=r"(v)); return v; }
static inline void write_cr0(uint64_t v) { __asm__ volatile("mov %0, %%cr0" ::"r"(v) : "memory"); }
static inline void write_cr3(uint64_t v) { __asm__ volatile("mov %0, %%cr3" ::"r"(v) : "memory"); }
static inline void write_cr4(uint64_t v) { __asm__ volatile("mov %0, %%cr4" ::"r"(v) : "memory"); }
static inline void invlpg(uint64_t va) { __asm__ volatile("invlpg (%0)" ::"r"(va) : "memory"); }

static void putc_serial(char c) {
    while (!(inb(COM1 + 5) & 0x20)) {}
    outb(COM1, (uint8_t)c);
}
static void puts_serial(const char *s) { while (*s) putc_serial(*s++); }
static void putu(uint64_t v) {
    char buf[21]; int i = 20; buf[i] = 0;
    do { buf[--i] = (char)('0' + v % 10); v /= 10; } while (v);
    puts_serial(&buf[i]);
}
static void puthex(uint64_t v) {
    puts_serial("0x");
    for (int i = 60; i >= 0; i -= 4) putc_serial("0123456789abcdef"[(v >> i) & 0xf]);
}
static __attribute__((noreturn)) void debug_exit(uint8_t v) {
    outb(EXIT_PORT, v);
    for (;;) __asm__ volatile("cli; hlt");
}

/* FNV-1a over 64-bit words: the digest of a run. */
static uint64_t digest = 0xcbf29ce484222325ull;
static void fold(uint64_t w) {
    for (int i = 0; i < 8; i++) {
        digest ^= (w >> (8 * i)) & 0xff;
        digest *= 0x100000001b3ull;
    }
}

/* What the last run_access() ended with. */
struct trap {
    uint64_t vector, error, cr2, rax, rip;
};
volatile struct trap last_trap;
/* The kernel stack pointer run_access() longjmps back to. */
uint64_t access_return_rsp;

/* Tables and stacks, all in the identity-mapped image. */
static uint64_t kernel_pml4[512] __attribute__((aligned(4096)));
static uint64_t ident_pdpt[512] __attribute__((aligned(4096)));
static uint64_t ident_pd[512] __attribute__((aligned(4096)));
static uint64_t stub_pdpt[512] __attribute__((aligned(4096)));
static uint64_t stub_pd[512] __attribute__((aligned(4096)));
static uint64_t stub_pt[512] __attribute__((aligned(4096)));
static uint64_t gdt[7] __attribute__((aligned(16)));
static uint8_t tss[104] __attribute__((aligned(16)));
static uint64_t idt[512] __attribute__((aligned(4096)));
uint8_t kernel_stack[16384] __attribute__((aligned(4096)));
/* Stack of CPL-0 accesses and of every trap (TSS.RSP0). */
static uint8_t trap_stack[8192] __attribute__((aligned(4096)));

/* Entry: our own stack, then main(). */
__asm__(".section .text.start, \"ax\"\n"
        ".globl _start\n"
        "_start:\n"
        "  lea kernel_stack+16384(%rip), %rsp\n"
        "  call rt_main\n"
        "1: hlt\n"
        "  jmp 1b\n"
        ".text\n");

/* run_access(rip, cs, rflags, rsp, ss, rdi, rsi): iretq to rip with rdi
 * and rsi set; returns when a trap or the done interrupt longjmps back. */
void run_access(uint64_t rip, uint64_t cs, uint64_t rflags, uint64_t rsp, uint64_t ss, uint64_t rdi,
                uint64_t rsi);
__asm__(".text\n"
        ".globl run_access\n"
        "run_access:\n"
        "  push %rbp\n push %rbx\n push %r12\n push %r13\n push %r14\n push %r15\n"
        "  mov %rsp, access_return_rsp(%rip)\n"
        "  mov 56(%rsp), %rax\n"
        "  push %r8\n push %rcx\n push %rdx\n push %rsi\n push %rdi\n"
        "  mov %r9, %rdi\n"
        "  mov %rax, %rsi\n"
        "  iretq\n"
        /* Every vector lands here with (vector, error) pushed. */
        "trap_common:\n"
        "  mov %rax, last_trap+24(%rip)\n"
        "  pop %rax\n mov %rax, last_trap+0(%rip)\n"
        "  pop %rax\n mov %rax, last_trap+8(%rip)\n"
        "  mov %cr2, %rax\n mov %rax, last_trap+16(%rip)\n"
        "  mov (%rsp), %rax\n mov %rax, last_trap+32(%rip)\n"
        "  mov $0x10, %eax\n mov %eax, %ss\n mov %eax, %ds\n mov %eax, %es\n"
        "  mov access_return_rsp(%rip), %rsp\n"
        "  pushq $2\n popfq\n"
        "  pop %r15\n pop %r14\n pop %r13\n pop %r12\n pop %rbx\n pop %rbp\n"
        "  ret\n");

/* Per-vector entry points: 0..31 and VEC_DONE, 16 bytes apart. Vectors
 * 8, 10-14, 17, 21, 29, 30 push an error code; the others push 0. */
extern char trap_entries[];
__asm__(".text\n"
        ".balign 16\n"
        ".globl trap_entries\n"
        "trap_entries:\n"
        ".irp v, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,128\n"
        "  .balign 16\n"
        "  .if (\\v == 8) || (\\v >= 10 && \\v <= 14) || (\\v == 17) || (\\v == 21) || (\\v == 29) || (\\v == 30)\n"
        "  .else\n"
        "  pushq $0\n"
        "  .endif\n"
        "  pushq $\\v\n"
        "  jmp trap_common\n"
        ".endr\n");

/* The access stubs: one page, aliased for ring 3 at USER_STUBS. Each ends
 * in `int $0x80`; a fetch jumps to the target, which holds `int $0x80`.
 * Byte accesses (the matrix) and 8-byte ones (the random test: the value
 * stored is RSI, the value loaded comes back in RAX). */
extern char stubs_page[], stub_read[], stub_write[], stub_fetch[], stub_load[], stub_store[];
__asm__(".section .text.user, \"ax\"\n"
        ".balign 4096\n"
        ".globl stubs_page, stub_read, stub_write, stub_fetch, stub_load, stub_store\n"
        "stubs_page:\n"
        "stub_read:\n  movzbl (%rdi), %eax\n  int $0x80\n"
        "stub_write:\n  movb $0xa5, (%rdi)\n  xor %eax, %eax\n  int $0x80\n"
        "stub_fetch:\n  jmp *%rdi\n"
        "stub_load:\n  mov (%rdi), %rax\n  int $0x80\n"
        "stub_store:\n  mov %rsi, (%rdi)\n  xor %eax, %eax\n  int $0x80\n"
        ".balign 4096\n"
        ".text\n");

enum access_kind { ACC_READ, ACC_WRITE, ACC_FETCH, ACC_LOAD, ACC_STORE };
/* The two bytes `int $0x80` that a fetch target holds. */
#define INT80_LO 0xcd
#define INT80_HI 0x80

static void set_gate(int vector, uint64_t handler, int dpl) {
    idt[2 * vector] = (handler & 0xffff) | ((uint64_t)KERNEL_CS << 16) | (0x8eull << 40) |
                      ((uint64_t)dpl << 45) | ((handler >> 16 & 0xffff) << 48);
    idt[2 * vector + 1] = handler >> 32;
}

/* GDT, TSS and IDT of our own. */
static void setup_cpu(void) {
    gdt[0] = 0;
    gdt[1] = 0x00af9a000000ffffull; /* kernel code */
    gdt[2] = 0x00cf92000000ffffull; /* kernel data */
    gdt[3] = 0x00cff2000000ffffull; /* user data */
    gdt[4] = 0x00affa000000ffffull; /* user code */
    uint64_t t = (uint64_t)tss;
    gdt[5] = (sizeof tss - 1) | ((t & 0xffffff) << 16) | (0x89ull << 40) | ((t >> 24 & 0xff) << 56);
    gdt[6] = t >> 32;
    uint64_t rsp0 = (uint64_t)trap_stack + sizeof trap_stack;
    for (int i = 0; i < 8; i++) tss[4 + i] = (uint8_t)(rsp0 >> (8 * i));
    tss[0x66] = sizeof tss;
    struct __attribute__((packed)) { uint16_t limit; uint64_t base; } gdtr = {sizeof gdt - 1, (uint64_t)gdt},
                                                                        idtr = {sizeof idt - 1, (uint64_t)idt};
    __asm__ volatile("lgdt %0\n"
                     "  pushq $0x08\n  lea 1f(%%rip), %%rax\n  pushq %%rax\n  lretq\n"
                     "1: mov $0x10, %%eax\n  mov %%eax, %%ds\n  mov %%eax, %%es\n  mov %%eax, %%ss\n"
                     "  mov $0x28, %%eax\n  ltr %%ax\n" ::"m"(gdtr)
                     : "rax", "memory");
    for (int v = 0; v < 32; v++) set_gate(v, (uint64_t)trap_entries + 16 * v, 0);
    set_gate(VEC_DONE, (uint64_t)trap_entries + 16 * 32, 3);
    __asm__ volatile("lidt %0" ::"m"(idtr) : "memory");
}

/* Our page tables: the identity map and the stub alias. Test address
 * spaces fill in the other PML4 slots of `kernel_pml4` (or their own
 * copies of it) before loading it. */
static void setup_paging(void) {
    for (uint64_t i = 0; i < 512; i++) ident_pd[i] = (i << 21) | PTE_P | PTE_W | PTE_PS;
    ident_pdpt[0] = (uint64_t)ident_pd | PTE_P | PTE_W;
    kernel_pml4[0] = (uint64_t)ident_pdpt | PTE_P | PTE_W;
    stub_pt[0] = (uint64_t)stubs_page | PTE_P | PTE_U;
    stub_pd[0] = (uint64_t)stub_pt | PTE_P | PTE_W | PTE_U;
    stub_pdpt[0] = (uint64_t)stub_pd | PTE_P | PTE_W | PTE_U;
    kernel_pml4[2] = (uint64_t)stub_pdpt | PTE_P | PTE_W | PTE_U;
    write_cr3((uint64_t)kernel_pml4);
}


/* The paravirtual CR3 cache (seed 004), compiled in with -DCR3_CACHE and
 * used as the bundled kernel uses it (guest/kernel/cr3cache.c): where the
 * hv offers it (the KVM CPUID leaf's KVM_FEATURE_CR3_CACHE: shadow paging
 * with `cr3_cache`), the first switch registers a table and every switch
 * looks its CR3 up there, loading a cached shadow root without an exit;
 * elsewhere (bare, EPT) switch_cr3 is a plain MOV to CR3. The kernel keeps
 * the CR3 it meant (pml4s[]), never reading CR3 back. */
#ifdef CR3_CACHE
#define MMU_KVM_FEATURE_CR3_CACHE (1u << 28)
#define MMU_HC_CR3_CACHE_REGISTER 0x46000010ull
#define MMU_CR3_CACHE_MAX 16
static struct {
    struct { uint64_t guest_cr3, host_cr3; } entry[MMU_CR3_CACHE_MAX];
    uint32_t max_idx, pad;
    uint64_t wanted_cr3;
} cr3c __attribute__((aligned(512)));
static int cr3c_state; /* 0: not probed, 1: on, -1: off */
static uint64_t cr3c_hits, cr3c_misses;

static void cr3c_probe(void) {
    uint32_t a, b, c, d;
    cr3c_state = -1;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x40000000u), "c"(0));
    if (b != 0x4b4d564b || c != 0x564b4d56 || d != 0x4d) return; /* "KVMKVMKVM" */
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x40000001u), "c"(0));
    if (!(a & MMU_KVM_FEATURE_CR3_CACHE)) return;
    long rc;
    __asm__ volatile("vmcall" : "=a"(rc) : "a"(MMU_HC_CR3_CACHE_REGISTER), "b"((uint64_t)&cr3c), "c"(0), "d"(0), "S"(0) : "memory");
    if (rc > 0) cr3c_state = 1;
}

static void switch_cr3(uint64_t cr3) {
    if (!cr3c_state) cr3c_probe();
    if (cr3c_state < 0) {
        write_cr3(cr3);
        return;
    }
    __atomic_store_n(&cr3c.wanted_cr3, cr3, __ATOMIC_RELAXED);
    uint32_t n = cr3c.max_idx < MMU_CR3_CACHE_MAX ? cr3c.max_idx : MMU_CR3_CACHE_MAX;
    uint64_t load = cr3;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t host = __atomic_load_n(&cr3c.entry[i].host_cr3, __ATOMIC_RELAXED);
        if (host && __atomic_load_n(&cr3c.entry[i].guest_cr3, __ATOMIC_RELAXED) == cr3) {
            load = host;
            break;
        }
    }
    if (load != cr3) cr3c_hits++;
    else cr3c_misses++;
    write_cr3(load);
}
#else
static inline void switch_cr3(uint64_t cr3) { write_cr3(cr3); }
#endif

/* The address of `stub` (one of stub_*) for code at `cpl`. */
static uint64_t stub_at(const char *stub, int cpl) {
    uint64_t off = (uint64_t)(stub - stubs_page);
    return cpl == 3 ? USER_STUBS + off : (uint64_t)stub;
}

/* Runs `kind` on `va` at `cpl` (0 or 3) with RFLAGS.AC = `ac` (a store
 * writes `value`); the outcome is in last_trap (vector VEC_DONE: no
 * fault). */
static void access_at(enum access_kind kind, uint64_t va, int cpl, int ac, uint64_t value) {
    static const char *const stubs[] = {stub_read, stub_write, stub_fetch, stub_load, stub_store};
    const char *stub = stubs[kind];
    uint64_t rflags = 2 | (ac ? RFLAGS_AC : 0);
    uint64_t sp = (uint64_t)trap_stack + sizeof trap_stack;
    if (cpl == 3)
        run_access(stub_at(stub, 3), USER_CS, rflags, 0, USER_DS, va, value);
    else
        run_access(stub_at(stub, 0), KERNEL_CS, rflags, sp, KERNEL_DS, va, value);
}

void rt_main(void);
#endif
