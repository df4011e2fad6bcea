#include "harness.h"

#include <stdarg.h>
#include <stdlib.h>
#include <time.h>

int harness_checks;
int harness_failures;

void harness_report(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    harness_failures++;
    fprintf(stderr, "%s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

uint64_t harness_seed(const char *test_name)
{
    const char *env = getenv("UM_TEST_SEED");
    uint64_t seed;
    if (env && *env) {
        seed = strtoull(env, NULL, 0);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec;
    }
    printf("%s: seed %" PRIu64 " (rerun with UM_TEST_SEED=%" PRIu64 ")\n", test_name, seed, seed);
    fflush(stdout);
    return seed;
}

uint64_t harness_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t harness_mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

void harness_pattern(uint64_t id, uint64_t *t, size_t n)
{
    for (size_t k = 0; k < n; k++)
        t[k] = harness_mix64(id * 0x9e3779b97f4a7c15ull + k);
}

int harness_finish(const char *test_name)
{
    printf("%s: %d passed, %d failed\n", test_name, harness_checks - harness_failures,
           harness_failures);
    return harness_failures ? 1 : 0;
}
