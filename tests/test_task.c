/* Tests of tasks (src/run) and placement (src/place) on the host and sim
 * devices: random task graphs against a sequential reference under every
 * policy (with the devices' memory limited, so reclaim runs under the
 * tasks), failure and cancellation propagation, bad input, buffers in use,
 * and each policy's choice in a case where it is known. The random graphs
 * also run on GPUs (UM_TEST_TASK_DEVICES=cuda: CI's stand-in ones, or real
 * ones, where the tasks compute on copies of the GPU's data). */
#include "harness.h"
#include "place/place.h"

#include <dlfcn.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define WORDS 1024 /* uint32 per buffer: 4 KiB */

static const char *const policies[] = {"eager", "round_robin", "locality", "cost"};

/* ---------------------------------------------------------- watchdog */

/* A wait that used to hang ends the test with a message instead of
 * holding ctest until its timeout: watch() arms a deadline, unwatch()
 * clears it, and a thread started in main exits the program past it. */
static _Atomic long long watch_deadline_ns; /* 0: nothing watched */
static const char *_Atomic watch_what = "";
/* Prints what the watched test knows of the hang before the exit (NULL:
 * nothing). */
static void (*_Atomic watch_dump)(void);

static long long mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static void watch(const char *what, int seconds)
{
    atomic_store(&watch_what, what);
    /* Sanitized builds run several times slower. */
    long long s = (long long)seconds * (HARNESS_SANITIZED ? 5 : 1);
    atomic_store(&watch_deadline_ns, mono_ns() + s * 1000000000ll);
}

static void unwatch(void)
{
    atomic_store(&watch_deadline_ns, 0);
    atomic_store(&watch_dump, NULL);
}

static void *watchdog_main(void *arg)
{
    (void)arg;
    for (;;) {
        usleep(50000);
        long long d = atomic_load(&watch_deadline_ns);
        if (d && mono_ns() > d) {
            fprintf(stderr, "test_task: FAILED: %s did not return (a hang)\n",
                    atomic_load(&watch_what));
            void (*dump)(void) = atomic_load(&watch_dump);
            if (dump)
                dump();
            _exit(1);
        }
    }
    return NULL;
}

/* ------------------------------------------- allocation failure (realloc) */

/* The run layer's dependency records grow with realloc; this test program
 * (only it: each test is its own executable) replaces realloc to fail the
 * Nth call made by the thread that armed it, and forwards every other call
 * to the next definition (libc's, or a sanitizer's). Per thread, so the
 * workers' and other threads' allocations are never failed. */
static _Thread_local int realloc_fail_in; /* 0: fail none */

/* Not instrumented by ThreadSanitizer: libc calls it while TSan sets a new
 * thread up, before that thread's TSan state exists (the instrumented
 * function entry crashed there). */
__attribute__((no_sanitize_thread)) void *realloc(void *ptr, size_t size)
{
    static void *(*_Atomic next)(void *, size_t);
    if (realloc_fail_in > 0 && --realloc_fail_in == 0)
        return NULL;
    void *(*fn)(void *, size_t) = atomic_load(&next);
    if (!fn) {
        *(void **)&fn = dlsym(RTLD_NEXT, "realloc");
        atomic_store(&next, fn);
    }
    return fn(ptr, size);
}

/* ------------------------------------------------- random task graphs */

typedef struct spec {
    um_context *ctx;
    int nbuf;
    int idx[3];
    um_access mode[3];
    uint32_t seed;
    int delay_us;
    _Atomic int device; /* where it ran */
} spec;

static uint32_t mix(uint32_t h, uint32_t v)
{
    h ^= v + 0x9e3779b9u + (h << 6) + (h >> 2);
    return h;
}

/* The one computation both the tasks and the reference make: a hash of
 * every input read, then each written buffer updated in an order-sensitive
 * way (so a task run out of order changes the result). */
static void compute(const spec *s, uint32_t *const *data)
{
    uint32_t h = s->seed;
    for (int i = 0; i < s->nbuf; i++)
        if (s->mode[i] != UM_ACCESS_WRITE_DISCARD)
            for (int j = 0; j < WORDS; j += 7)
                h = mix(h, data[i][j]);
    for (int i = 0; i < s->nbuf; i++) {
        if (s->mode[i] == UM_ACCESS_READ)
            continue;
        for (int j = 0; j < WORDS; j++)
            data[i][j] = s->mode[i] == UM_ACCESS_WRITE_DISCARD ? mix(h, (uint32_t)j)
                                                                 : data[i][j] * 31u + h + (uint32_t)j;
    }
}

static int task_fn(const um_task_exec *e)
{
    spec *s = e->user;
    atomic_store(&s->device, e->device);
    if (s->delay_us)
        usleep((useconds_t)s->delay_us);
    compute(s, (uint32_t *const *)e->ptrs);
    return 0;
}

/* The "cuda" implementation. Where the host can touch the GPU's memory
 * (the stand-in driver of CI) it is task_fn itself. On a real GPU the
 * buffers are copied to host memory on the task's stream, computed there
 * and copied back before it returns: slow, but the same computation, and
 * the release on that stream orders later users after the copies. */
static int task_fn_gpu(const um_task_exec *e)
{
    spec *s = e->user;
    if (harness_dev_host_readable(s->ctx, e->device))
        return task_fn(e);
    atomic_store(&s->device, e->device);
    if (s->delay_us)
        usleep((useconds_t)s->delay_us);
    uint32_t scratch[3][WORDS];
    uint32_t *data[3] = {scratch[0], scratch[1], scratch[2]};
    for (int i = 0; i < s->nbuf; i++)
        if (s->mode[i] != UM_ACCESS_WRITE_DISCARD)
            harness_dev_read_on(s->ctx, e->device, e->stream, data[i], e->ptrs[i],
                                WORDS * sizeof(uint32_t));
    compute(s, data);
    for (int i = 0; i < s->nbuf; i++)
        if (s->mode[i] != UM_ACCESS_READ)
            harness_dev_write_on(s->ctx, e->device, e->stream, e->ptrs[i], data[i],
                                 WORDS * sizeof(uint32_t));
    return 0;
}

static void test_random_graphs(uint64_t seed, const char *policy, size_t limit, int nbufs,
                               int ntasks)
{
    char conf[256];
    /* Pages of 64 KiB, so a small limit holds a few buffers.
     * UM_TEST_TASK_DEVICES: other devices (CI: stand-in GPUs, whose
     * memory the host can touch and whose copies are done when issued,
     * so the tasks' "cuda" implementation is the cpu one; on real GPUs it
     * computes on copies: task_fn_gpu). */
    const char *devs = getenv("UM_TEST_TASK_DEVICES");
    bool gpus = devs && strstr(devs, "cuda");
    snprintf(conf, sizeof conf, "devices=%s,sim_granularity=64K,links=model,sched=%s",
             devs && *devs ? devs : "sim:3x64M", policy);
    um_context *ctx = NULL;
    CHECK_OK(um_init(conf, &ctx));
    if (!ctx)
        return;
    for (int d = 1; d < um_device_count(ctx); d++)
        CHECK_OK(um_set_memory_limit(ctx, d, limit));
    uint64_t rng = seed ^ (uint64_t)(uintptr_t)policy;
    um_buffer **b = calloc((size_t)nbufs, sizeof *b);
    uint32_t **ref = calloc((size_t)nbufs, sizeof *ref);
    for (int i = 0; i < nbufs; i++) {
        ref[i] = malloc(WORDS * sizeof(uint32_t));
        for (int j = 0; j < WORDS; j++)
            ref[i][j] = (uint32_t)harness_rand(&rng);
        CHECK_OK(um_buffer_create(ctx, WORDS * sizeof(uint32_t), NULL, &b[i]));
        CHECK_OK(um_buffer_write(b[i], 0, ref[i], WORDS * sizeof(uint32_t)));
    }
    spec *specs = calloc((size_t)ntasks, sizeof *specs);
    int per_device[8] = {0};
    for (int k = 0; k < ntasks; k++) {
        spec *s = &specs[k];
        s->ctx = ctx;
        s->nbuf = 1 + (int)(harness_rand(&rng) % 3);
        for (int i = 0; i < s->nbuf; i++) {
            int x;
            bool dup;
            do {
                x = (int)(harness_rand(&rng) % (uint64_t)nbufs);
                dup = false;
                for (int q = 0; q < i; q++)
                    dup |= s->idx[q] == x;
            } while (dup);
            s->idx[i] = x;
            s->mode[i] = (um_access)(1 + harness_rand(&rng) % 4);
        }
        s->seed = (uint32_t)harness_rand(&rng);
        s->delay_us = harness_rand(&rng) % 8 == 0 ? 200 : 0;
        um_task t = {0};
        t.name = "mix";
        t.cpu = task_fn;
        t.cuda = gpus ? task_fn_gpu : NULL;
        t.nbuffers = s->nbuf;
        for (int i = 0; i < s->nbuf; i++) {
            t.buffers[i] = b[s->idx[i]];
            t.modes[i] = s->mode[i];
        }
        t.flops = 1e4;
        t.device = harness_rand(&rng) % 10 == 0
                       ? (int)(harness_rand(&rng) % (uint64_t)um_device_count(ctx))
                       : -1;
        t.user = s;
        /* Priorities reorder only tasks that are ready: the result is the
         * submission order's whatever they are. */
        t.priority = (int)(harness_rand(&rng) % 7) - 3;
        um_task_id id;
        CHECK_OK(um_task_submit(ctx, &t, &id));
        CHECK_EQ(id, (uint64_t)k + 1);
        /* The reference: the same tasks in submission order. */
        uint32_t *data[3];
        for (int i = 0; i < s->nbuf; i++)
            data[i] = ref[s->idx[i]];
        compute(s, data);
    }
    CHECK_OK(um_wait_all(ctx));
    uint32_t *got = malloc(WORDS * sizeof(uint32_t));
    int wrong = 0;
    for (int i = 0; i < nbufs; i++) {
        CHECK_OK(um_buffer_read(b[i], 0, got, WORDS * sizeof(uint32_t)));
        wrong += memcmp(got, ref[i], WORDS * sizeof(uint32_t)) != 0;
    }
    CHECK_EQ(wrong, 0);
    for (int k = 0; k < ntasks; k++)
        per_device[atomic_load(&specs[k].device) & 7]++;
    uint64_t ran = 0;
    for (int d = 0; d < um_device_count(ctx); d++) {
        um_task_stats ts;
        CHECK_OK(um_task_stats_get(ctx, d, &ts));
        CHECK_EQ(ts.tasks, (uint64_t)per_device[d]);
        CHECK_EQ(ts.failed, 0);
        ran += ts.tasks;
    }
    CHECK_EQ(ran, (uint64_t)ntasks);
    printf("test_task: %s, %d tasks on %d buffers, device limit %zu KiB: ran %d/%d/%d/%d on "
           "devices 0-3, %d buffers wrong\n",
           policy, ntasks, nbufs, limit >> 10, per_device[0], per_device[1], per_device[2],
           per_device[3], wrong);
    for (int i = 0; i < nbufs; i++) {
        CHECK_OK(um_buffer_destroy(b[i]));
        free(ref[i]);
    }
    free(got);
    free(specs);
    free(ref);
    free(b);
    um_shutdown(ctx);
}

/* ------------------------------------------------ failure, cancellation */

typedef struct probe {
    _Atomic int ran;
    _Atomic int done_calls;
    _Atomic int done_status;
    int result;
    _Atomic int *gate; /* when set, the task waits until *gate != 0 */
} probe;

static int probe_fn(const um_task_exec *e)
{
    probe *p = e->user;
    atomic_fetch_add(&p->ran, 1);
    while (p->gate && !atomic_load(p->gate))
        usleep(1000);
    return p->result;
}

/* Holds device 1's worker with a task that waits until *gate is set;
 * returns its id once it runs, so that the tasks submitted next queue
 * behind it. */
static um_task_id hold_device(um_context *ctx, probe *g, _Atomic int *gate)
{
    g->gate = gate;
    um_task t = {.name = "gate", .cpu = probe_fn, .device = 1, .user = g};
    um_task_id id = 0;
    CHECK_OK(um_task_submit(ctx, &t, &id));
    while (id && !atomic_load(&g->ran))
        usleep(1000);
    return id;
}

static void probe_done(um_task_id id, um_status st, void *user)
{
    (void)id;
    probe *p = user;
    atomic_store(&p->done_status, (int)st);
    atomic_fetch_add(&p->done_calls, 1);
}

static um_task_id submit_probe(um_context *ctx, probe *p, um_buffer *x, um_access mx,
                               um_buffer *y, um_access my)
{
    um_task t = {0};
    t.name = "probe";
    t.cpu = probe_fn;
    t.buffers[0] = x;
    t.modes[0] = mx;
    t.nbuffers = 1;
    if (y) {
        t.buffers[1] = y;
        t.modes[1] = my;
        t.nbuffers = 2;
    }
    t.device = -1;
    t.user = p;
    t.done = probe_done;
    um_task_id id = 0;
    CHECK_OK(um_task_submit(ctx, &t, &id));
    return id;
}

static void test_failure_and_cancel(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:2x64M,links=model", &ctx));
    if (!ctx)
        return;
    um_buffer *x, *y, *z;
    CHECK_OK(um_buffer_create(ctx, 4096, NULL, &x));
    CHECK_OK(um_buffer_create(ctx, 4096, NULL, &y));
    CHECK_OK(um_buffer_create(ctx, 4096, NULL, &z));
    _Atomic int gate = 0;
    probe a = {0}, b = {0}, c = {0}, d = {0};
    a.result = 7;   /* fails */
    a.gate = &gate; /* once the others are queued behind it */
    um_task_id ia = submit_probe(ctx, &a, x, UM_ACCESS_WRITE_DISCARD, NULL, 0);
    um_task_id ib = submit_probe(ctx, &b, x, UM_ACCESS_READ, y, UM_ACCESS_WRITE_DISCARD);
    um_task_id ic = submit_probe(ctx, &c, z, UM_ACCESS_WRITE_DISCARD, NULL, 0);
    um_task_id id = submit_probe(ctx, &d, y, UM_ACCESS_READ, NULL, 0);
    /* The buffers of unfinished tasks cannot go. */
    CHECK_STATUS(um_buffer_destroy(y), UM_ERR_BUSY);
    CHECK_ERROR_MENTIONS("tasks", NULL, NULL);
    atomic_store(&gate, 1);
    CHECK_STATUS(um_task_wait(ctx, ia), UM_ERR_TASK);
    CHECK_ERROR_MENTIONS("returned 7", NULL, NULL);
    CHECK_STATUS(um_task_wait(ctx, ib), UM_ERR_TASK);
    CHECK_ERROR_MENTIONS("depends on task 1", "failed", NULL);
    CHECK_STATUS(um_task_wait(ctx, id), UM_ERR_TASK);
    CHECK_OK(um_task_wait(ctx, ic));
    CHECK_STATUS(um_wait_all(ctx), UM_ERR_TASK); /* the first failure, once */
    CHECK_ERROR_MENTIONS("returned 7", NULL, NULL);
    CHECK_OK(um_wait_all(ctx));
    CHECK_EQ(atomic_load(&a.ran), 1);
    CHECK_EQ(atomic_load(&b.ran), 0); /* never run */
    CHECK_EQ(atomic_load(&d.ran), 0);
    CHECK_EQ(atomic_load(&c.ran), 1);
    CHECK_EQ(atomic_load(&b.done_calls), 1);
    CHECK_EQ(atomic_load(&b.done_status), UM_ERR_TASK);
    CHECK_EQ(atomic_load(&c.done_status), UM_OK);
    /* A task submitted after its writer failed fails at once. */
    probe e = {0};
    um_task_id ie = submit_probe(ctx, &e, x, UM_ACCESS_READ, NULL, 0);
    CHECK_STATUS(um_task_wait(ctx, ie), UM_ERR_TASK);
    CHECK_ERROR_MENTIONS("depends on task 1", "returned 7", NULL);
    CHECK_STATUS(um_wait_all(ctx), UM_ERR_TASK);
    /* A task that replaces x whole repairs it; readers after it run. */
    probe f = {0}, f2 = {0};
    CHECK_OK(um_task_wait(ctx, submit_probe(ctx, &f, x, UM_ACCESS_WRITE_DISCARD, NULL, 0)));
    CHECK_OK(um_task_wait(ctx, submit_probe(ctx, &f2, x, UM_ACCESS_READ, NULL, 0)));

    /* Cancellation: g holds z on a worker; h and its dependent k wait. */
    gate = 0;
    probe g = {0}, h = {0}, k = {0};
    g.gate = &gate;
    um_task_id ig = submit_probe(ctx, &g, z, UM_ACCESS_READ_WRITE, NULL, 0);
    um_task_id ih = submit_probe(ctx, &h, z, UM_ACCESS_READ_WRITE, NULL, 0);
    um_task_id ik = submit_probe(ctx, &k, z, UM_ACCESS_READ, NULL, 0);
    while (!atomic_load(&g.ran))
        usleep(1000);
    CHECK_STATUS(um_task_cancel(ctx, ig), UM_ERR_BUSY);
    CHECK_ERROR_MENTIONS("started", NULL, NULL);
    CHECK_OK(um_task_cancel(ctx, ih));
    atomic_store(&gate, 1);
    CHECK_OK(um_task_wait(ctx, ig));
    CHECK_STATUS(um_task_wait(ctx, ih), UM_ERR_CANCELLED);
    CHECK_STATUS(um_task_wait(ctx, ik), UM_ERR_TASK);
    CHECK_ERROR_MENTIONS("was cancelled", NULL, NULL);
    CHECK_EQ(atomic_load(&h.ran) + atomic_load(&k.ran), 0);
    CHECK_EQ(atomic_load(&h.done_status), UM_ERR_CANCELLED);
    CHECK_STATUS(um_task_cancel(ctx, ig), UM_ERR_BUSY);
    CHECK_ERROR_MENTIONS("finished", NULL, NULL);
    CHECK_STATUS(um_wait_all(ctx), UM_ERR_CANCELLED);
    CHECK_OK(um_buffer_destroy(y));
    CHECK_OK(um_buffer_destroy(x));
    CHECK_OK(um_buffer_destroy(z));
    um_shutdown(ctx);
}

/* A failure at the head of a chain of 50,000 tasks fails them all (the
 * propagation must not recurse once per task: the worker's stack would
 * not hold it). */
static void test_long_chain_failure(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,links=model", &ctx));
    if (!ctx)
        return;
    um_buffer *x;
    CHECK_OK(um_buffer_create(ctx, 4096, NULL, &x));
    _Atomic int gate = 0;
    probe head = {0}, rest = {0};
    head.result = 1;
    head.gate = &gate;
    um_task_id first = submit_probe(ctx, &head, x, UM_ACCESS_READ_WRITE, NULL, 0);
    const int n = 50000;
    um_task_id last = 0;
    for (int i = 0; i < n; i++)
        last = submit_probe(ctx, &rest, x, UM_ACCESS_READ_WRITE, NULL, 0);
    atomic_store(&gate, 1);
    CHECK_STATUS(um_task_wait(ctx, first), UM_ERR_TASK);
    CHECK_STATUS(um_task_wait(ctx, last), UM_ERR_TASK);
    CHECK_ERROR_MENTIONS("depends on task", "which failed", NULL);
    CHECK_STATUS(um_wait_all(ctx), UM_ERR_TASK);
    CHECK_EQ(atomic_load(&rest.ran), 0);
    CHECK_EQ(atomic_load(&rest.done_calls), n);
    CHECK_OK(um_buffer_destroy(x));
    um_shutdown(ctx);
}

static int noop(const um_task_exec *e)
{
    (void)e;
    return 0;
}

static void test_bad_input(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,links=model", &ctx));
    if (!ctx)
        return;
    um_buffer *x;
    CHECK_OK(um_buffer_create(ctx, 4096, NULL, &x));
    um_task t = {0};
    t.name = "bad";
    t.device = -1;
    t.nbuffers = 1;
    t.buffers[0] = x;
    t.modes[0] = UM_ACCESS_READ;
    um_task_id id;
    CHECK_STATUS(um_task_submit(ctx, &t, &id), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("no implementation", "'bad'", NULL);
    t.cpu = noop;
    t.modes[0] = (um_access)9;
    CHECK_STATUS(um_task_submit(ctx, &t, &id), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("mode 9", NULL, NULL);
    t.modes[0] = UM_ACCESS_READ;
    t.nbuffers = 2;
    t.buffers[1] = x;
    t.modes[1] = UM_ACCESS_WRITE;
    CHECK_STATUS(um_task_submit(ctx, &t, &id), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("twice", NULL, NULL);
    /* flops must be finite and not negative: an infinite one made a sim
     * worker's modelled time undefined (it slept for centuries). */
    t.nbuffers = 1;
    const double bad_flops[] = {NAN, INFINITY, -INFINITY, -1.0};
    for (int i = 0; i < 4; i++) {
        t.flops = bad_flops[i];
        CHECK_STATUS(um_task_submit(ctx, &t, &id), UM_ERR_INVALID);
        CHECK_ERROR_MENTIONS("'bad'", "flops", NULL);
    }
    /* Nor above 1e30, the bound the task-trace reader (vsim/tasktrace.c)
     * sets: a task of 1e31 flops was taken here and written to the task
     * trace, which could then not be read back. The next double above
     * the bound is refused too (test_vsim_sim takes the bound itself, and
     * reads it back from the trace). */
    const double above_bound[] = {1e31, 1e308};
    for (int i = 0; i < 2; i++) {
        t.flops = above_bound[i];
        CHECK_STATUS(um_task_submit(ctx, &t, &id), UM_ERR_INVALID);
        CHECK_ERROR_MENTIONS("'bad'", "flops", i == 0 ? "1e+31" : "1e+308");
    }
    t.flops = nextafter(1e30, INFINITY);
    CHECK_STATUS(um_task_submit(ctx, &t, &id), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("flops", "1.0000000000000002e+30", "1e+30");
    t.flops = 0;
    t.nbuffers = 2;
    t.nbuffers = 17;
    CHECK_STATUS(um_task_submit(ctx, &t, &id), UM_ERR_INVALID);
    t.nbuffers = 1;
    t.device = 5;
    CHECK_STATUS(um_task_submit(ctx, &t, &id), UM_ERR_NO_DEVICE);
    t.device = -1;
    t.cpu = NULL;
    t.cuda = noop;
    CHECK_STATUS(um_task_submit(ctx, &t, &id), UM_ERR_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("no implementation for", NULL, NULL);
    CHECK_STATUS(um_task_submit(NULL, &t, &id), UM_ERR_INVALID);
    CHECK_STATUS(um_task_wait(ctx, 1), UM_ERR_INVALID);
    CHECK_STATUS(um_task_cancel(ctx, 99), UM_ERR_INVALID);
    CHECK_OK(um_wait_all(ctx));
    um_task_stats ts;
    CHECK_STATUS(um_task_stats_get(ctx, 3, &ts), UM_ERR_NO_DEVICE);
    CHECK_STATUS(um_task_stats_get(ctx, 0, NULL), UM_ERR_INVALID);
    CHECK_OK(um_buffer_destroy(x));
    um_shutdown(ctx);
}

/* ------------------------------------------------------------ policies */

static int where_fn(const um_task_exec *e)
{
    atomic_store((_Atomic int *)e->user, e->device);
    return 0;
}

/* Runs one task reading b (and writing w), returns its device. */
static int place_one(um_context *ctx, um_buffer *b, um_buffer *w)
{
    _Atomic int dev = -1;
    um_task t = {0};
    t.name = "where";
    t.cpu = where_fn;
    t.buffers[0] = b;
    t.modes[0] = UM_ACCESS_READ;
    t.nbuffers = 1;
    if (w) {
        t.buffers[1] = w;
        t.modes[1] = UM_ACCESS_WRITE_DISCARD;
        t.nbuffers = 2;
    }
    t.device = -1;
    t.user = (void *)&dev;
    um_task_id id;
    CHECK_OK(um_task_submit(ctx, &t, &id));
    CHECK_OK(um_task_wait(ctx, id));
    return atomic_load(&dev);
}

/* host_tasks=0: every task runs on an accelerator, whatever the policy; a
 * task only the host could run is refused at submission, naming the
 * option, and so is one forced onto the host. */
static void test_no_host_tasks(void)
{
    for (int k = 0; k < 4; k++) {
        char conf[128];
        snprintf(conf, sizeof conf, "devices=sim:2x64M,links=model,host_tasks=0,sched=%s",
                 policies[k]);
        um_context *ctx = NULL;
        CHECK_OK(um_init(conf, &ctx));
        if (!ctx)
            return;
        um_buffer *b, *w;
        CHECK_OK(um_buffer_create(ctx, 1 << 16, NULL, &b));
        CHECK_OK(um_buffer_create(ctx, 1 << 16, NULL, &w));
        for (int i = 0; i < 20; i++) {
            int dev = place_one(ctx, b, w);
            CHECK(dev == 1 || dev == 2);
        }
        um_task t = {0};
        t.name = "host";
        t.cpu = noop;
        t.device = 0;
        um_task_id id;
        CHECK_STATUS(um_task_submit(ctx, &t, &id), UM_ERR_UNSUPPORTED);
        CHECK_ERROR_MENTIONS("forced onto the host", "host_tasks=0", NULL);
        CHECK_OK(um_buffer_destroy(b));
        CHECK_OK(um_buffer_destroy(w));
        um_shutdown(ctx);
    }
    um_context *ctx = NULL;
    CHECK_OK(um_init("host_tasks=0", &ctx));
    if (!ctx)
        return;
    um_task t = {0};
    t.name = "cpu_only";
    t.cpu = noop;
    t.device = -1;
    um_task_id id;
    CHECK_STATUS(um_task_submit(ctx, &t, &id), UM_ERR_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("only for the host", "host_tasks=0", NULL);
    /* With a CUDA implementation too, a GPU would run it, and there is
     * none: it was told that it had an implementation only for the host. */
    t.name = "cpu_and_cuda";
    t.cuda = noop;
    CHECK_STATUS(um_task_submit(ctx, &t, &id), UM_ERR_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("has a CUDA implementation", "has no GPU", "host_tasks=0");
    CHECK(strstr(um_last_error(), "only for the host") == NULL);
    um_shutdown(ctx);
}

static void test_policies(void)
{
    const size_t size = 8u << 20;
    for (int p = 0; p < 4; p++) {
        char conf[200];
        /* A slow modelled link: moving 8 MiB costs 80 ms. */
        snprintf(conf, sizeof conf,
                 "devices=sim:3x64M,links=model,sim_link_bandwidth=100M,sched=%s", policies[p]);
        um_context *ctx = NULL;
        CHECK_OK(um_init(conf, &ctx));
        if (!ctx)
            continue;
        um_buffer *b;
        void *q;
        CHECK_OK(um_buffer_create(ctx, size, NULL, &b));
        CHECK_OK(um_buffer_acquire(b, 2, UM_ACCESS_WRITE_DISCARD, NULL, &q));
        CHECK_OK(um_buffer_release(b, 2, NULL));
        int first = place_one(ctx, b, NULL);
        int second = place_one(ctx, b, NULL);
        if (!strcmp(policies[p], "locality") || !strcmp(policies[p], "cost")) {
            CHECK_EQ(first, 2); /* where the data is */
            CHECK_EQ(second, 2);
        } else if (!strcmp(policies[p], "round_robin")) {
            CHECK(second == (first + 1) % 4);
        } else {
            CHECK_EQ(first, 1); /* the first idle accelerator */
        }
        /* cost: a device whose limit is below the working set is never
         * chosen, however idle. */
        if (!strcmp(policies[p], "cost")) {
            CHECK_OK(um_set_memory_limit(ctx, 2, 8u << 20));
            um_buffer *w;
            CHECK_OK(um_buffer_create(ctx, size, NULL, &w));
            int d = place_one(ctx, b, w);
            CHECK(d != 2);
            CHECK_OK(um_buffer_destroy(w));
        }
        printf("test_task: %s placed a task reading data on device 2 on %d, then %d\n",
               policies[p], first, second);
        CHECK_OK(um_buffer_destroy(b));
        um_shutdown(ctx);
    }
}

/* cost, before any measurement: devices whose nominal rate is far below
 * the host's (sim devices modelled at 1 GFLOP/s: 0.5 s for each task
 * below) are not handed a task just to measure them, although they are
 * idle when the tasks arrive. Asserted from where each task says it ran
 * and from the task statistics. */
static void test_nominal_rates(void)
{
    um_context *ctx = NULL;
    /* With the stand-in driver the host's memory is pinned through the
     * CUDA backend, which must carry the host's nominal rate too. */
    CHECK_OK(um_init(getenv("UM_TEST_FAKE_CUDA")
                         ? "devices=sim:2x64M,sched=cost,sim_gflops=1,host_memory=pinned"
                         : "devices=sim:2x64M,sched=cost,sim_gflops=1",
                     &ctx));
    if (!ctx)
        return;
    enum { TASKS = 24 };
    um_buffer *b[TASKS];
    _Atomic int dev[TASKS];
    um_task_id id[TASKS];
    for (int i = 0; i < TASKS; i++) {
        CHECK_OK(um_buffer_create(ctx, 4096, NULL, &b[i]));
        atomic_init(&dev[i], -1);
        um_task t = {0};
        t.name = "nominal";
        t.cpu = where_fn;
        t.buffers[0] = b[i];
        t.modes[0] = UM_ACCESS_WRITE_DISCARD;
        t.nbuffers = 1;
        t.flops = 5e8; /* 0.5 s on a sim at 1 GFLOP/s; well under 1 ms on the host */
        t.device = -1;
        t.user = (void *)&dev[i];
        CHECK_OK(um_task_submit(ctx, &t, &id[i]));
    }
    CHECK_OK(um_wait_all(ctx));
    int on_host = 0;
    for (int i = 0; i < TASKS; i++)
        on_host += atomic_load(&dev[i]) == 0;
    um_task_stats st;
    CHECK_OK(um_task_stats_get(ctx, 1, &st));
    uint64_t sim1 = st.tasks;
    CHECK_OK(um_task_stats_get(ctx, 2, &st));
    uint64_t sim2 = st.tasks;
    /* Every task on the host: the sims' nominal 1 GFLOP/s makes each
     * 0.5 s there against the host's estimate of well under 1 ms. */
    CHECK_EQ(on_host, TASKS);
    CHECK_EQ(sim1 + sim2, 0);
    printf("test_task: nominal rates: %d of %d tasks on the host, %llu and %llu on the slow "
           "sims\n",
           on_host, TASKS, (unsigned long long)sim1, (unsigned long long)sim2);
    for (int i = 0; i < TASKS; i++)
        CHECK_OK(um_buffer_destroy(b[i]));
    um_shutdown(ctx);
}

/* -------------------------------------------------------------- priorities */

static _Atomic int ran_count;
static int ran_order[32];

static int record_fn(const um_task_exec *e)
{
    ran_order[atomic_fetch_add(&ran_count, 1)] = (int)(intptr_t)e->user;
    return 0;
}

/* A task that fails on each accelerator (its function, or its GPU
 * function, returns non-zero) fails with a message naming the device and
 * the value, its reader fails with it, and the device runs the next task. */
static void test_device_failure(void)
{
    const char *devs = getenv("UM_TEST_TASK_DEVICES");
    char conf[256];
    snprintf(conf, sizeof conf, "devices=%s,links=model", devs && *devs ? devs : "sim:2x64M");
    um_context *ctx = NULL;
    CHECK_OK(um_init(conf, &ctx));
    if (!ctx)
        return;
    for (int dev = 1; dev < um_device_count(ctx); dev++) {
        um_buffer *x;
        CHECK_OK(um_buffer_create(ctx, 4096, NULL, &x));
        probe bad = {.result = 5}, reader = {0}, good = {0};
        um_task t = {.name = "probe", .cpu = probe_fn, .cuda = probe_fn, .nbuffers = 1,
                     .device = dev, .user = &bad, .done = probe_done};
        t.buffers[0] = x;
        t.modes[0] = UM_ACCESS_WRITE_DISCARD;
        um_task_id ibad = 0, igood = 0;
        CHECK_OK(um_task_submit(ctx, &t, &ibad));
        um_task_id iread = submit_probe(ctx, &reader, x, UM_ACCESS_READ, NULL, 0);
        CHECK_STATUS(um_task_wait(ctx, ibad), UM_ERR_TASK);
        char want[64];
        snprintf(want, sizeof want, "on device %d returned 5", dev);
        CHECK_ERROR_MENTIONS(want, NULL, NULL);
        CHECK_STATUS(um_task_wait(ctx, iread), UM_ERR_TASK);
        CHECK_ERROR_MENTIONS("depends on task", "failed", NULL);
        CHECK_EQ(atomic_load(&bad.ran), 1);
        CHECK_EQ(atomic_load(&bad.done_status), UM_ERR_TASK);
        CHECK_EQ(atomic_load(&reader.ran), 0);
        t.user = &good;
        CHECK_OK(um_task_submit(ctx, &t, &igood));
        CHECK_OK(um_task_wait(ctx, igood));
        CHECK_EQ(atomic_load(&good.ran), 1);
        CHECK_STATUS(um_wait_all(ctx), UM_ERR_TASK); /* the first failure, reported once */
        CHECK_OK(um_wait_all(ctx));
        CHECK_OK(um_buffer_destroy(x));
    }
    um_shutdown(ctx);
}

/* One device, held by a task while twelve independent ones are submitted
 * (six fill its queue, six wait unplaced): once it is free they run by
 * priority, equal priorities in the order of submission, however the
 * two lists split them. */
static void test_priority_order(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,host_tasks=0,links=model", &ctx));
    if (!ctx)
        return;
    enum { N = 12 };
    static const int prio[N] = {1, 5, 3, 5, 0, 3, 9, -2, 5, 0, 7, 1};
    um_buffer *hold, *b[N];
    CHECK_OK(um_buffer_create(ctx, 4096, NULL, &hold));
    _Atomic int gate = 0;
    probe holder = {0};
    holder.gate = &gate;
    um_task_id ih = submit_probe(ctx, &holder, hold, UM_ACCESS_WRITE_DISCARD, NULL, 0);
    while (!atomic_load(&holder.ran))
        usleep(1000);
    atomic_store(&ran_count, 0);
    for (int i = 0; i < N; i++) {
        CHECK_OK(um_buffer_create(ctx, 4096, NULL, &b[i]));
        um_task t = {.name = "record", .cpu = record_fn, .nbuffers = 1, .device = -1,
                     .user = (void *)(intptr_t)i, .priority = prio[i]};
        t.buffers[0] = b[i];
        t.modes[0] = UM_ACCESS_WRITE_DISCARD;
        um_task_id id;
        CHECK_OK(um_task_submit(ctx, &t, &id));
    }
    atomic_store(&gate, 1);
    CHECK_OK(um_task_wait(ctx, ih));
    CHECK_OK(um_wait_all(ctx));
    CHECK_EQ(atomic_load(&ran_count), N);
    /* A stable sort of the submission order, highest first. */
    int want[N], n = 0;
    for (int p = 9; p >= -2; p--)
        for (int i = 0; i < N; i++)
            if (prio[i] == p)
                want[n++] = i;
    CHECK_EQ(n, N);
    for (int i = 0; i < N; i++)
        CHECK_EQ(ran_order[i], want[i]);
    for (int i = 0; i < N; i++)
        CHECK_OK(um_buffer_destroy(b[i]));
    CHECK_OK(um_buffer_destroy(hold));
    um_shutdown(ctx);
}

/* ------------------------------------------------------- audit findings */

static int nap_fn(const um_task_exec *e)
{
    probe *p = e->user;
    atomic_fetch_add(&p->ran, 1);
    usleep(1000); /* a measurable time, so placement learns it */
    return 0;
}

static _Atomic int in_callback, callback_gate;

/* A done callback that holds its worker (callbacks run on it, outside the
 * lock) until callback_gate opens. */
static void holding_done(um_task_id id, um_status st, void *user)
{
    probe_done(id, st, user);
    atomic_store(&in_callback, 1);
    while (!atomic_load(&callback_gate))
        usleep(1000);
}

/* A task cancelled in a device's queue frees room there, and a ready task
 * waiting for that device is placed at once. Here B ("b", never run on
 * device 1) waits because the cost policy gives a device one unmeasured
 * task at a time and A is queued there; A is cancelled while the worker
 * is held in the previous task's callback, so no task end follows to
 * place B. B used to wait for ever (and um_shutdown with it). */
static void test_cancel_frees_queue(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:2x64M,links=model,sched=cost", &ctx));
    if (!ctx)
        return;
    _Atomic int gate = 0;
    probe first = {0}, g = {0}, a = {0}, b = {0};
    g.gate = &gate;
    /* "a" measured on device 1, so the next ones queue there. */
    um_task t = {.name = "a", .cpu = nap_fn, .device = 1, .user = &first};
    um_task_id id0, ig, ia, ib;
    CHECK_OK(um_task_submit(ctx, &t, &id0));
    CHECK_OK(um_task_wait(ctx, id0));
    t.cpu = probe_fn;
    t.user = &g;
    t.done = holding_done;
    atomic_store(&in_callback, 0);
    atomic_store(&callback_gate, 0);
    CHECK_OK(um_task_submit(ctx, &t, &ig));
    while (!atomic_load(&g.ran))
        usleep(1000);
    t.user = &a;
    t.done = probe_done;
    CHECK_OK(um_task_submit(ctx, &t, &ia));
    t.name = "b";
    t.user = &b;
    CHECK_OK(um_task_submit(ctx, &t, &ib));
    atomic_store(&gate, 1);
    while (!atomic_load(&in_callback))
        usleep(1000);
    /* The worker is in g's callback: A is still queued, B still waits. */
    CHECK_OK(um_task_cancel(ctx, ia));
    atomic_store(&callback_gate, 1);
    watch("um_task_wait for a task waiting on a device freed by um_task_cancel", 30);
    CHECK_OK(um_task_wait(ctx, ib));
    unwatch();
    CHECK_OK(um_task_wait(ctx, ig));
    CHECK_STATUS(um_task_wait(ctx, ia), UM_ERR_CANCELLED);
    CHECK_EQ(atomic_load(&a.ran), 0);
    CHECK_EQ(atomic_load(&b.ran), 1);
    CHECK_EQ(atomic_load(&b.done_status), UM_OK);
    CHECK_STATUS(um_wait_all(ctx), UM_ERR_CANCELLED);
    um_shutdown(ctx);
}

/* The runtime starts at the first submission; when a device's worker
 * cannot start (its stream fails here), that submission fails naming the
 * device and the cause, and the next one starts it whole. It used to
 * publish the half-made runtime: later submissions succeeded, and tasks
 * that only the devices without a worker could run waited for ever. */
static void test_runtime_start_failure(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:2x64M,links=model,host_tasks=0,fault=1:stream@1", &ctx));
    if (!ctx)
        return;
    _Atomic int dev = -1;
    um_task t = {.name = "where", .cpu = where_fn, .device = -1, .user = (void *)&dev};
    um_task_id id = 99;
    CHECK_STATUS(um_task_submit(ctx, &t, &id), UM_ERR_BACKEND);
    CHECK_ERROR_MENTIONS("could not start", "device 1's worker has no stream",
                         "injected failure");
    CHECK_EQ(id, 0);
    for (int d = 1; d <= 2; d++) {
        t.device = d;
        atomic_store(&dev, -1);
        CHECK_OK(um_task_submit(ctx, &t, &id));
        watch("um_task_wait after a failed start of the runtime", 30);
        CHECK_OK(um_task_wait(ctx, id));
        unwatch();
        CHECK_EQ(atomic_load(&dev), d);
    }
    watch("um_shutdown after a failed start of the runtime", 30);
    um_shutdown(ctx);
    unwatch();
}

/* A submission that runs out of memory for its dependency records fails
 * whole (UM_ERR_NOMEM, naming the task) and leaves no trace: here B reads
 * z (its reader list grows: the first realloc) and x (A's list of
 * dependents grows: the second, which fails). It used to create B failed
 * with x's `pending` count never raised, and B's end then lowered it,
 * taking A's count: x could be destroyed while A was queued to use it. */
static void test_submit_out_of_memory(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,links=model,sched=eager", &ctx));
    if (!ctx)
        return;
    um_buffer *x, *y, *z;
    CHECK_OK(um_buffer_create(ctx, 4096, NULL, &x));
    CHECK_OK(um_buffer_create(ctx, 4096, NULL, &y));
    CHECK_OK(um_buffer_create(ctx, 4096, NULL, &z));
    _Atomic int gate = 0;
    probe h = {0}, a = {0}, b = {0};
    h.gate = &gate;
    /* h holds device 1, so A stays queued behind it. */
    um_task t = {.name = "hold", .cpu = probe_fn, .device = 1, .nbuffers = 1, .user = &h};
    t.buffers[0] = y;
    t.modes[0] = UM_ACCESS_READ_WRITE;
    um_task_id ih, ia, ib = 99;
    CHECK_OK(um_task_submit(ctx, &t, &ih));
    while (!atomic_load(&h.ran))
        usleep(1000);
    t.name = "a";
    t.user = &a;
    t.buffers[0] = x;
    CHECK_OK(um_task_submit(ctx, &t, &ia));
    um_task bt = {.name = "b", .cpu = probe_fn, .device = 1, .nbuffers = 2, .user = &b};
    bt.buffers[0] = z;
    bt.modes[0] = UM_ACCESS_READ;
    bt.buffers[1] = x;
    bt.modes[1] = UM_ACCESS_READ;
    realloc_fail_in = 2;
    um_status st = um_task_submit(ctx, &bt, &ib);
    int left = realloc_fail_in;
    realloc_fail_in = 0;
    CHECK_EQ(left, 0); /* the injected failure was reached */
    CHECK_STATUS(st, UM_ERR_NOMEM);
    CHECK_ERROR_MENTIONS("'b'", "dependency records", "not submitted");
    CHECK_EQ(ib, 0);
    /* A, queued, still holds x. */
    CHECK_STATUS(um_buffer_destroy(x), UM_ERR_BUSY);
    atomic_store(&gate, 1);
    CHECK_OK(um_task_wait(ctx, ih));
    CHECK_OK(um_task_wait(ctx, ia));
    CHECK_EQ(atomic_load(&a.ran), 1);
    CHECK_EQ(atomic_load(&b.ran), 0);
    /* B never existed: the next task takes the next id, and runs. */
    CHECK_OK(um_task_submit(ctx, &bt, &ib));
    CHECK_EQ(ib, ia + 1);
    CHECK_OK(um_task_wait(ctx, ib));
    CHECK_EQ(atomic_load(&b.ran), 1);
    CHECK_OK(um_wait_all(ctx));
    CHECK_OK(um_buffer_destroy(x));
    CHECK_OK(um_buffer_destroy(y));
    CHECK_OK(um_buffer_destroy(z));
    um_shutdown(ctx);
}

/* A task on the three buffers b, each in `mode`, that writes where it ran
 * into *dev; placed by the policy. */
static um_task three_buffer_task(um_buffer *const *b, um_access mode, _Atomic int *dev)
{
    um_task t = {.name = "three", .cpu = where_fn, .device = -1, .nbuffers = 3,
                 .user = (void *)dev};
    for (int i = 0; i < 3; i++) {
        t.buffers[i] = b[i];
        t.modes[i] = mode;
    }
    return t;
}

/* No policy places a task on a device whose memory limit is below its
 * working set: with device 1 limited to 1 MiB and the host kept out, a
 * task on 1.5 MiB of buffers runs on device 2 under each. eager,
 * round_robin and locality used to place it on device 1, where its
 * buffers could not be had and it failed. */
static void test_policies_respect_limits(void)
{
    for (int p = 0; p < 4; p++) {
        char conf[200];
        snprintf(conf, sizeof conf,
                 "devices=sim:2x64M,links=model,sim_granularity=64K,host_tasks=0,sched=%s",
                 policies[p]);
        um_context *ctx = NULL;
        CHECK_OK(um_init(conf, &ctx));
        if (!ctx)
            continue;
        CHECK_OK(um_set_memory_limit(ctx, 1, 1u << 20));
        um_buffer *b[3];
        for (int i = 0; i < 3; i++)
            CHECK_OK(um_buffer_create(ctx, 512u << 10, NULL, &b[i]));
        for (int k = 0; k < 4; k++) {
            _Atomic int dev = -1;
            um_task t = three_buffer_task(b, UM_ACCESS_READ_WRITE, &dev);
            um_task_id id;
            CHECK_OK(um_task_submit(ctx, &t, &id));
            CHECK_OK(um_task_wait(ctx, id));
            CHECK_EQ(atomic_load(&dev), 2);
        }
        um_task_stats ts;
        CHECK_OK(um_task_stats_get(ctx, 1, &ts));
        CHECK_EQ(ts.tasks + ts.failed, 0);
        for (int i = 0; i < 3; i++)
            CHECK_OK(um_buffer_destroy(b[i]));
        um_shutdown(ctx);
    }
}

/* The fit test counts whole pages: three buffers of 4 MiB + 4 KiB (12 MiB
 * + 12 KiB, seven pages of 2 MiB) do not fit under a limit of 13 MiB
 * (six pages), so eager and cost run the task on the host and a task
 * forced onto the device is refused at submission. By the plain sum they
 * fitted: the task went to device 1, where its third buffer could not be
 * had, and failed. Three buffers of 2 MiB + 4 KiB (four pages: the pool
 * packs them) still run on the device under 8 MiB. */
static void test_limits_count_pages(void)
{
    const size_t MiB = (size_t)1 << 20;
    for (int p = 0; p < 2; p++) {
        char conf[200];
        snprintf(conf, sizeof conf, "devices=sim:64M,links=model,link_cache=none,sched=%s",
                 p ? "cost" : "eager");
        um_context *ctx = NULL;
        CHECK_OK(um_init(conf, &ctx));
        if (!ctx)
            continue;
        um_buffer *b[3];
        for (int i = 0; i < 3; i++)
            CHECK_OK(um_buffer_create(ctx, 4 * MiB + 4096, NULL, &b[i]));
        CHECK_OK(um_set_memory_limit(ctx, 1, 13 * MiB));
        _Atomic int dev = -1;
        um_task t = three_buffer_task(b, UM_ACCESS_WRITE_DISCARD, &dev);
        um_task_id id;
        CHECK_OK(um_task_submit(ctx, &t, &id));
        CHECK_OK(um_task_wait(ctx, id));
        CHECK_EQ(atomic_load(&dev), 0);
        um_task_stats ts;
        CHECK_OK(um_task_stats_get(ctx, 1, &ts));
        CHECK_EQ(ts.tasks + ts.failed, 0);

        t.device = 1;
        CHECK_STATUS(um_task_submit(ctx, &t, &id), UM_ERR_NOMEM);
        CHECK_ERROR_MENTIONS("forced onto device 1", "14680064 bytes", "2097152-byte pages");
        for (int i = 0; i < 3; i++)
            CHECK_OK(um_buffer_destroy(b[i]));

        for (int i = 0; i < 3; i++)
            CHECK_OK(um_buffer_create(ctx, 2 * MiB + 4096, NULL, &b[i]));
        CHECK_OK(um_set_memory_limit(ctx, 1, 8 * MiB));
        atomic_store(&dev, -1);
        t = three_buffer_task(b, UM_ACCESS_WRITE_DISCARD, &dev);
        CHECK_OK(um_task_submit(ctx, &t, &id));
        CHECK_OK(um_task_wait(ctx, id));
        CHECK_EQ(atomic_load(&dev), 1);
        for (int i = 0; i < 3; i++)
            CHECK_OK(um_buffer_destroy(b[i]));
        um_shutdown(ctx);
    }
}


/* cost, making room: a task whose only missing bytes are its output, on a
 * device full of data that only it holds, pays for writing the excess back
 * to the host (and fetching it again), so it runs on the empty device
 * beside it. The penalty used to scale with the missing inputs' transfer
 * time, none here, and the full device won the tie. */
static void test_cost_prices_eviction(void)
{
    const size_t MiB = (size_t)1 << 20;
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:2x64M,links=model,link_cache=none,sched=cost,host_tasks=0",
                     &ctx));
    if (!ctx)
        return;
    um_buffer *full, *out;
    void *p;
    CHECK_OK(um_buffer_create(ctx, 48 * MiB, NULL, &full));
    CHECK_OK(um_buffer_acquire(full, 1, UM_ACCESS_WRITE_DISCARD, NULL, &p));
    CHECK_OK(um_buffer_release(full, 1, NULL));
    CHECK_OK(um_buffer_create(ctx, 32 * MiB, NULL, &out));
    _Atomic int dev = -1;
    um_task t = {.name = "output", .cpu = where_fn, .device = -1, .nbuffers = 1,
                 .user = (void *)&dev};
    t.buffers[0] = out;
    t.modes[0] = UM_ACCESS_WRITE_DISCARD;
    um_task_id id;
    CHECK_OK(um_task_submit(ctx, &t, &id));
    CHECK_OK(um_task_wait(ctx, id));
    CHECK_EQ(atomic_load(&dev), 2);
    um_reclaim_stats rs;
    CHECK_OK(um_reclaim_stats_get(ctx, 1, &rs));
    CHECK_EQ(rs.written_back, 0);
    CHECK_OK(um_buffer_destroy(full));
    CHECK_OK(um_buffer_destroy(out));
    um_shutdown(ctx);
}

/* Memory the pool only caches costs nothing to reuse: a device whose
 * earlier data was destroyed (44 MiB cached of its 64 MiB) still takes the
 * task whose first input it holds, where the other device would fetch both.
 * The cost policy used to count the cached memory as data to evict and
 * sent the task away. */
static void test_cost_ignores_cached(void)
{
    const size_t MiB = (size_t)1 << 20;
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:2x64M,links=model,link_cache=none,sched=cost,host_tasks=0,"
                     "sim_gflops=100",
                     &ctx));
    if (!ctx)
        return;
    um_buffer *old, *a, *b;
    void *p;
    CHECK_OK(um_buffer_create(ctx, 60 * MiB, NULL, &old));
    CHECK_OK(um_buffer_acquire(old, 1, UM_ACCESS_WRITE_DISCARD, NULL, &p));
    CHECK_OK(um_buffer_release(old, 1, NULL));
    CHECK_OK(um_buffer_destroy(old));
    CHECK_OK(um_buffer_create(ctx, 16 * MiB, NULL, &a));
    CHECK_OK(um_buffer_create(ctx, 16 * MiB, NULL, &b));
    CHECK_OK(um_buffer_acquire(a, 1, UM_ACCESS_WRITE_DISCARD, NULL, &p));
    CHECK_OK(um_buffer_release(a, 1, NULL));
    CHECK_OK(um_buffer_acquire(b, 0, UM_ACCESS_WRITE_DISCARD, NULL, &p));
    CHECK_OK(um_buffer_release(b, 0, NULL));
    um_stats st;
    CHECK_OK(um_stats_get(ctx, 1, &st));
    CHECK(st.cached_bytes >= 40 * MiB);
    _Atomic int dev = -1;
    um_task t = {.name = "reads", .cpu = where_fn, .device = -1, .nbuffers = 2, .flops = 1e6,
                 .user = (void *)&dev};
    t.buffers[0] = a;
    t.buffers[1] = b;
    t.modes[0] = t.modes[1] = UM_ACCESS_READ;
    um_task_id id;
    CHECK_OK(um_task_submit(ctx, &t, &id));
    CHECK_OK(um_task_wait(ctx, id));
    CHECK_EQ(atomic_load(&dev), 1);
    CHECK_OK(um_buffer_destroy(a));
    CHECK_OK(um_buffer_destroy(b));
    um_shutdown(ctx);
}

/* Placement's history keeps learning once its table is full: after 4096
 * other task kinds, a kind device 1 has run three times is known there
 * (its time, 1 us, is the estimate), so the device is no longer
 * calibrating and takes the task beside one queued. A full table used to
 * learn nothing more: the device stayed "calibrating" for that kind for
 * ever and took one such task at a time. */
static double env_no_rate(void *arg, int dev)
{
    (void)arg;
    (void)dev;
    return 0.0;
}
static void env_all_room(void *arg, int dev, size_t *limit, size_t *used)
{
    (void)arg;
    (void)dev;
    *limit = (size_t)1 << 40;
    *used = 0;
}
static bool env_all_valid(void *arg, const um__place_task *t, int i, int dev, double *ns)
{
    (void)arg;
    (void)t;
    (void)i;
    (void)dev;
    *ns = 0.0;
    return true;
}
static size_t env_no_bytes(void *arg, const um__place_task *t, int i)
{
    (void)arg;
    (void)t;
    (void)i;
    return 0;
}

static void test_history_full(void)
{
    um__place_env env = {2, NULL, env_no_rate, env_all_room, env_all_valid, env_no_bytes};
    um__place *p = um__place_create(&env, UM_SCHED_COST);
    CHECK(p != NULL);
    if (!p)
        return;
    char name[32];
    um__place_task t = {.name = name, .eligible = {false, true}};
    for (int i = 0; i < 4096; i++) {
        snprintf(name, sizeof name, "kind%d", i);
        um__place_learn(p, &t, 1, 5000);
    }
    snprintf(name, sizeof name, "new");
    for (int k = 0; k < 3; k++)
        um__place_learn(p, &t, 1, 1000);
    um__place_device devs[2] = {{0, 0, false}, {1000.0, 1, false}};
    double est = 0.0;
    CHECK_EQ(um__place_pick(p, &t, devs, &est), 1);
    CHECK(est == 1000.0);
    /* Most kinds learnt first are still known: a new one replaces one
     * slot, the least used of those it may take (3901 of 4096 here). */
    int known = 0;
    for (int i = 0; i < 4096; i++) {
        snprintf(name, sizeof name, "kind%d", i);
        known += um__place_pick(p, &t, devs, &est) == 1 && est == 5000.0;
    }
    CHECK(known >= 3 * 4096 / 4);
    um__place_destroy(p);
}

/* A buffer of another context is refused at submission, naming its index:
 * its devices are not this context's (it failed on a device number the
 * other lacks, or ran against the wrong context's memory). */
static void test_foreign_buffer(void)
{
    um_context *c1 = NULL, *c2 = NULL;
    CHECK_OK(um_init("devices=sim:2x64M,links=model", &c1));
    CHECK_OK(um_init("devices=sim:64M,links=model", &c2));
    if (!c1 || !c2) {
        um_shutdown(c1);
        um_shutdown(c2);
        return;
    }
    um_buffer *mine, *theirs;
    CHECK_OK(um_buffer_create(c1, 4096, NULL, &mine));
    CHECK_OK(um_buffer_create(c2, 4096, NULL, &theirs));
    um_task t = {.name = "mixed", .cpu = noop, .device = -1, .nbuffers = 2};
    t.buffers[0] = mine;
    t.modes[0] = UM_ACCESS_READ_WRITE;
    t.buffers[1] = theirs;
    t.modes[1] = UM_ACCESS_READ;
    um_task_id id = 99;
    for (int d = -1; d <= 1; d++) {
        t.device = d;
        CHECK_STATUS(um_task_submit(c1, &t, &id), UM_ERR_INVALID);
        CHECK_ERROR_MENTIONS("'mixed'", "buffer 1", "another context");
        CHECK_EQ(id, 0);
    }
    CHECK_OK(um_wait_all(c1));
    CHECK_OK(um_buffer_destroy(mine));
    CHECK_OK(um_buffer_destroy(theirs));
    um_shutdown(c1);
    um_shutdown(c2);
}

/* Raising a memory limit places a task that was waiting for room: with
 * device 1 limited below a task's buffers and device 2's queue full of
 * tasks held at a gate, the task waits; once device 1's limit is raised
 * it runs there at once. It used to wait until a task ended somewhere. */
static void test_raised_limit_places(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:2x64M,links=model,sim_granularity=64K,host_tasks=0,"
                     "sched=eager", &ctx));
    if (!ctx)
        return;
    CHECK_OK(um_set_memory_limit(ctx, 1, 1u << 20));
    um_buffer *b[3];
    for (int i = 0; i < 3; i++)
        CHECK_OK(um_buffer_create(ctx, 512u << 10, NULL, &b[i]));
    _Atomic int gate = 0;
    enum { HELD = 8 }; /* more than a queue takes */
    probe held[HELD] = {0};
    um_task_id ids[HELD];
    for (int i = 0; i < HELD; i++) {
        held[i].gate = &gate;
        um_task t = {.name = "hold", .cpu = probe_fn, .device = 2, .user = &held[i]};
        CHECK_OK(um_task_submit(ctx, &t, &ids[i]));
    }
    _Atomic int dev = -1;
    um_task t = three_buffer_task(b, UM_ACCESS_READ_WRITE, &dev);
    um_task_id id;
    CHECK_OK(um_task_submit(ctx, &t, &id));
    usleep(20000);
    CHECK_EQ(atomic_load(&dev), -1); /* it waits: device 2 is full, 1 too small */
    CHECK_OK(um_set_memory_limit(ctx, 1, 64u << 20));
    long long until = mono_ns() + 10000000000ll * (HARNESS_SANITIZED ? 5 : 1);
    while (atomic_load(&dev) < 0 && mono_ns() < until)
        usleep(1000);
    CHECK_EQ(atomic_load(&dev), 1);
    atomic_store(&gate, 1);
    CHECK_OK(um_wait_all(ctx));
    for (int i = 0; i < 3; i++)
        CHECK_OK(um_buffer_destroy(b[i]));
    um_shutdown(ctx);
}

/* ------------------------------------------------- run layer review fixes */

/* A prefetch held in the middle: the wrapped memory of a buffer is made
 * unreadable, so the worker's copy from it faults, and the handler holds
 * that thread until the test lets it go (then makes the memory readable
 * and returns, and the copy goes on). */
static char *held_page;
static size_t held_page_size;
static _Atomic int held_in_copy, held_release;

static void on_held_page_fault(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    char *a = si->si_addr;
    if (!held_page || a < held_page || a >= held_page + held_page_size) {
        signal(sig, SIG_DFL); /* another fault: it crashes as it would have */
        return;
    }
    atomic_store(&held_in_copy, 1);
    while (!atomic_load(&held_release)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    mprotect(held_page, held_page_size, PROT_READ | PROT_WRITE);
}

typedef struct destroyer {
    um_buffer *b;
    _Atomic int done;
    um_status st;
} destroyer;

static void *destroy_main(void *arg)
{
    destroyer *d = arg;
    d->st = um_buffer_destroy(d->b);
    atomic_store(&d->done, 1);
    return NULL;
}

/* A buffer the worker is prefetching is not destroyed under it: with the
 * worker held in the copy of the first of the next tasks' inputs (w),
 * the only task that reads the second (y) is cancelled and y destroyed.
 * The destroy waits until the worker has let y go. It used to succeed at
 * once: a buffer made then took y's handle, and the worker prefetched
 * that buffer, which no task named, or read y's destroyed record. */
static void test_prefetch_keeps_buffer(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,links=model,sched=eager", &ctx));
    if (!ctx)
        return;
    held_page_size = (size_t)sysconf(_SC_PAGESIZE);
    char *page =
        mmap(NULL, held_page_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(page != MAP_FAILED);
    if (page == MAP_FAILED) {
        um_shutdown(ctx);
        return;
    }
    memset(page, 7, held_page_size);
    struct sigaction sa = {0}, old_sa;
    sa.sa_sigaction = on_held_page_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    CHECK_EQ(sigaction(SIGSEGV, &sa, &old_sa), 0);
    atomic_store(&held_in_copy, 0);
    atomic_store(&held_release, 0);

    um_buffer *w, *y, *z = NULL;
    CHECK_OK(um_buffer_wrap(ctx, page, held_page_size, &w));
    CHECK_OK(um_buffer_create(ctx, 4096, NULL, &y));
    char data[4096];
    memset(data, 1, sizeof data);
    CHECK_OK(um_buffer_write(y, 0, data, sizeof data));
    _Atomic int gate = 0;
    probe g = {0}, a = {0}, b1 = {0}, b2 = {0};
    hold_device(ctx, &g, &gate);
    um_task_id ia, ib1, ib2;
    um_task t;
    /* Queued behind the gate: a, then b1 reading w and b2 reading y, whose
     * inputs the worker prefetches once it takes a. */
    t = (um_task){.name = "a", .cpu = probe_fn, .device = 1, .user = &a};
    CHECK_OK(um_task_submit(ctx, &t, &ia));
    t = (um_task){.name = "b1", .cpu = probe_fn, .device = 1, .nbuffers = 1, .user = &b1};
    t.buffers[0] = w;
    t.modes[0] = UM_ACCESS_READ;
    CHECK_OK(um_task_submit(ctx, &t, &ib1));
    t.name = "b2";
    t.user = &b2;
    t.buffers[0] = y;
    CHECK_OK(um_task_submit(ctx, &t, &ib2));
    held_page = page;
    CHECK_EQ(mprotect(page, held_page_size, PROT_NONE), 0);
    atomic_store(&gate, 1);
    watch("the worker's prefetch of a buffer made unreadable", 30);
    while (!atomic_load(&held_in_copy))
        usleep(1000);
    unwatch();
    /* The worker is copying w, with y listed next. */
    CHECK_OK(um_task_cancel(ctx, ib2));
    destroyer d = {.b = y};
    pthread_t tid;
    CHECK_EQ(pthread_create(&tid, NULL, destroy_main, &d), 0);
    usleep(100000);
    bool destroyed_under_prefetch = atomic_load(&d.done);
    CHECK(!destroyed_under_prefetch);
    if (destroyed_under_prefetch) {
        /* What followed: a new buffer on the recycled handle. */
        CHECK_OK(um_buffer_create(ctx, 4096, NULL, &z));
        CHECK_OK(um_buffer_write(z, 0, data, sizeof data));
    }
    atomic_store(&held_release, 1);
    watch("um_buffer_destroy of a buffer being prefetched", 30);
    pthread_join(tid, NULL);
    unwatch();
    CHECK_OK(d.st);
    CHECK_OK(um_task_wait(ctx, ia));
    CHECK_OK(um_task_wait(ctx, ib1));
    CHECK_STATUS(um_task_wait(ctx, ib2), UM_ERR_CANCELLED);
    CHECK_EQ(atomic_load(&b1.ran), 1);
    CHECK_EQ(atomic_load(&b2.ran), 0);
    CHECK_STATUS(um_wait_all(ctx), UM_ERR_CANCELLED);
    if (z) {
        CHECK_EQ(um_buffer_replica_state(z, 1), UM_REPLICA_INVALID); /* no task named it */
        CHECK_OK(um_buffer_destroy(z));
    }
    held_page = NULL;
    CHECK_OK(um_buffer_destroy(w));
    CHECK_EQ(sigaction(SIGSEGV, &old_sa, NULL), 0);
    um_shutdown(ctx);
    munmap(page, held_page_size);
}

/* A ready task's announcements (UM_HINT_WILL_USE, one per coming use) go
 * when the use will not come: the task is cancelled in its queue, or its
 * acquisition stops at a buffer that cannot be had (b here: device 1's
 * limit was lowered under it). They used to stay for good, so reclaim
 * kept those buffers as needed soon, over the program's WONT_USE. */
static void test_announcements_withdrawn(void)
{
    const size_t MiB = (size_t)1 << 20;
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,links=model,sim_granularity=64K,sched=eager", &ctx));
    if (!ctx)
        return;
    um_buffer *x, *a, *b;
    CHECK_OK(um_buffer_create(ctx, 4096, NULL, &x));
    CHECK_OK(um_buffer_create(ctx, MiB, NULL, &a));
    CHECK_OK(um_buffer_create(ctx, MiB, NULL, &b));
    _Atomic int gate = 0;
    probe g = {0}, r = {0}, two = {0};
    hold_device(ctx, &g, &gate);
    um_task_id ir, itwo;
    um_task t;
    t = (um_task){.name = "reader", .cpu = probe_fn, .device = 1, .nbuffers = 1, .user = &r};
    t.buffers[0] = x;
    t.modes[0] = UM_ACCESS_READ;
    CHECK_OK(um_task_submit(ctx, &t, &ir));
    CHECK_EQ(x->nannounced, 1);
    CHECK_OK(um_task_cancel(ctx, ir));
    CHECK_EQ(x->nannounced, 0);

    t = (um_task){.name = "two", .cpu = probe_fn, .device = 1, .nbuffers = 2, .user = &two};
    t.buffers[0] = a;
    t.buffers[1] = b;
    t.modes[0] = t.modes[1] = UM_ACCESS_READ;
    CHECK_OK(um_task_submit(ctx, &t, &itwo));
    CHECK_EQ(a->nannounced + b->nannounced, 2);
    CHECK_OK(um_set_memory_limit(ctx, 1, MiB + MiB / 2)); /* a fits, a and b do not */
    atomic_store(&gate, 1);
    CHECK_STATUS(um_task_wait(ctx, itwo), UM_ERR_TASK);
    CHECK_ERROR_MENTIONS("could not be had", NULL, NULL);
    CHECK_EQ(atomic_load(&two.ran), 0);
    CHECK_EQ(a->nannounced, 0); /* taken by its acquisition */
    CHECK_EQ(b->nannounced, 0); /* withdrawn */
    /* Only a came in; b's bytes, which never moved, were counted too. */
    um_task_stats ts;
    CHECK_OK(um_task_stats_get(ctx, 1, &ts));
    CHECK_EQ(ts.bytes_in, MiB);
    (void)um_wait_all(ctx);
    CHECK_OK(um_buffer_destroy(x));
    CHECK_OK(um_buffer_destroy(a));
    CHECK_OK(um_buffer_destroy(b));
    um_shutdown(ctx);
}

static int failing_fn(const um_task_exec *e)
{
    (void)e;
    return 3;
}

/* Failure messages are kept for every failed id, and found without a scan:
 * 60,000 readers of a buffer whose writer failed fail at submission in
 * well under a second (each used to scan every earlier failure: 4 s), and
 * keep little memory each (528 bytes, for good). A chain of failures at
 * submission quotes its causes, as it did. */
static void test_failure_records(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,links=model,sched=eager", &ctx));
    if (!ctx)
        return;
    um_buffer *x;
    CHECK_OK(um_buffer_create(ctx, 4096, NULL, &x));
    um_task t = {.name = "writer", .cpu = failing_fn, .device = 0, .nbuffers = 1};
    t.buffers[0] = x;
    t.modes[0] = UM_ACCESS_WRITE;
    um_task_id iw, first = 0, last = 0;
    CHECK_OK(um_task_submit(ctx, &t, &iw));
    CHECK_STATUS(um_task_wait(ctx, iw), UM_ERR_TASK);
    t.name = "reader";
    t.cpu = noop;
    t.modes[0] = UM_ACCESS_READ;
    const int n = 60000;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
    struct mallinfo2 m0 = mallinfo2();
#endif
    long long t0 = mono_ns();
    for (int i = 0; i < n; i++) {
        CHECK_OK(um_task_submit(ctx, &t, &last));
        if (!first)
            first = last;
    }
    double s = (double)(mono_ns() - t0) / 1e9;
    printf("test_task: %d submissions failing with a failed writer: %.3f s\n", n, s);
    CHECK(s < 1.0 * (HARNESS_SANITIZED ? 5 : 1));
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
    if (!HARNESS_SANITIZED) {
        struct mallinfo2 m1 = mallinfo2();
        double per = (double)((m1.uordblks + m1.hblkhd) - (m0.uordblks + m0.hblkhd)) / n;
        printf("test_task: %.0f bytes kept per failed task\n", per);
        CHECK(per < 300);
    }
#endif
    CHECK_STATUS(um_wait_all(ctx), UM_ERR_TASK);
    CHECK_ERROR_MENTIONS("writer", "returned 3", NULL);
    for (um_task_id id = first; id <= last; id += (last - first) / 4) {
        char want[64];
        snprintf(want, sizeof want, "task %llu (reader) depends on task %llu, which failed",
                 (unsigned long long)id, (unsigned long long)iw);
        CHECK_STATUS(um_task_wait(ctx, id), UM_ERR_TASK);
        CHECK_ERROR_MENTIONS(want, "(writer) on device 0 returned 3", NULL);
    }
    /* Read-write tasks after the failure fail at submission one after the
     * other, each quoting the one before it. */
    t.modes[0] = UM_ACCESS_READ_WRITE;
    t.name = "rw";
    um_task_id c1, c2;
    CHECK_OK(um_task_submit(ctx, &t, &c1));
    CHECK_OK(um_task_submit(ctx, &t, &c2));
    char want[160];
    snprintf(want, sizeof want,
             "task %llu (rw) depends on task %llu, which failed: task %llu (rw) depends on "
             "task %llu, which failed: task %llu (writer)",
             (unsigned long long)c2, (unsigned long long)c1, (unsigned long long)c1,
             (unsigned long long)iw, (unsigned long long)iw);
    CHECK_STATUS(um_task_wait(ctx, c2), UM_ERR_TASK);
    CHECK_ERROR_MENTIONS(want, NULL, NULL);
    CHECK_STATUS(um_wait_all(ctx), UM_ERR_TASK);
    CHECK_OK(um_buffer_destroy(x));
    um_shutdown(ctx);
}

/* What the run layer keeps per finished task is its outcome byte: the
 * records of finished tasks go from the table of ids, and the readers of
 * a buffer that is only read go from its list once settled. 100,000
 * readers of one buffer grew the heap by 24 bytes each (a record slot
 * per id, and a reader entry per read, for good). */
static void test_finished_tasks_forgotten(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,links=model,sched=eager", &ctx));
    if (!ctx)
        return;
    um_buffer *weights;
    CHECK_OK(um_buffer_create(ctx, 4096, NULL, &weights));
    um_task t = {.name = "layer", .cpu = noop, .device = 0, .nbuffers = 1};
    t.buffers[0] = weights;
    t.modes[0] = UM_ACCESS_READ;
    const int n = HARNESS_SANITIZED ? 20000 : 100000;
    um_task_id id;
    for (int i = 0; i < 2000; i++) /* the runtime's own memory is made first */
        CHECK_OK(um_task_submit(ctx, &t, &id));
    CHECK_OK(um_wait_all(ctx));
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
    struct mallinfo2 m0 = mallinfo2();
#endif
    for (int i = 0; i < n; i++) {
        CHECK_OK(um_task_submit(ctx, &t, &id));
        if (i % 1000 == 999)
            CHECK_OK(um_wait_all(ctx));
    }
    CHECK_OK(um_wait_all(ctx));
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
    if (!HARNESS_SANITIZED) {
        struct mallinfo2 m1 = mallinfo2();
        double per = (double)((m1.uordblks + m1.hblkhd) - (m0.uordblks + m0.hblkhd)) / n;
        printf("test_task: %.1f bytes kept per finished task\n", per);
        CHECK(per < 6);
    }
#endif
    CHECK_OK(um_task_wait(ctx, 1)); /* still known */
    CHECK_OK(um_task_wait(ctx, id));
    CHECK_OK(um_buffer_destroy(weights));
    um_shutdown(ctx);
}

/* The task's name is copied at submission: a name in a buffer the program
 * changes at once is still the task's when it runs (its failure message
 * here); it was read there, so the message named "overwritten". A name
 * longer than UM_TASK_NAME_MAX - 1 bytes is cut before the character
 * that would not fit whole (the 2-byte "é" at bytes 62 and 63). */
static void test_name_copied(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,links=model,sched=eager", &ctx));
    if (!ctx)
        return;
    _Atomic int gate = 0;
    probe g = {0}, p1 = {.result = 4}, p2 = {.result = 4};
    g.gate = &gate;
    um_task t = {.name = "gate", .cpu = probe_fn, .device = 1, .user = &g};
    um_task_id ig, i1, i2;
    CHECK_OK(um_task_submit(ctx, &t, &ig));
    while (!atomic_load(&g.ran))
        usleep(1000);
    char name[100];
    snprintf(name, sizeof name, "first_name");
    t.name = name;
    t.user = &p1;
    CHECK_OK(um_task_submit(ctx, &t, &i1));
    snprintf(name, sizeof name, "overwritten");
    memset(name, 'a', 62);
    memcpy(name + 62, "\xc3\xa9tail", 7);
    t.user = &p2;
    CHECK_OK(um_task_submit(ctx, &t, &i2));
    memset(name, 'z', sizeof name - 1);
    atomic_store(&gate, 1);
    CHECK_STATUS(um_task_wait(ctx, i1), UM_ERR_TASK);
    CHECK_ERROR_MENTIONS("(first_name) on device 1 returned 4", NULL, NULL);
    char want[80] = "(";
    memset(want + 1, 'a', 62);
    strcpy(want + 63, ") on");
    CHECK_STATUS(um_task_wait(ctx, i2), UM_ERR_TASK);
    CHECK_ERROR_MENTIONS(want, NULL, NULL);
    CHECK_STATUS(um_wait_all(ctx), UM_ERR_TASK);
    um_shutdown(ctx);
}

/* A context whose sim device 1 holds at most `limit` bytes, with no
 * reclaim ahead of need (both watermarks at the limit); NULL on failure. */
static um_context *limited_device(size_t limit)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,links=model,sim_granularity=64K,sched=eager", &ctx));
    if (ctx) {
        CHECK_OK(um_set_memory_limit(ctx, 1, limit));
        CHECK_OK(um_set_watermarks(ctx, 1, limit, limit));
    }
    return ctx;
}

static int short_nap_fn(const um_task_exec *e)
{
    (void)e;
    usleep(2000);
    return 0;
}

static int long_nap_fn(const um_task_exec *e)
{
    (void)e;
    usleep(300 * 1000); /* the next tasks' inputs are prefetched meanwhile */
    return 0;
}

/* Device 1 held by a gate task while one reader task per buffer of b is
 * queued there (the first running `first`, the others short_nap_fn), so
 * that all are queued when the first starts; then the gate opens and all
 * run. */
static void read_each_behind_gate(um_context *ctx, um_buffer **b, int n,
                                  int (*first)(const um_task_exec *))
{
    _Atomic int gate = 0;
    probe g = {0};
    um_task_id id = hold_device(ctx, &g, &gate);
    for (int i = 0; i < n; i++) {
        um_task t = {.name = "reader", .cpu = i ? short_nap_fn : first, .device = 1,
                     .nbuffers = 1};
        t.buffers[0] = b[i];
        t.modes[0] = UM_ACCESS_READ;
        CHECK_OK(um_task_submit(ctx, &t, &id));
    }
    atomic_store(&gate, 1);
    CHECK_OK(um_wait_all(ctx));
}

/* Prefetches come after the running task's acquisition, so they take
 * only the room it leaves: eight readers of 1 MiB each on a device of
 * 2 MiB copy 8 MiB in 8 copies. Prefetching first filled the device, the
 * running task's acquisition evicted a prefetched copy, and it came again
 * (9 copies). */
static void test_prefetch_after_acquire(void)
{
    const size_t MiB = (size_t)1 << 20;
    um_context *ctx = limited_device(2 * MiB);
    if (!ctx)
        return;
    enum { N = 8 };
    um_buffer *b[N];
    char *data = calloc(1, MiB);
    for (int i = 0; i < N; i++) {
        CHECK_OK(um_buffer_create(ctx, MiB, NULL, &b[i]));
        CHECK_OK(um_buffer_write(b[i], 0, data, MiB));
    }
    read_each_behind_gate(ctx, b, N, short_nap_fn);
    um_link_stats ls;
    CHECK_OK(um_link_stats_get(ctx, 0, 1, &ls));
    printf("test_task: %d readers of 1 MiB on a 2 MiB device: %llu copies in\n", N,
           (unsigned long long)ls.copies);
    CHECK_EQ(ls.copies, N);
    CHECK_EQ(ls.bytes, N * MiB);
    for (int i = 0; i < N; i++)
        CHECK_OK(um_buffer_destroy(b[i]));
    free(data);
    um_shutdown(ctx);
}

/* Whether the buffer in e->user has a valid replica on the task's device
 * while the task runs: 1 yes, -1 no. */
static _Atomic int next_input_present;
static int check_next_input_fn(const um_task_exec *e)
{
    bool present = um_buffer_replica_state(e->user, e->device) != UM_REPLICA_INVALID;
    atomic_store(&next_input_present, present ? 1 : -1);
    return 0;
}

/* The pool's cached memory is room for a prefetch: a device of 4 MiB with
 * one 2 MiB input live and 64 KiB of freed memory kept by the pool still
 * takes the next task's 2 MiB input ahead of it. Counting the backend's
 * physical bytes, the runtime saw 4 MiB + 64 KiB and prefetched nothing:
 * `unimem sim --engine runtime` then ran GEMM n 65536 at a 4 GiB limit
 * in 13.9 s with the pool against 10.8 s with bufcache (16 MiB of the
 * link measurement's staging memory stayed cached in the pool). */
static void test_prefetch_into_cached_memory(void)
{
    const size_t KiB = 1024, MiB = KiB * KiB;
    um_context *ctx = limited_device(4 * MiB);
    if (!ctx)
        return;
    void *p = NULL;
    CHECK_OK(um_malloc(ctx, 1, 64 * KiB, NULL, &p));
    CHECK_OK(um_free(ctx, p, NULL));
    um_stats st;
    CHECK_OK(um_stats_get(ctx, 1, &st));
    CHECK(st.cached_bytes >= 64 * KiB); /* the case tested: the pool keeps it */
    um_buffer *a = NULL, *b = NULL;
    char *data = calloc(1, 2 * MiB);
    CHECK_OK(um_buffer_create(ctx, 2 * MiB, NULL, &a));
    CHECK_OK(um_buffer_create(ctx, 2 * MiB, NULL, &b));
    if (!a || !b || !data)
        return;
    CHECK_OK(um_buffer_write(a, 0, data, 2 * MiB));
    CHECK_OK(um_buffer_write(b, 0, data, 2 * MiB));
    _Atomic int gate = 0;
    probe g = {0};
    um_task_id id = hold_device(ctx, &g, &gate);
    /* a's task looks for b while it runs; b's task is queued behind it. */
    atomic_store(&next_input_present, 0);
    um_task t = (um_task){.name = "reads a", .cpu = check_next_input_fn, .device = 1, .nbuffers = 1,
                  .user = b};
    t.buffers[0] = a;
    t.modes[0] = UM_ACCESS_READ;
    CHECK_OK(um_task_submit(ctx, &t, &id));
    t = (um_task){.name = "reads b", .cpu = short_nap_fn, .device = 1, .nbuffers = 1};
    t.buffers[0] = b;
    t.modes[0] = UM_ACCESS_READ;
    CHECK_OK(um_task_submit(ctx, &t, &id));
    atomic_store(&gate, 1);
    CHECK_OK(um_wait_all(ctx));
    CHECK_EQ(atomic_load(&next_input_present), 1);
    um_link_stats ls;
    CHECK_OK(um_link_stats_get(ctx, 0, 1, &ls));
    CHECK_EQ(ls.copies, 2); /* each input came in once */
    CHECK_OK(um_buffer_destroy(a));
    CHECK_OK(um_buffer_destroy(b));
    free(data);
    um_shutdown(ctx);
}

/* A prefetch goes into free memory only: it never evicts. The room the
 * runtime checks counts live bytes, not the 2 MiB pages they round up to:
 * on a device of 13 MiB running a task on A (4 MiB + 4 KiB, three pages)
 * with B and C of the same size queued, B is prefetched (five pages) and
 * the room left looks like 4.99 MiB, though C needs three more pages than
 * the one left. C's prefetch then evicted B, which B's task fetched again
 * (an audit's run: 4 copies, 4 MiB fetched twice). */
static void test_prefetch_never_evicts(void)
{
    const size_t MiB = (size_t)1 << 20, size = 4 * MiB + 4096;
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,links=model,sched=eager", &ctx));
    if (!ctx)
        return;
    CHECK_OK(um_set_memory_limit(ctx, 1, 13 * MiB));
    CHECK_OK(um_set_watermarks(ctx, 1, 13 * MiB, 13 * MiB));
    um_buffer *b[3] = {NULL, NULL, NULL};
    char *data = calloc(1, size);
    for (int i = 0; i < 3; i++) {
        CHECK_OK(um_buffer_create(ctx, size, NULL, &b[i]));
        if (b[i] && data)
            CHECK_OK(um_buffer_write(b[i], 0, data, size));
    }
    free(data);
    if (!b[0] || !b[1] || !b[2]) {
        um_shutdown(ctx);
        return;
    }
    read_each_behind_gate(ctx, b, 3, long_nap_fn);
    um_reclaim_stats rs;
    um_link_stats ls;
    CHECK_OK(um_reclaim_stats_get(ctx, 1, &rs));
    CHECK_OK(um_link_stats_get(ctx, 0, 1, &ls));
    CHECK_EQ(rs.refetched_bytes, 0);
    CHECK_EQ(ls.copies, 3); /* each input came in once */
    for (int i = 0; i < 3; i++)
        CHECK_OK(um_buffer_destroy(b[i]));
    um_shutdown(ctx);
}

static _Atomic int ran_on_device = -1;

static int note_device_fn(const um_task_exec *e)
{
    atomic_store(&ran_on_device, e->device);
    return 0;
}

/* Memory that eviction cannot free (the program's own um_malloc block, or
 * a pinned buffer) does not count in placement, which checks a task's
 * pages against the limit: a 32 MiB task went to a 64 MiB device that
 * held 48 MiB so, failed there (UM_ERR_NOMEM) and failed every task after
 * it, though the host could run it. It is placed again, with that device
 * ruled out, under every policy (an audit). */
static void test_placed_again_where_memory_is_held(void)
{
    for (int pin = 0; pin < 2; pin++)
        for (int p = 0; p < 4; p++) {
            char conf[96];
            snprintf(conf, sizeof conf, "devices=sim:64M,links=model,sched=%s", policies[p]);
            um_context *ctx = NULL;
            CHECK_OK(um_init(conf, &ctx));
            if (!ctx)
                return;
            CHECK_OK(um_set_memory_limit(ctx, 1, 64 << 20));
            void *held = NULL;
            um_buffer *pinned = NULL, *b = NULL;
            if (pin) {
                um_buffer_opts on1 = {1};
                CHECK_OK(um_buffer_create(ctx, 48 << 20, &on1, &pinned));
                CHECK_OK(um_buffer_hint(pinned, UM_HINT_PIN));
            } else {
                CHECK_OK(um_malloc(ctx, 1, 48 << 20, NULL, &held));
            }
            CHECK_OK(um_buffer_create(ctx, 32 << 20, NULL, &b));
            um_task t = {.name = "writes 32 MiB", .cpu = note_device_fn, .device = -1,
                         .nbuffers = 1};
            t.buffers[0] = b;
            t.modes[0] = UM_ACCESS_WRITE_DISCARD;
            um_task_id id = 0;
            atomic_store(&ran_on_device, -1);
            CHECK_OK(um_task_submit(ctx, &t, &id));
            CHECK_OK(um_task_wait(ctx, id));
            CHECK_EQ(atomic_load(&ran_on_device), 0);
            CHECK_OK(um_buffer_destroy(b));
            if (pinned)
                CHECK_OK(um_buffer_destroy(pinned));
            if (held)
                CHECK_OK(um_free(ctx, held, NULL));
            um_shutdown(ctx);
        }
}

/* A task's own replicas can split a device's free memory: reading A and B
 * (60 KiB each, already there among others) and writing C (120 KiB) under
 * a 256 KiB limit of 64 KiB pages, C fitted nowhere once A and B were
 * held, and with no other device (host_tasks=0) the task failed with
 * nothing else on the device. Its acquisition lets go and takes the
 * buffers again, largest first (an audit). */
static void test_own_replicas_fragment(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,sim_granularity=64K,links=model,host_tasks=0", &ctx));
    if (!ctx)
        return;
    CHECK_OK(um_set_memory_limit(ctx, 1, 256 << 10));
    um_buffer_opts on1 = {1};
    um_buffer *a = NULL, *x = NULL, *b = NULL, *y = NULL, *c = NULL;
    CHECK_OK(um_buffer_create(ctx, 60 << 10, &on1, &a));
    CHECK_OK(um_buffer_create(ctx, 60 << 10, &on1, &x));
    CHECK_OK(um_buffer_create(ctx, 60 << 10, &on1, &b));
    CHECK_OK(um_buffer_create(ctx, 60 << 10, &on1, &y));
    CHECK_OK(um_buffer_create(ctx, 120 << 10, NULL, &c));
    um_task t = {.name = "a b -> c", .cpu = note_device_fn, .device = -1, .nbuffers = 3};
    t.buffers[0] = a;
    t.modes[0] = UM_ACCESS_READ;
    t.buffers[1] = b;
    t.modes[1] = UM_ACCESS_READ;
    t.buffers[2] = c;
    t.modes[2] = UM_ACCESS_WRITE_DISCARD;
    um_task_id id = 0;
    atomic_store(&ran_on_device, -1);
    CHECK_OK(um_task_submit(ctx, &t, &id));
    CHECK_OK(um_task_wait(ctx, id));
    CHECK_EQ(atomic_load(&ran_on_device), 1);
    um_buffer *all[] = {a, x, b, y, c};
    for (int i = 0; i < 5; i++)
        CHECK_OK(um_buffer_destroy(all[i]));
    um_shutdown(ctx);
}

static um_context *callback_ctx;
static _Atomic int callback_wait_self, callback_wait_all;
static char callback_self_error[256], callback_all_error[256];

/* Waits on its own task, then on all, from its done callback. */
static void waiting_done(um_task_id id, um_status st, void *user)
{
    (void)st;
    (void)user;
    um_status s = um_task_wait(callback_ctx, id);
    snprintf(callback_self_error, sizeof callback_self_error, "%s", um_last_error());
    atomic_store(&callback_wait_self, (int)s);
    s = um_wait_all(callback_ctx);
    snprintf(callback_all_error, sizeof callback_all_error, "%s", um_last_error());
    atomic_store(&callback_wait_all, (int)s);
}

/* A done callback that waits: um_task_wait on its own task returns the
 * task's status (the callback runs before the outcome is published to
 * other threads, and waited for itself for ever), and um_wait_all fails
 * with UM_ERR_BUSY, naming the problem (it hung: the task counts as
 * unfinished until its callback returns). Also for a task cancelled,
 * whose callback runs on the thread that cancels it. */
static void test_wait_in_callback(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,links=model,sched=eager", &ctx));
    if (!ctx)
        return;
    callback_ctx = ctx;
    static const int results[] = {0, 3};
    for (int k = 0; k < 2; k++) {
        probe p = {.result = results[k]};
        atomic_store(&callback_wait_self, -1);
        atomic_store(&callback_wait_all, -1);
        um_task t = {
            .name = "waits", .cpu = probe_fn, .device = 1, .user = &p, .done = waiting_done};
        um_task_id id;
        CHECK_OK(um_task_submit(ctx, &t, &id));
        watch("um_task_wait on a task whose callback waits", 30);
        um_status st = um_task_wait(ctx, id);
        unwatch();
        CHECK_EQ(st, k ? UM_ERR_TASK : UM_OK);
        CHECK_EQ(atomic_load(&callback_wait_self), (int)st);
        if (k)
            CHECK(strstr(callback_self_error, "returned 3") != NULL);
        CHECK_EQ(atomic_load(&callback_wait_all), UM_ERR_BUSY);
        CHECK(strstr(callback_all_error, "done callback") != NULL);
    }
    _Atomic int gate = 0;
    probe g = {0}, c = {0};
    g.gate = &gate;
    um_task t = {.name = "gate", .cpu = probe_fn, .device = 1, .user = &g};
    um_task_id ig, ic;
    CHECK_OK(um_task_submit(ctx, &t, &ig));
    t = (um_task){
        .name = "cancelled", .cpu = probe_fn, .device = 1, .user = &c, .done = waiting_done};
    CHECK_OK(um_task_submit(ctx, &t, &ic));
    watch("um_task_cancel of a task whose callback waits", 30);
    CHECK_OK(um_task_cancel(ctx, ic));
    unwatch();
    CHECK_EQ(atomic_load(&callback_wait_self), UM_ERR_CANCELLED);
    CHECK_EQ(atomic_load(&callback_wait_all), UM_ERR_BUSY);
    atomic_store(&gate, 1);
    CHECK_STATUS(um_wait_all(ctx), UM_ERR_TASK); /* the first failure, k = 1's */
    um_shutdown(ctx);
}

/* What a done callback waits for (another task), and what it got. */
typedef struct other_wait {
    _Atomic um_task_id id;
    _Atomic int status;
    char error[256];
} other_wait;

/* Waits, from its done callback, for another task. */
static void waiting_for_other_done(um_task_id id, um_status st, void *user)
{
    (void)id;
    (void)st;
    other_wait *o = user;
    um_status s = um_task_wait(callback_ctx, atomic_load(&o->id));
    snprintf(o->error, sizeof o->error, "%s", um_last_error());
    atomic_store(&o->status, (int)s);
}

/* The callbacks of a failed task and of the tasks that fail with it run
 * on one thread, one after the other; a callback that waits for one of
 * the others (the task it failed with, to learn why, or a sibling) gets
 * that task's status: it has finished. It used to wait for ever, as the
 * other's outcome is published only once its own callback, queued on the
 * same thread behind the waiting one, has run. */
static void test_wait_in_callback_for_other(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,links=model,sched=eager", &ctx));
    if (!ctx)
        return;
    callback_ctx = ctx;
    um_buffer *x;
    CHECK_OK(um_buffer_create(ctx, 4096, NULL, &x));
    _Atomic int gate = 0;
    probe a = {.result = 5, .gate = &gate};
    um_task t = {.name = "cause", .cpu = probe_fn, .device = 1, .nbuffers = 1, .user = &a};
    t.buffers[0] = x;
    t.modes[0] = UM_ACCESS_READ_WRITE;
    um_task_id ia, ib, ic;
    CHECK_OK(um_task_submit(ctx, &t, &ia));
    /* b waits for its cause a, c for its sibling b. */
    other_wait wb = {.status = -1}, wc = {.status = -1};
    atomic_store(&wb.id, ia);
    t = (um_task){.name = "reader", .cpu = noop, .device = 1, .nbuffers = 1, .user = &wb,
                  .done = waiting_for_other_done};
    t.buffers[0] = x;
    t.modes[0] = UM_ACCESS_READ;
    CHECK_OK(um_task_submit(ctx, &t, &ib));
    atomic_store(&wc.id, ib);
    t.user = &wc;
    CHECK_OK(um_task_submit(ctx, &t, &ic));
    atomic_store(&gate, 1);
    watch("um_task_wait on a task whose callback waits for the task it failed with", 30);
    CHECK_STATUS(um_task_wait(ctx, ic), UM_ERR_TASK);
    CHECK_STATUS(um_task_wait(ctx, ib), UM_ERR_TASK);
    unwatch();
    CHECK_EQ(atomic_load(&wb.status), UM_ERR_TASK);
    CHECK(strstr(wb.error, "returned 5") != NULL);
    CHECK_EQ(atomic_load(&wc.status), UM_ERR_TASK);
    CHECK(strstr(wc.error, "depends on task") != NULL);
    CHECK_STATUS(um_wait_all(ctx), UM_ERR_TASK);
    CHECK_OK(um_buffer_destroy(x));
    um_shutdown(ctx);
}

/* A task that notes its device and, gate set, waits until *gate != 0;
 * its done callback (callback_waiter_done) waits for task wait_for. */
typedef struct callback_waiter {
    _Atomic int *gate;
    _Atomic int device;           /* where it ran; -1: not yet */
    _Atomic um_task_id wait_for;
    _Atomic int status;           /* what the callback's wait returned; -1: not yet */
    char error[512];
} callback_waiter;

static int callback_waiter_fn(const um_task_exec *e)
{
    callback_waiter *c = e->user;
    atomic_store(&c->device, e->device);
    while (c->gate && !atomic_load(c->gate))
        usleep(1000);
    return 0;
}

static void callback_waiter_done(um_task_id id, um_status st, void *user)
{
    (void)id;
    (void)st;
    callback_waiter *c = user;
    um_status s = um_task_wait(callback_ctx, atomic_load(&c->wait_for));
    snprintf(c->error, sizeof c->error, "%s", um_last_error());
    atomic_store(&c->status, (int)s);
}

/* A task on buffer x (mode m) running callback_waiter_fn with c; its done
 * callback waits when `waits`. Its id. */
static um_task_id submit_waiter(um_context *ctx, const char *name, int device, callback_waiter *c,
                                um_buffer *x, um_access m, bool waits)
{
    um_task t = {.name = name, .cpu = callback_waiter_fn, .device = device, .user = c,
                 .done = waits ? callback_waiter_done : NULL};
    if (x) {
        t.nbuffers = 1;
        t.buffers[0] = x;
        t.modes[0] = m;
    }
    um_task_id id = 0;
    CHECK_OK(um_task_submit(ctx, &t, &id));
    return id;
}

/* Two sim devices (no host tasks) with policy sched, the context the
 * waiters' callbacks use, and *x, a 4 KiB buffer for the tasks; NULL
 * (reported) when the context cannot be made. */
static um_context *callback_context(const char *sched, um_buffer **x)
{
    char conf[128];
    snprintf(conf, sizeof conf, "devices=sim:2x64M,links=model,host_tasks=0,sched=%s", sched);
    um_context *ctx = NULL;
    *x = NULL;
    CHECK_OK(um_init(conf, &ctx));
    if (!ctx)
        return NULL;
    callback_ctx = ctx;
    CHECK_OK(um_buffer_create(ctx, 4096, NULL, x));
    return ctx;
}

/* Waits for every task, then destroys x and ctx. */
static void callback_context_close(um_context *ctx, um_buffer *x)
{
    CHECK_OK(um_wait_all(ctx));
    CHECK_OK(um_buffer_destroy(x));
    um_shutdown(ctx);
}

/* A done callback that waits for a task that reads what its own task
 * wrote, with another device idle, under every policy. The reader becomes
 * ready as the task ends, before the callback runs, and was placed on the
 * worker about to run the callback (eager took it, its queue had just
 * emptied; locality and cost for its data), behind the callback, which
 * then waited for ever. */
static void test_callback_waits_for_dependent(void)
{
    for (int k = 0; k < 4; k++) {
        um_buffer *x;
        um_context *ctx = callback_context(policies[k], &x);
        if (!ctx)
            return;
        _Atomic int gate = 0;
        callback_waiter a = {.gate = &gate, .device = -1, .status = -1};
        callback_waiter d = {.device = -1, .status = -1};
        um_task_id ia = submit_waiter(ctx, "writer", -1, &a, x, UM_ACCESS_WRITE, true);
        atomic_store(&a.wait_for, submit_waiter(ctx, "reader", -1, &d, x, UM_ACCESS_READ, false));
        atomic_store(&gate, 1);
        watch("a done callback waiting for a task that depends on its own", 30);
        CHECK_OK(um_task_wait(ctx, ia));
        unwatch();
        CHECK_EQ(atomic_load(&a.status), UM_OK);
        int ran = atomic_load(&a.device), dep = atomic_load(&d.device);
        CHECK(dep >= 1 && dep != ran);
        callback_context_close(ctx, x);
    }
}

/* A done callback that waits for a task queued on its own worker before
 * the callback began (locality put it there: its input is on that
 * device): the worker's queue goes back to the ready list, and the other
 * device runs it. */
static void test_callback_waits_for_queued(void)
{
    um_buffer *x;
    um_context *ctx = callback_context("locality", &x);
    if (!ctx)
        return;
    callback_waiter w = {.device = -1, .status = -1};
    /* x's only valid copy on device 1. */
    CHECK_OK(um_task_wait(ctx, submit_waiter(ctx, "init", 1, &w, x, UM_ACCESS_WRITE, false)));
    _Atomic int gate = 0;
    callback_waiter a = {.gate = &gate, .device = -1, .status = -1};
    callback_waiter q = {.device = -1, .status = -1};
    um_task_id ia = submit_waiter(ctx, "held", 1, &a, NULL, 0, true);
    while (atomic_load(&a.device) < 0)
        usleep(1000);
    atomic_store(&a.wait_for, submit_waiter(ctx, "queued", -1, &q, x, UM_ACCESS_READ, false));
    atomic_store(&gate, 1);
    watch("a done callback waiting for a task queued behind it", 30);
    CHECK_OK(um_task_wait(ctx, ia));
    unwatch();
    CHECK_EQ(atomic_load(&a.status), UM_OK);
    CHECK_EQ(atomic_load(&q.device), 2);
    callback_context_close(ctx, x);
}

/* A done callback that waits for a task only its own worker can run: one
 * forced onto that device, or one that waits for such a task. It cannot
 * end before the callback returns, so the wait fails with UM_ERR_BUSY,
 * naming why (it hung), and the task runs once the callback returns. */
static void test_callback_waits_for_own_device(void)
{
    um_buffer *x;
    um_context *ctx = callback_context("eager", &x);
    if (!ctx)
        return;
    for (int indirect = 0; indirect < 2; indirect++) {
        _Atomic int gate = 0;
        callback_waiter a = {.gate = &gate, .device = -1, .status = -1};
        callback_waiter f = {.device = -1, .status = -1}, e = {.device = -1, .status = -1};
        um_task_id ia = submit_waiter(ctx, "writer", 1, &a, x, UM_ACCESS_WRITE, true);
        um_task_id forced = submit_waiter(ctx, "forced", 1, &f, x, UM_ACCESS_READ_WRITE, false);
        um_task_id after = submit_waiter(ctx, "after", -1, &e, x, UM_ACCESS_READ, false);
        atomic_store(&a.wait_for, indirect ? after : forced);
        atomic_store(&gate, 1);
        watch("a done callback waiting for a task only its worker can run", 30);
        CHECK_OK(um_task_wait(ctx, ia));
        unwatch();
        CHECK_EQ(atomic_load(&a.status), UM_ERR_BUSY);
        CHECK(strstr(a.error, "only that worker can run") != NULL);
        CHECK_OK(um_task_wait(ctx, after));
        CHECK_EQ(atomic_load(&f.device), 1);
    }
    callback_context_close(ctx, x);
}

/* Done callbacks in a ring: member i's task runs on device i + 1 (forced
 * there), and its callback, once every member's callback has begun, waits
 * for the task ring_targets[i]. */
#define RING_MAX 3
static callback_waiter ring_members[RING_MAX], ring_targets[RING_MAX];
static int ring_size;
static _Atomic int ring_begun; /* callbacks begun */

static void ring_done(um_task_id id, um_status st, void *user)
{
    atomic_fetch_add(&ring_begun, 1);
    while (atomic_load(&ring_begun) < ring_size)
        usleep(1000);
    callback_waiter_done(id, st, user);
}

/* For the watchdog: where each member and its target stand. */
static void ring_dump(void)
{
    fprintf(stderr, "test_task: %d of %d ring callbacks began\n", atomic_load(&ring_begun),
            ring_size);
    for (int i = 0; i < ring_size; i++)
        fprintf(stderr,
                "test_task: member on device %d: its wait returned %d (-1: not yet); its "
                "target ran on device %d (-1: not yet)\n",
                atomic_load(&ring_members[i].device), atomic_load(&ring_members[i].status),
                atomic_load(&ring_targets[i].device));
}

/* Done callbacks on n devices, each waiting for a task that only the next
 * device of the ring can run (forced there): a worker runs nothing until
 * its callback returns, so no wait could end. Each worker's own check
 * accepted every wait, and all hung. Now the callback that waits last (a
 * race) gets UM_ERR_BUSY, naming the cycle; once it returns, its worker
 * runs the task the one before it waits for, and the other waits end in
 * turn. With `open`, the last member waits for a task running on a device
 * outside the ring (until the callbacks wait), so every wait ends and none
 * is refused. */
static void test_callback_wait_cycle(int n, bool open)
{
    char conf[128];
    snprintf(conf, sizeof conf, "devices=sim:%dx64M,links=model,host_tasks=0,sched=eager",
             n + open);
    um_context *ctx = NULL;
    CHECK_OK(um_init(conf, &ctx));
    if (!ctx)
        return;
    callback_ctx = ctx;
    ring_size = n;
    atomic_store(&ring_begun, 0);
    _Atomic int gate = 0, outside_gate = 0;
    um_task_id ids[RING_MAX];
    int target_dev[RING_MAX];
    for (int i = 0; i < n; i++) {
        ring_members[i] = (callback_waiter){.gate = &gate, .device = -1, .status = -1};
        um_task t = {.name = "member",
                     .cpu = callback_waiter_fn,
                     .device = i + 1,
                     .user = &ring_members[i],
                     .done = ring_done};
        CHECK_OK(um_task_submit(ctx, &t, &ids[i]));
    }
    for (int i = 0; i < n; i++) {
        bool outside = open && i == n - 1;
        ring_targets[i] =
            (callback_waiter){.gate = outside ? &outside_gate : NULL, .device = -1, .status = -1};
        target_dev[i] = outside ? n + 1 : (i + 1) % n + 1;
        atomic_store(&ring_members[i].wait_for,
                     submit_waiter(ctx, "target", target_dev[i], &ring_targets[i], NULL, 0, false));
    }
    atomic_store(&watch_dump, ring_dump);
    watch(open ? "done callbacks waiting in a chain that leaves the ring"
               : "done callbacks waiting for one another's devices",
          30);
    atomic_store(&gate, 1);
    if (open) {
        while (atomic_load(&ring_begun) < n)
            usleep(1000);
        usleep(50000); /* the callbacks wait meanwhile */
        atomic_store(&outside_gate, 1);
    }
    for (int i = 0; i < n; i++)
        CHECK_OK(um_task_wait(ctx, ids[i]));
    CHECK_OK(um_wait_all(ctx));
    unwatch();
    int refused = 0;
    for (int i = 0; i < n; i++) {
        int st = atomic_load(&ring_members[i].status);
        if (st == UM_ERR_BUSY) {
            refused++;
            CHECK(strstr(ring_members[i].error, "would form a cycle through callbacks") != NULL);
        } else {
            CHECK_EQ(st, UM_OK);
        }
        CHECK_EQ(atomic_load(&ring_members[i].device), i + 1);
        CHECK_EQ(atomic_load(&ring_targets[i].device), target_dev[i]);
    }
    CHECK_EQ(refused, open ? 0 : 1);
    um_shutdown(ctx);
}

/* A cycle through a callback that has not run yet. Device 2's worker ends
 * task z, which fails, and z's reader x with it; it runs x's callback
 * first, which waits for a task forced onto device 1, and z's callback
 * after it, and only then is z's outcome published. Device 1's worker is
 * in a callback meanwhile that waits for z. The wait for z, a task that
 * had ended, was never checked, and both waits hung; now the one that
 * waits last (a race: device 1's callback waits 50 ms after device 2's
 * begins) fails with UM_ERR_BUSY, naming the cycle, and the other ends. */
static _Atomic int through_reader_began;

static void through_reader_done(um_task_id id, um_status st, void *user)
{
    atomic_store(&through_reader_began, 1);
    callback_waiter_done(id, st, user);
}

static void through_held_done(um_task_id id, um_status st, void *user)
{
    while (!atomic_load(&through_reader_began))
        usleep(1000);
    usleep(50000); /* the reader's callback waits meanwhile */
    callback_waiter_done(id, st, user);
}

static void test_callback_wait_cycle_through_callback(void)
{
    um_buffer *y;
    um_context *ctx = callback_context("eager", &y);
    if (!ctx)
        return;
    atomic_store(&through_reader_began, 0);
    _Atomic int gate = 0;
    callback_waiter held = {.device = -1, .status = -1}, reader = {.device = -1, .status = -1},
                    forced = {.device = -1, .status = -1};
    um_task th = {.name = "held",
                  .cpu = callback_waiter_fn,
                  .device = 1,
                  .user = &held,
                  .done = through_held_done};
    um_task_id ih, iz, ix;
    CHECK_OK(um_task_submit(ctx, &th, &ih));
    while (atomic_load(&held.device) < 0)
        usleep(1000);
    probe zp = {.result = 1, .gate = &gate};
    um_task tz = {.name = "fails", .cpu = probe_fn, .device = 2, .nbuffers = 1, .user = &zp};
    tz.buffers[0] = y;
    tz.modes[0] = UM_ACCESS_WRITE;
    CHECK_OK(um_task_submit(ctx, &tz, &iz));
    um_task tx = {.name = "reader",
                  .cpu = callback_waiter_fn,
                  .device = -1,
                  .nbuffers = 1,
                  .user = &reader,
                  .done = through_reader_done};
    tx.buffers[0] = y;
    tx.modes[0] = UM_ACCESS_READ;
    CHECK_OK(um_task_submit(ctx, &tx, &ix));
    um_task_id iw = submit_waiter(ctx, "forced", 1, &forced, NULL, 0, false);
    atomic_store(&reader.wait_for, iw);
    atomic_store(&held.wait_for, iz);
    watch("done callbacks waiting through a callback not yet run", 30);
    atomic_store(&gate, 1);
    CHECK_OK(um_task_wait(ctx, ih));
    CHECK_STATUS(um_task_wait(ctx, iz), UM_ERR_TASK);
    CHECK_STATUS(um_task_wait(ctx, ix), UM_ERR_TASK);
    CHECK_OK(um_task_wait(ctx, iw));
    unwatch();
    int sh = atomic_load(&held.status), sr = atomic_load(&reader.status);
    CHECK((sh == UM_ERR_BUSY) != (sr == UM_ERR_BUSY));
    CHECK_EQ(sh == UM_ERR_BUSY ? sr : sh, UM_OK);
    CHECK(strstr(sh == UM_ERR_BUSY ? held.error : reader.error, "would form a cycle") != NULL);
    CHECK_EQ(atomic_load(&zp.ran), 1);
    CHECK_EQ(atomic_load(&reader.device), -1); /* failed with z, never run */
    CHECK_EQ(atomic_load(&forced.device), 1);
    CHECK_STATUS(um_wait_all(ctx), UM_ERR_TASK);
    CHECK_OK(um_buffer_destroy(y));
    um_shutdown(ctx);
}

/* A task that submits, from its body, a reader of a buffer whose writer
 * failed: the reader fails at once, and its done callback (`reader`) runs
 * on this task's worker inside the body and waits for this task. */
typedef struct running_waiter {
    um_context *ctx;
    um_buffer *failed;
    _Atomic um_task_id self;
    _Atomic int device;
    _Atomic int submitted; /* the reader's submission's status; -1: not yet */
    callback_waiter reader;
} running_waiter;

static int submits_failing_reader(const um_task_exec *e)
{
    running_waiter *w = e->user;
    atomic_store(&w->device, e->device);
    um_task_id self;
    while (!(self = atomic_load(&w->self)))
        usleep(1000);
    atomic_store(&w->reader.wait_for, self);
    um_task t = {.name = "reader",
                 .cpu = noop,
                 .cuda = noop,
                 .device = -1,
                 .nbuffers = 1,
                 .user = &w->reader,
                 .done = callback_waiter_done};
    t.buffers[0] = w->failed;
    t.modes[0] = UM_ACCESS_READ;
    um_task_id id;
    atomic_store(&w->submitted, (int)um_task_submit(w->ctx, &t, &id));
    return 0;
}

/* A done callback on a device's worker that waits for a task running on
 * that device: the task's body (or, on a GPU, its launch) is on that very
 * thread, below the callback, so the wait fails with UM_ERR_BUSY. The
 * task is not forced there (the other device could run it), so only its
 * running there rules the wait out. On a GPU, a task's callback also runs
 * while the tasks launched after it are in flight, which only that thread
 * lands; the stand-in driver ends work as it is launched, so the test
 * reaches the case through the launch instead. */
static void test_callback_waits_for_running_task(const char *devices, bool gpu)
{
    char conf[128];
    snprintf(conf, sizeof conf, "devices=%s,links=model,host_tasks=0,sched=eager", devices);
    um_context *ctx = NULL;
    CHECK_OK(um_init(conf, &ctx));
    if (!ctx)
        return;
    callback_ctx = ctx;
    um_buffer *y;
    CHECK_OK(um_buffer_create(ctx, 4096, NULL, &y));
    probe p = {.result = 1};
    um_task t = {.name = "fails", .device = -1, .nbuffers = 1, .user = &p};
    *(gpu ? &t.cuda : &t.cpu) = probe_fn;
    t.buffers[0] = y;
    t.modes[0] = UM_ACCESS_WRITE;
    um_task_id id;
    CHECK_OK(um_task_submit(ctx, &t, &id));
    CHECK_STATUS(um_task_wait(ctx, id), UM_ERR_TASK);
    running_waiter w = {.ctx = ctx,
                        .failed = y,
                        .device = -1,
                        .submitted = -1,
                        .reader = {.device = -1, .status = -1}};
    t = (um_task){.name = "running", .device = -1, .user = &w};
    *(gpu ? &t.cuda : &t.cpu) = submits_failing_reader;
    CHECK_OK(um_task_submit(ctx, &t, &id));
    atomic_store(&w.self, id);
    watch("a done callback waiting for the task running on its worker", 30);
    CHECK_OK(um_task_wait(ctx, id));
    unwatch();
    CHECK(atomic_load(&w.device) >= 1);
    CHECK_EQ(atomic_load(&w.submitted), UM_OK);
    CHECK_EQ(atomic_load(&w.reader.status), UM_ERR_BUSY);
    CHECK(strstr(w.reader.error, "or is running there") != NULL);
    CHECK_STATUS(um_wait_all(ctx), UM_ERR_TASK); /* "fails" */
    CHECK_OK(um_buffer_destroy(y));
    um_shutdown(ctx);
}

/* A task whose buffers cannot be had fails with UM_ERR_TASK, its cause
 * (UM_ERR_NOMEM here) in the message, and its done callback gets that
 * status too: it got the acquisition's own status while um_task_wait and
 * um_wait_all said UM_ERR_TASK. */
static void test_callback_status(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:64M,links=model,host_tasks=0", &ctx));
    if (!ctx)
        return;
    CHECK_OK(um_set_memory_limit(ctx, 1, 1u << 20));
    um_buffer *b;
    CHECK_OK(um_buffer_create(ctx, 2u << 20, NULL, &b));
    probe p = {.done_status = -1};
    um_task t = {.name = "too_big", .cpu = probe_fn, .device = -1, .nbuffers = 1, .user = &p,
                 .done = probe_done};
    t.buffers[0] = b;
    t.modes[0] = UM_ACCESS_READ;
    um_task_id id;
    CHECK_OK(um_task_submit(ctx, &t, &id));
    CHECK_STATUS(um_task_wait(ctx, id), UM_ERR_TASK);
    CHECK_ERROR_MENTIONS("could not be had", "UM_ERR_NOMEM", NULL);
    CHECK_EQ(atomic_load(&p.ran), 0);
    CHECK_EQ(atomic_load(&p.done_calls), 1);
    CHECK_EQ(atomic_load(&p.done_status), UM_ERR_TASK);
    CHECK_STATUS(um_wait_all(ctx), UM_ERR_TASK);
    CHECK_OK(um_buffer_destroy(b));
    um_shutdown(ctx);
}

/* A GPU worker that cannot make its GPU's context current refuses its
 * tasks, naming why, rather than run task code against no context (or
 * the first GPU's). On the stand-in driver only, which fails the call:
 * every context switch fails while the runtime starts, this thread keeping
 * GPU 0's context current so that it needs none. */
static void test_gpu_bind_failure(void)
{
    if (!getenv("UM_TEST_FAKE_CUDA"))
        return;
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=cuda:0,links=model", &ctx));
    if (!ctx)
        return;
    /* The driver um_init loaded: the stand-in has these entry points. */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    int (*fail_call)(const char *, unsigned, unsigned, int) = NULL;
    void (*fail_clear)(void) = NULL;
    int (*retain)(void **, int) = NULL, (*release)(int) = NULL;
    int (*set_current)(void *) = NULL;
    if (lib) {
        *(void **)&fail_call = dlsym(lib, "fake_cuda_fail");
        *(void **)&fail_clear = dlsym(lib, "fake_cuda_fail_clear");
        *(void **)&retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
        *(void **)&release = dlsym(lib, "cuDevicePrimaryCtxRelease_v2");
        *(void **)&set_current = dlsym(lib, "cuCtxSetCurrent");
    }
    CHECK(fail_call && fail_clear && retain && release && set_current);
    if (!fail_call || !fail_clear || !retain || !release || !set_current) {
        if (lib)
            dlclose(lib);
        um_shutdown(ctx);
        return;
    }
    um_buffer *b; /* the transfer engine is made with the first buffer */
    CHECK_OK(um_buffer_create(ctx, 4096, NULL, &b));
    void *gpu0 = NULL;
    CHECK_EQ(retain(&gpu0, 0), 0);
    CHECK_EQ(set_current(gpu0), 0);
    CHECK_EQ(fail_call("cuCtxSetCurrent", 0, 1000, 201 /* CUDA_ERROR_INVALID_CONTEXT */), 0);
    probe p = {0};
    um_task t = {.name = "gpu", .cuda = probe_fn, .device = 1, .user = &p};
    um_task_id id;
    CHECK_OK(um_task_submit(ctx, &t, &id));
    CHECK_STATUS(um_task_wait(ctx, id), UM_ERR_TASK);
    CHECK_ERROR_MENTIONS("was not run", "cannot make the device's context current",
                         "cuCtxSetCurrent");
    fail_clear();
    CHECK_EQ(atomic_load(&p.ran), 0);
    CHECK_STATUS(um_wait_all(ctx), UM_ERR_TASK);
    CHECK_OK(um_buffer_destroy(b));
    um_shutdown(ctx);
    (void)set_current(NULL);
    (void)release(0);
    dlclose(lib);
    printf("test_task: a GPU worker that cannot make its context current refuses its tasks\n");
}

int main(void)
{
    uint64_t seed = harness_seed("test_task");
    pthread_t wd;
    CHECK_EQ(pthread_create(&wd, NULL, watchdog_main, NULL), 0);
    pthread_detach(wd);
    test_prefetch_keeps_buffer();
    test_announcements_withdrawn();
    test_failure_records();
    test_finished_tasks_forgotten();
    test_name_copied();
    test_prefetch_after_acquire();
    test_prefetch_into_cached_memory();
    test_prefetch_never_evicts();
    test_placed_again_where_memory_is_held();
    test_own_replicas_fragment();
    test_wait_in_callback();
    test_wait_in_callback_for_other();
    test_callback_waits_for_dependent();
    test_callback_waits_for_queued();
    test_callback_waits_for_own_device();
    test_callback_wait_cycle(2, false);
    test_callback_wait_cycle(3, false);
    test_callback_wait_cycle(2, true);
    test_callback_wait_cycle_through_callback();
    test_callback_waits_for_running_task("sim:2x64M", false);
    if (getenv("UM_TEST_FAKE_CUDA"))
        test_callback_waits_for_running_task("cuda", true);
    test_callback_status();
    test_gpu_bind_failure();
    test_cancel_frees_queue();
    test_runtime_start_failure();
    test_submit_out_of_memory();
    test_policies_respect_limits();
    test_limits_count_pages();
    test_cost_prices_eviction();
    test_cost_ignores_cached();
    test_history_full();
    test_foreign_buffer();
    test_raised_limit_places();
    test_priority_order();
    test_nominal_rates();
    test_bad_input();
    test_failure_and_cancel();
    test_device_failure();
    test_long_chain_failure();
    test_policies();
    test_no_host_tasks();
    for (int p = 0; p < 4; p++) {
        /* Plenty of room, then devices of 128 KiB (a quarter of the data;
         * GPU pages are 2 MiB, so there 4 MiB). */
        bool gpus = getenv("UM_TEST_TASK_DEVICES") && strstr(getenv("UM_TEST_TASK_DEVICES"), "cuda");
        test_random_graphs(seed, policies[p], 64u << 20, 128, 600);
        test_random_graphs(seed, policies[p], gpus ? 4u << 20 : 128u << 10, 128, 600);
    }
    return harness_finish("test_task");
}
