/* Tests of the virtual-time simulation (src/vsim/sim.c): a one-task run
 * worked out by hand, eviction and write-back on a device a few tiles
 * large, bad graphs named clearly, and random machines and graphs under
 * every policy checked against what must hold of any schedule. */
#include "harness.h"
#include "base/options.h"
#include "vsim/sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>


static const int policies[] = {UM_SCHED_EAGER, UM_SCHED_ROUND_ROBIN, UM_SCHED_LOCALITY,
                               UM_SCHED_COST};

static um__vs_machine *load(const char *text)
{
    um__vs_machine *m = malloc(sizeof *m);
    if (!m || um__vs_machine_parse(text, "test", m) != UM_OK) {
        fprintf(stderr, "test_vsim_sim: machine: %s\n", um_last_error());
        exit(1);
    }
    return m;
}

/* The host and one GPU of `memory` on 1 GB/s links of `latency`, whose
 * gemm on tiles of 1024 takes `gemm` (a time). */
static um__vs_machine *one_gpu(const char *memory, const char *latency, const char *gemm)
{
    char text[512];
    snprintf(text, sizeof text,
             "device name=host kind=host memory=1T\n"
             "device name=gpu kind=gpu memory=%s model=g\n"
             "link from=host to=gpu bandwidth=1G latency=%s\n"
             "link from=gpu to=host bandwidth=1G latency=%s\n"
             "compute model=g kernel=gemm tile=1024 seconds=%s\n",
             memory, latency, latency, gemm);
    return load(text);
}

/* One gemm of one 4 MiB tile: A's and B's fetches share the 1 GB/s link
 * after its 1 ms latency (C = A B is written, not read), the kernel takes
 * 0.5 s, and C goes home. */
static void test_one_task(void)
{
    um__vs_machine *m = one_gpu("1G", "1ms", "0.5");
    um__vs_dag d;
    CHECK_EQ(um__vs_dag_gemm(1024, 1024, &d), 0);
    um__vs_result *r = malloc(sizeof *r);
    for (int p = 0; p < 4; p++) {
        CHECK_OK(um__vs_simulate(m, &d, policies[p], r));
        double tile = 4194304.0, in = 0.001 + 2 * tile / 1e9;
        CHECK_NEAR(r->makespan_s, in + 0.5, 1e-9);
        CHECK_NEAR(r->home_s, in + 0.5 + 0.001 + tile / 1e9, 1e-9);
        CHECK_NEAR(r->lower_bound_s, 0.5, 1e-12);
        CHECK_NEAR(r->busy_s[1], 0.5, 1e-9);
        CHECK_EQ(r->tasks_on[1], 1);
        CHECK_EQ(r->copies, 3);
        CHECK_NEAR(r->link_bytes[0][1], 2 * tile, 1e-12);
        CHECK_NEAR(r->link_bytes[1][0], tile, 1e-12);
        CHECK_EQ(r->evictions, 0);
    }
    free(r);
    um__vs_dag_free(&d);
    free(m);
}

/* A GPU of four tiles runs a gemm of 2 x 2 tiles (12 tiles, 3 per task):
 * it must evict, write dirty C tiles home, and still bring every C tile
 * back exactly as often as it left dirty. */
static void test_eviction(void)
{
    um__vs_machine *m = one_gpu("16M", "0", "0.01");
    um__vs_dag d;
    CHECK_EQ(um__vs_dag_gemm(2048, 1024, &d), 0);
    um__vs_result *r = malloc(sizeof *r);
    for (int p = 0; p < 4; p++) {
        CHECK_OK(um__vs_simulate(m, &d, policies[p], r));
        CHECK_EQ(r->tasks_on[1], 8);
        CHECK(r->evictions > 0);
        CHECK(r->writebacks > 0);
        /* Every C tile reaches the host (by write-back or at the end). */
        CHECK(r->link_bytes[1][0] >= 4 * 4194304.0);
        CHECK(r->makespan_s >= r->lower_bound_s);
    }
    /* Two tiles of memory: a gemm's three never fit. */
    um__vs_machine *tiny = one_gpu("8M", "0", "0.01");
    CHECK_STATUS(um__vs_simulate(tiny, &d, UM_SCHED_COST, r), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("gemm", "3 tiles", NULL);
    /* A machine that cannot run the kernel at all. */
    um__vs_dag c;
    CHECK_EQ(um__vs_dag_cholesky(2048, 1024, &c), 0);
    CHECK_STATUS(um__vs_simulate(m, &c, UM_SCHED_COST, r), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("potrf", "no device", NULL);
    um__vs_dag_free(&c);
    free(tiny);
    free(r);
    um__vs_dag_free(&d);
    free(m);
}

/* A GPU whose memory holds exactly one gemm's three tiles: in the runtime
 * engine the background reclaimer evicted the replica that the worker's
 * own reclaim was about to take, and the worker's allocation failed with
 * that memory free ("nothing left to evict: 2 acquired replicas"), though
 * it fits. Every policy must finish, and the model engine agrees. */
static void test_room_for_one_task(void)
{
    um__vs_machine *m = load("device name=host kind=host memory=1T\n"
                             "device name=gpu kind=gpu memory=768K granularity=64K model=g\n"
                             "link from=host to=gpu bandwidth=1G latency=0us\n"
                             "link from=gpu to=host bandwidth=1G latency=0us\n"
                             "compute model=g kernel=gemm gflops=5\n");
    um__vs_dag d;
    CHECK_EQ(um__vs_dag_gemm(1024, 256, &d), 0);
    um__vs_result *r = malloc(sizeof *r);
    for (int p = 0; p < 4; p++) {
        uint64_t forced = 1;
        um_status st = um__vs_run_runtime(m, &d, policies[p], r, &forced);
        CHECK_OK(st);
        if (st != UM_OK)
            fprintf(stderr, "policy %d: %s\n", policies[p], um_last_error());
        else
            CHECK(r->makespan_s >= r->lower_bound_s);
        CHECK_OK(um__vs_simulate(m, &d, policies[p], r));
    }
    free(r);
    um__vs_dag_free(&d);
    free(m);
}

/* The address space device dev's pool reserved, from a trace_file's
 * "backend reserve" event (0: none found). */
static uint64_t reserved_in_trace(const char *path, int dev)
{
    FILE *f = fopen(path, "r");
    char line[512], pid[32];
    snprintf(pid, sizeof pid, "\"pid\":%d,", dev);
    uint64_t bytes = 0;
    while (f && !bytes && fgets(line, sizeof line, f)) {
        const char *b = strstr(line, "\"bytes\":");
        if (strstr(line, "\"backend reserve\"") && strstr(line, pid) && b)
            bytes = strtoull(b + 8, NULL, 10);
    }
    if (f)
        fclose(f);
    return bytes;
}

/* A limit below a GPU's memory (`unimem sim --limit`) is one set on a
 * device of the machine's memory, as a program limits a GPU. The runtime
 * engine made the device of the limit alone: its pool reserved address
 * space for the limit only, and the 16 MiB its link measurement took at
 * the start and freed split that space, so that a GPU limited to eight
 * 256 MiB tiles held seven once the tiles were scattered (GEMM n 65536,
 * 2 GiB: 11.4 s against 11.0-11.2 now). Both engines fill the GPU to the
 * limit and never past it; the runtime engine's device is the machine's. */
static void test_limit_below_memory(void)
{
    um__vs_machine *m = load("device name=host kind=host memory=1T\n"
                             "device name=gpu kind=gpu memory=141G model=g\n"
                             "link from=host to=gpu bandwidth=50G latency=0us\n"
                             "link from=gpu to=host bandwidth=50G latency=0us\n"
                             "compute model=g kernel=gemm gflops=50000\n");
    const uint64_t tile_bytes = 256u << 20;
    m->dev[1].memory = 8 * tile_bytes; /* what --limit 2G does */
    um__vs_dag d;
    CHECK_EQ(um__vs_dag_gemm(32768, 8192, &d), 0); /* 48 tiles of 256 MiB */
    um__vs_result *r = malloc(sizeof *r);
    char trace[64], conf[512];
    snprintf(trace, sizeof trace, "/tmp/test_vsim_limit_%d.json", (int)getpid());
    /* The trace, and the pool, whose one reservation is the device's
     * memory, after whatever UNIMEM_CONF the run was given (put back). */
    const char *given = getenv("UNIMEM_CONF");
    char *kept = given ? strdup(given) : NULL;
    snprintf(conf, sizeof conf, "%s%strace_file=%s,allocator=pool", given ? given : "",
             given ? "," : "", trace);
    for (int engine = 0; engine < 2; engine++) {
        uint64_t forced = 1;
        if (engine)
            setenv("UNIMEM_CONF", conf, 1);
        CHECK_OK(engine ? um__vs_run_runtime(m, &d, UM_SCHED_COST, r, &forced)
                        : um__vs_simulate(m, &d, UM_SCHED_COST, r));
        if (kept)
            setenv("UNIMEM_CONF", kept, 1);
        else
            unsetenv("UNIMEM_CONF");
        printf("test_vsim_sim: %s engine: the GPU held at most %llu MiB of a 2048 MiB limit\n",
               engine ? "runtime" : "model", (unsigned long long)(r->peak_bytes[1] >> 20));
        CHECK_EQ(r->peak_bytes[1], 8 * tile_bytes);
        CHECK(r->peak_bytes[0] >= d.ntiles * tile_bytes); /* the host holds every tile */
        CHECK(r->evictions > 0);
    }
    uint64_t reserved = reserved_in_trace(trace, 1);
    printf("test_vsim_sim: the runtime engine's GPU reserved %llu MiB\n",
           (unsigned long long)(reserved >> 20));
    CHECK(reserved >= m->dev[1].capacity);
    unlink(trace);
    free(kept);
    free(r);
    um__vs_dag_free(&d);
    free(m);
}

/* The lower bound shares the work among the devices that can run the
 * graph's tasks only: a GPU with a time for potrf alone does not halve a
 * gemm's work bound (it did: 0.04 s for eight 0.01 s tasks that one GPU
 * must run, where the makespan cannot be below 0.08 s). */
static void test_bound_counts_capable_devices(void)
{
    um__vs_machine *m = load("device name=host kind=host memory=1T\n"
                             "device name=a kind=gpu memory=1G model=a\n"
                             "device name=b kind=gpu memory=1G model=b\n"
                             "link from=host to=a bandwidth=1G latency=0us\n"
                             "link from=a to=host bandwidth=1G latency=0us\n"
                             "link from=host to=b bandwidth=1G latency=0us\n"
                             "link from=b to=host bandwidth=1G latency=0us\n"
                             "compute model=a kernel=gemm tile=1024 seconds=0.01\n"
                             "compute model=b kernel=potrf tile=1024 seconds=0.01\n");
    um__vs_dag d;
    CHECK_EQ(um__vs_dag_gemm(2048, 1024, &d), 0);
    um__vs_result *r = malloc(sizeof *r);
    CHECK_OK(um__vs_simulate(m, &d, UM_SCHED_COST, r));
    CHECK_NEAR(r->work_bound_s, 0.08, 1e-12);
    CHECK_NEAR(r->lower_bound_s, 0.08, 1e-12);
    CHECK_EQ(r->tasks_on[1], 8);
    CHECK(r->makespan_s >= r->lower_bound_s);
    free(r);
    um__vs_dag_free(&d);
    free(m);
}

/* A random machine: 1-4 GPUs or sim devices with 4-12 tiles of memory or
 * plenty, host links shared or not, peers switched or absent, kernels at
 * random rates. */
static um__vs_machine *random_machine(uint64_t *rng, uint32_t tile)
{
    char text[2048];
    int gpus = 1 + (int)(harness_rand(rng) % 4);
    uint64_t tile_bytes = (uint64_t)tile * tile * 4;
    uint64_t mem = harness_rand(rng) % 3 ? (4 + harness_rand(rng) % 9) * tile_bytes : 1ull << 40;
    bool shared = harness_rand(rng) % 2, peers = harness_rand(rng) % 2;
    double bw = 1e8 * (double)(1 + harness_rand(rng) % 50);
    int n = snprintf(text, sizeof text,
                     "device name=host kind=host memory=1T\n"
                     "device name=gpu count=%d kind=%s memory=%llu model=g\n"
                     "link from=host to=gpu bandwidth=%.0f latency=%lluus%s\n"
                     "link from=gpu to=host bandwidth=%.0f latency=10us%s\n",
                     gpus, harness_rand(rng) % 2 ? "sim" : "gpu", (unsigned long long)mem, bw,
                     (unsigned long long)(harness_rand(rng) % 50), shared ? " shared=down" : "",
                     bw, shared ? " shared=up" : "");
    if (peers && gpus > 1)
        n += snprintf(text + n, sizeof text - (size_t)n,
                      "link from=gpu to=gpu bandwidth=%.0f latency=5us switched=1\n", 4 * bw);
    static const char *const kernels[] = {"gemm", "trsm", "syrk", "potrf"};
    for (int k = 0; k < 4; k++)
        n += snprintf(text + n, sizeof text - (size_t)n, "compute model=g kernel=%s gflops=%llu\n",
                      kernels[k], (unsigned long long)(1 + harness_rand(rng) % 200));
    return load(text);
}

static void test_random(uint64_t seed)
{
    uint64_t rng = seed ^ 0x51d;
    um__vs_result *r = malloc(sizeof *r), *again = malloc(sizeof *again);
    for (int round = 0; round < 60; round++) {
        uint32_t tile = 256, nt = 1 + (uint32_t)(harness_rand(&rng) % 5);
        um__vs_machine *m = random_machine(&rng, tile);
        um__vs_dag d;
        bool chol = harness_rand(&rng) % 2;
        CHECK_EQ(chol ? um__vs_dag_cholesky(nt * tile, tile, &d) : um__vs_dag_gemm(nt * tile, tile, &d),
                 0);
        double sum_min = 0;
        for (size_t i = 0; i < d.ntasks; i++) {
            double best = INFINITY;
            for (int dev = 1; dev < m->ndev; dev++)
                best = fmin(best, um__vs_compute_time(m, dev, d.tasks[i].kernel, tile,
                                                      d.tasks[i].flops));
            sum_min += best;
        }
        uint32_t written = chol ? d.ntiles : nt * nt;
        for (int p = 0; p < 4; p++) {
            um_status st = um__vs_simulate(m, &d, policies[p], r);
            CHECK_OK(st);
            if (st != UM_OK) {
                printf("test_vsim_sim: round %d (seed %llu), policy %d failed\n", round,
                       (unsigned long long)seed, policies[p]);
                continue;
            }
            uint64_t tasks = 0;
            double busy = 0, links = 0, home = 0;
            for (int dev = 0; dev < m->ndev; dev++) {
                tasks += r->tasks_on[dev];
                busy += r->busy_s[dev];
                CHECK(r->busy_s[dev] <= r->makespan_s * (1 + 1e-9));
                for (int o = 0; o < m->ndev; o++)
                    links += r->link_bytes[dev][o];
                home += dev ? r->link_bytes[dev][0] : 0;
            }
            CHECK_EQ(tasks, d.ntasks);
            CHECK_EQ(r->tasks_on[0], 0); /* the host runs no kernel here */
            CHECK_NEAR(busy, sum_min, 1e-6); /* one model for all GPUs: each time is the minimum */
            CHECK(r->makespan_s >= r->lower_bound_s * (1 - 1e-9));
            CHECK(r->makespan_s <= r->home_s);
            CHECK_NEAR(links, r->bytes_moved, 1e-12);
            CHECK_NEAR(r->bytes_moved, (double)r->copies * (double)d.tile_bytes, 1e-12);
            CHECK(home >= (double)written * (double)d.tile_bytes * (1 - 1e-12));
            /* The same input gives the same schedule. */
            CHECK_OK(um__vs_simulate(m, &d, policies[p], again));
            CHECK(again->makespan_s == r->makespan_s && again->copies == r->copies);
        }
        um__vs_dag_free(&d);
        free(m);
    }
    free(r);
    free(again);
}

/* A sim device runs one task at a time and prefetches the next tasks'
 * inputs only into free memory, as the runtime's cpu workers do; a gpu
 * launches ahead and fetches while it evicts. On a GEMM whose links bound
 * it, with memory for 12 tiles, the sim device's copies overlap less. */
static void test_sim_kind(void)
{
    double makespan[2];
    uint64_t evictions[2];
    um__vs_result *r = malloc(sizeof *r);
    for (int k = 0; k < 2; k++) {
        char text[1024];
        snprintf(text, sizeof text,
                 "device name=host kind=host memory=64G\n"
                 "device name=acc count=3 kind=%s memory=12M model=m\n"
                 "link from=host to=acc bandwidth=134M latency=0us\n"
                 "link from=acc to=host bandwidth=134M latency=0us\n"
                 "compute model=m kernel=gemm gflops=5\n",
                 k ? "sim" : "gpu");
        um__vs_machine *m = load(text);
        CHECK(m->dev[1].launches_ahead == (k == 0));
        um__vs_dag d;
        CHECK_EQ(um__vs_dag_gemm(3072, 512, &d), 0);
        CHECK_OK(um__vs_simulate(m, &d, UM_SCHED_COST, r));
        makespan[k] = r->makespan_s;
        evictions[k] = r->evictions;
        CHECK_EQ(r->tasks_on[1] + r->tasks_on[2] + r->tasks_on[3], d.ntasks);
        um__vs_dag_free(&d);
        free(m);
    }
    printf("test_vsim_sim: link-bound GEMM: gpu kind %.4f s (%llu evictions), sim kind %.4f s "
           "(%llu)\n", makespan[0], (unsigned long long)evictions[0], makespan[1],
           (unsigned long long)evictions[1]);
    CHECK(makespan[1] > 1.1 * makespan[0]);
    free(r);
}

/* Eight gemms of 1024-tiles on one GPU with a fast link: the first runs
 * alone (0.5 s); those that start as the one before ends take their packed
 * time (0.25 s), and a task that waited for its C tile's first step may
 * start a moment later, alone: 2.25-2.5 s, where times alone give 4 s.
 * Both bounds take each task's fastest time, here its packed one: the
 * work bound 8 of them, the critical path (two steps into each C tile) 2. */
static void test_packed(void)
{
    um__vs_machine *m = load("device name=host kind=host memory=1T\n"
                             "device name=gpu kind=gpu memory=1G model=g\n"
                             "link from=host to=gpu bandwidth=1T latency=0us\n"
                             "link from=gpu to=host bandwidth=1T latency=0us\n"
                             "compute model=g kernel=gemm tile=1024 seconds=0.5 packed=0.25\n");
    um__vs_dag d;
    CHECK_EQ(um__vs_dag_gemm(2048, 1024, &d), 0);
    CHECK_EQ(d.ntasks, 8u);
    um__vs_result *r = malloc(sizeof *r);
    CHECK_OK(um__vs_simulate(m, &d, UM_SCHED_COST, r));
    CHECK(r->makespan_s > 0.5 + 7 * 0.25 - 1e-3 && r->makespan_s < 2 * 0.5 + 6 * 0.25 + 1e-3);
    CHECK_NEAR(r->work_bound_s, 8 * 0.25, 1e-12);
    CHECK_NEAR(r->path_bound_s, 2 * 0.25, 1e-12);
    CHECK_NEAR(r->lower_bound_s, 2.0, 1e-12);
    free(r);
    um__vs_dag_free(&d);
    free(m);
}

/* Priorities in both engines: two GPUs, twenty lone 1 s tasks submitted
 * before a chain of ten. Oldest first, the lone ones fill both GPUs' queues
 * and the chain runs after them: 10 s + 10 s. By priority (dag.h: the
 * chain's head has the highest level, the lone ones the lowest) each
 * chain task goes before every lone task not yet started, so it waits
 * only for the two its GPU has started ahead of it (launched, or staged):
 * the chain takes 1 s a step for two steps, 3 s a step for four while
 * lone tasks are left, then 1 s a step: it ends at 18 s. Both engines
 * give 20 s when the priorities are left out. */
#define LONE 20
#define CHAIN 10
static void test_priorities(void)
{
    um__vs_machine *m = load("device name=host kind=host memory=1T\n"
                             "device name=gpu count=2 kind=gpu memory=1G model=g\n"
                             "link from=host to=gpu bandwidth=1T latency=0us\n"
                             "link from=gpu to=host bandwidth=1T latency=0us\n"
                             "compute model=g kernel=gemm tile=1024 seconds=1\n");
    um__vs_task tasks[LONE + CHAIN] = {0};
    for (int t = 0; t < LONE + CHAIN; t++) {
        tasks[t].kernel = UM_VS_GEMM;
        tasks[t].tile = 1024;
        tasks[t].flops = 2.0 * 1024 * 1024 * 1024;
        tasks[t].naccess = 1;
        /* The lone tasks have a tile each, the chain's share tile 0. */
        tasks[t].access[0] = (um__vs_access){t < LONE ? (uint32_t)t + 1 : 0, UM_VS_READ_WRITE};
    }
    um__vs_dag d = {.tasks = tasks, .ntasks = LONE + CHAIN, .ntiles = LONE + 1,
                    .tile_bytes = 4u << 20, .tile = 1024, .nt = 2};
    CHECK_EQ(um__vs_dag_derive_deps(&d), 0);
    um__vs_result *r = malloc(sizeof *r);
    CHECK_OK(um__vs_simulate(m, &d, UM_SCHED_COST, r));
    CHECK_NEAR(r->lower_bound_s, (LONE + CHAIN) / 2.0, 1e-12);
    CHECK_NEAR(r->makespan_s, 18.0, 1e-3);
    uint64_t forced = 1;
    CHECK_OK(um__vs_run_runtime(m, &d, UM_SCHED_COST, r, &forced));
    CHECK_EQ(forced, 0);
    /* In the runtime, which GPU's worker takes a ready task first varies
     * with its threads' order, and one step of the chain may wait for a
     * third launched task: 18 or 19 s, never the 20 of submission order. */
    CHECK(r->makespan_s > 18.0 - 1e-3 && r->makespan_s < 19.0 + 1e-3);
    free(r);
    free(d.deps);
    free(m);
}


/* A dirty tile whose eviction's write-back is still in flight when a task
 * staged on the same GPU takes the copy again and writes it: what reaches
 * the host is the old contents. The model took it as current, freed the
 * GPU's copy, the only one of the new contents, and never brought those
 * home (4 tiles went up, the last at 17.78 s). One GPU of three 4 MiB
 * tiles, links of 1 TB/s down and 1 MB/s up, 1 GFLOP/s: t0 writes X
 * (0-1 s), tD writes W (1-2 s), tE writes V (2-3 s); at 1 s, t3 (writes
 * Z) evicts X; at 2 s, t2 (reads W, rewrites X) goes before t3 and runs
 * 3-4 s. Up, X's write-back shares the link with V's (from 3 s) and W's
 * (from 4 s) and ends at 4 + 1694304 * 3 / 1e6 s, stale; X goes up again,
 * beside V and W; V's ends at 6 s later, and t3 runs 0.5 s in its room:
 * makespan 15.582912 s. Then W, X and Z (flushed) share the link: home at
 * 21.97152 s, after five tiles up. */
static void test_stale_writeback(void)
{
    um__vs_machine *m = load("device name=host kind=host memory=1T\n"
                             "device name=gpu kind=gpu memory=12M model=g\n"
                             "link from=host to=gpu bandwidth=1T latency=0us\n"
                             "link from=gpu to=host bandwidth=1M latency=0us\n"
                             "compute model=g kernel=gemm gflops=1\n");
    /* t0, tD, tE, t3, t2 on tiles X = 0, W = 1, V = 2, Z = 3. */
    static const double flops[5] = {1e9, 1e9, 1e9, 0.5e9, 1e9};
    static const uint32_t tile[5] = {0, 1, 2, 3, 0};
    um__vs_task tasks[5] = {0};
    for (int t = 0; t < 5; t++) {
        tasks[t].kernel = UM_VS_GEMM;
        tasks[t].tile = 1024;
        tasks[t].flops = flops[t];
        tasks[t].naccess = 1;
        tasks[t].access[0] = (um__vs_access){tile[t], t == 4 ? UM_VS_READ_WRITE : UM_VS_WRITE};
    }
    tasks[4].naccess = 2;
    tasks[4].access[1] = (um__vs_access){1, UM_VS_READ};
    um__vs_dag d = {.tasks = tasks, .ntasks = 5, .ntiles = 4, .tile_bytes = 4u << 20,
                    .tile = 1024, .nt = 2};
    CHECK_EQ(um__vs_dag_derive_deps(&d), 0);
    um__vs_result *r = malloc(sizeof *r);
    for (int p = 0; p < 4; p++) {
        CHECK_OK(um__vs_simulate(m, &d, policies[p], r));
        CHECK_NEAR(r->makespan_s, 15.582912, 1e-9);
        CHECK_NEAR(r->home_s, 21.97152, 1e-9);
        CHECK_EQ(r->copies, 5);
        CHECK_NEAR(r->link_bytes[1][0], 5.0 * 4194304, 1e-12);
    }
    free(r);
    free(d.deps);
    free(m);
}

/* Links to and from the host that share one resource (shared=pcie both
 * ways): a copy between two GPUs goes through the host and crosses that
 * resource twice. The network model refused such a route, so the engine
 * never started the copy and stalled (UM_ERR_INTERNAL "stalled with 1 of
 * 2 tasks done"; the fuzzer's machine stalled eager and round_robin).
 * Here a gemm writes X on gpu0, the only GPU that runs gemm; a syrk that
 * reads X runs on gpu1, the only one that runs syrk. X goes up and down
 * the 1 GB/s bus at half its rate: makespan 1 + 2 * 4194304 / 1e9 + 1 s;
 * then X goes home from either GPU at the full rate. */
static void test_copy_through_a_shared_bus(void)
{
    um__vs_machine *m = load("device name=host kind=host memory=1T\n"
                             "device name=gpu0 kind=gpu memory=1G model=a\n"
                             "device name=gpu1 kind=gpu memory=1G model=b\n"
                             "link from=host to=gpu0 bandwidth=1G latency=0us shared=pcie\n"
                             "link from=gpu0 to=host bandwidth=1G latency=0us shared=pcie\n"
                             "link from=host to=gpu1 bandwidth=1G latency=0us shared=pcie\n"
                             "link from=gpu1 to=host bandwidth=1G latency=0us shared=pcie\n"
                             "compute model=a kernel=gemm gflops=1\n"
                             "compute model=b kernel=syrk gflops=1\n");
    um__vs_task tasks[2] = {{.kernel = UM_VS_GEMM, .tile = 1024, .flops = 1e9, .naccess = 1,
                             .access = {{0, UM_VS_WRITE}}},
                            {.kernel = UM_VS_SYRK, .tile = 1024, .flops = 1e9, .naccess = 1,
                             .access = {{0, UM_VS_READ}}}};
    um__vs_dag d = {.tasks = tasks, .ntasks = 2, .ntiles = 1, .tile_bytes = 4u << 20,
                    .tile = 1024, .nt = 1};
    CHECK_EQ(um__vs_dag_derive_deps(&d), 0);
    um__vs_result *r = malloc(sizeof *r);
    for (int p = 0; p < 4; p++) {
        CHECK_OK(um__vs_simulate(m, &d, policies[p], r));
        CHECK_NEAR(r->makespan_s, 2 + 2 * 4194304 / 1e9, 1e-9);
        CHECK_NEAR(r->home_s, 2 + 3 * 4194304 / 1e9, 1e-9);
        CHECK_EQ(r->tasks_on[1], 1);
        CHECK_EQ(r->tasks_on[2], 1);
        CHECK_EQ(r->copies, 2);
        CHECK_NEAR(r->link_bytes[1][2], 4194304, 1e-12);
    }
    free(r);
    free(d.deps);
    free(m);
}

/* ------------------------------------------------------ task traces */

/* Writes text (len bytes: it may hold a NUL) to a new file in path. */
static void write_file(char *path, const char *text, size_t len)
{
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    CHECK_EQ(write(fd, text, len), len);
    close(fd);
}

/* Bad traces the parser let through: a buffer id or size with a '-'
 * (strtoull negates it), the id 2^64-1 (its key wrapped to the map's
 * empty mark, so every use was a new tile with no dependency), a task
 * naming a buffer twice (the runtime engine failed on it later), and a
 * NUL byte, which was reported as a long line. Each is named with its
 * file and line. */
static void test_trace_errors(void)
{
    static const struct {
        const char *text, *want1, *want2;
    } bad[] = {
        {"task 1 gemm 100 -1:4096:r\ntask 2 gemm 100 -1:4096:rw\n", "line 1", "'-1:4096:r'"},
        {"task 1 gemm 100 1:-4096:r\n", "line 1", "'1:-4096:r'"},
        {"task 1 gemm 100 1:+4096:r\n", "line 1", "'1:+4096:r'"},
        {"task 1 gemm 100 18446744073709551615:4096:r\n"
         "task 2 gemm 100 18446744073709551615:8192:rw\n",
         "line 1", "18446744073709551615"},
        {"task 1 gemm 100 18446744073709551616:4096:r\n", "line 1", "ID:BYTES:MODE"},
        {"# two\ntask 1 gemm 100 1:4096:w 1:4096:r\n", "line 2", "buffer 1 twice"},
        {"task 1 gemm 100 2:4096:r 3:4096:r 2:4096:rw\n", "line 1", "buffer 2 twice"},
        /* Flops above 1e30: two of 1e308 in a chain summed to inf, and
         * every task's priority (its path's flops over the longest) to 0. */
        {"task 1 gemm 1e308 1:4096:rw\ntask 2 gemm 1e308 1:4096:rw\n", "line 1", "1e308"},
        {"task 1 gemm 1e30 1:4096:rw\ntask 2 gemm 1.1e30 1:4096:rw\n", "line 2", "1.1e30"},
        /* Nor a NaN, an infinity or a negative count, which submission
         * refuses too (um_task_submit). */
        {"task 1 gemm nan 1:4096:rw\n", "flops", "'nan'"},
        {"task 1 gemm inf 1:4096:rw\n", "flops", "'inf'"},
        {"task 1 gemm -1 1:4096:rw\n", "flops", "'-1'"},
        /* A task's id is a number, as the runtime writes it: a word there
         * (a name or flops shifted by one) was taken without a look. */
        {"task 1 gemm 100 1:4096:rw\ntask two gemm 100 1:4096:rw\n", "line 2", "'two'"},
        {"task -3 gemm 100 1:4096:rw\n", "line 1", "'-3'"},
    };
    char path[64];
    um__vs_dag d;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "/tmp/test_vsim_trace_XXXXXX");
        write_file(path, bad[i].text, strlen(bad[i].text));
        um_status st = um__vs_dag_trace(path, &d);
        CHECK_STATUS(st, UM_ERR_PARSE);
        CHECK_ERROR_MENTIONS(path, bad[i].want1, bad[i].want2);
        if (st == UM_OK)
            um__vs_dag_free(&d);
        CHECK(d.tasks == NULL && d.ntasks == 0);
        unlink(path);
    }
    static const char nul[] = "task 1 gemm 100 1:4096:rw\n"
                              "task 2 gemm 100 1:4096:rw\0garbage\n"
                              "task 3 gemm 100 1:4096:rw\n";
    snprintf(path, sizeof path, "/tmp/test_vsim_trace_XXXXXX");
    write_file(path, nul, sizeof nul - 1);
    um_status st = um__vs_dag_trace(path, &d);
    CHECK_STATUS(st, UM_ERR_PARSE);
    if (st == UM_OK)
        um__vs_dag_free(&d);
    CHECK_ERROR_MENTIONS(path, "line 2", "NUL byte");
    unlink(path);
    /* A line too long is still one, and a good trace still reads. */
    char *longline = malloc(5000);
    memset(longline, ' ', 4999);
    memcpy(longline, "task 1 gemm 1", 13);
    longline[4998] = '\n';
    longline[4999] = 0;
    snprintf(path, sizeof path, "/tmp/test_vsim_trace_XXXXXX");
    write_file(path, longline, strlen(longline));
    CHECK_STATUS(um__vs_dag_trace(path, &d), UM_ERR_PARSE);
    CHECK_ERROR_MENTIONS(path, "line 1", "longer than 4095");
    unlink(path);
    free(longline);
    static const char good[] = "# header\n"
                               "task 1 gemm 100 0:4096:w 7:4096:r\n"
                               "task 2 gemm 100 0:4096:r\n"
                               "task 3 gemm 100 18446744073709551614:16:rw";
    snprintf(path, sizeof path, "/tmp/test_vsim_trace_XXXXXX");
    write_file(path, good, sizeof good - 1);
    CHECK_OK(um__vs_dag_trace(path, &d));
    CHECK_EQ(d.ntasks, 3);
    CHECK_EQ(d.ntiles, 3);
    CHECK_EQ(um__vs_tile_size(&d, 2), 16);
    CHECK_EQ(d.tasks[1].ndeps, 1);
    um__vs_dag_free(&d);
    unlink(path);
}

/* A buffer whose floats are no square's (1000 bytes: 250 floats, 15.8
 * squared) is timed as the tile order the runtime engine rounds it to
 * (16), by the model engine and the bound too. Truncated to 15 in the
 * trace, the model engine and the bound took 1 s and the runtime engine
 * 2 s, twice the bound; a buffer of under 4 bytes was a tile of 0. */
static void test_trace_tile_order(void)
{
    um__vs_machine *m = load("device name=host kind=host memory=1T\n"
                             "device name=gpu kind=gpu memory=1G model=g\n"
                             "link from=host to=gpu bandwidth=10G latency=0us\n"
                             "link from=gpu to=host bandwidth=10G latency=0us\n"
                             "compute model=g kernel=gemm tile=15 seconds=1\n"
                             "compute model=g kernel=gemm tile=16 seconds=2\n");
    static const char text[] = "task 1 gemm 0 1:1000:rw\ntask 2 potrf 0 2:3:rw\n";
    char path[64];
    snprintf(path, sizeof path, "/tmp/test_vsim_trace_XXXXXX");
    write_file(path, text, strlen(text));
    um__vs_dag d;
    CHECK_OK(um__vs_dag_trace(path, &d));
    unlink(path);
    CHECK_EQ(d.tasks[0].tile, 16);
    CHECK_EQ(d.tasks[1].tile, 1);
    CHECK_EQ(d.tile, 16);
    d.ntasks = 1; /* the potrf's tile order only: no device runs it */
    um__vs_result *r = malloc(sizeof *r);
    CHECK_OK(um__vs_simulate(m, &d, UM_SCHED_COST, r));
    CHECK_NEAR(r->lower_bound_s, 2.0, 1e-12);
    double model = r->makespan_s;
    CHECK(model >= 2.0 && model < 2.0 + 1e-5);
    uint64_t forced = 1;
    CHECK_OK(um__vs_run_runtime(m, &d, UM_SCHED_COST, r, &forced));
    CHECK_EQ(forced, 0);
    CHECK_NEAR(r->makespan_s, model, 1e-6);
    d.ntasks = 2;
    um__vs_dag_free(&d);
    free(r);
    free(m);
}

/* The host and one GPU of 1 GiB, with links of bandwidth `up` (to the
 * GPU) and `down`, and the GPU's gemm given by `gemm` (a compute line's
 * rest). */
static um__vs_machine *gpu_of_1g(const char *up, const char *down, const char *gemm)
{
    char text[512];
    snprintf(text, sizeof text,
             "device name=host kind=host memory=1T\n"
             "device name=gpu kind=gpu memory=1G model=g\n"
             "link from=host to=gpu bandwidth=%s\n"
             "link from=gpu to=host bandwidth=%s\n"
             "compute model=g kernel=gemm %s\n",
             up, down, gemm);
    return load(text);
}

/* A task longer than UM_VS_MAX_SECONDS is refused by the model engine as
 * by the runtime engine: at 1 GFLOP/s a gemm of 1024 takes 2.1 s, at 1e-6
 * GFLOP/s 2.1e6 s. Accepted, 2.1e15 s gemms gave a makespan in which the
 * copies' 0.8 ms had vanished in rounding. */
static void test_too_long_a_task(void)
{
    static const char *const rates[] = {"1", "1e-6"};
    um__vs_dag d;
    CHECK_EQ(um__vs_dag_gemm(1024, 1024, &d), 0);
    um__vs_result *r = malloc(sizeof *r);
    for (int i = 0; i < 2; i++) {
        char gemm[64];
        snprintf(gemm, sizeof gemm, "gflops=%s", rates[i]);
        um__vs_machine *m = gpu_of_1g("10G", "10G", gemm);
        if (i == 0) {
            CHECK_OK(um__vs_simulate(m, &d, UM_SCHED_COST, r));
            CHECK_NEAR(r->lower_bound_s, 2.147483648, 1e-9);
        } else {
            CHECK_STATUS(um__vs_simulate(m, &d, UM_SCHED_COST, r), UM_ERR_INVALID);
            CHECK_ERROR_MENTIONS("gemm", "2.14748e+06 s", "1e+06 s");
        }
        free(m);
    }
    free(r);
    um__vs_dag_free(&d);
}

/* A link so slow that one tile's copy takes more than UM_VS_MAX_SECONDS
 * is refused by both engines, naming it. Accepted, bandwidth=1e-300 gave
 * the model engine a makespan of 8e306 s in which the gemm was busy 0 s,
 * and hung the runtime engine. At 5 B/s a tile of 4 MiB takes 8.4e5 s:
 * still a run. */
static void test_too_slow_a_link(void)
{
    static const char *const rates[] = {"5", "1e-300"};
    um__vs_dag d;
    CHECK_EQ(um__vs_dag_gemm(1024, 1024, &d), 0);
    um__vs_result *r = malloc(sizeof *r);
    for (int i = 0; i < 2; i++) {
        um__vs_machine *m = gpu_of_1g(rates[i], "1G", "tile=1024 seconds=1");
        if (i == 0) {
            CHECK_OK(um__vs_simulate(m, &d, UM_SCHED_COST, r));
            CHECK_NEAR(r->makespan_s, 2 * 4194304 / 5.0 + 1, 1e-6);
            CHECK_NEAR(r->busy_s[1], 1.0, 1e-9);
        } else {
            uint64_t forced = 0;
            CHECK_STATUS(um__vs_simulate(m, &d, UM_SCHED_COST, r), UM_ERR_INVALID);
            CHECK_ERROR_MENTIONS("4194304 bytes", "host->gpu", "1e+06 s");
            CHECK_STATUS(um__vs_run_runtime(m, &d, UM_SCHED_COST, r, &forced), UM_ERR_INVALID);
            CHECK_ERROR_MENTIONS("4194304 bytes", "host->gpu", "1e+06 s");
        }
        free(m);
    }
    free(r);
    um__vs_dag_free(&d);
}

/* Buffers near 2^64 bytes: a task's sum of them, and a device's used
 * memory plus one, wrapped to a few bytes, so that a 16 EiB buffer
 * staged on a GPU of 1 GiB (a run of 18 s on 1e18 B/s links) where the
 * task must be refused as fitting no device. */
static void test_huge_buffers(void)
{
    um__vs_machine *m = load("device name=host kind=host memory=1T\n"
                             "device name=gpu kind=gpu memory=1G model=g\n"
                             "link from=host to=gpu bandwidth=1e18\n"
                             "link from=gpu to=host bandwidth=1e18\n"
                             "compute model=g kernel=gemm tile=1024 seconds=1\n");
    static const char *const traces[] = {
        "task 1 other 0 1:4096:rw\ntask 2 other 0 1:4096:r 2:18446744073709551615:r\n",
        "task 1 other 0 1:9223372036854775808:r 2:9223372036854775808:r\n",
    };
    um__vs_result *r = malloc(sizeof *r);
    for (int i = 0; i < 2; i++) {
        char path[64];
        snprintf(path, sizeof path, "/tmp/test_vsim_trace_XXXXXX");
        write_file(path, traces[i], strlen(traces[i]));
        um__vs_dag d;
        CHECK_OK(um__vs_dag_trace(path, &d));
        unlink(path);
        CHECK_STATUS(um__vs_simulate(m, &d, UM_SCHED_COST, r), UM_ERR_INVALID);
        CHECK_ERROR_MENTIONS("other task", "18446744073709551615 bytes", "holds");
        um__vs_dag_free(&d);
    }
    free(r);
    free(m);
}

/* Every tile starts on the host: tiles that do not fit its memory are
 * refused by both engines, naming the sizes (48 tiles of 256 MiB ran
 * from a host of 1 GiB); the 3 tiles of one task fit it. */
static void test_host_too_small(void)
{
    um__vs_machine *m = load("device name=host kind=host memory=1G\n"
                             "device name=gpu kind=gpu memory=141G model=g\n"
                             "link from=host to=gpu bandwidth=55G\n"
                             "link from=gpu to=host bandwidth=55G\n"
                             "compute model=g kernel=gemm tile=8192 seconds=0.02\n");
    um__vs_result *r = malloc(sizeof *r);
    um__vs_dag d;
    CHECK_EQ(um__vs_dag_gemm(32768, 8192, &d), 0);
    CHECK_STATUS(um__vs_simulate(m, &d, UM_SCHED_COST, r), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("48 tiles (12884901888 bytes)", "host (1073741824 bytes)", NULL);
    /* The runtime engine says the same, before it starts (it failed with
     * the host pool's "cannot allocate", UM_ERR_NOMEM, midway). */
    uint64_t forced = 0;
    CHECK_STATUS(um__vs_run_runtime(m, &d, UM_SCHED_COST, r, &forced), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("48 tiles (12884901888 bytes)", "host (1073741824 bytes)", NULL);
    um__vs_dag_free(&d);
    CHECK_EQ(um__vs_dag_gemm(8192, 8192, &d), 0);
    CHECK_OK(um__vs_simulate(m, &d, UM_SCHED_COST, r));
    um__vs_dag_free(&d);
    free(r);
    free(m);
}

/* ------------------------------------------------------ unimem sim */

static char out[1 << 16];

/* Runs `unimem <args>` with stderr discarded; returns the exit status
 * (-1 if it did not exit). */
static int run_cli(const char *args)
{
    return harness_run_unimem(args, false, out, sizeof out);
}

#define CHECK_OUT_HAS(s)                                                                   \
    do {                                                                                   \
        harness_checks++;                                                                  \
        if (!strstr(out, (s)))                                                             \
            harness_report(__FILE__, __LINE__, "the output lacks %s:\n%s", (s), out);      \
    } while (0)
#define CHECK_OUT_LACKS(s)                                                                 \
    do {                                                                                   \
        harness_checks++;                                                                  \
        if (strstr(out, (s)))                                                              \
            harness_report(__FILE__, __LINE__, "the output has %s:\n%s", (s), out);        \
    } while (0)

/* Names with '"' and '\' (the parser takes them) come out escaped in the
 * JSON: the machine's, a device's, a link's ends, and the file's path
 * where the description names no machine. */
static void test_cli_json_names(void)
{
    char dir[] = "/tmp/test_vsim\"q\\XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[128], args[512];
    for (int named = 0; named < 2; named++) {
        snprintf(path, sizeof path, "%s/m%d", dir, named);
        FILE *f = fopen(path, "w");
        CHECK(f != NULL);
        if (!f)
            return;
        fprintf(f, "%s"
                   "device name=host kind=host memory=64G\n"
                   "device name=s\"x\\ kind=sim memory=1G model=m\n"
                   "link from=host to=s\"x\\ bandwidth=1G\n"
                   "link from=s\"x\\ to=host bandwidth=1G\n"
                   "compute model=m kernel=gemm gflops=5\n",
                named ? "machine name=a\"b\\c\n" : "");
        fclose(f);
        snprintf(args, sizeof args, "sim --machine '%s' --workload gemm --n 2048 --tile 1024 "
                 "--policy eager --json", path);
        CHECK_EQ(run_cli(args), 0);
        if (named) {
            CHECK_OUT_HAS("{\"machine\":\"a\\\"b\\\\c\",");
        } else {
            char want[160];
            snprintf(want, sizeof want, "{\"machine\":\"/tmp/test_vsim\\\"q\\\\%s/m0\",",
                     dir + strlen("/tmp/test_vsim\"q\\"));
            CHECK_OUT_HAS(want);
        }
        CHECK_OUT_HAS("{\"name\":\"s\\\"x\\\\\",\"tasks\":8,");
        CHECK_OUT_HAS("{\"from\":\"host\",\"to\":\"s\\\"x\\\\\",\"bytes\":");
        CHECK_OUT_HAS("{\"from\":\"s\\\"x\\\\\",\"to\":\"host\",\"bytes\":");
        unlink(path);
    }
    rmdir(dir);
}

/* A lower bound of 0 (a task of no flops; one of no buffers too, whose
 * makespan is 0 as well) has no ratio: null in the JSON, n/a in the text,
 * never inf or nan; a device's busy share of a makespan of 0 is n/a. (A
 * gemm of no buffers is one on a tile of 1, as the runtime engine times
 * it: not 0 s.) */
static void test_cli_no_ratio(void)
{
    static const char *const traces[] = {"task 1 other 0 1:4096:rw\n", "task 1 other 0\n"};
    for (int i = 0; i < 2; i++) {
        char path[64], args[256];
        snprintf(path, sizeof path, "/tmp/test_vsim_trace_XXXXXX");
        write_file(path, traces[i], strlen(traces[i]));
        for (int engine = 0; engine < 2; engine++) {
            const char *e = engine ? "runtime" : "model";
            snprintf(args, sizeof args, "sim --machine h200x1 --workload trace:%s --policy eager "
                     "--engine %s --json", path, e);
            CHECK_EQ(run_cli(args), 0);
            CHECK_OUT_HAS("\"lower_bound_s\":0.000000,");
            CHECK_OUT_HAS("\"makespan_over_bound\":null,");
            CHECK_OUT_LACKS("inf");
            CHECK_OUT_LACKS("nan");
            snprintf(args, sizeof args, "sim --machine h200x1 --workload trace:%s --policy eager "
                     "--engine %s", path, e);
            CHECK_EQ(run_cli(args), 0);
            CHECK_OUT_HAS("ratio n/a ");
            CHECK_OUT_LACKS("inf");
            CHECK_OUT_LACKS("nan");
        }
        unlink(path);
    }
    /* The model engine's makespan of a task of no buffers is 0. */
    char path[64], args[256];
    snprintf(path, sizeof path, "/tmp/test_vsim_trace_XXXXXX");
    write_file(path, traces[1], strlen(traces[1]));
    snprintf(args, sizeof args, "sim --machine h200x1 --workload trace:%s --policy eager", path);
    CHECK_EQ(run_cli(args), 0);
    CHECK_OUT_HAS("busy   0.0000 s (  n/a), held at most 0 B\n");
    unlink(path);
}

/* A trace whose copies add up to more than 2^64 bytes (24 copies of
 * buffers of 2^60) prints what moved: the sum was cast to uint64_t, which
 * is undefined there, and printed "moved 0 B". */
static void test_cli_exabytes_moved(void)
{
    char machine[64], trace[64], args[256];
    static const char desc[] = "device name=host kind=host memory=15000000T\n"
                               "device name=gpu kind=gpu memory=4000000T model=g\n"
                               "link from=host to=gpu bandwidth=1e18\n"
                               "link from=gpu to=host bandwidth=1e18\n"
                               "compute model=g kernel=other gflops=1\n";
    snprintf(machine, sizeof machine, "/tmp/test_vsim_machine_XXXXXX");
    write_file(machine, desc, strlen(desc));
    char text[1024] = "";
    for (int i = 1; i <= 12; i++)
        snprintf(text + strlen(text), sizeof text - strlen(text),
                 "task %d x 1e9 %d:1152921504606846976:rw\n", i, i);
    snprintf(trace, sizeof trace, "/tmp/test_vsim_trace_XXXXXX");
    write_file(trace, text, strlen(text));
    snprintf(args, sizeof args, "sim --machine %s --workload trace:%s --policy eager", machine,
             trace);
    CHECK_EQ(run_cli(args), 0);
    CHECK_OUT_HAS("moved 25165824.00 TiB ");
    CHECK_OUT_HAS("gpu -> host: 12582912.00 TiB\n");
    unlink(machine);
    unlink(trace);
}

/* The help says which devices the bound's work is spread over: those that
 * run some task of the graph (sim.c: um__vs_bounds), not "every device",
 * which on the built-ins counted the host, which runs none. */
static void test_cli_help_bound(void)
{
    CHECK_EQ(run_cli("sim --help"), 0);
    CHECK_OUT_HAS("the devices that run some task of the graph");
    CHECK_OUT_LACKS("every device and");
}

/* --n and --tile take decimal digits only: a sign or a leading space was
 * taken by strtoul ("+8192" ran as 8192). */
static void test_cli_counts_are_digits(void)
{
    CHECK_EQ(run_cli("sim --machine h200x1 --workload gemm --n 8192 --tile 4096"), 0);
    CHECK_EQ(run_cli("sim --machine h200x1 --workload gemm --n +8192 --tile 4096"), 2);
    CHECK_EQ(run_cli("sim --machine h200x1 --workload gemm --n ' 8192' --tile 4096"), 2);
    CHECK_EQ(run_cli("sim --machine h200x1 --workload gemm --n 8192 --tile +4096"), 2);
}

/* A chain of ten read-write gemms on one tile of one GPU: each starts as
 * the one before it ends and takes its packed time (0.5 s, then 0.25 s
 * each), so the makespan is 2.75 s. The critical path once took times
 * alone (5 s) and was above it: a bound must never be. */
static void test_bound_of_a_chain(void)
{
    um__vs_machine *m = load("device name=host kind=host memory=1T\n"
                             "device name=gpu kind=gpu memory=1G model=g\n"
                             "link from=host to=gpu bandwidth=1T latency=0us\n"
                             "link from=gpu to=host bandwidth=1T latency=0us\n"
                             "compute model=g kernel=gemm tile=1024 seconds=0.5 packed=0.25\n");
    char text[1024] = "", path[64];
    for (int i = 0; i < 10; i++)
        snprintf(text + strlen(text), sizeof text - strlen(text),
                 "task %d gemm 2147483648 0:4194304:rw\n", i);
    snprintf(path, sizeof path, "/tmp/test_vsim_chain_XXXXXX");
    write_file(path, text, strlen(text));
    um__vs_dag d;
    CHECK_OK(um__vs_dag_trace(path, &d));
    unlink(path);
    um__vs_result *r = malloc(sizeof *r);
    CHECK_OK(um__vs_simulate(m, &d, UM_SCHED_EAGER, r));
    CHECK_NEAR(r->makespan_s, 0.5 + 9 * 0.25, 1e-3);
    CHECK_NEAR(r->path_bound_s, 10 * 0.25, 1e-9);
    CHECK(r->lower_bound_s <= r->makespan_s);
    free(r);
    um__vs_dag_free(&d);
    free(m);
}

static int no_work(const um_task_exec *e)
{
    (void)e;
    return 0;
}

/* What um_task_submit takes, the task trace it writes (option task_trace)
 * must be readable: a task of 1e31 flops was taken at submission and
 * written, and the reader then refused the trace for it. One of exactly
 * 1e30 is both taken and read back; one above is refused at submission,
 * naming its flops, and never reaches the trace. */
static void test_trace_takes_what_submission_takes(void)
{
    static const double flops[] = {1e30, 1e31};
    for (int i = 0; i < 2; i++) {
        char path[64], conf[128];
        snprintf(path, sizeof path, "/tmp/test_vsim_bound_XXXXXX");
        int fd = mkstemp(path);
        CHECK(fd >= 0);
        if (fd < 0)
            return;
        close(fd);
        snprintf(conf, sizeof conf, "devices=sim:64M,task_trace=%s", path);
        um_context *ctx = NULL;
        CHECK_OK(um_init(conf, &ctx));
        if (!ctx)
            return;
        um_buffer *b = NULL;
        CHECK_OK(um_buffer_create(ctx, 4096, NULL, &b));
        um_task t = {.name = "gemm", .cpu = no_work, .device = -1, .nbuffers = 1,
                     .flops = flops[i]};
        t.buffers[0] = b;
        t.modes[0] = UM_ACCESS_READ_WRITE;
        um_task_id id;
        um_status st = um_task_submit(ctx, &t, &id);
        bool fits = flops[i] <= 1e30, submitted = st == UM_OK;
        CHECK_STATUS(st, fits ? UM_OK : UM_ERR_INVALID);
        if (!fits)
            CHECK_ERROR_MENTIONS("flops", "1e+31", NULL);
        CHECK_OK(um_wait_all(ctx));
        CHECK_OK(um_buffer_destroy(b));
        um_shutdown(ctx);
        /* A task that was taken is in the trace, and the trace reads. */
        um__vs_dag d;
        st = submitted ? um__vs_dag_trace(path, &d) : UM_OK;
        if (submitted && st != UM_OK)
            printf("test_trace_takes_what_submission_takes: the trace of a task of %g flops "
                   "does not read back: %s\n", flops[i], um_last_error());
        CHECK_OK(st);
        if (submitted && st == UM_OK) {
            CHECK_EQ(d.ntasks, 1);
            CHECK(d.ntasks == 1 && d.tasks[0].flops == flops[i]);
            um__vs_dag_free(&d);
        }
        unlink(path);
    }
}

int main(void)
{
    uint64_t seed = harness_seed("test_vsim_sim");
    test_sim_kind();
    test_one_task();
    test_packed();
    test_bound_of_a_chain();
    test_priorities();
    test_eviction();
    test_stale_writeback();
    test_copy_through_a_shared_bus();
    test_room_for_one_task();
    test_limit_below_memory();
    test_bound_counts_capable_devices();
    test_random(seed);
    test_trace_errors();
    test_trace_takes_what_submission_takes();
    test_trace_tile_order();
    test_too_long_a_task();
    test_too_slow_a_link();
    test_huge_buffers();
    test_host_too_small();
    test_cli_json_names();
    test_cli_no_ratio();
    test_cli_exabytes_moved();
    test_cli_help_bound();
    test_cli_counts_are_digits();
    return harness_finish("test_vsim_sim");
}
