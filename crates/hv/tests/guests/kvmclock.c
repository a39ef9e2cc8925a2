/* kvmclock as a guest uses it: the CPUID bits, enabling the per-vCPU time
 * info, reading nanoseconds from the TSC with pvclock's formula (and its
 * version protocol), the refresh after a TSC write, the wall clock, and
 * KVM's MSR rules. Prints `name=value` lines (msr_probe.h); the Rust test
 * (tests/kvmclock.rs) checks them against the VM's virtual time. */
#include "msr_probe.h"

static volatile struct pvclock_vcpu_time_info pvti __attribute__((aligned(32)));
static volatile struct pvclock_wall_clock wall __attribute__((aligned(16)));

/* pvclock_clocksource_read: retry while the hv is updating (odd version)
 * or updated under us. */
static uint64_t clock_ns(uint64_t *tsc_out) {
    uint32_t version;
    uint64_t ns, tsc;
    do {
        version = pvti.version;
        __asm__ volatile("" ::: "memory");
        tsc = rdtsc();
        uint64_t delta = tsc - pvti.tsc_timestamp;
        int8_t shift = pvti.tsc_shift;
        if (shift < 0)
            delta >>= -shift;
        else
            delta <<= shift;
        ns = pvti.system_time + (uint64_t)(((unsigned __int128)delta * pvti.tsc_to_system_mul) >> 32);
        __asm__ volatile("" ::: "memory");
    } while ((version & 1) || version != pvti.version);
    if (tsc_out)
        *tsc_out = tsc;
    return ns;
}

static void spin(uint64_t n) {
    for (volatile uint64_t i = 0; i < n; i++) {}
}

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    (void)bi;
    setup_idt();
    uint32_t r[4];
    cpuid(0x40000001, r);
    line("features", r[0]);
    cpuid(0x15, r);
    line("tsc_hz", (uint64_t)r[2] * r[1] / r[0]);

    uint64_t area = (uint64_t)&pvti;
    line("tsc_before_enable", rdtsc());
    line("gp_enable", try_wrmsr(MSR_KVM_SYSTEM_TIME_NEW, area | KVM_SYSTEM_TIME_ENABLE));
    line("msr_readback", rdmsr(MSR_KVM_SYSTEM_TIME_NEW));
    line("version", pvti.version);
    line("flags", pvti.flags);
    line("mul", pvti.tsc_to_system_mul);
    line("shift", (uint8_t)pvti.tsc_shift);
    line("tsc_timestamp", pvti.tsc_timestamp);
    line("system_time", pvti.system_time);

    uint64_t tsc_a, tsc_b, tsc_c;
    uint64_t ns_a = clock_ns(&tsc_a);
    spin(100000);
    uint64_t ns_b = clock_ns(&tsc_b);
    line("tsc_a", tsc_a);
    line("ns_a", ns_a);
    line("tsc_b", tsc_b);
    line("ns_b", ns_b);

    /* Moving the TSC moves the time info with it: the clock goes on. */
    uint32_t before = pvti.version;
    wrmsr(0x10, 1ull << 40);
    uint64_t ns_c = clock_ns(&tsc_c);
    line("version_step", pvti.version - before);
    line("tsc_c", tsc_c);
    line("ns_c", ns_c);

    /* KVM refuses no value: an address outside RAM is simply not written. */
    line("gp_outside", try_wrmsr(MSR_KVM_SYSTEM_TIME_NEW, 0x7ff00000000ull | KVM_SYSTEM_TIME_ENABLE));
    line("gp_disable", try_wrmsr(MSR_KVM_SYSTEM_TIME_NEW, 0));

    line("gp_wall", try_wrmsr(MSR_KVM_WALL_CLOCK_NEW, (uint64_t)&wall));
    line("wall_version", wall.version);
    line("wall_sec", wall.sec);
    line("wall_nsec", wall.nsec);
    line("wall_readback", rdmsr(MSR_KVM_WALL_CLOCK_NEW));
    debug_exit(0x21);
}
