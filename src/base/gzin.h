/*
 * gzin: a file read as text, plain or gzip. Gzip data may be several
 * members (read as one stream, as gzip -d does) and nothing after them:
 * zlib's gzread ends the stream silently at bytes after a member that
 * start no member, so a damaged or wrongly assembled file would be read
 * as its first part. Owns its two buffers and the zlib state; the file
 * descriptor stays the caller's. Used by the allocation-trace reader
 * (src/trace/trace.c) and the timeline's JSON reader (tools/json_reader.c).
 */
#ifndef UM_GZIN_H
#define UM_GZIN_H

#include "base.h"

#include <zlib.h>

typedef struct um__gzin {
    int fd;
    int format;      /* what the file holds, known from its first two bytes */
    bool member_end; /* gzip: a member ended; another or the end of the file follows */
    size_t cap;      /* bytes of each buffer */
    /* z.next_in / z.avail_in are the bytes read and not yet consumed, in
     * plain files too; in_off is the file offset of in[0]. */
    z_stream z;
    unsigned char *in, *out;
    uint64_t in_off;
    char err[160]; /* what the last failure was, with no prefix */
} um__gzin;

/* Reads fd through buffers of cap bytes each. UM_ERR_NOMEM (g->err says
 * what) when they or zlib's state cannot be had; g is then closed. */
um_status um__gzin_open(um__gzin *g, int fd, size_t cap);
/* The next block of text, *len bytes at *text (0 at the end of the file),
 * valid until the next call. On failure, the status (UM_ERR_IO,
 * UM_ERR_PARSE for bytes after the gzip data, UM_ERR_NOMEM) and g->err. */
um_status um__gzin_next(um__gzin *g, const unsigned char **text, size_t *len);
/* The file's bytes consumed so far (the text handed out runs at most one
 * block behind them). */
uint64_t um__gzin_offset(const um__gzin *g);
/* Starts over from the file's offset 0 (after any error too); the caller
 * has moved the descriptor there. */
void um__gzin_restart(um__gzin *g);
void um__gzin_close(um__gzin *g);

#endif /* UM_GZIN_H */
