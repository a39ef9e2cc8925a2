/* Integer arithmetic of every width, the way compiled C mixes them. */
typedef unsigned long u64; typedef long i64; typedef unsigned int u32; typedef int i32;
typedef unsigned short u16; typedef short i16; typedef unsigned char u8; typedef signed char i8;

u64 mix64(u64 a, u64 b) { return (a * 0x9e3779b97f4a7c15ull) ^ (b >> 7) ^ (b << 13); }
u32 mix32(u32 a, u32 b) { return (a * 2654435761u) ^ (b >> 3) ^ (b << 5); }
i64 sdiv(i64 a, i64 b) { return b ? a / b : 0; }
u64 udiv(u64 a, u64 b) { return b ? a / b : 0; }
i64 smod(i64 a, i64 b) { return b ? a % b : 0; }
u32 udiv32(u32 a, u32 b) { return b ? a / b + a % b : 0; }
i16 s16(i16 a, i16 b) { return (i16)(a * b + (a >> 3)); }
u8 u8ops(u8 a, u8 b) { return (u8)((a + b) ^ (a >> 1) ^ (b << 2)); }
i8 i8div(i8 a, i8 b) { return b ? a / b : 0; }
u16 u16div(u16 a, u16 b) { return b ? a / b : 0; }
i64 widen(i32 a, i16 b, i8 c, u8 d, u16 e, u32 f) { return (i64)a + b + c + d + e + f; }
u64 rot(u64 x, int r) { return (x << (r & 63)) | (x >> ((64 - r) & 63)); }
u32 rot32(u32 x, int r) { return (x >> (r & 31)) | (x << ((32 - r) & 31)); }
u64 mulhi(u64 a, u64 b) { return (u64)(((unsigned __int128)a * b) >> 64); }
i64 smulhi(i64 a, i64 b) { return (i64)(((__int128)a * b) >> 64); }
int popcount(u64 x) { return __builtin_popcountll(x); }
int ctz(u64 x) { return x ? __builtin_ctzll(x) : 64; }
int clz(u64 x) { return x ? __builtin_clzll(x) : 64; }
int clz32(u32 x) { return x ? __builtin_clz(x) : 32; }
u64 bswap64(u64 x) { return __builtin_bswap64(x); }
u32 bswap32(u32 x) { return __builtin_bswap32(x); }
u16 bswap16(u16 x) { return __builtin_bswap16(x); }
int sign(i64 x) { return (x > 0) - (x < 0); }
i64 absv(i64 x) { return x < 0 ? -x : x; }
u64 minu(u64 a, u64 b) { return a < b ? a : b; }
i32 maxs(i32 a, i32 b) { return a > b ? a : b; }
int overflow_add(i64 a, i64 b, i64 *r) { return __builtin_add_overflow(a, b, r); }
int overflow_mul(u64 a, u64 b, u64 *r) { return __builtin_mul_overflow(a, b, r); }
int parity(u64 x) { return __builtin_parityll(x); }
u64 bits(u64 x, int n) { return (x >> n) & 1 ? x & ~(1ull << n) : x | (1ull << n); }
struct bf { unsigned a : 3, b : 7, c : 13; signed d : 9; };
int bitfields(struct bf *p, int v) { p->b = v; p->d = -v; return p->a + p->c + p->d; }
u64 shifts(u64 x, u32 y, int n) { return (x >> n) + ((i64)x >> (n & 7)) + (y << n) + ((i32)y >> 3); }
u64 cmp_chain(u64 a, u64 b, i64 c, i64 d) { return (a < b) + (a >= b) * 2 + (c < d) * 4 + (c <= d) * 8 + (a == b) * 16; }
u64 hash_bytes(const u8 *p, u64 n) { u64 h = 14695981039346656037ull; while (n--) { h ^= *p++; h *= 1099511628211ull; } return h; }
u32 crc32(const u8 *p, u64 n) {
    u32 c = ~0u;
    while (n--) { c ^= *p++; for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & -(c & 1)); }
    return ~c;
}
