/*
 * unimem: one memory manager for the host and every accelerator.
 *
 * This is the whole public API. Handles are opaque; every call that can fail
 * returns a um_status, and um_last_error() gives the calling thread a message
 * with the details (which device, how many bytes, which option) of its last
 * failure.
 */
#ifndef UNIMEM_H
#define UNIMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden visibility; these are its exports. */
#if defined(UM_BUILDING_LIBRARY) && defined(__GNUC__)
#define UM_API __attribute__((visibility("default")))
#else
#define UM_API
#endif

#define UNIMEM_VERSION_MAJOR 0
#define UNIMEM_VERSION_MINOR 1
#define UNIMEM_VERSION_PATCH 0

/* ---------------------------------------------------------------- status */

/* X(name, value, message): the one list that defines every status code. */
#define UM_STATUS_LIST(X)                                                        \
    X(UM_OK, 0, "success")                                                       \
    X(UM_ERR_INVALID, 1, "invalid argument")                                     \
    X(UM_ERR_NOMEM, 2, "out of memory")                                          \
    X(UM_ERR_NO_DEVICE, 3, "no such device")                                     \
    X(UM_ERR_INVALID_POINTER, 4, "pointer was not returned by um_malloc")        \
    X(UM_ERR_DOUBLE_FREE, 5, "pointer is not a live allocation (double free)")   \
    X(UM_ERR_WRONG_DEVICE, 6, "stream and pointer belong to different devices")  \
    X(UM_ERR_BAD_OPTION, 7, "unknown option or bad option value")                \
    X(UM_ERR_BACKEND, 8, "backend call failed")                                  \
    X(UM_ERR_UNSUPPORTED, 9, "not supported by this device")                     \
    X(UM_ERR_PARSE, 10, "malformed input")                                       \
    X(UM_ERR_IO, 11, "input/output error")                                       \
    X(UM_ERR_BUSY, 12, "resource still in use")                                  \
    X(UM_ERR_INTERNAL, 13, "internal consistency check failed")                 \
    X(UM_ERR_TASK, 14, "a task failed (or a task it depends on did)")          \
    X(UM_ERR_CANCELLED, 15, "cancelled before it ran")

typedef enum um_status {
#define UM_STATUS_ENUM_(name, value, message) name = value,
    UM_STATUS_LIST(UM_STATUS_ENUM_)
#undef UM_STATUS_ENUM_
} um_status;

/* What this build of the library has, one feature after another, e.g.
 * "cuda (driver loaded at run time), zlib 1.2.13, sanitizer none, debug
 * checks off". */
UM_API const char *um_build_features(void);

/* "UM_ERR_NOMEM"; "UM_STATUS_UNKNOWN" for a value outside the list. */
UM_API const char *um_status_name(um_status s);
/* "out of memory"; "unknown status" for a value outside the list. */
UM_API const char *um_strerror(um_status s);
/* Details of this thread's last failed call ("" if none failed yet). */
UM_API const char *um_last_error(void);

/* --------------------------------------------------------------- options */

typedef enum um_option_type {
    UM_OPT_INT = 0,
    UM_OPT_BOOL = 1,
    UM_OPT_SIZE = 2,   /* bytes; accepts K, M, G, T suffixes (powers of 1024), KiB/MiB/... too,
                        * and the word none (no cap) where the doc line offers it */
    UM_OPT_STRING = 3,
    UM_OPT_ENUM = 4    /* one word out of the list in the doc line */
} um_option_type;

typedef struct um_option_info {
    const char *name;
    um_option_type type;
    const char *default_value;
    const char *doc;
} um_option_info;

/* The option table, for `unimem info --options` and documentation. */
UM_API int um_option_count(void);
UM_API um_status um_option_get(int index, um_option_info *out);

/* "64M" -> 67108864. Accepts a plain byte count or a K/M/G/T suffix, with an
 * optional "iB"/"B" after it, and a fraction with a suffix ("1.5G").
 * Overflow, an empty string, a bad suffix, a fraction of a byte ("1.5")
 * and a value above 0 that rounds to 0 bytes are UM_ERR_INVALID. */
UM_API um_status um_parse_size(const char *text, size_t *out);

/* ------------------------------------------------------- context, devices */

typedef struct um_context um_context;

/* The value option `index` has in ctx (after UNIMEM_CONF and um_init's
 * string), as text: a byte count for sizes (none for no cap, where the
 * option takes it), the word for enums. */
UM_API um_status um_option_current(um_context *ctx, int index, char *buf, size_t len);

/* A stream orders work on one device, like a CUDA stream. NULL means the
 * device's default stream; for um_free it means "the stream the block was
 * allocated on". */
typedef struct um_stream_s *um_stream;

typedef enum um_device_kind {
    UM_DEVICE_HOST = 0,
    UM_DEVICE_SIM = 1,
    UM_DEVICE_CUDA = 2
} um_device_kind;

/* "host", "sim", "cuda" ("unknown" outside the list). */
UM_API const char *um_device_kind_name(um_device_kind k);

typedef struct um_device_info {
    int index;              /* 0 is the host, 1..n the accelerators */
    um_device_kind kind;
    char name[64];          /* "host", "sim1", ... */
    size_t capacity;        /* bytes of memory the device has */
    size_t granularity;     /* bytes of one physical page of the backend */
    size_t memory_limit;    /* cap on reserved bytes (capacity when unset) */
    size_t cache_limit;     /* cap on cached bytes kept (UM_NO_CACHE_LIMIT: none) */
    const char *allocator;  /* "pool", "direct" or "bufcache" */
    /* What the driver reports; zeros and "" for host and sim devices, but
     * ordinal (-1) and vmm (1: their memory is reserved and mapped in
     * pages as with CUDA VMM). */
    int ordinal;            /* CUDA device ordinal (-1 when not a GPU) */
    char product[96];       /* the driver's name for it ("NVIDIA H200") */
    int cc_major, cc_minor; /* compute capability */
    char pci_bus_id[32];    /* "0000:19:00.0" */
    int vmm;                /* 1: pages through CUDA VMM; 0: cuMemAlloc segments */
    int pinned;             /* host device: 1 when its memory is page-locked */
} um_device_info;

/* How the driver reports the link between two devices. */
typedef struct um_link_info {
    int peer_access;        /* 1: `from` can read and write `to`'s memory directly */
    int performance_rank;   /* the driver's relative rank of the link (0 best) */
    int native_atomics;     /* 1: atomics work across the link */
} um_link_info;

/* conf: "key=value,key=value" or NULL. UNIMEM_CONF is read first, then conf. */
UM_API um_status um_init(const char *conf, um_context **ctx);
/* Frees every pool and backend resource; live allocations are released too.
 * A context shut down already, or by another thread at once, is refused:
 * nothing is done, and um_last_error() says so. */
UM_API void um_shutdown(um_context *ctx);
UM_API int um_device_count(um_context *ctx);
UM_API um_status um_device_info_get(um_context *ctx, int dev, um_device_info *out);

UM_API um_status um_stream_create(um_context *ctx, int dev, um_stream *out);
/* Waits for the stream's work, then destroys it. Where that work cannot be
 * waited for (the driver fails) and blocks freed while marked for the
 * stream (um_record_stream) wait for it, it fails and the stream stays. */
UM_API um_status um_stream_destroy(um_context *ctx, um_stream s);
UM_API um_status um_stream_synchronize(um_context *ctx, um_stream s);
/* The device a stream belongs to, or -1 for an invalid handle (NULL, or
 * one of the last 4,096 streams destroyed: calls given such a handle fail
 * with UM_ERR_INVALID; older handles must not be used, as freed memory). */
UM_API int um_stream_device(um_stream s);
/* Simulated work on a sim device's stream (NULL: its default stream):
 * queues `launch` units, then completes up to `complete` queued units, in
 * order. Work not yet completed keeps stream-ordered frees on that stream
 * fenced, as a running kernel does on a GPU. UM_ERR_UNSUPPORTED on other
 * devices; UM_ERR_WRONG_DEVICE for a stream of another device. */
UM_API um_status um_sim_stream_work(um_context *ctx, int dev, um_stream s, unsigned launch,
                             unsigned complete);
/* The units of simulated work on a sim device's stream (NULL: its default
 * stream) that are queued and not yet completed: um_sim_stream_work, a
 * synchronize or a wait for one of its events completes them. A program
 * that models a device trailing it by n units launches one, then
 * completes all but n of these (`unimem replay --lag`). */
UM_API um_status um_sim_stream_queued(um_context *ctx, int dev, um_stream s, uint64_t *units);
/* A um_stream for a stream the program already has: a CUstream (or
 * cudaStream_t) on a CUDA device, NULL or CU_STREAM_LEGACY for its legacy
 * default stream. The context never destroys `native`; um_stream_destroy
 * waits for its work, as for any stream, and forgets the wrapper.
 * UM_ERR_UNSUPPORTED on host and sim devices, and for CU_STREAM_PER_THREAD
 * (a different stream in each thread). */
UM_API um_status um_stream_wrap(um_context *ctx, int dev, void *native, um_stream *out);
/* The backend's handle (CUstream on CUDA; NULL for default and sim streams). */
UM_API void *um_stream_native(um_stream s);

UM_API um_status um_device_link_get(um_context *ctx, int from, int to, um_link_info *out);
/* Free and total memory of the device as its driver sees it (cuMemGetInfo
 * on CUDA, so other processes' memory counts; capacity minus the pages
 * created so far on host and sim devices). */
UM_API um_status um_device_memory_get(um_context *ctx, int dev, size_t *free_bytes, size_t *total_bytes);

/* The CUDA driver as this process sees it, with no context needed: its
 * version (12040 for 12.4) and GPU count, or UM_ERR_UNSUPPORTED and in
 * `why` the reason there is none (no libcuda.so.1, cuInit failed, ...). */
UM_API um_status um_cuda_driver_info(int *version, int *gpus, char *why, size_t why_len);

/* --------------------------------------------------------- pooled memory */

/* Stream-ordered, like cudaMallocAsync: the block may be used on stream s at
 * once, and on another stream only once that stream is ordered after s (an
 * event, or a synchronize): at the memory limit the block may be memory
 * another stream freed with its work still queued, which s waits for on
 * the device (option cross_stream_reuse). size 0 is UM_ERR_INVALID. The pointer is aligned to 256 bytes.
 * s must belong to dev, except that host memory (dev 0) may be ordered by
 * any device's stream (the pinned buffers of its copies); otherwise
 * UM_ERR_WRONG_DEVICE. */
UM_API um_status um_malloc(um_context *ctx, int dev, size_t size, um_stream s, void **ptr);
/* The block becomes reusable at once on stream s (NULL: its allocation
 * stream), and on other streams once the work queued on s before this call
 * has completed. s is of the block's device, or any device's for host
 * memory, as for um_malloc; otherwise UM_ERR_WRONG_DEVICE. ptr NULL does
 * nothing and returns UM_OK, as free(NULL) does. A block the pool freed
 * already is UM_ERR_DOUBLE_FREE (UM_ERR_INVALID_POINTER once its memory
 * has gone back to the backend, and always with allocator=direct); a
 * pointer inside a block, or not from um_malloc, is UM_ERR_INVALID_POINTER. */
UM_API um_status um_free(um_context *ctx, void *ptr, um_stream s);
/* The live block at ptr (from um_malloc) is also used on stream s (NULL:
 * the default stream of the block's device), as PyTorch's
 * Tensor.record_stream says: once it is freed, no stream reuses its memory
 * until the work queued on s before that um_free has completed, besides
 * what the free's own stream order asks. The um_free returns at once and
 * waits for nothing; the block counts as live until it goes back to the
 * pool (at a later um_malloc or um_free of its device, um_trim or
 * um_set_memory_limit, or as soon as an allocation there would otherwise
 * fail). s is of the block's device, or of any device for host memory.
 * Recording a stream twice is recording it once. Where the driver can record no event on a marked
 * stream, um_free waits for that stream's work instead; where it can do
 * neither, um_free fails with the driver's status and the block stays live
 * and marked, to be freed again. A pointer that is not a live block's
 * start (freed, or inside a block) fails with UM_ERR_INVALID_POINTER. */
UM_API um_status um_record_stream(um_context *ctx, void *ptr, um_stream s);
/* The device that owns ptr, or -1. Reads no device memory. */
UM_API int um_pointer_device(um_context *ctx, const void *ptr);

/* Copies n bytes between any two addresses of host, sim or CUDA memory
 * (unimem's or the program's), queued on stream s after its earlier work;
 * NULL: the default stream of the device that owns dst (or src). Host
 * memory from device 0 is pinned when a GPU is present, so those copies
 * are truly asynchronous; other host memory may be copied synchronously. */
UM_API um_status um_memcpy_async(um_context *ctx, void *dst, const void *src, size_t n, um_stream s);
/* The same, returning once the copy is complete. When either fails, the
 * bytes at dst are undefined (the copy may have run before the error, as
 * with cudaMemcpy); src is never changed. */
UM_API um_status um_memcpy(um_context *ctx, void *dst, const void *src, size_t n);

/* ------------------------------------------------------- memory control */

/* The memory limit caps the bytes a device reserves: 0 restores the
 * default, the device capacity, and a limit above the capacity is the
 * capacity. Lowering it below the reserved bytes first gives back the
 * frees of marked blocks (um_record_stream), waiting for their streams if
 * need be, and trims the cache, and fails with UM_ERR_BUSY if what stays
 * reserved (the pages under live blocks, which can be more than the live
 * bytes) still exceeds it; the limit is then left unchanged. */
UM_API um_status um_set_memory_limit(um_context *ctx, int dev, size_t bytes);
/* The cache limit caps the cached bytes (free pages, cached small slots) a
 * device keeps; above it free pages go back to the backend.
 * UM_NO_CACHE_LIMIT, the default, removes the cap; 0 keeps no cache, as
 * mx.set_cache_limit(0) in MLX: what can go back does (pages partly in use
 * stay). */
#define UM_NO_CACHE_LIMIT SIZE_MAX
UM_API um_status um_set_cache_limit(um_context *ctx, int dev, size_t bytes);
/* Returns cached memory (fully free pages) to the backend, like
 * torch.cuda.empty_cache() or mlx.core.clear_cache(); the memory of
 * destroyed buffers whose queued work has finished is freed first. */
UM_API um_status um_trim(um_context *ctx, int dev);

/* The layout of um_stats: um_stats_get writes it into `version`, so a
 * program can tell which fields a library filled. */
#define UM_STATS_VERSION 1

typedef struct um_stats {
    uint32_t version;           /* UM_STATS_VERSION of the library that filled it */
    size_t active_bytes;        /* bytes in live blocks (rounded block sizes) */
    size_t requested_bytes;     /* bytes the callers asked for in live blocks */
    size_t reserved_bytes;      /* bytes of backend memory the pool holds */
    size_t cached_bytes;        /* reserved - active */
    size_t peak_active_bytes;
    size_t peak_reserved_bytes;
    size_t largest_free_bytes;  /* largest request servable without growing */
    double fragmentation;       /* (cached - largest free) / cached, 0 if none */
    uint64_t active_blocks;
    uint64_t num_allocs;
    uint64_t num_frees;
    uint64_t num_backend_calls; /* every call into the backend, of any kind */
    uint64_t num_cache_hits;    /* allocations served with no backend call */
    uint64_t num_ooms;          /* allocations that failed for lack of memory */
} um_stats;

UM_API um_status um_stats_get(um_context *ctx, int dev, um_stats *out);
/* Device dev's statistics as one JSON object (its name and kind, then
 * every um_stats field by name) into buf, NUL-terminated; *needed (may be
 * NULL) gets the length it needs without the NUL. UM_ERR_INVALID when it
 * does not fit (buf then holds nothing). */
UM_API um_status um_stats_json(um_context *ctx, int dev, char *buf, size_t len, size_t *needed);
/* Writes a table of every device's statistics to f (a FILE *): what
 * UNIMEM_SHOW_STATS=1 prints at um_shutdown, and what `unimem replay` and
 * `unimem bench` print after their runs. */
UM_API void um_stats_print(um_context *ctx, void *f);
/* Peaks restart from the current values. */
UM_API um_status um_reset_peak(um_context *ctx, int dev);

/* ------------------------------------------------------ unified buffers */

/* A buffer is one handle for data usable on every device. It has at most
 * one replica per device, each invalid, shared (valid and as new as any) or
 * owner (valid; the last writer's, the only valid one right after a
 * write). unimem copies data between replicas when a device needs it and
 * only then. A new buffer reads as zeros. Buffers are thread-safe; work on
 * one buffer is serialized by its lock. */
typedef struct um_buffer um_buffer;

typedef enum um_access {
    UM_ACCESS_READ = 1,          /* valid data, not changed */
    UM_ACCESS_WRITE = 2,         /* valid data, changed: the others go invalid */
    UM_ACCESS_READ_WRITE = 3,    /* the same as WRITE, named for clarity */
    UM_ACCESS_WRITE_DISCARD = 4  /* overwritten whole: no copy in, contents undefined */
} um_access;

typedef enum um_replica_state {
    UM_REPLICA_INVALID = 0,
    UM_REPLICA_SHARED = 1,
    UM_REPLICA_OWNER = 2
} um_replica_state;

/* "invalid", "shared", "owner" ("unknown" outside the list). */
UM_API const char *um_replica_state_name(um_replica_state s);

typedef struct um_buffer_opts {
    int device; /* make the first replica (zeros) here at once; -1: when first used */
} um_buffer_opts;

/* o NULL: no replica until first use. size 0 is UM_ERR_INVALID; a size
 * larger than every device's memory (a replica is whole on one device) is
 * UM_ERR_NOMEM. */
UM_API um_status um_buffer_create(um_context *ctx, size_t size, const um_buffer_opts *o,
                                  um_buffer **out);
/* A buffer whose host replica is the program's memory at host_ptr (not
 * copied, never freed by unimem; it must outlive the buffer). It starts as
 * the owner: the buffer holds what host_ptr holds, and um_buffer_destroy
 * copies the newest data back there. */
UM_API um_status um_buffer_wrap(um_context *ctx, void *host_ptr, size_t size, um_buffer **out);
/* A pointer to the buffer's replica on dev, valid until um_buffer_release.
 * The data is ready for work queued on stream s (of dev; NULL: the default
 * stream) after this call, and for the host at once when dev is 0: copies
 * are ordered through events, with no device-wide synchronisation. Any
 * number of read acquisitions may be held at once, on any devices; a write
 * acquisition excludes every other. A conflicting acquisition fails with
 * UM_ERR_BUSY (it does not wait). */
UM_API um_status um_buffer_acquire(um_buffer *b, int dev, um_access mode, um_stream s,
                                   void **ptr);
/* Ends one acquisition on dev. Work queued on s (NULL: the default stream)
 * before this call may still use the replica: later copies and writes wait
 * for it. Where the driver can neither record an event for that work nor
 * wait for it, the release fails and the acquisition stays held (nothing
 * would order later writes after the work); release again once it can. */
UM_API um_status um_buffer_release(um_buffer *b, int dev, um_stream s);
/* Starts making the replica on dev valid (asynchronously where the device
 * allows), so a later acquire finds it there. */
UM_API um_status um_buffer_prefetch(um_buffer *b, int dev);
/* Copies n bytes at offset between the buffer and host memory, returning
 * once done. A write makes its replica the owner and the others invalid.
 * A write that fails leaves the buffer's old bytes where another copy
 * holds them; where the replica written was the only valid copy, the
 * range may be partly written, as after a failed cudaMemcpy, and the
 * error says so (the rest of the buffer is unchanged). Where the driver
 * can neither fence nor wait for that copy, it may still be queued: later
 * calls on the buffer wait for it (its stream), and fail, naming the
 * driver's failure, while they cannot. A read whose copy
 * cannot be waited for (the driver fails) fails saying that dst may still
 * be written by that copy; the buffer's copy it reads is kept until then. */
UM_API um_status um_buffer_read(um_buffer *b, size_t offset, void *dst, size_t n);
UM_API um_status um_buffer_write(um_buffer *b, size_t offset, const void *src, size_t n);
/* Frees the buffer; copies still in flight finish first (their memory goes
 * back once they have). UM_ERR_BUSY while it is acquired. A wrapped
 * buffer's copies into and out of the program's memory are waited for;
 * where that wait fails, the destroy fails and the buffer stays. */
UM_API um_status um_buffer_destroy(um_buffer *b);
UM_API size_t um_buffer_size(const um_buffer *b);
/* The state of the buffer's replica on dev (INVALID for a bad argument). */
UM_API um_replica_state um_buffer_replica_state(um_buffer *b, int dev);

/* ------------------------------------------- reclaim: eviction and spill */

/* When a device runs short, unimem makes room instead of failing: it trims
 * the pool's cached memory, then frees invalid replicas' memory, drops
 * clean replicas (a valid copy exists elsewhere) and writes dirty ones back
 * (to the host, or another device with room) before dropping them. With
 * the option spill_dir, host memory is a device like the others: when no
 * memory has room (the host's limit is host_capacity or
 * um_set_memory_limit(ctx, 0, ...)), the only copy of a buffer's data goes
 * to a file there (in a private directory, unlinked at once, so nothing
 * is left behind) and comes back from it on the next acquire, checked: a
 * file changed or truncated behind unimem's back fails that acquire or
 * read with UM_ERR_BACKEND. An allocation at the memory limit does this
 * itself and retries (waiting up to a second for buffers that other calls
 * hold); above a device's high watermark a background thread does it
 * ahead of need until usage is below the low watermark. Acquired replicas
 * are never evicted. */
typedef enum um_hint {
    UM_HINT_WONT_USE = 1, /* evict this buffer first (until its next acquire) */
    UM_HINT_WILL_USE = 2, /* it will be acquired: one announcement per coming use, in order */
    UM_HINT_PIN = 3,      /* never evict its data (an out-of-date replica's memory may go) */
    UM_HINT_UNPIN = 4
} um_hint;

UM_API um_status um_buffer_hint(um_buffer *b, um_hint hint);

/* Watermarks of device dev, in bytes of buffer replicas held there (the
 * memory reclaim can give back; a program's own um_malloc blocks do not
 * count). 0, 0: back to the watermark_low / watermark_high options,
 * percent of the memory limit. */
UM_API um_status um_set_watermarks(um_context *ctx, int dev, size_t low_bytes, size_t high_bytes);
/* The watermarks in effect on dev, in bytes: those set, or the options'
 * percentages of its memory limit now. A pair is read whole, never one
 * mark of an earlier um_set_watermarks with one of a later. */
UM_API um_status um_get_watermarks(um_context *ctx, int dev, size_t *low_bytes,
                                   size_t *high_bytes);

typedef struct um_reclaim_stats {
    uint64_t evictions;          /* replicas dropped from the device */
    uint64_t written_back;       /* of which written back first (the only valid copy) */
    uint64_t written_back_bytes;
    uint64_t refetched_bytes;    /* bytes copied back into the device after an eviction */
    uint64_t reclaimer_runs;     /* background passes that found the device above its high mark */
    uint64_t sync_reclaims;      /* allocations that had to make room themselves */
    uint64_t wait_ns;            /* time those allocations spent making room */
    uint64_t failed;             /* allocations that failed with no room to make */
    uint64_t spilled;            /* of written_back, those that went to the spill file */
    uint64_t spilled_bytes;
    uint64_t spill_file_bytes;   /* the context's spill file now (every device reports it) */
} um_reclaim_stats;

UM_API um_status um_reclaim_stats_get(um_context *ctx, int dev, um_reclaim_stats *out);

/* Copies the transfer engine made from device `from` to device `to` (0 is
 * the host; buffer reads and writes count as copies to and from it), and
 * the link's cost. -1 on either side sums over every device there: a
 * device's copies out (to = -1) or in (from = -1), or all (both -1), with
 * no link cost. The first call (or buffer) of a context measures every
 * link unless the link cache already has this machine's figures. */
typedef struct um_link_stats {
    uint64_t bytes;
    uint64_t copies;
    uint64_t busy_ns;   /* time from a copy's start to its observed completion, summed */
    /* The cost the engine uses to pick a copy's source on this link:
     * measured at the context's first buffer (or read from the link cache
     * file), or the fixed model (the links option). */
    double bandwidth_gbps;
    double latency_us;
    int measured;       /* 1: measured or cached; 0: the model */
} um_link_stats;

UM_API um_status um_link_stats_get(um_context *ctx, int from, int to, um_link_stats *out);

/* ------------------------------------------------------------------ tasks */

/* Multi-device execution, as in StarPU: a task names the buffers it uses
 * and how; unimem orders it after the tasks it depends on (read after
 * write, write after read, write after write, in submission order), picks
 * the device it runs on (option sched), brings its buffers there (the
 * inputs of queued tasks are prefetched while earlier ones run) and runs
 * the implementation for that kind of device on the device's worker. */
typedef uint64_t um_task_id;

/* What an implementation gets: the device, its native stream (a CUstream
 * on a GPU, where the implementation launches its work and returns; NULL
 * elsewhere, where it computes before returning), and every buffer's
 * address there, in the task's order. */
typedef struct um_task_exec {
    int device;
    um_device_kind kind;
    void *stream;
    void *const *ptrs;
    const size_t *sizes;
    int nbuffers;
    void *user;
} um_task_exec;

/* 0 on success; anything else fails the task and, without running them,
 * the tasks that read what it writes, and theirs in turn (UM_ERR_TASK);
 * every mode but WRITE_DISCARD reads. A task that writes a buffer the
 * failed one only read, or that replaces with WRITE_DISCARD a buffer it
 * wrote (the repair), still runs, after it. */
typedef int (*um_task_fn)(const um_task_exec *e);

#define UM_TASK_MAX_BUFFERS 16
/* The bytes of a task's name kept, its terminating NUL included. */
#define UM_TASK_NAME_MAX 64
/* The largest flops a task may give (1e15 s of a PFLOP/s device). The
 * task trace (option task_trace) that the simulator reads holds the same
 * bound: it sums flops along paths of up to 2^32 tasks, which must stay
 * finite. */
#define UM_TASK_MAX_FLOPS 1e30

typedef struct um_task {
    /* The kind of task: performance history is kept per name and size.
     * Copied at submission (so it may be a temporary string), the first
     * UM_TASK_NAME_MAX - 1 bytes at most, cut at a UTF-8 character's start:
     * names alike in those bytes share their history. */
    const char *name;
    um_task_fn cpu;         /* runs on the host, and on sim devices (their memory is host memory) */
    um_task_fn cuda;        /* launches on e->stream of a GPU (its context current: cuBLAS
                             * and the CUDA runtime called here target that GPU) */
    int nbuffers;
    um_buffer *buffers[UM_TASK_MAX_BUFFERS];
    um_access modes[UM_TASK_MAX_BUFFERS];
    double flops;           /* a cost hint (0: unknown; 0 to UM_TASK_MAX_FLOPS, or the
                             * submission fails): sizes the first estimates */
    int device;             /* -1: the policy places it; else it runs there */
    void *user;
    /* Called once when the task has finished (its GPU work too), failed
     * or been cancelled: on the worker of the device it ran on, or, for a
     * task that ends without running, on the thread that ended it (a
     * worker, or the caller of um_task_submit or um_task_cancel). st is
     * what um_task_wait returns for it: UM_OK, UM_ERR_TASK (whatever the
     * cause; um_task_wait's message names it) or UM_ERR_CANCELLED. Waits
     * on other threads return after it. It may submit and cancel tasks;
     * um_task_wait on its own id returns the task's status at once (so
     * does one on a task whose callback this thread runs next, such as
     * the task it failed with), and
     * um_wait_all fails with UM_ERR_BUSY there (it would wait for this
     * task, and on a worker for the tasks queued behind it). A worker
     * takes no new task while it runs callbacks. A wait for another task
     * holds the thread: on a worker, the tasks queued there go to other
     * devices meanwhile, and a wait for a task that only that worker can
     * run (forced onto its device, or the only one with an implementation
     * or room for it), or that waits for such a task, fails with
     * UM_ERR_BUSY; so does one that would close a cycle of such waits
     * through callbacks on several workers (each waiting for a task that
     * only the next one's device can run): the last of them to wait. */
    void (*done)(um_task_id id, um_status st, void *user);
    /* Among ready tasks, and those queued on a device and not started, a
     * higher priority goes first (0 by default; equal ones in the order
     * they became ready). */
    int priority;
} um_task;

/* Submits *t (copied, its name too; its buffers must live until it is
 * done). *id names it for um_task_wait and um_task_cancel. Bad input (no
 * implementation for any device, a forced device without one, a buffer
 * twice, a bad mode, flops not a number of 0 to UM_TASK_MAX_FLOPS) fails
 * here, naming it. */
UM_API um_status um_task_submit(um_context *ctx, const um_task *t, um_task_id *id);
/* Waits for one task: UM_OK, UM_ERR_TASK (with the reason), or
 * UM_ERR_CANCELLED. Any id may be waited for, as often as wanted, for the
 * context's life: the reasons of failed tasks are kept. */
UM_API um_status um_task_wait(um_context *ctx, um_task_id id);
/* Cancels a task that has not started (failing, as a failure would, the
 * tasks that read what it would have written); UM_ERR_BUSY once it runs or
 * has finished. Later tasks keep their order: they still wait for what the
 * cancelled task was waiting for. A task that fails without running (its
 * buffers could not all be had) leaves their data as it was. */
UM_API um_status um_task_cancel(um_context *ctx, um_task_id id);
/* Waits until no task is unfinished: those submitted so far and any that
 * other threads or done callbacks submit meanwhile (a thread that keeps
 * submitting keeps it waiting). UM_OK, or the status of the first task
 * that failed since the last report (its message in um_last_error). */
UM_API um_status um_wait_all(um_context *ctx);

typedef struct um_task_stats {
    uint64_t tasks;         /* run on this device */
    uint64_t failed;
    uint64_t busy_ns;       /* time its worker spent running tasks */
    uint64_t waited_ns;     /* time its tasks waited for their buffers (host and sim devices;
                             * a GPU's tasks wait on its streams, inside busy_ns) */
    uint64_t bytes_in;      /* bytes fetched for its tasks */
} um_task_stats;

UM_API um_status um_task_stats_get(um_context *ctx, int dev, um_task_stats *out);

/* --------------------------------------------------- allocation traces */

/* A reader for the allocation-trace format of the traces in data/ (gzip or plain
 * text): "a <id> <size> <stream>" and "f <id>" lines, '#' comments, lines
 * of at most 511 characters (comments excepted); a UTF-8 byte-order mark
 * before the first line is skipped (its bytes count towards that line's
 * length). The reader validates as it goes: an unknown op, a missing or extra field, a
 * duplicate id, or a free of an unknown or already freed id is UM_ERR_PARSE
 * with the line number in um_last_error(). */
typedef struct um_trace um_trace;

typedef enum um_trace_op { UM_TRACE_ALLOC = 0, UM_TRACE_FREE = 1 } um_trace_op;

typedef struct um_trace_event {
    um_trace_op op;
    uint64_t id;        /* the trace's block id */
    uint64_t slot;      /* a dense index for id: 0, 1, 2, ... in order of first allocation */
    uint64_t size;      /* bytes; for a free, the size the block was allocated with */
    uint64_t stream;    /* the trace's stream value; for a free, the allocation's stream */
    uint64_t line;      /* 1-based line number in the file */
} um_trace_event;

UM_API um_status um_trace_open(const char *path, um_trace **out);
/* UM_OK with *ev filled, UM_ERR_PARSE / UM_ERR_IO on bad input; at the end of
 * the trace returns UM_OK and sets *done to 1. */
UM_API um_status um_trace_next(um_trace *t, um_trace_event *ev, int *done);
/* Restarts from the first line (the trace is read again). */
UM_API um_status um_trace_rewind(um_trace *t);
/* Fraction of the file consumed so far, 0..1 (for progress bars). */
UM_API double um_trace_progress(const um_trace *t);
/* Number of distinct ids seen so far. */
UM_API uint64_t um_trace_slots(const um_trace *t);
UM_API void um_trace_close(um_trace *t);

#ifdef __cplusplus
}
#endif

#endif /* UNIMEM_H */
