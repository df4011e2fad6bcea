/* The futex mutex's slow paths; see lock.h. */
#include "lock.h"

#include "vtime.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

/* In virtual time, one more try to take it (vtime.h). */
static bool take(const void *lock)
{
    return atomic_exchange_explicit(&((um__lock *)lock)->state, 2, memory_order_acquire) == 0;
}

void um__lock_wait(um__lock *l)
{
    /* Marks the lock contended and sleeps while it is held. A thread that
     * gets it this way leaves it marked 2, so its release wakes the next
     * sleeper (at worst one wake-up too many). In virtual time a thread
     * asleep here is not running (vtime.h). */
    if (take(l)) {
        /* Taken at once, ahead of waiters a release may have counted. */
        um__vt_took(l);
        return;
    }
    if (um__vt_blocked_begin(l, take))
        return;
    while (!take(l))
        syscall(SYS_futex, &l->state, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
    um__vt_blocked_end(l);
}

void um__lock_took(um__lock *l)
{
    um__vt_took(l);
    atomic_store_explicit(&l->state, 2, memory_order_relaxed);
}

static void release(const void *lock)
{
    um__lock *l = (um__lock *)(uintptr_t)lock;
    if (atomic_exchange_explicit(&l->state, 0, memory_order_release) != 1)
        syscall(SYS_futex, &l->state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* In virtual time a waiter counted running only after the lock was free
 * could be overtaken by a taker that then waited in virtual time holding
 * it, with the woken waiter asleep again and still counted: the clock
 * stood still until the watchdog moved it. */
void um__lock_release_slow(um__lock *l) { um__vt_release(l, release); }
