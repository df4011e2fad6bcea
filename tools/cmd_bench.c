/*
 * `unimem bench alloc`: the allocator hot path. It times alloc+free pairs
 * through the public API on one device and, in the same run and on the same
 * size sequence, glibc malloc/free, so every table carries its own baseline.
 * The sizes come from a real allocation trace (GPT-2 training by default).
 * Owns nothing outside the command: it makes its own context, uses only
 * include/unimem.h, and frees everything before it returns.
 *
 * Scenarios: "trace-sizes" (every allocation size of the trace, in order),
 * "small" (only the sizes up to 32 KiB) and "large" (only those above)
 * keep a ring of L live blocks:
 * each step frees the oldest block and allocates the next size of the
 * sequence. "trace-pattern" keeps the trace's own live-set pattern: it
 * replays the trace's allocations and frees in their order, over and over,
 * while L further blocks of the trace's sizes stay live underneath, so it
 * shows what the number of live blocks alone costs a program like the one
 * traced (a ring frees the block whose records are the coldest, by
 * construction). "threads" runs 1, 2 and 4 threads, each with its own ring
 * of 100 small blocks on the same device. Neither allocator's memory is ever
 * touched, because device memory is not host-readable in general; the times
 * are allocator bookkeeping only.
 */
#include "tool.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BENCH_CMD "bench alloc"
#define BENCH_REPEATS 3
/* measure() and measure_threads() report the middle run itself (its pairs
 * too), which an even count does not have. */
_Static_assert(BENCH_REPEATS % 2 == 1, "BENCH_REPEATS must be odd");
#define BENCH_SMALL_MAX ((uint64_t)32 * 1024)
#define BENCH_DEFAULT_DEVICE "sim:141G"
#define BENCH_TRACE_NAME "gpt2_train.trace.gz"
#define BENCH_THREAD_LIVE 100
/* The clock is read once per chunk of pairs, so its cost (tens of ns) is
 * spread over a thousand pairs. */
#define BENCH_CHUNK 1024
#define BENCH_UNLIKELY(x) __builtin_expect(!!(x), 0)

typedef struct bench_opts {
    bool json;
    bool quick;
    const char *device;    /* value of the devices option; "host" benches device 0 */
    const char *allocator; /* NULL: the default (or UNIMEM_CONF's) */
    const char *trace;     /* NULL: the bundled trace */
    uint64_t pairs;        /* timed pairs per measurement (a cap; see budget_ns) */
    uint64_t thread_pairs; /* timed pairs per thread in the threads scenario */
    uint64_t budget_ns;    /* a measurement also stops after this much time */
    const char *scenario;  /* NULL: every scenario */
    size_t live;           /* 0: every ring size */
} bench_opts;

typedef struct size_seq {
    size_t *v;
    size_t n;
} size_seq;

/* One event of the trace's own order: allocate `size` bytes as the trace's
 * block `slot` (a dense index), or (size 0) free that block. */
typedef struct trace_op {
    size_t slot;
    size_t size;
} trace_op;

/* The trace as the trace-pattern scenario replays it: its events in order,
 * then a free of each block it leaves live, so every pass starts alike. */
typedef struct op_seq {
    trace_op *v;
    size_t n, cap;
    size_t slots;       /* blocks (the slots' count) */
    size_t allocs;      /* allocations in one pass */
    uint64_t peak;      /* the most bytes live at once */
} op_seq;

/* What one bench run shares: the context, the device and the sequences. */
typedef struct bench {
    bench_opts o;
    um_context *ctx;
    int dev;
    um_device_info info;
    size_seq all;
    size_seq small;
    size_seq large;
    op_seq ops;
    long cpus;
    char trace_path[PATH_MAX];
    char conf[512];       /* the context's configuration */
} bench;

/* One timed measurement: how many pairs, how long. */
typedef struct sample {
    uint64_t pairs;
    uint64_t ns;
} sample;

/* The result of one scenario row, for the table and the JSON line. */
typedef struct row {
    const char *scenario;
    size_t live;
    int threads;
    bool skipped;
    char skip_reason[160];
    uint64_t um_pairs, mc_pairs;
    double um_ns, mc_ns;           /* per pair (per thread in the threads scenario) */
    double um_rate, mc_rate;       /* total pairs per second */
    double um_scaling, mc_scaling; /* threads: rate / rate with 1 thread; 0 otherwise */
    double um_calls;               /* unimem backend calls per pair; < 0: not measured */
} row;

/* Prints a failed call's message after whatever the table has so far. */
static int bench_fail(um_status s)
{
    fflush(stdout);
    return tool_fail(BENCH_CMD, s);
}

/* ------------------------------------------------------------ arguments */

static void bench_usage(FILE *f)
{
    fprintf(f,
            "usage: unimem bench alloc [--json] [--quick] [--device SPEC] [--allocator NAME]\n"
            "                          [--trace FILE] [--pairs N] [--max-seconds S]\n"
            "                          [--scenario NAME] [--live N]\n"
            "\n"
            "Times alloc+free pairs of unimem (device 1) and glibc malloc in the same run, with\n"
            "the allocation sizes of a real trace, for rings of 10..10,000 live blocks, for the\n"
            "trace's own order of allocations and frees over 10..10,000 blocks that stay live,\n"
            "and for 1, 2 and 4 threads. Memory is never touched by either allocator.\n"
            "\n"
            "  --json            one JSON object per scenario per line instead of the table\n"
            "  --quick           fewer pairs per measurement\n"
            "  --device SPEC     the devices option (default %s); 'host' benches device 0\n"
            "  --allocator NAME  pool, direct or bufcache (default: the allocator option)\n"
            "  --trace FILE      allocation trace whose sizes are used (default: data/%s)\n"
            "  --pairs N         timed pairs per measurement (default 2000000, quick 200000)\n"
            "  --max-seconds S   a measurement stops after S seconds even if its pairs are not\n"
            "                    done (default 2, quick 0.25)\n"
            "  --scenario NAME   only this scenario: trace-sizes, small, large, trace-pattern\n"
            "                    or threads; or record (not run by default, as it writes a\n"
            "                    trace): the small sizes' ring (100 blocks, or --live) in two\n"
            "                    contexts taking turns, one of them recording a trace\n"
            "                    (trace_file, in $TMPDIR, deleted after): what a recorded\n"
            "                    event costs, and the ratio of a recorded pair to a plain one\n"
            "  --live N          only the rings (or trace-pattern runs) of N live blocks (10, 100,\n"
            "                    1000 or 10000)\n"
            "\n"
            "The other benchmarks: unimem bench copy|oversub|gpu --help.\n",
            BENCH_DEFAULT_DEVICE, BENCH_TRACE_NAME);
}

/* Parses argv (argv[0] is "bench"); returns -1 to go on, else an exit code. */
static int bench_parse_args(int argc, char **argv, bench_opts *o)
{
    memset(o, 0, sizeof *o);
    o->device = BENCH_DEFAULT_DEVICE;
    if (argc >= 2 && !strcmp(argv[1], "copy"))
        return um_cmd_bench_copy(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "oversub"))
        return um_cmd_bench_oversub(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "gpu"))
        return um_cmd_bench_gpu(argc, argv);
    if (argc < 2 || strcmp(argv[1], "alloc") != 0) {
        if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
            bench_usage(stdout);
            return 0;
        }
        fprintf(stderr, "unimem bench: expected the benchmark name 'alloc', 'copy', 'oversub' or 'gpu'%s%s\n\n",
                argc >= 2 ? ", got " : "", argc >= 2 ? argv[1] : "");
        bench_usage(stderr);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        if (!strcmp(a, "--json")) {
            o->json = true;
        } else if (!strcmp(a, "--quick")) {
            o->quick = true;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            bench_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--device") && has_value) {
            o->device = argv[++i];
            if (!tool_device_arg_ok(BENCH_CMD, o->device))
                return TOOL_EXIT_USAGE;
        } else if (!strcmp(a, "--allocator") && has_value) {
            o->allocator = argv[++i];
            /* It goes into the configuration string as --device does. */
            if (!*o->allocator || strpbrk(o->allocator, ",=")) {
                fprintf(stderr,
                        "unimem " BENCH_CMD ": bad --allocator '%s' (pool, direct or bufcache)\n",
                        o->allocator);
                return TOOL_EXIT_USAGE;
            }
        } else if (!strcmp(a, "--trace") && has_value) {
            o->trace = argv[++i];
        } else if (!strcmp(a, "--pairs") && has_value) {
            char *end;
            const char *v = argv[++i];
            unsigned long long n = strtoull(v, &end, 10);
            if (*v < '0' || *v > '9' || *end || n == 0 || n > (1ull << 40)) {
                fprintf(stderr,
                        "unimem " BENCH_CMD ": --pairs needs a count from 1 to 2^40, "
                        "not '%s'\n",
                        v);
                return 2;
            }
            o->pairs = n;
        } else if (!strcmp(a, "--scenario") && has_value) {
            o->scenario = argv[++i];
            if (strcmp(o->scenario, "trace-sizes") && strcmp(o->scenario, "small") &&
                strcmp(o->scenario, "large") && strcmp(o->scenario, "trace-pattern") &&
                strcmp(o->scenario, "threads") && strcmp(o->scenario, "record")) {
                fprintf(stderr,
                        "unimem " BENCH_CMD ": --scenario is trace-sizes, small, large, "
                        "trace-pattern, threads or record, "
                        "not '%s'\n",
                        o->scenario);
                return 2;
            }
        } else if (!strcmp(a, "--live") && has_value) {
            const char *v = argv[++i];
            if (strcmp(v, "10") && strcmp(v, "100") && strcmp(v, "1000") && strcmp(v, "10000")) {
                fprintf(stderr,
                        "unimem " BENCH_CMD ": --live is 10, 100, 1000 or 10000, not '%s'\n", v);
                return 2;
            }
            o->live = strtoull(v, NULL, 10);
        } else if (!strcmp(a, "--max-seconds") && has_value) {
            char *end;
            const char *v = argv[++i];
            double sec = strtod(v, &end);
            if (end == v || *end || !(sec > 0.0) || sec > 3600.0) {
                fprintf(stderr,
                        "unimem " BENCH_CMD ": --max-seconds needs a number of seconds "
                        "above 0 and at most 3600, not '%s'\n",
                        v);
                return 2;
            }
            /* A budget under a nanosecond is one nanosecond: 0 would read
             * as "not given" below and become the default of seconds. */
            o->budget_ns = sec * 1e9 < 1.0 ? 1 : (uint64_t)(sec * 1e9);
        } else {
            fprintf(stderr, "unimem " BENCH_CMD ": unknown option or missing value: '%s'\n\n", a);
            bench_usage(stderr);
            return 2;
        }
    }
    if (!o->pairs)
        o->pairs = o->quick ? 200000 : 2000000;
    o->thread_pairs = o->pairs / 2;
    if (!o->thread_pairs)
        o->thread_pairs = 1;
    /* A measurement whose pairs are slow (glibc's mmap path for the large
     * trace sizes) stops at the time budget instead, so the whole run stays
     * in minutes; the table says how many pairs each figure timed. */
    if (!o->budget_ns)
        o->budget_ns = o->quick ? 250000000ull : 2000000000ull;
    return -1;
}

/* ---------------------------------------------------------------- trace */

static bool file_readable(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    fclose(f);
    return true;
}

/* The source tree of a CMake build directory, from its CMakeCache.txt, so a
 * build directory anywhere (say /tmp/build) still finds the bundled trace. */
static bool source_dir_from_cache(const char *build_dir, char *out, size_t cap)
{
    static const char key[] = "unimem_SOURCE_DIR:STATIC=";
    char path[PATH_MAX + 32];
    char line[PATH_MAX + 64];
    bool found = false;
    snprintf(path, sizeof path, "%s/CMakeCache.txt", build_dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, key, sizeof key - 1) != 0)
            continue;
        char *v = line + sizeof key - 1;
        v[strcspn(v, "\r\n")] = '\0';
        if (*v && strlen(v) < cap) {
            memcpy(out, v, strlen(v) + 1);
            found = true;
        }
    }
    fclose(f);
    return found;
}

/* Finds the default trace: next to the executable (../data, ./data), in the
 * current directory's data/, then in the source tree of the build directory
 * the executable sits in. */
static bool find_default_trace(char *out, size_t cap)
{
    char exe[PATH_MAX];
    char src[PATH_MAX];
    char cand[4][PATH_MAX + 64];
    int ncand = 0;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = '\0';
        snprintf(cand[ncand++], sizeof cand[0], "%s/../data/%s", exe, BENCH_TRACE_NAME);
        snprintf(cand[ncand++], sizeof cand[0], "%s/data/%s", exe, BENCH_TRACE_NAME);
    }
    snprintf(cand[ncand++], sizeof cand[0], "data/%s", BENCH_TRACE_NAME);
    if (n > 0 && source_dir_from_cache(exe, src, sizeof src))
        snprintf(cand[ncand++], sizeof cand[0], "%s/data/%s", src, BENCH_TRACE_NAME);
    for (int i = 0; i < ncand; i++) {
        if (file_readable(cand[i]) && strlen(cand[i]) < cap) {
            memcpy(out, cand[i], strlen(cand[i]) + 1);
            return true;
        }
    }
    fprintf(stderr, "unimem " BENCH_CMD ": cannot find %s; looked in:\n", BENCH_TRACE_NAME);
    for (int i = 0; i < ncand; i++)
        fprintf(stderr, "  %s\n", cand[i]);
    fprintf(stderr, "give the trace with --trace FILE\n");
    return false;
}

static int seq_push(size_seq *s, size_t *cap, size_t v)
{
    if (s->n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 1024;
        size_t *nv = realloc(s->v, ncap * sizeof *nv);
        if (!nv) {
            fprintf(stderr, "unimem " BENCH_CMD ": out of host memory for %zu trace sizes\n", ncap);
            return 1;
        }
        s->v = nv;
        *cap = ncap;
    }
    s->v[s->n++] = v;
    return 0;
}

static int ops_push(op_seq *o, size_t slot, size_t size)
{
    if (o->n == o->cap) {
        size_t ncap = o->cap ? o->cap * 2 : 1024;
        trace_op *nv = realloc(o->v, ncap * sizeof *nv);
        if (!nv) {
            fprintf(stderr, "unimem " BENCH_CMD ": out of host memory for %zu trace events\n",
                    ncap);
            return 1;
        }
        o->v = nv;
        o->cap = ncap;
    }
    o->v[o->n++] = (trace_op){slot, size};
    return 0;
}

/* Appends a free of every block the trace leaves live and finds the peak
 * of live bytes. Returns an exit code (0 on success). */
static int ops_close(op_seq *o)
{
    size_t *live = calloc(o->slots ? o->slots : 1, sizeof *live);
    if (!live) {
        fprintf(stderr, "unimem " BENCH_CMD ": out of host memory for %zu trace blocks\n",
                o->slots);
        return 1;
    }
    uint64_t bytes = 0;
    for (size_t i = 0; i < o->n; i++) {
        const trace_op *op = &o->v[i];
        bytes = op->size ? bytes + op->size : bytes - live[op->slot];
        live[op->slot] = op->size;
        o->allocs += op->size != 0;
        if (bytes > o->peak)
            o->peak = bytes;
    }
    int rc = 0;
    for (size_t slot = 0; slot < o->slots && !rc; slot++)
        if (live[slot])
            rc = ops_push(o, slot, 0);
    free(live);
    return rc;
}

/* Reads the trace: the sequence of allocation sizes (all of them, the
 * ones up to BENCH_SMALL_MAX and those above) and its events in order.
 * Returns an exit code (0 on success). */
static int load_sizes(bench *b)
{
    um_trace *t = NULL;
    um_trace_event ev;
    size_t cap_all = 0, cap_small = 0, cap_large = 0;
    uint64_t zero = 0;
    int done = 0;
    um_status s = um_trace_open(b->trace_path, &t);
    if (s != UM_OK)
        return bench_fail(s);
    while ((s = um_trace_next(t, &ev, &done)) == UM_OK && !done) {
        /* um_malloc rejects size 0, and a trace size beyond size_t cannot be
         * requested at all; both are left out, with their frees (a free's
         * event carries its allocation's size). */
        bool usable = ev.size != 0 && ev.size <= SIZE_MAX;
        if (usable && ops_push(&b->ops, (size_t)ev.slot,
                               ev.op == UM_TRACE_ALLOC ? (size_t)ev.size : 0)) {
            um_trace_close(t);
            return 1;
        }
        if (ev.op != UM_TRACE_ALLOC)
            continue;
        if (!usable) {
            zero++;
            continue;
        }
        bool small = ev.size <= BENCH_SMALL_MAX;
        if (seq_push(&b->all, &cap_all, (size_t)ev.size) ||
            seq_push(small ? &b->small : &b->large, small ? &cap_small : &cap_large,
                     (size_t)ev.size)) {
            um_trace_close(t);
            return 1;
        }
    }
    b->ops.slots = (size_t)um_trace_slots(t);
    um_trace_close(t);
    if (s != UM_OK)
        return bench_fail(s);
    if (ops_close(&b->ops))
        return 1;
    if (!b->small.n || !b->large.n) {
        fprintf(stderr,
                "unimem " BENCH_CMD ": trace %s has %zu usable allocation sizes, %zu of them "
                "<= 32 KiB (%llu of size 0 left out); the benchmark needs sizes on both sides "
                "of 32 KiB\n",
                b->trace_path, b->all.n, b->small.n, (unsigned long long)zero);
        return 1;
    }
    return 0;
}

/* The most bytes a ring of `live` consecutive sizes of the cycled sequence
 * ever holds at once. */
static uint64_t max_window_bytes(const size_seq *s, size_t live)
{
    uint64_t total = 0, best = 0, w = 0;
    size_t full = live / s->n, rest = live % s->n;
    for (size_t i = 0; i < s->n; i++)
        total += s->v[i];
    for (size_t i = 0; i < rest; i++)
        w += s->v[i];
    best = w;
    for (size_t i = 0; i < s->n && rest; i++) {
        w += s->v[(i + rest) % s->n];
        w -= s->v[i];
        if (w > best)
            best = w;
    }
    return (uint64_t)full * total + best;
}

/* ---------------------------------------------------------------- rings */

/* A ring of live blocks: step i frees ptr[head] and allocates the next size
 * of the sequence into it. */
typedef struct ring {
    void **ptr;
    size_t live;
    size_t head;
    const size_t *sizes;
    size_t nsizes;
    size_t next;
    um_context *ctx;
    int dev;
    /* Set on failure: the status and um_last_error() of the failing thread
     * (the message is thread-local, so a worker thread copies it here). */
    um_status status;
    char error[512];
    size_t failed_size;
} ring;

static void ring_init(ring *r, um_context *ctx, int dev, const size_seq *s, size_t live,
                      size_t start)
{
    memset(r, 0, sizeof *r);
    r->ctx = ctx;
    r->dev = dev;
    r->sizes = s->v;
    r->nsizes = s->n;
    r->live = live;
    r->next = start % s->n;
}

static void ring_um_error(ring *r, um_status s, size_t size)
{
    const char *e = um_last_error();
    r->status = s;
    r->failed_size = size;
    snprintf(r->error, sizeof r->error, "%s", *e ? e : um_strerror(s));
}

static bool ring_um_fill(ring *r)
{
    r->ptr = calloc(r->live, sizeof *r->ptr);
    if (!r->ptr) {
        snprintf(r->error, sizeof r->error, "out of host memory for a ring of %zu blocks", r->live);
        r->status = UM_ERR_NOMEM;
        return false;
    }
    for (size_t i = 0; i < r->live; i++) {
        size_t size = r->sizes[r->next];
        um_status s = um_malloc(r->ctx, r->dev, size, NULL, &r->ptr[i]);
        if (s != UM_OK) {
            r->ptr[i] = NULL;
            ring_um_error(r, s, size);
            return false;
        }
        if (++r->next == r->nsizes)
            r->next = 0;
    }
    return true;
}

static bool ring_um_run(ring *r, uint64_t pairs)
{
    for (uint64_t i = 0; i < pairs; i++) {
        void **slot = &r->ptr[r->head];
        size_t size = r->sizes[r->next];
        um_status s = um_free(r->ctx, *slot, NULL);
        if (BENCH_UNLIKELY(s != UM_OK)) {
            ring_um_error(r, s, 0);
            return false;
        }
        s = um_malloc(r->ctx, r->dev, size, NULL, slot);
        if (BENCH_UNLIKELY(s != UM_OK)) {
            *slot = NULL;
            ring_um_error(r, s, size);
            return false;
        }
        if (++r->head == r->live)
            r->head = 0;
        if (++r->next == r->nsizes)
            r->next = 0;
    }
    return true;
}

/* Frees what the ring holds; a failure here is reported but the ring is
 * emptied anyway (um_shutdown releases whatever is left). */
static bool ring_um_drain(ring *r)
{
    bool ok = true;
    for (size_t i = 0; r->ptr && i < r->live; i++) {
        if (!r->ptr[i])
            continue;
        um_status s = um_free(r->ctx, r->ptr[i], NULL);
        if (s != UM_OK && ok && r->status == UM_OK) {
            ring_um_error(r, s, 0);
            ok = false;
        }
        r->ptr[i] = NULL;
    }
    free(r->ptr);
    r->ptr = NULL;
    return ok;
}

static bool ring_mc_fill(ring *r)
{
    r->ptr = calloc(r->live, sizeof *r->ptr);
    if (!r->ptr) {
        snprintf(r->error, sizeof r->error, "out of host memory for a ring of %zu blocks", r->live);
        return false;
    }
    for (size_t i = 0; i < r->live; i++) {
        size_t size = r->sizes[r->next];
        r->ptr[i] = malloc(size);
        if (!r->ptr[i]) {
            r->failed_size = size;
            snprintf(r->error, sizeof r->error, "malloc(%zu) failed filling a ring of %zu blocks",
                     size, r->live);
            return false;
        }
        if (++r->next == r->nsizes)
            r->next = 0;
    }
    return true;
}

static bool ring_mc_run(ring *r, uint64_t pairs)
{
    for (uint64_t i = 0; i < pairs; i++) {
        void **slot = &r->ptr[r->head];
        size_t size = r->sizes[r->next];
        free(*slot);
        *slot = malloc(size);
        if (BENCH_UNLIKELY(!*slot)) {
            r->failed_size = size;
            snprintf(r->error, sizeof r->error, "malloc(%zu) failed with %zu blocks live", size,
                     r->live - 1);
            return false;
        }
        if (++r->head == r->live)
            r->head = 0;
        if (++r->next == r->nsizes)
            r->next = 0;
    }
    return true;
}

static void ring_mc_drain(ring *r)
{
    for (size_t i = 0; r->ptr && i < r->live; i++)
        free(r->ptr[i]);
    free(r->ptr);
    r->ptr = NULL;
}

typedef enum which { WHICH_UNIMEM = 0, WHICH_MALLOC = 1 } which;

static bool ring_fill(ring *r, which w)
{
    return w == WHICH_UNIMEM ? ring_um_fill(r) : ring_mc_fill(r);
}

static bool ring_run(ring *r, which w, uint64_t pairs)
{
    return w == WHICH_UNIMEM ? ring_um_run(r, pairs) : ring_mc_run(r, pairs);
}

static bool ring_drain(ring *r, which w)
{
    if (w == WHICH_UNIMEM)
        return ring_um_drain(r);
    ring_mc_drain(r);
    return true;
}

/* ----------------------------------------------------- the trace's pattern */

/* One pass of the trace-pattern scenario: the trace's events in order,
 * with r's blocks live underneath (r also takes the error). */
static bool pattern_um_pass(ring *r, const op_seq *o, void **slots)
{
    for (size_t i = 0; i < o->n; i++) {
        const trace_op *op = &o->v[i];
        void **slot = &slots[op->slot];
        um_status s = op->size ? um_malloc(r->ctx, r->dev, op->size, NULL, slot)
                               : um_free(r->ctx, *slot, NULL);
        if (BENCH_UNLIKELY(s != UM_OK)) {
            *slot = op->size ? NULL : *slot;
            ring_um_error(r, s, op->size);
            return false;
        }
        if (!op->size)
            *slot = NULL;
    }
    return true;
}

static bool pattern_mc_pass(ring *r, const op_seq *o, void **slots)
{
    for (size_t i = 0; i < o->n; i++) {
        const trace_op *op = &o->v[i];
        void **slot = &slots[op->slot];
        if (!op->size) {
            free(*slot);
            *slot = NULL;
        } else if (BENCH_UNLIKELY(!(*slot = malloc(op->size)))) {
            r->failed_size = op->size;
            snprintf(r->error, sizeof r->error, "malloc(%zu) failed replaying the trace",
                     op->size);
            return false;
        }
    }
    return true;
}

/* ------------------------------------------------------------- workloads */

/* What one measurement runs: a ring, or (ops set) the trace's own pattern
 * over the ring's blocks, which then stay live throughout. */
typedef struct workload {
    ring r;
    const op_seq *ops;
    void **slots;       /* the trace's live blocks by slot */
} workload;

static bool work_fill(workload *k, which w)
{
    if (k->ops && !(k->slots = calloc(k->ops->slots ? k->ops->slots : 1, sizeof *k->slots))) {
        snprintf(k->r.error, sizeof k->r.error, "out of host memory for %zu trace blocks",
                 k->ops->slots);
        k->r.status = UM_ERR_NOMEM;
        return false;
    }
    return ring_fill(&k->r, w);
}

/* Runs about *pairs pairs: exactly that many of a ring, one whole pass of
 * the trace (*pairs becomes its allocation count). */
static bool work_step(workload *k, which w, uint64_t *pairs)
{
    if (!k->ops)
        return ring_run(&k->r, w, *pairs);
    *pairs = k->ops->allocs;
    return w == WHICH_UNIMEM ? pattern_um_pass(&k->r, k->ops, k->slots)
                             : pattern_mc_pass(&k->r, k->ops, k->slots);
}

/* Frees what the workload holds, after a failure too. */
static bool work_drain(workload *k, which w)
{
    bool ok = true;
    for (size_t i = 0; k->slots && i < k->ops->slots; i++) {
        if (!k->slots[i])
            continue;
        if (w == WHICH_MALLOC) {
            free(k->slots[i]);
        } else {
            um_status s = um_free(k->r.ctx, k->slots[i], NULL);
            if (s != UM_OK && ok && k->r.status == UM_OK) {
                ring_um_error(&k->r, s, 0);
                ok = false;
            }
        }
    }
    free(k->slots);
    k->slots = NULL;
    return ring_drain(&k->r, w) && ok;
}

/* Times up to `pairs` pairs in chunks and stops early once budget_ns has
 * passed. Chunks start at one pair and double while a chunk takes under a
 * millisecond, so slow pairs cannot overshoot the budget by much (a pass
 * of the trace is one chunk). */
static bool work_time(workload *k, which w, uint64_t pairs, uint64_t budget_ns, sample *out)
{
    uint64_t done = 0, chunk = 1;
    uint64_t t0 = tool_now_ns(), now = t0;
    while (done < pairs) {
        uint64_t n = pairs - done < chunk ? pairs - done : chunk;
        uint64_t before = now;
        if (!work_step(k, w, &n))
            return false;
        done += n;
        now = tool_now_ns();
        if (now - t0 >= budget_ns)
            break;
        if (chunk < BENCH_CHUNK && now - before < 1000000)
            chunk *= 2;
    }
    out->pairs = done;
    out->ns = now - t0;
    return true;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Prints a failed ring's message and returns the exit code 1. */
static int ring_fail(const bench *b, const ring *r, which w, const char *scenario)
{
    tool_progress_clear();
    fflush(stdout);
    fprintf(stderr, "unimem " BENCH_CMD ": %s, %s, %zu live blocks: %s\n", scenario,
            w == WHICH_UNIMEM ? "unimem" : "malloc", r->live, r->error);
    if (w == WHICH_UNIMEM)
        fprintf(stderr, "unimem " BENCH_CMD ": device %d (%s), request of %zu bytes\n", b->dev,
                b->info.name, r->failed_size);
    return 1;
}

/* The warm-up's pairs: every block of a ring is recycled twice; the
 * trace is replayed BENCH_PATTERN_WARM times, since the step planner
 * learns its period over the first passes. */
#define BENCH_PATTERN_WARM 10
static uint64_t warm_pairs(const workload *k)
{
    return k->ops ? BENCH_PATTERN_WARM * (uint64_t)k->ops->allocs : 2 * (uint64_t)k->r.live + 10000;
}

/* One allocator on one scenario: fill, warm, three timed runs, drain.
 * Stores the median ns per pair and its pair count. */
static int measure(bench *b, workload *k, which w, const char *scenario, double *ns_out,
                   uint64_t *pairs_out, double *calls_out)
{
    um_stats before, after;
    uint64_t timed = 0;
    sample smp[BENCH_REPEATS];
    double ns[BENCH_REPEATS];
    /* Warm-up: the caches of both allocators reach their steady state
     * before the clock starts. It too stops at the time budget (slow pairs
     * are slow from the start). */
    sample warm;
    if (!work_fill(k, w) || !work_time(k, w, warm_pairs(k), b->o.budget_ns, &warm)) {
        int rc = ring_fail(b, &k->r, w, scenario);
        work_drain(k, w);
        return rc;
    }
    um_status st = w == WHICH_UNIMEM ? um_stats_get(b->ctx, b->dev, &before) : UM_OK;
    for (int i = 0; i < BENCH_REPEATS && st == UM_OK; i++) {
        if (!work_time(k, w, b->o.pairs, b->o.budget_ns, &smp[i])) {
            int rc = ring_fail(b, &k->r, w, scenario);
            work_drain(k, w);
            return rc;
        }
        ns[i] = (double)smp[i].ns / (double)smp[i].pairs;
        timed += smp[i].pairs;
    }
    /* Backend calls (page maps, unmaps, ...) per timed pair: what a pair
     * costs beyond the pool's own bookkeeping. */
    if (w == WHICH_UNIMEM && st == UM_OK)
        st = um_stats_get(b->ctx, b->dev, &after);
    if (st != UM_OK) {
        work_drain(k, w);
        return bench_fail(st);
    }
    if (calls_out && w == WHICH_UNIMEM)
        *calls_out = (double)(after.num_backend_calls - before.num_backend_calls) / (double)timed;
    else if (calls_out)
        *calls_out = -1.0;
    if (!work_drain(k, w))
        return ring_fail(b, &k->r, w, scenario);
    double sorted[BENCH_REPEATS];
    memcpy(sorted, ns, sizeof ns);
    qsort(sorted, BENCH_REPEATS, sizeof sorted[0], cmp_double);
    *ns_out = sorted[BENCH_REPEATS / 2];
    for (int i = 0; i < BENCH_REPEATS; i++)
        if (ns[i] == *ns_out)
            *pairs_out = smp[i].pairs;
    return 0;
}

/* -------------------------------------------------------------- threads */

typedef struct thread_job {
    pthread_t tid;
    workload k;
    which w;
    uint64_t pairs;
    uint64_t budget_ns;
    sample smp;
    uint64_t t_start, t_end;
    bool ok;
    struct thread_group *g;
} thread_job;

/* The threads of one measurement start together and free their rings only
 * after every thread has stopped its clock, so no thread's cleanup is timed
 * by another. */
typedef struct thread_group {
    _Atomic int ready;
    _Atomic int go; /* 1: start; -1: abort (a thread could not be created) */
    _Atomic int done;
    _Atomic int release;
} thread_group;

static void wait_flag(_Atomic int *flag)
{
    while (!atomic_load(flag))
        sched_yield();
}

static void *thread_main(void *arg)
{
    thread_job *j = arg;
    thread_group *g = j->g;
    sample warm;
    j->ok = work_fill(&j->k, j->w) && work_time(&j->k, j->w, warm_pairs(&j->k), j->budget_ns, &warm);
    atomic_fetch_add(&g->ready, 1);
    wait_flag(&g->go);
    if (j->ok && atomic_load(&g->go) > 0) {
        j->t_start = tool_now_ns();
        j->ok = work_time(&j->k, j->w, j->pairs, j->budget_ns, &j->smp);
        j->t_end = tool_now_ns();
    }
    atomic_fetch_add(&g->done, 1);
    wait_flag(&g->release);
    if (!work_drain(&j->k, j->w))
        j->ok = false;
    return NULL;
}

/* One measurement of T threads: total pairs per second and the mean of the
 * threads' own ns per pair. */
static int run_threads_once(bench *b, which w, int nthreads, double *rate, double *ns_per_thread,
                            uint64_t *pairs_total)
{
    thread_job jobs[4];
    thread_group g;
    int created = 0, rc = 0;
    atomic_init(&g.ready, 0);
    atomic_init(&g.go, 0);
    atomic_init(&g.done, 0);
    atomic_init(&g.release, 0);
    memset(jobs, 0, sizeof jobs);
    for (int t = 0; t < nthreads; t++) {
        thread_job *j = &jobs[t];
        /* Each thread starts at its own place in the sequence, so the
         * threads do not ask for the same sizes in lockstep. */
        ring_init(&j->k.r, b->ctx, b->dev, &b->small, BENCH_THREAD_LIVE,
                  (size_t)t * b->small.n / (size_t)nthreads);
        j->w = w;
        j->pairs = b->o.thread_pairs;
        j->budget_ns = b->o.budget_ns;
        j->g = &g;
        int e = pthread_create(&j->tid, NULL, thread_main, j);
        if (e != 0) {
            fprintf(stderr, "unimem " BENCH_CMD ": cannot create thread %d of %d: %s\n", t + 1,
                    nthreads, strerror(e));
            rc = 1;
            break;
        }
        created++;
    }
    while (atomic_load(&g.ready) < created)
        sched_yield();
    atomic_store(&g.go, rc ? -1 : 1);
    while (atomic_load(&g.done) < created)
        sched_yield();
    atomic_store(&g.release, 1);
    for (int t = 0; t < created; t++)
        pthread_join(jobs[t].tid, NULL);
    if (rc)
        return rc;
    uint64_t t0 = UINT64_MAX, t1 = 0, total = 0;
    double sum_ns = 0;
    for (int t = 0; t < nthreads; t++) {
        thread_job *j = &jobs[t];
        if (!j->ok) {
            char name[48];
            snprintf(name, sizeof name, "threads (thread %d of %d)", t + 1, nthreads);
            return ring_fail(b, &j->k.r, w, name);
        }
        t0 = j->t_start < t0 ? j->t_start : t0;
        t1 = j->t_end > t1 ? j->t_end : t1;
        total += j->smp.pairs;
        sum_ns += (double)j->smp.ns / (double)j->smp.pairs;
    }
    *pairs_total = total;
    *rate = (double)total * 1e9 / (double)(t1 > t0 ? t1 - t0 : 1);
    *ns_per_thread = sum_ns / nthreads;
    return 0;
}

/* Median (by throughput) of three measurements of T threads. */
static int measure_threads(bench *b, which w, int nthreads, double *rate, double *ns,
                           uint64_t *pairs)
{
    double rates[BENCH_REPEATS], nss[BENCH_REPEATS];
    uint64_t prs[BENCH_REPEATS];
    for (int i = 0; i < BENCH_REPEATS; i++) {
        int rc = run_threads_once(b, w, nthreads, &rates[i], &nss[i], &prs[i]);
        if (rc)
            return rc;
    }
    double sorted[BENCH_REPEATS];
    memcpy(sorted, rates, sizeof rates);
    qsort(sorted, BENCH_REPEATS, sizeof sorted[0], cmp_double);
    for (int i = 0; i < BENCH_REPEATS; i++) {
        if (rates[i] == sorted[BENCH_REPEATS / 2]) {
            *rate = rates[i];
            *ns = nss[i];
            *pairs = prs[i];
        }
    }
    return 0;
}

/* --------------------------------------------------------------- output */

static void print_header(const bench *b)
{
    char cap[32], lim[32];
    printf("unimem bench alloc: alloc+free pairs, unimem vs glibc malloc in the same run\n");
    printf("device %d: %s (%s, %s, limit %s), allocator %s; %ld online CPUs\n", b->dev,
           b->info.name,
           b->info.kind == UM_DEVICE_HOST  ? "host"
           : b->info.kind == UM_DEVICE_SIM ? "sim"
                                           : "cuda",
           tool_bytes(cap, b->info.capacity), tool_bytes(lim, b->info.memory_limit),
           b->info.allocator ? b->info.allocator : "?", b->cpus);
    printf("sizes: %s, %zu allocations (%zu of them <= 32 KiB: the 'small' sequence, the "
           "other %zu 'large')\n",
           b->trace_path, b->all.n, b->small.n, b->large.n);
    printf("memory is never touched: device memory is not host-readable in general, so neither\n"
           "allocator's blocks are read or written; the times are allocator bookkeeping only.\n");
    printf("each figure is the median of %d runs of up to %llu pairs (%.2f s at most); in a ring\n"
           "a pair is one free of the oldest live block + one allocation of the next size; in\n"
           "trace-pattern, one allocation of the trace and its free, in the trace's order (%zu\n"
           "pairs a pass, whole passes), with 'live' more blocks live underneath; um_calls is\n"
           "unimem's backend calls (page maps, unmaps, ...) per timed pair. In threads each\n"
           "thread times up to %llu pairs: pairs is the threads' sum, *_ns a thread's ns per\n"
           "pair (the threads' mean), Mp/s all threads together.\n\n",
           BENCH_REPEATS, (unsigned long long)b->o.pairs, (double)b->o.budget_ns / 1e9,
           b->ops.allocs, (unsigned long long)b->o.thread_pairs);
    printf("%-12s %6s %7s %9s %9s %9s %7s %11s %11s %8s %8s %8s\n", "scenario", "live", "threads",
           "pairs", "unimem_ns", "malloc_ns", "ratio", "unimem_Mp/s", "malloc_Mp/s", "um_scale",
           "mc_scale", "um_calls");
}

static void print_row(const bench *b, const row *r)
{
    tool_progress_clear();
    if (b->o.json) {
        printf("{\"scenario\":\"%s\",\"live_blocks\":%zu,\"threads\":%d,\"device\":\"%s\","
               "\"allocator\":\"%s\",\"online_cpus\":%ld,\"touches_memory\":false,",
               r->scenario, r->live, r->threads, b->info.name,
               b->info.allocator ? b->info.allocator : "", b->cpus);
        if (r->skipped) {
            printf("\"skipped\":\"%s\",\"unimem_ns_per_pair\":null,\"malloc_ns_per_pair\":null,"
                   "\"ratio\":null,\"unimem_pairs_per_s\":null,\"malloc_pairs_per_s\":null}\n",
                   r->skip_reason);
        } else {
            printf("\"unimem_pairs\":%llu,\"malloc_pairs\":%llu,\"unimem_ns_per_pair\":%.2f,"
                   "\"malloc_ns_per_pair\":%.2f,\"ratio\":%.4f,\"unimem_pairs_per_s\":%.0f,"
                   "\"malloc_pairs_per_s\":%.0f",
                   (unsigned long long)r->um_pairs, (unsigned long long)r->mc_pairs, r->um_ns,
                   r->mc_ns, r->um_ns / r->mc_ns, r->um_rate, r->mc_rate);
            if (r->um_scaling > 0)
                printf(",\"unimem_scaling\":%.3f,\"malloc_scaling\":%.3f", r->um_scaling,
                       r->mc_scaling);
            if (r->um_calls >= 0)
                printf(",\"unimem_backend_calls_per_pair\":%.4f", r->um_calls);
            printf("}\n");
        }
    } else if (r->skipped) {
        printf("%-12s %6zu %7d  skipped: %s\n", r->scenario, r->live, r->threads, r->skip_reason);
    } else {
        char um_scale[16] = "-", mc_scale[16] = "-", calls[16] = "-";
        if (r->um_scaling > 0) {
            snprintf(um_scale, sizeof um_scale, "%.2fx", r->um_scaling);
            snprintf(mc_scale, sizeof mc_scale, "%.2fx", r->mc_scaling);
        }
        if (r->um_calls >= 0)
            snprintf(calls, sizeof calls, "%.3f", r->um_calls);
        uint64_t pairs = r->um_pairs < r->mc_pairs ? r->um_pairs : r->mc_pairs;
        printf("%-12s %6zu %7d %9llu %9.1f %9.1f %7.3f %11.2f %11.2f %8s %8s %8s\n", r->scenario,
               r->live, r->threads, (unsigned long long)pairs, r->um_ns, r->mc_ns,
               r->um_ns / r->mc_ns, r->um_rate / 1e6, r->mc_rate / 1e6, um_scale, mc_scale, calls);
    }
    fflush(stdout);
}

/* ------------------------------------------------------------ scenarios */

/* The bytes of the first `live` sizes of the cycled sequence. */
static uint64_t prefix_bytes(const size_seq *s, size_t live)
{
    uint64_t total = 0, head = 0;
    for (size_t i = 0; i < s->n; i++) {
        total += s->v[i];
        if (i < live % s->n)
            head += s->v[i];
    }
    return (uint64_t)(live / s->n) * total + head;
}

/* One ring scenario, or (ops set) the trace's pattern over `live` blocks. */
static int run_scenario(bench *b, const char *scenario, const size_seq *s, const op_seq *ops,
                        size_t live)
{
    row r;
    memset(&r, 0, sizeof r);
    r.scenario = scenario;
    r.live = live;
    r.threads = 1;
    /* The pattern's blocks add the trace's peak to the ones underneath;
     * a sixteenth more leaves room for the pool's own rounding. */
    uint64_t need = ops ? prefix_bytes(s, live) + ops->peak : max_window_bytes(s, live);
    need += ops ? need / 16 : 0;
    if (need > b->info.memory_limit) {
        char nb[32], lb[32];
        r.skipped = true;
        snprintf(r.skip_reason, sizeof r.skip_reason,
                 "the %s holds up to %s live, more than the device limit of %s "
                 "(use a larger --device)",
                 ops ? "scenario" : "ring", tool_bytes(nb, need),
                 tool_bytes(lb, b->info.memory_limit));
        print_row(b, &r);
        return 0;
    }
    workload k = {.ops = ops};
    ring_init(&k.r, b->ctx, b->dev, s, live, 0);
    int rc = measure(b, &k, WHICH_UNIMEM, scenario, &r.um_ns, &r.um_pairs, &r.um_calls);
    ring_init(&k.r, b->ctx, b->dev, s, live, 0);
    if (!rc)
        rc = measure(b, &k, WHICH_MALLOC, scenario, &r.mc_ns, &r.mc_pairs, NULL);
    if (rc)
        return rc;
    r.um_rate = 1e9 / r.um_ns;
    r.mc_rate = 1e9 / r.mc_ns;
    print_row(b, &r);
    return 0;
}

static int run_thread_scenarios(bench *b)
{
    static const int counts[] = {1, 2, 4};
    double um_base = 0, mc_base = 0;
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        row r;
        memset(&r, 0, sizeof r);
        r.scenario = "threads";
        r.live = BENCH_THREAD_LIVE;
        r.um_calls = -1.0;
        r.threads = counts[i];
        int rc = measure_threads(b, WHICH_UNIMEM, counts[i], &r.um_rate, &r.um_ns, &r.um_pairs);
        if (!rc)
            rc = measure_threads(b, WHICH_MALLOC, counts[i], &r.mc_rate, &r.mc_ns, &r.mc_pairs);
        if (rc)
            return rc;
        if (counts[i] == 1) {
            um_base = r.um_rate;
            mc_base = r.mc_rate;
        }
        r.um_scaling = r.um_rate / um_base;
        r.mc_scaling = r.mc_rate / mc_base;
        print_row(b, &r);
    }
    return 0;
}

/* ------------------------------------------------------------- record */

/* Rounds of the record scenario, and pairs a round at most (the trace
 * holds two events a pair: 30 rounds of 20,000 pairs make about 300 MB of
 * JSON). */
#define RECORD_ROUNDS 30
#define RECORD_QUICK_ROUNDS 10
#define RECORD_PAIRS 20000

/* The record scenario: b's context and a second one recording a trace
 * take turns on the same ring (the order alternating by round), so both
 * figures of a round meet the same host speed. A round's cost per event
 * is half the difference of its two pairs (a pair records two events). */
static int run_record(bench *b)
{
    const char *dir = getenv("TMPDIR");
    dir = dir && *dir ? dir : "/tmp";
    static const char name[] = "/unimem-bench-record-XXXXXX.json";
    char path[PATH_MAX], conf[sizeof b->conf + 16 + PATH_MAX];
    size_t dl = strlen(dir);
    if (dl + sizeof name > sizeof path) {
        fprintf(stderr, "unimem " BENCH_CMD ": TMPDIR is too long for a file name\n");
        return 2;
    }
    memcpy(path, dir, dl);
    memcpy(path + dl, name, sizeof name);
    int fd = mkstemps(path, 5);
    if (fd < 0) {
        fprintf(stderr, "unimem " BENCH_CMD ": cannot make a trace file %s: %s\n", path,
                strerror(errno));
        return 1;
    }
    close(fd);
    snprintf(conf, sizeof conf, "%s,trace_file=%s", b->conf, path);
    um_context *rec = NULL;
    um_status st = um_init(conf, &rec);
    if (st != UM_OK) {
        unlink(path);
        return bench_fail(st);
    }
    size_t live = b->o.live ? b->o.live : 100;
    int rounds = b->o.quick ? RECORD_QUICK_ROUNDS : RECORD_ROUNDS;
    uint64_t pairs = b->o.pairs < RECORD_PAIRS ? b->o.pairs : RECORD_PAIRS;
    workload k[2]; /* 0 plain, 1 recording */
    memset(k, 0, sizeof k);
    ring_init(&k[0].r, b->ctx, b->dev, &b->small, live, 0);
    ring_init(&k[1].r, rec, b->dev, &b->small, live, 0);
    static const char *const names[2] = {"record (plain)", "record (recording)"};
    double ns[2][RECORD_ROUNDS], per_event[RECORD_ROUNDS], ratio[RECORD_ROUNDS];
    int rc = 0;
    sample smp;
    /* The time budget may stop a measurement before `pairs`: the figure
     * reported is the fewest pairs a measurement of the rounds timed. */
    uint64_t timed = pairs;
    for (int w = 0; w < 2 && !rc; w++)
        if (!work_fill(&k[w], WHICH_UNIMEM) ||
            !work_time(&k[w], WHICH_UNIMEM, warm_pairs(&k[w]), b->o.budget_ns, &smp))
            rc = ring_fail(b, &k[w].r, WHICH_UNIMEM, names[w]);
    for (int r = 0; r < rounds && !rc; r++) {
        tool_progress("record, in turns", (double)r / (double)rounds);
        for (int i = 0; i < 2 && !rc; i++) {
            int w = (r & 1) ? 1 - i : i;
            if (!work_time(&k[w], WHICH_UNIMEM, pairs, b->o.budget_ns, &smp))
                rc = ring_fail(b, &k[w].r, WHICH_UNIMEM, names[w]);
            else
                ns[w][r] = (double)smp.ns / (double)smp.pairs;
            if (!rc && smp.pairs < timed)
                timed = smp.pairs;
        }
        if (!rc) {
            per_event[r] = (ns[1][r] - ns[0][r]) / 2.0;
            ratio[r] = ns[1][r] / ns[0][r];
        }
    }
    tool_progress_clear();
    for (int w = 0; w < 2; w++)
        if (!work_drain(&k[w], WHICH_UNIMEM) && !rc)
            rc = ring_fail(b, &k[w].r, WHICH_UNIMEM, names[w]);
    um_shutdown(rec); /* writes the trace */
    struct stat sb;
    long long trace_bytes = stat(path, &sb) == 0 ? (long long)sb.st_size : -1;
    unlink(path);
    if (rc)
        return rc;
    double low = per_event[0], high = per_event[0];
    for (int r = 1; r < rounds; r++) {
        low = per_event[r] < low ? per_event[r] : low;
        high = per_event[r] > high ? per_event[r] : high;
    }
    /* The rounds' count is even (30, or 10 with --quick): each median is
     * the mean of the two middle rounds. */
    size_t nr = (size_t)rounds;
    double plain = tool_median(ns[0], nr), recording = tool_median(ns[1], nr);
    double event = tool_median(per_event, nr), pair_ratio = tool_median(ratio, nr);
    /* The recorder's writer thread sorts and writes the records while the
     * timed thread goes on; confined to one CPU with it (taskset -c N), the
     * timed thread also pays the writer's time. */
    cpu_set_t cpus;
    int ncpus = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
    if (b->o.json) {
        /* "device" names the device, as the other scenarios' rows do. */
        printf("{\"scenario\":\"record\",\"live_blocks\":%zu,\"threads\":1,\"device\":\"%s\","
               "\"rounds\":%d,\"pairs_per_round\":%llu,\"plain_ns\":%.2f,"
               "\"recording_ns\":%.2f,\"ns_per_event\":%.2f,\"ns_per_event_low\":%.2f,"
               "\"ns_per_event_high\":%.2f,\"ratio\":%.4f,\"trace_bytes\":%lld,\"cpus\":%d}\n",
               live, b->info.name, rounds, (unsigned long long)timed, plain, recording, event,
               low, high, pair_ratio, trace_bytes, ncpus);
    } else {
        char tb[32];
        printf("unimem bench alloc: record: device %d (%s), the small sizes' ring of %zu blocks "
               "in two contexts, one recording (trace_file), %d rounds of %llu pairs each, in "
               "turns%s\n",
               b->dev, b->info.name, live, rounds, (unsigned long long)timed,
               timed < pairs ? " (at the fewest: the time budget cut measurements short)" : "");
        printf("pair, median of the rounds: %.1f ns plain, %.1f ns recording (ratio %.2f)\n",
               plain, recording, pair_ratio);
        printf("a recorded event (half a round's difference): %.1f ns, median of the rounds "
               "(%.1f to %.1f); trace of %s written\n",
               event, low, high, trace_bytes >= 0 ? tool_bytes(tb, (uint64_t)trace_bytes) : "?");
        if (ncpus == 1)
            printf("(one CPU allowed: the trace's writer thread ran on the timed thread's CPU, "
                   "so the figure includes its time; allow two to time the recording alone)\n");
    }
    return 0;
}

static int bench_run(bench *b)
{
    static const size_t lives[] = {10, 100, 1000, 10000};
    int rc;
    bool host = !strcmp(b->o.device, "host");
    int n = snprintf(b->conf, sizeof b->conf, "devices=%s%s%s", host ? "" : b->o.device,
                     b->o.allocator ? ",allocator=" : "", b->o.allocator ? b->o.allocator : "");
    if (n < 0 || (size_t)n >= sizeof b->conf) {
        fprintf(stderr, "unimem " BENCH_CMD ": --device/--allocator values are too long\n");
        return 2;
    }
    um_status s = um_init(b->conf, &b->ctx);
    if (s != UM_OK) {
        fflush(stdout);
        return tool_init_fail(BENCH_CMD, s);
    }
    b->dev = host ? 0 : 1;
    if (um_device_count(b->ctx) <= b->dev) {
        fprintf(stderr, "unimem " BENCH_CMD ": --device %s gives no accelerator (device 1)\n",
                b->o.device);
        return TOOL_EXIT_USAGE;
    }
    s = um_device_info_get(b->ctx, b->dev, &b->info);
    if (s != UM_OK)
        return bench_fail(s);
    if (b->o.scenario && !strcmp(b->o.scenario, "record"))
        return run_record(b);
    if (!b->o.json)
        print_header(b);
    const struct {
        const char *name;
        const size_seq *sizes;
        const op_seq *ops;
    } scenarios[] = {{"trace-sizes", &b->all, NULL},
                     {"small", &b->small, NULL},
                     {"large", &b->large, NULL},
                     {"trace-pattern", &b->all, &b->ops}};
    bool threads = !b->o.scenario || !strcmp(b->o.scenario, "threads");
    /* Progress: the measurements done (a scenario at one ring size, or
     * the threads) of all that were asked for. */
    int done = 0, total = threads;
    for (int count = 1; count >= 0; count--) {
        for (size_t k = 0; k < sizeof scenarios / sizeof scenarios[0]; k++) {
            if (b->o.scenario && strcmp(b->o.scenario, scenarios[k].name))
                continue;
            for (size_t i = 0; i < sizeof lives / sizeof lives[0]; i++) {
                if (b->o.live && b->o.live != lives[i])
                    continue;
                if (count) {
                    total++;
                    continue;
                }
                char what[48];
                snprintf(what, sizeof what, "%s, %zu live", scenarios[k].name, lives[i]);
                tool_progress(what, (double)done++ / (double)total);
                if ((rc = run_scenario(b, scenarios[k].name, scenarios[k].sizes,
                                       scenarios[k].ops, lives[i])) != 0)
                    return rc;
            }
        }
    }
    if (!threads)
        return 0;
    tool_progress("1, 2 and 4 threads", (double)done / (double)total);
    rc = run_thread_scenarios(b);
    tool_progress_clear();
    return rc;
}

int um_cmd_bench(int argc, char **argv)
{
    bench b;
    memset(&b, 0, sizeof b);
    int rc = bench_parse_args(argc, argv, &b.o);
    if (rc >= 0)
        return rc;
    b.cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (b.o.trace) {
        if (strlen(b.o.trace) >= sizeof b.trace_path) {
            fprintf(stderr, "unimem " BENCH_CMD ": --trace path is too long\n");
            return 2;
        }
        memcpy(b.trace_path, b.o.trace, strlen(b.o.trace) + 1);
    } else if (!find_default_trace(b.trace_path, sizeof b.trace_path)) {
        return 1;
    }
    rc = load_sizes(&b);
    if (!rc)
        rc = bench_run(&b);
    if (!rc && b.ctx && !b.o.json) {
        printf("\nunimem at the end (um_stats_print):\n");
        um_stats_print(b.ctx, stdout);
    }
    if (b.ctx)
        um_shutdown(b.ctx);
    free(b.all.v);
    free(b.small.v);
    free(b.large.v);
    free(b.ops.v);
    return rc;
}
