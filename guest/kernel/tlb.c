/* Remote TLB shootdown of user mappings, with KVM's PV TLB flush.
 *
 * A CPU that removed user mappings of an address space flushes them from
 * its own TLB and asks every other CPU running that address space to do
 * the same: each sender has one request slot (the range and a mask of the
 * CPUs still to flush); it sends the flush IPI and spins until the mask is
 * empty. The kernel runs with interrupts off, so a CPU that spins here (or
 * for the slot of another sender) also serves the requests addressed to
 * it, and two senders never wait for each other.
 *
 * With PV TLB flush (Linux's kvm_flush_tlb_multi) a target whose steal-time
 * area says KVM_VCPU_PREEMPTED gets no IPI: the sender sets
 * KVM_VCPU_FLUSH_TLB in its `preempted` byte with a compare-and-exchange
 * (which fails if the hv cleared the byte meanwhile: the target runs, and
 * gets an IPI), and the hv flushes the target's TLB before it runs again.
 * While it waits for acknowledgements, a sender with PV sched yield gives
 * its host CPU to a target that got preempted after the IPI
 * (kvm_smp_send_call_func_ipi does the same). With PV unhalt, a sender
 * that has spun WAIT_SPINS times halts with interrupts off (a halted vCPU
 * holds no host CPU, so a preempted target can have it) until the target
 * that clears the last bit, or a new sender that needs it, kicks it with
 * KVM_HC_KICK_CPU: Linux's pv qspinlock waits the same way (kvm_wait,
 * kvm_kick_cpu). */
#include "kernel.h"

struct tlb_request {
    uint64_t start, end;
    volatile uint64_t pending; /* CPUs still to flush */
} __attribute__((aligned(64)));

static struct tlb_request requests[MAX_CPUS];

/* Per CPU: it halts waiting for acknowledgements (PV unhalt). */
static volatile int halt_waiting[MAX_CPUS];

/* Spins before a halt: about 2^11 passes of the wait loop (tens of
 * microseconds here), a dedicated target's usual acknowledgement time, so a
 * sender only halts when a target is slow (Linux's pv qspinlock spins
 * 2^15 times: its loop is a few instructions, ours a pass over the CPUs). */
#define WAIT_SPINS (1 << 11)

static void flush_range(uint64_t start, uint64_t end) {
    for (uint64_t va = start; va < end; va += PAGE_SIZE)
        invlpg(va);
}

void tlb_serve_requests(struct cpu *c) {
    uint64_t bit = 1ULL << c->id;
    for (int s = 0; s < ncpus; s++) {
        struct tlb_request *r = &requests[s];
        if (!(__atomic_load_n(&r->pending, __ATOMIC_ACQUIRE) & bit))
            continue;
        /* An address space this CPU no longer runs left its TLB at the
         * CR3 switch; flushing the range anyway is harmless. */
        flush_range(r->start, r->end);
        c->tlb_flushes_received++;
        uint64_t left = __atomic_and_fetch(&r->pending, ~bit, __ATOMIC_SEQ_CST);
        if (left == 0 && halt_waiting[s])
            pv_kick(s);
    }
}

void tlb_shootdown(struct mm *mm, uint64_t start, uint64_t end) {
    struct cpu *c = this_cpu();
    flush_range(start, end);
    struct tlb_request *r = &requests[c->id];
    r->start = start;
    r->end = end;
    /* The cleared PTEs are visible before we look at who runs mm. */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    uint64_t t0 = rdtsc();
    uint64_t mask = 0;
    for (int i = 0; i < ncpus; i++) {
        struct cpu *t = &cpus[i];
        if (t == c || !__atomic_load_n(&t->online, __ATOMIC_ACQUIRE) ||
            __atomic_load_n(&t->loaded_mm, __ATOMIC_ACQUIRE) != mm)
            continue;
        if (pv_tlb_flush) {
            uint8_t state = __atomic_load_n(&t->steal_time.preempted, __ATOMIC_RELAXED);
            if ((state & KVM_VCPU_PREEMPTED) &&
                __atomic_compare_exchange_n(&t->steal_time.preempted, &state, state | KVM_VCPU_FLUSH_TLB, 0,
                                            __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
                c->tlb_pv_skipped++;
                continue;
            }
        }
        mask |= 1ULL << i;
    }
    c->tlb_shootdowns++;
    __atomic_store_n(&r->pending, mask, __ATOMIC_RELEASE);
    for (int i = 0; i < ncpus; i++) {
        if (!(mask & (1ULL << i)))
            continue;
        c->tlb_ipis++;
        if (pv_vcpu_is_preempted(i))
            c->tlb_ipis_preempted++;
        apic_send_ipi(cpus[i].apic_id, VEC_TLB_FLUSH);
        /* A target halted in its own wait takes no interrupt: wake it. */
        if (__atomic_load_n(&halt_waiting[i], __ATOMIC_SEQ_CST))
            pv_kick(i);
    }
    uint64_t pending;
    unsigned spins = 0;
    while ((pending = __atomic_load_n(&r->pending, __ATOMIC_ACQUIRE)) != 0) {
        tlb_serve_requests(c);
        int yielded = 0;
        for (int i = 0; i < ncpus && !yielded; i++)
            if (pending & (1ULL << i))
                yielded = pv_yield_to(i);
        if (pv_unhalt && !yielded && ++spins >= WAIT_SPINS) {
            spins = 0;
            __atomic_store_n(&halt_waiting[c->id], 1, __ATOMIC_SEQ_CST);
            /* Checked after announcing the wait: the last acknowledgement
             * either comes later (and kicks) or is seen here. */
            if (__atomic_load_n(&r->pending, __ATOMIC_SEQ_CST) != 0) {
                c->tlb_halts++;
                __asm__ volatile("hlt" ::: "memory"); /* interrupts are off: a kick wakes it */
            }
            __atomic_store_n(&halt_waiting[c->id], 0, __ATOMIC_SEQ_CST);
        }
        cpu_relax();
    }
    uint64_t took = rdtsc() - t0;
    c->tlb_flush_cycles += took;
    if (took > c->tlb_flush_max_cycles)
        c->tlb_flush_max_cycles = took;
}
