/* What tests/test_stress.c found in the library, kept as regressions:
 *   F1: um_buffer_create with a first device filled the replica without
 *       the buffer's lock, so an eviction on another thread could leave an
 *       owner without memory (reads of a new buffer failed or saw garbage);
 *   F2: a refused um_buffer_destroy (the buffer still acquired) had already
 *       dropped the task layer's record, so a failed writer was forgotten
 *       and later readers ran;
 *   F3: a task that ended without running (cancelled, or failed with a
 *       dependency) let a later task on its buffer overtake the tasks it
 *       had been waiting for;
 *   F6: a WRITE_DISCARD repair after a failed task ran or failed depending
 *       on whether that task had failed before the repair was submitted;
 *   F11: a task forced onto a device whose limit is below its buffers was
 *       never placed, so waiting for it (and um_shutdown) hung. */
#include "harness.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* Tasks that hold until the test opens the gate, and record when they ran. */
static atomic_bool gate;
static atomic_int ran_count;

typedef struct step {
    unsigned char value; /* written over the first buffer (0: not written) */
    bool gated, fails;
    int ran_at;          /* 1 + how many tasks ran before it; 0: never ran */
} step;

static int run_step(const um_task_exec *e)
{
    step *s = e->user;
    while (s->gated && !atomic_load(&gate))
        usleep(1000);
    s->ran_at = 1 + atomic_fetch_add(&ran_count, 1);
    if (s->value)
        memset(e->ptrs[0], s->value, e->sizes[0]);
    return s->fails;
}

static um_task step_task(step *s, int n, um_buffer *const *bufs, const um_access *modes)
{
    um_task t = {.name = "step", .cpu = run_step, .nbuffers = n, .device = -1, .user = s};
    for (int i = 0; i < n; i++) {
        t.buffers[i] = bufs[i];
        t.modes[i] = modes[i];
    }
    return t;
}

static unsigned char first_byte(um_buffer *b)
{
    unsigned char v = 0xee;
    CHECK_OK(um_buffer_read(b, 0, &v, 1));
    return v;
}

enum { CANCELLED, FAILED_AT_SUBMISSION, FAILED_WITH_A_DEPENDENCY };

/* T0 holds y; T1 writes x after reading y; T2 writes x after T1 and ends
 * without running (how); a reader of x after T2 fails with it; T3 writes
 * x, submitted last: it must run after T1, and x must hold T3's value. */
static void check_order_after_a_task_that_did_not_run(int how)
{
    static const char *const names[] = {"cancelled", "failed at submission",
                                        "failed with a dependency"};
    um_context *c = NULL;
    CHECK_OK(um_init("devices=sim:2x64M,links=model,link_cache=none", &c));
    if (!c)
        return;
    atomic_store(&gate, false);
    atomic_store(&ran_count, 0);
    um_buffer *x = NULL, *y = NULL, *z = NULL;
    CHECK_OK(um_buffer_create(c, 4096, NULL, &x));
    CHECK_OK(um_buffer_create(c, 4096, NULL, &y));
    CHECK_OK(um_buffer_create(c, 4096, NULL, &z));
    step s0 = {0, true, false, 0}, s1 = {1, false, false, 0}, s2 = {2, false, false, 0},
         s3 = {3, false, false, 0}, sz = {0, how == FAILED_WITH_A_DEPENDENCY, true, 0},
         sr = {0, false, false, 0};
    um_task_id id0, id1, id2, id3, idz = 0, idr;
    const um_access rw[] = {UM_ACCESS_READ_WRITE}, wd_r[] = {UM_ACCESS_WRITE_DISCARD,
                                                             UM_ACCESS_READ},
                    wd[] = {UM_ACCESS_WRITE_DISCARD}, r[] = {UM_ACCESS_READ};
    um_task t = step_task(&s0, 1, &y, rw);
    CHECK_OK(um_task_submit(c, &t, &id0));
    t = step_task(&s1, 2, (um_buffer *[]){x, y}, wd_r);
    CHECK_OK(um_task_submit(c, &t, &id1));
    if (how != CANCELLED) {
        /* z's writer fails: at once, or only once the gate opens. */
        t = step_task(&sz, 1, &z, rw);
        CHECK_OK(um_task_submit(c, &t, &idz));
        if (how == FAILED_AT_SUBMISSION)
            CHECK_STATUS(um_task_wait(c, idz), UM_ERR_TASK);
    }
    t = step_task(&s2, how == CANCELLED ? 1 : 2, (um_buffer *[]){x, z}, wd_r);
    CHECK_OK(um_task_submit(c, &t, &id2));
    if (how == CANCELLED)
        CHECK_OK(um_task_cancel(c, id2));
    t = step_task(&sr, 1, &x, r);
    CHECK_OK(um_task_submit(c, &t, &idr));
    t = step_task(&s3, 1, &x, wd);
    CHECK_OK(um_task_submit(c, &t, &id3));
    usleep(20000);
    CHECK_EQ(s3.ran_at, 0); /* it waits for T1, which waits for T0 */
    atomic_store(&gate, true);
    CHECK_OK(um_task_wait(c, id0));
    CHECK_OK(um_task_wait(c, id1));
    CHECK_STATUS(um_task_wait(c, id2), how == CANCELLED ? UM_ERR_CANCELLED : UM_ERR_TASK);
    CHECK_OK(um_task_wait(c, id3));
    CHECK_STATUS(um_task_wait(c, idr), UM_ERR_TASK); /* x lacks what T2 did not write */
    CHECK_EQ(s2.ran_at, 0);
    CHECK_EQ(sr.ran_at, 0);
    CHECK(s1.ran_at > 0 && s3.ran_at > s1.ran_at);
    CHECK_EQ(first_byte(x), 3);
    printf("test_stress_findings: T2 %s: T1 ran %d-th, T3 %d-th, x = %d\n", names[how],
           s1.ran_at, s3.ran_at, first_byte(x));
    (void)um_wait_all(c);
    CHECK_OK(um_buffer_destroy(x));
    CHECK_OK(um_buffer_destroy(y));
    CHECK_OK(um_buffer_destroy(z));
    um_shutdown(c);
}

/* A failed writer (or reader) of x, then a repair: a WRITE_DISCARD (or a
 * WRITE after the failed reader). It runs whether the failure came before
 * its submission or after. */
static void check_repair(bool failed_reader, bool submitted_after_the_failure)
{
    um_context *c = NULL;
    CHECK_OK(um_init("devices=sim:64M,links=model,link_cache=none", &c));
    if (!c)
        return;
    atomic_store(&gate, submitted_after_the_failure);
    um_buffer *x = NULL;
    CHECK_OK(um_buffer_create(c, 4096, NULL, &x));
    step sf = {0, true, true, 0}, sp = {7, false, false, 0};
    um_access fm = failed_reader ? UM_ACCESS_READ : UM_ACCESS_READ_WRITE,
              pm = failed_reader ? UM_ACCESS_WRITE : UM_ACCESS_WRITE_DISCARD;
    um_task t = step_task(&sf, 1, &x, &fm);
    um_task_id idf, idp;
    CHECK_OK(um_task_submit(c, &t, &idf));
    if (submitted_after_the_failure)
        CHECK_STATUS(um_task_wait(c, idf), UM_ERR_TASK);
    t = step_task(&sp, 1, &x, &pm);
    CHECK_OK(um_task_submit(c, &t, &idp));
    atomic_store(&gate, true);
    CHECK_STATUS(um_task_wait(c, idf), UM_ERR_TASK);
    CHECK_OK(um_task_wait(c, idp));
    CHECK(sp.ran_at > sf.ran_at);
    CHECK_EQ(first_byte(x), 7);
    (void)um_wait_all(c);
    CHECK_OK(um_buffer_destroy(x));
    um_shutdown(c);
}

static void test_tasks_that_did_not_run_keep_the_order(void)
{
    for (int how = CANCELLED; how <= FAILED_WITH_A_DEPENDENCY; how++)
        check_order_after_a_task_that_did_not_run(how);
    for (int reader = 0; reader < 2; reader++)
        for (int after = 0; after < 2; after++)
            check_repair(reader, after);
}

int main(void)
{
    unsetenv("UNIMEM_CONF");
    test_create_on_a_device_under_eviction();
    test_refused_destroy_keeps_the_record();
    test_forced_task_that_cannot_fit();
    test_tasks_that_did_not_run_keep_the_order();
    return harness_finish("test_stress_findings");
}
