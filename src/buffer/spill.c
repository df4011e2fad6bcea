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
 * The file is made at the first spill in a private directory of its own
 * under spill_dir (unimem-PID-XXXXXX, mode 0700; the file 0600) and
 * unlinked at once, so nobody else can open it and nothing of it is left
 * however the process ends; the directory goes at shutdown, and one left
 * by a process that died is removed by the next context that spills
 * there. Each extent's disk blocks are allocated when it is made
 * (fallocate), and again before it is written once more (the file may
 * have been truncated meanwhile): a full disk is an error then, never a
 * SIGBUS on a write to the mapping. Freed extents give their blocks back
 * (a punched hole) and are reused first-fit.
 *
 * The file is still reachable through /proc/PID/fd, and a disk can fail:
 * what is read back is checked. A CRC-32 per 64 KiB of an extent is taken
 * when it is written; before data is read from the file the file's size
 * is checked (a truncated mapping would raise SIGBUS) and the sums of the
 * part read are compared. A mismatch fails the read, naming the file,
 * and the data is never returned.
 */
#include "buffer.h"

#include "../base/vtime.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

typedef struct extent {
    size_t off, len;
} extent;

struct um__spill {
    pthread_mutex_t lock;
    int fd;
    char dir[300];      /* the private directory, removed at destroy */
    char path[340];     /* for messages; the file itself is unlinked */
    size_t page;
    size_t end;         /* the file's size: extents lie below it */
    extent *free;       /* free extents below `end`, by offset, coalesced */
    size_t nfree, free_cap;
    _Atomic size_t used;/* bytes of live extents */
};

#define DIR_PREFIX "unimem-"

/* Removes the private directories under dir that processes of this user
 * left when they died (a crash between making one and removing it). */
static void remove_stale_dirs(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    int dfd = dirfd(d);
    for (struct dirent *e; (e = readdir(d));) {
        char *end = NULL;
        if (strncmp(e->d_name, DIR_PREFIX, strlen(DIR_PREFIX)) != 0)
            continue;
        long pid = strtol(e->d_name + strlen(DIR_PREFIX), &end, 10);
        struct stat st;
        if (pid <= 0 || !end || *end != '-' || fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) ||
            !S_ISDIR(st.st_mode) || st.st_uid != getuid() || pid == (long)getpid() ||
            kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        int sub = openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
        DIR *sd = sub >= 0 ? fdopendir(sub) : NULL;
        if (sd) {
            for (struct dirent *f; (f = readdir(sd));)
                if (strcmp(f->d_name, ".") && strcmp(f->d_name, ".."))
                    (void)unlinkat(sub, f->d_name, 0);
            closedir(sd);
        } else if (sub >= 0) {
            close(sub);
        }
        if (unlinkat(dfd, e->d_name, AT_REMOVEDIR) == 0)
            um__log(UM_LOG_INFO, "spill: removed %s/%s, left by process %ld", dir, e->d_name,
                    pid);
    }
    closedir(d);
}

um_status um__spill_create(const char *dir, um__spill **out)
{
    *out = NULL;
    um__spill *sp = calloc(1, sizeof *sp);
    if (!sp)
        return um__fail(UM_ERR_NOMEM, "spill: no memory for the file tier's state");
    remove_stale_dirs(dir);
    snprintf(sp->dir, sizeof sp->dir, "%s/" DIR_PREFIX "%ld-XXXXXX", dir, (long)getpid());
    if (!mkdtemp(sp->dir)) {
        int e = errno;
        free(sp);
        return um__fail(UM_ERR_BACKEND, "spill: cannot make a directory in spill_dir '%s': %s",
                        dir, strerror(e));
    }
    snprintf(sp->path, sizeof sp->path, "%s/spill-XXXXXX", sp->dir);
    sp->fd = mkstemp(sp->path);
    if (sp->fd < 0) {
        int e = errno;
        (void)rmdir(sp->dir);
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
    (void)rmdir(sp->dir);
    free(sp->free);
    pthread_mutex_destroy(&sp->lock);
    free(sp);
}

size_t um__spill_sums(size_t size)
{
    return (size + UM_SPILL_SUM_BYTES - 1) / UM_SPILL_SUM_BYTES;
}

void um__spill_seal(const void *map, size_t size, uint32_t *sums)
{
    for (size_t i = 0, n = um__spill_sums(size); i < n; i++) {
        size_t off = i * UM_SPILL_SUM_BYTES;
        size_t len = size - off < UM_SPILL_SUM_BYTES ? size - off : UM_SPILL_SUM_BYTES;
        sums[i] = (uint32_t)crc32_z(0, (const unsigned char *)map + off, len);
    }
}

um_status um__spill_check(um__spill *sp, const void *map, size_t offset, size_t size,
                          const uint32_t *sums, size_t from, size_t n)
{
    /* Reading the mapping faults only on pages wholly past the file's end,
     * so a file that still holds the data's last byte is whole enough. */
    struct stat st;
    size_t need = offset + size;
    if (fstat(sp->fd, &st) != 0)
        return um__fail(UM_ERR_IO, "spill: the spill file %s (deleted) cannot be checked: "
                        "fstat failed: %s", sp->path, strerror(errno));
    if ((size_t)st.st_size < need)
        return um__fail(UM_ERR_BACKEND,
                        "spill: the spill file %s (deleted) was truncated behind unimem's back "
                        "(%lld bytes; an extent ends at %zu): the data spilled there is lost",
                        sp->path, (long long)st.st_size, need);
    size_t first = from / UM_SPILL_SUM_BYTES, last = n ? (from + n - 1) / UM_SPILL_SUM_BYTES : first;
    for (size_t i = first; n && i <= last; i++) {
        size_t off = i * UM_SPILL_SUM_BYTES;
        size_t len = size - off < UM_SPILL_SUM_BYTES ? size - off : UM_SPILL_SUM_BYTES;
        if ((uint32_t)crc32_z(0, (const unsigned char *)map + off, len) != sums[i])
            return um__fail(UM_ERR_BACKEND,
                            "spill: the spill file %s (deleted) was changed behind unimem's back "
                            "(bytes %zu-%zu of an extent at %zu fail their checksum): the data "
                            "spilled there is lost",
                            sp->path, off, off + len - 1, offset);
    }
    return UM_OK;
}

/* Takes len bytes first-fit from the free extents, else from the end,
 * starting in the free run that ends there if there is one (so that the
 * file grows by what is missing, not by the whole extent). */
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
    if (sp->nfree && sp->free[sp->nfree - 1].off + sp->free[sp->nfree - 1].len == sp->end)
        off = sp->free[--sp->nfree].off;
    sp->end = off + len;
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
    um__vt_mutex_lock(&sp->lock);
    size_t off = take_extent(sp, len);
    int err = posix_fallocate(sp->fd, (off_t)off, (off_t)len);
    void *p = err ? MAP_FAILED
                  : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, sp->fd, (off_t)off);
    if (p == MAP_FAILED) {
        if (!err)
            err = errno;
        /* A failed fallocate may have allocated part of the range: its
         * blocks go back to the disk with the extent. */
        (void)fallocate(sp->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
                        (off_t)len);
        (void)give_extent(sp, off, len);
        um__vt_mutex_unlock(&sp->lock);
        char n[32];
        return um__fail(UM_ERR_NOMEM, "spill: no room for %s in the spill file in %s: %s",
                        um__format_bytes(n, sizeof n, size), sp->path, strerror(err));
    }
    um__vt_mutex_unlock(&sp->lock);
    atomic_fetch_add(&sp->used, len);
    *map = p;
    *offset = off;
    return UM_OK;
}

um_status um__spill_prepare(um__spill *sp, size_t offset, size_t size)
{
    size_t len = extent_len(sp, size);
    /* The file may have been truncated behind unimem's back since the
     * extent was made (through /proc/PID/fd): a store into the mapping
     * beyond its end would raise SIGBUS. Allocating the extent's blocks
     * again gives the file back its size, or fails on a full disk. */
    um__vt_mutex_lock(&sp->lock);
    int err = posix_fallocate(sp->fd, (off_t)offset, (off_t)len);
    um__vt_mutex_unlock(&sp->lock);
    if (err) {
        char n[32];
        return um__fail(UM_ERR_NOMEM, "spill: no room for %s in the spill file in %s: %s",
                        um__format_bytes(n, sizeof n, size), sp->path, strerror(err));
    }
    return UM_OK;
}

void um__spill_free(um__spill *sp, void *map, size_t offset, size_t size)
{
    if (!map)
        return;
    size_t len = extent_len(sp, size);
    (void)munmap(map, len);
    um__vt_mutex_lock(&sp->lock);
    /* The blocks go back to the disk; the range stays in the file. */
    (void)fallocate(sp->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)offset,
                    (off_t)len);
    (void)give_extent(sp, offset, len);
    um__vt_mutex_unlock(&sp->lock);
    atomic_fetch_sub(&sp->used, len);
}

size_t um__spill_used(um__spill *sp)
{
    return sp ? atomic_load(&sp->used) : 0;
}
