/* The machine description: parser, built-ins, compute times and routes
 * (machine.h says the format). */
#include "machine.h"

#include "../base/options.h"

#include <ctype.h>
#include <stdarg.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The H200's tile times (ms) measured by bench/gpu/tile_times.cu on the
 * GPU machine (docs/BENCHMARKS.md, "Compute time of one tile on the
 * H200"): cuBLAS SGEMM, STRSM, SSYRK and cuSOLVER SPOTRF; packed, with
 * --streams 4 (the mean of two runs, 2026-12-03), where measured. */
#define H200_COMPUTE                                                                     \
    "compute model=h200 kernel=gemm tile=1024 seconds=0.0745ms\n"                        \
    "compute model=h200 kernel=gemm tile=2048 seconds=0.3613ms\n"                        \
    "compute model=h200 kernel=gemm tile=4096 seconds=2.7716ms packed=2.6375ms\n"        \
    "compute model=h200 kernel=gemm tile=8192 seconds=21.7199ms packed=20.9372ms\n"      \
    "compute model=h200 kernel=trsm tile=1024 seconds=0.3195ms\n"                        \
    "compute model=h200 kernel=trsm tile=2048 seconds=0.7712ms\n"                        \
    "compute model=h200 kernel=trsm tile=4096 seconds=2.7689ms packed=2.1055ms\n"        \
    "compute model=h200 kernel=trsm tile=8192 seconds=14.0668ms packed=13.2626ms\n"      \
    "compute model=h200 kernel=syrk tile=1024 seconds=0.0736ms\n"                        \
    "compute model=h200 kernel=syrk tile=2048 seconds=0.2252ms\n"                        \
    "compute model=h200 kernel=syrk tile=4096 seconds=1.6451ms packed=1.5421ms\n"        \
    "compute model=h200 kernel=syrk tile=8192 seconds=10.5929ms packed=10.4205ms\n"      \
    "compute model=h200 kernel=potrf tile=1024 seconds=0.3374ms\n"                       \
    "compute model=h200 kernel=potrf tile=2048 seconds=0.6617ms\n"                       \
    "compute model=h200 kernel=potrf tile=4096 seconds=1.5190ms\n"                       \
    "compute model=h200 kernel=potrf tile=8192 seconds=7.6912ms\n"

/* Host links of 55 GB/s each way (what `unimem bench copy` measures on the
 * H200 machine); copy latencies of 10 us (host) and 5 us (peer) are a
 * driver call's order of magnitude, not measured per link. */
static const struct {
    const char *name, *text;
} builtins[] = {
    {"h200x1", "machine name=h200x1\n"
               "device name=host kind=host memory=2T\n"
               "device name=gpu count=1 kind=gpu memory=141G model=h200\n"
               "link from=host to=gpu bandwidth=55G latency=10us\n"
               "link from=gpu to=host bandwidth=55G latency=10us\n" H200_COMPUTE},
    {"h200x8", "machine name=h200x8\n"
               "device name=host kind=host memory=2T\n"
               "device name=gpu count=8 kind=gpu memory=141G model=h200\n"
               "link from=host to=gpu bandwidth=55G latency=10us\n"
               "link from=gpu to=host bandwidth=55G latency=10us\n"
               "# NVSwitch: each GPU has 450 GB/s into the switch and out of it.\n"
               "link from=gpu to=gpu bandwidth=450G latency=5us switched=1\n" H200_COMPUTE},
    /* Four 24 GB GPUs behind one PCIe switch with a single 25 GB/s link
     * to the host and no peer access; compute as the H200's, so that the
     * machine differs from h200x8 in memory and links only. */
    {"pcie4x4", "machine name=pcie4x4\n"
                "device name=host kind=host memory=512G\n"
                "device name=gpu count=4 kind=gpu memory=24G model=h200\n"
                "link from=host to=gpu bandwidth=25G latency=10us shared=pcie_down\n"
                "link from=gpu to=host bandwidth=25G latency=10us shared=pcie_up\n" H200_COMPUTE},
};

const char *um__vs_builtin_names(void)
{
    return "h200x1, h200x8, pcie4x4";
}

const char *um__vs_builtin_text(const char *name)
{
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
        if (!strcmp(builtins[i].name, name))
            return builtins[i].text;
    return NULL;
}

/* ---------------------------------------------------------------- parsing */

typedef struct parser {
    const char *source;
    int line;
    um__vs_machine *m;
} parser;

#define MAX_KEYS 8

typedef struct kv {
    char key[24];
    char value[96];
    bool used;
} kv;

static um_status bad(const parser *ps, const char *fmt, ...) UM_PRINTF(2, 3);
static um_status bad(const parser *ps, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return um__fail(UM_ERR_PARSE, "machine description %s, line %d: %s", ps->source, ps->line,
                    what);
}

static const char *get(kv *kvs, int n, const char *key)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(kvs[i].key, key)) {
            kvs[i].used = true;
            return kvs[i].value;
        }
    return NULL;
}

static um_status need(const parser *ps, kv *kvs, int n, const char *key, const char **out)
{
    *out = get(kvs, n, key);
    return *out ? UM_OK : bad(ps, "the line needs %s=", key);
}

/* A number with an optional decimal suffix: K M G T (rates) or s ms us
 * (times); `units` says which set. */
static bool parse_number(const char *v, bool times, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || errno || !isfinite(x) || x < 0)
        return false;
    double scale = 1;
    if (times) {
        if (!strcmp(end, "ms"))
            scale = 1e-3;
        else if (!strcmp(end, "us"))
            scale = 1e-6;
        else if (*end && strcmp(end, "s"))
            return false;
    } else if (*end) {
        const char *units = "KMGT";
        const char *u = strchr(units, *end);
        if (!u || end[1])
            return false;
        scale = pow(1e3, (double)(u - units + 1));
    }
    /* A rate such as 1e300T overflows to infinity once scaled: no rate. */
    *out = x * scale;
    return isfinite(*out);
}

/* A time of 0 to UM_VS_MAX_SECONDS (machine.h says why it is bounded). */
static bool parse_time(const char *v, double *out)
{
    return parse_number(v, true, out) && *out <= UM_VS_MAX_SECONDS;
}

/* "A,B,C": three finite numbers, each parsed whole, and nothing else. */
static bool parse_fit(const char *v, double abc[3])
{
    const char *p = v;
    for (int i = 0; i < 3; i++) {
        char *end;
        errno = 0;
        abc[i] = strtod(p, &end);
        if (end == p || errno || !isfinite(abc[i]) || *end != (i < 2 ? ',' : '\0'))
            return false;
        p = end + 1;
    }
    return true;
}

static bool parse_count(const char *v, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end || errno || x < lo || x > hi)
        return false;
    *out = x;
    return true;
}

static um_status parse_bytes(const parser *ps, const char *key, const char *v, uint64_t *out)
{
    size_t n;
    const char *why = NULL;
    if (!um__parse_size(v, strlen(v), &n, &why) || n == 0)
        return bad(ps, "%s: %s", key, why ? why : "must be more than 0");
    *out = n;
    return UM_OK;
}

static int find_model(um__vs_machine *m, const char *name, bool make)
{
    for (int i = 0; i < m->nmodels; i++)
        if (!strcmp(m->model[i].name, name))
            return i;
    if (!make || m->nmodels == UM_VS_MAX_MODELS || strlen(name) >= sizeof m->model[0].name)
        return -1;
    um__vs_model *md = &m->model[m->nmodels];
    memset(md, 0, sizeof *md);
    snprintf(md->name, sizeof md->name, "%s", name);
    return m->nmodels++;
}

/* Whether a device or a group already has this name. */
static bool name_taken(const um__vs_machine *m, const char *name)
{
    for (int d = 0; d < m->ndev; d++)
        if (!strcmp(m->dev[d].group, name) || !strcmp(m->dev[d].name, name))
            return true;
    return false;
}

static um_status device_line(parser *ps, kv *kvs, int n)
{
    um__vs_machine *m = ps->m;
    const char *name, *kind;
    um_status st;
    if ((st = need(ps, kvs, n, "name", &name)) || (st = need(ps, kvs, n, "kind", &kind)))
        return st;
    bool host = !strcmp(kind, "host"), gpu = !strcmp(kind, "gpu");
    if (!host && !gpu && strcmp(kind, "sim"))
        return bad(ps, "kind is host, gpu or sim, not '%s'", kind);
    if (host != (m->ndev == 0))
        return bad(ps, "%s", host ? "only the first device line may be the host"
                                  : "the first device line must be the host (kind=host)");
    long count = 1;
    const char *c = get(kvs, n, "count");
    if (c && (!parse_count(c, 1, UM_VS_MAX_DEVICES, &count) || (host && count != 1)))
        return bad(ps, "count '%s' is not a device count%s", c, host ? " (the host is one)" : "");
    if (m->ndev + count > UM_VS_MAX_DEVICES)
        return bad(ps, "more than %d devices", UM_VS_MAX_DEVICES);
    if (strlen(name) >= sizeof m->dev[0].group)
        return bad(ps, "device name '%s' is too long", name);
    /* A link's end names a group or a device: each name must mean one
     * thing, so neither the line's name nor a member's may be taken. */
    if (name_taken(m, name))
        return bad(ps, "device name '%s' is used twice", name);
    for (long i = 0; c && i < count; i++) {
        char member[40];
        snprintf(member, sizeof member, "%s%ld", name, i);
        if (name_taken(m, member))
            return bad(ps, "device name '%s' is used twice (a member of %s count=%ld)", member,
                       name, count);
    }
    uint64_t memory = 0, granularity = 2u << 20; /* memory: set by parse_bytes */
    const char *v, *mem_text;
    if ((st = need(ps, kvs, n, "memory", &mem_text)) ||
        (st = parse_bytes(ps, "memory", mem_text, &memory)))
        return st;
    if ((v = get(kvs, n, "granularity")) && (st = parse_bytes(ps, "granularity", v, &granularity)))
        return st;
    /* Pages are mapped whole: a page of another size, or one larger than
     * the device, could never be placed. (The default, 2M, is left to
     * devices smaller than it: the model engine maps no pages.) */
    if (v && (granularity & (granularity - 1)))
        return bad(ps, "granularity '%s' is not a power of two", v);
    if (v && granularity > memory)
        return bad(ps, "granularity '%s' is more than the memory '%s'", v, mem_text);
    int model = -1;
    if ((v = get(kvs, n, "model")) && (model = find_model(m, v, true)) < 0)
        return bad(ps, "model '%s': too many models or too long a name", v);
    for (long i = 0; i < count; i++) {
        um__vs_device *d = &m->dev[m->ndev++];
        memset(d, 0, sizeof *d);
        snprintf(d->group, sizeof d->group, "%s", name);
        if (c)
            snprintf(d->name, sizeof d->name, "%s%ld", name, i);
        else
            snprintf(d->name, sizeof d->name, "%s", name);
        d->host = host;
        d->launches_ahead = gpu;
        d->memory = memory;
        d->capacity = memory;
        d->granularity = granularity;
        d->model = model;
    }
    return UM_OK;
}

/* The devices a link end names: a group (every member) or one device. */
static int ends(const um__vs_machine *m, const char *name, int *out)
{
    int n = 0;
    for (int d = 0; d < m->ndev; d++)
        if (!strcmp(m->dev[d].group, name) || !strcmp(m->dev[d].name, name))
            out[n++] = d;
    return n;
}

static int resource(um__vs_machine *m, const char *name, double bandwidth, bool *clash)
{
    *clash = false;
    for (int r = 0; r < m->nres; r++)
        if (!strcmp(m->res_name[r], name)) {
            *clash = m->res_bandwidth[r] != bandwidth;
            return r;
        }
    if (m->nres == UM_VS_MAX_RESOURCES)
        return -1;
    snprintf(m->res_name[m->nres], sizeof m->res_name[0], "%s", name);
    m->res_bandwidth[m->nres] = bandwidth;
    return m->nres++;
}

static um_status link_line(parser *ps, kv *kvs, int n)
{
    um__vs_machine *m = ps->m;
    const char *from, *to, *v;
    um_status st;
    if ((st = need(ps, kvs, n, "from", &from)) || (st = need(ps, kvs, n, "to", &to)) ||
        (st = need(ps, kvs, n, "bandwidth", &v)))
        return st;
    double bandwidth, latency = 0;
    if (!parse_number(v, false, &bandwidth) || bandwidth <= 0)
        return bad(ps, "bandwidth '%s' is not a rate in bytes per second (55G: 55e9)", v);
    if ((v = get(kvs, n, "latency")) && !parse_time(v, &latency))
        return bad(ps, "latency '%s' is not a time of 0 to %g s (5us, 1ms, 0.1s)", v,
                   UM_VS_MAX_SECONDS);
    const char *shared = get(kvs, n, "shared"), *sw = get(kvs, n, "switched");
    if (shared && strlen(shared) > 40)
        return bad(ps, "shared name '%.40s...' is longer than 40 characters", shared);
    /* A link of its own is the resource FROM->TO: a shared name of that
     * form joined that link silently (shared=gpu0->host on the host's
     * links down made them share gpu0's link up). */
    if (shared && strstr(shared, "->"))
        return bad(ps, "shared name '%s' holds '->', which names a link of its own", shared);
    bool switched = sw && !strcmp(sw, "1");
    if (sw && !switched && strcmp(sw, "0"))
        return bad(ps, "switched is 0 or 1, not '%s'", sw);
    if (shared && switched)
        return bad(ps, "a link is shared or switched, not both");
    int src[UM_VS_MAX_DEVICES], dst[UM_VS_MAX_DEVICES];
    int ns = ends(m, from, src), nd = ends(m, to, dst), made = 0;
    if (!ns || !nd)
        return bad(ps, "no device '%s' (devices come before their links)", ns ? to : from);
    for (int i = 0; i < ns; i++)
        for (int j = 0; j < nd; j++) {
            int a = src[i], b = dst[j];
            if (a == b)
                continue;
            um__vs_link *l = &m->link[a][b];
            if (l->present)
                return bad(ps, "a link from %s to %s is given twice", m->dev[a].name,
                           m->dev[b].name);
            char name[96];
            bool clash = false, clash2 = false;
            if (switched) {
                snprintf(name, sizeof name, "%s out", m->dev[a].name);
                l->res[0] = resource(m, name, bandwidth, &clash);
                snprintf(name, sizeof name, "%s in", m->dev[b].name);
                l->res[1] = resource(m, name, bandwidth, &clash2);
                l->nres = 2;
            } else {
                if (shared)
                    snprintf(name, sizeof name, "%.40s", shared);
                else
                    snprintf(name, sizeof name, "%s->%s", m->dev[a].name, m->dev[b].name);
                int before = m->nres;
                l->res[0] = resource(m, name, bandwidth, &clash);
                l->nres = 1;
                /* Each directed link is given once, so its own resource
                 * is new (device names with '->' could still meet). */
                if (!shared && l->res[0] >= 0 && l->res[0] < before)
                    return bad(ps, "link resource '%s' is named twice (device names with "
                               "'->'?)", name);
            }
            if (l->res[0] < 0 || (l->nres == 2 && l->res[1] < 0))
                return bad(ps, "too many link resources");
            if (clash || clash2)
                return bad(ps, "resource '%s' was given another bandwidth before", name);
            l->present = true;
            l->latency_s = latency;
            made++;
        }
    if (!made)
        return bad(ps, "the link from %s to %s joins no two different devices", from, to);
    return UM_OK;
}

static um_status compute_line(parser *ps, kv *kvs, int n)
{
    um__vs_machine *m = ps->m;
    const char *model, *kernel;
    um_status st;
    if ((st = need(ps, kvs, n, "model", &model)) || (st = need(ps, kvs, n, "kernel", &kernel)))
        return st;
    int mi = find_model(m, model, true), k = -1;
    if (mi < 0)
        return bad(ps, "model '%s': too many models or too long a name", model);
    for (int i = 0; i < UM_VS_NKERNELS; i++)
        if (!strcmp(um__vs_kernel_name((um__vs_kernel)i), kernel))
            k = i;
    if (k < 0)
        return bad(ps, "kernel is gemm, trsm, syrk, potrf or other, not '%s'", kernel);
    um__vs_cost *c = &m->model[mi].kernel[k];
    const char *tile = get(kvs, n, "tile"), *secs = get(kvs, n, "seconds");
    const char *rate = get(kvs, n, "gflops"), *fit = get(kvs, n, "fit");
    const char *packed = get(kvs, n, "packed");
    int forms = (tile || secs) + !!rate + !!fit;
    if (forms != 1)
        return bad(ps, "a compute line gives tile= and seconds=, or gflops=, or fit=");
    um__vs_cost_kind kind = rate ? UM_VS_COST_RATE : fit ? UM_VS_COST_FIT : UM_VS_COST_POINTS;
    if (c->kind != UM_VS_COST_NONE && c->kind != kind)
        return bad(ps, "model %s gives kernel %s in two forms", model, kernel);
    /* A kernel has one rate or one fit: a second replaced the first
     * silently, as a second point of one tile is refused. */
    if (c->kind == kind && kind != UM_VS_COST_POINTS)
        return bad(ps, "kernel %s of model %s is given twice", kernel, model);
    c->kind = kind;
    if (packed && kind != UM_VS_COST_POINTS)
        return bad(ps, "packed= goes with tile= and seconds= (a measured point)");
    if (rate) {
        /* Flops per second must stay finite too, or every kernel took 0 s. */
        if (!parse_number(rate, false, &c->gflops) || c->gflops <= 0 ||
            !isfinite(c->gflops * 1e9))
            return bad(ps, "gflops '%s' is not a positive finite rate", rate);
    } else if (fit) {
        double abc[3];
        if (!parse_fit(fit, abc))
            return bad(ps, "fit '%s' is not A,B,C (a * tile^b + c seconds)", fit);
        /* A negative or zero time is no time a kernel takes. */
        if (abc[0] < 0 || abc[2] < 0 || !(abc[0] + abc[2] > 0))
            return bad(ps, "fit '%s' needs a >= 0, c >= 0 and a + c > 0 (a * tile^b + c "
                       "seconds)", fit);
        if (abc[2] > UM_VS_MAX_SECONDS)
            return bad(ps, "fit '%s' has c above %g s", fit, UM_VS_MAX_SECONDS);
        c->a = abc[0];
        c->b = abc[1];
        c->c = abc[2];
    } else {
        long t;
        double s;
        if (!tile || !secs)
            return bad(ps, "a measured point needs both tile= and seconds=");
        if (!parse_count(tile, 1, 1L << 20, &t))
            return bad(ps, "tile '%s' is not a tile size", tile);
        if (!parse_time(secs, &s) || s <= 0)
            return bad(ps, "seconds '%s' is not a time above 0 and at most %g s", secs,
                       UM_VS_MAX_SECONDS);
        double p = s;
        if (packed && (!parse_time(packed, &p) || p <= 0))
            return bad(ps, "packed '%s' is not a time above 0 and at most %g s", packed,
                       UM_VS_MAX_SECONDS);
        if (c->npoints == UM_VS_MAX_POINTS)
            return bad(ps, "more than 16 points for kernel %s of model %s", kernel, model);
        int i = c->npoints;
        for (int j = 0; j < c->npoints; j++)
            if (c->point[j].tile == (uint32_t)t)
                return bad(ps, "tile %s of kernel %s is given twice", tile, kernel);
        while (i > 0 && c->point[i - 1].tile > (uint32_t)t) {
            c->point[i] = c->point[i - 1];
            i--;
        }
        c->point[i] = (um__vs_point){(uint32_t)t, s, p};
        c->npoints++;
    }
    return UM_OK;
}

static um_status parse_line(parser *ps, char *line)
{
    char *hash = strchr(line, '#');
    if (hash)
        *hash = 0;
    char *save = NULL, *word = strtok_r(line, " \t\r", &save);
    if (!word)
        return UM_OK;
    char directive[16];
    if (strlen(word) >= sizeof directive)
        return bad(ps, "unknown line '%.60s'", word);
    strcpy(directive, word);
    kv kvs[MAX_KEYS];
    int n = 0;
    while ((word = strtok_r(NULL, " \t\r", &save))) {
        char *eq = strchr(word, '=');
        if (!eq || eq == word)
            return bad(ps, "'%.60s' is not key=value", word);
        if (n == MAX_KEYS)
            return bad(ps, "more than %d keys on a line", MAX_KEYS);
        *eq = 0;
        if (strlen(word) >= sizeof kvs[0].key || strlen(eq + 1) >= sizeof kvs[0].value)
            return bad(ps, "key or value too long at '%.60s'", word);
        for (int i = 0; i < n; i++)
            if (!strcmp(kvs[i].key, word))
                return bad(ps, "key '%s' is given twice", word);
        strcpy(kvs[n].key, word);
        strcpy(kvs[n].value, eq + 1);
        kvs[n].used = false;
        n++;
    }
    um_status st;
    if (!strcmp(directive, "machine")) {
        const char *name;
        if ((st = need(ps, kvs, n, "name", &name)))
            return st;
        if (ps->m->name[0])
            return bad(ps, "the machine's name is given twice");
        if (strlen(name) >= sizeof ps->m->name)
            return bad(ps, "the machine's name is longer than %zu characters",
                       sizeof ps->m->name - 1);
        snprintf(ps->m->name, sizeof ps->m->name, "%.63s", name);
    } else if (!strcmp(directive, "device")) {
        st = device_line(ps, kvs, n);
    } else if (!strcmp(directive, "link")) {
        st = link_line(ps, kvs, n);
    } else if (!strcmp(directive, "compute")) {
        st = compute_line(ps, kvs, n);
    } else {
        return bad(ps, "unknown line '%s' (machine, device, link or compute)", directive);
    }
    if (st != UM_OK)
        return st;
    for (int i = 0; i < n; i++)
        if (!kvs[i].used)
            return bad(ps, "unknown key '%s' on a %s line", kvs[i].key, directive);
    return UM_OK;
}

um_status um__vs_machine_parse(const char *text, const char *source, um__vs_machine *m)
{
    memset(m, 0, sizeof *m);
    parser ps = {source ? source : "(text)", 0, m};
    const char *p = text;
    char line[512];
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        ps.line++;
        if (len >= sizeof line)
            return bad(&ps, "the line is longer than %s characters", "511");
        memcpy(line, p, len);
        line[len] = 0;
        um_status st = parse_line(&ps, line);
        if (st != UM_OK)
            return st;
        p += len + (nl != NULL);
    }
    if (m->ndev < 2)
        return um__fail(UM_ERR_PARSE, "machine description %s: it needs the host and at least "
                        "one gpu device", ps.source);
    if (!m->name[0])
        snprintf(m->name, sizeof m->name, "%s", ps.source);
    for (int d = 1; d < m->ndev; d++) {
        int route[4];
        double lat;
        if (um__vs_route(m, 0, d, route, &lat) < 0 || um__vs_route(m, d, 0, route, &lat) < 0)
            return um__fail(UM_ERR_PARSE, "machine description %s: device %s has no link to "
                            "the host and back", ps.source, m->dev[d].name);
    }
    return UM_OK;
}

um_status um__vs_machine_load(const char *name_or_path, um__vs_machine *m)
{
    const char *text = um__vs_builtin_text(name_or_path);
    if (text)
        return um__vs_machine_parse(text, name_or_path, m);
    FILE *f = fopen(name_or_path, "r");
    if (!f)
        return um__fail(UM_ERR_IO, "machine '%s' is no built-in (%s) and no readable file: %s",
                        name_or_path, um__vs_builtin_names(), strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            size_t ncap = cap ? 2 * cap : 8192;
            char *nb = ncap <= (64u << 20) ? realloc(buf, ncap) : NULL;
            if (!nb) {
                free(buf);
                fclose(f);
                return um__fail(UM_ERR_NOMEM, "machine description %s: larger than 64 MiB or "
                                "no memory", name_or_path);
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0)
            break;
    }
    bool failed = ferror(f);
    fclose(f);
    buf[len] = 0;
    um_status st = failed ? um__fail(UM_ERR_IO, "machine description %s: read failed",
                                     name_or_path)
                 : memchr(buf, 0, len) ? um__fail(UM_ERR_PARSE, "machine description %s: holds a "
                                                  "NUL byte (not text)", name_or_path)
                                       : um__vs_machine_parse(buf, name_or_path, m);
    free(buf);
    return st;
}

/* ------------------------------------------------------------- questions */

static double point_seconds(const um__vs_point *p, bool packed)
{
    return packed ? p->packed_seconds : p->seconds;
}

static double points_time(const um__vs_cost *c, uint32_t tile, bool packed)
{
    if (c->npoints == 1)
        return point_seconds(&c->point[0], packed) * pow((double)tile / c->point[0].tile, 3.0);
    /* The two points around the tile, or the nearest two outside. */
    int i = 1;
    while (i < c->npoints - 1 && c->point[i].tile < tile)
        i++;
    const um__vs_point *a = &c->point[i - 1], *b = &c->point[i];
    double sa = point_seconds(a, packed), sb = point_seconds(b, packed);
    if (tile == a->tile)
        return sa;
    if (tile == b->tile)
        return sb;
    double e = log(sb / sa) / log((double)b->tile / a->tile);
    return sa * pow((double)tile / a->tile, e);
}

static double compute_time(const um__vs_machine *m, int dev, int k, uint32_t tile, double flops,
                           bool packed)
{
    if (dev < 0 || dev >= m->ndev || k < 0 || k >= UM_VS_NKERNELS || m->dev[dev].model < 0)
        return INFINITY;
    const um__vs_cost *c = &m->model[m->dev[dev].model].kernel[k];
    /* A recorded task the description gives no time for runs at the
     * device's gemm rate on tiles of its order. */
    if (k == UM_VS_OTHER && c->kind == UM_VS_COST_NONE) {
        /* The gemm's own flops go with it: a gemm given as a rate takes
         * its time from them (with 0, every such task took no time). */
        double gemm_flops = 2.0 * pow(tile ? (double)tile : 1.0, 3.0);
        double t = compute_time(m, dev, UM_VS_GEMM, tile ? tile : 1, gemm_flops, packed);
        return isfinite(t) ? flops * t / gemm_flops : INFINITY;
    }
    double t = INFINITY;
    switch (c->kind) {
    case UM_VS_COST_POINTS:
        t = points_time(c, tile, packed);
        break;
    case UM_VS_COST_RATE:
        t = flops / (c->gflops * 1e9);
        break;
    case UM_VS_COST_FIT:
        /* A fit that underflows to 0 on this tile gives no time the
         * engines could use (a kernel of no time, a bound of 0). */
        t = c->a * pow((double)tile, c->b) + c->c;
        if (!(t > 0))
            t = INFINITY;
        break;
    case UM_VS_COST_NONE:
        break;
    }
    /* What overflowed, or came out negative, is no time: the device
     * cannot run the kernel there. */
    return isfinite(t) && t >= 0 ? t : INFINITY;
}

double um__vs_compute_time(const um__vs_machine *m, int dev, int k, uint32_t tile, double flops)
{
    return compute_time(m, dev, k, tile, flops, false);
}

double um__vs_packed_time(const um__vs_machine *m, int dev, int k, uint32_t tile, double flops)
{
    return compute_time(m, dev, k, tile, flops, true);
}

int um__vs_route(const um__vs_machine *m, int src, int dst, int route[4], double *latency_s)
{
    *latency_s = 0;
    if (src < 0 || dst < 0 || src >= m->ndev || dst >= m->ndev)
        return -1;
    if (src == dst)
        return 0;
    const um__vs_link *l = &m->link[src][dst];
    if (l->present) {
        for (int i = 0; i < l->nres; i++)
            route[i] = l->res[i];
        *latency_s = l->latency_s;
        return l->nres;
    }
    /* Two devices with no link between them copy through the host. */
    const um__vs_link *up = &m->link[src][0], *down = &m->link[0][dst];
    if (src == 0 || dst == 0 || !up->present || !down->present)
        return -1;
    int n = 0;
    for (int i = 0; i < up->nres; i++)
        route[n++] = up->res[i];
    for (int i = 0; i < down->nres; i++)
        route[n++] = down->res[i];
    *latency_s = up->latency_s + down->latency_s;
    return n;
}

um_status um__vs_check_copies(const um__vs_machine *m, uint64_t bytes)
{
    int slowest = -1;
    for (int r = 0; r < m->nres; r++)
        if (slowest < 0 || m->res_bandwidth[r] < m->res_bandwidth[slowest])
            slowest = r;
    double secs = slowest < 0 ? 0 : (double)bytes / m->res_bandwidth[slowest];
    if (!(secs <= UM_VS_MAX_SECONDS))
        return um__fail(UM_ERR_INVALID, "sim: a tile of %llu bytes takes %g s over link %s "
                        "of machine %s (%g B/s), more than the simulator's %g s",
                        (unsigned long long)bytes, secs, m->res_name[slowest], m->name,
                        m->res_bandwidth[slowest], UM_VS_MAX_SECONDS);
    return UM_OK;
}
