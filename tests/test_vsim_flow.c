/* Tests of vsim's network model (src/vsim/flow.c): latency then transfer,
 * fair sharing of one resource, progressive filling across resources,
 * flows started while others run, bad input, and a randomized run checked
 * against the properties of max-min fairness. Expected times are worked out
 * by hand in the comments. */
#include "harness.h"
#include "base/flow.h"

#include <math.h>
#include <stdlib.h>

/* Advances n to its next event and returns how many flows it reported;
 * *t receives the event's time. */
static int step(um__vs_net *n, double *t, uint64_t *done, int max)
{
    *t = um__vs_net_next(n);
    return um__vs_net_advance(n, *t, done, max);
}

/* 1 GB over 10 GB/s after 1 ms: the transfer takes 0.1 s, done at 0.101. */
/* A net of one resource of cap bytes per second (a failed check if none). */
static um__vs_net *one_resource(double cap)
{
    um__vs_net *n = um__vs_net_create(1, &cap);
    CHECK(n != NULL);
    return n;
}

static void test_one_flow(void)
{
    um__vs_net *n = one_resource(1e10);
    if (!n)
        return;
    int r = 0;
    uint64_t done[4];
    double t;
    CHECK_EQ(um__vs_net_start(n, 0, &r, 1, 1e9, 1e-3, 7), 0);
    CHECK_EQ(um__vs_net_active(n), 1);
    CHECK_NEAR(um__vs_net_rate(n, 7), 0, 0);
    CHECK_NEAR(um__vs_net_next(n), 1e-3, 1e-15);
    CHECK_EQ(step(n, &t, done, 4), 0);
    CHECK_NEAR(um__vs_net_rate(n, 7), 1e10, 1e-3);
    CHECK_NEAR(um__vs_net_busy(n, 0), 0, 0);
    CHECK_EQ(um__vs_net_advance(n, 0.051, done, 4), 0);
    CHECK_NEAR(um__vs_net_bytes(n, 0), 5e8, 1);
    CHECK_EQ(step(n, &t, done, 4), 1);
    CHECK_EQ(done[0], 7);
    CHECK_NEAR(t, 0.101, 1e-9);
    CHECK_NEAR(um__vs_net_now(n), 0.101, 1e-9);
    CHECK_NEAR(um__vs_net_bytes(n, 0), 1e9, 1e-3);
    CHECK_NEAR(um__vs_net_busy(n, 0), 0.1, 1e-9);
    CHECK_EQ(um__vs_net_active(n), 0);
    CHECK(um__vs_net_next(n) == INFINITY);
    CHECK_NEAR(um__vs_net_rate(n, 7), -1, 0);
    um__vs_net_destroy(n);
}

/* Flows that need no bandwidth end with their latency; one without latency
 * either is reported by an advance to the current time. */
static void test_trivial_flows(void)
{
    um__vs_net *n = one_resource(5);
    if (!n)
        return;
    int r = 0;
    uint64_t done[4];
    double t;
    CHECK_EQ(um__vs_net_start(n, 1, NULL, 0, 100, 0.5, 1), 0); /* no route */
    CHECK_EQ(um__vs_net_start(n, 1, &r, 1, 0, 0.25, 2), 0);    /* no bytes */
    CHECK_EQ(um__vs_net_start(n, 1, &r, 1, 0, 0, 3), 0);       /* nothing at all */
    CHECK_NEAR(um__vs_net_next(n), 1, 0);
    CHECK_EQ(step(n, &t, done, 4), 1);
    CHECK_EQ(done[0], 3);
    CHECK_EQ(step(n, &t, done, 4), 1);
    CHECK_EQ(done[0], 2);
    CHECK_NEAR(t, 1.25, 1e-12);
    CHECK_EQ(step(n, &t, done, 4), 1);
    CHECK_EQ(done[0], 1);
    CHECK_NEAR(t, 1.5, 1e-12);
    CHECK_NEAR(um__vs_net_bytes(n, 0), 0, 0);
    CHECK_NEAR(um__vs_net_busy(n, 0), 0, 0);
    /* An empty net: advancing moves the time, INFINITY leaves it be. */
    CHECK_EQ(um__vs_net_advance(n, 2, done, 4), 0);
    CHECK_NEAR(um__vs_net_now(n), 2, 0);
    CHECK_EQ(um__vs_net_advance(n, INFINITY, done, 4), 0);
    CHECK_NEAR(um__vs_net_now(n), 2, 0);
    um__vs_net_destroy(n);
}

/* 10 and 30 bytes on 10 B/s: 5 each until the first is done at 2 s (10/5);
 * the other then has 30 - 10 = 20 left at 10, done at 4 s. */
static void test_two_flows(void)
{
    um__vs_net *n = one_resource(10);
    if (!n)
        return;
    int r = 0;
    uint64_t done[4];
    double t;
    CHECK_EQ(um__vs_net_start(n, 0, &r, 1, 10, 0, 1), 0);
    CHECK_EQ(um__vs_net_start(n, 0, &r, 1, 30, 0, 2), 0);
    CHECK_NEAR(um__vs_net_rate(n, 1), 5, 1e-12);
    CHECK_NEAR(um__vs_net_rate(n, 2), 5, 1e-12);
    CHECK_EQ(step(n, &t, done, 4), 1);
    CHECK_EQ(done[0], 1);
    CHECK_NEAR(t, 2, 1e-9);
    CHECK_NEAR(um__vs_net_rate(n, 1), -1, 0);
    CHECK_NEAR(um__vs_net_rate(n, 2), 10, 1e-12);
    CHECK_EQ(step(n, &t, done, 4), 1);
    CHECK_EQ(done[0], 2);
    CHECK_NEAR(t, 4, 1e-9);
    CHECK_NEAR(um__vs_net_bytes(n, 0), 40, 1e-9);
    CHECK_NEAR(um__vs_net_busy(n, 0), 4, 1e-9);
    um__vs_net_destroy(n);
}

/* A = 10, B = 4. Flow 1 (4 bytes) over A+B, flow 2 (24) over A, flow 3 (8)
 * over B. B is the bottleneck (4 / 2 = 2 < 10 / 2): flows 1 and 3 get 2,
 * flow 2 the 10 - 2 = 8 left on A. Flow 1 is done at 2 s; then flow 2 has
 * 24 - 16 = 8 left at 10 (done at 2.8 s) and flow 3 has 8 - 4 = 4 left at 4
 * (done at 3 s). One advance to 10 s reports all three in that order. */
static void test_progressive_filling(void)
{
    double cap[2] = {10, 4};
    um__vs_net *n = um__vs_net_create(2, cap);
    CHECK(n != NULL);
    if (!n)
        return;
    int ab[2] = {0, 1}, a = 0, b = 1;
    uint64_t done[4];
    CHECK_EQ(um__vs_net_start(n, 0, ab, 2, 4, 0, 1), 0);
    CHECK_EQ(um__vs_net_start(n, 0, &a, 1, 24, 0, 2), 0);
    CHECK_EQ(um__vs_net_start(n, 0, &b, 1, 8, 0, 3), 0);
    CHECK_NEAR(um__vs_net_rate(n, 1), 2, 1e-12);
    CHECK_NEAR(um__vs_net_rate(n, 2), 8, 1e-12);
    CHECK_NEAR(um__vs_net_rate(n, 3), 2, 1e-12);
    CHECK_NEAR(um__vs_net_next(n), 2, 1e-12);
    CHECK_EQ(um__vs_net_advance(n, 2, done, 4), 1);
    CHECK_EQ(done[0], 1);
    CHECK_NEAR(um__vs_net_rate(n, 2), 10, 1e-12);
    CHECK_NEAR(um__vs_net_rate(n, 3), 4, 1e-12);
    CHECK_NEAR(um__vs_net_next(n), 2.8, 1e-9);
    um__vs_net_destroy(n);

    /* The same from the start with one advance far past every event and
     * room for two tags at a time. */
    n = um__vs_net_create(2, cap);
    CHECK(n != NULL);
    if (!n)
        return;
    CHECK_EQ(um__vs_net_start(n, 0, ab, 2, 4, 0, 1), 0);
    CHECK_EQ(um__vs_net_start(n, 0, &a, 1, 24, 0, 2), 0);
    CHECK_EQ(um__vs_net_start(n, 0, &b, 1, 8, 0, 3), 0);
    CHECK_EQ(um__vs_net_advance(n, 10, done, 2), 2);
    CHECK_EQ(done[0], 1);
    CHECK_EQ(done[1], 2);
    CHECK_EQ(um__vs_net_active(n), 1);
    CHECK_NEAR(um__vs_net_next(n), 10, 0);
    CHECK_EQ(um__vs_net_advance(n, 10, done, 2), 1);
    CHECK_EQ(done[0], 3);
    CHECK_EQ(um__vs_net_active(n), 0);
    CHECK_NEAR(um__vs_net_now(n), 10, 0);
    CHECK_NEAR(um__vs_net_bytes(n, 0), 28, 1e-9);
    CHECK_NEAR(um__vs_net_bytes(n, 1), 12, 1e-9);
    CHECK_NEAR(um__vs_net_busy(n, 0), 2.8, 1e-9); /* A carried flows until 2.8 */
    CHECK_NEAR(um__vs_net_busy(n, 1), 3, 1e-9);
    um__vs_net_destroy(n);
}

/* 100 bytes on 10 B/s from 0; at 4 s (40 done) a 10-byte flow joins: 5
 * each, so it is done at 6 s and the first has 60 - 10 = 50 left at 10,
 * done at 11 s. Then a start past a completion: that completion keeps its
 * time (the resource is busy for 1 s, not 3). */
static void test_late_start(void)
{
    um__vs_net *n = one_resource(10);
    if (!n)
        return;
    int r = 0;
    uint64_t done[4];
    double t;
    CHECK_EQ(um__vs_net_start(n, 0, &r, 1, 100, 0, 1), 0);
    CHECK_EQ(um__vs_net_start(n, 4, &r, 1, 10, 0, 2), 0);
    CHECK_NEAR(um__vs_net_now(n), 4, 0);
    CHECK_NEAR(um__vs_net_bytes(n, 0), 40, 1e-9);
    CHECK_NEAR(um__vs_net_rate(n, 1), 5, 1e-12);
    CHECK_NEAR(um__vs_net_rate(n, 2), 5, 1e-12);
    CHECK_EQ(step(n, &t, done, 4), 1);
    CHECK_EQ(done[0], 2);
    CHECK_NEAR(t, 6, 1e-9);
    CHECK_EQ(step(n, &t, done, 4), 1);
    CHECK_EQ(done[0], 1);
    CHECK_NEAR(t, 11, 1e-9);
    um__vs_net_destroy(n);

    n = one_resource(10);
    if (!n)
        return;
    CHECK_EQ(um__vs_net_start(n, 0, &r, 1, 10, 0, 1), 0);
    CHECK_EQ(um__vs_net_start(n, 3, &r, 1, 10, 0.5, 2), 0);
    CHECK_EQ(um__vs_net_active(n), 2);
    CHECK_NEAR(um__vs_net_busy(n, 0), 1, 1e-9);
    CHECK_NEAR(um__vs_net_next(n), 3, 0);
    CHECK_NEAR(um__vs_net_rate(n, 1), 0, 0);
    CHECK_EQ(um__vs_net_advance(n, 3, done, 4), 1);
    CHECK_EQ(done[0], 1);
    CHECK_EQ(step(n, &t, done, 4), 0); /* latency of flow 2 ends */
    CHECK_NEAR(t, 3.5, 1e-12);
    CHECK_EQ(step(n, &t, done, 4), 1);
    CHECK_EQ(done[0], 2);
    CHECK_NEAR(t, 4.5, 1e-9);
    CHECK_NEAR(um__vs_net_busy(n, 0), 2, 1e-9);
    um__vs_net_destroy(n);
}

/* A = 10, B = 40. Flow 1 (20 bytes) crosses A twice and B once (a copy
 * between two devices through the host, over a bus shared by both
 * directions), flow 2 (30) crosses A. A counts three crossings: each flow
 * gets 10 / 3, flow 1 taking 20 / 3 of A. Flow 1 is done at 6 s; flow 2
 * has 10 left at 10 (done at 7 s). A carried 2 * 20 + 30 bytes. A route
 * naming a resource twice was refused, and the model engine, given one by
 * a machine whose links to and from the host share a resource, stalled. */
static void test_resource_crossed_twice(void)
{
    double cap[2] = {10, 40};
    um__vs_net *n = um__vs_net_create(2, cap);
    CHECK(n != NULL);
    if (!n)
        return;
    int r1[3] = {0, 1, 0}, r2 = 0;
    uint64_t done[4];
    double t;
    CHECK_EQ(um__vs_net_start(n, 0, r1, 3, 20, 0, 1), 0);
    CHECK_NEAR(um__vs_net_rate(n, 1), 5, 1e-12);
    CHECK_EQ(um__vs_net_start(n, 0, &r2, 1, 30, 0, 2), 0);
    CHECK_NEAR(um__vs_net_rate(n, 1), 10.0 / 3, 1e-12);
    CHECK_NEAR(um__vs_net_rate(n, 2), 10.0 / 3, 1e-12);
    CHECK_EQ(step(n, &t, done, 4), 1);
    CHECK_EQ(done[0], 1);
    CHECK_NEAR(t, 6, 1e-9);
    CHECK_NEAR(um__vs_net_rate(n, 2), 10, 1e-12);
    CHECK_EQ(step(n, &t, done, 4), 1);
    CHECK_EQ(done[0], 2);
    CHECK_NEAR(t, 7, 1e-9);
    CHECK_NEAR(um__vs_net_bytes(n, 0), 70, 1e-9);
    CHECK_NEAR(um__vs_net_bytes(n, 1), 20, 1e-9);
    CHECK_NEAR(um__vs_net_busy(n, 0), 7, 1e-9);
    CHECK_NEAR(um__vs_net_busy(n, 1), 6, 1e-9);
    um__vs_net_destroy(n);
}

static void test_bad_input(void)
{
    double cap[2] = {10, 20}, zero = 0, neg = -1;
    CHECK(um__vs_net_create(-1, cap) == NULL);
    CHECK(um__vs_net_create(1, &zero) == NULL);
    CHECK(um__vs_net_create(1, &neg) == NULL);
    CHECK(um__vs_net_create(2, NULL) == NULL);
    um__vs_net *n = um__vs_net_create(2, cap);
    CHECK(n != NULL);
    if (!n)
        return;
    int r0 = 0, r2 = 2, rneg = -1, both[2] = {0, 1}, past[2] = {1, 2};
    uint64_t done[4];
    CHECK_EQ(um__vs_net_start(n, 0, both, 2, 100, 0, 1), 0);
    CHECK_EQ(um__vs_net_advance(n, 1, done, 4), 0);
    double bytes0 = um__vs_net_bytes(n, 0);
    CHECK_NEAR(bytes0, 10, 1e-9);
    CHECK_EQ(um__vs_net_start(n, 1, &r2, 1, 10, 0, 2), -1);
    CHECK_EQ(um__vs_net_start(n, 1, &rneg, 1, 10, 0, 2), -1);
    CHECK_EQ(um__vs_net_start(n, 1, &r0, 1, -1, 0, 2), -1);
    CHECK_EQ(um__vs_net_start(n, 1, &r0, 1, NAN, 0, 2), -1);
    CHECK_EQ(um__vs_net_start(n, 1, &r0, 1, 10, -1, 2), -1);
    CHECK_EQ(um__vs_net_start(n, 1, &r0, -1, 10, 0, 2), -1);
    CHECK_EQ(um__vs_net_start(n, 1, NULL, 1, 10, 0, 2), -1);
    CHECK_EQ(um__vs_net_start(n, 0.5, &r0, 1, 10, 0, 2), -1);
    CHECK_EQ(um__vs_net_start(n, 1, past, 2, 10, 0, 2), -1);
    /* A bad start later in the future must not advance the time either. */
    CHECK_EQ(um__vs_net_start(n, 5, past, 2, 10, 0, 2), -1);
    CHECK_EQ(um__vs_net_advance(n, 0.5, done, 4), -1);
    CHECK_EQ(um__vs_net_advance(n, 2, NULL, 4), -1);
    CHECK_EQ(um__vs_net_advance(n, 2, done, -1), -1);
    CHECK_EQ(um__vs_net_active(n), 1);
    CHECK_NEAR(um__vs_net_rate(n, 1), 10, 1e-12);
    CHECK_NEAR(um__vs_net_rate(n, 2), -1, 0);
    CHECK_NEAR(um__vs_net_now(n), 1, 0);
    CHECK_NEAR(um__vs_net_bytes(n, 0), bytes0, 0);
    CHECK_NEAR(um__vs_net_next(n), 10, 1e-9);
    CHECK_NEAR(um__vs_net_bytes(n, 2), -1, 0);
    CHECK_NEAR(um__vs_net_busy(n, -1), -1, 0);
    /* The route check leaves no trace: the same resource is fine now. */
    CHECK_EQ(um__vs_net_start(n, 1, &past[0], 1, 10, 0, 2), 0);
    CHECK_NEAR(um__vs_net_rate(n, 1), 10, 1e-12);
    CHECK_NEAR(um__vs_net_rate(n, 2), 10, 1e-12);
    um__vs_net_destroy(n);
}

#define MAX_RES 6
#define MAX_FLOWS 40

typedef struct ref_flow {
    int route[MAX_RES];
    int nroute;
    double bytes, lat, start, end;
    int reported;
} ref_flow;

static double urand(uint64_t *s) { return (double)(harness_rand(s) >> 11) * 0x1p-53; }

static bool on_route(const ref_flow *f, int r)
{
    for (int j = 0; j < f->nroute; j++)
        if (f->route[j] == r)
            return true;
    return false;
}

/* Checks rates against capacity and max-min fairness at the current time:
 * a transferring flow has a rate > 0 and a saturated resource on its route
 * where no flow goes faster; a flow in its latency has rate 0. */
static void check_rates(um__vs_net *n, const ref_flow *fl, int nf, int started, int nres,
                        const double *cap)
{
    double now = um__vs_net_now(n), rate[MAX_FLOWS], sum[MAX_RES] = {0};
    bool xfer[MAX_FLOWS];
    for (int i = 0; i < started; i++) {
        const ref_flow *f = &fl[i];
        xfer[i] = !f->reported && f->nroute > 0 && f->bytes > 0 && now >= f->start + f->lat;
        rate[i] = um__vs_net_rate(n, (uint64_t)i);
        if (!f->reported && !xfer[i])
            CHECK_NEAR(rate[i], 0, 0);
        if (f->reported)
            CHECK_NEAR(rate[i], -1, 0);
        if (!xfer[i])
            continue;
        CHECK(rate[i] > 0);
        for (int j = 0; j < f->nroute; j++)
            sum[f->route[j]] += rate[i];
    }
    for (int r = 0; r < nres; r++)
        CHECK(sum[r] <= cap[r] * (1 + 1e-9));
    for (int i = 0; i < started; i++) {
        if (!xfer[i])
            continue;
        bool ok = false;
        for (int j = 0; j < fl[i].nroute && !ok; j++) {
            int r = fl[i].route[j];
            if (fabs(sum[r] - cap[r]) > 1e-9 * cap[r])
                continue;
            ok = true;
            for (int k = 0; k < started && ok; k++)
                if (xfer[k] && on_route(&fl[k], r) && rate[k] > rate[i] * (1 + 1e-9))
                    ok = false;
        }
        CHECK(ok);
    }
    (void)nf;
}

/* base offsets every time, so rounding at large times is exercised too. */
static void random_round(uint64_t *s, double base)
{
    int nres = 2 + (int)(harness_rand(s) % 5);
    double cap[MAX_RES];
    for (int r = 0; r < nres; r++)
        cap[r] = harness_rand(s) % 3 ? 1 + (double)(harness_rand(s) % 10) : 0.5 + 10 * urand(s);
    int nf = 1 + (int)(harness_rand(s) % MAX_FLOWS);
    ref_flow fl[MAX_FLOWS];
    double t0 = base;
    for (int i = 0; i < nf; i++) {
        ref_flow *f = &fl[i];
        int perm[MAX_RES];
        for (int r = 0; r < nres; r++)
            perm[r] = r;
        for (int r = nres - 1; r > 0; r--) {
            int k = (int)(harness_rand(s) % (uint64_t)(r + 1)), x = perm[r];
            perm[r] = perm[k];
            perm[k] = x;
        }
        f->nroute = harness_rand(s) % 10 == 0 ? 0 : 1 + (int)(harness_rand(s) % (uint64_t)nres);
        for (int j = 0; j < f->nroute; j++)
            f->route[j] = perm[j];
        /* Round numbers often, so that events coincide. */
        uint64_t kind = harness_rand(s) % 10;
        f->bytes = kind == 0 ? 0 : kind < 5 ? (double)(harness_rand(s) % 20) : 100 * urand(s);
        f->lat = harness_rand(s) % 3 == 0 ? 0 : (harness_rand(s) % 2 ? 0.5 : urand(s));
        /* Start times in order, some equal. */
        uint64_t gap = harness_rand(s) % 4;
        t0 += gap == 0 ? 0 : gap == 1 ? 0.5 : urand(s);
        f->start = t0;
        f->end = -1;
        f->reported = 0;
    }
    um__vs_net *n = um__vs_net_create(nres, cap);
    CHECK(n != NULL);
    if (!n)
        return;
    int started = 0, reported = 0, rounds = 0;
    while ((started < nf || um__vs_net_active(n) > 0) && rounds++ < 100000) {
        double t = um__vs_net_next(n);
        if (started < nf && fl[started].start < t)
            t = fl[started].start;
        uint64_t done[3];
        int k;
        /* Three tags at a time, to exercise reports held for later. */
        do {
            k = um__vs_net_advance(n, t, done, 3);
            CHECK(k >= 0);
            for (int j = 0; j < k; j++) {
                CHECK(done[j] < (uint64_t)started);
                if (done[j] >= (uint64_t)started)
                    continue;
                ref_flow *f = &fl[done[j]];
                CHECK_EQ(f->reported, 0);
                f->reported++;
                f->end = t;
                reported++;
            }
        } while (k == 3);
        CHECK_NEAR(um__vs_net_now(n), t, 0);
        while (started < nf && fl[started].start == t) {
            ref_flow *f = &fl[started];
            CHECK_EQ(um__vs_net_start(n, t, f->route, f->nroute, f->bytes, f->lat,
                                      (uint64_t)started),
                     0);
            started++;
        }
        check_rates(n, fl, nf, started, nres, cap);
        for (int r = 0; r < nres; r++)
            CHECK(um__vs_net_busy(n, r) <= um__vs_net_now(n) + 1e-9);
    }
    CHECK(rounds <= 100000);
    CHECK_EQ(reported, nf);
    CHECK_EQ(um__vs_net_active(n), 0);
    for (int i = 0; i < nf; i++) {
        const ref_flow *f = &fl[i];
        CHECK_EQ(f->reported, 1);
        double mincap = INFINITY;
        for (int j = 0; j < f->nroute; j++)
            mincap = fmin(mincap, cap[f->route[j]]);
        double lower = f->start + f->lat + (f->nroute > 0 ? f->bytes / mincap : 0);
        CHECK(f->end >= lower - 1e-9 * (1 + lower));
    }
    for (int r = 0; r < nres; r++) {
        double want = 0;
        for (int i = 0; i < nf; i++)
            if (on_route(&fl[i], r))
                want += fl[i].bytes;
        CHECK_NEAR(um__vs_net_bytes(n, r), want, 1e-6 * want + 1e-12);
    }
    um__vs_net_destroy(n);
}

static void test_random(void)
{
    uint64_t s = harness_seed("test_vsim_flow");
    for (int round = 0; round < 500; round++)
        random_round(&s, round % 4 == 3 ? 1e6 : 0);
}

int main(void)
{
    test_one_flow();
    test_trivial_flows();
    test_two_flows();
    test_progressive_filling();
    test_late_start();
    test_resource_crossed_twice();
    test_bad_input();
    test_random();
    return harness_finish("test_vsim_flow");
}
