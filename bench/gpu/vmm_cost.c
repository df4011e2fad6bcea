/*
 * What CUDA's virtual memory calls cost on this GPU, so the pool's policy
 * (how often it may move a page) rests on measured numbers. Times each
 * driver call the CUDA backend makes, on 2 MiB pages inside one large
 * reservation, and checks that one cuMemUnmap and one cuMemSetAccess can
 * cover a run of separately created pages; then the same memory in
 * handles of 4 and 16 pages (cuda_page_size). Prints microseconds per call.
 * Build: cc -O2 -Isrc -Iinclude bench/gpu/vmm_cost.c BUILD/libunimem.a -lz -lpthread -ldl
 */
#include "driver_open.h"

#include <stdio.h>
#include <stdlib.h>

#define PAGES 256

static double us_since(uint64_t t0, int n)
{
    return (double)(um__now_ns() - t0) / 1e3 / n;
}

#define CK(call)                                                                                  \
    do {                                                                                          \
        um_cuResult r_ = (call);                                                                  \
        if (r_ != UM_CU_SUCCESS) {                                                                \
            fprintf(stderr, "%s failed: %d\n", #call, r_);                                        \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

int main(void)
{
    bench_driver drv;
    int rc = bench_driver_open("vmm_cost", &drv);
    if (rc)
        return rc;
    const um__cuda_api *cu = drv.cu;
    um_cuMemAllocationProp prop = drv.prop;
    size_t g = drv.granularity;
    um_cuMemAccessDesc acc = drv.access;
    size_t va_size = (size_t)512 << 30;
    um_cuDeviceptr va;
    uint64_t t0 = um__now_ns();
    CK(cu->MemAddressReserve(&va, va_size, g, 0, 0));
    printf("cuMemAddressReserve of 512 GiB: %.1f us\n", us_since(t0, 1));
    um_cuMemHandle h[PAGES];
    t0 = um__now_ns();
    for (int i = 0; i < PAGES; i++)
        CK(cu->MemCreate(&h[i], g, &prop, 0));
    printf("cuMemCreate (2 MiB):            %8.1f us\n", us_since(t0, PAGES));
    /* Pages scattered over the reservation, as the pool's are. */
    t0 = um__now_ns();
    for (int i = 0; i < PAGES; i++)
        CK(cu->MemMap(va + (size_t)i * 97 * g, g, 0, h[i], 0));
    printf("cuMemMap (one page):            %8.1f us\n", us_since(t0, PAGES));
    t0 = um__now_ns();
    for (int i = 0; i < PAGES; i++)
        CK(cu->MemSetAccess(va + (size_t)i * 97 * g, g, &acc, 1));
    printf("cuMemSetAccess (one page):      %8.1f us\n", us_since(t0, PAGES));
    t0 = um__now_ns();
    for (int i = 0; i < PAGES; i++)
        CK(cu->MemUnmap(va + (size_t)i * 97 * g, g));
    printf("cuMemUnmap (one page):          %8.1f us\n", us_since(t0, PAGES));
    /* Runs of 16 adjacent pages: one map per page, then one SetAccess and
     * one Unmap for the whole run. */
    int runs = PAGES / 16;
    uint64_t tm = 0, ts = 0, tu = 0;
    for (int r = 0; r < runs; r++) {
        um_cuDeviceptr base = va + (size_t)r * 64 * g;
        t0 = um__now_ns();
        for (int i = 0; i < 16; i++)
            CK(cu->MemMap(base + (size_t)i * g, g, 0, h[r * 16 + i], 0));
        tm += um__now_ns() - t0;
        t0 = um__now_ns();
        CK(cu->MemSetAccess(base, 16 * g, &acc, 1));
        ts += um__now_ns() - t0;
        t0 = um__now_ns();
        um_cuResult ur = cu->MemUnmap(base, 16 * g);
        tu += um__now_ns() - t0;
        if (ur != UM_CU_SUCCESS) {
            printf("cuMemUnmap of a 16-page run: error %d (one call per mapping needed)\n", ur);
            for (int i = 0; i < 16; i++)
                CK(cu->MemUnmap(base + (size_t)i * g, g));
        }
    }
    printf("cuMemMap in a run (per page):   %8.1f us\n", (double)tm / 1e3 / PAGES);
    printf("cuMemSetAccess (16-page run):   %8.1f us\n", (double)ts / 1e3 / runs);
    printf("cuMemUnmap (16-page run):       %8.1f us\n", (double)tu / 1e3 / runs);
    size_t fr, tot;
    t0 = um__now_ns();
    for (int i = 0; i < 100; i++)
        CK(cu->MemGetInfo(&fr, &tot));
    printf("cuMemGetInfo:                   %8.1f us\n", us_since(t0, 100));
    um_cuEvent e;
    CK(cu->EventCreate(&e, UM_CU_EVENT_DISABLE_TIMING));
    t0 = um__now_ns();
    for (int i = 0; i < 1000; i++) {
        CK(cu->EventRecord(e, NULL));
        (void)cu->EventQuery(e);
    }
    printf("cuEventRecord + cuEventQuery:   %8.2f us\n", us_since(t0, 1000));
    um_cuContext c2;
    t0 = um__now_ns();
    for (int i = 0; i < 100000; i++)
        CK(cu->CtxGetCurrent(&c2));
    printf("cuCtxGetCurrent:                %8.3f us\n", us_since(t0, 100000));
    t0 = um__now_ns();
    for (int i = 0; i < PAGES; i++)
        CK(cu->MemRelease(h[i]));
    printf("cuMemRelease (2 MiB):           %8.1f us\n", us_since(t0, PAGES));
    /* The same 512 MiB in handles of 1, 4 and 16 driver pages
     * (cuda_page_size): whether a call costs by the call or by the page. */
    printf("handle size: create / map / set-access / unmap / release, us per call (per 2 MiB)\n");
    for (size_t k = 1; k <= 16; k *= 4) {
        size_t size = k * g;
        int n = (int)((size_t)PAGES * g / size);
        uint64_t t[5] = {0};
        for (int i = 0; i < n; i++) {
            um_cuDeviceptr at = va + (size_t)i * 2 * size; /* holes between, as the pool's */
            t0 = um__now_ns();
            CK(cu->MemCreate(&h[i], size, &prop, 0));
            t[0] += um__now_ns() - t0;
            t0 = um__now_ns();
            CK(cu->MemMap(at, size, 0, h[i], 0));
            t[1] += um__now_ns() - t0;
            t0 = um__now_ns();
            CK(cu->MemSetAccess(at, size, &acc, 1));
            t[2] += um__now_ns() - t0;
        }
        for (int i = 0; i < n; i++) {
            t0 = um__now_ns();
            CK(cu->MemUnmap(va + (size_t)i * 2 * size, size));
            t[3] += um__now_ns() - t0;
            t0 = um__now_ns();
            CK(cu->MemRelease(h[i]));
            t[4] += um__now_ns() - t0;
        }
        printf("  %4zu MiB x %3d:", size >> 20, n);
        for (int c = 0; c < 5; c++)
            printf(" %7.1f (%5.1f)", (double)t[c] / 1e3 / n, (double)t[c] / 1e3 / n / (double)k);
        printf("\n");
    }
    CK(cu->MemAddressFree(va, va_size));
    return 0;
}
