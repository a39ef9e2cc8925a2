#ifndef SPINLOCK_H
#define SPINLOCK_H

/* The kernel runs with interrupts off (interrupt gates, FMASK clears IF on
 * syscall), so a spinlock never needs to save and restore IF. */
typedef struct {
    volatile int locked;
} spinlock_t;

static inline void spin_lock(spinlock_t *l) {
    while (__atomic_exchange_n(&l->locked, 1, __ATOMIC_ACQUIRE)) {
        while (__atomic_load_n(&l->locked, __ATOMIC_RELAXED))
            __asm__ volatile("pause");
    }
}

static inline void spin_unlock(spinlock_t *l) { __atomic_store_n(&l->locked, 0, __ATOMIC_RELEASE); }

static inline int spin_is_locked(spinlock_t *l) { return __atomic_load_n(&l->locked, __ATOMIC_RELAXED); }

#endif
