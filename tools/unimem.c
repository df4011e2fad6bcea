/* `unimem`: entry point; dispatches to the subcommands. */
#include "tool.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: unimem <command> [options]\n"
            "\n"
            "commands:\n"
            "  info [--options] [--json]      devices, their memory, and the option table\n"
            "  replay FILE [--device SPEC] [--limit BYTES] [--json] [--min-limit]\n"
            "                                 replay an allocation trace against the pool and\n"
            "                                 two baselines (no cache, MLX-style buffer cache)\n"
            "  bench alloc [--json] [--quick] time alloc+free pairs against glibc malloc\n"
            "  bench copy [--json] [--quick]  time buffer copies host<->device against plain\n"
            "                                 copies, and acquiring a valid buffer\n"
            "  bench oversub [--json] [--limit BYTES] [--all-devices]\n"
            "                                 data larger than a device (or than every device\n"
            "                                 together): bytes and time against what Belady's\n"
            "                                 MIN needs\n"
            "  bench gpu [--quick] [--verify] [--json FILE]\n"
            "                                 unimem against cudaMalloc, cudaMallocAsync and\n"
            "                                 PyTorch's allocator on CUDA device 0\n"
            "  demo gemm|cholesky [--n N] [--tile T] [--device SPEC] [--sched POLICY] [--json]\n"
            "                                 tiled matrix multiplication or Cholesky as tasks\n"
            "                                 over every device, checked against OpenBLAS\n"
            "  sim --machine M --workload gemm|cholesky|trace:F [--n N] [--tile T] [--policy P]\n"
            "                                 the same graphs on a modelled machine (h200x8,\n"
            "                                 ...) in virtual time, against the lower bound\n"
            "  timeline TRACE -o PAGE.html [--top N] [--device SPEC]\n"
            "                                 an HTML page of live/reserved/cached bytes over\n"
            "                                 time, the largest blocks, copies and evictions,\n"
            "                                 from a trace_file trace or an allocation trace\n"
            "\n"
            "UNIMEM_CONF=\"key=value,...\" sets options (see unimem info --options).\n"
            "Exit status: 0 done, 1 a failed run or bad input data, 2 a bad command line\n"
            "(bench gpu: 2 also where it cannot run).\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
        !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? TOOL_EXIT_USAGE : 0;
    }
    if (!strcmp(argv[1], "info"))
        return um_cmd_info(argc - 1, argv + 1);
    if (!strcmp(argv[1], "replay"))
        return um_cmd_replay(argc - 1, argv + 1);
    if (!strcmp(argv[1], "bench"))
        return um_cmd_bench(argc - 1, argv + 1);
    if (!strcmp(argv[1], "demo"))
        return um_cmd_demo(argc - 1, argv + 1);
    if (!strcmp(argv[1], "sim"))
        return um_cmd_sim(argc - 1, argv + 1);
    if (!strcmp(argv[1], "timeline"))
        return um_cmd_timeline(argc - 1, argv + 1);
    fprintf(stderr, "unimem: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return TOOL_EXIT_USAGE;
}

int tool_fail(const char *cmd, um_status s)
{
    const char *detail = um_last_error();
    tool_progress_clear(); /* the message gets a line of its own */
    fprintf(stderr, "unimem %s: %s\n", cmd, *detail ? detail : um_strerror(s));
    return TOOL_EXIT_FAILED;
}

const char *tool_bytes(char *buf, uint64_t bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, 32, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, 32, "%.2f %s", v, units[u]);
    return buf;
}

uint64_t tool_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

bool tool_device_arg_ok(const char *cmd, const char *value)
{
    size_t len = strlen(value);
    if (len && len <= TOOL_MAX_DEVICE_LEN && !strpbrk(value, ",="))
        return true;
    tool_progress_clear();
    fprintf(stderr,
            "unimem %s: bad --device '%s': a value of the devices option, at most %d "
            "characters, without ',' or '=' (join devices with '+', as in sim:1G+cuda)\n",
            cmd, value, TOOL_MAX_DEVICE_LEN);
    return false;
}

int tool_init_fail(const char *cmd, um_status s)
{
    int rc = tool_fail(cmd, s);
    return s == UM_ERR_BAD_OPTION ? TOOL_EXIT_USAGE : rc;
}

void tool_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p == '\t')
            fputs("\\t", f);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

int tool_other_arg(const char *cmd, const char *arg, void (*print_usage)(FILE *))
{
    if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
        print_usage(stdout);
        return 0;
    }
    fprintf(stderr, "unimem %s: unknown or incomplete argument '%s'\n\n", cmd, arg);
    print_usage(stderr);
    return 2;
}

/* The status line of tool_progress: drawn only on a terminal. */
static struct {
    int tty;            /* -1: not asked yet */
    bool shown;         /* something is on the line */
    int pct;            /* the bar's percentage drawn, -1: none */
    char what[48];      /* the bar's label drawn */
} status_line = {-1, false, -1, ""};

static bool status_tty(void)
{
    if (status_line.tty < 0)
        status_line.tty = isatty(STDERR_FILENO) == 1;
    return status_line.tty;
}

void tool_progress(const char *what, double fraction)
{
    if (!status_tty())
        return;
    int pct = fraction > 0 ? (int)(fraction * 100.0) : 0;
    pct = pct > 100 ? 100 : pct;
    if (pct == status_line.pct && !strncmp(what, status_line.what, sizeof status_line.what - 1))
        return;
    status_line.pct = pct;
    snprintf(status_line.what, sizeof status_line.what, "%s", what);
    char fill[41];
    int k = pct * 40 / 100;
    memset(fill, '#', (size_t)k);
    memset(fill + k, '.', (size_t)(40 - k));
    fill[40] = '\0';
    fprintf(stderr, "\r\033[K%-28s [%s] %3d%%", status_line.what, fill, pct);
    status_line.shown = true;
    fflush(stderr);
}

bool tool_progress_on(void) { return status_tty(); }

void tool_progress_clear(void)
{
    if (status_line.shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
    status_line.shown = false;
    status_line.pct = -1;
    status_line.what[0] = '\0';
}
