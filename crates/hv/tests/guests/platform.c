/* The PC platform as a guest finds it: the ACPI tables (RSDP in the BIOS
 * area, XSDT, FADT, MADT), fw_cfg, the xAPIC page, the IOAPIC routing
 * COM1's interrupt for console input, and power-off through the FADT's
 * sleep control register. Prints `name=value` lines; the Rust test
 * (tests/platform.rs) checks them. */
#include "common.h"

#define IOAPIC 0xfec00000ull
#define XAPIC 0xfee00000ull
#define UART_VECTOR 0x40
#define SELF_VECTOR 0x41


static uint64_t pd_high[512] __attribute__((aligned(4096)));

/* Maps the 2 MiB page holding the IOAPIC and xAPIC (gpa 0xfec00000..) one
 * to one: the boot page tables cover RAM only. */
static void map_mmio(void) {
    pd_high[(IOAPIC >> 21) & 511] = (IOAPIC & ~0x1fffffull) | 0x9b; /* P RW PCD PWT PS */
    pd_high[(XAPIC >> 21) & 511] = (XAPIC & ~0x1fffffull) | 0x9b;
    volatile uint64_t *pdpt = (volatile uint64_t *)0x4000;
    pdpt[3] = (uint64_t)pd_high | 3;
    uint64_t cr3;
    __asm__ volatile("mov %%cr3, %0; mov %0, %%cr3" : "=r"(cr3)::"memory");
}

static inline uint32_t mmio_read(uint64_t a) { return *(volatile uint32_t *)a; }
static inline void mmio_write(uint64_t a, uint32_t v) { *(volatile uint32_t *)a = v; }

static uint32_t ioapic_read(uint32_t reg) {
    mmio_write(IOAPIC, reg);
    return mmio_read(IOAPIC + 0x10);
}
static void ioapic_write(uint32_t reg, uint32_t v) {
    mmio_write(IOAPIC, reg);
    mmio_write(IOAPIC + 0x10, v);
}

struct idt_entry { uint16_t off0, sel; uint8_t ist, type; uint16_t off1; uint32_t off2, zero; };
static struct idt_entry idt[256];
struct interrupt_frame;

static volatile uint64_t uart_irqs, self_irqs, received;
static volatile char input[64];

__attribute__((interrupt)) static void uart_handler(struct interrupt_frame *f) {
    (void)f;
    uart_irqs++;
    while (inb(COM1_PORT + 5) & 1) {
        char c = (char)inb(COM1_PORT);
        if (received < sizeof(input))
            input[received] = c;
        received++;
    }
    mmio_write(XAPIC + 0xb0, 0); /* EOI through the page */
}
__attribute__((interrupt)) static void self_handler(struct interrupt_frame *f) {
    (void)f;
    self_irqs++;
    mmio_write(XAPIC + 0xb0, 0); /* EOI through the page (xAPIC mode) */
}

static void set_gate(int v, void (*h)(struct interrupt_frame *)) {
    uint64_t a = (uint64_t)h;
    idt[v] = (struct idt_entry){(uint16_t)a, 0x08, 0, 0x8e, (uint16_t)(a >> 16), (uint32_t)(a >> 32), 0};
}

static uint8_t sum(const uint8_t *p, uint32_t n) {
    uint8_t s = 0;
    for (uint32_t i = 0; i < n; i++) s += p[i];
    return s;
}
static uint32_t u32_at(const uint8_t *p) { return *(const uint32_t *)p; }
static uint64_t u64_at(const uint8_t *p) { return *(const uint64_t *)p; }

static const uint8_t *find_rsdp(void) {
    for (uint64_t a = 0xe0000; a < 0x100000; a += 16) {
        const uint8_t *p = (const uint8_t *)a;
        if (u64_at(p) == 0x2052545020445352ull /* "RSD PTR " */ && sum(p, 20) == 0)
            return p;
    }
    return 0;
}

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    (void)bi;
    /* ACPI: RSDP -> XSDT -> FADT (sleep control port) and MADT (CPUs). */
    const uint8_t *rsdp = find_rsdp();
    line_hex("rsdp", (uint64_t)rsdp);
    const uint8_t *xsdt = (const uint8_t *)u64_at(rsdp + 24);
    line_hex("xsdt_ok", sum(xsdt, u32_at(xsdt + 4)) == 0);
    uint16_t sleep_port = 0;
    uint64_t madt_cpus = 0, madt_flags = ~0ull;
    for (uint32_t off = 36; off < u32_at(xsdt + 4); off += 8) {
        const uint8_t *t = (const uint8_t *)u64_at(xsdt + off);
        if (sum(t, u32_at(t + 4)) != 0)
            line_hex("bad_checksum", u32_at(t));
        if (u32_at(t) == 0x50434146 /* FACP */)
            sleep_port = (uint16_t)u64_at(t + 244 + 4);
        if (u32_at(t) == 0x43495041 /* APIC */) {
            madt_flags = u32_at(t + 40);
            for (uint32_t e = 44; e < u32_at(t + 4); e += t[e + 1])
                if (t[e] == 9)
                    madt_cpus++;
        }
    }
    line_hex("sleep_port", sleep_port);
    line_hex("madt_cpus", madt_cpus);
    line_hex("madt_flags", madt_flags);

    /* fw_cfg: signature and CPU count. */
    outw(0x510, 0x0000);
    uint32_t sig = 0;
    for (int i = 0; i < 4; i++) sig |= (uint32_t)inb(0x511) << (8 * i);
    line_hex("fw_cfg_sig", sig);
    outw(0x510, 0x0005);
    line_hex("fw_cfg_cpus", inb(0x511) | (inb(0x511) << 8));
    line_hex("pic", inb(0x21));

    /* The xAPIC page: id, version, a self-IPI through the ICR. It exists
     * in xAPIC mode only (SDM Vol. 3A, "x2APIC State Transitions"): from
     * x2APIC mode through disabled to xAPIC, this CPU staying the BSP. */
    wrmsr(0x1b, 0xfee00000ull | 0x100);
    wrmsr(0x1b, 0xfee00000ull | 0x100 | 0x800);
    map_mmio();
    for (int v = 0; v < 256; v++) idt[v] = (struct idt_entry){0};
    set_gate(UART_VECTOR, uart_handler);
    set_gate(SELF_VECTOR, self_handler);
    struct __attribute__((packed)) { uint16_t limit; uint64_t base; } idtr = {sizeof(idt) - 1, (uint64_t)idt};
    __asm__ volatile("lidt %0" ::"m"(idtr));
    mmio_write(XAPIC + 0xf0, 0x1ff); /* SVR: enabled */
    line_hex("xapic_id", mmio_read(XAPIC + 0x20));
    line_hex("xapic_version", mmio_read(XAPIC + 0x30) & 0xff);
    line_hex("xapic_svr", mmio_read(XAPIC + 0xf0));
    mmio_write(XAPIC + 0x310, 0);
    mmio_write(XAPIC + 0x300, (1 << 18) | SELF_VECTOR); /* shorthand self */
    __asm__ volatile("sti; nop; cli");
    line_hex("self_irqs", self_irqs);

    /* The IOAPIC: version, then COM1's IRQ 4 to this CPU. */
    line_hex("ioapic_version", ioapic_read(1));
    ioapic_write(0x10 + 2 * 4 + 1, 0);
    ioapic_write(0x10 + 2 * 4, UART_VECTOR);
    line_hex("ioapic_entry4", ioapic_read(0x10 + 2 * 4));
    outb(COM1_PORT + 1, 1); /* IER: received data available */
    while (received < 4) __asm__ volatile("sti; hlt; cli");
    line_hex("uart_irqs", uart_irqs);
    line_hex("received", received);
    line_hex("input", input[0] | input[1] << 8 | input[2] << 16 | (uint64_t)input[3] << 24);

    /* S5: SLP_TYP 5 | SLP_EN. */
    puts_serial("bye\n");
    outb(sleep_port, (5 << 2) | (1 << 5));
    debug_exit(0x33); /* not reached */
}
