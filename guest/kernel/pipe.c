/* Pipes: a 4 KiB ring with blocking readers and writers. */
#include "kernel.h"

#define MAX_PIPES 256 /* hackbench 6: 122 */
#define PIPE_BUF_SIZE 4096

struct pipe {
    spinlock_t lock;
    int used;
    int readers, writers;
    struct ring ring;
    struct waitq readq, writeq;
};

static struct pipe pipes[MAX_PIPES];
static spinlock_t pipes_lock;

struct pipe *pipe_create(void) {
    uint64_t buf = pmm_alloc(&kpmm);
    if (!buf)
        return NULL;
    struct pipe *p = NULL;
    spin_lock(&pipes_lock);
    for (int i = 0; i < MAX_PIPES; i++) {
        if (!pipes[i].used) {
            p = &pipes[i];
            memset(p, 0, sizeof(*p));
            p->used = 1;
            p->readers = p->writers = 1;
            p->ring.buf = (uint8_t *)(uintptr_t)buf;
            p->ring.cap = PIPE_BUF_SIZE;
            break;
        }
    }
    spin_unlock(&pipes_lock);
    if (!p)
        pmm_free(&kpmm, buf);
    return p;
}

void pipe_ref(struct pipe *p, int writer) {
    spin_lock(&p->lock);
    if (writer)
        p->writers++;
    else
        p->readers++;
    spin_unlock(&p->lock);
}

void pipe_close(struct pipe *p, int writer) {
    spin_lock(&p->lock);
    if (writer)
        p->writers--;
    else
        p->readers--;
    /* The other side may be waiting for data or room that will never come. */
    waitq_wake_all(&p->readq);
    waitq_wake_all(&p->writeq);
    int gone = p->readers == 0 && p->writers == 0;
    spin_unlock(&p->lock);
    if (gone) {
        pmm_free(&kpmm, (uint64_t)(uintptr_t)p->ring.buf);
        spin_lock(&pipes_lock);
        p->used = 0;
        spin_unlock(&pipes_lock);
    }
}

int64_t pipe_read(struct pipe *p, uint8_t *dst, uint64_t n) {
    if (n == 0)
        return 0;
    spin_lock(&p->lock);
    while (ring_used(&p->ring) == 0) {
        if (p->writers == 0) {
            spin_unlock(&p->lock);
            return 0;
        }
        wait_event_block(&p->readq, &p->lock);
    }
    size_t got = ring_read(&p->ring, dst, n);
    waitq_wake_all(&p->writeq);
    spin_unlock(&p->lock);
    return (int64_t)got;
}

int64_t pipe_write(struct pipe *p, const uint8_t *src, uint64_t n) {
    uint64_t done = 0;
    spin_lock(&p->lock);
    while (done < n) {
        if (p->readers == 0) {
            spin_unlock(&p->lock);
            return done ? (int64_t)done : -EPIPE;
        }
        if (ring_free(&p->ring) == 0) {
            wait_event_block(&p->writeq, &p->lock);
            continue;
        }
        done += ring_write(&p->ring, src + done, n - done);
        waitq_wake_all(&p->readq);
    }
    spin_unlock(&p->lock);
    return (int64_t)done;
}
