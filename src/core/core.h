/*
 * core: the context (um_init/um_shutdown), the device table and streams;
 * the glue between the public API and the layers below. Owns one backend
 * and one allocator per device, and every stream object.
 */
#ifndef UM_CORE_H
#define UM_CORE_H

#include "../base/options.h"
#include "../pool/pool.h"
#include "../trace/events.h"

#include <pthread.h>

#define UM_MAX_DEVICES 64

typedef struct um_device {
    int index;
    um__backend *backend;
    um__allocator *alloc;
    struct um_stream_s *default_stream;
    _Atomic uint32_t next_stream_id; /* 0 is the default stream */
    /* The device's blocks that um_record_stream marked (stream_use.c),
     * made at the first one; and how many there are, and how many of them
     * wait for other streams before going back to the allocator. While
     * both counts are 0, um_free and um_malloc pass straight through. */
    struct um__stream_uses *uses;
    _Atomic uint32_t marked, deferred;
    /* Failures of the allocator that um_malloc retried (after waiting for
     * deferred frees, or after reclaim made room): the allocator counted
     * each as an OOM, but only the call's last failure is one, so
     * um_stats_get takes these off num_ooms. */
    _Atomic uint64_t ooms_retried;
} um_device;

/* The bytes an allocation on d can still have before reclaim must make
 * room: its limit less its live bytes. The allocator's cached memory is
 * room, since an allocation at the limit reuses it (the pool) or gives it
 * back first (the others). The backend's physical bytes count that memory
 * as used: with them the runtime prefetched nothing into a device where
 * the pool kept 16 MiB of freed pages (test_task,
 * test_prefetch_into_cached_memory). */
static inline size_t um__device_room(const um_device *d)
{
    size_t limit = d->alloc->memory_limit, live = d->alloc->ops->active_bytes(d->alloc);
    return live < limit ? limit - live : 0;
}

struct um_stream_s {
    um_context *ctx;
    int dev;
    um__stream_ref ref;    /* id and backend stream */
    uint32_t magic;        /* UM_STREAM_MAGIC while valid */
    /* The stream as device 0's allocator sees it, made the first time the
     * stream orders host memory (pinned buffers of its copies): an id of
     * the host's, and this stream's backend to record fences with. */
    _Atomic uint32_t host_id; /* 0 until then */
    um__stream_ref host_ref;
};
#define UM_STREAM_MAGIC 0x5354524du

struct um_context {
    um__options opts;
    int ndevices;
    um_device devices[UM_MAX_DEVICES];
    /* Each device's allocator's address range (size 0: ask its owns()),
     * side by side, so that finding a freed pointer's device reads one
     * array rather than every allocator. */
    struct {
        uintptr_t lo;
        size_t size;
    } owner_range[UM_MAX_DEVICES];
    /* The buffer layer (src/buffer), made on first use: its state, and the
     * call that frees it (and every buffer left) at um_shutdown, before the
     * allocators and streams go. Set once under buffers_lock, which is not
     * the stream lock: making the layer creates streams. */
    pthread_mutex_t buffers_lock;
    um__events *events;     /* the trace_file recorder, or NULL */
    um__fault_plan *fault;  /* the fault option's plan (every backend wrapped), or NULL */
    struct um__xfer *_Atomic xfer;
    void (*buffers_fini)(um_context *ctx);
    /* Makes room on dev for an allocation of `bytes` that failed for lack
     * of memory (evicting buffer replicas); true when it freed something,
     * so the allocation is worth retrying (`made` is false). Called once
     * more with 0 bytes when that allocation is over, `made` saying
     * whether it was made, so that it counts as one wait however many
     * evictions it took, and as failed only if it failed (the try after
     * a call that found nothing to evict may still find room another
     * thread freed). Set with the buffer layer. */
    bool (*_Atomic reclaim)(um_context *ctx, int dev, size_t bytes, bool made);
    /* Frees the memory of destroyed buffers whose last users have finished
     * (the buffer layer holds it until then); um_trim calls it first, so
     * that what it gives back includes them. Set with the buffer layer. */
    void (*_Atomic collect)(um_context *ctx);
    /* The run layer (src/run), made at the first task: its state, the call
     * that stops its workers at um_shutdown (before the buffer layer goes),
     * and the call a buffer's destroy makes first: false while tasks not
     * finished yet use the buffer (it may not go), else the run layer
     * forgets it and says true. Set under buffers_lock. */
    struct um__run *_Atomic run;
    void (*run_fini)(um_context *ctx);
    bool (*_Atomic forget_buffer)(um_context *ctx, const struct um_buffer *b);
    /* A device's memory limit changed: ready tasks waiting for a device
     * they fit on are placed again (one that fits only under a raised
     * limit waited until some task ended). Set with the run layer. */
    void (*_Atomic limit_changed)(um_context *ctx);
    /* Virtual time (option virtual_time): how long a task takes on a sim
     * device, in ns (its name, flops and largest buffer), when the caller
     * models it, alone on the device and (*packed_ns) while other kernels
     * run beside it; NULL: flops at sim_gflops. Set before the first task. */
    uint64_t (*vt_task_ns)(void *arg, int dev, const char *name, double flops,
                           size_t largest_buffer, uint64_t *packed_ns);
    void *vt_task_arg;
};

/* The device structure for dev, or NULL after um__fail(UM_ERR_NO_DEVICE). */
um_device *um__device(um_context *ctx, int dev, const char *what);

/* s (a stream of an accelerator) as device 0's allocator sees it, made on
 * first use; NULL after um__fail when no host stream id is left. */
const um__stream_ref *um__stream_host_ref(um_context *ctx, um_stream s);

/* While on, this thread's allocations at a memory limit fail instead of
 * evicting buffer replicas to make room: for work that is only worth
 * doing in free memory (the runtime's prefetch of queued tasks' inputs).
 * Returns the setting it replaces. */
bool um__alloc_no_reclaim(bool on);

/* Blocks used on more streams than their own (stream_use.c, um_record_stream).
 * um_free of a marked block: *taken is true when the free is the module's
 * (deferred until the marked streams' work is done, or refused); else the
 * block is not marked and the caller frees it. s is the free's stream
 * (NULL: the block's allocation stream), already checked by the caller. */
um_status um__uses_free(um_context *ctx, int dev, void *ptr, um_stream s, bool *taken);
/* Gives the deferred blocks of dev whose streams are done back to the
 * allocator: those that are done now, or every one (waiting) when wait.
 * Waiting, fails (saying why) where some could not be waited for. */
um_status um__uses_collect(um_context *ctx, int dev, bool wait);
/* An allocator on dev is about to hand out the n addresses ptrs: returns
 * once no give-back of an old block at any of them is in progress, so
 * that a call on one that finds its old use is a call on the freed block
 * (a second free, refused). The allocators call it (their reuse_wait, set
 * by the context). */
void um__uses_given(um_context *ctx, int dev, void *const *ptrs, size_t n);
/* Stream s is about to be destroyed, in two steps. Drain, before the
 * allocators forget s: the deferred frees that need s are done and given
 * back, those other threads are giving back too; the marks stay. Destroy:
 * destroys s's backend stream, and only then no marked block names s any
 * more. Either fails, every mark as it was, where a free that needs s
 * cannot be waited for or the backend fails (s must then stay). */
um_status um__uses_stream_drain(um_context *ctx, um_stream s);
um_status um__uses_stream_destroy(um_context *ctx, um_stream s);
/* um_shutdown: forgets every marked block (before the allocators go). */
void um__uses_fini(um_context *ctx);

#endif /* UM_CORE_H */
