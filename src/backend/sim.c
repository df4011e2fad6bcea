/*
 * sim: a simulated accelerator. Its memory is a memfd in host RAM (so every
 * byte can be checked) with the device's own capacity and granularity, and
 * its streams model queued work: um__sim_stream_launch queues units that
 * stay incomplete until um__sim_stream_complete, a stream synchronize or an
 * event synchronize completes them. That lets tests (and later the run
 * layer) hold work "in flight" and check stream-ordered reuse exactly.
 * Owns nothing beyond what vmm_memfd owns for it.
 */
#include "vmm_memfd.h"

#include "../base/vtime.h"
#include "vdev.h"

um_status um__sim_backend_create(const char *name, size_t capacity, size_t granularity,
                                 size_t link_bytes_per_s, um__backend **out)
{
    um_status st = um__memfd_backend_create(UM_DEVICE_SIM, name, capacity, granularity, out);
    if (st == UM_OK && link_bytes_per_s)
        (*out)->link_ns_per_byte = 1e9 / (double)link_bytes_per_s;
    return st;
}

/* The stream of a sim backend that simulated work goes to. */
static um_status sim_stream(um__backend *b, um__bstream *s, const char *what, um__bstream **out)
{
    if (!b)
        return um__fail(UM_ERR_INVALID, "%s: the backend is NULL", what);
    while (b->wrapped)
        b = b->wrapped;
    if (b->ops != &um__memfd_ops || b->kind != UM_DEVICE_SIM)
        return um__fail(UM_ERR_UNSUPPORTED,
                        "%s: %s: simulated work runs only on sim devices, this is a %s device",
                        b->name, what, um_device_kind_name(b->kind));
    *out = um__memfd_stream(b, s, what);
    return *out ? UM_OK : UM_ERR_INVALID;
}

um_status um__sim_stream_launch(um__backend *b, um__bstream *s, unsigned n)
{
    um__bstream *st = NULL;
    um_status rc = sim_stream(b, s, "sim_stream_launch", &st);
    if (rc == UM_OK)
        atomic_fetch_add_explicit(&st->submitted, n, memory_order_acq_rel);
    return rc;
}

um_status um__sim_stream_complete(um__backend *b, um__bstream *s, unsigned n)
{
    um__bstream *st = NULL;
    um_status rc = sim_stream(b, s, "sim_stream_complete", &st);
    if (rc != UM_OK)
        return rc;
    /* Completes min(n, queued) units. completed is read before submitted,
     * so completed <= submitted holds for the values read even while other
     * threads launch. */
    uint64_t c = atomic_load_explicit(&st->completed, memory_order_acquire);
    for (;;) {
        uint64_t sub = atomic_load_explicit(&st->submitted, memory_order_acquire);
        uint64_t queued = sub - c;
        uint64_t next = c + (n < queued ? n : queued);
        if (next == c || atomic_compare_exchange_weak_explicit(
                             &st->completed, &c, next, memory_order_acq_rel, memory_order_acquire))
            return UM_OK;
    }
}

um_status um__sim_stream_queued(um__backend *b, um__bstream *s, uint64_t *units)
{
    um__bstream *st = NULL;
    um_status rc = sim_stream(b, s, "sim_stream_queued", &st);
    if (rc != UM_OK)
        return rc;
    /* completed first, as in um__sim_stream_complete: never above
     * submitted, so the difference never wraps. */
    uint64_t c = atomic_load_explicit(&st->completed, memory_order_acquire);
    *units = atomic_load_explicit(&st->submitted, memory_order_acquire) - c;
    return UM_OK;
}

um_status um__sim_stream_kernel(um__backend *b, um__bstream *s, uint64_t ns, uint64_t packed_ns)
{
    um__bstream *st = NULL;
    um_status rc = sim_stream(b, s, "sim_stream_kernel", &st);
    if (rc != UM_OK)
        return rc;
    if (!um__vt_on())
        return um__fail(UM_ERR_UNSUPPORTED, "%s: sim_stream_kernel: modelled kernels run only "
                        "in virtual time (option virtual_time)", b->name);
    um__vdev_kernel(st, ns, packed_ns);
    return UM_OK;
}
