/*
 * vtime: the virtual clock and its participants (vtime.h says the rules).
 */
#include "vtime.h"

#include <string.h>
#include <time.h>

_Atomic bool um__vt_active;

/* The clock's steps when this thread last blocked on a lock. */
static _Thread_local uint64_t block_steps;

/* The mutexes this thread holds through um__vt_mutex_lock, with their
 * depth: the transfer engine's lock is recursive, and an inner unlock
 * that counted a waiter running left it counted while the lock was still
 * held (the clock stood still until the watchdog moved it). */
#define MAX_HELD 16
static _Thread_local struct held_mutex {
    const pthread_mutex_t *m;
    int depth;
} held[MAX_HELD];
static _Thread_local int nheld;

static void held_push(const pthread_mutex_t *m)
{
    for (int i = 0; i < nheld; i++)
        if (held[i].m == m) {
            held[i].depth++;
            return;
        }
    if (nheld < MAX_HELD)
        held[nheld++] = (struct held_mutex){m, 1};
}

/* True when this unlock lets m go (its outermost hold, or one not seen). */
static bool held_pop(const pthread_mutex_t *m)
{
    for (int i = 0; i < nheld; i++)
        if (held[i].m == m) {
            if (--held[i].depth > 0)
                return false;
            held[i] = held[--nheld];
            return true;
        }
    return true;
}

typedef struct lock_wait {
    const void *lock; /* NULL: a free entry */
    int waiters;      /* participants blocked on it */
    int credits;      /* of those, counted running by an unlock */
} lock_wait;

/* Threads joined at once (the run layer joins its workers one by one). */
#define MAX_JOINS 64

/* Locks waited for at once; with more, a waiter counts itself running
 * when it gets the lock (the clock may move once before that). */
#define MAX_LOCK_WAITS 256

/* A thread waiting on the model; with `c`, also for a signal of c. */
typedef struct model_waiter {
    struct model_waiter *next;
    const um__cond *c;
    bool woken;
} model_waiter;

typedef struct sleeper {
    struct sleeper *next;
    uint64_t t;
    pthread_cond_t cv;
    bool fired;
} sleeper;

static struct {
    pthread_mutex_t lock;
    _Atomic uint64_t now;
    int active;       /* participants that can run */
    int joiners;      /* participants blocked in um__vt_join */
    /* The threads being joined: one that exits hands its count as
     * running to its joiner, which runs on from then. */
    struct {
        pthread_t t;
        bool used, handed;
    } joined[MAX_JOINS];
    /* Threads that exited before anyone joined them: their joiner finds
     * them gone and does not block (blocking let the clock move while it
     * could run: the run layer joins its workers one after another). */
    struct {
        pthread_t t;
        bool used;
    } exited[MAX_JOINS];
    int cond_waiters; /* participants in um__cond_wait */
    sleeper *sleepers;
    pthread_cond_t model_cv;
    /* The threads waiting on the model, each with its own record: a
     * change wakes exactly the threads waiting when it happened, so one
     * that waits again at once cannot take another's wake-up (a shared
     * count of wake-ups did that, and left a task worker asleep for tens
     * of virtual milliseconds after its kernel had ended). */
    struct model_waiter *model_list;
    int model_waiters;
    um__vt_model model;
    lock_wait locks[MAX_LOCK_WAITS];
    uint64_t activity; /* bumped by every call that blocks or wakes */
    um__vt_stats stats;
    bool stall_logged;
    /* The watchdog (not a participant). */
    pthread_t watchdog;
    pthread_cond_t watchdog_cv;
    bool watchdog_quit, watchdog_started;
} vt = {.lock = PTHREAD_MUTEX_INITIALIZER,
        .model_cv = PTHREAD_COND_INITIALIZER,
        .watchdog_cv = PTHREAD_COND_INITIALIZER};

/* Real time the clock waits for a participant that counts as running
 * before it moves anyway (a wait it cannot see). Far longer than any step
 * of the runtime takes. */
#define WATCHDOG_NS 500000000ull

uint64_t um__vt_now(void)
{
    return atomic_load_explicit(&vt.now, memory_order_acquire);
}

static uint64_t real_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Counts the model's waiters running and wakes them: all of them, or
 * (c given) up to n of those that also wait for c. */
static int wake_waiters(const um__cond *c, uint64_t n)
{
    int woken = 0;
    for (model_waiter *w = vt.model_list; w && (uint64_t)woken < n; w = w->next)
        if (!w->woken && (!c || w->c == c)) {
            w->woken = true;
            woken++;
        }
    if (woken) {
        vt.active += woken;
        vt.activity++;
        pthread_cond_broadcast(&vt.model_cv);
    }
    return woken;
}

static void wake_model_waiters(void) { (void)wake_waiters(NULL, UINT64_MAX); }

/* Moves the clock to the next event and wakes what it ends; false when
 * nothing is scheduled. Lock held; called when no participant can run (or
 * by the watchdog). */
static bool step(void)
{
    uint64_t t = UINT64_MAX;
    for (sleeper *s = vt.sleepers; s; s = s->next)
        if (!s->fired && s->t < t)
            t = s->t;
    if (vt.model.next) {
        uint64_t m = vt.model.next(vt.model.self);
        if (m < t)
            t = m;
    }
    if (t == UINT64_MAX) {
        /* Threads being joined end this way, and so does a run whose
         * threads have all left; anything else waits forever. */
        if (vt.joiners || vt.cond_waiters + vt.model_waiters == 0)
            return false;
        vt.stats.stalls++;
        if (!vt.stall_logged) {
            vt.stall_logged = true;
            um__log(UM_LOG_ERROR,
                    "virtual time: every thread waits and nothing is scheduled (%d on the "
                    "device model, %d on conditions) at %.6f s",
                    vt.model_waiters, vt.cond_waiters, (double)um__vt_now() / 1e9);
        }
        return false;
    }
    if (t > um__vt_now())
        atomic_store_explicit(&vt.now, t, memory_order_release);
    t = um__vt_now();
    vt.stats.steps++;
    vt.activity++;
    if (vt.model.advance)
        vt.model.advance(vt.model.self, t);
    for (sleeper *s = vt.sleepers; s; s = s->next)
        if (!s->fired && s->t <= t) {
            s->fired = true;
            vt.active++;
            pthread_cond_signal(&s->cv);
        }
    wake_model_waiters();
    return true;
}

/* Steps until something runs again: an event of the model may end
 * nothing anyone waits for. */
static void run_clock(void)
{
    while (vt.active == 0 && step())
        ;
}

/* The calling participant stops running (lock held). */
static void block_locked(void)
{
    vt.activity++;
    if (--vt.active == 0)
        run_clock();
}

static void credit_locked(int n)
{
    vt.activity++;
    vt.active += n;
}

static uint64_t cpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *watchdog_main(void *arg)
{
    UM_UNUSED(arg);
    pthread_mutex_lock(&vt.lock);
    uint64_t seen = vt.activity, since = real_now_ns(), cpu = cpu_now_ns();
    while (!vt.watchdog_quit) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        (void)pthread_cond_timedwait(&vt.watchdog_cv, &vt.lock, &ts);
        uint64_t now = real_now_ns(), cpu_then = cpu;
        cpu = cpu_now_ns();
        /* A thread that computes (the process uses a tenth of a core or
         * more) is running, not stuck. */
        if (vt.activity != seen || vt.active == 0 || cpu - cpu_then > 10000000) {
            seen = vt.activity;
            since = now;
        } else if (now - since > WATCHDOG_NS) {
            if (step()) {
                vt.stats.forced++;
                um__log(UM_LOG_WARN,
                        "virtual time: no thread moved for %.1f s of real time while %d "
                        "counted as running; the clock was moved to %.6f s",
                        (double)(now - since) / 1e9, vt.active, (double)um__vt_now() / 1e9);
            }
            seen = vt.activity;
            since = now;
        }
    }
    pthread_mutex_unlock(&vt.lock);
    return NULL;
}

um_status um__vt_start(void)
{
    pthread_mutex_lock(&vt.lock);
    if (um__vt_on()) {
        pthread_mutex_unlock(&vt.lock);
        return um__fail(UM_ERR_BUSY, "virtual_time: another context of this process already "
                                     "runs in virtual time (one at a time)");
    }
    atomic_store_explicit(&vt.now, 0, memory_order_relaxed);
    nheld = 0; /* what an earlier virtual run may have left in this thread */
    vt.active = 1;
    vt.joiners = vt.cond_waiters = 0;
    memset(vt.joined, 0, sizeof vt.joined);
    memset(vt.exited, 0, sizeof vt.exited);
    vt.sleepers = NULL;
    vt.model_list = NULL;
    vt.model_waiters = 0;
    vt.model = (um__vt_model){0};
    memset(vt.locks, 0, sizeof vt.locks);
    vt.stats = (um__vt_stats){0};
    vt.stall_logged = false;
    vt.watchdog_quit = false;
    atomic_store_explicit(&um__vt_active, true, memory_order_release);
    vt.watchdog_started = pthread_create(&vt.watchdog, NULL, watchdog_main, NULL) == 0;
    pthread_mutex_unlock(&vt.lock);
    return UM_OK;
}

void um__vt_stop(void)
{
    pthread_mutex_lock(&vt.lock);
    if (!um__vt_on()) {
        pthread_mutex_unlock(&vt.lock);
        return;
    }
    vt.watchdog_quit = true;
    pthread_cond_signal(&vt.watchdog_cv);
    bool started = vt.watchdog_started;
    vt.watchdog_started = false;
    pthread_mutex_unlock(&vt.lock);
    if (started)
        pthread_join(vt.watchdog, NULL);
    pthread_mutex_lock(&vt.lock);
    vt.model = (um__vt_model){0};
    atomic_store_explicit(&um__vt_active, false, memory_order_release);
    pthread_mutex_unlock(&vt.lock);
}

void um__vt_set_model(const um__vt_model *m)
{
    pthread_mutex_lock(&vt.lock);
    vt.model = m ? *m : (um__vt_model){0};
    pthread_mutex_unlock(&vt.lock);
}

void um__vt_lock(void) { pthread_mutex_lock(&vt.lock); }
void um__vt_unlock(void) { pthread_mutex_unlock(&vt.lock); }

static void model_wait_register(model_waiter *me, const um__cond *c)
{
    *me = (model_waiter){vt.model_list, c, false};
    vt.model_list = me;
    vt.model_waiters++;
}

/* Blocks until *me is woken, then unregisters it (lock held). A wake-up
 * that came before this call counted it running twice, which blocking
 * here evens out. */
static void model_wait_finish(model_waiter *me)
{
    block_locked();
    while (!me->woken)
        pthread_cond_wait(&vt.model_cv, &vt.lock);
    model_waiter **p = &vt.model_list;
    while (*p != me)
        p = &(*p)->next;
    *p = me->next;
    vt.model_waiters--;
}

void um__vt_wait_model_locked(void)
{
    model_waiter me;
    model_wait_register(&me, NULL);
    model_wait_finish(&me);
}

void um__vt_model_changed_locked(void) { wake_model_waiters(); }

void um__sleep_until_ns(uint64_t t)
{
    if (!um__vt_on()) {
        for (uint64_t now = real_now_ns(); now < t; now = real_now_ns()) {
            struct timespec ts = {(time_t)((t - now) / 1000000000u),
                                  (long)((t - now) % 1000000000u)};
            nanosleep(&ts, NULL);
        }
        return;
    }
    pthread_mutex_lock(&vt.lock);
    if (t > um__vt_now()) {
        sleeper s = {.next = vt.sleepers, .t = t, .fired = false};
        pthread_cond_init(&s.cv, NULL);
        vt.sleepers = &s;
        block_locked();
        while (!s.fired)
            pthread_cond_wait(&s.cv, &vt.lock);
        sleeper **p = &vt.sleepers;
        while (*p != &s)
            p = &(*p)->next;
        *p = s.next;
        pthread_cond_destroy(&s.cv);
    }
    pthread_mutex_unlock(&vt.lock);
}

void um__vt_spawn(void)
{
    if (!um__vt_on())
        return;
    pthread_mutex_lock(&vt.lock);
    credit_locked(1);
    pthread_mutex_unlock(&vt.lock);
}

void um__vt_exit(void)
{
    if (!um__vt_on())
        return;
    pthread_mutex_lock(&vt.lock);
    for (int i = 0; i < MAX_JOINS; i++)
        if (vt.joined[i].used && !vt.joined[i].handed &&
            pthread_equal(vt.joined[i].t, pthread_self())) {
            /* Its joiner runs on in this thread's place. */
            vt.joined[i].handed = true;
            vt.activity++;
            pthread_mutex_unlock(&vt.lock);
            return;
        }
    for (int i = 0; i < MAX_JOINS; i++)
        if (!vt.exited[i].used) {
            vt.exited[i].t = pthread_self();
            vt.exited[i].used = true;
            break;
        }
    block_locked();
    pthread_mutex_unlock(&vt.lock);
}

void um__vt_unspawn(void)
{
    if (!um__vt_on())
        return;
    pthread_mutex_lock(&vt.lock);
    block_locked();
    pthread_mutex_unlock(&vt.lock);
}

int um__vt_join(pthread_t t, void **ret)
{
    if (!um__vt_on())
        return pthread_join(t, ret);
    pthread_mutex_lock(&vt.lock);
    for (int i = 0; i < MAX_JOINS; i++)
        if (vt.exited[i].used && pthread_equal(vt.exited[i].t, t)) {
            /* Gone already: its count went with it, and this thread runs on. */
            vt.exited[i].used = false;
            pthread_mutex_unlock(&vt.lock);
            return pthread_join(t, ret);
        }
    int slot = -1;
    for (int i = 0; i < MAX_JOINS && slot < 0; i++)
        if (!vt.joined[i].used)
            slot = i;
    if (slot >= 0)
        vt.joined[slot].t = t, vt.joined[slot].used = true, vt.joined[slot].handed = false;
    vt.joiners++;
    block_locked();
    pthread_mutex_unlock(&vt.lock);
    int rc = pthread_join(t, ret);
    pthread_mutex_lock(&vt.lock);
    vt.joiners--;
    if (slot < 0 || !vt.joined[slot].handed)
        credit_locked(1); /* it had left without a handover */
    if (slot >= 0)
        vt.joined[slot].used = false;
    pthread_mutex_unlock(&vt.lock);
    return rc;
}

/* ------------------------------------------------------------- locks */

/* The locks participants wait for, under the clock's lock: a handful at
 * a time, so a short array. */
static lock_wait *lock_entry(const void *lock, bool make)
{
    lock_wait *free_slot = NULL;
    for (int i = 0; i < MAX_LOCK_WAITS; i++) {
        if (vt.locks[i].lock == lock)
            return &vt.locks[i];
        if (!vt.locks[i].lock && !free_slot)
            free_slot = &vt.locks[i];
    }
    if (make && free_slot) {
        *free_slot = (lock_wait){lock, 0, 0};
        return free_slot;
    }
    return NULL;
}

/* The caller holds the lock now, so the waiters an unlock counted running
 * but that did not get it are blocked again. */
static void took_lock_locked(const void *lock)
{
    lock_wait *e = lock_entry(lock, false);
    if (e) {
        vt.active -= e->credits;
        e->credits = 0;
    }
}

bool um__vt_blocked_begin(const void *lock, bool (*try_take)(const void *lock))
{
    if (!um__vt_on())
        return false;
    pthread_mutex_lock(&vt.lock);
    /* Tried again under the clock's lock: a release from now on sees this
     * thread registered and counts it running. */
    if (try_take(lock)) {
        took_lock_locked(lock);
        pthread_mutex_unlock(&vt.lock);
        return true;
    }
    lock_wait *e = lock_entry(lock, true);
    if (e)
        e->waiters++;
    block_steps = vt.stats.steps;
    block_locked();
    pthread_mutex_unlock(&vt.lock);
    return false;
}

void um__vt_blocked_end(const void *lock)
{
    if (!um__vt_on())
        return;
    pthread_mutex_lock(&vt.lock);
    lock_wait *e = lock_entry(lock, false);
    if (e && e->credits) {
        e->credits--; /* the release counted this thread running */
    } else {
        credit_locked(1);
        if (vt.stats.steps != block_steps)
            vt.stats.early_moves++;
    }
    took_lock_locked(lock);
    if (e && --e->waiters == 0)
        e->lock = NULL;
    pthread_mutex_unlock(&vt.lock);
}

/* One waiter of lock counted running (lock held). */
static void credit_waiter_locked(const void *lock)
{
    lock_wait *e = lock_entry(lock, false);
    if (e && e->waiters > e->credits) {
        e->credits++;
        credit_locked(1);
    }
}

void um__vt_release(const void *lock, void (*release)(const void *lock))
{
    if (!um__vt_on()) {
        release(lock);
        return;
    }
    pthread_mutex_lock(&vt.lock);
    credit_waiter_locked(lock);
    release(lock);
    pthread_mutex_unlock(&vt.lock);
}

void um__vt_took(const void *lock)
{
    if (!um__vt_on())
        return;
    pthread_mutex_lock(&vt.lock);
    took_lock_locked(lock);
    pthread_mutex_unlock(&vt.lock);
}

static void mutex_release(const void *lock)
{
    pthread_mutex_unlock((pthread_mutex_t *)(uintptr_t)lock);
}

static bool mutex_try(const void *lock)
{
    return pthread_mutex_trylock((pthread_mutex_t *)lock) == 0;
}

void um__vt_mutex_lock(pthread_mutex_t *m)
{
    if (!um__vt_on()) {
        pthread_mutex_lock(m);
        return;
    }
    if (pthread_mutex_trylock(m) == 0) {
        um__vt_took(m);
    } else if (!um__vt_blocked_begin(m, mutex_try)) {
        pthread_mutex_lock(m);
        um__vt_blocked_end(m);
    }
    held_push(m);
}

bool um__vt_mutex_trylock(pthread_mutex_t *m)
{
    if (pthread_mutex_trylock(m) != 0)
        return false;
    if (um__vt_on()) {
        um__vt_took(m);
        held_push(m);
    }
    return true;
}

void um__vt_mutex_unlock(pthread_mutex_t *m)
{
    if (!um__vt_on() || !held_pop(m)) {
        pthread_mutex_unlock(m);
        return;
    }
    /* The waiter is counted before the lock is free, under the clock's
     * lock, so that a thread that takes it first (and so blocks that
     * waiter again) can only uncount it after. */
    um__vt_release(m, mutex_release);
}

/* ------------------------------------------------------ condition vars */

int um__cond_init(um__cond *c)
{
    c->arrived = c->woken = 0;
    int rc = pthread_mutex_init(&c->inner, NULL);
    if (rc == 0 && (rc = pthread_cond_init(&c->c, NULL)) != 0)
        pthread_mutex_destroy(&c->inner);
    return rc;
}

void um__cond_destroy(um__cond *c)
{
    pthread_cond_destroy(&c->c);
    pthread_mutex_destroy(&c->inner);
}

/* In virtual time the wait lets go of m through um__vt_mutex_unlock and
 * takes it back through um__vt_mutex_lock, so that the clock sees both
 * (pthread_cond_wait's own release and re-acquisition it cannot see), and
 * sleeps on the inner mutex until a wake-up counted it running. */
void um__cond_wait(um__cond *c, pthread_mutex_t *m)
{
    if (!um__vt_on()) {
        pthread_cond_wait(&c->c, m);
        return;
    }
    pthread_mutex_lock(&c->inner);
    uint64_t ticket = c->arrived++;
    pthread_mutex_unlock(&c->inner);
    um__vt_mutex_unlock(m);
    pthread_mutex_lock(&vt.lock);
    vt.cond_waiters++;
    block_locked();
    pthread_mutex_unlock(&vt.lock);
    pthread_mutex_lock(&c->inner);
    while (c->woken <= ticket)
        pthread_cond_wait(&c->c, &c->inner);
    pthread_mutex_unlock(&c->inner);
    pthread_mutex_lock(&vt.lock);
    vt.cond_waiters--;
    pthread_mutex_unlock(&vt.lock);
    um__vt_mutex_lock(m);
}

void um__cond_wait_progress(um__cond *c, pthread_mutex_t *m, uint64_t poll_ns)
{
    if (!um__vt_on()) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + poll_ns;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        (void)pthread_cond_timedwait(&c->c, m, &ts);
        return;
    }
    /* Registered before m is let go: a signal sent from then on finds it. */
    model_waiter me;
    pthread_mutex_lock(&vt.lock);
    model_wait_register(&me, c);
    pthread_mutex_unlock(&vt.lock);
    um__vt_mutex_unlock(m);
    pthread_mutex_lock(&vt.lock);
    model_wait_finish(&me);
    pthread_mutex_unlock(&vt.lock);
    um__vt_mutex_lock(m);
}

static void cond_wake(um__cond *c, bool all)
{
    if (!um__vt_on()) {
        if (all)
            pthread_cond_broadcast(&c->c);
        else
            pthread_cond_signal(&c->c);
        return;
    }
    pthread_mutex_lock(&c->inner);
    uint64_t n = c->arrived - c->woken;
    if (n > 0) {
        if (!all)
            n = 1;
        c->woken += n;
        pthread_mutex_lock(&vt.lock);
        credit_locked((int)n);
        pthread_mutex_unlock(&vt.lock);
        pthread_cond_broadcast(&c->c);
    }
    if (n == 0 || all) {
        /* Threads in um__cond_wait_progress wait on the model's side. */
        pthread_mutex_lock(&vt.lock);
        (void)wake_waiters(c, all ? UINT64_MAX : 1);
        pthread_mutex_unlock(&vt.lock);
    }
    pthread_mutex_unlock(&c->inner);
}

void um__cond_signal(um__cond *c) { cond_wake(c, false); }
void um__cond_broadcast(um__cond *c) { cond_wake(c, true); }

void um__vt_stats_get(um__vt_stats *out)
{
    pthread_mutex_lock(&vt.lock);
    *out = vt.stats;
    pthread_mutex_unlock(&vt.lock);
}
