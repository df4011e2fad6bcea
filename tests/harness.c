#include "harness.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

uint64_t harness_mix64(uint64_t x)
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
        t[k] = harness_mix64(id * 0x9e3779b97f4a7c15ull + k);
    t[0] = harness_mix64(id ^ (c << 40) ^ 0x5bd1e995u);
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

bool harness_dev_host_readable(um_context *ctx, int dev)
{
    um_device_info info;
    if (um_device_info_get(ctx, dev, &info) != UM_OK)
        return false; /* um_memcpy then says what is wrong */
    if (info.kind != UM_DEVICE_CUDA)
        return true;
    const char *fake = getenv("UM_TEST_FAKE_CUDA");
    return fake && *fake && strcmp(fake, "0") != 0;
}

/* One copy between host memory and dev's memory, complete on return. */
static void dev_copy(um_context *ctx, int dev, void *stream, void *dst, const void *src,
                     size_t n, const char *what)
{
    if (n == 0)
        return;
    if (harness_dev_host_readable(ctx, dev)) {
        memcpy(dst, src, n);
        return;
    }
    /* Counted as a check only here, so that runs on host-readable devices
     * report the same number of checks as before these helpers. */
    harness_checks++;
    um_status st;
    if (!stream) {
        st = um_memcpy(ctx, dst, src, n);
    } else {
        /* The program's stream, wrapped for the copy: the copy is queued
         * behind the work (and the stream waits) already there. */
        um_stream w = NULL;
        st = um_stream_wrap(ctx, dev, stream, &w);
        if (st == UM_OK)
            st = um_memcpy_async(ctx, dst, src, n, w);
        if (st == UM_OK)
            st = um_stream_synchronize(ctx, w);
        if (w) {
            um_status s2 = um_stream_destroy(ctx, w);
            if (st == UM_OK)
                st = s2;
        }
    }
    if (st != UM_OK)
        harness_report(__FILE__, __LINE__, "%s: %zu bytes on device %d (%p -> %p): %s (%s)", what,
                       n, dev, src, dst, um_status_name(st), um_last_error());
}

void harness_dev_read(um_context *ctx, int dev, void *dst, const void *src, size_t n)
{
    dev_copy(ctx, dev, NULL, dst, src, n, "harness_dev_read");
}

void harness_dev_write(um_context *ctx, int dev, void *dst, const void *src, size_t n)
{
    dev_copy(ctx, dev, NULL, dst, src, n, "harness_dev_write");
}

void harness_dev_read_on(um_context *ctx, int dev, void *stream, void *dst, const void *src,
                         size_t n)
{
    dev_copy(ctx, dev, stream, dst, src, n, "harness_dev_read_on");
}

void harness_dev_write_on(um_context *ctx, int dev, void *stream, void *dst, const void *src,
                          size_t n)
{
    dev_copy(ctx, dev, stream, dst, src, n, "harness_dev_write_on");
}

void *harness_dev_map(um_context *ctx, int dev, void *p, size_t n)
{
    if (!p || harness_dev_host_readable(ctx, dev))
        return p;
    void *view = malloc(n ? n : 1);
    if (!view) {
        harness_report(__FILE__, __LINE__, "harness_dev_map: no host memory for %zu bytes", n);
        return NULL;
    }
    harness_dev_read(ctx, dev, view, p, n);
    return view;
}

void harness_dev_unmap(um_context *ctx, int dev, void *p, void *view, size_t n, bool write)
{
    if (!view || view == p)
        return;
    if (write)
        harness_dev_write(ctx, dev, p, view, n);
    free(view);
}

int harness_finish(const char *test_name)
{
    printf("%s: %d passed, %d failed\n", test_name, harness_checks - harness_failures,
           harness_failures);
    return harness_failures ? 1 : 0;
}

/* Only the programs that know the build's folder (tests/test_*.c) have it. */
#ifdef UM_BINARY_DIR
int harness_run_unimem(const char *args, bool with_stderr, char *out, size_t size)
{
    char cmd[4096];
    int n = snprintf(cmd, sizeof cmd, "%s/unimem %s%s", UM_BINARY_DIR, args,
                     with_stderr ? " 2>&1" : " 2>/dev/null");
    out[0] = '\0';
    CHECK(n > 0 && (size_t)n < sizeof cmd);
    FILE *p = n > 0 && (size_t)n < sizeof cmd ? popen(cmd, "r") : NULL;
    CHECK(p != NULL);
    if (!p)
        return -1;
    size_t got = fread(out, 1, size - 1, p);
    out[got] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
#endif

bool harness_temp_file(char *tmpl)
{
    int fd = mkstemp(tmpl);
    CHECK(fd >= 0);
    if (fd < 0)
        return false;
    close(fd);
    return true;
}

const char *harness_slurp(const char *path, char *buf, size_t size)
{
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (f) {
        buf[fread(buf, 1, size - 1, f)] = '\0';
        fclose(f);
    }
    return buf;
}
