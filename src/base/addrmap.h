/*
 * addrmap: a map from addresses (non-zero 64-bit keys) to 64-bit values,
 * open addressing with backward-shift deletion; the table shrinks as it
 * empties. For the bookkeeping that is off the hot path: the event
 * writer's live block sizes and the debug allocator's requested sizes by
 * address, the stream uses' marks, the task layer's records and failures
 * by id. Not thread safe; owns its table.
 */
#ifndef UM_ADDRMAP_H
#define UM_ADDRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct um__addrmap_slot {
    uint64_t key; /* 0: empty */
    uint64_t value;
} um__addrmap_slot;

typedef struct um__addrmap {
    um__addrmap_slot *slots;
    size_t cap, count;
} um__addrmap;

/* Sets key's value (replacing one there); false when there is no memory
 * to grow the table, or for key 0, which marks an empty slot (nothing
 * changed). */
bool um__addrmap_put(um__addrmap *m, uint64_t key, uint64_t value);
/* Room for n more keys, so that the next n puts of new keys cannot fail;
 * false when there is no memory (nothing changed). */
bool um__addrmap_reserve(um__addrmap *m, size_t n);
/* Key's value in *value; false when it is not there. */
bool um__addrmap_get(const um__addrmap *m, uint64_t key, uint64_t *value);
/* Removes key, giving its value; false when it is not there. */
bool um__addrmap_take(um__addrmap *m, uint64_t key, uint64_t *value);
void um__addrmap_free(um__addrmap *m);

#endif /* UM_ADDRMAP_H */
