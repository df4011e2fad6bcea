/*
 * A small open-addressing map from live pointers to 64-bit ids, for the
 * UNIMEM_TORCH_TRACE recorder of unimem_torch.c. It is a header of static
 * functions so that tests/gpu/test_torch_shim.c can drive it with made-up
 * addresses: the pointers a real run frees and reuses cannot show how the
 * table behaves over millions of distinct addresses.
 *
 * Two properties matter for a trace of a long run:
 *  - Its size follows the live pointers, not every pointer ever seen: a
 *    removed entry leaves a marker (probes must pass over it), and when
 *    markers and live entries fill half of the table it is rebuilt, at the
 *    same size when the markers are most of it, doubled only when the live
 *    entries need the room.
 *  - GPU blocks are aligned to 2 MiB and more, so the low bits of a pointer
 *    are all zeros: the slot comes from the high bits of a 64-bit mix of
 *    the whole pointer, in which every input bit moves every output bit.
 */
#ifndef UNIMEM_TORCH_PTR_TABLE_H
#define UNIMEM_TORCH_PTR_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* Slot markers: no real pointer is 0 or 1. */
#define UMT_SLOT_EMPTY ((uintptr_t)0)
#define UMT_SLOT_REMOVED ((uintptr_t)1)

typedef struct umt_ptr_slot {
    uintptr_t ptr; /* UMT_SLOT_EMPTY, UMT_SLOT_REMOVED or a live pointer */
    uint64_t id;
} umt_ptr_slot;

typedef struct umt_ptr_table {
    umt_ptr_slot *slots;
    unsigned bits;  /* the table has 1 << bits slots */
    size_t live;    /* slots holding a pointer */
    size_t removed; /* slots marked UMT_SLOT_REMOVED */
} umt_ptr_table;

static inline size_t umt_ptr_table_capacity(const umt_ptr_table *t)
{
    return (size_t)1 << t->bits;
}

/* The first slot to probe for ptr: the high bits of the MurmurHash3 64-bit
 * finalizer of the pointer. */
static inline size_t umt_ptr_table_home(const umt_ptr_table *t, uintptr_t ptr)
{
    uint64_t h = (uint64_t)ptr;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return (size_t)(h >> (64 - t->bits));
}

/* false when there is no memory for 1 << bits slots (bits 1..40). */
static inline bool umt_ptr_table_init(umt_ptr_table *t, unsigned bits)
{
    t->slots = calloc((size_t)1 << bits, sizeof *t->slots);
    t->bits = bits;
    t->live = 0;
    t->removed = 0;
    return t->slots != NULL;
}

static inline void umt_ptr_table_destroy(umt_ptr_table *t)
{
    free(t->slots);
    t->slots = NULL;
    t->live = 0;
    t->removed = 0;
}

/* The slot holding ptr, or NULL. */
static inline umt_ptr_slot *umt_ptr_table_find(umt_ptr_table *t, uintptr_t ptr)
{
    size_t mask = umt_ptr_table_capacity(t) - 1;
    for (size_t i = umt_ptr_table_home(t, ptr);; i = (i + 1) & mask) {
        umt_ptr_slot *s = &t->slots[i];
        if (s->ptr == ptr)
            return s;
        if (s->ptr == UMT_SLOT_EMPTY)
            return NULL;
    }
}

/* Rebuilds the table with 1 << bits slots and no removal markers; false
 * (the table unchanged) when there is no memory. */
static inline bool umt_ptr_table_rebuild(umt_ptr_table *t, unsigned bits)
{
    umt_ptr_table grown;
    if (!umt_ptr_table_init(&grown, bits))
        return false;
    size_t mask = umt_ptr_table_capacity(&grown) - 1;
    size_t old_capacity = umt_ptr_table_capacity(t);
    for (size_t j = 0; j < old_capacity; j++) {
        const umt_ptr_slot *s = &t->slots[j];
        if (s->ptr == UMT_SLOT_EMPTY || s->ptr == UMT_SLOT_REMOVED)
            continue;
        size_t i = umt_ptr_table_home(&grown, s->ptr);
        while (grown.slots[i].ptr != UMT_SLOT_EMPTY)
            i = (i + 1) & mask;
        grown.slots[i] = *s;
        grown.live++;
    }
    free(t->slots);
    *t = grown;
    return true;
}

/* Maps ptr to id, replacing the id it had. false when the table had to be
 * rebuilt and there was no memory for it. */
static inline bool umt_ptr_table_put(umt_ptr_table *t, uintptr_t ptr, uint64_t id)
{
    umt_ptr_slot *known = umt_ptr_table_find(t, ptr);
    if (known) {
        known->id = id;
        return true;
    }
    /* Live entries and markers together stay at most half the slots, so
     * every probe ends at an empty slot within a few steps. Doubling only
     * when the live entries alone fill a quarter keeps at least a quarter
     * of the table free for inserts after each rebuild, so rebuilds cost
     * O(1) per insert whichever way the table was filled. */
    size_t capacity = umt_ptr_table_capacity(t);
    if ((t->live + t->removed + 1) * 2 > capacity) {
        unsigned bits = (t->live + 1) * 4 > capacity ? t->bits + 1 : t->bits;
        if (!umt_ptr_table_rebuild(t, bits))
            return false;
    }
    size_t mask = umt_ptr_table_capacity(t) - 1;
    size_t i = umt_ptr_table_home(t, ptr);
    while (t->slots[i].ptr != UMT_SLOT_EMPTY && t->slots[i].ptr != UMT_SLOT_REMOVED)
        i = (i + 1) & mask;
    if (t->slots[i].ptr == UMT_SLOT_REMOVED)
        t->removed--;
    t->slots[i] = (umt_ptr_slot){ptr, id};
    t->live++;
    return true;
}

/* Removes ptr and sets *id to its id; false when ptr is not in the table. */
static inline bool umt_ptr_table_take(umt_ptr_table *t, uintptr_t ptr, uint64_t *id)
{
    umt_ptr_slot *s = umt_ptr_table_find(t, ptr);
    if (!s)
        return false;
    *id = s->id;
    s->ptr = UMT_SLOT_REMOVED;
    t->live--;
    t->removed++;
    return true;
}

/* The longest run of slots a lookup of a live pointer walks (1: found at
 * its home slot), for the tests of how well pointers spread. */
static inline size_t umt_ptr_table_longest_probe(const umt_ptr_table *t)
{
    size_t capacity = umt_ptr_table_capacity(t), longest = 0;
    for (size_t j = 0; j < capacity; j++) {
        uintptr_t ptr = t->slots[j].ptr;
        if (ptr == UMT_SLOT_EMPTY || ptr == UMT_SLOT_REMOVED)
            continue;
        size_t walked = ((j - umt_ptr_table_home(t, ptr)) & (capacity - 1)) + 1;
        if (walked > longest)
            longest = walked;
    }
    return longest;
}

#endif /* UNIMEM_TORCH_PTR_TABLE_H */
