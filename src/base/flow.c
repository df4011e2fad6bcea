/* Max-min fair flow model of vsim; see flow.h. */
#include "flow.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Completion tolerances: a flow is done when what is left is at most this
 * fraction of its size, or would take at most this many seconds. */
#define REL_BYTES_TOL 1e-9
#define TIME_TOL 1e-12
/* Resources whose fair share is within this factor of the smallest are
 * bottlenecks of the same round, so rounding does not split a tie. */
#define SHARE_TOL 1e-12

enum { FLOW_LATENCY, FLOW_TRANSFER, FLOW_DONE };

typedef struct flow {
    uint64_t tag;
    int *route; /* owned; NULL when nroute is 0 */
    int nroute;
    int state;
    bool frozen; /* scratch of the rate computation */
    double size;
    double left;    /* bytes still to transfer */
    double rate;    /* bytes/s while transferring, else 0 */
    double lat_end; /* absolute end of the latency phase */
    double finish;  /* absolute completion time at the current rate */
} flow;

struct um__vs_net {
    int nres;
    double now;
    double *cap;
    double *bytes;
    double *busy;
    /* Scratch of the rate computation, nres each. */
    double *left_cap;
    int *count;
    bool *mark;
    /* Flows in start order, so that one event's completions come out in
     * start order when the array is scanned. */
    flow *flows;
    int nflows, flows_cap;
    /* Tags of completed flows not yet reported: queue[head..qlen). */
    uint64_t *queue;
    int qhead, qlen, queue_cap;
};

um__vs_net *um__vs_net_create(int nres, const double *capacity)
{
    if (nres < 0 || (nres > 0 && !capacity))
        return NULL;
    for (int i = 0; i < nres; i++)
        if (!(capacity[i] > 0) || !isfinite(capacity[i]))
            return NULL;
    um__vs_net *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->nres = nres;
    size_t k = nres > 0 ? (size_t)nres : 1;
    n->cap = calloc(k, sizeof *n->cap);
    n->bytes = calloc(k, sizeof *n->bytes);
    n->busy = calloc(k, sizeof *n->busy);
    n->left_cap = calloc(k, sizeof *n->left_cap);
    n->count = calloc(k, sizeof *n->count);
    n->mark = calloc(k, sizeof *n->mark);
    if (!n->cap || !n->bytes || !n->busy || !n->left_cap || !n->count || !n->mark) {
        um__vs_net_destroy(n);
        return NULL;
    }
    if (nres > 0)
        memcpy(n->cap, capacity, (size_t)nres * sizeof *n->cap);
    return n;
}

void um__vs_net_destroy(um__vs_net *n)
{
    if (!n)
        return;
    for (int i = 0; i < n->nflows; i++)
        free(n->flows[i].route);
    free(n->flows);
    free(n->queue);
    free(n->cap);
    free(n->bytes);
    free(n->busy);
    free(n->left_cap);
    free(n->count);
    free(n->mark);
    free(n);
}

/* Progressive filling over the transferring flows: each round finds the
 * smallest fair share among resources that still carry unfrozen flows, gives
 * it to every unfrozen flow through such a bottleneck and takes it off the
 * capacity left on their routes. The share never decreases from round to
 * round and every round saturates at least one resource, so there are at
 * most nres rounds and every rate is > 0. A flow that names a resource k
 * times counts k times there, in the share and in what it takes off. */
static void recompute(um__vs_net *n)
{
    for (int r = 0; r < n->nres; r++)
        n->left_cap[r] = n->cap[r];
    for (int i = 0; i < n->nflows; i++) {
        flow *f = &n->flows[i];
        f->frozen = f->state != FLOW_TRANSFER;
        if (f->state != FLOW_TRANSFER)
            f->rate = 0;
    }
    for (;;) {
        memset(n->count, 0, (size_t)n->nres * sizeof *n->count);
        for (int i = 0; i < n->nflows; i++) {
            const flow *f = &n->flows[i];
            if (!f->frozen)
                for (int j = 0; j < f->nroute; j++)
                    n->count[f->route[j]]++;
        }
        double s = INFINITY;
        for (int r = 0; r < n->nres; r++)
            if (n->count[r] > 0 && n->left_cap[r] / n->count[r] < s)
                s = n->left_cap[r] / n->count[r];
        if (s == INFINITY)
            break;
        for (int r = 0; r < n->nres; r++)
            n->mark[r] = n->count[r] > 0 && n->left_cap[r] / n->count[r] <= s * (1 + SHARE_TOL);
        for (int i = 0; i < n->nflows; i++) {
            flow *f = &n->flows[i];
            if (f->frozen)
                continue;
            bool through = false;
            for (int j = 0; j < f->nroute && !through; j++)
                through = n->mark[f->route[j]];
            if (!through)
                continue;
            f->rate = s;
            f->frozen = true;
            for (int j = 0; j < f->nroute; j++)
                n->left_cap[f->route[j]] -= s;
        }
        /* A bottleneck is saturated: rounding must not leave it a sliver
         * (or a negative rest) that a later round would share out. */
        for (int r = 0; r < n->nres; r++) {
            if (n->mark[r] || n->left_cap[r] < 0)
                n->left_cap[r] = 0;
            n->mark[r] = false;
        }
    }
    for (int i = 0; i < n->nflows; i++) {
        flow *f = &n->flows[i];
        f->finish = f->state == FLOW_TRANSFER ? n->now + f->left / f->rate : INFINITY;
    }
}

/* The earliest event among flows in flight, ignoring unreported ones. */
static double next_event(const um__vs_net *n)
{
    double t = INFINITY;
    for (int i = 0; i < n->nflows; i++) {
        const flow *f = &n->flows[i];
        double e = f->state == FLOW_LATENCY ? f->lat_end : f->finish;
        if (e < t)
            t = e;
    }
    return t;
}

/* Moves the time to t (no event before it) at the current rates. */
static void progress(um__vs_net *n, double t)
{
    double dt = t - n->now;
    if (dt > 0) {
        memset(n->mark, 0, (size_t)n->nres * sizeof *n->mark);
        for (int i = 0; i < n->nflows; i++) {
            flow *f = &n->flows[i];
            if (f->state != FLOW_TRANSFER)
                continue;
            double d = f->rate * dt;
            if (d > f->left)
                d = f->left;
            f->left -= d;
            for (int j = 0; j < f->nroute; j++) {
                n->bytes[f->route[j]] += d;
                n->mark[f->route[j]] = true;
            }
        }
        for (int r = 0; r < n->nres; r++) {
            if (n->mark[r])
                n->busy[r] += dt;
            n->mark[r] = false;
        }
    }
    n->now = t;
}

/* Handles the events due at the current time: latency phases that end and
 * transfers that complete. Completed flows leave the array (stably) for the
 * report queue, whose room start reserved. Rates are recomputed if any flow
 * entered or left the transfer phase. */
static void process(um__vs_net *n)
{
    bool changed = false;
    for (int i = 0; i < n->nflows; i++) {
        flow *f = &n->flows[i];
        if (f->state == FLOW_LATENCY && f->lat_end <= n->now) {
            if (f->nroute == 0 || f->size == 0) {
                f->state = FLOW_DONE;
            } else {
                f->state = FLOW_TRANSFER;
                changed = true;
            }
        } else if (f->state == FLOW_TRANSFER &&
                   (f->finish <= n->now || f->left <= REL_BYTES_TOL * f->size ||
                    f->left <= f->rate * TIME_TOL)) {
            /* The sliver left by rounding counts as crossed, so a
             * resource's bytes add up to the sizes of its flows. */
            for (int j = 0; j < f->nroute; j++)
                n->bytes[f->route[j]] += f->left;
            f->left = 0;
            f->rate = 0;
            f->state = FLOW_DONE;
            changed = true;
        }
    }
    int k = 0;
    for (int i = 0; i < n->nflows; i++) {
        flow *f = &n->flows[i];
        if (f->state == FLOW_DONE) {
            n->queue[n->qhead + n->qlen++] = f->tag;
            free(f->route);
        } else {
            n->flows[k++] = *f;
        }
    }
    n->nflows = k;
    if (changed)
        recompute(n);
}

/* Processes every event up to t in order, then moves the time to t and
 * completes the flows that are within tolerance of their end there, so that
 * an advance to t reports them rather than a later call. An infinite t
 * leaves the time at the last event. Each round handles at least the event
 * it stopped at, so the loop ends. */
static void run_until(um__vs_net *n, double t)
{
    for (;;) {
        double e = next_event(n);
        if (e > t || e == INFINITY)
            break;
        progress(n, e > n->now ? e : n->now);
        process(n);
    }
    if (isfinite(t) && t > n->now) {
        progress(n, t);
        process(n);
    }
}

/* Room for one more flow and for every flow's tag in the queue, taken
 * before anything changes so that a start failing for memory leaves the net
 * as it was and process never needs to allocate. */
static int reserve(um__vs_net *n)
{
    if (n->nflows == n->flows_cap) {
        int c = n->flows_cap ? 2 * n->flows_cap : 16;
        flow *p = realloc(n->flows, (size_t)c * sizeof *p);
        if (!p)
            return -1;
        n->flows = p;
        n->flows_cap = c;
    }
    if (n->qhead > 0) {
        memmove(n->queue, n->queue + n->qhead, (size_t)n->qlen * sizeof *n->queue);
        n->qhead = 0;
    }
    if (n->qlen + n->nflows + 1 > n->queue_cap) {
        int c = n->queue_cap ? 2 * n->queue_cap : 16;
        while (c < n->qlen + n->nflows + 1)
            c *= 2;
        uint64_t *p = realloc(n->queue, (size_t)c * sizeof *p);
        if (!p)
            return -1;
        n->queue = p;
        n->queue_cap = c;
    }
    return 0;
}

int um__vs_net_start(um__vs_net *n, double now, const int *route, int nroute, double bytes,
                     double latency_s, uint64_t tag)
{
    if (!n || !(now >= n->now) || !isfinite(now) || nroute < 0 || (nroute > 0 && !route) ||
        !(bytes >= 0) || !isfinite(bytes) || !(latency_s >= 0) || !isfinite(latency_s))
        return -1;
    /* A resource may be named more than once: a copy between two devices
     * through the host crosses a bus shared by both directions twice, and
     * takes its bandwidth twice (the rates, bytes and fair shares count it
     * once for each time it is named). Refusing such a route left the model
     * engine waiting for a copy it could never start. */
    for (int j = 0; j < nroute; j++)
        if (route[j] < 0 || route[j] >= n->nres)
            return -1;
    int *copy = NULL;
    if (nroute > 0) {
        copy = malloc((size_t)nroute * sizeof *copy);
        if (!copy)
            return -1;
        memcpy(copy, route, (size_t)nroute * sizeof *copy);
    }
    if (reserve(n) != 0) {
        free(copy);
        return -1;
    }
    run_until(n, now);
    flow *f = &n->flows[n->nflows++];
    memset(f, 0, sizeof *f);
    f->tag = tag;
    f->route = copy;
    f->nroute = nroute;
    f->state = FLOW_LATENCY;
    f->size = bytes;
    f->left = bytes;
    f->lat_end = now + latency_s;
    f->finish = INFINITY;
    /* A flow without latency enters its phase (or completes) at once. */
    if (f->lat_end <= n->now)
        process(n);
    return 0;
}

double um__vs_net_next(const um__vs_net *n)
{
    if (n->qlen > 0)
        return n->now;
    return next_event(n);
}

int um__vs_net_advance(um__vs_net *n, double t, uint64_t *done, int max)
{
    if (!n || !(t >= n->now) || max < 0 || (max > 0 && !done))
        return -1;
    run_until(n, t);
    int k = n->qlen < max ? n->qlen : max;
    for (int i = 0; i < k; i++)
        done[i] = n->queue[n->qhead + i];
    n->qhead += k;
    n->qlen -= k;
    if (n->qlen == 0)
        n->qhead = 0;
    return k;
}

double um__vs_net_now(const um__vs_net *n) { return n->now; }

int um__vs_net_active(const um__vs_net *n) { return n->nflows + n->qlen; }

double um__vs_net_rate(const um__vs_net *n, uint64_t tag)
{
    for (int i = 0; i < n->nflows; i++)
        if (n->flows[i].tag == tag)
            return n->flows[i].rate;
    for (int i = 0; i < n->qlen; i++)
        if (n->queue[n->qhead + i] == tag)
            return 0;
    return -1;
}

double um__vs_net_bytes(const um__vs_net *n, int res)
{
    return res >= 0 && res < n->nres ? n->bytes[res] : -1;
}

double um__vs_net_busy(const um__vs_net *n, int res)
{
    return res >= 0 && res < n->nres ? n->busy[res] : -1;
}
