/* `unimem`: entry point; dispatches to the subcommands. */
#include "tool.h"

#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: unimem <command> [options]\n"
            "\n"
            "commands:\n"
            "  info [--options] [--json] [--conf \"key=value,...\"]\n"
            "                                 devices, their memory, and the option table\n"
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
            "unimem <command> --help lists all the options of a command.\n"
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
