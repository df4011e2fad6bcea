/*
 * The runtime engine of `unimem sim`: the graph runs on the library's own
 * task runtime in virtual time (option virtual_time, base/vtime.h), with
 * the machine's devices as sim devices that hold no data, its links as the
 * device model's resources (backend/vdev.h) and its kernel tables as the
 * tasks' durations. What the simulator's own loop (sim.c) re-implements,
 * dependency tracking, queueing, prefetching, eviction, write-back and the
 * choice of a copy's source, here is the runtime's code itself.
 */
#include "sim.h"

#include "../backend/vdev.h"
#include "../base/vtime.h"
#include "../core/core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The time is the model's and there is no data. The run layer charges a
 * sim device's modelled time after this returns and a GPU's on its
 * stream, but nothing for the host, whose tasks are real code: a host the
 * machine gives a compute model takes it here, in virtual time (e->user:
 * the task's time on the host, in ns). */
static int no_compute(const um_task_exec *e)
{
    if (e->kind == UM_DEVICE_HOST && e->user)
        um__sleep_until_ns(um__now_ns() + *(const uint64_t *)e->user);
    um__vs_task_ended();
    return 0;
}

/* The kernel a task's name names (as a recorded trace's is read). */
static int kernel_of(const char *name)
{
    for (int k = 0; k < UM_VS_OTHER; k++)
        if (name && !strcmp(name, um__vs_kernel_name((um__vs_kernel)k)))
            return k;
    return UM_VS_OTHER;
}

static uint64_t seconds_ns(double s)
{
    /* check_tasks sends no task where its time is not finite or is above
     * UM_VS_MAX_SECONDS; the bound here only keeps llround defined. */
    return !isfinite(s) || s < 0 ? 0 : (uint64_t)llround(fmin(s, UM_VS_MAX_SECONDS) * 1e9);
}

/* The tile order of a buffer of `largest` bytes of floats (1 at least). */
static uint32_t tile_of(size_t largest)
{
    uint32_t tile = (uint32_t)llround(sqrt((double)largest / 4.0));
    return tile ? tile : 1;
}

/* The context's task time: the machine's table for the kernel on tiles of
 * the order its largest buffer has in floats, alone and packed. */
static uint64_t task_ns(void *arg, int dev, const char *name, double flops, size_t largest,
                        uint64_t *packed_ns)
{
    const um__vs_machine *m = arg;
    uint32_t tile = tile_of(largest);
    int k = kernel_of(name);
    *packed_ns = seconds_ns(um__vs_packed_time(m, dev, k, tile, flops));
    return seconds_ns(um__vs_compute_time(m, dev, k, tile, flops));
}

/* The largest buffer of t, in bytes (what the run layer gives task_ns). */
static size_t largest_of(const um__vs_dag *d, const um__vs_task *t)
{
    size_t largest = 0;
    for (int a = 0; a < t->naccess; a++)
        if (um__vs_tile_size(d, t->access[a].tile) > largest)
            largest = (size_t)um__vs_tile_size(d, t->access[a].tile);
    return largest;
}

/* The runtime places a task on any device that has an implementation for
 * it (every device here: the cpu function), so the kernel tables must say
 * where it can run: each task's device (-1: any) into device[], and into
 * host_ns[] its time on the host (0 where the host cannot run it).
 * Refused, as the model engine refuses it (sim.c), is a task no device
 * runs (it took no time here); so is one above UM_VS_MAX_SECONDS (its ns
 * would overflow the clock); and, as the runtime has no set of devices
 * for a task, one that some devices run and others do not, unless
 * exactly one does (it is sent there). *host_runs: some task runs on the
 * host (option host_tasks). */
static um_status check_tasks(const um__vs_machine *m, const um__vs_dag *d, int *device,
                             uint64_t *host_ns, bool *host_runs)
{
    uint64_t *can = malloc((d->ntasks ? d->ntasks : 1) * sizeof *can);
    if (!can)
        return um__fail(UM_ERR_NOMEM, "sim: no memory for %zu tasks", d->ntasks);
    *host_runs = false;
    um_status st = UM_OK;
    for (size_t i = 0; i < d->ntasks && st == UM_OK; i++) {
        const um__vs_task *t = &d->tasks[i];
        size_t largest = largest_of(d, t);
        uint32_t tile = tile_of(largest);
        const char *name = um__vs_kernel_name((um__vs_kernel)t->kernel);
        can[i] = 0;
        host_ns[i] = 0;
        /* Devices of one model take the same time: each model once. */
        double by_model[UM_VS_MAX_MODELS];
        bool known[UM_VS_MAX_MODELS] = {false};
        for (int dev = 0; dev < m->ndev && st == UM_OK; dev++) {
            int mi = m->dev[dev].model;
            if (mi < 0)
                continue;
            if (!known[mi]) {
                double a = um__vs_compute_time(m, dev, t->kernel, tile, t->flops);
                double p = um__vs_packed_time(m, dev, t->kernel, tile, t->flops);
                by_model[mi] = isfinite(a) && isfinite(p) ? fmax(a, p) : INFINITY;
                known[mi] = true;
            }
            if (!isfinite(by_model[mi]))
                continue;
            if (by_model[mi] > UM_VS_MAX_SECONDS)
                st = um__fail(UM_ERR_INVALID, "sim: a %s task of machine %s takes %g s on %s, "
                              "more than the runtime engine's %g s", name, m->name,
                              by_model[mi], m->dev[dev].name, UM_VS_MAX_SECONDS);
            can[i] |= 1ull << dev;
            if (dev == 0) {
                uint64_t packed;
                host_ns[i] = task_ns((void *)m, 0, name, t->flops, largest, &packed);
                *host_runs = true;
            }
        }
        if (st == UM_OK && !can[i])
            st = um__fail(UM_ERR_INVALID, "sim: no device of machine %s runs %s tiles of %u",
                          m->name, name, tile);
    }
    /* The devices the runtime may place a task on: the host only when it
     * runs tasks. */
    uint64_t all = m->ndev >= 64 ? ~0ull : (1ull << m->ndev) - 1;
    if (!*host_runs)
        all &= ~1ull;
    for (size_t i = 0; i < d->ntasks && st == UM_OK; i++) {
        uint64_t c = can[i] & all;
        if (c == all) {
            device[i] = -1;
        } else if (!(c & (c - 1))) {
            device[i] = __builtin_ctzll(c);
        } else {
            int no = __builtin_ctzll(all & ~c);
            st = um__fail(UM_ERR_INVALID, "sim: the runtime engine places a task on any device, "
                          "but device '%s' of machine %s does not run %s tiles of %u while "
                          "others do (use --engine model)", m->dev[no].name, m->name,
                          um__vs_kernel_name((um__vs_kernel)d->tasks[i].kernel),
                          tile_of(largest_of(d, &d->tasks[i])));
        }
    }
    free(can);
    return st;
}

/* The machine's links as the device model's resources and routes. */
static um_status install_links(const um__vs_machine *m)
{
    um__vdev_route *route = calloc((size_t)m->ndev * (size_t)m->ndev, sizeof *route);
    if (!route)
        return um__fail(UM_ERR_NOMEM, "sim: no memory for the routes");
    for (int s = 0; s < m->ndev; s++)
        for (int d = 0; d < m->ndev; d++) {
            um__vdev_route *r = &route[s * m->ndev + d];
            int res[4];
            double lat = 0;
            int n = s == d ? 0 : um__vs_route(m, s, d, res, &lat);
            if (n < 0) {
                free(route);
                return um__fail(UM_ERR_INVALID, "sim: machine %s has no way from %s to %s",
                                m->name, m->dev[s].name, m->dev[d].name);
            }
            r->n = n;
            memcpy(r->res, res, (size_t)n * sizeof *res);
            r->latency_s = lat;
        }
    um__vdev_links l = {m->ndev, m->nres, m->res_bandwidth, route};
    um_status st = um__vdev_set_links(&l);
    free(route);
    return st;
}

/* The memory the sim device for m's device dev is made with: the
 * device's own. A limit below it (memory) is set on the context, as a
 * program limits a GPU: made with only the limit, the device's pool
 * reserved address space for the limit alone (va_factor 1), and one 16
 * MiB block the link measurement freed at its start cut that space so
 * that a device of eight 256 MiB tiles held seven. */
static uint64_t made_with(const um__vs_machine *m, int dev)
{
    const um__vs_device *v = &m->dev[dev];
    return v->capacity > v->memory ? v->capacity : v->memory;
}

/* The context's configuration for m: its GPUs as sim devices. */
static um_status config(const um__vs_machine *m, const um__vs_dag *d, int policy,
                        bool host_runs, char *buf, size_t len)
{
    static const char *const sched[] = {"eager", "round_robin", "locality", "cost"};
    if (m->ndev < 2 || !m->dev[0].host || m->ndev > UM_MAX_DEVICES)
        return um__fail(UM_ERR_INVALID, "sim: machine %s needs a host and 1 to %d devices "
                        "for the runtime engine", m->name, UM_MAX_DEVICES - 1);
    if (policy < 0 || policy > 3)
        return um__fail(UM_ERR_INVALID, "sim: policy %d is unknown", policy);
    /* The host holds every tile at the start, and the pool keeps some
     * room besides. */
    uint64_t need = 0;
    for (uint32_t i = 0; i < d->ntiles; i++)
        need += um__vs_tile_size(d, i) + m->dev[0].granularity;
    /* The host's memory is address space only; what the tiles need (twice,
     * for room) keeps its page tables small. */
    uint64_t host = m->dev[0].memory && m->dev[0].memory < 2 * need ? m->dev[0].memory
                                                                      : 2 * need;
    /* va_factor 1: eight GPUs of 141 GiB at the default 4x would reserve
     * 4.5 TiB of address space, more than sanitizers leave a process. */
    int n = snprintf(buf, len, "virtual_time=1,va_factor=1,sched=%s,host_tasks=%d,host_capacity=%llu,"
                     "host_granularity=%llu,sim_granularity=%llu,devices=",
                     sched[policy], host_runs ? 1 : 0, (unsigned long long)host,
                     (unsigned long long)m->dev[0].granularity,
                     (unsigned long long)m->dev[1].granularity);
    for (int dev = 1; dev < m->ndev && n > 0 && (size_t)n < len; dev++) {
        if (m->dev[dev].granularity != m->dev[1].granularity)
            return um__fail(UM_ERR_INVALID, "sim: the runtime engine needs one granularity "
                            "for every device (%s has %llu, %s %llu)", m->dev[dev].name,
                            (unsigned long long)m->dev[dev].granularity, m->dev[1].name,
                            (unsigned long long)m->dev[1].granularity);
        n += snprintf(buf + n, len - (size_t)n, "%ssim:%llu", dev > 1 ? "+" : "",
                      (unsigned long long)made_with(m, dev));
    }
    if (n < 0 || (size_t)n >= len)
        return um__fail(UM_ERR_INVALID, "sim: machine %s has too many devices for one "
                        "configuration", m->name);
    return UM_OK;
}

static const um_access mode_of[] = {
    [UM_VS_READ] = UM_ACCESS_READ,
    [UM_VS_WRITE] = UM_ACCESS_WRITE_DISCARD,
    [UM_VS_READ_WRITE] = UM_ACCESS_READ_WRITE,
};

/* Submits every task, with its priority (dag.h), waits, brings the
 * results home. */
static um_status run(um_context *ctx, const um__vs_dag *d, um_buffer **tiles, const int *device,
                     const uint64_t *host_ns, double *makespan_s, double *home_s)
{
    int *prio = malloc((d->ntasks ? d->ntasks : 1) * sizeof *prio);
    if (!prio || um__vs_dag_priorities(d, prio) != 0) {
        free(prio);
        return um__fail(UM_ERR_NOMEM, "sim: no memory for the tasks' priorities");
    }
    uint64_t t0 = um__vt_now();
    um_status st = UM_OK;
    for (size_t i = 0; i < d->ntasks && st == UM_OK; i++) {
        const um__vs_task *t = &d->tasks[i];
        um_task ut = {.name = um__vs_kernel_name((um__vs_kernel)t->kernel),
                      .cpu = no_compute,
                      .nbuffers = t->naccess,
                      .flops = t->flops,
                      .device = device[i],
                      .user = (void *)&host_ns[i],
                      .priority = prio[i]};
        for (int a = 0; a < t->naccess; a++) {
            ut.buffers[a] = tiles[t->access[a].tile];
            ut.modes[a] = mode_of[t->access[a].mode];
        }
        um_task_id id;
        st = um_task_submit(ctx, &ut, &id);
    }
    free(prio);
    if (st == UM_OK)
        st = um_wait_all(ctx);
    *makespan_s = (double)(um__vt_now() - t0) / 1e9;
    /* Every written tile back on the host, as a program reading its
     * result: all copies queued first, so that they share the links. */
    for (uint32_t i = 0; i < d->ntiles && st == UM_OK; i++)
        st = um_buffer_prefetch(tiles[i], 0);
    for (uint32_t i = 0; i < d->ntiles && st == UM_OK; i++) {
        void *p;
        if ((st = um_buffer_acquire(tiles[i], 0, UM_ACCESS_READ, NULL, &p)) == UM_OK)
            st = um_buffer_release(tiles[i], 0, NULL);
    }
    *home_s = (double)(um__vt_now() - t0) / 1e9;
    return st;
}

static void collect(um_context *ctx, const um__vs_machine *m, um__vs_result *out)
{
    for (int dev = 0; dev < m->ndev; dev++) {
        um_task_stats ts;
        if (um_task_stats_get(ctx, dev, &ts) == UM_OK) {
            out->busy_s[dev] = (double)ts.busy_ns / 1e9;
            out->tasks_on[dev] = ts.tasks;
        }
        um_stats ms;
        if (um_stats_get(ctx, dev, &ms) == UM_OK)
            out->peak_bytes[dev] = ms.peak_active_bytes;
        um_reclaim_stats rs;
        if (um_reclaim_stats_get(ctx, dev, &rs) == UM_OK) {
            out->evictions += rs.evictions;
            out->writebacks += rs.written_back;
        }
        for (int to = 0; to < m->ndev; to++) {
            um_link_stats ls;
            if (to != dev && um_link_stats_get(ctx, dev, to, &ls) == UM_OK) {
                out->link_bytes[dev][to] = (double)ls.bytes;
                out->bytes_moved += (double)ls.bytes;
                out->copies += ls.copies;
            }
        }
    }
}

um_status um__vs_run_runtime(const um__vs_machine *m, const um__vs_dag *d, int policy,
                             um__vs_result *out, uint64_t *forced_steps)
{
    memset(out, 0, sizeof *out);
    *forced_steps = 0;
    char conf[4096];
    size_t nt = d->ntasks ? d->ntasks : 1;
    /* Both live until the context is shut down: a task may outlive a
     * failed submission or wait. */
    int *device = malloc(nt * sizeof *device);
    uint64_t *host_ns = malloc(nt * sizeof *host_ns);
    bool host_runs = false;
    um_status st = device && host_ns ? check_tasks(m, d, device, host_ns, &host_runs)
                                     : um__fail(UM_ERR_NOMEM, "sim: no memory for %zu tasks", nt);
    if (st == UM_OK)
        st = um__vs_check_copies(m, d->tile_bytes);
    /* Refused with the model engine's message, not the host pool's
     * "cannot allocate" midway. */
    if (st == UM_OK)
        st = um__vs_check_host_holds(m, d);
    if (st == UM_OK)
        st = config(m, d, policy, host_runs, conf, sizeof conf);
    um_context *ctx = NULL;
    if (st == UM_OK)
        st = um_init(conf, &ctx);
    for (int dev = 1; dev < m->ndev && st == UM_OK; dev++)
        if (m->dev[dev].memory < made_with(m, dev))
            st = um_set_memory_limit(ctx, dev, (size_t)m->dev[dev].memory);
    if (st != UM_OK) {
        um_shutdown(ctx); /* none where um_init failed */
        free(device);
        free(host_ns);
        return st;
    }
    ctx->vt_task_ns = task_ns;
    ctx->vt_task_arg = (void *)m;
    /* The placement's first estimates, before it has timed a kernel on a
     * device, come from the device's speed: the machine's GEMM rate. */
    double T = d->tile ? (double)d->tile : 1.0;
    for (int dev = 0; dev < m->ndev; dev++) {
        double s = um__vs_compute_time(m, dev, UM_VS_GEMM, d->tile ? d->tile : 1, 2 * T * T * T);
        if (isfinite(s) && s > 0)
            ctx->devices[dev].backend->nominal_gflops = 2 * T * T * T / s / 1e9;
        /* A GPU of the machine works as the runtime drives a GPU. */
        ctx->devices[dev].backend->launches_ahead = m->dev[dev].launches_ahead;
    }
    um_buffer **tiles = calloc(d->ntiles ? d->ntiles : 1, sizeof *tiles);
    st = tiles ? install_links(m) : um__fail(UM_ERR_NOMEM, "sim: no memory for the tiles");
    for (uint32_t i = 0; i < d->ntiles && st == UM_OK; i++)
        st = um_buffer_create(ctx, um__vs_tile_size(d, i), &(um_buffer_opts){.device = 0},
                              &tiles[i]);
    if (st == UM_OK)
        st = run(ctx, d, tiles, device, host_ns, &out->makespan_s, &out->home_s);
    if (st == UM_OK) {
        collect(ctx, m, out);
        um__vs_bounds(m, d, out);
        um__vt_stats vs;
        um__vt_stats_get(&vs);
        out->events = vs.steps;
        /* A move the clock made with a thread it could not see counted:
         * the watchdog's, or one during a lock handoff it did not see. */
        *forced_steps = vs.forced + vs.early_moves;
    }
    for (uint32_t i = 0; tiles && i < d->ntiles; i++)
        if (tiles[i])
            (void)um_buffer_destroy(tiles[i]);
    free(tiles);
    um_shutdown(ctx);
    free(device);
    free(host_ns);
    return st;
}
