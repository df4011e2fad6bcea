/* The stand-in driver's lazy mode for tests: see lazy_driver.h. */
#include "lazy_driver.h"

#include "harness.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int (*lazy_launch)(void *stream, void *p, size_t n);
int (*lazy_wait)(void *waiter, void *on);
int (*lazy_drain)(void);
long (*lazy_violations)(const char *what);
int (*lazy_retains)(int gpu);
int (*cuda_fail)(const char *call, unsigned skip, unsigned times, int result);
void (*cuda_fail_clear)(void);

counts counts_now(void)
{
    return (counts){lazy_violations("unmap"), lazy_violations("race")};
}

long unmaps_since(counts c)
{
    return lazy_violations("unmap") - c.unmap;
}

long races_since(counts c)
{
    return lazy_violations("race") - c.race;
}

counts check_begin(const char *name)
{
    printf("-- %s\n", name);
    fflush(stdout);
    cuda_fail_clear();
    lazy_drain();
    return counts_now();
}

um_context *check_open(const char *name, const char *conf, counts *c)
{
    *c = check_begin(name);
    um_context *ctx = NULL;
    CHECK_OK(um_init(conf, &ctx));
    return ctx;
}

void check_end(um_context *ctx, counts c)
{
    cuda_fail_clear();
    um_shutdown(ctx);
    CHECK_EQ(unmaps_since(c), 0);
    CHECK_EQ(races_since(c), 0);
}

void *native_of(um_stream s)
{
    return s ? um_stream_native(s) : NULL;
}

size_t buffer_count_not(um_buffer *b, size_t n, int byte)
{
    unsigned char *h = calloc(1, n);
    CHECK_OK(um_buffer_read(b, 0, h, n));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += h[i] != (unsigned char)byte;
    free(h);
    return bad;
}

bool lazy_driver_open(const char *test, int min_gpus)
{
    const char *need = "needs the stand-in driver (UM_TEST_FAKE_CUDA=1, LD_LIBRARY_PATH to "
                       "its libcuda.so.1)";
    if (!getenv("UM_TEST_FAKE_CUDA")) {
        printf("%s: SKIPPED: %s\n", test, need);
        return false;
    }
    /* Before the driver is loaded, which reads them once. */
    setenv("FAKE_CUDA_LAZY_QUERIES", "3", 0);
    setenv("FAKE_CUDA_GPUS", "4", 0);
    char why[256] = "";
    int version = 0, gpus = 0;
    if (um_cuda_driver_info(&version, &gpus, why, sizeof why) != UM_OK || gpus < min_gpus) {
        if (!why[0])
            snprintf(why, sizeof why, "the driver reports %d GPUs, fewer than %d", gpus,
                     min_gpus);
        printf("%s: SKIPPED: %s\n", test, why);
        return false;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib) {
        *(void **)&lazy_launch = dlsym(lib, "fake_lazy_launch");
        *(void **)&lazy_wait = dlsym(lib, "fake_lazy_wait");
        *(void **)&lazy_drain = dlsym(lib, "fake_lazy_drain");
        *(void **)&lazy_violations = dlsym(lib, "fake_lazy_violations");
        *(void **)&lazy_retains = dlsym(lib, "fake_lazy_retains");
        *(void **)&cuda_fail = dlsym(lib, "fake_cuda_fail");
        *(void **)&cuda_fail_clear = dlsym(lib, "fake_cuda_fail_clear");
    }
    if (!lazy_launch || !lazy_wait || !lazy_drain || !lazy_violations || !lazy_retains ||
        !cuda_fail || !cuda_fail_clear) {
        printf("%s: SKIPPED: %s; this libcuda.so.1 lacks fake_lazy_launch\n", test, need);
        return false;
    }
    if (lazy_drain() != 0) {
        printf("%s: SKIPPED: the stand-in driver is not in lazy mode (FAKE_CUDA_LAZY_QUERIES "
               "is empty)\n",
               test);
        return false;
    }
    return true;
}
