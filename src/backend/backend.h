/*
 * backend: one vtable per kind of memory (host, sim, CUDA). The
 * operations mirror CUDA's virtual memory management, so a pool can reserve
 * an address range once and map physical pages into it wherever they are
 * needed:
 *
 *   reserve/unreserve   an address range with no memory behind it
 *   create/release      a physical chunk (a multiple of the granularity)
 *   map/unmap           a whole chunk at an address inside a reservation
 *
 * plus streams and events for stream-ordered reuse, and copies between host
 * memory and device memory (device memory is not readable from the host in
 * general; sim and host memory happen to be).
 *
 * Owns: the backend object and its physical memory accounting. Every call
 * goes through the um__be_* wrappers below, which count calls (the pool's
 * num_backend_calls) and record the memory calls as trace events; failures
 * are injected by a backend wrapping another (fault.c, option `fault`).
 * Every operation may fail; a failure returns a status with um__fail's
 * message and leaves the backend unchanged (but see map).
 */
#ifndef UM_BACKEND_H
#define UM_BACKEND_H

#include "../base/base.h"
#include "../trace/events.h"

typedef struct um__backend um__backend;
typedef uint64_t um__phys;        /* a physical chunk; 0 is never a valid handle */
typedef struct um__bstream um__bstream; /* a backend stream (CUstream on CUDA) */
typedef struct um__bevent um__bevent;   /* a backend event (CUevent on CUDA) */

typedef struct um__backend_ops {
    um_status (*reserve)(um__backend *b, size_t size, uintptr_t *va);
    um_status (*unreserve)(um__backend *b, uintptr_t va, size_t size);
    um_status (*create)(um__backend *b, size_t size, um__phys *out);
    um_status (*release)(um__backend *b, um__phys h, size_t size);
    /* Maps all of chunk h (size bytes) at va, readable and writable by the
     * device. va and size are multiples of the granularity. The one
     * failure that changes something (CUDA): UM_ERR_BUSY, a map that could
     * not be undone, whose range stays mapped; the backend keeps it, tries
     * to unmap it at the next map there, and refuses to release h until
     * then. */
    um_status (*map)(um__backend *b, uintptr_t va, size_t size, um__phys h);
    um_status (*unmap)(um__backend *b, uintptr_t va, size_t size);

    um_status (*stream_create)(um__backend *b, um__bstream **out);
    um_status (*stream_destroy)(um__backend *b, um__bstream *s);
    um_status (*stream_sync)(um__backend *b, um__bstream *s);
    /* *idle = 1 when all the work queued on s has completed. Optional
     * (NULL: the backend cannot say without waiting). */
    um_status (*stream_query)(um__backend *b, um__bstream *s, int *idle);
    /* Creates an event that completes when the work queued on s so far has
     * completed. s NULL is the device's default stream. */
    um_status (*event_record)(um__backend *b, um__bstream *s, um__bevent **out);
    /* *done = 1 when the event has completed. */
    um_status (*event_query)(um__backend *b, um__bevent *e, int *done);
    um_status (*event_sync)(um__backend *b, um__bevent *e);
    /* e NULL is nothing to do, as for free(). */
    void (*event_destroy)(um__backend *b, um__bevent *e);
    /* Timed events, optional (NULL: the backend cannot tell when its
     * streams' work ran). event_record_timed records an event as
     * event_record does, usable as any other event, whose completion time
     * event_elapsed can compare with another timed event's: *ns is the time
     * from start's completion to end's, both completed (0 if end completed
     * first); UM_ERR_UNSUPPORTED where the backend cannot say at the time.
     * event_time gives the time on um__now_ns's clock at which a completed
     * timed event completed, as near as the backend can tell (CUDA: within
     * a few microseconds); UM_ERR_UNSUPPORTED where it cannot say.
     * A timed event is destroyed with event_destroy_timed (CUDA keeps its
     * timed and plain events apart: they are made differently). */
    um_status (*event_record_timed)(um__backend *b, um__bstream *s, um__bevent **out);
    um_status (*event_elapsed)(um__backend *b, um__bevent *start, um__bevent *end, uint64_t *ns);
    um_status (*event_time)(um__backend *b, um__bevent *e, uint64_t *ns);
    void (*event_destroy_timed)(um__backend *b, um__bevent *e);

    /* A backend stream for a stream the program owns (a CUstream); the
     * backend never destroys `native`. UM_ERR_UNSUPPORTED without one. */
    um_status (*stream_wrap)(um__backend *b, void *native, um__bstream **out);
    /* The native handle of s (NULL for the default stream and on sim). */
    void *(*stream_native)(um__backend *b, um__bstream *s);

    /* dir 0: host -> device (dst is device memory); dir 1: device -> host. */
    um_status (*copy)(um__backend *b, void *dst, const void *src, size_t n, int dir);
    /* n bytes between any two addresses the backend can reach (its memory,
     * host memory, a peer's memory), queued on s. */
    um_status (*copy_async)(um__backend *b, void *dst, const void *src, size_t n,
                            um__bstream *s);
    /* Work queued on s after this call waits until e (of any backend of the
     * same driver) has completed; the host does not wait. An event of
     * another driver (um__be_same_driver false) is waited for by the host
     * instead, before this returns. */
    um_status (*stream_wait)(um__backend *b, um__bstream *s, um__backend *eb, um__bevent *e);
    /* Sets n bytes at dst (this backend's memory) to value, queued on s. */
    um_status (*memset_async)(um__backend *b, void *dst, int value, size_t n, um__bstream *s);
    /* Free and total physical memory as the device's driver sees it. */
    um_status (*mem_info)(um__backend *b, size_t *free_bytes, size_t *total);
    /* Makes the calling thread launch work on this device by default
     * (CUDA: its context current), so that code running there through a
     * runtime of its own (cuBLAS, the CUDA runtime) targets this device.
     * NULL where there is nothing to do. */
    um_status (*bind_thread)(um__backend *b);

    void (*destroy)(um__backend *b);
} um__backend_ops;

struct um__backend {
    const um__backend_ops *ops;
    um_device_kind kind;
    char name[64];
    size_t capacity;       /* bytes of physical memory the device has */
    size_t granularity;    /* physical page size; a power of two */
    _Atomic uint64_t calls;/* backend calls made, of any kind */
    _Atomic size_t physical_bytes; /* bytes of chunks created and not released */
    /* What the driver reports (CUDA); -1, 0 and "" elsewhere. */
    int ordinal;           /* CUDA device ordinal, -1 when not a GPU */
    char product[96];      /* the driver's device name */
    int cc_major, cc_minor;
    char pci_bus_id[32];
    int vmm;               /* 1: pages through VMM (memfd backends too) */
    int pinned;            /* 1: host memory that is page-locked */
    /* A simulated device's modelled link: nanoseconds per byte of a copy
     * to or from it (each direction its own link); 0: copies take only
     * the memcpy's time, as before there was a model. */
    double link_ns_per_byte;
    /* A rough FP32 rate in GFLOP/s from what the hardware reports (0:
     * unknown): placement's guess of a device's speed before it has
     * measured one of its tasks there. */
    double nominal_gflops;
    /* Virtual time: a sim device that stands for a GPU, whose tasks the
     * run layer launches ahead on streams (um__sim_stream_kernel) as on a
     * GPU, rather than one at a time as on the host. */
    bool launches_ahead;
    /* Timed events cost about what plain ones do (the sim's), so the
     * transfer engine times every copy, not only those that may wait. */
    bool cheap_timed_events;
    /* trace_file's recorder (memory calls become events), or NULL; the
     * device index the events name. */
    um__events *events;
    int events_dev;
    /* A fault-injection wrapper's inner backend (the one whose streams and
     * events these are); NULL for a backend of its own. */
    um__backend *wrapped;
};

/* Whether backends a and b are of the same driver, so that a's streams
 * can wait for b's events on the device (stream_wait): a fault-injection
 * wrapper counts as the backend it wraps. */
static inline bool um__be_same_driver(const um__backend *a, const um__backend *b)
{
    const um__backend *ia = a->wrapped ? a->wrapped : a, *ib = b->wrapped ? b->wrapped : b;
    return ia->ops == ib->ops;
}

/* Sets the driver-reported fields of a backend that has none. */
static inline void um__backend_no_driver_info(um__backend *b)
{
    b->ordinal = -1;
    b->product[0] = '\0';
    b->cc_major = b->cc_minor = 0;
    b->pci_bus_id[0] = '\0';
    b->vmm = 1;
    b->pinned = 0;
    b->link_ns_per_byte = 0.0;
    b->nominal_gflops = 0.0;
}

/* Constructors. Both keep physical memory in one memfd per device and map
 * it with mmap(MAP_FIXED), so a page can be unmapped in one place and mapped
 * in another, exactly like CUDA VMM. capacity 0 for the host means physical
 * RAM. */
um_status um__host_backend_create(size_t capacity, size_t granularity, um__backend **out);
/* link_bytes_per_s: the sim device's modelled link bandwidth (each
 * direction); 0 for none. */
um_status um__sim_backend_create(const char *name, size_t capacity, size_t granularity,
                                 size_t link_bytes_per_s, um__backend **out);

/* CUDA (cuda.c). um__cuda_backend_create makes the backend of one GPU
 * (pages from cuMemCreate on that GPU, or cuMemAlloc segments when vmm is
 * 0; page_size: its physical page, 0 for the driver's minimum, else a
 * power of two at least that); um__cuda_host_backend_create makes
 * page-locked host memory through the same VMM calls, located on the
 * host node next to GPU `gpu`, made through that GPU's context, and
 * reachable from every GPU.
 * Both fail with UM_ERR_UNSUPPORTED and the reason when the driver or the
 * feature is missing. */
um_status um__cuda_backend_create(int ordinal, int vmm, size_t page_size, um__backend **out);
um_status um__cuda_host_backend_create(int gpu, size_t capacity, um__backend **out);
/* The link from GPU `from` to GPU `to` (ordinals) as the driver reports it. */
um_status um__cuda_link(int from, int to, um_link_info *out);

/* Fault injection (fault.c, the `fault` option). A plan is parsed from the
 * option's text (NULL plan for an empty one; UM_ERR_BAD_OPTION naming the
 * bad rule otherwise) and shared by the wrappers of every device of a
 * context, so that "the Nth call" counts across devices in call order. */
typedef struct um__fault_plan um__fault_plan;
um_status um__fault_plan_parse(const char *spec, int seed, um__fault_plan **out);
void um__fault_plan_free(um__fault_plan *p);
/* Wraps inner (now owned by the wrapper) as device dev. */
um_status um__fault_wrap(um__backend *inner, um__fault_plan *plan, int dev, um__backend **out);
/* Failures the plan has injected so far. */
uint64_t um__fault_fired(const um__fault_plan *p);
/* The highest device index a rule of the plan names, or -1 (none, or
 * every rule is for every device). */
int um__fault_plan_max_dev(const um__fault_plan *p);
/* Wrappers destroyed, in this process, while the layers above still held
 * reservations, chunks, mappings, streams or events of theirs: leaks. */
uint64_t um__fault_leaks_total(void);

/* Simulated work, for tests and (later) the run layer: queue `n` units of
 * work on a sim stream; they stay incomplete until um__sim_stream_complete
 * or a synchronize. UM_ERR_UNSUPPORTED on other backends. */
um_status um__sim_stream_launch(um__backend *b, um__bstream *s, unsigned n);
um_status um__sim_stream_complete(um__backend *b, um__bstream *s, unsigned n);
/* Units launched on a sim stream and not completed yet. */
um_status um__sim_stream_queued(um__backend *b, um__bstream *s, uint64_t *units);
/* Virtual time only: a kernel of `ns` nanoseconds queued on a sim stream
 * (it runs when the stream's earlier work is done); packed_ns when it
 * starts as the device's previous kernel ends (others ran beside it). */
um_status um__sim_stream_kernel(um__backend *b, um__bstream *s, uint64_t ns, uint64_t packed_ns);

/* The argument checks every backend's copies share: NULL pointers, and a
 * direction (0: to the device, 1: to the host; -1: any, for copy_async).
 * UM_OK, or a failure naming the backend and the bad argument. */
static inline um_status um__backend_copy_check(const um__backend *b, const void *dst,
                                               const void *src, size_t n, int dir)
{
    if (!dst || !src)
        return um__fail(UM_ERR_INVALID, "%s: copy of %zu bytes: %s pointer is NULL", b->name, n,
                        dst ? "source" : "destination");
    if (dir != -1 && dir != 0 && dir != 1)
        return um__fail(UM_ERR_INVALID,
                        "%s: copy of %zu bytes: direction %d is neither 0 (to the device) nor 1 "
                        "(to the host)",
                        b->name, n, dir);
    return UM_OK;
}

/* Counted wrappers: the only way layers above call a backend. */
#define UM_BE_CALL_(b, op, ...) \
    (atomic_fetch_add_explicit(&(b)->calls, 1, memory_order_relaxed), (b)->ops->op((b), __VA_ARGS__))

/* The memory calls are also events when a recorder is on: a call of op
 * on `bytes`, started at t0, that returned s. */
static inline uint64_t um__be_t0(const um__backend *b)
{
    return UM_UNLIKELY(b->events != NULL) ? um__now_ns() : 0;
}
static inline um_status um__be_traced(um__backend *b, um__backend_op op, size_t bytes,
                                      uint64_t t0, um_status s)
{
    if (UM_UNLIKELY(b->events != NULL))
        um__event_add(b->events, UM_EVENT_BACKEND, b->events_dev, -1, t0, um__now_ns() - t0,
                      bytes, (uint64_t)op | (s != UM_OK ? 256u : 0u));
    return s;
}
#define UM_BE_MEM_CALL_(b, opcode, bytes, op, ...)                                            \
    uint64_t t0_ = um__be_t0(b);                                                           \
    return um__be_traced((b), (opcode), (bytes), t0_, UM_BE_CALL_(b, op, __VA_ARGS__))

static inline um_status um__be_reserve(um__backend *b, size_t size, uintptr_t *va)
{ UM_BE_MEM_CALL_(b, UM_BE_OP_RESERVE, size, reserve, size, va); }
static inline um_status um__be_unreserve(um__backend *b, uintptr_t va, size_t size)
{ UM_BE_MEM_CALL_(b, UM_BE_OP_UNRESERVE, size, unreserve, va, size); }
static inline um_status um__be_create(um__backend *b, size_t size, um__phys *out)
{ UM_BE_MEM_CALL_(b, UM_BE_OP_CREATE, size, create, size, out); }
static inline um_status um__be_release(um__backend *b, um__phys h, size_t size)
{ UM_BE_MEM_CALL_(b, UM_BE_OP_RELEASE, size, release, h, size); }
static inline um_status um__be_map(um__backend *b, uintptr_t va, size_t size, um__phys h)
{ UM_BE_MEM_CALL_(b, UM_BE_OP_MAP, size, map, va, size, h); }
static inline um_status um__be_unmap(um__backend *b, uintptr_t va, size_t size)
{ UM_BE_MEM_CALL_(b, UM_BE_OP_UNMAP, size, unmap, va, size); }
static inline um_status um__be_stream_create(um__backend *b, um__bstream **out)
{ return UM_BE_CALL_(b, stream_create, out); }
static inline um_status um__be_stream_destroy(um__backend *b, um__bstream *s)
{ return UM_BE_CALL_(b, stream_destroy, s); }
static inline um_status um__be_stream_sync(um__backend *b, um__bstream *s)
{ return UM_BE_CALL_(b, stream_sync, s); }
static inline um_status um__be_stream_query(um__backend *b, um__bstream *s, int *idle)
{ return UM_BE_CALL_(b, stream_query, s, idle); }
static inline um_status um__be_copy(um__backend *b, void *dst, const void *src, size_t n, int dir)
{ return UM_BE_CALL_(b, copy, dst, src, n, dir); }
static inline um_status um__be_copy_async(um__backend *b, void *dst, const void *src, size_t n,
                                          um__bstream *s)
{ return UM_BE_CALL_(b, copy_async, dst, src, n, s); }
static inline um_status um__be_stream_wait(um__backend *b, um__bstream *s, um__backend *eb,
                                           um__bevent *e)
{ return UM_BE_CALL_(b, stream_wait, s, eb, e); }
static inline um_status um__be_memset_async(um__backend *b, void *dst, int value, size_t n,
                                            um__bstream *s)
{ return UM_BE_CALL_(b, memset_async, dst, value, n, s); }
static inline um_status um__be_stream_wrap(um__backend *b, void *native, um__bstream **out)
{ return UM_BE_CALL_(b, stream_wrap, native, out); }
static inline um_status um__be_mem_info(um__backend *b, size_t *free_bytes, size_t *total)
{ return UM_BE_CALL_(b, mem_info, free_bytes, total); }
static inline um_status um__be_bind_thread(um__backend *b)
{
    if (!b->ops->bind_thread)
        return UM_OK;
    atomic_fetch_add_explicit(&b->calls, 1, memory_order_relaxed);
    return b->ops->bind_thread(b);
}
static inline um_status um__be_event_record(um__backend *b, um__bstream *s, um__bevent **out)
{ return UM_BE_CALL_(b, event_record, s, out); }
static inline um_status um__be_event_query(um__backend *b, um__bevent *e, int *done)
{ return UM_BE_CALL_(b, event_query, e, done); }
static inline um_status um__be_event_sync(um__backend *b, um__bevent *e)
{ return UM_BE_CALL_(b, event_sync, e); }
static inline void um__be_event_destroy(um__backend *b, um__bevent *e)
{
    atomic_fetch_add_explicit(&b->calls, 1, memory_order_relaxed);
    b->ops->event_destroy(b, e);
}
/* Whether b has timed events (event_record_timed and the rest). */
static inline bool um__be_timed_events(const um__backend *b)
{
    return b->ops->event_record_timed && b->ops->event_elapsed && b->ops->event_time &&
           b->ops->event_destroy_timed;
}
static inline um_status um__be_event_record_timed(um__backend *b, um__bstream *s,
                                                  um__bevent **out)
{ return UM_BE_CALL_(b, event_record_timed, s, out); }
static inline um_status um__be_event_elapsed(um__backend *b, um__bevent *start, um__bevent *end,
                                             uint64_t *ns)
{ return UM_BE_CALL_(b, event_elapsed, start, end, ns); }
static inline um_status um__be_event_time(um__backend *b, um__bevent *e, uint64_t *ns)
{ return UM_BE_CALL_(b, event_time, e, ns); }
static inline void um__be_event_destroy_timed(um__backend *b, um__bevent *e)
{
    atomic_fetch_add_explicit(&b->calls, 1, memory_order_relaxed);
    b->ops->event_destroy_timed(b, e);
}

static inline void um__backend_destroy(um__backend *b)
{
    if (b)
        b->ops->destroy(b);
}

#endif /* UM_BACKEND_H */
