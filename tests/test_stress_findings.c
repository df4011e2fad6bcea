/* What tests/test_stress.c found in the library, kept as regressions:
 *   F1: um_buffer_create with a first device filled the replica without
 *       the buffer's lock, so an eviction on another thread could leave an
 *       owner without memory (reads of a new buffer failed or saw garbage);
 *   F2: a refused um_buffer_destroy (the buffer still acquired) had already
 *       dropped the task layer's record, so a failed writer was forgotten
 *       and later readers ran;
 *   F11: a task forced onto a device whose limit is below its buffers was
 *       never placed, so waiting for it (and um_shutdown) hung. */
#include "harness.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

static um_context *ctx;
static atomic_bool stop;

/* Keeps device 1 at its limit with buffers written there. */
static void *pressure(void *arg)
{
    (void)arg;
    um_buffer *b[16] = {0};
    for (int i = 0; i < 16; i++)
        CHECK_OK(um_buffer_create(ctx, 1 << 20, NULL, &b[i]));
    for (unsigned k = 0; !atomic_load(&stop); k++) {
        void *p;
        if (b[k % 16] && um_buffer_acquire(b[k % 16], 1, UM_ACCESS_WRITE_DISCARD, NULL, &p) == UM_OK)
            CHECK_OK(um_buffer_release(b[k % 16], 1, NULL));
    }
    for (int i = 0; i < 16; i++)
        CHECK_OK(um_buffer_destroy(b[i]));
    return NULL;
}

static void test_create_on_a_device_under_eviction(void)
{
    CHECK_OK(um_init("devices=sim:64M,links=model,link_cache=none,watermark_high=100", &ctx));
    if (!ctx)
        return;
    CHECK_OK(um_set_memory_limit(ctx, 1, 8 << 20));
    pthread_t t;
    CHECK(pthread_create(&t, NULL, pressure, NULL) == 0);
    int failures = 0, bad_reads = 0, n = 3000;
    for (int i = 0; i < n; i++) {
        um_buffer *b = NULL;
        um_buffer_opts o = {1};
        if (um_buffer_create(ctx, 1 << 20, &o, &b) != UM_OK) {
            failures++;
            continue;
        }
        unsigned char byte = 1;
        if (um_buffer_read(b, 0, &byte, 1) != UM_OK || byte != 0)
            bad_reads++;
        CHECK_OK(um_buffer_destroy(b));
    }
    atomic_store(&stop, true);
    pthread_join(t, NULL);
    printf("test_stress_findings: %d buffers made on device 1 under eviction: %d failed, %d "
           "read wrong\n", n, failures, bad_reads);
    CHECK_EQ(failures, 0);
    CHECK_EQ(bad_reads, 0);
    um_shutdown(ctx);
}

static int task_fails(const um_task_exec *e)
{
    (void)e;
    return 1;
}

static int task_ok(const um_task_exec *e)
{
    (void)e;
    return 0;
}

static void test_refused_destroy_keeps_the_record(void)
{
    um_context *c = NULL;
    CHECK_OK(um_init("devices=sim:64M,links=model,link_cache=none", &c));
    if (!c)
        return;
    um_buffer *b = NULL;
    CHECK_OK(um_buffer_create(c, 4096, NULL, &b));
    um_task_id id;
    um_task w = {.name = "fail", .cpu = task_fails, .nbuffers = 1, .device = -1,
                 .buffers = {b}, .modes = {UM_ACCESS_READ_WRITE}};
    CHECK_OK(um_task_submit(c, &w, &id));
    CHECK_STATUS(um_task_wait(c, id), UM_ERR_TASK);
    um_task r = {.name = "read", .cpu = task_ok, .nbuffers = 1, .device = -1, .buffers = {b},
                 .modes = {UM_ACCESS_READ}};
    /* A reader inherits the writer's failure, before and after a destroy
     * that is refused because the buffer is acquired. */
    um_status st = um_task_submit(c, &r, &id);
    CHECK(st == UM_ERR_TASK || (st == UM_OK && um_task_wait(c, id) == UM_ERR_TASK));
    void *p = NULL;
    CHECK_OK(um_buffer_acquire(b, 0, UM_ACCESS_READ, NULL, &p));
    CHECK_STATUS(um_buffer_destroy(b), UM_ERR_BUSY);
    CHECK_OK(um_buffer_release(b, 0, NULL));
    st = um_task_submit(c, &r, &id);
    CHECK(st == UM_ERR_TASK || (st == UM_OK && um_task_wait(c, id) == UM_ERR_TASK));
    CHECK_OK(um_buffer_destroy(b));
    um_shutdown(c);
}

static void test_forced_task_that_cannot_fit(void)
{
    um_context *c = NULL;
    CHECK_OK(um_init("devices=sim:64M,links=model,link_cache=none", &c));
    if (!c)
        return;
    CHECK_OK(um_set_memory_limit(c, 1, 8 << 20));
    um_buffer *b = NULL;
    CHECK_OK(um_buffer_create(c, 16 << 20, NULL, &b)); /* twice device 1's limit */
    um_task t = {.name = "too big", .cpu = task_ok, .nbuffers = 1, .device = 1, .buffers = {b},
                 .modes = {UM_ACCESS_READ}};
    um_task_id id = 0;
    CHECK_STATUS(um_task_submit(c, &t, &id), UM_ERR_NOMEM);
    CHECK_ERROR_MENTIONS("forced onto device 1", "memory limit", NULL);
    /* Unforced, placement finds the host for it. */
    t.device = -1;
    CHECK_OK(um_task_submit(c, &t, &id));
    CHECK_OK(um_task_wait(c, id));
    CHECK_OK(um_buffer_destroy(b));
    um_shutdown(c);
}

int main(void)
{
    unsetenv("UNIMEM_CONF");
    test_create_on_a_device_under_eviction();
    test_refused_destroy_keeps_the_record();
    test_forced_task_that_cannot_fit();
    return harness_finish("test_stress_findings");
}
