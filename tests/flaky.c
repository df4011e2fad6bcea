/* See flaky.h. */
#include "flaky.h"

#include <stdio.h>
#include <string.h>


static bool flaky_fails(um__backend *b)
{
    flaky *f = (flaky *)b;
    return f->countdown > 0 && --f->countdown == 0;
}

#define FLAKY_FORWARD(op, ...)                                                                     \
    flaky *f = (flaky *)b;                                                                         \
    if (flaky_fails(b))                                                                            \
        return um__fail(UM_ERR_BACKEND, "injected failure of " #op);                               \
    return f->inner->ops->op(f->inner, __VA_ARGS__)

static um_status flaky_reserve(um__backend *b, size_t size, uintptr_t *va)
{
    flaky *f = (flaky *)b;
    if (flaky_fails(b))
        return um__fail(UM_ERR_BACKEND, "injected failure of reserve");
    um_status s = f->inner->ops->reserve(f->inner, size, va);
    f->reservations += s == UM_OK;
    return s;
}
static um_status flaky_unreserve(um__backend *b, uintptr_t va, size_t size)
{
    flaky *f = (flaky *)b;
    if (flaky_fails(b))
        return um__fail(UM_ERR_BACKEND, "injected failure of unreserve");
    um_status s = f->inner->ops->unreserve(f->inner, va, size);
    f->reservations -= s == UM_OK;
    return s;
}
static um_status flaky_create(um__backend *b, size_t size, um__phys *out)
{
    flaky *f = (flaky *)b;
    /* The device running full is the failure a cache must handle. */
    if (flaky_fails(b))
        return um__fail(UM_ERR_NOMEM, "injected failure of create");
    um_status s = f->inner->ops->create(f->inner, size, out);
    f->chunks += s == UM_OK;
    return s;
}
static um_status flaky_release(um__backend *b, um__phys h, size_t size)
{
    flaky *f = (flaky *)b;
    if (flaky_fails(b))
        return um__fail(UM_ERR_BACKEND, "injected failure of release");
    um_status s = f->inner->ops->release(f->inner, h, size);
    f->chunks -= s == UM_OK;
    return s;
}
static um_status flaky_map(um__backend *b, uintptr_t va, size_t size, um__phys h)
{
    flaky *f = (flaky *)b;
    if (flaky_fails(b))
        return um__fail(UM_ERR_BACKEND, "injected failure of map");
    um_status s = f->inner->ops->map(f->inner, va, size, h);
    if (s == UM_OK)
        f->mapped_bytes += (long long)size;
    return s;
}
static um_status flaky_unmap(um__backend *b, uintptr_t va, size_t size)
{
    flaky *f = (flaky *)b;
    if (flaky_fails(b))
        return um__fail(UM_ERR_BACKEND, "injected failure of unmap");
    um_status s = f->inner->ops->unmap(f->inner, va, size);
    if (s == UM_OK)
        f->mapped_bytes -= (long long)size;
    return s;
}
static um_status flaky_stream_create(um__backend *b, um__bstream **out)
{
    FLAKY_FORWARD(stream_create, out);
}
static um_status flaky_stream_destroy(um__backend *b, um__bstream *s)
{
    FLAKY_FORWARD(stream_destroy, s);
}
static um_status flaky_stream_sync(um__backend *b, um__bstream *s)
{
    FLAKY_FORWARD(stream_sync, s);
}
static um_status flaky_event_record(um__backend *b, um__bstream *s, um__bevent **out)
{
    FLAKY_FORWARD(event_record, s, out);
}
static um_status flaky_event_query(um__backend *b, um__bevent *e, int *done)
{
    FLAKY_FORWARD(event_query, e, done);
}
static um_status flaky_event_sync(um__backend *b, um__bevent *e)
{
    FLAKY_FORWARD(event_sync, e);
}
static void flaky_event_destroy(um__backend *b, um__bevent *e)
{
    flaky *f = (flaky *)b;
    f->inner->ops->event_destroy(f->inner, e);
}
/* Copies also count down copy_countdown, so a test can fail the n-th copy
 * alone. */
static bool flaky_copy_fails(um__backend *b)
{
    flaky *f = (flaky *)b;
    return f->copies_fail || (f->copy_countdown > 0 && --f->copy_countdown == 0);
}

static um_status flaky_copy(um__backend *b, void *dst, const void *src, size_t n, int dir)
{
    if (flaky_copy_fails(b))
        return um__fail(UM_ERR_BACKEND, "injected failure of copy");
    FLAKY_FORWARD(copy, dst, src, n, dir);
}
static um_status flaky_stream_wrap(um__backend *b, void *native, um__bstream **out)
{
    FLAKY_FORWARD(stream_wrap, native, out);
}
static void *flaky_stream_native(um__backend *b, um__bstream *s)
{
    flaky *f = (flaky *)b;
    return f->inner->ops->stream_native(f->inner, s);
}
static um_status flaky_copy_async(um__backend *b, void *dst, const void *src, size_t n,
                                  um__bstream *s)
{
    if (flaky_copy_fails(b))
        return um__fail(UM_ERR_BACKEND, "injected failure of copy_async");
    FLAKY_FORWARD(copy_async, dst, src, n, s);
}
static um_status flaky_stream_wait(um__backend *b, um__bstream *s, um__backend *eb, um__bevent *e)
{
    FLAKY_FORWARD(stream_wait, s, eb, e);
}
static um_status flaky_memset_async(um__backend *b, void *dst, int value, size_t n,
                                    um__bstream *s)
{
    FLAKY_FORWARD(memset_async, dst, value, n, s);
}
static um_status flaky_mem_info(um__backend *b, size_t *free_bytes, size_t *total)
{
    FLAKY_FORWARD(mem_info, free_bytes, total);
}
static void flaky_destroy(um__backend *b)
{
    UM_UNUSED(b);
}

static const um__backend_ops flaky_ops = {
    .reserve = flaky_reserve,
    .unreserve = flaky_unreserve,
    .create = flaky_create,
    .release = flaky_release,
    .map = flaky_map,
    .unmap = flaky_unmap,
    .stream_create = flaky_stream_create,
    .stream_destroy = flaky_stream_destroy,
    .stream_sync = flaky_stream_sync,
    .event_record = flaky_event_record,
    .event_query = flaky_event_query,
    .event_sync = flaky_event_sync,
    .event_destroy = flaky_event_destroy,
    .stream_wrap = flaky_stream_wrap,
    .stream_native = flaky_stream_native,
    .copy = flaky_copy,
    .copy_async = flaky_copy_async,
    .stream_wait = flaky_stream_wait,
    .memset_async = flaky_memset_async,
    .mem_info = flaky_mem_info,
    .destroy = flaky_destroy,
};


void flaky_init(flaky *f, um__backend *inner)
{
    memset(f, 0, sizeof *f);
    f->inner = inner;
    f->base.ops = &flaky_ops;
    f->base.kind = inner->kind;
    snprintf(f->base.name, sizeof f->base.name, "flaky");
    f->base.capacity = inner->capacity;
    f->base.granularity = inner->granularity;
    um__backend_no_driver_info(&f->base);
    f->base.link_ns_per_byte = inner->link_ns_per_byte;
}
