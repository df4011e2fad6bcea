/* Backend calls and reserved memory step by step while a training trace
 * (../shared/traces format, plain text: `a ID SIZE STREAM` / `f ID`)
 * replays on a sim device whose work trails by LAG events (as `unimem
 * replay --lag`): which steps the step planner learns in, which one moves
 * the pages of its arena, and from which one on no backend call is made.
 * A step boundary is every PERIOD-th large allocation (over 32 KiB) from
 * the FIRST-th (counted from 0); a line is printed at each, for the step
 * it ends (step 0: everything before FIRST). Every stream of the trace is
 * replayed on the device's default stream.
 *
 *   cc -O2 -Iinclude bench/step_calls.c build/libunimem.a -lz -lpthread -ldl -lm -o step_calls
 *   step_calls TRACE FIRST PERIOD [LAG [CONF]]     (defaults: 8, devices=sim:141G)
 *   bench/trace_repeat.py data/gpt2_train.trace.gz 3097 998 16 /tmp/gpt2_20.trace
 *   step_calls /tmp/gpt2_20.trace 1101 998
 */
#include <unimem.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LARGE (32u * 1024u)

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: step_calls TRACE FIRST PERIOD [LAG [CONF]]\n");
        return 2;
    }
    long first = atol(argv[2]), period = atol(argv[3]);
    long lag = argc > 4 ? atol(argv[4]) : 8;
    const char *conf = argc > 5 ? argv[5] : "devices=sim:141G";
    if (first < 0 || period < 1 || lag < 0) {
        fprintf(stderr, "step_calls: FIRST and LAG must be at least 0, PERIOD at least 1\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "r");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    um_context *ctx = NULL;
    if (um_init(conf, &ctx) != UM_OK) {
        fprintf(stderr, "step_calls: %s\n", um_last_error());
        return 1;
    }
    int dev = um_device_count(ctx) > 1 ? 1 : 0;
    size_t cap = 1 << 16;
    void **ptr = calloc(cap, sizeof *ptr);
    if (!ptr) {
        fprintf(stderr, "step_calls: no memory for block pointers\n");
        return 1;
    }
    char line[256];
    long large = 0, step = 0, lineno = 0;
    unsigned long long last_calls = 0;
    um_stats st;
    int rc = 0;
    printf("%5s %14s %14s %14s\n", "step", "backend calls", "reserved GiB", "live GiB");
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        unsigned long long id, size, stream;
        if (line[0] == 'a' && sscanf(line + 1, "%llu %llu %llu", &id, &size, &stream) == 3) {
            if (size > LARGE && large >= first && (large - first) % period == 0) {
                um_stats_get(ctx, dev, &st);
                /* Step 0: everything before FIRST; step k: the k-th period
                 * from FIRST on. */
                printf("%5ld %14llu %14.3f %14.3f\n", step++,
                       (unsigned long long)st.num_backend_calls - last_calls,
                       st.reserved_bytes / 1073741824.0, st.active_bytes / 1073741824.0);
                last_calls = st.num_backend_calls;
            }
            large += size > LARGE;
            while (id >= cap) {
                void **grown = realloc(ptr, 2 * cap * sizeof *ptr);
                if (!grown) {
                    fprintf(stderr, "step_calls: line %ld: no memory for block id %llu\n", lineno,
                            id);
                    return 1;
                }
                ptr = grown;
                memset(ptr + cap, 0, cap * sizeof *ptr);
                cap *= 2;
            }
            if (um_malloc(ctx, dev, size, NULL, &ptr[id]) != UM_OK) {
                fprintf(stderr, "step_calls: line %ld: %s\n", lineno, um_last_error());
                rc = 1;
            }
        } else if (line[0] == 'f' && sscanf(line + 1, "%llu", &id) == 1) {
            if (id < cap && ptr[id] && um_free(ctx, ptr[id], NULL) != UM_OK) {
                fprintf(stderr, "step_calls: line %ld: %s\n", lineno, um_last_error());
                rc = 1;
            }
            if (id < cap)
                ptr[id] = NULL;
        } else {
            continue;
        }
        /* Each event is a unit of work that the device finishes LAG
         * events later; the stream says what is queued, since a wait of
         * the allocator's completes it all. */
        uint64_t queued = 0;
        if (lag && (um_sim_stream_work(ctx, dev, NULL, 1, 0) != UM_OK ||
                    um_sim_stream_queued(ctx, dev, NULL, &queued) != UM_OK ||
                    (queued > (uint64_t)lag &&
                     um_sim_stream_work(ctx, dev, NULL, 0, (unsigned)(queued - (uint64_t)lag)) !=
                         UM_OK))) {
            fprintf(stderr, "step_calls: %s\n", um_last_error());
            rc = 1;
        }
    }
    um_stats_get(ctx, dev, &st);
    printf("total %llu backend calls, peak reserved %.3f GiB\n",
           (unsigned long long)st.num_backend_calls, st.peak_reserved_bytes / 1073741824.0);
    fclose(f);
    free(ptr);
    um_shutdown(ctx);
    return rc;
}
