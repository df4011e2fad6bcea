/*
 * place: device-aware placement (option sched): the device a ready task
 * runs on. Owns the four policies and the performance history the cost
 * policy learns from (compute time per task name, size class and device,
 * and each device's time per flop). Sees tasks and devices only through
 * the views below, and the world through an environment (um__place_env):
 * the run layer answers from the context and the buffer layer, the
 * virtual-time simulator (src/vsim) from its models, so the same policies
 * run in both.
 *
 *   eager        the first idle device (none idle: the shortest queue)
 *   round_robin  each eligible device in turn
 *   locality     the device holding most of the task's input bytes
 *                (ties: the least queued work)
 *   cost         the earliest estimated finish: queued work + the missing
 *                inputs' transfer time (the link costs) + the compute time
 *                (history), plus the cost of making room when the device
 *                lacks it (the excess written back to the host and
 *                fetched again); a device that has not run such a task
 *                yet gets one at a time until it has, its time guessed
 *                from its nominal rate (backend.h).
 *
 * No policy chooses an accelerator whose memory limit is below the task's
 * footprint there (placeable() in place.c).
 */
#ifndef UM_PLACE_H
#define UM_PLACE_H

#include "../buffer/buffer.h"

typedef struct um__place um__place;

/* A ready task as placement sees it. */
typedef struct um__place_task {
    const char *name;
    double flops;
    int nbuffers;
    um_buffer *const *buffers;        /* the run layer's; NULL in the simulator */
    const void *owner;                /* the caller's record of the task, for its env */
    const um_access *modes;
    size_t bytes;                     /* the working set: every buffer's size */
    bool eligible[UM_MAX_DEVICES];    /* may run there (an implementation, a forced device) */
} um__place_task;

/* A device's load as placement sees it. */
typedef struct um__place_device {
    double queued_ns; /* estimated compute time of its queued and running tasks */
    int queued;       /* those tasks */
    bool full;        /* it takes no task now: its queue is full, or its worker runs done
                       * callbacks */
} um__place_device;

/* What placement asks of the world. */
typedef struct um__place_env {
    int ndevices;
    void *arg;
    /* The device's nominal rate in GFLOP/s (0: unknown). */
    double (*nominal_gflops)(void *arg, int dev);
    /* The bytes dev may hold and holds now. */
    void (*room)(void *arg, int dev, size_t *limit, size_t *used);
    /* Whether input i of t is valid on dev; when not, *ns is what bringing
     * it there would take. */
    bool (*fetch_cost)(void *arg, const um__place_task *t, int i, int dev, double *ns);
    size_t (*input_bytes)(void *arg, const um__place_task *t, int i);
} um__place_env;

/* What the world may also answer (um__place_set_room), each called with
 * the env's arg. */
typedef struct um__place_room {
    /* The bytes t's buffers take on dev at least, as its allocator
     * reserves memory in whole pages; NULL: t->bytes. */
    size_t (*footprint)(void *arg, const um__place_task *t, int dev);
    /* What writing `bytes` of dev's data back to the host and fetching them
     * again later costs, in ns; NULL: guessed from the missing inputs'
     * transfer time (nothing when only outputs are missing). */
    double (*evict_ns)(void *arg, int dev, size_t bytes);
} um__place_room;

/* env is copied. */
um__place *um__place_create(const um__place_env *env, int policy);
/* Installs room (copied), before the first pick. */
void um__place_set_room(um__place *p, const um__place_room *room);
void um__place_destroy(um__place *p);
/* The device for t: one where t->eligible holds, its footprint fits
 * under the memory limit (the host's is not limited), and that is not full;
 * *est_ns is the estimated compute time there (for a device that has not
 * run such a task yet: flops at its nominal rate, else the mean of those
 * that have). -1 when t
 * should wait: every eligible device is full, or (locality, cost) the
 * one it should run on is. */
int um__place_pick(um__place *p, const um__place_task *t, const um__place_device *devs,
                   double *est_ns);
/* t's compute on dev took ns: learnt for later estimates. */
void um__place_learn(um__place *p, const um__place_task *t, int dev, uint64_t ns);

#endif /* UM_PLACE_H */
