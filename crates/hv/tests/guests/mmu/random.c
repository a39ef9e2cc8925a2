/* Random mutation: an OS's life with its page tables, from a fixed seed.
 *
 * Four address spaces (CR3s) map, unmap, remap, protect and age pages of
 * a private region (two page tables each, drawn from a shared pool, so
 * address spaces share page tables when a PDE is repointed), a 2 MiB
 * large-page slot, and a global region (G pages, CR4.PGE on) shared by
 * all of them; accesses at CPL 0 (RFLAGS.AC clear or set) and 3 (load,
 * store, fetch) land between the changes; CR0.WP, EFER.NXE, CR4.PGE,
 * CR4.SMEP and CR4.SMAP toggle now and then. Some
 * mappings point at the page tables themselves (read-only), so the guest
 * reads its own tables through them. Every access outcome (vector, error
 * code, CR2, the value loaded) and, at the end, every table entry (A/D
 * bits included) and a checksum of every data frame go into the digest.
 *
 * The flush discipline, and the flushes deliberately left out: the
 * outcome of every access must be architecturally defined, so that a
 * correct run is the same on the bare machine, under EPT and under
 * shadow paging whatever each caches:
 *
 * - A change that can leave a stale translation behind (unmap, remap to
 *   another frame, R/W 1->0, XD 0->1, clearing A or D, repointing or
 *   clearing a PDE, changing the large-page slot) marks the pages it
 *   affects "pending" in the current address space. A pending page is
 *   never accessed before a flush that covers it: INVLPG of it (a 2 MiB
 *   page: of any address in it), or a CR3 load (not for global pages), or
 *   toggling CR4.PGE. Flushes are often deferred and batched, as Linux's
 *   mmu_gather does, so changes pile up in tables the shadow MMU may have
 *   left unsync.
 * - Changes that only add permission (P 0->1, R/W 0->1, XD 1->0, U/S
 *   0->1 while SMEP and SMAP are off) are NOT followed by a flush. The SDM
 *   allows a stale entry to give a "spurious" #PF then (4.10.4.3); the
 *   machine never does (a TLB entry that does not allow an access is
 *   dropped and the walk redone before faulting) and a shadow MMU must
 *   not either (its #PF intercept walks the guest tables, sees the
 *   permission and fixes the spte without injecting). So the access
 *   succeeds in every environment: these are the omitted flushes.
 * - Changing ignored bits (9-11, 52-58) needs no flush: stale or fresh,
 *   the translation is the same.
 * - Switching address spaces loads CR3, which flushes every non-global
 *   translation, so only the current address space's pending pages need
 *   tracking; global pages stay pending across switches.
 * - EFER.NXE, CR4.SMEP and CR4.SMAP changes are followed by a full flush
 *   (a translation cached under the other NXE would disagree with a fresh
 *   walk; for SMEP and SMAP it keeps the test independent of whether the
 *   CR4 write flushes); CR0.WP changes need none (the permission check
 *   uses the current CR0.WP).
 */
#include "mmu_rt.h"

#define NAS 4
#define PRIV_PAGES 64 /* two page tables of 32 pages each */
#define GLOBAL_PAGES 32
#define POOL_PTS 12
#define DATA_FRAMES 64
#define OPS 12000

#define PRIV_BASE 0x0000008000000000ull   /* PML4 slot 1 */
#define LARGE_BASE (PRIV_BASE + (2ull << 21)) /* PD slot 2 of the region */
#define GLOBAL_BASE 0x0000018000000000ull /* PML4 slot 3 */
#define DATA_PHYS 0x1000000ull            /* 16 MiB: the data frames */
#define LARGE_PHYS 0x2000000ull           /* 32 MiB: two 2 MiB frames */
#define FETCH_OFF 8                       /* each data page holds int $0x80 here */
#ifndef SEED /* -DSEED=... builds another run */
#define SEED 0x5eed0010c0ffee01ull
#endif

static uint64_t pml4s[NAS][512] __attribute__((aligned(4096)));
static uint64_t pdpts[NAS][512] __attribute__((aligned(4096)));
static uint64_t pds[NAS][512] __attribute__((aligned(4096)));
static uint64_t pool[POOL_PTS][512] __attribute__((aligned(4096)));
static uint64_t global_pdpt[512] __attribute__((aligned(4096)));
static uint64_t global_pd[512] __attribute__((aligned(4096)));
static uint64_t global_pt[512] __attribute__((aligned(4096)));

static uint64_t rng = SEED;
static uint64_t next(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dull;
}
static uint64_t below(uint64_t n) { return next() % n; }
static int chance(int percent) { return (int)below(100) < percent; }

static int cur;                        /* current address space */
static uint8_t pending[PRIV_PAGES];    /* current address space only */
static uint8_t pending_large;
static uint8_t pending_global[GLOBAL_PAGES];
static uint64_t cr0_base, cr4_base, efer_base;
static int wp = 1, nxe = 1, smep, smap;
static uint64_t stats_access, stats_fault, stats_flush, stats_unflushed, stats_invlpg, stats_cr3;
/* Pages whose last change only added permission (no flush). */
static uint8_t upgraded[PRIV_PAGES], upgraded_global[GLOBAL_PAGES];

static uint64_t data_frame(uint64_t i) { return DATA_PHYS + i * 4096; }
static uint64_t priv_va(int page) { return PRIV_BASE + ((uint64_t)(page / 32) << 21) + ((uint64_t)(page % 32) << 12); }
static uint64_t global_va(int page) { return GLOBAL_BASE + ((uint64_t)page << 12); }

/* The PTE of a private page in the current address space, or 0 if its PDE
 * is not present. */
static uint64_t *priv_pte(int page) {
    uint64_t pde = pds[cur][page / 32];
    if (!(pde & PTE_P)) return 0;
    return (uint64_t *)(pde & PTE_ADDR) + page % 32;
}

/* The SKIP_FLUSHES variant leaves out the flushes the discipline requires
 * before an access (bookkeeping and random stream unchanged), to show
 * that the test sees stale translations when an OS gets it wrong. */
static int suppress_hw_flush;

static void load_cr3(int as) {
    cur = as;
    if (!suppress_hw_flush) switch_cr3((uint64_t)pml4s[as]);
    for (int i = 0; i < PRIV_PAGES; i++) pending[i] = upgraded[i] = 0;
    pending_large = 0;
    stats_cr3++;
}

static void flush_page(uint64_t va) {
    if (!suppress_hw_flush) invlpg(va);
    stats_invlpg++;
    if (va >= GLOBAL_BASE) {
        pending_global[(va - GLOBAL_BASE) >> 12] = 0;
        upgraded_global[(va - GLOBAL_BASE) >> 12] = 0;
    } else if (va >= LARGE_BASE) {
        pending_large = 0;
    } else {
        int page = (int)(((va - PRIV_BASE) >> 21) * 32 + ((va >> 12) & 31));
        pending[page] = upgraded[page] = 0;
    }
}

static uint64_t cur_cr4(void) { return cr4_base | (smep ? CR4_SMEP : 0) | (smap ? CR4_SMAP : 0); }

static void toggle_pge(void) {
    if (!suppress_hw_flush) {
        write_cr4(cur_cr4() & ~CR4_PGE);
        write_cr4(cur_cr4());
    }
    for (int i = 0; i < GLOBAL_PAGES; i++) pending_global[i] = upgraded_global[i] = 0;
    for (int i = 0; i < PRIV_PAGES; i++) pending[i] = upgraded[i] = 0;
    pending_large = 0;
}

/* Whether replacing `old` by `new` in a leaf only adds permission (no
 * flush needed). U/S 0->1 only adds with SMEP and SMAP off; with either
 * on it takes supervisor access away. */
static int only_adds(uint64_t old, uint64_t new) {
    if (!(old & PTE_P)) return 1;
    if (!(new & PTE_P)) return 0;
    if ((old ^ new) & (PTE_ADDR | PTE_PS | PTE_G)) return 0;
    if ((old & PTE_W) && !(new & PTE_W)) return 0;
    if ((old & PTE_U) && !(new & PTE_U)) return 0;
    if (((old ^ new) & PTE_U) && (smep || smap)) return 0;
    if (!(old & PTE_NX) && (new & PTE_NX)) return 0;
    if ((old & ~new) & (PTE_A | PTE_D)) return 0;
    return 1;
}

/* A leaf to a random frame: mostly data frames, sometimes (read-only) a
 * pool page table. */
static uint64_t random_leaf(int global) {
    uint64_t e = PTE_P;
    int table = chance(4);
    e |= table ? (uint64_t)pool[below(POOL_PTS)] : data_frame(below(DATA_FRAMES));
    if (!table && chance(70)) e |= PTE_W;
    if (chance(60)) e |= PTE_U;
    if (nxe && chance(25)) e |= PTE_NX;
    if (chance(20)) e |= PTE_A;
    if (global) e |= PTE_G;
    return e;
}

static int is_table_frame(uint64_t e) {
    uint64_t a = e & PTE_ADDR;
    return a >= (uint64_t)pool && a < (uint64_t)pool + sizeof pool;
}

/* Writes a leaf and keeps the pending marks true. */
static void set_priv(int page, uint64_t new) {
    uint64_t *pte = priv_pte(page);
    if (!pte) return;
    uint64_t old = *pte;
    *pte = new;
    /* The table may be shared: the same slot in every address space whose
     * PDE points at it changes, but only the current one can be stale. */
    if (only_adds(old, new)) {
        if (!pending[page]) upgraded[page] = 1;
    } else {
        pending[page] = 1;
        if (chance(40)) flush_page(priv_va(page));
    }
}

static void set_global(int page, uint64_t new) {
    uint64_t old = global_pt[page];
    global_pt[page] = new;
    if (only_adds(old, new)) {
        if (!pending_global[page]) upgraded_global[page] = 1;
    } else {
        pending_global[page] = 1;
        if (chance(40)) flush_page(global_va(page));
    }
}

static uint64_t changed_perm(uint64_t e) {
    switch (below(3)) {
    case 0:
        if (!is_table_frame(e)) e ^= PTE_W;
        break;
    case 1: e ^= PTE_U; break;
    default:
        if (nxe) e ^= PTE_NX;
        break;
    }
    return e;
}

static void op_leaf(void) {
    int global = chance(25);
    int page = (int)below(global ? GLOBAL_PAGES : PRIV_PAGES);
    uint64_t *pte = global ? &global_pt[page] : priv_pte(page);
    if (!pte) return;
    uint64_t e = *pte, new;
    switch (below(6)) {
    case 0:
    case 1: new = random_leaf(global); break;                    /* map / remap */
    case 2: new = e & ~PTE_P; break;                              /* unmap */
    case 3: new = changed_perm(e); break;                         /* protect */
    case 4: new = e & ~(chance(50) ? PTE_A : PTE_D); break;       /* age */
    default: new = e ^ ((below(8) << 9) | (below(0x80) << 52)); /* ignored bits */
    }
    if (global) set_global(page, new);
    else set_priv(page, new);
}

/* Repoints or clears one of the region's two PDEs (sharing tables
 * between address spaces). */
static void op_pde(void) {
    int slot = (int)below(2);
    uint64_t old = pds[cur][slot];
    uint64_t new = chance(15) ? 0 : (uint64_t)pool[below(POOL_PTS)] | PTE_P | PTE_W | PTE_U;
    pds[cur][slot] = new;
    if (old & PTE_P && old != new)
        for (int i = 0; i < 32; i++) pending[slot * 32 + i] = 1;
    if (chance(50)) {
        if (chance(50)) {
            load_cr3(cur);
        } else {
            for (int i = 0; i < 32; i++) flush_page(priv_va(slot * 32 + i));
        }
    }
}

/* The 2 MiB slot: one of the two large frames, or not present. */
static void op_large(void) {
    uint64_t old = pds[cur][2];
    uint64_t new = 0;
    if (chance(80)) {
        new = (LARGE_PHYS + (below(2) << 21)) | PTE_P | PTE_PS;
        if (chance(70)) new |= PTE_W;
        if (chance(60)) new |= PTE_U;
        if (nxe && chance(20)) new |= PTE_NX;
    }
    pds[cur][2] = new;
    if (!only_adds(old, new)) pending_large = 1;
    if (chance(50)) flush_page(LARGE_BASE + (below(512) << 12));
}

static void fold_outcome(void) {
    fold(last_trap.vector);
    if (last_trap.vector == 14) {
        fold(last_trap.error);
        fold(last_trap.cr2);
        stats_fault++;
    } else if (last_trap.vector == VEC_DONE) {
        fold(last_trap.rax);
    } else {
        fold(last_trap.error);
        fold(last_trap.rip);
    }
}

static void op_access(uint64_t n) {
    uint64_t va, leaf = 0;
    int region = (int)below(10);
#ifdef SKIP_FLUSHES
    suppress_hw_flush = 1;
#endif
    if (region < 6) {
        int page = (int)below(PRIV_PAGES);
        va = priv_va(page);
        if (pending[page]) {
            stats_flush++;
            if (chance(70)) flush_page(va);
            else load_cr3(cur);
        }
        if (upgraded[page]) stats_unflushed++;
        if (priv_pte(page)) leaf = *priv_pte(page);
    } else if (region < 7) {
        va = LARGE_BASE + (below(512) << 12);
        if (pending_large) {
            stats_flush++;
            if (chance(70)) flush_page(va);
            else load_cr3(cur);
        }
    } else {
        int page = (int)below(GLOBAL_PAGES);
        va = global_va(page);
        if (pending_global[page]) {
            stats_flush++;
            if (chance(80)) flush_page(va);
            else toggle_pge();
        }
        if (upgraded_global[page]) stats_unflushed++;
        leaf = global_pt[page];
    }
    suppress_hw_flush = 0;
#ifdef PARANOID
    /* Flush everything, outside the bookkeeping: no access can use a
     * cached translation, so the outcome is the page tables' alone. */
    switch_cr3((uint64_t)pml4s[cur]);
    write_cr4(cur_cr4() & ~CR4_PGE);
    write_cr4(cur_cr4());
#endif
    /* No pending change, so the leaf in memory is the translation: never
     * execute a page table's bytes as code. */
    int kind = (int)below(10);
    enum access_kind k = kind < 5 ? ACC_LOAD : kind < 8 ? ACC_STORE : ACC_FETCH;
    if (k == ACC_FETCH && (leaf & PTE_P) && is_table_frame(leaf)) k = ACC_LOAD;
    uint64_t off = k == ACC_FETCH ? FETCH_OFF : k == ACC_STORE ? 16 + 8 * below(510) : 8 * below(512);
    int cpl = chance(40) ? 3 : 0;
    access_at(k, va + off, cpl, cpl == 0 && chance(30), (n << 8) | 0x5a);
    stats_access++;
    fold(n);
    fold_outcome();
}

/* Every entry of every table the test owns, and a checksum of memory. */
static void fold_final_state(void) {
    /* Not pml4s[a][3]: a global translation cached through one address
     * space serves the others without a walk, so whether their PML4E for
     * the global region ever gets A is up to the TLB. */
    for (int a = 0; a < NAS; a++) {
        fold(pml4s[a][1]);
        fold(pdpts[a][0]);
        for (int i = 0; i < 3; i++) fold(pds[a][i]);
    }
    for (int p = 0; p < POOL_PTS; p++)
        for (int i = 0; i < 32; i++) fold(pool[p][i]);
    for (int i = 0; i < GLOBAL_PAGES; i++) fold(global_pt[i]);
    fold(global_pd[0]);
    fold(global_pdpt[0]);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < DATA_FRAMES * 512; i++) sum = sum * 31 + ((volatile uint64_t *)DATA_PHYS)[i];
    for (uint64_t i = 0; i < 2 * 512 * 512; i++) sum = sum * 31 + ((volatile uint64_t *)LARGE_PHYS)[i];
    fold(sum);
}

void rt_main(void) {
    setup_cpu();
    setup_paging();
    /* Data pages: a tag at 0, `int $0x80` at FETCH_OFF; the large frames
     * get a tag per 4 KiB page. */
    for (uint64_t f = 0; f < DATA_FRAMES; f++) {
        volatile uint64_t *p = (volatile uint64_t *)data_frame(f);
        for (int i = 0; i < 512; i++) p[i] = 0;
        p[0] = 0x7a60000000000000ull | f;
        p[FETCH_OFF / 8] = INT80_LO | (INT80_HI << 8);
    }
    for (uint64_t pg = 0; pg < 1024; pg++) {
        volatile uint64_t *p = (volatile uint64_t *)(LARGE_PHYS + pg * 4096);
        for (int i = 0; i < 512; i++) p[i] = 0;
        p[0] = 0x1a60000000000000ull | pg;
        p[FETCH_OFF / 8] = INT80_LO | (INT80_HI << 8);
    }
    global_pd[0] = (uint64_t)global_pt | PTE_P | PTE_W | PTE_U;
    global_pdpt[0] = (uint64_t)global_pd | PTE_P | PTE_W | PTE_U;
    for (int a = 0; a < NAS; a++) {
        pml4s[a][0] = kernel_pml4[0];
        pml4s[a][2] = kernel_pml4[2];
        pml4s[a][1] = (uint64_t)pdpts[a] | PTE_P | PTE_W | PTE_U;
        pml4s[a][3] = (uint64_t)global_pdpt | PTE_P | PTE_W | PTE_U;
        pdpts[a][0] = (uint64_t)pds[a] | PTE_P | PTE_W | PTE_U;
        pds[a][0] = (uint64_t)pool[2 * a] | PTE_P | PTE_W | PTE_U;
        pds[a][1] = (uint64_t)pool[2 * a + 1] | PTE_P | PTE_W | PTE_U;
    }
    cr0_base = read_cr0() | CR0_WP;
    cr4_base = (read_cr4() & ~(CR4_SMEP | CR4_SMAP)) | CR4_PGE;
    efer_base = rdmsr(EFER_MSR) & ~EFER_NXE;
    write_cr0(cr0_base);
    wrmsr(EFER_MSR, efer_base | EFER_NXE);
    write_cr4(cr4_base);
    load_cr3(0);

    for (uint64_t n = 0; n < OPS; n++) {
        uint64_t r = below(100);
        if (r < 44) op_access(n);
        else if (r < 79) op_leaf();
        else if (r < 82) op_pde();
        else if (r < 84) op_large();
        else if (r < 91) load_cr3((int)below(NAS));
        else if (r < 93) flush_page(chance(50) ? priv_va((int)below(PRIV_PAGES)) : global_va((int)below(GLOBAL_PAGES)));
        else if (r < 95) {
            wp = !wp;
            write_cr0(wp ? cr0_base : cr0_base & ~CR0_WP);
        } else if (r < 96) {
            /* NX bits turn reserved without NXE: clear them first (a
             * change that takes nothing away once NXE is off). */
            nxe = !nxe;
            if (!nxe) {
                for (int p = 0; p < POOL_PTS; p++)
                    for (int i = 0; i < 32; i++) pool[p][i] &= ~PTE_NX;
                for (int i = 0; i < GLOBAL_PAGES; i++) global_pt[i] &= ~PTE_NX;
                for (int a = 0; a < NAS; a++) pds[a][2] &= ~PTE_NX;
            }
            wrmsr(EFER_MSR, efer_base | (nxe ? EFER_NXE : 0));
            toggle_pge();
            load_cr3(cur);
        } else if (r < 97) {
            toggle_pge();
        } else if (r < 98) {
            /* SMEP or SMAP: a full flush after, whatever the CR4 write
             * itself flushes. */
            if (chance(50)) smep = !smep;
            else smap = !smap;
            write_cr4(cur_cr4());
            toggle_pge();
            load_cr3(cur);
        } else {
            /* Read a leaf as the OS would (A/D included). */
            uint64_t *pte = priv_pte((int)below(PRIV_PAGES));
            fold(pte ? *pte : 0xdead);
        }
    }
    fold_final_state();
    puts_serial("mmu-random: ops=");
    putu(OPS);
    puts_serial(" accesses=");
    putu(stats_access);
    puts_serial(" faults=");
    putu(stats_fault);
    puts_serial(" flushes_before_access=");
    putu(stats_flush);
    puts_serial(" unflushed_changes_used=");
    putu(stats_unflushed);
    puts_serial(" invlpg=");
    putu(stats_invlpg);
    puts_serial(" cr3_loads=");
    putu(stats_cr3);
    puts_serial(" digest=");
    puthex(digest);
    puts_serial("\n");
#ifdef CR3_CACHE
    puts_serial("mmu-random-cr3-cache: on=");
    putu(cr3c_state > 0);
    puts_serial(" hits=");
    putu(cr3c_hits);
    puts_serial(" misses=");
    putu(cr3c_misses);
    puts_serial("\n");
#endif
    debug_exit(0);
}
