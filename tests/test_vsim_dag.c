/* Tests of the simulator's task graphs (vsim/dag): the task, tile and flop
 * counts of tiled GEMM and Cholesky, hand-checked dependencies of small
 * cases, bad input, the dependency rule against a brute-force reference
 * (on the workloads and on random access sequences) with the ordering of
 * every conflicting pair, and the makespan lower bound against sums and
 * an independent longest path. */
#include "harness.h"
#include "vsim/dag.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

/* Relative comparison of doubles (absolute near zero). */
/* Every task's list is strictly ascending and names only earlier tasks,
 * inside the deps array. */
static void check_lists(const um__vs_dag *d)
{
    size_t total = 0;
    int bad = 0;
    for (size_t t = 0; t < d->ntasks; t++) {
        const um__vs_task *k = &d->tasks[t];
        total += k->ndeps;
        if ((size_t)k->first_dep + k->ndeps > d->ndeps_total) {
            bad++;
            continue;
        }
        for (uint32_t i = 0; i < k->ndeps; i++) {
            uint32_t p = d->deps[k->first_dep + i];
            if (p >= t || (i > 0 && d->deps[k->first_dep + i - 1] >= p))
                bad++;
        }
    }
    CHECK_EQ(bad, 0);
    CHECK_EQ(total, d->ndeps_total);
}

/* Checks task t's list against the n ids in want. */
static void check_deps(const um__vs_dag *d, size_t t, size_t n, const uint32_t *want)
{
    CHECK_EQ(d->tasks[t].ndeps, n);
    if (d->tasks[t].ndeps != n)
        return;
    for (size_t i = 0; i < n; i++)
        CHECK_EQ(d->deps[d->tasks[t].first_dep + i], want[i]);
}

/* ------------------------------------------------------------------ counts */

static void test_counts(void)
{
    const uint32_t T = 4;
    for (uint32_t nt = 1; nt <= 8; nt++) {
        uint32_t n = nt * T;
        double N = n, T3 = (double)T * T * T;
        um__vs_dag d;

        CHECK_EQ(um__vs_dag_gemm(n, T, &d), 0);
        CHECK_EQ(d.ntasks, nt * nt * nt);
        CHECK_EQ(d.ntiles, 3 * nt * nt);
        CHECK_EQ(d.tile_bytes, T * T * 4);
        CHECK_EQ(d.tile, T);
        CHECK_EQ(d.nt, nt);
        CHECK(strcmp(d.name, "gemm") == 0);
        /* Each C tile's chain of nt: nt - 1 edges. */
        CHECK_EQ(d.ndeps_total, nt * nt * (nt - 1));
        double flops = 0;
        size_t nother = 0;
        for (size_t t = 0; t < d.ntasks; t++) {
            flops += d.tasks[t].flops;
            nother += d.tasks[t].kernel != UM_VS_GEMM || d.tasks[t].flops != 2 * T3;
        }
        CHECK_EQ(nother, 0);
        CHECK_NEAR(flops, 2 * N * N * N, 1e-12);
        check_lists(&d);
        um__vs_dag_free(&d);
        CHECK(d.tasks == NULL && d.deps == NULL && d.ntasks == 0);

        CHECK_EQ(um__vs_dag_cholesky(n, T, &d), 0);
        size_t count[UM_VS_NKERNELS] = {0};
        flops = 0;
        for (size_t t = 0; t < d.ntasks; t++) {
            const um__vs_task *k = &d.tasks[t];
            count[k->kernel]++;
            flops += k->flops;
            double want = k->kernel == UM_VS_GEMM    ? 2 * T3
                          : k->kernel == UM_VS_POTRF ? T3 / 3
                                                     : T3;
            nother += k->flops != want;
        }
        CHECK_EQ(nother, 0);
        CHECK_EQ(count[UM_VS_POTRF], nt);
        CHECK_EQ(count[UM_VS_TRSM], nt * (nt - 1) / 2);
        CHECK_EQ(count[UM_VS_SYRK], nt * (nt - 1) / 2);
        CHECK_EQ(count[UM_VS_GEMM], nt * (nt - 1) * (nt - 2) / 6);
        CHECK_EQ(d.ntasks, nt + nt * (nt - 1) + nt * (nt - 1) * (nt - 2) / 6);
        CHECK_EQ(d.ntiles, nt * (nt + 1) / 2);
        CHECK_EQ(d.tile_bytes, T * T * 4);
        CHECK(strcmp(d.name, "cholesky") == 0);
        /* potrf T^3/3, trsm and syrk T^3, gemm 2T^3 sum to exactly N^3/3:
         * nt/3 + 2 nt(nt-1)/2 + 2 nt(nt-1)(nt-2)/6 = nt^3/3. */
        CHECK_NEAR(flops, N * N * N / 3, 1e-12);
        check_lists(&d);
        um__vs_dag_free(&d);
    }

    /* The demo's size: N = 131072 in 8192-tiles, nt = 16. */
    um__vs_dag d;
    CHECK_EQ(um__vs_dag_gemm(131072, 8192, &d), 0);
    CHECK_EQ(d.ntasks, 4096);
    CHECK_EQ(d.tile_bytes, 268435456ull);
    CHECK_EQ(d.nt, 16);
    um__vs_dag_free(&d);
    CHECK_EQ(um__vs_dag_cholesky(131072, 8192, &d), 0);
    CHECK_EQ(d.ntasks, 816);
    CHECK_EQ(d.ntiles, 136);
    check_lists(&d);
    um__vs_dag_free(&d);
    um__vs_dag_free(&d); /* twice, and NULL: both fine */
    um__vs_dag_free(NULL);

    CHECK(strcmp(um__vs_kernel_name(UM_VS_GEMM), "gemm") == 0);
    CHECK(strcmp(um__vs_kernel_name(UM_VS_TRSM), "trsm") == 0);
    CHECK(strcmp(um__vs_kernel_name(UM_VS_SYRK), "syrk") == 0);
    CHECK(strcmp(um__vs_kernel_name(UM_VS_POTRF), "potrf") == 0);
    CHECK(strcmp(um__vs_kernel_name(UM_VS_NKERNELS), "?") == 0);
}

/* ------------------------------------------------------ hand-checked cases */

static void test_small_cases(void)
{
    um__vs_dag d;

    /* GEMM nt = 2: task (i*2+j)*2+k; only the k-chain on each C tile. */
    CHECK_EQ(um__vs_dag_gemm(8, 4, &d), 0);
    CHECK_EQ(d.ntasks, 8);
    for (uint32_t t = 0; t < 8; t++) {
        uint32_t i = t / 4, j = t / 2 % 2, k = t % 2;
        CHECK_EQ(d.tasks[t].naccess, 3);
        CHECK_EQ(d.tasks[t].access[0].tile, i * 2 + k);
        CHECK_EQ(d.tasks[t].access[0].mode, UM_VS_READ);
        CHECK_EQ(d.tasks[t].access[1].tile, 4 + k * 2 + j);
        CHECK_EQ(d.tasks[t].access[1].mode, UM_VS_READ);
        CHECK_EQ(d.tasks[t].access[2].tile, 8 + i * 2 + j);
        CHECK_EQ(d.tasks[t].access[2].mode, k ? UM_VS_READ_WRITE : UM_VS_WRITE);
        uint32_t prev = t - 1;
        check_deps(&d, t, k, &prev);
    }
    CHECK_EQ(d.ndeps_total, 4);
    um__vs_dag_free(&d);

    /* Cholesky nt = 2: A00 = 0, A10 = 1, A11 = 2. */
    CHECK_EQ(um__vs_dag_cholesky(8, 4, &d), 0);
    CHECK_EQ(d.ntasks, 4);
    static const uint8_t kern2[] = {UM_VS_POTRF, UM_VS_TRSM, UM_VS_SYRK, UM_VS_POTRF};
    static const uint32_t tiles2[][2] = {{0, 0}, {0, 1}, {1, 2}, {2, 0}};
    for (size_t t = 0; t < 4; t++) {
        CHECK_EQ(d.tasks[t].kernel, kern2[t]);
        CHECK_EQ(d.tasks[t].naccess, t == 0 || t == 3 ? 1 : 2);
        CHECK_EQ(d.tasks[t].access[0].tile, tiles2[t][0]);
        if (d.tasks[t].naccess == 2) {
            CHECK_EQ(d.tasks[t].access[0].mode, UM_VS_READ);
            CHECK_EQ(d.tasks[t].access[1].tile, tiles2[t][1]);
            CHECK_EQ(d.tasks[t].access[1].mode, UM_VS_READ_WRITE);
        } else {
            CHECK_EQ(d.tasks[t].access[0].mode, UM_VS_READ_WRITE);
        }
    }
    check_deps(&d, 0, 0, NULL);
    check_deps(&d, 1, 1, (const uint32_t[]){0}); /* trsm after potrf of A00 */
    check_deps(&d, 2, 1, (const uint32_t[]){1}); /* syrk after trsm of A10 */
    check_deps(&d, 3, 1, (const uint32_t[]){2}); /* potrf after syrk of A11 */
    um__vs_dag_free(&d);

    /* Cholesky nt = 3: A00 0, A10 1, A11 2, A20 3, A21 4, A22 5.
     *  0 potrf(0)  1 trsm(0,1)  2 trsm(0,3)  3 syrk(1,2)  4 syrk(3,5)
     *  5 gemm(3,1,4)  6 potrf(2)  7 trsm(2,4)  8 syrk(4,5)  9 potrf(5) */
    CHECK_EQ(um__vs_dag_cholesky(12, 4, &d), 0);
    CHECK_EQ(d.ntasks, 10);
    static const uint8_t kern3[] = {UM_VS_POTRF, UM_VS_TRSM, UM_VS_TRSM, UM_VS_SYRK,
                                    UM_VS_SYRK,  UM_VS_GEMM, UM_VS_POTRF, UM_VS_TRSM,
                                    UM_VS_SYRK,  UM_VS_POTRF};
    for (size_t t = 0; t < 10; t++)
        CHECK_EQ(d.tasks[t].kernel, kern3[t]);
    CHECK_EQ(d.tasks[5].access[0].tile, 3);
    CHECK_EQ(d.tasks[5].access[1].tile, 1);
    CHECK_EQ(d.tasks[5].access[2].tile, 4);
    check_deps(&d, 0, 0, NULL);
    check_deps(&d, 1, 1, (const uint32_t[]){0});
    check_deps(&d, 2, 1, (const uint32_t[]){0});
    check_deps(&d, 3, 1, (const uint32_t[]){1});
    check_deps(&d, 4, 1, (const uint32_t[]){2});
    check_deps(&d, 5, 2, (const uint32_t[]){1, 2});
    check_deps(&d, 6, 1, (const uint32_t[]){3});
    check_deps(&d, 7, 2, (const uint32_t[]){5, 6});
    check_deps(&d, 8, 2, (const uint32_t[]){4, 7});
    check_deps(&d, 9, 1, (const uint32_t[]){8});
    um__vs_dag_free(&d);

    /* The reader rule by hand, on a sequence of one tile: W R R W R. */
    um__vs_task seq[5] = {0};
    const uint8_t modes[5] = {UM_VS_WRITE, UM_VS_READ, UM_VS_READ, UM_VS_WRITE, UM_VS_READ};
    for (int t = 0; t < 5; t++) {
        seq[t].naccess = 1;
        seq[t].access[0] = (um__vs_access){0, modes[t]};
    }
    um__vs_dag s = {.tasks = seq, .ntasks = 5, .ntiles = 1};
    CHECK_EQ(um__vs_dag_derive_deps(&s), 0);
    check_deps(&s, 0, 0, NULL);
    check_deps(&s, 1, 1, (const uint32_t[]){0});
    check_deps(&s, 2, 1, (const uint32_t[]){0});
    check_deps(&s, 3, 3, (const uint32_t[]){0, 1, 2}); /* last writer and both readers */
    check_deps(&s, 4, 1, (const uint32_t[]){3});
    free(s.deps);
}

/* --------------------------------------------------------------- bad input */

static void test_bad_input(void)
{
    um__vs_dag d;
    memset(&d, 0xab, sizeof d);
    CHECK_EQ(um__vs_dag_gemm(0, 4, &d), -1);
    CHECK(d.tasks == NULL && d.deps == NULL && d.ntasks == 0);
    CHECK_EQ(um__vs_dag_gemm(8, 0, &d), -1);
    CHECK_EQ(um__vs_dag_gemm(10, 4, &d), -1);
    CHECK_EQ(um__vs_dag_gemm(0x80000000u, 0x80000000u, &d), -1); /* T*T*4 overflows */
    CHECK_EQ(um__vs_dag_gemm(4000u * 1024, 1024, &d), -1);         /* 6.4e10 tasks */
    CHECK(d.tasks == NULL && d.deps == NULL && d.ntasks == 0);
    CHECK_EQ(um__vs_dag_cholesky(0, 4, &d), -1);
    CHECK_EQ(um__vs_dag_cholesky(8, 0, &d), -1);
    CHECK_EQ(um__vs_dag_cholesky(10, 4, &d), -1);
    CHECK(d.tasks == NULL && d.deps == NULL && d.ntasks == 0);
    CHECK_EQ(um__vs_dag_gemm(8, 4, NULL), -1);
    CHECK_EQ(um__vs_dag_cholesky(8, 4, NULL), -1);
    CHECK_EQ(um__vs_dag_gemm(4, 4, &d), 0); /* n == tile: one task */
    CHECK_EQ(d.ntasks, 1);
    CHECK_EQ(d.ndeps_total, 0);

    /* A bad access fails derive_deps and leaves the dag as it was. */
    uint32_t *deps = d.deps;
    d.tasks[0].access[2].tile = d.ntiles;
    CHECK_EQ(um__vs_dag_derive_deps(&d), -1);
    d.tasks[0].access[2].tile = 0;
    d.tasks[0].access[1].mode = 0;
    CHECK_EQ(um__vs_dag_derive_deps(&d), -1);
    d.tasks[0].access[1].mode = UM_VS_READ;
    d.tasks[0].naccess = UM_VS_MAX_ACCESS + 1; /* more tiles than a task may name */
    CHECK_EQ(um__vs_dag_derive_deps(&d), -1);
    d.tasks[0].naccess = 3;
    CHECK(d.deps == deps);
    CHECK_EQ(um__vs_dag_derive_deps(NULL), -1);
    um__vs_dag_free(&d);
}

/* --------------------------------------------------------- reference model */

/* Union of task t's modes on tile x (0: it does not touch x). */
static int mode_on(const um__vs_task *t, uint32_t x)
{
    int m = 0;
    for (int a = 0; a < t->naccess; a++)
        if (t->access[a].tile == x)
            m |= t->access[a].mode;
    return m;
}

/* edge[b * n + a] = 1 iff b depends on a by the rule, by its definition:
 * for each tile b touches, scan back to the last writer, taking it and,
 * if b writes, every reader passed on the way. */
static unsigned char *ref_edges(const um__vs_task *tasks, size_t n)
{
    unsigned char *edge = calloc(n ? n * n : 1, 1);
    for (size_t b = 0; b < n; b++)
        for (int ab = 0; ab < tasks[b].naccess; ab++) {
            uint32_t x = tasks[b].access[ab].tile;
            int mb = mode_on(&tasks[b], x);
            for (size_t a = b; a-- > 0;) {
                int ma = mode_on(&tasks[a], x);
                if (ma & UM_VS_WRITE) {
                    edge[b * n + a] = 1;
                    break;
                }
                if (ma && (mb & UM_VS_WRITE))
                    edge[b * n + a] = 1;
            }
        }
    return edge;
}

/* Whether a and b touch a common tile that at least one of them writes. */
static int conflict(const um__vs_task *a, const um__vs_task *b)
{
    for (int i = 0; i < a->naccess; i++) {
        int ma = mode_on(a, a->access[i].tile), mb = mode_on(b, a->access[i].tile);
        if (mb && ((ma | mb) & UM_VS_WRITE))
            return 1;
    }
    return 0;
}

/* Compares d's dependencies with the reference, and checks that every
 * edge is a conflict and every conflicting pair is ordered by a path. */
static void check_against_reference(const um__vs_dag *d, const char *what, uint64_t seed)
{
    size_t n = d->ntasks;
    unsigned char *edge = ref_edges(d->tasks, n);
    unsigned char *got = calloc(n ? n * n : 1, 1);
    unsigned char *reach = calloc(n ? n * n : 1, 1); /* reach[b*n+a]: a ->* b */
    size_t wrong = 0, unordered = 0, spurious = 0;
    for (size_t b = 0; b < n; b++)
        for (uint32_t i = 0; i < d->tasks[b].ndeps; i++)
            got[b * n + d->deps[d->tasks[b].first_dep + i]] = 1;
    for (size_t i = 0; i < n * n; i++)
        wrong += got[i] != edge[i];
    for (size_t b = 0; b < n; b++)
        for (uint32_t i = 0; i < d->tasks[b].ndeps; i++) {
            uint32_t a = d->deps[d->tasks[b].first_dep + i];
            spurious += !conflict(&d->tasks[a], &d->tasks[b]);
            reach[b * n + a] = 1;
            for (size_t c = 0; c < a; c++)
                reach[b * n + c] |= reach[a * n + c];
        }
    for (size_t b = 0; b < n; b++)
        for (size_t a = 0; a < b; a++)
            if (conflict(&d->tasks[a], &d->tasks[b]) && !reach[b * n + a])
                unordered++;
    if (wrong || spurious || unordered)
        printf("  %s (seed %llu): %zu wrong, %zu spurious, %zu unordered\n", what,
               (unsigned long long)seed, wrong, spurious, unordered);
    CHECK_EQ(wrong, 0);
    CHECK_EQ(spurious, 0);
    CHECK_EQ(unordered, 0);
    check_lists(d);
    free(edge);
    free(got);
    free(reach);
}

static void test_reference(uint64_t seed)
{
    uint64_t rng = seed;
    for (int round = 0; round < 40; round++) {
        um__vs_dag d;
        uint32_t T = 1 + (uint32_t)(harness_rand(&rng) % 8);
        uint32_t nt = 1 + (uint32_t)(harness_rand(&rng) % 6);
        CHECK_EQ(um__vs_dag_gemm(nt * T, T, &d), 0);
        check_against_reference(&d, "gemm", seed);
        um__vs_dag_free(&d);
        nt = 1 + (uint32_t)(harness_rand(&rng) % 9);
        CHECK_EQ(um__vs_dag_cholesky(nt * T, T, &d), 0);
        check_against_reference(&d, "cholesky", seed);
        um__vs_dag_free(&d);
    }

    /* Random sequences exercise what the workloads never do: writes after
     * readers, write-only accesses, a tile named twice by one task. */
    for (int round = 0; round < 300; round++) {
        size_t n = 1 + harness_rand(&rng) % 200;
        uint32_t ntiles = 1 + (uint32_t)(harness_rand(&rng) % 8);
        um__vs_task *tasks = calloc(n, sizeof *tasks);
        for (size_t t = 0; t < n; t++) {
            tasks[t].naccess = (uint8_t)(1 + harness_rand(&rng) % 3);
            for (int a = 0; a < tasks[t].naccess; a++) {
                tasks[t].access[a].tile = (uint32_t)(harness_rand(&rng) % ntiles);
                /* Reads twice as often as writes, as in real graphs. */
                uint64_t r = harness_rand(&rng) % 6;
                tasks[t].access[a].mode = r < 3 ? UM_VS_READ : r < 5 ? UM_VS_READ_WRITE : UM_VS_WRITE;
            }
        }
        um__vs_dag d = {.tasks = tasks, .ntasks = n, .ntiles = ntiles};
        CHECK_EQ(um__vs_dag_derive_deps(&d), 0);
        check_against_reference(&d, "random", seed);
        /* Deriving again replaces the lists with the same ones. */
        size_t total = d.ndeps_total;
        CHECK_EQ(um__vs_dag_derive_deps(&d), 0);
        CHECK_EQ(d.ndeps_total, total);
        um__vs_dag_free(&d);
    }
}

/* -------------------------------------------------------------- priorities */

/* The bottom level of task t by its definition (the most flops on a path
 * from t's start to the end), over the dependents found by scanning. */
static double bottom_level_ref(const um__vs_dag *d, size_t t, double *memo)
{
    if (memo[t] >= 0)
        return memo[t];
    double most = 0;
    for (size_t u = t + 1; u < d->ntasks; u++)
        for (uint32_t i = 0; i < d->tasks[u].ndeps; i++)
            if (d->deps[d->tasks[u].first_dep + i] == t) {
                double b = bottom_level_ref(d, u, memo);
                most = b > most ? b : most;
            }
    double flops = d->tasks[t].flops;
    return memo[t] = (flops > 0 ? flops : 1.0) + most;
}

static void test_priorities(uint64_t seed)
{
    /* A Cholesky of 2 x 2 tiles is one chain: potrf (T^3/3), trsm (T^3),
     * syrk (T^3), potrf; its levels are 8/3, 7/3, 4/3 and 1/3 T^3. */
    um__vs_dag d;
    int prio[4];
    CHECK_EQ(um__vs_dag_cholesky(2048, 1024, &d), 0);
    CHECK_EQ(d.ntasks, 4u);
    CHECK_EQ(um__vs_dag_priorities(&d, prio), 0);
    CHECK_EQ(prio[0], UM_VS_PRIORITY_MAX);
    CHECK_EQ(prio[1], 875000000);
    CHECK_EQ(prio[2], 500000000);
    CHECK_EQ(prio[3], 125000000);
    CHECK_EQ(um__vs_dag_priorities(NULL, prio), -1);
    CHECK_EQ(um__vs_dag_priorities(&d, NULL), -1);
    um__vs_dag_free(&d);

    /* Random graphs, some tasks without flops, against the definition. */
    uint64_t rng = seed ^ 0x9e3779b9u;
    for (int round = 0; round < 100; round++) {
        size_t n = 1 + harness_rand(&rng) % 120;
        uint32_t ntiles = 1 + (uint32_t)(harness_rand(&rng) % 6);
        um__vs_task *tasks = calloc(n, sizeof *tasks);
        for (size_t t = 0; t < n; t++) {
            tasks[t].naccess = (uint8_t)(1 + harness_rand(&rng) % 3);
            tasks[t].flops = harness_rand(&rng) % 4 ? (double)(harness_rand(&rng) % 1000) : 0;
            for (int a = 0; a < tasks[t].naccess; a++) {
                tasks[t].access[a].tile = (uint32_t)(harness_rand(&rng) % ntiles);
                tasks[t].access[a].mode = harness_rand(&rng) % 2 ? UM_VS_READ : UM_VS_READ_WRITE;
            }
        }
        um__vs_dag r = {.tasks = tasks, .ntasks = n, .ntiles = ntiles};
        CHECK_EQ(um__vs_dag_derive_deps(&r), 0);
        int *got = malloc(n * sizeof *got);
        double *memo = malloc(n * sizeof *memo), top = 0;
        for (size_t t = 0; t < n; t++)
            memo[t] = -1;
        for (size_t t = 0; t < n; t++) {
            double b = bottom_level_ref(&r, t, memo);
            top = b > top ? b : top;
        }
        CHECK_EQ(um__vs_dag_priorities(&r, got), 0);
        for (size_t t = 0; t < n; t++) {
            CHECK_EQ(got[t], (int)llround(memo[t] / top * UM_VS_PRIORITY_MAX));
            /* A task goes before everything that waits for it. */
            for (uint32_t i = 0; i < r.tasks[t].ndeps; i++)
                CHECK(got[r.deps[r.tasks[t].first_dep + i]] >= got[t]);
        }
        free(got);
        free(memo);
        um__vs_dag_free(&r);
    }
}

/* ------------------------------------------------------------- lower bound */

/* Per-device rates (flops per second) by kernel; 0 means "cannot run". */
typedef struct rates {
    double r[4][UM_VS_NKERNELS];
} rates;

static double time_of(const um__vs_task *t, int dev, void *arg)
{
    const rates *r = arg;
    double rate = r->r[dev < 4 ? dev : 0][t->kernel];
    return rate > 0 ? t->flops / rate : INFINITY;
}

static double unit_time(const um__vs_task *t, int dev, void *arg)
{
    (void)t;
    (void)dev;
    (void)arg;
    return 1;
}

static double never_potrf(const um__vs_task *t, int dev, void *arg)
{
    (void)dev;
    (void)arg;
    return t->kernel == UM_VS_POTRF ? INFINITY : 1;
}

/* The longest path with task t at w[t], over the reference edges, by
 * relaxing every edge until nothing changes (no use of task order). */
static double ref_longest_path(const um__vs_dag *d, const double *w)
{
    size_t n = d->ntasks;
    unsigned char *edge = ref_edges(d->tasks, n);
    double *fin = malloc((n ? n : 1) * sizeof *fin);
    for (size_t t = 0; t < n; t++)
        fin[t] = w[t];
    for (int changed = 1; changed;) {
        changed = 0;
        for (size_t b = n; b-- > 0;)
            for (size_t a = 0; a < n; a++)
                if (edge[b * n + a] && fin[a] + w[b] > fin[b]) {
                    fin[b] = fin[a] + w[b];
                    changed = 1;
                }
    }
    double best = 0;
    for (size_t t = 0; t < n; t++)
        if (fin[t] > best)
            best = fin[t];
    free(fin);
    free(edge);
    return best;
}

static void test_lower_bound(uint64_t seed)
{
    uint64_t rng = seed ^ 0x5bd1e995u;
    um__vs_dag d;
    double work, path, lb;

    /* GEMM nt = 4, T = 4: every task 128 flops, 128 s at rate 1. */
    rates one = {.r = {{1, 1, 1, 1}}};
    CHECK_EQ(um__vs_dag_gemm(16, 4, &d), 0);
    lb = um__vs_lower_bound(&d, 1, time_of, &one, &work, &path);
    CHECK(lb == 64 * 128.0);
    CHECK(work == 64 * 128.0);
    CHECK(path == 4 * 128.0); /* the k-chain */
    lb = um__vs_lower_bound(&d, 1000, time_of, &one, &work, &path);
    CHECK(lb == 4 * 128.0);
    CHECK(path == 4 * 128.0);
    CHECK_NEAR(work, 64 * 128.0 / 1000, 1e-12);
    lb = um__vs_lower_bound(&d, 16, time_of, &one, NULL, NULL); /* 8192/16 = 512 = path */
    CHECK(lb == 512);
    CHECK(um__vs_lower_bound(&d, 0, time_of, &one, NULL, NULL) == -1);
    CHECK(um__vs_lower_bound(&d, 1, NULL, &one, NULL, NULL) == -1);
    um__vs_dag_free(&d);

    for (int round = 0; round < 20; round++) {
        uint32_t T = 1 + (uint32_t)(harness_rand(&rng) % 64);
        uint32_t nt = 1 + (uint32_t)(harness_rand(&rng) % 8);
        rates r;
        for (int dev = 0; dev < 4; dev++)
            for (int k = 0; k < UM_VS_NKERNELS; k++)
                r.r[dev][k] = 1e3 * (double)(1 + harness_rand(&rng) % 1000);

        /* GEMM: 1 device sums; many devices give nt gemm times exactly. */
        CHECK_EQ(um__vs_dag_gemm(nt * T, T, &d), 0);
        double sum = 0;
        for (size_t t = 0; t < d.ntasks; t++)
            sum += time_of(&d.tasks[t], 0, &r);
        lb = um__vs_lower_bound(&d, 1, time_of, &r, &work, &path);
        CHECK_NEAR(lb, sum, 1e-12);
        CHECK_NEAR(work, sum, 1e-12);
        /* Devices 4 and up run at device 0's rates: the fastest of 0..3. */
        double g = INFINITY, chain = 0;
        for (int dev = 0; dev < 4; dev++)
            g = fmin(g, time_of(&d.tasks[0], dev, &r));
        for (uint32_t k = 0; k < nt; k++)
            chain += g;
        um__vs_lower_bound(&d, 1000, time_of, &r, &work, &path);
        CHECK(path == chain);
        um__vs_dag_free(&d);

        /* Cholesky on 4 devices of different speeds, one of which cannot
         * run potrf: each task at its fastest of the devices that can. */
        r.r[0][UM_VS_POTRF] = 0;
        CHECK_EQ(um__vs_dag_cholesky(nt * T, T, &d), 0);
        double *w = malloc(d.ntasks * sizeof *w);
        sum = 0;
        for (size_t t = 0; t < d.ntasks; t++) {
            w[t] = INFINITY;
            for (int dev = 0; dev < 4; dev++)
                w[t] = fmin(w[t], time_of(&d.tasks[t], dev, &r));
            sum += w[t];
        }
        double want_path = ref_longest_path(&d, w);
        lb = um__vs_lower_bound(&d, 4, time_of, &r, &work, &path);
        CHECK_NEAR(work, sum / 4, 1e-12);
        CHECK_NEAR(path, want_path, 1e-12);
        CHECK_NEAR(lb, fmax(sum / 4, want_path), 1e-12);
        lb = um__vs_lower_bound(&d, 1000, time_of, &r, &work, &path); /* devices 4+ as 0 */
        CHECK_NEAR(path, want_path, 1e-12);
        CHECK_NEAR(lb, want_path, 1e-12);
        CHECK_NEAR(work, sum / 1000, 1e-12);
        lb = um__vs_lower_bound(&d, 1, time_of, &r, &work, &path); /* device 0: no potrf */
        CHECK(isinf(lb) && isinf(work) && isinf(path));
        free(w);
        um__vs_dag_free(&d);

        /* Unit times: the known critical path of tiled Cholesky, 3nt - 2. */
        CHECK_EQ(um__vs_dag_cholesky(nt * T, T, &d), 0);
        lb = um__vs_lower_bound(&d, 1000, unit_time, NULL, &work, &path);
        CHECK(path == 3.0 * nt - 2);
        CHECK(lb == fmax(path, (double)d.ntasks / 1000));
        CHECK(isinf(um__vs_lower_bound(&d, 2, never_potrf, NULL, NULL, NULL)));
        um__vs_dag_free(&d);
    }

    /* Hand value: Cholesky nt = 3 at unit times, 0-1-3-6-7-8-9. */
    CHECK_EQ(um__vs_dag_cholesky(3, 1, &d), 0);
    um__vs_lower_bound(&d, 1000, unit_time, NULL, &work, &path);
    CHECK(path == 7);
    CHECK_NEAR(work, 10.0 / 1000, 1e-12);
    um__vs_dag_free(&d);

    um__vs_dag empty = {0};
    CHECK(um__vs_lower_bound(&empty, 1, unit_time, NULL, &work, &path) == 0);
    CHECK(work == 0 && path == 0);
}

/* ----------------------------------------------------------------- large */

/* This thread's CPU time: what building costs, whatever else the machine
 * runs (wall time under TSan beside a loaded suite reached 8.6 s). */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_large(void)
{
    um__vs_dag d;
    double t0 = cpu_s();
    CHECK_EQ(um__vs_dag_gemm(64 * 1024, 1024, &d), 0);
    double built = cpu_s() - t0;
    printf("test_vsim_dag: nt=64 gemm (%zu tasks) built in %.1f ms of CPU time\n", d.ntasks,
           built * 1e3);
    CHECK_EQ(d.ntasks, 262144);
    CHECK_EQ(d.ndeps_total, 64 * 64 * 63);
    /* A second in an optimized build; the sanitizers' instrumentation gets
     * five. */
    CHECK(built < (HARNESS_SANITIZED ? 5.0 : 1.0));
    check_lists(&d);
    /* Unit times: the chain is 64 long, the work 262144 / 1000. */
    double work, path;
    double lb = um__vs_lower_bound(&d, 1000, unit_time, NULL, &work, &path);
    CHECK(path == 64);
    CHECK_NEAR(work, 262.144, 1e-12);
    CHECK_NEAR(lb, 262.144, 1e-12);
    um__vs_dag_free(&d);

    CHECK_EQ(um__vs_dag_cholesky(64 * 1024, 1024, &d), 0);
    CHECK_EQ(d.ntasks, 64 + 64 * 63 + 64 * 63 * 62 / 6);
    check_lists(&d);
    um__vs_lower_bound(&d, 100000, unit_time, NULL, &work, &path);
    CHECK(path == 3 * 64 - 2);
    um__vs_dag_free(&d);
}

/* A recorded task trace: buffers numbered as first seen, their sizes
 * kept, names mapped to kernels, dependencies by the same rule; each bad
 * line named by its number. */
static void test_trace_file(void)
{
    char path[] = "/tmp/test_vsim_dag_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    close(fd);
    FILE *f = fopen(path, "w");
    fprintf(f, "# a comment\n"
               "task 1 potrf 100 7:4194304:rw\n"
               "\n"
               "task 2 scale 5e3 7:4194304:r 9:1024:wd\n"
               "task 3 trsm 200 7:4194304:r 9:1024:w\n");
    fclose(f);
    um__vs_dag d;
    CHECK_OK(um__vs_dag_trace(path, &d));
    CHECK_EQ(d.ntasks, 3);
    CHECK_EQ(d.ntiles, 2);
    CHECK_EQ(um__vs_tile_size(&d, 0), 4194304);
    CHECK_EQ(um__vs_tile_size(&d, 1), 1024);
    CHECK_EQ(d.tile_bytes, 4194304);
    CHECK_EQ(d.tasks[0].kernel, UM_VS_POTRF);
    CHECK_EQ(d.tasks[1].kernel, UM_VS_OTHER);
    CHECK_EQ(d.tasks[2].kernel, UM_VS_TRSM);
    CHECK_EQ(d.tasks[0].tile, 1024); /* 4 MiB of floats is 1024 x 1024 */
    CHECK_NEAR(d.tasks[1].flops, 5e3, 0);
    CHECK_EQ(d.tasks[1].access[1].mode, UM_VS_WRITE);
    CHECK_EQ(d.tasks[2].access[1].mode, UM_VS_READ_WRITE); /* w copies in, as rw */
    /* 2 reads 7 after 1 wrote it; 3 writes 9 after 2 wrote it (and reads 7). */
    CHECK_EQ(d.tasks[1].ndeps, 1);
    CHECK_EQ(d.deps[d.tasks[1].first_dep], 0);
    CHECK_EQ(d.tasks[2].ndeps, 2);
    um__vs_dag_free(&d);

    static const struct {
        const char *text, *want1, *want2;
    } bad[] = {
        {"task 1 gemm\n", "line 1", "flops"},
        {"# ok\ntask 1 gemm x 1:4:r\n", "line 2", "flops"},
        {"task 1 gemm 1 1:4:x\n", "line 1", "mode"},
        {"task 1 gemm 1 1:0:r\n", "line 1", "size"},
        {"task 1 gemm 1 1:4:r\ntask 2 gemm 1 1:8:r\n", "line 2", "had 4 bytes"},
        {"job 1 gemm 1\n", "line 1", "job"},
        {"task 1 gemm 1 7\n", "line 1", "ID:BYTES:MODE"},
        {"# nothing\n", "no task", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        f = fopen(path, "w");
        fputs(bad[i].text, f);
        fclose(f);
        CHECK_STATUS(um__vs_dag_trace(path, &d), UM_ERR_PARSE);
        CHECK_ERROR_MENTIONS(path, bad[i].want1, bad[i].want2);
        CHECK(d.tasks == NULL && d.ntasks == 0);
    }
    f = fopen(path, "w");
    fputs("task 1 gemm 1", f);
    for (int i = 0; i < 17; i++)
        fprintf(f, " %d:4:r", i);
    fputs("\n", f);
    fclose(f);
    CHECK_STATUS(um__vs_dag_trace(path, &d), UM_ERR_PARSE);
    CHECK_ERROR_MENTIONS("at most 16 buffers", NULL, NULL);
    unlink(path);
    CHECK_STATUS(um__vs_dag_trace(path, &d), UM_ERR_IO);
}

int main(void)
{
    uint64_t seed = harness_seed("test_vsim_dag");
    test_counts();
    test_small_cases();
    test_bad_input();
    test_reference(seed);
    test_lower_bound(seed);
    test_priorities(seed);
    test_large();
    test_trace_file();
    return harness_finish("test_vsim_dag");
}
