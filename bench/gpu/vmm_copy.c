/*
 * Does the way device memory is mapped change how fast the GPU copies it?
 * tlbprobe.py found a 1 GiB copy between two tensors of unimem's (2 MiB
 * pages, one cuMemCreate each) 18-23% slower than between two cudaMalloc
 * ones, while gathers and element-wise kernels were not slower. This times
 * one device-to-device cuMemcpy of 1 GiB between two buffers made four
 * ways, in alternating rounds:
 *   alloc    cuMemAlloc
 *   pages    512 handles of 2 MiB, mapped side by side (the pool's layout)
 *   one      one handle of 1 GiB, one mapping
 * (Mapping one handle in pieces, at offsets, is what would tell handles
 * from mappings apart; the H200's driver refuses a nonzero offset with
 * CUDA_ERROR_NOT_SUPPORTED.)
 * Prints the median time (ms) and GB/s (read + write) of each.
 * Build: cc -O2 -Isrc -Iinclude bench/gpu/vmm_copy.c BUILD/libunimem.a -lz -lpthread -ldl -lm
 */
#include "driver_open.h"

#include <stdio.h>
#include <stdlib.h>

#define GIB ((size_t)1 << 30)
#define REPS 15
#define ROUNDS 3

#define CK(call)                                                                                  \
    do {                                                                                          \
        um_cuResult r_ = (call);                                                                  \
        if (r_ != UM_CU_SUCCESS) {                                                                \
            fprintf(stderr, "vmm_copy: %s failed: %d\n", #call, r_);                              \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

enum { ALLOC, PAGES, ONE, KINDS };
static const char *kind_name[KINDS] = {"alloc", "pages", "one"};

static bench_driver drv; /* set up once by main */

/* A 1 GiB buffer of the given kind (its handles are leaked: the process
 * is short-lived and the buffers live to its end). */
static um_cuDeviceptr make_buffer(int kind)
{
    um_cuDeviceptr p = 0;
    if (kind == ALLOC) {
        CK(drv.cu->MemAlloc(&p, GIB));
        return p;
    }
    CK(drv.cu->MemAddressReserve(&p, GIB, drv.granularity, 0, 0));
    if (kind == PAGES) {
        for (size_t off = 0; off < GIB; off += drv.granularity) {
            um_cuMemHandle h;
            CK(drv.cu->MemCreate(&h, drv.granularity, &drv.prop, 0));
            CK(drv.cu->MemMap(p + off, drv.granularity, 0, h, 0));
        }
    } else {
        um_cuMemHandle h;
        CK(drv.cu->MemCreate(&h, GIB, &drv.prop, 0));
        CK(drv.cu->MemMap(p, GIB, 0, h, 0));
    }
    CK(drv.cu->MemSetAccess(p, GIB, &drv.access, 1));
    return p;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median milliseconds of one 1 GiB copy from src to dst. */
static double time_copy(um_cuDeviceptr dst, um_cuDeviceptr src)
{
    double t[REPS];
    CK(drv.cu->Memcpy(dst, src, GIB)); /* warm */
    CK(drv.cu->StreamSynchronize(NULL));
    for (int i = 0; i < REPS; i++) {
        uint64_t t0 = um__now_ns();
        CK(drv.cu->Memcpy(dst, src, GIB));
        CK(drv.cu->StreamSynchronize(NULL));
        t[i] = (double)(um__now_ns() - t0) / 1e6;
    }
    qsort(t, REPS, sizeof t[0], cmp_double);
    return t[REPS / 2];
}

int main(void)
{
    int rc = bench_driver_open("vmm_copy", &drv);
    if (rc)
        return rc;
    um_cuDeviceptr src[KINDS], dst[KINDS];
    for (int k = 0; k < KINDS; k++) {
        src[k] = make_buffer(k);
        dst[k] = make_buffer(k);
        CK(drv.cu->MemsetD8Async(src[k], (unsigned char)(k + 1), GIB, NULL));
    }
    CK(drv.cu->StreamSynchronize(NULL));
    printf("1 GiB device-to-device cuMemcpy, median of %d, %d rounds (granularity %zu KiB)\n",
           REPS, ROUNDS, drv.granularity >> 10);
    for (int r = 0; r < ROUNDS; r++) {
        printf("round %d:", r + 1);
        for (int i = 0; i < KINDS; i++) {
            int k = r % 2 ? KINDS - 1 - i : i; /* alternate the order */
            double ms = time_copy(dst[k], src[k]);
            printf("  %s %.3f ms (%.0f GB/s)", kind_name[k], ms, 2.0 * (double)GIB / ms / 1e6);
        }
        printf("\n");
    }
    return 0;
}
