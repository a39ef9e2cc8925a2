/* The access matrix: every page-table configuration of a list (P, R/W,
 * U/S, XD, A, D, PS and reserved bits at each level, 4 KiB, 2 MiB and
 * 1 GiB leaves) against every access context (CR0.WP, EFER.NXE,
 * CR4.SMEP, CR4.SMAP; CPL 0 with RFLAGS.AC clear or set, CPL 3; read,
 * write, fetch). Each case records whether the access faulted, the
 * vector, error code and CR2, the byte read or left behind, and the A/D
 * bits of the four guest entries afterwards, folded into one digest.
 *
 * The digest must be the same on the bare machine, under EPT and under
 * shadow paging. Built with -DCASE_LOG it also prints one line per case,
 * to find the first case where two runs differ.
 *
 * The address under test, TEST_VA, is in PML4 slot 1:
 *   PML4[1] -> test_pdpt[0] -> test_pd[20] -> test_pt[0] -> 4 KiB page
 * with a 1 GiB leaf in test_pdpt[0] (frame 0) or a 2 MiB leaf in
 * test_pd[20] (frame at 32 MiB) instead. */
#include "mmu_rt.h"

#define TEST_VA 0x0000008002800345ull
#define PHYS_4K 0x3000000ull
#define PHYS_2M 0x2000000ull
#define PHYS_1G 0x0ull
#define PD_INDEX 20

static uint64_t test_pdpt[512] __attribute__((aligned(4096)));
static uint64_t test_pd[512] __attribute__((aligned(4096)));
static uint64_t test_pt[512] __attribute__((aligned(4096)));

/* A configuration: the leaf level (1 = 4 KiB, 2 = 2 MiB, 3 = 1 GiB) and
 * bits set and cleared in the default entry of each level, 0 = PML4. */
struct tree {
    int leaf;
    uint64_t set[4], clear[4];
};
static struct tree trees[256];
static int ntrees;

static int path_len(int leaf) { return 5 - leaf; }

static struct tree *add(int leaf) {
    if (ntrees == (int)(sizeof trees / sizeof trees[0])) {
        puts_serial("too many trees\n");
        debug_exit(0x7e);
    }
    struct tree *t = &trees[ntrees++];
    t->leaf = leaf;
    return t;
}

/* R/W, U/S and XD of one level from a 3-bit combination. */
static void perms(struct tree *t, int lvl, int combo) {
    if (!(combo & 1)) t->clear[lvl] |= PTE_W;
    if (!(combo & 2)) t->clear[lvl] |= PTE_U;
    if (combo & 4) t->set[lvl] |= PTE_NX;
}

static void build_trees(void) {
    for (int leaf = 1; leaf <= 3; leaf++) {
        int n = path_len(leaf);
        /* Each level's permissions alone. */
        for (int lvl = 0; lvl < n; lvl++)
            for (int c = 0; c < 8; c++) perms(add(leaf), lvl, c);
        /* Leaf A and D, upper A (and the ignored D) preset. */
        for (int m = 0; m < 8; m++) {
            struct tree *t = add(leaf);
            if (m & 1) t->set[n - 1] |= PTE_A;
            if (m & 2) t->set[n - 1] |= PTE_D;
            if (m & 4)
                for (int lvl = 0; lvl < n - 1; lvl++) t->set[lvl] |= PTE_A | PTE_D;
        }
        for (int lvl = 0; lvl < n; lvl++) {
            add(leaf)->clear[lvl] = PTE_P;
            /* Above MAXPHYADDR (46) and at the top of the address field. */
            add(leaf)->set[lvl] = 1ull << 46;
            add(leaf)->set[lvl] = 1ull << 51;
        }
        add(leaf)->set[0] = PTE_PS; /* PS in a PML4E is reserved */
    }
    /* The PML4E's and the PTE's permissions together. */
    for (int c0 = 0; c0 < 8; c0++)
        for (int c3 = 0; c3 < 8; c3++) {
            struct tree *t = add(1);
            perms(t, 0, c0);
            perms(t, 3, c3);
        }
    /* Large-leaf address bits: reserved 20:13 / 29:13, PAT (12) is not. */
    add(2)->set[2] = 1ull << 13;
    add(2)->set[2] = 1ull << 20;
    add(2)->set[2] = 1ull << 12;
    add(3)->set[1] = 1ull << 13;
    add(3)->set[1] = 1ull << 29;
    add(3)->set[1] = 1ull << 12;
    /* Ignored bits everywhere, and G in the leaf (CR4.PGE is off). */
    struct tree *t = add(1);
    for (int lvl = 0; lvl < 4; lvl++) t->set[lvl] = (0x7full << 52) | (7ull << 9);
    add(1)->set[3] = PTE_G;
}

static uint64_t target_phys(int leaf) {
    return leaf == 1 ? PHYS_4K + (TEST_VA & 0xfff)
           : leaf == 2 ? PHYS_2M + (TEST_VA & 0x1fffff)
                       : PHYS_1G + (TEST_VA & 0x3fffffff);
}

/* The four entries on TEST_VA's path, PML4E first. */
static volatile uint64_t *entry_at(int lvl) {
    switch (lvl) {
    case 0: return &kernel_pml4[1];
    case 1: return &test_pdpt[0];
    case 2: return &test_pd[PD_INDEX];
    default: return &test_pt[0];
    }
}

static void install(const struct tree *t) {
    uint64_t base = PTE_P | PTE_W | PTE_U;
    uint64_t e[4] = {
        (uint64_t)test_pdpt | base,
        t->leaf == 3 ? PHYS_1G | base | PTE_PS : (uint64_t)test_pd | base,
        t->leaf == 2 ? PHYS_2M | base | PTE_PS : (uint64_t)test_pt | base,
        PHYS_4K | base,
    };
    for (int lvl = 0; lvl < 4; lvl++) *entry_at(lvl) = (e[lvl] & ~t->clear[lvl]) | t->set[lvl];
    volatile uint8_t *code = (volatile uint8_t *)target_phys(t->leaf);
    code[0] = INT80_LO;
    code[1] = INT80_HI;
    switch_cr3((uint64_t)kernel_pml4);
}

void rt_main(void) {
    setup_cpu();
    setup_paging();
    build_trees();
    uint64_t cr0 = read_cr0() & ~CR0_WP;
    uint64_t cr4 = read_cr4() & ~(CR4_SMEP | CR4_SMAP | CR4_PGE);
    uint64_t efer = rdmsr(EFER_MSR) & ~EFER_NXE;
    uint64_t cases = 0, ok = 0, faults = 0, other = 0;
#ifdef CASE_LOG
    /* Where the entries live, for a log reader that replays the walks. */
    puts_serial("entries");
    for (int lvl = 0; lvl < 4; lvl++) {
        puts_serial(" ");
        puthex((uint64_t)entry_at(lvl));
    }
    puts_serial(" cr3=");
    puthex((uint64_t)kernel_pml4);
    puts_serial(" va=");
    puthex(TEST_VA);
    puts_serial("\n");
#endif
    /* Context bits: 0 WP, 1 NXE, 2 SMEP, 3 SMAP; then the mode: CPL 0
     * AC 0, CPL 0 AC 1, CPL 3. */
    for (int ctx = 0; ctx < 48; ctx++) {
        int mode = ctx >> 4;
        write_cr0(cr0 | (ctx & 1 ? CR0_WP : 0));
        wrmsr(EFER_MSR, efer | (ctx & 2 ? EFER_NXE : 0));
        write_cr4(cr4 | (ctx & 4 ? CR4_SMEP : 0) | (ctx & 8 ? CR4_SMAP : 0));
        for (int ti = 0; ti < ntrees; ti++) {
            const struct tree *t = &trees[ti];
            for (int kind = ACC_READ; kind <= ACC_FETCH; kind++) {
                install(t);
#ifdef CASE_LOG
                uint64_t before[4];
                for (int lvl = 0; lvl < 4; lvl++) before[lvl] = *entry_at(lvl);
#endif
                access_at((enum access_kind)kind, TEST_VA, mode == 2 ? 3 : 0, mode == 1, 0);
                uint64_t ad = 0;
                for (int lvl = 0; lvl < 4; lvl++) ad |= (*entry_at(lvl) & (PTE_A | PTE_D)) << (8 * lvl);
                uint8_t left = *(volatile uint8_t *)target_phys(t->leaf);
                fold(cases);
                fold(last_trap.vector);
                if (last_trap.vector == 14) {
                    fold(last_trap.error);
                    fold(last_trap.cr2);
                    faults++;
                } else if (last_trap.vector == VEC_DONE) {
                    fold(kind == ACC_READ ? (last_trap.rax & 0xff) : 0);
                    ok++;
                } else {
                    fold(last_trap.error);
                    fold(last_trap.rip);
                    other++;
                }
                fold(ad);
                fold(left);
#ifdef CASE_LOG
                puts_serial("case ");
                putu(cases);
                puts_serial(" ctx=");
                putu((uint64_t)ctx);
                puts_serial(" tree=");
                putu((uint64_t)ti);
                puts_serial(" kind=");
                putu((uint64_t)kind);
                puts_serial(" vector=");
                putu(last_trap.vector);
                puts_serial(" error=");
                puthex(last_trap.error);
                puts_serial(" ad=");
                puthex(ad);
                puts_serial(" left=");
                putu(left);
                puts_serial(" before=");
                for (int lvl = 0; lvl < 4; lvl++) {
                    puthex(before[lvl]);
                    puts_serial(lvl < 3 ? "," : "");
                }
                puts_serial("\n");
#endif
                cases++;
            }
        }
    }
    puts_serial("mmu-matrix: cases=");
    putu(cases);
    puts_serial(" ok=");
    putu(ok);
    puts_serial(" faults=");
    putu(faults);
    puts_serial(" other=");
    putu(other);
    puts_serial(" digest=");
    puthex(digest);
    puts_serial("\n");
#ifdef CR3_CACHE
    puts_serial("mmu-matrix-cr3-cache: on=");
    putu(cr3c_state > 0);
    puts_serial(" hits=");
    putu(cr3c_hits);
    puts_serial(" misses=");
    putu(cr3c_misses);
    puts_serial("\n");
#endif
    debug_exit(0);
}
