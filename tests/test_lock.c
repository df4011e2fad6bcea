/* The futex mutex (src/base/lock.h): mutual exclusion under many threads
 * (two counters that only a holder may see apart), and the sleeping path
 * taken on purpose: a thread that finds the lock held marks it contended
 * and sleeps, and the release wakes it. */
#include "base/lock.h"
#include "harness.h"

#include <pthread.h>
#include <time.h>

#define THREADS 8
#define ROUNDS 200000

static um__lock lock;
/* Written only under the lock: a holder must always find them equal. */
static uint64_t first, second;
static _Atomic uint64_t torn, contended_seen;

static void *hammer(void *arg)
{
    (void)arg;
    int rounds = HARNESS_SANITIZED ? ROUNDS / 10 : ROUNDS;
    for (int i = 0; i < rounds; i++) {
        um__lock_acquire(&lock);
        if (first != second)
            torn++;
        first++;
        /* Some rounds hold the lock a while, so that others find it held
         * and sleep (state 2). */
        if (i % 1024 == 0) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
            if (atomic_load(&lock.state) == 2)
                contended_seen++;
        }
        second++;
        um__lock_release(&lock);
    }
    return NULL;
}

static _Atomic int waiter_has_it;

static void *waiter(void *arg)
{
    (void)arg;
    um__lock_acquire(&lock);
    waiter_has_it = 1;
    um__lock_release(&lock);
    return NULL;
}

int main(void)
{
    um__lock_init(&lock);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        CHECK_EQ(pthread_create(&t[i], NULL, hammer, NULL), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    int rounds = HARNESS_SANITIZED ? ROUNDS / 10 : ROUNDS;
    CHECK_EQ(torn, 0u);
    CHECK_EQ(first, (uint64_t)THREADS * (uint64_t)rounds);
    CHECK_EQ(second, first);
    CHECK_EQ(atomic_load(&lock.state), 0u);
    printf("test_lock: %d threads x %d rounds; the lock was seen contended in %llu long holds\n",
           THREADS, rounds, (unsigned long long)contended_seen);

    /* The sleeping path, deterministically: hold the lock until the
     * waiter has marked it contended (it sleeps then), release, and the
     * waiter must get it. */
    um__lock_acquire(&lock);
    pthread_t w;
    CHECK_EQ(pthread_create(&w, NULL, waiter, NULL), 0);
    int polls = 0;
    while (atomic_load(&lock.state) != 2 && polls < 5000) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        polls++;
    }
    CHECK_EQ(atomic_load(&lock.state), 2u);
    CHECK_EQ(waiter_has_it, 0);
    um__lock_release(&lock);
    pthread_join(w, NULL);
    CHECK_EQ(waiter_has_it, 1);
    CHECK_EQ(atomic_load(&lock.state), 0u);
    return harness_finish("test_lock");
}
