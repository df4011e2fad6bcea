/*
 * context: owns the um_context (um_init / um_shutdown), its device table
 * (one backend and one allocator per device) and every stream object. The
 * memory calls that run on the hot path (um_malloc, um_free, ...) are in
 * memory.c; they only read what this file built.
 */
#include "core.h"
#include "../backend/cuda_driver.h"
#include "../backend/vdev.h"
#include "../base/vtime.h"

#include <errno.h>
#include <zlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The context as allocated: the shared um_context first, so a um_context
 * pointer is a pointer to this, plus the list of user streams that
 * um_shutdown must destroy if the program did not. The list is guarded by a
 * mutex because streams may be created and destroyed from several threads;
 * um_malloc/um_free never touch it. */
typedef struct stream_node {
    struct um_stream_s s; /* first: a um_stream is a pointer to this */
    struct stream_node *prev, *next;
} stream_node;

/* Stream ids stay below this: pools keep per-stream state indexed by id and
 * pack the id into 24 bits of a small slot's record (UM_SLOT_MAX_STREAM). */
#define MAX_STREAM_ID 0xffffffu

typedef struct id_stack {
    uint32_t *ids;
    size_t n, cap;
} id_stack;

/* Destroyed stream handles kept (magic cleared) before their memory goes
 * back: a handle used after its um_stream_destroy is then reported as not
 * live, as um_stream_device promises, instead of read after it was freed
 * (or taken for a new stream made in its memory). Bounded, so that a
 * program that makes and destroys streams in a loop does not grow. */
#define DEAD_STREAMS_KEPT 4096u

typedef struct context_impl {
    struct um_context pub; /* first: a um_context is a pointer to this */
    pthread_mutex_t lock;
    stream_node streams; /* sentinel of a circular list */
    id_stack free_ids[UM_MAX_DEVICES]; /* ids of destroyed streams, reused first */
    stream_node *dead_head, *dead_tail; /* oldest first, through next */
    unsigned ndead;
    struct context_impl *live_next; /* the process's live contexts (live_list) */
} context_impl;

static context_impl *impl_of(um_context *ctx)
{
    return (context_impl *)ctx;
}


/* ------------------------------------------------------------ devices */

/* Prints "0 host, 1 sim1, ..." into buf; a long table ends in "...". */
static void list_devices(um_context *ctx, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < ctx->ndevices; i++) {
        int w = snprintf(buf + n, len - n, "%s%d %s", i ? ", " : "", i,
                         ctx->devices[i].backend ? ctx->devices[i].backend->name : "?");
        if (w < 0 || (size_t)w >= len - n) {
            if (len >= 4)
                memcpy(buf + len - 4, "...", 4);
            return;
        }
        n += (size_t)w;
    }
}

um_device *um__device(um_context *ctx, int dev, const char *what)
{
    if (!ctx) {
        um__fail(UM_ERR_NO_DEVICE, "%s: device %d: the context is NULL", what, dev);
        return NULL;
    }
    if (UM_LIKELY(dev >= 0 && dev < ctx->ndevices))
        return &ctx->devices[dev];
    char names[320];
    list_devices(ctx, names, sizeof names);
    um__fail(UM_ERR_NO_DEVICE, "%s: device %d does not exist (this context has %d device%s: %s)",
             what, dev, ctx->ndevices, ctx->ndevices == 1 ? "" : "s", names);
    return NULL;
}

int um_device_count(um_context *ctx)
{
    return ctx ? ctx->ndevices : 0;
}

um_status um_device_info_get(um_context *ctx, int dev, um_device_info *out)
{
    if (!ctx || !out)
        return um__fail(UM_ERR_INVALID, "um_device_info_get: %s is NULL", ctx ? "out" : "ctx");
    um_device *d = um__device(ctx, dev, "um_device_info_get");
    if (!d)
        return UM_ERR_NO_DEVICE;
    memset(out, 0, sizeof *out);
    out->index = dev;
    out->kind = d->backend->kind;
    snprintf(out->name, sizeof out->name, "%s", d->backend->name);
    out->capacity = d->backend->capacity;
    out->granularity = d->backend->granularity;
    out->memory_limit = d->alloc->memory_limit;
    out->cache_limit = d->alloc->cache_limit;
    out->allocator = d->alloc->ops->name;
    out->ordinal = d->backend->ordinal;
    out->cc_major = d->backend->cc_major;
    out->cc_minor = d->backend->cc_minor;
    snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "%s", d->backend->pci_bus_id);
    snprintf(out->product, sizeof out->product, "%s", d->backend->product);
    out->vmm = d->backend->vmm;
    out->pinned = d->backend->pinned;
    return UM_OK;
}

um_status um_device_link_get(um_context *ctx, int from, int to, um_link_info *out)
{
    if (!ctx || !out)
        return um__fail(UM_ERR_INVALID, "um_device_link_get: %s is NULL", ctx ? "out" : "ctx");
    memset(out, 0, sizeof *out);
    um_device *a = um__device(ctx, from, "um_device_link_get");
    um_device *b = a ? um__device(ctx, to, "um_device_link_get") : NULL;
    if (!b)
        return UM_ERR_NO_DEVICE;
    int ga = a->backend->ordinal, gb = b->backend->ordinal;
    if (ga >= 0 && gb >= 0)
        return um__cuda_link(ga, gb, out);
    /* Host and sim memory is process memory: every device can reach it,
     * and a device reaches its own; a sim device never reaches a GPU. */
    bool process_memory = a->backend->kind != UM_DEVICE_CUDA && b->backend->kind != UM_DEVICE_CUDA;
    bool host_side = b->backend->kind == UM_DEVICE_HOST && b->backend->pinned;
    out->peer_access = from == to || process_memory || host_side;
    out->native_atomics = from == to;
    out->performance_rank = 0;
    return UM_OK;
}

um_status um_device_memory_get(um_context *ctx, int dev, size_t *free_bytes, size_t *total_bytes)
{
    if (!ctx || !free_bytes || !total_bytes)
        return um__fail(UM_ERR_INVALID, "um_device_memory_get: %s is NULL",
                        !ctx ? "ctx" : !free_bytes ? "free_bytes" : "total_bytes");
    um_device *d = um__device(ctx, dev, "um_device_memory_get");
    if (!d)
        return UM_ERR_NO_DEVICE;
    return um__be_mem_info(d->backend, free_bytes, total_bytes);
}

um_status um_cuda_driver_info(int *version, int *gpus, char *why, size_t why_len)
{
    char reason[256];
    const um__cuda_api *cu = um__cuda_load(reason, sizeof reason);
    if (version)
        *version = cu ? cu->version : 0;
    if (gpus)
        *gpus = cu ? cu->gpus : 0;
    if (why && why_len)
        snprintf(why, why_len, "%s", cu ? "" : reason);
    if (!cu)
        return um__fail(UM_ERR_UNSUPPORTED, "um_cuda_driver_info: %s", reason);
    return UM_OK;
}

/* Fails with st, putting `context` in front of the message the failing
 * layer left. */
static um_status fail_within(um_status st, const char *context)
{
    char inner[400];
    return um__fail(st, "%s: %s", context, um__error_detail(st, inner, sizeof inner));
}

/* ------------------------------------------------- the devices option */

typedef enum spec_kind { SPEC_SIM, SPEC_CUDA } spec_kind;

/* One entry of the devices list, parsed before anything is created so a
 * syntax error costs no backend calls. */
typedef struct device_spec {
    spec_kind kind;
    int count;   /* devices this entry makes (cuda: 0, known once the driver is asked) */
    size_t size; /* bytes per device (sim) */
    int ordinal; /* cuda:N -> N; cuda -> -1 (every GPU) */
} device_spec;

static bool spec_is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Parses "cuda" or "cuda:N". */
static um_status parse_cuda(const char *text, size_t len, device_spec *out)
{
    int shown = len > 80 ? 80 : (int)len;
    out->kind = SPEC_CUDA;
    out->count = 0; /* known only once the driver is asked */
    out->size = 0;
    out->ordinal = -1;
    if (len == 4)
        return UM_OK;
    long n = 0;
    for (size_t i = 5; i < len; i++) {
        if (text[i] < '0' || text[i] > '9' || n > UM_MAX_DEVICES)
            return um__fail(UM_ERR_BAD_OPTION,
                            "option 'devices': entry '%.*s': '%.*s' is not a GPU number from 0 "
                            "to %d",
                            shown, text, (int)(len - 5), text + 5, UM_MAX_DEVICES - 2);
        n = n * 10 + (text[i] - '0');
    }
    if (len == 5 || n > UM_MAX_DEVICES - 2)
        return um__fail(UM_ERR_BAD_OPTION,
                        "option 'devices': entry '%.*s' needs a GPU number from 0 to %d after "
                        "'cuda:'",
                        shown, text, UM_MAX_DEVICES - 2);
    out->ordinal = (int)n;
    return UM_OK;
}

/* Parses "sim:SIZE", "sim:NxSIZE", "cuda" or "cuda:N" (text[0..len), trimmed). */
static um_status parse_entry(const char *text, size_t len, int accelerators, device_spec *out)
{
    int shown = len > 80 ? 80 : (int)len;
    if ((len == 4 && !memcmp(text, "cuda", 4)) || (len >= 5 && !memcmp(text, "cuda:", 5)))
        return parse_cuda(text, len, out);
    if (len < 4 || memcmp(text, "sim:", 4) != 0)
        return um__fail(UM_ERR_BAD_OPTION,
                        "option 'devices': entry '%.*s' is not sim:SIZE, sim:NxSIZE, cuda or "
                        "cuda:N",
                        shown, text);
    const char *p = text + 4, *end = text + len;
    const char *x = memchr(p, 'x', (size_t)(end - p));
    if (!x)
        x = memchr(p, 'X', (size_t)(end - p));
    long count = 1;
    if (x) {
        if (x == p)
            return um__fail(UM_ERR_BAD_OPTION,
                            "option 'devices': entry '%.*s' has no device count before 'x'", shown,
                            text);
        count = 0;
        for (const char *q = p; q < x; q++) {
            if (*q < '0' || *q > '9' || count > UM_MAX_DEVICES)
                return um__fail(UM_ERR_BAD_OPTION,
                                "option 'devices': entry '%.*s': the device count '%.*s' is not a "
                                "number from 1 to %d",
                                shown, text, (int)(x - p), p, UM_MAX_DEVICES - 1);
            count = count * 10 + (*q - '0');
        }
        p = x + 1;
    }
    if (count < 1 || count > UM_MAX_DEVICES - 1)
        return um__fail(UM_ERR_BAD_OPTION,
                        "option 'devices': entry '%.*s': the device count %ld is not from 1 to %d",
                        shown, text, count, UM_MAX_DEVICES - 1);
    char size_text[64];
    if (end == p)
        return um__fail(UM_ERR_BAD_OPTION,
                        "option 'devices': entry '%.*s' needs a device size such as sim:4G", shown,
                        text);
    /* A size too long to be one is named as such, not as a missing size. */
    if ((size_t)(end - p) >= sizeof size_text)
        return um__fail(UM_ERR_BAD_OPTION,
                        "option 'devices': entry '%.*s': the device size is %zu characters long, "
                        "not a size such as 4G",
                        shown, text, (size_t)(end - p));
    memcpy(size_text, p, (size_t)(end - p));
    size_text[end - p] = '\0';
    size_t size;
    um_status st = um_parse_size(size_text, &size);
    if (st != UM_OK) {
        char why[256];
        return um__fail(UM_ERR_BAD_OPTION, "option 'devices': entry '%.*s': %s", shown, text,
                        um__error_detail(st, why, sizeof why));
    }
    if (size == 0)
        return um__fail(UM_ERR_BAD_OPTION,
                        "option 'devices': entry '%.*s': a simulated device needs a size above 0",
                        shown, text);
    if (accelerators + count > UM_MAX_DEVICES - 1)
        return um__fail(UM_ERR_BAD_OPTION,
                        "option 'devices': entry '%.*s' makes %ld more devices after %d; a "
                        "context has at most %d (the host and %d accelerators)",
                        shown, text, count, accelerators, UM_MAX_DEVICES, UM_MAX_DEVICES - 1);
    out->kind = SPEC_SIM;
    out->count = (int)count;
    out->size = size;
    out->ordinal = -1;
    return UM_OK;
}

/* Splits the devices option at ',' and '+' into specs. */
static um_status parse_devices(const char *list, device_spec *specs, int *nspecs)
{
    int n = 0, accelerators = 0;
    const char *p = list;
    const char *all_end = list + strlen(list);
    const char *a = list, *b = all_end;
    while (a < b && spec_is_space(*a))
        a++;
    *nspecs = 0;
    if (a == b)
        return UM_OK; /* host only */
    while (p <= all_end) {
        const char *e = p;
        while (e < all_end && *e != ',' && *e != '+')
            e++;
        const char *s = p, *t = e;
        while (s < t && spec_is_space(*s))
            s++;
        while (t > s && spec_is_space(t[-1]))
            t--;
        if (s == t)
            return um__fail(UM_ERR_BAD_OPTION,
                            "option 'devices': '%.120s' has an empty entry at character %d", list,
                            (int)(p - list) + 1);
        if (n == UM_MAX_DEVICES - 1)
            return um__fail(UM_ERR_BAD_OPTION,
                            "option 'devices': '%.120s' has more than %d entries; a context has "
                            "at most %d devices",
                            list, UM_MAX_DEVICES - 1, UM_MAX_DEVICES);
        um_status st = parse_entry(s, (size_t)(t - s), accelerators, &specs[n]);
        if (st != UM_OK)
            return st;
        accelerators += specs[n].count;
        n++;
        p = e + 1;
    }
    *nspecs = n;
    return UM_OK;
}

/* ------------------------------------------------------------ streams */

static void list_insert(context_impl *impl, stream_node *n)
{
    n->next = impl->streams.next;
    n->prev = &impl->streams;
    impl->streams.next->prev = n;
    impl->streams.next = n;
}

static void list_remove(stream_node *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n;
}

static bool valid_stream(um_context *ctx, um_stream s)
{
    return s && s->magic == UM_STREAM_MAGIC && s->ctx == ctx;
}

/* A stream id of device dev (ids of destroyed streams first), or false
 * when the device has MAX_STREAM_ID streams already. Under impl->lock. */
static bool take_id_locked(um_context *ctx, context_impl *impl, int dev, uint32_t *id)
{
    id_stack *fs = &impl->free_ids[dev];
    *id = fs->n ? fs->ids[--fs->n] : atomic_fetch_add(&ctx->devices[dev].next_stream_id, 1);
    if (*id <= MAX_STREAM_ID)
        return true;
    atomic_fetch_sub(&ctx->devices[dev].next_stream_id, 1);
    return false;
}

/* Makes a destroyed stream's id reusable. Under impl->lock. */
static void give_id_locked(context_impl *impl, int dev, uint32_t id)
{
    id_stack *fs = &impl->free_ids[dev];
    if (fs->n == fs->cap) {
        size_t cap = fs->cap ? fs->cap * 2 : 8;
        uint32_t *ids = realloc(fs->ids, cap * sizeof *ids);
        if (ids) {
            fs->ids = ids;
            fs->cap = cap;
        }
    }
    /* Without room the id is simply not reused. */
    if (fs->n < fs->cap)
        fs->ids[fs->n++] = id;
}

const um__stream_ref *um__stream_host_ref(um_context *ctx, um_stream s)
{
    if (atomic_load_explicit(&s->host_id, memory_order_acquire))
        return &s->host_ref;
    context_impl *impl = impl_of(ctx);
    um__vt_mutex_lock(&impl->lock);
    if (!atomic_load_explicit(&s->host_id, memory_order_relaxed)) {
        uint32_t id;
        if (!take_id_locked(ctx, impl, 0, &id)) {
            um__vt_mutex_unlock(&impl->lock);
            um__fail(UM_ERR_NOMEM,
                     "stream %u of device %d orders host memory, but device 0 already has %u "
                     "streams",
                     s->ref.id, s->dev, MAX_STREAM_ID);
            return NULL;
        }
        s->host_ref.id = id;
        s->host_ref.bstream = s->ref.bstream;
        s->host_ref.backend = ctx->devices[s->dev].backend;
        atomic_store_explicit(&s->host_id, id, memory_order_release);
    }
    um__vt_mutex_unlock(&impl->lock);
    return &s->host_ref;
}

/* um_stream_create (native NULL, wrap false) and um_stream_wrap: the
 * backend stream, an id, and the node on the context's list. */
static um_status stream_new(um_context *ctx, int dev, bool wrap, void *native, um_stream *out,
                            const char *what)
{
    if (!ctx || !out)
        return um__fail(UM_ERR_INVALID, "%s: %s is NULL", what, ctx ? "out" : "ctx");
    *out = NULL;
    um_device *d = um__device(ctx, dev, what);
    if (!d)
        return UM_ERR_NO_DEVICE;
    stream_node *n = calloc(1, sizeof *n);
    if (!n)
        return um__fail(UM_ERR_NOMEM, "%s: device %d: no memory for a stream (%zu bytes)", what,
                        dev, sizeof *n);
    um__bstream *bs = NULL;
    um_status st = wrap ? um__be_stream_wrap(d->backend, native, &bs)
                        : um__be_stream_create(d->backend, &bs);
    if (st != UM_OK) {
        free(n);
        return st;
    }
    /* Id 0 is the default stream. Ids of destroyed streams are reused, so
     * ids (and the pools' per-stream state) stay as few as the streams
     * that exist at once. */
    context_impl *impl = impl_of(ctx);
    um__vt_mutex_lock(&impl->lock);
    uint32_t id;
    if (!take_id_locked(ctx, impl, dev, &id)) {
        um__vt_mutex_unlock(&impl->lock);
        (void)um__be_stream_destroy(d->backend, bs);
        free(n);
        return um__fail(UM_ERR_NOMEM, "%s: device %d already has %u streams", what, dev,
                        MAX_STREAM_ID);
    }
    n->s.ctx = ctx;
    n->s.dev = dev;
    n->s.ref.id = id;
    n->s.ref.bstream = bs;
    n->s.magic = UM_STREAM_MAGIC;
    list_insert(impl, n);
    um__vt_mutex_unlock(&impl->lock);
    *out = &n->s;
    return UM_OK;
}

um_status um_stream_create(um_context *ctx, int dev, um_stream *out)
{
    return stream_new(ctx, dev, false, NULL, out, "um_stream_create");
}

um_status um_stream_wrap(um_context *ctx, int dev, void *native, um_stream *out)
{
    return stream_new(ctx, dev, true, native, out, "um_stream_wrap");
}

void *um_stream_native(um_stream s)
{
    if (!s || s->magic != UM_STREAM_MAGIC)
        return NULL;
    um__backend *b = s->ctx->devices[s->dev].backend;
    return b->ops->stream_native(b, s->ref.bstream);
}

um_status um_stream_destroy(um_context *ctx, um_stream s)
{
    if (!ctx)
        return um__fail(UM_ERR_INVALID, "um_stream_destroy: ctx is NULL");
    if (!s)
        return um__fail(UM_ERR_INVALID, "um_stream_destroy: the stream is NULL (a device's "
                                        "default stream cannot be destroyed)");
    context_impl *impl = impl_of(ctx);
    /* Looked up in the list before s is read, so a stream destroyed twice
     * is reported instead of read after it was freed. */
    stream_node *n = NULL;
    um__vt_mutex_lock(&impl->lock);
    for (stream_node *it = impl->streams.next; it != &impl->streams; it = it->next) {
        if (&it->s == s) {
            n = it;
            list_remove(n);
            break;
        }
    }
    um__vt_mutex_unlock(&impl->lock);
    if (!n)
        return um__fail(UM_ERR_INVALID,
                        "um_stream_destroy: %p is not a live stream of this "
                        "context (destroyed already, or made by another context)",
                        (void *)s);
    um_device *d = &ctx->devices[s->dev];
    /* Each step that fails leaves the stream valid, for a retry (and for
     * um_shutdown): blocks may still wait for its work (a free that needs
     * it, or an allocator's fences, that cannot be waited for), or the
     * backend still has it. The frees that wait for s go back before the
     * allocators forget s, and the marks go only with the backend's stream. */
    um_status st = um__uses_stream_drain(ctx, s);
    if (st == UM_OK)
        st = d->alloc->ops->stream_forget(d->alloc, &s->ref);
    uint32_t host_id = atomic_load_explicit(&s->host_id, memory_order_acquire);
    if (st == UM_OK && host_id) {
        um__allocator *host = ctx->devices[0].alloc;
        st = host->ops->stream_forget(host, &s->host_ref);
    }
    if (st == UM_OK)
        st = um__uses_stream_destroy(ctx, s);
    if (st != UM_OK) {
        um__vt_mutex_lock(&impl->lock);
        list_insert(impl, n);
        um__vt_mutex_unlock(&impl->lock);
        return st;
    }
    s->magic = 0;
    stream_node *oldest = NULL;
    um__vt_mutex_lock(&impl->lock);
    give_id_locked(impl, s->dev, s->ref.id);
    if (host_id)
        give_id_locked(impl, 0, host_id);
    n->next = NULL;
    if (impl->dead_tail)
        impl->dead_tail->next = n;
    else
        impl->dead_head = n;
    impl->dead_tail = n;
    if (++impl->ndead > DEAD_STREAMS_KEPT) {
        oldest = impl->dead_head;
        impl->dead_head = oldest->next;
        impl->ndead--;
    }
    um__vt_mutex_unlock(&impl->lock);
    free(oldest);
    return UM_OK;
}

um_status um_stream_synchronize(um_context *ctx, um_stream s)
{
    if (!ctx)
        return um__fail(UM_ERR_INVALID, "um_stream_synchronize: ctx is NULL");
    if (!s) {
        /* No stream: the default stream of every device. */
        for (int i = 0; i < ctx->ndevices; i++) {
            um_status st = um__be_stream_sync(ctx->devices[i].backend, NULL);
            if (st != UM_OK)
                return st;
        }
        return UM_OK;
    }
    if (!valid_stream(ctx, s))
        return um__fail(UM_ERR_INVALID,
                        "um_stream_synchronize: %p is not a live stream of this "
                        "context",
                        (void *)s);
    return um__be_stream_sync(ctx->devices[s->dev].backend, s->ref.bstream);
}

int um_stream_device(um_stream s)
{
    return s && s->magic == UM_STREAM_MAGIC ? s->dev : -1;
}

/* Simulated work: lets tests and `unimem replay --lag` hold a sim stream
 * busy the way kernels hold a GPU's, so stream-ordered reuse and fences can
 * be exercised without a GPU. */
static um_status sim_work_stream(um_context *ctx, int dev, um_stream s, const char *what,
                                 um_device **d, um__bstream **bs)
{
    *d = um__device(ctx, dev, what);
    if (!*d)
        return UM_ERR_NO_DEVICE;
    *bs = NULL;
    if (s) {
        if (!valid_stream(ctx, s))
            return um__fail(UM_ERR_INVALID, "%s: %p is not a live stream of this context", what,
                            (void *)s);
        /* The status the memory calls give a stream of another device. */
        if (s->dev != dev)
            return um__fail(UM_ERR_WRONG_DEVICE, "%s: the stream belongs to device %d, not %d",
                            what, s->dev, dev);
        *bs = s->ref.bstream;
    }
    return UM_OK;
}

um_status um_sim_stream_work(um_context *ctx, int dev, um_stream s, unsigned launch,
                             unsigned complete)
{
    um_device *d;
    um__bstream *bs;
    um_status st = sim_work_stream(ctx, dev, s, "um_sim_stream_work", &d, &bs);
    if (st == UM_OK && launch)
        st = um__sim_stream_launch(d->backend, bs, launch);
    if (st == UM_OK && complete)
        st = um__sim_stream_complete(d->backend, bs, complete);
    return st;
}

um_status um_sim_stream_queued(um_context *ctx, int dev, um_stream s, uint64_t *units)
{
    static const char what[] = "um_sim_stream_queued";
    if (!units)
        return um__fail(UM_ERR_INVALID, "%s: units is NULL", what);
    um_device *d;
    um__bstream *bs;
    um_status st = sim_work_stream(ctx, dev, s, what, &d, &bs);
    return st == UM_OK ? um__sim_stream_queued(d->backend, bs, units) : st;
}

/* ------------------------------------------------- init and shutdown */

/* Waits for the work queued on every stream of the context, its own,
 * the wrapped ones and each device's default stream, before the allocators
 * unmap and release their memory: unmapping does not wait for the device
 * (cuMemUnmap promises no synchronization), and a kernel still running on
 * memory freed in stream order would fault, a sticky error that breaks
 * the whole process's use of that GPU. A stream that cannot be waited for
 * is logged; its memory goes anyway, since the context is going. */
static void sync_all_streams(context_impl *impl)
{
    um_context *ctx = &impl->pub;
    for (stream_node *n = impl->streams.next; n != &impl->streams; n = n->next)
        if (um__be_stream_sync(ctx->devices[n->s.dev].backend, n->s.ref.bstream) != UM_OK)
            um__log(UM_LOG_WARN, "um_shutdown: %s", um_last_error());
    for (int i = 0; i < ctx->ndevices; i++)
        if (ctx->devices[i].backend &&
            um__be_stream_sync(ctx->devices[i].backend, NULL) != UM_OK)
            um__log(UM_LOG_WARN, "um_shutdown: %s", um_last_error());
}

/* Tears down whatever part of a context exists: allocators first (they
 * return their memory to the backends, once the streams' work is done),
 * then the stream objects, then the backends. Used by um_shutdown and by
 * every failure path of um_init. */
static void destroy_context(context_impl *impl)
{
    um_context *ctx = &impl->pub;
    if (ctx->run_fini)
        ctx->run_fini(ctx);
    if (ctx->buffers_fini)
        ctx->buffers_fini(ctx);
    sync_all_streams(impl);
    um__uses_fini(ctx);
    for (int i = 0; i < ctx->ndevices; i++) {
        um_device *d = &ctx->devices[i];
        if (d->alloc)
            d->alloc->ops->destroy(d->alloc);
        d->alloc = NULL;
        ctx->owner_range[i].size = 0;
    }
    while (impl->streams.next != &impl->streams) {
        stream_node *n = impl->streams.next;
        list_remove(n);
        um_device *d = &ctx->devices[n->s.dev];
        if (um__be_stream_destroy(d->backend, n->s.ref.bstream) != UM_OK)
            um__log(UM_LOG_WARN, "um_shutdown: %s", um_last_error());
        n->s.magic = 0;
        free(n);
    }
    for (int i = 0; i < ctx->ndevices; i++) {
        um_device *d = &ctx->devices[i];
        if (d->default_stream) {
            d->default_stream->magic = 0;
            free(d->default_stream);
            d->default_stream = NULL;
        }
        um__backend_destroy(d->backend);
        d->backend = NULL;
    }
    ctx->ndevices = 0;
    for (int i = 0; i < UM_MAX_DEVICES; i++)
        free(impl->free_ids[i].ids);
    while (impl->dead_head) {
        stream_node *n = impl->dead_head;
        impl->dead_head = n->next;
        free(n);
    }
    um__events_close(ctx->events);
    um__fault_plan_free(ctx->fault);
    pthread_mutex_destroy(&ctx->buffers_lock);
    pthread_mutex_destroy(&impl->lock);
    free(impl);
}

#ifdef UM_DEBUG
#define UM_DEBUG_WORD_ "on"
#else
#define UM_DEBUG_WORD_ "off"
#endif
#define UM_FEATURES_(sanitizer)                                                                    \
    "cuda (driver loaded at run time), zlib " ZLIB_VERSION ", sanitizer " sanitizer                \
    ", debug checks " UM_DEBUG_WORD_

const char *um_build_features(void)
{
    return UM_BUILD_SANITIZER[0] ? UM_FEATURES_(UM_BUILD_SANITIZER) : UM_FEATURES_("none");
}

/* Adds backend b (owned from here on, also on failure) as the next
 * device; wrapped for fault injection when the fault option asks. */
static um_status add_device(um_context *ctx, um__backend *b)
{
    if (ctx->fault) {
        um__backend *w = NULL;
        um_status st = um__fault_wrap(b, ctx->fault, ctx->ndevices, &w);
        if (st != UM_OK) {
            um__backend_destroy(b);
            return st;
        }
        b = w;
    }
    um_device *d = &ctx->devices[ctx->ndevices];
    d->index = ctx->ndevices;
    d->backend = b;
    d->alloc = NULL;
    d->default_stream = NULL;
    atomic_store(&d->next_stream_id, 1);
    ctx->ndevices++;
    return UM_OK;
}

/* Device 0: pinned host memory through the CUDA driver when asked for, or
 * (host_memory=auto) when the devices list names a GPU and the driver can;
 * pageable memfd memory otherwise. */
/* Each core at about 2.5 GHz with two 8-wide FMA units (AVX2): the host's
 * nominal rate, placement's first guess (it measures from then on),
 * whichever backend holds the host's memory (pageable or pinned). */
static um_status add_host(um_context *ctx, um__backend *b)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    b->nominal_gflops = (cpus > 0 ? (double)cpus : 1.0) * 2.5 * 32.0;
    return add_device(ctx, b);
}

static um_status create_host(um_context *ctx, const device_spec *specs, int nspecs)
{
    const um__options *o = &ctx->opts;
    /* Pinned memory goes through the first GPU the devices name (cuda:N,
     * or GPU 0 for "cuda"), so that no other GPU gets a primary context
     * (hundreds of MiB of its memory) and the pages sit on the NUMA node
     * next to a GPU in use. */
    bool gpu_listed = false;
    int pin_gpu = 0;
    for (int i = 0; i < nspecs && !gpu_listed; i++)
        if (specs[i].kind == SPEC_CUDA) {
            gpu_listed = true;
            pin_gpu = specs[i].ordinal < 0 ? 0 : specs[i].ordinal;
        }
    um__backend *b = NULL;
    um_status st;
    if (o->host_memory == UM_HOST_MEMORY_PINNED ||
        (o->host_memory == UM_HOST_MEMORY_AUTO && gpu_listed)) {
        st = um__cuda_host_backend_create(pin_gpu, o->host_capacity, &b);
        if (st == UM_OK)
            return add_host(ctx, b);
        if (o->host_memory == UM_HOST_MEMORY_PINNED)
            return fail_within(st, "um_init: device 0 (host, host_memory=pinned)");
        char why[300];
        um__log(UM_LOG_INFO, "um_init: host memory stays pageable: %s",
                um__error_detail(st, why, sizeof why));
    }
    st = um__host_backend_create(o->host_capacity, o->host_granularity, &b);
    if (st == UM_ERR_INVALID) {
        /* A size the backend refuses came from these options: named. */
        char where[128], cap[32], gran[32];
        snprintf(where, sizeof where,
                 "um_init: device 0 (host) with options host_capacity=%s, host_granularity=%s",
                 o->host_capacity ? um__format_bytes(cap, sizeof cap, o->host_capacity)
                                  : "0 (physical RAM)",
                 um__format_bytes(gran, sizeof gran, o->host_granularity));
        return fail_within(st, where);
    }
    if (st != UM_OK)
        return fail_within(st, "um_init: device 0 (host)");
    return add_host(ctx, b);
}

/* One device per GPU of the entry: every GPU the driver reports for
 * "cuda" (none, with a note in the log, when there is no driver), or GPU N
 * for "cuda:N" (an error when it does not exist). */
static um_status create_cuda(um_context *ctx, const device_spec *spec)
{
    char why[256];
    const um__cuda_api *cu = um__cuda_load(why, sizeof why);
    if (!cu && spec->ordinal < 0) {
        um__log(UM_LOG_INFO, "um_init: option 'devices' asks for every GPU, and there is none: %s",
                why);
        return UM_OK;
    }
    if (!cu)
        return um__fail(UM_ERR_NO_DEVICE, "um_init: option 'devices' asks for cuda:%d: %s",
                        spec->ordinal, why);
    int first = spec->ordinal < 0 ? 0 : spec->ordinal;
    int end = spec->ordinal < 0 ? cu->gpus : spec->ordinal + 1;
    if (spec->ordinal >= cu->gpus)
        return um__fail(UM_ERR_NO_DEVICE,
                        "um_init: option 'devices' asks for cuda:%d, but the driver reports %d "
                        "GPU%s (cuda:0 to cuda:%d)",
                        spec->ordinal, cu->gpus, cu->gpus == 1 ? "" : "s", cu->gpus - 1);
    for (int g = first; g < end; g++) {
        for (int i = 1; i < ctx->ndevices; i++)
            if (ctx->devices[i].backend->ordinal == g)
                return um__fail(UM_ERR_BAD_OPTION,
                                "um_init: option 'devices' names GPU %d twice (device %d is "
                                "cuda%d already)",
                                g, i, g);
        if (ctx->ndevices == UM_MAX_DEVICES)
            return um__fail(UM_ERR_BAD_OPTION,
                            "um_init: option 'devices' makes more than %d devices (with the host)",
                            UM_MAX_DEVICES);
        um__backend *b = NULL;
        um_status st = um__cuda_backend_create(g, ctx->opts.cuda_vmm, ctx->opts.cuda_page_size, &b);
        if (st != UM_OK) {
            char where[64];
            snprintf(where, sizeof where, "um_init: device %d (cuda%d)", ctx->ndevices, g);
            return fail_within(st, where);
        }
        if ((st = add_device(ctx, b)) != UM_OK)
            return st;
    }
    return UM_OK;
}

static um_status create_backends(um_context *ctx, const device_spec *specs, int nspecs)
{
    const um__options *o = &ctx->opts;
    um__backend *b = NULL;
    um_status st = create_host(ctx, specs, nspecs);
    if (st != UM_OK)
        return st;
    for (int i = 0; i < nspecs; i++) {
        switch (specs[i].kind) {
        case SPEC_SIM:
            for (int k = 0; k < specs[i].count; k++) {
                char name[16], where[128], bytes[32], gran[32];
                int index = ctx->ndevices;
                /* GPUs are counted only once the driver is asked, so the
                 * parser's bound may not have seen them. */
                if (index == UM_MAX_DEVICES)
                    return um__fail(UM_ERR_BAD_OPTION,
                                    "um_init: option 'devices' makes more than %d devices (with "
                                    "the host)",
                                    UM_MAX_DEVICES);
                snprintf(name, sizeof name, "sim%d", index);
                st = um__sim_backend_create(name, specs[i].size, o->sim_granularity,
                                            o->sim_link_bandwidth, &b);
                if (st != UM_OK) {
                    /* A size the backend refuses came from the devices
                     * entry or the sim_granularity option: both named. */
                    int n = snprintf(where, sizeof where, "um_init: device %d (%s, %s)", index,
                                     name, um__format_bytes(bytes, sizeof bytes, specs[i].size));
                    if (st == UM_ERR_INVALID && n > 0 && (size_t)n < sizeof where)
                        snprintf(where + n, sizeof where - (size_t)n,
                                 " with option sim_granularity=%s",
                                 um__format_bytes(gran, sizeof gran, o->sim_granularity));
                    return fail_within(st, where);
                }
                /* A sim device computes on the host's cores, or at its
                 * modelled speed. */
                b->nominal_gflops = o->sim_gflops > 0 ? (double)o->sim_gflops
                                                      : ctx->devices[0].backend->nominal_gflops;
                if ((st = add_device(ctx, b)) != UM_OK)
                    return st;
            }
            break;
        case SPEC_CUDA:
            if ((st = create_cuda(ctx, &specs[i])) != UM_OK)
                return st;
            break;
        }
    }
    return UM_OK;
}

/* The allocators' wait before an address is used again: while a
 * marked block's free at that address is being handed back. */
static void reuse_wait(void *ctx, int dev, void *const *ptrs, size_t n)
{
    um__uses_given(ctx, dev, ptrs, n);
}

/* The pinned host pool's large page: the option as given, except that its
 * default (32 MiB) is more than the 64 pages a large page may span where
 * the pinned host pages are smaller than 512 KiB; there the default
 * becomes the largest large page allowed, so that no default fails
 * um_init. A value the program gives is checked by the pool as given. */
static size_t pinned_host_large_page(const um__options *o, const um__backend *b)
{
    um__options defaults;
    um__options_defaults(&defaults);
    size_t most = 64 * b->granularity;
    return o->host_large_page == defaults.host_large_page && o->host_large_page > most
               ? most
               : o->host_large_page;
}

static um_status create_allocators(um_context *ctx)
{
    const um__options *o = &ctx->opts;
    for (int i = 0; i < ctx->ndevices; i++) {
        um_device *d = &ctx->devices[i];
        bool pinned_host = d->backend->kind == UM_DEVICE_HOST && d->backend->pinned;
        um__pool_config c = {
            .dev = i,
            /* A limit above the capacity is the capacity, for every
             * allocator (um_set_memory_limit caps it the same way). */
            .memory_limit = o->memory_limit < d->backend->capacity ? o->memory_limit
                                                                   : d->backend->capacity,
            .cache_limit = o->cache_limit,
            .thread_cache = o->thread_cache,
            .va_factor = o->va_factor,
            .fence_wait_ns = (uint64_t)o->fence_wait_us * 1000,
            .recycle = o->recycle_pages,
            .no_plan = !o->plan,
            .no_defer = !o->defer_frees,
            .no_medium = !o->medium_slabs,
            .no_cross_stream_reuse = !o->cross_stream_reuse,
            .large_page = pinned_host ? pinned_host_large_page(o, d->backend) : o->large_page,
            .large_page_option = pinned_host ? "host_large_page" : "large_page",
            .events = ctx->events,
            .reuse_wait = reuse_wait,
            .reuse_arg = ctx,
        };
        um_status st;
        int kind = o->allocator;
        /* The pool needs an address range it can map pages into; a GPU
         * without VMM has cuMemAlloc segments only, which the buffer cache
         * serves whole. */
        if (kind == UM_ALLOCATOR_POOL && !d->backend->vmm) {
            um__log(UM_LOG_INFO, "um_init: device %d (%s) has no VMM: the buffer cache serves it",
                    i, d->backend->name);
            kind = UM_ALLOCATOR_BUFCACHE;
        }
        switch (kind) {
        case UM_ALLOCATOR_POOL:
            st = um__pool_create(d->backend, &c, &d->alloc);
            break;
        case UM_ALLOCATOR_DIRECT:
            st = um__direct_create(d->backend, &c, &d->alloc);
            break;
        case UM_ALLOCATOR_BUFCACHE:
            st = um__bufcache_create(d->backend, &c, &d->alloc);
            break;
        default:
            return um__fail(UM_ERR_INTERNAL, "um_init: allocator kind %d is unknown", kind);
        }
        if (st != UM_OK) {
            char where[128];
            d->alloc = NULL;
            snprintf(where, sizeof where, "um_init: %s allocator of device %d (%s)",
                     um__allocator_name(kind), i, d->backend->name);
            return fail_within(st, where);
        }
#ifdef UM_DEBUG
        /* Debug builds check the blocks the host can read (not a GPU's). */
        if (d->backend->kind != UM_DEVICE_CUDA &&
            (st = um__debug_allocator_wrap(d->alloc, &d->alloc)) != UM_OK)
            return st;
#endif
        if (ctx->events && (st = um__allocator_record(d->alloc, ctx->events)) != UM_OK)
            return st;
        ctx->owner_range[i].lo = d->alloc->range_lo;
        ctx->owner_range[i].size = d->alloc->range_size;
        d->default_stream = calloc(1, sizeof *d->default_stream);
        if (!d->default_stream)
            return um__fail(UM_ERR_NOMEM,
                            "um_init: device %d: no memory for its default stream "
                            "(%zu bytes)",
                            i, sizeof *d->default_stream);
        d->default_stream->ctx = ctx;
        d->default_stream->dev = i;
        d->default_stream->ref.id = 0;
        d->default_stream->ref.bstream = NULL;
        d->default_stream->magic = UM_STREAM_MAGIC;
    }
    return UM_OK;
}

/* The spill file is made at the first spill; a directory that cannot
 * take it is an error now, not then. */
static um_status check_spill_dir(const char *dir)
{
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return um__fail(UM_ERR_BAD_OPTION, "option 'spill_dir': '%s': %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return um__fail(UM_ERR_BAD_OPTION, "option 'spill_dir': '%s' is not a directory", dir);
    if (access(dir, W_OK | X_OK) != 0)
        return um__fail(UM_ERR_BAD_OPTION, "option 'spill_dir': '%s' cannot be written: %s", dir,
                        strerror(errno));
    return UM_OK;
}

/* The contexts of the process, and whether one runs in virtual time. The
 * virtual clock is the process's: every wait of every context's threads
 * goes through it while it runs, so a context without it beside one with
 * it hung (its reclaimer waited on the clock, which then stopped). */
static pthread_mutex_t contexts_lock = PTHREAD_MUTEX_INITIALIZER;
static int live_contexts;
static bool virtual_context_live;

/* Counts a context in (and starts the clock for a virtual one), or fails
 * naming why it cannot coexist with those there are. */
static um_status enter_context(bool virtual_time)
{
    pthread_mutex_lock(&contexts_lock);
    um_status st = UM_OK;
    if (virtual_context_live)
        st = um__fail(UM_ERR_BUSY, "um_init: a context of this process runs in virtual time "
                      "(option virtual_time), and while it lives it is the only one (one at "
                      "a time: the clock is the process's)");
    else if (virtual_time && live_contexts)
        st = um__fail(UM_ERR_BUSY, "option 'virtual_time': %d other context%s of this process "
                      "%s live; a context in virtual time must be the only one (one at a time: "
                      "the clock is the process's)", live_contexts,
                      live_contexts == 1 ? "" : "s", live_contexts == 1 ? "is" : "are");
    else if (virtual_time)
        st = um__vt_start();
    if (st == UM_OK) {
        live_contexts++;
        virtual_context_live = virtual_time;
    }
    pthread_mutex_unlock(&contexts_lock);
    return st;
}

/* The contexts um_init made and um_shutdown has not taken yet, so that a
 * second um_shutdown of one (later, or from another thread at once) is
 * refused with a message instead of freeing it twice. Under
 * contexts_lock; only um_init and um_shutdown read it, never a hot path. */
static context_impl *live_list;

static void live_add(context_impl *impl)
{
    pthread_mutex_lock(&contexts_lock);
    impl->live_next = live_list;
    live_list = impl;
    pthread_mutex_unlock(&contexts_lock);
}

/* Takes impl off the list; false when it was not there. */
static bool live_take(context_impl *impl)
{
    pthread_mutex_lock(&contexts_lock);
    context_impl **at = &live_list;
    while (*at && *at != impl)
        at = &(*at)->live_next;
    bool found = *at != NULL;
    if (found)
        *at = impl->live_next;
    pthread_mutex_unlock(&contexts_lock);
    return found;
}

/* After the context is gone: its streams and threads no longer use the
 * clock. */
static void leave_context(bool virtual_time)
{
    pthread_mutex_lock(&contexts_lock);
    if (virtual_time) {
        um__vdev_stop();
        um__vt_stop();
        virtual_context_live = false;
    }
    live_contexts--;
    pthread_mutex_unlock(&contexts_lock);
}

um_status um_init(const char *conf, um_context **out)
{
    if (!out)
        return um__fail(UM_ERR_INVALID, "um_init: the context out-pointer is NULL");
    *out = NULL;
    um__options opts;
    um__options_defaults(&opts);
    um_status st = um__options_apply(&opts, getenv("UNIMEM_CONF"), "UNIMEM_CONF");
    if (st != UM_OK)
        return st;
    st = um__options_apply(&opts, conf, "um_init");
    if (st != UM_OK)
        return st;
    um__log_set_level((um_log_level)opts.log_level);
    if (opts.watermark_low > opts.watermark_high)
        return um__fail(UM_ERR_BAD_OPTION,
                        "option 'watermark_low': %d%% is above watermark_high (%d%%)",
                        opts.watermark_low, opts.watermark_high);
    if (opts.copy_chunk < 64 * 1024 || opts.copy_chunk > ((size_t)1 << 30))
        return um__fail(UM_ERR_BAD_OPTION,
                        "option 'copy_chunk': %zu bytes is outside 64K..1G (a staged chunk)",
                        opts.copy_chunk);

    /* A modelled link slower than this is a unit left off ("16" for 16G):
     * timing the link alone would copy 16 MiB through it for weeks. */
    const size_t min_link_bandwidth = (size_t)1 << 20;
    if (opts.sim_link_bandwidth && opts.sim_link_bandwidth < min_link_bandwidth)
        return um__fail(UM_ERR_BAD_OPTION,
                        "option 'sim_link_bandwidth': %zu bytes per second is below the 1M "
                        "floor (a unit left off? e.g. 16G); 0 models no link",
                        opts.sim_link_bandwidth);

    /* Named here, as options; the backends would refuse them too, but as
     * their own bad arguments. */
    long os_page = sysconf(_SC_PAGESIZE);
    const struct {
        const char *name;
        size_t bytes;
    } grans[] = {{"sim_granularity", opts.sim_granularity},
                 {"host_granularity", opts.host_granularity}};
    for (size_t i = 0; os_page > 0 && i < sizeof grans / sizeof grans[0]; i++)
        if (!um__is_pow2(grans[i].bytes) || grans[i].bytes % (size_t)os_page)
            return um__fail(UM_ERR_BAD_OPTION,
                            "option '%s': %zu bytes is not a power of two multiple of the OS "
                            "page size (%ld bytes)",
                            grans[i].name, grans[i].bytes, os_page);

    if (opts.spill_dir[0] && (st = check_spill_dir(opts.spill_dir)) != UM_OK)
        return st;

    device_spec specs[UM_MAX_DEVICES - 1];
    int nspecs = 0;
    st = parse_devices(opts.devices, specs, &nspecs);
    if (st != UM_OK)
        return st;
    for (int i = 0; opts.virtual_time && i < nspecs; i++)
        if (specs[i].kind != SPEC_SIM)
            return um__fail(UM_ERR_BAD_OPTION,
                            "option 'virtual_time': only sim devices run in virtual time, and "
                            "'devices' names a GPU (%s)", opts.devices);
    /* Pinned host memory is a CUDA backend, which virtual time cannot
     * model (its device model runs memfd devices only). */
    if (opts.virtual_time && opts.host_memory == UM_HOST_MEMORY_PINNED)
        return um__fail(UM_ERR_BAD_OPTION,
                        "option 'virtual_time': only sim devices and pageable host memory run "
                        "in virtual time, and host_memory=pinned makes the host a CUDA device");
    if ((st = enter_context(opts.virtual_time)) != UM_OK)
        return st;

    context_impl *impl = calloc(1, sizeof *impl);
    if (!impl) {
        leave_context(opts.virtual_time);
        return um__fail(UM_ERR_NOMEM, "um_init: no memory for a context (%zu bytes)", sizeof *impl);
    }
    int err = pthread_mutex_init(&impl->lock, NULL);
    if (err) {
        free(impl);
        leave_context(opts.virtual_time);
        return um__fail(UM_ERR_NOMEM, "um_init: pthread_mutex_init failed (error %d)", err);
    }
    impl->streams.next = impl->streams.prev = &impl->streams;
    um_context *ctx = &impl->pub;
    err = pthread_mutex_init(&ctx->buffers_lock, NULL);
    if (err) {
        pthread_mutex_destroy(&impl->lock);
        free(impl);
        leave_context(opts.virtual_time);
        return um__fail(UM_ERR_NOMEM, "um_init: pthread_mutex_init failed (error %d)", err);
    }
    ctx->opts = opts;
    ctx->ndevices = 0;

    st = um__fault_plan_parse(opts.fault, opts.fault_seed, &ctx->fault);
    if (st == UM_OK)
        st = create_backends(ctx, specs, nspecs);
    /* A rule for a device the context does not have would inject nothing,
     * and a run meant to test failures would pass without any. */
    int fault_dev = um__fault_plan_max_dev(ctx->fault);
    if (st == UM_OK && fault_dev >= ctx->ndevices)
        st = um__fail(UM_ERR_BAD_OPTION,
                      "option 'fault': '%s' names device %d, but this context has %d device%s "
                      "(0 to %d)",
                      opts.fault, fault_dev, ctx->ndevices, ctx->ndevices == 1 ? "" : "s",
                      ctx->ndevices - 1);
    if (st == UM_OK && opts.virtual_time) {
        um__backend *be[UM_MAX_DEVICES];
        for (int i = 0; i < ctx->ndevices; i++)
            be[i] = ctx->devices[i].backend;
        st = um__vdev_start(be, ctx->ndevices);
    }
    /* The recorder before the allocators: pools record their reserved
     * memory into it. */
    if (st == UM_OK && opts.trace_file[0] && !(ctx->events = um__events_open(opts.trace_file,
                                                                             ctx->ndevices)))
        st = UM_ERR_IO;
    for (int i = 0; st == UM_OK && ctx->events && i < ctx->ndevices; i++) {
        ctx->devices[i].backend->events = ctx->events;
        ctx->devices[i].backend->events_dev = i;
    }
    if (st == UM_OK)
        st = create_allocators(ctx);
    if (st != UM_OK) {
        destroy_context(impl);
        leave_context(opts.virtual_time);
        return st;
    }
    um__log(UM_LOG_INFO, "um_init: %d device%s, allocator %s", ctx->ndevices,
            ctx->ndevices == 1 ? "" : "s", um__allocator_name(opts.allocator));
    live_add(impl);
    *out = ctx;
    return UM_OK;
}

um_status um_option_current(um_context *ctx, int index, char *buf, size_t len)
{
    if (!ctx)
        return um__fail(UM_ERR_INVALID, "um_option_current: ctx is NULL");
    return um__options_format(&ctx->opts, index, buf, len);
}

void um_shutdown(um_context *ctx)
{
    if (!ctx)
        return;
    if (!live_take(impl_of(ctx))) {
        um__fail(UM_ERR_INVALID,
                 "um_shutdown: %p is not a live context (shut down already, or by another "
                 "thread at once); nothing was done",
                 (void *)ctx);
        um__log(UM_LOG_ERROR, "%s", um_last_error());
        return;
    }
    /* UNIMEM_SHOW_STATS=1: every device's figures before anything is
     * freed (what is still live at exit shows), as MIMALLOC_SHOW_STATS. */
    const char *show = getenv("UNIMEM_SHOW_STATS");
    if (show && *show && strcmp(show, "0") != 0) {
        fprintf(stderr, "unimem: statistics at um_shutdown\n");
        um_stats_print(ctx, stderr);
    }
    bool virtual_time = ctx->opts.virtual_time;
    destroy_context(impl_of(ctx));
    leave_context(virtual_time);
}
