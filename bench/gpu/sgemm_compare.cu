// The baselines of issue 6's out-of-core SGEMM target, measured in the
// same run as `unimem demo gemm` (bench/gpu/gpu_run.sh, step `gemm`):
//
//   in-core   cublasSgemm with A, B and C in GPU memory (the rate to reach
//             90% of),
//   cublasXt  cublasXtSgemm from pinned host memory with block sizes 2048,
//             4096 and 8192 (NVIDIA's out-of-core GEMM, which re-sends
//             tiles instead of keeping them), on GPUs 0..K-1 (--gpus K,
//             default 1: the baseline of a run of `unimem demo gemm` over
//             K GPUs).
//
// Usage: sgemm_compare [--n N] [--gpus K] [--skip-in-core] [--json FILE]
//        (default N = 32768). The in-core references always run on GPU 0
// alone; --skip-in-core leaves them out (a second run with more GPUs
// already has them from the first, and they take ~20 s at N = 32768).
// Every line and JSON record carries its GPU count. Every call's status
// is checked; the rates are 2 N^3 / seconds, the best of three runs after
// a warm-up.
#include <cublasXt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CUDA_CHECK(call)                                                                   \
    do {                                                                                   \
        cudaError_t e_ = (call);                                                           \
        if (e_ != cudaSuccess) {                                                           \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,           \
                         cudaGetErrorString(e_));                                          \
            std::exit(1);                                                                  \
        }                                                                                  \
    } while (0)
#define BLAS_CHECK(call)                                                                   \
    do {                                                                                   \
        cublasStatus_t s_ = (call);                                                        \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                 \
            std::fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__,     \
                         #call, (int)s_);                                                  \
            std::exit(1);                                                                  \
        }                                                                                  \
    } while (0)

static double now_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Fills n floats with small values so the sums stay exact enough to check.
static void fill(float *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((i * 2654435761u + seed) % 17) / 16.0f - 0.5f;
}

// cuBLAS with A, B and C in the memory of GPU 0 (the runtime's current
// device): the whole product, then tile by tile.
static void in_core_runs(long n, const float *ha, const float *hb, double flops, FILE *jf)
{
    const size_t bytes = (size_t)n * (size_t)n * sizeof(float);
    const float one = 1.0f, zero = 0.0f;
    float *da, *db, *dc;
    CUDA_CHECK(cudaMalloc(&da, bytes));
    CUDA_CHECK(cudaMalloc(&db, bytes));
    CUDA_CHECK(cudaMalloc(&dc, bytes));
    CUDA_CHECK(cudaMemcpy(da, ha, bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(db, hb, bytes, cudaMemcpyHostToDevice));
    cublasHandle_t h;
    BLAS_CHECK(cublasCreate(&h));
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        CUDA_CHECK(cudaDeviceSynchronize());
        double t0 = now_s();
        BLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)n, (int)n, &one, da,
                               (int)n, db, (int)n, &zero, dc, (int)n));
        CUDA_CHECK(cudaDeviceSynchronize());
        double t = now_s() - t0;
        if (r > 0 && t < best)
            best = t;
    }
    std::printf("in-core cublasSgemm   N=%ld GPUs 1: %.3f s, %.1f TFLOP/s\n", n, best,
                flops / best / 1e12);
    if (jf)
        std::fprintf(jf, "{\"system\":\"cublas_in_core\",\"gpus\":1,\"n\":%ld,\"seconds\":%.4f,"
                         "\"tflops\":%.2f}\n",
                     n, best, flops / best / 1e12);
    // In core, tile by tile: the same cublasSgemm calls the out-of-core
    // tasks make (C_ij += A_ik B_kj on tiles stored one after another),
    // on three streams by C tile, with no data movement at all: the best a
    // tiled schedule can reach on this GPU.
    for (int t : {2048, 4096, 8192}) {
        const long nt = n / t;
        const size_t tile_elems = (size_t)t * (size_t)t;
        cudaStream_t st[3];
        for (auto &x : st)
            CUDA_CHECK(cudaStreamCreate(&x));
        double bt = 1e30;
        for (int r = 0; r < 3; r++) {
            CUDA_CHECK(cudaDeviceSynchronize());
            double t0 = now_s();
            for (long i = 0; i < nt; i++)
                for (long j = 0; j < nt; j++) {
                    BLAS_CHECK(cublasSetStream(h, st[(i * nt + j) % 3]));
                    for (long k = 0; k < nt; k++) {
                        const float beta = k ? 1.0f : 0.0f;
                        BLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, t, t, t, &one,
                                               da + (size_t)(i * nt + k) * tile_elems, t,
                                               db + (size_t)(k * nt + j) * tile_elems, t, &beta,
                                               dc + (size_t)(i * nt + j) * tile_elems, t));
                    }
                }
            CUDA_CHECK(cudaDeviceSynchronize());
            double tt = now_s() - t0;
            if (tt < bt)
                bt = tt;
        }
        std::printf("in-core tiled         tile %d GPUs 1: %.3f s, %.1f TFLOP/s (3 streams, no "
                    "copies)\n",
                    t, bt, flops / bt / 1e12);
        if (jf)
            std::fprintf(jf, "{\"system\":\"cublas_in_core_tiled\",\"gpus\":1,\"tile\":%d,"
                             "\"n\":%ld,\"seconds\":%.4f,\"tflops\":%.2f}\n",
                         t, n, bt, flops / bt / 1e12);
        for (auto &x : st)
            CUDA_CHECK(cudaStreamDestroy(x));
        BLAS_CHECK(cublasSetStream(h, 0));
    }
    BLAS_CHECK(cublasDestroy(h));
    CUDA_CHECK(cudaFree(da));
    CUDA_CHECK(cudaFree(db));
    CUDA_CHECK(cudaFree(dc));
}

int main(int argc, char **argv)
{
    long n = 32768;
    int k_gpus = 1;
    bool in_core = true;
    const char *json = nullptr;
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "--n") && i + 1 < argc)
            n = std::atol(argv[++i]);
        else if (!std::strcmp(argv[i], "--gpus") && i + 1 < argc)
            k_gpus = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--skip-in-core"))
            in_core = false;
        else if (!std::strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else {
            std::fprintf(stderr,
                         "usage: sgemm_compare [--n N] [--gpus K] [--skip-in-core] [--json FILE]\n");
            return 2;
        }
    }
    if (n < 1) {
        std::fprintf(stderr, "sgemm_compare: --n takes a matrix order above 0\n");
        return 2;
    }
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
        std::fprintf(stderr, "sgemm_compare: no GPU\n");
        return 2;
    }
    // Asking for more GPUs than there are fails here, not as a cuBLASXt
    // status in the middle of the run.
    if (k_gpus < 1 || k_gpus > gpus) {
        std::fprintf(stderr, "sgemm_compare: --gpus takes 1 to %d (the GPUs the runtime sees)\n",
                     gpus);
        return 2;
    }
    const size_t elems = (size_t)n * (size_t)n, bytes = elems * sizeof(float);
    const double flops = 2.0 * (double)n * (double)n * (double)n;
    FILE *jf = json ? std::fopen(json, "w") : nullptr;
    float *ha, *hb, *hc;
    CUDA_CHECK(cudaMallocHost(&ha, bytes));
    CUDA_CHECK(cudaMallocHost(&hb, bytes));
    CUDA_CHECK(cudaMallocHost(&hc, bytes));
    fill(ha, elems, 1);
    fill(hb, elems, 2);
    const float one = 1.0f, zero = 0.0f;

    if (in_core)
        in_core_runs(n, ha, hb, flops, jf);

    // cublasXt from pinned host memory (portable to every GPU: the
    // runtime's host allocations are, under unified addressing).
    cublasXtHandle_t xt;
    BLAS_CHECK(cublasXtCreate(&xt));
    std::vector<int> ids((size_t)k_gpus);
    for (int g = 0; g < k_gpus; g++)
        ids[(size_t)g] = g;
    BLAS_CHECK(cublasXtDeviceSelect(xt, k_gpus, ids.data()));
    const int blocks[] = {2048, 4096, 8192};
    for (int b : blocks) {
        BLAS_CHECK(cublasXtSetBlockDim(xt, b));
        double bx = 1e30;
        for (int r = 0; r < 3; r++) {
            double t0 = now_s();
            BLAS_CHECK(cublasXtSgemm(xt, CUBLAS_OP_N, CUBLAS_OP_N, (size_t)n, (size_t)n, (size_t)n,
                                     &one, ha, (size_t)n, hb, (size_t)n, &zero, hc, (size_t)n));
            // cublasXtSgemm returns with C home; this only makes sure of it
            // on every GPU it used.
            for (int g = k_gpus - 1; g >= 0; g--) {
                CUDA_CHECK(cudaSetDevice(g));
                CUDA_CHECK(cudaDeviceSynchronize());
            }
            double t = now_s() - t0;
            if (t < bx)
                bx = t;
        }
        std::printf("cublasXtSgemm block %d N=%ld GPUs %d: %.3f s, %.1f TFLOP/s (pinned host "
                    "memory)\n",
                    b, n, k_gpus, bx, flops / bx / 1e12);
        if (jf)
            std::fprintf(jf,
                         "{\"system\":\"cublasxt\",\"gpus\":%d,\"block\":%d,\"n\":%ld,"
                         "\"seconds\":%.4f,\"tflops\":%.2f}\n",
                         k_gpus, b, n, bx, flops / bx / 1e12);
    }
    BLAS_CHECK(cublasXtDestroy(xt));
    // A check that the last product is C = A B: a few entries by dot products.
    double worst = 0.0;
    for (int k = 0; k < 16; k++) {
        size_t i = (size_t)(k * 7919) % (size_t)n, j = (size_t)(k * 104729) % (size_t)n;
        double want = 0.0;
        for (long q = 0; q < n; q++)
            want += (double)ha[i + (size_t)q * (size_t)n] * (double)hb[(size_t)q + j * (size_t)n];
        double got = hc[i + j * (size_t)n], err = got > want ? got - want : want - got;
        if (err > worst)
            worst = err;
    }
    std::printf("check: max abs error %.3g on 16 entries (cublasXt, GPUs %d)\n", worst, k_gpus);
    if (jf)
        std::fclose(jf);
    CUDA_CHECK(cudaFreeHost(ha));
    CUDA_CHECK(cudaFreeHost(hb));
    CUDA_CHECK(cudaFreeHost(hc));
    return worst < 1e-1 ? 0 : 1;
}
