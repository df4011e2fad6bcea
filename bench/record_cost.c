/* What recording a trace adds to a warm pair, on the public API alone: a
 * ring of 100 live blocks of 256 B-2 KiB on a device, then pairs that each
 * free one and allocate the next in its place, timed in two rounds (the
 * first warms up). Run it with and without trace_file in CONF; an event
 * costs (pair recorded - pair not) / 2.
 *
 *   cc -O2 -g -Iinclude bench/record_cost.c build/libunimem.a -lz -lpthread -ldl -lm -o record_cost
 *   record_cost [CONF [PAIRS]]     (defaults: devices=sim:4G, 3000000)
 *
 * Under callgrind, counting only inside the two calls:
 *   valgrind --tool=callgrind --toggle-collect=um_malloc --toggle-collect=um_free \
 *       record_cost devices=sim:4G,host_capacity=1G,va_factor=1[,trace_file=F] 200000
 */
#include <unimem.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define RING 100

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    const char *conf = argc > 1 ? argv[1] : "devices=sim:4G";
    long pairs = argc > 2 ? atol(argv[2]) : 3000000;
    if (pairs < 1) {
        fprintf(stderr, "record_cost: PAIRS must be at least 1\n");
        return 2;
    }
    um_context *ctx = NULL;
    if (um_init(conf, &ctx) != UM_OK) {
        fprintf(stderr, "record_cost: %s\n", um_last_error());
        return 1;
    }
    int dev = um_device_count(ctx) > 1 ? 1 : 0;
    void *ring[RING];
    for (int i = 0; i < RING; i++)
        if (um_malloc(ctx, dev, 256 + 256 * (size_t)(i % 8), NULL, &ring[i]) != UM_OK) {
            fprintf(stderr, "record_cost: filling the ring: %s\n", um_last_error());
            return 1;
        }
    for (int round = 0; round < 2; round++) {
        double t0 = now_ns();
        for (long i = 0; i < pairs; i++) {
            int k = (int)(i % RING);
            if (um_free(ctx, ring[k], NULL) != UM_OK ||
                um_malloc(ctx, dev, 256 + 256 * (size_t)(i % 8), NULL, &ring[k]) != UM_OK) {
                fprintf(stderr, "record_cost: pair %ld: %s\n", i, um_last_error());
                return 1;
            }
        }
        printf("round %d: %.1f ns a pair\n", round + 1, (now_ns() - t0) / (double)pairs);
    }
    for (int i = 0; i < RING; i++)
        (void)um_free(ctx, ring[i], NULL);
    um_shutdown(ctx);
    return 0;
}
