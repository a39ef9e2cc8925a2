/* Page tables: the kernel's identity map of RAM (PML4 slot 0, shared by
 * every address space) and per-process user halves with demand-zero
 * paging. */
#include "kernel.h"

struct mm kernel_mm;

#define MAX_MMS 256 /* one per process */
static struct mm mm_pool[MAX_MMS];
static spinlock_t mm_pool_lock;

static uint64_t *table(uint64_t pa) { return (uint64_t *)(uintptr_t)pa; }

static uint64_t alloc_table(void) {
    uint64_t pa = pmm_alloc_zeroed(&kpmm);
    if (!pa)
        panic("out of memory for page tables");
    return pa;
}

void vm_init(void) {
    uint64_t pml4 = alloc_table();
    uint64_t pdpt = alloc_table();
    uint64_t gib = (boot->mem_size + (1ULL << 30) - 1) >> 30;
    if (gib > 512)
        panic("vm: %lu GiB of RAM does not fit one PML4 slot", gib);
    for (uint64_t g = 0; g < gib; g++) {
        uint64_t pd = alloc_table();
        for (uint64_t i = 0; i < 512; i++) {
            uint64_t pa = (g << 30) | (i << 21);
            if (pa >= boot->mem_size)
                break;
            table(pd)[i] = pa | PTE_P | PTE_W | PTE_PS;
        }
        table(pdpt)[g] = pd | PTE_P | PTE_W;
    }
    table(pml4)[0] = pdpt | PTE_P | PTE_W;
    kernel_mm.pml4 = pml4;
    kernel_mm.refs = 1;
    write_cr3(pml4);
}

void vm_map_kernel_2m(uint64_t pa) {
    uint64_t pdpt = table(kernel_mm.pml4)[0] & PTE_ADDR;
    uint64_t *pdpte = &table(pdpt)[(pa >> 30) & 511];
    if (!(*pdpte & PTE_P))
        *pdpte = alloc_table() | PTE_P | PTE_W;
    table(*pdpte & PTE_ADDR)[(pa >> 21) & 511] = (pa & ~((2ULL << 20) - 1)) | PTE_P | PTE_W | PTE_PS;
    invlpg(pa);
}

struct mm *mm_create(void) {
    spin_lock(&mm_pool_lock);
    struct mm *mm = NULL;
    for (int i = 0; i < MAX_MMS; i++) {
        if (!mm_pool[i].refs) {
            mm = &mm_pool[i];
            break;
        }
    }
    if (mm) {
        memset(mm, 0, sizeof(*mm));
        mm->refs = 1;
    }
    spin_unlock(&mm_pool_lock);
    if (!mm)
        return NULL;
    mm->pml4 = pmm_alloc_zeroed(&kpmm);
    if (!mm->pml4) {
        mm->refs = 0;
        return NULL;
    }
    table(mm->pml4)[0] = table(kernel_mm.pml4)[0];
    mm->mmap_next = USER_MMAP_BASE;
    mm->stack_next = USER_STACK_TOP;
    return mm;
}

static void free_level(uint64_t pa, int level) {
    uint64_t *t = table(pa);
    for (int i = 0; i < 512; i++) {
        if (!(t[i] & PTE_P))
            continue;
        if (level > 1)
            free_level(t[i] & PTE_ADDR, level - 1);
        else
            pmm_free(&kpmm, t[i] & PTE_ADDR);
    }
    pmm_free(&kpmm, pa);
}

void mm_destroy(struct mm *mm) {
    uint64_t *pml4 = table(mm->pml4);
    for (int i = 1; i < 256; i++)
        if (pml4[i] & PTE_P)
            free_level(pml4[i] & PTE_ADDR, 3);
    pmm_free(&kpmm, mm->pml4);
    spin_lock(&mm_pool_lock);
    mm->refs = 0;
    spin_unlock(&mm_pool_lock);
}

int mm_add_vma(struct mm *mm, uint64_t start, uint64_t end) {
    if (start < USER_BASE || end > USER_TOP || start >= end || (start | end) & (PAGE_SIZE - 1))
        return -EINVAL;
    spin_lock(&mm->lock);
    int rc = -ENOMEM;
    if (mm->nvmas < (int)(sizeof(mm->vmas) / sizeof(mm->vmas[0]))) {
        mm->vmas[mm->nvmas++] = (struct vma){start, end};
        rc = 0;
    }
    spin_unlock(&mm->lock);
    return rc;
}

/* Index of the VMA holding va, or -1. Caller holds mm->lock. */
int mm_find_vma(struct mm *mm, uint64_t va) {
    for (int i = 0; i < mm->nvmas; i++)
        if (va >= mm->vmas[i].start && va < mm->vmas[i].end)
            return i;
    return -1;
}

/* Caller holds mm->lock. Returns 0, or -ENOMEM. */
int vm_map_page(struct mm *mm, uint64_t va, uint64_t pa, uint64_t flags) {
    uint64_t t = mm->pml4;
    for (int shift = 39; shift > 12; shift -= 9) {
        uint64_t *e = &table(t)[(va >> shift) & 511];
        if (!(*e & PTE_P)) {
            uint64_t n = pmm_alloc_zeroed(&kpmm);
            if (!n)
                return -ENOMEM;
            *e = n | PTE_P | PTE_W | PTE_U;
        }
        t = *e & PTE_ADDR;
    }
    table(t)[(va >> 12) & 511] = pa | flags;
    return 0;
}

uint64_t vm_translate(uint64_t pml4, uint64_t va, uint64_t *flags) {
    uint64_t t = pml4;
    for (int shift = 39; shift >= 12; shift -= 9) {
        uint64_t e = table(t)[(va >> shift) & 511];
        if (!(e & PTE_P))
            return 0;
        if (shift == 12 || (e & PTE_PS)) {
            if (flags)
                *flags = e & ~PTE_ADDR;
            uint64_t page = 1ULL << shift;
            return (e & PTE_ADDR & ~(page - 1)) | (va & (page - 1));
        }
        t = e & PTE_ADDR;
    }
    return 0;
}

/* The 4 KiB PTE mapping user address va, or NULL if no table holds one
 * (user mappings are 4 KiB pages). Caller holds mm->lock. */
static uint64_t *user_pte(struct mm *mm, uint64_t va) {
    uint64_t t = mm->pml4;
    for (int shift = 39; shift > 12; shift -= 9) {
        uint64_t e = table(t)[(va >> shift) & 511];
        if (!(e & PTE_P) || (e & PTE_PS))
            return NULL;
        t = e & PTE_ADDR;
    }
    return &table(t)[(va >> 12) & 511];
}

int64_t vm_zap_range(struct mm *mm, uint64_t start, uint64_t end) {
    if ((start | end) & (PAGE_SIZE - 1) || start >= end || start < USER_BASE || end > USER_TOP ||
        (end - start) / PAGE_SIZE > ZAP_MAX_PAGES)
        return -EINVAL;
    uint64_t dropped[ZAP_MAX_PAGES];
    int n = 0;
    spin_lock(&mm->lock);
    for (uint64_t va = start; va < end; va += PAGE_SIZE) {
        uint64_t *pte = user_pte(mm, va);
        if (pte && (*pte & PTE_P)) {
            dropped[n++] = *pte & PTE_ADDR;
            __atomic_store_n(pte, 0, __ATOMIC_RELEASE);
            mm->resident_pages--;
        }
    }
    /* Not held across the shootdown: a CPU spinning for the lock with
     * interrupts off could not take the flush IPI. */
    spin_unlock(&mm->lock);
    if (n == 0)
        return 0;
    tlb_shootdown(mm, start, end);
    /* Only now can no CPU reach the pages through a stale translation. */
    for (int i = 0; i < n; i++)
        pmm_free(&kpmm, dropped[i]);
    return n;
}

int vm_handle_user_fault(struct mm *mm, uint64_t va) {
    if (va < USER_BASE || va >= USER_TOP)
        return -EFAULT;
    va &= ~(PAGE_SIZE - 1);
    spin_lock(&mm->lock);
    int rc = 0;
    if (mm_find_vma(mm, va) < 0) {
        rc = -EFAULT;
    } else if (!vm_translate(mm->pml4, va, NULL)) {
        /* Another thread of the process may have mapped it meanwhile:
         * the check above is under the lock, so each page is zeroed once. */
        uint64_t pa = pmm_alloc_zeroed(&kpmm);
        if (!pa) {
            rc = -ENOMEM;
        } else {
            rc = vm_map_page(mm, va, pa, PTE_P | PTE_W | PTE_U);
            if (rc)
                pmm_free(&kpmm, pa);
            else
                mm->resident_pages++;
        }
    }
    spin_unlock(&mm->lock);
    return rc;
}

int user_range_ok(struct mm *mm, uint64_t va, uint64_t len) {
    if (va < USER_BASE || va >= USER_TOP || len > USER_TOP - va)
        return 0;
    uint64_t end = va + len;
    spin_lock(&mm->lock);
    int ok = 1;
    while (va < end) {
        int i = mm_find_vma(mm, va);
        if (i < 0) {
            ok = 0;
            break;
        }
        va = mm->vmas[i].end;
    }
    spin_unlock(&mm->lock);
    return ok;
}

void vm_self_check(void) {
    /* The kernel image and the boot information must translate to
     * themselves, writable and supervisor-only, through our own tables. */
    uint64_t probes[] = {
        (uint64_t)(uintptr_t)kernel_image_start,
        (uint64_t)(uintptr_t)kernel_image_end - 1,
        (uint64_t)(uintptr_t)boot,
        (uint64_t)(uintptr_t)&kernel_mm,
        boot->mem_size - 1,
    };
    for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
        uint64_t flags = 0;
        uint64_t pa = vm_translate(read_cr3() & PTE_ADDR, probes[i], &flags);
        if (pa != probes[i] || !(flags & PTE_W) || (flags & PTE_U))
            panic("vm self-check: %lx -> %lx flags %lx", probes[i], pa, flags);
    }
    /* A fresh address space shares slot 0 and has an empty user half. */
    struct mm *mm = mm_create();
    KASSERT(mm);
    KASSERT(table(mm->pml4)[0] == table(kernel_mm.pml4)[0]);
    KASSERT(vm_translate(mm->pml4, USER_BASE, NULL) == 0);
    KASSERT(mm_add_vma(mm, USER_BASE, USER_BASE + 2 * PAGE_SIZE) == 0);
    KASSERT(vm_handle_user_fault(mm, USER_BASE + 5) == 0);
    uint64_t flags = 0;
    uint64_t pa = vm_translate(mm->pml4, USER_BASE + 5, &flags);
    KASSERT(pa && (pa & 0xfff) == 5 && (flags & PTE_U) && (flags & PTE_W));
    KASSERT(*(uint8_t *)(uintptr_t)pa == 0);
    KASSERT(vm_handle_user_fault(mm, USER_BASE + 2 * PAGE_SIZE) == -EFAULT);
    uint64_t before = kpmm.free_pages;
    mm_destroy(mm);
    KASSERT(kpmm.free_pages > before);
    kprintf("vm: self-check passed\n");
}
