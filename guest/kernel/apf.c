/* Asynchronous page faults, guest side (seed 000, and the event protocol
 * after seed 002). When the hv must fetch a page the current user task
 * touched (from swap, say), it tells the guest "page not present" with a
 * token instead of stalling the vCPU; the guest puts that task to sleep on
 * the token and runs another. When the page is in, "page ready" with the
 * same token wakes the task, which retries the faulting instruction.
 *
 * Two protocols (crates/abi documents both):
 *  - x86, KVM's real ABI: CPUID 0x40000001 has ASYNC_PF and ASYNC_PF_INT.
 *    Per CPU: MSR_KVM_ASYNC_PF_INT = VEC_APF_READY, then
 *    MSR_KVM_ASYNC_PF_EN = area | ENABLED | DELIVERY_AS_INT. Not present is
 *    a #PF with the area's flags set and CR2 = token; ready is an APIC
 *    interrupt with the token in the area, acknowledged by MSR_KVM_ASYNC_PF_ACK.
 *  - event: HC_APF_VERSION answers APF_EVENT_VERSION. Per CPU:
 *    HC_APF_ENABLE(area, VEC_APF_NOTPRESENT, VEC_APF_READY, 0). Not present
 *    is an event the hv injects on VEC_APF_NOTPRESENT (not through the APIC:
 *    no EOI); ready is an APIC interrupt, acknowledged by HC_APF_ACK.
 * SEND_ALWAYS is never asked for: the kernel is not preemptible, so
 * notifications are wanted only at CPL 3 (the hv halts the vCPU instead
 * when the fault is in the kernel). */
#include "kernel.h"

enum apf_protocol apf_protocol;
static char disabled_reason[96];

/* Every task can wait on one token, and each CPU can have up to
 * APF_MAX_OUTSTANDING notifications whose ready came first. */
#define APF_POOL_NODES (MAX_TASKS + APF_MAX_OUTSTANDING * MAX_CPUS)
static struct apf_node apf_nodes[APF_POOL_NODES];
static struct apf_waiters apf_waiters;

static const char *protocol_name(enum apf_protocol p) {
    return p == APF_X86 ? "x86" : p == APF_EVENT ? "event" : "none";
}

void apf_init(int disabled_by_option) {
    apf_waiters_init(&apf_waiters, apf_nodes, APF_POOL_NODES);
    apf_protocol = APF_NONE;
    const uint32_t x86_bits = KVM_FEATURE_ASYNC_PF | KVM_FEATURE_ASYNC_PF_INT;
    if (disabled_by_option) {
        ksnprintf(disabled_reason, sizeof(disabled_reason), "no-apf boot option");
        return;
    }
    if ((kvm_features & x86_bits) == x86_bits) {
        apf_protocol = APF_X86;
        return;
    }
    long version = hypercall4(HC_APF_VERSION, 0, 0, 0, 0);
    if (version != (long)APF_EVENT_VERSION) {
        ksnprintf(disabled_reason, sizeof(disabled_reason),
                  "hv offers neither: KVM features %x, HC_APF_VERSION %ld", kvm_features, version);
        return;
    }
    /* The node pool assumes at most APF_MAX_OUTSTANDING per CPU. */
    long slots = hypercall4(HC_APF_SLOTS, 0, 0, 0, 0);
    if (slots <= 0 || slots > (long)APF_MAX_OUTSTANDING) {
        ksnprintf(disabled_reason, sizeof(disabled_reason), "HC_APF_SLOTS %ld outside 1..%d", slots,
                  (int)APF_MAX_OUTSTANDING);
        return;
    }
    apf_protocol = APF_EVENT;
}

void apf_cpu_init(struct cpu *c) {
    struct apf_cpu *a = &c->apf;
    memset(&a->x86_area, 0, sizeof(a->x86_area));
    memset(&a->event_area, 0, sizeof(a->event_area));
    a->enabled = 0;
    if (apf_protocol == APF_X86) {
        /* The vector first: page-ready interrupts may follow the enable. */
        wrmsr(MSR_KVM_ASYNC_PF_INT, VEC_APF_READY);
        wrmsr(MSR_KVM_ASYNC_PF_EN,
              (uint64_t)(uintptr_t)&a->x86_area | KVM_ASYNC_PF_ENABLED | KVM_ASYNC_PF_DELIVERY_AS_INT);
        a->enabled = 1;
    } else if (apf_protocol == APF_EVENT) {
        long rc = hypercall4(HC_APF_ENABLE, (uintptr_t)&a->event_area, VEC_APF_NOTPRESENT, VEC_APF_READY, 0);
        if (rc == 0)
            a->enabled = 1;
        else
            kprintf("apf: cpu %d: HC_APF_ENABLE failed: %ld\n", c->id, rc);
    }
}

void apf_print_status(void) {
    if (apf_protocol == APF_NONE) {
        kprintf("apf: disabled (%s)\n", disabled_reason);
        return;
    }
    int on = 0;
    for (int i = 0; i < ncpus; i++)
        on += cpus[i].apf.enabled;
    kprintf("apf: enabled, protocol %s (%d of %d cpus)\n", protocol_name(apf_protocol), on, ncpus);
}

/* Called under the token's bucket lock; returns holding this CPU's run
 * queue lock, which wait_for_token's sched_block_finish releases. */
static void block_current(void *task) {
    struct cpu *c = sched_block_begin();
    KASSERT(task == c->current);
}

static void wake_task(void *task) { task_wake_preempt(task); }

/* Puts the current task to sleep until the page behind `token` is
 * ready; returns at once if the ready came first. */
static enum apf_sleep_result wait_for_token(uint32_t token) {
    enum apf_sleep_result r = apf_waiters_sleep(&apf_waiters, token, this_cpu()->current, block_current);
    if (r == APF_SLEEP_QUEUED)
        sched_block_finish(this_cpu());
    else if (r == APF_SLEEP_NO_NODE)
        panic("apf: waiter pool exhausted (%d nodes) sleeping on token %x", APF_POOL_NODES, token);
    return r;
}

/* Wakes the task waiting on `token` (every waiter for APF_WAKE_ALL), or
 * remembers that the page is ready for the task that will ask. */
static enum apf_wake_result wake_token(uint32_t token) {
    if (token == APF_WAKE_ALL) {
        apf_waiters_wake_all(&apf_waiters, wake_task);
        return APF_WAKE_WOKE;
    }
    enum apf_wake_result r = apf_waiters_wake(&apf_waiters, token, wake_task);
    if (r == APF_WAKE_NO_NODE)
        panic("apf: waiter pool exhausted (%d nodes) on an early ready for token %x", APF_POOL_NODES, token);
    return r;
}

/* A page-not-present notification for the current user task. */
static void not_present(struct trapframe *tf, uint32_t token) {
    struct cpu *c = this_cpu();
    if (!(tf->cs & 3))
        panic("apf: page-not-present (token %x) in kernel mode at rip %lx, but SEND_ALWAYS is off", token,
              tf->rip);
    if (token == 0) {
        c->apf.spurious++; /* nothing to wait for: retrying the access is all there is */
        return;
    }
    c->apf.not_present++;
    wait_for_token(token);
}

static void page_ready(struct cpu *c, uint32_t token) {
    c->apf.ready++;
    if (token == 0) {
        c->apf.spurious++;
        return;
    }
    if (token == APF_WAKE_ALL)
        c->apf.wake_all++;
    if (wake_token(token) != APF_WAKE_WOKE)
        c->apf.early++;
}

int apf_x86_page_fault(struct trapframe *tf, uint64_t cr2) {
    struct cpu *c = this_cpu();
    if (apf_protocol != APF_X86 || !c->apf.enabled)
        return 0;
    volatile uint32_t *flags = &c->apf.x86_area.flags;
    if (!(*flags & KVM_PV_REASON_PAGE_NOT_PRESENT))
        return 0;
    *flags = 0;
    not_present(tf, (uint32_t)cr2);
    return 1;
}

int apf_event_not_present(struct trapframe *tf) {
    struct cpu *c = this_cpu();
    if (apf_protocol != APF_EVENT || !c->apf.enabled)
        return 0;
    volatile uint32_t *slot = &c->apf.event_area.notpresent_token;
    uint32_t token = *slot;
    *slot = 0; /* the slot is free: the hv may deliver the next one */
    not_present(tf, token);
    return 1;
}

int apf_page_ready(void) {
    struct cpu *c = this_cpu();
    if (!c->apf.enabled)
        return 0;
    uint32_t token;
    if (apf_protocol == APF_X86) {
        volatile uint32_t *slot = &c->apf.x86_area.token;
        token = *slot;
        *slot = 0;
        apic_eoi();
        wrmsr(MSR_KVM_ASYNC_PF_ACK, 1);
    } else {
        volatile uint32_t *slot = &c->apf.event_area.ready_token;
        token = *slot;
        *slot = 0;
        apic_eoi();
        hypercall4(HC_APF_ACK, 0, 0, 0, 0);
    }
    page_ready(c, token);
    return 1;
}

void apf_report(void) {
    if (apf_protocol == APF_NONE) {
        kprintf("apf: disabled (%s)\n", disabled_reason);
        report("apf_protocol=none");
        return;
    }
    uint64_t np = 0, ready = 0, early = 0, wake_all = 0, spurious = 0;
    for (int i = 0; i < ncpus; i++) {
        np += cpus[i].apf.not_present;
        ready += cpus[i].apf.ready;
        early += cpus[i].apf.early;
        wake_all += cpus[i].apf.wake_all;
        spurious += cpus[i].apf.spurious;
    }
    uint32_t waiting, early_left;
    apf_waiters_count(&apf_waiters, &waiting, &early_left);
    kprintf("apf: protocol %s, %lu not-present, %lu ready, %lu early, %lu wake-all, %lu spurious, %u still "
            "waiting\n",
            protocol_name(apf_protocol), np, ready, early, wake_all, spurious, waiting);
    report("apf_protocol=%s apf_not_present=%lu apf_ready=%lu apf_early=%lu apf_wake_all=%lu apf_spurious=%lu "
           "apf_waiting=%u apf_early_unclaimed=%u",
           protocol_name(apf_protocol), np, ready, early, wake_all, spurious, waiting, early_left);
}

#ifdef DEBUG
/* Boot self-check of the sleeping and waking machinery with kernel
 * threads standing in for faulting user tasks (no hv involved). Tokens
 * use vCPU field 0xfff, which no real token has. */
#define CHECK_TOKEN(i) (((uint32_t)(0x7f000 + (i)) << 12) | 0xfff)

struct apf_check {
    uint32_t token;
    volatile int slept; /* 1 if it blocked, 0 if the ready came first */
    volatile int done;
};

static volatile int check_log[4];
static volatile int check_log_len;

static void log_run(int who) {
    int i = __atomic_fetch_add(&check_log_len, 1, __ATOMIC_ACQ_REL);
    if (i < 4)
        check_log[i] = who;
}

static int check_sleeper(void *arg) {
    struct apf_check *k = arg;
    k->slept = wait_for_token(k->token) == APF_SLEEP_QUEUED;
    log_run(0);
    k->done = 1;
    return 7;
}

static int check_runner(void *arg) {
    log_run((int)(uintptr_t)arg);
    return 0;
}

static struct task *start_on(const char *name, int (*fn)(void *), void *arg, int cpu) {
    struct task *t = task_alloc(name);
    KASSERT(t);
    t->kfn = fn;
    t->karg = arg;
    task_start(t, cpu);
    return t;
}

static void until_blocked(struct task *t) {
    while (t->state != T_BLOCKED)
        yield();
}

void apf_self_check(void) {
    int here = this_cpu()->id, other = ncpus > 1 ? (here + 1) % ncpus : here;
    static struct apf_check k[5];
    for (int i = 0; i < 5; i++)
        k[i] = (struct apf_check){.token = CHECK_TOKEN(i)};

    /* Not present, then ready from another CPU. */
    struct task *t = start_on("apf-check", check_sleeper, &k[0], other);
    until_blocked(t);
    KASSERT(!k[0].done);
    KASSERT(wake_token(k[0].token) == APF_WAKE_WOKE);
    KASSERT(task_wait(t->tid) == 7 && k[0].slept);

    /* Ready first: the sleep does not block. */
    KASSERT(wake_token(k[1].token) == APF_WAKE_EARLY);
    t = start_on("apf-check", check_sleeper, &k[1], other);
    KASSERT(task_wait(t->tid) == 7 && !k[1].slept);

    /* Wake-all wakes waiters on both CPUs and drops ready-first nodes. */
    struct task *w[3];
    for (int i = 0; i < 3; i++)
        w[i] = start_on("apf-check", check_sleeper, &k[2 + i], i % 2 ? other : here);
    for (int i = 0; i < 3; i++)
        until_blocked(w[i]);
    KASSERT(wake_token(CHECK_TOKEN(99)) == APF_WAKE_EARLY);
    wake_token(APF_WAKE_ALL);
    for (int i = 0; i < 3; i++)
        KASSERT(task_wait(w[i]->tid) == 7 && k[2 + i].slept);

    /* Wakeup preemption: the woken task runs before tasks queued earlier. */
    k[0] = (struct apf_check){.token = CHECK_TOKEN(0)};
    t = start_on("apf-check", check_sleeper, &k[0], here);
    until_blocked(t);
    check_log_len = 0;
    struct task *r1 = start_on("apf-run", check_runner, (void *)1, here);
    struct task *r2 = start_on("apf-run", check_runner, (void *)2, here);
    KASSERT(wake_token(k[0].token) == APF_WAKE_WOKE);
    KASSERT(task_wait(t->tid) == 7 && task_wait(r1->tid) == 0 && task_wait(r2->tid) == 0);
    KASSERT(check_log_len == 3 && check_log[0] == 0 && check_log[1] == 1 && check_log[2] == 2);

    uint32_t waiting, early;
    apf_waiters_count(&apf_waiters, &waiting, &early);
    KASSERT(waiting == 0 && early == 0 && apf_waiters.free_nodes == APF_POOL_NODES);
    kprintf("apf: self-check passed (sleep/wake across cpus, ready first, wake-all, wakeup preemption)\n");
}
#endif
