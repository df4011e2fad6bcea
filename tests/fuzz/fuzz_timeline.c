/*
 * fuzz_timeline: `unimem timeline` (tools/cmd_timeline.c, its JSON reader
 * tools/json_reader.c and the page of tools/timeline_page.c) on the
 * fuzzer's bytes as a Chrome trace, written to a memfd and named as
 * /proc/self/fd/N; the page goes to a second memfd. Inputs whose first
 * byte after white space is not '{' or '[' are not Chrome traces to the
 * command (it replays them as allocation traces, which fuzz_trace covers)
 * and are skipped.
 *
 * What holds of any input: the command exits 0 or 1 (its arguments are
 * valid, so never 2); a run that exits 0 wrote a whole page (from the
 * doctype to "</html>"), whose data element holds no '<' (so no text of
 * the trace, such as a device name "</script>", can end it early) and ends
 * with the data's own end; and a second run on the same bytes exits the
 * same and writes the same page, byte for byte.
 *
 * The command's messages (stdout and stderr) are silenced while it runs;
 * set FUZZ_TIMELINE_VERBOSE=1 to see them when replaying an input.
 */
#include "fuzz_common.h"

#include "../../tools/tool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#define TIMELINE_MAX_INPUT (1u << 20)

static int trace_fd = -1, page_fd = -1, null_fd = -1;
static char trace_path[64], page_path[64];
static bool verbose;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    unsetenv("UNIMEM_CONF");
    unsetenv("UNIMEM_SHOW_STATS");
    trace_fd = memfd_create("fuzz_timeline_trace", 0);
    page_fd = memfd_create("fuzz_timeline_page", 0);
    null_fd = open("/dev/null", O_WRONLY);
    FUZZ_CHECK(trace_fd >= 0 && page_fd >= 0 && null_fd >= 0, "no memfd or /dev/null");
    snprintf(trace_path, sizeof trace_path, "/proc/self/fd/%d", trace_fd);
    snprintf(page_path, sizeof page_path, "/proc/self/fd/%d", page_fd);
    const char *v = getenv("FUZZ_TIMELINE_VERBOSE");
    verbose = v && *v == '1';
    return 0;
}

/* Runs the command on the trace memfd; returns its exit code and the page
 * it wrote (malloc'ed, NUL-terminated; *len bytes), or NULL for none. */
static int run_timeline(char **page, size_t *len)
{
    FUZZ_CHECK(ftruncate(page_fd, 0) == 0, "cannot empty the page's memfd");
    char *argv[] = {"timeline", trace_path, "-o", page_path, NULL};
    int saved_out = -1, saved_err = -1;
    if (!verbose) {
        fflush(stdout);
        fflush(stderr);
        saved_out = dup(STDOUT_FILENO);
        saved_err = dup(STDERR_FILENO);
        dup2(null_fd, STDOUT_FILENO);
        dup2(null_fd, STDERR_FILENO);
    }
    int rc = um_cmd_timeline(4, argv);
    if (!verbose) {
        fflush(stdout);
        fflush(stderr);
        dup2(saved_out, STDOUT_FILENO);
        dup2(saved_err, STDERR_FILENO);
        close(saved_out);
        close(saved_err);
    }
    off_t size = lseek(page_fd, 0, SEEK_END);
    FUZZ_CHECK(size >= 0, "cannot size the page");
    *page = malloc((size_t)size + 1);
    FUZZ_CHECK(*page != NULL, "no memory for a page of %lld bytes", (long long)size);
    FUZZ_CHECK(pread(page_fd, *page, (size_t)size, 0) == size, "cannot read the page back");
    (*page)[size] = '\0';
    *len = (size_t)size;
    return rc;
}

static void check_page(const char *page, size_t len)
{
    static const char head[] = "<!DOCTYPE html>\n", tail[] = "</html>\n";
    static const char data_open[] = "<script type=\"application/json\" id=\"data\">\n";
    FUZZ_CHECK(len >= sizeof head + sizeof tail && !memcmp(page, head, sizeof head - 1) &&
                   !memcmp(page + len - (sizeof tail - 1), tail, sizeof tail - 1),
               "a page of %zu bytes without its doctype or its end", len);
    FUZZ_CHECK(strlen(page) == len, "a NUL byte inside the page");
    const char *data = strstr(page, data_open);
    FUZZ_CHECK(data != NULL, "no data element in the page");
    data += sizeof data_open - 1;
    const char *end = strchr(data, '<');
    FUZZ_CHECK(end && !strncmp(end, "</script>", 9), "the data element holds a '<'");
    FUZZ_CHECK(end - data >= 3 && !memcmp(end - 3, "]}\n", 3),
               "the data element ends before the data's end");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > TIMELINE_MAX_INPUT)
        return 0;
    size_t i = 0;
    while (i < size && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r'))
        i++;
    if (i == size || (data[i] != '{' && data[i] != '['))
        return 0;
    FUZZ_CHECK(ftruncate(trace_fd, 0) == 0 && pwrite(trace_fd, data, size, 0) == (ssize_t)size,
               "cannot write the input to its memfd");
    char *first = NULL, *second = NULL;
    size_t first_len = 0, second_len = 0;
    int rc = run_timeline(&first, &first_len);
    FUZZ_CHECK(rc == 0 || rc == TOOL_EXIT_FAILED, "exit code %d", rc);
    if (rc == 0)
        check_page(first, first_len);
    int again = run_timeline(&second, &second_len);
    FUZZ_CHECK(again == rc, "exit code %d, then %d on the same bytes", rc, again);
    FUZZ_CHECK(rc != 0 || (first_len == second_len && !memcmp(first, second, first_len)),
               "two pages of the same trace differ (%zu and %zu bytes)", first_len, second_len);
    free(first);
    free(second);
    return 0;
}
