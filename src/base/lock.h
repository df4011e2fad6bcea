/*
 * A mutex of one word on Linux futexes, for the pool's lock: taking and
 * giving it back uncontended is one atomic instruction each and a few
 * others, where glibc's pthread_mutex_lock and unlock run about 55
 * instructions together (type checks, elision, owner bookkeeping), about
 * 5% of a pair's instructions in bench/live_mixed.c's mix. Contended, a
 * waiter sleeps in the kernel as with glibc's default mutex; there is no
 * spinning and no fairness. Not recursive; the holder must be the one to
 * release it.
 *
 * State: 0 free, 1 held, 2 held and a thread may be sleeping on it (the
 * releaser then wakes one).
 */
#ifndef UM_LOCK_H
#define UM_LOCK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct um__lock {
    _Atomic uint32_t state;
} um__lock;

void um__lock_wait(um__lock *l);
/* A release that finds the lock marked contended: wakes a sleeper, and
 * in virtual time (vtime.h) counts a waiter running before the lock is
 * free, as um__vt_mutex_unlock does. */
void um__lock_release_slow(um__lock *l);
/* Virtual time (vtime.h): the lock was taken at once, ahead of sleepers a
 * release had already counted as running; they count as waiting again, and
 * the lock is marked contended. */
void um__lock_took(um__lock *l);
extern _Atomic bool um__vt_active;

static inline void um__lock_init(um__lock *l) { atomic_init(&l->state, 0); }

static inline void um__lock_acquire(um__lock *l)
{
    uint32_t expected = 0;
    if (__builtin_expect(atomic_compare_exchange_strong_explicit(&l->state, &expected, 1,
                                                                 memory_order_acquire,
                                                                 memory_order_relaxed),
                         1)) {
        if (__builtin_expect(atomic_load_explicit(&um__vt_active, memory_order_relaxed), 0))
            um__lock_took(l);
        return;
    }
    um__lock_wait(l);
}

/* A compare-exchange from 1, not an exchange: a lock marked contended
 * stays held until the slow path has done what must come first (virtual
 * time marks every hold contended, so its releases all go there). About
 * one instruction more a release than the exchange (+0.2% in
 * bench/live_mixed.c's mix); testing the virtual-time flag first cost
 * twice that. */
static inline void um__lock_release(um__lock *l)
{
    uint32_t expected = 1;
    if (__builtin_expect(!atomic_compare_exchange_strong_explicit(&l->state, &expected, 0,
                                                                  memory_order_release,
                                                                  memory_order_relaxed),
                         0))
        um__lock_release_slow(l);
}

#endif
