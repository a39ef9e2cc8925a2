/* Tasks and the scheduler: per-CPU run queues (round robin; a task that
 * used up its time slice is preempted at a timer tick), sleeping on virtual
 * time, wait queues, wakeup preemption, exit and wait.
 *
 * A task stays on the CPU it was started on; new tasks go to the least
 * loaded CPU. Locking: a CPU's rq_lock guards its run queue, its sleepers
 * and the state of the tasks it owns; it is taken after any wait-queue
 * lock, and held across context_switch (released by the task switched to,
 * in finish_switch). */
#include "kernel.h"

struct task tasks[MAX_TASKS];
static spinlock_t task_table_lock;
static spinlock_t exit_lock;
static int next_tid = 1;
static uint8_t kstacks[MAX_TASKS][KSTACK_SIZE] __attribute__((aligned(16)));
static uint64_t slice_cycles; /* SLICE_NS in TSC cycles */

static void rq_push(struct cpu *c, struct task *t) {
    t->next = NULL;
    if (c->rq_tail)
        c->rq_tail->next = t;
    else
        c->rq_head = t;
    c->rq_tail = t;
    c->rq_len++;
}

/* A task woken after sleeping on a page runs next, as CFS favours a task
 * that slept: its CPU had other work meanwhile, now it is the waiter's turn. */
static void rq_push_front(struct cpu *c, struct task *t) {
    t->next = c->rq_head;
    c->rq_head = t;
    if (!c->rq_tail)
        c->rq_tail = t;
    c->rq_len++;
}

static struct task *rq_pop(struct cpu *c) {
    struct task *t = c->rq_head;
    if (t) {
        c->rq_head = t->next;
        if (!c->rq_head)
            c->rq_tail = NULL;
        c->rq_len--;
        t->next = NULL;
    }
    return t;
}

/* The kernel's clock, monotonic across CPUs. The hv keeps the vCPUs' TSCs
 * within its lookahead of each other but not equal (kvmclock is not
 * advertised stable), so a time read on one CPU and handed to another
 * through memory can be later than the other's TSC. As Linux's
 * pvclock_clocksource_read does without PVCLOCK_TSC_STABLE_BIT, every
 * reading goes through one global last value: a reading behind it returns
 * it instead. The common case is one shared load and one compare-exchange
 * (none when the reading is not newer). */
static uint64_t clock_last_tsc;

uint64_t clock_tsc(void) {
    uint64_t t = rdtsc();
    uint64_t last = __atomic_load_n(&clock_last_tsc, __ATOMIC_ACQUIRE);
    do {
        if (t <= last)
            return last;
    } while (!__atomic_compare_exchange_n(&clock_last_tsc, &last, t, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    return t;
}

uint64_t now_ns(void) { return tsc_to_ns(clock_tsc()); }

uint64_t tsc_to_ns(uint64_t t) {
    /* Split to avoid overflowing t * 1e9. */
    return (t / tsc_hz) * 1000000000ULL + (t % tsc_hz) * 1000000000ULL / tsc_hz;
}

struct task *task_alloc(const char *name) {
    spin_lock(&task_table_lock);
    struct task *t = NULL;
    for (int i = 0; i < MAX_TASKS; i++) {
        struct task *c = &tasks[i];
        if (c->state == T_FREE || (c->state == T_DEAD && c->reaped && !c->on_cpu)) {
            t = c;
            break;
        }
    }
    if (t) {
        int slot = (int)(t - tasks);
        memset(t, 0, sizeof(*t));
        t->state = T_BLOCKED; /* not runnable until task_start */
        t->tid = next_tid++;
        t->kstack = (uint64_t)(uintptr_t)kstacks[slot];
        t->mm = &kernel_mm;
        size_t n = strlen(name);
        if (n >= sizeof(t->name))
            n = sizeof(t->name) - 1;
        memcpy(t->name, name, n);
    }
    spin_unlock(&task_table_lock);
    if (t) {
        /* First switch to the task "returns" into task_trampoline with the
         * stack 16-byte aligned for its call. */
        uint64_t *sp = (uint64_t *)(uintptr_t)(t->kstack + KSTACK_SIZE - 24);
        *sp = (uint64_t)(uintptr_t)task_trampoline;
        for (int i = 0; i < 6; i++)
            *--sp = 0;
        t->rsp = (uint64_t)(uintptr_t)sp;
    }
    return t;
}

struct task *task_by_tid(int tid) {
    for (int i = 0; i < MAX_TASKS; i++)
        if (tasks[i].tid == tid && tasks[i].state != T_FREE)
            return &tasks[i];
    return NULL;
}

int pick_cpu(void) {
    int best = 0, best_load = 1 << 30;
    for (int i = 0; i < ncpus; i++) {
        struct cpu *c = &cpus[i];
        if (!c->online)
            continue;
        int load = c->rq_len + (c->current != c->idle);
        if (load < best_load) {
            best_load = load;
            best = i;
        }
    }
    return best;
}

static void kick(struct cpu *c) {
    if (c == this_cpu())
        c->need_resched = 1;
    else
        apic_send_ipi(c->apic_id, VEC_RESCHED);
}

void task_start(struct task *t, int cpu) {
    struct cpu *c = &cpus[cpu];
    spin_lock(&c->rq_lock);
    t->cpu = cpu;
    t->state = T_RUNNABLE;
    rq_push(c, t);
    spin_unlock(&c->rq_lock);
    kick(c);
}

struct task *kthread_create(const char *name, int (*fn)(void *), void *arg) {
    struct task *t = task_alloc(name);
    if (!t)
        return NULL;
    t->kfn = fn;
    t->karg = arg;
    task_start(t, pick_cpu());
    return t;
}

static void release_process(struct task *t) {
    struct process *p = t->proc;
    if (!p)
        return;
    spin_lock(&p->lock);
    int last = --p->refs == 0;
    spin_unlock(&p->lock);
    if (last) {
        for (int i = 0; i < MAX_FDS; i++)
            if (p->fds[i].pipe)
                pipe_close(p->fds[i].pipe, p->fds[i].writer);
        mm_destroy(p->mm);
        p->mm = NULL;
    }
}

/* Runs on the new task's stack right after every switch: the previous task
 * is now off this CPU, so its resources can go, and the rq lock taken by
 * schedule is released. */
static struct task *switched_from[MAX_CPUS];

static void finish_switch(void) {
    struct cpu *c = this_cpu();
    struct task *prev = switched_from[c->id];
    switched_from[c->id] = NULL;
    /* The rq lock goes first: releasing a process closes its pipes, which
     * wakes their waiters and so takes run-queue locks (this CPU's too)
     * after pipe locks, the order everyone else uses. Releasing under the
     * rq lock hung hackbench: a sender exited while a receiver on the same
     * CPU waited on its pipe, and the wakeup spun on the lock it held. */
    spin_unlock(&c->rq_lock);
    if (prev) {
        if (prev->state == T_DEAD)
            release_process(prev);
        __atomic_store_n(&prev->on_cpu, 0, __ATOMIC_RELEASE);
    }
}

void task_first_run(void);

void task_first_run(void) {
    finish_switch();
    struct task *t = this_cpu()->current;
    if (t->kfn)
        task_exit(t->kfn(t->karg));
    enter_user(t->user_rip, t->user_rsp, t->user_a0, t->user_a1);
}

/* Caller holds c->rq_lock; returns with it released. */
static void schedule_locked(struct cpu *c) {
    struct task *prev = c->current;
    c->need_resched = 0;
    if (prev->state == T_RUNNING) {
        prev->state = T_RUNNABLE;
        if (prev != c->idle)
            rq_push(c, prev);
    }
    struct task *next = rq_pop(c);
    if (!next)
        next = c->idle;
    next->state = T_RUNNING;
    c->slice_start_tsc = rdtsc();
    if (next == prev) {
        spin_unlock(&c->rq_lock);
        return;
    }
    next->on_cpu = 1;
    c->current = next;
    c->ctx_switches++;
    if (next->mm != c->loaded_mm) {
        switch_cr3(c, next->mm->pml4);
        c->loaded_mm = next->mm;
    }
    c->kernel_rsp = next->kstack + KSTACK_SIZE;
    c->tss.rsp0 = c->kernel_rsp;
    switched_from[c->id] = prev;
    context_switch(&prev->rsp, next->rsp);
    finish_switch();
}

void schedule(void) {
    struct cpu *c = this_cpu();
    spin_lock(&c->rq_lock);
    schedule_locked(c);
}

void yield(void) { schedule(); }

void sched_tick(void) {
    struct cpu *c = this_cpu();
    uint64_t now = rdtsc();
    spin_lock(&c->rq_lock);
    c->ticks++;
    while (c->sleepers && c->sleepers->wake_tsc <= now) {
        struct task *t = c->sleepers;
        c->sleepers = t->next;
        t->state = T_RUNNABLE;
        rq_push(c, t);
    }
    /* Time, not ticks: ticks lost while the host stalled this vCPU must not
     * lengthen the slice. */
    int slice_used = now - c->slice_start_tsc >= slice_cycles;
    if (c->rq_len > 0 && (c->current == c->idle || slice_used))
        c->need_resched = 1;
    spin_unlock(&c->rq_lock);
}

void sleep_until(uint64_t tsc) {
    struct cpu *c = this_cpu();
    struct task *t = c->current;
    spin_lock(&c->rq_lock);
    if (rdtsc() >= tsc) {
        spin_unlock(&c->rq_lock);
        return;
    }
    t->state = T_SLEEPING;
    t->wake_tsc = tsc;
    struct task **pp = &c->sleepers;
    while (*pp && (*pp)->wake_tsc <= tsc)
        pp = &(*pp)->next;
    t->next = *pp;
    *pp = t;
    schedule_locked(c);
}

struct cpu *sched_block_begin(void) {
    struct cpu *c = this_cpu();
    spin_lock(&c->rq_lock);
    c->current->state = T_BLOCKED;
    return c;
}

void sched_block_finish(struct cpu *c) { schedule_locked(c); }

void wait_event_block(struct waitq *q, spinlock_t *lock) {
    struct cpu *c = sched_block_begin();
    struct task *t = c->current;
    t->next = q->head;
    q->head = t;
    spin_unlock(lock);
    sched_block_finish(c);
    spin_lock(lock);
}

void task_wake_preempt(struct task *t) {
    struct cpu *c = &cpus[t->cpu];
    spin_lock(&c->rq_lock);
    int woken = t->state == T_BLOCKED;
    if (woken) {
        t->state = T_RUNNABLE;
        rq_push_front(c, t);
    }
    spin_unlock(&c->rq_lock);
    if (woken)
        kick(c);
}

/* Caller holds the lock that guards q. */
void waitq_wake_all(struct waitq *q) {
    struct task *t = q->head;
    q->head = NULL;
    while (t) {
        struct task *next = t->next;
        struct cpu *c = &cpus[t->cpu];
        spin_lock(&c->rq_lock);
        if (t->state == T_BLOCKED) {
            t->state = T_RUNNABLE;
            rq_push(c, t);
        }
        spin_unlock(&c->rq_lock);
        kick(c);
        t = next;
    }
}

static struct waitq exit_waiters[MAX_TASKS];

void task_exit(int code) {
    struct cpu *c = this_cpu();
    struct task *t = c->current;
    spin_lock(&exit_lock);
    t->exit_code = code;
    waitq_wake_all(&exit_waiters[t - tasks]);
    spin_lock(&c->rq_lock);
    t->state = T_DEAD;
    spin_unlock(&exit_lock);
    schedule_locked(c);
    panic("a dead task ran again");
}

int task_wait(int tid) {
    struct task *t = task_by_tid(tid);
    if (!t || t == this_cpu()->current)
        return -ESRCH;
    spin_lock(&exit_lock);
    if (t->tid != tid || t->reaped) {
        spin_unlock(&exit_lock);
        return -ESRCH;
    }
    while (t->state != T_DEAD)
        wait_event_block(&exit_waiters[t - tasks], &exit_lock);
    int code = t->exit_code;
    t->reaped = 1;
    spin_unlock(&exit_lock);
    return code;
}

void sched_init_cpu(struct cpu *c) {
    slice_cycles = tsc_hz * SLICE_NS / 1000000000ULL; /* no overflow below 2 THz */
    struct task *idle = task_alloc("idle");
    KASSERT(idle);
    idle->cpu = c->id;
    idle->state = T_RUNNING;
    idle->on_cpu = 1;
    c->idle = idle;
    c->current = idle;
    c->loaded_mm = &kernel_mm;
    c->kernel_rsp = idle->kstack + KSTACK_SIZE;
    c->tss.rsp0 = c->kernel_rsp;
}

void cpu_idle_loop(void) {
    struct cpu *c = this_cpu();
    for (;;) {
        __asm__ volatile("cli");
        if (c->need_resched || c->rq_len > 0)
            schedule();
        else
            __asm__ volatile("sti; hlt; cli"); /* STI's shadow covers HLT */
    }
}
