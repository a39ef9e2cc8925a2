/* Interrupts off, then a spin that never ends: only a time limit stops it. */
#include "hostile.h"

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    (void)bi;
    puts_serial("spin: interrupts off, spinning\n");
    __asm__ volatile("cli\n1: jmp 1b");
    debug_exit(0x7a);
}
