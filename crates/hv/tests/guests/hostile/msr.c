/* Random MSR writes and reads: KVM's PV MSRs (0x4b564d00-0x4b564d07 and
 * the legacy 0x11/0x12) with garbage and wild guest-physical addresses,
 * architectural MSRs, the x2APIC range (but the ICR: INIT/SIPI would stop
 * the VM by design) and random indices. Each refused access is a #GP the
 * handler skips; the kernel then reports the counts and exits 0x11. */
#include "hostile.h"

static const uint32_t interesting[] = {
    0x4b564d00, 0x4b564d01, 0x4b564d02, 0x4b564d03, 0x4b564d04, 0x4b564d05, 0x4b564d06, 0x4b564d07,
    0x11,       0x12,       0x10,       0x1b,       0x3a,       0x48,       0x49,       0xfe,
    0x174,      0x175,      0x176,      0x1a0,      0x277,      0x2ff,      0x6e0,      0xc0000080,
    0xc0000081, 0xc0000082, 0xc0000083, 0xc0000084, 0xc0000100, 0xc0000101, 0xc0000102, 0xc0000103,
    0x802,      0x803,      0x808,      0x80b,      0x80f,      0x828,      0x832,      0x835,
    0x836,      0x837,      0x838,      0x839,      0x83e,      0x83f,      0x4b564dff, 0x40000000,
};

static uint64_t garbage(uint64_t mem) {
    switch (rnd() % 6) {
    case 0:
        return rnd();
    case 1:
        return rnd() % mem;                  /* inside RAM */
    case 2:
        return (mem + (rnd() % (1ull << 36))) | 1; /* outside RAM, enable bit */
    case 3:
        return ~0ull;
    case 4:
        return (mem - 64) | (rnd() & 0x3f); /* the last 64 bytes */
    default:
        return rnd() & 0xff;
    }
}

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    idt_init();
    uint64_t mem = bi->mem_size;
    uint64_t writes = 0, reads = 0;
    for (int i = 0; i < 4000; i++) {
        uint32_t msr;
        uint64_t pick = rnd() % 10;
        if (pick < 6)
            msr = interesting[rnd() % (sizeof(interesting) / sizeof(interesting[0]))];
        else if (pick < 8)
            msr = 0x4b564d00 + (uint32_t)(rnd() % 0x20);
        else
            msr = (uint32_t)rnd();
        skip_len = 2;
        if (rnd() % 3) {
            wrmsr(msr, garbage(mem));
            writes++;
        } else {
            (void)rdmsr(msr);
            reads++;
        }
    }
    line("msr_writes", writes);
    line("msr_reads", reads);
    line("gp", faults_gp);
    line("ud", faults_ud);
    puts_serial("msr: survived\n");
    debug_exit(0x11);
}
