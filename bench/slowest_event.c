/* The slowest single events of a trace replay: what a program waits for in
 * one um_malloc or um_free, which an average per event hides. Uses the
 * public API only, so that an older tree's library links against it too.
 * Usage: slowest_event TRACE [CONF]   (CONF: um_init's string; default
 * "devices=sim:141G"); prints the five slowest events and the mean. */
#include <unimem.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: slowest_event TRACE [CONF]\n");
        return 2;
    }
    um_context *ctx = NULL;
    um_trace *tr = NULL;
    if (um_init(argc > 2 ? argv[2] : "devices=sim:141G", &ctx) != UM_OK ||
        um_trace_open(argv[1], &tr) != UM_OK) {
        fprintf(stderr, "slowest_event: %s\n", um_last_error());
        return 1;
    }
    size_t cap = 1 << 16;
    void **ptrs = calloc(cap, sizeof *ptrs);
    double worst[5] = {0}, total = 0;
    uint64_t worst_line[5] = {0}, n = 0;
    int dev = um_device_count(ctx) - 1;
    for (;;) {
        um_trace_event ev;
        int done = 0;
        if (um_trace_next(tr, &ev, &done) != UM_OK) {
            fprintf(stderr, "slowest_event: %s\n", um_last_error());
            return 1;
        }
        if (done)
            break;
        if (ev.slot >= cap) {
            size_t ncap = cap;
            while (ncap <= ev.slot)
                ncap *= 2;
            void **p = realloc(ptrs, ncap * sizeof *p);
            if (!p)
                return 1;
            for (size_t i = cap; i < ncap; i++)
                p[i] = NULL;
            ptrs = p;
            cap = ncap;
        }
        double t0 = now_ns();
        um_status st = ev.op == UM_TRACE_ALLOC ? um_malloc(ctx, dev, ev.size, NULL, &ptrs[ev.slot])
                                               : um_free(ctx, ptrs[ev.slot], NULL);
        double dt = now_ns() - t0;
        if (st != UM_OK) {
            fprintf(stderr, "slowest_event: line %llu: %s\n", (unsigned long long)ev.line,
                    um_last_error());
            return 1;
        }
        total += dt;
        n++;
        for (int k = 0; k < 5; k++) {
            if (dt > worst[k]) {
                for (int m = 4; m > k; m--) {
                    worst[m] = worst[m - 1];
                    worst_line[m] = worst_line[m - 1];
                }
                worst[k] = dt;
                worst_line[k] = ev.line;
                break;
            }
        }
    }
    printf("%s on device %d: %llu events, mean %.1f us; slowest:", argv[1], dev,
           (unsigned long long)n, n ? total / (double)n / 1e3 : 0.0);
    for (int k = 0; k < 5; k++)
        printf(" %.3f ms (line %llu)%s", worst[k] / 1e6, (unsigned long long)worst_line[k],
               k < 4 ? "," : "\n");
    um_trace_close(tr);
    um_shutdown(ctx);
    free(ptrs);
    return 0;
}
