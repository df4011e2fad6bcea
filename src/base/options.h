/*
 * options: the one option table (name, type, default, doc) and its parser.
 * Values come from UNIMEM_CONF, then from the string given to um_init, then
 * from setters. Owns nothing but the parsed um__options value.
 */
#ifndef UM_OPTIONS_H
#define UM_OPTIONS_H

#include "base.h"

/* X(field, type, default, doc). For UM_OPT_ENUM the accepted words are the
 * '|'-separated list that starts the doc line. A UM_OPT_SIZE option whose
 * doc offers none takes that word too (sizes_with_none in options.c). */
#define UM_OPTION_LIST(X)                                                                     \
    X(log_level, UM_OPT_ENUM, "warn",                                                         \
      "error|warn|info|debug: messages at this level and above go to stderr")                 \
    X(devices, UM_OPT_STRING, "",                                                             \
      "accelerators after the host (device 0), comma or '+' separated: sim:4G, sim:2x4G "    \
      "(two devices; sizes rounded down to whole pages of sim_granularity), cuda (every CUDA " \
      "GPU), cuda:N (GPU N); empty: host only")                                               \
    X(allocator, UM_OPT_ENUM, "pool",                                                         \
      "pool|direct|bufcache: unimem's pool, no cache (every request to the backend), or an " \
      "MLX-style buffer cache (baselines)")                                                   \
    X(memory_limit, UM_OPT_SIZE, "0",                                                         \
      "cap on reserved bytes per device; 0 = the device capacity")                            \
    X(cache_limit, UM_OPT_SIZE, "none",                                                       \
      "cap on cached bytes (free pages, cached small slots) a device keeps; none = no cap; " \
      "0 = no cache, as MLX's set_cache_limit(0): free pages go back to the backend")        \
    X(sim_granularity, UM_OPT_SIZE, "2M",                                                     \
      "physical page size of simulated devices (CUDA VMM granularity on an H200)")            \
    X(sim_link_bandwidth, UM_OPT_SIZE, "0",                                                   \
      "bytes per second of each simulated device's link to the host, each direction (e.g. "  \
      "16G); copies keep the engine's copy streams busy for that long; 0: no model (copies " \
      "take the memcpy's time)")                                                              \
    X(virtual_time, UM_OPT_BOOL, "0",                                                         \
      "run in virtual time: sim devices hold no data, copies and tasks take their modelled " \
      "time (sim_link_bandwidth, sim_gflops) on a clock that jumps from event to event "     \
      "(`unimem sim --engine runtime`); sim devices only, one context at a time")            \
    X(host_granularity, UM_OPT_SIZE, "2M", "physical page size of the host pool")             \
    X(host_capacity, UM_OPT_SIZE, "0",                                                        \
      "bytes the host pool may use, rounded down to whole pages; 0 = physical RAM")          \
    X(thread_cache, UM_OPT_BOOL, "1",                                                         \
      "per-thread caches of small blocks (no lock on the common alloc/free pair)")            \
    X(va_factor, UM_OPT_INT, "4",                                                             \
      "virtual address space reserved per device, as a multiple of its capacity")             \
    X(recycle_pages, UM_OPT_ENUM, "auto",                                                     \
      "auto|1|0: 1 moves free pages to where an allocation needs them (reserved follows "    \
      "live memory); 0 creates pages instead while under the memory limit, as a caching "    \
      "allocator does (no page moves on a GPU, more memory); auto recycles while the step "  \
      "planner learns (the first 16384 large allocations, and after a plan stops), then "    \
      "caches, recycling at the memory limit; with plan=0, always")                          \
    X(fence_wait_us, UM_OPT_INT, "0",                                                         \
      "before growing past its peak, a pool waits for stream fences at least this many "     \
      "microseconds old (the device is still busy behind them); 0 never waits")              \
    X(plan, UM_OPT_BOOL, "1",                                                                 \
      "step planning: when the large allocations repeat with a period (a training step), "   \
      "place them by a plan made from one period, in an arena mapped once (no page moves); "  \
      "while it looks for the period a pool waits for fences rather than grow")               \
    X(defer_frees, UM_OPT_BOOL, "1",                                                          \
      "a freed large block (up to 1/2048 of the reserved bytes) waits, still mapped and "    \
      "uncoalesced, for an allocation on its stream at most 1/16 smaller; up to 1/32 of "   \
      "the reserved bytes wait, and all go back before the pool would move or create a "    \
      "page (one stream fencing, no step plan)")                                              \
    X(medium_slabs, UM_OPT_BOOL, "1",                                                         \
      "requests of 32 KiB-1 MiB come from slabs (16 slots each, 4 above 256 KiB; the "     \
      "thread caches' fast path) "                                                            \
      "while the frees of one stream alone fence pages; from the first large free on a "     \
      "second stream they take the large path, whose placement keeps less memory")           \
    X(cross_stream_reuse, UM_OPT_BOOL, "1",                                                   \
      "at its memory limit, where it would move pages or wait, the pool takes mapped memory " \
      "that other streams freed and makes the allocating stream wait on the device for "    \
      "their frees, as CUDA's pools do (internal dependencies); 0: moves pages, or waits "  \
      "on the host")                                                                          \
    X(host_memory, UM_OPT_ENUM, "auto",                                                       \
      "auto|pinned|pageable: host pool memory; auto pins it (CUDA VMM host pages) when "      \
      "devices lists a GPU and the driver can, else pageable")                                \
    X(cuda_vmm, UM_OPT_BOOL, "1",                                                             \
      "GPU pages through CUDA virtual memory management; 0 (or a GPU without it) uses "      \
      "cuMemAlloc segments under the buffer cache allocator instead of the pool")            \
    X(cuda_page_size, UM_OPT_SIZE, "0",                                                       \
      "physical page size of GPU memory through VMM: 0 = the driver's minimum granularity "  \
      "(2M on an H200), else a power of two at least that; larger pages take fewer driver "  \
      "calls as the pool grows or moves pages, and recycle memory more coarsely")            \
    X(large_page, UM_OPT_SIZE, "0",                                                           \
      "0 = off, else a power of two up to 64 of a device's pages: one chunk of this size "   \
      "backs each aligned run of that many pages inside an allocation, taking one create "   \
      "and one map where pages take one each, and moving or going back only whole; single " \
      "pages fill the rest, so recycling stays fine where it is needed")                     \
    X(host_large_page, UM_OPT_SIZE, "32M",                                                    \
      "large_page for the host pool when its memory is pinned, where every page costs "      \
      "driver calls (create, map, access) that pinning makes slow: 0 = off; the default "   \
      "is at most 64 of the host's pinned pages; pageable host memory takes large_page as "  \
      "the other devices do")                                                                \
    X(copy_threads, UM_OPT_INT, "0",                                                          \
      "host threads that copy program (pageable) memory through pinned staging buffers "     \
      "for a GPU copy; 0 = half the online CPUs, at most 8")                                  \
    X(copy_chunk, UM_OPT_SIZE, "2M",                                                          \
      "bytes per staged chunk of a copy between program memory and a GPU")                    \
    X(peer_copies, UM_OPT_BOOL, "1",                                                          \
      "GPU-to-GPU copies go directly where the driver allows peer access; 0 always takes "   \
      "two hops through pinned host memory, pipelined in chunks")                             \
    X(watermark_high, UM_OPT_INT, "90",                                                       \
      "percent of a device's memory limit: when its buffer replicas hold more, the "         \
      "background reclaimer evicts them (100: never)")                                        \
    X(watermark_low, UM_OPT_INT, "80",                                                        \
      "percent of the memory limit the background reclaimer brings a device's buffer "       \
      "replicas down to")                                                                     \
    X(evict_policy, UM_OPT_ENUM, "cost",                                                      \
      "cost|lru: which replica to evict: cost prefers free, clean, large, unannounced and "  \
      "WONT_USE buffers and otherwise the farthest announced use; lru the least recently "   \
      "used")                                                                                 \
    X(spill_dir, UM_OPT_STRING, "",                                                           \
      "directory of the file tier: when host memory is full, buffer data with no other "     \
      "copy goes to a file made there (removed at exit) instead of failing; empty: no file " \
      "tier")                                                                                 \
    X(links, UM_OPT_ENUM, "measure",                                                          \
      "measure|model: the link costs that pick a copy's source: measured once (then read "   \
      "from link_cache), or a fixed model by device kind")                                    \
    X(sched, UM_OPT_ENUM, "cost",                                                            \
      "eager|round_robin|locality|cost: where a ready task runs: the first idle device, "     \
      "each device in turn, the device holding most of its input bytes, or the earliest "   \
      "estimated finish (queued work + missing inputs' transfer + compute time learned "   \
      "per task name and size)")                                                              \
    X(host_tasks, UM_OPT_BOOL, "1",                                                           \
      "whether the host runs tasks; 0: only accelerators (GPUs, simulated devices) run "   \
      "them, as StarPU with STARPU_NCPU=0, and a task with no accelerator implementation "  \
      "is refused at submission")                                                             \
    X(sim_gflops, UM_OPT_INT, "0",                                                            \
      "compute speed of simulated devices for tasks that give flops: a task takes at least " \
      "flops / (this x 1e9) seconds there; 0: as fast as the host runs it")                  \
    X(trace_file, UM_OPT_STRING, "",                                                          \
      "write events (allocations, frees, backend memory calls, trims, copies, evictions, "    \
      "reclaim passes, tasks) to this file as Chrome trace JSON, for Perfetto, "              \
      "chrome://tracing or unimem timeline; empty: no recording")                             \
    X(task_trace, UM_OPT_STRING, "",                                                          \
      "write every submitted task (name, flops, buffers with sizes and modes) to this file, "  \
      "for unimem sim --workload trace:FILE; empty: no recording")                            \
    X(link_cache, UM_OPT_STRING, "",                                                          \
      "file of link measurements by machine; empty: $XDG_CACHE_HOME/unimem/links (or "      \
      "~/.cache/unimem/links); none: measure at every start")                                \
    X(fault, UM_OPT_STRING, "",                                                               \
      "fault injection, for tests: '+'-separated [DEV:]KIND@N (the Nth call of KIND fails) "  \
      "or [DEV:]KIND~P (each fails with probability P); KIND: reserve, unreserve, create, "   \
      "release, map, unmap, copy, event, stream, any; empty: none")                           \
    X(fault_seed, UM_OPT_INT, "1", "seed of fault's random failures")

typedef struct um__options {
    int log_level;          /* um_log_level */
    char devices[256];
    int allocator;          /* um__allocator_kind */
    size_t memory_limit;
    size_t cache_limit;
    size_t sim_granularity;
    size_t sim_link_bandwidth;
    int virtual_time;
    size_t host_granularity;
    size_t host_capacity;
    int thread_cache;
    int va_factor;
    int recycle_pages;      /* um__recycle */
    int fence_wait_us;
    int plan;
    int defer_frees;
    int medium_slabs;
    int cross_stream_reuse;
    int host_memory;        /* um__host_memory */
    int cuda_vmm;
    size_t cuda_page_size;
    size_t large_page;
    size_t host_large_page;
    int copy_threads;
    size_t copy_chunk;
    int peer_copies;
    int watermark_high;
    int watermark_low;
    int evict_policy;       /* um__evict_policy */
    char spill_dir[256];
    int links;              /* um__links */
    int sched;              /* um__sched */
    int host_tasks;
    int sim_gflops;
    char trace_file[256];
    char task_trace[256];
    char link_cache[256];
    char fault[256];
    int fault_seed;
} um__options;

typedef enum um__links { UM_LINKS_MEASURE = 0, UM_LINKS_MODEL = 1 } um__links;
typedef enum um__sched {
    UM_SCHED_EAGER = 0,
    UM_SCHED_ROUND_ROBIN = 1,
    UM_SCHED_LOCALITY = 2,
    UM_SCHED_COST = 3
} um__sched;
typedef enum um__evict_policy { UM_EVICT_COST = 0, UM_EVICT_LRU = 1 } um__evict_policy;

typedef enum um__host_memory {
    UM_HOST_MEMORY_AUTO = 0,
    UM_HOST_MEMORY_PINNED = 1,
    UM_HOST_MEMORY_PAGEABLE = 2
} um__host_memory;

typedef enum um__allocator_kind {
    UM_ALLOCATOR_POOL = 0,
    UM_ALLOCATOR_DIRECT = 1,
    UM_ALLOCATOR_BUFCACHE = 2
} um__allocator_kind;

/* Whether a string value would end at one of its commas and start another
 * option there (a ',' followed by "KEY=", as um__options_apply splits
 * them): a tool that puts a user's file name into a configuration string
 * refuses such a name rather than set options nobody asked for. */
bool um__options_value_splits(const char *value);
/* Fills every field with its default from the table. */
void um__options_defaults(um__options *o);
/* Applies "key=value,key=value" (whitespace around tokens ignored; NULL or
 * "" applies nothing). An unknown key or bad value fails with
 * UM_ERR_BAD_OPTION and a message naming the key, the value and `source`
 * ("UNIMEM_CONF" or "um_init"); *o is then unchanged. A string value may
 * contain commas (a device list; a path): it runs up to the next ',' that
 * is followed by "word=", where the word is made of letters, digits, '_',
 * '-', '.' and spaces, whether or not it names an option, so a misspelled
 * key after a string is reported as unknown instead of becoming part of the
 * value. Device lists (sim:2x64M+cuda), fault specs and paths with '/'
 * after a comma keep their commas; a value holding ",word=" (a path such as
 * /tmp/a,b=c) cannot be written. '+' also separates devices. */
um_status um__options_apply(um__options *o, const char *conf, const char *source);
/* The value of option `index` in o as text (what the parser would take
 * back: a byte count for sizes, the word for enums) into buf. */
um_status um__options_format(const um__options *o, int index, char *buf, size_t len);
/* Parses text[0..len) as a size with an optional K, M, G or T suffix
 * (powers of 1024), as options are; false with *why saying what is wrong.
 * A fraction needs a unit (1.5K; "1.5" bytes is refused), and a value that
 * is not 0 but comes to less than one byte (0.0001K) is refused. */
bool um__parse_size(const char *text, size_t len, size_t *out, const char **why);
/* Name of an allocator kind ("pool", ...). */
const char *um__allocator_name(int kind);

#endif /* UM_OPTIONS_H */
