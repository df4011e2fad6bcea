/*
 * vdev: the device model of virtual time (base/vtime.h) for memfd devices
 * (the host and sim devices). While virtual time is on, their streams run
 * queued work in virtual time instead of at once: a copy is a flow over
 * the machine's link resources (base/flow.h: latency, then a max-min fair
 * share of every link it crosses), a modelled kernel takes its duration
 * (its packed one when it waited for the device's previous kernel: on a
 * GPU the two would have run side by side on their streams),
 * a stream wait holds the stream until another stream's mark is done. No
 * data moves: memory is address space only (the memfd's pages are never
 * touched), so machines far larger than this one can be modelled.
 *
 * Owns the link table, the net, and every stream's queue of work (the
 * queue lives in the stream, um__bstream, and is changed only under the
 * clock's lock).
 */
#ifndef UM_VDEV_H
#define UM_VDEV_H

#include "vmm_memfd.h"

#define UM_VDEV_MAX_ROUTE 4

/* The machine's links between devices 0..ndev-1 (the context's indices).
 * route[src * ndev + dst]: the resources a copy crosses and its latency. */
typedef struct um__vdev_route {
    int n;
    int res[UM_VDEV_MAX_ROUTE];
    double latency_s;
} um__vdev_route;

typedef struct um__vdev_links {
    int ndev;
    int nres;
    const double *capacity;       /* bytes per second, nres of them */
    const um__vdev_route *route;  /* ndev x ndev */
} um__vdev_links;

/* Installs the model as the clock's (virtual time must be on), with each
 * sim device's link to the host from its backend's link_ns_per_byte (none:
 * copies take no time) until um__vdev_set_links gives the machine's.
 * Every device must be a memfd backend (host or sim; under any wrapper),
 * else UM_ERR_INVALID. */
um_status um__vdev_start(um__backend *const *devices, int ndev);
void um__vdev_stop(void);
/* Replaces the links (copied). Bad routes (resource out of range) fail. */
um_status um__vdev_set_links(const um__vdev_links *l);

/* Stream work, called by vmm_memfd in virtual time. s is a memfd stream. */
void um__vdev_copy(um__backend *b, void *dst, const void *src, size_t n, um__bstream *s);
void um__vdev_kernel(um__bstream *s, uint64_t ns, uint64_t packed_ns);
/* Orders s's later work after es's work up to its mark. */
void um__vdev_stream_wait(um__bstream *s, um__bstream *es, uint64_t mark);
/* The mark of everything queued on s so far; whether it is done; waiting
 * for it. */
uint64_t um__vdev_mark(um__bstream *s);
bool um__vdev_done(um__bstream *s, uint64_t mark);
void um__vdev_wait(um__bstream *s, uint64_t mark);
/* s is about to be freed: its work is dropped (the caller has waited). */
void um__vdev_forget(um__bstream *s);

#endif /* UM_VDEV_H */
