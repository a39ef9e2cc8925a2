#include "apf_waiters.h"
#include "../lib/klib.h"

void apf_waiters_init(struct apf_waiters *w, struct apf_node *nodes, uint32_t n) {
    memset(w, 0, sizeof(*w));
    for (uint32_t i = 0; i < n; i++) {
        nodes[i].next = w->free;
        w->free = &nodes[i];
    }
    w->free_nodes = n;
    w->pool_nodes = n;
}

/* Multiplicative (Fibonacci) hashing: x86 tokens differ mostly in their
 * high bits ((id << 12) | vcpu), so the top bits of the product are used. */
uint32_t apf_bucket_of(uint32_t token) { return (token * 0x61c88647u) >> (32 - APF_HASH_BITS); }

static struct apf_node *node_get(struct apf_waiters *w) {
    spin_lock(&w->pool_lock);
    struct apf_node *n = w->free;
    if (n) {
        w->free = n->next;
        w->free_nodes--;
    }
    spin_unlock(&w->pool_lock);
    return n;
}

static void node_put(struct apf_waiters *w, struct apf_node *n) {
    spin_lock(&w->pool_lock);
    n->next = w->free;
    n->task = NULL;
    w->free = n;
    w->free_nodes++;
    spin_unlock(&w->pool_lock);
}

/* The link pointing at the node for `token`, or at the list's NULL end. */
static struct apf_node **find(struct apf_bucket *b, uint32_t token) {
    struct apf_node **pp = &b->head;
    while (*pp && (*pp)->token != token)
        pp = &(*pp)->next;
    return pp;
}

enum apf_sleep_result apf_waiters_sleep(struct apf_waiters *w, uint32_t token, void *task, apf_block_fn block) {
    struct apf_bucket *b = &w->buckets[apf_bucket_of(token)];
    spin_lock(&b->lock);
    struct apf_node **pp = find(b, token);
    if (*pp) {
        /* Tokens are unique while outstanding, so a node already here is
         * the ready-first node, never another waiter. */
        struct apf_node *early = *pp;
        *pp = early->next;
        spin_unlock(&b->lock);
        node_put(w, early);
        return APF_SLEEP_ALREADY_READY;
    }
    struct apf_node *n = node_get(w);
    if (!n) {
        spin_unlock(&b->lock);
        return APF_SLEEP_NO_NODE;
    }
    n->token = token;
    n->task = task;
    n->next = b->head;
    b->head = n;
    block(task);
    spin_unlock(&b->lock);
    return APF_SLEEP_QUEUED;
}

enum apf_wake_result apf_waiters_wake(struct apf_waiters *w, uint32_t token, apf_wake_fn wake) {
    struct apf_bucket *b = &w->buckets[apf_bucket_of(token)];
    spin_lock(&b->lock);
    struct apf_node **pp = find(b, token);
    struct apf_node *n = *pp;
    if (n && n->task) {
        *pp = n->next;
        wake(n->task);
        spin_unlock(&b->lock);
        node_put(w, n);
        return APF_WAKE_WOKE;
    }
    if (n) {
        spin_unlock(&b->lock);
        return APF_WAKE_DUPLICATE;
    }
    n = node_get(w);
    if (!n) {
        spin_unlock(&b->lock);
        return APF_WAKE_NO_NODE;
    }
    n->token = token;
    n->task = NULL;
    n->next = b->head;
    b->head = n;
    spin_unlock(&b->lock);
    return APF_WAKE_EARLY;
}

uint32_t apf_waiters_wake_all(struct apf_waiters *w, apf_wake_fn wake) {
    uint32_t woken = 0;
    for (uint32_t i = 0; i < APF_HASH_BUCKETS; i++) {
        struct apf_bucket *b = &w->buckets[i];
        spin_lock(&b->lock);
        struct apf_node *n = b->head;
        b->head = NULL;
        while (n) {
            struct apf_node *next = n->next;
            if (n->task) {
                wake(n->task);
                woken++;
            }
            node_put(w, n);
            n = next;
        }
        spin_unlock(&b->lock);
    }
    return woken;
}

void apf_waiters_count(struct apf_waiters *w, uint32_t *waiters, uint32_t *early) {
    uint32_t nw = 0, ne = 0;
    for (uint32_t i = 0; i < APF_HASH_BUCKETS; i++) {
        struct apf_bucket *b = &w->buckets[i];
        spin_lock(&b->lock);
        for (struct apf_node *n = b->head; n; n = n->next) {
            if (n->task)
                nw++;
            else
                ne++;
        }
        spin_unlock(&b->lock);
    }
    *waiters = nw;
    *early = ne;
}
