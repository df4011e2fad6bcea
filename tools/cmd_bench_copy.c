/*
 * `unimem bench copy`: how fast unified buffers move data between the host
 * and a device, next to plain copies measured in the same run:
 *
 *   pinned    a buffer's host replica (pinned host-pool memory) to or from
 *             its device replica, made by acquiring the buffer there;
 *             baseline: um_memcpy between raw pinned host-pool memory and
 *             device memory (cuMemcpyAsync on pinned memory on a GPU);
 *   pageable  um_buffer_write / um_buffer_read between the device replica
 *             and the program's malloc'd memory (staged through pinned
 *             buffers on a GPU); baselines: the same pinned copy, and
 *             um_memcpy straight from or to the malloc'd memory;
 *   device    with two devices or more: a buffer replica from device 1
 *             to device 2; baseline: um_memcpy between raw blocks of the
 *             two (cuMemcpyAsync, peer to peer where the driver allows);
 *   acquire   the cost of acquiring a buffer already valid on the device
 *             (and of releasing it), averaged over many buffers.
 *
 * Every figure is the median of the repeats. Owns nothing outside the
 * command; uses only include/unimem.h.
 */
#include "tool.h"

#include <stdlib.h>
#include <string.h>

#define COPY_CMD "bench copy"
#define ACQUIRE_BUFFERS 1000

typedef struct copy_opts {
    bool json, quick;
    const char *device;
    int repeats;
} copy_opts;

typedef struct copy_bench {
    copy_opts o;
    um_context *ctx;
    int dev;
    bool gpu;
    /* Progress: timed figures done of all, and what is being timed. */
    int done, total;
    char what[48];
} copy_bench;

static void copy_usage(FILE *f)
{
    fprintf(f,
            "usage: unimem bench copy [--json] [--quick] [--device SPEC] [--repeats N]\n"
            "\n"
            "Times host<->device copies of unified buffers (pinned host replicas, and the\n"
            "program's pageable memory through um_buffer_read/write) against plain copies\n"
            "in the same run, with two devices or more in SPEC copies from device 1 to\n"
            "device 2 too, and the cost of acquiring a buffer that is already valid.\n"
            "\n"
            "  --json        one JSON object per row instead of the table\n"
            "  --quick       sizes up to 256 MiB only\n"
            "  --device SPEC the devices option (default cuda:0; sim:8G where there is no GPU)\n"
            "  --repeats N   timed copies per figure (default 5; the median is shown)\n");
}

/* The median of n timings; an even --repeats gives the mean of the two
 * middle ones (tool_median). */
static double median(const uint64_t *v, int n)
{
    double d[64];
    for (int i = 0; i < n; i++)
        d[i] = (double)v[i];
    return tool_median(d, (size_t)n);
}

static double gbps(size_t bytes, double ns)
{
    return ns > 0 ? (double)bytes / ns : 0.0;
}

/* One timed step of a copy kind; returns a status. */
typedef um_status (*copy_step)(copy_bench *cb, void *arg, uint64_t *ns);

typedef struct buffer_case {
    um_buffer *b;
    size_t n;
    void *user;    /* the program's memory (pageable) */
    bool to_device;
} buffer_case;

/* pinned: the buffer's own replicas. The other side is made invalid first
 * (acquiring for write where the data is, which copies nothing). */
static um_status step_replica(copy_bench *cb, void *arg, uint64_t *ns)
{
    buffer_case *c = arg;
    int from = c->to_device ? 0 : cb->dev, to = c->to_device ? cb->dev : 0;
    void *p;
    um_status st = um_buffer_acquire(c->b, from, UM_ACCESS_WRITE, NULL, &p);
    if (st == UM_OK)
        st = um_buffer_release(c->b, from, NULL);
    if (st == UM_OK)
        st = um_stream_synchronize(cb->ctx, NULL);
    uint64_t t0 = tool_now_ns();
    if (st == UM_OK)
        st = um_buffer_acquire(c->b, to, UM_ACCESS_READ, NULL, &p);
    if (st == UM_OK)
        st = um_stream_synchronize(cb->ctx, NULL);
    *ns = tool_now_ns() - t0;
    if (st == UM_OK)
        st = um_buffer_release(c->b, to, NULL);
    return st;
}

/* pageable: the program's memory to or from the device replica (the
 * buffer's owner). */
static um_status step_user(copy_bench *cb, void *arg, uint64_t *ns)
{
    buffer_case *c = arg;
    (void)cb;
    uint64_t t0 = tool_now_ns();
    um_status st = c->to_device ? um_buffer_write(c->b, 0, c->user, c->n)
                                : um_buffer_read(c->b, 0, c->user, c->n);
    *ns = tool_now_ns() - t0;
    return st;
}

typedef struct raw_case {
    void *dst;
    const void *src;
    size_t n;
} raw_case;

static um_status step_raw(copy_bench *cb, void *arg, uint64_t *ns)
{
    raw_case *c = arg;
    uint64_t t0 = tool_now_ns();
    um_status st = um_memcpy(cb->ctx, c->dst, c->src, c->n);
    *ns = tool_now_ns() - t0;
    return st;
}

/* Median ns of the repeats (one untimed warm-up first). */
static void step_progress(copy_bench *cb)
{
    tool_progress(cb->what, (double)cb->done / (double)cb->total);
}

static um_status time_steps(copy_bench *cb, copy_step f, void *arg, double *out)
{
    uint64_t v[64];
    int n = cb->o.repeats;
    uint64_t ns;
    step_progress(cb);
    um_status st = f(cb, arg, &ns);
    for (int i = 0; i < n && st == UM_OK; i++)
        st = f(cb, arg, &v[i]);
    if (st == UM_OK)
        *out = median(v, n);
    cb->done++;
    return st;
}

/* One row: a line of the table, or a JSON object with --json. pageable is
 * NULL where the row measures no pageable copy (pinned and device rows):
 * the table shows "-" and the JSON null, not 0.000, which would read as a
 * measured rate. */
static void print_row(copy_bench *cb, const char *dir, const char *mem, size_t n, double um,
                      double base, const double *pageable)
{
    char b[32];
    tool_progress_clear();
    if (cb->o.json) {
        printf("{\"direction\":\"%s\",\"memory\":\"%s\",\"bytes\":%zu,\"unimem_gbps\":%.3f,"
               "\"baseline_gbps\":%.3f,\"pageable_gbps\":",
               dir, mem, n, um, base);
        if (pageable)
            printf("%.3f", *pageable);
        else
            fputs("null", stdout);
        printf(",\"ratio\":%.4f}\n", base > 0 ? um / base : 0.0);
        return;
    }
    char pg[32] = "-";
    if (pageable)
        snprintf(pg, sizeof pg, "%.2f", *pageable);
    printf("%-6s %-9s %10s %12.2f %13.2f %14s %8.3f\n", dir, mem, tool_bytes(b, n), um, base, pg,
           base > 0 ? um / base : 0.0);
}

/* A buffer replica from device 1 to device 2 (peer access, or two hops
 * through pinned host memory), against um_memcpy between raw blocks of
 * the two devices (cuMemcpyAsync). */
typedef struct d2d_case {
    um_buffer *b;
} d2d_case;

static um_status step_d2d(copy_bench *cb, void *arg, uint64_t *ns)
{
    d2d_case *c = arg;
    void *p;
    um_status st = um_buffer_acquire(c->b, 1, UM_ACCESS_WRITE, NULL, &p);
    if (st == UM_OK)
        st = um_buffer_release(c->b, 1, NULL);
    if (st == UM_OK)
        st = um_stream_synchronize(cb->ctx, NULL);
    uint64_t t0 = tool_now_ns();
    if (st == UM_OK)
        st = um_buffer_acquire(c->b, 2, UM_ACCESS_READ, NULL, &p);
    if (st == UM_OK)
        st = um_stream_synchronize(cb->ctx, NULL);
    *ns = tool_now_ns() - t0;
    if (st == UM_OK)
        st = um_buffer_release(c->b, 2, NULL);
    return st;
}

static um_status bench_device_to_device(copy_bench *cb, um_buffer *b, size_t n)
{
    void *a = NULL, *z = NULL;
    um_status st = um_malloc(cb->ctx, 1, n, NULL, &a);
    if (st == UM_OK)
        st = um_malloc(cb->ctx, 2, n, NULL, &z);
    raw_case raw = {z, a, n};
    d2d_case dc = {b};
    double t_um = 0, t_base = 0;
    if (st == UM_OK)
        st = time_steps(cb, step_raw, &raw, &t_base);
    if (st == UM_OK)
        st = time_steps(cb, step_d2d, &dc, &t_um);
    if (st == UM_OK)
        print_row(cb, "d2d", "device", n, gbps(n, t_um), gbps(n, t_base), NULL);
    if (a)
        (void)um_free(cb->ctx, a, NULL);
    if (z)
        (void)um_free(cb->ctx, z, NULL);
    return st;
}

/* Every row of one size. */
static um_status bench_size(copy_bench *cb, size_t n)
{
    um_context *ctx = cb->ctx;
    um_buffer *b = NULL;
    void *dev_raw = NULL, *host_raw = NULL;
    unsigned char *user = malloc(n);
    if (!user) {
        tool_progress_clear();
        fprintf(stderr, "unimem " COPY_CMD ": no host memory for %zu bytes\n", n);
        return UM_ERR_NOMEM;
    }
    memset(user, 0x5a, n); /* touched: no page faults in the timed copies */
    char nb[32];
    snprintf(cb->what, sizeof cb->what, "copies of %s", tool_bytes(nb, n));
    um_status st = um_buffer_create(ctx, n, NULL, &b);
    if (st == UM_OK)
        st = um_buffer_write(b, 0, user, n);
    if (st == UM_OK)
        st = um_malloc(ctx, cb->dev, n, NULL, &dev_raw);
    if (st == UM_OK)
        st = um_malloc(ctx, 0, n, NULL, &host_raw);
    for (int to_device = 1; to_device >= 0 && st == UM_OK; to_device--) {
        const char *dir = to_device ? "h2d" : "d2h";
        raw_case pinned = {to_device ? dev_raw : host_raw, to_device ? host_raw : dev_raw, n};
        raw_case plain = {to_device ? dev_raw : (void *)user, to_device ? (void *)user : dev_raw,
                          n};
        buffer_case bc = {b, n, user, to_device};
        double t_um = 0, t_base = 0, t_user = 0, t_plain = 0;
        st = time_steps(cb, step_raw, &pinned, &t_base);
        if (st == UM_OK)
            st = time_steps(cb, step_replica, &bc, &t_um);
        if (st == UM_OK)
            print_row(cb, dir, "pinned", n, gbps(n, t_um), gbps(n, t_base), NULL);
        /* pageable: the device replica is the owner. */
        void *p;
        if (st == UM_OK)
            st = um_buffer_acquire(b, cb->dev, UM_ACCESS_WRITE, NULL, &p);
        if (st == UM_OK)
            st = um_buffer_release(b, cb->dev, NULL);
        if (st == UM_OK)
            st = time_steps(cb, step_user, &bc, &t_user);
        if (st == UM_OK)
            st = time_steps(cb, step_raw, &plain, &t_plain);
        if (st == UM_OK) {
            double pageable = gbps(n, t_plain);
            print_row(cb, dir, "pageable", n, gbps(n, t_user), gbps(n, t_base), &pageable);
        }
    }
    if (st == UM_OK && um_device_count(ctx) > 2)
        st = bench_device_to_device(cb, b, n);
    if (b)
        (void)um_buffer_destroy(b);
    if (dev_raw)
        (void)um_free(ctx, dev_raw, NULL);
    if (host_raw)
        (void)um_free(ctx, host_raw, NULL);
    free(user);
    return st;
}

/* Acquire and release costs for buffers already valid on dev. */
static um_status bench_acquire(copy_bench *cb, int dev)
{
    um_buffer *b[ACQUIRE_BUFFERS] = {0};
    um_status st = UM_OK;
    uint64_t acq[64], rel[64];
    snprintf(cb->what, sizeof cb->what, "acquires on device %d", dev);
    step_progress(cb);
    for (int i = 0; i < ACQUIRE_BUFFERS && st == UM_OK; i++)
        st = um_buffer_create(cb->ctx, 4096, &(um_buffer_opts){.device = dev}, &b[i]);
    for (int r = 0; r <= cb->o.repeats && st == UM_OK; r++) {
        void *p;
        uint64_t t0 = tool_now_ns();
        for (int i = 0; i < ACQUIRE_BUFFERS && st == UM_OK; i++)
            st = um_buffer_acquire(b[i], dev, UM_ACCESS_READ, NULL, &p);
        uint64_t t1 = tool_now_ns();
        for (int i = 0; i < ACQUIRE_BUFFERS && st == UM_OK; i++)
            st = um_buffer_release(b[i], dev, NULL);
        uint64_t t2 = tool_now_ns();
        if (r > 0) { /* the first round warms up */
            acq[r - 1] = t1 - t0;
            rel[r - 1] = t2 - t1;
        }
    }
    cb->done++;
    tool_progress_clear();
    if (st == UM_OK) {
        double a = median(acq, cb->o.repeats) / ACQUIRE_BUFFERS;
        double r = median(rel, cb->o.repeats) / ACQUIRE_BUFFERS;
        if (cb->o.json)
            printf("{\"scenario\":\"acquire-valid\",\"device\":%d,\"acquire_ns\":%.1f,"
                   "\"release_ns\":%.1f}\n", dev, a, r);
        else
            printf("acquire of a buffer valid on device %d: %.1f ns; release: %.1f ns\n", dev,
                   a, r);
    }
    for (int i = 0; i < ACQUIRE_BUFFERS; i++)
        if (b[i])
            (void)um_buffer_destroy(b[i]);
    return st;
}

static int parse(int argc, char **argv, copy_opts *o)
{
    memset(o, 0, sizeof *o);
    o->repeats = 5;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) {
            o->json = true;
        } else if (!strcmp(a, "--quick")) {
            o->quick = true;
        } else if (!strcmp(a, "--device") && i + 1 < argc) {
            o->device = argv[++i];
            if (!tool_device_arg_ok(COPY_CMD, o->device))
                return TOOL_EXIT_USAGE;
        } else if (!strcmp(a, "--repeats") && i + 1 < argc) {
            long v;
            if (!tool_parse_long(argv[++i], 1, 63, &v)) {
                fprintf(stderr, "unimem " COPY_CMD ": --repeats takes 1..63, not '%s'\n",
                        argv[i]);
                return 2;
            }
            o->repeats = (int)v;
        } else {
            return tool_other_arg(COPY_CMD, a, copy_usage);
        }
    }
    return -1;
}

int um_cmd_bench_copy(int argc, char **argv)
{
    copy_bench cb;
    memset(&cb, 0, sizeof cb);
    int rc = parse(argc, argv, &cb.o);
    if (rc >= 0)
        return rc;
    const char *device = cb.o.device;
    if (!device) {
        int version = 0, gpus = 0;
        char why[160];
        device = um_cuda_driver_info(&version, &gpus, why, sizeof why) == UM_OK && gpus > 0
                     ? "cuda:0"
                     : "sim:8G";
        if (!cb.o.json && strcmp(device, "sim:8G") == 0)
            printf("no GPU (%s): timing a sim device, whose copies are memory copies\n",
                   why[0] ? why : "none found");
    }
    char conf[512];
    if ((size_t)snprintf(conf, sizeof conf, "devices=%s", device) >= sizeof conf) {
        fprintf(stderr, "unimem " COPY_CMD ": --device is too long\n");
        return TOOL_EXIT_USAGE;
    }
    um_status st = um_init(conf, &cb.ctx);
    if (st != UM_OK)
        return tool_init_fail(COPY_CMD, st);
    cb.dev = 1;
    if (um_device_count(cb.ctx) < 2) {
        fprintf(stderr, "unimem " COPY_CMD ": --device %s gives no accelerator (device 1)\n",
                device);
        um_shutdown(cb.ctx);
        return TOOL_EXIT_USAGE;
    }
    um_device_info info, host;
    (void)um_device_info_get(cb.ctx, cb.dev, &info);
    (void)um_device_info_get(cb.ctx, 0, &host);
    if (!cb.o.json) {
        printf("unimem bench copy: device %d (%s%s%s), host memory %s; GB/s, median of %d\n",
               cb.dev, info.name, info.product[0] ? ", " : "", info.product,
               host.pinned ? "pinned" : "pageable", cb.o.repeats);
        printf("%-6s %-9s %10s %12s %13s %14s %8s\n", "dir", "memory", "size", "unimem_GB/s",
               "pinned_GB/s", "pageable_GB/s", "ratio");
    }
    static const size_t sizes[] = {(size_t)1 << 20, (size_t)16 << 20, (size_t)256 << 20,
                                   (size_t)1 << 30};
    int nsizes = cb.o.quick ? 3 : 4;
    /* Four timed figures a direction and size, then two of acquires. */
    cb.total = nsizes * 8 + 2;
    for (int i = 0; i < nsizes && st == UM_OK; i++)
        st = bench_size(&cb, sizes[i]);
    if (st == UM_OK)
        st = bench_acquire(&cb, cb.dev);
    if (st == UM_OK)
        st = bench_acquire(&cb, 0);
    tool_progress_clear();
    rc = st == UM_OK ? 0 : tool_fail(COPY_CMD, st);
    if (!rc && !cb.o.json) {
        printf("\nunimem at the end (um_stats_print):\n");
        um_stats_print(cb.ctx, stdout);
    }
    um_shutdown(cb.ctx);
    return rc;
}
