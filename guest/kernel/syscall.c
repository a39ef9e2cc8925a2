/* System calls and user processes. */
#include "kernel.h"

#define MAX_PROCS 256 /* hackbench 6: 241 processes */
static struct process procs[MAX_PROCS];
static spinlock_t procs_lock;
static int init_tid;

/* The user image (build/user.bin) starts with this header (user/crt0.S). */
#define USER_IMAGE_MAGIC 0x31474d4955544c46ULL /* "FLTUIMG1" */
struct user_header {
    uint64_t magic;
    uint64_t entry;        /* _start: (argc, argv) */
    uint64_t thread_entry; /* thread start: (fn, arg) */
    uint64_t end;          /* end of .bss, page aligned */
};
extern const uint8_t user_image[], user_image_end[];

static struct process *proc_alloc(void) {
    spin_lock(&procs_lock);
    struct process *p = NULL;
    for (int i = 0; i < MAX_PROCS; i++) {
        if (procs[i].refs == 0 && procs[i].mm == NULL) {
            p = &procs[i];
            memset(p, 0, sizeof(*p));
            p->refs = 1;
            break;
        }
    }
    spin_unlock(&procs_lock);
    return p;
}

static struct task *user_thread(struct process *p, const char *name, uint64_t rip, uint64_t a0, uint64_t a1) {
    /* Each thread's stack is a demand-zero region below the previous one,
     * with an unmapped guard page between them. */
    spin_lock(&p->mm->lock);
    uint64_t top = p->mm->stack_next;
    p->mm->stack_next -= USER_STACK_SIZE + PAGE_SIZE;
    spin_unlock(&p->mm->lock);
    if (mm_add_vma(p->mm, top - USER_STACK_SIZE, top) != 0)
        return NULL;
    struct task *t = task_alloc(name);
    if (!t)
        return NULL;
    t->proc = p;
    t->mm = p->mm;
    t->user_rip = rip;
    t->user_rsp = top;
    t->user_a0 = a0;
    t->user_a1 = a1;
    return t;
}

/* Copies bytes into a process that is not running, through the identity
 * map, faulting pages in as needed. */
static int copy_to_process(struct mm *mm, uint64_t va, const void *src, uint64_t n) {
    const uint8_t *s = src;
    while (n) {
        if (vm_handle_user_fault(mm, va) != 0)
            return -EFAULT;
        uint64_t pa = vm_translate(mm->pml4, va, NULL);
        uint64_t chunk = PAGE_SIZE - (va & (PAGE_SIZE - 1));
        if (chunk > n)
            chunk = n;
        memcpy((void *)(uintptr_t)pa, s, chunk);
        va += chunk;
        s += chunk;
        n -= chunk;
    }
    return 0;
}

/* Creates a process running the user image with the given command line
 * (program name first). It inherits the parent's open pipes. Returns the
 * new main thread (not yet started) or NULL. */
static struct task *proc_create(const char *cmdline, struct process *parent) {
    const struct user_header *h = (const struct user_header *)user_image;
    uint64_t size = (uint64_t)(user_image_end - user_image);
    if (size < sizeof(*h) || h->magic != USER_IMAGE_MAGIC || h->end < USER_BASE + size)
        panic("bad user image (size %lu)", size);

    char line[CMDLINE_LEN];
    size_t len = strlen(cmdline);
    if (len >= sizeof(line))
        len = sizeof(line) - 1;
    memcpy(line, cmdline, len);
    line[len] = '\0';
    char *words[32];
    int argc = split_words(line, words, 32);
    if (argc == 0)
        return NULL;

    struct process *p = proc_alloc();
    if (!p)
        return NULL;
    p->mm = mm_create();
    if (!p->mm) {
        p->refs = 0;
        return NULL;
    }
    struct task *t = NULL;
    if (mm_add_vma(p->mm, USER_BASE, h->end) != 0 ||
        copy_to_process(p->mm, USER_BASE, user_image, size) != 0 ||
        !(t = user_thread(p, words[0], h->entry, 0, 0))) {
        mm_destroy(p->mm);
        p->mm = NULL;
        p->refs = 0;
        return NULL;
    }

    /* argv block below the top of the first stack: argc, argv[], then the
     * strings. */
    uint64_t block[1 + 33];
    uint64_t strings = t->user_rsp - 1024;
    uint64_t blk = strings - sizeof(block);
    uint64_t at = strings;
    block[0] = (uint64_t)argc;
    for (int i = 0; i < argc; i++) {
        size_t n = strlen(words[i]) + 1;
        copy_to_process(p->mm, at, words[i], n); /* fits: line < CMDLINE_LEN < 1024 */
        block[1 + i] = at;
        at += n;
    }
    block[1 + argc] = 0;
    copy_to_process(p->mm, blk, block, sizeof(block));
    t->user_a0 = blk;
    t->user_rsp = blk - 64;

    if (parent) {
        spin_lock(&parent->lock);
        for (int i = 0; i < MAX_FDS; i++) {
            if (parent->fds[i].pipe) {
                p->fds[i] = parent->fds[i];
                pipe_ref(p->fds[i].pipe, p->fds[i].writer);
            }
        }
        spin_unlock(&parent->lock);
    }
    return t;
}

static void program_done(const char *name, int code) __attribute__((noreturn));

int start_init_process(const char *cmdline) {
    while (*cmdline == ' ')
        cmdline++;
    if (!*cmdline) {
        kprintf("no program named on the command line ([boot options] -- PROGRAM ARGS...)\n");
        program_done("", EXIT_NO_PROGRAM);
    }
    struct task *t = proc_create(cmdline, NULL);
    if (!t)
        panic("cannot start '%s'", cmdline);
    init_tid = t->tid;
    task_start(t, 0);
    return t->tid;
}

/* The CPU for a new task: the one asked for, or the least loaded. */
static int64_t target_cpu(int64_t cpu) {
    if (cpu < 0)
        return pick_cpu();
    if (cpu >= ncpus || !cpus[cpu].online)
        return -EINVAL;
    return cpu;
}

static int64_t sys_spawn_proc(uint64_t ucmd, uint64_t len, int64_t cpu) {
    cpu = target_cpu(cpu);
    if (cpu < 0)
        return cpu;
    struct process *p = this_cpu()->current->proc;
    if (len == 0 || len >= CMDLINE_LEN)
        return -EINVAL;
    if (!user_range_ok(p->mm, ucmd, len))
        return -EFAULT;
    char cmd[CMDLINE_LEN];
    memcpy(cmd, (const void *)(uintptr_t)ucmd, len);
    cmd[len] = '\0';
    struct task *t = proc_create(cmd, p);
    if (!t)
        return -ENOMEM;
    task_start(t, (int)cpu);
    return t->tid;
}

static struct process *cur_proc(void) { return this_cpu()->current->proc; }

static int64_t sys_write(int fd, uint64_t buf, uint64_t len) {
    struct process *p = cur_proc();
    if (!user_range_ok(p->mm, buf, len))
        return len ? -EFAULT : 0;
    if (fd == 1 || fd == 2) {
        console_write((const char *)(uintptr_t)buf, len);
        return (int64_t)len;
    }
    if (fd < 0 || fd >= MAX_FDS || !p->fds[fd].pipe || !p->fds[fd].writer)
        return -EBADF;
    return pipe_write(p->fds[fd].pipe, (const uint8_t *)(uintptr_t)buf, len);
}

static int64_t sys_read(int fd, uint64_t buf, uint64_t len) {
    struct process *p = cur_proc();
    if (!user_range_ok(p->mm, buf, len))
        return len ? -EFAULT : 0;
    if (fd < 0 || fd >= MAX_FDS || !p->fds[fd].pipe || p->fds[fd].writer)
        return -EBADF;
    return pipe_read(p->fds[fd].pipe, (uint8_t *)(uintptr_t)buf, len);
}

static int64_t sys_pipe(uint64_t ufds) {
    struct process *p = cur_proc();
    if (!user_range_ok(p->mm, ufds, 2 * sizeof(int)))
        return -EFAULT;
    spin_lock(&p->lock);
    int r = -1, w = -1;
    for (int i = 3; i < MAX_FDS; i++) {
        if (p->fds[i].pipe)
            continue;
        if (r < 0)
            r = i;
        else if (w < 0)
            w = i;
    }
    if (w < 0) {
        spin_unlock(&p->lock);
        return -EMFILE;
    }
    struct pipe *pp = pipe_create();
    if (!pp) {
        spin_unlock(&p->lock);
        return -ENOMEM;
    }
    p->fds[r] = (struct file){pp, 0};
    p->fds[w] = (struct file){pp, 1};
    spin_unlock(&p->lock);
    int *out = (int *)(uintptr_t)ufds;
    out[0] = r;
    out[1] = w;
    return 0;
}

static int64_t sys_close(int fd) {
    struct process *p = cur_proc();
    if (fd < 0 || fd >= MAX_FDS)
        return -EBADF;
    spin_lock(&p->lock);
    struct file f = p->fds[fd];
    p->fds[fd].pipe = NULL;
    spin_unlock(&p->lock);
    if (!f.pipe)
        return -EBADF;
    pipe_close(f.pipe, f.writer);
    return 0;
}

static int64_t sys_mmap(uint64_t len) {
    struct mm *mm = cur_proc()->mm;
    if (len == 0 || len > (1ULL << 40))
        return -EINVAL;
    /* Overcommit, but not beyond reason (Linux's heuristic mode): a
     * mapping larger than all of RAM could never be backed. */
    if (len / PAGE_SIZE > kpmm.total_pages)
        return -ENOMEM;
    len = (len + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1);
    spin_lock(&mm->lock);
    uint64_t va = mm->mmap_next;
    mm->mmap_next += len + PAGE_SIZE; /* guard page between mappings */
    spin_unlock(&mm->lock);
    int rc = mm_add_vma(mm, va, va + len);
    return rc ? rc : (int64_t)va;
}

static int64_t sys_spawn(uint64_t fn, uint64_t arg, int64_t cpu) {
    struct process *p = cur_proc();
    if (fn < USER_BASE || fn >= USER_TOP)
        return -EFAULT;
    cpu = target_cpu(cpu);
    if (cpu < 0)
        return cpu;
    const struct user_header *h = (const struct user_header *)user_image;
    spin_lock(&p->lock);
    p->refs++;
    spin_unlock(&p->lock);
    struct task *t = user_thread(p, this_cpu()->current->name, h->thread_entry, fn, arg);
    if (!t) {
        spin_lock(&p->lock);
        p->refs--;
        spin_unlock(&p->lock);
        return -ENOMEM;
    }
    task_start(t, (int)cpu);
    return t->tid;
}

static int64_t sys_report(uint64_t buf, uint64_t len) {
    struct process *p = cur_proc();
    if (len > REPORT_MAX - 1)
        return -E2BIG_ERR;
    if (!user_range_ok(p->mm, buf, len))
        return -EFAULT;
    char line[REPORT_MAX];
    memcpy(line, (const void *)(uintptr_t)buf, len);
    line[len] = '\0';
    report("%s", line);
    return 0;
}

static void program_done(const char *name, int code) {
    /* The program is done: its exit status is the VM's. */
    report("program=%s exit=%d time_ns=%lu free_pages=%lu", name, code, now_ns(), kpmm.free_pages);
    for (int i = 0; i < ncpus; i++)
        report("cpu=%d ticks=%lu ctx_switches=%lu page_faults=%lu syscalls=%lu", i, cpus[i].ticks,
               cpus[i].ctx_switches, cpus[i].page_faults, cpus[i].syscalls);
    apf_report();
    cr3cache_report();
    pv_report();
    shutdown(code);
}

void thread_exit(int code) {
    struct task *t = this_cpu()->current;
    if (t->tid == init_tid)
        program_done(t->name, code);
    task_exit(code);
}

/* The whole program goes, not just the thread: its other threads may be
 * waiting for this one, and the program is the VM's reason to run. */
void oom_kill(struct task *t, uint64_t va) {
    static int killing;
    if (__atomic_exchange_n(&killing, 1, __ATOMIC_ACQ_REL))
        for (;;) /* another CPU is already ending the program */
            __asm__ volatile("cli; hlt");
    kprintf("out of memory: killed program '%s' (task %d touched %lx; %lu of %lu pages free)\n", t->name,
            t->tid, va, kpmm.free_pages, kpmm.total_pages);
    report("oom_killed=%s oom_task=%d", t->name, t->tid);
    program_done(t->name, EXIT_OOM_KILLED);
}

static int64_t do_syscall(uint64_t nr, uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3) {
    (void)a3;
    switch (nr) {
    case SYS_WRITE:
        return sys_write((int)a0, a1, a2);
    case SYS_READ:
        return sys_read((int)a0, a1, a2);
    case SYS_EXIT:
        thread_exit((int)a0);
    case SYS_YIELD:
        yield();
        return 0;
    case SYS_SLEEP:
        sleep_until(rdtsc() + a0 / 1000 * (tsc_hz / 1000000) + 1);
        return 0;
    case SYS_GETCPU:
        return this_cpu()->id;
    case SYS_TIME:
        return (int64_t)(a0 == SYS_TIME_RAW ? tsc_to_ns(rdtsc()) : now_ns());
    case SYS_IPIPING:
        return ipiping_round((int)a0);
    case SYS_MMAP:
        return sys_mmap(a0);
    case SYS_SPAWN:
        return sys_spawn(a0, a1, (int64_t)a2);
    case SYS_WAIT:
        return task_wait((int)a0);
    case SYS_PIPE:
        return sys_pipe(a0);
    case SYS_CLOSE:
        return sys_close((int)a0);
    case SYS_REPORT:
        return sys_report(a0, a1);
    case SYS_NCPUS:
        return ncpus;
    case SYS_GETTID:
        return this_cpu()->current->tid;
    case SYS_SPAWN_PROC:
        return sys_spawn_proc(a0, a1, (int64_t)a2);
    case SYS_SEED:
        return (int64_t)boot_seed;
    case SYS_ZAP:
        if (a1 > USER_TOP || a0 > USER_TOP - a1)
            return -EINVAL;
        return vm_zap_range(cur_proc()->mm, a0, a0 + a1);
    case SYS_SHUTDOWN:
        shutdown((int)a0);
    default:
        return -ENOSYS;
    }
}

int64_t syscall_dispatch(uint64_t nr, uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3) {
    this_cpu()->syscalls++;
    int64_t ret = do_syscall(nr, a0, a1, a2, a3);
    /* Like an interrupt, a system call returns to user mode through the
     * scheduler when a wakeup or the timer asked for it. */
    if (this_cpu()->need_resched)
        schedule();
    return ret;
}
