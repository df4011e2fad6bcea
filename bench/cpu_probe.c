/* How fast this machine's host runs right now, sampled for as long as a
 * job runs beside it: on the GPU machine (a virtual machine) the same
 * binary's allocator pair swings between about 20 and 40 ns, and GPT-2's
 * steps between two plateaus; this probe tells whether the host's speed
 * moves with them.
 *
 * Every window of about 5 ms it runs two fixed pieces of work on its own
 * core and prints one line:
 *
 *   MONO_NS ALU_NS MEM_NS STEAL_TICKS
 *
 * MONO_NS: CLOCK_MONOTONIC at the end of the window (Python's
 * time.monotonic_ns() reads the same clock); ALU_NS: ns per step of a
 * dependent multiply-add chain (the core's clock); MEM_NS: ns per load of a
 * pointer chase through 256 MiB (memory latency); STEAL_TICKS: the
 * machine's total steal time from /proc/stat (USER_HZ ticks; time the
 * hypervisor ran something else on a virtual CPU), or -1 where unreadable.
 *
 *   cc -O2 bench/cpu_probe.c -o cpu_probe
 *   cpu_probe CORE SECONDS > probe.txt
 */
#ifndef _GNU_SOURCE /* the project's build defines it */
#define _GNU_SOURCE
#endif
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHASE_BYTES ((size_t)256 << 20)
#define LINE 64
#define ALU_STEPS 200000
#define CHASE_LOADS 4000
#define WINDOW_NS 5000000ull

static uint64_t mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static long long steal_ticks(void)
{
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return -1;
    unsigned long long v[8];
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    return n == 8 ? (long long)v[7] : -1;
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: cpu_probe CORE SECONDS\n");
        return 2;
    }
    int core = atoi(argv[1]);
    double seconds = atof(argv[2]);
    if (core < 0 || core >= CPU_SETSIZE || !(seconds > 0)) {
        fprintf(stderr, "cpu_probe: CORE must be 0..%d and SECONDS > 0\n", CPU_SETSIZE - 1);
        return 2;
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(core, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        perror("cpu_probe: sched_setaffinity");
        return 1;
    }
    /* One random cycle through every line of the buffer: each load
     * depends on the one before and no prefetcher can guess it. */
    size_t nlines = CHASE_BYTES / LINE;
    char *buf = aligned_alloc(LINE, CHASE_BYTES);
    size_t *order = malloc(nlines * sizeof *order);
    if (!buf || !order) {
        fprintf(stderr, "cpu_probe: out of memory for the %zu MiB chase buffer\n", CHASE_BYTES >> 20);
        return 1;
    }
    uint64_t seed = 42;
    for (size_t i = 0; i < nlines; i++)
        order[i] = i;
    for (size_t i = nlines - 1; i > 0; i--) {
        size_t j = (size_t)(splitmix64(&seed) % (i + 1));
        size_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (size_t i = 0; i < nlines; i++)
        *(void **)(buf + order[i] * LINE) = buf + order[(i + 1) % nlines] * LINE;
    free(order);

    void *cursor = buf;
    uint64_t acc = 1;
    uint64_t end = mono_ns() + (uint64_t)(seconds * 1e9);
    for (;;) {
        uint64_t w0 = mono_ns(), alu_ns = 0, mem_ns = 0, alu_n = 0, mem_n = 0, t;
        do {
            t = mono_ns();
            for (int i = 0; i < ALU_STEPS; i++)
                acc = acc * 6364136223846793005ull + 1442695040888963407ull;
            uint64_t t1 = mono_ns();
            for (int i = 0; i < CHASE_LOADS; i++)
                cursor = *(void **)cursor;
            uint64_t t2 = mono_ns();
            alu_ns += t1 - t, alu_n += ALU_STEPS;
            mem_ns += t2 - t1, mem_n += CHASE_LOADS;
            t = t2;
        } while (t - w0 < WINDOW_NS);
        printf("%llu %.4f %.2f %lld\n", (unsigned long long)t, (double)alu_ns / (double)alu_n,
               (double)mem_ns / (double)mem_n, steal_ticks());
        if (t >= end)
            break;
    }
    /* Keeps the work from being optimized away. */
    fprintf(stderr, "cpu_probe: done (%llu %p)\n", (unsigned long long)acc, cursor);
    return 0;
}
