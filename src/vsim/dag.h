/*
 * vsim/dag: the task graphs of the virtual-time simulator's workloads
 * (tiled GEMM and right-looking tiled Cholesky, single precision) and the
 * makespan lower bound of a graph. Owns the task and dependency arrays of
 * a dag; there is no data, no thread and no clock here.
 *
 * Dependencies follow the task runtime's rule (src/run), applied to the
 * tasks in order, per tile: a task that reads a tile waits for the tile's
 * last writer; a task that writes it waits for the last writer and for
 * every reader since that write. Each task's list is sorted ascending and
 * holds no duplicates, and names only earlier tasks, so task order is a
 * topological order.
 */
#ifndef UM_VSIM_DAG_H
#define UM_VSIM_DAG_H

#include "../base/base.h"

#include <stddef.h>
#include <stdint.h>

/* OTHER: a recorded task of any other name (its time: machine.h). */
typedef enum um__vs_kernel {
    UM_VS_GEMM,
    UM_VS_TRSM,
    UM_VS_SYRK,
    UM_VS_POTRF,
    UM_VS_OTHER,
    UM_VS_NKERNELS
} um__vs_kernel;
/* "gemm", "trsm", "syrk", "potrf", "other"; "?" for anything else. */
const char *um__vs_kernel_name(um__vs_kernel k);

/* The most tiles (buffers) one task names, as um_task allows. */
#define UM_VS_MAX_ACCESS 16

typedef enum um__vs_mode { UM_VS_READ = 1, UM_VS_WRITE = 2, UM_VS_READ_WRITE = 3 } um__vs_mode;

typedef struct um__vs_access {
    uint32_t tile;
    uint8_t mode; /* um__vs_mode */
} um__vs_access;

typedef struct um__vs_task {
    uint8_t kernel;  /* um__vs_kernel */
    uint8_t naccess; /* <= UM_VS_MAX_ACCESS */
    um__vs_access access[UM_VS_MAX_ACCESS];
    uint32_t tile;   /* the tile order its kernel's time is looked up for */
    /* gemm 2T^3, trsm T^3, syrk T^3 (the full product, not the symmetric
     * half, so a Cholesky sums to exactly N^3/3), potrf T^3/3. */
    double flops;
    /* deps[first_dep .. first_dep+ndeps) of the dag: the earlier tasks
     * this one waits for. */
    uint32_t ndeps, first_dep;
} um__vs_task;

typedef struct um__vs_dag {
    um__vs_task *tasks;
    size_t ntasks;
    uint32_t *deps;
    size_t ndeps_total;
    uint32_t ntiles;     /* tiles are numbered 0..ntiles-1 */
    uint64_t tile_bytes; /* T*T*4; a recorded trace: its largest buffer */
    uint64_t *tile_size; /* bytes of each tile when they differ (a trace), else NULL */
    uint32_t tile;       /* T */
    uint32_t nt;         /* N / T */
    char name[16];       /* "gemm", "cholesky" or "trace" */
} um__vs_dag;

/* C = A B with A, B, C all nt x nt tiles (tile ids: A's tiles, then B's,
 * then C's, row-major each). For each (i, j), for k = 0..nt-1 in order, a
 * gemm reads A[i][k] and B[k][j] and read-writes C[i][j] (writes it
 * only, for k = 0); tasks are in i, j, k order (k innermost). Returns 0, or -1 when n or tile is 0, n is not
 * a multiple of tile, the graph is too large for 32-bit ids, or there is
 * no memory; then *out is zeroed and nothing is allocated. */
int um__vs_dag_gemm(uint32_t n, uint32_t tile, um__vs_dag *out);

/* Right-looking tiled Cholesky of the lower triangle. Tiles A[i][j],
 * i >= j, are numbered densely in row-major order of the lower triangle
 * (A[i][j] is i(i+1)/2 + j). For each k: potrf(A[k][k] rw); for i > k:
 * trsm(A[k][k] r, A[i][k] rw); for i > k: syrk(A[i][k] r, A[i][i] rw); for
 * i > k, for k < j < i: gemm(A[i][k] r, A[j][k] r, A[i][j] rw). Returns as
 * um__vs_dag_gemm does. */
int um__vs_dag_cholesky(uint32_t n, uint32_t tile, um__vs_dag *out);

/* Replaces d's dependencies with those derived from its tasks' accesses
 * by the rule above (d->tasks, ntasks and ntiles must be set; an access
 * to a tile >= ntiles, or naccess > UM_VS_MAX_ACCESS, is an error). The builders use it;
 * it is public so that other workloads, and tests, can use it too. A task
 * that names one tile twice is treated as one access with the union of
 * the modes. Returns 0, or -1 (d's old dependencies are kept). */
int um__vs_dag_derive_deps(um__vs_dag *d);

/* The tasks a program submitted, recorded by the option task_trace
 * (src/run; the format is in docs/DESIGN.md): one tile per buffer, of
 * the buffer's size; a task named gemm, trsm, syrk or potrf is that
 * kernel on tiles of the order its largest buffer has in floats, any
 * other is UM_VS_OTHER. Returns UM_OK, or an error naming the line. */
um_status um__vs_dag_trace(const char *path, um__vs_dag *out);

/* Bytes of tile i. */
static inline uint64_t um__vs_tile_size(const um__vs_dag *d, uint32_t i)
{
    return d->tile_size ? d->tile_size[i] : d->tile_bytes;
}

/* Frees what d holds and zeroes it; NULL and a zeroed dag are fine. */
void um__vs_dag_free(um__vs_dag *d);

/* Lower bound on the makespan on ndev devices, where time(t, dev, arg) is
 * task t's compute time on device dev (INFINITY where it cannot run). It
 * is max(work bound, critical path): the work bound is the sum over tasks
 * of each task's fastest time, over ndev; the critical path is the longest
 * path through the dependencies with every task at its fastest time.
 * Transfers are ignored (it is a bound). Writes the two parts to *work_s
 * and *path_s when they are not NULL. A task that runs nowhere makes the
 * bound INFINITY. Returns -1 (and writes nothing) when ndev < 1, time is
 * NULL or there is no memory. */
double um__vs_lower_bound(const um__vs_dag *d, int ndev,
                          double (*time)(const um__vs_task *t, int dev, void *arg), void *arg,
                          double *work_s, double *path_s);

/* The highest priority um__vs_dag_priorities gives. */
#define UM_VS_PRIORITY_MAX 1000000000
/* Each task's priority for the task runtime (um_task's priority): its
 * bottom level, the most flops on a path from its start to the graph's
 * end (its own included; a task without a flops figure counts one),
 * scaled to 0..UM_VS_PRIORITY_MAX in the same order. The tasks that the
 * rest of the graph waits on longest go first, as in HEFT's upward rank;
 * flops, not a machine's times, so that a program and the simulator of
 * it give the same order. prio has d->ntasks entries. Returns 0, or -1
 * (no memory, or dependencies not in task order). */
int um__vs_dag_priorities(const um__vs_dag *d, int *prio);
#endif /* UM_VSIM_DAG_H */
