/*
 * The CUDA driver set-up that the C programs of bench/gpu share: load the
 * driver, make device 0's primary context current, and describe its pinned
 * device pages (allocation properties, access for device 0, granularity).
 */
#ifndef UM_BENCH_DRIVER_OPEN_H
#define UM_BENCH_DRIVER_OPEN_H

#include "backend/cuda_driver.h"

#include <stdio.h>

typedef struct bench_driver {
    const um__cuda_api *cu;
    um_cuMemAllocationProp prop;  /* pinned memory of device 0 */
    um_cuMemAccessDesc access;    /* read-write for device 0 */
    size_t granularity;           /* the driver's minimum page */
} bench_driver;

/* 0 when ready; 2 (the programs' "no GPU" exit status) with the reason
 * printed after `who`; 1 when a driver call failed. */
static inline int bench_driver_open(const char *who, bench_driver *d)
{
    char why[256];
    d->cu = um__cuda_load(why, sizeof why);
    if (!d->cu || d->cu->gpus < 1) {
        printf("%s: no GPU: %s\n", who, d->cu ? "the driver reports none" : why);
        return 2;
    }
    um_cuDevice dev;
    um_cuContext ctx;
    um_cuResult r = d->cu->DeviceGet(&dev, 0);
    if (r == UM_CU_SUCCESS)
        r = d->cu->DevicePrimaryCtxRetain(&ctx, dev);
    if (r == UM_CU_SUCCESS)
        r = d->cu->CtxSetCurrent(ctx);
    d->prop = (um_cuMemAllocationProp){0};
    d->prop.type = UM_CU_MEM_ALLOCATION_TYPE_PINNED;
    d->prop.location.type = UM_CU_MEM_LOCATION_TYPE_DEVICE;
    d->prop.location.id = 0;
    d->access = (um_cuMemAccessDesc){{UM_CU_MEM_LOCATION_TYPE_DEVICE, 0},
                                     UM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    d->granularity = 0;
    if (r == UM_CU_SUCCESS)
        r = d->cu->MemGetAllocationGranularity(&d->granularity, &d->prop,
                                               UM_CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != UM_CU_SUCCESS) {
        fprintf(stderr, "%s: setting up device 0 failed: CUresult %d\n", who, r);
        return 1;
    }
    return 0;
}

#endif
