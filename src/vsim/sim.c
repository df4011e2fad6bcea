/* The virtual-time event loop; sim.h says the model. */
#include "sim.h"

#include "../base/options.h"
#include "../place/place.h"
#include "../base/flow.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* As the task runtime's workers (src/run/run.c): tasks prefetched ahead of
 * the one running, and tasks a device holds at once. */
#define PREFETCH_AHEAD 2
#define QUEUE_MAX 7

enum { FLOW_FETCH = 0, FLOW_WRITEBACK = 1, FLOW_FLUSH = 2 };

typedef struct vtask {
    bool staged;          /* its tiles are allocated (and fetches started) on dev */
    int dev;
    uint32_t waiting;     /* dependencies not done */
    double est_ns;
    int priority;         /* dag.h's, as the runtime engine submits it */
    um_access modes[UM_VS_MAX_ACCESS];
} vtask;

typedef struct vdev {
    uint64_t used;
    uint32_t queue[QUEUE_MAX]; /* placed tasks in order; [0] runs first */
    int nqueue;
    bool computing;
    uint32_t prefetched_for;   /* a device that runs one task at a time: the head task (+1)
                                * whose followers' inputs it prefetched */
    double compute_end, compute_start;
    double queued_ns;
} vdev;

typedef struct sim {
    const um__vs_machine *m;
    const um__vs_dag *d;
    int ndev;
    um__vs_net *net;
    um__place *place;
    vtask *t;
    vdev dev[UM_VS_MAX_DEVICES];
    /* Per tile: devices with a valid copy, with memory for it, with a
     * fetch in flight, written back or being so, and those whose write-back
     * in flight carries contents older than the tile's last write; per
     * tile and device: pins by staged tasks and the last use. */
    uint64_t *valid, *alloc, *arriving, *leaving, *stale;
    bool *written;
    uint16_t *pins;
    double *last_use;
    /* Dependents: rdeps[rfirst[i] .. rfirst[i+1]) wait for task i. */
    uint32_t *rfirst, *rdeps;
    /* Tasks made ready and not placed yet, by priority and, within one, in
     * the order they became ready. */
    uint32_t *ready;
    size_t nready, done;
    double now;
    um__vs_result *out;
} sim;

static inline size_t at(const sim *s, uint32_t tile, int dev)
{
    return (size_t)tile * (size_t)s->ndev + (size_t)dev;
}

static uint64_t flow_tag(int kind, uint32_t tile, int dev)
{
    return (uint64_t)tile << 8 | (uint64_t)dev << 2 | (uint64_t)kind;
}

static double kernel_time(const sim *s, const um__vs_task *t, int dev)
{
    return um__vs_compute_time(s->m, dev, t->kernel, t->tile, t->flops);
}

/* What a copy of bytes from src to dst would take alone on its route
 * (latency + bytes at the route's slowest link); INFINITY without one. A
 * resource the route crosses k times (a bus shared by both directions, on
 * the way through the host) gives it a k-th of its bandwidth, as the
 * network model does. */
static double route_secs(const sim *s, int src, int dst, double bytes)
{
    int route[4];
    double lat;
    int n = um__vs_route(s->m, src, dst, route, &lat);
    if (n < 0)
        return INFINITY;
    double bw = INFINITY;
    for (int i = 0; i < n; i++) {
        int times = 0;
        for (int j = 0; j < n; j++)
            times += route[j] == route[i];
        bw = fmin(bw, s->m->res_bandwidth[route[i]] / times);
    }
    return lat + bytes / bw;
}

/* The fastest valid copy of tile for dev, and what the copy would take
 * alone on its route. */
static int best_source(const sim *s, uint32_t tile, int dev, double *secs)
{
    int best = -1;
    double best_s = INFINITY;
    for (int src = 0; src < s->ndev; src++) {
        if (!(s->valid[tile] >> src & 1) || src == dev)
            continue;
        double t = route_secs(s, src, dev, (double)um__vs_tile_size(s->d, tile));
        if (t < best_s) {
            best_s = t;
            best = src;
        }
    }
    *secs = best_s;
    return best;
}

static int start_copy(sim *s, int kind, uint32_t tile, int src, int dst)
{
    int route[4];
    double lat;
    int n = um__vs_route(s->m, src, dst, route, &lat);
    double bytes = (double)um__vs_tile_size(s->d, tile);
    /* A write-back is tagged with its source (its destination is the
     * host): its end concerns that copy only. */
    int tagged = kind == FLOW_WRITEBACK ? src : dst;
    if (n < 0 || um__vs_net_start(s->net, s->now, route, n, bytes, lat,
                                  flow_tag(kind, tile, tagged)) != 0)
        return -1;
    s->out->copies++;
    s->out->bytes_moved += bytes;
    s->out->link_bytes[src][dst] += bytes;
    return 0;
}

/* ------------------------------------------------------ placement's view */

static double env_nominal_gflops(void *arg, int dev)
{
    const sim *s = arg;
    /* The rate of the biggest gemm tile the model knows, as a GPU reports
     * its multiprocessors' rate: a first guess until history exists. */
    double t = um__vs_compute_time(s->m, dev, UM_VS_GEMM, s->d->tile,
                                   2.0 * pow((double)s->d->tile, 3.0));
    return isfinite(t) && t > 0 ? 2.0 * pow((double)s->d->tile, 3.0) / t / 1e9 : 0.0;
}

static void env_room(void *arg, int dev, size_t *limit, size_t *used)
{
    const sim *s = arg;
    *limit = (size_t)s->m->dev[dev].memory;
    *used = (size_t)s->dev[dev].used;
}

/* Making room: bytes of dev's data written back to the host and fetched
 * again, as the runtime prices it (run.c: env_evict_ns). */
static double env_evict_ns(void *arg, int dev, size_t bytes)
{
    const sim *s = arg;
    double t = route_secs(s, dev, 0, (double)bytes) + route_secs(s, 0, dev, (double)bytes);
    return isfinite(t) ? t * 1e9 : 0.0;
}

static uint32_t task_index(const sim *s, const um__place_task *pt)
{
    return (uint32_t)((const um__vs_task *)pt->owner - s->d->tasks);
}

static bool env_fetch_cost(void *arg, const um__place_task *pt, int i, int dev, double *ns)
{
    const sim *s = arg;
    uint32_t tile = s->d->tasks[task_index(s, pt)].access[i].tile;
    if (s->valid[tile] >> dev & 1 || s->arriving[tile] >> dev & 1)
        return true;
    double secs;
    best_source(s, tile, dev, &secs);
    *ns = secs * 1e9;
    return false;
}

static size_t env_input_bytes(void *arg, const um__place_task *pt, int i)
{
    const sim *s = arg;
    return (size_t)um__vs_tile_size(s->d, s->d->tasks[task_index(s, pt)].access[i].tile);
}

/* The bytes of all of t's tiles; UINT64_MAX where they overflow (the sum
 * wrapped to a few bytes, which fit any device). */
static uint64_t task_bytes(const um__vs_dag *d, const um__vs_task *t)
{
    uint64_t bytes = 0;
    for (int i = 0; i < t->naccess; i++) {
        uint64_t size = um__vs_tile_size(d, t->access[i].tile);
        bytes = size > UINT64_MAX - bytes ? UINT64_MAX : bytes + size;
    }
    return bytes;
}

static void place_view(const sim *s, uint32_t ti, um__place_task *pt)
{
    const um__vs_task *t = &s->d->tasks[ti];
    memset(pt, 0, sizeof *pt);
    pt->name = um__vs_kernel_name((um__vs_kernel)t->kernel);
    pt->flops = t->flops;
    pt->nbuffers = t->naccess;
    pt->owner = t;
    pt->modes = s->t[ti].modes;
    pt->bytes = (size_t)task_bytes(s->d, t);
    for (int d = 0; d < s->ndev; d++)
        pt->eligible[d] = isfinite(kernel_time(s, t, d));
}

/* As the runtime orders its lists: after every task of ti's priority or a
 * higher one, at index `from` or later. */
static int insert_at(const sim *s, const uint32_t *list, int n, int from, uint32_t ti)
{
    int at = n;
    while (at > from && s->t[list[at - 1]].priority < s->t[ti].priority)
        at--;
    return at;
}

static void ready_add(sim *s, uint32_t ti)
{
    int at = insert_at(s, s->ready, (int)s->nready, 0, ti);
    memmove(s->ready + at + 1, s->ready + at, (s->nready - (size_t)at) * sizeof *s->ready);
    s->ready[at] = ti;
    s->nready++;
}

/* Into dev's queue: not before a task it has staged (the runtime's
 * launched ones), which keeps their order. */
static void queue_add(sim *s, vdev *v, uint32_t ti)
{
    int from = 0;
    while (from < v->nqueue && (from == 0 || s->t[v->queue[from]].staged))
        from++;
    int at = insert_at(s, v->queue, v->nqueue, from, ti);
    memmove(v->queue + at + 1, v->queue + at, (size_t)(v->nqueue - at) * sizeof v->queue[0]);
    v->queue[at] = ti;
    v->nqueue++;
}

/* Places ready tasks, by priority and then oldest first, where the policy says, as the
 * runtime's dispatch does (src/run/run.c): it stops when no device has
 * room, and after DISPATCH_MISSES tasks in a row that had a choice of
 * devices and waited for a full one. */
#define DISPATCH_MISSES 16

static void dispatch(sim *s)
{
    um__place_device devs[UM_MAX_DEVICES];
    size_t kept = 0, i = 0;
    int misses = 0;
    for (; i < s->nready; i++) {
        bool room = false;
        for (int d = 0; d < s->ndev; d++)
            room |= s->dev[d].nqueue < QUEUE_MAX;
        if (!room)
            break;
        uint32_t ti = s->ready[i];
        int eligible = 0, open = 0;
        um__place_task pt;
        place_view(s, ti, &pt);
        for (int d = 0; d < s->ndev; d++) {
            devs[d] = (um__place_device){s->dev[d].queued_ns, s->dev[d].nqueue,
                                         s->dev[d].nqueue >= QUEUE_MAX};
            eligible += pt.eligible[d];
            open += pt.eligible[d] && !devs[d].full;
        }
        bool choice = eligible > 1;
        double est;
        int dev = open && (!choice || misses < DISPATCH_MISSES)
                      ? um__place_pick(s->place, &pt, devs, &est)
                      : -1;
        if (dev < 0) {
            s->ready[kept++] = ti;
            misses += choice && open;
            continue;
        }
        misses = 0;
        vdev *v = &s->dev[dev];
        queue_add(s, v, ti);
        v->queued_ns += est;
        s->t[ti].dev = dev;
        s->t[ti].est_ns = est;
    }
    for (; i < s->nready; i++)
        s->ready[kept++] = s->ready[i];
    s->nready = kept;
}

/* ------------------------------------------------------------- memory */

/* Whether `bytes` more fit on dev. A device never holds more than its
 * memory, so the room left is a plain difference: used + bytes wrapped
 * for a buffer near 2^64 bytes (a recorded trace may name one) and let
 * it onto a device of 1 GiB. */
static bool has_room(const sim *s, int dev, uint64_t bytes)
{
    return bytes <= s->m->dev[dev].memory - s->dev[dev].used;
}

/* tile's memory on dev is taken (dev has room for it). */
static void take_memory(sim *s, uint32_t tile, int dev)
{
    s->alloc[tile] |= 1ull << dev;
    s->dev[dev].used += um__vs_tile_size(s->d, tile);
    if (s->dev[dev].used > s->out->peak_bytes[dev])
        s->out->peak_bytes[dev] = s->dev[dev].used;
}

static void free_copy(sim *s, uint32_t tile, int dev)
{
    if (!(s->alloc[tile] >> dev & 1) || dev == 0)
        return;
    s->alloc[tile] &= ~(1ull << dev);
    s->valid[tile] &= ~(1ull << dev);
    s->dev[dev].used -= um__vs_tile_size(s->d, tile);
}

/* Makes room for `bytes` more on dev: true when there is room now. An
 * eviction that must write back first leaves no room yet (the copy ends
 * later and frees it then). */
static bool make_room(sim *s, int dev, uint64_t bytes)
{
    if (dev == 0 || has_room(s, dev, bytes))
        return true;
    uint64_t bit = 1ull << dev;
    for (;;) {
        int64_t victim = -1;
        bool victim_clean = false;
        for (uint32_t tile = 0; tile < s->d->ntiles; tile++) {
            if (!(s->alloc[tile] & bit) || (s->arriving[tile] & bit) ||
                (s->leaving[tile] & bit) || s->pins[at(s, tile, dev)])
                continue;
            bool clean = (s->valid[tile] & ~bit) != 0;
            if (victim < 0 || (clean && !victim_clean) ||
                (clean == victim_clean &&
                 s->last_use[at(s, tile, dev)] < s->last_use[at(s, (uint32_t)victim, dev)])) {
                victim = tile;
                victim_clean = clean;
            }
        }
        if (victim < 0)
            return false;
        s->out->evictions++;
        if (victim_clean) {
            free_copy(s, (uint32_t)victim, dev);
            if (has_room(s, dev, bytes))
                return true;
            continue;
        }
        /* The only valid copy goes home before its memory is reused. */
        if (start_copy(s, FLOW_WRITEBACK, (uint32_t)victim, dev, 0) != 0)
            return false;
        s->leaving[victim] |= bit;
        s->out->writebacks++;
        return false;
    }
}

/* Allocates t's tiles on its device and starts the fetches of its inputs;
 * false when the device has no room yet (tried again at the next event). */
static bool stage(sim *s, uint32_t ti)
{
    const um__vs_task *t = &s->d->tasks[ti];
    int dev = s->t[ti].dev;
    uint64_t bit = 1ull << dev;
    int pinned = 0;
    bool ok = true;
    /* Each tile is pinned as soon as it has memory here, so that making
     * room for the next one cannot evict it. */
    for (int i = 0; i < t->naccess && ok; i++, pinned++) {
        uint32_t tile = t->access[i].tile;
        if (!(s->alloc[tile] & bit)) {
            if (!make_room(s, dev, um__vs_tile_size(s->d, tile))) {
                ok = false;
                break;
            }
            take_memory(s, tile, dev);
        }
        s->pins[at(s, tile, dev)]++;
        if ((t->access[i].mode & UM_VS_READ) && !(s->valid[tile] & bit) &&
            !(s->arriving[tile] & bit)) {
            double secs;
            int src = best_source(s, tile, dev, &secs);
            ok = src >= 0 && start_copy(s, FLOW_FETCH, tile, src, dev) == 0;
            if (ok)
                s->arriving[tile] |= bit;
        }
    }
    if (!ok) {
        for (int i = 0; i < pinned; i++)
            s->pins[at(s, t->access[i].tile, dev)]--;
        return false;
    }
    s->t[ti].staged = true;
    return true;
}

static bool inputs_here(const sim *s, uint32_t ti)
{
    const um__vs_task *t = &s->d->tasks[ti];
    uint64_t bit = 1ull << s->t[ti].dev;
    for (int i = 0; i < t->naccess; i++)
        if ((t->access[i].mode & UM_VS_READ) && !(s->valid[t->access[i].tile] & bit))
            return false;
    return true;
}

/* The runtime's prefetch on a worker that runs one task at a time: task
 * ti's input tiles are fetched to its device while they fit in its free
 * memory, without evicting, and without pinning or staging the task; false
 * once one does not fit (the runtime stops there). ti is placed, so its
 * dependencies are done and no task is writing its inputs. */
static bool prefetch_free(sim *s, uint32_t ti)
{
    const um__vs_task *t = &s->d->tasks[ti];
    int dev = s->t[ti].dev;
    uint64_t bit = 1ull << dev;
    for (int i = 0; i < t->naccess && dev != 0; i++) {
        uint32_t tile = t->access[i].tile;
        if (!(t->access[i].mode & UM_VS_READ) || (s->alloc[tile] & bit))
            continue;
        uint64_t size = um__vs_tile_size(s->d, tile);
        double secs;
        int src = has_room(s, dev, size) ? best_source(s, tile, dev, &secs) : -1;
        if (src < 0 || start_copy(s, FLOW_FETCH, tile, src, dev) != 0)
            return false;
        take_memory(s, tile, dev);
        s->arriving[tile] |= bit;
    }
    return true;
}

/* Stages the running task and the next PREFETCH_AHEAD, in order, and
 * starts the head's kernel when its inputs are there. A device that does
 * not launch ahead stages only its head; when a head is first taken up,
 * the next tasks' inputs are prefetched into free memory first, as the
 * runtime's worker does before it acquires the task it runs. */
static void pump(sim *s, int dev)
{
    vdev *v = &s->dev[dev];
    bool ahead = s->m->dev[dev].launches_ahead;
    if (!ahead && v->nqueue && v->prefetched_for != v->queue[0] + 1) {
        v->prefetched_for = v->queue[0] + 1;
        for (int q = 1; q < v->nqueue && q <= PREFETCH_AHEAD; q++)
            if (!prefetch_free(s, v->queue[q]))
                break;
    }
    for (int q = 0; q < v->nqueue && q <= (ahead ? PREFETCH_AHEAD : 0); q++) {
        uint32_t ti = v->queue[q];
        if (!s->t[ti].staged && !stage(s, ti))
            break;
    }
    if (v->computing || !v->nqueue)
        return;
    uint32_t ti = v->queue[0];
    if (!s->t[ti].staged || !inputs_here(s, ti))
        return;
    /* A GPU's task that starts as its previous one ends was launched
     * beside it on the streams: it adds its packed time (machine.h). */
    bool behind = ahead && v->compute_start < v->compute_end && v->compute_end == s->now;
    const um__vs_task *t = &s->d->tasks[ti];
    v->computing = true;
    v->compute_start = s->now;
    v->compute_end = s->now + (behind ? um__vs_packed_time(s->m, dev, t->kernel, t->tile, t->flops)
                                      : kernel_time(s, t, dev));
}

static void task_done(sim *s, int dev)
{
    vdev *v = &s->dev[dev];
    uint32_t ti = v->queue[0];
    const um__vs_task *t = &s->d->tasks[ti];
    uint64_t bit = 1ull << dev;
    for (int i = 0; i < t->naccess; i++) {
        uint32_t tile = t->access[i].tile;
        s->pins[at(s, tile, dev)]--;
        s->last_use[at(s, tile, dev)] = s->now;
        if (t->access[i].mode & UM_VS_WRITE) {
            /* The new contents exist here only; every older copy goes. */
            for (int o = 1; o < s->ndev; o++)
                if (o != dev && (s->alloc[tile] >> o & 1) && !s->pins[at(s, tile, o)] &&
                    !(s->arriving[tile] >> o & 1) && !(s->leaving[tile] >> o & 1))
                    free_copy(s, tile, o);
            s->valid[tile] = bit;
            s->written[tile] = true;
            /* A write-back of the tile in flight, from this device too (a
             * staged task took its copy again while it left), now carries
             * old contents: the host must not count it as current. */
            s->stale[tile] |= s->leaving[tile];
        }
    }
    double ran = s->now - v->compute_start;
    s->out->busy_s[dev] += ran;
    s->out->tasks_on[dev]++;
    um__place_task pt;
    place_view(s, ti, &pt);
    um__place_learn(s->place, &pt, dev, (uint64_t)llround(ran * 1e9));
    v->queued_ns -= s->t[ti].est_ns;
    if (v->queued_ns < 0 || v->nqueue == 1)
        v->queued_ns = 0;
    memmove(v->queue, v->queue + 1, (size_t)(v->nqueue - 1) * sizeof v->queue[0]);
    v->nqueue--;
    v->computing = false;
    s->done++;
    um__vs_task_ended();
    s->out->makespan_s = s->now;
    for (uint32_t k = s->rfirst[ti]; k < s->rfirst[ti + 1]; k++) {
        uint32_t dep = s->rdeps[k];
        if (--s->t[dep].waiting == 0)
            ready_add(s, dep);
    }
}

static void flow_done(sim *s, uint64_t tag)
{
    int kind = (int)(tag & 3), dev = (int)(tag >> 2 & 63);
    uint32_t tile = (uint32_t)(tag >> 8);
    if (kind == FLOW_FETCH) {
        s->arriving[tile] &= ~(1ull << dev);
        s->valid[tile] |= 1ull << dev;
        return;
    }
    if (kind == FLOW_FLUSH) {
        s->valid[tile] |= 1ull;
        return;
    }
    /* A write-back from dev: the host holds the tile now, unless it was
     * written since the copy started, elsewhere (dev's copy is then old)
     * or on dev itself by a task that took the copy again (stale: what
     * reached the host is old, and dev holds the only current copy, which
     * the host once took as home, so that it was freed and never went
     * home). dev's copy frees its memory unless a staged task took it
     * again or it is the only current one. Another device's write-back of
     * the tile is not this one's business (all of them used to end at the
     * first). */
    uint64_t bit = 1ull << dev;
    if ((s->valid[tile] & bit) && !(s->stale[tile] & bit))
        s->valid[tile] |= 1ull;
    s->stale[tile] &= ~bit;
    if (s->leaving[tile] & bit) {
        s->leaving[tile] &= ~bit;
        if (!s->pins[at(s, tile, dev)] && s->valid[tile] != bit)
            free_copy(s, tile, dev);
    }
}

/* ------------------------------------------------------------ the loop */

static void sim_free(sim *s)
{
    um__vs_net_destroy(s->net);
    um__place_destroy(s->place);
    free(s->t);
    free(s->valid);
    free(s->alloc);
    free(s->arriving);
    free(s->leaving);
    free(s->stale);
    free(s->written);
    free(s->pins);
    free(s->last_use);
    free(s->rfirst);
    free(s->rdeps);
    free(s->ready);
}

static um_status sim_init(sim *s, const um__vs_machine *m, const um__vs_dag *d, int policy,
                          um__vs_result *out)
{
    memset(s, 0, sizeof *s);
    s->m = m;
    s->d = d;
    s->ndev = m->ndev;
    s->out = out;
    size_t nt = d->ntasks, cells = (size_t)d->ntiles * (size_t)m->ndev;
    s->net = um__vs_net_create(m->nres, m->res_bandwidth);
    um__place_env env = {m->ndev, s, env_nominal_gflops, env_room, env_fetch_cost,
                         env_input_bytes};
    s->place = um__place_create(&env, policy);
    /* The simulated devices hold tiles byte for byte (no pages), so the
     * footprint stays the plain sum. */
    if (s->place)
        um__place_set_room(s->place, &(um__place_room){NULL, env_evict_ns});
    s->t = calloc(nt ? nt : 1, sizeof *s->t);
    s->valid = calloc(d->ntiles, sizeof *s->valid);
    s->alloc = calloc(d->ntiles, sizeof *s->alloc);
    s->arriving = calloc(d->ntiles, sizeof *s->arriving);
    s->leaving = calloc(d->ntiles, sizeof *s->leaving);
    s->stale = calloc(d->ntiles, sizeof *s->stale);
    s->written = calloc(d->ntiles, sizeof *s->written);
    s->pins = calloc(cells, sizeof *s->pins);
    s->last_use = calloc(cells, sizeof *s->last_use);
    s->rfirst = calloc(nt + 1, sizeof *s->rfirst);
    s->rdeps = calloc(d->ndeps_total ? d->ndeps_total : 1, sizeof *s->rdeps);
    s->ready = calloc(nt ? nt : 1, sizeof *s->ready);
    if (!s->net || !s->place || !s->t || !s->valid || !s->alloc || !s->arriving || !s->leaving ||
        !s->stale || !s->written || !s->pins || !s->last_use || !s->rfirst || !s->rdeps || !s->ready)
        return um__fail(UM_ERR_NOMEM, "sim: no memory for a graph of %zu tasks and %u tiles",
                        nt, d->ntiles);
    um_status st = um__vs_check_copies(m, d->tile_bytes);
    if (st != UM_OK)
        return st;
    /* Every tile starts on the host, where the program made it, and stays
     * there (its memory is never given back). */
    for (uint32_t tile = 0; tile < d->ntiles; tile++) {
        s->valid[tile] = s->alloc[tile] = 1;
        s->out->peak_bytes[0] += um__vs_tile_size(d, tile);
    }
    int *prio = malloc((nt ? nt : 1) * sizeof *prio);
    if (!prio || um__vs_dag_priorities(d, prio) != 0) {
        free(prio);
        return um__fail(UM_ERR_NOMEM, "sim: no memory for the tasks' priorities");
    }
    for (size_t i = 0; i < nt; i++)
        s->t[i].priority = prio[i];
    free(prio);
    for (size_t i = 0; i < nt; i++) {
        const um__vs_task *t = &d->tasks[i];
        s->t[i].waiting = t->ndeps;
        for (int a = 0; a < t->naccess; a++)
            s->t[i].modes[a] = t->access[a].mode == UM_VS_READ    ? UM_ACCESS_READ
                               : t->access[a].mode == UM_VS_WRITE ? UM_ACCESS_WRITE_DISCARD
                                                                  : UM_ACCESS_READ_WRITE;
        bool can_run = false;
        for (int dev = 0; dev < m->ndev; dev++) {
            double alone = kernel_time(s, t, dev);
            double packed = um__vs_packed_time(m, dev, t->kernel, t->tile, t->flops);
            can_run |= isfinite(alone);
            /* As the runtime engine refuses it: a time this long swallows
             * every copy in the clock's rounding (a 2e15 s gemm left a
             * makespan with no transfer in it), and its nanoseconds, which
             * the placement learns, overflow. */
            if (isfinite(alone) && fmax(alone, packed) > UM_VS_MAX_SECONDS)
                return um__fail(UM_ERR_INVALID, "sim: a %s task of machine %s takes %g s on "
                                "%s, more than the simulator's %g s",
                                um__vs_kernel_name((um__vs_kernel)t->kernel), m->name,
                                fmax(alone, packed), m->dev[dev].name, UM_VS_MAX_SECONDS);
        }
        if (!can_run)
            return um__fail(UM_ERR_INVALID, "sim: no device of machine %s runs %s tiles of %u",
                            m->name, um__vs_kernel_name((um__vs_kernel)t->kernel), t->tile);
        for (uint32_t k = 0; k < t->ndeps; k++)
            s->rfirst[d->deps[t->first_dep + k] + 1]++;
    }
    for (size_t i = 0; i < nt; i++)
        s->rfirst[i + 1] += s->rfirst[i];
    uint32_t *fill = calloc(nt ? nt : 1, sizeof *fill);
    if (!fill)
        return um__fail(UM_ERR_NOMEM, "sim: no memory for the dependents");
    for (size_t i = 0; i < nt; i++) {
        const um__vs_task *t = &d->tasks[i];
        for (uint32_t k = 0; k < t->ndeps; k++) {
            uint32_t dep = d->deps[t->first_dep + k];
            s->rdeps[s->rfirst[dep] + fill[dep]++] = (uint32_t)i;
        }
        if (!t->ndeps)
            ready_add(s, (uint32_t)i);
    }
    free(fill);
    /* A task whose tiles fit on no device that runs it would stall the run:
     * say so instead. */
    for (size_t i = 0; i < nt; i++) {
        const um__vs_task *t = &d->tasks[i];
        uint64_t need = task_bytes(d, t);
        bool fits = false;
        for (int dev = 0; dev < m->ndev; dev++)
            fits |= isfinite(kernel_time(s, t, dev)) &&
                    (dev == 0 || need <= m->dev[dev].memory);
        if (!fits)
            return um__fail(UM_ERR_INVALID,
                            "sim: a %s task needs %u tiles (%llu bytes) at once, more than "
                            "any device of machine %s that runs it holds",
                            um__vs_kernel_name((um__vs_kernel)t->kernel), t->naccess,
                            (unsigned long long)need, m->name);
    }
    /* Every tile starts on the host, which must hold them (this engine
     * ignored the host's memory and ran 12 GiB of tiles from a host of
     * 1 GiB). */
    return um__vs_check_host_holds(m, d);
}

um_status um__vs_check_host_holds(const um__vs_machine *m, const um__vs_dag *d)
{
    uint64_t all = 0;
    for (uint32_t tile = 0; tile < d->ntiles; tile++) {
        uint64_t size = um__vs_tile_size(d, tile);
        all = size > UINT64_MAX - all ? UINT64_MAX : all + size;
    }
    if (all > m->dev[0].memory)
        return um__fail(UM_ERR_INVALID, "sim: the %u tiles (%llu bytes) do not fit the "
                        "memory of %s (%llu bytes) of machine %s, where they start",
                        d->ntiles, (unsigned long long)all, m->dev[0].name,
                        (unsigned long long)m->dev[0].memory, m->name);
    return UM_OK;
}

/* The bound counts only the devices that run some task of the graph (the
 * host of the built-ins runs none; a device may have times only for
 * kernels the graph lacks, or only for some tiles of a trace's): `capable`
 * maps the bound's devices to them. Both
 * the work bound and the critical path take each task's fastest time, the
 * lesser of its time alone and its packed time: a task that starts as the
 * one before it on the device ends runs at its packed time, so a path of
 * times alone (as before) could exceed a makespan the engines reach (a
 * chain of TRSMs on one H200: bound 0.0277 s, makespan 0.0229 s). */
typedef struct lb_view {
    const um__vs_machine *m;
    int capable[UM_VS_MAX_DEVICES];
} lb_view;

static double lb_time(const um__vs_task *t, int dev, void *arg)
{
    const lb_view *v = arg;
    int d = v->capable[dev];
    return fmin(um__vs_compute_time(v->m, d, t->kernel, t->tile, t->flops),
                um__vs_packed_time(v->m, d, t->kernel, t->tile, t->flops));
}

void um__vs_bounds(const um__vs_machine *m, const um__vs_dag *d, um__vs_result *out)
{
    lb_view v = {m, {0}};
    int ncap = 0;
    for (int dev = 0; dev < m->ndev; dev++) {
        v.capable[ncap] = dev;
        for (size_t t = 0; t < d->ntasks; t++)
            if (isfinite(lb_time(&d->tasks[t], ncap, &v))) {
                ncap++;
                break;
            }
    }
    out->work_bound_s = out->path_bound_s = 0;
    double lb = um__vs_lower_bound(d, ncap, lb_time, &v, &out->work_bound_s, &out->path_bound_s);
    out->lower_bound_s = lb < 0 ? -1 : lb;
}

/* Copies every tile written back to the host once the last task ends,
 * but those whose current copy is on its way there already (not a stale
 * write-back: flow_done). */
static void flush(sim *s)
{
    for (uint32_t tile = 0; tile < s->d->ntiles; tile++) {
        if (!s->written[tile] || (s->valid[tile] & 1) ||
            (s->leaving[tile] & ~s->stale[tile] & s->valid[tile] & ~1ull))
            continue;
        double secs;
        int src = best_source(s, tile, 0, &secs);
        if (src >= 0)
            start_copy(s, FLOW_FLUSH, tile, src, 0);
    }
}

um_status um__vs_simulate(const um__vs_machine *m, const um__vs_dag *d, int policy,
                          um__vs_result *out)
{
    memset(out, 0, sizeof *out);
    sim *s = calloc(1, sizeof *s);
    if (!s)
        return um__fail(UM_ERR_NOMEM, "sim: no memory");
    um_status st = sim_init(s, m, d, policy, out);
    bool flushed = false;
    uint64_t tags[64];
    while (st == UM_OK) {
        dispatch(s);
        for (int dev = 0; dev < s->ndev; dev++)
            pump(s, dev);
        if (s->done == d->ntasks && !flushed) {
            flush(s);
            flushed = true;
        }
        double next = um__vs_net_next(s->net);
        int running = -1;
        for (int dev = 0; dev < s->ndev; dev++)
            if (s->dev[dev].computing && s->dev[dev].compute_end < next) {
                next = s->dev[dev].compute_end;
                running = dev;
            }
        if (isinf(next)) {
            if (s->done < d->ntasks)
                st = um__fail(UM_ERR_INTERNAL, "sim: stalled with %zu of %zu tasks done (%zu "
                              "ready, none placeable or staged)", s->done, d->ntasks, s->nready);
            break;
        }
        s->now = next;
        out->events++;
        int n;
        while ((n = um__vs_net_advance(s->net, s->now, tags, 64)) > 0)
            for (int i = 0; i < n; i++)
                flow_done(s, tags[i]);
        if (n < 0) {
            st = um__fail(UM_ERR_INTERNAL, "sim: the network model refused time %.9f", s->now);
            break;
        }
        if (running >= 0)
            task_done(s, running);
    }
    if (st == UM_OK) {
        out->home_s = s->now;
        um__vs_bounds(m, d, out);
    }
    sim_free(s);
    free(s);
    return st;
}

/* Where tasks that end are counted (um__vs_count_tasks). */
static _Atomic(_Atomic uint64_t *) task_counter;

void um__vs_count_tasks(_Atomic uint64_t *counter)
{
    atomic_store_explicit(&task_counter, counter, memory_order_release);
}

void um__vs_task_ended(void)
{
    _Atomic uint64_t *c = atomic_load_explicit(&task_counter, memory_order_acquire);
    if (c)
        atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}
