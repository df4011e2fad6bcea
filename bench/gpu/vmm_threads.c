/*
 * Whether the driver's page calls scale across threads: PAGES 2 MiB pages
 * created, mapped and given access (what the pool does for each page of
 * fresh memory) by 1, 2, 4 and 8 threads, each on its own part of one
 * reservation, then unmapped and released. If they scale, a pool growing
 * by a large allocation could spread its pages over threads; if the
 * driver serializes them, only larger pages (large_page) make growth
 * cheaper. Prints microseconds per page and the speed-up over one thread.
 * Build: cc -O2 -Isrc -Iinclude bench/gpu/vmm_threads.c BUILD/libunimem.a -lz -lpthread -ldl
 */
#include "driver_open.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#define PAGES 1024
#define MAX_THREADS 8

static bench_driver drv;
static um_cuContext ctx;
static um_cuDeviceptr va;
static um_cuMemHandle handles[PAGES];
static pthread_barrier_t start;

typedef struct part {
    int first, n;
    bool grow;  /* create, map and give access; else unmap and release */
    int failed; /* the CUresult of a failed call, else 0 */
} part;

static void *work(void *arg)
{
    part *p = arg;
    const um__cuda_api *cu = drv.cu;
    size_t g = drv.granularity;
    um_cuResult r = cu->CtxSetCurrent(ctx);
    pthread_barrier_wait(&start);
    for (int i = p->first; i < p->first + p->n && r == UM_CU_SUCCESS; i++) {
        um_cuDeviceptr at = va + (size_t)i * g;
        if (p->grow) {
            r = cu->MemCreate(&handles[i], g, &drv.prop, 0);
            if (r == UM_CU_SUCCESS)
                r = cu->MemMap(at, g, 0, handles[i], 0);
            if (r == UM_CU_SUCCESS)
                r = cu->MemSetAccess(at, g, &drv.access, 1);
        } else {
            r = cu->MemUnmap(at, g);
            if (r == UM_CU_SUCCESS)
                r = cu->MemRelease(handles[i]);
        }
    }
    p->failed = (int)r;
    return NULL;
}

/* Grows (or shrinks) over the pages on `threads` threads; the
 * microseconds it took, or a negative number when a call failed. */
static double timed(bool grow, int threads)
{
    pthread_t t[MAX_THREADS];
    part parts[MAX_THREADS];
    pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) {
        parts[i] = (part){i * (PAGES / threads), PAGES / threads, grow, 0};
        pthread_create(&t[i], NULL, work, &parts[i]);
    }
    pthread_barrier_wait(&start);
    uint64_t t0 = um__now_ns();
    int failed = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        if (parts[i].failed)
            failed = parts[i].failed;
    }
    double us = (double)(um__now_ns() - t0) / 1e3;
    pthread_barrier_destroy(&start);
    if (failed)
        fprintf(stderr, "vmm_threads: a driver call failed with CUresult %d\n", failed);
    return failed ? -1.0 : us;
}

int main(void)
{
    int rc = bench_driver_open("vmm_threads", &drv);
    if (rc)
        return rc;
    if (drv.cu->CtxGetCurrent(&ctx) != UM_CU_SUCCESS ||
        drv.cu->MemAddressReserve(&va, (size_t)PAGES * drv.granularity, drv.granularity, 0, 0) !=
            UM_CU_SUCCESS) {
        fprintf(stderr, "vmm_threads: no context or no reservation\n");
        return 1;
    }
    printf("%d pages of %zu KiB; us a page (create + map + access | unmap + release)\n", PAGES,
           drv.granularity >> 10);
    double one_grow = 0, one_shrink = 0;
    for (int round = 0; round < 2; round++)
        for (int threads = 1; threads <= MAX_THREADS; threads *= 2) {
            double grow_us = timed(true, threads), shrink_us = timed(false, threads);
            if (grow_us < 0 || shrink_us < 0)
                return 1;
            if (threads == 1) {
                one_grow = grow_us;
                one_shrink = shrink_us;
            }
            printf("round %d, %d threads: %7.2f us a page (%.2fx) | %7.2f us a page (%.2fx)\n",
                   round + 1, threads, grow_us / PAGES, one_grow / grow_us, shrink_us / PAGES,
                   one_shrink / shrink_us);
        }
    return 0;
}
