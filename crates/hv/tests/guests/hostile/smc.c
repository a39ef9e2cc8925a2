/* Self-modifying code: a routine rewritten before each call, and one that
 * rewrites the immediate of its own next instruction (which must then run
 * with the new value, as x86 requires). Exits 0x15 if every result was
 * right, 0x7c otherwise. */
#include "hostile.h"

static uint8_t code[64] __attribute__((aligned(64)));

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    (void)bi;
    idt_init();
    uint64_t bad = 0;
    for (uint32_t i = 0; i < 500; i++) {
        uint32_t want = (uint32_t)rnd();
        /* mov $want, %eax; ret */
        code[0] = 0xb8;
        for (int b = 0; b < 4; b++)
            code[1 + b] = (uint8_t)(want >> (8 * b));
        code[5] = 0xc3;
        uint32_t got = ((uint32_t(*)(void))code)();
        bad += got != want;
    }
    for (uint32_t i = 0; i < 500; i++) {
        uint32_t want = (uint32_t)rnd();
        /* movl $want, 1(%rip)   -- writes the imm32 of the next mov
         * mov $0, %eax ; ret */
        uint8_t routine[] = {0xc7, 0x05, 0x01, 0x00, 0x00, 0x00, (uint8_t)want, (uint8_t)(want >> 8),
                             (uint8_t)(want >> 16), (uint8_t)(want >> 24), 0xb8, 0, 0, 0, 0, 0xc3};
        for (unsigned b = 0; b < sizeof(routine); b++)
            code[b] = routine[b];
        uint32_t got = ((uint32_t(*)(void))code)();
        bad += got != want;
    }
    line("smc_bad", bad);
    debug_exit(bad == 0 ? 0x15 : 0x7c);
}
