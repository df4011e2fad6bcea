/*
 * alloc_compare: the host-side cost of one alloc+free pair on one GPU, for
 * four allocators measured in the same run on the same size sequences:
 *
 *   cudaMalloc       cudaMalloc / cudaFree
 *   cudaMallocAsync  cudaMallocAsync / cudaFreeAsync on one stream; the
 *                    device's default pool keeps everything it gets
 *   torch            PyTorch's caching allocator (raw_alloc / raw_delete)
 *   unimem           um_malloc / um_free on unimem device 1 (CUDA ordinal 0)
 *
 * Scenarios: "pair-by-size" (alloc+free of one size, repeated),
 * "live-10k-mixed" (10,000 live blocks of a fixed-seed size mix; each step
 * frees a pseudo-random live block and allocates the next size of the mix in
 * its place), "live-10k-mixed-paired" (the same for PyTorch and unimem
 * taking turns, see live_mixed_paired) and "threads" (1, 4, 16 threads,
 * each with its own ring of 100 live small blocks). Every figure is the
 * median of 3 timed measurements (8 in turns for the paired scenario)
 * after a warm-up; a measurement stops at a time budget, because cudaMalloc
 * takes tens to hundreds of microseconds a pair.
 *
 * No allocator's memory is touched, so the figures are allocator bookkeeping
 * only, except in --verify mode, which writes and reads back a pattern in a
 * sample of unimem's blocks (outside the timed parts) to check that they are
 * real, distinct device memory.
 *
 * Built with unimem by CMake (bench/gpu/CMakeLists.txt) and run by `unimem
 * bench gpu`; bench/gpu/build_compare.sh builds it against another tree's
 * library. -DUM_NO_TORCH leaves PyTorch out.
 * Exit status: 0 ok, 1 a failure (printed), 2 no usable GPU.
 */
#include <cuda_runtime_api.h>
#include <sched.h>
#include <unimem.h>
#include <unistd.h>

#include "../mixed_sizes.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#ifndef UM_NO_TORCH
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#endif

namespace {

constexpr int kRepeats = 3;
constexpr int kPairedRounds = 8; /* live-10k-mixed-paired: rounds of one turn each */
/* threads_scenario reports its middle measurement itself, which an even
 * count does not have. */
static_assert(kRepeats % 2 == 1, "kRepeats must be odd");
constexpr size_t kKiB = 1024, kMiB = 1024 * kKiB, kGiB = 1024 * kMiB;
constexpr size_t kLiveBlocks = 10000;
constexpr size_t kLiveBytesCap = 60 * kGiB;
constexpr size_t kSmallMin = MIX_SMALL_MIN, kSmallMax = MIX_SMALL_MAX;
constexpr int kThreadRing = 100;
/* The step sequence of live-10k-mixed is precomputed so that generating it
 * costs nothing in the timed loop; a long run wraps around it. */
constexpr size_t kMixSteps = size_t(1) << 20;
constexpr size_t kThreadSizes = 4096;
constexpr uint64_t kSeed = MIX_SEED;
constexpr int kThreadCounts[] = {1, 4, 16};
constexpr size_t kPairSizes[] = {256, 4 * kKiB, 64 * kKiB, 1 * kMiB, 16 * kMiB, 128 * kMiB};

/* ------------------------------------------------------------- options */

struct Options {
    bool quick = false;
    bool skip_torch = false;
    bool verify = false;
    const char *json_path = nullptr;
    int pin = -1;           /* the core of the single-thread scenarios; -1: none */
    double budget_s = 0.3;  /* one timed measurement */
    double warmup_s = 0.1;  /* the warm-up before the timed ones */
};

void usage(FILE *f)
{
    fprintf(f,
            "usage: alloc_compare [--quick] [--skip-torch] [--verify] [--json FILE] [--pin CORE]\n"
            "\n"
            "Times alloc+free pairs on CUDA device 0 for cudaMalloc, cudaMallocAsync, PyTorch's\n"
            "caching allocator and unimem, in scenarios pair-by-size, live-10k-mixed and threads.\n"
            "\n"
            "  --quick       0.05 s per measurement instead of 0.3 s\n"
            "  --skip-torch  leave PyTorch's allocator out\n"
            "  --verify      write and read back a pattern in a sample of unimem's blocks\n"
            "  --json FILE   also write the rows as a JSON array to FILE\n"
            "  --pin CORE    run pair-by-size and live-10k-mixed on this core only (every\n"
            "                allocator alike), so the process does not move between cores\n"
            "                mid-measurement; the threads scenario runs unpinned\n"
            "\n"
            "Exit status: 0 ok, 1 a failure (printed), 2 a bad command line or no usable\n"
            "GPU.\n");
}

/* Returns -1 to go on, else the exit status. */
int parse_args(int argc, char **argv, Options *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--quick")) {
            o->quick = true;
        } else if (!strcmp(a, "--skip-torch")) {
            o->skip_torch = true;
        } else if (!strcmp(a, "--verify")) {
            o->verify = true;
        } else if (!strcmp(a, "--json")) {
            if (i + 1 >= argc || argv[i + 1][0] == '\0') {
                fprintf(stderr, "alloc_compare: --json needs a file name\n");
                return 2;
            }
            o->json_path = argv[++i];
        } else if (!strcmp(a, "--pin")) {
            char *end = nullptr;
            long core = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : -1;
            if (i + 1 >= argc || !end || *end || end == argv[i + 1] || core < 0 ||
                core >= CPU_SETSIZE) {
                fprintf(stderr, "alloc_compare: --pin needs a core number from 0 to %d, not '%s'\n",
                        CPU_SETSIZE - 1, i + 1 < argc ? argv[i + 1] : "");
                return 2;
            }
            o->pin = int(core);
            i++;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "alloc_compare: unknown option '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (o->quick) {
        o->budget_s = 0.05;
        o->warmup_s = 0.02;
    }
    return -1;
}

/* --------------------------------------------------------------- helpers */

double now_ns()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return double(ts.tv_sec) * 1e9 + double(ts.tv_nsec);
}

std::string format(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

std::string size_text(size_t n)
{
    if (n >= kGiB && n % kGiB == 0)
        return format("%zu GiB", n / kGiB);
    if (n >= kMiB && n % kMiB == 0)
        return format("%zu MiB", n / kMiB);
    if (n >= kKiB && n % kKiB == 0)
        return format("%zu KiB", n / kKiB);
    return format("%zu B", n);
}

std::string rate_text(double per_s)
{
    if (per_s >= 1e6)
        return format("%.2f M", per_s / 1e6);
    if (per_s >= 1e3)
        return format("%.2f K", per_s / 1e3);
    return format("%.1f", per_s);
}

/* ------------------------------------------------------------ allocators */

/* Each allocator is a small struct with the same members, and the scenarios
 * are templates over it, so every hot loop calls the allocator directly with
 * no indirection that one allocator would pay and another would not.
 *   alloc(n, &p) / release(p): false on failure, with error() on that thread
 *   trim(): hands cached memory back so allocators do not crowd each other */

thread_local cudaError_t t_cuda_error = cudaSuccess;

std::string cuda_error_text(cudaError_t e)
{
    return format("%s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
}

/* True on success; else keeps the error for error() and clears it, so
 * later calls do not report it again. */
inline bool cuda_ok(cudaError_t e)
{
    if (__builtin_expect(e == cudaSuccess, 1))
        return true;
    t_cuda_error = e;
    cudaGetLastError();
    return false;
}

struct CudaMallocAllocator {
    static constexpr const char *name = "cudaMalloc";
    static constexpr bool is_unimem = false;

    bool alloc(size_t n, void **p)
    {
        return cuda_ok(cudaMalloc(p, n));
    }
    bool release(void *p)
    {
        return cuda_ok(cudaFree(p));
    }
    std::string error() const { return cuda_error_text(t_cuda_error); }
    bool trim() { return cudaDeviceSynchronize() == cudaSuccess; }
};

struct CudaMallocAsyncAllocator {
    static constexpr const char *name = "cudaMallocAsync";
    static constexpr bool is_unimem = false;
    cudaStream_t stream = nullptr;
    cudaMemPool_t pool = nullptr;

    /* The pool keeps everything (release threshold UINT64_MAX): by default
     * it hands memory back at every synchronization, which measures the
     * driver instead of the pool. */
    std::string setup()
    {
        cudaError_t e = cudaDeviceGetDefaultMemPool(&pool, 0);
        if (e != cudaSuccess)
            return "cudaDeviceGetDefaultMemPool: " + cuda_error_text(e);
        uint64_t keep_all = UINT64_MAX;
        e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all);
        if (e != cudaSuccess)
            return "cudaMemPoolSetAttribute(ReleaseThreshold): " + cuda_error_text(e);
        e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        if (e != cudaSuccess)
            return "cudaStreamCreateWithFlags: " + cuda_error_text(e);
        return "";
    }
    bool alloc(size_t n, void **p)
    {
        return cuda_ok(cudaMallocAsync(p, n, stream));
    }
    bool release(void *p)
    {
        return cuda_ok(cudaFreeAsync(p, stream));
    }
    std::string error() const { return cuda_error_text(t_cuda_error); }
    bool trim()
    {
        return cudaStreamSynchronize(stream) == cudaSuccess &&
               cudaMemPoolTrimTo(pool, 0) == cudaSuccess;
    }
};

thread_local um_status t_um_status = UM_OK;

struct UnimemAllocator {
    static constexpr const char *name = "unimem";
    static constexpr bool is_unimem = true;
    um_context *ctx = nullptr;
    int dev = 1;

    bool alloc(size_t n, void **p)
    {
        um_status s = um_malloc(ctx, dev, n, NULL, p);
        if (__builtin_expect(s != UM_OK, 0)) {
            t_um_status = s;
            return false;
        }
        return true;
    }
    bool release(void *p)
    {
        um_status s = um_free(ctx, p, NULL);
        if (__builtin_expect(s != UM_OK, 0)) {
            t_um_status = s;
            return false;
        }
        return true;
    }
    std::string error() const
    {
        return format("%s: %s", um_status_name(t_um_status), um_last_error());
    }
    bool trim() { return um_trim(ctx, dev) == UM_OK; }
    /* The device's backend calls so far (driver calls on cuda:0), or -1. */
    long long backend_calls() const
    {
        um_stats st;
        return um_stats_get(ctx, dev, &st) == UM_OK ? (long long)st.num_backend_calls : -1;
    }
};

/* The backend calls of allocator a so far; -1 for the allocators that do
 * not count them. */
template <class A>
long long backend_calls_of(const A &a)
{
    if constexpr (A::is_unimem)
        return a.backend_calls();
    else
        return -1;
}

#ifndef UM_NO_TORCH
/* PyTorch's caching allocator through c10 alone (no libtorch). raw_alloc
 * allocates on the calling thread's current stream of the current device,
 * which is the default stream of device 0 after cudaSetDevice(0). */
thread_local std::string t_torch_error;

struct TorchAllocator {
    static constexpr const char *name = "torch";
    static constexpr bool is_unimem = false;

    std::string setup(int device_count)
    {
        try {
            c10::cuda::CUDACachingAllocator::init(device_count);
        } catch (const std::exception &ex) {
            return std::string("CUDACachingAllocator::init: ") + ex.what();
        }
        return "";
    }
    bool alloc(size_t n, void **p)
    {
        try {
            *p = c10::cuda::CUDACachingAllocator::raw_alloc(n);
        } catch (const std::exception &ex) {
            t_torch_error = ex.what();
            return false;
        }
        if (__builtin_expect(*p == nullptr, 0)) {
            t_torch_error = "raw_alloc returned NULL";
            return false;
        }
        return true;
    }
    bool release(void *p)
    {
        try {
            c10::cuda::CUDACachingAllocator::raw_delete(p);
        } catch (const std::exception &ex) {
            t_torch_error = ex.what();
            return false;
        }
        return true;
    }
    std::string error() const
    {
        /* c10 messages carry a C++ backtrace after the first line. */
        std::string first = t_torch_error.substr(0, t_torch_error.find('\n'));
        return first;
    }
    bool trim()
    {
        try {
            c10::cuda::CUDACachingAllocator::emptyCache();
        } catch (const std::exception &ex) {
            t_torch_error = ex.what();
            return false;
        }
        return true;
    }
};
#endif

/* ---------------------------------------------------------------- results */

struct Row {
    std::string scenario;
    size_t size = 0;         /* 0: mixed sizes */
    size_t live_blocks = 0;  /* blocks kept live (per thread in "threads") */
    size_t live_bytes = 0;   /* live-10k-mixed: bytes of the initial live set */
    int threads = 1;
    std::string allocator;
    double ns_per_pair = 0;  /* per thread in "threads" */
    double pairs_per_s = 0;  /* all threads together */
    uint64_t pairs = 0;      /* pairs timed by the median measurement */
    /* The fastest and slowest measurement's ns per pair, and (unimem) the
     * backend calls made while they ran (-1: not counted): a measurement
     * that met the pool growing shows both. */
    double ns_low = 0, ns_high = 0;
    long long backend_calls = -1;
    double scaling = 0;      /* threads: pairs_per_s / pairs_per_s of 1 thread */
    /* live-10k-mixed-paired: the median, lowest and highest of the rounds'
     * ratios (pairs/s over the other allocator's, measured in turns) */
    double paired_ratio = 0, paired_low = 0, paired_high = 0;
    std::string error;       /* non-empty: the row failed */
};

std::vector<Row> g_rows;
bool g_failed = false;

struct Sample {
    uint64_t pairs = 0;
    double ns = 0;
    double ns_per_pair() const { return pairs ? ns / double(pairs) : 0; }
};

/* The middle sample by ns per pair; for an even count, the lower of the
 * two middle ones (set_median gives the median itself). */
Sample median_of(std::vector<Sample> v)
{
    std::sort(v.begin(), v.end(),
              [](const Sample &a, const Sample &b) { return a.ns_per_pair() < b.ns_per_pair(); });
    return v[(v.size() - 1) / 2];
}

/* The median of v: the middle value, or for an even count (the paired
 * scenario's kPairedRounds) the mean of the two middle values; the upper
 * one alone leans towards the slower rounds, and for the rounds' ratios
 * towards unimem. */
double median_value(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    size_t h = v.size() / 2;
    return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

/* A row's timing: the median of its samples' ns per pair, and the pairs of
 * the middle sample (of the lower middle one for an even count). */
void set_median(Row &r, const std::vector<Sample> &samples)
{
    std::vector<double> ns;
    for (const Sample &x : samples)
        ns.push_back(x.ns_per_pair());
    r.ns_per_pair = median_value(ns);
    r.pairs_per_s = 1e9 / r.ns_per_pair;
    r.pairs = median_of(samples).pairs;
    r.ns_low = r.ns_high = r.ns_per_pair;
    for (const Sample &x : samples) {
        r.ns_low = std::min(r.ns_low, x.ns_per_pair());
        r.ns_high = std::max(r.ns_high, x.ns_per_pair());
    }
}

void fail_row(Row r, const std::string &what)
{
    r.error = what;
    fprintf(stderr, "alloc_compare: %s %s: %s\n", r.scenario.c_str(), r.allocator.c_str(),
            what.c_str());
    g_failed = true;
    g_rows.push_back(r);
}

/* Runs pairs(n) in chunks until budget_s has passed. The clock is read once
 * per chunk, and a chunk is sized to take about 1/64 of the budget, so the
 * clock costs nothing for the fast allocators and cudaMalloc's slow pairs
 * do not overshoot the budget. pairs(n) returns false on a failure. */
template <class Pairs>
bool run_timed(Pairs &&pairs, double budget_s, Sample *out)
{
    const double budget_ns = budget_s * 1e9;
    uint64_t chunk = 1, done = 0;
    const double t0 = now_ns();
    for (;;) {
        if (!pairs(chunk))
            return false;
        done += chunk;
        double t = now_ns() - t0;
        if (t >= budget_ns) {
            out->pairs = done;
            out->ns = t;
            return true;
        }
        double per_pair = t / double(done);
        double want = budget_ns / 64 / std::max(per_pair, 1.0);
        chunk = uint64_t(std::min(4096.0, std::max(1.0, want)));
    }
}

/* --------------------------------------------------------------- verify */

/* Writes a different byte pattern into every block of a sample with
 * cudaMemset, then reads every block back: a block that is not device
 * memory fails the memset or copy, and two blocks that overlap show the
 * later one's pattern in the earlier one. */
struct Verifier {
    um_context *ctx = nullptr;
    std::atomic<uint64_t> blocks{0}, bytes{0};
    std::atomic<bool> ok{true};

    bool check(const std::vector<std::pair<void *, size_t>> &sample, const char *where)
    {
        std::vector<unsigned char> host;
        for (size_t i = 0; i < sample.size(); i++) {
            void *p = sample[i].first;
            int dev = um_pointer_device(ctx, p);
            if (dev != 1 || (uintptr_t(p) & 255) != 0) {
                return bad(format("%s: block %p of %zu bytes: um_pointer_device says %d "
                                  "(want 1), alignment %zu (want 256)",
                                  where, p, sample[i].second, dev,
                                  size_t(uintptr_t(p) & 255)));
            }
            cudaError_t e = cudaMemset(p, pattern(i), sample[i].second);
            if (e != cudaSuccess)
                return bad(format("%s: cudaMemset of block %p (%zu bytes): %s", where, p,
                                  sample[i].second, cuda_error_text(e).c_str()));
        }
        for (size_t i = 0; i < sample.size(); i++) {
            host.assign(sample[i].second, 0);
            cudaError_t e = cudaMemcpy(host.data(), sample[i].first, sample[i].second,
                                       cudaMemcpyDeviceToHost);
            if (e != cudaSuccess)
                return bad(format("%s: cudaMemcpy from block %p (%zu bytes): %s", where,
                                  sample[i].first, sample[i].second, cuda_error_text(e).c_str()));
            for (size_t k = 0; k < host.size(); k++) {
                if (host[k] != pattern(i))
                    return bad(format("%s: block %p (%zu bytes) byte %zu reads 0x%02x, "
                                      "wrote 0x%02x: overlapping or not device memory",
                                      where, sample[i].first, sample[i].second, k, host[k],
                                      pattern(i)));
            }
            blocks++;
            bytes += sample[i].second;
        }
        return cudaDeviceSynchronize() == cudaSuccess || bad(format("%s: sync failed", where));
    }
    static unsigned char pattern(size_t i) { return (unsigned char)(1 + (i * 37) % 255); }
    bool bad(const std::string &msg)
    {
        static std::mutex m;
        std::lock_guard<std::mutex> lock(m);
        fprintf(stderr, "alloc_compare: verify FAILED: %s\n", msg.c_str());
        ok = false;
        g_failed = true;
        return false;
    }
};

Verifier *g_verify = nullptr; /* non-NULL in --verify mode */

/* ------------------------------------------------------------ scenarios */

/* A warm-up run, then kRepeats timed runs into samples, counting a's
 * backend calls during them into *calls; false when a pair failed. */
template <class A, class F>
bool warm_and_time(const A &a, F &pairs, const Options &o, std::vector<Sample> &samples,
                   long long *calls)
{
    Sample warm;
    bool ok = run_timed(pairs, o.warmup_s, &warm);
    long long before = backend_calls_of(a);
    for (size_t k = 0; ok && k < samples.size(); k++)
        ok = run_timed(pairs, o.budget_s, &samples[k]);
    long long after = backend_calls_of(a);
    *calls = before >= 0 && after >= 0 ? after - before : -1;
    return ok;
}

template <class A>
void pair_by_size(A &a, size_t size, const Options &o)
{
    Row r;
    r.scenario = "pair-by-size";
    r.size = size;
    r.allocator = A::name;
    if (A::is_unimem && g_verify) {
        std::vector<std::pair<void *, size_t>> sample;
        for (int i = 0; i < 4; i++) {
            void *p;
            if (!a.alloc(size, &p))
                break;
            sample.push_back({p, size});
        }
        if (sample.size() == 4)
            g_verify->check(sample, "pair-by-size");
        for (auto &s : sample)
            a.release(s.first);
    }
    auto pairs = [&](uint64_t n) {
        for (uint64_t i = 0; i < n; i++) {
            void *p;
            if (!a.alloc(size, &p) || !a.release(p))
                return false;
        }
        return true;
    };
    std::vector<Sample> samples(kRepeats);
    bool ok = warm_and_time(a, pairs, o, samples, &r.backend_calls);
    if (!ok) {
        fail_row(r, format("alloc+free of %s (%zu bytes) failed: %s", size_text(size).c_str(), size,
                           a.error().c_str()));
        a.trim();
        return;
    }
    if (!a.trim()) {
        fail_row(r, "trim after the measurement failed: " + a.error());
        return;
    }
    set_median(r, samples);
    g_rows.push_back(r);
}

/* The live-10k-mixed sequences, the same for every allocator. */
struct Mix {
    std::vector<size_t> initial;  /* the first kLiveBlocks sizes of the mix */
    std::vector<size_t> sizes;    /* the sizes that follow, one per step */
    std::vector<uint32_t> victim; /* the live block each step replaces */
    size_t initial_bytes = 0;
};

Mix make_mix()
{
    Mix m;
    uint64_t size_state = kSeed, victim_state = MIX_VICTIM_SEED;
    m.initial.resize(kLiveBlocks);
    for (auto &s : m.initial) {
        s = mix_size(&size_state);
        m.initial_bytes += s;
    }
    m.sizes.resize(kMixSteps);
    m.victim.resize(kMixSteps);
    for (size_t i = 0; i < kMixSteps; i++) {
        m.sizes[i] = mix_size(&size_state);
        m.victim[i] = uint32_t(mix_splitmix64(&victim_state) % kLiveBlocks);
    }
    return m;
}

/* Every 50th live block: 200 blocks of every band. */
std::vector<std::pair<void *, size_t>> live_sample(const std::vector<void *> &live,
                                                   const std::vector<size_t> &live_size)
{
    std::vector<std::pair<void *, size_t>> s;
    for (size_t i = 0; i < live.size(); i += 50)
        s.push_back({live[i], live_size[i]});
    return s;
}

/* One allocator's live-10k-mixed state: its live set, and where it is in
 * the step sequence. */
template <class A>
struct MixedRun {
    A &a;
    const Mix &mix;
    std::vector<void *> live;
    std::vector<size_t> live_size;
    uint64_t step = 0;
    size_t failed_size = 0; /* the size of the pair that failed */

    MixedRun(A &alloc, const Mix &m)
        : a(alloc), mix(m), live(kLiveBlocks, nullptr), live_size(m.initial)
    {
    }

    /* Allocates the initial live set: "" or what failed. */
    std::string fill()
    {
        for (size_t i = 0; i < kLiveBlocks; i++) {
            if (!a.alloc(mix.initial[i], &live[i])) {
                live[i] = nullptr;
                return format("filling block %zu of %zu bytes failed: %s", i, mix.initial[i],
                              a.error().c_str());
            }
        }
        return "";
    }
    bool pairs(uint64_t n)
    {
        for (uint64_t i = 0; i < n; i++, step++) {
            size_t k = size_t(step % kMixSteps);
            uint32_t v = mix.victim[k];
            if (!a.release(live[v])) {
                failed_size = live_size[v];
                return false;
            }
            live[v] = nullptr;
            if (!a.alloc(mix.sizes[k], &live[v])) {
                live[v] = nullptr;
                failed_size = mix.sizes[k];
                return false;
            }
            live_size[v] = mix.sizes[k];
        }
        return true;
    }
    std::string pair_error() const
    {
        return format("step %llu (%zu bytes) failed: %s", (unsigned long long)step, failed_size,
                      a.error().c_str());
    }
    void free_all()
    {
        for (void *&p : live)
            if (p && a.release(p))
                p = nullptr;
        a.trim();
    }
};

template <class A>
void live_mixed(A &a, const Mix &mix, const Options &o)
{
    Row r;
    r.scenario = "live-10k-mixed";
    r.live_blocks = kLiveBlocks;
    r.live_bytes = mix.initial_bytes;
    r.allocator = A::name;
    MixedRun<A> run(a, mix);
    std::string err = run.fill();
    if (!err.empty()) {
        fail_row(r, err);
        run.free_all();
        return;
    }
    if (A::is_unimem && g_verify)
        g_verify->check(live_sample(run.live, run.live_size), "live-10k-mixed after the fill");
    auto pairs = [&](uint64_t n) { return run.pairs(n); };
    std::vector<Sample> samples(kRepeats);
    if (!warm_and_time(a, pairs, o, samples, &r.backend_calls)) {
        fail_row(r, run.pair_error());
        run.free_all();
        return;
    }
    if (A::is_unimem && g_verify)
        g_verify->check(live_sample(run.live, run.live_size), "live-10k-mixed after the steps");
    set_median(r, samples);
    g_rows.push_back(r);
    run.free_all();
}

/* live-10k-mixed with two allocators taking turns: both live sets stay
 * allocated, and each of kPairedRounds rounds times one measurement of
 * each, the order alternating (ABBA), so that both meet the same host
 * speed. In live-10k-mixed they run one after the other, seconds apart,
 * and the GPU machine's host changes speed on that scale (BENCHMARKS.md:
 * ratios of 8.1x-13.2x in one job). The second allocator's ratio is the
 * median of the rounds' ratios; each ns_per_pair is the median of that
 * allocator's measurements. */
template <class A, class B>
void live_mixed_paired(A &a, B &b, const Mix &mix, const Options &o)
{
    Row ra, rb;
    ra.scenario = rb.scenario = "live-10k-mixed-paired";
    ra.live_blocks = rb.live_blocks = kLiveBlocks;
    ra.live_bytes = rb.live_bytes = mix.initial_bytes;
    ra.allocator = A::name;
    rb.allocator = B::name;
    MixedRun<A> run_a(a, mix);
    MixedRun<B> run_b(b, mix);
    auto pairs_a = [&](uint64_t n) { return run_a.pairs(n); };
    auto pairs_b = [&](uint64_t n) { return run_b.pairs(n); };
    std::string err_a = run_a.fill(), err_b;
    if (err_a.empty())
        err_b = run_b.fill();
    Sample warm;
    if (err_a.empty() && err_b.empty() && !run_timed(pairs_a, o.warmup_s, &warm))
        err_a = run_a.pair_error();
    if (err_a.empty() && err_b.empty() && !run_timed(pairs_b, o.warmup_s, &warm))
        err_b = run_b.pair_error();
    std::vector<Sample> sa(kPairedRounds), sb(kPairedRounds);
    std::vector<double> ratio;
    /* Read around all the rounds, not each turn: the count walks the
     * pool's records, which would warm them for the turn that follows. An
     * allocator calls its backend only in its own turns. */
    long long calls_a = backend_calls_of(a), calls_b = backend_calls_of(b);
    for (int k = 0; k < kPairedRounds && err_a.empty() && err_b.empty(); k++) {
        for (int turn = 0; turn < 2 && err_a.empty() && err_b.empty(); turn++) {
            if ((turn == 0) == (k % 2 == 0)) {
                if (!run_timed(pairs_a, o.budget_s, &sa[k]))
                    err_a = run_a.pair_error();
            } else if (!run_timed(pairs_b, o.budget_s, &sb[k])) {
                err_b = run_b.pair_error();
            }
        }
        if (err_a.empty() && err_b.empty())
            ratio.push_back(sa[k].ns_per_pair() / sb[k].ns_per_pair());
    }
    if (!err_a.empty() || !err_b.empty()) {
        std::string not_run = "not run to the end: the other allocator failed";
        fail_row(ra, err_a.empty() ? not_run : err_a);
        fail_row(rb, err_b.empty() ? not_run : err_b);
    } else {
        set_median(ra, sa);
        set_median(rb, sb);
        long long end_a = backend_calls_of(a), end_b = backend_calls_of(b);
        ra.backend_calls = calls_a >= 0 && end_a >= 0 ? end_a - calls_a : -1;
        rb.backend_calls = calls_b >= 0 && end_b >= 0 ? end_b - calls_b : -1;
        rb.paired_ratio = median_value(ratio);
        rb.paired_low = *std::min_element(ratio.begin(), ratio.end());
        rb.paired_high = *std::max_element(ratio.begin(), ratio.end());
        g_rows.push_back(ra);
        g_rows.push_back(rb);
    }
    run_a.free_all();
    run_b.free_all();
}

/* One "threads" measurement: every thread fills its ring and warms up, all
 * start together, and the main thread stops them after the budget. The
 * budget, not a pair count, ends it, so cudaMalloc (which serializes its
 * threads) runs at every thread count in bounded time and is not skipped.
 * cudaMallocAsync's threads share its one stream, as unimem's and torch's
 * share the device's default stream. */
struct ThreadRun {
    std::atomic<int> ready{0};
    std::atomic<int> written{0};
    std::atomic<bool> go{false};
    std::atomic<bool> stop{false};
    std::atomic<bool> failed{false};
    std::mutex error_lock;
    std::string error;
    std::vector<double> start, end;
    std::vector<uint64_t> pairs;

    void fail(const std::string &msg)
    {
        std::lock_guard<std::mutex> lock(error_lock);
        if (error.empty())
            error = msg;
        failed = true;
    }
};

template <class A>
void thread_body(A &a, ThreadRun &run, int t, int nthreads, const std::vector<size_t> &sizes,
                 const Options &o)
{
    /* The CUDA runtime's current device is per thread; without this a new
     * thread's calls (cudaMalloc, torch's current stream) could go elsewhere. */
    cudaError_t e = cudaSetDevice(0);
    void *ring[kThreadRing] = {};
    size_t ring_size[kThreadRing] = {};
    size_t next = 0, slot = 0;
    /* The next size of the thread's sequence. It wraps with a compare, not
     * with next % sizes.size(): that is a 64-bit division (the size is not
     * known at compile time) inside every timed pair, the same for every
     * allocator, which added to each one's time and so pulled their ratios
     * towards 1 (the rings of `unimem bench alloc` wrap the same way). */
    auto next_size = [&]() {
        size_t n = sizes[next];
        next = next + 1 == sizes.size() ? 0 : next + 1;
        return n;
    };
    uint64_t done = 0;
    bool ok = e == cudaSuccess;
    if (!ok)
        run.fail("cudaSetDevice(0): " + cuda_error_text(e));
    for (int i = 0; ok && i < kThreadRing; i++) {
        ring_size[i] = next_size();
        ok = a.alloc(ring_size[i], &ring[i]);
        if (!ok) {
            ring[i] = nullptr;
            run.fail(format("thread %d filling its ring: %s", t, a.error().c_str()));
        }
    }
    auto step = [&]() {
        size_t n = next_size();
        if (!a.release(ring[slot])) {
            ring[slot] = nullptr; /* its state is unknown: do not free it again */
            return false;
        }
        if (!a.alloc(n, &ring[slot])) {
            ring[slot] = nullptr;
            return false;
        }
        ring_size[slot] = n;
        slot = slot + 1 == kThreadRing ? 0 : slot + 1;
        return true;
    };
    if (ok) {
        double warm_end = now_ns() + o.warmup_s * 1e9;
        while (ok && now_ns() < warm_end)
            for (int i = 0; ok && i < 64; i++)
                ok = step();
        if (!ok)
            run.fail(format("thread %d warming up: %s", t, a.error().c_str()));
    }
    run.ready++;
    while (!run.go.load(std::memory_order_acquire))
        std::this_thread::yield();
    double t0 = now_ns();
    /* The stop flag is read every 8 pairs: a relaxed load of a line no one
     * writes until the end costs well under a nanosecond. */
    while (ok && !run.stop.load(std::memory_order_relaxed) &&
           !run.failed.load(std::memory_order_relaxed)) {
        for (int i = 0; i < 8; i++) {
            if (!step()) {
                ok = false;
                run.fail(format("thread %d, pair %llu: %s", t, (unsigned long long)done,
                                a.error().c_str()));
                break;
            }
            done++;
        }
    }
    run.end[t] = now_ns();
    run.start[t] = t0;
    run.pairs[t] = done;
    if constexpr (A::is_unimem) {
        if (g_verify) {
            /* Every thread writes its whole ring before any reads back, so
             * a block shared by two threads shows the other's pattern. */
            std::vector<std::pair<void *, size_t>> sample;
            for (int i = 0; i < kThreadRing; i++)
                if (ring[i])
                    sample.push_back({ring[i], ring_size[i]});
            std::vector<unsigned char> host;
            bool good = true;
            for (size_t i = 0; good && i < sample.size(); i++) {
                unsigned char pat = (unsigned char)(1 + (t * kThreadRing + i) % 255);
                if (cudaMemset(sample[i].first, pat, sample[i].second) != cudaSuccess)
                    good = g_verify->bad(format("threads: thread %d cudaMemset of %p failed", t,
                                                sample[i].first));
            }
            cudaDeviceSynchronize();
            run.written++;
            while (run.written.load() < nthreads)
                std::this_thread::yield();
            for (size_t i = 0; good && i < sample.size(); i++) {
                unsigned char pat = (unsigned char)(1 + (t * kThreadRing + i) % 255);
                host.assign(sample[i].second, 0);
                if (cudaMemcpy(host.data(), sample[i].first, sample[i].second,
                               cudaMemcpyDeviceToHost) != cudaSuccess) {
                    good = g_verify->bad(format("threads: thread %d cudaMemcpy from %p failed",
                                                t, sample[i].first));
                    break;
                }
                for (size_t k = 0; good && k < host.size(); k++)
                    if (host[k] != pat)
                        good = g_verify->bad(format("threads: thread %d block %p (%zu bytes) "
                                                    "byte %zu reads 0x%02x, wrote 0x%02x",
                                                    t, sample[i].first, sample[i].second, k,
                                                    host[k], pat));
                g_verify->blocks++;
                g_verify->bytes += sample[i].second;
            }
        }
    }
    for (int i = 0; i < kThreadRing; i++)
        if (ring[i] && !a.release(ring[i]))
            run.fail(format("thread %d freeing its ring: %s", t, a.error().c_str()));
}

template <class A>
void threads_scenario(A &a, int nthreads, const std::vector<std::vector<size_t>> &sizes,
                      const Options &o, double one_thread_rate)
{
    Row r;
    r.scenario = "threads";
    r.threads = nthreads;
    r.live_blocks = kThreadRing;
    r.allocator = A::name;
    std::vector<Sample> samples;
    /* One untimed run first warms the allocator's shared state; each thread
     * also warms its own cache before the start. */
    for (int rep = -1; rep < kRepeats; rep++) {
        ThreadRun run;
        run.start.assign(nthreads, 0);
        run.end.assign(nthreads, 0);
        run.pairs.assign(nthreads, 0);
        std::vector<std::thread> workers;
        for (int t = 0; t < nthreads; t++)
            workers.emplace_back([&, t]() { thread_body(a, run, t, nthreads, sizes[t], o); });
        while (run.ready.load() < nthreads)
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        run.go.store(true, std::memory_order_release);
        double budget = rep < 0 ? o.warmup_s : o.budget_s;
        std::this_thread::sleep_for(std::chrono::duration<double>(budget));
        run.stop.store(true);
        for (auto &w : workers)
            w.join();
        if (run.failed) {
            fail_row(r, run.error);
            a.trim();
            return;
        }
        if (rep < 0)
            continue;
        /* Wall time from the first thread's start to the last one's end, so
         * a thread that started late cannot inflate the total. */
        Sample s;
        double t_start = *std::min_element(run.start.begin(), run.start.end());
        double t_end = *std::max_element(run.end.begin(), run.end.end());
        for (uint64_t p : run.pairs)
            s.pairs += p;
        s.ns = t_end - t_start;
        samples.push_back(s);
    }
    a.trim();
    Sample m = median_of(samples);
    r.pairs = m.pairs;
    r.pairs_per_s = 1e9 / m.ns_per_pair();
    r.ns_per_pair = m.ns_per_pair() * nthreads;
    r.scaling = one_thread_rate > 0 ? r.pairs_per_s / one_thread_rate : 1.0;
    g_rows.push_back(r);
}

/* ---------------------------------------------------------------- output */

/* The progress line, as the unimem command draws it: on stderr, in place,
 * only when stderr is a terminal; the steps are the scenarios' parts. */
constexpr int kProgressSteps =
    int(sizeof kPairSizes / sizeof kPairSizes[0]) + 2 + int(sizeof kThreadCounts / sizeof kThreadCounts[0]);
int g_progress_step = 0;
const bool g_progress_tty = isatty(STDERR_FILENO) == 1;

void progress(const std::string &what)
{
    if (!g_progress_tty)
        return;
    int pct = g_progress_step++ * 100 / kProgressSteps;
    std::string bar(40, '.');
    std::fill(bar.begin(), bar.begin() + pct * 40 / 100, '#');
    fprintf(stderr, "\r\033[K%-28s [%s] %3d%%", what.c_str(), bar.c_str(), pct);
    fflush(stderr);
}

void progress_clear()
{
    if (g_progress_tty) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
}

const Row *find_row(const Row &like, const char *allocator)
{
    for (const Row &r : g_rows)
        if (r.scenario == like.scenario && r.size == like.size && r.threads == like.threads &&
            r.allocator == allocator && r.error.empty())
            return &r;
    return nullptr;
}

/* unimem's pairs per second over torch's: above 1, unimem is faster. */
double ratio_vs_torch(const Row &r)
{
    const Row *t = find_row(r, "torch");
    if (r.paired_ratio > 0)
        return r.paired_ratio;
    if (r.allocator != "unimem" || !t || !r.error.empty())
        return 0;
    return r.pairs_per_s / t->pairs_per_s;
}

void print_table()
{
    const char *scenarios[] = {"pair-by-size", "live-10k-mixed", "live-10k-mixed-paired",
                               "threads"};
    for (const char *sc : scenarios) {
        printf("\n== %s ==\n", sc);
        bool threads = !strcmp(sc, "threads");
        printf("%-9s %-16s %14s %12s %10s %s\n", threads ? "threads" : "size", "allocator",
               threads ? "ns/pair/thread" : "ns/pair", "pairs/s", "pairs",
               threads ? "scaling  unimem/torch" : "unimem/torch");
        std::string last_key;
        for (const Row &r : g_rows) {
            if (r.scenario != sc)
                continue;
            std::string key = threads ? format("%d", r.threads)
                              : r.size ? size_text(r.size)
                                       : std::string("mixed");
            std::string shown = key == last_key ? "" : key;
            last_key = key;
            if (!r.error.empty()) {
                printf("%-9s %-16s FAILED: %s\n", shown.c_str(), r.allocator.c_str(),
                       r.error.c_str());
                continue;
            }
            printf("%-9s %-16s %14.1f %12s %10llu", shown.c_str(), r.allocator.c_str(),
                   r.ns_per_pair, rate_text(r.pairs_per_s).c_str(),
                   (unsigned long long)r.pairs);
            if (threads)
                printf(" %6.2fx", r.scaling);
            double ratio = ratio_vs_torch(r);
            if (ratio > 0)
                printf(" %s%.2fx", threads ? "  " : "", ratio);
            if (r.paired_ratio > 0)
                printf(" (rounds %.2f-%.2fx)", r.paired_low, r.paired_high);
            if (r.size == 0 && !threads) {
                printf("  [measurements %.1f-%.1f ns", r.ns_low, r.ns_high);
                if (r.backend_calls >= 0)
                    printf("; %lld backend calls in them", r.backend_calls);
                printf("]");
            }
            printf("\n");
        }
    }
}

bool write_json(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "alloc_compare: cannot write --json file '%s': %s\n", path,
                strerror(errno));
        return false;
    }
    fprintf(f, "[\n");
    for (size_t i = 0; i < g_rows.size(); i++) {
        const Row &r = g_rows[i];
        fprintf(f, "  {\"scenario\": \"%s\", \"size\": ", r.scenario.c_str());
        if (r.size)
            fprintf(f, "%zu", r.size);
        else
            fprintf(f, "null");
        fprintf(f, ", \"live_blocks\": %zu, \"threads\": %d, \"allocator\": \"%s\"",
                r.live_blocks, r.threads, r.allocator.c_str());
        if (r.error.empty()) {
            fprintf(f, ", \"ns_per_pair\": %.3f, \"pairs_per_s\": %.1f, \"pairs\": %llu",
                    r.ns_per_pair, r.pairs_per_s, (unsigned long long)r.pairs);
        } else {
            std::string esc;
            for (char c : r.error) {
                if (c == '"' || c == '\\')
                    esc += '\\';
                esc += (unsigned char)c < 0x20 ? ' ' : c;
            }
            fprintf(f, ", \"ns_per_pair\": null, \"pairs_per_s\": null, \"pairs\": 0"
                       ", \"error\": \"%s\"",
                    esc.c_str());
        }
        if (r.scenario == "live-10k-mixed")
            fprintf(f, ", \"live_bytes\": %zu", r.live_bytes);
        if (r.error.empty() && r.scenario != "threads") {
            fprintf(f, ", \"ns_low\": %.3f, \"ns_high\": %.3f, \"backend_calls\": ", r.ns_low,
                    r.ns_high);
            if (r.backend_calls >= 0)
                fprintf(f, "%lld", r.backend_calls);
            else
                fprintf(f, "null");
        }
        if (r.scenario == "threads" && r.error.empty())
            fprintf(f, ", \"scaling_vs_1_thread\": %.4f", r.scaling);
        if (r.allocator == "unimem") {
            double ratio = ratio_vs_torch(r);
            if (ratio > 0)
                fprintf(f, ", \"ratio_vs_torch\": %.4f", ratio);
            else
                fprintf(f, ", \"ratio_vs_torch\": null");
        }
        fprintf(f, "}%s\n", i + 1 < g_rows.size() ? "," : "");
    }
    fprintf(f, "]\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "alloc_compare: writing '%s' failed: %s\n", path, strerror(errno));
        return false;
    }
    return true;
}

} // namespace

int main(int argc, char **argv)
{
    Options o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;

    int gpus = 0;
    cudaError_t e = cudaGetDeviceCount(&gpus);
    if (e != cudaSuccess || gpus == 0) {
        fprintf(stderr, "alloc_compare: no usable GPU: %s\n",
                e != cudaSuccess ? ("cudaGetDeviceCount failed: " + cuda_error_text(e)).c_str()
                                 : "cudaGetDeviceCount found 0 devices");
        return 2;
    }
    if ((e = cudaSetDevice(0)) != cudaSuccess || (e = cudaFree(nullptr)) != cudaSuccess) {
        fprintf(stderr, "alloc_compare: no usable GPU: creating the context of device 0: %s\n",
                cuda_error_text(e).c_str());
        return 2;
    }
    cudaDeviceProp prop;
    int driver = 0, runtime = 0;
    size_t free_b = 0, total_b = 0;
    cudaGetDeviceProperties(&prop, 0);
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    cudaMemGetInfo(&free_b, &total_b);
    printf("alloc_compare: GPU 0 of %d: %s (cc %d.%d), %.1f GiB free of %.1f GiB; "
           "driver %d, runtime %d\n",
           gpus, prop.name, prop.major, prop.minor, double(free_b) / kGiB,
           double(total_b) / kGiB, driver, runtime);
    printf("budget %.2f s per measurement (warm-up %.2f s), median of %d%s\n", o.budget_s,
           o.warmup_s, kRepeats, o.verify ? "; --verify" : "");

    UnimemAllocator um;
    um_status s = um_init("devices=cuda", &um.ctx);
    if (s != UM_OK) {
        fprintf(stderr, "alloc_compare: um_init(\"devices=cuda\") failed: %s: %s\n",
                um_status_name(s), um_last_error());
        return 1;
    }
    um_device_info info{};
    if (um_device_count(um.ctx) < 2 || (s = um_device_info_get(um.ctx, 1, &info)) != UM_OK ||
        info.kind != UM_DEVICE_CUDA || info.ordinal != 0) {
        fprintf(stderr,
                "alloc_compare: unimem device 1 is not CUDA device 0 (%d devices; %s): "
                "the comparison needs them to be the same GPU\n",
                um_device_count(um.ctx),
                um_device_count(um.ctx) < 2 ? "unimem found no GPU"
                : s != UM_OK                ? um_last_error()
                                            : format("kind %s, ordinal %d",
                                                     um_device_kind_name(info.kind), info.ordinal)
                                                  .c_str());
        um_shutdown(um.ctx);
        return 1;
    }
    printf("unimem: device 1 = %s, allocator %s, %s, granularity %s%s%s\n", info.name,
           info.allocator, info.vmm ? "VMM pages" : "cuMemAlloc segments",
           size_text(info.granularity).c_str(), getenv("UNIMEM_CONF") ? ", UNIMEM_CONF=" : "",
           getenv("UNIMEM_CONF") ? getenv("UNIMEM_CONF") : "");
    Verifier verifier;
    verifier.ctx = um.ctx;
    if (o.verify)
        g_verify = &verifier;

    CudaMallocAllocator cm;
    CudaMallocAsyncAllocator cma;
    std::string err = cma.setup();
    if (!err.empty()) {
        fprintf(stderr, "alloc_compare: cudaMallocAsync setup: %s\n", err.c_str());
        um_shutdown(um.ctx);
        return 1;
    }

#ifndef UM_NO_TORCH
    TorchAllocator torch_alloc;
    bool use_torch = !o.skip_torch;
    if (use_torch) {
        err = torch_alloc.setup(gpus);
        if (!err.empty()) {
            fprintf(stderr, "alloc_compare: %s\n", err.c_str());
            um_shutdown(um.ctx);
            return 1;
        }
#ifdef UM_TORCH_VERSION
        printf("torch %s: ", UM_TORCH_VERSION);
#else
        printf("torch: ");
#endif
        printf("c10 CUDACachingAllocator%s%s\n",
               getenv("PYTORCH_CUDA_ALLOC_CONF") ? ", PYTORCH_CUDA_ALLOC_CONF=" : "",
               getenv("PYTORCH_CUDA_ALLOC_CONF") ? getenv("PYTORCH_CUDA_ALLOC_CONF") : "");
    } else {
        printf("torch: skipped (--skip-torch)\n");
    }
#else
    printf("torch: not built in (built with -DUM_NO_TORCH)\n");
#endif

    /* Calls fn on every allocator in turn, so each scenario step measures
     * them back to back under the same conditions. */
    auto each = [&](auto &&fn) {
        fn(cm);
        fn(cma);
#ifndef UM_NO_TORCH
        if (use_torch)
            fn(torch_alloc);
#endif
        fn(um);
    };

    /* Pinned after every allocator is set up, so the helper threads the
     * CUDA runtime and the libraries made keep their cores. */
    cpu_set_t all_cores;
    bool pinned = false;
    if (o.pin >= 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(o.pin, &one);
        if (sched_getaffinity(0, sizeof all_cores, &all_cores) != 0 ||
            sched_setaffinity(0, sizeof one, &one) != 0) {
            fprintf(stderr, "alloc_compare: cannot pin to core %d: %s\n", o.pin, strerror(errno));
            return 1;
        }
        pinned = true;
        printf("pair-by-size and live-10k-mixed run on core %d only\n", o.pin);
    }

    for (size_t size : kPairSizes) {
        progress("pair-by-size " + size_text(size));
        each([&](auto &a) { pair_by_size(a, size, o); });
    }

    Mix mix = make_mix();
    progress_clear();
    printf("live-10k-mixed: %zu live blocks, %.2f GiB live at the start\n", kLiveBlocks,
           double(mix.initial_bytes) / kGiB);
    if (mix.initial_bytes > kLiveBytesCap) {
        fprintf(stderr, "alloc_compare: the live-10k-mixed set is %.1f GiB, over its %.0f GiB cap\n",
                double(mix.initial_bytes) / kGiB, double(kLiveBytesCap) / kGiB);
        g_failed = true;
    } else {
        progress("live-10k-mixed");
        each([&](auto &a) { live_mixed(a, mix, o); });
#ifndef UM_NO_TORCH
        if (use_torch) {
            /* Both live sets at once, each growing as the churn goes (about
             * 13 GiB from 12.5 in the H200 runs), with the pools' slack. */
            size_t need = mix.initial_bytes / 2 * 5, free_now = 0, total_now = 0;
            cudaMemGetInfo(&free_now, &total_now);
            if (free_now >= need) {
                progress("live-10k-mixed-paired");
                live_mixed_paired(torch_alloc, um, mix, o);
            } else {
                progress_clear();
                printf("live-10k-mixed-paired: skipped: both live sets need about %.1f GiB, "
                       "%.1f GiB free\n",
                       double(need) / kGiB, double(free_now) / kGiB);
            }
        }
#endif
    }

    if (pinned && sched_setaffinity(0, sizeof all_cores, &all_cores) != 0) {
        fprintf(stderr, "alloc_compare: cannot unpin from core %d: %s\n", o.pin, strerror(errno));
        return 1;
    }

    /* Thread t gets the same small sizes with every allocator. */
    std::vector<std::vector<size_t>> thread_sizes(16);
    for (size_t t = 0; t < thread_sizes.size(); t++) {
        uint64_t state = kSeed + 1000 * (t + 1);
        thread_sizes[t].resize(kThreadSizes);
        for (auto &n : thread_sizes[t])
            n = mix_log_uniform(&state, kSmallMin, kSmallMax);
    }
    for (int n : kThreadCounts) {
        progress(format("threads %d", n));
        each([&](auto &a) {
            const Row *one = nullptr;
            for (const Row &r : g_rows)
                if (r.scenario == "threads" && r.threads == 1 && r.allocator == a.name &&
                    r.error.empty())
                    one = &r;
            threads_scenario(a, n, thread_sizes, o, one ? one->pairs_per_s : 0);
        });
    }

    progress_clear();
    print_table();
    if (o.verify)
        printf("\nverify: %llu unimem blocks, %.1f MiB written and read back: %s\n",
               (unsigned long long)verifier.blocks.load(), double(verifier.bytes.load()) / kMiB,
               verifier.ok ? "OK" : "FAILED");
    printf("\nns/pair: host time of one alloc+free; threads: per thread, pairs/s for all "
           "threads together.\nunimem/torch: unimem's pairs/s over torch's (above 1: unimem "
           "is faster).\n");
    if (o.json_path && !write_json(o.json_path))
        g_failed = true;
    um_shutdown(um.ctx);
    cudaStreamDestroy(cma.stream);
    return g_failed ? 1 : 0;
}
