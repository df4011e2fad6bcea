/* Plain or gzip text input; see gzin.h. */
#include "gzin.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { GZIN_UNKNOWN, GZIN_PLAIN, GZIN_GZIP };

static um_status gzin_fail(um__gzin *g, um_status st, const char *fmt, ...) UM_PRINTF(3, 4);
static um_status gzin_fail(um__gzin *g, um_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->err, sizeof g->err, fmt, ap);
    va_end(ap);
    return st;
}

um_status um__gzin_open(um__gzin *g, int fd, size_t cap)
{
    memset(g, 0, sizeof *g);
    g->fd = fd;
    g->cap = cap;
    g->in = malloc(cap);
    g->out = malloc(cap);
    if (!g->in || !g->out) {
        um__gzin_close(g);
        return gzin_fail(g, UM_ERR_NOMEM, "no memory for the input buffers (%zu bytes)", 2 * cap);
    }
    /* 16 + 15: gzip only, with the largest window. */
    if (inflateInit2(&g->z, 16 + 15) != Z_OK) {
        free(g->in);
        free(g->out);
        g->in = g->out = NULL;
        return gzin_fail(g, UM_ERR_NOMEM, "no memory for zlib's state");
    }
    g->z.next_in = g->in;
    return UM_OK;
}

/* Reads more of the file after the bytes not yet consumed; *got is 0 at
 * the end of the file. */
static um_status gzin_read(um__gzin *g, size_t *got)
{
    size_t keep = g->z.avail_in;
    g->in_off += (uint64_t)(g->z.next_in - g->in);
    if (keep > 0 && g->z.next_in != g->in)
        memmove(g->in, g->z.next_in, keep);
    g->z.next_in = g->in;
    ssize_t n;
    do
        n = read(g->fd, g->in + keep, g->cap - keep);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return gzin_fail(g, UM_ERR_IO, "read failed: %s", strerror(errno));
    g->z.avail_in = (uInt)(keep + (size_t)n);
    *got = (size_t)n;
    return UM_OK;
}

/* Reads until at least two bytes wait (or the file ends), enough to tell a
 * gzip header by its magic. */
static um_status gzin_read_two(um__gzin *g)
{
    size_t got = 1;
    while (g->z.avail_in < 2 && got > 0) {
        um_status s = gzin_read(g, &got);
        if (s != UM_OK)
            return s;
    }
    return UM_OK;
}

static bool gzin_magic(const um__gzin *g)
{
    return g->z.avail_in >= 2 && g->z.next_in[0] == 0x1f && g->z.next_in[1] == 0x8b;
}

um_status um__gzin_next(um__gzin *g, const unsigned char **text, size_t *len)
{
    um_status s;
    size_t got;
    *len = 0;
    if (g->format == GZIN_UNKNOWN) {
        /* A file that starts with the gzip magic is gzip, as for zlib. */
        if ((s = gzin_read_two(g)) != UM_OK)
            return s;
        g->format = gzin_magic(g) ? GZIN_GZIP : GZIN_PLAIN;
    }
    if (g->format == GZIN_PLAIN) {
        /* The input buffer is the text; it is refilled only once used up. */
        if (g->z.avail_in == 0 && (s = gzin_read(g, &got)) != UM_OK)
            return s;
        *text = g->z.next_in;
        *len = g->z.avail_in;
        g->z.next_in += g->z.avail_in;
        g->z.avail_in = 0;
        return UM_OK;
    }
    for (;;) {
        if (g->member_end) {
            /* Another member may follow; anything else is an error. */
            if ((s = gzin_read_two(g)) != UM_OK)
                return s;
            if (g->z.avail_in == 0)
                return UM_OK;
            if (!gzin_magic(g))
                return gzin_fail(g, UM_ERR_PARSE,
                                 "trailing data after the gzip stream at byte offset %llu "
                                 "(bytes after the end of the gzip data start no member)",
                                 (unsigned long long)um__gzin_offset(g));
            if (inflateReset(&g->z) != Z_OK)
                return gzin_fail(g, UM_ERR_IO, "zlib cannot start the next gzip member");
            g->member_end = false;
        }
        if (g->z.avail_in == 0) {
            if ((s = gzin_read(g, &got)) != UM_OK)
                return s;
            if (got == 0)
                return gzin_fail(g, UM_ERR_IO, "gzip data truncated (unexpected end of file)");
        }
        g->z.next_out = g->out;
        g->z.avail_out = (uInt)g->cap;
        int r = inflate(&g->z, Z_NO_FLUSH);
        if (r == Z_STREAM_END)
            g->member_end = true;
        else if (r == Z_MEM_ERROR)
            return gzin_fail(g, UM_ERR_NOMEM, "zlib is out of memory");
        else if (r != Z_OK && r != Z_BUF_ERROR)
            return gzin_fail(g, UM_ERR_IO, "corrupt gzip data (%s)",
                             g->z.msg ? g->z.msg : zError(r));
        size_t n = g->cap - g->z.avail_out;
        if (n > 0) {
            *text = g->out;
            *len = n;
            return UM_OK;
        }
    }
}

uint64_t um__gzin_offset(const um__gzin *g)
{
    return g->in_off + (uint64_t)(g->z.next_in - g->in);
}

void um__gzin_restart(um__gzin *g)
{
    inflateReset(&g->z);
    g->z.next_in = g->in;
    g->z.avail_in = 0;
    g->in_off = 0;
    g->format = GZIN_UNKNOWN;
    g->member_end = false;
    g->err[0] = '\0';
}

void um__gzin_close(um__gzin *g)
{
    if (g->in && g->out)
        inflateEnd(&g->z);
    free(g->in);
    free(g->out);
    g->in = g->out = NULL;
}
