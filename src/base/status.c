/* Status names and messages (from UM_STATUS_LIST) and the per-thread last
 * error message. */
#include "base.h"

#include <stdio.h>
#include <string.h>

const char *um_status_name(um_status s)
{
    switch (s) {
#define UM_STATUS_NAME_(name, value, message) \
    case name:                                \
        return #name;
        UM_STATUS_LIST(UM_STATUS_NAME_)
#undef UM_STATUS_NAME_
    }
    return "UM_STATUS_UNKNOWN";
}

const char *um_strerror(um_status s)
{
    switch (s) {
#define UM_STATUS_MESSAGE_(name, value, message) \
    case name:                                   \
        return message;
        UM_STATUS_LIST(UM_STATUS_MESSAGE_)
#undef UM_STATUS_MESSAGE_
    }
    return "unknown status";
}

static _Thread_local char last_error[1024];

const char *um_last_error(void) { return last_error; }

void um__clear_error(void) { last_error[0] = '\0'; }

/* This thread's notes (base.h), one bit each. */
enum { NOTE_HOST_NOMEM = 1, NOTE_FREE_TOOK = 2 };
static _Thread_local unsigned notes;

static bool note_take(unsigned which)
{
    bool was = notes & which;
    notes &= ~which;
    return was;
}

void um__note_host_nomem(void) { notes |= NOTE_HOST_NOMEM; }
bool um__host_nomem_take(void) { return note_take(NOTE_HOST_NOMEM); }
void um__note_free_took(void) { notes |= NOTE_FREE_TOOK; }
bool um__free_took_take(void) { return note_take(NOTE_FREE_TOOK); }

um_status um__fail(um_status s, const char *fmt, ...)
{
    int n = snprintf(last_error, sizeof last_error, "%s: ", um_status_name(s));
    if (n < 0 || (size_t)n >= sizeof last_error)
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
    va_end(ap);
    um__log(UM_LOG_DEBUG, "%s", last_error);
    return s;
}

const char *um__error_detail(um_status st, char *buf, size_t len)
{
    const char *msg = last_error;
    const char *name = um_status_name(st);
    size_t nlen = strlen(name);
    if (!strncmp(msg, name, nlen) && msg[nlen] == ':' && msg[nlen + 1] == ' ')
        msg += nlen + 2;
    snprintf(buf, len, "%s", *msg ? msg : um_strerror(st));
    return buf;
}

char *um__format_bytes(char *buf, size_t n, uint64_t bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, n, "%.2f %s", v, units[u]);
    return buf;
}

const char *um_device_kind_name(um_device_kind k)
{
    switch (k) {
    case UM_DEVICE_HOST:
        return "host";
    case UM_DEVICE_SIM:
        return "sim";
    case UM_DEVICE_CUDA:
        return "cuda";
    }
    return "unknown";
}
