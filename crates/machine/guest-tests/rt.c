/* rt.c: serial output, exit, self-checks, IDT and page-table helpers for
 * the bare-mode test programs (see rt.h). */
#include "rt.h"

/* ---- serial (COM1) ---------------------------------------------------- */

#define LSR_THR_EMPTY 0x20

void putc(char c)
{
    /* Poll the line-status register as a real 16550 driver does. */
    while (!(inb(COM1 + 5) & LSR_THR_EMPTY)) {
    }
    outb(COM1, (u8)c);
}

void puts(const char *s)
{
    while (*s)
        putc(*s++);
}

static void put_unsigned(u64 v, unsigned base, int width, char pad)
{
    char buf[24];
    int n = 0;
    do {
        unsigned digit = (unsigned)(v % base);
        buf[n++] = (char)(digit < 10 ? '0' + digit : 'a' + digit - 10);
        v /= base;
    } while (v);
    while (width-- > n)
        putc(pad);
    while (n)
        putc(buf[--n]);
}

/* A printf subset: %s %c %d %i %u %x %p %%, flags '#' and '0', a width, and the
 * length modifiers l, ll, z. */
void printf(const char *fmt, ...)
{
    __builtin_va_list ap;
    __builtin_va_start(ap, fmt);
    for (; *fmt; fmt++) {
        if (*fmt != '%') {
            putc(*fmt);
            continue;
        }
        fmt++;
        char pad = ' ';
        int width = 0, longs = 0, alternate = 0;
        if (*fmt == '#') {
            alternate = 1;
            fmt++;
        }
        if (*fmt == '0') {
            pad = '0';
            fmt++;
        }
        while (*fmt >= '0' && *fmt <= '9')
            width = width * 10 + (*fmt++ - '0');
        while (*fmt == 'l' || *fmt == 'z') {
            longs++;
            fmt++;
        }
        switch (*fmt) {
        case 's': {
            const char *s = __builtin_va_arg(ap, const char *);
            puts(s ? s : "(null)");
            break;
        }
        case 'c':
            putc((char)__builtin_va_arg(ap, int));
            break;
        case 'd':
        case 'i': {
            s64 v = longs ? __builtin_va_arg(ap, s64) : __builtin_va_arg(ap, int);
            if (v < 0) {
                putc('-');
                put_unsigned(-(u64)v, 10, width ? width - 1 : 0, pad);
            } else {
                put_unsigned((u64)v, 10, width, pad);
            }
            break;
        }
        case 'u':
        case 'x': {
            u64 v = longs ? __builtin_va_arg(ap, u64) : __builtin_va_arg(ap, unsigned);
            if (alternate && *fmt == 'x')
                puts("0x");
            put_unsigned(v, *fmt == 'u' ? 10 : 16, width, pad);
            break;
        }
        case 'p':
            puts("0x");
            put_unsigned((u64)__builtin_va_arg(ap, void *), 16, 0, ' ');
            break;
        case '%':
            putc('%');
            break;
        default:
            putc('%');
            putc(*fmt);
            if (!*fmt)
                fmt--;
            break;
        }
    }
    __builtin_va_end(ap);
}

/* ---- exit --------------------------------------------------------------- */

void exit(int code)
{
    outl(DEBUG_EXIT_PORT, (u32)code);
    /* Only reached without an isa-debug-exit device. */
    for (;;)
        __asm__ volatile("cli; hlt");
}

/* ---- self-checks -------------------------------------------------------- */

int check_failures;
int check_count;

void check_failed(const char *file, int line, const char *expr, u64 got, u64 want)
{
    check_failures++;
    printf("CHECK FAILED %s:%d: %s (got %#llx, want %#llx)\n", file, line, expr, got, want);
}

int check_report(const char *program)
{
    printf("%s: %d checks, %d failed\n", program, check_count, check_failures);
    return check_failures ? 1 : 0;
}

/* ---- IDT ---------------------------------------------------------------- */

struct idt_gate {
    u16 offset_low;
    u16 selector;
    u8 ist;
    u8 type_attr;
    u16 offset_mid;
    u32 offset_high;
    u32 reserved;
} __attribute__((packed));

struct descriptor_pointer {
    u16 limit;
    u64 base;
} __attribute__((packed));

#define GATE_INTERRUPT 0x8e /* present, DPL 0, 64-bit interrupt gate */
#define GATE_PRESENT 0x80

extern const u64 isr_stub_table[256];
static struct idt_gate idt[256] __attribute__((aligned(16)));
static trap_handler_t handlers[256];

void idt_set_gate(u8 vector, int dpl, int ist)
{
    idt[vector].type_attr = (u8)(GATE_INTERRUPT | ((dpl & 3) << 5));
    idt[vector].ist = (u8)(ist & 7);
}

void idt_set_present(u8 vector, int present)
{
    if (present)
        idt[vector].type_attr |= GATE_PRESENT;
    else
        idt[vector].type_attr &= (u8)~GATE_PRESENT;
}

void idt_init(void)
{
    for (int v = 0; v < 256; v++) {
        u64 target = isr_stub_table[v];
        idt[v].offset_low = (u16)target;
        idt[v].selector = KERNEL_CS;
        idt[v].ist = 0;
        idt[v].type_attr = GATE_INTERRUPT;
        idt[v].offset_mid = (u16)(target >> 16);
        idt[v].offset_high = (u32)(target >> 32);
        idt[v].reserved = 0;
    }
    struct descriptor_pointer idtr = { sizeof(idt) - 1, (u64)idt };
    __asm__ volatile("lidt %0" : : "m"(idtr) : "memory");
}

void idt_set_handler(u8 vector, trap_handler_t handler) { handlers[vector] = handler; }

void trap_dispatch(struct trap_frame *frame);
void trap_dispatch(struct trap_frame *frame)
{
    trap_handler_t handler = handlers[frame->vector & 0xff];
    if (handler) {
        handler(frame);
        return;
    }
    printf("unexpected trap: vector %llu error %#llx rip %#llx cs %#llx rflags %#llx rsp %#llx cr2 %#llx\n",
           frame->vector, frame->error_code, frame->rip, frame->cs, frame->rflags, frame->rsp, read_cr2());
    exit(0x7f);
}

/* ---- TSS ---------------------------------------------------------------- */

struct tss64 *current_tss(void)
{
    struct descriptor_pointer gdtr;
    u16 selector;
    __asm__ volatile("sgdt %0" : "=m"(gdtr));
    __asm__ volatile("str %0" : "=r"(selector));
    const u8 *desc = (const u8 *)(gdtr.base + (selector & ~7u));
    u64 base = (u64)desc[2] | ((u64)desc[3] << 8) | ((u64)desc[4] << 16) | ((u64)desc[7] << 24) |
               ((u64)(*(const u32 *)(desc + 8)) << 32);
    return (struct tss64 *)base;
}

/* ---- page tables -------------------------------------------------------- */

u64 *pte_lookup(u64 va, int *level, int set_user)
{
    u64 *table = (u64 *)(read_cr3() & PTE_ADDR);
    for (int lvl = 4; lvl >= 1; lvl--) {
        unsigned index = (unsigned)((va >> (12 + 9 * (lvl - 1))) & 511);
        u64 *entry = &table[index];
        if (!(*entry & PTE_P))
            return 0;
        if (lvl == 1 || (lvl <= 3 && (*entry & PTE_PS))) {
            *level = lvl;
            return entry;
        }
        if (set_user)
            *entry |= PTE_U;
        table = (u64 *)(*entry & PTE_ADDR);
    }
    return 0;
}

/* ---- memory functions (gcc may emit calls to these) ------------------- */

void *memcpy(void *dst, const void *src, usize n)
{
    void *d = dst;
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(src), "+c"(n) : : "memory");
    return dst;
}

void *memset(void *dst, int c, usize n)
{
    void *d = dst;
    __asm__ volatile("rep stosb" : "+D"(d), "+c"(n) : "a"(c) : "memory");
    return dst;
}

void *memmove(void *dst, const void *src, usize n)
{
    if ((usize)dst - (usize)src >= n)
        return memcpy(dst, src, n); /* no overlap hazard copying forwards */
    /* dst overlaps the tail of src: copy backwards with DF set. */
    void *d = (u8 *)dst + n - 1;
    const void *s = (const u8 *)src + n - 1;
    __asm__ volatile("std; rep movsb; cld" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
    return dst;
}

int memcmp(const void *a, const void *b, usize n)
{
    const u8 *x = a, *y = b;
    for (usize i = 0; i < n; i++)
        if (x[i] != y[i])
            return x[i] < y[i] ? -1 : 1;
    return 0;
}
