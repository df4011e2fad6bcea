/* The C functions of libunimem_torch.so that PyTorch and its allocator
 * hooks call, run on the stand-in CUDA driver (gpu/fake_cuda.c, GPUs of
 * FAKE_CUDA_MEM bytes), so CI checks them without PyTorch or a GPU:
 * record_stream marks blocks and skips pointers it does not own, the
 * memory fraction caps what can be allocated (0 allows nothing) and says
 * why it cannot go below live memory, emptying the cache gives every page
 * back, a GPU's context is opened only when that GPU is used, failures
 * during the driver's shutdown stay quiet, CUDA graph capture is refused,
 * and a trace names each pointer's life by an id of its own (its table is
 * the library's address map, tested in test_addrmap.c). Cases that need
 * their own environment (two GPUs, UNIMEM_CONF, a trace file) or break the
 * driver run in child processes. Where PyTorch is installed,
 * tests/gpu/test_torch.py checks the same through PyTorch. */
#include "harness.h"
#include "unimem_torch.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MB ((size_t)1 << 20)

/* Native streams are opaque to the stand-in driver: any distinct non-NULL
 * pointers serve. */
static char compute_stream, comm_stream;
static void *const compute = &compute_stream, *const comm = &comm_stream;

static bool last_error_mentions(const char *what)
{
    return strstr(unimem_torch_last_error(), what) != NULL;
}

static um_stats stats_of(int device)
{
    um_stats st = {.version = UM_STATS_VERSION};
    CHECK_EQ(unimem_torch_stats(device, &st), 0);
    return st;
}

/* The stand-in driver's own entry points (fake_cuda.c). Loading it here
 * is harmless: unimem's dlopen of libcuda.so.1 then finds this copy. */
static void *fake_driver(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(lib != NULL);
    return lib;
}

static long fake_live(const char *what)
{
    long (*live)(const char *) = (long (*)(const char *))dlsym(fake_driver(), "fake_cuda_live");
    CHECK(live != NULL);
    return live ? live(what) : -1;
}

/* cuDevicePrimaryCtxRetain calls for a GPU so far, or -1 where this
 * stand-in driver does not count them (fake_lazy_retains). */
static int fake_retains(int gpu)
{
    int (*retains)(int) = (int (*)(int))dlsym(fake_driver(), "fake_lazy_retains");
    return retains ? retains(gpu) : -1;
}

static void fake_fail(const char *call, int result)
{
    int (*fail)(const char *, unsigned, unsigned, int) =
        (int (*)(const char *, unsigned, unsigned, int))dlsym(fake_driver(), "fake_cuda_fail");
    CHECK(fail != NULL);
    if (fail)
        CHECK_EQ(fail(call, 0, 1u << 30, result), 0);
}

static void fake_fail_clear(void)
{
    void (*clear)(void) = (void (*)(void))dlsym(fake_driver(), "fake_cuda_fail_clear");
    CHECK(clear != NULL);
    if (clear)
        clear();
}

/* Built with PyTorch's headers, a failed allocation throws a C++ exception,
 * which cannot pass through this C program: the checks of failed
 * allocations run only where it returns NULL. */
static bool allocation_fails(size_t size, int device)
{
    if (unimem_torch_can_throw())
        return true;
    void *p = unimem_torch_alloc(size, device, comm);
    if (p)
        unimem_torch_free(p, size, device, comm);
    return p == NULL;
}

/* Runs one case in a child process with its own environment and checks
 * that all its checks passed. */
static void run_child(const char *name, void (*body)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* The child counts its own checks; the parent's failures so far
         * are the parent's. */
        harness_checks = 0;
        harness_failures = 0;
        body();
        int rc = harness_finish(name);
        fflush(NULL); /* _exit flushes no stream: the trace file is one */
        _exit(rc);
    }
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        harness_report(__FILE__, __LINE__, "case %s failed (wait status %d)", name, status);
}

/* ------------------------------------------------------- record_stream */

static void record_stream_case(void)
{
    void *p = unimem_torch_alloc(4 * MB, 0, comm);
    CHECK(p != NULL);
    CHECK_EQ(unimem_torch_record_stream(p, compute, 0), 0);
    CHECK_EQ(unimem_torch_record_stream(p, compute, 0), 0); /* twice is once */
    CHECK_EQ(unimem_torch_record_stream(p, NULL, 0), 0);    /* the legacy default stream */
    /* The stand-in driver cannot say which GPU a stream is on: the block's. */
    CHECK_EQ(unimem_torch_record_stream(p, compute, -1), 0);
    /* What PyTorch's allocator would skip is skipped, not refused (NCCL
     * records streams on such tensors, and a refusal raised there): memory
     * unimem does not manage, an empty tensor's NULL, and a pointer inside
     * a block (a from_blob or DLPack view of a slice). */
    int local = 0;
    CHECK_EQ(unimem_torch_record_stream(&local, compute, 0), 0);
    CHECK_EQ(unimem_torch_record_stream(NULL, compute, 0), 0);
    CHECK_EQ(unimem_torch_record_stream((char *)p + 4096, compute, 0), 0);
    CHECK_EQ(stats_of(0).active_bytes, 4 * MB);
    unimem_torch_free(p, 4 * MB, 0, comm);
    /* The stand-in driver's events are complete at once: the next
     * allocation takes the block back first. */
    void *q = unimem_torch_alloc(4 * MB, 0, comm);
    CHECK(q == p);
    CHECK_EQ(stats_of(0).active_bytes, 4 * MB);
    unimem_torch_free(q, 4 * MB, 0, comm);
    /* A freed block is skipped too. */
    CHECK_EQ(unimem_torch_record_stream(q, compute, 0), 0);
}

/* ------------------------------------------------------ memory fraction */

static void memory_fraction_case(void)
{
    /* FAKE_CUDA_MEM is 64 MiB. PyTorch accepts 0..1. */
    CHECK_EQ(unimem_torch_set_memory_fraction(1.5, 0), UM_ERR_INVALID);
    CHECK(last_error_mentions("not in [0, 1]"));
    CHECK_EQ(unimem_torch_set_memory_fraction(-0.5, 0), UM_ERR_INVALID);
    CHECK(unimem_torch_set_memory_fraction(0.5, 9) != 0);
    CHECK(last_error_mentions("cuda:9"));
    CHECK_EQ(unimem_torch_set_memory_fraction(0.5, 0), 0);
    CHECK(allocation_fails(40 * MB, 0));
    CHECK(unimem_torch_can_throw() || last_error_mentions("cannot allocate"));
    void *half = unimem_torch_alloc(24 * MB, 0, comm);
    CHECK(half != NULL);
    unimem_torch_free(half, 24 * MB, 0, comm);
    CHECK_EQ(unimem_torch_set_memory_fraction(1.0, 0), 0);
    void *big = unimem_torch_alloc(40 * MB, 0, comm);
    CHECK(big != NULL);
    unimem_torch_free(big, 40 * MB, 0, comm);

    /* torch.cuda.empty_cache: nothing live, nothing kept. */
    CHECK(stats_of(0).reserved_bytes > 0);
    CHECK_EQ(unimem_torch_empty_cache(), 0);
    CHECK_EQ(stats_of(0).reserved_bytes, 0);

    /* Fraction 0 allows nothing (a limit of 0 bytes means the whole GPU to
     * unimem), as does one too small for a byte. */
    CHECK_EQ(unimem_torch_set_memory_fraction(0.0, 0), 0);
    CHECK(allocation_fails(2 * MB, 0));
    CHECK_EQ(unimem_torch_set_memory_fraction(1e-12, 0), 0);
    CHECK(allocation_fails(2 * MB, 0));
    CHECK_EQ(unimem_torch_set_memory_fraction(1.0, 0), 0);

    /* Cached memory does not stand in the way of a lower fraction: it is
     * given back first. */
    void *cached = unimem_torch_alloc(16 * MB, 0, comm);
    CHECK(cached != NULL);
    unimem_torch_free(cached, 16 * MB, 0, comm);
    CHECK(stats_of(0).reserved_bytes >= 16 * MB);
    CHECK_EQ(unimem_torch_set_memory_fraction(0.125, 0), 0); /* 8 MiB */
    CHECK(stats_of(0).reserved_bytes <= 8 * MB);
    CHECK_EQ(unimem_torch_set_memory_fraction(1.0, 0), 0);

    /* Live tensors do: the failure names the limit asked for and what is
     * held, and the previous limit stays. */
    void *live = unimem_torch_alloc(8 * MB, 0, comm);
    CHECK(live != NULL);
    size_t reserved = stats_of(0).reserved_bytes;
    size_t asked = (size_t)(0.05 * (double)(64 * MB));
    CHECK_EQ(unimem_torch_set_memory_fraction(0.05, 0), UM_ERR_BUSY);
    char number[32];
    snprintf(number, sizeof number, "%zu bytes", asked);
    CHECK(last_error_mentions(number));
    snprintf(number, sizeof number, "%zu bytes reserved", reserved);
    CHECK(last_error_mentions(number));
    void *more = unimem_torch_alloc(40 * MB, 0, comm);
    CHECK(more != NULL);
    unimem_torch_free(more, 40 * MB, 0, comm);
    unimem_torch_free(live, 8 * MB, 0, comm);
    CHECK_EQ(unimem_torch_empty_cache(), 0);
}

/* ----------------------------------------------------------- last error */

static void *fail_on_other_thread(void *arg)
{
    (void)arg;
    CHECK_EQ(unimem_torch_set_memory_fraction(2.5, 0), UM_ERR_INVALID);
    CHECK(last_error_mentions("2.5"));
    return NULL;
}

/* A thread reads its own failure's message, not one another thread wrote
 * after it (the Python helper reads the message after the call returns). */
static void last_error_case(void)
{
    CHECK_EQ(unimem_torch_set_memory_fraction(1.5, 0), UM_ERR_INVALID);
    pthread_t other;
    CHECK_EQ(pthread_create(&other, NULL, fail_on_other_thread, NULL), 0);
    pthread_join(other, NULL);
    CHECK(last_error_mentions("1.5"));
    CHECK(!last_error_mentions("2.5"));
}

/* ------------------------------------------------------ graphs, capability */

static void capture_and_capability_case(void)
{
    CHECK_EQ(unimem_torch_begin_graph_capture(0), UM_ERR_UNSUPPORTED);
    CHECK(last_error_mentions("unimem: CUDA graph capture is not supported"));
    /* This build has no PyTorch headers exactly when CMake found none;
     * either way the answer is 0 or 1 and matches what allocation does. */
    int can_throw = unimem_torch_can_throw();
    CHECK(can_throw == 0 || can_throw == 1);
}

/* --------------------------------------------- one context per used GPU */

/* Two stand-in GPUs, no devices in UNIMEM_CONF: a GPU's context opens at
 * its first allocation, and each call reaches the context of its device. */
static void lazy_contexts_case(void)
{
    setenv("FAKE_CUDA_GPUS", "2", 1);
    unsetenv("UNIMEM_CONF");
    /* Statistics of GPUs that served nothing are zeros and open nothing. */
    CHECK_EQ(stats_of(0).reserved_bytes, 0);
    CHECK_EQ(stats_of(1).num_allocs, 0);
    CHECK_EQ(unimem_torch_trim(1), 0);
    CHECK_EQ(unimem_torch_reset_peak(0), 0);
    um_stats none = {.version = UM_STATS_VERSION};
    CHECK_EQ(unimem_torch_stats(2, &none), UM_ERR_NO_DEVICE);
    CHECK(last_error_mentions("cuda:2"));
    CHECK_EQ(fake_live("reservations"), 0);

    /* A process that uses cuda:1 alone (a DDP rank) opens cuda:1 alone. */
    void *p1 = unimem_torch_alloc(4 * MB, 1, comm);
    CHECK(p1 != NULL);
    long opened_one = fake_live("reservations");
    CHECK(opened_one > 0);
    /* Where the stand-in driver counts primary context retains, GPU 0's
     * context was never retained. */
    bool counts_retains = fake_retains(1) >= 0;
    if (counts_retains) {
        CHECK_EQ(fake_retains(0), 0);
        CHECK(fake_retains(1) > 0);
    } else {
        printf("test_torch_shim: the stand-in driver does not count context retains; "
               "checked through its address reservations only\n");
    }
    void *p0 = unimem_torch_alloc(2 * MB, 0, comm);
    CHECK(p0 != NULL);
    /* A second context, as large as the first: one per GPU used. */
    CHECK_EQ(fake_live("reservations"), 2 * opened_one);
    if (counts_retains)
        CHECK(fake_retains(0) > 0);

    CHECK_EQ(stats_of(1).active_bytes, 4 * MB);
    CHECK_EQ(stats_of(0).active_bytes, 2 * MB);

    /* record_stream finds the block's context from the pointer, and
     * refuses a stream of another GPU rather than order the block by it. */
    CHECK_EQ(unimem_torch_record_stream(p1, compute, 1), 0);
    CHECK_EQ(unimem_torch_record_stream(p1, compute, -1), 0);
    CHECK_EQ(unimem_torch_record_stream(p0, compute, 0), 0);
    CHECK_EQ(unimem_torch_record_stream(p1, compute, 0), UM_ERR_WRONG_DEVICE);
    CHECK(last_error_mentions("memory on cuda:1 with a stream of cuda:0"));
    CHECK_EQ(unimem_torch_record_stream((char *)p1 + 512, compute, 0), 0);

    unimem_torch_free(p1, 4 * MB, 1, comm);
    CHECK_EQ(stats_of(1).active_bytes, 0);
    CHECK_EQ(stats_of(0).active_bytes, 2 * MB);

    /* The memory fraction is per GPU. */
    CHECK_EQ(unimem_torch_set_memory_fraction(0.25, 1), 0);
    CHECK(allocation_fails(40 * MB, 1));
    void *big0 = unimem_torch_alloc(40 * MB, 0, comm);
    CHECK(big0 != NULL);
    unimem_torch_free(big0, 40 * MB, 0, comm);
    CHECK_EQ(unimem_torch_set_memory_fraction(1.0, 1), 0);

    /* torch.cuda.empty_cache reaches every open GPU. */
    unimem_torch_free(p0, 2 * MB, 0, comm);
    CHECK(stats_of(0).reserved_bytes > 0 && stats_of(1).reserved_bytes > 0);
    CHECK_EQ(unimem_torch_empty_cache(), 0);
    CHECK_EQ(stats_of(0).reserved_bytes, 0);
    CHECK_EQ(stats_of(1).reserved_bytes, 0);

    /* A device the driver does not have fails clearly, again and again. */
    CHECK(allocation_fails(MB, 5));
    CHECK(unimem_torch_can_throw() || last_error_mentions("cuda:5"));
    CHECK(allocation_fails(MB, 5));
}

/* Threads that all start on GPUs not yet open: each GPU's context is
 * opened once, and every allocation lands in it. */
enum { RACERS = 8 };
static pthread_barrier_t race_start;

static void *race_to_open(void *arg)
{
    int device = (int)(intptr_t)arg % 2;
    pthread_barrier_wait(&race_start);
    void *p = unimem_torch_alloc(MB, device, comm);
    CHECK(p != NULL);
    return p;
}

static void concurrent_open_case(void)
{
    setenv("FAKE_CUDA_GPUS", "2", 1);
    unsetenv("UNIMEM_CONF");
    pthread_t threads[RACERS];
    void *blocks[RACERS];
    CHECK_EQ(pthread_barrier_init(&race_start, NULL, RACERS), 0);
    for (intptr_t i = 0; i < RACERS; i++)
        CHECK_EQ(pthread_create(&threads[i], NULL, race_to_open, (void *)i), 0);
    for (int i = 0; i < RACERS; i++)
        pthread_join(threads[i], &blocks[i]);
    pthread_barrier_destroy(&race_start);
    CHECK_EQ(stats_of(0).active_blocks, RACERS / 2);
    CHECK_EQ(stats_of(1).active_blocks, RACERS / 2);
    if (fake_retains(0) >= 0) {
        CHECK_EQ(fake_retains(0), 1);
        CHECK_EQ(fake_retains(1), 1);
    }
    for (int i = 0; i < RACERS; i++)
        unimem_torch_free(blocks[i], MB, i % 2, comm);
    CHECK_EQ(stats_of(0).active_blocks + stats_of(1).active_blocks, 0);
}

/* A free on a GPU that served nothing is reported, not a crash, and does
 * not open that GPU. */
static void stray_free_case(void)
{
    setenv("FAKE_CUDA_GPUS", "2", 1);
    unsetenv("UNIMEM_CONF");
    void *p = unimem_torch_alloc(MB, 0, comm);
    CHECK(p != NULL);
    long reservations = fake_live("reservations");
    unimem_torch_free(p, MB, 1, comm);
    CHECK(last_error_mentions("cuda:1, where unimem_torch has allocated nothing"));
    CHECK_EQ(fake_live("reservations"), reservations);
    unimem_torch_free(p, MB, 0, comm);
    CHECK_EQ(stats_of(0).active_bytes, 0);
}

/* UNIMEM_CONF naming devices keeps one context for them all. */
static void shared_context_case(void)
{
    setenv("FAKE_CUDA_GPUS", "2", 1);
    setenv("UNIMEM_CONF", "devices=cuda", 1);
    void *p1 = unimem_torch_alloc(4 * MB, 1, comm);
    CHECK(p1 != NULL);
    long reservations = fake_live("reservations");
    void *p0 = unimem_torch_alloc(2 * MB, 0, comm);
    CHECK(p0 != NULL);
    CHECK_EQ(fake_live("reservations"), reservations); /* both were open already */
    CHECK_EQ(stats_of(1).active_bytes, 4 * MB);
    CHECK_EQ(stats_of(0).active_bytes, 2 * MB);
    CHECK_EQ(unimem_torch_record_stream(p1, compute, 1), 0);
    CHECK_EQ(unimem_torch_record_stream(p0, compute, 1), UM_ERR_WRONG_DEVICE);
    unimem_torch_free(p1, 4 * MB, 1, comm);
    unimem_torch_free(p0, 2 * MB, 0, comm);
    CHECK_EQ(stats_of(1).active_bytes, 0);
    CHECK_EQ(stats_of(0).active_bytes, 0);
    CHECK_EQ(unimem_torch_empty_cache(), 0);
    CHECK_EQ(stats_of(1).reserved_bytes, 0);
}

static void shared_context_one_gpu_case(void)
{
    setenv("FAKE_CUDA_GPUS", "2", 1);
    setenv("UNIMEM_CONF", "devices=cuda:1", 1);
    void *p1 = unimem_torch_alloc(MB, 1, comm);
    CHECK(p1 != NULL);
    CHECK(allocation_fails(MB, 0));
    CHECK(unimem_torch_can_throw() || last_error_mentions("cuda:0 is not among the devices"));
    unimem_torch_free(p1, MB, 1, comm);
}

/* ---------------------------------------------------- driver shutdown */

/* True when what the case printed to stderr (redirected to the file fd)
 * mentions `what`. */
static bool stderr_mentions(int fd, const char *what)
{
    char text[4096];
    fflush(stderr);
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    text[n > 0 ? n : 0] = '\0';
    return strstr(text, what) != NULL;
}

/* Empties the file stderr goes to. */
static void stderr_clear(int fd)
{
    fflush(stderr);
    CHECK(ftruncate(fd, 0) == 0);
    CHECK(lseek(STDERR_FILENO, 0, SEEK_SET) == 0);
}

/* A free that fails because the driver is shutting down (frees from static
 * destructors at exit) prints nothing; other failed frees still do. Marked
 * blocks make um_free reach the driver. */
static void shutdown_case(void)
{
    FILE *captured = tmpfile();
    CHECK(captured != NULL);
    if (!captured)
        return;
    int fd = fileno(captured);
    CHECK(dup2(fd, STDERR_FILENO) >= 0);
    void *a = unimem_torch_alloc(MB, 0, comm);
    void *b = unimem_torch_alloc(MB, 0, comm);
    CHECK(a && b);
    CHECK_EQ(unimem_torch_record_stream(a, compute, 0), 0);
    CHECK_EQ(unimem_torch_record_stream(b, compute, 0), 0);

    const char *calls[] = {"cuCtxGetCurrent", "cuCtxSetCurrent", "cuEventRecord",
                           "cuStreamSynchronize"};
    for (size_t i = 0; i < sizeof calls / sizeof *calls; i++)
        fake_fail(calls[i], 201); /* CUDA_ERROR_INVALID_CONTEXT: a real failure */
    unimem_torch_free(a, MB, 0, comm);
    CHECK(last_error_mentions("free of"));
    CHECK(stderr_mentions(fd, "free of"));

    fake_fail_clear();
    stderr_clear(fd);
    for (size_t i = 0; i < sizeof calls / sizeof *calls; i++)
        fake_fail(calls[i], 4); /* CUDA_ERROR_DEINITIALIZED */
    unimem_torch_free(b, MB, 0, comm);
    CHECK(last_error_mentions("free of"));
    CHECK(!stderr_mentions(fd, "free of"));
    fake_fail_clear();
}

/* ----------------------------------------------------------- trace table */

/* UNIMEM_TORCH_TRACE end to end: a reused pointer gets a new id, and a
 * free of memory that is not unimem's writes no line. The child writes the
 * trace; it is read once the child has exited and flushed it. */
static void trace_file_case(void)
{
    void *p = unimem_torch_alloc(MB, 0, comm);
    unimem_torch_free(p, MB, 0, comm);
    void *q = unimem_torch_alloc(MB, 0, comm);
    CHECK(q == p);
    unimem_torch_free(q, MB, 0, comm);
    unimem_torch_free(compute, 1, 0, comm);
}

static void check_trace_file(void)
{
    char path[] = "/tmp/unimem_test_torch_trace_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    close(fd);
    setenv("UNIMEM_TORCH_TRACE", path, 1);
    run_child("trace_file", trace_file_case);
    unsetenv("UNIMEM_TORCH_TRACE");
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    char text[512] = "";
    if (f) {
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = '\0';
        fclose(f);
    }
    unlink(path);
    char expected[160];
    snprintf(expected, sizeof expected, "a 0 %zu %llu\nf 0\na 1 %zu %llu\nf 1\n", MB,
             (unsigned long long)(uintptr_t)comm, MB, (unsigned long long)(uintptr_t)comm);
    CHECK(strstr(text, expected) != NULL);
    CHECK(strstr(text, "f 2") == NULL);
    if (!strstr(text, expected))
        printf("trace file:\n%s\n", text);
}

int main(void)
{
    if (!getenv("UM_TEST_FAKE_CUDA")) {
        printf("test_torch_shim: skipped: runs on the stand-in CUDA driver only "
               "(ctest sets UM_TEST_FAKE_CUDA and its library path)\n");
        return 77;
    }
    /* Each case in a fresh process: the shim opens its contexts once per
     * process, and several cases need an environment of their own. */
    run_child("record_stream", record_stream_case);
    run_child("memory_fraction", memory_fraction_case);
    run_child("last_error", last_error_case);
    run_child("capture_and_capability", capture_and_capability_case);
    run_child("lazy_contexts", lazy_contexts_case);
    run_child("concurrent_open", concurrent_open_case);
    run_child("stray_free", stray_free_case);
    run_child("shared_context", shared_context_case);
    run_child("shared_context_one_gpu", shared_context_one_gpu_case);
    run_child("shutdown", shutdown_case);
    check_trace_file();
    return harness_finish("test_torch_shim");
}
