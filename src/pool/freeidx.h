/*
 * freeidx: a two-level segregated-fit index of free ranges (TLSF-style), the
 * structure behind the pool's best fit. 16 classes per power of two; a
 * lookup finds the smallest class that can hold the request through two
 * bitmaps (O(1)), then looks at a bounded number of candidates in the class
 * of the request and in the next non-empty one, keeping the tightest fit
 * (lowest address on ties); when no larger class has an entry, the whole
 * class of the request, so a fit that exists is always found. Owns
 * nothing: entries are embedded in the caller's range records.
 */
#ifndef UM_FREEIDX_H
#define UM_FREEIDX_H

#include <stddef.h>
#include <stdint.h>

#define UM_FI_SL_BITS 4
#define UM_FI_SL_COUNT (1u << UM_FI_SL_BITS)
#define UM_FI_FL_COUNT 64

typedef struct um__fi_node {
    struct um__fi_node *prev, *next;
    uintptr_t addr;
    size_t size;
} um__fi_node;

typedef struct um__freeidx {
    uint64_t fl_bitmap;
    uint32_t sl_bitmap[UM_FI_FL_COUNT];
    um__fi_node *heads[UM_FI_FL_COUNT][UM_FI_SL_COUNT];
    size_t count;
    size_t bytes;
} um__freeidx;

void um__fi_init(um__freeidx *fi);
/* node->addr and node->size must be set; size >= 1. */
void um__fi_insert(um__freeidx *fi, um__fi_node *node);
void um__fi_remove(um__freeidx *fi, um__fi_node *node);
/* The best candidate of size >= size, or NULL. Does not remove it. */
um__fi_node *um__fi_find(const um__freeidx *fi, size_t size);
/* A quick fit of size >= size and <= most, or NULL: the first such entry
 * among the first few of the request's class, else the head of the next
 * non-empty class. Touches at most a few entries (a cache whose entries
 * are cold wants any close fit, not the tightest). Does not remove it. */
um__fi_node *um__fi_find_near(const um__freeidx *fi, size_t size, size_t most);
/* Size of the largest entry (exact within the top non-empty class). */
size_t um__fi_largest(const um__freeidx *fi);

#endif
