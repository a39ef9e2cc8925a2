/* Random hypercalls with wild pointers and lengths: every KVM and
 * faultline hypercall number (but HC_SHUTDOWN, which would end the run by
 * design) and random ones, with arguments inside, across the end of and
 * far outside guest memory. The hv must answer each with an error or do
 * it; the kernel then reports and exits 0x12. */
#include "hostile.h"

static uint64_t wild(uint64_t mem) {
    switch (rnd() % 7) {
    case 0:
        return rnd();
    case 1:
        return rnd() % mem;
    case 2:
        return mem - (rnd() % 64); /* straddles the end of RAM */
    case 3:
        return mem + (rnd() % (1ull << 40));
    case 4:
        return ~0ull - (rnd() % 4096);
    case 5:
        return rnd() % 64;
    default:
        return 0;
    }
}

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    idt_init();
    uint64_t mem = bi->mem_size;
    uint64_t calls = 0, errors = 0;
    for (int i = 0; i < 3000; i++) {
        unsigned long nr;
        uint64_t pick = rnd() % 10;
        if (pick < 4)
            nr = rnd() % 13; /* KVM's numbers */
        else if (pick < 8)
            nr = HC_FAULTLINE_BASE + rnd() % 12;
        else
            nr = rnd();
        if (nr == HC_SHUTDOWN)
            continue;
        long r = hypercall4(nr, wild(mem), wild(mem), wild(mem), wild(mem));
        calls++;
        errors += r < 0;
    }
    line("hypercalls", calls);
    line("errors", errors);
    puts_serial("hypercall: survived\n");
    debug_exit(0x12);
}
