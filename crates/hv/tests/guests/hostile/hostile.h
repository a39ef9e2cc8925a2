/* Helpers of the hostile test kernels: a deterministic PRNG, an IDT whose
 * #GP and #UD handlers count the fault and skip `skip_len` bytes (so a
 * kernel can try an instruction the hv may refuse and go on), and whose
 * other vectors end the run with status 0x7d. */
#ifndef HOSTILE_H
#define HOSTILE_H
#include "common.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static inline uint64_t rnd(void) {
    uint64_t x = rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return x * 0x2545f4914f6cdd1dull;
}

/* Read by the stubs: bytes to skip after a #GP/#UD, and faults taken. */
volatile uint64_t skip_len = 2;
volatile uint64_t faults_gp, faults_ud;

__asm__(".text\n"
        "gp_stub:\n"
        "  add $8, %rsp\n" /* the error code */
        "  incq faults_gp(%rip)\n"
        "  jmp skip\n"
        "ud_stub:\n"
        "  incq faults_ud(%rip)\n"
        "skip:\n"
        "  push %rax\n"
        "  mov skip_len(%rip), %rax\n"
        "  add %rax, 8(%rsp)\n"
        "  pop %rax\n"
        "  iretq\n"
        "fatal_stub:\n"
        "  mov $0x7d, %al\n"
        "  out %al, $0xf4\n"
        "1: cli; hlt; jmp 1b\n");
extern char gp_stub[], ud_stub[], fatal_stub[];

struct gate {
    uint64_t lo, hi;
};
static struct gate idt[256] __attribute__((aligned(16)));

static inline struct gate make_gate(void *handler) {
    uint64_t h = (uint64_t)handler;
    uint16_t cs;
    __asm__ volatile("mov %%cs, %0" : "=r"(cs));
    return (struct gate){(h & 0xffff) | ((uint64_t)cs << 16) | (0x8eull << 40) | (((h >> 16) & 0xffff) << 48),
                         h >> 32};
}

static inline void load_idt(void *base, uint16_t limit) {
    struct __attribute__((packed)) {
        uint16_t limit;
        uint64_t base;
    } r = {limit, (uint64_t)base};
    __asm__ volatile("lidt %0" ::"m"(r));
}

static inline void idt_init(void) {
    for (int v = 0; v < 256; v++)
        idt[v] = make_gate(fatal_stub);
    idt[6] = make_gate(ud_stub);
    idt[13] = make_gate(gp_stub);
    load_idt(idt, sizeof(idt) - 1);
}

static inline int streq(const char *a, const char *b) {
    while (*a && *a == *b) {
        a++;
        b++;
    }
    return *a == *b;
}

/* The program named after "-- " on the command line ("" without one). */
static inline const char *variant(const struct boot_info *bi) {
    const char *s = (const char *)bi->cmdline;
    for (; *s; s++)
        if (s[0] == '-' && s[1] == '-' && s[2] == ' ')
            return s + 3;
    return "";
}

static inline void line(const char *key, uint64_t v) {
    puts_serial(key);
    puts_serial("=");
    putu(v);
    puts_serial("\n");
}
#endif
