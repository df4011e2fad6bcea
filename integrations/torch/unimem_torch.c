/*
 * unimem as PyTorch's CUDA allocator (see unimem_torch.h).
 *
 * One unimem context per process, created on first use and never shut down
 * once it serves tensors: PyTorch frees tensors during interpreter teardown,
 * after any exit hook we could register, so the context must outlive them.
 */
#include "unimem_torch.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
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

/* Throws the exception PyTorch turns into torch.OutOfMemoryError (or
 * RuntimeError); defined by unimem_torch_oom.cpp when the library is built
 * against PyTorch's headers, absent (NULL) otherwise. A CUDAPluggableAllocator
 * that returns NULL makes PyTorch hand out a tensor with no memory, so an
 * exception is the only safe way to fail. */
extern void unimem_torch_throw(int out_of_memory, const char *message)
    __attribute__((weak, visibility("hidden")));

/* ------------------------------------------------------------- context */

static pthread_once_t context_once = PTHREAD_ONCE_INIT;
static um_context *context;
static um_status context_status = UM_OK;
static char context_error[UMT_MESSAGE_LEN];
/* torch ordinal -> unimem device index, -1 where the ordinal has none. */
static int device_of_ordinal[UMT_MAX_ORDINALS];

/* True when a "key=value,..." string sets `devices`. A device list holds
 * commas itself ("sim:4G,sim:2G"), but its pieces have no '=', so only a
 * token with a key can name the option. */
static int conf_names_devices(const char *conf)
{
    if (!conf)
        return 0;
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
        if (*p == '=' && (size_t)(key_end - key) == strlen("devices") &&
            strncmp(key, "devices", strlen("devices")) == 0)
            return 1;
        while (*p && *p != ',')
            p++;
    }
    return 0;
}

static void create_context(void)
{
    for (int i = 0; i < UMT_MAX_ORDINALS; i++)
        device_of_ordinal[i] = -1;
    const char *env = getenv("UNIMEM_CONF");
    const char *conf = conf_names_devices(env) ? NULL : "devices=cuda";
    um_status st = um_init(conf, &context);
    if (st != UM_OK) {
        context_status = st;
        snprintf(context_error, sizeof context_error,
                 "unimem_torch: um_init(%s) with UNIMEM_CONF=\"%s\" failed: %s",
                 conf ? conf : "NULL", env ? env : "", um_last_error());
        context = NULL;
        return;
    }
    int mapped = 0;
    int n = um_device_count(context);
    for (int dev = 0; dev < n; dev++) {
        um_device_info info;
        if (um_device_info_get(context, dev, &info) != UM_OK || info.kind != UM_DEVICE_CUDA)
            continue;
        if (info.ordinal >= 0 && info.ordinal < UMT_MAX_ORDINALS) {
            device_of_ordinal[info.ordinal] = dev;
            mapped++;
        }
    }
    if (mapped == 0) {
        /* "devices=cuda" makes no device when there is no driver, so the
         * driver's own reason is the useful part of the message. */
        char driver[256];
        int version = 0, gpus = 0;
        if (um_cuda_driver_info(&version, &gpus, driver, sizeof driver) == UM_OK)
            snprintf(driver, sizeof driver, "the CUDA driver %d reports %d GPU%s", version, gpus,
                     gpus == 1 ? "" : "s");
        context_status = UM_ERR_NO_DEVICE;
        snprintf(context_error, sizeof context_error,
                 "unimem_torch: the unimem context has no CUDA device (conf \"%s\", "
                 "UNIMEM_CONF=\"%s\"): %s",
                 conf ? conf : "", env ? env : "", driver);
        um_shutdown(context);
        context = NULL;
    }
}

/* The context, or NULL when it could not be created (context_error says why). */
static um_context *get_context(void)
{
    pthread_once(&context_once, create_context);
    return context_status == UM_OK ? context : NULL;
}

/* ----------------------------------------------------------- errors */

static pthread_mutex_t error_lock = PTHREAD_MUTEX_INITIALIZER;
static char last_error[UMT_MESSAGE_LEN];
static _Thread_local char last_error_copy[UMT_MESSAGE_LEN];
static atomic_uint printed_kinds;

static void record_error(const char *message)
{
    size_t n = strnlen(message, sizeof last_error - 1);
    pthread_mutex_lock(&error_lock);
    memcpy(last_error, message, n);
    last_error[n] = '\0';
    pthread_mutex_unlock(&error_lock);
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

/* ---------------------------------------------------------- devices, streams */

/* Sets *dev to the unimem device of a torch ordinal; on failure writes why. */
static um_status device_for_ordinal(int ordinal, int *dev, char *why, size_t why_len)
{
    if (ordinal >= 0 && ordinal < UMT_MAX_ORDINALS && device_of_ordinal[ordinal] >= 0) {
        *dev = device_of_ordinal[ordinal];
        return UM_OK;
    }
    snprintf(why, why_len,
             "unimem_torch: torch device cuda:%d has no unimem device (the context maps "
             "CUDA ordinals 0..%d that the driver reports)",
             ordinal, UMT_MAX_ORDINALS - 1);
    return UM_ERR_NO_DEVICE;
}

typedef struct stream_entry {
    int dev;
    void *native;
    um_stream stream; /* never NULL once filled */
} stream_entry;

static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;
static stream_entry *streams;
static size_t stream_count, stream_capacity;

static _Thread_local stream_entry recent_streams[UMT_RECENT_STREAMS];
static _Thread_local unsigned recent_next;

/* The um_stream wrapping `native` on device dev: one wrapper per native
 * stream for the life of the process (wrapping again would give each
 * allocation its own unimem stream and defeat same-stream reuse). The
 * thread's recent entries answer without a lock; the shared table is only
 * searched on a miss. */
static um_status stream_for(um_context *ctx, int dev, void *native, um_stream *out, char *why,
                            size_t why_len)
{
    for (int i = 0; i < UMT_RECENT_STREAMS; i++) {
        const stream_entry *e = &recent_streams[i];
        if (e->stream && e->native == native && e->dev == dev) {
            *out = e->stream;
            return UM_OK;
        }
    }
    um_status st = UM_OK;
    um_stream found = NULL;
    pthread_mutex_lock(&streams_lock);
    for (size_t i = 0; i < stream_count; i++) {
        if (streams[i].native == native && streams[i].dev == dev) {
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
                snprintf(why, why_len, "unimem_torch: no host memory for a stream table of %zu entries",
                         capacity);
            } else {
                streams = grown;
                stream_capacity = capacity;
            }
        }
        if (st == UM_OK) {
            st = um_stream_wrap(ctx, dev, native, &found);
            if (st != UM_OK)
                snprintf(why, why_len, "unimem_torch: um_stream_wrap(device %d, stream %p) failed: %s",
                         dev, native, um_last_error());
            else
                streams[stream_count++] = (stream_entry){dev, native, found};
        }
    }
    pthread_mutex_unlock(&streams_lock);
    if (st != UM_OK)
        return st;
    recent_streams[recent_next++ % UMT_RECENT_STREAMS] = (stream_entry){dev, native, found};
    *out = found;
    return UM_OK;
}

/* ------------------------------------------------------ allocator */

/* Reports an allocation failure, then throws when PyTorch's exception
 * thrower is linked in (it does not return), else returns NULL. */
/* ------------------------------------------------------------ tracing */

/* UNIMEM_TORCH_TRACE=FILE records every allocation and free in the trace
 * format of `unimem replay` ("a <id> <size> <stream>", "f <id>"), so a real
 * run can be replayed on a simulated device. Ids are unique for the whole
 * run, so a pointer that comes back gets a new one: a small open-addressing
 * table maps live pointers to ids. Off (one load of a NULL pointer) unless
 * the variable is set. */
typedef struct trace_slot {
    uintptr_t ptr; /* 0: empty; 1: deleted */
    uint64_t id;
} trace_slot;

static pthread_once_t trace_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *trace_file;
static trace_slot *trace_table;
static size_t trace_cap, trace_used;
static uint64_t trace_next_id;

static void trace_open(void)
{
    const char *path = getenv("UNIMEM_TORCH_TRACE");
    if (!path || !*path)
        return;
    trace_cap = 1 << 16;
    trace_table = calloc(trace_cap, sizeof *trace_table);
    trace_file = trace_table ? fopen(path, "w") : NULL;
    if (!trace_file) {
        fprintf(stderr, "unimem_torch: cannot write the trace %s; not tracing\n", path);
        free(trace_table);
        trace_table = NULL;
        return;
    }
    fprintf(trace_file, "# unimem_torch trace\n# a <id> <size> <stream> | f <id>\n");
}

static trace_slot *trace_find(uintptr_t ptr, bool for_insert)
{
    size_t i = (size_t)((ptr >> 8) * 0x9e3779b97f4a7c15ull) & (trace_cap - 1);
    trace_slot *tomb = NULL;
    for (;; i = (i + 1) & (trace_cap - 1)) {
        trace_slot *e = &trace_table[i];
        if (e->ptr == ptr)
            return e;
        if (e->ptr == 1 && !tomb)
            tomb = e;
        if (e->ptr == 0)
            return for_insert ? (tomb ? tomb : e) : NULL;
    }
}

/* Keeps the table at most half full (counting deleted entries), so probes
 * stay short and always end at an empty slot. */
static bool trace_grow(void)
{
    if ((trace_used + 1) * 2 <= trace_cap)
        return true;
    trace_slot *old = trace_table;
    size_t old_cap = trace_cap;
    trace_table = calloc(old_cap * 2, sizeof *trace_table);
    if (!trace_table) {
        trace_table = old;
        return false;
    }
    trace_cap = old_cap * 2;
    trace_used = 0;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].ptr > 1) {
            *trace_find(old[i].ptr, true) = old[i];
            trace_used++;
        }
    }
    free(old);
    return true;
}

static void trace_event(bool alloc, void *ptr, size_t size, void *stream)
{
    pthread_once(&trace_once, trace_open);
    if (!trace_file)
        return;
    pthread_mutex_lock(&trace_lock);
    if (alloc && trace_grow()) {
        trace_slot *e = trace_find((uintptr_t)ptr, true);
        if (e->ptr == 0)
            trace_used++;
        e->ptr = (uintptr_t)ptr;
        e->id = trace_next_id++;
        fprintf(trace_file, "a %llu %zu %llu\n", (unsigned long long)e->id, size,
                (unsigned long long)(uintptr_t)stream);
    } else if (!alloc) {
        trace_slot *e = trace_find((uintptr_t)ptr, false);
        if (e) {
            fprintf(trace_file, "f %llu\n", (unsigned long long)e->id);
            e->ptr = 1;
        }
    }
    pthread_mutex_unlock(&trace_lock);
}

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
    um_context *ctx = get_context();
    if (!ctx)
        return fail_allocation(context_status, context_error);
    int dev;
    um_status st = device_for_ordinal(device, &dev, why, sizeof why);
    if (st != UM_OK)
        return fail_allocation(st, why);
    um_stream s;
    st = stream_for(ctx, dev, stream, &s, why, sizeof why);
    if (st != UM_OK)
        return fail_allocation(st, why);
    /* unimem refuses 0 bytes; PyTorch keys its bookkeeping by pointer, so an
     * empty tensor still needs a pointer of its own. */
    void *ptr = NULL;
    st = um_malloc(ctx, dev, size ? size : 1, s, &ptr);
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
    (void)stream;
    if (!ptr)
        return;
    um_context *ctx = get_context();
    if (!ctx) {
        char why[UMT_MESSAGE_LEN];
        snprintf(why, sizeof why, "unimem_torch: free of %p with no unimem context: %s", ptr,
                 context_error);
        record_error(why);
        fprintf(stderr, "%s\n", why);
        return;
    }
    /* PyTorch passes the stream the block was allocated on, which is what
     * NULL means to um_free; NULL also spares a stream lookup. */
    trace_event(false, ptr, size, stream);
    um_status st = um_free(ctx, ptr, NULL);
    if (st != UM_OK) {
        char why[UMT_MESSAGE_LEN];
        snprintf(why, sizeof why, "unimem_torch: free of %p (%zu bytes, cuda:%d) failed: %s", ptr,
                 size, device, um_last_error());
        record_error(why);
        fprintf(stderr, "%s\n", why);
    }
}

/* Marks ptr as used on `stream` too (PyTorch's Tensor.record_stream):
 * unimem then reuses it on no stream until the work queued there before its
 * free is done. */
UMT_EXPORT int unimem_torch_record_stream(void *ptr, void *stream)
{
    char why[UMT_MESSAGE_LEN];
    um_context *ctx = get_context();
    if (!ctx) {
        record_error(context_error);
        return (int)context_status;
    }
    /* As PyTorch's own allocator: an empty tensor's NULL storage, and
     * memory of no block of this allocator (a tensor shared from another
     * process, or imported through DLPack), are skipped, not refused:
     * NCCL's collectives record streams on such tensors. */
    int dev = ptr ? um_pointer_device(ctx, ptr) : -1;
    if (dev < 0)
        return 0;
    um_status st;
    um_stream s = NULL;
    if ((st = stream_for(ctx, dev, stream, &s, why, sizeof why)) == UM_OK &&
             (st = um_record_stream(ctx, ptr, s)) != UM_OK)
        snprintf(why, sizeof why, "unimem_torch: record_stream(%p, stream %p) failed: %s", ptr,
                 stream, um_last_error());
    if (st != UM_OK)
        report_once(st, why);
    return (int)st;
}

/* ------------------------------------------------------- statistics */

/* The unimem device of a torch ordinal for the stats calls, or -1 with the
 * failure recorded and *st set. */
static int control_device(int ordinal, um_status *st)
{
    char why[UMT_MESSAGE_LEN];
    if (!get_context()) {
        *st = context_status;
        record_error(context_error);
        return -1;
    }
    int dev;
    *st = device_for_ordinal(ordinal, &dev, why, sizeof why);
    if (*st != UM_OK) {
        record_error(why);
        return -1;
    }
    return dev;
}

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
    um_status st;
    int dev = control_device(device, &st);
    if (dev < 0)
        return (int)st;
    return control_result(um_stats_get(context, dev, out), "um_stats_get", device);
}

UMT_EXPORT int unimem_torch_reset_peak(int device)
{
    um_status st;
    int dev = control_device(device, &st);
    if (dev < 0)
        return (int)st;
    return control_result(um_reset_peak(context, dev), "um_reset_peak", device);
}

UMT_EXPORT int unimem_torch_trim(int device)
{
    um_status st;
    int dev = control_device(device, &st);
    if (dev < 0)
        return (int)st;
    return control_result(um_trim(context, dev), "um_trim", device);
}

UMT_EXPORT int unimem_torch_empty_cache(void)
{
    if (!get_context()) {
        record_error(context_error);
        return (int)context_status;
    }
    int first_failure = 0;
    for (int ordinal = 0; ordinal < UMT_MAX_ORDINALS; ordinal++) {
        int rc = device_of_ordinal[ordinal] < 0 ? 0 : unimem_torch_trim(ordinal);
        if (!first_failure)
            first_failure = rc;
    }
    return first_failure;
}

UMT_EXPORT int unimem_torch_set_memory_fraction(double fraction, int device)
{
    um_status st;
    int dev = control_device(device, &st);
    if (dev < 0)
        return (int)st;
    if (!(fraction > 0.0 && fraction <= 1.0)) {
        char why[UMT_MESSAGE_LEN];
        snprintf(why, sizeof why,
                 "unimem_torch: memory fraction %g for cuda:%d is not in (0, 1]", fraction,
                 device);
        record_error(why);
        return UM_ERR_INVALID;
    }
    size_t free_bytes = 0, total = 0;
    st = um_device_memory_get(context, dev, &free_bytes, &total);
    /* At least a byte: a limit of 0 means "the device's memory" to
     * um_set_memory_limit, so a tiny fraction rounded to 0 lifted it. */
    size_t limit = (size_t)(fraction * (double)total);
    if (st == UM_OK)
        st = um_set_memory_limit(context, dev, limit ? limit : 1);
    return control_result(st, "set_memory_fraction", device);
}

UMT_EXPORT size_t unimem_torch_stats_size(void)
{
    return sizeof(um_stats);
}

UMT_EXPORT const char *unimem_torch_last_error(void)
{
    pthread_mutex_lock(&error_lock);
    memcpy(last_error_copy, last_error, sizeof last_error_copy);
    pthread_mutex_unlock(&error_lock);
    return last_error_copy;
}
