/* Tests of the spill file's extents (src/buffer/spill.c) on their own:
 * random allocations and frees checked against a model of the file's
 * pages (first fit over maximal free runs, else at the end, from the free
 * run ending there), the bytes of
 * every live extent kept whole through the reuse of freed ones, their
 * checksums, and the bytes counted as used. The reclaim tests spill whole
 * buffers but free extents only at the end, so reuse is checked here. */
#include "buffer/buffer.h"
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAXLIVE = 64, MAXPAGES = 1 << 14, STEPS = 6000 };

typedef struct {
    unsigned char *map;
    size_t off, size, len; /* len: size in whole pages */
    uint32_t *sums;
    uint64_t tag;          /* the byte pattern's seed */
} live_extent;

/* The model: which pages of the file are taken, and its end. */
static bool taken[MAXPAGES];
static size_t model_end; /* pages */

static size_t model_take(size_t pages)
{
    for (size_t p = 0, run = 0; p < model_end; p++) {
        run = taken[p] ? 0 : run + 1;
        if (run == pages) {
            memset(&taken[p + 1 - pages], 1, pages);
            return p + 1 - pages;
        }
    }
    /* None fits: the extent goes at the end, starting in the free run that
     * ends there, so the file grows only by what is missing. */
    size_t at = model_end;
    while (at > 0 && !taken[at - 1])
        at--;
    model_end = at + pages;
    memset(&taken[at], 1, pages);
    return at;
}

static unsigned char pattern(uint64_t tag, size_t i)
{
    return (unsigned char)((tag * 0x9e3779b97f4a7c15ull + i * 131) >> 24);
}

static void fill(live_extent *e)
{
    for (size_t i = 0; i < e->size; i++)
        e->map[i] = pattern(e->tag, i);
}

static bool intact(const live_extent *e)
{
    for (size_t i = 0; i < e->size; i++)
        if (e->map[i] != pattern(e->tag, i))
            return false;
    return true;
}

static void test_random(uint64_t seed, const char *dir)
{
    um__spill *sp = NULL;
    CHECK_OK(um__spill_create(dir, &sp));
    if (!sp)
        return;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    static live_extent live[MAXLIVE];
    int nlive = 0;
    size_t used = 0;
    long reused = 0;
    uint64_t rng = seed;
    memset(taken, 0, sizeof taken);
    model_end = 0;
    for (int step = 0; step < STEPS; step++) {
        uint64_t r = harness_rand(&rng);
        if (nlive < MAXLIVE && (r % 100 < 55 || !nlive)) {
            /* Mostly a few pages, sometimes odd sizes within a page or
             * spanning several checksum blocks. */
            size_t size = (r >> 8) % 4 ? 1 + (r >> 16) % (6 * page)
                                       : 1 + (r >> 16) % (3 * UM_SPILL_SUM_BYTES);
            size_t pages = (size + page - 1) / page;
            if (model_end + pages > MAXPAGES)
                continue;
            live_extent *e = &live[nlive];
            void *map = NULL;
            CHECK_OK(um__spill_alloc(sp, size, &map, &e->off));
            if (!map)
                break;
            size_t want = model_take(pages);
            if (e->off != want * page)
                harness_report(__FILE__, __LINE__,
                               "step %d: an extent of %zu pages at page %zu, the model's first "
                               "fit is page %zu",
                               step, pages, e->off / page, want);
            reused += want + pages < model_end;
            e->map = map;
            e->size = size;
            e->len = pages * page;
            e->tag = r;
            fill(e);
            e->sums = malloc(um__spill_sums(size) * sizeof *e->sums);
            CHECK(e->sums != NULL);
            if (!e->sums)
                break;
            um__spill_seal(e->map, size, e->sums);
            used += e->len;
            nlive++;
        } else {
            int i = (int)((r >> 8) % (uint64_t)nlive);
            live_extent *e = &live[i];
            /* Before it goes: its bytes and checksums, in full and in part. */
            CHECK(intact(e));
            CHECK_OK(um__spill_check(sp, e->map, e->off, e->size, e->sums, 0, e->size));
            size_t from = (r >> 20) % e->size;
            CHECK_OK(um__spill_check(sp, e->map, e->off, e->size, e->sums, from,
                                     e->size - from));
            um__spill_free(sp, e->map, e->off, e->size);
            memset(&taken[e->off / page], 0, e->len / page);
            used -= e->len;
            free(e->sums);
            live[i] = live[--nlive];
        }
        CHECK_EQ(um__spill_used(sp), used);
    }
    for (int i = 0; i < nlive; i++) {
        CHECK(intact(&live[i]));
        um__spill_free(sp, live[i].map, live[i].off, live[i].size);
        free(live[i].sums);
    }
    CHECK_EQ(um__spill_used(sp), 0);
    /* With everything free the file is one free run: the first fit of the
     * whole file's length starts at its beginning. */
    void *map = NULL;
    size_t off = 1;
    CHECK_OK(um__spill_alloc(sp, model_end * page, &map, &off));
    CHECK_EQ(off, 0);
    um__spill_free(sp, map, off, model_end * page);
    /* One longer than the file starts at its beginning too: the free run
     * at the end is extended, not passed over. */
    off = 1;
    CHECK_OK(um__spill_alloc(sp, (model_end + 3) * page, &map, &off));
    CHECK_EQ(off, 0);
    um__spill_free(sp, map, off, (model_end + 3) * page);
    CHECK(reused > STEPS / 10);
    printf("test_spill: %d steps, %ld extents placed in freed space, file of %zu pages\n", STEPS,
           reused, model_end);
    um__spill_destroy(sp);
}

/* The spill file, found through /proc/self/fd as someone else could: the
 * one descriptor whose (deleted) path lies in dir. */
static int spill_fd(const char *dir)
{
    for (int fd = 0; fd < 1024; fd++) {
        char link[64], path[512];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, path, sizeof path - 1);
        if (n <= 0)
            continue;
        path[n] = 0;
        if (strncmp(path, dir, strlen(dir)) == 0)
            return fd;
    }
    return -1;
}

/* A file cut behind unimem's back is found before a read could fault, but
 * one that still holds every byte of an extent's data (its page's tail
 * cut off) reads whole. */
static void test_cut_at_data_end(const char *dir)
{
    um__spill *sp = NULL;
    CHECK_OK(um__spill_create(dir, &sp));
    if (!sp)
        return;
    const size_t size = 100;
    void *map = NULL;
    size_t off = 1;
    CHECK_OK(um__spill_alloc(sp, size, &map, &off));
    CHECK_EQ(off, 0);
    int fd = spill_fd(dir);
    CHECK(fd >= 0);
    if (map && fd >= 0) {
        memset(map, 0x5a, size);
        uint32_t sums[1];
        um__spill_seal(map, size, sums);
        CHECK_EQ(ftruncate(fd, (off_t)size), 0);
        CHECK_OK(um__spill_check(sp, map, off, size, sums, 0, size));
        CHECK_EQ(((unsigned char *)map)[size - 1], 0x5a);
        CHECK_EQ(ftruncate(fd, (off_t)size - 1), 0);
        CHECK_STATUS(um__spill_check(sp, map, off, size, sums, 0, size), UM_ERR_BACKEND);
        CHECK_ERROR_MENTIONS("truncated", NULL, NULL);
    }
    um__spill_free(sp, map, off, size);
    um__spill_destroy(sp);
}

int main(void)
{
    uint64_t seed = harness_seed("test_spill");
    const char *tmp = getenv("TMPDIR");
    char dir[256];
    snprintf(dir, sizeof dir, "%s/test_spill-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    CHECK(mkdtemp(dir) != NULL);
    test_random(seed, dir);
    test_cut_at_data_end(dir);
    CHECK_EQ(rmdir(dir), 0); /* nothing left in it */
    return harness_finish("test_spill");
}
