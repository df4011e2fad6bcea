/* The streaming JSON reader of `unimem timeline`; see json_reader.h. A
 * recursive-descent parser over a window of the (decompressed) input
 * (src/base/gzin.h), strict to RFC 8259: no trailing commas, comments, NaN, leading
 * zeros or raw control characters, and strings must be valid UTF-8. */
#include "json_reader.h"
#include "base/gzin.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Limits that keep a corrupt or hostile file from exhausting memory or the
 * stack: no trace event comes near any of them. */
#define JSON_MAX_DEPTH 64                       /* nesting of arrays and objects */
#define JSON_MAX_STRING ((size_t)1 << 20)       /* bytes in one kept string */
#define JSON_MAX_EVENT_BYTES ((size_t)16 << 20) /* parsed tree of one event */
#define JSON_MAX_NUMBER 128                     /* characters in one number */
#define JSON_INPUT ((size_t)256 * 1024) /* file bytes read (and inflated) at once */

/* A bump allocator for the tree of one event, emptied after each event.
 * Chunks are kept for the next event, so reading a long trace allocates
 * nothing once the first events have been read. */
typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t cap, used;
    max_align_t data[];
} arena_chunk;

typedef struct jreader {
    um__gzin in;              /* the file's text, plain or gzip */
    const unsigned char *buf; /* the window: text um__gzin_next gave */
    size_t pos, len;     /* the window: buf[pos..len) is unread */
    uint64_t base;       /* input offset of buf[0] */
    uint64_t line;       /* line of buf[pos], 1-based */
    uint64_t line_start; /* input offset where that line starts */
    uint64_t max_bytes;
    bool eof, failed;
    char *err;
    size_t err_len;
    arena_chunk *chunks; /* every chunk, in the order they are filled */
    arena_chunk *cur;    /* the chunk being filled, or NULL before the first */
    size_t arena_bytes;  /* handed out since the last reset */
    char *scratch;       /* a string being read */
    size_t scratch_len, scratch_cap;
} jreader;

/* ------------------------------------------------------------- errors */

static void jfail(jreader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jfail(jreader *r, const char *fmt, ...)
{
    if (r->failed)
        return;
    r->failed = true;
    char what[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    uint64_t at = r->base + r->pos;
    snprintf(r->err, r->err_len, "line %llu, column %llu (byte offset %llu): %s",
             (unsigned long long)r->line, (unsigned long long)(at - r->line_start + 1),
             (unsigned long long)at, what);
}

/* --------------------------------------------------------------- input */

/* Refills the window; false at the end of the input or on an error. */
static bool jfill(jreader *r)
{
    if (r->eof || r->failed)
        return false;
    r->base += r->len;
    r->pos = r->len = 0;
    size_t n;
    um_status st = um__gzin_next(&r->in, &r->buf, &n);
    if (st != UM_OK) {
        jfail(r, "%s", r->in.err);
        return false;
    }
    if (n == 0) {
        r->eof = true;
        return false;
    }
    if (r->base + (uint64_t)n > r->max_bytes) {
        jfail(r, "the input is larger than %llu bytes, the most this command reads",
              (unsigned long long)r->max_bytes);
        return false;
    }
    r->len = n;
    return true;
}

/* The next byte without consuming it, or -1 at the end (or after an
 * error). */
static inline int jpeek(jreader *r)
{
    if (r->pos < r->len)
        return r->buf[r->pos];
    return jfill(r) ? r->buf[r->pos] : -1;
}

/* Consumes the byte jpeek returned. */
static inline void jskip(jreader *r)
{
    if (r->buf[r->pos++] == '\n') {
        r->line++;
        r->line_start = r->base + r->pos;
    }
}

static void skip_space(jreader *r)
{
    for (int c = jpeek(r); c == ' ' || c == '\t' || c == '\n' || c == '\r'; c = jpeek(r))
        jskip(r);
}

/* An error for byte c where `expected` should be. */
static void unexpected(jreader *r, int c, const char *expected)
{
    if (r->failed)
        return;
    if (c < 0)
        jfail(r, "the input ends where %s should be (is the file truncated?)", expected);
    else if (c >= 0x20 && c < 0x7f)
        jfail(r, "expected %s, found '%c'", expected, c);
    else
        jfail(r, "expected %s, found byte 0x%02x", expected, (unsigned)c);
}

/* Skips a UTF-8 byte-order mark (EF BB BF) at the start of the input:
 * editors write one before some documents, and RFC 8259 lets a parser
 * ignore it rather than refuse the document. Columns on the first line
 * count from after it, as an editor, which does not show it, counts them;
 * byte offsets still count it. */
static void skip_byte_order_mark(jreader *r)
{
    static const unsigned char mark[3] = {0xEF, 0xBB, 0xBF};
    if (jpeek(r) != mark[0])
        return;
    for (size_t i = 0; i < sizeof mark; i++) {
        int c = jpeek(r);
        if (c != mark[i]) {
            unexpected(r, c, "the rest of a UTF-8 byte-order mark (EF BB BF)");
            return;
        }
        jskip(r);
    }
    r->line_start = r->base + r->pos;
}

/* --------------------------------------------------------------- arena */

static void *arena_alloc(jreader *r, size_t size)
{
    size = (size + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (r->arena_bytes + size > JSON_MAX_EVENT_BYTES) {
        jfail(r, "an event takes more than %zu MiB parsed; no trace event is that large",
              JSON_MAX_EVENT_BYTES >> 20);
        return NULL;
    }
    /* Chunks after the current one are empty (kept from earlier events). */
    arena_chunk **link = r->cur ? &r->cur->next : &r->chunks;
    while (!r->cur || r->cur->cap - r->cur->used < size) {
        if (!*link) {
            size_t cap = size > 65536 ? size : 65536;
            arena_chunk *c = malloc(sizeof *c + cap);
            if (!c) {
                jfail(r, "no memory for %zu bytes of a parsed event", cap);
                return NULL;
            }
            c->cap = cap;
            c->used = 0;
            c->next = NULL;
            *link = c;
        }
        r->cur = *link;
        link = &r->cur->next;
    }
    void *out = (char *)r->cur->data + r->cur->used;
    r->cur->used += size;
    r->arena_bytes += size;
    return out;
}

static void arena_reset(jreader *r)
{
    for (arena_chunk *c = r->chunks; c; c = c->next)
        c->used = 0;
    r->cur = r->chunks;
    r->arena_bytes = 0;
}

static void arena_free(jreader *r)
{
    while (r->chunks) {
        arena_chunk *n = r->chunks->next;
        free(r->chunks);
        r->chunks = n;
    }
}

/* -------------------------------------------------------------- values */

static bool scratch_put(jreader *r, const char *bytes, size_t n)
{
    if (r->scratch_len + n > JSON_MAX_STRING) {
        jfail(r, "a string longer than %zu bytes; no trace event has one", JSON_MAX_STRING);
        return false;
    }
    if (r->scratch_len + n + 1 > r->scratch_cap) {
        size_t cap = r->scratch_cap ? r->scratch_cap * 2 : 256;
        while (cap < r->scratch_len + n + 1)
            cap *= 2;
        char *s = realloc(r->scratch, cap);
        if (!s) {
            jfail(r, "no memory for a string of %zu bytes", cap);
            return false;
        }
        r->scratch = s;
        r->scratch_cap = cap;
    }
    memcpy(r->scratch + r->scratch_len, bytes, n);
    r->scratch_len += n;
    return true;
}

static int hex_digit(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* The four hex digits after "\u". */
static long read_hex4(jreader *r)
{
    long v = 0;
    for (int i = 0; i < 4; i++) {
        int c = jpeek(r), d = c < 0 ? -1 : hex_digit(c);
        if (d < 0) {
            unexpected(r, c, "a hex digit of a \\u escape");
            return -1;
        }
        jskip(r);
        v = v * 16 + d;
    }
    return v;
}

/* One escape after the backslash, appended (when keep) as UTF-8. */
static bool read_escape(jreader *r, bool keep)
{
    int c = jpeek(r);
    char out[4];
    size_t n = 1;
    switch (c) {
    case '"':
        out[0] = '"';
        break;
    case '\\':
        out[0] = '\\';
        break;
    case '/':
        out[0] = '/';
        break;
    case 'b':
        out[0] = '\b';
        break;
    case 'f':
        out[0] = '\f';
        break;
    case 'n':
        out[0] = '\n';
        break;
    case 'r':
        out[0] = '\r';
        break;
    case 't':
        out[0] = '\t';
        break;
    case 'u': {
        jskip(r);
        long cp = read_hex4(r);
        if (cp < 0)
            return false;
        if (cp >= 0xDC00 && cp <= 0xDFFF) {
            jfail(r, "a \\u escape holds a low surrogate without a high one before it");
            return false;
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            /* A high surrogate: its low half must follow as "\uDC00".."\uDFFF". */
            if (jpeek(r) != '\\') {
                unexpected(r, jpeek(r), "the low surrogate (\\uDC00-\\uDFFF) of a \\u escape pair");
                return false;
            }
            jskip(r);
            if (jpeek(r) != 'u') {
                unexpected(r, jpeek(r), "the low surrogate (\\uDC00-\\uDFFF) of a \\u escape pair");
                return false;
            }
            jskip(r);
            long lo = read_hex4(r);
            if (lo < 0)
                return false;
            if (lo < 0xDC00 || lo > 0xDFFF) {
                jfail(r, "a \\u escape holds a high surrogate not followed by a low one");
                return false;
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (cp < 0x80) {
            out[0] = (char)cp;
        } else if (cp < 0x800) {
            out[0] = (char)(0xC0 | (cp >> 6));
            out[1] = (char)(0x80 | (cp & 0x3F));
            n = 2;
        } else if (cp < 0x10000) {
            out[0] = (char)(0xE0 | (cp >> 12));
            out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
            out[2] = (char)(0x80 | (cp & 0x3F));
            n = 3;
        } else {
            out[0] = (char)(0xF0 | (cp >> 18));
            out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
            out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
            out[3] = (char)(0x80 | (cp & 0x3F));
            n = 4;
        }
        return !keep || scratch_put(r, out, n);
    }
    default:
        unexpected(r, c, "an escape (one of \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
        return false;
    }
    jskip(r);
    return !keep || scratch_put(r, out, n);
}

/* One UTF-8 sequence whose lead byte c (>= 0x80) is next: checks it is
 * well formed (no overlong forms, surrogates or code points past
 * U+10FFFF) and appends it when keep. */
static bool read_utf8(jreader *r, int c, bool keep)
{
    char seq[4];
    int n;
    unsigned long cp, min;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2, cp = (unsigned long)c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3, cp = (unsigned long)c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4, cp = (unsigned long)c & 0x07, min = 0x10000;
    } else {
        jfail(r, "byte 0x%02x in a string is not UTF-8", (unsigned)c);
        return false;
    }
    seq[0] = (char)c;
    jskip(r);
    for (int i = 1; i < n; i++) {
        int d = jpeek(r);
        if (d < 0x80 || d > 0xBF) {
            jfail(r, "a UTF-8 sequence in a string is cut short");
            return false;
        }
        seq[i] = (char)d;
        cp = cp << 6 | ((unsigned long)d & 0x3F);
        jskip(r);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
        jfail(r, "a string holds an invalid UTF-8 sequence (U+%04lX)", cp);
        return false;
    }
    return !keep || scratch_put(r, seq, (size_t)n);
}

/* A string (the opening quote is next). When keep, its text is copied to
 * the arena and returned through out/out_len. */
static bool read_string(jreader *r, bool keep, const char **out, size_t *out_len)
{
    jskip(r); /* the opening quote */
    r->scratch_len = 0;
    for (;;) {
        /* Plain bytes are taken in runs straight from the window. */
        size_t start = r->pos;
        while (r->pos < r->len) {
            unsigned char c = r->buf[r->pos];
            if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80)
                break;
            r->pos++;
        }
        if (keep && r->pos > start && !scratch_put(r, (const char *)r->buf + start, r->pos - start))
            return false;
        int c = jpeek(r);
        if (c < 0) {
            unexpected(r, c, "the end of a string ('\"')");
            return false;
        }
        if (c == '"') {
            jskip(r);
            break;
        }
        if (c == '\\') {
            jskip(r);
            if (!read_escape(r, keep))
                return false;
        } else if (c < 0x20) {
            jfail(r, "control character 0x%02x in a string (it must be escaped)", (unsigned)c);
            return false;
        } else if (c >= 0x80) {
            if (!read_utf8(r, c, keep))
                return false;
        }
    }
    if (keep) {
        char *s = arena_alloc(r, r->scratch_len + 1);
        if (!s)
            return false;
        /* An empty string before any other has no scratch buffer yet
         * (memcpy from NULL is undefined even for 0 bytes). */
        if (r->scratch_len)
            memcpy(s, r->scratch, r->scratch_len);
        s[r->scratch_len] = '\0';
        *out = s;
        *out_len = r->scratch_len;
    }
    return true;
}

/* Appends c to a number's text; false (after the error) when too long. */
static bool number_char(jreader *r, char *buf, size_t *n, int c)
{
    if (*n + 1 >= JSON_MAX_NUMBER) {
        jfail(r, "a number longer than %d characters", JSON_MAX_NUMBER - 1);
        return false;
    }
    buf[(*n)++] = (char)c;
    return true;
}

static bool take_digits(jreader *r, char *buf, size_t *n)
{
    int c = jpeek(r);
    if (c < '0' || c > '9') {
        unexpected(r, c, "a digit");
        return false;
    }
    while (c >= '0' && c <= '9') {
        if (!number_char(r, buf, n, c))
            return false;
        jskip(r);
        c = jpeek(r);
    }
    return true;
}

/* A number, by JSON's grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static bool read_number(jreader *r, json_value *v)
{
    char buf[JSON_MAX_NUMBER];
    size_t n = 0;
    bool integer = true, negative = false;
    if (jpeek(r) == '-') {
        buf[n++] = '-'; /* the first character: always room */
        negative = true;
        jskip(r);
    }
    if (jpeek(r) == '0') {
        buf[n++] = '0'; /* at most the second character */
        jskip(r);
        int c = jpeek(r);
        if (c >= '0' && c <= '9') {
            jfail(r, "a number with a leading zero");
            return false;
        }
    } else if (!take_digits(r, buf, &n)) {
        return false;
    }
    if (jpeek(r) == '.') {
        if (!number_char(r, buf, &n, '.'))
            return false;
        jskip(r);
        integer = false;
        if (!take_digits(r, buf, &n))
            return false;
    }
    int c = jpeek(r);
    if (c == 'e' || c == 'E') {
        if (!number_char(r, buf, &n, 'e'))
            return false;
        jskip(r);
        integer = false;
        c = jpeek(r);
        if (c == '+' || c == '-') {
            if (!number_char(r, buf, &n, c))
                return false;
            jskip(r);
        }
        if (!take_digits(r, buf, &n))
            return false;
    }
    buf[n] = '\0';
    v->type = JSON_NUMBER;
    v->num = strtod(buf, NULL);
    if (!isfinite(v->num)) {
        jfail(r, "the number %s is out of range", buf);
        return false;
    }
    if (integer && !negative) {
        errno = 0;
        unsigned long long u = strtoull(buf, NULL, 10);
        if (errno == 0) {
            v->is_uint = true;
            v->u = u;
        }
    }
    return true;
}

/* The rest of a literal whose first letter is next. */
static bool read_literal(jreader *r, const char *word, json_type type, json_value *v)
{
    for (const char *p = word; *p; p++) {
        if (jpeek(r) != *p) {
            jfail(r, "not a JSON value (expected '%s')", word);
            return false;
        }
        jskip(r);
    }
    v->type = type;
    return true;
}

static bool read_value(jreader *r, int depth, bool keep, json_value **out);

/* An array or object (its opening bracket is next). */
static bool read_container(jreader *r, int depth, bool keep, json_value *v, bool object)
{
    if (depth >= JSON_MAX_DEPTH) {
        jfail(r, "arrays and objects nested more than %d deep", JSON_MAX_DEPTH);
        return false;
    }
    v->type = object ? JSON_OBJECT : JSON_ARRAY;
    jskip(r);
    skip_space(r);
    int close = object ? '}' : ']';
    if (jpeek(r) == close) {
        jskip(r);
        return true;
    }
    json_value **tail = &v->first;
    for (;;) {
        const char *key = NULL;
        size_t key_len = 0;
        if (object) {
            skip_space(r);
            int c = jpeek(r);
            if (c != '"') {
                unexpected(r, c, "a member name (a string)");
                return false;
            }
            if (!read_string(r, keep, &key, &key_len))
                return false;
            skip_space(r);
            c = jpeek(r);
            if (c != ':') {
                unexpected(r, c, "':' after a member name");
                return false;
            }
            jskip(r);
        }
        json_value *child = NULL;
        if (!read_value(r, depth + 1, keep, &child))
            return false;
        if (keep) {
            child->key = key;
            child->key_len = key_len;
            *tail = child;
            tail = &child->next;
        }
        skip_space(r);
        int c = jpeek(r);
        if (c == ',') {
            jskip(r);
            continue;
        }
        if (c == close) {
            jskip(r);
            return true;
        }
        unexpected(r, c,
                   object ? "',' or '}' after an object member"
                          : "',' or ']' after an array element");
        return false;
    }
}

/* Any value, after optional white space. When keep, *out is the parsed
 * tree (in the arena); otherwise the value is only checked. */
static bool read_value(jreader *r, int depth, bool keep, json_value **out)
{
    skip_space(r);
    json_value scratch_value, *v = &scratch_value;
    if (keep && !(v = arena_alloc(r, sizeof *v)))
        return false;
    memset(v, 0, sizeof *v);
    v->line = r->line;
    int c = jpeek(r);
    bool ok;
    switch (c) {
    case '{':
    case '[':
        ok = read_container(r, depth, keep, v, c == '{');
        break;
    case '"':
        v->type = JSON_STRING;
        ok = read_string(r, keep, &v->str, &v->len);
        break;
    case 't':
        ok = read_literal(r, "true", JSON_TRUE, v);
        break;
    case 'f':
        ok = read_literal(r, "false", JSON_FALSE, v);
        break;
    case 'n':
        ok = read_literal(r, "null", JSON_NULL, v);
        break;
    default:
        if (c == '-' || (c >= '0' && c <= '9')) {
            ok = read_number(r, v);
        } else {
            unexpected(r, c, "a JSON value");
            ok = false;
        }
    }
    if (ok && keep)
        *out = v;
    return ok;
}

/* The event array (its '[' is next): each object element goes to fn. */
static bool read_events(jreader *r, json_event_fn fn, void *arg)
{
    jskip(r);
    skip_space(r);
    if (jpeek(r) == ']') {
        jskip(r);
        return true;
    }
    for (;;) {
        skip_space(r);
        bool is_object = jpeek(r) == '{';
        json_value *ev = NULL;
        arena_reset(r);
        if (!read_value(r, 1, is_object, &ev))
            return false;
        if (is_object) {
            char why[300] = "";
            if (fn(arg, ev, why, sizeof why) != 0) {
                snprintf(r->err, r->err_len, "the event on line %llu: %s",
                         (unsigned long long)ev->line, why);
                r->failed = true;
                return false;
            }
        }
        skip_space(r);
        int c = jpeek(r);
        if (c == ',') {
            jskip(r);
            continue;
        }
        if (c == ']') {
            jskip(r);
            return true;
        }
        unexpected(r, c, "',' or ']' after an event");
        return false;
    }
}

/* The top-level object: its "traceEvents" member is read as the event
 * array, every other member only checked. */
static bool read_top_object(jreader *r, json_event_fn fn, void *arg)
{
    bool seen_events = false;
    jskip(r);
    skip_space(r);
    if (jpeek(r) == '}') {
        jskip(r);
    } else {
        for (;;) {
            skip_space(r);
            int c = jpeek(r);
            if (c != '"') {
                unexpected(r, c, "a member name (a string)");
                return false;
            }
            const char *key = NULL;
            size_t key_len = 0;
            arena_reset(r);
            if (!read_string(r, true, &key, &key_len))
                return false;
            bool events = key_len == 11 && !memcmp(key, "traceEvents", 11);
            skip_space(r);
            if ((c = jpeek(r)) != ':') {
                unexpected(r, c, "':' after a member name");
                return false;
            }
            jskip(r);
            skip_space(r);
            if (events) {
                if ((c = jpeek(r)) != '[') {
                    unexpected(r, c, "the event array ('[') as the value of \"traceEvents\"");
                    return false;
                }
                if (!read_events(r, fn, arg))
                    return false;
                seen_events = true;
            } else if (!read_value(r, 1, false, NULL)) {
                return false;
            }
            skip_space(r);
            c = jpeek(r);
            if (c == ',') {
                jskip(r);
                continue;
            }
            if (c == '}') {
                jskip(r);
                break;
            }
            unexpected(r, c, "',' or '}' after a member of the trace object");
            return false;
        }
    }
    if (!seen_events) {
        jfail(r, "the trace object has no \"traceEvents\" array");
        return false;
    }
    return true;
}

int json_read_trace(int fd, uint64_t max_bytes, json_event_fn fn, void *arg, char *err,
                    size_t err_len)
{
    jreader *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, err_len, "no memory for the JSON reader");
        return -1;
    }
    if (um__gzin_open(&r->in, fd, JSON_INPUT) != UM_OK) {
        snprintf(err, err_len, "%s", r->in.err);
        free(r);
        return -1;
    }
    r->line = 1;
    r->max_bytes = max_bytes;
    r->err = err;
    r->err_len = err_len;
    skip_byte_order_mark(r);
    skip_space(r);
    int c = jpeek(r);
    bool ok;
    if (c == '{') {
        ok = read_top_object(r, fn, arg);
    } else if (c == '[') {
        ok = read_events(r, fn, arg);
    } else {
        unexpected(r, c, "a Chrome trace ('{' or '[')");
        ok = false;
    }
    if (ok) {
        skip_space(r);
        if ((c = jpeek(r)) >= 0) {
            jfail(r, "more data after the end of the JSON document");
            ok = false;
        }
    }
    ok = ok && !r->failed;
    um__gzin_close(&r->in);
    arena_free(r);
    free(r->scratch);
    free(r);
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------ accessors */

const json_value *json_get(const json_value *obj, const char *key)
{
    if (!obj || obj->type != JSON_OBJECT)
        return NULL;
    size_t n = strlen(key);
    const json_value *found = NULL;
    for (const json_value *m = obj->first; m; m = m->next)
        if (m->key_len == n && !memcmp(m->key, key, n))
            found = m;
    return found;
}

const char *json_str(const json_value *v)
{
    return v && v->type == JSON_STRING ? v->str : NULL;
}

bool json_u64(const json_value *v, uint64_t *out)
{
    if (!v || v->type != JSON_NUMBER || !v->is_uint)
        return false;
    *out = v->u;
    return true;
}

bool json_i64(const json_value *v, int64_t *out)
{
    const double limit = 9007199254740992.0; /* 2^53: every integer below is exact */
    if (!v || v->type != JSON_NUMBER || v->num != floor(v->num) || fabs(v->num) > limit)
        return false;
    *out = (int64_t)v->num;
    return true;
}

bool json_number(const json_value *v, double *out)
{
    if (!v || v->type != JSON_NUMBER)
        return false;
    *out = v->num;
    return true;
}
