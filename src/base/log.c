/* Leveled logging to stderr. The level is global: the last context created
 * sets it from its log_level option. */
#include "base.h"

#include <pthread.h>
#include <stdio.h>

_Atomic int um__log_level_current = UM_LOG_WARN;

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

void um__log_set_level(um_log_level level)
{
    atomic_store_explicit(&um__log_level_current, (int)level, memory_order_relaxed);
}

void um__log_write(um_log_level level, const char *fmt, ...)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* One fprintf under a lock so lines of concurrent threads never interleave. */
    pthread_mutex_lock(&log_lock);
    fprintf(stderr, "unimem %s: %s\n", names[level], line);
    pthread_mutex_unlock(&log_lock);
}
