/* Event recorder; see events.h. */
#include "events.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Records are written out once this many are pending. */
#define EVENTS_BATCH 4096

typedef struct event_rec {
    uint64_t start_ns, dur_ns, a0, a1;
    int32_t kind, dev, src;
    char name[32];
} event_rec;

/* name as a JSON string body: quotes, backslashes and controls dropped. */
static void json_name(char *out, size_t len, const char *name)
{
    size_t k = 0;
    for (const char *c = name; *c && k + 1 < len; c++)
        if ((unsigned char)*c >= 0x20 && *c != '"' && *c != '\\')
            out[k++] = *c;
    out[k] = '\0';
}

/* A live block the writer knows of: its address and size (open
 * addressing; address 0: empty, TOMB: removed). */
typedef struct live_block {
    uint64_t addr, size;
} live_block;
#define TOMB ((uint64_t)1)

struct um__events {
    pthread_mutex_t lock;
    FILE *f;
    int ndevices;
    uint64_t *live, *reserved; /* per device, as of the events written */
    live_block *blocks;
    size_t blocks_cap, blocks_used;
    uint64_t t0;          /* um__now_ns at open: time 0 of the trace */
    event_rec pending[EVENTS_BATCH];
    size_t npending;
    uint64_t written;     /* events in the file so far */
};

static size_t block_slot(const um__events *e, uint64_t addr)
{
    return (size_t)((addr * 0x9e3779b97f4a7c15ull) >> 17) & (e->blocks_cap - 1);
}

/* Remembers a block's size; false when there is no memory for the table
 * (the counters then miss it). */
static bool block_add(um__events *e, uint64_t addr, uint64_t size)
{
    if ((e->blocks_used + 1) * 2 > e->blocks_cap) {
        size_t cap = e->blocks_cap ? 2 * e->blocks_cap : 1024;
        live_block *n = calloc(cap, sizeof *n), *old = e->blocks;
        if (!n)
            return false;
        size_t old_cap = e->blocks_cap;
        e->blocks = n;
        e->blocks_cap = cap;
        e->blocks_used = 0;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].addr > TOMB)
                (void)block_add(e, old[i].addr, old[i].size);
        free(old);
    }
    size_t i = block_slot(e, addr);
    while (e->blocks[i].addr > TOMB)
        i = (i + 1) & (e->blocks_cap - 1);
    if (e->blocks[i].addr == 0)
        e->blocks_used++;
    e->blocks[i] = (live_block){addr, size};
    return true;
}

/* Forgets a block; its size, or 0 when unknown. */
static uint64_t block_take(um__events *e, uint64_t addr)
{
    if (!e->blocks_cap)
        return 0;
    for (size_t i = block_slot(e, addr), n = 0; n < e->blocks_cap && e->blocks[i].addr;
         i = (i + 1) & (e->blocks_cap - 1), n++) {
        if (e->blocks[i].addr == addr) {
            uint64_t size = e->blocks[i].size;
            e->blocks[i].addr = TOMB;
            return size;
        }
    }
    return 0;
}

/* The memory counters of dev at ts, as they are after its last event. */
static void write_counters(um__events *e, int dev, double ts)
{
    uint64_t live = e->live[dev], res = e->reserved[dev];
    fprintf(e->f,
            ",\n{\"name\":\"memory\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":%d,\"args\":{\"live\":%llu,"
            "\"reserved\":%llu,\"cached\":%llu}}",
            ts, dev, (unsigned long long)live, (unsigned long long)res,
            (unsigned long long)(res > live ? res - live : 0));
}

/* A complete event ("X") of r on its device's track `tid`, with a0 and
 * a1 as the named arguments. */
static void write_span(um__events *e, const event_rec *r, const char *name, const char *cat,
                       int tid, const char *arg0, const char *arg1)
{
    fprintf(e->f,
            ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,"
            "\"pid\":%d,\"tid\":%d,\"args\":{\"%s\":%llu,\"%s\":%llu}}",
            name, cat, (double)(r->start_ns - e->t0) / 1000.0, (double)r->dur_ns / 1000.0, r->dev,
            tid, arg0, (unsigned long long)r->a0, arg1, (unsigned long long)r->a1);
}

static void write_batch(um__events *e)
{
    for (size_t i = 0; i < e->npending; i++) {
        const event_rec *r = &e->pending[i];
        double ts = (double)(r->start_ns - e->t0) / 1000.0, dur = (double)r->dur_ns / 1000.0;
        switch (r->kind) {
        case UM_EVENT_COPY:
            fprintf(e->f,
                    ",\n{\"name\":\"copy %d->%d\",\"cat\":\"copy\",\"ph\":\"X\",\"ts\":%.3f,"
                    "\"dur\":%.3f,\"pid\":%d,\"tid\":%d,\"args\":{\"bytes\":%llu,\"from\":%d,"
                    "\"to\":%d,\"staged\":%llu}}",
                    r->src, r->dev, ts, dur, r->dev, 1000 + r->src, (unsigned long long)r->a0,
                    r->src, r->dev, (unsigned long long)r->a1);
            break;
        case UM_EVENT_EVICT:
            fprintf(e->f,
                    ",\n{\"name\":\"evict\",\"cat\":\"evict\",\"ph\":\"X\",\"ts\":%.3f,"
                    "\"dur\":%.3f,\"pid\":%d,\"tid\":1,\"args\":{\"bytes\":%llu,"
                    "\"written_back\":%llu,\"to_spill_file\":%d}}",
                    ts, dur, r->dev, (unsigned long long)r->a0, (unsigned long long)r->a1,
                    r->src == 1);
            break;
        case UM_EVENT_RECLAIM_WAIT:
            write_span(e, r, "alloc waits for room", "reclaim", 2, "bytes", "made_room");
            break;
        case UM_EVENT_RECLAIM_RUN:
            write_span(e, r, "reclaimer pass", "reclaim", 3, "bytes_before", "bytes_after");
            break;
        case UM_EVENT_TASK: {
            char name[32];
            json_name(name, sizeof name, r->name);
            write_span(e, r, name, "task", 4, "task", "failed");
            break;
        }
        case UM_EVENT_ALLOC:
        case UM_EVENT_FREE: {
            if (r->dev < 0 || r->dev >= e->ndevices)
                break;
            uint64_t size = r->a0;
            if (r->kind == UM_EVENT_ALLOC) {
                if (block_add(e, r->a1, size))
                    e->live[r->dev] += size;
            } else {
                size = block_take(e, r->a1);
                e->live[r->dev] -= size <= e->live[r->dev] ? size : e->live[r->dev];
            }
            fprintf(e->f,
                    ",\n{\"name\":\"%s\",\"cat\":\"memory\",\"ph\":\"i\",\"s\":\"t\",\"ts\":%.3f,"
                    "\"pid\":%d,\"tid\":0,\"args\":{\"bytes\":%llu,\"block\":\"0x%llx\"}}",
                    r->kind == UM_EVENT_ALLOC ? "alloc" : "free", ts, r->dev,
                    (unsigned long long)size, (unsigned long long)r->a1);
            write_counters(e, r->dev, ts);
            break;
        }
        case UM_EVENT_RESERVED:
            if (r->dev < 0 || r->dev >= e->ndevices)
                break;
            e->reserved[r->dev] = r->a0;
            write_counters(e, r->dev, ts);
            break;
        default:
            break;
        }
        e->written++;
    }
    e->npending = 0;
}

um__events *um__events_open(const char *path, int ndevices)
{
    um__events *e = calloc(1, sizeof *e);
    if (!e) {
        um__fail(UM_ERR_NOMEM, "trace_file: no memory for the event recorder");
        return NULL;
    }
    e->f = fopen(path, "w");
    if (!e->f) {
        um__fail(UM_ERR_IO, "trace_file: cannot open '%s' for writing", path);
        free(e);
        return NULL;
    }
    e->ndevices = ndevices;
    e->live = calloc((size_t)ndevices + 1, sizeof *e->live);
    e->reserved = calloc((size_t)ndevices + 1, sizeof *e->reserved);
    if (!e->live || !e->reserved) {
        fclose(e->f);
        free(e->live);
        free(e->reserved);
        free(e);
        um__fail(UM_ERR_NOMEM, "trace_file: no memory for the event recorder");
        return NULL;
    }
    pthread_mutex_init(&e->lock, NULL);
    e->t0 = um__now_ns();
    /* Track names: one process per device. */
    fprintf(e->f, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n"
                  "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":"
                  "\"device 0 (host)\"}}");
    for (int d = 1; d < ndevices; d++)
        fprintf(e->f, ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":"
                      "\"device %d\"}}", d, d);
    return e;
}

/* Appends r (with its name, or none) to the pending batch, writing the
 * batch out first when it is full. */
static void push(um__events *e, event_rec r, const char *name)
{
    if (name)
        snprintf(r.name, sizeof r.name, "%s", name);
    pthread_mutex_lock(&e->lock);
    if (e->npending == EVENTS_BATCH)
        write_batch(e);
    e->pending[e->npending++] = r;
    pthread_mutex_unlock(&e->lock);
}

void um__event_add(um__events *e, um__event_kind kind, int dev, int src, uint64_t start_ns,
                   uint64_t dur_ns, uint64_t a0, uint64_t a1)
{
    push(e, (event_rec){start_ns, dur_ns, a0, a1, (int32_t)kind, dev, src, ""}, NULL);
}

void um__event_add_named(um__events *e, um__event_kind kind, int dev, uint64_t start_ns,
                         uint64_t dur_ns, uint64_t a0, uint64_t a1, const char *name)
{
    push(e, (event_rec){start_ns, dur_ns, a0, a1, (int32_t)kind, dev, -1, ""},
         name ? name : "task");
}

void um__events_close(um__events *e)
{
    if (!e)
        return;
    write_batch(e);
    fprintf(e->f, "\n]}\n");
    if (fclose(e->f) != 0)
        um__log(UM_LOG_WARN, "trace_file: writing the trace failed");
    pthread_mutex_destroy(&e->lock);
    free(e->live);
    free(e->reserved);
    free(e->blocks);
    free(e);
}
