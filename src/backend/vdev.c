/*
 * vdev: memfd streams in virtual time (vdev.h says what it models).
 *
 * A stream's queue runs its head: a kernel until its end, a copy until its
 * flow completes in the net, a wait until the other stream's mark is done.
 * When the head ends the next one starts at that instant. Everything here
 * runs under the clock's lock: the clock calls next() and advance() with
 * it held, and the calls from the backend take it.
 */
#include "vdev.h"

#include "../base/flow.h"
#include "../base/vtime.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum { OP_KERNEL, OP_COPY, OP_WAIT } op_kind;

typedef struct um__vdev_op {
    struct um__vdev_op *next;
    op_kind kind;
    bool started;
    uint64_t end_ns;       /* a started kernel's end */
    uint64_t ns;           /* a kernel's duration alone on the device */
    uint64_t packed_ns;    /* and behind another kernel (vdev.h) */
    double bytes;          /* a copy's */
    int src, dst;          /* a copy's devices */
    um__bstream *other;    /* a wait's stream and mark (NULL: that stream is gone) */
    uint64_t mark;
} vop;

#define MAX_DEV 64

static struct {
    bool on;
    int ndev;
    um__backend *dev[MAX_DEV];
    int nres;
    double *capacity;
    um__vdev_route *route;
    um__vs_net *net;
    um__bstream *busy; /* streams with work */
    /* When each device's compute is free: its kernels run one at a time,
     * in the order they reach the heads of its streams, each behind
     * another taking its packed time. */
    uint64_t compute_free[MAX_DEV];
} vd;

static double to_s(uint64_t ns) { return (double)ns / 1e9; }

static void forget_locked(um__bstream *s);

static bool mark_done(const um__bstream *s, uint64_t mark) { return s->vt_done >= mark; }

/* --------------------------------------------------------------- queues */

static void list_add(um__bstream *s)
{
    if (!s->vt_listed) {
        s->vt_listed = true;
        s->vt_next = vd.busy;
        vd.busy = s;
    }
}

static void list_remove(um__bstream *s)
{
    if (!s->vt_listed)
        return;
    for (um__bstream **p = &vd.busy; *p; p = &(*p)->vt_next)
        if (*p == s) {
            *p = s->vt_next;
            break;
        }
    s->vt_listed = false;
    s->vt_next = NULL;
}

static const um__vdev_route *route_of(int src, int dst)
{
    static const um__vdev_route none = {0};
    if (src == dst || src < 0 || dst < 0 || src >= vd.ndev || dst >= vd.ndev || !vd.route)
        return &none;
    return &vd.route[src * vd.ndev + dst];
}

/* s's head work is done. */
static void pop_head(um__bstream *s)
{
    vop *o = s->vt_head;
    s->vt_head = o->next;
    if (!s->vt_head)
        s->vt_tail = NULL;
    s->vt_done++;
    free(o);
}

/* Starts s's head work at time t, completing at once what takes no time;
 * true when something completed. */
static bool start_head(um__bstream *s, uint64_t t)
{
    bool any = false;
    for (vop *o = s->vt_head; o && !o->started; o = s->vt_head) {
        bool done = false;
        if (o->kind == OP_KERNEL) {
            int dev = ((um__memfd_backend *)s->owner)->vt_dev;
            /* A kernel that waits for the device's previous one would
             * have run beside it on a GPU's streams: it adds its packed
             * time (machine.h). */
            bool behind = vd.compute_free[dev] > t;
            uint64_t start = behind ? vd.compute_free[dev] : t;
            o->end_ns = start + (behind ? o->packed_ns : o->ns);
            vd.compute_free[dev] = o->end_ns;
            done = o->end_ns == t;
        } else if (o->kind == OP_COPY) {
            const um__vdev_route *r = route_of(o->src, o->dst);
            if ((r->n == 0 || o->bytes <= 0.0) && r->latency_s <= 0.0) {
                done = true;
            } else {
                double now = to_s(t);
                if (now < um__vs_net_now(vd.net))
                    now = um__vs_net_now(vd.net);
                if (um__vs_net_start(vd.net, now, r->res, o->bytes > 0.0 ? r->n : 0, o->bytes,
                                     r->latency_s, (uint64_t)(uintptr_t)s) != 0)
                    done = true; /* cannot happen with a checked route */
            }
        } else {
            done = !o->other || mark_done(o->other, o->mark);
        }
        if (!done && o->kind == OP_WAIT)
            break; /* looked at again after every event */
        o->started = true;
        if (!done)
            break;
        pop_head(s);
        any = true;
    }
    if (!s->vt_head)
        list_remove(s);
    return any;
}

static void complete_head(um__bstream *s, uint64_t t)
{
    if (!s->vt_head)
        return;
    pop_head(s);
    start_head(s, t);
}

/* Waits whose mark became done start their streams' next work. */
static void settle(uint64_t t)
{
    for (bool again = true; again;) {
        again = false;
        for (um__bstream *s = vd.busy; s; s = s->vt_next)
            if (s->vt_head && !s->vt_head->started && start_head(s, t)) {
                again = true;
                break; /* the list may have changed */
            }
    }
}

static void enqueue(um__bstream *s, vop *o)
{
    uint64_t now = um__vt_now();
    o->next = NULL;
    if (s->vt_tail)
        s->vt_tail->next = o;
    else
        s->vt_head = o;
    s->vt_tail = o;
    s->vt_queued++;
    list_add(s);
    if (s->vt_head == o)
        start_head(s, now);
    settle(now);
    um__vt_model_changed_locked();
}

/* ---------------------------------------------------------- the model */

/* The clock's nanosecond at or after the net's time n (seconds). */
static double net_ns(double n)
{
    return ceil(n * 1e9);
}

static uint64_t model_next(void *self)
{
    UM_UNUSED(self);
    uint64_t t = UINT64_MAX;
    for (um__bstream *s = vd.busy; s; s = s->vt_next) {
        vop *o = s->vt_head;
        if (o && o->started && o->kind == OP_KERNEL && o->end_ns < t)
            t = o->end_ns;
    }
    double n = um__vs_net_next(vd.net);
    if (isfinite(n)) {
        double ns = net_ns(n);
        uint64_t v = ns <= (double)um__vt_now() ? um__vt_now()
                     : ns >= 0x1p64 ? UINT64_MAX : (uint64_t)ns;
        if (v < t)
            t = v;
    }
    return t;
}

static void model_advance(void *self, uint64_t t)
{
    UM_UNUSED(self);
    /* ns -> s loses a little: the net's next event counts as due when
     * model_next would have named t (or earlier) for it, by the same
     * rounding. A fixed tolerance (1 ns once) is finer than a second's
     * double resolves beyond about 9e6 s of virtual time, where the clock
     * then asked for the same t for ever, the event never due. */
    double ts = to_s(t), next = um__vs_net_next(vd.net);
    if (next > ts && isfinite(next) && net_ns(next) <= (double)t)
        ts = next;
    if (ts < um__vs_net_now(vd.net))
        ts = um__vs_net_now(vd.net);
    uint64_t tags[64];
    for (;;) {
        int k = um__vs_net_advance(vd.net, ts, tags, 64);
        for (int i = 0; i < k; i++)
            complete_head((um__bstream *)(uintptr_t)tags[i], t);
        if (k < 64)
            break;
    }
    for (bool again = true; again;) {
        again = false;
        for (um__bstream *s = vd.busy; s; s = s->vt_next) {
            vop *o = s->vt_head;
            if (o && o->started && o->kind == OP_KERNEL && o->end_ns <= t) {
                complete_head(s, t);
                again = true;
                break;
            }
        }
    }
    settle(t);
}

/* --------------------------------------------------------------- links */

static um_status install(int ndev, int nres, const double *cap, const um__vdev_route *route)
{
    for (int i = 0; i < nres; i++)
        if (!(cap[i] > 0.0) || !isfinite(cap[i]))
            return um__fail(UM_ERR_INVALID, "virtual time: link resource %d has capacity %g "
                            "bytes/s (must be positive and finite)", i, cap[i]);
    for (int i = 0; i < ndev * ndev; i++) {
        if (route[i].n < 0 || route[i].n > UM_VDEV_MAX_ROUTE || !(route[i].latency_s >= 0.0))
            return um__fail(UM_ERR_INVALID, "virtual time: the route from device %d to %d is "
                            "malformed", i / ndev, i % ndev);
        for (int k = 0; k < route[i].n; k++)
            if (route[i].res[k] < 0 || route[i].res[k] >= nres)
                return um__fail(UM_ERR_INVALID, "virtual time: the route from device %d to %d "
                                "names resource %d of %d", i / ndev, i % ndev, route[i].res[k],
                                nres);
    }
    double *c = malloc(((size_t)nres + 1) * sizeof *c);
    um__vdev_route *r = malloc((size_t)ndev * (size_t)ndev * sizeof *r);
    um__vs_net *net = um__vs_net_create(nres, cap);
    if (!c || !r || !net) {
        free(c);
        free(r);
        um__vs_net_destroy(net);
        return um__fail(UM_ERR_NOMEM, "virtual time: no memory for %d links", nres);
    }
    memcpy(c, cap, (size_t)nres * sizeof *c);
    memcpy(r, route, (size_t)ndev * (size_t)ndev * sizeof *r);
    um__vt_lock();
    if (vd.busy) {
        um__vt_unlock();
        free(c);
        free(r);
        um__vs_net_destroy(net);
        return um__fail(UM_ERR_BUSY, "virtual time: links cannot change while copies run");
    }
    free(vd.capacity);
    free(vd.route);
    um__vs_net_destroy(vd.net);
    vd.capacity = c;
    vd.route = r;
    vd.net = net;
    vd.nres = nres;
    /* The net's time starts at 0; it catches up at its first copy. */
    um__vt_unlock();
    return UM_OK;
}

um_status um__vdev_set_links(const um__vdev_links *l)
{
    if (!l || l->ndev != vd.ndev || l->nres < 0 || (l->nres && !l->capacity) || !l->route)
        return um__fail(UM_ERR_INVALID, "virtual time: links for %d devices given for a context "
                        "of %d", l ? l->ndev : -1, vd.ndev);
    return install(l->ndev, l->nres, l->capacity, l->route);
}

um_status um__vdev_start(um__backend *const *devices, int ndev)
{
    if (ndev < 1 || ndev > MAX_DEV)
        return um__fail(UM_ERR_INVALID, "virtual time: %d devices (at most %d)", ndev, MAX_DEV);
    memset(&vd, 0, sizeof vd);
    vd.ndev = ndev;
    for (int i = 0; i < ndev; i++) {
        /* The memfd backend itself, under any wrapper (the fault option's):
         * its streams and memory are the ones modelled. */
        um__backend *b = devices[i];
        while (b->wrapped)
            b = b->wrapped;
        /* Only a memfd backend has the fields the model keeps in it; any
         * other (CUDA's pinned host memory) would be written over. */
        if (b->ops != &um__memfd_ops)
            return um__fail(UM_ERR_INVALID,
                            "virtual time: device %d (%s) is not a host or sim device", i,
                            b->name);
        vd.dev[i] = b;
        ((um__memfd_backend *)b)->vt_dev = i;
    }
    /* Each sim device's modelled link to the host: resource 2i into it,
     * 2i + 1 out of it; a copy between two crosses both through the host. */
    double cap[2 * MAX_DEV];
    um__vdev_route *route = calloc((size_t)ndev * (size_t)ndev, sizeof *route);
    if (!route)
        return um__fail(UM_ERR_NOMEM, "virtual time: no memory for the routes");
    int nres = 0, in[MAX_DEV], out[MAX_DEV];
    for (int i = 0; i < ndev; i++) {
        in[i] = out[i] = -1;
        double per = devices[i]->link_ns_per_byte;
        if (per > 0.0) {
            in[i] = nres;
            cap[nres++] = 1e9 / per;
            out[i] = nres;
            cap[nres++] = 1e9 / per;
        }
    }
    for (int s = 0; s < ndev; s++)
        for (int d = 0; d < ndev; d++) {
            um__vdev_route *r = &route[s * ndev + d];
            if (s != d && out[s] >= 0)
                r->res[r->n++] = out[s];
            if (s != d && in[d] >= 0)
                r->res[r->n++] = in[d];
        }
    vd.on = true;
    um_status st = install(ndev, nres, cap, route);
    free(route);
    if (st != UM_OK) {
        vd.on = false;
        return st;
    }
    um__vt_model m = {model_next, model_advance, NULL};
    um__vt_set_model(&m);
    return UM_OK;
}

void um__vdev_stop(void)
{
    if (!vd.on)
        return;
    um__vt_set_model(NULL);
    um__vt_lock();
    while (vd.busy)
        forget_locked(vd.busy);
    um__vt_unlock();
    free(vd.capacity);
    free(vd.route);
    um__vs_net_destroy(vd.net);
    memset(&vd, 0, sizeof vd);
}

/* ------------------------------------------------------ stream calls */

/* The device whose memory holds p; memory of no device is the host's. */
static int device_of(const void *p, um__backend *hint)
{
    if (hint && um__memfd_holds(hint, p))
        return ((um__memfd_backend *)hint)->vt_dev;
    for (int i = 0; i < vd.ndev; i++)
        if (vd.dev[i] != hint && um__memfd_holds(vd.dev[i], p))
            return i;
    return 0;
}

static vop *new_op(op_kind k)
{
    vop *o = calloc(1, sizeof *o);
    if (!o)
        um__log(UM_LOG_ERROR, "virtual time: no memory for a stream's work; it takes no time");
    else
        o->kind = k;
    return o;
}

void um__vdev_copy(um__backend *b, void *dst, const void *src, size_t n, um__bstream *s)
{
    /* Looked up before the clock's lock: the backends' locks come first. */
    int from = device_of(src, b), to = device_of(dst, b);
    vop *o = new_op(OP_COPY);
    if (!o)
        return;
    o->bytes = (double)n;
    o->src = from;
    o->dst = to;
    um__vt_lock();
    enqueue(s, o);
    um__vt_unlock();
}

void um__vdev_kernel(um__bstream *s, uint64_t ns, uint64_t packed_ns)
{
    vop *o = new_op(OP_KERNEL);
    if (!o)
        return;
    o->ns = ns;
    o->packed_ns = packed_ns;
    um__vt_lock();
    enqueue(s, o);
    um__vt_unlock();
}

void um__vdev_stream_wait(um__bstream *s, um__bstream *es, uint64_t mark)
{
    if (s == es)
        return; /* a stream is in order with itself */
    if (um__vdev_done(es, mark))
        return;
    vop *o = new_op(OP_WAIT);
    if (!o)
        return;
    o->other = es;
    o->mark = mark;
    um__vt_lock();
    enqueue(s, o);
    um__vt_unlock();
}

uint64_t um__vdev_mark(um__bstream *s)
{
    um__vt_lock();
    uint64_t m = s->vt_queued;
    um__vt_unlock();
    return m;
}

bool um__vdev_done(um__bstream *s, uint64_t mark)
{
    um__vt_lock();
    bool done = mark_done(s, mark);
    um__vt_unlock();
    return done;
}

void um__vdev_wait(um__bstream *s, uint64_t mark)
{
    um__vt_lock();
    while (s->vt_done < mark)
        um__vt_wait_model_locked();
    um__vt_unlock();
}

/* Lock held. A started copy's flow stays in the net; the backend forgets
 * only streams it has waited for, so none is left there. Other streams'
 * waits for s, queued behind their own work, are done: s's work is (a
 * stream is destroyed after it), and s is about to be freed. */
static void forget_locked(um__bstream *s)
{
    while (s->vt_head) {
        vop *o = s->vt_head;
        s->vt_head = o->next;
        free(o);
    }
    s->vt_tail = NULL;
    list_remove(s);
    bool waits = false;
    for (um__bstream *w = vd.busy; w; w = w->vt_next)
        for (vop *o = w->vt_head; o; o = o->next)
            if (o->kind == OP_WAIT && o->other == s) {
                o->other = NULL;
                waits = true;
            }
    if (waits) {
        settle(um__vt_now());
        um__vt_model_changed_locked();
    }
}

void um__vdev_forget(um__bstream *s)
{
    um__vt_lock();
    forget_locked(s);
    um__vt_unlock();
}
