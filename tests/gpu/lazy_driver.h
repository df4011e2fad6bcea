/*
 * The stand-in CUDA driver's lazy mode (fake_cuda.c, FAKE_CUDA_LAZY_QUERIES)
 * for the tests of stream order when driver calls fail (test_cuda_order,
 * test_order_tasks, test_event_faults_mt): its entry points for tests,
 * found with dlsym, and the start and end every check shares. Lazy mode
 * keeps queued work pending until something waits for it and counts
 * memory unmapped under pending work ("unmap") and bytes two streams touch
 * unordered ("race").
 */
#ifndef UM_TEST_LAZY_DRIVER_H
#define UM_TEST_LAZY_DRIVER_H

#include "unimem.h"

#include <stdbool.h>
#include <stddef.h>

extern int (*lazy_launch)(void *stream, void *p, size_t n);
extern int (*lazy_wait)(void *waiter, void *on);
extern int (*lazy_drain)(void);
extern long (*lazy_violations)(const char *what);
extern int (*lazy_retains)(int gpu);
extern int (*cuda_fail)(const char *call, unsigned skip, unsigned times, int result);
extern void (*cuda_fail_clear)(void);

/* Violation counts at the start of a check, to report its own only. */
typedef struct counts {
    long unmap, race;
} counts;

counts counts_now(void);
long unmaps_since(counts c);
long races_since(counts c);
/* Each check starts from idle GPUs and no forced failure: work an earlier
 * check left pending (on a stream since destroyed, say) completes here and
 * cannot be blamed on the next check. Prints the check's name. */
counts check_begin(const char *name);
/* check_begin, then a context of conf; NULL (the failure reported) if it
 * cannot be made. */
um_context *check_open(const char *name, const char *conf, counts *c);
/* Ends a check: its context goes, and no memory was unmapped under
 * pending work, nor bytes touched by two streams unordered, meanwhile. */
void check_end(um_context *ctx, counts c);

/* The driver's handle of s (NULL: the default stream). */
void *native_of(um_stream s);
/* The bytes of b (n of them) that are not `byte`, read with um_buffer_read. */
size_t buffer_count_not(um_buffer *b, size_t n, int byte);

/* Under UM_TEST_FAKE_CUDA, sets the lazy mode's defaults (3 lazy queries,
 * 4 GPUs) unless set, before the driver loads, then resolves the entry
 * points: false, with "test: SKIPPED: why" printed, where this is not the
 * stand-in driver in lazy mode with at least min_gpus GPUs. */
bool lazy_driver_open(const char *test, int min_gpus);

#endif /* UM_TEST_LAZY_DRIVER_H */
