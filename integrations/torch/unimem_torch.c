/*
 * unimem as PyTorch's CUDA allocator (see unimem_torch.h).
 *
 * Contexts. Unless UNIMEM_CONF names devices itself, each torch device
 * cuda:N gets a unimem context of its own ("devices=cuda:N" plus the rest
 * of UNIMEM_CONF), opened at its first allocation (or memory fraction):
 * opening a CUDA device retains its primary context, hundreds of MiB of GPU
 * memory, so a process that uses one GPU (a DDP rank) must not open the
 * others, as PyTorch itself creates contexts only on the devices used.
 * Where UNIMEM_CONF names devices, one context holds them all, as asked.
 * Contexts are never shut down once they serve tensors: PyTorch frees
 * tensors during interpreter teardown, after any exit hook we could
 * register, so they must outlive them.
 */
#include "unimem_torch.h"
#include "base/addrmap.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define UMT_EXPORT __attribute__((visibility("default")))

/* Torch device ordinals we map; larger ordinals are refused with a message. */
#define UMT_MAX_ORDINALS 64
/* Streams a thread remembers without taking the table lock. Four covers a
 * training loop's compute stream plus a few side streams (copies, NCCL). */
#define UMT_RECENT_STREAMS 4
#define UMT_MESSAGE_LEN 1024

/* The CUDA driver's CUDA_ERROR_DEINITIALIZED: the driver is shutting down
 * (the process is exiting). */
#define UMT_CUDA_ERROR_DEINITIALIZED 4

/* Throws the exception PyTorch turns into torch.OutOfMemoryError (or
 * RuntimeError); defined by unimem_torch_oom.cpp when the library is built
 * against PyTorch's headers, absent (NULL) otherwise. A CUDAPluggableAllocator
 * that returns NULL makes PyTorch hand out a tensor with no memory, so an
 * exception is the only safe way to fail. */
extern void unimem_torch_throw(int out_of_memory, const char *message)
    __attribute__((weak, visibility("hidden")));

/* ----------------------------------------------------------- errors */

/* Per thread, as um_last_error: a caller reads the message of its own
 * failure, never one another thread wrote in between. */
static _Thread_local char last_error[UMT_MESSAGE_LEN];
static atomic_uint printed_kinds;

static void record_error(const char *message)
{
    size_t n = strnlen(message, sizeof last_error - 1);
    memcpy(last_error, message, n);
    last_error[n] = '\0';
}

/* Records a failure and prints it the first time a status of its kind
 * occurs, so a program that keeps hitting the memory limit does not flood
 * stderr while the first message still explains it. */
static void report_once(um_status st, const char *message)
{
    record_error(message);
    unsigned bit = 1u << ((unsigned)st & 31u);
    if (!(atomic_fetch_or(&printed_kinds, bit) & bit))
        fprintf(stderr, "%s\n", message);
}

/* ------------------------------------------------------------- contexts */

/* What serves one torch ordinal: a context and the unimem device in it. */
typedef struct ordinal_slot {
    /* Published (release) once the context is open; NULL before. */
    _Atomic(um_context *) ctx;
    int dev;
    /* The um_status of a failed open, 0 while none; `error` says why. A
     * failure is kept: retrying um_init at every allocation would print
     * and cost the same failure again. */
    atomic_int failure;
    char error[UMT_MESSAGE_LEN];
} ordinal_slot;

static ordinal_slot ordinals[UMT_MAX_ORDINALS];
/* Serializes opening contexts (rare); lookups of open ones take no lock. */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;

static pthread_once_t mode_once = PTHREAD_ONCE_INIT;
/* true: one context per ordinal, opened lazily; false: UNIMEM_CONF names
 * the devices and `shared_context` holds them all. */
static bool per_ordinal;
static um_context *shared_context;

/* True when a "key=value,..." string sets option `name`. A device list
 * holds commas itself ("sim:4G,sim:2G"), but its pieces have no '=', so
 * only a token with a key can name an option. */
static bool conf_names(const char *conf, const char *name)
{
    if (!conf)
        return false;
    size_t name_len = strlen(name);
    const char *p = conf;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        const char *key = p;
        while (*p && *p != '=' && *p != ',')
            p++;
        const char *key_end = p;
        while (key_end > key && (key_end[-1] == ' ' || key_end[-1] == '\t'))
            key_end--;
        if (*p == '=' && (size_t)(key_end - key) == name_len && strncmp(key, name, name_len) == 0)
            return true;
        while (*p && *p != ',')
            p++;
    }
    return false;
}

/* The driver's own reason for a context with no CUDA device, into buf. */
static void describe_driver(char *buf, size_t len)
{
    int version = 0, gpus = 0;
    if (um_cuda_driver_info(&version, &gpus, buf, len) == UM_OK)
        snprintf(buf, len, "the CUDA driver %d reports %d GPU%s", version, gpus,
                 gpus == 1 ? "" : "s");
}

static void fail_slot(ordinal_slot *slot, um_status st, const char *message)
{
    snprintf(slot->error, sizeof slot->error, "%s", message);
    atomic_store_explicit(&slot->failure, (int)st, memory_order_release);
}

/* The host memory option added to UNIMEM_CONF: PyTorch never asks unimem
 * for host memory, and pinning it would retain a GPU's CUDA context for the
 * host pool, so it is pageable unless UNIMEM_CONF chooses. */
static const char *host_memory_conf(const char *env)
{
    return conf_names(env, "host_memory") ? "" : "host_memory=pageable";
}

/* UNIMEM_CONF names the devices: one context for all of them, and every
 * ordinal it has a CUDA device for is mapped at once. */
static void open_shared_context(const char *env)
{
    char why[UMT_MESSAGE_LEN];
    um_context *ctx = NULL;
    const char *host = host_memory_conf(env);
    um_status st = um_init(*host ? host : NULL, &ctx);
    if (st != UM_OK) {
        snprintf(why, sizeof why, "unimem_torch: um_init with UNIMEM_CONF=\"%s\" failed: %s", env,
                 um_last_error());
        for (int i = 0; i < UMT_MAX_ORDINALS; i++)
            fail_slot(&ordinals[i], st, why);
        return;
    }
    int n = um_device_count(ctx), mapped = 0;
    for (int dev = 0; dev < n; dev++) {
        um_device_info info;
        if (um_device_info_get(ctx, dev, &info) != UM_OK || info.kind != UM_DEVICE_CUDA ||
            info.ordinal < 0 || info.ordinal >= UMT_MAX_ORDINALS)
            continue;
        ordinals[info.ordinal].dev = dev;
        atomic_store_explicit(&ordinals[info.ordinal].ctx, ctx, memory_order_release);
        mapped++;
    }
    if (mapped == 0) {
        char driver[256];
        describe_driver(driver, sizeof driver);
        snprintf(why, sizeof why,
                 "unimem_torch: the unimem context of UNIMEM_CONF=\"%s\" has no CUDA device: %s",
                 env, driver);
        um_shutdown(ctx);
        for (int i = 0; i < UMT_MAX_ORDINALS; i++)
            fail_slot(&ordinals[i], UM_ERR_NO_DEVICE, why);
        return;
    }
    shared_context = ctx;
    for (int i = 0; i < UMT_MAX_ORDINALS; i++) {
        if (!atomic_load_explicit(&ordinals[i].ctx, memory_order_relaxed)) {
            snprintf(why, sizeof why,
                     "unimem_torch: torch device cuda:%d is not among the devices of "
                     "UNIMEM_CONF=\"%s\"",
                     i, env);
            fail_slot(&ordinals[i], UM_ERR_NO_DEVICE, why);
        }
    }
}

static void choose_mode(void)
{
    const char *env = getenv("UNIMEM_CONF");
    per_ordinal = !conf_names(env, "devices");
    if (!per_ordinal)
        open_shared_context(env);
}

/* Opens the context of one ordinal (per-ordinal mode), under open_lock. */
static void open_ordinal_context(int ordinal, ordinal_slot *slot)
{
    char conf[64], why[UMT_MESSAGE_LEN];
    const char *env = getenv("UNIMEM_CONF");
    const char *host = host_memory_conf(env);
    snprintf(conf, sizeof conf, "devices=cuda:%d%s%s", ordinal, *host ? "," : "", host);
    um_context *ctx = NULL;
    um_status st = um_init(conf, &ctx);
    if (st != UM_OK) {
        snprintf(why, sizeof why,
                 "unimem_torch: cannot open torch device cuda:%d: um_init(\"%s\") with "
                 "UNIMEM_CONF=\"%s\" failed: %s",
                 ordinal, conf, env ? env : "", um_last_error());
        fail_slot(slot, st, why);
        return;
    }
    int n = um_device_count(ctx);
    for (int dev = 0; dev < n; dev++) {
        um_device_info info;
        if (um_device_info_get(ctx, dev, &info) == UM_OK && info.kind == UM_DEVICE_CUDA &&
            info.ordinal == ordinal) {
            slot->dev = dev;
            atomic_store_explicit(&slot->ctx, ctx, memory_order_release);
            return;
        }
    }
    char driver[256];
    describe_driver(driver, sizeof driver);
    snprintf(why, sizeof why,
             "unimem_torch: um_init(\"%s\") made no CUDA device for torch device cuda:%d: %s", conf,
             ordinal, driver);
    um_shutdown(ctx);
    fail_slot(slot, UM_ERR_NO_DEVICE, why);
}

static um_context *slot_context(ordinal_slot *slot)
{
    return atomic_load_explicit(&slot->ctx, memory_order_acquire);
}

/* The slot of an ordinal whose context is open, or NULL (none opened yet,
 * a failed open, or an ordinal out of range). Opens nothing. */
static ordinal_slot *opened_slot(int ordinal)
{
    pthread_once(&mode_once, choose_mode);
    if (ordinal < 0 || ordinal >= UMT_MAX_ORDINALS)
        return NULL;
    ordinal_slot *slot = &ordinals[ordinal];
    return atomic_load_explicit(&slot->ctx, memory_order_acquire) ? slot : NULL;
}

/* The slot of an ordinal, its context opened first where it is not yet.
 * NULL on failure, with why (the status in *st). */
static ordinal_slot *open_slot(int ordinal, um_status *st, char *why, size_t why_len)
{
    ordinal_slot *slot = opened_slot(ordinal);
    if (slot)
        return slot;
    if (ordinal < 0 || ordinal >= UMT_MAX_ORDINALS) {
        *st = UM_ERR_NO_DEVICE;
        snprintf(why, why_len,
                 "unimem_torch: torch device cuda:%d is out of range (unimem_torch maps CUDA "
                 "ordinals 0..%d)",
                 ordinal, UMT_MAX_ORDINALS - 1);
        return NULL;
    }
    slot = &ordinals[ordinal];
    if (per_ordinal && !atomic_load_explicit(&slot->failure, memory_order_acquire)) {
        pthread_mutex_lock(&open_lock);
        if (!atomic_load_explicit(&slot->ctx, memory_order_acquire) &&
            !atomic_load_explicit(&slot->failure, memory_order_acquire))
            open_ordinal_context(ordinal, slot);
        pthread_mutex_unlock(&open_lock);
        if (atomic_load_explicit(&slot->ctx, memory_order_acquire))
            return slot;
    }
    *st = (um_status)atomic_load_explicit(&slot->failure, memory_order_acquire);
    snprintf(why, why_len, "%s", slot->error);
    return NULL;
}

/* For the statistics calls on an ordinal whose context is not open: UM_OK
 * when the ordinal names a GPU the driver has (it simply has served
 * nothing yet), else the failure, recorded. Opens nothing. */
static um_status check_unopened_ordinal(int ordinal)
{
    char why[UMT_MESSAGE_LEN];
    if (ordinal >= 0 && ordinal < UMT_MAX_ORDINALS) {
        ordinal_slot *slot = &ordinals[ordinal];
        int failure = atomic_load_explicit(&slot->failure, memory_order_acquire);
        if (failure) {
            record_error(slot->error);
            return (um_status)failure;
        }
        if (per_ordinal) {
            int version = 0, gpus = 0;
            char driver[256] = "";
            if (um_cuda_driver_info(&version, &gpus, driver, sizeof driver) == UM_OK &&
                ordinal < gpus)
                return UM_OK;
            if (!driver[0])
                snprintf(driver, sizeof driver, "the CUDA driver reports %d GPU%s", gpus,
                         gpus == 1 ? "" : "s");
            snprintf(why, sizeof why, "unimem_torch: torch device cuda:%d does not exist: %s",
                     ordinal, driver);
            record_error(why);
            return UM_ERR_NO_DEVICE;
        }
    }
    snprintf(why, sizeof why, "unimem_torch: torch device cuda:%d has no unimem device", ordinal);
    record_error(why);
    return UM_ERR_NO_DEVICE;
}

/* ---------------------------------------------------------- driver queries */

/* A few CUDA driver calls that unimem's API does not offer: the device of a
 * native stream, and whether the driver is shutting down. They come from
 * the libcuda.so.1 that unimem has loaded (RTLD_NOLOAD: this never loads a
 * driver), so they are looked up only once a context is open. Each may be
 * missing (an older driver, or the tests' stand-in driver); the callers
 * then fall back as they say. */
typedef int (*cu_ctx_get_current_fn)(void **ctx);
typedef int (*cu_stream_get_device_fn)(void *stream, int *device);
typedef int (*cu_stream_get_ctx_fn)(void *stream, void **ctx);
typedef int (*cu_ctx_push_current_fn)(void *ctx);
typedef int (*cu_ctx_pop_current_fn)(void **ctx);
typedef int (*cu_ctx_get_device_fn)(int *device);

static struct {
    cu_ctx_get_current_fn ctx_get_current;
    cu_stream_get_device_fn stream_get_device; /* CUDA 12.8 and later */
    cu_stream_get_ctx_fn stream_get_ctx;
    cu_ctx_push_current_fn ctx_push_current;
    cu_ctx_pop_current_fn ctx_pop_current;
    cu_ctx_get_device_fn ctx_get_device;
} driver;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;

static void resolve_driver_calls(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!lib)
        return;
    *(void **)&driver.ctx_get_current = dlsym(lib, "cuCtxGetCurrent");
    *(void **)&driver.stream_get_device = dlsym(lib, "cuStreamGetDevice");
    *(void **)&driver.stream_get_ctx = dlsym(lib, "cuStreamGetCtx");
    *(void **)&driver.ctx_push_current = dlsym(lib, "cuCtxPushCurrent_v2");
    *(void **)&driver.ctx_pop_current = dlsym(lib, "cuCtxPopCurrent_v2");
    *(void **)&driver.ctx_get_device = dlsym(lib, "cuCtxGetDevice");
}

/* The CUDA ordinal of a native stream (a CUdevice is the ordinal
 * cuDeviceGet was given), or -1 when the driver cannot tell. The default
 * stream handles (NULL, CU_STREAM_LEGACY 0x1, CU_STREAM_PER_THREAD 0x2) name
 * no device of their own: the driver would answer with the thread's current
 * device, which PyTorch does not set to the stream's for record_stream
 * (every GPU's default stream is NULL there), so those are -1 too. */
static int native_stream_ordinal(void *stream)
{
    if ((uintptr_t)stream <= 2)
        return -1;
    pthread_once(&driver_once, resolve_driver_calls);
    int device = -1;
    if (driver.stream_get_device && driver.stream_get_device(stream, &device) == 0)
        return device;
    void *owner = NULL, *popped = NULL;
    if (!driver.stream_get_ctx || !driver.ctx_push_current || !driver.ctx_pop_current ||
        !driver.ctx_get_device || driver.stream_get_ctx(stream, &owner) != 0 || !owner ||
        driver.ctx_push_current(owner) != 0)
        return -1;
    if (driver.ctx_get_device(&device) != 0)
        device = -1;
    driver.ctx_pop_current(&popped);
    return device;
}

/* True when the driver says it is shutting down: PyTorch frees tensors
 * from static destructors at exit, after the driver's own teardown, and
 * ignores the failures then (cudaErrorCudartUnloading); so do we. */
static bool driver_shutting_down(void)
{
    pthread_once(&driver_once, resolve_driver_calls);
    void *current = NULL;
    return driver.ctx_get_current &&
           driver.ctx_get_current(&current) == UMT_CUDA_ERROR_DEINITIALIZED;
}

/* ---------------------------------------------------------------- streams */

typedef struct stream_entry {
    um_context *ctx;
    int dev;
    void *native;
    um_stream stream; /* never NULL once filled */
} stream_entry;

static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;
static stream_entry *streams;
static size_t stream_count, stream_capacity;

static _Thread_local stream_entry recent_streams[UMT_RECENT_STREAMS];
static _Thread_local unsigned recent_next;

/* The um_stream wrapping `native` on device dev of ctx: one wrapper per
 * native stream and context for the life of the process (wrapping again
 * would give each allocation its own unimem stream and defeat same-stream
 * reuse). The thread's recent entries answer without a lock; the shared
 * table is only searched on a miss. */
static um_status stream_for(um_context *ctx, int dev, void *native, um_stream *out, char *why,
                            size_t why_len)
{
    for (int i = 0; i < UMT_RECENT_STREAMS; i++) {
        const stream_entry *e = &recent_streams[i];
        if (e->stream && e->native == native && e->dev == dev && e->ctx == ctx) {
            *out = e->stream;
            return UM_OK;
        }
    }
    um_status st = UM_OK;
    um_stream found = NULL;
    pthread_mutex_lock(&streams_lock);
    for (size_t i = 0; i < stream_count; i++) {
        if (streams[i].native == native && streams[i].dev == dev && streams[i].ctx == ctx) {
            found = streams[i].stream;
            break;
        }
    }
    if (!found) {
        if (stream_count == stream_capacity) {
            size_t capacity = stream_capacity ? 2 * stream_capacity : 16;
            stream_entry *grown = realloc(streams, capacity * sizeof *grown);
            if (!grown) {
                st = UM_ERR_NOMEM;
                snprintf(why, why_len,
                         "unimem_torch: no host memory for a stream table of %zu entries",
                         capacity);
            } else {
                streams = grown;
                stream_capacity = capacity;
            }
        }
        if (st == UM_OK) {
            st = um_stream_wrap(ctx, dev, native, &found);
            if (st != UM_OK)
                snprintf(why, why_len,
                         "unimem_torch: um_stream_wrap(device %d, stream %p) failed: %s", dev,
                         native, um_last_error());
            else
                streams[stream_count++] = (stream_entry){ctx, dev, native, found};
        }
    }
    pthread_mutex_unlock(&streams_lock);
    if (st != UM_OK)
        return st;
    recent_streams[recent_next++ % UMT_RECENT_STREAMS] = (stream_entry){ctx, dev, native, found};
    *out = found;
    return UM_OK;
}

/* ---------------------------------------------------------------- tracing */

/* UNIMEM_TORCH_TRACE=FILE records every allocation and free in the trace
 * format of `unimem replay` ("a <id> <size> <stream>", "f <id>"), so a real
 * run can be replayed on a simulated device. Ids are unique for the whole
 * run, so a pointer that comes back gets a new one: the library's address
 * map of live pointers (src/base/addrmap.h, whose size follows the live
 * pointers) maps them to ids. Off (one load of a NULL pointer) unless the
 * variable is set. */
static pthread_once_t trace_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *trace_file;
static um__addrmap trace_ids;
static uint64_t trace_next_id;

static void trace_open(void)
{
    const char *path = getenv("UNIMEM_TORCH_TRACE");
    if (!path || !*path)
        return;
    if (!(trace_file = fopen(path, "w"))) {
        fprintf(stderr, "unimem_torch: cannot write the trace %s; not tracing\n", path);
        return;
    }
    fprintf(trace_file, "# unimem_torch trace\n# a <id> <size> <stream> | f <id>\n");
}

static void trace_event(bool alloc, void *ptr, size_t size, void *stream)
{
    pthread_once(&trace_once, trace_open);
    if (!trace_file)
        return;
    pthread_mutex_lock(&trace_lock);
    uint64_t id;
    if (alloc) {
        id = trace_next_id++;
        if (um__addrmap_put(&trace_ids, (uintptr_t)ptr, id))
            fprintf(trace_file, "a %llu %zu %llu\n", (unsigned long long)id, size,
                    (unsigned long long)(uintptr_t)stream);
    } else if (um__addrmap_take(&trace_ids, (uintptr_t)ptr, &id)) {
        fprintf(trace_file, "f %llu\n", (unsigned long long)id);
    }
    pthread_mutex_unlock(&trace_lock);
}

/* -------------------------------------------------------------- allocator */

/* Reports an allocation failure, then throws when PyTorch's exception
 * thrower is linked in (it does not return), else returns NULL. */
static void *fail_allocation(um_status st, const char *message)
{
    report_once(st, message);
    if (unimem_torch_throw)
        unimem_torch_throw(st == UM_ERR_NOMEM, message);
    return NULL;
}

UMT_EXPORT void *unimem_torch_alloc(size_t size, int device, void *stream)
{
    char why[UMT_MESSAGE_LEN];
    um_status st = UM_OK;
    ordinal_slot *slot = open_slot(device, &st, why, sizeof why);
    if (!slot)
        return fail_allocation(st, why);
    um_context *ctx = slot_context(slot);
    um_stream s;
    st = stream_for(ctx, slot->dev, stream, &s, why, sizeof why);
    if (st != UM_OK)
        return fail_allocation(st, why);
    /* unimem refuses 0 bytes; PyTorch keys its bookkeeping by pointer, so an
     * empty tensor still needs a pointer of its own. */
    void *ptr = NULL;
    st = um_malloc(ctx, slot->dev, size ? size : 1, s, &ptr);
    if (st != UM_OK) {
        snprintf(why, sizeof why, "unimem_torch: cannot allocate %zu bytes on cuda:%d: %s", size,
                 device, um_last_error());
        return fail_allocation(st, why);
    }
    trace_event(true, ptr, size ? size : 1, stream);
    return ptr;
}

UMT_EXPORT void unimem_torch_free(void *ptr, size_t size, int device, void *stream)
{
    if (!ptr)
        return;
    char why[UMT_MESSAGE_LEN];
    ordinal_slot *slot = opened_slot(device);
    if (!slot) {
        snprintf(why, sizeof why,
                 "unimem_torch: free of %p (%zu bytes) on cuda:%d, where unimem_torch has "
                 "allocated nothing",
                 ptr, size, device);
        record_error(why);
        fprintf(stderr, "%s\n", why);
        return;
    }
    /* PyTorch passes the stream the block was allocated on, which is what
     * NULL means to um_free; NULL also spares a stream lookup. */
    trace_event(false, ptr, size, stream);
    um_status st = um_free(slot_context(slot), ptr, NULL);
    if (st != UM_OK) {
        snprintf(why, sizeof why, "unimem_torch: free of %p (%zu bytes, cuda:%d) failed: %s", ptr,
                 size, device, um_last_error());
        record_error(why);
        if (!driver_shutting_down())
            fprintf(stderr, "%s\n", why);
    }
}

/* The open ordinal whose context owns ptr as memory of its GPU, or NULL. */
static ordinal_slot *owner_of(const void *ptr)
{
    pthread_once(&mode_once, choose_mode);
    if (!per_ordinal) {
        if (!shared_context)
            return NULL;
        int dev = um_pointer_device(shared_context, ptr);
        for (int i = 0; dev >= 0 && i < UMT_MAX_ORDINALS; i++)
            if (atomic_load_explicit(&ordinals[i].ctx, memory_order_acquire) &&
                ordinals[i].dev == dev)
                return &ordinals[i];
        return NULL;
    }
    for (int i = 0; i < UMT_MAX_ORDINALS; i++) {
        um_context *ctx = atomic_load_explicit(&ordinals[i].ctx, memory_order_acquire);
        if (ctx && um_pointer_device(ctx, ptr) == ordinals[i].dev)
            return &ordinals[i];
    }
    return NULL;
}

UMT_EXPORT int unimem_torch_record_stream(void *ptr, void *stream, int stream_device)
{
    char why[UMT_MESSAGE_LEN];
    /* As PyTorch's own allocator skips DataPtrs it did not allocate, these
     * are skipped, not refused: an empty tensor's NULL, memory of no unimem
     * block (a tensor shared from another process, imported through DLPack
     * or from_blob), and pointers inside a block or to a freed one (a view
     * made with from_blob over a slice). NCCL's collectives record streams
     * on all of them. */
    ordinal_slot *slot = ptr ? owner_of(ptr) : NULL;
    if (!slot)
        return 0;
    int ordinal = (int)(slot - ordinals);
    um_context *ctx = slot_context(slot);
    if (stream_device < 0)
        stream_device = native_stream_ordinal(stream);
    if (stream_device < 0)
        stream_device = ordinal; /* the driver cannot tell: the block's own */
    bool foreign_stream = stream_device != ordinal;
    /* A stream of another GPU cannot order the block in unimem (its
     * context may not even hold that GPU), so it is refused below; but
     * only for a live block's start, since anything else is skipped. The
     * block's device's default stream tells which it is: marking a block
     * with it costs one event at its free that an idle stream completes
     * at once. */
    um_stream s = NULL;
    um_status st = foreign_stream ? UM_OK : stream_for(ctx, slot->dev, stream, &s, why, sizeof why);
    if (st == UM_OK) {
        st = um_record_stream(ctx, ptr, s);
        if (st == UM_ERR_INVALID_POINTER || st == UM_ERR_DOUBLE_FREE)
            return 0; /* not a live block's start: see above */
        if (st != UM_OK)
            snprintf(why, sizeof why,
                     "unimem_torch: record_stream(%p on cuda:%d, stream %p) failed: %s", ptr,
                     ordinal, stream, um_last_error());
    }
    if (st == UM_OK && foreign_stream) {
        st = UM_ERR_WRONG_DEVICE;
        snprintf(why, sizeof why,
                 "unimem_torch: Tensor.record_stream of memory on cuda:%d with a stream of "
                 "cuda:%d is not supported: unimem orders a block only by streams of its own "
                 "GPU (synchronize that stream before freeing the tensor)",
                 ordinal, stream_device);
    }
    if (st != UM_OK)
        report_once(st, why);
    return (int)st;
}

UMT_EXPORT int unimem_torch_begin_graph_capture(int device)
{
    char why[UMT_MESSAGE_LEN];
    snprintf(why, sizeof why,
             "unimem: CUDA graph capture is not supported (cuda:%d): torch.cuda.graph, "
             "make_graphed_callables, torch.compile(mode=\"reduce-overhead\") and "
             "torch.cuda.MemPool need a private memory pool for the graph, which unimem_torch "
             "does not provide, and a replay would write into memory later given to other "
             "tensors. Run graph capture with PyTorch's own allocator (without "
             "unimem_torch.install()).",
             device);
    record_error(why);
    return (int)UM_ERR_UNSUPPORTED;
}

UMT_EXPORT int unimem_torch_can_throw(void)
{
    return unimem_torch_throw != NULL;
}

/* -------------------------------------------------------------- statistics */

static int control_result(um_status st, const char *what, int ordinal)
{
    if (st != UM_OK) {
        char why[UMT_MESSAGE_LEN];
        snprintf(why, sizeof why, "unimem_torch: %s(cuda:%d) failed: %s", what, ordinal,
                 um_last_error());
        record_error(why);
    }
    return (int)st;
}

UMT_EXPORT int unimem_torch_stats(int device, um_stats *out)
{
    if (!out) {
        record_error("unimem_torch_stats: the output pointer is NULL");
        return UM_ERR_INVALID;
    }
    ordinal_slot *slot = opened_slot(device);
    if (!slot) {
        /* A GPU that has served nothing: zeros, as PyTorch reports for a
         * device it has not allocated on, without opening its context. */
        um_status st = check_unopened_ordinal(device);
        if (st == UM_OK)
            *out = (um_stats){.version = UM_STATS_VERSION};
        return (int)st;
    }
    return control_result(um_stats_get(slot_context(slot), slot->dev, out), "um_stats_get", device);
}

UMT_EXPORT int unimem_torch_reset_peak(int device)
{
    ordinal_slot *slot = opened_slot(device);
    if (!slot)
        return (int)check_unopened_ordinal(device);
    return control_result(um_reset_peak(slot_context(slot), slot->dev), "um_reset_peak", device);
}

UMT_EXPORT int unimem_torch_trim(int device)
{
    ordinal_slot *slot = opened_slot(device);
    if (!slot)
        return (int)check_unopened_ordinal(device);
    return control_result(um_trim(slot_context(slot), slot->dev), "um_trim", device);
}

UMT_EXPORT int unimem_torch_empty_cache(void)
{
    int first_failure = 0;
    for (int ordinal = 0; ordinal < UMT_MAX_ORDINALS; ordinal++) {
        int rc = opened_slot(ordinal) ? unimem_torch_trim(ordinal) : 0;
        if (!first_failure)
            first_failure = rc;
    }
    return first_failure;
}

UMT_EXPORT int unimem_torch_set_memory_fraction(double fraction, int device)
{
    char why[UMT_MESSAGE_LEN];
    if (!(fraction >= 0.0 && fraction <= 1.0)) {
        snprintf(why, sizeof why, "unimem_torch: memory fraction %g for cuda:%d is not in [0, 1]",
                 fraction, device);
        record_error(why);
        return UM_ERR_INVALID;
    }
    /* PyTorch's own allocator creates the device's context here too (it
     * asks the driver for the device's memory). */
    um_status st = UM_OK;
    ordinal_slot *slot = open_slot(device, &st, why, sizeof why);
    if (!slot) {
        record_error(why);
        return (int)st;
    }
    um_context *ctx = slot_context(slot);
    size_t free_bytes = 0, total = 0;
    st = um_device_memory_get(ctx, slot->dev, &free_bytes, &total);
    if (st != UM_OK)
        return control_result(st, "um_device_memory_get", device);
    /* A limit of 0 means "the device's memory" to um_set_memory_limit; one
     * byte allows no allocation at all, which is what fraction 0 (or one
     * that rounds to no bytes) asks of PyTorch's allocator. */
    size_t limit = (size_t)(fraction * (double)total);
    if (limit == 0)
        limit = 1;
    st = um_set_memory_limit(ctx, slot->dev, limit);
    if (st == UM_ERR_BUSY) {
        /* Cached pages count as reserved: give them back and try again. */
        if (um_trim(ctx, slot->dev) == UM_OK)
            st = um_set_memory_limit(ctx, slot->dev, limit);
    }
    if (st == UM_ERR_BUSY) {
        /* PyTorch's allocator would take the new maximum for later growth;
         * unimem cannot set a limit below what it holds, and silently
         * keeping the old one would let the process use more than asked. */
        um_stats now = {.version = UM_STATS_VERSION};
        um_stats_get(ctx, slot->dev, &now);
        snprintf(why, sizeof why,
                 "unimem_torch: set_per_process_memory_fraction(%g) on cuda:%d asks for a limit "
                 "of %zu byte%s, but unimem still holds %zu bytes reserved under live tensors "
                 "(%zu bytes live) after returning its cache; free tensors first, then set the "
                 "fraction (the previous limit stays)",
                 fraction, device, limit, limit == 1 ? "" : "s", now.reserved_bytes,
                 now.active_bytes);
        record_error(why);
        return (int)st;
    }
    return control_result(st, "set_memory_fraction", device);
}

UMT_EXPORT size_t unimem_torch_stats_size(void)
{
    return sizeof(um_stats);
}

UMT_EXPORT const char *unimem_torch_last_error(void)
{
    return last_error;
}
