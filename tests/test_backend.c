/* Tests of the host and sim backends (src/backend): the VMM operations
 * against the semantics CUDA's driver VMM has, page recycling between
 * addresses, capacity, argument checking, sim streams and events, the call
 * counter, a random sequence checked against a reference model, and
 * concurrent use. */
#include "backend/vmm_memfd.h"
#include "harness.h"

#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define G ((size_t)64 * 1024) /* the granularity of most tests */

static const char *kind_str(int sim)
{
    return sim ? "sim" : "host";
}

static um__backend *make(int sim, size_t capacity, size_t granularity)
{
    um__backend *b = NULL;
    if (sim)
        CHECK_OK(um__sim_backend_create("sim1", capacity, granularity, 0, &b));
    else
        CHECK_OK(um__host_backend_create(capacity, granularity, &b));
    return b;
}

static um__memfd_backend *mfd(um__backend *b)
{
    return (um__memfd_backend *)b;
}

static uint64_t pattern(uint64_t tag, size_t word)
{
    return tag * 0x9e3779b97f4a7c15ull ^ word;
}

/* Writes the pattern of `tag` over n bytes; word i of the range holds
 * pattern(tag, first + i). */
static void fill(void *p, size_t n, uint64_t tag, size_t first)
{
    uint64_t *w = p;
    for (size_t i = 0; i < n / 8; i++)
        w[i] = pattern(tag, first + i);
}

/* Number of words of [p, p + n) that differ from the pattern. */
static size_t mismatches(const void *p, size_t n, uint64_t tag, size_t first)
{
    const uint64_t *w = p;
    size_t bad = 0;
    for (size_t i = 0; i < n / 8; i++)
        bad += w[i] != pattern(tag, first + i);
    return bad;
}

static size_t nonzero(const void *p, size_t n)
{
    const uint64_t *w = p;
    size_t bad = 0;
    for (size_t i = 0; i < n / 8; i++)
        bad += w[i] != 0;
    return bad;
}

static uint64_t memfd_blocks(um__backend *b)
{
    struct stat st;
    CHECK_EQ(fstat(mfd(b)->fd, &st), 0);
    return (uint64_t)st.st_blocks;
}

/* reserve/create/map, a pattern written at one address and read back after
 * the chunk moved to another: the page recycling the pool relies on. */
static void test_move(int sim, size_t g)
{
    um__backend *b = make(sim, 16 * g, g);
    if (!b)
        return;
    CHECK_EQ(b->kind, sim ? UM_DEVICE_SIM : UM_DEVICE_HOST);
    CHECK(strcmp(b->name, sim ? "sim1" : "host") == 0);
    CHECK_EQ(b->capacity, 16 * g);
    CHECK_EQ(b->granularity, g);
    CHECK_EQ(b->physical_bytes, 0);

    uintptr_t va = 0;
    um__phys h = 0;
    CHECK_OK(um__be_reserve(b, 8 * g, &va));
    CHECK(va != 0);
    CHECK_EQ(va % g, 0);
    CHECK_OK(um__be_create(b, g, &h));
    CHECK(h != 0);
    CHECK_EQ(b->physical_bytes, g);
    CHECK_OK(um__be_map(b, va, g, h));
    fill((void *)va, g, 7, 0);
    CHECK_OK(um__be_unmap(b, va, g));
    CHECK_OK(um__be_map(b, va + 3 * g, g, h));
    CHECK_EQ(mismatches((void *)(va + 3 * g), g, 7, 0), 0);
    /* The same chunk may be mapped twice, like a CUDA handle: both views
     * show the same memory. */
    CHECK_OK(um__be_map(b, va + 5 * g, g, h));
    ((volatile uint64_t *)(va + 5 * g))[1] = 42;
    CHECK_EQ(((volatile uint64_t *)(va + 3 * g))[1], 42);
    CHECK_OK(um__be_unmap(b, va + 5 * g, g));
    CHECK_OK(um__be_unmap(b, va + 3 * g, g));
    CHECK_OK(um__be_release(b, h, g));
    CHECK_EQ(b->physical_bytes, 0);
    CHECK_EQ(mfd(b)->used_pages, 0);
    CHECK_OK(um__be_unreserve(b, va, 8 * g));
    CHECK_EQ(mfd(b)->nres, 0);
    um__backend_destroy(b);
}

/* Two chunks side by side, one unmap for both, then mapped swapped. */
static void test_adjacent(int sim)
{
    um__backend *b = make(sim, 16 * G, G);
    if (!b)
        return;
    uintptr_t va = 0;
    um__phys h1 = 0, h2 = 0;
    CHECK_OK(um__be_reserve(b, 4 * G, &va));
    CHECK_OK(um__be_create(b, G, &h1));
    CHECK_OK(um__be_create(b, G, &h2));
    CHECK(h1 != h2);
    CHECK_OK(um__be_map(b, va, G, h1));
    CHECK_OK(um__be_map(b, va + G, G, h2));
    fill((void *)va, 2 * G, 11, 0); /* one write across the boundary */
    CHECK_OK(um__be_unmap(b, va, 2 * G));
    CHECK_EQ(mfd(b)->nmaps, 0);
    CHECK_OK(um__be_map(b, va + 2 * G, G, h2));
    CHECK_OK(um__be_map(b, va + 3 * G, G, h1));
    CHECK_EQ(mismatches((void *)(va + 2 * G), G, 11, G / 8), 0);
    CHECK_EQ(mismatches((void *)(va + 3 * G), G, 11, 0), 0);

    /* copy reads and writes across the two mappings. */
    static uint64_t host[2 * G / 8];
    CHECK_OK(um__be_copy(b, host, (void *)(va + 2 * G), 2 * G, 1));
    CHECK_EQ(mismatches(host, G, 11, G / 8), 0);
    CHECK_EQ(mismatches((char *)host + G, G, 11, 0), 0);
    fill(host, 2 * G, 12, 0);
    CHECK_OK(um__be_copy(b, (void *)(va + 2 * G), host, 2 * G, 0));
    CHECK_EQ(mismatches((void *)(va + 2 * G), 2 * G, 12, 0), 0);

    CHECK_OK(um__be_unmap(b, va + 2 * G, 2 * G));
    CHECK_OK(um__be_release(b, h1, G));
    CHECK_OK(um__be_release(b, h2, G));
    CHECK_OK(um__be_unreserve(b, va, 4 * G));
    CHECK_EQ(b->physical_bytes, 0);
    um__backend_destroy(b);
}

/* A chunk of three pages moves as one. */
static void test_multipage(int sim)
{
    um__backend *b = make(sim, 16 * G, G);
    if (!b)
        return;
    uintptr_t va = 0;
    um__phys h = 0;
    CHECK_OK(um__be_reserve(b, 8 * G, &va));
    CHECK_OK(um__be_create(b, 3 * G, &h));
    CHECK_EQ(b->physical_bytes, 3 * G);
    CHECK_OK(um__be_map(b, va + G, 3 * G, h));
    fill((void *)(va + G), 3 * G, 5, 0);
    /* Unmapping part of a mapping is refused, as by cuMemUnmap. */
    CHECK_STATUS(um__be_unmap(b, va + G, G), UM_ERR_INVALID);
    CHECK_STATUS(um__be_unmap(b, va + 2 * G, 2 * G), UM_ERR_INVALID);
    CHECK_STATUS(um__be_unmap(b, va, 4 * G), UM_ERR_INVALID);
    CHECK_EQ(mismatches((void *)(va + G), 3 * G, 5, 0), 0);
    CHECK_OK(um__be_unmap(b, va + G, 3 * G));
    CHECK_OK(um__be_map(b, va + 5 * G, 3 * G, h));
    CHECK_EQ(mismatches((void *)(va + 5 * G), 3 * G, 5, 0), 0);
    CHECK_OK(um__be_unmap(b, va + 5 * G, 3 * G));
    CHECK_OK(um__be_release(b, h, 3 * G));
    CHECK_EQ(b->physical_bytes, 0);
    CHECK_OK(um__be_unreserve(b, va, 8 * G));
    um__backend_destroy(b);
}

/* Exhaustion is UM_ERR_NOMEM; released memory can be created again; a
 * multi-page chunk needs contiguous pages. */
static void test_capacity(int sim)
{
    um__backend *b = make(sim, 8 * G + G / 2, G); /* rounds down to 8 pages */
    if (!b)
        return;
    CHECK_EQ(b->capacity, 8 * G);
    um__phys h[8], extra = 0;
    for (int i = 0; i < 8; i++)
        CHECK_OK(um__be_create(b, G, &h[i]));
    CHECK_EQ(b->physical_bytes, 8 * G);
    um__clear_error();
    CHECK_STATUS(um__be_create(b, G, &extra), UM_ERR_NOMEM);
    CHECK(strstr(um_last_error(), "capacity") != NULL);
    CHECK(strstr(um_last_error(), "65536") != NULL);  /* requested */
    CHECK(strstr(um_last_error(), "524288") != NULL); /* used and capacity */
    CHECK_STATUS(um__be_create(b, 2 * G, &extra), UM_ERR_NOMEM);
    CHECK_EQ(b->physical_bytes, 8 * G);

    /* Free every other page: four free pages, no two adjacent. */
    int freed = 0;
    for (int i = 0; i < 8; i++)
        if (um__memfd_handle_page(h[i]) % 2 == 0) {
            CHECK_OK(um__be_release(b, h[i], G));
            h[i] = 0;
            freed++;
        }
    CHECK_EQ(freed, 4);
    CHECK_EQ(b->physical_bytes, 4 * G);
    CHECK_STATUS(um__be_create(b, 2 * G, &extra), UM_ERR_NOMEM);
    CHECK(strstr(um_last_error(), "contiguous") != NULL);
    for (int i = 0; i < 8; i++)
        if (!h[i])
            CHECK_OK(um__be_create(b, G, &h[i]));
    CHECK_EQ(b->physical_bytes, 8 * G);
    for (int i = 0; i < 8; i++)
        CHECK_OK(um__be_release(b, h[i], G));
    CHECK_OK(um__be_create(b, 8 * G, &extra));
    CHECK_STATUS(um__be_create(b, G, &h[0]), UM_ERR_NOMEM);
    CHECK_OK(um__be_release(b, extra, 8 * G));
    CHECK_OK(um__be_create(b, 9 * G - G, &extra));
    CHECK_OK(um__be_release(b, extra, 8 * G));
    CHECK_STATUS(um__be_create(b, 9 * G, &extra), UM_ERR_NOMEM);
    CHECK_EQ(b->physical_bytes, 0);
    CHECK_EQ(mfd(b)->used_pages, 0);
    um__backend_destroy(b);
}

/* Released memory goes back to the host and reads as zero when created
 * again; the old handle stays invalid even though the page is reused. */
static void test_zero(int sim)
{
    um__backend *b = make(sim, 4 * G, G);
    if (!b)
        return;
    uintptr_t va = 0;
    um__phys h = 0, h2 = 0;
    CHECK_OK(um__be_reserve(b, 2 * G, &va));
    CHECK_OK(um__be_create(b, G, &h));
    CHECK_OK(um__be_map(b, va, G, h));
    CHECK_EQ(nonzero((void *)va, G), 0);
    memset((void *)va, 0xab, G);
    CHECK(memfd_blocks(b) * 512 >= G);
    CHECK_OK(um__be_unmap(b, va, G));
    CHECK_OK(um__be_release(b, h, G));
    CHECK_EQ(memfd_blocks(b), 0); /* the hole punch returned the RAM */
    CHECK_OK(um__be_create(b, G, &h2));
    CHECK_EQ(um__memfd_handle_page(h2), um__memfd_handle_page(h));
    CHECK(h2 != h);
    CHECK_STATUS(um__be_map(b, va, G, h), UM_ERR_INVALID);
    CHECK_STATUS(um__be_release(b, h, G), UM_ERR_INVALID);
    CHECK_OK(um__be_map(b, va + G, G, h2));
    CHECK_EQ(nonzero((void *)(va + G), G), 0);
    CHECK_OK(um__be_unmap(b, va + G, G));
    CHECK_OK(um__be_release(b, h2, G));
    CHECK_OK(um__be_unreserve(b, va, 2 * G));
    um__backend_destroy(b);
}

/* Releasing a mapped chunk behaves like cuMemRelease: the handle dies at
 * once, the memory lives until its last unmap. */
static void test_release_mapped(int sim)
{
    um__backend *b = make(sim, 4 * G, G);
    if (!b)
        return;
    uintptr_t va = 0;
    um__phys h = 0, h2 = 0;
    CHECK_OK(um__be_reserve(b, 4 * G, &va));
    CHECK_OK(um__be_create(b, 2 * G, &h));
    CHECK_OK(um__be_map(b, va, 2 * G, h));
    CHECK_OK(um__be_map(b, va + 2 * G, 2 * G, h));
    fill((void *)va, 2 * G, 3, 0);
    CHECK_OK(um__be_release(b, h, 2 * G));
    CHECK_STATUS(um__be_release(b, h, 2 * G), UM_ERR_INVALID);
    CHECK_EQ(b->physical_bytes, 2 * G);
    CHECK_OK(um__be_unmap(b, va, 2 * G));
    CHECK_STATUS(um__be_map(b, va, 2 * G, h), UM_ERR_INVALID);
    CHECK_EQ(mismatches((void *)(va + 2 * G), 2 * G, 3, 0), 0);
    CHECK_EQ(b->physical_bytes, 2 * G);
    /* Its pages are still taken: only two of the four are free. */
    CHECK_STATUS(um__be_create(b, 3 * G, &h2), UM_ERR_NOMEM);
    CHECK_OK(um__be_unmap(b, va + 2 * G, 2 * G));
    CHECK_EQ(b->physical_bytes, 0);
    CHECK_EQ(memfd_blocks(b), 0);
    CHECK_OK(um__be_create(b, 4 * G, &h2));
    CHECK_OK(um__be_map(b, va, 4 * G, h2));
    CHECK_EQ(nonzero((void *)va, 4 * G), 0);
    CHECK_OK(um__be_unmap(b, va, 4 * G));
    CHECK_OK(um__be_release(b, h2, 4 * G));
    CHECK_OK(um__be_unreserve(b, va, 4 * G));
    um__backend_destroy(b);
}

/* A full reserve/create/map/write/read/unmap/release/unreserve cycle. */
static void check_usable(um__backend *b)
{
    uintptr_t va = 0;
    um__phys h = 0;
    size_t before = b->physical_bytes;
    CHECK_OK(um__be_reserve(b, 2 * G, &va));
    CHECK_OK(um__be_create(b, G, &h));
    CHECK_OK(um__be_map(b, va + G, G, h));
    fill((void *)(va + G), G, 99, 0);
    CHECK_EQ(mismatches((void *)(va + G), G, 99, 0), 0);
    CHECK_OK(um__be_unmap(b, va + G, G));
    CHECK_OK(um__be_release(b, h, G));
    CHECK_OK(um__be_unreserve(b, va, 2 * G));
    CHECK_EQ(b->physical_bytes, before);
}

/* A reservation of 2^32 - 1 granules or more is refused by name (out of
 * memory, as the driver answers a range too large): the page
 * tables index granules with 32 bits, and such a range (16 TiB of 4 KiB
 * granules) fits the address space, so nothing else would stop it. */
static void test_reserve_granule_limit(int sim)
{
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    um__backend *b = make(sim, 16 * ps, ps);
    if (!b)
        return;
    uintptr_t va = 0;
    CHECK_STATUS(um__be_reserve(b, (size_t)UINT32_MAX * ps, &va), UM_ERR_NOMEM);
    CHECK_ERROR_MENTIONS("granules", "reserve", NULL);
    CHECK_OK(um__be_reserve(b, 16 * ps, &va));
    CHECK_OK(um__be_unreserve(b, va, 16 * ps));
    um__backend_destroy(b);
}

static void test_bad_input(int sim)
{
    um__backend *b = make(sim, 16 * G, G);
    if (!b)
        return;
    uintptr_t va = 0, va2 = 0;
    um__phys h = 0, h2 = 0, gone = 0;
    CHECK_OK(um__be_reserve(b, 8 * G, &va));
    CHECK_OK(um__be_reserve(b, 2 * G, &va2));
    CHECK_OK(um__be_create(b, G, &h));
    CHECK_OK(um__be_create(b, 2 * G, &h2));
    CHECK_OK(um__be_create(b, G, &gone));
    CHECK_OK(um__be_release(b, gone, G));
    CHECK_OK(um__be_map(b, va, G, h));
    size_t phys = b->physical_bytes;
    /* An address range nobody holds: reserved, then given back. */
    uintptr_t outside = 0;
    CHECK_OK(um__be_reserve(b, 4 * G, &outside));
    CHECK_OK(um__be_unreserve(b, outside, 4 * G));

    /* reserve / unreserve */
    uintptr_t dummy = 0;
    CHECK_STATUS(um__be_reserve(b, 0, &dummy), UM_ERR_INVALID);
    CHECK_STATUS(um__be_reserve(b, G + 4096, &dummy), UM_ERR_INVALID);
    CHECK_STATUS(um__be_reserve(b, G, NULL), UM_ERR_INVALID);
    CHECK_STATUS(um__be_reserve(b, SIZE_MAX - G + 1, &dummy), UM_ERR_NOMEM);
    CHECK_STATUS(um__be_unreserve(b, va + G, 7 * G), UM_ERR_INVALID);
    CHECK_STATUS(um__be_unreserve(b, va, 4 * G), UM_ERR_INVALID);
    CHECK_STATUS(um__be_unreserve(b, outside, G), UM_ERR_INVALID);
    CHECK_STATUS(um__be_unreserve(b, va, 8 * G), UM_ERR_BUSY); /* h is mapped there */

    /* create / release */
    um__phys x = 0;
    CHECK_STATUS(um__be_create(b, 0, &x), UM_ERR_INVALID);
    CHECK_STATUS(um__be_create(b, G / 2, &x), UM_ERR_INVALID);
    CHECK_STATUS(um__be_create(b, G + 4096, &x), UM_ERR_INVALID);
    CHECK_STATUS(um__be_create(b, G, NULL), UM_ERR_INVALID);
    CHECK_STATUS(um__be_create(b, SIZE_MAX - G + 1, &x), UM_ERR_NOMEM);
    CHECK_STATUS(um__be_release(b, h2, G), UM_ERR_INVALID);   /* size mismatch */
    CHECK_STATUS(um__be_release(b, gone, G), UM_ERR_INVALID); /* double release */
    CHECK_STATUS(um__be_release(b, 0, G), UM_ERR_INVALID);
    CHECK_STATUS(um__be_release(b, ((um__phys)77 << 32) | 1000000u, G), UM_ERR_INVALID);
    CHECK_STATUS(um__be_release(b, h + ((um__phys)1 << 32), G), UM_ERR_INVALID); /* stale gen */

    /* map */
    CHECK_STATUS(um__be_map(b, va + G + 4096, G, h), UM_ERR_INVALID);
    CHECK_STATUS(um__be_map(b, va + 2 * G, G + 4096, h2), UM_ERR_INVALID);
    CHECK_STATUS(um__be_map(b, va + 2 * G, 0, h2), UM_ERR_INVALID);
    CHECK_STATUS(um__be_map(b, va + 2 * G, G, h2), UM_ERR_INVALID);     /* size mismatch */
    CHECK_STATUS(um__be_map(b, va + 2 * G, 4 * G, h2), UM_ERR_INVALID); /* size mismatch */
    CHECK_STATUS(um__be_map(b, va + 7 * G, 2 * G, h2), UM_ERR_INVALID); /* past the end */
    /* Past the end of va2: into va when the kernel placed the two ranges
     * side by side (it usually does), else into nothing. */
    CHECK_STATUS(um__be_map(b, va2 + G, 2 * G, h2), UM_ERR_INVALID);
    CHECK_STATUS(um__be_map(b, outside, 2 * G, h2), UM_ERR_INVALID);
    CHECK_STATUS(um__be_map(b, va + 2 * G, G, gone), UM_ERR_INVALID); /* released handle */
    CHECK_STATUS(um__be_map(b, va + 2 * G, G, 0), UM_ERR_INVALID);
    CHECK_STATUS(um__be_map(b, va + 2 * G, G, ~(um__phys)0), UM_ERR_INVALID);
    CHECK_STATUS(um__be_map(b, va, 2 * G, h2), UM_ERR_INVALID); /* over h */
    CHECK_STATUS(um__be_map(b, va, G, h), UM_ERR_INVALID);      /* twice */
    CHECK_OK(um__be_map(b, va + 3 * G, 2 * G, h2));
    CHECK_STATUS(um__be_map(b, va + 4 * G, G, h), UM_ERR_INVALID);      /* inside h2 */
    CHECK_STATUS(um__be_map(b, va + 2 * G, 2 * G, h2), UM_ERR_INVALID); /* overlaps h2 */

    /* unmap */
    CHECK_STATUS(um__be_unmap(b, va + 5 * G, G), UM_ERR_INVALID); /* not mapped */
    CHECK_STATUS(um__be_unmap(b, va, 3 * G), UM_ERR_INVALID);     /* hole at va+G */
    CHECK_STATUS(um__be_unmap(b, va + 4096, G), UM_ERR_INVALID);
    CHECK_STATUS(um__be_unmap(b, va, 0), UM_ERR_INVALID);
    CHECK_STATUS(um__be_unmap(b, outside, G), UM_ERR_INVALID);
    CHECK_STATUS(um__be_unmap(b, va + 7 * G, 2 * G), UM_ERR_INVALID);

    /* copy */
    char buf[64] = {0};
    CHECK_STATUS(um__be_copy(b, NULL, buf, 8, 1), UM_ERR_INVALID);
    CHECK_STATUS(um__be_copy(b, (void *)va, NULL, 8, 0), UM_ERR_INVALID);
    CHECK_STATUS(um__be_copy(b, (void *)va, buf, 8, 2), UM_ERR_INVALID);
    CHECK_STATUS(um__be_copy(b, (void *)(va + G), buf, 8, 0), UM_ERR_INVALID); /* unmapped */
    CHECK_STATUS(um__be_copy(b, buf, (void *)(va + G - 8), 16, 1), UM_ERR_INVALID);
    CHECK_STATUS(um__be_copy(b, buf, buf + 8, 8, 1), UM_ERR_INVALID); /* not device memory */
    CHECK_OK(um__be_copy(b, buf, (void *)va, 0, 1));
    memcpy(buf, "unimem", 7);
    CHECK_OK(um__be_copy(b, (void *)(va + G - 8), buf, 7, 0));
    CHECK(memcmp((void *)(va + G - 8), "unimem", 7) == 0);

    /* streams and events */
    int done = 0;
    um__bevent *e = NULL;
    CHECK_STATUS(um__be_stream_destroy(b, NULL), UM_ERR_INVALID);
    CHECK_STATUS(um__be_stream_create(b, NULL), UM_ERR_INVALID);
    CHECK_STATUS(um__be_event_record(b, NULL, NULL), UM_ERR_INVALID);
    CHECK_STATUS(um__be_event_query(b, NULL, &done), UM_ERR_INVALID);
    CHECK_STATUS(um__be_event_sync(b, NULL), UM_ERR_INVALID);
    CHECK_OK(um__be_event_record(b, NULL, &e));
    CHECK_STATUS(um__be_event_query(b, e, NULL), UM_ERR_INVALID);
    um__be_event_destroy(b, e);

    /* Nothing above changed the backend. */
    CHECK_EQ(b->physical_bytes, phys);
    CHECK_EQ(mfd(b)->nres, 2);
    CHECK_EQ(mfd(b)->nmaps, 2);
    check_usable(b);
    CHECK_OK(um__be_unmap(b, va + 3 * G, 2 * G));
    CHECK_OK(um__be_unmap(b, va, G));
    CHECK_OK(um__be_release(b, h, G));
    CHECK_OK(um__be_release(b, h2, 2 * G));
    CHECK_OK(um__be_unreserve(b, va, 8 * G));
    CHECK_OK(um__be_unreserve(b, va2, 2 * G));
    CHECK_EQ(b->physical_bytes, 0);
    um__backend_destroy(b);
}

/* The queued copy and memset refuse a range of device memory that is
 * reserved but not mapped, as the synchronous copy does, whichever end of
 * the copy it is and whichever device it belongs to: they used to touch
 * it and crash the process (SIGSEGV on the PROT_NONE reservation). */
static void test_async_unmapped(int sim)
{
    um__backend *b = make(sim, 16 * G, G), *peer = NULL;
    CHECK_OK(um__sim_backend_create("peer", 16 * G, G, 0, &peer));
    if (!b || !peer) {
        um__backend_destroy(b);
        um__backend_destroy(peer);
        return;
    }
    uintptr_t va = 0, pva = 0;
    um__phys h = 0;
    CHECK_OK(um__be_reserve(b, 4 * G, &va));
    CHECK_OK(um__be_create(b, G, &h));
    CHECK_OK(um__be_map(b, va, G, h)); /* va mapped, va + G on reserved only */
    CHECK_OK(um__be_reserve(peer, 2 * G, &pva)); /* nothing mapped */
    char buf[64];
    memcpy(buf, "unimem", 7);
    void *mapped = (void *)va, *unmapped = (void *)(va + G), *tail = (void *)(va + G - 8);

    CHECK_STATUS(um__be_copy_async(b, unmapped, buf, 8, NULL), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("copy_async", "destination", "not mapped");
    CHECK_STATUS(um__be_copy_async(b, buf, unmapped, 8, NULL), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("copy_async", "source", "not mapped");
    CHECK_STATUS(um__be_copy_async(b, buf, tail, 16, NULL), UM_ERR_INVALID); /* runs off */
    CHECK_STATUS(um__be_copy_async(b, mapped, (void *)pva, 8, NULL), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("source", "not mapped", "device peer");
    CHECK_STATUS(um__be_memset_async(b, unmapped, 0, 8, NULL), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("memset_async", "destination", "not mapped");
    CHECK_STATUS(um__be_memset_async(b, tail, 0, 16, NULL), UM_ERR_INVALID);
    /* The synchronous copy checks its host side too: a "host" pointer into
     * a reservation (this device's or a peer's) that is not mapped there
     * used to be touched by the memmove and crash the process. */
    CHECK_STATUS(um__be_copy(b, mapped, unmapped, 8, 0), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("copy", "source", "not mapped");
    CHECK_STATUS(um__be_copy(b, (void *)pva, mapped, 8, 1), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("destination", "not mapped", "device peer");

    /* A range that starts in the program's memory and runs into a
     * reservation with nothing mapped: only its start was checked, and the
     * memset crashed (SIGSEGV). The page before the peer's reservation is
     * made the program's where it is free. */
    char *before = mmap((void *)(pva - 4096), 4096, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (before == (char *)(pva - 4096)) {
        CHECK_STATUS(um__be_memset_async(b, before + 4088, 0, 16, NULL), UM_ERR_INVALID);
        CHECK_ERROR_MENTIONS("memset_async", "not mapped", "device peer");
        CHECK_STATUS(um__be_copy_async(b, before + 4088, buf, 16, NULL), UM_ERR_INVALID);
        CHECK_ERROR_MENTIONS("copy_async", "destination", "device peer");
        CHECK_OK(um__be_memset_async(b, before, 0x11, 4096, NULL)); /* the program's */
        CHECK_EQ((unsigned char)before[4095], 0x11);
        munmap(before, 4096);
    } else {
        printf("test_async_unmapped: the page before the reservation is taken; a range "
               "running into it was not tried\n");
        if (before != MAP_FAILED)
            munmap(before, 4096);
    }
    /* Mapped memory and the program's memory still copy. */
    CHECK_OK(um__be_copy_async(b, tail, buf, 7, NULL));
    CHECK(memcmp(tail, "unimem", 7) == 0);
    CHECK_OK(um__be_memset_async(b, mapped, 0x5a, 8, NULL));
    CHECK_EQ(((unsigned char *)mapped)[7], 0x5a);
    CHECK_OK(um__be_copy_async(b, buf + 8, buf, 8, NULL));
    CHECK_OK(um__be_copy_async(b, unmapped, buf, 0, NULL)); /* nothing touched */
    CHECK_OK(um__be_stream_sync(b, NULL));

    CHECK_OK(um__be_unmap(b, va, G));
    CHECK_OK(um__be_release(b, h, G));
    CHECK_OK(um__be_unreserve(b, va, 4 * G));
    CHECK_OK(um__be_unreserve(peer, pva, 2 * G));
    um__backend_destroy(b);
    um__backend_destroy(peer);
}

/* Constructor arguments. */
static void test_bad_config(void)
{
    um__backend *b = NULL;
    long ps = sysconf(_SC_PAGESIZE);
    CHECK_STATUS(um__sim_backend_create("s", 16 * G, 0, 0, &b), UM_ERR_INVALID);
    CHECK_STATUS(um__sim_backend_create("s", 16 * G, 3000, 0, &b), UM_ERR_INVALID);
    CHECK_STATUS(um__sim_backend_create("s", 16 * G, 3 * (size_t)ps, 0, &b), UM_ERR_INVALID);
    CHECK_STATUS(um__sim_backend_create("s", 16 * G, (size_t)ps / 2, 0, &b), UM_ERR_INVALID);
    CHECK_STATUS(um__host_backend_create(16 * G, 12345, &b), UM_ERR_INVALID);
    CHECK_STATUS(um__sim_backend_create("s", G - 1, G, 0, &b), UM_ERR_INVALID);
    CHECK_STATUS(um__sim_backend_create("s", 0, G, 0, &b), UM_ERR_INVALID);
    CHECK_STATUS(um__host_backend_create(G / 2, G, &b), UM_ERR_INVALID);
    /* The message names the capacity asked for, not 0 (its rounded value). */
    char asked[96];
    snprintf(asked, sizeof asked, "capacity of %zu bytes is less than one page of %zu bytes",
             (size_t)(G / 2), (size_t)G);
    CHECK_ERROR_MENTIONS(asked, NULL, NULL);
    CHECK_STATUS(um__sim_backend_create(NULL, 16 * G, G, 0, &b), UM_ERR_INVALID);
    CHECK_STATUS(um__sim_backend_create("", 16 * G, G, 0, &b), UM_ERR_INVALID);
    CHECK_STATUS(um__sim_backend_create("a-name-that-is-much-longer-than-the-sixty-three-"
                                        "characters-a-device-name-may-have",
                                        16 * G, G, 0, &b),
                 UM_ERR_INVALID);
    CHECK_STATUS(um__sim_backend_create("s", 16 * G, G, 0, NULL), UM_ERR_INVALID);
    CHECK_STATUS(um__sim_backend_create("s", (size_t)1 << 50, 4096, 0, &b), UM_ERR_INVALID);
    CHECK(b == NULL);
    CHECK(strstr(um_last_error(), "pages") != NULL);

    /* The smallest legal device: one OS page. */
    CHECK_OK(um__sim_backend_create("tiny", (size_t)ps, (size_t)ps, 0, &b));
    if (b) {
        CHECK_EQ(b->capacity, (size_t)ps);
        um__backend_destroy(b);
    }
    /* Host capacity 0 means physical RAM, rounded down to the granularity. */
    b = NULL;
    size_t ram = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)ps;
    CHECK_OK(um__host_backend_create(0, (size_t)2 << 20, &b));
    if (b) {
        CHECK_EQ(b->capacity, ram / ((size_t)2 << 20) * ((size_t)2 << 20));
        CHECK_EQ(b->kind, UM_DEVICE_HOST);
        um__backend_destroy(b);
    }
}

static int query(um__backend *b, um__bevent *e)
{
    int done = -1;
    CHECK_OK(um__be_event_query(b, e, &done));
    return done;
}

static void test_sim_streams(void)
{
    um__backend *b = make(1, 4 * G, G);
    um__backend *other = make(1, 4 * G, G);
    if (!b || !other)
        goto out;
    um__bstream *s = NULL, *t = NULL, *u = NULL;
    um__bevent *e = NULL, *e2 = NULL, *e3 = NULL, *et = NULL;
    CHECK_OK(um__be_stream_create(b, &s));
    CHECK_OK(um__be_stream_create(b, &t));

    /* The sequence of the brief: 3 queued, 2 done, then 3 done. */
    CHECK_OK(um__sim_stream_launch(b, s, 3));
    CHECK_OK(um__be_event_record(b, s, &e));
    CHECK_OK(um__be_event_record(b, t, &et));
    CHECK_EQ(query(b, e), 0);
    CHECK_EQ(query(b, et), 1); /* t has no work: streams are independent */
    CHECK_OK(um__sim_stream_complete(b, s, 2));
    CHECK_EQ(query(b, e), 0);
    CHECK_OK(um__sim_stream_complete(b, s, 1));
    CHECK_EQ(query(b, e), 1);

    /* Completing more than was queued stops at the queue's end. */
    CHECK_OK(um__sim_stream_launch(b, s, 1));
    CHECK_OK(um__sim_stream_complete(b, s, 5));
    CHECK_EQ(s->completed, 4);
    CHECK_OK(um__sim_stream_launch(b, s, 2));
    CHECK_OK(um__be_event_record(b, s, &e2));
    CHECK_OK(um__sim_stream_launch(b, s, 3)); /* after the event: not waited for */
    CHECK_EQ(query(b, e2), 0);
    CHECK_OK(um__be_event_sync(b, e2));
    CHECK_EQ(query(b, e2), 1);
    CHECK_EQ(s->completed, 6);
    CHECK_EQ(s->submitted, 9);

    /* stream_sync completes everything queued. */
    CHECK_OK(um__be_event_record(b, s, &e3));
    CHECK_EQ(query(b, e3), 0);
    CHECK_OK(um__be_stream_sync(b, s));
    CHECK_EQ(query(b, e3), 1);
    CHECK_EQ(s->completed, 9);

    /* The default stream (NULL). */
    um__be_event_destroy(b, e);
    CHECK_OK(um__sim_stream_launch(b, NULL, 2));
    CHECK_OK(um__be_event_record(b, NULL, &e));
    CHECK_EQ(query(b, e), 0);
    CHECK_OK(um__be_stream_sync(b, NULL));
    CHECK_EQ(query(b, e), 1);
    CHECK_EQ(mfd(b)->default_stream.completed, 2);

    /* Destroying a stream waits for its work; its events outlive it. */
    CHECK_OK(um__be_stream_create(b, &u));
    CHECK_OK(um__sim_stream_launch(b, u, 5));
    um__be_event_destroy(b, e2);
    CHECK_OK(um__be_event_record(b, u, &e2));
    CHECK_EQ(query(b, e2), 0);
    CHECK_OK(um__be_stream_destroy(b, u));
    CHECK_EQ(query(b, e2), 1);
    CHECK_STATUS(um__sim_stream_launch(b, u, 1), UM_ERR_INVALID); /* dead (kept by e2) */
    um__be_event_destroy(b, e2);                                  /* frees u */

    /* Objects of another device, or of no device, are refused. */
    CHECK_STATUS(um__sim_stream_launch(other, s, 1), UM_ERR_INVALID);
    CHECK_STATUS(um__be_stream_sync(other, s), UM_ERR_INVALID);
    CHECK_STATUS(um__be_event_record(other, t, &e2), UM_ERR_INVALID);
    CHECK_STATUS(um__be_event_query(other, e, &(int){0}), UM_ERR_INVALID);
    CHECK_STATUS(um__be_event_sync(other, e), UM_ERR_INVALID);
    CHECK_STATUS(um__be_stream_destroy(other, s), UM_ERR_INVALID);
    CHECK_STATUS(um__sim_stream_launch(NULL, NULL, 1), UM_ERR_INVALID);
    CHECK_STATUS(um__sim_stream_launch(b, &mfd(b)->default_stream, 0), UM_OK);
    CHECK_STATUS(um__be_stream_destroy(b, &mfd(b)->default_stream), UM_ERR_INVALID);

    um__be_event_destroy(b, e);
    um__be_event_destroy(b, e3);
    um__be_event_destroy(b, et);
    CHECK_OK(um__be_stream_destroy(b, s));
    /* t is left to the backend's destroy, which must free it. */
    UM_UNUSED(t);
out:
    um__backend_destroy(b);
    um__backend_destroy(other);
}

static void test_host_streams(void)
{
    um__backend *b = make(0, 4 * G, G);
    if (!b)
        return;
    um__bstream *s = NULL;
    um__bevent *e = NULL;
    CHECK_OK(um__be_stream_create(b, &s));
    CHECK_STATUS(um__sim_stream_launch(b, s, 1), UM_ERR_UNSUPPORTED);
    CHECK_STATUS(um__sim_stream_complete(b, s, 1), UM_ERR_UNSUPPORTED);
    CHECK_STATUS(um__sim_stream_launch(b, NULL, 1), UM_ERR_UNSUPPORTED);
    CHECK(strstr(um_last_error(), "host") != NULL);
    CHECK_OK(um__be_event_record(b, s, &e));
    CHECK_EQ(query(b, e), 1);
    CHECK_OK(um__be_event_sync(b, e));
    um__be_event_destroy(b, e);
    CHECK_OK(um__be_event_record(b, NULL, &e));
    CHECK_EQ(query(b, e), 1);
    um__be_event_destroy(b, e);
    CHECK_OK(um__be_stream_sync(b, s));
    CHECK_OK(um__be_stream_sync(b, NULL));
    CHECK_OK(um__be_stream_destroy(b, s));
    um__backend_destroy(b);
}

/* Every um__be_* wrapper call counts once, failed ones too; direct calls
 * through the vtable do not. */
static void test_calls(int sim)
{
    um__backend *b = make(sim, 4 * G, G);
    if (!b)
        return;
    uint64_t c0 = b->calls;
    uintptr_t va = 0;
    um__phys h = 0;
    um__bstream *s = NULL;
    um__bevent *e = NULL;
    int done = 0;
    uint64_t word = 1;
    CHECK_OK(um__be_reserve(b, G, &va));
    CHECK_OK(um__be_create(b, G, &h));
    CHECK_OK(um__be_map(b, va, G, h));
    CHECK_OK(um__be_copy(b, (void *)va, &word, sizeof word, 0));
    CHECK_OK(um__be_stream_create(b, &s));
    CHECK_OK(um__be_event_record(b, s, &e));
    CHECK_OK(um__be_event_query(b, e, &done));
    CHECK_OK(um__be_event_sync(b, e));
    um__be_event_destroy(b, e);
    CHECK_OK(um__be_stream_sync(b, s));
    CHECK_OK(um__be_stream_destroy(b, s));
    CHECK_STATUS(um__be_create(b, 0, &h), UM_ERR_INVALID);
    CHECK_OK(um__be_unmap(b, va, G));
    CHECK_OK(um__be_release(b, h, G));
    CHECK_OK(um__be_unreserve(b, va, G));
    CHECK_EQ(b->calls - c0, 15);
    CHECK_STATUS(b->ops->create(b, 0, &h), UM_ERR_INVALID);
    CHECK_EQ(b->calls - c0, 15);
    um__backend_destroy(b);
}

/* ------------------------------------------------ random, with a model */

#define RPAGES 24  /* capacity in pages */
#define RSLOTS 48  /* reservation in pages */
#define RCHUNKS 64 /* chunk records */

typedef struct rchunk {
    um__phys h;
    uint32_t n, page;
    uint64_t tag; /* pattern written at its first map (0: still zero) */
    int live;     /* the handle is valid */
    int nmaps;
    int in_use; /* pages still held (live, or released while mapped) */
} rchunk;

typedef struct rmodel {
    rchunk c[RCHUNKS];
    int slot_chunk[RSLOTS]; /* chunk mapped starting at this slot, or -1 */
    int slot_owner[RSLOTS]; /* start slot of the mapping covering it, or -1 */
    int page_used[RPAGES];
    size_t phys;
} rmodel;

static bool model_run_free(const rmodel *m, uint32_t n)
{
    for (uint32_t p = 0; p + n <= RPAGES; p++) {
        uint32_t k = 0;
        while (k < n && !m->page_used[p + k])
            k++;
        if (k == n)
            return true;
    }
    return false;
}

static void model_free_pages(rmodel *m, rchunk *c)
{
    for (uint32_t k = 0; k < c->n; k++)
        m->page_used[c->page + k] = 0;
    c->in_use = 0;
    m->phys -= c->n * G;
}

/* Samples the chunk's pattern at one word per OS page, plus the last. */
static size_t sample_mismatches(uintptr_t va, const rchunk *c)
{
    size_t words = c->n * G / 8, bad = 0;
    const uint64_t *w = (const uint64_t *)va;
    for (size_t i = 0; i < words; i += 512)
        bad += w[i] != (c->tag ? pattern(c->tag, i) : 0);
    bad += w[words - 1] != (c->tag ? pattern(c->tag, words - 1) : 0);
    return bad;
}

static void test_random(int sim, uint64_t seed)
{
    um__backend *b = make(sim, RPAGES * G, G);
    if (!b)
        return;
    static rmodel model;
    rmodel *m = &model;
    memset(m, 0, sizeof *m);
    for (int i = 0; i < RSLOTS; i++)
        m->slot_chunk[i] = m->slot_owner[i] = -1;
    uintptr_t va = 0;
    CHECK_OK(um__be_reserve(b, RSLOTS * G, &va));
    uint64_t rng = seed ^ (uint64_t)sim;
    uint64_t next_tag = 1;

    for (int step = 0; step < 4000; step++) {
        int op = (int)(harness_rand(&rng) % 6);
        int ci = (int)(harness_rand(&rng) % RCHUNKS);
        rchunk *c = &m->c[ci];
        if (op == 0 && !c->in_use) { /* create */
            static const uint32_t sizes[] = {1, 1, 1, 2, 3, 5};
            uint32_t n = sizes[harness_rand(&rng) % 6];
            um_status want = model_run_free(m, n) ? UM_OK : UM_ERR_NOMEM;
            um__phys h = 0;
            CHECK_STATUS(um__be_create(b, n * G, &h), want);
            if (want == UM_OK && h) {
                uint32_t p = um__memfd_handle_page(h);
                CHECK(p + n <= RPAGES);
                for (uint32_t k = 0; k < n && p + k < RPAGES; k++) {
                    CHECK_EQ(m->page_used[p + k], 0); /* never handed out twice */
                    m->page_used[p + k] = 1;
                }
                *c = (rchunk){.h = h, .n = n, .page = p, .live = 1, .in_use = 1};
                m->phys += n * G;
            }
        } else if ((op == 1 || op == 5) && c->live) { /* release */
            if (harness_rand(&rng) % 4 == 0)
                CHECK_STATUS(um__be_release(b, c->h, (c->n + 1) * G), UM_ERR_INVALID);
            CHECK_OK(um__be_release(b, c->h, c->n * G));
            c->live = 0;
            if (c->nmaps == 0)
                model_free_pages(m, c);
            CHECK_STATUS(um__be_release(b, c->h, c->n * G), UM_ERR_INVALID);
        } else if (op == 2 && c->h && c->nmaps < 2 &&
                   (c->live || harness_rand(&rng) % 8 == 0)) { /* map, rarely a dead handle */
            int s = (int)(harness_rand(&rng) % RSLOTS);
            bool fits = s + (int)c->n <= RSLOTS;
            for (int k = 0; fits && k < (int)c->n; k++)
                fits = m->slot_owner[s + k] < 0;
            um_status want = c->live && fits ? UM_OK : UM_ERR_INVALID;
            CHECK_STATUS(um__be_map(b, va + (size_t)s * G, c->n * G, c->h), want);
            if (want == UM_OK) {
                for (int k = 0; k < (int)c->n; k++)
                    m->slot_owner[s + k] = s;
                m->slot_chunk[s] = ci;
                c->nmaps++;
                uintptr_t a = va + (size_t)s * G;
                CHECK_EQ(sample_mismatches(a, c), 0);
                if (!c->tag) {
                    c->tag = next_tag++;
                    fill((void *)a, c->n * G, c->tag, 0);
                }
            }
        } else if (op == 3) { /* unmap a run of 1..3 slots starting anywhere */
            int s = (int)(harness_rand(&rng) % RSLOTS);
            if (harness_rand(&rng) % 2 && m->slot_owner[s] >= 0)
                s = m->slot_owner[s]; /* half the time, start at a mapping */
            int len = 1 + (int)(harness_rand(&rng) % 3);
            if (s + len > RSLOTS)
                len = RSLOTS - s;
            /* Reference: whole adjacent mappings, every page mapped. */
            bool ok = true;
            int k = s;
            while (ok && k < s + len) {
                ok = m->slot_chunk[k] >= 0 && m->slot_owner[k] == k;
                if (ok)
                    k += (int)m->c[m->slot_chunk[k]].n;
            }
            ok = ok && k == s + len;
            CHECK_STATUS(um__be_unmap(b, va + (size_t)s * G, (size_t)len * G),
                         ok ? UM_OK : UM_ERR_INVALID);
            for (k = s; ok && k < s + len;) {
                rchunk *mc = &m->c[m->slot_chunk[k]];
                int n = (int)mc->n;
                m->slot_chunk[k] = -1;
                for (int j = 0; j < n; j++)
                    m->slot_owner[k + j] = -1;
                if (--mc->nmaps == 0 && !mc->live)
                    model_free_pages(m, mc);
                k += n;
            }
        } else if (op == 4) { /* check a mapping's contents */
            int s = (int)(harness_rand(&rng) % RSLOTS);
            if (m->slot_chunk[s] >= 0)
                CHECK_EQ(sample_mismatches(va + (size_t)s * G, &m->c[m->slot_chunk[s]]), 0);
        }
        CHECK_EQ(b->physical_bytes, m->phys);
    }
    size_t held = 0;
    for (int p = 0; p < RPAGES; p++)
        held += m->page_used[p] ? 1 : 0;
    CHECK_EQ(mfd(b)->used_pages, held);

    /* Tear down through the API and check that everything went back. */
    for (int s = 0; s < RSLOTS; s++)
        if (m->slot_chunk[s] >= 0) {
            rchunk *c = &m->c[m->slot_chunk[s]];
            CHECK_EQ(sample_mismatches(va + (size_t)s * G, c), 0);
            CHECK_OK(um__be_unmap(b, va + (size_t)s * G, c->n * G));
        }
    for (int i = 0; i < RCHUNKS; i++)
        if (m->c[i].live)
            CHECK_OK(um__be_release(b, m->c[i].h, m->c[i].n * G));
    CHECK_EQ(b->physical_bytes, 0);
    CHECK_EQ(mfd(b)->used_pages, 0);
    CHECK_EQ(mfd(b)->nmaps, 0);
    CHECK_EQ(memfd_blocks(b), 0);
    CHECK_OK(um__be_unreserve(b, va, RSLOTS * G));
    um__backend_destroy(b);
}

/* ------------------------------------------------------- concurrency */

#define NTHREADS 4
#define TSLOTS 8

typedef struct tjob {
    um__backend *b;
    uintptr_t va; /* this thread's slots */
    int id;
    int errors;
} tjob;

static void *thread_main(void *arg)
{
    tjob *j = arg;
    for (int it = 0; it < 150; it++) {
        size_t n = (size_t)(1 + (it + j->id) % 3) * G;
        uintptr_t a = j->va + (size_t)(it % (TSLOTS - 2)) * G;
        uint64_t tag = (uint64_t)j->id * 1000 + (uint64_t)it + 1;
        um__phys h = 0;
        if (um__be_create(j->b, n, &h) != UM_OK) {
            j->errors++;
            continue;
        }
        j->errors += um__be_map(j->b, a, n, h) != UM_OK;
        fill((void *)a, n, tag, 0);
        j->errors += um__sim_stream_launch(j->b, NULL, 1) != UM_OK;
        j->errors += mismatches((void *)a, n, tag, 0) != 0;
        j->errors += um__sim_stream_complete(j->b, NULL, 1) != UM_OK;
        j->errors += um__be_unmap(j->b, a, n) != UM_OK;
        j->errors += um__be_release(j->b, h, n) != UM_OK;
    }
    return NULL;
}

static void test_threads(void)
{
    /* Other threads hold at most three chunks (9 pages), so the 15 or more
     * free pages form at most four runs and one has the 3 pages needed. */
    um__backend *b = make(1, NTHREADS * 6 * G, G);
    if (!b)
        return;
    uintptr_t va = 0;
    CHECK_OK(um__be_reserve(b, NTHREADS * TSLOTS * G, &va));
    pthread_t th[NTHREADS];
    tjob jobs[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        jobs[i] = (tjob){b, va + (size_t)i * TSLOTS * G, i, 0};
        CHECK_EQ(pthread_create(&th[i], NULL, thread_main, &jobs[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) {
        CHECK_EQ(pthread_join(th[i], NULL), 0);
        CHECK_EQ(jobs[i].errors, 0);
    }
    um__bstream *d = &mfd(b)->default_stream;
    CHECK_EQ(d->submitted, NTHREADS * 150);
    CHECK(d->completed <= d->submitted);
    CHECK_OK(um__be_stream_sync(b, NULL));
    CHECK_EQ(d->completed, NTHREADS * 150);
    CHECK_EQ(b->physical_bytes, 0);
    CHECK_EQ(mfd(b)->used_pages, 0);
    CHECK_OK(um__be_unreserve(b, va, NTHREADS * TSLOTS * G));
    um__backend_destroy(b);
}

int main(void)
{
    uint64_t seed = harness_seed("test_backend");
    for (int sim = 0; sim < 2; sim++) {
        um__clear_error();
        test_move(sim, G);
        test_move(sim, (size_t)2 << 20); /* the default granularity */
        test_adjacent(sim);
        test_multipage(sim);
        test_capacity(sim);
        test_zero(sim);
        test_release_mapped(sim);
        test_bad_input(sim);
        test_reserve_granule_limit(sim);
        test_async_unmapped(sim);
        test_calls(sim);
        test_random(sim, seed);
        if (harness_failures)
            fprintf(stderr, "test_backend: failures so far on %s\n", kind_str(sim));
    }
    test_bad_config();
    test_sim_streams();
    test_host_streams();
    test_threads();
    return harness_finish("test_backend");
}
