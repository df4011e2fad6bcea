/*
 * `unimem timeline TRACE -o page.html`: one self-contained HTML page that
 * draws, per device, live, reserved and cached bytes over time, the largest
 * blocks over their lifetimes, and copies and evictions, with hover details
 * and zoom. TRACE is either a Chrome trace written by the trace_file option
 * or an allocation trace (the format of shared/traces), which is first
 * replayed on a sim device with trace_file set, so both end up as the same
 * Chrome trace. Owns the model of one trace (per device: counter samples,
 * marks, the open blocks and the largest ones); the page's text is in
 * timeline_page.c. Uses include/unimem.h and zlib only.
 */
#include "json_reader.h"
#include "timeline.h"
#include "tool.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define TL_CMD "timeline"
#define TL_DEFAULT_DEVICE "sim:141G"
#define TL_DEFAULT_TOP 50
#define TL_MAX_TOP 10000
/* Caps that bound memory (32 bytes a counter sample, 56 a mark, 16 a
 * replayed event: about 450 MiB at most): a trace past them is refused
 * with a message naming the cap rather than exhausting the machine. */
#define TL_MAX_JSON_BYTES ((uint64_t)4 << 30)
#define TL_MAX_SAMPLES ((size_t)8 << 20)
#define TL_MAX_MARKS ((size_t)2 << 20)
#define TL_MAX_REPLAY_EVENTS ((size_t)4 << 20)
#define TL_MAX_DEVICES 256
/* Counter samples per device written into the page as they are; above
 * this they are thinned (peaks kept, see thin_samples), which keeps the
 * page a few tens of MB at most and its drawing fast. */
#define TL_PAGE_SAMPLES ((size_t)500000)
/* Byte counts reach the page as JavaScript numbers, which hold integers
 * exactly up to 2^53 (8 PiB, far above any device): a trace with larger
 * ones is refused rather than drawn wrong. */
#define TL_MAX_BYTES ((uint64_t)1 << 53)

/* ------------------------------------------------------------- model */

typedef struct tl_sample {
    int64_t t; /* ns */
    uint64_t live, reserved, cached;
} tl_sample;

enum { TL_MARK_COPY = 0, TL_MARK_EVICT = 1 };

typedef struct tl_mark {
    int64_t t, dur; /* ns */
    uint64_t bytes;
    int64_t a, b, c; /* copy: from, to, staged; eviction: written back, to spill file, 0 */
    int kind;
} tl_mark;

/* A block over its lifetime. seq orders allocations, so of two blocks of
 * one size the earlier ranks first. */
typedef struct tl_band {
    int64_t start, end;
    uint64_t size, addr, seq;
    bool freed;
} tl_band;

/* A block allocated and not yet freed, by address (open addressing). */
typedef struct tl_open {
    uint64_t addr, size, seq;
    int64_t start;
    bool used;
} tl_open;

typedef struct tl_device {
    int64_t pid;
    char *name; /* from the process_name event, or NULL */
    tl_sample *samples;
    size_t nsamples, samples_cap;
    bool cached_derived; /* every sample's cached is reserved less live */
    bool nonzero;        /* some sample is not all zeros */
    tl_mark *marks;
    size_t nmarks, marks_cap;
    tl_open *open;
    size_t open_cap, open_used;
    tl_band *top; /* a min-heap of the largest blocks, top_n at most */
    size_t ntop;
    uint64_t blocks; /* allocations */
} tl_device;

typedef struct tl_model {
    tl_device *devs[TL_MAX_DEVICES];
    size_t ndevs;
    size_t top_n;
    size_t total_samples, total_marks;
    int64_t tmin, tmax; /* ns, over every time seen */
    bool have_time;
    uint64_t seq;
    /* Progress while reading: the file, its size, events read. */
    int fd;
    uint64_t file_bytes, events_read;
} tl_model;

typedef struct tl_opts {
    const char *trace;
    const char *out;
    const char *device;
    const char *allocator;
    const char *save_trace; /* keep the replay's Chrome trace here */
    const char *replay_arg; /* the first of --device, --allocator, --save-trace given */
    size_t top_n;
} tl_opts;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: unimem timeline TRACE -o PAGE.html [--top N] [--device SPEC]\n"
            "                       [--allocator A] [--save-trace FILE.json]\n"
            "\n"
            "Writes one self-contained HTML page (no network needed) that draws, per device,\n"
            "live, reserved and cached bytes over time, the N largest blocks over their\n"
            "lifetimes, and copies and evictions; hover for values, wheel to zoom, drag to pan.\n"
            "\n"
            "TRACE is recognised by its content:\n"
            "  a Chrome trace (JSON, plain or gzip) written by the trace_file option, e.g.\n"
            "      UNIMEM_CONF=trace_file=/tmp/t.json unimem demo gemm --quick\n"
            "  an allocation trace (a <id> <size> <stream> / f <id> lines, gzip or plain), which\n"
            "      is replayed first on the device through um_malloc/um_free with trace_file set\n"
            "\n"
            "  -o, --output PAGE  the page to write\n"
            "  --top N            blocks drawn as bands, the largest first (default %d, at most\n"
            "                     %d; 0 for none)\n"
            "  --device SPEC      allocation traces: the device to replay on, a value of the\n"
            "                     devices option (default " TL_DEFAULT_DEVICE "), or 'host'\n"
            "  --allocator A      allocation traces: pool (default), direct or bufcache\n"
            "  --save-trace FILE  allocation traces: keep the replay's Chrome trace in FILE\n",
            TL_DEFAULT_TOP, TL_MAX_TOP);
}

static tl_device *device_for(tl_model *m, int64_t pid, char *why, size_t why_len)
{
    for (size_t i = 0; i < m->ndevs; i++)
        if (m->devs[i]->pid == pid)
            return m->devs[i];
    if (m->ndevs == TL_MAX_DEVICES) {
        snprintf(why, why_len, "more than %d devices (pid values); the timeline draws at most %d",
                 TL_MAX_DEVICES, TL_MAX_DEVICES);
        return NULL;
    }
    tl_device *d = calloc(1, sizeof *d);
    if (!d || (m->top_n && !(d->top = malloc(m->top_n * sizeof *d->top)))) {
        free(d);
        snprintf(why, why_len, "no memory for a device");
        return NULL;
    }
    d->pid = pid;
    d->cached_derived = true;
    m->devs[m->ndevs++] = d;
    return d;
}

static void device_free(tl_device *d)
{
    free(d->name);
    free(d->samples);
    free(d->marks);
    free(d->open);
    free(d->top);
    free(d);
}

static void see_time(tl_model *m, int64_t t)
{
    if (!m->have_time) {
        m->tmin = m->tmax = t;
        m->have_time = true;
    } else if (t < m->tmin) {
        m->tmin = t;
    } else if (t > m->tmax) {
        m->tmax = t;
    }
}

/* Grows *buf (elements of size elem) to hold one more than n. */
static bool grow(void **buf, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return true;
    size_t c = *cap ? *cap * 2 : 1024;
    void *p = realloc(*buf, c * elem);
    if (!p)
        return false;
    *buf = p;
    *cap = c;
    return true;
}

/* Of two blocks, whether a ranks before b: larger, or as large and
 * allocated earlier. */
static bool band_better(const tl_band *a, const tl_band *b)
{
    return a->size > b->size || (a->size == b->size && a->seq < b->seq);
}

static void heap_sift_down(tl_band *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, worst = i;
        if (l < n && band_better(&h[worst], &h[l]))
            worst = l;
        if (r < n && band_better(&h[worst], &h[r]))
            worst = r;
        if (worst == i)
            return;
        tl_band t = h[i];
        h[i] = h[worst];
        h[worst] = t;
        i = worst;
    }
}

/* Keeps b if it is among the top_n largest blocks seen so far. The heap's
 * root is the smallest kept block, so each offer costs O(log top_n). */
static void offer_band(tl_model *m, tl_device *d, const tl_band *b)
{
    if (m->top_n == 0)
        return;
    if (d->ntop < m->top_n) {
        size_t i = d->ntop++;
        d->top[i] = *b;
        while (i > 0 && band_better(&d->top[(i - 1) / 2], &d->top[i])) {
            tl_band t = d->top[i];
            d->top[i] = d->top[(i - 1) / 2];
            d->top[(i - 1) / 2] = t;
            i = (i - 1) / 2;
        }
    } else if (band_better(b, &d->top[0])) {
        d->top[0] = *b;
        heap_sift_down(d->top, d->ntop, 0);
    }
}

static size_t open_slot(const tl_device *d, uint64_t addr)
{
    return (size_t)((addr * 0x9e3779b97f4a7c15ull) >> 20) & (d->open_cap - 1);
}

static bool open_insert(tl_device *d, const tl_open *o)
{
    if ((d->open_used + 1) * 2 > d->open_cap) {
        size_t old_cap = d->open_cap, cap = old_cap ? old_cap * 2 : 1024;
        tl_open *old = d->open, *n = calloc(cap, sizeof *n);
        if (!n)
            return false;
        d->open = n;
        d->open_cap = cap;
        d->open_used = 0;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].used)
                (void)open_insert(d, &old[i]);
        free(old);
    }
    size_t i = open_slot(d, o->addr);
    while (d->open[i].used)
        i = (i + 1) & (d->open_cap - 1);
    d->open[i] = *o;
    d->open[i].used = true;
    d->open_used++;
    return true;
}

/* Removes and returns the open block at addr; false when there is none.
 * Deletion shifts later entries of the probe run back, so lookups never
 * need tombstones. */
static bool open_take(tl_device *d, uint64_t addr, tl_open *out)
{
    if (!d->open_cap)
        return false;
    size_t mask = d->open_cap - 1, i = open_slot(d, addr);
    while (d->open[i].used && d->open[i].addr != addr)
        i = (i + 1) & mask;
    if (!d->open[i].used)
        return false;
    *out = d->open[i];
    d->open[i].used = false;
    d->open_used--;
    for (size_t j = (i + 1) & mask; d->open[j].used; j = (j + 1) & mask) {
        size_t home = open_slot(d, d->open[j].addr);
        /* Entry j may move to the hole at i unless its home lies
         * cyclically in (i, j]. */
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            d->open[i] = d->open[j];
            d->open[j].used = false;
            i = j;
        }
    }
    return true;
}

/* ------------------------------------------------------- Chrome trace */

/* A block address as the recorder writes it ("0x7f548c400000": "0x" and
 * hex digits only, so no sign or white space that strtoull would take), or
 * a non-negative integer. */
static bool parse_address(const json_value *v, uint64_t *out)
{
    if (json_u64(v, out))
        return true;
    const char *s = json_str(v);
    if (!s || v->len < 3 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X') ||
        strspn(s + 2, "0123456789abcdefABCDEF") != v->len - 2)
        return false;
    errno = 0;
    unsigned long long a = strtoull(s + 2, NULL, 16);
    if (errno)
        return false; /* more than 64 bits */
    *out = a;
    return true;
}

/* ts and dur are in microseconds (Chrome's unit); the model keeps ns. */
static bool to_ns(const json_value *v, int64_t *out)
{
    double us;
    if (!json_number(v, &us) || fabs(us) > 1e15)
        return false;
    *out = (int64_t)llround(us * 1000.0);
    return true;
}

/* A byte count of the event: a non-negative integer, at most
 * TL_MAX_BYTES. */
static bool arg_bytes(const json_value *args, const char *key, uint64_t *out, char *why,
                      size_t why_len, const char *what)
{
    if (!json_u64(json_get(args, key), out)) {
        snprintf(why, why_len, "%s has no args.%s (a non-negative integer)", what, key);
        return false;
    }
    if (*out > TL_MAX_BYTES) {
        snprintf(why, why_len,
                 "%s: args.%s %llu is above 2^53 (%llu), the most a page draws exactly", what, key,
                 (unsigned long long)*out, (unsigned long long)TL_MAX_BYTES);
        return false;
    }
    return true;
}

static int add_sample(tl_model *m, tl_device *d, int64_t t, const json_value *args, char *why,
                      size_t why_len)
{
    uint64_t live, reserved, cached;
    if (!arg_bytes(args, "live", &live, why, why_len, "a \"memory\" counter") ||
        !arg_bytes(args, "reserved", &reserved, why, why_len, "a \"memory\" counter"))
        return 1;
    uint64_t derived = reserved > live ? reserved - live : 0;
    if (!json_get(args, "cached"))
        cached = derived;
    else if (!arg_bytes(args, "cached", &cached, why, why_len, "a \"memory\" counter"))
        return 1;
    if (m->total_samples == TL_MAX_SAMPLES) {
        snprintf(why, why_len, "more than %zu counter samples, the most the timeline keeps",
                 TL_MAX_SAMPLES);
        return 1;
    }
    if (!grow((void **)&d->samples, &d->samples_cap, d->nsamples, sizeof *d->samples)) {
        snprintf(why, why_len, "no memory for %zu counter samples", d->nsamples + 1);
        return 1;
    }
    /* The recorder writes each sample as the state after an event, in the
     * order the events happened; threads that race for its lock can leave
     * a timestamp a little before the previous one. Keeping file order (and
     * holding time still over such a step) keeps every state, so peaks and
     * the final values stay exact, where sorting by time would not. */
    if (d->nsamples && t < d->samples[d->nsamples - 1].t)
        t = d->samples[d->nsamples - 1].t;
    d->samples[d->nsamples++] = (tl_sample){t, live, reserved, cached};
    m->total_samples++;
    d->cached_derived = d->cached_derived && cached == derived;
    d->nonzero = d->nonzero || live || reserved || cached;
    see_time(m, t);
    return 0;
}

static int add_alloc_or_free(tl_model *m, tl_device *d, bool alloc, int64_t t,
                             const json_value *args, char *why, size_t why_len)
{
    uint64_t bytes, addr = 0;
    const char *what = alloc ? "an alloc event" : "a free event";
    if (!arg_bytes(args, "bytes", &bytes, why, why_len, what))
        return 1;
    /* An event without an address is counted but draws no band; one with
     * an address that does not parse is a changed or damaged format. */
    const json_value *block = json_get(args, "block");
    bool have_addr = block != NULL;
    if (block && !parse_address(block, &addr)) {
        const char *text = json_str(block);
        snprintf(why, why_len,
                 "%s has a bad args.block%s%.40s%s (an address is \"0x\" and hex digits, or an "
                 "integer)",
                 what, text ? " \"" : "", text ? text : "", text ? "\"" : "");
        return 1;
    }
    see_time(m, t);
    if (!alloc) {
        tl_open o;
        if (have_addr && open_take(d, addr, &o)) {
            tl_band b = {o.start, t > o.start ? t : o.start, o.size, addr, o.seq, true};
            offer_band(m, d, &b);
        }
        return 0;
    }
    d->blocks++;
    m->seq++;
    if (!have_addr)
        return 0;
    /* An address allocated again without a free in between (a trace that
     * lost events): the earlier block ends here. */
    tl_open o;
    if (open_take(d, addr, &o)) {
        tl_band b = {o.start, t > o.start ? t : o.start, o.size, addr, o.seq, true};
        offer_band(m, d, &b);
    }
    if (m->top_n && !open_insert(d, &(tl_open){addr, bytes, m->seq, t, true})) {
        snprintf(why, why_len, "no memory for %zu live blocks", d->open_used + 1);
        return 1;
    }
    return 0;
}

static int add_mark(tl_model *m, tl_device *d, int kind, int64_t t, const json_value *ev,
                    const json_value *args, char *why, size_t why_len)
{
    tl_mark k = {.t = t, .kind = kind};
    const json_value *dur = json_get(ev, "dur");
    if (dur && (!to_ns(dur, &k.dur) || k.dur < 0)) {
        snprintf(why, why_len, "a %s has a bad \"dur\"", kind == TL_MARK_COPY ? "copy" : "evict");
        return 1;
    }
    const char *what = kind == TL_MARK_COPY ? "a copy" : "an evict event";
    if (!arg_bytes(args, "bytes", &k.bytes, why, why_len, what))
        return 1;
    /* The other arguments are details for the tooltip: missing ones show
     * as 0. */
    const char *names[2][3] = {{"from", "to", "staged"}, {"written_back", "to_spill_file", ""}};
    int64_t *slots[3] = {&k.a, &k.b, &k.c};
    for (int i = 0; i < 3; i++) {
        const json_value *v = names[kind][i][0] ? json_get(args, names[kind][i]) : NULL;
        if (v && !json_i64(v, slots[i]) && v->type != JSON_TRUE && v->type != JSON_FALSE) {
            snprintf(why, why_len, "%s has a non-integer args.%s", what, names[kind][i]);
            return 1;
        }
        if (v && v->type == JSON_TRUE)
            *slots[i] = 1;
    }
    if (m->total_marks == TL_MAX_MARKS) {
        snprintf(why, why_len, "more than %zu copies and evictions, the most the timeline keeps",
                 TL_MAX_MARKS);
        return 1;
    }
    if (!grow((void **)&d->marks, &d->marks_cap, d->nmarks, sizeof *d->marks)) {
        snprintf(why, why_len, "no memory for %zu marks", d->nmarks + 1);
        return 1;
    }
    d->marks[d->nmarks++] = k;
    m->total_marks++;
    see_time(m, t);
    see_time(m, t + k.dur);
    return 0;
}

static bool is(const char *s, const char *word)
{
    return s && !strcmp(s, word);
}

/* One event of the trace. What the timeline does not draw (tasks, reclaim,
 * backend calls, other tools' events, fields it does not know) is skipped;
 * an event it draws with a field of the wrong type is an error, so a
 * changed format is noticed instead of drawn wrong. */
static int on_event(void *arg, const json_value *ev, char *why, size_t why_len)
{
    tl_model *m = arg;
    if ((++m->events_read & 4095) == 0 && m->file_bytes)
        tool_progress("reading events",
                      (double)lseek(m->fd, 0, SEEK_CUR) / (double)m->file_bytes);
    const char *ph = json_str(json_get(ev, "ph"));
    const char *name = json_str(json_get(ev, "name"));
    const char *cat = json_str(json_get(ev, "cat"));
    const json_value *args = json_get(ev, "args");
    int kind;
    if (is(ph, "M")) {
        kind = 0;
    } else if (is(ph, "C") && is(name, "memory")) {
        kind = 1;
    } else if ((is(ph, "i") || is(ph, "I")) && (is(name, "alloc") || is(name, "free")) &&
               (!cat || is(cat, "memory"))) {
        kind = 2;
    } else if (is(ph, "X") && (is(cat, "copy") || is(cat, "evict"))) {
        kind = 3;
    } else {
        return 0;
    }
    int64_t pid;
    if (!json_i64(json_get(ev, "pid"), &pid)) {
        if (kind == 0)
            return 0; /* metadata of a thread or process we do not draw */
        snprintf(why, why_len, "no integer \"pid\" (the device)");
        return 1;
    }
    if (kind == 0) {
        const char *pname = json_str(json_get(args, "name"));
        if (!is(name, "process_name") || !pname)
            return 0;
        tl_device *d = device_for(m, pid, why, why_len);
        if (!d)
            return 1;
        free(d->name);
        if (!(d->name = strdup(pname))) {
            snprintf(why, why_len, "no memory for a device name");
            return 1;
        }
        return 0;
    }
    int64_t t;
    if (!to_ns(json_get(ev, "ts"), &t)) {
        snprintf(why, why_len, "no \"ts\" (a number of microseconds within +-1e15)");
        return 1;
    }
    if (args && args->type != JSON_OBJECT) {
        snprintf(why, why_len, "\"args\" is not an object");
        return 1;
    }
    tl_device *d = device_for(m, pid, why, why_len);
    if (!d)
        return 1;
    if (kind == 1)
        return add_sample(m, d, t, args, why, why_len);
    if (kind == 2)
        return add_alloc_or_free(m, d, is(name, "alloc"), t, args, why, why_len);
    return add_mark(m, d, is(cat, "copy") ? TL_MARK_COPY : TL_MARK_EVICT, t, ev, args, why,
                    why_len);
}

/* Reads the Chrome trace at path into m. Returns 0 or the exit code after
 * printing the error. */
static int read_chrome_trace(const char *path, tl_model *m)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "unimem %s: cannot open %s: %s\n", TL_CMD, path, strerror(errno));
        return 1;
    }
    struct stat st;
    m->fd = fd;
    m->file_bytes = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
    char err[600];
    int rc = json_read_trace(fd, TL_MAX_JSON_BYTES, on_event, m, err, sizeof err);
    tool_progress_clear();
    m->fd = -1;
    close(fd);
    if (rc != 0) {
        fprintf(stderr, "unimem %s: %s: malformed Chrome trace: %s\n", TL_CMD, path, err);
        return 1;
    }
    /* Blocks still open at the end live until the trace's last moment. */
    for (size_t i = 0; i < m->ndevs; i++) {
        tl_device *d = m->devs[i];
        for (size_t j = 0; j < d->open_cap; j++) {
            const tl_open *o = &d->open[j];
            if (!o->used)
                continue;
            tl_band b = {
                o->start, m->tmax > o->start ? m->tmax : o->start, o->size, o->addr, o->seq, false};
            offer_band(m, d, &b);
        }
    }
    return 0;
}

/* -------------------------------------------------- allocation trace */

/* One event of the allocation trace as the replay needs it. */
typedef struct tl_replay_event {
    uint64_t size;
    uint32_t slot;
    uint32_t stream; /* index into the trace's distinct stream values */
    bool alloc;
} tl_replay_event;

/* Replays the allocation trace o->trace through um_malloc/um_free on a
 * fresh context whose trace_file is json_path, as `unimem replay` does for
 * the pool (the events are read first, streams made for every stream value
 * but 0, the default stream), so the page shows the figures replay
 * reports. Returns 0 or the exit code after printing the error. */
static int replay_to_chrome_trace(const tl_opts *o, const char *json_path)
{
    um_trace *tr = NULL;
    um_status s = um_trace_open(o->trace, &tr);
    if (s != UM_OK)
        return tool_fail(TL_CMD, s);
    tl_replay_event *ev = NULL;
    size_t n = 0, cap = 0;
    uint64_t *stream_values = NULL;
    size_t nstreams = 0, streams_cap = 0;
    um_trace_event e;
    int done = 0, rc = 0;
    while ((s = um_trace_next(tr, &e, &done)) == UM_OK && !done) {
        if (n == TL_MAX_REPLAY_EVENTS) {
            tool_progress_clear();
            fprintf(stderr, "unimem %s: %s: more than %zu events, the most the timeline replays\n",
                    TL_CMD, o->trace, TL_MAX_REPLAY_EVENTS);
            rc = 1;
            break;
        }
        size_t si = 0;
        while (si < nstreams && stream_values[si] != e.stream)
            si++;
        if (si == nstreams &&
            !grow((void **)&stream_values, &streams_cap, nstreams, sizeof *stream_values)) {
            rc = 1;
            break;
        }
        if (si == nstreams)
            stream_values[nstreams++] = e.stream;
        if (!grow((void **)&ev, &cap, n, sizeof *ev)) {
            tool_progress_clear();
            fprintf(stderr, "unimem %s: no memory for %zu trace events\n", TL_CMD, n + 1);
            rc = 1;
            break;
        }
        ev[n++] = (tl_replay_event){e.size, (uint32_t)e.slot, (uint32_t)si, e.op == UM_TRACE_ALLOC};
        if ((n & 4095) == 0)
            tool_progress("reading trace", um_trace_progress(tr));
    }
    tool_progress_clear();
    uint64_t slots = um_trace_slots(tr);
    um_trace_close(tr);
    if (rc == 0 && s != UM_OK)
        rc = tool_fail(TL_CMD, s);
    /* Nothing to replay gives a page with nothing on it. */
    if (rc == 0 && n == 0) {
        fprintf(stderr, "unimem %s: %s has no events\n", TL_CMD, o->trace);
        rc = TOOL_EXIT_FAILED;
    }
    if (rc != 0) {
        free(ev);
        free(stream_values);
        return rc;
    }

    bool host = !strcmp(o->device, "host");
    int dev = host ? 0 : 1;
    char conf[768];
    /* trace_file goes last: string options run to the end of the list. */
    if (host)
        snprintf(conf, sizeof conf, "allocator=%s,trace_file=%s", o->allocator, json_path);
    else
        snprintf(conf, sizeof conf, "devices=%s,allocator=%s,trace_file=%s", o->device,
                 o->allocator, json_path);
    um_context *ctx = NULL;
    um_stream *streams = calloc(nstreams ? nstreams : 1, sizeof *streams);
    void **ptrs = calloc(slots ? slots : 1, sizeof *ptrs);
    uint64_t failed = 0;
    if (!streams || !ptrs) {
        fprintf(stderr, "unimem %s: no memory for %llu block pointers\n", TL_CMD,
                (unsigned long long)slots);
        rc = 1;
        goto out;
    }
    if ((s = um_init(conf, &ctx)) != UM_OK) {
        rc = tool_init_fail(TL_CMD, s); /* a --device the options refuse: 2 */
        ctx = NULL;
        goto out;
    }
    if (um_device_count(ctx) <= dev) {
        fprintf(stderr, "unimem %s: --device %s gives no accelerator to replay on\n", TL_CMD,
                o->device);
        rc = TOOL_EXIT_USAGE;
        goto out;
    }
    for (size_t i = 0; i < nstreams; i++) {
        if (stream_values[i] != 0 && (s = um_stream_create(ctx, dev, &streams[i])) != UM_OK) {
            rc = tool_fail(TL_CMD, s);
            goto out;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if ((i & 4095) == 0)
            tool_progress("replaying trace", (double)i / (double)n);
        um_stream st = streams[ev[i].stream];
        void **p = &ptrs[ev[i].slot];
        if (ev[i].alloc) {
            s = um_malloc(ctx, dev, (size_t)ev[i].size, st, p);
            if (s == UM_ERR_NOMEM) {
                failed++;
                *p = NULL; /* its free is skipped, as in unimem replay */
            } else if (s != UM_OK) {
                rc = tool_fail(TL_CMD, s);
                goto out;
            }
        } else if (*p) {
            if ((s = um_free(ctx, *p, st)) != UM_OK) {
                rc = tool_fail(TL_CMD, s);
                goto out;
            }
            *p = NULL;
        }
    }
    tool_progress_clear();
    if (failed)
        fprintf(stderr, "unimem %s: %llu of the trace's allocations failed on %s (out of memory)\n",
                TL_CMD, (unsigned long long)failed, o->device);
out:
    for (size_t i = 0; ctx && streams && i < nstreams; i++)
        if (streams[i])
            um_stream_destroy(ctx, streams[i]);
    if (ctx)
        um_shutdown(ctx); /* writes the rest of the trace; gives back what is still live */
    free(streams);
    free(ptrs);
    free(ev);
    free(stream_values);
    return rc;
}

/* The UTF-8 byte-order mark some editors write at the start of a text
 * file. It is no part of the text, so neither format's sniffing nor its
 * reading may take it for the document's first character. */
static const unsigned char utf8_bom[3] = {0xEF, 0xBB, 0xBF};

/* Whether the file holds JSON: its first byte that is not white space,
 * after a UTF-8 byte-order mark if it starts with one, is '{'
 * or '['. Returns 0 or the exit code after printing the error. */
static int sniff_json(const char *path, bool *is_json)
{
    gzFile gz = gzopen(path, "rb");
    if (!gz) {
        fprintf(stderr, "unimem %s: cannot open %s: %s\n", TL_CMD, path, strerror(errno));
        return 1;
    }
    char buf[4096];
    int c = -1, got;
    bool first = true;
    while (c < 0 && (got = gzread(gz, buf, (unsigned)sizeof buf)) > 0) {
        int i = 0;
        /* gzread fills the buffer unless the input ends, so a mark at the
         * start of the file is whole in the first read. */
        if (first && got >= (int)sizeof utf8_bom && !memcmp(buf, utf8_bom, sizeof utf8_bom))
            i = (int)sizeof utf8_bom;
        first = false;
        for (; i < got && c < 0; i++)
            if (buf[i] != ' ' && buf[i] != '\t' && buf[i] != '\n' && buf[i] != '\r')
                c = (unsigned char)buf[i];
    }
    int zerr = Z_OK;
    const char *msg = gzerror(gz, &zerr);
    int rc = 0;
    if (c < 0 && zerr == Z_BUF_ERROR) {
        /* zlib's word for a gzip stream that stops short: the file was
         * cut, not empty. */
        fprintf(stderr, "unimem %s: cannot read %s: gzip data truncated (unexpected end of file)\n",
                TL_CMD, path);
        rc = 1;
    } else if (c < 0 && zerr != Z_OK) {
        fprintf(stderr, "unimem %s: cannot read %s: %s\n", TL_CMD, path,
                zerr == Z_ERRNO ? strerror(errno) : msg);
        rc = 1;
    } else if (c < 0) {
        fprintf(stderr, "unimem %s: %s is empty (neither a Chrome trace nor an allocation trace)\n",
                TL_CMD, path);
        rc = 1;
    }
    gzclose(gz);
    *is_json = c == '{' || c == '[';
    return rc;
}

/* ---------------------------------------------------------------- page */

/* s as a JSON string that is safe inside <script>: '<' is escaped so no
 * "</script>" can end the element early. */
static void put_js_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p == '<' || *p == '>' || *p == '&')
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static void put_html_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&':
            fputs("&amp;", f);
            break;
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc(*s, f);
        }
    }
}

/* Element `index` of a number array: a comma before all but the first.
 * Written without printf, whose cost per call shows on the millions of
 * numbers in the page of a large trace. */
static void put_int(FILE *f, int64_t v, size_t index)
{
    char buf[24], *p = buf + sizeof buf;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--p = '-';
    if (index)
        *--p = ',';
    fwrite(p, 1, (size_t)(buf + sizeof buf - p), f);
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/* The indices of the samples to draw, in order. Up to limit, all of them;
 * beyond, the samples are grouped into limit/8 equal stretches of time and
 * each stretch keeps its first and last sample and, of each series, the
 * first sample with its lowest and with its highest value: at most eight
 * a stretch, so at most limit in all. So every peak,
 * every trough and the final values survive exactly, and a stretch is
 * narrower than a pixel unless the view is zoomed in a hundredfold. */
static size_t thin_samples(const tl_device *d, size_t limit, size_t *keep)
{
    size_t n = d->nsamples;
    if (n <= limit) {
        for (size_t i = 0; i < n; i++)
            keep[i] = i;
        return n;
    }
    const tl_sample *s = d->samples;
    uint64_t buckets = limit / 8, span = (uint64_t)(s[n - 1].t - s[0].t) + 1;
    size_t out = 0;
    for (size_t a = 0; a < n;) {
        uint64_t bucket = (uint64_t)((double)(s[a].t - s[0].t) / (double)span * (double)buckets);
        size_t b = a + 1;
        while (b < n &&
               (uint64_t)((double)(s[b].t - s[0].t) / (double)span * (double)buckets) == bucket)
            b++;
        size_t pick[8] = {a, b - 1, a, a, a, a, a, a};
        for (size_t i = a + 1; i < b; i++) {
            if (s[i].live < s[pick[2]].live)
                pick[2] = i;
            if (s[i].live > s[pick[3]].live)
                pick[3] = i;
            if (s[i].reserved < s[pick[4]].reserved)
                pick[4] = i;
            if (s[i].reserved > s[pick[5]].reserved)
                pick[5] = i;
            if (s[i].cached < s[pick[6]].cached)
                pick[6] = i;
            if (s[i].cached > s[pick[7]].cached)
                pick[7] = i;
        }
        qsort(pick, 8, sizeof pick[0], cmp_size);
        for (size_t i = 0; i < 8; i++)
            if (i == 0 || pick[i] != pick[i - 1])
                keep[out++] = pick[i];
        a = b;
    }
    return out;
}

static int cmp_band_start(const void *a, const void *b)
{
    const tl_band *x = a, *y = b;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    return band_better(x, y) ? -1 : band_better(y, x);
}

static bool device_has_data(const tl_device *d)
{
    return d->nonzero || d->blocks || d->nmarks;
}

static int cmp_device(const void *a, const void *b)
{
    const tl_device *x = *(tl_device *const *)a, *y = *(tl_device *const *)b;
    return x->pid < y->pid ? -1 : x->pid > y->pid;
}

/* A series of the kept samples, delta-coded (the page adds them up), as
 * "key":[...] . which: 0 time, 1 live, 2 reserved, 3 cached. Byte values
 * are at most TL_MAX_BYTES and times within +-1e18 ns (add_sample, to_ns),
 * so no difference overflows int64_t. */
static void put_series(FILE *f, const char *key, const tl_device *d, const size_t *keep,
                       size_t nkeep, int which, int64_t t0)
{
    fprintf(f, ",\"%s\":[", key);
    int64_t prev = which == 0 ? t0 : 0;
    for (size_t i = 0; i < nkeep; i++) {
        const tl_sample *s = &d->samples[keep[i]];
        int64_t v = which == 0   ? s->t
                    : which == 1 ? (int64_t)s->live
                    : which == 2 ? (int64_t)s->reserved
                                 : (int64_t)s->cached;
        put_int(f, v - prev, i);
        prev = v;
    }
    fputc(']', f);
}

/* What a page drew: the devices, their counter samples as read and as
 * written after thinning, and their copies and evictions. */
typedef struct tl_drawn {
    size_t devices, samples, samples_kept, marks;
} tl_drawn;

static int write_page(const tl_opts *o, tl_model *m, const char *source, tl_drawn *drawn)
{
    memset(drawn, 0, sizeof *drawn);
    FILE *f = fopen(o->out, "w");
    if (!f) {
        fprintf(stderr, "unimem %s: cannot write %s: %s\n", TL_CMD, o->out, strerror(errno));
        return 1;
    }
    static char iobuf[1 << 20];
    setvbuf(f, iobuf, _IOFBF, sizeof iobuf);
    const char *slash = strrchr(o->trace, '/');
    const char *name = slash ? slash + 1 : o->trace;
    char title[512];
    snprintf(title, sizeof title, "unimem timeline: %s", name);
    fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>", f);
    put_html_text(f, title);
    fputs("</title>\n", f);
    for (const char *const *line = tl_page_head; *line; line++)
        fprintf(f, "%s\n", *line);

    qsort(m->devs, m->ndevs, sizeof m->devs[0], cmp_device);
    int64_t t0 = m->have_time ? m->tmin : 0;
    fputs("{\"title\":", f);
    put_js_string(f, title);
    fputs(",\"source\":", f);
    put_js_string(f, source);
    fprintf(f, ",\"t1\":%lld,\"devices\":[", (long long)(m->have_time ? m->tmax - t0 : 0));
    size_t *keep = NULL;
    size_t shown = 0;
    int rc = 0;
    for (size_t i = 0; i < m->ndevs; i++) {
        tl_device *d = m->devs[i];
        if (!device_has_data(d))
            continue;
        size_t limit = TL_PAGE_SAMPLES;
        free(keep);
        if (!(keep = malloc((d->nsamples ? d->nsamples : 1) * sizeof *keep))) {
            fprintf(stderr, "unimem %s: no memory to lay out %zu samples\n", TL_CMD, d->nsamples);
            rc = 1;
            break;
        }
        size_t nkeep = thin_samples(d, limit, keep);
        drawn->devices++;
        drawn->samples += d->nsamples;
        drawn->samples_kept += nkeep;
        drawn->marks += d->nmarks;
        char fallback[64];
        snprintf(fallback, sizeof fallback, "device %lld", (long long)d->pid);
        fprintf(f, "%s\n{\"id\":%lld,\"name\":", shown++ ? "," : "", (long long)d->pid);
        put_js_string(f, d->name ? d->name : fallback);
        fprintf(f, ",\"blocks\":%llu,\"n_in\":%zu", (unsigned long long)d->blocks, d->nsamples);
        put_series(f, "t", d, keep, nkeep, 0, t0);
        put_series(f, "l", d, keep, nkeep, 1, t0);
        put_series(f, "r", d, keep, nkeep, 2, t0);
        if (d->cached_derived)
            fputs(",\"c\":0", f);
        else
            put_series(f, "c", d, keep, nkeep, 3, t0);
        if (d->ntop > 1)
            qsort(d->top, d->ntop, sizeof *d->top, cmp_band_start);
        fputs(",\n\"b\":[", f);
        for (size_t j = 0; j < d->ntop; j++) {
            const tl_band *b = &d->top[j];
            fprintf(f, "%s%lld,%lld,%llu,\"0x%llx\",%d", j ? "," : "", (long long)(b->start - t0),
                    (long long)(b->end - t0), (unsigned long long)b->size,
                    (unsigned long long)b->addr, b->freed ? 1 : 0);
        }
        fputc(']', f);
        fputs(",\n\"m\":[", f);
        for (size_t j = 0; j < d->nmarks; j++) {
            const tl_mark *k = &d->marks[j];
            int64_t fields[7] = {k->kind, k->t - t0, k->dur, (int64_t)k->bytes, k->a, k->b, k->c};
            for (size_t q = 0; q < 7; q++)
                put_int(f, fields[q], j * 7 + q);
        }
        fputc(']', f);
        fputc('}', f);
    }
    free(keep);
    fputs("]}\n", f);
    for (const char *const *line = tl_page_tail; *line; line++)
        fprintf(f, "%s\n", *line);
    if (ferror(f) && rc == 0) {
        fprintf(stderr, "unimem %s: writing %s failed: %s\n", TL_CMD, o->out, strerror(errno));
        rc = 1;
    }
    if (fclose(f) != 0 && rc == 0) {
        fprintf(stderr, "unimem %s: writing %s failed: %s\n", TL_CMD, o->out, strerror(errno));
        rc = 1;
    }
    if (rc != 0)
        remove(o->out);
    return rc;
}

/* ----------------------------------------------------------- the command */

/* Whether paths a and b name one file: the same name, or both exist and
 * are the same file (another name, a link). */
static bool same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    if (!strcmp(a, b))
        return true;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* Parses the arguments; returns -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, tl_opts *o)
{
    memset(o, 0, sizeof *o);
    o->device = TL_DEFAULT_DEVICE;
    o->allocator = "pool";
    o->top_n = TL_DEFAULT_TOP;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *key = NULL, *value = NULL;
        static const char *const keyed[] = {"-o",       "--output",    "--top",
                                            "--device", "--allocator", "--save-trace"};
        for (size_t k = 0; k < sizeof keyed / sizeof keyed[0] && !key; k++) {
            size_t len = strlen(keyed[k]);
            if (!strcmp(a, keyed[k]) && i + 1 < argc) {
                key = keyed[k];
                value = argv[++i];
            } else if (!strncmp(a, keyed[k], len) && a[len] == '=' && keyed[k][1] == '-') {
                key = keyed[k];
                value = a + len + 1;
            }
        }
        if (!key) {
            if (a[0] == '-' && a[1] != '\0')
                return tool_other_arg(TL_CMD, a, usage);
            if (o->trace) {
                fprintf(stderr, "unimem %s: one trace at a time ('%s' and '%s')\n\n", TL_CMD,
                        o->trace, a);
                usage(stderr);
                return 2;
            }
            o->trace = a;
            continue;
        }
        if (strcmp(key, "-o") && strcmp(key, "--output") && strcmp(key, "--top") &&
            !o->replay_arg)
            o->replay_arg = key;
        if (!strcmp(key, "-o") || !strcmp(key, "--output")) {
            o->out = value;
        } else if (!strcmp(key, "--top")) {
            char *end = NULL;
            errno = 0;
            unsigned long long n = strtoull(value, &end, 10);
            if (!*value || *end || *value == '-' || errno || n > TL_MAX_TOP) {
                fprintf(stderr, "unimem %s: bad --top '%s' (a count of blocks, 0 to %d)\n\n",
                        TL_CMD, value, TL_MAX_TOP);
                usage(stderr);
                return 2;
            }
            o->top_n = (size_t)n;
        } else if (!strcmp(key, "--device")) {
            if (!tool_device_arg_ok(TL_CMD, value)) {
                fputc('\n', stderr);
                usage(stderr);
                return TOOL_EXIT_USAGE;
            }
            o->device = value;
        } else if (!strcmp(key, "--allocator")) {
            if (strcmp(value, "pool") && strcmp(value, "direct") && strcmp(value, "bufcache")) {
                fprintf(stderr, "unimem %s: --allocator is pool, direct or bufcache, not '%s'\n\n",
                        TL_CMD, value);
                usage(stderr);
                return 2;
            }
            o->allocator = value;
        } else {
            /* trace_file holds at most 255 characters and ends at a comma
             * that starts another option. */
            if (!*value || strchr(value, ',') || strlen(value) > 255) {
                fprintf(stderr,
                        "unimem %s: --save-trace needs a path of at most 255 characters "
                        "without commas, not '%s'\n",
                        TL_CMD, value);
                return 2;
            }
            o->save_trace = value;
        }
    }
    if (!o->trace || !o->out) {
        fprintf(stderr, "unimem %s: %s\n\n", TL_CMD,
                !o->trace ? "no trace file given" : "no page to write given (-o PAGE.html)");
        usage(stderr);
        return 2;
    }
    /* Writing the page or the replay's trace over the input would lose it
     * (the replay would even overwrite it while reading it). */
    const char *clash = same_file(o->out, o->trace)                          ? "-o"
                        : o->save_trace && same_file(o->save_trace, o->trace) ? "--save-trace"
                                                                             : NULL;
    if (clash) {
        fprintf(stderr, "unimem %s: %s names the trace being read (%s); give another file\n",
                TL_CMD, clash, o->trace);
        return 2;
    }
    if (o->save_trace && same_file(o->save_trace, o->out)) {
        fprintf(stderr, "unimem %s: --save-trace and -o name the same file (%s)\n", TL_CMD,
                o->out);
        return 2;
    }
    return -1;
}

/* A file name for the replay's Chrome trace, made (empty) by mkstemps, in
 * $TMPDIR or /tmp. Returns 0 or the exit code after printing the error. */
static int make_temp_path(char *path, size_t len)
{
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir || strchr(dir, ',') || strlen(dir) > 200)
        dir = "/tmp";
    snprintf(path, len, "%s/unimem-timeline-XXXXXX.json", dir);
    int fd = mkstemps(path, 5);
    if (fd < 0) {
        fprintf(stderr, "unimem %s: cannot make a temporary file in %s: %s\n", TL_CMD, dir,
                strerror(errno));
        return 1;
    }
    close(fd);
    return 0;
}

int um_cmd_timeline(int argc, char **argv)
{
    tl_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;
    bool is_json = false;
    if ((rc = sniff_json(o.trace, &is_json)) != 0)
        return rc;
    char source[600];
    char temp[256] = "";
    const char *json_path = o.trace;
    if (is_json && o.replay_arg) {
        fprintf(stderr, "unimem %s: %s applies to allocation traces, which are replayed; %s is "
                "a Chrome trace, drawn as it is\n", TL_CMD, o.replay_arg, o.trace);
        return 2;
    }
    if (is_json) {
        snprintf(source, sizeof source, "Chrome trace %s", o.trace);
    } else {
        if (o.save_trace) {
            json_path = o.save_trace;
        } else {
            if ((rc = make_temp_path(temp, sizeof temp)) != 0)
                return rc;
            json_path = temp;
        }
        snprintf(source, sizeof source, "allocation trace %s replayed on %s (allocator %s)",
                 o.trace, o.device, o.allocator);
        rc = replay_to_chrome_trace(&o, json_path);
    }
    tl_model *m = calloc(1, sizeof *m);
    if (!m) {
        fprintf(stderr, "unimem %s: no memory for the timeline\n", TL_CMD);
        rc = 1;
    }
    if (rc == 0) {
        m->top_n = o.top_n;
        rc = read_chrome_trace(json_path, m);
    }
    /* A page with nothing on it would look like a broken page: say why
     * instead, as for an allocation trace with no events. */
    if (rc == 0 && m->total_samples == 0 && m->total_marks == 0) {
        fprintf(stderr, "unimem %s: %s has nothing to draw: no counter samples of live or "
                "reserved bytes, and no copies or evictions\n", TL_CMD, json_path);
        rc = TOOL_EXIT_FAILED;
    }
    tl_drawn drawn;
    if (rc == 0)
        rc = write_page(&o, m, source, &drawn);
    if (rc == 0) {
        /* The figures of the devices drawn: one with only zero samples
         * (the host of a replay) is left off the page and out of them. */
        char thinned[64] = "";
        if (drawn.samples_kept != drawn.samples)
            snprintf(thinned, sizeof thinned, " (%zu on the page, thinned)", drawn.samples_kept);
        printf("unimem %s: wrote %s: %zu device%s, %zu counter samples%s, %zu copy and eviction "
               "marks\n",
               TL_CMD, o.out, drawn.devices, drawn.devices == 1 ? "" : "s", drawn.samples, thinned,
               drawn.marks);
    }
    if (temp[0])
        remove(temp);
    if (m) {
        for (size_t i = 0; i < m->ndevs; i++)
            device_free(m->devs[i]);
        free(m);
    }
    return rc;
}
