/* fpmath: floating point and auto-vectorised loops, compiled with gcc's
 * default x86-64 code generation (SSE2 on), printing doubles through its
 * own freestanding formatter.
 *
 * Built for the machine (freestanding, -O2 and -O3) and natively with
 * -DHOSTED at the same optimisation level: every line printed depends only
 * on IEEE arithmetic and integer operations, so the machine's output must
 * equal the host CPU's byte for byte (tests/bare_programs.rs). */

#ifdef HOSTED
#include <stdint.h>
#include <stdio.h>
typedef uint8_t u8;
typedef uint32_t u32;
typedef uint64_t u64;
typedef int64_t s64;
static void out_char(char c) { putchar(c); }
#else
#include "rt.h"
static void out_char(char c) { putc(c); }
#endif

#include <emmintrin.h>

static void out_str(const char *s)
{
    while (*s)
        out_char(*s++);
}

static void out_u64(u64 v)
{
    char buf[24];
    int n = 0;
    do {
        buf[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        out_char(buf[--n]);
}

static void out_hex(u64 v)
{
    for (int i = 60; i >= 0; i -= 4)
        out_char("0123456789abcdef"[(v >> i) & 15]);
}

static u64 bits_of(double d)
{
    u64 b;
    __builtin_memcpy(&b, &d, 8);
    return b;
}

/* A double in fixed notation with `digits` decimals (scientific for very
 * large or small magnitudes), plus its exact bits. The conversion itself
 * is floating-point arithmetic: scaling, truncating conversions, rounding. */
static void out_double(double v, int digits)
{
    u64 b = bits_of(v);
    if (b >> 63) {
        out_char('-');
        v = -v;
    }
    if (v != v) {
        out_str("nan");
    } else if (v == __builtin_inf()) {
        out_str("inf");
    } else {
        int exp10 = 0;
        if (v != 0.0 && (v >= 1e15 || v < 1e-5)) {
            while (v >= 10.0) {
                v /= 10.0;
                exp10++;
            }
            while (v < 1.0) {
                v *= 10.0;
                exp10--;
            }
        }
        double scale = 1.0;
        for (int i = 0; i < digits; i++)
            scale *= 10.0;
        double ip = (double)(u64)v;
        u64 frac = (u64)((v - ip) * scale + 0.5);
        u64 whole = (u64)ip;
        if ((double)frac >= scale) {
            frac -= (u64)scale;
            whole++;
        }
        out_u64(whole);
        out_char('.');
        char buf[24];
        for (int i = digits - 1; i >= 0; i--) {
            buf[i] = (char)('0' + frac % 10);
            frac /= 10;
        }
        for (int i = 0; i < digits; i++)
            out_char(buf[i]);
        if (exp10) {
            out_char('e');
            if (exp10 < 0) {
                out_char('-');
                exp10 = -exp10;
            }
            out_u64((u64)exp10);
        }
    }
    out_str(" [");
    out_hex(b);
    out_str("]\n");
}

static void label(const char *s)
{
    out_str(s);
    out_str(": ");
}

#define N 1024

static double xs[N], ys[N];
static float fa[N], fb[N];
static int ia[N], ib[N];
static u8 bytes[N];

/* Vectorisable loops (gcc -O3: addpd/mulpd/paddd/pcmpeqb/...). */
__attribute__((noinline)) static void daxpy(double a, const double *x, double *y, int n)
{
    for (int i = 0; i < n; i++)
        y[i] = a * x[i] + y[i];
}

__attribute__((noinline)) static void fscale(float *x, const float *y, int n)
{
    for (int i = 0; i < n; i++)
        x[i] = x[i] * 0.75f + y[i] / 3.0f;
}

__attribute__((noinline)) static long isum(const int *x, int n)
{
    long s = 0;
    for (int i = 0; i < n; i++)
        s += x[i];
    return s;
}

__attribute__((noinline)) static int imax(const int *x, int n)
{
    int m = x[0];
    for (int i = 1; i < n; i++)
        m = x[i] > m ? x[i] : m;
    return m;
}

__attribute__((noinline)) static int count_byte(const u8 *p, int n, u8 c)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        k += p[i] == c;
    return k;
}

__attribute__((noinline)) static void iadd_shift(int *x, const int *y, int n)
{
    for (int i = 0; i < n; i++)
        x[i] = (x[i] << 3) - (y[i] >> 2) + (x[i] & y[i]);
}

__attribute__((noinline)) static double dot(const double *x, const double *y, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += x[i] * y[i];
    return s;
}

static void matmul8(double c[8][8], double a[8][8], double b[8][8])
{
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) {
            double s = 0;
            for (int k = 0; k < 8; k++)
                s += a[i][k] * b[k][j];
            c[i][j] = s;
        }
}

static double newton_sqrt(double x)
{
    double r = x > 1.0 ? x / 2.0 : 1.0;
    for (int i = 0; i < 60; i++)
        r = 0.5 * (r + x / r);
    return r;
}

static void mandelbrot(void)
{
    for (int y = -10; y <= 10; y++) {
        for (int x = -30; x <= 14; x++) {
            double cr = x / 15.0, ci = y / 10.0, zr = 0, zi = 0;
            int k = 0;
            while (k < 40 && zr * zr + zi * zi < 4.0) {
                double t = zr * zr - zi * zi + cr;
                zi = 2.0 * zr * zi + ci;
                zr = t;
                k++;
            }
            out_char(" .:-=+*#%@"[k % 10]);
        }
        out_char('\n');
    }
}

static int run(void)
{
    u64 seed = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < N; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        xs[i] = (double)(s64)(seed >> 11) / 9007199254740992.0;
        ys[i] = (double)(i % 17) - 8.5;
        fa[i] = (float)(seed >> 40) / 1024.0f;
        fb[i] = (float)i * 0.25f;
        ia[i] = (int)(seed >> 33) - (1 << 30);
        ib[i] = i * 7 - 300;
        bytes[i] = (u8)(seed >> 56) & 0x1f;
    }

    daxpy(1.5, xs, ys, N);
    label("daxpy y[0]");
    out_double(ys[0], 9);
    label("daxpy y[1023]");
    out_double(ys[N - 1], 9);
    label("dot");
    out_double(dot(xs, ys, N), 9);

    fscale(fa, fb, N);
    label("fscale fa[5]");
    out_double(fa[5], 6);
    double fsum = 0;
    for (int i = 0; i < N; i++)
        fsum += fa[i];
    label("fscale sum");
    out_double(fsum, 6);

    label("isum");
    out_u64((u64)isum(ia, N));
    out_char('\n');
    label("imax");
    out_u64((u64)(s64)imax(ia, N));
    out_char('\n');
    label("count_byte");
    out_u64((u64)count_byte(bytes, N, 7));
    out_char('\n');
    iadd_shift(ia, ib, N);
    label("iadd_shift sum");
    out_u64((u64)isum(ia, N));
    out_char('\n');

    double a[8][8], b[8][8], c[8][8];
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) {
            a[i][j] = 1.0 / (i + j + 1);
            b[i][j] = (double)(i * 8 + j) - 31.5;
        }
    matmul8(c, a, b);
    label("matmul c[3][5]");
    out_double(c[3][5], 12);

    label("newton_sqrt(2)");
    out_double(newton_sqrt(2.0), 15);
    label("sqrtsd(2)");
    out_double(_mm_cvtsd_f64(_mm_sqrt_sd(_mm_set_sd(0.0), _mm_set_sd(2.0))), 15);
    label("1/3 as float");
    out_double((double)(1.0f / 3.0f), 12);
    label("u64 max as double");
    out_double((double)0xffffffffffffffffull, 1);
    label("double to u64");
    out_u64((u64)1.8446744073709550e19);
    out_char('\n');
    label("negative to int");
    out_u64((u64)(s64)(int)-2.75);
    out_char('\n');
    label("tiny");
    out_double(2.2250738585072014e-308 / 3.0, 3);
    label("huge");
    out_double(1.7976931348623157e308 * 1.5, 3);
    volatile double zero = 0.0;
    label("nan");
    out_double(zero / zero, 3);
    label("pi");
    double pi = 0;
    for (int k = 0; k < 100000; k++)
        pi += (k & 1 ? -4.0 : 4.0) / (2 * k + 1);
    out_double(pi, 12);
    label("min/max");
    double lo = xs[0], hi = xs[0];
    for (int i = 1; i < N; i++) {
        lo = xs[i] < lo ? xs[i] : lo;
        hi = xs[i] > hi ? xs[i] : hi;
    }
    out_double(hi - lo, 12);
    mandelbrot();
    out_str("fpmath done\n");
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
