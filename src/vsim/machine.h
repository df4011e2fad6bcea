/*
 * machine: the machine a virtual-time simulation runs on (vsim). Owns the
 * description format, its parser and the built-in machines, and answers
 * the two questions the simulator asks of a machine: how long a kernel on
 * a tile takes on a device, and which link resources a copy between two
 * devices crosses.
 *
 * A description is a text of lines, `#` starting a comment:
 *
 *   machine name=NAME
 *   device name=NAME [count=N] kind=host|gpu|sim memory=SIZE [granularity=SIZE] [model=M]
 *   link from=DEV to=DEV bandwidth=RATE [latency=SECONDS] [shared=NAME] [switched=1]
 *   compute model=M kernel=K (tile=T seconds=S [packed=S] | gflops=R | fit=A,B,C)
 *
 * The first device line must be the host (device 0). A gpu launches the
 * tasks it holds ahead on its streams, fetching their inputs as it does;
 * a sim (unimem's simulated device) runs one task at a time, as the host
 * does, and prefetches the next tasks' inputs only into free memory (the
 * task runtime's rules for workers that run cpu implementations). A device line with
 * count=N makes N devices NAME0..NAME(N-1); a link's DEV may name such a
 * group, meaning every member (from=gpu to=gpu: every ordered pair of
 * different members). SIZE is in powers of 1024 as options are (141G);
 * RATE is bytes per second with decimal K, M, G, T as vendors quote links
 * (55G = 55e9 B/s); SECONDS takes an optional s, ms or us. Each directed
 * link is a resource of its own, unless links share a name (shared=: one
 * resource for all of them, such as a PCIe switch's single host link), or
 * the link is switched (switched=1: each device has one port into the
 * switch each way, so a copy i->j crosses i's out-port and j's in-port).
 * A copy between two devices with no link between them goes through the
 * host (two links). compute gives a kernel's time on a model's devices:
 * measured points (time between two points and beyond them follows the
 * power law through the nearest two), a rate, or a fit a*T^b + c seconds.
 * A point's packed= is the time one kernel adds while others of the
 * device run beside it (a GPU's streams overlap kernels; tile_times.cu
 * --streams measures it); the simulators use it for a kernel that starts
 * as soon as the device's previous one ends, and seconds= for one that
 * starts on an idle device. Without it, packed is seconds.
 * A model gives a kernel in one form: points (each tile once), one rate
 * or one fit; the machine line comes once.
 * A device whose model has no entry for a kernel cannot run it, except
 * `other` (a recorded task of another name), which then runs at the
 * model's gemm rate for its flops. A fit needs a >= 0, c >= 0 and a + c
 * > 0; where its value is not above 0 (or overflows) the device cannot
 * run the kernel on that tile.
 *
 * Names: no device's name (a group's, or a member's NAMEi) may be
 * another's. A granularity given is a power of two no larger than the
 * memory. Times (latency=, seconds=, packed= and a
 * fit's c) are at most UM_VS_MAX_SECONDS: far beyond any real copy or
 * kernel, and small enough that a run of millions of them stays within
 * the virtual clock's 64-bit nanoseconds. Both engines hold a run to the
 * same bound: no task's kernel, and no copy of its largest tile over any
 * link (um__vs_check_copies), may take longer. Rates (bandwidth=,
 * gflops=) must be finite once their unit is applied, and a shared=
 * name may not hold '->', the form of a link's own resource.
 */
#ifndef UM_VSIM_MACHINE_H
#define UM_VSIM_MACHINE_H

#include "../base/base.h"
#include "dag.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define UM_VS_MAX_DEVICES 64
#define UM_VS_MAX_MODELS 8
#define UM_VS_MAX_POINTS 16
/* The longest latency or kernel time a description may give (seconds). */
#define UM_VS_MAX_SECONDS 1e6
/* Resources: per directed link, or two ports per device and switch, or shared. */
#define UM_VS_MAX_RESOURCES (UM_VS_MAX_DEVICES * UM_VS_MAX_DEVICES + 2 * UM_VS_MAX_DEVICES)

typedef struct um__vs_point {
    uint32_t tile;
    double seconds;
    double packed_seconds;           /* see packed= above */
} um__vs_point;

typedef enum um__vs_cost_kind { UM_VS_COST_NONE, UM_VS_COST_POINTS, UM_VS_COST_RATE, UM_VS_COST_FIT } um__vs_cost_kind;

typedef struct um__vs_cost {
    um__vs_cost_kind kind;
    int npoints;                     /* POINTS: sorted by tile */
    um__vs_point point[UM_VS_MAX_POINTS];
    double gflops;                   /* RATE */
    double a, b, c;                  /* FIT: a * tile^b + c seconds */
} um__vs_cost;

typedef struct um__vs_model {
    char name[32];
    um__vs_cost kernel[UM_VS_NKERNELS];
} um__vs_model;

typedef struct um__vs_device {
    char name[40];
    char group[32];                  /* the device line's name */
    bool host;
    bool launches_ahead;             /* a gpu: see the format above */
    /* capacity: the device's memory as the machine describes it; memory:
     * what it may hold, the capacity or a limit below it (`unimem sim
     * --limit`). The runtime engine makes the device of its capacity and
     * sets the limit as a program sets one on a GPU. */
    uint64_t memory, capacity, granularity;
    int model;                       /* index into models, or -1: runs no kernel */
} um__vs_device;

/* A directed link: the resources a copy over it crosses, and its latency. */
typedef struct um__vs_link {
    bool present;
    int nres;
    int res[2];
    double latency_s;
} um__vs_link;

typedef struct um__vs_machine {
    char name[64];
    int ndev;
    um__vs_device dev[UM_VS_MAX_DEVICES];
    int nmodels;
    um__vs_model model[UM_VS_MAX_MODELS];
    int nres;
    double res_bandwidth[UM_VS_MAX_RESOURCES]; /* bytes per second */
    char res_name[UM_VS_MAX_RESOURCES][96]; /* two device names and "->" fit */
    um__vs_link link[UM_VS_MAX_DEVICES][UM_VS_MAX_DEVICES]; /* [from][to] */
} um__vs_machine;

/* Parses a description; `source` names it in errors (which give the line
 * and the key). The machine is large: callers allocate it. */
um_status um__vs_machine_parse(const char *text, const char *source, um__vs_machine *m);
/* A built-in machine (h200x1, h200x8, pcie4x4) or else a description file. */
um_status um__vs_machine_load(const char *name_or_path, um__vs_machine *m);
/* The built-ins' names, comma separated, and one's text (NULL if none). */
const char *um__vs_builtin_names(void);
const char *um__vs_builtin_text(const char *name);

/* Seconds kernel k takes on a tile of `tile` (flops of it) on device dev;
 * INFINITY where dev cannot run it. */
double um__vs_compute_time(const um__vs_machine *m, int dev, int k, uint32_t tile, double flops);
/* The same while other kernels of the device run beside it (packed=). */
double um__vs_packed_time(const um__vs_machine *m, int dev, int k, uint32_t tile, double flops);
/* The resources a copy from src to dst crosses (up to 4: two links
 * through the host when there is no direct one), into route[]; returns
 * their number (0 when src == dst), -1 when there is no way. *latency_s
 * gets the sum of the links' latencies. Through the host a resource may
 * come twice (links to and from the host sharing one): the copy crosses
 * it twice. */
int um__vs_route(const um__vs_machine *m, int src, int dst, int route[4], double *latency_s);

/* UM_OK when a copy of `bytes` alone takes at most UM_VS_MAX_SECONDS on
 * every link resource of m; else UM_ERR_INVALID naming the slowest one.
 * Both engines ask it of their largest tile: a longer copy swallowed the
 * kernels' times in the model engine's rounding (bandwidth=1e-300: a
 * makespan of 8e306 s with a gemm busy 0 s) and overflowed the runtime
 * engine's nanosecond clock (it hung). */
um_status um__vs_check_copies(const um__vs_machine *m, uint64_t bytes);

#endif /* UM_VSIM_MACHINE_H */
