/*
 * Failures of the driver calls that order GPU work, with buffers used from
 * several threads, on the stand-in driver's lazy mode
 * (tests/gpu/fake_cuda.c, FAKE_CUDA_LAZY_QUERIES): queued work stays
 * pending until waited for, and the driver reports memory unmapped under
 * pending work ("unmap") and bytes two streams touch unordered ("race").
 * A wrapped buffer's destroy whose copy back into the program's memory
 * fails names the driver call that failed.
 * The test sets FAKE_CUDA_LAZY_QUERIES=3 and FAKE_CUDA_GPUS=4 unless they
 * are set. Exits 77 (skipped), saying why, without the stand-in driver.
 */
#include "harness.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)
#define SKIP 77
/* Two stand-in GPUs (devices 1 and 2) with the model's links. */
#define TWO_GPUS "devices=cuda:0+cuda:1,links=model,link_cache=none"

/* The stand-in driver's entry points for tests. */
static int (*lazy_drain)(void);
static long (*lazy_violations)(const char *what);
static int (*cuda_fail)(const char *call, unsigned skip, unsigned times, int result);
static void (*cuda_fail_clear)(void);

/* A wrapped buffer whose newest data is on GPU 1 is destroyed while the
 * copy back into the program's memory fails (cuMemcpyAsync): the destroy
 * fails, its message naming the driver call, and the buffer stays, the
 * program's memory getting its bytes once destroyed again. (The message
 * was formatted over the copy's own, which it quoted, and came out as
 * itself twice with the cause cut away.) */
static void check_wrapped_destroy_message(void)
{
    printf("-- a wrapped buffer's destroy whose copy back fails names the driver call\n");
    fflush(stdout);
    lazy_drain();
    long unmap0 = lazy_violations("unmap"), race0 = lazy_violations("race");
    um_context *ctx = NULL;
    CHECK_OK(um_init(TWO_GPUS, &ctx));
    if (!ctx)
        return;
    const size_t n = 256 << 10;
    unsigned char *host = calloc(1, n), *src = malloc(n);
    memset(src, 0xA7, n);
    um_buffer *b = NULL;
    void *p = NULL;
    CHECK_OK(um_buffer_wrap(ctx, host, n, &b));
    CHECK_OK(um_buffer_acquire(b, 1, UM_ACCESS_WRITE_DISCARD, NULL, &p));
    if (p) {
        CHECK_OK(um_memcpy(ctx, p, src, n));
        CHECK_OK(um_buffer_release(b, 1, NULL));
    }
    cuda_fail("cuMemcpyAsync", 0, 1000, 999);
    cuda_fail("cuMemcpy", 0, 1000, 999);
    um_status st = um_buffer_destroy(b);
    CHECK_STATUS(st, UM_ERR_BACKEND);
    CHECK_ERROR_MENTIONS("could not be copied back", "cuMemcpy", NULL);
    /* The message says so once. */
    const char *e = um_last_error(), *first = strstr(e, "could not be copied back");
    CHECK(first && !strstr(first + 1, "could not be copied back"));
    cuda_fail_clear();
    if (st != UM_OK)
        CHECK_OK(um_buffer_destroy(b));
    CHECK_EQ(memcmp(host, src, n), 0);
    um_shutdown(ctx);
    CHECK_EQ(lazy_violations("unmap") - unmap0, 0);
    CHECK_EQ(lazy_violations("race") - race0, 0);
    free(host);
    free(src);
}

/* Resolves the stand-in's entry points; false (with the reason printed)
 * where this is not the stand-in driver in lazy mode. */
static bool find_lazy_driver(void)
{
    const char *need = "needs the stand-in driver (UM_TEST_FAKE_CUDA=1, LD_LIBRARY_PATH to "
                       "its libcuda.so.1)";
    if (!getenv("UM_TEST_FAKE_CUDA")) {
        printf("test_event_faults_mt: SKIPPED: %s\n", need);
        return false;
    }
    char why[256] = "";
    int version = 0, gpus = 0;
    if (um_cuda_driver_info(&version, &gpus, why, sizeof why) != UM_OK || gpus < 2) {
        printf("test_event_faults_mt: SKIPPED: %s\n",
               why[0] ? why : "the driver reports fewer than two GPUs");
        return false;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib) {
        *(void **)&lazy_drain = dlsym(lib, "fake_lazy_drain");
        *(void **)&lazy_violations = dlsym(lib, "fake_lazy_violations");
        *(void **)&cuda_fail = dlsym(lib, "fake_cuda_fail");
        *(void **)&cuda_fail_clear = dlsym(lib, "fake_cuda_fail_clear");
    }
    if (!lazy_drain || !lazy_violations || !cuda_fail || !cuda_fail_clear) {
        printf("test_event_faults_mt: SKIPPED: %s; this libcuda.so.1 lacks fake_lazy_drain\n",
               need);
        return false;
    }
    if (lazy_drain() != 0) {
        printf("test_event_faults_mt: SKIPPED: the stand-in driver is not in lazy mode "
               "(FAKE_CUDA_LAZY_QUERIES is empty)\n");
        return false;
    }
    return true;
}

int main(void)
{
    /* Before the driver is loaded, which reads them once. */
    if (getenv("UM_TEST_FAKE_CUDA")) {
        setenv("FAKE_CUDA_LAZY_QUERIES", "3", 0);
        setenv("FAKE_CUDA_GPUS", "4", 0);
    }
    if (!find_lazy_driver())
        return SKIP;
    check_wrapped_destroy_message();
    return harness_finish("test_event_faults_mt");
}
