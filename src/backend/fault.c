/*
 * Fault injection (the `fault` option): a backend that forwards every call
 * to the backend it wraps, fails the calls a plan names, and keeps count of
 * what the layers above hold (reservations, chunks, mapped bytes, streams,
 * events), so that a leak after a failure shows at shutdown. See backend.h.
 */
#include "backend.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum fault_kind {
    FK_RESERVE,
    FK_UNRESERVE,
    FK_CREATE,
    FK_RELEASE,
    FK_MAP,
    FK_UNMAP,
    FK_COPY,   /* copy, copy_async, memset_async */
    FK_EVENT,  /* event_record, event_query, event_sync */
    FK_STREAM, /* stream_create, stream_destroy, stream_sync, stream_wait, stream_wrap */
    FK_ANY,
    FK_COUNT
};

static const char *const kind_names[FK_COUNT] = {"reserve", "unreserve", "create", "release",
                                                 "map",     "unmap",     "copy",   "event",
                                                 "stream",  "any"};

#define MAX_RULES 16

typedef struct fault_rule {
    int dev;            /* -1: every device */
    enum fault_kind kind;
    uint64_t nth;       /* 0: random */
    double p;           /* random: the probability of each call */
    _Atomic uint64_t seen; /* calls of the rule's kind on its devices */
} fault_rule;

struct um__fault_plan {
    fault_rule rules[MAX_RULES];
    int nrules;
    uint64_t seed;
    char spec[256];
    _Atomic uint64_t fired;
};

static _Atomic uint64_t leaks_total;

uint64_t um__fault_leaks_total(void) { return atomic_load(&leaks_total); }

uint64_t um__fault_fired(const um__fault_plan *p) { return p ? atomic_load(&p->fired) : 0; }

static um_status bad_spec(const char *spec, const char *item, size_t len, const char *why)
{
    return um__fail(UM_ERR_BAD_OPTION, "option 'fault': '%.*s' in '%s': %s", (int)len, item, spec,
                    why);
}

/* A probability written as digits with at most one '.' ("0.25", "1", ".5"),
 * from 0 to 1, read by hand: strtod would take leading spaces, hex, "1e-400"
 * (quietly 0) and the locale's decimal point. */
static double parse_probability(const char *c, const char *end, bool *ok)
{
    double p = 0.0, scale = 1.0;
    bool digits = false, dot = false;
    for (; c < end; c++) {
        if (*c >= '0' && *c <= '9') {
            digits = true;
            if (dot)
                p += (*c - '0') * (scale /= 10.0);
            else
                p = p * 10.0 + (*c - '0');
        } else if (*c == '.' && !dot) {
            dot = true;
        } else {
            break;
        }
    }
    *ok = c == end && digits && p <= 1.0;
    return p;
}

um_status um__fault_plan_parse(const char *spec, int seed, um__fault_plan **out)
{
    *out = NULL;
    if (!spec || !*spec)
        return UM_OK;
    um__fault_plan *p = calloc(1, sizeof *p);
    if (!p)
        return um__fail(UM_ERR_NOMEM, "option 'fault': no memory for the plan");
    p->seed = (uint64_t)seed;
    snprintf(p->spec, sizeof p->spec, "%s", spec);
    for (const char *item = spec; *item;) {
        size_t len = strcspn(item, "+");
        um_status st = UM_OK;
        if (p->nrules == MAX_RULES) {
            st = bad_spec(spec, item, len, "more than 16 rules");
        } else {
            fault_rule *r = &p->rules[p->nrules];
            const char *c = item, *end = item + len;
            char *num_end;
            r->dev = -1;
            if (c < end && *c >= '0' && *c <= '9') {
                long d = strtol(c, &num_end, 10);
                if (num_end >= end || *num_end != ':' || d >= 64) {
                    /* Nothing after it is read: num_end may be the end. */
                    free(p);
                    return bad_spec(spec, item, len, "a device index is followed by ':' and "
                                                     "is below 64");
                }
                r->dev = (int)d;
                c = num_end + 1;
            }
            size_t klen = strcspn(c, "@~+");
            int kind = -1;
            for (int k = 0; k < FK_COUNT; k++)
                if (strlen(kind_names[k]) == klen && !strncmp(c, kind_names[k], klen))
                    kind = k;
            if (st == UM_OK && kind < 0)
                st = bad_spec(spec, item, len, "unknown kind (reserve, unreserve, create, "
                                               "release, map, unmap, copy, event, stream, any)");
            r->kind = (enum fault_kind)(kind < 0 ? 0 : kind);
            c += klen;
            if (st == UM_OK && c < end && *c == '@') {
                errno = 0;
                unsigned long long n = strtoull(c + 1, &num_end, 10);
                /* strtoull would skip spaces and take "-1" as 2^64-1; a
                 * number past 2^64-1 comes back as 2^64-1 with ERANGE. */
                if (num_end != end || n == 0 || errno == ERANGE ||
                    !(c[1] >= '0' && c[1] <= '9'))
                    st = bad_spec(spec, item, len, "'@' needs a call number of 1 or more");
                r->nth = n;
            } else if (st == UM_OK && c < end && *c == '~') {
                bool ok;
                r->p = parse_probability(c + 1, end, &ok);
                if (!ok)
                    st = bad_spec(spec, item, len, "'~' needs a probability from 0 to 1");
            } else if (st == UM_OK) {
                st = bad_spec(spec, item, len, "expected KIND@N or KIND~P");
            }
        }
        if (st != UM_OK) {
            free(p);
            return st;
        }
        p->nrules++;
        item += len;
        if (*item == '+' && !*++item) {
            free(p);
            return bad_spec(spec, item - 1, 1, "a '+' with no rule after it");
        }
    }
    *out = p;
    return UM_OK;
}

void um__fault_plan_free(um__fault_plan *p) { free(p); }

int um__fault_plan_max_dev(const um__fault_plan *p)
{
    int max = -1;
    for (int i = 0; p && i < p->nrules; i++)
        if (p->rules[i].dev > max)
            max = p->rules[i].dev;
    return max;
}

/* splitmix64: the random rules' draw for call n, the same for a seed and
 * a call order. */
static double draw(uint64_t seed, uint64_t n)
{
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + n + 0x632be59bd9b4e019ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

typedef struct fault_backend {
    um__backend base;
    um__backend *inner;
    um__fault_plan *plan;
    int dev;
    _Atomic long reservations, chunks, streams, events;
    _Atomic long long mapped_bytes;
} fault_backend;

static fault_backend *fb(um__backend *b) { return (fault_backend *)b; }

/* True (after um__fail) when the plan fails this call of kind k. */
static bool fails(fault_backend *f, enum fault_kind k, um_status *st)
{
    um__fault_plan *p = f->plan;
    /* Every rule the call matches counts it, also after one fires: each
     * rule's "Nth call" counts the calls of its kind, whatever the other
     * rules do. */
    int fire = -1;
    uint64_t fire_n = 0;
    for (int i = 0; i < p->nrules; i++) {
        fault_rule *r = &p->rules[i];
        if ((r->kind != k && r->kind != FK_ANY) || (r->dev >= 0 && r->dev != f->dev))
            continue;
        uint64_t n = atomic_fetch_add(&r->seen, 1) + 1;
        if (fire < 0 && (r->nth ? n == r->nth : draw(p->seed + (uint64_t)i, n) < r->p)) {
            fire = i;
            fire_n = n;
        }
    }
    if (fire < 0)
        return false;
    atomic_fetch_add(&p->fired, 1);
    const char *rule_kind = kind_names[p->rules[fire].kind];
    um__log(UM_LOG_INFO, "fault: %s: failing call %llu of kind '%s' (%s)", f->inner->name,
            (unsigned long long)fire_n, rule_kind, kind_names[k]);
    /* A device running out is what a failed create means. */
    *st = um__fail(k == FK_CREATE ? UM_ERR_NOMEM : UM_ERR_BACKEND,
                   "%s: injected failure of call %llu of kind '%s' (fault=%s)", f->inner->name,
                   (unsigned long long)fire_n, rule_kind, p->spec);
    return true;
}

#define FORWARD(kind, op, ...)                                                                     \
    fault_backend *f = fb(b);                                                                      \
    um_status st_;                                                                                 \
    if (fails(f, kind, &st_))                                                                      \
        return st_;                                                                                \
    return f->inner->ops->op(f->inner, __VA_ARGS__)

/* The same, counting `counter` up (delta > 0) or down on success. */
#define FORWARD_COUNTED(kind, counter, delta, op, ...)                                             \
    fault_backend *f = fb(b);                                                                      \
    um_status st_;                                                                                 \
    if (fails(f, kind, &st_))                                                                      \
        return st_;                                                                                \
    st_ = f->inner->ops->op(f->inner, __VA_ARGS__);                                                \
    if (st_ == UM_OK)                                                                              \
        atomic_fetch_add(&f->counter, (delta));                                                    \
    return st_

static um_status f_reserve(um__backend *b, size_t size, uintptr_t *va)
{
    FORWARD_COUNTED(FK_RESERVE, reservations, 1, reserve, size, va);
}
static um_status f_unreserve(um__backend *b, uintptr_t va, size_t size)
{
    FORWARD_COUNTED(FK_UNRESERVE, reservations, -1, unreserve, va, size);
}
/* Placement and reclaim read a device's physical bytes off its backend:
 * the wrapper shows the inner backend's figure. */
static um_status mirror_physical(fault_backend *f, um_status st)
{
    atomic_store(&f->base.physical_bytes, atomic_load(&f->inner->physical_bytes));
    return st;
}
static um_status f_create_counted(um__backend *b, size_t size, um__phys *out)
{
    FORWARD_COUNTED(FK_CREATE, chunks, 1, create, size, out);
}
static um_status f_release_counted(um__backend *b, um__phys h, size_t size)
{
    FORWARD_COUNTED(FK_RELEASE, chunks, -1, release, h, size);
}
static um_status f_create(um__backend *b, size_t size, um__phys *out)
{
    return mirror_physical(fb(b), f_create_counted(b, size, out));
}
static um_status f_release(um__backend *b, um__phys h, size_t size)
{
    return mirror_physical(fb(b), f_release_counted(b, h, size));
}
static um_status f_map(um__backend *b, uintptr_t va, size_t size, um__phys h)
{
    FORWARD_COUNTED(FK_MAP, mapped_bytes, (long long)size, map, va, size, h);
}
static um_status f_unmap_counted(um__backend *b, uintptr_t va, size_t size)
{
    FORWARD_COUNTED(FK_UNMAP, mapped_bytes, -(long long)size, unmap, va, size);
}
/* An unmap frees the memory of a chunk released while it was mapped (as
 * cuMemRelease allows), so it changes the physical bytes too. */
static um_status f_unmap(um__backend *b, uintptr_t va, size_t size)
{
    return mirror_physical(fb(b), f_unmap_counted(b, va, size));
}
static um_status f_stream_create(um__backend *b, um__bstream **out)
{
    FORWARD_COUNTED(FK_STREAM, streams, 1, stream_create, out);
}
static um_status f_stream_wrap(um__backend *b, void *native, um__bstream **out)
{
    FORWARD_COUNTED(FK_STREAM, streams, 1, stream_wrap, native, out);
}
static um_status f_stream_destroy(um__backend *b, um__bstream *s)
{
    FORWARD_COUNTED(FK_STREAM, streams, -1, stream_destroy, s);
}
static um_status f_stream_sync(um__backend *b, um__bstream *s)
{
    FORWARD(FK_STREAM, stream_sync, s);
}
static um_status f_stream_query(um__backend *b, um__bstream *s, int *idle)
{
    if (!fb(b)->inner->ops->stream_query)
        return um__fail(UM_ERR_UNSUPPORTED, "%s: stream_query: not supported",
                        fb(b)->inner->name);
    FORWARD(FK_STREAM, stream_query, s, idle);
}
static um_status f_stream_wait(um__backend *b, um__bstream *s, um__backend *eb, um__bevent *e)
{
    /* The event belongs to eb's own backend: unwrapped, as the inner
     * backend reads it. */
    FORWARD(FK_STREAM, stream_wait, s, eb && eb->wrapped ? eb->wrapped : eb, e);
}
static void *f_stream_native(um__backend *b, um__bstream *s)
{
    return fb(b)->inner->ops->stream_native(fb(b)->inner, s);
}
static um_status f_event_record(um__backend *b, um__bstream *s, um__bevent **out)
{
    FORWARD_COUNTED(FK_EVENT, events, 1, event_record, s, out);
}
static um_status f_event_query(um__backend *b, um__bevent *e, int *done)
{
    FORWARD(FK_EVENT, event_query, e, done);
}
static um_status f_event_sync(um__backend *b, um__bevent *e)
{
    FORWARD(FK_EVENT, event_sync, e);
}
static void f_event_destroy(um__backend *b, um__bevent *e)
{
    /* NULL is nothing to destroy (the host and sim backends treat it as
     * free() does); counting it would report -1 events as a leak at
     * shutdown. */
    if (!e)
        return;
    atomic_fetch_sub(&fb(b)->events, 1);
    fb(b)->inner->ops->event_destroy(fb(b)->inner, e);
}
static um_status f_event_record_timed(um__backend *b, um__bstream *s, um__bevent **out)
{
    FORWARD_COUNTED(FK_EVENT, events, 1, event_record_timed, s, out);
}
static um_status f_event_elapsed(um__backend *b, um__bevent *start, um__bevent *end, uint64_t *ns)
{
    FORWARD(FK_EVENT, event_elapsed, start, end, ns);
}
static um_status f_event_time(um__backend *b, um__bevent *e, uint64_t *ns)
{
    FORWARD(FK_EVENT, event_time, e, ns);
}
static void f_event_destroy_timed(um__backend *b, um__bevent *e)
{
    if (!e)
        return;
    atomic_fetch_sub(&fb(b)->events, 1);
    fb(b)->inner->ops->event_destroy_timed(fb(b)->inner, e);
}
static um_status f_copy(um__backend *b, void *dst, const void *src, size_t n, int dir)
{
    FORWARD(FK_COPY, copy, dst, src, n, dir);
}
static um_status f_copy_async(um__backend *b, void *dst, const void *src, size_t n,
                              um__bstream *s)
{
    FORWARD(FK_COPY, copy_async, dst, src, n, s);
}
static um_status f_memset_async(um__backend *b, void *dst, int value, size_t n, um__bstream *s)
{
    FORWARD(FK_COPY, memset_async, dst, value, n, s);
}
static um_status f_mem_info(um__backend *b, size_t *free_bytes, size_t *total)
{
    return fb(b)->inner->ops->mem_info(fb(b)->inner, free_bytes, total);
}
static um_status f_bind_thread(um__backend *b)
{
    um__backend *in = fb(b)->inner;
    return in->ops->bind_thread ? in->ops->bind_thread(in) : UM_OK;
}

/* Whatever the layers above still hold at shutdown is a leak: it is
 * reported and counted (um__fault_leaks_total) before the inner backend
 * goes. */
static void f_destroy(um__backend *b)
{
    fault_backend *f = fb(b);
    long r = atomic_load(&f->reservations), c = atomic_load(&f->chunks);
    long s = atomic_load(&f->streams), e = atomic_load(&f->events);
    long long m = atomic_load(&f->mapped_bytes);
    if (r || c || s || e || m) {
        atomic_fetch_add(&leaks_total, 1);
        um__log(UM_LOG_ERROR,
                "%s: at shutdown %ld reservations, %ld chunks, %lld mapped bytes, %ld streams "
                "and %ld events were not given back (fault=%s)",
                f->inner->name, r, c, m, s, e, f->plan->spec);
    }
    um__backend_destroy(f->inner);
    free(f);
}

/* The wrapper has timed events (and asks its streams whether they are
 * idle, which deciding to time a copy needs) where the backend it wraps
 * has them. */
#define FAULT_OPS                                                                                  \
    .reserve = f_reserve, .unreserve = f_unreserve, .create = f_create, .release = f_release,      \
    .map = f_map, .unmap = f_unmap, .stream_create = f_stream_create,                              \
    .stream_destroy = f_stream_destroy, .stream_sync = f_stream_sync,                              \
    .event_record = f_event_record, .event_query = f_event_query, .event_sync = f_event_sync,      \
    .event_destroy = f_event_destroy, .stream_wrap = f_stream_wrap,                                \
    .stream_native = f_stream_native, .copy = f_copy, .copy_async = f_copy_async,                  \
    .stream_wait = f_stream_wait, .memset_async = f_memset_async, .mem_info = f_mem_info,          \
    .bind_thread = f_bind_thread, .destroy = f_destroy

static const um__backend_ops fault_ops = {FAULT_OPS};
static const um__backend_ops fault_timed_ops = {
    FAULT_OPS,
    .stream_query = f_stream_query,
    .event_record_timed = f_event_record_timed,
    .event_elapsed = f_event_elapsed,
    .event_time = f_event_time,
    .event_destroy_timed = f_event_destroy_timed,
};

um_status um__fault_wrap(um__backend *inner, um__fault_plan *plan, int dev, um__backend **out)
{
    fault_backend *f = calloc(1, sizeof *f);
    if (!f)
        return um__fail(UM_ERR_NOMEM, "option 'fault': no memory for device %d's wrapper", dev);
    /* Everything the layers above read of a backend, as the inner one
     * says; the counters start at 0. */
    f->base.ops = um__be_timed_events(inner) ? &fault_timed_ops : &fault_ops;
    f->base.kind = inner->kind;
    memcpy(f->base.name, inner->name, sizeof f->base.name);
    f->base.capacity = inner->capacity;
    f->base.granularity = inner->granularity;
    f->base.ordinal = inner->ordinal;
    memcpy(f->base.product, inner->product, sizeof f->base.product);
    f->base.cc_major = inner->cc_major;
    f->base.cc_minor = inner->cc_minor;
    memcpy(f->base.pci_bus_id, inner->pci_bus_id, sizeof f->base.pci_bus_id);
    f->base.vmm = inner->vmm;
    f->base.pinned = inner->pinned;
    f->base.link_ns_per_byte = inner->link_ns_per_byte;
    f->base.cheap_timed_events = inner->cheap_timed_events;
    f->base.nominal_gflops = inner->nominal_gflops;
    f->base.wrapped = inner;
    f->inner = inner;
    f->plan = plan;
    f->dev = dev;
    *out = &f->base;
    return UM_OK;
}
