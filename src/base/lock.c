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
    if (take(l) || um__vt_blocked_begin(l, take))
        return;
    while (!take(l))
        syscall(SYS_futex, &l->state, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
    um__vt_blocked_end(l);
}

/* A waiter that a release had woken and counted running, and that this
 * taker overtook, may not have marked the lock contended yet: marked here,
 * so that this holder's release counts it running again. Without it the
 * waiter ran uncounted and the clock could move early. */
void um__lock_took(um__lock *l)
{
    if (um__vt_took(l))
        atomic_store_explicit(&l->state, 2, memory_order_relaxed);
}

void um__lock_wake(um__lock *l)
{
    syscall(SYS_futex, &l->state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    um__vt_unlocked(l);
}
