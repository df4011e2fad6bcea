/* What one um_stats_get costs on a device with free memory in pieces: 64
 * blocks of 2 to 128 MiB, every other one freed, then N calls timed. The
 * pool's largest free size is the part that grows with the device (its
 * free range spans most of the address space reserved for the device).
 *
 *   stats_cost [CONF [N]]     (defaults: devices=sim:141G, 300)
 *
 * Built with the project (build/bench/stats_cost); by hand:
 *   cc -O2 -Iinclude bench/stats_cost.c build/libunimem.a -lz -lpthread -ldl -lm -o stats_cost
 */
#include <unimem.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const char *conf = argc > 1 ? argv[1] : "devices=sim:141G";
    int n = argc > 2 ? atoi(argv[2]) : 300;
    if (n < 1) {
        fprintf(stderr, "stats_cost: N must be at least 1\n");
        return 2;
    }
    um_context *ctx = NULL;
    if (um_init(conf, &ctx) != UM_OK) {
        fprintf(stderr, "stats_cost: %s\n", um_last_error());
        return 1;
    }
    void *p[64];
    for (int i = 0; i < 64; i++)
        if (um_malloc(ctx, 1, (size_t)(i + 1) << 21, NULL, &p[i]) != UM_OK) {
            fprintf(stderr, "stats_cost: %s\n", um_last_error());
            um_shutdown(ctx);
            return 1;
        }
    for (int i = 0; i < 64; i += 2)
        (void)um_free(ctx, p[i], NULL);
    um_stats s;
    double t0 = now_s();
    for (int i = 0; i < n; i++)
        (void)um_stats_get(ctx, 1, &s);
    double us = (now_s() - t0) / n * 1e6;
    printf("um_stats_get: %.1f us each (%s); largest free %llu bytes, reserved %llu\n", us, conf,
           (unsigned long long)s.largest_free_bytes, (unsigned long long)s.reserved_bytes);
    for (int i = 1; i < 64; i += 2)
        (void)um_free(ctx, p[i], NULL);
    um_shutdown(ctx);
    return 0;
}
