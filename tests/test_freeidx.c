/* The pool's free index (src/pool/freeidx.c) against a reference (a plain
 * array searched linearly): under random inserts, removes and lookups, a
 * lookup finds an entry exactly when one large enough exists, that entry
 * is in the index and fits, and the counts agree. Then the case a bounded
 * scan used to miss: the only fit lies deeper than the scanned part of
 * its class and no larger class has an entry. Prints its seed. */
#include "harness.h"
#include "pool/freeidx.h"

#include <stdlib.h>

#define NODES 2000

/* The largest entry of ref's live nodes, or 0. */
static size_t ref_largest(const um__fi_node *nodes, const bool *in)
{
    size_t best = 0;
    for (size_t i = 0; i < NODES; i++)
        if (in[i] && nodes[i].size > best)
            best = nodes[i].size;
    return best;
}

static void check_find(const um__freeidx *fi, const um__fi_node *nodes, const bool *in,
                       size_t size)
{
    um__fi_node *n = um__fi_find(fi, size);
    size_t largest = ref_largest(nodes, in);
    if (largest < size) {
        CHECK(n == NULL);
        return;
    }
    CHECK(n != NULL);
    if (!n)
        return;
    size_t i = (size_t)(n - nodes);
    CHECK(i < NODES && in[i]);
    CHECK(n->size >= size);
}

static void test_random(uint64_t seed)
{
    static um__fi_node nodes[NODES];
    static bool in[NODES];
    um__freeidx fi;
    um__fi_init(&fi);
    uint64_t st = seed;
    size_t count = 0, bytes = 0;
    for (int step = 0; step < 200000; step++) {
        uint64_t r = harness_rand(&st);
        size_t i = (size_t)(r % NODES);
        /* Sizes crowd into few classes (so that classes grow long), with
         * a tail of small and huge ones. */
        size_t size;
        switch ((r >> 16) % 4) {
        case 0:
            size = 1 + (r >> 20) % 64;
            break;
        case 1:
            size = ((size_t)1 << 21) + ((r >> 20) % 8) * 4096;
            break;
        case 2:
            size = ((size_t)1 << 24) + ((r >> 20) % 1000);
            break;
        default:
            size = 1 + (r >> 20) % ((size_t)1 << 34);
        }
        if (in[i]) {
            um__fi_remove(&fi, &nodes[i]);
            in[i] = false;
            count--;
            bytes -= nodes[i].size;
        } else {
            nodes[i].addr = (uintptr_t)i << 40;
            nodes[i].size = size;
            um__fi_insert(&fi, &nodes[i]);
            in[i] = true;
            count++;
            bytes += size;
        }
        CHECK_EQ(fi.count, count);
        CHECK_EQ(fi.bytes, bytes);
        check_find(&fi, nodes, in, size);
        check_find(&fi, nodes, in, size + 1);
        check_find(&fi, nodes, in, 1 + (harness_rand(&st) >> 20) % ((size_t)1 << 34));
        if (step % 1000 == 0)
            CHECK_EQ(um__fi_largest(&fi), ref_largest(nodes, in));
    }
}

/* Forty entries in one class, none larger anywhere: the one that fits
 * was inserted first, so it is the last of its list. */
static void test_deep_fit(void)
{
    um__fi_node nodes[40];
    um__freeidx fi;
    um__fi_init(&fi);
    const size_t base = (size_t)1 << 21, need = base + 1000;
    for (size_t i = 0; i < 40; i++) {
        nodes[i].addr = 4096 * (i + 1);
        nodes[i].size = i == 0 ? need : base + i;
        um__fi_insert(&fi, &nodes[i]);
    }
    CHECK(um__fi_find(&fi, need) == &nodes[0]);
    CHECK(um__fi_find(&fi, need + 1) == NULL);
    /* Once a larger class has an entry, that one serves. */
    um__fi_node big = {.addr = 1 << 30, .size = 2 * base};
    um__fi_insert(&fi, &big);
    um__fi_node *n = um__fi_find(&fi, need);
    CHECK(n != NULL && n->size >= need);
}

int main(void)
{
    uint64_t seed = harness_seed("test_freeidx");
    test_random(seed);
    test_deep_fit();
    return harness_finish("test_freeidx");
}
