/*
 * What timing a copy with events costs on this GPU: the transfer engine
 * times a copy on a stream between two timed events (cuEventElapsedTime).
 * Per iteration, a 1 MiB device-to-device cuMemcpyAsync on a stream and a
 * wait for it, as: plain (one event without timing after the copy), timed
 * (a timed event before and after it, and cuEventElapsedTime), timed end
 * only, and timed without the elapsed call; then the host's cost of one
 * cuEventRecord of each kind alone, and of asking an idle stream
 * (cuStreamQuery) and a completed event (cuEventQuery) whether they are
 * done, as the engine does to decide whether to time a copy. Rounds alternate the variants; the
 * median of each is printed in microseconds per iteration.
 * Build: cc -O2 -Isrc -Iinclude bench/gpu/event_cost.c BUILD/libunimem.a -lz -lpthread -ldl -lm
 */
#include "driver_open.h"
#include "base/vtime.h"

#include <stdlib.h>

#define ITERS 2000
#define ROUNDS 7
#define SIZE ((size_t)1 << 20)

#define CK(call)                                                                                  \
    do {                                                                                          \
        um_cuResult r_ = (call);                                                                  \
        if (r_ != UM_CU_SUCCESS) {                                                                \
            fprintf(stderr, "%s failed: %d\n", #call, r_);                                        \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

enum { PLAIN, TIMED, END_ONLY, NO_ELAPSED, RECORD_PLAIN, RECORD_TIMED, QUERY_STREAM, QUERY_EVENT,
       NVARIANTS };
static const char *names[NVARIANTS] = {"copy + plain event", "copy timed (2 events + elapsed)",
                                       "copy + timed end event", "copy timed, no elapsed call",
                                       "cuEventRecord, plain", "cuEventRecord, timed",
                                       "cuStreamQuery, idle stream",
                                       "cuEventQuery, completed event"};

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void)
{
    bench_driver drv;
    int rc = bench_driver_open("event_cost", &drv);
    if (rc)
        return rc;
    const um__cuda_api *cu = drv.cu;
    um_cuDeviceptr a, b;
    CK(cu->MemAlloc(&a, SIZE));
    CK(cu->MemAlloc(&b, SIZE));
    um_cuStream s;
    CK(cu->StreamCreate(&s, UM_CU_STREAM_NON_BLOCKING));
    um_cuEvent plain, t0, t1;
    CK(cu->EventCreate(&plain, UM_CU_EVENT_DISABLE_TIMING));
    CK(cu->EventCreate(&t0, 0));
    CK(cu->EventCreate(&t1, 0));
    double us[NVARIANTS][ROUNDS];
    float ms = 0;
    double sum = 0;
    long timed = 0;
    for (int r = 0; r < ROUNDS; r++) {
        for (int k = 0; k < NVARIANTS; k++) {
            int v = r % 2 ? NVARIANTS - 1 - k : k;
            uint64_t start = um__now_ns();
            for (int i = 0; i < ITERS; i++) {
                switch (v) {
                case PLAIN:
                    CK(cu->MemcpyAsync(b, a, SIZE, s));
                    CK(cu->EventRecord(plain, s));
                    CK(cu->EventSynchronize(plain));
                    break;
                case TIMED:
                case NO_ELAPSED:
                    CK(cu->EventRecord(t0, s));
                    CK(cu->MemcpyAsync(b, a, SIZE, s));
                    CK(cu->EventRecord(t1, s));
                    CK(cu->EventSynchronize(t1));
                    if (v == TIMED) {
                        CK(cu->EventElapsedTime(&ms, t0, t1));
                        sum += ms;
                        timed++;
                    }
                    break;
                case END_ONLY:
                    CK(cu->MemcpyAsync(b, a, SIZE, s));
                    CK(cu->EventRecord(t1, s));
                    CK(cu->EventSynchronize(t1));
                    break;
                case RECORD_PLAIN:
                    CK(cu->EventRecord(plain, s));
                    break;
                case RECORD_TIMED:
                    CK(cu->EventRecord(t1, s));
                    break;
                case QUERY_STREAM:
                    CK(cu->StreamQuery(s));
                    break;
                case QUERY_EVENT:
                    CK(cu->EventQuery(plain));
                    break;
                }
            }
            CK(cu->StreamSynchronize(s));
            us[v][r] = (double)(um__now_ns() - start) / 1e3 / ITERS;
        }
    }
    printf("event_cost: %d iterations a round, %d rounds; 1 MiB copies on the device "
           "(mean copy %.2f us by its events)\n", ITERS, ROUNDS, timed ? sum / (double)timed * 1e3 : 0.0);
    for (int v = 0; v < NVARIANTS; v++) {
        qsort(us[v], ROUNDS, sizeof us[v][0], cmp);
        printf("  %-34s %8.2f us (min %.2f, max %.2f)\n", names[v], us[v][ROUNDS / 2], us[v][0],
               us[v][ROUNDS - 1]);
    }
    return 0;
}
