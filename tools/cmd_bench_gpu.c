/*
 * `unimem bench gpu`: the allocator against cudaMalloc, cudaMallocAsync and
 * PyTorch's caching allocator on CUDA device 0, in one run (alloc+free pairs
 * by size, 10,000 live blocks of mixed sizes, 1, 4 and 16 threads). The
 * measuring program, alloc_compare (bench/gpu/alloc_compare.cpp), is C++
 * and links the CUDA runtime and PyTorch's c10, which this command must not
 * need in order to run on a machine without them; so it is built beside
 * `unimem` where the toolkit is found, and this command runs it in its
 * place with the same arguments. Owns nothing.
 */
#include "tool.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GPU_BENCH_PROGRAM "alloc_compare"
/* alloc_compare's own exit status for "no usable GPU"; used here too when
 * the program was not built, so a caller can tell "cannot run here" from
 * a failure. */
#define GPU_BENCH_UNAVAILABLE 2

static void gpu_usage(FILE *f)
{
    fprintf(f,
            "usage: unimem bench gpu [--quick] [--skip-torch] [--verify] [--json FILE] [--pin CORE]\n"
            "\n"
            "Times alloc+free pairs on CUDA device 0 for cudaMalloc, cudaMallocAsync, PyTorch's\n"
            "caching allocator and unimem, in the same run: pairs by size, 10,000 live blocks of\n"
            "mixed sizes, and 1, 4 and 16 threads. Runs %s, built beside unimem when\n"
            "CMake finds the CUDA toolkit (with PyTorch's allocator when torch is installed).\n"
            "\n"
            "  --quick       0.05 s per measurement instead of 0.3 s\n"
            "  --skip-torch  leave PyTorch's allocator out\n"
            "  --verify      write and read back a pattern in a sample of unimem's blocks\n"
            "  --json FILE   also write the rows as a JSON array to FILE\n"
            "  --pin CORE    run the single-thread scenarios on this core only\n"
            "\n"
            "Exit status: 0 ok, 1 a failure (printed), %d no usable GPU or no %s.\n",
            GPU_BENCH_PROGRAM, GPU_BENCH_UNAVAILABLE, GPU_BENCH_PROGRAM);
}

/* The folder of the running executable into dir (PATH_MAX bytes). */
static bool own_folder(char *dir)
{
    ssize_t n = readlink("/proc/self/exe", dir, PATH_MAX - 1);
    if (n <= 0)
        return false;
    dir[n] = '\0';
    char *slash = strrchr(dir, '/');
    if (!slash)
        return false;
    *slash = '\0';
    return true;
}

int um_cmd_bench_gpu(int argc, char **argv)
{
    /* argv[0] is "bench", argv[1] "gpu". */
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            gpu_usage(stdout);
            return 0;
        }
    }
    char dir[PATH_MAX], path[PATH_MAX + sizeof GPU_BENCH_PROGRAM + 1];
    if (!own_folder(dir)) {
        fprintf(stderr, "unimem bench gpu: cannot find the folder of the unimem executable "
                        "(/proc/self/exe: %s)\n", strerror(errno));
        return 1;
    }
    snprintf(path, sizeof path, "%s/%s", dir, GPU_BENCH_PROGRAM);
    if (access(path, X_OK) != 0) {
        fprintf(stderr,
                "unimem bench gpu: %s is not there (%s): it is built with unimem when CMake finds "
                "the CUDA toolkit's runtime (cuda_runtime_api.h and libcudart; set CUDA_HOME) and a "
                "C++ compiler, and not in sanitizer builds\n",
                path, strerror(errno));
        return GPU_BENCH_UNAVAILABLE;
    }
    char **args = calloc((size_t)argc, sizeof *args);
    if (!args) {
        fprintf(stderr, "unimem bench gpu: out of memory\n");
        return 1;
    }
    args[0] = path;
    for (int i = 2; i < argc; i++)
        args[i - 1] = argv[i];
    fflush(NULL);
    execv(path, args);
    fprintf(stderr, "unimem bench gpu: cannot run %s: %s\n", path, strerror(errno));
    free(args);
    return 1;
}
