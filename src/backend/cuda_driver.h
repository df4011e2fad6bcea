/*
 * cuda_driver: the CUDA driver API, loaded at run time with
 * dlopen("libcuda.so.1"), so the library builds with no CUDA toolkit and
 * runs with no driver (CUDA devices are then simply absent).
 *
 * The types and constants below are the driver's ABI, declared here under
 * our own names (um_cu*) because cuda.h may not exist on the build machine.
 * tests/gpu/test_cuda_abi.c checks every value and layout against cuda.h when
 * the toolkit is installed.
 *
 * Owns: the loaded library and the table of entry points (one per process,
 * loaded once, never unloaded).
 */
#ifndef UM_CUDA_DRIVER_H
#define UM_CUDA_DRIVER_H

#include "../base/base.h"

typedef int um_cuResult;
typedef int um_cuDevice;
typedef unsigned long long um_cuDeviceptr;
typedef unsigned long long um_cuMemHandle;
typedef struct um_cuCtx_opaque *um_cuContext;
typedef struct um_cuStream_opaque *um_cuStream;
typedef struct um_cuEvent_opaque *um_cuEvent;
typedef struct um_cuModule_opaque *um_cuModule;
typedef struct um_cuFunction_opaque *um_cuFunction;

enum {
    UM_CU_SUCCESS = 0,
    UM_CU_ERROR_INVALID_VALUE = 1,
    UM_CU_ERROR_OUT_OF_MEMORY = 2,
    UM_CU_ERROR_NO_DEVICE = 100,
    UM_CU_ERROR_INVALID_HANDLE = 400,
    UM_CU_ERROR_NOT_READY = 600,
    UM_CU_ERROR_NOT_SUPPORTED = 801,

    UM_CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13,
    UM_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    UM_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    UM_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    UM_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    UM_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    UM_CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID = 134,
    UM_CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 141,

    UM_CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK = 1,
    UM_CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED = 2,
    UM_CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED = 3,

    UM_CU_STREAM_NON_BLOCKING = 1,
    UM_CU_EVENT_DISABLE_TIMING = 2,

    UM_CU_MEM_ALLOCATION_TYPE_PINNED = 1,
    UM_CU_MEM_HANDLE_TYPE_NONE = 0,
    UM_CU_MEM_LOCATION_TYPE_DEVICE = 1,
    UM_CU_MEM_LOCATION_TYPE_HOST_NUMA = 3,
    UM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
    UM_CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
    UM_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
};

typedef struct um_cuMemLocation {
    int type;
    int id;
} um_cuMemLocation;

typedef struct um_cuMemAllocationProp {
    int type;
    int requestedHandleTypes;
    um_cuMemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} um_cuMemAllocationProp;

typedef struct um_cuMemAccessDesc {
    um_cuMemLocation location;
    int flags;
} um_cuMemAccessDesc;

/* X(field, symbol, return, parameters): every entry point unimem uses. The
 * symbol is the versioned name that cuda.h's macros resolve to. */
#define UM_CUDA_API_LIST(X)                                                                       \
    X(Init, "cuInit", (unsigned flags))                                                           \
    X(DriverGetVersion, "cuDriverGetVersion", (int *version))                                     \
    X(GetErrorName, "cuGetErrorName", (um_cuResult r, const char **s))                            \
    X(GetErrorString, "cuGetErrorString", (um_cuResult r, const char **s))                        \
    X(DeviceGetCount, "cuDeviceGetCount", (int *count))                                           \
    X(DeviceGet, "cuDeviceGet", (um_cuDevice * d, int ordinal))                                   \
    X(DeviceGetName, "cuDeviceGetName", (char *name, int len, um_cuDevice d))                     \
    X(DeviceTotalMem, "cuDeviceTotalMem_v2", (size_t * bytes, um_cuDevice d))                     \
    X(DeviceGetAttribute, "cuDeviceGetAttribute", (int *v, int attr, um_cuDevice d))              \
    X(DeviceGetPCIBusId, "cuDeviceGetPCIBusId", (char *id, int len, um_cuDevice d))               \
    X(DeviceGetP2PAttribute, "cuDeviceGetP2PAttribute",                                           \
      (int *v, int attr, um_cuDevice src, um_cuDevice dst))                                       \
    X(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (um_cuContext * c, um_cuDevice d))      \
    X(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", (um_cuDevice d))                   \
    X(CtxGetCurrent, "cuCtxGetCurrent", (um_cuContext * c))                                       \
    X(CtxSetCurrent, "cuCtxSetCurrent", (um_cuContext c))                                         \
    X(MemGetInfo, "cuMemGetInfo_v2", (size_t * free_bytes, size_t * total))                       \
    X(MemGetAllocationGranularity, "cuMemGetAllocationGranularity",                               \
      (size_t * g, const um_cuMemAllocationProp *prop, int option))                               \
    X(MemAddressReserve, "cuMemAddressReserve",                                                   \
      (um_cuDeviceptr * p, size_t size, size_t align, um_cuDeviceptr addr, unsigned long long f)) \
    X(MemAddressFree, "cuMemAddressFree", (um_cuDeviceptr p, size_t size))                        \
    X(MemCreate, "cuMemCreate",                                                                   \
      (um_cuMemHandle * h, size_t size, const um_cuMemAllocationProp *prop,                       \
       unsigned long long flags))                                                                 \
    X(MemRelease, "cuMemRelease", (um_cuMemHandle h))                                             \
    X(MemMap, "cuMemMap",                                                                         \
      (um_cuDeviceptr p, size_t size, size_t offset, um_cuMemHandle h, unsigned long long f))     \
    X(MemUnmap, "cuMemUnmap", (um_cuDeviceptr p, size_t size))                                    \
    X(MemSetAccess, "cuMemSetAccess",                                                             \
      (um_cuDeviceptr p, size_t size, const um_cuMemAccessDesc *desc, size_t count))              \
    X(MemAlloc, "cuMemAlloc_v2", (um_cuDeviceptr * p, size_t size))                               \
    X(MemFree, "cuMemFree_v2", (um_cuDeviceptr p))                                                \
    X(Memcpy, "cuMemcpy", (um_cuDeviceptr dst, um_cuDeviceptr src, size_t n))                     \
    X(MemcpyAsync, "cuMemcpyAsync",                                                               \
      (um_cuDeviceptr dst, um_cuDeviceptr src, size_t n, um_cuStream s))                          \
    X(MemsetD8Async, "cuMemsetD8Async",                                                           \
      (um_cuDeviceptr dst, unsigned char v, size_t n, um_cuStream s))                             \
    X(StreamCreate, "cuStreamCreate", (um_cuStream * s, unsigned flags))                          \
    X(StreamDestroy, "cuStreamDestroy_v2", (um_cuStream s))                                       \
    X(StreamSynchronize, "cuStreamSynchronize", (um_cuStream s))                                  \
    X(StreamQuery, "cuStreamQuery", (um_cuStream s))                                              \
    X(StreamWaitEvent, "cuStreamWaitEvent", (um_cuStream s, um_cuEvent e, unsigned flags))        \
    X(EventCreate, "cuEventCreate", (um_cuEvent * e, unsigned flags))                             \
    X(EventDestroy, "cuEventDestroy_v2", (um_cuEvent e))                                          \
    X(EventRecord, "cuEventRecord", (um_cuEvent e, um_cuStream s))                                \
    X(EventQuery, "cuEventQuery", (um_cuEvent e))                                                 \
    X(EventSynchronize, "cuEventSynchronize", (um_cuEvent e))                                     \
    X(EventElapsedTime, "cuEventElapsedTime", (float *ms, um_cuEvent start, um_cuEvent end))     \
    X(ModuleLoadData, "cuModuleLoadData", (um_cuModule * m, const void *image))                   \
    X(ModuleUnload, "cuModuleUnload", (um_cuModule m))                                            \
    X(ModuleGetFunction, "cuModuleGetFunction",                                                   \
      (um_cuFunction * f, um_cuModule m, const char *name))                                       \
    X(LaunchKernel, "cuLaunchKernel",                                                             \
      (um_cuFunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,          \
       unsigned bz, unsigned shared, um_cuStream s, void **params, void **extra))

typedef struct um__cuda_api {
#define UM_CUDA_FIELD_(field, symbol, params) um_cuResult(*field) params;
    UM_CUDA_API_LIST(UM_CUDA_FIELD_)
#undef UM_CUDA_FIELD_
    int version;  /* cuDriverGetVersion: 12040 for 12.4 */
    int gpus;     /* cuDeviceGetCount after cuInit */
} um__cuda_api;

/* The loaded driver, or NULL with `why` filled (no libcuda.so.1, a missing
 * entry point, cuInit failed, ...). Loads once per process; thread-safe. */
const um__cuda_api *um__cuda_load(char *why, size_t why_len);

/* Fails with st and a message naming the call, its context and the
 * driver's name and text for r ("cuMemCreate of 2097152 bytes on cuda0:
 * CUDA_ERROR_OUT_OF_MEMORY (out of memory)"). */
um_status um__cuda_fail(um_status st, um_cuResult r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The status a CUresult maps to: out of memory -> UM_ERR_NOMEM, not
 * supported -> UM_ERR_UNSUPPORTED, invalid value -> UM_ERR_INVALID, the
 * rest UM_ERR_BACKEND. */
um_status um__cuda_status(um_cuResult r);

/* Makes the primary context `c` current on this thread and returns the one
 * that was, for um__cuda_leave. Every backend operation runs between the
 * two, so a program's own current context (PyTorch's) is left as it was.
 * On failure *failed (when failed is not NULL) names the call that failed,
 * "cuCtxGetCurrent" or "cuCtxSetCurrent", so that a message names it rather
 * than the call the context was entered for. */
um_cuResult um__cuda_enter(const um__cuda_api *cu, um_cuContext c, um_cuContext *saved,
                           const char **failed);
void um__cuda_leave(const um__cuda_api *cu, um_cuContext c, um_cuContext saved);

#endif /* UM_CUDA_DRIVER_H */
