/* x87math: long double (80-bit x87) arithmetic, compiled with gcc's
 * default x86-64 code generation, printing long doubles through its own
 * formatter (which itself computes in long double).
 *
 * gcc keeps long double in the x87 unit: fld/fstp of m32/m64/m80, fild and
 * fistp (with fnstcw/fldcw around them for C's truncation), faddp, fmulp,
 * fdivrp, fchs, fabs, fucomip/fcomip, fcmov, fxch, and here also fsqrt,
 * frndint, fprem, fscale, fxam and fnstsw through inline asm. Built for the
 * machine (freestanding, -O2) and natively with -DHOSTED: every line
 * depends only on x87 arithmetic and integer operations, so the outputs
 * must be identical (tests/bare_programs.rs). */

#ifdef HOSTED
#include <stdint.h>
#include <stdio.h>
typedef uint16_t u16;
typedef uint64_t u64;
typedef int64_t s64;
static void out_char(char c) { putchar(c); }
#else
#include "rt.h"
static void out_char(char c) { putc(c); }
#endif

static void out_str(const char *s)
{
    while (*s)
        out_char(*s++);
}

static void out_hex(u64 v, int digits)
{
    for (int i = 4 * (digits - 1); i >= 0; i -= 4)
        out_char("0123456789abcdef"[(v >> i) & 15]);
}

static void out_s64(s64 v)
{
    char buf[24];
    int n = 0;
    u64 u = v < 0 ? -(u64)v : (u64)v;
    do {
        buf[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        out_char('-');
    while (n)
        out_char(buf[--n]);
}

/* The 80 bits of a long double: sign/exponent then significand. */
static void out_bits(long double x)
{
    union {
        long double f;
        struct {
            u64 sig;
            u16 se;
        } b;
    } u = {.f = x};
    out_hex(u.b.se, 4);
    out_char(':');
    out_hex(u.b.sig, 16);
}

/* A decimal rendering with `digits` fractional digits, computed in long
 * double (so the formatter is x87 code too). */
static void out_ld(long double x, int digits)
{
    if (x != x) {
        out_str("nan");
        return;
    }
    if (x < 0) {
        out_char('-');
        x = -x;
    }
    if (x > 1e18L) {
        out_str("big");
        return;
    }
    s64 ip = (s64)x;
    long double frac = x - (long double)ip;
    out_s64(ip);
    out_char('.');
    for (int i = 0; i < digits; i++) {
        frac *= 10;
        int d = (int)frac;
        out_char((char)('0' + d));
        frac -= d;
    }
}

static void line(const char *name, long double x)
{
    out_str(name);
    out_str(" = ");
    out_ld(x, 18);
    out_str(" [");
    out_bits(x);
    out_str("]\n");
}

static long double x87_sqrt(long double x)
{
    __asm__("fsqrt" : "+t"(x));
    return x;
}

static long double x87_rndint(long double x)
{
    __asm__("frndint" : "+t"(x));
    return x;
}

/* fprem until complete (C2 clear): the partial remainder of x by y. */
static long double x87_fmod(long double x, long double y)
{
    u16 sw;
    do {
        __asm__("fprem\n\tfnstsw %1" : "+t"(x), "=a"(sw) : "u"(y));
    } while (sw & 0x400);
    return x;
}

static long double x87_scale(long double x, long double e)
{
    __asm__("fscale" : "+t"(x) : "u"(e));
    return x;
}

/* FXAM's class in C3 C2 C0 (and the sign in C1). */
static unsigned x87_class(long double x)
{
    u16 sw;
    __asm__("fxam\n\tfnstsw %0" : "=a"(sw) : "t"(x));
    return (sw >> 8) & 0x47;
}

/* Runs f under rounding mode `rc` (0-3) through the control word. */
static long double with_rounding(unsigned rc, long double a, long double b)
{
    u16 saved, cw;
    __asm__ volatile("fnstcw %0" : "=m"(saved));
    cw = (u16)((saved & ~0xc00) | (rc << 10));
    __asm__ volatile("fldcw %0" : : "m"(cw));
    long double volatile r = a / b;
    __asm__ volatile("fldcw %0" : : "m"(saved));
    return r;
}

static volatile long double seven = 7.0L, three = 3.0L, tenth = 0.1L;
static volatile double dbl_third = 1.0 / 3.0;
static volatile float flt_pi = 3.14159265358979f;

static int run(void)
{
    long double third = seven / three;
    line("7/3", third);
    line("sqrt(2)", x87_sqrt(2.0L));
    line("sqrt(7/3)", x87_sqrt(third));

    /* A sum that loses precision in double but not in long double. */
    long double sum = 0;
    for (int i = 1; i <= 1000; i++)
        sum += 1.0L / (long double)i;
    line("H(1000)", sum);

    long double prod = 1;
    for (int i = 1; i <= 25; i++)
        prod *= i;
    line("25!", prod);
    out_str("25! bits ");
    out_bits(prod);
    out_char('\n');

    /* Widening and narrowing through memory (m32, m64, m80). */
    line("(long double)1/3 (double)", (long double)dbl_third);
    line("(long double)pi (float)", (long double)flt_pi);
    volatile double narrowed = (double)third;
    volatile float narrowed_f = (float)third;
    line("7/3 as double", narrowed);
    line("7/3 as float", narrowed_f);

    /* Integer conversions: fild, fistp under C's truncation. */
    s64 big = 0x123456789abcdefLL;
    long double lbig = (long double)big;
    line("(long double)0x123456789abcdef", lbig);
    out_str("back to s64: ");
    out_s64((s64)(lbig * 3.5L));
    out_char('\n');
    out_str("(int)-2.75 = ");
    out_s64((int)(-2.75L + tenth - tenth));
    out_char('\n');

    /* Rounding modes on 1/3 and -1/3. */
    for (unsigned rc = 0; rc < 4; rc++) {
        out_str("rc ");
        out_s64(rc);
        out_str(": ");
        out_bits(with_rounding(rc, 1.0L, three));
        out_char(' ');
        out_bits(with_rounding(rc, -1.0L, three));
        out_char('\n');
    }

    line("rndint(2.5)", x87_rndint(2.5L));
    line("rndint(-3.5)", x87_rndint(-3.5L));
    line("fmod(100.7, 3)", x87_fmod(100.7L, three));
    line("scale(1.5, 70)", x87_scale(1.5L, 70.0L));

    /* Compares (fucomip/fcomip) and selects (fcmov). */
    long double vals[] = {third, -third, 0.0L, -0.0L, 1e4000L * 1e4000L, tenth};
    long double lo = vals[0], hi = vals[0];
    for (unsigned i = 1; i < sizeof vals / sizeof vals[0]; i++) {
        lo = vals[i] < lo ? vals[i] : lo;
        hi = vals[i] > hi ? vals[i] : hi;
    }
    line("min", lo);
    out_str("max bits ");
    out_bits(hi);
    out_char('\n');
    out_str("classes");
    long double nan = (1e4000L * 1e4000L) * 0.0L;
    long double classes[] = {0.0L, third, -third, 1e4000L * 1e4000L, nan};
    for (unsigned i = 0; i < sizeof classes / sizeof classes[0]; i++) {
        out_char(' ');
        out_hex(x87_class(classes[i]), 2);
    }
    out_char('\n');

    /* Extended range: values a double cannot hold. */
    long double huge = 1e4000L;
    long double tiny = 1e-4000L;
    out_str("1e4000 bits ");
    out_bits(huge);
    out_str(", 1e-4000 bits ");
    out_bits(tiny);
    out_str(", product ");
    out_ld(huge * tiny, 18);
    out_char('\n');

    out_str("x87math done\n");
    return 0;
}

#ifdef HOSTED
int main(void)
{
    return run();
}
#else
int kmain(void);
int kmain(void)
{
    return run();
}
#endif
