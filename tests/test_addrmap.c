/* The address map (src/base/addrmap.c) against a reference (a plain array
 * searched linearly), under random puts and takes of aligned and
 * colliding keys; prints its seed. */
#include "base/addrmap.h"
#include "harness.h"

#include <stdlib.h>

#define KEYS 5000

int main(void)
{
    uint64_t seed = harness_seed("test_addrmap"), st = seed;
    static uint64_t ref[KEYS]; /* value + 1 of key i (0: absent) */
    um__addrmap m = {0};
    for (int round = 0; round < 200000; round++) {
        uint64_t r = harness_rand(&st);
        size_t i = (size_t)(r % KEYS);
        /* 2 MiB-aligned keys, the pool's common case, and their 256-byte
         * neighbours. */
        uint64_t key = 0x7f0000000000ull + ((uint64_t)(i / 2) << 21) + (i % 2) * 256;
        if ((r >> 32) % 3) {
            uint64_t v = r >> 40;
            CHECK(um__addrmap_put(&m, key, v));
            ref[i] = v + 1;
        } else {
            uint64_t v = 0;
            bool had = um__addrmap_take(&m, key, &v);
            CHECK_EQ(had, ref[i] != 0);
            if (had)
                CHECK_EQ(v + 1, ref[i]);
            ref[i] = 0;
        }
    }
    size_t present = 0;
    for (size_t i = 0; i < KEYS; i++)
        present += ref[i] != 0;
    CHECK_EQ(m.count, present);
    for (size_t i = 0; i < KEYS; i++) {
        uint64_t key = 0x7f0000000000ull + ((uint64_t)(i / 2) << 21) + (i % 2) * 256, v;
        CHECK_EQ(um__addrmap_take(&m, key, &v), ref[i] != 0);
    }
    CHECK_EQ(m.count, 0u);
    /* Emptied, the table shrank back to its smallest size. */
    CHECK_EQ(m.cap, (size_t)1024);
    /* Reserved room takes the puts without growing: consecutive ids, as
     * the task layer's, spread over the table as addresses do. */
    CHECK(um__addrmap_reserve(&m, 100000));
    size_t cap = m.cap;
    CHECK(cap >= 200000);
    for (uint64_t id = 1; id <= 100000; id++)
        CHECK(um__addrmap_put(&m, id, id * 3));
    CHECK_EQ(m.cap, cap);
    for (uint64_t id = 1, v; id <= 100000; id++)
        CHECK(um__addrmap_get(&m, id, &v) && v == id * 3);
    um__addrmap_free(&m);
    return harness_finish("test_addrmap");
}
