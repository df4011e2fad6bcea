/* A backend for tests that forwards to another one, fails its
 * countdown-th call, and counts what is outstanding so leaks show. */
#ifndef UM_TEST_FLAKY_H
#define UM_TEST_FLAKY_H

#include "backend/backend.h"

#include <stdbool.h>

typedef struct flaky {
    um__backend base;
    um__backend *inner;
    long countdown; /* the call that fails, counting down; 0: none */
    long copy_countdown; /* the copy (copy, copy_async) that fails; 0: none */
    bool copies_fail;    /* every copy fails */
    long reservations, chunks;
    long long mapped_bytes; /* unmap may cover several mappings */
} flaky;

/* Wraps inner (which the caller keeps and destroys). */
void flaky_init(flaky *f, um__backend *inner);

#endif
