/* COM1 console, kprintf, panic, shutdown and structured reports. */
#include "kernel.h"

#define COM1_LSR (COM1_PORT + 5)
#define LSR_THR_EMPTY 0x20

static spinlock_t console_lock;

void console_init(void) {
    outb(COM1_PORT + 1, 0x00); /* no interrupts: the console is polled */
    outb(COM1_PORT + 3, 0x03); /* 8N1 */
}

static void serial_putc(char c) {
    while (!(inb(COM1_LSR) & LSR_THR_EMPTY))
        cpu_relax();
    outb(COM1_PORT, (uint8_t)c);
}

static void console_write_locked(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        serial_putc(s[i]);
}

void console_write(const char *s, size_t n) {
    spin_lock(&console_lock);
    console_write_locked(s, n);
    spin_unlock(&console_lock);
}

int kprintf(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = kvsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    console_write(buf, n < (int)sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
    return n;
}

void shutdown(int code) {
    hypercall4(HC_SHUTDOWN, (unsigned long)code, 0, 0, 0);
    /* Without the hypercall, the isa-debug-exit device stops the VM. */
    outb(DEBUG_EXIT_PORT, (uint8_t)code);
    for (;;)
        __asm__ volatile("cli; hlt");
}

static volatile int panicking;

void panic(const char *fmt, ...) {
    __asm__ volatile("cli");
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = kvsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof(buf))
        n = sizeof(buf) - 1;
    if (__atomic_exchange_n(&panicking, 1, __ATOMIC_ACQ_REL)) {
        for (;;) /* another CPU is already reporting a panic */
            __asm__ volatile("hlt");
    }
    /* Take the console if we can; a CPU that panicked while holding it
     * must still be able to print. */
    for (int i = 0; i < 1000000 && spin_is_locked(&console_lock); i++)
        cpu_relax();
    console_write_locked("\nPANIC: ", 8);
    console_write_locked(buf, (size_t)n);
    console_write_locked("\n", 1);
    char line[600];
    int m = ksnprintf(line, sizeof(line), "panic=\"%s\"", buf);
    if (m > (int)sizeof(line) - 1)
        m = sizeof(line) - 1;
    hypercall4(HC_REPORT, (uintptr_t)line, (unsigned long)m, 0, 0);
    outb(DEBUG_EXIT_PORT, 0x7f);
    shutdown(0x7f);
}

static spinlock_t report_lock;
static char report_buf[REPORT_MAX];

void report(const char *fmt, ...) {
    spin_lock(&report_lock);
    va_list ap;
    va_start(ap, fmt);
    int n = kvsnprintf(report_buf, sizeof(report_buf), fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof(report_buf))
        n = sizeof(report_buf) - 1;
    hypercall4(HC_REPORT, (uintptr_t)report_buf, (unsigned long)n, 0, 0);
    spin_unlock(&report_lock);
}
