/*
 * cuda_driver: loads libcuda.so.1 once per process and resolves every entry
 * point of UM_CUDA_API_LIST. A failure at any step leaves the reason in a
 * static buffer, so every later caller can say why CUDA is absent.
 */
#include "cuda_driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static um__cuda_api loaded;
static bool load_ok;
static char load_why[256];

static void load(void)
{
    /* The driver stays loaded for the life of the process: CUDA does not
     * support being unloaded and reloaded. */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(load_why, sizeof load_why, "no CUDA driver: dlopen(\"libcuda.so.1\") failed: %s",
                 e ? e : "unknown error");
        return;
    }
#define UM_CUDA_RESOLVE_(field, symbol, params)                                                   \
    *(void **)&loaded.field = dlsym(lib, symbol);                                                 \
    if (!loaded.field) {                                                                          \
        snprintf(load_why, sizeof load_why,                                                       \
                 "the CUDA driver (libcuda.so.1) lacks %s: it is older than unimem needs "       \
                 "(CUDA 12.4 or newer)",                                                          \
                 symbol);                                                                         \
        return;                                                                                   \
    }
    UM_CUDA_API_LIST(UM_CUDA_RESOLVE_)
#undef UM_CUDA_RESOLVE_
    um_cuResult r = loaded.Init(0);
    if (r != UM_CU_SUCCESS) {
        const char *name = NULL, *text = NULL;
        loaded.GetErrorName(r, &name);
        loaded.GetErrorString(r, &text);
        snprintf(load_why, sizeof load_why, "cuInit failed: %s (%s)", name ? name : "?",
                 text ? text : "no description");
        return;
    }
    if (loaded.DriverGetVersion(&loaded.version) != UM_CU_SUCCESS)
        loaded.version = 0;
    if (loaded.DeviceGetCount(&loaded.gpus) != UM_CU_SUCCESS)
        loaded.gpus = 0;
    load_ok = true;
}

const um__cuda_api *um__cuda_load(char *why, size_t why_len)
{
    pthread_once(&load_once, load);
    if (!load_ok && why && why_len)
        snprintf(why, why_len, "%s", load_why);
    return load_ok ? &loaded : NULL;
}

um_status um__cuda_status(um_cuResult r)
{
    switch (r) {
    case UM_CU_SUCCESS:
        return UM_OK;
    case UM_CU_ERROR_OUT_OF_MEMORY:
        return UM_ERR_NOMEM;
    case UM_CU_ERROR_NOT_SUPPORTED:
        return UM_ERR_UNSUPPORTED;
    case UM_CU_ERROR_INVALID_VALUE:
        return UM_ERR_INVALID;
    default:
        return UM_ERR_BACKEND;
    }
}

um_status um__cuda_fail(um_status st, um_cuResult r, const char *fmt, ...)
{
    char what[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const char *name = NULL, *text = NULL;
    if (load_ok) {
        loaded.GetErrorName(r, &name);
        loaded.GetErrorString(r, &text);
    }
    if (name)
        return um__fail(st, "%s: %s (%s)", what, name, text ? text : "no description");
    return um__fail(st, "%s: CUDA error %d", what, r);
}

um_cuResult um__cuda_enter(const um__cuda_api *cu, um_cuContext c, um_cuContext *saved,
                           const char **failed)
{
    um_cuResult r = cu->CtxGetCurrent(saved);
    if (r != UM_CU_SUCCESS) {
        *saved = c; /* so um__cuda_leave changes nothing */
        if (failed)
            *failed = "cuCtxGetCurrent";
        return r;
    }
    if (*saved == c)
        return UM_CU_SUCCESS;
    r = cu->CtxSetCurrent(c);
    if (r != UM_CU_SUCCESS) {
        *saved = c; /* the caller's context is still current: nothing to restore */
        if (failed)
            *failed = "cuCtxSetCurrent";
    }
    return r;
}

void um__cuda_leave(const um__cuda_api *cu, um_cuContext c, um_cuContext saved)
{
    if (saved != c)
        (void)cu->CtxSetCurrent(saved);
}
