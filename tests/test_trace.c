/* Tests of the allocation-trace reader (src/trace/trace.c): events and their
 * fields from plain and gzipped files, every malformed line with its line
 * number, truncated and corrupt gzip data, rewind, slots for arbitrary ids
 * against a reference, and the bundled real trace's known figures. */
#include "base/base.h"
#include "harness.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

static char tmpdir[64];

/* Writes `len` bytes to tmpdir/name, gzipped when gz; returns the path. */
static const char *write_file(const char *name, const char *data, size_t len, int gz)
{
    static char path[4][160];
    static int turn;
    char *p = path[turn++ % 4];
    snprintf(p, sizeof path[0], "%s/%s", tmpdir, name);
    if (gz) {
        gzFile f = gzopen(p, "wb");
        CHECK(f != NULL);
        if (f) {
            CHECK_EQ(gzwrite(f, data, (unsigned)len), len);
            CHECK_EQ(gzclose(f), Z_OK);
        }
    } else {
        FILE *f = fopen(p, "wb");
        CHECK(f != NULL);
        if (f) {
            CHECK_EQ(fwrite(data, 1, len, f), len);
            fclose(f);
        }
    }
    return p;
}

static const char *write_text(const char *name, const char *text, int gz)
{
    return write_file(name, text, strlen(text), gz);
}

static void expect_event(um_trace *t, um_trace_op op, uint64_t id, uint64_t slot, uint64_t size,
                         uint64_t stream, uint64_t line)
{
    um_trace_event ev;
    int done = -1;
    memset(&ev, 0xee, sizeof ev);
    CHECK_OK(um_trace_next(t, &ev, &done));
    CHECK_EQ(done, 0);
    CHECK_EQ(ev.op, op);
    CHECK_EQ(ev.id, id);
    CHECK_EQ(ev.slot, slot);
    CHECK_EQ(ev.size, size);
    CHECK_EQ(ev.stream, stream);
    CHECK_EQ(ev.line, line);
}

static void expect_done(um_trace *t)
{
    um_trace_event ev;
    int done = 0;
    CHECK_OK(um_trace_next(t, &ev, &done));
    CHECK_EQ(done, 1);
    CHECK_OK(um_trace_next(t, &ev, &done)); /* stays at the end */
    CHECK_EQ(done, 1);
}

static const char *small_trace = "# workload test\n"
                                 "a 10 512 0\n"
                                 "\n"
                                 "a 18446744073709551615 3 7\r\n"
                                 "   # an indented comment\n"
                                 "\ta\t11   1000\t0  \n"
                                 "f 10\n"
                                 "f 18446744073709551615\n"
                                 "a 12 256 0"; /* no newline at the end */

static void read_small(um_trace *t)
{
    expect_event(t, UM_TRACE_ALLOC, 10, 0, 512, 0, 2);
    expect_event(t, UM_TRACE_ALLOC, UINT64_MAX, 1, 3, 7, 4);
    CHECK_EQ(um_trace_slots(t), 2);
    expect_event(t, UM_TRACE_ALLOC, 11, 2, 1000, 0, 6);
    expect_event(t, UM_TRACE_FREE, 10, 0, 512, 0, 7);
    expect_event(t, UM_TRACE_FREE, UINT64_MAX, 1, 3, 7, 8);
    expect_event(t, UM_TRACE_ALLOC, 12, 3, 256, 0, 9);
    expect_done(t);
    CHECK_EQ(um_trace_slots(t), 4);
    CHECK(um_trace_progress(t) == 1.0);
}

static void test_small(int gz)
{
    um_trace *t = NULL;
    CHECK_OK(um_trace_open(write_text(gz ? "small.trace.gz" : "small.trace", small_trace, gz), &t));
    if (!t)
        return;
    CHECK(um_trace_progress(t) >= 0.0 && um_trace_progress(t) < 1.0);
    read_small(t);
    /* Rewind reads the same events with the same slots. */
    CHECK_OK(um_trace_rewind(t));
    CHECK_EQ(um_trace_slots(t), 0);
    read_small(t);
    um_trace_close(t);
}

/* Reading path must give `good` events, then fail with st at `line`, with a
 * message naming the file and line and containing `what`. */
static void expect_error_at(const char *path, um_status st, uint64_t line, int good,
                            const char *what)
{
    um_trace *t = NULL;
    CHECK_OK(um_trace_open(path, &t));
    if (!t)
        return;
    um_trace_event ev;
    int done = 0, n = 0;
    um_status s;
    while ((s = um_trace_next(t, &ev, &done)) == UM_OK && !done)
        n++;
    CHECK_EQ(n, good);
    CHECK_STATUS(s, st);
    char want[256];
    snprintf(want, sizeof want, "%s:%llu: ", path, (unsigned long long)line);
    bool ok = strstr(um_last_error(), want) && strstr(um_last_error(), what);
    CHECK(ok);
    if (!ok)
        fprintf(stderr, "  wanted '%s' and '%s' in: %s\n", want, what, um_last_error());
    /* The error sticks: reading on does not skip the bad line. */
    um__clear_error();
    CHECK_STATUS(um_trace_next(t, &ev, &done), st);
    CHECK(strstr(um_last_error(), want) != NULL);
    um_trace_close(t);
}

/* The trace of `len` bytes, plain and gzipped, must fail at `line` with
 * UM_ERR_PARSE and a message containing `what`, after `good` good events. */
static void expect_parse_error_n(const char *text, size_t len, uint64_t line, int good,
                                 const char *what)
{
    for (int gz = 0; gz < 2; gz++) {
        const char *path = write_file(gz ? "bad.trace.gz" : "bad.trace", text, len, gz);
        expect_error_at(path, UM_ERR_PARSE, line, good, what);
    }
}

static void expect_parse_error(const char *text, uint64_t line, int good, const char *what)
{
    expect_parse_error_n(text, strlen(text), line, good, what);
}

static void test_malformed(void)
{
    expect_parse_error("# c\nx 1 2 3\n", 2, 0, "unknown op 'x'");
    expect_parse_error("a 1 2 0\naa 1 2 3\n", 2, 1, "unknown op 'aa'");
    expect_parse_error("A 1 2 3\n", 1, 0, "unknown op 'A'");
    expect_parse_error("a 1 2\n", 1, 0, "missing field <stream>");
    expect_parse_error("a 1\n", 1, 0, "missing field <size>");
    expect_parse_error("a\n", 1, 0, "missing field <id>");
    expect_parse_error("a 1 2 0\nf\n", 2, 1, "missing field <id>");
    expect_parse_error("a 1 2 3 4\n", 1, 0, "extra field '4'");
    expect_parse_error("a 1 2 0\nf 1 0\n", 2, 1, "extra field '0'");
    expect_parse_error("a 1 -5 0\n", 1, 0, "negative number '-5' for <size>");
    expect_parse_error("a -1 5 0\n", 1, 0, "negative number '-1' for <id>");
    expect_parse_error("a 1 12x 0\n", 1, 0, "<size> is not a number: '12x'");
    expect_parse_error("a 1 2 0x10\n", 1, 0, "<stream> is not a number");
    expect_parse_error("a 1 +2 0\n", 1, 0, "<size> is not a number");
    expect_parse_error("a 1 18446744073709551616 0\n", 1, 0, "does not fit in 64 bits");
    expect_parse_error("a 1 0 0\n", 1, 0, "size 0 for id 1");
    expect_parse_error("a 1 2 0\na 2 2 0\na 1 3 0\n", 3, 2,
                       "duplicate id 1 (already allocated on line 1)");
    expect_parse_error("a 1 2 0\nf 1\na 1 2 0\n", 3, 2, "duplicate id 1 (already freed on line 2)");
    expect_parse_error("f 7\n", 1, 0, "free of unknown id 7");
    expect_parse_error("a 1 2 0\nf 1\n#\nf 1\n", 4, 2, "free of id 1, already freed on line 2");
    expect_parse_error("a 1 2 0\n\x01\x02\n", 2, 1, "unknown op '\?\?'");

    /* A line too long for any event, and one with a NUL byte. */
    char longline[2048];
    memset(longline, ' ', sizeof longline);
    memcpy(longline, "a 1 2 0\na 2 2", 13);
    memcpy(longline + sizeof longline - 3, "0\n", 3);
    expect_parse_error(longline, 2, 1, "line too long");
    /* The limit the message names is the one applied: a line of 511
     * characters (512 bytes with its newline) is read, one of 512 is
     * refused as "more than 511" (the message once said 510). */
    char edge[512 + 513];
    memset(edge, ' ', sizeof edge);
    memcpy(edge, "a 1 2 0", 7);
    edge[511] = '\n';
    memcpy(edge + 512, "a 2 2 0", 7);
    edge[512 + 512] = '\n';
    expect_parse_error_n(edge, sizeof edge, 2, 1, "line too long (more than 511 characters)");
    /* A long comment is fine. */
    char comment[3000];
    memset(comment, 'c', sizeof comment);
    memcpy(comment, "a 1 2 0\n#", 9);
    memcpy(comment + sizeof comment - 10, "\nf 1\nf 1\n", 10);
    expect_parse_error(comment, 4, 2, "already freed on line 3");
    const char nul[] = "a 1 2 0\na 2\0 2 0\na 3 1 0\n";
    const char *path = write_file("nul.trace", nul, sizeof nul - 1, 0);
    um_trace *t = NULL;
    CHECK_OK(um_trace_open(path, &t));
    if (t) {
        expect_event(t, UM_TRACE_ALLOC, 1, 0, 2, 0, 1);
        um_trace_event ev;
        int done;
        CHECK_STATUS(um_trace_next(t, &ev, &done), UM_ERR_PARSE);
        CHECK(strstr(um_last_error(), ":2: NUL byte in line") != NULL);
        um_trace_close(t);
    }
    /* A NUL byte in the last line, which has no newline, must not cut it
     * silently either. */
    static const char nul_last[] = "a 1 2 0\nf 1\0f 1";
    expect_parse_error_n(nul_last, sizeof nul_last - 1, 2, 1, "NUL byte in line");
    static const char nul_only[] = "a 1 2 0\n\0";
    expect_parse_error_n(nul_only, sizeof nul_only - 1, 2, 1, "NUL byte in line");
}

/* Appends text as one gzip member to out (of cap bytes, *len used). */
static void gzip_member(const char *text, unsigned char *out, size_t cap, size_t *len)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    CHECK_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
    z.next_in = (Bytef *)(uintptr_t)text;
    z.avail_in = (uInt)strlen(text);
    z.next_out = out + *len;
    z.avail_out = (uInt)(cap - *len);
    CHECK_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
    *len = cap - z.avail_out;
    deflateEnd(&z);
}

/* Several gzip members are one stream (gzip -d concatenates them), but bytes
 * after the last member that start no member are an error: zlib's gzread
 * drops them silently, which would cut a trace short without a word. */
static void test_gzip_members(void)
{
    unsigned char data[512];
    size_t len = 0;
    /* A line split across members, an empty member, no final newline. */
    gzip_member("a 1 10 0\nf ", data, sizeof data, &len);
    gzip_member("", data, sizeof data, &len);
    gzip_member("1\na 2 5 1", data, sizeof data, &len);
    um_trace *t = NULL;
    CHECK_OK(um_trace_open(write_file("members.trace.gz", (const char *)data, len, 0), &t));
    if (t) {
        for (int pass = 0; pass < 2; pass++) {
            expect_event(t, UM_TRACE_ALLOC, 1, 0, 10, 0, 1);
            expect_event(t, UM_TRACE_FREE, 1, 0, 10, 0, 2);
            expect_event(t, UM_TRACE_ALLOC, 2, 1, 5, 1, 3);
            expect_done(t);
            CHECK_OK(um_trace_rewind(t));
        }
        um_trace_close(t);
    }

    /* Each tail after complete members, and what reading must report. */
    static const struct {
        const char *bytes;
        size_t len;
        um_status st;
        const char *what; /* NULL: the trailing-data message with the offset */
    } tails[] = {
        {"f 1\nf 1\n", 8, UM_ERR_PARSE, NULL},                 /* plain text after the gzip data */
        {"\x1f", 1, UM_ERR_PARSE, NULL},                       /* too short for a gzip header */
        {"\0\0\0\0", 4, UM_ERR_PARSE, NULL},                   /* zero padding */
        {"\x1f\x8b\x08", 3, UM_ERR_IO, "gzip data truncated"}, /* a member cut short */
    };
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        len = 0;
        gzip_member("a 1 10 0\n", data, sizeof data, &len);
        if (i % 2)
            gzip_member("", data, sizeof data, &len); /* after a second member too */
        size_t gz_bytes = len;
        memcpy(data + len, tails[i].bytes, tails[i].len);
        len += tails[i].len;
        const char *path = write_file("members.trace.gz", (const char *)data, len, 0);
        char what[128];
        snprintf(what, sizeof what, "trailing data after the gzip stream at byte offset %zu",
                 gz_bytes);
        expect_error_at(path, tails[i].st, 2, 1, tails[i].what ? tails[i].what : what);
    }
}

static void test_open_errors(void)
{
    um_trace *t = (um_trace *)&t;
    char missing[128];
    snprintf(missing, sizeof missing, "%s/does-not-exist.trace.gz", tmpdir);
    um__clear_error();
    CHECK_STATUS(um_trace_open(missing, &t), UM_ERR_IO);
    CHECK(t == NULL);
    CHECK(strstr(um_last_error(), "does-not-exist.trace.gz") != NULL);
    CHECK(strstr(um_last_error(), "No such file") != NULL);
    CHECK_STATUS(um_trace_open(tmpdir, &t), UM_ERR_IO);
    CHECK(strstr(um_last_error(), "is a directory") != NULL);
    CHECK_STATUS(um_trace_open(NULL, &t), UM_ERR_INVALID);
    CHECK_STATUS(um_trace_open(missing, NULL), UM_ERR_INVALID);
    um_trace_event ev;
    int done;
    CHECK_STATUS(um_trace_next(NULL, &ev, &done), UM_ERR_INVALID);
    CHECK_STATUS(um_trace_rewind(NULL), UM_ERR_INVALID);
    CHECK_EQ(um_trace_slots(NULL), 0);
    CHECK(um_trace_progress(NULL) == 0.0);
    um_trace_close(NULL);

    /* An empty file is an empty trace. */
    CHECK_OK(um_trace_open(write_text("empty.trace", "", 0), &t));
    if (t) {
        CHECK_STATUS(um_trace_next(t, NULL, &done), UM_ERR_INVALID);
        expect_done(t);
        CHECK_EQ(um_trace_slots(t), 0);
        um_trace_close(t);
    }
}

/* Reads a whole trace; returns the status that ended it. */
static um_status read_all(const char *path, uint64_t *events, uint64_t *allocs, uint64_t *frees,
                          uint64_t *peak, uint64_t *last_line)
{
    um_trace *t = NULL;
    um_status s = um_trace_open(path, &t);
    if (s != UM_OK)
        return s;
    um_trace_event ev;
    int done = 0;
    uint64_t live = 0;
    double progress = 0.0;
    *events = *allocs = *frees = *peak = *last_line = 0;
    while ((s = um_trace_next(t, &ev, &done)) == UM_OK && !done) {
        ++*events;
        *last_line = ev.line;
        if (ev.op == UM_TRACE_ALLOC) {
            ++*allocs;
            live += ev.size;
            if (live > *peak)
                *peak = live;
        } else {
            ++*frees;
            live -= ev.size;
        }
        if (*events % 1000 == 0) {
            double p = um_trace_progress(t);
            CHECK(p >= progress && p <= 1.0);
            progress = p;
        }
    }
    if (s == UM_OK)
        CHECK(um_trace_progress(t) == 1.0);
    um_trace_close(t);
    return s;
}

static void test_bundled(void)
{
    const char *path = UM_SOURCE_DIR "/data/gpt2_train.trace.gz";
    uint64_t events, allocs, frees, peak, last;
    CHECK_OK(read_all(path, &events, &allocs, &frees, &peak, &last));
    CHECK_EQ(allocs, 6179);
    CHECK_EQ(frees, 6176);
    CHECK_EQ(events, 6179 + 6176);
    CHECK_EQ(peak, 13594206920ull);

    /* Cut in half: an error naming the line where the data ends, never a
     * silently short trace. */
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (!f)
        return;
    static char data[1 << 20];
    size_t n = fread(data, 1, sizeof data, f);
    fclose(f);
    CHECK(n > 1000 && n < sizeof data);
    const char *half = write_file("half.trace.gz", data, n / 2, 0);
    um__clear_error();
    um_status s = read_all(half, &events, &allocs, &frees, &peak, &last);
    CHECK(s == UM_ERR_IO || s == UM_ERR_PARSE);
    CHECK(events > 100 && events < 6179 + 6176);
    char want[200];
    snprintf(want, sizeof want, "%s:%llu: ", half, (unsigned long long)last + 1);
    CHECK(strstr(um_last_error(), want) != NULL);
    CHECK(strstr(um_last_error(), "truncated") != NULL);

    /* Cut inside the gzip trailer: every line is there but the check fails. */
    const char *trailer = write_file("trailer.trace.gz", data, n - 4, 0);
    s = read_all(trailer, &events, &allocs, &frees, &peak, &last);
    CHECK(s == UM_ERR_IO || s == UM_ERR_PARSE);
    CHECK(strstr(um_last_error(), trailer) != NULL);

    /* Corrupt bytes in the middle. */
    for (size_t i = n / 2; i < n / 2 + 16; i++)
        data[i] ^= 0x5a;
    const char *bad = write_file("corrupt.trace.gz", data, n, 0);
    s = read_all(bad, &events, &allocs, &frees, &peak, &last);
    CHECK(s == UM_ERR_IO || s == UM_ERR_PARSE);
    CHECK(strstr(um_last_error(), bad) != NULL);
}

/* Many arbitrary ids, freed in random order: slots and the size and stream
 * of every free against a reference. */
static void test_random_ids(uint64_t seed)
{
    enum { N = 20000 };
    uint64_t rng = seed;
    static uint64_t ids[N], sizes[N], streams[N];
    static uint32_t order[N];
    size_t cap = (size_t)N * 96; /* an alloc line and a free line: at most 81 bytes */
    char *text = malloc(cap), *p = text;
    uint64_t mult = harness_rand(&rng) | 1; /* odd: i -> i * mult + add is one-to-one */
    uint64_t add = harness_rand(&rng);
    for (uint32_t i = 0; i < N; i++) {
        ids[i] = i * mult + add;
        sizes[i] = 1 + harness_rand(&rng) % (1ull << 40);
        streams[i] = harness_rand(&rng) % 3 == 0 ? harness_rand(&rng) : 0;
    }
    /* Allocations in index order; after each, maybe a free of a random live
     * block; the rest are freed at the end in random order. order[] is the
     * order of the frees. pool[] holds the live indices. */
    static uint32_t pool[N];
    uint32_t npool = 0, nfreed = 0;
    for (uint32_t i = 0; i < N; i++) {
        p += sprintf(p, "a %llu %llu %llu\n", (unsigned long long)ids[i],
                     (unsigned long long)sizes[i], (unsigned long long)streams[i]);
        pool[npool++] = i;
        while (npool > 0 && harness_rand(&rng) % 2) {
            uint32_t k = (uint32_t)(harness_rand(&rng) % npool);
            order[nfreed++] = pool[k];
            pool[k] = pool[--npool];
            p += sprintf(p, "f %llu\n", (unsigned long long)ids[order[nfreed - 1]]);
        }
    }
    uint32_t frees_inline = nfreed;
    while (npool > 0) {
        uint32_t k = (uint32_t)(harness_rand(&rng) % npool);
        order[nfreed++] = pool[k];
        pool[k] = pool[--npool];
        p += sprintf(p, "f %llu\n", (unsigned long long)ids[order[nfreed - 1]]);
    }
    const char *path = write_file("random.trace.gz", text, (size_t)(p - text), 1);
    free(text);

    um_trace *t = NULL;
    CHECK_OK(um_trace_open(path, &t));
    if (!t)
        return;
    for (int pass = 0; pass < 2; pass++) {
        uint32_t alloc_i = 0, free_i = 0, bad = 0;
        uint64_t line = 0;
        um_trace_event ev;
        int done = 0;
        while (um_trace_next(t, &ev, &done) == UM_OK && !done) {
            line++;
            if (ev.op == UM_TRACE_ALLOC) {
                uint32_t i = alloc_i++;
                bad += ev.id != ids[i] || ev.slot != i || ev.size != sizes[i] ||
                       ev.stream != streams[i] || ev.line != line;
            } else {
                uint32_t i = order[free_i++];
                bad += ev.id != ids[i] || ev.slot != i || ev.size != sizes[i] ||
                       ev.stream != streams[i] || ev.line != line;
            }
        }
        CHECK_EQ(done, 1);
        CHECK_EQ(bad, 0);
        CHECK_EQ(alloc_i, N);
        CHECK_EQ(free_i, N);
        CHECK_EQ(um_trace_slots(t), N);
        CHECK_OK(um_trace_rewind(t));
    }
    CHECK(frees_inline > N / 4); /* frees and allocations really interleave */
    um_trace_close(t);
}

/* A UTF-8 byte-order mark before the first line, which some editors
 * write, is skipped, in plain and gzip files and again after a rewind (it
 * was read as part of the first operation: "unknown op"). Its three bytes
 * still count towards the first line's 511, so that a line is never cut
 * where it would not be without them; a mark anywhere else stays text. */
static void test_byte_order_mark(int gz)
{
    const char *path = write_text("bom.trace", "\xEF\xBB\xBF" "a 1 8 0\nf 1\n", gz);
    um_trace *t = NULL;
    CHECK_OK(um_trace_open(path, &t));
    if (t) {
        for (int pass = 0; pass < 2; pass++) {
            expect_event(t, UM_TRACE_ALLOC, 1, 0, 8, 0, 1);
            expect_event(t, UM_TRACE_FREE, 1, 0, 8, 0, 2);
            expect_done(t);
            CHECK_OK(um_trace_rewind(t));
        }
        um_trace_close(t);
    }
    /* 511 bytes with the mark are read; 512 are "more than 511". */
    char line[3 + 509 + 8];
    for (int extra = 0; extra < 2; extra++) {
        size_t n = 511 + (size_t)extra;
        memset(line, ' ', sizeof line);
        memcpy(line, "\xEF\xBB\xBF" "a 1 8 0", 10);
        line[n] = '\n';
        memcpy(line + n + 1, "f 1\n", 4);
        path = write_file("bom_long.trace", line, n + 5, gz);
        t = NULL;
        CHECK_OK(um_trace_open(path, &t));
        if (!t)
            continue;
        um_trace_event ev;
        int done = 0;
        um_status st = um_trace_next(t, &ev, &done);
        if (extra) {
            CHECK_STATUS(st, UM_ERR_PARSE);
            CHECK(strstr(um_last_error(), ":1: line too long (more than 511 characters)") != NULL);
        } else {
            CHECK_OK(st);
            CHECK_EQ(ev.size, 8);
        }
        um_trace_close(t);
    }
    expect_parse_error("a 1 8 0\n\xEF\xBB\xBF" "f 1\n", 2, 1, "unknown op");
}

int main(void)
{
    uint64_t seed = harness_seed("test_trace");
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_trace.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_small(0);
    test_small(1);
    test_malformed();
    test_byte_order_mark(0);
    test_byte_order_mark(1);
    test_gzip_members();
    test_open_errors();
    test_bundled();
    test_random_ids(seed);

    /* Clean the temp dir. */
    static const char *const names[] = {"small.trace",     "small.trace.gz",   "bad.trace",
                                        "bad.trace.gz",    "nul.trace",        "empty.trace",
                                        "half.trace.gz",   "trailer.trace.gz", "corrupt.trace.gz",
                                        "random.trace.gz", "members.trace.gz"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[160];
        snprintf(path, sizeof path, "%s/%s", tmpdir, names[i]);
        unlink(path);
    }
    rmdir(tmpdir);
    return harness_finish("test_trace");
}
