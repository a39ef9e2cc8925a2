/* Paging aimed outside guest memory, one variant per run (the word after
 * "--" on the command line):
 *   cr3-outside   CR3 = a frame past the end of RAM, then a fresh access
 *   cr3-reserved  CR3 with bits above MAXPHYADDR: #GP, skipped; exits 0x14
 *   pt-table      a PDPT entry pointing a page directory outside RAM
 *   pt-leaf-read  a 2 MiB leaf outside RAM, read
 *   pt-leaf-exec  a 2 MiB leaf outside RAM, jumped to
 *   idt-outside   the IDT based in a 2 MiB page outside RAM, then #UD
 *   idt-garbage   an IDT full of random bytes, then #UD and int3
 * Every one but cr3-reserved must stop the VM with an hv error. */
#include "hostile.h"

#define GIB (1ull << 30)

static uint64_t *pml4(void) {
    uint64_t cr3;
    __asm__ volatile("mov %%cr3, %0" : "=r"(cr3));
    return (uint64_t *)(cr3 & ~0xfffull);
}

/* Maps a 2 MiB page at virtual `va` (in the first 512 GiB) to `pa`,
 * building the page directory for va's GiB in RAM if needed. */
static void map_2m(uint64_t va, uint64_t pa) {
    static uint64_t pd[512] __attribute__((aligned(4096)));
    uint64_t *pdpt = (uint64_t *)(pml4()[0] & ~0xfffull);
    uint64_t *e = &pdpt[(va >> 30) & 511];
    if (!(*e & 1))
        *e = (uint64_t)pd | 3;
    uint64_t *dir = (uint64_t *)(*e & ~0xfffull);
    dir[(va >> 21) & 511] = pa | 0x83;
    __asm__ volatile("invlpg (%0)" ::"r"(va) : "memory");
}

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    idt_init();
    const char *v = variant(bi);
    uint64_t outside = (bi->mem_size + 64 * GIB) & ~((2ull << 20) - 1);
    uint64_t spare_va = 100 * GIB; /* unused virtual range */
    puts_serial("wild: ");
    puts_serial(v);
    puts_serial("\n");
    if (streq(v, "cr3-outside")) {
        __asm__ volatile("mov %0, %%cr3" ::"r"(outside) : "memory");
        *(volatile uint64_t *)spare_va = 1;
    } else if (streq(v, "cr3-reserved")) {
        skip_len = 3; /* mov %rax, %cr3 */
        __asm__ volatile("mov %0, %%cr3" ::"a"(1ull << 60) : "memory");
        line("gp", faults_gp);
        debug_exit(faults_gp == 1 ? 0x14 : 0x7c);
    } else if (streq(v, "pt-table")) {
        uint64_t *pdpt = (uint64_t *)(pml4()[0] & ~0xfffull);
        pdpt[(spare_va >> 30) & 511] = outside | 3;
        __asm__ volatile("invlpg (%0)" ::"r"(spare_va) : "memory");
        (void)*(volatile uint64_t *)spare_va;
    } else if (streq(v, "pt-leaf-read")) {
        map_2m(spare_va, outside);
        (void)*(volatile uint64_t *)(spare_va + 0x1234 * 8);
    } else if (streq(v, "pt-leaf-exec")) {
        map_2m(spare_va, outside);
        ((void (*)(void))spare_va)();
    } else if (streq(v, "idt-outside")) {
        map_2m(spare_va, outside);
        load_idt((void *)spare_va, 4095);
        __asm__ volatile("ud2");
    } else if (streq(v, "idt-garbage")) {
        uint64_t *raw = (uint64_t *)idt;
        for (unsigned i = 0; i < sizeof(idt) / 8; i++)
            raw[i] = rnd();
        __asm__ volatile("ud2");
        __asm__ volatile("int3");
    } else {
        puts_serial("unknown variant\n");
        debug_exit(0x7b);
    }
    puts_serial("wild: still running\n");
    debug_exit(0x7a);
}
