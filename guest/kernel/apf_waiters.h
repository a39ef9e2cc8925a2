/* Tasks waiting for asynchronous page faults, keyed by token.
 *
 * A "page not present" notification puts the current task to sleep on a
 * token; the matching "page ready" wakes it. The two can arrive in either
 * order (the ready can be handled on another CPU before the sleeper got
 * here), so a ready that finds no waiter leaves a "ready came first" node
 * behind, which the sleep then consumes instead of sleeping. The token
 * APF_WAKE_ALL wakes every waiter and drops every such node.
 *
 * Nodes come from a fixed pool (no allocation in interrupt context) and
 * live in a hash of spinlocked buckets. The task is an opaque pointer; the
 * kernel supplies how to block and wake one, so this file is pure and is
 * unit-tested on the host (-DHOSTED). */
#ifndef APF_WAITERS_H
#define APF_WAITERS_H

#include <stdint.h>
#include "spinlock.h"

#define APF_HASH_BITS 8
#define APF_HASH_BUCKETS (1u << APF_HASH_BITS)

struct apf_node {
    struct apf_node *next;
    uint32_t token;
    void *task; /* NULL: the page was ready before the task slept on it */
};

struct apf_bucket {
    spinlock_t lock;
    struct apf_node *head;
};

struct apf_waiters {
    struct apf_bucket buckets[APF_HASH_BUCKETS];
    spinlock_t pool_lock;
    struct apf_node *free;
    uint32_t free_nodes;
    uint32_t pool_nodes;
};

/* Called with the token's bucket lock held, after the waiter's node is in
 * the hash: marks `task` blocked, so a wake (which needs that lock to find
 * the node) always sees a blocked task. */
typedef void (*apf_block_fn)(void *task);
/* Called with the bucket lock held, after the node is unlinked: makes
 * `task` runnable. */
typedef void (*apf_wake_fn)(void *task);

enum apf_sleep_result {
    APF_SLEEP_QUEUED,        /* waiter queued and block() called: now switch away */
    APF_SLEEP_ALREADY_READY, /* a ready-first node was consumed: do not sleep */
    APF_SLEEP_NO_NODE,       /* the pool is exhausted: nothing changed */
};

enum apf_wake_result {
    APF_WAKE_WOKE,        /* the waiter was unlinked and wake() called */
    APF_WAKE_EARLY,       /* no waiter yet: a ready-first node was added */
    APF_WAKE_DUPLICATE,   /* no waiter, but a ready-first node already existed */
    APF_WAKE_NO_NODE,     /* no waiter and the pool is exhausted */
};

/* Uses `nodes[0..n)` as the pool. */
void apf_waiters_init(struct apf_waiters *w, struct apf_node *nodes, uint32_t n);
uint32_t apf_bucket_of(uint32_t token);
enum apf_sleep_result apf_waiters_sleep(struct apf_waiters *w, uint32_t token, void *task, apf_block_fn block);
/* `token` must not be APF_WAKE_ALL (use apf_waiters_wake_all). */
enum apf_wake_result apf_waiters_wake(struct apf_waiters *w, uint32_t token, apf_wake_fn wake);
/* Wakes every waiter and drops every ready-first node; returns the number
 * of tasks woken. */
uint32_t apf_waiters_wake_all(struct apf_waiters *w, apf_wake_fn wake);
/* Counts the nodes in the hash: waiters and ready-first nodes. */
void apf_waiters_count(struct apf_waiters *w, uint32_t *waiters, uint32_t *early);

#endif
