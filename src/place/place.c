/* Placement policies and performance history; see place.h. */
#include "place.h"

#include "../base/vtime.h"

#include <stdlib.h>
#include <string.h>

/* History: an open-addressing table keyed by (name, size class, device).
 * A key lives in the HISTORY_PROBE slots from its hash; when they are all
 * taken by other keys, a new one replaces the least used of them, so the
 * table keeps learning once full and a lookup never scans further. */
#define HISTORY_SLOTS 4096
#define HISTORY_PROBE 32
/* Weight of a new measurement in the running averages. */
#define LEARN_WEIGHT 0.25

typedef struct history_slot {
    uint64_t key;   /* 0: empty */
    double ns;      /* running average of the compute time */
    uint32_t count;
} history_slot;

struct um__place {
    um__place_env env;
    um__place_room room;
    int policy;
    pthread_mutex_t lock;
    int next;                            /* round_robin's next device */
    history_slot history[HISTORY_SLOTS];
    double ns_per_flop[UM_MAX_DEVICES];  /* 0: not measured yet */
};

um__place *um__place_create(const um__place_env *env, int policy)
{
    um__place *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->env = *env;
    p->policy = policy;
    pthread_mutex_init(&p->lock, NULL);
    return p;
}

void um__place_set_room(um__place *p, const um__place_room *room)
{
    p->room = *room;
}

void um__place_destroy(um__place *p)
{
    if (!p)
        return;
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* ------------------------------------------------------------ history */

static uint64_t history_key(const um__place_task *t, int dev)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *c = t->name ? t->name : ""; *c; c++)
        h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
    /* Size classes of a power of two: a task's time depends on its size. */
    uint64_t size_class = t->bytes ? (uint64_t)(63 - __builtin_clzll((unsigned long long)t->bytes))
                                   : 0;
    h = (h ^ (size_class << 8) ^ (uint64_t)dev) * 0x100000001b3ull;
    return h ? h : 1;
}

/* The slot of key (under lock): its own, or else the empty one to take,
 * or else (its slots all hold other keys) the least used of them, for
 * learn to take over; the caller tells them apart by s->key. Slots are
 * never emptied, so a key's own slot always comes before any empty one. */
static history_slot *history_find(um__place *p, uint64_t key)
{
    history_slot *victim = NULL;
    for (uint32_t i = 0; i < HISTORY_PROBE; i++) {
        history_slot *s = &p->history[(key + i) % HISTORY_SLOTS];
        if (s->key == key || s->key == 0)
            return s;
        if (!victim || s->count < victim->count)
            victim = s;
    }
    return victim;
}

/* What is known of t on dev: its history there, else the device's time
 * per flop on other tasks; 0 when neither. */
static double known_locked(um__place *p, const um__place_task *t, int dev)
{
    uint64_t key = history_key(t, dev);
    history_slot *s = history_find(p, key);
    if (s->key == key && s->count)
        return s->ns;
    if (t->flops > 0 && p->ns_per_flop[dev] > 0)
        return t->flops * p->ns_per_flop[dev];
    return 0.0;
}

/* Until a device has run such a task, a task with a flops hint is
 * assumed to run at the device's nominal rate (what its hardware reports:
 * a host core's vector units, a GPU's multiprocessors, a sim device's
 * modelled speed), so that a device tens of times slower than another is
 * not handed a large task just to measure it. Without a hint or a nominal
 * rate it is assumed as fast as the mean of the devices that have run it
 * (or 1 ms when none has): unknown devices then share the work by their
 * queues and get measured, instead of all of it going to the first. */
#define UNKNOWN_TASK_NS 1e6

static double estimate_locked(um__place *p, const um__place_task *t, int dev)
{
    double ns = known_locked(p, t, dev);
    if (ns > 0)
        return ns;
    double nominal = p->env.nominal_gflops(p->env.arg, dev);
    if (t->flops > 0 && nominal > 0)
        return t->flops / nominal; /* GFLOP/s is flops per ns */
    double sum = 0.0;
    int known = 0;
    for (int d = 0; d < p->env.ndevices; d++) {
        double k = t->eligible[d] ? known_locked(p, t, d) : 0.0;
        if (k > 0) {
            sum += k;
            known++;
        }
    }
    return known ? sum / known : UNKNOWN_TASK_NS;
}

void um__place_learn(um__place *p, const um__place_task *t, int dev, uint64_t ns)
{
    um__vt_mutex_lock(&p->lock);
    uint64_t key = history_key(t, dev);
    history_slot *s = history_find(p, key);
    if (s->key != key) {
        /* Empty, or another key's to take over: it starts afresh. */
        s->key = key;
        s->count = 0;
    }
    if (!s->count)
        s->ns = (double)ns;
    else
        s->ns += LEARN_WEIGHT * ((double)ns - s->ns);
    if (s->count < UINT32_MAX)
        s->count++;
    if (t->flops > 0) {
        double per = (double)ns / t->flops;
        p->ns_per_flop[dev] = p->ns_per_flop[dev] > 0
                                  ? p->ns_per_flop[dev] + LEARN_WEIGHT * (per - p->ns_per_flop[dev])
                                  : per;
    }
    um__vt_mutex_unlock(&p->lock);
}

/* ----------------------------------------------------------- policies */

/* The bytes t's buffers take on dev (place.h: um__place_room). */
static size_t footprint(const um__place *p, const um__place_task *t, int dev)
{
    return p->room.footprint ? p->room.footprint(p->env.arg, t, dev) : t->bytes;
}

/* Whether every policy may place t on dev: t may run there (an
 * implementation, not forced elsewhere) and its footprint fits under the
 * device's memory limit (the host's memory is not limited). Placed where
 * it cannot fit, its acquisition fails; only cost checked this, and eager,
 * round_robin and locality put such tasks on an accelerator while the host
 * could run them. The footprint, not the plain sum of the sizes: the pool
 * reserves whole pages, and a task that fitted by the sum failed where the
 * host could have run it. *limit and *used (either may be NULL) get the
 * device's room; for the host they are left alone. */
static bool placeable(const um__place *p, const um__place_task *t, int dev, size_t *limit,
                      size_t *used)
{
    if (!t->eligible[dev])
        return false;
    if (dev == 0)
        return true;
    size_t lim, in_use;
    p->env.room(p->env.arg, dev, &lim, &in_use);
    if (limit)
        *limit = lim;
    if (used)
        *used = in_use;
    return footprint(p, t, dev) <= lim;
}

static int eager(const um__place *p, const um__place_task *t, const um__place_device *devs,
                 int n)
{
    int best = -1;
    for (int d = 1; d <= n; d++) {
        int dev = d % n; /* accelerators first, the host last */
        if (!placeable(p, t, dev, NULL, NULL) || devs[dev].full)
            continue;
        if (devs[dev].queued == 0)
            return dev;
        if (best < 0 || devs[dev].queued < devs[best].queued)
            best = dev;
    }
    return best;
}

static int round_robin(um__place *p, const um__place_task *t, const um__place_device *devs,
                       int n)
{
    for (int i = 0; i < n; i++) {
        int dev = (p->next + i) % n;
        if (placeable(p, t, dev, NULL, NULL) && !devs[dev].full) {
            p->next = (dev + 1) % n;
            return dev;
        }
    }
    return -1;
}

/* Input bytes of t already valid on dev, and what the missing ones cost. */
static size_t resident(const um__place *p, const um__place_task *t, int dev, double *fetch_ns)
{
    size_t bytes = 0;
    *fetch_ns = 0.0;
    for (int i = 0; i < t->nbuffers; i++) {
        if (t->modes[i] == UM_ACCESS_WRITE_DISCARD)
            continue;
        double ns;
        if (p->env.fetch_cost(p->env.arg, t, i, dev, &ns))
            bytes += p->env.input_bytes(p->env.arg, t, i);
        else
            *fetch_ns += ns;
    }
    return bytes;
}

static int locality(const um__place *p, const um__place_task *t, const um__place_device *devs,
                    int n)
{
    int best = -1;
    size_t best_bytes = 0;
    for (int d = 1; d <= n; d++) {
        int dev = d % n;
        if (!placeable(p, t, dev, NULL, NULL))
            continue;
        double ns;
        size_t bytes = resident(p, t, dev, &ns);
        if (best < 0 || bytes > best_bytes ||
            (bytes == best_bytes && devs[dev].queued_ns < devs[best].queued_ns)) {
            best = dev;
            best_bytes = bytes;
        }
    }
    return best >= 0 && devs[best].full ? -1 : best;
}

static int cost(um__place *p, const um__place_task *t, const um__place_device *devs, int n)
{
    int best = -1;
    bool best_full = false;
    double best_finish = 0.0;
    for (int d = 1; d <= n; d++) {
        int dev = d % n;
        size_t limit = 0, used = 0;
        if (!placeable(p, t, dev, &limit, &used))
            continue; /* it could never fit there */
        double fetch_ns;
        size_t have = resident(p, t, dev, &fetch_ns);
        size_t missing = t->bytes - (have < t->bytes ? have : t->bytes);
        double finish = devs[dev].queued_ns + fetch_ns + estimate_locked(p, t, dev);
        /* Short of room, the excess evicts data: written back and perhaps
         * fetched again, over the device's link to the host. Priced at the
         * missing inputs' rate instead, a task missing only its outputs
         * (WRITE_DISCARD) paid nothing to evict on a full device. */
        if (dev != 0 && missing > 0 && used + missing > limit) {
            size_t excess = used + missing - limit;
            finish += p->room.evict_ns ? p->room.evict_ns(p->env.arg, dev, excess)
                                       : 2.0 * fetch_ns * (double)excess / (double)missing;
        }
        if (best < 0 || finish < best_finish) {
            best = dev;
            best_finish = finish;
            /* A device that has not run such a task yet takes one at a
             * time until it has (calibration, as StarPU's): before any
             * history a slow device would look like the others and take
             * its share of all the tasks ready at the start. */
            best_full = devs[dev].full || (devs[dev].queued > 0 && known_locked(p, t, dev) <= 0);
        }
    }
    /* The best device is busy (or still calibrating): the task waits for
     * it rather than run where it would finish later. */
    return best >= 0 && best_full ? -1 : best;
}

int um__place_pick(um__place *p, const um__place_task *t, const um__place_device *devs,
                   double *est_ns)
{
    int n = p->env.ndevices;
    um__vt_mutex_lock(&p->lock);
    int dev;
    switch (p->policy) {
    case UM_SCHED_EAGER:
        dev = eager(p, t, devs, n);
        break;
    case UM_SCHED_ROUND_ROBIN:
        dev = round_robin(p, t, devs, n);
        break;
    case UM_SCHED_LOCALITY:
        dev = locality(p, t, devs, n);
        break;
    default:
        dev = cost(p, t, devs, n);
        break;
    }
    *est_ns = dev >= 0 ? estimate_locked(p, t, dev) : 0.0;
    um__vt_mutex_unlock(&p->lock);
    return dev;
}
