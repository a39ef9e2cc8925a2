/* A 256-entry IDT of interrupt gates and an exit to the hv (CPUID), for
 * the hv's test kernels that take interrupts or NMIs (with msr_probe.h's
 * #GP handler in gate 13). */
#ifndef GATES_H
#define GATES_H
#include "msr_probe.h"

struct gate { uint16_t off0, sel; uint8_t ist, type; uint16_t off1; uint32_t off2, zero; };
static struct gate gates[256];
struct interrupt_frame;

static inline void set_gate(int v, void *h) {
    uint64_t a = (uint64_t)h;
    gates[v] = (struct gate){(uint16_t)a, 0x08, 0, 0x8e, (uint16_t)(a >> 16), (uint32_t)(a >> 32), 0};
}

/* Loads `gates` with the #GP handler in place (msr_probe.h's 32-entry
 * table is loaded first and replaced). */
static inline void load_gates(void) {
    setup_idt();
    set_gate(13, (void *)gp_handler);
    struct { uint16_t limit; uint64_t base; } __attribute__((packed)) idtr = {sizeof(gates) - 1, (uint64_t)gates};
    __asm__ volatile("lidt %0" ::"m"(idtr));
}

static inline void exit_to_hv(void) {
    uint32_t r[4];
    cpuid(0, r);
}

#endif
