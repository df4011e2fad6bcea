/*
 * spill: the file tier below host memory (option spill_dir). Owns the
 * spill file of a context and the extents in it: one per buffer that was
 * ever spilled, mapped shared into the process, so the engine copies to
 * and from it like any program memory (a GPU's copies stage through pinned
 * slots, the host's are memmoves) and the kernel's page cache writes it
 * out and drops it under memory pressure. That is what lets data larger
 * than RAM stay: the mapped pages are file-backed and reclaimable, unlike
 * the host pool's.
 *
 * The file is made in spill_dir at the first spill and unlinked at once,
 * so nothing is left behind however the process ends. Each extent's disk
 * blocks are allocated when it is made (fallocate): a full disk is an
 * error then, never a SIGBUS on a write to the mapping. Freed extents
 * give their blocks back (a punched hole) and are reused first-fit.
 */
#include "buffer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct extent {
    size_t off, len;
} extent;

struct um__spill {
    pthread_mutex_t lock;
    int fd;
    char path[300];     /* for messages; the file itself is unlinked */
    size_t page;
    size_t end;         /* the file's size: extents lie below it */
    extent *free;       /* free extents below `end`, by offset, coalesced */
    size_t nfree, free_cap;
    _Atomic size_t used;/* bytes of live extents */
};

um_status um__spill_create(const char *dir, um__spill **out)
{
    *out = NULL;
    um__spill *sp = calloc(1, sizeof *sp);
    if (!sp)
        return um__fail(UM_ERR_NOMEM, "spill: no memory for the file tier's state");
    snprintf(sp->path, sizeof sp->path, "%s/unimem-spill-XXXXXX", dir);
    sp->fd = mkstemp(sp->path);
    if (sp->fd < 0) {
        int e = errno;
        free(sp);
        return um__fail(UM_ERR_BACKEND, "spill: cannot make a file in spill_dir '%s': %s", dir,
                        strerror(e));
    }
    (void)unlink(sp->path);
    (void)fcntl(sp->fd, F_SETFD, FD_CLOEXEC);
    sp->page = (size_t)sysconf(_SC_PAGESIZE);
    pthread_mutex_init(&sp->lock, NULL);
    *out = sp;
    return UM_OK;
}

void um__spill_destroy(um__spill *sp)
{
    if (!sp)
        return;
    close(sp->fd);
    free(sp->free);
    pthread_mutex_destroy(&sp->lock);
    free(sp);
}

/* Takes len bytes first-fit from the free extents, else from the end. */
static size_t take_extent(um__spill *sp, size_t len)
{
    for (size_t i = 0; i < sp->nfree; i++) {
        extent *e = &sp->free[i];
        if (e->len < len)
            continue;
        size_t off = e->off;
        e->off += len;
        e->len -= len;
        if (!e->len)
            memmove(e, e + 1, (--sp->nfree - i) * sizeof *e);
        return off;
    }
    size_t off = sp->end;
    sp->end += len;
    return off;
}

/* Gives [off, off + len) back, merged with its neighbours. False when the
 * list could not grow (the extent is then lost to reuse, not to
 * correctness). */
static bool give_extent(um__spill *sp, size_t off, size_t len)
{
    size_t i = 0;
    while (i < sp->nfree && sp->free[i].off < off)
        i++;
    bool left = i > 0 && sp->free[i - 1].off + sp->free[i - 1].len == off;
    bool right = i < sp->nfree && off + len == sp->free[i].off;
    if (left && right) {
        sp->free[i - 1].len += len + sp->free[i].len;
        memmove(&sp->free[i], &sp->free[i + 1], (--sp->nfree - i) * sizeof *sp->free);
    } else if (left) {
        sp->free[i - 1].len += len;
    } else if (right) {
        sp->free[i].off = off;
        sp->free[i].len += len;
    } else {
        if (sp->nfree == sp->free_cap) {
            size_t cap = sp->free_cap ? 2 * sp->free_cap : 16;
            extent *f = realloc(sp->free, cap * sizeof *f);
            if (!f)
                return false;
            sp->free = f;
            sp->free_cap = cap;
        }
        memmove(&sp->free[i + 1], &sp->free[i], (sp->nfree - i) * sizeof *sp->free);
        sp->free[i] = (extent){off, len};
        sp->nfree++;
    }
    return true;
}

static size_t extent_len(const um__spill *sp, size_t size)
{
    return (size + sp->page - 1) / sp->page * sp->page;
}

um_status um__spill_alloc(um__spill *sp, size_t size, void **map, size_t *offset)
{
    *map = NULL;
    size_t len = extent_len(sp, size);
    pthread_mutex_lock(&sp->lock);
    size_t off = take_extent(sp, len);
    int err = posix_fallocate(sp->fd, (off_t)off, (off_t)len);
    void *p = err ? MAP_FAILED
                  : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, sp->fd, (off_t)off);
    if (p == MAP_FAILED) {
        if (!err)
            err = errno;
        (void)give_extent(sp, off, len);
        pthread_mutex_unlock(&sp->lock);
        char n[32];
        return um__fail(UM_ERR_NOMEM, "spill: no room for %s in the spill file in %s: %s",
                        um__format_bytes(n, sizeof n, size), sp->path, strerror(err));
    }
    pthread_mutex_unlock(&sp->lock);
    atomic_fetch_add(&sp->used, len);
    *map = p;
    *offset = off;
    return UM_OK;
}

void um__spill_free(um__spill *sp, void *map, size_t offset, size_t size)
{
    if (!map)
        return;
    size_t len = extent_len(sp, size);
    (void)munmap(map, len);
    pthread_mutex_lock(&sp->lock);
    /* The blocks go back to the disk; the range stays in the file. */
    (void)fallocate(sp->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)offset,
                    (off_t)len);
    (void)give_extent(sp, offset, len);
    pthread_mutex_unlock(&sp->lock);
    atomic_fetch_sub(&sp->used, len);
}

size_t um__spill_used(um__spill *sp)
{
    return sp ? atomic_load(&sp->used) : 0;
}
