/* Tests of virtual time (src/base/vtime.c, src/backend/vdev.c) and of the
 * task runtime run in it (option virtual_time, src/vsim/runtime.c):
 * threads that sleep, signal and hand locks on see exact virtual times;
 * tasks and copies take exactly their modelled times, copies sharing a
 * link split it; random chains of tasks match a reference sum; the
 * runtime engine agrees with the simulator's model on one GPU; bad
 * configurations are named. None of it may need the watchdog. */
#include "harness.h"
#include "backend/vdev.h"
#include "base/options.h"
#include "base/vtime.h"
#include "core/core.h"
#include "vsim/sim.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MS 1000000ull

static void check_no_forced(void)
{
    um__vt_stats st;
    um__vt_stats_get(&st);
    CHECK_EQ(st.forced, 0);
    CHECK_EQ(st.stalls, 0);
    CHECK_EQ(st.early_moves, 0);
}

/* ------------------------------------------------------ the clock alone */

typedef struct relay {
    pthread_mutex_t m;
    um__cond turn;
    int next;             /* whose turn it is */
    uint64_t seen[8];     /* the clock each thread read when it ran */
} relay;

typedef struct runner_arg {
    relay *r;
    int id;
} runner_arg;

/* Thread i waits for its turn, sleeps (i + 1) ms of virtual time, then
 * passes the turn on: the clock reads 1, 3, 6, 10 ... ms at the ends. */
static void *runner(void *arg)
{
    runner_arg *a = arg;
    relay *r = a->r;
    um__vt_mutex_lock(&r->m);
    while (r->next != a->id)
        um__cond_wait(&r->turn, &r->m);
    um__vt_mutex_unlock(&r->m);
    um__sleep_until_ns(um__now_ns() + (uint64_t)(a->id + 1) * MS);
    um__vt_mutex_lock(&r->m);
    r->seen[a->id] = um__now_ns();
    r->next++;
    um__cond_broadcast(&r->turn);
    um__vt_mutex_unlock(&r->m);
    um__vt_exit();
    return NULL;
}

static void test_relay(void)
{
    CHECK_OK(um__vt_start());
    CHECK_STATUS(um__vt_start(), UM_ERR_BUSY);
    CHECK_ERROR_MENTIONS("virtual_time", "one at a time", NULL);
    relay r = {.next = 0};
    pthread_mutex_init(&r.m, NULL);
    um__cond_init(&r.turn);
    enum { N = 6 };
    pthread_t t[N];
    runner_arg a[N];
    for (int i = N - 1; i >= 0; i--) {
        a[i] = (runner_arg){&r, i};
        um__vt_spawn();
        CHECK_EQ(pthread_create(&t[i], NULL, runner, &a[i]), 0);
    }
    um__vt_mutex_lock(&r.m);
    while (r.next < N)
        um__cond_wait(&r.turn, &r.m);
    um__vt_mutex_unlock(&r.m);
    for (int i = 0; i < N; i++)
        CHECK_EQ(um__vt_join(t[i], NULL), 0);
    uint64_t end = 0;
    for (int i = 0; i < N; i++) {
        end += (uint64_t)(i + 1) * MS;
        CHECK_EQ(r.seen[i], end);
    }
    CHECK_EQ(um__now_ns(), end);
    check_no_forced();
    um__vt_stop();
    um__cond_destroy(&r.turn);
    pthread_mutex_destroy(&r.m);
    /* Off again: the real clock, far from the virtual one's 21 ms. */
    CHECK(!um__vt_on());
}

/* Threads that sleep side by side end at their own deadlines, and a lock
 * held across a virtual sleep does not stop the clock for its waiters. */
typedef struct holder_arg {
    pthread_mutex_t *m;
    uint64_t hold_ns, got_at;
} holder_arg;

static void *lock_holder(void *arg)
{
    holder_arg *h = arg;
    um__vt_mutex_lock(h->m);
    h->got_at = um__now_ns();
    um__sleep_until_ns(um__now_ns() + h->hold_ns);
    um__vt_mutex_unlock(h->m);
    um__vt_exit();
    return NULL;
}

static void test_lock_across_sleep(void)
{
    CHECK_OK(um__vt_start());
    pthread_mutex_t m;
    pthread_mutex_init(&m, NULL);
    enum { N = 4 };
    holder_arg h[N];
    pthread_t t[N];
    for (int i = 0; i < N; i++) {
        h[i] = (holder_arg){&m, (uint64_t)(i + 1) * 2 * MS, 0};
        um__vt_spawn();
        CHECK_EQ(pthread_create(&t[i], NULL, lock_holder, &h[i]), 0);
    }
    for (int i = 0; i < N; i++)
        CHECK_EQ(um__vt_join(t[i], NULL), 0);
    /* One at a time, in whatever order they got the lock: the clock ends
     * at the sum of the holds, and each got it when the one before let go. */
    uint64_t total = 0;
    for (int i = 0; i < N; i++)
        total += h[i].hold_ns;
    CHECK_EQ(um__now_ns(), total);
    for (int i = 0; i < N; i++) {
        bool after_another = h[i].got_at == 0;
        for (int j = 0; j < N; j++)
            if (j != i && h[j].got_at + h[j].hold_ns == h[i].got_at)
                after_another = true;
        CHECK(after_another);
    }
    check_no_forced();
    um__vt_stop();
    pthread_mutex_destroy(&m);
}

/* A device model of its own: an event every millisecond, counted. */
static uint64_t ticks, tick_limit;

static uint64_t tick_next(void *self)
{
    UM_UNUSED(self);
    return ticks < tick_limit ? (ticks + 1) * MS : UINT64_MAX;
}

static void tick_advance(void *self, uint64_t t)
{
    UM_UNUSED(self);
    while (ticks < tick_limit && (ticks + 1) * MS <= t)
        ticks++;
}

typedef struct tick_waiter {
    uint64_t until, seen_at, wakes;
} tick_waiter;

/* Waits on the model until it has counted `until` ticks. */
static void *tick_wait(void *arg)
{
    tick_waiter *w = arg;
    um__vt_lock();
    while (ticks < w->until) {
        um__vt_wait_model_locked();
        w->wakes++;
    }
    w->seen_at = um__vt_now();
    um__vt_unlock();
    um__vt_exit();
    return NULL;
}

/* Every thread waiting on the model when it changes is woken by that
 * change, whatever the others do: waiters that go back to waiting at once
 * must not take a wake-up meant for another (which left a task worker
 * asleep for tens of virtual milliseconds after its kernel had ended). */
static void test_model_wakes_everyone(void)
{
    CHECK_OK(um__vt_start());
    ticks = 0;
    tick_limit = 400;
    um__vt_set_model(&(um__vt_model){tick_next, tick_advance, NULL});
    enum { N = 6 };
    tick_waiter w[N];
    pthread_t t[N];
    for (int i = 0; i < N; i++) {
        /* Two wait for the end; the others for points along the way. */
        w[i] = (tick_waiter){i < 2 ? tick_limit : 50 + 50 * (uint64_t)i, 0, 0};
        um__vt_spawn();
        CHECK_EQ(pthread_create(&t[i], NULL, tick_wait, &w[i]), 0);
    }
    for (int i = 0; i < N; i++)
        CHECK_EQ(um__vt_join(t[i], NULL), 0);
    for (int i = 0; i < N; i++) {
        CHECK_EQ(w[i].seen_at, w[i].until * MS);
        CHECK_EQ(w[i].wakes, w[i].until); /* once per tick, none missed */
    }
    check_no_forced();
    um__vt_set_model(NULL);
    um__vt_stop();
}

/* ----------------------------------------------- the runtime in it */

static int no_compute(const um_task_exec *e)
{
    (void)e;
    return 0;
}

static um_task_id submit(um_context *ctx, um_buffer *b, int dev, double flops)
{
    um_task t = {.name = "work", .cpu = no_compute, .nbuffers = 1, .flops = flops,
                 .device = dev};
    t.buffers[0] = b;
    t.modes[0] = UM_ACCESS_READ_WRITE;
    um_task_id id = 0;
    CHECK_OK(um_task_submit(ctx, &t, &id));
    return id;
}

/* A buffer of `size` on the host; the clock's time once it exists (the
 * transfer engine's link timing runs at the first buffer). */
static um_buffer *host_buffer(um_context *ctx, size_t size, uint64_t *t0)
{
    um_buffer *b = NULL;
    CHECK_OK(um_buffer_create(ctx, size, &(um_buffer_opts){.device = 0}, &b));
    *t0 = um__now_ns();
    return b;
}

/* 1 GiB/s links, 100 GFLOP/s devices: a task of 100 GFLOP on a 1 GiB
 * buffer that starts on the host takes 1 s to arrive and 1 s to run; the
 * second task on the same device finds it there; reading it back is 1 s. */
static void test_exact_times(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:2x4G,virtual_time=1,sim_link_bandwidth=1G,sim_gflops=100,"
                     "host_capacity=8G",
                     &ctx));
    if (!ctx)
        return;
    uint64_t t0;
    um_buffer *b = host_buffer(ctx, 1u << 30, &t0);
    submit(ctx, b, 1, 100e9);
    submit(ctx, b, 1, 100e9);
    CHECK_OK(um_wait_all(ctx));
    CHECK_EQ(um__now_ns() - t0, 3000 * MS);
    void *p;
    CHECK_OK(um_buffer_acquire(b, 0, UM_ACCESS_READ, NULL, &p));
    CHECK_OK(um_buffer_release(b, 0, NULL));
    CHECK_EQ(um__now_ns() - t0, 4000 * MS);
    um_task_stats ts;
    CHECK_OK(um_task_stats_get(ctx, 1, &ts));
    CHECK_EQ(ts.tasks, 2);
    CHECK_EQ(ts.busy_ns, 2000 * MS);
    um_link_stats ls;
    CHECK_OK(um_link_stats_get(ctx, 0, 1, &ls));
    CHECK_EQ(ls.bytes, 1u << 30);
    CHECK_OK(um_link_stats_get(ctx, 1, 0, &ls));
    CHECK_EQ(ls.bytes, 1u << 30);
    check_no_forced();
    CHECK_OK(um_buffer_destroy(b));
    um_shutdown(ctx);
}

/* Six kernels on six streams of one device read one buffer: releasing
 * them never makes the host wait (the buffer layer merges the readers'
 * fences on a stream when it has more than it keeps), and a write after
 * them still waits for every one. */
static void test_many_readers(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:2x4G,virtual_time=1,sim_link_bandwidth=1G,host_capacity=8G",
                     &ctx));
    if (!ctx)
        return;
    uint64_t t0;
    um_buffer *b = host_buffer(ctx, 1u << 20, &t0);
    enum { N = 6 };
    um_stream s[N + 1];
    for (int i = 0; i <= N; i++)
        CHECK_OK(um_stream_create(ctx, 1, &s[i]));
    um__backend *be = ctx->devices[1].backend;
    for (int i = 0; i < N; i++) {
        void *p;
        CHECK_OK(um_buffer_acquire(b, 1, UM_ACCESS_READ, s[i], &p));
        CHECK_OK(um__sim_stream_kernel(be, s[i]->ref.bstream, 1000 * MS, 500 * MS));
        CHECK_OK(um_buffer_release(b, 1, s[i]));
    }
    /* The host queued it all at once: no kernel had ended. */
    CHECK_EQ(um__now_ns(), t0);
    void *p;
    CHECK_OK(um_buffer_acquire(b, 1, UM_ACCESS_WRITE, s[N], &p));
    CHECK_OK(um_buffer_release(b, 1, s[N]));
    CHECK_OK(um_stream_synchronize(ctx, s[N]));
    /* The copy in (1 MiB at 1 GiB/s, about 1 ms), then the six kernels
     * one after another (the first alone, 1 s; the five behind it packed,
     * 0.5 s each), then the write. */
    CHECK(um__now_ns() - t0 >= 3500 * MS + MS / 2);
    CHECK(um__now_ns() - t0 < 3500 * MS + 2 * MS);
    /* On an idle device a kernel takes its time alone. */
    uint64_t t1 = um__now_ns();
    CHECK_OK(um__sim_stream_kernel(be, s[0]->ref.bstream, 1000 * MS, 500 * MS));
    CHECK_OK(um_stream_synchronize(ctx, s[0]));
    CHECK_EQ(um__now_ns() - t1, 1000 * MS);
    check_no_forced();
    for (int i = 0; i <= N; i++)
        CHECK_OK(um_stream_destroy(ctx, s[i]));
    CHECK_OK(um_buffer_destroy(b));
    um_shutdown(ctx);
}

static void note_end(um_task_id id, um_status st, void *user)
{
    (void)id;
    (void)st;
    *(uint64_t *)user = um__now_ns();
}

/* On a device driven as a GPU (tasks launched ahead on streams), a task
 * launched second that ends first is seen at its end: A waits 1 s for its
 * 1 GiB input and runs 1 s, B (already there) runs 0.1 s at once, and C on
 * the other device, which reads what B wrote, follows B, not A. */
static void test_lands_in_any_order(void)
{
    um_context *ctx = NULL;
    /* Eager: the cost policy would hold B back until the device had
     * timed one such task (its calibration). */
    CHECK_OK(um_init("devices=sim:2x4G,virtual_time=1,sim_link_bandwidth=1G,sim_gflops=100,"
                     "host_capacity=8G,sched=eager",
                     &ctx));
    if (!ctx)
        return;
    for (int d = 1; d <= 2; d++)
        ctx->devices[d].backend->launches_ahead = true;
    um_buffer *a = NULL, *b = NULL;
    CHECK_OK(um_buffer_create(ctx, 1u << 30, &(um_buffer_opts){.device = 0}, &a));
    CHECK_OK(um_buffer_create(ctx, 1u << 20, &(um_buffer_opts){.device = 1}, &b));
    void *p;
    CHECK_OK(um_buffer_acquire(b, 1, UM_ACCESS_WRITE, NULL, &p));
    CHECK_OK(um_buffer_release(b, 1, NULL));
    uint64_t t0 = um__now_ns(), end[3] = {0, 0, 0};
    um_buffer *bufs[3] = {a, b, b};
    double flops[3] = {100e9, 10e9, 10e9};
    int devs[3] = {1, 1, 2};
    for (int i = 0; i < 3; i++) {
        um_task t = {.name = "work", .cpu = no_compute, .nbuffers = 1, .flops = flops[i],
                     .device = devs[i], .done = note_end, .user = &end[i]};
        t.buffers[0] = bufs[i];
        t.modes[0] = UM_ACCESS_READ_WRITE;
        um_task_id id;
        CHECK_OK(um_task_submit(ctx, &t, &id));
    }
    CHECK_OK(um_wait_all(ctx));
    CHECK_EQ(end[0] - t0, 2000 * MS);
    CHECK_EQ(end[1] - t0, 100 * MS);
    /* B's 1 MiB to the other device (about 1 ms each way through the
     * host), then 0.1 s. */
    CHECK(end[2] - t0 > 200 * MS && end[2] - t0 < 205 * MS);
    check_no_forced();
    CHECK_OK(um_buffer_destroy(a));
    CHECK_OK(um_buffer_destroy(b));
    um_shutdown(ctx);
}

/* Two devices behind one shared 1 GiB/s host link (resource 0): their two
 * 1 GiB inputs arrive together after 2 s, not one after 1 s; with a link
 * each, both after 1 s. */
static void test_shared_link(void)
{
    for (int shared = 0; shared < 2; shared++) {
        um_context *ctx = NULL;
        CHECK_OK(um_init("devices=sim:2x4G,virtual_time=1,sim_gflops=100,host_capacity=8G,"
                         "links=model",
                         &ctx));
        if (!ctx)
            return;
        double cap[3] = {1073741824.0, 1073741824.0, 1073741824.0};
        um__vdev_route route[9] = {{0}};
        /* host -> dev1, host -> dev2; the way back uses resource 2. */
        route[0 * 3 + 1] = (um__vdev_route){1, {0}, 0};
        route[0 * 3 + 2] = (um__vdev_route){1, {shared ? 0 : 1}, 0};
        route[1 * 3 + 0] = (um__vdev_route){1, {2}, 0};
        route[2 * 3 + 0] = (um__vdev_route){1, {2}, 0};
        um__vdev_links l = {3, 3, cap, route};
        CHECK_OK(um__vdev_set_links(&l));
        uint64_t t0;
        um_buffer *a = host_buffer(ctx, 1u << 30, &t0), *b = NULL;
        CHECK_OK(um_buffer_create(ctx, 1u << 30, &(um_buffer_opts){.device = 0}, &b));
        submit(ctx, a, 1, 100e9);
        submit(ctx, b, 2, 100e9);
        CHECK_OK(um_wait_all(ctx));
        CHECK_EQ(um__now_ns() - t0, (shared ? 3000 : 2000) * MS);
        um_task_stats ts;
        CHECK_OK(um_task_stats_get(ctx, 2, &ts));
        CHECK_EQ(ts.waited_ns, (shared ? 2000 : 1000) * MS);
        check_no_forced();
        CHECK_OK(um_buffer_destroy(a));
        CHECK_OK(um_buffer_destroy(b));
        um_shutdown(ctx);
    }
}

/* Random chains on one device: the first task brings the buffer over
 * (size / bandwidth), then the tasks' times add up (flops / rate). */
static void test_random_chains(uint64_t seed)
{
    uint64_t rng = seed ^ 0x7717;
    for (int round = 0; round < 8; round++) {
        um_context *ctx = NULL;
        unsigned gflops = 1 + (unsigned)(harness_rand(&rng) % 500);
        unsigned mib_s = 64 + (unsigned)(harness_rand(&rng) % 4096);
        char conf[256];
        snprintf(conf, sizeof conf,
                 "devices=sim:3x1G,virtual_time=1,sim_link_bandwidth=%uM,sim_gflops=%u,"
                 "host_capacity=2G",
                 mib_s, gflops);
        CHECK_OK(um_init(conf, &ctx));
        if (!ctx)
            return;
        int dev = 1 + (int)(harness_rand(&rng) % 3);
        size_t size = (size_t)(1 + harness_rand(&rng) % 64) << 20;
        uint64_t t0;
        um_buffer *b = host_buffer(ctx, size, &t0);
        double want = (double)size / ((double)mib_s * 1048576.0) * 1e9;
        int n = 1 + (int)(harness_rand(&rng) % 20);
        for (int i = 0; i < n; i++) {
            double flops = (double)(1 + harness_rand(&rng) % 1000000) * 1e3;
            submit(ctx, b, dev, flops);
            want += (double)(uint64_t)(flops / (double)gflops);
        }
        CHECK_OK(um_wait_all(ctx));
        double got = (double)(um__now_ns() - t0);
        /* Each copy and kernel rounds to a whole ns. */
        CHECK_NEAR(got, want, 2.0 * (n + 2));
        check_no_forced();
        CHECK_OK(um_buffer_destroy(b));
        um_shutdown(ctx);
    }
}

/* One GPU: the runtime and the simulator's model of it agree on a GEMM
 * (compute bound) to within 3%, with every task run and nothing forced. */
static void test_engines_agree(void)
{
    um__vs_machine *m = malloc(sizeof *m);
    um__vs_result *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    CHECK_OK(um__vs_machine_load("h200x1", m));
    um__vs_dag d;
    CHECK_EQ(um__vs_dag_gemm(16384, 4096, &d), 0);
    uint64_t forced = 1;
    CHECK_OK(um__vs_run_runtime(m, &d, UM_SCHED_COST, a, &forced));
    CHECK_EQ(forced, 0);
    CHECK_OK(um__vs_simulate(m, &d, UM_SCHED_COST, b));
    CHECK_EQ(a->tasks_on[1], d.ntasks);
    CHECK_NEAR(a->makespan_s / b->makespan_s, 1.0, 0.03);
    CHECK(a->makespan_s >= a->lower_bound_s);
    CHECK_NEAR(a->lower_bound_s, b->lower_bound_s, 1e-12);
    /* A Cholesky on eight: every task runs, on the GPUs only. */
    um__vs_dag c;
    CHECK_OK(um__vs_machine_load("h200x8", m));
    CHECK_EQ(um__vs_dag_cholesky(32768, 4096, &c), 0);
    CHECK_OK(um__vs_run_runtime(m, &c, UM_SCHED_COST, a, &forced));
    CHECK_EQ(forced, 0);
    uint64_t ran = 0;
    for (int dev = 1; dev < m->ndev; dev++)
        ran += a->tasks_on[dev];
    CHECK_EQ(ran, c.ntasks);
    CHECK_EQ(a->tasks_on[0], 0);
    CHECK(a->makespan_s >= a->lower_bound_s);
    CHECK(a->home_s >= a->makespan_s);
    um__vs_dag_free(&c);
    um__vs_dag_free(&d);
    free(a);
    free(b);
    free(m);
}

/* A GEMM that evicts all the time (three devices of 12 MiB each for 108
 * MiB of tiles) takes and hands on the pool's and the buffers' locks in
 * every pattern; none of it may leave a thread counted running while it
 * waits. Before the pool's lock counted its waiter before letting go, the
 * clock was moved early or by force in most such runs. */
static void test_evicting_runs_clean(void)
{
    static const char desc[] =
        "machine name=evicting\n"
        "device name=host kind=host memory=64G\n"
        "device name=sim count=3 kind=sim memory=1G granularity=2M model=m\n"
        "link from=host to=sim bandwidth=1G latency=0us\n"
        "link from=sim to=host bandwidth=1G latency=0us\n"
        "compute model=m kernel=gemm gflops=5\n";
    um__vs_machine *m = malloc(sizeof *m);
    um__vs_result *a = malloc(sizeof *a);
    CHECK_OK(um__vs_machine_parse(desc, "test", m));
    for (int dev = 1; dev < m->ndev; dev++)
        m->dev[dev].memory = 12u << 20;
    um__vs_dag d;
    CHECK_EQ(um__vs_dag_gemm(3072, 512, &d), 0);
    for (int round = 0; round < 3; round++) {
        uint64_t forced = 1;
        CHECK_OK(um__vs_run_runtime(m, &d, UM_SCHED_COST, a, &forced));
        CHECK_EQ(forced, 0);
        CHECK(a->evictions > 0);
        CHECK(a->makespan_s >= a->lower_bound_s);
    }
    um__vs_dag_free(&d);
    free(a);
    free(m);
}

static void test_bad_config(void)
{
    um_context *ctx = NULL;
    CHECK_STATUS(um_init("devices=cuda,virtual_time=1", &ctx), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("virtual_time", "sim devices", NULL);
    CHECK(!um__vt_on());
    /* One virtual context at a time. */
    CHECK_OK(um_init("devices=sim:1G,virtual_time=1,host_capacity=1G", &ctx));
    um_context *other = NULL;
    CHECK_STATUS(um_init("devices=sim:1G,virtual_time=1,host_capacity=1G", &other),
                 UM_ERR_BUSY);
    CHECK_ERROR_MENTIONS("virtual_time", "one at a time", NULL);
    um_shutdown(ctx);
    CHECK(!um__vt_on());
    /* A modelled kernel outside virtual time is refused, naming why. */
    CHECK_OK(um_init("devices=sim:1G,host_capacity=1G", &ctx));
    CHECK_STATUS(um__sim_stream_kernel(ctx->devices[1].backend, NULL, 10, 10), UM_ERR_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("virtual time", NULL, NULL);
    um_shutdown(ctx);
}

static void *sleep_one_second(void *arg)
{
    (void)arg;
    um__sleep_until_ns(1000 * MS);
    um__vt_exit();
    return NULL;
}

static void *exit_at_once(void *arg)
{
    (void)arg;
    um__vt_exit();
    return NULL;
}

/* Joining a thread that exited before the join does not block: the clock
 * stays put while the joiner could run. The join used to block first, and
 * with every other thread asleep the clock jumped to the sleeper's second
 * (the run layer joins its workers one after another). */
static void test_join_after_exit(void)
{
    CHECK_OK(um__vt_start());
    pthread_t sleeper, quick;
    um__vt_spawn();
    CHECK_EQ(pthread_create(&sleeper, NULL, sleep_one_second, NULL), 0);
    um__vt_spawn();
    CHECK_EQ(pthread_create(&quick, NULL, exit_at_once, NULL), 0);
    usleep(100000); /* real time: the one sleeps, the other has exited */
    CHECK_EQ(um__vt_now(), 0);
    CHECK_EQ(um__vt_join(quick, NULL), 0);
    CHECK_EQ(um__vt_now(), 0);
    CHECK_EQ(um__vt_join(sleeper, NULL), 0);
    CHECK_EQ(um__vt_now(), 1000 * MS);
    check_no_forced();
    um__vt_stop();
}

/* A wait on stream B queued on A behind A's kernel outlives B: B's
 * destroy waits for B's 20 ms, then frees it, and A reaches the wait at
 * 30 ms. The wait read B after it was freed (AddressSanitizer). */
static void test_wait_outlives_stream(void)
{
    um__backend *be = NULL;
    CHECK_OK(um__vt_start());
    CHECK_OK(um__sim_backend_create("sim0", 1ull << 30, 2ull << 20, 0, &be));
    if (!be) {
        um__vt_stop();
        return;
    }
    CHECK_OK(um__vdev_start(&be, 1));
    um__bstream *a = NULL, *b = NULL;
    CHECK_OK(be->ops->stream_create(be, &a));
    CHECK_OK(be->ops->stream_create(be, &b));
    CHECK_OK(um__sim_stream_kernel(be, b, 20 * MS, 20 * MS));
    CHECK_OK(um__sim_stream_kernel(be, a, 30 * MS, 30 * MS));
    um__bevent *e = NULL;
    CHECK_OK(be->ops->event_record(be, b, &e));
    CHECK_OK(be->ops->stream_wait(be, a, be, e));
    be->ops->event_destroy(be, e);
    CHECK_OK(be->ops->stream_destroy(be, b));
    CHECK_EQ(um__vt_now(), 20 * MS);
    CHECK_OK(be->ops->stream_sync(be, a));
    CHECK_EQ(um__vt_now(), 50 * MS); /* A's kernel ran behind B's (packed: 30 ms) */
    CHECK_OK(be->ops->stream_destroy(be, a));
    um__vdev_stop();
    um__backend_destroy(be);
    um__vt_stop();
}

typedef struct late_alloc {
    um_context *ctx;
    uint64_t got_at; /* when its allocation returned */
    um_status st;
} late_alloc;

/* Arrives 10 ms in and allocates on device 1 (whose allocator's lock the
 * main thread holds then). */
static void *allocate_late(void *arg)
{
    late_alloc *l = arg;
    um__sleep_until_ns(um__now_ns() + 10 * MS);
    void *p = NULL;
    l->st = um_malloc(l->ctx, 1, 1u << 20, NULL, &p);
    l->got_at = um__now_ns();
    if (l->st == UM_OK)
        l->st = um_free(l->ctx, p, NULL);
    um__vt_exit();
    return NULL;
}

/* The baseline allocators' lock is held while a free waits for its
 * stream's work (as cudaFree waits), in virtual time a wait for the
 * model. A thread blocked on that lock counted as running, so the clock
 * could not move until the stall watchdog moved it (an audit's stress
 * program with allocator=bufcache: 19 forced moves and 331 operations in
 * 10 s, against 8,919 and none once the lock was the clock's). Now the
 * second thread waits, not counted, for the free's 100 ms. */
static void test_baseline_lock_in_virtual_time(void)
{
    static const char *const confs[] = {
        "allocator=direct,devices=sim:1G,virtual_time=1",
        "allocator=bufcache,cache_limit=0,devices=sim:1G,virtual_time=1",
    };
    for (int i = 0; i < 2; i++) {
        um_context *ctx = NULL;
        CHECK_OK(um_init(confs[i], &ctx));
        if (!ctx)
            continue;
        um_stream s = NULL;
        void *p = NULL;
        CHECK_OK(um_stream_create(ctx, 1, &s));
        CHECK_OK(um_malloc(ctx, 1, 1u << 20, s, &p));
        uint64_t t0 = um__now_ns();
        CHECK_OK(um__sim_stream_kernel(ctx->devices[1].backend, s->ref.bstream, 100 * MS,
                                       100 * MS));
        late_alloc l = {ctx, 0, UM_ERR_INTERNAL};
        pthread_t t;
        um__vt_spawn();
        CHECK_EQ(pthread_create(&t, NULL, allocate_late, &l), 0);
        CHECK_OK(um_free(ctx, p, s));
        CHECK_EQ(um__now_ns() - t0, 100 * MS);
        CHECK_EQ(um__vt_join(t, NULL), 0);
        CHECK_OK(l.st);
        CHECK_EQ(l.got_at - t0, 100 * MS);
        check_no_forced();
        CHECK_OK(um_stream_destroy(ctx, s));
        um_shutdown(ctx);
    }
}

/* Virtual time with the fault option: the devices are wrapped, and the
 * model found them through the wrappers only as the memfd backends they
 * wrap (it wrote its device index past the wrapper's end before). */
static void test_faults_in_virtual_time(void)
{
    um_context *ctx = NULL;
    CHECK_OK(um_init("devices=sim:2x1G,virtual_time=1,host_capacity=1G,sim_link_bandwidth=1G,"
                     "fault=reserve~0", &ctx));
    if (!ctx)
        return;
    uint64_t t0;
    um_buffer *b = host_buffer(ctx, 1u << 20, &t0);
    um_stream s;
    CHECK_OK(um_stream_create(ctx, 2, &s));
    void *p;
    CHECK_OK(um_buffer_acquire(b, 2, UM_ACCESS_READ, s, &p));
    CHECK_OK(um__sim_stream_kernel(ctx->devices[2].backend, s->ref.bstream, 5 * MS, 5 * MS));
    CHECK_OK(um_buffer_release(b, 2, s));
    CHECK_OK(um_stream_synchronize(ctx, s));
    /* The copy in to device 2 (1 MiB at 1 GiB/s: 0.977 ms), then 5 ms. */
    CHECK(um__now_ns() - t0 >= 5 * MS + 976562);
    CHECK(um__now_ns() - t0 <= 5 * MS + 976563);
    CHECK_OK(um_stream_destroy(ctx, s));
    CHECK_OK(um_buffer_destroy(b));
    um_shutdown(ctx);
}

/* A context in virtual time is the process's only one: the clock is the
 * process's, and a context beside it hung at its shutdown (its reclaimer
 * waited on the clock, which then stopped). */
static void test_alone_in_virtual_time(void)
{
    um_context *plain = NULL, *virt = NULL;
    CHECK_OK(um_init("devices=sim:1G,host_capacity=1G", &plain));
    CHECK_STATUS(um_init("devices=sim:1G,virtual_time=1,host_capacity=1G", &virt), UM_ERR_BUSY);
    CHECK_ERROR_MENTIONS("virtual_time", "1 other context", "only one");
    CHECK(virt == NULL && !um__vt_on());
    um_shutdown(plain);
    CHECK_OK(um_init("devices=sim:1G,virtual_time=1,host_capacity=1G", &virt));
    CHECK_STATUS(um_init("devices=sim:1G,host_capacity=1G", &plain), UM_ERR_BUSY);
    CHECK_ERROR_MENTIONS("runs in virtual time", "the only one", NULL);
    um_shutdown(virt);
    CHECK_OK(um_init("devices=sim:1G,host_capacity=1G", &plain));
    um_shutdown(plain);
}


/* The runtime engine refuses what it cannot time, as the model engine
 * does: a task no device runs (it ran such tasks in no time before), and
 * a task some devices run and some do not, when more than one does (the
 * runtime places a task on any device; one that only a single device
 * runs is sent there). */
static void test_runtime_eligibility(void)
{
    um__vs_machine *m = malloc(sizeof *m);
    um__vs_result *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    um__vs_dag c;
    CHECK_EQ(um__vs_dag_cholesky(2048, 512, &c), 0);
    uint64_t forced = 1;
    CHECK_OK(um__vs_machine_parse("machine name=gemmonly\n"
                                  "device name=host kind=host memory=64G\n"
                                  "device name=sim count=2 kind=sim memory=1G model=m\n"
                                  "link from=host to=sim bandwidth=1G\n"
                                  "link from=sim to=host bandwidth=1G\n"
                                  "compute model=m kernel=gemm gflops=5\n",
                                  "gemmonly", m));
    CHECK_STATUS(um__vs_simulate(m, &c, UM_SCHED_COST, b), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("no device", "potrf", NULL);
    CHECK_STATUS(um__vs_run_runtime(m, &c, UM_SCHED_COST, a, &forced), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("no device", "gemmonly", "potrf");
    /* sim0 runs only gemm, sim1 everything: the rest go to sim1, and both
     * engines take every task's time. */
    CHECK_OK(um__vs_machine_parse("machine name=split\n"
                                  "device name=host kind=host memory=64G\n"
                                  "device name=sim0 kind=sim memory=1G model=m\n"
                                  "device name=sim1 kind=sim memory=1G model=all\n"
                                  "link from=host to=sim0 bandwidth=1G\n"
                                  "link from=sim0 to=host bandwidth=1G\n"
                                  "link from=host to=sim1 bandwidth=1G\n"
                                  "link from=sim1 to=host bandwidth=1G\n"
                                  "compute model=m kernel=gemm gflops=5\n"
                                  "compute model=all kernel=gemm gflops=5\n"
                                  "compute model=all kernel=trsm gflops=5\n"
                                  "compute model=all kernel=syrk gflops=5\n"
                                  "compute model=all kernel=potrf gflops=5\n",
                                  "split", m));
    for (int p = 0; p < 4; p++) {
        static const int pol[] = {UM_SCHED_EAGER, UM_SCHED_ROUND_ROBIN, UM_SCHED_LOCALITY,
                                  UM_SCHED_COST};
        CHECK_OK(um__vs_run_runtime(m, &c, pol[p], a, &forced));
        CHECK_EQ(forced, 0);
        CHECK_EQ(a->tasks_on[1] + a->tasks_on[2], c.ntasks);
        uint64_t gemms = 0;
        for (size_t i = 0; i < c.ntasks; i++)
            gemms += c.tasks[i].kernel == UM_VS_GEMM;
        CHECK(a->tasks_on[1] <= gemms);
        CHECK(a->makespan_s >= a->lower_bound_s * (1 - 1e-9));
        /* Each device was busy for exactly the flops it ran at 5 GF/s. */
        CHECK(a->busy_s[1] + a->busy_s[2] > 0.99 * a->work_bound_s * 2);
    }
    /* Two of three devices run potrf: the runtime cannot say which. */
    CHECK_OK(um__vs_machine_parse("machine name=split3\n"
                                  "device name=host kind=host memory=64G\n"
                                  "device name=a kind=sim memory=1G model=m\n"
                                  "device name=b count=2 kind=sim memory=1G model=all\n"
                                  "link from=host to=a bandwidth=1G\n"
                                  "link from=a to=host bandwidth=1G\n"
                                  "link from=host to=b bandwidth=1G\n"
                                  "link from=b to=host bandwidth=1G\n"
                                  "compute model=m kernel=gemm gflops=5\n"
                                  "compute model=all kernel=gemm gflops=5\n"
                                  "compute model=all kernel=trsm gflops=5\n"
                                  "compute model=all kernel=syrk gflops=5\n"
                                  "compute model=all kernel=potrf gflops=5\n",
                                  "split3", m));
    CHECK_STATUS(um__vs_run_runtime(m, &c, UM_SCHED_COST, a, &forced), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("potrf", "'a'", "--engine model");
    CHECK_OK(um__vs_simulate(m, &c, UM_SCHED_COST, b));
    um__vs_dag_free(&c);
    free(a);
    free(b);
    free(m);
}

/* Both engines on a GEMM of n in tiles of `tile` on the machine `desc`
 * describes, eager placement: the runtime's result in *a (its clock never
 * forced), the model's in *b. The caller frees *m, *a, *b and d. */
static void both_engines(const char *desc, uint32_t n, uint32_t tile, um__vs_machine **m,
                         um__vs_dag *d, um__vs_result **a, um__vs_result **b)
{
    *m = malloc(sizeof **m);
    *a = malloc(sizeof **a);
    *b = malloc(sizeof **b);
    CHECK_OK(um__vs_machine_parse(desc, "test", *m));
    CHECK_EQ(um__vs_dag_gemm(n, tile, d), 0);
    uint64_t forced = 1;
    CHECK_OK(um__vs_run_runtime(*m, d, UM_SCHED_EAGER, *a, &forced));
    CHECK_EQ(forced, 0);
    CHECK_OK(um__vs_simulate(*m, d, UM_SCHED_EAGER, *b));
}

/* A host with a compute model runs tasks in the runtime engine, and they
 * take its modelled time (they took none: the makespan was half the
 * model engine's, below the lower bound). */
static void test_runtime_host_model(void)
{
    static const char desc[] =
        "machine name=hostmodel\n"
        "device name=host kind=host memory=64G model=sim5\n"
        "device name=sim count=3 kind=sim memory=1G granularity=2M model=sim5\n"
        "link from=host to=sim bandwidth=1.073741824G latency=0us\n"
        "link from=sim to=host bandwidth=1.073741824G latency=0us\n"
        "compute model=sim5 kernel=gemm gflops=5\n";
    um__vs_machine *m;
    um__vs_result *a, *b;
    um__vs_dag d;
    both_engines(desc, 2048, 512, &m, &d, &a, &b);
    double task_s = 2.0 * 512 * 512 * 512 / 5e9;
    printf("test_vtime: host with a model: runtime %.4f s (%llu host tasks), model %.4f s, "
           "bound %.4f s\n", a->makespan_s, (unsigned long long)a->tasks_on[0], b->makespan_s,
           a->lower_bound_s);
    CHECK(a->tasks_on[0] > 0);
    CHECK_NEAR(a->busy_s[0], (double)a->tasks_on[0] * task_s, 1e-6);
    CHECK_NEAR(a->lower_bound_s, (double)d.ntasks * task_s / 4, 1e-9);
    CHECK(a->makespan_s >= a->lower_bound_s * (1 - 1e-9));
    CHECK_NEAR(a->makespan_s / b->makespan_s, 1.0, 0.15);
    um__vs_dag_free(&d);
    free(a);
    free(b);
    free(m);
}

/* Links of a 1e6 s latency (the most a description takes): the runtime
 * engine's clock reaches 1e7 s, where a second's double resolves 2e-9 s,
 * coarser than the model's fixed 1 ns tolerance, and it spun for ever
 * at a copy's end. */
static void test_runtime_long_latency(void)
{
    static const char desc[] =
        "machine name=slow\n"
        "device name=host kind=host memory=64G\n"
        "device name=sim count=3 kind=sim memory=1G granularity=2M model=sim5\n"
        "link from=host to=sim bandwidth=1.073741824G latency=1e6s\n"
        "link from=sim to=host bandwidth=1.073741824G latency=1e6s\n"
        "compute model=sim5 kernel=gemm gflops=5\n";
    um__vs_machine *m;
    um__vs_result *a, *b;
    um__vs_dag d;
    both_engines(desc, 2048, 1024, &m, &d, &a, &b);
    printf("test_vtime: 1e6 s latencies: runtime %.4f s, model %.4f s\n", a->makespan_s,
           b->makespan_s);
    CHECK_EQ(a->tasks_on[1] + a->tasks_on[2] + a->tasks_on[3], d.ntasks);
    CHECK(a->makespan_s > 2e6 && a->home_s > a->makespan_s);
    CHECK(b->makespan_s > 2e6);
    um__vs_dag_free(&d);
    free(a);
    free(b);
    free(m);
}

int main(void)
{
    uint64_t seed = harness_seed("test_vtime");
    test_relay();
    test_lock_across_sleep();
    test_model_wakes_everyone();
    test_exact_times();
    test_many_readers();
    test_lands_in_any_order();
    test_shared_link();
    test_random_chains(seed);
    test_engines_agree();
    test_evicting_runs_clean();
    test_bad_config();
    test_wait_outlives_stream();
    test_join_after_exit();
    test_baseline_lock_in_virtual_time();
    test_faults_in_virtual_time();
    test_alone_in_virtual_time();
    test_runtime_eligibility();
    test_runtime_host_model();
    test_runtime_long_latency();
    return harness_finish("test_vtime");
}
