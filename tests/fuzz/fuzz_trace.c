/*
 * fuzz_trace: the allocation-trace reader (um_trace_open / next / rewind /
 * slots / progress / close) on the fuzzer's bytes, written to a memfd and
 * opened as /proc/self/fd/N, four ways:
 *
 *   plain     the bytes as they are;
 *   gzip      the bytes gzip-compressed (the reader must give exactly what
 *             it gives for the plain text);
 *   truncated the gzip file cut short after its header (a prefix of the
 *             events, then an error: truncation must never pass as the end);
 *   raw       a gzip header followed by the bytes as deflate data (corrupt
 *             streams).
 *
 * Every run is checked for what holds of any input: each call returns an
 * event, the end, or UM_ERR_PARSE / UM_ERR_IO / UM_ERR_NOMEM with a message
 * "STATUS: path:LINE: ..." whose line comes after the last event's; an
 * error is sticky (the next call repeats it); events come in increasing
 * line order, an allocation has a new id, a size above 0 and the next
 * slot, a free names a live id and repeats its allocation's slot, size and
 * stream; um_trace_slots counts the allocations; um_trace_progress stays in
 * 0..1 and is 1 at the end; after um_trace_rewind the same run comes out
 * again. The plain and gzip runs are also compared, event by event and for
 * the line of their error, with a reference reader written here from the
 * format's description (include/unimem.h, src/trace/trace.c: lines of at
 * most 511 characters unless they are comments, tokens split at space,
 * tab, CR; "a <id> <size> <stream>", "f <id>", '#' comments). A line with
 * a NUL byte ends the comparison there (the reader sees the line cut at
 * the NUL; only the invariants are checked after it).
 */
#include "fuzz_common.h"

#include "base/base.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#define TRACE_MAX_INPUT (1u << 20)
#define LINE_MAX_CHARS 511 /* the reader's buffer is 512 bytes with the NUL */

typedef struct event {
    um_trace_op op;
    uint64_t id, slot, size, stream, line;
} event;

typedef enum end_kind { END_DONE, END_ERROR, END_UNKNOWN } end_kind;

typedef struct run {
    event *ev;
    size_t n, cap;
    end_kind end;
    um_status status;     /* END_ERROR: the status */
    uint64_t line;        /* END_ERROR: the line it names; END_UNKNOWN: the line with a NUL */
    char msg[600];
} run;

static int memfd = -1;
static char memfd_path[64];

/* ---------------------------------------------------------------- ids */

/* Open addressing over ids: the state of every id an event has named. */
typedef struct id_entry {
    uint64_t id;
    uint64_t slot, size, stream;
    int state; /* 0 empty, 1 live, 2 freed */
} id_entry;

typedef struct id_map {
    id_entry *v;
    size_t cap, used;
} id_map;

static uint64_t id_hash(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static id_entry *id_find(id_map *m, uint64_t id)
{
    if ((m->used + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 256;
        id_entry *v = calloc(cap, sizeof *v);
        FUZZ_CHECK(v != NULL, "out of memory");
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->v[i].state)
                continue;
            size_t j = id_hash(m->v[i].id) & (cap - 1);
            while (v[j].state)
                j = (j + 1) & (cap - 1);
            v[j] = m->v[i];
        }
        free(m->v);
        m->v = v;
        m->cap = cap;
    }
    size_t j = id_hash(id) & (m->cap - 1);
    while (m->v[j].state && m->v[j].id != id)
        j = (j + 1) & (m->cap - 1);
    return &m->v[j];
}

static void id_map_free(id_map *m)
{
    free(m->v);
    m->v = NULL;
    m->cap = m->used = 0;
}

static void run_add(run *r, const event *e)
{
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->ev = realloc(r->ev, r->cap * sizeof *r->ev);
        FUZZ_CHECK(r->ev != NULL, "out of memory");
    }
    r->ev[r->n++] = *e;
}

static void run_free(run *r)
{
    free(r->ev);
    memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------- reference */

static bool ref_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* The next token of s[0..len) from *pos. */
static size_t ref_token(const char *s, size_t len, size_t *pos, const char **tok)
{
    size_t i = *pos;
    while (i < len && ref_space(s[i]))
        i++;
    size_t j = i;
    while (j < len && !ref_space(s[j]))
        j++;
    *tok = s + i;
    *pos = j;
    return j - i;
}

static bool ref_number(const char *s, size_t len, size_t *pos, uint64_t *out)
{
    const char *tok;
    size_t n = ref_token(s, len, pos, &tok);
    if (n == 0)
        return false;
    unsigned __int128 v = 0;
    for (size_t i = 0; i < n; i++) {
        if (tok[i] < '0' || tok[i] > '9')
            return false;
        v = v * 10 + (unsigned)(tok[i] - '0');
        if (v > UINT64_MAX)
            return false;
    }
    *out = (uint64_t)v;
    return true;
}

/* What the reader must make of text[0..len). */
static void reference(const char *text, size_t len, run *out)
{
    id_map ids = {0};
    uint64_t slots = 0, line = 0;
    out->end = END_DONE;
    for (size_t at = 0; at < len;) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t l = nl ? (size_t)(nl - (text + at)) : len - at;
        const char *s = text + at;
        at += l + (nl ? 1 : 0);
        line++;
        /* A UTF-8 byte-order mark before the first line is no part of it,
         * but its bytes count towards that line's length limit. */
        size_t max_chars = LINE_MAX_CHARS;
        if (line == 1 && l >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3)) {
            s += 3;
            l -= 3;
            max_chars -= 3;
        }
        if (memchr(s, '\0', l)) {
            out->end = END_UNKNOWN;
            out->line = line;
            break;
        }
        if (l > max_chars) {
            size_t i = 0;
            while (i < l && (s[i] == ' ' || s[i] == '\t'))
                i++;
            if (i >= max_chars || s[i] != '#') {
                out->end = END_ERROR;
                out->status = UM_ERR_PARSE;
                out->line = line;
                break;
            }
            continue; /* a long comment */
        }
        size_t pos = 0;
        const char *op;
        size_t oplen = ref_token(s, l, &pos, &op);
        if (oplen == 0 || op[0] == '#')
            continue;
        event e = {UM_TRACE_ALLOC, 0, 0, 0, 0, line};
        const char *extra;
        bool ok = oplen == 1 && (op[0] == 'a' || op[0] == 'f') && ref_number(s, l, &pos, &e.id);
        if (ok && op[0] == 'a') {
            ok = ref_number(s, l, &pos, &e.size) && ref_number(s, l, &pos, &e.stream) &&
                 ref_token(s, l, &pos, &extra) == 0 && e.size != 0;
            id_entry *x = ok ? id_find(&ids, e.id) : NULL;
            ok = ok && x->state == 0;
            if (ok) {
                *x = (id_entry){e.id, slots, e.size, e.stream, 1};
                ids.used++;
                e.slot = slots++;
            }
        } else if (ok) {
            e.op = UM_TRACE_FREE;
            ok = ref_token(s, l, &pos, &extra) == 0;
            id_entry *x = ok ? id_find(&ids, e.id) : NULL;
            ok = ok && x->state == 1;
            if (ok) {
                x->state = 2;
                e.slot = x->slot;
                e.size = x->size;
                e.stream = x->stream;
            }
        }
        if (!ok) {
            out->end = END_ERROR;
            out->status = UM_ERR_PARSE;
            out->line = line;
            break;
        }
        run_add(out, &e);
    }
    id_map_free(&ids);
}

/* ------------------------------------------------------------- reader */

/* The line number in "STATUS: path:LINE: ...", or 0 when it is not there. */
static uint64_t message_line(const char *msg)
{
    const char *p = strstr(msg, memfd_path);
    if (!p)
        return 0;
    p += strlen(memfd_path);
    if (*p++ != ':')
        return 0;
    uint64_t v = 0;
    bool digits = false;
    for (; *p >= '0' && *p <= '9'; p++, digits = true)
        v = v * 10 + (uint64_t)(*p - '0');
    return digits && *p == ':' ? v : 0;
}

/* Reads t to its end or first error, checking the invariants. */
static void read_all(um_trace *t, run *r, const char *how)
{
    id_map ids = {0};
    uint64_t slots = 0, last_line = 0;
    for (;;) {
        um_trace_event ev;
        memset(&ev, 0xa5, sizeof ev);
        int done = -1;
        um__clear_error();
        um_status st = um_trace_next(t, &ev, &done);
        double pr = um_trace_progress(t);
        FUZZ_CHECK(pr >= 0.0 && pr <= 1.0, "%s: progress %g", how, pr);
        if (st != UM_OK) {
            FUZZ_CHECK(st == UM_ERR_PARSE || st == UM_ERR_IO || st == UM_ERR_NOMEM,
                       "%s: um_trace_next returned %s", how, um_status_name(st));
            FUZZ_CHECK(fuzz_error_names(st), "%s: %s without a message", how, um_status_name(st));
            uint64_t l = message_line(um_last_error());
            FUZZ_CHECK(l > last_line, "%s: error '%s' does not name a line after %llu", how,
                       um_last_error(), (unsigned long long)last_line);
            r->end = END_ERROR;
            r->status = st;
            r->line = l;
            snprintf(r->msg, sizeof r->msg, "%s", um_last_error());
            /* Sticky. */
            um_status again = um_trace_next(t, &ev, &done);
            FUZZ_CHECK(again == st && strcmp(um_last_error(), r->msg) == 0,
                       "%s: after '%s' the next call gave %s '%s'", how, r->msg,
                       um_status_name(again), um_last_error());
            break;
        }
        FUZZ_CHECK(done == 0 || done == 1, "%s: done is %d", how, done);
        if (done) {
            FUZZ_CHECK(pr == 1.0, "%s: progress %g at the end", how, pr);
            /* The end stays the end. */
            done = -1;
            FUZZ_CHECK(um_trace_next(t, &ev, &done) == UM_OK && done == 1,
                       "%s: the end did not repeat", how);
            r->end = END_DONE;
            break;
        }
        FUZZ_CHECK(ev.line > last_line, "%s: event on line %llu after line %llu", how,
                   (unsigned long long)ev.line, (unsigned long long)last_line);
        last_line = ev.line;
        id_entry *x = id_find(&ids, ev.id);
        if (ev.op == UM_TRACE_ALLOC) {
            FUZZ_CHECK(x->state == 0, "%s: line %llu allocates id %llu again", how,
                       (unsigned long long)ev.line, (unsigned long long)ev.id);
            FUZZ_CHECK(ev.size > 0, "%s: line %llu: size 0", how, (unsigned long long)ev.line);
            FUZZ_CHECK(ev.slot == slots, "%s: line %llu: slot %llu, expected %llu", how,
                       (unsigned long long)ev.line, (unsigned long long)ev.slot,
                       (unsigned long long)slots);
            *x = (id_entry){ev.id, ev.slot, ev.size, ev.stream, 1};
            ids.used++;
            slots++;
        } else {
            FUZZ_CHECK(ev.op == UM_TRACE_FREE, "%s: op %d", how, (int)ev.op);
            FUZZ_CHECK(x->state == 1, "%s: line %llu frees id %llu, which is %s", how,
                       (unsigned long long)ev.line, (unsigned long long)ev.id,
                       x->state ? "freed already" : "unknown");
            FUZZ_CHECK(ev.slot == x->slot && ev.size == x->size && ev.stream == x->stream,
                       "%s: line %llu: the free of id %llu does not repeat its allocation", how,
                       (unsigned long long)ev.line, (unsigned long long)ev.id);
            x->state = 2;
        }
        FUZZ_CHECK(um_trace_slots(t) == slots, "%s: um_trace_slots %llu, %llu allocations", how,
                   (unsigned long long)um_trace_slots(t), (unsigned long long)slots);
        event e = {ev.op, ev.id, ev.slot, ev.size, ev.stream, ev.line};
        run_add(r, &e);
    }
    id_map_free(&ids);
}

static bool same_event(const event *a, const event *b)
{
    return a->op == b->op && a->id == b->id && a->slot == b->slot && a->size == b->size &&
           a->stream == b->stream && a->line == b->line;
}

static void same_runs(const run *a, const run *b, const char *how)
{
    FUZZ_CHECK(a->n == b->n, "%s: %zu events, then %zu", how, a->n, b->n);
    for (size_t i = 0; i < a->n; i++)
        FUZZ_CHECK(same_event(&a->ev[i], &b->ev[i]), "%s: event %zu differs (line %llu)", how, i,
                   (unsigned long long)a->ev[i].line);
    FUZZ_CHECK(a->end == b->end && a->status == b->status && strcmp(a->msg, b->msg) == 0,
               "%s: ended with '%s', then '%s'", how, a->msg, b->msg);
}

/* Writes bytes to the memfd and reads it as a trace, twice (rewind). */
static void read_file(const void *bytes, size_t n, run *r, const char *how)
{
    FUZZ_CHECK(ftruncate(memfd, 0) == 0, "ftruncate: %s", strerror(errno));
    FUZZ_CHECK(n == 0 || pwrite(memfd, bytes, n, 0) == (ssize_t)n, "pwrite: %s", strerror(errno));
    um_trace *t = NULL;
    um_status st = um_trace_open(memfd_path, &t);
    FUZZ_CHECK(st == UM_OK && t, "%s: um_trace_open: %s", how, um_last_error());
    FUZZ_CHECK(um_trace_slots(t) == 0, "%s: slots before reading", how);
    read_all(t, r, how);
    run second = {0};
    um_status rw = um_trace_rewind(t);
    /* Rewinding works after any error, corrupt gzip data too (F1 of the
     * first fuzzing run, tests/test_fuzz_findings.c). */
    FUZZ_CHECK(rw == UM_OK, "%s: rewind after '%s': %s", how, r->msg, um_last_error());
    FUZZ_CHECK(um_trace_slots(t) == 0, "%s: slots after rewind", how);
    read_all(t, &second, how);
    same_runs(r, &second, how);
    run_free(&second);
    um_trace_close(t);
}

/* The reader against the reference. prefix_only: the file was cut short,
 * so the events are a prefix and the run must end in an error. */
static void compare(const run *got, const run *want, bool prefix_only, const char *how)
{
    size_t n = want->n;
    if (want->end == END_UNKNOWN) {
        /* Up to the line with the NUL, the same events. */
        size_t k = 0;
        while (k < got->n && got->ev[k].line < want->line)
            k++;
        FUZZ_CHECK(k <= n, "%s: %zu events before line %llu, the reference has %zu", how, k,
                   (unsigned long long)want->line, n);
        FUZZ_CHECK(prefix_only || k == n || got->end == END_ERROR,
                   "%s: %zu events before line %llu, the reference has %zu", how, k,
                   (unsigned long long)want->line, n);
        for (size_t i = 0; i < k; i++)
            FUZZ_CHECK(same_event(&got->ev[i], &want->ev[i]), "%s: event %zu (line %llu) differs",
                       how, i, (unsigned long long)got->ev[i].line);
        FUZZ_CHECK(got->end != END_ERROR || got->line >= want->line || prefix_only,
                   "%s: error '%s' before line %llu, which the reference reads", how, got->msg,
                   (unsigned long long)want->line);
        return;
    }
    if (prefix_only) {
        FUZZ_CHECK(got->n <= n, "%s: %zu events from a cut file, the whole has %zu", how, got->n,
                   n);
        for (size_t i = 0; i < got->n; i++)
            FUZZ_CHECK(same_event(&got->ev[i], &want->ev[i]), "%s: event %zu (line %llu) differs",
                       how, i, (unsigned long long)got->ev[i].line);
        FUZZ_CHECK(got->end == END_ERROR, "%s: a cut gzip file read to its end (%zu events of %zu)",
                   how, got->n, n);
        if (want->end == END_ERROR)
            FUZZ_CHECK(got->line <= want->line, "%s: error at line %llu, the whole fails at %llu",
                       how, (unsigned long long)got->line, (unsigned long long)want->line);
        return;
    }
    FUZZ_CHECK(got->n == n, "%s: %zu events, the reference has %zu (first difference at line "
                            "%llu)",
               how, got->n, n,
               (unsigned long long)(got->n < n ? want->ev[got->n].line
                                    : n < got->n ? got->ev[n].line : 0));
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(same_event(&got->ev[i], &want->ev[i]), "%s: event %zu (line %llu) differs", how,
                   i, (unsigned long long)want->ev[i].line);
    FUZZ_CHECK(got->end == want->end, "%s: %s, the reference %s ('%s')", how,
               got->end == END_DONE ? "read to the end" : "failed",
               want->end == END_DONE ? "reads to the end" : "fails", got->msg);
    if (want->end == END_ERROR)
        FUZZ_CHECK(got->status == want->status && got->line == want->line,
                   "%s: '%s', the reference fails with %s at line %llu", how, got->msg,
                   um_status_name(want->status), (unsigned long long)want->line);
}

/* ---------------------------------------------------------------- gzip */

static uint8_t *gzip_of(const uint8_t *in, size_t n, size_t *out_n)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    FUZZ_CHECK(deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK,
               "deflateInit2");
    size_t cap = deflateBound(&z, (uLong)n) + 64;
    uint8_t *out = malloc(cap);
    FUZZ_CHECK(out != NULL, "out of memory");
    z.next_in = (Bytef *)(uintptr_t)in;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    FUZZ_CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END, "deflate");
    *out_n = cap - z.avail_out;
    deflateEnd(&z);
    return out;
}

/* --------------------------------------------------------------- entry */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    memfd = memfd_create("fuzz_trace", MFD_CLOEXEC);
    if (memfd < 0) {
        fprintf(stderr, "fuzz_trace: memfd_create: %s\n", strerror(errno));
        abort();
    }
    snprintf(memfd_path, sizeof memfd_path, "/proc/self/fd/%d", memfd);
    /* Paths that cannot be traces. */
    um_trace *t = (um_trace *)&memfd;
    FUZZ_CHECK(um_trace_open("/", &t) == UM_ERR_IO && t == NULL, "a directory opened as a trace");
    FUZZ_CHECK(um_trace_open("/nonexistent/fuzz.trace", &t) == UM_ERR_IO && t == NULL,
               "a missing file opened as a trace");
    FUZZ_CHECK(um_trace_open(NULL, &t) == UM_ERR_INVALID, "NULL path");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > TRACE_MAX_INPUT)
        return -1;
    run want = {0};
    reference((const char *)data, size, &want);

    /* Plain: zlib reads a file that starts with the gzip magic as gzip, so
     * the reference applies only to the others. */
    run plain = {0};
    read_file(data, size, &plain, "plain");
    if (!(size >= 2 && data[0] == 0x1f && data[1] == 0x8b))
        compare(&plain, &want, false, "plain");
    run_free(&plain);

    size_t gn = 0;
    uint8_t *gz = gzip_of(data, size, &gn);
    run zipped = {0};
    read_file(gz, gn, &zipped, "gzip");
    compare(&zipped, &want, false, "gzip");
    run_free(&zipped);

    /* Cut after the 10-byte header, somewhere the input picks. */
    uint64_t h = 0x243f6a8885a308d3ull;
    for (size_t i = 0; i < size; i++)
        h = (h ^ data[i]) * 0x100000001b3ull;
    size_t cut = 10 + (size_t)(h % (gn - 10));
    run cutrun = {0};
    read_file(gz, cut, &cutrun, "truncated gzip");
    compare(&cutrun, &want, true, "truncated gzip");
    run_free(&cutrun);
    free(gz);

    /* The bytes as a deflate stream after a gzip header. */
    uint8_t *raw = malloc(size + 10);
    FUZZ_CHECK(raw != NULL, "out of memory");
    static const uint8_t header[10] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
    memcpy(raw, header, 10);
    if (size)
        memcpy(raw + 10, data, size);
    run rawrun = {0};
    read_file(raw, size + 10, &rawrun, "raw deflate");
    run_free(&rawrun);
    free(raw);

    run_free(&want);
    return 0;
}
