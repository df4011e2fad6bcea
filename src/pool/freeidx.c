/* Segregated-fit free index; see freeidx.h. */
#include "freeidx.h"

#include <string.h>

/* How many entries of one class a lookup compares before settling: a bound
 * that keeps lookups O(1) while getting close to true best fit. */
#define SCAN_LIMIT 32

static inline unsigned fls64(uint64_t x) { return 63u - (unsigned)__builtin_clzll(x); }

static void mapping(size_t size, unsigned *fl, unsigned *sl)
{
    if (size < UM_FI_SL_COUNT) {
        *fl = 0;
        *sl = (unsigned)size;
        return;
    }
    unsigned f = fls64(size);
    *fl = f;
    *sl = (unsigned)(size >> (f - UM_FI_SL_BITS)) & (UM_FI_SL_COUNT - 1);
}

void um__fi_init(um__freeidx *fi) { memset(fi, 0, sizeof *fi); }

void um__fi_insert(um__freeidx *fi, um__fi_node *n)
{
    unsigned fl, sl;
    mapping(n->size, &fl, &sl);
    n->prev = NULL;
    n->next = fi->heads[fl][sl];
    if (n->next)
        n->next->prev = n;
    fi->heads[fl][sl] = n;
    fi->fl_bitmap |= 1ull << fl;
    fi->sl_bitmap[fl] |= 1u << sl;
    fi->count++;
    fi->bytes += n->size;
}

void um__fi_remove(um__freeidx *fi, um__fi_node *n)
{
    unsigned fl, sl;
    mapping(n->size, &fl, &sl);
    if (n->prev)
        n->prev->next = n->next;
    else
        fi->heads[fl][sl] = n->next;
    if (n->next)
        n->next->prev = n->prev;
    if (!fi->heads[fl][sl]) {
        fi->sl_bitmap[fl] &= ~(1u << sl);
        if (!fi->sl_bitmap[fl])
            fi->fl_bitmap &= ~(1ull << fl);
    }
    n->prev = n->next = NULL;
    fi->count--;
    fi->bytes -= n->size;
}

/* Tightest fit among the first SCAN_LIMIT entries of one class list. */
static um__fi_node *scan_class(um__fi_node *head, size_t size)
{
    um__fi_node *best = NULL;
    int seen = 0;
    for (um__fi_node *n = head; n && seen < SCAN_LIMIT; n = n->next, seen++) {
        if (n->size < size)
            continue;
        if (!best || n->size < best->size || (n->size == best->size && n->addr < best->addr))
            best = n;
        if (best->size == size && seen >= 4)
            break;
    }
    return best;
}

/* First non-empty class strictly above (fl, sl), as its list head. */
static um__fi_node *next_class(const um__freeidx *fi, unsigned fl, unsigned sl)
{
    uint32_t slmap = sl + 1 < UM_FI_SL_COUNT ? fi->sl_bitmap[fl] & (~0u << (sl + 1)) : 0;
    if (!slmap) {
        uint64_t flmap = fl + 1 < UM_FI_FL_COUNT ? fi->fl_bitmap & (~0ull << (fl + 1)) : 0;
        if (!flmap)
            return NULL;
        fl = (unsigned)__builtin_ctzll(flmap);
        slmap = fi->sl_bitmap[fl];
    }
    return fi->heads[fl][__builtin_ctz(slmap)];
}

um__fi_node *um__fi_find(const um__freeidx *fi, size_t size)
{
    unsigned fl, sl;
    mapping(size, &fl, &sl);
    um__fi_node *best = scan_class(fi->heads[fl][sl], size);
    if (best)
        return best;
    um__fi_node *head = next_class(fi, fl, sl);
    if (head)
        return scan_class(head, size);
    /* Nothing larger is free: a fit deeper in this class is the only one
     * left, and the caller would otherwise report memory that exists as
     * missing. Rare, so the whole list is walked. */
    for (um__fi_node *n = fi->heads[fl][sl]; n; n = n->next)
        if (n->size >= size && (!best || n->size < best->size ||
                                (n->size == best->size && n->addr < best->addr)))
            best = n;
    return best;
}

um__fi_node *um__fi_find_near(const um__freeidx *fi, size_t size, size_t most)
{
    enum { LOOK = 4 };
    unsigned fl, sl;
    mapping(size, &fl, &sl);
    int seen = 0;
    for (um__fi_node *n = fi->heads[fl][sl]; n && seen < LOOK; n = n->next, seen++)
        if (n->size >= size && n->size <= most)
            return n;
    um__fi_node *n = next_class(fi, fl, sl);
    return n && n->size <= most ? n : NULL;
}

size_t um__fi_largest(const um__freeidx *fi)
{
    if (!fi->fl_bitmap)
        return 0;
    unsigned fl = fls64(fi->fl_bitmap);
    unsigned sl = fls64(fi->sl_bitmap[fl]);
    size_t best = 0;
    for (um__fi_node *n = fi->heads[fl][sl]; n; n = n->next)
        if (n->size > best)
            best = n->size;
    return best;
}
