/* Physical page allocator. Pages never handed out are taken in address
 * order from the usable ranges (a bump pointer per range), so the kernel
 * touches guest memory only when it really uses it: under a hypervisor
 * with demand paging, untouched guest RAM costs no host memory. Freed
 * pages go on a free list threaded through the pages themselves (RAM is
 * identity-mapped, so a physical address is also a kernel pointer) and are
 * reused first. Pure enough to be unit-tested on the host (-DHOSTED),
 * where "physical" memory is an aligned host buffer. */
#ifndef PMM_H
#define PMM_H

#include <stdint.h>
#include "spinlock.h"

#define PAGE_SIZE 4096ULL
#define PMM_MAX_RANGES 64

struct pmm_range {
    uint64_t base, end;
};

struct pmm {
    spinlock_t lock;
    uint64_t free_head; /* physical address of the first freed page, 0 = none */
    uint64_t free_listed; /* pages on the free list */
    uint64_t free_pages;  /* free list + never used */
    uint64_t total_pages;
    int nranges;
    int next_range;                          /* first range with unused pages */
    struct pmm_range ranges[PMM_MAX_RANGES]; /* sorted by base */
    uint64_t bump[PMM_MAX_RANGES];           /* next never-used page of each range */
};

void pmm_init(struct pmm *p);
/* Adds [base, base+len) rounded inward to pages, minus any overlap with
 * the `nholes` ranges in `holes`. Ranges must be added in address order. */
void pmm_add_range(struct pmm *p, uint64_t base, uint64_t len, const struct pmm_range *holes, int nholes);
uint64_t pmm_alloc(struct pmm *p);        /* 0 when out of memory */
uint64_t pmm_alloc_zeroed(struct pmm *p); /* 0 when out of memory */
void pmm_free(struct pmm *p, uint64_t pa);
int pmm_owns(const struct pmm *p, uint64_t pa);
/* Walks the free list: every page aligned, owned, never-used pages not
 * listed, no cycle, the counts consistent. Returns 0 when consistent, else
 * a negative code naming the failed check. */
int pmm_check(struct pmm *p);

#endif
