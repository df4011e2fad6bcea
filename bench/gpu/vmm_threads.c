/*
 * Whether the driver's page calls scale across threads: 1,024 pages of 2 MiB
 * created, mapped and given access (what the pool does for each page of
 * fresh memory) by 1, 2, 4 and 8 threads, each on its own part of one
 * reservation, then unmapped and released. If they scale, a pool growing
 * by a large allocation could spread its pages over threads; if the
 * driver serializes them, only larger pages (large_page) make growth
 * cheaper. Prints microseconds per page and the speed-up over one thread.
 * With "host" (and a chunk size in MiB, default the granularity), the
 * pages are pinned host memory (HOST_NUMA), 2 GiB in all: whether pinning
 * fresh host memory, about 4 GB/s on one thread, scales.
 * Usage: vmm_threads [host [CHUNK_MIB]]
 * Build: cc -O2 -Isrc -Iinclude bench/gpu/vmm_threads.c BUILD/libunimem.a -lz -lpthread -ldl
 */
#include "driver_open.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PAGES 1024
#define MAX_THREADS 8

static bench_driver drv;
static um_cuContext ctx;
static um_cuDeviceptr va;
static um_cuMemHandle handles[MAX_PAGES];
static int npages = MAX_PAGES;
static um_cuMemAccessDesc access[2];
static int naccess = 1;
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
                r = cu->MemSetAccess(at, g, access, (size_t)naccess);
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
        parts[i] = (part){i * (npages / threads), npages / threads, grow, 0};
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

int main(int argc, char **argv)
{
    int rc = bench_driver_open("vmm_threads", &drv);
    if (rc)
        return rc;
    access[0] = drv.access;
    if (argc > 1 && strcmp(argv[1], "host") == 0) {
        drv.prop.location.type = UM_CU_MEM_LOCATION_TYPE_HOST_NUMA;
        drv.prop.location.id = 0;
        if (drv.cu->MemGetAllocationGranularity(&drv.granularity, &drv.prop,
                                                UM_CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
            UM_CU_SUCCESS) {
            fprintf(stderr, "vmm_threads: no granularity for pinned host memory\n");
            return 1;
        }
        if (argc > 2) {
            size_t chunk = (size_t)atol(argv[2]) << 20;
            if (!chunk || chunk % drv.granularity) {
                fprintf(stderr,
                        "vmm_threads: CHUNK_MIB '%s' is not a positive multiple of the "
                        "granularity, %zu KiB\n",
                        argv[2], drv.granularity >> 10);
                return 1;
            }
            drv.granularity = chunk;
        }
        access[1] = (um_cuMemAccessDesc){{UM_CU_MEM_LOCATION_TYPE_HOST_NUMA, 0},
                                         UM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        naccess = 2;
        npages = (int)(((size_t)2 << 30) / drv.granularity);
        if (npages > MAX_PAGES)
            npages = MAX_PAGES;
    }
    if (drv.cu->CtxGetCurrent(&ctx) != UM_CU_SUCCESS ||
        drv.cu->MemAddressReserve(&va, (size_t)npages * drv.granularity, drv.granularity, 0, 0) !=
            UM_CU_SUCCESS) {
        fprintf(stderr, "vmm_threads: no context or no reservation\n");
        return 1;
    }
    printf("%d pages of %zu KiB; us a page (create + map + access | unmap + release)\n", npages,
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
                   round + 1, threads, grow_us / npages, one_grow / grow_us, shrink_us / npages,
                   one_shrink / shrink_us);
        }
    return 0;
}
