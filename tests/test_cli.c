/* Tests of the `unimem` command line through the built binary: bad input
 * is refused with a message naming it and the exit code of its kind (2 for
 * a bad argument, 1 for a bad file or a failed run), the same in every
 * command; and `unimem timeline`'s checks of what it reads (counter values
 * a page cannot draw exactly, block addresses, truncated gzip) and the
 * figures it prints. The pages themselves are checked in a browser by
 * timeline_check.sh. */
#include "harness.h"
#include "tool.h"
#include "vsim/dag.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#define BINARY UM_BINARY_DIR "/unimem"
#define PIPELINE UM_SOURCE_DIR "/data/pipeline_two_streams.trace.gz"
#define PATTERN UM_SOURCE_DIR "/tests/data/pattern.trace"

static char out[1 << 16];
static char dir[] = "/tmp/test_cli.XXXXXX";

/* Runs `unimem <args>` with stderr on stdout too when both; returns the
 * exit status (-1 if it did not exit). */
static int run(const char *args, bool both)
{
    return harness_run_unimem(args, both, out, sizeof out);
}

/* Runs `unimem <args>` (stderr included) and checks its exit code and
 * that its output holds want (NULL: anything); prints the output when a
 * check fails, so the log shows what the command said. */
static void expect_run(int line, const char *args, int want_rc, const char *want)
{
    int rc = run(args, true);
    harness_checks++;
    if (rc != want_rc || (want && !strstr(out, want)))
        harness_report(__FILE__, line, "unimem %s: exit %d, expected %d with '%s'; output:\n%s",
                       args, rc, want_rc, want ? want : "", out);
}
#define EXPECT_RUN(args, rc, want) expect_run(__LINE__, args, rc, want)

/* dir/name, with text written into it when text is not NULL. Each name
 * has a buffer of its own (up to FILE_NAMES names), so paths stay valid. */
#define FILE_NAMES 64
static const char *file_in_dir(const char *name, const char *text)
{
    static char paths[FILE_NAMES][256];
    static int used;
    int i = 0;
    while (i < used && strcmp(strrchr(paths[i], '/') + 1, name))
        i++;
    CHECK(i < FILE_NAMES);
    if (i == FILE_NAMES)
        i = FILE_NAMES - 1;
    if (i == used && used < FILE_NAMES)
        used++;
    snprintf(paths[i], sizeof paths[i], "%s/%s", dir, name);
    if (text) {
        FILE *f = fopen(paths[i], "w");
        CHECK(f != NULL);
        if (f) {
            fputs(text, f);
            fclose(f);
        }
    }
    return paths[i];
}

/* A Chrome trace of one device (pid 1) whose counter and alloc events are
 * given as the text of their args objects. */
static const char *chrome_trace(const char *name, const char *counter_args, const char *alloc_args)
{
    char text[2048];
    snprintf(text, sizeof text,
             "{\"traceEvents\":[\n"
             "{\"ph\":\"C\",\"name\":\"memory\",\"pid\":1,\"ts\":0,\"args\":{\"live\":0,"
             "\"reserved\":4096}},\n"
             "{\"ph\":\"C\",\"name\":\"memory\",\"pid\":1,\"ts\":1,\"args\":%s},\n"
             "{\"ph\":\"i\",\"name\":\"alloc\",\"cat\":\"memory\",\"pid\":1,\"ts\":2,\"args\":%s}\n"
             "]}\n",
             counter_args, alloc_args);
    return file_in_dir(name, text);
}

/* Counter values reach the page as JavaScript numbers, exact up to 2^53:
 * a trace with larger ones is refused with the value named, and no page
 * is written (values of 2^63 and more once overflowed int64_t). */
static void test_timeline_big_counters(void)
{
    char args[1024];
    const char *page = file_in_dir("big.html", NULL);
    const char *ok = chrome_trace("limit.json",
                                  "{\"live\":9007199254740992,\"reserved\":"
                                  "9007199254740992}",
                                  "{\"bytes\":4096,\"block\":\"0x1000\"}");
    snprintf(args, sizeof args, "timeline %s -o %s", ok, page);
    EXPECT_RUN(args, 0, "1 device, 2 counter samples");
    unlink(page);
    static const char *const bad[][2] = {
        {"{\"live\":9223372036854775808,\"reserved\":9223372036854775808}",
         "args.live 9223372036854775808 is above 2^53"},
        {"{\"live\":1,\"reserved\":9007199254740993}",
         "args.reserved 9007199254740993 is above 2^53"},
        {"{\"live\":1,\"reserved\":2,\"cached\":18446744073709551615}",
         "args.cached 18446744073709551615 is above 2^53"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *trace = chrome_trace("big.json", bad[i][0], "{\"bytes\":1}");
        snprintf(args, sizeof args, "timeline %s -o %s", trace, page);
        EXPECT_RUN(args, 1, bad[i][1]);
        CHECK(strstr(out, "malformed Chrome trace: the event on line 3") != NULL);
        CHECK(access(page, F_OK) != 0);
    }
    /* An allocation's or a copy's bytes likewise. */
    const char *trace = chrome_trace("big.json", "{\"live\":1,\"reserved\":2}",
                                     "{\"bytes\":9223372036854775808,\"block\":\"0x1000\"}");
    snprintf(args, sizeof args, "timeline %s -o %s", trace, page);
    EXPECT_RUN(args, 1, "args.bytes 9223372036854775808 is above 2^53");
    trace = file_in_dir("copy.json",
                        "[{\"ph\":\"X\",\"cat\":\"copy\",\"name\":\"copy\",\"pid\":1,\"ts\":0,"
                        "\"dur\":1,\"args\":{\"bytes\":9223372036854775808}}]\n");
    snprintf(args, sizeof args, "timeline %s -o %s", trace, page);
    EXPECT_RUN(args, 1, "args.bytes 9223372036854775808 is above 2^53");
    CHECK(access(page, F_OK) != 0);
}

/* Empty strings as the first strings a trace holds (found by
 * fuzz_timeline): the reader copied a string of 0 bytes from its string
 * buffer before it had one (memcpy from NULL, undefined behaviour that
 * UBSan stops the command on). The traces are read, or refused for what is
 * wrong with them, in every build. */
static void test_timeline_empty_strings(void)
{
    static const struct {
        const char *name, *text;
        int rc;
        const char *want;
    } cases[] = {
        /* Read whole, then refused: nothing in them to draw. */
        {"empty_key.json", "[{\"\":0}]\n", 1, "has nothing to draw"},
        {"empty_name.json",
         "{\"\":\"\",\"traceEvents\":[{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":1,"
         "\"args\":{\"name\":\"\"}}]}\n",
         1, "has nothing to draw"},
        {"empty_bad.json", "[{\"\",\"ph\":\"M\"}]\n", 1, "expected ':' after a member name"},
    };
    char args[1024];
    const char *page = file_in_dir("empty_strings.html", NULL);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "timeline %s -o %s",
                 file_in_dir(cases[i].name, cases[i].text), page);
        EXPECT_RUN(args, cases[i].rc, cases[i].want);
    }
    unlink(page);
}

/* A gzip file cut inside its first block has no byte to sniff: that is a
 * truncated file, as replay says, not an empty one. */
static void test_timeline_truncated_gzip(void)
{
    char args[1024], head[30];
    FILE *f = fopen(PIPELINE, "rb");
    CHECK(f != NULL);
    if (!f)
        return;
    size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    CHECK_EQ(n, sizeof head);
    const char *tiny = file_in_dir("tiny.trace.gz", NULL);
    f = fopen(tiny, "wb");
    CHECK(f != NULL);
    if (!f)
        return;
    fwrite(head, 1, n, f);
    fclose(f);
    const char *page = file_in_dir("tiny.html", NULL);
    snprintf(args, sizeof args, "timeline %s -o %s", tiny, page);
    EXPECT_RUN(args, 1, "gzip data truncated");
    CHECK(strstr(out, "is empty") == NULL);
    CHECK(access(page, F_OK) != 0);
    /* A file that is empty still says so. */
    const char *empty = file_in_dir("empty.trace", "");
    snprintf(args, sizeof args, "timeline %s -o %s", empty, page);
    EXPECT_RUN(args, 1, "is empty");
    /* An allocation trace of comments only has nothing to draw. */
    const char *comments = file_in_dir("comments.trace", "# nothing\n");
    snprintf(args, sizeof args, "timeline %s -o %s", comments, page);
    EXPECT_RUN(args, 1, "has no events");
    CHECK(access(page, F_OK) != 0);
}

/* Bytes after the gzip data of a Chrome trace are refused, as the
 * allocation-trace reader refuses them: zlib's gzread, which the reader
 * once used, drops them without a word, so a damaged or wrongly assembled
 * file was drawn from its first part (and text appended after the gzip
 * data read as a truncated file). Several gzip members are one stream. */
static void test_timeline_gzip_trailing(void)
{
    static const char event[] =
        "{\"ph\":\"C\",\"name\":\"memory\",\"pid\":1,\"ts\":1,\"args\":{\"live\":5,\"reserved\":8}}";
    char text[512], args[1024];
    const char *page = file_in_dir("gzt.html", NULL);
    const char *path = file_in_dir("gzt.json.gz", NULL);
    static const struct {
        const char *first, *second; /* gzipped, then appended as given (gzipped when gz2) */
        bool gz2;
        int rc;
        const char *want;
    } cases[] = {
        {"[%s]\n", "garbage", false, 1, "bytes after the end of the gzip data"},
        {"[%s,\n", "%s]\n", false, 1, "bytes after the end of the gzip data"},
        {"[%s,\n", "%s]\n", true, 0, "1 device, 2 counter samples"},
        {"[%s]\n", "", false, 0, "1 device, 1 counter samples"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gzFile gz = gzopen(path, "wb");
        CHECK(gz != NULL);
        if (!gz)
            return;
        snprintf(text, sizeof text, cases[i].first, event);
        gzputs(gz, text);
        CHECK_EQ(gzclose(gz), Z_OK);
        snprintf(text, sizeof text, cases[i].second, event);
        if (cases[i].gz2) {
            gz = gzopen(path, "ab");
            CHECK(gz != NULL);
            if (!gz)
                return;
            gzputs(gz, text);
            CHECK_EQ(gzclose(gz), Z_OK);
        } else {
            FILE *f = fopen(path, "ab");
            CHECK(f != NULL);
            if (!f)
                return;
            fputs(text, f);
            fclose(f);
        }
        snprintf(args, sizeof args, "timeline %s -o %s", path, page);
        EXPECT_RUN(args, cases[i].rc, cases[i].want);
        CHECK_EQ(access(page, F_OK) == 0, cases[i].rc == 0);
        unlink(page);
    }
}

/* A block address is "0x" and hex digits (or a number): a sign, white
 * space or other text is a malformed event, not an address. */
static void test_timeline_addresses(void)
{
    char args[1024], alloc[256];
    const char *page = file_in_dir("addr.html", NULL);
    static const char *const good[] = {"\"0x7f548c400000\"", "\"0XFFFFFFFFFFFFFFFF\"", "4096"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        snprintf(alloc, sizeof alloc, "{\"bytes\":4096,\"block\":%s}", good[i]);
        const char *trace = chrome_trace("addr.json", "{\"live\":4096,\"reserved\":8192}", alloc);
        snprintf(args, sizeof args, "timeline %s -o %s", trace, page);
        EXPECT_RUN(args, 0, "wrote");
        unlink(page);
    }
    static const char *const bad[] = {
        "\"0x-1\"", "\"0x 10\"", "\" 0x10\"", "\"0x+1\"",
        "\"0x\"",   "\"0x1g\"",  "\"10\"",    "\"0x10000000000000000\"",
        "-1",       "true"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(alloc, sizeof alloc, "{\"bytes\":4096,\"block\":%s}", bad[i]);
        const char *trace = chrome_trace("addr.json", "{\"live\":4096,\"reserved\":8192}", alloc);
        snprintf(args, sizeof args, "timeline %s -o %s", trace, page);
        EXPECT_RUN(args, 1, "an alloc event has a bad args.block");
        CHECK(access(page, F_OK) != 0);
    }
}

/* The count of counter samples printed is the drawn devices' (the page's
 * n_in): a device with only zero samples is left out of both. */
static void test_timeline_counts(void)
{
    char args[1024];
    const char *page = file_in_dir("count.html", NULL);
    const char *trace =
        file_in_dir("count.json", "[{\"ph\":\"C\",\"name\":\"memory\",\"pid\":0,\"ts\":0,\"args\":{"
                                  "\"live\":0,\"reserved\":0}},\n"
                                  "{\"ph\":\"C\",\"name\":\"memory\",\"pid\":1,\"ts\":1,\"args\":{"
                                  "\"live\":5,\"reserved\":8}},\n"
                                  "{\"ph\":\"C\",\"name\":\"memory\",\"pid\":1,\"ts\":2,\"args\":{"
                                  "\"live\":0,\"reserved\":8}}]\n");
    snprintf(args, sizeof args, "timeline %s -o %s", trace, page);
    EXPECT_RUN(args, 0, "1 device, 2 counter samples, 0 copy and eviction marks");
    /* A replayed allocation trace: the host device has a zero sample too. */
    snprintf(args, sizeof args, "timeline " PATTERN " -o %s", page);
    CHECK_EQ(run(args, false), 0);
    static char printed[sizeof out];
    memcpy(printed, out, sizeof out);
    FILE *f = fopen(page, "r");
    CHECK(f != NULL);
    if (!f)
        return;
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    fclose(f);
    const char *at = strstr(out, "\"n_in\":");
    CHECK(at != NULL && strstr(at + 1, "\"n_in\":") == NULL); /* one device drawn */
    if (!at)
        return;
    char want[64];
    snprintf(want, sizeof want, "1 device, %ld counter samples,", strtol(at + 7, NULL, 10));
    harness_checks++;
    if (!strstr(printed, want))
        harness_report(__FILE__, __LINE__, "printed '%s', expected '%s'", printed, want);
    unlink(page);
}

/* A file that starts with a UTF-8 byte-order mark (EF BB BF, which some
 * editors write) is drawn as the same file without it: the format was
 * sniffed from the mark's first byte, so a Chrome trace was taken for an
 * allocation trace and replayed. */
static void test_timeline_byte_order_mark(void)
{
    char args[1024];
    static const char events[] =
        "[{\"ph\":\"C\",\"name\":\"memory\",\"pid\":1,\"ts\":1,\"args\":{"
        "\"live\":5,\"reserved\":8}},\n"
        "{\"ph\":\"C\",\"name\":\"memory\",\"pid\":1,\"ts\":2,\"args\":{"
        "\"live\":0,\"reserved\":8}}]\n";
    const char *page = file_in_dir("bom.html", NULL);
    const char *plain = file_in_dir("nobom.json", events);
    snprintf(args, sizeof args, "timeline %s -o %s", plain, page);
    EXPECT_RUN(args, 0, "1 device, 2 counter samples, 0 copy and eviction marks");
    unlink(page);
    char text[sizeof events + 3] = "\xEF\xBB\xBF";
    strcat(text, events);
    const char *marked = file_in_dir("bom.json", text);
    snprintf(args, sizeof args, "timeline %s -o %s", marked, page);
    EXPECT_RUN(args, 0, "1 device, 2 counter samples, 0 copy and eviction marks");
    CHECK(strstr(out, "replayed") == NULL && strstr(out, "allocation trace") == NULL);
    CHECK(access(page, F_OK) == 0);
    unlink(page);
    /* A mark alone is no document of either kind. */
    const char *only = file_in_dir("bom_only.json", "\xEF\xBB\xBF\n");
    snprintf(args, sizeof args, "timeline %s -o %s", only, page);
    EXPECT_RUN(args, 1, "is empty");
    CHECK(access(page, F_OK) != 0);
    /* An allocation trace after a mark is read as without it, by the
     * timeline and the replay alike: the trace reader took the mark for
     * part of the first operation ("unknown op"). */
    static const char ops[] = "a 1 4096 0\na 2 8192 0\nf 1\n";
    char marked_ops[sizeof ops + 3] = "\xEF\xBB\xBF";
    strcat(marked_ops, ops);
    const char *alloc = file_in_dir("bom.trace", marked_ops);
    const char *bare = file_in_dir("nobom.trace", ops);
    snprintf(args, sizeof args, "timeline %s -o %s", alloc, page);
    EXPECT_RUN(args, 0, NULL);
    CHECK(strstr(out, "unknown op") == NULL);
    CHECK(access(page, F_OK) == 0);
    unlink(page);
    char with_mark[4096];
    snprintf(args, sizeof args, "replay %s --json", alloc);
    EXPECT_RUN(args, 0, "\"allocs\": 2, \"frees\": 1");
    snprintf(with_mark, sizeof with_mark, "%s", strstr(out, "\"events\"") ? strstr(out, "\"events\"") : "");
    snprintf(args, sizeof args, "replay %s --json", bare);
    EXPECT_RUN(args, 0, "\"allocs\": 2, \"frees\": 1");
    const char *without = strstr(out, "\"events\"");
    CHECK(without && !strncmp(with_mark, without, 60));
}

/* `unimem timeline` never writes over the trace it reads: -o or
 * --save-trace naming it (by its name or another) is refused, and the
 * trace is left as it was. Before, -o replaced a Chrome trace with the
 * page, and --save-trace overwrote an allocation trace while the replay
 * read it. The replay's options on a Chrome trace, which is not replayed,
 * are refused too (they were ignored). */
static void test_timeline_keeps_its_input(void)
{
    char args[1024];
    static char before[1 << 14], after[1 << 14];
    const char *json = chrome_trace("keep.json", "{\"live\":1,\"reserved\":2}", "{\"bytes\":1}");
    harness_slurp(json, before, sizeof before);
    snprintf(args, sizeof args, "timeline %s -o %s", json, json);
    EXPECT_RUN(args, 2, "-o names the trace being read");
    char link[300];
    snprintf(link, sizeof link, "%s/keep_link.json", dir);
    CHECK(symlink(json, link) == 0);
    snprintf(args, sizeof args, "timeline %s -o %s", json, link);
    EXPECT_RUN(args, 2, "-o names the trace being read");
    CHECK(!strcmp(before, harness_slurp(json, after, sizeof after)));

    const char *alloc = file_in_dir("keep.trace", "a 1 4096 0\nf 1\n");
    const char *page = file_in_dir("keep.html", NULL);
    snprintf(args, sizeof args, "timeline %s -o %s --save-trace %s", alloc, page, alloc);
    EXPECT_RUN(args, 2, "--save-trace names the trace being read");
    CHECK(!strcmp(harness_slurp(alloc, after, sizeof after), "a 1 4096 0\nf 1\n"));
    snprintf(args, sizeof args, "timeline %s -o %s --save-trace %s", alloc, page, page);
    EXPECT_RUN(args, 2, "--save-trace and -o name the same file");
    CHECK(access(page, F_OK) != 0);

    static const char *const replay_only[] = {"--device sim:1G", "--allocator direct",
                                              "--save-trace x.json"};
    for (size_t i = 0; i < sizeof replay_only / sizeof replay_only[0]; i++) {
        snprintf(args, sizeof args, "timeline %s -o %s %s", json, page, replay_only[i]);
        EXPECT_RUN(args, 2, "applies to allocation traces");
        CHECK(access(page, F_OK) != 0);
    }
    /* JSON with nothing of a trace in it is refused, as an allocation
     * trace with no events is (a page with nothing on it was written). */
    static const char *const empty[] = {"[1,2,3]\n", "{\"traceEvents\":[]}\n"};
    for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) {
        const char *e = file_in_dir("empty.json", empty[i]);
        snprintf(args, sizeof args, "timeline %s -o %s", e, page);
        EXPECT_RUN(args, 1, "has nothing to draw");
        CHECK(access(page, F_OK) != 0);
    }
    /* The allocation trace is still drawn, with its replay's trace kept. */
    const char *saved = file_in_dir("keep_saved.json", NULL);
    snprintf(args, sizeof args, "timeline %s -o %s --save-trace %s", alloc, page, saved);
    EXPECT_RUN(args, 0, "wrote");
    CHECK(access(saved, F_OK) == 0);
    unlink(page);
    unlink(saved);
    unlink(link);
}

/* JSON output is UTF-8 whatever the file names hold: `replay --json` of
 * a trace whose name has a Latin-1 byte gives U+FFFD for it (the byte went
 * out as it was, which JSON readers refuse), and keeps well-formed UTF-8. */
static void test_json_names_utf8(void)
{
    char path[300], args[1024], text[4096];
    snprintf(path, sizeof path, "%s/caf\xe9-\xc3\xa9.trace", dir);
    harness_slurp(PATTERN, text, sizeof text);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fputs(text, f);
    fclose(f);
    snprintf(args, sizeof args, "replay '%s' --json", path);
    harness_checks++;
    if (run(args, false) != 0)
        harness_report(__FILE__, __LINE__, "unimem %s failed:\n%s", args, out);
    CHECK(strstr(out, "\"caf\\ufffd-\xc3\xa9.trace\"") != NULL);
    CHECK(strchr(out, '\xe9') == NULL);
    unlink(path);
}

/* demo --gpu-only where the devices give no accelerator is a command line
 * that cannot run: exit 2, as tool.h says (it was 1). The driver is shown
 * no GPU, so that a GPU machine gives none either. */
static void test_demo_gpu_only_without_gpu(void)
{
    const char *was = getenv("CUDA_VISIBLE_DEVICES");
    char *saved = was ? strdup(was) : NULL;
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    EXPECT_RUN("demo gemm --quick --gpu-only --device cuda", 2, "--gpu-only needs an accelerator");
    if (saved)
        setenv("CUDA_VISIBLE_DEVICES", saved, 1);
    else
        unsetenv("CUDA_VISIBLE_DEVICES");
    free(saved);
}

/* Every command that takes --device refuses a value that would add
 * options to its configuration (',' and '='; devices are joined with '+'),
 * with exit code 2, as an argument error. */
static void test_device_injection(void)
{
    char args[1024];
    const char *page = file_in_dir("inj.html", NULL);
    static const char *const values[] = {"'sim:2x64M,sched=eager'", "'sim:64M,sim:64M'",
                                         "'sim:64M=1'", "''"};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        const char *v = values[i];
        snprintf(args, sizeof args, "demo gemm --quick --sched locality --device %s", v);
        EXPECT_RUN(args, 2, "bad --device");
        CHECK(strstr(out, "\"sched\"") == NULL); /* nothing ran */
        snprintf(args, sizeof args, "bench alloc --quick --scenario small --device %s", v);
        EXPECT_RUN(args, 2, "bad --device");
        snprintf(args, sizeof args, "bench copy --quick --device %s", v);
        EXPECT_RUN(args, 2, "bad --device");
        snprintf(args, sizeof args, "bench oversub --quick --device %s", v);
        EXPECT_RUN(args, 2, "bad --device");
        snprintf(args, sizeof args, "replay " PATTERN " --device %s", v);
        EXPECT_RUN(args, 2, "bad --device");
        snprintf(args, sizeof args, "timeline " PATTERN " -o %s --device %s", page, v);
        EXPECT_RUN(args, 2, "bad --device");
        CHECK(access(page, F_OK) != 0);
    }
    /* bench alloc's --allocator goes into the configuration too. */
    EXPECT_RUN("bench alloc --quick --scenario small --allocator 'pool,sched=eager'", 2,
               "bad --allocator");
}

/* A --device the devices option refuses, or one that makes no
 * accelerator, is an argument error: exit code 2 in every command, with
 * the option's own message. */
static void test_device_exit_codes(void)
{
    char args[1024];
    const char *page = file_in_dir("dev.html", NULL);
    static const char *const cmds[] = {"demo gemm --quick",  "bench alloc --quick --scenario small",
                                       "bench copy --quick", "bench oversub --quick",
                                       "replay " PATTERN,    NULL};
    for (int i = 0; cmds[i]; i++) {
        snprintf(args, sizeof args, "%s --device sim:lots", cmds[i]);
        EXPECT_RUN(args, 2, "size 'lots' is not valid");
    }
    snprintf(args, sizeof args, "timeline " PATTERN " -o %s --device sim:lots", page);
    EXPECT_RUN(args, 2, "size 'lots' is not valid");
    CHECK(access(page, F_OK) != 0);
    /* info's --conf with a misspelled option (it exited 1, found by an
     * audit). */
    EXPECT_RUN("info --conf memroy_limit=1G", 2, "unknown option 'memroy_limit'");
    /* Where there is no GPU, 'cuda' makes no accelerator: nothing to run
     * on, which is the argument's fault too. */
    int version = 0, gpus = 0;
    char why[160];
    if (um_cuda_driver_info(&version, &gpus, why, sizeof why) == UM_OK && gpus > 0)
        return;
    for (int i = 1; cmds[i]; i++) {
        snprintf(args, sizeof args, "%s --device cuda", cmds[i]);
        EXPECT_RUN(args, 2, "--device cuda gives no accelerator");
    }
    snprintf(args, sizeof args, "timeline " PATTERN " -o %s --device cuda", page);
    EXPECT_RUN(args, 2, "--device cuda gives no accelerator");
    CHECK(access(page, F_OK) != 0);
}

/* `unimem demo cholesky` gives each task the priority of the task at the
 * same place in the simulator's graph (um__vs_dag_priorities), so it must
 * submit its tasks in the graph's order: the task trace it records holds
 * the graph's kernels, task by task, and so the same priorities. With 4
 * tiles a side the demo once submitted each SYRK before the GEMMs of its
 * row (task 7 a gemm where the graph has a syrk). */
static void test_demo_task_order(void)
{
    const char *trace = file_in_dir("chol_tasks.txt", NULL);
    char conf[300];
    snprintf(conf, sizeof conf, "task_trace=%s", trace);
    setenv("UNIMEM_CONF", conf, 1);
    EXPECT_RUN("demo cholesky --n 1024 --tile 256 --device sim:3x1G --no-verify --json", 0,
               "\"tasks\":20,");
    unsetenv("UNIMEM_CONF");
    um__vs_dag rec, graph;
    memset(&rec, 0, sizeof rec);
    CHECK_OK(um__vs_dag_trace(trace, &rec));
    CHECK_EQ(um__vs_dag_cholesky(1024, 256, &graph), 0);
    CHECK_EQ(rec.ntasks, graph.ntasks);
    if (rec.ntasks == graph.ntasks && graph.ntasks == 20) {
        int prec[20], pgraph[20];
        CHECK_EQ(um__vs_dag_priorities(&rec, prec), 0);
        CHECK_EQ(um__vs_dag_priorities(&graph, pgraph), 0);
        for (size_t t = 0; t < graph.ntasks; t++) {
            if (rec.tasks[t].kernel != graph.tasks[t].kernel)
                harness_report(__FILE__, __LINE__, "task %zu is %s in the demo, %s in the graph",
                               t + 1, um__vs_kernel_name(rec.tasks[t].kernel),
                               um__vs_kernel_name(graph.tasks[t].kernel));
            CHECK_EQ(prec[t], pgraph[t]);
        }
    }
    um__vs_dag_free(&rec);
    um__vs_dag_free(&graph);
    unlink(trace);
}

/* demo's --timeline goes into the configuration as the option trace_file,
 * which a ',' before "KEY=" would end: such a file name is refused as the
 * --device values above are (it once ran sched=eager and reported cost),
 * and a ',' that starts no option stays part of the name. */
static void test_demo_timeline_injection(void)
{
    char args[1024];
    const char *trace = file_in_dir("t.json,sched=eager", NULL);
    snprintf(args, sizeof args, "demo gemm --n 512 --tile 128 --json --timeline '%s'", trace);
    EXPECT_RUN(args, 2, "--timeline takes a file name without ','");
    CHECK(strstr(out, "\"sched\"") == NULL); /* nothing ran */
    CHECK(access(file_in_dir("t.json", NULL), F_OK) != 0);
    const char *comma = file_in_dir("t,1.json", NULL);
    snprintf(args, sizeof args, "demo gemm --n 512 --tile 128 --json --timeline '%s'", comma);
    EXPECT_RUN(args, 0, "\"sched\":\"cost\"");
    CHECK(access(comma, F_OK) == 0);
    unlink(comma);
}

/* bench copy's --help names the default device the command uses: the
 * first GPU alone (cuda:0), so no device-to-device row unless --device
 * names more (it once said cuda, every GPU). */
static void test_bench_copy_help(void)
{
    EXPECT_RUN("bench copy --help", 0,
               "--device SPEC the devices option (default cuda:0; sim:8G where there is no GPU)");
}

/* tool_median, the median of the benchmarks' rounds and repeats: for an
 * even count (bench alloc's record scenario has 30 rounds, or 10 with
 * --quick) the mean of the two middle values; it once took the upper one
 * (30 for 10, 20, 30, 40). */
static void test_tool_median(void)
{
    double even[] = {40, 10, 30, 20};
    CHECK(tool_median(even, 4) == 25.0);
    double two[] = {20, 10};
    CHECK(tool_median(two, 2) == 15.0);
    double odd[] = {3, 1, 2};
    CHECK(tool_median(odd, 3) == 2.0);
    double one[] = {7};
    CHECK(tool_median(one, 1) == 7.0);
    /* Thirty rounds: the mean of the 15th and 16th. */
    double rounds[30];
    for (int i = 0; i < 30; i++)
        rounds[i] = (double)((i * 7) % 30);
    CHECK(tool_median(rounds, 30) == 14.5);
}

/* bench alloc's header says what the threads rows count: each thread
 * times half the pairs, and the pairs column is their sum (4 threads of
 * 1,000 pairs show 4000), which "runs of up to 2000 pairs" alone did not
 * explain. */
static void test_bench_threads_header(void)
{
    EXPECT_RUN("bench alloc --device sim:1G --scenario threads --pairs 2000", 0,
               "In threads each\nthread times up to 1000 pairs: pairs is the threads' sum");
    CHECK(strstr(out, "\nthreads         100       4      4000 ") != NULL);
}

/* bench copy --json writes null for a figure it did not measure (the
 * pageable baseline of a pinned row, "-" in the table), never 0.000, which
 * reads as a measured rate; the pageable rows have it measured. */
static void test_bench_copy_json_unmeasured(void)
{
    EXPECT_RUN("bench copy --quick --json --repeats 1 --device sim:1G", 0,
               "\"memory\":\"pinned\",\"bytes\":1048576,");
    int pinned = 0, pageable = 0;
    for (const char *p = out; (p = strstr(p, "{\"direction\"")) != NULL; p++) {
        const char *end = strchr(p, '\n');
        const char *figure = strstr(p, "\"pageable_gbps\":");
        CHECK(end != NULL && figure != NULL && figure < end);
        if (!end || !figure || figure > end)
            break;
        figure += strlen("\"pageable_gbps\":");
        const char *memory = strstr(p, "\"memory\":\"pinned\"");
        if (memory && memory < end) {
            pinned++;
            harness_checks++;
            if (strncmp(figure, "null,", 5))
                harness_report(__FILE__, __LINE__, "a pinned row's pageable figure: %.*s",
                               (int)(end - p), p);
        } else {
            pageable++;
            char *after;
            double v = strtod(figure, &after);
            harness_checks++;
            if (after == figure || *after != ',' || !(v > 0))
                harness_report(__FILE__, __LINE__, "a pageable row's pageable figure: %.*s",
                               (int)(end - p), p);
        }
    }
    CHECK_EQ(pinned, 6); /* h2d and d2h of 1, 16 and 256 MiB */
    CHECK_EQ(pageable, 6);
}

/* sim --limit below one page of a device it cuts (the device's
 * granularity, 2 MiB unless the machine gives another) is an argument
 * error naming the option and the minimum: such a device has room for no
 * page, yet the limit was taken and the graph run. A limit of one page is
 * taken. */
static void test_sim_limit_page(void)
{
    /* Tiles of 128 KiB: three, what a gemm task needs, fit in 1 MiB. */
    EXPECT_RUN("sim --machine h200x1 --workload gemm --n 256 --tile 128 --limit 1M", 2,
               "--limit 1M is less than one page of device gpu0 (2M, its granularity): give at "
               "least 2M");
    CHECK(strstr(out, "makespan") == NULL); /* nothing ran */
    EXPECT_RUN("sim --machine h200x1 --workload gemm --n 256 --tile 128 --limit 2097151", 2,
               "--limit 2097151 is less than one page of device gpu0");
    EXPECT_RUN("sim --machine h200x1 --workload gemm --n 256 --tile 128 --limit 2M --policy eager "
               "--json", 0, "\"machine\":\"h200x1\",\"workload\":\"gemm\",\"n\":256,");
    /* A machine whose pages are 64 KiB takes a limit of 64 KiB. */
    const char *machine = file_in_dir("small_pages.machine",
                                      "machine name=small\n"
                                      "device name=host kind=host memory=1T\n"
                                      "device name=gpu kind=gpu memory=1G granularity=64K "
                                      "model=g\n"
                                      "link from=host to=gpu bandwidth=1T latency=0us\n"
                                      "link from=gpu to=host bandwidth=1T latency=0us\n"
                                      "compute model=g kernel=gemm tile=1024 seconds=0.5\n");
    char args[1024];
    snprintf(args, sizeof args, "sim --machine %s --workload gemm --n 64 --tile 32 --limit 32K",
             machine);
    EXPECT_RUN(args, 2, "--limit 32K is less than one page of device gpu (64K, its granularity): "
                        "give at least 64K");
    snprintf(args, sizeof args, "sim --machine %s --workload gemm --n 64 --tile 32 --limit 64K "
             "--policy eager --json", machine);
    EXPECT_RUN(args, 0, "\"machine\":\"small\",\"workload\":\"gemm\",\"n\":64,");
}

/* bench oversub's --workload and --policy pick the runs: one workload
 * with one policy gives one JSON line; other values, and the random
 * workload with --all-devices (which has none), are argument errors, as
 * are a --slots or --random-length out of range and slots whose buffers
 * would not be whole GPU pages. */
static void test_oversub_filters(void)
{
    EXPECT_RUN("bench oversub --quick --limit 64M --workload random --policy lru --json", 0,
               "{\"workload\":\"random\",\"oversubscription\":2.00,\"policy\":\"lru\"");
    int lines = 0;
    for (const char *p = out; (p = strstr(p, "\"workload\"")) != NULL; p++)
        lines++;
    CHECK(lines == 1);
    EXPECT_RUN("bench oversub --quick --workload streams", 2,
               "--workload takes stream or random, not 'streams'");
    EXPECT_RUN("bench oversub --quick --policy LRU", 2, "--policy takes cost or lru, not 'LRU'");
    EXPECT_RUN("bench oversub --quick --all-devices --workload random", 2,
               "--all-devices runs the stream workload only");
    EXPECT_RUN("bench oversub --quick --slots 3", 2,
               "--slots takes a whole number from 4 to 4096, not '3'");
    EXPECT_RUN("bench oversub --quick --slots 16x", 2,
               "--slots takes a whole number from 4 to 4096, not '16x'");
    EXPECT_RUN("bench oversub --quick --limit 512M --slots 24", 2,
               "the limit (512.00 MiB) over --slots 24 must be a whole multiple of 2 MiB");
    EXPECT_RUN("bench oversub --quick --random-length 0", 2,
               "--random-length takes a whole number of accesses per buffer from 1 to 1000, "
               "not '0'");
}

/* A --limit above the device's memory is an argument error naming both
 * sizes, and nothing runs: the device holds only its memory, yet replay
 * and demo reported the limit as given, and bench oversub printed its
 * table's head and then failed on an allocation of the whole limit. */
static void test_limit_above_memory(void)
{
    EXPECT_RUN("replay " PIPELINE " --device sim:1G --limit 2G", 2, "unimem replay: --limit 2.00 GiB is above device 1's memory (sim1 has "
                        "1.00 GiB)");
    CHECK(strstr(out, "peak reserved") == NULL);
    EXPECT_RUN("demo gemm --n 256 --tile 128 --device sim:2x1G --limit 3G", 2,
               "unimem demo: --limit 3.00 GiB is above device 1's memory (sim1 has 1.00 GiB)");
    CHECK(strstr(out, "makespan") == NULL);
    EXPECT_RUN("bench oversub --quick --device sim:1G --limit 2G", 2,
               "unimem bench oversub: --limit 2.00 GiB is above device 1's memory (sim1 has "
               "1.00 GiB)");
    CHECK(strstr(out, "work ") == NULL); /* no table head */
    EXPECT_RUN("bench oversub --quick --all-devices --device sim:1G+sim:2G --limit 1536M", 2,
               "--limit 1.50 GiB is above device 1's memory (sim1 has 1.00 GiB)");
    /* The whole memory is a limit. */
    EXPECT_RUN("demo gemm --n 256 --tile 128 --device sim:1G --limit 1G --sched eager", 0,
               "memory limit 1.00 GiB on each accelerator");
}

/* `unimem info` shows a cache limit of none (no cap, the default) as none
 * in the option table and null in the device list, and a limit of 0 (no
 * cache) as 0; a bad value's message names both forms. The default was 0,
 * which meant no cap. */
static void test_info_cache_limit(void)
{
    EXPECT_RUN("info --options --json --conf devices=sim:64M", 0,
               "{\"name\": \"cache_limit\", \"type\": \"size\", \"default\": \"none\", "
               "\"value\": \"none\"");
    CHECK(strstr(out, "\"name\": \"sim1\"") && strstr(out, "\"cache_limit\": null"));
    EXPECT_RUN("info --options --json --conf devices=sim:64M,cache_limit=0", 0,
               "{\"name\": \"cache_limit\", \"type\": \"size\", \"default\": \"none\", "
               "\"value\": \"0\"");
    CHECK(strstr(out, "\"cache_limit\": 0,") && !strstr(out, "\"cache_limit\": null"));
    EXPECT_RUN("info --conf cache_limit=nothing", 2,
               "option 'cache_limit' in um_init: bad value 'nothing': expected a size in bytes, "
               "optionally with a K/M/G/T suffix such as 64M or 1.5GiB, or none");
}

int main(void)
{
    if (access(BINARY, X_OK) != 0) {
        fprintf(stderr, "test_cli: %s is not built\n", BINARY);
        CHECK(false);
        return harness_finish("test_cli");
    }
    CHECK(mkdtemp(dir) != NULL);
    /* The commands inherit no options from the environment. */
    unsetenv("UNIMEM_CONF");
    test_timeline_big_counters();
    test_timeline_empty_strings();
    test_timeline_truncated_gzip();
    test_timeline_gzip_trailing();
    test_timeline_addresses();
    test_timeline_counts();
    test_timeline_keeps_its_input();
    test_timeline_byte_order_mark();
    test_json_names_utf8();
    test_device_injection();
    test_device_exit_codes();
    test_demo_task_order();
    test_demo_gpu_only_without_gpu();
    test_demo_timeline_injection();
    test_bench_copy_help();
    test_tool_median();
    test_bench_threads_header();
    test_oversub_filters();
    test_bench_copy_json_unmeasured();
    test_sim_limit_page();
    test_limit_above_memory();
    test_info_cache_limit();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return harness_finish("test_cli");
}
