/* What reading a clock costs on this machine: rdtsc, rdtscp and
 * clock_gettime(CLOCK_MONOTONIC) (and its _COARSE variant), each called
 * 10 million times in a loop; ns per call. The trace recorder (issue 8)
 * reads one clock per event. Usage: clock_cost */
#ifndef _GNU_SOURCE /* the project's build defines it */
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#define N 10000000
int main(void)
{
    volatile uint64_t sink = 0;
    uint64_t t0 = now_ns();
#if defined(__x86_64__)
    for (int i = 0; i < N; i++)
        sink += __rdtsc();
    uint64_t t1 = now_ns();
    unsigned aux;
    for (int i = 0; i < N; i++)
        sink += __rdtscp(&aux);
    uint64_t t2 = now_ns();
    printf("rdtsc %.2f ns, rdtscp %.2f ns\n", (double)(t1 - t0) / N, (double)(t2 - t1) / N);
#endif
    struct timespec ts;
    t0 = now_ns();
    for (int i = 0; i < N; i++) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        sink += (uint64_t)ts.tv_nsec;
    }
    uint64_t t1b = now_ns();
    for (int i = 0; i < N; i++) {
        clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
        sink += (uint64_t)ts.tv_nsec;
    }
    uint64_t t2b = now_ns();
    printf("clock_gettime MONOTONIC %.2f ns, MONOTONIC_COARSE %.2f ns\n", (double)(t1b - t0) / N,
           (double)(t2b - t1b) / N);
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    char cs[64] = "?";
    if (f && fgets(cs, sizeof cs, f))
        printf("clocksource: %s", cs);
    if (f)
        fclose(f);
    return (int)(sink & 0);
}
