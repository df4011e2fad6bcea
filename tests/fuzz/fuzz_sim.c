/*
 * fuzz_sim: the virtual-time simulator's two readers of user files, a
 * machine description (um__vs_machine_parse) and a recorded task trace
 * (um__vs_dag_trace, through a memfd named /proc/self/fd/N), and the model
 * engine on what they accept. The bytes are a description, then a line
 * "%%", then a task trace; without that line they are a description and
 * the trace is a small fixed one (a GEMM of 8 tasks).
 *
 * What holds of any input:
 * - A refused description or trace fails with UM_ERR_INVALID or
 *   UM_ERR_PARSE (UM_ERR_NOMEM where memory ran out), never another
 *   status, and the message names its source.
 * - An accepted description has 1 to UM_VS_MAX_DEVICES devices, the host
 *   first; each device's model is -1 or one of the machine's; each route
 *   between two devices is -1 (no way), 0 (the same device) or up to four
 *   resources of the machine with a finite latency of at least 0; and a
 *   kernel's time is not negative (INFINITY: the device cannot run it).
 * - An accepted trace's graph is well formed: each task names at most
 *   UM_VS_MAX_ACCESS tiles (none, as um_task allows), each below ntiles
 *   with a mode of r, w or rw, and its
 *   dependencies are sorted, distinct and name earlier tasks only.
 * - A graph of at most SIM_MAX_TASKS tasks on an accepted machine, with
 *   every policy: the engine either refuses (a task no device can run, a
 *   copy too long: UM_ERR_INVALID or UM_ERR_NOMEM) or finishes every
 *   task, with a finite makespan no shorter than its lower bound; it
 *   never stalls (UM_ERR_INTERNAL). Two runs give the same makespan.
 */
#include "fuzz_common.h"

#include "base/options.h"
#include "vsim/machine.h"
#include "vsim/sim.h"

#include <math.h>
#include <sys/mman.h>
#include <unistd.h>

#define SIM_MAX_INPUT (64u << 10)
/* The largest graph the harness simulates (the engine is fast, but the
 * fuzzer wants many runs a second). */
#define SIM_MAX_TASKS 64

static const char default_trace[] =
    "# unimem task trace 1\n"
    "task 1 gemm 33554432 1:262144:r 2:262144:r 3:262144:wd\n"
    "task 2 gemm 33554432 4:262144:r 5:262144:r 3:262144:rw\n"
    "task 3 gemm 33554432 1:262144:r 6:262144:r 7:262144:wd\n"
    "task 4 gemm 33554432 4:262144:r 8:262144:r 7:262144:rw\n"
    "task 5 potrf 11184810 9:262144:rw\n"
    "task 6 trsm 33554432 9:262144:r 3:262144:rw\n"
    "task 7 syrk 33554432 3:262144:r 7:262144:rw\n"
    "task 8 copy 0 7:262144:r 10:262144:w\n";

static int memfd = -1;
static char memfd_path[64];
static um__vs_machine *machine;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    memfd = memfd_create("fuzz_sim_trace", 0);
    FUZZ_CHECK(memfd >= 0, "no memfd");
    snprintf(memfd_path, sizeof memfd_path, "/proc/self/fd/%d", memfd);
    machine = malloc(sizeof *machine);
    FUZZ_CHECK(machine != NULL, "no memory for a machine");
    return 0;
}

static bool refused_well(um_status st, const char *source)
{
    return (st == UM_ERR_INVALID || st == UM_ERR_PARSE || st == UM_ERR_NOMEM) &&
           fuzz_error_names(st) && strstr(um_last_error(), source) != NULL;
}

static void check_machine(const um__vs_machine *m)
{
    FUZZ_CHECK(m->ndev >= 1 && m->ndev <= UM_VS_MAX_DEVICES && m->dev[0].host,
               "%d devices, the first %sthe host", m->ndev, m->dev[0].host ? "" : "not ");
    FUZZ_CHECK(m->nmodels >= 0 && m->nmodels <= UM_VS_MAX_MODELS, "%d models", m->nmodels);
    for (int i = 0; i < m->ndev; i++) {
        FUZZ_CHECK(m->dev[i].model >= -1 && m->dev[i].model < m->nmodels,
                   "device %d has model %d of %d", i, m->dev[i].model, m->nmodels);
        for (int k = 0; k < UM_VS_NKERNELS; k++) {
            double s = um__vs_compute_time(m, i, k, 512, 2.0 * 512 * 512 * 512);
            FUZZ_CHECK(s >= 0 && !isnan(s), "device %d kernel %d takes %g s", i, k, s);
        }
        for (int j = 0; j < m->ndev; j++) {
            int route[4] = {-1, -1, -1, -1};
            double latency = -1;
            int n = um__vs_route(m, i, j, route, &latency);
            FUZZ_CHECK(n >= -1 && n <= 4 && (i != j || n == 0), "route %d->%d: %d", i, j, n);
            for (int r = 0; r < n; r++)
                FUZZ_CHECK(route[r] >= 0 && route[r] < m->nres, "route %d->%d names resource %d",
                           i, j, route[r]);
            FUZZ_CHECK(n <= 0 || (latency >= 0 && isfinite(latency)),
                       "route %d->%d has latency %g", i, j, latency);
        }
    }
}

static void check_dag(const um__vs_dag *d)
{
    for (size_t i = 0; i < d->ntasks; i++) {
        const um__vs_task *t = &d->tasks[i];
        FUZZ_CHECK(t->naccess <= UM_VS_MAX_ACCESS, "task %zu names %u tiles", i, t->naccess);
        FUZZ_CHECK(t->kernel < UM_VS_NKERNELS, "task %zu has kernel %u", i, t->kernel);
        for (int a = 0; a < t->naccess; a++)
            FUZZ_CHECK(t->access[a].tile < d->ntiles && t->access[a].mode >= UM_VS_READ &&
                           t->access[a].mode <= UM_VS_READ_WRITE,
                       "task %zu access %d: tile %u of %u, mode %u", i, a, t->access[a].tile,
                       d->ntiles, t->access[a].mode);
        FUZZ_CHECK((size_t)t->first_dep + t->ndeps <= d->ndeps_total, "task %zu's deps overrun",
                   i);
        for (uint32_t k = 0; k < t->ndeps; k++) {
            uint32_t dep = d->deps[t->first_dep + k];
            FUZZ_CHECK(dep < i && (k == 0 || dep > d->deps[t->first_dep + k - 1]),
                       "task %zu waits for task %u (its dependency %u)", i, dep, k);
        }
    }
}

static void simulate(const um__vs_machine *m, const um__vs_dag *d)
{
    static const int policies[] = {UM_SCHED_EAGER, UM_SCHED_ROUND_ROBIN, UM_SCHED_LOCALITY,
                                   UM_SCHED_COST};
    static um__vs_result r, again;
    for (size_t p = 0; p < sizeof policies / sizeof *policies; p++) {
        um_status st = um__vs_simulate(m, d, policies[p], &r);
        FUZZ_CHECK(st == UM_OK || st == UM_ERR_INVALID || st == UM_ERR_NOMEM,
                   "policy %d: %s", policies[p], um_status_name(st));
        if (st != UM_OK)
            continue;
        FUZZ_CHECK(isfinite(r.makespan_s) && r.makespan_s >= 0 &&
                       r.makespan_s >= r.lower_bound_s * (1 - 1e-9),
                   "policy %d: makespan %.17g s, lower bound %.17g s", policies[p], r.makespan_s,
                   r.lower_bound_s);
        st = um__vs_simulate(m, d, policies[p], &again);
        FUZZ_CHECK(st == UM_OK && again.makespan_s == r.makespan_s,
                   "policy %d: a second run gave %s, %.17g s against %.17g s", policies[p],
                   um_status_name(st), again.makespan_s, r.makespan_s);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > SIM_MAX_INPUT)
        return 0;
    char *text = malloc(size + 1);
    FUZZ_CHECK(text != NULL, "no memory");
    memcpy(text, data, size);
    text[size] = '\0';
    const char *trace = default_trace;
    size_t trace_len = sizeof default_trace - 1;
    char *split = strstr(text, "\n%%\n");
    if (split) {
        *split = '\0';
        trace = split + 4;
        trace_len = size - (size_t)(trace - text);
    }
    um_status st = um__vs_machine_parse(text, "fuzz-machine", machine);
    bool have_machine = st == UM_OK;
    if (have_machine)
        check_machine(machine);
    else
        FUZZ_CHECK(refused_well(st, "fuzz-machine"), "the description was refused with %s",
                   um_status_name(st));
    FUZZ_CHECK(ftruncate(memfd, 0) == 0 &&
                   pwrite(memfd, trace, trace_len, 0) == (ssize_t)trace_len,
               "cannot write the trace to its memfd");
    um__vs_dag d;
    memset(&d, 0, sizeof d);
    st = um__vs_dag_trace(memfd_path, &d);
    if (st == UM_OK) {
        check_dag(&d);
        if (have_machine && d.ntasks <= SIM_MAX_TASKS)
            simulate(machine, &d);
    } else {
        FUZZ_CHECK(refused_well(st, memfd_path), "the trace was refused with %s",
                   um_status_name(st));
    }
    um__vs_dag_free(&d);
    free(text);
    return 0;
}
