/*
 * vmm_memfd: the machinery the host and sim backends share. Physical memory
 * is one memfd per device, sized to the capacity (sparse until touched);
 * the VMM operations map its pages into reserved address ranges with
 * mmap(MAP_FIXED), exactly as CUDA's cuMemAddressReserve / cuMemCreate /
 * cuMemMap do on a GPU. Streams and events are shared too: a stream counts
 * submitted and completed units of work, so a host stream, where nothing is
 * ever launched, is always idle and its events complete at once.
 *
 * Owns: the memfd, the physical page allocator, the table of reservations
 * and of live mappings, and every stream created on the backend.
 * Private to src/backend (and tests/test_backend.c).
 */
#ifndef UM_VMM_MEMFD_H
#define UM_VMM_MEMFD_H

#include "backend.h"

#include <pthread.h>

/* One physical page of the memfd. A page is the start of a chunk when
 * npages != 0; the other fields are meaningful only there. */
typedef struct um__memfd_page {
    uint32_t npages; /* pages in the chunk that starts here, 0 if none */
    uint32_t gen;    /* bumped at each create here: stale handles never match */
    uint32_t maps;   /* how many live mappings show this chunk */
    uint32_t zombie; /* released while mapped: freed at its last unmap */
} um__memfd_page;

/* A reservation, with a table per granule of what is mapped there, so map
 * and unmap cost O(pages of the range), whatever the number of mappings.
 * cover[i]: 1 + the granule where the mapping over granule i starts, 0 if
 * unmapped; chunk[i]: the chunk's first memfd page, at starting granules. */
typedef struct um__memfd_range {
    uintptr_t va;
    size_t size;
    uint32_t *cover;
    uint32_t *chunk;
    size_t mapped; /* granules mapped */
} um__memfd_range;

typedef struct um__memfd_link {
    struct um__memfd_link *prev, *next;
} um__memfd_link;

struct um__bstream {
    um__memfd_link link; /* first: destroy frees streams through it */
    um__backend *owner;
    uint32_t magic;             /* UM_MEMFD_STREAM_MAGIC while usable */
    int is_default;             /* embedded in the backend, never freed */
    _Atomic uint32_t refs;      /* 1 for the creator + 1 per live event */
    _Atomic uint64_t submitted; /* units of work queued so far */
    _Atomic uint64_t completed; /* units of work done; never > submitted */
    /* With a modelled link: when the copies queued so far finish (monotonic
     * ns). Set under the backend's lock, read without it. */
    _Atomic uint64_t busy_until;
    /* Virtual time (vdev.c), under the clock's lock: the work queued and
     * not yet done, oldest first; how much was queued and is done; the
     * link in the model's list of streams with work. */
    struct um__vdev_op *vt_head, *vt_tail;
    uint64_t vt_queued, vt_done;
    struct um__bstream *vt_next;
    bool vt_listed;
};
#define UM_MEMFD_STREAM_MAGIC 0x42535452u /* "BSTR" */
#define UM_MEMFD_STREAM_DEAD 0x44454144u  /* destroyed, kept alive by events */

struct um__bevent {
    um__backend *owner;
    um__bstream *stream;
    uint64_t target; /* the stream's submitted count when recorded */
    uint64_t busy_until; /* the stream's busy_until when recorded */
    uint64_t vt_mark;    /* virtual time: the stream's work queued when recorded */
    uint64_t recorded_ns; /* a timed event's time of recording (0: not timed) */
    uint32_t magic;
};
#define UM_MEMFD_EVENT_MAGIC 0x42455654u /* "BEVT" */

typedef struct um__memfd_backend {
    um__backend base; /* first: the ops receive &base */
    pthread_mutex_t lock;
    int fd;
    size_t os_page; /* sysconf(_SC_PAGESIZE) */

    /* Physical pages: `used` is the truth; `stack` holds pages released as
     * one-page chunks (the hot case), `instack` keeps it free of
     * duplicates. An entry may be stale (taken since by a multi-page
     * chunk); pops check `used`. */
    uint32_t npages;
    uint32_t used_pages;
    uint32_t hint; /* next-fit start for bitmap searches */
    uint32_t stack_len;
    uint32_t *stack;
    uint64_t *used;
    uint64_t *instack;
    um__memfd_page *pages;

    /* Sorted by va, non-overlapping. */
    um__memfd_range *res;
    size_t nres, res_cap;
    size_t nmaps; /* live mappings, all reservations */

    um__memfd_link streams; /* list head of created streams */
    /* A modelled link (base.link_ns_per_byte): when each direction (0: to
     * the device, 1: from it) is free again. Under lock; a copy between two
     * such devices books the sender's "from" and the receiver's "to". */
    uint64_t link_free[2];
    um__bstream default_stream;
    /* Virtual time: the context's index of this device (its routes). */
    int vt_dev;
    /* The next in vmm_memfd.c's registry of live memfd backends. */
    struct um__memfd_backend *registry_next;
} um__memfd_backend;

/* Handles are (generation << 32) | (first page + 1): never 0, and a handle
 * whose chunk was released (and maybe created again) no longer matches. */
static inline uint32_t um__memfd_handle_page(um__phys h)
{
    return (uint32_t)h - 1u;
}
static inline uint32_t um__memfd_handle_gen(um__phys h)
{
    return (uint32_t)(h >> 32);
}

/* Shared by the host and sim constructors: validates the granularity and
 * capacity (the host's default of physical RAM is applied by its caller),
 * allocates the backend with um__memfd_ops, creates and sizes the memfd. */
um_status um__memfd_backend_create(um_device_kind kind, const char *name, size_t capacity,
                                   size_t granularity, um__backend **out);

/* The one ops table of memfd backends; a backend is a memfd backend iff its
 * ops point here. */
extern const um__backend_ops um__memfd_ops;

/* The stream s names on b (NULL: the default stream), or NULL after
 * um__fail(UM_ERR_INVALID) when s is not a live stream of b. */
um__bstream *um__memfd_stream(um__backend *b, um__bstream *s, const char *what);

/* Whether p lies in one of b's reservations (b a memfd backend). */
bool um__memfd_holds(um__backend *b, const void *p);

#endif /* UM_VMM_MEMFD_H */
