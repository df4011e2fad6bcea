/*
 * `unimem demo gemm|cholesky`: tiled single-precision linear algebra run as
 * tasks (um_task_submit) over the host and every accelerator, each
 * accelerator's memory limited to a third of one matrix by default, so
 * that data moves between devices and is evicted while the scheduler
 * places the work:
 *
 *   gemm      C = A B: for every tile (i, j) and every k, a task
 *             C_ij += A_ik B_kj (the first k overwrites C_ij);
 *   cholesky  A = L L^T, lower and right-looking: for every k, POTRF of
 *             A_kk, TRSM of the tiles below it, SYRK of the diagonal
 *             tiles after it and GEMM of the tiles between.
 *
 * Every tile is one unified buffer holding a column-major tile x tile
 * matrix. Each task has an OpenBLAS implementation (the host and simulated
 * devices) and, but for POTRF, a cuBLAS one for GPUs (demo_blas.c). The
 * run prints its makespan, GFLOP/s and what each device did, and checks
 * the result against a reference. Uses include/unimem.h, and for the
 * tasks' priorities the simulator's graph of the same workload
 * (src/vsim/dag.h), so that `unimem sim` orders the tasks as this does.
 */
#include "base/options.h"
#include "demo_blas.h"
#include "demo_sample.h"
#include "tool.h"
#include "vsim/dag.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEMO_CMD "demo"
/* Up to this order the result is checked whole, against a reference the
 * host computes with OpenBLAS; above it at DEMO_SAMPLES random entries or
 * more, some in every tile (demo_sample.h), by dot products in double
 * precision. */
#define DEMO_FULL_CHECK_MAX 8192
#define DEMO_TOLERANCE 1e-3
#define DEMO_MAX_TILES 128 /* tiles per row and column (gemm makes this cubed tasks) */
#define DEMO_SIM_DEVICES "sim:3x1G"
/* Simulated devices compute on the host's CPUs, so a model slower than
 * those keeps the host's cores from being what every policy measures: 5
 * GFLOP/s and links of 1 GiB/s make them accelerators whose speed and
 * data placement matter, which the policies must learn or ignore. */
#define DEMO_SIM_GFLOPS 5
#define DEMO_SIM_BANDWIDTH "1G"
#define DEMO_FILL_THREADS 16

/* The seeds of the generated matrices. */
enum { MAT_A = 0, MAT_B = 1, MAT_SPD = 2 };
static const uint64_t demo_seed[] = {0x64656d6f2d412121ull, 0x64656d6f2d422121ull,
                                     0x64656d6f2d535044ull};

static const char *const demo_policies[] = {"eager", "round_robin", "locality", "cost"};
#define DEMO_NPOLICIES 4

typedef enum demo_workload { DEMO_GEMM = 0, DEMO_CHOLESKY = 1 } demo_workload;

/* What the command line asked for, with the defaults filled in, and what
 * every run of the command shares. */
typedef struct demo_cfg {
    demo_workload workload;
    const char *workload_name;
    int n, tile, nt;
    const char *device;
    size_t limit;         /* 0: the default */
    const char *sched;    /* a policy, or "all" */
    long sim_gflops;      /* < 0: not given */
    size_t sim_bandwidth; /* a sim device's modelled link, bytes/s; 0: not given */
    const char *timeline;
    bool json, quick, verify;
    bool gpu_only;  /* tasks with a GPU implementation run on GPUs only */
    bool gpu;       /* the driver reports GPUs */
    bool gpu_sizes; /* n or tile defaulted to the GPU sizes */
    /* Filled by the runs. */
    bool described;  /* the opening lines are out */
    bool cublas;     /* the GPU implementations are there */
    bool potrf_gpu;  /* cuSOLVER too: potrf has one */
    float *gemm_ref; /* the full reference C (n <= DEMO_FULL_CHECK_MAX) */
} demo_cfg;

/* Tasks done so far, counted by the done callbacks on the workers. */
typedef struct progress {
    atomic_uint_fast64_t done, failed;
    atomic_bool stop;
    uint64_t total;
    uint64_t start_ns;
} progress;

typedef struct dev_result {
    um_device_info info;
    size_t limit; /* the limit set on it; 0: none (the host) */
    um_task_stats tasks;
    um_stats mem;
    uint64_t evictions, written_back, written_back_bytes, bytes_in, bytes_out;
} dev_result;

typedef struct run_result {
    const char *sched;
    uint64_t tasks;
    double flops, makespan_s, gflops;
    bool checked, verified, sampled;
    double max_error;
    char mismatch[256];
    int ndev;
    dev_result *dev;
} run_result;

/* One run: a fresh context, the tiles, the ops the tasks point at. */
typedef struct demo_run {
    demo_cfg *c;
    um_context *ctx;
    int ndev;
    um_buffer **tiles; /* gemm: A, B, C, each nt x nt; cholesky: A (lower tiles only) */
    size_t ntiles;
    demo_op op_gemm_first, op_gemm_acc, op_chol_gemm, op_trsm, op_syrk, op_potrf;
    um_buffer *potrf_work; /* cuSOLVER's workspace for GPU potrf tasks (NULL: host only) */
    progress prog;
    int *priority; /* each task's, in submission order (vsim/dag.h) */
    size_t nsubmitted;
    bool submitted;
    bool reported; /* the failure has been described on stderr already */
} demo_run;

/* A host allocation failed: says so, and gives UM_ERR_NOMEM. */
static um_status host_nomem(demo_run *r, const char *what)
{
    fprintf(stderr, "unimem " DEMO_CMD ": out of host memory for %s\n", what);
    r->reported = true;
    return UM_ERR_NOMEM;
}

/* ------------------------------------------------------------ arguments */

static void demo_usage(FILE *f)
{
    fprintf(f,
            "usage: unimem demo gemm|cholesky [--n N] [--tile T] [--device SPEC]\n"
            "                   [--limit BYTES] [--sched POLICY] [--sim-gflops G]\n"
            "                   [--sim-bandwidth BYTES]\n"
            "                   [--timeline FILE] [--json] [--quick] [--no-verify] [--gpu-only]\n"
            "\n"
            "Tiled single-precision C = A B (gemm) or A = L L^T (cholesky) as tasks over the\n"
            "host and every accelerator, each tile one unified buffer; OpenBLAS on the host\n"
            "and simulated devices, cuBLAS (loaded at run time) on GPUs. Prints the makespan,\n"
            "GFLOP/s and each device's tasks, busy time, memory, evictions and copies, and\n"
            "checks the result.\n"
            "\n"
            "  --n N            matrix order, a multiple of the tile (default %d on GPUs,\n"
            "                   %d elsewhere; --quick: 1536)\n"
            "  --tile T         tile order (default %d on GPUs, %d elsewhere; --quick: 256)\n"
            "  --device SPEC    the devices option (default cuda where the driver reports\n"
            "                   GPUs, else %s: the host and 3 simulated devices)\n"
            "  --limit BYTES    memory limit of every accelerator, at most its memory (default\n"
            "                   a third of one matrix, at least 4 tiles, at most the memory)\n"
            "  --sched POLICY   eager, round_robin, locality, cost (default), or all: each\n"
            "                   in turn with a fresh context, then a table of makespans\n"
            "  --sim-gflops G   compute speed of simulated devices (option sim_gflops;\n"
            "                   default %d with sim devices; 0: as fast as the host computes)\n"
            "  --sim-bandwidth BYTES  a simulated device's link per second, each way\n"
            "                   (option sim_link_bandwidth; default %s with sim devices)\n"
            "  --timeline FILE  a Chrome trace of the run (option trace_file; with\n"
            "                   --sched all, FILE with .POLICY before its extension)\n"
            "  --json           one JSON object per run on stdout instead of the report\n"
            "  --quick          n 1536 and tile 256 (for CI)\n"
            "  --no-verify      do not check the result\n"
            "  --gpu-only       tasks run on the accelerators, not on the host, which\n"
            "                   still holds the data: on GPUs, every task that has a GPU\n"
            "                   implementation; on simulated devices, every task (option\n"
            "                   host_tasks=0)\n",
            32768, 3072, 4096, 512, DEMO_SIM_DEVICES, DEMO_SIM_GFLOPS, DEMO_SIM_BANDWIDTH);
}

static int arg_error(const char *option, const char *need, const char *got)
{
    fprintf(stderr, "unimem " DEMO_CMD ": %s takes %s, not '%s'\n", option, need, got);
    return 2;
}

/* Parses argv (argv[0] is "demo"); returns -1 to go on, else an exit code. */
static int demo_parse(int argc, char **argv, demo_cfg *c)
{
    memset(c, 0, sizeof *c);
    c->sched = "cost";
    c->sim_gflops = -1;
    c->verify = true;
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        demo_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "gemm")) {
        c->workload = DEMO_GEMM;
    } else if (!strcmp(argv[1], "cholesky")) {
        c->workload = DEMO_CHOLESKY;
    } else {
        fprintf(stderr,
                "unimem " DEMO_CMD ": expected the workload 'gemm' or 'cholesky', got '%s'\n\n",
                argv[1]);
        demo_usage(stderr);
        return 2;
    }
    c->workload_name = argv[1];
    long n = 0, tile = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        if (!strcmp(a, "--json")) {
            c->json = true;
        } else if (!strcmp(a, "--quick")) {
            c->quick = true;
        } else if (!strcmp(a, "--no-verify")) {
            c->verify = false;
        } else if (!strcmp(a, "--gpu-only")) {
            c->gpu_only = true;
        } else if (!strcmp(a, "--n") && has_value) {
            if (!tool_parse_long(argv[++i], 1, 1L << 20, &n))
                return arg_error("--n", "a matrix order from 1 to 1048576", argv[i]);
        } else if (!strcmp(a, "--tile") && has_value) {
            if (!tool_parse_long(argv[++i], 1, 32768, &tile))
                return arg_error("--tile", "a tile order from 1 to 32768", argv[i]);
        } else if (!strcmp(a, "--device") && has_value) {
            c->device = argv[++i];
            if (!tool_device_arg_ok(DEMO_CMD, c->device))
                return TOOL_EXIT_USAGE;
        } else if (!strcmp(a, "--limit") && has_value) {
            if (um_parse_size(argv[++i], &c->limit) != UM_OK || !c->limit)
                return arg_error("--limit", "a size above 0 such as 512M", argv[i]);
        } else if (!strcmp(a, "--sched") && has_value) {
            c->sched = argv[++i];
            bool known = !strcmp(c->sched, "all");
            for (int p = 0; p < DEMO_NPOLICIES; p++)
                known = known || !strcmp(c->sched, demo_policies[p]);
            if (!known)
                return arg_error("--sched", "eager, round_robin, locality, cost or all", c->sched);
        } else if (!strcmp(a, "--sim-gflops") && has_value) {
            if (!tool_parse_long(argv[++i], 0, 1L << 30, &c->sim_gflops))
                return arg_error("--sim-gflops", "a whole number of GFLOP/s, 0 or more", argv[i]);
        } else if (!strcmp(a, "--sim-bandwidth") && has_value) {
            if (um_parse_size(argv[++i], &c->sim_bandwidth) != UM_OK || !c->sim_bandwidth)
                return arg_error("--sim-bandwidth", "a size per second above 0, such as 1G",
                                 argv[i]);
        } else if (!strcmp(a, "--timeline") && has_value) {
            c->timeline = argv[++i];
            if (!*c->timeline)
                return arg_error("--timeline", "a file name", "");
            /* The name goes into the configuration as trace_file's value. */
            if (um__options_value_splits(c->timeline))
                return arg_error("--timeline",
                                 "a file name without ',' before a KEY= (it would end the "
                                 "option trace_file and set another)",
                                 c->timeline);
        } else {
            return tool_other_arg(DEMO_CMD, a, demo_usage);
        }
    }
    int version = 0, gpus = 0;
    char why[160];
    c->gpu = um_cuda_driver_info(&version, &gpus, why, sizeof why) == UM_OK && gpus > 0;
    if (!c->device)
        c->device = c->gpu ? "cuda" : DEMO_SIM_DEVICES;
    if (strstr(c->device, "sim")) {
        if (c->sim_gflops < 0)
            c->sim_gflops = DEMO_SIM_GFLOPS;
        if (!c->sim_bandwidth)
            (void)um_parse_size(DEMO_SIM_BANDWIDTH, &c->sim_bandwidth);
    }
    /* GPU sizes only where the devices asked for are GPUs that exist: on
     * the host alone they would take hours. */
    bool gpu_sizes = c->gpu && strstr(c->device, "cuda") != NULL && demo_cublas_load(NULL, 0);
    c->gpu_sizes = gpu_sizes && !c->quick && (!n || !tile);
    if (!n)
        n = c->quick ? 1536 : gpu_sizes ? 32768 : 3072;
    if (!tile)
        tile = c->quick ? 256 : gpu_sizes ? 4096 : 512;
    if (tile > n) {
        fprintf(stderr, "unimem " DEMO_CMD ": the tile (%ld) is larger than the matrix (%ld)\n",
                tile, n);
        return 2;
    }
    if (n % tile) {
        fprintf(stderr,
                "unimem " DEMO_CMD ": the matrix order %ld is not a multiple of the tile %ld "
                "(try --n %ld)\n",
                n, tile, (n / tile + 1) * tile);
        return 2;
    }
    if (n / tile > DEMO_MAX_TILES) {
        fprintf(stderr,
                "unimem " DEMO_CMD ": %ld tiles per row is too many (at most %d); take a larger "
                "--tile\n",
                n / tile, DEMO_MAX_TILES);
        return 2;
    }
    c->n = (int)n;
    c->tile = (int)tile;
    c->nt = (int)(n / tile);
    size_t tile_bytes = (size_t)tile * (size_t)tile * sizeof(float);
    if (c->limit && c->limit < 3 * tile_bytes) {
        char a[32], b[32];
        fprintf(stderr,
                "unimem " DEMO_CMD ": --limit %s cannot hold the 3 tiles of one task (%s each)\n",
                tool_bytes(a, c->limit), tool_bytes(b, tile_bytes));
        return 2;
    }
    return -1;
}

/* ------------------------------------------------------------ the data */

/* A deterministic value in [-1, 1) for entry (i, j). */
static float gen_value(uint64_t seed, uint64_t i, uint64_t j)
{
    uint64_t h = demo_mix64(seed ^ ((i << 32) | j));
    return (float)((int64_t)(h >> 40) - (1 << 23)) * (1.0f / (float)(1 << 23));
}

/* Entry (i, j) of matrix m: A and B of gemm, or the symmetric positive
 * definite matrix of cholesky (off the diagonal in [-1, 1), on it n and
 * more, so it is diagonally dominant). */
static float mat_value(const demo_cfg *c, int m, uint64_t i, uint64_t j)
{
    if (m != MAT_SPD)
        return gen_value(demo_seed[m], i, j);
    if (i == j)
        return (float)c->n + 1.0f + gen_value(demo_seed[m], i, i);
    return i > j ? gen_value(demo_seed[m], i, j) : gen_value(demo_seed[m], j, i);
}

/* Tile (ti, tj) of matrix m, column-major. */
static void gen_tile(const demo_cfg *c, int m, int ti, int tj, float *out)
{
    int t = c->tile;
    for (int jj = 0; jj < t; jj++)
        for (int ii = 0; ii < t; ii++)
            out[(size_t)jj * (size_t)t + (size_t)ii] =
                mat_value(c, m, (uint64_t)ti * (uint64_t)t + (uint64_t)ii,
                          (uint64_t)tj * (uint64_t)t + (uint64_t)jj);
}

static size_t tile_bytes(const demo_cfg *c)
{
    return (size_t)c->tile * (size_t)c->tile * sizeof(float);
}

static size_t matrix_bytes(const demo_cfg *c)
{
    return (size_t)c->n * (size_t)c->n * sizeof(float);
}

/* gemm: tile (i, j) of A (m 0), B (1) or C (2); cholesky: tile (i, j) of A. */
static um_buffer **tile_at(demo_run *r, int m, int i, int j)
{
    int nt = r->c->nt;
    return &r->tiles[((size_t)m * (size_t)nt + (size_t)i) * (size_t)nt + (size_t)j];
}

typedef struct fill_item {
    um_buffer *b;
    int m, ti, tj;
} fill_item;

/* Writes the generated tiles into their buffers from several threads. */
typedef struct fill_job {
    const demo_cfg *c;
    const fill_item *items;
    size_t count;
    atomic_size_t next;
    atomic_bool failed;
    pthread_mutex_t lock;
    um_status status;
    char message[512];
} fill_job;

static void fill_fail(fill_job *f, um_status st, const char *message)
{
    pthread_mutex_lock(&f->lock);
    if (!atomic_load(&f->failed)) {
        f->status = st;
        snprintf(f->message, sizeof f->message, "%s", message);
        atomic_store(&f->failed, true);
    }
    pthread_mutex_unlock(&f->lock);
}

static void *fill_main(void *arg)
{
    fill_job *f = arg;
    float *tile = malloc(tile_bytes(f->c));
    if (!tile) {
        fill_fail(f, UM_ERR_NOMEM, "cannot allocate a host tile to fill the matrices");
        return NULL;
    }
    for (;;) {
        size_t k = atomic_fetch_add(&f->next, 1);
        if (k >= f->count || atomic_load(&f->failed))
            break;
        const fill_item *it = &f->items[k];
        gen_tile(f->c, it->m, it->ti, it->tj, tile);
        um_status st = um_buffer_write(it->b, 0, tile, tile_bytes(f->c));
        if (st != UM_OK)
            fill_fail(f, st, um_last_error());
    }
    free(tile);
    return NULL;
}

/* Creates the tiles' buffers and fills the inputs (on the host); says
 * what failed on stderr. */
static um_status make_tiles(demo_run *r)
{
    demo_cfg *c = r->c;
    int nt = c->nt;
    size_t per = (size_t)nt * (size_t)nt;
    r->ntiles = c->workload == DEMO_GEMM ? 3 * per : per;
    r->tiles = calloc(r->ntiles, sizeof *r->tiles);
    fill_item *items = calloc(r->ntiles, sizeof *items);
    if (!r->tiles || !items) {
        free(items);
        return host_nomem(r, "the tiles");
    }
    size_t count = 0;
    um_status st = UM_OK;
    for (int m = 0; m < (c->workload == DEMO_GEMM ? 3 : 1) && st == UM_OK; m++)
        for (int i = 0; i < nt && st == UM_OK; i++)
            for (int j = 0; j < nt && st == UM_OK; j++) {
                if (c->workload == DEMO_CHOLESKY && j > i)
                    continue; /* only the lower tiles are used */
                um_buffer **b = tile_at(r, m, i, j);
                st = um_buffer_create(r->ctx, tile_bytes(c), NULL, b);
                if (st == UM_OK && m < 2) /* C is written by its first task */
                    items[count++] = (fill_item){*b, c->workload == DEMO_GEMM ? m : MAT_SPD, i, j};
            }
    if (st != UM_OK) {
        fprintf(stderr, "unimem " DEMO_CMD ": %s\n", um_last_error());
        r->reported = true;
        free(items);
        return st;
    }
    fill_job f = {.c = c, .items = items, .count = count, .status = UM_OK};
    atomic_init(&f.next, 0);
    atomic_init(&f.failed, false);
    pthread_mutex_init(&f.lock, NULL);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int nthreads = cpus < 1 ? 1 : cpus > DEMO_FILL_THREADS ? DEMO_FILL_THREADS : (int)cpus;
    if ((size_t)nthreads > count)
        nthreads = (int)count;
    pthread_t th[DEMO_FILL_THREADS];
    int started = 0;
    for (int i = 0; i < nthreads; i++)
        if (pthread_create(&th[started], NULL, fill_main, &f) == 0)
            started++;
    if (!started)
        fill_main(&f);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&f.lock);
    free(items);
    if (atomic_load(&f.failed)) {
        fprintf(stderr, "unimem " DEMO_CMD ": filling the matrices: %s\n", f.message);
        r->reported = true;
        return f.status;
    }
    return UM_OK;
}

/* ------------------------------------------------------------ progress */

/* The bar's label carries the count and the time (tool_progress). */
static void progress_draw(progress *p)
{
    uint64_t done = atomic_load(&p->done);
    char what[48];
    snprintf(what, sizeof what, "tasks %llu/%llu, %.1f s", (unsigned long long)done,
             (unsigned long long)p->total, (double)(tool_now_ns() - p->start_ns) / 1e9);
    tool_progress(what, p->total ? (double)done / (double)p->total : 1.0);
}

/* Draws the progress every 100 ms until told to stop. */
static void *progress_main(void *arg)
{
    progress *p = arg;
    const struct timespec tick = {0, 100 * 1000 * 1000};
    while (!atomic_load(&p->stop)) {
        progress_draw(p);
        nanosleep(&tick, NULL);
    }
    progress_draw(p);
    tool_progress_clear();
    return NULL;
}

/* The task's done callback, on a worker thread. */
static void task_done(um_task_id id, um_status st, void *user)
{
    (void)id;
    progress *p = ((const demo_op *)user)->owner;
    if (st != UM_OK)
        atomic_fetch_add(&p->failed, 1);
    atomic_fetch_add(&p->done, 1);
}

/* ------------------------------------------------------------ the tasks */

static uint64_t count_tasks(const demo_cfg *c)
{
    uint64_t nt = (uint64_t)c->nt;
    if (c->workload == DEMO_GEMM)
        return nt * nt * nt;
    uint64_t total = 0;
    for (uint64_t k = 0; k < nt; k++) {
        uint64_t below = nt - k - 1;
        total += 1 + 2 * below + below * (below - 1) / 2;
    }
    return total;
}

static um_status submit(demo_run *r, const char *name, um_task_fn cpu, um_task_fn cuda, demo_op *op,
                        double flops, int nbuf, um_buffer *const *bufs, const um_access *modes)
{
    um_task t;
    memset(&t, 0, sizeof t);
    t.name = name;
    t.cuda = r->c->cublas ? cuda : NULL;
    t.cpu = r->c->gpu_only && t.cuda ? NULL : cpu;
    t.nbuffers = nbuf;
    for (int i = 0; i < nbuf; i++) {
        t.buffers[i] = bufs[i];
        t.modes[i] = modes[i];
    }
    t.flops = flops;
    t.device = -1;
    t.user = op;
    t.done = task_done;
    t.priority = r->priority[r->nsubmitted];
    um_task_id id;
    um_status st = um_task_submit(r->ctx, &t, &id);
    if (st == UM_OK) {
        r->submitted = true;
        r->nsubmitted++;
    }
    return st;
}

/* The priorities of the workload's tasks (vsim/dag.h): the same graph,
 * built by the simulator, in the order the submit functions below go. */
static um_status make_priorities(demo_run *r)
{
    const demo_cfg *c = r->c;
    um__vs_dag d;
    int bad = c->workload == DEMO_GEMM ? um__vs_dag_gemm((uint32_t)c->n, (uint32_t)c->tile, &d)
                                       : um__vs_dag_cholesky((uint32_t)c->n, (uint32_t)c->tile, &d);
    if (!bad && (r->priority = malloc((d.ntasks ? d.ntasks : 1) * sizeof *r->priority)) != NULL)
        bad = um__vs_dag_priorities(&d, r->priority);
    else
        bad = -1;
    um__vs_dag_free(&d);
    return bad ? host_nomem(r, "the tasks' priorities") : UM_OK;
}

static um_status submit_gemm(demo_run *r)
{
    int nt = r->c->nt;
    double t3 = (double)r->c->tile * r->c->tile * r->c->tile;
    um_status st = UM_OK;
    for (int i = 0; i < nt && st == UM_OK; i++)
        for (int j = 0; j < nt && st == UM_OK; j++)
            for (int k = 0; k < nt && st == UM_OK; k++) {
                um_buffer *b[3] = {*tile_at(r, 0, i, k), *tile_at(r, 1, k, j),
                                   *tile_at(r, 2, i, j)};
                um_access m[3] = {UM_ACCESS_READ, UM_ACCESS_READ,
                                  k == 0 ? UM_ACCESS_WRITE_DISCARD : UM_ACCESS_READ_WRITE};
                st = submit(r, "gemm", demo_cpu_gemm, demo_cuda_gemm,
                            k == 0 ? &r->op_gemm_first : &r->op_gemm_acc, 2.0 * t3, 3, b, m);
            }
    return st;
}

static um_status submit_cholesky(demo_run *r)
{
    int nt = r->c->nt;
    double t3 = (double)r->c->tile * r->c->tile * r->c->tile;
    um_status st = UM_OK;
    for (int k = 0; k < nt && st == UM_OK; k++) {
        /* With cuSOLVER, potrf runs on GPUs too, its workspace a buffer
         * whose contents never matter (write-discard: never copied). */
        um_buffer *p[2] = {*tile_at(r, 0, k, k), r->potrf_work};
        um_access pm[2] = {UM_ACCESS_READ_WRITE, UM_ACCESS_WRITE_DISCARD};
        st = submit(r, "potrf", demo_cpu_potrf, r->potrf_work ? demo_cuda_potrf : NULL,
                    &r->op_potrf, t3 / 3.0, r->potrf_work ? 2 : 1, p, pm);
        um_buffer *kk = p[0];
        for (int i = k + 1; i < nt && st == UM_OK; i++) {
            um_buffer *b[2] = {kk, *tile_at(r, 0, i, k)};
            um_access m[2] = {UM_ACCESS_READ, UM_ACCESS_READ_WRITE};
            st = submit(r, "trsm", demo_cpu_trsm, demo_cuda_trsm, &r->op_trsm, t3, 2, b, m);
        }
        /* Every SYRK of the step, then every GEMM, as the graph orders
         * them: the priorities are the graph's, taken in submission order. */
        for (int i = k + 1; i < nt && st == UM_OK; i++) {
            um_buffer *s[2] = {*tile_at(r, 0, i, k), *tile_at(r, 0, i, i)};
            um_access sm[2] = {UM_ACCESS_READ, UM_ACCESS_READ_WRITE};
            st = submit(r, "syrk", demo_cpu_syrk, demo_cuda_syrk, &r->op_syrk, t3, 2, s, sm);
        }
        for (int i = k + 1; i < nt && st == UM_OK; i++) {
            for (int j = k + 1; j < i && st == UM_OK; j++) {
                um_buffer *g[3] = {*tile_at(r, 0, i, k), *tile_at(r, 0, j, k),
                                   *tile_at(r, 0, i, j)};
                um_access gm[3] = {UM_ACCESS_READ, UM_ACCESS_READ, UM_ACCESS_READ_WRITE};
                st = submit(r, "gemm", demo_cpu_gemm, demo_cuda_gemm, &r->op_chol_gemm, 2.0 * t3, 3,
                            g, gm);
            }
        }
    }
    return st;
}

/* ---------------------------------------------------------- verification */

/* Keeps the worst entry seen: err is its error (NaN counts as infinite),
 * what names the matrix whose entry (i, j) was checked. */
static void note_error(run_result *x, double err, const char *what, int i, int j, double got,
                       double want)
{
    if (isnan(err))
        err = INFINITY;
    if (err > x->max_error || !x->mismatch[0]) {
        x->max_error = err;
        snprintf(x->mismatch, sizeof x->mismatch, "%s(%d,%d) is %.7g, expected %.7g", what, i, j,
                 got, want);
    }
}

/* gemm: C against the reference, relative to the largest reference entry. */
static um_status verify_gemm(demo_run *r, run_result *x)
{
    demo_cfg *c = r->c;
    int n = c->n, t = c->tile, nt = c->nt;
    double max_diff = 0.0, max_ref = 0.0;
    int wi = 0, wj = 0;
    double wgot = 0, wwant = 0;
    um_status st = UM_OK;
    if (n <= DEMO_FULL_CHECK_MAX) {
        if (!c->gemm_ref) {
            size_t nn = (size_t)n * (size_t)n;
            float *a = malloc(nn * sizeof *a), *b = malloc(nn * sizeof *b);
            c->gemm_ref = malloc(nn * sizeof *c->gemm_ref);
            if (!a || !b || !c->gemm_ref) {
                free(a);
                free(b);
                free(c->gemm_ref);
                c->gemm_ref = NULL;
                return host_nomem(r, "the reference result");
            }
            for (int j = 0; j < n; j++)
                for (int i = 0; i < n; i++) {
                    a[(size_t)j * (size_t)n + (size_t)i] =
                        mat_value(c, MAT_A, (uint64_t)i, (uint64_t)j);
                    b[(size_t)j * (size_t)n + (size_t)i] =
                        mat_value(c, MAT_B, (uint64_t)i, (uint64_t)j);
                }
            demo_ref_sgemm(n, a, b, c->gemm_ref);
            free(a);
            free(b);
        }
        float *tile = malloc(tile_bytes(c));
        if (!tile)
            return host_nomem(r, "the check of the result");
        for (int ti = 0; ti < nt && st == UM_OK; ti++)
            for (int tj = 0; tj < nt && st == UM_OK; tj++) {
                st = um_buffer_read(*tile_at(r, 2, ti, tj), 0, tile, tile_bytes(c));
                for (int jj = 0; jj < t && st == UM_OK; jj++)
                    for (int ii = 0; ii < t; ii++) {
                        int i = ti * t + ii, j = tj * t + jj;
                        double got = tile[(size_t)jj * (size_t)t + (size_t)ii];
                        double want = c->gemm_ref[(size_t)j * (size_t)n + (size_t)i];
                        double d = fabs(got - want);
                        if (fabs(want) > max_ref)
                            max_ref = fabs(want);
                        if (isnan(d) || d > max_diff) {
                            max_diff = isnan(d) ? INFINITY : d;
                            wi = i, wj = j, wgot = got, wwant = want;
                        }
                    }
            }
        free(tile);
    } else {
        x->sampled = true;
        demo_sampler smp;
        demo_sampler_init(&smp, nt, t, false, DEMO_SAMPLES, DEMO_SEED_GEMM);
        int i, j;
        while (st == UM_OK && demo_sampler_next(&smp, &i, &j)) {
            double want = 0.0;
            for (int k = 0; k < n; k++)
                want += (double)mat_value(c, MAT_A, (uint64_t)i, (uint64_t)k) *
                        (double)mat_value(c, MAT_B, (uint64_t)k, (uint64_t)j);
            float got = 0.0f;
            size_t off = ((size_t)(j % t) * (size_t)t + (size_t)(i % t)) * sizeof(float);
            st = um_buffer_read(*tile_at(r, 2, i / t, j / t), off, &got, sizeof got);
            double d = fabs((double)got - want);
            if (fabs(want) > max_ref)
                max_ref = fabs(want);
            if (isnan(d) || d > max_diff) {
                max_diff = isnan(d) ? INFINITY : d;
                wi = i, wj = j, wgot = got, wwant = want;
            }
        }
    }
    if (st != UM_OK)
        return st;
    x->checked = true;
    x->max_error = 0.0;
    note_error(x, max_ref > 0 ? max_diff / max_ref : max_diff, "C", wi, wj, wgot, wwant);
    x->verified = x->max_error <= DEMO_TOLERANCE;
    return UM_OK;
}

/* cholesky: the lower tiles read back, as one array of tile pointers. */
static um_status read_lower(demo_run *r, float ***out)
{
    demo_cfg *c = r->c;
    int nt = c->nt;
    float **l = calloc((size_t)nt * (size_t)nt, sizeof *l);
    if (!l)
        return host_nomem(r, "the check of the result");
    *out = l;
    um_status st = UM_OK;
    for (int i = 0; i < nt && st == UM_OK; i++)
        for (int j = 0; j <= i && st == UM_OK; j++) {
            float *p = malloc(tile_bytes(c));
            if (!p)
                return host_nomem(r, "the check of the result");
            l[(size_t)i * (size_t)nt + (size_t)j] = p;
            st = um_buffer_read(*tile_at(r, 0, i, j), 0, p, tile_bytes(c));
        }
    return st;
}

/* L(i, j) from the tiles: 0 above the diagonal (the upper part of a
 * diagonal tile still holds A). */
static float l_entry(const demo_cfg *c, float *const *l, int i, int j)
{
    if (j > i)
        return 0.0f;
    int t = c->tile;
    const float *p = l[(size_t)(i / t) * (size_t)c->nt + (size_t)(j / t)];
    return p[(size_t)(j % t) * (size_t)t + (size_t)(i % t)];
}

/* cholesky: |A - L L^T| / (|L| |L^T|) entry by entry (the rounding error
 * of a Cholesky factorisation is bounded by a small multiple of the second
 * term): whole up to DEMO_FULL_CHECK_MAX, else at random entries. */
static um_status verify_cholesky(demo_run *r, run_result *x)
{
    demo_cfg *c = r->c;
    int n = c->n, nt = c->nt;
    float **l = NULL;
    um_status st = read_lower(r, &l);
    x->max_error = 0.0;
    if (st == UM_OK && n <= DEMO_FULL_CHECK_MAX) {
        size_t nn = (size_t)n * (size_t)n;
        float *lf = malloc(nn * sizeof *lf), *prod = calloc(nn, sizeof *prod),
              *bound = calloc(nn, sizeof *bound);
        if (!lf || !prod || !bound) {
            st = host_nomem(r, "the check of the result");
        } else {
            for (int j = 0; j < n; j++)
                for (int i = 0; i < n; i++)
                    lf[(size_t)j * (size_t)n + (size_t)i] = l_entry(c, l, i, j);
            demo_ref_syrk(n, lf, prod);
            for (size_t k = 0; k < nn; k++)
                lf[k] = fabsf(lf[k]);
            demo_ref_syrk(n, lf, bound);
            for (int j = 0; j < n; j++)
                for (int i = j; i < n; i++) {
                    size_t k = (size_t)j * (size_t)n + (size_t)i;
                    double want = mat_value(c, MAT_SPD, (uint64_t)i, (uint64_t)j);
                    double err = fabs(want - (double)prod[k]) / ((double)bound[k] + 1e-30);
                    note_error(x, err, "(L L^T)", i, j, prod[k], want);
                }
        }
        free(lf);
        free(prod);
        free(bound);
    } else if (st == UM_OK) {
        x->sampled = true;
        demo_sampler smp;
        demo_sampler_init(&smp, nt, c->tile, true, DEMO_SAMPLES, DEMO_SEED_CHOLESKY);
        int i, j;
        while (demo_sampler_next(&smp, &i, &j)) {
            double sum = 0.0, bound = 0.0;
            for (int k = 0; k <= j; k++) {
                double p = (double)l_entry(c, l, i, k) * (double)l_entry(c, l, j, k);
                sum += p;
                bound += fabs(p);
            }
            double want = mat_value(c, MAT_SPD, (uint64_t)i, (uint64_t)j);
            note_error(x, fabs(want - sum) / (bound + 1e-30), "(L L^T)", i, j, sum, want);
        }
    }
    for (size_t k = 0; l && k < (size_t)nt * (size_t)nt; k++)
        free(l[k]);
    free(l);
    if (st != UM_OK)
        return st;
    x->checked = true;
    x->verified = x->max_error <= DEMO_TOLERANCE;
    return UM_OK;
}

/* --------------------------------------------------------------- a run */

/* trace_file for this run: FILE, or with --sched all FILE.POLICY.ext. */
static void timeline_path(const demo_cfg *c, const char *sched, char *out, size_t len)
{
    if (strcmp(c->sched, "all") != 0) {
        snprintf(out, len, "%s", c->timeline);
        return;
    }
    const char *slash = strrchr(c->timeline, '/');
    const char *dot = strrchr(c->timeline, '.');
    if (!dot || (slash && dot < slash) || dot == c->timeline || (slash && dot == slash + 1))
        snprintf(out, len, "%s.%s", c->timeline, sched);
    else
        snprintf(out, len, "%.*s.%s%s", (int)(dot - c->timeline), c->timeline, sched, dot);
}

/* The report's opening lines, once, from the first run's devices. */
static void describe(demo_cfg *c, const dev_result *dev, int ndev, const char *cublas_why)
{
    if (c->described)
        return;
    c->described = true;
    int sims = 0, gpus = 0;
    for (int d = 1; d < ndev; d++) {
        sims += dev[d].info.kind == UM_DEVICE_SIM;
        gpus += dev[d].info.kind == UM_DEVICE_CUDA;
    }
    if (gpus && c->cublas)
        fprintf(stderr, "unimem " DEMO_CMD ": cuBLAS loaded: %s%s%s\n",
                c->workload != DEMO_CHOLESKY ? "gemm can run on the GPUs"
                : c->potrf_gpu ? "trsm, syrk, gemm and (with cuSOLVER) potrf can run on the GPUs"
                               : "trsm, syrk and gemm can run on the GPUs (potrf on the host: ",
                c->workload == DEMO_CHOLESKY && !c->potrf_gpu ? demo_cusolver_why() : "",
                c->workload == DEMO_CHOLESKY && !c->potrf_gpu ? ")" : "");
    else if (gpus)
        fprintf(stderr,
                "unimem " DEMO_CMD ": %s; no task has a GPU implementation, so every "
                "task runs on the host%s\n",
                cublas_why, sims ? " or a simulated device" : "");
    if (c->json)
        return;
    char mb[32], tb[32];
    double flops = c->workload == DEMO_GEMM ? 2.0 * c->n * (double)c->n * c->n
                                            : (double)c->n * c->n * c->n / 3.0;
    printf("unimem demo %s: %s, n %d in %dx%d tiles of %d (%s each), %llu tasks, %.1f GFLOP\n",
           c->workload_name, c->workload == DEMO_GEMM ? "C = A B" : "A = L L^T", c->n, c->nt, c->nt,
           c->tile, tool_bytes(tb, tile_bytes(c)), (unsigned long long)count_tasks(c), flops / 1e9);
    printf("devices=%s: the host", c->device);
    if (gpus)
        printf(", %d GPU%s", gpus, gpus == 1 ? "" : "s");
    if (sims) {
        printf(" and %d simulated device%s (simulated devices: their memory is host memory and "
               "they compute on the host's CPUs",
               sims, sims == 1 ? "" : "s");
        if (c->sim_gflops > 0)
            printf(", at most %ld GFLOP/s each", c->sim_gflops);
        if (c->sim_bandwidth)
            printf(", links of %s/s each way", tool_bytes(tb, c->sim_bandwidth));
        printf(")");
    }
    printf("\n");
    if (ndev == 1)
        printf("no accelerator: every task runs on the host\n");
    else
        printf("memory limit %s on each accelerator; one matrix is %s (%.1fx the limit)\n",
               tool_bytes(tb, dev[1].limit), tool_bytes(mb, matrix_bytes(c)),
               (double)matrix_bytes(c) / (double)dev[1].limit);
    if (!c->verify)
        printf("the result is not checked (--no-verify)\n");
    else if (c->n <= DEMO_FULL_CHECK_MAX)
        printf("the result is checked whole against OpenBLAS on the host (tolerance %.0e)\n",
               DEMO_TOLERANCE);
    else {
        demo_sampler smp;
        demo_sampler_init(&smp, c->nt, c->tile, c->workload == DEMO_CHOLESKY, DEMO_SAMPLES, 0);
        printf("the result is checked at %llu random entries, %llu in each tile%s, in double "
               "precision (tolerance %.0e)\n",
               (unsigned long long)demo_sampler_count(&smp), (unsigned long long)smp.per_tile,
               c->workload == DEMO_CHOLESKY ? " of the lower triangle" : "", DEMO_TOLERANCE);
    }
    fflush(stdout);
}

/* Waits for what was submitted, then frees the run's tiles and context. */
static void close_run(demo_run *r)
{
    if (r->submitted)
        (void)um_wait_all(r->ctx);
    demo_cublas_release();
    if (r->potrf_work)
        (void)um_buffer_destroy(r->potrf_work);
    r->potrf_work = NULL;
    for (size_t k = 0; r->tiles && k < r->ntiles; k++)
        if (r->tiles[k])
            (void)um_buffer_destroy(r->tiles[k]);
    free(r->tiles);
    r->tiles = NULL;
    free(r->priority);
    r->priority = NULL;
    r->nsubmitted = 0;
    if (r->ctx)
        um_shutdown(r->ctx);
    r->ctx = NULL;
}

/* Reports a failed call (message: um_last_error() as it was then; NULL:
 * as it is now), unless it has been reported already; frees the run and
 * gives the exit code 1. */
static int run_fail(demo_run *r, um_status st, const char *message)
{
    fflush(stdout);
    if (!message || !*message)
        message = *um_last_error() ? um_last_error() : um_strerror(st);
    if (!r->reported)
        fprintf(stderr, "unimem " DEMO_CMD ": %s\n", message);
    close_run(r);
    return 1;
}

static uint64_t link_bytes(um_context *ctx, int from, int to)
{
    um_link_stats s;
    return um_link_stats_get(ctx, from, to, &s) == UM_OK ? s.bytes : 0;
}

/* Tasks per GPU that start (and stop) cuBLAS: at least one per stream the
 * device's worker launches on (it takes them in turn). */
#define DEMO_CUBLAS_TASKS 8

/* Starts cuBLAS on each GPU with tasks there, before the work: each
 * makes its stream's handle and runs one GEMM of the tile's size on
 * scratch tiles (written one after another, so the tasks follow each
 * other across the streams). When a handle cannot be made, the work runs
 * without GPU implementations and why says so. */
static um_status start_cublas(demo_run *r, const dev_result *dev, char *why, size_t why_len)
{
    um_buffer *scratch[3] = {NULL, NULL, NULL};
    um_status st = UM_OK;
    for (int i = 0; i < 3 && st == UM_OK; i++)
        st = um_buffer_create(r->ctx, tile_bytes(r->c), NULL, &scratch[i]);
    for (int d = 1; d < r->ndev && st == UM_OK; d++) {
        if (dev[d].info.kind != UM_DEVICE_CUDA)
            continue;
        for (int k = 0; k < DEMO_CUBLAS_TASKS && st == UM_OK; k++) {
            um_task t;
            memset(&t, 0, sizeof t);
            t.name = "cublas_init";
            t.cuda = demo_cuda_init;
            t.user = &r->op_potrf; /* its tile: cuSOLVER's workspace is sized there */
            t.device = d;
            t.nbuffers = 3;
            for (int i = 0; i < 3; i++) {
                t.buffers[i] = scratch[i];
                t.modes[i] = UM_ACCESS_WRITE_DISCARD;
            }
            um_task_id id;
            st = um_task_submit(r->ctx, &t, &id);
            r->submitted = r->submitted || st == UM_OK;
        }
    }
    if (st == UM_OK)
        st = um_wait_all(r->ctx);
    for (int i = 0; i < 3; i++)
        if (scratch[i] && um_buffer_destroy(scratch[i]) != UM_OK && st == UM_OK)
            st = UM_ERR_BUSY;
    for (int d = 1; d < r->ndev && st == UM_OK && r->c->cublas; d++)
        if (dev[d].info.kind == UM_DEVICE_CUDA && !demo_cublas_ready(d, why, why_len)) {
            r->c->cublas = false;
            demo_cublas_release();
        }
    size_t work = r->c->cublas && r->c->workload == DEMO_CHOLESKY ? demo_cusolver_workspace() : 0;
    if (st == UM_OK && work)
        st = um_buffer_create(r->ctx, work, NULL, &r->potrf_work);
    r->c->potrf_gpu = r->potrf_work != NULL;
    return st;
}

/* Destroys each GPU's cuBLAS handles with tasks there, where they were
 * made (best effort: what is left goes from this thread). */
static void stop_cublas(demo_run *r, const dev_result *dev)
{
    for (int d = 1; d < r->ndev && r->c->cublas; d++) {
        if (dev[d].info.kind != UM_DEVICE_CUDA)
            continue;
        for (int k = 0; k < DEMO_CUBLAS_TASKS; k++) {
            um_task t;
            memset(&t, 0, sizeof t);
            t.name = "cublas_fini";
            t.cuda = demo_cuda_fini;
            t.device = d;
            um_task_id id;
            if (um_task_submit(r->ctx, &t, &id) == UM_OK)
                (void)um_task_wait(r->ctx, id);
        }
    }
    demo_cublas_release();
}

/* One run with one policy: a fresh context, the data, the tasks, the
 * figures and the check. 0, or the exit code after a message. */
static int run_one(demo_cfg *c, const char *sched, run_result *x)
{
    demo_run r;
    memset(&r, 0, sizeof r);
    r.c = c;
    memset(x, 0, sizeof *x);
    x->sched = sched;
    x->tasks = count_tasks(c);
    x->flops = c->workload == DEMO_GEMM ? 2.0 * c->n * (double)c->n * c->n
                                        : (double)c->n * c->n * c->n / 3.0;

    char conf[1024], path[512];
    size_t len = (size_t)snprintf(conf, sizeof conf, "devices=%s,sched=%s", c->device, sched);
    if (c->sim_gflops >= 0 && len < sizeof conf)
        len += (size_t)snprintf(conf + len, sizeof conf - len, ",sim_gflops=%ld", c->sim_gflops);
    /* On GPUs a task with no GPU implementation (potrf without cuSOLVER)
     * still runs on the host; sim devices run every task's cpu code. */
    if (c->gpu_only && !strstr(c->device, "cuda") && len < sizeof conf)
        len += (size_t)snprintf(conf + len, sizeof conf - len, ",host_tasks=0");
    if (c->sim_bandwidth && len < sizeof conf)
        len += (size_t)snprintf(conf + len, sizeof conf - len, ",sim_link_bandwidth=%zu",
                                c->sim_bandwidth);
    if (c->timeline && len < sizeof conf) {
        timeline_path(c, sched, path, sizeof path);
        len += (size_t)snprintf(conf + len, sizeof conf - len, ",trace_file=%s", path);
    }
    if (len >= sizeof conf) {
        fprintf(stderr, "unimem " DEMO_CMD ": --device or --timeline is too long\n");
        return 2;
    }
    um_status st = um_init(conf, &r.ctx);
    if (st != UM_OK) {
        /* A refused option is the user's input (--device, UNIMEM_CONF; the
         * other values are checked above): an argument error. */
        int rc = run_fail(&r, st, NULL);
        return st == UM_ERR_BAD_OPTION ? TOOL_EXIT_USAGE : rc;
    }

    /* The devices, and their limits. */
    r.ndev = um_device_count(r.ctx);
    x->ndev = r.ndev;
    x->dev = calloc((size_t)r.ndev, sizeof *x->dev);
    if (!x->dev)
        return run_fail(&r, host_nomem(&r, "the figures"), NULL);
    int gpus = 0, cpu_workers = 0;
    size_t def_limit = matrix_bytes(c) / 3;
    if (def_limit < 4 * tile_bytes(c))
        def_limit = 4 * tile_bytes(c);
    for (int d = 0; d < r.ndev && st == UM_OK; d++) {
        dev_result *dr = &x->dev[d];
        st = um_device_info_get(r.ctx, d, &dr->info);
        if (st != UM_OK)
            break;
        gpus += dr->info.kind == UM_DEVICE_CUDA;
        cpu_workers += dr->info.kind != UM_DEVICE_CUDA;
        if (d == 0)
            continue;
        if (!tool_limit_fits(DEMO_CMD, &dr->info, d, c->limit)) {
            close_run(&r);
            return TOOL_EXIT_USAGE;
        }
        /* Memory comes in pages: what a limit holds is rounded down to them. */
        size_t page = dr->info.granularity ? dr->info.granularity : 1;
        if (c->limit && c->limit / page * page < 3 * tile_bytes(c)) {
            char a[32], b[32], p[32], t[32];
            fprintf(stderr,
                    "unimem " DEMO_CMD ": --limit %s holds %s in %s's pages of %s, less than "
                    "the 3 tiles of one task (%s each)\n",
                    tool_bytes(a, c->limit), tool_bytes(b, c->limit / page * page), dr->info.name,
                    tool_bytes(p, page), tool_bytes(t, tile_bytes(c)));
            close_run(&r);
            return 2;
        }
        dr->limit = c->limit ? c->limit : def_limit;
        if (!c->limit && dr->limit / page * page < 4 * tile_bytes(c))
            dr->limit = (4 * tile_bytes(c) + page - 1) / page * page;
        if (!c->limit && dr->limit > dr->info.capacity)
            dr->limit = dr->info.capacity;
        st = um_set_memory_limit(r.ctx, d, dr->limit);
    }
    if (st != UM_OK)
        return run_fail(&r, st, NULL);
    char why[256] = "";
    /* Set before start_cublas, which sizes cuSOLVER's workspace for potrf. */
    r.op_trsm = r.op_syrk = r.op_potrf = (demo_op){c->tile, false, 1.0f, 1.0f, &r.prog};
    if (gpus)
        c->cublas = demo_cublas_load(why, sizeof why);
    if (c->cublas) {
        st = start_cublas(&r, x->dev, why, sizeof why);
        if (st != UM_OK)
            return run_fail(&r, st, NULL);
    }
    if (c->gpu_only && (r.ndev < 2 || (gpus && !c->cublas))) {
        fprintf(stderr, "unimem " DEMO_CMD ": --gpu-only needs an accelerator%s%s%s\n",
                gpus ? " (GPUs with cuBLAS)" : "", *why ? ": " : "", why);
        close_run(&r);
        return TOOL_EXIT_USAGE; /* the devices give nothing to run on */
    }
    if (gpus && !c->cublas && c->gpu_sizes) {
        fprintf(stderr,
                "unimem " DEMO_CMD ": %s; the default sizes are for GPUs: give --n and --tile "
                "(or --quick) to run on the host\n",
                why);
        close_run(&r);
        return 1;
    }
    describe(c, x->dev, r.ndev, why);

    /* Every device that runs cpu implementations has a worker of its own,
     * so OpenBLAS gets a share of the CPUs per call. */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long share = cpus / (cpu_workers ? cpu_workers : 1);
    if (share > demo_blas_default_threads())
        share = demo_blas_default_threads();
    demo_blas_set_threads(share < 1 ? 1 : (int)share);

    int t = c->tile;
    r.op_gemm_first = (demo_op){t, false, 1.0f, 0.0f, &r.prog};
    r.op_gemm_acc = (demo_op){t, false, 1.0f, 1.0f, &r.prog};
    r.op_chol_gemm = (demo_op){t, true, -1.0f, 1.0f, &r.prog};
    st = make_tiles(&r);
    if (st == UM_OK)
        st = make_priorities(&r);
    if (st != UM_OK)
        return run_fail(&r, st, NULL);

    /* What the devices did before the tasks (filling the inputs, making
     * cuBLAS handles) is left out of the figures. */
    dev_result *base = calloc((size_t)r.ndev, sizeof *base);
    if (!base)
        return run_fail(&r, host_nomem(&r, "the figures"), NULL);
    for (int d = 0; d < r.ndev && st == UM_OK; d++) {
        um_reclaim_stats rs;
        memset(&rs, 0, sizeof rs);
        st = um_reset_peak(r.ctx, d);
        if (st == UM_OK)
            st = um_reclaim_stats_get(r.ctx, d, &rs);
        if (st == UM_OK)
            st = um_task_stats_get(r.ctx, d, &base[d].tasks);
        base[d].evictions = rs.evictions;
        base[d].written_back = rs.written_back;
        base[d].written_back_bytes = rs.written_back_bytes;
        base[d].bytes_in = link_bytes(r.ctx, -1, d);
        base[d].bytes_out = link_bytes(r.ctx, d, -1);
    }
    if (st != UM_OK) {
        free(base);
        return run_fail(&r, st, NULL);
    }

    /* The tasks, timed from the first submission to the last completion. */
    atomic_init(&r.prog.done, 0);
    atomic_init(&r.prog.failed, 0);
    atomic_init(&r.prog.stop, false);
    r.prog.total = x->tasks;
    r.prog.start_ns = tool_now_ns();
    pthread_t bar;
    bool bar_on = tool_progress_on() && pthread_create(&bar, NULL, progress_main, &r.prog) == 0;
    uint64_t t0 = tool_now_ns();
    st = c->workload == DEMO_GEMM ? submit_gemm(&r) : submit_cholesky(&r);
    char message[512] = "";
    if (st != UM_OK)
        snprintf(message, sizeof message, "%s", um_last_error());
    if (st == UM_OK) {
        st = um_wait_all(r.ctx);
        if (st != UM_OK)
            snprintf(message, sizeof message, "%s", um_last_error());
    }
    uint64_t t1 = tool_now_ns();
    atomic_store(&r.prog.stop, true);
    if (bar_on)
        pthread_join(bar, NULL);
    if (st != UM_OK) {
        free(base);
        uint64_t failed = atomic_load(&r.prog.failed);
        if (failed)
            fprintf(stderr, "unimem " DEMO_CMD ": %llu of %llu tasks failed or were cancelled\n",
                    (unsigned long long)failed, (unsigned long long)x->tasks);
        return run_fail(&r, st, message);
    }
    x->makespan_s = (double)(t1 - t0) / 1e9;
    x->gflops = x->makespan_s > 0 ? x->flops / x->makespan_s / 1e9 : 0.0;

    for (int d = 0; d < r.ndev && st == UM_OK; d++) {
        dev_result *dr = &x->dev[d];
        um_reclaim_stats rs;
        st = um_task_stats_get(r.ctx, d, &dr->tasks);
        if (st == UM_OK)
            st = um_stats_get(r.ctx, d, &dr->mem);
        if (st == UM_OK)
            st = um_reclaim_stats_get(r.ctx, d, &rs);
        if (st != UM_OK)
            break;
        dr->tasks.tasks -= base[d].tasks.tasks;
        dr->tasks.failed -= base[d].tasks.failed;
        dr->tasks.busy_ns -= base[d].tasks.busy_ns;
        dr->tasks.waited_ns -= base[d].tasks.waited_ns;
        dr->tasks.bytes_in -= base[d].tasks.bytes_in;
        dr->evictions = rs.evictions - base[d].evictions;
        dr->written_back = rs.written_back - base[d].written_back;
        dr->written_back_bytes = rs.written_back_bytes - base[d].written_back_bytes;
        dr->bytes_in = link_bytes(r.ctx, -1, d) - base[d].bytes_in;
        dr->bytes_out = link_bytes(r.ctx, d, -1) - base[d].bytes_out;
    }
    free(base);
    if (st != UM_OK)
        return run_fail(&r, st, NULL);
    stop_cublas(&r, x->dev);

    if (c->verify) {
        demo_blas_set_threads(demo_blas_default_threads());
        st = c->workload == DEMO_GEMM ? verify_gemm(&r, x) : verify_cholesky(&r, x);
        if (st != UM_OK)
            return run_fail(&r, st, NULL);
    }
    close_run(&r);
    return 0;
}

/* ------------------------------------------------------------ the report */

static const char *check_name(const demo_cfg *c, const run_result *x)
{
    if (!c->verify)
        return "off";
    return x->sampled ? "sampled" : "full";
}

static void print_json(const demo_cfg *c, const run_result *x)
{
    bool simulated = false;
    for (int d = 1; d < x->ndev; d++)
        simulated = simulated || x->dev[d].info.kind == UM_DEVICE_SIM;
    printf("{\"workload\":\"%s\",\"n\":%d,\"tile\":%d,\"sched\":\"%s\",\"devices\":",
           c->workload_name, c->n, c->tile, x->sched);
    tool_json_string(stdout, c->device);
    printf(",\"simulated\":%s,\"gpu_only\":%s,\"limit_bytes\":%llu,\"tasks\":%llu,"
           "\"gflop\":%.3f,\"makespan_s\":%.6f,\"gflops\":%.3f,\"check\":\"%s\",\"verified\":%s,",
           simulated ? "true" : "false", c->gpu_only ? "true" : "false",
           (unsigned long long)(x->ndev > 1 ? x->dev[1].limit : 0), (unsigned long long)x->tasks,
           x->flops / 1e9, x->makespan_s, x->gflops, check_name(c, x),
           x->checked && x->verified ? "true" : "false");
    if (x->checked && isfinite(x->max_error))
        printf("\"max_error\":%.6g,", x->max_error);
    else
        printf("\"max_error\":null,");
    printf("\"per_device\":[");
    for (int d = 0; d < x->ndev; d++) {
        const dev_result *dr = &x->dev[d];
        printf("%s{\"device\":%d,\"name\":", d ? "," : "", d);
        tool_json_string(stdout, dr->info.name);
        printf(",\"kind\":\"%s\",\"tasks\":%llu,\"failed\":%llu,\"busy_s\":%.6f,"
               "\"waited_s\":%.6f,\"limit_bytes\":%llu,\"peak_active_bytes\":%llu,"
               "\"peak_reserved_bytes\":%llu,\"active_bytes\":%llu,\"evictions\":%llu,"
               "\"written_back\":%llu,\"written_back_bytes\":%llu,\"bytes_in\":%llu,"
               "\"bytes_out\":%llu}",
               um_device_kind_name(dr->info.kind), (unsigned long long)dr->tasks.tasks,
               (unsigned long long)dr->tasks.failed, (double)dr->tasks.busy_ns / 1e9,
               (double)dr->tasks.waited_ns / 1e9, (unsigned long long)dr->limit,
               (unsigned long long)dr->mem.peak_active_bytes,
               (unsigned long long)dr->mem.peak_reserved_bytes,
               (unsigned long long)dr->mem.active_bytes, (unsigned long long)dr->evictions,
               (unsigned long long)dr->written_back, (unsigned long long)dr->written_back_bytes,
               (unsigned long long)dr->bytes_in, (unsigned long long)dr->bytes_out);
    }
    printf("]}\n");
    fflush(stdout);
}

static void print_text(const run_result *x)
{
    printf("\nsched %s: makespan %.3f s, %.2f GFLOP/s", x->sched, x->makespan_s, x->gflops);
    if (x->checked)
        printf("; %s: max error %.3g (%s)", x->verified ? "verified" : "WRONG", x->max_error,
               x->sampled ? "sampled" : "whole result");
    printf("\n");
    printf("  %-3s %-10s %-4s %7s %8s %5s %11s %11s %11s %6s %11s %11s %11s\n", "dev", "name",
           "kind", "tasks", "busy_s", "busy", "peak_used", "peak_resvd", "limit", "evict",
           "written_bk", "bytes_in", "bytes_out");
    for (int d = 0; d < x->ndev; d++) {
        const dev_result *dr = &x->dev[d];
        char pu[32], pr[32], lim[32], wb[32], in[32], out[32];
        double busy = (double)dr->tasks.busy_ns / 1e9;
        printf("  %-3d %-10.10s %-4s %7llu %8.3f %4.0f%% %11s %11s %11s %6llu %11s %11s %11s\n", d,
               dr->info.name, um_device_kind_name(dr->info.kind),
               (unsigned long long)dr->tasks.tasks, busy,
               x->makespan_s > 0 ? 100.0 * busy / x->makespan_s : 0.0,
               tool_bytes(pu, dr->mem.peak_active_bytes),
               tool_bytes(pr, dr->mem.peak_reserved_bytes), d ? tool_bytes(lim, dr->limit) : "-",
               (unsigned long long)dr->evictions, tool_bytes(wb, dr->written_back_bytes),
               tool_bytes(in, dr->bytes_in), tool_bytes(out, dr->bytes_out));
    }
    if (x->checked && !x->verified)
        printf("  WRONG RESULT: %s (error %.3g, tolerance %.0e)\n", x->mismatch, x->max_error,
               DEMO_TOLERANCE);
    fflush(stdout);
}

static void print_comparison(const demo_cfg *c, const run_result *x, int nruns)
{
    double best = 0;
    for (int i = 0; i < nruns; i++)
        if (best == 0 || x[i].makespan_s < best)
            best = x[i].makespan_s;
    printf("\ncomparison: %s, n %d, tile %d, devices=%s\n", c->workload_name, c->n, c->tile,
           c->device);
    printf("  %-12s %11s %10s %8s %9s\n", "sched", "makespan_s", "GFLOP/s", "vs_best", "result");
    for (int i = 0; i < nruns; i++)
        printf("  %-12s %11.3f %10.2f %7.2fx %9s\n", x[i].sched, x[i].makespan_s, x[i].gflops,
               best > 0 ? x[i].makespan_s / best : 0.0,
               !x[i].checked   ? "unchecked"
               : x[i].verified ? "verified"
                               : "WRONG");
    fflush(stdout);
}

int um_cmd_demo(int argc, char **argv)
{
    demo_cfg c;
    int rc = demo_parse(argc, argv, &c);
    if (rc >= 0)
        return rc;
    char why[320];
    if (!demo_openblas_load(why, sizeof why)) {
        fprintf(stderr, "unimem " DEMO_CMD ": %s\n", why);
        return 1;
    }
    rc = 0;
    bool all = !strcmp(c.sched, "all");
    int nruns = all ? DEMO_NPOLICIES : 1;
    run_result x[DEMO_NPOLICIES];
    memset(x, 0, sizeof x);
    int wrong = 0, done = 0;
    for (int i = 0; i < nruns && !rc; i++) {
        rc = run_one(&c, all ? demo_policies[i] : c.sched, &x[i]);
        if (rc)
            break;
        done++;
        if (c.json)
            print_json(&c, &x[i]);
        else
            print_text(&x[i]);
        if (x[i].checked && !x[i].verified) {
            wrong++;
            fprintf(stderr,
                    "unimem " DEMO_CMD ": %s with sched %s gave a wrong result: %s (error %.3g, "
                    "tolerance %.0e)\n",
                    c.workload_name, x[i].sched, x[i].mismatch, x[i].max_error, DEMO_TOLERANCE);
        }
    }
    if (!rc && all && !c.json)
        print_comparison(&c, x, done);
    for (int i = 0; i < nruns; i++)
        free(x[i].dev);
    free(c.gemm_ref);
    if (rc)
        return rc;
    return wrong ? 1 : 0;
}
