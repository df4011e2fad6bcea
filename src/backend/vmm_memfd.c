/*
 * vmm_memfd: the VMM operations, streams, events and copies of the host and
 * sim backends (see vmm_memfd.h). Owns each device's memfd, its physical
 * page allocator, the reservation and mapping tables, and the streams.
 *
 * The semantics follow CUDA's driver VMM so that a pool written against this
 * backend behaves the same on a GPU:
 *   - a reservation is released only as the exact range reserve returned,
 *     and only once nothing is mapped in it (else UM_ERR_BUSY);
 *   - map takes a whole chunk and an unmapped range inside one reservation;
 *   - unmap takes a range made of whole mappings, every page of it mapped;
 *   - releasing a chunk that is still mapped invalidates the handle at once
 *     but keeps the memory (and its physical_bytes) until its last unmap,
 *     as cuMemRelease does.
 * Every check runs before anything changes, so a failed call leaves the
 * backend as it was. One mutex per backend guards the tables; these are
 * slow-path calls. Stream counters are atomics and take no lock.
 */
#include "vmm_memfd.h"

#include "../base/vtime.h"
#include "vdev.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define NOT_FOUND SIZE_MAX

static um__memfd_backend *mb(um__backend *b)
{
    return (um__memfd_backend *)b;
}

/* Every live memfd backend (linked through registry_next), so that a copy
 * finds the device at its other end from an address: to book that
 * device's side of a modelled link and to check that the range there is
 * mapped. Lookups hold the lock for reading, creation and destruction for
 * writing; it is taken before any backend's lock, never after. */
static pthread_rwlock_t registry_lock = PTHREAD_RWLOCK_INITIALIZER;
static um__memfd_backend *registry;

/* ------------------------------------------------------------- bitmaps */

static bool bit_get(const uint64_t *bm, uint32_t i)
{
    return (bm[i >> 6] >> (i & 63)) & 1u;
}
static void bit_set(uint64_t *bm, uint32_t i)
{
    bm[i >> 6] |= 1ull << (i & 63);
}
static void bit_clear(uint64_t *bm, uint32_t i)
{
    bm[i >> 6] &= ~(1ull << (i & 63));
}

/* The first index >= from, below n, whose bit equals want; n if none. Whole
 * words are skipped at once, so a scan costs n/64 steps at most. */
static uint64_t next_bit(const uint64_t *bm, uint64_t n, uint64_t from, int want)
{
    while (from < n) {
        uint64_t w = bm[from >> 6];
        if (!want)
            w = ~w;
        w >>= from & 63;
        if (w) {
            uint64_t i = from + (uint64_t)__builtin_ctzll(w);
            return i < n ? i : n;
        }
        from = (from | 63) + 1;
    }
    return n;
}

/* A run of `count` clear bits that starts in [lo, hi) (and may end anywhere
 * below n). */
static bool find_run(const uint64_t *bm, uint64_t n, uint64_t lo, uint64_t hi, uint64_t count,
                     uint32_t *out)
{
    uint64_t i = lo;
    while (i < hi) {
        i = next_bit(bm, n, i, 0);
        if (i >= hi)
            return false;
        uint64_t j = next_bit(bm, n, i, 1);
        if (j - i >= count) {
            *out = (uint32_t)i;
            return true;
        }
        i = j;
    }
    return false;
}

/* ---------------------------------------------------- physical pages */

/* Takes n free pages (the caller checked that n pages are free in total).
 * One-page chunks come from the stack of released pages first (LIFO keeps
 * the hot pages hot); otherwise a next-fit search of the bitmap finds a
 * contiguous run. False when no contiguous run of n pages exists. */
static bool pages_take(um__memfd_backend *m, uint32_t n, uint32_t *out)
{
    uint32_t p;
    if (n == 1) {
        while (m->stack_len) {
            p = m->stack[--m->stack_len];
            bit_clear(m->instack, p);
            if (!bit_get(m->used, p))
                goto found;
        }
    }
    if (!find_run(m->used, m->npages, m->hint, m->npages, n, &p) &&
        !find_run(m->used, m->npages, 0, m->hint, n, &p))
        return false;
found:
    for (uint32_t i = 0; i < n; i++)
        bit_set(m->used, p + i);
    m->used_pages += n;
    m->hint = p + n < m->npages ? p + n : 0;
    *out = p;
    return true;
}

static void pages_put(um__memfd_backend *m, uint32_t p, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        bit_clear(m->used, p + i);
    m->used_pages -= n;
    if (n == 1 && !bit_get(m->instack, p)) {
        bit_set(m->instack, p);
        m->stack[m->stack_len++] = p;
    }
}

/* Gives the pages of chunk p back: the hole punch returns the host RAM and
 * makes the next chunk on these pages read as zero. On failure nothing
 * changes. */
static um_status chunk_free(um__memfd_backend *m, uint32_t p)
{
    um__memfd_page *pg = &m->pages[p];
    size_t g = m->base.granularity;
    size_t len = (size_t)pg->npages * g;
    if (fallocate(m->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)((size_t)p * g),
                  (off_t)len) != 0)
        return um__fail(UM_ERR_BACKEND,
                        "%s: release of %zu bytes at memfd offset %zu: "
                        "fallocate(PUNCH_HOLE) failed: %s",
                        m->base.name, len, (size_t)p * g, strerror(errno));
    pages_put(m, p, pg->npages);
    pg->npages = 0;
    pg->maps = 0;
    pg->zombie = 0;
    atomic_fetch_sub_explicit(&m->base.physical_bytes, len, memory_order_relaxed);
    return UM_OK;
}

/* Checks that h names a live chunk (not released, not stale) and gives its
 * first page. */
static um_status chunk_lookup(um__memfd_backend *m, um__phys h, const char *what, uint32_t *page)
{
    uint32_t p = um__memfd_handle_page(h);
    if (h == 0 || p >= m->npages || m->pages[p].npages == 0 || m->pages[p].zombie ||
        m->pages[p].gen != um__memfd_handle_gen(h))
        return um__fail(UM_ERR_INVALID,
                        "%s: %s: handle 0x%llx is not a live chunk (never created by this "
                        "device, or already released)",
                        m->base.name, what, (unsigned long long)h);
    *page = p;
    return UM_OK;
}

/* ------------------------------------------------ reservations, maps */

/* Grows a table to hold `need` entries; returns the (maybe moved) table or
 * NULL, in which case the old one is untouched. */
static void *grow(void *arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return arr;
    size_t nc = *cap ? *cap * 2 : 16;
    while (nc < need)
        nc *= 2;
    void *p = realloc(arr, nc * elem);
    if (p)
        *cap = nc;
    return p;
}

/* Index of the first reservation starting above x. */
static size_t res_upper(const um__memfd_backend *m, uintptr_t x)
{
    size_t lo = 0, hi = m->nres;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->res[mid].va <= x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The reservation that holds all of [va, va + size), or NOT_FOUND. */
static size_t res_find(const um__memfd_backend *m, uintptr_t va, size_t size)
{
    size_t i = res_upper(m, va);
    if (i == 0)
        return NOT_FOUND;
    const um__memfd_range *r = &m->res[i - 1];
    size_t off = va - r->va;
    if (off < r->size && size <= r->size - off)
        return i - 1;
    return NOT_FOUND;
}

/* Granule index of va inside reservation r. */
static size_t granule(const um__memfd_backend *m, const um__memfd_range *r, uintptr_t va)
{
    return (va - r->va) / m->base.granularity;
}

/* True when every byte of [a, a + n) is mapped (by one or several adjacent
 * mappings; mappings never cross reservations). */
static bool range_mapped(const um__memfd_backend *m, uintptr_t a, size_t n)
{
    if (n == 0 || n > UINTPTR_MAX - a)
        return false;
    size_t ri = res_find(m, a, n);
    if (ri == NOT_FOUND)
        return false;
    const um__memfd_range *r = &m->res[ri];
    for (size_t g = granule(m, r, a), last = granule(m, r, a + n - 1); g <= last; g++)
        if (!r->cover[g])
            return false;
    return true;
}

/* True when [a, a + n) (n > 0) shares a byte with a reservation of m, or
 * wraps past the end of the address space. */
static bool res_overlaps(const um__memfd_backend *m, uintptr_t a, size_t n)
{
    if (n > UINTPTR_MAX - a + 1)
        return true;
    size_t i = res_upper(m, a + (n - 1));
    return i > 0 && m->res[i - 1].va + m->res[i - 1].size > a;
}

/* The memfd backend other than m one of whose reservations shares a byte
 * with [p, p + n) (n > 0), or NULL (registry_lock held). */
static um__memfd_backend *other_holder(const um__memfd_backend *m, const void *p, size_t n)
{
    for (um__memfd_backend *o = registry; o; o = o->registry_next) {
        if (o == m)
            continue;
        pthread_mutex_lock(&o->lock);
        bool in = res_overlaps(o, (uintptr_t)p, n);
        pthread_mutex_unlock(&o->lock);
        if (in)
            return o;
    }
    return NULL;
}

/* Fails (UM_ERR_INVALID) when [p, p + n) shares a byte with a reservation
 * of m or of another memfd device and is not wholly mapped memory there:
 * touching a reserved page that is not mapped crashes the process, where
 * a GPU's copy returns an error. A range that starts in the program's
 * memory and runs into a reservation fails too. Memory of no device is
 * the program's, and passes. `what` and `side` name the call and the
 * pointer. */
static um_status check_mapped(um__memfd_backend *m, const void *p, size_t n, const char *what,
                              const char *side)
{
    if (n == 0)
        return UM_OK;
    um__memfd_backend *holder = m;
    pthread_mutex_lock(&m->lock);
    bool in = res_overlaps(m, (uintptr_t)p, n);
    bool ok = !in || range_mapped(m, (uintptr_t)p, n);
    pthread_mutex_unlock(&m->lock);
    if (!in) {
        pthread_rwlock_rdlock(&registry_lock);
        holder = other_holder(m, p, n);
        if (holder) {
            pthread_mutex_lock(&holder->lock);
            ok = range_mapped(holder, (uintptr_t)p, n);
            pthread_mutex_unlock(&holder->lock);
        }
        pthread_rwlock_unlock(&registry_lock);
    }
    if (ok)
        return UM_OK;
    return um__fail(UM_ERR_INVALID,
                    "%s: %s of %zu bytes: the %s range at %p runs into reserved memory of "
                    "device %s that is not mapped",
                    m->base.name, what, n, side, p, holder->base.name);
}

/* Puts PROT_NONE anonymous memory back over [va, va + size), which keeps the
 * range reserved but drops whatever was mapped there. */
static bool remap_none(uintptr_t va, size_t size)
{
    void *p = mmap((void *)va, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    return p != MAP_FAILED;
}

static bool aligned(const um__backend *b, uintptr_t va, size_t size)
{
    return va % b->granularity == 0 && size != 0 && size % b->granularity == 0;
}

/* ----------------------------------------------------------- VMM ops */

static um_status vmm_reserve(um__backend *b, size_t size, uintptr_t *va)
{
    um__memfd_backend *m = mb(b);
    size_t g = b->granularity;
    if (!va)
        return um__fail(UM_ERR_INVALID, "%s: reserve: the output address is NULL", b->name);
    if (size == 0 || size % g)
        return um__fail(UM_ERR_INVALID,
                        "%s: reserve of %zu bytes: not a nonzero multiple of the granularity "
                        "%zu",
                        b->name, size, g);
    /* The page tables index granules with 32 bits (a mapping's first
     * granule + 1 in `cover`). Out of memory, as an address space too
     * small for the request is to the driver, so that callers that shrink
     * a reservation and retry do so here too. */
    if (size / g >= UINT32_MAX)
        return um__fail(UM_ERR_NOMEM,
                        "%s: reserve of %zu bytes: more than %u granules of %zu bytes, the most "
                        "one reservation may span",
                        b->name, size, UINT32_MAX - 1, g);
    /* mmap gives OS-page alignment; g - os_page more bytes always hold an
     * address aligned to g with size bytes after it. (size is at most
     * SIZE_MAX + 1 - g, so the sum cannot overflow.) */
    size_t extra = g - m->os_page;

    pthread_mutex_lock(&m->lock);
    um__memfd_range *res = grow(m->res, &m->res_cap, m->nres + 1, sizeof *m->res);
    if (!res) {
        pthread_mutex_unlock(&m->lock);
        return um__fail(UM_ERR_NOMEM, "%s: reserve of %zu bytes: no memory for reservation %zu",
                        b->name, size, m->nres + 1);
    }
    m->res = res;
    void *raw =
        mmap(NULL, size + extra, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
        int e = errno;
        pthread_mutex_unlock(&m->lock);
        return um__fail(e == ENOMEM ? UM_ERR_NOMEM : UM_ERR_BACKEND,
                        "%s: reserve of %zu bytes of address space: mmap failed: %s", b->name, size,
                        strerror(e));
    }
    uintptr_t r = (uintptr_t)raw;
    uintptr_t a = um__align_up(r, g);
    /* Trimming only shortens one mapping, so it cannot fail for lack of
     * map slots; were it to fail anyway, the excess would stay reserved
     * (harmless) until the process exits. */
    if (a > r)
        (void)munmap(raw, a - r);
    if (r + extra > a)
        (void)munmap((void *)(a + size), r + extra - a);
    /* calloc'd tables cost memory only where the pool maps something. */
    uint32_t *cover = calloc(size / g, sizeof *cover), *chunk = calloc(size / g, sizeof *chunk);
    if (!cover || !chunk) {
        free(cover);
        free(chunk);
        (void)munmap((void *)a, size);
        pthread_mutex_unlock(&m->lock);
        return um__fail(UM_ERR_NOMEM, "%s: reserve of %zu bytes: no memory for its page table",
                        b->name, size);
    }
    size_t i = res_upper(m, a);
    memmove(&m->res[i + 1], &m->res[i], (m->nres - i) * sizeof *m->res);
    m->res[i] = (um__memfd_range){a, size, cover, chunk, 0};
    m->nres++;
    pthread_mutex_unlock(&m->lock);
    *va = a;
    return UM_OK;
}

static um_status vmm_unreserve(um__backend *b, uintptr_t va, size_t size)
{
    um__memfd_backend *m = mb(b);
    um_status st = UM_OK;
    pthread_mutex_lock(&m->lock);
    size_t i = res_upper(m, va);
    if (i == 0 || m->res[i - 1].va != va || m->res[i - 1].size != size) {
        st = um__fail(UM_ERR_INVALID,
                      "%s: unreserve of %zu bytes at 0x%lx: not a range reserve returned", b->name,
                      size, (unsigned long)va);
    } else if (m->res[i - 1].mapped) {
        st = um__fail(UM_ERR_BUSY,
                      "%s: unreserve of %zu bytes at 0x%lx: %zu bytes are still mapped in it",
                      b->name, size, (unsigned long)va,
                      m->res[i - 1].mapped * b->granularity);
    } else if (munmap((void *)va, size) != 0) {
        st = um__fail(UM_ERR_BACKEND, "%s: unreserve of %zu bytes at 0x%lx: munmap failed: %s",
                      b->name, size, (unsigned long)va, strerror(errno));
    } else {
        i--;
        free(m->res[i].cover);
        free(m->res[i].chunk);
        memmove(&m->res[i], &m->res[i + 1], (m->nres - i - 1) * sizeof *m->res);
        m->nres--;
    }
    pthread_mutex_unlock(&m->lock);
    return st;
}

static um_status vmm_create(um__backend *b, size_t size, um__phys *out)
{
    um__memfd_backend *m = mb(b);
    size_t g = b->granularity;
    if (!out)
        return um__fail(UM_ERR_INVALID, "%s: create: the output handle is NULL", b->name);
    if (size == 0 || size % g)
        return um__fail(UM_ERR_INVALID,
                        "%s: create of %zu bytes: not a nonzero multiple of the granularity %zu",
                        b->name, size, g);
    um_status st = UM_OK;
    uint32_t p;
    pthread_mutex_lock(&m->lock);
    size_t used = (size_t)m->used_pages * g;
    if (size > b->capacity - used) {
        st = um__fail(UM_ERR_NOMEM,
                      "%s: create of %zu bytes: %zu of the capacity of %zu bytes are in use",
                      b->name, size, used, b->capacity);
    } else if (!pages_take(m, (uint32_t)(size / g), &p)) {
        st = um__fail(UM_ERR_NOMEM,
                      "%s: create of %zu bytes: no %zu contiguous free pages (%zu of the "
                      "capacity of %zu bytes are in use)",
                      b->name, size, size / g, used, b->capacity);
    } else {
        um__memfd_page *pg = &m->pages[p];
        pg->npages = (uint32_t)(size / g);
        pg->gen++;
        pg->maps = 0;
        pg->zombie = 0;
        atomic_fetch_add_explicit(&b->physical_bytes, size, memory_order_relaxed);
        *out = ((um__phys)pg->gen << 32) | ((um__phys)p + 1);
    }
    pthread_mutex_unlock(&m->lock);
    return st;
}

static um_status vmm_release(um__backend *b, um__phys h, size_t size)
{
    um__memfd_backend *m = mb(b);
    uint32_t p = 0; /* set by chunk_lookup */
    pthread_mutex_lock(&m->lock);
    um_status st = chunk_lookup(m, h, "release", &p);
    if (st == UM_OK) {
        um__memfd_page *pg = &m->pages[p];
        size_t bytes = (size_t)pg->npages * b->granularity;
        if (size != bytes)
            st = um__fail(UM_ERR_INVALID,
                          "%s: release of handle 0x%llx with size %zu: the chunk has %zu bytes",
                          b->name, (unsigned long long)h, size, bytes);
        else if (pg->maps)
            pg->zombie = 1; /* freed by its last unmap, like cuMemRelease */
        else
            st = chunk_free(m, p);
    }
    pthread_mutex_unlock(&m->lock);
    return st;
}

static um_status vmm_map(um__backend *b, uintptr_t va, size_t size, um__phys h)
{
    um__memfd_backend *m = mb(b);
    size_t g = b->granularity;
    if (!aligned(b, va, size))
        return um__fail(UM_ERR_INVALID,
                        "%s: map of %zu bytes at 0x%lx: address and size must be nonzero "
                        "multiples of the granularity %zu",
                        b->name, size, (unsigned long)va, g);
    uint32_t p = 0; /* set by chunk_lookup */
    pthread_mutex_lock(&m->lock);
    um_status st = chunk_lookup(m, h, "map", &p);
    if (st != UM_OK)
        goto out;
    size_t bytes = (size_t)m->pages[p].npages * g;
    size_t ri = res_find(m, va, size);
    if (size != bytes) {
        st = um__fail(UM_ERR_INVALID,
                      "%s: map of handle 0x%llx with size %zu: the chunk has %zu bytes", b->name,
                      (unsigned long long)h, size, bytes);
        goto out;
    }
    if (ri == NOT_FOUND) {
        st = um__fail(UM_ERR_INVALID,
                      "%s: map of %zu bytes at 0x%lx: not inside one reservation of this device",
                      b->name, size, (unsigned long)va);
        goto out;
    }
    um__memfd_range *r = &m->res[ri];
    size_t g0 = granule(m, r, va), n = size / g;
    for (size_t i = g0; i < g0 + n; i++) {
        if (r->cover[i]) {
            size_t start = r->cover[i] - 1;
            st = um__fail(UM_ERR_INVALID,
                          "%s: map of %zu bytes at 0x%lx: overlaps the mapping of %zu bytes at "
                          "0x%lx",
                          b->name, size, (unsigned long)va,
                          (size_t)m->pages[r->chunk[start]].npages * g,
                          (unsigned long)(r->va + start * g));
            goto out;
        }
    }
    void *addr = mmap((void *)va, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, m->fd,
                      (off_t)((size_t)p * g));
    if (addr == MAP_FAILED) {
        int e = errno;
        /* A failed MAP_FIXED may already have dropped the reservation
         * there; put it back. */
        (void)remap_none(va, size);
        st = um__fail(e == ENOMEM ? UM_ERR_NOMEM : UM_ERR_BACKEND,
                      "%s: map of %zu bytes at 0x%lx: mmap failed: %s (%zu mappings live; "
                      "vm.max_map_count bounds them)",
                      b->name, size, (unsigned long)va, strerror(e), m->nmaps);
        goto out;
    }
    for (size_t i = g0; i < g0 + n; i++)
        r->cover[i] = (uint32_t)(g0 + 1);
    r->chunk[g0] = p;
    r->mapped += n;
    m->nmaps++;
    m->pages[p].maps++;
out:
    pthread_mutex_unlock(&m->lock);
    return st;
}

static um_status vmm_unmap(um__backend *b, uintptr_t va, size_t size)
{
    um__memfd_backend *m = mb(b);
    if (!aligned(b, va, size))
        return um__fail(UM_ERR_INVALID,
                        "%s: unmap of %zu bytes at 0x%lx: address and size must be nonzero "
                        "multiples of the granularity %zu",
                        b->name, size, (unsigned long)va, b->granularity);
    um_status st = UM_OK;
    size_t g = b->granularity;
    pthread_mutex_lock(&m->lock);
    size_t ri = res_find(m, va, size);
    if (ri == NOT_FOUND) {
        st = um__fail(UM_ERR_INVALID,
                      "%s: unmap of %zu bytes at 0x%lx: not inside one reservation of this "
                      "device",
                      b->name, size, (unsigned long)va);
        goto out;
    }
    um__memfd_range *r = &m->res[ri];
    size_t g0 = granule(m, r, va), end = g0 + size / g, cur = g0;
    /* The range must be a sequence of whole, adjacent mappings. */
    while (cur < end) {
        if (r->cover[cur] != cur + 1) {
            st = um__fail(UM_ERR_INVALID,
                          "%s: unmap of %zu bytes at 0x%lx: no mapping starts at 0x%lx (the "
                          "page is unmapped or inside another mapping)",
                          b->name, size, (unsigned long)va, (unsigned long)(r->va + cur * g));
            goto out;
        }
        cur += m->pages[r->chunk[cur]].npages;
    }
    if (cur != end) {
        st = um__fail(UM_ERR_INVALID,
                      "%s: unmap of %zu bytes at 0x%lx: would split the mapping that ends at "
                      "0x%lx",
                      b->name, size, (unsigned long)va, (unsigned long)(r->va + cur * g));
        goto out;
    }
    if (!remap_none(va, size)) {
        st = um__fail(UM_ERR_BACKEND, "%s: unmap of %zu bytes at 0x%lx: mmap(PROT_NONE) failed: %s",
                      b->name, size, (unsigned long)va, strerror(errno));
        goto out;
    }
    for (cur = g0; cur < end;) {
        uint32_t page = r->chunk[cur];
        size_t len = m->pages[page].npages;
        um__memfd_page *pg = &m->pages[page];
        if (--pg->maps == 0 && pg->zombie && chunk_free(m, page) != UM_OK)
            /* The handle is gone, so nobody can retry: the pages stay
             * used (never handed out unzeroed) until destroy. */
            um__log(UM_LOG_WARN, "%s", um_last_error());
        memset(&r->cover[cur], 0, len * sizeof *r->cover);
        r->mapped -= len;
        m->nmaps--;
        cur += len;
    }
out:
    pthread_mutex_unlock(&m->lock);
    return st;
}

/* ---------------------------------------------------- streams, events */

um__bstream *um__memfd_stream(um__backend *b, um__bstream *s, const char *what)
{
    if (!s)
        return &mb(b)->default_stream;
    if (s->owner != b || s->magic != UM_MEMFD_STREAM_MAGIC) {
        um__fail(UM_ERR_INVALID, "%s: %s: %p is not a live stream of this device", b->name, what,
                 (void *)s);
        return NULL;
    }
    return s;
}

bool um__memfd_holds(um__backend *b, const void *p)
{
    um__memfd_backend *m = mb(b);
    pthread_mutex_lock(&m->lock);
    bool in = res_find(m, (uintptr_t)p, 1) != NOT_FOUND;
    pthread_mutex_unlock(&m->lock);
    return in;
}

/* Marks the work queued up to `target` (a submitted count) as completed. */
static void complete_to(um__bstream *s, uint64_t target)
{
    uint64_t c = atomic_load_explicit(&s->completed, memory_order_acquire);
    while (c < target && !atomic_compare_exchange_weak_explicit(
                             &s->completed, &c, target, memory_order_acq_rel, memory_order_acquire))
        ;
}

static void stream_unref(um__memfd_backend *m, um__bstream *s)
{
    if (s->is_default || atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_mutex_lock(&m->lock);
    s->link.prev->next = s->link.next;
    s->link.next->prev = s->link.prev;
    pthread_mutex_unlock(&m->lock);
    if (um__vt_on())
        um__vdev_forget(s);
    free(s);
}

static um_status vmm_stream_create(um__backend *b, um__bstream **out)
{
    um__memfd_backend *m = mb(b);
    if (!out)
        return um__fail(UM_ERR_INVALID, "%s: stream_create: the output stream is NULL", b->name);
    um__bstream *s = calloc(1, sizeof *s);
    if (!s)
        return um__fail(UM_ERR_NOMEM, "%s: stream_create: no memory for %zu bytes", b->name,
                        sizeof *s);
    s->owner = b;
    s->magic = UM_MEMFD_STREAM_MAGIC;
    atomic_init(&s->refs, 1);
    atomic_init(&s->submitted, 0);
    atomic_init(&s->completed, 0);
    pthread_mutex_lock(&m->lock);
    s->link.next = m->streams.next;
    s->link.prev = &m->streams;
    m->streams.next->prev = &s->link;
    m->streams.next = &s->link;
    pthread_mutex_unlock(&m->lock);
    *out = s;
    return UM_OK;
}

static um_status vmm_stream_destroy(um__backend *b, um__bstream *s)
{
    if (!s)
        return um__fail(UM_ERR_INVALID,
                        "%s: stream_destroy: the default stream cannot be "
                        "destroyed",
                        b->name);
    um__bstream *st = um__memfd_stream(b, s, "stream_destroy");
    if (!st)
        return UM_ERR_INVALID;
    if (st->is_default)
        return um__fail(UM_ERR_INVALID,
                        "%s: stream_destroy: the default stream cannot be destroyed", b->name);
    /* Destroying waits for the stream's work, so events recorded on it
     * (which keep the object alive) report done from now on. */
    complete_to(st, atomic_load_explicit(&st->submitted, memory_order_acquire));
    if (um__vt_on())
        um__vdev_wait(st, um__vdev_mark(st));
    st->magic = UM_MEMFD_STREAM_DEAD;
    stream_unref(mb(b), st);
    return UM_OK;
}

/* ------------------------------------------------------ modelled link */

/* A sim device may model its link to the host (option sim_link_bandwidth):
 * the data still moves at once (a memmove), but a copy keeps its stream
 * and its direction of the link busy for bytes x ns_per_byte, after the
 * work queued before it. Events and synchronizes then complete at those
 * times, so the engine's overlap of copies (or its lack) shows in wall
 * time as it would on a GPU. */

static void busy_at_least(um__bstream *s, uint64_t t)
{
    uint64_t v = atomic_load_explicit(&s->busy_until, memory_order_acquire);
    while (v < t && !atomic_compare_exchange_weak_explicit(&s->busy_until, &v, t,
                                                            memory_order_acq_rel,
                                                            memory_order_acquire))
        ;
}

/* The time a copy of n bytes from src to dst, issued at `issued`, ends on
 * the modelled link, queued behind `after` (a stream's queued work; 0 for
 * none), or 0 when the copy does not cross the link (no model, or both
 * ends on one side). When the other end is another device with a modelled
 * link (a copy between two sim devices), the copy holds the sender's
 * "from" direction and the receiver's "to" at once, at the slower of the
 * two rates, as virtual time's flow over both links does (vdev.c):
 * booking only the side that ran the copy let one device send to the host
 * and to every peer at once, each at the full rate. The memmove's own time
 * overlaps the link's, as the host's does a GPU copy's. */
static uint64_t link_copy_end(um__memfd_backend *m, void *dst, const void *src, size_t n,
                              uint64_t issued, uint64_t after)
{
    double per = m->base.link_ns_per_byte;
    if (per <= 0.0 || n == 0)
        return 0;
    pthread_mutex_lock(&m->lock);
    bool to = range_mapped(m, (uintptr_t)dst, 1), from = range_mapped(m, (uintptr_t)src, 1);
    pthread_mutex_unlock(&m->lock);
    if (to == from)
        return 0;
    pthread_rwlock_rdlock(&registry_lock);
    um__memfd_backend *peer = other_holder(m, to ? src : dst, 1);
    if (peer && peer->base.link_ns_per_byte <= 0.0)
        peer = NULL; /* the host's memory, or a device without a model */
    /* Both locks in address order: two devices copying to each other at
     * once take them in the same order. */
    bool peer_first = peer && (uintptr_t)peer < (uintptr_t)m;
    um__memfd_backend *first = peer_first ? peer : m, *second = peer_first ? m : peer;
    pthread_mutex_lock(&first->lock);
    if (second)
        pthread_mutex_lock(&second->lock);
    uint64_t *mine = &m->link_free[to ? 0 : 1];
    uint64_t *theirs = peer ? &peer->link_free[to ? 1 : 0] : NULL;
    uint64_t start = issued;
    if (after > start)
        start = after;
    if (*mine > start)
        start = *mine;
    if (theirs && *theirs > start)
        start = *theirs;
    if (peer && peer->base.link_ns_per_byte > per)
        per = peer->base.link_ns_per_byte;
    uint64_t end = start + (uint64_t)((double)n * per);
    *mine = end;
    if (theirs)
        *theirs = end;
    if (second)
        pthread_mutex_unlock(&second->lock);
    pthread_mutex_unlock(&first->lock);
    pthread_rwlock_unlock(&registry_lock);
    return end;
}

static um_status vmm_stream_sync(um__backend *b, um__bstream *s)
{
    um__bstream *st = um__memfd_stream(b, s, "stream_sync");
    if (!st)
        return UM_ERR_INVALID;
    complete_to(st, atomic_load_explicit(&st->submitted, memory_order_acquire));
    if (um__vt_on())
        um__vdev_wait(st, um__vdev_mark(st));
    else
        um__sleep_until_ns(atomic_load_explicit(&st->busy_until, memory_order_acquire));
    return UM_OK;
}

static um__bevent *event_check(um__backend *b, um__bevent *e, const char *what)
{
    if (!e || e->owner != b || e->magic != UM_MEMFD_EVENT_MAGIC) {
        um__fail(UM_ERR_INVALID, "%s: %s: %p is not a live event of this device", b->name, what,
                 (void *)e);
        return NULL;
    }
    return e;
}

static um_status vmm_event_record(um__backend *b, um__bstream *s, um__bevent **out)
{
    if (!out)
        return um__fail(UM_ERR_INVALID, "%s: event_record: the output event is NULL", b->name);
    um__bstream *st = um__memfd_stream(b, s, "event_record");
    if (!st)
        return UM_ERR_INVALID;
    um__bevent *e = malloc(sizeof *e);
    if (!e)
        return um__fail(UM_ERR_NOMEM, "%s: event_record: no memory for %zu bytes", b->name,
                        sizeof *e);
    if (!st->is_default)
        atomic_fetch_add_explicit(&st->refs, 1, memory_order_relaxed);
    e->owner = b;
    e->stream = st;
    e->target = atomic_load_explicit(&st->submitted, memory_order_acquire);
    e->busy_until = atomic_load_explicit(&st->busy_until, memory_order_acquire);
    e->vt_mark = um__vt_on() ? um__vdev_mark(st) : 0;
    e->recorded_ns = 0;
    e->magic = UM_MEMFD_EVENT_MAGIC;
    *out = e;
    return UM_OK;
}

static um_status vmm_event_query(um__backend *b, um__bevent *e, int *done)
{
    if (!event_check(b, e, "event_query"))
        return UM_ERR_INVALID;
    if (!done)
        return um__fail(UM_ERR_INVALID, "%s: event_query: the output flag is NULL", b->name);
    *done = atomic_load_explicit(&e->stream->completed, memory_order_acquire) >= e->target &&
            (um__vt_on() ? um__vdev_done(e->stream, e->vt_mark)
                         : um__now_ns() >= e->busy_until);
    return UM_OK;
}

static um_status vmm_event_sync(um__backend *b, um__bevent *e)
{
    if (!event_check(b, e, "event_sync"))
        return UM_ERR_INVALID;
    complete_to(e->stream, e->target);
    if (um__vt_on())
        um__vdev_wait(e->stream, e->vt_mark);
    else
        um__sleep_until_ns(e->busy_until);
    return UM_OK;
}

static void vmm_event_destroy(um__backend *b, um__bevent *e)
{
    /* NULL is nothing to destroy, as for free(). There is no status to
     * return, so a bad event is logged and left alone. */
    if (!e)
        return;
    if (!event_check(b, e, "event_destroy")) {
        um__log(UM_LOG_WARN, "%s", um_last_error());
        return;
    }
    e->magic = 0;
    stream_unref(mb(b), e->stream);
    free(e);
}

/* A timed event completes when the work queued before it does: at its
 * recording, or later at the end its stream's modelled link work had
 * then. Virtual time keeps no such times, so nothing is timed there. */
static um_status vmm_event_record_timed(um__backend *b, um__bstream *s, um__bevent **out)
{
    um_status st = vmm_event_record(b, s, out);
    if (st == UM_OK)
        (*out)->recorded_ns = um__now_ns();
    return st;
}

static uint64_t completed_at(const um__bevent *e)
{
    return e->busy_until > e->recorded_ns ? e->busy_until : e->recorded_ns;
}

static um_status vmm_event_elapsed(um__backend *b, um__bevent *start, um__bevent *end,
                                   uint64_t *ns)
{
    if (!event_check(b, start, "event_elapsed") || !event_check(b, end, "event_elapsed"))
        return UM_ERR_INVALID;
    if (!start->recorded_ns || !end->recorded_ns)
        return um__fail(UM_ERR_INVALID, "%s: event_elapsed: an event was not recorded timed",
                        b->name);
    if (um__vt_on())
        return um__fail(UM_ERR_UNSUPPORTED,
                        "%s: event_elapsed: virtual time keeps no completion times", b->name);
    uint64_t a = completed_at(start), z = completed_at(end);
    *ns = z > a ? z - a : 0;
    return UM_OK;
}

static um_status vmm_event_time(um__backend *b, um__bevent *e, uint64_t *ns)
{
    if (!event_check(b, e, "event_time"))
        return UM_ERR_INVALID;
    if (!e->recorded_ns)
        return um__fail(UM_ERR_INVALID, "%s: event_time: the event was not recorded timed",
                        b->name);
    if (um__vt_on())
        return um__fail(UM_ERR_UNSUPPORTED,
                        "%s: event_time: virtual time keeps no completion times", b->name);
    *ns = completed_at(e);
    return UM_OK;
}

/* ------------------------------------------------------- copy, destroy */

static um_status vmm_copy(um__backend *b, void *dst, const void *src, size_t n, int dir)
{
    um__memfd_backend *m = mb(b);
    um_status st = um__backend_copy_check(b, dst, src, n, dir);
    if (st != UM_OK || n == 0)
        return st;
    /* The device side must be mapped memory of this device, as on a GPU;
     * touching an unmapped page here would crash the process instead. */
    const void *dev = dir == 0 ? dst : src;
    pthread_mutex_lock(&m->lock);
    bool ok = range_mapped(m, (uintptr_t)dev, n);
    pthread_mutex_unlock(&m->lock);
    if (!ok)
        return um__fail(UM_ERR_INVALID,
                        "%s: copy of %zu bytes %s: the device range at %p is not mapped memory "
                        "of this device",
                        b->name, n, dir == 0 ? "to the device" : "to the host", dev);
    /* The host side is the program's memory, but a pointer into a
     * reservation (this device's or another's) that is not mapped there
     * would crash the memmove below, as copy_async guards against. */
    st = dir == 0 ? check_mapped(m, src, n, "copy", "source")
                  : check_mapped(m, dst, n, "copy", "destination");
    if (st != UM_OK)
        return st;
    if (um__vt_on()) {
        /* No data in virtual time: the copy takes its modelled time on the
         * default stream (behind its work, as a synchronous copy would). */
        um__bstream *ds = &m->default_stream;
        um__vdev_copy(b, dst, src, n, ds);
        um__vdev_wait(ds, um__vdev_mark(ds));
        return UM_OK;
    }
    /* memmove: an overlapping copy within one device stays defined. */
    uint64_t issued = um__now_ns();
    memmove(dst, src, n);
    um__sleep_until_ns(link_copy_end(m, dst, src, n, issued, 0));
    return UM_OK;
}

/* Host and sim memory is ordinary process memory, so a copy between any
 * two addresses is a memmove, done at once: a queued copy on a sim stream
 * is complete when it is queued, or (modelled link) at its end time. */
static um_status vmm_copy_async(um__backend *b, void *dst, const void *src, size_t n,
                                um__bstream *s)
{
    um_status st = um__backend_copy_check(b, dst, src, n, -1);
    if (st == UM_OK)
        st = check_mapped(mb(b), dst, n, "copy_async", "destination");
    if (st == UM_OK)
        st = check_mapped(mb(b), src, n, "copy_async", "source");
    if (st != UM_OK)
        return st;
    um__bstream *bs = NULL;
    if (um__vt_on()) {
        if (!(bs = um__memfd_stream(b, s, "copy_async")))
            return UM_ERR_INVALID;
        um__vdev_copy(b, dst, src, n, bs);
        return UM_OK;
    }
    if (b->link_ns_per_byte > 0.0 && !(bs = um__memfd_stream(b, s, "copy_async")))
        return UM_ERR_INVALID;
    uint64_t issued = bs ? um__now_ns() : 0;
    if (n)
        memmove(dst, src, n);
    if (bs)
        busy_at_least(bs, link_copy_end(mb(b), dst, src, n, issued,
                                        atomic_load_explicit(&bs->busy_until,
                                                             memory_order_acquire)));
    return UM_OK;
}

/* A sim stream's later work is ordered after e by completing e first: sim
 * work is counters, and copies are done when queued. With a modelled link
 * the stream also stays busy until e's time, without the host waiting;
 * a stream without one (its work untimed) waits for e on the host. */
static um_status vmm_stream_wait(um__backend *b, um__bstream *s, um__backend *eb, um__bevent *e)
{
    if (um__vt_on() && eb->ops == &um__memfd_ops) {
        um__bstream *bs = um__memfd_stream(b, s, "stream_wait");
        if (!bs || !event_check(eb, e, "stream_wait"))
            return UM_ERR_INVALID;
        complete_to(e->stream, e->target);
        um__vdev_stream_wait(bs, e->stream, e->vt_mark);
        return UM_OK;
    }
    if (b->link_ns_per_byte <= 0.0 || eb->ops != &um__memfd_ops)
        return eb->ops->event_sync(eb, e);
    um__bstream *bs = um__memfd_stream(b, s, "stream_wait");
    if (!bs)
        return UM_ERR_INVALID;
    if (!event_check(eb, e, "stream_wait"))
        return UM_ERR_INVALID;
    complete_to(e->stream, e->target);
    busy_at_least(bs, e->busy_until);
    return UM_OK;
}

static um_status vmm_memset_async(um__backend *b, void *dst, int value, size_t n,
                                  um__bstream *s)
{
    UM_UNUSED(s);
    if (!dst)
        return um__fail(UM_ERR_INVALID, "%s: memset of %zu bytes: the pointer is NULL", b->name,
                        n);
    um_status st = check_mapped(mb(b), dst, n, "memset_async", "destination");
    if (st != UM_OK)
        return st;
    if (!um__vt_on()) /* no data in virtual time */
        memset(dst, value, n);
    return UM_OK;
}

static um_status vmm_stream_wrap(um__backend *b, void *native, um__bstream **out)
{
    UM_UNUSED(native);
    *out = NULL;
    return um__fail(UM_ERR_UNSUPPORTED,
                    "%s: a native stream can only be wrapped on a CUDA device (this one is %s)",
                    b->name, um_device_kind_name(b->kind));
}

static void *vmm_stream_native(um__backend *b, um__bstream *s)
{
    UM_UNUSED(b);
    UM_UNUSED(s);
    return NULL;
}

static um_status vmm_mem_info(um__backend *b, size_t *free_bytes, size_t *total)
{
    size_t used = atomic_load(&b->physical_bytes);
    *total = b->capacity;
    *free_bytes = used < b->capacity ? b->capacity - used : 0;
    return UM_OK;
}

/* Frees everything a (possibly half-built) backend holds. */
static void vmm_free_all(um__memfd_backend *m)
{
    for (size_t i = 0; i < m->nres; i++) {
        (void)munmap((void *)m->res[i].va, m->res[i].size);
        free(m->res[i].cover);
        free(m->res[i].chunk);
    }
    if (m->streams.next) {
        um__memfd_link *l = m->streams.next;
        while (l != &m->streams) {
            um__memfd_link *next = l->next;
            if (um__vt_on())
                um__vdev_forget((um__bstream *)l);
            free(l); /* the link is the first member of its stream */
            l = next;
        }
    }
    if (um__vt_on())
        um__vdev_forget(&m->default_stream);
    if (m->fd >= 0)
        close(m->fd);
    free(m->res);
    free(m->pages);
    free(m->stack);
    free(m->used);
    free(m->instack);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static void vmm_destroy(um__backend *b)
{
    if (!b)
        return;
    pthread_rwlock_wrlock(&registry_lock);
    um__memfd_backend **at = &registry;
    while (*at && *at != mb(b))
        at = &(*at)->registry_next;
    if (*at)
        *at = mb(b)->registry_next;
    pthread_rwlock_unlock(&registry_lock);
    vmm_free_all(mb(b));
}

const um__backend_ops um__memfd_ops = {
    .reserve = vmm_reserve,
    .unreserve = vmm_unreserve,
    .create = vmm_create,
    .release = vmm_release,
    .map = vmm_map,
    .unmap = vmm_unmap,
    .stream_create = vmm_stream_create,
    .stream_destroy = vmm_stream_destroy,
    .stream_sync = vmm_stream_sync,
    .event_record = vmm_event_record,
    .event_query = vmm_event_query,
    .event_sync = vmm_event_sync,
    .event_destroy = vmm_event_destroy,
    .event_record_timed = vmm_event_record_timed,
    .event_elapsed = vmm_event_elapsed,
    .event_time = vmm_event_time,
    .event_destroy_timed = vmm_event_destroy,
    .stream_wrap = vmm_stream_wrap,
    .stream_native = vmm_stream_native,
    .copy = vmm_copy,
    .copy_async = vmm_copy_async,
    .stream_wait = vmm_stream_wait,
    .memset_async = vmm_memset_async,
    .mem_info = vmm_mem_info,
    .destroy = vmm_destroy,
};

/* ---------------------------------------------------------- creation */

um_status um__memfd_backend_create(um_device_kind kind, const char *name, size_t capacity,
                                   size_t granularity, um__backend **out)
{
    if (!out)
        return um__fail(UM_ERR_INVALID, "backend create: the output backend is NULL");
    *out = NULL;
    if (!name || !*name || strlen(name) >= sizeof((um__backend *)0)->name)
        return um__fail(UM_ERR_INVALID,
                        "backend create: device name \"%s\" is empty or longer "
                        "than %zu characters",
                        name ? name : "(null)", sizeof((um__backend *)0)->name - 1);
    long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0)
        return um__fail(UM_ERR_BACKEND, "%s: sysconf(_SC_PAGESIZE) failed", name);
    if (!um__is_pow2(granularity) || granularity % (size_t)ps)
        return um__fail(UM_ERR_INVALID,
                        "%s: granularity %zu is not a power of two multiple of the OS page "
                        "size %ld",
                        name, granularity, ps);
    /* The size asked for is named, not its rounded value: "capacity of 0
     * bytes" for a 64 MiB device with 128 MiB pages hid the mistake. */
    if (capacity < granularity)
        return um__fail(UM_ERR_INVALID,
                        "%s: capacity of %zu bytes is less than one page of %zu bytes (the "
                        "granularity)",
                        name, capacity, granularity);
    capacity = um__align_down(capacity, granularity);
    if (capacity / granularity > UINT32_MAX - 1u || capacity > (size_t)INT64_MAX)
        return um__fail(UM_ERR_INVALID,
                        "%s: capacity of %zu bytes is %zu pages of %zu bytes, more than the "
                        "%u pages one device supports",
                        name, capacity, capacity / granularity, granularity, UINT32_MAX - 1u);

    um__memfd_backend *m = calloc(1, sizeof *m);
    if (!m)
        return um__fail(UM_ERR_NOMEM, "%s: no memory for the backend (%zu bytes)", name, sizeof *m);
    m->fd = -1;
    if (pthread_mutex_init(&m->lock, NULL) != 0) {
        free(m);
        return um__fail(UM_ERR_BACKEND, "%s: pthread_mutex_init failed", name);
    }
    m->streams.next = m->streams.prev = &m->streams;
    m->os_page = (size_t)ps;
    m->npages = (uint32_t)(capacity / granularity);
    size_t words = ((size_t)m->npages + 63u) / 64u;
    /* Large tables come from mmap inside malloc, so the pages never used
     * cost no memory. */
    m->pages = calloc(m->npages, sizeof *m->pages);
    m->stack = malloc((size_t)m->npages * sizeof *m->stack);
    m->used = calloc(words, sizeof *m->used);
    m->instack = calloc(words, sizeof *m->instack);
    if (!m->pages || !m->stack || !m->used || !m->instack) {
        vmm_free_all(m);
        return um__fail(UM_ERR_NOMEM, "%s: no memory for the page table of %zu pages", name,
                        capacity / granularity);
    }
    char fdname[80];
    snprintf(fdname, sizeof fdname, "unimem:%s", name);
    m->fd = memfd_create(fdname, MFD_CLOEXEC);
    if (m->fd < 0) {
        int e = errno;
        vmm_free_all(m);
        return um__fail(UM_ERR_BACKEND, "%s: memfd_create failed: %s", name, strerror(e));
    }
    /* The file is sparse: its size costs nothing until pages are touched. */
    if (ftruncate(m->fd, (off_t)capacity) != 0) {
        int e = errno;
        vmm_free_all(m);
        return um__fail(UM_ERR_BACKEND, "%s: ftruncate of the memfd to %zu bytes failed: %s", name,
                        capacity, strerror(e));
    }
    m->default_stream.owner = &m->base;
    m->default_stream.magic = UM_MEMFD_STREAM_MAGIC;
    m->default_stream.is_default = 1;
    atomic_init(&m->default_stream.refs, 1);
    atomic_init(&m->default_stream.submitted, 0);
    atomic_init(&m->default_stream.completed, 0);

    m->base.ops = &um__memfd_ops;
    m->base.cheap_timed_events = true; /* a clock read, no driver call */
    m->base.kind = kind;
    snprintf(m->base.name, sizeof m->base.name, "%s", name);
    m->base.capacity = capacity;
    m->base.granularity = granularity;
    atomic_init(&m->base.calls, 0);
    atomic_init(&m->base.physical_bytes, 0);
    um__backend_no_driver_info(&m->base);
    pthread_rwlock_wrlock(&registry_lock);
    m->registry_next = registry;
    registry = m;
    pthread_rwlock_unlock(&registry_lock);
    *out = &m->base;
    return UM_OK;
}
