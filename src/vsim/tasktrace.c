/* A recorded task trace (option task_trace) as a task graph; dag.h says
 * what it makes, docs/DESIGN.md the format. */
#include "dag.h"

#include "../run/run.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRACE_LINE_MAX 4096
/* Buffer ids to dense tile numbers: open addressing, grown at half full.
 * Ids run to 2^64 - 2, so that id + 1 never wraps to the empty mark. */
typedef struct tile_map {
    uint64_t *key; /* id + 1; 0: empty */
    uint32_t *tile;
    size_t cap, n;
} tile_map;

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    return x ^ (x >> 33);
}

static bool map_grow(tile_map *m)
{
    size_t cap = m->cap ? 2 * m->cap : 1024;
    uint64_t *key = calloc(cap, sizeof *key);
    uint32_t *tile = calloc(cap, sizeof *tile);
    if (!key || !tile) {
        free(key);
        free(tile);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->key[i])
            continue;
        size_t j = mix(m->key[i]) & (cap - 1);
        while (key[j])
            j = (j + 1) & (cap - 1);
        key[j] = m->key[i];
        tile[j] = m->tile[i];
    }
    free(m->key);
    free(m->tile);
    m->key = key;
    m->tile = tile;
    m->cap = cap;
    return true;
}

/* The tile of buffer id (a new one numbered next when unseen); false
 * when there is no memory. */
static bool map_get(tile_map *m, uint64_t id, uint32_t *tile, bool *fresh)
{
    if ((m->n + 1) * 2 > m->cap && !map_grow(m))
        return false;
    size_t j = mix(id + 1) & (m->cap - 1);
    while (m->key[j] && m->key[j] != id + 1)
        j = (j + 1) & (m->cap - 1);
    *fresh = !m->key[j];
    if (*fresh) {
        m->key[j] = id + 1;
        m->tile[j] = (uint32_t)m->n++;
    }
    *tile = m->tile[j];
    return true;
}

typedef struct reader {
    const char *path;
    size_t line;
    um__vs_dag *d;
    size_t task_cap, size_cap;
    tile_map map;
} reader;

static um_status bad_line(const reader *r, const char *what, const char *near)
{
    return um__fail(UM_ERR_PARSE, "task trace %s, line %zu: %s%s%.60s%s", r->path, r->line, what,
                    near ? " at '" : "", near ? near : "", near ? "'" : "");
}

static um__vs_kernel kernel_of(const char *name)
{
    for (int k = 0; k < UM_VS_OTHER; k++)
        if (!strcmp(name, um__vs_kernel_name((um__vs_kernel)k)))
            return (um__vs_kernel)k;
    return UM_VS_OTHER;
}

/* One "BUFFER:BYTES:MODE" word into access a of t. */
static um_status parse_access(reader *r, char *word, um__vs_task *t, uint64_t *largest)
{
    char *end;
    errno = 0;
    /* Digits only: strtoull would take a sign (and negate with '-') or
     * leading space. */
    unsigned long long id = isdigit((unsigned char)word[0]) ? strtoull(word, &end, 10) : 0;
    if (!isdigit((unsigned char)word[0]) || *end != ':' || errno)
        return bad_line(r, "a buffer is ID:BYTES:MODE", word);
    if (id == UINT64_MAX)
        return bad_line(r, "a buffer's id is at most 18446744073709551614", word);
    char *p = end + 1;
    unsigned long long bytes = isdigit((unsigned char)p[0]) ? strtoull(p, &end, 10) : 0;
    if (!isdigit((unsigned char)p[0]) || *end != ':' || errno || bytes == 0)
        return bad_line(r, "a buffer's size is a count of bytes above 0", word);
    const char *mode = end + 1;
    uint8_t m = !strcmp(mode, "r")    ? UM_VS_READ
                : !strcmp(mode, "wd") ? UM_VS_WRITE
                : !strcmp(mode, "rw") || !strcmp(mode, "w") ? UM_VS_READ_WRITE
                                                            : 0;
    if (!m)
        return bad_line(r, "a buffer's mode is r, w, rw or wd", word);
    if (t->naccess == UM_VS_MAX_ACCESS)
        return bad_line(r, "a task names at most 16 buffers", word);
    uint32_t tile;
    bool fresh;
    if (!map_get(&r->map, id, &tile, &fresh))
        return um__fail(UM_ERR_NOMEM, "task trace %s: no memory for its buffers", r->path);
    um__vs_dag *d = r->d;
    if (fresh) {
        if (tile == r->size_cap) {
            size_t cap = r->size_cap ? 2 * r->size_cap : 1024;
            uint64_t *sizes = realloc(d->tile_size, cap * sizeof *sizes);
            if (!sizes)
                return um__fail(UM_ERR_NOMEM, "task trace %s: no memory for its buffers", r->path);
            d->tile_size = sizes;
            r->size_cap = cap;
        }
        d->tile_size[tile] = bytes;
        d->ntiles = tile + 1;
    } else if (d->tile_size[tile] != bytes) {
        char why[96];
        snprintf(why, sizeof why, "buffer %llu had %llu bytes before", id,
                 (unsigned long long)d->tile_size[tile]);
        return bad_line(r, why, word);
    }
    /* The task runtime refuses a task naming a buffer twice: say so here,
     * with the line, rather than at the task's submission. */
    for (int a = 0; a < t->naccess; a++)
        if (t->access[a].tile == tile) {
            char why[64];
            snprintf(why, sizeof why, "a task names buffer %llu twice", id);
            return bad_line(r, why, word);
        }
    t->access[t->naccess++] = (um__vs_access){tile, m};
    if (bytes > *largest)
        *largest = bytes;
    return UM_OK;
}

/* The tile order of a buffer of `bytes` of floats, rounded to the nearest
 * and 1 at least, as the runtime engine rounds it for the same task
 * (runtime.c: tile_of): truncated, a 1000-byte buffer was a tile of 15
 * here and of 16 there, so the engines, and the bound, timed it apart. */
static uint32_t tile_order(uint64_t bytes)
{
    double order = fmin(round(sqrt((double)bytes / 4.0)), (double)UINT32_MAX);
    return order >= 1 ? (uint32_t)order : 1;
}

/* "task ID NAME FLOPS BUFFER:BYTES:MODE ...", or a comment or blank. */
static um_status parse_task(reader *r, char *line)
{
    char *save = NULL, *word = strtok_r(line, " \t\r\n", &save);
    if (!word || word[0] == '#')
        return UM_OK;
    if (strcmp(word, "task"))
        return bad_line(r, "a line is 'task ID NAME FLOPS BUFFER:BYTES:MODE ...'", word);
    char *id = strtok_r(NULL, " \t\r\n", &save), *name = strtok_r(NULL, " \t\r\n", &save);
    char *flops = strtok_r(NULL, " \t\r\n", &save);
    if (!id || !name || !flops)
        return bad_line(r, "a task needs an id, a name and its flops", NULL);
    /* The runtime writes the id as a number; anything else there is no
     * trace of its (it was read past unseen). */
    if (strspn(id, "0123456789") != strlen(id))
        return bad_line(r, "a task's id is a number", id);
    char *end;
    double f = strtod(flops, &end);
    /* Bounded so that the flops of a path of 2^32 tasks, which give the
     * tasks' priorities, stay finite: two tasks of 1e308 in a chain made
     * them inf / inf, and every priority 0. The bound is the one
     * um_task_submit applies, so every trace the runtime writes reads. */
    if (end == flops || *end || !um__task_flops_valid(f)) {
        char why[64];
        snprintf(why, sizeof why, "flops must be a number of 0 to %g", UM_TASK_MAX_FLOPS);
        return bad_line(r, why, flops);
    }
    um__vs_dag *d = r->d;
    if (d->ntasks == r->task_cap) {
        size_t cap = r->task_cap ? 2 * r->task_cap : 1024;
        um__vs_task *tasks = cap < UINT32_MAX ? realloc(d->tasks, cap * sizeof *tasks) : NULL;
        if (!tasks)
            return um__fail(UM_ERR_NOMEM, "task trace %s: no memory for %zu tasks", r->path, cap);
        d->tasks = tasks;
        r->task_cap = cap;
    }
    um__vs_task *t = &d->tasks[d->ntasks];
    memset(t, 0, sizeof *t);
    t->kernel = (uint8_t)kernel_of(name);
    t->flops = f;
    uint64_t largest = 0;
    while ((word = strtok_r(NULL, " \t\r\n", &save))) {
        um_status st = parse_access(r, word, t, &largest);
        if (st != UM_OK)
            return st;
    }
    /* Its kernel's time is looked up for the tile order of its largest
     * buffer, as floats (a T x T tile holds 4 T^2 bytes). */
    t->tile = tile_order(largest);
    if (largest > d->tile_bytes)
        d->tile_bytes = largest;
    d->ntasks++;
    return UM_OK;
}

um_status um__vs_dag_trace(const char *path, um__vs_dag *out)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f)
        return um__fail(UM_ERR_IO, "task trace %s: %s", path, strerror(errno));
    reader r = {path, 0, out, 0, 0, {0}};
    /* getline gives the length, so that a NUL byte in a line is seen as
     * one (fgets would end the line there). */
    char *line = NULL;
    size_t cap = 0;
    ssize_t len = 0;
    um_status st = UM_OK;
    while (st == UM_OK && (len = getline(&line, &cap, f)) >= 0) {
        r.line++;
        size_t chars = (size_t)len - (len > 0 && line[len - 1] == '\n');
        if (memchr(line, 0, (size_t)len))
            st = bad_line(&r, "the line holds a NUL byte (not text)", NULL);
        else if (chars >= TRACE_LINE_MAX)
            st = bad_line(&r, "the line is longer than 4095 characters", NULL);
        else
            st = parse_task(&r, line);
    }
    if (st == UM_OK && (ferror(f) || !feof(f)))
        st = um__fail(UM_ERR_IO, "task trace %s: read failed: %s", path, strerror(errno));
    free(line);
    fclose(f);
    free(r.map.key);
    free(r.map.tile);
    if (st == UM_OK && out->ntasks == 0)
        st = um__fail(UM_ERR_PARSE, "task trace %s: no task in it", path);
    if (st == UM_OK) {
        snprintf(out->name, sizeof out->name, "trace");
        out->tile = tile_order(out->tile_bytes);
        if (um__vs_dag_derive_deps(out) != 0)
            st = um__fail(UM_ERR_NOMEM, "task trace %s: no memory for the dependencies", path);
    }
    if (st != UM_OK)
        um__vs_dag_free(out);
    return st;
}
