/*
 * Recording allocations and frees (the `trace_file` option): while a trace
 * is recorded, a device's allocator gets a copy of its operations whose
 * alloc and free also record an event, and whose destroy puts the original
 * operations back. The allocator itself is not wrapped: every other
 * operation and every field of its header stay as they are, so the public
 * calls reach the recording through the same indirect call they make
 * anyway, and a call that is not recorded tests for nothing.
 */
#include "pool.h"
#include "../trace/events.h"

#include <stddef.h>
#include <stdlib.h>

typedef struct recording_ops {
    um__allocator_ops ops; /* first: a->ops points here */
    const um__allocator_ops *inner;
    um__events *events;
} recording_ops;

static inline const recording_ops *R(const um__allocator *a)
{
    return (const recording_ops *)(const void *)a->ops;
}

static um_status rec_alloc(um__allocator *a, size_t size, const um__stream_ref *s, void **ptr)
{
    const recording_ops *r = R(a);
    um_status st = r->inner->alloc(a, size, s, ptr);
    if (UM_LIKELY(st == UM_OK))
        um__event_instant(r->events, UM_EVENT_ALLOC, a->dev, size, (uint64_t)(uintptr_t)*ptr);
    return st;
}

/* Whether a free that failed took the block anyway (the debug
 * allocator's report of overwritten guard bytes): then the block is gone
 * from the trace too. The note stays for the caller. */
static bool free_took(void)
{
    if (!um__free_took_take())
        return false;
    um__note_free_took();
    return true;
}

/* The free's time is taken before the block can be reused, so that it
 * precedes the next allocation at its address whichever thread makes it
 * (an allocation's is taken after it). Without the TSC this holds while
 * the clock stands still too, in virtual time: the recorder's clock gives
 * every read a time of its own, later than every read before it. */
static um_status rec_free(um__allocator *a, void *ptr, const um__stream_ref *s)
{
    const recording_ops *r = R(a);
    uint64_t t = um__events_clock(r->events);
    um_status st = r->inner->free(a, ptr, s);
    if (UM_LIKELY(st == UM_OK) || free_took())
        um__event_instant_at(r->events, UM_EVENT_FREE, a->dev, t, 0, (uint64_t)(uintptr_t)ptr);
    return st;
}

static void rec_destroy(um__allocator *a)
{
    recording_ops *r = (recording_ops *)(void *)a->ops;
    a->ops = r->inner;
    free(r);
    a->ops->destroy(a);
}

um_status um__allocator_record(um__allocator *a, um__events *events)
{
    recording_ops *r = malloc(sizeof *r);
    if (!r)
        return um__fail(UM_ERR_NOMEM, "device %d: no memory to record its allocations", a->dev);
    r->ops = *a->ops;
    r->ops.alloc = rec_alloc;
    r->ops.free = rec_free;
    r->ops.destroy = rec_destroy;
    r->inner = a->ops;
    r->events = events;
    a->ops = &r->ops;
    return UM_OK;
}
