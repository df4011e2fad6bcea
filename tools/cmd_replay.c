/*
 * `unimem replay FILE`: replays a real allocation trace against unimem's
 * pool and the two baselines (no cache; MLX's buffer cache) on one device,
 * each in a fresh context, and prints what each needed: peak reserved bytes
 * against the trace's peak live bytes, backend calls, failed allocations,
 * time per event and, with --min-limit, the smallest memory limit under
 * which the whole trace still runs. Owns nothing outside the command: the
 * trace is read once into memory (so timing measures the allocator, not
 * gzip), and every context is shut down before the next starts. Uses
 * include/unimem.h, and the library's address map (base/addrmap.h) to find
 * a stream's index.
 */
#include "tool.h"

#include "base/addrmap.h"

#include <stdlib.h>
#include <string.h>

#define REPLAY_CMD "replay"
#define REPLAY_DEFAULT_DEVICE "sim:141G"
#define REPLAY_STEP ((uint64_t)2 * 1024 * 1024) /* min-limit resolution */

/* One event as the replay loop needs it: 16 bytes, so a trace of millions
 * of events stays small. op_stream is (stream index << 1) | op. */
typedef struct rp_event {
    uint64_t size;
    uint32_t slot;
    uint32_t op_stream;
} rp_event;

typedef struct rp_trace {
    const char *path;
    const char *name; /* the file name without its directory */
    rp_event *ev;
    size_t n, cap;
    uint64_t allocs, frees, peak_live, slots;
    uint64_t *streams; /* distinct stream values, in order of appearance */
    uint32_t nstreams, streams_cap;
    /* Stream value -> its index in streams. The map takes no key 0, so the
     * index of stream 0 (the default stream) is kept apart. */
    um__addrmap stream_indexes;
    uint32_t stream0_index; /* UINT32_MAX until stream 0 appears */
} rp_trace;

typedef struct rp_result {
    const char *allocator; /* the allocator option's word */
    const char *label;     /* the table row */
    uint64_t peak_reserved, backend_calls, failed_allocs;
    uint64_t driver_peak; /* peak of the driver's used memory; 0: not measured */
    double ns_per_event;
    uint64_t max_event_ns;
    double lag_mean; /* --lag: units queued after an event, on average (rp_run) */
    bool have_min; /* min_limit measured */
    uint64_t min_limit;
} rp_result;

typedef struct rp_opts {
    const char *file;
    const char *device;
    uint64_t limit; /* 0: none */
    bool json;
    bool min_limit;
    uint64_t lag;  /* sim only: the simulated work trails the events by this many */
} rp_opts;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: unimem replay FILE [--device SPEC] [--limit BYTES] [--json] [--min-limit]\n"
            "                         [--lag N]\n"
            "\n"
            "Replays an allocation trace (a <id> <size> <stream> / f <id> lines, gzip or plain)\n"
            "against unimem's pool and two baselines: no cache, and an MLX-style buffer cache.\n"
            "\n"
            "  --device SPEC   the device to replay on: a value of the devices option\n"
            "                  (default " REPLAY_DEFAULT_DEVICE
            ", an H200-sized simulated device; the first\n"
            "                  accelerator is used; cuda:0 for GPU 0), or 'host' for device 0\n"
            "  --limit BYTES   memory limit for all three runs (K/M/G suffixes), at most the\n"
            "                  device's memory; allocations that fail under it are counted\n"
            "  --min-limit     also bisect, per allocator, the smallest memory limit (in 2 MiB\n"
            "                  steps) under which the trace runs with no failed allocation\n"
            "  --lag N         sim devices: each event is a unit of simulated work that the\n"
            "                  device finishes N events later (a GPU trailing its program), so\n"
            "                  memory freed in the last N events is still fenced; a wait for\n"
            "                  a stream lets its device catch up, then it falls behind again\n"
            "  --json          one JSON object on stdout instead of the table\n");
}

/* --------------------------------------------------------------- trace */

static void trace_free(rp_trace *t)
{
    free(t->ev);
    free(t->streams);
    um__addrmap_free(&t->stream_indexes);
    memset(t, 0, sizeof *t);
}

/* The index of stream value v, added if new. Real traces have a handful of
 * streams, mostly one after another, so the last hit is tried first; a
 * hash map finds the rest, since a scan of the list made a hostile trace
 * with many distinct streams take quadratic time (200,000 streams: 8 s to
 * read, against 0.2 s). */
static int stream_index(rp_trace *t, uint64_t v, uint32_t *last, uint32_t *out)
{
    if (*last < t->nstreams && t->streams[*last] == v) {
        *out = *last;
        return 0;
    }
    if (v == 0 && t->stream0_index != UINT32_MAX) {
        *out = *last = t->stream0_index;
        return 0;
    }
    uint64_t found;
    if (v != 0 && um__addrmap_get(&t->stream_indexes, v, &found)) {
        *out = *last = (uint32_t)found;
        return 0;
    }
    if (t->nstreams == t->streams_cap) {
        uint32_t cap = t->streams_cap ? t->streams_cap * 2 : 8;
        if (cap > (1u << 30))
            return -1;
        uint64_t *s = realloc(t->streams, cap * sizeof *s);
        if (!s)
            return -1;
        t->streams = s;
        t->streams_cap = cap;
    }
    if (v == 0)
        t->stream0_index = t->nstreams;
    else if (!um__addrmap_put(&t->stream_indexes, v, t->nstreams))
        return -1;
    t->streams[t->nstreams] = v;
    *out = *last = t->nstreams++;
    return 0;
}

/* Reads and validates the whole trace into memory. Returns 0, or the exit
 * code after printing the error. */
static int trace_load(const rp_opts *o, rp_trace *t)
{
    memset(t, 0, sizeof *t);
    t->stream0_index = UINT32_MAX;
    t->path = o->file;
    const char *slash = strrchr(o->file, '/');
    t->name = slash ? slash + 1 : o->file;
    um_trace *tr = NULL;
    um_status s = um_trace_open(o->file, &tr);
    if (s != UM_OK)
        return tool_fail(REPLAY_CMD, s);
    uint64_t live = 0;
    uint32_t last = 0;
    um_trace_event ev;
    int done = 0;
    while ((s = um_trace_next(tr, &ev, &done)) == UM_OK && !done) {
        if (t->n == t->cap) {
            size_t cap = t->cap ? t->cap * 2 : 65536;
            rp_event *e = realloc(t->ev, cap * sizeof *e);
            if (!e) {
                tool_progress_clear();
                fprintf(stderr, "unimem replay: %s: no memory for %zu events (%zu bytes)\n",
                        o->file, cap, cap * sizeof *e);
                um_trace_close(tr);
                trace_free(t);
                return 1;
            }
            t->ev = e;
            t->cap = cap;
        }
        uint32_t si;
        if (ev.slot >= UINT32_MAX || stream_index(t, ev.stream, &last, &si) != 0) {
            tool_progress_clear();
            fprintf(stderr, "unimem replay: %s:%llu: too many %s for the replay\n", o->file,
                    (unsigned long long)ev.line, ev.slot >= UINT32_MAX ? "blocks" : "streams");
            um_trace_close(tr);
            trace_free(t);
            return 1;
        }
        /* No real program holds 2^64 bytes at once: a trace whose live
         * total would wrap around is bogus, and its peak would be wrong. */
        if (ev.op == UM_TRACE_ALLOC && ev.size > UINT64_MAX - live) {
            tool_progress_clear();
            fprintf(stderr,
                    "unimem replay: %s:%llu: the live bytes pass 2^64 (%llu live, an allocation "
                    "of %llu)\n",
                    o->file, (unsigned long long)ev.line, (unsigned long long)live,
                    (unsigned long long)ev.size);
            um_trace_close(tr);
            trace_free(t);
            return TOOL_EXIT_FAILED;
        }
        t->ev[t->n++] = (rp_event){ev.size, (uint32_t)ev.slot, si << 1 | (uint32_t)ev.op};
        if (ev.op == UM_TRACE_ALLOC) {
            t->allocs++;
            live += ev.size;
            if (live > t->peak_live)
                t->peak_live = live;
        } else {
            t->frees++;
            live -= ev.size;
        }
        if ((t->n & 4095) == 0)
            tool_progress("reading trace", um_trace_progress(tr));
    }
    tool_progress_clear();
    t->slots = um_trace_slots(tr);
    um_trace_close(tr);
    if (s != UM_OK) {
        trace_free(t);
        return tool_fail(REPLAY_CMD, s);
    }
    /* Nothing to replay: a table of zeros would pass for a result. */
    if (t->n == 0) {
        fprintf(stderr, "unimem replay: %s has no events\n", o->file);
        trace_free(t);
        return TOOL_EXIT_FAILED;
    }
    return 0;
}

/* -------------------------------------------------------------- replay */

/* What one replay found. */
typedef struct rp_run {
    uint64_t peak_reserved, backend_calls, failed_allocs, ns;
    uint64_t max_event_ns; /* the slowest single event (a stall the average hides) */
    uint64_t driver_peak; /* CUDA: the driver's used memory at unimem's peak */
    double lag_mean;      /* --lag: units queued on an event's stream after it, on average */
    size_t granularity;
    char *stats_table;    /* um_stats_print of the context at the end (malloc'd), or NULL */
} rp_run;

/* The driver's view of a GPU during a replay, sampled every
 * DRIVER_WATCH_EVERY allocations and at the end: um_stats_get walks the
 * pool's blocks, so a sample per event would dominate the replay's time.
 * Without --limit the pool never gives pages back during a replay (no
 * trim, no cache limit), so its peak is its reserved memory at the end
 * and no sample misses it; under --limit it may, and the baselines that
 * free chunks always may: for them the figure is a sampled peak, which
 * can miss the true one. */
#define DRIVER_WATCH_EVERY 64

typedef struct driver_watch {
    um_context *ctx;
    int dev;
    bool on;
    unsigned countdown;
    size_t free_before, seen_reserved;
    uint64_t peak_used;
} driver_watch;

static um_status driver_watch_start(driver_watch *w, um_context *ctx, int dev, bool on)
{
    size_t total;
    memset(w, 0, sizeof *w);
    w->ctx = ctx;
    w->dev = dev;
    w->on = on;
    return on ? um_device_memory_get(ctx, dev, &w->free_before, &total) : UM_OK;
}

static um_status driver_watch_sample(driver_watch *w, bool now)
{
    if (!w->on || (!now && ++w->countdown < DRIVER_WATCH_EVERY))
        return UM_OK;
    w->countdown = 0;
    um_stats st;
    size_t free_now, total;
    um_status s = um_stats_get(w->ctx, w->dev, &st);
    if (s != UM_OK || st.reserved_bytes <= w->seen_reserved)
        return s;
    w->seen_reserved = st.reserved_bytes;
    if ((s = um_device_memory_get(w->ctx, w->dev, &free_now, &total)) != UM_OK)
        return s;
    uint64_t used = w->free_before > free_now ? w->free_before - free_now : 0;
    if (used > w->peak_used)
        w->peak_used = used;
    return UM_OK;
}

/* Replays the trace once on a fresh context with allocator `alloc` and
 * memory limit `limit` (0: none). With stop_on_fail, the first failed
 * allocation ends the run (min-limit trials only need yes or no). Returns
 * 0, 1 after printing an error, or 2 when the device spec was refused. */
static int replay_once(const rp_opts *o, const rp_trace *t, const char *alloc, uint64_t limit,
                       bool stop_on_fail, const char *what, rp_run *out)
{
    memset(out, 0, sizeof *out);
    bool host = !strcmp(o->device, "host");
    int dev = host ? 0 : 1;
    char conf[512];
    if (host)
        snprintf(conf, sizeof conf, "allocator=%s", alloc);
    else
        snprintf(conf, sizeof conf, "devices=%s,allocator=%s", o->device, alloc);
    um_context *ctx = NULL;
    um_status s = um_init(conf, &ctx);
    if (s != UM_OK) {
        /* A --device the options refuse is an argument error. */
        int rc = tool_init_fail(REPLAY_CMD, s);
        if (rc == TOOL_EXIT_USAGE) {
            fputc('\n', stderr);
            usage(stderr);
        }
        return rc;
    }
    um_stream *streams = calloc(t->nstreams ? t->nstreams : 1, sizeof *streams);
    void **ptrs = calloc(t->slots ? t->slots : 1, sizeof *ptrs);
    uint32_t *ring = NULL;
    uint64_t *launched = NULL, *retired = NULL;
    int rc = 0;
    if (!streams || !ptrs) {
        fprintf(stderr, "unimem replay: no memory for %llu block pointers\n",
                (unsigned long long)t->slots);
        rc = 1;
        goto out;
    }
    if (um_device_count(ctx) <= dev) {
        fprintf(stderr, "unimem replay: --device %s gives no accelerator to replay on\n",
                o->device);
        rc = TOOL_EXIT_USAGE;
        goto out;
    }
    um_device_info info;
    if ((s = um_device_info_get(ctx, dev, &info)) != UM_OK) {
        rc = tool_fail(REPLAY_CMD, s);
        goto out;
    }
    out->granularity = info.granularity;
    /* The user's limit; the bisection of --min-limit may try above it. */
    if (!tool_limit_fits(REPLAY_CMD, &info, dev, o->limit)) {
        rc = TOOL_EXIT_USAGE;
        goto out;
    }
    if (limit && (s = um_set_memory_limit(ctx, dev, (size_t)limit)) != UM_OK) {
        rc = tool_fail(REPLAY_CMD, s);
        goto out;
    }
    /* On a GPU the driver's own count is watched: at every new peak of
     * reserved bytes, cuMemGetInfo's used memory (less what was used before
     * the replay) is sampled, so the table can show both views. */
    driver_watch dw;
    if ((s = driver_watch_start(&dw, ctx, dev, info.kind == UM_DEVICE_CUDA)) != UM_OK) {
        rc = tool_fail(REPLAY_CMD, s);
        goto out;
    }
    /* The trace's stream 0 is the device's default stream. */
    for (uint32_t i = 0; i < t->nstreams; i++) {
        if (t->streams[i] != 0 && (s = um_stream_create(ctx, dev, &streams[i])) != UM_OK) {
            rc = tool_fail(REPLAY_CMD, s);
            goto out;
        }
    }
    /* --lag: the stream of each of the last `lag` events (a ring), and per
     * stream the units launched and those the lag has retired so far. */
    size_t ring_cap = o->lag ? (size_t)(o->lag < t->n ? o->lag : t->n) : 0, ring_len = 0,
           ring_head = 0;
    if (o->lag) {
        ring = malloc((ring_cap ? ring_cap : 1) * sizeof *ring);
        launched = calloc(t->nstreams ? t->nstreams : 1, sizeof *launched);
        retired = calloc(t->nstreams ? t->nstreams : 1, sizeof *retired);
        if (!ring || !launched || !retired) {
            fprintf(stderr, "unimem replay: no memory for --lag %llu\n",
                    (unsigned long long)o->lag);
            rc = 1;
            goto out;
        }
    }
    uint64_t t0 = tool_now_ns(), last = t0, queued_sum = 0, lagged = 0;
    for (size_t i = 0; i < t->n; i++) {
        const rp_event *e = &t->ev[i];
        um_stream st = streams[e->op_stream >> 1];
        if ((e->op_stream & 1) == UM_TRACE_ALLOC) {
            s = um_malloc(ctx, dev, (size_t)e->size, st, &ptrs[e->slot]);
            if (s == UM_ERR_NOMEM) {
                out->failed_allocs++;
                ptrs[e->slot] = NULL; /* its free is skipped */
                if (stop_on_fail)
                    break;
            } else if (s != UM_OK || (s = driver_watch_sample(&dw, false)) != UM_OK) {
                tool_progress_clear();
                rc = tool_fail(REPLAY_CMD, s);
                goto out;
            }
        } else if (ptrs[e->slot]) {
            if ((s = um_free(ctx, ptrs[e->slot], st)) != UM_OK) {
                tool_progress_clear();
                rc = tool_fail(REPLAY_CMD, s);
                goto out;
            }
            ptrs[e->slot] = NULL;
        }
        /* --lag: every event is one unit of simulated work on its stream,
         * done `lag` events later, counted over all streams, as a GPU trails
         * the program that queues its kernels. When an event leaves the
         * window of the last `lag`, its unit is completed on its own
         * stream unless an allocator's wait already did: the stream is
         * asked what is still queued, since a wait completes it all, and
         * the device then trails by less until the program has run ahead
         * again. (Keeping each stream's own last `lag` units instead left a
         * stream with few events, such as a side stream of copies, trailing
         * by far more than `lag` events, its frees fenced that much longer.) */
        if (o->lag) {
            uint32_t si = e->op_stream >> 1;
            s = um_sim_stream_work(ctx, dev, st, 1, 0);
            launched[si]++;
            if (ring_len == ring_cap) {
                uint32_t old = ring[ring_head];
                ring[ring_head] = si;
                ring_head = (ring_head + 1) % ring_cap;
                retired[old]++;
                uint64_t q = 0;
                if (s == UM_OK)
                    s = um_sim_stream_queued(ctx, dev, streams[old], &q);
                /* Units are done in order: the first launched - q are. */
                uint64_t done = launched[old] - q;
                if (s == UM_OK && done < retired[old])
                    s = um_sim_stream_work(ctx, dev, streams[old], 0,
                                           (unsigned)(retired[old] - done));
            } else {
                ring[(ring_head + ring_len++) % ring_cap] = si;
            }
            uint64_t queued = 0;
            if (s == UM_OK)
                s = um_sim_stream_queued(ctx, dev, st, &queued);
            if (s != UM_OK) {
                tool_progress_clear();
                rc = tool_fail(REPLAY_CMD, s);
                goto out;
            }
            queued_sum += queued;
            lagged++;
        }
        /* One clock read an event: each event's time is the gap since
         * the previous one's end. */
        uint64_t now = tool_now_ns();
        if (now - last > out->max_event_ns)
            out->max_event_ns = now - last;
        last = now;
        if ((i & 1023) == 0)
            tool_progress(what, (double)i / (double)t->n);
    }
    out->ns = tool_now_ns() - t0;
    out->lag_mean = lagged ? (double)queued_sum / (double)lagged : 0.0;
    tool_progress_clear();
    if ((s = driver_watch_sample(&dw, true)) != UM_OK) {
        rc = tool_fail(REPLAY_CMD, s);
        goto out;
    }
    um_stats stats;
    if ((s = um_stats_get(ctx, dev, &stats)) != UM_OK) {
        rc = tool_fail(REPLAY_CMD, s);
        goto out;
    }
    out->peak_reserved = stats.peak_reserved_bytes;
    out->backend_calls = stats.num_backend_calls;
    out->driver_peak = dw.peak_used;
    /* The library's own table, printed after the comparison. */
    size_t table_len = 0;
    FILE *mem = open_memstream(&out->stats_table, &table_len);
    if (mem) {
        um_stats_print(ctx, mem);
        fclose(mem);
    }
out:
    free(ring);
    free(launched);
    free(retired);
    /* Newest first: the context finds a stream to destroy by walking its
     * streams from the newest, so destroying the oldest first walked them
     * all each time, quadratic in a trace with many streams. */
    for (uint32_t i = t->nstreams; streams && i-- > 0;)
        if (streams[i])
            um_stream_destroy(ctx, streams[i]);
    free(streams);
    free(ptrs);
    um_shutdown(ctx); /* gives back the blocks still live at the end */
    return rc;
}

static uint64_t round_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

/* Bisects the smallest limit, a multiple of 2 MiB, under which the trace
 * runs with no failed allocation. Below round_up(peak live) - 2 MiB nothing
 * can work; the unlimited peak reserved plus one page always should, and is
 * checked. Returns 0 (r->have_min says whether a limit was found) or an
 * exit code. */
static int find_min_limit(const rp_opts *o, const rp_trace *t, rp_result *r,
                          uint64_t unlimited_peak, size_t page)
{
    char what[64];
    snprintf(what, sizeof what, "min limit: %s", r->allocator);
    uint64_t lo = round_up(t->peak_live, REPLAY_STEP);
    lo = lo >= REPLAY_STEP ? lo - REPLAY_STEP : 0;
    uint64_t hi = round_up(unlimited_peak + page, REPLAY_STEP);
    if (hi <= lo)
        hi = lo + REPLAY_STEP;
    rp_run run;
    int rc = replay_once(o, t, r->allocator, hi, true, what, &run);
    free(run.stats_table);
    if (rc)
        return rc;
    if (run.failed_allocs) {
        fprintf(stderr,
                "unimem replay: %s: allocations fail even under a limit of %llu bytes, above its "
                "unlimited peak; no minimum limit reported\n",
                r->allocator, (unsigned long long)hi);
        return 0;
    }
    while (hi - lo > REPLAY_STEP) {
        uint64_t mid = lo + (hi - lo) / REPLAY_STEP / 2 * REPLAY_STEP;
        rc = replay_once(o, t, r->allocator, mid, true, what, &run);
        free(run.stats_table);
        if (rc != 0)
            return rc;
        if (run.failed_allocs)
            lo = mid;
        else
            hi = mid;
    }
    r->have_min = true;
    r->min_limit = hi;
    return 0;
}

/* ------------------------------------------------------------- output */

static double ratio(uint64_t a, uint64_t b)
{
    return b ? (double)a / (double)b : 0.0;
}

static void json_fields(const rp_opts *o, const rp_trace *t, const rp_result *r)
{
    printf("\"peak_reserved_bytes\": %llu, \"reserved_over_live\": %.4f, "
           "\"backend_calls\": %llu, \"failed_allocs\": %llu, \"ns_per_event\": %.1f, "
           "\"max_event_ns\": %llu, ",
           (unsigned long long)r->peak_reserved, ratio(r->peak_reserved, t->peak_live),
           (unsigned long long)r->backend_calls, (unsigned long long)r->failed_allocs,
           r->ns_per_event, (unsigned long long)r->max_event_ns);
    if (r->driver_peak)
        printf("\"driver_peak_used_bytes\": %llu, \"driver_over_reserved\": %.4f, ",
               (unsigned long long)r->driver_peak, ratio(r->driver_peak, r->peak_reserved));
    else
        printf("\"driver_peak_used_bytes\": null, \"driver_over_reserved\": null, ");
    if (o->lag)
        printf("\"lag_mean_queued\": %.2f, ", r->lag_mean);
    else
        printf("\"lag_mean_queued\": null, ");
    if (r->have_min)
        printf("\"min_limit_bytes\": %llu, \"min_limit_over_live\": %.4f",
               (unsigned long long)r->min_limit, ratio(r->min_limit, t->peak_live));
    else
        printf("\"min_limit_bytes\": null, \"min_limit_over_live\": null");
}

static void print_json(const rp_opts *o, const rp_trace *t, const rp_result *r)
{
    printf("{\"trace\": ");
    tool_json_string(stdout, t->name);
    printf(", \"path\": ");
    tool_json_string(stdout, t->path);
    printf(", \"device\": ");
    tool_json_string(stdout, o->device);
    if (o->limit)
        printf(", \"memory_limit_bytes\": %llu", (unsigned long long)o->limit);
    else
        printf(", \"memory_limit_bytes\": null");
    printf(", \"events\": %llu, \"allocs\": %llu, \"frees\": %llu, \"peak_live_bytes\": %llu, ",
           (unsigned long long)t->n, (unsigned long long)t->allocs, (unsigned long long)t->frees,
           (unsigned long long)t->peak_live);
    json_fields(o, t, &r[0]);
    printf(", \"baselines\": {");
    for (int i = 1; i < 3; i++) {
        printf("%s\"%s\": {", i > 1 ? ", " : "", r[i].allocator);
        json_fields(o, t, &r[i]);
        printf("}");
    }
    printf("}}\n");
}

static void print_table(const rp_opts *o, const rp_trace *t, const rp_result *r)
{
    char b1[32], b2[32];
    printf("trace      %s: %llu events (%llu allocs, %llu frees)\n", t->name,
           (unsigned long long)t->n, (unsigned long long)t->allocs, (unsigned long long)t->frees);
    printf("peak live  %s (%llu bytes)\n", tool_bytes(b1, t->peak_live),
           (unsigned long long)t->peak_live);
    if (o->limit)
        printf("device     %s, memory limit %s\n", o->device, tool_bytes(b2, o->limit));
    else
        printf("device     %s\n", o->device);
    printf("\n%-20s %14s %14s %12s %15s %14s %14s %10s %12s\n", "allocator", "peak reserved",
           "reserved/live", "min limit", "min limit/live", "backend calls", "failed allocs",
           "ns/event", "slowest ms");
    for (int i = 0; i < 3; i++) {
        char minb[32] = "-", minr[32] = "-";
        if (r[i].have_min) {
            tool_bytes(minb, r[i].min_limit);
            snprintf(minr, sizeof minr, "%.3f", ratio(r[i].min_limit, t->peak_live));
        } else if (o->min_limit) {
            snprintf(minb, sizeof minb, "n/a");
            snprintf(minr, sizeof minr, "n/a");
        }
        printf("%-20s %14s %14.3f %12s %15s %14llu %14llu %10.1f %12.3f\n", r[i].label,
               tool_bytes(b1, r[i].peak_reserved), ratio(r[i].peak_reserved, t->peak_live), minb,
               minr, (unsigned long long)r[i].backend_calls, (unsigned long long)r[i].failed_allocs,
               r[i].ns_per_event, (double)r[i].max_event_ns / 1e6);
    }
    if (o->lag)
        printf("--lag %llu: the streams' simulated work trailed by %.2f, %.2f and %.2f units "
               "on average (%s, %s, %s)\n",
               (unsigned long long)o->lag, r[0].lag_mean, r[1].lag_mean, r[2].lag_mean,
               r[0].label, r[1].label, r[2].label);
    for (int i = 0; i < 3; i++)
        if (r[i].driver_peak)
            printf("%s: the driver's used memory peaked at %s against a peak reserved of %s "
                   "(%.4fx)\n",
                   r[i].label, tool_bytes(b1, r[i].driver_peak), tool_bytes(b2, r[i].peak_reserved),
                   ratio(r[i].driver_peak, r[i].peak_reserved));
}

/* ----------------------------------------------------------- the command */

/* Parses the arguments; returns -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, rp_opts *o)
{
    memset(o, 0, sizeof *o);
    o->device = REPLAY_DEFAULT_DEVICE;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *value = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            o->json = true;
        } else if (!strcmp(a, "--min-limit")) {
            o->min_limit = true;
        } else if (!strcmp(a, "--lag") || !strncmp(a, "--lag=", 6)) {
            const char *v = a[5] == '=' ? a + 6 : (i + 1 < argc ? argv[++i] : NULL);
            char *end = NULL;
            unsigned long long n = v && *v ? strtoull(v, &end, 10) : 0;
            if (!v || !*v || *end || *v == '-' || n == 0 || n > (1ull << 32)) {
                fprintf(stderr, "unimem replay: bad --lag '%s' (a count of events, 1 to 2^32)\n\n",
                        v ? v : "");
                usage(stderr);
                return 2;
            }
            o->lag = n;
        } else if (!strcmp(a, "--device") || !strcmp(a, "--limit") || !strncmp(a, "--device=", 9) ||
                   !strncmp(a, "--limit=", 8)) {
            bool is_device = !strncmp(a, "--device", 8);
            const char *eq = strchr(a, '=');
            if (eq) {
                value = eq + 1;
            } else if (i + 1 < argc) {
                value = argv[++i];
            } else {
                fprintf(stderr, "unimem replay: %s needs a value\n\n", a);
                usage(stderr);
                return 2;
            }
            if (is_device) {
                if (!tool_device_arg_ok(REPLAY_CMD, value)) {
                    fputc('\n', stderr);
                    usage(stderr);
                    return TOOL_EXIT_USAGE;
                }
                o->device = value;
            } else {
                size_t bytes;
                if (um_parse_size(value, &bytes) != UM_OK || bytes == 0) {
                    fprintf(stderr,
                            "unimem replay: bad --limit '%s' (a positive size such as "
                            "16G)\n\n",
                            value);
                    usage(stderr);
                    return 2;
                }
                o->limit = bytes;
            }
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "unimem replay: unknown option '%s'\n\n", a);
            usage(stderr);
            return 2;
        } else if (o->file) {
            fprintf(stderr, "unimem replay: one trace at a time ('%s' and '%s')\n\n", o->file, a);
            usage(stderr);
            return 2;
        } else {
            o->file = a;
        }
    }
    if (!o->file) {
        fprintf(stderr, "unimem replay: no trace file given\n\n");
        usage(stderr);
        return 2;
    }
    return -1;
}

int um_cmd_replay(int argc, char **argv)
{
    rp_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;
    rp_trace t;
    if ((rc = trace_load(&o, &t)) != 0)
        return rc;
    rp_result r[3] = {
        {.allocator = "pool", .label = "unimem pool"},
        {.allocator = "direct", .label = "no cache"},
        {.allocator = "bufcache", .label = "MLX-style bufcache"},
    };
    char *pool_table = NULL;
    for (int i = 0; i < 3 && rc == 0; i++) {
        char what[64];
        snprintf(what, sizeof what, "replay: %s", r[i].allocator);
        rp_run run;
        rc = replay_once(&o, &t, r[i].allocator, o.limit, false, what, &run);
        if (i == 0)
            pool_table = run.stats_table; /* the pool's, printed at the end */
        else
            free(run.stats_table);
        if (rc)
            break;
        r[i].peak_reserved = run.peak_reserved;
        r[i].backend_calls = run.backend_calls;
        r[i].failed_allocs = run.failed_allocs;
        r[i].driver_peak = run.driver_peak;
        r[i].ns_per_event = t.n ? (double)run.ns / (double)t.n : 0.0;
        r[i].max_event_ns = run.max_event_ns;
        r[i].lag_mean = run.lag_mean;
        if (o.min_limit) {
            /* The upper bound is the unlimited peak: rerun without the
             * limit if one was given. */
            uint64_t peak = run.peak_reserved;
            if (o.limit) {
                rp_opts unlimited = o;
                unlimited.limit = 0;
                rc = replay_once(&unlimited, &t, r[i].allocator, 0, false, what, &run);
                free(run.stats_table);
                peak = run.peak_reserved;
            }
            if (rc == 0)
                rc = find_min_limit(&o, &t, &r[i], peak, run.granularity);
        }
    }
    if (rc == 0) {
        if (o.json) {
            print_json(&o, &t, r);
        } else {
            print_table(&o, &t, r);
            if (pool_table)
                printf("\nunimem pool at the end of the trace (um_stats_print):\n%s", pool_table);
        }
    }
    free(pool_table);
    trace_free(&t);
    return rc;
}
