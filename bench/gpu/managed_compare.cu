/*
 * managed_compare: CUDA managed memory against unimem unified buffers on the
 * same workloads, side by side in one run, on one GPU.
 *
 * Why: unified buffers and cudaMallocManaged answer the same need (one
 * handle for data that the host and the GPU both use, moved by the system
 * rather than by the program), so the question a user asks is whether
 * unimem is at least as fast as managed memory used well. This program
 * measures exactly that, with data that fits on the device (managed memory
 * is never oversubscribed here: that is a different question, measured by
 * `unimem bench oversub`).
 *
 * The data: N input buffers of S bytes each (default 16 x 256 MiB = 4 GiB)
 * and one result buffer of S bytes. A pass runs one kernel per input, in
 * order, on one stream; the first kernel stores result[j] = in0[j] and the
 * others add result[j] += in_i[j] (uint32 words). The host then reads the
 * whole result and checks every word against the value computed on the
 * host. Two workloads:
 *
 *   stream   the host writes the inputs once (before the timed passes);
 *            each pass then reads them on the GPU. Only the first pass
 *            has to move the inputs to the device; every pass moves the
 *            result to the host.
 *   update   the host rewrites every input with a new pattern before its
 *            kernel in every pass (a data loader), so every pass has to
 *            move all the inputs to the device and the result back.
 *
 * Three systems run each workload:
 *
 *   managed_prefetch  cudaMallocManaged, with cudaMemPrefetchAsync for every
 *                     move: each input to the GPU before its kernel, the
 *                     result to the GPU before the first kernel and to the
 *                     host before the host reads it, and (update) each input
 *                     back to the host before the host rewrites it, so that
 *                     no move is left to page faults. --read-mostly adds
 *                     cudaMemAdviseSetReadMostly on the inputs (the GPU then
 *                     keeps a read-only copy and the host keeps its own, so
 *                     the move back before a rewrite is not needed).
 *   managed_plain     the same memory with no hints at all: every move is a
 *                     page fault, on the GPU or on the host (--no-plain
 *                     skips it).
 *   unimem            um_buffer_* on device 1 (CUDA device 0): the inputs are
 *                     acquired for reading on the GPU (prefetched first in
 *                     `stream`), the result is acquired WRITE_DISCARD on the
 *                     GPU (every pass overwrites it whole) and then for
 *                     reading on the host (device 0). In `update` the host
 *                     acquires each input WRITE_DISCARD on device 0 and
 *                     writes the new pattern straight into it, as the host
 *                     writes straight into managed memory. The kernels run on
 *                     a cudaStream_t wrapped with um_stream_wrap, so unimem's
 *                     copies and the kernels are ordered by events.
 *
 * Each pass is timed on the wall clock from its start to the end of the host
 * check, after cudaStreamSynchronize; the table shows the first pass, the
 * mean of the others (the steady state) and the total. The systems run
 * alternately for --rounds rounds (default 2) and each is reported at its
 * best round, because the machine may be shared. Every run allocates,
 * writes, measures and frees everything (cudaFree, um_buffer_destroy,
 * um_shutdown) before the next one starts.
 *
 * "GB/s" is the bytes that had to move (the inputs once in `stream`, every
 * pass in `update`, and the result every pass) divided by the total time:
 * the same figure for every system, so it compares like with like. unimem
 * also reports the bytes its copies did move, from um_link_stats_get.
 *
 * Built by bench/gpu/gpu_run.sh (step `managed`) with nvcc against
 * libunimem.a. Exit status: 0 ok, 1 a failure (printed: a failed call, a
 * wrong result, bad arguments, or data too large for the GPU), 2 no usable
 * GPU.
 */
#include <cuda_runtime.h>
#include <unimem.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

/* ------------------------------------------------------ error checking */

/* Every CUDA runtime call goes through CUDA_CHECK and every unimem call
 * through UM_CHECK: a failure prints where it happened, the call and the
 * error, and ends the program with status 1. */
#define CUDA_CHECK(call)                                                                    \
    do {                                                                                    \
        cudaError_t cuda_check_e_ = (call);                                                 \
        if (cuda_check_e_ != cudaSuccess) {                                                 \
            fprintf(stderr, "managed_compare: %s:%d: %s failed: %s: %s\n", __FILE__,        \
                    __LINE__, #call, cudaGetErrorName(cuda_check_e_),                       \
                    cudaGetErrorString(cuda_check_e_));                                     \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

#define UM_CHECK(call)                                                                      \
    do {                                                                                    \
        um_status um_check_s_ = (call);                                                     \
        if (um_check_s_ != UM_OK) {                                                         \
            fprintf(stderr, "managed_compare: %s:%d: %s failed: %s: %s\n", __FILE__,        \
                    __LINE__, #call, um_status_name(um_check_s_), um_last_error());         \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

namespace {

constexpr size_t kKiB = 1024, kMiB = 1024 * kKiB, kGiB = 1024 * kMiB;
/* The CUDA device every system uses; unimem calls it device 1. */
constexpr int kGpu = 0;
constexpr int kUmGpu = 1;
constexpr int kUmHost = 0;

/* ------------------------------------------------ CUDA 12 / 13 helpers */

/* CUDA 13 changed cudaMemPrefetchAsync and cudaMemAdvise to take a
 * cudaMemLocation (and prefetch a flags word) where CUDA 12 took a device
 * ordinal, with cudaCpuDeviceId for the host; CUDA 13 dropped the old
 * forms. These two helpers take the CUDA 12 form and call whichever the
 * toolkit has. */
cudaError_t prefetch_to(const void *p, size_t n, int device, cudaStream_t s)
{
#if CUDART_VERSION >= 13000
    cudaMemLocation loc;
    memset(&loc, 0, sizeof loc);
    if (device == cudaCpuDeviceId) {
        loc.type = cudaMemLocationTypeHost; /* the id is ignored for the host */
        loc.id = 0;
    } else {
        loc.type = cudaMemLocationTypeDevice;
        loc.id = device;
    }
    return cudaMemPrefetchAsync(p, n, loc, 0, s);
#else
    return cudaMemPrefetchAsync(p, n, device, s);
#endif
}

cudaError_t advise_read_mostly(const void *p, size_t n, int device)
{
#if CUDART_VERSION >= 13000
    /* The location is ignored for this advice, but it must be well formed. */
    cudaMemLocation loc;
    memset(&loc, 0, sizeof loc);
    loc.type = cudaMemLocationTypeDevice;
    loc.id = device;
    return cudaMemAdvise(p, n, cudaMemAdviseSetReadMostly, loc);
#else
    return cudaMemAdvise(p, n, cudaMemAdviseSetReadMostly, device);
#endif
}

/* ------------------------------------------------------------- options */

enum Workload { kStream = 0, kUpdate = 1, kWorkloads = 2 };
enum System { kManagedPrefetch = 0, kManagedPlain = 1, kUnimem = 2, kSystems = 3 };

const char *const kWorkloadName[kWorkloads] = {"stream", "update"};
const char *const kSystemName[kSystems] = {"managed_prefetch", "managed_plain", "unimem"};

struct Options {
    size_t buffers = 16;
    size_t size = 256 * kMiB;
    int passes = 5;
    int rounds = 2;
    bool plain = true;        /* run managed_plain */
    bool read_mostly = false; /* cudaMemAdviseSetReadMostly on managed_prefetch's inputs */
    bool workload[kWorkloads] = {true, true};
    const char *json_path = nullptr;
};

void usage(FILE *f)
{
    fprintf(f,
            "usage: managed_compare [--buffers N] [--size BYTES] [--passes P] [--rounds R]\n"
            "                       [--quick] [--no-plain] [--read-mostly]\n"
            "                       [--workload stream|update] [--json FILE]\n"
            "\n"
            "Runs the same GPU workloads through CUDA managed memory (cudaMallocManaged with\n"
            "cudaMemPrefetchAsync hints, and without hints) and through unimem unified\n"
            "buffers, and prints the times side by side. The data must fit in half of the\n"
            "GPU's free memory (managed memory is never oversubscribed here).\n"
            "\n"
            "  --buffers N       input buffers (default 16)\n"
            "  --size BYTES      bytes per buffer, K/M/G suffixes allowed, a multiple of 16\n"
            "                    (default 256M)\n"
            "  --passes P        passes per run (default 5)\n"
            "  --rounds R        runs of each system, alternating; the best is reported\n"
            "                    (default 2)\n"
            "  --quick           --buffers 8 --size 64M --passes 3 (flags given win)\n"
            "  --no-plain        skip managed memory without hints (page faults only)\n"
            "  --read-mostly     managed_prefetch also sets cudaMemAdviseSetReadMostly on\n"
            "                    the inputs\n"
            "  --workload NAME   only `stream` or only `update` (default both)\n"
            "  --json FILE       one JSON object per line per (workload, system)\n");
}

/* Parses a positive integer option value; false if it is not one. */
bool parse_count(const char *text, long max, long *out)
{
    char *end = nullptr;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < 1 || v > max)
        return false;
    *out = v;
    return true;
}

/* Returns -1 when the program should go on, else the exit status. Explicit
 * flags win over --quick, whatever their order. */
int parse_args(int argc, char **argv, Options *o)
{
    long buffers = 0, passes = 0, rounds = 0;
    size_t size = 0;
    bool quick = false;
    bool only[kWorkloads] = {false, false};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
        bool takes_value = !strcmp(a, "--buffers") || !strcmp(a, "--size") ||
                           !strcmp(a, "--passes") || !strcmp(a, "--rounds") ||
                           !strcmp(a, "--json") || !strcmp(a, "--workload");
        if (takes_value && !v) {
            fprintf(stderr, "managed_compare: %s needs a value\n", a);
            return 1;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--buffers")) {
            if (!parse_count(v, 1 << 20, &buffers)) {
                fprintf(stderr, "managed_compare: --buffers %s: want a count of at least 1\n", v);
                return 1;
            }
        } else if (!strcmp(a, "--size")) {
            if (um_parse_size(v, &size) != UM_OK || size < 16 || size % 16 != 0) {
                fprintf(stderr,
                        "managed_compare: --size %s: want a byte count (K/M/G suffixes allowed) "
                        "that is a multiple of 16 and at least 16\n",
                        v);
                return 1;
            }
        } else if (!strcmp(a, "--passes")) {
            if (!parse_count(v, 1 << 20, &passes)) {
                fprintf(stderr, "managed_compare: --passes %s: want a count of at least 1\n", v);
                return 1;
            }
        } else if (!strcmp(a, "--rounds")) {
            if (!parse_count(v, 1000, &rounds)) {
                fprintf(stderr, "managed_compare: --rounds %s: want a count from 1 to 1000\n", v);
                return 1;
            }
        } else if (!strcmp(a, "--json")) {
            o->json_path = v;
        } else if (!strcmp(a, "--workload")) {
            if (!strcmp(v, "stream")) {
                only[kStream] = true;
            } else if (!strcmp(v, "update")) {
                only[kUpdate] = true;
            } else {
                fprintf(stderr, "managed_compare: --workload %s: want stream or update\n", v);
                return 1;
            }
        } else if (!strcmp(a, "--quick")) {
            quick = true;
            continue;
        } else if (!strcmp(a, "--no-plain")) {
            o->plain = false;
            continue;
        } else if (!strcmp(a, "--read-mostly")) {
            o->read_mostly = true;
            continue;
        } else {
            fprintf(stderr, "managed_compare: unknown argument '%s'\n", a);
            usage(stderr);
            return 1;
        }
        i++; /* the value just read */
    }
    if (quick) {
        o->buffers = 8;
        o->size = 64 * kMiB;
        o->passes = 3;
    }
    if (buffers)
        o->buffers = size_t(buffers);
    if (size)
        o->size = size;
    if (passes)
        o->passes = int(passes);
    if (rounds)
        o->rounds = int(rounds);
    if (only[kStream] || only[kUpdate])
        for (int w = 0; w < kWorkloads; w++)
            o->workload[w] = only[w];
    return -1;
}

/* ---------------------------------------------------------- utilities */

double now_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

std::string bytes_text(double b)
{
    char t[32];
    if (b >= double(kGiB))
        snprintf(t, sizeof t, "%.2f GiB", b / double(kGiB));
    else if (b >= double(kMiB))
        snprintf(t, sizeof t, "%.0f MiB", b / double(kMiB));
    else if (b >= double(kKiB))
        snprintf(t, sizeof t, "%.0f KiB", b / double(kKiB));
    else
        snprintf(t, sizeof t, "%.0f B", b);
    return t;
}

/* The host's loops over buffer words (writing the patterns, checking the
 * result) run on a few threads, as a data loader would, so that the host
 * side is not the bottleneck of every system alike. The same loops serve
 * every system. */
unsigned host_threads()
{
    unsigned n = std::thread::hardware_concurrency();
    return std::max(1u, std::min(n, 8u));
}

/* Runs f(begin, end) over [0, n) split into one contiguous range per
 * thread. */
template <typename F> void parallel_for(size_t n, F f)
{
    unsigned t = host_threads();
    if (t == 1 || n < (size_t(1) << 16)) {
        f(size_t(0), n);
        return;
    }
    std::vector<std::thread> pool;
    size_t step = (n + t - 1) / t;
    for (unsigned k = 0; k < t; k++) {
        size_t b = std::min(n, size_t(k) * step), e = std::min(n, b + step);
        if (b < e)
            pool.emplace_back(f, b, e);
    }
    for (std::thread &th : pool)
        th.join();
}

/* ------------------------------------------------------ data patterns */

/* Input i of data version v holds word j = j * kWordStep + tag(i, v)
 * (uint32 arithmetic). Version 0 is what the host writes before the timed
 * passes; in `update`, pass p writes version p + 1. The tag is a hash, so
 * that an input read twice in place of another, a stale version, a
 * missing input or a stale part of one all change the sum. */
constexpr uint32_t kWordStep = 2654435761u;

uint32_t tag(size_t input, uint32_t version)
{
    uint64_t x = (uint64_t(input) << 32) ^ version ^ 0x9e3779b97f4a7c15ull;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return uint32_t(x);
}

void write_pattern(uint32_t *words, size_t n, uint32_t t)
{
    parallel_for(n, [words, t](size_t b, size_t e) {
        for (size_t j = b; j < e; j++)
            words[j] = uint32_t(j) * kWordStep + t;
    });
}

/* The result of a pass is the sum of all the inputs of one version:
 * word j = buffers * j * kWordStep + (the sum of the tags). Checks every
 * word; on a mismatch prints the first one and ends the program. */
void check_result(const uint32_t *words, size_t n, size_t buffers, uint32_t version,
                  const char *workload, const char *system, int pass)
{
    uint32_t base = 0;
    for (size_t i = 0; i < buffers; i++)
        base += tag(i, version);
    const uint32_t step = uint32_t(buffers) * kWordStep;
    std::atomic<size_t> first_bad(SIZE_MAX);
    parallel_for(n, [&](size_t b, size_t e) {
        for (size_t j = b; j < e; j++) {
            if (words[j] != uint32_t(j) * step + base) {
                size_t seen = first_bad.load();
                while (j < seen && !first_bad.compare_exchange_weak(seen, j)) {
                }
                return;
            }
        }
    });
    size_t j = first_bad.load();
    if (j != SIZE_MAX) {
        fprintf(stderr,
                "managed_compare: WRONG RESULT: %s / %s, pass %d: word %zu (byte %zu) is "
                "0x%08x, expected 0x%08x (the sum of %zu inputs of version %u)\n",
                workload, system, pass + 1, j, j * 4, words[j], uint32_t(j) * step + base,
                buffers, version);
        exit(1);
    }
}

/* -------------------------------------------------------------- kernel */

/* result[k] = in[k] (first) or result[k] += in[k], 16 bytes a thread per
 * step, over a grid-stride loop. */
__global__ void accumulate(uint4 *__restrict__ result, const uint4 *__restrict__ in, size_t n,
                           int first)
{
    size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t k = size_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += stride) {
        uint4 v = in[k];
        if (!first) {
            uint4 r = result[k];
            v.x += r.x;
            v.y += r.y;
            v.z += r.z;
            v.w += r.w;
        }
        result[k] = v;
    }
}

struct Launch {
    unsigned blocks = 1;
    unsigned threads = 256;
};

Launch g_launch;

void launch_accumulate(void *result, const void *in, size_t bytes, bool first, cudaStream_t s)
{
    size_t n = bytes / sizeof(uint4);
    accumulate<<<g_launch.blocks, g_launch.threads, 0, s>>>(
        static_cast<uint4 *>(result), static_cast<const uint4 *>(in), n, first ? 1 : 0);
    CUDA_CHECK(cudaGetLastError());
}

/* ------------------------------------------------------------- a run */

/* The figures of one run of one (workload, system). */
struct RunResult {
    bool ran = false;
    int round = 0;
    double first_s = 0, steady_s = 0, total_s = 0;
    bool has_bytes = false; /* unimem only: what its copies moved */
    uint64_t bytes_h2d = 0, bytes_d2h = 0;
};

/* The bytes that had to move in a run: the inputs once (stream) or every
 * pass (update), and the result to the host every pass. */
double required_bytes(const Options &o, int workload)
{
    double inputs = double(o.buffers) * double(o.size);
    double result = double(o.size) * o.passes;
    return (workload == kUpdate ? inputs * o.passes : inputs) + result;
}

/* Fills first/steady/total from the pass times. */
void summarize(const std::vector<double> &pass_s, RunResult *r)
{
    r->first_s = pass_s[0];
    r->total_s = 0;
    for (double t : pass_s)
        r->total_s += t;
    r->steady_s = pass_s.size() > 1 ? (r->total_s - pass_s[0]) / double(pass_s.size() - 1) : 0;
}

/* The data must fit in half of the GPU's free memory, so that managed
 * memory is never oversubscribed and unimem never has to evict. Checked
 * at the start and again before every run (the machine may be shared). */
void check_fits(const Options &o, const char *when)
{
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    double need = double(o.buffers + 1) * double(o.size);
    if (need > 0.5 * double(free_b)) {
        fprintf(stderr,
                "managed_compare: refusing to run (%s): the data (%zu inputs + 1 result of %s "
                "= %s) is more than half of the GPU's free memory (%s free of %s). This "
                "benchmark compares data that fits on the device; use fewer (--buffers) or "
                "smaller (--size) buffers.\n",
                when, o.buffers, bytes_text(double(o.size)).c_str(), bytes_text(need).c_str(),
                bytes_text(double(free_b)).c_str(), bytes_text(double(total_b)).c_str());
        exit(1);
    }
}

/* Managed memory, with prefetch hints (prefetch) or without any (plain). */
RunResult run_managed(const Options &o, int workload, bool prefetch)
{
    const char *wname = kWorkloadName[workload];
    const char *sname = kSystemName[prefetch ? kManagedPrefetch : kManagedPlain];
    const size_t S = o.size, N = o.buffers, words = S / 4;
    const bool read_mostly = prefetch && o.read_mostly;
    cudaStream_t stream, host_stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    /* Moves back to the host before a rewrite go on their own stream, so
     * they overlap the GPU's work on the stream. */
    CUDA_CHECK(cudaStreamCreateWithFlags(&host_stream, cudaStreamNonBlocking));

    /* Setup, not timed: allocate, advise, and write version 0 on the host
     * (the pages are made on the host, where they are first touched). */
    std::vector<uint32_t *> in(N, nullptr);
    uint32_t *result = nullptr;
    for (size_t i = 0; i < N; i++) {
        CUDA_CHECK(cudaMallocManaged(&in[i], S, cudaMemAttachGlobal));
        if (read_mostly)
            CUDA_CHECK(advise_read_mostly(in[i], S, kGpu));
        write_pattern(in[i], words, tag(i, 0));
    }
    CUDA_CHECK(cudaMallocManaged(&result, S, cudaMemAttachGlobal));
    CUDA_CHECK(cudaDeviceSynchronize());

    std::vector<double> pass_s;
    for (int p = 0; p < o.passes; p++) {
        const uint32_t version = workload == kUpdate ? uint32_t(p + 1) : 0;
        double t0 = now_s();
        if (prefetch)
            CUDA_CHECK(prefetch_to(result, S, kGpu, stream));
        /* update with prefetch but without read-mostly: each input is
         * moved back to the host (one input ahead) before the host rewrites
         * it, rather than by the host's page faults. With read-mostly the
         * host's copy is still there; without hints the faults do it. */
        const bool move_back = workload == kUpdate && prefetch && !read_mostly;
        if (move_back)
            CUDA_CHECK(prefetch_to(in[0], S, cudaCpuDeviceId, host_stream));
        for (size_t i = 0; i < N; i++) {
            if (workload == kUpdate) {
                if (move_back) {
                    CUDA_CHECK(cudaStreamSynchronize(host_stream));
                    if (i + 1 < N)
                        CUDA_CHECK(prefetch_to(in[i + 1], S, cudaCpuDeviceId, host_stream));
                }
                write_pattern(in[i], words, tag(i, version));
            }
            if (prefetch)
                CUDA_CHECK(prefetch_to(in[i], S, kGpu, stream));
            launch_accumulate(result, in[i], S, i == 0, stream);
        }
        if (prefetch)
            CUDA_CHECK(prefetch_to(result, S, cudaCpuDeviceId, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        check_result(result, words, N, version, wname, sname, p);
        pass_s.push_back(now_s() - t0);
    }

    for (size_t i = 0; i < N; i++)
        CUDA_CHECK(cudaFree(in[i]));
    CUDA_CHECK(cudaFree(result));
    CUDA_CHECK(cudaStreamDestroy(host_stream));
    CUDA_CHECK(cudaStreamDestroy(stream));
    CUDA_CHECK(cudaDeviceSynchronize());

    RunResult r;
    r.ran = true;
    summarize(pass_s, &r);
    return r;
}

/* The link counters of the context: host to GPU and GPU to host. */
void link_bytes(um_context *ctx, uint64_t *h2d, uint64_t *d2h)
{
    um_link_stats s;
    UM_CHECK(um_link_stats_get(ctx, kUmHost, kUmGpu, &s));
    *h2d = s.bytes;
    UM_CHECK(um_link_stats_get(ctx, kUmGpu, kUmHost, &s));
    *d2h = s.bytes;
}

/* unimem unified buffers, in a context of their own (made and shut down
 * here, so that nothing carries over between runs). */
RunResult run_unimem(const Options &o, int workload)
{
    const char *wname = kWorkloadName[workload];
    const char *sname = kSystemName[kUnimem];
    const size_t S = o.size, N = o.buffers, words = S / 4;

    um_context *ctx = nullptr;
    UM_CHECK(um_init("devices=cuda:0", &ctx));
    um_device_info info;
    UM_CHECK(um_device_info_get(ctx, kUmGpu, &info));
    if (info.kind != UM_DEVICE_CUDA || info.ordinal != kGpu) {
        fprintf(stderr,
                "managed_compare: unimem device 1 is %s (ordinal %d), not CUDA device %d: the "
                "comparison needs them to be the same GPU (is UNIMEM_CONF setting devices?)\n",
                um_device_kind_name(info.kind), info.ordinal, kGpu);
        exit(1);
    }
    /* The kernels' stream, known to unimem: acquisitions order it after
     * unimem's copies, and releases order later copies after its work. */
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    um_stream us = nullptr;
    UM_CHECK(um_stream_wrap(ctx, kUmGpu, static_cast<void *>(stream), &us));

    /* Setup, not timed: create the buffers and write version 0 from the
     * program's memory with um_buffer_write (the host replica becomes the
     * owner). The first buffer of a context may measure the links. */
    std::vector<um_buffer *> in(N, nullptr);
    um_buffer *result = nullptr;
    std::vector<uint32_t> staging(words);
    for (size_t i = 0; i < N; i++) {
        UM_CHECK(um_buffer_create(ctx, S, nullptr, &in[i]));
        write_pattern(staging.data(), words, tag(i, 0));
        UM_CHECK(um_buffer_write(in[i], 0, staging.data(), S));
    }
    UM_CHECK(um_buffer_create(ctx, S, nullptr, &result));
    std::vector<uint32_t>().swap(staging);

    uint64_t h2d0 = 0, d2h0 = 0;
    link_bytes(ctx, &h2d0, &d2h0);
    std::vector<double> pass_s;
    for (int p = 0; p < o.passes; p++) {
        const uint32_t version = workload == kUpdate ? uint32_t(p + 1) : 0;
        double t0 = now_s();
        /* Every pass overwrites the result whole: no copy in. */
        void *dres = nullptr;
        UM_CHECK(um_buffer_acquire(result, kUmGpu, UM_ACCESS_WRITE_DISCARD, us, &dres));
        if (workload == kStream)
            for (size_t i = 0; i < N; i++)
                UM_CHECK(um_buffer_prefetch(in[i], kUmGpu));
        for (size_t i = 0; i < N; i++) {
            if (workload == kUpdate) {
                /* The host writes the new version straight into the host
                 * replica; the acquisition makes the GPU's copy invalid
                 * without copying anything. */
                void *h = nullptr;
                UM_CHECK(um_buffer_acquire(in[i], kUmHost, UM_ACCESS_WRITE_DISCARD, nullptr, &h));
                write_pattern(static_cast<uint32_t *>(h), words, tag(i, version));
                UM_CHECK(um_buffer_release(in[i], kUmHost, nullptr));
            }
            void *d = nullptr;
            UM_CHECK(um_buffer_acquire(in[i], kUmGpu, UM_ACCESS_READ, us, &d));
            launch_accumulate(dres, d, S, i == 0, stream);
            UM_CHECK(um_buffer_release(in[i], kUmGpu, us));
        }
        UM_CHECK(um_buffer_release(result, kUmGpu, us));
        /* The result to the host: the acquisition returns once the copy
         * (ordered after the kernels) is done. */
        void *hres = nullptr;
        UM_CHECK(um_buffer_acquire(result, kUmHost, UM_ACCESS_READ, nullptr, &hres));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        check_result(static_cast<const uint32_t *>(hres), words, N, version, wname, sname, p);
        UM_CHECK(um_buffer_release(result, kUmHost, nullptr));
        pass_s.push_back(now_s() - t0);
    }
    uint64_t h2d1 = 0, d2h1 = 0;
    link_bytes(ctx, &h2d1, &d2h1);

    for (size_t i = 0; i < N; i++)
        UM_CHECK(um_buffer_destroy(in[i]));
    UM_CHECK(um_buffer_destroy(result));
    UM_CHECK(um_stream_destroy(ctx, us));
    um_shutdown(ctx);
    CUDA_CHECK(cudaStreamDestroy(stream));
    CUDA_CHECK(cudaDeviceSynchronize());

    RunResult r;
    r.ran = true;
    summarize(pass_s, &r);
    r.has_bytes = true;
    r.bytes_h2d = h2d1 - h2d0;
    r.bytes_d2h = d2h1 - d2h0;
    return r;
}

/* ----------------------------------------------------------- reporting */

void print_run(const Options &o, int workload, int system, const RunResult &r)
{
    printf("  round %d  %-17s first %8.4f s  steady %8.4f s  total %8.4f s  %6.1f GB/s", r.round,
           kSystemName[system], r.first_s, r.steady_s, r.total_s,
           required_bytes(o, workload) / r.total_s / 1e9);
    if (r.has_bytes)
        printf("  (moved %s to, %s from the GPU)", bytes_text(double(r.bytes_h2d)).c_str(),
               bytes_text(double(r.bytes_d2h)).c_str());
    printf("\n");
    fflush(stdout);
}

void print_table(const Options &o, int workload, const RunResult *best)
{
    double inputs = double(o.buffers) * double(o.size);
    printf("\n%s: %zu inputs x %s (%s) + a %s result, %d passes; best of %d round%s\n",
           kWorkloadName[workload], o.buffers, bytes_text(double(o.size)).c_str(),
           bytes_text(inputs).c_str(), bytes_text(double(o.size)).c_str(), o.passes, o.rounds,
           o.rounds == 1 ? "" : "s");
    printf("  bytes that had to move: %s (%s)\n", bytes_text(required_bytes(o, workload)).c_str(),
           workload == kUpdate ? "every input to the GPU and the result to the host, every pass"
                               : "the inputs to the GPU once, the result to the host every pass");
    printf("  %-17s %12s %12s %12s %8s %12s %12s\n", "system", "first pass", "steady pass",
           "total", "GB/s", "to GPU", "from GPU");
    for (int s = 0; s < kSystems; s++) {
        const RunResult &r = best[s];
        if (!r.ran)
            continue;
        char steady[32];
        if (o.passes > 1)
            snprintf(steady, sizeof steady, "%.4f s", r.steady_s);
        else
            snprintf(steady, sizeof steady, "-");
        printf("  %-17s %10.4f s %12s %10.4f s %8.1f %12s %12s\n", kSystemName[s], r.first_s,
               steady, r.total_s, required_bytes(o, workload) / r.total_s / 1e9,
               r.has_bytes ? bytes_text(double(r.bytes_h2d)).c_str() : "-",
               r.has_bytes ? bytes_text(double(r.bytes_d2h)).c_str() : "-");
    }
    printf("  (to/from GPU: the bytes unimem's copies moved during the passes, from "
           "um_link_stats_get; managed memory has no such counter)\n");
    const RunResult &m = best[kManagedPrefetch], &u = best[kUnimem];
    printf("  unimem / managed_prefetch: total %.2f, first pass %.2f", u.total_s / m.total_s,
           u.first_s / m.first_s);
    if (o.passes > 1 && m.steady_s > 0)
        printf(", steady pass %.2f", u.steady_s / m.steady_s);
    printf("  (<= 1.00: unimem at least as fast)\n");
    fflush(stdout);
}

void write_json(FILE *f, const Options &o, int workload, const RunResult *best)
{
    const RunResult &m = best[kManagedPrefetch];
    for (int s = 0; s < kSystems; s++) {
        const RunResult &r = best[s];
        if (!r.ran)
            continue;
        fprintf(f,
                "{\"workload\": \"%s\", \"system\": \"%s\", \"buffers\": %zu, \"size\": %zu, "
                "\"passes\": %d, \"round\": %d, \"first_pass_s\": %.6f, ",
                kWorkloadName[workload], kSystemName[s], o.buffers, o.size, o.passes, r.round,
                r.first_s);
        if (o.passes > 1)
            fprintf(f, "\"steady_pass_s\": %.6f, ", r.steady_s);
        else
            fprintf(f, "\"steady_pass_s\": null, ");
        fprintf(f, "\"total_s\": %.6f, \"required_bytes\": %.0f, \"gbps\": %.3f", r.total_s,
                required_bytes(o, workload), required_bytes(o, workload) / r.total_s / 1e9);
        if (s == kManagedPrefetch)
            fprintf(f, ", \"read_mostly\": %s", o.read_mostly ? "true" : "false");
        if (r.has_bytes)
            fprintf(f, ", \"bytes_h2d\": %" PRIu64 ", \"bytes_d2h\": %" PRIu64, r.bytes_h2d,
                    r.bytes_d2h);
        if (s == kUnimem && m.ran)
            fprintf(f, ", \"ratio_vs_managed_prefetch\": %.4f", r.total_s / m.total_s);
        fprintf(f, "}\n");
    }
}

} // namespace

int main(int argc, char **argv)
{
    Options o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;

    /* No GPU (or no driver) is a clean refusal with the reason, not a
     * failure of the first call that needs one. */
    int gpus = 0;
    cudaError_t e = cudaGetDeviceCount(&gpus);
    if (e != cudaSuccess || gpus == 0) {
        char why[256] = "";
        int driver = 0, ngpu = 0;
        if (um_cuda_driver_info(&driver, &ngpu, why, sizeof why) == UM_OK)
            snprintf(why, sizeof why, "driver %d reports %d GPU%s", driver, ngpu,
                     ngpu == 1 ? "" : "s");
        fprintf(stderr, "managed_compare: no usable GPU: %s%s%s (%s)\n",
                e != cudaSuccess ? "cudaGetDeviceCount failed: " : "cudaGetDeviceCount found 0 devices",
                e != cudaSuccess ? cudaGetErrorName(e) : "",
                e != cudaSuccess ? (std::string(": ") + cudaGetErrorString(e)).c_str() : "", why);
        return 2;
    }
    CUDA_CHECK(cudaSetDevice(kGpu));
    CUDA_CHECK(cudaFree(nullptr)); /* makes the primary context, which unimem shares */

    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, kGpu));
    int driver = 0, runtime = 0, concurrent = 0;
    CUDA_CHECK(cudaDriverGetVersion(&driver));
    CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    CUDA_CHECK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, kGpu));
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    printf("managed_compare: GPU %d of %d: %s (cc %d.%d), %s free of %s; driver %d, runtime %d "
           "(built with %d)\n",
           kGpu, gpus, prop.name, prop.major, prop.minor, bytes_text(double(free_b)).c_str(),
           bytes_text(double(total_b)).c_str(), driver, runtime, CUDART_VERSION);
    if (!concurrent) {
        /* Without it managed memory cannot migrate on demand nor be
         * prefetched, so there would be nothing to compare with. */
        fprintf(stderr,
                "managed_compare: no usable GPU: %s has concurrentManagedAccess = 0 (managed "
                "memory cannot be prefetched or migrate on demand there)\n",
                prop.name);
        return 2;
    }
    check_fits(o, "at the start");
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    double host_need = double(o.buffers + 2) * double(o.size); /* + unimem's staging buffer */
    if (pages > 0 && page > 0 && host_need > 0.5 * double(pages) * double(page)) {
        fprintf(stderr,
                "managed_compare: refusing to run: the data (%s with the host's staging copy) "
                "is more than half of the host's memory (%s)\n",
                bytes_text(host_need).c_str(), bytes_text(double(pages) * double(page)).c_str());
        return 1;
    }

    /* One small launch loads the kernel's module, so that no run's first
     * pass pays for it. */
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, kGpu));
    g_launch.blocks = unsigned(std::max(1, sms) * 8);
    {
        void *warm = nullptr;
        CUDA_CHECK(cudaMalloc(&warm, 2 * sizeof(uint4)));
        launch_accumulate(warm, static_cast<char *>(warm) + sizeof(uint4), sizeof(uint4), true,
                          nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaFree(warm));
    }
    printf("config: %zu inputs x %s, %d passes, %d round%s, kernel %u x %u, %u host threads%s%s\n",
           o.buffers, bytes_text(double(o.size)).c_str(), o.passes, o.rounds,
           o.rounds == 1 ? "" : "s", g_launch.blocks, g_launch.threads, host_threads(),
           o.read_mostly ? ", managed_prefetch with cudaMemAdviseSetReadMostly" : "",
           getenv("UNIMEM_CONF") ? (std::string(", UNIMEM_CONF=") + getenv("UNIMEM_CONF")).c_str()
                                 : "");

    FILE *json = nullptr;
    if (o.json_path && !(json = fopen(o.json_path, "w"))) {
        fprintf(stderr, "managed_compare: cannot write %s: %s\n", o.json_path, strerror(errno));
        return 1;
    }
    for (int w = 0; w < kWorkloads; w++) {
        if (!o.workload[w])
            continue;
        printf("\n%s:\n", kWorkloadName[w]);
        RunResult best[kSystems];
        for (int round = 1; round <= o.rounds; round++) {
            for (int s = 0; s < kSystems; s++) {
                if (s == kManagedPlain && !o.plain)
                    continue;
                check_fits(o, "before a run");
                RunResult r = s == kUnimem ? run_unimem(o, w) : run_managed(o, w, s == kManagedPrefetch);
                r.round = round;
                print_run(o, w, s, r);
                if (!best[s].ran || r.total_s < best[s].total_s)
                    best[s] = r;
            }
        }
        print_table(o, w, best);
        if (json) {
            write_json(json, o, w, best);
            fflush(json);
        }
    }
    if (json && fclose(json) != 0) {
        fprintf(stderr, "managed_compare: writing %s: %s\n", o.json_path, strerror(errno));
        return 1;
    }
    printf("\nall results checked: every pass of every run read back the expected sums\n");
    return 0;
}
