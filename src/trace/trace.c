/*
 * trace: the reader of allocation traces (the format of shared/traces:
 * "a <id> <size> <stream>" and "f <id>" lines, '#' comments, gzip or plain
 * text). Owns the open file, the id -> slot map and the state of every block
 * the trace has named so far, so each event is validated as it is read and a
 * free can report the size and stream its block was allocated with.
 */
#include "../base/base.h"
#include "../base/gzin.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Longest line accepted, newline included. Event lines need at most 64
 * characters, so anything longer is corrupt; comment lines may be longer and
 * are skipped whole. */
#define TRACE_LINE_MAX 512
/* The file is read, and gzip data inflated, in blocks this large, so that
 * both run in big strides. */
#define TRACE_IO_BUFFER (256u * 1024u)
/* Set in a map entry's line once its block has been freed. */
#define TRACE_FREED (1ull << 63)

/* One block the trace has allocated. line is the line of its allocation, or
 * of its free with TRACE_FREED set; 0 marks an empty map entry (lines are
 * 1-based). */
typedef struct trace_entry {
    uint64_t id;
    uint64_t slot;
    uint64_t size;
    uint64_t stream;
    uint64_t line;
} trace_entry;

struct um_trace {
    int fd;
    char *path;
    uint64_t file_size; /* 0 when unknown (a pipe) */
    uint64_t line;      /* lines read so far */
    int done;
    /* Once a read fails every later one fails the same way, so a caller that
     * ignores one error cannot read past the bad line. */
    um_status failed;
    char failmsg[400];

    trace_entry *map; /* open addressing, linear probing; capacity a power of two */
    size_t map_cap;
    size_t map_used; /* entries in use == slots handed out */

    um__gzin gz;               /* the file's text, plain or gzip */
    const unsigned char *text; /* text not yet split into lines */
    size_t text_len;

    char buf[TRACE_LINE_MAX];
};

/* splitmix64's finalizer: ids are arbitrary (pointers, counters), so they are
 * mixed before their low bits pick a bucket. */
static uint64_t trace_hash(uint64_t id)
{
    id ^= id >> 30;
    id *= 0xbf58476d1ce4e5b9ull;
    id ^= id >> 27;
    id *= 0x94d049bb133111ebull;
    return id ^ (id >> 31);
}

/* The entry for id, or the empty entry where it would go. */
static trace_entry *trace_lookup(trace_entry *map, size_t cap, uint64_t id)
{
    size_t mask = cap - 1;
    size_t i = (size_t)trace_hash(id) & mask;
    while (map[i].line != 0 && map[i].id != id)
        i = (i + 1) & mask;
    return &map[i];
}

/* Records a failure of the current line and makes it sticky. */
static um_status trace_error(um_trace *t, um_status s, const char *fmt, ...) UM_PRINTF(3, 4);
static um_status trace_error(um_trace *t, um_status s, const char *fmt, ...)
{
    char what[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(t->failmsg, sizeof t->failmsg, "%s:%llu: %s", t->path, (unsigned long long)t->line,
             what);
    t->failed = s;
    return um__fail(s, "%s", t->failmsg);
}

/* Doubles the map when it is half full; short probe sequences matter more
 * here than the memory. */
static um_status trace_map_reserve(um_trace *t)
{
    if ((t->map_used + 1) * 2 <= t->map_cap)
        return UM_OK;
    size_t cap = t->map_cap ? t->map_cap * 2 : 1024;
    trace_entry *map = calloc(cap, sizeof *map);
    if (!map)
        return trace_error(t, UM_ERR_NOMEM, "cannot grow the id map to %zu entries (%zu bytes)",
                           cap, cap * sizeof *map);
    for (size_t i = 0; i < t->map_cap; i++)
        if (t->map[i].line != 0)
            *trace_lookup(map, cap, t->map[i].id) = t->map[i];
    free(t->map);
    t->map = map;
    t->map_cap = cap;
    return UM_OK;
}

/* Copies a token for a message: at most 24 characters, unprintable bytes as
 * '?', so a binary file gives a readable error. */
static const char *trace_quote(char *out, size_t n, const char *tok, size_t len)
{
    size_t k = 0;
    for (size_t i = 0; i < len && k + 4 < n; i++) {
        if (i == 24) {
            memcpy(out + k, "...", 3);
            k += 3;
            break;
        }
        unsigned char c = (unsigned char)tok[i];
        out[k++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    out[k] = '\0';
    return out;
}

static bool trace_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* Splits the next whitespace-separated token off *p; 0 length at the end. */
static size_t trace_token(char **p, const char **tok)
{
    char *s = *p;
    while (trace_space(*s))
        s++;
    char *e = s;
    while (*e && !trace_space(*e))
        e++;
    *tok = s;
    *p = e;
    return (size_t)(e - s);
}

/* Parses the field named `what` as an unsigned decimal number. */
static um_status trace_number(um_trace *t, char **p, const char *what, uint64_t *out)
{
    const char *tok;
    size_t len = trace_token(p, &tok);
    char q[32];
    if (len == 0)
        return trace_error(t, UM_ERR_PARSE, "missing field <%s>", what);
    if (tok[0] == '-')
        return trace_error(t, UM_ERR_PARSE, "negative number '%s' for <%s>",
                           trace_quote(q, sizeof q, tok, len), what);
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned d = (unsigned)(unsigned char)tok[i] - '0';
        if (d > 9)
            return trace_error(t, UM_ERR_PARSE, "<%s> is not a number: '%s'", what,
                               trace_quote(q, sizeof q, tok, len));
        if (v > (UINT64_MAX - d) / 10)
            return trace_error(t, UM_ERR_PARSE, "<%s> '%s' does not fit in 64 bits", what,
                               trace_quote(q, sizeof q, tok, len));
        v = v * 10 + d;
    }
    *out = v;
    return UM_OK;
}

static um_status trace_end_of_line(um_trace *t, char **p, const char *form)
{
    const char *tok;
    size_t len = trace_token(p, &tok);
    char q[32];
    if (len != 0)
        return trace_error(t, UM_ERR_PARSE, "extra field '%s' (expected '%s')",
                           trace_quote(q, sizeof q, tok, len), form);
    return UM_OK;
}

/* Sets t->text to the next block of text, empty at its end. Errors name
 * the line being read (t->line): text is produced only as lines need it, so
 * a truncated or corrupt stream is reported at the line where it breaks. */
static um_status trace_fill(um_trace *t)
{
    um_status s = um__gzin_next(&t->gz, &t->text, &t->text_len);
    return s == UM_OK ? UM_OK : trace_error(t, s, "%s", t->gz.err);
}

/* Consumes text up to and including the next newline (or the end). */
static um_status trace_skip_line(um_trace *t)
{
    for (;;) {
        if (t->text_len == 0) {
            um_status s = trace_fill(t);
            if (s != UM_OK || t->text_len == 0)
                return s;
        }
        const unsigned char *nl = memchr(t->text, '\n', t->text_len);
        size_t n = nl ? (size_t)(nl - t->text) + 1 : t->text_len;
        t->text += n;
        t->text_len -= n;
        if (nl)
            return UM_OK;
    }
}

/* Reads one line into t->buf. *eof = 1 at the end of the file. A line
 * longer than the buffer is an error unless it is a comment, whose rest is
 * skipped. */
static um_status trace_read_line(um_trace *t, int *eof)
{
    t->line++; /* the line being read, for messages */
    const size_t max = sizeof t->buf - 1;
    size_t len = 0;
    bool newline = false;
    um_status s;
    while (len < max) {
        if (t->text_len == 0) {
            if ((s = trace_fill(t)) != UM_OK)
                return s;
            if (t->text_len == 0)
                break; /* the end of the file */
        }
        size_t n = t->text_len < max - len ? t->text_len : max - len;
        const unsigned char *nl = memchr(t->text, '\n', n);
        if (nl)
            n = (size_t)(nl - t->text) + 1;
        memcpy(t->buf + len, t->text, n);
        t->text += n;
        t->text_len -= n;
        len += n;
        if (nl) {
            newline = true;
            break;
        }
    }
    /* Whether the buffer filled before the line ended, decided before a
     * mark is taken off: the mark's bytes count towards the first line's
     * length. */
    bool full = !newline && len == max;
    /* A UTF-8 byte-order mark, which some editors put at the start of a
     * text file, is no part of the first line (it was read as part of its
     * operation: "unknown op"). */
    if (t->line == 1 && len >= 3 && !memcmp(t->buf, "\xEF\xBB\xBF", 3)) {
        memmove(t->buf, t->buf + 3, len - 3);
        len -= 3;
    }
    t->buf[len] = '\0';
    if (len == 0) {
        t->line--;
        *eof = 1;
        return UM_OK;
    }
    *eof = 0;
    /* The parser stops at a NUL, so a line with one is refused wherever it
     * is, the last line too, rather than cut short. */
    if (memchr(t->buf, '\0', len))
        return trace_error(t, UM_ERR_PARSE, "NUL byte in line");
    if (!full)
        return UM_OK;
    /* The buffer is full; the line may end exactly here. */
    if (t->text_len == 0 && (s = trace_fill(t)) != UM_OK)
        return s;
    if (t->text_len == 0)
        return UM_OK;
    if (t->text[0] == '\n') {
        t->text++;
        t->text_len--;
        return UM_OK;
    }
    const char *p = t->buf;
    while (*p == ' ' || *p == '\t')
        p++;
    /* The buffer holds max characters with no newline among them, and a
     * line of exactly max characters was accepted above, so the limit is
     * max characters, not counting the newline. */
    if (*p != '#')
        return trace_error(t, UM_ERR_PARSE, "line too long (more than %zu characters)", max);
    /* Skip the rest of a long comment. */
    return trace_skip_line(t);
}

um_status um_trace_open(const char *path, um_trace **out)
{
    if (!path || !out)
        return um__fail(UM_ERR_INVALID, "um_trace_open: %s is NULL", path ? "out" : "path");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return um__fail(UM_ERR_IO, "cannot open trace %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return um__fail(UM_ERR_IO, "cannot stat trace %s: %s", path, strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return um__fail(UM_ERR_IO, "trace %s is a directory", path);
    }
    um_trace *t = calloc(1, sizeof *t);
    char *name = strdup(path);
    um_status gs = t ? um__gzin_open(&t->gz, fd, TRACE_IO_BUFFER) : UM_ERR_NOMEM;
    if (!t || !name || gs != UM_OK) {
        um_status fail = um__fail(UM_ERR_NOMEM, "cannot allocate a reader for trace %s: %s",
                                  path, t && gs != UM_OK ? t->gz.err : "no memory");
        if (t)
            um__gzin_close(&t->gz);
        free(t);
        free(name);
        close(fd);
        return fail;
    }
    t->fd = fd;
    t->path = name;
    t->file_size = S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
    *out = t;
    return UM_OK;
}

um_status um_trace_next(um_trace *t, um_trace_event *ev, int *done)
{
    if (!t || !ev || !done)
        return um__fail(UM_ERR_INVALID, "um_trace_next: %s is NULL",
                        !t    ? "trace"
                        : !ev ? "event"
                              : "done");
    if (t->failed != UM_OK)
        return um__fail(t->failed, "%s", t->failmsg);
    *done = 0;
    for (;;) {
        if (t->done) {
            *done = 1;
            return UM_OK;
        }
        int eof = 0;
        um_status s = trace_read_line(t, &eof);
        if (s != UM_OK)
            return s;
        if (eof) {
            t->done = 1;
            continue;
        }
        char *p = t->buf;
        const char *op;
        size_t oplen = trace_token(&p, &op);
        if (oplen == 0 || op[0] == '#')
            continue; /* blank line or comment */
        char q[32];
        if (oplen != 1 || (op[0] != 'a' && op[0] != 'f'))
            return trace_error(t, UM_ERR_PARSE, "unknown op '%s' (expected 'a' or 'f')",
                               trace_quote(q, sizeof q, op, oplen));
        uint64_t id;
        if ((s = trace_number(t, &p, "id", &id)) != UM_OK)
            return s;
        if (op[0] == 'a') {
            uint64_t size, stream;
            if ((s = trace_number(t, &p, "size", &size)) != UM_OK ||
                (s = trace_number(t, &p, "stream", &stream)) != UM_OK ||
                (s = trace_end_of_line(t, &p, "a <id> <size> <stream>")) != UM_OK)
                return s;
            if (size == 0)
                return trace_error(t, UM_ERR_PARSE, "size 0 for id %llu", (unsigned long long)id);
            if ((s = trace_map_reserve(t)) != UM_OK)
                return s;
            trace_entry *e = trace_lookup(t->map, t->map_cap, id);
            if (e->line != 0)
                return trace_error(t, UM_ERR_PARSE, "duplicate id %llu (already %s on line %llu)",
                                   (unsigned long long)id,
                                   (e->line & TRACE_FREED) ? "freed" : "allocated",
                                   (unsigned long long)(e->line & ~TRACE_FREED));
            e->id = id;
            e->slot = t->map_used++;
            e->size = size;
            e->stream = stream;
            e->line = t->line;
            *ev = (um_trace_event){UM_TRACE_ALLOC, id, e->slot, size, stream, t->line};
            return UM_OK;
        }
        if ((s = trace_end_of_line(t, &p, "f <id>")) != UM_OK)
            return s;
        trace_entry *e = t->map_cap ? trace_lookup(t->map, t->map_cap, id) : NULL;
        if (!e || e->line == 0)
            return trace_error(t, UM_ERR_PARSE, "free of unknown id %llu", (unsigned long long)id);
        if (e->line & TRACE_FREED)
            return trace_error(t, UM_ERR_PARSE, "free of id %llu, already freed on line %llu",
                               (unsigned long long)id,
                               (unsigned long long)(e->line & ~TRACE_FREED));
        e->line = t->line | TRACE_FREED;
        *ev = (um_trace_event){UM_TRACE_FREE, id, e->slot, e->size, e->stream, t->line};
        return UM_OK;
    }
}

um_status um_trace_rewind(um_trace *t)
{
    if (!t)
        return um__fail(UM_ERR_INVALID, "um_trace_rewind: trace is NULL");
    if (lseek(t->fd, 0, SEEK_SET) != 0)
        return um__fail(UM_ERR_IO, "cannot rewind trace %s: %s", t->path, strerror(errno));
    /* Every reading state starts over, so a rewind works after any error,
     * corrupt gzip data too (F1 of tests/test_fuzz_findings.c). */
    um__gzin_restart(&t->gz);
    t->text_len = 0;
    /* The map is rebuilt as the file is read again, so slots come out the
     * same and every line is validated again. */
    if (t->map)
        memset(t->map, 0, t->map_cap * sizeof *t->map);
    t->map_used = 0;
    t->line = 0;
    t->done = 0;
    t->failed = UM_OK;
    t->failmsg[0] = '\0';
    return UM_OK;
}

double um_trace_progress(const um_trace *t)
{
    if (!t)
        return 0.0;
    if (t->done)
        return 1.0;
    if (t->file_size == 0)
        return 0.0;
    /* The bytes consumed: inflate runs ahead of the lines handed out by at
     * most one block of text. */
    uint64_t off = um__gzin_offset(&t->gz);
    double f = (double)off / (double)t->file_size;
    return f > 1.0 ? 1.0 : f;
}

uint64_t um_trace_slots(const um_trace *t)
{
    return t ? t->map_used : 0;
}

void um_trace_close(um_trace *t)
{
    if (!t)
        return;
    um__gzin_close(&t->gz);
    close(t->fd);
    free(t->map);
    free(t->path);
    free(t);
}
