/* The edu device behind the Intel VT-d unit, as a guest drives them
 * (`--device edu --iommu intel`): finds the edu on PCI bus 0 through
 * configuration mechanism #1, sets up the unit's root, context and
 * second-level tables and its interrupt remapping table, then DMAs a word
 * through a translated IOVA into the device and back out to another page,
 * lets a DMA to an unmapped IOVA fault, and takes the device's interrupt as
 * a remapped MSI and as a remapped IOAPIC entry. Prints `name=value` lines;
 * the Rust test (tests/iommu.rs) checks them. */
#include "common.h"

#define EDU_BAR_EXPECTED 0xfe000000ull
#define IOAPIC 0xfec00000ull
#define VTD 0xfed90000ull
#define XAPIC 0xfee00000ull
#define EDU_DEVFN 0x18
#define MSI_VECTOR 0x51
#define IOAPIC_VECTOR 0x52


static inline uint32_t mmio_read(uint64_t a) { return *(volatile uint32_t *)a; }
static inline void mmio_write(uint64_t a, uint32_t v) { *(volatile uint32_t *)a = v; }
static inline uint64_t mmio_read64(uint64_t a) { return *(volatile uint64_t *)a; }
static inline void mmio_write64(uint64_t a, uint64_t v) { *(volatile uint64_t *)a = v; }

static uint32_t cfg_read(uint32_t devfn, uint32_t reg) {
    outl(0xcf8, 0x80000000u | (devfn << 8) | reg);
    return inl(0xcfc);
}
static void cfg_write(uint32_t devfn, uint32_t reg, uint32_t v) {
    outl(0xcf8, 0x80000000u | (devfn << 8) | reg);
    outl(0xcfc, v);
}

static uint64_t pd_high[512] __attribute__((aligned(4096)));
static uint64_t root[512] __attribute__((aligned(4096)));
static uint64_t context[512] __attribute__((aligned(4096)));
static uint64_t sl3[512] __attribute__((aligned(4096)));
static uint64_t sl2[512] __attribute__((aligned(4096)));
static uint64_t sl1[512] __attribute__((aligned(4096)));
static uint64_t irt[512] __attribute__((aligned(4096)));
/* `source` the CPU writes; `target` only the device writes. */
static uint32_t source[1024] __attribute__((aligned(4096)));
static uint32_t target[1024] __attribute__((aligned(4096)));

/* Maps the 2 MiB pages of the edu's BAR, the IOAPIC and VT-d unit, and the
 * xAPIC one to one (the boot page tables cover RAM only). */
static void map_mmio(void) {
    pd_high[(EDU_BAR_EXPECTED >> 21) & 511] = (EDU_BAR_EXPECTED & ~0x1fffffull) | 0x9b;
    pd_high[(IOAPIC >> 21) & 511] = (IOAPIC & ~0x1fffffull) | 0x9b;
    pd_high[(XAPIC >> 21) & 511] = (XAPIC & ~0x1fffffull) | 0x9b;
    volatile uint64_t *pdpt = (volatile uint64_t *)0x4000;
    pdpt[3] = (uint64_t)pd_high | 3;
    uint64_t cr3;
    __asm__ volatile("mov %%cr3, %0; mov %0, %%cr3" : "=r"(cr3)::"memory");
}

struct idt_entry { uint16_t off0, sel; uint8_t ist, type; uint16_t off1; uint32_t off2, zero; };
static struct idt_entry idt[256];
struct interrupt_frame;

static uint64_t bar;
static volatile uint64_t msi_irqs, ioapic_irqs;

static void edu_ack(void) { mmio_write(bar + 0x64, mmio_read(bar + 0x24)); }

__attribute__((interrupt)) static void msi_handler(struct interrupt_frame *f) {
    (void)f;
    msi_irqs++;
    mmio_write(XAPIC + 0xb0, 0);
    edu_ack();
}
__attribute__((interrupt)) static void ioapic_handler(struct interrupt_frame *f) {
    (void)f;
    ioapic_irqs++;
    mmio_write(XAPIC + 0xb0, 0);
    edu_ack();
}

static void set_gate(int v, void (*h)(struct interrupt_frame *)) {
    uint64_t a = (uint64_t)h;
    idt[v] = (struct idt_entry){(uint16_t)a, 0x08, 0, 0x8e, (uint16_t)(a >> 16), (uint32_t)(a >> 32), 0};
}

/* One edu transfer of 4 bytes; waits for the command's start bit. */
static void edu_dma(uint64_t src, uint64_t dst, uint32_t cmd) {
    mmio_write64(bar + 0x80, src);
    mmio_write64(bar + 0x88, dst);
    mmio_write64(bar + 0x90, 4);
    mmio_write(bar + 0x98, cmd);
    while (mmio_read(bar + 0x98) & 1) __asm__ volatile("pause");
}

static void gcmd(uint32_t bit) {
    mmio_write(VTD + 0x18, mmio_read(VTD + 0x1c) | bit);
    while (!(mmio_read(VTD + 0x1c) & bit)) __asm__ volatile("pause");
}

/* An IRTE for `vector` to APIC 0, edge, fixed, source id verified. */
static void set_irte(int index, uint8_t vector) {
    irt[2 * index] = 1 | ((uint64_t)vector << 16);
    irt[2 * index + 1] = EDU_DEVFN | (1ull << 18);
}

static void wait_for(volatile uint64_t *count) {
    for (int i = 0; i < 1000 && !*count; i++) __asm__ volatile("sti; hlt; cli");
}

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    (void)bi;
    /* xAPIC mode (from x2APIC through disabled), as platform.c. */
    wrmsr(0x1b, 0xfee00000ull | 0x100);
    wrmsr(0x1b, 0xfee00000ull | 0x100 | 0x800);
    map_mmio();
    set_gate(MSI_VECTOR, msi_handler);
    set_gate(IOAPIC_VECTOR, ioapic_handler);
    struct __attribute__((packed)) { uint16_t limit; uint64_t base; } idtr = {sizeof(idt) - 1, (uint64_t)idt};
    __asm__ volatile("lidt %0" ::"m"(idtr));
    mmio_write(XAPIC + 0xf0, 0x1ff);

    /* PCI: the host bridge and the edu, its BAR and line. */
    line_hex("host_bridge", cfg_read(0, 0));
    line_hex("edu_ids", cfg_read(EDU_DEVFN, 0));
    bar = cfg_read(EDU_DEVFN, 0x10) & ~0xfull;
    line_hex("edu_bar", bar);
    uint32_t intx_line = cfg_read(EDU_DEVFN, 0x3c) & 0xff;
    line_hex("edu_line", intx_line);
    cfg_write(EDU_DEVFN, 0x04, cfg_read(EDU_DEVFN, 0x04) | 0x6); /* memory, bus master */
    line_hex("edu_id", mmio_read(bar));

    /* VT-d: IOVA 0x7000 -> source, 0x8000 -> target; nothing at 0x9000.
     * The context entry leaves fault reporting on. */
    line_hex("vtd_version", mmio_read(VTD));
    root[0] = (uint64_t)context | 1;
    context[2 * EDU_DEVFN] = (uint64_t)sl3 | 1;
    context[2 * EDU_DEVFN + 1] = 1 | ((uint64_t)EDU_DEVFN << 8);
    sl3[0] = (uint64_t)sl2 | 3;
    sl2[0] = (uint64_t)sl1 | 3;
    sl1[7] = (uint64_t)source | 3;
    sl1[8] = (uint64_t)target | 3;
    mmio_write64(VTD + 0x20, (uint64_t)root);
    gcmd(1u << 30); /* SRTP */
    mmio_write64(VTD + 0xb8, (uint64_t)irt | 7); /* 256 entries */
    gcmd(1u << 24); /* SIRTP */
    gcmd(1u << 31); /* TE */
    gcmd(1u << 25); /* IRE */
    line_hex("vtd_status", mmio_read(VTD + 0x1c));

    /* DMA: source[0] into the device's buffer, back out to target[1]. */
    source[0] = 0x12345678;
    edu_dma(0x7000, 0x40000, 1);
    edu_dma(0x40000, 0x8004, 3);
    line_hex("dma_word", target[1]);
    line_hex("target_page", (uint64_t)target);
    line_hex("fsts_before", mmio_read(VTD + 0x34));
    /* To an unmapped IOVA: a write fault, recorded. */
    edu_dma(0x40000, 0x9010, 3);
    line_hex("fsts", mmio_read(VTD + 0x34));
    line_hex("fault_info", mmio_read64(VTD + 0x220));
    line_hex("fault_hi", mmio_read64(VTD + 0x228));

    /* A remapped MSI: handle 2 in the address, remappable format. */
    set_irte(2, MSI_VECTOR);
    cfg_write(EDU_DEVFN, 0x44, 0xfee00000u | (2 << 5) | (1 << 4));
    cfg_write(EDU_DEVFN, 0x48, 0);
    cfg_write(EDU_DEVFN, 0x4c, 0);
    cfg_write(EDU_DEVFN, 0x40, cfg_read(EDU_DEVFN, 0x40) | (1 << 16)); /* MSI enable */
    mmio_write(bar + 0x60, 1);
    wait_for(&msi_irqs);
    line_hex("msi_irqs", msi_irqs);

    /* INTx through a remappable IOAPIC entry: index 1 in bits 63:49. */
    cfg_write(EDU_DEVFN, 0x40, cfg_read(EDU_DEVFN, 0x40) & ~(1u << 16));
    set_irte(1, IOAPIC_VECTOR);
    mmio_write(IOAPIC, 0x10 + 2 * intx_line + 1);
    mmio_write(IOAPIC + 0x10, (1u << 16) | (1u << 17)); /* format, index 1 */
    mmio_write(IOAPIC, 0x10 + 2 * intx_line);
    mmio_write(IOAPIC + 0x10, IOAPIC_VECTOR);
    mmio_write(bar + 0x60, 1);
    wait_for(&ioapic_irqs);
    line_hex("ioapic_irqs", ioapic_irqs);
    line_hex("msi_irqs_after", msi_irqs);

    puts_serial("bye\n");
    debug_exit(0);
}
