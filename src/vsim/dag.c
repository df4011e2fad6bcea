/* Task graphs of the simulator's workloads and their makespan lower bound;
 * see dag.h. */
#include "dag.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* No task: task ids are below UINT32_MAX, so it marks an empty slot. */
#define NONE UINT32_MAX

const char *um__vs_kernel_name(um__vs_kernel k)
{
    switch (k) {
    case UM_VS_GEMM: return "gemm";
    case UM_VS_TRSM: return "trsm";
    case UM_VS_SYRK: return "syrk";
    case UM_VS_POTRF: return "potrf";
    case UM_VS_OTHER: return "other";
    default: return "?";
    }
}

void um__vs_dag_free(um__vs_dag *d)
{
    if (!d)
        return;
    free(d->tasks);
    free(d->deps);
    free(d->tile_size);
    memset(d, 0, sizeof *d);
}

/* ------------------------------------------------------------ dependencies */

/* One entry of a tile's list of readers since its last write. The lists
 * share one pool that never shrinks: a write just drops the list, which
 * keeps it O(1), and the pool cannot outgrow the number of accesses. */
typedef struct reader_node {
    uint32_t task, next;
} reader_node;

/* A growable array of task ids. */
typedef struct id_vec {
    uint32_t *v;
    size_t n, cap;
} id_vec;

static int vec_push(id_vec *a, uint32_t x)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 64;
        uint32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v)
            return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Sorts v[0..n) and drops repeats; returns the new length. Lists are
 * mostly one to three ids, where insertion sort beats qsort. */
static size_t sort_unique(uint32_t *v, size_t n)
{
    if (n <= 32) {
        for (size_t i = 1; i < n; i++) {
            uint32_t x = v[i];
            size_t j = i;
            for (; j > 0 && v[j - 1] > x; j--)
                v[j] = v[j - 1];
            v[j] = x;
        }
    } else {
        qsort(v, n, sizeof *v, cmp_u32);
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (m == 0 || v[m - 1] != v[i])
            v[m++] = v[i];
    return m;
}

int um__vs_dag_derive_deps(um__vs_dag *d)
{
    if (!d || (d->ntasks && !d->tasks) || d->ntasks >= NONE)
        return -1;
    size_t naccess = 0;
    for (size_t t = 0; t < d->ntasks; t++) {
        const um__vs_task *task = &d->tasks[t];
        if (task->naccess > UM_VS_MAX_ACCESS)
            return -1;
        for (int a = 0; a < task->naccess; a++)
            if (task->access[a].tile >= d->ntiles || task->access[a].mode < UM_VS_READ ||
                task->access[a].mode > UM_VS_READ_WRITE)
                return -1;
        naccess += task->naccess;
    }

    int rc = -1;
    uint32_t *last_writer = malloc((d->ntiles ? d->ntiles : 1) * sizeof *last_writer);
    uint32_t *head = malloc((d->ntiles ? d->ntiles : 1) * sizeof *head);
    reader_node *pool = malloc((naccess ? naccess : 1) * sizeof *pool);
    /* Each task's first dependency, written to the tasks only on success
     * so that a failure leaves d as it was. */
    uint32_t *first = malloc((d->ntasks + 1) * sizeof *first);
    id_vec deps = {0}, scratch = {0};
    uint32_t npool = 0;
    if (!last_writer || !head || !pool || !first)
        goto out;
    for (uint32_t i = 0; i < d->ntiles; i++)
        last_writer[i] = head[i] = NONE;
    /* The typical graph has about one edge per task or two: start there. */
    deps.cap = d->ntasks + 64;
    if (!(deps.v = malloc(deps.cap * sizeof *deps.v)))
        goto out;

    for (size_t t = 0; t < d->ntasks; t++) {
        const um__vs_task *task = &d->tasks[t];
        /* One entry per tile, with the union of its modes: a task that
         * reads and writes a tile is its writer, not also its reader. */
        uint32_t tile[UM_VS_MAX_ACCESS];
        uint8_t mode[UM_VS_MAX_ACCESS];
        int n = 0;
        for (int a = 0; a < task->naccess; a++) {
            int k = 0;
            while (k < n && tile[k] != task->access[a].tile)
                k++;
            if (k == n) {
                tile[n] = task->access[a].tile;
                mode[n++] = task->access[a].mode;
            } else {
                mode[k] |= task->access[a].mode;
            }
        }

        /* Every access waits for the last writer; a write also waits for
         * the readers since. All of it from the state before this task. */
        scratch.n = 0;
        for (int k = 0; k < n; k++) {
            if (last_writer[tile[k]] != NONE && vec_push(&scratch, last_writer[tile[k]]))
                goto out;
            if (mode[k] & UM_VS_WRITE)
                for (uint32_t r = head[tile[k]]; r != NONE; r = pool[r].next)
                    if (vec_push(&scratch, pool[r].task))
                        goto out;
        }
        size_t m = sort_unique(scratch.v, scratch.n);
        if (deps.n + m > NONE)
            goto out; /* first_dep is 32 bits */
        first[t] = (uint32_t)deps.n;
        for (size_t i = 0; i < m; i++)
            if (vec_push(&deps, scratch.v[i]))
                goto out;

        for (int k = 0; k < n; k++) {
            if (mode[k] & UM_VS_WRITE) {
                last_writer[tile[k]] = (uint32_t)t;
                head[tile[k]] = NONE;
            } else {
                pool[npool].task = (uint32_t)t;
                pool[npool].next = head[tile[k]];
                head[tile[k]] = npool++;
            }
        }
    }

    first[d->ntasks] = (uint32_t)deps.n;
    for (size_t t = 0; t < d->ntasks; t++) {
        d->tasks[t].first_dep = first[t];
        d->tasks[t].ndeps = first[t + 1] - first[t];
    }
    free(d->deps);
    d->deps = deps.v;
    d->ndeps_total = deps.n;
    deps.v = NULL;
    rc = 0;
out:
    free(last_writer);
    free(head);
    free(pool);
    free(first);
    free(deps.v);
    free(scratch.v);
    return rc;
}

/* --------------------------------------------------------------- workloads */

/* Checks the sizes and fills the common fields; ntasks and ntiles come
 * from the workload's counts of nt, which must fit 32-bit ids. */
static int dag_start(uint32_t n, uint32_t tile, uint64_t ntasks_of_nt(uint64_t),
                     uint64_t ntiles_of_nt(uint64_t), const char *name, um__vs_dag *out)
{
    memset(out, 0, sizeof *out);
    /* tile_bytes = T*T*4 must fit 64 bits. */
    if (n == 0 || tile == 0 || n % tile != 0 || tile >= (1u << 31))
        return -1;
    uint64_t nt = n / tile;
    uint64_t ntasks = ntasks_of_nt(nt), ntiles = ntiles_of_nt(nt);
    if (nt > 2000000 || ntasks >= NONE || ntiles >= NONE)
        return -1;
    if (!(out->tasks = calloc((size_t)ntasks, sizeof *out->tasks)))
        return -1;
    out->ntasks = (size_t)ntasks;
    out->ntiles = (uint32_t)ntiles;
    out->tile = tile;
    out->nt = (uint32_t)nt;
    out->tile_bytes = (uint64_t)tile * tile * 4;
    strncpy(out->name, name, sizeof out->name - 1);
    return 0;
}

/* Derives the dependencies of a filled dag, or frees it all. */
static int dag_finish(um__vs_dag *out)
{
    if (um__vs_dag_derive_deps(out) == 0)
        return 0;
    um__vs_dag_free(out);
    return -1;
}

static void set_task(um__vs_task *t, um__vs_kernel kernel, uint32_t tile, double flops,
                     int naccess, uint32_t t0, uint8_t m0, uint32_t t1, uint8_t m1, uint32_t t2,
                     uint8_t m2)
{
    t->kernel = (uint8_t)kernel;
    t->naccess = (uint8_t)naccess;
    t->access[0] = (um__vs_access){t0, m0};
    t->access[1] = (um__vs_access){t1, m1};
    t->access[2] = (um__vs_access){t2, m2};
    t->flops = flops;
    t->tile = tile;
}

/* nt is at most 2e6 here (checked before the task count matters), so
 * these products fit 64 bits. */
static uint64_t gemm_ntasks(uint64_t nt)
{
    return nt > 2000000 ? UINT64_MAX : nt * nt * nt;
}

static uint64_t gemm_ntiles(uint64_t nt)
{
    return nt > 2000000 ? UINT64_MAX : 3 * nt * nt;
}

int um__vs_dag_gemm(uint32_t n, uint32_t tile, um__vs_dag *out)
{
    if (!out || dag_start(n, tile, gemm_ntasks, gemm_ntiles, "gemm", out))
        return -1;
    uint32_t nt = out->nt;
    double T = tile, flops = 2.0 * T * T * T;
    uint32_t a0 = 0, b0 = nt * nt, c0 = 2 * nt * nt;
    size_t t = 0;
    for (uint32_t i = 0; i < nt; i++)
        for (uint32_t j = 0; j < nt; j++)
            for (uint32_t k = 0; k < nt; k++)
                /* C = A B, not C += A B: the first product writes C
                 * without reading it, as the demo's WRITE_DISCARD does. */
                set_task(&out->tasks[t++], UM_VS_GEMM, tile, flops, 3, a0 + i * nt + k,
                         UM_VS_READ, b0 + k * nt + j, UM_VS_READ, c0 + i * nt + j,
                         k ? UM_VS_READ_WRITE : UM_VS_WRITE);
    return dag_finish(out);
}

/* nt potrf, nt(nt-1)/2 trsm and syrk each, nt(nt-1)(nt-2)/6 gemm. */
static uint64_t chol_ntasks(uint64_t nt)
{
    if (nt > 2000000)
        return UINT64_MAX;
    return nt + nt * (nt - 1) + nt * (nt - 1) * (nt - 2) / 6;
}

static uint64_t chol_ntiles(uint64_t nt)
{
    return nt > 2000000 ? UINT64_MAX : nt * (nt + 1) / 2;
}

/* A[i][j], i >= j, in row-major order of the lower triangle. */
static uint32_t low(uint32_t i, uint32_t j)
{
    return (uint32_t)((uint64_t)i * (i + 1) / 2 + j);
}

int um__vs_dag_cholesky(uint32_t n, uint32_t tile, um__vs_dag *out)
{
    if (!out || dag_start(n, tile, chol_ntasks, chol_ntiles, "cholesky", out))
        return -1;
    uint32_t nt = out->nt;
    double T = tile, T3 = T * T * T;
    size_t t = 0;
    for (uint32_t k = 0; k < nt; k++) {
        set_task(&out->tasks[t++], UM_VS_POTRF, tile, T3 / 3, 1, low(k, k), UM_VS_READ_WRITE, 0,
                 0, 0, 0);
        for (uint32_t i = k + 1; i < nt; i++)
            set_task(&out->tasks[t++], UM_VS_TRSM, tile, T3, 2, low(k, k), UM_VS_READ, low(i, k),
                     UM_VS_READ_WRITE, 0, 0);
        for (uint32_t i = k + 1; i < nt; i++)
            set_task(&out->tasks[t++], UM_VS_SYRK, tile, T3, 2, low(i, k), UM_VS_READ, low(i, i),
                     UM_VS_READ_WRITE, 0, 0);
        for (uint32_t i = k + 1; i < nt; i++)
            for (uint32_t j = k + 1; j < i; j++)
                set_task(&out->tasks[t++], UM_VS_GEMM, tile, 2 * T3, 3, low(i, k), UM_VS_READ,
                         low(j, k), UM_VS_READ, low(i, j), UM_VS_READ_WRITE);
    }
    return dag_finish(out);
}

/* ------------------------------------------------------------- lower bound */

double um__vs_lower_bound(const um__vs_dag *d, int ndev,
                          double (*time)(const um__vs_task *t, int dev, void *arg), void *arg,
                          double *work_s, double *path_s)
{
    if (!d || ndev < 1 || !time || (d->ntasks && !d->tasks))
        return -1;
    /* Task order is topological (deps are earlier), so one pass finds
     * each task's earliest finish with unlimited devices. */
    double *finish = malloc((d->ntasks ? d->ntasks : 1) * sizeof *finish);
    if (!finish)
        return -1;
    double work = 0, path = 0;
    for (size_t t = 0; t < d->ntasks; t++) {
        const um__vs_task *task = &d->tasks[t];
        double best = INFINITY;
        for (int dev = 0; dev < ndev; dev++) {
            double x = time(task, dev, arg);
            if (x < best) /* NaN and INFINITY never win */
                best = x;
        }
        double start = 0;
        for (uint32_t i = 0; i < task->ndeps; i++) {
            uint32_t p = d->deps[task->first_dep + i];
            if (p >= t) {
                free(finish);
                return -1; /* not a dag in task order */
            }
            if (finish[p] > start)
                start = finish[p];
        }
        finish[t] = start + best;
        work += best;
        if (finish[t] > path)
            path = finish[t];
    }
    free(finish);
    work /= ndev;
    if (work_s)
        *work_s = work;
    if (path_s)
        *path_s = path;
    return work > path ? work : path;
}

int um__vs_dag_priorities(const um__vs_dag *d, int *prio)
{
    if (!d || !prio || (d->ntasks && !d->tasks))
        return -1;
    /* Task order is topological, so one backward pass: a task's level is
     * its cost plus the largest of its dependents', which are all later. */
    double *below = calloc(d->ntasks ? d->ntasks : 1, sizeof *below);
    if (!below)
        return -1;
    double top = 0;
    for (size_t t = d->ntasks; t-- > 0;) {
        const um__vs_task *task = &d->tasks[t];
        double level = below[t] + (task->flops > 0 ? task->flops : 1.0);
        below[t] = level;
        if (level > top)
            top = level;
        for (uint32_t i = 0; i < task->ndeps; i++) {
            uint32_t p = d->deps[task->first_dep + i];
            if (p >= t) {
                free(below);
                return -1;
            }
            if (level > below[p])
                below[p] = level;
        }
    }
    for (size_t t = 0; t < d->ntasks; t++)
        prio[t] = (int)llround(below[t] / top * UM_VS_PRIORITY_MAX);
    free(below);
    return 0;
}
