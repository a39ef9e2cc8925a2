/* The exit-handler fuzz target's guest: runs the operations the fuzzer
 * wrote at OPS_GPA (struct op, until kind 0xff or the end of the page
 * range): WRMSR, RDMSR and VMCALL with the given index/number and
 * arguments. A refused MSR access is a #GP the handler skips. Exits 0x20. */
#include "hostile.h"

#define OPS_GPA 0x400000ull
#define MAX_OPS 2048

struct op {
    uint8_t kind;
    uint8_t pad[3];
    uint32_t index; /* MSR index or low half of the hypercall number */
    uint64_t args[4];
};

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    (void)bi;
    idt_init();
    const volatile struct op *ops = (const volatile struct op *)OPS_GPA;
    for (int i = 0; i < MAX_OPS && ops[i].kind != 0xff; i++) {
        uint64_t a0 = ops[i].args[0], a1 = ops[i].args[1], a2 = ops[i].args[2], a3 = ops[i].args[3];
        skip_len = 2;
        switch (ops[i].kind % 4) {
        case 0:
            wrmsr(ops[i].index, a0);
            break;
        case 1:
            (void)rdmsr(ops[i].index);
            break;
        case 2: /* faultline's own numbers */
            hypercall4(HC_FAULTLINE_BASE + (ops[i].index & 0xf), a0, a1, a2, a3);
            break;
        default:
            hypercall4(ops[i].index, a0, a1, a2, a3);
            break;
        }
    }
    debug_exit(0x20);
}
