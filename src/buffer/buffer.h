/*
 * buffer: unified buffers (buffer.c) and the transfer engine that moves
 * their data (transfer.c).
 *
 * buffer.c owns every um_buffer: its replicas (one per device at most,
 * memory from that device's pool), their coherence state and the fences
 * that order work on them. spill.c owns the file tier below the host
 * (option spill_dir): a buffer whose data has nowhere else to go keeps it
 * in an extent of the spill file, a copy that is valid until the next
 * write. transfer.c owns the per-context engine: the copy
 * streams (one per direction per GPU), the route costs, the per-link
 * statistics, and the replicas of destroyed buffers whose last copies or
 * users are still running. Both sit on the core (devices, streams, pools).
 *
 * Ordering is by fences, never by device-wide synchronisation: a replica's
 * `ready` fence completes when its contents are final (the copy that filled
 * it, or the last writer's work), and its `used` fences when the work that
 * reads it (acquirers' streams, copies out) is done. A copy into a replica
 * waits for both; a copy out of it waits for `ready`.
 */
#ifndef UM_BUFFER_H
#define UM_BUFFER_H

#include "../core/core.h"

/* A point in a stream's work: an event of backend `be` recorded on the
 * stream `stream` (an identity only, to replace older fences of the same
 * stream). ev NULL: nothing to wait for. A fence made by a copy also names
 * its link, to which the copy's time is added once it is seen done. */
typedef struct um__fence {
    um__backend *be;
    um__bevent *ev;
    /* A copy timed on its stream: start is a timed event recorded just
     * before it, and ev is timed too (both destroyed as timed events). */
    um__bevent *start;
    const void *stream;
    uint64_t start_ns; /* the copy's issue */
    uint64_t bytes;    /* the copy's size */
    struct um__xfer *xfer; /* a copy's engine, which counts its time */
    int16_t from, to;  /* the copy's link, or -1 */
    /* No event: the work it stands for (a copy whose end could be
     * neither recorded nor waited for) is queued on `stream`, so an event
     * recorded there later, or a wait for the stream, stands for it. Such
     * a fence owns nothing and may be copied. */
    bool unrecorded;
    /* With unrecorded: a second stream the work is also queued on (the
     * first hops of a two-hop copy), made to precede `stream` once the
     * driver records again. */
    const void *upstream;
} um__fence;

/* An unrecorded fence for the work queued so far on stream s (of be). */
static inline um__fence um__fence_unrecorded(um__backend *be, const void *s)
{
    return (um__fence){.be = be, .stream = s, .from = -1, .to = -1, .unrecorded = true};
}

/* Whether f stands for work that may still run. */
static inline bool um__fence_pending(const um__fence *f)
{
    return f->ev || f->unrecorded;
}

#define UM_FENCE_NONE ((um__fence){.from = -1, .to = -1})
#define UM_REPLICA_USES 4

typedef struct um__replica {
    void *ptr;              /* NULL: no memory on this device */
    uint8_t state;          /* um_replica_state */
    uint32_t readers;       /* read acquisitions held */
    bool writer;            /* a write acquisition is held */
    um__fence ready;
    um__fence used[UM_REPLICA_USES];
    uint32_t nused;
    uint64_t last_use;      /* the engine's clock at its last acquire, release or fill */
    bool evicted;           /* dropped by reclaim since it was last valid */
} um__replica;

#define UM_BUFFER_MAGIC 0x42554646u

struct um_buffer {
    /* UM_BUFFER_MAGIC while the handle is valid: read without the lock
     * (live) and again under it, written under it. */
    _Atomic uint32_t magic;
    um_context *ctx;
    size_t size;
    bool wrapped;           /* the host replica is the program's memory */
    pthread_mutex_t lock;
    struct um_buffer *prev, *next; /* the engine's list of live buffers */
    uint32_t holders;       /* acquisitions held, on every device */
    /* The devices where a replica has memory or is being given it (bit
     * d), kept beside rep[d].ptr: for reclaim, which finds `lock` taken,
     * to judge whether waiting for it could make room. */
    _Atomic uint64_t has_memory;
    /* The write acquisition held is a WRITE_DISCARD of an invalid replica:
     * the other copies stay valid until its release makes that one the
     * owner, so one given back unused (its task did not run) loses nothing.
     * Meanwhile reclaim drops them without writing them back, as data
     * about to be replaced. */
    bool discarding;
    /* Hints (reclaim.c): pinned, WONT_USE until the next acquire, and the
     * announcement tickets of WILL_USE, oldest first. */
    bool pinned, wont_use;
    uint64_t *announced;
    uint32_t nannounced, announced_cap;
    /* The engine's clock at the last acquire, and the time between the
     * last two (0: not seen twice): a guess at the next use. */
    uint64_t last_acquire, reuse_interval;
    /* The file tier: the buffer's extent of the spill file (mapped; NULL
     * none) and whether it holds the newest data. */
    void *spill;
    size_t spill_off;
    bool spill_valid;
    uint32_t *spill_sums;   /* the extent's checksums, while spill_valid */
    um__replica rep[];      /* one per device */
};

typedef struct um__xfer um__xfer;
typedef struct um__reclaim um__reclaim;
typedef struct um__spill um__spill;

/* spill.c: the spill file in `dir` (made now, unlinked at once). */
um_status um__spill_create(const char *dir, um__spill **out);
void um__spill_destroy(um__spill *sp);
/* An extent of at least size bytes with its disk blocks allocated, mapped
 * at *map; *offset identifies it for um__spill_free. UM_ERR_NOMEM naming
 * the file when the disk has no room. */
um_status um__spill_alloc(um__spill *sp, size_t size, void **map, size_t *offset);
/* Before an extent of size bytes at offset is written again: allocates its
 * disk blocks anew, so that a file truncated since gets its size back
 * rather than a store raising SIGBUS. UM_ERR_NOMEM naming the file when
 * the disk has no room. */
um_status um__spill_prepare(um__spill *sp, size_t offset, size_t size);
/* The integrity of extents: a CRC-32 per UM_SPILL_SUM_BYTES, taken by
 * seal when an extent of `size` bytes has been written (sums: room for
 * um__spill_sums(size)); check, before bytes [from, from + n) are read,
 * finds the file truncated or those bytes changed and fails naming it. */
#define UM_SPILL_SUM_BYTES ((size_t)64 << 10)
size_t um__spill_sums(size_t size);
void um__spill_seal(const void *map, size_t size, uint32_t *sums);
um_status um__spill_check(um__spill *sp, const void *map, size_t offset, size_t size,
                          const uint32_t *sums, size_t from, size_t n);
void um__spill_free(um__spill *sp, void *map, size_t offset, size_t size);
/* Bytes of live extents (0 for NULL). */
size_t um__spill_used(um__spill *sp);

/* Frees b whatever its state (acquisitions included), after the work that
 * uses its replicas: for um_shutdown. */
void um__buffer_discard(um_buffer *b);

/* um_buffer_release, and for used == false an acquisition whose holder
 * wrote nothing (a task that failed before it ran): a WRITE_DISCARD one
 * then leaves the buffer's data as it was. */
um_status um__buffer_release(um_buffer *b, int dev, um_stream s, bool used);

/* UM_HINT_WILL_USE made by the task layer for a task's coming use of b:
 * *ticket names the announcement for um__buffer_withdraw (0 when none was
 * made: no memory, or b is not a live buffer). */
um_status um__buffer_announce(um_buffer *b, uint64_t *ticket);
/* Withdraws the announcement `ticket` names (0: none), whose use will not
 * come (its task was cancelled, or failed before it acquired b): each
 * announcement stands for one coming use, and a stale one made reclaim
 * keep b as needed soon, over the program's UM_HINT_WONT_USE, for good.
 * Acquisitions take the oldest announcement, whichever use made it, so
 * when this one was taken the oldest left goes instead. */
void um__buffer_withdraw(um_buffer *b, uint64_t ticket);

/* The context's engine, made on first use. */
um_status um__xfer_get(um_context *ctx, um__xfer **out);

/* A zeroed record for a new buffer, and the record of a destroyed one
 * (its magic cleared), kept for reuse until shutdown. */
um_buffer *um__xfer_record(um__xfer *x);
void um__xfer_recycle(um__xfer *x, um_buffer *b);

/* Adds b to / removes it from the engine's list of live buffers (freed at
 * um_shutdown if the program did not destroy them). */
void um__xfer_track(um__xfer *x, um_buffer *b, bool add);

/* Copies n bytes from src (memory of device sd, or program memory when sd
 * is 0) to dst (of device dd), after the `after` fences; *done is the
 * copy's completion (none when it completed already). A failure with *done
 * unrecorded left the copy queued: dst and src stay its until *done has
 * completed. */
um_status um__xfer_copy(um__xfer *x, int dd, void *dst, int sd, const void *src, size_t n,
                        const um__fence *after, int nafter, um__fence *done);
/* Zeros n bytes at dst (of device dev) after the `after` fences. */
um_status um__xfer_zero(um__xfer *x, int dev, void *dst, size_t n, const um__fence *after,
                        int nafter, um__fence *done);
/* The stream the engine copies into (to = true) or out of device dev with:
 * NULL (the default stream) where copies are synchronous. */
um_stream um__xfer_stream(um__xfer *x, int dev, bool to);
/* Orders what is queued next on dev's copy-in stream after f (a stream
 * wait: the host does not block). Work queued on the engine's streams goes
 * through the engine, so that none lands inside a timed copy's window. */
um_status um__xfer_order_in(um__xfer *x, int dev, const um__fence *f);
/* Estimated nanoseconds to copy n bytes from `from` to `to`. */
double um__xfer_cost(const um__xfer *x, int from, int to, size_t n);
/* Frees ptr (of device dev, from its pool) once the fences have completed;
 * takes them over. */
void um__xfer_free_later(um__xfer *x, int dev, void *ptr, um__fence *fences, int nfences);
/* Frees what um__xfer_free_later holds whose fences have completed;
 * returns the devices (bit d) whose memory some of it was. */
uint64_t um__xfer_poll(um__xfer *x);
/* Waits for the users of the oldest memory of device dev that
 * um__xfer_free_later holds, then frees it: 1; 0 when it holds none; -1
 * (the error set) when the wait failed, and the memory stays held. */
int um__xfer_wait_held(um__xfer *x, int dev);
/* Calls fn(b, arg) for every live buffer, under the engine's lock (which
 * is recursive: fn may call into the engine), until fn returns false. */
void um__xfer_each_buffer(um__xfer *x, bool (*fn)(um_buffer *b, void *arg), void *arg);
/* The engine's logical clock, for least-recently-used order. */
uint64_t um__xfer_tick(um__xfer *x);
/* The context's spill file, made on first use; UM_ERR_NOMEM when the
 * option spill_dir is not set. */
um_status um__xfer_spill(um__xfer *x, um__spill **out);
/* Bytes in the spill file now. */
size_t um__xfer_spilled(um__xfer *x);
/* The engine's reclaim state (reclaim.c). */
struct um__reclaim *um__xfer_reclaim(um__xfer *x);

/* Drops b's replica on dev to make room (b locked, the replica not
 * acquired): an invalid one frees its memory; a valid one with another
 * valid copy (or a valid spill extent) is dropped (that copy becomes the
 * owner if this one was); the only valid copy is first written back to
 * the host or another device with room, whichever is cheaper, and when
 * none has room (always, for the host's own replica) to the spill file.
 * The memory is back in dev's pool on return. UM_ERR_BUSY if it may not be
 * evicted; on a failed write-back the replica stays as it was, and the
 * memory taken for it on a target goes back. *bytes_written: bytes
 * written back (0 if none); *spilled: whether they went to the spill
 * file. */
um_status um__buffer_evict(um_buffer *b, int dev, size_t *bytes_written, bool *spilled);
/* Whether b's replica on dev may be evicted now (b locked): it has memory,
 * is not acquired, b is not pinned (unless the replica is out of date), and
 * a host replica goes only if it is not the program's wrapped memory and,
 * when valid, another valid copy exists or the file tier can take it. */
bool um__buffer_evictable(const um_buffer *b, int dev);
/* Whether a copy other than dev's replica is valid (a spill extent too). */
bool um__buffer_valid_elsewhere(const um_buffer *b, int dev);

/* For placement: whether b's replica on dev is valid; if not, *ns is the
 * estimated time to bring it there (0 for data not written yet). */
bool um__buffer_fetch_cost(um_buffer *b, int dev, double *ns);

/* reclaim.c: made with the engine (started once the engine is in the
 * context: it installs the context's reclaim hook and its thread),
 * stopped before the engine's buffers go. */
struct um__reclaim *um__reclaim_create(um__xfer *x);
void um__reclaim_start(struct um__reclaim *rc, um_context *ctx);
void um__reclaim_destroy(struct um__reclaim *rc);
/* Replica memory on dev grew or shrank by `bytes` (what watermarks count). */
void um__reclaim_account(struct um__reclaim *rc, int dev, int64_t bytes);
/* A destroy begins (+1) or ends (-1) giving back a replica's memory on
 * dev: from when the buffer leaves the engine's list, where reclaim finds
 * candidates, until its memory is freed or held for its last copies,
 * where reclaim finds it too. Meanwhile that memory counts as held by a
 * call in progress. */
void um__reclaim_destroying(struct um__reclaim *rc, int dev, int delta);
/* Marks b as the buffer whose replica this thread is allocating (NULL:
 * none) and returns the one marked before, to put back. Such a buffer is
 * locked and noted with memory on the device from before its allocation,
 * so that other threads' reclaim waits for it as for any call in
 * progress, except while this thread looks for room itself (its replica
 * has none then); this thread's own reclaim passes it over. */
um_buffer *um__reclaim_allocating(um_buffer *b);
/* A buffer got UM_HINT_WILL_USE: the program announces its uses. */
void um__reclaim_announced(struct um__reclaim *rc);
/* Whether a write-back of `bytes` may go to a new replica on dev: always,
 * except from the background reclaimer, whose write-backs must leave dev
 * at or below its high mark (else the reclaimers of two devices passed
 * the same data back and forth for ever). */
bool um__reclaim_write_back_ok(struct um__reclaim *rc, int dev, size_t bytes);
/* Marks this thread's allocations, while on, as ones it can do without
 * (a copy's staging slots: the copy goes unstaged instead): at the limit
 * they evict what may go now but never wait for candidates that calls in
 * progress hold. The caller may hold such a candidate's lock itself (a
 * read staging out of a buffer whose stale host replica is the only
 * candidate), and then waited the full second for nothing. Returns the
 * previous setting, to put back (an eviction inside may stage too). */
bool um__reclaim_optional(bool on);
/* A fill copied into a replica that reclaim had dropped. */
void um__reclaim_refetched(struct um__reclaim *rc, int dev, size_t bytes);


/* Makes *a a fence that completes once both a and b have (b becomes none),
 * through a stream of a's device that waits for both, so the host does not
 * wait. UM_ERR_UNSUPPORTED where a's device has no engine streams. */
um_status um__xfer_join(um__xfer *x, um__fence *a, um__fence *b);
/* True once f has completed (f becomes none then); queries the backend.
 * An unrecorded f gets its event here, where the driver records again. */
bool um__fence_done(um__xfer *x, um__fence *f);
/* The same, telling a failed query apart: *done false and the backend's
 * failure (f is dropped then, as the work it marks cannot be known; an
 * unrecorded f that still cannot be recorded stays). */
um_status um__fence_check(um__xfer *x, um__fence *f, bool *done);
/* Waits on the host until f has completed; f becomes none. */
um_status um__fence_wait(um__xfer *x, um__fence *f);
/* Forgets f (its event is released; the work it marks may still run, or
 * has been waited for through a stream; a copy's time is counted up to
 * now). */
void um__fence_drop(um__fence *f);
/* A fence at the current end of stream s's work (of device dev); none for
 * the host's default stream, whose work is the program's own. */
um_status um__fence_record(um_context *ctx, int dev, um_stream s, um__fence *out);

#endif /* UM_BUFFER_H */
