/* Address map; see addrmap.h. */
#include "addrmap.h"

#include <stdlib.h>

/* Blocks are aligned, so the low bits say little, and task ids are
 * consecutive: a multiplicative hash's high half, which every key bit
 * reaches, indexes the table. */
static size_t home(const um__addrmap *m, uint64_t key)
{
    return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & (m->cap - 1);
}

static size_t find(const um__addrmap *m, uint64_t key)
{
    if (!m->cap)
        return SIZE_MAX;
    for (size_t j = home(m, key); m->slots[j].key; j = (j + 1) & (m->cap - 1))
        if (m->slots[j].key == key)
            return j;
    return SIZE_MAX;
}

#define MIN_CAP 1024

/* Moves the entries into a table of cap slots; false when no memory. */
static bool resize(um__addrmap *m, size_t cap)
{
    um__addrmap_slot *n = calloc(cap, sizeof *n), *old = m->slots;
    if (!n)
        return false;
    size_t old_cap = m->cap;
    m->slots = n;
    m->cap = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (!old[i].key)
            continue;
        size_t j = home(m, old[i].key);
        while (n[j].key)
            j = (j + 1) & (cap - 1);
        n[j] = old[i];
    }
    free(old);
    return true;
}

bool um__addrmap_put(um__addrmap *m, uint64_t key, uint64_t value)
{
    if (key == 0)
        return false; /* 0 marks an empty slot */
    size_t j = find(m, key);
    if (j != SIZE_MAX) {
        m->slots[j].value = value;
        return true;
    }
    if (!um__addrmap_reserve(m, 1))
        return false;
    j = home(m, key);
    while (m->slots[j].key)
        j = (j + 1) & (m->cap - 1);
    m->slots[j] = (um__addrmap_slot){key, value};
    m->count++;
    return true;
}

bool um__addrmap_get(const um__addrmap *m, uint64_t key, uint64_t *value)
{
    size_t j = find(m, key);
    if (j == SIZE_MAX)
        return false;
    *value = m->slots[j].value;
    return true;
}

bool um__addrmap_take(um__addrmap *m, uint64_t key, uint64_t *value)
{
    size_t j = find(m, key);
    if (j == SIZE_MAX)
        return false;
    if (value)
        *value = m->slots[j].value;
    size_t mask = m->cap - 1;
    m->slots[j] = (um__addrmap_slot){0, 0};
    m->count--;
    /* Backward-shift deletion keeps every probe chain unbroken. */
    for (size_t k = (j + 1) & mask; m->slots[k].key; k = (k + 1) & mask) {
        size_t h = home(m, m->slots[k].key);
        if (((k - h) & mask) >= ((k - j) & mask)) {
            m->slots[j] = m->slots[k];
            m->slots[k] = (um__addrmap_slot){0, 0};
            j = k;
        }
    }
    /* A table that emptied shrinks (without memory it stays larger). */
    if (m->cap > MIN_CAP && m->count * 8 < m->cap)
        (void)resize(m, m->cap / 2);
    return true;
}

bool um__addrmap_reserve(um__addrmap *m, size_t n)
{
    /* Past a quarter of the address space the doubling below would wrap;
     * no such table fits in memory anyway. */
    if (n > SIZE_MAX / 4 - m->count)
        return false;
    size_t cap = m->cap ? m->cap : MIN_CAP;
    while ((m->count + n) * 2 > cap)
        cap *= 2;
    return cap == m->cap || resize(m, cap);
}

void um__addrmap_free(um__addrmap *m)
{
    free(m->slots);
    *m = (um__addrmap){0};
}
