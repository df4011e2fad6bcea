/* Shared by the libFuzzer harnesses of tests/fuzz: a check that aborts
 * (libFuzzer then keeps the input as a crash), and a byte reader that
 * decodes the fuzzer's input into values. */
#ifndef UM_FUZZ_COMMON_H
#define UM_FUZZ_COMMON_H

#include "unimem.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* An invariant that does not hold: print what and where, then abort so
 * that libFuzzer saves the input. */
#define FUZZ_CHECK(cond, ...)                                                                \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, "\n  um_last_error: %s\n", um_last_error());                    \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

/* A failing call must leave a message that starts with its status name. */
static inline bool fuzz_error_names(um_status st)
{
    const char *e = um_last_error();
    const char *name = um_status_name(st);
    size_t n = strlen(name);
    return e && e[0] && strncmp(e, name, n) == 0 && e[n] == ':';
}

typedef struct fuzz_reader {
    const uint8_t *p;
    size_t left;
} fuzz_reader;

static inline bool fuzz_more(const fuzz_reader *r)
{
    return r->left > 0;
}

static inline uint8_t fuzz_u8(fuzz_reader *r)
{
    if (!r->left)
        return 0;
    r->left--;
    return *r->p++;
}

static inline uint16_t fuzz_u16(fuzz_reader *r)
{
    uint16_t lo = fuzz_u8(r);
    return (uint16_t)(lo | (uint16_t)fuzz_u8(r) << 8);
}

static inline uint32_t fuzz_u32(fuzz_reader *r)
{
    uint32_t lo = fuzz_u16(r);
    return lo | (uint32_t)fuzz_u16(r) << 16;
}

/* A small deterministic generator for contents (splitmix64). */
static inline uint64_t fuzz_mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#endif
