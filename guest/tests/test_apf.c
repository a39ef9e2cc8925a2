/* Host tests of the async page fault waiter hash (kernel/apf_waiters.c):
 * tasks are small structs whose "blocked" flag stands for the scheduler. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "../kernel/apf_waiters.h"
#include "../lib/klib.h"
#include "check.h"

struct fake_task {
    int id;
    int blocked; /* set by block(), cleared by wake() */
    int blocks, wakes;
};

static void fake_block(void *task) {
    struct fake_task *t = task;
    __atomic_store_n(&t->blocked, 1, __ATOMIC_RELEASE);
    t->blocks++;
}

static void fake_wake(void *task) {
    struct fake_task *t = task;
    t->wakes++; /* under the bucket lock: one waker at a time per task */
    __atomic_store_n(&t->blocked, 0, __ATOMIC_RELEASE);
}

static void expect_counts(struct apf_waiters *w, uint32_t waiters, uint32_t early) {
    uint32_t nw = 99, ne = 99;
    apf_waiters_count(w, &nw, &ne);
    CHECK(nw == waiters);
    CHECK(ne == early);
    CHECK(w->free_nodes == w->pool_nodes - waiters - early);
}

static void test_sleep_then_wake(void) {
    static struct apf_node nodes[8];
    static struct apf_waiters w;
    apf_waiters_init(&w, nodes, 8);
    struct fake_task a = {.id = 1}, b = {.id = 2};
    CHECK(apf_waiters_sleep(&w, 0x1000, &a, fake_block) == APF_SLEEP_QUEUED);
    CHECK(apf_waiters_sleep(&w, 0x2001, &b, fake_block) == APF_SLEEP_QUEUED);
    CHECK(a.blocked && a.blocks == 1 && b.blocked && b.blocks == 1);
    expect_counts(&w, 2, 0);
    /* Each ready wakes exactly its own waiter. */
    CHECK(apf_waiters_wake(&w, 0x2001, fake_wake) == APF_WAKE_WOKE);
    CHECK(a.blocked && a.wakes == 0 && !b.blocked && b.wakes == 1);
    CHECK(apf_waiters_wake(&w, 0x1000, fake_wake) == APF_WAKE_WOKE);
    CHECK(!a.blocked && a.wakes == 1 && b.wakes == 1);
    expect_counts(&w, 0, 0);
}

static void test_ready_before_not_present(void) {
    static struct apf_node nodes[8];
    static struct apf_waiters w;
    apf_waiters_init(&w, nodes, 8);
    struct fake_task a = {.id = 1};
    CHECK(apf_waiters_wake(&w, 0x5003, fake_wake) == APF_WAKE_EARLY);
    expect_counts(&w, 0, 1);
    /* A second ready for the same token keeps the one node. */
    CHECK(apf_waiters_wake(&w, 0x5003, fake_wake) == APF_WAKE_DUPLICATE);
    expect_counts(&w, 0, 1);
    /* Another token's sleep is not satisfied by it. */
    CHECK(apf_waiters_sleep(&w, 0x6003, &a, fake_block) == APF_SLEEP_QUEUED);
    CHECK(a.blocks == 1);
    CHECK(apf_waiters_wake(&w, 0x6003, fake_wake) == APF_WAKE_WOKE);
    /* The not-present that follows consumes the node and does not block. */
    CHECK(apf_waiters_sleep(&w, 0x5003, &a, fake_block) == APF_SLEEP_ALREADY_READY);
    CHECK(a.blocks == 1 && !a.blocked);
    expect_counts(&w, 0, 0);
    /* Consumed: the same token now really sleeps. */
    CHECK(apf_waiters_sleep(&w, 0x5003, &a, fake_block) == APF_SLEEP_QUEUED);
    CHECK(a.blocks == 2 && a.blocked);
    CHECK(apf_waiters_wake(&w, 0x5003, fake_wake) == APF_WAKE_WOKE);
    expect_counts(&w, 0, 0);
}

static void test_wake_all(void) {
    static struct apf_node nodes[32];
    static struct apf_waiters w;
    apf_waiters_init(&w, nodes, 32);
    struct fake_task t[10];
    for (int i = 0; i < 10; i++) {
        t[i] = (struct fake_task){.id = i};
        CHECK(apf_waiters_sleep(&w, (uint32_t)(i + 1) << 12, &t[i], fake_block) == APF_SLEEP_QUEUED);
    }
    for (int i = 0; i < 5; i++)
        CHECK(apf_waiters_wake(&w, 0x100000u + (uint32_t)i, fake_wake) == APF_WAKE_EARLY);
    expect_counts(&w, 10, 5);
    CHECK(apf_waiters_wake_all(&w, fake_wake) == 10);
    for (int i = 0; i < 10; i++)
        CHECK(!t[i].blocked && t[i].wakes == 1);
    expect_counts(&w, 0, 0);
    /* The ready-first nodes were dropped: those tokens sleep now. */
    CHECK(apf_waiters_sleep(&w, 0x100000u, &t[0], fake_block) == APF_SLEEP_QUEUED);
    CHECK(apf_waiters_wake_all(&w, fake_wake) == 1);
    CHECK(apf_waiters_wake_all(&w, fake_wake) == 0);
    expect_counts(&w, 0, 0);
}

static void test_collisions(void) {
    static struct apf_node nodes[64];
    static struct apf_waiters w;
    apf_waiters_init(&w, nodes, 64);
    /* 24 x86-style tokens that all land in one bucket. */
    enum { N = 24 };
    uint32_t tokens[N];
    uint32_t target = apf_bucket_of(1u << 12);
    int n = 0;
    for (uint32_t id = 1; n < N && id < (1u << 20); id++) {
        uint32_t tok = (id << 12) | (id & 3);
        if (apf_bucket_of(tok) == target)
            tokens[n++] = tok;
    }
    CHECK(n == N);
    struct fake_task t[N];
    for (int i = 0; i < N; i++) {
        t[i] = (struct fake_task){.id = i};
        CHECK(apf_waiters_sleep(&w, tokens[i], &t[i], fake_block) == APF_SLEEP_QUEUED);
    }
    CHECK(w.buckets[target].head != NULL);
    /* An unknown token in the same bucket wakes nobody. */
    uint32_t stranger = 0;
    for (uint32_t id = 1u << 19; !stranger; id++)
        if (apf_bucket_of(id << 12) == target)
            stranger = id << 12;
    CHECK(apf_waiters_wake(&w, stranger, fake_wake) == APF_WAKE_EARLY);
    for (int i = 0; i < N; i++)
        CHECK(t[i].blocked);
    /* Wake in a scrambled order (7 is coprime with 24): each wake hits its own task only. */
    for (int k = 0; k < N; k++) {
        int i = (k * 7) % N;
        CHECK(apf_waiters_wake(&w, tokens[i], fake_wake) == APF_WAKE_WOKE);
        int woken = 0;
        for (int j = 0; j < N; j++)
            woken += !t[j].blocked;
        CHECK(woken == k + 1 && !t[i].blocked && t[i].wakes == 1);
    }
    CHECK(apf_waiters_sleep(&w, stranger, &t[0], fake_block) == APF_SLEEP_ALREADY_READY);
    expect_counts(&w, 0, 0);

    /* x86 tokens ((id << 12) | vcpu) spread over the buckets. */
    static int load[APF_HASH_BUCKETS];
    memset(load, 0, sizeof(load));
    const int tokens_total = 64 * 4 * 8;
    for (uint32_t id = 1; id <= 64 * 8; id++)
        for (uint32_t vcpu = 0; vcpu < 4; vcpu++)
            load[apf_bucket_of((id << 12) | vcpu)]++;
    int max = 0, empty = 0;
    for (uint32_t b = 0; b < APF_HASH_BUCKETS; b++) {
        max = load[b] > max ? load[b] : max;
        empty += load[b] == 0;
    }
    int mean = tokens_total / (int)APF_HASH_BUCKETS;
    CHECK(max <= 2 * mean);
    CHECK(empty == 0);
}

static void test_pool_reuse(void) {
    static struct apf_node nodes[4];
    static struct apf_waiters w;
    apf_waiters_init(&w, nodes, 4);
    struct fake_task t[5];
    for (int i = 0; i < 4; i++) {
        t[i] = (struct fake_task){.id = i};
        CHECK(apf_waiters_sleep(&w, 0x1000u * (uint32_t)(i + 1), &t[i], fake_block) == APF_SLEEP_QUEUED);
    }
    t[4] = (struct fake_task){.id = 4};
    /* Exhausted: nothing queued, the task not blocked, no early node. */
    CHECK(w.free_nodes == 0);
    CHECK(apf_waiters_sleep(&w, 0x9000, &t[4], fake_block) == APF_SLEEP_NO_NODE);
    CHECK(t[4].blocks == 0 && !t[4].blocked);
    CHECK(apf_waiters_wake(&w, 0xa000, fake_wake) == APF_WAKE_NO_NODE);
    expect_counts(&w, 4, 0);
    /* A wake returns its node; the next sleep gets it. */
    CHECK(apf_waiters_wake(&w, 0x1000, fake_wake) == APF_WAKE_WOKE);
    CHECK(apf_waiters_sleep(&w, 0x9000, &t[4], fake_block) == APF_SLEEP_QUEUED);
    CHECK(apf_waiters_wake_all(&w, fake_wake) == 4);
    expect_counts(&w, 0, 0);
    /* Many rounds through a 4-node pool, alternating both orders: no leak. */
    int ok = 1;
    for (uint32_t round = 1; round <= 1000; round++) {
        uint32_t tok = round << 12;
        struct fake_task *x = &t[round % 4];
        if (round & 1) {
            ok &= apf_waiters_sleep(&w, tok, x, fake_block) == APF_SLEEP_QUEUED;
            ok &= apf_waiters_wake(&w, tok, fake_wake) == APF_WAKE_WOKE;
        } else {
            ok &= apf_waiters_wake(&w, tok, fake_wake) == APF_WAKE_EARLY;
            ok &= apf_waiters_sleep(&w, tok, x, fake_block) == APF_SLEEP_ALREADY_READY;
        }
    }
    CHECK(ok);
    expect_counts(&w, 0, 0);
    /* Every node is in the free list exactly once. */
    int listed = 0;
    for (struct apf_node *n = w.free; n && listed <= 4; n = n->next)
        listed++;
    CHECK(listed == 4);
}

/* Sleepers and wakers on real threads. Each waker serves some sleepers,
 * round by round, and wakes each token exactly once: usually once its
 * sleeper has reached that round (racing with the sleep itself), sometimes
 * a round early (the ready comes before the not-present). */
enum { STRESS_SLEEPERS = 4, STRESS_ROUNDS = 3000, STRESS_WAKERS = 2 };
static struct apf_node stress_nodes[STRESS_SLEEPERS * 2];
static struct apf_waiters stress_w;
static struct fake_task stress_tasks[STRESS_SLEEPERS];
static int stress_round[STRESS_SLEEPERS]; /* the round each sleeper is in */
static int stress_queued[STRESS_SLEEPERS], stress_ready_first[STRESS_SLEEPERS];
static int stress_woke[STRESS_WAKERS], stress_early[STRESS_WAKERS], stress_other[STRESS_WAKERS];

static uint32_t stress_token(int sleeper, int round) { return ((uint32_t)(round + 1) << 12) | (uint32_t)sleeper; }

static void *stress_sleeper(void *arg) {
    int s = (int)(intptr_t)arg;
    struct fake_task *t = &stress_tasks[s];
    for (int r = 0; r < STRESS_ROUNDS; r++) {
        __atomic_store_n(&stress_round[s], r, __ATOMIC_RELEASE);
        enum apf_sleep_result res = apf_waiters_sleep(&stress_w, stress_token(s, r), t, fake_block);
        if (res == APF_SLEEP_QUEUED) {
            stress_queued[s]++;
            while (__atomic_load_n(&t->blocked, __ATOMIC_ACQUIRE))
                __asm__ volatile("pause");
        } else if (res == APF_SLEEP_ALREADY_READY) {
            stress_ready_first[s]++;
        } else {
            abort(); /* at most one waiter and one early node per sleeper */
        }
    }
    return NULL;
}

static void *stress_waker(void *arg) {
    int k = (int)(intptr_t)arg;
    uint64_t rng = 0x9e3779b97f4a7c15ULL + (uint64_t)k;
    for (int r = 0; r < STRESS_ROUNDS; r++) {
        for (int s = k; s < STRESS_SLEEPERS; s += STRESS_WAKERS) {
            int need = xorshift64(&rng) % 4 == 0 ? r - 1 : r;
            while (__atomic_load_n(&stress_round[s], __ATOMIC_ACQUIRE) < need)
                __asm__ volatile("pause");
            switch (apf_waiters_wake(&stress_w, stress_token(s, r), fake_wake)) {
            case APF_WAKE_WOKE:
                stress_woke[k]++;
                break;
            case APF_WAKE_EARLY:
                stress_early[k]++;
                break;
            default:
                stress_other[k]++;
                break;
            }
        }
    }
    return NULL;
}

static void test_threads(void) {
    apf_waiters_init(&stress_w, stress_nodes, sizeof(stress_nodes) / sizeof(stress_nodes[0]));
    pthread_t sleepers[STRESS_SLEEPERS], wakers[STRESS_WAKERS];
    for (int s = 0; s < STRESS_SLEEPERS; s++) {
        stress_tasks[s] = (struct fake_task){.id = s};
        stress_round[s] = -1;
    }
    for (int s = 0; s < STRESS_SLEEPERS; s++)
        pthread_create(&sleepers[s], NULL, stress_sleeper, (void *)(intptr_t)s);
    for (int k = 0; k < STRESS_WAKERS; k++)
        pthread_create(&wakers[k], NULL, stress_waker, (void *)(intptr_t)k);
    for (int k = 0; k < STRESS_WAKERS; k++)
        pthread_join(wakers[k], NULL);
    for (int s = 0; s < STRESS_SLEEPERS; s++)
        pthread_join(sleepers[s], NULL);
    int queued = 0, ready_first = 0, woke = 0, early = 0, other = 0;
    for (int s = 0; s < STRESS_SLEEPERS; s++) {
        queued += stress_queued[s];
        ready_first += stress_ready_first[s];
        CHECK(stress_tasks[s].wakes == stress_queued[s]);
        CHECK(!stress_tasks[s].blocked);
    }
    for (int k = 0; k < STRESS_WAKERS; k++) {
        woke += stress_woke[k];
        early += stress_early[k];
        other += stress_other[k];
    }
    CHECK(other == 0);
    CHECK(queued + ready_first == STRESS_SLEEPERS * STRESS_ROUNDS);
    CHECK(woke == queued && early == ready_first);
    expect_counts(&stress_w, 0, 0);
}

void test_apf_waiters(void) {
    test_sleep_then_wake();
    test_ready_before_not_present();
    test_wake_all();
    test_collisions();
    test_pool_reuse();
    test_threads();
}
