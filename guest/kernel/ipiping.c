/* IPI ping-pong between two CPUs (SYS_IPIPING, the `ipiping` program): the
 * round-trip time of an interrupt, as a guest sees it.
 *
 * The sender writes the x2APIC ICR (fixed delivery, physical destination,
 * VEC_IPI_PING; never KVM_HC_SEND_IPI); the target's handler writes its ICR
 * with VEC_IPI_PONG back to the sender, whose handler marks the reply seen.
 * The sender waits with interrupts on, spinning on that mark, and times
 * the round from its RDTSC before the ICR write to its RDTSC after it saw
 * the mark: two ICR writes (each an exit to the hv), two deliveries, two
 * interrupt entries and EOIs, and the handler's work. */
#include "kernel.h"

/* Per target CPU: 1 + the CPU it answers (0: nobody is pinging it). One
 * ping at a time per target; a second sender is told -EAGAIN. */
static int ping_owner[MAX_CPUS];
/* Per sender: its reply arrived. */
static volatile int pong_seen[MAX_CPUS];

int64_t ipiping_round(int target) {
    struct cpu *c = this_cpu();
    if (target < 0 || target >= ncpus || target == c->id || !__atomic_load_n(&cpus[target].online, __ATOMIC_ACQUIRE))
        return -EINVAL;
    int free = 0;
    if (!__atomic_compare_exchange_n(&ping_owner[target], &free, c->id + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return -EAGAIN;
    __atomic_store_n(&pong_seen[c->id], 0, __ATOMIC_SEQ_CST);
    uint64_t t0 = rdtsc();
    apic_send_ipi(cpus[target].apic_id, VEC_IPI_PING);
    /* The kernel runs with interrupts off; the reply needs them on. Any
     * other interrupt meanwhile (the timer, a TLB flush) is served as in
     * the idle loop: trap() switches tasks only on the way to ring 3. */
    __asm__ volatile("sti" ::: "memory");
    while (!__atomic_load_n(&pong_seen[c->id], __ATOMIC_ACQUIRE))
        cpu_relax();
    uint64_t t1 = rdtsc();
    __asm__ volatile("cli" ::: "memory");
    /* The target read ping_owner before it answered. */
    __atomic_store_n(&ping_owner[target], 0, __ATOMIC_RELEASE);
    return (int64_t)(t1 - t0);
}

int ipiping_ping(void) {
    struct cpu *c = this_cpu();
    int owner = __atomic_load_n(&ping_owner[c->id], __ATOMIC_ACQUIRE);
    apic_eoi();
    if (owner == 0)
        return 0;
    apic_send_ipi(cpus[owner - 1].apic_id, VEC_IPI_PONG);
    return 1;
}

void ipiping_pong(void) {
    struct cpu *c = this_cpu();
    apic_eoi();
    __atomic_store_n(&pong_seen[c->id], 1, __ATOMIC_RELEASE);
}
