/*
 * vtime: virtual time for a whole process, so that the library's own
 * threads (task workers, the reclaimer, the program's thread) run the real
 * runtime while devices and links are models (option virtual_time).
 *
 * The clock stands still while any participating thread can run, and
 * jumps to the next scheduled event (a sleeper's deadline, or the device
 * model's next completion) when every one of them waits. A thread counts
 * as running from its registration until it blocks in one of the waits
 * below, and again from the moment something wakes it: whoever wakes a
 * waiter counts it running before it is scheduled (a "credit"), so the
 * clock can never move between a wake-up and the woken thread's next step.
 * That holds only for waits that go through this module: a participant
 * must not hold a lock while it waits in virtual time that another
 * participant may block on (it would count as running, and the clock
 * would stand still for good). A watchdog moves the clock if that ever
 * happens and counts it (um__vt_forced), so a run never hangs.
 *
 * Owns the clock, the count of running participants and the sleepers;
 * the device model (a backend's, um__vt_model) owns its own state, under
 * the clock's lock. When virtual time is off every call here is the plain
 * pthread call or a real sleep.
 */
#ifndef UM_VTIME_H
#define UM_VTIME_H

#include "base.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

extern _Atomic bool um__vt_active;

static inline bool um__vt_on(void)
{
    return atomic_load_explicit(&um__vt_active, memory_order_relaxed);
}

/* The virtual clock in ns (starts at 0). */
uint64_t um__vt_now(void);

/* The device model the clock consults: next() is the time of its next
 * event (UINT64_MAX: none); advance(t) processes its events up to t. Both
 * are called with the clock's lock held, so they must not wait. */
typedef struct um__vt_model {
    uint64_t (*next)(void *self);
    void (*advance)(void *self, uint64_t t);
    void *self;
} um__vt_model;

/* Turns virtual time on; the calling thread is its first participant.
 * UM_ERR_BUSY when it is already on (one virtual-time context at a time). */
um_status um__vt_start(void);
/* Turns it off (the caller is the last participant). */
void um__vt_stop(void);
void um__vt_set_model(const um__vt_model *m);

/* The clock's lock, for the device model's state. */
void um__vt_lock(void);
void um__vt_unlock(void);
/* With the lock held: blocks until the model changes (an event processed,
 * or um__vt_model_changed), then returns with the lock held; callers loop
 * on their condition. */
void um__vt_wait_model_locked(void);
/* With the lock held: the model's state changed outside an event (work
 * queued, an immediate completion): its waiters look again. */
void um__vt_model_changed_locked(void);

/* Sleeps until the clock reads t: real time, or virtual time when on. */
void um__sleep_until_ns(uint64_t t);

/* Participants other than the first: call um__vt_spawn before creating
 * the thread (it counts as running from then), um__vt_exit as the thread's
 * last step, um__vt_unspawn instead when creation failed, and join it with
 * um__vt_join (which does not block for a thread that has exited). */
void um__vt_spawn(void);
void um__vt_exit(void);
void um__vt_unspawn(void);
int um__vt_join(pthread_t t, void **ret);

/* pthread_mutex_lock and unlock for a lock that a participant may hold
 * while it waits in virtual time: a thread blocked on it does not count as
 * running, and the unlock counts one such waiter running again (so the
 * clock cannot move before it has the lock). */
void um__vt_mutex_lock(pthread_mutex_t *m);
void um__vt_mutex_unlock(pthread_mutex_t *m);
/* pthread_mutex_trylock for such a lock: true when taken. */
bool um__vt_mutex_trylock(pthread_mutex_t *m);
/* The same for another kind of lock (the pool's futex lock): begin before
 * sleeping on it, with try_take trying once more to take it (true: taken,
 * do not sleep); end once it is had; release to let it go. No-ops (begin
 * false) when virtual time is off. */
bool um__vt_blocked_begin(const void *lock, bool (*try_take)(const void *lock));
void um__vt_blocked_end(const void *lock);
/* Releases the lock through release(lock), having counted one of its
 * waiters running first (under the clock's lock, so that a thread that
 * takes it at once uncounts that waiter after, not before). */
void um__vt_release(const void *lock, void (*release)(const void *lock));
/* A lock was taken without waiting: the waiters a release counted as
 * running, and that did not get it, count as waiting again. */
void um__vt_took(const void *lock);

/* A condition variable whose waits and wake-ups the clock sees. Signal
 * and broadcast must be called with the waiters' mutex held; in virtual
 * time that mutex must be taken with um__vt_mutex_lock. */
typedef struct um__cond {
    pthread_cond_t c;
    pthread_mutex_t inner; /* virtual time: guards the tickets, c waits on it */
    /* Virtual time: each wait takes the next ticket; a wake-up wakes the
     * oldest tickets (all of them for a broadcast), counting them running,
     * and a waiter returns once its ticket is woken, so no waiter takes
     * another's wake-up. */
    uint64_t arrived, woken;
} um__cond;

int um__cond_init(um__cond *c);
void um__cond_destroy(um__cond *c);
void um__cond_wait(um__cond *c, pthread_mutex_t *m);
/* Waits until c is signalled or there may be progress elsewhere: in
 * virtual time, until the device model changes (a copy or kernel ended,
 * work was queued); in real time, at most poll_ns (the caller polls what
 * no signal reports, a GPU's events). Returns with m held; callers loop on
 * their condition. */
void um__cond_wait_progress(um__cond *c, pthread_mutex_t *m, uint64_t poll_ns);
void um__cond_signal(um__cond *c);
void um__cond_broadcast(um__cond *c);

/* Statistics of the current (or last) virtual run. */
typedef struct um__vt_stats {
    uint64_t steps;  /* times the clock moved or the model was advanced */
    uint64_t forced; /* steps the watchdog forced (a wait the clock cannot see) */
    uint64_t stalls; /* times every participant waited with nothing scheduled */
    /* Locks had with no release counting the taker running first (a
     * release the clock cannot see) while the clock moved: it may have
     * moved early. */
    uint64_t early_moves;
} um__vt_stats;
void um__vt_stats_get(um__vt_stats *out);

#endif /* UM_VTIME_H */
