/* Loads an empty IDT and faults: #UD cannot be delivered, nor #DF: triple fault. */
#include "common.h"

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    (void)bi;
    puts_serial("about to triple fault\n");
    struct __attribute__((packed)) { uint16_t limit; uint64_t base; } r = {0, 0};
    __asm__ volatile("lidt %0; ud2" ::"m"(r));
    debug_exit(1);
}
