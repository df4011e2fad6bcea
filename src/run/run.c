/* Tasks, dependencies and per-device workers; see run.h. */
#include "run.h"

#include "../base/addrmap.h"
#include "../base/vtime.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Tasks prefetched ahead of the one running, per worker. */
#define PREFETCH_AHEAD 2
/* Tasks a worker holds (running and queued): ready tasks beyond that wait
 * unplaced, so each is placed as late as its device can take it, with the
 * load and history of that moment. */
#define QUEUE_MAX (PREFETCH_AHEAD + GPU_IN_FLIGHT + 1)
/* Tasks a GPU worker launches ahead, one stream each. */
#define GPU_IN_FLIGHT 4

enum { WAITING, READY, RUNNING, DONE };
/* A task id's outcome, kept after its record is freed. */
enum { ID_PENDING = 0, ID_OK = 1, ID_FAILED = 2, ID_CANCELLED = 3 };
/* Buffers a worker prefetches at most: the inputs of the tasks ahead. */
#define PREFETCH_SLOTS (PREFETCH_AHEAD * UM_TASK_MAX_BUFFERS)

typedef struct task task;

/* A task that waits for another; `fails_with`: it uses what that one
 * makes (it reads the data the other writes), so it fails if that one
 * fails. A write after a read, and a WRITE_DISCARD after a write, only
 * wait: a repair runs whether the task it follows failed before or after
 * it was submitted. */
typedef struct edge {
    task *to;
    bool fails_with;
} edge;

/* Settled: a task is DONE and so is every task it waits for, so what it
 * did (or did not do) to its buffers is final. A task that ran settles
 * when it ends; one that ends without running (cancelled, or failed with a
 * dependency) settles only once the tasks it waited for have, and until
 * then orders the tasks after it as if it were still to run (found by the
 * stress test: a later writer overtook the tasks a cancelled one waited
 * for). */
struct task {
    um_task t;
    um_task_id id;
    int state;
    int ndeps;              /* unsettled tasks it waits for */
    struct edge *dependents; /* tasks that wait for it */
    int ndependents, dependents_cap;
    int dev;                /* where it runs, once ready */
    double est_ns;          /* its estimated compute time there */
    size_t bytes;           /* its working set */
    int reserved;           /* edges a task being submitted will add (0 otherwise) */
    um_task_id failed_dep;  /* a dependency that failed before it was submitted */
    task *next;             /* in a worker's queue, the ready list, or a list of finished tasks */
    bool retired;           /* its callback ran; freed once settled */
    /* Once it has ended: the device whose worker's thread runs its done
     * callback and then publishes its outcome, or -1 for another thread
     * (the one that finished it: see mark_done). */
    int callback_dev;
    task *work_next;        /* in finish's worklists */
    /* In waits_for_workers' search only (false outside it): marked, and
     * the next task marked. */
    bool marked;
    task *marked_next;
    um_status status;
    /* The program's name copied (t.name points here, or is NULL): a name
     * in a buffer the program reuses after submitting was read later by
     * placement's history, the messages and the trace. */
    char name[UM_TASK_NAME_MAX];
    /* The tickets of the WILL_USE announcements make_ready made for its
     * buffers (0: none), withdrawn if it ends without acquiring them. */
    uint64_t announced[UM_TASK_MAX_BUFFERS];
    /* Devices ruled out for it (a bit each): its buffers could not be had
     * there for lack of memory (place_again). */
    uint64_t excluded;
};

/* What tasks do with one buffer: its last writer and the readers since
 * (ids), and how many unfinished tasks use it. An open-addressing table
 * keyed by the buffer's address. */
typedef struct access_rec {
    const um_buffer *b; /* NULL: empty; TOMBSTONE: removed */
    um_task_id writer;
    um_task_id *readers;
    uint32_t nreaders, readers_cap;
    uint32_t pending;
    uint64_t trace_id;  /* the buffer's number in the task trace */
} access_rec;
#define TOMBSTONE ((const um_buffer *)1)

/* Why a task failed or was cancelled, kept for um_task_wait for the
 * context's life (any failed id may be asked about), so kept small: a
 * task that failed with a task it depends on keeps only that task's id,
 * and its message is made again when asked for (failure_message). Found
 * through a table keyed by id: a list scanned per lookup made 80,000
 * submissions reading a buffer whose writer failed take 18 s, and each
 * kept 528 bytes. */
enum {
    FAILED_ITSELF,   /* its own reason (ran and failed, not had, cancelled) */
    FAILED_WITH,     /* a task it uses the output of failed after it was submitted */
    FAILED_AT_SUBMIT /* ... had failed before it was submitted */
};
typedef struct failure {
    um_task_id cause; /* FAILED_WITH, FAILED_AT_SUBMIT: the task it failed with */
    uint8_t how;
    bool cause_cancelled;
    char *text;       /* its name, a NUL, then (FAILED_ITSELF) its reason; NULL: no memory */
} failure;

typedef struct worker {
    um__run *r;
    int dev;
    pthread_t tid;
    bool started;
    um__cond wake;
    task *head, *tail;
    /* The buffers it is about to prefetch (the inputs of the tasks after
     * the one it took), a prefix of the array: set under the lock when it
     * takes a task, cleared from the last once prefetched. A buffer here
     * is not forgotten (destroyed) until then: the cancel of its only
     * queued task let um_buffer_destroy succeed and a new buffer reuse
     * the handle while the worker was prefetching it. */
    um_buffer *_Atomic prefetching[PREFETCH_SLOTS];
    int nprefetching;       /* set in prefetching[] (only its own thread's) */
    int queued;             /* queued and running */
    double queued_ns;
    /* Its thread runs done callbacks (ended's retire): it takes no task
     * until they return (placement sees it full), so a callback that
     * waits for a dependent of its task does not find that dependent
     * queued behind itself. Set only for the tasks that have callbacks. */
    bool in_callbacks;
    /* A done callback on its thread waits for an unfinished task
     * (um_task_wait): placement leaves it out until the wait returns, and
     * the tasks queued on it went back to the ready list, for the other
     * devices. */
    bool waiting;
    /* While waiting: the id of the task that wait is for. Kept as an id,
     * not a pointer: the task's record is freed once it settles, before
     * this thread wakes. */
    um_task_id awaited;
    um_stream stream;                    /* the first of streams[] */
    um_stream streams[GPU_IN_FLIGHT];    /* a GPU's; one elsewhere */
    int nstreams;
    _Atomic uint64_t tasks, failed, busy_ns, waited_ns, bytes_in;
} worker;

struct um__run {
    um_context *ctx;
    pthread_mutex_t lock;
    um__cond finished; /* some task finished */
    bool quit;
    um__place *place;
    worker w[UM_MAX_DEVICES];
    task *ready_head, *ready_tail; /* ready, not placed yet (device queues full) */
    uint8_t *outcome;        /* per id (index id - 1) */
    uint64_t nids, ids_cap;
    /* The records that exist (unfinished, or unsettled), by id: a table
     * of those only (an array per id kept 8 bytes for every task ever
     * submitted). */
    um__addrmap tasks;
    uint64_t unfinished;
    um__addrmap failures;    /* failed and cancelled tasks' reasons (failure *), by id */
    um_task_id first_failed; /* not yet reported by um_wait_all */
    _Atomic int destroy_waiters; /* forget_buffer calls waiting for a prefetch to end */
    access_rec *recs;
    size_t recs_cap, recs_used;
    FILE *task_trace;        /* option task_trace, or NULL */
    uint64_t trace_buffers;  /* buffers numbered in it so far */
};

/* ------------------------------------------------------ access records */

static size_t rec_hash(const um_buffer *b, size_t cap)
{
    uint64_t h = (uint64_t)(uintptr_t)b * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 20) & (cap - 1);
}

static access_rec *rec_find(um__run *r, const um_buffer *b)
{
    if (!r->recs_cap)
        return NULL;
    for (size_t i = rec_hash(b, r->recs_cap), n = 0; n < r->recs_cap;
         i = (i + 1) & (r->recs_cap - 1), n++) {
        if (r->recs[i].b == b)
            return &r->recs[i];
        if (!r->recs[i].b)
            return NULL;
    }
    return NULL;
}

static bool recs_grow(um__run *r)
{
    size_t cap = r->recs_cap ? 2 * r->recs_cap : 256;
    access_rec *old = r->recs, *n = calloc(cap, sizeof *n);
    if (!n)
        return false;
    size_t old_cap = r->recs_cap;
    r->recs = n;
    r->recs_cap = cap;
    r->recs_used = 0;
    for (size_t i = 0; i < old_cap; i++) {
        if (!old[i].b || old[i].b == TOMBSTONE)
            continue;
        size_t j = rec_hash(old[i].b, cap);
        while (n[j].b)
            j = (j + 1) & (cap - 1);
        n[j] = old[i];
        r->recs_used++;
    }
    free(old);
    return true;
}

/* b's record, made if new; NULL when no memory. */
static access_rec *rec_get(um__run *r, const um_buffer *b)
{
    access_rec *a = rec_find(r, b);
    if (a)
        return a;
    if ((r->recs_used + 1) * 2 > r->recs_cap && !recs_grow(r))
        return NULL;
    size_t i = rec_hash(b, r->recs_cap);
    while (r->recs[i].b && r->recs[i].b != TOMBSTONE)
        i = (i + 1) & (r->recs_cap - 1);
    if (!r->recs[i].b)
        r->recs_used++;
    r->recs[i] = (access_rec){b, 0, NULL, 0, 0, 0, ++r->trace_buffers};
    return &r->recs[i];
}

static task *unsettled(const um__run *r, um_task_id id);

/* Room in a's reader list for one more (locked); false when no memory.
 * A full list first drops the readers that have settled, which order
 * nothing any more (a writer waits only for unsettled ones): a buffer
 * that is only read kept 8 bytes per read for good. It grows only when
 * that leaves it over half full, so it is looked through once per half
 * list of readers added. */
static bool reserve_reader(const um__run *r, access_rec *a)
{
    if (a->nreaders < a->readers_cap)
        return true;
    uint32_t kept = 0;
    for (uint32_t k = 0; k < a->nreaders; k++)
        if (unsettled(r, a->readers[k]))
            a->readers[kept++] = a->readers[k];
    a->nreaders = kept;
    if (a->readers_cap && kept <= a->readers_cap / 2)
        return true;
    uint32_t cap = a->readers_cap ? 2 * a->readers_cap : 4;
    um_task_id *n = realloc(a->readers, cap * sizeof *n);
    if (!n)
        return false;
    a->readers = n;
    a->readers_cap = cap;
    return true;
}

/* Appends a reader; the room was reserved (reserve_reader). */
static void add_reader(access_rec *a, um_task_id id)
{
    a->readers[a->nreaders++] = id;
}

/* --------------------------------------------------------- ids, failures */

static uint8_t outcome_of(um_status st)
{
    return st == UM_OK ? ID_OK : st == UM_ERR_CANCELLED ? ID_CANCELLED : ID_FAILED;
}

/* The record of task `id` while it exists, else NULL (locked). */
static task *task_of(const um__run *r, um_task_id id)
{
    uint64_t t;
    return um__addrmap_get(&r->tasks, id, &t) ? (task *)(uintptr_t)t : NULL;
}

/* The unsettled task `id` names, which a task submitted now waits for;
 * NULL when none (locked). */
static task *unsettled(const um__run *r, um_task_id id)
{
    task *d = id ? task_of(r, id) : NULL;
    return d && !(d->state == DONE && d->ndeps == 0) ? d : NULL;
}

/* The failure record of `id`, or NULL (none, or its memory was lacking). */
static const failure *failure_of(const um__run *r, um_task_id id)
{
    uint64_t f;
    return um__addrmap_get(&r->failures, id, &f) ? (const failure *)(uintptr_t)f : NULL;
}

static const char *task_name(const task *t)
{
    return t->t.name ? t->t.name : "task";
}

/* Copies name into out (UM_TASK_NAME_MAX bytes), cut, if it is longer, at
 * the start of a UTF-8 character, so that the copy never ends inside one
 * (trace viewers refuse such a string). */
static void copy_name(char *out, const char *name)
{
    size_t n = strnlen(name, UM_TASK_NAME_MAX);
    if (n == UM_TASK_NAME_MAX) {
        n = UM_TASK_NAME_MAX - 1;
        while (n > 0 && ((unsigned char)name[n] & 0xc0) == 0x80)
            n--; /* name[n], the first byte cut off, continues a character */
    }
    memcpy(out, name, n);
    out[n] = '\0';
}

/* Keeps why t failed (locked): `why`, its own reason, or (how
 * FAILED_WITH, FAILED_AT_SUBMIT) the failed task `cause` it depends on.
 * Without memory the outcome is still known, only the message is lost. */
static void note_failure(um__run *r, const task *t, const char *why, uint8_t how, um_task_id cause,
                         bool cause_cancelled)
{
    failure *f = malloc(sizeof *f);
    if (!f || !um__addrmap_put(&r->failures, t->id, (uint64_t)(uintptr_t)f)) {
        free(f);
        return;
    }
    const char *name = task_name(t);
    size_t nlen = strlen(name), wlen = how == FAILED_ITSELF ? strlen(why) : 0;
    char *text = malloc(nlen + 1 + wlen + 1);
    if (text) {
        memcpy(text, name, nlen + 1);
        memcpy(text + nlen + 1, how == FAILED_ITSELF ? why : "", wlen + 1);
    }
    *f = (failure){cause, how, cause_cancelled, text};
}

/* Past this many tasks failing at submission one after another, a message
 * is cut anyway (each quotes 160 bytes of its cause's, after its own 40 or
 * more), so making the older ones is not needed. */
#define MESSAGE_DEPTH 8

/* The message of failed task `id` into out (len bytes), as it was when it
 * failed: its own reason, or made from the task it failed with. */
static void failure_message(const um__run *r, um_task_id id, char *out, size_t len, int depth)
{
    const failure *f = failure_of(r, id);
    if (!f || !f->text) {
        snprintf(out, len, "task %llu failed (no memory was left for its message)",
                 (unsigned long long)id);
        return;
    }
    const char *which = f->cause_cancelled ? "was cancelled" : "failed";
    if (f->how == FAILED_ITSELF) {
        snprintf(out, len, "%s", f->text + strlen(f->text) + 1);
    } else if (f->how == FAILED_WITH) {
        const failure *c = failure_of(r, f->cause);
        snprintf(out, len, "task %llu (%s) depends on task %llu (%s), which %s",
                 (unsigned long long)id, f->text, (unsigned long long)f->cause,
                 c && c->text ? c->text : "task", which);
    } else {
        char cause[256] = "";
        if (depth < MESSAGE_DEPTH)
            failure_message(r, f->cause, cause, sizeof cause, depth + 1);
        snprintf(out, len, "task %llu (%s) depends on task %llu, which %s%s%.160s",
                 (unsigned long long)id, f->text, (unsigned long long)f->cause, which,
                 cause[0] ? ": " : "", cause);
    }
}

/* ------------------------------------------------------------- placing */

/* Whether device d may run t: t has an implementation for d's kind, and d
 * is not the host with the option host_tasks off. */
static bool runs_on(const um_context *ctx, const um_task *t, int d)
{
    const um__backend *b = ctx->devices[d].backend;
    if (d == 0 && !ctx->opts.host_tasks)
        return false;
    return b->kind == UM_DEVICE_CUDA ? t->cuda != NULL : t->cpu != NULL;
}

/* Whether t may run on device d: forced there or not forced, d's worker
 * runs, and t has an implementation for d's kind. */
static bool eligible_on(const um__run *r, const task *t, int d)
{
    return (t->t.device < 0 || t->t.device == d) && r->w[d].started &&
           !((t->excluded >> d) & 1) && runs_on(r->ctx, &t->t, d);
}

/* Whether w's worker takes a task now (locked): it runs, its queue has
 * room, and its thread is neither in done callbacks nor waiting in one. */
static bool takes_tasks(const worker *w)
{
    return w->started && w->queued < QUEUE_MAX && !w->in_callbacks && !w->waiting;
}

/* The bytes t's buffers take on dev at least: their sum rounded up to
 * whole pages of dev's granularity, as the pool reserves memory (it packs
 * blocks across page boundaries, so three of 2 MiB + 4 KiB fit in four 2
 * MiB pages, and rounding each buffer would turn such tasks away); SIZE_MAX
 * when that overflows. Placement, the check of a forced device and the
 * choice of a device to fail on compare this with the memory limit: the
 * plain sum let through a task whose buffers could not all be had there
 * (three of 4 MiB + 4 KiB, seven pages, under a limit of 13 MiB). */
static size_t task_footprint(const um_context *ctx, const um_task *t, int dev)
{
    size_t page = ctx->devices[dev].backend->granularity, bytes = 0;
    for (int i = 0; i < t->nbuffers; i++) {
        size_t size = um_buffer_size(t->buffers[i]);
        if (size > SIZE_MAX - bytes)
            return SIZE_MAX;
        bytes += size;
    }
    if (!um__is_pow2(page))
        return bytes;
    return bytes > SIZE_MAX - (page - 1) ? SIZE_MAX : um__align_up(bytes, page);
}

static void fill_place_task(um__run *r, const task *t, um__place_task *pt)
{
    memset(pt, 0, sizeof *pt);
    pt->name = t->t.name;
    pt->flops = t->t.flops;
    pt->nbuffers = t->t.nbuffers;
    pt->buffers = t->t.buffers;
    pt->owner = t;
    pt->modes = t->t.modes;
    pt->bytes = t->bytes;
    for (int d = 0; d < r->ctx->ndevices; d++)
        pt->eligible[d] = eligible_on(r, t, d);
}

/* The devices t may run on, and how many of them have room now. */
static int eligible_devices(const um__run *r, const task *t, int *open)
{
    int n = 0;
    *open = 0;
    for (int d = 0; d < r->ctx->ndevices; d++) {
        bool ok = eligible_on(r, t, d);
        n += ok;
        *open += ok && takes_tasks(&r->w[d]);
    }
    return n;
}

/* Whether t may run on device d and its buffers fit under d's memory
 * limit (the host's is not limited). */
static bool fits_on(const um__run *r, const task *t, int d)
{
    return eligible_on(r, t, d) &&
           (d == 0 || task_footprint(r->ctx, &t->t, d) <=
                          atomic_load_explicit(&r->ctx->devices[d].alloc->memory_limit,
                                               memory_order_relaxed));
}

/* For a task whose buffers fit under no eligible device's memory limit
 * (the policy never places it there; limits lowered since its submission
 * can leave it so): an eligible device with room in its queue, where its
 * acquisition fails with the reason and ends it; -1 if it fits somewhere
 * or no such queue has room. Without it the task waited for ever, and so
 * did um_task_wait and um_shutdown. */
static int device_to_fail_on(const um__run *r, const task *t)
{
    for (int d = 0; d < r->ctx->ndevices; d++)
        if (fits_on(r, t, d))
            return -1;
    for (int d = 0; d < r->ctx->ndevices; d++)
        if (eligible_on(r, t, d) && takes_tasks(&r->w[d]))
            return d;
    return -1;
}

/* Puts t in the list *head..*tail after every task of its priority or a
 * higher one, so a list runs by priority and, within one, in order. */
static void enqueue(task **head, task **tail, task *t)
{
    t->next = NULL;
    if (!*tail || (*tail)->t.priority >= t->t.priority) {
        if (*tail)
            (*tail)->next = t;
        else
            *head = t;
        *tail = t;
        return;
    }
    task **pp = head;
    while ((*pp)->t.priority >= t->t.priority)
        pp = &(*pp)->next;
    t->next = *pp;
    *pp = t;
}

/* Tries to place t (ready) now: true when it went to a device's queue,
 * false when its device should be one whose queue is full (locked). */
static bool place_now(um__run *r, task *t)
{
    um__place_task pt;
    fill_place_task(r, t, &pt);
    um__place_device devs[UM_MAX_DEVICES];
    for (int d = 0; d < r->ctx->ndevices; d++) {
        /* A worker whose callback waits is left out: the wait may be for
         * this very task. One only in callbacks is full: a policy that
         * wants it (its data is there) waits for it. */
        if (r->w[d].waiting)
            pt.eligible[d] = false;
        devs[d] = (um__place_device){r->w[d].queued_ns, r->w[d].queued, !takes_tasks(&r->w[d])};
    }
    t->dev = um__place_pick(r->place, &pt, devs, &t->est_ns);
    if (t->dev < 0) {
        t->dev = device_to_fail_on(r, t);
        t->est_ns = 0;
    }
    if (t->dev < 0)
        return false;
    worker *w = &r->w[t->dev];
    t->state = READY;
    enqueue(&w->head, &w->tail, t);
    w->queued++;
    w->queued_ns += t->est_ns;
    um__cond_signal(&w->wake);
    return true;
}

/* Consecutive ready tasks with a choice of devices that dispatch may find
 * waiting before it stops: each costs a placement (every input's state on
 * every device), and when the tasks at the head wait for a busy device
 * those behind them mostly do too. Without a cap, dispatch looked at every
 * waiting task after every task's end (hundreds at the SGEMM demo's tile
 * 2048) and the host fell behind a GPU running 0.35 ms tasks. Tasks that
 * can run on one device only are still looked at past the cap (they are
 * cheap to decide, and a Cholesky's POTRF is one). */
#define DISPATCH_MISSES 16

/* Places the waiting ready tasks, oldest first, while devices have room
 * in their queues (locked). */
static void dispatch(um__run *r)
{
    task **pp = &r->ready_head, *prev = NULL;
    int misses = 0;
    while (*pp) {
        bool room = false;
        for (int d = 0; d < r->ctx->ndevices; d++)
            room |= takes_tasks(&r->w[d]);
        if (!room)
            return;
        task *t = *pp;
        task *next = t->next;
        int open;
        bool choice = eligible_devices(r, t, &open) > 1;
        if (open && (!choice || misses < DISPATCH_MISSES) && place_now(r, t)) {
            *pp = next;
            if (r->ready_tail == t)
                r->ready_tail = prev;
            misses = 0;
        } else {
            prev = t;
            pp = &t->next;
            misses += choice && open;
        }
    }
}

/* t's dependencies are done (locked): its buffers are announced (reclaim
 * keeps them where it can; the tickets are kept, to withdraw them if it
 * ends without acquiring them), and it waits in the ready list for a
 * place. */
static void make_ready(um__run *r, task *t)
{
    for (int i = 0; i < t->t.nbuffers; i++)
        (void)um__buffer_announce(t->t.buffers[i], &t->announced[i]);
    t->state = READY;
    t->dev = -1;
    enqueue(&r->ready_head, &r->ready_tail, t);
    dispatch(r);
}

/* Withdraws t's announcements of the buffers it will not acquire now: all
 * (held NULL) or those not held. Each announcement stands for one coming
 * use; a cancelled task's, or one whose acquisition stopped at a buffer
 * that could not be had, stayed for good, and reclaim then kept the
 * buffer as needed soon over the program's UM_HINT_WONT_USE. Takes only
 * buffer locks, so it runs locked or not. */
static void withdraw(task *t, const bool *held)
{
    for (int i = 0; i < t->t.nbuffers; i++)
        if (t->announced[i] && !(held && held[i])) {
            um__buffer_withdraw(t->t.buffers[i], t->announced[i]);
            t->announced[i] = 0;
        }
}

/* ----------------------------------------------------------- finishing */

static void free_task(um__run *r, task *t)
{
    (void)um__addrmap_take(&r->tasks, t->id, NULL);
    free(t->dependents);
    free(t);
}

/* The worker whose thread this is, NULL on other threads: a done
 * callback that waits holds it (leave_for_wait). */
static _Thread_local worker *worker_here;

/* t has ended with st (locked): its state, why it failed (its own reason
 * `why`, or with how FAILED_WITH or FAILED_AT_SUBMIT the failed task
 * `cause`), its buffers' records, and onto *done for its callback. Its
 * status is one that um_task_wait returns: UM_OK, UM_ERR_CANCELLED, or
 * UM_ERR_TASK for any failure, whose own status (a buffer that could not
 * be had: UM_ERR_NOMEM, UM_ERR_BUSY, UM_ERR_BACKEND) stays in `why`. The
 * done callback got that raw status while the waits said UM_ERR_TASK. */
static void mark_done(um__run *r, task *t, um_status st, const char *why, uint8_t how,
                      um_task_id cause, bool cause_cancelled, task **done)
{
    t->state = DONE;
    t->status = st == UM_OK || st == UM_ERR_CANCELLED ? st : UM_ERR_TASK;
    /* The thread that puts t on *done retires that list (retire). */
    t->callback_dev = worker_here && worker_here->r == r ? worker_here->dev : -1;
    if (st != UM_OK) {
        note_failure(r, t, why, how, cause, cause_cancelled);
        if (!r->first_failed)
            r->first_failed = t->id;
    }
    for (int i = 0; i < t->t.nbuffers; i++) {
        access_rec *a = rec_find(r, t->t.buffers[i]);
        if (a && a->pending)
            a->pending--;
    }
    t->next = *done;
    *done = t;
}

/* Fails, with failed t, the tasks that use what it makes, and theirs in
 * turn (locked; a worklist, as a long chain would be too deep for
 * recursion). They stay unsettled: each still waits for t. */
static void fail_users(um__run *r, task *t, task **done)
{
    t->work_next = NULL;
    for (task *work = t; work;) {
        task *x = work;
        work = x->work_next;
        for (int i = 0; i < x->ndependents; i++) {
            task *d = x->dependents[i].to;
            if (!x->dependents[i].fails_with || d->state == DONE)
                continue;
            mark_done(r, d, UM_ERR_TASK, NULL, FAILED_WITH, x->id, x->status == UM_ERR_CANCELLED,
                      done);
            d->work_next = work;
            work = d;
        }
    }
}

/* Settles t, DONE with nothing left to wait for (locked): the tasks
 * waiting for it wait for one less, and run when none is left, or settle
 * in turn if they ended already. A settled task whose callback has run is
 * freed. */
static void settle(um__run *r, task *t)
{
    t->work_next = NULL;
    for (task *work = t; work;) {
        task *x = work;
        work = x->work_next;
        for (int i = 0; i < x->ndependents; i++) {
            task *d = x->dependents[i].to;
            if (--d->ndeps)
                continue;
            if (d->state == DONE) {
                d->work_next = work;
                work = d;
            } else {
                make_ready(r, d);
            }
        }
        x->ndependents = 0;
        if (x->retired)
            free_task(r, x);
    }
}

/* Finishes t with st (locked): its outcome (the arguments as mark_done's),
 * the tasks that fail with it, and, when it waits for nothing more, its
 * settling. Finished tasks go on *done for their callbacks outside the
 * lock. */
static void finish_as(um__run *r, task *t, um_status st, const char *why, uint8_t how,
                      um_task_id cause, bool cause_cancelled, task **done)
{
    mark_done(r, t, st, why, how, cause, cause_cancelled, done);
    if (st != UM_OK)
        fail_users(r, t, done);
    if (t->ndeps == 0)
        settle(r, t);
}

/* Finishes t with st and, for a failure, its own reason (locked). */
static void finish(um__run *r, task *t, um_status st, const char *why, task **done)
{
    finish_as(r, t, st, why, FAILED_ITSELF, 0, false, done);
}

/* The done callbacks this thread is in, innermost first (a callback may
 * submit a task that fails at once, whose callback runs inside it): a
 * wait called from one for its own task, or for every task, would wait
 * for itself. `pending` is the rest of the list being retired, finished
 * tasks whose callbacks this thread runs after this one: a wait for one
 * of them (a task's reader failed with it, whose callback waits for it)
 * would wait for this thread too. */
typedef struct in_callback {
    const um__run *r;
    const task *t;
    const task *pending;
    const struct in_callback *outer;
} in_callback;
static _Thread_local const in_callback *callbacks_here;

/* The task whose callback this thread is in, or whose callback it runs
 * after that one, of r's, that is `id`; with id 0, the task of any
 * callback of r's that this thread is in. NULL when none. The pending
 * tasks are not freed before this thread retires them. */
static const task *in_callback_of(const um__run *r, um_task_id id)
{
    for (const in_callback *c = callbacks_here; c; c = c->outer) {
        if (c->r != r)
            continue;
        if (!id || c->t->id == id)
            return c->t;
        for (const task *p = c->pending; p; p = p->next)
            if (p->id == id)
                return p;
    }
    return NULL;
}

/* Callbacks, outside the lock (a callback may submit), then the outcome
 * that waiters see: a wait on another thread returns after the task's
 * callback has run. The callback's own thread learns the outcome from
 * in_callback_of (um_task_wait on the task itself returns it at once). */
static void retire(um__run *r, task *done)
{
    while (done) {
        task *t = done;
        done = t->next;
        if (t->t.done) {
            in_callback c = {r, t, done, callbacks_here};
            callbacks_here = &c;
            t->t.done(t->id, t->status, t->t.user);
            callbacks_here = c.outer;
        }
        um__vt_mutex_lock(&r->lock);
        r->outcome[t->id - 1] = outcome_of(t->status);
        r->unfinished--;
        um__cond_broadcast(&r->finished);
        /* Unsettled, it still orders the tasks submitted after it. */
        if (t->ndeps)
            t->retired = true;
        else
            free_task(r, t);
        um__vt_mutex_unlock(&r->lock);
    }
}

/* ------------------------------------------------------------- workers */

/* Lists the buffers the next tasks in w's queue read, for prefetch_listed
 * (locked, on w's thread, which has just taken the task before them).
 * Listed, they are not forgotten (destroyed) until prefetch_listed lets
 * them go. */
static void list_next_inputs(worker *w)
{
    int n = 0, ahead = 0;
    for (task *q = w->head; q && ahead < PREFETCH_AHEAD; q = q->next, ahead++)
        for (int i = 0; i < q->t.nbuffers; i++)
            if (q->t.modes[i] != UM_ACCESS_WRITE_DISCARD)
                atomic_store_explicit(&w->prefetching[n++], q->t.buffers[i], memory_order_relaxed);
    w->nprefetching = n;
}

/* Whether a worker has b listed to prefetch (locked). */
static bool being_prefetched(const um__run *r, const um_buffer *b)
{
    for (int d = 0; d < r->ctx->ndevices; d++)
        for (int i = 0; i < PREFETCH_SLOTS; i++) {
            const um_buffer *p = atomic_load(&r->w[d].prefetching[i]);
            if (!p)
                break;
            if (p == b)
                return true;
        }
    return false;
}

/* Queues copies of the buffers list_next_inputs listed, where the device
 * has room for them, then lets them go (copy false: only that). Called
 * once the running task's buffers are acquired, so their memory counts
 * in the room: before, a prefetch could take it, and the running task's
 * acquisition then evicted a prefetched copy that was fetched again.
 * Unlocked. */
static void prefetch_listed(worker *w, bool copy)
{
    const um_device *d = &w->r->ctx->devices[w->dev];
    int n = w->nprefetching;
    /* Free memory only: room counts live bytes, not the pages they round
     * up to, so a prefetch it lets through may still find the device
     * full; evicting then would drop what the running or next task needs
     * (an audit's run evicted the next task's input and fetched it again). */
    bool was = um__alloc_no_reclaim(true);
    for (int i = 0; copy && i < n; i++) {
        um_buffer *b = atomic_load_explicit(&w->prefetching[i], memory_order_relaxed);
        if (um_buffer_size(b) > um__device_room(d) ||
            um_buffer_prefetch(b, w->dev) == UM_ERR_NOMEM)
            break;
    }
    um__alloc_no_reclaim(was);
    /* From the last, so that what is listed stays a prefix of the array. */
    while (n > 0)
        atomic_store(&w->prefetching[--n], NULL);
    w->nprefetching = 0;
    /* A destroy waiting for these (forget_buffer) announced itself before
     * it looked at the list; this looks after clearing it: one of the two
     * sees the other. */
    if (atomic_load(&w->r->destroy_waiters)) {
        um__vt_mutex_lock(&w->r->lock);
        um__cond_broadcast(&w->r->finished);
        um__vt_mutex_unlock(&w->r->lock);
    }
}

/* A GPU task launched and not seen finished yet: its buffers are released
 * on the worker's stream s, and `done` marks the end of its work there. */
typedef struct in_flight {
    task *t;
    um_stream s;
    um__fence done;
    uint64_t launched_ns;
    um_status st;
    bool all_held; /* its buffers were had, so it ran (or failed running) */
    bool ran;      /* its implementation was called */
    /* The buffers (bit i: buffer i) whose release could be neither fenced
     * nor waited for: still acquired, released again once the task's
     * work is seen done (land), tried until release_given_up_ns. */
    uint32_t unreleased;
    uint64_t release_given_up_ns;
    char why[512];
    /* Where the end could be neither fenced nor waited for at the
     * launch (done is then unrecorded), why; else empty. */
    char unfenced[400];
} in_flight;

/* Acquires t's buffers on the worker's stream (the stream waits for their
 * copies; the host does not): held[i] says which were. WRITE_DISCARD ones
 * come last, so that a buffer that cannot be had fails the task before
 * any data is about to be replaced. Counts the bytes that must come in. */
/* Acquires t's buffer i on w's device into ptrs[i] (its size in
 * sizes[i]), adding the bytes that came in to *in. */
static um_status acquire_one(worker *w, um_stream s, task *t, int i, void **ptrs, size_t *sizes,
                             bool *held, uint64_t *in)
{
    const um_task *ut = &t->t;
    double ns;
    bool comes_in = ut->modes[i] != UM_ACCESS_WRITE_DISCARD &&
                    !um__buffer_fetch_cost(ut->buffers[i], w->dev, &ns);
    sizes[i] = um_buffer_size(ut->buffers[i]);
    um_status st = UM_ERR_BUSY;
    /* Busy: the program itself holds the buffer; it is its to release. */
    for (int tries = 0; tries < 10000; tries++) {
        st = um_buffer_acquire(ut->buffers[i], w->dev, ut->modes[i], s, &ptrs[i]);
        if (st != UM_ERR_BUSY)
            break;
        um__sleep_until_ns(um__now_ns() + 1000000);
    }
    held[i] = st == UM_OK;
    /* A buffer that could not be had did not come in. */
    if (held[i] && comes_in)
        *in += sizes[i];
    return st;
}

static um_status acquire_all(worker *w, um_stream s, task *t, void **ptrs, size_t *sizes,
                             bool *held, char *why, size_t why_len)
{
    const um_task *ut = &t->t;
    um_status st = UM_OK;
    uint64_t in = 0;
    for (int i = 0; i < ut->nbuffers; i++)
        held[i] = false;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < ut->nbuffers && st == UM_OK; i++)
            if ((ut->modes[i] == UM_ACCESS_WRITE_DISCARD) == (pass == 1))
                st = acquire_one(w, s, t, i, ptrs, sizes, held, &in);
    if (st == UM_ERR_NOMEM && ut->nbuffers > 1) {
        /* The replicas it holds may split the device's free memory so that
         * the next one fits nowhere, though all would fit (an audit: 240
         * KiB of buffers under a 256 KiB limit, nothing else there). Let
         * go of them, announced again, and take them once more, largest
         * first: reclaim can then move what is in the way before the
         * large ones are placed. */
        um_status released = UM_OK;
        for (int i = 0; i < ut->nbuffers; i++) {
            if (!held[i])
                continue;
            /* A release that fails leaves the buffer acquired (its copies
             * may still be queued on s): it stays held, released with the
             * rest once the task has failed, and is not acquired again
             * (dropped here, it stayed acquired for good, and acquiring it
             * again waited ten seconds for itself). */
            um_status rs = um__buffer_release(ut->buffers[i], w->dev, s, false);
            if (rs != UM_OK) {
                released = rs;
                continue;
            }
            (void)um__buffer_announce(ut->buffers[i], &t->announced[i]);
            held[i] = false;
        }
        int order[UM_TASK_MAX_BUFFERS];
        for (int i = 0; i < ut->nbuffers; i++) {
            int k = i;
            size_t size = um_buffer_size(ut->buffers[i]);
            for (; k > 0 && um_buffer_size(ut->buffers[order[k - 1]]) < size; k--)
                order[k] = order[k - 1];
            order[k] = i;
        }
        st = released;
        for (int k = 0; k < ut->nbuffers && st == UM_OK; k++)
            st = acquire_one(w, s, t, order[k], ptrs, sizes, held, &in);
    }
    atomic_fetch_add(&w->bytes_in, in);
    if (st != UM_OK) {
        snprintf(why, why_len, "task %llu (%s) on device %d: its buffers could not be had: %s",
                 (unsigned long long)t->id, task_name(t), w->dev, um_last_error());
        withdraw(t, held);
    }
    return st;
}

/* Releases t's buffers that are held on the worker's stream; st, or a
 * failure if a release fails. Those of a task that did not run (not all
 * could be had, or its inputs did not arrive) keep their data: what a
 * WRITE_DISCARD would have replaced stays (found by the stress test).
 * With `unreleased`, a release that fails sets the buffer's bit there
 * instead, to be tried again (release_again). */
static um_status release_all(worker *w, um_stream s, task *t, const bool *held, bool ran,
                             um_status st, char *why, size_t why_len, uint32_t *unreleased)
{
    for (int i = 0; i < t->t.nbuffers; i++) {
        if (!held[i] || um__buffer_release(t->t.buffers[i], w->dev, s, ran) == UM_OK)
            continue;
        if (unreleased)
            *unreleased |= (uint32_t)1 << i;
        else if (st == UM_OK) {
            st = UM_ERR_TASK;
            snprintf(why, why_len, "task %llu (%s) on device %d: a release failed: %s",
                     (unsigned long long)t->id, task_name(t), w->dev, um_last_error());
        }
    }
    return st;
}

/* A task's compute from t1 to t2 ended: statistics, history, trace. */
static void account(worker *w, task *t, uint64_t t1, uint64_t t2, um_status st)
{
    um__run *r = w->r;
    if (t2 > t1) {
        atomic_fetch_add(&w->busy_ns, t2 - t1);
        if (st == UM_OK) {
            um__place_task pt;
            fill_place_task(r, t, &pt);
            um__place_learn(r->place, &pt, w->dev, t2 - t1);
        }
        if (r->ctx->events)
            um__event_add_named(r->ctx->events, UM_EVENT_TASK, w->dev, t1, t2 - t1, t->id,
                                st != UM_OK, task_name(t));
    }
    atomic_fetch_add(st == UM_OK ? &w->tasks : &w->failed, 1);
}

/* Whether dev's worker launches tasks ahead on streams: a GPU, or in
 * virtual time a sim device that stands for one. */
static bool launches_ahead(um_context *ctx, int dev)
{
    const um__backend *b = ctx->devices[dev].backend;
    return b->kind == UM_DEVICE_CUDA || (ctx->opts.virtual_time && b->launches_ahead);
}

/* How long t takes on sim device dev: the context's model of it in
 * virtual time, else its flops at sim_gflops (0: the task's own time);
 * *packed_ns, the same while other kernels run beside it. */
static uint64_t modelled_ns(um_context *ctx, int dev, const task *t, uint64_t *packed_ns)
{
    const um_task *ut = &t->t;
    if (ctx->vt_task_ns && ctx->opts.virtual_time) {
        size_t largest = 0;
        for (int i = 0; i < ut->nbuffers; i++)
            if (um_buffer_size(ut->buffers[i]) > largest)
                largest = um_buffer_size(ut->buffers[i]);
        return ctx->vt_task_ns(ctx->vt_task_arg, dev, task_name(t), ut->flops, largest,
                               packed_ns);
    }
    *packed_ns = 0;
    if (ctx->opts.sim_gflops > 0 && ut->flops > 0) {
        /* flops is finite (checked at submission), but its time may still
         * be past what a uint64_t holds, where the conversion is undefined. */
        double ns = ut->flops / (double)ctx->opts.sim_gflops;
        *packed_ns = ns < 0x1p63 ? (uint64_t)ns : UINT64_C(1) << 63;
    }
    return *packed_ns;
}

/* On the host and sim devices: acquires t's buffers, waits for them,
 * computes, releases. UM_OK or a failure with *why. */
static um_status run_on_cpu(worker *w, task *t, char *why, size_t why_len)
{
    um_context *ctx = w->r->ctx;
    const um_task *ut = &t->t;
    um__backend *be = ctx->devices[w->dev].backend;
    void *ptrs[UM_TASK_MAX_BUFFERS];
    size_t sizes[UM_TASK_MAX_BUFFERS];
    bool held[UM_TASK_MAX_BUFFERS];
    uint64_t t0 = um__now_ns();
    um_status st = acquire_all(w, w->stream, t, ptrs, sizes, held, why, why_len);
    bool all_held = st == UM_OK;
    /* The next tasks' inputs, copied while this one runs; not counted as
     * its wait (it was not, when it came before the acquisition). */
    uint64_t p0 = um__now_ns();
    prefetch_listed(w, true);
    uint64_t prefetch_ns = um__now_ns() - p0;
    if (st == UM_OK && (st = um_stream_synchronize(ctx, w->stream)) != UM_OK)
        snprintf(why, why_len, "task %llu (%s) on device %d: its inputs did not arrive: %s",
                 (unsigned long long)t->id, task_name(t), w->dev, um_last_error());
    uint64_t t1 = um__now_ns();
    atomic_fetch_add(&w->waited_ns, t1 - t0 - prefetch_ns);
    bool ran = st == UM_OK;
    if (ran) {
        um_task_exec e = {w->dev, be->kind, NULL, ptrs, sizes, ut->nbuffers, ut->user};
        int rc = ut->cpu(&e);
        if (rc != 0) {
            st = UM_ERR_TASK;
            snprintf(why, why_len, "task %llu (%s) on device %d returned %d",
                     (unsigned long long)t->id, task_name(t), w->dev, rc);
        }
        /* A simulated device computes at its modelled speed. */
        if (be->kind == UM_DEVICE_SIM) {
            uint64_t packed; /* one task at a time: alone */
            um__sleep_until_ns(t1 + modelled_ns(ctx, w->dev, t, &packed));
        }
    }
    uint64_t t2 = um__now_ns();
    st = release_all(w, w->stream, t, held, ran, st, why, why_len, NULL);
    if (all_held)
        account(w, t, t1, t2, st);
    else
        atomic_fetch_add(&w->failed, 1);
    return st;
}

/* On a GPU: acquires t's buffers on the stream, launches the work and
 * releases them there, and marks the end with a fence; the host moves on
 * to the next task at once. f->st: a failure found before the launch. */
static void launch_on_gpu(worker *w, um_stream s, task *t, in_flight *f)
{
    um_context *ctx = w->r->ctx;
    const um_task *ut = &t->t;
    void *ptrs[UM_TASK_MAX_BUFFERS];
    size_t sizes[UM_TASK_MAX_BUFFERS];
    bool held[UM_TASK_MAX_BUFFERS];
    f->t = t;
    f->s = s;
    f->done = UM_FENCE_NONE;
    f->unreleased = 0;
    f->release_given_up_ns = 0;
    f->why[0] = f->unfenced[0] = '\0';
    f->launched_ns = um__now_ns();
    f->st = acquire_all(w, s, t, ptrs, sizes, held, f->why, sizeof f->why);
    /* The next tasks' inputs, queued behind this one's copies; the host's
     * time for it is not this task's. */
    uint64_t p0 = um__now_ns();
    prefetch_listed(w, true);
    f->launched_ns += um__now_ns() - p0;
    bool ran = f->st == UM_OK;
    f->all_held = f->ran = ran;
    um__backend *be = ctx->devices[w->dev].backend;
    if (ran && be->kind != UM_DEVICE_CUDA) {
        /* A modelled GPU (virtual time): the program's function, then the
         * kernel's modelled time on the stream. */
        um_task_exec e = {w->dev, be->kind, NULL, ptrs, sizes, ut->nbuffers, ut->user};
        int rc = ut->cpu(&e);
        uint64_t packed, alone = modelled_ns(ctx, w->dev, t, &packed);
        um_status ks = um__sim_stream_kernel(be, s->ref.bstream, alone, packed);
        if (rc != 0) {
            f->st = UM_ERR_TASK;
            snprintf(f->why, sizeof f->why, "task %llu (%s) on device %d returned %d",
                     (unsigned long long)t->id, task_name(t), w->dev, rc);
        } else if (ks != UM_OK) {
            f->st = UM_ERR_TASK;
            snprintf(f->why, sizeof f->why, "task %llu (%s) on device %d: %s",
                     (unsigned long long)t->id, task_name(t), w->dev, um_last_error());
        }
    } else if (ran) {
        um_task_exec e = {w->dev, UM_DEVICE_CUDA, um_stream_native(s), ptrs, sizes,
                          ut->nbuffers, ut->user};
        int rc = ut->cuda(&e);
        if (rc != 0) {
            f->st = UM_ERR_TASK;
            snprintf(f->why, sizeof f->why, "task %llu (%s) on device %d returned %d",
                     (unsigned long long)t->id, task_name(t), w->dev, rc);
        }
    }
    /* A release that can be neither fenced nor waited for leaves its
     * buffer acquired, to be released again: land does that once the
     * task's work is seen done. Failed here, the buffer stayed acquired
     * for good, and every later task on it failed. */
    f->st = release_all(w, s, t, held, ran, f->st, f->why, sizeof f->why, &f->unreleased);
    /* The end of the task's work, a failed one's too: it may have queued
     * work before it failed, and the task's end (its callback, the waits
     * for it) must come after that work, which may use the program's
     * memory. */
    if (ran && um__fence_record(ctx, w->dev, s, &f->done) != UM_OK) {
        char record[200];
        snprintf(record, sizeof record, "%s", um_last_error());
        if (um_stream_synchronize(ctx, s) != UM_OK) {
            /* The work is still queued on s, so an event recorded there
             * later (land settles the fence) or a wait for s stands for
             * its end. Failed here, the task ended with its kernels
             * queued: its waits returned, and memory they used, freed by
             * the program then, was reused under them. */
            snprintf(f->unfenced, sizeof f->unfenced,
                     "its end could be neither fenced (%s) nor waited for (%s) at its launch",
                     record, um_last_error());
            f->done = um__fence_unrecorded(be, s);
        }
    }
}

/* Releases again the buffers of f whose release failed at the launch (w's
 * lock held, let go meanwhile, as a release may wait for the stream):
 * true once none is left. Tried at each look for a second, since the
 * driver may record again; then f fails, saying why, and those buffers
 * stay acquired. */
static bool release_again(worker *w, in_flight *f)
{
    um__run *r = w->r;
    const um_task *ut = &f->t->t;
    char why[300] = "";
    um__vt_mutex_unlock(&r->lock);
    for (int i = 0; i < ut->nbuffers; i++) {
        if (!(f->unreleased & (uint32_t)1 << i))
            continue;
        if (um__buffer_release(ut->buffers[i], w->dev, f->s, f->ran) == UM_OK)
            f->unreleased &= ~((uint32_t)1 << i);
        else if (!why[0])
            snprintf(why, sizeof why, "%s", um_last_error());
    }
    um__vt_mutex_lock(&r->lock);
    if (!f->unreleased)
        return true;
    uint64_t now = um__now_ns();
    if (!f->release_given_up_ns)
        f->release_given_up_ns = now + 1000000000ull;
    if (now < f->release_given_up_ns && !r->quit)
        return false;
    if (f->st == UM_OK) {
        f->st = UM_ERR_TASK;
        snprintf(f->why, sizeof f->why, "task %llu (%s) on device %d: a release failed: %s",
                 (unsigned long long)f->t->id, task_name(f->t), w->dev, why);
    }
    f->unreleased = 0;
    return true;
}

/* Looks whether a launched task has ended; true when it has, its compute
 * accounted from the later of its launch and the previous task's end. */
static bool land(worker *w, um__xfer *x, in_flight *f, uint64_t *prev_end)
{
    bool done;
    if (um__fence_check(x, &f->done, &done) != UM_OK) {
        /* Its end cannot be asked (or, unrecorded, still not recorded):
         * the stream is waited for instead, without the lock. Ended at
         * once, the task's waits returned with its kernels still queued. */
        char asked[200];
        snprintf(asked, sizeof asked, "%s", um_last_error());
        um__vt_mutex_unlock(&w->r->lock);
        um_status st = um_stream_synchronize(w->r->ctx, f->s);
        um__vt_mutex_lock(&w->r->lock);
        if (st != UM_OK) {
            if (f->st == UM_OK) {
                f->st = UM_ERR_TASK;
                /* Formatted apart from f, whose unfenced it quotes; a
                 * message too long for f->why keeps its start. */
                char why[sizeof f->why];
                int len = snprintf(why, sizeof why,
                                   "task %llu (%s) on device %d: %s%s (%s) nor waited for (%s): "
                                   "its GPU work may still be running",
                                   (unsigned long long)f->t->id, task_name(f->t), w->dev,
                                   f->unfenced,
                                   f->unfenced[0] ? ", nor seen later"
                                                  : "its end can be neither seen",
                                   asked, um_last_error());
                (void)len;
                memcpy(f->why, why, sizeof why);
            }
            /* Nothing can tell when its work ends: its buffers stay. */
            f->unreleased = 0;
        }
    } else if (!done) {
        return false;
    }
    if (f->unreleased && !release_again(w, f))
        return false;
    uint64_t end = um__now_ns(), start = f->launched_ns > *prev_end ? f->launched_ns : *prev_end;
    /* A task whose buffers could not be had never ran: no busy time and no
     * span, as on the host, and the next task's compute does not start
     * after it. */
    if (f->all_held) {
        account(w, f->t, start, end, f->st);
        *prev_end = end;
    } else {
        atomic_fetch_add(&w->failed, 1);
    }
    return true;
}

/* How often a GPU worker with tasks in flight and nothing to launch looks
 * at their events (real time): from the first interval, doubling up to the
 * last, so a short wait is noticed soon and a long one costs few wake-ups.
 * New work wakes it at once. */
#define LAND_POLL_MIN_NS 5000ull
#define LAND_POLL_MAX_NS 200000ull

/* Whether a task on the list `done` (linked by next) has a done callback. */
static bool any_callback(const task *done)
{
    for (; done; done = done->next)
        if (done->t.done)
            return true;
    return false;
}

/* t's buffers could not be had on w's device for lack of memory that
 * eviction could free (locked): memory the program holds there (its own
 * um_malloc blocks, pinned buffers), or t's own replicas splitting the
 * free memory. Placement counts only t's pages against the limit, so it
 * cannot see either. Unless t was forced there, that device is ruled out
 * for t and t goes back to the ready list, announced again, for another
 * device; false (t fails) where none is left. A task the host could run
 * failed on an accelerator, with every task after it (an audit). */
static bool place_again(um__run *r, worker *w, task *t)
{
    if (t->t.device >= 0)
        return false;
    t->excluded |= (uint64_t)1 << w->dev;
    for (int d = 0; d < r->ctx->ndevices; d++)
        if (eligible_on(r, t, d)) {
            um__log(UM_LOG_INFO, "task %llu (%s): no room on device %d, placed again",
                    (unsigned long long)t->id, task_name(t), w->dev);
            make_ready(r, t);
            return true;
        }
    return false;
}

/* A task has ended on w (locked): its queue has room again, for the
 * tasks ready then, unless w's thread runs done callbacks next: until
 * they return it takes none. Placed on w before its callback ran, a
 * dependent of t queued behind that callback, and a callback waiting for
 * it waited for ever, even with another device idle (eager took w, whose
 * queue had just emptied; locality and cost took it for its data). */
static void ended(um__run *r, worker *w, task *t, um_status st, const char *why)
{
    w->queued--;
    w->queued_ns -= t->est_ns;
    if (w->queued_ns < 0 || !w->queued)
        w->queued_ns = 0;
    /* Out of memory there that eviction could not free: another device
     * may have it. */
    if (st == UM_ERR_NOMEM && place_again(r, w, t))
        return;
    task *done = NULL;
    finish(r, t, st, why, &done);
    bool callbacks = any_callback(done);
    w->in_callbacks = callbacks;
    dispatch(r);
    um__vt_mutex_unlock(&r->lock);
    retire(r, done);
    um__vt_mutex_lock(&r->lock);
    if (callbacks) {
        /* The tasks that waited for w (their data is here) go there now. */
        w->in_callbacks = false;
        dispatch(r);
    }
}

/* A worker: runs its device's queue in order. On a GPU up to GPU_IN_FLIGHT
 * tasks are launched ahead, each on the next of the worker's streams (the
 * buffers' fences order dependent work across them), so the GPU never
 * waits for the host between tasks and small tasks run side by side;
 * elsewhere one task at a time. */

static void *worker_main(void *arg)
{
    worker *w = arg;
    um__run *r = w->r;
    bool gpu = launches_ahead(r->ctx, w->dev);
    um__xfer *x = NULL;
    /* Why it runs no task ("": it runs them): its GPU has no transfer
     * engine, or this thread cannot make the GPU's context current. */
    char refuse[300] = "";
    if (gpu && um__xfer_get(r->ctx, &x) != UM_OK)
        snprintf(refuse, sizeof refuse, "device %d: no transfer engine for its tasks: %s", w->dev,
                 um_last_error());
    /* Task code that uses a runtime of its own (cuBLAS) must find this
     * device's context current, or it would launch on the first GPU: a
     * GPU worker that cannot make it so refuses its tasks (it used to run
     * them anyway). Elsewhere the tasks do not need it. */
    if (!refuse[0] && um__be_bind_thread(r->ctx->devices[w->dev].backend) != UM_OK) {
        if (gpu)
            snprintf(refuse, sizeof refuse,
                     "device %d: its worker thread cannot make the device's context current, "
                     "so it runs no task: %s",
                     w->dev, um_last_error());
        else
            um__log(UM_LOG_WARN, "device %d: its worker thread cannot bind to it: %s", w->dev,
                    um_last_error());
    }
    worker_here = w;
    in_flight fl[GPU_IN_FLIGHT];
    int nfl = 0;
    unsigned launches = 0;
    uint64_t prev_end = 0, poll_ns = LAND_POLL_MIN_NS;
    um__vt_mutex_lock(&r->lock);
    while (!r->quit || nfl) {
        /* Launched tasks that have ended, in whatever order they did: one
         * launched later may end first (its inputs were there sooner), and
         * the tasks waiting for it should not wait for the older ones too. */
        for (int i = 0; i < nfl;) {
            if (!land(w, x, &fl[i], &prev_end)) {
                i++;
                continue;
            }
            in_flight f = fl[i];
            memmove(fl + i, fl + i + 1, (size_t)(--nfl - i) * sizeof *fl);
            ended(r, w, f.t, f.st, f.why);
            poll_ns = LAND_POLL_MIN_NS;
        }
        task *t = w->head;
        if (!t || (gpu && nfl == GPU_IN_FLIGHT)) {
            if (nfl) {
                /* Nothing more to launch: until a task ends or more work
                 * comes (waiting for the oldest alone missed both). */
                um__cond_wait_progress(&w->wake, &r->lock, poll_ns);
                poll_ns = poll_ns * 2 < LAND_POLL_MAX_NS ? poll_ns * 2 : LAND_POLL_MAX_NS;
            } else if (!r->quit) {
                um__cond_wait(&w->wake, &r->lock);
            }
            continue;
        }
        poll_ns = LAND_POLL_MIN_NS;
        w->head = t->next;
        if (!w->head)
            w->tail = NULL;
        t->state = RUNNING;
        list_next_inputs(w);
        um__vt_mutex_unlock(&r->lock);
        if (refuse[0]) {
            prefetch_listed(w, false);
            withdraw(t, NULL);
            char why[512];
            snprintf(why, sizeof why, "task %llu (%s) was not run: %s", (unsigned long long)t->id,
                     task_name(t), refuse);
            atomic_fetch_add(&w->failed, 1);
            um__vt_mutex_lock(&r->lock);
            ended(r, w, t, UM_ERR_TASK, why);
            continue;
        }
        if (gpu) {
            launch_on_gpu(w, w->streams[launches++ % (unsigned)w->nstreams], t, &fl[nfl]);
            um__vt_mutex_lock(&r->lock);
            nfl++;
            continue;
        }
        char why[512] = "";
        um_status st = run_on_cpu(w, t, why, sizeof why);
        um__vt_mutex_lock(&r->lock);
        ended(r, w, t, st, why);
    }
    um__vt_mutex_unlock(&r->lock);
    um__vt_exit();
    return NULL;
}

/* ------------------------------------------------------------ lifetime */

static void run_fini(um_context *ctx);
static bool forget_buffer(um_context *ctx, const um_buffer *b);
static void limit_changed(um_context *ctx);
static void stop_workers(um__run *r);
static void free_run(um__run *r);

/* Placement's view of the world (place.h): the context's devices and the
 * buffer layer's replicas. */
static double env_nominal_gflops(void *arg, int dev)
{
    return ((um_context *)arg)->devices[dev].backend->nominal_gflops;
}

/* The room on dev: its limit, and the bytes of its live blocks, which are
 * what making room must evict. The backend's physical bytes would count
 * the pool's cached memory too, which an allocation reuses for free: the
 * cost policy then charged write-backs for it and sent tasks away from
 * the device holding their data. */
static void env_room(void *arg, int dev, size_t *limit, size_t *used)
{
    um_context *ctx = arg;
    um__allocator *a = ctx->devices[dev].alloc;
    *limit = a->memory_limit;
    *used = a->ops->active_bytes(a);
}

static bool env_fetch_cost(void *arg, const um__place_task *t, int i, int dev, double *ns)
{
    (void)arg;
    return um__buffer_fetch_cost(t->buffers[i], dev, ns);
}

static size_t env_input_bytes(void *arg, const um__place_task *t, int i)
{
    (void)arg;
    return um_buffer_size(t->buffers[i]);
}

static size_t env_footprint(void *arg, const um__place_task *t, int dev)
{
    return task_footprint(arg, &((const task *)t->owner)->t, dev);
}

/* Evicting writes the bytes back to the host and a later use fetches them
 * again: both ways over dev's link to the host, at the engine's costs. */
static double env_evict_ns(void *arg, int dev, size_t bytes)
{
    um_context *ctx = arg;
    const um__xfer *x = atomic_load_explicit(&ctx->xfer, memory_order_acquire);
    return x ? um__xfer_cost(x, dev, 0, bytes) + um__xfer_cost(x, 0, dev, bytes) : 0.0;
}

static um_status run_get(um_context *ctx, um__run **out)
{
    um__run *r = atomic_load_explicit(&ctx->run, memory_order_acquire);
    if (r) {
        *out = r;
        return UM_OK;
    }
    um__vt_mutex_lock(&ctx->buffers_lock);
    r = atomic_load_explicit(&ctx->run, memory_order_acquire);
    if (r) {
        um__vt_mutex_unlock(&ctx->buffers_lock);
        *out = r;
        return UM_OK;
    }
    /* The trace file opens first: a runtime made without it would take
     * every later task unrecorded. */
    FILE *trace = NULL;
    if (ctx->opts.task_trace[0] && !(trace = fopen(ctx->opts.task_trace, "w"))) {
        um__vt_mutex_unlock(&ctx->buffers_lock);
        return um__fail(UM_ERR_IO, "um_task_submit: task_trace=%s cannot be written: %s",
                        ctx->opts.task_trace, strerror(errno));
    }
    if (trace)
        fprintf(trace, "# unimem task trace 1: task ID NAME FLOPS, then BUFFER:BYTES:MODE for "
                       "each buffer (r, w, rw, wd)\n");
    r = calloc(1, sizeof *r);
    um__place_env env = {ctx->ndevices, ctx, env_nominal_gflops, env_room, env_fetch_cost,
                         env_input_bytes};
    um__place *p = r ? um__place_create(&env, ctx->opts.sched) : NULL;
    if (!p) {
        free(r);
        if (trace)
            fclose(trace);
        um__vt_mutex_unlock(&ctx->buffers_lock);
        return um__fail(UM_ERR_NOMEM, "um_task_submit: no memory for the task runtime");
    }
    um__place_set_room(p, &(um__place_room){env_footprint, env_evict_ns});
    r->task_trace = trace;
    r->ctx = ctx;
    r->place = p;
    pthread_mutex_init(&r->lock, NULL);
    um__cond_init(&r->finished);
    um_status st = UM_OK;
    char why[400] = "";
    for (int d = 0; d < ctx->ndevices && st == UM_OK; d++) {
        worker *w = &r->w[d];
        w->r = r; /* its condition is made: stop_workers destroys it */
        w->dev = d;
        um__cond_init(&w->wake);
        int want = launches_ahead(ctx, d) ? GPU_IN_FLIGHT : 1;
        /* nstreams counts the streams made, the ones stop_workers destroys. */
        for (w->nstreams = 0; w->nstreams < want; w->nstreams++) {
            st = um_stream_create(ctx, d, &w->streams[w->nstreams]);
            if (st != UM_OK) {
                snprintf(why, sizeof why, "device %d's worker has no stream: %s", d,
                         um_last_error());
                break;
            }
        }
        w->stream = w->streams[0];
        if (st == UM_OK) {
            um__vt_spawn();
            int err = pthread_create(&w->tid, NULL, worker_main, w);
            if (err != 0) {
                um__vt_unspawn();
                st = UM_ERR_NOMEM;
                snprintf(why, sizeof why, "no thread for device %d's worker: %s", d,
                         strerror(err));
            }
        }
        w->started = st == UM_OK;
    }
    if (st != UM_OK) {
        /* Not published: a runtime without a worker on some device took
         * tasks that only that device could run and waited for them for
         * ever (um_task_wait, um_shutdown). The next submission tries
         * again. Torn down without the context's lock, which a starting
         * GPU worker may take (um__xfer_get). */
        um__vt_mutex_unlock(&ctx->buffers_lock);
        stop_workers(r);
        free_run(r);
        return um__fail(st, "um_task_submit: the task runtime could not start: %s", why);
    }
    atomic_store_explicit(&ctx->run, r, memory_order_release);
    ctx->run_fini = run_fini;
    atomic_store_explicit(&ctx->forget_buffer, forget_buffer, memory_order_release);
    atomic_store_explicit(&ctx->limit_changed, limit_changed, memory_order_release);
    um__vt_mutex_unlock(&ctx->buffers_lock);
    *out = r;
    return UM_OK;
}

/* Stops r's workers and joins them, and destroys their streams and
 * conditions: every worker made, started or not. */
static void stop_workers(um__run *r)
{
    um_context *ctx = r->ctx;
    um__vt_mutex_lock(&r->lock);
    r->quit = true;
    for (int d = 0; d < ctx->ndevices; d++)
        if (r->w[d].r)
            um__cond_broadcast(&r->w[d].wake);
    um__vt_mutex_unlock(&r->lock);
    for (int d = 0; d < ctx->ndevices; d++) {
        worker *w = &r->w[d];
        if (!w->r)
            continue;
        if (w->started)
            um__vt_join(w->tid, NULL);
        for (int k = 0; k < w->nstreams; k++)
            if (w->streams[k])
                (void)um_stream_destroy(ctx, w->streams[k]);
        um__cond_destroy(&w->wake);
    }
}

/* Frees r, its workers stopped. */
static void free_run(um__run *r)
{
    for (size_t i = 0; i < r->recs_cap; i++)
        free(r->recs[i].readers);
    free(r->recs);
    free(r->outcome);
    um__addrmap_free(&r->tasks);
    for (size_t i = 0; i < r->failures.cap; i++)
        if (r->failures.slots[i].key) {
            failure *f = (failure *)(uintptr_t)r->failures.slots[i].value;
            free(f->text);
            free(f);
        }
    um__addrmap_free(&r->failures);
    if (r->task_trace && (ferror(r->task_trace) | fclose(r->task_trace)))
        um__log(UM_LOG_WARN, "task_trace=%s: writing it failed; the trace is incomplete",
                r->ctx->opts.task_trace);
    um__place_destroy(r->place);
    um__cond_destroy(&r->finished);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

/* At um_shutdown: the tasks submitted run to their end first. */
static void run_fini(um_context *ctx)
{
    um__run *r = atomic_load_explicit(&ctx->run, memory_order_acquire);
    if (!r)
        return;
    (void)um_wait_all(ctx);
    stop_workers(r);
    atomic_store_explicit(&ctx->forget_buffer, NULL, memory_order_release);
    atomic_store_explicit(&ctx->limit_changed, NULL, memory_order_release);
    free_run(r);
    ctx->run = NULL;
    ctx->run_fini = NULL;
}

static bool forget_buffer(um_context *ctx, const um_buffer *b)
{
    um__run *r = atomic_load_explicit(&ctx->run, memory_order_acquire);
    if (!r)
        return true;
    um__vt_mutex_lock(&r->lock);
    access_rec *a = rec_find(r, b);
    bool ok = !a || !a->pending;
    /* A worker may be prefetching it for a task cancelled since: the
     * buffer goes once that is over, or its handle, made again for a new
     * buffer, would be prefetched (or read destroyed). Not long: the
     * worker lets it go once its running task's buffers are acquired. */
    while (ok && being_prefetched(r, b)) {
        atomic_fetch_add(&r->destroy_waiters, 1);
        if (being_prefetched(r, b))
            um__cond_wait(&r->finished, &r->lock);
        atomic_fetch_sub(&r->destroy_waiters, 1);
        a = rec_find(r, b); /* the table may have grown meanwhile */
        ok = !a || !a->pending;
    }
    if (a && ok) {
        free(a->readers);
        *a = (access_rec){TOMBSTONE, 0, NULL, 0, 0, 0, 0};
    }
    um__vt_mutex_unlock(&r->lock);
    return ok;
}

static void limit_changed(um_context *ctx)
{
    um__run *r = atomic_load_explicit(&ctx->run, memory_order_acquire);
    if (!r)
        return;
    um__vt_mutex_lock(&r->lock);
    dispatch(r);
    um__vt_mutex_unlock(&r->lock);
}

/* -------------------------------------------------------------- public */

static bool reads(um_access m)
{
    return m != UM_ACCESS_WRITE_DISCARD;
}

static bool writes(um_access m)
{
    return m != UM_ACCESS_READ;
}

bool um__task_flops_valid(double flops)
{
    /* NaN fails every comparison; infinity is above the bound. */
    return flops >= 0 && flops <= UM_TASK_MAX_FLOPS;
}

/* v in the fewest significant digits that read back as v: 1e+31 rather
 * than %.17g's 9.9999999999999996e+30, yet one just above a bound never
 * reads as the bound, as %g's six digits would make it. */
static const char *exact_double(double v, char *buf, size_t len)
{
    for (int digits = 1; digits < 17; digits++) {
        snprintf(buf, len, "%.*g", digits, v);
        if (strtod(buf, NULL) == v)
            return buf;
    }
    snprintf(buf, len, "%.17g", v);
    return buf;
}

static um_status check_task(um_context *ctx, const um_task *t)
{
    static const char what[] = "um_task_submit";
    if (!ctx || !t)
        return um__fail(UM_ERR_INVALID, "%s: %s is NULL", what, ctx ? "the task" : "ctx");
    const char *name = t->name ? t->name : "task";
    /* An infinite or NaN estimate made the modelled time's conversion to
     * an integer undefined (a sim worker slept for centuries), and one
     * above the bound was written to the task trace, which could then not
     * be read back. */
    if (!um__task_flops_valid(t->flops)) {
        char value[32];
        return um__fail(UM_ERR_INVALID, "%s: task '%s': flops is %s, not a count of 0 to %g "
                        "(0: unknown)", what, name, exact_double(t->flops, value, sizeof value),
                        UM_TASK_MAX_FLOPS);
    }
    if (!t->cpu && !t->cuda)
        return um__fail(UM_ERR_INVALID, "%s: task '%s' has no implementation (cpu and cuda "
                        "are both NULL)", what, name);
    if (t->nbuffers < 0 || t->nbuffers > UM_TASK_MAX_BUFFERS)
        return um__fail(UM_ERR_INVALID, "%s: task '%s' names %d buffers (0..%d)", what, name,
                        t->nbuffers, UM_TASK_MAX_BUFFERS);
    for (int i = 0; i < t->nbuffers; i++) {
        um_access m = t->modes[i];
        if (!t->buffers[i] || um_buffer_size(t->buffers[i]) == 0)
            return um__fail(UM_ERR_INVALID, "%s: task '%s': buffer %d is not a live buffer",
                            what, name, i);
        /* Another context's buffer has other devices (and numbers them
         * differently): acquiring it failed on a device it lacks, or ran
         * on a device of the wrong context. */
        if (t->buffers[i]->ctx != ctx)
            return um__fail(UM_ERR_INVALID, "%s: task '%s': buffer %d belongs to another "
                            "context", what, name, i);
        if (m != UM_ACCESS_READ && m != UM_ACCESS_WRITE && m != UM_ACCESS_READ_WRITE &&
            m != UM_ACCESS_WRITE_DISCARD)
            return um__fail(UM_ERR_INVALID, "%s: task '%s': buffer %d has mode %d (READ, WRITE, "
                            "READ_WRITE or WRITE_DISCARD)", what, name, i, (int)m);
        for (int j = 0; j < i; j++)
            if (t->buffers[j] == t->buffers[i])
                return um__fail(UM_ERR_INVALID, "%s: task '%s' names buffer %p twice (%d and "
                                "%d): one access with the combined mode", what, name,
                                (void *)t->buffers[i], j, i);
    }
    if (t->device >= ctx->ndevices || t->device < -1)
        return um__fail(UM_ERR_NO_DEVICE, "%s: task '%s' is forced onto device %d: the context "
                        "has devices 0..%d", what, name, t->device, ctx->ndevices - 1);
    bool any = false;
    for (int d = 0; d < ctx->ndevices; d++)
        any |= (t->device < 0 || t->device == d) && runs_on(ctx, t, d);
    /* Only the host could run it: with cpu alone that is what it has; with
     * cuda too, the context has no GPU (such a task was told that it had
     * an implementation only for the host). */
    if (!any && !ctx->opts.host_tasks && (t->device == 0 || (t->device < 0 && t->cpu)))
        return um__fail(UM_ERR_UNSUPPORTED, "%s: task '%s' %s, and the option host_tasks=0 "
                        "keeps tasks off the host", what, name,
                        t->device == 0 ? "is forced onto the host"
                        : t->cuda      ? "has a CUDA implementation but the context has no GPU"
                                       : "has an implementation only for the host");
    if (!any)
        return um__fail(UM_ERR_UNSUPPORTED, "%s: task '%s' has no implementation for %s", what,
                        name, t->device >= 0 ? "the device it is forced onto"
                                             : "any device of the context (a cuda one only, "
                                               "and no GPU?)");
    /* Placement never puts a task where its buffers cannot all fit: forced
     * there, it would wait forever (found by the stress test's review). */
    if (t->device > 0) {
        size_t bytes = task_footprint(ctx, t, t->device),
               limit = ctx->devices[t->device].alloc->memory_limit;
        if (bytes > limit)
            return um__fail(UM_ERR_NOMEM, "%s: task '%s' is forced onto device %d, whose memory "
                            "limit (%zu bytes) is below its buffers' %zu bytes (rounded up to "
                            "the device's %zu-byte pages)", what, name, t->device, limit,
                            bytes, ctx->devices[t->device].backend->granularity);
    }
    return UM_OK;
}

static bool ids_grow(um__run *r)
{
    if (r->nids < r->ids_cap)
        return true;
    uint64_t cap = r->ids_cap ? 2 * r->ids_cap : 1024;
    uint8_t *o = realloc(r->outcome, cap);
    if (!o)
        return false;
    r->outcome = o;
    r->ids_cap = cap;
    return true;
}

/* Room for one more edge from task `id`, if the task being submitted will
 * wait for it (locked); false when no memory. d->reserved counts the edges
 * reserved so far (a task may wait for another through several buffers);
 * reserve_records clears it. */
static bool reserve_edge(um__run *r, um_task_id id)
{
    task *d = unsettled(r, id);
    if (!d)
        return true;
    int need = d->ndependents + ++d->reserved;
    if (need <= d->dependents_cap)
        return true;
    int cap = d->dependents_cap ? 2 * d->dependents_cap : 4;
    while (cap < need)
        cap *= 2;
    edge *n = realloc(d->dependents, (size_t)cap * sizeof *n);
    if (!n)
        return false;
    d->dependents = n;
    d->dependents_cap = cap;
    return true;
}

/* Makes every record and list entry that submitting ut will need (locked),
 * before anything is changed: false when no memory, and then nothing that
 * orders tasks has changed, so the submission can fail as a whole. Records
 * made for its buffers may stay (empty, no task pending on them). Failing
 * halfway through the buffers, as it used to, left the task named on some
 * of them only, and its end then lowered the `pending` count of the rest,
 * taking other tasks' counts, so a buffer in use could be destroyed. */
static bool reserve_records(um__run *r, const um_task *ut)
{
    bool ok = true;
    for (int i = 0; i < ut->nbuffers && ok; i++) {
        access_rec *a = rec_get(r, ut->buffers[i]);
        if (!a) {
            ok = false;
            break;
        }
        um_access m = ut->modes[i];
        ok = reserve_edge(r, a->writer);
        if (writes(m))
            for (uint32_t k = 0; k < a->nreaders && ok; k++)
                ok = reserve_edge(r, a->readers[k]);
        else
            ok = ok && reserve_reader(r, a);
    }
    for (int i = 0; i < ut->nbuffers; i++) {
        const access_rec *a = rec_find(r, ut->buffers[i]);
        if (!a)
            continue;
        task *d = unsettled(r, a->writer);
        if (d)
            d->reserved = 0;
        if (writes(ut->modes[i]))
            for (uint32_t k = 0; k < a->nreaders; k++)
                if ((d = unsettled(r, a->readers[k])))
                    d->reserved = 0;
    }
    return ok;
}

/* t waits for task `id` (locked), unless that one has settled; if it
 * failed, t fails too when it uses what that one makes (`fails_with`).
 * The edge's room was reserved (reserve_records). */
static void depend(um__run *r, task *t, um_task_id id, bool fails_with)
{
    if (!id || id == t->id)
        return;
    task *d = task_of(r, id);
    bool failed = d ? d->state == DONE && d->status != UM_OK : r->outcome[id - 1] != ID_OK;
    if (failed && fails_with && !t->failed_dep)
        t->failed_dep = id;
    if (!unsettled(r, id))
        return;
    d->dependents[d->ndependents++] = (edge){t, fails_with};
    t->ndeps++;
}

/* One line of the task trace for t (locked; its buffers have records). */
static void trace_task(um__run *r, const task *t)
{
    static const char *const modes[] = {[UM_ACCESS_READ] = "r", [UM_ACCESS_WRITE] = "w",
                                        [UM_ACCESS_READ_WRITE] = "rw",
                                        [UM_ACCESS_WRITE_DISCARD] = "wd"};
    char name[64];
    snprintf(name, sizeof name, "%s", task_name(t));
    for (char *c = name; *c; c++)
        if (*c <= ' ' || *c == '#')
            *c = '_';
    fprintf(r->task_trace, "task %llu %s %.17g", (unsigned long long)t->id, name, t->t.flops);
    for (int i = 0; i < t->t.nbuffers; i++)
        fprintf(r->task_trace, " %llu:%zu:%s",
                (unsigned long long)rec_find(r, t->t.buffers[i])->trace_id,
                um_buffer_size(t->t.buffers[i]), modes[t->t.modes[i]]);
    fputc('\n', r->task_trace);
}

static bool dep_cancelled(const um__run *r, um_task_id id)
{
    const task *d = task_of(r, id);
    return d ? d->status == UM_ERR_CANCELLED : r->outcome[id - 1] == ID_CANCELLED;
}

um_status um_task_submit(um_context *ctx, const um_task *ut, um_task_id *id)
{
    if (id)
        *id = 0;
    um_status st = check_task(ctx, ut);
    if (st != UM_OK)
        return st;
    um__run *r = NULL;
    if ((st = run_get(ctx, &r)) != UM_OK)
        return st;
    task *t = calloc(1, sizeof *t);
    if (!t)
        return um__fail(UM_ERR_NOMEM, "um_task_submit: no memory for a task");
    t->t = *ut;
    if (ut->name) {
        copy_name(t->name, ut->name);
        t->t.name = t->name;
    }
    for (int i = 0; i < ut->nbuffers; i++)
        t->bytes += um_buffer_size(ut->buffers[i]);
    um__vt_mutex_lock(&r->lock);
    if (!ids_grow(r) || !um__addrmap_reserve(&r->tasks, 1)) {
        um__vt_mutex_unlock(&r->lock);
        free(t);
        return um__fail(UM_ERR_NOMEM, "um_task_submit: task '%s': no memory for task ids",
                        ut->name ? ut->name : "task");
    }
    if (!reserve_records(r, ut)) {
        um__vt_mutex_unlock(&r->lock);
        um_status fail = um__fail(UM_ERR_NOMEM, "um_task_submit: task '%s': no memory for its "
                                  "dependency records; it was not submitted", task_name(t));
        free(t);
        return fail;
    }
    /* Nothing below fails: the task exists from here on. */
    t->id = ++r->nids;
    r->outcome[t->id - 1] = ID_PENDING;
    (void)um__addrmap_put(&r->tasks, t->id, (uint64_t)(uintptr_t)t); /* reserved above */
    for (int i = 0; i < ut->nbuffers; i++) {
        access_rec *a = rec_find(r, ut->buffers[i]);
        um_access m = ut->modes[i];
        /* After the last writer always (read after write, write after
         * write); a writer also after the readers since (write after read). */
        depend(r, t, a->writer, reads(m));
        if (writes(m))
            for (uint32_t k = 0; k < a->nreaders; k++)
                depend(r, t, a->readers[k], false);
        if (writes(m)) {
            a->writer = t->id;
            a->nreaders = 0;
        } else {
            add_reader(a, t->id);
        }
        a->pending++;
    }
    if (r->task_trace)
        trace_task(r, t);
    r->unfinished++;
    task *done = NULL;
    if (t->failed_dep) {
        finish_as(r, t, UM_ERR_TASK, NULL, FAILED_AT_SUBMIT, t->failed_dep,
                  dep_cancelled(r, t->failed_dep), &done);
    } else if (t->ndeps == 0) {
        make_ready(r, t);
    }
    um_task_id tid = t->id;
    um__vt_mutex_unlock(&r->lock);
    retire(r, done);
    if (id)
        *id = tid;
    return UM_OK;
}

/* The status of a finished id whose outcome is o, with its message in
 * um_last_error (locked). */
static um_status outcome_status(um__run *r, um_task_id id, uint8_t o)
{
    if (o == ID_OK)
        return UM_OK;
    char why[512];
    failure_message(r, id, why, sizeof why, 0);
    return um__fail(o == ID_CANCELLED ? UM_ERR_CANCELLED : UM_ERR_TASK, "%s", why);
}

/* The run layer of ctx, locked, when id names one of its tasks. */
static um_status run_of(um_context *ctx, um_task_id id, const char *what, um__run **out)
{
    if (!ctx)
        return um__fail(UM_ERR_INVALID, "%s: ctx is NULL", what);
    um__run *r = atomic_load_explicit(&ctx->run, memory_order_acquire);
    if (r)
        um__vt_mutex_lock(&r->lock);
    if (!r || id == 0 || id > r->nids) {
        if (r)
            um__vt_mutex_unlock(&r->lock);
        return um__fail(UM_ERR_INVALID, "%s: %llu is not a task id of this context", what,
                        (unsigned long long)id);
    }
    *out = r;
    return UM_OK;
}

/* Whether t, unfinished, can run on a device whose bit is clear in `held`
 * (locked). */
static bool runs_outside(const um__run *r, const task *t, uint64_t held)
{
    for (int d = 0; d < r->ctx->ndevices; d++)
        if (!((held >> d) & 1) && fits_on(r, t, d))
            return true;
    return false;
}

/* Whether unfinished task `target` is, or waits however indirectly for, a
 * task that only the threads of the workers in `held` (a bit per device)
 * can run or end (locked): one running on one of them (launched on its
 * GPU, which only that thread lands), or one not started that no other
 * device may run (forced there, or the others lack its implementation or
 * room for its buffers). While those threads are held in done callbacks,
 * a wait for it would never end. Searched from those tasks along the
 * dependency edges; a callback's wait is rare, so it looks through every
 * task. */
static bool waits_for_workers(um__run *r, uint64_t held, const task *target)
{
    /* Ended, with its outcome not yet published: that waits only for its
     * done callback, on the thread that ended it (its dependents do not;
     * they were let go when it ended). */
    if (target->state == DONE)
        return target->callback_dev >= 0 && ((held >> target->callback_dev) & 1);
    task *work = NULL;
    for (size_t i = 0; i < r->tasks.cap; i++) {
        if (!r->tasks.slots[i].key)
            continue;
        task *x = (task *)(uintptr_t)r->tasks.slots[i].value;
        bool only_held = x->state == RUNNING ? (held >> x->dev) & 1
                                             : x->state != DONE && !runs_outside(r, x, held);
        if (only_held) {
            x->marked = true;
            x->marked_next = work;
            work = x;
        }
    }
    bool found = false;
    while (work && !found) {
        task *x = work;
        work = x->marked_next;
        found = x == target;
        for (int k = 0; k < x->ndependents; k++) {
            task *d = x->dependents[k].to;
            if (!d->marked) {
                d->marked = true;
                d->marked_next = work;
                work = d;
            }
        }
    }
    for (size_t i = 0; i < r->tasks.cap; i++)
        if (r->tasks.slots[i].key)
            ((task *)(uintptr_t)r->tasks.slots[i].value)->marked = false;
    return found;
}

/* The workers (a bit per device) whose callbacks' waits would never end
 * if w's callback waited for t as well (locked); w's bit is set when its
 * wait would be one of them. Each waiting worker holds its thread, so a
 * wait ends only if its task can be run or ended by a worker that is not
 * held: the greatest set of held workers consistent with that is found by
 * starting from every waiting worker and w, and letting go each whose
 * task some worker outside the set can finish, until none is let go.
 * Checking each worker alone accepted two callbacks each waiting for a
 * task that only the other's device could run, and both hung. */
static uint64_t held_in_waits(um__run *r, const worker *w, const task *t)
{
    uint64_t held = 1ull << w->dev;
    for (int d = 0; d < r->ctx->ndevices; d++)
        if (r->w[d].waiting)
            held |= 1ull << d;
    for (bool changed = true; changed;) {
        changed = false;
        for (int d = 0; d < r->ctx->ndevices; d++) {
            if (!((held >> d) & 1))
                continue;
            /* A task whose outcome is published lets its waiter go; one
             * that has ended but whose callback has not run waits for the
             * thread that runs it (waits_for_workers). */
            const task *awaited = d == w->dev ? t : task_of(r, r->w[d].awaited);
            if (!awaited || r->outcome[awaited->id - 1] != ID_PENDING ||
                !waits_for_workers(r, held, awaited)) {
                held &= ~(1ull << d);
                changed = true;
            }
        }
    }
    return held;
}

/* Before a done callback on w's thread waits for task t, whose outcome
 * is still to come (locked): w runs nothing until the wait returns, so placement leaves it
 * out, and the tasks queued on it and not started go back to the ready
 * list, for the other devices (t may be one of them, or wait for one).
 * UM_ERR_BUSY, nothing changed, when t could still not end: only w could
 * run it, or the callbacks waiting on other workers and this one would
 * wait for one another. */
static um_status leave_for_wait(um__run *r, worker *w, const task *t)
{
    if (waits_for_workers(r, 1ull << w->dev, t))
        return um__fail(UM_ERR_BUSY,
                        "um_task_wait: called from a done callback on device %d's worker for "
                        "task %llu (%s), which is, or waits for, a task that only that worker "
                        "can run (forced there, or no other device has its implementation or "
                        "room for its buffers) or is running there, and the worker runs "
                        "nothing until the callback returns; wait outside done callbacks",
                        w->dev, (unsigned long long)t->id, task_name(t));
    uint64_t held = held_in_waits(r, w, t);
    if ((held >> w->dev) & 1) {
        char devs[UM_MAX_DEVICES * 4] = "";
        size_t n = 0;
        for (int d = 0; d < r->ctx->ndevices && n < sizeof devs; d++)
            if ((held >> d) & 1)
                n += (size_t)snprintf(devs + n, sizeof devs - n, "%s%d", n ? ", " : "", d);
        return um__fail(UM_ERR_BUSY,
                        "um_task_wait: called from a done callback on device %d's worker for "
                        "task %llu (%s), which is, or waits for, a task that only workers whose "
                        "callbacks wait too can run or finish (a task that has ended waits for "
                        "its own done callback, on the worker that ended it): the waits would "
                        "form a cycle through callbacks on devices %s, and none would end; wait "
                        "outside done callbacks",
                        w->dev, (unsigned long long)t->id, task_name(t), devs);
    }
    w->waiting = true;
    w->awaited = t->id;
    while (w->head) {
        task *q = w->head;
        w->head = q->next;
        w->queued--;
        w->queued_ns -= q->est_ns;
        q->dev = -1;
        q->est_ns = 0;
        enqueue(&r->ready_head, &r->ready_tail, q);
    }
    w->tail = NULL;
    if (w->queued_ns < 0 || !w->queued)
        w->queued_ns = 0; /* as in ended: rounding must not leave a credit */
    dispatch(r);
    return UM_OK;
}

um_status um_task_wait(um_context *ctx, um_task_id id)
{
    um__run *r = NULL;
    um_status st = run_of(ctx, id, "um_task_wait", &r); /* locks r on success */
    if (st != UM_OK)
        return st;
    /* From the task's own callback, or from the callback of one retired
     * before it on this thread: it has finished, and its outcome is
     * published once this thread has run its callback, so waiting would
     * never end. */
    const task *self = in_callback_of(r, id);
    uint8_t o = self ? outcome_of(self->status) : r->outcome[id - 1];
    /* From a done callback on a worker, for a task whose outcome is still
     * to come: the worker cannot run it (nor those queued on it) until the
     * callback returns, so they go to other devices, or the wait fails
     * when none can take them, or when the task has ended but its own
     * callback is on a worker held by such waits. */
    worker *held = NULL;
    const task *t = o == ID_PENDING ? task_of(r, id) : NULL;
    if (t && worker_here && worker_here->r == r && in_callback_of(r, 0)) {
        if ((st = leave_for_wait(r, worker_here, t)) != UM_OK) {
            um__vt_mutex_unlock(&r->lock);
            return st;
        }
        held = worker_here;
    }
    while (o == ID_PENDING) {
        um__cond_wait(&r->finished, &r->lock);
        o = r->outcome[id - 1];
    }
    if (held) {
        held->waiting = false;
        held->awaited = 0;
        dispatch(r); /* the tasks that only it can run */
    }
    st = outcome_status(r, id, o);
    um__vt_mutex_unlock(&r->lock);
    return st;
}

um_status um_task_cancel(um_context *ctx, um_task_id id)
{
    um__run *r = NULL;
    um_status st = run_of(ctx, id, "um_task_cancel", &r); /* locks r on success */
    if (st != UM_OK)
        return st;
    task *t = task_of(r, id);
    if (!t || t->state == RUNNING || t->state == DONE) {
        /* Read before unlocking: the worker may finish and free it then
         * (a race TSan found under the stress test). */
        const char *what = t && t->state == RUNNING ? "started" : "finished";
        um__vt_mutex_unlock(&r->lock);
        return um__fail(UM_ERR_BUSY, "um_task_cancel: task %llu has %s", (unsigned long long)id,
                        what);
    }
    if (t->state == READY) {
        /* In a device's queue, or in the ready list waiting for one. */
        worker *w = t->dev >= 0 ? &r->w[t->dev] : NULL;
        task **head = w ? &w->head : &r->ready_head, **tail = w ? &w->tail : &r->ready_tail;
        task **pp = head, *prev = NULL;
        while (*pp != t) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        *pp = t->next;
        if (*tail == t)
            *tail = prev;
        if (w) {
            w->queued--;
            w->queued_ns -= t->est_ns;
            if (w->queued_ns < 0 || !w->queued)
                w->queued_ns = 0; /* as in ended: rounding must not leave a credit */
        }
        withdraw(t, NULL); /* its uses will not come */
    }
    task *done = NULL;
    char why[128];
    snprintf(why, sizeof why, "task %llu (%s) was cancelled", (unsigned long long)id,
             task_name(t));
    finish(r, t, UM_ERR_CANCELLED, why, &done);
    /* Its queue has room again: a ready task waiting for that device (its
     * queue was full, or the device was still calibrating on the cancelled
     * task) is placed now, as after a task's end; without this it waited
     * for ever when no other task was left to end there. */
    dispatch(r);
    um__vt_mutex_unlock(&r->lock);
    retire(r, done);
    return UM_OK;
}

um_status um_wait_all(um_context *ctx)
{
    if (!ctx)
        return um__fail(UM_ERR_INVALID, "um_wait_all: ctx is NULL");
    um__run *r = atomic_load_explicit(&ctx->run, memory_order_acquire);
    if (!r)
        return UM_OK;
    um__vt_mutex_lock(&r->lock);
    /* From a done callback it would wait for the callback's own task, and
     * on a worker for the tasks queued behind it there: it used to hang. */
    const task *cb = in_callback_of(r, 0);
    if (cb) {
        um_task_id cb_id = cb->id;
        um__vt_mutex_unlock(&r->lock);
        return um__fail(UM_ERR_BUSY,
                        "um_wait_all: called from the done callback of task %llu, "
                        "which would wait for that task itself (and, on a worker, for the tasks "
                        "queued behind it); wait outside done callbacks",
                        (unsigned long long)cb_id);
    }
    while (r->unfinished)
        um__cond_wait(&r->finished, &r->lock);
    um_status st = UM_OK;
    if (r->first_failed) {
        st = outcome_status(r, r->first_failed, r->outcome[r->first_failed - 1]);
        r->first_failed = 0; /* reported once */
    }
    um__vt_mutex_unlock(&r->lock);
    return st;
}

um_status um_task_stats_get(um_context *ctx, int dev, um_task_stats *out)
{
    if (!ctx || !out)
        return um__fail(UM_ERR_INVALID, "um_task_stats_get: %s is NULL", ctx ? "out" : "ctx");
    if (dev < 0 || dev >= ctx->ndevices)
        return um__fail(UM_ERR_NO_DEVICE, "um_task_stats_get: device %d: the context has "
                        "devices 0..%d", dev, ctx->ndevices - 1);
    memset(out, 0, sizeof *out);
    um__run *r = atomic_load_explicit(&ctx->run, memory_order_acquire);
    if (!r)
        return UM_OK;
    worker *w = &r->w[dev];
    *out = (um_task_stats){atomic_load(&w->tasks), atomic_load(&w->failed),
                           atomic_load(&w->busy_ns), atomic_load(&w->waited_ns),
                           atomic_load(&w->bytes_in)};
    return UM_OK;
}
