/*
 * The task implementations of `unimem demo`: tile kernels of single
 * precision linear algebra for the host (OpenBLAS; they also run on
 * simulated devices, whose memory is host memory) and for CUDA GPUs
 * (cuBLAS, loaded at run time so that nothing of CUDA is needed to build or
 * to run without a GPU). Every tile is a column-major tile x tile matrix of
 * floats in one buffer. Uses only include/unimem.h.
 */
#ifndef UM_DEMO_BLAS_H
#define UM_DEMO_BLAS_H

#include "unimem.h"

#include <stdbool.h>
#include <stddef.h>

/* What a task's implementation needs besides its buffers; um_task.user
 * points at one, and `owner` is the caller's own (the done callback gets
 * the same pointer). */
typedef struct demo_op {
    int tile;     /* rows and columns of every tile */
    bool trans_b; /* gemm: C = alpha A B^T + beta C instead of alpha A B + beta C */
    float alpha, beta;
    void *owner;
} demo_op;

/* Buffers, in task order:
 *   gemm   A (read), B (read), C (read-write): C = alpha A op(B) + beta C
 *   trsm   L_kk (read), A_ik (read-write): A_ik = A_ik L_kk^-T
 *   syrk   A_ik (read), A_ii (read-write): lower part of A_ii -= A_ik A_ik^T
 *   potrf  A_kk (read-write): its lower part becomes L_kk, A_kk = L_kk L_kk^T
 * The cpu functions compute before they return; the cuda ones queue the
 * work on e->stream. Each returns 0, or non-zero when the library reports
 * an error (potrf: a matrix that is not positive definite). */
int demo_cpu_gemm(const um_task_exec *e);
int demo_cpu_trsm(const um_task_exec *e);
int demo_cpu_syrk(const um_task_exec *e);
int demo_cpu_potrf(const um_task_exec *e);
int demo_cuda_gemm(const um_task_exec *e);
int demo_cuda_trsm(const um_task_exec *e);
int demo_cuda_syrk(const um_task_exec *e);
/* potrf on a GPU through cuSOLVER, with a second buffer (write-discard)
 * of demo_cusolver_workspace() bytes as its workspace; the cpu version
 * ignores that buffer. */
int demo_cuda_potrf(const um_task_exec *e);

/* Loads cuBLAS once for the process (libcublas.so.13, then .12, then
 * libcublas.so). false, with the reason in why, when it cannot be loaded;
 * later calls give the first answer. */
bool demo_cublas_load(char *why, size_t why_len);
/* A GPU implementation that makes the cuBLAS handle of the stream it runs
 * on (one per stream: a handle's workspace must not serve two streams at
 * once; the first handle costs a good part of a second) and, given three
 * scratch tiles, runs one GEMM of their size (cuBLAS loads kernels on
 * first use). Run before the work on each of a GPU's streams, so none of
 * this is timed and a cuBLAS that cannot start is found before any task
 * depends on it. demo_cublas_ready says whether a handle was made. */
int demo_cuda_init(const um_task_exec *e);
/* The bytes cuSOLVER's POTRF needs as workspace at the tile's size (found
 * by demo_cuda_init, whose user is then the potrf op), 0 when cuSOLVER
 * could not be started: POTRF then runs on the host. */
size_t demo_cusolver_workspace(void);
/* Why POTRF has no GPU implementation (when demo_cusolver_workspace is 0). */
const char *demo_cusolver_why(void);
bool demo_cublas_ready(int dev, char *why, size_t why_len);
/* A GPU implementation that destroys the handle of its stream, on the
 * worker that made it, once the work is done (it always returns 0). */
int demo_cuda_fini(const um_task_exec *e);
/* Destroys the cuBLAS handles left (one per stream of each device) from
 * the calling thread: what a run that failed leaves. Call it
 * once the tasks are done, before the context that ran them is shut
 * down. */
void demo_cublas_release(void);

/* Loads OpenBLAS once for the process (with dlopen: see demo_blas.c for
 * why it is not linked). false, with the reason in why, when it cannot be
 * loaded; later calls give the first answer. Call it before any other
 * function here that uses OpenBLAS. */
bool demo_openblas_load(char *why, size_t why_len);
/* The demo's reference results, with OpenBLAS, on column-major n x n
 * matrices: c = a b, and the lower part of c = a a^T. */
void demo_ref_sgemm(int n, const float *a, const float *b, float *c);
void demo_ref_syrk(int n, const float *a, float *c);

/* Threads OpenBLAS uses for one call (at least 1), and the number it would
 * use by itself. */
void demo_blas_set_threads(int n);
int demo_blas_default_threads(void);

#endif
