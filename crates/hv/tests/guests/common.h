/* Helpers shared by the hv's test kernels (not the real guest kernel). */
#ifndef TEST_COMMON_H
#define TEST_COMMON_H
#include <stdint.h>
#include "faultline_abi.h"

static inline void outb(uint16_t port, uint8_t v) { __asm__ volatile("outb %0, %1" ::"a"(v), "Nd"(port)); }
static inline uint8_t inb(uint16_t port) { uint8_t v; __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port)); return v; }
static inline void outw(uint16_t port, uint16_t v) { __asm__ volatile("outw %0, %1" ::"a"(v), "Nd"(port)); }
static inline void outl(uint16_t port, uint32_t v) { __asm__ volatile("outl %0, %1" ::"a"(v), "Nd"(port)); }
static inline uint32_t inl(uint16_t port) { uint32_t v; __asm__ volatile("inl %1, %0" : "=a"(v) : "Nd"(port)); return v; }
static inline uint64_t rdmsr(uint32_t msr) { uint32_t lo, hi; __asm__ volatile("rdmsr" : "=a"(lo), "=d"(hi) : "c"(msr)); return ((uint64_t)hi << 32) | lo; }
static inline void wrmsr(uint32_t msr, uint64_t v) { __asm__ volatile("wrmsr" ::"c"(msr), "a"((uint32_t)v), "d"((uint32_t)(v >> 32))); }
static inline uint64_t rdtsc(void) { uint32_t lo, hi; __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi)); return ((uint64_t)hi << 32) | lo; }
static inline void cpuid(uint32_t leaf, uint32_t r[4]) { __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(0)); }

static inline void putc_serial(char c) {
    while (!(inb(COM1_PORT + 5) & 0x20)) {}
    outb(COM1_PORT, (uint8_t)c);
}
static inline void puts_serial(const char *s) { while (*s) putc_serial(*s++); }
static inline void putu(uint64_t v) {
    char buf[21]; int i = 20; buf[i] = 0;
    do { buf[--i] = (char)('0' + v % 10); v /= 10; } while (v);
    puts_serial(&buf[i]);
}
static inline void puthex(uint64_t v) {
    puts_serial("0x");
    for (int i = 60; i >= 0; i -= 4) putc_serial("0123456789abcdef"[(v >> i) & 0xf]);
}
/* One "name=0x..." line on the serial port, for the test to parse. */
static inline void line_hex(const char *name, uint64_t v) {
    puts_serial(name);
    putc_serial('=');
    puthex(v);
    putc_serial('\n');
}
static inline unsigned long slen(const char *s) { unsigned long n = 0; while (s[n]) n++; return n; }
static inline __attribute__((noreturn)) void debug_exit(uint8_t v) {
    outb(DEBUG_EXIT_PORT, v);
    for (;;) __asm__ volatile("cli; hlt");
}
#endif
