/* `unimem`: entry point; dispatches to the subcommands. */
#include "tool.h"

#include <stdarg.h>
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
            "UNIMEM_CONF=\"key=value,...\" sets options (see unimem info --options).\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
        !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
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
    return 2;
}

int tool_fail(const char *cmd, um_status s)
{
    const char *detail = um_last_error();
    fprintf(stderr, "unimem %s: %s\n", cmd, *detail ? detail : um_strerror(s));
    return 1;
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

void tool_status(const char *fmt, ...)
{
    static int tty = -1;
    if (tty < 0)
        tty = isatty(STDERR_FILENO) == 1;
    if (!tty)
        return;
    fputs("\r\033[K", stderr);
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
    }
    fflush(stderr);
}
