/* Steal time as a guest registers it (KVM's ABI): the CPUID bits, KVM's
 * MSR rules (reserved bits 5:1 refused, an address outside RAM accepted),
 * the area after enabling (even version, no steal, not preempted), the
 * steal read with the version protocol, a directed yield and a kick with
 * nobody to yield to or wake. Prints `name=value` lines (msr_probe.h); the
 * Rust test (tests/steal.rs) checks them. */
#include "msr_probe.h"

static volatile struct kvm_steal_time st;

static uint64_t steal_clock(void) {
    uint32_t version;
    uint64_t steal;
    do {
        version = st.version;
        __asm__ volatile("" ::: "memory");
        steal = st.steal;
        __asm__ volatile("" ::: "memory");
    } while ((version & 1) || version != st.version);
    return steal;
}

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    (void)bi;
    setup_idt();
    uint32_t r[4];
    cpuid(0x40000001, r);
    line("features", r[0]);

    uint64_t area = (uint64_t)&st;
    /* Junk the hv must not trust: an odd version. */
    st.version = 7;
    st.steal = 1000;
    line("gp_reserved", try_wrmsr(MSR_KVM_STEAL_TIME, area | KVM_MSR_ENABLED | (1ull << 3)));
    line("gp_enable", try_wrmsr(MSR_KVM_STEAL_TIME, area | KVM_MSR_ENABLED));
    line("msr_readback", rdmsr(MSR_KVM_STEAL_TIME));
    line("version", st.version);
    line("steal", steal_clock());
    line("preempted", st.preempted);

    /* One vCPU: nothing to yield to, nothing to kick; both return 0. */
    line("yield", (uint64_t)hypercall4(KVM_HC_SCHED_YIELD, 0, 0, 0, 0));
    line("yield_unknown", (uint64_t)hypercall4(KVM_HC_SCHED_YIELD, 77, 0, 0, 0));
    line("kick_unknown", (uint64_t)hypercall4(KVM_HC_KICK_CPU, 0, 77, 0, 0));

    line("gp_outside", try_wrmsr(MSR_KVM_STEAL_TIME, 0x7ff00000000ull | KVM_MSR_ENABLED));
    line("gp_disable", try_wrmsr(MSR_KVM_STEAL_TIME, 0));
    line("readback_disabled", rdmsr(MSR_KVM_STEAL_TIME));
    debug_exit(0x21);
}
