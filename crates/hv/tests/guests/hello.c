/* Prints hello, its boot info and CPUID, reports a result, exits via 0xf4. */
#include "common.h"

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    if (bi->magic != BOOT_INFO_MAGIC) debug_exit(0x7f);
    puts_serial("hello from the guest\n");
    puts_serial("cpus=");
    putu(bi->num_cpus);
    puts_serial(" mem=");
    putu(bi->mem_size >> 20);
    puts_serial("M cmdline=");
    puts_serial((const char *)bi->cmdline);
    puts_serial("\n");
    uint32_t r[4];
    cpuid(0x40000000, r);
    char sig[13];
    for (int i = 0; i < 4; i++) { sig[i] = (char)(r[1] >> (8 * i)); sig[4 + i] = (char)(r[2] >> (8 * i)); sig[8 + i] = (char)(r[3] >> (8 * i)); }
    sig[12] = 0;
    puts_serial("signature=");
    puts_serial(sig);
    puts_serial("\n");
    /* An unknown hypercall returns -KVM_ENOSYS. */
    long ret = hypercall4(0x12345, 0, 0, 0, 0);
    puts_serial(ret == -KVM_ENOSYS ? "enosys ok\n" : "enosys BAD\n");
    /* Touch memory high in RAM: demand paging. */
    volatile uint64_t *high = (volatile uint64_t *)(bi->mem_size - 4096);
    *high = 0x1234;
    const char *line = "test=hello value=42";
    hypercall4(HC_REPORT, (unsigned long)line, slen(line), 0, 0);
    debug_exit(0x21);
}
