/* A ring-0 #GP handler that skips the faulting 2-byte WRMSR/RDMSR and
 * counts it, and `name=value` output lines: for the hv's test kernels that
 * probe MSR rules (one translation unit per kernel includes it). */
#ifndef MSR_PROBE_H
#define MSR_PROBE_H
#include "common.h"

volatile uint64_t gp_count;

struct idt_entry {
    uint16_t off_lo, sel;
    uint8_t ist, type;
    uint16_t off_mid;
    uint32_t off_hi, zero;
} __attribute__((packed));
static struct idt_entry idt[32];

void gp_handler(void);
__asm__(".globl gp_handler\n"
        "gp_handler:\n"
        "  add $8, %rsp\n"          /* the error code */
        "  addq $2, (%rsp)\n"       /* skip WRMSR/RDMSR (0f 30 / 0f 32) */
        "  incq gp_count(%rip)\n"
        "  iretq\n");

static void setup_idt(void) {
    uint64_t h = (uint64_t)gp_handler;
    idt[13] = (struct idt_entry){(uint16_t)h, 0x08, 0, 0x8e, (uint16_t)(h >> 16), (uint32_t)(h >> 32), 0};
    struct { uint16_t limit; uint64_t base; } __attribute__((packed)) idtr = {sizeof(idt) - 1, (uint64_t)idt};
    __asm__ volatile("lidt %0" ::"m"(idtr));
}

static inline void line(const char *name, uint64_t v) {
    puts_serial(name);
    putc_serial('=');
    puthex(v);
    putc_serial('\n');
}

/* How many #GPs the write raised (0 or 1). */
static inline uint64_t try_wrmsr(uint32_t msr, uint64_t v) {
    uint64_t before = gp_count;
    wrmsr(msr, v);
    return gp_count - before;
}

#endif
