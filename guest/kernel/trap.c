/* Exceptions and interrupts. */
#include "kernel.h"

static const char *const exception_names[32] = {
    "divide error", "debug", "NMI", "breakpoint", "overflow", "bound range", "invalid opcode",
    "device not available", "double fault", "coprocessor overrun", "invalid TSS",
    "segment not present", "stack fault", "general protection", "page fault", "reserved",
    "x87 error", "alignment check", "machine check", "SIMD error", "virtualization",
    "control protection",
};

static void dump(struct trapframe *tf) {
    kprintf("  rax=%016lx rbx=%016lx rcx=%016lx rdx=%016lx\n", tf->rax, tf->rbx, tf->rcx, tf->rdx);
    kprintf("  rsi=%016lx rdi=%016lx rbp=%016lx rsp=%016lx\n", tf->rsi, tf->rdi, tf->rbp, tf->rsp);
    kprintf("  r8 =%016lx r9 =%016lx r10=%016lx r11=%016lx\n", tf->r8, tf->r9, tf->r10, tf->r11);
    kprintf("  r12=%016lx r13=%016lx r14=%016lx r15=%016lx\n", tf->r12, tf->r13, tf->r14, tf->r15);
    kprintf("  cs=%lx ss=%lx rflags=%lx\n", tf->cs, tf->ss, tf->rflags);
}

static void user_fault(struct trapframe *tf, uint64_t cr2) {
    struct task *t = this_cpu()->current;
    const char *name = tf->vector < 32 && exception_names[tf->vector] ? exception_names[tf->vector] : "?";
    kprintf("user fault: task %d (%s) on cpu %d: %s (vector %lu) error %lx rip %lx cr2 %lx\n", t->tid,
            t->name, this_cpu()->id, name, tf->vector, tf->error, tf->rip, cr2);
    dump(tf);
    thread_exit(128 + (int)tf->vector);
}

void trap(struct trapframe *tf) {
    struct cpu *c = this_cpu();
    int from_user = (tf->cs & 3) != 0;
    switch (tf->vector) {
    case VEC_TIMER:
        apic_eoi();
        pv_account_steal(c);
        sched_tick();
        break;
    case VEC_TLB_FLUSH:
        apic_eoi();
        tlb_serve_requests(c);
        break;
    case VEC_IPI_PING:
        if (!ipiping_ping())
            kprintf("stray ping IPI on cpu %d\n", c->id);
        break;
    case VEC_IPI_PONG:
        ipiping_pong();
        break;
    case VEC_RESCHED:
        apic_eoi();
        c->need_resched = 1;
        break;
    case VEC_SPURIOUS:
        break;
    case VEC_APF_READY:
        if (!apf_page_ready())
            goto unexpected;
        break;
    case VEC_APF_NOTPRESENT:
        if (!apf_event_not_present(tf))
            goto unexpected;
        break;
    case 14: {
        /* CR2 first: it is the token if this is an async PF notification. */
        uint64_t cr2 = read_cr2();
        if (apf_x86_page_fault(tf, cr2))
            break;
        struct task *t = c->current;
        /* Demand-zero: a user address inside one of the process's regions,
         * touched by the process or by the kernel on its behalf. */
        if (t->proc && cr2 >= USER_BASE && cr2 < USER_TOP && !(tf->error & 1)) {
            int rc = vm_handle_user_fault(t->mm, cr2);
            if (rc == 0) {
                c->page_faults++;
                break;
            }
            if (rc == -ENOMEM)
                oom_kill(t, cr2);
        }
        if (from_user)
            user_fault(tf, cr2);
        panic("kernel page fault at rip %lx cr2 %lx error %lx (task %d)", tf->rip, cr2, tf->error,
              t->tid);
    }
    default:
        if (tf->vector < 32) {
            if (from_user)
                user_fault(tf, 0);
            dump(tf);
            panic("%s (vector %lu) in kernel: error %lx rip %lx cr2 %lx cpu %d",
                  exception_names[tf->vector] ? exception_names[tf->vector] : "exception", tf->vector,
                  tf->error, tf->rip, read_cr2(), c->id);
        }
    unexpected:
        kprintf("unexpected interrupt %lu on cpu %d\n", tf->vector, c->id);
        apic_eoi();
        break;
    }
    /* The kernel is not preemptible: switch only when returning to ring 3
     * (the idle loop reschedules by itself). */
    if (from_user && c->need_resched)
        schedule();
}
