/* Kernel-style code: atomics, inline system instructions, spinlocks. */
typedef unsigned long u64; typedef unsigned int u32; typedef unsigned short u16; typedef unsigned char u8;
static inline void outb(u16 port, u8 v) { __asm__ volatile("outb %0, %1" :: "a"(v), "Nd"(port)); }
static inline u8 inb(u16 port) { u8 v; __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port)); return v; }
static inline void outl(u16 port, u32 v) { __asm__ volatile("outl %0, %1" :: "a"(v), "Nd"(port)); }
static inline u64 rdmsr(u32 msr) { u32 lo, hi; __asm__ volatile("rdmsr" : "=a"(lo), "=d"(hi) : "c"(msr)); return ((u64)hi << 32) | lo; }
static inline void wrmsr(u32 msr, u64 v) { __asm__ volatile("wrmsr" :: "c"(msr), "a"((u32)v), "d"((u32)(v >> 32))); }
static inline u64 rdtsc(void) { u32 lo, hi; __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi)); return ((u64)hi << 32) | lo; }
static inline u64 read_cr3(void) { u64 v; __asm__ volatile("mov %%cr3, %0" : "=r"(v)); return v; }
static inline void write_cr3(u64 v) { __asm__ volatile("mov %0, %%cr3" :: "r"(v) : "memory"); }
static inline u64 read_cr2(void) { u64 v; __asm__ volatile("mov %%cr2, %0" : "=r"(v)); return v; }
static inline void invlpg(u64 a) { __asm__ volatile("invlpg (%0)" :: "r"(a) : "memory"); }
static inline void cpuid(u32 leaf, u32 *a, u32 *b, u32 *c, u32 *d) { __asm__ volatile("cpuid" : "=a"(*a), "=b"(*b), "=c"(*c), "=d"(*d) : "a"(leaf), "c"(0)); }
static inline u64 vmcall(u64 nr, u64 a0) { u64 r; __asm__ volatile("vmcall" : "=a"(r) : "a"(nr), "b"(a0) : "memory"); return r; }
void io_test(void) { outb(0x3f8, 'x'); outl(0xf4, 0); (void)inb(0x3fd); }
u64 sys_test(void) {
    u32 a, b, c, d; cpuid(0, &a, &b, &c, &d);
    write_cr3(read_cr3()); invlpg(0x1000);
    wrmsr(0xc0000082, rdmsr(0xc0000082));
    return rdtsc() + a + read_cr2() + vmcall(1, 2);
}
void irq_on(void) { __asm__ volatile("sti"); }
void irq_off(void) { __asm__ volatile("cli"); }
u64 save_flags(void) { u64 f; __asm__ volatile("pushfq; popq %0" : "=r"(f)); return f; }
void restore_flags(u64 f) { __asm__ volatile("pushq %0; popfq" :: "r"(f) : "memory", "cc"); }
void halt(void) { __asm__ volatile("hlt"); }
void pause(void) { __asm__ volatile("pause"); }
struct spinlock { volatile int locked; };
void spin_lock(struct spinlock *l) { while (__atomic_exchange_n(&l->locked, 1, __ATOMIC_ACQUIRE)) while (l->locked) __builtin_ia32_pause(); }
void spin_unlock(struct spinlock *l) { __atomic_store_n(&l->locked, 0, __ATOMIC_RELEASE); }
u64 counter_add(u64 *p, u64 v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
u32 counter_inc32(u32 *p) { return __atomic_add_fetch(p, 1, __ATOMIC_SEQ_CST); }
int cas(u64 *p, u64 old, u64 new) { return __atomic_compare_exchange_n(p, &old, new, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); }
u8 cas8(u8 *p, u8 old, u8 new) { __atomic_compare_exchange_n(p, &old, new, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); return old; }
u16 xchg16(u16 *p, u16 v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
void set_bit(u64 *p, int n) { __atomic_fetch_or(p, 1ull << n, __ATOMIC_SEQ_CST); }
int test_and_clear(u64 *p, int n) { return (__atomic_fetch_and(p, ~(1ull << n), __ATOMIC_SEQ_CST) >> n) & 1; }
void seq_store(u64 *p, u64 v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
void fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
u64 fetch_sub(u64 *p) { return __atomic_sub_fetch(p, 3, __ATOMIC_RELAXED); }
u64 fetch_xor(u64 *p, u64 v) { return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED); }
void lgdt(void *p) { __asm__ volatile("lgdt (%0)" :: "r"(p)); }
void lidt(void *p) { __asm__ volatile("lidt (%0)" :: "r"(p)); }
void ltr(u16 s) { __asm__ volatile("ltr %0" :: "r"(s)); }
void swapgs(void) { __asm__ volatile("swapgs"); }
void sysret(void) { __asm__ volatile("sysretq"); }
void iret(void) { __asm__ volatile("iretq"); }
void syscall0(void) { __asm__ volatile("syscall" ::: "rcx", "r11", "memory"); }
void load_ds(u16 s) { __asm__ volatile("mov %0, %%ds; mov %0, %%es; mov %0, %%ss" :: "r"(s)); }
void reload_cs(void) { __asm__ volatile("pushq $8; leaq 1f(%%rip), %%rax; pushq %%rax; lretq; 1:" ::: "rax", "memory"); }
void int3(void) { __asm__ volatile("int3"); }
void int80(void) { __asm__ volatile("int $0x80"); }
void wbinvd(void) { __asm__ volatile("wbinvd"); }
void clflush(void *p) { __asm__ volatile("clflush (%0)" :: "r"(p)); }
u64 rdtscp(u32 *aux) { u32 lo, hi; __asm__ volatile("rdtscp" : "=a"(lo), "=d"(hi), "=c"(*aux)); return ((u64)hi << 32) | lo; }
u64 gs_read(void) { u64 v; __asm__ volatile("movq %%gs:8, %0" : "=r"(v)); return v; }
void cr8(u64 v) { __asm__ volatile("mov %0, %%cr8" :: "r"(v)); }
void rep_movsb(void *d, const void *s, u64 n) { __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) :: "memory"); }
void rep_stosq(void *d, u64 v, u64 n) { __asm__ volatile("rep stosq" : "+D"(d), "+c"(n) : "a"(v) : "memory"); }
