/* KVM's paravirtual features for vCPUs that share host CPUs (Linux's
 * arch/x86/kernel/kvm.c is the model): steal time, PV TLB flush, PV sched
 * yield and PV unhalt (the kick).
 *
 * Steal time: each CPU registers its struct kvm_steal_time with
 * MSR_KVM_STEAL_TIME; the hv adds to `steal` the nanoseconds the vCPU
 * waited for a host CPU and keeps `preempted` set while it waits. The
 * kernel reads its steal clock at every timer tick (per-CPU accounting:
 * `steal_ns`) and reports it at shutdown.
 *
 * PV TLB flush (tlb.c) uses another CPU's `preempted` byte; PV sched yield
 * gives this vCPU's host CPU to a preempted one we wait for; PV unhalt lets
 * a CPU halt with interrupts off until another kicks it.
 *
 * Boot options: no-steal-time, no-pv-tlb-flush, no-pv-sched-yield,
 * no-pv-unhalt. As Linux does, PV TLB flush and PV sched yield need steal
 * time (they read the preempted byte). */
#include "kernel.h"

int pv_steal_time, pv_tlb_flush, pv_sched_yield, pv_unhalt;

static const char *on_off(int on) { return on ? "on" : "off"; }

void pv_init(int no_steal, int no_tlb_flush, int no_yield, int no_unhalt) {
    pv_steal_time = (kvm_features & KVM_FEATURE_STEAL_TIME) && !no_steal;
    pv_tlb_flush = pv_steal_time && (kvm_features & KVM_FEATURE_PV_TLB_FLUSH) && !no_tlb_flush;
    pv_sched_yield = pv_steal_time && (kvm_features & KVM_FEATURE_PV_SCHED_YIELD) && !no_yield;
    pv_unhalt = (kvm_features & KVM_FEATURE_PV_UNHALT) && !no_unhalt;
}

void pv_cpu_init(struct cpu *c) {
    if (!pv_steal_time)
        return;
    memset(&c->steal_time, 0, sizeof(c->steal_time));
    wrmsr(MSR_KVM_STEAL_TIME, (uint64_t)(uintptr_t)&c->steal_time | KVM_MSR_ENABLED);
    c->steal_ns = pv_steal_clock(c);
}

/* Linux's kvm_steal_clock: retry while the hv is writing (odd version)
 * or wrote meanwhile (the version moved). */
uint64_t pv_steal_clock(struct cpu *c) {
    volatile struct kvm_steal_time *st = &c->steal_time;
    uint32_t version;
    uint64_t steal;
    do {
        version = st->version;
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        steal = st->steal;
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
    } while ((version & 1) || version != st->version);
    return steal;
}

void pv_account_steal(struct cpu *c) {
    if (pv_steal_time)
        c->steal_ns = pv_steal_clock(c);
}

int pv_vcpu_is_preempted(int cpu) {
    if (!pv_steal_time)
        return 0;
    return (__atomic_load_n(&cpus[cpu].steal_time.preempted, __ATOMIC_RELAXED) & KVM_VCPU_PREEMPTED) != 0;
}

int pv_yield_to(int cpu) {
    if (!pv_sched_yield || !pv_vcpu_is_preempted(cpu))
        return 0;
    this_cpu()->pv_yields++;
    hypercall4(KVM_HC_SCHED_YIELD, cpus[cpu].apic_id, 0, 0, 0);
    return 1;
}

void pv_kick(int cpu) {
    if (!pv_unhalt)
        return;
    this_cpu()->pv_kicks++;
    hypercall4(KVM_HC_KICK_CPU, 0, cpus[cpu].apic_id, 0, 0);
}

void pv_print_status(void) {
    kprintf("pv: steal time %s, PV TLB flush %s, PV sched yield %s, PV unhalt %s\n", on_off(pv_steal_time),
            on_off(pv_tlb_flush), on_off(pv_sched_yield), on_off(pv_unhalt));
}

void pv_report(void) {
    report("pv_steal_time=%s pv_tlb_flush=%s pv_sched_yield=%s pv_unhalt=%s", on_off(pv_steal_time),
           on_off(pv_tlb_flush), on_off(pv_sched_yield), on_off(pv_unhalt));
    uint64_t steal = 0;
    for (int i = 0; i < ncpus; i++) {
        struct cpu *c = &cpus[i];
        pv_account_steal(c);
        steal += c->steal_ns;
        report("pv_cpu=%d steal_ns=%lu tlb_shootdowns=%lu tlb_ipis=%lu tlb_ipis_preempted=%lu "
               "tlb_pv_skipped=%lu tlb_flush_cycles=%lu tlb_flush_max_cycles=%lu tlb_flushes_received=%lu "
               "tlb_halts=%lu pv_yields=%lu pv_kicks=%lu",
               i, c->steal_ns, c->tlb_shootdowns, c->tlb_ipis, c->tlb_ipis_preempted, c->tlb_pv_skipped,
               c->tlb_flush_cycles, c->tlb_flush_max_cycles, c->tlb_flushes_received, c->tlb_halts, c->pv_yields,
               c->pv_kicks);
    }
    kprintf("pv: steal %lu ns over %d cpu(s)\n", steal, ncpus);
}
