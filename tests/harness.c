#include "harness.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Atomic int harness_checks;
_Atomic int harness_failures;

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

int harness_error_mentions(const char *a, const char *b, const char *c)
{
    const char *e = um_last_error();
    return strstr(e, a) && (!b || strstr(e, b)) && (!c || strstr(e, c));
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

#define PATTERN_CHUNK 4096

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* The pattern of chunk c of block id. */
static void pattern_chunk(uint64_t id, uint64_t c, uint64_t *t)
{
    for (size_t k = 0; k < PATTERN_CHUNK / 8; k++)
        t[k] = mix64(id * 0x9e3779b97f4a7c15ull + k);
    t[0] = mix64(id ^ (c << 40) ^ 0x5bd1e995u);
}

void harness_pattern_fill(void *p, size_t size, uint64_t id)
{
    uint64_t t[PATTERN_CHUNK / 8];
    for (size_t off = 0, c = 0; off < size; off += PATTERN_CHUNK, c++) {
        size_t n = size - off < PATTERN_CHUNK ? size - off : PATTERN_CHUNK;
        pattern_chunk(id, c, t);
        memcpy((unsigned char *)p + off, t, n);
    }
}

size_t harness_pattern_find_bad(const void *p, size_t size, uint64_t id, unsigned char *got,
                                unsigned char *want)
{
    uint64_t t[PATTERN_CHUNK / 8];
    const unsigned char *b = p, *e = (const unsigned char *)t;
    for (size_t off = 0, c = 0; off < size; off += PATTERN_CHUNK, c++) {
        size_t n = size - off < PATTERN_CHUNK ? size - off : PATTERN_CHUNK;
        pattern_chunk(id, c, t);
        if (memcmp(b + off, t, n) != 0) {
            size_t i = 0;
            while (b[off + i] == e[i])
                i++;
            *got = b[off + i];
            *want = e[i];
            return off + i;
        }
    }
    return SIZE_MAX;
}

void harness_run_threads(int n, void *(*fn)(void *), void *shared)
{
    harness_thread arg[64];
    pthread_t tid[64];
    if (n > 64)
        n = 64;
    int started = 0;
    for (int i = 0; i < n; i++) {
        arg[i] = (harness_thread){shared, i};
        int e = pthread_create(&tid[i], NULL, fn, &arg[i]);
        CHECK_EQ(e, 0);
        if (e)
            break;
        started++;
    }
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
}

int harness_finish(const char *test_name)
{
    printf("%s: %d passed, %d failed\n", test_name, harness_checks - harness_failures,
           harness_failures);
    return harness_failures ? 1 : 0;
}
