/* Tests of the event recorder of `trace_file` (src/trace/events.c) through
 * its internal calls: what the JSON writer makes of events recorded out of
 * order, and the recorder's bookkeeping when threads come and go. The
 * recorder's tests through a context are in test_context.c. */
#include "base/vtime.h"
#include "harness.h"
#include "trace/events.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* The whole file at path, in a static buffer. */
static const char *slurp(const char *path)
{
    static char text[1 << 24];
    return harness_slurp(path, text, sizeof text);
}

/* A recorder of two devices writing to a new file made from the mkstemp
 * template path; NULL, with a failed check, when it cannot be made. */
static um__events *open_temp(char *path)
{
    if (!harness_temp_file(path))
        return NULL;
    um__events *e = um__events_open(path, 2);
    CHECK(e != NULL);
    return e;
}

/* The recorder's ticks in a millisecond, measured over 20 ms. */
static uint64_t ticks_per_ms(um__events *e)
{
    uint64_t c0 = um__events_clock(e), n0 = um__now_ns();
    usleep(20000);
    uint64_t c1 = um__events_clock(e), n1 = um__now_ns();
    return (uint64_t)((double)(c1 - c0) * 1e6 / (double)(n1 - n0));
}

/* A free of a block never allocated is held for 1 ms, waiting for its
 * allocation, and an allocation recorded 0.5 ms after it is written
 * first. The held free must then not go back in time: before, it was
 * written at its own time after that allocation, with a counter sample
 * holding the allocation's 100 bytes at a time before the allocation, so
 * a viewer (which orders samples by time) drew 100 bytes live from there. */
static void test_held_in_order(void)
{
    char path[] = "/tmp/unimem_test_events_held_XXXXXX";
    um__events *e = open_temp(path);
    if (!e)
        return;
    uint64_t ms = ticks_per_ms(e), t = um__events_clock(e);
    um__event_instant_at(e, UM_EVENT_FREE, 1, t, 0, 0x9000); /* never allocated */
    um__event_instant_at(e, UM_EVENT_ALLOC, 1, t + ms / 2, 100, 0x1000);
    um__event_instant_at(e, UM_EVENT_ALLOC, 1, t + 5 * ms, 200, 0x2000);
    um__event_instant_at(e, UM_EVENT_FREE, 1, t + 6 * ms, 0, 0x1000);
    um__events_close(e);
    const char *text = slurp(path);
    /* Every instant and counter sample of device 1, in the file's order:
     * times never decrease, and each sample's live bytes are those of the
     * events before it. */
    static const char *const want_name[] = {"alloc", "free", "alloc", "free"};
    static const unsigned long long want_bytes[] = {100, 0, 200, 100};
    static const unsigned long long want_live[] = {100, 100, 300, 200};
    static const char sample_head[] = "{\"name\":\"memory\",\"ph\":\"C\"";
    int instants = 0, samples = 0;
    double last_ts = -1e30;
    for (const char *c = text; (c = strstr(c, "{\"name\":\"")); c++) {
        const char *ts = strstr(c, "\"ts\":"), *end = strchr(c, '}');
        bool instant = strstr(c, "\"cat\":\"memory\"") && strstr(c, "\"cat\":\"memory\"") < end;
        bool sample = strncmp(c, sample_head, strlen(sample_head)) == 0;
        if (!instant && !sample)
            continue;
        double at = ts ? strtod(ts + 5, NULL) : -1e30;
        CHECK(at >= last_ts);
        last_ts = at;
        if (instant && instants < 4) {
            const char *bytes = strstr(c, "\"bytes\":");
            CHECK(strncmp(c + 9, want_name[instants], strlen(want_name[instants])) == 0);
            CHECK_EQ(bytes ? strtoull(bytes + 8, NULL, 10) : 12345, want_bytes[instants]);
            instants++;
        } else if (sample && samples < 4) {
            const char *live = strstr(c, "\"live\":");
            CHECK_EQ(live ? strtoull(live + 7, NULL, 10) : 12345, want_live[samples]);
            samples++;
        }
    }
    CHECK_EQ(instants, 4);
    CHECK_EQ(samples, 4);
    remove(path);
}

/* Three lives of block x recorded with their frees late (allocations of
 * 100, 200 and 300 bytes, then three frees), while a free of block y
 * waits for y's allocation. y's allocation comes between, and the held
 * events must keep their order: before, taking y's free out of the held
 * list moved x's allocation of 300 in front of that of 200, and the trace
 * showed 300 bytes live where 200 were. */
static void test_held_keep_order(void)
{
    char path[] = "/tmp/unimem_test_events_keep_XXXXXX";
    um__events *e = open_temp(path);
    if (!e)
        return;
    uint64_t t = um__events_clock(e);
    const uint64_t x = 0x10000, y = 0x20000;
    um__event_instant_at(e, UM_EVENT_FREE, 1, t, 0, y); /* before its allocation */
    um__event_instant_at(e, UM_EVENT_ALLOC, 1, t + 10, 100, x);
    um__event_instant_at(e, UM_EVENT_ALLOC, 1, t + 20, 200, x); /* before the frees */
    um__event_instant_at(e, UM_EVENT_ALLOC, 1, t + 30, 300, x);
    um__event_instant_at(e, UM_EVENT_ALLOC, 1, t + 40, 7, y);
    for (int i = 0; i < 3; i++)
        um__event_instant_at(e, UM_EVENT_FREE, 1, t + 50 + 10 * (uint64_t)i, 0, x);
    um__events_close(e);
    const char *text = slurp(path);
    /* x's events in the file's order, with the bytes each names. */
    static const char *const want_name[] = {"alloc", "free", "alloc", "free", "alloc", "free"};
    static const unsigned long long want_bytes[] = {100, 100, 200, 200, 300, 300};
    int n = 0;
    for (const char *c = text; (c = strstr(c, "\"block\":\"0x10000\"")); c++) {
        const char *start = c;
        while (start > text && strncmp(start, "{\"name\":\"", 9) != 0)
            start--;
        const char *bytes = strstr(start, "\"bytes\":");
        if (n < 6) {
            CHECK(strncmp(start + 9, want_name[n], strlen(want_name[n])) == 0);
            CHECK_EQ(bytes ? strtoull(bytes + 8, NULL, 10) : 12345, want_bytes[n]);
        }
        n++;
    }
    CHECK_EQ(n, 6);
    remove(path);
}

/* Span durations: 32 bits of ns hold 4.29 s, of microseconds 71.6
 * minutes; a task or a wait in virtual time can last longer. Before, a
 * span of 5000 s came out as 4294.967295 s. */
static void test_long_spans(void)
{
    char path[] = "/tmp/unimem_test_events_long_XXXXXX";
    um__events *e = open_temp(path);
    if (!e)
        return;
    static const uint64_t s = 1000000000ull;
    /* ns kept exactly; above 4.29 s, microseconds; above 71.6 min, ms. */
    static const uint64_t dur_ns[] = {3 * s + 123456789ull, 10 * s + 123456789ull, 5000 * s,
                                      40ull * 86400 * s + 7000000ull};
    static const char *const want[] = {"\"dur\":3123456.789,", "\"dur\":10123456.000,",
                                       "\"dur\":5000000000.000,", "\"dur\":3456000007000.000,"};
    uint64_t now = um__now_ns();
    for (int i = 0; i < 4; i++)
        um__event_add(e, UM_EVENT_RECLAIM_RUN, 1, -1, now - dur_ns[i], dur_ns[i], (uint64_t)i, 0);
    um__events_close(e);
    const char *text = slurp(path);
    for (int i = 0; i < 4; i++) {
        char args[64];
        snprintf(args, sizeof args, "\"args\":{\"bytes_before\":%d,", i);
        const char *span = strstr(text, args);
        while (span && span > text && strncmp(span, "{\"name\"", 8) != 0)
            span--;
        const char *dur = span ? strstr(span, want[i]) : NULL;
        if (!dur || dur > strstr(span, args))
            printf("test_long_spans: span %d has no %s\n", i, want[i]);
        CHECK(dur && dur < strstr(span, args));
    }
    remove(path);
}

/* Threads that record into two recorders in turn, then, after one of
 * them was closed and another opened (at the same address where malloc
 * gives it back), into the new one, and exit with events buffered in
 * both: every event reaches its own file once. This covers the thread-local
 * cache of a thread's buffer (a recorder's generation tells a new one at
 * an old address apart) and the hand-over at a thread's exit; run it under
 * ThreadSanitizer too. No bug was found here; it guards what was checked. */
#define TWO_THREADS 4
#define TWO_PAIRS 3000
static um__events *two[2];
static pthread_barrier_t two_barrier;

static void *two_main(void *arg)
{
    uint64_t id = (uint64_t)(uintptr_t)arg;
    for (uint64_t i = 0; i < TWO_PAIRS; i++) {
        uint64_t a = id << 40 | i << 8;
        um__event_instant(two[i & 1], UM_EVENT_ALLOC, 1, 64, a);
        um__event_instant(two[i & 1], UM_EVENT_FREE, 1, 0, a);
    }
    pthread_barrier_wait(&two_barrier); /* the main thread replaces two[0] */
    pthread_barrier_wait(&two_barrier);
    for (uint64_t i = 0; i < TWO_PAIRS; i++) {
        uint64_t a = id << 40 | i << 8 | 1;
        um__event_instant(two[i & 1], UM_EVENT_ALLOC, 1, 64, a);
        um__event_instant(two[i & 1], UM_EVENT_FREE, 1, 0, a);
    }
    return NULL;
}

static long count_in(const char *path, const char *what)
{
    long n = 0;
    for (const char *c = slurp(path); (c = strstr(c, what)); c++)
        n++;
    return n;
}

static void test_two_recorders(void)
{
    char path[3][40];
    for (int i = 0; i < 3; i++) {
        snprintf(path[i], sizeof path[i], "/tmp/unimem_test_events_two_XXXXXX");
        if (!harness_temp_file(path[i]))
            return;
    }
    two[0] = um__events_open(path[0], 2);
    two[1] = um__events_open(path[1], 2);
    CHECK(two[0] && two[1]);
    if (!two[0] || !two[1])
        return;
    pthread_barrier_init(&two_barrier, NULL, TWO_THREADS + 1);
    pthread_t th[TWO_THREADS];
    for (int i = 0; i < TWO_THREADS; i++)
        CHECK(pthread_create(&th[i], NULL, two_main, (void *)(uintptr_t)(i + 1)) == 0);
    pthread_barrier_wait(&two_barrier);
    um__events_close(two[0]);
    two[0] = um__events_open(path[2], 2);
    CHECK(two[0] != NULL);
    pthread_barrier_wait(&two_barrier);
    for (int i = 0; i < TWO_THREADS; i++)
        pthread_join(th[i], NULL);
    um__events_close(two[0]);
    um__events_close(two[1]);
    pthread_barrier_destroy(&two_barrier);
    const long half = TWO_THREADS * TWO_PAIRS / 2;
    CHECK_EQ(count_in(path[0], "{\"name\":\"alloc\""), half);
    CHECK_EQ(count_in(path[0], "{\"name\":\"free\""), half);
    CHECK_EQ(count_in(path[1], "{\"name\":\"alloc\""), 2 * half);
    CHECK_EQ(count_in(path[2], "{\"name\":\"free\""), half);
    /* Every block's free found its size: nothing is left live. */
    CHECK_EQ(count_in(path[1], "\"bytes\":0,"), 0);
    for (int i = 0; i < 3; i++)
        remove(path[i]);
}

/* One allocation's or free's instant, or one counter sample, of the
 * trace: the fields the tests below look at (0 where a record has none). */
typedef struct trace_rec {
    bool instant, sample, alloc;
    double ts;
    long pid;
    unsigned long long bytes, live, block;
} trace_rec;

/* The record that starts at c ("{\"name\":..."), if it is an instant of
 * category memory or a counter sample; false for any other. */
static bool trace_rec_at(const char *c, trace_rec *r)
{
    static const char sample_head[] = "{\"name\":\"memory\",\"ph\":\"C\"";
    const char *end = strstr(c, "}}");
    const char *cat = strstr(c, "\"cat\":\"memory\"");
    *r = (trace_rec){.pid = -1};
    r->instant = cat && end && cat < end;
    r->sample = strncmp(c, sample_head, strlen(sample_head)) == 0;
    if (!r->instant && !r->sample)
        return false;
    r->alloc = strncmp(c, "{\"name\":\"alloc\"", 15) == 0;
    const char *ts = strstr(c, "\"ts\":"), *pid = strstr(c, "\"pid\":");
    const char *bytes = strstr(c, "\"bytes\":"), *live = strstr(c, "\"live\":");
    const char *block = strstr(c, "\"block\":\"0x");
    r->ts = ts && ts < end ? strtod(ts + 5, NULL) : -1e30;
    r->pid = pid && pid < end ? strtol(pid + 6, NULL, 10) : -1;
    r->bytes = bytes && bytes < end ? strtoull(bytes + 8, NULL, 10) : 0;
    r->live = live && live < end ? strtoull(live + 7, NULL, 10) : 0;
    r->block = block && block < end ? strtoull(block + 11, NULL, 16) : 0;
    return true;
}

/* The auditor's scenario in virtual time, where the clock stands still
 * while no device works and every event below reads the same time: the
 * main thread allocates block x (2 MiB) and frees it, a second thread
 * allocates 1.5 MiB, which bufcache serves at x's address, and exits, the
 * clock moves on 50 ms, and the main thread frees it. The writer orders
 * equal times by the order in which the threads' buffers reached it, and
 * the second thread's, handed over at its exit, came first: the trace
 * showed the allocation of 1.5 MiB before the first allocation, a free of
 * 1.5 MiB while 2 MiB were live, 2 MiB live for the 50 ms and a final free
 * of 2 MiB. Without the TSC every clock read now has a time of its own, in
 * the order the reads happened. */
static um_context *reuse_ctx;
static void *reuse_block;

static void *reuse_main(void *arg)
{
    (void)arg;
    CHECK_OK(um_malloc(reuse_ctx, 1, 3 << 19, NULL, &reuse_block));
    return NULL;
}

static void test_virtual_time_reuse(void)
{
    char path[] = "/tmp/unimem_test_events_vtreuse_XXXXXX";
    if (!harness_temp_file(path))
        return;
    char conf[192];
    snprintf(conf, sizeof conf,
             "devices=sim:2x1G,virtual_time=1,allocator=bufcache,log_level=error,trace_file=%s",
             path);
    CHECK_OK(um_init(conf, &reuse_ctx));
    if (!reuse_ctx)
        return;
    uint64_t opened_ns = um__now_ns();
    void *x = NULL;
    CHECK_OK(um_malloc(reuse_ctx, 1, 2 << 20, NULL, &x));
    CHECK_OK(um_free(reuse_ctx, x, NULL));
    pthread_t th;
    CHECK(pthread_create(&th, NULL, reuse_main, NULL) == 0);
    pthread_join(th, NULL);
    /* The case needs the address reused; bufcache hands the cached block
     * to the next allocation it fits. */
    CHECK(reuse_block == x);
    um__sleep_until_ns(um__now_ns() + 50000000);
    uint64_t freed_ns = um__now_ns() - opened_ns;
    CHECK_OK(um_free(reuse_ctx, reuse_block, NULL));
    um_shutdown(reuse_ctx);
    reuse_ctx = NULL;

    /* x's events in the file's order, and device 1's live bytes at each
     * of its samples, a run of equal values counted once. Device 1 has no
     * other blocks. */
    static const bool want_alloc[] = {true, false, true, false};
    static const unsigned long long want_bytes[] = {2 << 20, 2 << 20, 3 << 19, 3 << 19};
    static const unsigned long long want_live[] = {0, 2 << 20, 0, 3 << 19, 0};
    const char *text = slurp(path);
    int nx = 0, nlive = 0;
    unsigned long long live[16];
    double last_ts = -1e30, last_free_ts = -1;
    trace_rec r;
    for (const char *c = text; (c = strstr(c, "{\"name\":\"")); c++) {
        if (!trace_rec_at(c, &r) || r.pid != 1)
            continue;
        CHECK(r.ts >= last_ts);
        last_ts = r.ts;
        if (r.instant && r.block == (uintptr_t)x) {
            if (nx < 4) {
                if (r.alloc != want_alloc[nx] || r.bytes != want_bytes[nx])
                    printf("test_virtual_time_reuse: event %d of x is %s of %llu bytes at %.3f us; "
                           "want %s of %llu\n",
                           nx, r.alloc ? "an alloc" : "a free", r.bytes, r.ts,
                           want_alloc[nx] ? "an alloc" : "a free", want_bytes[nx]);
                CHECK(r.alloc == want_alloc[nx]);
                CHECK_EQ(r.bytes, want_bytes[nx]);
            }
            if (!r.alloc)
                last_free_ts = r.ts;
            nx++;
        } else if (r.sample && (!nlive || live[nlive - 1] != r.live) && nlive < 16) {
            live[nlive++] = r.live;
        }
    }
    CHECK_EQ(nx, 4);
    CHECK_EQ(nlive, 5);
    for (int i = 0; i < nlive && i < 5; i++)
        CHECK_EQ(live[i], want_live[i]);
    /* The times stay those of the clock: the unique ones run ahead of it
     * by a nanosecond an event at most, a few events here. */
    CHECK(last_free_ts * 1000 >= (double)freed_ns);
    CHECK(last_free_ts * 1000 <= (double)freed_ns + 1000);
    remove(path);
}

/* A trace whose name is the longest a file's may be (255 bytes): the
 * spill file's name was the trace's with ".rawXXXXXX" added, too long, so
 * um_init failed and left the trace truncated to nothing. The spill file
 * now has a short name of its own in the same directory, and nothing of
 * it stays there. The name is relative (the option holds 255 bytes), so
 * the case runs in a directory of its own. */
static void test_long_trace_name(void)
{
    char dir[] = "/tmp/unimem_test_events_dir_XXXXXX", cwd[PATH_MAX];
    CHECK(mkdtemp(dir) != NULL);
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    char name[256];
    memset(name, 'a', 250);
    strcpy(name + 250, ".json");
    char conf[320];
    snprintf(conf, sizeof conf, "devices=sim:64M,log_level=error,trace_file=%s", name);
    CHECK_EQ(chdir(dir), 0);
    um_context *ctx = NULL;
    CHECK_OK(um_init(conf, &ctx));
    if (ctx) {
        void *p = NULL;
        CHECK_OK(um_malloc(ctx, 1, 4096, NULL, &p));
        CHECK_OK(um_free(ctx, p, NULL));
        um_shutdown(ctx);
    }
    CHECK_EQ(chdir(cwd), 0);
    char path[sizeof dir + sizeof name];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    const char *text = slurp(path);
    static const char head[] = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[";
    size_t len = strlen(text);
    CHECK(strncmp(text, head, strlen(head)) == 0);
    CHECK(len > 4 && strcmp(text + len - 4, "\n]}\n") == 0);
    CHECK_EQ(count_in(path, "{\"name\":\"alloc\""), 1);
    CHECK_EQ(count_in(path, "{\"name\":\"free\""), 1);
    remove(path);
    CHECK_EQ(rmdir(dir), 0); /* nothing else was left there */
}

/* A recorder that cannot open its trace must leave a file already at
 * the path as it was. The trace was opened (and truncated) first, so a
 * spill file that could not be made then left it empty. A directory
 * without write permission does not stop root, so here the process has a
 * single descriptor left: the recorder's first file takes it, the second
 * cannot be opened. */
static void test_failed_open_keeps_file(void)
{
    char dir[] = "/tmp/unimem_test_events_keep_dir_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[sizeof dir + 16];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    static const char old_text[] = "an earlier trace\n";
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fputs(old_text, f);
    fclose(f);

    struct rlimit saved, few;
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
    few = saved;
    few.rlim_cur = saved.rlim_cur < 256 ? saved.rlim_cur : 256;
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &few), 0);
    int fds[256], nfds = 0;
    while (nfds < 256 && (fds[nfds] = open("/dev/null", O_RDONLY)) >= 0)
        nfds++;
    CHECK(nfds > 0 && nfds < 256 && errno == EMFILE);
    if (nfds > 0)
        close(fds[--nfds]); /* the one descriptor left */
    um__events *e = um__events_open(path, 2);
    while (nfds > 0)
        close(fds[--nfds]);
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
    CHECK(e == NULL);
    if (e)
        um__events_close(e);
    else
        CHECK_ERROR_MENTIONS("trace_file", "trace.json", NULL);
    CHECK(strcmp(slurp(path), old_text) == 0);
    remove(path);
    CHECK_EQ(rmdir(dir), 0); /* and no spill file was left there */
}

int main(void)
{
    test_long_spans();
    test_held_in_order();
    test_held_keep_order();
    test_two_recorders();
    test_virtual_time_reuse();
    test_long_trace_name();
    test_failed_open_keeps_file();
    return harness_finish("test_events");
}
