/* Tests of `unimem replay` (tools/cmd_replay.c) through the built binary:
 * the JSON figures on the bundled GPT-2 trace, exact figures of the
 * baselines and their minimum limits on a small trace worked out by hand,
 * failed allocations under --limit, and the exit codes and messages of a
 * corrupt trace, of bogus ones (live bytes past 2^64, no events) and of bad
 * arguments, and the time to read a trace with many streams. */
#include "harness.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BINARY UM_BINARY_DIR "/unimem"
#define BUNDLED UM_SOURCE_DIR "/data/gpt2_train.trace.gz"
#define MiB (1024.0 * 1024.0)

static char out[1 << 16];

/* Runs `unimem <args>` with stderr on stdout too when both; returns the
 * exit status (-1 if it did not exit). */
static int run(const char *args, bool both)
{
    return harness_run_unimem(args, both, out, sizeof out);
}

/* Where the value of "key" starts in out, inside the object of `section`
 * ("direct", "bufcache") or at the top level (NULL); NULL if missing. */
static const char *value_of(const char *section, const char *key)
{
    const char *from = out;
    const char *end = strstr(out, "\"baselines\"");
    if (section) {
        char sec[64];
        snprintf(sec, sizeof sec, "\"%s\": {", section);
        from = end ? strstr(end, sec) : NULL;
        if (!from)
            return NULL;
        end = strchr(from, '}');
    }
    char k[64];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char *at = strstr(from, k);
    if (!at || (end && at > end))
        return NULL;
    return at + strlen(k);
}

/* The number, or NAN for null or a missing key. */
static double field(const char *section, const char *key)
{
    const char *v = value_of(section, key);
    return v && strncmp(v, "null", 4) ? strtod(v, NULL) : NAN;
}

static bool is_null(const char *section, const char *key)
{
    const char *v = value_of(section, key);
    return v && !strncmp(v, "null", 4);
}

static void expect_field(int line, const char *section, const char *key, double want)
{
    double got = field(section, key);
    harness_checks++;
    if (!(got == want))
        harness_report(__FILE__, line, "%s%s%s = %.17g, expected %.17g", section ? section : "",
                       section ? "." : "", key, got, want);
}
#define EXPECT_FIELD(section, key, want) expect_field(__LINE__, section, key, want)

static void test_bundled(void)
{
    CHECK_EQ(run("replay --json " BUNDLED, false), 0);
    CHECK(out[0] == '{' && strstr(out, "}}\n") != NULL);
    CHECK(strstr(out, "\"trace\": \"gpt2_train.trace.gz\"") != NULL);
    EXPECT_FIELD(NULL, "events", 12355);
    EXPECT_FIELD(NULL, "allocs", 6179);
    EXPECT_FIELD(NULL, "frees", 6176);
    EXPECT_FIELD(NULL, "peak_live_bytes", 13594206920.0);
    const double live = 13594206920.0;
    static const char *const sections[] = {NULL, "direct", "bufcache"};
    for (int i = 0; i < 3; i++) {
        const char *s = sections[i];
        double reserved = field(s, "peak_reserved_bytes");
        double ratio = field(s, "reserved_over_live");
        if (!(reserved >= live && reserved < 3 * live))
            fprintf(stderr, "%s: peak reserved %.0f\n", s ? s : "pool", reserved);
        CHECK(reserved >= live && reserved < 3 * live);
        CHECK(fabs(ratio - reserved / live) < 1e-4);
        EXPECT_FIELD(s, "failed_allocs", 0);
        CHECK(field(s, "backend_calls") > 0);
        CHECK(field(s, "ns_per_event") > 0);
        CHECK(is_null(s, "min_limit_bytes"));
        CHECK(is_null(s, "min_limit_over_live"));
    }
    /* No cache: 3 backend calls per allocation and per free, and a wait
     * for the free's stream before each of its 6,176 frees, nothing else
     * (the trace uses only the default stream). */
    EXPECT_FIELD("direct", "backend_calls", 3 * 12355 + 6176);
    /* The cache saves most of them. */
    CHECK(field("bufcache", "backend_calls") < field("direct", "backend_calls") / 4);

    /* Under a limit below the peak live bytes, allocations fail and are
     * counted, and the run still finishes. */
    CHECK_EQ(run("replay --json --limit 8G " BUNDLED, false), 0);
    EXPECT_FIELD(NULL, "memory_limit_bytes", 8589934592.0);
    for (int i = 0; i < 3; i++) {
        CHECK(field(sections[i], "failed_allocs") > 0);
        CHECK(field(sections[i], "peak_reserved_bytes") <= 8589934592.0);
    }

    /* The table names the three rows. */
    CHECK_EQ(run("replay " BUNDLED, false), 0);
    CHECK(strstr(out, "gpt2_train.trace.gz: 12355 events (6179 allocs, 6176 frees)") != NULL);
    CHECK(strstr(out, "13594206920 bytes") != NULL);
    CHECK(strstr(out, "unimem pool") != NULL);
    CHECK(strstr(out, "no cache") != NULL);
    CHECK(strstr(out, "MLX-style bufcache") != NULL);
}

/* A 5-event trace whose figures are known: the blocks take 4, 2 and 6 MiB
 * of 2 MiB pages; peak live is 1 + 5 = 6 MiB of requests. direct peaks at
 * 2 + 6 = 8 MiB of pages. bufcache keeps the freed 4 MiB buffer (too small
 * for 5 MiB) and peaks at 12 MiB unlimited, but runs in 8 MiB by releasing
 * it. */
static void test_min_limit(const char *dir)
{
    char path[160], args[256];
    snprintf(path, sizeof path, "%s/small.trace", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fputs("# hand-made\na 1 3145728 0\na 2 1048576 0\nf 1\na 3 5242880 0\nf 2\nf 3\n", f);
    fclose(f);
    snprintf(args, sizeof args, "replay --json --min-limit %s", path);
    CHECK_EQ(run(args, false), 0);
    EXPECT_FIELD(NULL, "peak_live_bytes", 6 * MiB);
    EXPECT_FIELD("direct", "peak_reserved_bytes", 8 * MiB);
    EXPECT_FIELD("direct", "min_limit_bytes", 8 * MiB);
    CHECK(fabs(field("direct", "min_limit_over_live") - 8.0 / 6.0) < 1e-4);
    EXPECT_FIELD("direct", "backend_calls", 21); /* 3 + 4 for each of 3 blocks */
    EXPECT_FIELD("bufcache", "peak_reserved_bytes", 12 * MiB);
    EXPECT_FIELD("bufcache", "min_limit_bytes", 8 * MiB);
    EXPECT_FIELD("bufcache", "backend_calls", 9);
    double pool_min = field(NULL, "min_limit_bytes");
    CHECK(pool_min >= 6 * MiB && pool_min <= field(NULL, "peak_reserved_bytes") + 2 * MiB);

    /* Under --limit 6M allocations fail in every run; the min limits still
     * come from unlimited bounds. */
    snprintf(args, sizeof args, "replay --json --min-limit --limit 6M %s", path);
    CHECK_EQ(run(args, false), 0);
    CHECK(field("direct", "failed_allocs") >= 1);
    EXPECT_FIELD("direct", "min_limit_bytes", 8 * MiB);
    EXPECT_FIELD("bufcache", "min_limit_bytes", 8 * MiB);

    /* On the host device too. */
    snprintf(args, sizeof args, "replay --json --device host %s", path);
    CHECK_EQ(run(args, false), 0);
    EXPECT_FIELD(NULL, "peak_live_bytes", 6 * MiB);
    CHECK(strstr(out, "\"device\": \"host\"") != NULL);
    unlink(path);
}

static void test_errors(const char *dir)
{
    char path[160], args[256], want[256];
    snprintf(path, sizeof path, "%s/corrupt.trace", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fputs("a 1 512 0\na 2 1024 0\nf 1\nf 9\n", f);
    fclose(f);
    snprintf(args, sizeof args, "replay --json %s", path);
    CHECK_EQ(run(args, true), 1);
    snprintf(want, sizeof want, "unimem replay: UM_ERR_PARSE: %s:4: free of unknown id 9", path);
    CHECK(strstr(out, want) != NULL);
    if (!strstr(out, want))
        fprintf(stderr, "  got: %s\n", out);
    CHECK(strchr(out, '{') == NULL); /* no JSON for a bad trace */
    unlink(path);

    snprintf(args, sizeof args, "replay %s/missing.trace.gz", dir);
    CHECK_EQ(run(args, true), 1);
    CHECK(strstr(out, "UM_ERR_IO") != NULL);

    /* Argument errors: usage and exit code 2. */
    CHECK_EQ(run("replay", true), 2);
    CHECK(strstr(out, "usage: unimem replay FILE") != NULL);
    CHECK_EQ(run("replay " BUNDLED " --limit lots", true), 2);
    CHECK(strstr(out, "bad --limit 'lots'") != NULL);
    CHECK_EQ(run("replay " BUNDLED " --limit", true), 2);
    CHECK_EQ(run("replay " BUNDLED " --frobnicate", true), 2);
    CHECK_EQ(run("replay " BUNDLED " " BUNDLED, true), 2);
    CHECK_EQ(run("replay " BUNDLED " --device sim:lots", true), 2);
    CHECK(strstr(out, "UM_ERR_BAD_OPTION") != NULL);
    CHECK_EQ(run("replay --help", false), 0);
    CHECK(strstr(out, "--min-limit") != NULL && strstr(out, "--lag N") != NULL);
    CHECK_EQ(run("replay " BUNDLED " --lag 0", true), 2);
    CHECK(strstr(out, "bad --lag '0'") != NULL);
    CHECK_EQ(run("replay " BUNDLED " --lag -3", true), 2);
    CHECK_EQ(run("replay " BUNDLED " --lag", true), 2);
    /* A device with no simulated work to trail. */
    CHECK_EQ(run("replay " BUNDLED " --lag 10 --device host", true), 1);
    CHECK(strstr(out, "sim devices") != NULL);
}

/* Traces that are well formed line by line but bogus as a whole: live
 * bytes past 2^64 (they once wrapped around to a small peak) and no events
 * at all (once a table of zeros with exit code 0). Both are bad input:
 * exit code 1, the problem named, no JSON. */
static void test_bogus_traces(const char *dir)
{
    char path[160], args[256], want[512];
    snprintf(path, sizeof path, "%s/overflow.trace", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fputs("a 1 9223372036854775808 0\na 2 9223372036854775808 0\nf 1\nf 2\n", f);
    fclose(f);
    snprintf(args, sizeof args, "replay --json %s", path);
    CHECK_EQ(run(args, true), 1);
    snprintf(want, sizeof want,
             "unimem replay: %s:2: the live bytes pass 2^64 (9223372036854775808 live, an "
             "allocation of 9223372036854775808)",
             path);
    CHECK(strstr(out, want) != NULL);
    if (!strstr(out, want))
        fprintf(stderr, "  got: %s\n", out);
    CHECK(strchr(out, '{') == NULL);
    unlink(path);

    /* Up to 2^64 - 1 live bytes is a trace the replay can count. */
    f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fputs("a 1 9223372036854775808 0\na 2 9223372036854775807 0\nf 1\nf 2\n", f);
    fclose(f);
    CHECK_EQ(run(args, false), 0);
    EXPECT_FIELD(NULL, "peak_live_bytes", 18446744073709551615.0);
    CHECK(strstr(out, "\"peak_live_bytes\": 18446744073709551615,") != NULL);
    unlink(path);

    snprintf(path, sizeof path, "%s/comments.trace", dir);
    f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fputs("# a trace with no events\n", f);
    fclose(f);
    const char *const empty[] = {"/dev/null", path};
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "replay --min-limit %s", empty[i]);
        CHECK_EQ(run(args, true), 1);
        snprintf(want, sizeof want, "unimem replay: %s has no events", empty[i]);
        CHECK(strstr(out, want) != NULL);
        if (!strstr(out, want))
            fprintf(stderr, "  got: %s\n", out);
        CHECK(strstr(out, "peak live") == NULL); /* no table */
    }
    unlink(path);
}

/* --lag: the device finishes each event's work 100 events late. Frees of
 * the last 100 events stay fenced, so the no-cache baseline (which waits
 * for nothing) and unimem's pool (which learns a plan while waiting for
 * fences) still replay every allocation, with the pool's peak reserved no
 * higher than without lag beyond 1% (it may be lower: the plan learnt
 * differs) and at least the peak live bytes. The lag holds after
 * the allocators' waits: the pool's streams trail by nearly 100 units on
 * average, the no-cache baseline's (which waits for its stream at every
 * free) by far fewer. */
static void test_lag(void)
{
    CHECK_EQ(run("replay --json " BUNDLED, false), 0);
    double base = field(NULL, "peak_reserved_bytes");
    CHECK(is_null(NULL, "lag_mean_queued"));
    CHECK_EQ(run("replay --json --lag 100 " BUNDLED, false), 0);
    CHECK_EQ(field(NULL, "failed_allocs"), 0);
    double lagged = field(NULL, "peak_reserved_bytes");
    CHECK(lagged >= field(NULL, "peak_live_bytes") && lagged <= base * 1.01);
    CHECK_EQ(field("direct", "failed_allocs"), 0);
    double pool_lag = field(NULL, "lag_mean_queued"), direct_lag = field("direct", "lag_mean_queued");
    CHECK(pool_lag >= 90 && pool_lag <= 100);
    CHECK(direct_lag < 0.5 * pool_lag);
    printf("test_replay: --lag 100 trails by %.2f units (pool), %.2f (no cache)\n", pool_lag,
           direct_lag);
}

/* --lag counts events over all streams: a block of 64 MiB allocated and
 * freed on a side stream, 20 small blocks on stream 0, then 64 MiB on stream
 * 0. The side stream's two units are done `lag` events after theirs, so
 * with a lag up to 20 the freed buffer is no longer fenced when the last
 * allocation comes and bufcache reuses it (66 MiB: it plus the small
 * blocks' page); with 21 it is still fenced (the fence also covers the
 * free's own unit) and bufcache takes a second buffer (130 MiB). The
 * replay once kept each stream's own last `lag` units queued, so the side
 * stream's work was never done: 130 MiB even with a lag of 4. */
static void test_lag_streams(const char *dir)
{
    char path[160], args[256];
    snprintf(path, sizeof path, "%s/lag.trace", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fputs("a 1 67108864 7\nf 1\n", f);
    for (int k = 2; k < 12; k++)
        fprintf(f, "a %d 4096 0\nf %d\n", k, k);
    fputs("a 100 67108864 0\nf 100\n", f);
    fclose(f);
    static const struct {
        int lag;
        double bufcache_mib;
    } cases[] = {{4, 66}, {20, 66}, {21, 130}, {40, 130}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "replay --json --lag %d %s", cases[i].lag, path);
        CHECK_EQ(run(args, false), 0);
        EXPECT_FIELD("bufcache", "peak_reserved_bytes", cases[i].bufcache_mib * MiB);
        EXPECT_FIELD("bufcache", "failed_allocs", 0);
        EXPECT_FIELD(NULL, "failed_allocs", 0);
    }
    unlink(path);
}

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A stream value of the generated traces: spread over all 64 bits, so
 * that neither a list nor a table indexed by the value would do. */
static unsigned long long stream_value(unsigned i)
{
    return (unsigned long long)(i + 1) * 0x9e3779b97f4a7c15ull;
}

/* Stream values are found in a hash map: a list searched from the start
 * made a trace with n distinct streams take time n^2 to read (200,000
 * streams: 8 s on a 2-CPU machine, against 0.2 s now). The trace of
 * 200,000 streams ends in a corrupt line, so that the command reads every
 * stream and stops before the replay, whose contexts make one stream each
 * (their own cost is not what is timed). Then a replay of 3,000 streams,
 * each used a second time in another order, besides stream 0 and the
 * largest value, gives every allocation back. */
static void test_many_streams(const char *dir)
{
    char path[160], args[256], want[256];
    snprintf(path, sizeof path, "%s/streams.trace", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    const unsigned many = 200000;
    for (unsigned i = 0; i < many; i++)
        fprintf(f, "a %u 64 %llu\n", i, stream_value(i));
    fputs("x\n", f);
    fclose(f);
    /* The yardstick, read in the same conditions: as many allocations on
     * one stream. A fixed bound failed under ThreadSanitizer on a loaded
     * machine (9.0 s against 6). */
    char one[160];
    snprintf(one, sizeof one, "%s/one_stream.trace", dir);
    f = fopen(one, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    for (unsigned i = 0; i < many; i++)
        fprintf(f, "a %u 64 %llu\n", i, stream_value(0));
    fputs("x\n", f);
    fclose(f);
    /* The list took 40 times the one stream's time (8 s against 0.2);
     * the map takes about as long as one stream. A pair over the bound
     * is measured once more: under ThreadSanitizer, beside the heaviest
     * tests, one pair took 6.55 s against 0.47 (bound 2.4), where the
     * list would be over it every time. */
    double elapsed = 0, base = 0, bound = 0;
    for (int attempt = 0; attempt < 2 && !(elapsed > 0 && elapsed < bound); attempt++) {
        snprintf(args, sizeof args, "replay --json %s", one);
        double t0 = seconds_now();
        CHECK_EQ(run(args, true), 1);
        base = seconds_now() - t0;
        snprintf(args, sizeof args, "replay --json %s", path);
        t0 = seconds_now();
        CHECK_EQ(run(args, true), 1);
        elapsed = seconds_now() - t0;
        snprintf(want, sizeof want, "%s:%u: unknown op 'x'", path, many + 1);
        CHECK(strstr(out, want) != NULL);
        if (!strstr(out, want))
            fprintf(stderr, "  got: %s\n", out);
        bound = 4.0 * base + 0.5;
        printf("test_replay: %u streams read in %.2f s, one stream's %u allocations in %.2f s "
               "(bound %.1f s)\n", many, elapsed, many, base, bound);
    }
    CHECK(elapsed < bound);
    remove(one);

    f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    const unsigned streams = 3000;
    unsigned id = 0;
    fputs("a 900000 4096 0\na 900001 8192 18446744073709551615\n", f);
    for (unsigned i = 0; i < streams; i++)
        fprintf(f, "a %u 256 %llu\n", id++, stream_value(i));
    for (unsigned i = streams; i-- > 0;) {
        fprintf(f, "a %u 1024 %llu\n", id++, stream_value(i));
        fprintf(f, "a %u 512 0\n", id++);
    }
    for (unsigned k = 0; k < id; k++)
        fprintf(f, "f %u\n", k);
    fputs("f 900000\nf 900001\n", f);
    fclose(f);
    CHECK_EQ(run(args, false), 0);
    EXPECT_FIELD(NULL, "allocs", 2 + 3.0 * streams);
    EXPECT_FIELD(NULL, "frees", 2 + 3.0 * streams);
    EXPECT_FIELD(NULL, "peak_live_bytes", 4096 + 8192 + streams * (256.0 + 1024 + 512));
    EXPECT_FIELD(NULL, "failed_allocs", 0);
    EXPECT_FIELD("direct", "failed_allocs", 0);
    EXPECT_FIELD("bufcache", "failed_allocs", 0);
    unlink(path);
}

int main(void)
{
    if (access(BINARY, X_OK) != 0) {
        fprintf(stderr, "test_replay: %s is not built\n", BINARY);
        CHECK(false);
        return harness_finish("test_replay");
    }
    char dir[] = "/tmp/test_replay.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    /* The replay inherits no options from the environment. */
    unsetenv("UNIMEM_CONF");
    test_errors(dir);
    test_bogus_traces(dir);
    test_min_limit(dir);
    test_bundled();
    test_lag();
    test_lag_streams(dir);
    test_many_streams(dir);
    rmdir(dir);
    return harness_finish("test_replay");
}
