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
 *   random   uniform random reads at 2x the limit.
 *
 * Both announce each access 32 ahead with UM_HINT_WILL_USE, as queued work
 * would, and run with the cost-aware policy and with LRU, the background
 * reclaimer off (eviction on demand, at the full limit). Uses only
 * include/unimem.h.
 */
#include "tool.h"

#include <stdlib.h>
#include <string.h>

#define OVERSUB_CMD "bench oversub"
#define LOOKAHEAD 32
#define BUFFERS_PER_LIMIT 32

typedef struct oversub_opts {
    bool json, quick;
    const char *device;
    size_t limit;
    size_t sim_bandwidth; /* a sim device's modelled link, bytes/s */
} oversub_opts;

static void oversub_usage(FILE *f)
{
    fprintf(f,
            "usage: unimem bench oversub [--json] [--quick] [--device SPEC] [--limit BYTES]\n"
            "                            [--sim-bandwidth BYTES]\n"
            "\n"
            "Streams and randomly reads buffers totalling 1.5x-4x a device's memory limit and\n"
            "compares the bytes moved and the time with what Belady's MIN would need.\n"
            "\n"
            "  --device SPEC  the devices option (default cuda:0, or sim:4G with no GPU)\n"
            "  --limit BYTES  the device's memory limit (default 8G on a GPU, 512M on sim)\n"
            "  --sim-bandwidth BYTES  a sim device's modelled link per second, each way\n"
            "                 (option sim_link_bandwidth; default 4G)\n"
            "  --quick        fewer passes, stream at 1.5x and 2x only\n"
            "  --json         one JSON object per workload and policy\n");
}

/* ------------------------------------------------------------------ MIN */

/* Misses of Belady's MIN on seq (item ids < nitems) with `slots` slots. */
static uint64_t min_misses(const int *seq, size_t n, int nitems, int slots)
{
    size_t *next = malloc(n * sizeof *next);
    size_t *last = malloc((size_t)nitems * sizeof *last);
    bool *in = calloc((size_t)nitems, sizeof *in);
    size_t *next_of = malloc((size_t)nitems * sizeof *next_of);
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
                for (int i = 0; i < nitems; i++)
                    if (in[i] && (victim < 0 || next_of[i] > next_of[victim]))
                        victim = i;
                in[victim] = false;
                used--;
            }
            in[x] = true;
            used++;
        }
        next_of[x] = next[t];
    }
    free(next);
    free(last);
    free(in);
    free(next_of);
    return misses;
}

/* ------------------------------------------------------------ workloads */

typedef struct run {
    um_context *ctx;
    size_t size;        /* bytes per buffer */
    int n;              /* input buffers */
    um_buffer **in;
    um_buffer *result;
    void *host;         /* the result's landing place on the host */
} run;

static um_status open_run(const oversub_opts *o, const char *policy, size_t size, int n, run *r)
{
    memset(r, 0, sizeof *r);
    char conf[256];
    /* The background reclaimer stays off: the policy is measured against
     * MIN at the full limit (eviction ahead of need would keep the device
     * below it; its cost is reported in docs/BENCHMARKS.md). */
    snprintf(conf, sizeof conf,
             "devices=%s,evict_policy=%s,watermark_high=100,watermark_low=100,"
             "sim_link_bandwidth=%zu",
             o->device, policy, o->sim_bandwidth);
    um_status st = um_init(conf, &r->ctx);
    if (st == UM_OK)
        st = um_set_memory_limit(r->ctx, 1, o->limit);
    r->size = size;
    r->n = n;
    r->in = calloc((size_t)n, sizeof *r->in);
    r->host = malloc(size);
    if (st == UM_OK && (!r->in || !r->host))
        st = UM_ERR_NOMEM;
    if (st == UM_OK)
        memset(r->host, 0x3c, size);
    /* A sim device's memory is a file mapping whose first touch of each
     * page faults (slowly on some machines), which a GPU's memory never
     * does: it is touched once before the clock runs, so only the link
     * model's time and the engine's show. */
    if (st == UM_OK && !strncmp(o->device, "sim", 3)) {
        void *warm = NULL;
        st = um_malloc(r->ctx, 1, o->limit, NULL, &warm);
        if (st == UM_OK) {
            memset(warm, 0, o->limit);
            st = um_free(r->ctx, warm, NULL);
        }
    }
    /* The inputs start on the host (written there, as loaded data is). */
    for (int i = 0; i < n && st == UM_OK; i++) {
        st = um_buffer_create(r->ctx, size, NULL, &r->in[i]);
        if (st == UM_OK)
            st = um_buffer_write(r->in[i], 0, r->host, size);
    }
    if (st == UM_OK)
        st = um_buffer_create(r->ctx, size, NULL, &r->result);
    return st;
}

static void close_run(run *r)
{
    for (int i = 0; r->in && i < r->n; i++)
        if (r->in[i])
            (void)um_buffer_destroy(r->in[i]);
    if (r->result)
        (void)um_buffer_destroy(r->result);
    free(r->in);
    free(r->host);
    if (r->ctx)
        um_shutdown(r->ctx);
}

/* Reads seq's buffers on device 1 in order, announcing each LOOKAHEAD
 * ahead; after every `pass_len` accesses (0: never) writes the result on
 * the device and reads it back. */
static um_status play(run *r, const int *seq, size_t len, size_t pass_len)
{
    um_status st = UM_OK;
    for (size_t t = 0; t < len && t < LOOKAHEAD && st == UM_OK; t++)
        st = um_buffer_hint(r->in[seq[t]], UM_HINT_WILL_USE);
    for (size_t t = 0; t < len && st == UM_OK; t++) {
        if (t + LOOKAHEAD < len)
            st = um_buffer_hint(r->in[seq[t + LOOKAHEAD]], UM_HINT_WILL_USE);
        void *p;
        if (st == UM_OK)
            st = um_buffer_acquire(r->in[seq[t]], 1, UM_ACCESS_READ, NULL, &p);
        if (st == UM_OK)
            st = um_buffer_release(r->in[seq[t]], 1, NULL);
        if (st == UM_OK && pass_len && (t + 1) % pass_len == 0) {
            st = um_buffer_acquire(r->result, 1, UM_ACCESS_WRITE_DISCARD, NULL, &p);
            if (st == UM_OK)
                st = um_buffer_release(r->result, 1, NULL);
            /* Back to the host while the next pass's copies run. */
            if (st == UM_OK)
                st = um_buffer_prefetch(r->result, 0);
        }
    }
    if (st == UM_OK)
        st = um_stream_synchronize(r->ctx, NULL);
    return st;
}

/* Host<->device GB/s for one buffer, in the same context (best of 3). */
static um_status link_gbps(run *r, double *h2d, double *d2h)
{
    *h2d = *d2h = 0.0;
    um_status st = UM_OK;
    for (int i = 0; i < 3 && st == UM_OK; i++) {
        void *p;
        um_buffer *b = r->result;
        st = um_buffer_acquire(b, 0, UM_ACCESS_WRITE_DISCARD, NULL, &p);
        if (st == UM_OK)
            st = um_buffer_release(b, 0, NULL);
        uint64_t t0 = tool_now_ns();
        if (st == UM_OK)
            st = um_buffer_acquire(b, 1, UM_ACCESS_READ_WRITE, NULL, &p);
        if (st == UM_OK)
            st = um_stream_synchronize(r->ctx, NULL);
        uint64_t t1 = tool_now_ns();
        if (st == UM_OK)
            st = um_buffer_release(b, 1, NULL);
        if (st == UM_OK)
            st = um_stream_synchronize(r->ctx, NULL);
        uint64_t t2 = tool_now_ns();
        if (st == UM_OK)
            st = um_buffer_acquire(b, 0, UM_ACCESS_READ, NULL, &p);
        uint64_t t3 = tool_now_ns();
        if (st == UM_OK)
            st = um_buffer_release(b, 0, NULL);
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
} result;

static void print_result(const oversub_opts *o, const result *x)
{
    double over_bound = x->seconds > 0 ? x->bound_seconds / x->seconds : 0.0;
    double over_min = x->min_bytes ? (double)x->moved / (double)x->min_bytes : 0.0;
    if (o->json) {
        printf("{\"workload\":\"%s\",\"oversubscription\":%.2f,\"policy\":\"%s\","
               "\"bytes_moved\":%llu,\"min_bytes\":%llu,\"moved_over_min\":%.4f,"
               "\"seconds\":%.4f,\"bound_seconds\":%.4f,\"throughput_over_bound\":%.4f,"
               "\"h2d_gbps\":%.2f,\"d2h_gbps\":%.2f}\n",
               x->workload, x->oversub, x->policy, (unsigned long long)x->moved,
               (unsigned long long)x->min_bytes, over_min, x->seconds, x->bound_seconds,
               over_bound, x->h2d, x->d2h);
        return;
    }
    char a[32], b[32];
    printf("%-7s %5.1fx %-5s %12s %12s %8.3f %9.3f %9.3f %8.3f %8.1f %8.1f\n", x->workload,
           x->oversub, x->policy, tool_bytes(a, x->moved), tool_bytes(b, x->min_bytes), over_min,
           x->seconds, x->bound_seconds, over_bound, x->h2d, x->d2h);
}

/* One workload with one policy: the inputs, the access sequence, the run. */
static int bench_one(const oversub_opts *o, const char *workload, double factor,
                     const char *policy)
{
    size_t size = o->limit / BUFFERS_PER_LIMIT;
    int slots = (int)(o->limit / size);
    int n = (int)(factor * slots + 0.5);
    bool stream = !strcmp(workload, "stream");
    int passes = o->quick ? 2 : 3;
    size_t len = stream ? (size_t)n * (size_t)passes : (size_t)n * (size_t)(o->quick ? 3 : 6);
    int *seq = malloc(len * sizeof *seq);
    uint64_t rng = 0x6f76657273756221ull;
    for (size_t t = 0; t < len; t++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        seq[t] = stream ? (int)(t % (size_t)n) : (int)((rng >> 33) % (uint64_t)n);
    }
    run r;
    um_status st = open_run(o, policy, size, n, &r);
    double h2d = 0, d2h = 0;
    if (st == UM_OK)
        st = link_gbps(&r, &h2d, &d2h);
    uint64_t up0 = link_bytes(r.ctx, 0, 1), down0 = link_bytes(r.ctx, 1, 0);
    uint64_t t0 = tool_now_ns();
    if (st == UM_OK)
        st = play(&r, seq, len, stream ? (size_t)n : 0);
    uint64_t t1 = tool_now_ns();
    if (st != UM_OK) {
        int rc = tool_fail(OVERSUB_CMD, st);
        close_run(&r);
        free(seq);
        return rc;
    }
    /* The result keeps one slot; its read-back is the bytes down. */
    uint64_t misses = min_misses(seq, len, n, stream ? slots - 1 : slots);
    uint64_t up = link_bytes(r.ctx, 0, 1) - up0, down = link_bytes(r.ctx, 1, 0) - down0;
    result x = {workload, policy, factor, up + down, 0, (double)(t1 - t0) / 1e9, 0, h2d, d2h};
    uint64_t min_up = misses * size, min_down = stream ? (uint64_t)passes * size : 0;
    x.min_bytes = min_up + min_down;
    double t_up = (double)min_up / (h2d * 1e9), t_down = (double)min_down / (d2h * 1e9);
    x.bound_seconds = t_up > t_down ? t_up : t_down;
    print_result(o, &x);
    close_run(&r);
    free(seq);
    return 0;
}

int um_cmd_bench_oversub(int argc, char **argv)
{
    oversub_opts o = {0};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) {
            o.json = true;
        } else if (!strcmp(a, "--quick")) {
            o.quick = true;
        } else if (!strcmp(a, "--device") && i + 1 < argc) {
            o.device = argv[++i];
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
        } else {
            return tool_other_arg(OVERSUB_CMD, a, oversub_usage);
        }
    }
    int version = 0, gpus = 0;
    char why[160];
    bool gpu = um_cuda_driver_info(&version, &gpus, why, sizeof why) == UM_OK && gpus > 0;
    if (!o.device)
        o.device = gpu ? "cuda:0" : "sim:4G";
    if (!o.sim_bandwidth)
        o.sim_bandwidth = (size_t)4 << 30;
    if (!o.limit)
        o.limit = strncmp(o.device, "cuda", 4) == 0 ? (size_t)8 << 30 : (size_t)512 << 20;
    char lim[32];
    if (!o.json) {
        char bw[32];
        printf("unimem bench oversub: devices=%s, device 1 limited to %s, buffers of %s; "
               "accesses announced %d ahead%s%s%s\n",
               o.device, tool_bytes(lim, o.limit), tool_bytes(why, o.limit / BUFFERS_PER_LIMIT),
               LOOKAHEAD, strncmp(o.device, "sim", 3) ? "" : "; sim link modelled at ",
               strncmp(o.device, "sim", 3) ? "" : tool_bytes(bw, o.sim_bandwidth),
               strncmp(o.device, "sim", 3) ? "" : "/s each way");
        printf("%-7s %6s %-5s %12s %12s %8s %9s %9s %8s %8s %8s\n", "work", "over", "pol",
               "moved", "MIN", "mv/MIN", "seconds", "bound_s", "tp/bnd", "h2d_GB/s", "d2h_GB/s");
    }
    static const double factors[] = {1.5, 2.0, 4.0};
    static const char *const policies[] = {"cost", "lru"};
    int rc = 0;
    for (int f = 0; f < (o.quick ? 2 : 3) && !rc; f++)
        for (int p = 0; p < 2 && !rc; p++)
            rc = bench_one(&o, "stream", factors[f], policies[p]);
    for (int p = 0; p < 2 && !rc; p++)
        rc = bench_one(&o, "random", 2.0, policies[p]);
    return rc;
}
