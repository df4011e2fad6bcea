/*
 * `unimem sim`: a tiled workload on a modelled machine in virtual time
 * (src/vsim): makespan, each device's busy time, the bytes each link
 * carried, evictions, and the lower bound, for one placement policy or all
 * four. The only tool that includes the library's internal headers: it is
 * the simulator's front end, and the simulator has no public API yet.
 */
#include "tool.h"

#include "base/options.h"
#include "vsim/sim.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SIM_CMD "sim"

/* The progress of the runs, drawn from a thread of its own every 100 ms
 * while an engine runs (the runtime engine's clock is virtual, and its
 * threads are not the tool's to interrupt). */
typedef struct sim_progress {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    bool stop;
    _Atomic uint64_t tasks;  /* tasks ended in the current run */
    uint64_t per_run;        /* the graph's tasks */
    int done, runs;          /* runs done, and to do */
    char what[48];
} sim_progress;

static void *progress_main(void *arg)
{
    sim_progress *sp = arg;
    pthread_mutex_lock(&sp->lock);
    while (!sp->stop) {
        uint64_t t = atomic_load_explicit(&sp->tasks, memory_order_relaxed);
        double within = sp->per_run ? (double)(t < sp->per_run ? t : sp->per_run) /
                                          (double)sp->per_run
                                    : 0.0;
        tool_progress(sp->what, ((double)sp->done + within) / (double)sp->runs);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 100 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&sp->wake, &sp->lock, &until);
    }
    pthread_mutex_unlock(&sp->lock);
    return NULL;
}

/* Starts drawing the progress of run `what` (false: not drawn, or no
 * thread). */
static bool progress_start(sim_progress *sp, const char *what)
{
    if (!tool_progress_on())
        return false;
    snprintf(sp->what, sizeof sp->what, "%s", what);
    atomic_store(&sp->tasks, 0);
    sp->stop = false;
    um__vs_count_tasks(&sp->tasks);
    if (pthread_create(&sp->thread, NULL, progress_main, sp) != 0) {
        um__vs_count_tasks(NULL);
        return false;
    }
    return true;
}

static void progress_stop(sim_progress *sp, bool started)
{
    if (started) {
        pthread_mutex_lock(&sp->lock);
        sp->stop = true;
        pthread_cond_signal(&sp->wake);
        pthread_mutex_unlock(&sp->lock);
        pthread_join(sp->thread, NULL);
        um__vs_count_tasks(NULL);
        tool_progress_clear();
    }
    sp->done++;
}

static void sim_usage(FILE *f)
{
    fprintf(f,
            "usage: unimem sim --machine FILE|NAME --workload gemm|cholesky|trace:FILE\n"
            "                  [--n N] [--tile T] [--policy eager|round_robin|locality|cost|all]\n"
            "                  [--limit BYTES] [--engine model|runtime] [--json]\n"
            "Runs the workload's task graph on a modelled machine in virtual time, with the\n"
            "library's placement policies, and prints the makespan beside the lower bound\n"
            "(the larger of the work spread over the devices that run some task of the graph\n"
            "and the critical path, each task at its fastest time on any device; copies are\n"
            "not counted).\n"
            "  --machine      a built-in (%s) or a description file (docs/DESIGN.md)\n"
            "  --workload     a demo's graph, or trace:FILE, the tasks a program submitted\n"
            "                 with the option task_trace=FILE (--n and --tile refused with it)\n"
            "  --n, --tile    matrix order and tile (defaults 131072 and 8192; n a multiple)\n"
            "  --policy       one policy, or all four (default: all)\n"
            "  --limit        every device but the host holds at most BYTES (as demo's --limit\n"
            "                 sets a memory limit on the device); at least one page of each\n"
            "                 device it cuts (the device's granularity)\n"
            "  --engine       runtime: the library's task runtime itself runs the graph in\n"
            "                 virtual time (its dependency tracking, eviction and copies);\n"
            "                 model (default): the simulator's own faster model of its rules\n"
            "  --json         one JSON object per policy\n",
            um__vs_builtin_names());
}

static const char *const policy_names[] = {"eager", "round_robin", "locality", "cost"};

/* A count of 1 to 2^32-1 in decimal digits only: strtoul alone would
 * also take leading spaces, a sign and "-1" (as ULONG_MAX). */
static bool parse_u32(const char *v, uint32_t *out)
{
    char *end;
    errno = 0;
    if (*v < '0' || *v > '9')
        return false;
    unsigned long x = strtoul(v, &end, 10);
    if (*end || errno || x == 0 || x > 0xffffffffu)
        return false;
    *out = (uint32_t)x;
    return true;
}

static const char *engine_name = "model";

/* a / b, or NAN where it has no meaning: b not above 0 (a lower bound or
 * a makespan of 0), or either not finite. */
static double quotient(double a, double b)
{
    return isfinite(a) && isfinite(b) && b > 0 ? a / b : NAN;
}

/* A JSON number with printf format fmt, or null where x is not finite
 * (JSON has no inf or nan). */
static void json_double(const char *fmt, double x)
{
    if (isfinite(x))
        printf(fmt, x);
    else
        fputs("null", stdout);
}

/* Bytes as tool_bytes writes them, from a double: a run's sums of copies
 * may pass 2^64 bytes (a trace of buffers of 2^60), where a cast to
 * uint64_t is undefined and printed "moved 0 B". */
static const char *bytes_text(char *buf, double bytes)
{
    if (bytes < 18446744073709551616.0)
        return tool_bytes(buf, (uint64_t)bytes);
    snprintf(buf, 32, "%.2f TiB", bytes / 1099511627776.0);
    return buf;
}

/* bytes as --limit takes it: in the largest of T, G, M and K (powers of
 * 1024, as um__parse_size reads them) that divides it, else in bytes. */
static const char *size_arg_text(char buf[32], uint64_t bytes)
{
    static const char units[] = "TGMK";
    for (int i = 0; i < 4; i++) {
        uint64_t unit = (uint64_t)1 << (10 * (4 - i));
        if (bytes >= unit && bytes % unit == 0) {
            snprintf(buf, 32, "%llu%c", (unsigned long long)(bytes / unit), units[i]);
            return buf;
        }
    }
    snprintf(buf, 32, "%llu", (unsigned long long)bytes);
    return buf;
}

static void print_text(const um__vs_machine *m, const um__vs_dag *d, const char *policy,
                       const um__vs_result *r, double wall_s)
{
    char a[32], ratio[32];
    double q = quotient(r->makespan_s, r->lower_bound_s);
    if (isfinite(q))
        snprintf(ratio, sizeof ratio, "%.3f", q);
    else
        snprintf(ratio, sizeof ratio, "n/a");
    printf("%-12s makespan %9.4f s (results home %.4f)  bound %9.4f s (work %.4f, path %.4f)  "
           "ratio %s  moved %s  evictions %llu  (%.2f s to simulate)\n",
           policy, r->makespan_s, r->home_s, r->lower_bound_s, r->work_bound_s,
           r->path_bound_s, ratio, bytes_text(a, r->bytes_moved),
           (unsigned long long)r->evictions, wall_s);
    for (int dev = 0; dev < m->ndev; dev++) {
        if (!r->tasks_on[dev])
            continue;
        double share = quotient(100.0 * r->busy_s[dev], r->makespan_s);
        char pct[16];
        if (isfinite(share))
            snprintf(pct, sizeof pct, "%5.1f%%", share);
        else
            snprintf(pct, sizeof pct, "  n/a");
        char peak[32];
        printf("    %-8s %6llu tasks, busy %8.4f s (%s), held at most %s\n", m->dev[dev].name,
               (unsigned long long)r->tasks_on[dev], r->busy_s[dev], pct,
               bytes_text(peak, (double)r->peak_bytes[dev]));
    }
    for (int s = 0; s < m->ndev; s++)
        for (int t = 0; t < m->ndev; t++)
            if (r->link_bytes[s][t] > 0)
                printf("    %s -> %s: %s\n", m->dev[s].name, m->dev[t].name,
                       bytes_text(a, r->link_bytes[s][t]));
    (void)d;
}

static void print_json(const um__vs_machine *m, const um__vs_dag *d, const char *policy,
                       const um__vs_result *r, double wall_s)
{
    /* Names come from the description (or its path) and may hold any
     * character but space: every string is escaped, and a figure that is
     * not finite (no ratio to a bound of 0) is null. */
    printf("{\"machine\":");
    tool_json_string(stdout, m->name);
    printf(",\"workload\":");
    tool_json_string(stdout, d->name);
    printf(",\"n\":%llu,\"tile\":%u,\"tasks\":%zu,\"policy\":",
           (unsigned long long)d->nt * d->tile, d->tile, d->ntasks);
    tool_json_string(stdout, policy);
    static const char *const keys[] = {"makespan_s", "results_home_s", "lower_bound_s",
                                       "work_bound_s", "path_bound_s", "makespan_over_bound"};
    const double values[] = {r->makespan_s, r->home_s, r->lower_bound_s, r->work_bound_s,
                             r->path_bound_s, quotient(r->makespan_s, r->lower_bound_s)};
    for (int i = 0; i < 6; i++) {
        printf(",\"%s\":", keys[i]);
        json_double(i == 5 ? "%.4f" : "%.6f", values[i]);
    }
    printf(",\"bytes_moved\":");
    json_double("%.0f", r->bytes_moved);
    printf(",\"copies\":%llu,\"evictions\":%llu,\"writebacks\":%llu,\"events\":%llu,"
           "\"simulate_s\":%.3f,\"engine\":",
           (unsigned long long)r->copies, (unsigned long long)r->evictions,
           (unsigned long long)r->writebacks, (unsigned long long)r->events, wall_s);
    tool_json_string(stdout, engine_name);
    printf(",\"devices\":[");
    for (int dev = 0; dev < m->ndev; dev++) {
        printf("%s{\"name\":", dev ? "," : "");
        tool_json_string(stdout, m->dev[dev].name);
        printf(",\"tasks\":%llu,\"busy_s\":", (unsigned long long)r->tasks_on[dev]);
        json_double("%.6f", r->busy_s[dev]);
        printf(",\"peak_bytes\":%llu}", (unsigned long long)r->peak_bytes[dev]);
    }
    printf("],\"links\":[");
    bool first = true;
    for (int s = 0; s < m->ndev; s++)
        for (int t = 0; t < m->ndev; t++)
            if (r->link_bytes[s][t] > 0) {
                printf("%s{\"from\":", first ? "" : ",");
                tool_json_string(stdout, m->dev[s].name);
                printf(",\"to\":");
                tool_json_string(stdout, m->dev[t].name);
                printf(",\"bytes\":");
                json_double("%.0f", r->link_bytes[s][t]);
                printf("}");
                first = false;
            }
    printf("]}\n");
}

int um_cmd_sim(int argc, char **argv)
{
    const char *machine = NULL, *workload = NULL, *policy = "all";
    uint32_t n = 131072, tile = 8192;
    const char *sized = NULL; /* the last of --n and --tile given */
    size_t limit = 0;
    const char *limit_text = NULL; /* --limit as given, for its error */
    bool json = false, runtime = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            sim_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--machine") && has_value) {
            machine = argv[++i];
        } else if (!strcmp(a, "--workload") && has_value) {
            workload = argv[++i];
        } else if (!strcmp(a, "--engine") && has_value) {
            const char *v = argv[++i];
            if (strcmp(v, "model") && strcmp(v, "runtime")) {
                fprintf(stderr, "unimem " SIM_CMD ": --engine is model or runtime, not '%s'\n",
                        v);
                return 2;
            }
            runtime = !strcmp(v, "runtime");
        } else if (!strcmp(a, "--policy") && has_value) {
            policy = argv[++i];
        } else if (!strcmp(a, "--limit") && has_value) {
            const char *v = argv[++i], *why = NULL;
            limit_text = v;
            if (!um__parse_size(v, strlen(v), &limit, &why) || !limit) {
                fprintf(stderr, "unimem " SIM_CMD ": --limit needs a size such as 8G, not '%s'%s%s\n",
                        v, why ? ": " : "", why ? why : "");
                return 2;
            }
        } else if ((!strcmp(a, "--n") || !strcmp(a, "--tile")) && has_value) {
            const char *v = argv[++i];
            sized = a;
            if (!parse_u32(v, !strcmp(a, "--n") ? &n : &tile)) {
                fprintf(stderr, "unimem " SIM_CMD ": %s needs a positive integer, not '%s'\n", a,
                        v);
                return 2;
            }
        } else {
            fprintf(stderr, "unimem " SIM_CMD ": unknown argument '%s'%s\n", a,
                    has_value ? "" : " (or it needs a value)");
            sim_usage(stderr);
            return 2;
        }
    }
    if (!machine || !workload) {
        fprintf(stderr, "unimem " SIM_CMD ": --machine and --workload are required\n");
        sim_usage(stderr);
        return 2;
    }
    int only = -1;
    for (int p = 0; p < 4; p++)
        if (!strcmp(policy, policy_names[p]))
            only = p;
    if (only < 0 && strcmp(policy, "all")) {
        fprintf(stderr,
                "unimem " SIM_CMD ": --policy is eager, round_robin, locality, cost or all, "
                "not '%s'\n",
                policy);
        return 2;
    }
    bool traced = !strncmp(workload, "trace:", 6);
    if (strcmp(workload, "gemm") && strcmp(workload, "cholesky") && (!traced || !workload[6])) {
        fprintf(stderr,
                "unimem " SIM_CMD ": --workload is gemm, cholesky or trace:FILE, not '%s'\n",
                workload);
        return 2;
    }
    if (traced && sized) {
        /* Accepting it would simulate other sizes than the user asked for. */
        fprintf(stderr,
                "unimem " SIM_CMD ": %s does not apply to --workload trace:FILE, whose tasks "
                "have the sizes they were recorded with\n",
                sized);
        return 2;
    }
    if (!traced && n % tile) {
        fprintf(stderr, "unimem " SIM_CMD ": --n %u is not a multiple of --tile %u\n", n, tile);
        return 2;
    }
    um__vs_machine *m = malloc(sizeof *m);
    if (!m) {
        fprintf(stderr, "unimem " SIM_CMD ": out of memory\n");
        return 1;
    }
    um_status st = um__vs_machine_load(machine, m);
    if (st != UM_OK) {
        free(m);
        return tool_fail(SIM_CMD, st);
    }
    /* A device holds whole pages of its granularity (the machine's
     * description may not give one larger than the device), so a limit
     * below one page leaves a device it cuts room for nothing: an argument
     * error, as a limit of 0 is. */
    for (int dev = 1; dev < m->ndev && limit; dev++) {
        const um__vs_device *cut = &m->dev[dev];
        if (cut->memory > limit && limit < cut->granularity) {
            char page[32];
            const char *minimum = size_arg_text(page, cut->granularity);
            fprintf(stderr, "unimem " SIM_CMD ": --limit %s is less than one page of device %s "
                    "(%s, its granularity): give at least %s\n", limit_text, cut->name,
                    minimum, minimum);
            free(m);
            return 2;
        }
    }
    for (int dev = 1; dev < m->ndev && limit; dev++)
        if (m->dev[dev].memory > limit)
            m->dev[dev].memory = limit;
    um__vs_dag d;
    if (traced && (st = um__vs_dag_trace(workload + 6, &d)) != UM_OK) {
        free(m);
        return tool_fail(SIM_CMD, st);
    }
    int built = traced                     ? 0
                : !strcmp(workload, "gemm") ? um__vs_dag_gemm(n, tile, &d)
                                            : um__vs_dag_cholesky(n, tile, &d);
    if (built != 0) {
        fprintf(stderr, "unimem " SIM_CMD ": cannot build the %s graph of n %u, tile %u (too "
                "large, or no memory)\n", workload, n, tile);
        free(m);
        return 1;
    }
    engine_name = runtime ? "runtime" : "model";
    if (!json && traced)
        printf("unimem sim: %s (%zu tasks, %u buffers of up to %.1f MiB) on %s\n", workload,
               d.ntasks, d.ntiles, (double)d.tile_bytes / 1048576.0, m->name);
    else if (!json)
        printf("unimem sim: %s, n %u, tile %u (%zu tasks, %u tiles of %.0f MiB) on %s\n",
               workload, n, tile, d.ntasks, d.ntiles, (double)d.tile_bytes / 1048576.0, m->name);
    int rc = 0;
    um__vs_result *r = malloc(sizeof *r);
    sim_progress sp = {.per_run = d.ntasks, .runs = only >= 0 ? 1 : 4};
    pthread_mutex_init(&sp.lock, NULL);
    pthread_cond_init(&sp.wake, NULL);
    for (int p = 0; p < 4 && r && !rc; p++) {
        if (only >= 0 && p != only)
            continue;
        static const int sched[] = {UM_SCHED_EAGER, UM_SCHED_ROUND_ROBIN, UM_SCHED_LOCALITY,
                                    UM_SCHED_COST};
        char what[48];
        snprintf(what, sizeof what, "%s, %s engine", policy_names[p], engine_name);
        bool drawn = progress_start(&sp, what);
        uint64_t t0 = tool_now_ns(), forced = 0;
        st = runtime ? um__vs_run_runtime(m, &d, sched[p], r, &forced)
                     : um__vs_simulate(m, &d, sched[p], r);
        double wall = (double)(tool_now_ns() - t0) / 1e9;
        progress_stop(&sp, drawn);
        if (st != UM_OK) {
            rc = tool_fail(SIM_CMD, st);
            break;
        }
        if (forced)
            fprintf(stderr, "unimem " SIM_CMD ": the clock was moved %llu times with a thread "
                    "counted as running (a wait it cannot see): times may be early\n",
                    (unsigned long long)forced);
        (json ? print_json : print_text)(m, &d, policy_names[p], r, wall);
    }
    pthread_cond_destroy(&sp.wake);
    pthread_mutex_destroy(&sp.lock);
    if (!r)
        rc = tool_fail(SIM_CMD, UM_ERR_NOMEM);
    free(r);
    um__vs_dag_free(&d);
    free(m);
    return rc;
}
