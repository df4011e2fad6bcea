/*
 * events: the event recorder behind the `trace_file` option. Off unless
 * the option names a file. Then each recording thread appends 32-byte
 * binary records to a buffer of its own, without a lock and without
 * formatting; a full buffer goes to a writer thread, which sorts it by time
 * and writes it raw to an unlinked spill file next to the trace. At close
 * the recorder merges the sorted runs and writes Chrome trace JSON
 * (Perfetto, chrome://tracing). Owns the files, the buffers and the writer.
 *
 * Times come from the TSC where it is invariant (a few ns to read, where
 * clock_gettime takes 20-40), mapped to um__now_ns's clock at close; else
 * from um__now_ns, each read made later than the one before.
 *
 * Allocations, frees and the pools' reserved memory also become counter
 * tracks (live, reserved and cached bytes per device): the JSON writer
 * keeps each live block's size by address, so a free needs no size and
 * the counters are exact at every event.
 */
#ifndef UM_EVENTS_H
#define UM_EVENTS_H

#include "../base/base.h"

typedef struct um__events um__events;

typedef enum um__event_kind {
    UM_EVENT_COPY = 0,  /* a copy between devices: a0 bytes, a1 1 if staged or in two hops */
    UM_EVENT_EVICT = 1, /* a replica dropped from dev to make room: a0 bytes, a1 bytes
                         * written back first (src: 1 if they went to the spill file) */
    UM_EVENT_RECLAIM_WAIT = 2, /* an allocation on dev making room itself: a0 bytes asked,
                                * a1 1 if room was made */
    UM_EVENT_RECLAIM_RUN = 3,  /* a background pass on dev: a0 replica bytes before, a1 after */
    UM_EVENT_TASK = 4,         /* a task's compute on dev: a0 its id, a1 1 if it failed; named */
    UM_EVENT_ALLOC = 5,        /* um_malloc on dev: a0 bytes, a1 the block's address */
    UM_EVENT_FREE = 6,         /* um_free on dev: a1 the block's address */
    UM_EVENT_RESERVED = 7,     /* dev's pool holds a0 bytes of backend memory from now on */
    UM_EVENT_BACKEND = 8,      /* a memory call to dev's backend: a0 bytes, a1 the
                                * um__backend_op, plus 256 if it failed */
    UM_EVENT_TRIM = 9,         /* um_trim or a cache limit on dev: a0 bytes given back */
    UM_EVENT_KINDS
} um__event_kind;

/* The backend calls that UM_EVENT_BACKEND names. */
typedef enum um__backend_op {
    UM_BE_OP_RESERVE,
    UM_BE_OP_UNRESERVE,
    UM_BE_OP_CREATE,
    UM_BE_OP_RELEASE,
    UM_BE_OP_MAP,
    UM_BE_OP_UNMAP,
    UM_BE_OP_COUNT
} um__backend_op;

/* Opens path for writing (truncated); NULL after um__fail. ndevices names
 * the tracks. */
um__events *um__events_open(const char *path, int ndevices);
/* The recorder's clock, for an instant's time (um__event_instant_at).
 * Without the TSC (no invariant one, or virtual time) every read returns
 * a time of its own, later than every read before it in any thread, so
 * that events which share a clock reading keep the order they happened in
 * (at most 1 ns an event ahead of the clock while it stands still). */
uint64_t um__events_clock(um__events *e);
/* Adds an event that happens now on device dev: the hot path (a clock read
 * and a 32-byte store). */
void um__event_instant(um__events *e, um__event_kind kind, int dev, uint64_t a0, uint64_t a1);
/* The same at time t of um__events_clock, read earlier (a free's time is
 * taken before the free, so that it precedes the next allocation of the
 * same address in every thread's order). */
void um__event_instant_at(um__events *e, um__event_kind kind, int dev, uint64_t t, uint64_t a0,
                          uint64_t a1);
/* Adds one event that started at start_ns (um__now_ns) and lasted dur_ns,
 * on device dev, from device src (-1: none). */
void um__event_add(um__events *e, um__event_kind kind, int dev, int src, uint64_t start_ns,
                   uint64_t dur_ns, uint64_t a0, uint64_t a1);
/* The same with a name (a task's; the first 31 characters are kept). */
void um__event_add_named(um__events *e, um__event_kind kind, int dev, uint64_t start_ns,
                         uint64_t dur_ns, uint64_t a0, uint64_t a1, const char *name);
/* Writes the JSON, closes, frees. The threads that recorded must have
 * stopped recording into e. */
void um__events_close(um__events *e);

#endif /* UM_EVENTS_H */
