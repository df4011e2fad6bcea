/* The address map (src/base/addrmap.c) against a reference (a plain array
 * searched linearly), under random puts and takes of aligned and
 * colliding keys; then a long run of distinct addresses, which must not
 * make the table grow. Prints its seed. */
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

    /* Key 0 marks an empty slot, so it cannot be stored: a put of it is
     * refused and counts nothing (before, count went up with nothing
     * stored). Room for more keys than memory can hold is refused, not
     * looped for (before, the doubling wrapped to 0 near SIZE_MAX / 4). */
    CHECK(um__addrmap_put(&m, 7, 70));
    CHECK(!um__addrmap_put(&m, 0, 1));
    CHECK_EQ(m.count, 1u);
    uint64_t v0 = 99;
    CHECK(!um__addrmap_get(&m, 0, &v0));
    CHECK(!um__addrmap_take(&m, 0, &v0));
    CHECK_EQ(v0, 99u);
    size_t cap0 = m.cap;
    CHECK(!um__addrmap_reserve(&m, SIZE_MAX / 4));
    CHECK(!um__addrmap_reserve(&m, SIZE_MAX / 2 - 10));
    CHECK(!um__addrmap_reserve(&m, SIZE_MAX));
    CHECK_EQ(m.cap, cap0);
    CHECK(um__addrmap_get(&m, 7, &v0) && v0 == 70);
    um__addrmap_free(&m);

    /* A long run's pointers (UNIMEM_TORCH_TRACE's table): millions of
     * distinct addresses, GPU pages and small blocks, each put and taken
     * while a thousand stay live, leave the table its size. */
    const uint64_t base = 0x7f0000000000ull, page = 2ull << 20;
    const size_t live = 1000;
    for (size_t i = 0; i < live; i++)
        CHECK(um__addrmap_put(&m, base + i * page, i));
    cap = m.cap;
    const uint64_t strides[] = {page, 4096};
    uint64_t next = base + live * page;
    for (size_t k = 0; k < 2; k++)
        for (uint64_t r = 0, v = 0; r < 1000000; r++, next += strides[k]) {
            CHECK(um__addrmap_put(&m, next, r));
            CHECK(um__addrmap_take(&m, next, &v) && v == r);
        }
    CHECK_EQ(m.cap, cap);
    CHECK_EQ(m.count, live);
    for (size_t i = 0; i < live; i++) {
        uint64_t v = 0;
        CHECK(um__addrmap_get(&m, base + i * page, &v) && v == i);
    }
    um__addrmap_free(&m);
    return harness_finish("test_addrmap");
}
