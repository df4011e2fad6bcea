/* A small test harness: value-checking assertions that report the file,
 * line and both values, a seeded random generator whose seed is printed, and
 * a summary line. Failures do not abort, so one run shows every failure. */
#ifndef UM_TEST_HARNESS_H
#define UM_TEST_HARNESS_H

#include "unimem.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>

extern int harness_checks;
extern int harness_failures;

void harness_report(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

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

/* Seed from UM_TEST_SEED, else from the clock; printed so a failure can be
 * replayed. */
uint64_t harness_seed(const char *test_name);
/* splitmix64 step. */
uint64_t harness_rand(uint64_t *state);
/* A 64-bit mixing function (MurmurHash3's finalizer). */
uint64_t harness_mix64(uint64_t x);
/* Fills t[0..n) with a pattern that depends on id (for byte-exact checks). */
void harness_pattern(uint64_t id, uint64_t *t, size_t n);
/* Prints "<name>: N passed, N failed" and returns the exit status. */
int harness_finish(const char *test_name);

#endif
