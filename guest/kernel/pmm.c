#include "pmm.h"
#include "../lib/klib.h"

void pmm_init(struct pmm *p) { memset(p, 0, sizeof(*p)); }

static void add_piece(struct pmm *p, uint64_t base, uint64_t end) {
    if (base >= end || p->nranges == PMM_MAX_RANGES)
        return; /* empty, or no room to account for it: leave it unused */
    p->ranges[p->nranges] = (struct pmm_range){base, end};
    p->bump[p->nranges] = base;
    p->nranges++;
    uint64_t pages = (end - base) / PAGE_SIZE;
    p->total_pages += pages;
    p->free_pages += pages;
}

void pmm_add_range(struct pmm *p, uint64_t base, uint64_t len, const struct pmm_range *holes, int nholes) {
    uint64_t start = (base + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1);
    uint64_t end = (base + len) & ~(PAGE_SIZE - 1);
    if (start == 0)
        start = PAGE_SIZE; /* physical 0 is the list terminator */
    /* The first hole that overlaps splits the range into the parts before
     * and after it, each checked against the remaining holes. */
    for (int i = 0; i < nholes; i++) {
        uint64_t hb = holes[i].base & ~(PAGE_SIZE - 1);
        uint64_t he = (holes[i].end + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1);
        if (hb < end && he > start) {
            if (hb > start)
                pmm_add_range(p, start, hb - start, holes + i + 1, nholes - i - 1);
            if (he < end)
                pmm_add_range(p, he, end - he, holes + i + 1, nholes - i - 1);
            return;
        }
    }
    spin_lock(&p->lock);
    add_piece(p, start, end);
    spin_unlock(&p->lock);
}

uint64_t pmm_alloc(struct pmm *p) {
    spin_lock(&p->lock);
    uint64_t pa = p->free_head;
    if (pa) {
        p->free_head = *(uint64_t *)(uintptr_t)pa;
        p->free_listed--;
        p->free_pages--;
    } else {
        while (p->next_range < p->nranges && p->bump[p->next_range] == p->ranges[p->next_range].end)
            p->next_range++;
        if (p->next_range < p->nranges) {
            pa = p->bump[p->next_range];
            p->bump[p->next_range] += PAGE_SIZE;
            p->free_pages--;
        }
    }
    spin_unlock(&p->lock);
    return pa;
}

uint64_t pmm_alloc_zeroed(struct pmm *p) {
    uint64_t pa = pmm_alloc(p);
    if (pa)
        memset((void *)(uintptr_t)pa, 0, PAGE_SIZE);
    return pa;
}

void pmm_free(struct pmm *p, uint64_t pa) {
    spin_lock(&p->lock);
    *(uint64_t *)(uintptr_t)pa = p->free_head;
    p->free_head = pa;
    p->free_listed++;
    p->free_pages++;
    spin_unlock(&p->lock);
}

int pmm_owns(const struct pmm *p, uint64_t pa) {
    if (pa & (PAGE_SIZE - 1))
        return 0;
    for (int i = 0; i < p->nranges; i++)
        if (pa >= p->ranges[i].base && pa < p->ranges[i].end)
            return 1;
    return 0;
}

/* Whether pa was handed out at least once (below its range's bump). */
static int ever_used(const struct pmm *p, uint64_t pa) {
    for (int i = 0; i < p->nranges; i++)
        if (pa >= p->ranges[i].base && pa < p->ranges[i].end)
            return pa < p->bump[i];
    return 0;
}

int pmm_check(struct pmm *p) {
    spin_lock(&p->lock);
    int rc = 0;
    uint64_t n = 0;
    for (uint64_t pa = p->free_head; pa; pa = *(uint64_t *)(uintptr_t)pa) {
        if (!pmm_owns(p, pa)) {
            rc = -1; /* a foreign or misaligned page on the free list */
            break;
        }
        if (!ever_used(p, pa)) {
            rc = -5; /* a never-used page freed: it would be handed out twice */
            break;
        }
        if (++n > p->free_listed) {
            rc = -2; /* more pages than counted: a cycle or a double free */
            break;
        }
    }
    if (rc == 0 && n != p->free_listed)
        rc = -3; /* fewer pages than counted: a lost page */
    if (rc == 0) {
        uint64_t unused = 0;
        for (int i = 0; i < p->nranges; i++)
            unused += (p->ranges[i].end - p->bump[i]) / PAGE_SIZE;
        if (unused + p->free_listed != p->free_pages || p->free_pages > p->total_pages)
            rc = -4;
    }
    spin_unlock(&p->lock);
    return rc;
}
