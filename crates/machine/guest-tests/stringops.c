/* stringops.c: string instructions and locked atomics.
 *
 * String instructions (MOVS, STOS, CMPS, SCAS, LODS; with REP/REPE/REPNE,
 * all operand sizes, both directions, odd alignments and lengths) are
 * compared with plain byte loops, including the final RSI/RDI/RCX values
 * and guard bytes around the destination. Locked instructions (CMPXCHG,
 * XADD, XCHG, INC/DEC/ADD/AND/OR/XOR, BTS/BTR/BTC) are checked for their
 * memory result, returned value and flags. Exits 0 when every check passes. */
#include "rt.h"

#define BUF 4096
static u8 src[BUF] __attribute__((aligned(64)));
static u8 dst[BUF + 64] __attribute__((aligned(64)));
static u8 ref[BUF + 64] __attribute__((aligned(64)));

#define CF (1ull << 0)
#define ZF (1ull << 6)
#define SF (1ull << 7)

/* Byte loops the compiler must not turn into string instructions. */
static void slow_copy(volatile u8 *d, const volatile u8 *s, usize n)
{
    for (usize i = 0; i < n; i++)
        d[i] = s[i];
}

static void slow_fill(volatile u8 *d, u8 v, usize n)
{
    for (usize i = 0; i < n; i++)
        d[i] = v;
}

static int same(const volatile u8 *a, const volatile u8 *b, usize n)
{
    for (usize i = 0; i < n; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}

static void reset_buffers(void)
{
    slow_fill(dst, 0xee, sizeof(dst));
    slow_fill(ref, 0xee, sizeof(ref));
}

/* The first `span` bytes only (with guard bytes beyond the copy), to keep
 * the many small cases cheap. */
static void reset_prefix(usize span)
{
    slow_fill(dst, 0xee, span);
    slow_fill(ref, 0xee, span);
}

static void test_movs(void)
{
    static const usize lengths[] = { 0, 1, 2, 3, 7, 8, 9, 15, 16, 63, 64, 255, 1000, 4000 };
    static const usize offsets[] = { 0, 1, 3, 7 };
    for (unsigned li = 0; li < sizeof(lengths) / sizeof(lengths[0]); li++) {
        for (unsigned so = 0; so < 4; so++) {
            for (unsigned dof = 0; dof < 4; dof++) {
                usize n = lengths[li];
                if (n + offsets[so] > BUF || n + offsets[dof] + 8 > sizeof(dst))
                    continue;
                usize span = n + offsets[dof] + 32;
                if (span > sizeof(dst))
                    span = sizeof(dst);
                reset_prefix(span);
                slow_copy(ref + offsets[dof], src + offsets[so], n);
                void *d = dst + offsets[dof];
                const void *s = src + offsets[so];
                usize c = n;
                __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(c) : : "memory");
                CHECK(same(dst, ref, span));
                CHECK_EQ(c, 0);
                CHECK_EQ((u64)d, (u64)(dst + offsets[dof] + n));
                CHECK_EQ((u64)s, (u64)(src + offsets[so] + n));
            }
        }
    }

    /* Wider elements: MOVSW/MOVSD/MOVSQ move count * size bytes. */
    for (unsigned size = 2; size <= 8; size *= 2) {
        reset_buffers();
        usize count = 37;
        slow_copy(ref + 8, src + 4, count * size);
        void *d = dst + 8;
        const void *s = src + 4;
        usize c = count;
        if (size == 2)
            __asm__ volatile("rep movsw" : "+D"(d), "+S"(s), "+c"(c) : : "memory");
        else if (size == 4)
            __asm__ volatile("rep movsl" : "+D"(d), "+S"(s), "+c"(c) : : "memory");
        else
            __asm__ volatile("rep movsq" : "+D"(d), "+S"(s), "+c"(c) : : "memory");
        CHECK(same(dst, ref, sizeof(dst)));
        CHECK_EQ((u64)d, (u64)(dst + 8 + count * size));
    }

    /* Backwards (DF = 1) over an overlapping range, as memmove does. */
    reset_buffers();
    slow_copy(dst, src, 512);
    slow_copy(ref, src, 512);
    for (int i = 299; i >= 0; i--)
        ref[i + 100] = ref[i];
    {
        void *d = dst + 399;
        const void *s = dst + 299;
        usize c = 300;
        __asm__ volatile("std\n\trep movsb\n\tcld" : "+D"(d), "+S"(s), "+c"(c) : : "memory");
        CHECK(same(dst, ref, sizeof(dst)));
        CHECK_EQ((u64)d, (u64)(dst + 99));
        CHECK_EQ((u64)s, (u64)dst - 1);
    }

    /* A single MOVSQ without REP moves one element and leaves RCX. */
    reset_buffers();
    {
        void *d = dst;
        const void *s = src;
        usize c = 5;
        __asm__ volatile("movsq" : "+D"(d), "+S"(s), "+c"(c) : : "memory");
        slow_copy(ref, src, 8);
        CHECK(same(dst, ref, sizeof(dst)));
        CHECK_EQ(c, 5);
    }
}

static void test_stos(void)
{
    const u64 pattern = 0x0123456789abcdefull;
    for (unsigned size = 1; size <= 8; size *= 2) {
        reset_buffers();
        usize count = 101;
        for (usize i = 0; i < count * size; i++)
            ref[3 + i] = (u8)(pattern >> (8 * (i % size)));
        void *d = dst + 3;
        usize c = count;
        if (size == 1)
            __asm__ volatile("rep stosb" : "+D"(d), "+c"(c) : "a"(pattern) : "memory");
        else if (size == 2)
            __asm__ volatile("rep stosw" : "+D"(d), "+c"(c) : "a"(pattern) : "memory");
        else if (size == 4)
            __asm__ volatile("rep stosl" : "+D"(d), "+c"(c) : "a"(pattern) : "memory");
        else
            __asm__ volatile("rep stosq" : "+D"(d), "+c"(c) : "a"(pattern) : "memory");
        CHECK(same(dst, ref, sizeof(dst)));
        CHECK_EQ(c, 0);
        CHECK_EQ((u64)d, (u64)(dst + 3 + count * size));
    }
    /* REP with RCX = 0 does nothing. */
    reset_buffers();
    {
        void *d = dst;
        usize c = 0;
        __asm__ volatile("rep stosq" : "+D"(d), "+c"(c) : "a"(pattern) : "memory");
        CHECK(same(dst, ref, sizeof(dst)));
        CHECK_EQ((u64)d, (u64)dst);
    }
    /* Backwards STOSD. */
    reset_buffers();
    {
        void *d = dst + 40;
        usize c = 4;
        __asm__ volatile("std\n\trep stosl\n\tcld" : "+D"(d), "+c"(c) : "a"(0xa1b2c3d4u) : "memory");
        for (int i = 0; i < 4; i++)
            for (int b = 0; b < 4; b++)
                ref[40 - 4 * i + b] = (u8)(0xa1b2c3d4u >> (8 * b));
        CHECK(same(dst, ref, sizeof(dst)));
        CHECK_EQ((u64)d, (u64)(dst + 24));
    }
}

static void test_cmps_scas_lods(void)
{
    /* REPE CMPSB stops after the first difference. */
    slow_copy(dst, src, 256);
    dst[77] ^= 0x40;
    {
        const void *a = src, *b = dst;
        usize c = 256;
        u64 flags;
        __asm__ volatile("repe cmpsb\n\tpushfq\n\tpopq %3"
                         : "+S"(a), "+D"(b), "+c"(c), "=r"(flags)
                         :
                         : "memory", "cc");
        CHECK_EQ(c, 256 - 78);
        CHECK_EQ((u64)a, (u64)(src + 78));
        CHECK_EQ((u64)b, (u64)(dst + 78));
        CHECK_EQ(flags & ZF, 0);
        /* CF from src[77] - dst[77]. */
        CHECK_EQ(!!(flags & CF), src[77] < dst[77]);
    }
    /* Equal buffers: RCX runs out with ZF set. */
    dst[77] ^= 0x40;
    {
        const void *a = src, *b = dst;
        usize c = 256;
        u64 flags;
        __asm__ volatile("repe cmpsb\n\tpushfq\n\tpopq %3"
                         : "+S"(a), "+D"(b), "+c"(c), "=r"(flags)
                         :
                         : "memory", "cc");
        CHECK_EQ(c, 0);
        CHECK(flags & ZF);
    }
    /* REPNE SCASB as strlen. */
    static const char text[] = "the quick brown fox";
    {
        const void *p = text;
        usize c = ~0ull;
        __asm__ volatile("repne scasb" : "+D"(p), "+c"(c) : "a"(0) : "memory", "cc");
        CHECK_EQ(~c - 1, sizeof(text) - 1);
    }
    /* REPE SCASQ over a run of equal quadwords. */
    {
        u64 words[6] = { 5, 5, 5, 9, 5, 5 };
        const void *p = words;
        usize c = 6;
        __asm__ volatile("repe scasq" : "+D"(p), "+c"(c) : "a"(5ull) : "memory", "cc");
        CHECK_EQ(c, 2);
        CHECK_EQ((u64)p, (u64)&words[4]);
    }
    /* LODSB/LODSQ loops. */
    {
        const void *p = src;
        u64 sum = 0, expect = 0;
        for (int i = 0; i < 100; i++) {
            u64 v = 0;
            __asm__ volatile("lodsb" : "+S"(p), "+a"(v) : : "memory");
            sum += v;
            expect += src[i];
        }
        CHECK_EQ(sum, expect);
        u64 q;
        p = src + 8;
        __asm__ volatile("lodsq" : "+S"(p), "=a"(q) : : "memory");
        CHECK_EQ(q, *(volatile u64 *)(src + 8));
        CHECK_EQ((u64)p, (u64)(src + 16));
    }
}

static void test_atomics(void)
{
    static volatile u64 word __attribute__((aligned(8)));
    static volatile u32 word32 __attribute__((aligned(4)));
    u64 flags;

    /* CMPXCHG success: ZF = 1, memory replaced. */
    word = 100;
    {
        u64 expected = 100;
        __asm__ volatile("lock cmpxchgq %3, %1\n\tpushfq\n\tpopq %2"
                         : "+a"(expected), "+m"(word), "=r"(flags)
                         : "r"(200ull)
                         : "memory", "cc");
        CHECK_EQ(word, 200);
        CHECK_EQ(expected, 100);
        CHECK(flags & ZF);
    }
    /* CMPXCHG failure: ZF = 0, RAX = current value, memory kept. */
    {
        u64 expected = 100;
        __asm__ volatile("lock cmpxchgq %3, %1\n\tpushfq\n\tpopq %2"
                         : "+a"(expected), "+m"(word), "=r"(flags)
                         : "r"(300ull)
                         : "memory", "cc");
        CHECK_EQ(word, 200);
        CHECK_EQ(expected, 200);
        CHECK_EQ(flags & ZF, 0);
    }
    /* 32-bit CMPXCHG compares only EAX: the upper half of RAX is ignored. */
    word32 = 0xfffffff0u;
    {
        u64 expected = 0xdead0000fffffff0ull;
        __asm__ volatile("lock cmpxchgl %k3, %1\n\tpushfq\n\tpopq %2"
                         : "+a"(expected), "+m"(word32), "=r"(flags)
                         : "r"(7u)
                         : "memory", "cc");
        CHECK_EQ(word32, 7);
        CHECK(flags & ZF);
    }

    /* XADD returns the old value. */
    word = 40;
    {
        u64 v = 2;
        __asm__ volatile("lock xaddq %0, %1" : "+r"(v), "+m"(word) : : "memory", "cc");
        CHECK_EQ(v, 40);
        CHECK_EQ(word, 42);
    }
    /* XCHG with memory (implicitly locked). */
    {
        u64 v = 9;
        __asm__ volatile("xchgq %0, %1" : "+r"(v), "+m"(word) : : "memory");
        CHECK_EQ(v, 42);
        CHECK_EQ(word, 9);
    }
    /* LOCK DEC to zero sets ZF; LOCK INC of all-ones wraps to zero. */
    word = 1;
    __asm__ volatile("lock decq %0\n\tpushfq\n\tpopq %1" : "+m"(word), "=r"(flags) : : "memory", "cc");
    CHECK_EQ(word, 0);
    CHECK(flags & ZF);
    __asm__ volatile("lock decq %0\n\tpushfq\n\tpopq %1" : "+m"(word), "=r"(flags) : : "memory", "cc");
    CHECK_EQ(word, ~0ull);
    CHECK(flags & SF);
    __asm__ volatile("lock incq %0" : "+m"(word) : : "memory", "cc");
    CHECK_EQ(word, 0);
    /* LOCK ADD/AND/OR/XOR. */
    word = 0xf0f0;
    __asm__ volatile("lock addq $0x10, %0" : "+m"(word) : : "memory", "cc");
    CHECK_EQ(word, 0xf100);
    __asm__ volatile("lock orq $0xf, %0" : "+m"(word) : : "memory", "cc");
    CHECK_EQ(word, 0xf10f);
    __asm__ volatile("lock andq $0xff, %0" : "+m"(word) : : "memory", "cc");
    CHECK_EQ(word, 0x0f);
    __asm__ volatile("lock xorq $0x3c, %0" : "+m"(word) : : "memory", "cc");
    CHECK_EQ(word, 0x33);
    /* LOCK BTS/BTR/BTC: CF = the old bit. */
    word = 0;
    __asm__ volatile("lock btsq $37, %0\n\tpushfq\n\tpopq %1" : "+m"(word), "=r"(flags) : : "memory", "cc");
    CHECK_EQ(word, 1ull << 37);
    CHECK_EQ(flags & CF, 0);
    __asm__ volatile("lock btsq $37, %0\n\tpushfq\n\tpopq %1" : "+m"(word), "=r"(flags) : : "memory", "cc");
    CHECK(flags & CF);
    __asm__ volatile("lock btcq $3, %0" : "+m"(word) : : "memory", "cc");
    CHECK_EQ(word, (1ull << 37) | 8);
    __asm__ volatile("lock btrq $37, %0\n\tpushfq\n\tpopq %1" : "+m"(word), "=r"(flags) : : "memory", "cc");
    CHECK_EQ(word, 8);
    CHECK(flags & CF);
    /* BTS with a register bit offset reaches beyond the addressed word. */
    {
        static volatile u64 bits[4];
        u64 bit = 130;
        __asm__ volatile("lock btsq %1, %0" : "+m"(bits[0]) : "r"(bit) : "memory", "cc");
        CHECK_EQ(bits[2], 4);
    }

    /* What the compiler emits for C11-style atomics. */
    static u64 counter;
    u64 old = __atomic_fetch_add(&counter, 5, __ATOMIC_SEQ_CST);
    CHECK_EQ(old, 0);
    u64 want = 5;
    CHECK(__atomic_compare_exchange_n(&counter, &want, 11, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    want = 5;
    CHECK(!__atomic_compare_exchange_n(&counter, &want, 12, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    CHECK_EQ(want, 11);
    CHECK_EQ(__atomic_exchange_n(&counter, 3, __ATOMIC_SEQ_CST), 11);
    CHECK_EQ(__atomic_or_fetch(&counter, 0x100, __ATOMIC_SEQ_CST), 0x103);
    CHECK_EQ(__atomic_fetch_and(&counter, 0xff, __ATOMIC_SEQ_CST), 0x103);
    CHECK_EQ(__atomic_load_n(&counter, __ATOMIC_SEQ_CST), 3);

    /* A test-and-set spinlock, uncontended. */
    static volatile int lock;
    while (__sync_lock_test_and_set(&lock, 1))
        __asm__ volatile("pause");
    CHECK_EQ(lock, 1);
    __sync_lock_release(&lock);
    CHECK_EQ(lock, 0);
}

int kmain(void);
int kmain(void)
{
    idt_init();
    for (usize i = 0; i < BUF; i++)
        src[i] = (u8)(i * 131 + (i >> 7) + 1);
    test_movs();
    test_stos();
    test_cmps_scas_lods();
    test_atomics();
    return check_report("stringops");
}
