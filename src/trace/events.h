/*
 * events: the event recorder behind the `trace_file` option. Off unless
 * the option names a file; then every layer adds compact records (a time,
 * a duration, devices, two numbers) under one lock, and the recorder writes
 * them as Chrome trace JSON (Perfetto, chrome://tracing) in batches and at
 * close. Formatting happens only when a batch is written, never in the
 * calls that record. Owns the file and the pending records.
 *
 * Allocations, frees and the pools' reserved memory also become counter
 * tracks (live, reserved and cached bytes per device): the writer keeps
 * each live block's size by address, so a free needs no size and the
 * counters are exact at every event.
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
    UM_EVENT_KINDS
} um__event_kind;

/* Opens path for writing (truncated); NULL after um__fail. ndevices names
 * the tracks. */
um__events *um__events_open(const char *path, int ndevices);
/* Adds one event that started at start_ns (um__now_ns) and lasted dur_ns,
 * on device dev, from device src (-1: none). */
void um__event_add(um__events *e, um__event_kind kind, int dev, int src, uint64_t start_ns,
                   uint64_t dur_ns, uint64_t a0, uint64_t a1);
/* The same with a name (a task's; the first 31 characters are kept). */
void um__event_add_named(um__events *e, um__event_kind kind, int dev, uint64_t start_ns,
                         uint64_t dur_ns, uint64_t a0, uint64_t a1, const char *name);
/* Writes what is pending and the end of the JSON, closes, frees. */
void um__events_close(um__events *e);

#endif /* UM_EVENTS_H */
