/*
 * The tile kernels of `unimem demo` (see demo_blas.h): OpenBLAS for the host
 * and simulated devices, cuBLAS for GPUs. cuBLAS is loaded with dlopen at
 * run time; each GPU gets one handle, made by the first task that runs
 * there (on the device's worker, where its context is current) and used
 * under that device's lock, since setting the stream and queuing the call
 * must not interleave with another thread's.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr */
#endif
#include "demo_blas.h"

#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* LAPACK's Cholesky factorisation (OpenBLAS carries LAPACK). The last
 * argument is the hidden length of the character argument that gfortran
 * passes; implementations without it ignore it. */
void spotrf_(const char *uplo, const blasint *n, float *a, const blasint *lda, blasint *info,
             size_t uplo_len);

/* A function pointer to fill from a loaded library. */
typedef struct symbol {
    void **slot;
    const char *name;
} symbol;

/* Fills every slot from lib; the name of the first symbol it lacks, or
 * NULL when it has them all. */
static const char *find_symbols(void *lib, const symbol *syms, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!(*syms[i].slot = dlsym(lib, syms[i].name)))
            return syms[i].name;
    return NULL;
}

/* ------------------------------------------------------------- OpenBLAS */

/* OpenBLAS is loaded when `unimem demo` starts, not linked: its library
 * constructor starts a thread pool whose threads spin (sched_yield) for
 * about 2^28 cycles before they sleep, so linked into the binary it ran the
 * first tenth of a second of every command, each benchmark's included,
 * beside one spinning thread per CPU but one. The file CMake found is tried
 * first (UM_OPENBLAS_PATH), then the library's usual name; LAPACK's spotrf_
 * comes from it or from the separate liblapack CMake found
 * (UM_LAPACK_PATH). */
#ifndef UM_OPENBLAS_PATH
#define UM_OPENBLAS_PATH "libopenblas.so.0"
#endif

static struct {
    pthread_mutex_t lock;
    bool tried, loaded;
    char why[320];
    __typeof__(cblas_sgemm) *sgemm;
    __typeof__(cblas_strsm) *strsm;
    __typeof__(cblas_ssyrk) *ssyrk;
    __typeof__(spotrf_) *spotrf;
    __typeof__(openblas_get_num_threads) *get_threads;
    __typeof__(openblas_set_num_threads) *set_threads;
} blas = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* dlopen of the first of names that loads (RTLD_GLOBAL: a separate
 * liblapack finds its BLAS routines in it), or NULL with dlerror's last
 * message in *err. */
static void *open_first(const char *const *names, size_t n, const char **err)
{
    for (size_t i = 0; i < n; i++) {
        if (!names[i])
            continue;
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
        if (lib)
            return lib;
        const char *e = dlerror();
        *err = e ? e : "unknown error";
    }
    return NULL;
}

static void load_openblas(void)
{
    static const char *const blas_names[] = {UM_OPENBLAS_PATH, "libopenblas.so.0",
                                             "libopenblas.so"};
    const char *err = "not looked for";
    void *lib = open_first(blas_names, sizeof blas_names / sizeof blas_names[0], &err);
    if (!lib) {
        snprintf(blas.why, sizeof blas.why,
                 "OpenBLAS not found (dlopen %s, libopenblas.so.0 and libopenblas.so: last "
                 "error: %s); on Debian: apt-get install libopenblas0",
                 UM_OPENBLAS_PATH, err);
        return;
    }
    symbol syms[] = {
        {(void **)&blas.sgemm, "cblas_sgemm"},
        {(void **)&blas.strsm, "cblas_strsm"},
        {(void **)&blas.ssyrk, "cblas_ssyrk"},
        {(void **)&blas.get_threads, "openblas_get_num_threads"},
        {(void **)&blas.set_threads, "openblas_set_num_threads"},
    };
    const char *missing = find_symbols(lib, syms, sizeof syms / sizeof syms[0]);
    if (missing) {
        snprintf(blas.why, sizeof blas.why, "the OpenBLAS library found lacks %s", missing);
        return;
    }
    blas.spotrf = (__typeof__(spotrf_) *)dlsym(lib, "spotrf_");
#ifdef UM_LAPACK_PATH
    if (!blas.spotrf) {
        static const char *const lapack_names[] = {UM_LAPACK_PATH, "liblapack.so.3"};
        void *lapack = open_first(lapack_names, 2, &err);
        if (lapack)
            blas.spotrf = (__typeof__(spotrf_) *)dlsym(lapack, "spotrf_");
    }
#endif
    if (!blas.spotrf) {
        snprintf(blas.why, sizeof blas.why,
                 "neither the OpenBLAS library found nor a liblapack has LAPACK's spotrf_");
        return;
    }
    blas.loaded = true;
}

bool demo_openblas_load(char *why, size_t why_len)
{
    pthread_mutex_lock(&blas.lock);
    if (!blas.tried) {
        blas.tried = true;
        load_openblas();
    }
    bool ok = blas.loaded;
    if (!ok && why && why_len)
        snprintf(why, why_len, "%s", blas.why);
    pthread_mutex_unlock(&blas.lock);
    return ok;
}

void demo_ref_sgemm(int n, const float *a, const float *b, float *c)
{
    blas.sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
}

void demo_ref_syrk(int n, const float *a, float *c)
{
    blas.ssyrk(CblasColMajor, CblasLower, CblasNoTrans, n, n, 1.0f, a, n, 0.0f, c, n);
}

static const demo_op *op_of(const um_task_exec *e)
{
    return (const demo_op *)e->user;
}

int demo_cpu_gemm(const um_task_exec *e)
{
    const demo_op *op = op_of(e);
    const float *a = e->ptrs[0], *b = e->ptrs[1];
    float *c = e->ptrs[2];
    int t = op->tile;
    blas.sgemm(CblasColMajor, CblasNoTrans, op->trans_b ? CblasTrans : CblasNoTrans, t, t, t,
               op->alpha, a, t, b, t, op->beta, c, t);
    return 0;
}

int demo_cpu_trsm(const um_task_exec *e)
{
    const demo_op *op = op_of(e);
    const float *l = e->ptrs[0];
    float *a = e->ptrs[1];
    int t = op->tile;
    blas.strsm(CblasColMajor, CblasRight, CblasLower, CblasTrans, CblasNonUnit, t, t, 1.0f, l, t, a,
               t);
    return 0;
}

int demo_cpu_syrk(const um_task_exec *e)
{
    const demo_op *op = op_of(e);
    const float *a = e->ptrs[0];
    float *c = e->ptrs[1];
    int t = op->tile;
    blas.ssyrk(CblasColMajor, CblasLower, CblasNoTrans, t, t, -1.0f, a, t, 1.0f, c, t);
    return 0;
}

int demo_cpu_potrf(const um_task_exec *e)
{
    const demo_op *op = op_of(e);
    float *a = e->ptrs[0];
    blasint t = op->tile, info = 0;
    blas.spotrf("L", &t, a, &t, &info, 1);
    if (info != 0)
        fprintf(stderr, "unimem demo: spotrf on device %d failed with info %d (%s)\n", e->device,
                (int)info, info > 0 ? "the tile is not positive definite" : "a bad argument");
    return info != 0;
}

static int default_threads = -1;

void demo_blas_set_threads(int n)
{
    if (default_threads < 0)
        default_threads = blas.get_threads();
    blas.set_threads(n < 1 ? 1 : n);
}

int demo_blas_default_threads(void)
{
    if (default_threads < 0)
        default_threads = blas.get_threads();
    return default_threads;
}

/* --------------------------------------------------------------- cuBLAS */

/* The few declarations of cublas_api.h used here (cuBLAS's ABI: handles and
 * streams are pointers, enums are ints, scalars are read from the host). */
enum {
    CUBLAS_OP_N = 0,
    CUBLAS_OP_T = 1,
    CUBLAS_FILL_MODE_LOWER = 0,
    CUBLAS_DIAG_NON_UNIT = 0,
    CUBLAS_SIDE_RIGHT = 1
};

typedef struct cublas_api {
    int (*create)(void **handle);
    int (*destroy)(void *handle);
    int (*set_stream)(void *handle, void *stream);
    int (*sgemm)(void *handle, int transa, int transb, int m, int n, int k, const float *alpha,
                 const float *a, int lda, const float *b, int ldb, const float *beta, float *c,
                 int ldc);
    int (*strsm)(void *handle, int side, int uplo, int trans, int diag, int m, int n,
                 const float *alpha, const float *a, int lda, float *b, int ldb);
    int (*ssyrk)(void *handle, int uplo, int trans, int n, int k, const float *alpha,
                 const float *a, int lda, const float *beta, float *c, int ldc);
} cublas_api;

/* cuSOLVER's dense Cholesky (cusolverDn.h): handles and streams are
 * pointers, the fill mode is cuBLAS's. */
typedef struct cusolver_api {
    int (*create)(void **handle);
    int (*destroy)(void *handle);
    int (*set_stream)(void *handle, void *stream);
    int (*spotrf_buffer_size)(void *handle, int uplo, int n, float *a, int lda, int *lwork);
    int (*spotrf)(void *handle, int uplo, int n, float *a, int lda, float *work, int lwork,
                  int *info);
} cusolver_api;

#define DEMO_MAX_GPUS 64
/* Handles per GPU: one per stream the device's worker launches on (a
 * handle's workspace must not be shared by kernels of two streams). */
#define DEMO_STREAMS 8

static struct {
    pthread_mutex_t lock; /* guards loading and making handles */
    bool tried, loaded;
    char why[256];
    cublas_api api;
    void *handle[DEMO_MAX_GPUS][DEMO_STREAMS]; /* by unimem device index, then stream */
    bool solver_loaded;                        /* cuSOLVER too (optional) */
    cusolver_api solver;
    void *solver_handle[DEMO_MAX_GPUS][DEMO_STREAMS]; /* beside handle[][] */
    int potrf_lwork;                                  /* floats spotrf needs at the tile's size */
    bool potrf_sized;                                 /* potrf_lwork was asked (it may be 0) */
    void *stream[DEMO_MAX_GPUS][DEMO_STREAMS];        /* the stream each handle is bound to */
    int create_status[DEMO_MAX_GPUS];   /* cublasCreate's failure there (0: none yet) */
    bool kernels_loaded[DEMO_MAX_GPUS]; /* every task's kernels ran once there */
    pthread_mutex_t device_lock[DEMO_MAX_GPUS];
    bool device_lock_ready;
} cublas = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Loads cuSOLVER when it is there (under the lock); without it POTRF runs
 * on the host only (solver_why says why). The toolkit's directory is often
 * not on the loader's path when a Python package's cuBLAS is, so cuSOLVER
 * is first looked for beside the cuBLAS that loaded. */
static char solver_why[256];

static void load_cusolver(void)
{
    static const char *const names[] = {"libcusolver.so.12", "libcusolver.so.11", "libcusolver.so"};
    char dir[200] = "", path[512];
    Dl_info info;
    if (dladdr((void *)cublas.api.create, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        if (slash && (size_t)(slash - info.dli_fname) < sizeof dir)
            snprintf(dir, sizeof dir, "%.*s", (int)(slash - info.dli_fname), info.dli_fname);
    }
    void *lib = NULL;
    const char *err = "not looked for";
    for (int pass = dir[0] ? 0 : 1; pass < 2 && !lib; pass++)
        for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++) {
            if (pass == 0)
                snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            else
                snprintf(path, sizeof path, "%s", names[i]);
            lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (!lib) {
                const char *e = dlerror();
                err = e ? e : "unknown error";
            }
        }
    if (!lib) {
        snprintf(solver_why, sizeof solver_why, "cuSOLVER not found (last error: %s)", err);
        return;
    }
    symbol syms[] = {
        {(void **)&cublas.solver.create, "cusolverDnCreate"},
        {(void **)&cublas.solver.destroy, "cusolverDnDestroy"},
        {(void **)&cublas.solver.set_stream, "cusolverDnSetStream"},
        {(void **)&cublas.solver.spotrf_buffer_size, "cusolverDnSpotrf_bufferSize"},
        {(void **)&cublas.solver.spotrf, "cusolverDnSpotrf"},
    };
    const char *missing = find_symbols(lib, syms, sizeof syms / sizeof syms[0]);
    bool ok = !missing;
    if (missing)
        snprintf(solver_why, sizeof solver_why, "the cuSOLVER found lacks %s", missing);
    if (ok)
        cublas.solver_loaded = true;
    else
        dlclose(lib);
}

const char *demo_cusolver_why(void)
{
    return solver_why[0] ? solver_why : "no cuSOLVER handle could be made";
}

bool demo_cublas_load(char *why, size_t why_len)
{
    pthread_mutex_lock(&cublas.lock);
    if (!cublas.tried) {
        cublas.tried = true;
        static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
        void *lib = NULL;
        const char *err = "";
        for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++) {
            lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
            if (!lib) {
                const char *e = dlerror();
                err = e ? e : "unknown error";
            }
        }
        if (!lib) {
            snprintf(
                cublas.why, sizeof cublas.why,
                "cuBLAS not found (dlopen libcublas.so.13, .12 and libcublas.so: last error: %s)",
                err);
        } else {
            symbol syms[] = {
                {(void **)&cublas.api.create, "cublasCreate_v2"},
                {(void **)&cublas.api.destroy, "cublasDestroy_v2"},
                {(void **)&cublas.api.set_stream, "cublasSetStream_v2"},
                {(void **)&cublas.api.sgemm, "cublasSgemm_v2"},
                {(void **)&cublas.api.strsm, "cublasStrsm_v2"},
                {(void **)&cublas.api.ssyrk, "cublasSsyrk_v2"},
            };
            const char *missing = find_symbols(lib, syms, sizeof syms / sizeof syms[0]);
            cublas.loaded = !missing;
            if (missing)
                snprintf(cublas.why, sizeof cublas.why, "the cuBLAS library found lacks %s",
                         missing);
            if (!cublas.loaded)
                dlclose(lib);
        }
        if (cublas.loaded)
            load_cusolver();
        if (cublas.loaded && !cublas.device_lock_ready) {
            for (int d = 0; d < DEMO_MAX_GPUS; d++)
                pthread_mutex_init(&cublas.device_lock[d], NULL);
            cublas.device_lock_ready = true;
        }
    }
    bool ok = cublas.loaded;
    if (!ok && why && why_len)
        snprintf(why, why_len, "%s", cublas.why);
    pthread_mutex_unlock(&cublas.lock);
    return ok;
}

/* Destroys slot k of device d: its cuBLAS handle and its cuSOLVER one
 * (under the lock). */
static void drop_handles(int d, int k)
{
    if (cublas.handle[d][k])
        (void)cublas.api.destroy(cublas.handle[d][k]);
    if (cublas.solver_handle[d][k])
        (void)cublas.solver.destroy(cublas.solver_handle[d][k]);
    cublas.handle[d][k] = cublas.stream[d][k] = cublas.solver_handle[d][k] = NULL;
}

void demo_cublas_release(void)
{
    pthread_mutex_lock(&cublas.lock);
    for (int d = 0; d < DEMO_MAX_GPUS; d++) {
        for (int k = 0; k < DEMO_STREAMS; k++)
            drop_handles(d, k);
        cublas.create_status[d] = 0;
        cublas.kernels_loaded[d] = false;
    }
    pthread_mutex_unlock(&cublas.lock);
}

/* The handle of device d bound to `stream`, made on first use (on the
 * device's worker, where its context is current); NULL when cublasCreate
 * fails (its status kept for demo_cublas_ready) or every slot is taken. */
static void *stream_handle(int d, void *stream)
{
    if (!cublas.loaded || d < 0 || d >= DEMO_MAX_GPUS)
        return NULL;
    pthread_mutex_lock(&cublas.lock);
    void *h = NULL;
    for (int k = 0; k < DEMO_STREAMS && !h && !cublas.create_status[d]; k++) {
        if (cublas.handle[d][k] && cublas.stream[d][k] == stream) {
            h = cublas.handle[d][k];
        } else if (!cublas.handle[d][k]) {
            int rc = cublas.api.create(&cublas.handle[d][k]);
            if (rc == 0)
                rc = cublas.api.set_stream(cublas.handle[d][k], stream);
            if (rc != 0) {
                if (cublas.handle[d][k])
                    (void)cublas.api.destroy(cublas.handle[d][k]);
                cublas.handle[d][k] = NULL;
                cublas.create_status[d] = rc;
            } else {
                cublas.stream[d][k] = stream;
                h = cublas.handle[d][k];
                /* cuSOLVER beside it; without one POTRF stays on the host. */
                void *sh = NULL;
                int src = cublas.solver_loaded ? cublas.solver.create(&sh) : -1;
                if (src == 0)
                    src = cublas.solver.set_stream(sh, stream);
                if (src == 0) {
                    cublas.solver_handle[d][k] = sh;
                } else if (cublas.solver_loaded) {
                    snprintf(solver_why, sizeof solver_why,
                             "cusolverDnCreate or SetStream on device %d: status %d", d, src);
                    if (sh)
                        (void)cublas.solver.destroy(sh);
                }
            }
        }
    }
    pthread_mutex_unlock(&cublas.lock);
    return h;
}

/* The cuSOLVER handle beside the cuBLAS one of device d's stream (made
 * with it); NULL when there is none. */
static void *solver_handle(int d, void *stream)
{
    if (!cublas.solver_loaded || d < 0 || d >= DEMO_MAX_GPUS)
        return NULL;
    pthread_mutex_lock(&cublas.lock);
    void *h = NULL;
    for (int k = 0; k < DEMO_STREAMS && !h; k++)
        if (cublas.handle[d][k] && cublas.stream[d][k] == stream)
            h = cublas.solver_handle[d][k];
    pthread_mutex_unlock(&cublas.lock);
    return h;
}

/* Runs every kernel the tasks use once on the device of handles h and sh
 * (sh NULL: no cuSOLVER), at the tile's size, on the scratch tiles a, b
 * and c, each tile_bytes long: cuBLAS and cuSOLVER load a kernel when it
 * is first launched (CUDA's lazy loading), reading it from the library's
 * file, and a Cholesky's first POTRF, TRSM and SYRK otherwise paid that
 * inside the timed work (a third of the makespan at n 32768, tile 4096,
 * when the files were not in the page cache). The data is whatever the
 * scratch tiles hold: a POTRF that finds it not positive definite still
 * launches its kernels. Returns the first failing status, 0 when all ran. */
static int load_kernels(void *h, void *sh, int tile, int lwork, float *a, float *b, float *c,
                        size_t tile_bytes)
{
    const float one = 1.0f, minus_one = -1.0f;
    int rc = cublas.api.sgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, tile, tile, tile, &minus_one, a, tile, b,
                              tile, &one, c, tile);
    if (rc == 0)
        rc = cublas.api.strsm(h, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_T,
                              CUBLAS_DIAG_NON_UNIT, tile, tile, &one, a, tile, b, tile);
    if (rc == 0)
        rc = cublas.api.ssyrk(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, tile, tile, &minus_one, a,
                              tile, &one, c, tile);
    if (rc == 0 && sh && ((size_t)lwork + 1) * sizeof(float) <= tile_bytes)
        rc = cublas.solver.spotrf(sh, CUBLAS_FILL_MODE_LOWER, tile, c, tile, b, lwork,
                                  (int *)b + lwork);
    return rc;
}

/* Makes the handle of the task's stream and, given three scratch tiles,
 * runs one GEMM of their size there, and once per device every other
 * kernel of the tasks (load_kernels): cuBLAS loads its kernels on first
 * use, which must not fall in the timed work. */
int demo_cuda_init(const um_task_exec *e)
{
    void *h = stream_handle(e->device, e->stream);
    if (!h || e->nbuffers != 3)
        return 0;
    int t = 1;
    while ((size_t)(t + 1) * (size_t)(t + 1) * sizeof(float) <= e->sizes[0])
        t++;
    const float one = 1.0f, zero = 0.0f;
    int rc = cublas.api.sgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, t, t, t, &one, e->ptrs[0], t, e->ptrs[1],
                              t, &zero, e->ptrs[2], t);
    const demo_op *op = op_of(e);
    void *sh = solver_handle(e->device, e->stream);
    int lwork = 0;
    if (rc == 0 && sh && op && op->tile <= t) {
        int bs = cublas.solver.spotrf_buffer_size(sh, CUBLAS_FILL_MODE_LOWER, op->tile, e->ptrs[0],
                                                  op->tile, &lwork);
        pthread_mutex_lock(&cublas.lock);
        if (bs == 0) {
            cublas.potrf_sized = true;
            if (lwork > cublas.potrf_lwork)
                cublas.potrf_lwork = lwork;
        } else if (bs != 0)
            snprintf(solver_why, sizeof solver_why,
                     "cusolverDnSpotrf_bufferSize at tile %d: status %d", op->tile, bs);
        pthread_mutex_unlock(&cublas.lock);
        if (bs != 0)
            sh = NULL;
    } else if (rc == 0 && sh && op) {
        snprintf(solver_why, sizeof solver_why,
                 "the scratch tiles (%d) are smaller than the potrf tile (%d)", t, op->tile);
    }
    if (rc == 0 && op && op->tile <= t && (size_t)e->device < DEMO_MAX_GPUS) {
        /* One task per device loads them; the device's other init tasks
         * follow on other streams and find them loaded. */
        pthread_mutex_lock(&cublas.lock);
        bool first = !cublas.kernels_loaded[e->device];
        cublas.kernels_loaded[e->device] = true;
        pthread_mutex_unlock(&cublas.lock);
        if (first)
            rc = load_kernels(h, sh, op->tile, lwork, e->ptrs[0], e->ptrs[1], e->ptrs[2],
                              e->sizes[1]);
    }
    return rc != 0;
}

size_t demo_cusolver_workspace(void)
{
    pthread_mutex_lock(&cublas.lock);
    size_t floats = (size_t)cublas.potrf_lwork;
    bool any = false;
    for (int d = 0; d < DEMO_MAX_GPUS && !any; d++)
        for (int k = 0; k < DEMO_STREAMS && !any; k++)
            any = cublas.solver_handle[d][k] != NULL;
    pthread_mutex_unlock(&cublas.lock);
    if (any && !cublas.potrf_sized)
        snprintf(solver_why, sizeof solver_why,
                 "cusolverDnSpotrf_bufferSize was not asked (no GPU ran cuBLAS's start-up)");
    /* The factor's status (devInfo) goes after the workspace, which may
     * be empty. */
    return any && cublas.potrf_sized ? (floats + 1) * sizeof(float) : 0;
}

int demo_cuda_fini(const um_task_exec *e)
{
    int d = e->device;
    if (!cublas.loaded || d < 0 || d >= DEMO_MAX_GPUS)
        return 0;
    pthread_mutex_lock(&cublas.lock);
    for (int k = 0; k < DEMO_STREAMS; k++) {
        if (cublas.handle[d][k] && cublas.stream[d][k] == e->stream)
            drop_handles(d, k);
    }
    pthread_mutex_unlock(&cublas.lock);
    return 0;
}

bool demo_cublas_ready(int dev, char *why, size_t why_len)
{
    if (!cublas.loaded || dev < 0 || dev >= DEMO_MAX_GPUS) {
        snprintf(why, why_len, "%s",
                 cublas.loaded ? "too many GPUs for cuBLAS handles" : cublas.why);
        return false;
    }
    pthread_mutex_lock(&cublas.lock);
    bool ok = cublas.handle[dev][0] != NULL;
    if (!ok)
        snprintf(why, why_len, "cuBLAS cannot start on device %d (cublasCreate: status %d%s)", dev,
                 cublas.create_status[dev],
                 cublas.create_status[dev] == 1 ? ", not initialized: the CUDA runtime failed"
                                                : "");
    pthread_mutex_unlock(&cublas.lock);
    return ok;
}

/* The handle of the task's stream, with the device's lock held
 * (unlock_device releases it); NULL after a message when cuBLAS cannot
 * serve the device. */
static void *lock_device(const um_task_exec *e)
{
    int d = e->device;
    void *h = stream_handle(d, e->stream);
    if (!h) {
        char why[256];
        (void)demo_cublas_ready(d, why, sizeof why);
        fprintf(stderr, "unimem demo: %s\n", why);
        return NULL;
    }
    pthread_mutex_lock(&cublas.device_lock[d]);
    return h;
}

static int unlock_device(const um_task_exec *e, const char *what, int rc)
{
    pthread_mutex_unlock(&cublas.device_lock[e->device]);
    if (rc != 0)
        fprintf(stderr, "unimem demo: %s on device %d failed with status %d\n", what, e->device,
                rc);
    return rc != 0;
}

int demo_cuda_gemm(const um_task_exec *e)
{
    const demo_op *op = op_of(e);
    void *h = lock_device(e);
    if (!h)
        return 1;
    int t = op->tile;
    int rc = cublas.api.sgemm(h, CUBLAS_OP_N, op->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, t, t, t,
                              &op->alpha, e->ptrs[0], t, e->ptrs[1], t, &op->beta, e->ptrs[2], t);
    return unlock_device(e, "cublasSgemm", rc);
}

int demo_cuda_trsm(const um_task_exec *e)
{
    const demo_op *op = op_of(e);
    void *h = lock_device(e);
    if (!h)
        return 1;
    int t = op->tile;
    const float one = 1.0f;
    int rc = cublas.api.strsm(h, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_T,
                              CUBLAS_DIAG_NON_UNIT, t, t, &one, e->ptrs[0], t, e->ptrs[1], t);
    return unlock_device(e, "cublasStrsm", rc);
}

int demo_cuda_syrk(const um_task_exec *e)
{
    const demo_op *op = op_of(e);
    void *h = lock_device(e);
    if (!h)
        return 1;
    int t = op->tile;
    const float minus_one = -1.0f, one = 1.0f;
    int rc = cublas.api.ssyrk(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, t, t, &minus_one, e->ptrs[0],
                              t, &one, e->ptrs[1], t);
    return unlock_device(e, "cublasSsyrk", rc);
}

int demo_cuda_potrf(const um_task_exec *e)
{
    const demo_op *op = op_of(e);
    if (!lock_device(e))
        return 1;
    void *sh = solver_handle(e->device, e->stream);
    int lwork = cublas.potrf_lwork;
    int rc = -1;
    if (!sh || e->nbuffers != 2 || e->sizes[1] < ((size_t)lwork + 1) * sizeof(float))
        fprintf(stderr, "unimem demo: spotrf on device %d: no cuSOLVER handle or workspace\n",
                e->device);
    else
        rc = cublas.solver.spotrf(sh, CUBLAS_FILL_MODE_LOWER, op->tile, e->ptrs[0], op->tile,
                                  e->ptrs[1], lwork, (int *)e->ptrs[1] + lwork);
    /* A tile that is not positive definite leaves devInfo > 0 on the GPU,
     * read by nobody here: the result's check finds it. */
    return unlock_device(e, "cusolverDnSpotrf", rc);
}
