/*
 * sim: the virtual-time simulation of a task graph (dag.h) on a modelled
 * machine (machine.h). Owns the event loop and the simulated state: which
 * device holds a valid copy of each tile, each device's memory and queue,
 * and the copies in flight on the network model (flow.h). Time advances
 * from event to event (a copy or a kernel ending), so no real time passes
 * and no data exists.
 *
 * It follows the task runtime's rules (src/run): a task is placed when its
 * dependencies are done, by the library's own placement policies
 * (src/place, through a um__place_env answered from the simulated state,
 * learning each kernel's time as it would); each device runs its queue in
 * order, holds at most QUEUE_MAX tasks, and fetches the inputs of the next
 * PREFETCH_AHEAD tasks while one computes. An input comes from the valid
 * copy whose route is fastest; a written tile is valid only where it was
 * written. A device short of memory evicts the least recently used tile no
 * staged task needs (the running one and those fetched ahead), a clean one
 * (valid elsewhere) first, writing a dirty one back to the host. At the end every tile written is copied back to
 * the host, as a program reading its result would.
 */
#ifndef UM_VSIM_SIM_H
#define UM_VSIM_SIM_H

#include "dag.h"
#include "machine.h"

#include <stdatomic.h>

typedef struct um__vs_result {
    double makespan_s;     /* until the last task ended (what `unimem demo` reports) */
    double home_s;         /* until the last result tile is back on the host */
    double lower_bound_s, work_bound_s, path_bound_s;
    double busy_s[UM_VS_MAX_DEVICES];
    uint64_t tasks_on[UM_VS_MAX_DEVICES];
    double bytes_moved;    /* every copy's bytes */
    double link_bytes[UM_VS_MAX_DEVICES][UM_VS_MAX_DEVICES]; /* copies [from][to] */
    uint64_t copies, evictions, writebacks;
    uint64_t events;
    uint64_t peak_bytes[UM_VS_MAX_DEVICES]; /* the most a device held at once */
} um__vs_result;

/* Simulates d on m with placement policy `policy` (UM_SCHED_*). */
um_status um__vs_simulate(const um__vs_machine *m, const um__vs_dag *d, int policy,
                          um__vs_result *out);

/* The lower bound of d on m into out (lower_bound_s, work_bound_s,
 * path_bound_s). */
void um__vs_bounds(const um__vs_machine *m, const um__vs_dag *d, um__vs_result *out);

/* Fails (UM_ERR_INVALID), naming the sizes, when d's tiles together do
 * not fit the memory of m's host, where both engines start them. */
um_status um__vs_check_host_holds(const um__vs_machine *m, const um__vs_dag *d);

/* Runs d on m with the library's own task runtime in virtual time
 * (runtime.c): a context whose sim devices are m's, tasks submitted as a
 * program would, the runtime's dependency tracking, placement, eviction
 * and transfer routing unchanged. Fills out as um__vs_simulate does, and
 * forced_steps with the clock's moves made while a thread it could not
 * see was about to run (0 in a sound run). */
um_status um__vs_run_runtime(const um__vs_machine *m, const um__vs_dag *d, int policy,
                             um__vs_result *out, uint64_t *forced_steps);

/* While counter is set, both engines add one to it as each task ends (the
 * runtime engine from its executor threads), so that a tool can show a
 * run's progress from a thread of its own. Process-wide: set it before a
 * run and back to NULL after. */
void um__vs_count_tasks(_Atomic uint64_t *counter);
/* A task ended: counted where um__vs_count_tasks says, if anywhere. */
void um__vs_task_ended(void);

#endif /* UM_VSIM_SIM_H */
