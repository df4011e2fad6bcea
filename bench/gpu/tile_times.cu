// Compute time of one tile kernel on the GPU, as `unimem demo` runs them:
// cublasSgemm (C = A B + C), cublasStrsm (right, lower, transposed),
// cublasSsyrk (lower, C -= A A^T) and cusolverDnSpotrf (lower) on square
// tiles of single precision. These are the compute-time tables of the
// virtual-time simulator's built-in H200 (issue 7) and what the placement
// history should learn on the real GPU.
//
// Usage: tile_times [--tiles 1024,2048,4096,8192] [--reps 10] [--json FILE]
// Each figure is the median of --reps timed calls (CUDA events around each
// call on one stream) after two warm-up calls; the inputs are in GPU memory.
// The POTRF tile is made positive definite (A A^T + t I) before each call.
// With --streams K, GEMM, TRSM and SYRK are also timed packed: K
// streams (a cuBLAS handle and an output tile each, as the task runtime's
// GPU worker keeps up to four tasks in flight on its streams) each run
// --reps calls at once; the figure is the whole span over K x reps, the
// time one call adds when others run beside it (K = 1: calls back to back,
// without the alone figure's wait after each).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <algorithm>
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
#define STATUS_CHECK(call)                                                                 \
    do {                                                                                   \
        int s_ = (int)(call);                                                              \
        if (s_ != 0) {                                                                     \
            std::fprintf(stderr, "%s:%d: %s: status %d\n", __FILE__, __LINE__, #call, s_); \
            std::exit(1);                                                                  \
        }                                                                                  \
    } while (0)

// Fills a tile with small values; the diagonal large, so TRSM's triangle is
// well conditioned.
static void fill(std::vector<float> &h, int t, unsigned seed)
{
    for (size_t i = 0; i < h.size(); i++)
        h[i] = (float)((i * 2654435761u + seed) % 17) / 64.0f - 0.125f;
    for (int i = 0; i < t; i++)
        h[(size_t)i * t + i] = (float)t;
}

enum op_kind { GEMM, TRSM, SYRK, POTRF };
static const char *const op_names[] = {"gemm", "trsm", "syrk", "potrf"};

static double op_flops(op_kind k, double t)
{
    switch (k) {
    case GEMM: return 2 * t * t * t;
    case TRSM: return t * t * t;
    case SYRK: return t * t * t;
    default: return t * t * t / 3;
    }
}

// One call of k on tile order t, reading a and b and updating c, on h's stream.
static void launch(cublasHandle_t h, op_kind k, int t, const float *a, const float *b, float *c)
{
    const float one = 1.0f, minus_one = -1.0f;
    switch (k) {
    case GEMM:
        STATUS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, t, t, t, &one, a, t, b, t, &one, c, t));
        break;
    case TRSM:
        STATUS_CHECK(cublasStrsm(h, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_T,
                                 CUBLAS_DIAG_NON_UNIT, t, t, &one, b, t, c, t));
        break;
    default:
        STATUS_CHECK(cublasSsyrk(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, t, t, &minus_one, a, t,
                                 &one, c, t));
        break;
    }
}

// The packed time of one call (see the header), in ms.
static double packed_ms(op_kind k, int t, int nstreams, int reps, const float *a, const float *b)
{
    size_t n = (size_t)t * t;
    std::vector<cudaStream_t> st(nstreams);
    std::vector<cublasHandle_t> hs(nstreams);
    std::vector<float *> cs(nstreams);
    for (int i = 0; i < nstreams; i++) {
        CUDA_CHECK(cudaStreamCreate(&st[i]));
        STATUS_CHECK(cublasCreate(&hs[i]));
        STATUS_CHECK(cublasSetStream(hs[i], st[i]));
        CUDA_CHECK(cudaMalloc(&cs[i], n * sizeof(float)));
        CUDA_CHECK(cudaMemcpy(cs[i], b, n * sizeof(float), cudaMemcpyDeviceToDevice));
        launch(hs[i], k, t, a, b, cs[i]); // warm-up, each handle
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0, st[0]));
    for (int i = 1; i < nstreams; i++)
        CUDA_CHECK(cudaStreamWaitEvent(st[i], e0, 0));
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < nstreams; i++)
            launch(hs[i], k, t, a, b, cs[i]);
    for (int i = 1; i < nstreams; i++) {
        cudaEvent_t done;
        CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventRecord(done, st[i]));
        CUDA_CHECK(cudaStreamWaitEvent(st[0], done, 0));
        CUDA_CHECK(cudaEventDestroy(done));
    }
    CUDA_CHECK(cudaEventRecord(e1, st[0]));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float m = 0;
    CUDA_CHECK(cudaEventElapsedTime(&m, e0, e1));
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    for (int i = 0; i < nstreams; i++) {
        CUDA_CHECK(cudaFree(cs[i]));
        STATUS_CHECK(cublasDestroy(hs[i]));
        CUDA_CHECK(cudaStreamDestroy(st[i]));
    }
    return m / (double)(reps * nstreams);
}

int main(int argc, char **argv)
{
    std::vector<int> tiles = {1024, 2048, 4096, 8192};
    int reps = 10, nstreams = 0; // 0: no packed timing
    const char *json = nullptr;
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "--tiles") && i + 1 < argc) {
            tiles.clear();
            for (char *p = argv[++i]; *p;) {
                tiles.push_back((int)std::strtol(p, &p, 10));
                if (*p == ',')
                    p++;
                else if (*p)
                    break;
            }
        } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = std::atoi(argv[++i]);
        } else if (!std::strcmp(argv[i], "--streams") && i + 1 < argc) {
            nstreams = std::atoi(argv[++i]);
        } else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
            json = argv[++i];
        } else {
            std::fprintf(stderr, "usage: tile_times [--tiles T1,T2,...] [--reps N] [--streams K] "
                                 "[--json FILE]\n");
            return 2;
        }
    }
    if (tiles.empty() || reps < 1 || reps > 1000 || nstreams < 0 || nstreams > 16) {
        std::fprintf(stderr, "tile_times: --tiles needs sizes, --reps 1..1000, --streams 0..16\n");
        return 2;
    }
    FILE *js = json ? std::fopen(json, "w") : nullptr;
    if (json && !js) {
        std::perror(json);
        return 1;
    }
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    cublasHandle_t h;
    STATUS_CHECK(cublasCreate(&h));
    STATUS_CHECK(cublasSetStream(h, s));
    cusolverDnHandle_t sh;
    STATUS_CHECK(cusolverDnCreate(&sh));
    STATUS_CHECK(cusolverDnSetStream(sh, s));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    std::printf("tile_times on %s: median of %d calls after 2 warm-ups\n", prop.name, reps);
    std::printf("%-6s %6s %12s %10s\n", "op", "tile", "ms", "TFLOP/s");
    for (int t : tiles) {
        size_t n = (size_t)t * t;
        std::vector<float> ha(n), hb(n), hc(n);
        fill(ha, t, 1);
        fill(hb, t, 2);
        fill(hc, t, 3);
        float *a, *b, *c, *work;
        int *info;
        CUDA_CHECK(cudaMalloc(&a, n * sizeof(float)));
        CUDA_CHECK(cudaMalloc(&b, n * sizeof(float)));
        CUDA_CHECK(cudaMalloc(&c, n * sizeof(float)));
        CUDA_CHECK(cudaMemcpy(a, ha.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(b, hb.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        // A positive definite tile for POTRF: c = a a^T + t I, kept in b's
        // place between calls (POTRF overwrites its input).
        float *spd;
        CUDA_CHECK(cudaMalloc(&spd, n * sizeof(float)));
        CUDA_CHECK(cudaMemcpy(spd, hc.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        const float one = 1.0f, minus_one = -1.0f;
        STATUS_CHECK(cublasSsyrk(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, t, t, &one, a, t, &one,
                                 spd, t));
        int lwork = 0;
        STATUS_CHECK(cusolverDnSpotrf_bufferSize(sh, CUBLAS_FILL_MODE_LOWER, t, spd, t, &lwork));
        CUDA_CHECK(cudaMalloc(&work, ((size_t)lwork + 1) * sizeof(float)));
        CUDA_CHECK(cudaMalloc(&info, sizeof(int)));
        for (int k = GEMM; k <= POTRF; k++) {
            std::vector<float> ms;
            for (int r = 0; r < reps + 2; r++) {
                if (k == POTRF)
                    CUDA_CHECK(cudaMemcpyAsync(c, spd, n * sizeof(float),
                                               cudaMemcpyDeviceToDevice, s));
                CUDA_CHECK(cudaEventRecord(e0, s));
                switch (k) {
                case GEMM:
                    STATUS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, t, t, t, &one, a, t, b,
                                             t, &one, c, t));
                    break;
                case TRSM:
                    STATUS_CHECK(cublasStrsm(h, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_LOWER,
                                             CUBLAS_OP_T, CUBLAS_DIAG_NON_UNIT, t, t, &one, b, t,
                                             c, t));
                    break;
                case SYRK:
                    STATUS_CHECK(cublasSsyrk(h, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, t, t,
                                             &minus_one, a, t, &one, c, t));
                    break;
                default:
                    STATUS_CHECK(cusolverDnSpotrf(sh, CUBLAS_FILL_MODE_LOWER, t, c, t, work,
                                                  lwork, info));
                    break;
                }
                CUDA_CHECK(cudaEventRecord(e1, s));
                CUDA_CHECK(cudaEventSynchronize(e1));
                float m = 0;
                CUDA_CHECK(cudaEventElapsedTime(&m, e0, e1));
                if (r >= 2)
                    ms.push_back(m);
            }
            if (k == POTRF) {
                int hinfo = -1;
                CUDA_CHECK(cudaMemcpy(&hinfo, info, sizeof hinfo, cudaMemcpyDeviceToHost));
                if (hinfo != 0) {
                    std::fprintf(stderr, "tile_times: spotrf at tile %d gave info %d\n", t, hinfo);
                    return 1;
                }
            }
            std::sort(ms.begin(), ms.end());
            double med = ms[ms.size() / 2];
            double tflops = op_flops((op_kind)k, t) / (med * 1e-3) / 1e12;
            std::printf("%-6s %6d %12.4f %10.2f\n", op_names[k], t, med, tflops);
            if (js)
                std::fprintf(js,
                             "{\"gpu\":\"%s\",\"op\":\"%s\",\"tile\":%d,\"ms\":%.5f,\"min_ms\":%.5f,"
                             "\"max_ms\":%.5f,\"tflops\":%.3f,\"reps\":%d}\n",
                             prop.name, op_names[k], t, med, ms.front(), ms.back(), tflops, reps);
            if (nstreams > 0 && k != POTRF) {
                double packed = packed_ms((op_kind)k, t, nstreams, reps, a, b);
                std::printf("%-6s %6d %12.4f %10.2f  packed on %d streams (%.3fx the alone median)\n",
                            op_names[k], t, packed, op_flops((op_kind)k, t) / (packed * 1e-3) / 1e12,
                            nstreams, packed / med);
                if (js)
                    std::fprintf(js,
                                 "{\"gpu\":\"%s\",\"op\":\"%s\",\"tile\":%d,\"packed_ms\":%.5f,"
                                 "\"streams\":%d,\"alone_ms\":%.5f,\"reps\":%d}\n",
                                 prop.name, op_names[k], t, packed, nstreams, med, reps);
            }
        }
        CUDA_CHECK(cudaFree(a));
        CUDA_CHECK(cudaFree(b));
        CUDA_CHECK(cudaFree(c));
        CUDA_CHECK(cudaFree(spd));
        CUDA_CHECK(cudaFree(work));
        CUDA_CHECK(cudaFree(info));
    }
    if (js)
        std::fclose(js);
    STATUS_CHECK(cusolverDnDestroy(sh));
    STATUS_CHECK(cublasDestroy(h));
    CUDA_CHECK(cudaStreamDestroy(s));
    return 0;
}
