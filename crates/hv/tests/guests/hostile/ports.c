/* Random port I/O of every size to every port but isa-debug-exit and the
 * ACPI sleep control register (both end the run by design), then resets
 * COM1 (which the random writes may have left in loopback or with DLAB set,
 * as they would a real 16550A) and exits 0x13. */
#include "hostile.h"

/* The FADT's sleep control register (crates/hv/src/devices/acpi.rs). */
#define ACPI_SLEEP_CONTROL_PORT 0x600

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    (void)bi;
    idt_init();
    uint64_t ins = 0, outs = 0, floating = 0;
    for (int i = 0; i < 6000; i++) {
        uint16_t port = (uint16_t)(rnd() % 3 ? rnd() : 0x3f8 + rnd() % 8);
        if (port == DEBUG_EXIT_PORT || port == ACPI_SLEEP_CONTROL_PORT)
            continue;
        uint32_t v = (uint32_t)rnd();
        switch (rnd() % 6) {
        case 0:
            __asm__ volatile("outb %b0, %w1" ::"a"(v), "Nd"(port));
            outs++;
            break;
        case 1:
            __asm__ volatile("outw %w0, %w1" ::"a"(v), "Nd"(port));
            outs++;
            break;
        case 2:
            __asm__ volatile("outl %0, %w1" ::"a"(v), "Nd"(port));
            outs++;
            break;
        case 3: {
            uint8_t b;
            __asm__ volatile("inb %w1, %b0" : "=a"(b) : "Nd"(port));
            floating += b == 0xff;
            ins++;
            break;
        }
        case 4: {
            uint16_t w;
            __asm__ volatile("inw %w1, %w0" : "=a"(w) : "Nd"(port));
            ins++;
            break;
        }
        default: {
            uint32_t l;
            __asm__ volatile("inl %w1, %0" : "=a"(l) : "Nd"(port));
            ins++;
            break;
        }
        }
    }
    outb(COM1_PORT + 3, 0x03); /* LCR: 8N1, DLAB clear */
    outb(COM1_PORT + 4, 0x03); /* MCR: DTR, RTS, no loopback */
    outb(COM1_PORT + 1, 0x00); /* IER: no interrupts */
    puts_serial("\n");
    line("outs", outs);
    line("ins", ins);
    line("floating", floating);
    puts_serial("ports: survived\n");
    debug_exit(0x13);
}
