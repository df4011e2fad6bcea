/*
 * base: status messages, logging, the clock and small helpers every layer
 * uses. Owns the per-thread "last error" message and the global log level.
 * Depends on libc and pthreads only.
 */
#ifndef UM_BASE_H
#define UM_BASE_H

#include "unimem.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define UM_UNUSED(x) ((void)(x))
#define UM_LIKELY(x) __builtin_expect(!!(x), 1)
#define UM_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define UM_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* Records a message for um_last_error() and returns s, so a failure path
 * reads `return um__fail(UM_ERR_NOMEM, "device %d: ...", dev);`. The message
 * is prefixed with the status name. Also logged at debug level. */
um_status um__fail(um_status s, const char *fmt, ...) UM_PRINTF(2, 3);
/* The last error's message without its "UM_ERR_...: " prefix (st's),
 * copied into buf so that a new um__fail can quote it; st's description
 * when there is none. Returns buf. */
const char *um__error_detail(um_status st, char *buf, size_t len);
/* Clears this thread's last error (used by tests). */
void um__clear_error(void);
/* An allocator's request failed with UM_ERR_NOMEM for want of host memory
 * for its own records, not of device memory: evicting from the device
 * cannot help it (memory.c asks, and then does not reclaim). Noted per
 * thread; um__host_nomem_take answers whether it was noted since the last
 * take, and clears it. */
void um__note_host_nomem(void);
bool um__host_nomem_take(void);
/* An allocator's free returned an error although it took the block (the
 * debug allocator's report of overwritten guard bytes): noted per thread,
 * so that the caller, which must not free the block again, learns it at
 * once. Asking the allocator afterwards would race with another thread's
 * allocation of the same address. */
void um__note_free_took(void);
bool um__free_took_take(void);

typedef enum um_log_level {
    UM_LOG_ERROR = 0,
    UM_LOG_WARN = 1,
    UM_LOG_INFO = 2,
    UM_LOG_DEBUG = 3
} um_log_level;

extern _Atomic int um__log_level_current;
void um__log_set_level(um_log_level level);
void um__log_write(um_log_level level, const char *fmt, ...) UM_PRINTF(2, 3);
#define um__log(level, ...)                                                         \
    do {                                                                           \
        if ((int)(level) <= atomic_load_explicit(&um__log_level_current,           \
                                                 memory_order_relaxed))            \
            um__log_write((level), __VA_ARGS__);                                   \
    } while (0)

/* Virtual time (vtime.h): while it is on, the library's clock is it. */
extern _Atomic bool um__vt_active;
uint64_t um__vt_now(void);

static inline uint64_t um__now_ns(void)
{
    if (__builtin_expect(atomic_load_explicit(&um__vt_active, memory_order_relaxed), 0))
        return um__vt_now();
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* a is a power of two everywhere unimem aligns (pages, 256 bytes, slab
 * units), so masks replace divisions, which cost tens of cycles on the
 * allocation path when a is not a compile-time constant. */
static inline size_t um__align_up(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }
static inline size_t um__align_down(size_t x, size_t a) { return x & ~(a - 1); }
static inline bool um__is_pow2(size_t x) { return x && !(x & (x - 1)); }

/* "1.50 GiB" into buf (at least 32 bytes); returns buf. */
char *um__format_bytes(char *buf, size_t n, uint64_t bytes);

#endif /* UM_BASE_H */
