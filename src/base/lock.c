/* The futex mutex's slow paths; see lock.h. */
#include "lock.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

void um__lock_wait(um__lock *l)
{
    /* Marks the lock contended and sleeps while it is held. A thread that
     * gets it this way leaves it marked 2, so its release wakes the next
     * sleeper (at worst one wake-up too many). */
    while (atomic_exchange_explicit(&l->state, 2, memory_order_acquire) != 0)
        syscall(SYS_futex, &l->state, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
}

void um__lock_wake(um__lock *l)
{
    syscall(SYS_futex, &l->state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
