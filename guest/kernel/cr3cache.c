/* The paravirtual CR3 cache (seed 004): under shadow paging the hv shares a
 * table of {guest CR3, shadow root} pairs per CPU whose roots are also in the
 * CPU's CR3-target list. A context switch that finds its next CR3 there loads
 * the shadow root directly: no VM exit. A miss loads the guest CR3, which
 * exits, and the hv adds the pair. The kernel keeps the CR3 it loaded (what
 * it means, never the shadow root) so it never reads CR3 back.
 *
 * Off with the boot option `no-cr3-cache`, or when the hv does not offer it
 * (KVM_FEATURE_CR3_CACHE). */
#include "kernel.h"

/* 512-byte aligned: a table never crosses a page, as the hv requires. */
static struct cr3_slot {
    struct cr3_cache cache;
} __attribute__((aligned(512))) slots[MAX_CPUS];

static int cr3_cache_on;
static char disabled_reason[64] = "not offered by the hv";
static uint64_t hits[MAX_CPUS], misses[MAX_CPUS];

void cr3cache_init(int disabled_by_option) {
    if (disabled_by_option) {
        ksnprintf(disabled_reason, sizeof(disabled_reason), "no-cr3-cache boot option");
        return;
    }
    if (kvm_features & KVM_FEATURE_CR3_CACHE)
        cr3_cache_on = 1;
}

void cr3cache_cpu_init(struct cpu *c) {
    c->cr3 = kernel_mm.pml4;
    if (!cr3_cache_on)
        return;
    struct cr3_cache *cc = &slots[c->id].cache;
    memset(cc, 0, sizeof(*cc));
    long rc = hypercall4(HC_CR3_CACHE_REGISTER, (uintptr_t)cc, 0, 0, 0);
    if (rc <= 0) {
        kprintf("cr3-cache: cpu %d: HC_CR3_CACHE_REGISTER failed: %ld\n", c->id, rc);
        memset(cc, 0, sizeof(*cc));
    }
}

void switch_cr3(struct cpu *c, uint64_t cr3) {
    c->cr3 = cr3;
    if (!cr3_cache_on) {
        write_cr3(cr3);
        return;
    }
    struct cr3_cache *cc = &slots[c->id].cache;
    /* The kernel runs with interrupts off, but the hv may still drop the
     * entry between the lookup and the load (another CPU freed the root):
     * the load of the marked value then exits and the hv loads
     * `wanted_cr3`, stored first for that. */
    __atomic_store_n(&cc->wanted_cr3, cr3, __ATOMIC_RELAXED);
    uint32_t n = cc->max_idx < CR3_CACHE_MAX ? cc->max_idx : CR3_CACHE_MAX;
    uint64_t load = cr3;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t host = __atomic_load_n(&cc->entry[i].host_cr3, __ATOMIC_RELAXED);
        if (host && __atomic_load_n(&cc->entry[i].guest_cr3, __ATOMIC_RELAXED) == cr3) {
            load = host;
            break;
        }
    }
    if (load != cr3)
        hits[c->id]++;
    else
        misses[c->id]++;
    write_cr3(load);
}

void cr3cache_report(void) {
    if (!cr3_cache_on) {
        report("cr3_cache=off");
        return;
    }
    uint64_t h = 0, m = 0;
    for (int i = 0; i < ncpus; i++) {
        h += hits[i];
        m += misses[i];
    }
    report("cr3_cache=on cr3_cache_hits=%lu cr3_cache_misses=%lu", h, m);
}

void cr3cache_print_status(void) {
    if (cr3_cache_on)
        kprintf("cr3-cache: enabled, %u entries\n", slots[0].cache.max_idx);
    else
        kprintf("cr3-cache: disabled (%s)\n", disabled_reason);
}
