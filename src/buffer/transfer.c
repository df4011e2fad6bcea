/*
 * transfer: the engine that moves buffer data between devices (see
 * buffer.h). A copy into a GPU runs on that GPU's copy-in stream, a copy
 * out of a GPU on its copy-out stream, so the two directions overlap each
 * other and the program's compute; copies between host and simulated
 * memory are plain memory copies, done when issued. A copy is ordered after
 * the fences it is given by stream waits on a GPU (the host does not
 * block), by waiting on the host otherwise.
 */
#include "buffer.h"

#include "../base/vtime.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct link_counters {
    _Atomic uint64_t bytes, copies, busy_ns;
} link_counters;

typedef struct held_memory {
    int dev;
    void *ptr;
    um__fence fences[UM_REPLICA_USES + 1];
    int nfences;
} held_memory;

struct um__xfer {
    um_context *ctx;
    int ndev;
    pthread_mutex_t lock;         /* guards everything below but the counters */
    um_stream to[UM_MAX_DEVICES]; /* copy-in stream of each GPU, made on first use */
    um_stream from[UM_MAX_DEVICES];
    um_stream join[UM_MAX_DEVICES]; /* where fences are merged (um__xfer_join) */
    /* Held by each call that queues work on an engine stream (to[d]: [d][1],
     * from[d]: [d][0]), across a timed copy's start event, copy and end
     * event: with other threads' work queued in between, a copy's timed
     * window spanned their copies too (four threads' 4 MiB prefetches on a
     * 50 MB/s sim link counted up to 930 ms busy where the link ran 320).
     * Where a stream could not be made and both fall back to the device's
     * default stream, two locks guard it: only busy times suffer. */
    pthread_mutex_t order[UM_MAX_DEVICES][2];
    link_counters *links;         /* ndev x ndev, from-major */
    double *lat_ns, *ns_per_byte; /* the route cost model, ndev x ndev */
    /* Per link: its cost was timed (or read from the link cache), not the
     * model's; a device without room for the timed copies keeps the model. */
    bool *timed;
    held_memory *held;            /* memory of destroyed buffers, still in use */
    size_t nheld, held_cap;
    _Atomic size_t nheld_pending;
    um_buffer *buffers;           /* every live buffer */
    /* Records of destroyed buffers, reused for new ones and freed at
     * shutdown, so a destroyed handle stays readable memory whose magic
     * says it is dead (until a new buffer takes its record). */
    um_buffer *spare;
    bool measured;                /* every link's cost is timed, none the model's */
    struct stage_pool *stage;     /* staging workers, made at the first staged copy */
    struct um__reclaim *reclaim;  /* eviction and the background reclaimer */
    um__spill *spill;             /* the file tier, made at the first spill */
    _Atomic uint64_t clock;       /* logical time of replica uses */
};

static bool is_gpu(um_context *ctx, int dev)
{
    return ctx->devices[dev].backend->kind == UM_DEVICE_CUDA;
}

/* Whether copies to and from dev run on the engine's copy streams: a GPU's,
 * or a sim device's whose link is modelled (its copies take time, in real
 * or virtual time); other copies are done when issued. */
static bool streamed(um_context *ctx, int dev)
{
    return is_gpu(ctx, dev) || ctx->devices[dev].backend->link_ns_per_byte > 0.0 ||
           (ctx->opts.virtual_time && ctx->devices[dev].backend->kind == UM_DEVICE_SIM);
}

/* ------------------------------------------------------------- fences */

/* A copy's time on its link, dur from start_ns: into the link's busy time
 * and, when recording, the trace. */
static void copy_done(um__xfer *x, int from, int to, uint64_t start_ns, uint64_t dur,
                      uint64_t bytes, bool staged)
{
    atomic_fetch_add_explicit(&x->links[from * x->ndev + to].busy_ns, dur, memory_order_relaxed);
    if (x->ctx->events)
        um__event_add(x->ctx->events, UM_EVENT_COPY, to, from, start_ns, dur, bytes, staged);
}

/* The busy time of f's copy, seen done now (or, where not `completed`,
 * given up on). A timed copy ran for the time between its events, which
 * leaves out what it waited for on its stream (earlier copies, the fences
 * it was ordered after). It began when its start event completed, as the
 * backend places it on the host's clock, kept between its issue and now
 * less its time: placed at now less its time, a copy seen done late was
 * drawn after the copies queued behind it. An untimed one counts from its
 * issue. */
static void count_busy(um__xfer *x, const um__fence *f, bool completed)
{
    if (f->from < 0 || f->to < 0)
        return;
    uint64_t now = um__now_ns(), ran = 0, at = 0;
    if (completed && f->start && um__be_event_elapsed(f->be, f->start, f->ev, &ran) == UM_OK) {
        uint64_t latest = now - f->start_ns > ran ? now - ran : f->start_ns, began = latest;
        if (um__be_event_time(f->be, f->start, &at) == UM_OK && at < latest)
            began = at > f->start_ns ? at : f->start_ns;
        copy_done(x, f->from, f->to, began, ran, f->bytes, false);
        return;
    }
    copy_done(x, f->from, f->to, f->start_ns, now - f->start_ns, f->bytes, false);
}

static void release_fence(um__fence *f)
{
    if (f->start) {
        um__be_event_destroy_timed(f->be, f->start);
        if (f->ev)
            um__be_event_destroy_timed(f->be, f->ev);
    } else if (f->ev) {
        um__be_event_destroy(f->be, f->ev);
    }
    *f = UM_FENCE_NONE;
}

void um__fence_drop(um__fence *f)
{
    if (f->ev && f->xfer)
        count_busy(f->xfer, f, false);
    release_fence(f);
}

/* The unrecorded f's stream (see um__fence). */
static um__bstream *fence_bstream(const um__fence *f)
{
    return ((um_stream)f->stream)->ref.bstream;
}

static um__backend *stream_backend(um_stream s)
{
    return s->ctx->devices[s->dev].backend;
}

/* Waits on the host for the streams of an unrecorded f. */
static um_status sync_unrecorded(const um__fence *f)
{
    um_stream up = (um_stream)f->upstream;
    um_status st = up ? um__be_stream_sync(stream_backend(up), up->ref.bstream) : UM_OK;
    return st == UM_OK ? um__be_stream_sync(f->be, fence_bstream(f)) : st;
}

/* Gives an unrecorded f its event: one recorded on its stream now comes
 * after the work f stands for, once that stream waits for its upstream's.
 * On failure f stays unrecorded. */
static um_status settle(um__fence *f)
{
    if (!f->unrecorded)
        return UM_OK;
    um_stream up = (um_stream)f->upstream;
    if (up) {
        um__backend *ub = stream_backend(up);
        um__bevent *e = NULL;
        um_status st = um__be_event_record(ub, up->ref.bstream, &e);
        if (st == UM_OK) {
            st = um__be_stream_wait(f->be, fence_bstream(f), ub, e);
            um__be_event_destroy(ub, e);
        }
        if (st != UM_OK)
            return st;
        f->upstream = NULL;
    }
    um_status st = um__be_event_record(f->be, fence_bstream(f), &f->ev);
    if (st == UM_OK)
        f->unrecorded = false;
    return st;
}

/* Queries f's event: *done once it has completed, when f is counted and
 * becomes none. A failed query leaves f as it was. */
static um_status poll_fence(um__xfer *x, um__fence *f, bool *done)
{
    *done = !um__fence_pending(f);
    um_status st = settle(f);
    if (!f->ev)
        return st;
    int finished = 0;
    st = um__be_event_query(f->be, f->ev, &finished);
    if (st == UM_OK && finished) {
        count_busy(x, f, true);
        release_fence(f);
        *done = true;
    }
    return st;
}

um_status um__fence_check(um__xfer *x, um__fence *f, bool *done)
{
    um_status st = poll_fence(x, f, done);
    if (st != UM_OK && !f->unrecorded)
        um__fence_drop(f);
    return st;
}

bool um__fence_done(um__xfer *x, um__fence *f)
{
    bool done;
    return poll_fence(x, f, &done) == UM_OK && done;
}

um_status um__fence_wait(um__xfer *x, um__fence *f)
{
    if (f->unrecorded && settle(f) != UM_OK) {
        um_status st = sync_unrecorded(f);
        if (st == UM_OK)
            *f = UM_FENCE_NONE;
        return st;
    }
    if (!f->ev)
        return UM_OK;
    um_status st = um__be_event_sync(f->be, f->ev);
    if (st != UM_OK)
        return st;
    count_busy(x, f, true);
    release_fence(f);
    return UM_OK;
}

um_status um__fence_record(um_context *ctx, int dev, um_stream s, um__fence *out)
{
    *out = UM_FENCE_NONE;
    if (dev == 0 && !s)
        return UM_OK;
    um_stream us = s ? s : ctx->devices[dev].default_stream;
    um__backend *be = ctx->devices[us->dev].backend;
    um__bevent *ev = NULL;
    um_status st = um__be_event_record(be, us->ref.bstream, &ev);
    if (st != UM_OK)
        return st;
    *out = (um__fence){.be = be, .ev = ev, .stream = us, .from = -1, .to = -1};
    return UM_OK;
}

/* ------------------------------------------------------------- engine */

/* The route model until links are measured: GPU links at the H200's host
 * link speed, peers faster, host and simulated memory at memory speed.
 * Only the order of the costs matters to the choice of a source. */
static void model_routes(um__xfer *x)
{
    um_context *ctx = x->ctx;
    for (int i = 0; i < x->ndev; i++) {
        for (int j = 0; j < x->ndev; j++) {
            double lat = 1000.0, gbps = 10.0;
            if (i == j) {
                lat = 0.0;
                gbps = 1000.0;
            } else if (is_gpu(ctx, i) && is_gpu(ctx, j)) {
                um_link_info li;
                bool peer = um_device_link_get(ctx, i, j, &li) == UM_OK && li.peer_access;
                lat = 10000.0;
                gbps = peer ? 400.0 : 25.0;
            } else if (is_gpu(ctx, i) || is_gpu(ctx, j)) {
                lat = 10000.0;
                gbps = 50.0;
            } else if (streamed(ctx, i) || streamed(ctx, j)) {
                /* A sim device's modelled link (the host end has none). */
                double per = ctx->devices[i].backend->link_ns_per_byte +
                             ctx->devices[j].backend->link_ns_per_byte;
                gbps = 1.0 / per;
            }
            x->lat_ns[i * x->ndev + j] = lat;
            x->ns_per_byte[i * x->ndev + j] = 1.0 / gbps;
        }
    }
}

/* ------------------------------------------------------ link measuring */

/* Every link is timed once per machine: a 4 KiB copy (latency) and a
 * 16 MiB copy (bandwidth), the best of a few, with the engine's own runner
 * (copy streams, memory copies) but outside the link statistics. The
 * figures are kept in the link cache file under a key made of the devices'
 * kinds, names, sizes and driver identities, so later starts read them. */
#define MEASURE_BIG ((size_t)16 << 20)
#define MEASURE_SMALL ((size_t)4096)

typedef struct runner runner;
static runner pick_runner(um__xfer *x, int dd, int sd);

static um_status time_copy(um__xfer *x, int dd, void *dst, int sd, const void *src, size_t n,
                           uint64_t *ns);

static uint64_t fnv1a(uint64_t h, const char *s)
{
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static uint64_t machine_key(um_context *ctx)
{
    uint64_t h = 0xcbf29ce484222325ull;
    char buf[512];
    for (int d = 0; d < ctx->ndevices; d++) {
        const um__backend *b = ctx->devices[d].backend;
        snprintf(buf, sizeof buf, "%d|%s|%zu|%zu|%s|%s|%d|%d|%.6g;", (int)b->kind, b->name,
                 b->capacity, b->granularity, b->product, b->pci_bus_id, b->pinned, b->vmm,
                 b->link_ns_per_byte);
        h = fnv1a(h, buf);
    }
    return h;
}

/* The cache file's path into buf, or false for none. */
static bool cache_path(um_context *ctx, char *buf, size_t len, bool make_dir)
{
    const char *opt = ctx->opts.link_cache;
    if (!strcmp(opt, "none"))
        return false;
    if (*opt)
        return snprintf(buf, len, "%s", opt) < (int)len;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[400];
    if (xdg && *xdg)
        snprintf(dir, sizeof dir, "%s", xdg);
    else if (home && *home)
        snprintf(dir, sizeof dir, "%s/.cache", home);
    else
        return false;
    if (make_dir) {
        (void)mkdir(dir, 0755);
        size_t n = strlen(dir);
        snprintf(dir + n, sizeof dir - n, "/unimem");
        (void)mkdir(dir, 0755);
    } else {
        size_t n = strlen(dir);
        snprintf(dir + n, sizeof dir - n, "/unimem");
    }
    return snprintf(buf, len, "%s/links", dir) < (int)len;
}

/* Reads this machine's line of the cache: "KEY N" then latency (ns) and
 * GB/s for every link, from-major. Each line is read whole and its figures
 * are kept only if all of them parse, with nothing after them: a damaged
 * line neither leaves its first figures in the cost tables nor runs on
 * into the next line. */
static bool cache_read(um__xfer *x, uint64_t key)
{
    char path[512];
    if (!cache_path(x->ctx, path, sizeof path, false))
        return false;
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t nn = (size_t)x->ndev * (size_t)x->ndev;
    double *lat = malloc(nn * sizeof *lat), *per = malloc(nn * sizeof *per);
    char *line = NULL;
    size_t cap = 0;
    bool found = false;
    while (lat && per && !found && getline(&line, &cap, f) > 0) {
        char *p = line, *e;
        unsigned long long k = strtoull(p, &e, 16);
        if (e == p || k != key)
            continue;
        long n = strtol(e, &p, 10);
        if (p == e || n != x->ndev)
            continue;
        size_t i = 0;
        for (; i < nn; i++) {
            double l = strtod(p, &e), gbps = e == p ? 0 : strtod(e, &p);
            if (e == p || !isfinite(l) || l < 0 || !isfinite(gbps) || gbps <= 0)
                break;
            lat[i] = l;
            per[i] = 1.0 / gbps;
        }
        p += strspn(p, " \t\r\n");
        found = i == nn && *p == '\0';
    }
    if (found) {
        memcpy(x->lat_ns, lat, nn * sizeof *lat);
        memcpy(x->ns_per_byte, per, nn * sizeof *per);
        for (size_t i = 0; i < nn; i++)
            x->timed[i] = true;
    }
    free(line);
    free(lat);
    free(per);
    fclose(f);
    return found;
}

static void cache_write(um__xfer *x, uint64_t key)
{
    char path[512];
    if (!cache_path(x->ctx, path, sizeof path, true))
        return;
    FILE *f = fopen(path, "a");
    if (!f) {
        um__log(UM_LOG_INFO, "transfer engine: link cache %s cannot be written", path);
        return;
    }
    fprintf(f, "%016llx %d", (unsigned long long)key, x->ndev);
    for (int i = 0; i < x->ndev * x->ndev; i++)
        fprintf(f, " %.1f %.3f", x->lat_ns[i], 1.0 / x->ns_per_byte[i]);
    fprintf(f, "\n");
    fclose(f);
}

/* Times every link; a device whose memory cannot be had keeps the model
 * (its links are not marked timed). A link to itself costs no copy. */
static void measure_routes(um__xfer *x)
{
    um_context *ctx = x->ctx;
    void *buf[UM_MAX_DEVICES] = {0};
    for (int d = 0; d < x->ndev; d++) {
        if (um_malloc(ctx, d, MEASURE_BIG, NULL, &buf[d]) != UM_OK) {
            buf[d] = NULL;
            continue;
        }
        /* The block is ready in the default stream's order only: at the
         * memory limit it may be memory another stream freed with work
         * still queued, which the default stream waits for on the device
         * (cross_stream_reuse). The copies below run on the engine's own
         * streams, so they wait here for that work. */
        if (um__be_stream_sync(ctx->devices[d].backend, NULL) != UM_OK) {
            (void)um_free(ctx, buf[d], NULL);
            buf[d] = NULL;
        }
    }
    for (int i = 0; i < x->ndev; i++) {
        for (int j = 0; j < x->ndev; j++) {
            x->timed[i * x->ndev + j] = i == j;
            if (i == j || !buf[i] || !buf[j])
                continue;
            uint64_t big = UINT64_MAX, small = UINT64_MAX, ns;
            bool ok = time_copy(x, j, buf[j], i, buf[i], MEASURE_BIG, &ns) == UM_OK;
            for (int k = 0; k < 3 && ok; k++) {
                ok = time_copy(x, j, buf[j], i, buf[i], MEASURE_BIG, &ns) == UM_OK;
                big = ns < big ? ns : big;
            }
            for (int k = 0; k < 5 && ok; k++) {
                ok = time_copy(x, j, buf[j], i, buf[i], MEASURE_SMALL, &ns) == UM_OK;
                small = ns < small ? ns : small;
            }
            if (!ok)
                continue;
            double lat = (double)small, per = ((double)big - lat) / (double)MEASURE_BIG;
            if (per <= 0)
                per = (double)big / (double)MEASURE_BIG;
            x->lat_ns[i * x->ndev + j] = lat;
            x->ns_per_byte[i * x->ndev + j] = per;
            x->timed[i * x->ndev + j] = true;
        }
    }
    for (int d = 0; d < x->ndev; d++)
        if (buf[d])
            (void)um_free(ctx, buf[d], NULL);
}

static bool peer_access(um_context *ctx, int from, int to);

/* Between two GPUs without peer copies (none reported, or peer_copies=0)
 * a copy goes in two pipelined hops through the host: the hops' latencies
 * add up and the slower hop sets the rate. Without this the costs would
 * price a direct copy that is never made, and eviction and source choice
 * would send data to the other GPU across the host link twice. */
static void two_hop_routes(um__xfer *x)
{
    um_context *ctx = x->ctx;
    int n = x->ndev;
    for (int i = 1; i < n; i++)
        for (int j = 1; j < n; j++) {
            if (i == j || !is_gpu(ctx, i) || !is_gpu(ctx, j) || peer_access(ctx, i, j))
                continue;
            double out = x->ns_per_byte[i * n], in = x->ns_per_byte[j];
            x->lat_ns[i * n + j] = x->lat_ns[i * n] + x->lat_ns[j];
            x->ns_per_byte[i * n + j] = out > in ? out : in;
            x->timed[i * n + j] = x->timed[i * n] && x->timed[j];
        }
}

/* Whether every link's cost was timed or read from the cache. */
static bool all_timed(const um__xfer *x)
{
    for (int i = 0; i < x->ndev * x->ndev; i++)
        if (!x->timed[i])
            return false;
    return true;
}

static void set_routes(um__xfer *x)
{
    model_routes(x);
    if (x->ctx->opts.virtual_time && x->ctx->opts.links != UM_LINKS_MODEL) {
        /* The modelled links, timed in virtual time; never cached (the
         * cache is the real machine's). */
        measure_routes(x);
    } else if (x->ctx->opts.links != UM_LINKS_MODEL) {
        uint64_t key = machine_key(x->ctx);
        /* Only a complete measurement is cached: a link that could not be
         * timed now (its device was full) holds the model's figures, which
         * the cache would give every later start as this machine's. */
        if (!cache_read(x, key)) {
            measure_routes(x);
            if (all_timed(x))
                cache_write(x, key);
        }
    }
    two_hop_routes(x);
    x->measured = all_timed(x);
}

static void buffers_fini(um_context *ctx);
static void collect_held(um_context *ctx);

um_status um__xfer_get(um_context *ctx, um__xfer **out)
{
    um__xfer *x = atomic_load_explicit(&ctx->xfer, memory_order_acquire);
    if (x) {
        *out = x;
        return UM_OK;
    }
    um__vt_mutex_lock(&ctx->buffers_lock);
    x = atomic_load_explicit(&ctx->xfer, memory_order_relaxed);
    if (!x) {
        size_t n = (size_t)ctx->ndevices;
        x = calloc(1, sizeof *x);
        if (x) {
            x->links = calloc(n * n, sizeof *x->links);
            x->lat_ns = calloc(n * n, sizeof *x->lat_ns);
            x->ns_per_byte = calloc(n * n, sizeof *x->ns_per_byte);
            x->timed = calloc(n * n, sizeof *x->timed);
        }
        if (!x || !x->links || !x->lat_ns || !x->ns_per_byte || !x->timed) {
            if (x) {
                free(x->links);
                free(x->lat_ns);
                free(x->ns_per_byte);
                free(x->timed);
            }
            free(x);
            um__vt_mutex_unlock(&ctx->buffers_lock);
            return um__fail(UM_ERR_NOMEM, "unified buffers: no host memory for the transfer "
                            "engine of %d devices", ctx->ndevices);
        }
        x->ctx = ctx;
        x->ndev = ctx->ndevices;
        /* Recursive: reclaim walks the buffers under it and evicts, which
         * calls back into the engine. */
        pthread_mutexattr_t attr;
        pthread_mutexattr_init(&attr);
        pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
        pthread_mutex_init(&x->lock, &attr);
        pthread_mutexattr_destroy(&attr);
        for (int d = 0; d < UM_MAX_DEVICES; d++)
            for (int k = 0; k < 2; k++)
                pthread_mutex_init(&x->order[d][k], NULL);
        set_routes(x);
        ctx->buffers_fini = buffers_fini;
        /* Complete (its reclaimer made and started) before it is
         * published: a thread that finds ctx->xfer without the lock must
         * see its reclaimer too (found by TSan under the stress test). */
        x->reclaim = um__reclaim_create(x); /* NULL: no reclaim, allocations just fail */
        if (x->reclaim)
            um__reclaim_start(x->reclaim, ctx);
        atomic_store_explicit(&ctx->xfer, x, memory_order_release);
        atomic_store_explicit(&ctx->collect, collect_held, memory_order_release);
    }
    um__vt_mutex_unlock(&ctx->buffers_lock);
    *out = x;
    return UM_OK;
}

um_buffer *um__xfer_record(um__xfer *x)
{
    size_t bytes = sizeof(um_buffer) + (size_t)x->ndev * sizeof(um__replica);
    um__vt_mutex_lock(&x->lock);
    um_buffer *b = x->spare;
    if (b)
        x->spare = b->next;
    um__vt_mutex_unlock(&x->lock);
    if (!b)
        b = malloc(bytes);
    if (b)
        memset(b, 0, bytes);
    return b;
}

void um__xfer_recycle(um__xfer *x, um_buffer *b)
{
    um__vt_mutex_lock(&x->lock);
    b->next = x->spare;
    x->spare = b;
    um__vt_mutex_unlock(&x->lock);
}

void um__xfer_each_buffer(um__xfer *x, bool (*fn)(um_buffer *b, void *arg), void *arg)
{
    um__vt_mutex_lock(&x->lock);
    for (um_buffer *b = x->buffers, *nx; b; b = nx) {
        nx = b->next;
        if (!fn(b, arg))
            break;
    }
    um__vt_mutex_unlock(&x->lock);
}

uint64_t um__xfer_tick(um__xfer *x)
{
    return atomic_fetch_add_explicit(&x->clock, 1, memory_order_relaxed) + 1;
}

um_status um__xfer_spill(um__xfer *x, um__spill **out)
{
    *out = NULL;
    const char *dir = x->ctx->opts.spill_dir;
    if (!*dir)
        return um__fail(UM_ERR_NOMEM, "no file tier (option spill_dir is not set)");
    um__vt_mutex_lock(&x->lock);
    um_status st = x->spill ? UM_OK : um__spill_create(dir, &x->spill);
    *out = x->spill;
    um__vt_mutex_unlock(&x->lock);
    return st;
}

size_t um__xfer_spilled(um__xfer *x)
{
    um__vt_mutex_lock(&x->lock);
    size_t n = um__spill_used(x->spill);
    um__vt_mutex_unlock(&x->lock);
    return n;
}

struct um__reclaim *um__xfer_reclaim(um__xfer *x)
{
    return x->reclaim;
}

void um__xfer_track(um__xfer *x, um_buffer *b, bool add)
{
    um__vt_mutex_lock(&x->lock);
    if (add) {
        b->prev = NULL;
        b->next = x->buffers;
        if (b->next)
            b->next->prev = b;
        x->buffers = b;
    } else {
        if (b->prev)
            b->prev->next = b->next;
        else
            x->buffers = b->next;
        if (b->next)
            b->next->prev = b->prev;
        b->prev = b->next = NULL;
    }
    um__vt_mutex_unlock(&x->lock);
}

/* The engine's stream of dev in *slot, made on first use. */
static um_stream engine_stream(um__xfer *x, int dev, um_stream *slot)
{
    um__vt_mutex_lock(&x->lock);
    if (!*slot && um_stream_create(x->ctx, dev, slot) != UM_OK) {
        /* The default stream still orders the copies correctly, only with
         * less overlap. */
        um__log(UM_LOG_WARN, "transfer engine: %s", um_last_error());
        *slot = x->ctx->devices[dev].default_stream;
    }
    um_stream s = *slot;
    um__vt_mutex_unlock(&x->lock);
    return s;
}

um_stream um__xfer_stream(um__xfer *x, int dev, bool to)
{
    if (!streamed(x->ctx, dev))
        return NULL;
    return engine_stream(x, dev, to ? &x->to[dev] : &x->from[dev]);
}

um_status um__xfer_join(um__xfer *x, um__fence *a, um__fence *b)
{
    um_stream as = (um_stream)a->stream;
    um_status settled = settle(a);
    if (settled == UM_OK)
        settled = settle(b);
    if (settled != UM_OK)
        return settled;
    if (!a->ev || !b->ev || !as || !streamed(x->ctx, as->dev))
        return um__fail(UM_ERR_UNSUPPORTED, "transfer engine: these fences cannot be merged on "
                        "a stream");
    int dev = as->dev;
    um__backend *be = x->ctx->devices[dev].backend;
    um_stream js = engine_stream(x, dev, &x->join[dev]);
    um__fence j;
    um_status st = um__be_stream_wait(be, js->ref.bstream, a->be, a->ev);
    if (st == UM_OK)
        st = um__be_stream_wait(be, js->ref.bstream, b->be, b->ev);
    if (st == UM_OK)
        st = um__fence_record(x->ctx, dev, js, &j);
    if (st != UM_OK)
        return st;
    um__fence_drop(a);
    um__fence_drop(b);
    *a = j;
    return UM_OK;
}

double um__xfer_cost(const um__xfer *x, int from, int to, size_t n)
{
    size_t k = (size_t)from * (size_t)x->ndev + (size_t)to;
    return x->lat_ns[k] + (double)n * x->ns_per_byte[k];
}

/* Who runs a copy from device sd to dd: a GPU on its copy stream, else a
 * sim device with a modelled link on its copy stream, else the backend of
 * a side that is not the CUDA-pinned host (both are process memory), else
 * nobody (a plain memmove). The GPU ends come first: only a GPU's backend
 * can reach its memory, and a sim device's copies are memmoves on the
 * host, which fault on a real GPU's pointer. */
struct runner {
    um__backend *be;
    um_stream stream; /* NULL: the copy is done when issued */
    pthread_mutex_t *order; /* the stream's x->order lock; NULL without a stream */
};

/* The engine's copy-in (to) or copy-out stream of dev. */
static runner engine_runner(um__xfer *x, int dev, bool to)
{
    um_stream s = um__xfer_stream(x, dev, to);
    return (runner){x->ctx->devices[dev].backend, s, s ? &x->order[dev][to] : NULL};
}

/* Taken around work queued on r's stream (see um__xfer.order). */
static void order_lock(const runner *r)
{
    if (r->order)
        um__vt_mutex_lock(r->order);
}

static void order_unlock(const runner *r)
{
    if (r->order)
        um__vt_mutex_unlock(r->order);
}

static runner pick_runner(um__xfer *x, int dd, int sd)
{
    um_context *ctx = x->ctx;
    if (is_gpu(ctx, dd))
        return engine_runner(x, dd, true);
    if (is_gpu(ctx, sd))
        return engine_runner(x, sd, false);
    if (streamed(ctx, dd))
        return engine_runner(x, dd, true);
    if (streamed(ctx, sd))
        return engine_runner(x, sd, false);
    um__backend *d = ctx->devices[dd].backend, *s = ctx->devices[sd].backend;
    return (runner){!d->pinned ? d : !s->pinned ? s : NULL, NULL, NULL};
}

/* Whether a copy about to be queued on r's stream may wait there, so that
 * its issue may not be its start: behind work still queued on that stream,
 * or for a fence that has not completed (both asked of the driver; a
 * copy's fence is a copy of its owner's, so it is not released here).
 * Where timing costs a timed event (CUDA: 1.3 us a record against 0.1
 * for a plain one on an H100), copies that cannot wait go untimed. */
static bool may_wait(const runner *r, const um__fence *after, int nafter)
{
    int idle = 0;
    if (!r->be->ops->stream_query ||
        um__be_stream_query(r->be, r->stream->ref.bstream, &idle) != UM_OK || !idle)
        return true;
    for (int i = 0; i < nafter; i++) {
        int done = 0;
        if (after[i].unrecorded ||
            (after[i].ev && (um__be_event_query(after[i].be, after[i].ev, &done) != UM_OK || !done)))
            return true;
    }
    return false;
}

/* One copy, waited for, outside the statistics (link measuring). */
static um_status time_copy(um__xfer *x, int dd, void *dst, int sd, const void *src, size_t n,
                           uint64_t *ns)
{
    runner r = pick_runner(x, dd, sd);
    um__bstream *bs = r.stream ? r.stream->ref.bstream : NULL;
    uint64_t t0 = um__now_ns();
    um_status st = UM_OK;
    if (r.be)
        st = um__be_copy_async(r.be, dst, src, n, bs);
    else
        memmove(dst, src, n);
    if (st == UM_OK && r.stream)
        st = um__be_stream_sync(r.be, bs);
    *ns = um__now_ns() - t0;
    return st;
}

/* Orders the runner's next work after the fences. The host waits for
 * those its stream cannot wait for (no stream, or another driver's
 * fence) before it takes the stream's order lock: held across such a
 * wait (a sim copy's, for a copy to a GPU), it kept every other copy on
 * the stream waiting too (found by an audit: a 64 KiB prefetch 306 ms).
 * An unrecorded fence (a copy of its owner's, so no event is made for it
 * here) is waited for through its streams, unless it has only the
 * runner's. */
static um_status order_after(const runner *r, const um__fence *after, int nafter)
{
    um_status st = UM_OK;
    bool device_waits = false;
    for (int i = 0; i < nafter && st == UM_OK; i++) {
        if (after[i].unrecorded) {
            if (after[i].upstream || after[i].stream != (const void *)r->stream)
                st = sync_unrecorded(&after[i]);
            continue;
        }
        if (!after[i].ev)
            continue;
        if (r->stream && um__be_same_driver(r->be, after[i].be))
            device_waits = true;
        else
            st = um__be_event_sync(after[i].be, after[i].ev);
    }
    if (st != UM_OK || !device_waits)
        return st;
    order_lock(r);
    for (int i = 0; i < nafter && st == UM_OK; i++)
        if (after[i].ev && um__be_same_driver(r->be, after[i].be))
            st = um__be_stream_wait(r->be, r->stream->ref.bstream, after[i].be, after[i].ev);
    order_unlock(r);
    return st;
}

um_status um__xfer_order_in(um__xfer *x, int dev, const um__fence *f)
{
    runner r = engine_runner(x, dev, true);
    if (!r.stream)
        return um__fail(UM_ERR_UNSUPPORTED, "transfer engine: device %d has no copy-in stream",
                        dev);
    return order_after(&r, f, 1);
}

static void count_copy(um__xfer *x, int from, int to, size_t n)
{
    link_counters *l = &x->links[from * x->ndev + to];
    atomic_fetch_add_explicit(&l->bytes, n, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->copies, 1, memory_order_relaxed);
}

/* The completion of what the runner just queued (a copy of n bytes from
 * `from` to `to`; from -1 for a fill), issued at t0. start: a timed event
 * recorded on the runner's stream just before the copy, or NULL; the
 * fence then ends with a timed event too, so that the copy's own time can
 * be read (count_busy). */
static um_status finish(um__xfer *x, const runner *r, int from, int to, uint64_t t0, size_t n,
                        bool staged, um__bevent *start, um__fence *done)
{
    *done = UM_FENCE_NONE;
    if (!r->stream) {
        if (from >= 0)
            copy_done(x, from, to, t0, um__now_ns() - t0, n, staged);
        return UM_OK;
    }
    um__bevent *ev = NULL;
    um__bstream *bs = r->stream->ref.bstream;
    um_status st = start ? um__be_event_record_timed(r->be, bs, &ev)
                         : um__be_event_record(r->be, bs, &ev);
    if (st != UM_OK) {
        char record[300], wait[300];
        um__error_detail(st, record, sizeof record);
        if (start)
            um__be_event_destroy_timed(r->be, start);
        /* Without an event, the copy is waited for here. */
        um_status s2 = um__be_stream_sync(r->be, bs);
        if (s2 == UM_OK) {
            if (from >= 0)
                copy_done(x, from, to, t0, um__now_ns() - t0, n, staged);
            return UM_OK;
        }
        *done = um__fence_unrecorded(r->be, r->stream);
        return um__fail(s2,
                        "a copy queued on a stream of device %d can be neither fenced (%s) nor "
                        "waited for (%s): it may still be writing its destination",
                        r->stream->dev, record, um__error_detail(s2, wait, sizeof wait));
    }
    *done = (um__fence){.be = r->be, .ev = ev, .start = start, .stream = r->stream,
                        .start_ns = t0, .bytes = n, .xfer = from >= 0 ? x : NULL,
                        .from = (int16_t)from, .to = (int16_t)to};
    return UM_OK;
}

/* ------------------------------------------------------------ staging */

/* A copy between a GPU and program memory (pageable: the GPU's copy engine
 * cannot read it at full speed) goes through pinned staging buffers in
 * chunks. Several host threads each move chunks between the program's
 * memory and staging buffers of their own while the GPU copies their
 * previous chunks, so the host copies and the DMA run at once. */
typedef struct stage_job {
    um__backend *gpu;
    um__bstream *stream;
    char *dev, *host;       /* the device side and the program side */
    size_t n, chunk;
    bool to_gpu;
    char *slots;            /* STAGE_SLOTS chunks per worker, pinned host memory */
    const runner *r;        /* the stream's runner, for its order lock */
    _Atomic size_t next;    /* the next chunk to take */
    _Atomic bool failed;
} stage_job;

typedef struct stage_pool stage_pool;

typedef struct stage_worker {
    stage_job *job;
    stage_pool *pool;
    int id;
    pthread_t tid;
    um_status st;
    char error[256];
} stage_worker;

static void stage_fail(stage_worker *w, um_status st)
{
    if (w->st != UM_OK)
        return;
    w->st = st;
    snprintf(w->error, sizeof w->error, "%s", um_last_error());
    atomic_store(&w->job->failed, true);
}

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Copies a staged chunk out to the program's memory with streaming stores
 * where the CPU has them: the destination is not read first (no
 * read-for-ownership), which saves a third of the memory traffic. On the
 * H200 machine this took copies to pageable memory from about 0.78 to 0.87
 * of the pinned bandwidth. */
static void stream_copy(char *dst, const char *src, size_t n)
{
#if defined(__SSE2__)
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    if (head > n)
        head = n;
    memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    size_t body = n & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    _mm_sfence();
    memcpy(dst + body, src + body, n - body);
#else
    memcpy(dst, src, n);
#endif
}

/* Waits for slot s's DMA; for a copy to the host, then moves its chunk. */
static void stage_finish(stage_worker *w, char *slot, um__bevent **ev, size_t off, size_t len)
{
    stage_job *j = w->job;
    if (!*ev)
        return;
    um_status st = um__be_event_sync(j->gpu, *ev);
    um__be_event_destroy(j->gpu, *ev);
    *ev = NULL;
    if (st != UM_OK)
        stage_fail(w, st);
    else if (!j->to_gpu)
        stream_copy(j->host + off, slot, len);
}

/* Slots per worker: a worker reuses its oldest slot, so up to STAGE_SLOTS
 * of its chunks are in the GPU's queue while it copies another. */
#define STAGE_SLOTS 3

static void *stage_run(void *arg)
{
    stage_worker *w = arg;
    stage_job *j = w->job;
    char *slot[STAGE_SLOTS];
    um__bevent *ev[STAGE_SLOTS];
    size_t off[STAGE_SLOTS], len[STAGE_SLOTS];
    for (unsigned s = 0; s < STAGE_SLOTS; s++) {
        slot[s] = j->slots + (size_t)(STAGE_SLOTS * w->id + (int)s) * j->chunk;
        ev[s] = NULL;
        off[s] = len[s] = 0;
    }
    for (unsigned k = 0; !atomic_load_explicit(&j->failed, memory_order_relaxed); k++) {
        size_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= (j->n + j->chunk - 1) / j->chunk)
            break;
        unsigned s = k % STAGE_SLOTS;
        /* The slot's previous chunk must be done before it is reused. */
        stage_finish(w, slot[s], &ev[s], off[s], len[s]);
        off[s] = i * j->chunk;
        len[s] = j->n - off[s] < j->chunk ? j->n - off[s] : j->chunk;
        /* Plain stores into the slot: the GPU then reads it from the cache
         * (streaming stores there halved the bandwidth on the H200). */
        if (j->to_gpu)
            memcpy(slot[s], j->host + off[s], len[s]);
        order_lock(j->r);
        um_status st = j->to_gpu
                           ? um__be_copy_async(j->gpu, j->dev + off[s], slot[s], len[s], j->stream)
                           : um__be_copy_async(j->gpu, slot[s], j->dev + off[s], len[s], j->stream);
        if (st == UM_OK)
            st = um__be_event_record(j->gpu, j->stream, &ev[s]);
        order_unlock(j->r);
        if (st != UM_OK) {
            stage_fail(w, st);
            break;
        }
    }
    /* Oldest first, as the GPU finishes them. */
    for (unsigned s = 0; s < STAGE_SLOTS; s++) {
        unsigned o = 0;
        for (unsigned t = 1; t < STAGE_SLOTS; t++)
            if (ev[t] && (!ev[o] || off[t] < off[o]))
                o = t;
        stage_finish(w, slot[o], &ev[o], off[o], len[o]);
    }
    return NULL;
}

static int stage_threads(const um__xfer *x)
{
    int t = x->ctx->opts.copy_threads;
    if (t <= 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        t = cpus >= 4 ? (int)(cpus / 2) : 1;
        if (t > 8)
            t = 8;
    }
    return t;
}

/* The staging workers: made at the first staged copy and kept, parked on
 * a condition variable, with their pinned slots (starting threads and
 * taking slots for every copy cost 4% of a 256 MiB copy). The calling
 * thread is worker 0; one staged copy runs at a time (they would share the
 * same link). */
struct stage_pool {
    pthread_mutex_t one_copy;   /* held for a whole staged copy */
    pthread_mutex_t lock;       /* guards the fields below */
    pthread_cond_t work, done;
    uint64_t generation;        /* bumped per job */
    int active;                 /* workers of the current job still running */
    int nworkers;               /* including the caller */
    int job_workers;
    bool quit;
    /* STAGE_SLOTS chunks per worker, guarded by one_copy; NULL until the
     * first staged copy takes them, and again after a failed copy whose
     * DMA may still be running into them left them in use (leaked). */
    char *slots;
    size_t chunk;
    size_t slot_bytes;          /* the size of slots */
    stage_worker w[64];
};

static void *stage_helper(void *arg)
{
    stage_worker *w = arg;
    stage_pool *sp = w->pool;
    uint64_t seen = 0;
    um__vt_mutex_lock(&sp->lock);
    for (;;) {
        while (!sp->quit && sp->generation == seen)
            pthread_cond_wait(&sp->work, &sp->lock);
        if (sp->quit)
            break;
        seen = sp->generation;
        bool mine = w->id < sp->job_workers;
        um__vt_mutex_unlock(&sp->lock);
        if (mine)
            stage_run(w);
        um__vt_mutex_lock(&sp->lock);
        if (mine && --sp->active == 0)
            pthread_cond_signal(&sp->done);
    }
    um__vt_mutex_unlock(&sp->lock);
    return NULL;
}

static void stage_pool_destroy(um__xfer *x)
{
    stage_pool *sp = x->stage;
    if (!sp)
        return;
    um__vt_mutex_lock(&sp->lock);
    sp->quit = true;
    pthread_cond_broadcast(&sp->work);
    um__vt_mutex_unlock(&sp->lock);
    for (int i = 1; i < sp->nworkers; i++)
        pthread_join(sp->w[i].tid, NULL);
    if (sp->slots)
        (void)um_free(x->ctx, sp->slots, NULL);
    pthread_cond_destroy(&sp->work);
    pthread_cond_destroy(&sp->done);
    pthread_mutex_destroy(&sp->lock);
    pthread_mutex_destroy(&sp->one_copy);
    free(sp);
    x->stage = NULL;
}

/* The pool, made on first use without its slots (stage_take allocates
 * them, outside x->lock); NULL after um__fail. */
static stage_pool *stage_pool_get(um__xfer *x)
{
    um__vt_mutex_lock(&x->lock);
    stage_pool *sp = x->stage;
    if (sp) {
        um__vt_mutex_unlock(&x->lock);
        return sp;
    }
    sp = calloc(1, sizeof *sp);
    if (!sp) {
        um__vt_mutex_unlock(&x->lock);
        um__fail(UM_ERR_NOMEM, "transfer engine: no host memory for the staging workers");
        return NULL;
    }
    sp->chunk = x->ctx->opts.copy_chunk;
    int want = stage_threads(x);
    sp->slot_bytes = (size_t)(STAGE_SLOTS * want) * sp->chunk;
    pthread_mutex_init(&sp->one_copy, NULL);
    pthread_mutex_init(&sp->lock, NULL);
    pthread_cond_init(&sp->work, NULL);
    pthread_cond_init(&sp->done, NULL);
    sp->nworkers = 1;
    for (int i = 0; i < want; i++)
        sp->w[i] = (stage_worker){NULL, sp, i, 0, UM_OK, ""};
    /* Fewer helpers than asked for still work: the chunks are shared. */
    for (int i = 1; i < want && pthread_create(&sp->w[i].tid, NULL, stage_helper, &sp->w[i]) == 0;
         i++)
        sp->nworkers++;
    x->stage = sp;
    um__vt_mutex_unlock(&x->lock);
    return sp;
}

/* The pool for one staged copy, with sp->one_copy held and slots to use;
 * the allocator's status after um__fail. The slots are allocated with no
 * engine lock held: at the host memory limit the allocation used to wait
 * (up to a second) in the reclaim hook for buffers that other calls hold,
 * and those calls need x->lock to finish, so holding it there made the
 * allocation fail for nothing and stalled every other copy meanwhile. It
 * no longer waits at all (um__reclaim_optional): the copy can go
 * unstaged. */
static um_status stage_take(um__xfer *x, stage_pool **out)
{
    *out = NULL;
    stage_pool *sp = stage_pool_get(x);
    if (!sp)
        return UM_ERR_NOMEM;
    um__vt_mutex_lock(&sp->one_copy);
    if (!sp->slots) {
        um__vt_mutex_unlock(&sp->one_copy);
        void *slots = NULL;
        /* The copy can go unstaged: no wait for buffers other calls hold
         * (this call's caller may hold one). */
        bool was_optional = um__reclaim_optional(true);
        um_status st = um_malloc(x->ctx, 0, sp->slot_bytes, NULL, &slots);
        um__reclaim_optional(was_optional);
        if (st != UM_OK) {
            /* The allocator's own status (a failed map is not a full
             * memory), with its message; copied, as um__fail writes the
             * buffer um_last_error reads. */
            char why[512];
            snprintf(why, sizeof why, "%s", um_last_error());
            return um__fail(st,
                            "transfer engine: no staging buffers (%zu bytes of host memory): %s",
                            sp->slot_bytes, why);
        }
        um__vt_mutex_lock(&sp->one_copy);
        if (sp->slots) /* another copy gave the pool slots meanwhile: ours are spare */
            (void)um_free(x->ctx, slots, NULL);
        else
            sp->slots = slots;
    }
    *out = sp;
    return UM_OK;
}

/* The pool for one staged copy as stage_take gives it, or NULL when no
 * slots can be had (the host pool is full, say): the copy then goes
 * unstaged, which needs no host memory and is only slower. Failing it
 * instead kept a full host from taking a GPU's data into the spill file,
 * and a program from reading its buffer. */
static stage_pool *stage_slots(um__xfer *x, size_t n)
{
    stage_pool *sp;
    if (stage_take(x, &sp) == UM_OK)
        return sp;
    um__log(UM_LOG_INFO, "transfer engine: a copy of %zu bytes goes unstaged: %s", n,
            um_last_error());
    return NULL;
}

/* Leaves the slots in use (leaked) rather than reused, after a failed
 * copy whose DMA may still be running into them because even waiting for
 * its stream failed (err: why); the next staged copy takes new ones.
 * Under sp->one_copy; appends what happened to why. */
static void stage_leak(stage_pool *sp, const char *err, char *why, size_t len)
{
    size_t used = strlen(why);
    snprintf(why + used, len - used,
             "%swaiting for the copy's stream failed%s (%s), so the %zu bytes of staging "
             "buffers it may still be using are leaked, not reused",
             used ? "; " : "", used ? " too" : "", err, sp->slot_bytes);
    um__log(UM_LOG_WARN, "transfer engine: %zu bytes of staging buffers leaked after a failed "
            "copy whose stream could not be waited for", sp->slot_bytes);
    sp->slots = NULL;
}

/* After a failed staged copy, whose chunks may still be in flight (a chunk
 * whose event could not be recorded, or whose wait failed, has no one
 * waiting for it): waits for the stream that runs them before the slots
 * are used again, since a stale copy out of the GPU could otherwise land in
 * a slot that the next copy (on any GPU's stream) has just filled. False
 * where that wait failed. */
static bool stage_settle(stage_pool *sp, um__backend *be, um__bstream *s, char *why, size_t len)
{
    if (um__be_stream_sync(be, s) == UM_OK)
        return true;
    char err[512];
    snprintf(err, sizeof err, "%s", um_last_error());
    stage_leak(sp, err, why, len);
    return false;
}

/* Copies n bytes between program memory and the GPU r runs on through
 * sp's slots (from stage_slots; released here); waits for the whole copy.
 * A failure whose chunks may still run on the GPU's side makes *done the
 * unrecorded fence of r's stream. */
static um_status staged_copy(stage_pool *sp, const runner *r, char *dev, char *host, size_t n,
                             bool to_gpu, um__fence *done)
{
    um_status st = UM_OK;
    stage_job j = {r->be, r->stream->ref.bstream, dev, host, n, sp->chunk, to_gpu, sp->slots,
                   r, 0, false};
    size_t chunks = (n + j.chunk - 1) / j.chunk;
    int nw = sp->nworkers;
    if ((size_t)nw > (chunks + 1) / 2)
        nw = (int)((chunks + 1) / 2);
    um__vt_mutex_lock(&sp->lock);
    for (int i = 0; i < sp->nworkers; i++) {
        sp->w[i].job = &j;
        sp->w[i].st = UM_OK;
    }
    sp->job_workers = nw;
    sp->active = nw - 1;
    sp->generation++;
    pthread_cond_broadcast(&sp->work);
    um__vt_mutex_unlock(&sp->lock);
    stage_run(&sp->w[0]);
    um__vt_mutex_lock(&sp->lock);
    while (sp->active)
        pthread_cond_wait(&sp->done, &sp->lock);
    um__vt_mutex_unlock(&sp->lock);
    for (int i = 0; i < nw && st == UM_OK; i++) {
        if (sp->w[i].st != UM_OK) {
            char why[768];
            snprintf(why, sizeof why, "%s", sp->w[i].error);
            if (!stage_settle(sp, j.gpu, j.stream, why, sizeof why))
                *done = um__fence_unrecorded(r->be, r->stream);
            st = um__fail(sp->w[i].st, "staged copy of %zu bytes %s the GPU: %s", n,
                          to_gpu ? "to" : "from", why);
        }
    }
    um__vt_mutex_unlock(&sp->one_copy);
    return st;
}

/* Between two GPUs without peer access: two hops through sp's slots
 * (from stage_slots; released here), chunk by chunk, the first hop on the
 * source's copy-out stream and the second on the destination's copy-in
 * stream, each ordered after the other by events, so both hops run at once
 * on different chunks and the host only waits for the end. */
static um_status two_hop_copy(stage_pool *sp, runner out, runner in, char *dst, const char *src,
                              size_t n, const um__fence *after, int nafter, um__fence *done)
{
    int sd = out.stream->dev, dd = in.stream->dev;
    um__bstream *os = out.stream->ref.bstream, *is = in.stream->ref.bstream;
    um_status st = order_after(&out, after, nafter);
    if (st == UM_OK)
        st = order_after(&in, after, nafter);
    if (st != UM_OK) {
        um__vt_mutex_unlock(&sp->one_copy);
        return st;
    }
    int nslots = STAGE_SLOTS * sp->nworkers;
    um__bevent *hop1[STAGE_SLOTS * 64] = {0}, *hop2[STAGE_SLOTS * 64] = {0};
    size_t chunks = (n + sp->chunk - 1) / sp->chunk;
    for (size_t i = 0; i < chunks && st == UM_OK; i++) {
        int k = (int)(i % (size_t)nslots);
        char *slot = sp->slots + (size_t)k * sp->chunk;
        size_t off = i * sp->chunk, len = n - off < sp->chunk ? n - off : sp->chunk;
        /* The slot's previous second hop must have read it. */
        order_lock(&out);
        if (hop2[k])
            st = um__be_stream_wait(out.be, os, in.be, hop2[k]);
        if (st == UM_OK)
            st = um__be_copy_async(out.be, slot, src + off, len, os);
        if (hop1[k]) {
            um__be_event_destroy(out.be, hop1[k]);
            hop1[k] = NULL;
        }
        if (st == UM_OK)
            st = um__be_event_record(out.be, os, &hop1[k]);
        order_unlock(&out);
        order_lock(&in);
        if (st == UM_OK)
            st = um__be_stream_wait(in.be, is, out.be, hop1[k]);
        if (st == UM_OK)
            st = um__be_copy_async(in.be, dst + off, slot, len, is);
        if (hop2[k]) {
            um__be_event_destroy(in.be, hop2[k]);
            hop2[k] = NULL;
        }
        if (st == UM_OK)
            st = um__be_event_record(in.be, is, &hop2[k]);
        order_unlock(&in);
    }
    /* The slots are free again once both streams are past them; on a
     * failure (st), the streams are waited for all the same. */
    char why[768] = "", err[512] = "";
    if (st != UM_OK)
        snprintf(why, sizeof why, "%s", um_last_error());
    um_status s2 = um__be_stream_sync(out.be, os);
    if (s2 != UM_OK)
        snprintf(err, sizeof err, "%s", um_last_error());
    um_status s3 = um__be_stream_sync(in.be, is);
    if (s3 != UM_OK && s2 == UM_OK)
        snprintf(err, sizeof err, "%s", um_last_error());
    if (s2 != UM_OK || s3 != UM_OK) {
        /* A hop may still be running into or out of a slot, out of src
         * or into dst: the second hops' stream, after the first hops',
         * stands for them. */
        if (st == UM_OK)
            st = s2 != UM_OK ? s2 : s3;
        stage_leak(sp, err, why, sizeof why);
        *done = um__fence_unrecorded(in.be, in.stream);
        done->upstream = out.stream;
    }
    for (int k = 0; k < nslots; k++) {
        if (hop1[k])
            um__be_event_destroy(out.be, hop1[k]);
        if (hop2[k])
            um__be_event_destroy(in.be, hop2[k]);
    }
    um__vt_mutex_unlock(&sp->one_copy);
    if (st != UM_OK)
        st = um__fail(st, "two-hop copy of %zu bytes from device %d to device %d: %s", n, sd, dd,
                      why);
    return st;
}

static bool peer_access(um_context *ctx, int from, int to)
{
    um_link_info li;
    return ctx->opts.peer_copies && um_device_link_get(ctx, from, to, &li) == UM_OK &&
           li.peer_access;
}

/* Whether p is program memory the GPU's copy engine reads slowly: not from
 * the host pool, or from a host pool that is not page-locked. */
static bool pageable(um__xfer *x, const void *p)
{
    return !x->ctx->devices[0].backend->pinned || um_pointer_device(x->ctx, p) != 0;
}

um_status um__xfer_copy(um__xfer *x, int dd, void *dst, int sd, const void *src, size_t n,
                        const um__fence *after, int nafter, um__fence *done)
{
    *done = UM_FENCE_NONE;
    stage_pool *sp = NULL;
    /* Without slots the copy goes directly, which the driver does between
     * GPUs without peer access too (slower). */
    runner out = {NULL, NULL, NULL}, in = {NULL, NULL, NULL};
    if (dd != sd && is_gpu(x->ctx, dd) && is_gpu(x->ctx, sd) && !peer_access(x->ctx, sd, dd) &&
        n >= x->ctx->opts.copy_chunk) {
        /* The engine's streams first: taking x->lock (a stream made on
         * first use) under the pool's one_copy deadlocked with an eviction
         * holding x->lock for its staged write-back (found by an audit). */
        out = engine_runner(x, sd, false);
        in = engine_runner(x, dd, true);
        sp = stage_slots(x, n);
    }
    if (sp) {
        /* Its hops wait for the fences on the GPUs' streams, not here, so
         * the copy starts when issued (as far as the host can tell). */
        uint64_t t0 = um__now_ns();
        um_status st = two_hop_copy(sp, out, in, dst, src, n, after, nafter, done);
        if (st != UM_OK)
            return st;
        runner none = {NULL, NULL, NULL};
        count_copy(x, sd, dd, n);
        return finish(x, &none, sd, dd, t0, n, true, NULL, done);
    }
    runner r = pick_runner(x, dd, sd);
    bool gpu_to_host = r.stream && dd == 0 && is_gpu(x->ctx, sd);
    bool host_to_gpu = r.stream && sd == 0 && is_gpu(x->ctx, dd);
    bool stage = n >= 2 * x->ctx->opts.copy_chunk && x->ctx->devices[0].backend->pinned &&
                 ((gpu_to_host && pageable(x, dst)) || (host_to_gpu && pageable(x, src)));
    /* A staged copy is the host's work, so the host waits for the fences
     * (before it takes the staging slots, which other copies share). */
    runner waiter = {r.be, stage ? NULL : r.stream, stage ? NULL : r.order};
    um_status st = order_after(&waiter, after, nafter);
    if (st != UM_OK)
        return st;
    /* The copy's busy time starts here, once its fences are done: a copy
     * that runs on the host waited for them just now (order_after), and
     * timed from before that wait, it counted as busy on its link for
     * the whole of an earlier copy it had to wait for. A copy queued on a
     * stream waits for them (and for the stream's earlier work) on the
     * device, so it is timed there, between timed events, where the
     * backend has them; else it counts from its issue. */
    uint64_t t0 = um__now_ns();
    um__bevent *start = NULL;
    stage = stage && (sp = stage_slots(x, n));
    if (stage) {
        st = staged_copy(sp, &r, gpu_to_host ? (char *)src : dst,
                         gpu_to_host ? dst : (char *)src, n, host_to_gpu, done);
        r.stream = NULL; /* done: nothing to wait for */
        r.order = NULL;
    } else if (r.be) {
        um__bstream *bs = r.stream ? r.stream->ref.bstream : NULL;
        /* From the question whether the copy may wait to its end event,
         * nothing else is queued on the stream (see um__xfer.order). */
        order_lock(&r);
        /* Virtual time keeps no completion times (the sim's timed events
         * cannot say when they completed there). */
        bool timed = r.stream && um__be_timed_events(r.be) && !um__vt_on() &&
                     (r.be->cheap_timed_events || may_wait(&r, after, nafter));
        /* Untimed where the start cannot be recorded: nothing else lost. */
        if (timed && um__be_event_record_timed(r.be, bs, &start) != UM_OK)
            start = NULL;
        st = um__be_copy_async(r.be, dst, src, n, bs);
    } else {
        memmove(dst, src, n);
    }
    if (st != UM_OK) {
        order_unlock(&r);
        if (start)
            um__be_event_destroy_timed(r.be, start);
        return st;
    }
    count_copy(x, sd, dd, n);
    st = finish(x, &r, sd, dd, t0, n, stage, start, done);
    order_unlock(&r);
    return st;
}

um_status um__xfer_zero(um__xfer *x, int dev, void *dst, size_t n, const um__fence *after,
                        int nafter, um__fence *done)
{
    *done = UM_FENCE_NONE;
    runner r = pick_runner(x, dev, dev);
    um_status st = order_after(&r, after, nafter);
    if (st != UM_OK)
        return st;
    order_lock(&r);
    if (r.be)
        st = um__be_memset_async(r.be, dst, 0, n, r.stream ? r.stream->ref.bstream : NULL);
    else
        memset(dst, 0, n);
    if (st == UM_OK)
        st = finish(x, &r, -1, -1, 0, 0, false, NULL, done);
    order_unlock(&r);
    return st;
}

/* ------------------------------------------------ memory still in use */

static bool all_done(um__xfer *x, held_memory *h)
{
    for (int i = 0; i < h->nfences; i++)
        if (!um__fence_done(x, &h->fences[i]))
            return false;
    return true;
}

void um__xfer_free_later(um__xfer *x, int dev, void *ptr, um__fence *fences, int nfences)
{
    held_memory h = {dev, ptr, {{0}}, 0};
    for (int i = 0; i < nfences; i++)
        if (um__fence_pending(&fences[i]))
            h.fences[h.nfences++] = fences[i];
    if (all_done(x, &h)) {
        (void)um_free(x->ctx, ptr, NULL);
        return;
    }
    um__vt_mutex_lock(&x->lock);
    if (x->nheld == x->held_cap) {
        size_t cap = x->held_cap ? x->held_cap * 2 : 16;
        held_memory *a = realloc(x->held, cap * sizeof *a);
        if (!a) {
            um__vt_mutex_unlock(&x->lock);
            /* No room to remember it: wait for its users here instead. */
            for (int i = 0; i < h.nfences; i++)
                (void)um__fence_wait(x, &h.fences[i]);
            (void)um_free(x->ctx, ptr, NULL);
            return;
        }
        x->held = a;
        x->held_cap = cap;
    }
    x->held[x->nheld++] = h;
    atomic_store_explicit(&x->nheld_pending, x->nheld, memory_order_release);
    um__vt_mutex_unlock(&x->lock);
}

uint64_t um__xfer_poll(um__xfer *x)
{
    if (!atomic_load_explicit(&x->nheld_pending, memory_order_acquire))
        return 0;
    uint64_t freed = 0;
    um__vt_mutex_lock(&x->lock);
    size_t kept = 0;
    for (size_t i = 0; i < x->nheld; i++) {
        if (all_done(x, &x->held[i])) {
            (void)um_free(x->ctx, x->held[i].ptr, NULL);
            freed |= (uint64_t)1 << x->held[i].dev;
        } else {
            x->held[kept++] = x->held[i];
        }
    }
    x->nheld = kept;
    atomic_store_explicit(&x->nheld_pending, kept, memory_order_release);
    um__vt_mutex_unlock(&x->lock);
    return freed;
}

int um__xfer_wait_held(um__xfer *x, int dev)
{
    if (!atomic_load_explicit(&x->nheld_pending, memory_order_acquire))
        return 0;
    um__vt_mutex_lock(&x->lock);
    size_t i = 0;
    while (i < x->nheld && x->held[i].dev != dev)
        i++;
    if (i == x->nheld) {
        um__vt_mutex_unlock(&x->lock);
        return 0;
    }
    held_memory h = x->held[i];
    /* The oldest stays first: the next wait takes the next oldest. */
    memmove(&x->held[i], &x->held[i + 1], (x->nheld - i - 1) * sizeof *x->held);
    x->nheld--;
    atomic_store_explicit(&x->nheld_pending, x->nheld, memory_order_release);
    /* Off the list, the memory is on no list reclaim looks at until it is
     * freed: counted as a destroy in progress, so that another allocation
     * waits for it as for a busy buffer rather than fail with "nothing
     * left to evict" (found by an audit: two allocations, one waiting here
     * for the copy of a destroyed buffer, the other failing at once). */
    um__reclaim_destroying(x->reclaim, dev, 1);
    um__vt_mutex_unlock(&x->lock);
    um_status st = UM_OK;
    for (int k = 0; k < h.nfences && st == UM_OK; k++)
        st = um__fence_wait(x, &h.fences[k]);
    if (st == UM_OK) {
        (void)um_free(x->ctx, h.ptr, NULL);
        um__reclaim_destroying(x->reclaim, dev, -1);
        return 1;
    }
    /* A copy may still write there: freed, the memory could go to another
     * buffer under it. It is held again, last (the next wait takes the
     * next oldest), or, where others filled the list meanwhile, never
     * freed; and the caller learns why it got no room. */
    char why[300];
    um__error_detail(st, why, sizeof why);
    um__vt_mutex_lock(&x->lock);
    if (x->nheld < x->held_cap) {
        x->held[x->nheld++] = h;
        atomic_store_explicit(&x->nheld_pending, x->nheld, memory_order_release);
    }
    um__vt_mutex_unlock(&x->lock);
    um__reclaim_destroying(x->reclaim, dev, -1);
    um__fail(st,
             "device %d: the memory of a destroyed buffer is kept: the work using it could "
             "not be waited for (%s)",
             dev, why);
    return -1;
}

/* um_trim's hook: the memory of destroyed buffers whose users are done. */
static void collect_held(um_context *ctx)
{
    um__xfer *x = atomic_load_explicit(&ctx->xfer, memory_order_acquire);
    if (x)
        um__xfer_poll(x);
}

/* ---------------------------------------------------------- statistics */

um_status um_link_stats_get(um_context *ctx, int from, int to, um_link_stats *out)
{
    if (!ctx || !out)
        return um__fail(UM_ERR_INVALID, "um_link_stats_get: %s is NULL", ctx ? "out" : "ctx");
    if (from < -1 || from >= ctx->ndevices || to < -1 || to >= ctx->ndevices)
        return um__fail(UM_ERR_NO_DEVICE,
                        "um_link_stats_get: link %d -> %d: the context has devices 0..%d (-1: "
                        "every device)",
                        from, to, ctx->ndevices - 1);
    memset(out, 0, sizeof *out);
    um__xfer *x;
    um_status st = um__xfer_get(ctx, &x);
    if (st != UM_OK)
        return st;
    um__xfer_poll(x);
    /* -1 sums over every device on that side (a device's copies in or out). */
    for (int a = 0; a < x->ndev; a++) {
        for (int b = 0; b < x->ndev; b++) {
            if ((from >= 0 && a != from) || (to >= 0 && b != to))
                continue;
            link_counters *l = &x->links[a * x->ndev + b];
            out->bytes += atomic_load_explicit(&l->bytes, memory_order_relaxed);
            out->copies += atomic_load_explicit(&l->copies, memory_order_relaxed);
            out->busy_ns += atomic_load_explicit(&l->busy_ns, memory_order_relaxed);
        }
    }
    if (from >= 0 && to >= 0) {
        size_t k = (size_t)from * (size_t)x->ndev + (size_t)to;
        out->bandwidth_gbps = 1.0 / x->ns_per_byte[k];
        out->latency_us = x->lat_ns[k] / 1000.0;
    }
    /* A link's own cost may be the model's where others were timed. */
    out->measured = from >= 0 && to >= 0 ? x->timed[(size_t)from * (size_t)x->ndev + (size_t)to]
                                         : x->measured;
    return UM_OK;
}

/* ------------------------------------------------------------ shutdown */

static void buffers_fini(um_context *ctx)
{
    um__xfer *x = atomic_load_explicit(&ctx->xfer, memory_order_acquire);
    if (!x)
        return;
    atomic_store_explicit(&ctx->reclaim, NULL, memory_order_release);
    atomic_store_explicit(&ctx->collect, NULL, memory_order_release);
    um__reclaim_destroy(x->reclaim);
    x->reclaim = NULL;
    while (x->buffers)
        um__buffer_discard(x->buffers); /* untracks it */
    stage_pool_destroy(x);
    um__spill_destroy(x->spill);
    for (size_t i = 0; i < x->nheld; i++) {
        held_memory *h = &x->held[i];
        for (int k = 0; k < h->nfences; k++)
            if (um__fence_wait(x, &h->fences[k]) != UM_OK)
                um__fence_drop(&h->fences[k]);
        (void)um_free(ctx, h->ptr, NULL);
    }
    for (int d = 0; d < x->ndev; d++) {
        if (x->to[d] && x->to[d] != ctx->devices[d].default_stream)
            (void)um_stream_destroy(ctx, x->to[d]);
        if (x->from[d] && x->from[d] != ctx->devices[d].default_stream)
            (void)um_stream_destroy(ctx, x->from[d]);
        if (x->join[d] && x->join[d] != ctx->devices[d].default_stream)
            (void)um_stream_destroy(ctx, x->join[d]);
    }
    while (x->spare) {
        um_buffer *b = x->spare;
        x->spare = b->next;
        pthread_mutex_destroy(&b->lock);
        free(b);
    }
    free(x->held);
    free(x->links);
    free(x->lat_ns);
    free(x->ns_per_byte);
    free(x->timed);
    pthread_mutex_destroy(&x->lock);
    for (int d = 0; d < UM_MAX_DEVICES; d++)
        for (int k = 0; k < 2; k++)
            pthread_mutex_destroy(&x->order[d][k]);
    free(x);
    ctx->xfer = NULL;
    ctx->buffers_fini = NULL;
}
