/* Tests of the event recorder of `trace_file` (src/trace/events.c) through
 * its internal calls: what the JSON writer makes of events recorded out of
 * order, and the recorder's bookkeeping when threads come and go. The
 * recorder's tests through a context are in test_context.c. */
#include "harness.h"
#include "trace/events.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
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
static uint64_t ticks_per_ms(const um__events *e)
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

int main(void)
{
    test_long_spans();
    test_held_in_order();
    test_held_keep_order();
    test_two_recorders();
    return harness_finish("test_events");
}
