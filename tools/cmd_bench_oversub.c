/*
 * `unimem bench oversub`: programs whose data is larger than a device,
 * run through unified buffers with the device's memory limit set, against
 * the least data that must cross the host<->device link (what Belady's MIN
 * would move, computed on the same access sequence):
 *
 *   stream   every pass reads the input buffers in order on the device and
 *            writes a result buffer there, copied back to the host (a
 *            prefetch, overlapping the next pass); working
 *            set 1.5x, 2x and 4x the limit; throughput_over_bound is the
 *            time the MIN bytes need at the link bandwidth measured in the
 *            same run (each direction on its own) over the time taken;
 *   random   uniform random reads at 2x the limit; also against what the
 *            best policy that knows only the announced accesses moves
 *            (window_misses), the bound for accesses with no pattern.
 *
 * Both announce each access 32 ahead with UM_HINT_WILL_USE, as queued work
 * would, and run with the cost-aware policy and with LRU, the background
 * reclaimer off (eviction on demand, at the full limit).
 *
 * With --all-devices every accelerator gets the limit and the stream
 * workload runs on all of them at once (data 1.5x and 2x the sum of the
 * limits, spilling to the host): one thread per device streams its own
 * share of the buffers, as the single-device workload does. Devices run in
 * parallel, so the bound is the slowest device's: its MIN bytes at its own
 * host link, measured alone in the same run. The links are measured again
 * with every device copying at once, so that a run short of the bound
 * tells a shared host link from the engine. Uses only include/unimem.h.
 */
#include "tool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define OVERSUB_CMD "bench oversub"
#define LOOKAHEAD 32
/* Buffers that fit in the limit (--slots): the default sizes them at
 * 1/32 of it, as many as accesses are announced. */
#define DEFAULT_SLOTS 32
/* Random accesses per buffer (--random-length): full run, --quick. */
#define RANDOM_LENGTH 6
#define RANDOM_LENGTH_QUICK 3
/* Each buffer's size is a multiple of this (a GPU's page). */
#define BUFFER_ALIGN ((size_t)2 << 20)

typedef struct oversub_opts {
    bool json, quick;
    bool all;             /* --all-devices */
    const char *workload; /* --workload: "stream" or "random"; NULL for both */
    const char *policy;   /* --policy: "cost" or "lru"; NULL for both */
    const char *device;
    size_t limit;
    size_t sim_bandwidth; /* a sim device's modelled link, bytes/s */
    int slots;            /* --slots: buffers that fit in the limit */
    int random_length;    /* --random-length: random accesses per buffer */
} oversub_opts;

/* Progress over the command's runs: runs done of all, and this run's name. */
static struct {
    int done, total;
    char what[48];
} progress;

/* Each run's statistics table (um_stats_print), gathered in memory while
 * the results table is printed and printed after it (text output only). */
static struct {
    FILE *f;
    char *buf;
    size_t len;
} run_stats;

/* Adds the statistics of the run now ending, named as its progress is. */
static void note_run_stats(um_context *ctx)
{
    if (!run_stats.f)
        return;
    fprintf(run_stats.f, "\n%s:\n", progress.what);
    um_stats_print(ctx, run_stats.f);
}

/* Draws the progress, `within` (0-1) of the current run done. */
static void run_progress(double within)
{
    tool_progress(progress.what, ((double)progress.done + within) / (double)progress.total);
}

static void oversub_usage(FILE *f)
{
    fprintf(f,
            "usage: unimem bench oversub [--json] [--quick] [--device SPEC] [--limit BYTES]\n"
            "                            [--sim-bandwidth BYTES] [--all-devices]\n"
            "                            [--workload W] [--policy P] [--slots N]\n"
            "                            [--random-length K]\n"
            "\n"
            "Streams and randomly reads buffers totalling 1.5x-4x a device's memory limit and\n"
            "compares the bytes moved and the time with what Belady's MIN would need.\n"
            "\n"
            "  --device SPEC  the devices option (default cuda:0, or sim:4G with no GPU;\n"
            "                 with --all-devices cuda, or sim:2x4G)\n"
            "  --limit BYTES  the device's memory limit, 64M to its memory (default 8G on a\n"
            "                 GPU, 512M on sim)\n"
            "  --sim-bandwidth BYTES  a sim device's modelled link per second, each way\n"
            "                 (option sim_link_bandwidth; default 4G)\n"
            "  --all-devices  every accelerator of SPEC gets the limit; the stream workload\n"
            "                 at 1.5x and 2x the sum of the limits, each device streaming its\n"
            "                 own share on its own thread; the bound is the slowest device's\n"
            "                 MIN bytes at its own host link (no random workload)\n"
            "  --workload W   stream or random: only that workload\n"
            "  --policy P     cost or lru: only that eviction policy\n"
            "  --slots N      buffers of LIMIT/N bytes, so that N fit in the device (default\n"
            "                 32; 4-4096, buffers of 1 MiB or more): with accesses announced\n"
            "                 32 ahead, the fewer slots the closer any policy can come to MIN\n"
            "  --random-length K  random accesses per buffer (default 6, --quick 3)\n"
            "  --quick        fewer passes, stream at 1.5x and 2x only (with --all-devices,\n"
            "                 the cost policy only)\n"
            "  --json         one JSON object per workload and policy\n");
}

/* ------------------------------------------------------------------ MIN */

/* Misses on seq (item ids < nitems) with `slots` slots when an item's
 * next use is known only `window` accesses ahead: the item evicted is one
 * whose next use is not known, least recently used first, else the one
 * used farthest ahead. With window SIZE_MAX this is Belady's MIN, the
 * fewest misses of any policy. With the announcement window it is what a
 * policy that knows only the announced accesses can do on accesses with
 * no pattern (uniform random: every item not announced is as likely to
 * come next), so on average no policy of the random workload does better;
 * on one sequence a policy may, by a lucky guess. UINT64_MAX when there is
 * no memory for the working arrays. */
static uint64_t window_misses(const int *seq, size_t n, int nitems, int slots, size_t window)
{
    size_t *next = malloc((n ? n : 1) * sizeof *next);
    size_t *last = malloc((size_t)nitems * sizeof *last);
    bool *in = calloc((size_t)nitems, sizeof *in);
    size_t *next_of = malloc((size_t)nitems * sizeof *next_of);
    size_t *used_at = malloc((size_t)nitems * sizeof *used_at);
    if (!next || !last || !in || !next_of || !used_at) {
        free(next);
        free(last);
        free(in);
        free(next_of);
        free(used_at);
        return UINT64_MAX;
    }
    for (int i = 0; i < nitems; i++)
        last[i] = SIZE_MAX;
    for (size_t t = n; t-- > 0;) {
        next[t] = last[seq[t]];
        last[seq[t]] = t;
    }
    uint64_t misses = 0;
    int used = 0;
    for (size_t t = 0; t < n; t++) {
        int x = seq[t];
        if (!in[x]) {
            misses++;
            if (used == slots) {
                int victim = -1;
                bool victim_known = true;
                for (int i = 0; i < nitems; i++) {
                    if (!in[i])
                        continue;
                    bool known = next_of[i] - t <= window;
                    if (victim < 0 || (victim_known && !known) ||
                        (!victim_known && !known && used_at[i] < used_at[victim]) ||
                        (victim_known && known && next_of[i] > next_of[victim])) {
                        victim = i;
                        victim_known = known;
                    }
                }
                in[victim] = false;
                used--;
            }
            in[x] = true;
            used++;
        }
        next_of[x] = next[t];
        used_at[x] = t;
    }
    free(next);
    free(last);
    free(in);
    free(next_of);
    free(used_at);
    return misses;
}

static uint64_t min_misses(const int *seq, size_t n, int nitems, int slots)
{
    return window_misses(seq, n, nitems, slots, SIZE_MAX);
}

/* ------------------------------------------------------------ workloads */

typedef struct run {
    um_context *ctx;
    size_t size;        /* bytes per buffer */
    int n;              /* input buffers per device */
    int ndev;           /* the devices streamed: 1..ndev */
    um_buffer **in;     /* device d's n inputs from in[(d - 1) * n] */
    um_buffer **result; /* device d's result: result[d - 1] */
    void *host;         /* the results' landing place on the host */
    bool limit_over;    /* --limit is above a device's memory (said on stderr) */
} run;

static um_status open_run(const oversub_opts *o, const char *policy, size_t size, int n, run *r)
{
    memset(r, 0, sizeof *r);
    char conf[512]; /* room for a --device of the most tool_device_arg_ok takes */
    /* The background reclaimer stays off: the policy is measured against
     * MIN at the full limit (eviction ahead of need would keep the device
     * below it; its cost is reported in docs/BENCHMARKS.md). */
    snprintf(conf, sizeof conf,
             "devices=%s,evict_policy=%s,watermark_high=100,watermark_low=100,"
             "sim_link_bandwidth=%zu",
             o->device, policy, o->sim_bandwidth);
    um_status st = um_init(conf, &r->ctx);
    /* Without accelerators device 1's limit fails below, with its message. */
    r->ndev = 1;
    if (st == UM_OK && o->all && um_device_count(r->ctx) > 2)
        r->ndev = um_device_count(r->ctx) - 1;
    for (int d = 1; d <= r->ndev && st == UM_OK; d++) {
        um_device_info info;
        if (d < um_device_count(r->ctx) && (st = um_device_info_get(r->ctx, d, &info)) == UM_OK &&
            !tool_limit_fits(OVERSUB_CMD, &info, d, o->limit)) {
            r->limit_over = true;
            st = UM_ERR_INVALID;
        }
        if (st == UM_OK)
            st = um_set_memory_limit(r->ctx, d, o->limit);
    }
    r->size = size;
    r->n = n;
    size_t nd = r->ndev > 1 ? (size_t)r->ndev : 1, ni = n > 0 ? (size_t)n : 1;
    r->in = calloc(ni * nd, sizeof *r->in);
    r->result = calloc(nd, sizeof *r->result);
    r->host = malloc(size);
    if (st == UM_OK && (!r->in || !r->result || !r->host))
        st = UM_ERR_NOMEM;
    if (st == UM_OK)
        memset(r->host, 0x3c, size);
    /* A sim device's memory is a file mapping whose first touch of each
     * page faults (slowly on some machines), which a GPU's memory never
     * does: it is touched once before the clock runs, so only the link
     * model's time and the engine's show. */
    for (int d = 1; d <= r->ndev && st == UM_OK; d++) {
        um_device_info info;
        st = um_device_info_get(r->ctx, d, &info);
        if (st != UM_OK || info.kind != UM_DEVICE_SIM)
            continue;
        void *warm = NULL;
        st = um_malloc(r->ctx, d, o->limit, NULL, &warm);
        if (st == UM_OK) {
            memset(warm, 0, o->limit);
            st = um_free(r->ctx, warm, NULL);
        }
    }
    /* The inputs start on the host (written there, as loaded data is). */
    for (int i = 0; i < n * r->ndev && st == UM_OK; i++) {
        st = um_buffer_create(r->ctx, size, NULL, &r->in[i]);
        if (st == UM_OK)
            st = um_buffer_write(r->in[i], 0, r->host, size);
    }
    for (int d = 0; d < r->ndev && st == UM_OK; d++)
        st = um_buffer_create(r->ctx, size, NULL, &r->result[d]);
    return st;
}

/* Reports open_run's failure st and gives the exit code: a --device the
 * options refuse, or one that makes no accelerator, is an argument error. */
static int open_fail(const oversub_opts *o, const run *r, um_status st)
{
    if (!r->ctx)
        return tool_init_fail(OVERSUB_CMD, st);
    if (r->limit_over)
        return TOOL_EXIT_USAGE;
    if (um_device_count(r->ctx) < 2) {
        tool_progress_clear();
        fprintf(stderr, "unimem " OVERSUB_CMD ": --device %s gives no accelerator (device 1)\n",
                o->device);
        return TOOL_EXIT_USAGE;
    }
    return tool_fail(OVERSUB_CMD, st);
}

static void close_run(run *r)
{
    for (int i = 0; r->in && i < r->n * r->ndev; i++)
        if (r->in[i])
            (void)um_buffer_destroy(r->in[i]);
    for (int d = 0; r->result && d < r->ndev; d++)
        if (r->result[d])
            (void)um_buffer_destroy(r->result[d]);
    free(r->in);
    free(r->result);
    free(r->host);
    if (r->ctx)
        um_shutdown(r->ctx);
}

/* Reads seq's buffers (indices into in) on device dev in order, announcing
 * each LOOKAHEAD ahead; after every `pass_len` accesses (0: never) writes
 * the result on the device and reads it back. The work is ordered on
 * stream s (NULL: the default streams, every device's synchronized at the
 * end; a thread of --all-devices waits for its own stream only). */
static um_status play(run *r, int dev, um_buffer **in, um_buffer *result, um_stream s,
                      const int *seq, size_t len, size_t pass_len, bool show_progress)
{
    um_status st = UM_OK;
    for (size_t t = 0; t < len && t < LOOKAHEAD && st == UM_OK; t++)
        st = um_buffer_hint(in[seq[t]], UM_HINT_WILL_USE);
    for (size_t t = 0; t < len && st == UM_OK; t++) {
        if (show_progress && t % 8 == 0)
            run_progress((double)t / (double)len);
        if (t + LOOKAHEAD < len)
            st = um_buffer_hint(in[seq[t + LOOKAHEAD]], UM_HINT_WILL_USE);
        void *p;
        if (st == UM_OK)
            st = um_buffer_acquire(in[seq[t]], dev, UM_ACCESS_READ, s, &p);
        if (st == UM_OK)
            st = um_buffer_release(in[seq[t]], dev, s);
        if (st == UM_OK && pass_len && (t + 1) % pass_len == 0) {
            st = um_buffer_acquire(result, dev, UM_ACCESS_WRITE_DISCARD, s, &p);
            if (st == UM_OK)
                st = um_buffer_release(result, dev, s);
            /* Back to the host while the next pass's copies run. */
            if (st == UM_OK)
                st = um_buffer_prefetch(result, 0);
        }
    }
    if (st == UM_OK)
        st = um_stream_synchronize(r->ctx, s);
    return st;
}

/* Host<->device GB/s for buffer b on device dev, in the same context (best
 * of 3), ordered on stream s (NULL: the default streams). With `together`,
 * every thread of the barrier starts each direction at once, so the
 * figures are each link's share while all are busy; the waits happen
 * whatever the status, so a failed thread cannot leave the others
 * waiting. */
static um_status link_gbps(run *r, int dev, um_buffer *b, um_stream s,
                           pthread_barrier_t *together, double *h2d, double *d2h)
{
    *h2d = *d2h = 0.0;
    um_status st = UM_OK;
    for (int i = 0; i < 3; i++) {
        void *p;
        if (st == UM_OK)
            st = um_buffer_acquire(b, 0, UM_ACCESS_WRITE_DISCARD, NULL, &p);
        if (st == UM_OK)
            st = um_buffer_release(b, 0, NULL);
        if (together)
            pthread_barrier_wait(together);
        uint64_t t0 = tool_now_ns();
        if (st == UM_OK)
            st = um_buffer_acquire(b, dev, UM_ACCESS_READ_WRITE, s, &p);
        if (st == UM_OK)
            st = um_stream_synchronize(r->ctx, s);
        uint64_t t1 = tool_now_ns();
        if (st == UM_OK)
            st = um_buffer_release(b, dev, s);
        if (st == UM_OK)
            st = um_stream_synchronize(r->ctx, s);
        if (together)
            pthread_barrier_wait(together);
        uint64_t t2 = tool_now_ns();
        if (st == UM_OK)
            st = um_buffer_acquire(b, 0, UM_ACCESS_READ, NULL, &p);
        uint64_t t3 = tool_now_ns();
        if (st == UM_OK)
            st = um_buffer_release(b, 0, NULL);
        if (st != UM_OK)
            continue;
        double up = (double)r->size / (double)(t1 - t0), down = (double)r->size / (double)(t3 - t2);
        *h2d = up > *h2d ? up : *h2d;
        *d2h = down > *d2h ? down : *d2h;
    }
    return st;
}

static uint64_t link_bytes(um_context *ctx, int from, int to)
{
    um_link_stats s;
    return um_link_stats_get(ctx, from, to, &s) == UM_OK ? s.bytes : 0;
}

typedef struct result {
    const char *workload, *policy;
    double oversub;
    uint64_t moved, min_bytes;
    double seconds, bound_seconds, h2d, d2h;
    uint64_t window_min_bytes; /* random only: window_misses' bytes; 0 for none */
} result;

static void print_result(const oversub_opts *o, const result *x)
{
    double over_bound = x->seconds > 0 ? x->bound_seconds / x->seconds : 0.0;
    double over_min = x->min_bytes ? (double)x->moved / (double)x->min_bytes : 0.0;
    double over_window =
        x->window_min_bytes ? (double)x->moved / (double)x->window_min_bytes : 0.0;
    if (o->json) {
        printf("{\"workload\":\"%s\",\"oversubscription\":%.2f,\"policy\":\"%s\","
               "\"bytes_moved\":%llu,\"min_bytes\":%llu,\"moved_over_min\":%.4f,"
               "\"seconds\":%.4f,\"bound_seconds\":%.4f,\"throughput_over_bound\":%.4f,"
               "\"h2d_gbps\":%.2f,\"d2h_gbps\":%.2f",
               x->workload, x->oversub, x->policy, (unsigned long long)x->moved,
               (unsigned long long)x->min_bytes, over_min, x->seconds, x->bound_seconds,
               over_bound, x->h2d, x->d2h);
        if (x->window_min_bytes)
            printf(",\"window_min_bytes\":%llu,\"moved_over_window_min\":%.4f",
                   (unsigned long long)x->window_min_bytes, over_window);
        printf(",\"slots\":%d}\n", o->slots);
        return;
    }
    char a[32], b[32], w[16] = "-";
    if (x->window_min_bytes)
        snprintf(w, sizeof w, "%.3f", over_window);
    printf("%-7s %5.1fx %-5s %12s %12s %8.3f %8s %9.3f %9.3f %8.3f %8.1f %8.1f\n", x->workload,
           x->oversub, x->policy, tool_bytes(a, x->moved), tool_bytes(b, x->min_bytes), over_min,
           w, x->seconds, x->bound_seconds, over_bound, x->h2d, x->d2h);
}

/* The table's head, printed with the first result: a run that cannot
 * start (a --limit above the device's memory) prints no table. */
static void describe_one(const oversub_opts *o)
{
    char lim[32], buf[32], bw[32];
    bool sim = !strncmp(o->device, "sim", 3);
    printf("unimem bench oversub: devices=%s, device 1 limited to %s, buffers of %s; "
           "accesses announced %d ahead%s%s%s\n",
           o->device, tool_bytes(lim, o->limit), tool_bytes(buf, o->limit / (size_t)o->slots),
           LOOKAHEAD, sim ? "; sim link modelled at " : "",
           sim ? tool_bytes(bw, o->sim_bandwidth) : "", sim ? "/s each way" : "");
    printf("mv/wMIN: moved over what the best policy knowing only the announced accesses\n"
           "moves on accesses with no pattern (random only; see window_misses)\n");
    printf("%-7s %6s %-5s %12s %12s %8s %8s %9s %9s %8s %8s %8s\n", "work", "over", "pol",
           "moved", "MIN", "mv/MIN", "mv/wMIN", "seconds", "bound_s", "tp/bnd", "h2d_GB/s",
           "d2h_GB/s");
}

/* One workload with one policy: the inputs, the access sequence, the run. */
static int bench_one(const oversub_opts *o, const char *workload, double factor,
                     const char *policy, bool *described)
{
    size_t size = o->limit / (size_t)o->slots;
    int slots = (int)(o->limit / size);
    int n = (int)(factor * slots + 0.5);
    bool stream = !strcmp(workload, "stream");
    int passes = o->quick ? 2 : 3;
    size_t len = stream ? (size_t)n * (size_t)passes : (size_t)n * (size_t)o->random_length;
    int *seq = malloc(len * sizeof *seq);
    uint64_t rng = 0x6f76657273756221ull;
    for (size_t t = 0; t < len; t++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        seq[t] = stream ? (int)(t % (size_t)n) : (int)((rng >> 33) % (uint64_t)n);
    }
    snprintf(progress.what, sizeof progress.what, "%s %.1fx %s", workload, factor, policy);
    run_progress(0);
    run r;
    um_status st = open_run(o, policy, size, n, &r);
    if (st != UM_OK) {
        /* At once: a later call on a missing context would replace the
         * message. */
        int rc = open_fail(o, &r, st);
        close_run(&r);
        free(seq);
        return rc;
    }
    double h2d = 0, d2h = 0;
    st = link_gbps(&r, 1, r.result[0], NULL, NULL, &h2d, &d2h);
    uint64_t up0 = link_bytes(r.ctx, 0, 1), down0 = link_bytes(r.ctx, 1, 0);
    uint64_t t0 = tool_now_ns();
    if (st == UM_OK)
        st = play(&r, 1, r.in, r.result[0], NULL, seq, len, stream ? (size_t)n : 0, true);
    /* The last pass's result must be home too, as in share_main: its bytes
     * are in the bound (and were counted when its copy was queued). */
    void *home;
    if (st == UM_OK && stream && (st = um_buffer_acquire(r.result[0], 0, UM_ACCESS_READ, NULL,
                                                         &home)) == UM_OK)
        st = um_buffer_release(r.result[0], 0, NULL);
    uint64_t t1 = tool_now_ns();
    if (st != UM_OK) {
        int rc = tool_fail(OVERSUB_CMD, st);
        close_run(&r);
        free(seq);
        return rc;
    }
    /* The result keeps one slot; its read-back is the bytes down. */
    uint64_t misses = min_misses(seq, len, n, stream ? slots - 1 : slots);
    uint64_t window = stream ? 0 : window_misses(seq, len, n, slots, LOOKAHEAD);
    if (misses == UINT64_MAX || window == UINT64_MAX) {
        tool_progress_clear();
        fprintf(stderr, "unimem " OVERSUB_CMD ": no memory to compute MIN for %zu accesses\n",
                len);
        close_run(&r);
        free(seq);
        return 1;
    }
    uint64_t up = link_bytes(r.ctx, 0, 1) - up0, down = link_bytes(r.ctx, 1, 0) - down0;
    result x = {workload, policy, factor, up + down, 0, (double)(t1 - t0) / 1e9, 0, h2d, d2h, 0};
    uint64_t min_up = misses * size, min_down = stream ? (uint64_t)passes * size : 0;
    x.min_bytes = min_up + min_down;
    x.window_min_bytes = window * size;
    double t_up = (double)min_up / (h2d * 1e9), t_down = (double)min_down / (d2h * 1e9);
    x.bound_seconds = t_up > t_down ? t_up : t_down;
    tool_progress_clear();
    if (!o->json && !*described)
        describe_one(o);
    *described = true;
    print_result(o, &x);
    note_run_stats(r.ctx);
    progress.done++;
    close_run(&r);
    free(seq);
    return 0;
}

/* ------------------------------------------------- every device at once */

/* One device's share of the --all-devices stream workload: its own inputs
 * and result, its own stream and thread. */
typedef struct share {
    pthread_t tid;
    run *r;
    int dev;
    um_stream stream;
    _Atomic int *gate;           /* 1: start; -1: abort (a thread could not be created) */
    pthread_barrier_t *together; /* the threads: each link measured while all are busy */
    pthread_barrier_t *go;       /* the threads and the clock: the workload's start */
    const int *seq;
    size_t len, pass_len;
    double h2d, d2h;             /* its host link measured alone, GB/s */
    double h2d_all, d2h_all;     /* measured with every device copying at once */
    uint64_t up0, down0;         /* its link's bytes before the workload */
    uint64_t end_ns;             /* when its last result was home */
    um_status st;
    char why[512];               /* um_last_error() of a failure (it is per thread) */
} share;

static void *share_main(void *arg)
{
    share *s = arg;
    while (!atomic_load(s->gate))
        sched_yield();
    if (atomic_load(s->gate) < 0)
        return NULL;
    run *r = s->r;
    um_buffer *res = r->result[s->dev - 1];
    s->st = link_gbps(r, s->dev, res, s->stream, s->together, &s->h2d_all, &s->d2h_all);
    /* Only this thread copies over its device's host link, so the
     * workload's bytes are counted from here. */
    s->up0 = link_bytes(r->ctx, 0, s->dev);
    s->down0 = link_bytes(r->ctx, s->dev, 0);
    pthread_barrier_wait(s->go);
    if (s->st == UM_OK)
        s->st = play(r, s->dev, r->in + (size_t)(s->dev - 1) * (size_t)r->n, res, s->stream,
                     s->seq, s->len, s->pass_len, s->dev == 1); /* one thread draws */
    /* The last pass's result must be home too: its bytes are in the bound. */
    void *p;
    if (s->st == UM_OK)
        s->st = um_buffer_acquire(res, 0, UM_ACCESS_READ, NULL, &p);
    if (s->st == UM_OK)
        s->st = um_buffer_release(res, 0, NULL);
    s->end_ns = tool_now_ns();
    if (s->st != UM_OK)
        snprintf(s->why, sizeof s->why, "%s", um_last_error());
    return NULL;
}

/* Bytes copied into the devices 1..nd from other accelerators (none, when
 * eviction drops clean replicas and writes dirty ones to the host). */
static uint64_t bytes_between(um_context *ctx, int nd)
{
    uint64_t sum = 0;
    for (int d = 1; d <= nd; d++)
        sum += link_bytes(ctx, -1, d) - link_bytes(ctx, 0, d);
    return sum;
}

/* What one device did, or (dev 0) all of them together. */
typedef struct share_result {
    int dev;
    uint64_t moved, min_bytes;
    double seconds, bound, bound_all; /* bound_all: at the links measured all at once */
    double h2d, d2h, h2d_all, d2h_all;
} share_result;

/* The time MIN's bytes need: each direction on its own link. */
static double bound_of(uint64_t up, uint64_t down, double h2d, double d2h)
{
    if (h2d <= 0 || d2h <= 0)
        return 0.0;
    double t_up = (double)up / (h2d * 1e9), t_down = (double)down / (d2h * 1e9);
    return t_up > t_down ? t_up : t_down;
}

static void print_share_text(double factor, const char *policy, const share_result *x)
{
    char a[32], b[32], dev[16], h[4][16];
    if (x->dev)
        snprintf(dev, sizeof dev, "%d", x->dev);
    else
        snprintf(dev, sizeof dev, "all");
    /* The whole run's links: the alone figures were not taken at once, so
     * only the concurrent ones add up. */
    const double v[4] = {x->h2d, x->d2h, x->h2d_all, x->d2h_all};
    for (int i = 0; i < 4; i++) {
        if (v[i] > 0)
            snprintf(h[i], sizeof h[i], "%.1f", v[i]);
        else
            snprintf(h[i], sizeof h[i], "-");
    }
    printf("%-7s %5.1fx %-5s %-4s %12s %12s %8.3f %9.3f %9.3f %8.3f %8.3f %8s %8s %8s %8s\n",
           "stream", factor, policy, dev, tool_bytes(a, x->moved), tool_bytes(b, x->min_bytes),
           x->min_bytes ? (double)x->moved / (double)x->min_bytes : 0.0, x->seconds, x->bound,
           x->seconds > 0 ? x->bound / x->seconds : 0.0,
           x->seconds > 0 ? x->bound_all / x->seconds : 0.0, h[0], h[1], h[2], h[3]);
}

static void print_share_json(const oversub_opts *o, double factor, const char *policy,
                             size_t size, const share_result *x, int nd, uint64_t between,
                             um_context *ctx)
{
    const share_result *all = &x[0];
    printf("{\"workload\":\"stream\",\"mode\":\"all_devices\",\"devices\":%d,"
           "\"oversubscription\":%.2f,\"policy\":\"%s\",\"limit_bytes\":%llu,"
           "\"buffer_bytes\":%llu,\"bytes_moved\":%llu,\"min_bytes\":%llu,"
           "\"moved_over_min\":%.4f,\"bytes_between_devices\":%llu,\"seconds\":%.4f,"
           "\"bound_s\":%.4f,\"throughput_over_bound\":%.4f,\"bound_concurrent_s\":%.4f,"
           "\"throughput_over_concurrent_bound\":%.4f,\"moved_gbps\":%.2f,\"per_device\":[",
           nd, factor, policy, (unsigned long long)o->limit, (unsigned long long)size,
           (unsigned long long)all->moved, (unsigned long long)all->min_bytes,
           all->min_bytes ? (double)all->moved / (double)all->min_bytes : 0.0,
           (unsigned long long)between, all->seconds, all->bound,
           all->seconds > 0 ? all->bound / all->seconds : 0.0, all->bound_all,
           all->seconds > 0 ? all->bound_all / all->seconds : 0.0,
           all->seconds > 0 ? (double)all->moved / all->seconds / 1e9 : 0.0);
    for (int d = 1; d <= nd; d++) {
        const share_result *y = &x[d];
        um_device_info info;
        if (um_device_info_get(ctx, d, &info) != UM_OK)
            snprintf(info.name, sizeof info.name, "?");
        /* The name through tool_json_string: a GPU's product name may
         * hold any character. */
        printf("%s{\"device\":%d,\"name\":", d > 1 ? "," : "", d);
        tool_json_string(stdout, info.name);
        printf(",\"bytes_moved\":%llu,\"min_bytes\":%llu,"
               "\"seconds\":%.4f,\"bound_s\":%.4f,\"throughput_over_bound\":%.4f,"
               "\"bound_concurrent_s\":%.4f,\"throughput_over_concurrent_bound\":%.4f,"
               "\"h2d_gbps\":%.2f,\"d2h_gbps\":%.2f,\"h2d_gbps_concurrent\":%.2f,"
               "\"d2h_gbps_concurrent\":%.2f}",
               (unsigned long long)y->moved,
               (unsigned long long)y->min_bytes, y->seconds, y->bound,
               y->seconds > 0 ? y->bound / y->seconds : 0.0, y->bound_all,
               y->seconds > 0 ? y->bound_all / y->seconds : 0.0, y->h2d, y->d2h, y->h2d_all,
               y->d2h_all);
    }
    printf("]}\n");
    fflush(stdout);
}

static void describe_all(const oversub_opts *o, int nd)
{
    char lim[32], buf[32], bw[32];
    bool sim = !strncmp(o->device, "sim", 3);
    printf("unimem bench oversub --all-devices: devices=%s, %d device%s each limited to %s, "
           "buffers of %s; each device streams its own share on its own thread, accesses "
           "announced %d ahead%s%s%s\n",
           o->device, nd, nd == 1 ? "" : "s", tool_bytes(lim, o->limit),
           tool_bytes(buf, o->limit / (size_t)o->slots), LOOKAHEAD,
           sim ? "; sim link modelled at " : "", sim ? tool_bytes(bw, o->sim_bandwidth) : "",
           sim ? "/s each way" : "");
    printf("over: data over the sum of the limits; bound_s: the slowest device's MIN bytes at "
           "its own link; *: links measured with every device copying at once\n");
    printf("%-7s %6s %-5s %-4s %12s %12s %8s %9s %9s %8s %8s %8s %8s %8s %8s\n", "work", "over",
           "pol", "dev", "moved", "MIN", "mv/MIN", "seconds", "bound_s", "tp/bnd", "tp/bnd*",
           "h2d_GB/s", "d2h_GB/s", "h2d*", "d2h*");
}

/* The stream workload on every accelerator at once: data `factor` times
 * the sum of the limits, each device streaming factor x its limit. */
static int bench_all(const oversub_opts *o, double factor, const char *policy, bool *described)
{
    size_t size = o->limit / (size_t)o->slots;
    int slots = (int)(o->limit / size);
    int n = (int)(factor * slots + 0.5);
    int passes = o->quick ? 2 : 3;
    size_t len = (size_t)n * (size_t)passes;
    int *seq = malloc(len * sizeof *seq);
    snprintf(progress.what, sizeof progress.what, "all devices %.1fx %s", factor, policy);
    run_progress(0);
    run r;
    um_status st = open_run(o, policy, size, n, &r);
    if (st != UM_OK) {
        int rc = open_fail(o, &r, st);
        close_run(&r);
        free(seq);
        return rc;
    }
    int nd = r.ndev;
    share *sh = calloc((size_t)nd, sizeof *sh);
    share_result *x = calloc((size_t)nd + 1, sizeof *x);
    if (st == UM_OK && (!seq || !sh || !x)) {
        tool_progress_clear();
        fprintf(stderr, "unimem " OVERSUB_CMD ": no memory for the run's figures\n");
        st = UM_ERR_NOMEM;
    }
    for (size_t t = 0; st == UM_OK && t < len; t++)
        seq[t] = (int)(t % (size_t)n);
    /* Each link alone first, one device after another. */
    for (int d = 1; d <= nd && st == UM_OK; d++) {
        share *s = &sh[d - 1];
        s->r = &r;
        s->dev = d;
        s->seq = seq;
        s->len = len;
        s->pass_len = (size_t)n;
        st = um_stream_create(r.ctx, d, &s->stream);
        if (st == UM_OK)
            st = link_gbps(&r, d, r.result[d - 1], s->stream, NULL, &s->h2d, &s->d2h);
        if (st != UM_OK)
            tool_fail(OVERSUB_CMD, st);
    }
    int rc = st == UM_OK ? 0 : 1;
    uint64_t between0 = 0, t0 = 0;
    if (!rc) {
        between0 = bytes_between(r.ctx, nd);
        /* The threads wait at a gate until all exist, so the barriers
         * count only threads that run. */
        _Atomic int gate;
        atomic_init(&gate, 0);
        pthread_barrier_t together, go;
        int created = 0;
        for (int d = 1; d <= nd; d++) {
            sh[d - 1].gate = &gate;
            sh[d - 1].together = &together;
            sh[d - 1].go = &go;
            int e = pthread_create(&sh[d - 1].tid, NULL, share_main, &sh[d - 1]);
            if (e != 0) {
                tool_progress_clear();
                fprintf(stderr, "unimem " OVERSUB_CMD ": cannot create the thread of device %d: "
                        "%s\n", d, strerror(e));
                rc = 1;
                break;
            }
            created++;
        }
        if (!rc) {
            pthread_barrier_init(&together, NULL, (unsigned)nd);
            pthread_barrier_init(&go, NULL, (unsigned)nd + 1);
        }
        atomic_store(&gate, rc ? -1 : 1);
        if (!rc) {
            pthread_barrier_wait(&go);
            t0 = tool_now_ns();
        }
        for (int d = 0; d < created; d++)
            pthread_join(sh[d].tid, NULL);
        if (!rc) {
            pthread_barrier_destroy(&together);
            pthread_barrier_destroy(&go);
        }
        for (int d = 1; d <= nd && !rc; d++)
            if (sh[d - 1].st != UM_OK) {
                tool_progress_clear();
                fprintf(stderr, "unimem " OVERSUB_CMD ": device %d: %s\n", d,
                        *sh[d - 1].why ? sh[d - 1].why : um_strerror(sh[d - 1].st));
                rc = 1;
            }
    }
    tool_progress_clear();
    progress.done++;
    uint64_t misses = 0;
    if (!rc) {
        /* The result keeps one slot; its read-back is the bytes down. */
        misses = min_misses(seq, len, n, slots - 1);
        if (misses == UINT64_MAX) {
            fprintf(stderr, "unimem " OVERSUB_CMD ": no memory to compute MIN for %zu accesses\n",
                    len);
            rc = 1;
        }
    }
    if (!rc) {
        uint64_t min_up = misses * size, min_down = (uint64_t)passes * size;
        share_result *all = &x[0];
        for (int d = 1; d <= nd; d++) {
            const share *s = &sh[d - 1];
            share_result *y = &x[d];
            y->dev = d;
            y->moved = link_bytes(r.ctx, 0, d) - s->up0 + link_bytes(r.ctx, d, 0) - s->down0;
            y->min_bytes = min_up + min_down;
            y->seconds = (double)(s->end_ns - t0) / 1e9;
            y->h2d = s->h2d;
            y->d2h = s->d2h;
            y->h2d_all = s->h2d_all;
            y->d2h_all = s->d2h_all;
            y->bound = bound_of(min_up, min_down, s->h2d, s->d2h);
            y->bound_all = bound_of(min_up, min_down, s->h2d_all, s->d2h_all);
            /* The devices run in parallel: the whole run is bound by its
             * slowest device and lasts until its last device is done. */
            all->moved += y->moved;
            all->min_bytes += y->min_bytes;
            all->seconds = y->seconds > all->seconds ? y->seconds : all->seconds;
            all->bound = y->bound > all->bound ? y->bound : all->bound;
            all->bound_all = y->bound_all > all->bound_all ? y->bound_all : all->bound_all;
            all->h2d_all += y->h2d_all;
            all->d2h_all += y->d2h_all;
        }
        uint64_t between = bytes_between(r.ctx, nd) - between0;
        if (o->json) {
            print_share_json(o, factor, policy, size, x, nd, between, r.ctx);
        } else {
            if (!*described)
                describe_all(o, nd);
            *described = true;
            for (int d = 1; d <= nd; d++)
                print_share_text(factor, policy, &x[d]);
            print_share_text(factor, policy, all);
            if (between) {
                char b[32];
                printf("        (%s copied between devices)\n", tool_bytes(b, between));
            }
            fflush(stdout);
            note_run_stats(r.ctx);
        }
    }
    for (int d = 0; sh && d < nd; d++)
        if (sh[d].stream)
            (void)um_stream_destroy(r.ctx, sh[d].stream);
    close_run(&r);
    free(seq);
    free(sh);
    free(x);
    return rc;
}

/* Prints the runs' statistics after the results (when every run went
 * well) and passes the command's exit code through. */
static int print_run_stats(int rc)
{
    if (!run_stats.f)
        return rc;
    fclose(run_stats.f);
    run_stats.f = NULL;
    if (!rc && run_stats.len)
        printf("\nunimem at the end of each run, its buffers still there (um_stats_print):\n%s",
               run_stats.buf);
    free(run_stats.buf);
    run_stats.buf = NULL;
    return rc;
}

int um_cmd_bench_oversub(int argc, char **argv)
{
    oversub_opts o = {0};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        long v;
        if (!strcmp(a, "--json")) {
            o.json = true;
        } else if (!strcmp(a, "--quick")) {
            o.quick = true;
        } else if (!strcmp(a, "--all-devices")) {
            o.all = true;
        } else if (!strcmp(a, "--workload") && i + 1 < argc) {
            o.workload = argv[++i];
            if (strcmp(o.workload, "stream") && strcmp(o.workload, "random")) {
                fprintf(stderr, "unimem " OVERSUB_CMD ": --workload takes stream or random, "
                        "not '%s'\n", o.workload);
                return TOOL_EXIT_USAGE;
            }
        } else if (!strcmp(a, "--policy") && i + 1 < argc) {
            o.policy = argv[++i];
            if (strcmp(o.policy, "cost") && strcmp(o.policy, "lru")) {
                fprintf(stderr, "unimem " OVERSUB_CMD ": --policy takes cost or lru, not '%s'\n",
                        o.policy);
                return TOOL_EXIT_USAGE;
            }
        } else if (!strcmp(a, "--device") && i + 1 < argc) {
            o.device = argv[++i];
            if (!tool_device_arg_ok(OVERSUB_CMD, o.device))
                return TOOL_EXIT_USAGE;
        } else if (!strcmp(a, "--sim-bandwidth") && i + 1 < argc) {
            if (um_parse_size(argv[++i], &o.sim_bandwidth) != UM_OK || !o.sim_bandwidth) {
                fprintf(stderr, "unimem " OVERSUB_CMD ": --sim-bandwidth takes a size per "
                        "second above 0, not '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--limit") && i + 1 < argc) {
            if (um_parse_size(argv[++i], &o.limit) != UM_OK || o.limit < ((size_t)64 << 20)) {
                fprintf(stderr, "unimem " OVERSUB_CMD ": --limit takes a size of 64M or more, "
                        "not '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--slots") && i + 1 < argc) {
            if (!tool_parse_long(argv[++i], 4, 4096, &v)) {
                fprintf(stderr, "unimem " OVERSUB_CMD ": --slots takes a whole number from 4 "
                        "to 4096, not '%s'\n", argv[i]);
                return TOOL_EXIT_USAGE;
            }
            o.slots = (int)v;
        } else if (!strcmp(a, "--random-length") && i + 1 < argc) {
            if (!tool_parse_long(argv[++i], 1, 1000, &v)) {
                fprintf(stderr, "unimem " OVERSUB_CMD ": --random-length takes a whole number "
                        "of accesses per buffer from 1 to 1000, not '%s'\n", argv[i]);
                return TOOL_EXIT_USAGE;
            }
            o.random_length = (int)v;
        } else {
            return tool_other_arg(OVERSUB_CMD, a, oversub_usage);
        }
    }
    if (o.all && o.workload && strcmp(o.workload, "stream")) {
        fprintf(stderr, "unimem " OVERSUB_CMD ": --all-devices runs the stream workload only, "
                "not --workload %s\n", o.workload);
        return TOOL_EXIT_USAGE;
    }
    int version = 0, gpus = 0;
    char why[160];
    bool gpu = um_cuda_driver_info(&version, &gpus, why, sizeof why) == UM_OK && gpus > 0;
    if (!o.device && o.all)
        o.device = gpu ? "cuda" : "sim:2x4G";
    if (!o.device)
        o.device = gpu ? "cuda:0" : "sim:4G";
    if (!o.sim_bandwidth)
        o.sim_bandwidth = (size_t)4 << 30;
    if (!o.limit)
        o.limit = strncmp(o.device, "cuda", 4) == 0 ? (size_t)8 << 30 : (size_t)512 << 20;
    if (!o.slots)
        o.slots = DEFAULT_SLOTS;
    if (!o.random_length)
        o.random_length = o.quick ? RANDOM_LENGTH_QUICK : RANDOM_LENGTH;
    /* A buffer that is not a whole number of GPU pages would take more
     * than its share of the limit, so that fewer than N would fit and the
     * MIN computed for N slots would be wrong. */
    if (o.limit % (size_t)o.slots || (o.limit / (size_t)o.slots) % BUFFER_ALIGN) {
        char lim[32];
        fprintf(stderr, "unimem " OVERSUB_CMD ": the limit (%s) over --slots %d must be a "
                "whole multiple of 2 MiB, the size of each buffer\n", tool_bytes(lim, o.limit),
                o.slots);
        return TOOL_EXIT_USAGE;
    }
    static const char *const policies[] = {"cost", "lru"};
    int rc = 0;
    if (!o.json)
        run_stats.f = open_memstream(&run_stats.buf, &run_stats.len);
    /* Filling every device's share of the inputs dominates a quick run
     * on sim devices, so --all-devices --quick leaves LRU out. */
    int npolicies = o.policy ? 1 : o.all && o.quick ? 1 : 2;
    const char *const *policy = o.policy ? &o.policy : policies;
    if (o.all) {
        static const double all_factors[] = {1.5, 2.0};
        bool described = false;
        progress.total = 2 * npolicies;
        for (int f = 0; f < 2 && !rc; f++)
            for (int p = 0; p < npolicies && !rc; p++)
                rc = bench_all(&o, all_factors[f], policy[p], &described);
        return print_run_stats(rc);
    }
    static const double factors[] = {1.5, 2.0, 4.0};
    bool described = false;
    bool streams = !o.workload || !strcmp(o.workload, "stream");
    bool random = !o.workload || !strcmp(o.workload, "random");
    int nfactors = streams ? (o.quick ? 2 : 3) : 0;
    progress.total = (nfactors + (random ? 1 : 0)) * npolicies;
    for (int f = 0; f < nfactors && !rc; f++)
        for (int p = 0; p < npolicies && !rc; p++)
            rc = bench_one(&o, "stream", factors[f], policy[p], &described);
    for (int p = 0; random && p < npolicies && !rc; p++)
        rc = bench_one(&o, "random", 2.0, policy[p], &described);
    return print_run_stats(rc);
}
