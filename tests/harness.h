/* A small test harness: value-checking assertions that report the file,
 * line and both values, a seeded random generator whose seed is printed, and
 * a summary line. Failures do not abort, so one run shows every failure. */
#ifndef UM_TEST_HARNESS_H
#define UM_TEST_HARNESS_H

#include "unimem.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Atomic: multi-threaded tests check from every thread. */
extern _Atomic int harness_checks;
extern _Atomic int harness_failures;

void harness_report(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* 1 in a build under AddressSanitizer or ThreadSanitizer (gcc or clang),
 * whose instrumentation makes a test's work several times slower: tests
 * scale their operation counts and wall-clock bounds by it. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HARNESS_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define HARNESS_SANITIZED 1
#endif
#endif
#ifndef HARNESS_SANITIZED
#define HARNESS_SANITIZED 0
#endif

#define CHECK(cond)                                                                  \
    do {                                                                             \
        harness_checks++;                                                            \
        if (!(cond))                                                                 \
            harness_report(__FILE__, __LINE__, "CHECK(%s) failed", #cond);           \
    } while (0)

#define CHECK_EQ(a, b)                                                               \
    do {                                                                             \
        unsigned long long check_a_ = (unsigned long long)(a);                       \
        unsigned long long check_b_ = (unsigned long long)(b);                       \
        harness_checks++;                                                            \
        if (check_a_ != check_b_)                                                    \
            harness_report(__FILE__, __LINE__, "%s == %s failed: %llu != %llu", #a,  \
                           #b, check_a_, check_b_);                                  \
    } while (0)

/* Checks that doubles a and b agree within tol, relative to the larger of
 * them, or absolute below 1 (tol 0: exactly). */
#define CHECK_NEAR(a, b, tol)                                                        \
    do {                                                                             \
        double near_a_ = (a), near_b_ = (b);                                         \
        double near_s_ = fabs(near_a_) > fabs(near_b_) ? fabs(near_a_) : fabs(near_b_); \
        harness_checks++;                                                            \
        if (!(fabs(near_a_ - near_b_) <= (tol) * (near_s_ > 1 ? near_s_ : 1)))       \
            harness_report(__FILE__, __LINE__, "%s ~= %s failed: %.17g != %.17g", #a, \
                           #b, near_a_, near_b_);                                    \
    } while (0)

/* Checks that expr returns status st, printing um_last_error() otherwise. */
#define CHECK_STATUS(expr, st)                                                       \
    do {                                                                             \
        um_status check_s_ = (expr);                                                 \
        harness_checks++;                                                            \
        if (check_s_ != (st))                                                        \
            harness_report(__FILE__, __LINE__, "%s returned %s, expected %s (%s)",   \
                           #expr, um_status_name(check_s_), um_status_name(st),      \
                           um_last_error());                                         \
    } while (0)
#define CHECK_OK(expr) CHECK_STATUS(expr, UM_OK)

/* Checks that this thread's last error mentions a, and b and c unless
 * they are NULL. */
#define CHECK_ERROR_MENTIONS(a, b, c)                                                              \
    do {                                                                                           \
        harness_checks++;                                                                          \
        if (!harness_error_mentions((a), (b), (c)))                                                \
            harness_report(__FILE__, __LINE__, "last error '%s' does not mention %s/%s/%s",        \
                           um_last_error(), (a), (b) ? (b) : "-", (c) ? (c) : "-");                \
    } while (0)
int harness_error_mentions(const char *a, const char *b, const char *c);

/* Seed from UM_TEST_SEED, else from the clock; printed so a failure can be
 * replayed. */
uint64_t harness_seed(const char *test_name);
/* splitmix64 step. */
uint64_t harness_rand(uint64_t *state);
/* A 64-bit finalizer (MurmurHash3's): well-mixed words from ids. */
uint64_t harness_mix64(uint64_t x);
/* Block patterns for byte-exact checks: every 4 KiB chunk of a block holds
 * a pattern of its id, with word 0 of each chunk replaced by a value of
 * (id, chunk), so a byte out of place is caught as well as a wrong byte. */
void harness_pattern_fill(void *p, size_t size, uint64_t id);
/* Offset of the first byte that differs from the pattern, or SIZE_MAX;
 * *got and *want receive that byte and the expected one. */
size_t harness_pattern_find_bad(const void *p, size_t size, uint64_t id, unsigned char *got,
                                unsigned char *want);
/* Runs fn in n threads (at most 64) and waits for them; each gets a
 * harness_thread with the shared state and its index 0..n-1. */
typedef struct harness_thread {
    void *shared;
    int id;
} harness_thread;
void harness_run_threads(int n, void *(*fn)(void *), void *shared);

/* Runs the build's `unimem ARGS` through the shell, its stdout (and its
 * stderr when with_stderr; else that is discarded) into out, cut at
 * size - 1 bytes and NUL-terminated; returns the exit status, or -1 when
 * it did not exit (a failed check when it could not be started). */
int harness_run_unimem(const char *args, bool with_stderr, char *out, size_t size);

/* Device memory in checks. The host may dereference the memory of host
 * and sim devices, and a CUDA device's when UM_TEST_FAKE_CUDA=1 says that
 * the stand-in driver of CI is loaded (its GPU memory is host memory), but
 * not a real GPU's. Tests read and write replicas through these helpers: a
 * memcpy where the host can reach dev's memory (so sim and fake runs do
 * exactly what they did before), a um_memcpy otherwise. A copy failure is
 * reported as a failed check. */
bool harness_dev_host_readable(um_context *ctx, int dev);
/* n bytes of dev's memory at src into host memory dst, and back. The copy
 * runs on dev's default stream, where um_buffer_acquire with a NULL stream
 * makes the replica ready, and is complete on return. */
void harness_dev_read(um_context *ctx, int dev, void *dst, const void *src, size_t n);
void harness_dev_write(um_context *ctx, int dev, void *dst, const void *src, size_t n);
/* The same on `stream`, a native stream of dev (a task's e->stream; NULL:
 * the default stream), for data made ready for work queued there. */
void harness_dev_read_on(um_context *ctx, int dev, void *stream, void *dst, const void *src,
                         size_t n);
void harness_dev_write_on(um_context *ctx, int dev, void *stream, void *dst, const void *src,
                          size_t n);
/* A host view of n bytes of dev's memory at p, for checks that read or
 * change a replica in place: p itself where the host can reach it, else a
 * copy of it in malloc'd memory (NULL if p is NULL or no memory).
 * harness_dev_unmap copies the view back into p when `write`, and frees
 * the copy. */
void *harness_dev_map(um_context *ctx, int dev, void *p, size_t n);
void harness_dev_unmap(um_context *ctx, int dev, void *p, void *view, size_t n, bool write);

/* Prints "<name>: N passed, N failed" and returns the exit status. */
int harness_finish(const char *test_name);

/* Makes the empty file tmpl (a mkstemp template, completed in place);
 * false, with a failed check, when it cannot. */
bool harness_temp_file(char *tmpl);
/* The file at path into buf, NUL-terminated and cut at size - 1 bytes;
 * empty, with a failed check, when it cannot be opened. Returns buf. */
const char *harness_slurp(const char *path, char *buf, size_t size);

#endif
