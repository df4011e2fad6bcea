/*
 * A stand-in for the CUDA driver (built as libcuda.so.1 in the build tree),
 * so that CI, which has no GPU, runs the CUDA backend itself: the loader,
 * context handling, VMM reserve/create/map/unmap, access, events, streams,
 * copies, cuMemAlloc segments and every error path that checks a result.
 *
 * Memory is host memory: physical chunks live in one memfd, reservations
 * are PROT_NONE ranges and cuMemMap maps the memfd there, as the sim
 * backend does. It keeps CUDA's rules that the backend relies on (unmap
 * covers whole mappings, map only into a reservation and never over a
 * mapping) and answers anything else with CUDA_ERROR_INVALID_VALUE. Work
 * completes at once: every event is complete when recorded. Kernels are
 * not supported (cuModuleLoadData fails with CUDA_ERROR_NOT_SUPPORTED).
 *
 * FAKE_CUDA_GPUS=N (default 1) sets the GPU count, FAKE_CUDA_NO_VMM=1 takes
 * VMM away, FAKE_CUDA_MEM=BYTES sets each GPU's memory (default 4 GiB).
 * FAKE_CUDA_FAIL_EVERY=N makes every Nth call of cuMemCreate, cuMemMap,
 * cuMemSetAccess, cuMemUnmap, cuMemRelease and cuEventRecord fail (each
 * counted on its own), for the backend's and the pool's error paths.
 *
 * A test can also fail chosen calls, by name, through entry points only
 * this driver has (found with dlsym): fake_cuda_fail("cuMemUnmap", skip,
 * times, result) makes the calls of cuMemUnmap after the next `skip` fail
 * `times` times with `result` (rules add up; fake_cuda_fail_clear drops
 * them), and fake_cuda_live("mappings") counts what is live: "mappings",
 * "chunks" (not released, or released but still mapped), "streams",
 * "events" or "reservations".
 *
 * As on CUDA, releasing a chunk that is still mapped keeps its memory until
 * its last unmap, and a reservation with a mapping in it is not freed.
 *
 * FAKE_CUDA_OPAQUE=1 makes GPU memory unreachable from the host, as a real
 * GPU's is: a GPU's mapping stays PROT_NONE at its device address (a host
 * access faults) and the driver's copies and memsets reach it through a
 * second mapping of the same memory, so a test that reads or writes GPU
 * memory in place crashes instead of passing only here. (cuMemAlloc
 * segments and pinned host memory stay readable.)
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/cuda_driver.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_MAPS 65536
#define MAX_RES 256
#define PAGE ((size_t)2 << 20)

typedef struct chunk {
    size_t off, size; /* in the memfd */
    int gpu;          /* -1: host */
    size_t maps;      /* mappings of it */
    int released;     /* cuMemRelease'd while mapped: freed by its last unmap */
} chunk;

typedef struct mapping {
    uintptr_t va;
    size_t size;
    char *shadow; /* FAKE_CUDA_OPAQUE: the host's way to a GPU's mapping */
    chunk *c;
} mapping;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int fd = -1;
static size_t fd_end;
static mapping maps[MAX_MAPS];
static size_t nmaps;
static mapping res[MAX_RES];
static size_t nres;
static int gpus = 1;
static int vmm = 1;
static size_t gpu_mem = (size_t)4 << 30;
static size_t used[64]; /* bytes created or cuMemAlloc'ed per GPU */
static __thread um_cuContext current;
static unsigned fail_every;
static int opaque;
static size_t live_chunks; /* under lock */

enum { F_CREATE, F_MAP, F_ACCESS, F_UNMAP, F_RELEASE, F_RECORD, F_COUNT };
static _Atomic unsigned fail_calls[F_COUNT];

/* True when this call of op is one the FAKE_CUDA_FAIL_EVERY rule fails. */
static int injected(int op)
{
    return fail_every && (atomic_fetch_add(&fail_calls[op], 1) + 1) % fail_every == 0;
}

/* fake_cuda_fail's rules, under their own lock (the driver's lock may be
 * held by the caller of forced()). */
#define MAX_RULES 32
typedef struct rule {
    char call[48];
    unsigned skip, times;
    um_cuResult result;
} rule;
static pthread_mutex_t rules_lock = PTHREAD_MUTEX_INITIALIZER;
static rule rules[MAX_RULES];
static _Atomic int nrules;
static _Atomic long live_streams, live_events;

EXPORT int fake_cuda_fail(const char *call, unsigned skip, unsigned times, int result)
{
    pthread_mutex_lock(&rules_lock);
    int n = atomic_load(&nrules);
    if (n == MAX_RULES || strlen(call) >= sizeof rules[0].call) {
        pthread_mutex_unlock(&rules_lock);
        return -1;
    }
    rules[n] = (rule){"", skip, times, result};
    strcpy(rules[n].call, call);
    atomic_store(&nrules, n + 1);
    pthread_mutex_unlock(&rules_lock);
    return 0;
}

EXPORT void fake_cuda_fail_clear(void)
{
    pthread_mutex_lock(&rules_lock);
    atomic_store(&nrules, 0);
    pthread_mutex_unlock(&rules_lock);
}

/* The result a rule forces on this call of `call`, or UM_CU_SUCCESS. */
static um_cuResult forced(const char *call)
{
    if (!atomic_load_explicit(&nrules, memory_order_relaxed))
        return UM_CU_SUCCESS;
    um_cuResult r = UM_CU_SUCCESS;
    pthread_mutex_lock(&rules_lock);
    int n = atomic_load(&nrules), kept = 0;
    for (int i = 0; i < n; i++) {
        rule *x = &rules[i];
        if (r == UM_CU_SUCCESS && strcmp(x->call, call) == 0) {
            if (x->skip)
                x->skip--;
            else if (x->times) {
                x->times--;
                r = x->result;
            }
        }
        if (x->times)
            rules[kept++] = *x;
    }
    atomic_store(&nrules, kept);
    pthread_mutex_unlock(&rules_lock);
    return r;
}

/* Returns the forced result of this call of `call`, if any. */
#define FORCED(call)                                                                              \
    do {                                                                                          \
        um_cuResult forced_ = forced(call);                                                       \
        if (forced_ != UM_CU_SUCCESS)                                                             \
            return forced_;                                                                       \
    } while (0)
static char ctx_tokens[64];

static int setup(void)
{
    if (fd >= 0)
        return 0;
    const char *g = getenv("FAKE_CUDA_GPUS");
    if (g)
        gpus = atoi(g);
    if (gpus < 0 || gpus > 64)
        gpus = 1;
    vmm = !(getenv("FAKE_CUDA_NO_VMM") && atoi(getenv("FAKE_CUDA_NO_VMM")));
    if (getenv("FAKE_CUDA_MEM"))
        gpu_mem = strtoull(getenv("FAKE_CUDA_MEM"), NULL, 0);
    if (getenv("FAKE_CUDA_FAIL_EVERY"))
        fail_every = (unsigned)atoi(getenv("FAKE_CUDA_FAIL_EVERY"));
    opaque = getenv("FAKE_CUDA_OPAQUE") && atoi(getenv("FAKE_CUDA_OPAQUE"));
    fd = memfd_create("fake_cuda", 0);
    return fd < 0 ? -1 : 0;
}

EXPORT um_cuResult cuInit(unsigned flags)
{
    if (flags)
        return UM_CU_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int r = setup();
    pthread_mutex_unlock(&lock);
    return r ? UM_CU_ERROR_OUT_OF_MEMORY : UM_CU_SUCCESS;
}

EXPORT um_cuResult cuDriverGetVersion(int *v)
{
    *v = 13000;
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuGetErrorName(um_cuResult r, const char **s)
{
    switch (r) {
    case UM_CU_SUCCESS: *s = "CUDA_SUCCESS"; break;
    case UM_CU_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case UM_CU_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case UM_CU_ERROR_NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; break;
    case 201: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    default: *s = NULL; return UM_CU_ERROR_INVALID_VALUE;
    }
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuGetErrorString(um_cuResult r, const char **s)
{
    const char *name;
    if (cuGetErrorName(r, &name) != UM_CU_SUCCESS) {
        *s = NULL;
        return UM_CU_ERROR_INVALID_VALUE;
    }
    *s = r == UM_CU_ERROR_OUT_OF_MEMORY ? "out of memory (fake driver)" : "fake driver";
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuDeviceGetCount(int *n)
{
    *n = gpus;
    return UM_CU_SUCCESS;
}

static int valid_gpu(int d)
{
    return d >= 0 && d < gpus;
}

EXPORT um_cuResult cuDeviceGet(um_cuDevice *d, int ordinal)
{
    if (!valid_gpu(ordinal))
        return UM_CU_ERROR_INVALID_VALUE;
    *d = ordinal;
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuDeviceGetName(char *name, int len, um_cuDevice d)
{
    snprintf(name, (size_t)len, "Fake GPU %d", d);
    return valid_gpu(d) ? UM_CU_SUCCESS : UM_CU_ERROR_INVALID_VALUE;
}

EXPORT um_cuResult cuDeviceTotalMem_v2(size_t *bytes, um_cuDevice d)
{
    *bytes = gpu_mem;
    return valid_gpu(d) ? UM_CU_SUCCESS : UM_CU_ERROR_INVALID_VALUE;
}

EXPORT um_cuResult cuDeviceGetAttribute(int *v, int attr, um_cuDevice d)
{
    if (!valid_gpu(d))
        return UM_CU_ERROR_INVALID_VALUE;
    switch (attr) {
    case UM_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case UM_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case UM_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    case UM_CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *v = 1980000; break;
    case UM_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *v = 1; break;
    case UM_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *v = vmm; break;
    case UM_CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *v = vmm; break;
    case UM_CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: *v = 0; break;
    default: return UM_CU_ERROR_INVALID_VALUE;
    }
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuDeviceGetPCIBusId(char *id, int len, um_cuDevice d)
{
    snprintf(id, (size_t)len, "0000:%02x:00.0", d + 0x10);
    return valid_gpu(d) ? UM_CU_SUCCESS : UM_CU_ERROR_INVALID_VALUE;
}

EXPORT um_cuResult cuDeviceGetP2PAttribute(int *v, int attr, um_cuDevice a, um_cuDevice b)
{
    if (!valid_gpu(a) || !valid_gpu(b))
        return UM_CU_ERROR_INVALID_VALUE;
    *v = attr == UM_CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK ? 0 : 1;
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuDevicePrimaryCtxRetain(um_cuContext *c, um_cuDevice d)
{
    if (!valid_gpu(d))
        return UM_CU_ERROR_INVALID_VALUE;
    *c = (um_cuContext)&ctx_tokens[d];
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuDevicePrimaryCtxRelease_v2(um_cuDevice d)
{
    return valid_gpu(d) ? UM_CU_SUCCESS : UM_CU_ERROR_INVALID_VALUE;
}

EXPORT um_cuResult cuCtxGetCurrent(um_cuContext *c)
{
    FORCED("cuCtxGetCurrent");
    *c = current;
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuCtxSetCurrent(um_cuContext c)
{
    FORCED("cuCtxSetCurrent");
    current = c;
    return UM_CU_SUCCESS;
}

static int current_gpu(void)
{
    return current ? (int)((char *)current - ctx_tokens) : -1;
}

EXPORT um_cuResult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    FORCED("cuMemGetInfo");
    int g = current_gpu();
    if (g < 0)
        return UM_CU_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    *total = gpu_mem;
    *free_bytes = gpu_mem - used[g];
    pthread_mutex_unlock(&lock);
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuMemGetAllocationGranularity(size_t *g, const um_cuMemAllocationProp *prop,
                                                 int option)
{
    (void)option;
    if (!vmm || prop->type != UM_CU_MEM_ALLOCATION_TYPE_PINNED)
        return UM_CU_ERROR_NOT_SUPPORTED;
    *g = PAGE;
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuMemAddressReserve(um_cuDeviceptr *p, size_t size, size_t align,
                                       um_cuDeviceptr addr, unsigned long long flags)
{
    FORCED("cuMemAddressReserve");
    if (!size || size % PAGE || (align && align % PAGE) || addr || flags)
        return UM_CU_ERROR_INVALID_VALUE;
    void *m = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return UM_CU_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    if (nres == MAX_RES) {
        pthread_mutex_unlock(&lock);
        munmap(m, size);
        return UM_CU_ERROR_OUT_OF_MEMORY;
    }
    res[nres++] = (mapping){(uintptr_t)m, size, NULL, NULL};
    pthread_mutex_unlock(&lock);
    *p = (um_cuDeviceptr)(uintptr_t)m;
    return UM_CU_SUCCESS;
}

static int overlaps_mapping(uintptr_t va, size_t size);

EXPORT um_cuResult cuMemAddressFree(um_cuDeviceptr p, size_t size)
{
    FORCED("cuMemAddressFree");
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nres; i++) {
        if (res[i].va == (uintptr_t)p && res[i].size == size) {
            /* A mapping must be unmapped first. */
            if (overlaps_mapping((uintptr_t)p, size))
                break;
            res[i] = res[--nres];
            pthread_mutex_unlock(&lock);
            munmap((void *)(uintptr_t)p, size);
            return UM_CU_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return UM_CU_ERROR_INVALID_VALUE;
}

EXPORT um_cuResult cuMemCreate(um_cuMemHandle *h, size_t size,
                               const um_cuMemAllocationProp *prop, unsigned long long flags)
{
    FORCED("cuMemCreate");
    if (!vmm || flags || !size || size % PAGE)
        return UM_CU_ERROR_INVALID_VALUE;
    if (injected(F_CREATE))
        return UM_CU_ERROR_OUT_OF_MEMORY;
    int gpu = prop->location.type == UM_CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : -1;
    if (prop->location.type == UM_CU_MEM_LOCATION_TYPE_DEVICE && !valid_gpu(gpu))
        return UM_CU_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (gpu >= 0 && used[gpu] + size > gpu_mem) {
        pthread_mutex_unlock(&lock);
        return UM_CU_ERROR_OUT_OF_MEMORY;
    }
    chunk *c = malloc(sizeof *c);
    if (!c || ftruncate(fd, (off_t)(fd_end + size)) != 0) {
        pthread_mutex_unlock(&lock);
        free(c);
        return UM_CU_ERROR_OUT_OF_MEMORY;
    }
    *c = (chunk){fd_end, size, gpu, 0, 0};
    fd_end += size;
    live_chunks++;
    if (gpu >= 0)
        used[gpu] += size;
    pthread_mutex_unlock(&lock);
    *h = (um_cuMemHandle)(uintptr_t)c;
    return UM_CU_SUCCESS;
}

/* Gives chunk c's memory back (under the lock). */
static void chunk_free(chunk *c)
{
    if (c->gpu >= 0)
        used[c->gpu] -= c->size;
    (void)fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)c->off,
                    (off_t)c->size);
    live_chunks--;
    free(c);
}

EXPORT um_cuResult cuMemRelease(um_cuMemHandle h)
{
    chunk *c = (chunk *)(uintptr_t)h;
    FORCED("cuMemRelease");
    if (!c || c->released)
        return UM_CU_ERROR_INVALID_VALUE;
    if (injected(F_RELEASE))
        return UM_CU_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    /* Like CUDA: a mapped chunk's memory stays until its last unmap. */
    if (c->maps)
        c->released = 1;
    else
        chunk_free(c);
    pthread_mutex_unlock(&lock);
    return UM_CU_SUCCESS;
}

static int in_reservation(uintptr_t va, size_t size)
{
    for (size_t i = 0; i < nres; i++)
        if (va >= res[i].va && va + size <= res[i].va + res[i].size)
            return 1;
    return 0;
}

static int overlaps_mapping(uintptr_t va, size_t size)
{
    for (size_t i = 0; i < nmaps; i++)
        if (va < maps[i].va + maps[i].size && maps[i].va < va + size)
            return 1;
    return 0;
}

EXPORT um_cuResult cuMemMap(um_cuDeviceptr p, size_t size, size_t offset, um_cuMemHandle h,
                            unsigned long long flags)
{
    chunk *c = (chunk *)(uintptr_t)h;
    uintptr_t va = (uintptr_t)p;
    FORCED("cuMemMap");
    if (!c || c->released || flags || offset + size > c->size || size % PAGE || va % PAGE ||
        injected(F_MAP))
        return UM_CU_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (!in_reservation(va, size) || overlaps_mapping(va, size) || nmaps == MAX_MAPS) {
        pthread_mutex_unlock(&lock);
        return UM_CU_ERROR_INVALID_VALUE;
    }
    /* Opaque: the device address stays PROT_NONE (the reservation's) and
     * the memory is mapped elsewhere, for the driver's copies only. */
    char *shadow = NULL;
    void *m;
    if (opaque && c->gpu >= 0) {
        m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)(c->off + offset));
        shadow = m;
    } else {
        m = mmap((void *)va, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                 (off_t)(c->off + offset));
    }
    if (m == MAP_FAILED) {
        pthread_mutex_unlock(&lock);
        return UM_CU_ERROR_OUT_OF_MEMORY;
    }
    maps[nmaps++] = (mapping){va, size, shadow, c};
    c->maps++;
    pthread_mutex_unlock(&lock);
    return UM_CU_SUCCESS;
}

/* Like CUDA: the range must consist of whole mappings. */
EXPORT um_cuResult cuMemUnmap(um_cuDeviceptr p, size_t size)
{
    uintptr_t va = (uintptr_t)p;
    FORCED("cuMemUnmap");
    if (injected(F_UNMAP))
        return UM_CU_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    size_t covered = 0;
    for (size_t i = 0; i < nmaps; i++) {
        if (maps[i].va < va + size && va < maps[i].va + maps[i].size) {
            if (maps[i].va < va || maps[i].va + maps[i].size > va + size) {
                pthread_mutex_unlock(&lock);
                return UM_CU_ERROR_INVALID_VALUE;
            }
            covered += maps[i].size;
        }
    }
    if (covered != size) {
        pthread_mutex_unlock(&lock);
        return UM_CU_ERROR_INVALID_VALUE;
    }
    for (size_t i = 0; i < nmaps;) {
        if (maps[i].va >= va && maps[i].va < va + size) {
            if (maps[i].shadow)
                munmap(maps[i].shadow, maps[i].size);
            chunk *c = maps[i].c;
            if (--c->maps == 0 && c->released)
                chunk_free(c);
            maps[i] = maps[--nmaps];
        } else {
            i++;
        }
    }
    mmap((void *)va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
         -1, 0);
    pthread_mutex_unlock(&lock);
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuMemSetAccess(um_cuDeviceptr p, size_t size, const um_cuMemAccessDesc *desc,
                                  size_t count)
{
    uintptr_t va = (uintptr_t)p;
    FORCED("cuMemSetAccess");
    if (!count || !desc || injected(F_ACCESS))
        return UM_CU_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    size_t covered = 0;
    for (size_t i = 0; i < nmaps; i++)
        if (maps[i].va >= va && maps[i].va + maps[i].size <= va + size)
            covered += maps[i].size;
    pthread_mutex_unlock(&lock);
    return covered == size ? UM_CU_SUCCESS : UM_CU_ERROR_INVALID_VALUE;
}

/* cuMemAlloc segments: a size header in front, so cuMemFree knows it. */
EXPORT um_cuResult cuMemAlloc_v2(um_cuDeviceptr *p, size_t size)
{
    FORCED("cuMemAlloc");
    int g = current_gpu();
    if (g < 0 || !size)
        return UM_CU_ERROR_INVALID_VALUE;
    size_t rounded = (size + PAGE - 1) / PAGE * PAGE;
    pthread_mutex_lock(&lock);
    if (used[g] + rounded > gpu_mem) {
        pthread_mutex_unlock(&lock);
        return UM_CU_ERROR_OUT_OF_MEMORY;
    }
    used[g] += rounded;
    pthread_mutex_unlock(&lock);
    char *m = mmap(NULL, rounded + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return UM_CU_ERROR_OUT_OF_MEMORY;
    ((size_t *)m)[0] = rounded;
    ((size_t *)m)[1] = (size_t)g;
    *p = (um_cuDeviceptr)(uintptr_t)(m + PAGE);
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuMemFree_v2(um_cuDeviceptr p)
{
    FORCED("cuMemFree");
    char *m = (char *)(uintptr_t)p - PAGE;
    size_t rounded = ((size_t *)m)[0], g = ((size_t *)m)[1];
    pthread_mutex_lock(&lock);
    used[g] -= rounded;
    pthread_mutex_unlock(&lock);
    munmap(m, rounded + PAGE);
    return UM_CU_SUCCESS;
}

/* Where the host reaches the byte at address p: p itself, or in opaque
 * mode the second mapping of the GPU mapping p is in. *run gets the bytes
 * from p on that stay in the same mapping (SIZE_MAX outside any). */
static char *host_addr(uintptr_t p, size_t *run)
{
    *run = SIZE_MAX;
    if (!opaque)
        return (char *)p;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nmaps; i++) {
        if (maps[i].shadow && p >= maps[i].va && p < maps[i].va + maps[i].size) {
            char *h = maps[i].shadow + (p - maps[i].va);
            *run = maps[i].va + maps[i].size - p;
            pthread_mutex_unlock(&lock);
            return h;
        }
    }
    pthread_mutex_unlock(&lock);
    return (char *)p;
}

/* memmove and memset through host_addr, a mapping at a time (a block of
 * several pages has one mapping per page, and their second mappings are
 * not contiguous). */
static void copy_bytes(uintptr_t dst, uintptr_t src, size_t n)
{
    while (n) {
        size_t rd, rs;
        char *d = host_addr(dst, &rd), *s = host_addr(src, &rs);
        size_t k = n < rd ? n : rd;
        k = k < rs ? k : rs;
        memmove(d, s, k);
        dst += k;
        src += k;
        n -= k;
    }
}

static void set_bytes(uintptr_t dst, unsigned char v, size_t n)
{
    while (n) {
        size_t rd;
        char *d = host_addr(dst, &rd);
        size_t k = n < rd ? n : rd;
        memset(d, v, k);
        dst += k;
        n -= k;
    }
}

EXPORT um_cuResult cuMemcpy(um_cuDeviceptr dst, um_cuDeviceptr src, size_t n)
{
    FORCED("cuMemcpy");
    copy_bytes((uintptr_t)dst, (uintptr_t)src, n);
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuMemcpyAsync(um_cuDeviceptr dst, um_cuDeviceptr src, size_t n, um_cuStream s)
{
    (void)s;
    FORCED("cuMemcpyAsync");
    copy_bytes((uintptr_t)dst, (uintptr_t)src, n);
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuMemsetD8Async(um_cuDeviceptr dst, unsigned char v, size_t n, um_cuStream s)
{
    (void)s;
    FORCED("cuMemsetD8Async");
    set_bytes((uintptr_t)dst, v, n);
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuStreamCreate(um_cuStream *s, unsigned flags)
{
    (void)flags;
    FORCED("cuStreamCreate");
    *s = malloc(1);
    if (!*s)
        return UM_CU_ERROR_OUT_OF_MEMORY;
    live_streams++;
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuStreamDestroy_v2(um_cuStream s)
{
    FORCED("cuStreamDestroy");
    if (!s)
        return UM_CU_ERROR_INVALID_VALUE;
    free(s);
    live_streams--;
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuStreamSynchronize(um_cuStream s)
{
    (void)s;
    FORCED("cuStreamSynchronize");
    return current ? UM_CU_SUCCESS : UM_CU_ERROR_INVALID_VALUE;
}

EXPORT um_cuResult cuStreamWaitEvent(um_cuStream s, um_cuEvent e, unsigned flags)
{
    (void)s;
    (void)e;
    (void)flags;
    FORCED("cuStreamWaitEvent");
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuEventCreate(um_cuEvent *e, unsigned flags)
{
    (void)flags;
    FORCED("cuEventCreate");
    *e = malloc(1);
    if (!*e)
        return UM_CU_ERROR_OUT_OF_MEMORY;
    live_events++;
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuEventDestroy_v2(um_cuEvent e)
{
    FORCED("cuEventDestroy");
    if (!e)
        return UM_CU_ERROR_INVALID_VALUE;
    free(e);
    live_events--;
    return UM_CU_SUCCESS;
}

EXPORT um_cuResult cuEventRecord(um_cuEvent e, um_cuStream s)
{
    (void)s;
    FORCED("cuEventRecord");
    if (injected(F_RECORD))
        return UM_CU_ERROR_INVALID_VALUE;
    return e && current ? UM_CU_SUCCESS : UM_CU_ERROR_INVALID_VALUE;
}

EXPORT um_cuResult cuEventQuery(um_cuEvent e)
{
    FORCED("cuEventQuery");
    return e ? UM_CU_SUCCESS : UM_CU_ERROR_INVALID_VALUE;
}

EXPORT um_cuResult cuEventSynchronize(um_cuEvent e)
{
    FORCED("cuEventSynchronize");
    return e ? UM_CU_SUCCESS : UM_CU_ERROR_INVALID_VALUE;
}

EXPORT um_cuResult cuModuleLoadData(um_cuModule *m, const void *image)
{
    (void)image;
    *m = NULL;
    return UM_CU_ERROR_NOT_SUPPORTED;
}

EXPORT um_cuResult cuModuleUnload(um_cuModule m)
{
    (void)m;
    return UM_CU_ERROR_INVALID_VALUE;
}

EXPORT um_cuResult cuModuleGetFunction(um_cuFunction *f, um_cuModule m, const char *name)
{
    (void)m;
    (void)name;
    *f = NULL;
    return UM_CU_ERROR_NOT_SUPPORTED;
}

EXPORT um_cuResult cuLaunchKernel(um_cuFunction f, unsigned gx, unsigned gy, unsigned gz,
                                  unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                  um_cuStream s, void **params, void **extra)
{
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared;
    (void)s, (void)params, (void)extra;
    return UM_CU_ERROR_NOT_SUPPORTED;
}

/* How many of `what` are live: "mappings", "chunks", "streams", "events"
 * or "reservations"; -1 for another word. */
EXPORT long fake_cuda_live(const char *what)
{
    long n = -1;
    pthread_mutex_lock(&lock);
    if (strcmp(what, "mappings") == 0)
        n = (long)nmaps;
    else if (strcmp(what, "chunks") == 0)
        n = (long)live_chunks;
    else if (strcmp(what, "reservations") == 0)
        n = (long)nres;
    else if (strcmp(what, "streams") == 0)
        n = atomic_load(&live_streams);
    else if (strcmp(what, "events") == 0)
        n = atomic_load(&live_events);
    pthread_mutex_unlock(&lock);
    return n;
}
