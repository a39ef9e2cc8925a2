/* The acceptance kernel of issue 14, after boot.S has taken it from the
 * multiboot 32-bit entry into long mode: it reads the multiboot
 * information, the ACPI tables and fw_cfg, starts every application
 * processor the MADT lists through INIT/SIPI and the real-mode trampoline
 * (using the local APIC by MMIO, xAPIC mode), moves every CPU to x2APIC
 * mode and sends each AP an IPI through the x2APIC ICR, takes COM1's
 * receive interrupt through the IOAPIC until a line of console input has
 * arrived, and powers off through the FADT's sleep control register with
 * the DSDT's \_S5 sleep type. Prints `name=value` lines (values in hex)
 * that tests/multiboot.rs and the vmm's CLI test check. */
#include "common.h"

#define TRAMPOLINE 0x8000ull
#define IOAPIC 0xfec00000ull
#define XAPIC 0xfee00000ull
#define MSR_APIC_BASE 0x1b
#define APIC_BASE_EXTD (1ull << 10)
#define APIC_BASE_EN (1ull << 11)
#define X2APIC_ID 0x802
#define X2APIC_EOI 0x80b
#define X2APIC_ICR 0x830
#define UART_VECTOR 0x40
#define WAKE_VECTOR 0x42
#define MB_MAX_CPUS 16
#define AP_STACK 16384
/* How long the BSP waits for an AP before it gives up (virtual TSC
 * cycles: about 0.1 s at the machine's 3 GHz). */
#define AP_TIMEOUT 300000000ull

struct multiboot_info {
    uint32_t flags, mem_lower, mem_upper, boot_device, cmdline, mods_count, mods_addr;
    uint32_t syms[4], mmap_length, mmap_addr, drives_length, drives_addr, config_table;
    uint32_t boot_loader_name;
};

extern char trampoline_start[], trampoline_end[], tr_cr3[], tr_stack[];

static volatile int print_lock;
static void lock(void) { while (__atomic_exchange_n(&print_lock, 1, __ATOMIC_ACQUIRE)) __asm__ volatile("pause"); }
static void unlock(void) { __atomic_store_n(&print_lock, 0, __ATOMIC_RELEASE); }

static void line(const char *name, uint64_t v) {
    lock();
    puts_serial(name);
    putc_serial('=');
    puthex(v);
    putc_serial('\n');
    unlock();
}
static void text(const char *name, const char *s) {
    lock();
    puts_serial(name);
    putc_serial('=');
    puts_serial(s);
    putc_serial('\n');
    unlock();
}
static __attribute__((noreturn)) void fail(const char *why) {
    text("fail", why);
    debug_exit(1);
}

static inline uint32_t mmio_read(uint64_t a) { return *(volatile uint32_t *)a; }
static inline void mmio_write(uint64_t a, uint32_t v) { *(volatile uint32_t *)a = v; }

/* ---- interrupts ---- */
struct idt_entry { uint16_t off0, sel; uint8_t ist, type; uint16_t off1; uint32_t off2, zero; };
static struct idt_entry idt[256];
static struct __attribute__((packed)) { uint16_t limit; uint64_t base; } idtr;
struct interrupt_frame { uint64_t rip, cs, rflags, rsp, ss; };

static volatile uint32_t wakes[MB_MAX_CPUS];
static volatile uint64_t uart_irqs, received;
static volatile char input[64];

__attribute__((interrupt)) static void unexpected(struct interrupt_frame *f) {
    line("unexpected_at", f->rip);
    fail("unexpected interrupt or exception");
}
__attribute__((interrupt)) static void wake_handler(struct interrupt_frame *f) {
    (void)f;
    uint32_t id = (uint32_t)rdmsr(X2APIC_ID);
    if (id < MB_MAX_CPUS) __atomic_add_fetch(&wakes[id], 1, __ATOMIC_SEQ_CST);
    wrmsr(X2APIC_EOI, 0);
}
__attribute__((interrupt)) static void uart_handler(struct interrupt_frame *f) {
    (void)f;
    uart_irqs++;
    while (inb(COM1_PORT + 5) & 1) {
        char c = (char)inb(COM1_PORT);
        if (received < sizeof(input)) input[received] = c;
        received++;
    }
    wrmsr(X2APIC_EOI, 0);
}
static void set_gate(int v, void (*h)(struct interrupt_frame *)) {
    uint64_t a = (uint64_t)h;
    idt[v] = (struct idt_entry){(uint16_t)a, 0x08, 0, 0x8e, (uint16_t)(a >> 16), (uint32_t)(a >> 32), 0};
}
static void load_idt(void) { __asm__ volatile("lidt %0" ::"m"(idtr)); }

/* ---- ACPI ---- */
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
        if (u64_at(p) == 0x2052545020445352ull /* "RSD PTR " */ && sum(p, 20) == 0) return p;
    }
    return 0;
}

static uint32_t apic_ids[MB_MAX_CPUS];
static uint32_t ncpus;
static uint16_t sleep_port;
static int s5_type = -1;

/* \_S5_ in the DSDT: NameOp "_S5_" PackageOp PkgLength NumElements, then
 * the SLP_TYPa value as a BytePrefix constant, Zero, One or a raw byte. */
static void find_s5(const uint8_t *dsdt) {
    uint32_t len = u32_at(dsdt + 4);
    for (uint32_t i = 36; i + 8 < len; i++) {
        if (dsdt[i] != '_' || dsdt[i + 1] != 'S' || dsdt[i + 2] != '5' || dsdt[i + 3] != '_') continue;
        const uint8_t *p = dsdt + i + 4;
        if (*p++ != 0x12) continue;
        p += 1 + (*p >> 6); /* PkgLength */
        p++;                /* NumElements */
        if (*p == 0x0a) s5_type = p[1];
        else if (*p == 0x00 || *p == 0x01) s5_type = *p;
        else s5_type = *p;
        return;
    }
}

static void read_acpi(void) {
    const uint8_t *rsdp = find_rsdp();
    if (!rsdp) fail("no RSDP");
    const uint8_t *xsdt = (const uint8_t *)u64_at(rsdp + 24);
    if (sum(xsdt, u32_at(xsdt + 4))) fail("XSDT checksum");
    for (uint32_t off = 36; off < u32_at(xsdt + 4); off += 8) {
        const uint8_t *t = (const uint8_t *)u64_at(xsdt + off);
        if (sum(t, u32_at(t + 4))) fail("table checksum");
        if (u32_at(t) == 0x50434146 /* FACP */) {
            sleep_port = (uint16_t)u64_at(t + 244 + 4);
            const uint8_t *dsdt = (const uint8_t *)u64_at(t + 140);
            if (!dsdt) dsdt = (const uint8_t *)(uint64_t)u32_at(t + 40);
            if (sum(dsdt, u32_at(dsdt + 4))) fail("DSDT checksum");
            find_s5(dsdt);
        }
        if (u32_at(t) == 0x43495041 /* APIC */) {
            for (uint32_t e = 44; e < u32_at(t + 4) && t[e + 1]; e += t[e + 1]) {
                uint32_t id = ~0u;
                if (t[e] == 9 && (u32_at(t + e + 8) & 1)) id = u32_at(t + e + 4); /* local x2APIC */
                if (t[e] == 0 && (u32_at(t + e + 4) & 1)) id = t[e + 3];        /* local APIC */
                if (id != ~0u && ncpus < MB_MAX_CPUS) apic_ids[ncpus++] = id;
            }
        }
    }
    line("acpi_cpus", ncpus);
    line("sleep_port", sleep_port);
    line("s5_type", (uint64_t)s5_type);
}

/* ---- the local APIC, by MMIO (xAPIC) and by MSR (x2APIC) ---- */
static void xapic_icr(uint32_t dest, uint32_t low) {
    mmio_write(XAPIC + 0x310, dest << 24);
    mmio_write(XAPIC + 0x300, low);
    while (mmio_read(XAPIC + 0x300) & (1 << 12)) __asm__ volatile("pause"); /* delivery status */
}
static void enter_x2apic(void) {
    wrmsr(MSR_APIC_BASE, rdmsr(MSR_APIC_BASE) | APIC_BASE_EN | APIC_BASE_EXTD);
}

static volatile uint32_t aps_up, aps_x2apic, go_x2apic;
static uint8_t ap_stacks[MB_MAX_CPUS][AP_STACK] __attribute__((aligned(16)));

/* Where every AP lands from the trampoline, in long mode on its stack. */
void ap_entry(void) {
    load_idt();
    mmio_write(XAPIC + 0xf0, 0x1ff); /* SVR: enabled */
    uint32_t id = mmio_read(XAPIC + 0x20) >> 24;
    line("ap_xapic_id", id);
    __atomic_add_fetch(&aps_up, 1, __ATOMIC_SEQ_CST);
    while (!__atomic_load_n(&go_x2apic, __ATOMIC_ACQUIRE)) __asm__ volatile("pause");
    enter_x2apic();
    line("ap_x2apic_id", rdmsr(X2APIC_ID));
    __atomic_add_fetch(&aps_x2apic, 1, __ATOMIC_SEQ_CST);
    for (;;) __asm__ volatile("sti; hlt; cli");
}

static int wait_for(volatile uint32_t *counter, uint32_t value) {
    uint64_t start = rdtsc();
    while (__atomic_load_n(counter, __ATOMIC_ACQUIRE) < value)
        if (rdtsc() - start > AP_TIMEOUT) return 0;
    return 1;
}

static void start_aps(uint32_t self) {
    uint64_t tramp_len = (uint64_t)(trampoline_end - trampoline_start);
    uint8_t *dst = (uint8_t *)TRAMPOLINE;
    for (uint64_t i = 0; i < tramp_len; i++) dst[i] = (uint8_t)trampoline_start[i];
    uint64_t cr3;
    __asm__ volatile("mov %%cr3, %0" : "=r"(cr3));
    *(volatile uint64_t *)(dst + (tr_cr3 - trampoline_start)) = cr3;
    uint32_t started = 0;
    for (uint32_t i = 0; i < ncpus; i++) {
        uint32_t id = apic_ids[i];
        if (id == self) continue;
        *(volatile uint64_t *)(dst + (tr_stack - trampoline_start)) = (uint64_t)&ap_stacks[started][AP_STACK];
        /* The MP specification's sequence: INIT assert, INIT de-assert,
         * then two STARTUPs with the trampoline's page as the vector. */
        xapic_icr(id, 0x4500);
        xapic_icr(id, 0x8500);
        xapic_icr(id, 0x4600 | (uint32_t)(TRAMPOLINE >> 12));
        xapic_icr(id, 0x4600 | (uint32_t)(TRAMPOLINE >> 12));
        started++;
        if (!wait_for(&aps_up, started)) {
            line("ap_timeout", id);
            fail("an AP did not start");
        }
    }
    line("aps_started", started);
}

/* ---- the IOAPIC and COM1 ---- */
static uint32_t ioapic_read(uint32_t reg) {
    mmio_write(IOAPIC, reg);
    return mmio_read(IOAPIC + 0x10);
}
static void ioapic_write(uint32_t reg, uint32_t v) {
    mmio_write(IOAPIC, reg);
    mmio_write(IOAPIC + 0x10, v);
}

void kmain(uint32_t mb_info) {
    const struct multiboot_info *mbi = (const struct multiboot_info *)(uint64_t)mb_info;
    text("stage", "long mode");
    line("mb_flags", mbi->flags);
    line("mem_upper_kib", mbi->mem_upper);
    if (mbi->flags & (1 << 2)) text("cmdline", (const char *)(uint64_t)mbi->cmdline);
    if (mbi->flags & (1 << 9)) text("loader", (const char *)(uint64_t)mbi->boot_loader_name);

    for (int v = 0; v < 256; v++) set_gate(v, unexpected);
    set_gate(UART_VECTOR, uart_handler);
    set_gate(WAKE_VECTOR, wake_handler);
    idtr.limit = sizeof(idt) - 1;
    idtr.base = (uint64_t)idt;
    load_idt();

    read_acpi();
    outw(0x510, 0x0005); /* FW_CFG_NB_CPUS */
    uint32_t fw_cpus = inb(0x511) | (inb(0x511) << 8);
    line("fw_cfg_cpus", fw_cpus);
    if (fw_cpus != ncpus) fail("fw_cfg and the MADT disagree on the CPU count");

    /* xAPIC by MMIO: enable, read the id, start the APs. */
    mmio_write(XAPIC + 0xf0, 0x1ff);
    uint32_t self = mmio_read(XAPIC + 0x20) >> 24;
    line("bsp_xapic_id", self);
    start_aps(self);

    /* x2APIC: the BSP, then every AP; an IPI to each through the ICR MSR. */
    enter_x2apic();
    line("bsp_x2apic_id", rdmsr(X2APIC_ID));
    __atomic_store_n(&go_x2apic, 1, __ATOMIC_RELEASE);
    if (!wait_for(&aps_x2apic, ncpus - 1)) fail("an AP did not enter x2APIC mode");
    uint32_t woken = 0;
    for (uint32_t i = 0; i < ncpus; i++) {
        uint32_t id = apic_ids[i];
        if (id == self || id >= MB_MAX_CPUS) continue;
        wrmsr(X2APIC_ICR, ((uint64_t)id << 32) | WAKE_VECTOR);
        if (!wait_for(&wakes[id], 1)) {
            line("ipi_lost", id);
            fail("an x2APIC IPI was not taken");
        }
        woken++;
    }
    line("x2apic_ipis", woken);

    /* COM1's receive interrupt through the IOAPIC (IRQ 4) to this CPU,
     * until a line of input (or 64 bytes) has arrived. */
    ioapic_write(0x10 + 2 * 4 + 1, self << 24);
    ioapic_write(0x10 + 2 * 4, UART_VECTOR);
    line("ioapic_entry4", ioapic_read(0x10 + 2 * 4));
    outb(COM1_PORT + 1, 1); /* IER: received data available */
    text("stage", "waiting for console input");
    for (;;) {
        uint64_t n = received;
        if (n >= sizeof(input) || (n > 0 && input[n - 1] == '\n')) break;
        __asm__ volatile("sti; hlt; cli");
    }
    uint64_t n = received < sizeof(input) ? received : sizeof(input);
    char got[sizeof(input) + 1];
    for (uint64_t i = 0; i < n; i++) got[i] = input[i] == '\n' ? 0 : input[i];
    got[n] = 0;
    line("uart_irqs", uart_irqs);
    text("input", got);

    if (s5_type < 0) fail("no \\_S5_ in the DSDT");
    text("stage", "power off");
    outb(sleep_port, (uint8_t)((s5_type << 2) | (1 << 5))); /* SLP_TYP | SLP_EN */
    fail("still running after S5");
}
