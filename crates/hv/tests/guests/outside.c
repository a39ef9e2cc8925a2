/* Maps a 2 MiB page at the end of RAM + 128 MiB (no memslot there) in the
 * boot page tables and writes to it. */
#include "common.h"

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    uint64_t target = bi->mem_size + (128ull << 20);
    uint64_t cr3;
    __asm__ volatile("mov %%cr3, %0" : "=r"(cr3));
    uint64_t *pml4 = (uint64_t *)(cr3 & ~0xfffull);
    uint64_t *pdpt = (uint64_t *)(pml4[0] & ~0xfffull);
    uint64_t *pd = (uint64_t *)(pdpt[target >> 30] & ~0xfffull);
    if (!(pdpt[target >> 30] & 1)) debug_exit(0x7e); /* keep the test within the first GiB */
    pd[(target >> 21) & 511] = target | 0x83;
    puts_serial("writing outside guest memory\n");
    *(volatile uint64_t *)target = 1;
    puts_serial("still alive?\n");
    debug_exit(1);
}
