/* Fault injection through the `fault` option: for each sequence of public
 * operations below, every backend call in turn is made to fail (fault=
 * any@N for N = 1, 2, ... until the sequence makes fewer calls than N),
 * then random fractions with seeds; the buffers' sequence again on
 * modelled links, whose copies carry fences. After each run: every failed call
 * returned a status and a message, every block and buffer holds the data
 * last written to it, the statistics equal a recount of the blocks the
 * test holds, the pools pass their consistency check, and at shutdown the
 * backends got back every reservation, chunk, mapping, stream and event
 * (um__fault_leaks_total does not move). */
#include "core/core.h"
#include "harness.h"

#include <stdlib.h>
#include <string.h>

#define MB (1024u * 1024u)

typedef struct run_result {
    int failed_calls;      /* public calls that returned an error */
    int silent_errors;     /* of those, without a message */
    int wrong_bytes;       /* blocks or buffers whose data is not the last written */
    int bad_stats;         /* devices whose stats disagree with the recount */
    int bad_checks;        /* pools failing their consistency check */
    uint64_t fired;        /* failures injected */
    uint64_t written_back; /* replicas written back to make room (buffers) */
} run_result;

/* A call's status: a failure must come with a message. */
static bool ok(run_result *r, um_status st)
{
    if (st == UM_OK)
        return true;
    r->failed_calls++;
    if (getenv("FAULT_LOG"))
        fprintf(stderr, "  %s: %s\n", um_status_name(st), um_last_error());
    if (!um_last_error()[0])
        r->silent_errors++;
    return false;
}

/* Block contents: word w of a block with pattern (id, gen) is a mix of
 * the three, so that any misplaced or stale word shows. Words, not bytes,
 * so that the sanitizer builds check megabytes quickly. */
static uint64_t pattern_word(unsigned id, unsigned gen, size_t w)
{
    uint64_t z = ((uint64_t)id << 40 ^ (uint64_t)gen << 32) + w * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
    return z ^ (z >> 29);
}

static void fill(void *p, size_t n, unsigned id, unsigned gen)
{
    uint8_t *b = p;
    size_t w = 0;
    for (; (w + 1) * 8 <= n; w++) {
        uint64_t v = pattern_word(id, gen, w);
        memcpy(b + w * 8, &v, 8);
    }
    uint64_t v = pattern_word(id, gen, w);
    memcpy(b + w * 8, &v, n - w * 8);
}

static bool matches(const void *p, size_t n, unsigned id, unsigned gen)
{
    const uint8_t *b = p;
    size_t w = 0;
    for (; (w + 1) * 8 <= n; w++) {
        uint64_t v = pattern_word(id, gen, w);
        if (memcmp(b + w * 8, &v, 8) != 0)
            return false;
    }
    uint64_t v = pattern_word(id, gen, w);
    return memcmp(b + w * 8, &v, n - w * 8) == 0;
}

static void check_pools(um_context *ctx, run_result *r)
{
    for (int d = 0; d < ctx->ndevices; d++) {
        um__allocator *a = ctx->devices[d].alloc;
        if (a && a->ops->check && a->ops->check(a) != UM_OK) {
            fprintf(stderr, "  device %d: %s\n", d, um_last_error());
            r->bad_checks++;
        }
    }
}

/* ------------------------------------------------- pooled memory sequence */

#define NBLOCKS 24

typedef struct held_block {
    void *p;
    size_t size;
    int dev;
    unsigned id, gen; /* its bytes: pattern(id, gen, offset) */
    /* After a failed copy into it, the source's pattern is as right: the
     * copy may have run before the call failed (as with cudaMemcpy). */
    unsigned alt_id, alt_gen;
} held_block;

static void seq_pool(um_context *ctx, run_result *r)
{
    held_block b[NBLOCKS] = {{0}};
    um_stream s = NULL;
    ok(r, um_stream_create(ctx, 1, &s));
    static const size_t sizes[] = {512, 40000, 3 * MB, 5 * MB / 2, 100, 2 * MB, 700000, 8 * MB};
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < NBLOCKS; i++) {
            held_block *h = &b[i];
            if (h->p && (i + round) % 3 == 0) {
                /* Freed on the stream, or not at all if the free fails. */
                if (ok(r, um_free(ctx, h->p, h->dev == 1 ? s : NULL)))
                    h->p = NULL;
            }
            if (!h->p) {
                size_t size = sizes[(unsigned)(i * 7 + round) % 8];
                int dev = 1 + (i + round) % 2;
                if (ok(r, um_malloc(ctx, dev, size, NULL, &h->p))) {
                    h->size = size;
                    h->dev = dev;
                    h->id = (unsigned)i;
                    h->gen = (unsigned)round + 1;
                    h->alt_gen = 0;
                    fill(h->p, size, h->id, h->gen); /* sim memory is host memory */
                } else {
                    h->p = NULL;
                }
            }
        }
        /* A copy between two live blocks, the destination the smaller:
         * it then holds the first bytes of the source's pattern. */
        int from = round % NBLOCKS, to = (round + 5) % NBLOCKS;
        if (b[from].p && b[to].p && b[to].size <= b[from].size) {
            bool copied = ok(r, um_memcpy(ctx, b[to].p, b[from].p, b[to].size));
            b[to].alt_id = copied ? 0 : b[from].id;
            b[to].alt_gen = copied ? 0 : b[from].gen;
            if (copied) {
                b[to].id = b[from].id;
                b[to].gen = b[from].gen;
            }
        }
        ok(r, um_trim(ctx, round % 2 + 1));
        /* No cap, then 4 MiB, then no cache. */
        ok(r, um_set_cache_limit(ctx, 2, round == 0 ? UM_NO_CACHE_LIMIT : round == 1 ? 4 * MB : 0));
    }
    /* Every block holds its bytes; the stats count exactly these. */
    size_t requested[3] = {0};
    uint64_t count[3] = {0};
    for (int i = 0; i < NBLOCKS; i++) {
        if (!b[i].p)
            continue;
        if (!matches(b[i].p, b[i].size, b[i].id, b[i].gen) &&
            !(b[i].alt_gen && matches(b[i].p, b[i].size, b[i].alt_id, b[i].alt_gen))) {
            fprintf(stderr,
                    "  block %d (%zu bytes on device %d at %p): not the data last "
                    "written\n",
                    i, b[i].size, b[i].dev, b[i].p);
            r->wrong_bytes++;
        }
        requested[b[i].dev] += b[i].size;
        count[b[i].dev]++;
    }
    for (int d = 1; d < 3; d++) {
        um_stats st;
        if (um_stats_get(ctx, d, &st) != UM_OK || st.requested_bytes != requested[d] ||
            st.active_blocks != count[d]) {
            fprintf(stderr,
                    "  device %d: stats say %zu bytes in %llu blocks, the test holds %zu "
                    "in %llu\n",
                    d, st.requested_bytes, (unsigned long long)st.active_blocks, requested[d],
                    (unsigned long long)count[d]);
            r->bad_stats++;
        }
    }
    check_pools(ctx, r);
    for (int i = 0; i < NBLOCKS; i++)
        if (b[i].p && um_free(ctx, b[i].p, NULL) != UM_OK)
            ok(r, um_free(ctx, b[i].p, NULL)); /* once more: the fault fires once */
    if (s)
        ok(r, um_stream_destroy(ctx, s));
}

/* ------------------------------------------------------ buffer sequence */

#define NBUFS 6
#define BUF_BYTES (3 * MB)

static int task_xor(const um_task_exec *e)
{
    uint8_t *p = e->ptrs[0];
    for (size_t i = 0; i < e->sizes[0]; i++)
        p[i] ^= 0x5a;
    return 0;
}

/* Buffers moving between the host and two sim devices, device 1 limited
 * to less than they need, so that acquiring evicts and writes back. */
static void seq_buffers(um_context *ctx, run_result *r)
{
    um_buffer *buf[NBUFS] = {0};
    unsigned gen[NBUFS] = {0};
    bool xored[NBUFS] = {0};
    uint8_t *tmp = malloc(BUF_BYTES);
    if (!tmp)
        return;
    ok(r, um_set_memory_limit(ctx, 1, 8 * MB));
    for (int i = 0; i < NBUFS; i++) {
        if (!ok(r, um_buffer_create(ctx, BUF_BYTES, NULL, &buf[i]))) {
            buf[i] = NULL;
            continue;
        }
        fill(tmp, BUF_BYTES, (unsigned)i, 1);
        if (ok(r, um_buffer_write(buf[i], 0, tmp, BUF_BYTES)))
            gen[i] = 1;
    }
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < NBUFS; i++) {
            if (!buf[i])
                continue;
            /* All on device 1 first (twice its limit: written back to
             * make room), then spread over both. */
            int dev = round == 0 ? 1 : 1 + i % 2;
            void *p = NULL;
            if (!ok(r, um_buffer_acquire(buf[i], dev, UM_ACCESS_WRITE, NULL, &p)))
                continue;
            /* Written in place: the replica on dev is the newest data. */
            unsigned g = 10 + (unsigned)round;
            fill(p, BUF_BYTES, (unsigned)i, g);
            gen[i] = g;
            xored[i] = false;
            ok(r, um_buffer_release(buf[i], dev, NULL));
        }
        ok(r, um_trim(ctx, 1));
    }
    /* A task on a device of the policy's choice flips buffer 0's bits. */
    if (buf[0]) {
        um_task t = {.name = "xor", .cpu = task_xor, .nbuffers = 1, .device = -1};
        t.buffers[0] = buf[0];
        t.modes[0] = UM_ACCESS_READ_WRITE;
        um_task_id id;
        if (ok(r, um_task_submit(ctx, &t, &id)) && ok(r, um_task_wait(ctx, id)))
            xored[0] = true;
    }
    for (int i = 0; i < NBUFS; i++) {
        if (!buf[i] || !gen[i])
            continue;
        /* A read may meet the one injected failure: then once more. */
        if (um_buffer_read(buf[i], 0, tmp, BUF_BYTES) != UM_OK &&
            !ok(r, um_buffer_read(buf[i], 0, tmp, BUF_BYTES)))
            continue;
        if (xored[i])
            for (size_t k = 0; k < BUF_BYTES; k += 8) {
                uint64_t v;
                memcpy(&v, tmp + k, 8);
                v ^= 0x5a5a5a5a5a5a5a5aull;
                memcpy(tmp + k, &v, 8);
            }
        if (!matches(tmp, BUF_BYTES, (unsigned)i, gen[i])) {
            fprintf(stderr, "  buffer %d: not the data last written (generation %u)\n", i, gen[i]);
            r->wrong_bytes++;
        }
    }
    um_reclaim_stats rs = {0};
    if (um_reclaim_stats_get(ctx, 1, &rs) == UM_OK)
        r->written_back += rs.written_back;
    check_pools(ctx, r);
    for (int i = 0; i < NBUFS; i++)
        if (buf[i] && um_buffer_destroy(buf[i]) != UM_OK)
            ok(r, um_buffer_destroy(buf[i]));
    free(tmp);
}

/* ----------------------------------------------------------------- runs */

typedef void (*sequence)(um_context *ctx, run_result *r);

/* Options added to every run's devices: with a modelled link, sim copies
 * take time and carry fences, so the paths that wait for a copy (and can
 * fail there) run too. */
static const char *g_links = "";

static bool run_once(const char *name, sequence seq, const char *fault, run_result *r)
{
    memset(r, 0, sizeof *r);
    char conf[256];
    snprintf(conf, sizeof conf, "devices=sim:64M+sim:64M%s,fault=%s,log_level=%s", g_links, fault,
             getenv("FAULT_LOG") ? getenv("FAULT_LOG") : "error");
    uint64_t leaks = um__fault_leaks_total();
    um_context *ctx = NULL;
    um_status st = um_init(conf, &ctx);
    if (st != UM_OK) {
        /* A failure while starting: reported, and nothing left behind. */
        CHECK(um_last_error()[0] != '\0');
        CHECK_EQ(um__fault_leaks_total(), leaks);
        r->fired = 1;
        return true;
    }
    seq(ctx, r);
    r->fired = um__fault_fired(ctx->fault);
    um_shutdown(ctx);
    bool clean = r->silent_errors == 0 && r->wrong_bytes == 0 && r->bad_stats == 0 &&
                 r->bad_checks == 0 && um__fault_leaks_total() == leaks;
    if (!clean)
        fprintf(stderr,
                "test_faults: %s with fault=%s: %d silent errors, %d wrong, %d bad stats, "
                "%d bad checks, %llu leaks\n",
                name, fault, r->silent_errors, r->wrong_bytes, r->bad_stats, r->bad_checks,
                (unsigned long long)(um__fault_leaks_total() - leaks));
    CHECK(clean);
    return clean;
}

/* Fails call N of `kind` ("any": of every kind) for N = 1, 2, ... until
 * the sequence makes fewer such calls. */
static void every_position(const char *name, sequence seq, const char *kind)
{
    run_result r;
    int positions = 0, clean = 0, with_errors = 0;
    /* Without a fault, what the sequence is meant to do happens: the
     * buffers' sequence writes replicas back to make room. */
    CHECK(run_once(name, seq, "any@1000000", &r));
    CHECK_EQ(r.failed_calls, 0);
    CHECK(seq != seq_buffers || r.written_back > 0);
    printf("test_faults: %s without a fault: %llu write-backs\n", name,
           (unsigned long long)r.written_back);
    for (unsigned long n = 1; n < 100000; n++) {
        char fault[32];
        snprintf(fault, sizeof fault, "%s@%lu", kind, n);
        clean += run_once(name, seq, fault, &r);
        if (!r.fired)
            break; /* past the last call */
        positions++;
        with_errors += r.failed_calls > 0;
    }
    printf("test_faults: %s: %d fault positions, %d clean; %d made a public call fail\n", name,
           positions, clean, with_errors);
    CHECK(positions > 10);
    CHECK_EQ(clean, positions + 1);
}

/* Random failures of one kind, or of all, with several seeds. */
static void random_faults(const char *name, sequence seq)
{
    static const char *const specs[] = {"any~0.02", "create~0.2", "map~0.1",
                                        "copy~0.2", "event~0.2",  "unmap~0.2+release~0.2"};
    int runs = 0, fired = 0;
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        for (int seed = 1; seed <= 4; seed++) {
            char fault[96];
            snprintf(fault, sizeof fault, "%s,fault_seed=%d", specs[k], seed);
            run_result r;
            run_once(name, seq, fault, &r);
            runs++;
            fired += r.fired > 0;
        }
    }
    printf("test_faults: %s: %d random runs, %d with injected failures\n", name, runs, fired);
    CHECK(fired > runs / 2);
}

static void test_bad_specs(void)
{
    /* "reserve~" and "create@ -1" were taken (p = 0; the call 2^64-1),
     * and a device index alone ("5") was read past its end. */
    static const char *const bad[] = {"bogus@1", "map@0", "map",      "map~1.5",    "99:map@1",
                                      "map@x",   "5",     "reserve~", "create@ -1", "3:",
                                      /* Past 2^64: strtoull's ERANGE gave 2^64-1. */
                                      "map@99999999999999999999",
                                      /* Taken before: a space, an exponent
                                       * that underflowed to 0, hex, and a
                                       * '+' with no rule after it. */
                                      "map~ 0.5", "map~1e-400", "map~0x1p-1", "map@1+",
                                      "map~.", "map~0.5.1", "event~1.0001"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char conf[96];
        snprintf(conf, sizeof conf, "devices=sim:8M,fault=%s", bad[i]);
        um_context *ctx = NULL;
        CHECK_STATUS(um_init(conf, &ctx), UM_ERR_BAD_OPTION);
        CHECK_ERROR_MENTIONS("fault", bad[i], NULL);
        /* The parser on its own, from a copy of exactly the spec's size
         * (so that AddressSanitizer sees a read past its end). */
        char *spec = strdup(bad[i]);
        um__fault_plan *plan = NULL;
        CHECK_STATUS(um__fault_plan_parse(spec, 1, &plan), UM_ERR_BAD_OPTION);
        CHECK(plan == NULL);
        free(spec);
    }
    /* A rule for one device leaves the others alone. */
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:8M+sim:8M,fault=2:create@1", &ctx));
    if (ctx) {
        void *a = NULL, *b = NULL;
        CHECK_OK(um_malloc(ctx, 1, 3 * MB, NULL, &a));
        /* The failed create is a full device to the pool: it makes room
         * and asks again, and the rule fires only once. */
        CHECK_OK(um_malloc(ctx, 2, 3 * MB, NULL, &b));
        CHECK_OK(um_free(ctx, a, NULL));
        CHECK_OK(um_free(ctx, b, NULL));
        CHECK_EQ(um__fault_fired(ctx->fault), 1ull);
        um_shutdown(ctx);
    }
}

/* A 64 MiB sim backend wrapped by the fault plan of spec (*plan); NULL,
 * with everything freed and a failed check, when a part cannot be made.
 * Destroying the wrapper destroys the sim backend; the plan is freed
 * apart. */
static um__backend *wrapped_sim(const char *spec, um__fault_plan **plan)
{
    um__backend *sim = NULL, *w = NULL;
    *plan = NULL;
    CHECK_OK(um__fault_plan_parse(spec, 1, plan));
    CHECK_OK(um__sim_backend_create("sim", 64 * MB, 2 * MB, 0, &sim));
    if (*plan && sim)
        CHECK_OK(um__fault_wrap(sim, *plan, 0, &w));
    if (!w) {
        um__backend_destroy(sim);
        um__fault_plan_free(*plan);
        *plan = NULL;
    }
    return w;
}

/* Each rule counts every call of its kind, also those another rule
 * fails: with "reserve@1+any@2" the first reservation fails by the first
 * rule, and the second call of any kind (the second reservation) by the
 * second. The second rule used to miss the call the first one failed, and
 * failed the third call instead. */
static void test_rules_count_apart(void)
{
    um__fault_plan *plan;
    um__backend *w = wrapped_sim("reserve@1+any@2", &plan);
    if (!w)
        return;
    um_status want[3] = {UM_ERR_BACKEND, UM_ERR_BACKEND, UM_OK};
    for (int i = 0; i < 3; i++) {
        uintptr_t va = 0;
        um_status st = um__be_reserve(w, 2 * MB, &va);
        CHECK_STATUS(st, want[i]);
        if (st == UM_OK)
            CHECK_OK(um__be_unreserve(w, va, 2 * MB));
    }
    CHECK_EQ(um__fault_fired(plan), 2ull);
    um__backend_destroy(w);
    um__fault_plan_free(plan);
}

/* Destroying a NULL event is nothing, as on the sim backend it wraps: the
 * wrapper used to count it as an event given back, and its shutdown then
 * reported -1 events as a leak. */
static void test_null_event_destroy(void)
{
    um__fault_plan *plan;
    um__backend *w = wrapped_sim("map@1000", &plan);
    if (!w)
        return;
    um__bevent *e = NULL;
    CHECK_OK(um__be_event_record(w, NULL, &e));
    um__be_event_destroy(w, e);
    um__be_event_destroy(w, NULL);
    uint64_t leaks = um__fault_leaks_total();
    um__backend_destroy(w);
    CHECK_EQ(um__fault_leaks_total(), leaks);
    um__fault_plan_free(plan);
}

/* The wrapper shows the physical bytes of the backend it wraps, also when
 * they go at an unmap: a chunk released while mapped (as cuMemRelease
 * allows) is freed by its last unmap, and the wrapper used to go on
 * showing its bytes until the next create or release. */
static void test_physical_after_unmap(void)
{
    um__fault_plan *plan;
    um__backend *w = wrapped_sim("map@1000", &plan);
    if (!w)
        return;
    um__backend *sim = w->wrapped; /* the backend the wrapper forwards to */
    uintptr_t va = 0;
    um__phys h = 0;
    CHECK_OK(um__be_reserve(w, 4 * MB, &va));
    CHECK_OK(um__be_create(w, 2 * MB, &h));
    CHECK_OK(um__be_map(w, va, 2 * MB, h));
    CHECK_OK(um__be_release(w, h, 2 * MB)); /* kept until the unmap */
    CHECK_EQ(atomic_load(&w->physical_bytes), 2 * MB);
    CHECK_OK(um__be_unmap(w, va, 2 * MB));
    CHECK_EQ(atomic_load(&sim->physical_bytes), 0u);
    CHECK_EQ(atomic_load(&w->physical_bytes), 0u);
    CHECK_OK(um__be_unreserve(w, va, 4 * MB));
    um__backend_destroy(w);
    um__fault_plan_free(plan);
}

enum { FREED_BLOCKS = 6 };

/* Allocates FREED_BLOCKS blocks of 2 MiB on device 1 and frees them on the
 * default stream; returns the device's reserved bytes then. */
static size_t freed_blocks(um_context *ctx)
{
    void *blocks[FREED_BLOCKS] = {0};
    for (int i = 0; i < FREED_BLOCKS; i++)
        CHECK_OK(um_malloc(ctx, 1, 2 * MB, NULL, &blocks[i]));
    for (int i = 0; i < FREED_BLOCKS; i++)
        CHECK_OK(um_free(ctx, blocks[i], NULL));
    um_stats st;
    CHECK_OK(um_stats_get(ctx, 1, &st));
    CHECK(st.reserved_bytes >= FREED_BLOCKS * 2 * MB);
    return st.reserved_bytes;
}

/* A page the backend refuses to release does not keep the other idle
 * pages: trim gives back all of them but that one, reports the refusal,
 * and a later trim takes the last. Trim used to stop at the first refusal
 * and keep every page behind it. */
static void test_trim_past_refused_release(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,fault=1:release@1", &ctx));
    if (!ctx)
        return;
    um_stats st;
    size_t page = freed_blocks(ctx) / FREED_BLOCKS;
    CHECK_STATUS(um_trim(ctx, 1), UM_ERR_BACKEND);
    CHECK_OK(um_stats_get(ctx, 1, &st));
    CHECK_EQ(st.reserved_bytes, page);
    CHECK_EQ(um__fault_fired(ctx->fault), 1ull);
    CHECK_OK(um_trim(ctx, 1));
    CHECK_OK(um_stats_get(ctx, 1, &st));
    CHECK_EQ(st.reserved_bytes, (size_t)0);
    um_shutdown(ctx);
}

/* Frees whose stream can be waited for neither through a fence nor by
 * synchronizing it keep their memory: um_trim says so, and a lower memory
 * limit names that cause, not live data. Trim used to return UM_OK with
 * everything still reserved, and the limit blamed live data with none
 * active. */
static void test_trim_when_stream_cannot_be_waited_for(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,fault=1:event~1+1:stream~1,log_level=error", &ctx));
    if (!ctx)
        return;
    um_stats st;
    size_t reserved = freed_blocks(ctx);
    CHECK_STATUS(um_trim(ctx, 1), UM_ERR_BACKEND);
    CHECK_ERROR_MENTIONS("cannot be waited for", "stays reserved", NULL);
    CHECK_OK(um_stats_get(ctx, 1, &st));
    CHECK_EQ(st.reserved_bytes, reserved);
    CHECK_EQ(st.active_bytes, (size_t)0);
    CHECK_STATUS(um_set_memory_limit(ctx, 1, 4 * MB), UM_ERR_BACKEND);
    CHECK_ERROR_MENTIONS("memory limit", "cannot be waited for", NULL);
    CHECK(strstr(um_last_error(), "live data") == NULL);
    um_shutdown(ctx);
}

/* allocator=direct: a free whose release the backend refuses has still
 * taken the block (unmapped, parked to be given back later), so it
 * succeeds and a second free fails as a free of freed memory does. It
 * used to return the backend's error: a caller retrying then got an
 * error for freed memory, and a deferred free asked whether the block was
 * live, which, once the parked range was given back and another thread's
 * allocation reused its address, answered for the wrong block and freed
 * that one later. */
static void test_direct_free_parks_refused_release(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,allocator=direct,fault=1:release@1,log_level=error", &ctx));
    if (!ctx)
        return;
    void *a = NULL;
    CHECK_OK(um_malloc(ctx, 1, 2 * MB, NULL, &a));
    CHECK_OK(um_free(ctx, a, NULL));
    CHECK_EQ(um__fault_fired(ctx->fault), 1ull);
    um_status again = um_free(ctx, a, NULL);
    CHECK(again == UM_ERR_DOUBLE_FREE || again == UM_ERR_INVALID_POINTER);
    um_stats st;
    CHECK_OK(um_stats_get(ctx, 1, &st));
    CHECK_EQ(st.active_bytes, (size_t)0);
    CHECK(st.reserved_bytes >= 2 * MB); /* parked until a retry gives it back */
    CHECK_OK(um_trim(ctx, 1));
    CHECK_OK(um_stats_get(ctx, 1, &st));
    CHECK_EQ(st.reserved_bytes, (size_t)0);
    um_shutdown(ctx);
}

/* Host memory allocated on streams of two sim devices and freed with no
 * stream after its stream was destroyed, with event calls failing at
 * random: such a free is ordered on the default stream, but the thread
 * cache's bin kept the destroyed stream's id. A later flush fenced the
 * slot on that id's state, and once a stream of the other device took the
 * id, a host event was queried and destroyed through that device's
 * backend ("not a live event of this device"; at shutdown the host
 * reported 1 event and sim2 -1 not given back). Found by the ninth audit;
 * the seeds are ones that showed it. */
static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void test_free_after_stream_destroyed(void)
{
    static const unsigned seeds[] = {4, 6, 7, 9, 10};
    enum { NS = 6, MAXLIVE = 200, STEPS = 30000 };
    for (size_t si = 0; si < sizeof seeds / sizeof seeds[0]; si++) {
        char conf[160];
        snprintf(conf, sizeof conf,
                 "devices=sim:256M+sim:256M,fault=event~0.3,fault_seed=%u,log_level=error",
                 seeds[si]);
        uint64_t leaks = um__fault_leaks_total();
        um_context *ctx = NULL;
        CHECK_OK(um_init(conf, &ctx));
        if (!ctx)
            return;
        um_stream st[NS];
        int sdev[NS];
        for (int k = 0; k < NS; k++) {
            sdev[k] = 1 + k % 2;
            CHECK_OK(um_stream_create(ctx, sdev[k], &st[k]));
        }
        static void *live[MAXLIVE];
        int nl = 0, fails = 0;
        uint64_t r0 = seeds[si] * 2654435761u + 1;
        for (int step = 0; step < STEPS; step++) {
            uint64_t r = xorshift(&r0);
            int k = (int)((r >> 8) % NS);
            unsigned op = (unsigned)(r % 100);
            if (op < 35 && nl < MAXLIVE) {
                size_t n = (r >> 20) % 4 ? 256 + (r >> 24) % 60000 : MB + (r >> 24) % (4 * MB);
                void *p = NULL;
                fails += um_malloc(ctx, 0, n, (r >> 50) % 3 ? st[k] : NULL, &p) != UM_OK;
                if (p)
                    live[nl++] = p;
            } else if (op < 85 && nl) {
                int i = (int)((r >> 20) % (uint64_t)nl);
                void *p = live[i];
                live[i] = live[--nl];
                fails += um_free(ctx, p, (r >> 40) % 2 ? st[k] : NULL) != UM_OK;
            } else if (op < 97) {
                fails += um_sim_stream_work(ctx, sdev[k], st[k], (unsigned)(r >> 32) % 3,
                                            (unsigned)(r >> 40) % 3) != UM_OK;
            } else {
                fails += um_stream_destroy(ctx, st[k]) != UM_OK;
                fails += um_stream_create(ctx, sdev[k], &st[k]) != UM_OK;
            }
        }
        for (int i = 0; i < nl; i++)
            fails += um_free(ctx, live[i], NULL) != UM_OK;
        for (int k = 0; k < NS; k++)
            fails += um_stream_destroy(ctx, st[k]) != UM_OK;
        um_shutdown(ctx);
        if (fails || um__fault_leaks_total() != leaks)
            printf("test_free_after_stream_destroyed: seed %u: %d calls failed, %llu backends "
                   "reported leaks\n",
                   seeds[si], fails, (unsigned long long)(um__fault_leaks_total() - leaks));
        CHECK_EQ(fails, 0);
        CHECK_EQ(um__fault_leaks_total(), leaks);
    }
}

int main(void)
{
    unsetenv("UNIMEM_CONF");
    test_bad_specs();
    test_rules_count_apart();
    test_null_event_destroy();
    test_physical_after_unmap();
    test_trim_past_refused_release();
    test_trim_when_stream_cannot_be_waited_for();
    test_direct_free_parks_refused_release();
    test_free_after_stream_destroyed();
    every_position("pool", seq_pool, "any");
    every_position("buffers", seq_buffers, "any");
    random_faults("pool", seq_pool);
    random_faults("buffers", seq_buffers);
    g_links = ",sim_link_bandwidth=100G,links=model";
    /* What the links add is copies with fences: their event calls. Not
     * under ThreadSanitizer, which took this test from about 13 to 20
     * minutes with it (its 25 minute limit in sight) and has no threads to
     * watch in it that the runs above lack; ASan and the plain build run it. */
#if defined(__SANITIZE_THREAD__)
    const bool tsan = true;
#elif defined(__has_feature)
    const bool tsan = __has_feature(thread_sanitizer);
#else
    const bool tsan = false;
#endif
    if (tsan)
        printf("test_faults: the modelled-link run is skipped under ThreadSanitizer\n");
    else
        every_position("buffers on modelled links", seq_buffers, "event");
    return harness_finish("test_faults");
}
